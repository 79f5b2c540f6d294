r"""The RLVE-style baseline (docs/METHOD.md §7): procedural tasks under a difficulty controller.

Task families are reasoning-gym datasets with a curriculum (difficulty knobs). Per family
the :class:`DifficultyController` keeps a window ``[l, h]`` of levels; a problem draws its
level uniformly from the window; after ``attempts`` (128) plays at the top level ``h`` the
accuracy is checked, and at ``>= accuracy`` (0.9) ``h`` rises by one and
``l = max(l, h - (window - 1))`` (window 4: ``h - 3``); the counters restart after every
check, as in RLVE's own manager. A play is one attempt, so a 16-play group at level ``h``
counts 16. ``h`` stops at the family's hardest curriculum level.

**How a task becomes an env program.** reasoning-gym is trusted library code, so the
problem (question and answer) is generated on the host, and :func:`task_program` writes a
small single-turn games program with both as string literals; the program runs in the
sandbox like any other, so no model-written text is scored in the trainer process. Its
parser is the library's one answer parser itself, embedded in the program
(``eval.answers.scoring_source()``; ``final_answer``: text after the last ``</think>``,
the last balanced ``\boxed{}``, else ``<answer>...</answer>``, stripped); because it parses
``boxed`` itself the sandbox hands it the raw turn (action mode "auto" -> "raw"). Reward 1.0
exactly when that answer equals the oracle answer, else 0.0: the
full-credit case of reasoning-gym's default ``score_answer`` (its partial credit for an
answer that merely contains the oracle is dropped: rewards, accuracy and the held-out
win rate all count exact answers only). Only families that keep the default scorer are
accepted (:func:`check_family`), so the program reproduces the family's scoring exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from spade_jax.envs.programs import load_program
from spade_jax.eval.answers import scoring_source
from spade_jax.eval.procedural import check_family, generate, held_out_tasks, max_level
from spade_jax.eval.rgym import PROMPT

# 16 families, as the reference ships 16 (docs/METHOD.md §7): reasoning-gym datasets with a
# curriculum, the default exact-match scorer, an answer on one line without trailing
# spaces or braces, and questions of at most a few thousand characters at every level.
DEFAULT_FAMILIES = (
    "basic_arithmetic", "gcd", "lcm", "count_bits", "leg_counting",   # arithmetic
    "simple_equations", "simple_geometry",                            # algebra, geometry
    "base_conversion", "count_primes", "letter_counting",             # algorithmic
    "word_sequence_reversal", "binary_alternation", "string_splitting",
    "number_sequence", "aiw", "maze",                                 # cognition, logic, games
)


SCORINGS = ("exact", "lenient")


@dataclasses.dataclass(frozen=True)
class RLVEConfig:
  """The ``rlve`` config section (used when ``selfplay.env_source="rlve"``).

  Attributes:
    families: reasoning-gym dataset names (see :func:`check_family`); each slot's problem
      picks one uniformly.
    attempts: plays at a family's top level ``h`` between accuracy checks (reference 128).
    accuracy: accuracy at the check that raises ``h`` by one (reference 0.9).
    window: levels in a family's window at most; ``l = max(l, h - (window - 1))``
      (reference 4).
    start_level: every family's initial ``l = h``.
    max_level: ``h`` never passes this level (-1: each family's hardest), e.g. 0 with
      start_level 0 trains at one fixed level.
    scoring: how a program reads and scores the answer: "exact" (the reference: the
      last ``\boxed{}``, else ``<answer>``, equal to the oracle answer as a string) or
      "lenient" (``eval.lenient``: the answer wherever it reasonably is, numbers compared
      by value; families with their own decimal scorer allowed). A departure from the
      reference for small models that do not yet write the format.
    held_out_items: the first this many problems of ``eval.procedural.held_out_tasks``
      (families, level ``start_level``, ``held_out_seed``) are never trained on: a
      drawn problem with one of their questions is drawn again (0: no exclusion).
    held_out_seed: the held-out problems' ``data_seed``.
  """

  families: tuple[str, ...] = DEFAULT_FAMILIES
  attempts: int = 128
  accuracy: float = 0.9
  window: int = 4
  start_level: int = 0
  max_level: int = -1
  scoring: str = "exact"
  held_out_items: int = 0
  held_out_seed: int = 0

  def __post_init__(self):
    families = (tuple(f for f in self.families.split(",") if f)
                if isinstance(self.families, str) else tuple(self.families))
    object.__setattr__(self, "families", families)
    if not families or len(set(families)) != len(families):
      raise ValueError(f"rlve.families={families!r}; expected at least one family, each "
                       "named once.")
    if self.attempts < 1 or self.window < 1 or self.start_level < 0:
      raise ValueError(f"rlve: attempts={self.attempts}, window={self.window}, "
                       f"start_level={self.start_level}; expected attempts >= 1, window >= 1 "
                       "and start_level >= 0.")
    if not 0.0 < self.accuracy <= 1.0:
      raise ValueError(f"rlve.accuracy={self.accuracy}; expected a value in (0, 1].")
    if self.scoring not in SCORINGS:
      raise ValueError(f"rlve.scoring={self.scoring!r}; expected one of {SCORINGS}.")
    if self.max_level >= 0 and self.max_level < self.start_level:
      raise ValueError(f"rlve.max_level={self.max_level} < rlve.start_level="
                       f"{self.start_level}; raise max_level or use -1 (no cap).")
    if self.held_out_items < 0:
      raise ValueError(f"rlve.held_out_items={self.held_out_items}; expected >= 0.")


@dataclasses.dataclass
class FamilyWindow:
  """One family's window and the counters of the current check period.

  Attributes:
    low: ``l``, the easiest level drawn.
    high: ``h``, the hardest level drawn.
    max_level: the family's hardest level; ``h`` never passes it.
    attempts: plays at level ``high`` since the last check.
    correct: of those, the solved ones.
  """

  low: int
  high: int
  max_level: int
  attempts: int = 0
  correct: int = 0


class DifficultyController:
  """Per-family difficulty windows ``[l, h]`` moved by accuracy at ``h`` (docs/METHOD.md §7).

  Args:
    max_levels: family -> its hardest level (``h`` stops there).
    attempts: plays at ``h`` per accuracy check.
    accuracy: accuracy that raises ``h`` at a check.
    window: ``l = max(l, h - (window - 1))`` after a raise.
    start_level: initial ``l = h`` (clipped to each family's hardest level).
  """

  def __init__(self, max_levels: Mapping[str, int], *, attempts: int = 128,
               accuracy: float = 0.9, window: int = 4, start_level: int = 0):
    self.attempts, self.accuracy, self.window = attempts, accuracy, window
    self.families = {f: FamilyWindow(min(start_level, m), min(start_level, m), m)
                     for f, m in max_levels.items()}

  def bounds(self, family: str) -> tuple[int, int]:
    """(l, h) of ``family``."""
    w = self.families[family]
    return w.low, w.high

  def draw(self, family: str, rng: np.random.Generator) -> int:
    """A level drawn uniformly from ``family``'s window ``[l, h]``."""
    w = self.families[family]
    return int(rng.integers(w.low, w.high + 1))

  def record(self, family: str, level: int, solved: Sequence[bool]) -> None:
    """Counts the plays of a problem at ``level``; only those at ``h`` are attempts."""
    w = self.families[family]
    if level == w.high:
      w.attempts += len(solved)
      w.correct += int(sum(bool(s) for s in solved))

  def update(self) -> list[str]:
    """Checks every family with ``attempts`` plays at ``h``: at ``accuracy`` or better
    ``h`` rises by one (up to its hardest level) and ``l = max(l, h - (window - 1))``;
    the counters restart either way.

    Returns:
      The families whose ``h`` rose.
    """
    raised = []
    for family, w in self.families.items():
      if w.attempts < self.attempts:
        continue
      if w.correct / w.attempts >= self.accuracy and w.high < w.max_level:
        w.high += 1
        w.low = max(w.low, w.high - (self.window - 1))
        raised.append(family)
      w.attempts = w.correct = 0
    return raised

  def state(self) -> dict[str, Any]:
    return {f: dataclasses.asdict(w) for f, w in self.families.items()}

  def restore(self, state: Mapping[str, Any]) -> None:
    missing = sorted(set(self.families) - set(state))
    if missing:
      raise ValueError(f"The checkpoint's RLVE controller has no state for families "
                       f"{missing}; rlve.families changed since it was written. Resume with "
                       "the same families or start a new workdir.")
    self.families = {f: FamilyWindow(**state[f]) for f in self.families}


def task_program(task: Mapping[str, Any], scoring: str = "exact") -> str:
  """The single-turn env program of a task from :func:`generate` (see the module doc).

  ``scoring`` "exact" (the reference) or "lenient" (see :class:`RLVEConfig`).
  """
  if scoring not in SCORINGS:
    raise ValueError(f"scoring={scoring!r}; expected one of {SCORINGS}.")
  # ANSWER, OBSERVATION and SCORING, then the library's one answer parser itself
  # (`eval.answers.scoring_source()`, standard library only: the answer is read by the very
  # code held-out evaluation uses, so a reward and an evaluation of the same text agree),
  # then the env class (template `rlve_task`).
  return (f'"""RLVE task: reasoning-gym {task["family"]}, level {task["level"]}, '
          f'seed {task["seed"]}."""\n\n'
          f"ANSWER = {task['answer']!r}\n"
          f"OBSERVATION = {PROMPT.format(question=task['question'])!r}\n"
          f"SCORING = {scoring!r}\n\n" + scoring_source() + "\n\n"
          + load_program("rlve_task"))


__all__ = ["DEFAULT_FAMILIES", "DifficultyController", "FamilyWindow", "RLVEConfig",
           "SCORINGS", "check_family", "generate", "held_out_tasks", "max_level",
           "task_program"]
