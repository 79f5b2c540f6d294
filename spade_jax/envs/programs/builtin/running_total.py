"""Multi-step arithmetic: track a running value through a chain of operations."""

import random

_OPS = ("+", "-", "*")


class ArithmeticChainEnv:
  """Each turn reveals one operation; the agent reports the running value."""

  def __init__(self, max_turns=25, num_ops=4, **kwargs):
    self.max_turns = max_turns
    self.num_ops = num_ops
    self.start = 0
    self.ops = []
    self.values = []
    self.stage = 0
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    self.start = rng.randint(2, 30)
    self.ops, self.values = [], []
    value = self.start
    for _ in range(self.num_ops):
      op = rng.choice(_OPS)
      operand = rng.randint(2, 9) if op == "*" else rng.randint(3, 60)
      value = value + operand if op == "+" else value - operand if op == "-" else value * operand
      self.ops.append((op, operand))
      self.values.append(value)
    self.stage, self.turn, self.done = 0, 0, False
    return (f"Start with {self.start}. I will give you {self.num_ops} operations one at a "
            f"time; after each, answer with the current value as \\boxed{{N}}.\n"
            f"Operation 1: {self._describe(0)}"), {}

  def _describe(self, i):
    op, operand = self.ops[i]
    return {"+": "add", "-": "subtract", "*": "multiply by"}[op] + f" {operand}"

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    out_of_turns = self.turn >= self.max_turns
    try:
      answer = int(action.strip().replace(",", ""))
    except ValueError:
      answer = None
    if answer != self.values[self.stage]:
      self.done = out_of_turns
      return (f"Incorrect value after operation {self.stage + 1}. Try again.", 0.0, False,
              out_of_turns, {"stage": self.stage})
    self.stage += 1
    if self.stage == self.num_ops:
      self.done = True
      return f"Correct! The final value is {self.values[-1]}.", 1.0, True, False, {}
    self.done = out_of_turns
    return (f"Correct. Operation {self.stage + 1}: {self._describe(self.stage)}", 0.0, False,
            out_of_turns, {"stage": self.stage})

  def solution(self):
    return [str(v) for v in self.values]

  def hint(self):
    return "The running values are: " + ", ".join(str(v) for v in self.values) + "."
