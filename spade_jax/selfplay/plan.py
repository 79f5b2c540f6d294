"""Planning a run without weights: per-device memory of its train state (and step).

``plan(config)`` resolves a config (a missing checkpoint is fine: the model section then
describes the architecture), builds the mesh and the trainer, and sizes every leaf of the
abstract train state on its sharding (``jax.eval_shape``: nothing is allocated). With
``compile_step`` it also lowers and compiles the sharded train step for the config's batch
and reads XLA's memory analysis: the peak a device needs for one update (the CPU compiler's
figure; a guide for TPU rather than an exact one).
"""

from __future__ import annotations

import math
import time
from typing import Any

import jax

from spade_jax import parallel, rl
from spade_jax.models import num_params
from spade_jax.selfplay.build import resolve

GiB = float(1 << 30)


def _device_bytes(tree, shardings) -> float:
  """Bytes of the largest shard of every leaf, summed (the busiest device's share)."""
  total = 0.0
  for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
    shard = s.shard_shape(x.shape)
    total += math.prod(shard) * x.dtype.itemsize
  return total


def plan(config, compile_step: bool = False) -> dict[str, Any]:
  """Per-device memory of ``config``'s train state (GiB), without allocating weights.

  Args:
    config: an experiment config (e.g. a recipe).
    compile_step: also compile the train step and report XLA's peak per device.

  Returns:
    A dict: model, parameters, devices, mesh, rules, and GiB per device of params,
    optimizer state, reference params and their sum; with ``compile_step`` also the step's
    temporary and peak bytes and the compile seconds.
  """
  c = resolve(config, dry_run=True)
  mesh = parallel.make_mesh(c.mesh)
  trainer = rl.Trainer(c.model, c.train, c.loss, c.optimizer, mesh,
                       parallel.RULE_SETS[c.mesh.rules])
  state, sh = trainer.abstract_state(), trainer.state_shardings
  out: dict[str, Any] = {
      "init_from": c.init_from or "random init",
      "parameters": num_params(c.model), "devices": int(mesh.devices.size),
      "mesh": {k: int(v) for k, v in mesh.shape.items()}, "rules": c.mesh.rules,
      "tokens_per_device": c.train.batch_size * c.train.seq_len
                           // c.train.num_microbatches // int(mesh.devices.size),
      "params_gib": _device_bytes(state.params, sh.params) / GiB,
      "opt_state_gib": _device_bytes(state.opt_state, sh.opt_state) / GiB,
      "ref_params_gib": (_device_bytes(state.ref_params, sh.ref_params) / GiB
                         if state.ref_params is not None else 0.0),
  }
  out["state_gib"] = out["params_gib"] + out["opt_state_gib"] + out["ref_params_gib"]
  if compile_step:
    t0 = time.perf_counter()
    mem = trainer.lower().compile().memory_analysis()
    out["compile_s"] = time.perf_counter() - t0
    if mem is not None:
      out["temp_gib"] = mem.temp_size_in_bytes / GiB
      out["peak_gib"] = (mem.argument_size_in_bytes + mem.output_size_in_bytes
                         + mem.temp_size_in_bytes - mem.alias_size_in_bytes) / GiB
  return out


def plan_line(p: dict[str, Any]) -> str:
  """The plan as one human-readable line."""
  mesh = " ".join(f"{k}={v}" for k, v in p["mesh"].items() if v > 1)
  line = (f"plan: {p['parameters'] / 1e9:.2f}B params from {p['init_from']} on "
          f"{p['devices']} devices ({mesh}, {p['rules']}), {p['tokens_per_device']:,} "
          f"tokens/device/micro-batch | per device: params {p['params_gib']:.2f} GiB, "
          f"optimizer {p['opt_state_gib']:.2f} GiB, reference {p['ref_params_gib']:.2f} GiB, "
          f"state {p['state_gib']:.2f} GiB")
  if "peak_gib" in p:
    line += f", step peak {p['peak_gib']:.2f} GiB (compiled in {p['compile_s']:.0f}s)"
  return line


__all__ = ["plan", "plan_line"]
