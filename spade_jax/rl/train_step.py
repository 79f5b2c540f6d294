"""One train-state pytree and one pure, sharded, jitted GRPO update.

The batch is a dict of fixed-shape [B, T] arrays (see `BATCH_FIELDS`), so the
step compiles once per run. A row may pack several sequences (segment ids,
per-segment positions, per-token advantages and roles). Gradients are
accumulated over micro-batches as (sum, denominator) pairs, which makes any
split equal to the full batch; the same sums accumulate over several batches
of the same shape (`Trainer.step` with a list), so sequences that do not fit
in one batch still join the one optimizer update. Log-probs are computed in
sequence chunks (`TrainConfig.logprob_chunk`), so [B, T, V] logits never exist.

The PPO ratio's denominator (`TrainConfig.old_logps`). The reference
(docs/METHOD.md §1.8) recomputes `old_logps` with the weights it is about
to update and weights every token by `min(pi_old / pi_sampler, tis_cap)`,
where `pi_sampler` are the log-probs recorded at sampling time
(`sampler_logps`). With exactly one optimizer step per rollout, as here, the
weights that recompute `old_logps` are the weights the gradient is taken at,
so `old_logps = stop_gradient(logps)` of the same forward pass is exact: the
ratio is exactly 1 and its gradient is `grad log pi`, no token is clipped,
and the staleness of a designer sample trained several updates after it was
written is corrected by the capped weight instead of silencing its tokens.

What the step minimises is chosen by name (`TrainConfig.objective`, a key of
`OBJECTIVES`): "grpo" (the above) or "sft" (next-token NLL on the `loss_mask`
tokens, `rl.sft`, for warm starts). Both run through the same log-probs,
sharded program, donation and (sum, denominator) accumulation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np
import optax

from spade_jax import parallel
from spade_jax.models import ModelConfig, init_params, param_axes
from spade_jax.rl import loss as loss_lib
from spade_jax.rl.logprobs import chunked_token_logprobs
from spade_jax.rl.objectives import OBJECTIVES, OLD_LOGPS, ROLES
from spade_jax.rl.optimizer import OptimizerConfig, make_optimizer

# Batch fields and their dtypes; every field is [B, T]. `sampler_logps` are the
# log-probs recorded when the tokens were sampled, of the tempered policy
# softmax(logits / temperature). `advantages`, `role` and `temperature` (the
# sampling temperature of the role that wrote the sequence; 1 for greedy rows)
# are per token (constant over each packed sequence); `prefix_ids` names, per
# token, the shared prompt segment it also attends to (0: none; see
# `models.segment_mask` and `selfplay.build_batches`). `Trainer.step` also
# accepts them as [B] (one sequence per row) and broadcasts. A batch without
# `temperature` trains the untempered policy (temperature 1).
BATCH_FIELDS = {
    "tokens": jnp.int32, "positions": jnp.int32, "segment_ids": jnp.int32,
    "loss_mask": jnp.bool_, "sampler_logps": jnp.float32, "advantages": jnp.float32,
    "role": jnp.int32, "temperature": jnp.float32, "prefix_ids": jnp.int32,
}
PER_ROW_FIELDS = ("advantages", "role", "temperature")
# Value of a field a batch leaves out (when its objective does not require it).
_DEFAULTS = {"temperature": 1.0}
_ALWAYS = ("tokens", "positions", "segment_ids")


@flax.struct.dataclass
class TrainState:
  """Everything the update changes. `ref_params` is None when KL is off."""

  step: jax.Array
  params: Any
  opt_state: Any
  ref_params: Any = None


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Static settings of the update.

  Attributes:
    batch_size: rows per update (fixed; unused rows have an empty loss mask).
    seq_len: tokens per row.
    num_microbatches: gradient accumulation steps; must divide batch_size.
    logprob_chunk: positions per chunk of the output projection and
      log-softmax (peak logits memory B/num_microbatches * chunk * V floats,
      recomputed chunk by chunk in the backward pass); 0 computes full
      [B, T, V] logits. The decoder's own rematerialisation is
      `ModelConfig.remat`.
    old_logps: the PPO ratio's denominator, a name in `OLD_LOGPS`.
      "recompute" (reference): the trainer's own log-probs under the weights
      it is about to update, i.e. `stop_gradient` of this step's log-probs
      (ratio 1), and every token weighted by
      `min(exp(old - sampler_logps), loss.tis_cap)`. "sampler": the sampler's
      log-probs (a stale sample's drifted tokens are PPO-clipped; the TIS
      weight is exactly 1). Read by the "grpo" objective only.
    objective: what the step minimises, a name in `OBJECTIVES`: "grpo", or
      "sft" (next-token NLL of the `loss_mask` tokens, aggregated by
      `loss.aggregation`; a batch then needs only "tokens", "positions",
      "segment_ids", "loss_mask" and optionally "role", which splits the
      metrics).
    share_prefix: sequences that begin with the same untrained prompt of at
      least this many tokens (consecutive ones, e.g. the plays of one env) are
      packed as that prompt once followed by each continuation, which attends
      to it through `prefix_ids` (`selfplay.build_batches`): the same update
      (every token sees exactly its own history) on fewer token positions.
      0 packs every sequence whole.
    width_bucket: 0 (reference): every batch is [batch_size, seq_len]. N > 0:
      `selfplay.build_batches` cuts every batch of an update to the longest
      filled row rounded up to a multiple of N (at most seq_len), and the step
      takes any width up to seq_len; each width compiles once, so fewer, larger
      buckets trade padding for compiles. A batch that fits a width already
      used (`Trainer.widths`) takes the narrowest such width, unless a narrower
      new width has earned its compile (`width_patience`).
    width_patience: with `width_bucket`, when a narrower width than any used
      would hold a batch: the padding columns that batches fitting it have
      already spent on wider widths, in units of seq_len, before it is
      compiled (rent or buy: a compile costs about two steps at seq_len on
      CPU). 0 compiles every new bucket at once; a large value reuses wider
      widths forever.
    skip_zero_advantage: True: rows whose advantage is exactly 0 (e.g. every
      play of a group that all won or all lost) are left out of the packed
      batch, and their share of the loss denominator is added back
      (`loss.sequence_denominator`, `Trainer.step(extra_denom=...)`), so the
      gradient and the optimizer step are those of the whole batch on less
      work; an update with no row left applies a zero gradient
      (`Trainer.step_without_rows`), as the whole batch would have. Only where
      that is exact (`Trainer.skips_zero_advantage`: the "grpo" objective, no
      KL or entropy term, a denominator per sequence); per-token metrics
      (log-prob gap, TIS weights, clipping) then cover the trained rows only.
      False (reference): every row goes through the forward and backward pass.
  """

  batch_size: int = 8
  seq_len: int = 2048
  num_microbatches: int = 1
  logprob_chunk: int = 512
  old_logps: str = "recompute"
  objective: str = "grpo"
  share_prefix: int = 16
  width_bucket: int = 0
  width_patience: float = 2.0
  skip_zero_advantage: bool = True

  def __post_init__(self):
    OLD_LOGPS.check(self.old_logps)
    OBJECTIVES.check(self.objective)
    if self.share_prefix < 0:
      raise ValueError(f"train.share_prefix={self.share_prefix}; expected the shortest "
                       "shared prompt (tokens) to pack once, or 0 to pack sequences whole.")
    if self.width_bucket < 0:
      raise ValueError(f"train.width_bucket={self.width_bucket}; expected 0 (every batch "
                       "seq_len wide) or the multiple a batch's width is rounded up to.")
    if self.width_patience < 0:
      raise ValueError(f"train.width_patience={self.width_patience}; expected the padding "
                       "(in units of seq_len) a new narrower width must save before it "
                       "compiles, >= 0.")
    if self.logprob_chunk < 0:
      raise ValueError(f"train.logprob_chunk={self.logprob_chunk}; expected a "
                       "positive chunk length, or 0 for unchunked log-probs.")


class Trainer:
  """Builds the train state and the sharded update for a model on a mesh.

  The objective (`train_cfg.objective`, `OBJECTIVES`) decides only the loss
  terms and metrics; state, shardings, donation and accumulation are shared.
  """

  def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig,
               loss_cfg: loss_lib.LossConfig, opt_cfg: OptimizerConfig,
               mesh: Mesh, rules):
    self.objective = OBJECTIVES[train_cfg.objective]
    self.objective.check(loss_cfg)
    if train_cfg.batch_size % train_cfg.num_microbatches:
      raise ValueError(f"train.num_microbatches={train_cfg.num_microbatches} must "
                       f"divide train.batch_size={train_cfg.batch_size}.")
    shards = parallel.batch_divisor(mesh, rules)
    if (train_cfg.batch_size // train_cfg.num_microbatches) % shards:
      raise ValueError(
          f"Micro-batch of {train_cfg.batch_size // train_cfg.num_microbatches} rows "
          f"cannot be split over {shards} batch shards of mesh {dict(mesh.shape)}; "
          "make train.batch_size / train.num_microbatches a multiple of it.")
    self.model_cfg, self.train_cfg, self.loss_cfg = model_cfg, train_cfg, loss_cfg
    self.mesh, self.rules = mesh, rules
    self.tx = make_optimizer(opt_cfg)
    self.widths: set[int] = set()  # batch widths stepped on (train.width_bucket)
    # Padding columns spent on wider widths by batches a narrower one would hold, per
    # narrower width (`selfplay.build_batches`, train.width_patience).
    self.width_waste: dict[int, int] = {}
    self.state_shardings = self._state_shardings()
    self.batch_shardings = {k: parallel.batch_sharding(mesh, rules, 2)
                            for k in BATCH_FIELDS}
    # One batch: one fused, donated program (forward, backward, optimizer).
    replicated = NamedSharding(mesh, P())
    self._step = jax.jit(self._update, in_shardings=(self.state_shardings,
                                                     self.batch_shardings, replicated),
                         out_shardings=(self.state_shardings, None),
                         donate_argnums=(0,))
    # No rows to differentiate (train.skip_zero_advantage): a zero gradient, applied.
    self._no_rows = jax.jit(self._no_rows_program, in_shardings=(self.state_shardings,),
                            out_shardings=(self.state_shardings, None),
                            donate_argnums=(0,))
    # Several batches: the sums of each batch, added up, then one update.
    sums_shardings = (self.state_shardings.params, None, None, None)
    self._sums = jax.jit(self._sums_program, in_shardings=(self.state_shardings,
                                                           self.batch_shardings),
                         out_shardings=sums_shardings)
    self._add = jax.jit(_add_sums, out_shardings=sums_shardings, donate_argnums=(0,))
    # The new state reuses the old state's buffers; the summed gradient has no
    # output of its shape left to alias, so it is not donated.
    self._apply_sums = jax.jit(self._apply_program,
                               out_shardings=(self.state_shardings, None),
                               donate_argnums=(0,))

  # -- state -----------------------------------------------------------------
  def _init(self, key):
    params = init_params(key, self.model_cfg)
    ref = params if self.loss_cfg.kl_coef else None
    return TrainState(step=jnp.int32(0), params=params,
                      opt_state=self.tx.init(params), ref_params=ref)

  def abstract_state(self) -> TrainState:
    """Shapes and dtypes of the state, without allocating anything."""
    return jax.eval_shape(self._init, jax.random.key(0))

  def _state_shardings(self) -> TrainState:
    abstract = self.abstract_state()
    shapes = jax.tree.map(lambda x: x.shape, abstract.params)
    p_shard = parallel.tree_shardings(param_axes(self.model_cfg), shapes,
                                      self.mesh, self.rules)
    replicated = NamedSharding(self.mesh, P())
    opt_shard = optax.tree_map_params(
        self.tx, lambda _, s: s, abstract.opt_state, p_shard,
        transform_non_params=lambda _: replicated)
    return TrainState(step=replicated, params=p_shard, opt_state=opt_shard,
                      ref_params=p_shard if self.loss_cfg.kl_coef else None)

  def init_state(self, key: jax.Array) -> TrainState:
    """Allocates a fresh state directly in its shardings."""
    if not hasattr(self, "_init_jit"):
      self._init_jit = jax.jit(self._init, out_shardings=self.state_shardings)
    return self._init_jit(key)

  def state_from_params(self, params) -> TrainState:
    """A fresh train state around given parameters (e.g. imported weights).

    The frozen reference copy (a separate buffer, since the update donates the state) is
    made only when the KL coefficient is non-zero.
    """
    params = jax.device_put(params, self.state_shardings.params)
    ref = None
    if self.loss_cfg.kl_coef:
      ref = jax.jit(lambda p: jax.tree.map(jnp.copy, p),
                    out_shardings=self.state_shardings.params)(params)
    return TrainState(step=jax.device_put(jnp.int32(0), self.state_shardings.step),
                      params=params,
                      opt_state=jax.jit(self.tx.init, out_shardings=
                                        self.state_shardings.opt_state)(params),
                      ref_params=ref)

  # -- update ----------------------------------------------------------------
  @property
  def counts_moe_drops(self) -> bool:
    """Whether the step reports MoE capacity drops (a capacity factor is set)."""
    return self.model_cfg.num_moe_layers > 0 and self.model_cfg.moe_capacity_factor > 0

  def _logps(self, params, mb, return_moe_dropped: bool = False):
    # The tempered policy of each row's sampler (docs/METHOD.md §1.8), reference
    # policy included.
    return chunked_token_logprobs(params, self.model_cfg, mb["tokens"],
                                  mb["positions"], mb["segment_ids"],
                                  self.train_cfg.logprob_chunk,
                                  temperature=mb.get("temperature"),
                                  prefix_ids=mb.get("prefix_ids"),
                                  return_moe_dropped=return_moe_dropped)

  def _micro_terms(self, params, ref_params, mb):
    if self.counts_moe_drops:
      logps, dropped = self._logps(params, mb, return_moe_dropped=True)
    else:
      logps = self._logps(params, mb)
    ref = None
    if self.loss_cfg.kl_coef:
      ref = jax.lax.stop_gradient(self._logps(ref_params, mb))
    loss_sum, denom, sums = self.objective.terms(
        logps, mb, ref_logps=ref, old_logps=self.train_cfg.old_logps,
        config=self.loss_cfg)
    if self.counts_moe_drops:  # every position is routed, padding included
      cfg = self.model_cfg
      routed = mb["tokens"].size * cfg.num_experts_per_tok * cfg.num_moe_layers
      sums = dict(sums, moe_dropped_copies=dropped.astype(jnp.float32),
                  moe_routed_copies=jnp.float32(routed))
    return loss_sum, (denom, sums)

  def _batch_sums(self, params, ref_params, batch: dict[str, jax.Array]):
    """Unscaled gradient, loss (sum, denom) and metric sums of one [B, T] batch."""
    n = self.train_cfg.num_microbatches
    micro = jax.tree.map(lambda x: x.reshape(n, x.shape[0] // n, *x.shape[1:]), batch)
    grad_fn = jax.value_and_grad(self._micro_terms, has_aux=True)

    def body(carry, mb):
      (l, (d, m)), g = grad_fn(params, ref_params, mb)
      return _add_sums(carry, (g, l, d, m)), None

    first = jax.tree.map(lambda x: x[0], micro)
    (l0, (d0, m0)), g0 = grad_fn(params, ref_params, first)
    carry = (g0, l0, d0, m0)
    if n > 1:
      rest = jax.tree.map(lambda x: x[1:], micro)
      carry, _ = jax.lax.scan(body, carry, rest)
    return carry

  def _apply(self, state: TrainState, grads, loss_sum, denom, sums):
    """One optimizer update from accumulated sums; (new state, metrics)."""
    scale = jnp.where(denom > 0, 1.0 / jnp.where(denom > 0, denom, 1.0), 0.0)
    grads = jax.tree.map(lambda g: g * scale, grads)
    metrics = self.objective.finalize(loss_sum, denom, sums)
    if "moe_dropped_copies" in sums:
      metrics["moe_dropped_copies"] = sums["moe_dropped_copies"]
      metrics["moe_dropped_frac"] = sums["moe_dropped_copies"] / sums["moe_routed_copies"]
    metrics["grad_norm"] = optax.global_norm(grads)
    return self._optimizer_update(state, grads), metrics

  def _optimizer_update(self, state: TrainState, grads) -> TrainState:
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    return state.replace(step=state.step + 1, opt_state=opt_state,
                         params=optax.apply_updates(state.params, updates))

  def _update(self, state: TrainState, batch: dict[str, jax.Array], extra_denom):
    # Activations follow the same logical-axis rules as the parameters.
    with parallel.activation_sharding(self.mesh, self.rules):
      grads, loss_sum, denom, sums = self._batch_sums(state.params, state.ref_params,
                                                      batch)
      return self._apply(state, grads, loss_sum, denom + extra_denom, sums)

  def _no_rows_program(self, state: TrainState):
    metrics = {"loss": jnp.float32(0.0), "grad_norm": jnp.float32(0.0)}
    metrics.update({f"{r}_tokens": jnp.int32(0) for r in ROLES})
    zeros = jax.tree.map(jnp.zeros_like, state.params)
    return self._optimizer_update(state, zeros), metrics

  def _sums_program(self, state: TrainState, batch: dict[str, jax.Array]):
    with parallel.activation_sharding(self.mesh, self.rules):
      return self._batch_sums(state.params, state.ref_params, batch)

  def _apply_program(self, state: TrainState, sums):
    with parallel.activation_sharding(self.mesh, self.rules):
      return self._apply(state, *sums)

  def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes, dtypes and shardings of a batch, for lowering without data."""
    B, T = self.train_cfg.batch_size, self.train_cfg.seq_len
    return {k: jax.ShapeDtypeStruct((B, T), dt, sharding=self.batch_shardings[k])
            for k, dt in BATCH_FIELDS.items()}

  def lower(self, state=None, batch=None):
    """Lowers the update for (abstract by default) state and batch."""
    state = self.abstract_state_sharded() if state is None else state
    return self._step.lower(state, self.abstract_batch() if batch is None else batch,
                            jnp.float32(0.0))

  def abstract_state_sharded(self) -> TrainState:
    """`abstract_state` with each leaf carrying its sharding."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        self.abstract_state(), self.state_shardings)

  def _put(self, batch: Mapping[str, Any], where: str = "Batch") -> dict[str, jax.Array]:
    """Checks one batch's fields and shapes and places it in its shardings."""
    B, T = self.train_cfg.batch_size, self.train_cfg.seq_len
    if self.train_cfg.width_bucket and "tokens" in batch:
      width = np.shape(batch["tokens"])[-1]
      if 0 < width <= T:  # a cut batch (train.width_bucket); other shapes fail below
        T = width
    arrays = {}
    for k, dt in BATCH_FIELDS.items():
      if k not in batch and k not in _ALWAYS + self.objective.required:
        # A field this objective does not read (e.g. advantages for SFT).
        arrays[k] = jax.device_put(jnp.full((B, T), _DEFAULTS.get(k, 0), dt),
                                   self.batch_shardings[k])
        continue
      if k not in batch:
        hint = (" (renamed from 'old_logps': the log-probs recorded when the tokens "
                "were sampled)" if k == "sampler_logps" and "old_logps" in batch else "")
        raise ValueError(f"{where} is missing field {k!r}{hint}; expected "
                         f"{sorted(BATCH_FIELDS)}.")
      x = batch[k]
      if k in PER_ROW_FIELDS and tuple(x.shape) == (B,):
        x = jnp.broadcast_to(jnp.asarray(x, dt)[:, None], (B, T))
      if tuple(x.shape) != (B, T):
        allowed = f"{(B, T)} or {(B,)}" if k in PER_ROW_FIELDS else f"{(B, T)}"
        cut = " or a width up to it" if self.train_cfg.width_bucket else ""
        raise ValueError(f"{where} field {k!r} has shape {tuple(x.shape)}; "
                         f"expected {allowed} (train.batch_size, train.seq_len{cut}).")
      arrays[k] = jax.device_put(jnp.asarray(x, dt), self.batch_shardings[k])
    return arrays

  @property
  def skips_zero_advantage(self) -> bool:
    """Whether rows with a zero advantage may be left out of the update exactly
    (`TrainConfig.skip_zero_advantage`): the "grpo" objective, no KL or entropy term
    (the only per-token terms a zero advantage does not zero), and an aggregation whose
    denominator is a sum over sequences known on the host (`loss.sequence_denominator`).
    """
    cfg = self.loss_cfg
    return (self.train_cfg.skip_zero_advantage and self.train_cfg.objective == "grpo"
            and cfg.kl_coef == 0 and cfg.entropy_coef == 0
            and loss_lib.sequence_denominator(cfg, 1) is not None)

  def step_without_rows(self, state: TrainState):
    """The update of a batch whose every row has a zero loss: a zero gradient, applied.

    With AdamW this is not a no-op (the moments decay, and their remaining momentum and
    the weight decay still move the weights), so it is what the forward and backward
    pass of those rows would have given, without running them.

    Returns:
      (new state, metrics "loss" 0, "grad_norm" 0 and `<role>_tokens` 0).
    """
    return self._no_rows(state)

  def step(self, state: TrainState,
           batch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
           extra_denom: float = 0.0):
    """Applies one optimizer update.

    Args:
      state: the train state (donated).
      batch: one batch, or a non-empty sequence of batches that together form
        the update (e.g. `selfplay.build_batches`). A batch holds numpy or jax
        arrays, every field of `BATCH_FIELDS` as [train.batch_size,
        train.seq_len]; `advantages`, `role` and `temperature` may also be
        [train.batch_size] (one sequence per row); a missing `temperature`
        is 1 (the untempered policy). Fields the objective does
        not require (`Objective.required`; "sft" requires only "tokens",
        "positions", "segment_ids" and "loss_mask") may be left out and are
        then zeros. Several batches give
        exactly the update of one batch holding all their rows: gradient,
        loss (sum, denominator) and metric sums are added over the batches
        before the single update. One batch runs as one fused program;
        several run one gradient program per batch (same shape, compiled
        once) and one update program.
      extra_denom: added to the loss denominator before the update: the share of rows
        left out because their loss is exactly zero (`skips_zero_advantage`,
        `loss.sequence_denominator`), so the step equals the one with them in.

    Returns:
      (new state, metrics): the objective's metrics ("grpo":
      `finalize_train_metrics`; "sft": `sft.finalize_sft_metrics`) plus
      "grad_norm" and, for an MoE model with `moe_capacity_factor` > 0,
      "moe_dropped_copies" (the (token, expert) copies the capacity dropped,
      over the MoE layers and all rows, padding included) and
      "moe_dropped_frac" (that over every routed copy).

    Raises:
      ValueError: for a missing field, a wrongly shaped field, or an empty
        sequence of batches.
    """
    if isinstance(batch, Mapping):
      arrays = self._put(batch)
      self.widths.add(arrays["tokens"].shape[1])
      return self._step(state, arrays, jnp.float32(extra_denom))
    batches = list(batch)
    if not batches:
      raise ValueError("Trainer.step got an empty sequence of batches; pass one batch "
                       "dict or a non-empty list of them.")
    n = len(batches)
    arrays = [self._put(b, f"Batch {i} of {n}") for i, b in enumerate(batches)]
    self.widths.update(a["tokens"].shape[1] for a in arrays)
    if n == 1:
      return self._step(state, arrays[0], jnp.float32(extra_denom))
    acc = self._sums(state, arrays[0])
    for a in arrays[1:]:
      acc = self._add(acc, self._sums(state, a))
    if extra_denom:
      acc = (acc[0], acc[1], acc[2] + jnp.float32(extra_denom), acc[3])
    return self._apply_sums(state, acc)


def _add_sums(a, b):
  """Adds two (grads, loss_sum, denom, metric_sums) tuples exactly."""
  return (jax.tree.map(jnp.add, a[0], b[0]), a[1] + b[1], a[2] + b[2],
          loss_lib.combine_metric_sums(a[3], b[3]))
