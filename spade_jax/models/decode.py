"""Feature-major decode step for CPU: one token per row, same result as `forward`.

A decode step multiplies a handful of rows by every weight matrix. XLA:CPU's
matrix kernels run such a product fastest with the weight as the left operand
in [out, in] layout (each output's weights contiguous) and the activations as
[in, B]; as `x @ W` with W [in, out] the same product is slower. The step here
keeps the hidden state as [D, B] between layers and takes weights re-laid out
once by `decode_params`; the few attention tensors per step ([B, H, E]) are
transposed at its edges. `Engine(decode_layout=)` chooses between this step
and `qwen3.forward` (see experiments/benchmarks/decode_layout.py).

Einsum letters as in `qwen3`: B batch, S cache length, D d_model, H query
heads, K kv heads, E head_dim, F mlp width, V vocab.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spade_jax.models.attention import DECODE_ATTENTION
from spade_jax.models.cache import write_cache
from spade_jax.models.config import ModelConfig
from spade_jax.models.moe import moe_mlp
from spade_jax.models.qwen3 import Params, apply_rope, rms_norm, rope_tables


def decode_params(params: Params, cfg: ModelConfig) -> Params:
  """Weights laid out for `decode_step`: every dense matrix as [out, in], and
  one tree per layer.

  Per-layer arrays (rather than stacks) matter as much as the layout: XLA:CPU
  copies a layer's slice out of a stacked weight before each product, every
  step. MoE layers keep their layout (`decode_step` runs them batch-major).
  The embedding and the head are shared with `params`.

  Returns:
    {"embed", "head" ([V, D]), "final_norm", "layers": tuple of L dicts
    ("qkv": q, k and v stacked [(H + 2K) * E, D], "o": [D, H * E], norms;
    `q_norm` / `k_norm` only with `cfg.qk_norm`),
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
  norms = ("attn_norm", "q_norm", "k_norm", "mlp_norm") if cfg.qk_norm else (
      "attn_norm", "mlp_norm")
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
  a feature-major product into the product itself, choosing the slow
  orientation again."""
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
    cache_index: index this step's keys/values are written at: a scalar, or [B]
      (one per row).
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
  cos, sin = _pin(tuple(t.T for t in rope_tables(positions, E, cfg.rope_theta)))  # [E, B]
  attend = DECODE_ATTENTION[cfg.decode_attention]
  di = mi = 0
  for i, is_moe in enumerate(cfg.layer_is_moe):
    lp = dparams["layers"][i]
    h = rms_norm(x, lp["attn_norm"], eps, 0)
    qkv = _pin(lp["qkv"].astype(dt) @ h).reshape(-1, E, B)  # [H + 2K, E, B]
    q, k, v = qkv[:H], qkv[H:H + K], qkv[H + K:]
    if cfg.qk_norm:
      q, k = rms_norm(q, lp["q_norm"], eps, 1), rms_norm(k, lp["k_norm"], eps, 1)
    q = apply_rope(q, cos, sin, axis=1)
    k = apply_rope(k, cos, sin, axis=1)
    k = jnp.transpose(k, (2, 0, 1))[..., None]  # [B, K, E, 1]
    v = jnp.transpose(v, (2, 0, 1))[:, :, None, :]  # [B, K, 1, E]
    kc, vc, (ck_all, cv_all) = write_cache((ck_all, cv_all, i), k, v, cache_index)
    q = jnp.transpose(q, (2, 0, 1))[:, None]  # [B, 1, H, E]
    attn = attend(q, kc, vc, mask[:, None, :], live_len).astype(dt)
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
