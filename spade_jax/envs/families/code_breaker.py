"""Break a secret digit code from right-place / wrong-place feedback (Mastermind).

Secrets are drawn so that guessing, each turn, the first code that fits all feedback so
far finds the secret in exactly GUESSES guesses (fewer when 200 draws find no such
secret). A guess that contradicts earlier feedback wastes its turn. Difficulty: longer
codes and more digits to draw from (more codes fit the feedback), more guesses needed,
fewer guesses to spare.
"""

from spade_jax.envs.families.base import Family, Knob, change_letter

_BODY = r'''
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
'''


def _check(k):
  # Guessing the first code that fits all feedback needs at most LENGTH + COLORS - 1
  # guesses (checked over every secret for LENGTH <= 4, COLORS <= 6).
  if k["GUESSES"] > k["LENGTH"] + k["COLORS"] - 1:
    return "GUESSES must be at most LENGTH + COLORS - 1"
  return None


def _perturb(rng, action, k):
  # A near miss: one digit of the intended guess changed.
  return change_letter(rng, action, "".join(str(d) for d in range(1, k["COLORS"] + 1)))


FAMILY = Family(
    name="code_breaker",
    skill="logical deduction",
    title="Break a secret digit code from right-place / wrong-place feedback.",
    knobs=(
        Knob("LENGTH", (3, 3, 4, 4, 4), 2, 4, "digits in the code"),
        Knob("COLORS", (3, 4, 4, 5, 6), 2, 6, "each digit is from 1 to COLORS"),
        Knob("GUESSES", (3, 4, 5, 6, 7), 1, 9, "guesses the scripted strategy needs"),
        Knob("SLACK", (2, 2, 1, 1, 0), 0, 6, "guesses beyond those"),
    ),
    body=_BODY,
    turns=lambda k: k["GUESSES"] + k["SLACK"],
    perturb=_perturb,
    check=_check,
)
