r"""Tabulates the mechanism experiment from its results files, and fills the README.

  python -m experiments.mechanism.report [--results=DIR] [--readme=PATH|--readme=]
      [--variants=PATH|--variants=]

Reads every `results/<arm>-<seed>.json` (`run.py` writes them from the run directories),
and recomputes:

* the per-arm table: for each score, the mean over seeds (95% t interval) of its value at
  the last evaluation and of its gain over the first (the warm start, iteration 0);
* contrasts on the gains, difference of means with a 95% t interval, paired by seed where
  both ran the same seeds (pooled variance otherwise): every pair of arms, and each tagged
  variant against its parent (`parent`: the variant it extends, else its arm);
* what each arm's designer wrote: programs, valid ones, their families and win rates, and
  how many of its samples had a gradient (a nonzero centred reward: a flat cohort, where
  every design of a skill scored alike, trains nothing);
* what the learner did: updates with trained rows, and the net push of each (one update a
  rollout, so the PPO ratio and the TIS weight are 1 and the loss is minus the mean
  advantage over what the aggregation averages: with `token_mean`, positive where the
  negative-advantage plays held more trained tokens);
* learning curves (`results/curve_<score>.png`): each arm's mean over seeds at every
  evaluation.

The README's text between `<!-- report:NAME -->` and `<!-- /report:NAME -->` is replaced
by the tables (NAME: `table`, `contrasts`, `designers`, `learner`) of the arms' own runs;
the variants document's (`LEARNER.md`, the learner investigation) by the same tables of
the tagged variants and the arm runs they extend. The plots are the arms'.
"""

from __future__ import annotations

import collections
import glob
import itertools
import json
import math
import os
import re

from absl import app
from absl import flags
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from experiments.mechanism import common  # pylint: disable=wrong-import-position
from spade_jax.metrics import read_metrics  # pylint: disable=wrong-import-position

# Per-iteration series kept from the metrics (the designers' side of the question).
SERIES = ("designer/valid_rate", "rewards/win_rate_band_frac", "rewards/win_rate_mean",
          "rewards/regret_mean", "agent/reward_nohint", "agent/reward_hint", "train/loss",
          "batch/loss_tokens")
# The scores of the table: name -> (what it averages, the label).
SCORES = {
    "seen_medium": ("success", "seen, designers' level"),
    "seen_harder": ("success", "seen, harder level"),
    "held_out": ("success", "held-out"),
    "held_out@k": ("pass@k", "held-out pass@k"),
    "seen_medium_greedy": ("greedy", "seen greedy"),
    "held_out_greedy": ("greedy", "held-out greedy"),
}
# t_{0.975, df}; larger df use 1.96.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 12: 2.179, 14: 2.145, 16: 2.120}


def scores(row: dict) -> dict[str, float]:
  """The table's scores of one evaluation row of metrics (`eval/families/...`)."""
  per = collections.defaultdict(list)
  for key, value in row.items():
    m = re.fullmatch(r"eval/families/(success|pass@k|greedy)/(\w+)/(\d)", key)
    if not m:
      continue
    rate, family, level = m[1], m[2], int(m[3])
    if family == common.HELD_OUT:
      name = {"success": "held_out", "pass@k": "held_out@k", "greedy": "held_out_greedy"}[rate]
    elif level == common.DESIGNER_LEVEL:
      name = {"success": "seen_medium", "greedy": "seen_medium_greedy"}.get(rate)
    elif level == common.HARDER_LEVEL and rate == "success":
      name = "seen_harder"
    else:
      name = None
    if name:
      per[name].append(value)
  return {k: sum(v) / len(v) for k, v in per.items()}


def designed(workdir: str) -> list[dict]:
  """The run's designed programs as its memory holds them (one entry per distinct program):
  the iteration it was last written, its family and mean knob level (`common.family_of`),
  its verdict ("valid" or the failure), its win rates without and with hints, and how many
  times it was written."""
  path = os.path.join(workdir, "memory.json")
  if not os.path.isfile(path):
    return []
  with open(path) as f:
    records = json.load(f)["records"]
  out = []
  for r in records:
    family, level = common.family_of(r["program"])
    out.append({"iteration": int(r["iteration"]) + 1, "family": family, "level": level,
                "verdict": r.get("reason") or "valid", "nohint": r.get("win_rate_nohint"),
                "hint": r.get("win_rate_hint"), "count": int(r.get("count", 1))})
  return out


def design_signal(workdir: str) -> dict[str, int]:
  """How many designer samples the run scored (``designer_samples.jsonl``) and how many of
  them had a nonzero reward after centring, i.e. a gradient (a frozen designer's too, which
  it does not train on)."""
  rows = [r for r in read_metrics(workdir, "designer_samples") if "reward" in r]
  return {"samples": len(rows),
          "with_gradient": sum(abs(float(r["reward"])) > 1e-6 for r in rows)}


def designed_levels(programs: list[dict]) -> list[list[float]]:
  """[[iteration, mean level]] of the family-style programs among ``programs``."""
  by_it = collections.defaultdict(list)
  for p in programs:
    if p["level"] is not None:
      by_it[p["iteration"]].append(p["level"])
  return [[it, sum(v) / len(v)] for it, v in sorted(by_it.items())]


def collect(workdir: str, *, arm: str, seed: int, tag: str = "") -> dict:
  """One run's record: its evaluation curve and per-iteration series, JSON-able."""
  rows = read_metrics(workdir)
  evals = [r for r in rows if any(k.startswith("eval/families/") for k in r)]
  programs = designed(workdir)
  return {"arm": arm, "seed": seed, **({"tag": tag} if tag else {}),
          "iterations": max((int(r["step"]) for r in rows), default=0),
          "curve": [{"step": int(r["step"]), **scores(r)} for r in evals],
          "series": {k: [[int(r["step"]), float(r[k])] for r in rows if k in r]
                     for k in SERIES},
          "designed": programs, "designed_levels": designed_levels(programs),
          "design_signal": design_signal(workdir)}


def mean_ci(xs) -> tuple[float, float, int]:
  """(mean, 95% t half-width, n); the half-width is NaN below two values."""
  xs = [x for x in xs if x is not None and math.isfinite(x)]
  n = len(xs)
  if not n:
    return float("nan"), float("nan"), 0
  m = sum(xs) / n
  if n < 2:
    return m, float("nan"), n
  sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
  return m, _T975.get(n - 1, 1.96) * sd / math.sqrt(n), n


def contrast(a, b) -> tuple[float, float, int]:
  """(mean(a) - mean(b), 95% t half-width, df).

  ``a`` and ``b`` are lists (unpaired: a pooled-variance interval) or seed -> value dicts;
  dicts over the same seeds are paired (the interval of the per-seed differences, n - 1
  df): every arm's run of a seed starts from the same evaluation and sampling keys, and
  the arms that design play the same games until a designer update first differs.
  """
  if isinstance(a, dict) and isinstance(b, dict):
    if a and set(a) == set(b):
      m, ci, n = mean_ci([a[s] - b[s] for s in a])
      return m, ci, n - 1
    a, b = list(a.values()), list(b.values())
  if len(a) < 1 or len(b) < 1:
    return float("nan"), float("nan"), 0
  ma, mb = sum(a) / len(a), sum(b) / len(b)
  df = len(a) + len(b) - 2
  if len(a) < 2 or len(b) < 2:
    return ma - mb, float("nan"), df
  pooled = (sum((x - ma) ** 2 for x in a) + sum((x - mb) ** 2 for x in b)) / df
  return ma - mb, _T975.get(df, 1.96) * math.sqrt(pooled * (1 / len(a) + 1 / len(b))), df


def _fmt(m: float, ci: float, sign: str = "") -> str:
  if not math.isfinite(m):
    return "-"
  return f"{m:{sign}.3f}" + ("" if not math.isfinite(ci) else f" ± {ci:.3f}")


def end_and_gain(result: dict) -> dict[str, tuple[float, float]]:
  """Score -> (value at the last evaluation, gain over the first)."""
  curve = result["curve"]
  if not curve:
    return {}
  first, last = curve[0], curve[-1]
  return {k: (last[k], last[k] - first[k]) for k in SCORES if k in first and k in last}


def load(results_dir: str) -> list[dict]:
  """Every arm's results file in ``results_dir``, in arm then seed order."""
  out = []
  for path in glob.glob(os.path.join(results_dir, "*-*.json")):
    with open(path) as f:
      r = json.load(f)
    if r.get("arm") in common.ARMS:
      out.append(r)
  return sorted(out, key=lambda r: (common.ARMS.index(r["arm"]), r.get("tag", ""), r["seed"]))


def row_label(result: dict) -> str:
  """A run's row in the tables: its arm, and its tag where it has one (a variant of the
  arm, e.g. `static [easy]`, run with `run.py --tag`)."""
  return result["arm"] + (f" [{result['tag']}]" if result.get("tag") else "")


def by_row(results: list[dict]) -> dict[str, list[dict]]:
  """``results`` (in `load`'s order) grouped by their row in the tables (`row_label`)."""
  rows = collections.defaultdict(list)
  for r in results:
    rows[row_label(r)].append(r)
  return dict(rows)


def arm_table(results: list[dict]) -> str:
  """Per arm: each score's last value and its gain over the start (mean ± 95% t)."""
  head = "| arm | runs | " + " | ".join(f"{label}: end (gain)" for _, label in
                                          SCORES.values()) + " | designer valid |"
  lines = [head, "|---" * (len(SCORES) + 3) + "|"]
  for arm, arm_results in by_row(results).items():
    runs = [end_and_gain(r) for r in arm_results]
    cells = []
    for k in SCORES:
      end = mean_ci([r[k][0] for r in runs if k in r])
      gain = mean_ci([r[k][1] for r in runs if k in r])
      cells.append(f"{_fmt(*end[:2])} ({_fmt(*gain[:2], sign='+')})")
    valid = mean_ci([_series_mean(r, "designer/valid_rate") for r in arm_results])
    lines.append(f"| {arm} | {len(runs)} | " + " | ".join(cells) +
                 f" | {_fmt(*valid[:2])} |")
  return "\n".join(lines) + "\n"


def _series_mean(result: dict, key: str) -> float | None:
  pts = result["series"].get(key, [])
  return sum(v for _, v in pts) / len(pts) if pts else None


def parent(label: str, labels) -> str | None:
  """The row a tagged variant is compared with: the variant of the same arm whose tag is
  the longest `_`-bounded prefix of its own (`static [easy_lr3e5]` for
  `static [easy_lr3e5_shuffled]`), else the arm's own row; None for an arm's row, or where
  none of those is among ``labels``."""
  if " [" not in label:
    return None
  arm, tag = label[:-1].split(" [")
  parts = tag.split("_")
  for n in range(len(parts) - 1, 0, -1):
    up = f"{arm} [{'_'.join(parts[:n])}]"
    if up in labels:
      return up
  return arm if arm in labels else None


def contrast_table(results: list[dict], arm_pairs: bool = True) -> str:
  """Every pair of arms (unless not ``arm_pairs``), and each variant with its `parent`:
  the difference of their mean gains, 95% t interval, paired by seed where both ran the
  same seeds (`contrast`)."""
  gains = collections.defaultdict(lambda: collections.defaultdict(dict))
  for r in results:
    for k, (_, gain) in end_and_gain(r).items():
      gains[row_label(r)][k][r["seed"]] = gain
    band = _series_mean(r, "rewards/win_rate_band_frac")
    if band is not None:
      gains[row_label(r)]["band"][r["seed"]] = band
  keys = list(SCORES) + ["band"]
  labels = [label for _, label in SCORES.values()] + ["envs in the learning band"]
  lines = ["| contrast | seeds | " + " | ".join(labels) + " |",
           "|---" * (len(keys) + 2) + "|"]
  rows = by_row(results)
  ups = {x: parent(x, rows) for x in rows}
  pairs = list(itertools.combinations([x for x in rows if " [" not in x], 2)) if arm_pairs \
      else []
  pairs += [(up, x) for x, up in ups.items() if up is not None]
  for a, b in pairs:
    cells = [_fmt(*contrast(gains[a][k], gains[b][k])[:2], sign="+") for k in keys]
    sa, sb = ({r["seed"] for r in rows[x]} for x in (a, b))
    seeds = f"{len(sa)} paired" if sa == sb else f"{len(sa)} vs {len(sb)}"
    lines.append(f"| {a} - {b} | {seeds} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def designer_table(results: list[dict], top: int = 4) -> str:
  """Per arm with a designer: what it wrote, pooled over its runs. Programs are counted
  as written (a program written twice counts twice); the win rates are the memory's, the
  mean over the valid programs' writes; "samples with a gradient" counts the designer's
  scored samples whose centred reward was nonzero, of all it scored (`design_signal`)."""
  lines = ["| arm | runs | written | valid | families of the valid (share) | "
           "unhinted win | hinted win | samples with a gradient |", "|---" * 8 + "|"]
  for arm, arm_results in by_row(results).items():
    runs = [r for r in arm_results if r.get("designed")]
    if not runs:
      continue
    progs = [p for r in runs for p in r["designed"]]
    written = sum(p["count"] for p in progs)
    valid = [p for p in progs if p["verdict"] == "valid"]
    n = sum(p["count"] for p in valid)
    fams = collections.Counter()
    for p in valid:
      fams[p["family"] or "other"] += p["count"]
    shares = ", ".join(f"{f} {c / n:.0%}" for f, c in fams.most_common(top)) if n else "-"
    if len(fams) > top:
      shares += f", {len(fams) - top} more"
    win = lambda k: _fmt(*mean_ci([p[k] for p in valid for _ in range(p["count"])])[:1],
                         math.nan)
    signal = [r["design_signal"] for r in runs if r.get("design_signal", {}).get("samples")]
    scored = sum(s["samples"] for s in signal)
    grad = f"{sum(s['with_gradient'] for s in signal)} of {scored}" if scored else "-"
    lines.append(f"| {arm} | {len(runs)} | {written} | {n} | {shares} | {win('nohint')} | "
                 f"{win('hint')} | {grad} |")
  return "\n".join(lines) + "\n"


def learner_table(results: list[dict]) -> str:
  """Per row: the updates that trained rows, the share of them whose loss was positive
  (the sampled tokens pushed down on net), the mean loss (95% t over runs) and the tokens
  trained in all (mean over runs). Runs whose results lack the loss series are left out."""
  lines = ["| arm | runs | updates with rows | pushed down on net | mean loss | "
           "trained tokens a run |", "|---" * 6 + "|"]
  for arm, arm_results in by_row(results).items():
    runs = [r for r in arm_results if r["series"].get("train/loss")]
    if not runs:
      continue
    used, down, means, tokens = 0, 0, [], []
    for r in runs:
      n = {int(s): v for s, v in r["series"].get("batch/loss_tokens", [])}
      loss = [v for s, v in r["series"]["train/loss"] if n.get(int(s), 1) > 0]
      used += len(loss)
      down += sum(v > 1e-6 for v in loss)
      means.append(sum(loss) / len(loss) if loss else 0.0)
      tokens.append(sum(n.values()))
    m, ci, _ = mean_ci(means)
    lines.append(f"| {arm} | {len(runs)} | {used} | {down} of {used} | "
                 f"{_fmt(m, ci, sign='+')} | {sum(tokens) / len(tokens):,.0f} |")
  return "\n".join(lines) + "\n"


def plots(results: list[dict], out_dir: str) -> list[str]:
  """One PNG per score: each arm's mean over seeds at each evaluation step."""
  paths = []
  for k, (_, label) in SCORES.items():
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for arm, arm_results in by_row(results).items():
      by_step = collections.defaultdict(list)
      for r in arm_results:
        for point in r["curve"]:
          if k in point:
            by_step[point["step"]].append(point[k])
      if by_step:
        steps = sorted(by_step)
        ax.plot(steps, [sum(by_step[s]) / len(by_step[s]) for s in steps], marker="o",
                label=arm)
    ax.set(xlabel="iteration", ylabel="success", title=label, ylim=(0, 1))
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, f"curve_{k.replace('@', '_at_')}.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    paths.append(path)
  return paths


def fill(readme: str, name: str, text: str) -> bool:
  """Replaces the README's text between the ``name`` markers; False when it has none."""
  with open(readme) as f:
    old = f.read()
  start, end = f"<!-- report:{name} -->", f"<!-- /report:{name} -->"
  if start not in old or end not in old:
    return False
  head, rest = old.split(start, 1)
  new = head + start + "\n" + text + end + rest.split(end, 1)[1]
  with open(readme, "w") as f:
    f.write(new)
  return True


def variant_rows(results: list[dict]) -> list[dict]:
  """The tagged variants and the untagged runs of the arms they vary, in ``results``' order
  (what the variants document tabulates)."""
  varied = {r["arm"] for r in results if r.get("tag")}
  return [r for r in results if r["arm"] in varied]


def report(results_dir: str, readme: str = "", variants: str = "") -> dict:
  """Tables and plots of ``results_dir``: the arms' (untagged runs) in ``readme``, the
  variants' (`variant_rows`) in ``variants``, each filled when given."""
  results = load(results_dir)
  if not results:
    raise FileNotFoundError(f"No <arm>-<seed>.json results in {results_dir}; run "
                            "`python -m experiments.mechanism.run` first.")
  arms = [r for r in results if not r.get("tag")]
  var = variant_rows(results)
  out = {"table": arm_table(arms), "contrasts": contrast_table(arms),
         "designers": designer_table(arms), "learner": learner_table(arms),
         "plots": plots(arms, results_dir),
         "variants": {"table": arm_table(var), "contrasts": contrast_table(var, False),
                      "learner": learner_table(var)}}
  for path, tables in ((readme, out), (variants, out["variants"])):
    if path:
      for name in ("table", "contrasts", "designers", "learner"):
        if name in tables:
          fill(path, name, tables[name])
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  out = report(_RESULTS.value, _README.value, _VARIANTS.value)
  for name in ("table", "contrasts", "designers", "learner"):
    print(out[name])
  for name in ("table", "contrasts", "learner"):
    print(out["variants"][name])
  print("plots:", *out["plots"])


def _define_flags() -> None:
  """The command line's flags (defined only when run as a program)."""
  global _RESULTS, _README, _VARIANTS
  _RESULTS = flags.DEFINE_string("results", common.RESULTS, "Results directory.")
  _README = flags.DEFINE_string("readme", common.README, "README to fill ('' for none).")
  _VARIANTS = flags.DEFINE_string("variants", common.LEARNER, "The variants' document to "
                                  "fill ('' for none).")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
