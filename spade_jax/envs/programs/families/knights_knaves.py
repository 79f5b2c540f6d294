import itertools
import random

NAMES = ('Ada', 'Bo', 'Cy', 'Di', 'Ed', 'Flo', 'Gus', 'Hal')


def _true(stmt, kinds):
  """Whether a statement holds when ``kinds[i]`` says if islander i is a knight."""
  what, a, b = stmt
  if what == "knight":
    return kinds[a]
  if what == "knave":
    return not kinds[a]
  if what == "both":
    return kinds[a] and kinds[b]
  if what == "some_knave":
    return not (kinds[a] and kinds[b])
  if what == "same":
    return kinds[a] == kinds[b]
  return sum(kinds) == a  # "count": exactly a knights


def _say(stmt):
  what, a, b = stmt
  if what in ("knight", "knave"):
    return f"{NAMES[a]} is a {what}."
  if what == "both":
    return f"{NAMES[a]} and {NAMES[b]} are both knights."
  if what == "some_knave":
    return f"At least one of {NAMES[a]} and {NAMES[b]} is a knave."
  if what == "same":
    return f"{NAMES[a]} and {NAMES[b]} are the same kind."
  return f"Exactly {a} of us {'is a knight' if a == 1 else 'are knights'}."


class KnightsKnavesEnv:
  """The agent says, islander by islander, who is a knight and who is a knave."""

  def __init__(self, max_turns=25, **kwargs):
    self.max_turns = max_turns
    self.kinds = []       # True = knight
    self.statements = []  # one (what, a, b) per islander
    self.named = 0        # islanders named correctly so far
    self.turn = 0
    self.done = False

  def _draw(self, rng, speaker):
    others = [i for i in range(PEOPLE) if i != speaker]
    what = rng.choice(("knight", "knave", "both", "some_knave", "same", "count"))
    if what == "count":
      return (what, rng.randint(0, PEOPLE), None)
    a, b = rng.sample(others, 2) if len(others) > 1 else (others[0], others[0])
    return (what, a, b)

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    worlds = list(itertools.product((True, False), repeat=PEOPLE))
    for _ in range(5000):
      kinds = [rng.random() < 0.5 for _ in range(PEOPLE)]
      stmts = []
      for i in range(PEOPLE):
        stmt = self._draw(rng, i)
        while _true(stmt, kinds) != kinds[i]:  # knights say true things, knaves false
          stmt = self._draw(rng, i)
        stmts.append(stmt)
      fits = [w for w in worlds if all(_true(s, w) == w[i] for i, s in enumerate(stmts))]
      if len(fits) == 1:
        break
    self.kinds, self.statements = kinds, stmts
    self.named, self.turn, self.done = 0, 0, False
    said = "\n".join(f"{NAMES[i]} says: {_say(s)}" for i, s in enumerate(stmts))
    return ("Knights always tell the truth; knaves always lie.\n" + said +
            f"\nSay what each is, in the order {', '.join(NAMES[:PEOPLE])}, one per turn: "
            f"\\boxed{{knight}} or \\boxed{{knave}}. Turns: {TURNS}. What is {NAMES[0]}?"), {}

  def _go_on(self, msg, info):
    """An unsolved step's return: lost once TURNS are used, truncated at max_turns."""
    if self.turn >= TURNS:
      self.done = True
      return f"{msg} Out of turns.", 0.0, True, False, info
    self.done = self.turn >= self.max_turns
    return (f"{msg} Turns left: {TURNS - self.turn}. What is {NAMES[self.named]}?", 0.0,
            False, self.done, info)

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    word = action.strip().strip(".").lower()
    if word not in ("knight", "knave"):
      return self._go_on("Answer knight or knave.", {"valid": False})
    name = NAMES[self.named]
    if (word == "knight") != self.kinds[self.named]:
      return self._go_on(f"No, {name} is not a {word}.", {"valid": True})
    self.named += 1
    if self.named == PEOPLE:
      self.done = True
      return "All correct!", 1.0, True, False, {}
    return self._go_on(f"Yes, {name} is a {word}.", {"valid": True})

  def solution(self):
    return ["knight" if k else "knave" for k in self.kinds[self.named:]]

  def hint(self):
    n = sum(self.kinds)
    return (f"There {'is' if n == 1 else 'are'} exactly {n} knight(s). Try each "
            "assignment against every statement.")
