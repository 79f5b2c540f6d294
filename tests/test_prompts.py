"""Designer, agent and hint prompts; hint cleaning and leak detection."""

import ast
import subprocess
import sys

import pytest

from spade_jax.designer import (Document, MemoryRecord, agent_system_prompt,
                                clean_hint, designer_prompt, finalize_hint, hint_leaks, hint_prompt)
from spade_jax.designer import prompts as prompts_lib
from spade_jax.envs import ALLOWED_IMPORTS, SKILLS

DOC = Document("stdlib/heapq", "Heap queue algorithm. Heaps are binary trees for which every "
               "parent node has a value less than or equal to any of its children.")


def big_record(n_methods=12, **kw):
  methods = "".join(
      f"\n  def helper_{i}(self, x):\n" + "".join(f"    x = x + {j}\n" for j in range(30)) +
      "    return x\n" for i in range(n_methods))
  program = ("import random\n\n\nclass BigEnv:\n"
             "  def __init__(self, max_turns: int = 25, **kwargs):\n"
             "    self.max_turns = max_turns\n\n"
             "  def reset(self, seed=None, options=None):\n"
             "    self.rng = random.Random(seed)\n    return 'go', {}\n\n"
             "  def step(self, action):\n    return 'ok', 0.0, False, False, {}\n" + methods)
  base = dict(skill="optimization", win_rate_nohint=0.4, win_rate_hint=0.8, regret=0.4)
  base.update(kw)
  return MemoryRecord(program=program, **base)


@pytest.mark.parametrize("setting", sorted(SKILLS))
def test_every_skill_renders_with_contract(setting):
  doc, exemplars, negative = prompts_lib._demo_records(setting)  # pylint: disable=protected-access
  for skill in SKILLS[setting]:
    p = designer_prompt(setting, skill, doc, exemplars, negative, max_chars=12_000)
    assert skill in p and doc.text in p and f"id: {doc.id}" in p
    for piece in ("ends in `Env`", "__init__(self, max_turns: int = 25, **kwargs)",
                  "reset(self, seed: int | None = None, options: dict | None = None)",
                  "step(self, action: str) -> tuple[str, float, bool, bool, dict]",
                  "solution(self) -> list[str]", "hint(self) -> str", "[-1, 1]",
                  "```python", negative.reason, "class " + ("CoinChangeEnv" if setting ==
                                                             "games" else "LibraryLoansEnv")):
      assert piece in p, (setting, skill, piece)
    for module in ALLOWED_IMPORTS:
      assert module in p
    assert ("\\boxed{" in p) == (setting == "games")
    assert ("<tool_call>" in p) == (setting == "tool_use")
    assert len(p) <= 12_000


def test_no_corpus_and_ungrounded_prompts_drop_the_document():
  p = designer_prompt("games", "logical deduction", DOC, no_corpus=True)
  assert DOC.text not in p and "<document>" not in p
  assert "<document>" not in designer_prompt("games", "logical deduction", None)


def test_budget_elides_exemplars_without_cutting_classes():
  rec = big_record()
  assert len(rec.program) > 6_000
  p = designer_prompt("games", "optimization", DOC, [rec], None, max_chars=6_000)
  assert len(p) <= 6_000
  code = p.split("```python\n", 1)[1].split("\n```", 1)[0]
  tree = ast.parse(code)  # A complete program, with method bodies elided.
  assert [n.name for n in tree.body if isinstance(n, ast.ClassDef)] == ["BigEnv"]
  assert "..." in code
  # Not even a skeleton fits: the exemplar is skipped, never truncated.
  p = designer_prompt("games", "optimization", DOC, [big_record(n_methods=150)], None,
                      max_chars=8_000)
  assert "class BigEnv" not in p and len(p) <= 8_000


def test_document_is_cut_to_budget():
  long_doc = Document("x", "word " * 20_000)
  p = designer_prompt("games", "optimization", long_doc, max_chars=10_000)
  assert len(p) <= 10_000 and "[...]" in p


def test_unknown_setting_and_skill_raise_with_choices():
  with pytest.raises(ValueError, match="games"):
    designer_prompt("chess", "optimization")
  with pytest.raises(ValueError, match="API orchestration"):
    designer_prompt("tool_use", "optimization")


def test_agent_and_hint_prompts():
  assert "\\boxed{" in agent_system_prompt("games")
  assert "Hint" not in agent_system_prompt("games")
  hinted = agent_system_prompt("tool_use", hint="Check the loan history first.")
  assert "<tool_call>" in hinted and hinted.endswith("Check the loan history first.")
  rec = big_record()
  hp = hint_prompt(rec.program, "games", max_chars=3_000)
  assert len(hp) <= 3_000 and "class BigEnv" in hp and "<hint>" in hp


def test_clean_hint():
  assert clean_hint("<think>secret plan</think><hint> Try the corners. </hint>") == \
      "Try the corners."
  assert clean_hint("Hint: sort first.\n\n\nThen scan.") == "sort first.\nThen scan."
  assert clean_hint("<think>never closed") is None
  assert clean_hint("") is None and clean_hint(None) is None
  long = clean_hint("word " * 1000, max_chars=50)
  assert len(long) <= 54 and long.endswith("...")


def test_hint_leaks():
  sol = ["R", "R", "D"]
  assert hint_leaks("Go R, R, then D.", sol)
  assert hint_leaks("the moves are r r d", sol)
  assert not hint_leaks("Go right twice and then down.", sol)
  assert not hint_leaks("Go R, D, R.", sol)
  assert hint_leaks("The answer is 42.", ["42"])
  assert not hint_leaks("Try numbers above 420.", ["42"])
  assert hint_leaks("Pay with 25+25+5 coins", ["25+25+5"])
  assert not hint_leaks("anything", []) and not hint_leaks(None, ["a"])
  tool = ['{"name": "get_loans", "arguments": {"book_id": 3}}']
  assert hint_leaks('call {"name": "get_loans", "arguments": {"book_id": 3}}', tool)
  assert not hint_leaks("look up the loans of the book first", tool)
  h = finalize_hint("<hint>The answer is 42</hint>", "program", ["42"])
  assert h.leaked and h.text is None
  h = finalize_hint("<hint>Binary search.</hint>", "policy", ["42"])
  assert not h.leaked and h.text == "Binary search."
  with pytest.raises(ValueError, match="policy"):
    finalize_hint("x", "oracle")


def test_launcher_prints_every_prompt():
  out = subprocess.run([sys.executable, "-m", "launch.prompts"],
                       capture_output=True, text=True, check=True, timeout=60)
  headers = [ln for ln in out.stdout.splitlines() if ln.startswith("===== setting=")]
  assert len(headers) == sum(len(v) for v in SKILLS.values()) == 12
  assert "RuntimeWarning" not in out.stderr
