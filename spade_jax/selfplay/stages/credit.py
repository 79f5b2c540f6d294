"""The credit stage: rewards from the regret buffer, and the training rows they give.

`rewards.compute_rewards` turns the buffer into per-slot statistics, designer values and
the agent's advantages. A designer program whose env failed in the sandbox is marked on
its pending sample (its failure kind and this iteration's raw score) and blacklisted
(docs/METHOD.md §2: its slot plays a built-in program, or nothing, from the next iteration).
The cohort of designer samples whose credit window ends now is credited together
(`rewards.credit`): each leaves a sample record, a played one a record in the environment
memory, and those credited go to the batch as designer rows. Each slot's counted
unhinted plays go to the batch as agent rows (less the uniform groups under
`dynamic_sampling`). With the contamination audit on, each sample record carries the
sample's `audit` field (`DesignSample.audit`, in `selfplay.audit`'s record format).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import numpy as np

from spade_jax import designer as dz
from spade_jax.selfplay import rewards as rw
from spade_jax.selfplay.audit import Auditor
from spade_jax.selfplay.batch import Row
from spade_jax.selfplay.buffer import RegretBuffer
from spade_jax.selfplay.config import SelfPlayConfig
from spade_jax.selfplay.roles import RoleSampling
from spade_jax.selfplay.state import DesignSample, HostState, Slot, skill_name


@dataclasses.dataclass(frozen=True)
class Credited:
  """What the credit stage gives the iteration.

  Attributes:
    rows: the batch rows (credited designer samples, then agent plays).
    records: one record per designer sample credited now.
  """

  rows: list[Row]
  records: list[dict[str, Any]]


def uniform_groups(nohint: dict[tuple[int, int], Any]) -> set[int]:
  """Env slots whose counted unhinted plays all ended with the same terminal reward
  (DAPO's dynamic sampling, on the raw outcome): their advantages are all zero."""
  rewards: dict[int, set[float]] = collections.defaultdict(set)
  for (e, _), ep in nohint.items():
    if not ep.failed:
      rewards[e].add(ep.reward)
  return {e for e, r in rewards.items() if len(r) == 1}


def agent_rows(nohint: dict[tuple[int, int], Any], adv: np.ndarray, uniform: set[int],
               temperature: float, *, shuffle: tuple[int, int] | None = None) -> list[Row]:
  """The agent's rows: each (slot, play)'s unhinted episode that did not fail, has tokens
  and is not in a uniform group, with its advantage ``adv[slot, play]``.

  ``shuffle=(seed, iteration)`` is the control `SelfPlayConfig.shuffle_agent_advantages`:
  the same advantages, permuted among the rows by ``numpy.random.default_rng([seed,
  iteration])``.
  """
  kept = [(ep, float(adv[e, j])) for (e, j), ep in sorted(nohint.items())
          if not ep.failed and ep.tokens and e not in uniform]
  values = [a for _, a in kept]
  if shuffle is not None:
    values = [values[i] for i in np.random.default_rng(list(shuffle)).permutation(len(kept))]
  return [Row(ep.tokens, ep.loss_mask, ep.logps, a, "agent", temperature)
          for (ep, _), a in zip(kept, values)]


class Credit:
  """The credit stage (see the module docstring)."""

  def __init__(self, cfg: SelfPlayConfig, reward_cfg: rw.RewardConfig,
               sampling: RoleSampling, pool_programs: list[str], auditor: Auditor,
               seed: int):
    self.cfg, self.reward_cfg, self.sampling = cfg, reward_cfg, sampling
    self.seed = seed
    self.pool_programs = pool_programs
    self.auditor = auditor

  def __call__(self, host: HostState, buffer: RegretBuffer, nohint: dict[tuple[int, int], Any],
               it: int, *, memory: dz.EnvMemory
               ) -> tuple[HostState, Credited, dict[str, float]]:
    """Credits iteration `it`.

    Args:
      host: the iteration state after the plays.
      buffer: the regret buffer with this iteration's outcomes.
      nohint: each (slot, play)'s unhinted episode.
      it: the iteration.
      memory: the environment memory (each played program credited now joins it).

    Returns:
      (the host state without the credited samples and with failed programs replaced,
      the rows and sample records, metrics).
    """
    out = rw.compute_rewards(buffer, self.reward_cfg)
    metrics = {f"rewards/{k}": float(v) for k, v in out.metrics.items()}
    host, failed = self._failed_designer_slots(host, buffer, out)
    host, rows, records, credit_metrics = self._credit(host, buffer, out, it, memory)
    metrics.update(credit_metrics)
    host = self._blacklist(host, failed, it)
    metrics["env/blacklisted"] = len(failed)

    adv = np.asarray(out.agent_advantages)
    uniform = uniform_groups(nohint) if self.cfg.dynamic_sampling else set()
    metrics["agent/uniform_groups_dropped"] = len(uniform)
    rows += agent_rows(nohint, adv, uniform, self.sampling.agent.logprob_temperature,
                       shuffle=(self.seed, it) if self.cfg.shuffle_agent_advantages else None)
    return host, Credited(rows, records), metrics

  def _failed_designer_slots(self, host: HostState, buffer: RegretBuffer,
                             out: rw.RewardOutput) -> tuple[HostState, list[int]]:
    """Slots whose designer program hit a sandbox failure; marks their pending sample.

    The sample keeps its failure kind and its env's raw score of this iteration (a
    timeout scores itself under `regret_based`): the slot is refilled before the credit.
    """
    failed = np.asarray(buffer.failed)
    timed_out = np.asarray(buffer.timed_out)
    raw = np.asarray(out.raw)
    slots = [e for e, s in enumerate(host.slots) if s.origin == "designer" and failed[e]]
    pending = []
    for p in host.pending:
      slot = host.slots[p.slot]
      if (p.slot in slots and p.reason is None and p.iteration == slot.written
          and not p.failed):
        p = dataclasses.replace(p, failure="timeout" if timed_out[p.slot] else "crash",
                                failure_raw=float(raw[p.slot]))
      pending.append(p)
    return host.replace(pending=pending), slots

  def _blacklist(self, host: HostState, slots: list[int], it: int) -> HostState:
    """Failed designer programs are not played again (docs/METHOD.md §2: blacklisted)."""
    fill = self.cfg.fill_from_pool
    return host.with_slots({e: Slot.from_pool(self.pool_programs, e, it + 1) if fill
                            else Slot() for e in slots})

  def _credit(self, host: HostState, buffer: RegretBuffer, out: rw.RewardOutput, it: int,
              memory: dz.EnvMemory
              ) -> tuple[HostState, list[Row], list[dict[str, Any]], dict[str, float]]:
    """Credits the cohort of designer samples whose window ends now."""
    cfg, rc = self.cfg, self.reward_cfg
    due: list[DesignSample] = [p for p in host.pending
                               if p.iteration + rc.credit_window <= it + 1]
    if not due:
      return host, [], [], {}
    host = host.replace(pending=[p for p in host.pending if p not in due])
    E = cfg.num_envs
    A = max(p.attempt for p in due) + 1
    kinds = np.zeros((E, A), np.int32)
    skill = np.zeros(E, np.int32)
    # Per sample: a played one is scored by its slot's window now; a failed one by what it
    # failed with (its slot plays a replacement since).
    raw, timed_out = np.zeros((E, A), np.float32), np.zeros((E, A), bool)
    slot_raw = np.asarray(out.raw)
    has_data = np.asarray(out.stats.has_data)
    for p in due:
      slot, ea = host.slots[p.slot], (p.slot, p.attempt)
      skill[p.slot] = p.skill
      if p.reason is not None:
        kinds[ea] = rw.INVALID
      elif p.failed:
        kinds[ea] = rw.FAILED
        raw[ea], timed_out[ea] = p.failure_raw, p.failure == "timeout"
      elif slot.origin == "designer" and slot.written == p.iteration and has_data[p.slot]:
        kinds[ea] = rw.PLAYED
        raw[ea] = slot_raw[p.slot]
      else:
        kinds[ea] = rw.NO_DATA
    values, use = rw.credit(raw, kinds, skill, timed_out, rc)
    values, use = np.asarray(values), np.asarray(use)
    stats = jax.device_get(out.stats)
    scores_timeouts = rc.variant in rw.SCORES_TIMEOUTS
    rows, records = [], []
    for p in due:
      e, a, kind = p.slot, p.attempt, kinds[p.slot, p.attempt]
      played = kind == rw.PLAYED
      own = played or (kind == rw.FAILED and timed_out[e, a] and scores_timeouts)
      if use[e, a]:
        mask = [False] * p.prompt_len + [True] * (len(p.tokens) - p.prompt_len)
        rows.append(Row(p.tokens, mask, p.logps, float(values[e, a]), "designer",
                        self.sampling.designer.logprob_temperature))
      if played:
        memory.add(dz.MemoryRecord(
            program=p.program or "", doc_id=p.doc_id, skill=skill_name(cfg.setting, p.skill),
            win_rate_nohint=float(stats.win_rate[e]),
            win_rate_hint=float(np.asarray(buffer.hint_win_rate)[e]),
            regret=float(stats.rh[e] - stats.rn0[e]), designer_reward=float(values[e, a]),
            iteration=it, setting=cfg.setting))
      records.append({
          "iteration_written": p.iteration, "iteration_credited": it, "slot": e,
          "attempt": a, "skill": skill_name(cfg.setting, p.skill), "doc_id": p.doc_id,
          "verdict": p.reason or ("valid" if played else rw.KIND_NAMES[kind]),
          "Rh": float(stats.rh[e]) if played else None,
          "Rn0": float(stats.rn0[e]) if played else None,
          "w": float(stats.w[e]) if played else None,
          "raw": float(raw[e, a]) if own else None,
          "failure": p.failure,
          "reward": float(values[e, a]) if use[e, a] else None,
          "trained": bool(use[e, a]) and cfg.train_designer,
          "policy_version": p.policy_version})
      if self.auditor.on:
        records[-1]["audit"] = p.audit or Auditor.record([])
    trained = [r.advantage for r in rows]
    metrics = {"designer/credited": len(due), "designer/trained": len(trained),
               "designer/reward_mean": float(np.mean(trained)) if trained else 0.0}
    for k in (rw.PLAYED, rw.INVALID, rw.FAILED, rw.NO_DATA):
      metrics[f"designer/credit/{rw.KIND_NAMES[k]}"] = int(np.sum(kinds == k))
    return host, rows if cfg.train_designer else [], records, metrics
