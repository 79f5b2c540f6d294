import random

NAMES = ('Ada', 'Bo', 'Cy', 'Di', 'Ed', 'Flo', 'Gus', 'Hal')


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
