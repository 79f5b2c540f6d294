r"""Each finished run's last weights and the warm start, evaluated on more seeds.

  python -m experiments.mechanism.final_eval [--limit=16]

The arms evaluate every ``EVAL_EVERY`` iterations on ``EVAL_SEEDS`` (4) fixed seeds per
family and level: 80 harder-range and 20 held-out episodes, so one episode moves a success
rate by 0.0125 or 0.05. This runs the same ``families`` suite (greedy, fixed seeds, the
loop's ``evaluate_policy``) with ``--limit`` seeds per family and level on the warm start
and on the latest checkpoint of every finished run in ``$SPADE_JAX_CACHE/mechanism/runs``,
and writes ``results/final_eval_<limit>.json``. It is resumable: a run already in the file
at the same step is not evaluated again, and the file is rewritten after each run.
``report.py`` turns it into the "final checkpoints" table.

  python -m experiments.mechanism.final_eval --levels=1-2

plays the seen families at those levels instead (the held-out family left out) and writes
``results/final_eval_<limit>_levels_<lo>-<hi>.json``, with their mean success as
``eval/families/seen_levels/success``. The arms' own evaluation looks only at levels 3-4,
above what the designers write (levels 1-2 on average), so this asks whether an arm's
agent improved where it trained.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile

from absl import app
from absl import flags

FINAL_SEEDS = 16


SEEN_LEVELS = "eval/families/seen_levels/success"  # mean over the --levels items


def path_for(results_dir: str, limit: int, levels: tuple[int, int] | None = None) -> str:
  tail = f"_levels_{levels[0]}-{levels[1]}" if levels else ""
  return os.path.join(results_dir, f"final_eval_{limit}{tail}.json")


def parse_levels(text: str) -> tuple[int, int] | None:
  """``"1-2"`` -> (1, 2), ``"3"`` -> (3, 3), ``""`` -> None (the suite's own items)."""
  if not text:
    return None
  lo, dash, hi = text.partition("-")
  try:
    got = (int(lo), int(hi if dash else lo))
  except ValueError:
    got = None
  if got is None or not 0 <= got[0] <= got[1] <= 4:
    raise ValueError(f"--levels={text!r}; give a level or a range within 0-4, e.g. "
                     "--levels=1-2.")
  return got


def seen_levels_items(levels: tuple[int, int]) -> str:
  """The ``families`` suite's items: every seen family at ``levels`` (inclusive)."""
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  return ",".join(f"{f}:{levels[0]}-{levels[1]}" for f in sorted(common.seen_families()))


def with_seen_levels(scores: dict[str, float]) -> dict[str, float]:
  """``scores`` plus ``SEEN_LEVELS``, the mean of its seen families' per-item success
  (every item plays the same number of seeds, so that is the mean over plays)."""
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  items = [v for k, v in scores.items() if k.startswith("eval/families/success/")
           and k.split("/")[3] != common.HELD_OUT]
  return dict(scores, **{SEEN_LEVELS: sum(items) / len(items)}) if items else scores


def finished_runs(results_dir: str, want: int) -> dict[str, str]:
  """``<arm>-<seed>`` -> its workdir, for every results JSON with ``want`` iterations."""
  from experiments.mechanism import common, report  # pylint: disable=g-import-not-at-top
  out = {}
  for r in report.load(results_dir):
    if r["iterations"] >= want:
      name = f"{r['arm']}-{r['seed']}"
      out[name] = os.path.join(common.runs_dir(), name)
  return out


def save_json(path: str, data: dict) -> None:
  """Writes ``data`` to ``path`` through a temporary file (a crash leaves the old one)."""
  with open(path + ".tmp", "w") as f:
    json.dump(data, f, indent=1)
  os.replace(path + ".tmp", path)


def arm_config(*, smoke: bool = False, start: str = "", limit: int = 0,
               levels: tuple[int, int] | None = None):
  """The arms' config (their ``eval`` section is shared) and its warm start's HF directory;
  ``limit``: seeds per family and level (0: the arms' own); ``levels``: play the seen
  families at those levels instead of the suite's items."""
  from experiments.mechanism import config  # pylint: disable=g-import-not-at-top
  cfg = config.get_config("arm=spade,seed=0" + (",smoke" if smoke else "") +
                          (f",warm_start={start}" if start else ""))
  families = {}
  if limit:
    cfg.eval.limit = limit
    families["seeds"] = limit  # the suite's default is 8 seeds
  if levels:
    families["families"] = seen_levels_items(levels)
  if families:
    cfg.eval.overrides = {"families": families}
  hf = cfg.model.init_from.removeprefix("hf:")
  if not os.path.isfile(os.path.join(hf, "config.json")):
    raise FileNotFoundError(f"No warm start at {hf}; build it with `python -m "
                            "experiments.mechanism.warm_start` (or run an arm first).")
  return cfg, hf


@contextlib.contextmanager
def evaluator(cfg):
  """Yields ``evaluate(run_dir="", step=None) -> (scores, step)``: the loop's
  ``evaluate_policy`` on a self-play driver built as an arm builds it, with the warm start's
  weights, or with those of ``run_dir``'s checkpoint ``step`` (default its latest)."""
  from spade_jax import sandbox  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay import build, loop, workdir  # pylint: disable=g-import-not-at-top
  run = build.build_run(cfg)
  c = run.config
  with tempfile.TemporaryDirectory() as tmp, sandbox.EnvPool(c.sandbox) as pool:
    sp = run.selfplay(pool, tmp)

    def evaluate(run_dir: str = "", step: int | None = None):
      got = 0
      if run_dir:
        _, _, params, got = workdir.load_run(run_dir, step, mesh_cfg=c.mesh)
        sp.state = sp.state.replace(params=params)
      scores = loop.evaluate_policy(sp, c.eval, pool)
      return {k: float(v) for k, v in sorted(scores.items())}, got

    yield evaluate


def evaluate_runs(*, limit: int = FINAL_SEEDS, runs: dict[str, str] | None = None,
                  smoke: bool = False, start: str = "", results: str = "",
                  levels: tuple[int, int] | None = None) -> str:
  """Evaluates the warm start and ``runs`` (name -> workdir; default every finished run);
  ``levels``: the seen families at those levels instead of the suite's items. Returns the
  JSON's path."""
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  if limit < 1:
    raise ValueError(f"--limit={limit}; give at least 1 seed per family and level.")
  cfg, hf = arm_config(smoke=smoke, start=start, limit=limit, levels=levels)
  digest = common.weights_digest(hf)
  out_dir = results or common.RESULTS
  os.makedirs(out_dir, exist_ok=True)
  path = path_for(out_dir, limit, levels)
  if runs is None:
    runs = finished_runs(out_dir, cfg.iterations)
  data = {"limit": limit, "suites": cfg.eval.suites,
          "warm_start": {"path": os.path.abspath(hf), "sha256": digest}, "runs": {}}
  if levels:
    data["levels"] = list(levels)
  score = with_seen_levels if levels else dict
  if os.path.isfile(path):
    with open(path) as f:
      data = json.load(f)
    if data["warm_start"]["sha256"] != digest:
      raise ValueError(f"{path} evaluated runs from another warm start "
                       f"({data['warm_start']['sha256'][:12]}, not {digest[:12]}); move it "
                       "aside first.")
  todo = {}
  for name, wd in sorted(runs.items()):
    step = _latest(wd)
    if step is None:
      raise FileNotFoundError(f"{name}: no checkpoint under {wd}/checkpoints; the run's "
                              "weights are needed (rerun it, or leave it out).")
    with open(os.path.join(wd, "warm_start.txt")) as f:
      began = f.read().strip()
    if common.weights_digest(began) != digest:
      raise ValueError(f"{name} began from {began}, not the warm start {hf}.")
    if data["runs"].get(name, {}).get("step") != step:
      todo[name] = (wd, step)
  if "eval" in data and not todo:
    print(f"{path}: nothing new to evaluate", flush=True)
    return path
  with evaluator(cfg) as evaluate:
    if "eval" not in data:
      print(f"warm start: {limit} seeds per family and level", flush=True)
      scores, _ = evaluate()
      data["eval"] = score(scores)
      save_json(path, data)
    for i, (name, (wd, step)) in enumerate(todo.items()):
      print(f"[{i + 1}/{len(todo)}] {name} step {step}", flush=True)
      scores, got = evaluate(wd, step)
      arm, seed = name.rsplit("-", 1)
      data["runs"][name] = {"arm": arm, "seed": int(seed), "step": got, "eval": score(scores)}
      save_json(path, data)
  print(f"wrote {path}", flush=True)
  return path


def _latest(wd: str) -> int | None:
  ckpts = os.path.join(wd, "checkpoints")
  steps = [int(d) for d in os.listdir(ckpts) if d.isdigit()] if os.path.isdir(ckpts) else []
  return max(steps, default=None)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    levels = parse_levels(_LEVELS.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  evaluate_runs(limit=_LIMIT.value, smoke=_SMOKE.value, start=_START.value,
                results=_RESULTS.value, levels=levels)


def start_flags():
  """``--smoke``, ``--warm_start`` and ``--results``, which both evaluation commands take."""
  return (flags.DEFINE_bool("smoke", False, "The smoke warm start (tests)."),
          flags.DEFINE_string("warm_start", "", "A warm-start build directory or HF "
                              "directory (default: the cache's)."),
          flags.DEFINE_string("results", "", "Results directory (default results/)."))


def _define_flags() -> None:
  """The command line's flags (defined only when run as a program)."""
  global _LIMIT, _SMOKE, _START, _RESULTS, _LEVELS
  _LIMIT = flags.DEFINE_integer("limit", FINAL_SEEDS, "Seeds per family and level.")
  _LEVELS = flags.DEFINE_string("levels", "", "Play the seen families at these levels "
                                "(e.g. 1-2) instead of the held-out family and levels 3-4.")
  _SMOKE, _START, _RESULTS = start_flags()


if __name__ == "__main__":
  _define_flags()
  sys.exit(app.run(main))
