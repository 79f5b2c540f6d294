"""Qwen3-MoE sparse MLP block: softmax top-k router and exact expert dispatch.

Tokens are routed to `num_experts_per_tok` experts each. The N*k (token,
expert) assignments are sorted by expert so every expert multiplies one
contiguous run of rows; nothing is computed for experts a token was not sent
to and no token is dropped. Two interchangeable kernels do the grouped matmul:

- "ragged": `jax.lax.ragged_dot` over the sorted rows (native grouped matmul
  on TPU and GPU);
- "blocked": each expert's run is padded to a multiple of a block size, and a
  loop over blocks multiplies each block by its single expert's weights
  (skipping unused blocks). This is what CPUs run fast.

Einsum letters: N tokens, A assignments (N * k), D d_model, F expert width,
X experts, B batch, T length, L layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spade_jax.models.config import ModelConfig
from spade_jax.parallel import constrain


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


def moe_mlp(h: jax.Array, mp: dict[str, jax.Array], cfg: ModelConfig):
  """Sparse MoE MLP.

  Args:
    h: [B, T, D] normalised hidden states.
    mp: one layer's {"router": [D, X], "gate", "up": [X, D, F], "down": [X, F, D]}.

  Returns:
    (out [B, T, D], router logits [B, T, X]).
  """
  B, T, D = h.shape
  dt = h.dtype
  k = cfg.num_experts_per_tok
  X = cfg.num_experts
  x = h.reshape(B * T, D)
  logits, weights, ids = route(x, mp["router"], cfg)
  flat = ids.reshape(-1)                                   # [A]
  order = jnp.argsort(flat, stable=True)
  token = order // k
  expert_sorted = flat[order]
  group_sizes = jnp.bincount(flat, length=X).astype(jnp.int32)
  xs = x[token]
  wg, wu, wd = (mp[n].astype(dt) for n in ("gate", "up", "down"))
  impl = cfg.moe_impl
  if impl == "auto":
    impl = "blocked" if jax.default_backend() == "cpu" else "ragged"
  if impl == "ragged":
    ys = _experts_ragged(xs, group_sizes, wg, wu, wd)
  else:
    ys = _experts_blocked(xs, expert_sorted, group_sizes, wg, wu, wd)
  ys = ys * weights.reshape(-1)[order][:, None]
  out = jnp.zeros((B * T, D), dt).at[token].add(ys)
  out = constrain(out.reshape(B, T, D), ("batch", "length", "embed"))
  return out, logits.reshape(B, T, X)


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
