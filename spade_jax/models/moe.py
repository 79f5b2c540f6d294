"""Qwen3-MoE sparse MLP block: softmax top-k router and exact expert dispatch.

Tokens are routed to `num_experts_per_tok` experts each. Nothing is computed
for experts a token was not sent to and, by default, no token is dropped.

Global dispatch (no mesh, one device, or a layout the expert-parallel path
does not cover): the N*k (token, expert) assignments are sorted by expert so
every expert multiplies one contiguous run of rows. Two interchangeable
kernels do the grouped matmul:

- "ragged": `jax.lax.ragged_dot` over the sorted rows (native grouped matmul
  on TPU and GPU);
- "blocked": each expert's run is padded to a multiple of a block size, and a
  loop over blocks multiplies each block by its single expert's weights
  (skipping unused blocks). This is what CPUs run fast.

Expert-parallel dispatch (inside `parallel.activation_sharding` with the
batch split over devices): one `jax.shard_map` per MoE layer. Each device
routes only its own tokens; every token goes once to each expert shard that
holds one of its k experts (a dense `all_to_all` over the mesh axes of the
"expert" logical axis, with one slot per local token and shard, so nothing is
dropped), together with its local expert ids and routing weights; the shard
runs its experts on what it received, sums each token's copies and sends one
row per token back. Buffers are [E * N_local, D] (E expert shards), never
proportional to the global batch; the blocked kernel gathers each block's rows
inside its loop, so the received copies are not materialised. Each device
gets its shard's experts gathered over the other mesh axes (as FSDP gathers),
except that an expert width split over axes the tokens are not split over
stays split, the partial outputs summed by a `psum`.
`ModelConfig.moe_capacity_factor` > 0 caps the slots per shard and drops
(and counts) the overflow.

Einsum letters: N tokens, A assignments (N * k), D d_model, F expert width,
X experts, B batch, T length, L layers; E expert shards, S = E * C slots.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from absl import logging
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from spade_jax.models.config import ModelConfig
from spade_jax.parallel.mesh import active_sharding, constrain, logical_to_spec


def route(h: jax.Array, router: jax.Array, cfg: ModelConfig):
  """Softmax top-k routing.

  Args:
    h: [N, D] normalised hidden states (compute dtype).
    router: [D, X] router weights.

  Returns:
    (logits [N, X] in compute dtype, weights [N, k] compute dtype, ids [N, k]).
  """
  logits = jnp.einsum("nd,dx->nx", h, router.astype(h.dtype))
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  top, ids = jax.lax.top_k(probs, cfg.num_experts_per_tok)
  if cfg.norm_topk_prob:
    top = top / jnp.sum(top, axis=-1, keepdims=True)
  return logits, top.astype(h.dtype), ids


def _block_size(assignments: int, experts: int) -> int:
  """Rows per block: about one block per expert when assignments are few."""
  per_expert = max(1, -(-assignments // experts))
  return int(min(128, max(8, 1 << (per_expert - 1).bit_length())))


def _swiglu(x, wg, wu, wd):
  """x: [R, D]; wg, wu: [D, F]; wd: [F, D] -> [R, D]."""
  g = jnp.einsum("rd,df->rf", x, wg)
  u = jnp.einsum("rd,df->rf", x, wu)
  return jnp.einsum("rf,fd->rd", jax.nn.silu(g) * u, wd)


def _experts_blocked(xs, expert_sorted, group_sizes, wg, wu, wd):
  """xs: [A, D] rows sorted by expert; expert_sorted: [A]; group_sizes: [X]."""
  A, D = xs.shape
  X = group_sizes.shape[0]
  b = _block_size(A, X)
  padded = (group_sizes + b - 1) // b * b
  pend = jnp.cumsum(padded)
  pstart = pend - padded
  gstart = jnp.cumsum(group_sizes) - group_sizes
  # Blocks in use <= sum_e ceil(g_e / b) <= (A + min(X, A) * (b - 1)) / b, and <= A.
  nb = max(1, min(A, (A + min(X, A) * (b - 1)) // b))
  dest = pstart[expert_sorted] + jnp.arange(A) - gstart[expert_sorted]
  buf = jnp.zeros((nb * b, D), xs.dtype).at[dest].set(xs)
  starts = jnp.arange(nb) * b
  block_expert = jnp.minimum(jnp.searchsorted(pend, starts, side="right"), X - 1)
  used = starts < pend[-1]

  def one(args):
    xb, e, u = args
    run = lambda: _swiglu(xb, wg[e], wu[e], wd[e])
    return jax.lax.cond(u, run, lambda: jnp.zeros_like(xb))

  out = jax.lax.map(one, (buf.reshape(nb, b, D), block_expert, used))
  return out.reshape(nb * b, D)[dest]


def _experts_ragged(xs, group_sizes, wg, wu, wd):
  """xs: [A, D] rows sorted by expert; group_sizes: [X] -> [A, D]."""
  g = jax.lax.ragged_dot(xs, wg, group_sizes)
  u = jax.lax.ragged_dot(xs, wu, group_sizes)
  return jax.lax.ragged_dot(jax.nn.silu(g) * u, wd, group_sizes)


def _resolve_impl(cfg: ModelConfig) -> str:
  if cfg.moe_impl == "auto":
    return "blocked" if jax.default_backend() == "cpu" else "ragged"
  return cfg.moe_impl


def _global_dispatch(x, router, wg, wu, wd, cfg: ModelConfig):
  """Sorted dispatch over every token given. x: [N, D] -> ([N, D], logits [N, X])."""
  N, D = x.shape
  k = cfg.num_experts_per_tok
  logits, weights, ids = route(x, router, cfg)
  flat = ids.reshape(-1)                                   # [A]
  order = jnp.argsort(flat, stable=True)
  token = order // k
  expert_sorted = flat[order]
  group_sizes = jnp.bincount(flat, length=cfg.num_experts).astype(jnp.int32)
  xs = x[token]
  if _resolve_impl(cfg) == "ragged":
    ys = _experts_ragged(xs, group_sizes, wg, wu, wd)
  else:
    ys = _experts_blocked(xs, expert_sorted, group_sizes, wg, wu, wd)
  ys = ys * weights.reshape(-1)[order][:, None]
  return jnp.zeros((N, D), x.dtype).at[token].add(ys), logits


# -- expert-parallel dispatch -------------------------------------------------

def _names(entry) -> tuple[str, ...]:
  """Mesh axis names of one PartitionSpec entry."""
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def _entry(names: tuple[str, ...]):
  """PartitionSpec entry for mesh axes `names` (None when empty)."""
  return None if not names else names[0] if len(names) == 1 else names


@dataclasses.dataclass(frozen=True)
class _Layout:
  """How one MoE layer is split for the expert-parallel dispatch.

  Attributes:
    mesh: the active mesh.
    tokens: PartitionSpec of [B, T, *] activations (batch / length split).
    token_axes: mesh axes the tokens are split over.
    experts: mesh axes the experts are split over (a subset of token_axes).
    width: mesh axes the expert width F is split over (disjoint from
      token_axes: each of those devices holds the same tokens).
    shards: number of expert shards E (product of the `experts` axis sizes).
  """

  mesh: Mesh
  tokens: P
  token_axes: tuple[str, ...]
  experts: tuple[str, ...]
  width: tuple[str, ...]
  shards: int


def _expert_parallel_layout(h_shape, w_shape, cfg: ModelConfig) -> _Layout | None:
  """The layout of the active sharding context, or None for the global dispatch.

  Args:
    h_shape: (B, T, D) of the layer input.
    w_shape: (X, D, F) of one expert projection.
  """
  active = active_sharding()
  if active is None:
    return None
  mesh, rules = active
  tok = logical_to_spec(("batch", "length", None), h_shape, mesh, rules)
  token_axes = _names(tok[0]) + _names(tok[1])
  if not token_axes:
    return None  # tokens replicated (one device, or B not divisible): nothing to split
  w = logical_to_spec(("expert", "embed", "moe_mlp"), w_shape, mesh, rules)
  experts, width = _names(w[0]), _names(w[2])
  if not set(experts) <= set(token_axes):
    logging.log_first_n(
        logging.WARNING, "MoE: experts are split over mesh axes %s but tokens only over "
        "%s; using the global dispatch (every device routes the whole batch). Put the "
        "expert axes in the 'batch' rule to get the expert-parallel dispatch.", 1,
        experts, token_axes)
    return None
  if set(width) & set(token_axes):
    width = ()  # devices along these axes hold different tokens: gather F instead
  shards = math.prod(mesh.shape[a] for a in experts)
  return _Layout(mesh, P(tok[0], tok[1], None), token_axes, experts, width, shards)


def _capacity(tokens: int, k: int, shards: int, factor: float) -> int:
  """Slots per expert shard: all `tokens` (exact) or ceil(factor * tokens * k / shards)."""
  if factor <= 0:
    return tokens
  return int(min(tokens, max(1, math.ceil(factor * tokens * k / shards))))


def _exchange(a: jax.Array, axes: tuple[str, ...], shards: int) -> jax.Array:
  """[E * C, ...] -> [E * C, ...]: slot block e goes to expert shard e (all-to-all)."""
  if shards == 1:
    return a
  blocks = a.reshape(shards, a.shape[0] // shards, *a.shape[1:])
  out = jax.lax.all_to_all(blocks, _entry(axes), 0, 0, tiled=True)
  return out.reshape(a.shape)


def _vary(a: jax.Array, axes) -> jax.Array:
  """`a` marked as varying over mesh `axes` (inside shard_map; else a no-op)."""
  missing = tuple(sorted(n for n in set(axes)
                         if n not in jax.typeof(a).manual_axis_type.varying))
  return jax.lax.pcast(a, missing, to="varying") if missing else a


def _zeros(shape, dtype, *like: jax.Array) -> jax.Array:
  """Zeros varying over every mesh axis any of `like` varies over."""
  axes = set().union(*(jax.typeof(a).manual_axis_type.varying for a in like))
  return _vary(jnp.zeros(shape, dtype), axes)


def _experts_gathered(xr, lid, wt, wg, wu, wd, impl: str, block: int):
  """Local experts on received tokens, each token's copies summed.

  Args:
    xr: [R, D] received token rows.
    lid: [R, k] local expert of each copy; X_local marks "not for this shard".
    wt: [R, k] routing weight of each copy (0 where lid is X_local).
    wg, wu: [X_local, D, F]; wd: [X_local, F, D] this shard's experts.
    impl: "blocked" (loop over row blocks, rows gathered per block: memory
      O(R * D) plus index tables) or "ragged" (`ragged_dot` over the sorted
      copies, materialised: O(R * min(k, X_local) * D)).
    block: rows per block of the blocked loop.

  Returns:
    [R, D]: sum over copies of weight * expert(row).
  """
  R, D = xr.shape
  k = lid.shape[1]
  Xl = wg.shape[0]
  M = R * min(k, Xl)                     # most copies one shard can receive
  key = lid.reshape(-1)
  order = jnp.argsort(key, stable=True)[:M]   # this shard's copies first, by expert
  e_sorted = key[order]
  valid = e_sorted < Xl
  rows = jnp.where(valid, order // k, R)      # R = no row
  w_sorted = jnp.where(valid, wt.reshape(-1)[order], 0)
  gs = jnp.zeros((Xl,), jnp.int32).at[key].add(1, mode="drop")
  if impl == "ragged":
    xs = xr.at[rows].get(mode="fill", fill_value=0)
    ys = _experts_ragged(xs, gs, wg, wu, wd)
    ys = jnp.where(valid[:, None], ys * w_sorted[:, None], 0)
    return jnp.zeros_like(xr).at[rows].add(ys, mode="drop")
  b = block
  nb = max(1, min(M, (M + min(Xl, M) * (b - 1)) // b))
  padded = (gs + b - 1) // b * b
  pend = jnp.cumsum(padded)
  pstart = pend - padded
  gstart = jnp.cumsum(gs) - gs
  ec = jnp.minimum(e_sorted, Xl - 1)
  i = jnp.arange(M)
  dest = jnp.where(valid, pstart[ec] + i - gstart[ec], nb * b)
  src = jnp.full((nb * b,), M, jnp.int32).at[dest].set(i, mode="drop")
  row_tab = rows.at[src].get(mode="fill", fill_value=R).reshape(nb, b)
  w_tab = w_sorted.at[src].get(mode="fill", fill_value=0).reshape(nb, b)
  starts = jnp.arange(nb) * b
  block_expert = jnp.minimum(jnp.searchsorted(pend, starts, side="right"), Xl - 1)
  used = starts < pend[-1]

  # Checkpointed so the backward keeps only each block's indices, not its
  # gathered rows and activations (the loop runs over the worst-case block count).
  @jax.checkpoint
  def one(xr, wg, wu, wd, r, w, e, u):
    def run():
      xb = xr.at[r].get(mode="fill", fill_value=0)
      return _swiglu(xb, wg[e], wu[e], wd[e]) * w[:, None]
    return jax.lax.cond(u, run, lambda: _zeros((b, D), xr.dtype, xr, wg, wu, wd, w))

  def body(acc, blk):
    r, w, e, u = blk
    return acc.at[r].add(one(xr, wg, wu, wd, r, w, e, u), mode="drop"), None

  acc0 = _zeros(xr.shape, xr.dtype, xr, wg, wu, wd, w_tab)
  acc, _ = jax.lax.scan(body, acc0, (row_tab, w_tab, block_expert, used))
  return acc


def _local_dispatch(h, router, wg, wu, wd, *, cfg: ModelConfig, layout: _Layout):
  """One device's part of the expert-parallel dispatch (runs under shard_map).

  Args:
    h: [b, t, D] this device's tokens.
    router: [D, X] the whole router.
    wg, wu: [X / E, D, F'] and wd: [X / E, F', D]: this shard's experts (F'
      = F / width shards).

  Returns:
    (out [b, t, D], router logits [b, t, X], dropped copies summed over the
    token axes: a scalar int32).
  """
  # Weights arrive invariant over the token axes (and the router over all
  # axes). Mark them varying here, once: otherwise the implicit cast sits
  # where they meet the tokens, inside the expert loop's `cond`, and its
  # transpose (a psum of the weight gradient) would run per used block, a
  # different number of times on each device.
  router = _vary(router, layout.token_axes)
  wg, wu, wd = (_vary(a, layout.token_axes) for a in (wg, wu, wd))
  b_, t_, D = h.shape
  N = b_ * t_
  k, X, E = cfg.num_experts_per_tok, cfg.num_experts, layout.shards
  Xl = X // E
  x = h.reshape(N, D)
  logits, w, ids = route(x, router, cfg)
  on = (ids // Xl)[:, :, None] == jnp.arange(E)               # [N, k, E]
  copies = jnp.sum(on, axis=1, dtype=jnp.int32)               # [N, E]
  pos = jnp.cumsum(copies > 0, axis=0, dtype=jnp.int32) - 1   # slot of token n at shard e
  cap = _capacity(N, k, E, cfg.moe_capacity_factor)
  keep = (copies > 0) & (pos < cap)
  dropped = jnp.sum(jnp.where(keep, 0, copies))
  slot = jnp.where(keep, jnp.arange(E) * cap + pos, E * cap)  # [N, E]; E * C = none
  token_of = jnp.full((E * cap,), N, jnp.int32).at[slot.reshape(-1)].set(
      jnp.repeat(jnp.arange(N, dtype=jnp.int32), E), mode="drop")   # [S]; N = empty
  # Per slot, the local expert and routing weight of each of its token's k copies.
  pick = token_of * E + jnp.arange(E * cap) // cap            # row of [N * E]
  lid = jnp.where(on, (ids % Xl)[:, :, None], Xl).transpose(0, 2, 1).reshape(N * E, k)
  wt = jnp.where(on, w[:, :, None], 0).transpose(0, 2, 1).reshape(N * E, k)
  send = (x.at[token_of].get(mode="fill", fill_value=0),
          lid.at[pick].get(mode="fill", fill_value=Xl),
          wt.at[pick].get(mode="fill", fill_value=0))
  xr, lr, wr = (_exchange(a, layout.experts, E) for a in send)
  y = _experts_gathered(xr, lr, wr, wg, wu, wd, _resolve_impl(cfg),
                        _block_size(N * k, Xl))
  if layout.width:
    y = jax.lax.psum(y, _entry(layout.width))
  back = _exchange(y, layout.experts, E)
  out = jnp.zeros((N, D), h.dtype).at[token_of].add(back, mode="drop")
  dropped = jax.lax.psum(dropped, _entry(layout.token_axes))
  return out.reshape(b_, t_, D), logits.reshape(b_, t_, X), dropped


def moe_mlp(h: jax.Array, mp: dict[str, jax.Array], cfg: ModelConfig, *,
            return_dropped: bool = False):
  """Sparse MoE MLP.

  Inside `parallel.activation_sharding` with the batch split over devices
  (and the "expert" rule's mesh axes among the batch's), each device
  dispatches its own tokens and the experts are reached by all-to-all (see
  the module docstring); otherwise every device sorts all tokens.

  Args:
    h: [B, T, D] normalised hidden states.
    mp: one layer's {"router": [D, X], "gate", "up": [X, D, F], "down": [X, F, D]}.
    cfg: model config (experts, top-k, `moe_impl`, `moe_capacity_factor`).
    return_dropped: also return the number of (token, expert) copies dropped
      by `moe_capacity_factor` (int32 scalar; always 0 by default).

  Returns:
    (out [B, T, D], router logits [B, T, X]) and, when asked, the dropped count.
  """
  B, T, D = h.shape
  dt = h.dtype
  X = cfg.num_experts
  wg, wu, wd = (mp[n].astype(dt) for n in ("gate", "up", "down"))
  layout = _expert_parallel_layout(h.shape, wg.shape, cfg)
  if layout is None:
    out, logits = _global_dispatch(h.reshape(B * T, D), mp["router"], wg, wu, wd, cfg)
    out, logits, dropped = out.reshape(B, T, D), logits.reshape(B, T, X), jnp.int32(0)
  else:
    ex, fw = _entry(layout.experts), _entry(layout.width)
    fn = functools.partial(_local_dispatch, cfg=cfg, layout=layout)
    out, logits, dropped = jax.shard_map(
        fn, mesh=layout.mesh,
        in_specs=(layout.tokens, P(), P(ex, None, fw), P(ex, None, fw), P(ex, fw, None)),
        out_specs=(layout.tokens, layout.tokens, P()))(h, mp["router"], wg, wu, wd)
  out = constrain(out, ("batch", "length", "embed"))
  if return_dropped:
    return out, logits, dropped
  return out, logits


def load_balancing_loss(router_logits: jax.Array, cfg: ModelConfig,
                        mask: jax.Array | None = None) -> jax.Array:
  """Switch-style auxiliary loss, as HF `load_balancing_loss_func`.

  Args:
    router_logits: [L, B, T, X] from `forward(..., return_router_logits=True)`.
    cfg: model config (experts, top-k).
    mask: optional [B, T] bool/int, nonzero for real tokens.

  Returns:
    Scalar float32: X * sum_x(fraction routed to x * mean router prob of x),
    both averaged over layers and unmasked tokens.
  """
  L, B, T, X = router_logits.shape
  probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
  _, ids = jax.lax.top_k(probs, cfg.num_experts_per_tok)
  m = (jnp.ones((B, T), jnp.float32) if mask is None
       else (mask != 0).astype(jnp.float32))
  w = jnp.broadcast_to(m[None, :, :, None], ids.shape)
  counts = jnp.zeros((X,), jnp.float32).at[ids.reshape(-1)].add(w.reshape(-1))
  prob_sum = jnp.einsum("lbtx,bt->x", probs, m)
  rows = L * jnp.sum(m)
  return X * jnp.sum((counts / rows) * (prob_sum / rows))
