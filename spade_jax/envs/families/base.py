"""What a procedural env family is: knobs, difficulty levels and a program renderer.

A :class:`Family` renders complete games-setting env programs (source strings, run only
in the sandbox like designer-written ones) from integer knob values. The values are
baked into the source as module-level constants, so a rendered program is
self-contained and a designer-like text could name them::

  fam = FAMILIES["grid_path"]
  fam.levels(2)              # {"SIZE": 5, "WALLS": 20, "DEPTH": 7, "SLACK": 2}
  src = fam.program(SIZE=6)  # unset knobs take their medium value
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Mapping

# Difficulty levels run 0 (easiest) .. NUM_LEVELS - 1 (hardest); MEDIUM is the default.
NUM_LEVELS = 5
MEDIUM = 2
LEVEL_NAMES = ("easiest", "easy", "medium", "hard", "hardest")


@dataclasses.dataclass(frozen=True)
class Knob:
  """One integer difficulty knob of a family.

  Attributes:
    name: the module-level constant it becomes in the program (upper case).
    levels: its value at each difficulty level, easiest first (NUM_LEVELS values).
    low: smallest value :meth:`Family.program` accepts.
    high: largest value :meth:`Family.program` accepts.
    doc: what the knob changes.
  """
  name: str
  levels: tuple[int, ...]
  low: int
  high: int
  doc: str

  def __post_init__(self):
    if not self.name.isupper() or not self.name.isidentifier():
      raise ValueError(f"knob name {self.name!r} must be an upper-case identifier")
    if len(self.levels) != NUM_LEVELS:
      raise ValueError(f"knob {self.name} has {len(self.levels)} levels; expected "
                       f"{NUM_LEVELS}")
    if not all(self.low <= v <= self.high for v in self.levels):
      raise ValueError(f"knob {self.name} levels {self.levels} leave [{self.low}, "
                       f"{self.high}]")


@dataclasses.dataclass(frozen=True)
class Family:
  """A parameterised games-setting env program.

  Attributes:
    name: registry name (also the program's file-like name).
    skill: one of ``SKILLS["games"]``.
    title: one line saying what the game is (the program's docstring).
    knobs: the difficulty knobs, in the order they are rendered.
    body: the program after its knob constants: imports, helpers and the ``...Env``
      class, which reads the constants (and ``TURNS``) as globals (the shipped families
      load it with ``envs.programs.load_program(name)``).
    turns: knob values -> the most turns an episode can last (the game's own turn
      budget, rendered as the constant ``TURNS``); play with ``max_turns >=`` this.
    perturb: (rng, intended action, knob values) -> a random plausible action, used by
      the noisy scripted solver in place of the intended one (it may happen to equal it).
    check: knob values -> None when they make a playable game, else why not.
    work: optional source of a function ``work(self)`` of the env returning a worked step
      for the current state (the local computation behind ``solution()[0]``, e.g.
      ``19 + 7 = 26``; "" where none helps; shipped as program ``<name>_work``). Only
      :meth:`program` with ``worked=True`` renders it, as the env's ``work()`` method, for
      scripted players that show their work; the designer-facing program never has it.
  """
  name: str
  skill: str
  title: str
  knobs: tuple[Knob, ...]
  body: str
  turns: Callable[[Mapping[str, int]], int]
  perturb: Callable[[random.Random, str, Mapping[str, int]], str]
  check: Callable[[Mapping[str, int]], str | None] = lambda knobs: None
  work: str = ""

  @property
  def knob_names(self) -> tuple[str, ...]:
    return tuple(k.name for k in self.knobs)

  def levels(self, level: int | str = MEDIUM) -> dict[str, int]:
    """Knob values of difficulty ``level`` (0..NUM_LEVELS-1, or a LEVEL_NAMES entry)."""
    if isinstance(level, str):
      if level not in LEVEL_NAMES:
        raise ValueError(f"unknown difficulty level {level!r}; expected one of "
                         f"{list(LEVEL_NAMES)} or 0..{NUM_LEVELS - 1}")
      level = LEVEL_NAMES.index(level)
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < NUM_LEVELS:
      raise ValueError(f"difficulty level {level!r}; expected 0..{NUM_LEVELS - 1} or one "
                       f"of {list(LEVEL_NAMES)}")
    return {k.name: k.levels[level] for k in self.knobs}

  def resolve(self, **knobs: int) -> dict[str, int]:
    """All knob values: the given ones (checked) over the medium level's."""
    unknown = sorted(set(knobs) - set(self.knob_names))
    if unknown:
      raise ValueError(f"family {self.name!r} has no knob(s) {unknown}; expected some of "
                       f"{list(self.knob_names)}")
    values = self.levels(MEDIUM)
    for k in self.knobs:
      if k.name not in knobs:
        continue
      v = knobs[k.name]
      if isinstance(v, bool) or not isinstance(v, int) or not k.low <= v <= k.high:
        raise ValueError(f"{self.name}.{k.name}={v!r}; expected an integer in "
                         f"[{k.low}, {k.high}]")
      values[k.name] = v
    why = self.check(values)
    if why:
      raise ValueError(f"{self.name} knobs {values}: {why}")
    return values

  def program(self, worked: bool = False, **knobs: int) -> str:
    """A complete env program with ``knobs`` (others at medium) baked in as constants.

    Deterministic: the same knob values always give the same source. ``worked=True``
    appends the family's ``work`` function as the env class's ``work()`` method (a
    family without one gets a ``work()`` that returns "").
    """
    values = self.resolve(**knobs)
    lines = [f'"""{self.title}"""', "", f"# Difficulty knobs of the {self.name!r} family."]
    for k in self.knobs:
      lines.append(f"{k.name} = {values[k.name]!r}  # {k.doc}")
    lines.append(f"TURNS = {int(self.turns(values))!r}  # turns the game allows")
    source = "\n".join(lines) + "\n\n" + self.body.strip("\n") + "\n"
    if worked:
      cls = re.search(r"^class (\w+)", self.body, re.M)
      if cls is None:
        raise ValueError(f"family {self.name!r}: its body defines no class")
      work = self.work.strip("\n") or "def work(self):\n  return \"\""
      source += f"\n\n{work}\n\n\n{cls.group(1)}.work = work\n"
    return source

  def program_at(self, level: int | str = MEDIUM) -> str:
    """The program of difficulty ``level``."""
    return self.program(**self.levels(level))

  def max_turns(self, **knobs: int) -> int:
    """The game's turn budget (``TURNS``) at ``knobs`` (others at medium)."""
    return int(self.turns(self.resolve(**knobs)))


def shift_int(rng: random.Random, action: str, deltas=(-3, -2, -1, 1, 2, 3)) -> str:
  """A near miss of an integer action (the action itself when it is not an integer)."""
  try:
    return str(int(action) + rng.choice(deltas))
  except ValueError:
    return action


def change_letter(rng: random.Random, action: str,
                  letters: str = "abcdefghijklmnopqrstuvwxyz") -> str:
  """The action with one letter replaced by a different random one."""
  if not action:
    return rng.choice(letters)
  i = rng.randrange(len(action))
  new = rng.choice([c for c in letters if c != action[i]])
  return action[:i] + new + action[i + 1:]


__all__ = ["Family", "Knob", "LEVEL_NAMES", "MEDIUM", "NUM_LEVELS", "change_letter",
           "shift_int"]
