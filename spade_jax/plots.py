"""Plots of a run's metrics (matplotlib, no display needed).

:func:`plot_run` reads ``metrics.jsonl`` and ``designer_samples.jsonl`` of a workdir and
writes one PNG per figure: designer valid rate and rejections by reason, regret, hinted vs
unhinted reward, designer reward per skill, loss, KL and clip fractions (with the TIS weight).
Used by ``python -m launch.plot`` and the Colab notebook.
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

from etils import epath

from spade_jax.metrics import read_metrics


def _series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
  pts = [(r["step"], r[key]) for r in rows if key in r]
  return [p[0] for p in pts], [p[1] for p in pts]


def _figure(path: epath.Path, title: str, lines: dict[str, tuple[list, list]], ylabel: str):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6, 3.5))
  for label, (x, y) in lines.items():
    if x:
      ax.plot(x, y, marker="o", markersize=3, label=label)
  ax.set_title(title)
  ax.set_xlabel("iteration")
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  if any(x for x, _ in lines.values()):
    ax.legend(fontsize=7)
  fig.tight_layout()
  with path.open("wb") as f:
    fig.savefig(f, format="png", dpi=100)
  plt.close(fig)
  return path


def plot_run(workdir: str, out: str | None = None) -> list[str]:
  """Writes the run's figures; returns their paths.

  Args:
    workdir: a training workdir.
    out: output directory (default ``<workdir>/plots``).

  Returns:
    The PNG paths written.
  """
  rows = read_metrics(workdir)
  if not rows:
    raise FileNotFoundError(f"No metrics in {workdir!r}: expected <workdir>/metrics.jsonl "
                            "written by `python -m launch.train --workdir=...`.")
  samples = read_metrics(workdir, "designer_samples")
  out_dir = epath.Path(out) if out else epath.Path(workdir) / "plots"
  out_dir.mkdir(parents=True, exist_ok=True)
  reasons = sorted({k for r in rows for k in r if k.startswith("designer/rejected/")
                    and any(x.get(k) for x in rows)})
  by_skill: dict[str, dict[int, list[float]]] = collections.defaultdict(
      lambda: collections.defaultdict(list))
  for s in samples:
    if s.get("reward") is not None:
      by_skill[s.get("skill") or "(pool)"][s["step"]].append(s["reward"])
  skill_lines = {k: (sorted(v), [sum(v[i]) / len(v[i]) for i in sorted(v)])
                 for k, v in sorted(by_skill.items())}
  figures = [
      ("designer_valid.png", "designer samples: valid rate and rejections",
       {"valid rate": _series(rows, "designer/valid_rate"),
        **{k.rsplit("/", 1)[1]: _series(rows, k) for k in reasons}}, "fraction / count"),
      ("regret.png", "regret (Rh - Rn0) and window win rate",
       {"regret": _series(rows, "rewards/regret_mean"),
        "win rate": _series(rows, "rewards/win_rate_mean")}, "mean over envs"),
      ("reward.png", "agent reward: hinted vs unhinted",
       {"unhinted": _series(rows, "agent/reward_nohint"),
        "hinted": _series(rows, "agent/reward_hint")}, "mean episode reward"),
      ("reward_by_skill.png", "designer reward per skill", skill_lines, "mean reward"),
      ("loss.png", "GRPO loss", {"loss": _series(rows, "train/loss")}, "loss"),
      ("kl.png", "KL to the reference policy", {"kl": _series(rows, "train/kl")}, "k3"),
      ("clip.png", "clip fractions and truncated-IS weight",
       {"clip low": _series(rows, "train/clip_frac_low"),
        "clip high": _series(rows, "train/clip_frac_high"),
        "TIS weight (mean)": _series(rows, "train/tis_weight_mean")}, "fraction / weight"),
  ]
  return [str(_figure(out_dir / name, title, lines, ylabel))
          for name, title, lines, ylabel in figures]


__all__ = ["plot_run"]
