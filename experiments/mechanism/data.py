"""Warm-start data: designer prompt -> family program, and noisy agent transcripts.

Both kinds of rows are token-for-token what a self-play run of this experiment builds:

* designer rows: ``chat.prompt(None, designer_prompt(skill, document, exemplars))`` (the
  run's prompt renderer, corpus and token budget), then the reply ```` ```python\\n<program>
  \\n``` ```` and the end-of-turn id; the program (by default the short library program
  that imports the family, ``render``) is a seen family at knob values drawn
  per knob from its difficulty levels (in the experiment mostly the easiest,
  ``DESIGNER_KNOB_LEVELS``), so the warm-started designer writes more than one difficulty
  and regret can move it. Half the prompts show up to ``num_exemplars`` memory exemplars
  (other programs of the skill), as prompts do once the run's memory fills.
* agent rows: episodes of seen families played in the sandbox by a scripted player that
  follows the live episode's ``solution()`` and slips with probability ``p`` (a random
  plausible action, ``Family.perturb``); a hinted play sees the program's own ``hint()``
  (cleaned and leak-checked as the run does, ``hint_source="program"``) after the first
  observation and slips less. Turns are ``chat.prompt(system, observation)``, the action
  ``\\boxed{a}`` plus the end-of-turn id, ``chat.continuation(observation)``.

Only the generated side of a row (the program, the agent's turns) is trained
(``loss_mask``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from collections.abc import Iterator, Sequence

import numpy as np

from spade_jax import designer as dz
from spade_jax import envs
from spade_jax.envs.families import FAMILIES, NUM_LEVELS, Family, by_skill, library
from spade_jax.envs.families.noisy import noisy_action, planned_action
from spade_jax.models.chat import ChatTemplate
from spade_jax.rl import ROLES

DESIGNER, AGENT = ROLES.index("designer"), ROLES.index("agent")


@dataclasses.dataclass
class Example:
  """One training sequence: ids, which ids are trained, and whose turn they are."""

  tokens: list[int]
  mask: list[bool]
  role: int
  meta: dict = dataclasses.field(default_factory=dict)


def corpus(workdir: str, seed: int):
  """The run's grounding corpus (the embedded one), built under ``workdir`` on first use."""
  return dz.Corpus(dz.CorpusConfig(source="embedded", max_words=400), workdir=workdir,
                   seed=seed)


def random_knobs(family: Family, rng: random.Random,
                 levels: Sequence[int] | None = None) -> dict[str, int]:
  """Knob values drawn per knob from the family's level values (retried until playable):
  any of them, or with ``levels`` the value of a level drawn from ``levels`` (repeats
  weight them)."""
  if levels is not None and (not levels or any(not 0 <= lv < NUM_LEVELS for lv in levels)):
    raise ValueError(f"levels={tuple(levels)}: expected difficulty levels in "
                     f"0..{NUM_LEVELS - 1}")
  for _ in range(100):
    values = {k.name: (rng.choice(sorted(set(k.levels))) if levels is None
                       else k.levels[rng.choice(list(levels))]) for k in family.knobs}
    try:
      return family.resolve(**values)
    except ValueError:
      continue
  return family.levels(min(levels)) if levels is not None else family.levels()


BALANCES = ("skill", "family")  # how designer rows share out over the families


def designer_reply(program: str) -> str:
  """The designer's reply text for ``program`` (what the run's extractor reads back)."""
  return f"```python\n{program.rstrip()}\n```"


PROGRAMS = ("library", "full")  # what the designer writes (see `render`)


def render(programs: str, family: Family, knobs: dict[str, int]) -> str:
  """A family's program at ``knobs`` as the designer writes it: ``"library"``, the short
  program that imports the family (``envs.families.library``), or ``"full"``, the whole
  family program (``Family.program``)."""
  if programs not in PROGRAMS:
    raise ValueError(f"programs={programs!r}: expected one of {PROGRAMS}")
  if programs == "library":
    return library.program(family.name, **knobs)
  return family.program(**knobs)


def designer_examples(chat: ChatTemplate, corpus, n: int, seed: int, *,
                      families: Sequence[str], budget: int | None, num_exemplars: int = 1,
                      setting: str = "games", balance: str = "skill",
                      programs: str = "library",
                      levels: Sequence[int] | None = None) -> list[Example]:
  """``n`` designer rows over ``families``: ``balance="skill"`` takes the skills round-robin
  and a family of the skill at random (a skill's families share its rows, as they share
  the run's prompts for it); ``"family"`` takes the families round-robin (each its
  ``n / len(families)`` rows, the prompt asking for the family's skill). ``programs``:
  what the reply (and each exemplar) is, see :func:`render`; ``levels``: the levels its
  knobs are drawn from (:func:`random_knobs`; default any value of the family's levels)."""
  if balance not in BALANCES:
    raise ValueError(f"balance={balance!r}: expected one of {BALANCES}")
  rng = random.Random(f"designer:{seed}")
  skills = by_skill(families)
  order = sorted(skills)
  names = sorted(set(families))
  count = lambda t: len(chat.prompt(None, t))
  out = []
  for i in range(n):
    if balance == "family":
      fam = FAMILIES[names[i % len(names)]]
      skill = fam.skill
    else:
      skill = order[i % len(order)]
      fam = FAMILIES[rng.choice(skills[skill])]
    knobs = random_knobs(fam, rng, levels)
    exemplars = []
    if rng.random() < 0.5:
      for _ in range(rng.randint(1, num_exemplars) if num_exemplars else 0):
        other = FAMILIES[rng.choice(skills[skill])]
        exemplars.append(dz.MemoryRecord(program=render(programs, other,
                                                        random_knobs(other, rng, levels)),
                                         skill=skill, setting=setting,
                                         win_rate_nohint=rng.random(),
                                         regret=rng.random() * 0.5))
    text = dz.designer_prompt(setting, skill, corpus.next(), exemplars=exemplars,
                              budget=budget, count=count)
    prompt = chat.prompt(None, text)
    reply = chat.vocab.encode(designer_reply(render(programs, fam, knobs))) + \
        [chat.vocab.eos_id]
    out.append(Example(prompt + reply, [False] * len(prompt) + [True] * len(reply), DESIGNER,
                       {"family": fam.name, "skill": skill, "knobs": knobs}))
  return out


def agent_examples(pool, chat: ChatTemplate, n: int, seed: int, *, families: Sequence[str],
                   levels: Sequence[int], p: float, p_hinted: float, hinted_frac: float,
                   max_turns: int, batch: int = 32, worked: bool = False,
                   train_slips: bool = False) -> list[Example]:
  """``n`` agent transcripts of the scripted noisy player (see the module docstring).

  Episodes run ``batch`` at a time in the sandbox ``pool``; family and level are drawn per
  episode (``levels``: difficulty levels to draw from, repeats weight them). ``worked``:
  each turn that follows the plan writes the family's worked step before its box
  (``Family.work``, e.g. ``19 + 7 = 26 \\boxed{26}``); the same seed gives the same
  episodes and slips either way. ``train_slips``: a slip turn (an action off the plan) is
  trained like the others; by default it is context only (``loss_mask`` False), so the
  model learns the plan and its recovery from the slip, not the slip: trained bare
  guesses drew greedy decoding to the prompt's example answer (``\\boxed{7}``).
  """
  rng = random.Random(f"agent:{seed}")
  system = dz.agent_system_prompt("games")
  out: list[Example] = []
  while len(out) < n:
    plays = []
    for _ in range(min(batch, n - len(out))):
      fam = FAMILIES[rng.choice(list(families))]
      plays.append((fam, fam.levels(rng.choice(list(levels))), rng.randrange(1 << 30),
                    rng.random() < hinted_frac))
    out += _play(pool, chat, system, plays, rng, p, p_hinted, max_turns, worked,
                 train_slips)
  return out


def _play(pool, chat, system, plays, rng, p, p_hinted, max_turns, worked,
          train_slips) -> list[Example]:
  sources = [fam.program(worked=worked, **knobs) for fam, knobs, _, _ in plays]
  seeds = [s for _, _, s, _ in plays]
  hints: list[str | None] = [None] * len(plays)
  need = [i for i, pl in enumerate(plays) if pl[3]]
  if need:  # the program's hint on an instance of its own, as the run computes it
    hs = envs.start(pool, [sources[i] for i in need], "games", max_turns)
    try:
      resets = pool.reset_many(hs, seeds=[seeds[i] for i in need])
      sols = pool.call_many(hs, "solution")
      raws = pool.call_many(hs, "hint")
    finally:
      pool.release(hs)
    for i, r, s, h in zip(need, resets, sols, raws):
      if r.ok and h.ok:
        acts = s.value if s.ok and isinstance(s.value, list) else None
        hints[i] = dz.finalize_hint(h.value, "program", acts).text
  handles = envs.start(pool, sources, "games", max_turns)
  rows = [Example([], [], AGENT, {"family": fam.name, "knobs": knobs, "hinted": hinted})
          for fam, knobs, _, hinted in plays]
  try:
    live = []
    for i, res in enumerate(pool.reset_many(handles, seeds=seeds)):
      if not res.ok:
        raise RuntimeError(f"{plays[i][0].name}: reset failed: {res.reason}: {res.detail}")
      obs, _ = res.value
      _add(rows[i], chat.prompt(system, dz.hinted_observation(obs, hints[i])), False)
      live.append(i)
    for _ in range(max_turns):
      if not live:
        break
      plans = pool.call_many([handles[i] for i in live], "solution")
      works = (pool.call_many([handles[i] for i in live], "work") if worked
               else [None] * len(live))
      actions = []
      for i, plan, work in zip(live, plans, works):
        fam, knobs, _, _ = plays[i]
        step = work.value if work is not None and work.ok else None
        text = noisy_action(fam, plan.value if plan.ok else None, rng,
                            p_hinted if hints[i] else p, knobs, step)
        if worked and isinstance(step, str) and step:
          rows[i].meta.setdefault("works", []).append(step)
        slipped = text != planned_action(plan.value if plan.ok else None, step)
        rows[i].meta["turns"] = rows[i].meta.get("turns", 0) + 1
        rows[i].meta["slips"] = rows[i].meta.get("slips", 0) + int(slipped)
        _add(rows[i], chat.vocab.encode(text) + [chat.vocab.eos_id],
             train_slips or not slipped)
        actions.append(text)
      still = []
      for i, res in zip(live, pool.step_many([handles[i] for i in live], actions)):
        if not res.ok:
          raise RuntimeError(f"{plays[i][0].name}: step failed: {res.reason}: {res.detail}")
        obs, reward, term, trunc, _ = res.value
        if term or trunc:
          rows[i].meta["solved"] = bool(term and reward >= 1.0)
          continue
        _add(rows[i], chat.continuation(obs), False)
        still.append(i)
      live = still
  finally:
    pool.release(handles)
  return rows


def save(examples: Sequence[Example], path: str) -> str:
  """Writes ``examples`` as JSON lines, atomically (a temporary file renamed into place)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    for e in examples:
      f.write(json.dumps({"tokens": e.tokens, "mask": [int(m) for m in e.mask],
                          "role": e.role, "meta": e.meta}) + "\n")
  os.replace(tmp, path)
  return path


def load(path: str) -> list[Example]:
  """The examples :func:`save` wrote."""
  with open(path) as f:
    rows = [json.loads(line) for line in f]
  return [Example(r["tokens"], [bool(m) for m in r["mask"]], r["role"], r["meta"])
          for r in rows]


def _add(ex: Example, ids: Sequence[int], mask: bool) -> None:
  ex.tokens.extend(ids)
  ex.mask.extend([mask] * len(ids))


def pack(examples: Sequence[Example], batch_size: int, seq_len: int,
         seed: int) -> Iterator[dict[str, np.ndarray]]:
  """Shuffled examples packed first-fit into [batch_size, seq_len] SFT batches, forever.

  Rows longer than ``seq_len`` raise (the caller sizes ``seq_len`` to the data).
  """
  too_long = [len(e.tokens) for e in examples if len(e.tokens) > seq_len]
  if too_long:
    raise ValueError(f"{len(too_long)} warm-start rows exceed seq_len={seq_len} (longest "
                     f"{max(too_long)} tokens); raise --seq_len or lower the prompt budget.")
  rng = np.random.default_rng(seed)
  rows: list[list[Example]] = []
  fill: list[int] = []
  while True:  # epochs; an epoch's partial batch carries over into the next
    for j in rng.permutation(len(examples)):
      ex = examples[j]
      k = next((r for r, f in enumerate(fill) if f + len(ex.tokens) <= seq_len), None)
      if k is None and len(rows) == batch_size:  # the batch is full: emit it
        yield _arrays(rows, batch_size, seq_len)
        rows, fill = [], []
      if k is None:
        rows.append([])
        fill.append(0)
        k = len(rows) - 1
      rows[k].append(ex)
      fill[k] += len(ex.tokens)


def _arrays(rows: Sequence[Sequence[Example]], B: int, T: int) -> dict[str, np.ndarray]:
  out = {"tokens": np.zeros((B, T), np.int32), "positions": np.zeros((B, T), np.int32),
         "segment_ids": np.zeros((B, T), np.int32), "loss_mask": np.zeros((B, T), bool),
         "role": np.zeros((B, T), np.int32)}
  for r, row in enumerate(rows):
    at = 0
    for s, ex in enumerate(row, start=1):
      n = len(ex.tokens)
      out["tokens"][r, at:at + n] = ex.tokens
      out["positions"][r, at:at + n] = np.arange(n)
      out["segment_ids"][r, at:at + n] = s
      out["loss_mask"][r, at:at + n] = ex.mask
      out["role"][r, at:at + n] = ex.role
      at += n
  return out
