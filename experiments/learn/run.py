r"""Runs the learning recipe over seeds (resumable), records each run, and tabulates them.

  python -m experiments.learn.run --seeds=0,1,2
  python -m experiments.learn.run --seeds=0,1,2 --report_only

Each seed trains `experiments/configs/learn.py:seed=N` in `<root>/<task>-<seed>` (root:
--root, default $SPADE_JAX_CACHE/learn; a finished run is only read back, a killed one
resumes from its checkpoint), then writes `results/<task>-<seed>.json` (held-out scores
before and after, reward per step, seconds per step, the config). The report reads every
results file of the task and prints (and writes to results/<task>.md) the per-seed table
and the mean gain with its 95% t interval over seeds.
"""

import glob
import json
import math
import os

from absl import app
from absl import flags

from experiments.configs import common
from experiments.configs import learn
from spade_jax.selfplay import loop

_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds to run.")
_TASK = flags.DEFINE_string("task", "chain_sum", "The recipe's task argument.")
_ARGS = flags.DEFINE_string("args", "", "Further recipe arguments, e.g. 'iterations=30'.")
_ROOT = flags.DEFINE_string("root", "", "Where the runs live (default: the cache).")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Only tabulate existing results.")

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SCORES = ("lenient", "strict", "lenient@k", "greedy/lenient", "greedy/strict", "format")
# Two-sided 95% t quantiles by degrees of freedom.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def _rows(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f]


def record(workdir: str, config, task: str) -> dict:
  """What a finished run shows: held-out scores at its first and last evaluation,
  rewards and seconds per step."""
  rows = _rows(os.path.join(workdir, "metrics.jsonl"))
  evals = [r for r in rows if "eval/procedural/lenient" in r]
  first, last = evals[0], evals[-1]
  steps = [r for r in rows if "agent/reward_nohint" in r]
  return {
      "task": task, "seed": int(config.seed), "workdir": workdir,
      "iterations": int(config.iterations),
      "before": {k: first[f"eval/procedural/{k}"] for k in SCORES},
      "after": {k: last[f"eval/procedural/{k}"] for k in SCORES},
      "eval_steps": [int(r["step"]) for r in evals],
      "curve": {k: [r[f"eval/procedural/{k}"] for r in evals] for k in SCORES},
      "reward": [r["agent/reward_nohint"] for r in steps],
      "seconds_play": [r["time/play"] for r in steps],
      "seconds_train": [r["time/train"] for r in steps],
      "logp_gap_max": max(r.get("train/agent_logp_gap_max", 0.0) for r in steps),
      "config": json.loads(config.to_json()),
  }


def _mean_ci(xs: list[float]) -> tuple[float, float]:
  n = len(xs)
  m = sum(xs) / n
  if n < 2:
    return m, float("nan")
  sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
  return m, _T95.get(n - 1, 1.96) * sd / math.sqrt(n)


def report(task: str) -> str:
  """The per-seed table and the gain over seeds, as markdown."""
  recs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(RESULTS, f"{task}-*.json")))]
  if not recs:
    raise SystemExit(f"No results for task {task!r} in {RESULTS}; run without --report_only.")
  lines = ["| seed | lenient before → after | strict before → after | lenient@4 before → "
           "after | greedy lenient before → after | format after | s/step (play + train) |",
           "|---|---|---|---|---|---|---|"]
  for r in recs:
    b, a = r["before"], r["after"]
    sec = [p + t for p, t in zip(r["seconds_play"][1:], r["seconds_train"][1:])]
    lines.append(
        f"| {r['seed']} | {b['lenient']:.3f} → {a['lenient']:.3f} | {b['strict']:.3f} → "
        f"{a['strict']:.3f} | {b['lenient@k']:.3f} → {a['lenient@k']:.3f} | "
        f"{b['greedy/lenient']:.3f} → {a['greedy/lenient']:.3f} | {a['format']:.3f} | "
        f"{sum(sec) / max(1, len(sec)):.1f} |")
  lines.append("")
  for k in ("lenient", "strict", "greedy/lenient"):
    m, ci = _mean_ci([r["after"][k] - r["before"][k] for r in recs])
    lines.append(f"- {k} gain (after - before), mean over {len(recs)} seeds: "
                 f"**{m:+.3f} ± {ci:.3f}** (95% t)")
  return "\n".join(lines) + "\n"


def plot(task: str) -> str:
  """results/<task>.png: held-out lenient and strict pass@1 at each evaluation, and the
  training reward (moving mean of 10 steps), per seed."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  recs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(RESULTS, f"{task}-*.json")))]
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
  for r in recs:
    line, = ax1.plot(r["eval_steps"], r["curve"]["lenient"], marker="o",
                     label=f"seed {r['seed']} lenient")
    ax1.plot(r["eval_steps"], r["curve"]["strict"], ls=":", color=line.get_color())
    rew = r["reward"]
    smooth = [sum(rew[max(0, i - 9):i + 1]) / len(rew[max(0, i - 9):i + 1])
              for i in range(len(rew))]
    ax2.plot(range(1, len(rew) + 1), smooth, label=f"seed {r['seed']}")
  ax1.set(xlabel="GRPO step", ylabel="held-out pass@1 (dotted: strict)", ylim=(0, 1),
          title=f"{task}: held-out accuracy")
  ax2.set(xlabel="GRPO step", ylabel="mean reward (10-step moving mean)", ylim=(0, 1),
          title="training reward")
  ax1.legend(fontsize=8)
  ax2.legend(fontsize=8)
  fig.tight_layout()
  path = os.path.join(RESULTS, f"{task}.png")
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def main(argv):
  del argv
  root = _ROOT.value or os.path.join(common.cache_dir(), "learn")
  os.makedirs(RESULTS, exist_ok=True)
  if not _REPORT_ONLY.value:
    for seed in _SEEDS.value:
      arg = ",".join(a for a in (f"task={_TASK.value}", f"seed={seed}", _ARGS.value) if a)
      config = learn.get_config(arg)
      workdir = os.path.join(root, f"{_TASK.value}-{seed}")
      print(f"== {arg}: {workdir}", flush=True)
      loop.train(config, workdir)
      path = os.path.join(RESULTS, f"{_TASK.value}-{seed}.json")
      with open(path + ".tmp", "w") as f:
        json.dump(record(workdir, config, _TASK.value), f, indent=1)
      os.replace(path + ".tmp", path)
  table = report(_TASK.value)
  with open(os.path.join(RESULTS, f"{_TASK.value}.md"), "w") as f:
    f.write(table)
  print(table)
  print(f"plot: {plot(_TASK.value)}")


if __name__ == "__main__":
  app.run(main)
