import random

# Rule kinds, easiest first; an instance draws one of the first RULES.
KINDS = ("add", "alternate", "grow", "double", "sum")
TOLD = {"add": "the same amount is added each time",
        "alternate": "two steps take turns",
        "grow": "the step changes by the same amount each time",
        "double": "each term is twice the previous plus a fixed number",
        "sum": "each term is the sum of the two before it"}


def _terms(kind, rng, n):
  out = [rng.randint(1, 9)]
  d, e = rng.randint(2, 9), rng.randint(2, 5)
  for i in range(1, n):
    x = out[-1]
    if kind == "add":
      x += d
    elif kind == "alternate":
      x += d if i % 2 else -e
    elif kind == "grow":
      x += d + e * (i - 1)
    elif kind == "double":
      x = 2 * x + e - 4
    else:
      x = x + out[-2] if i > 1 else d
    out.append(x)
  return out


class NumberSequenceEnv:
  """The agent gives the next terms of a sequence, one per turn."""

  def __init__(self, max_turns=25, **kwargs):
    self.max_turns = max_turns
    self.kind = KINDS[0]
    self.terms = []  # the shown terms, then the ones to give
    self.given = 0   # terms given correctly so far
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    self.kind = rng.choice(KINDS[:RULES])
    self.terms = _terms(self.kind, rng, SHOWN + ASKED)
    self.given, self.turn, self.done = 0, 0, False
    shown = ", ".join(str(t) for t in self.terms[:SHOWN])
    return (f"A hidden rule makes this sequence: {shown}, ...\nGive the next {ASKED} "
            f"terms, one per turn, like \\boxed{{17}}. Turns: {TURNS}. Next term?"), {}

  def _go_on(self, msg, info):
    """An unsolved step's return: lost once TURNS are used, truncated at max_turns."""
    if self.turn >= TURNS:
      self.done = True
      return f"{msg} Out of turns.", 0.0, True, False, info
    self.done = self.turn >= self.max_turns
    return (f"{msg} Turns left: {TURNS - self.turn}. Term {SHOWN + self.given + 1}?", 0.0,
            False, self.done, info)

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    try:
      answer = int(action.strip().replace(",", ""))
    except ValueError:
      return self._go_on("Answer with an integer.", {"valid": False})
    want = self.terms[SHOWN + self.given]
    if answer != want:
      return self._go_on(f"No, term {SHOWN + self.given + 1} is not {answer}.",
                         {"valid": True})
    self.given += 1
    if self.given == ASKED:
      self.done = True
      return "Correct! You continued the sequence.", 1.0, True, False, {}
    return self._go_on(f"Yes, {answer}.", {"valid": True})

  def solution(self):
    return [str(t) for t in self.terms[SHOWN + self.given:]]

  def hint(self):
    return f"The rule: {TOLD[self.kind]}. Compare neighbouring terms."
