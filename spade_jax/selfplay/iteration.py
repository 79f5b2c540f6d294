"""One SPADE self-play iteration: design, validate, hint, play, credit, train.

`SelfPlay` owns the host-side state (env slots, designer samples awaiting credit,
corpus position, environment memory) and the device-side state (train state, regret
buffer). `iteration(it)` runs the data path of DESIGN section 3 once and returns its
metrics; every designer sample credited in it leaves a record in `sample_records`. All
host state round-trips through `host_state()` / `restore_host_state()` for checkpoints.

Per REFERENCE §1, at a regeneration (`it % regen_every == 0`) every slot gets a new
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

import collections
import dataclasses
import re
import time
from typing import Any, Callable

import jax
import numpy as np

from spade_jax import designer as dz
from spade_jax import envs
from spade_jax.models import ChatTemplate
from spade_jax.rl import Trainer, TrainState
from spade_jax.sampling import (Generation, Request, Sampler, SamplingConfig,
                                num_compiled_programs, row_keys)
from spade_jax.sandbox import FAILURES
from spade_jax.selfplay import rewards as rw
from spade_jax.selfplay.baselines import ENV_SOURCES, EnvSource
from spade_jax.selfplay.batch import Row, build_batches
from spade_jax.selfplay.buffer import RegretBuffer
from spade_jax.selfplay.episodes import EpisodeSpec, run_episodes, run_episodes_with_requests

ROLES = ("designer", "hint", "agent")


def _last_boxed(text: str) -> str | None:
  """Content of the last \\boxed{...} of a reply (one level of nested braces)."""
  found = re.findall(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}", text)
  return found[-1] if found else None


@dataclasses.dataclass(frozen=True)
class SelfPlayConfig:
  """Shape of one iteration.

  Attributes:
    setting: a name in `envs.SETTINGS` ("games" or "tool_use").
    env_source: where the slots' programs come from, a name in
      `selfplay.baselines.ENV_SOURCES`: "designer" (SPADE: the policy writes them),
      "static_pool" (the `static_pool` section; the built-in programs by default) or
      "rlve" (the `rlve` section: reasoning-gym tasks under a difficulty controller).
      The baselines train the agent only.
    skills: skills to design for (empty: every skill of the setting).
    num_envs: env slots E (one designer sample per slot per regeneration).
    plays: unhinted plays N per env and iteration.
    hinted_plays: hinted plays M per env at its regeneration step, on the unhinted seeds
      (0: none, as the baselines; the designer needs >= 1 for its regret).
    max_turns: agent turns per episode.
    agent_turn_tokens: new tokens per agent turn.
    designer_new_tokens: new tokens per designer program.
    designer_prompt_tokens: token budget of the designer prompt (chat markup included);
      the document is cut to fit, never the rest. 0: no budget.
    skills_per_regen: skills designed for at one regeneration, rotating round-robin
      (reference 3 of 6); 0: every skill each time.
    designer_resamples: times a slot's designer sample is redrawn after failing
      validation (reference 5).
    regen_every: iterations between designer regenerations of all slots.
    hint_source: "policy" (reference: the model reads the program and writes a hint) or
      "program" (the program's own hint()).
    hint_tokens: new tokens of a policy-written hint.
    hint_leak_check: drop a hint that spells out the episode's solution() actions (the
      hinted play then runs unhinted).
    matched_hint_seeds: hinted plays reuse the unhinted plays' seeds, so both regret arms
      see the same instances; False draws their own seeds (the reference).
    fill_from_pool: slots without a valid designer program play a built-in program
      instead (never credited to the designer).
    train_designer: put credited designer samples in the GRPO batch.
    no_corpus: ablation: designer prompts without a document.
    dynamic_sampling: leave out of the gradient the agent groups (an env slot's unhinted
      plays) whose terminal outcomes are all equal (DAPO; counted in
      `agent/uniform_groups_dropped`); they still count in win rates and regret.
    llm_validator: the policy judges each program that passed validation and rejects
      those it answers `\\boxed{no}` for (reason "judge"; REFERENCE §5, tool use).
    judge_tokens: new tokens of a judgement.
    designer_thinking: the designer and hint writer's chat prefix lets the model think
      (False: Qwen3's non-thinking mode, an empty think block in front of each turn).
    agent_thinking: the same for the agent.
    overlap_play: step an episode's env as soon as its turn ends, while the sampler
      decodes the other episodes (same transcripts as lock step; see
      `selfplay.episodes.run_episodes` and experiments/benchmarks/rollout.py).
    play_cohorts: with `overlap_play`, k >= 2 splits the agent's engine rows into k
      lock-step cohorts run out of phase: one decodes while the others' envs step
      (`sampling.schedule(overlap=k)`); 0 lets every row rejoin on its own.
    design_ahead: the first designer sample of each slot for the next regeneration is
      drawn during the plays of the iteration before it, on the agent's engine rows
      (`episodes.run_episodes_with_requests`), so the designer's decoding overlaps the
      agent's plays and env steps. Those samples come from the weights before that
      iteration's update (their policy version is recorded; truncated IS corrects the
      lag like any stale sample), and their prompts are rebuilt at the regeneration: a
      slot whose prompt changed meanwhile (the memory took the credited cohort) is drawn
      again then, so every program answers the prompt the reference would show.
      Resamples of invalid programs run at the regeneration as usual. A run's last
      iteration draws them too (checkpointed: a run extended later plays them, as an
      uninterrupted one would). Needs `designer_sampling` equal to `sampling`. False:
      the reference's order.
    agent_system: the agent's system turn: "default" (the setting's agent prompt,
      `designer.agent_system_prompt`), "none" (no system turn: the task's text is the
      whole prompt) or any other text, used as it is.
  """

  setting: str = "games"
  env_source: str = "designer"
  skills: tuple[str, ...] = ()
  num_envs: int = 4
  plays: int = 2
  hinted_plays: int = 2
  max_turns: int = 3
  agent_turn_tokens: int = 48
  designer_new_tokens: int = 256
  designer_prompt_tokens: int = 0
  skills_per_regen: int = 3
  designer_resamples: int = 5
  regen_every: int = 1
  hint_source: str = "policy"
  hint_tokens: int = 128
  hint_leak_check: bool = True
  matched_hint_seeds: bool = True
  fill_from_pool: bool = True
  train_designer: bool = True
  no_corpus: bool = False
  dynamic_sampling: bool = False
  llm_validator: bool = False
  judge_tokens: int = 256
  designer_thinking: bool = True
  agent_thinking: bool = True
  overlap_play: bool = False
  play_cohorts: int = 0
  design_ahead: bool = False
  agent_system: str = "default"

  def __post_init__(self):
    object.__setattr__(self, "skills", tuple(self.skills))
    envs.SETTINGS.check(self.setting)
    dz.HINT_SOURCES.check(self.hint_source)
    ENV_SOURCES.check(self.env_source)
    for name in ("num_envs", "plays", "max_turns", "regen_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"selfplay.{name} must be >= 1; got {getattr(self, name)}.")
    if self.design_ahead and self.env_source != "designer":
      raise ValueError(f"selfplay.design_ahead draws the designer's next programs, but "
                       f"selfplay.env_source={self.env_source!r} has no designer; set "
                       "design_ahead=False for the baselines.")
    if self.env_source == "designer" and self.hinted_plays < 1:
      raise ValueError(f"selfplay.hinted_plays={self.hinted_plays}: the designer's regret "
                       "needs hinted plays; set it >= 1 (only the baselines, "
                       "selfplay.env_source='static_pool' or 'rlve', may use 0).")
    if self.play_cohorts == 1 or self.play_cohorts < 0:
      raise ValueError(f"selfplay.play_cohorts={self.play_cohorts}: use 0 (rows rejoin on "
                       "their own) or k >= 2 cohorts.")
    if self.play_cohorts and not self.overlap_play:
      raise ValueError(f"selfplay.play_cohorts={self.play_cohorts} needs "
                       "selfplay.overlap_play=True (cohorts are an overlapped schedule).")
    for name in ("hinted_plays", "skills_per_regen", "designer_resamples",
                 "designer_prompt_tokens"):
      if getattr(self, name) < 0:
        raise ValueError(f"selfplay.{name} must be >= 0; got {getattr(self, name)}.")


def _overlap(cfg: SelfPlayConfig) -> bool | int:
  """The episode runner's `overlap`: lock step, rows rejoining alone, or k cohorts."""
  return cfg.play_cohorts or cfg.overlap_play  # play_cohorts > 0 implies overlap_play


@dataclasses.dataclass(frozen=True)
class RoleSampling:
  """One sampling rule per role: the designer, the hint writer and the agent."""

  designer: SamplingConfig
  hint: SamplingConfig
  agent: SamplingConfig

  @classmethod
  def of(cls, sampling: SamplingConfig | RoleSampling) -> RoleSampling:
    return sampling if isinstance(sampling, RoleSampling) else cls(sampling, sampling, sampling)


@dataclasses.dataclass
class Slot:
  """An env slot: the program it plays and where that came from."""

  source: str | None = None
  origin: str = "none"          # "designer" | "pool" | an env source's name | "none"
  skill: int = -1               # index into the setting's skills; -1 not credited
  doc_id: str = ""
  written: int = -1             # iteration its designer sample was written
  hint: str | None = None       # policy-written hint for the current program


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
  reason: str | None            # None: the program was valid and installed
  iteration: int
  attempt: int = 0
  policy_version: int = 0
  # How its env failed while played, if it did: "timeout" (a call ran past the sandbox's
  # deadline) or "crash" (any other sandbox failure). The program is then replaced at
  # once, so its credit reads this and `failure_raw`, never the slot's later state.
  failure: str | None = None
  failure_raw: float = 0.0      # its env's raw score in the iteration it failed

  @property
  def failed(self) -> bool:
    return self.failure is not None


def _sample_fields(saved: dict[str, Any]) -> dict[str, Any]:
  """A checkpointed `DesignSample`'s fields. Older checkpoints hold `failed` instead of
  `failure`: their failed samples were credited as crashes, and still are."""
  saved = dict(saved)
  if "failed" in saved:
    saved.setdefault("failure", "crash" if saved.pop("failed") else None)
  return saved


def regen_skills(skills: tuple[str, ...], per_regen: int, regen: int,
                 num_envs: int) -> list[str]:
  """Each slot's skill at regeneration number `regen` (REFERENCE §1.1).

  `per_regen` skills (0: all) are chosen round-robin, so successive regenerations cover
  every skill, and the slots are dealt among them in turn: 24 envs and 3 of 6 skills give
  8 envs per skill, so every skill's cohort has several members to be centred on.
  """
  k = min(per_regen or len(skills), len(skills))
  chosen = [skills[(regen * k + j) % len(skills)] for j in range(k)]
  return [chosen[e % k] for e in range(num_envs)]


class SelfPlay:
  """Runs self-play iterations over a trainer, a sandbox pool and designer parts."""

  def __init__(self, cfg: SelfPlayConfig, *, trainer: Trainer, state: TrainState,
               vocab, sampling: SamplingConfig | RoleSampling, pool, corpus: dz.Corpus | None,
               memory: dz.EnvMemory, reward_cfg: rw.RewardConfig,
               validation: envs.ValidationConfig, seed: int = 0,
               env_source: EnvSource | None = None):
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
    self.chat = ChatTemplate(vocab, thinking=cfg.designer_thinking)  # designer + hints
    self.agent_chat = ChatTemplate(vocab, thinking=cfg.agent_thinking)
    self.sampling = RoleSampling.of(sampling)
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
    self.base_key = jax.random.key(seed)
    self.pool_programs = list(envs.builtin_programs(cfg.setting).values())
    self.slots = [Slot() for _ in range(cfg.num_envs)]
    self.fresh = np.zeros(cfg.num_envs, bool)  # slots given a new program since the last play
    self.pending: list[DesignSample] = []
    # The next regeneration's first designer samples, drawn ahead (`design_ahead`).
    self.ahead: dict[str, Any] | None = None
    self.sample_records: list[dict[str, Any]] = []
    self.on_phase: Callable[[str], None] = lambda phase: None  # progress of long phases
    # Without hinted plays the buffer keeps one hinted column, always masked out.
    self.buffer = RegretBuffer.create(cfg.num_envs, cfg.plays, max(cfg.hinted_plays, 1),
                                      window=max(reward_cfg.credit_window, 1),
                                      num_skills=len(envs.SKILLS[cfg.setting]))

  # -- policy ----------------------------------------------------------------
  def _policy(self, it: int, role: str) -> Sampler:
    # Call n of this (iteration, role) draws with fold_in(base, it, role, n).
    key = jax.random.fold_in(jax.random.fold_in(self.base_key, it), ROLES.index(role))
    return Sampler(self.state.params, self.trainer.model_cfg, getattr(self.sampling, role),
                   key, mesh=self.trainer.mesh, rules=self.trainer.rules)

  def _seed(self, *parts: int) -> int:
    return int(np.random.SeedSequence([self.seed, *parts]).generate_state(1)[0] >> 1)

  def _count_tokens(self, text: str) -> int:
    return len(self.chat.prompt(None, text))

  # -- design ----------------------------------------------------------------

  def _design_prompts(self, it: int, docs: list | None = None) -> tuple[list, list, list]:
    """(skills, documents, prompt ids) of each slot at regeneration iteration `it`.

    Documents are drawn from the corpus unless given (a design drawn ahead keeps its own).
    """
    cfg, E = self.cfg, self.cfg.num_envs
    skills = regen_skills(self.skills, cfg.skills_per_regen, it // cfg.regen_every, E)
    prompts, drawn = [], []
    budget = cfg.designer_prompt_tokens or None
    for e, skill in enumerate(skills):
      if docs is not None:
        doc = docs[e]
      else:
        doc = None if cfg.no_corpus else self.corpus.next()
      drawn.append(doc)
      tool_kw = {}
      if self.setting.tool_harness:  # REFERENCE §5: a domain and a task type per slot
        pick = self._seed(it, e, 3)
        tool_kw = dict(domain=envs.TOOL_DOMAINS[pick % len(envs.TOOL_DOMAINS)],
                       task_type=list(envs.TOOL_TASK_TYPES)[(pick >> 8)
                                                            % len(envs.TOOL_TASK_TYPES)])
      text = dz.designer_prompt(
          cfg.setting, skill, doc, **tool_kw,
          exemplars=self.memory.exemplars(skill, setting=cfg.setting,
                                          seed=self._seed(it, e, 1)),
          negative=self.memory.negative(skill, setting=cfg.setting, seed=self._seed(it, e, 2)),
          no_corpus=cfg.no_corpus, budget=budget, count=self._count_tokens)
      prompts.append(self.chat.prompt(None, text))
    return skills, drawn, prompts

  def _design_ahead_due(self, it: int) -> bool:
    """Whether iteration `it`'s plays also draw the next regeneration's designs."""
    return (self.cfg.design_ahead and self.env_source is None
            and (it + 1) % self.cfg.regen_every == 0)

  def _design(self, it: int, metrics: dict, times: dict) -> None:
    """Regenerates every slot, resampling invalid programs; samples join `pending`."""
    cfg, E = self.cfg, self.cfg.num_envs
    self.fresh[:] = True
    t0 = time.perf_counter()
    ahead = self.ahead if self.ahead is not None and self.ahead["iteration"] == it else None
    self.ahead = None
    if ahead is not None:  # the same documents; the prompts as the memory stands now
      skills, docs, prompts = self._design_prompts(
          it, [dz.Document(**d) if d else None for d in ahead["docs"]])
    else:
      skills, docs, prompts = self._design_prompts(it)
    designer = self._policy(it, "designer")
    version = int(jax.device_get(self.state.step))
    first: dict[int, tuple[list[int], list[float], bool]] = {}
    if ahead is not None:
      if isinstance(designer, Sampler):
        designer.calls = 1  # call 0 of this (iteration, role) drew the designs ahead
      first = {e: (ahead["tokens"][e], ahead["logps"][e], ahead["finished"][e])
               for e in range(E) if prompts[e] == ahead["prompts"][e]}
      metrics["designer/ahead_used"] = len(first)
      metrics["designer/ahead_stale"] = E - len(first)
    need, attempts, valid = list(range(E)), 0, 0
    reasons: collections.Counter = collections.Counter()
    finished, tokens, validate_s = [], 0, 0.0
    for attempt in range(cfg.designer_resamples + 1):
      if not need:
        break
      if attempt == 0 and first:
        todo = [e for e in need if e not in first]
        new = (designer([prompts[e] for e in todo], cfg.designer_new_tokens) if todo
               else Generation([], [], []))
        got = {**first, **{e: (t, l, f) for e, t, l, f in
                           zip(todo, new.tokens, new.logprobs, new.finished)}}
        gen = Generation([got[e][0] for e in need], [got[e][1] for e in need],
                         [got[e][2] for e in need])
      else:
        gen = designer([prompts[e] for e in need], cfg.designer_new_tokens)
      t1 = time.perf_counter()
      verdicts = envs.validate_many([self.vocab.decode(t) for t in gen.tokens], self.pool,
                                    self.validation)
      validate_s += time.perf_counter() - t1
      if cfg.llm_validator:
        verdicts = self._judge(it, attempt, verdicts, metrics)
      finished += gen.finished
      tokens += sum(len(t) for t in gen.tokens)
      attempts += len(need)
      retry = []
      for e, toks, lps, v in zip(need, gen.tokens, gen.logprobs, verdicts):
        p = prompts[e]
        doc_id = docs[e].id if docs[e] else ""
        sample = DesignSample(e, envs.skill_index(cfg.setting, skills[e]), doc_id, p + toks,
                              [0.0] * len(p) + lps, len(p), v.source, v.reason, it, attempt,
                              ahead["version"] if attempt == 0 and e in first else version)
        self.pending.append(sample)
        if v.valid:
          valid += 1
          self.slots[e] = Slot(v.source, "designer", sample.skill, doc_id, written=it)
          continue
        reasons[v.reason] += 1
        retry.append(e)
        if v.source:
          self.memory.add(dz.MemoryRecord(program=v.source, doc_id=doc_id, skill=skills[e],
                                          reason=v.reason, iteration=it,
                                          setting=cfg.setting))
      need = retry
    for e in need:
      if cfg.fill_from_pool:
        self._install_pool(e, it)
      else:
        self.slots[e] = Slot()
    times["design"] = time.perf_counter() - t0 - validate_s
    times["validate"] = validate_s
    metrics["designer/samples"] = attempts
    metrics["designer/valid"] = valid
    metrics["designer/valid_rate"] = valid / max(attempts, 1)
    metrics["designer/resampled"] = attempts - E
    metrics["designer/slots_filled"] = valid
    for r in envs.REASONS:
      metrics[f"designer/rejected/{r}"] = reasons.get(r, 0)
    metrics["sampling/designer/tokens"] = tokens
    metrics["sampling/designer/finished_rate"] = float(np.mean(finished)) if finished else 0.0

  def _draw(self, it: int, times: dict) -> None:
    """A baseline's design stage: every slot gets the env source's next program."""
    t0 = time.perf_counter()
    drawn = self.env_source.draw(it, self.cfg.num_envs, self.pool)
    for e, d in enumerate(drawn):
      self.slots[e] = Slot(d.source, d.origin, -1, d.doc_id, written=it)
    self.fresh[:] = True
    times["draw"] = time.perf_counter() - t0

  def _judge(self, it: int, attempt: int, verdicts: list, metrics: dict) -> list:
    """REFERENCE §5's LLM validator: the policy judges each valid program (hint sampling);
    a `\\boxed{no}` (or no verdict) rejects it with reason "judge"."""
    live = [i for i, v in enumerate(verdicts) if v.valid]
    if not live:
      return verdicts
    prompts = [self.chat.prompt(None, dz.judge_prompt(verdicts[i].source, self.cfg.setting))
               for i in live]
    gen = self._policy(it, "hint")(prompts, self.cfg.judge_tokens)
    out = list(verdicts)
    for i, toks in zip(live, gen.tokens):
      said = _last_boxed(self.vocab.decode(toks))
      if said is None or said.strip().lower() != "yes":
        out[i] = dataclasses.replace(out[i], valid=False, reason="judge",
                                     detail=f"the judge answered {said!r} (attempt {attempt})")
    metrics["designer/judged"] = metrics.get("designer/judged", 0) + len(live)
    return out

  def _install_pool(self, e: int, it: int) -> None:
    src = self.pool_programs[(it + e) % len(self.pool_programs)]
    self.slots[e] = Slot(src, "pool", -1)
    self.fresh[e] = True

  def _policy_hints(self, it: int, metrics: dict) -> None:
    """The policy reads each new program and writes its hint (REFERENCE §1.4)."""
    live = [e for e, s in enumerate(self.slots) if s.source and self.fresh[e]]
    if not live:
      return
    prompts = [self.chat.prompt(None, dz.hint_prompt(self.slots[e].source, self.cfg.setting))
               for e in live]
    gen = self._policy(it, "hint")(prompts, self.cfg.hint_tokens)
    for e, toks in zip(live, gen.tokens):
      self.slots[e].hint = dz.clean_hint(self.vocab.decode(toks))
    metrics["sampling/hint/tokens"] = sum(len(t) for t in gen.tokens)
    metrics["sampling/hint/finished_rate"] = float(np.mean(gen.finished))

  def _episode_hints(self, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], str | None]:
    """Hint of each hinted (slot, seed), from instances of their own.

    The program's hint() and solution() run on a fresh instance reset with the play's
    seed, never on the live episode (they may change its state). A hint that spells out
    the solution's actions is dropped when `hint_leak_check`.
    """
    cfg = self.cfg
    program = cfg.hint_source == "program"
    if not pairs or not (program or cfg.hint_leak_check):
      return {(e, s): self.slots[e].hint for e, s in pairs}
    handles = envs.start(self.pool, [self.slots[e].source for e, _ in pairs], cfg.setting,
                         cfg.max_turns)
    try:
      resets = self.pool.reset_many(handles, seeds=[s for _, s in pairs])
      ok = [h for h, r in zip(handles, resets) if r.ok]
      sols = dict(zip(map(id, ok), self.pool.call_many(ok, "solution")
                      if cfg.hint_leak_check else [None] * len(ok)))
      own = dict(zip(map(id, ok), self.pool.call_many(ok, "hint") if program else
                     [None] * len(ok)))
    finally:
      self.pool.release(handles)
    out = {}
    for (e, s), h in zip(pairs, handles):
      sol, raw = sols.get(id(h)), own.get(id(h))
      actions = sol.value if sol is not None and sol.ok and isinstance(sol.value, list) else None
      text = (raw.value if raw is not None and raw.ok else None) if program else self.slots[e].hint
      out[(e, s)] = dz.finalize_hint(text, cfg.hint_source, actions).text
    return out

  # -- play ------------------------------------------------------------------
  def _play(self, it: int, metrics: dict, times: dict) -> dict[tuple[int, int], Any]:
    cfg, E, N, M = self.cfg, self.cfg.num_envs, self.cfg.plays, self.cfg.hinted_plays
    MB = self.buffer.num_hinted  # >= M: the buffer's hinted columns
    t0 = time.perf_counter()
    specs, hinted = [], []
    for e, slot in enumerate(self.slots):
      if not slot.source:
        continue
      seeds = [self._seed(it, e, j) for j in range(N)]
      specs += [EpisodeSpec(e, s) for s in seeds]
      if self.fresh[e]:
        hinted += [(e, seeds[j % N] if cfg.matched_hint_seeds else self._seed(it, e, N + j))
                   for j in range(M)]
    hints = self._episode_hints(sorted(set(hinted)))
    specs += [EpisodeSpec(e, s, True, hints[(e, s)]) for e, s in hinted]
    args = (self.pool, [s.source or "" for s in self.slots], specs, self._policy(it, "agent"),
            self.agent_chat, self.agent_system())
    kw = dict(max_turns=cfg.max_turns, max_turn_tokens=cfg.agent_turn_tokens,
              max_len=self.trainer.train_cfg.seq_len, setting=cfg.setting)
    if self._design_ahead_due(it):
      episodes = self._play_and_design_ahead(it, args, kw, metrics)
    else:
      episodes = run_episodes(*args, **kw, overlap=_overlap(cfg))
    times["play"] = time.perf_counter() - t0

    r_n, m_n = np.zeros((E, N), np.float32), np.zeros((E, N), bool)
    r_h, m_h = np.zeros((E, MB), np.float32), np.zeros((E, MB), bool)
    failed, timed_out = np.zeros(E, bool), np.zeros(E, bool)
    outcomes = collections.Counter(), collections.Counter()
    index: collections.Counter = collections.Counter()
    nohint: dict[tuple[int, int], Any] = {}
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
        nohint[e, j] = ep
    valid = np.array([s.source is not None for s in self.slots])
    skill = np.array([s.skill for s in self.slots], np.int32)
    rc = self.reward_cfg
    self.buffer = self.buffer.record(r_n, m_n, r_h, m_h, skill, valid, self.fresh, failed,
                                     timed_out, ema_fast=rc.ema_fast, ema_slow=rc.ema_slow)
    self.fresh[:] = False
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
    return nohint

  def _play_and_design_ahead(self, it: int, args: tuple, kw: dict, metrics: dict) -> list:
    """The plays of `it`, with the first designer sample of each slot for the
    regeneration at `it + 1` decoded on the same engine rows (`design_ahead`)."""
    cfg = self.cfg
    skills, docs, prompts = self._design_prompts(it + 1)
    designer, agent = self._policy(it + 1, "designer"), args[3]
    version = int(jax.device_get(self.state.step))
    if isinstance(designer, Sampler) and isinstance(agent, Sampler):
      key = designer.next_key()  # call 0 of (it + 1, designer), as `_design` would draw
      requests = [Request(p, cfg.designer_new_tokens, k)
                  for p, k in zip(prompts, row_keys(key, len(prompts)))]
      episodes, done = run_episodes_with_requests(*args, requests, **kw,
                                                  overlap=_overlap(cfg))
      gen = Generation([c.tokens for c in done], [c.logprobs for c in done],
                       [c.finished for c in done])
    else:  # a plain callable policy: the same samples, one after the other
      episodes = run_episodes(*args, **kw, overlap=_overlap(cfg))
      gen = designer(prompts, cfg.designer_new_tokens)
    self.ahead = {"iteration": it + 1, "version": version, "prompts": prompts,
                  "docs": [dataclasses.asdict(d) if d else None for d in docs],
                  "tokens": [list(map(int, t)) for t in gen.tokens],
                  "logps": [list(map(float, l)) for l in gen.logprobs],
                  "finished": [bool(f) for f in gen.finished]}
    metrics["designer/ahead_samples"] = len(prompts)
    metrics["sampling/designer/ahead_tokens"] = sum(len(t) for t in gen.tokens)
    return episodes

  # -- credit ------------------------------------------------------------------
  def _failed_designer_slots(self, out: rw.RewardOutput) -> list[int]:
    """Slots whose designer program hit a sandbox failure; marks their pending sample.

    The sample keeps its failure kind and its env's raw score of this iteration (a
    timeout scores itself under `regret_based`): the slot is refilled before the credit.
    """
    failed = np.asarray(self.buffer.failed)
    timed_out = np.asarray(self.buffer.timed_out)
    raw = np.asarray(out.raw)
    slots = [e for e, s in enumerate(self.slots) if s.origin == "designer" and failed[e]]
    for p in self.pending:
      slot = self.slots[p.slot]
      if (p.slot in slots and p.reason is None and p.iteration == slot.written
          and not p.failed):
        p.failure = "timeout" if timed_out[p.slot] else "crash"
        p.failure_raw = float(raw[p.slot])
    return slots

  def _blacklist(self, slots: list[int], it: int) -> None:
    """Failed designer programs are not played again (REFERENCE §2: blacklisted)."""
    for e in slots:
      if self.cfg.fill_from_pool:
        self._install_pool(e, it + 1)
      else:
        self.slots[e] = Slot()
        self.fresh[e] = True

  def _credit(self, it: int, out: rw.RewardOutput, metrics: dict) -> list[Row]:
    """Credits the cohort of designer samples whose window ends now."""
    due = [p for p in self.pending if p.iteration + self.reward_cfg.credit_window <= it + 1]
    if not due:
      return []
    self.pending = [p for p in self.pending if p not in due]
    E = self.cfg.num_envs
    A = max(p.attempt for p in due) + 1
    kinds = np.zeros((E, A), np.int32)
    skill = np.zeros(E, np.int32)
    # Per sample: a played one is scored by its slot's window now; a failed one by what it
    # failed with (its slot plays a replacement since).
    raw, timed_out = np.zeros((E, A), np.float32), np.zeros((E, A), bool)
    slot_raw = np.asarray(out.raw)
    has_data = np.asarray(out.stats.has_data)
    for p in due:
      slot, ea = self.slots[p.slot], (p.slot, p.attempt)
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
    values, use = rw.credit(raw, kinds, skill, timed_out, self.reward_cfg)
    values, use = np.asarray(values), np.asarray(use)
    stats = jax.device_get(out.stats)
    scores_timeouts = self.reward_cfg.variant in rw.SCORES_TIMEOUTS
    rows = []
    for p in due:
      e, a, kind = p.slot, p.attempt, kinds[p.slot, p.attempt]
      played = kind == rw.PLAYED
      own = played or (kind == rw.FAILED and timed_out[e, a] and scores_timeouts)
      if use[e, a]:
        mask = [False] * p.prompt_len + [True] * (len(p.tokens) - p.prompt_len)
        rows.append(Row(p.tokens, mask, p.logps, float(values[e, a]), "designer",
                        self.sampling.designer.logprob_temperature))
      if played:
        self.memory.add(dz.MemoryRecord(
            program=p.program or "", doc_id=p.doc_id, skill=self.skill_name(p.skill),
            win_rate_nohint=float(stats.win_rate[e]),
            win_rate_hint=float(np.asarray(self.buffer.hint_win_rate)[e]),
            regret=float(stats.rh[e] - stats.rn0[e]), designer_reward=float(values[e, a]),
            iteration=it, setting=self.cfg.setting))
      self.sample_records.append({
          "iteration_written": p.iteration, "iteration_credited": it, "slot": e,
          "attempt": a, "skill": self.skill_name(p.skill), "doc_id": p.doc_id,
          "verdict": p.reason or ("valid" if played else rw.KIND_NAMES[kind]),
          "Rh": float(stats.rh[e]) if played else None,
          "Rn0": float(stats.rn0[e]) if played else None,
          "w": float(stats.w[e]) if played else None,
          "raw": float(raw[e, a]) if own else None,
          "failure": p.failure,
          "reward": float(values[e, a]) if use[e, a] else None,
          "trained": bool(use[e, a]) and self.cfg.train_designer,
          "policy_version": p.policy_version})
    trained = [r.advantage for r in rows]
    metrics["designer/credited"] = len(due)
    metrics["designer/trained"] = len(trained)
    metrics["designer/reward_mean"] = float(np.mean(trained)) if trained else 0.0
    for k in (rw.PLAYED, rw.INVALID, rw.FAILED, rw.NO_DATA):
      metrics[f"designer/credit/{rw.KIND_NAMES[k]}"] = int(np.sum(kinds == k))
    return rows if self.cfg.train_designer else []

  # -- one iteration -------------------------------------------------------------
  def iteration(self, it: int) -> dict[str, float]:
    """Runs iteration `it` and returns its metrics (scalars)."""
    cfg = self.cfg
    metrics: dict[str, float] = {}
    times = {"design": 0.0, "validate": 0.0} if self.env_source is None else {"draw": 0.0}
    if it % cfg.regen_every == 0:
      if self.env_source is None:
        self.on_phase("design + validate")
        self._design(it, metrics, times)
      else:
        self.on_phase(f"draw ({cfg.env_source})")
        self._draw(it, times)
      if cfg.hint_source == "policy" and cfg.hinted_plays:
        self.on_phase("hints")
        t0 = time.perf_counter()
        self._policy_hints(it, metrics)
        times["hint"] = time.perf_counter() - t0
    for role in ROLES:
      rule = getattr(self.sampling, role)
      metrics.update({f"sampling/{role}/temperature": rule.temperature,
                      f"sampling/{role}/top_p": rule.top_p, f"sampling/{role}/top_k": rule.top_k})
    self.on_phase("play")
    nohint = self._play(it, metrics, times)
    out = rw.compute_rewards(self.buffer, self.reward_cfg)
    for k, v in out.metrics.items():
      metrics[f"rewards/{k}"] = float(v)
    failed = self._failed_designer_slots(out)
    rows = self._credit(it, out, metrics)
    self._blacklist(failed, it)
    metrics["env/blacklisted"] = len(failed)

    adv = np.asarray(out.agent_advantages)
    uniform = self._uniform_groups(nohint) if cfg.dynamic_sampling else set()
    metrics["agent/uniform_groups_dropped"] = len(uniform)
    for (e, j), ep in sorted(nohint.items()):
      if not ep.failed and ep.tokens and e not in uniform:
        rows.append(Row(ep.tokens, ep.loss_mask, ep.logps, float(adv[e, j]), "agent",
                        self.sampling.agent.logprob_temperature))
    self.on_phase("train")
    t0 = time.perf_counter()
    tc = self.trainer.train_cfg
    batches, bstats = build_batches(rows, tc.batch_size, tc.seq_len, self.sampling.agent.pad_id)
    metrics.update(bstats)
    self.state, tm = self.trainer.step(self.state, batches)
    tm = jax.device_get(tm)
    times["train"] = time.perf_counter() - t0
    metrics.update({f"train/{k}": float(v) for k, v in tm.items()})
    metrics.update({f"time/{k}": v for k, v in times.items()})
    # A fact about this process (a resumed run compiles again), not about the run.
    metrics["process/compiled_programs"] = num_compiled_programs()
    metrics["memory/size"] = len(self.memory)
    return metrics

  @staticmethod
  def _uniform_groups(nohint: dict[tuple[int, int], Any]) -> set[int]:
    """Env slots whose counted unhinted plays all ended with the same terminal reward
    (DAPO's dynamic sampling, on the raw outcome): their advantages are all zero."""
    rewards: dict[int, set[float]] = collections.defaultdict(set)
    for (e, _), ep in nohint.items():
      if not ep.failed:
        rewards[e].add(ep.reward)
    return {e for e, r in rewards.items() if len(r) == 1}

  def agent_system(self) -> str | None:
    """The agent's system turn (`SelfPlayConfig.agent_system`)."""
    if self.cfg.agent_system == "default":
      return dz.agent_system_prompt(self.cfg.setting)
    return None if self.cfg.agent_system == "none" else self.cfg.agent_system

  def skill_name(self, index: int) -> str:
    return envs.SKILLS[self.cfg.setting][index] if index >= 0 else ""

  # -- checkpointed host state -------------------------------------------------
  def host_state(self) -> dict[str, Any]:
    return {
        "slots": [dataclasses.asdict(s) for s in self.slots],
        "fresh": self.fresh.tolist(),
        "pending": [dataclasses.asdict(p) for p in self.pending],
        "corpus": self.corpus.state() if self.corpus is not None else None,
        "memory": self.memory.to_json(),
        "env_source": self.env_source.state() if self.env_source is not None else None,
        "ahead": self.ahead,
    }

  def restore_host_state(self, host: dict[str, Any]) -> None:
    self.slots = [Slot(**s) for s in host["slots"]]
    self.fresh = np.asarray(host["fresh"], bool)
    self.pending = [DesignSample(**_sample_fields(p)) for p in host["pending"]]
    if self.corpus is not None:
      self.corpus.restore(host["corpus"])
    self.memory = dz.EnvMemory.from_json(host["memory"], self.memory.config)
    self.ahead = host.get("ahead")
    if self.env_source is not None:
      if host.get("env_source") is None:
        raise ValueError(f"The checkpoint holds no state of env source "
                         f"{self.cfg.env_source!r}; it was written by a run with another "
                         "selfplay.env_source. Resume with that config or use a new workdir.")
      self.env_source.restore(host["env_source"])
