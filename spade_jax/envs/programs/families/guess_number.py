import random


class GuessNumberEnv:
  """The agent guesses a secret integer in [1, HIGH]; each wrong guess says higher or lower."""

  def __init__(self, max_turns=25, **kwargs):
    self.max_turns = max_turns
    self.secret = 1
    self.lo, self.hi = 1, HIGH  # the range the feedback so far leaves open
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    self.secret = rng.randint(1, HIGH)
    self.lo, self.hi = 1, HIGH
    self.turn, self.done = 0, False
    return (f"Guess my integer from 1 to {HIGH}. After a wrong guess I say higher or lower. "
            f"Turns: {TURNS}. Answer like \\boxed{{7}}."), {}

  def _go_on(self, msg, info):
    """An unsolved step's return: lost once TURNS are used, truncated at max_turns."""
    if self.turn >= TURNS:
      self.done = True
      return f"{msg} Out of turns; it was {self.secret}.", 0.0, True, False, info
    self.done = self.turn >= self.max_turns
    return f"{msg} Turns left: {TURNS - self.turn}.", 0.0, False, self.done, info

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    try:
      guess = int(action.strip().replace(",", ""))
    except ValueError:
      return self._go_on(f"Answer with an integer from 1 to {HIGH}.", {"valid": False})
    if guess == self.secret:
      self.done = True
      return f"Correct! It was {self.secret}.", 1.0, True, False, {"turns": self.turn}
    if guess < self.secret:
      self.lo = max(self.lo, guess + 1)
      return self._go_on(f"{guess} is too low.", {"valid": True})
    self.hi = min(self.hi, guess - 1)
    return self._go_on(f"{guess} is too high.", {"valid": True})

  def solution(self):
    # Halve the range the feedback leaves open until the midpoint is the secret.
    lo, hi, out = self.lo, self.hi, []
    while True:
      mid = (lo + hi) // 2
      out.append(str(mid))
      if mid == self.secret:
        return out
      lo, hi = (mid + 1, hi) if mid < self.secret else (lo, mid - 1)

  def hint(self):
    lo = max(1, self.secret - HIGH // 8)
    hi = min(HIGH, lo + HIGH // 4)
    return (f"The secret is {'even' if self.secret % 2 == 0 else 'odd'} and lies between "
            f"{lo} and {hi}. Guess the middle of what is still possible.")
