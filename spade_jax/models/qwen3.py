"""Qwen3 / Qwen3-MoE decoder as pure functions over a parameter pytree.

Parameters are a plain nested dict. Per-layer weights are stacked on a leading
`layers` axis, in three stacks:

- `layers`: attention and norms of every layer, [L, ...];
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

Einsum letters used throughout: B batch, T query length, S key length,
D d_model, H query heads, K kv heads, G query heads per kv head, E head_dim,
F mlp width, V vocab, L layers, X experts.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from spade_jax.models.config import ModelConfig
from spade_jax.models.moe import moe_mlp
from spade_jax.parallel import constrain

Params = dict[str, Any]
# Large negative used instead of -inf so fully masked rows stay finite.
_MASK_VALUE = -1e30
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


def _rope_tables(positions: jax.Array, E: int, theta: float):
  """cos, sin tables [..., E] (half-rotation layout) for positions [...]."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, E, 2, dtype=jnp.float32) / E))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [..., E/2]
  return (jnp.concatenate([jnp.cos(angles)] * 2, axis=-1),
          jnp.concatenate([jnp.sin(angles)] * 2, axis=-1))


def _apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, axis: int = -1) -> jax.Array:
  """Rotates x's halves along `axis` (the head dim) by tables broadcasting to x."""
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=axis)
  rotated = jnp.concatenate([-x2, x1], axis=axis)
  return (x32 * cos + rotated * sin).astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding (half-rotation layout). x: [B, T, N, E]; positions: [B, T]."""
  cos, sin = _rope_tables(positions, x.shape[-1], theta)
  return _apply_rope(x, cos[:, :, None, :], sin[:, :, None, :])


def _attention(q, k, v, mask, cfg: ModelConfig):
  """q: [B, T, H, E]; k: [B, K, E, S]; v: [B, K, S, E]; mask: [B, T, S] bool
  -> [B, T, H, E].

  Keys and values are head-major (the KV cache layout), so both products are
  plain batched matmuls over (B, K): [T*G, E] x [E, S] for the scores and
  [T*G, S] x [S, E] for the output, with the scores' length axis minor for
  the softmax. Only the (small) queries and outputs are transposed; written
  as one einsum, XLA:CPU computed the scores as [S, T*G] and transposed the
  whole score tensor twice (`prefill_attention` benchmark: a chunk of 8 x 128
  queries over 512 keys took 25% longer).
  """
  B, T, H, E = q.shape
  K, S = k.shape[1], k.shape[3]
  G = H // K
  q = (q * jnp.asarray(1.0 / math.sqrt(E), q.dtype)).reshape(B, T, K, G, E)
  q = jnp.transpose(q, (0, 2, 1, 3, 4)).reshape(B, K, T * G, E)
  if q.dtype != jnp.float32 and jax.default_backend() == "cpu":
    # XLA:CPU has no bf16 x bf16 -> f32 product against length-last keys.
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
  dims = (((3,), (2,)), ((0, 1), (0, 1)))  # contract E / S, batch over (B, K)
  scores = jax.lax.dot_general(q, k, dims, preferred_element_type=jnp.float32)
  scores = scores.reshape(B, K, T, G, S)
  scores = jnp.where(mask[:, None, :, None, :], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(B, K, T * G, S)
  out = jax.lax.dot_general(probs, v, dims)  # [B, K, T*G, E]
  out = jnp.transpose(out.reshape(B, K, T, G, E), (0, 2, 1, 3, 4))
  return out.reshape(B, T, H, E)


# Largest cache block one decode-attention iteration reads; engines round long
# caches up to a multiple of it.
DECODE_BLOCK = 256


def _live_block(S: int, most: int = DECODE_BLOCK) -> int:
  """The decode block size: S itself up to `most`, else the largest power of
  two <= `most` dividing S."""
  if S <= most:
    return S
  b = most
  while S % b:
    b //= 2
  return b


# On CPU, caches of up to this many entries whose keys and values take at most
# CPU_DECODE_WHOLE_BYTES per layer are read whole by a decode step (no block
# loop); see `_decode_attention`.
CPU_DECODE_WHOLE_MAX = 1024
CPU_DECODE_WHOLE_BYTES = 4 << 20


def _decode_scores(q, k):
  """q [B, K, G, E] x keys [B, K, E, S] -> scores [B, K, G, S] (float32).

  On CPU a sum of E broadcast products (one loop fusion, vectorised along S);
  elsewhere a dot.
  """
  if jax.default_backend() != "cpu":
    return jnp.einsum("bkge,bkes->bkgs", q, k)
  return sum(q[:, :, :, e, None] * k[:, :, None, e, :] for e in range(q.shape[-1]))


def _decode_attention(q, k, v, mask, live_len):
  """One query per row over the live blocks of the cache only.

  q: [B, 1, H, E]; k: [B, K, E, S]; v: [B, K, S, E]; mask: [B, 1, S];
  live_len: scalar, no entry at or after it is visible in any row.

  A cache of one block (S <= DECODE_BLOCK; on CPU also up to
  CPU_DECODE_WHOLE_MAX entries and CPU_DECODE_WHOLE_BYTES of keys and values)
  is read whole, without a loop: the loop's block copies cost more than the
  entries past the live prefix while the layer's cache is small (tiny model,
  batch 8, 768 entries = 1.5 MiB, 512-640 live: 7.1 -> 5.9 ms per step),
  but not for large ones (50M, batch 8, 768 entries = 12 MiB: the loop is
  5-6 ms per step ahead). On CPU its scores are a sum of E broadcast products
  (`_decode_scores`), one loop fusion vectorised along the length axis,
  rather than a dot: XLA:CPU runs the dot as B*K [G, E] x [E, S] products
  with G = H/K rows, 0.5-4 ms per step slower on the tiny and 50M models
  (`decode_attention` benchmark).

  Longer caches are walked by a `fori_loop` with a dynamic trip count over
  blocks, with an online softmax, so a step costs what the live prefix
  costs, with no recompiles as it grows. There the probs @ V product is a
  fused multiply-reduce: as a dot on a block slice, XLA:CPU runs it as B*K
  tiny transposed matmuls (~2x slower).
  """
  B, _, H, E = q.shape
  K, S = k.shape[1], k.shape[3]
  G = H // K
  nbytes = k.size * k.dtype.itemsize + v.size * v.dtype.itemsize
  whole = (jax.default_backend() == "cpu" and S <= CPU_DECODE_WHOLE_MAX
           and nbytes <= CPU_DECODE_WHOLE_BYTES)
  blk = S if whole else _live_block(S)
  q = (q[:, 0].astype(jnp.float32) / math.sqrt(E)).reshape(B, K, G, E)
  if blk == S:
    s = _decode_scores(q, k.astype(jnp.float32))
    s = jnp.where(mask[:, :, None, :], s, _MASK_VALUE)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("bkgs,bkse->bkge", p, v.astype(jnp.float32))
    return out.reshape(B, 1, H, E)
  m0 = jnp.full((B, K, G), _MASK_VALUE, jnp.float32)
  l0 = jnp.zeros((B, K, G), jnp.float32)
  a0 = jnp.zeros((B, K, G, E), jnp.float32)

  def body(j, carry):
    m, l, acc = carry
    kb = jax.lax.dynamic_slice_in_dim(k, j * blk, blk, axis=3).astype(jnp.float32)
    vb = jax.lax.dynamic_slice_in_dim(v, j * blk, blk, axis=2).astype(jnp.float32)
    mb = jax.lax.dynamic_slice_in_dim(mask[:, 0], j * blk, blk, axis=1)[:, None, None, :]
    s = jnp.einsum("bkge,bkes->bkgs", q, kb)
    s = jnp.where(mb, s, _MASK_VALUE)
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.where(mb, jnp.exp(s - m_new[..., None]), 0.0)
    corr = jnp.exp(m - m_new)
    l = l * corr + p.sum(-1)
    acc = acc * corr[..., None] + jnp.sum(p[..., None] * vb[:, :, None], axis=3)
    return m_new, l, acc

  n = (live_len + blk - 1) // blk
  _, l, acc = jax.lax.fori_loop(0, n, body, (m0, l0, a0))
  out = acc / jnp.maximum(l, 1e-30)[..., None]
  return out.reshape(B, 1, H, E)


def _write_cache(cache_kv, k, v, cache_index):
  """Writes a chunk's keys [B, K, E, T] and values [B, K, T, E] into one layer.

  Args:
    cache_kv: (k_all, v_all, layer): stacked caches, keys [L, B, K, E, S] and
      values [L, B, K, S, E] (layer may be traced), or tuples of L per-layer
      buffers [B, K, E, S] / [B, K, S, E] (layer a Python int).

  Returns:
    (that layer's keys [B, K, E, S], its values [B, K, S, E], the updated
    (k_all, v_all)).
  """
  ck_all, cv_all, layer = cache_kv
  if isinstance(ck_all, tuple):  # per-layer buffers: no layer slice to copy
    ck = jax.lax.dynamic_update_slice(ck_all[layer], k.astype(ck_all[layer].dtype),
                                      (0, 0, 0, cache_index))
    cv = jax.lax.dynamic_update_slice(cv_all[layer], v.astype(cv_all[layer].dtype),
                                      (0, 0, cache_index, 0))
    ck_all = ck_all[:layer] + (ck,) + ck_all[layer + 1:]
    cv_all = cv_all[:layer] + (cv,) + cv_all[layer + 1:]
    return ck, cv, (ck_all, cv_all)
  ck_all = jax.lax.dynamic_update_slice(ck_all, k.astype(ck_all.dtype)[None],
                                        (layer, 0, 0, 0, cache_index))
  cv_all = jax.lax.dynamic_update_slice(cv_all, v.astype(cv_all.dtype)[None],
                                        (layer, 0, 0, cache_index, 0))
  ck = jax.lax.dynamic_index_in_dim(ck_all, layer, 0, keepdims=False)
  cv = jax.lax.dynamic_index_in_dim(cv_all, layer, 0, keepdims=False)
  return ck, cv, (ck_all, cv_all)


def _attention_block(x, lp, positions, mask, cache_kv, cache_index, cfg: ModelConfig,
                     attend_len: int | None = None, live_len=None):
  """Pre-norm attention with residual.

  Args:
    x: [B, T, D].
    cache_kv: None, or (k_all, v_all, layer) as for `_write_cache`.

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
  q = rope(rms_norm(q, lp["q_norm"], cfg.rms_eps), positions, cfg.rope_theta)
  k = rope(rms_norm(k, lp["k_norm"], cfg.rms_eps), positions, cfg.rope_theta)
  k = jnp.transpose(k, (0, 2, 3, 1))  # [B, K, E, T]
  v = jnp.swapaxes(v, 1, 2)  # [B, K, T, E]
  if cache_kv is not None:
    # Write only this chunk into the cache (in place under donation), then
    # attend over the cache (its first `attend_len` entries, or its live
    # blocks when decoding with `live_len`).
    k, v, cache_kv = _write_cache(cache_kv, k, v, cache_index)
    if attend_len is not None and attend_len < v.shape[2]:
      k, v = k[..., :attend_len], v[:, :, :attend_len]
  if live_len is not None and q.shape[1] == 1:
    attn = _decode_attention(q, k, v, mask, live_len).astype(dt)
  else:
    attn = _attention(q, k.astype(dt), v.astype(dt), mask, cfg)
  x = x + jnp.einsum("bthe,hed->btd", attn, lp["o"].astype(dt))
  return constrain(x, ("batch", "length", "embed")), cache_kv


def _dense_mlp(h, mp, cfg: ModelConfig):
  """SwiGLU MLP. h: [B, T, D] -> [B, T, D]."""
  dt = cfg.dtype
  gate = jnp.einsum("btd,df->btf", h, mp["gate"].astype(dt))
  up = jnp.einsum("btd,df->btf", h, mp["up"].astype(dt))
  act = constrain(jax.nn.silu(gate) * up, ("batch", "length", "mlp"))
  return jnp.einsum("btf,fd->btd", act, mp["down"].astype(dt))


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
            live_len: jax.Array | None = None):
  """Runs the decoder.

  Args:
    params: parameter tree from `init_params`.
    cfg: model config.
    tokens: [B, T] int token ids.
    positions: [B, T] int RoPE positions.
    mask: [B, T, S] bool, True where query t may attend to key s. Without a
      cache S == T; with a cache S is the cache length.
    cache: optional {"k", "v"} from `init_cache`: keys stacked
      [L, B, K, E, S] and values [L, B, K, S, E], or tuples of L per-layer
      buffers (the layers then run unrolled). The chunk's keys/values are
      written at `cache_index` along S before attending.
    cache_index: scalar start index of this chunk in the cache.
    return_hidden: return final hidden states [B, T, D] instead of logits.
    return_router_logits: also return the MoE router logits
      [L_moe, B, T, X] (for `load_balancing_loss`) as a third output.
    attend_len: static; attend only over cache entries [0, attend_len) (the
      caller guarantees none after it is visible). `mask` is then
      [B, T, attend_len].
    live_len: optional scalar (decode, T == 1): no cache entry at or after it
      is visible; attention then walks only the live blocks of the cache.

  Returns:
    (logits [B, T, V] float32 (or hidden [B, T, D]), updated cache or None)
    and, when requested, router logits.
  """
  x = params["embed"].astype(cfg.dtype)[tokens]
  x = constrain(x, ("batch", "length", "embed"))
  has_cache = cache is not None
  ck_all = cache["k"] if has_cache else None
  cv_all = cache["v"] if has_cache else None
  router_logits = []

  def layer(x, ck_all, cv_all, i, lp, mlp_or_moe, is_moe):
    if has_cache:
      x, (ck_all, cv_all) = _attention_block(x, lp, positions, mask, (ck_all, cv_all, i),
                                             cache_index, cfg, attend_len, live_len)
    else:
      x, _ = _attention_block(x, lp, positions, mask, None, None, cfg)
    h = rms_norm(x, lp["mlp_norm"], cfg.rms_eps)
    rl = None
    if is_moe:
      out, rl = moe_mlp(h, mlp_or_moe, cfg)
    else:
      out = _dense_mlp(h, mlp_or_moe, cfg)
    return constrain(x + out, ("batch", "length", "embed")), ck_all, cv_all, rl

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
      x, ck_all, cv_all, rl = step(x, ck_all, cv_all, i, one(params["layers"], i), mp, is_moe)
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
        x, i, ck_all, cv_all = carry
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
          x, ck_all, cv_all, rl = layer(x, ck_all, cv_all, i, lp, mp, is_moe)
          if rl is not None:
            logits_out.append(rl)
          i = i + 1
        ys = jnp.stack(logits_out) if (logits_out and return_router_logits) else None
        return (x, i, ck_all, cv_all), ys

      if cfg.remat != "none":
        group = jax.checkpoint(group, policy=_REMAT[cfg.remat])
      (x, _, ck_all, cv_all), ys = jax.lax.scan(group, (x, jnp.int32(li), ck_all, cv_all), xs)
      if ys is not None:
        router_logits.append(ys.reshape(-1, *ys.shape[2:]))
      li += repeats * len(pattern)
      di += repeats * nd
      mi += repeats * nm
  x = rms_norm(x, params["final_norm"], cfg.rms_eps)
  new_cache = {"k": ck_all, "v": cv_all} if has_cache else None
  out = x if return_hidden else logits_from_hidden(params, cfg, x)
  if not return_router_logits:
    return out, new_cache
  rl = (jnp.concatenate(router_logits) if router_logits else
        jnp.zeros((0, *tokens.shape, max(cfg.num_experts, 1)), cfg.dtype))
  return out, new_cache, rl


def logits_from_hidden(params: Params, cfg: ModelConfig, x: jax.Array) -> jax.Array:
  """[B, T, D] hidden -> [B, T, V] float32 logits.

  The head is [V, D] like the embedding (and HF's lm_head.weight): each
  vocabulary row is contiguous, which streams well in the decode step's
  matrix-vector products (measured 1.4x faster on CPU than [D, V]).
  """
  w = params["embed" if cfg.tie_embeddings else "lm_head"].astype(cfg.dtype)
  logits = jnp.einsum("btd,vd->btv", x, w, preferred_element_type=jnp.float32)
  return constrain(logits, ("batch", "length", "vocab"))


# -- Feature-major decode ------------------------------------------------------
#
# A decode step multiplies a handful of rows by every weight matrix. XLA:CPU's
# matrix kernels run such a product fastest with the weight as the left
# operand in [out, in] layout (each output's weights contiguous) and the
# activations as [in, B]; as `x @ W` with W [in, out] the same product is
# 1.5-3x slower (the output head's 32k x 512 product at batch 8: 8 ms against
# 15 ms). The feature-major step below keeps the hidden state as [D, B] between
# layers and takes weights re-laid out once by `decode_params`; the few
# attention tensors per step ([B, H, E]) are transposed at its edges.


def decode_params(params: Params, cfg: ModelConfig) -> Params:
  """Weights laid out for `decode_step`: every dense matrix as [out, in], and
  one tree per layer.

  Per-layer arrays (rather than stacks) matter as much as the layout: XLA:CPU
  copies a layer's slice out of a stacked weight before each product, every
  step. MoE layers keep their layout (`decode_step` runs them batch-major).
  The embedding and the head are shared with `params`.

  Returns:
    {"embed", "head" ([V, D]), "final_norm", "layers": tuple of L dicts
    ("qkv": q, k and v stacked [(H + 2K) * E, D], "o": [D, H * E], norms),
    "mlp": tuple of dense layers' {"gate_up": [2F, D], "down": [D, F]},
    "moe": tuple of MoE layers' weights as in `params`}. Matrices are 2-D so
    that no product needs its weight re-laid out, and products that share an
    input are one product.
  """
  layers, mlp, moe = _decode_layer_weights(params["layers"], params.get("mlp", {}),
                                           params.get("moe", {}), cfg)
  return {"embed": params["embed"], "head": params["embed" if cfg.tie_embeddings else "lm_head"],
          "final_norm": params["final_norm"], "layers": layers, "mlp": mlp, "moe": moe}


@functools.partial(jax.jit, static_argnums=(3,))
def _decode_layer_weights(lay, mlp, moe, cfg: ModelConfig):
  """The per-layer part of `decode_params`, as one program (eagerly, each
  slice and transpose is its own dispatch, on every engine start)."""
  D = cfg.d_model
  norms = ("attn_norm", "q_norm", "k_norm", "mlp_norm")
  # [D, N, E] -> [N * E, D] for q, k and v, stacked; [H, E, D] -> [D, H * E].
  layers = tuple(dict({n: lay[n][i] for n in norms},
                      qkv=jnp.concatenate([lay[n][i].reshape(D, -1) for n in "qkv"], 1).T,
                      o=lay["o"][i].reshape(-1, D).T) for i in range(cfg.num_layers))
  dense = tuple({"gate_up": jnp.concatenate([mlp["gate"][i], mlp["up"][i]], 1).T,
                 "down": mlp["down"][i].T} for i in range(cfg.num_dense_layers))
  sparse = tuple(jax.tree.map(lambda a, i=i: a[i], moe) for i in range(cfg.num_moe_layers))
  return layers, dense, sparse


def _pin(x):
  """Materialises x as laid out. Without it XLA folds the transposes next to
  a feature-major product into the product itself (choosing the slow
  orientation again: the output head was 4x slower)."""
  return jax.lax.optimization_barrier(x)


def decode_step(dparams: Params, cfg: ModelConfig, tokens: jax.Array,
                positions: jax.Array, mask: jax.Array, cache: dict[str, Any],
                cache_index, live_len) -> tuple[jax.Array, dict[str, Any]]:
  """One decode token per row, feature-major; same result as `forward`.

  Args:
    dparams: `decode_params(params, cfg)`.
    tokens, positions: [B] int.
    mask: [B, S] bool, the cache entries each row may attend to (including
      the one written at `cache_index`).
    cache: as for `forward` (stacked or per-layer buffers).
    cache_index: scalar index this step's keys/values are written at.
    live_len: scalar; no cache entry at or after it is visible.

  Returns:
    (logits [B, V] float32, updated cache).
  """
  dt = cfg.dtype
  eps = cfg.rms_eps
  x = dparams["embed"].astype(dt)[tokens].T  # [D, B]
  B = x.shape[1]
  ck_all, cv_all = cache["k"], cache["v"]
  # RoPE tables once per step (fused into each layer, sin and cos would be
  # recomputed for every element of every layer's q and k).
  H, K, E = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  cos, sin = _pin(tuple(t.T for t in _rope_tables(positions, E, cfg.rope_theta)))  # [E, B]
  di = mi = 0
  for i, is_moe in enumerate(cfg.layer_is_moe):
    lp = dparams["layers"][i]
    h = rms_norm(x, lp["attn_norm"], eps, 0)
    qkv = _pin(lp["qkv"].astype(dt) @ h).reshape(-1, E, B)  # [H + 2K, E, B]
    q, k, v = qkv[:H], qkv[H:H + K], qkv[H + K:]
    q = _apply_rope(rms_norm(q, lp["q_norm"], eps, 1), cos, sin, axis=1)
    k = _apply_rope(rms_norm(k, lp["k_norm"], eps, 1), cos, sin, axis=1)
    k = jnp.transpose(k, (2, 0, 1))[..., None]  # [B, K, E, 1]
    v = jnp.transpose(v, (2, 0, 1))[:, :, None, :]  # [B, K, 1, E]
    kc, vc, (ck_all, cv_all) = _write_cache((ck_all, cv_all, i), k, v, cache_index)
    q = jnp.transpose(q, (2, 0, 1))[:, None]  # [B, 1, H, E]
    attn = _decode_attention(q, kc, vc, mask[:, None, :], live_len).astype(dt)
    attn = _pin(jnp.transpose(attn[:, 0], (1, 2, 0)).reshape(-1, B))  # [H*E, B]
    x = x + lp["o"].astype(dt) @ attn
    h = rms_norm(x, lp["mlp_norm"], eps, 0)
    if is_moe:
      out, _ = moe_mlp(h.T[:, None, :], dparams["moe"][mi], cfg)
      out = out[:, 0].T
      mi += 1
    else:
      mp = dparams["mlp"][di]
      gate_up = _pin(mp["gate_up"].astype(dt) @ h)
      F = gate_up.shape[0] // 2
      out = mp["down"].astype(dt) @ (jax.nn.silu(gate_up[:F]) * gate_up[F:])
      di += 1
    x = x + out
  x = rms_norm(x, dparams["final_norm"], eps, 0)
  logits = _pin(jnp.einsum("vd,db->vb", dparams["head"].astype(dt), x,
                           preferred_element_type=jnp.float32))
  return logits.T, {"k": ck_all, "v": cv_all}


# Logical axes of the cache buffers (per-layer buffers drop "layers"). Keys
# keep the length axis last: a decode step's query-key products then run as
# [G, E] x [E, S] matrix products (about 4x faster on CPU than against
# [S, E] keys), and values keep it second to last for the probs x values sum.
KEY_CACHE_AXES = ("layers", "batch", "kv_heads", "head_dim", "length")
VALUE_CACHE_AXES = ("layers", "batch", "kv_heads", "length", "head_dim")


def cache_shapes(cfg: ModelConfig, batch: int, length: int,
                 per_layer: bool = False) -> dict[str, tuple[int, ...]]:
  """Shapes of one key and one value buffer (stacked unless `per_layer`)."""
  K, E = cfg.num_kv_heads, cfg.head_dim
  lead = (batch,) if per_layer else (cfg.num_layers, batch)
  return {"k": lead + (K, E, length), "v": lead + (K, length, E)}


def init_cache(cfg: ModelConfig, batch: int, length: int,
               dtype: str | None = None, per_layer: bool = False) -> dict[str, Any]:
  """Zero KV cache {"k", "v"}: keys [L, B, K, E, S], values [L, B, K, S, E];
  with `per_layer` tuples of L buffers without the leading axis (no layer
  slice is copied to read one; `forward` then runs the layers unrolled)."""
  dt = jnp.dtype(dtype or cfg.compute_dtype)
  shapes = cache_shapes(cfg, batch, length, per_layer)
  if per_layer:
    return {n: tuple(jnp.zeros(shapes[n], dt) for _ in range(cfg.num_layers))
            for n in ("k", "v")}
  return {n: jnp.zeros(shapes[n], dt) for n in ("k", "v")}


def segment_mask(segment_ids: jax.Array) -> jax.Array:
  """Causal block-diagonal mask from segment ids [B, T] (0 = padding) -> [B, T, T]."""
  T = segment_ids.shape[1]
  causal = jnp.tril(jnp.ones((T, T), bool))
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  return causal[None] & same & (segment_ids[:, None, :] > 0)


def token_logprobs(params: Params, cfg: ModelConfig, tokens: jax.Array,
                   positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
  """Log-probability of each token given its prefix.

  Args:
    tokens, positions, segment_ids: [B, T]; segment id 0 marks padding.

  Returns:
    [B, T] float32; entry t is log p(tokens[t] | tokens[<t]) within the same
    segment, and 0 at t = 0 and at segment starts.
  """
  logits, _ = forward(params, cfg, tokens, positions, segment_mask(segment_ids))
  logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  nxt = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  same = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] > 0)
  nxt = jnp.where(same, nxt, 0.0)
  return jnp.concatenate([jnp.zeros_like(nxt[:, :1]), nxt], axis=1)
