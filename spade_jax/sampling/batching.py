"""Continuous batching: conversations queued on an engine's fixed rows.

:func:`schedule` is the one slot-refill scheduler. Each conversation owns one
engine row while it runs; it alternates an extend (its prompt, later e.g. an
environment observation) and a decode, and after every decode round the
caller says, for each conversation that decoded, what it does next or that it
has ended. An ended conversation frees its row and the next waiting one takes
it (its prompt is one extend on that row; the other rows keep their caches),
so uneven lengths keep the batch full and shapes never change. A
conversation's draws depend only on its own key, so its output is the same
whichever row it runs on and whoever shares the batch.

:func:`serve` (one-shot requests) and ``spade_jax.selfplay.episodes`` (multi-turn
plays against environments) both run on it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
from typing import Callable, Sequence

import jax

from spade_jax.sampling.engine import Engine

# A decode round's result for one conversation: (token ids, log-probs, stopped on
# a stop id or stop string).
Output = tuple[list[int], list[float], bool]


@dataclasses.dataclass
class Turn:
  """A conversation's next step: append ``ids`` (may be empty: keep decoding), then
  decode up to ``max_new_tokens``."""

  ids: Sequence[int]
  max_new_tokens: int


def schedule(engine: Engine, first: Sequence[Turn], keys: Sequence[jax.Array],
             respond: Callable[[dict[int, Output]], dict[int, Turn | None]], *,
             slots: Sequence[int] | None = None, refill_early: bool = False,
             overlap: bool | int = False, workers: int | None = None) -> list[int]:
  """Runs conversations on ``engine``'s rows until every one has ended.

  Args:
    engine: the engine; its rows in ``slots`` are overwritten.
    first: each conversation's first turn (its prompt, non-empty); conversations
      start in this order as rows free up.
    keys: each conversation's PRNG key.
    respond: called after every decode round with conversation -> output for the
      conversations that decoded in it (in the order they took their rows);
      returns conversation -> its next :class:`Turn`, or None when it has ended.
    slots: rows to use (default: all of the engine's).
    refill_early: while conversations wait, end a decode round as soon as one row
      stops, so a waiting conversation takes its row at once (the others' partial
      output comes back; continue them with an empty :class:`Turn`). Otherwise a
      round decodes every running conversation to its stop or budget.
    overlap: ``respond`` runs in worker threads for the conversations whose turn has
      ended (stop or budget), while the engine keeps decoding the others; a
      conversation rejoins the decoding as soon as its next turn is known. ``respond``
      then sees only whole turns and must be thread-safe for disjoint conversations (an
      environment step per conversation is). Outputs are the same as without overlap,
      since a row's draws depend only on its own key and positions. It removes
      stragglers (fewer decode steps); rejoining conversations are extended together
      once a quarter of the rows are ready (see experiments/benchmarks/rollout.py).
      An int k >= 2 instead splits the rows into k cohorts that run in lock step each,
      out of phase: one cohort extends and decodes its turns while the others'
      ``respond`` (env steps) run, so env time hides behind the other cohorts' decoding
      rather than only behind stragglers (same outputs again).
    workers: threads that run ``respond`` with ``overlap`` (default: one per row, at
      most 64, so that no ended turn waits for a thread while others' env steps run:
      an env step mostly waits on its sandbox worker).

  Returns:
    The row each conversation ran on.
  """
  if len(keys) != len(first):
    raise ValueError(f"schedule() got {len(first)} conversations and {len(keys)} keys; "
                     "expected one key per conversation.")
  free = collections.deque(range(engine.slots) if slots is None else slots)
  if not free:
    raise ValueError("schedule() got no slots; pass at least one engine row.")
  if overlap:
    if workers is None:
      workers = min(len(free), 64)
    if overlap is not True:
      if overlap < 2:
        raise ValueError(f"schedule(overlap={overlap!r}): pass True (rows rejoin on their "
                         "own) or an int k >= 2 (k out-of-phase cohorts).")
      return _schedule_cohorts(engine, first, keys, respond, free, int(overlap), workers)
    return _schedule_overlapped(engine, first, keys, respond, free, workers)
  waiting = collections.deque(range(len(first)))
  running: dict[int, int] = {}  # conversation -> row, in the order rows were taken
  turn: dict[int, Turn] = {}
  row_of = [-1] * len(first)
  while waiting or running:
    starts = {}
    while waiting and free:
      c = waiting.popleft()
      running[c] = row_of[c] = free.popleft()
      turn[c], starts[running[c]] = first[c], keys[c]
    engine.extend({running[c]: list(t.ids) for c, t in turn.items() if len(t.ids)}, starts)
    res = engine.decode({running[c]: turn[c].max_new_tokens for c in running},
                        stop_on_finish=refill_early and bool(waiting))
    nxt = respond({c: res[running[c]] for c in running})
    ended = [c for c in running if nxt.get(c) is None]
    turn = {c: nxt[c] for c in running if nxt.get(c) is not None}
    rows = [running.pop(c) for c in ended]
    engine.release(rows)
    free.extend(rows)
  return row_of


def _schedule_overlapped(engine: Engine, first: Sequence[Turn], keys: Sequence[jax.Array],
                         respond, free: collections.deque, workers: int) -> list[int]:
  """`schedule` with `respond` in worker threads, off the decoding path.

  Conversations whose next turn is known wait to rejoin until enough of them
  are ready (a quarter of the rows), or until no more conversations are
  decoding than waiting: one extend then takes them all, since a lone row's
  extend costs nearly what several rows' does, while a decode step costs the
  same however many rows are active.
  """
  waiting = collections.deque(range(len(first)))
  running: dict[int, int] = {}  # conversation -> row
  turn: dict[int, Turn] = {}  # next turns to extend before decoding
  left: dict[int, int] = {}  # tokens left in each decoding conversation's turn
  partial: dict[int, tuple[list[int], list[float]]] = {}
  inflight: dict[concurrent.futures.Future, list[int]] = {}
  row_of = [-1] * len(first)
  starts: dict[int, jax.Array] = {}  # rows whose new conversation is not extended yet
  batch = max(1, len(free) // 4)
  with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
    while waiting or running:
      while waiting and free:
        c = waiting.popleft()
        running[c] = row_of[c] = free.popleft()
        turn[c], starts[running[c]] = first[c], keys[c]
      done = [f for f in inflight if f.done()]
      awaiting = {c for cs in inflight.values() for c in cs}
      decoding = [c for c in running if c not in awaiting and c not in turn]
      if not done and not decoding and not turn and inflight:
        done = list(concurrent.futures.wait(
            inflight, return_when=concurrent.futures.FIRST_COMPLETED).done)
      ended = []
      for f in done:
        nxt = f.result()  # re-raises an exception of `respond`
        for c in inflight.pop(f):
          if nxt.get(c) is None:
            ended.append(c)
          else:
            turn[c] = nxt[c]
      if ended:
        rows = [running.pop(c) for c in ended]
        engine.release(rows)
        free.extend(rows)
        if waiting:
          continue  # admit into the freed rows first (one extend for all)
      if turn and (len(turn) >= batch or len(decoding) <= len(turn)):
        engine.extend({running[c]: list(t.ids) for c, t in turn.items() if len(t.ids)},
                      starts)
        for c, t in turn.items():
          left[c], partial[c] = t.max_new_tokens, ([], [])
        turn, starts = {}, {}
      awaiting = {c for cs in inflight.values() for c in cs}
      active = [c for c in running if c not in awaiting and c not in turn]
      if not active:  # every running conversation waits on its env step
        if inflight:
          concurrent.futures.wait(inflight, return_when=concurrent.futures.FIRST_COMPLETED)
        continue
      res = engine.decode({running[c]: left[c] for c in active}, stop_on_finish=True)
      finished: dict[int, Output] = {}
      for c in active:
        toks, logps, hit = res[running[c]]
        partial[c][0].extend(toks)
        partial[c][1].extend(logps)
        left[c] -= len(toks)
        if hit or left[c] <= 0:
          finished[c] = (*partial.pop(c), hit)
      if finished:
        inflight[pool.submit(respond, finished)] = list(finished)
  return row_of


def _schedule_cohorts(engine: Engine, first: Sequence[Turn], keys: Sequence[jax.Array],
                      respond, free: collections.deque, k: int, workers: int) -> list[int]:
  """`schedule` as ``k`` lock-step cohorts on disjoint rows, run out of phase.

  A cohort that is ready (its last `respond` returned) takes waiting conversations into
  its free rows, extends its conversations' next turns and decodes them to their ends,
  then hands the outputs to `respond` in a worker thread and the next ready cohort goes.
  """
  rows = list(free)
  k = min(k, len(rows))
  own = [collections.deque(rows[g::k]) for g in range(k)]  # each cohort's free rows
  waiting = collections.deque(range(len(first)))
  running: list[dict[int, int]] = [{} for _ in range(k)]  # cohort -> {conversation: row}
  turn: dict[int, Turn] = {}
  pending: dict[concurrent.futures.Future, int] = {}  # respond call -> its cohort
  row_of = [-1] * len(first)
  nxt = 0
  with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
    while waiting or any(running):
      for f in [f for f in pending if f.done()]:
        g, out = pending.pop(f), f.result()  # re-raises an exception of `respond`
        ended = [c for c in running[g] if out.get(c) is None]
        turn.update((c, out[c]) for c in running[g] if out.get(c) is not None)
        if ended:
          done_rows = [running[g].pop(c) for c in ended]
          engine.release(done_rows)
          own[g].extend(done_rows)
      busy = set(pending.values())
      ready = [g for g in (*range(nxt, k), *range(nxt)) if g not in busy
               and (running[g] or (waiting and own[g]))]
      if not ready:
        concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
        continue
      g = ready[0]
      nxt = (g + 1) % k
      starts = {}  # rows that begin a conversation now
      while waiting and own[g]:
        c = waiting.popleft()
        running[g][c] = row_of[c] = own[g].popleft()
        turn[c], starts[running[g][c]] = first[c], keys[c]
      mine = {c: turn.pop(c) for c in running[g]}
      engine.extend({running[g][c]: list(t.ids) for c, t in mine.items() if len(t.ids)},
                    starts)
      res = engine.decode({running[g][c]: t.max_new_tokens for c, t in mine.items()})
      pending[pool.submit(respond, {c: res[running[g][c]] for c in mine})] = g
  return row_of


@dataclasses.dataclass
class Request:
  """One generation request.

  Attributes:
    prompt: token ids (non-empty).
    max_new_tokens: tokens to generate at most.
    key: PRNG key of this request.
  """

  prompt: Sequence[int]
  max_new_tokens: int
  key: jax.Array


def check_requests(requests: Sequence[Request]) -> None:
  """Raises naming the first request with an empty prompt."""
  for r, req in enumerate(requests):
    if len(req.prompt) == 0:
      raise ValueError(f"Request {r} has an empty prompt; every prompt needs a token.")


@dataclasses.dataclass
class Completion:
  """A finished request: its tokens, raw-model log-probs and whether it hit a stop."""

  tokens: list[int]
  logprobs: list[float]
  finished: bool
  slot: int


def serve(engine: Engine, requests: Sequence[Request],
          slots: Sequence[int] | None = None) -> list[Completion]:
  """Runs every request on ``engine``, refilling rows as requests finish.

  Args:
    engine: the engine; its rows in ``slots`` are overwritten.
    requests: the requests, served first come first served.
    slots: rows to use (default: all of the engine's).

  Returns:
    One :class:`Completion` per request, in request order.
  """
  check_requests(requests)
  out = [Completion([], [], False, -1) for _ in requests]
  left = [req.max_new_tokens for req in requests]

  def respond(outputs: dict[int, Output]) -> dict[int, Turn | None]:
    nxt: dict[int, Turn | None] = {}
    for r, (toks, logps, hit) in outputs.items():
      out[r].tokens += toks
      out[r].logprobs += logps
      left[r] -= len(toks)
      out[r].finished = hit
      nxt[r] = None if hit or left[r] <= 0 else Turn((), left[r])
    return nxt

  rows = schedule(engine, [Turn(req.prompt, req.max_new_tokens) for req in requests],
                  [req.key for req in requests], respond, slots=slots, refill_early=True)
  for c, row in zip(out, rows):
    c.slot = row
  return out
