"""Recover a hidden height order from pairwise clues (the built-in ordering_puzzle).

The agent names the people from tallest to shortest, one per turn. Difficulty: more
people, clues worded both ways ("shorter than"), redundant distractor clues, fewer wrong
answers allowed.
"""

from spade_jax.envs.families.base import Family, Knob

_NAMES = ("Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal")

_BODY = r'''
import random

NAMES = @NAMES@


class OrderingEnv:
  """Clues say who is taller than whom; the agent names the next tallest each turn."""

  def __init__(self, max_turns=25, **kwargs):
    self.max_turns = max_turns
    self.order = []  # tallest first
    self.clues = []
    self.placed = 0  # people named correctly so far
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    self.order = rng.sample(NAMES[:PEOPLE], PEOPLE)
    # Neighbouring pairs pin the order down; EXTRA implied pairs only add reading.
    pairs = [(i, i + 1) for i in range(PEOPLE - 1)]
    far = [(i, j) for i in range(PEOPLE) for j in range(i + 2, PEOPLE)]
    pairs += rng.sample(far, min(EXTRA, len(far)))
    rng.shuffle(pairs)
    self.clues = []
    for i, j in pairs:
      a, b = self.order[i], self.order[j]
      if MIXED and rng.random() < 0.5:
        self.clues.append(f"{b} is shorter than {a}.")
      else:
        self.clues.append(f"{a} is taller than {b}.")
    self.placed, self.turn, self.done = 0, 0, False
    return ("People: " + ", ".join(NAMES[:PEOPLE]) + ".\nClues:\n" + "\n".join(self.clues) +
            f"\nName them from tallest to shortest, one per turn, like \\boxed{{{NAMES[0]}}}. "
            f"Turns: {TURNS}. Who is tallest?"), {}

  def _go_on(self, msg, info):
    """An unsolved step's return: lost once TURNS are used, truncated at max_turns."""
    if self.turn >= TURNS:
      self.done = True
      return (f"{msg} Out of turns; the order was {', '.join(self.order)}.", 0.0, True,
              False, info)
    self.done = self.turn >= self.max_turns
    return (f"{msg} Turns left: {TURNS - self.turn}. Who is number {self.placed + 1}?", 0.0,
            False, self.done, info)

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    name = action.strip().strip(".").capitalize()
    if name not in self.order:
      return self._go_on("Name one person: " + ", ".join(NAMES[:PEOPLE]) + ".",
                         {"valid": False})
    if name != self.order[self.placed]:
      return self._go_on(f"No, {name} is not number {self.placed + 1}.", {"valid": True})
    self.placed += 1
    if self.placed == PEOPLE:
      self.done = True
      return "Correct order!", 1.0, True, False, {}
    return self._go_on(f"Yes, {name} is number {self.placed}.", {"valid": True})

  def solution(self):
    return self.order[self.placed:]

  def hint(self):
    return (f"The shortest is {self.order[-1]}. Start from the person nobody is said to be "
            "taller than.")
'''.replace("@NAMES@", repr(_NAMES))

FAMILY = Family(
    name="ordering",
    skill="logical deduction",
    title="Recover a hidden height order from pairwise clues, one person per turn.",
    knobs=(
        Knob("PEOPLE", (3, 4, 5, 6, 7), 3, 8, "people to order"),
        Knob("MIXED", (0, 0, 1, 1, 1), 0, 1, "1: clues also say 'shorter than'"),
        Knob("EXTRA", (0, 0, 1, 1, 2), 0, 4, "redundant clues implied by the others"),
        Knob("SLACK", (2, 2, 1, 1, 0), 0, 6, "wrong answers allowed"),
    ),
    body=_BODY,
    turns=lambda k: k["PEOPLE"] + k["SLACK"],
    perturb=lambda rng, action, k: rng.choice(_NAMES[:k["PEOPLE"]]),
)
