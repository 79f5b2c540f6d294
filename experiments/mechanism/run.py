r"""Runs one arm x seed of the mechanism experiment, resumably, and writes its results JSON.

  python -m experiments.mechanism.run --arm=spade --seed=0 [--smoke] [--workdir=DIR]
      [--warm_start=BUILD_DIR]
  python -m experiments.mechanism.run --all   # every arm x seed not yet finished
  python -m experiments.mechanism.run --publish  # store unfinished runs for another checkout

Builds the warm start first if the cache lacks it (``warm_start.py``), runs the arm's config
(``config.py``) in ``$SPADE_JAX_CACHE/mechanism/runs/<arm>-<seed>`` (a rerun resumes from the
last checkpoint; the cache outlives a fresh checkout on the same machine), then writes
``results/<arm>-<seed>.json`` (``report.collect``: the per-iteration series the report
reads). ``python -m experiments.mechanism.report`` turns every results file into the
table and plots.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app
from absl import flags


def run(arm: str, seed: int, *, smoke: bool = False, workdir: str = "",
        results: str = "", start: str = "", store: str | None = None) -> str:
  """Runs (or resumes) the arm and returns the path of its results JSON.

  ``start``: the warm start to begin from (a build directory holding ``hf/``, or an HF
  directory) instead of the cache's (built first when missing). ``store``: the stored
  runs (``run_store``; default the project's ``stored_runs/``, none for ``smoke``, ``""``
  none): an empty run directory goes on from the stored copy, and a finished run's copy is
  removed.
  """
  from experiments.mechanism import common, config, report, run_store, warm_start  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay import loop  # pylint: disable=g-import-not-at-top
  if arm not in common.ARMS:
    raise ValueError(f"--arm={arm!r}; expected one of {list(common.ARMS)}.")
  name = f"{arm}-{seed}" + ("-smoke" if smoke else "")
  workdir = workdir or os.path.join(common.runs_dir(), name)
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
  store = _store(store, smoke)
  digest = common.weights_digest(hf)
  if store:
    it = run_store.seed(workdir, os.path.join(store, name), cfg=cfg,
                        warm_start_sha256=digest)
    if it is not None:
      print(f"took {name} from {store} at iteration {it} of {cfg.iterations}", flush=True)
  if not os.path.isfile(marker):
    with open(marker, "w") as f:
      f.write(os.path.abspath(hf) + "\n")
  loop.train(cfg, workdir)
  out_dir = results or (workdir if smoke else common.RESULTS)
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"{name}.json")
  data = report.collect(workdir, arm=arm, seed=seed)
  data["warm_start"] = {"path": os.path.abspath(hf), "sha256": digest}
  with open(path + ".tmp", "w") as f:
    json.dump(data, f, indent=1)
  os.replace(path + ".tmp", path)
  print(f"wrote {path}", flush=True)
  if store and data["iterations"] >= cfg.iterations:
    run_store.publish(workdir, os.path.join(store, name), arm=arm, seed=seed, cfg=cfg,
                      warm_start_sha256=digest, finished=True)
  return path


def _store(store: str | None, smoke: bool) -> str:
  """The stored runs' directory: the project's by default, none for smoke runs."""
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  if store is None:
    return "" if smoke else common.RUN_STORE
  return store


def publish(arm: str, seed: int, *, smoke: bool = False, workdir: str = "",
            store: str | None = None) -> str | None:
  """Stores the run of ``arm`` x ``seed`` as far as it went (``run_store.publish``; a
  finished run's copy is removed). Returns the stored directory, or None."""
  from experiments.mechanism import common, config, run_store  # pylint: disable=g-import-not-at-top
  store = _store(store, smoke)
  if not store:
    raise ValueError("publishing needs a store directory (--store).")
  name = f"{arm}-{seed}" + ("-smoke" if smoke else "")
  workdir = workdir or os.path.join(common.runs_dir(), name)
  marker = os.path.join(workdir, "warm_start.txt")
  if not os.path.isfile(marker):  # never started here
    return os.path.join(store, name) if run_store.read(os.path.join(store, name)) else None
  with open(marker) as f:
    hf = f.read().strip()
  cfg = config.get_config(f"arm={arm},seed={seed},warm_start={hf}" + (",smoke" if smoke else ""))
  done = (run_store.latest(workdir) or 0) >= cfg.iterations
  return run_store.publish(workdir, os.path.join(store, name), arm=arm, seed=seed, cfg=cfg,
                           warm_start_sha256=common.weights_digest(hf), finished=done)


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


def run_all(*, smoke: bool = False, results: str = "", start: str = "", runner=None,
            store: str | None = None) -> list:
  """Runs (or resumes) every arm x seed not yet finished, in ``pending``'s order; a rerun
  after an interruption picks up where it stopped. Returns the results paths written."""
  runner = runner or run
  todo = pending(results, smoke)
  paths = []
  for i, (arm, seed) in enumerate(todo):
    print(f"[{i + 1}/{len(todo)}] arm {arm} seed {seed}", flush=True)
    paths.append(runner(arm, seed, smoke=smoke, results=results, start=start, store=store))
  return paths


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _PUBLISH.value:
    if not _store(_STORE.value, _SMOKE.value):
      raise app.UsageError("--publish stores runs in --store; give a directory (smoke runs "
                           "have no default store).")
    if _ALL.value or not (_ARM.present or _SEED.present):
      for arm, seed in [(a, s) for s in _common().SEEDS for a in _common().ARMS]:
        out = publish(arm, seed, smoke=_SMOKE.value, store=_STORE.value)
        print(f"{arm}-{seed}: {out or 'nothing stored'}")
    else:
      print(publish(_ARM.value, _SEED.value, smoke=_SMOKE.value, workdir=_WORKDIR.value,
                    store=_STORE.value) or "nothing stored")
    return
  if _ALL.value:
    if _WORKDIR.value or _ARM.present or _SEED.present:
      raise app.UsageError("--all runs every arm and seed in the cache's runs/<arm>-<seed>; "
                           "drop --arm, --seed and --workdir.")
    run_all(smoke=_SMOKE.value, results=_RESULTS.value, start=_START.value,
            store=_STORE.value)
    return
  run(_ARM.value, _SEED.value, smoke=_SMOKE.value, workdir=_WORKDIR.value,
      results=_RESULTS.value, start=_START.value, store=_STORE.value)


def _common():
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  return common


def _define_flags() -> None:
  """The command line's flags (defined only when run as a program)."""
  global _ALL, _ARM, _PUBLISH, _RESULTS, _SEED, _SMOKE, _START, _STORE, _WORKDIR
  _ALL = flags.DEFINE_bool("all", False, "Every arm x seed without a finished results JSON, "
                           "seed by seed (resumes an interrupted queue).")
  _ARM = flags.DEFINE_string("arm", "spade", "spade | static | solve_rate | frozen_designer.")
  _SEED = flags.DEFINE_integer("seed", 0, "Run seed.")
  _SMOKE = flags.DEFINE_bool("smoke", False, "A two-iteration run of a tiny model.")
  _WORKDIR = flags.DEFINE_string("workdir", "", "Run directory (default "
                                 "$SPADE_JAX_CACHE/mechanism/runs/<arm>-<seed>).")
  _START = flags.DEFINE_string("warm_start", "", "The warm start the arm begins from: a "
                               "build directory holding hf/, or an HF directory (default: "
                               "the cache's, built first when missing).")
  _PUBLISH = flags.DEFINE_bool("publish", False, "Store the runs under the cache's runs/ "
                               "(or --arm and --seed's) as far as they went in --store, for "
                               "another checkout to go on from; finished runs' copies are "
                               "removed.")
  _STORE = flags.DEFINE_string("store", None, "Stored runs (default the project's "
                               "stored_runs/, none for --smoke; '' for none).")
  _RESULTS = flags.DEFINE_string("results", "", "Results directory (default results/, or the "
                                 "workdir for --smoke).")


if __name__ == "__main__":
  _define_flags()
  sys.exit(app.run(main))
