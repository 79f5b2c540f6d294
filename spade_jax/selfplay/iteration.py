"""One SPADE self-play iteration: design, validate, hint, play, credit, train.

`SelfPlay` holds the iteration state: on the host a `HostState` (env slots, designer
samples awaiting credit, designs drawn ahead) beside the corpus position and the
environment memory; on the device the train state and the regret buffer. `iteration(it)`
runs the data path of DESIGN section 3 once, as a sequence of stage rooms
(`selfplay.stages`), and returns its metrics; every designer sample credited in it
leaves a record in `sample_records`. All host state round-trips through `host_state()` /
`restore_host_state()` for checkpoints.

The run's contamination `Auditor` (`selfplay.audit`; default: off) is handed to the rooms
that check the data path (design, play with its hints, and credit, which writes each
sample's flags into its record); their `audit/*` counts and `time/audit` add up.

Per docs/METHOD.md §1, at a regeneration (`it % regen_every == 0`) every slot gets a new
designer program for one of `skills_per_regen` skills chosen round-robin; a sample that
fails validation is resampled up to `designer_resamples` times; the policy reads each
program and writes a hint (its own sampling); hinted plays happen at the regeneration step
only, on the unhinted plays' seeds. A designer sample is credited `credit_window`
iterations after it was written, together with its cohort.

With a baseline env source (`selfplay.env_source`, `baselines.ENV_SOURCES`: a static pool
or RLVE tasks) the design stage is replaced by a draw from the source and the source hears
each slot's unhinted rewards after the plays; everything after the plays is unchanged.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax

from spade_jax import designer as dz
from spade_jax import envs
from spade_jax.rl import Trainer, TrainState
from spade_jax.sampling import Sampler, SamplingConfig, num_compiled_programs
from spade_jax.selfplay import rewards as rw
from spade_jax.selfplay.audit import KINDS as AUDIT_KINDS, AuditConfig, Auditor
from spade_jax.selfplay.baselines import EnvSource
from spade_jax.selfplay.buffer import RegretBuffer
from spade_jax.selfplay.config import SelfPlayConfig
from spade_jax.selfplay.roles import ROLES, RoleSampling, Roles
from spade_jax.selfplay.stages.credit import Credit
from spade_jax.selfplay.stages.design import Design, Draw, regen_skills
from spade_jax.selfplay.stages.hints import write_hints
from spade_jax.selfplay.stages.play import Play
from spade_jax.selfplay.stages.train import train
from spade_jax.selfplay.state import DesignSample, HostState, Slot, skill_name

__all__ = ["ROLES", "DesignSample", "HostState", "RoleSampling", "SelfPlay", "SelfPlayConfig",
           "Slot", "regen_skills"]


def _merge(metrics: dict[str, float], more: dict[str, float]) -> dict[str, float]:
  """`metrics` updated with `more`; the audit's counts and time, which several stages
  report, add up (its leak rate comes from the play stage alone)."""
  out = dict(metrics)
  for k, v in more.items():
    adds = k == "time/audit" or k.startswith(("audit/checked/", "audit/flagged/",
                                               "audit/dropped/", "audit/hint/leaked_"))
    out[k] = out.get(k, 0.0) + v if adds else v
  return out


class SelfPlay:
  """Runs self-play iterations over a trainer, a sandbox pool and designer parts."""

  def __init__(self, cfg: SelfPlayConfig, *, trainer: Trainer, state: TrainState,
               vocab, sampling: SamplingConfig | RoleSampling, pool, corpus: dz.Corpus | None,
               memory: dz.EnvMemory, reward_cfg: rw.RewardConfig,
               validation: envs.ValidationConfig, seed: int = 0,
               env_source: EnvSource | None = None, auditor: Auditor | None = None):
    self.setting = envs.SETTINGS[cfg.setting]
    self.skills = cfg.skills or envs.SKILLS[cfg.setting]
    for s in self.skills:
      envs.check_skill(cfg.setting, s)
    if (env_source is None) != (cfg.env_source == "designer"):
      raise ValueError(f"selfplay.env_source={cfg.env_source!r} but SelfPlay got env_source="
                       f"{type(env_source).__name__}; build it with "
                       "baselines.make_env_source(cfg.env_source, ...).")
    # The credit window bounds designer credit only; baselines have no designer samples.
    if env_source is None and reward_cfg.credit_window > cfg.regen_every:
      raise ValueError(
          f"rewards.credit_window={reward_cfg.credit_window} exceeds "
          f"selfplay.regen_every={cfg.regen_every}: a program would be replaced before "
          "its credit is due. Set credit_window <= regen_every.")
    if reward_cfg.scale is None:
      reward_cfg = dataclasses.replace(
          reward_cfg, scale=rw.reference_scale(cfg.plays, cfg.regen_every))
    self.cfg, self.trainer, self.state = cfg, trainer, state
    self.vocab = vocab
    self.roles = Roles(cfg, vocab, sampling, seed, trainer)
    self.chat, self.agent_chat = self.roles.chat, self.roles.agent_chat
    self.sampling = self.roles.sampling
    if cfg.design_ahead and self.sampling.designer != self.sampling.agent:
      raise ValueError(
          "selfplay.design_ahead decodes the designer's programs on the agent's engine "
          f"rows, which sample with one rule: designer_sampling={self.sampling.designer} "
          f"differs from sampling={self.sampling.agent}. Make them equal (the reference "
          "recipes do) or set selfplay.design_ahead=False.")
    self.pool, self.corpus, self.memory = pool, corpus, memory
    self.reward_cfg, self.validation = reward_cfg, validation
    self.env_source = env_source
    self.seed = seed
    self.auditor = auditor if auditor is not None else Auditor(AuditConfig(mode="off"))
    self.pool_programs = list(envs.builtin_programs(cfg.setting).values())
    self.host = HostState.empty(cfg.num_envs)
    self.sample_records: list[dict[str, Any]] = []
    self.on_phase: Callable[[str], None] = lambda phase: None  # progress of long phases
    # Without hinted plays the buffer keeps one hinted column, always masked out.
    self.buffer = RegretBuffer.create(cfg.num_envs, cfg.plays, max(cfg.hinted_plays, 1),
                                      window=max(reward_cfg.credit_window, 1),
                                      num_skills=len(envs.SKILLS[cfg.setting]))
    # The stage rooms, in the order an iteration runs them.
    if env_source is None:
      self.design = Design(cfg, self.roles, skills=self.skills, corpus=corpus, pool=pool,
                           validation=validation, pool_programs=self.pool_programs,
                           auditor=self.auditor)
      self.draw = None
    else:
      self.design, self.draw = None, Draw(cfg, env_source, pool)
    self.play = Play(cfg, self.roles, pool=pool, design=self.design, auditor=self.auditor,
                     env_source=env_source)
    self.credit = Credit(cfg, reward_cfg, self.sampling, self.pool_programs, self.auditor,
                         seed)

  # -- the host state's parts, read-only ----------------------------------------
  @property
  def slots(self) -> tuple[Slot, ...]:
    return self.host.slots

  @property
  def fresh(self) -> tuple[bool, ...]:
    """Slots given a new program since the last play."""
    return self.host.fresh

  @property
  def pending(self) -> tuple[DesignSample, ...]:
    return self.host.pending

  @property
  def ahead(self):
    """The next regeneration's first designer samples, drawn ahead (`design_ahead`)."""
    return self.host.ahead

  # -- policy ----------------------------------------------------------------
  def _policy(self, it: int, role: str) -> Sampler:
    """Role `role`'s sampler at iteration `it`, with the current weights."""
    return self.roles.sampler(self.state.params, it, role)

  def _seed(self, *parts: int) -> int:
    return self.roles.play_seed(*parts)

  def _version(self) -> int:
    return int(jax.device_get(self.state.step))

  # -- one iteration -------------------------------------------------------------
  def iteration(self, it: int) -> dict[str, float]:
    """Runs iteration `it` and returns its metrics (scalars)."""
    cfg, host = self.cfg, self.host
    metrics: dict[str, float] = ({"time/design": 0.0, "time/validate": 0.0}
                                 if self.env_source is None else {"time/draw": 0.0})
    if it % cfg.regen_every == 0:
      if self.env_source is None:
        self.on_phase("design + validate")
        host, m = self.design(host, it, policy=self._policy, version=self._version(),
                              memory=self.memory)
      else:
        self.on_phase(f"draw ({cfg.env_source})")
        host, m = self.draw(host, it)
      metrics = _merge(metrics, m)
      if cfg.hint_source == "policy" and cfg.hinted_plays:
        self.on_phase("hints")
        t0 = time.perf_counter()
        host, m = write_hints(cfg, self.roles, host, it, self._policy)
        metrics.update(m)
        metrics["time/hint"] = time.perf_counter() - t0
    metrics.update(self.roles.sampling_metrics())
    self.host = host

    self.on_phase("play")
    host, self.buffer, nohint, m = self.play(
        host, self.buffer, it, policy=self._policy, version=self._version(),
        memory=self.memory, max_len=self.trainer.train_cfg.seq_len,
        ema=(self.reward_cfg.ema_fast, self.reward_cfg.ema_slow))
    metrics = _merge(metrics, m)
    if self.auditor.on:  # every kind's counts, zero when nothing of it was checked
      for kind in AUDIT_KINDS:
        metrics.setdefault(f"audit/checked/{kind}", 0.0)
        metrics.setdefault(f"audit/flagged/{kind}", 0.0)
      metrics.setdefault("time/audit", 0.0)
    host, credited, m = self.credit(host, self.buffer, nohint, it, memory=self.memory)
    metrics.update(m)
    self.host = host
    self.sample_records.extend(credited.records)

    self.on_phase("train")
    self.state, m = train(self.trainer, self.state, credited.rows, self.sampling.agent.pad_id)
    metrics.update(m)
    # A fact about this process (a resumed run compiles again), not about the run.
    metrics["process/compiled_programs"] = num_compiled_programs()
    metrics["memory/size"] = len(self.memory)
    return metrics

  def agent_system(self) -> str | None:
    """The agent's system turn (`SelfPlayConfig.agent_system`)."""
    return self.roles.agent_system()

  def skill_name(self, index: int) -> str:
    return skill_name(self.cfg.setting, index)

  # -- checkpointed host state -------------------------------------------------
  def host_state(self) -> dict[str, Any]:
    own = self.host.to_json()
    return {
        "slots": own["slots"],
        "fresh": own["fresh"],
        "pending": own["pending"],
        "corpus": self.corpus.state() if self.corpus is not None else None,
        "memory": self.memory.to_json(),
        "env_source": self.env_source.state() if self.env_source is not None else None,
        "ahead": own["ahead"],
    }

  def restore_host_state(self, host: dict[str, Any]) -> None:
    self.host = HostState.from_json(host)
    if self.corpus is not None:
      self.corpus.restore(host["corpus"])
    self.memory = dz.EnvMemory.from_json(host["memory"], self.memory.config)
    if self.env_source is not None:
      if host.get("env_source") is None:
        raise ValueError(f"The checkpoint holds no state of env source "
                         f"{self.cfg.env_source!r}; it was written by a run with another "
                         "selfplay.env_source. Resume with that config or use a new workdir.")
      self.env_source.restore(host["env_source"])

