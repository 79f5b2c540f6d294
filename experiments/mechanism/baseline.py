r"""The warm start's own evaluation: the arms' ``families`` suite before any self-play.

  python -m experiments.mechanism.baseline [--smoke] [--warm_start=BUILD_DIR]

Every arm starts from the same weights and evaluates on the same fixed seeds, greedily, so
one evaluation of those weights is every arm's iteration 0. It runs the arms' ``eval``
section (``config.py``) through the loop's own ``evaluate_policy``, with the policy built as
an arm builds it, and writes ``results/warm_start_eval.json``: the ``eval/...`` scores and
the weights' SHA-256, which ``report.py`` checks against the runs' before it draws the
warm start's row and its iteration-0 points.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from absl import app
from absl import flags

FILE = "warm_start_eval.json"


def evaluate(*, smoke: bool = False, start: str = "", results: str = "") -> str:
  """Evaluates the warm start as every arm would at iteration 0; returns the JSON's path."""
  from experiments.mechanism import common, config  # pylint: disable=g-import-not-at-top
  from spade_jax import sandbox  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay import build, loop  # pylint: disable=g-import-not-at-top
  cfg = config.get_config("arm=spade,seed=0" + (",smoke" if smoke else "") +
                          (f",warm_start={start}" if start else ""))
  hf = cfg.model.init_from.removeprefix("hf:")
  if not os.path.isfile(os.path.join(hf, "config.json")):
    raise FileNotFoundError(f"No warm start at {hf}; build it with `python -m "
                            "experiments.mechanism.warm_start` (or run an arm first).")
  run = build.build_run(cfg)
  c = run.config
  with tempfile.TemporaryDirectory() as tmp, sandbox.EnvPool(c.sandbox) as pool:
    sp = run.selfplay(pool, tmp)
    scores = loop.evaluate_policy(sp, c.eval, pool)
  out_dir = results or common.RESULTS
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, FILE)
  data = {"iteration": 0, "suites": c.eval.suites, "limit": c.eval.limit,
          "warm_start": {"path": os.path.abspath(hf), "sha256": common.weights_digest(hf)},
          "eval": {k: float(v) for k, v in sorted(scores.items())}}
  with open(path + ".tmp", "w") as f:
    json.dump(data, f, indent=1)
  os.replace(path + ".tmp", path)
  print(f"wrote {path}", flush=True)
  return path


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  evaluate(smoke=_SMOKE.value, start=_START.value, results=_RESULTS.value)


def _define_flags() -> None:
  """The command line's flags (defined only when run as a program)."""
  global _SMOKE, _START, _RESULTS
  _SMOKE = flags.DEFINE_bool("smoke", False, "The smoke warm start (tests).")
  _START = flags.DEFINE_string("warm_start", "", "A warm-start build directory or HF "
                               "directory (default: the cache's).")
  _RESULTS = flags.DEFINE_string("results", "", "Results directory (default results/).")


if __name__ == "__main__":
  _define_flags()
  sys.exit(app.run(main))
