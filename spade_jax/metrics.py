"""One metrics path: JSON lines + TensorBoard through clu, with a NaN guard."""

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

  def __init__(self, workdir: str, tensorboard: bool = True):
    self._primary = jax.process_index() == 0
    self._path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if self._primary:
      os.makedirs(workdir, exist_ok=True)
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

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str) -> list[dict[str, float]]:
  """All rows of `<workdir>/metrics.jsonl` (empty when absent)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]
