"""Supervised next-token loss (SFT) as an exactly accumulable (sum, denom) pair.

A warm start trains the policy on (prompt -> target) pairs (a designer prompt
and a program, an agent transcript) with the GRPO trainer's own model code,
train state, sharded step and micro-batch accumulation: `rl.Trainer` with
`TrainConfig.objective="sft"` (`rl.OBJECTIVES`) reads its per-token log-probs
from the same chunked path (`rl.chunked_token_logprobs`, no [B, T, V] logits)
and hands them to `sft_loss_terms` instead of the GRPO loss.

For every trained token the loss is the negative log-likelihood
``-log p(token | its prefix within its segment)``, aggregated by name from
`loss.AGGREGATIONS` (`LossConfig.aggregation`): "token_mean" (the usual
next-token cross-entropy) or "seq_mean_token_mean" (each sequence's token mean,
averaged over sequences; "dr_grpo" works too). A trained token is one with
`loss_mask` True that is neither padding (segment id 0) nor the first token of
its segment (nothing in the segment predicts it; its log-prob is 0 by
convention), so a packed batch gives the same loss as the same sequences one
per row. Masked tokens are replaced by zeros before any arithmetic: they get
exactly zero gradient and may hold any value.

Like `loss.grpo_loss_terms`, both entries of the pair are sums over rows, so
summing them over micro-batches and batches and dividing once equals the loss
of all the rows at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from spade_jax.rl.loss import (AGGREGATIONS, LossConfig, Metrics, finalize_loss,
                               sequences)

Array = jax.Array


def check_loss_config(config: LossConfig) -> None:
  """Refuses GRPO-only loss settings that would change an SFT run silently.

  SFT reads only `aggregation` and `dr_grpo_norm`; the clip ranges and
  `tis_cap` have non-zero defaults and are ignored. A KL penalty would make the
  trainer keep a reference copy of the weights, and the KL estimators assume
  tokens sampled from the policy, which SFT data are not.

  Raises:
    ValueError: for a non-zero `kl_coef` or `entropy_coef`.
  """
  bad = {k: getattr(config, k) for k in ("kl_coef", "entropy_coef") if getattr(config, k)}
  if bad:
    keys = ", ".join(f"loss.{k}={v}" for k, v in bad.items())
    raise ValueError(f"train.objective='sft' reads only loss.aggregation and "
                     f"loss.dr_grpo_norm; got {keys}. Set them to 0 for SFT.")


def trained_tokens(loss_mask: Array, segment_ids: Array | None = None) -> Array:
  """Which tokens the supervised loss reads.

  Args:
    loss_mask: [B, T] bool (or 0/1); True for target tokens.
    segment_ids: [B, T] int (0 = padding; each contiguous run of one id is a
      sequence), or None (each row is one sequence).

  Returns:
    [B, T] bool: `loss_mask`, minus padding and the first token of every
    sequence (column 0 of every row, and every change of segment id).
  """
  valid = loss_mask.astype(bool)
  first = jnp.zeros(valid.shape, bool).at[:, 0].set(True)
  if segment_ids is not None:
    seg = segment_ids.astype(jnp.int32)
    first = first.at[:, 1:].set(seg[:, 1:] != seg[:, :-1])
    valid = valid & (seg > 0)
  return valid & ~first


def sft_loss_terms(
    logps: Array,
    loss_mask: Array,
    *,
    segment_ids: Array | None = None,
    role: Array | None = None,
    role_names: Sequence[str] = (),
    config: LossConfig = LossConfig(),
) -> tuple[Array, Array, Metrics]:
  """Next-token NLL of the trained tokens as a (sum, denominator) pair.

  Args:
    logps: [B, T] log p(token t | tokens before t in its segment) under the
      params being trained (e.g. `rl.chunked_token_logprobs`).
    loss_mask: [B, T] bool (or 0/1); True for target tokens (see
      `trained_tokens` for those never read).
    segment_ids: [B, T] int for packed rows (0 = padding), or None (one
      sequence per row).
    role: [B, T] int index into `role_names`, or None; splits only the
      metrics (token count and NLL per role), never the loss.
    role_names: names of the roles (`rl.ROLES` in the trainer).
    config: `LossConfig`; only `aggregation` (and `dr_grpo_norm`) are read.

  Returns:
    `(loss_sum, denom, metric_sums)`: scalars with `loss = loss_sum / denom`,
    both sums over rows (add them over micro-batches, divide once).
    `metric_sums` (stop-gradient, all combined by addition with
    `loss.combine_metric_sums`): "nll_sum", "token_count", "sequence_count"
    (sequences with at least one trained token) and, per role name `r`,
    "<r>_tokens" and "<r>_nll_sum". Finalise with `finalize_sft_metrics`.

  Raises:
    ValueError: if `logps` is not [B, T] or another input differs in shape.
  """
  if logps.ndim != 2:
    raise ValueError(f"logps must have shape [B, T]; got {tuple(logps.shape)}.")
  named = {"loss_mask": loss_mask, "segment_ids": segment_ids, "role": role}
  for name, x in named.items():
    if x is not None and tuple(x.shape) != tuple(logps.shape):
      raise ValueError(f"{name} must have the shape of logps {tuple(logps.shape)}; "
                       f"got {tuple(x.shape)}.")
  if role_names and role is None:
    raise ValueError(f"role_names={tuple(role_names)} needs role [B, T]; got None.")
  valid = trained_tokens(loss_mask, segment_ids)
  m = valid.astype(jnp.float32)
  # The `where` sends exactly zero cotangent to untrained entries (any value).
  nll = jnp.where(valid, -logps.astype(jnp.float32), 0.0)
  seqs = sequences(logps.shape, segment_ids)
  loss_sum, denom = AGGREGATIONS[config.aggregation](nll, m, seqs, config)
  sums = {"nll_sum": jnp.sum(nll), "token_count": jnp.sum(m),
          "sequence_count": jnp.sum((seqs.sum(m) > 0).astype(jnp.float32))}
  for r, name in enumerate(role_names):
    in_role = valid & (role == r)
    sums[f"{name}_tokens"] = jnp.sum(in_role.astype(jnp.float32))
    sums[f"{name}_nll_sum"] = jnp.sum(jnp.where(in_role, nll, 0.0))
  return loss_sum, denom, jax.tree.map(jax.lax.stop_gradient, sums)


def finalize_sft_metrics(loss_sum: Array, denom: Array, sums: Metrics) -> Metrics:
  """Means of (accumulated) `sft_loss_terms` sums, as the train step returns them.

  Args:
    loss_sum: summed loss numerator (scalar).
    denom: summed loss denominator (scalar).
    sums: metric sums from `sft_loss_terms`, combined over micro-batches and
      batches with `loss.combine_metric_sums`.

  Returns:
    Scalars: "loss" (the aggregated objective), "nll" (mean NLL per trained
    token, whatever the aggregation; equals "loss" for "token_mean"),
    "perplexity" (`exp(nll)`), "token_count", "sequence_count" and, per role
    `r` in the sums, "<r>_tokens" and "<r>_nll". Means over no tokens are 0
    (perplexity 1).
  """
  def mean(s, n):
    return jnp.where(n > 0, s / jnp.where(n > 0, n, 1.0), 0.0)

  n = sums["token_count"]
  nll = mean(sums["nll_sum"], n)
  out = {"loss": finalize_loss(loss_sum, denom), "nll": nll, "perplexity": jnp.exp(nll),
         "token_count": n, "sequence_count": sums["sequence_count"]}
  for k in sums:
    if k.endswith("_nll_sum") and k != "nll_sum":
      r = k[:-len("_nll_sum")]
      out[f"{r}_tokens"] = sums[f"{r}_tokens"]
      out[f"{r}_nll"] = mean(sums[k], sums[f"{r}_tokens"])
  return out


def sft_loss(logps: Array, loss_mask: Array, *, segment_ids: Array | None = None,
             config: LossConfig = LossConfig()) -> tuple[Array, Metrics]:
  """SFT loss and finalised metrics of one (full) batch.

  Args: as `sft_loss_terms` (no role split).

  Returns:
    `(loss, metrics)`: the scalar loss (differentiable) and
    `finalize_sft_metrics`.
  """
  loss_sum, denom, sums = sft_loss_terms(logps, loss_mask, segment_ids=segment_ids,
                                         config=config)
  metrics = finalize_sft_metrics(jax.lax.stop_gradient(loss_sum),
                                 jax.lax.stop_gradient(denom), sums)
  return finalize_loss(loss_sum, denom), metrics
