"""The play stage: the agent's episodes in every slot, recorded in the regret buffer.

Every slot with a program gets `plays` unhinted episodes on seeds of (iteration, slot,
play); a fresh slot (a new program since the last play) also gets `hinted_plays` hinted
ones, on the unhinted seeds (`matched_hint_seeds`) or seeds of their own. The outcomes
go to the regret buffer (`RegretBuffer.record`) and, with a baseline, to its env source.
When the next iteration regenerates and `design_ahead` is on, the next regeneration's
first designs are decoded on the agent's engine rows beside the plays
(`episodes.run_episodes_with_requests`).

The run's contamination `Auditor` checks each hinted play's hint (`hints.episode_hints`)
and what each unhinted play was shown; under `audit.mode="drop"` a flagged play is left
out of the gradient (not among the unhinted episodes the credit trains on; its outcome
still counts in the buffer). A slot's notes go on the designer sample it is playing
(`DesignSample.audit`), and into the metrics with those of documents drawn ahead.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Callable

import numpy as np

from spade_jax import designer as dz
from spade_jax.metrics import compile_seconds
from spade_jax.sampling import Generation, Request, Sampler, row_keys
from spade_jax.sandbox import FAILURES
from spade_jax.selfplay.audit import Auditor, Note
from spade_jax.selfplay.buffer import RegretBuffer
from spade_jax.selfplay.config import SelfPlayConfig, overlap
from spade_jax.selfplay.episodes import EpisodeSpec, run_episodes, run_episodes_with_requests
from spade_jax.selfplay.roles import Roles
from spade_jax.selfplay.state import Ahead, HostState
from spade_jax.selfplay.stages.design import Design
from spade_jax.selfplay.stages.hints import episode_hints

Policy = Callable[[int, str], Any]  # (iteration, role) -> a sampler
Unhinted = dict[tuple[int, int], Any]  # (slot, play) -> its unhinted Episode


class Play:
  """The agent's stage (see the module docstring)."""

  def __init__(self, cfg: SelfPlayConfig, roles: Roles, *, pool, design: Design | None,
               auditor: Auditor, env_source=None):
    self.cfg, self.roles, self.pool = cfg, roles, pool
    self.design, self.env_source = design, env_source
    self.auditor = auditor

  def specs(self, host: HostState, it: int) -> tuple[list[EpisodeSpec], list[tuple[int, int]]]:
    """The unhinted plays' specs and the hinted plays' (slot, seed) pairs."""
    cfg, seed, N, M = self.cfg, self.roles.play_seed, self.cfg.plays, self.cfg.hinted_plays
    specs, hinted = [], []
    for e, slot in enumerate(host.slots):
      if not slot.source:
        continue
      seeds = [seed(it, e, j) for j in range(N)]
      specs += [EpisodeSpec(e, s) for s in seeds]
      if host.fresh[e]:
        hinted += [(e, seeds[j % N] if cfg.matched_hint_seeds else seed(it, e, N + j))
                   for j in range(M)]
    return specs, hinted

  def __call__(self, host: HostState, buffer: RegretBuffer, it: int, *, policy: Policy,
               version: int, memory: dz.EnvMemory, max_len: int, ema: tuple[float, float]
               ) -> tuple[HostState, RegretBuffer, Unhinted, dict[str, float]]:
    """Plays iteration `it`.

    Args:
      host: the iteration state (slots and which are fresh).
      buffer: the regret buffer.
      it: the iteration.
      policy: (iteration, role) -> sampler.
      version: the policy version (train step) sampling now.
      memory: the environment memory (the prompts of designs drawn ahead read it).
      max_len: an episode's token budget (the train sequence length).
      ema: the buffer's (fast, slow) EMA rates.

    Returns:
      (the host state, no slot fresh any more and any designs drawn ahead; the buffer
      with this iteration's outcomes; each (slot, play)'s unhinted episode; metrics).
    """
    cfg, E, N = self.cfg, self.cfg.num_envs, self.cfg.plays
    MB = buffer.num_hinted  # >= hinted_plays: the buffer's hinted columns
    metrics: dict[str, float] = {}
    auditor, audit_t0 = self.auditor, self.auditor.seconds
    t0, c0 = time.perf_counter(), compile_seconds()
    specs, hinted = self.specs(host, it)
    hints, hint_notes = episode_hints(cfg, self.pool, host, sorted(set(hinted)), auditor)
    notes: list[Note] = list(hint_notes.values())  # this iteration's checks
    specs += [EpisodeSpec(e, s, True, hints[(e, s)]) for e, s in hinted]
    args = (self.pool, [s.source or "" for s in host.slots], specs, policy(it, "agent"),
            self.roles.agent_chat, self.roles.agent_system())
    kw = dict(max_turns=cfg.max_turns, max_turn_tokens=cfg.agent_turn_tokens,
              max_len=max_len, setting=cfg.setting)
    ahead = host.ahead
    if self.design is not None and self.design.ahead_due(it):
      episodes, ahead, ahead_metrics, doc_notes = self._play_and_design_ahead(
          it, args, kw, policy, version, memory)
      metrics.update(ahead_metrics)
      notes += doc_notes
    else:
      episodes = run_episodes(*args, **kw, overlap=overlap(cfg))
    metrics["time/play"] = time.perf_counter() - t0 - (auditor.seconds - audit_t0)
    metrics["time/play_compile"] = compile_seconds() - c0

    r_n, m_n = np.zeros((E, N), np.float32), np.zeros((E, N), bool)
    r_h, m_h = np.zeros((E, MB), np.float32), np.zeros((E, MB), bool)
    failed, timed_out = np.zeros(E, bool), np.zeros(E, bool)
    outcomes = collections.Counter(), collections.Counter()
    index: collections.Counter = collections.Counter()
    nohint: Unhinted = {}
    by_slot: dict[int, list[Note]] = collections.defaultdict(list)
    for (e, _), note in sorted(hint_notes.items()):
      by_slot[e].append(note)
    for ep in episodes:
      e, arm = ep.spec.env, int(ep.spec.hinted)
      outcomes[arm][ep.outcome] += 1
      j = index[e, arm]
      index[e, arm] += 1
      failed[e] |= ep.failed
      timed_out[e] |= ep.outcome == "timeout"
      if arm:
        r_h[e, j], m_h[e, j] = ep.reward, not ep.failed
      else:
        r_n[e, j], m_n[e, j] = ep.reward, not ep.failed
        note = auditor.observations(ep.observations) if auditor.on else None
        if note is not None:
          notes.append(note)
          by_slot[e].append(note)
        if note is None or not note.drop:  # a dropped play is left out of the gradient
          nohint[e, j] = ep
    valid = np.array([s.source is not None for s in host.slots])
    skill = np.array([s.skill for s in host.slots], np.int32)
    buffer = buffer.record(r_n, m_n, r_h, m_h, skill, valid, np.asarray(host.fresh, bool),
                           failed, timed_out, ema_fast=ema[0], ema_slow=ema[1])
    if self.env_source is not None:
      metrics.update(self.env_source.observe(it, r_n, m_n))
    for arm, name in ((0, "nohint"), (1, "hint")):
      n = max(1, sum(outcomes[arm].values()))
      for outcome in ("solved", "context", "max_turns") + FAILURES:
        metrics[f"agent/{name}/{outcome}"] = outcomes[arm].get(outcome, 0) / n
    metrics["agent/reward_nohint"] = float(r_n[m_n].mean()) if m_n.any() else 0.0
    metrics["agent/reward_hint"] = float(r_h[m_h].mean()) if m_h.any() else 0.0
    metrics["agent/episodes"] = len(episodes)
    metrics["agent/mean_turns"] = float(np.mean([ep.turns for ep in episodes])) if episodes else 0.0
    metrics["agent/hints"] = sum(1 for s in specs if s.hinted and s.hint)
    metrics["agent/malformed_calls"] = sum(ep.malformed for ep in episodes)
    metrics["sampling/agent/tokens"] = sum(sum(ep.loss_mask) for ep in episodes)
    metrics["env/failed_slots"] = int(failed.sum())
    if auditor.on:
      metrics.update(auditor.metrics(notes))
      metrics["time/audit"] = auditor.seconds - audit_t0
      host = host.replace(pending=[_annotated(p, host, by_slot) for p in host.pending])
    host = host.replace(fresh=[False] * E, ahead=ahead)
    return host, buffer, nohint, metrics

  def _play_and_design_ahead(self, it: int, args: tuple, kw: dict, policy: Policy,
                             version: int, memory: dz.EnvMemory
                             ) -> tuple[list, Ahead, dict[str, float], list[Note]]:
    """The plays of `it`, with the first designer sample of each slot for the
    regeneration at `it + 1` decoded on the same engine rows (`design_ahead`); the last
    part is the audit notes of the documents drawn for them."""
    cfg = self.cfg
    _, docs, prompts, doc_notes = self.design.prompts(it + 1, memory)
    designer, agent = policy(it + 1, "designer"), args[3]
    if isinstance(designer, Sampler) and isinstance(agent, Sampler):
      key = designer.next_key()  # call 0 of (it + 1, designer), as `Design` would draw
      requests = [Request(p, cfg.designer_new_tokens, k)
                  for p, k in zip(prompts, row_keys(key, len(prompts)))]
      episodes, done = run_episodes_with_requests(*args, requests, **kw, overlap=overlap(cfg))
      gen = Generation([c.tokens for c in done], [c.logprobs for c in done],
                       [c.finished for c in done])
    else:  # a plain callable policy: the same samples, one after the other
      episodes = run_episodes(*args, **kw, overlap=overlap(cfg))
      gen = designer(prompts, cfg.designer_new_tokens)
    metrics = {"designer/ahead_samples": len(prompts),
               "sampling/designer/ahead_tokens": sum(len(t) for t in gen.tokens)}
    return (episodes, Ahead.of(it + 1, version, prompts, docs, gen), metrics,
            [n for ns in doc_notes for n in ns])


def _annotated(p, host: HostState, by_slot: dict[int, list[Note]]):
  """Pending sample `p` with the notes of its slot's plays, if the slot plays its program
  (a valid designer sample installed when it was written)."""
  slot = host.slots[p.slot]
  if (p.slot not in by_slot or p.reason is not None or slot.origin != "designer"
      or slot.written != p.iteration or p.failed):
    return p
  return Auditor.annotate(p, by_slot[p.slot])
