import itertools
import random

NAMES = ('Ada', 'Bo', 'Cy', 'Di', 'Ed', 'Flo', 'Gus')
PETS = ('cat', 'dog', 'fish', 'bird', 'frog', 'horse', 'goat')


class PetOwnersEnv:
  """Clues say who owns or does not own which pet; the agent names each one's pet."""

  def __init__(self, max_turns=25, **kwargs):
    self.max_turns = max_turns
    self.owns = []   # the pet of each person
    self.clues = []
    self.named = 0   # people whose pet was named correctly so far
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    pets = PETS[:PEOPLE]
    self.owns = rng.sample(pets, PEOPLE)
    facts = [(i, p, True) for i, p in enumerate(self.owns)]
    rng.shuffle(facts)
    clues = facts[:GIVEN]
    left = [w for w in itertools.permutations(pets)
            if all((w[i] == p) == yes for i, p, yes in clues)]
    nots = [(i, p, False) for i in range(PEOPLE) for p in pets if p != self.owns[i]]
    rng.shuffle(nots)
    for i, p, yes in nots:  # add "does not own" clues that rule something out
      keep = [w for w in left if w[i] != p]
      if len(left) > 1 and len(keep) < len(left):
        clues.append((i, p, yes))
        left = keep
    rng.shuffle(clues)
    self.clues = [f"{NAMES[i]} {'owns' if yes else 'does not own'} the {p}."
                  for i, p, yes in clues]
    self.named, self.turn, self.done = 0, 0, False
    return (f"{', '.join(NAMES[:PEOPLE])} each own a different pet: {', '.join(pets)}.\n"
            "Clues:\n" + "\n".join(self.clues) + f"\nName each person's pet, in that "
            f"order, one per turn, like \\boxed{{{pets[0]}}}. Turns: {TURNS}. What does "
            f"{NAMES[0]} own?"), {}

  def _go_on(self, msg, info):
    """An unsolved step's return: lost once TURNS are used, truncated at max_turns."""
    if self.turn >= TURNS:
      self.done = True
      return f"{msg} Out of turns.", 0.0, True, False, info
    self.done = self.turn >= self.max_turns
    return (f"{msg} Turns left: {TURNS - self.turn}. What does {NAMES[self.named]} own?",
            0.0, False, self.done, info)

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    pet = action.strip().strip(".").lower().replace("the ", "")
    if pet not in PETS[:PEOPLE]:
      return self._go_on("Name one pet: " + ", ".join(PETS[:PEOPLE]) + ".", {"valid": False})
    name = NAMES[self.named]
    if pet != self.owns[self.named]:
      return self._go_on(f"No, {name} does not own the {pet}.", {"valid": True})
    self.named += 1
    if self.named == PEOPLE:
      self.done = True
      return "All correct!", 1.0, True, False, {}
    return self._go_on(f"Yes, {name} owns the {pet}.", {"valid": True})

  def solution(self):
    return self.owns[self.named:]

  def hint(self):
    return (f"{NAMES[PEOPLE - 1]} owns the {self.owns[-1]}. A pet that all but one person "
            "does not own belongs to that one person.")
