"""KV-cache decode engine: fixed slots, per-row cache ends, chunked extend, while-loop decode.

The engine holds one KV cache of `slots` rows. Every row is an independent
conversation whose tokens sit in its first `lengths[row]` cache entries, in
order (an entry's index is its token's RoPE position); two compiled programs
advance it:

* **extend** (prefill / continuation): writes a chunk of new tokens at the
  end of each row that takes some and computes those rows' next-token logits.
  A first prompt, an environment observation appended after a turn, and a
  waiting request taking a freed slot are all extends; history already in the
  cache is never recomputed. Where the rows live on one device an extend runs
  the model on the rows that take tokens only (padded to a power of two), so a
  conversation rejoining alone costs one row, not the batch.
  There, too, rows that start a conversation with the same prompt in one extend
  (GRPO plays each prompt several times) compute it once: one row per distinct
  prompt runs the model, and a copy program (`steps.share_step`) gives every
  other row that row's cache entries, length and logits, and the row's own key,
  so each row samples exactly as if it had computed its prompt
  (`share_prompts=False` turns this off).
* **decode**: a `lax.while_loop` that samples one token per active row per
  step, writes it at that row's end and stops when every active row has
  stopped (EOS id or its own token budget), or when a row finishes and the
  caller asked to refill slots. Where rows live on one device, it also stops
  once the rows still running fit half its width, and the call goes on with
  those rows alone (see `decode_subset`), so stragglers do not pay for the rows
  that finished.

Each row writes at its own end, so rows that extend and decode at different
times (continuous batching, overlapped episodes) never leave gaps in another
row's cache: a row's cache holds exactly its own tokens, and releasing it
empties it. No compaction is ever needed, and the cache only has to hold the
longest conversation (plus one spare entry).

The cache (bf16 by default; fp32 for exactness checks) is donated to each
program, so it is updated in place. On a mesh, rows are sharded over the batch
axes of the rule set and kv heads over "tensor". `set_params` takes a new
parameter tree and reshards it device to device onto the engine's layout.

An extend attends only over the cache prefix that can hold the rows' entries
(the longest row's end rounded up to a power of two); a decode step walks the
cache in blocks up to the longest row's end (a loop with a dynamic trip count,
online softmax), so both cost what the live prefix costs, not the cache
length. (On CPU a decode step reads small caches whole: see
`attention.decode_attention`; `ModelConfig.decode_attention` chooses.)
Keys are cached length-last ([B, K, E, S]), values [B, K, S, E].

On one CPU device with 2+ slots, decode steps run feature-major
(`decode.decode_step`: hidden state [D, B], per-layer weights [out, in], from
a second copy of the weights made by `set_params`); elsewhere they run
`qwen3.forward`. Both give the same tokens (`decode_layout=` chooses).
The device programs themselves are in `sampling/steps.py`. Compiled programs: one
extend per (rows bucket, chunk-length bucket, span), one decode per step-count bucket,
one share per (rows bucket, span); buckets and spans are powers of two, so their number
grows with log2 of the slots and the cache length; `programs` lists them.
"""

from __future__ import annotations

from typing import Callable, Sequence

from absl import logging
import jax
from jax.sharding import Mesh, NamedSharding
import numpy as np

from spade_jax import parallel
from spade_jax.models import (DECODE_BLOCK, KEY_CACHE_AXES, VALUE_CACHE_AXES, ModelConfig,
                              cache_shapes, decode_params, param_axes, param_shapes)
from spade_jax.sampling.rules import SamplingConfig
# The device programs live in `steps`; their names stay importable from here.
from spade_jax.sampling.steps import (DecodeState, decode_loop, decode_rows,  # noqa: F401
                                      extend_step, init_state, programs, release_step,
                                      share_step, truncate_step)

# Logical axes of the stacked key / value caches; per-layer buffers drop "layers".
CACHE_AXES = {"k": KEY_CACHE_AXES, "v": VALUE_CACHE_AXES}
# Slots from which "auto" picks the feature-major decode step on CPU. Its
# steps are faster at every batch, but every engine first makes the weight
# copy, which one-row `generate` calls do not win back (see
# experiments/benchmarks/decode_layout.py, which prints each layout's step
# time and engine start, and experiments/benchmarks/sampler.py).
FEATURE_MAJOR_MIN_SLOTS = 2
# What one more extend call costs, in token positions computed (dispatch, the rows'
# cache gathered and written back), when `Engine` weighs splitting rows into groups.
EXTEND_CALL_COST = 32


def bucket(n: int, minimum: int = 16) -> int:
  """Smallest power of two >= max(n, minimum)."""
  return max(minimum, 1 << max(0, int(n) - 1).bit_length())


class Engine:
  """Fixed-slot KV-cache sampler with multi-turn continuation and slot refill.

  Host-side bookkeeping lives here (each row's length, which rows have fresh
  logits); all arrays stay on device between calls.

  Args:
    cfg: model config.
    params: model parameters (any layout; resharded onto the engine's).
    slots: number of rows (rounded up to a multiple of the batch shards).
    max_len: tokens one row may hold, rounded up (`self.max_len`): up to 240 to
      a multiple of 16, with a cache (`cache_len` entries per row) 16 longer;
      beyond, so that max_len + 1 is a multiple of 256, the cache.
    rule: sampling rule (static: a new rule compiles new decode programs).
    mesh, rules: optional mesh and logical-axis rule set; without them the
      engine runs on the default device.
    cache_dtype: KV cache dtype; default the model's compute dtype (bfloat16 for
      the real presets; "float32" for exactness checks).
    chunk: decode steps per host round trip when stop strings are set.
    detokenize: ids -> text, needed for stop strings.
    layer_cache: "per_layer" (one KV buffer per layer, layers unrolled: no
      layer slice is copied per step, fastest on CPU), "stacked" (one key and
      one value buffer with a leading layer axis, layers scanned when
      `cfg.scan_layers`: compile time independent of depth) or "auto"
      (per_layer on CPU, else stacked).
    prefill_chunk: longest piece (a power of two) one extend program takes;
      longer chunks are appended in pieces, each attending only over the cache
      so far. Default 128 on CPU, 1024 elsewhere.
    decode_layout: "feature_major" (decode steps run `decode.decode_step` on a
      second copy of the weights in [out, in] layout, kept in step with
      `set_params`; faster matrix products on CPU from a few rows up),
      "batch_major" (decode runs `forward`; no second copy) or "auto"
      (feature_major on one CPU device with at least `FEATURE_MAJOR_MIN_SLOTS`
      slots, else batch_major). The copy doubles the weights' memory: pass
      batch_major for a model that only just fits.
    decode_subset: where the rows live on one device, a decode call whose active
      rows fit a smaller power of two (at least 2) than the slots runs on those rows
      only (their cache gathered and written back), and a decode whose running rows
      drop to half its width or fewer goes on with those rows on the narrower
      program, so stragglers and a few long requests do not pay for the whole batch
      each step. False: every decode step runs every row.
    group_extends: where extends run on a subset of the rows (one device), an extend
      whose rows' chunks differ in length runs as a few calls, one per group of rows
      with chunks of about the same length, when that computes fewer padded token
      positions (`_extend_groups`). False: one call pads every row to the longest chunk.
    share_prompts: where extends run on a subset of the rows (one device), rows of one
      extend that start a conversation (in `starts`, or empty) with the same chunk compute
      it once and copy the result (`_shared_starts`). False: every row computes its own.

  Attributes:
    extend_positions: [real tokens, token positions computed] by extends so far (their
      ratio is how much of the extend work was padding); rows given a shared prompt
      count in neither.
    shared_prompts: [rows, tokens] that extends copied from another row with the same
      prompt instead of computing them.
  """

  def __init__(self, cfg: ModelConfig, params, *, slots: int, max_len: int,
               rule: SamplingConfig, mesh: Mesh | None = None, rules=None,
               cache_dtype: str | None = None, chunk: int = 64,
               detokenize: Callable[[Sequence[int]], str] | None = None,
               layer_cache: str = "auto", prefill_chunk: int | None = None,
               decode_layout: str = "auto", decode_subset: bool = True,
               group_extends: bool = True, share_prompts: bool = True):
    if layer_cache not in ("auto", "per_layer", "stacked"):
      raise ValueError(f"layer_cache={layer_cache!r}; expected 'auto', 'per_layer' or "
                       "'stacked'.")
    if decode_layout not in ("auto", "feature_major", "batch_major"):
      raise ValueError(f"decode_layout={decode_layout!r}; expected 'auto', 'feature_major' "
                       "or 'batch_major'.")
    platform = (next(iter(mesh.devices.flat)) if mesh is not None else jax.devices()[0]).platform
    if layer_cache == "auto":
      layer_cache = "per_layer" if platform == "cpu" else "stacked"
    self.per_layer = layer_cache == "per_layer"
    if prefill_chunk is None:
      prefill_chunk = 128 if platform == "cpu" else 1024
    if prefill_chunk < 16 or prefill_chunk & (prefill_chunk - 1):
      raise ValueError(f"prefill_chunk={prefill_chunk} must be a power of two >= 16.")
    self.prefill_chunk = prefill_chunk
    if rule.stop and detokenize is None:
      raise ValueError(f"rule.stop={rule.stop!r} needs a detokenizer: pass "
                       "detokenize=vocab.decode.")
    self.cfg, self.rule, self.chunk, self.detokenize = cfg, rule, chunk, detokenize
    self._device_rule = rule.without_stop_strings()
    self.mesh, self.rules = mesh, rules
    div = parallel.batch_divisor(mesh, rules) if mesh is not None else 1
    self.slots = -(-slots // div) * div
    if decode_layout == "auto":
      one_cpu = platform == "cpu" and (mesh is None or mesh.devices.size == 1)
      decode_layout = ("feature_major" if one_cpu and self.slots >= FEATURE_MAJOR_MIN_SLOTS
                       else "batch_major")
    self.feature_major = decode_layout == "feature_major"
    # One spare entry: a row that does not emit in a decode step writes there.
    # Within one decode-attention block, max_len rounds up to a multiple of 16 and
    # the cache holds 16 more; past it, the cache is max_len + 1 rounded up to a
    # multiple of the block, all of it but the spare for the row (576 -> 768).
    up = lambda n, m: -(-int(n) // m) * m
    if up(max_len, 16) + 1 > DECODE_BLOCK:
      self.cache_len = up(max_len + 1, DECODE_BLOCK)
      self.max_len = self.cache_len - 1
    else:
      self.max_len = up(max_len, 16)
      self.cache_len = self.max_len + 16
    self.cache_dtype = cache_dtype or cfg.compute_dtype
    self.lengths = np.zeros(self.slots, np.int64)  # host copy of state.lengths
    # Extends run the model on the rows that take tokens only (a gather and a
    # write-back of their cache) where the rows live on one device.
    self._subset = mesh is None or mesh.devices.size == 1
    self._decode_subset = self._subset and decode_subset
    self.group_extends, self.share_prompts = group_extends, share_prompts
    self.extend_positions = [0, 0]
    self.shared_prompts = [0, 0]
    self.fresh = np.zeros(self.slots, bool)  # rows whose logits follow their last token
    self.programs: set[tuple] = set()
    self._param_shardings = self._state_shardings = None
    if mesh is not None:
      self._param_shardings = parallel.tree_shardings(
          param_axes(cfg), param_shapes(cfg), mesh, rules)
      spec = lambda axes, shape: NamedSharding(
          mesh, parallel.logical_to_spec(axes, shape, mesh, rules))
      B, S = self.slots, self.cache_len
      shapes = cache_shapes(cfg, B, S, self.per_layer)
      cache = tuple((spec(CACHE_AXES[n][1:], shapes[n]),) * cfg.num_layers if self.per_layer
                    else spec(CACHE_AXES[n], shapes[n]) for n in ("k", "v"))
      self._state_shardings = (
          cache, spec(("batch",), (B,)), spec(("batch", "vocab"), (B, cfg.vocab_size)),
          spec(("batch",), (B,)))
    (self._init, self._extend, self._decode, self._decode_rows, self._share, self._truncate,
     self._release) = programs(self._state_shardings)
    self.params = self.decode_params = None
    self.set_params(params)
    self.state = self._init(cfg, self.slots, self.cache_len, self.cache_dtype, self.per_layer)
    if self._state_shardings is None:
      # Committed to the parameters' device like every program's output, so the first
      # extend compiles once rather than once for the fresh state and again after.
      leaf = jax.tree.leaves(self.params)[0]
      device = next(iter(leaf.devices())) if isinstance(leaf, jax.Array) else jax.devices()[0]
      self.state = jax.device_put(self.state, device)
    self._key_shape = jax.random.key_data(self.state.keys).shape[1:]

  # -- parameters ---------------------------------------------------------------
  def set_params(self, params) -> None:
    """Takes new parameters (e.g. after a train step), resharding on device if needed."""
    if self._param_shardings is not None:
      params = jax.device_put(params, self._param_shardings)
    elif any(len(x.sharding.device_set) > 1 for x in jax.tree.leaves(params)
             if isinstance(x, jax.Array)):
      # No inference mesh given: gather onto one device (device to device).
      params = jax.device_put(params, jax.devices()[0])
    self.params = params
    # The decode copy holds new per-layer buffers (the embedding and head are
    # shared); the old copy is freed with the old parameters.
    self.decode_params = decode_params(params, self.cfg) if self.feature_major else params

  # -- bookkeeping ----------------------------------------------------------------
  def _log_program(self, kind: str, *shape) -> None:
    key = (kind, *shape)
    self.programs.add(key)
    full = key + (self.cfg, self.slots, self.cache_len, self.cache_dtype, self.per_layer,
                  self.feature_major, self._state_shardings)
    if full not in _PROGRAMS:
      _PROGRAMS.add(full)
      logging.info("sampler: compiling %s %s (slots=%d, cache=%d; %d programs here)",
                   kind, shape, self.slots, self.cache_len, len(self.programs))

  def _span(self, end: int) -> int:
    """Cache entries an extend attends over to see everything before `end`:
    a power of two (bounded compiles) capped at the cache length."""
    return min(self.cache_len, bucket(end))

  def _check_room(self, b: int, have: int, need: int) -> None:
    if have + need > self.max_len:
      raise ValueError(
          f"Slot {b} holds {have} tokens and needs {need} more, beyond the cache's "
          f"{self.max_len} entries per row. Raise max_len or end the row (release it).")

  # -- public API -------------------------------------------------------------------
  def extend(self, chunks: dict[int, Sequence[int]],
             starts: dict[int, jax.Array] | None = None) -> None:
    """Appends tokens to rows; `starts` rows begin a new conversation with that key.

    Args:
      chunks: slot -> new token ids (at least one each).
      starts: slot -> PRNG key for rows whose history is dropped first (a typed
        key, or its `jax.random.key_data` as a NumPy array).
    """
    starts = starts or {}
    for b in starts:
      if b not in chunks:
        raise ValueError(f"Slot {b} starts a conversation but has no tokens; pass its prompt.")
    if not chunks:
      return
    lengths = self.lengths.copy()
    for b, ids in chunks.items():
      if not 0 <= b < self.slots:
        raise ValueError(f"Slot {b} is out of range [0, {self.slots}).")
      if len(ids) == 0:
        raise ValueError(f"Slot {b} got an empty chunk; every chunk needs a token.")
      if b in starts:
        lengths[b] = 0
      self._check_room(b, int(lengths[b]), len(ids))
    shared = self._shared_starts(chunks, lengths)
    computed = {b: ids for b, ids in chunks.items() if b not in shared}
    for group in self._extend_groups(computed):
      self._extend_pieces({b: computed[b] for b in group}, starts, lengths)
    if shared:
      self._copy_prompts(shared, starts, lengths)
    self.lengths = lengths
    self.fresh[list(chunks)] = True

  def _shared_starts(self, chunks: dict[int, Sequence[int]], lengths: np.ndarray
                     ) -> dict[int, int]:
    """Rows whose prompt another row computes: row -> that row.

    A row starting a conversation (`lengths` 0: in `starts` or empty) whose chunk is
    token for token that of a lower such row copies that row's result. A row that
    continues its history never does. Only where extends run on a subset of the rows
    (elsewhere every row runs anyway) and `share_prompts` is on.
    """
    if not (self._subset and self.share_prompts):
      return {}
    first: dict[tuple[int, ...], int] = {}
    shared = {}
    for b in sorted(chunks):
      if lengths[b] == 0:
        src = first.setdefault(tuple(int(t) for t in chunks[b]), b)
        if src != b:
          shared[b] = src
    return shared

  def _copy_prompts(self, shared: dict[int, int], starts: dict[int, jax.Array],
                    lengths: np.ndarray) -> None:
    """Gives each row of `shared` its source row's cache, length and logits, and its own
    key where it starts (`lengths`: host lengths, updated in place)."""
    n = bucket(len(shared), 2)
    pad = [self.slots] * (n - len(shared))
    dst = np.asarray(list(shared) + pad, np.int32)
    src = np.asarray(list(shared.values()) + pad, np.int32)
    reset = np.zeros(n, bool)
    keys = np.zeros((n,) + self._key_shape, np.uint32)
    for i, b in enumerate(shared):
      if b in starts:
        reset[i], keys[i] = True, _key_data(starts[b])
    span = self._span(max(int(lengths[b]) for b in shared.values()))
    self._log_program("share", n, span)
    self.state = self._share(self.state, src, dst, reset, jax.random.wrap_key_data(keys),
                             span=span)
    for b, s in shared.items():
      lengths[b] = lengths[s]
      self.shared_prompts[0] += 1
      self.shared_prompts[1] += int(lengths[s])

  def _extend_groups(self, chunks: dict[int, Sequence[int]]) -> list[list[int]]:
    """Rows of one extend call each: rows with chunks of about the same length go together.

    Every row of a call is padded to its longest chunk (a power of two) and the rows to a
    power of two, so one call over a 20-token and a 60-token observation computes 128
    token positions. Rows are grouped by chunk-length bucket, and neighbouring groups
    merged where one call computes no more positions than two (plus `EXTEND_CALL_COST`
    for the extra call). Only where extends run on a subset of the rows (one device) and
    `group_extends` is on; otherwise one group.
    """
    if not (self._subset and self.group_extends) or len(chunks) < 2:
      return [sorted(chunks)]
    width = lambda b: min(bucket(len(chunks[b])), self.prefill_chunk)
    groups: list[tuple[int, list[int]]] = []  # (chunk bucket, rows), buckets rising
    for b in sorted(chunks, key=lambda b: (width(b), b)):
      if groups and groups[-1][0] == width(b):
        groups[-1][1].append(b)
      else:
        groups.append((width(b), [b]))
    cost = lambda n, c: min(bucket(n, 2), self.slots) * c + EXTEND_CALL_COST
    merged = [groups[-1]]
    for c, rows in reversed(groups[:-1]):
      top_c, top = merged[-1]
      if cost(len(rows) + len(top), top_c) <= cost(len(rows), c) + cost(len(top), top_c):
        merged[-1] = (top_c, sorted(rows + top))
      else:
        merged.append((c, sorted(rows)))
    return [rows for _, rows in reversed(merged)]

  def _extend_pieces(self, chunks: dict[int, Sequence[int]], starts: dict[int, jax.Array],
                     lengths: np.ndarray) -> None:
    """One group's extend calls (`lengths`: host lengths, updated in place)."""
    key_shape = self._key_shape
    longest = max(len(t) for t in chunks.values())
    # Long chunks go in pieces of `prefill_chunk` tokens, each attending only
    # over the cache written so far: causal attention then costs about half of
    # one pass over the whole chunk. A piece runs the model on the rows that
    # still have tokens in it (padded to a power of two, at least 2; every row
    # when that is not fewer, or on a multi-device mesh).
    c = min(bucket(longest), self.prefill_chunk)
    while c > self.cache_len:
      c //= 2
    for j in range(0, longest, c):
      part = [b for b in sorted(chunks) if len(chunks[b]) > j]
      # At least 2 rows: XLA's CPU programs for one row run slower than for two.
      n = bucket(len(part), 2)
      subset = self._subset and n < self.slots
      rows = part + [self.slots] * (n - len(part)) if subset else list(range(self.slots))
      span = self._span(max(int(lengths[b]) for b in part) + c)
      tokens = np.full((len(rows), c), self.rule.pad_id, np.int32)
      offset = np.full(len(rows), c, np.int32)
      count = np.zeros(len(rows), np.int32)
      reset = np.zeros(len(rows), bool)
      keys = np.zeros((len(rows),) + key_shape, np.uint32)
      for i, b in enumerate(rows):
        if b >= self.slots or len(chunks.get(b, ())) <= j:
          continue
        piece = chunks[b][j:j + c]
        # A row whose piece would pass the span starts it early (see extend_step).
        offset[i] = max(0, int(lengths[b]) + c - span)
        tokens[i, offset[i]:offset[i] + len(piece)], count[i] = piece, len(piece)
        if j == 0 and b in starts:
          reset[i], keys[i] = True, _key_data(starts[b])
      self._log_program("extend", len(rows), c, span)
      self.state = self._extend(self.params, self.state, np.asarray(rows, np.int32), tokens,
                                offset, count, reset, jax.random.wrap_key_data(keys), cfg=self.cfg,
                                span=span, subset=subset)
      for i, b in enumerate(rows):
        if b < self.slots:
          lengths[b] += count[i]
      self.extend_positions[0] += int(count.sum())
      self.extend_positions[1] += len(rows) * c

  def decode(self, budgets: dict[int, int], *, stop_on_finish: bool = False
             ) -> dict[int, tuple[list[int], list[float], bool]]:
    """Samples up to `budgets[slot]` tokens for each given slot.

    Rows stop at a stop id (kept in their tokens), at a stop string (host-side
    check after each chunk of `chunk` steps when `rule.stop` is set; the row
    keeps the token that completes the string and the tokens after it are
    removed from the cache) or at their budget. With `stop_on_finish` the call
    returns as soon as any row stops, with the other rows' partial output
    (call again to continue them).

    Returns:
      slot -> (token ids, log-probs under the raw model, stopped on EOS or stop
      string).
    """
    for b in budgets:
      if not self.fresh[b]:
        raise ValueError(f"Slot {b} has no fresh logits: extend it (a prompt or an "
                         "observation) before decoding.")
    out = {b: ([], [], False) for b in budgets}
    remaining = dict(budgets)
    # One step count for every pass of this call (a later pass, e.g. on the rows left
    # running, reuses the program shape rather than compiling one for fewer steps).
    most = max(budgets.values(), default=0)
    steps = min(bucket(most), bucket(self.chunk)) if self.rule.stop else bucket(most)
    # The fewest rows a pass's program may have: any on the first; on later passes (the
    # rows left after narrowing) no fewer than NARROW_MIN, nor than the last pass had.
    least = 2
    while True:
      rows = [b for b, n in remaining.items() if n > 0 and not out[b][2]]
      if not rows:
        return out
      # Few active rows decode alone (a gather and a write-back of their cache).
      width = max(bucket(len(rows), 2), least)
      subset = self._decode_subset and width < self.slots
      at = ({b: i for i, b in enumerate(rows)} if subset
            else {b: b for b in range(self.slots)})
      n_rows = width if subset else self.slots
      active = np.zeros(n_rows, bool)
      budget = np.zeros(n_rows, np.int32)
      for b in rows:
        active[at[b]] = True
        budget[at[b]] = min(remaining[b], steps)
        self._check_room(b, int(self.lengths[b]), int(budget[at[b]]))
      # Once the rows still running fit a narrower subset program, the loop leaves
      # and the next pass goes on with them alone.
      shrink = np.int32(_narrower(n_rows) if self._decode_subset else 0)
      if subset:
        self._log_program("decode", steps, width)
        index = np.asarray(rows + [self.slots] * (width - len(rows)), np.int32)
        self.state, toks, logps, eos, n = self._decode_rows(
            self.decode_params, self.state, index, active, budget, np.bool_(stop_on_finish),
            shrink, cfg=self.cfg, rule=self._device_rule, steps=steps,
            feature_major=self.feature_major)
      else:
        self._log_program("decode", steps)
        self.state, toks, logps, eos, n = self._decode(
            self.decode_params, self.state, active, budget, np.bool_(stop_on_finish),
            shrink, cfg=self.cfg, rule=self._device_rule, steps=steps,
            feature_major=self.feature_major)
      toks, logps, eos, n = jax.device_get((toks, logps, eos, n))
      least = min(NARROW_MIN, n_rows)
      toks, logps, eos = ({b: x[at[b]] for b in rows} for x in (toks, logps, eos))
      budget = {b: budget[at[b]] for b in rows}
      cut_drop = np.zeros(self.slots, np.int32)
      for b in rows:
        # Rows emit on consecutive steps from the first, until they stop.
        count = min(int(budget[b]), int(n))
        if eos[b]:
          count = int(np.argmax(np.isin(toks[b], self.rule.stop_ids))) + 1
        self.lengths[b] += count
        t, lp = toks[b][:count].tolist(), logps[b][:count].tolist()
        prev_t, prev_l, _ = out[b]
        hit = bool(eos[b])
        if self.rule.stop and not hit:
          keep = _stop_string_cut(prev_t, t, self.rule.stop, self.detokenize)
          if keep is not None:
            cut_drop[b] = count - keep
            self.lengths[b] -= count - keep
            t, lp, hit = t[:keep], lp[:keep], True
            self.fresh[b] = False  # logits follow a dropped token
        out[b] = (prev_t + t, prev_l + lp, hit)
        remaining[b] -= count
      if cut_drop.any():
        self._log_program("truncate")
        self.state = self._truncate(self.state, cut_drop)
      if stop_on_finish and any(out[b][2] or remaining[b] <= 0 for b in rows):
        return out

  def release(self, slots: Sequence[int]) -> None:
    """Frees rows: their history is dropped (a later extend starts them anew)."""
    if not len(slots):
      return
    mask = np.zeros(self.slots, bool)
    mask[list(slots)] = True
    self._log_program("release")
    self.state = self._release(self.state, mask)
    self.lengths[mask] = 0
    self.fresh[mask] = False


# Fewest rows a decode narrows to (`_narrower`). Below about 8 rows a step costs
# little more than reading the weights once, so a narrower program would save
# little and be one more program to compile, often in the middle of a run.
NARROW_MIN = 8


def _narrower(width: int) -> int:
  """Running rows at or below which a decode of `width` rows hands over to a narrower
  subset program: the largest power of two below `width`, or 0 (never) when that is
  fewer than `NARROW_MIN` rows."""
  half = 1 << (int(width) - 1).bit_length() - 1 if width > 1 else 0
  return half if half >= NARROW_MIN else 0


def _key_data(key) -> np.ndarray:
  """A typed PRNG key, or its key data, as key data."""
  return key if isinstance(key, np.ndarray) else np.asarray(jax.random.key_data(key))


def _stop_string_cut(prev: list[int], new: list[int], stops: tuple[str, ...],
                     detokenize) -> int | None:
  """Tokens of `new` to keep so the text ends just past the first stop string, or None."""
  text = detokenize(prev + new)
  if not any(s in text for s in stops):
    return None
  lo, hi = 1, len(new)  # smallest k with a stop string in prev + new[:k]
  while lo < hi:
    mid = (lo + hi) // 2
    if any(s in detokenize(prev + new[:mid]) for s in stops):
      hi = mid
    else:
      lo = mid + 1
  return lo


_PROGRAMS: set[tuple] = set()


def num_engine_programs() -> int:
  """Distinct engine programs compiled in this process (all engines)."""
  return len(_PROGRAMS)
