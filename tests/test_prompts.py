"""Designer, agent and hint prompts; hint cleaning and leak detection."""

import ast
import random
import subprocess
import sys

import pytest

from spade_jax.designer import (Document, MemoryRecord, agent_system_prompt, clean_hint,
                                designer_prompt, finalize_hint, hint_leaks, hint_prompt,
                                hinted_observation)
from spade_jax.designer import prompts as prompts_lib
from spade_jax.envs import ALLOWED_IMPORTS, SETTINGS, SKILLS
from spade_jax.models import ChatTemplate, HFTokenizer
from spade_jax.models.tokenizer import train_bpe

from experiments.configs import tiny

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
    p = designer_prompt(setting, skill, doc, exemplars, negative, budget=12_000)
    assert skill in p and doc.text in p and f"id: {doc.id}" in p
    assert "Difficulty: medium" in p
    assert ("DIFFERENT game" if setting == "games" else "DIFFERENT task") in p
    own = (("step(self, action: str) -> tuple[str, float, bool, bool, dict]", "[-1, 1]",
            "class CoinChangeEnv") if setting == "games" else
           ("no `step` method", "self.tasks", "tool_<name>(self, **arguments) -> str",
            "respond(self, text: str) -> str", "<answer>done</answer>",
            "class LibraryLoansEnv", "Domain: ", "Task type: "))
    for piece in ("ends in `Env`", "__init__(self, max_turns: int = 25, **kwargs)",
                  "reset(self, seed: int | None = None, options: dict | None = None)",
                  "solution(self) -> list[str]", "hint(self) -> str", "```python",
                  negative.reason, prompts_lib.contract_text(setting)) + own:
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


def test_sections_keep_their_order():
  doc, exemplars, negative = prompts_lib._demo_records("games")  # pylint: disable=protected-access
  p = designer_prompt("games", "optimization", doc, exemplars, negative)
  marks = ["Target skill: optimization", "<document>", "Example 1", "did NOT work",
           "How the agent interacts", "Program contract", prompts_lib.OUTPUT_FORMAT]
  positions = [p.index(m) for m in marks]
  assert positions == sorted(positions)


def test_budget_elides_exemplars_without_cutting_classes():
  rec = big_record()
  assert len(rec.program) > 6_000
  p = designer_prompt("games", "optimization", DOC, [rec], None, budget=6_000)
  assert len(p) <= 6_000
  code = p.split("```python\n", 1)[1].split("\n```", 1)[0]
  tree = ast.parse(code)  # A complete program, with method bodies elided.
  assert [n.name for n in tree.body if isinstance(n, ast.ClassDef)] == ["BigEnv"]
  assert "..." in code
  # Not even the skeleton fits: an error naming the budget and the field to raise, never
  # a dropped or truncated example.
  with pytest.raises(ValueError, match=r"budget is 8000.*selfplay\.designer_prompt_tokens"):
    designer_prompt("games", "optimization", DOC, [big_record(n_methods=150)], None,
                    budget=8_000)


def test_unparsable_negative_keeps_its_reason():
  broken = MemoryRecord(program="class BrokenEnv(:\n" + "  x = 1\n" * 400,
                        skill="optimization", reason="syntax")
  full = designer_prompt("games", "optimization", None, (), broken)
  p = designer_prompt("games", "optimization", None, (), broken, budget=len(full) - 1_000)
  assert len(p) <= len(full) - 1_000 and "Reason: syntax" in p and "more lines]" in p
  fixed = len(designer_prompt("games", "optimization", None, (), None)) + 120
  p = designer_prompt("games", "optimization", None, (), broken, budget=fixed)
  assert "Reason: syntax" in p and "(code not shown)" in p


def test_document_is_cut_to_budget():
  long_doc = Document("x", "word " * 20_000)
  p = designer_prompt("games", "optimization", long_doc, budget=10_000)
  assert len(p) <= 10_000 and "word [...]" in p
  # No budget pressure: cut to the setting's word cap (6,000 games, 4,000 tool use).
  for setting, skill in (("games", "optimization"), ("tool_use", "data retrieval")):
    p = designer_prompt(setting, skill, long_doc, budget=None)  # No limit.
    assert p.count("word ") == SETTINGS[setting].doc_words
  p = designer_prompt("games", "optimization", long_doc, budget=10**9, doc_words=10)
  assert p.count("word ") == 10
  # Room for no word at all: the document section is left out.
  bare = designer_prompt("games", "optimization")
  p = designer_prompt("games", "optimization", long_doc, budget=len(bare) + 20)
  assert p == bare


def test_unknown_setting_and_skill_raise_with_choices():
  with pytest.raises(ValueError, match="games"):
    designer_prompt("chess", "optimization")
  with pytest.raises(ValueError, match="API orchestration"):
    designer_prompt("tool_use", "optimization")


# -- the tiny config's token budget, counted with its BPE vocabulary and chat markup ----

_WORDS = ("heap", "queue", "parent", "child", "node", "value", "tree", "binary", "sorted",
          "insert", "remove", "smallest", "priority", "index", "list", "push", "pop")
_BUDGET = tiny.get_config().selfplay.designer_prompt_tokens


@pytest.fixture(scope="module")
def count_tokens():
  chat = ChatTemplate(HFTokenizer(tiny.TOKENIZER))
  return lambda text: len(chat.prompt(None, text))


def test_a_trained_bpe_vocabulary_counts_prompts(tmp_path):
  texts = prompts_lib.render_all(100_000).split("\n\n") + [" ".join(_WORDS)]
  tok = train_bpe(texts, 2048, str(tmp_path))
  p = designer_prompt("games", "optimization", DOC)
  assert 1_000 < tok.vocab_size <= 2048 and len(tok.encode(p)) < len(p) // 3
  assert tok.decode(tok.encode(p)) == p


_SMALL = """\
import random


class PickEnv:
  def __init__(self, max_turns: int = 25, **kwargs):
    self.max_turns = max_turns

  def reset(self, seed=None, options=None):
    self.target = random.Random(seed).randint(1, 9)
    return "Pick a digit.", {}

  def step(self, action):
    ok = action.strip() == str(self.target)
    return ("yes" if ok else "no"), float(ok), ok, False, {}
"""


def _token_context():
  exemplar = MemoryRecord(program=_SMALL, skill="optimization", win_rate_nohint=0.4,
                          win_rate_hint=0.8, regret=0.4)
  negative = MemoryRecord(program=_SMALL.replace("PickEnv", "EasyEnv"), skill="optimization",
                          reason="trivial: random play solves 100% of episodes")
  return [exemplar], negative


def test_token_budget_prompts_differ_only_in_skill_and_document(count_tokens):
  exemplars, negative = _token_context()
  doc_a = Document("a/heap", "A heap is a binary tree where every parent is at most its "
                   "children.")
  doc_b = Document("b/queue", "A priority queue pops the smallest value first.")
  skills = SETTINGS["games"].skills
  a, b = "optimization", "logical deduction"
  pa = designer_prompt("games", a, doc_a, exemplars, negative, budget=_BUDGET,
                       count=count_tokens)
  pb = designer_prompt("games", b, doc_b, exemplars, negative, budget=_BUDGET,
                       count=count_tokens)
  assert count_tokens(pa) <= _BUDGET and count_tokens(pb) <= _BUDGET
  for p, skill, doc in ((pa, a, doc_a), (pb, b, doc_b)):
    assert f"Target skill: {skill}: {skills[skill]}" in p
    assert f"id: {doc.id}" in p and f"<document>\n{doc.text}\n</document>" in p
    assert _SMALL.strip() in p
  swapped = (pa.replace(f"{a}: {skills[a]}", f"{b}: {skills[b]}")
             .replace(doc_a.text, doc_b.text).replace(doc_a.id, doc_b.id))
  assert swapped == pb


def test_token_budget_cuts_only_a_long_document(count_tokens):
  exemplars, negative = _token_context()
  rng = random.Random(0)
  long_doc = Document("long", " ".join(rng.choice(_WORDS) for _ in range(5_000)))
  p = designer_prompt("games", "optimization", long_doc, exemplars, negative,
                      budget=_BUDGET, count=count_tokens)
  assert _BUDGET - 10 <= count_tokens(p) <= _BUDGET  # The document fills what is left.
  doc = p.split("<document>\n", 1)[1].split("\n</document>", 1)[0]
  assert doc.endswith(" [...]") and long_doc.text.startswith(doc[:-len(" [...]")])
  assert 10 < len(doc.split()) < 5_000
  for piece in ("You design training environments", "Target skill: optimization: ",
                SETTINGS["games"].skills["optimization"], "Difficulty: medium",
                _SMALL.strip(), "Reason: trivial: random play solves 100% of episodes",
                "How the agent interacts", prompts_lib.contract_text("games"), prompts_lib.OUTPUT_FORMAT):
    assert piece in p, piece


def test_token_budget_too_small_for_the_fixed_parts_raises(count_tokens):
  exemplars, negative = _token_context()
  with pytest.raises(ValueError, match=r"needs \d+ tokens .* budget is 512\. Raise "
                     r"selfplay\.designer_prompt_tokens"):
    designer_prompt("games", "optimization", DOC, exemplars, negative, budget=512,
                    count=count_tokens)


def test_agent_and_hint_prompts():
  assert "\\boxed{" in agent_system_prompt("games")
  assert "Hint" not in agent_system_prompt("games")
  assert "<tool_call>" in agent_system_prompt("tool_use")
  # The hinted arm: the hint goes after the first observation (as the reference does).
  hinted = hinted_observation("Find the loan record.", "  Check the loan history first. ")
  assert hinted.startswith("Find the loan record.\n\n")
  assert hinted.endswith("Check the loan history first.")
  assert hinted_observation("Find it.", None) == hinted_observation("Find it.", "") == \
      "Find it."
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


def test_the_trained_vocabulary_splits_like_qwen3(tmp_path):
  from transformers.models.qwen2 import tokenization_qwen2  # the slow tokenizer's regex
  from spade_jax.models.tokenizer import QWEN3_SPLIT
  assert QWEN3_SPLIT == tokenization_qwen2.PRETOKENIZE_REGEX
  texts = [f"Start with {n}. The value is {n * 7 + 3}; answer \\boxed{{{n + 11}}}."
           for n in range(400)]
  qwen = train_bpe(texts, 400, str(tmp_path / "qwen3"))
  gpt2 = train_bpe(texts, 400, str(tmp_path / "bytelevel"), pre_tokenizer="bytelevel")
  text = "Start with 123. answer \\boxed{4567}"
  pieces = lambda tok: [tok.decode([i]) for i in tok.encode(text)]
  assert [p for p in pieces(qwen) if p.strip().isdigit()] == list("1234567")
  assert any(len(p.strip()) > 1 and p.strip().isdigit() for p in pieces(gpt2))
  for tok in (qwen, gpt2):
    assert tok.decode(tok.encode(text)) == text
  with pytest.raises(ValueError, match="pre_tokenizer='wordpiece'"):
    train_bpe(texts, 400, str(tmp_path / "x"), pre_tokenizer="wordpiece")
