"""What the trainer minimises, chosen by name (`TrainConfig.objective`).

"grpo": the GRPO loss terms of a (micro-)batch with the old log-probs chosen by name
(`OLD_LOGPS`) and the per-role log-prob gap and TIS weights; "sft": next-token NLL of the
`loss_mask` tokens (`rl.sft`). Each returns exactly accumulable (sum, denominator, metric
sums); `rl.train_step.Trainer` adds the forward pass in front and the optimizer behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

from spade_jax.registry import Registry, names
from spade_jax.rl import loss as loss_lib
from spade_jax.rl import sft as sft_lib

ROLES = ("designer", "agent")
OLD_LOGPS = names("recompute", "sampler", kind="old log-prob source",
                  field="train.old_logps")
"""Where the PPO ratio's denominator comes from (`TrainConfig.old_logps`)."""


def batch_loss_terms(
    logps: jax.Array,
    batch: Mapping[str, jax.Array],
    *,
    ref_logps: jax.Array | None = None,
    old_logps: str = "recompute",
    config: loss_lib.LossConfig = loss_lib.LossConfig(),
) -> tuple[jax.Array, jax.Array, loss_lib.Metrics]:
  """GRPO loss terms of one (micro-)batch, old log-probs chosen by name.

  This is the whole objective of the train step given the policy's log-probs;
  `Trainer` only adds the forward pass in front and the optimizer behind.

  Args:
    logps: [B, T] log-probs of the batch's tokens under the params being
      updated (the quantity the gradient flows through).
    batch: [B, T] arrays "sampler_logps", "advantages", "loss_mask",
      "segment_ids" and "role" (index into `ROLES`), as in `BATCH_FIELDS`.
    ref_logps: [B, T] reference-policy log-probs, or None (KL off).
    old_logps: name in `OLD_LOGPS`. "recompute": `stop_gradient(logps)`;
      exact for one optimizer step per rollout, where the reference's
      recomputation runs the very weights the gradient is taken at (ratio
      exactly 1, gradient `grad log pi`, no second forward pass). "sampler":
      `batch["sampler_logps"]`. Either way `sampler_logps` goes to the loss,
      so each token is weighted by `min(exp(old - sampler), config.tis_cap)`
      and the drift is measured.
    config: static loss hyperparameters.

  Returns:
    `(loss_sum, denom, metric_sums)` as `loss.grpo_loss_terms`, with per role
    of `ROLES` `<role>_tokens` (loss tokens), `<role>_logp_gap_sum` and
    `<role>_logp_gap_max` (|trainer - sampler| log-prob of the loss tokens:
    the trainer's log-probs under the weights being updated, the same tempered
    policy the sampler recorded, so a gap is staleness, top-k/top-p truncation
    or numerics, never a different distribution) and, when `config.tis_cap` is
    set, `<role>_tis_weight_sum` (sum of the applied weights); combine with
    `loss.combine_metric_sums`, finalise with `finalize_train_metrics`.

  Raises:
    UnknownNameError: for an `old_logps` not in `OLD_LOGPS`.
  """
  sg = jax.lax.stop_gradient
  sampler = batch["sampler_logps"]
  old = sg(logps) if OLD_LOGPS[old_logps] == "recompute" else sampler
  loss_sum, denom, sums = loss_lib.grpo_loss_terms(
      logps, old, batch["advantages"], batch["loss_mask"], ref_logps=ref_logps,
      sampler_logps=sampler, segment_ids=batch["segment_ids"], config=config)
  valid = batch["loss_mask"].astype(bool) & (batch["segment_ids"] > 0)
  weight = None
  if config.tis_cap is not None:
    # The same weight the loss applied, for the per-role means.
    weight = jnp.where(valid, loss_lib.tis_weight(
        sg(old).astype(jnp.float32), sampler.astype(jnp.float32), config.tis_cap), 0.0)
  gap = jnp.abs(sg(logps).astype(jnp.float32) - sampler.astype(jnp.float32))
  for r, name in enumerate(ROLES):
    in_role = valid & (batch["role"] == r)
    sums[f"{name}_tokens"] = jnp.sum(in_role)
    sums[f"{name}_logp_gap_sum"] = jnp.sum(jnp.where(in_role, gap, 0.0))
    sums[f"{name}_logp_gap_max"] = jnp.max(jnp.where(in_role, gap, 0.0))
    if weight is not None:
      sums[f"{name}_tis_weight_sum"] = sg(jnp.sum(jnp.where(in_role, weight, 0.0)))
  return loss_sum, denom, sums


def finalize_train_metrics(loss_sum: jax.Array, denom: jax.Array,
                           sums: loss_lib.Metrics) -> loss_lib.Metrics:
  """Means of (accumulated) `batch_loss_terms` sums, as the step returns them.

  Args:
    loss_sum: summed loss numerator (scalar).
    denom: summed loss denominator (scalar).
    sums: metric sums from `batch_loss_terms`, combined over micro-batches
      and batches with `loss.combine_metric_sums`.

  Returns:
    `loss.finalize_metrics(sums)` plus "loss", `<role>_tokens`,
    `<role>_logp_gap_mean` / `<role>_logp_gap_max` (sampler vs trainer
    log-prob of the role's loss tokens) and, with a TIS cap,
    `<role>_tis_weight_mean` (0 for a role without loss tokens).
  """
  metrics = loss_lib.finalize_metrics(sums)
  for r in ROLES:
    n = sums[f"{r}_tokens"]
    metrics[f"{r}_tokens"] = n
    metrics[f"{r}_logp_gap_mean"] = jnp.where(
        n > 0, sums[f"{r}_logp_gap_sum"] / jnp.maximum(n, 1), 0.0)
    metrics[f"{r}_logp_gap_max"] = sums[f"{r}_logp_gap_max"]
    if f"{r}_tis_weight_sum" in sums:
      metrics[f"{r}_tis_weight_mean"] = jnp.where(
          n > 0, sums[f"{r}_tis_weight_sum"] / jnp.maximum(n, 1), 0.0)
  metrics["loss"] = loss_lib.finalize_loss(loss_sum, denom)
  return metrics


def sft_batch_terms(
    logps: jax.Array,
    batch: Mapping[str, jax.Array],
    *,
    ref_logps: jax.Array | None = None,
    old_logps: str = "recompute",
    config: loss_lib.LossConfig = loss_lib.LossConfig(),
) -> tuple[jax.Array, jax.Array, loss_lib.Metrics]:
  """Supervised (next-token NLL) terms of one (micro-)batch, as `batch_loss_terms`.

  Args:
    logps: [B, T] log-probs of the batch's tokens under the params being
      updated.
    batch: [B, T] arrays "loss_mask", "segment_ids" and "role" (index into
      `ROLES`; splits only the metrics). "advantages" and "sampler_logps"
      are not read.
    ref_logps: unused (the SFT objective has no KL term).
    old_logps: unused.
    config: `LossConfig`; only `aggregation` and `dr_grpo_norm` are read.

  Returns:
    `(loss_sum, denom, metric_sums)` of `sft.sft_loss_terms` with a split by
    `ROLES`; finalise with `sft.finalize_sft_metrics`.
  """
  del ref_logps, old_logps
  return sft_lib.sft_loss_terms(logps, batch["loss_mask"],
                                segment_ids=batch["segment_ids"], role=batch["role"],
                                role_names=ROLES, config=config)


class Objective(NamedTuple):
  """What the train step minimises, given the policy's log-probs.

  Attributes:
    terms: `fn(logps [B, T], batch, *, ref_logps, old_logps, config) ->
      (loss_sum, denom, metric_sums)`, exactly accumulable by addition
      (`_add_sums`).
    finalize: `fn(loss_sum, denom, metric_sums) -> metrics`.
    required: the batch fields a batch must hold besides "tokens",
      "positions" and "segment_ids"; any other field of `BATCH_FIELDS` may be
      left out of a batch and is then zeros (for "sft" a missing "role" puts
      every token in role 0).
    check: `fn(loss_config)`, raises for loss settings the objective refuses.
  """

  terms: Callable[..., tuple[jax.Array, jax.Array, loss_lib.Metrics]]
  finalize: Callable[[jax.Array, jax.Array, loss_lib.Metrics], loss_lib.Metrics]
  required: tuple[str, ...]
  check: Callable[[loss_lib.LossConfig], None]


OBJECTIVES: Registry[Objective] = Registry("training objective", {
    "grpo": Objective(batch_loss_terms, finalize_train_metrics,
                      ("loss_mask", "sampler_logps", "advantages", "role"),
                      lambda config: None),
    "sft": Objective(sft_batch_terms, sft_lib.finalize_sft_metrics, ("loss_mask",),
                     sft_lib.check_loss_config),
}, field="train.objective")
"""Name -> `Objective` (`TrainConfig.objective`): "grpo" (self-play RL), "sft"
(supervised next-token loss on the `loss_mask` tokens, for warm starts)."""
