r"""Decode throughput: this project's sampler vs transformers generate vs Tunix.

  bash experiments/benchmarks/peers_venv.sh   # once: .venv-peers with the peers
  .venv-peers/bin/python -m experiments.benchmarks.sampler [--full] \
      [--models=tiny,50m] [--batches=1,8,32] [--prompts=64] [--new=128] [--repeats=3]

One random Qwen3 checkpoint per model size is written with `save_pretrained`
and loaded by all three: ours through `spade_jax.models.load_hf`, transformers
(PyTorch CPU, fp32) directly, Tunix through
`tunix.models.qwen3.params.create_model_from_safe_tensors` and its vanilla
`tunix.generate.sampler.Sampler`. Greedy decoding; every row generates the
full length (the end id V-1 gets a zero output row, so a random model never
picks it, and Tunix treats it as padding). rope_theta is 1e6 because Tunix
ignores the config's value. Tunix's sampler attends over its whole fixed cache
every step, so each configuration gets a Tunix sampler whose cache is exactly
prompt + new tokens (ours sizes its cache per call).

Each configuration warms every engine once (compiles) and checks that all engines emit
the same greedy tokens (a mismatch is printed and recorded: a faster wrong engine is not a
result). It then times `--repeats` (default 5) interleaved rounds (ours, transformers,
Tunix, ours, ...). Around every timed call it reads /proc/stat and this process's CPU time:
the machine's CPU steal and the CPU that other processes used while the call ran. A round
in which either exceeds `--disturbed` (as a fraction of the call's wall time x cores) is
repeated, up to `--retries` times, and reported. It prints min / median / max tokens/s per
engine (new tokens over wall time, prefill included) and the median ratios ours/peer. The
default sweep is a representative subset (the full grid of batch 1/8/32 x prompt 64/512 x
new 128/512 x both sizes takes hours on a 2-core machine): `--full` runs the whole grid.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import tempfile
import time

from absl import app, flags

from experiments.benchmarks.common import hf_fields, uneven_prompts

_MODELS = flags.DEFINE_list("models", ["tiny", "50m"], "Model sizes: tiny, 50m.")
_BATCHES = flags.DEFINE_list("batches", ["1", "8", "32"], "Batch sizes.")
_PROMPTS = flags.DEFINE_list("prompts", ["64"], "Prompt lengths.")
_NEW = flags.DEFINE_list("new", ["128"], "New tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed rounds per configuration.")
_DISTURBED = flags.DEFINE_float(
    "disturbed", 0.15, "Repeat a round when CPU steal or other processes' CPU during one of "
    "its calls exceeds this fraction of the call's wall time x cores.")
_RETRIES = flags.DEFINE_integer("retries", 3, "Repeats of a disturbed round at most.")
_PEERS = flags.DEFINE_list("peers", ["transformers", "tunix"], "Peers to run.")
_FULL = flags.DEFINE_bool("full", False, "Full grid: batch 1/8/32, prompt 64/512, new "
                          "128/512, both sizes (slow on CPU).")
_JSON = flags.DEFINE_string("json", "", "Optional path for the results as JSON.")

# Representative subset run by default: (model, batch, prompt, new).
DEFAULT = [("tiny", 1, 64, 128), ("tiny", 8, 64, 128), ("tiny", 32, 64, 128),
           ("tiny", 8, 512, 128), ("tiny", 8, 64, 512), ("50m", 8, 64, 128),
           ("50m", 32, 64, 128)]


def write_checkpoint(size: str, directory: str) -> None:
  """Random Qwen3 (fp32, untied head, end id V-1 never chosen) saved as safetensors."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  cfg = transformers.Qwen3Config(**hf_fields(size), rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                                 tie_word_embeddings=False, initializer_range=0.02,
                                 max_position_embeddings=2048)
  model = transformers.Qwen3ForCausalLM(cfg).to(torch.float32)
  with torch.no_grad():
    model.lm_head.weight[-1].zero_()
  model.save_pretrained(directory)


class Ours:
  name = "ours"

  def __init__(self, directory: str):
    import jax  # pylint: disable=g-import-not-at-top
    from spade_jax.models import load_hf  # pylint: disable=g-import-not-at-top
    from spade_jax.sampling import SamplingConfig  # pylint: disable=g-import-not-at-top
    self.jax = jax
    self.params, self.cfg = load_hf(directory)
    self.rule = SamplingConfig(temperature=0.0, eos_id=-1, pad_id=self.cfg.vocab_size - 1)

  def run(self, prompts, new):
    from spade_jax.sampling import generate  # pylint: disable=g-import-not-at-top
    g = generate(self.params, self.cfg, prompts, self.rule, self.jax.random.key(0), new)
    return [list(t) for t in g.tokens]


class Transformers:
  name = "transformers"

  def __init__(self, directory: str):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    self.torch = torch
    self.model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32).eval()
    self.pad = self.model.config.vocab_size - 1

  def run(self, prompts, new):
    torch = self.torch
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), self.pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding
      ids[i, P - len(p):] = torch.tensor(p)
      mask[i, P - len(p):] = 1
    with torch.no_grad():
      out = self.model.generate(ids, attention_mask=mask, max_new_tokens=new,
                                min_new_tokens=new, do_sample=False, eos_token_id=None,
                                pad_token_id=self.pad)
    return out[:, P:].tolist()


class _IdsTokenizer:
  """Text of space-separated ids <-> ids (what Tunix's string API needs)."""

  def __init__(self, end: int):
    self.end = end

  def encode(self, text, **_):
    return [int(x) for x in text.split()]

  def decode(self, ids, **_):
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self):
    return 0  # falsy: Tunix adds no BOS

  def eos_id(self):
    return self.end

  def pad_id(self):
    return self.end


class Tunix:
  name = "tunix"

  def __init__(self, directory: str, size: str):
    import jax  # pylint: disable=g-import-not-at-top
    from jax.sharding import AxisType  # pylint: disable=g-import-not-at-top
    from tunix.generate import sampler as tsampler  # pylint: disable=g-import-not-at-top
    from tunix.models.qwen3 import model as tmodel  # pylint: disable=g-import-not-at-top
    from tunix.models.qwen3 import params as tparams  # pylint: disable=g-import-not-at-top
    s = hf_fields(size)
    cfg = tmodel.ModelConfig(
        num_layers=s["num_hidden_layers"], vocab_size=s["vocab_size"],
        embed_dim=s["hidden_size"], hidden_dim=s["intermediate_size"],
        num_heads=s["num_attention_heads"], head_dim=s["head_dim"],
        num_kv_heads=s["num_key_value_heads"], rope_theta=1_000_000, norm_eps=1e-6,
        use_tied_embedding=False)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2,
                         devices=jax.devices()[:1])
    with mesh:
      self.model = tparams.create_model_from_safe_tensors(directory, cfg, mesh)
    self.cfg, self.tsampler = cfg, tsampler
    self.tok = _IdsTokenizer(s["vocab_size"] - 1)
    self.samplers = {}

  def run(self, prompts, new):
    P = max(len(p) for p in prompts)
    # Tunix's sampler holds a fixed cache and attends over all of it every
    # step: give each configuration one sized to its own prompt + new tokens.
    size = P + new
    if size not in self.samplers:
      cfg = self.cfg
      self.samplers[size] = self.tsampler.Sampler(
          self.model, self.tok, cache_config=self.tsampler.CacheConfig(
              cache_size=size, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
              head_dim=cfg.head_dim))
    out = self.samplers[size]([self.tok.decode(p) for p in prompts], max_generation_steps=new,
                              max_prompt_length=P, temperature=0.0, echo=False)
    return [[int(x) for x in t] for t in out.tokens]


class _Load:
  """CPU steal and other processes' CPU while a call runs (Linux /proc; zeros elsewhere)."""

  def __init__(self):
    self.cores = os.cpu_count() or 1

  @staticmethod
  def _stat():
    try:
      with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
      return 0.0, 0.0
    hz = os.sysconf("SC_CLK_TCK")
    busy = sum(v[:3]) + sum(v[5:8])  # user nice system irq softirq steal
    return busy / hz, (v[7] if len(v) > 7 else 0) / hz

  def __enter__(self):
    self.t0, self.own0 = time.perf_counter(), time.process_time()
    self.busy0, self.steal0 = self._stat()
    return self

  def __exit__(self, *exc):
    busy, steal = self._stat()
    self.wall = time.perf_counter() - self.t0
    own = time.process_time() - self.own0
    capacity = max(self.wall * self.cores, 1e-9)
    self.steal = (steal - self.steal0) / capacity
    self.others = max(0.0, (busy - self.busy0) - (steal - self.steal0) - own) / capacity


def _configs():
  if _FULL.value:
    return list(itertools.product(["tiny", "50m"], [1, 8, 32], [64, 512], [128, 512]))
  flagged = [f for f in ("models", "batches", "prompts", "new") if flags.FLAGS[f].present]
  if not flagged:
    return DEFAULT
  return list(itertools.product(_MODELS.value, [int(b) for b in _BATCHES.value],
                                [int(p) for p in _PROMPTS.value], [int(n) for n in _NEW.value]))


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_platforms", "cpu")
  results = []
  by_model: dict[str, list] = {}
  for cfg in _configs():
    by_model.setdefault(cfg[0], []).append(cfg[1:])
  for size, runs in by_model.items():
    with tempfile.TemporaryDirectory() as d:
      write_checkpoint(size, d)
      engines = [Ours(d)]
      if "transformers" in _PEERS.value:
        engines.append(Transformers(d))
      if "tunix" in _PEERS.value:
        engines.append(Tunix(d, size))
      for batch, plen, new in runs:
        prompts = uneven_prompts(batch, plen, hf_fields(size)["vocab_size"],
                                 seed=batch * 7919 + plen)
        outs = {e.name: e.run(prompts, new) for e in engines}  # warm-up: compile
        same = {k: v == outs["ours"] for k, v in outs.items() if k != "ours"}
        rates = {e.name: [] for e in engines}
        disturbed = 0
        for _ in range(_REPEATS.value):
          for attempt in range(_RETRIES.value + 1):
            round_rates, worst = {}, 0.0
            for e in engines:
              with _Load() as load:
                n = sum(len(t) for t in e.run(prompts, new))
              round_rates[e.name] = n / load.wall
              worst = max(worst, load.steal, load.others)
            if worst <= _DISTURBED.value or attempt == _RETRIES.value:
              break
            disturbed += 1
          for k, v in round_rates.items():
            rates[k].append(v)
        med = {k: statistics.median(v) for k, v in rates.items()}
        row = dict(model=size, batch=batch, prompt=plen, new=new, rounds=_REPEATS.value,
                   disturbed_rounds_repeated=disturbed,
                   **{f"{k}_tok_s": [round(min(v), 1), round(med[k], 1), round(max(v), 1)]
                      for k, v in rates.items()},
                   **{f"same_tokens_as_{k}": v for k, v in same.items()})
        line = (f"{size:5s} batch {batch:3d} prompt {plen:4d} new {new:4d}: " +
                "  ".join(f"{k} {min(v):8.1f}/{med[k]:8.1f}/{max(v):8.1f}"
                          for k, v in rates.items()))
        for k, v in med.items():
          if k != "ours":
            row[f"ours_over_{k}"] = round(med["ours"] / v, 2)
            line += f"  ours/{k} {med['ours'] / v:5.2f}x" + ("" if same[k] else " (TOKENS DIFFER)")
        line += f"  [{disturbed} disturbed round(s) repeated]"
        print(line, flush=True)
        results.append(row)
  if _JSON.value:
    os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
    with open(_JSON.value, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
