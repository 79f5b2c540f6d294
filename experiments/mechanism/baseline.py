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

import os
import sys

from absl import app

FILE = "warm_start_eval.json"


def evaluate(*, smoke: bool = False, start: str = "", results: str = "") -> str:
  """Evaluates the warm start as every arm would at iteration 0; returns the JSON's path."""
  from experiments.mechanism import common, final_eval  # pylint: disable=g-import-not-at-top
  cfg, hf = final_eval.arm_config(smoke=smoke, start=start)
  with final_eval.evaluator(cfg) as run_eval:
    scores, _ = run_eval()
  out_dir = results or common.RESULTS
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, FILE)
  final_eval.save_json(path, {
      "iteration": 0, "suites": cfg.eval.suites, "limit": cfg.eval.limit,
      "warm_start": {"path": os.path.abspath(hf), "sha256": common.weights_digest(hf)},
      "eval": scores})
  print(f"wrote {path}", flush=True)
  return path


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  evaluate(smoke=_SMOKE.value, start=_START.value, results=_RESULTS.value)


def _define_flags() -> None:
  """The command line's flags (defined only when run as a program)."""
  global _SMOKE, _START, _RESULTS
  from experiments.mechanism import final_eval  # pylint: disable=g-import-not-at-top
  _SMOKE, _START, _RESULTS = final_eval.start_flags()


if __name__ == "__main__":
  _define_flags()
  sys.exit(app.run(main))
