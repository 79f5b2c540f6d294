"""Multi-turn agent episodes against sandboxed environments.

Episodes advance in rounds: one batched decode for every running episode,
then one concurrent `step_many` on the sandbox pool. With a `Sampler` policy
each episode owns one row of a KV-cache engine: the observation and the next
turn's prefix are appended to the row's cache and decoding continues, so the
history is never prefilled again; when an episode ends, a waiting one takes
its slot (`max_slots`; the scheduler is `spade_jax.sampling.schedule`). A
plain `(prompts, max_new) -> Generation` callable is also accepted and
re-reads the whole transcript each turn. `run_episodes_with_requests` decodes
one-shot requests (the next regeneration's designer programs) on the same
engine rows while the episodes play.

Transcripts are token lists with a loss mask that is True only on tokens the
policy generated; they are exactly the ids the sampler conditioned on, and
the log-probs are those it sampled with.

An episode's reward is the reference's: the (clipped) reward of its last step
if the env terminated it, else 0. Intermediate step rewards never count, so an
env cannot hand out partial credit that places its win rate at will. A hinted
play sees its hint appended to the first observation.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import jax

from spade_jax import envs
from spade_jax.designer import hinted_observation
from spade_jax.models.chat import ChatTemplate
from spade_jax.sampling import (Completion, Generation, Output, Request, Sampler, Turn,
                                bucket, check_requests, schedule)
from spade_jax.sandbox import FAILURES

Policy = Sampler | Callable[[list[list[int]], int], Generation]


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
  malformed: int = 0            # malformed tool calls (tool use)
  # The env's texts the agent was shown (reset, then each step's), hint left out.
  observations: list[str] = dataclasses.field(default_factory=list)

  @property
  def solved(self) -> bool:
    return self.outcome == "solved"

  @property
  def failed(self) -> bool:
    """Ended by a sandbox failure (the env's fault, not the agent's)."""
    return self.outcome in FAILURES


def _extend(ep: Episode, ids: Sequence[int], mask: bool, logps=None) -> None:
  ep.tokens.extend(ids)
  ep.loss_mask.extend([mask] * len(ids))
  ep.logps.extend(logps if logps is not None else [0.0] * len(ids))


def run_episodes(pool, sources: Sequence[str], specs: Sequence[EpisodeSpec],
                 policy: Policy, chat: ChatTemplate, system_prompt: str | None,
                 *, max_turns: int, max_turn_tokens: int, max_len: int,
                 max_slots: int | None = None, setting: str = "games",
                 overlap: bool | int = False) -> list[Episode]:
  """Plays every spec to the end and returns one `Episode` per spec.

  Args:
    pool: a `spade_jax.sandbox.EnvPool`.
    sources: env program source per env slot (index = `EpisodeSpec.env`).
    specs: the plays to run.
    policy: a `Sampler` (multi-turn continuation through its KV cache) or a
      `(prompts, max_new_tokens) -> Generation` callable (re-reads the whole
      transcript every turn).
    chat: chat template of the policy's vocabulary.
    system_prompt: the agent's system prompt (None: no system turn).
    max_turns: turns per episode (the env may end earlier).
    max_turn_tokens: new tokens per agent turn.
    max_len: transcript token budget; an episode that would exceed it ends
      with outcome "context".
    max_slots: with a `Sampler`, rows of the engine (default: one per
      episode); episodes beyond it wait for a slot to free up.
    setting: the programs' setting (`envs.SETTINGS`): how they start and how the agent's
      turns reach them. Tool use runs the Qwen3 tool conversation: the tools the env
      declares at reset go in the system turn, each turn's tool results come back as
      tool messages and a revealed request as a user message.
    overlap: with a `Sampler`, step an episode's env as soon as its turn ends, in a
      worker thread, while the engine keeps decoding the other episodes (same
      transcripts as the lock-step schedule). An int k >= 2: k out-of-phase lock-step
      cohorts of rows (`sampling.schedule`), so env steps hide behind other rows' turns.

  Returns:
    Episodes in the order of `specs`. Sandbox failures end an episode with the
    failure reason as outcome; they never raise.
  """
  episodes, _ = _run(pool, sources, specs, policy, chat, system_prompt, (),
                     max_turns=max_turns, max_turn_tokens=max_turn_tokens, max_len=max_len,
                     max_slots=max_slots, setting=setting, overlap=overlap)
  return episodes


def run_episodes_with_requests(
    pool, sources: Sequence[str], specs: Sequence[EpisodeSpec], sampler: Sampler,
    chat: ChatTemplate, system_prompt: str | None, requests: Sequence[Request], *,
    max_turns: int, max_turn_tokens: int, max_len: int, max_slots: int | None = None,
    setting: str = "games", overlap: bool | int = False
) -> tuple[list[Episode], list[Completion]]:
  """`run_episodes`, with one-shot generation requests decoded on the same engine rows.

  The requests (e.g. the designer's programs for the next regeneration) join the
  episodes' batch: they take rows first and decode in the same decode steps as the
  episodes' turns. In lock step a request decodes at most one turn's budget per round
  while episodes remain, so it never holds up a turn; with `overlap` it decodes on while
  the episodes' envs step. Episode transcripts are those of `run_episodes`, and a
  request's output depends only on its key and the parameters: it is the row `generate`
  draws with the same key (`sampling.row_keys`).

  Args:
    pool, sources, specs, chat, system_prompt, max_turns, max_turn_tokens, max_len,
    max_slots, setting, overlap: as `run_episodes` (``max_slots`` counts request rows
      too).
    sampler: the policy; its rule decodes the requests as well.
    requests: `sampling.Request`s (non-empty prompts).

  Returns:
    (episodes in the order of `specs`, one `Completion` per request in order).
  """
  check_requests(requests)
  if not isinstance(sampler, Sampler):
    raise TypeError(f"run_episodes_with_requests needs a Sampler policy (its engine decodes "
                    f"the requests); got {type(sampler).__name__}.")
  return _run(pool, sources, specs, sampler, chat, system_prompt, requests,
              max_turns=max_turns, max_turn_tokens=max_turn_tokens, max_len=max_len,
              max_slots=max_slots, setting=setting, overlap=overlap)


def _run(pool, sources, specs, policy, chat, system_prompt, requests, *, max_turns,
         max_turn_tokens, max_len, max_slots, setting, overlap):
  handles = envs.start(pool, [sources[s.env] for s in specs], setting, max_turns)
  try:
    resets = pool.reset_many(handles, seeds=[s.seed for s in specs])
    episodes = [Episode(spec, [], [], []) for spec in specs]
    running: list[int] = []
    for i, (ep, res) in enumerate(zip(episodes, resets)):
      if not res.ok:
        ep.outcome = res.reason or "crash"
        continue
      obs, info = res.value
      ep.observations.append(str(obs))
      hint = ep.spec.hint if ep.spec.hinted else None
      _extend(ep, chat.prompt(system_prompt, hinted_observation(obs, hint),
                              tools=info.get("tools")), False)
      if len(ep.tokens) + max_turn_tokens > max_len:
        ep.outcome = "context"
        continue
      running.append(i)

    completions = [Completion([], [], False, -1) for _ in requests]
    if isinstance(policy, Sampler):
      running = _play_cached(pool, handles, episodes, running, policy, chat,
                             max_turns=max_turns, max_turn_tokens=max_turn_tokens,
                             max_len=max_len, max_slots=max_slots, overlap=overlap,
                             requests=requests, completions=completions)
    else:
      running = _play_reread(pool, handles, episodes, running, policy, chat,
                             max_turns=max_turns, max_turn_tokens=max_turn_tokens,
                             max_len=max_len)
    for i in running:
      episodes[i].outcome = "max_turns"
    return episodes, completions
  finally:
    pool.release(handles)


def _step_results(episodes, chat, idx, results, max_turn_tokens, max_len):
  """Applies env step results; returns {episode: continuation ids} for those that go on."""
  cont = {}
  for i, res in zip(idx, results):
    ep = episodes[i]
    if not res.ok:
      ep.outcome = res.reason or "crash"
      continue
    obs, reward, terminated, truncated, info = res.value
    ep.malformed += int(info.get("malformed", 0) or 0)
    if not math.isfinite(reward):
      ep.outcome = "contract"
      continue
    if terminated:
      ep.reward = max(-1.0, min(1.0, float(reward)))
      ep.outcome = "solved" if reward >= 1.0 else "terminated"
      continue
    if truncated:
      ep.outcome = "truncated"
      continue
    if "tool_results" in info:
      msgs = [{"role": "tool", "content": r["content"]} for r in info["tool_results"]]
      msgs += [{"role": "user", "content": info["user"]}] if info.get("user") else []
      nxt = chat.continuation_messages(msgs or [{"role": "user", "content": obs}])
    else:
      nxt = chat.continuation(obs)
    if len(ep.tokens) + len(nxt) + max_turn_tokens > max_len:
      ep.outcome = "context"
      continue
    _extend(ep, nxt, False)
    if "tool_results" in info:  # tool use: each tool's answer, then the user's words
      ep.observations += [str(r["content"]) for r in info["tool_results"]]
      if info.get("user"):
        ep.observations.append(str(info["user"]))
    else:
      ep.observations.append(str(obs))
    cont[i] = nxt
  return cont


def _play_reread(pool, handles, episodes, running, policy, chat, *, max_turns,
                 max_turn_tokens, max_len) -> list[int]:
  """Lock-step turns; every turn hands the whole transcript to `policy`."""
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
    running = list(_step_results(episodes, chat, running, results, max_turn_tokens, max_len))
  return running


def _play_cached(pool, handles, episodes, running, sampler: Sampler, chat, *, max_turns,
                 max_turn_tokens, max_len, max_slots, overlap=False, requests=(),
                 completions=()) -> list[int]:
  """Turns through one engine row per episode (`sampling.schedule`); waiting
  episodes take freed rows. Requests (conversations 0..R-1) go first; each fills
  its `completions` entry.

  Returns the episodes still running after `max_turns` turns.
  """
  R = len(requests)
  if not running and not R:
    return []
  n = R + len(running)
  slots = min(n, max_slots or n)
  # A row holds one transcript: at most max_len tokens (the turn budget included), or
  # one request's prompt and new tokens. A one-turn transcript holds its prompt and
  # that turn only: the cache is cut to the power of two above the longest (so prompts
  # of other lengths reuse the same programs) rather than sized for max_len.
  longest = max_len
  if max_turns == 1 and running:
    longest = min(max_len, bucket(
        max(len(episodes[i].tokens) for i in running) + max_turn_tokens, 64))
  need = max([longest] + [len(q.prompt) + q.max_new_tokens for q in requests])
  engine = sampler.engine(slots, need)
  key = sampler.next_key() if running else None
  left_over: list[int] = []
  alive = [len(running)]  # episodes not ended (lock step reads it; one thread then)

  def budget(c: int) -> int:
    """A request's next decode budget: one turn's while episodes play in lock step."""
    left = requests[c].max_new_tokens - len(completions[c].tokens)
    return left if overlap or not alive[0] else min(left, max_turn_tokens)

  def respond(outputs: dict[int, Output]) -> dict[int, Turn | None]:
    nxt: dict[int, Turn | None] = {}
    going = []
    for c in [c for c in outputs if c < R]:
      toks, lps, hit = outputs.pop(c)
      completions[c].tokens += toks
      completions[c].logprobs += lps
      completions[c].finished = hit
      if hit or len(completions[c].tokens) >= requests[c].max_new_tokens:
        nxt[c] = None
      else:
        going.append(c)
    if outputs:
      nxt.update(_respond_episodes(outputs))
    for c in going:
      nxt[c] = Turn((), budget(c))
    return nxt

  def _respond_episodes(outputs: dict[int, Output]) -> dict[int, Turn | None]:
    nxt: dict[int, Turn | None] = {}
    idx = [running[c - R] for c in outputs]
    actions = []
    for i, (toks, lps, _) in zip(idx, outputs.values()):
      _extend(episodes[i], toks, True, lps)
      episodes[i].turns += 1
      actions.append(chat.vocab.decode(toks))
    results = pool.step_many([handles[i] for i in idx], actions)
    cont = _step_results(episodes, chat, idx, results, max_turn_tokens, max_len)
    for c, i in zip(outputs, idx):
      if i in cont and episodes[i].turns < max_turns:
        nxt[c] = Turn(cont[i], max_turn_tokens)
        continue
      if i in cont:
        left_over.append(i)
      nxt[c] = None
      if not overlap:
        alive[0] -= 1
    return nxt

  first = ([Turn(list(q.prompt), budget(c)) for c, q in enumerate(requests)]
           + [Turn(list(episodes[i].tokens), max_turn_tokens) for i in running])
  keys = [q.key for q in requests] + [jax.random.fold_in(key, i) for i in running]
  rows = schedule(engine, first, keys, respond, overlap=overlap)
  for c, row in zip(completions, rows):
    c.slot = row
  return left_over
