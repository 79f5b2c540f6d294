"""BFCL v4 multi-turn: the ``bfcl-eval`` package's data, executable APIs and checker.

Each entry is a conversation of user turns against stateful APIs (a file system, a trading
bot, a travel agency, ...). Our sampler drives it in the Qwen3 tool-call format, as BFCL's
own Qwen3 FC handler does: tool schemas in the system turn, ``<tool_call>`` JSON blocks in
the reply, results back as ``<tool_response>`` turns. Within a user turn the model is
queried until a reply holds no decodable call (at most ``max_steps`` queries, past which
BFCL fails the entry). The package's classes execute the calls, and its multi-turn
checker compares the final API states and execution results with the ground truth's.

Categories: ``base``, ``miss_func`` (a function is withheld, then announced in a later
user turn), ``miss_param`` (the request lacks a needed argument) and ``long_context``.
Scores: ``<category>`` accuracy and ``accuracy``, their unweighted mean (BFCL's
multi-turn summary). Paper: T 0.

Departures from BFCL's harness, both for the KV cache (a transcript is never re-rendered):
earlier turns keep their ``<think>`` blocks (BFCL's template drops them before the last user
query), and an entry whose transcript passes ``max_len`` tokens fails. Calls are decoded as
BFCL decodes them, except that a call whose name is a Python builtin (``open``, ``exec``,
...) or whose argument names are not identifiers becomes a call to an undefined name
(BFCL would ``eval`` it in the harness process); its result is the same "not defined"
error as for any unknown function.
"""

from __future__ import annotations

import builtins
import dataclasses
import itertools
import json
import keyword
import os
import pathlib
import re

from spade_jax.eval.core import SuiteConfig, SuiteResult, mean, need, register
from spade_jax.eval.policy import converse, sample_keys
from spade_jax.models import render_chat
from spade_jax.registry import names
from spade_jax.sampling import Turn

CATEGORIES = names("base", "miss_func", "miss_param", "long_context",
                   kind="BFCL multi-turn category", field="bfcl.categories")
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
REJECTED = "_rejected_function_name"
_TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
_IDS = itertools.count()


@dataclasses.dataclass(frozen=True)
class BFCLConfig(SuiteConfig):
  """``bfcl``: greedy (T 0, docs/METHOD.md §8), one conversation per entry (``samples`` each).

  Attributes:
    categories: which multi-turn categories (keys of :data:`CATEGORIES`).
    max_steps: model queries per user turn before the entry fails (BFCL's 20).
    max_len: transcript tokens at most; an entry that needs more fails.
  """

  max_new_tokens: int = 4096
  categories: tuple[str, ...] = ("base", "miss_func", "miss_param", "long_context")
  max_steps: int = 20
  max_len: int = 32768

  def __post_init__(self):
    super().__post_init__()
    for c in self.categories:
      CATEGORIES.check(c)


def _data_dir() -> pathlib.Path:
  return pathlib.Path(need("bfcl_eval", "bfcl-eval", "bfcl").__file__).parent / "data"


def _check(cfg: BFCLConfig) -> None:
  need("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker", "bfcl-eval", "bfcl")
  for c in cfg.categories:
    for path in (_data_dir() / f"BFCL_v4_multi_turn_{c}.json",
                 _data_dir() / "possible_answer" / f"BFCL_v4_multi_turn_{c}.json"):
      if not path.is_file():
        raise FileNotFoundError(f"Suite 'bfcl': {path} is missing; the installed bfcl-eval "
                                "is not the pinned one. Reinstall requirements-nodeps.txt.")


def _jsonl(path: pathlib.Path) -> list[dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def load_entries(category: str) -> list[dict]:
  """The category's entries as BFCL prepares them, each with its ``ground_truth``.

  ``function`` holds the involved classes' tool schemas (with BFCL's Python-syntax hint)
  minus the withheld ones; ``missed_function`` maps a turn to the withheld schemas.
  """
  from bfcl_eval.constants.executable_backend_config import (  # pylint: disable=g-import-not-at-top
      MULTI_TURN_FUNC_DOC_FILE_MAPPING)
  CATEGORIES.check(category)
  root = _data_dir()
  entries = _jsonl(root / f"BFCL_v4_multi_turn_{category}.json")
  truth = {e["id"]: e["ground_truth"] for e in
           _jsonl(root / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")}
  for e in entries:
    funcs = []
    for cls in e["involved_classes"]:
      funcs += _jsonl(root / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls])
    missed = {}
    for turn, fnames in e.get("missed_function", {}).items():
      missed[turn] = [f for f in funcs if f["name"] in fnames]
      funcs = [f for f in funcs if f["name"] not in fnames]
    for f in funcs:
      f["description"] += PYTHON_HINT
    e["function"], e["missed_function"] = funcs, missed
    e["ground_truth"] = truth[e["id"]]
  return entries


def _unsafe_names() -> frozenset[str]:
  from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # pylint: disable=g-import-not-at-top
  return frozenset(dir(builtins)) | frozenset(vars(multi_turn_utils))


def decode_calls(text: str, unsafe: frozenset[str] = frozenset()) -> list[str]:
  """BFCL's Qwen3 FC decoding: ``<tool_call>`` JSON blocks -> ``name(k=repr(v), ...)``.

  Raises (as BFCL's decoder does) when a block is not a call object; blocks that are not
  JSON are skipped.
  """
  visible = text.split("</think>")[-1].lstrip("\n")
  calls = []
  for block in _TOOL_CALL.findall(visible):
    try:
      calls.append(json.loads(block))
    except ValueError:
      continue
  out = []
  for call in calls:
    if not isinstance(call, dict):
      raise ValueError(f"not a function call object: {call!r}")
    name, args = call["name"], call["arguments"]
    args = json.loads(args) if isinstance(args, str) else args
    items = list(args.items())
    safe = (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)
            and name not in unsafe
            and all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k)
                    for k, _ in items))
    out.append(f"{name}({','.join(f'{k}={v!r}' for k, v in items)})" if safe
               else f"{REJECTED}()")
  return out


def _forget(model_name: str) -> None:
  """Drops the API instances BFCL keeps in its module globals for ``model_name``."""
  from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # pylint: disable=g-import-not-at-top
  prefix = re.sub(r"[-./:]", "_", model_name)
  g = vars(multi_turn_utils)
  for k in [k for k in g if k.startswith(prefix)]:
    del g[k]


def judge(entry: dict, responses: list[list[str]], model_name: str,
          unsafe: frozenset[str]) -> dict:
  """BFCL's verdict on one entry from the model's raw replies (per turn, per step)."""
  from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (  # pylint: disable=g-import-not-at-top
      multi_turn_checker)
  from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (  # pylint: disable=g-import-not-at-top
      is_empty_execute_response)
  truth = entry["ground_truth"]
  if len(responses) != len(truth):
    return {"valid": False, "error_type": "multi_turn:force_terminated",
            "error_message": f"{len(responses)} of {len(truth)} turns completed"}
  decoded = []
  for turn in responses:
    steps = []
    for text in turn:
      try:
        calls = decode_calls(text, unsafe)
      except Exception:  # pylint: disable=broad-except  (BFCL skips undecodable steps)
        continue
      if not is_empty_execute_response(calls):
        steps.append(calls)
    decoded.append(steps)
  prompt = {k: v for k, v in entry.items() if k not in ("function", "ground_truth")}
  try:
    out = multi_turn_checker(decoded, truth, prompt, entry["id"].rsplit("_", 1)[0],
                             model_name)
  except Exception as e:  # pylint: disable=broad-except
    out = {"valid": False, "error_type": "checker_error",
           "error_message": f"{type(e).__name__}: {e}"}
  finally:
    _forget(model_name)
  return {"valid": bool(out.get("valid")), "error_type": out.get("error_type"),
          "error_message": str(out.get("error_message", ""))[:500], "decoded": decoded}


@register("bfcl", BFCLConfig, needs="offline (package data)",
          description="BFCL v4 multi-turn (bfcl-eval data, APIs and checker), accuracy",
          check=_check)
def run_bfcl(policy, chat, cfg: BFCLConfig, *, pool=None, progress=None) -> SuiteResult:
  del pool
  from bfcl_eval.constants.default_prompts import (  # pylint: disable=g-import-not-at-top
      DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING as ANNOUNCE)
  from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (  # pylint: disable=g-import-not-at-top
      execute_multi_turn_func_call)
  unsafe = _unsafe_names()
  entries = []  # (category, entry) per conversation: each entry `samples` times
  for category in cfg.categories:
    loaded = load_entries(category)
    entries += [(category, e) for e in (loaded[:cfg.limit] if cfg.limit else loaded)
                for _ in range(cfg.samples)]
  # Conversation state, per entry.
  name = [f"spade_eval_{os.getpid()}_{next(_IDS)}" for _ in entries]
  turn = [0] * len(entries)
  steps = [0] * len(entries)
  length = [0] * len(entries)
  responses: list[list[list[str]]] = [[[]] for _ in entries]
  outcome = ["done"] * len(entries)
  done = [0]
  eos = chat.vocab.eos_id

  def user_turn(e: dict, t: int) -> list[dict]:
    msgs = e["question"][t]
    if str(t) in e["missed_function"]:
      msgs = [{"role": "user", "content": ANNOUNCE.format(functions=e["missed_function"][str(t)])}]
    return msgs

  first, active = [], []  # conversations: entries whose first prompt fits max_len
  for i, (_, e) in enumerate(entries):
    ids = chat.vocab.encode(render_chat(user_turn(e, 0), tools=e["function"],
                                        add_generation_prompt=True,
                                        enable_thinking=chat.thinking))
    length[i] = len(ids)
    if len(ids) + cfg.max_new_tokens > cfg.max_len:
      outcome[i] = "context"
      continue
    first.append(Turn(ids, cfg.max_new_tokens))
    active.append(i)

  def next_turn(i: int, ids: list[int]) -> Turn | None:
    if length[i] + len(ids) + cfg.max_new_tokens > cfg.max_len:
      outcome[i] = "context"
      return None
    length[i] += len(ids)
    return Turn(ids, cfg.max_new_tokens)

  def respond(outputs):
    nxt = {}
    for c, (toks, _, finished) in outputs.items():
      i = active[c]
      e = entries[i][1]
      length[i] += len(toks)
      text = chat.vocab.decode(toks)
      responses[i][-1].append(text)
      close = ([] if finished else [eos]) + chat.turn_end()
      try:
        calls = decode_calls(text, unsafe)
      except Exception:  # pylint: disable=broad-except  (BFCL ends the turn)
        calls = []
      t = None
      if calls:
        results, _ = execute_multi_turn_func_call(
            calls, e["initial_config"], e["involved_classes"], name[i], e["id"],
            long_context="long_context" in e["id"], is_evaL_run=False)
        steps[i] += 1
        if steps[i] > cfg.max_steps:
          outcome[i] = "force_quit"
        else:
          tool = render_chat([{"role": "tool", "content": r} for r in results])
          t = next_turn(i, close + chat.vocab.encode(tool) + chat.assistant_prefix())
      elif turn[i] + 1 < len(e["question"]):
        turn[i] += 1
        steps[i] = 0
        responses[i].append([])
        user = chat.vocab.encode(render_chat(user_turn(e, turn[i])))
        t = next_turn(i, close + user + chat.assistant_prefix())
      nxt[c] = t
      if t is None:
        done[0] += 1
        if progress is not None:
          progress(done[0], len(active))
    return nxt

  try:
    keys = sample_keys(cfg.seed, len(entries) // cfg.samples, cfg.samples)
    converse(policy, cfg, first, [keys[i] for i in active], respond,
             max_len=cfg.max_len)
  finally:
    for n in name:
      _forget(n)
  records, by_category = [], {c: [] for c in cfg.categories}
  for i, (category, e) in enumerate(entries):
    if outcome[i] == "context":
      verdict = {"valid": False, "error_type": "context",
                 "error_message": f"the transcript needs more than max_len={cfg.max_len} tokens"}
    else:  # a forced quit before the last turn leaves fewer turns: BFCL fails it
      verdict = judge(e, responses[i], name[i], unsafe)
    by_category[category].append(float(verdict["valid"]))
    records.append({"id": e["id"], "category": category, "valid": verdict["valid"],
                    "outcome": outcome[i], "error_type": verdict["error_type"],
                    "error_message": verdict["error_message"],
                    "calls": verdict.get("decoded"), "tokens": length[i],
                    "texts": [[cfg.clip(t) for t in turn_] for turn_ in responses[i]]})
  scores = {c: mean(v) for c, v in by_category.items()}
  scores["accuracy"] = mean(list(scores.values()))
  return SuiteResult(scores, records)
