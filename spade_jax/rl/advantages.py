"""Group-relative advantage estimators, looked up by name.

Rows of a batch are grouped by an integer id (per environment for agent
episodes, per skill / credit window for designer samples). Estimators work on
fixed shapes with a validity mask so that a changing number of finished
episodes never triggers recompilation:

* "grpo":    (r - mean_g) / (std_g + eps), std_g the population standard
             deviation (ddof=0) over the valid rows of the group.
* "dr_grpo": r - mean_g (Dr. GRPO: no std normalisation).
* "rloo":    r - (sum_g - r) / (n_g - 1) (leave-one-out baseline).
* "external": the rewards are already advantages and are passed through.

Invalid rows, and rows whose group id lies outside `[0, num_groups)`, get 0.
Rows of groups with a single valid member get 0 for "grpo" and "rloo" (and
r - r = 0 for "dr_grpo").
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from spade_jax.registry import Registry

Array = jax.Array
AdvantageFn = Callable[[Array, Array, Array, int, float], Array]


def _group_stats(
    rewards: Array, group_ids: Array, valid: Array, num_groups: int
) -> tuple[Array, Array, Array]:
  """Per-row group count, sum and mean over valid rows.

  Returns:
    `(n [B], total [B], mean [B])` gathered back to the rows.
  """
  w = valid.astype(rewards.dtype)
  n_g = jax.ops.segment_sum(w, group_ids, num_segments=num_groups)
  s_g = jax.ops.segment_sum(rewards * w, group_ids, num_segments=num_groups)
  n, total = n_g[group_ids], s_g[group_ids]
  return n, total, total / jnp.maximum(n, 1.0)


def _grpo(rewards, group_ids, valid, num_groups, eps):
  n, _, mean = _group_stats(rewards, group_ids, valid, num_groups)
  w = valid.astype(rewards.dtype)
  sq = jax.ops.segment_sum(
      jnp.square(rewards - mean) * w, group_ids, num_segments=num_groups
  )[group_ids]
  std = jnp.sqrt(sq / jnp.maximum(n, 1.0))
  return jnp.where(n > 1, (rewards - mean) / (std + eps), 0.0)


def _dr_grpo(rewards, group_ids, valid, num_groups, eps):
  del eps
  _, _, mean = _group_stats(rewards, group_ids, valid, num_groups)
  return rewards - mean


def _rloo(rewards, group_ids, valid, num_groups, eps):
  del eps
  n, total, _ = _group_stats(rewards, group_ids, valid, num_groups)
  baseline = (total - rewards) / jnp.maximum(n - 1.0, 1.0)
  return jnp.where(n > 1, rewards - baseline, 0.0)


def _external(rewards, group_ids, valid, num_groups, eps):
  del group_ids, valid, num_groups, eps
  return rewards


ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry(
    "advantage estimator",
    {"grpo": _grpo, "dr_grpo": _dr_grpo, "rloo": _rloo, "external": _external},
    field="rewards.advantage")
"""Name -> ``fn(rewards [B], group_ids [B], valid [B], num_groups, eps) -> advantages [B]``.

The functions expect in-range ids; :func:`compute_advantages` masks invalid and
out-of-range rows.
"""


@functools.partial(jax.jit, static_argnames=("name", "num_groups"))
def compute_advantages(
    name: str,
    rewards: Array,
    group_ids: Array,
    valid: Array,
    num_groups: int,
    eps: float = 1e-6,
) -> Array:
  """Computes per-row advantages with the named estimator.

  Jitted with `name` and `num_groups` static; the validity mask and the ids
  are data, so changing them does not recompile.

  Args:
    name: estimator name in `ADVANTAGE_ESTIMATORS`.
    rewards: [B] float rewards (advantages for "external").
    group_ids: [B] int group of each row, in `[0, num_groups)`; rows outside
      that range are treated as invalid.
    valid: [B] bool; False rows are ignored by group statistics and get 0.
    num_groups: static number of groups (upper bound on distinct ids).
    eps: added to the group std by "grpo".

  Returns:
    advantages: [B] float32.

  Raises:
    ValueError: for an unknown name or mismatched shapes.
  """
  fn = ADVANTAGE_ESTIMATORS[name]
  if rewards.ndim != 1 or group_ids.shape != rewards.shape or (
      valid.shape != rewards.shape
  ):
    raise ValueError(
        "rewards, group_ids and valid must all have shape [B]; got "
        f"{tuple(rewards.shape)}, {tuple(group_ids.shape)}, "
        f"{tuple(valid.shape)}."
    )
  if not isinstance(num_groups, int) or num_groups < 1:
    raise ValueError(f"num_groups must be a positive int; got {num_groups!r}.")
  rewards = rewards.astype(jnp.float32)
  group_ids = group_ids.astype(jnp.int32)
  in_range = (group_ids >= 0) & (group_ids < num_groups)
  valid = valid.astype(bool) & in_range
  group_ids = jnp.where(in_range, group_ids, 0)
  rewards = jnp.where(valid, rewards, 0.0)
  adv = fn(rewards, group_ids, valid, num_groups, eps)
  return jnp.where(valid, adv, 0.0)
