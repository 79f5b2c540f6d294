"""Guess a secret integer with higher/lower feedback."""

import random


class GuessNumberEnv:
  """The agent guesses a secret integer; each wrong guess says higher or lower."""

  def __init__(self, max_turns=25, low=1, high=100, **kwargs):
    self.max_turns = max_turns
    self.low, self.high = low, high
    self.secret = None
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    self.secret = rng.randint(self.low, self.high)
    self.turn = 0
    self.done = False
    return (f"I am thinking of an integer between {self.low} and {self.high}. Guess it. "
            f"You have {self.max_turns} turns. Answer with your guess as \\boxed{{N}}."), {}

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    out_of_turns = self.turn >= self.max_turns
    try:
      guess = int(action.strip().replace(",", ""))
    except ValueError:
      self.done = out_of_turns
      return (f"'{action[:40]}' is not an integer. Guess a number between {self.low} and "
              f"{self.high}.", 0.0, False, out_of_turns, {"valid": False})
    if guess == self.secret:
      self.done = True
      return f"Correct! The number was {self.secret}.", 1.0, True, False, {"turns": self.turn}
    direction = "higher" if guess < self.secret else "lower"
    self.done = out_of_turns
    msg = f"{guess} is wrong; the secret number is {direction}."
    if out_of_turns:
      msg += f" Out of turns; it was {self.secret}."
    return msg, 0.0, False, out_of_turns, {"valid": True}

  def solution(self):
    return [str(self.secret)]

  def hint(self):
    lo = max(self.low, self.secret - 3)
    return f"The secret number is between {lo} and {lo + 6}."
