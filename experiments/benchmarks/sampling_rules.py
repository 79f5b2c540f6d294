r"""What the sampling filters cost: sort-free top-k / top-p against sorting.

  python -m experiments.benchmarks.sampling_rules [--models=mechanism,tiny,50m] \
      [--batches=8,64] [--prompt=64] [--new=128] [--repeats=3]

Part 1, the filters alone: for each model's vocabulary and batch, one jitted
`rules.draw` with temperature 0.6, top-k 20 and top-p 0.95 (the recipes'
agent rule) through the library's `TopK` / `TopP` (thresholds built bit by bit
over order keys) and through the sort-based definitions (`lax.top_k`, a full
sort and a cumulative sum), on the same random logits and keys; it prints the
median ms per call of each, their ratio and whether both drew the same ids.

Part 2, a decode step: ms per step of `Engine.decode` on random weights with
each rule (greedy, temperature only, top-k, top-k + top-p): the filters'
share of a step is the gap to greedy.
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags

from experiments.benchmarks.common import model_config, uneven_prompts

_MODELS = flags.DEFINE_list("models", ["mechanism", "tiny", "50m"],
                            "Model sizes: mechanism, tiny, 50m.")
_BATCHES = flags.DEFINE_list("batches", ["8", "64"], "Batch sizes.")
_PROMPT = flags.DEFINE_integer("prompt", 64, "Longest prompt (others half to full length).")
_NEW = flags.DEFINE_integer("new", 128, "New tokens per row in part 2.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds per variant (after a compile "
                                "round), interleaved.")
_CALLS = flags.DEFINE_integer("calls", 50, "Filter calls per timed round in part 1.")


def _sorted_filters(logits, temperature: float, k: int, p: float):
  """The sort-based definitions of temperature, top-k and top-p."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  logits = logits / temperature
  kth = jax.lax.top_k(logits, k)[0][:, -1:]
  logits = jnp.where(logits < kth, -jnp.inf, logits)
  s = jnp.sort(logits, axis=-1)[:, ::-1]
  probs = jax.nn.softmax(s, axis=-1)
  keep = (jnp.cumsum(probs, axis=-1) - probs) < p
  threshold = jnp.min(jnp.where(keep, s, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(logits < threshold, -jnp.inf, logits)


def filters_alone(vocab: int, batch: int) -> str:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import SamplingConfig  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling.rules import draw, row_keys  # pylint: disable=g-import-not-at-top
  rule = SamplingConfig(temperature=0.6, top_k=20, top_p=0.95)
  ours = jax.jit(lambda lg, ks, pos: draw(lg, ks, pos, rule))
  greedy = SamplingConfig(temperature=0.0)
  # The sorted filters, then draw()'s own Gumbel noise and arg-max (temperature 1: no filter).
  plain_noise = SamplingConfig(temperature=1.0)
  theirs = jax.jit(lambda lg, ks, pos: draw(_sorted_filters(lg, 0.6, 20, 0.95), ks, pos,
                                            plain_noise))
  plain = jax.jit(lambda lg, ks, pos: draw(lg, ks, pos, greedy))
  rng = np.random.default_rng(batch)
  logits = jax.numpy.asarray(rng.normal(size=(batch, vocab)).astype(np.float32) * 3)
  keys = row_keys(jax.random.key(0), batch)
  pos = [jax.numpy.full((batch,), i, jax.numpy.int32) for i in range(_CALLS.value)]
  ids = {name: [np.asarray(f(logits, keys, q)) for q in pos]
         for name, f in (("sort-free", ours), ("sorted", theirs))}
  times = {"sort-free": [], "sorted": [], "argmax": []}
  for _ in range(_REPEATS.value):
    for name, f in (("sort-free", ours), ("sorted", theirs), ("argmax", plain)):
      t0 = time.perf_counter()
      for q in pos:
        r = f(logits, keys, q)
      r.block_until_ready()
      times[name].append((time.perf_counter() - t0) / _CALLS.value)
  ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
  same = all(np.array_equal(a, b) for a, b in zip(ids["sort-free"], ids["sorted"]))
  return (f"vocab {vocab:6d} batch {batch:3d}: sorted {ms['sorted']:7.3f} ms  sort-free "
          f"{ms['sort-free']:7.3f} ms  ({ms['sorted'] / ms['sort-free']:5.1f}x)  argmax "
          f"{ms['argmax']:6.3f} ms  same ids in {_CALLS.value} draws: {same}")


def decode_steps(size: str, batch: int) -> str:
  import jax  # pylint: disable=g-import-not-at-top
  from spade_jax.models import init_params  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import Engine, SamplingConfig  # pylint: disable=g-import-not-at-top
  cfg = model_config(size)
  params = init_params(jax.random.key(0), cfg)
  P, N = _PROMPT.value, _NEW.value
  prompts = uneven_prompts(batch, P, cfg.vocab_size, seed=batch)
  common = dict(eos_id=-1, pad_id=cfg.vocab_size - 1)
  rules = {"greedy": SamplingConfig(temperature=0.0, **common),
           "T 0.6": SamplingConfig(temperature=0.6, **common),
           "top-k 20": SamplingConfig(temperature=0.6, top_k=20, **common),
           "top-k 20 + top-p 0.95": SamplingConfig(temperature=0.6, top_k=20, top_p=0.95,
                                                   **common)}

  def run(rule):
    eng = Engine(cfg, params, slots=batch, max_len=P + N, rule=rule, cache_dtype="float32")
    eng.extend(dict(enumerate(prompts)), {b: jax.random.key(b) for b in range(batch)})
    jax.block_until_ready(eng.state.logits)
    t0 = time.perf_counter()
    eng.decode({b: N for b in range(batch)})
    return time.perf_counter() - t0

  for r in rules.values():  # compile round
    run(r)
  times = {name: [] for name in rules}
  for _ in range(_REPEATS.value):
    for name, r in rules.items():
      times[name].append(run(r))
  ms = {name: statistics.median(t) / N * 1e3 for name, t in times.items()}
  return f"{size:9s} batch {batch:3d}: " + "  ".join(f"{n} {v:6.2f}" for n, v in ms.items())


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_platforms", "cpu")
  batches = [int(b) for b in _BATCHES.value]
  print("Part 1: temperature 0.6 + top-k 20 + top-p 0.95 draw, ms per call (median)")
  for size in _MODELS.value:
    for B in batches:
      print(filters_alone(model_config(size).vocab_size, B), flush=True)
  print("Part 2: decode ms per step (median) by rule")
  for size in _MODELS.value:
    for B in batches:
      print(decode_steps(size, B), flush=True)


if __name__ == "__main__":
  app.run(main)
