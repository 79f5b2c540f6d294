"""One metrics path: JSON lines + TensorBoard through clu, with a NaN guard.

Scalars go to ``<workdir>/metrics.jsonl`` and TensorBoard, per-item records (one row per
designer sample, say) to ``<workdir>/<name>.jsonl``. Every row carries its step, and a
writer opened to resume at step ``s`` first drops rows past ``s`` that an interrupted run
wrote after its last checkpoint, so a resumed run's files equal an uninterrupted run's.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from etils import epath
import jax
import numpy as np


# JAX's compile phases (tracing, lowering, the backend's compile or cache load), timed
# by jax.monitoring; `compile_seconds` sums them for this process.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
_compile_total = [0.0, False]  # seconds so far, listener registered


def _on_duration(event: str, duration: float, **_) -> None:
  if event in COMPILE_EVENTS:
    _compile_total[0] += duration


def compile_seconds() -> float:
  """Seconds this process has spent compiling JAX programs since the first call (a
  stage reads it before and after, e.g. `time/train_compile`, so one-time compiles
  are told apart from the steady cost of a step)."""
  if not _compile_total[1]:
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    _compile_total[1] = True
  return _compile_total[0]


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
    self._workdir = epath.Path(workdir)
    self._tb = None
    if self._primary:
      self._workdir.mkdir(parents=True, exist_ok=True)
      if resume_step is not None:
        for path in self._workdir.glob("*.jsonl"):
          _drop_after(path, resume_step)
      if tensorboard:
        from clu import metric_writers  # pylint: disable=g-import-not-at-top
        self._tb = metric_writers.SummaryWriter(str(self._workdir / "tensorboard"))

  def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
    """Writes the scalar entries of `metrics`; raises on NaN/inf naming the key and step."""
    scalars = _scalars(metrics)
    bad = sorted(k for k, v in scalars.items() if not math.isfinite(v))
    if bad:
      raise NonFiniteMetricError(f"Non-finite metrics at step {step}: "
                                 + ", ".join(f"{k}={scalars[k]}" for k in bad))
    if self._primary:
      _append(self._workdir / "metrics.jsonl",
              [json.dumps({"step": int(step), **scalars}, sort_keys=True)])
      if self._tb is not None:
        self._tb.write_scalars(int(step), scalars)
        self._tb.flush()
    return scalars

  def write_records(self, name: str, step: int, records: list[dict[str, Any]]) -> None:
    """Appends per-item records to ``<workdir>/<name>.jsonl``, each tagged with ``step``."""
    if not self._primary or not records:
      return
    _append(self._workdir / f"{name}.jsonl",
            [json.dumps({"step": int(step), **r}, sort_keys=True) for r in records])

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def _append(path: epath.Path, lines: list[str]) -> None:
  """Appends lines; object stores (gs://) cannot append, so there the file is rewritten."""
  text = "".join(line + "\n" for line in lines)
  if "://" in str(path):
    old = path.read_text() if path.exists() else ""
    path.write_text(old + text)
    return
  with path.open("a", encoding="utf-8") as f:
    f.write(text)


def _drop_after(path: epath.Path, step: int) -> None:
  """Rewrites a JSON-lines file without its rows past ``step`` (atomically where local)."""
  lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
  keep = [ln for ln in lines if json.loads(ln).get("step", 0) <= step]
  if len(keep) == len(lines):
    return
  tmp = path.parent / (path.name + ".tmp")
  tmp.write_text("".join(ln + "\n" for ln in keep))
  tmp.replace(path)


def read_metrics(workdir: str, name: str = "metrics") -> list[dict[str, Any]]:
  """All rows of ``<workdir>/<name>.jsonl`` (empty when absent)."""
  path = epath.Path(workdir) / f"{name}.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
