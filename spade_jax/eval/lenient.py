r"""Lenient and strict answer reading for procedural tasks, in plain standard-library code.

This module's whole source is also the scoring code of the single-turn task programs
(`selfplay.rlve.task_program` with ``scoring="lenient"``), which run in the sandbox: so
it imports nothing but ``re``, and the reward a program pays equals what held-out
evaluation (`eval.procedural`) counts for the same text.

Two readings of a completion (only the text after the last ``</think>`` counts):

- **strict**: the content of the last balanced ``\boxed{}``, the format every prompt
  asks for;
- **lenient**: the answer wherever it reasonably is: ``\boxed{}``, else
  ``<answer>...</answer>``, else the value after the last "answer is" / "answer:" /
  "result is" / "equals" phrase, else the text after the last "=", else the last number
  in the text.

Two answers are the same when their stripped texts are equal, or when both read as
numbers (commas, a leading "+", leading zeros and trailing ".0" tolerated, as
reasoning-gym's decimal scorer does) of equal value.
"""

import re

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
_PHRASE = re.compile(r"(?:answer\s+is|answer\s*:|result\s+is|equals|is equal to)\s*[:=]?\s*",
                     re.IGNORECASE)


def visible_text(text):
  """The text after the last ``</think>``; "" when a ``<think>`` is never closed."""
  if "</think>" in text:
    return text.rsplit("</think>", 1)[1]
  if "<think>" in text:
    return text.split("<think>", 1)[0]
  return text


def boxed(text):
  r"""Stripped content of the last balanced ``\boxed{...}`` (to the end if unclosed)."""
  found = last_boxed(text)
  return None if found is None else found.strip()


def last_boxed(text):
  r"""Content of the last balanced ``\boxed{...}`` in ``text`` (to the end if unclosed)."""
  start = text.rfind("\\boxed{")
  if start < 0:
    return None
  i = j = start + len("\\boxed{")
  depth = 1
  while j < len(text):
    if text[j] == "{":
      depth += 1
    elif text[j] == "}":
      depth -= 1
      if depth == 0:
        return text[i:j]
    j += 1
  return text[i:]


def answer_tag(text):
  """Content of the last complete ``<answer>...</answer>``, or None."""
  end = text.rfind("</answer>")
  if end < 0:
    return None
  start = text.rfind("<answer>", 0, end)
  return None if start < 0 else text[start + len("<answer>"):end]


def final_answer(text):
  r"""(answer, how): the stripped last ``\boxed{}`` ("boxed"), else ``<answer>`` ("tag"),
  of the text after thinking; (None, "none") when there is neither."""
  visible = visible_text(text)
  found = boxed(visible)
  if found is not None:
    return found, "boxed"
  tagged = answer_tag(visible)
  if tagged is not None:
    return tagged.strip(), "tag"
  return None, "none"


def _first_number(text):
  match = _NUMBER.search(text)
  return match.group(0) if match else None


def _last_number(text):
  found = _NUMBER.findall(text)
  return found[-1] if found else None


def lenient_answer(text):
  """(answer, how) read leniently; how is "boxed", "tag", "phrase", "equals", "number"
  or "none" (answer None)."""
  found, how = final_answer(text)
  if found is not None:
    return found, how
  text = visible_text(text)
  phrases = list(_PHRASE.finditer(text))
  if phrases:
    rest = text[phrases[-1].end():]
    value = _first_number(rest)
    if value is not None:
      return value, "phrase"
    line = rest.strip().splitlines()[0].strip().rstrip(".") if rest.strip() else ""
    if line:
      return line, "phrase"
  if "=" in text:
    value = _first_number(text.rsplit("=", 1)[1])
    if value is not None:
      return value, "equals"
  value = _last_number(text)
  if value is not None:
    return value, "number"
  return None, "none"


def strict_answer(text):
  r"""The last ``\boxed{}`` of the visible text, or None."""
  return boxed(visible_text(text))


def as_number(text):
  """The float a numeric answer reads as, or None."""
  if text is None:
    return None
  t = text.strip().replace(",", "").rstrip(".")
  if t.startswith("+"):
    t = t[1:]
  if not re.fullmatch(r"-?\d+(?:\.\d*)?|-?\.\d+", t):
    return None
  try:
    return float(t)
  except ValueError:
    return None


def same_answer(answer, gold):
  """Whether ``answer`` (None: no answer) says ``gold``."""
  if answer is None:
    return False
  if answer.strip() == gold.strip():
    return True
  a, g = as_number(answer), as_number(gold)
  return a is not None and g is not None and a == g


def score(text, gold):
  """{"lenient": bool, "strict": bool, "answer": str | None, "how": str} for one
  completion against the gold answer."""
  answer, how = lenient_answer(text)
  return {"lenient": same_answer(answer, gold),
          "strict": same_answer(strict_answer(text), gold),
          "answer": answer, "how": how}
