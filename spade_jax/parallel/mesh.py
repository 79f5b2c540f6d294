"""Device mesh construction and logical-axis sharding rules.

Model code names logical axes ("batch", "embed", "heads", ...). A rule set maps
each logical axis to a mesh axis (or a tuple of them, or None = replicated).
Switching FSDP / tensor / expert parallelism is a config edit: pick another
rule set. The same rules place activations: model code calls `constrain` with
logical names, which applies `with_sharding_constraint` while an
`activation_sharding(mesh, rules)` context is active and does nothing otherwise.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Any, Sequence

from absl import logging
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from spade_jax.registry import Registry

MESH_AXES = ("data", "fsdp", "tensor", "expert")

Rules = tuple[tuple[str, Any], ...]

RULE_SETS: Registry[Rules] = Registry("sharding rule set", {
    "replicated": (("batch", ("data", "fsdp", "expert")),),
    # Parameters split over `fsdp` along their model width; batch over everything.
    "fsdp": (
        ("batch", ("data", "fsdp", "expert")),
        ("embed", "fsdp"),
        ("vocab", None),
    ),
    # Megatron-style tensor parallelism on heads / MLP width / vocab, plus FSDP.
    "fsdp_tensor": (
        ("batch", ("data", "fsdp", "expert")),
        ("embed", "fsdp"),
        ("heads", "tensor"),
        ("kv_heads", "tensor"),
        ("mlp", "tensor"),
        ("moe_mlp", "tensor"),
        ("vocab", "tensor"),
    ),
    # As fsdp_tensor, with whole experts placed on the `expert` axis.
    "fsdp_tensor_expert": (
        ("batch", ("data", "fsdp", "expert")),
        ("expert", "expert"),
        ("embed", "fsdp"),
        ("heads", "tensor"),
        ("kv_heads", "tensor"),
        ("mlp", "tensor"),
        ("moe_mlp", "tensor"),
        ("vocab", "tensor"),
    ),
}, field="mesh.rules")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh shape and sharding rule set.

  Attributes:
    data, fsdp, tensor, expert: mesh axis sizes; at most one may be -1
      meaning "all remaining devices".
    rules: name of a rule set in `RULE_SETS`.
  """

  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  expert: int = 1
  rules: str = "fsdp"

  def __post_init__(self):
    RULE_SETS.check(self.rules)


def make_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds a mesh with axes ("data", "fsdp", "tensor", "expert") from `cfg`."""
  devices = list(devices if devices is not None else jax.devices())
  sizes = [cfg.data, cfg.fsdp, cfg.tensor, cfg.expert]
  if sizes.count(-1) > 1:
    raise ValueError(f"Only one mesh axis may be -1, got {dict(zip(MESH_AXES, sizes))}.")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"{len(devices)} devices cannot fill mesh "
                       f"{dict(zip(MESH_AXES, sizes))}: the fixed axes multiply "
                       f"to {known}, which must divide the device count.")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(f"Mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} "
                     f"devices but {len(devices)} are available; set one axis to -1.")
  arr = np.asarray(devices).reshape(sizes)
  return Mesh(arr, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def _rule_lookup(rules: Rules) -> dict[str, Any]:
  return dict(rules)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int],
                    mesh: Mesh, rules: Rules) -> P:
  """PartitionSpec for one array; dims not divisible by their mesh axes stay replicated."""
  table = _rule_lookup(rules)
  spec = []
  used: set[str] = set()
  for name, dim in zip(axes, shape):
    target = table.get(name) if name else None
    if target is None:
      spec.append(None)
      continue
    names = (target,) if isinstance(target, str) else tuple(target)
    names = tuple(n for n in names if n not in used and mesh.shape.get(n, 1) > 1)
    size = math.prod(mesh.shape[n] for n in names) if names else 1
    if not names or dim % size:
      if names and dim % size:
        logging.log_first_n(logging.INFO, "dim %s=%d not divisible by mesh axes %s"
                            " (%d); replicating it", 8, name, dim, names, size)
      spec.append(None)
      continue
    used.update(names)
    spec.append(names[0] if len(names) == 1 else names)
  return P(*spec)


def tree_shardings(axes_tree: Any, shapes_tree: Any, mesh: Mesh,
                   rules: Rules) -> Any:
  """NamedSharding for every leaf of a tree of logical-axis tuples."""
  is_leaf = lambda x: isinstance(x, tuple) and all(
      isinstance(a, (str, type(None))) for a in x)
  flat_axes, treedef = jax.tree.flatten(axes_tree, is_leaf=is_leaf)
  flat_shapes = treedef.flatten_up_to(shapes_tree)
  return jax.tree.unflatten(treedef, [
      NamedSharding(mesh, logical_to_spec(a, tuple(s), mesh, rules))
      for a, s in zip(flat_axes, flat_shapes)])


def batch_sharding(mesh: Mesh, rules: Rules, ndim: int) -> NamedSharding:
  """Sharding of a [B, ...] batch array: batch over its mesh axes, rest replicated."""
  target = _rule_lookup(rules).get("batch")
  return NamedSharding(mesh, P(target, *([None] * (ndim - 1))))


def batch_divisor(mesh: Mesh, rules: Rules) -> int:
  """Number of shards the batch axis is split into."""
  target = _rule_lookup(rules).get("batch")
  if target is None:
    return 1
  names = (target,) if isinstance(target, str) else target
  return math.prod(mesh.shape[n] for n in names)


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None) -> None:
  """Initialises multi-host JAX (launchers only).

  On a Cloud TPU slice the arguments are discovered from the environment; elsewhere pass
  them (e.g. one local process: ``"localhost:PORT", 1, 0``). Without arguments on a single
  host there is nothing to join and the call only logs why.
  """
  if coordinator_address is not None:
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
    logging.info("jax.distributed: process %d of %d", jax.process_index(), jax.process_count())
    return
  try:
    jax.distributed.initialize()
  except (ValueError, RuntimeError) as e:  # single host: nothing to join
    logging.info("jax.distributed.initialize skipped: %s", e)


_ACTIVE: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar(
    "spade_jax_activation_sharding", default=None)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: Rules):
  """Within this context, `constrain` places activations by `rules` on `mesh`.

  Enter it around the call that traces a jitted function (constraints are
  baked in at trace time).
  """
  token = _ACTIVE.set((mesh, rules))
  try:
    yield
  finally:
    _ACTIVE.reset(token)


def active_sharding() -> tuple[Mesh, Rules] | None:
  """(mesh, rules) of the enclosing `activation_sharding` context, else None.

  For model code that partitions work itself (`jax.shard_map`) rather than
  only constraining where activations live.
  """
  return _ACTIVE.get()


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """`with_sharding_constraint` by logical axis names; identity outside a context."""
  active = _ACTIVE.get()
  if active is None:
    return x
  mesh, rules = active
  if len(axes) != x.ndim:
    raise ValueError(f"constrain: {len(axes)} axis names {tuple(axes)} for an array "
                     f"of rank {x.ndim} (shape {x.shape}).")
  spec = logical_to_spec(axes, x.shape, mesh, rules)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
