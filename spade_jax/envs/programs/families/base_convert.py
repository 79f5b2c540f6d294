import random


class BaseConvertEnv:
  """The agent gives the number's digits in base BASE, most significant first."""

  def __init__(self, max_turns=25, **kwargs):
    self.max_turns = max_turns
    self.number = 0
    self.digits = []  # the answer, most significant digit first
    self.given = 0    # digits given correctly so far
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    self.number = n = rng.randint(BASE ** (DIGITS - 1), BASE ** DIGITS - 1)
    self.digits = []
    while n:
      self.digits.insert(0, str(n % BASE))
      n //= BASE
    self.given, self.turn, self.done = 0, 0, False
    return (f"Write {self.number} in base {BASE}. It has {DIGITS} digits; give them one "
            f"per turn, most significant first, like \\boxed{{1}}. Turns: {TURNS}."), {}

  def _go_on(self, msg, info):
    """An unsolved step's return: lost once TURNS are used, truncated at max_turns."""
    if self.turn >= TURNS:
      self.done = True
      return (f"{msg} Out of turns; it was {''.join(self.digits)}.", 0.0, True, False,
              info)
    self.done = self.turn >= self.max_turns
    return (f"{msg} Turns left: {TURNS - self.turn}. Digit {self.given + 1}?", 0.0, False,
            self.done, info)

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    digit = action.strip()
    if digit not in [str(d) for d in range(BASE)]:
      return self._go_on(f"Answer with one digit from 0 to {BASE - 1}.", {"valid": False})
    if digit != self.digits[self.given]:
      return self._go_on(f"No, digit {self.given + 1} is not {digit}.", {"valid": True})
    self.given += 1
    if self.given == DIGITS:
      self.done = True
      text = "".join(self.digits)
      return f"Correct! {self.number} is {text} in base {BASE}.", 1.0, True, False, {}
    return self._go_on(f"Yes, digit {self.given} is {digit}.", {"valid": True})

  def solution(self):
    return self.digits[self.given:]

  def hint(self):
    return (f"The last digit is {self.number % BASE}, the remainder of {self.number} / "
            f"{BASE}. Divide by {BASE} repeatedly; the remainders are the digits, last "
            "first.")
