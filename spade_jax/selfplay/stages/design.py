"""The design stage: at a regeneration every slot gets a new program.

`Design` (SPADE, docs/METHOD.md §1): the policy writes one program per slot for one of the
regeneration's skills; a program that fails validation (or the LLM judge, docs/METHOD.md §5)
is resampled up to `designer_resamples` times; every sample joins the pending designer
samples, to be credited later; a slot left without a valid program plays a built-in one
(`fill_from_pool`). The run's contamination `Auditor` scores each drawn document and
each designed program: under `audit.mode="drop"` a flagged document is skipped for the
corpus's next one, and a flagged program is rejected with reason "contaminated" (resampled
like any invalid sample, never added to the memory); the notes go on the samples
(`DesignSample.audit`) and into the metrics. With `design_ahead` the first sample of
each slot may have been drawn during the previous iteration's plays (`HostState.ahead`);
it is taken when its prompt is still the one the slot would be shown now.

`Draw` (the baselines): every slot gets the env source's next program.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable

import numpy as np

from spade_jax import designer as dz
from spade_jax import envs
from spade_jax.eval.answers import last_boxed
from spade_jax.sampling import Generation, Sampler
from spade_jax.selfplay.audit import Auditor, Note
from spade_jax.selfplay.config import SelfPlayConfig
from spade_jax.selfplay.roles import Roles
from spade_jax.selfplay.state import DesignSample, HostState, Slot

Policy = Callable[[int, str], Any]  # (iteration, role) -> a sampler


def regen_skills(skills: tuple[str, ...], per_regen: int, regen: int,
                 num_envs: int) -> list[str]:
  """Each slot's skill at regeneration number `regen` (docs/METHOD.md §1.1).

  `per_regen` skills (0: all) are chosen round-robin, so successive regenerations cover
  every skill, and the slots are dealt among them in turn: 24 envs and 3 of 6 skills give
  8 envs per skill, so every skill's cohort has several members to be centred on.
  """
  k = min(per_regen or len(skills), len(skills))
  chosen = [skills[(regen * k + j) % len(skills)] for j in range(k)]
  return [chosen[e % k] for e in range(num_envs)]


def lone_skill_warning(cfg: SelfPlayConfig, center_by_skill: bool) -> str | None:
  """A warning when a regeneration deals some skill a single slot while the designer
  trains on rewards centred by skill (`rewards.center_by_skill`): that slot's samples are
  centred on themselves, so a valid design's advantage is exactly 0 whatever its regret,
  and only a failed resample next to it trains the designer. None when every skill of a
  regeneration gets two slots or more, or nothing centres designer rewards by skill."""
  if cfg.env_source != "designer" or not cfg.train_designer or not center_by_skill:
    return None
  skills = cfg.skills or envs.SKILLS[cfg.setting]
  dealt = collections.Counter(regen_skills(skills, cfg.skills_per_regen, 0, cfg.num_envs))
  lone = sorted(s for s, n in dealt.items() if n < 2)
  if not lone:
    return None
  return (f"selfplay.num_envs={cfg.num_envs} dealt over {len(dealt)} skills a regeneration "
          f"leaves {len(lone)} skill(s) a single env slot ({', '.join(lone)}): designer "
          f"rewards are centred by skill, so those designs get an advantage of 0 and only "
          f"failed resamples train the designer. Set selfplay.skills_per_regen to at most "
          f"{max(1, cfg.num_envs // 2)} (the reference deals 8 envs a skill), or "
          f"rewards.center_by_skill=False.")


def judge(cfg: SelfPlayConfig, roles: Roles, policy: Policy, it: int, attempt: int,
          verdicts: list) -> tuple[list, int]:
  """docs/METHOD.md §5's LLM validator: the policy judges each valid program (hint sampling);
  a `\\boxed{no}` (or no verdict) rejects it with reason "judge".

  Returns:
    (the verdicts with the judge's rejections, how many programs were judged).
  """
  live = [i for i, v in enumerate(verdicts) if v.valid]
  if not live:
    return verdicts, 0
  prompts = [roles.chat.prompt(None, dz.judge_prompt(verdicts[i].source, cfg.setting))
             for i in live]
  gen = policy(it, "hint")(prompts, cfg.judge_tokens)
  out = list(verdicts)
  for i, toks in zip(live, gen.tokens):
    said = last_boxed(roles.vocab.decode(toks))
    if said is None or said.strip().lower() != "yes":
      out[i] = dataclasses.replace(out[i], valid=False, reason="judge",
                                   detail=f"the judge answered {said!r} (attempt {attempt})")
  return out, len(live)


class Design:
  """The designer's stage (see the module docstring)."""

  def __init__(self, cfg: SelfPlayConfig, roles: Roles, *, skills: tuple[str, ...], corpus,
               pool, validation: envs.ValidationConfig, pool_programs: list[str],
               auditor: Auditor):
    self.cfg, self.roles, self.skills = cfg, roles, skills
    self.setting = envs.SETTINGS[cfg.setting]
    self.corpus, self.pool, self.validation = corpus, pool, validation
    self.pool_programs = pool_programs
    self.auditor = auditor

  def draw_document(self) -> tuple[Any, list[Note]]:
    """The corpus's next document and the audit notes of every document drawn for it
    (under `drop` a flagged one is skipped for the next)."""
    notes = []
    for _ in range(len(self.corpus)):
      doc = self.corpus.next()
      if not self.auditor.on:
        return doc, notes
      notes.append(self.auditor.document(doc.text))
      if not notes[-1].drop:
        return doc, notes
    raise ValueError(f"Every one of the corpus's {len(self.corpus)} documents holds a "
                     "held-out item (audit.mode='drop'); use another corpus, "
                     "audit.mode='flag' or selfplay.no_corpus=True.")

  def prompts(self, it: int, memory: dz.EnvMemory,
              docs: list | None = None) -> tuple[list, list, list, list[list[Note]]]:
    """(skills, documents, prompt ids, document audit notes) of each slot at regeneration
    iteration `it`.

    Documents are drawn from the corpus unless given (a design drawn ahead keeps its own,
    checked when it was drawn: its notes are empty).
    """
    cfg, seed = self.cfg, self.roles.play_seed
    skills = regen_skills(self.skills, cfg.skills_per_regen, it // cfg.regen_every,
                          cfg.num_envs)
    prompts, drawn, notes = [], [], []
    budget = cfg.designer_prompt_tokens or None
    for e, skill in enumerate(skills):
      doc_notes = []
      if docs is not None:
        doc = docs[e]
      elif cfg.no_corpus:
        doc = None
      else:
        doc, doc_notes = self.draw_document()
      drawn.append(doc)
      notes.append(doc_notes)
      tool_kw = {}
      if self.setting.tool_harness:  # docs/METHOD.md §5: a domain and a task type per slot
        pick = seed(it, e, 3)
        tool_kw = dict(domain=envs.TOOL_DOMAINS[pick % len(envs.TOOL_DOMAINS)],
                       task_type=list(envs.TOOL_TASK_TYPES)[(pick >> 8)
                                                            % len(envs.TOOL_TASK_TYPES)])
      text = dz.designer_prompt(
          cfg.setting, skill, doc, **tool_kw,
          exemplars=memory.exemplars(skill, setting=cfg.setting, seed=seed(it, e, 1)),
          negative=memory.negative(skill, setting=cfg.setting, seed=seed(it, e, 2)),
          no_corpus=cfg.no_corpus, budget=budget, count=self.roles.count_tokens)
      prompts.append(self.roles.chat.prompt(None, text))
    return skills, drawn, prompts, notes

  def ahead_due(self, it: int) -> bool:
    """Whether iteration `it`'s plays also draw the next regeneration's designs."""
    return self.cfg.design_ahead and (it + 1) % self.cfg.regen_every == 0

  def __call__(self, host: HostState, it: int, *, policy: Policy, version: int,
               memory: dz.EnvMemory) -> tuple[HostState, dict[str, float]]:
    """Regenerates every slot, resampling invalid programs; samples join `pending`.

    Args:
      host: the iteration state before the regeneration.
      it: the iteration (a regeneration step).
      policy: (iteration, role) -> sampler.
      version: the policy version (train step) sampling now.
      memory: the environment memory (invalid programs are added to it).

    Returns:
      (the new host state, the stage's metrics and times).
    """
    cfg, E, auditor = self.cfg, self.cfg.num_envs, self.auditor
    t0, audit_t0 = time.perf_counter(), auditor.seconds
    ahead = host.ahead if host.ahead is not None and host.ahead.iteration == it else None
    if ahead is not None:  # the same documents; the prompts as the memory stands now
      skills, docs, prompts, doc_notes = self.prompts(
          it, memory, [dz.Document(**d) if d else None for d in ahead.docs])
    else:
      skills, docs, prompts, doc_notes = self.prompts(it, memory)
    notes: list[Note] = [n for ns in doc_notes for n in ns]  # this iteration's checks
    if auditor.on and ahead is not None:  # counted when drawn; each sample still says it
      doc_notes = [[auditor.document(d.text)] if d else [] for d in docs]
    designer = policy(it, "designer")
    metrics: dict[str, float] = {}
    first: dict[int, tuple[list[int], list[float], bool]] = {}
    if ahead is not None:
      if isinstance(designer, Sampler):
        designer.calls = 1  # call 0 of this (iteration, role) drew the designs ahead
      first = {e: (ahead.tokens[e], ahead.logps[e], ahead.finished[e])
               for e in range(E) if prompts[e] == ahead.prompts[e]}
      metrics["designer/ahead_used"] = len(first)
      metrics["designer/ahead_stale"] = E - len(first)
    slots, pending = list(host.slots), list(host.pending)
    need, attempts, valid, judged = list(range(E)), 0, 0, 0
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
      verdicts = envs.validate_many([self.roles.vocab.decode(t) for t in gen.tokens],
                                    self.pool, self.validation)
      validate_s += time.perf_counter() - t1
      verdicts, program_notes = self._audit_programs(verdicts)
      notes += [n for n in program_notes if n is not None]
      if cfg.llm_validator:
        verdicts, n = judge(cfg, self.roles, policy, it, attempt, verdicts)
        judged += n
      finished += gen.finished
      tokens += sum(len(t) for t in gen.tokens)
      attempts += len(need)
      retry = []
      for e, toks, lps, v, note in zip(need, gen.tokens, gen.logprobs, verdicts,
                                       program_notes):
        p = prompts[e]
        doc_id = docs[e].id if docs[e] else ""
        sample = DesignSample(e, envs.skill_index(cfg.setting, skills[e]), doc_id, p + toks,
                              [0.0] * len(p) + lps, len(p), v.source, v.reason, it, attempt,
                              ahead.version if attempt == 0 and e in first else version)
        if auditor.on:
          sample = Auditor.annotate(sample, doc_notes[e] + ([note] if note else []))
        pending.append(sample)
        if v.valid:
          valid += 1
          slots[e] = Slot(v.source, "designer", sample.skill, doc_id, written=it)
          continue
        reasons[v.reason] += 1
        retry.append(e)
        if v.source and not (note and note.drop):
          memory.add(dz.MemoryRecord(program=v.source, doc_id=doc_id, skill=skills[e],
                                     reason=v.reason, iteration=it, setting=cfg.setting))
      need = retry
    for e in need:
      slots[e] = Slot.from_pool(self.pool_programs, e, it) if cfg.fill_from_pool else Slot()
    if cfg.llm_validator and judged:
      metrics["designer/judged"] = judged
    audit_s = auditor.seconds - audit_t0
    metrics["time/design"] = time.perf_counter() - t0 - validate_s - audit_s
    metrics["time/validate"] = validate_s
    metrics["designer/samples"] = attempts
    metrics["designer/valid"] = valid
    metrics["designer/valid_rate"] = valid / max(attempts, 1)
    metrics["designer/resampled"] = attempts - E
    metrics["designer/slots_filled"] = valid
    for r in envs.REASONS:
      metrics[f"designer/rejected/{r}"] = reasons.get(r, 0)
    metrics["sampling/designer/tokens"] = tokens
    metrics["sampling/designer/finished_rate"] = float(np.mean(finished)) if finished else 0.0
    if auditor.on:
      metrics.update(auditor.metrics(notes))
      metrics["time/audit"] = audit_s
    new = host.replace(slots=slots, fresh=[True] * E, pending=pending, ahead=None)
    return new, metrics

  def _audit_programs(self, verdicts: list) -> tuple[list, list[Note | None]]:
    """Each program's audit note (None: no source, or the audit is off), and the verdicts
    with a program to drop rejected as "contaminated"."""
    if not self.auditor.on:
      return verdicts, [None] * len(verdicts)
    out, notes = [], []
    for v in verdicts:
      note = self.auditor.program(v.source) if v.source else None
      if note is not None and note.drop and v.valid:
        v = dataclasses.replace(v, valid=False, reason="contaminated", detail=note.reason)
      out.append(v)
      notes.append(note)
    return out, notes


class Draw:
  """A baseline's design stage: every slot gets the env source's next program."""

  def __init__(self, cfg: SelfPlayConfig, source, pool):
    self.cfg, self.source, self.pool = cfg, source, pool

  def __call__(self, host: HostState, it: int) -> tuple[HostState, dict[str, float]]:
    t0 = time.perf_counter()
    drawn = self.source.draw(it, self.cfg.num_envs, self.pool)
    slots = list(host.slots)
    for e, d in enumerate(drawn):
      slots[e] = Slot(d.source, d.origin, -1, d.doc_id, written=it)
    new = host.replace(slots=slots, fresh=[True] * self.cfg.num_envs)
    return new, {"time/draw": time.perf_counter() - t0}
