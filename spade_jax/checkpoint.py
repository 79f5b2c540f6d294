"""Atomic, resumable checkpoints with orbax.

A checkpoint holds the train state (params, optimizer, step), the regret
buffer (arrays) and a JSON document of host state (iteration, corpus position,
env slots, designer samples awaiting credit, environment memory). orbax writes
each step to a temporary directory and renames it when complete, so a crash
mid-save leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

from typing import Any

from absl import logging
from etils import epath
import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves and restores (state, buffer, host) under `<workdir>/checkpoints` (local or gs://)."""

  def __init__(self, workdir: str, keep: int = 3):
    self.directory = epath.Path(workdir) / "checkpoints"
    self._mgr = ocp.CheckpointManager(
        self.directory,
        item_names=("state", "buffer", "host"),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def latest_step(self) -> int | None:
    return self._mgr.latest_step()

  def save(self, step: int, state: Any, buffer: Any, host: dict[str, Any]) -> None:
    self._mgr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        buffer=ocp.args.StandardSave(buffer),
        host=ocp.args.JsonSave(host)))
    self._mgr.wait_until_finished()

  def restore(self, abstract_state: Any, abstract_buffer: Any,
              step: int | None = None) -> tuple[Any, Any, dict[str, Any]] | None:
    """Restores the given (or latest) step into the shardings of the abstract trees.

    Returns None when the directory holds no checkpoint.
    """
    step = self._mgr.latest_step() if step is None else step
    if step is None:
      return None
    logging.info("Restoring checkpoint step %d from %s", step, self.directory)
    as_restore = lambda tree: jax.tree.map(
        lambda x: ocp.utils.to_shape_dtype_struct(x) if hasattr(x, "shape") else x, tree)
    out = self._mgr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(as_restore(abstract_state)),
        buffer=ocp.args.StandardRestore(as_restore(abstract_buffer)),
        host=ocp.args.JsonRestore()))
    return out["state"], out["buffer"], dict(out["host"])

  def restore_state(self, abstract_state: Any, step: int | None = None) -> Any:
    """Restores only the train state of the given (or latest) step (e.g. for export)."""
    step = self._mgr.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No checkpoint under {self.directory}; train first or pass "
                              "the workdir of a run that saved one.")
    if step not in self._mgr.all_steps():
      raise FileNotFoundError(f"No checkpoint step {step} under {self.directory}; saved "
                              f"steps: {sorted(self._mgr.all_steps())}.")
    as_restore = lambda tree: jax.tree.map(
        lambda x: ocp.utils.to_shape_dtype_struct(x) if hasattr(x, "shape") else x, tree)
    out = self._mgr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(as_restore(abstract_state))))
    return out["state"]

  def close(self) -> None:
    self._mgr.close()
