import collections
import itertools
import random

DIGITS = "123456789"[:COLORS]


def _score(guess, secret):
  """(digits in the right place, right digits in the wrong place)."""
  exact = sum(a == b for a, b in zip(guess, secret))
  common = sum((collections.Counter(guess) & collections.Counter(secret)).values())
  return exact, common - exact


class CodeBreakerEnv:
  """Each turn the agent guesses the code and hears how close the guess was."""

  def __init__(self, max_turns=25, **kwargs):
    self.max_turns = max_turns
    self.secret = ""
    self.history = []  # (guess, score) of every answered guess
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    self.history, best = [], ("1" * LENGTH, 1)
    for _ in range(200):  # a secret solution() finds in exactly GUESSES guesses
      self.secret = "".join(rng.choice(DIGITS) for _ in range(LENGTH))
      n = len(self.solution())
      if best[1] < n <= GUESSES:
        best = (self.secret, n)
      if n == GUESSES:
        break
    self.secret = best[0]
    self.turn, self.done = 0, False
    return (f"Find my code: {LENGTH} digits from 1 to {COLORS}, repeats allowed. For each "
            "guess I say how many digits are in the right place and how many others are "
            "right but misplaced. A guess that contradicts my answers wastes the turn. "
            f"Guess like \\boxed{{{'1' * LENGTH}}}. Turns: {TURNS}."), {}

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
    guess = action.strip().replace(" ", "")
    if len(guess) != LENGTH or any(c not in DIGITS for c in guess):
      return self._go_on(f"Guess {LENGTH} digits from 1 to {COLORS}.", {"valid": False})
    for g, said in self.history:
      if _score(guess, g) != said:
        return self._go_on(f"{guess} contradicts my answer to {g}.", {"valid": True})
    if guess == self.secret:
      self.done = True
      return f"Correct! The code is {self.secret}.", 1.0, True, False, {}
    said = _score(guess, self.secret)
    self.history.append((guess, said))
    return self._go_on(f"{guess}: {said[0]} in the right place, {said[1]} misplaced.",
                       {"valid": True})

  def solution(self):
    # Guess the first code (in counting order) that fits all feedback so far.
    seen, out = list(self.history), []
    for code in itertools.product(DIGITS, repeat=LENGTH):
      code = "".join(code)
      if all(_score(code, g) == s for g, s in seen):
        out.append(code)
        if code == self.secret:
          return out
        seen.append((code, _score(code, self.secret)))
    return out

  def hint(self):
    return (f"The code starts with {self.secret[0]} and has {len(set(self.secret))} "
            "different digit(s). Guess only codes that fit every answer.")
