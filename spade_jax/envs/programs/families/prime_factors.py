import random

PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)


class PrimeFactorsEnv:
  """Each turn the agent names a prime factor of what is left; it is divided out."""

  def __init__(self, max_turns=25, **kwargs):
    self.max_turns = max_turns
    self.number = 1
    self.factors = []  # prime factors of the number, with multiplicity
    self.left = []     # those of the number still left
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    primes = [p for p in PRIMES if p <= MAX_PRIME]
    self.factors = sorted(rng.choice(primes) for _ in range(FACTORS))
    self.left = list(self.factors)
    self.number = 1
    for p in self.left:
      self.number *= p
    self.turn, self.done = 0, False
    return (f"Factor {self.number} into primes. Each turn name one prime factor of the "
            f"number still left, like \\boxed{{2}}; I divide it out. You win when 1 is "
            f"left. Turns: {TURNS}."), {}

  def _rest(self):
    n = 1
    for p in self.left:
      n *= p
    return n

  def _go_on(self, msg, info):
    """An unsolved step's return: lost once TURNS are used, truncated at max_turns."""
    if self.turn >= TURNS:
      self.done = True
      factored = " x ".join(str(p) for p in self.factors)
      return f"{msg} Out of turns; {self.number} = {factored}.", 0.0, True, False, info
    self.done = self.turn >= self.max_turns
    return f"{msg} Turns left: {TURNS - self.turn}.", 0.0, False, self.done, info

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    try:
      p = int(action.strip())
    except ValueError:
      return self._go_on("Answer with one prime number.", {"valid": False})
    if p not in self.left:
      return self._go_on(f"{p} is not a prime factor of {self._rest()}.", {"valid": True})
    self.left.remove(p)
    if not self.left:
      self.done = True
      return f"Correct! {self.number} is fully factored.", 1.0, True, False, {}
    return self._go_on(f"Yes. Left: {self._rest()}.", {"valid": True})

  def solution(self):
    return [str(p) for p in sorted(self.left)]

  def hint(self):
    distinct = sorted(set(self.left))
    return (f"{self._rest()} has {len(distinct)} distinct prime factor(s); the largest is "
            f"{distinct[-1]}. Try small primes first.")
