"""A scripted noisy solver: follows a program's solution(), with random slips.

Each turn it asks the live episode's ``solution()`` for the plan from the current state
(family programs replan from where the episode stands) and sends its first action, or,
with probability ``p``, the family's random plausible action instead. Its win rate falls
as a family's difficulty knobs rise: longer plans give more chances to slip and less
slack leaves less room to recover. Everything runs in the sandbox.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from spade_jax.envs import tools as tools_lib
from spade_jax.envs.families.base import Family
from spade_jax.sandbox import EnvPool

_SOLVED = 1.0 - 1e-6


def noisy_play(pool: EnvPool, family: Family, knobs: Mapping[str, int], seeds: Sequence[int],
               p: float, noise_seed: int = 0) -> list[bool]:
  """Plays one episode per seed, all concurrently; returns which were solved.

  Args:
    pool: the sandbox pool.
    family: the env family.
    knobs: its knob values (unset ones take their medium value).
    seeds: reset seeds, one episode each.
    p: probability that a turn's action is replaced by ``family.perturb``.
    noise_seed: seeds the slips; the slips of a seed do not depend on the knobs or
      on the other seeds, so levels are compared on common random numbers.

  Raises:
    RuntimeError: when an episode fails in the sandbox or runs past the family's turn
      budget.
  """
  values = family.resolve(**knobs)
  limit = family.max_turns(**values)
  source = family.program(**values)
  handles = tools_lib.start(pool, [source] * len(seeds), "games", limit)
  rngs = [random.Random(f"noisy:{family.name}:{noise_seed}:{s}") for s in seeds]
  solved = [False] * len(seeds)
  try:
    for h in handles:
      if not h.alive:
        raise RuntimeError(f"{family.name}: loading failed: {h.reason}: {h.detail}")
    for r in pool.reset_many(handles, seeds=list(seeds)):
      _ok(r, family, "reset")
    live = list(range(len(seeds)))
    for _ in range(limit):
      if not live:
        break
      plans = pool.call_many([handles[i] for i in live], "solution")
      actions = []
      for i, plan in zip(live, plans):
        actions.append(noisy_action(family, _ok(plan, family, "solution"), rngs[i], p, values))
      results = pool.step_many([handles[i] for i in live], actions)
      still = []
      for i, r in zip(live, results):
        _, reward, term, trunc, _ = _ok(r, family, "step")
        if term or trunc:
          solved[i] = bool(term and reward >= _SOLVED)
        else:
          still.append(i)
      live = still
    if live:
      raise RuntimeError(f"{family.name} {values}: {len(live)} episode(s) still running "
                         f"after its turn budget of {limit}")
  finally:
    pool.release(handles)
  return solved


def noisy_action(family: Family, plan, rng: random.Random, p: float,
                 knobs: Mapping[str, int], work: str | None = None) -> str:
  """The scripted player's turn: ``\\boxed{}`` of the plan's first action, or with
  probability ``p`` of ``family.perturb``'s random plausible action instead.

  ``work`` (the env's ``work()`` for this state) is written before the box when the turn
  follows the plan, so a worked step always leads to the right action; a slip is a bare
  guess.
  """
  if rng.random() < p:
    return "\\boxed{" + family.perturb(rng, str((plan or [""])[0]), knobs) + "}"
  return planned_action(plan, work)


def planned_action(plan, work: str | None = None) -> str:
  """The turn that follows ``plan``: ``work`` (if any) before ``\\boxed{}`` of its first
  action."""
  prefix = f"{work.strip()} " if work and work.strip() else ""
  return prefix + "\\boxed{" + str((plan or [""])[0]) + "}"


def noisy_win_rate(pool: EnvPool, family: Family, knobs: Mapping[str, int],
                   seeds: Sequence[int], p: float, noise_seed: int = 0) -> float:
  """The fraction of :func:`noisy_play`'s episodes that were solved."""
  won = noisy_play(pool, family, knobs, seeds, p, noise_seed)
  return sum(won) / max(1, len(won))


def _ok(res, family: Family, what: str):
  if not res.ok:
    raise RuntimeError(f"{family.name}: {what} failed: {res.reason}: {res.detail}")
  return res.value


__all__ = ["noisy_action", "noisy_play", "noisy_win_rate", "planned_action"]
