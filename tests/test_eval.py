"""Held-out evaluation: answer parsing, math-verify, configs, data errors, scripted scoring.

Scripted policies (``eval.ScriptedPolicy``) stand in for the model, so each scorer is
checked on known-correct and known-wrong answers without sampling.
"""

import dataclasses
import json
import os
import re

import pytest

from spade_jax import eval as ev
from spade_jax import models
from spade_jax.eval import answers, data, rgym
from spade_jax.registry import UnknownNameError

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "eval")
TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "experiments", "tokenizers",
                         "tiny_bpe_4k")


@pytest.fixture(scope="module")
def chat():
  return models.ChatTemplate(models.HFTokenizer(TOKENIZER), thinking=False)


def _user(transcript: str) -> str:
  """The last user message of a transcript."""
  return transcript.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]


# -- answers ---------------------------------------------------------------------------------

def test_last_boxed_balances_braces_and_takes_the_last():
  assert answers.last_boxed(r"\boxed{1} then \boxed{\frac{a}{b}}") == r"\frac{a}{b}"
  assert answers.last_boxed("no box") is None
  assert answers.last_boxed(r"\boxed{open") == "open"


def test_final_answer_ignores_thinking_and_falls_back_to_answer_tags():
  assert answers.final_answer(r"<think>\boxed{1}</think>so \boxed{2}") == ("2", "boxed")
  assert answers.final_answer("<think>cut off \\boxed{1}") == (None, "none")
  assert answers.final_answer("x <answer> 7 </answer>") == ("7", "tag")
  assert answers.final_answer("nothing") == (None, "none")


def test_choice_letter_and_code_extraction():
  assert answers.choice_letter(r"I pick \boxed{C}") == "C"
  assert answers.choice_letter(r"\boxed{\text{B}}") == "B"
  assert answers.choice_letter("Thinking...\nAnswer: D") == "D"
  assert answers.choice_letter("no idea") is None
  text = "```python\nx = 1\n```\nthen\n```python\ny = 2\n```"
  assert answers.extract_code(text) == "y = 2\n"
  assert answers.extract_code("```\nz = 3\n```") == "z = 3\n"
  assert answers.extract_code("plain") is None


@pytest.mark.parametrize("gold,completion", [
    ("14", r"The total is \boxed{14}."),
    (r"\frac{3}{4}", r"\boxed{0.75}"),
    (r"\frac{3}{4}", r"\boxed{\dfrac34}"),
    (r"2\sqrt{2}", r"\boxed{\sqrt{8}}"),
    ("5", r"<think>maybe \boxed{4}</think> \boxed{5}"),
])
def test_math_verify_accepts_equivalent_forms(gold, completion):
  assert answers.math_equal(gold, completion)


@pytest.mark.parametrize("gold,completion", [
    ("14", r"\boxed{15}"),
    (r"\frac{3}{4}", r"\boxed{\frac{4}{3}}"),
    ("5", r"<think>\boxed{5}"),  # cut inside its thinking: no answer
])
def test_math_verify_rejects_wrong_answers(gold, completion):
  assert not answers.math_equal(gold, completion)


# -- registry, configs, data files -----------------------------------------------------------

def test_suites_are_registered_with_the_papers_sampling():
  assert set(ev.SUITES) == {"reasoning_gym", "bfcl", "humaneval", "aime", "gpqa",
                            "livecodebench", "families", "procedural"}
  aime, gpqa = ev.suite_config("aime"), ev.suite_config("gpqa")
  assert (aime.samples, aime.temperature) == (64, 1.0)
  assert (gpqa.samples, gpqa.temperature) == (8, 0.7)
  lcb, bfcl, rg = (ev.suite_config(n) for n in ("livecodebench", "bfcl", "reasoning_gym"))
  assert (lcb.samples, lcb.temperature) == (1, 0.2)
  assert bfcl.temperature == 0.0
  assert (rg.tasks, rg.samples) == (100, 8)


def test_unknown_names_and_fields_say_what_is_valid():
  with pytest.raises(UnknownNameError, match=r"Unknown eval suite 'mmlu'.*'aime'.*eval\.suites"):
    ev.EvalConfig(suites=("mmlu",))
  with pytest.raises(ValueError, match=r"Unknown key\(s\) \['samplez'\].*'samples'"):
    ev.suite_config("aime", {"samplez": 3})
  with pytest.raises(UnknownNameError, match="BFCL multi-turn category"):
    ev.suite_config("bfcl", {"categories": ("base", "web")})
  with pytest.raises(UnknownNameError, match="reasoning gym group"):
    ev.suite_config("reasoning_gym", {"groups": ("math", "games")})
  with pytest.raises(ValueError, match="samples=0"):
    ev.suite_config("aime", {"samples": 0})


def test_eval_config_knobs_and_overrides():
  c = ev.EvalConfig(suites=("aime", "bfcl"), every=5, limit=3, samples=2, data_dir="/d",
                    overrides={"bfcl": {"categories": ["base"], "samples": 1}})
  cfgs = c.suite_configs()
  assert (cfgs["aime"].limit, cfgs["aime"].samples, cfgs["aime"].data_dir) == (3, 2, "/d")
  assert (cfgs["bfcl"].categories, cfgs["bfcl"].samples) == (("base",), 1)
  assert cfgs["aime"].temperature == 1.0  # the suite's default stays
  assert dataclasses.is_dataclass(c) and c.every == 5
  assert ev.EvalConfig(suites="aime,bfcl").suites == ("aime", "bfcl")


def test_missing_and_malformed_files_name_the_file_and_the_fix(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"no data directory is set.*aime\*\.jsonl.*"
                     r"--data_dir"):
    data.find_files("aime", "", "", "aime*.jsonl", "AIME problems")
  with pytest.raises(FileNotFoundError, match="no file matches"):
    data.find_files("aime", str(tmp_path / "nope.jsonl"), "", "aime*.jsonl", "AIME")
  bad = tmp_path / "aime_bad.jsonl"
  bad.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": oops}\n')
  with pytest.raises(ValueError, match=rf"{re.escape(str(bad))}:2: not valid JSON.*"
                     r"\"problem\""):
    data.read_jsonl(str(bad), "aime", [("problem",), ("answer",)], '{"problem", "answer"}')
  bad.write_text('{"question": "1+1?"}\n')
  with pytest.raises(ValueError, match=r":1: missing field 'answer'"):
    data.read_jsonl(str(bad), "aime", [("problem", "question"), ("answer",)], "fmt")


# -- scripted scoring ------------------------------------------------------------------------

def _rows(name):
  with open(os.path.join(FIXTURES, name)) as f:
    return [json.loads(line) for line in f]


def _run(chat, name, reply, **cfg):
  policy = ev.ScriptedPolicy(chat.vocab, reply)
  result = ev.evaluate(policy, chat, [name], {name: cfg})[name]
  assert all(0.0 <= v <= 1.0 for v in result.scores.values()), result.scores
  return result


def test_aime_scores_right_equivalent_and_wrong_answers(chat):
  rows = _rows("aime_sample.jsonl")
  equivalent = {"14": "14", r"\frac{3}{4}": "0.75", r"2\sqrt{2}": r"\sqrt{8}"}
  by_problem = {r["problem"]: equivalent[r["answer"]] for r in rows}

  def right(text):
    problem = _user(text).split("\nPlease reason")[0]
    return f"Done: \\boxed{{{by_problem[problem]}}}"

  cfg = dict(path=os.path.join(FIXTURES, "aime_sample.jsonl"), samples=2)
  good = _run(chat, "aime", right, **cfg)
  assert good.scores == {"pass@1": 1.0}
  assert len(good.records) == 3 and good.records[1]["predictions"] == ["0.75", "0.75"]
  assert _run(chat, "aime", lambda t: r"\boxed{-1}", **cfg).scores == {"pass@1": 0.0}
  one = _run(chat, "aime", right, limit=1, samples=1, data_dir=FIXTURES)
  assert len(one.records) == 1  # data_dir + the default file glob


def test_gpqa_scores_the_chosen_letter(chat):
  rows = _rows("gpqa_diamond_sample.jsonl")
  correct = {r["Question"]: r["Correct Answer"] for r in rows}

  def pick(text, want_right):
    user = _user(text)
    question = user.split("\n\n")[1]
    for line in user.splitlines():
      if re.match(r"^[ABCD]\) ", line):
        if (line[3:] == correct[question]) == want_right:
          return f"\\boxed{{{line[0]}}}"
    raise AssertionError(user)

  cfg = dict(path=os.path.join(FIXTURES, "gpqa_diamond_sample.jsonl"), samples=2)
  assert _run(chat, "gpqa", lambda t: pick(t, True), **cfg).scores["pass@1"] == 1.0
  assert _run(chat, "gpqa", lambda t: pick(t, False), **cfg).scores["pass@1"] == 0.0


def test_reasoning_gym_tasks_are_fixed_and_scored_by_the_package(chat):
  first = rgym.tasks("logic", 7)
  assert [t["id"] for t in first] == [t["id"] for t in rgym.tasks("logic", 7)]
  assert {t["dataset"] for t in first} == set(rgym.group_datasets("logic"))
  tasks = {t["entry"]["question"]: t for g in ("math", "logic") for t in rgym.tasks(g, 4)}
  reference = lambda task: f"\\boxed{{{task['entry']['answer']}}}"

  def right(text):
    return reference(tasks[_user(text).rsplit("\n\nPut your final answer", 1)[0]])

  cfg = dict(groups=("math", "logic"), tasks=4, samples=2)
  good = _run(chat, "reasoning_gym", right, **cfg)
  assert good.scores["math"] == 1.0  # every math task's reference answer wins
  by_id = {t["id"]: t for t in tasks.values()}
  for r in good.records:  # a win is exactly what the package's scorer says of the answer
    want = float(rgym.score(by_id[r["id"]], reference(by_id[r["id"]]))[0] >= 1.0)
    assert r["win_rate"] == want
  bad = _run(chat, "reasoning_gym", lambda t: r"\boxed{}", **cfg)
  assert bad.scores["math"] == bad.scores["logic"] == bad.scores["win_rate"] == 0.0
  assert len(bad.records) == 8 and set(bad.scores) == {
      "math", "math/score", "logic", "logic/score", "win_rate"}
