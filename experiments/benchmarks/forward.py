r"""Forward throughput: spade_jax against transformers (PyTorch, CPU), same weights.

  python -m experiments.benchmarks.forward --batch=4 --length=256 --repeats=5

For a dense and a MoE config, builds a random model in transformers, saves it,
imports it with `spade_jax.models.load_hf`, checks the logits agree, then
times full-sequence forward passes of both, interleaved (ours, theirs, ours,
...) so background load hits both alike. Prints median tokens/s and the ratio.
"""

import os
import statistics
import tempfile
import time

from absl import app
from absl import flags

_BATCH = flags.DEFINE_integer("batch", 4, "Sequences per forward.")
_LENGTH = flags.DEFINE_integer("length", 256, "Tokens per sequence.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per side.")
_THREADS = flags.DEFINE_integer("threads", 0, "torch threads (0: torch default).")

CONFIGS = {
    "dense": ("Qwen3Config", dict(vocab_size=32000, hidden_size=512, intermediate_size=1536,
                                  num_hidden_layers=8, num_attention_heads=8,
                                  num_key_value_heads=4, head_dim=64)),
    "moe": ("Qwen3MoeConfig", dict(vocab_size=32000, hidden_size=512, intermediate_size=1536,
                                   num_hidden_layers=8, num_attention_heads=8,
                                   num_key_value_heads=4, head_dim=64, num_experts=32,
                                   num_experts_per_tok=4, moe_intermediate_size=256,
                                   norm_topk_prob=True)),
}


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from spade_jax.models import forward, load_hf  # pylint: disable=g-import-not-at-top
  if _THREADS.value:
    torch.set_num_threads(_THREADS.value)
  B, T = _BATCH.value, _LENGTH.value
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); batch {B} x length {T}")
  for name, (cls, kw) in CONFIGS.items():
    torch.manual_seed(0)
    model = getattr(transformers, cls)(**kw, max_position_embeddings=4096)
    model = transformers.AutoModelForCausalLM.from_config(model, attn_implementation="sdpa")
    model = model.eval()
    with tempfile.TemporaryDirectory() as d:
      model.save_pretrained(d)
      params, cfg = load_hf(d)
    toks = np.random.RandomState(0).randint(0, kw["vocab_size"], (B, T))
    pos = jnp.tile(jnp.arange(T), (B, 1))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    fwd = jax.jit(lambda p, t: forward(p, cfg, t, pos, mask)[0])
    jt, tt = jnp.asarray(toks), torch.tensor(toks)

    def ours():
      return fwd(params, jt).block_until_ready()

    def theirs():
      with torch.inference_mode():
        return model(tt).logits

    err = float(np.abs(np.asarray(ours()) - theirs().numpy()).max())
    times = {"ours": [], "transformers": []}
    for _ in range(_REPEATS.value):
      for side, fn in (("ours", ours), ("transformers", theirs)):
        t0 = time.perf_counter()
        fn()
        times[side].append(time.perf_counter() - t0)
    rate = {k: B * T / statistics.median(v) for k, v in times.items()}
    print(f"{name:5s} ({sum(x.size for x in jax.tree.leaves(params)) / 1e6:.0f}M params, "
          f"max |logit diff| {err:.1e}): ours {rate['ours']:,.0f} tok/s, "
          f"transformers {rate['transformers']:,.0f} tok/s, "
          f"ratio {rate['ours'] / rate['transformers']:.2f}x")


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  app.run(main)
