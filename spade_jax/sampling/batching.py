"""Continuous batching: a queue of requests on an engine's fixed slots.

When a row stops, the next waiting request takes its slot (its prompt is one
extend on that row; the other rows keep their caches), so uneven lengths keep
the batch full. Shapes never change, so refills compile nothing new. A
request's draws depend only on its own key, so its output is the same whether
it runs alone or shares the batch.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import jax

from spade_jax.sampling.engine import Engine


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


@dataclasses.dataclass
class Completion:
  """A finished request: its tokens, raw-model log-probs and whether it hit a stop."""

  tokens: list[int]
  logprobs: list[float]
  finished: bool
  slot: int


def serve(engine: Engine, requests: Sequence[Request],
          slots: Sequence[int] | None = None) -> list[Completion]:
  """Runs every request on `engine`, refilling slots as rows stop.

  Args:
    engine: the engine; its rows in `slots` are overwritten.
    requests: the requests, served first come first served.
    slots: rows to use (default: all of the engine's).

  Returns:
    One `Completion` per request, in request order.
  """
  free = collections.deque(range(engine.slots) if slots is None else slots)
  if not free:
    raise ValueError("serve() got no slots; pass at least one engine row.")
  waiting = collections.deque(range(len(requests)))
  running: dict[int, int] = {}  # slot -> request index
  out: dict[int, Completion] = {}
  left: dict[int, int] = {}
  while waiting or running:
    starts, chunks = {}, {}
    while waiting and free:
      r, b = waiting.popleft(), free.popleft()
      req = requests[r]
      if len(req.prompt) == 0:
        raise ValueError(f"Request {r} has an empty prompt; every prompt needs a token.")
      chunks[b], starts[b] = list(req.prompt), req.key
      running[b], left[b] = r, req.max_new_tokens
      out[r] = Completion([], [], False, b)
    engine.extend(chunks, starts)
    res = engine.decode({b: left[b] for b in running}, stop_on_finish=bool(waiting))
    freed = []
    for b, (toks, logps, hit) in res.items():
      c = out[running[b]]
      c.tokens += toks
      c.logprobs += logps
      left[b] -= len(toks)
      if hit or left[b] <= 0:
        c.finished = hit
        del running[b]
        freed.append(b)
    engine.release(freed)
    free.extend(freed)
  return [out[r] for r in range(len(requests))]
