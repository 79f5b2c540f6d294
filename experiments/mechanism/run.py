r"""Runs the mechanism experiment's arms, resumably, and records each run.

  python -m experiments.mechanism.run [--arms=spade,static,solve_rate,frozen_designer]
      [--seeds=0,1,2] [--args=pool_max_level=1 --tag=easy] [--smoke]

Builds the warm start first when the cache lacks it (`warm_start.build`), then runs each
arm x seed (seed by seed, so a partial queue still compares the arms) through the library's
training loop in `$SPADE_JAX_CACHE/mechanism/runs/<arm>-<seed>`: a killed run resumes
from its last checkpoint, a finished one with its results file is only read back. A run
directory remembers the warm start's SHA-256 and fingerprint and refuses to go on from
other weights (a rebuild on another CPU has other bits of the same model: its fingerprint
matches, `common.same_weights`). Each
run writes `results/<arm>-<seed>.json` (the warm start's digest, the evaluation curve, the
designer and reward series); `python -m experiments.mechanism.report` tabulates them.

Every arm x seed starts from the same weights and evaluates with the same suite config and
sampling keys, so their evaluation before training is one computation: `start_eval` makes
it once per warm start (`results/start_eval.json`) and each curve's step 0 is that record
(`shared_start=False` in the args has every run evaluate at its start instead).
"""

from __future__ import annotations

import json
import os
import re
import time

from absl import app
from absl import flags

from experiments.configs import mechanism as configs
from experiments.mechanism import common, report, warm_start
from spade_jax import models, sandbox
from spade_jax.checkpoint import Checkpointer
from spade_jax.selfplay import build as builder, loop


# The arguments that shape the warm start rather than the arms.
WARM_START_ARGS = ("steps", "designer_rows", "agent_rows", "sft_lr", "train_slips")


def run(arm: str, seed: int, *, args: str = "", smoke: bool = False, root: str = "",
        results: str = "", tag: str = "") -> str:
  """Runs (or resumes) one arm x seed; returns the path of its results JSON.

  ``root``: where the run directories live (default the cache's runs/); ``results``: where
  the JSON goes (default `results/`, the run directory for smoke); ``tag``: a variant of
  the arm (other ``args``), named `<arm>-<seed>-<tag>` and reported as its own row.
  """
  if arm not in common.ARMS:
    raise ValueError(f"Unknown arm {arm!r}; expected one of {list(common.ARMS)}.")
  if tag and not re.fullmatch(r"[a-z0-9_]+", tag):
    raise ValueError(f"tag={tag!r}; expected lower-case letters, digits and _ (it names "
                     "the run's directory and results file).")
  ws_args = ",".join(a for a in args.split(",") if a.split("=")[0] in WARM_START_ARGS)
  ws = warm_start.build(ws_args, smoke=smoke)  # read back when already built
  config = configs.get_config(",".join(a for a in (f"arm={arm}", f"seed={seed}", args,
                                                   "smoke" if smoke else "") if a))
  hf = config.model.init_from.removeprefix("hf:")
  digest = common.weights_digest(hf)
  if not warm_start.same_build(ws, hf, digest):
    raise ValueError(f"{hf} holds weights {digest[:12]}, not the warm start's "
                     f"{ws['sha256'][:12]}; rebuild the warm start.")
  name = f"{arm}-{seed}" + (f"-{tag}" if tag else "")
  workdir = os.path.join(root or common.runs_dir() + ("_smoke" if smoke else ""), name)
  os.makedirs(workdir, exist_ok=True)
  marker = os.path.join(workdir, "warm_start.json")
  if os.path.isfile(marker):
    with open(marker) as f:
      began = json.load(f)
    if not warm_start.same_build(began, hf, digest):
      raise ValueError(f"{workdir} began from warm start {began['sha256'][:12]}, not "
                       f"{digest[:12]}; it cannot go on from other weights. Remove it or "
                       "give another root.")
  else:
    _write(marker, {"sha256": digest, "fingerprint": common.weights_fingerprint(hf),
                    "hf": hf})
  path = os.path.join(results or (workdir if smoke else common.RESULTS), f"{name}.json")
  ckpt = Checkpointer(workdir)
  done = ckpt.latest_step() or 0
  ckpt.close()
  if done >= config.iterations and os.path.isfile(path):
    # Read back, not rerun: a finished run keeps the config it ran with (e.g. static-0's
    # [8, 2,304] batches), which a changed layout in today's config would refuse.
    print(f"{name}: finished ({done} iterations); {path} stands", flush=True)
    return path
  start = None
  if config.eval.suites and not config.eval.at_start:
    start = start_eval(args=args, smoke=smoke, results=results or (workdir if smoke else ""))
  loop.train(config, workdir)
  record = report.collect(workdir, arm=arm, seed=seed, tag=tag)
  if start is not None:  # the run itself did not evaluate at step 0
    record["curve"].insert(0, {"step": 0, **report.scores(start["scores"]), "shared": True})
  record["warm_start"] = {"sha256": digest, "hf": hf}
  record["config"] = json.loads(config.to_json())
  _write(path, record)
  print(f"wrote {path}", flush=True)
  return path


def start_eval(*, args: str = "", smoke: bool = False, results: str = "") -> dict:
  """The arms' evaluation of the warm start, made once (see the module docstring); read
  back from ``results/start_eval.json`` when that holds these weights and this eval
  config."""
  config = configs.get_config(",".join(a for a in ("arm=static", "seed=0", args,
                                                   "smoke" if smoke else "") if a))
  hf = config.model.init_from.removeprefix("hf:")
  digest = common.weights_digest(hf)
  want = {k: v for k, v in json.loads(config.eval.to_json()).items()
          if k not in ("every", "at_start")}  # when a run evaluates, not what
  path = os.path.join(results or common.RESULTS, "start_eval.json")
  if os.path.isfile(path):
    with open(path) as f:
      record = json.load(f)
    if record["eval"] == want and warm_start.same_build(record, hf, digest):
      return record
  built = builder.build_run(config)
  c = built.config
  t0 = time.perf_counter()
  with sandbox.EnvPool(c.sandbox) as pool:
    scores = loop.evaluate_params(built.initial_state().params, built.trainer, c.sampling,
                                  models.ChatTemplate(built.vocab,
                                                      thinking=c.selfplay.agent_thinking),
                                  c.eval, pool)
  record = {"sha256": digest, "fingerprint": common.weights_fingerprint(hf), "hf": hf,
            "eval": want, "scores": scores,
            "seconds": round(time.perf_counter() - t0, 1)}
  _write(path, record)
  print(f"wrote {path} ({record['seconds']} s)", flush=True)
  return record


def run_all(arms, seeds, **kw) -> list[str]:
  """Every arm x seed, seed by seed (every arm name checked first)."""
  bad = [a for a in arms if a not in common.ARMS]
  if bad:
    raise ValueError(f"Unknown arm(s) {bad}; expected some of {list(common.ARMS)}.")
  return [run(arm, int(seed), **kw) for seed in seeds for arm in arms]


def _write(path: str, record: dict) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(record, f, indent=1)
  os.replace(path + ".tmp", path)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  run_all(_ARMS.value, _SEEDS.value, args=_ARGS.value, smoke=_SMOKE.value, tag=_TAG.value)


def _define_flags() -> None:
  """The command line's flags (defined only when run as a program)."""
  global _ARMS, _SEEDS, _ARGS, _SMOKE, _TAG
  _ARMS = flags.DEFINE_list("arms", list(common.ARMS), "Arms to run.")
  _SEEDS = flags.DEFINE_list("seeds", [str(s) for s in common.SEEDS], "Seeds to run.")
  _ARGS = flags.DEFINE_string("args", "", "Further config arguments, e.g. 'iterations=30'.")
  _SMOKE = flags.DEFINE_bool("smoke", False, "One iteration of a tiny random model.")
  _TAG = flags.DEFINE_string("tag", "", "A variant of the arms (other --args): runs and "
                             "results are named <arm>-<seed>-<tag>.")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
