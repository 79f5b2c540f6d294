"""The engine's device programs: its state, extend, decode (all rows or a few), share, truncate,
release.

Pure functions over a :class:`DecodeState`; :func:`programs` jits them for one state layout
(:class:`spade_jax.sampling.engine.Engine` calls them and says what they do to the cache).
"""

from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp

from spade_jax.models import (ModelConfig, decode_step, forward, init_cache,
                              logits_from_hidden)
from spade_jax.sampling.rules import SamplingConfig, draw, is_stop, token_logprob


@flax.struct.dataclass
class DecodeState:
  """Device-side state of every slot.

  Row b's tokens sit in cache entries [0, lengths[b]), in order: an entry's
  index is its token's RoPE position, and entries at or past `lengths[b]` are
  never read for that row.

  Attributes:
    cache: {"k", "v"}: keys [L, B, K, E, S] and values [L, B, K, S, E], or
      tuples of L per-layer buffers.
    lengths: [B] int32 tokens in each row (its next write index and position).
    logits: [B, V] float32 next-token logits of each row.
    keys: [B] per-row PRNG keys (draws use fold_in(key, position)).
  """

  cache: dict[str, jax.Array]
  lengths: jax.Array
  logits: jax.Array
  keys: jax.Array


def init_state(cfg: ModelConfig, slots: int, cache_len: int, cache_dtype: str,
               per_layer: bool) -> DecodeState:
  """Empty state for `slots` rows of `cache_len` cache entries."""
  return DecodeState(
      cache=init_cache(cfg, slots, cache_len, cache_dtype, per_layer=per_layer),
      lengths=jnp.zeros((slots,), jnp.int32),
      logits=jnp.zeros((slots, cfg.vocab_size), jnp.float32),
      keys=jax.random.split(jax.random.key(0), slots))


def _rows_of(cache, rows, span: int):
  """The cache of `rows` ([n] distinct row indices), cut to entries [0, span)."""
  per_layer = isinstance(cache["k"], tuple)
  def take(c, axis):  # axis: the length axis counted from the end
    c = c.at[rows].get(mode="clip") if per_layer else c.at[:, rows].get(mode="clip")
    return c[..., :span] if axis == -1 else c[..., :span, :]
  return {"k": jax.tree.map(lambda c: take(c, -1), cache["k"]),
          "v": jax.tree.map(lambda c: take(c, -2), cache["v"])}


def _put_rows(cache, rows, sub):
  """`cache` with `sub` (as `_rows_of` cut it) written back to `rows`."""
  per_layer = isinstance(cache["k"], tuple)
  def put(c, x, axis):
    span = x.shape[axis]
    if per_layer:
      return (c.at[rows, ..., :span].set(x, mode="drop") if axis == -1
              else c.at[rows, :, :span, :].set(x, mode="drop"))
    return (c.at[:, rows, ..., :span].set(x, mode="drop") if axis == -1
            else c.at[:, rows, :, :span, :].set(x, mode="drop"))
  return {"k": jax.tree.map(lambda c, x: put(c, x, -1), cache["k"], sub["k"]),
          "v": jax.tree.map(lambda c, x: put(c, x, -2), cache["v"], sub["v"])}


def extend_step(params, state: DecodeState, rows, tokens, offset, count, reset, new_keys, *,
                cfg: ModelConfig, span: int, subset: bool) -> DecodeState:
  """Appends a chunk of tokens to some rows, each at its own end.

  Args:
    params: model parameters.
    state: current state.
    rows: [n] int32 distinct rows this chunk is for (with `subset`; otherwise
      n == B and rows[i] == i).
    tokens: [n, T] int32: row i's new tokens at [offset[i], offset[i] + count[i]).
    offset: [n] int32: the chunk of row i is written from cache entry
      lengths[i] - offset[i] (a row near the end of the cache rewrites its last
      offset[i] entries with their own values); T for a row that takes none.
    count: [n] int32 real tokens per row (0: the row only takes its reset).
    reset: [n] bool, rows that start a new conversation (history dropped and
      key replaced by `new_keys`) before the chunk is appended.
    new_keys: [n] keys used where `reset`.
    span: static; attention reads cache entries [0, span) (every row's
      length - offset + T <= span).
    subset: static; run the model on the `rows` only (their cache gathered and
      written back), not on every row.

  Returns:
    The state with the chunk in the cache; rows with at least one token get
    the logits after their last token.
  """
  n, T = tokens.shape
  # Rows past B pad a subset to its bucket: read clipped, never written back.
  get = lambda a: a.at[rows].get(mode="clip")
  lengths = jnp.where(reset, 0, get(state.lengths))
  kd = jax.random.key_data(state.keys)
  keys = jnp.where(reset[:, None], jax.random.key_data(new_keys), get(kd))
  start = lengths - offset
  positions = start[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
  # Entry s of a row holds position s: query t sees entries up to its own.
  mask = jnp.arange(span)[None, None, :] <= positions[:, :, None]
  write = jnp.arange(T)[None, :] >= offset[:, None]
  cache = _rows_of(state.cache, rows, span) if subset else state.cache
  hidden, cache = forward(params, cfg, tokens, positions, mask, cache, start,
                          attend_len=None if subset else span, return_hidden=True,
                          write_mask=write)
  if subset:
    cache = _put_rows(state.cache, rows, cache)
  last = jnp.clip(offset + count - 1, 0, T - 1)
  h = jnp.take_along_axis(hidden, last[:, None, None], axis=1)
  out = logits_from_hidden(params, cfg, h)[:, 0]
  out = jnp.where((count > 0)[:, None], out, get(state.logits))
  put = lambda a, x: a.at[rows].set(x, mode="drop")
  return DecodeState(cache=cache, lengths=put(state.lengths, lengths + count),
                     logits=put(state.logits, out),
                     keys=jax.random.wrap_key_data(put(kd, keys)))


def _tempered(logits: jax.Array, rule: SamplingConfig) -> jax.Array:
  """[B, V] logits of the policy whose log-probs are recorded (and trained)."""
  t = rule.logprob_temperature
  return logits if t == 1.0 else logits / jnp.float32(t)


def decode_loop(params, state: DecodeState, active, budget, stop_on_finish, shrink=0, *,
                cfg: ModelConfig, rule: SamplingConfig, steps: int,
                feature_major: bool = False):
  """Samples up to `steps` tokens for every active row.

  Args:
    params: model parameters, or with `feature_major` the
      `decode.decode_params` layout (each step then runs `decode.decode_step`).
    state: current state; active rows' `logits` must be fresh.
    active: [B] bool rows to decode.
    budget: [B] int32 maximum tokens per row in this call (<= steps).
    stop_on_finish: scalar bool; leave the loop as soon as any row stops.
    shrink: scalar int; leave the loop once at most this many rows are still
      running (and some are), so the caller can go on with those rows on a
      narrower program (0: never).

  Returns:
    (state, tokens [B, steps] int32 (pad after a row stopped), logprobs
    [B, steps] float32 of the tempered policy (`rule.logprob_temperature`),
    hit_eos [B] bool, steps_run
    scalar int32). Row b's i-th token goes to cache entry lengths[b] + i.
  """
  B = active.shape[0]
  S = jax.tree.leaves(state.cache["v"])[0].shape[-2]
  done0 = ~active | (budget <= 0)

  def cond(c):
    step, _, done, _, _, _, finished_any = c
    running = jnp.sum(~done)
    return ((step < steps) & (running > 0) & ~(stop_on_finish & finished_any)
            & ~(finished_any & (running <= shrink)))

  def body(c):
    step, st, done, toks, logps, eos, _ = c
    tok = draw(st.logits, st.keys, st.lengths, rule)
    logp = token_logprob(_tempered(st.logits, rule), tok)
    emit = ~done
    tok = jnp.where(emit, tok, rule.pad_id)
    toks = jax.lax.dynamic_update_index_in_dim(toks, tok, step, 1)
    logps = jax.lax.dynamic_update_index_in_dim(logps, jnp.where(emit, logp, 0.0), step, 1)
    # Every row writes at its own end; a row that does not emit writes an
    # entry it never reads (its length does not move past it).
    visible = jnp.arange(S)[None, :] < (st.lengths + emit)[:, None]
    live = jnp.max(st.lengths) + 1  # attention walks only the blocks before it
    if feature_major:
      logits, cache = decode_step(params, cfg, tok, st.lengths, visible, st.cache,
                                  st.lengths, live)
    else:
      logits, cache = forward(params, cfg, tok[:, None], st.lengths[:, None],
                              visible[:, None, :], st.cache, st.lengths, live_len=live)
      logits = logits[:, 0]
    hit = emit & is_stop(tok, rule)
    eos = eos | hit
    counts_after = step + 1  # every emitting row has emitted step + 1 tokens
    newly = emit & (hit | (counts_after >= budget))
    st = DecodeState(cache=cache, lengths=st.lengths + emit,
                     logits=jnp.where(emit[:, None], logits, st.logits), keys=st.keys)
    return step + 1, st, done | newly, toks, logps, eos, jnp.any(newly)

  carry = (jnp.int32(0), state, done0, jnp.full((B, steps), rule.pad_id, jnp.int32),
           jnp.zeros((B, steps), jnp.float32), jnp.zeros((B,), bool), jnp.bool_(False))
  n, state, _, toks, logps, eos, _ = jax.lax.while_loop(cond, body, carry)
  return state, toks, logps, eos, n


def decode_rows(params, state: DecodeState, rows, active, budget, stop_on_finish, shrink=0, *,
                cfg: ModelConfig, rule: SamplingConfig, steps: int, feature_major: bool = False):
  """`decode_loop` on the `rows` only ([n] distinct rows; indices past B pad the
  bucket: read clipped, never written back): their state is gathered, decoded and
  written back, so a step costs n rows, not B. `active` / `budget` are [n]; the
  returned tokens, log-probs and stop flags are [n, ...] in `rows` order."""
  get = lambda a: a.at[rows].get(mode="clip")
  kd = jax.random.key_data(state.keys)
  S = jax.tree.leaves(state.cache["v"])[0].shape[-2]
  sub = DecodeState(cache=_rows_of(state.cache, rows, S), lengths=get(state.lengths),
                    logits=get(state.logits), keys=jax.random.wrap_key_data(get(kd)))
  sub, toks, logps, eos, n = decode_loop(params, sub, active, budget, stop_on_finish, shrink,
                                         cfg=cfg, rule=rule, steps=steps,
                                         feature_major=feature_major)
  put = lambda a, x: a.at[rows].set(x, mode="drop")
  state = DecodeState(cache=_put_rows(state.cache, rows, sub.cache),
                      lengths=put(state.lengths, sub.lengths),
                      logits=put(state.logits, sub.logits), keys=state.keys)
  return state, toks, logps, eos, n


def share_step(state: DecodeState, src, dst, reset, new_keys, *, span: int) -> DecodeState:
  """Copies row src[i] onto row dst[i]: its cache entries [0, span), length and logits.

  Args:
    state: current state.
    src: [n] int32 rows copied from (each row's length <= span).
    dst: [n] int32 distinct rows copied to, none of them in `src`; indices past B pad the
      bucket: never written.
    reset: [n] bool: dst[i] takes the key new_keys[i]; otherwise it keeps its own key.
    new_keys: [n] keys used where `reset`.
    span: static; cache entries copied per row.
  """
  cache = _put_rows(state.cache, dst, _rows_of(state.cache, src, span))
  get = lambda a, rows: a.at[rows].get(mode="clip")
  put = lambda a, x: a.at[dst].set(x, mode="drop")
  kd = jax.random.key_data(state.keys)
  keys = jnp.where(reset[:, None], jax.random.key_data(new_keys), get(kd, dst))
  return DecodeState(cache=cache, lengths=put(state.lengths, get(state.lengths, src)),
                     logits=put(state.logits, get(state.logits, src)),
                     keys=jax.random.wrap_key_data(put(kd, keys)))


def truncate_step(state: DecodeState, drop) -> DecodeState:
  """Drops the last `drop[b]` tokens of each row b."""
  return state.replace(lengths=state.lengths - drop)


def release_step(state: DecodeState, released) -> DecodeState:
  """Empties the rows where `released` ([B] bool) is set."""
  return state.replace(lengths=jnp.where(released, 0, state.lengths))


@functools.lru_cache(maxsize=None)
def programs(shards: tuple | None):
  """Jitted engine programs for one state layout (None: default device).

  Args:
    shards: ((key cache, value cache), lengths, logits, keys) shardings, or
      None.
  """
  out = None
  if shards is not None:
    c, n, lg, k = shards
    out = DecodeState(cache={"k": c[0], "v": c[1]}, lengths=n, logits=lg, keys=k)
  init = jax.jit(init_state, static_argnums=(0, 1, 2, 3, 4), out_shardings=out)
  extend = jax.jit(extend_step, static_argnames=("cfg", "span", "subset"), donate_argnums=(1,),
                   out_shardings=out)
  decode = jax.jit(decode_loop, static_argnames=("cfg", "rule", "steps", "feature_major"),
                   donate_argnums=(1,),
                   out_shardings=None if out is None else (out, None, None, None, None))
  decode_sub = jax.jit(decode_rows, static_argnames=("cfg", "rule", "steps", "feature_major"),
                       donate_argnums=(1,),
                       out_shardings=None if out is None else (out, None, None, None, None))
  share = jax.jit(share_step, static_argnames=("span",), donate_argnums=(0,),
                  out_shardings=out)
  truncate = jax.jit(truncate_step, donate_argnums=(0,), out_shardings=out)
  release = jax.jit(release_step, donate_argnums=(0,), out_shardings=out)
  return init, extend, decode, decode_sub, share, truncate, release
