"""One metrics path: JSON lines + TensorBoard through clu, with a NaN guard.

Scalars go to ``<workdir>/metrics.jsonl`` and TensorBoard, per-item records (one row per
designer sample, say) to ``<workdir>/<name>.jsonl``. Every row carries its step, and a
writer opened to resume at step ``s`` first drops rows past ``s`` that an interrupted run
wrote after its last checkpoint, so a resumed run's files equal an uninterrupted run's.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

import jax
import numpy as np


class NonFiniteMetricError(FloatingPointError):
  """A scalar metric was NaN or infinite."""


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
  out = {}
  for k, v in metrics.items():
    a = np.asarray(jax.device_get(v))
    if a.ndim == 0 and np.issubdtype(a.dtype, np.number):
      out[k] = float(a)
  return out


class MetricsWriter:
  """Writes scalar metrics to `<workdir>/metrics.jsonl` and TensorBoard.

  Only process 0 writes files; other hosts only check values.
  """

  def __init__(self, workdir: str, tensorboard: bool = True, resume_step: int | None = None):
    self._primary = jax.process_index() == 0
    self._workdir = workdir
    self._path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if self._primary:
      os.makedirs(workdir, exist_ok=True)
      if resume_step is not None:
        for name in os.listdir(workdir):
          if name.endswith(".jsonl"):
            _drop_after(os.path.join(workdir, name), resume_step)
      if tensorboard:
        from clu import metric_writers  # pylint: disable=g-import-not-at-top
        self._tb = metric_writers.SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
    """Writes the scalar entries of `metrics`; raises on NaN/inf naming the key and step."""
    scalars = _scalars(metrics)
    bad = sorted(k for k, v in scalars.items() if not math.isfinite(v))
    if bad:
      raise NonFiniteMetricError(f"Non-finite metrics at step {step}: "
                                 + ", ".join(f"{k}={scalars[k]}" for k in bad))
    if self._primary:
      with open(self._path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": int(step), **scalars}, sort_keys=True) + "\n")
      if self._tb is not None:
        self._tb.write_scalars(int(step), scalars)
        self._tb.flush()
    return scalars

  def write_records(self, name: str, step: int, records: list[dict[str, Any]]) -> None:
    """Appends per-item records to ``<workdir>/<name>.jsonl``, each tagged with ``step``."""
    if not self._primary or not records:
      return
    with open(os.path.join(self._workdir, f"{name}.jsonl"), "a", encoding="utf-8") as f:
      for r in records:
        f.write(json.dumps({"step": int(step), **r}, sort_keys=True) + "\n")

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def _drop_after(path: str, step: int) -> None:
  """Rewrites a JSON-lines file without its rows past ``step`` (atomically)."""
  with open(path, encoding="utf-8") as f:
    lines = [ln for ln in f if ln.strip()]
  keep = [ln for ln in lines if json.loads(ln).get("step", 0) <= step]
  if len(keep) == len(lines):
    return
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.writelines(keep)
  os.replace(tmp, path)


def read_metrics(workdir: str, name: str = "metrics") -> list[dict[str, Any]]:
  """All rows of ``<workdir>/<name>.jsonl`` (empty when absent)."""
  path = os.path.join(workdir, f"{name}.jsonl")
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]
