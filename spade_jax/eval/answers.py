r"""Reading answers out of completions, and checking math answers with math-verify.

Suites ask for the final answer in ``\boxed{}``: the SPADE agent is trained on games whose
actions are the content of the last ``\boxed{}`` of its turn (the sandbox's "boxed" action
mode), so held-out evaluation asks in the format the policy was trained to answer in.
``<answer>...</answer>`` (Reasoning Gym's own prompt format) is accepted when a completion
has no ``\boxed{}``. Only the text after the last ``</think>`` counts: a completion cut
inside its thinking has no answer.
"""

from __future__ import annotations

import functools
import inspect
import re
import threading

from spade_jax.sandbox.worker import actions

_CODE_BLOCK = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
# "Answer: C", "the answer is (B)", "**Answer:** D": the letter itself must be upper case.
_ANSWER_LINE = re.compile(r"(?i:answer)(?:\s+(?i:is))?\s*[:：]?\s*\**\s*\(?([A-Z])\b")


# The readers are the library's one parser, `sandbox.worker.actions` (standard library only),
# whose source is also the scoring code of the sandboxed task programs: one parser for the
# sandbox's actions, evaluation and training rewards.
strip_thinking = actions.visible_text
last_boxed = actions.last_boxed
answer_tag = actions.answer_tag
final_answer = actions.final_answer


@functools.lru_cache(maxsize=1)
def scoring_source() -> str:
  r"""The source task programs embed to read and score answers: the whole module
  :mod:`spade_jax.sandbox.worker.actions` (``final_answer``, ``strict_answer``, ``score``
  and the readers they use), which imports nothing but ``re``."""
  return inspect.getsource(actions)


def choice_letter(text: str, letters: str = "ABCD") -> str | None:
  r"""The chosen option: the first option letter in the last ``\boxed{}``, else the last
  "Answer: X" line, of the text after thinking."""
  visible = strip_thinking(text)
  boxed = last_boxed(visible)
  if boxed is not None:
    m = re.search(rf"\b([{letters}])\b", boxed.replace("\\text{", " ").replace("}", " "))
    if m:
      return m.group(1)
  found = [m.group(1) for m in _ANSWER_LINE.finditer(visible) if m.group(1) in letters]
  return found[-1] if found else None


def extract_code(text: str, language: str = "python") -> str | None:
  """The last fenced code block of the text after thinking: the last one tagged
  ``language`` if any, else the last untagged one; None when there is none."""
  blocks = _CODE_BLOCK.findall(strip_thinking(text))
  tagged = [code for tag, code in blocks if tag.lower() in (language, language[:2])]
  if tagged:
    return tagged[-1]
  plain = [code for tag, code in blocks if not tag]
  return plain[-1] if plain else None


def math_equal(gold: str, completion: str, timeout_s: int = 5) -> bool:
  r"""Whether ``completion``'s final answer equals ``gold`` under math-verify.

  The gold answer is parsed as LaTeX math; the prediction is the completion after
  thinking (math-verify prefers its last ``\boxed{}``). math-verify's timeouts use
  ``SIGALRM``, which only the main thread may set: elsewhere they are off.
  """
  from math_verify import parse, verify  # pylint: disable=g-import-not-at-top
  main = threading.current_thread() is threading.main_thread()
  t = timeout_s if main else None
  gold_parsed = parse(gold if "$" in gold or "\\boxed" in gold else f"${gold}$",
                      parsing_timeout=t)
  pred = parse(strip_thinking(completion), parsing_timeout=t)
  if not gold_parsed or not pred:
    return False
  return bool(verify(gold_parsed, pred, timeout_seconds=t))
