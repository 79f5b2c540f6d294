"""Qwen3-shaped decoder as pure functions over a parameter pytree.

Parameters are a plain nested dict; layer weights are stacked on a leading
`layers` axis and applied with `lax.scan`, so compile time does not grow with
depth. `param_axes` returns the matching tree of logical axis names that
`spade_jax.parallel` maps to mesh axes.

Einsum letters used throughout: B batch, T query length, S key length,
D d_model, H query heads, K kv heads, G query heads per kv head, E head_dim,
F mlp width, V vocab, L layers.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from spade_jax.models.config import ModelConfig

Params = dict[str, Any]
# Large negative used instead of -inf so fully masked rows stay finite.
_MASK_VALUE = -1e30


def param_axes(cfg: ModelConfig) -> Params:
  """Logical axis names for every parameter, same tree as `init_params`."""
  layers = {
      "attn_norm": ("layers", "norm"),
      "q": ("layers", "embed", "heads", "head_dim"),
      "k": ("layers", "embed", "kv_heads", "head_dim"),
      "v": ("layers", "embed", "kv_heads", "head_dim"),
      "o": ("layers", "heads", "head_dim", "embed"),
      "q_norm": ("layers", "norm"),
      "k_norm": ("layers", "norm"),
      "mlp_norm": ("layers", "norm"),
      "gate": ("layers", "embed", "mlp"),
      "up": ("layers", "embed", "mlp"),
      "down": ("layers", "mlp", "embed"),
  }
  axes = {"embed": ("vocab", "embed"), "layers": layers, "final_norm": ("norm",)}
  if not cfg.tie_embeddings:
    axes["lm_head"] = ("embed", "vocab")
  return axes


def param_shapes(cfg: ModelConfig) -> Params:
  """Shapes of every parameter, same tree as `init_params`."""
  L, D, H, K, E, F, V = (cfg.num_layers, cfg.d_model, cfg.num_heads,
                         cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim,
                         cfg.vocab_size)
  layers = {
      "attn_norm": (L, D), "q": (L, D, H, E), "k": (L, D, K, E),
      "v": (L, D, K, E), "o": (L, H, E, D), "q_norm": (L, E), "k_norm": (L, E),
      "mlp_norm": (L, D), "gate": (L, D, F), "up": (L, D, F), "down": (L, F, D),
  }
  shapes = {"embed": (V, D), "layers": layers, "final_norm": (D,)}
  if not cfg.tie_embeddings:
    shapes["lm_head"] = (D, V)
  return shapes


def init_params(key: jax.Array, cfg: ModelConfig) -> Params:
  """Random parameters (normal, std 0.02; norms at one)."""
  shapes = param_shapes(cfg)
  leaves, treedef = jax.tree.flatten(
      shapes, is_leaf=lambda x: isinstance(x, tuple))
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
      shapes, is_leaf=lambda x: isinstance(x, tuple))[0]]
  keys = jax.random.split(key, len(leaves))
  dtype = jnp.dtype(cfg.param_dtype)
  out = []
  for path, shape, k in zip(paths, leaves, keys):
    if "norm" in path:
      out.append(jnp.ones(shape, dtype))
    else:
      out.append((0.02 * jax.random.normal(k, shape, jnp.float32)).astype(dtype))
  return jax.tree.unflatten(treedef, out)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last axis, computed in float32."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding (half-rotation layout). x: [B, T, N, E]; positions: [B, T]."""
  E = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, E, 2, dtype=jnp.float32) / E))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, E/2]
  cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[:, :, None, :]
  sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[:, :, None, :]
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x32 * cos + rotated * sin).astype(x.dtype)


def _attention(q, k, v, mask, cfg: ModelConfig):
  """q: [B, T, H, E]; k, v: [B, S, K, E]; mask: [B, T, S] bool -> [B, T, H, E]."""
  B, T, H, E = q.shape
  K = cfg.num_kv_heads
  q = q.reshape(B, T, K, H // K, E)
  scores = jnp.einsum("btkge,bske->bkgts", q, k,
                      preferred_element_type=jnp.float32) / jnp.sqrt(E).astype(jnp.float32)
  scores = jnp.where(mask[:, None, None, :, :], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bske->btkge", probs, v)
  return out.reshape(B, T, H, E)


def _layer(x, lp, positions, mask, cache_kv, cache_index, cfg: ModelConfig):
  """One decoder layer. Returns (x, (k_all, v_all)) with the layer's keys/values."""
  dt = cfg.dtype
  h = rms_norm(x, lp["attn_norm"], cfg.rms_eps)
  q = jnp.einsum("btd,dhe->bthe", h, lp["q"].astype(dt))
  k = jnp.einsum("btd,dke->btke", h, lp["k"].astype(dt))
  v = jnp.einsum("btd,dke->btke", h, lp["v"].astype(dt))
  q = rope(rms_norm(q, lp["q_norm"], cfg.rms_eps), positions, cfg.rope_theta)
  k = rope(rms_norm(k, lp["k_norm"], cfg.rms_eps), positions, cfg.rope_theta)
  if cache_kv is not None:
    ck, cv = cache_kv
    k = jax.lax.dynamic_update_slice_in_dim(ck, k.astype(ck.dtype), cache_index, axis=1)
    v = jax.lax.dynamic_update_slice_in_dim(cv, v.astype(cv.dtype), cache_index, axis=1)
  attn = _attention(q, k.astype(dt), v.astype(dt), mask, cfg)
  x = x + jnp.einsum("bthe,hed->btd", attn, lp["o"].astype(dt))
  h = rms_norm(x, lp["mlp_norm"], cfg.rms_eps)
  gate = jnp.einsum("btd,df->btf", h, lp["gate"].astype(dt))
  up = jnp.einsum("btd,df->btf", h, lp["up"].astype(dt))
  x = x + jnp.einsum("btf,fd->btd", jax.nn.silu(gate) * up, lp["down"].astype(dt))
  return x, (k, v)


def forward(params: Params, cfg: ModelConfig, tokens: jax.Array,
            positions: jax.Array, mask: jax.Array,
            cache: dict[str, jax.Array] | None = None,
            cache_index: jax.Array | int = 0,
            return_hidden: bool = False):
  """Runs the decoder.

  Args:
    params: parameter tree from `init_params`.
    cfg: model config.
    tokens: [B, T] int token ids.
    positions: [B, T] int RoPE positions.
    mask: [B, T, S] bool, True where query t may attend to key s. Without a
      cache S == T; with a cache S is the cache length.
    cache: optional {"k", "v"}: [L, B, S, K, E]. The chunk's keys/values are
      written at `cache_index` along S before attending.
    cache_index: scalar start index of this chunk in the cache.
    return_hidden: return final hidden states [B, T, D] instead of logits.

  Returns:
    (logits [B, T, V] float32 (or hidden [B, T, D]), updated cache or None).
  """
  x = params["embed"].astype(cfg.dtype)[tokens]

  def body(carry, lp):
    x, i, ck_all, cv_all = carry
    if ck_all is None:
      x, _ = _layer(x, lp, positions, mask, None, None, cfg)
      return (x, i + 1, None, None), None
    ck = jax.lax.dynamic_index_in_dim(ck_all, i, 0, keepdims=False)
    cv = jax.lax.dynamic_index_in_dim(cv_all, i, 0, keepdims=False)
    x, (k, v) = _layer(x, lp, positions, mask, (ck, cv), cache_index, cfg)
    ck_all = jax.lax.dynamic_update_index_in_dim(ck_all, k, i, 0)
    cv_all = jax.lax.dynamic_update_index_in_dim(cv_all, v, i, 0)
    return (x, i + 1, ck_all, cv_all), None

  if cfg.remat == "full":
    body = jax.checkpoint(body)
  ck0 = cache["k"] if cache is not None else None
  cv0 = cache["v"] if cache is not None else None
  (x, _, ck, cv), _ = jax.lax.scan(body, (x, jnp.int32(0), ck0, cv0),
                                   params["layers"])
  x = rms_norm(x, params["final_norm"], cfg.rms_eps)
  new_cache = {"k": ck, "v": cv} if cache is not None else None
  if return_hidden:
    return x, new_cache
  return logits_from_hidden(params, cfg, x), new_cache


def logits_from_hidden(params: Params, cfg: ModelConfig, x: jax.Array) -> jax.Array:
  """[B, T, D] hidden -> [B, T, V] float32 logits."""
  if cfg.tie_embeddings:
    w = params["embed"].astype(cfg.dtype)
    return jnp.einsum("btd,vd->btv", x, w, preferred_element_type=jnp.float32)
  w = params["lm_head"].astype(cfg.dtype)
  return jnp.einsum("btd,dv->btv", x, w, preferred_element_type=jnp.float32)


def init_cache(cfg: ModelConfig, batch: int, length: int,
               dtype: str | None = None) -> dict[str, jax.Array]:
  """Zero KV cache {"k", "v"}: [L, B, S, K, E]."""
  shape = (cfg.num_layers, batch, length, cfg.num_kv_heads, cfg.head_dim)
  dt = jnp.dtype(dtype or cfg.compute_dtype)
  return {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt)}


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
