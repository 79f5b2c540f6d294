r"""What sharing a prompt across the rows that play it saves: GRPO-style extend + decode.

  python -m experiments.benchmarks.prefill_share [--prompts=2] [--plays=8] \
      [--prompt_len=37] [--new=32] [--max_len=128] [--repeats=5]

SmolLM2-135M-Instruct (`gguf:smollm2_135m_instruct`, run in float32, fp32 cache) on
`--prompts` x `--plays` rows: each of `--prompts` random `--prompt_len`-token prompts is
played by `--plays` rows, every row starting a fresh conversation with its own key (as a
GRPO group is sampled). Rule: temperature 0.7, top-p 1, top-k 0, no end id (every row
decodes `--new` tokens). One engine per setting of `Engine(share_prompts=)`; each round
extends all rows, decodes `--new` tokens and releases them. After two warm-up rounds per
engine (compiles), `--repeats` interleaved rounds (off, on, off, ...) are timed; the table
prints medians of the extend (waited on), the decode and their sum, the ratio off / on,
the rows and padded token positions each extend computed, and whether both settings drew
the same tokens and log-probs on every row.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from absl import app, flags

_PROMPTS = flags.DEFINE_integer("prompts", 2, "Distinct prompts.")
_PLAYS = flags.DEFINE_integer("plays", 8, "Rows that play each prompt.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 37, "Tokens per prompt.")
_NEW = flags.DEFINE_integer("new", 32, "New tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed rounds per setting (after a warm-up).")
_MAX_LEN = flags.DEFINE_integer("max_len", 128, "Engine max_len (tokens one row may hold).")
_MODEL = flags.DEFINE_string("model", "gguf:smollm2_135m_instruct", "Checkpoint to load.")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from spade_jax.models.checkpoint_io import load_checkpoint  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import Engine  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling.rules import SamplingConfig  # pylint: disable=g-import-not-at-top

  params, cfg, _, _ = load_checkpoint(_MODEL.value)
  cfg = dataclasses.replace(cfg, param_dtype="float32", compute_dtype="float32")
  params = jax.tree.map(lambda x: x.astype(np.float32) if np.issubdtype(x.dtype, np.floating)
                        else x, params)
  rule = SamplingConfig(temperature=0.7, top_p=1.0, top_k=0, eos_id=-1)
  n_rows, new = _PROMPTS.value * _PLAYS.value, _NEW.value
  rng = np.random.default_rng(0)
  prompts = [rng.integers(100, cfg.vocab_size, _PROMPT_LEN.value).tolist()
             for _ in range(_PROMPTS.value)]
  rows = {b: prompts[b // _PLAYS.value] for b in range(n_rows)}
  keys = jax.random.split(jax.random.key(0), n_rows)
  engines = {share: Engine(cfg, params, slots=n_rows, max_len=_MAX_LEN.value,
                           rule=rule, cache_dtype="float32", share_prompts=share)
             for share in (False, True)}

  def round_(share):
    eng = engines[share]
    before = list(eng.extend_positions)
    t0 = time.perf_counter()
    eng.extend(rows, dict(enumerate(keys)))
    jax.block_until_ready(eng.state.logits)
    t1 = time.perf_counter()
    out = eng.decode({b: new for b in range(n_rows)})
    t2 = time.perf_counter()
    eng.release(list(range(n_rows)))
    computed = [a - b for a, b in zip(eng.extend_positions, before)]
    return t1 - t0, t2 - t1, out, computed

  # Two warm-up rounds: an engine's first extend takes a fresh (uncommitted) state, its
  # second one committed by the programs before it, and jit compiles each once.
  first = {share: round_(share) for share in (False, True)}
  for share in (False, True):
    round_(share)
  times = {share: [] for share in (False, True)}
  for _ in range(_REPEATS.value):
    for share in (False, True):
      times[share].append(round_(share)[:2])
  off, on = first[False][2], first[True][2]
  same = all(off[b][0] == on[b][0] for b in range(n_rows))
  logp_diff = max(float(np.max(np.abs(np.subtract(off[b][1], on[b][1])))) for b in range(n_rows))
  print(f"{_MODEL.value} fp32: {n_rows} rows = "
        f"{_PROMPTS.value} prompts x {_PLAYS.value} plays, {_PROMPT_LEN.value}-token prompts, "
        f"{new} new tokens, {jax.devices()[0].platform}; median of {_REPEATS.value} rounds")
  print(f"{'share_prompts':14s} {'extend s':>9s} {'decode s':>9s} {'total s':>9s} "
        f"{'tokens computed':>16s} {'positions':>10s}")
  med = {}
  for share in (False, True):
    ext = statistics.median(t[0] for t in times[share])
    dec = statistics.median(t[1] for t in times[share])
    tot = statistics.median(t[0] + t[1] for t in times[share])
    med[share] = (ext, dec, tot)
    real, positions = first[share][3]
    print(f"{str(share):14s} {ext:9.3f} {dec:9.3f} {tot:9.3f} {real:16d} {positions:10d}")
  print(f"off / on: extend {med[False][0] / med[True][0]:.2f}x  decode "
        f"{med[False][1] / med[True][1]:.2f}x  total {med[False][2] / med[True][2]:.2f}x;  "
        f"rows shared per round {engines[True].shared_prompts[0] // (_REPEATS.value + 2)};  "
        f"same tokens {same}, max log-prob diff {logp_diff:.1e}")


if __name__ == "__main__":
  app.run(main)
