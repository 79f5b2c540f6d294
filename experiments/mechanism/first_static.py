r"""The first experiment's `static` arm again, on today's learner and its own warm start.

  python -m experiments.mechanism.first_static [--seeds=0,1,2] [--iterations=30]

The first experiment (`results/first/`) trained a 10.6M model from scratch; its `static`
arm ended below its warm start even on the levels it trained on (levels 1-2 of its ten
seen families, greedy, 16 seeds an item: warm start 0.588, `static` 0.513 ± 0.094). This
reruns that arm with the learner as it is now (tempered log-probs, ...) and measures the
same score before and after:

* the warm start is the first experiment's own (SHA-256 `FIRST_SHA256`, restored from the
  repository's history into `$SPADE_JAX_CACHE/mechanism/first/warm_start/hf`; a clone
  without that history fails with the command that fetches it);
* the arm as it ran: its ten families at levels 0-4 as the pool, 8 envs x (4 unhinted +
  4 hinted) plays an iteration, 30 iterations, lr 5e-5, everything else today's
  `experiments/configs/mechanism.py:arm=static`;
* the score: greedy plays of those families at levels 1-2, seeds 10,000-10,015, by the
  `families` suite, at the start (first seed's run only: greedy, so the same for every
  seed) and after the last iteration.

Runs live in `$SPADE_JAX_CACHE/mechanism/first/static-<seed>` and resume from their
checkpoints; `results/first/static_rerun.json` holds the per-seed scores and the summary.
"""

from __future__ import annotations

import json
import os
import subprocess

from absl import app
from absl import flags

from experiments.configs import common as recipes
from experiments.configs import mechanism as configs
from experiments.mechanism import common, report
from spade_jax.envs.families import FAMILIES, NUM_LEVELS
from spade_jax.selfplay import loop

# The first experiment's seen families (its held-out one was knights_knaves).
FIRST_FAMILIES = ("arithmetic_chain", "guess_number", "ordering", "prime_factors",
                  "reach_target", "base_convert", "code_breaker", "pet_owners", "grid_path",
                  "number_sequence")
LEVELS = (1, 2)
FIRST_SHA256 = "724c654c2cbe35564029b6a763e893c9cc10d2c21f38296d9354186b7f12953d"
# Where the repository's history holds those weights (the tree before they left it).
FIRST_REV = "a0cd7810cd6805a30f701a27e5f9b8cef25e1cff^"
FIRST_DIR = "experiments/mechanism/stages/3_families/hf"
FIRST_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
# The first experiment's static arm (its config.py): budget and learning rate.
ARM_ARGS = "lr=5e-5,envs=8,plays=4,hinted=4"
EVAL_SEEDS = 16
RECORD = os.path.join(common.RESULTS, "first", "static_rerun.json")


def first_dir() -> str:
  return os.path.join(common.cache_dir(), "first")


def restore(dest: str = "") -> str:
  """The first warm start's HF directory in the cache, restored from git when absent."""
  hf = dest or os.path.join(first_dir(), "warm_start", "hf")
  if (os.path.isfile(os.path.join(hf, "model.safetensors"))
      and common.weights_digest(hf) == FIRST_SHA256):
    return hf
  os.makedirs(hf, exist_ok=True)
  for name in FIRST_FILES:
    proc = subprocess.run(["git", "-C", recipes.REPO, "show", f"{FIRST_REV}:{FIRST_DIR}/{name}"],
                          capture_output=True, check=False)
    if proc.returncode:
      raise FileNotFoundError(
          f"The first warm start's {name} is not in this clone's history "
          f"({proc.stderr.decode().strip()}); fetch it with `git fetch --unshallow` (or "
          "clone without --depth) and run again.")
    tmp = os.path.join(hf, f".{name}.tmp")
    with open(tmp, "wb") as f:
      f.write(proc.stdout)
    os.replace(tmp, os.path.join(hf, name))
  got = common.weights_digest(hf)
  if got != FIRST_SHA256:
    raise ValueError(f"{hf} holds weights {got[:12]} after the restore, not the first warm "
                     f"start's {FIRST_SHA256[:12]}.")
  return hf


def pool_path() -> str:
  """The arm's pool (JSONL in the cache): the first experiment's families at every level."""
  rows = [{"id": f"{n}:{lv}", "program": FAMILIES[n].program_at(lv)}
          for n in FIRST_FAMILIES for lv in range(NUM_LEVELS)]
  return recipes.write_once(os.path.join(first_dir(), "static_pool.jsonl"),
                            "".join(json.dumps(r) + "\n" for r in rows))


def get_config(seed: int, iterations: int = 30, *, hf: str, at_start: bool = True):
  """The rerun's config: today's static arm with the first experiment's budget and pool."""
  c = configs.get_config(f"arm=static,seed={seed},warm_start={hf},{ARM_ARGS},"
                         f"iterations={iterations},eval_every={iterations}")
  c.static_pool.path = pool_path()
  c.train.seq_len = 2560  # the first experiment's rows: no designer row trains here
  c.eval.at_start = at_start
  c.eval.overrides.families = dict(
      families=",".join(f"{n}:{LEVELS[0]}-{LEVELS[-1]}" for n in FIRST_FAMILIES),
      seeds=EVAL_SEEDS, samples=1, temperature=0.0, greedy=False,
      max_new_tokens=common.AGENT_TURN_TOKENS, max_len=3072)
  return c


def levels_score(point: dict) -> float | None:
  """Mean success over the first families at LEVELS in one evaluation point."""
  vals = [point.get(f"success/{n}/{lv}") for n in FIRST_FAMILIES for lv in LEVELS]
  if any(v is None for v in vals):
    return None
  return sum(vals) / len(vals)


def run(seeds, iterations: int = 30, record: str = RECORD) -> dict:
  """Runs (or resumes) every seed, then writes and returns the record."""
  hf = restore()
  runs = {}
  for i, seed in enumerate(seeds):
    workdir = os.path.join(first_dir(), f"static-{seed}")
    loop.train(get_config(seed, iterations, hf=hf, at_start=i == 0), workdir)
    curve = report.collect(workdir, arm="static", seed=seed)["curve"]
    runs[str(seed)] = {"curve": [{"step": p["step"], "levels_1_2": levels_score(p),
                                  **{k: v for k, v in p.items() if k.startswith("success/")}}
                                 for p in curve]}
  starts = [p["levels_1_2"] for r in runs.values() for p in r["curve"] if p["step"] == 0]
  ends = [r["curve"][-1]["levels_1_2"] for r in runs.values() if r["curve"]
          and r["curve"][-1]["step"] >= iterations]
  start = starts[0] if starts else None
  end = report.mean_ci(ends)
  out = {"warm_start": {"sha256": FIRST_SHA256, "rev": FIRST_REV},
         "arm_args": ARM_ARGS, "iterations": iterations, "eval_seeds": EVAL_SEEDS,
         "families": FIRST_FAMILIES, "levels": LEVELS, "runs": runs, "start": start,
         "end": {"mean": end[0], "ci95": end[1], "n": end[2], "per_seed": ends},
         "first_experiment": {"start": 0.588, "end_mean": 0.513, "end_ci95": 0.094}}
  if start is not None:
    gain = report.mean_ci([e - start for e in ends])
    out["gain"] = {"mean": gain[0], "ci95": gain[1], "n": gain[2]}
  os.makedirs(os.path.dirname(record), exist_ok=True)
  with open(record + ".tmp", "w") as f:
    json.dump(out, f, indent=1)
  os.replace(record + ".tmp", record)
  print(f"levels {LEVELS[0]}-{LEVELS[-1]} greedy success: start {start}, after "
        f"{iterations} iterations {end[0]:.3f} ± {end[1]:.3f} (n={end[2]}, per seed "
        f"{[round(e, 3) for e in ends]}); wrote {record}", flush=True)
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  run([int(s) for s in _SEEDS.value], _ITERATIONS.value)


if __name__ == "__main__":
  _SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds to run.")
  _ITERATIONS = flags.DEFINE_integer("iterations", 30, "Iterations a run.")
  app.run(main)
