"""One train-state pytree and one pure, sharded, jitted GRPO update.

The batch is a dict of fixed-shape [B, T] arrays (see `BATCH_FIELDS`), so the
step compiles once per run. A row may pack several sequences (segment ids,
per-segment positions, per-token advantages and roles). Gradients are
accumulated over micro-batches as (sum, denominator) pairs, which makes any
split equal to the full batch. Log-probs are computed in sequence chunks
(`TrainConfig.logprob_chunk`), so [B, T, V] logits never exist.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import optax

from spade_jax import parallel
from spade_jax.models import ModelConfig, init_params, param_axes
from spade_jax.rl import loss as loss_lib
from spade_jax.rl.logprobs import chunked_token_logprobs
from spade_jax.rl.optimizer import OptimizerConfig, make_optimizer

# Batch fields and their dtypes; every field is [B, T]. `advantages` and `role`
# are per token (constant over each packed sequence); `Trainer.step` also
# accepts them as [B] (one sequence per row) and broadcasts.
BATCH_FIELDS = {
    "tokens": jnp.int32, "positions": jnp.int32, "segment_ids": jnp.int32,
    "loss_mask": jnp.bool_, "old_logps": jnp.float32, "advantages": jnp.float32,
    "role": jnp.int32,
}
ROLES = ("designer", "agent")
PER_ROW_FIELDS = ("advantages", "role")


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
  """

  batch_size: int = 8
  seq_len: int = 2048
  num_microbatches: int = 1
  logprob_chunk: int = 512

  def __post_init__(self):
    if self.logprob_chunk < 0:
      raise ValueError(f"train.logprob_chunk={self.logprob_chunk}; expected a "
                       "positive chunk length, or 0 for unchunked log-probs.")


class Trainer:
  """Builds the train state and the sharded update for a model on a mesh."""

  def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig,
               loss_cfg: loss_lib.LossConfig, opt_cfg: OptimizerConfig,
               mesh: Mesh, rules):
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
    self.state_shardings = self._state_shardings()
    self.batch_shardings = {k: parallel.batch_sharding(mesh, rules, 2)
                            for k in BATCH_FIELDS}
    self._step = jax.jit(self._update, in_shardings=(self.state_shardings,
                                                     self.batch_shardings),
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

  def with_params(self, state: TrainState, params) -> TrainState:
    """A fresh optimizer state around given parameters (e.g. imported weights)."""
    params = jax.device_put(params, self.state_shardings.params)
    return TrainState(step=jnp.int32(0), params=params,
                      opt_state=jax.jit(self.tx.init, out_shardings=
                                        self.state_shardings.opt_state)(params),
                      ref_params=params if self.loss_cfg.kl_coef else None)

  # -- update ----------------------------------------------------------------
  def _logps(self, params, mb):
    return chunked_token_logprobs(params, self.model_cfg, mb["tokens"],
                                  mb["positions"], mb["segment_ids"],
                                  self.train_cfg.logprob_chunk)

  def _micro_terms(self, params, ref_params, mb):
    logps = self._logps(params, mb)
    ref = None
    if self.loss_cfg.kl_coef:
      ref = jax.lax.stop_gradient(self._logps(ref_params, mb))
    loss_sum, denom, sums = loss_lib.grpo_loss_terms(
        logps, mb["old_logps"], mb["advantages"], mb["loss_mask"],
        ref_logps=ref, segment_ids=mb["segment_ids"], config=self.loss_cfg)
    mask = mb["loss_mask"] & (mb["segment_ids"] > 0)
    for r, name in enumerate(ROLES):
      sums[f"{name}_tokens"] = jnp.sum(mask & (mb["role"] == r))
    return loss_sum, (denom, sums)

  def _update(self, state: TrainState, batch: dict[str, jax.Array]):
    # Activations follow the same logical-axis rules as the parameters.
    with parallel.activation_sharding(self.mesh, self.rules):
      return self._update_body(state, batch)

  def _update_body(self, state: TrainState, batch: dict[str, jax.Array]):
    n = self.train_cfg.num_microbatches
    micro = jax.tree.map(lambda x: x.reshape(n, x.shape[0] // n, *x.shape[1:]), batch)
    grad_fn = jax.value_and_grad(self._micro_terms, has_aux=True)

    def body(carry, mb):
      g_acc, l_acc, d_acc, m_acc = carry
      (l, (d, m)), g = grad_fn(state.params, state.ref_params, mb)
      g_acc = jax.tree.map(jnp.add, g_acc, g)
      m_acc = m if m_acc is None else loss_lib.combine_metric_sums(m_acc, m)
      return (g_acc, l_acc + l, d_acc + d, m_acc), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    first = jax.tree.map(lambda x: x[0], micro)
    (l0, (d0, m0)), g0 = grad_fn(state.params, state.ref_params, first)
    carry = (jax.tree.map(jnp.add, zeros, g0), l0, d0, m0)
    if n > 1:
      rest = jax.tree.map(lambda x: x[1:], micro)
      carry, _ = jax.lax.scan(body, carry, rest)
    grads, loss_sum, denom, sums = carry
    scale = jnp.where(denom > 0, 1.0 / jnp.where(denom > 0, denom, 1.0), 0.0)
    grads = jax.tree.map(lambda g: g * scale, grads)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = loss_lib.finalize_metrics(sums)
    metrics.update({f"{r}_tokens": sums[f"{r}_tokens"] for r in ROLES})
    metrics["loss"] = loss_lib.finalize_loss(loss_sum, denom)
    metrics["grad_norm"] = optax.global_norm(grads)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics

  def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes, dtypes and shardings of a batch, for lowering without data."""
    B, T = self.train_cfg.batch_size, self.train_cfg.seq_len
    return {k: jax.ShapeDtypeStruct((B, T), dt, sharding=self.batch_shardings[k])
            for k, dt in BATCH_FIELDS.items()}

  def lower(self, state=None, batch=None):
    """Lowers the update for (abstract by default) state and batch."""
    state = self.abstract_state_sharded() if state is None else state
    return self._step.lower(state, self.abstract_batch() if batch is None else batch)

  def abstract_state_sharded(self) -> TrainState:
    """`abstract_state` with each leaf carrying its sharding."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        self.abstract_state(), self.state_shardings)

  def step(self, state: TrainState, batch: dict[str, Any]):
    """Applies one update.

    Args:
      state: the train state.
      batch: numpy or jax arrays, every field of `BATCH_FIELDS` as
        [train.batch_size, train.seq_len]; `advantages` and `role` may also be
        [train.batch_size] (one sequence per row).

    Returns:
      (new state, metrics).
    """
    B, T = self.train_cfg.batch_size, self.train_cfg.seq_len
    arrays = {}
    for k, dt in BATCH_FIELDS.items():
      if k not in batch:
        raise ValueError(f"Batch is missing field {k!r}; expected {sorted(BATCH_FIELDS)}.")
      x = batch[k]
      if k in PER_ROW_FIELDS and tuple(x.shape) == (B,):
        x = jnp.broadcast_to(jnp.asarray(x, dt)[:, None], (B, T))
      if tuple(x.shape) != (B, T):
        allowed = f"{(B, T)} or {(B,)}" if k in PER_ROW_FIELDS else f"{(B, T)}"
        raise ValueError(f"Batch field {k!r} has shape {tuple(x.shape)}; "
                         f"expected {allowed} (train.batch_size, train.seq_len).")
      arrays[k] = jax.device_put(jnp.asarray(x, dt), self.batch_shardings[k])
    return self._step(state, arrays)
