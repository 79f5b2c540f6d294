"""The KV-cache layout: buffer shapes and logical axes, zero caches, chunk writes.

The cache is head-major: keys [B, K, E, S] (length last), values [B, K, S, E],
per layer or stacked on a leading layer axis. Attention (`attention`) then
batches over (B, K) without transposing the cache, and a decode step's
query-key product is [G, E] x [E, S].

The decoder (`qwen3`) and the feature-major decode step (`decode`) write
through `write_cache`; the sampling engine allocates with `init_cache`.

Einsum letters: B batch, T chunk length, S cache length, K kv heads, G query
heads per kv head, E head_dim, L layers.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from spade_jax.models.config import ModelConfig

# Logical axes of the cache buffers (per-layer buffers drop "layers"). Keys
# keep the length axis last: a decode step's query-key products then run as
# [G, E] x [E, S] matrix products (faster on CPU than against [S, E] keys),
# and values keep it second to last for the probs x values sum.
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


def write_cache(cache_kv, k, v, cache_index, write_mask=None):
  """Writes a chunk's keys [B, K, E, T] and values [B, K, T, E] into one layer.

  Args:
    cache_kv: (k_all, v_all, layer): stacked caches, keys [L, B, K, E, S] and
      values [L, B, K, S, E] (layer may be traced), or tuples of L per-layer
      buffers [B, K, E, S] / [B, K, S, E] (layer a Python int).
    k: keys [B, K, E, T].
    v: values [B, K, T, E].
    cache_index: index along S of the chunk's first entry: a scalar (every row
      writes there) or [B] (row b writes at cache_index[b]; the caller keeps
      index + T within S, since an index past it is clamped).
    write_mask: optional [B, T] bool with a per-row `cache_index`: entries of the
      chunk where it is False keep the cache's values (a row can then rewrite
      the end of its cache without changing the entries before its own end).

  Returns:
    (that layer's keys [B, K, E, S], its values [B, K, S, E], the updated
    (k_all, v_all)).
  """
  ck_all, cv_all, layer = cache_kv
  per_row = jnp.ndim(cache_index) == 1
  if isinstance(ck_all, tuple):  # per-layer buffers: no layer slice to copy
    ck, cv = ck_all[layer], cv_all[layer]
    k, v = k.astype(ck.dtype), v.astype(cv.dtype)
    if per_row:
      k, v = _keep(ck, k, cache_index, write_mask, -1), _keep(cv, v, cache_index, write_mask, -2)
      ck = jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice(c, x, (0, 0, i)))(
          ck, k, cache_index)
      cv = jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice(c, x, (0, i, 0)))(
          cv, v, cache_index)
    else:
      ck = jax.lax.dynamic_update_slice(ck, k, (0, 0, 0, cache_index))
      cv = jax.lax.dynamic_update_slice(cv, v, (0, 0, cache_index, 0))
    ck_all = ck_all[:layer] + (ck,) + ck_all[layer + 1:]
    cv_all = cv_all[:layer] + (cv,) + cv_all[layer + 1:]
    return ck, cv, (ck_all, cv_all)
  k, v = k.astype(ck_all.dtype), v.astype(cv_all.dtype)
  if per_row:  # row b of the stacked buffers is axis 1
    if write_mask is not None:
      layer_k = jax.lax.dynamic_index_in_dim(ck_all, layer, 0, keepdims=False)
      layer_v = jax.lax.dynamic_index_in_dim(cv_all, layer, 0, keepdims=False)
      k = _keep(layer_k, k, cache_index, write_mask, -1)
      v = _keep(layer_v, v, cache_index, write_mask, -2)
    ck_all = jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice(c, x[None], (layer, 0, 0, i)),
                      in_axes=(1, 0, 0), out_axes=1)(ck_all, k, cache_index)
    cv_all = jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice(c, x[None], (layer, 0, i, 0)),
                      in_axes=(1, 0, 0), out_axes=1)(cv_all, v, cache_index)
  else:
    ck_all = jax.lax.dynamic_update_slice(ck_all, k[None], (layer, 0, 0, 0, cache_index))
    cv_all = jax.lax.dynamic_update_slice(cv_all, v[None], (layer, 0, 0, cache_index, 0))
  ck = jax.lax.dynamic_index_in_dim(ck_all, layer, 0, keepdims=False)
  cv = jax.lax.dynamic_index_in_dim(cv_all, layer, 0, keepdims=False)
  return ck, cv, (ck_all, cv_all)


def _keep(c, x, index, write_mask, axis):
  """`x` ([B, K, E, T] keys or [B, K, T, E] values) with the cache `c`'s entries
  (from each row's `index`) where `write_mask` [B, T] is False."""
  if write_mask is None:
    return x
  T = x.shape[axis]
  if axis == -1:
    old = jax.vmap(lambda a, i: jax.lax.dynamic_slice_in_dim(a, i, T, axis=2))(c, index)
    return jnp.where(write_mask[:, None, None, :], x, old.astype(x.dtype))
  old = jax.vmap(lambda a, i: jax.lax.dynamic_slice_in_dim(a, i, T, axis=1))(c, index)
  return jnp.where(write_mask[:, None, :, None], x, old.astype(x.dtype))
