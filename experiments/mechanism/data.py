"""Warm-start data: designer prompt -> family program, and noisy agent transcripts.

Both kinds of rows are token-for-token what a self-play run of this experiment builds:

* designer rows: ``chat.prompt(None, designer_prompt(skill, document, exemplars))`` (the
  run's prompt renderer, corpus and token budget), then the reply ```` ```python\\n<program>
  \\n``` ```` and the end-of-turn id; the program is a seen family at knob values drawn
  per knob from the family's difficulty levels, so the warm-started designer writes every
  difficulty and regret can move it. Half the prompts show up to ``num_exemplars`` memory exemplars
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
import random
import re
from collections.abc import Iterator, Sequence

import numpy as np

from spade_jax import designer as dz
from spade_jax import envs
from spade_jax.envs.families import FAMILIES, Family, by_skill
from spade_jax.envs.families.noisy import noisy_action
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


def random_knobs(family: Family, rng: random.Random) -> dict[str, int]:
  """Knob values drawn per knob from the family's level values (retried until playable)."""
  for _ in range(100):
    values = {k.name: rng.choice(sorted(set(k.levels))) for k in family.knobs}
    try:
      return family.resolve(**values)
    except ValueError:
      continue
  return family.levels()


BALANCES = ("skill", "family")  # how designer rows share out over the families


def designer_reply(program: str) -> str:
  """The designer's reply text for ``program`` (what the run's extractor reads back)."""
  return f"```python\n{program.rstrip()}\n```"


def designer_examples(chat: ChatTemplate, corpus, n: int, seed: int, *,
                      families: Sequence[str], budget: int | None, num_exemplars: int = 1,
                      setting: str = "games", balance: str = "skill") -> list[Example]:
  """``n`` designer rows over ``families``: ``balance="skill"`` takes the skills round-robin
  and a family of the skill at random (a skill's families share its rows, as they share
  the run's prompts for it); ``"family"`` takes the families round-robin (each its
  ``n / len(families)`` rows, the prompt asking for the family's skill)."""
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
    knobs = random_knobs(fam, rng)
    exemplars = []
    if rng.random() < 0.5:
      for _ in range(rng.randint(1, num_exemplars) if num_exemplars else 0):
        other = FAMILIES[rng.choice(skills[skill])]
        exemplars.append(dz.MemoryRecord(program=other.program(**random_knobs(other, rng)),
                                         skill=skill, setting=setting,
                                         win_rate_nohint=rng.random(),
                                         regret=rng.random() * 0.5))
    text = dz.designer_prompt(setting, skill, corpus.next(), exemplars=exemplars,
                              budget=budget, count=count)
    prompt = chat.prompt(None, text)
    reply = chat.vocab.encode(designer_reply(fam.program(**knobs))) + [chat.vocab.eos_id]
    out.append(Example(prompt + reply, [False] * len(prompt) + [True] * len(reply), DESIGNER,
                       {"family": fam.name, "skill": skill, "knobs": knobs}))
  return out


def agent_examples(pool, chat: ChatTemplate, n: int, seed: int, *, families: Sequence[str],
                   levels: Sequence[int], p: float, p_hinted: float, hinted_frac: float,
                   max_turns: int, batch: int = 32, worked: bool = False) -> list[Example]:
  """``n`` agent transcripts of the scripted noisy player (see the module docstring).

  Episodes run ``batch`` at a time in the sandbox ``pool``; family and level are drawn per
  episode (``levels``: difficulty levels to draw from, repeats weight them). ``worked``:
  each turn that follows the plan writes the family's worked step before its box
  (``Family.work``, e.g. ``19 + 7 = 26 \\boxed{26}``); the same seed gives the same
  episodes and slips either way.
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
    out += _play(pool, chat, system, plays, rng, p, p_hinted, max_turns, worked)
  return out


def _play(pool, chat, system, plays, rng, p, p_hinted, max_turns, worked) -> list[Example]:
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
        _add(rows[i], chat.vocab.encode(text) + [chat.vocab.eos_id], True)
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


def copy_examples(vocab, n: int, seed: int, *, min_len: int = 8,
                  max_len: int = 60) -> list[Example]:
  """``n`` copy rows: a random text, then the same text again, only the repeat trained.

  Half the texts are lists of random numbers (0-999), half random lower-case words; each
  has ``min_len``-``max_len`` items. Predicting the repeat needs in-context copying (an
  "induction" circuit), which the agent's turns need too (an operand from the
  observation, a result from the worked step) but whose signal in transcripts is sparse.
  """
  rng = random.Random(f"copy:{seed}")
  letters = "abcdefghijklmnopqrstuvwxyz"
  out = []
  for i in range(n):
    k = rng.randint(min_len, max_len)
    if i % 2 == 0:
      text = " ".join(str(rng.randrange(1000)) for _ in range(k))
    else:
      text = " ".join("".join(rng.choice(letters) for _ in range(rng.randint(1, 6)))
                      for _ in range(k))
    first = vocab.encode(text + "\n")
    again = vocab.encode(text) + [vocab.eos_id]
    out.append(Example(first + again, [False] * len(first) + [True] * len(again), AGENT,
                       {"family": "copy"}))
  return out


def arithmetic_examples(vocab, n: int, seed: int, *, lines: int = 32) -> list[Example]:
  """``n`` drill rows of ``lines`` worked equations each, ``a + b = c``, ``a - b = c`` or
  ``a * b = c``, in the text of ``arithmetic_chain``'s worked step; only each result (and its
  newline) is trained.

  The left operands are the running values of random chains drawn as the family draws them
  (start 2-20; at a random difficulty level, adds and subtracts up to ``MAX_OPERAND`` and,
  where the level allows, multiplies by 2 or 3), so the drill covers the values an episode
  meets, negative ones included. The arithmetic a transcript holds is a few result tokens per
  turn; the drill gives the same sums densely, as pretraining gives a language model its
  arithmetic.
  """
  knobs = {k.name: k.levels for k in FAMILIES["arithmetic_chain"].knobs}
  rng = random.Random(f"arithmetic:{seed}")
  out = []
  for _ in range(n):
    ex = Example([], [], AGENT, {"family": "arithmetic"})
    value, left = 0, 0
    for _ in range(lines):
      if left == 0:  # a new chain at a random level
        level = rng.randrange(len(knobs["NUM_OPS"]))
        value, left = rng.randint(2, 20), knobs["NUM_OPS"][level]
        kinds = ["+", "-"] + (["*"] if knobs["MULTIPLY"][level] else [])
        top = knobs["MAX_OPERAND"][level]
      sign = rng.choice(kinds)
      operand = rng.randint(2, 3) if sign == "*" else rng.randint(2, top)
      result = {"+": value + operand, "-": value - operand, "*": value * operand}[sign]
      _add(ex, vocab.encode(f"{value} {sign} {operand} ="), False)
      _add(ex, vocab.encode(f" {result}\n"), True)
      value, left = result, left - 1
    _add(ex, [vocab.eos_id], True)
    out.append(ex)
  return out


# One binary equation of a worked step, "a op b = c", standing alone in its step: at the
# start or after ", " or ": " (so "a - 2 * b = k" gives none, "2 * a = c" one).
_EQUATION = re.compile(r"(?:^|, |: )(-?\d+) ([-+*/]) (-?\d+) = (-?\d+)(?=,|$)")


def _calc(a: int, op: str, b: int) -> int | None:
  """``a op b`` as the families' worked steps compute it ("/" is floor division)."""
  if op == "/":
    return a // b if b else None
  return {"+": a + b, "-": a - b, "*": a * b}[op]


def equations(rows: Sequence[Example]) -> dict[tuple[str, str], tuple[list[int], list[int]]]:
  """{(family, op): (left operands, right operands)} of every binary equation, with a right
  result, in the worked steps of ``rows`` (agent rows built with ``worked=True``)."""
  out: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
  for r in rows:
    for w in r.meta.get("works", ()):
      for a, op, b, c in _EQUATION.findall(w):
        if _calc(int(a), op, int(b)) == int(c):
          left, right = out.setdefault((r.meta["family"], op), ([], []))
          left.append(int(a))
          right.append(int(b))
  return out


def equation_examples(vocab, rows: Sequence[Example], n: int, seed: int, *,
                      lines: int = 32) -> list[Example]:
  """``n`` drill rows of ``lines`` fresh equations each, drawn from the worked steps of the
  agent ``rows`` (scripted transcripts built with ``worked=True``; ``meta["works"]``).

  The generalisation of :func:`arithmetic_examples` to every worked family: a family and
  operator are drawn as often as the steps use them, the operands independently from the
  left and right operands that family's steps hold for that operator, so the lines cover
  each family's ranges (and combinations its transcripts never hold); ``a / b`` is floor
  division, as in ``guess_number``'s halving. Only each result (and its newline) is
  trained. Worked steps with no binary equation (``grid_path``'s positions,
  ``base_convert``'s ``r = d * p + s``) add nothing.
  """
  ops = equations(rows)
  if not ops:
    raise ValueError("no worked step holds an equation like '19 + 7 = 26'; build the agent "
                     "rows with --worked, over families that have worked steps")
  keys = sorted(ops)
  weights = [len(ops[k][0]) for k in keys]
  rng = random.Random(f"equations:{seed}")
  out = []
  for _ in range(n):
    ex = Example([], [], AGENT, {"family": "equations"})
    for _ in range(lines):
      key = rng.choices(keys, weights)[0]
      left, right = ops[key]
      a, b = rng.choice(left), rng.choice(right)
      c = _calc(a, key[1], b)
      while c is None:  # a zero divisor
        b = rng.choice(right)
        c = _calc(a, key[1], b)
      _add(ex, vocab.encode(f"{a} {key[1]} {b} ="), False)
      _add(ex, vocab.encode(f" {c}\n"), True)
    _add(ex, [vocab.eos_id], True)
    out.append(ex)
  return out


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
