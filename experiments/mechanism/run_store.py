"""Arm runs stored as they go, so a run longer than one sitting goes on from any checkout.

``python -m experiments.mechanism.run --publish`` copies every run under the cache's
``runs/`` that has not finished to ``stored_runs/<arm>-<seed>/`` (committed with the
project): its latest checkpoint (the train state with AdamW's moments cast to bfloat16, the regret
buffer, the host state), its metrics and designer records, its environment memory, and a
``run.json`` naming the arm, seed, iteration, the warm start's SHA-256 and the run's
config. ``run`` on a checkout whose run directory is empty takes the stored copy and
resumes from its iteration; a copy made from another warm start or another config is
refused, naming what differs. A finished run's copy is removed when it is published again:
its results JSON holds what the report reads.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from experiments.mechanism import common

RUN_JSON = "run.json"
FILES = "files"           # the run directory's records (metrics, samples, memory)
CHECKPOINTS = "checkpoints"
# Config keys that name paths of the checkout they ran on (the warm start is checked by
# its digest instead).
PATH_KEYS = ("model.init_from", "static_pool.path")


def flat_config(cfg) -> dict:
  """The run config as the run directory's ``config.json`` holds it, less ``PATH_KEYS``."""
  from spade_jax.selfplay import loop  # pylint: disable=g-import-not-at-top
  flat = loop._flat(json.loads(json.dumps(cfg.to_dict(), default=str)))  # pylint: disable=protected-access
  return {k: v for k, v in sorted(flat.items()) if k not in PATH_KEYS}


def read(stored: str) -> dict | None:
  """The ``run.json`` of a stored run, or None when ``stored`` holds none."""
  path = os.path.join(stored, RUN_JSON)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def latest(workdir: str) -> int | None:
  """The iteration of the run directory's latest checkpoint (None: none yet)."""
  from spade_jax.checkpoint import Checkpointer  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(os.path.join(workdir, CHECKPOINTS)):
    return None
  ckpt = Checkpointer(workdir)
  step = ckpt.latest_step()
  ckpt.close()
  return step


def _manager(path: str, create: bool = False):
  """A checkpoint manager of the run's three items that can read their metadata."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  return ocp.CheckpointManager(path, item_handlers={
      "state": ocp.StandardCheckpointHandler(), "buffer": ocp.StandardCheckpointHandler(),
      "host": ocp.JsonCheckpointHandler()},
      options=ocp.CheckpointManagerOptions(create=create))


def metadata(path: str, step: int) -> dict:
  """The shapes and dtypes of checkpoint ``step`` under ``path``: {item: tree}."""
  mgr = _manager(path)
  meta = mgr.item_metadata(step)
  mgr.close()
  return {k: getattr(meta[k], "tree", meta[k]) for k in ("state", "buffer")}


def _compact_checkpoint(src: str, dst: str, step: int) -> None:
  """Writes ``src``'s checkpoint ``step`` to a new checkpoint directory ``dst`` with the
  optimizer state's floating arrays in bfloat16 (the weights stay as they are). The run
  restores it into its own float32 state: orbax casts to the target's dtypes."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  meta = metadata(src, step)
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = lambda m: jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), m)
  mgr = _manager(src)
  out = mgr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(target(meta["state"])),
      buffer=ocp.args.StandardRestore(target(meta["buffer"])),
      host=ocp.args.JsonRestore()))
  mgr.close()
  state = dict(out["state"])
  state["opt_state"] = jax.tree.map(
      lambda a: a.astype(jnp.bfloat16) if jnp.issubdtype(a.dtype, jnp.floating) else a,
      state["opt_state"])
  new = _manager(dst, create=True)
  new.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), buffer=ocp.args.StandardSave(out["buffer"]),
      host=ocp.args.JsonSave(dict(out["host"]))))
  new.wait_until_finished()
  new.close()


def publish(workdir: str, stored: str, *, arm: str, seed: int, cfg, warm_start_sha256: str,
            finished: bool) -> str | None:
  """Stores the run in ``workdir`` at its latest checkpoint in ``stored`` (replacing an
  older copy), or, when ``finished``, removes ``stored``. Returns ``stored`` when a copy is
  there afterwards, else None. A run without a checkpoint stores nothing."""
  if finished:
    if os.path.isdir(stored):
      shutil.rmtree(stored)
    return None
  step = latest(workdir)
  if step is None:
    return stored if read(stored) else None
  held = read(stored)
  if held is not None and held["iteration"] >= step:
    return stored  # already as far or further
  parent = os.path.dirname(os.path.abspath(stored))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".run.", dir=parent)
  _compact_checkpoint(os.path.join(workdir, CHECKPOINTS), os.path.join(tmp, CHECKPOINTS),
                      step)
  os.makedirs(os.path.join(tmp, FILES))
  for n in sorted(os.listdir(workdir)):
    if (n.endswith(".jsonl") or n == "memory.json") and os.path.isfile(
        os.path.join(workdir, n)):
      shutil.copyfile(os.path.join(workdir, n), os.path.join(tmp, FILES, n))
  meta = {"arm": arm, "seed": seed, "iteration": step, "iterations": int(cfg.iterations),
          "warm_start_sha256": warm_start_sha256, "config": flat_config(cfg)}
  with open(os.path.join(tmp, RUN_JSON), "w") as f:
    json.dump(meta, f, indent=1)
  common.swap_in(tmp, stored)
  return stored


def seed(workdir: str, stored: str, *, cfg, warm_start_sha256: str) -> int | None:
  """Fills the empty run directory ``workdir`` from the stored run ``stored`` (if any) and
  returns the iteration it resumes at; None when there is nothing to take or ``workdir``
  already holds a checkpoint. A copy begun from another warm start or with another config
  raises, naming what differs."""
  held = read(stored)
  if held is None or latest(workdir) is not None:
    return None
  if held["warm_start_sha256"] != warm_start_sha256:
    raise ValueError(
        f"{stored} was run from a warm start with SHA-256 {held['warm_start_sha256'][:12]}..., "
        f"not this checkout's ({warm_start_sha256[:12]}...). Rebuild the warm start from the "
        f"stored stages, or remove {stored} to start the run afresh.")
  from spade_jax.selfplay.build import RESUMABLE_CHANGES  # pylint: disable=g-import-not-at-top
  now = flat_config(cfg)
  differ = sorted(k for k in set(now) | set(held["config"]) if k not in RESUMABLE_CHANGES
                  and now.get(k, "<unset>") != held["config"].get(k, "<unset>"))
  if differ:
    raise ValueError(f"{stored} ran with another config (differing: {differ[:12]}); resume "
                     f"it with that config, or remove {stored} to start the run afresh.")
  os.makedirs(workdir, exist_ok=True)
  for n in sorted(os.listdir(os.path.join(stored, FILES))):
    shutil.copyfile(os.path.join(stored, FILES, n), os.path.join(workdir, n))
  tmp = tempfile.mkdtemp(prefix=".checkpoints.", dir=workdir)
  shutil.copytree(os.path.join(stored, CHECKPOINTS), tmp, dirs_exist_ok=True)
  common.swap_in(tmp, os.path.join(workdir, CHECKPOINTS))
  return int(held["iteration"])


__all__ = ["flat_config", "latest", "metadata", "publish", "read", "seed"]
