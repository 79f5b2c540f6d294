"""Prompts for the two roles: the environment designer and the reasoning agent.

The designer prompt renders the env contract of :mod:`spade_jax.envs.contract`
(settings, skills, allowed imports, size cap). ``python -m launch.prompts``
prints a rendered designer prompt for every skill of every setting.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from spade_jax.designer.corpus import Document
from spade_jax.designer.memory import MemoryRecord, render_program
from spade_jax.envs.contract import (ALLOWED_IMPORTS, MAX_SOURCE_BYTES, SETTINGS, SKILLS,
                                     check_skill)

CONTRACT = textwrap.dedent(f"""\
    Program contract (programs that break it are rejected):
    - Define exactly one class whose name ends in `Env`. Helper functions and constants at
      module level are allowed.
    - `__init__(self, max_turns: int = 25, **kwargs)`; store `max_turns` and end the
      episode with truncated=True once that many steps have been taken.
    - `reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]`
      returns (first observation, info dict). It starts a new episode and fully resets the
      hidden state.
    - `step(self, action: str) -> tuple[str, float, bool, bool, dict]` returns
      (observation, reward, terminated, truncated, info).
    - Rewards are finite floats in [-1, 1]. The terminal reward 1.0 means the episode was
      solved; a failed or unfinished episode never earns 1.0.
    - Optional `solution(self) -> list[str]`: a list of actions that solves the episode
      started by the last `reset` when replayed from there. Provide it whenever you can:
      it proves the task is feasible.
    - Optional `hint(self) -> str`: privileged guidance for the current episode that
      makes it easier without listing the solution's actions.
    - All randomness comes from `random.Random(seed)` created in `reset`; the same seed and
      the same actions must give the same observations and rewards. Never use time,
      global random state, files, network or environment variables.
    - Imports are limited to these pure standard-library modules: {", ".join(ALLOWED_IMPORTS)}.
    - Observations are plain text, at most a few thousand characters. The source stays
      under {MAX_SOURCE_BYTES // 1024} KiB.
    - Random or do-nothing play must not solve the task; a careful player must be able to.
    """).rstrip()

OUTPUT_FORMAT = ("Reply with the complete program in one ```python fenced code block. "
                 "Do not write anything after the closing fence.")


def _doc_section(document: Document, budget: int) -> str:
  """The document block in at most ``budget`` characters ("" if nothing useful fits)."""
  head = (f"Source document (id: {document.id}). Draw the theme, entities, rules or "
          "numbers of your environment from it; the environment must be playable without "
          "reading the document.\n<document>\n")
  tail = "\n</document>"
  room = budget - len(head) - len(tail)
  text = document.text.strip()
  if len(text) > room:
    room -= len(" [...]")
    cut = text[:room + 1].rsplit(None, 1)[0] if room > 0 else ""
    if len(cut) > room:
      cut = ""
    if len(cut) < 200:  # Too little of the document to ground anything on.
      return ""
    text = cut + " [...]"
  return head + text + tail


_EXEMPLAR_INTRO = (
    "Environments from earlier rounds that sat at the edge of the agent's ability (hard "
    "without help, learnable with a hint). Use them for the level of difficulty and for "
    "the contract, not as templates to copy:")


def _code_block(header: str, program: str, budget: int) -> str:
  code = render_program(program, budget - len(header) - len("```python\n\n```"))
  return "" if code is None else f"{header}```python\n{code}\n```"


def _exemplar_section(exemplars: Sequence[MemoryRecord], budget: int) -> str:
  """Exemplar programs (elided to fit, or skipped) in at most ``budget`` characters."""
  blocks = []
  used = len(_EXEMPLAR_INTRO)
  for i, rec in enumerate(exemplars):
    header = (f"Example {len(blocks) + 1} (skill: {rec.skill}; the agent solved "
              f"{rec.win_rate_nohint:.0%} of plays without a hint and "
              f"{rec.win_rate_hint:.0%} with one):\n")
    per = (budget - used) // max(1, len(exemplars) - i) - 2
    block = _code_block(header, rec.program, per)
    if block:
      blocks.append(block)
      used += len(block) + 2
  if not blocks:
    return ""
  return "\n\n".join([_EXEMPLAR_INTRO, *blocks])


def _negative_section(negative: MemoryRecord, budget: int) -> str:
  """The negative example (code if it fits, else just its reason), or ""."""
  reason = negative.reason or "rejected"
  header = f"An earlier environment that did NOT work. Reason: {reason}. Avoid this failure.\n"
  block = _code_block(header, negative.program, budget)
  if block:
    return block
  short = f"An earlier environment was rejected. Reason: {reason}. Avoid this failure."
  return short if len(short) <= budget else ""


def designer_prompt(setting: str, skill: str, document: Document | None = None,
                    exemplars: Sequence[MemoryRecord] = (), negative: MemoryRecord | None = None,
                    max_chars: int = 24_000, no_corpus: bool = False) -> str:
  """The designer's instruction for one environment.

  Fixed parts (task, skill, interaction rules, contract, output format) are always
  included; the document, exemplars and negative example share what remains of
  ``max_chars`` (the document takes at most half when examples follow, exemplars at most
  three quarters of the rest when a negative follows). Exemplar code is never cut
  mid-class: longer programs have method bodies elided or are skipped.

  Args:
    setting: ``"games"`` or ``"tool_use"``.
    skill: one of ``SKILLS[setting]``.
    document: grounding document, or None for an ungrounded prompt.
    exemplars: memory records shown as positive examples.
    negative: a memory record shown as what to avoid, with its reason.
    max_chars: character budget for the whole prompt (exceeded only if the fixed parts
      alone are longer).
    no_corpus: ablation switch; drops the document even if one is given.

  Returns:
    The prompt text (one user message).
  """
  s = SETTINGS[setting]
  check_skill(setting, skill)
  kind = "game or puzzle" if s.name == "games" else "tool-use task"
  head = (f"You design training environments for a reasoning agent. Write one interactive "
          f"{kind} as a Python program. The agent plays it over several turns: it reads "
          "each observation and replies with an action.\n\n"
          f"Target skill: {skill}: {s.skills[skill]}\n\n"
          "Aim for a task the agent solves only sometimes: hard enough that it fails "
          "without help, but learnable, so that a good hint clearly raises its success "
          "rate. Vary structure and difficulty through `reset(seed)`.")
  tail = [f"How the agent interacts: {s.interaction}", CONTRACT, OUTPUT_FORMAT]
  budget = max_chars - len("\n\n".join([head, *tail]))
  middle = []

  def add(section: str) -> None:
    nonlocal budget
    if section:
      middle.append(section)
      budget -= len(section) + 2

  if document is not None and not no_corpus:
    add(_doc_section(document, (budget // 2 if (exemplars or negative) else budget) - 2))
  if exemplars:
    add(_exemplar_section(exemplars, (budget * 3 // 4 if negative else budget) - 2))
  if negative is not None:
    add(_negative_section(negative, budget - 2))
  return "\n\n".join([head, *middle, *tail])


def agent_system_prompt(setting: str, hint: str | None = None) -> str:
  """System prompt for the reasoning agent.

  Args:
    setting: ``"games"`` or ``"tool_use"``.
    hint: privileged hint for the hinted arm, or None for the unhinted arm.

  Returns:
    The system message text.
  """
  s = SETTINGS[setting]
  what = "an interactive puzzle or game" if s.name == "games" else "a task that needs tools"
  text = (f"You are solving {what} over several turns. The environment describes the "
          f"task and responds to each of your actions. {s.agent_rules} Think carefully "
          "before acting: wasted or invalid actions use up turns.")
  if hint:
    text += f"\n\nHint for this task:\n{hint.strip()}"
  return text


def hint_prompt(program: str, setting: str, max_chars: int = 24_000) -> str:
  """Asks the policy to read an environment's source and write a hint for its player.

  Args:
    program: the environment source.
    setting: ``"games"`` or ``"tool_use"``.
    max_chars: budget for the whole prompt; the program has method bodies elided to fit.

  Returns:
    The prompt text; the answer is expected inside ``<hint>...</hint>``.
  """
  s = SETTINGS[setting]
  head = ("Below is the source code of an environment that a player will face without "
          "seeing the code. Write a hint that would help a capable player succeed: the "
          "winning strategy, the hidden rule, or the mistake to avoid. The hint must hold "
          "for every seed, so describe the method, not the moves of one episode. Do not "
          "list the solution's actions or reveal a specific answer.\n\n"
          f"How the player interacts: {s.agent_rules}")
  tail = ("Reply with the hint only, at most 120 words, inside <hint>...</hint>.")
  code = render_program(program, max_chars - len(head) - len(tail) - 40) or ""
  return f"{head}\n\n```python\n{code}\n```\n\n{tail}"


def _demo_records(setting: str):
  doc = Document("pydoc_topics/augassign",
                 "Augmented assignment statements. Augmented assignment is the combination, "
                 "in a single statement, of a binary operation and an assignment statement: "
                 "x += 1 evaluates the target once, applies the operation, and assigns the "
                 "result back to the original target.")
  if setting == "games":
    good = MemoryRecord(program=_DEMO_PROGRAM, doc_id="stdlib/heapq", skill="optimization",
                        win_rate_nohint=0.375, win_rate_hint=0.75, regret=0.375,
                        designer_reward=0.93, iteration=12, setting=setting)
  else:
    good = MemoryRecord(program=_DEMO_TOOL_PROGRAM, doc_id="stdlib/sqlite3",
                        skill="data retrieval", win_rate_nohint=0.25, win_rate_hint=0.625,
                        regret=0.375, designer_reward=0.88, iteration=16, setting=setting)
  bad = MemoryRecord(program="class EchoEnv:\n  def reset(self, seed=None, options=None):\n"
                     "    return 'say 1', {}\n  def step(self, action):\n"
                     "    return '', 1.0, True, False, {}\n",
                     doc_id="stdlib/string", skill=SKILLS[setting][3],
                     reason="trivial: random play solves 100% of episodes", iteration=9,
                     setting=setting)
  return doc, [good], bad


_DEMO_TOOL_PROGRAM = '''\
import json
import random

TOOLS = [
    {"name": "search_books", "description": "Books whose title contains a word.",
     "parameters": {"word": "string"}},
    {"name": "get_loans", "description": "Loan history of a book id.",
     "parameters": {"book_id": "integer"}},
    {"name": "final_answer", "description": "Submit the answer; ends the task.",
     "parameters": {"answer": "string"}},
]


class LibraryLoansEnv:
  """Find which member borrowed a book most often."""

  def __init__(self, max_turns: int = 25, **kwargs):
    self.max_turns = max_turns

  def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
    rng = random.Random(seed)
    words = ["river", "stone", "night", "glass"]
    self.books = {i: f"The {rng.choice(words)} of {rng.choice(words)}" for i in range(1, 9)}
    self.loans = {i: [rng.choice("ABCDE") for _ in range(rng.randint(2, 6))] for i in self.books}
    self.target = rng.choice(sorted(self.books))
    counts = {m: self.loans[self.target].count(m) for m in "ABCDE"}
    self.answer = max(sorted(counts), key=counts.get)
    self.turns = 0
    return (f"Who borrowed book #{self.target} most often (ties: first letter)? "
            f"Tools: {json.dumps(TOOLS)}"), {}

  def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
    self.turns += 1
    truncated = self.turns >= self.max_turns
    try:
      call = json.loads(action)
      name, args = call["name"], call.get("arguments", {})
    except (ValueError, KeyError, TypeError):
      return "error: send one JSON tool call", 0.0, False, truncated, {}
    if name == "search_books":
      hits = {i: t for i, t in self.books.items() if str(args.get("word")) in t}
      return json.dumps(hits), 0.0, False, truncated, {}
    if name == "get_loans" and args.get("book_id") in self.loans:
      return json.dumps(self.loans[args["book_id"]]), 0.0, False, truncated, {}
    if name == "final_answer":
      ok = str(args.get("answer", "")).strip().upper() == self.answer
      return ("correct" if ok else "wrong"), float(ok), True, False, {}
    return f"error: unknown tool or bad arguments: {action}", 0.0, False, truncated, {}

  def solution(self) -> list[str]:
    return [json.dumps({"name": "get_loans", "arguments": {"book_id": self.target}}),
            json.dumps({"name": "final_answer", "arguments": {"answer": self.answer}})]
'''


_DEMO_PROGRAM = '''\
import random


class CoinChangeEnv:
  """Pay an amount with the fewest coins from a seeded coin system."""

  def __init__(self, max_turns: int = 25, **kwargs):
    self.max_turns = max_turns

  def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
    rng = random.Random(seed)
    self.coins = sorted(rng.sample(range(2, 30), 4) + [1])
    self.amount = rng.randint(40, 120)
    self.best = self._fewest()
    self.turns = 0
    return (f"Coins: {self.coins}. Pay exactly {self.amount} with as few coins as possible. "
            "Answer with the coin values separated by '+'."), {}

  def _fewest(self) -> list[int]:
    best = [[]] + [None] * self.amount
    for a in range(1, self.amount + 1):
      options = [best[a - c] + [c] for c in self.coins if c <= a and best[a - c] is not None]
      best[a] = min(options, key=len) if options else None
    return best[self.amount]

  def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
    self.turns += 1
    truncated = self.turns >= self.max_turns
    try:
      used = [int(x) for x in action.split("+")]
    except ValueError:
      return "Use the form 5+5+1.", 0.0, False, truncated, {}
    if sum(used) != self.amount or any(c not in self.coins for c in used):
      return "That does not pay the amount with the given coins.", 0.0, False, truncated, {}
    if len(used) == len(self.best):
      return "Optimal.", 1.0, True, False, {}
    return f"Valid, but {len(used)} coins is not the fewest.", 0.0, False, truncated, {}

  def solution(self) -> list[str]:
    return ["+".join(map(str, self.best))]

  def hint(self) -> str:
    return "Greedy choice can fail here; compute the fewest coins for every smaller amount first."
'''


def render_all(max_chars: int = 12_000) -> str:
  """Every designer prompt (all settings and skills) with demo context, as one text."""
  out = []
  for setting, skills in SKILLS.items():
    doc, exemplars, negative = _demo_records(setting)
    for skill in skills:
      prompt = designer_prompt(setting, skill, doc, exemplars, negative, max_chars=max_chars)
      out.append(f"===== setting={setting} skill={skill} ({len(prompt)} chars) =====\n{prompt}")
  return "\n\n".join(out)

