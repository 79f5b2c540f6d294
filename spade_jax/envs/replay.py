"""Replaying a program's own solution() in the sandbox, for inspection."""

import dataclasses
from collections.abc import Sequence
from typing import Any

from spade_jax.envs import tools as tools_lib
from spade_jax.envs.contract import SETTINGS
from spade_jax.sandbox import EnvPool


@dataclasses.dataclass(frozen=True)
class Episode:
  """One played episode.

  Attributes:
    seed: reset seed.
    steps: (action, observation, reward, terminated, truncated) per step; the
      first entry has action None and holds the reset observation.
    solved: the last step terminated with reward 1.0.
    reason: a sandbox failure reason, when the episode ended in one.
    detail: its explanation.
  """

  seed: int
  steps: tuple[tuple[Any, ...], ...]
  solved: bool
  reason: str | None = None
  detail: str = ""


def play_solutions(source: str, pool: EnvPool, seeds: Sequence[int],
                   max_turns: int = 25, setting: str = "games") -> list[Episode]:
  """Plays ``solution()`` from a fresh instance per seed, all concurrently."""
  handles = tools_lib.start(pool, [source] * len(seeds), setting, max_turns)
  harness = SETTINGS[setting].tool_harness
  try:
    steps: list[list[tuple[Any, ...]]] = [[] for _ in seeds]
    fail: list[tuple[str | None, str]] = [(None, "")] * len(seeds)
    live = [i for i, h in enumerate(handles) if h.alive]
    for i, h in enumerate(handles):
      if not h.alive:
        fail[i] = (h.reason, h.detail)
    resets = pool.reset_many([handles[i] for i in live], seeds=[seeds[i] for i in live])
    scripts: dict[int, list[str]] = {}
    for i, r in zip(live, resets):
      if r.ok:
        steps[i].append((None, r.value[0], 0.0, False, False))
      else:
        fail[i] = (r.reason, r.detail)
    live = [i for i in live if fail[i][0] is None]
    sols = pool.call_many([handles[i] for i in live], "solution")
    for i, r in zip(live, sols):
      if r.ok:
        raw = handles[i].action_mode == "raw" and not harness
        scripts[i] = [f"\\boxed{{{a}}}" if raw and "\\boxed" not in a else a for a in r.value]
      else:
        fail[i] = (r.reason, r.detail)
    for turn in range(max_turns):
      batch = [i for i in scripts if fail[i][0] is None and turn < len(scripts[i])
               and not (steps[i][-1][3] or steps[i][-1][4])]
      if not batch:
        break
      results = pool.step_many([handles[i] for i in batch], [scripts[i][turn] for i in batch])
      for i, r in zip(batch, results):
        if r.ok:
          obs, reward, term, trunc, _ = r.value
          steps[i].append((scripts[i][turn], obs, reward, term, trunc))
        else:
          fail[i] = (r.reason, r.detail)
    out = []
    for i, seed in enumerate(seeds):
      last = steps[i][-1] if steps[i] else None
      solved = bool(last and last[3] and last[2] >= 1.0 - 1e-6)
      out.append(Episode(seed, tuple(steps[i]), solved, fail[i][0], fail[i][1]))
    return out
  finally:
    pool.release(handles)
