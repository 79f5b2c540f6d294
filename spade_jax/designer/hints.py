"""Privileged hints for the hinted arm of regret estimation.

Two sources, chosen by name (:data:`HINT_SOURCES`):

* ``"policy"``: the policy reads the program (``prompts.hint_prompt``) and writes a hint;
  :func:`clean_hint` turns its raw reply into hint text.
* ``"program"``: the environment's own ``hint()`` method, called in the sandbox by the
  episode runner; :func:`clean_hint` normalises it too.

Either way, :func:`hint_leaks` flags a hint that spells out the solution's literal action
sequence, which would turn regret into a measure of copying rather than of learnability.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from spade_jax.registry import names

HINT_SOURCES = names("policy", "program", kind="hint source", field="selfplay.hint_source")
_SEPARATOR = r"(?:\W|_|\b(?:then|and|next|after that|followed by)\b)*"


def clean_hint(text: str | None, max_chars: int = 1_000) -> str | None:
  """Extracts a usable hint from a model reply or an env's ``hint()`` output.

  Drops ``<think>`` blocks, takes the last ``<hint>...</hint>`` if present, strips code
  fences and a leading "Hint:" label, collapses blank lines and cuts at a word boundary.

  Args:
    text: the raw text.
    max_chars: the longest hint kept.

  Returns:
    The hint, or None if nothing usable remains.
  """
  if not text:
    return None
  text = re.sub(r"<think>.*?</think>", " ", str(text), flags=re.DOTALL)
  text = re.sub(r"<think>.*", " ", text, flags=re.DOTALL)  # Unclosed thinking.
  tagged = re.findall(r"<hint>(.*?)</hint>", text, flags=re.DOTALL)
  if tagged:
    text = tagged[-1]
  elif "<hint>" in text:
    text = text.rsplit("<hint>", 1)[1]
  text = re.sub(r"```[a-zA-Z]*\n?", "", text)
  text = re.sub(r"^\s*(?:\*\*)?hint(?:\*\*)?\s*:\s*", "", text.strip(), flags=re.IGNORECASE)
  text = re.sub(r"\n\s*\n+", "\n", text).strip()
  if len(text) > max_chars:
    text = text[:max_chars].rsplit(None, 1)[0].rstrip() + " ..."
  return text or None


def _norm(s: str) -> str:
  return re.sub(r"\s+", " ", s.strip().lower())


def hint_leaks(hint: str | None, solution_actions: Sequence[str] | None) -> bool:
  """Whether ``hint`` contains the solution's literal action sequence.

  Matching is case- and whitespace-insensitive. Consecutive actions may be separated by
  punctuation, whitespace or connectives ("then", "and", "next", "followed by"). A
  one-action solution leaks when that action appears as a whole token sequence (so the
  answer "42" leaks in "the answer is 42" but not in "420").

  Args:
    hint: the hint text.
    solution_actions: the env's ``solution()`` for the episode.

  Returns:
    True when the full action sequence appears, in order, in the hint.
  """
  if not hint or not solution_actions:
    return False
  actions = [_norm(a) for a in solution_actions if _norm(a)]
  if not actions:
    return False
  parts = []
  for a in actions:
    esc = re.escape(a).replace(r"\ ", r"\s+")
    left = r"(?<!\w)" if a[0].isalnum() or a[0] == "_" else ""
    right = r"(?!\w)" if a[-1].isalnum() or a[-1] == "_" else ""
    parts.append(left + esc + right)
  pattern = _SEPARATOR.join(parts)
  return re.search(pattern, _norm(hint)) is not None


@dataclasses.dataclass(frozen=True)
class Hint:
  """A hint ready for the hinted arm.

  Attributes:
    text: the hint, or None when no usable hint exists (the hinted arm then falls back to
      the unhinted prompt and regret for that env is not meaningful).
    source: ``"policy"`` or ``"program"``.
    leaked: True if the raw hint spelled out the solution (``text`` is then None).
  """
  text: str | None
  source: str
  leaked: bool = False


def finalize_hint(raw: str | None, source: str, solution_actions: Sequence[str] | None = None,
                  max_chars: int = 1_000) -> Hint:
  """Cleans a raw hint and drops it if it leaks the solution.

  Args:
    raw: model reply (``"policy"``) or ``env.hint()`` output (``"program"``).
    source: one of ``HINT_SOURCES``.
    solution_actions: the env's ``solution()``, if known.
    max_chars: the longest hint kept.

  Returns:
    A :class:`Hint`.
  """
  HINT_SOURCES.check(source)
  text = clean_hint(raw, max_chars=max_chars)
  if text is not None and hint_leaks(text, solution_actions):
    return Hint(None, source, leaked=True)
  return Hint(text, source)

