"""A stronger hint audit: does a hint give away the answer a play must give?

:func:`hints.hint_leaks` catches a hint that spells out ``solution()``'s literal action
sequence. :func:`audit_hint` adds two checks, in this order after it:

- ``answer``: the hint holds the final answer, the number (or, for a one-action solution,
  the string) of ``solution()``'s last action, in digits ("105", "1,050", "3.50" for 3.5)
  or in words ("forty-two", "one hundred and five", "two thousand"). A lone digit (0-9) is
  not counted, nor a string under 3 characters: they turn up in any hint.
- ``sequence``: the hint lists at least ``min_share`` (60%) and at least ``min_actions``
  (3) of the solution's actions in order (not necessarily adjacent).

Actions are compared without ``\\boxed{}``, case and extra whitespace, as whole words; number
words in the hint are read as numbers first, so "first three, then five" lists "3", "5".
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from spade_jax.designer.hints import hint_leaks
from spade_jax.sandbox.worker import actions

_UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
          "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000,
           "billion": 1_000_000_000}
_VALUE = {**{w: i for i, w in enumerate(_UNITS)}, **{w: 20 + 10 * i for i, w in enumerate(_TENS)}}
_ALPHA = re.compile(r"[A-Za-z]+")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w]|\.\d)")
KINDS = ("literal", "answer", "sequence")


def number_words(n: int) -> str:
  """``n`` (0 <= n < 10**12) in English words: 42 -> "forty-two", 105 -> "one hundred and
  five"."""
  if not 0 <= n < 10 ** 12:
    raise ValueError(f"number_words({n}): expected 0 <= n < 10**12.")
  if n < 20:
    return _UNITS[n]
  if n < 100:
    return _TENS[n // 10 - 2] + (f"-{_UNITS[n % 10]}" if n % 10 else "")
  if n < 1000:
    rest = n % 100
    return f"{_UNITS[n // 100]} hundred" + (f" and {number_words(rest)}" if rest else "")
  for scale, word in ((10 ** 9, "billion"), (10 ** 6, "million"), (1000, "thousand")):
    if n >= scale:
      head, rest = divmod(n, scale)
      tail = "" if not rest else (f" and {number_words(rest)}" if rest < 100
                                  else f" {number_words(rest)}")
      return f"{number_words(head)} {word}{tail}"
  raise AssertionError(n)


def _parse(run: list[str]) -> int:
  total, current = 0, 0
  for w in run:
    if w in _SCALES:
      scale = _SCALES[w]
      if scale == 100:
        current = max(current, 1) * 100
      else:
        total += max(current, 1) * scale
        current = 0
    else:
      current += _VALUE[w]
  return total + current


def words_to_digits(text: str) -> str:
  """``text`` with each run of English number words replaced by its digits
  ("one hundred and five" -> "105", "forty-two" -> "42")."""
  out, last = [], 0
  tokens = list(_ALPHA.finditer(text))
  i = 0
  while i < len(tokens):
    w = tokens[i].group().lower()
    if w not in _VALUE and w not in _SCALES:
      i += 1
      continue
    run, j, end = [w], i + 1, tokens[i].end()
    while j < len(tokens):
      gap, nxt = text[end:tokens[j].start()], tokens[j].group().lower()
      if nxt == "and" and run[-1] in _SCALES and j + 1 < len(tokens) and \
          tokens[j + 1].group().lower() in _VALUE and \
          text[tokens[j].end():tokens[j + 1].start()].strip() == "":
        if gap.strip():
          break
        j += 1
        end = tokens[j - 1].end()
        continue
      if gap.strip() not in ("", "-") or (nxt not in _VALUE and nxt not in _SCALES):
        break
      prev = run[-1]
      # Two plain numbers in a row ("two three") are two numbers, except tens then a unit.
      if nxt in _VALUE and prev in _VALUE and not (prev in _TENS and 0 < _VALUE[nxt] < 10):
        break
      if nxt in _SCALES and prev in _SCALES and _SCALES[nxt] <= _SCALES[prev]:
        break
      run.append(nxt)
      end = tokens[j].end()
      j += 1
    out.append(text[last:tokens[i].start()])
    out.append(str(_parse(run)))
    last, i = end, j
  out.append(text[last:])
  return "".join(out)


def normalise_action(action: str) -> str:
  """An action without ``\\boxed{}``, case and extra whitespace."""
  a = str(action).strip()
  inner = actions.last_boxed(a)
  if inner is not None and a == "\\boxed{" + inner + "}":  # the whole action is one box
    a = inner
  return re.sub(r"\s+", " ", a.strip().strip("'\"").lower())


def _as_number(s: str) -> float | None:
  s = s.replace(",", "").strip()
  if re.fullmatch(r"-?\d+(?:\.\d+)?", s):
    return float(s)
  return None


def _numbers(text: str) -> list[float]:
  text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
  return [abs(float(m.group())) for m in _NUMBER.finditer(text)]


def _phrase_positions(text: str, phrase: str) -> list[int]:
  if not phrase:
    return []
  left = r"(?<!\w)" if phrase[0].isalnum() or phrase[0] == "_" else ""
  right = r"(?!\w)" if phrase[-1].isalnum() or phrase[-1] == "_" else ""
  pattern = left + re.escape(phrase).replace(r"\ ", r"\s+") + right
  return [m.start() for m in re.finditer(pattern, text)]


def answer_leak(hint: str | None, solution_actions: Sequence[str] | None) -> str | None:
  """The final answer as the hint states it, or None (see the module)."""
  if not hint or not solution_actions:
    return None
  final = normalise_action(solution_actions[-1])
  text = words_to_digits(hint).lower()
  value = _as_number(final)
  if value is not None:
    if value == int(value) and abs(value) < 10:
      return None
    if abs(value) in _numbers(text):
      return final
    return None
  if len(solution_actions) == 1 and len(final) >= 3 and _phrase_positions(text, final):
    return final
  return None


def sequence_leak(hint: str | None, solution_actions: Sequence[str] | None,
                  min_share: float = 0.6, min_actions: int = 3) -> int:
  """How many of the solution's actions the hint lists in order, when that is at least
  ``min_share`` of them and at least ``min_actions``; else 0."""
  if not hint or not solution_actions:
    return 0
  actions = [normalise_action(a) for a in solution_actions]
  if len(actions) < min_actions:
    return 0
  text = re.sub(r"\s+", " ", words_to_digits(hint).lower())
  chains: list[tuple[int, int]] = []  # (position, length of the best chain ending there)
  best = 0
  for a in actions:
    new = []
    for p in _phrase_positions(text, a):
      length = 1 + max((n for q, n in chains if q < p), default=0)
      new.append((p, length))
      best = max(best, length)
    chains += new
  return best if best >= min_actions and best >= min_share * len(actions) else 0


@dataclasses.dataclass(frozen=True)
class HintAudit:
  """What a hint gives away.

  Attributes:
    leaked: it gives the solution away.
    kind: "literal", "answer" or "sequence" (:data:`KINDS`), or None.
    detail: what was found (the answer, or how many actions in order).
  """

  leaked: bool = False
  kind: str | None = None
  detail: str = ""


def audit_hint(hint: str | None, solution_actions: Sequence[str] | None,
               min_share: float = 0.6, min_actions: int = 3) -> HintAudit:
  """The literal, answer and sequence checks, in that order (see the module)."""
  if hint_leaks(hint, solution_actions):
    return HintAudit(True, "literal", f"all {len(solution_actions)} action(s) verbatim")
  answer = answer_leak(hint, solution_actions)
  if answer is not None:
    return HintAudit(True, "answer", f"states the answer {answer!r}")
  n = sequence_leak(hint, solution_actions, min_share, min_actions)
  if n:
    return HintAudit(True, "sequence", f"lists {n} of {len(solution_actions)} actions in order")
  return HintAudit()


__all__ = ["HintAudit", "KINDS", "answer_leak", "audit_hint", "normalise_action",
           "number_words", "sequence_leak", "words_to_digits"]
