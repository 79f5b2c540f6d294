r"""The mechanism experiment's table and plots, computed from the results JSON.

  python -m experiments.mechanism.report [--results=experiments/mechanism/results]

Reads every ``<arm>-<seed>.json`` that ``run.py`` wrote (``collect``: one run's series),
and writes ``summary.json``, ``table.md``, ``runs_table.md`` and the PNGs into the results
directory, and the tables into ``README.md`` between their ``<!-- table -->``,
``<!-- runs -->`` and ``<!-- final -->`` markers. Per arm, over seeds, mean
and 95% confidence interval (Student t, n - 1 degrees of freedom):

* held-out success: ``eval/families/held_out/success`` at the run's last evaluation;
* harder-range success: ``eval/families/harder/success`` at the last evaluation;
* designer valid rate: ``designer/valid_rate`` over all iterations (arms with a designer);
* band share: ``rewards/win_rate_band_frac``, the share of played envs whose unhinted win
  rate lies in [0.4, 0.6], over all iterations;
* regret trend: the least-squares slope of ``rewards/regret_mean`` over iterations (per 10
  iterations);
* designed-level trend: the same slope of ``designer/level_mean``, the mean difficulty level
  (0-4, ``measure.family_of``) of the family programs the designer wrote per iteration, read
  from the run's ``memory.json`` (arms with a designer). Memory merges a re-submitted
  program into one record at its latest iteration, so a repeat counts once, there.

Below that table, ``spade`` minus each other arm in every column: the difference of the
arms' means over seeds and its 95% CI (``contrast``, as for the final checkpoints below).

With ``final_eval_<N>.json`` (``final_eval.py``: each finished run's last checkpoint and
the warm start on N seeds per family and level; the largest N present) a second table gives
held-out and harder-range success of the final weights per arm, mean and 95% CI over seeds,
and each arm's mean change from the warm start; below it, ``spade`` minus each other arm:
the difference of the means and its 95% CI (two-sample Student t with pooled variance,
n1 + n2 - 2 degrees of freedom; the experiment's question is whether regret-driven design
beats the other arms).

With ``final_eval_<N>_levels_<lo>-<hi>.json`` (``final_eval --levels``: the seen
families at the levels the designers write) the same table for their mean success,
``final_levels_table.md`` (README: ``<!-- final_levels -->``).

A third table, ``runs_table.md`` (and the README's ``<!-- runs -->`` block), has one row
per run: its final-checkpoint harder-range success and change from the warm start, its
mean regret, band share and designer valid rate over all iterations, and the mean designed
level over its first and last ``WINDOW`` iterations.

With ``warm_start_eval.json`` (``baseline.py``: the same evaluation of the shared starting
weights) the table gains a ``warm start`` row, its two success columns measured at
iteration 0, and the evaluation plots a dashed line at that level.
"""

from __future__ import annotations

import collections
import glob
import json
import math
import os
import re
import sys

from absl import app
from absl import flags


SERIES = ("designer/valid_rate", "rewards/regret_mean", "rewards/win_rate_band_frac",
          "rewards/win_rate_mean", "agent/reward_nohint", "agent/reward_hint",
          "eval/families/held_out/success", "eval/families/harder/success")
# t_{0.975, df} for small samples; larger df use 1.96.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228}


LEVEL = "designer/level_mean"  # from memory.json (``designed_levels``), not the metrics


def designed_levels(workdir: str) -> list[list]:
  """[[step, mean level]] of the family programs in ``workdir``'s ``memory.json`` per
  iteration (step = iteration + 1, as in the metrics); [] without a memory file."""
  from experiments.mechanism import measure  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "memory.json")
  if not os.path.isfile(path):
    return []
  with open(path) as f:
    records = json.load(f)["records"]
  by_it = collections.defaultdict(list)
  for r in records:
    _, level = measure.family_of(r["program"])
    if level is not None:
      by_it[int(r["iteration"]) + 1].append(level)
  return [[it, sum(v) / len(v)] for it, v in sorted(by_it.items())]


def collect(workdir: str, *, arm: str, seed: int) -> dict:
  """One run's per-iteration series (``SERIES``, and ``LEVEL`` when it has a memory),
  JSON-able."""
  from spade_jax.metrics import read_metrics  # pylint: disable=g-import-not-at-top
  rows = read_metrics(workdir)
  series = {k: [[int(r["step"]), float(r[k])] for r in rows if k in r] for k in SERIES}
  levels = designed_levels(workdir)
  if levels:
    series[LEVEL] = levels
  return {"arm": arm, "seed": seed, "iterations": max((int(r["step"]) for r in rows),
                                                        default=0),
          "series": series}


def _finite(xs) -> list[float]:
  """``xs`` without the Nones and non-finite values (runs without that quantity)."""
  return [x for x in xs if x is not None and math.isfinite(x)]


def mean_ci(xs) -> tuple[float, float, int]:
  """(mean, 95% CI half-width, n) of ``xs`` (half-width NaN for n < 2)."""
  xs = _finite(xs)
  n = len(xs)
  if not n:
    return float("nan"), float("nan"), 0
  m = sum(xs) / n
  if n < 2:
    return m, float("nan"), n
  sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
  return m, _T975.get(n - 1, 1.96) * sd / math.sqrt(n), n


def contrast(a, b) -> tuple[float, float, int]:
  """(mean(a) - mean(b), 95% CI half-width, degrees of freedom) of two independent samples,
  Student t with pooled variance (half-width NaN when either has fewer than two values)."""
  a, b = _finite(a), _finite(b)
  if not a or not b:
    return float("nan"), float("nan"), 0
  ma, mb = sum(a) / len(a), sum(b) / len(b)
  df = len(a) + len(b) - 2
  if len(a) < 2 or len(b) < 2:
    return ma - mb, float("nan"), df
  pooled = (sum((x - ma) ** 2 for x in a) + sum((x - mb) ** 2 for x in b)) / df
  half = _T975.get(df, 1.96) * math.sqrt(pooled * (1 / len(a) + 1 / len(b)))
  return ma - mb, half, df


def slope(points) -> float | None:
  """Least-squares slope of [(x, y)], or None with fewer than two distinct x."""
  if len({p[0] for p in points}) < 2:
    return None
  n = len(points)
  mx = sum(p[0] for p in points) / n
  my = sum(p[1] for p in points) / n
  sxx = sum((p[0] - mx) ** 2 for p in points)
  return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx


def _series_mean(series: dict, key: str) -> float | None:
  """Mean over iterations of ``series[key]`` ([(step, value)]), None without it."""
  pts = series.get(key)
  return sum(v for _, v in pts) / len(pts) if pts else None


def per_run(result: dict) -> dict:
  """The table's quantities for one run (None where the run has no data)."""
  s = result["series"]
  last = lambda k: s[k][-1][1] if s.get(k) else None
  trend = slope(s.get("rewards/regret_mean", []))
  level_trend = slope(s.get(LEVEL, []))
  return {"held_out": last("eval/families/held_out/success"),
          "harder": last("eval/families/harder/success"),
          "valid_rate": _series_mean(s, "designer/valid_rate"),
          "band_share": _series_mean(s, "rewards/win_rate_band_frac"),
          "regret_trend": None if trend is None else 10 * trend,
          "level_trend": None if level_trend is None else 10 * level_trend,
          "iterations": result["iterations"]}


COLUMNS = (("held_out", "held-out success"), ("harder", "harder-range success"),
           ("valid_rate", "designer valid rate"), ("band_share", "envs in [0.4, 0.6]"),
           ("regret_trend", "regret trend / 10 it"),
           ("level_trend", "designed level trend / 10 it"))


def summarize(results: list[dict]) -> dict:
  """Arm -> column -> {mean, ci95, n}, plus the seeds and iterations run."""
  by_arm = collections.defaultdict(list)
  for r in results:
    by_arm[r["arm"]].append(r)
  out = {}
  for arm, rs in sorted(by_arm.items()):
    runs = [per_run(r) for r in rs]
    out[arm] = {"seeds": sorted(r["seed"] for r in rs),
                "iterations": [p["iterations"] for p in runs]}
    for key, _ in COLUMNS:
      m, ci, n = mean_ci([p[key] for p in runs])
      out[arm][key] = {"mean": m, "ci95": ci, "n": n}
  return out


def primary_minus(by_arm: dict[str, list[dict]], keys) -> dict:
  """Arm -> key -> {diff, ci95, df}: ``PRIMARY``'s values minus the arm's (``contrast``);
  ``by_arm``: arm -> one {key: value} per run; {} without a ``PRIMARY`` run."""
  if PRIMARY not in by_arm:
    return {}
  values = lambda arm, k: [v.get(k) for v in by_arm[arm]]
  return {arm: {k: dict(zip(("diff", "ci95", "df"), contrast(values(PRIMARY, k),
                                                             values(arm, k)))) for k in keys}
          for arm in sorted(by_arm) if arm != PRIMARY}


def arm_contrasts(results: list[dict]) -> dict:
  """``primary_minus`` for every column of the per-arm table, on the runs' ``per_run``."""
  runs = collections.defaultdict(list)
  for r in results:
    runs[r["arm"]].append(per_run(r))
  return primary_minus(runs, [k for k, _ in COLUMNS])


def contrast_table(contrasts: dict, columns=None) -> str:
  """``arm_contrasts`` (or ``final_summary``'s) as a markdown table: one row per arm,
  ``PRIMARY`` minus it in each of ``columns`` ([(key, title)], default ``COLUMNS``)."""
  columns = COLUMNS if columns is None else columns
  lines = [f"| {PRIMARY} minus | " + " | ".join(t for _, t in columns) + " |",
           "|" + "---|" * (1 + len(columns))]
  for arm, c in contrasts.items():
    lines.append(f"| {arm} | " + " | ".join(
        _fmt(c[k]["diff"], c[k]["ci95"], "+") for k, _ in columns) + " |")
  return "\n".join(lines) + "\n"


def _fmt(value: float, ci95: float, sign: str = "") -> str:
  """A table cell: value ± 95% CI half-width, the value alone without a CI, n/a without a
  value (``sign="+"``: signed, for differences)."""
  if math.isnan(value):
    return "n/a"
  return f"{value:{sign}.3f}" + ("" if math.isnan(ci95) else f" ± {ci95:.3f}")


def _cell(c: dict) -> str:
  """A ``mean_ci`` cell (n = 0 has a NaN mean: n/a)."""
  return _fmt(c["mean"], c["ci95"])


def baseline_row(base: dict) -> dict:
  """The warm start's row: its iteration-0 evaluation in the success columns."""
  ev = base["eval"]
  cell = lambda k: ({"mean": ev[k], "ci95": float("nan"), "n": 1} if k in ev
                    else {"mean": float("nan"), "ci95": float("nan"), "n": 0})
  row = {key: {"mean": float("nan"), "ci95": float("nan"), "n": 0} for key, _ in COLUMNS}
  row.update(seeds=[], iterations=[0], held_out=cell("eval/families/held_out/success"),
             harder=cell("eval/families/harder/success"))
  return row


def table(summary: dict, base_row: dict | None = None) -> str:
  """The summary as a markdown table (with ``base_row``: the warm start's row first)."""
  head = "| arm | seeds | iterations | " + " | ".join(t for _, t in COLUMNS) + " |"
  lines = [head, "|" + "---|" * (len(COLUMNS) + 3)]
  if base_row is not None:
    lines.append("| warm start (no self-play) | - | 0 | "
                 + " | ".join(_cell(base_row[k]) for k, _ in COLUMNS) + " |")
  for arm, row in summary.items():
    lines.append(f"| {arm} | {len(row['seeds'])} | {min(row['iterations'])}"
                 f"-{max(row['iterations'])} | "
                 + " | ".join(_cell(row[k]) for k, _ in COLUMNS) + " |")
  return "\n".join(lines) + "\n"


PRIMARY = "spade"  # the arm the others are compared with
FINAL = (("eval/families/held_out/success", "held-out"),
         ("eval/families/harder/success", "harder-range"))


def final_summary(final: dict, metrics=FINAL) -> dict:
  """Arm -> {seeds, step, per metric: mean/ci95/n over seeds and the change from the warm
  start}, plus the warm start's own scores, from a ``final_eval_<N>.json``; ``metrics``:
  [(score key, title)]."""
  by_arm = collections.defaultdict(list)
  for r in final["runs"].values():
    by_arm[r["arm"]].append(r)
  out = {"limit": final["limit"],
         "warm start": {k: final.get("eval", {}).get(k) for k, _ in metrics}, "arms": {},
         "contrasts": primary_minus({a: [r["eval"] for r in rs] for a, rs in by_arm.items()},
                                    [k for k, _ in metrics])}
  for arm, rs in sorted(by_arm.items()):
    row = {"seeds": sorted(r["seed"] for r in rs), "steps": sorted({r["step"] for r in rs})}
    for k, _ in metrics:
      m, ci, n = mean_ci([r["eval"].get(k) for r in rs])
      base = out["warm start"][k]
      row[k] = {"mean": m, "ci95": ci, "n": n,
                "change": None if base is None or not n else m - base}
    out["arms"][arm] = row
  return out


def final_table(fs: dict, metrics=FINAL) -> str:
  """``final_summary`` as a markdown table."""
  cells = lambda v: "n/a" if v is None else f"{v:.3f}"
  head = ("| arm | seeds | step | " + " | ".join(
      f"{t} success | {t} change" for _, t in metrics) + " |")
  lines = [head, "|" + "---|" * (3 + 2 * len(metrics))]
  lines.append("| warm start | - | 0 | " + " | ".join(
      f"{cells(fs['warm start'][k])} | -" for k, _ in metrics) + " |")
  for arm, row in fs["arms"].items():
    steps = "/".join(map(str, row["steps"]))
    lines.append(f"| {arm} | {len(row['seeds'])} | {steps} | " + " | ".join(
        f"{_cell(row[k])} | " + ("n/a" if row[k]["change"] is None
                               else f"{row[k]['change']:+.3f}") for k, _ in metrics) + " |")
  text = "\n".join(lines) + "\n"
  if fs.get("contrasts"):
    text += "\n" + contrast_table(fs["contrasts"], [(k, f"{t} difference") for k, t in metrics])
  return text


WINDOW = 10  # iterations averaged at each end of a run in the per-run table


def _window(points, first: bool) -> float | None:
  """Mean of the first (or last) ``WINDOW`` iterations' values of [(step, value)]."""
  pts = sorted(points)
  pts = pts[:WINDOW] if first else pts[-WINDOW:]
  return sum(v for _, v in pts) / len(pts) if pts else None


def run_rows(results: list[dict], final: dict | None = None) -> list[dict]:
  """One row per run (sorted by arm, then seed): the numbers the README's reading cites,
  so that none of them is typed in. ``final``: a ``final_eval_<N>.json``, whose success
  on the harder range (and change from its warm start) each run gets where it was
  evaluated."""
  runs = (final or {}).get("runs", {})
  base = (final or {}).get("eval", {}).get("eval/families/harder/success")
  rows = []
  for r in sorted(results, key=lambda r: (r["arm"], r["seed"])):
    s = r["series"]
    fe = runs.get(f"{r['arm']}-{r['seed']}", {}).get("eval", {})
    harder = fe.get("eval/families/harder/success")
    rows.append({"run": f"{r['arm']}-{r['seed']}", "iterations": r["iterations"],
                 "final_harder": harder,
                 "final_change": None if harder is None or base is None else harder - base,
                 "regret_mean": _series_mean(s, "rewards/regret_mean"),
                 "win_rate": _series_mean(s, "rewards/win_rate_mean"),
                 "band_share": _series_mean(s, "rewards/win_rate_band_frac"),
                 "valid_rate": _series_mean(s, "designer/valid_rate"),
                 "level_first": _window(s.get(LEVEL, []), True),
                 "level_last": _window(s.get(LEVEL, []), False)})
  return rows


def runs_table(rows: list[dict], limit: int | None = None) -> str:
  """``run_rows`` as a markdown table."""
  num = lambda v, sign="": "n/a" if v is None else f"{v:{sign}.3f}"
  lvl = lambda v: "n/a" if v is None else f"{v:.2f}"
  seeds = f" ({limit} seeds)" if limit else ""
  lines = [f"| run | iterations | final harder-range success{seeds} | change from warm start "
           f"| regret mean | unhinted win rate | envs in [0.4, 0.6] | designer valid rate "
           f"| designed level, first {WINDOW} it | designed level, last {WINDOW} it |",
           "|" + "---|" * 10]
  for r in rows:
    lines.append(f"| {r['run']} | {r['iterations']} | {num(r['final_harder'])} | "
                 f"{num(r['final_change'], '+')} | {num(r['regret_mean'], '+')} | "
                 f"{num(r['win_rate'])} | {num(r['band_share'])} | {num(r['valid_rate'])} | "
                 f"{lvl(r['level_first'])} | {lvl(r['level_last'])} |")
  return "\n".join(lines) + "\n"


def _final_files(results_dir: str) -> dict:
  """Level range ((lo, hi), or None for the suite's own items) -> the path of its
  ``final_eval_<N>[_levels_<lo>-<hi>].json`` with the largest N under ``results_dir``."""
  best = {}
  for path in glob.glob(os.path.join(results_dir, "final_eval_*.json")):
    m = re.fullmatch(r"final_eval_(\d+)(?:_levels_(\d)-(\d))?\.json", os.path.basename(path))
    if m:
      key = (int(m.group(2)), int(m.group(3))) if m.group(2) else None
      best[key] = max(best.get(key, (0, "")), (int(m.group(1)), path))
  return {key: path for key, (_, path) in best.items()}


def _read(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def load_final(results_dir: str) -> dict | None:
  """The ``final_eval_<N>.json`` with the largest N under ``results_dir``, or None."""
  path = _final_files(results_dir).get(None)
  return _read(path) if path else None


def load_final_levels(results_dir: str) -> list[dict]:
  """Every ``final_eval_<N>_levels_<lo>-<hi>.json`` (``final_eval --levels``) under
  ``results_dir``, by level range; of several N for one range, the largest."""
  files = _final_files(results_dir)
  return [_read(files[key]) for key in sorted(k for k in files if k is not None)]


def levels_metrics(final: dict) -> list[tuple[str, str]]:
  """The one metric of a ``final_eval --levels`` file: the seen families' mean success."""
  from experiments.mechanism import final_eval  # pylint: disable=g-import-not-at-top
  lo, hi = final["levels"]
  return [(final_eval.SEEN_LEVELS, f"levels {lo}-{hi}" if hi > lo else f"level {lo}")]


def plots(results: list[dict], out_dir: str, base: dict | None = None) -> list[str]:
  """Per series, each arm's mean over seeds against iteration (one PNG per series; with
  ``base``, the warm start's evaluation as a dashed line)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  paths = []
  for key in SERIES + (LEVEL,):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    drawn = False
    for arm in sorted({r["arm"] for r in results}):
      pts = collections.defaultdict(list)
      for r in results:
        if r["arm"] == arm:
          for it, v in r["series"].get(key, []):
            pts[it].append(v)
      if pts:
        xs = sorted(pts)
        ax.plot(xs, [sum(pts[x]) / len(pts[x]) for x in xs], marker="o", markersize=3,
                label=arm)
        drawn = True
    if not drawn:
      plt.close(fig)
      continue
    if base is not None and key in base["eval"]:
      ax.axhline(base["eval"][key], color="black", linestyle="--", linewidth=1,
                 label="warm start")
    ax.set_title(key + " (mean over seeds)")
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, key.replace("/", "_") + ".png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
  return paths


def load(results_dir: str) -> list[dict]:
  """Every ``<arm>-<seed>.json`` under ``results_dir`` (smoke results excluded)."""
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  out = []
  run_file = re.compile(r"(%s)-\d+\.json" % "|".join(map(re.escape, common.ARMS)))
  for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
    if not run_file.fullmatch(os.path.basename(path)):  # warm start, diagnose, summary
      continue
    with open(path) as f:
      out.append(json.load(f))
  return out


def load_baseline(results_dir: str) -> dict | None:
  """``warm_start_eval.json`` (``baseline.py``) under ``results_dir``, or None."""
  path = os.path.join(results_dir, "warm_start_eval.json")
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def write_readme_table(readme: str, text: str, marker: str = "table") -> bool:
  """Replaces what lies between ``<!-- table -->`` and ``<!-- /table -->`` (``marker``) in
  ``readme``."""
  if not os.path.isfile(readme):
    return False
  doc = open(readme).read()
  a, b = f"<!-- {marker} -->", f"<!-- /{marker} -->"
  if a not in doc or b not in doc:
    return False
  new = doc[:doc.index(a) + len(a)] + "\n" + text + doc[doc.index(b):]
  with open(readme, "w") as f:
    f.write(new)
  return True


def report(results_dir: str, readme: str | None = None) -> dict:
  """Writes summary.json, table.md, the plots and the README table; returns the summary."""
  results = load(results_dir)
  if not results:
    raise FileNotFoundError(f"No <arm>-<seed>.json under {results_dir}; run "
                            "`python -m experiments.mechanism.run --arm=... --seed=...` first.")
  starts = collections.defaultdict(list)  # weights digest -> runs (older files lack it)
  for r in results:
    if r.get("warm_start"):
      starts[r["warm_start"]["sha256"]].append(f"{r['arm']}-{r['seed']}")
  if len(starts) > 1:
    raise ValueError("the runs under " + results_dir + " began from different warm starts, "
                     "so the arms are not comparable: " + "; ".join(
                         f"{d[:12]}: {', '.join(runs)}" for d, runs in starts.items()) +
                     ". Rerun the odd ones from the same --warm_start or move them aside.")
  base, final = load_baseline(results_dir), load_final(results_dir)
  by_levels = load_final_levels(results_dir)
  for rec, name, fix in ((base, "warm_start_eval.json", "rerun `python -m "
                          "experiments.mechanism.baseline` or move it aside"),
                         (final, "final_eval_<N>.json", "move it aside")) + tuple(
                             (f, "final_eval_<N>_levels_<lo>-<hi>.json", "move it aside")
                             for f in by_levels):
    if rec is not None and starts and rec["warm_start"]["sha256"] not in starts:
      raise ValueError(f"{results_dir}: {name} evaluated other weights "
                       f"({rec['warm_start']['sha256'][:12]}) than the runs began from "
                       f"(another warm start); {fix}.")
  summary = summarize(results)
  base_row = baseline_row(base) if base is not None else None
  text = table(summary, base_row)
  contrasts = arm_contrasts(results)
  if contrasts:
    text += "\n" + contrast_table(contrasts)
  with open(os.path.join(results_dir, "table.md"), "w") as f:
    f.write(text)
  if base_row is not None:
    summary["warm start"] = base_row
  summary["contrasts"] = contrasts
  if final is not None:
    summary["final"] = final_summary(final)
    with open(os.path.join(results_dir, "final_table.md"), "w") as f:
      f.write(final_table(summary["final"]))
  levels_text = ""
  for f in by_levels:
    m = levels_metrics(f)
    fs = final_summary(f, m)
    summary.setdefault("final_levels", {})[m[0][1]] = fs
    levels_text += ("\n" if levels_text else "") + final_table(fs, m)
  if levels_text:
    with open(os.path.join(results_dir, "final_levels_table.md"), "w") as f:
      f.write(levels_text)
  summary["runs"] = run_rows(results, final)
  runs_text = runs_table(summary["runs"], final and final["limit"])
  with open(os.path.join(results_dir, "runs_table.md"), "w") as f:
    f.write(runs_text)
  with open(os.path.join(results_dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  plots(results, results_dir, base)
  if readme:
    write_readme_table(readme, text)
    write_readme_table(readme, runs_text, "runs")
    if final is not None:
      write_readme_table(readme, final_table(summary["final"]), "final")
    if levels_text:
      write_readme_table(readme, levels_text, "final_levels")
  return summary


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  results_dir = _RESULTS.value or common.RESULTS
  readme = os.path.join(common.HERE, "README.md") if not _RESULTS.value else None
  try:
    report(results_dir, readme)
  except (FileNotFoundError, ValueError) as e:  # no runs, or runs that are not comparable
    sys.exit(f"report: {e}")
  print(open(os.path.join(results_dir, "table.md")).read())


def _define_flags() -> None:
  """The command line's flags (defined only when run as a program)."""
  global _RESULTS
  _RESULTS = flags.DEFINE_string("results", "", "Results directory (default results/).")


if __name__ == "__main__":
  _define_flags()
  sys.exit(app.run(main))
