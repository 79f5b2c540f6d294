"""Reading a finished (or running) training workdir: its config and its weights.

A run writes its config to ``<workdir>/config.json`` (flattened keys) and its state to
``<workdir>/checkpoints``; :func:`load_run` turns them back into the resolved config, the
vocabulary and the parameters of a checkpoint step, for export and evaluation.
"""

from __future__ import annotations

import json
from typing import Any

from etils import epath
import jax

from spade_jax import parallel, rl
from spade_jax.checkpoint import Checkpointer
from spade_jax.selfplay.build import RunConfig, load_vocab, resolve


def saved_config(workdir: str) -> dict[str, Any]:
  """The nested config a run saved in ``<workdir>/config.json``."""
  path = epath.Path(workdir) / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist: {workdir!r} is not a training workdir "
                            "(`python -m launch.train --workdir=...` writes config.json).")
  nested: dict[str, Any] = {}
  for key, value in json.loads(path.read_text()).items():
    *sections, leaf = key.split(".")
    d = nested
    for s in sections:
      d = d.setdefault(s, {})
    d[leaf] = value
  return nested


def load_run(workdir: str, step: int | None = None, mesh_cfg: parallel.MeshConfig | None = None
             ) -> tuple[RunConfig, Any, Any, int]:
  """The resolved config, vocabulary and parameters of a checkpoint step.

  Args:
    workdir: the training workdir.
    step: checkpoint step (default: the latest).
    mesh_cfg: mesh to restore onto (default: the first local device, which is what export
      and single-host evaluation need).

  Returns:
    (config, vocab, params, step).
  """
  c = resolve(saved_config(workdir), dry_run=True)
  vocab = load_vocab(c.tokenizer)
  if mesh_cfg is None:
    mesh_cfg = parallel.MeshConfig(data=1, rules="replicated")
    mesh = parallel.make_mesh(mesh_cfg, devices=jax.devices()[:1])
  else:
    mesh = parallel.make_mesh(mesh_cfg)
  trainer = rl.Trainer(c.model, c.train, c.loss, c.optimizer, mesh,
                       parallel.RULE_SETS[mesh_cfg.rules])
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          trainer.abstract_state(), trainer.state_shardings)
  ckpt = Checkpointer(workdir)
  try:
    step = ckpt.latest_step() if step is None else step
    state = ckpt.restore_state(abstract, step)
  finally:
    ckpt.close()
  return c, vocab, state.params, int(step)


__all__ = ["load_run", "saved_config"]
