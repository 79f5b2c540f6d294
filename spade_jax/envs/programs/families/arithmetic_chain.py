import random


class ArithmeticChainEnv:
  """Each correct answer reveals the next operation; the agent reports the running value."""

  def __init__(self, max_turns=25, **kwargs):
    self.max_turns = max_turns
    self.start = 0
    self.ops = []     # (word, operand) per operation
    self.values = []  # the running value after each operation
    self.stage = 0    # operations answered correctly so far
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    self.start = value = rng.randint(2, 20)
    kinds = ["add", "subtract"] + (["multiply by"] if MULTIPLY else [])
    self.ops, self.values = [], []
    for _ in range(NUM_OPS):
      kind = rng.choice(kinds)
      if kind == "multiply by":
        operand = rng.randint(2, 3)
        value *= operand
      else:
        operand = rng.randint(2, MAX_OPERAND)
        value = value + operand if kind == "add" else value - operand
      self.ops.append((kind, operand))
      self.values.append(value)
    self.stage, self.turn, self.done = 0, 0, False
    return (f"Start with {self.start}. I give {NUM_OPS} operations one at a time; after each, "
            f"answer the current value like \\boxed{{12}}. Turns: {TURNS}.\n"
            f"Operation 1: {self._describe(0)}"), {}

  def _describe(self, i):
    kind, operand = self.ops[i]
    return f"{kind} {operand}"

  def _go_on(self, msg, info):
    """An unsolved step's return: lost once TURNS are used, truncated at max_turns."""
    if self.turn >= TURNS:
      self.done = True
      return f"{msg} Out of turns.", 0.0, True, False, info
    self.done = self.turn >= self.max_turns
    return f"{msg} Turns left: {TURNS - self.turn}.", 0.0, False, self.done, info

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    try:
      answer = int(action.strip().replace(",", ""))
    except ValueError:
      return self._go_on("Answer with an integer.", {"valid": False})
    if answer != self.values[self.stage]:
      return self._go_on(f"Wrong value after operation {self.stage + 1}.",
                         {"stage": self.stage})
    self.stage += 1
    if self.stage == NUM_OPS:
      self.done = True
      return f"Correct! The final value is {self.values[-1]}.", 1.0, True, False, {}
    return self._go_on(f"Correct. Operation {self.stage + 1}: {self._describe(self.stage)}.",
                       {"stage": self.stage})

  def solution(self):
    return [str(v) for v in self.values[self.stage:]]

  def hint(self):
    return (f"After operation 1 the value is {self.values[0]}; the final value is "
            f"{self.values[-1]}. Apply each operation to the previous value.")
