"""GRPO loss family as pure JAX functions.

One per-token objective covers the variants used by the trainer:

* PPO clip with separate lower / upper epsilons (DAPO "clip-higher").
* Optional dual clip for negative advantages.
* Token-level or sequence-level (GSPO) importance ratios.
* KL to a reference policy with a named estimator (k1 / k2 / k3).
* Truncated importance sampling (TIS) against the sampler's log-probs, which
  corrects for the mismatch between the inference engine and the trainer and
  for the staleness of delayed designer samples (docs/METHOD.md §1.8:
  the trainer recomputes `old_logps` with the weights it is about to update,
  so the PPO ratio starts at 1 and every token is weighted by
  `min(pi_old / pi_sampler, 2)`; see `rl.TrainConfig.old_logps`).
* An entropy bonus estimated from the sampled tokens.

For every valid (unmasked) token the loss is::

  r      = exp(logp - old_logp)                     # token ratio, or
  r      = exp(mean_t(logp - old_logp))             # sequence ratio (GSPO)
  surr   = min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)
  surr   = max(surr, c * A)         if dual_clip c is set and A < 0
  w      = min(exp(old_logp - sampler_logp), tis_cap)   (stop-gradient)
  loss_t = -surr * w + kl_coef * KL(logp, ref_logp) - entropy_coef * (-logp)

The dual clip follows Ye et al. (2020), "Mastering Complex Control in MOBA
Games with Deep Reinforcement Learning": for negative advantages the clipped
surrogate is bounded below by ``c * A`` (``c > 1``), so a token whose ratio has
grown beyond ``c`` cannot produce an unbounded loss and receives no gradient.

Per-token losses are aggregated into a ``(loss_sum, denom)`` pair in which both
entries are sums over rows of the batch. Summing the pairs of any split of the
batch into micro-batches and dividing once gives exactly the full-batch loss,
which is what gradient accumulation needs. Metrics are carried the same way, as
sums, counts, maxima and minima (see ``combine_metric_sums`` and
``finalize_metrics``).

Packed batches. A row may hold several sequences (episodes, programs) one
after another, told apart by ``segment_ids [B, T]`` (contiguous runs of equal
id; 0 is padding). Advantages are then given per token, ``[B, T]``, constant
over each sequence. Everything that is "per sequence" (the sequence-mean
aggregation, the GSPO ratio, the Dr. GRPO sequence count) is keyed by segment
instead of by row, so a packed batch gives the same loss as the same sequences
laid out one per row. Without ``segment_ids`` each row is one sequence and
``advantages`` may be ``[B]``.

``old_logps``, ``ref_logps``, ``sampler_logps`` and ``advantages`` are treated
as constants (gradients are stopped). Masked tokens are replaced by zeros
before any arithmetic, so they receive exactly zero gradient and may hold any
value, including ``nan`` and ``inf``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from spade_jax.registry import Registry, names

Array = jax.Array
Metrics = dict[str, Array]

# ---------------------------------------------------------------------------
# KL estimators. Each maps (logps, ref_logps), both [B, T], to a per-token
# estimate of KL(pi || pi_ref) for tokens sampled from pi.
# ---------------------------------------------------------------------------


def _kl_k1(logps: Array, ref_logps: Array) -> Array:
  """k1 = log pi - log pi_ref (unbiased, high variance, can be negative)."""
  return logps - ref_logps


def _kl_k2(logps: Array, ref_logps: Array) -> Array:
  """k2 = 0.5 * (log pi - log pi_ref)^2 (biased, low variance, >= 0)."""
  return 0.5 * jnp.square(logps - ref_logps)


def _kl_k3(logps: Array, ref_logps: Array) -> Array:
  """k3 = exp(ref - logp) - (ref - logp) - 1 (unbiased, >= 0)."""
  d = ref_logps - logps
  return jnp.exp(d) - d - 1.0


KL_ESTIMATORS: Registry[Callable[[Array, Array], Array]] = Registry(
    "KL estimator", {"k1": _kl_k1, "k2": _kl_k2, "k3": _kl_k3}, field="loss.kl_estimator")
"""Name -> ``fn(logps [B, T], ref_logps [B, T]) -> kl [B, T]``."""


# ---------------------------------------------------------------------------
# Sequences: rows, or segments of packed rows.
# ---------------------------------------------------------------------------


class Sequences(NamedTuple):
  """Which sequence every token belongs to.

  Attributes:
    ids: [B, T] int, index of the token's sequence in [0, num).
    num: static number of sequence slots (B unpacked, B * T packed).
    present: [num] float, 1 for slots that hold a sequence (every row when
      unpacked; every non-padding segment when packed), else 0.
  """

  ids: Array
  num: int
  present: Array

  def sum(self, x: Array) -> Array:
    """Per-sequence sums of a [B, T] array -> [num]."""
    return jax.ops.segment_sum(x.reshape(-1), self.ids.reshape(-1),
                               num_segments=self.num)


def sequences(shape: tuple[int, int], segment_ids: Array | None) -> Sequences:
  """Sequence index of every token of a [B, T] batch.

  Args:
    shape: (B, T).
    segment_ids: [B, T] int or None. Each contiguous run of one id within a
      row is a sequence; id 0 is padding (a slot that is not `present`).
      None makes every row one sequence.

  Returns:
    `Sequences` for the batch.
  """
  b, t = shape
  if segment_ids is None:
    ids = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
    return Sequences(ids, b, jnp.ones((b,), jnp.float32))
  seg = segment_ids.astype(jnp.int32)
  start = jnp.concatenate(
      [jnp.ones((b, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
  ids = jnp.cumsum(start, axis=1) - 1 + t * jnp.arange(b)[:, None]
  present = jax.ops.segment_max((seg > 0).reshape(-1).astype(jnp.float32),
                                ids.reshape(-1), num_segments=b * t)
  return Sequences(ids, b * t, jnp.maximum(present, 0.0))


# ---------------------------------------------------------------------------
# Aggregation modes. Each maps masked per-token losses to (loss_sum, denom),
# both sums over sequences, so that micro-batch accumulation is exact.
# ---------------------------------------------------------------------------


def _agg_token_mean(
    per_token: Array, mask: Array, seqs: Sequences, config: "LossConfig"
) -> tuple[Array, Array]:
  """Mean over all valid tokens of the batch (DAPO token-level loss)."""
  del seqs, config
  return jnp.sum(per_token * mask), jnp.sum(mask)


def _agg_seq_mean_token_mean(
    per_token: Array, mask: Array, seqs: Sequences, config: "LossConfig"
) -> tuple[Array, Array]:
  """Mean over non-empty sequences of each sequence's token mean."""
  del config
  n = seqs.sum(mask)
  seq_mean = seqs.sum(per_token * mask) / jnp.maximum(n, 1.0)
  return jnp.sum(seq_mean), jnp.sum((n > 0).astype(per_token.dtype))


def _agg_dr_grpo(
    per_token: Array, mask: Array, seqs: Sequences, config: "LossConfig"
) -> tuple[Array, Array]:
  """Token sum divided by (number of sequences) * dr_grpo_norm (Dr. GRPO).

  Unpacked, every row counts as a sequence (B * norm, as in the paper);
  packed, every non-padding segment does.
  """
  norm = per_token.shape[1] if config.dr_grpo_norm is None else config.dr_grpo_norm
  denom = jnp.sum(seqs.present).astype(per_token.dtype) * float(norm)
  return jnp.sum(per_token * mask), denom


AGGREGATIONS: Registry[Callable[[Array, Array, Sequences, "LossConfig"],
                                 tuple[Array, Array]]] = Registry(
    "aggregation mode",
    {"token_mean": _agg_token_mean, "seq_mean_token_mean": _agg_seq_mean_token_mean,
     "dr_grpo": _agg_dr_grpo},
    field="loss.aggregation")
"""Name -> ``fn(per_token [B, T], mask [B, T] float, seqs, config) -> (loss_sum, denom)``."""


def sequence_denominator(config: "LossConfig", loss_tokens: int) -> float | None:
  """What one packed sequence with `loss_tokens` trained tokens adds to the denominator.

  The host-side twin of `AGGREGATIONS[config.aggregation]`'s `denom` for one
  sequence (a segment of its own in a packed row): the sequence's loss tokens
  ("token_mean"), 1 if it has any ("seq_mean_token_mean"), or `dr_grpo_norm`
  ("dr_grpo"). None where it depends on the batch's padded width ("dr_grpo"
  with `dr_grpo_norm=None`). `rl.Trainer.step(extra_denom=...)` uses it for
  rows left out of the batch because their loss is exactly zero.
  """
  if config.aggregation == "token_mean":
    return float(loss_tokens)
  if config.aggregation == "seq_mean_token_mean":
    return 1.0 if loss_tokens > 0 else 0.0
  if config.aggregation == "dr_grpo":
    return None if config.dr_grpo_norm is None else float(config.dr_grpo_norm)
  return None


RATIO_LEVELS = names("token", "sequence", kind="ratio level", field="loss.ratio_level")


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Static hyperparameters of the GRPO loss (hashable; a valid jit static arg).

  Attributes:
    eps_low: lower clip range, the ratio is clipped at `1 - eps_low`.
    eps_high: upper clip range, the ratio is clipped at `1 + eps_high`.
    dual_clip: dual-clip constant `c > 1` for negative advantages, or None.
    ratio_level: "token" (PPO) or "sequence" (GSPO: one ratio per sequence,
      `exp` of the mean masked log-ratio).
    kl_coef: weight of the KL penalty; 0 disables it (ref_logps not needed).
    kl_estimator: name in `KL_ESTIMATORS`.
    aggregation: name in `AGGREGATIONS`.
    dr_grpo_norm: tokens per sequence used as the constant normaliser of the
      "dr_grpo" aggregation (e.g. the maximum generation length); None uses
      the padded length T of the batch (set it explicitly for packed
      batches, whose T is a row of several sequences).
    tis_cap: truncated importance sampling cap on
      `exp(old_logps - sampler_logps)`; None disables the weight (drift
      metrics are still reported when sampler_logps is given).
    entropy_coef: weight of the entropy bonus (estimate: -logps).
  """

  eps_low: float = 0.2
  eps_high: float = 0.28
  dual_clip: float | None = None
  ratio_level: str = "token"
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  aggregation: str = "token_mean"
  dr_grpo_norm: int | None = None
  tis_cap: float | None = 2.0
  entropy_coef: float = 0.0

  def __post_init__(self):
    KL_ESTIMATORS.check(self.kl_estimator)
    AGGREGATIONS.check(self.aggregation)
    RATIO_LEVELS.check(self.ratio_level)
    if not (self.eps_low >= 0 and self.eps_high >= 0):
      raise ValueError(
          f"Clip ranges must be non-negative; got eps_low={self.eps_low}, "
          f"eps_high={self.eps_high}."
      )
    if self.dual_clip is not None and not self.dual_clip > 1.0:
      raise ValueError(
          f"dual_clip must be > 1 (typically 3.0) or None; got "
          f"{self.dual_clip}."
      )
    if self.tis_cap is not None and not self.tis_cap > 0.0:
      raise ValueError(
          f"tis_cap must be > 0 (typically 2.0) or None; got {self.tis_cap}."
      )
    if self.dr_grpo_norm is not None and not (
        isinstance(self.dr_grpo_norm, int) and self.dr_grpo_norm > 0
    ):
      raise ValueError(
          "dr_grpo_norm must be a positive int (tokens per sequence, e.g. the "
          f"maximum generation length) or None; got {self.dr_grpo_norm!r}."
      )


def tis_weight(old_logps: Array, sampler_logps: Array, tis_cap: float) -> Array:
  """Truncated importance-sampling weight of every token (no masking).

  Args:
    old_logps: [B, T] log-probs in the PPO ratio's denominator.
    sampler_logps: [B, T] log-probs recorded when the tokens were sampled.
    tis_cap: the truncation, `LossConfig.tis_cap` (reference: 2.0).

  Returns:
    [B, T] `min(exp(old_logps - sampler_logps), tis_cap)`. An `exp` that
    overflows to inf is capped like any other large weight.
  """
  return jnp.minimum(jnp.exp(old_logps - sampler_logps), tis_cap)


def _check_shapes(
    logps: Array,
    old_logps: Array,
    advantages: Array,
    mask: Array,
    ref_logps: Array | None,
    sampler_logps: Array | None,
    segment_ids: Array | None,
) -> None:
  if logps.ndim != 2:
    raise ValueError(
        f"logps must have shape [B, T]; got shape {tuple(logps.shape)}."
    )
  named = {"old_logps": old_logps, "mask": mask}
  if ref_logps is not None:
    named["ref_logps"] = ref_logps
  if sampler_logps is not None:
    named["sampler_logps"] = sampler_logps
  if segment_ids is not None:
    named["segment_ids"] = segment_ids
  for name, x in named.items():
    if tuple(x.shape) != tuple(logps.shape):
      raise ValueError(
          f"{name} must have the shape of logps {tuple(logps.shape)}; got "
          f"{tuple(x.shape)}."
      )
  if tuple(advantages.shape) not in ((logps.shape[0],), tuple(logps.shape)):
    raise ValueError(
        f"advantages must have shape [B] = ({logps.shape[0]},) (one per row) "
        f"or [B, T] = {tuple(logps.shape)} (per token, for packed rows); got "
        f"{tuple(advantages.shape)}."
    )


def grpo_loss_terms(
    logps: Array,
    old_logps: Array,
    advantages: Array,
    mask: Array,
    *,
    ref_logps: Array | None = None,
    sampler_logps: Array | None = None,
    segment_ids: Array | None = None,
    config: LossConfig = LossConfig(),
) -> tuple[Array, Array, Metrics]:
  """GRPO loss as an exactly accumulable (sum, denominator) pair.

  Args:
    logps: [B, T] log-probs of the sampled tokens under the current policy.
    old_logps: [B, T] the PPO ratio's denominator. The reference recomputes
      them with the trainer's weights before the update, which with one
      optimizer step per rollout is `jax.lax.stop_gradient(logps)` (the
      trainer's `old_logps="recompute"`); `old_logps="sampler"` passes the
      sampler's log-probs here.
    advantages: [B] one advantage per row, or [B, T] per token (constant
      over each packed sequence; only valid tokens are read).
    mask: [B, T] bool (or 0/1); True for tokens that are trained on.
    ref_logps: [B, T] log-probs under the reference policy; required only when
      `config.kl_coef != 0`. When given, the KL metric is reported.
    sampler_logps: [B, T] log-probs recorded when the tokens were sampled
      (inference engine, possibly several updates ago); enables the TIS
      weight `min(exp(old_logps - sampler_logps), config.tis_cap)` on every
      token and the drift metrics.
    segment_ids: [B, T] int for packed rows: each contiguous run of one id is
      a sequence, 0 is padding (never trained on). None: one sequence per row.
    config: static loss hyperparameters.

  Returns:
    `(loss_sum, denom, metrics_sums)`: scalars with `loss = loss_sum / denom`;
    both are sums over rows, so summing them over micro-batches and dividing
    once equals the full-batch loss. `metrics_sums` holds sums and counts
    (combine by addition), `*_max` / `*_min` entries (combine by max / min);
    use `combine_metric_sums` and `finalize_metrics`.

  Raises:
    ValueError: on mismatched shapes, or when `config.kl_coef != 0` and
      `ref_logps` is None.
  """
  _check_shapes(logps, old_logps, advantages, mask, ref_logps, sampler_logps,
                segment_ids)
  if config.kl_coef != 0 and ref_logps is None:
    raise ValueError(
        f"LossConfig.kl_coef={config.kl_coef} needs ref_logps [B, T]; got "
        "None. Pass reference-policy log-probs or set kl_coef=0."
    )
  sg = jax.lax.stop_gradient
  valid = mask.astype(bool)
  if segment_ids is not None:
    valid = valid & (segment_ids > 0)
  m = valid.astype(jnp.float32)
  seqs = sequences(logps.shape, segment_ids)

  def clean(x: Array) -> Array:
    # The `where` sends exactly zero cotangent to masked entries, even when
    # they hold nan/inf.
    return jnp.where(valid, x.astype(jnp.float32), 0.0)

  logps = clean(logps)
  old = sg(clean(old_logps))
  if advantages.ndim == 1:
    adv = sg(advantages.astype(jnp.float32))[:, None]
  else:
    adv = sg(clean(advantages))

  log_ratio = logps - old
  if config.ratio_level == "sequence":
    n = seqs.sum(m)
    seq_log_ratio = seqs.sum(log_ratio * m) / jnp.maximum(n, 1.0)
    log_ratio = seq_log_ratio[seqs.ids]
  ratio = jnp.exp(log_ratio)

  lo, hi = 1.0 - config.eps_low, 1.0 + config.eps_high
  surr = jnp.minimum(ratio * adv, jnp.clip(ratio, lo, hi) * adv)
  if config.dual_clip is not None:
    surr = jnp.where(adv < 0, jnp.maximum(surr, config.dual_clip * adv), surr)
  per_token = -surr

  metrics: Metrics = {}
  if sampler_logps is not None:
    sampler = sg(clean(sampler_logps))
    drift = old - sampler  # 0 on masked tokens
    if config.tis_cap is not None:
      # Applied weight, after the cap; masked tokens get 0 (they have no loss).
      weight = jnp.where(valid, tis_weight(old, sampler, config.tis_cap), 0.0)
      per_token = per_token * weight
      capped = valid & (jnp.exp(drift) > config.tis_cap)
      metrics.update({
          "tis_weight_sum": jnp.sum(weight),
          "tis_weight_max": jnp.max(jnp.where(valid, weight, -jnp.inf)),
          "tis_weight_min": jnp.min(jnp.where(valid, weight, jnp.inf)),
      })
    else:
      capped = jnp.zeros_like(valid)
    x, y = old, sampler  # zero where masked
    metrics.update({
        "tis_abs_diff_sum": jnp.sum(jnp.abs(drift) * m),
        "tis_abs_diff_max": jnp.max(jnp.abs(drift) * m),
        "tis_capped_count": jnp.sum(capped.astype(jnp.float32)),
        "tis_old_sum": jnp.sum(x),
        "tis_sampler_sum": jnp.sum(y),
        "tis_old_sq_sum": jnp.sum(x * x),
        "tis_sampler_sq_sum": jnp.sum(y * y),
        "tis_cross_sum": jnp.sum(x * y),
    })

  if ref_logps is not None:
    kl = KL_ESTIMATORS[config.kl_estimator](logps, sg(clean(ref_logps)))
    metrics["kl_sum"] = jnp.sum(kl * m)
    if config.kl_coef != 0:
      per_token = per_token + config.kl_coef * kl
  if config.entropy_coef != 0:
    per_token = per_token + config.entropy_coef * logps

  per_token = jnp.where(valid, per_token, 0.0)
  loss_sum, denom = AGGREGATIONS[config.aggregation](per_token, m, seqs,
                                                        config)

  neg, pos = adv < 0, adv > 0
  metrics.update({
      "token_count": jnp.sum(m),
      "clip_low_count": jnp.sum(m * (neg & (ratio < lo))),
      "clip_high_count": jnp.sum(m * (pos & (ratio > hi))),
      "ratio_sum": jnp.sum(ratio * m),
      "ratio_max": jnp.max(jnp.where(valid, ratio, -jnp.inf)),
      "ratio_min": jnp.min(jnp.where(valid, ratio, jnp.inf)),
      "entropy_sum": jnp.sum(-logps * m),
  })
  if config.dual_clip is not None:
    metrics["dual_clip_count"] = jnp.sum(m * (neg & (ratio > config.dual_clip)))
  return loss_sum, denom, jax.tree.map(sg, metrics)


def combine_metric_sums(a: Metrics, b: Metrics) -> Metrics:
  """Combines the metric sums of two micro-batches.

  Entries ending in `_max` combine by maximum, `_min` by minimum, all others
  (sums and counts) by addition.

  Args:
    a: metric sums from `grpo_loss_terms`.
    b: metric sums with the same keys.

  Returns:
    The metric sums of the union of both micro-batches.

  Raises:
    ValueError: if the key sets differ.
  """
  if set(a) != set(b):
    raise ValueError(
        f"Cannot combine metric sums with different keys: {sorted(a)} vs "
        f"{sorted(b)}. Use the same LossConfig and optional inputs for every "
        "micro-batch."
    )
  out = {}
  for k in a:
    if k.endswith("_max"):
      out[k] = jnp.maximum(a[k], b[k])
    elif k.endswith("_min"):
      out[k] = jnp.minimum(a[k], b[k])
    else:
      out[k] = a[k] + b[k]
  return out


def finalize_loss(loss_sum: Array, denom: Array) -> Array:
  """Returns `loss_sum / denom`, or 0 when the denominator is 0 (no tokens)."""
  return jnp.where(denom > 0, loss_sum / jnp.where(denom > 0, denom, 1.0), 0.0)


def finalize_metrics(sums: Metrics) -> Metrics:
  """Turns (possibly accumulated) metric sums into means.

  Args:
    sums: output of `grpo_loss_terms` or of `combine_metric_sums`.

  Returns:
    Scalars: `clip_frac_low`, `clip_frac_high`, `ratio_mean`, `ratio_max`,
    `ratio_min`, `entropy`, `token_count`; `dual_clip_frac` with dual clip;
    `kl` with ref_logps; `tis_abs_diff_mean`, `tis_abs_diff_max`
    (|old_logps - sampler_logps|), `tis_corr` (Pearson correlation of old and
    sampler log-probs over valid tokens) and `tis_capped_frac` (fraction of
    tokens whose weight `exp(old - sampler)` exceeded the cap) with
    sampler_logps; with sampler_logps and a `tis_cap`, also
    `tis_weight_mean`, `tis_weight_max`, `tis_weight_min`: the weight each
    token's loss is multiplied by, after the cap. Every entry is 0 when there
    are no valid tokens.
  """
  n = sums["token_count"]
  has = n > 0
  safe_n = jnp.where(has, n, 1.0)

  def mean(k):
    return sums[k] / safe_n

  def extreme(k):
    return jnp.where(has, sums[k], 0.0)

  out = {
      "token_count": n,
      "clip_frac_low": mean("clip_low_count"),
      "clip_frac_high": mean("clip_high_count"),
      "ratio_mean": mean("ratio_sum"),
      "ratio_max": extreme("ratio_max"),
      "ratio_min": extreme("ratio_min"),
      "entropy": mean("entropy_sum"),
  }
  if "dual_clip_count" in sums:
    out["dual_clip_frac"] = mean("dual_clip_count")
  if "kl_sum" in sums:
    out["kl"] = mean("kl_sum")
  if "tis_abs_diff_sum" in sums:
    out["tis_abs_diff_mean"] = mean("tis_abs_diff_sum")
    out["tis_abs_diff_max"] = extreme("tis_abs_diff_max")
    out["tis_capped_frac"] = mean("tis_capped_count")
    if "tis_weight_sum" in sums:
      out["tis_weight_mean"] = mean("tis_weight_sum")
      out["tis_weight_max"] = extreme("tis_weight_max")
      out["tis_weight_min"] = extreme("tis_weight_min")
    mx, my = mean("tis_old_sum"), mean("tis_sampler_sum")
    cov = mean("tis_cross_sum") - mx * my
    vx = jnp.maximum(mean("tis_old_sq_sum") - mx * mx, 0.0)
    vy = jnp.maximum(mean("tis_sampler_sq_sum") - my * my, 0.0)
    denom = jnp.sqrt(vx * vy)
    out["tis_corr"] = jnp.where(
        denom > 0, cov / jnp.where(denom > 0, denom, 1.0), 0.0
    )
  return out


def grpo_loss(
    logps: Array,
    old_logps: Array,
    advantages: Array,
    mask: Array,
    *,
    ref_logps: Array | None = None,
    sampler_logps: Array | None = None,
    segment_ids: Array | None = None,
    config: LossConfig = LossConfig(),
) -> tuple[Array, Metrics]:
  """GRPO loss and finalised metrics for one (full) batch.

  Args: as `grpo_loss_terms`.

  Returns:
    `(loss, metrics)`: scalar loss and the means of `finalize_metrics`, plus
    `metrics["loss"]`.
  """
  loss_sum, denom, sums = grpo_loss_terms(
      logps,
      old_logps,
      advantages,
      mask,
      ref_logps=ref_logps,
      sampler_logps=sampler_logps,
      segment_ids=segment_ids,
      config=config,
  )
  loss = finalize_loss(loss_sum, denom)
  metrics = finalize_metrics(sums)
  metrics["loss"] = jax.lax.stop_gradient(loss)
  return loss, metrics
