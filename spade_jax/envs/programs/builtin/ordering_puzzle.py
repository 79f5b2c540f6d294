"""Logical deduction: recover a hidden order from pairwise clues."""

import random

_NAMES = ("Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal")


class OrderingPuzzleEnv:
  """Clues say who is taller than whom; the agent names everyone, tallest first."""

  def __init__(self, max_turns=25, num_people=4, **kwargs):
    self.max_turns = max_turns
    self.num_people = num_people
    self.order = []
    self.clues = []
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    self.order = rng.sample(_NAMES, self.num_people)
    pairs = [(self.order[i], self.order[i + 1]) for i in range(self.num_people - 1)]
    i, j = sorted(rng.sample(range(self.num_people), 2))
    if j - i > 1:
      pairs.append((self.order[i], self.order[j]))
    rng.shuffle(pairs)
    self.clues = [f"{a} is taller than {b}." for a, b in pairs]
    self.turn, self.done = 0, False
    names = sorted(self.order)
    return ("People: " + ", ".join(names) + ".\nClues:\n" + "\n".join(self.clues) +
            "\nList everyone from tallest to shortest, comma separated, as "
            "\\boxed{A, B, C, ...}."), {}

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    out_of_turns = self.turn >= self.max_turns
    guess = [p.strip().capitalize() for p in action.replace(";", ",").split(",") if p.strip()]
    if sorted(guess) != sorted(self.order):
      self.done = out_of_turns
      return ("Name each person exactly once: " + ", ".join(sorted(self.order)) + ".", 0.0,
              False, out_of_turns, {"valid": False})
    if guess == self.order:
      self.done = True
      return "Correct order!", 1.0, True, False, {}
    right = sum(g == o for g, o in zip(guess, self.order))
    self.done = out_of_turns
    return (f"Not quite: {right} of {self.num_people} are in the right place.", 0.0, False,
            out_of_turns, {"in_place": right})

  def solution(self):
    return [", ".join(self.order)]

  def hint(self):
    return f"The tallest is {self.order[0]} and the shortest is {self.order[-1]}."
