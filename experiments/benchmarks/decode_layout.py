r"""Decode step time of the engine's two decode layouts, per batch size.

  python -m experiments.benchmarks.decode_layout [--models=tiny,50m] \
      [--batches=1,2,4,8,32] [--prompt=64] [--new=128] [--repeats=3]

`Engine(decode_layout="batch_major")` runs each decode step through
`qwen3.forward` (hidden state [B, D], weights [in, out], stacked per layer);
"feature_major" runs `decode.decode_step` (hidden state [D, B], per-layer
weights [out, in]). For each model size and batch the script builds one
engine per layout on the same random weights (fp32, fp32 cache), prefills the
same uneven prompts, times `decode` of `--new` tokens per row (medians of
`--repeats` interleaved rounds after a compile round) and prints ms per step,
the ratio batch_major / feature_major, whether both produced the same greedy
tokens, and the median time to start an engine (feature_major makes its copy
of the weights there). `Engine`'s "auto" picks feature_major on one CPU device; this
script is what that choice rests on.
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags

from experiments.benchmarks.common import model_config, uneven_prompts

_MODELS = flags.DEFINE_list("models", ["tiny", "50m"], "Model sizes: tiny, 50m.")
_BATCHES = flags.DEFINE_list("batches", ["1", "2", "4", "8", "32"], "Batch sizes.")
_PROMPT = flags.DEFINE_integer("prompt", 64, "Longest prompt (others half to full length).")
_NEW = flags.DEFINE_integer("new", 128, "New tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds per layout.")

LAYOUTS = ("batch_major", "feature_major")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  from spade_jax.models import init_params  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import Engine, SamplingConfig  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_platforms", "cpu")
  P, N = _PROMPT.value, _NEW.value
  for size in _MODELS.value:
    cfg = model_config(size)
    params = init_params(jax.random.key(0), cfg)
    rule = SamplingConfig(temperature=0.0, eos_id=-1, pad_id=cfg.vocab_size - 1)
    for B in (int(b) for b in _BATCHES.value):
      prompts = uneven_prompts(B, P, cfg.vocab_size, seed=B)
      def run(layout):
        # A fresh engine per round (compiled programs are shared), so every
        # round decodes from the same cache state.
        t0 = time.perf_counter()
        eng = Engine(cfg, params, slots=B, max_len=P + N, rule=rule, cache_dtype="float32",
                     decode_layout=layout)
        jax.block_until_ready((eng.decode_params, eng.state))
        start = time.perf_counter() - t0
        eng.extend(dict(enumerate(prompts)), {b: jax.random.key(b) for b in range(B)})
        jax.block_until_ready(eng.state.logits)
        t0 = time.perf_counter()
        out = eng.decode({b: N for b in range(B)})
        return time.perf_counter() - t0, start, [out[b][0] for b in range(B)]

      tokens = {lay: run(lay)[2] for lay in LAYOUTS}  # compile round
      times = {lay: [] for lay in LAYOUTS}
      starts = {lay: [] for lay in LAYOUTS}
      for _ in range(_REPEATS.value):
        for lay in LAYOUTS:
          t, st, _ = run(lay)
          times[lay].append(t)
          starts[lay].append(st)
      ms = {lay: statistics.median(t) / N * 1e3 for lay, t in times.items()}
      start_ms = {lay: statistics.median(t) * 1e3 for lay, t in starts.items()}
      print(f"{size:5s} batch {B:3d}: batch_major {ms['batch_major']:7.2f} ms/step  "
            f"feature_major {ms['feature_major']:7.2f} ms/step  "
            f"ratio {ms['batch_major'] / ms['feature_major']:5.2f}x  "
            f"same tokens {tokens['batch_major'] == tokens['feature_major']}  "
            f"engine start {start_ms['batch_major']:.1f} / {start_ms['feature_major']:.1f} ms",
            flush=True)


if __name__ == "__main__":
  app.run(main)
