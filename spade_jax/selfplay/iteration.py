"""One SPADE self-play iteration: design, validate, play, credit, train.

`SelfPlay` owns the host-side state (env slots, designer samples awaiting
credit, corpus position, environment memory) and the device-side state (train
state, regret buffer). `iteration(it)` runs the data path of DESIGN section 3
once and returns its metrics. All host state round-trips through
`host_state()` / `restore_host_state()` for checkpoints.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

import jax
import numpy as np

from spade_jax import designer as dz
from spade_jax import envs
from spade_jax.models import ChatTemplate
from spade_jax.rl import Trainer, TrainState
from spade_jax.sampling import Sampler, SamplingConfig, num_compiled_programs
from spade_jax.selfplay.batch import Row, build_batch
from spade_jax.selfplay.buffer import RegretBuffer
from spade_jax.selfplay.episodes import EpisodeSpec, run_episodes
from spade_jax.selfplay.rewards import RewardConfig, compute_rewards
# Episode outcomes that are the env's fault: excluded from win rates.
_AGENT_OUTCOMES = ("solved", "terminated", "truncated", "max_turns", "context")


@dataclasses.dataclass(frozen=True)
class SelfPlayConfig:
  """Shape of one iteration.

  Attributes:
    setting: "games" or "tool_use".
    skills: skills to design for (empty: every skill of the setting).
    num_envs: env slots E (one designer sample per slot per regeneration).
    plays: unhinted plays N per env.
    hinted_plays: hinted plays M per env, on the unhinted plays' seeds.
    max_turns: agent turns per episode.
    agent_turn_tokens: new tokens per agent turn.
    designer_new_tokens: new tokens per designer program.
    designer_prompt_chars: character budget of the designer prompt.
    designer_prompt_tokens: keep only the last this-many prompt tokens (0: all).
    regen_every: iterations between designer regenerations of all slots.
    hint_source: "program" (the env's hint()) or "policy" (the model reads the
      program and writes a hint).
    hint_tokens: new tokens of a policy-written hint.
    fill_from_pool: slots whose designer program was invalid play a built-in
      program instead (not credited to the designer).
    fixed_pool: never call the designer; play built-in programs only (baseline).
    train_designer: put credited designer samples in the GRPO batch.
    no_corpus: ablation: designer prompts without a document.
  """

  setting: str = "games"
  skills: tuple[str, ...] = ()
  num_envs: int = 4
  plays: int = 2
  hinted_plays: int = 2
  max_turns: int = 3
  agent_turn_tokens: int = 48
  designer_new_tokens: int = 256
  designer_prompt_chars: int = 24_000
  designer_prompt_tokens: int = 0
  regen_every: int = 1
  hint_source: str = "program"
  hint_tokens: int = 128
  fill_from_pool: bool = True
  fixed_pool: bool = False
  train_designer: bool = True
  no_corpus: bool = False

  def __post_init__(self):
    object.__setattr__(self, "skills", tuple(self.skills))
    envs.SETTINGS.check(self.setting)
    dz.HINT_SOURCES.check(self.hint_source)
    for name in ("num_envs", "plays", "hinted_plays", "max_turns", "regen_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"selfplay.{name} must be >= 1; got {getattr(self, name)}.")


@dataclasses.dataclass
class Slot:
  """An env slot: the program it plays and where that came from."""

  source: str | None = None
  origin: str = "none"          # "designer" | "pool" | "none"
  skill: int = -1               # index into the setting's skills; -1 not credited
  doc_id: str = ""
  hint: str | None = None       # policy-written hint for the current program
  age: int = 0


@dataclasses.dataclass
class DesignSample:
  """A designer sample waiting for its delayed credit."""

  slot: int
  skill: int
  doc_id: str
  tokens: list[int]
  logps: list[float]
  prompt_len: int
  program: str | None
  reason: str | None
  iteration: int


class SelfPlay:
  """Runs self-play iterations over a trainer, a sandbox pool and designer parts."""

  def __init__(self, cfg: SelfPlayConfig, *, trainer: Trainer, state: TrainState,
               vocab, sampling: SamplingConfig, pool, corpus: dz.Corpus,
               memory: dz.EnvMemory, reward_cfg: RewardConfig,
               validation: envs.ValidationConfig, seed: int = 0):
    self.setting = envs.SETTINGS[cfg.setting]
    self.skills = cfg.skills or envs.SKILLS[cfg.setting]
    for s in self.skills:
      envs.check_skill(cfg.setting, s)
    if reward_cfg.credit_window > cfg.regen_every:
      raise ValueError(
          f"rewards.credit_window={reward_cfg.credit_window} exceeds "
          f"selfplay.regen_every={cfg.regen_every}: a program would be replaced before "
          "its credit is due. Set credit_window <= regen_every.")
    self.cfg, self.trainer, self.state = cfg, trainer, state
    self.vocab, self.chat, self.sampling = vocab, ChatTemplate(vocab), sampling
    self.pool, self.corpus, self.memory = pool, corpus, memory
    self.reward_cfg, self.validation = reward_cfg, validation
    self.seed = seed
    self.base_key = jax.random.key(seed)
    self.pool_programs = list(envs.builtin_programs().values())
    self.slots = [Slot() for _ in range(cfg.num_envs)]
    self.pending: list[DesignSample] = []
    self.buffer_fresh: np.ndarray | None = None  # slots given new programs this iteration
    self.buffer = RegretBuffer.create(cfg.num_envs, cfg.plays, cfg.hinted_plays,
                                      window=max(reward_cfg.credit_window, 1))

  # -- policy ----------------------------------------------------------------
  def _policy(self, it: int, phase: int) -> Sampler:
    # Call n of this (iteration, phase) draws with fold_in(base, it, phase, n).
    key = jax.random.fold_in(jax.random.fold_in(self.base_key, it), phase)
    return Sampler(self.state.params, self.trainer.model_cfg, self.sampling, key,
                   mesh=self.trainer.mesh, rules=self.trainer.rules)

  def _seed(self, *parts: int) -> int:
    return int(np.random.SeedSequence([self.seed, *parts]).generate_state(1)[0] >> 1)

  # -- design ----------------------------------------------------------------
  def _design(self, it: int, metrics: dict, times: dict) -> list[Row]:
    """Regenerates every slot; returns rows for samples credited right away."""
    cfg, E = self.cfg, self.cfg.num_envs
    self.buffer_fresh = np.ones(E, bool)
    if cfg.fixed_pool:
      for e in range(E):
        self._install_pool(e, it)
      return []
    t0 = time.perf_counter()
    skills = [self.skills[(it // cfg.regen_every + e) % len(self.skills)] for e in range(E)]
    prompts, docs = [], []
    for e, skill in enumerate(skills):
      doc = None if cfg.no_corpus else self.corpus.next()
      docs.append(doc)
      text = dz.designer_prompt(
          cfg.setting, skill, doc,
          exemplars=self.memory.exemplars(skill, setting=cfg.setting),
          negative=self.memory.negative(skill, setting=cfg.setting, seed=it + e),
          max_chars=cfg.designer_prompt_chars, no_corpus=cfg.no_corpus)
      ids = self.chat.prompt(None, text)
      if cfg.designer_prompt_tokens:
        ids = ids[-cfg.designer_prompt_tokens:]
      prompts.append(ids)
    gen = self._policy(it, 0)(prompts, cfg.designer_new_tokens)
    texts = [self.vocab.decode(t) for t in gen.tokens]
    times["design"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    verdicts = envs.validate_many(texts, self.pool, self.validation)
    times["validate"] = time.perf_counter() - t0

    rows, reasons = [], collections.Counter()
    for e, (skill, doc, p, toks, lps, v) in enumerate(
        zip(skills, docs, prompts, gen.tokens, gen.logprobs, verdicts)):
      sample = DesignSample(e, envs.skill_index(cfg.setting, skill), doc.id if doc else "",
                            p + toks, [0.0] * len(p) + lps, len(p), v.source, v.reason, it)
      if v.valid:
        self.slots[e] = Slot(v.source, "designer", sample.skill, sample.doc_id)
        self.pending.append(sample)
        continue
      reasons[v.reason] += 1
      if v.source:
        self.memory.add(dz.MemoryRecord(program=v.source, doc_id=sample.doc_id,
                                        skill=skill, reason=v.reason, iteration=it,
                                        setting=cfg.setting))
      rows.append(self._design_row(sample, self.reward_cfg.invalid_penalty))
      if cfg.fill_from_pool:
        self._install_pool(e, it)
      else:
        self.slots[e] = Slot()
    metrics["designer/samples"] = E
    metrics["designer/valid"] = E - sum(reasons.values())
    metrics["designer/valid_rate"] = metrics["designer/valid"] / E
    for r in envs.REASONS:
      metrics[f"designer/rejected/{r}"] = reasons.get(r, 0)
    metrics["designer/finished_rate"] = float(np.mean(gen.finished))
    if cfg.hint_source == "policy":
      self._policy_hints(it)
    return rows

  def _install_pool(self, e: int, it: int) -> None:
    src = self.pool_programs[(it + e) % len(self.pool_programs)]
    self.slots[e] = Slot(src, "pool", -1)

  def _policy_hints(self, it: int) -> None:
    live = [e for e, s in enumerate(self.slots) if s.source]
    prompts = [self.chat.prompt(None, dz.hint_prompt(self.slots[e].source, self.cfg.setting))
               for e in live]
    gen = self._policy(it, 1)(prompts, self.cfg.hint_tokens)
    for e, toks in zip(live, gen.tokens):
      self.slots[e].hint = dz.finalize_hint(self.vocab.decode(toks), "policy").text

  def _program_hints(self, handles) -> list[str | None]:
    hints = self.pool.call_many(handles, "hint")
    sols = self.pool.call_many(handles, "solution")
    out = []
    for h, s in zip(hints, sols):
      sol = s.value if s.ok and isinstance(s.value, list) else None
      out.append(dz.finalize_hint(h.value if h.ok else None, "program", sol).text)
    return out

  def _design_row(self, s: DesignSample, advantage: float) -> Row:
    mask = [False] * s.prompt_len + [True] * (len(s.tokens) - s.prompt_len)
    return Row(s.tokens, mask, s.logps, float(advantage), "designer")

  # -- play ------------------------------------------------------------------
  def _play(self, it: int, metrics: dict, times: dict):
    cfg, E, N, M = self.cfg, self.cfg.num_envs, self.cfg.plays, self.cfg.hinted_plays
    t0 = time.perf_counter()
    specs = []
    for e, slot in enumerate(self.slots):
      if not slot.source:
        continue
      seeds = [self._seed(it, e, j) for j in range(N)]
      specs += [EpisodeSpec(e, s) for s in seeds]
      specs += [EpisodeSpec(e, seeds[j % N], True, slot.hint) for j in range(M)]
    episodes = run_episodes(
        self.pool, [s.source or "" for s in self.slots], specs, self._policy(it, 2),
        self.chat, lambda h: dz.agent_system_prompt(cfg.setting, h),
        max_turns=cfg.max_turns, max_turn_tokens=cfg.agent_turn_tokens,
        max_len=self.trainer.train_cfg.seq_len,
        hint_fn=self._program_hints if cfg.hint_source == "program" else None,
        action_mode=self.setting.action_mode)
    times["play"] = time.perf_counter() - t0

    r_n, m_n = np.zeros((E, N), np.float32), np.zeros((E, N), bool)
    r_h, m_h = np.zeros((E, M), np.float32), np.zeros((E, M), bool)
    outcomes = collections.Counter(), collections.Counter()
    index: collections.Counter = collections.Counter()
    nohint: dict[tuple[int, int], Any] = {}
    for ep in episodes:
      e, arm = ep.spec.env, int(ep.spec.hinted)
      outcomes[arm][ep.outcome] += 1
      j = index[e, arm]
      index[e, arm] += 1
      ok = ep.outcome in _AGENT_OUTCOMES
      if arm:
        r_h[e, j], m_h[e, j] = ep.reward, ok
      else:
        r_n[e, j], m_n[e, j] = ep.reward, ok
        nohint[e, j] = ep
    valid = np.array([s.source is not None for s in self.slots])
    skill = np.array([s.skill for s in self.slots], np.int32)
    rc = self.reward_cfg
    self.buffer = self.buffer.record(r_n, m_n, r_h, m_h, skill, valid,
                                     self.buffer_fresh,
                                     ema_slow=rc.ema_slow, ema_fast=rc.ema_fast)
    self.buffer_fresh = None
    for arm, name in ((0, "nohint"), (1, "hint")):
      n = max(1, sum(outcomes[arm].values()))
      for outcome in ("solved", "context", "max_turns", "timeout", "crash"):
        metrics[f"agent/{name}/{outcome}"] = outcomes[arm].get(outcome, 0) / n
    metrics["agent/reward_nohint"] = float(r_n[m_n].mean()) if m_n.any() else 0.0
    metrics["agent/reward_hint"] = float(r_h[m_h].mean()) if m_h.any() else 0.0
    metrics["agent/episodes"] = len(episodes)
    metrics["agent/mean_turns"] = float(np.mean([ep.turns for ep in episodes])) if episodes else 0.0
    return nohint

  # -- credit + train ----------------------------------------------------------
  def iteration(self, it: int) -> dict[str, float]:
    """Runs iteration `it` and returns its metrics (scalars)."""
    cfg = self.cfg
    metrics: dict[str, float] = {}
    times = {"design": 0.0, "validate": 0.0}
    rows: list[Row] = []
    if it % cfg.regen_every == 0:
      rows += self._design(it, metrics, times)
    nohint = self._play(it, metrics, times)
    out = compute_rewards(self.buffer, self.reward_cfg)
    designer_r = np.asarray(out.designer)
    adv = np.asarray(out.agent_advantages)
    for k in ("regret_mean", "win_rate_mean", "valid_frac", "credited_frac"):
      metrics[f"rewards/{k}"] = float(out.metrics[k])

    for s in self.slots:
      if s.source:
        s.age += 1
    due = [p for p in self.pending
           if self.slots[p.slot].origin == "designer" and self.slots[p.slot].age >=
           self.reward_cfg.credit_window]
    self.pending = [p for p in self.pending if p not in due]
    stats = np.asarray(out.metrics["per_env/win_rate"]), np.asarray(out.metrics["per_env/regret"])
    for p in due:
      rows.append(self._design_row(p, designer_r[p.slot]))
      hint_rate = float(stats[0][p.slot] + stats[1][p.slot])
      self.memory.add(dz.MemoryRecord(
          program=p.program or "", doc_id=p.doc_id, skill=self.skills_name(p.skill),
          win_rate_nohint=float(stats[0][p.slot]), win_rate_hint=hint_rate,
          regret=float(stats[1][p.slot]), designer_reward=float(designer_r[p.slot]),
          iteration=it, setting=cfg.setting))
    credited = [r.advantage for r in rows if r.role == "designer"]
    metrics["designer/credited"] = len(credited)
    metrics["designer/reward_mean"] = float(np.mean(credited)) if credited else 0.0
    if not cfg.train_designer:
      rows = [r for r in rows if r.role != "designer"]
    for (e, j), ep in sorted(nohint.items()):
      if ep.outcome in _AGENT_OUTCOMES and ep.tokens:
        rows.append(Row(ep.tokens, ep.loss_mask, ep.logps, float(adv[e, j]), "agent"))

    t0 = time.perf_counter()
    tc = self.trainer.train_cfg
    batch, bstats = build_batch(rows, tc.batch_size, tc.seq_len, self.sampling.pad_id)
    metrics.update(bstats)
    self.state, tm = self.trainer.step(self.state, batch)
    tm = jax.device_get(tm)
    times["train"] = time.perf_counter() - t0
    metrics.update({f"train/{k}": float(v) for k, v in tm.items()})
    metrics.update({f"time/{k}": v for k, v in times.items()})
    metrics["sampler/compiled_programs"] = num_compiled_programs()
    metrics["memory/size"] = len(self.memory)
    return metrics

  def skills_name(self, index: int) -> str:
    return envs.SKILLS[self.cfg.setting][index] if index >= 0 else ""

  # -- checkpointed host state -------------------------------------------------
  def host_state(self) -> dict[str, Any]:
    return {
        "slots": [dataclasses.asdict(s) for s in self.slots],
        "pending": [dataclasses.asdict(p) for p in self.pending],
        "corpus": self.corpus.state(),
        "memory": self.memory.to_json(),
    }

  def restore_host_state(self, host: dict[str, Any]) -> None:
    self.slots = [Slot(**s) for s in host["slots"]]
    self.pending = [DesignSample(**p) for p in host["pending"]]
    self.corpus.restore(host["corpus"])
    self.memory = dz.EnvMemory.from_json(host["memory"], self.memory.config)
