"""Attention kernels.

Two kernel registries, chosen by name in `ModelConfig`:

- `ATTENTION` (`ModelConfig.attention`): prefill / extend / training
  attention over any number of queries, q [B, T, H, E] against keys
  [B, K, E, S] and values [B, K, S, E] -> [B, T, H, E].
- `DECODE_ATTENTION` (`ModelConfig.decode_attention`): one query per row over
  the live prefix of a cache, q [B, 1, H, E] -> [B, 1, H, E].

Each registry's default ("auto") picks a kernel by backend and shape; the
others can be named directly, and the benchmarks
(`experiments/benchmarks/prefill_attention.py`, `train_attention.py`,
`decode_attention.py`) select them by config.

Keys and values come in the head-major cache layout (`cache`): keys
[B, K, E, S] (length last), values [B, K, S, E]. Attention then batches over
(B, K) without transposing the cache, and a decode step's query-key product is
[G, E] x [E, S].

This module depends on no other model module (`config` names its kernels), so
the config, the decoder (`qwen3`) and the feature-major decode step (`decode`)
all import it.

Einsum letters: B batch, T query length, S key length, H query heads, K kv
heads, G query heads per kv head, E head_dim, L layers.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp

from spade_jax.registry import Registry

# Large negative used instead of -inf so fully masked rows stay finite.
MASK_VALUE = -1e30

# -- Prefill / train attention ------------------------------------------------

# name -> fn(q [B, T, H, E], k [B, K, E, S], v [B, K, S, E], mask [B, T, S] bool)
#   -> [B, T, H, E].
ATTENTION: Registry[Callable[..., jax.Array]] = Registry(
    "attention implementation", field="model.attention")


def _scaled_queries(q: jax.Array) -> jax.Array:
  """q / sqrt(E), kept in q's dtype."""
  return q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)


def _cpu_score_operands(q: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
  """q, k as float32 on CPU when they are not: XLA:CPU has no bf16 x bf16 -> f32
  product against length-last keys."""
  if q.dtype != jnp.float32 and jax.default_backend() == "cpu":
    return q.astype(jnp.float32), k.astype(jnp.float32)
  return q, k


@ATTENTION.register("matmul")
def matmul_attention(q, k, v, mask):
  """Both products as batched matmuls over (B, K) (the default).

  q: [B, T, H, E]; k: [B, K, E, S]; v: [B, K, S, E]; mask: [B, T, S] bool
  -> [B, T, H, E].

  Keys and values are head-major (the KV cache layout), so both products are
  plain batched matmuls over (B, K): [T*G, E] x [E, S] for the scores and
  [T*G, S] x [S, E] for the output, with the scores' length axis minor for
  the softmax. Only the (small) queries and outputs are transposed. Written
  as one einsum per product (`einsum_attention`), XLA:CPU computes the scores
  as [S, T*G] and transposes the whole score tensor twice, which is slower
  (see experiments/benchmarks/prefill_attention.py).
  """
  B, T, H, E = q.shape
  K, S = k.shape[1], k.shape[3]
  G = H // K
  q = _scaled_queries(q).reshape(B, T, K, G, E)
  q = jnp.transpose(q, (0, 2, 1, 3, 4)).reshape(B, K, T * G, E)
  q, k = _cpu_score_operands(q, k)
  dims = (((3,), (2,)), ((0, 1), (0, 1)))  # contract E / S, batch over (B, K)
  scores = jax.lax.dot_general(q, k, dims, preferred_element_type=jnp.float32)
  scores = scores.reshape(B, K, T, G, S)
  scores = jnp.where(mask[:, None, :, None, :], scores, MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(B, K, T * G, S)
  out = jax.lax.dot_general(probs, v, dims)  # [B, K, T*G, E]
  out = jnp.transpose(out.reshape(B, K, T, G, E), (0, 2, 1, 3, 4))
  return out.reshape(B, T, H, E)


@ATTENTION.register("einsum")
def einsum_attention(q, k, v, mask):
  """Each product as one einsum over the same head-major keys and values.

  Shapes as `matmul_attention`. The straightforward formulation, kept as
  `matmul_attention`'s reference: XLA lays out the products itself.
  """
  B, T, H, E = q.shape
  K = k.shape[1]
  q = _scaled_queries(q).reshape(B, T, K, H // K, E)
  q, k = _cpu_score_operands(q, k)
  scores = jnp.einsum("btkge,bkes->bkgts", q, k, preferred_element_type=jnp.float32)
  scores = jnp.where(mask[:, None, None, :, :], scores, MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum("bkgts,bkse->btkge", probs, v).reshape(B, T, H, E)


# Largest query and key block of the "blocked" kernel: a chunk of queries attends
# only to the key blocks its mask reaches.
ATTENTION_BLOCK = 256


def even_block(n: int, most: int) -> int:
  """The block that cuts a side of n into as few blocks of at most `most` as
  possible, all equal: ceil(n / blocks) rounded up to a multiple of 8 (at
  most `most`, or n when n is shorter). A width just past a multiple of `most`
  then pads a few columns, not nearly a whole block (576 -> 3 x 192, not
  768 = 3 x 256)."""
  if n <= most:
    return n
  count = -(-n // most)
  return min(most, -(-(-(-n // count)) // 8) * 8)


def _live_block_order(live: jax.Array) -> tuple[jax.Array, jax.Array]:
  """live [..., n] bool -> (block indices [..., n] int32, the live ones first in
  increasing order; how many are live [...] int32)."""
  order = jnp.argsort(~live, axis=-1, stable=True).astype(jnp.int32)
  return order, live.sum(-1).astype(jnp.int32)


def _block_mask(mask, i, j, bq, bk, G):
  """mask [T, S] -> the (i, j) block, each query row repeated per head of its
  group: [bq * G, bk] (query rows are (t, g), t major)."""
  return jnp.repeat(jax.lax.dynamic_slice(mask, (i * bq, j * bk), (bq, bk)), G, axis=0)


def _visited_block(k, v, mask, order, count, i, n, bq, bk, G):
  """Query block i's n-th key block: (its index j, keys, values, mask); the mask
  is all False past the row's `count[i]` live blocks, so extra trips add nothing."""
  j = order[i, n]
  kj = jax.lax.dynamic_slice_in_dim(k, j * bk, bk, axis=2)
  vj = jax.lax.dynamic_slice_in_dim(v, j * bk, bk, axis=1)
  return j, kj, vj, _block_mask(mask, i, j, bq, bk, G) & (n < count[i])


def _blocked_fwd_row(q, k, v, mask, order, count, trips, bq, bk, G):
  """One row. q [K, T*G, E] (scaled), k [K, E, S], v [K, S, E] float32,
  mask [T, S]; order/count from `_live_block_order` over key blocks, per query
  block. -> (out [K, T*G, E], log-sum-exp [K, T*G]) float32."""
  K, TG, E = q.shape
  rows = bq * G

  def query_block(i, carry):
    out, lse = carry
    qi = jax.lax.dynamic_slice_in_dim(q, i * rows, rows, axis=1)

    def body(c):
      n, m, l, acc = c
      _, kj, vj, mij = _visited_block(k, v, mask, order, count, i, n, bq, bk, G)
      s = jnp.where(mij, jnp.einsum("kre,kes->krs", qi, kj), MASK_VALUE)
      m_new = jnp.maximum(m, s.max(-1))
      p = jnp.where(mij, jnp.exp(s - m_new[..., None]), 0.0)
      corr = jnp.exp(m - m_new)
      acc = acc * corr[..., None] + jnp.einsum("krs,kse->kre", p, vj)
      return n + 1, m_new, l * corr + p.sum(-1), acc

    init = (jnp.int32(0), jnp.full((K, rows), MASK_VALUE, jnp.float32),
            jnp.zeros((K, rows), jnp.float32), jnp.zeros((K, rows, E), jnp.float32))
    _, m, l, acc = jax.lax.while_loop(lambda c: c[0] < trips[i], body, init)
    seen = l > 0
    o = acc / jnp.where(seen, l, 1.0)[..., None]
    lse_i = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
    out = jax.lax.dynamic_update_slice_in_dim(out, o, i * rows, axis=1)
    return out, jax.lax.dynamic_update_slice_in_dim(lse, lse_i, i * rows, axis=1)

  init = (jnp.zeros((K, TG, E), jnp.float32), jnp.zeros((K, TG), jnp.float32))
  return jax.lax.fori_loop(0, order.shape[0], query_block, init)


def _blocked_bwd_row(q, k, v, mask, out, lse, dout, order, count, trips, bq, bk, G):
  """One row's gradients (dq, dk, dv) of `_blocked_fwd_row` (same order and
  count): per query block, its dq is carried and written once; each visited
  key block's dk and dv are accumulated in place."""
  rows = bq * G
  delta = (dout * out).sum(-1)  # [K, T*G]

  def query_block(i, carry):
    dq, dk, dv = carry
    qi = jax.lax.dynamic_slice_in_dim(q, i * rows, rows, axis=1)
    doi = jax.lax.dynamic_slice_in_dim(dout, i * rows, rows, axis=1)
    li = jax.lax.dynamic_slice_in_dim(lse, i * rows, rows, axis=1)
    di = jax.lax.dynamic_slice_in_dim(delta, i * rows, rows, axis=1)

    def body(c):
      n, dqi, dk, dv = c
      j, kj, vj, mij = _visited_block(k, v, mask, order, count, i, n, bq, bk, G)
      p = jnp.where(mij, jnp.exp(jnp.einsum("kre,kes->krs", qi, kj) - li[..., None]), 0.0)
      ds = p * (jnp.einsum("kre,kse->krs", doi, vj) - di[..., None])
      dkj = jax.lax.dynamic_slice_in_dim(dk, j * bk, bk, axis=2)
      dvj = jax.lax.dynamic_slice_in_dim(dv, j * bk, bk, axis=1)
      dk = jax.lax.dynamic_update_slice_in_dim(
          dk, dkj + jnp.einsum("kre,krs->kes", qi, ds), j * bk, axis=2)
      dv = jax.lax.dynamic_update_slice_in_dim(
          dv, dvj + jnp.einsum("krs,kre->kse", p, doi), j * bk, axis=1)
      return n + 1, dqi + jnp.einsum("krs,kes->kre", ds, kj), dk, dv

    init = (jnp.int32(0), jnp.zeros_like(qi), dk, dv)
    _, dqi, dk, dv = jax.lax.while_loop(lambda c: c[0] < trips[i], body, init)
    return jax.lax.dynamic_update_slice_in_dim(dq, dqi, i * rows, axis=1), dk, dv

  init = (jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v))
  return jax.lax.fori_loop(0, order.shape[0], query_block, init)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _blocked_core(q, k, v, mask, bq, bk, G):
  """q [B, K, T*G, E] (scaled), k [B, K, E, S], v [B, K, S, E] float32, mask
  [B, T, S] bool; T and S multiples of bq and bk -> out [B, K, T*G, E]."""
  return _blocked_fwd(q, k, v, mask, bq, bk, G)[0]


def _live(mask, bq, bk):
  """mask [B, T, S] -> [B, T // bq, S // bk]: blocks with any True entry."""
  B, T, S = mask.shape
  return mask.reshape(B, T // bq, bq, S // bk, bk).any(axis=(2, 4))  # [B, nQ, nK]


def _blocked_fwd(q, k, v, mask, bq, bk, G):
  order, count = _live_block_order(_live(mask, bq, bk))
  fwd = functools.partial(_blocked_fwd_row, bq=bq, bk=bk, G=G)
  trips = count.max(0)  # per query block, the busiest row's key blocks
  out, lse = jax.vmap(fwd, in_axes=(0,) * 6 + (None,))(q, k, v, mask, order, count, trips)
  return out, (q, k, v, mask, out, lse, order, count)


def _blocked_bwd(bq, bk, G, res, dout):
  q, k, v, mask, out, lse, order, count = res
  bwd = functools.partial(_blocked_bwd_row, bq=bq, bk=bk, G=G)
  dq, dk, dv = jax.vmap(bwd, in_axes=(0,) * 9 + (None,))(
      q, k, v, mask, out, lse, dout, order, count, count.max(0))
  return dq, dk, dv, None


_blocked_core.defvjp(_blocked_fwd, _blocked_bwd)


@ATTENTION.register("blocked")
def blocked_attention(q, k, v, mask, block: int | None = None):
  """Flash-style attention that visits only the blocks the mask reaches.

  Shapes as `matmul_attention`. Queries and keys are each cut into equal
  blocks of at most `ATTENTION_BLOCK` (`even_block`; a shorter side is one
  block); each query block runs an online softmax over the key blocks where
  its mask has any True entry, so a causal mask skips about half the products and a packed row of several
  segments (`segment_mask`) skips every block between segments. No [T, S]
  score tensor is formed, forward or backward: the gradient (a custom VJP)
  recomputes each visited block's probabilities from the saved log-sum-exp.
  Under `vmap` over rows a query block loops as long as its busiest row.
  Math in float32; the output in v's dtype. A query with no visible key
  gives 0 (the matmul kernels average every value there; such rows are
  padding and carry no loss).
  """
  B, T, H, E = q.shape
  K, S = k.shape[1], k.shape[3]
  G = H // K
  block = block or ATTENTION_BLOCK
  bq, bk = even_block(T, block), even_block(S, block)
  Tp, Sp = -(-T // bq) * bq, -(-S // bk) * bk
  f32 = jnp.float32
  q = _scaled_queries(q).astype(f32)
  if Tp > T:
    q = jnp.pad(q, ((0, 0), (0, Tp - T), (0, 0), (0, 0)))
  if Tp > T or Sp > S:
    mask = jnp.pad(mask, ((0, 0), (0, Tp - T), (0, Sp - S)))
  k, vf = k.astype(f32), v.astype(f32)
  if Sp > S:
    k = jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, Sp - S)))
    vf = jnp.pad(vf, ((0, 0), (0, 0), (0, Sp - S), (0, 0)))
  q = jnp.transpose(q.reshape(B, Tp, K, G, E), (0, 2, 1, 3, 4)).reshape(B, K, Tp * G, E)
  out = _blocked_core(q, k, vf, mask, bq, bk, G)
  out = jnp.transpose(out.reshape(B, K, Tp, G, E), (0, 2, 1, 3, 4))[:, :T]
  return out.reshape(B, T, H, E).astype(v.dtype)


@ATTENTION.register("auto")
def auto_attention(q, k, v, mask):
  """The default: on CPU "blocked" when the queries span more than one block
  (training rows, long prefills), else "matmul". Elsewhere "matmul": the
  blocked kernel's loops are plain XLA, not a fused accelerator kernel, and
  have not been measured there."""
  if q.shape[1] > ATTENTION_BLOCK and _on_cpu():
    return blocked_attention(q, k, v, mask)
  return matmul_attention(q, k, v, mask)


# -- Decode attention ---------------------------------------------------------

# Largest cache block one decode-attention iteration reads; engines round long
# caches up to a multiple of it.
DECODE_BLOCK = 256

# On CPU, caches of up to this many entries whose keys and values take at most
# CPU_DECODE_WHOLE_BYTES per layer are read whole by an "auto" decode step (no
# block loop); see `decode_attention`.
CPU_DECODE_WHOLE_MAX = 1024
CPU_DECODE_WHOLE_BYTES = 4 << 20
# Larger CPU caches of up to CPU_DECODE_LIVE_BYTES per layer are read whole at
# the steps where the live prefix reaches CPU_DECODE_LIVE_SHARE of the cache
# (the block walk would copy nearly all of it anyway), walked otherwise.
CPU_DECODE_LIVE_BYTES = 16 << 20
CPU_DECODE_LIVE_SHARE = 0.5

# name -> fn(q [B, 1, H, E], k [B, K, E, S], v [B, K, S, E], mask [B, 1, S] bool,
#   live_len scalar) -> [B, 1, H, E] float32.
DECODE_ATTENTION: Registry[Callable[..., jax.Array]] = Registry(
    "decode attention implementation", field="model.decode_attention")


def live_block(S: int, most: int = DECODE_BLOCK) -> int:
  """The decode block size: S itself up to `most`, else the largest power of
  two <= `most` dividing S."""
  if S <= most:
    return S
  b = most
  while S % b:
    b //= 2
  return b


def _sum_scores(q, k):
  """q [B, K, G, E] x keys [B, K, E, S] -> scores [B, K, G, S] as a sum of E
  broadcast products: one loop fusion, vectorised along S."""
  return sum(q[:, :, :, e, None] * k[:, :, None, e, :] for e in range(q.shape[-1]))


def decode_attention(q, k, v, mask, live_len, *, read_whole: bool | float,
                     dot_scores: bool):
  """One query per row over the live blocks of the cache only.

  The registered decode kernels are this function with the two choices made.

  A cache of one block (S <= DECODE_BLOCK), or any cache when `read_whole` is
  True, is read whole without a loop. While a layer's cache is small, the
  loop's block copies cost more than reading the entries past the live prefix;
  for large caches the loop wins (see experiments/benchmarks/decode_attention.py).
  A float `read_whole` in (0, 1] decides at run time: the step reads whole when
  `live_len` is at least that share of the cache, and walks the blocks
  otherwise (`lax.cond`; both are compiled, one runs). A
  whole read's scores are one dot ([G, E] x [E, S] per (B, K)) with
  `dot_scores`, else a sum of E broadcast products (`_sum_scores`): XLA:CPU
  runs the dot as B*K products with only G = H/K rows each, and the
  sum, one loop fusion along the length axis, is faster there.

  Longer caches are walked by a `fori_loop` with a dynamic trip count over
  blocks, with an online softmax, so a step costs what the live prefix
  costs, with no recompiles as it grows. There the probs @ V product is a
  fused multiply-reduce: as a dot on a block slice, XLA:CPU runs it as B*K
  tiny transposed matmuls, which is slower.

  Args:
    q: [B, 1, H, E].
    k: keys [B, K, E, S].
    v: values [B, K, S, E].
    mask: [B, 1, S] bool.
    live_len: scalar; no entry at or after it is visible in any row.
    read_whole: True: read the whole cache even when it is longer than one
      block; False: walk its live blocks; a float share: read whole when the
      live prefix is at least that share of the cache.
    dot_scores: a whole read's scores as a dot rather than a sum of products.

  Returns:
    [B, 1, H, E] float32.
  """
  B, _, H, E = q.shape
  K, S = k.shape[1], k.shape[3]
  G = H // K
  if isinstance(read_whole, float) and not isinstance(read_whole, bool):
    if not 0.0 < read_whole <= 1.0:
      raise ValueError(f"read_whole as a share of the cache must be in (0, 1]; got "
                       f"{read_whole}.")
    if live_block(S) == S:
      read_whole = True
    else:
      whole = functools.partial(decode_attention, read_whole=True, dot_scores=dot_scores)
      walk = functools.partial(decode_attention, read_whole=False, dot_scores=dot_scores)
      at = math.ceil(read_whole * S)
      return jax.lax.cond(live_len >= at, whole, walk, q, k, v, mask, live_len)
  blk = S if read_whole else live_block(S)
  q = (q[:, 0].astype(jnp.float32) / math.sqrt(E)).reshape(B, K, G, E)
  if blk == S:
    kf = k.astype(jnp.float32)
    s = jnp.einsum("bkge,bkes->bkgs", q, kf) if dot_scores else _sum_scores(q, kf)
    s = jnp.where(mask[:, :, None, :], s, MASK_VALUE)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("bkgs,bkse->bkge", p, v.astype(jnp.float32))
    return out.reshape(B, 1, H, E)
  m0 = jnp.full((B, K, G), MASK_VALUE, jnp.float32)
  l0 = jnp.zeros((B, K, G), jnp.float32)
  a0 = jnp.zeros((B, K, G, E), jnp.float32)

  def body(j, carry):
    m, l, acc = carry
    kb = jax.lax.dynamic_slice_in_dim(k, j * blk, blk, axis=3).astype(jnp.float32)
    vb = jax.lax.dynamic_slice_in_dim(v, j * blk, blk, axis=2).astype(jnp.float32)
    mb = jax.lax.dynamic_slice_in_dim(mask[:, 0], j * blk, blk, axis=1)[:, None, None, :]
    s = jnp.einsum("bkge,bkes->bkgs", q, kb)
    s = jnp.where(mb, s, MASK_VALUE)
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


def _on_cpu() -> bool:
  return jax.default_backend() == "cpu"


def _cpu_read_whole(k, v) -> bool | float:
  """A CPU step's `read_whole` for a layer's cache: True when small (entries
  and bytes), the live share when mid-sized (`CPU_DECODE_LIVE_BYTES`), False
  (the walk) beyond."""
  nbytes = k.size * k.dtype.itemsize + v.size * v.dtype.itemsize
  if k.shape[3] <= CPU_DECODE_WHOLE_MAX and nbytes <= CPU_DECODE_WHOLE_BYTES:
    return True
  return CPU_DECODE_LIVE_SHARE if nbytes <= CPU_DECODE_LIVE_BYTES else False


@DECODE_ATTENTION.register("auto")
def auto_decode_attention(q, k, v, mask, live_len):
  """The default. On CPU: small caches (`CPU_DECODE_WHOLE_MAX` entries,
  `CPU_DECODE_WHOLE_BYTES`) read whole with sum-of-products scores; mid-sized
  ones (`CPU_DECODE_LIVE_BYTES`) read whole at the steps whose live prefix is at
  least `CPU_DECODE_LIVE_SHARE` of the cache and walked block by block before;
  larger ones walked. Elsewhere: the block walk, with dot scores when the
  cache is one block."""
  cpu = _on_cpu()
  return decode_attention(q, k, v, mask, live_len,
                          read_whole=_cpu_read_whole(k, v) if cpu else False,
                          dot_scores=not cpu)


@DECODE_ATTENTION.register("blocks")
def blocks_decode_attention(q, k, v, mask, live_len):
  """The block walk for every cache longer than one block (`DECODE_BLOCK`),
  on every backend; scores of a one-block cache as in "auto"."""
  return decode_attention(q, k, v, mask, live_len, read_whole=False,
                          dot_scores=not _on_cpu())


@DECODE_ATTENTION.register("whole")
def whole_decode_attention(q, k, v, mask, live_len):
  """The whole cache every step, no block loop: two dots per layer on an
  accelerator (sum-of-products scores on CPU), reading past the live prefix.
  Meant for accelerators, where one large product can beat a loop of small
  ones even though it reads the dead tail of the cache."""
  return decode_attention(q, k, v, mask, live_len, read_whole=True,
                          dot_scores=not _on_cpu())


@DECODE_ATTENTION.register("dot")
def dot_decode_attention(q, k, v, mask, live_len):
  """As "auto", but a whole read's scores are one dot product on every backend
  (on CPU instead of the sum of products)."""
  return decode_attention(q, k, v, mask, live_len,
                          read_whole=_cpu_read_whole(k, v) if _on_cpu() else False,
                          dot_scores=True)
