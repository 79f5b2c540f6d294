"""Qwen3 / Qwen3-MoE / Llama decoder as pure functions over a parameter pytree.

Llama is the dense Qwen3 layer without the per-head query/key RMSNorm
(`ModelConfig.qk_norm=False`: no `q_norm` / `k_norm` parameters); everything
else, RoPE included, is shared.

Parameters are a plain nested dict. Per-layer weights are stacked on a leading
`layers` axis, in three stacks:

- `layers`: attention and norms of every layer, [L, ...] (`q_norm` / `k_norm`
  only with `cfg.qk_norm`);
- `mlp`: dense SwiGLU weights of the dense layers only, [L_dense, ...];
- `moe`: router and expert weights of the MoE layers only, [L_moe, ...].

Which layer is MoE follows HF Qwen3-MoE (`decoder_sparse_step`,
`mlp_only_layers`). The forward pass splits the layer sequence into segments
(`layer_segments`): a periodic pattern (all dense, all MoE, or e.g. dense/MoE
alternating) is one segment whose period of layers is the body of one
`lax.scan`; irregular placements fall back to one scan per run of equal
layers. Compile time therefore does not grow with depth for every published
configuration. `param_axes` returns the matching tree of logical axis names
that `spade_jax.parallel` maps to mesh axes.

Attention kernels and the KV cache live in `attention` (chosen by name with
`ModelConfig.attention` / `decode_attention`); the feature-major CPU decode
step that reuses this module's norms and RoPE is in `decode`.

Einsum letters used throughout: B batch, T query length, S key length,
D d_model, H query heads, K kv heads, G query heads per kv head, E head_dim,
F mlp width, V vocab, L layers, X experts.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from spade_jax.models.attention import ATTENTION, DECODE_ATTENTION
from spade_jax.models.cache import write_cache
from spade_jax.models.config import ModelConfig
from spade_jax.models.moe import moe_mlp
from spade_jax.parallel import constrain

Params = dict[str, Any]
_REMAT = {
    "full": None,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def param_axes(cfg: ModelConfig) -> Params:
  """Logical axis names for every parameter, same tree as `init_params`."""
  axes: Params = {
      "embed": ("vocab", "embed"),
      "layers": {
          "attn_norm": ("layers", "norm"),
          "q": ("layers", "embed", "heads", "head_dim"),
          "k": ("layers", "embed", "kv_heads", "head_dim"),
          "v": ("layers", "embed", "kv_heads", "head_dim"),
          "o": ("layers", "heads", "head_dim", "embed"),
          "q_norm": ("layers", "norm"),
          "k_norm": ("layers", "norm"),
          "mlp_norm": ("layers", "norm"),
      },
      "final_norm": ("norm",),
  }
  if not cfg.qk_norm:
    del axes["layers"]["q_norm"], axes["layers"]["k_norm"]
  if cfg.num_dense_layers:
    axes["mlp"] = {"gate": ("layers", "embed", "mlp"),
                   "up": ("layers", "embed", "mlp"),
                   "down": ("layers", "mlp", "embed")}
  if cfg.num_moe_layers:
    axes["moe"] = {"router": ("layers", "embed", "router"),
                   "gate": ("layers", "expert", "embed", "moe_mlp"),
                   "up": ("layers", "expert", "embed", "moe_mlp"),
                   "down": ("layers", "expert", "moe_mlp", "embed")}
  if not cfg.tie_embeddings:
    axes["lm_head"] = ("vocab", "embed")
  return axes


def param_shapes(cfg: ModelConfig) -> Params:
  """Shapes of every parameter, same tree as `init_params`."""
  L, D, H, K, E, V = (cfg.num_layers, cfg.d_model, cfg.num_heads,
                      cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size)
  shapes: Params = {
      "embed": (V, D),
      "layers": {
          "attn_norm": (L, D), "q": (L, D, H, E), "k": (L, D, K, E),
          "v": (L, D, K, E), "o": (L, H, E, D), "q_norm": (L, E),
          "k_norm": (L, E), "mlp_norm": (L, D),
      },
      "final_norm": (D,),
  }
  if not cfg.qk_norm:
    del shapes["layers"]["q_norm"], shapes["layers"]["k_norm"]
  Ld, Lm, F, X, Fm = (cfg.num_dense_layers, cfg.num_moe_layers, cfg.mlp_dim,
                      cfg.num_experts, cfg.moe_mlp_dim)
  if Ld:
    shapes["mlp"] = {"gate": (Ld, D, F), "up": (Ld, D, F), "down": (Ld, F, D)}
  if Lm:
    shapes["moe"] = {"router": (Lm, D, X), "gate": (Lm, X, D, Fm),
                     "up": (Lm, X, D, Fm), "down": (Lm, X, Fm, D)}
  if not cfg.tie_embeddings:
    shapes["lm_head"] = (V, D)
  return shapes


def num_params(cfg: ModelConfig) -> int:
  """Total parameter count (tied embeddings counted once)."""
  return sum(math.prod(s) for s in jax.tree.leaves(
      param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple)))


def init_params(key: jax.Array, cfg: ModelConfig) -> Params:
  """Random parameters (normal, std 0.02; norms at one)."""
  shapes = param_shapes(cfg)
  is_leaf = lambda x: isinstance(x, tuple)
  flat, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=is_leaf)
  keys = jax.random.split(key, len(flat))
  dtype = jnp.dtype(cfg.param_dtype)
  out = []
  for (path, shape), k in zip(flat, keys):
    if "norm" in jax.tree_util.keystr(path):
      out.append(jnp.ones(shape, dtype))
    else:
      out.append((0.02 * jax.random.normal(k, shape, jnp.float32)).astype(dtype))
  return jax.tree.unflatten(treedef, out)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, axis: int = -1) -> jax.Array:
  """RMSNorm over `axis` (default the last), computed in float32; `scale`
  runs along that axis."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=axis, keepdims=True) + eps)
  shape = [1] * x.ndim
  shape[axis] = -1
  return (y * scale.astype(jnp.float32).reshape(shape)).astype(x.dtype)


def rope_tables(positions: jax.Array, E: int, theta: float):
  """cos, sin tables [..., E] (half-rotation layout) for positions [...]."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, E, 2, dtype=jnp.float32) / E))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [..., E/2]
  return (jnp.concatenate([jnp.cos(angles)] * 2, axis=-1),
          jnp.concatenate([jnp.sin(angles)] * 2, axis=-1))


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, axis: int = -1) -> jax.Array:
  """Rotates x's halves along `axis` (the head dim) by tables broadcasting to x."""
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=axis)
  rotated = jnp.concatenate([-x2, x1], axis=axis)
  return (x32 * cos + rotated * sin).astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding (half-rotation layout). x: [B, T, N, E]; positions: [B, T]."""
  cos, sin = rope_tables(positions, x.shape[-1], theta)
  return apply_rope(x, cos[:, :, None, :], sin[:, :, None, :])


def _attention_block(x, lp, positions, mask, cache_kv, cache_index, cfg: ModelConfig,
                     attend_len: int | None = None, live_len=None, write_mask=None):
  """Pre-norm attention with residual.

  Args:
    x: [B, T, D].
    cache_kv: None, or (k_all, v_all, layer) as for `cache.write_cache`.

  Returns:
    (x [B, T, D], None or the updated (k_all, v_all)).
  """
  dt = cfg.dtype
  h = rms_norm(x, lp["attn_norm"], cfg.rms_eps)
  q = jnp.einsum("btd,dhe->bthe", h, lp["q"].astype(dt))
  k = jnp.einsum("btd,dke->btke", h, lp["k"].astype(dt))
  v = jnp.einsum("btd,dke->btke", h, lp["v"].astype(dt))
  q = constrain(q, ("batch", "length", "heads", "head_dim"))
  k = constrain(k, ("batch", "length", "kv_heads", "head_dim"))
  v = constrain(v, ("batch", "length", "kv_heads", "head_dim"))
  if cfg.qk_norm:
    q = rms_norm(q, lp["q_norm"], cfg.rms_eps)
    k = rms_norm(k, lp["k_norm"], cfg.rms_eps)
  q = rope(q, positions, cfg.rope_theta)
  k = rope(k, positions, cfg.rope_theta)
  k = jnp.transpose(k, (0, 2, 3, 1))  # [B, K, E, T]
  v = jnp.swapaxes(v, 1, 2)  # [B, K, T, E]
  if cache_kv is not None:
    # Write only this chunk into the cache (in place under donation), then
    # attend over the cache (its first `attend_len` entries, or its live
    # blocks when decoding with `live_len`).
    k, v, cache_kv = write_cache(cache_kv, k, v, cache_index, write_mask)
    if attend_len is not None and attend_len < v.shape[2]:
      k, v = k[..., :attend_len], v[:, :, :attend_len]
  if live_len is not None and q.shape[1] == 1:
    attn = DECODE_ATTENTION[cfg.decode_attention](q, k, v, mask, live_len).astype(dt)
  else:
    attn = ATTENTION[cfg.attention](q, k.astype(dt), v.astype(dt), mask)
  x = x + jnp.einsum("bthe,hed->btd", attn, lp["o"].astype(dt))
  return constrain(x, ("batch", "length", "embed")), cache_kv


def _dense_mlp(h, mp, cfg: ModelConfig):
  """SwiGLU MLP. h: [B, T, D] -> [B, T, D].

  `cfg.mlp_grad` picks its backward pass: "autodiff" differentiates the
  forward below; "manual" runs the same forward under `gated_mlp`'s
  hand-written VJP.
  """
  dt = cfg.dtype
  wg, wu, wd = (mp[k].astype(dt) for k in ("gate", "up", "down"))
  if cfg.mlp_grad == "manual":
    return gated_mlp(h, wg, wu, wd)
  return _gated_mlp_forward(h, wg, wu, wd)


def _gated_mlp_forward(h, wg, wu, wd):
  return _gated_mlp_fwd(h, wg, wu, wd)[0]


@jax.custom_vjp
def gated_mlp(h, wg, wu, wd):
  """`down(silu(h @ wg) * (h @ wu))` with a hand-written backward pass.

  The forward is exactly the autodiff path's. The backward writes the silu
  derivative out (`s * (1 + g * (1 - s))`, s = sigmoid(g)) and forms each
  weight gradient as one flattened [tokens, in]^T @ [tokens, out] product;
  XLA:CPU's transpose of autodiff's [B, T, F] cotangents into the layout its
  weight-gradient matmul wants is then not written out at every layer
  (experiments/benchmarks/mlp_vjp.py times both).

  Args:
    h: [B, T, D] normalised input.
    wg, wu: [D, F] gate and up projections.
    wd: [F, D] down projection.

  Returns:
    [B, T, D].
  """
  return _gated_mlp_forward(h, wg, wu, wd)


def _gated_mlp_fwd(h, wg, wu, wd):
  gate = jnp.einsum("btd,df->btf", h, wg)
  up = jnp.einsum("btd,df->btf", h, wu)
  act = constrain(jax.nn.silu(gate) * up, ("batch", "length", "mlp"))
  out = jnp.einsum("btf,fd->btd", act, wd)
  return out, (h, gate, up, wg, wu, wd)


def _gated_mlp_bwd(res, dout):
  h, gate, up, wg, wu, wd = res
  B, T, D = h.shape
  F = gate.shape[-1]
  names = ("batch", "length", "mlp")
  sig = jax.nn.sigmoid(gate)
  silu = gate * sig
  act = silu * up
  d_act = constrain(jnp.einsum("btd,fd->btf", dout, wd), names)
  d_up = constrain(d_act * silu, names)
  d_gate = constrain(d_act * up * (sig * (1 + gate * (1 - sig))), names)
  dh = (jnp.einsum("btf,df->btd", d_gate, wg)
        + jnp.einsum("btf,df->btd", d_up, wu))
  dh = constrain(dh, ("batch", "length", "embed"))
  flat = lambda x: x.reshape(B * T, x.shape[-1])
  h2, act2 = flat(h), flat(act)
  d_wd = jnp.dot(act2.T, flat(dout)).reshape(F, D)
  d_wg = jnp.dot(h2.T, flat(d_gate))
  d_wu = jnp.dot(h2.T, flat(d_up))
  return dh, d_wg.astype(wg.dtype), d_wu.astype(wu.dtype), d_wd.astype(wd.dtype)


gated_mlp.defvjp(_gated_mlp_fwd, _gated_mlp_bwd)


def layer_segments(cfg: ModelConfig) -> list[tuple[tuple[bool, ...], int]]:
  """Splits the layer kinds (True = MoE) into (pattern, repeats) segments.

  A sequence with a short period (<= 4 layers) is one segment; otherwise each
  run of equal layers is its own segment.
  """
  kinds = cfg.layer_is_moe
  L = len(kinds)
  for p in range(1, min(4, L) + 1):
    if L % p == 0 and kinds == kinds[:p] * (L // p):
      return [(kinds[:p], L // p)]
  segs: list[tuple[tuple[bool, ...], int]] = []
  for kind in kinds:
    if segs and segs[-1][0] == (kind,):
      segs[-1] = ((kind,), segs[-1][1] + 1)
    else:
      segs.append(((kind,), 1))
  return segs


def _group(tree, start: int, repeats: int, per: int):
  """Slices [start, start + repeats * per) of every stacked leaf -> [R, per, ...]."""
  return jax.tree.map(
      lambda a: a[start:start + repeats * per].reshape(repeats, per, *a.shape[1:]),
      tree)


def forward(params: Params, cfg: ModelConfig, tokens: jax.Array,
            positions: jax.Array, mask: jax.Array,
            cache: dict[str, jax.Array] | None = None,
            cache_index: jax.Array | int = 0,
            return_hidden: bool = False,
            return_router_logits: bool = False,
            attend_len: int | None = None,
            live_len: jax.Array | None = None,
            write_mask: jax.Array | None = None,
            return_moe_dropped: bool = False):
  """Runs the decoder.

  Args:
    params: parameter tree from `init_params`.
    cfg: model config.
    tokens: [B, T] int token ids.
    positions: [B, T] int RoPE positions.
    mask: [B, T, S] bool, True where query t may attend to key s. Without a
      cache S == T; with a cache S is the cache length.
    cache: optional {"k", "v"} from `cache.init_cache`: keys stacked
      [L, B, K, E, S] and values [L, B, K, S, E], or tuples of L per-layer
      buffers (the layers then run unrolled). The chunk's keys/values are
      written at `cache_index` along S before attending.
    cache_index: start index of this chunk in the cache: a scalar, or [B] (one
      per row, see `cache.write_cache`).
    write_mask: optional [B, T] bool with a per-row `cache_index`: chunk entries
      not written to the cache (see `cache.write_cache`).
    return_hidden: return final hidden states [B, T, D] instead of logits.
    return_router_logits: also return the MoE router logits
      [L_moe, B, T, X] (for `load_balancing_loss`) as a third output.
    attend_len: static; attend only over cache entries [0, attend_len) (the
      caller guarantees none after it is visible). `mask` is then
      [B, T, attend_len].
    live_len: optional scalar (decode, T == 1): no cache entry at or after it
      is visible; attention then runs `cfg.decode_attention`, which reads
      only the live blocks of a long cache. Otherwise `cfg.attention` runs.
    return_moe_dropped: also return, last, the (token, expert) copies that
      `cfg.moe_capacity_factor` dropped, summed over the MoE layers (int32
      scalar; 0 without a capacity factor or an expert-parallel layout).

  Returns:
    (logits [B, T, V] float32 (or hidden [B, T, D]), updated cache or None)
    and, when requested, router logits, then the dropped count.
  """
  x = params["embed"].astype(cfg.dtype)[tokens]
  x = constrain(x, ("batch", "length", "embed"))
  has_cache = cache is not None
  ck_all = cache["k"] if has_cache else None
  cv_all = cache["v"] if has_cache else None
  router_logits = []
  dropped_total = jnp.int32(0)

  def layer(x, ck_all, cv_all, i, lp, mlp_or_moe, is_moe):
    if has_cache:
      x, (ck_all, cv_all) = _attention_block(x, lp, positions, mask, (ck_all, cv_all, i),
                                             cache_index, cfg, attend_len, live_len,
                                             write_mask)
    else:
      x, _ = _attention_block(x, lp, positions, mask, None, None, cfg)
    h = rms_norm(x, lp["mlp_norm"], cfg.rms_eps)
    rl, dropped = None, jnp.int32(0)
    if is_moe:
      out, rl, dropped = moe_mlp(h, mlp_or_moe, cfg, return_dropped=True)
      dropped = jnp.asarray(dropped, jnp.int32)
    else:
      out = _dense_mlp(h, mlp_or_moe, cfg)
    return constrain(x + out, ("batch", "length", "embed")), ck_all, cv_all, rl, dropped

  if not cfg.scan_layers or isinstance(ck_all, tuple):
    # Unrolled: layer i's parameters are static slices; a per-layer cache is
    # read in place (a stacked one would be sliced).
    step = layer
    if cfg.remat != "none":
      step = jax.checkpoint(layer, policy=_REMAT[cfg.remat], static_argnums=(3, 6))
    one = lambda tree, i: jax.tree.map(lambda a: a[i], tree)
    di = mi = 0
    for i, is_moe in enumerate(cfg.layer_is_moe):
      mp = one(params["moe"], mi) if is_moe else one(params["mlp"], di)
      x, ck_all, cv_all, rl, dropped = step(x, ck_all, cv_all, i, one(params["layers"], i), mp,
                                            is_moe)
      dropped_total = dropped_total + dropped
      if rl is not None and return_router_logits:
        router_logits.append(rl[None])
      mi, di = mi + is_moe, di + (not is_moe)
  else:
    li = di = mi = 0  # first layer / dense layer / MoE layer of the segment
    for pattern, repeats in layer_segments(cfg):
      nd, nm = pattern.count(False), pattern.count(True)
      xs = {"attn": _group(params["layers"], li, repeats, len(pattern))}
      if nd:
        xs["mlp"] = _group(params["mlp"], di, repeats, nd)
      if nm:
        xs["moe"] = _group(params["moe"], mi, repeats, nm)

      def group(carry, gp, pattern=pattern):
        x, i, ck_all, cv_all, dropped_sum = carry
        logits_out = []
        d = m = 0
        for j, is_moe in enumerate(pattern):
          lp = jax.tree.map(lambda a, j=j: a[j], gp["attn"])
          if is_moe:
            mp = jax.tree.map(lambda a, m=m: a[m], gp["moe"])
            m += 1
          else:
            mp = jax.tree.map(lambda a, d=d: a[d], gp["mlp"])
            d += 1
          x, ck_all, cv_all, rl, dropped = layer(x, ck_all, cv_all, i, lp, mp, is_moe)
          dropped_sum = dropped_sum + dropped
          if rl is not None:
            logits_out.append(rl)
          i = i + 1
        ys = jnp.stack(logits_out) if (logits_out and return_router_logits) else None
        return (x, i, ck_all, cv_all, dropped_sum), ys

      if cfg.remat != "none":
        group = jax.checkpoint(group, policy=_REMAT[cfg.remat])
      (x, _, ck_all, cv_all, dropped_total), ys = jax.lax.scan(
          group, (x, jnp.int32(li), ck_all, cv_all, dropped_total), xs)
      if ys is not None:
        router_logits.append(ys.reshape(-1, *ys.shape[2:]))
      li += repeats * len(pattern)
      di += repeats * nd
      mi += repeats * nm
  x = rms_norm(x, params["final_norm"], cfg.rms_eps)
  new_cache = {"k": ck_all, "v": cv_all} if has_cache else None
  out = x if return_hidden else logits_from_hidden(params, cfg, x)
  result = (out, new_cache)
  if return_router_logits:
    result += (jnp.concatenate(router_logits) if router_logits else
               jnp.zeros((0, *tokens.shape, max(cfg.num_experts, 1)), cfg.dtype),)
  if return_moe_dropped:
    result += (dropped_total,)
  return result


def logits_from_hidden(params: Params, cfg: ModelConfig, x: jax.Array) -> jax.Array:
  """[B, T, D] hidden -> [B, T, V] float32 logits.

  The head is [V, D] like the embedding (and HF's lm_head.weight): each
  vocabulary row is contiguous, which streams well in the decode step's
  matrix-vector products (faster on CPU than a [D, V] head).
  """
  w = params["embed" if cfg.tie_embeddings else "lm_head"].astype(cfg.dtype)
  logits = jnp.einsum("btd,vd->btv", x, w, preferred_element_type=jnp.float32)
  return constrain(logits, ("batch", "length", "vocab"))


def segment_mask(segment_ids: jax.Array, prefix_ids: jax.Array | None = None) -> jax.Array:
  """Causal block-diagonal mask from segment ids [B, T] (0 = padding) -> [B, T, T].

  With `prefix_ids` [B, T] (0 = none), a token also sees the earlier tokens of
  the segment whose id its entry names: a shared prompt laid out once (a
  negative segment id) before several continuations that each name it, so
  every continuation attends to exactly what it would as a whole sequence.
  """
  T = segment_ids.shape[1]
  causal = jnp.tril(jnp.ones((T, T), bool))
  seen = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] != 0)
  if prefix_ids is not None:
    seen = seen | ((prefix_ids[:, :, None] == segment_ids[:, None, :])
                   & (prefix_ids[:, :, None] != 0))
  return causal[None] & seen


def token_logprobs(params: Params, cfg: ModelConfig, tokens: jax.Array,
                   positions: jax.Array, segment_ids: jax.Array,
                   prefix_ids: jax.Array | None = None) -> jax.Array:
  """Log-probability of each token given its prefix.

  Args:
    tokens, positions, segment_ids: [B, T]; segment id 0 marks padding.
    prefix_ids: optional [B, T] shared-prefix segment of each token (see
      `segment_mask`).

  Returns:
    [B, T] float32; entry t is log p(tokens[t] | tokens[<t]) within the same
    segment, and 0 at t = 0, at segment starts and on shared prefixes
    (negative segment ids).
  """
  logits, _ = forward(params, cfg, tokens, positions, segment_mask(segment_ids, prefix_ids))
  logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  nxt = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  same = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] > 0)
  nxt = jnp.where(same, nxt, 0.0)
  return jnp.concatenate([jnp.zeros_like(nxt[:, :1]), nxt], axis=1)
