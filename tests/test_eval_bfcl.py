"""BFCL v4 multi-turn: scripted policies against the package's APIs and checker."""

import ast
import importlib
import inspect
import json
import os

import pytest

from spade_jax import eval as ev
from spade_jax import models
from spade_jax.eval import bfcl

TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "experiments", "tokenizers",
                         "tiny_bpe_4k")
PER_CATEGORY = 2


@pytest.fixture(scope="module")
def chat():
  return models.ChatTemplate(models.HFTokenizer(TOKENIZER), thinking=False)


@pytest.fixture(scope="module")
def entries():
  return {c: bfcl.load_entries(c)[:PER_CATEGORY] for c in bfcl.CATEGORIES}


def _as_tool_call(call: str, classes) -> dict:
  """A ground-truth call string ("cd(folder='x')") as Qwen3 tool-call JSON."""
  from bfcl_eval.constants.executable_backend_config import (  # pylint: disable=g-import-not-at-top
      CLASS_FILE_PATH_MAPPING)
  node = ast.parse(call, mode="eval").body
  args = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
  if node.args:  # positional: name them from the API method's signature
    for cls in classes:
      api = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls]), cls)
      if hasattr(api, node.func.id):
        names = [p for p in inspect.signature(getattr(api, node.func.id)).parameters
                 if p != "self"]
        args.update({n: ast.literal_eval(a) for n, a in zip(names, node.args)})
        break
  return {"name": node.func.id, "arguments": args}


def _scripted(entries, calls_for_turn):
  """A policy that answers a user turn's first query with ``calls_for_turn(entry, turn)``
  and the next query with plain text (which ends the turn). ``entries`` must differ in
  their first question (base and long_context entries share theirs)."""
  by_question = {e["question"][0][-1]["content"]: e for e in entries}

  def reply(text):
    entry = next(e for q, e in by_question.items() if q in text)
    turns = [t for t in text.split("<|im_start|>user\n")[1:]
             if not t.startswith("<tool_response>")]
    since_query = text.rsplit("<|im_start|>user\n" + turns[-1], 1)[1]
    calls = calls_for_turn(entry, len(turns) - 1)
    if since_query.count("<|im_start|>assistant") > 1 or not calls:
      return "Done."
    return "\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls)
  return reply


def _bfcl(chat, reply, **cfg):
  policy = ev.ScriptedPolicy(chat.vocab, reply)
  result = ev.evaluate(policy, chat, ["bfcl"], {"bfcl": {"limit": PER_CATEGORY, **cfg}})
  result = result["bfcl"]
  assert all(0.0 <= v <= 1.0 for v in result.scores.values())
  return result


def test_ground_truth_calls_score_one_and_no_calls_score_zero(chat, entries):
  for category, es in entries.items():
    truth = _scripted(es, lambda e, t: [_as_tool_call(c, e["involved_classes"])
                                        for c in e["ground_truth"][t]])
    good = _bfcl(chat, truth, categories=(category,))
    assert good.scores == {category: 1.0, "accuracy": 1.0}, [
        (r["id"], r["error_message"]) for r in good.records]
    assert len(good.records) == PER_CATEGORY and good.records[0]["calls"]
  empty = _bfcl(chat, lambda text: "")
  assert set(empty.scores) == set(bfcl.CATEGORIES) | {"accuracy"}
  assert empty.scores["accuracy"] == 0.0 and len(empty.records) == 4 * PER_CATEGORY
  assert {r["error_type"] for r in empty.records} == {"multi_turn:empty_turn_model_response"}


def test_wrong_calls_score_zero(chat, entries):
  wrong = _scripted(entries["base"], lambda e, t: [{"name": "cd", "arguments": {"folder": "nowhere"}}]
                    if e["ground_truth"][t] else [])
  result = _bfcl(chat, wrong, categories=("base",))
  assert result.scores == {"base": 0.0, "accuracy": 0.0}


def test_runs_leave_no_api_instances_behind(chat, entries):
  from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # pylint: disable=g-import-not-at-top
  _bfcl(chat, lambda text: "", categories=("base",))
  assert not [k for k in vars(multi_turn_utils) if k.startswith("spade_eval")]


def test_missing_functions_are_withheld_then_announced(chat, entries):
  e = entries["miss_func"][0]
  [(turn, withheld)] = e["missed_function"].items()
  names = {f["name"] for f in e["function"]}
  assert withheld and not names & {f["name"] for f in withheld}
  assert all(f["description"].endswith(bfcl.PYTHON_HINT) for f in e["function"])
  seen = []

  def reply(text):
    seen.append(text)
    return "Done."

  _bfcl(chat, reply, categories=("miss_func",), limit=1)
  announced = [t for t in seen if "I have updated some more functions" in t]
  assert announced and withheld[0]["name"] in announced[0]
  assert len({t.split("<|im_start|>user")[0] for t in seen}) == 1  # one system turn
  assert int(turn) < len(e["question"])


def test_decoding_follows_bfcl_and_refuses_builtins():
  unsafe = bfcl._unsafe_names()  # pylint: disable=protected-access
  call = lambda name, args: f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}' \
      '\n</tool_call>'
  assert bfcl.decode_calls(call("cd", {"folder": "a b"}) + "\n" + call("ls", {}), unsafe) == [
      "cd(folder='a b')", "ls()"]
  assert bfcl.decode_calls("<think>" + call("rm", {}) + "</think>no calls", unsafe) == []
  assert bfcl.decode_calls("<tool_call>\nnot json\n</tool_call>", unsafe) == []
  assert bfcl.decode_calls(call("open", {"file": "/etc/passwd"}), unsafe) == [
      f"{bfcl.REJECTED}()"]
  assert bfcl.decode_calls(call("cd", {"x); import os; (y": 1}), unsafe) == [
      f"{bfcl.REJECTED}()"]
  with pytest.raises(ValueError):
    bfcl.decode_calls("<tool_call>\n[1, 2]\n</tool_call>", unsafe)
