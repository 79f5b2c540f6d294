"""Multi-turn agent episodes against sandboxed environments.

All episodes of an iteration advance in lock step: one batched sampler call
per turn for every running episode, then one concurrent `step_many` on the
sandbox pool. Transcripts are token lists with a loss mask that is True only
on tokens the policy generated.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

from spade_jax.models.chat import ChatTemplate
from spade_jax.sampling import Generation

Policy = Callable[[list[list[int]], int], Generation]


@dataclasses.dataclass
class EpisodeSpec:
  """One play: which env slot, which seed, and the hint (None = unhinted arm)."""

  env: int
  seed: int
  hinted: bool = False
  hint: str | None = None


@dataclasses.dataclass
class Episode:
  """A finished (or cut) play and its training transcript."""

  spec: EpisodeSpec
  tokens: list[int]
  loss_mask: list[bool]
  logps: list[float]
  reward: float = 0.0
  turns: int = 0
  outcome: str = "running"

  @property
  def solved(self) -> bool:
    return self.outcome == "solved"


def _extend(ep: Episode, ids: Sequence[int], mask: bool, logps=None) -> None:
  ep.tokens.extend(ids)
  ep.loss_mask.extend([mask] * len(ids))
  ep.logps.extend(logps if logps is not None else [0.0] * len(ids))


def run_episodes(pool, sources: Sequence[str], specs: Sequence[EpisodeSpec],
                 policy: Policy, chat: ChatTemplate, system_prompt: Callable[[str | None], str],
                 *, max_turns: int, max_turn_tokens: int, max_len: int,
                 hint_fn: Callable[[list], list[str | None]] | None = None
                 ) -> list[Episode]:
  """Plays every spec to the end and returns one `Episode` per spec.

  Args:
    pool: a `spade_jax.sandbox.EnvPool`.
    sources: env program source per env slot (index = `EpisodeSpec.env`).
    specs: the plays to run.
    policy: `(prompts, max_new_tokens) -> Generation`.
    chat: chat template of the policy's vocabulary.
    system_prompt: hint -> agent system prompt.
    max_turns: turns per episode (the env may end earlier).
    max_turn_tokens: new tokens per agent turn.
    max_len: transcript token budget; an episode that would exceed it ends
      with outcome "context".
    hint_fn: for hinted specs without a fixed `hint`: called once with their
      live handles after reset, returns one hint (or None) per handle, e.g.
      from the programs' own hint().

  Returns:
    Episodes in the order of `specs`. Sandbox failures end an episode with the
    failure reason as outcome; they never raise.
  """
  handles = pool.start([sources[s.env] for s in specs], max_turns=max_turns)
  try:
    resets = pool.reset_many(handles, seeds=[s.seed for s in specs])
    episodes = [Episode(spec, [], [], []) for spec in specs]
    hints = [s.hint if s.hinted else None for s in specs]
    ask = [i for i, (s, r) in enumerate(zip(specs, resets))
           if r.ok and s.hinted and s.hint is None]
    if ask and hint_fn is not None:
      for i, h in zip(ask, hint_fn([handles[i] for i in ask])):
        hints[i] = h
    running: list[int] = []
    for i, (ep, res) in enumerate(zip(episodes, resets)):
      if not res.ok:
        ep.outcome = res.reason or "crash"
        continue
      obs, _ = res.value
      _extend(ep, chat.prompt(system_prompt(hints[i]), obs), False)
      if len(ep.tokens) + max_turn_tokens > max_len:
        ep.outcome = "context"
        continue
      running.append(i)

    for _ in range(max_turns):
      if not running:
        break
      gen = policy([episodes[i].tokens for i in running], max_turn_tokens)
      actions = []
      for i, toks, lps in zip(running, gen.tokens, gen.logprobs):
        _extend(episodes[i], toks, True, lps)
        episodes[i].turns += 1
        actions.append(chat.vocab.decode(toks))
      results = pool.step_many([handles[i] for i in running], actions)
      still = []
      for i, res in zip(running, results):
        ep = episodes[i]
        if not res.ok:
          ep.outcome = res.reason or "crash"
          continue
        obs, reward, terminated, truncated, _ = res.value
        if not math.isfinite(reward):
          ep.outcome = "contract"
          continue
        ep.reward = max(-1.0, min(1.0, ep.reward + float(reward)))
        if terminated:
          ep.outcome = "solved" if reward >= 1.0 else "terminated"
          continue
        if truncated:
          ep.outcome = "truncated"
          continue
        nxt = chat.continuation(obs)
        if len(ep.tokens) + len(nxt) + max_turn_tokens > max_len:
          ep.outcome = "context"
          continue
        _extend(ep, nxt, False)
        still.append(i)
      running = still
    for i in running:
      episodes[i].outcome = "max_turns"
    return episodes
  finally:
    pool.release(handles)
