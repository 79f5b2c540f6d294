r"""The library's one reader of answers and actions in model text (standard library only).

Every place that reads an answer or an action out of a completion uses these functions:
the sandbox worker (what a program's ``step`` receives), held-out evaluation
(``eval.answers``, ``eval.lenient``: the same function objects) and the reward of the
single-turn task programs, which embed this module's whole source
(``eval.answers.scoring_source()``): so it imports nothing but ``re``.

Readings of a completion:

- **visible text**: only the text after the last ``</think>`` counts; a completion cut
  inside its thinking has none;
- **boxed**: the content of the last balanced ``\boxed{...}`` (nested braces kept, to the
  end of the text when it is never closed);
- **final answer**: the stripped boxed answer of the visible text, else the content of the
  last complete ``<answer>...</answer>``;
- **lenient**: the answer wherever it reasonably is: the final answer, else the value after
  the last "answer is" / "answer:" / "result is" / "equals" phrase, else the text after the
  last "=", else the last number in the text;
- **tool call**: the stripped text inside the last complete ``<tool_call>...</tool_call>``
  outside complete ``<think>...</think>`` blocks.

Two answers are the same when their stripped texts are equal, or when both read as numbers
(commas, a leading "+", leading zeros and trailing ".0" tolerated, as reasoning-gym's
decimal scorer does) of equal value.
"""

import re

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
_PHRASE = re.compile(r"(?:answer\s+is|answer\s*:|result\s+is|equals|is equal to)\s*[:=]?\s*",
                     re.IGNORECASE)
_BOX = "\\boxed{"


def visible_text(text):
  """The text after the last ``</think>``; "" when a ``<think>`` is never closed."""
  if "</think>" in text:
    return text.rsplit("</think>", 1)[1]
  if "<think>" in text:
    return text.split("<think>", 1)[0]
  return text


def last_boxed(text):
  r"""Content of the last balanced ``\boxed{...}`` in ``text`` (to the end if unclosed)."""
  start = text.rfind(_BOX)
  if start < 0:
    return None
  i = j = start + len(_BOX)
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


def boxed(text):
  r"""Stripped content of the last balanced ``\boxed{...}`` (to the end if unclosed)."""
  found = last_boxed(text)
  return None if found is None else found.strip()


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


def without_think(text):
  """``text`` without its complete ``<think>...</think>`` blocks."""
  out = []
  i = 0
  while True:
    start = text.find("<think>", i)
    end = text.find("</think>", start + 7) if start >= 0 else -1
    if end < 0:
      out.append(text[i:])
      return "".join(out)
    out.append(text[i:start])
    i = end + len("</think>")


def last_tool_call(text):
  """Stripped content of the last complete ``<tool_call>...</tool_call>`` outside
  complete ``<think>`` blocks, or None."""
  text = without_think(text)
  found = None
  i = 0
  while True:
    start = text.find("<tool_call>", i)
    if start < 0:
      return found
    end = text.find("</tool_call>", start + 11)
    if end < 0:
      return found
    found = text[start + 11:end].strip()
    i = end + 12


def program_action(text, mode):
  r"""What a program's ``step`` receives for the agent's turn ``text`` in action ``mode``.

  "boxed": the stripped content of the last ``\boxed{...}``, else the stripped text;
  "tool_call": the last tool call's text, else the stripped text; "raw": ``text``.
  """
  if mode == "boxed":
    found = last_boxed(text)
    return found.strip() if found is not None else text.strip()
  if mode == "tool_call":
    call = last_tool_call(text)
    return call if call is not None else text.strip()
  return text
