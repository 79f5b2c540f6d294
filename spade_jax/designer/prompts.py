"""Prompts for the two roles: the environment designer and the reasoning agent.

The designer prompt renders the env contract of :mod:`spade_jax.envs.contract`
(settings, skills, allowed imports, size cap) and fits a budget measured by the caller
(characters, or tokens of the chat-wrapped message) by cutting only the grounding
document. The hinted arm gets its hint in the first observation
(:func:`hinted_observation`), not in the system prompt, as in the reference.
``python -m launch.prompts`` prints a rendered designer prompt for every skill of every
setting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from spade_jax.designer.corpus import Document, truncate
from spade_jax.designer.memory import MemoryRecord, ProgramRenderer, render_program
from spade_jax.envs.programs import builtin_program, load_program
from spade_jax.envs.contract import (COMMON_RULES, SETTINGS, SKILLS, TOOL_DOMAINS,
                                     TOOL_TASK_TYPES, Setting, check_skill)

def contract_text(setting: str) -> str:
  """The program contract of ``setting`` as the designer reads it (from envs.contract)."""
  return ("Program contract (programs that break it are rejected):\n"
          + SETTINGS[setting].program_rules + "\n" + COMMON_RULES)


OUTPUT_FORMAT = ("Reply with the complete program in one ```python fenced code block. "
                 "Do not write anything after the closing fence.")


_BUDGET_FIELD = "selfplay.designer_prompt_tokens"


def _head(setting: Setting, skill: str) -> str:
  """Task, skill with its description and the difficulty label (reference: "medium")."""
  kind = "game or puzzle" if setting.name == "games" else "tool-use task"
  return (f"You design training environments for a reasoning agent. Write one interactive "
          f"{kind} as a Python program. The agent plays it over several turns: it reads "
          "each observation and replies with an action.\n\n"
          f"Target skill: {skill}: {setting.skills[skill]}\n"
          "Difficulty: medium.\n\n"
          "Aim for a task the agent solves only sometimes: hard enough that it fails "
          "without help, but learnable, so that a good hint clearly raises its success "
          "rate. Vary structure and difficulty through `reset(seed)`.")


def _doc_section(doc_id: str, text: str, flavour: bool = False) -> str:
  use = ("You may borrow names, entities or details from it as flavour for the domain."
         if flavour else "Draw the theme, entities, rules or numbers of your environment "
         "from it.")
  return (f"Reference document (id: {doc_id}). {use} The environment must be playable "
          "without reading the document; do not mention the document in the observations.\n"
          f"<document>\n{text}\n</document>")


def _render_code(program: ProgramRenderer, cap: int) -> str:
  """The program in at most ``cap`` characters where possible, never cut mid-class.

  Elides method bodies as needed; below the fully elided skeleton it returns the skeleton
  anyway. A program that does not parse (a rejected sample) keeps whole lines up to
  ``cap``, with a marker, or is left out ("").
  """
  code = program.fit(cap)
  if code is not None:
    return code
  if program.parses:
    return program.skeleton()
  lines, kept = program.program.rstrip().splitlines(), []
  marker = "# [... {} more lines]"
  used = len(marker.format(len(lines)))
  for line in lines:
    if used + len(line) + 1 > cap:
      break
    kept.append(line)
    used += len(line) + 1
  if not kept:
    return ""
  return "\n".join(kept + [marker.format(len(lines) - len(kept))])


def _code_block(code: str) -> str:
  return f"```python\n{code}\n```" if code else "(code not shown)"


def _exemplar_section(setting: Setting, exemplars: Sequence[MemoryRecord],
                      programs: Sequence[ProgramRenderer], cap: int) -> str:
  what = "game" if setting.name == "games" else "task"
  blocks = [
      f"Examples of environments at the right difficulty: the agent solved them only "
      f"sometimes without help, and more often with a hint. Create a DIFFERENT {what}: "
      "take the level of difficulty and the contract from them, not the theme or the "
      "mechanics."]
  for i, (rec, program) in enumerate(zip(exemplars, programs)):
    blocks.append(f"Example {i + 1} (skill: {rec.skill}; the agent solved "
                  f"{rec.win_rate_nohint:.0%} of plays without a hint and "
                  f"{rec.win_rate_hint:.0%} with one):\n"
                  + _code_block(_render_code(program, cap)))
  return "\n\n".join(blocks)


def _negative_section(negative: MemoryRecord, program: ProgramRenderer, cap: int) -> str:
  reason = negative.reason or "rejected"
  return (f"An earlier environment that did NOT work. Reason: {reason}. Avoid this "
          "failure.\n" + _code_block(_render_code(program, cap)))


def designer_prompt(setting: str, skill: str, document: Document | None = None,
                    exemplars: Sequence[MemoryRecord] = (), negative: MemoryRecord | None = None,
                    *, budget: int | None = 24_000, count: Callable[[str], int] = len,
                    doc_words: int | None = None, no_corpus: bool = False,
                    domain: str | None = None, task_type: str | None = None) -> str:
  """The designer's instruction for one environment, within ``budget``.

  Sections, in order: head (task, skill and its description, difficulty "medium"), the
  document, the memory exemplars, the negative example, the interaction rules, the
  contract, the output format. Only the document is ever cut (docs/METHOD.md §4):

  1. Exemplar and negative code is shown whole if the prompt without a document fits;
     otherwise every program is rendered under one shared character cap, as large as
     fits, with method bodies elided (never cut mid-class; largest bodies first). If the
     prompt does not fit even with every body elided, ValueError.
  2. The document is cut to ``doc_words`` words, then to as many words as still fit
     (binary search with ``count``); if no word fits, the document section is left out.

  Args:
    setting: ``"games"`` or ``"tool_use"``.
    skill: one of ``SKILLS[setting]``.
    document: grounding document, or None for an ungrounded prompt.
    exemplars: memory records shown as examples of the right difficulty.
    negative: a memory record shown as what to avoid, with its reason.
    budget: the limit for ``count(prompt)``, or None for no limit (the document is then
      cut to ``doc_words`` only and code is shown whole).
    count: measures a prompt: characters by default; pass a token counter such as
      ``lambda t: len(chat.prompt(None, t))`` to budget in tokens of the chat-wrapped
      message.
    doc_words: word cap of the document; default the setting's ``doc_words``
      (6,000 games / 4,000 tool use).
    no_corpus: ablation switch; drops the document even if one is given.
    domain: tool use: one of ``envs.TOOL_DOMAINS`` (docs/METHOD.md §5 samples one per slot).
    task_type: tool use: one of ``envs.TOOL_TASK_TYPES``.

  Returns:
    The prompt text (one user message) with ``count(prompt) <= budget``.

  Raises:
    ValueError: unknown setting or skill, or a budget too small for the sections that
      are never dropped.
  """
  s = SETTINGS[setting]
  check_skill(setting, skill)
  head = _head(s, skill)
  if s.tool_harness:
    domain = domain or TOOL_DOMAINS[0]
    task_type = task_type or next(iter(TOOL_TASK_TYPES))
    if domain not in TOOL_DOMAINS or task_type not in TOOL_TASK_TYPES:
      raise ValueError(f"Unknown tool-use domain {domain!r} or task type {task_type!r}; "
                       f"domains: {list(TOOL_DOMAINS)}; task types: {list(TOOL_TASK_TYPES)}.")
    head += f"\n\nDomain: {domain}. Task type: {task_type}: {TOOL_TASK_TYPES[task_type]}"
  tail = [f"How the agent interacts: {s.interaction}", contract_text(setting), OUTPUT_FORMAT]
  shown = [ProgramRenderer(r.program) for r in exemplars]
  shown_negative = ProgramRenderer(negative.program) if negative is not None else None

  def build(doc_text: str, cap: int) -> str:
    sections = [head]
    if doc_text:
      sections.append(_doc_section(document.id, doc_text, s.tool_harness))
    if exemplars:
      sections.append(_exemplar_section(s, exemplars, shown, cap))
    if negative is not None:
      sections.append(_negative_section(negative, shown_negative, cap))
    return "\n\n".join(sections + tail)

  # 1. The largest shared code cap at which the prompt without a document fits.
  programs = shown + ([shown_negative] if shown_negative is not None else [])
  cap = max([len(p.program) for p in programs], default=0)
  prompt = build("", cap)
  if budget is not None and count(prompt) > budget:
    smallest = build("", 0)
    need = count(smallest)
    if need > budget:
      unit = "characters" if count is len else "tokens"
      shrunk = (f"with every method body of its {len(programs)} example program(s) elided"
                if programs else "with no example programs")
      raise ValueError(
          f"The designer prompt needs {need} {unit} without a document and {shrunk}, but "
          f"the budget is {budget}. Raise {_BUDGET_FIELD} to at least {need} (more leaves "
          "room for the document), or show fewer examples (memory.num_exemplars).")
    lo, hi = 0, cap  # build("", lo) fits, build("", hi) does not.
    while hi - lo > 1:
      mid = (lo + hi) // 2
      if count(build("", mid)) <= budget:
        lo = mid
      else:
        hi = mid
    cap, prompt = lo, build("", lo)

  # 2. As much of the document as fits in what is left.
  if document is None or no_corpus:
    return prompt
  full = document.text.strip()
  text = truncate(full, max_words=s.doc_words if doc_words is None else doc_words)
  n = len(text.split())

  def with_words(k: int) -> str:
    cut = truncate(text, max_words=k)
    return build(cut + (" [...]" if len(cut) < len(full) else ""), cap) if k else prompt

  candidate = with_words(n)
  if budget is None or count(candidate) <= budget:
    return candidate
  lo, hi = 0, n  # with_words(lo) fits, with_words(hi) does not.
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if count(with_words(mid)) <= budget:
      lo = mid
    else:
      hi = mid
  return with_words(lo)


def agent_system_prompt(setting: str) -> str:
  """System prompt for the reasoning agent (both arms; the hint goes in the observation).

  Args:
    setting: ``"games"`` or ``"tool_use"``.

  Returns:
    The system message text.
  """
  s = SETTINGS[setting]
  what = "an interactive puzzle or game" if s.name == "games" else "a task that needs tools"
  return (f"You are solving {what} over several turns. The environment describes the "
          f"task and responds to each of your actions. {s.agent_rules} Think carefully "
          "before acting: wasted or invalid actions use up turns.")


def hinted_observation(observation: str, hint: str | None) -> str:
  """The first observation of a hinted play: the hint appended, as the reference does.

  Args:
    observation: the environment's first observation (from ``reset``).
    hint: the hint, or None / "" for an unhinted play.

  Returns:
    ``observation`` unchanged without a hint, else the observation followed by the hint.
  """
  if not hint or not hint.strip():
    return observation
  return f"{observation}\n\nHint:\n{hint.strip()}"


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


def judge_prompt(program: str, setting: str, max_chars: int = 24_000) -> str:
  """Asks the policy whether a tool-use program is sound (docs/METHOD.md §5's LLM validator).

  The answer is the content of the reply's last ``\\boxed{}``: yes or no.
  """
  s = SETTINGS[setting]
  head = ("Below is the source code of a tool-use training environment. Its requests "
          "(`self.tasks`) come with criteria checked against the hidden state. Judge it: is "
          "every criterion reachable with the declared tools, are the requests free of "
          "contradictions, and does at most one criterion already hold when the episode "
          "starts?\n\n"
          f"How the agent interacts: {s.interaction}")
  tail = ("Think briefly, then answer \\boxed{yes} if the environment is sound and "
          "\\boxed{no} if it is not.")
  code = render_program(program, max_chars - len(head) - len(tail) - 40) or ""
  return f"{head}\n\n```python\n{code}\n```\n\n{tail}"


def _demo_records(setting: str):
  doc = Document("pydoc_topics/augassign",
                 "Augmented assignment statements. Augmented assignment is the combination, "
                 "in a single statement, of a binary operation and an assignment statement: "
                 "x += 1 evaluates the target once, applies the operation, and assigns the "
                 "result back to the original target.")
  if setting == "games":
    good = MemoryRecord(program=load_program("coin_change"), doc_id="stdlib/heapq",
                        skill="optimization", win_rate_nohint=0.375, win_rate_hint=0.75,
                        regret=0.375, designer_reward=0.93, iteration=12, setting=setting)
  else:
    good = MemoryRecord(program=builtin_program("library_loans"), doc_id="stdlib/sqlite3",
                        skill="data retrieval", win_rate_nohint=0.25, win_rate_hint=0.625,
                        regret=0.375, designer_reward=0.88, iteration=16, setting=setting)
  bad = MemoryRecord(program=load_program("echo_trivial"),
                     doc_id="stdlib/string", skill=SKILLS[setting][3],
                     reason="trivial: random play solves 100% of episodes", iteration=9,
                     setting=setting)
  return doc, [good], bad



def render_all(max_chars: int = 12_000) -> str:
  """Every designer prompt (all settings and skills) with demo context, as one text.

  Args:
    max_chars: character budget of each prompt.
  """
  out = []
  for setting, skills in SKILLS.items():
    doc, exemplars, negative = _demo_records(setting)
    for skill in skills:
      prompt = designer_prompt(setting, skill, doc, exemplars, negative, budget=max_chars)
      out.append(f"===== setting={setting} skill={skill} ({len(prompt)} chars) =====\n{prompt}")
  return "\n\n".join(out)

