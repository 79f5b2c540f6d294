r"""Runs one arm x seed of the mechanism experiment, resumably, and writes its results JSON.

  python -m experiments.mechanism.run --arm=spade --seed=0 [--smoke] [--workdir=DIR]
      [--warm_start=BUILD_DIR]
  python -m experiments.mechanism.run --all   # every arm x seed not yet finished

Builds the warm start first if the cache lacks it (``warm_start.py``), runs the arm's config
(``config.py``) in ``runs/<arm>-<seed>`` (a rerun resumes from the last checkpoint), then
writes ``results/<arm>-<seed>.json`` (``report.collect``: the per-iteration series the
report reads). ``python -m experiments.mechanism.report`` turns every results file into the
table and plots.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app
from absl import flags


def run(arm: str, seed: int, *, smoke: bool = False, workdir: str = "",
        results: str = "", start: str = "") -> str:
  """Runs (or resumes) the arm and returns the path of its results JSON.

  ``start``: the warm start to begin from (a build directory holding ``hf/``, or an HF
  directory) instead of the cache's (built first when missing).
  """
  from experiments.mechanism import common, config, report, warm_start  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay import loop  # pylint: disable=g-import-not-at-top
  if arm not in common.ARMS:
    raise ValueError(f"--arm={arm!r}; expected one of {list(common.ARMS)}.")
  name = f"{arm}-{seed}" + ("-smoke" if smoke else "")
  workdir = workdir or os.path.join(common.RUNS, name)
  if start:
    common.warm_start_hf(start)  # a bad path raises before anything runs
  else:
    ws = common.warm_start_dir(smoke)
    if not os.path.isfile(os.path.join(ws, "hf", "config.json")):
      print(f"building the warm start in {ws} (once)", flush=True)
      if smoke:  # one tiny build, not the stages: minutes
        warm_start.build(ws, smoke=True, **dict(warm_start.DEFAULTS, **warm_start.SMOKE_BUILD))
      else:
        warm_start.build_staged(ws, store=common.STORE)
  cfg = config.get_config(f"arm={arm},seed={seed}" + (",smoke" if smoke else "") +
                          (f",warm_start={start}" if start else ""))
  hf = cfg.model.init_from.removeprefix("hf:")
  os.makedirs(workdir, exist_ok=True)
  marker = os.path.join(workdir, "warm_start.txt")
  if os.path.isfile(marker):  # a resume must continue from the start it began with
    with open(marker) as f:
      began = f.read().strip()
    if began != os.path.abspath(hf):
      raise ValueError(f"{workdir} began from the warm start {began}, not {hf}; resume it "
                       "with --warm_start set as then, or give a new --workdir.")
  else:
    with open(marker, "w") as f:
      f.write(os.path.abspath(hf) + "\n")
  loop.train(cfg, workdir)
  out_dir = results or (workdir if smoke else common.RESULTS)
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"{name}.json")
  data = report.collect(workdir, arm=arm, seed=seed)
  data["warm_start"] = {"path": os.path.abspath(hf), "sha256": common.weights_digest(hf)}
  with open(path + ".tmp", "w") as f:
    json.dump(data, f, indent=1)
  os.replace(path + ".tmp", path)
  print(f"wrote {path}", flush=True)
  return path


def pending(results: str = "", smoke: bool = False) -> list[tuple[str, int]]:
  """The (arm, seed) runs without a finished results JSON, seed by seed (every arm's seed 0
  first, so a partial queue still compares the arms)."""
  from experiments.mechanism import common, config  # pylint: disable=g-import-not-at-top
  out_dir = results or common.RESULTS
  todo = []
  for seed in common.SEEDS:
    for arm in common.ARMS:
      want = config.ITERATIONS if not smoke else 2
      path = os.path.join(out_dir, f"{arm}-{seed}" + ("-smoke" if smoke else "") + ".json")
      done = False
      if os.path.isfile(path):
        with open(path) as f:
          done = json.load(f).get("iterations", 0) >= want
      if not done:
        todo.append((arm, seed))
  return todo


def run_all(*, smoke: bool = False, results: str = "", start: str = "", runner=None) -> list:
  """Runs (or resumes) every arm x seed not yet finished, in ``pending``'s order; a rerun
  after an interruption picks up where it stopped. Returns the results paths written."""
  runner = runner or run
  todo = pending(results, smoke)
  paths = []
  for i, (arm, seed) in enumerate(todo):
    print(f"[{i + 1}/{len(todo)}] arm {arm} seed {seed}", flush=True)
    paths.append(runner(arm, seed, smoke=smoke, results=results, start=start))
  return paths


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _ALL.value:
    if _WORKDIR.value or _ARM.present or _SEED.present:
      raise app.UsageError("--all runs every arm and seed in runs/<arm>-<seed>; drop --arm, "
                           "--seed and --workdir.")
    run_all(smoke=_SMOKE.value, results=_RESULTS.value, start=_START.value)
    return
  run(_ARM.value, _SEED.value, smoke=_SMOKE.value, workdir=_WORKDIR.value,
      results=_RESULTS.value, start=_START.value)


def _define_flags() -> None:
  """The command line's flags (defined only when run as a program)."""
  global _ALL, _ARM, _RESULTS, _SEED, _SMOKE, _START, _WORKDIR
  _ALL = flags.DEFINE_bool("all", False, "Every arm x seed without a finished results JSON, "
                           "seed by seed (resumes an interrupted queue).")
  _ARM = flags.DEFINE_string("arm", "spade", "spade | static | solve_rate | frozen_designer.")
  _SEED = flags.DEFINE_integer("seed", 0, "Run seed.")
  _SMOKE = flags.DEFINE_bool("smoke", False, "A two-iteration run of a tiny model.")
  _WORKDIR = flags.DEFINE_string("workdir", "", "Run directory (default runs/<arm>-<seed>).")
  _START = flags.DEFINE_string("warm_start", "", "The warm start the arm begins from: a "
                               "build directory holding hf/, or an HF directory (default: "
                               "the cache's, built first when missing).")
  _RESULTS = flags.DEFINE_string("results", "", "Results directory (default results/, or the "
                                 "workdir for --smoke).")


if __name__ == "__main__":
  _define_flags()
  sys.exit(app.run(main))
