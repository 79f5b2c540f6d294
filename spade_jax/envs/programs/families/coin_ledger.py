import random

NAMES = ('Ada', 'Bo', 'Cy', 'Di', 'Ed', 'Flo', 'Gus', 'Hal')


class CoinLedgerEnv:
  """Everyone starts with some coins and transfers follow; name the richest first."""

  def __init__(self, max_turns=25, **kwargs):
    self.max_turns = max_turns
    self.start = {}
    self.transfers = []  # (giver, receiver, amount)
    self.order = []      # most coins first, after every transfer
    self.placed = 0      # people named correctly so far
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    people = NAMES[:PEOPLE]
    while True:  # redraw until the final amounts are all different
      coins = {p: rng.randint(MAX_AMOUNT, 3 * MAX_AMOUNT) for p in people}
      self.start = dict(coins)
      self.transfers = []
      for _ in range(TRANSFERS):
        giver = rng.choice([p for p in people if coins[p] > 0])
        receiver = rng.choice([p for p in people if p != giver])
        amount = rng.randint(1, min(MAX_AMOUNT, coins[giver]))
        coins[giver] -= amount
        coins[receiver] += amount
        self.transfers.append((giver, receiver, amount))
      if len(set(coins.values())) == PEOPLE:
        break
    self.order = sorted(people, key=lambda p: -coins[p])
    self.coins = coins
    self.placed, self.turn, self.done = 0, 0, False
    ledger = "\n".join(f"{g} gives {r} {a} coins." for g, r, a in self.transfers)
    return ("Coins at the start: " + ", ".join(f"{p} {self.start[p]}" for p in people) +
            f".\nTransfers, in order:\n{ledger}\nAfter all transfers, name the people from "
            f"most coins to fewest, one per turn, like \\boxed{{{NAMES[0]}}}. Turns: {TURNS}. "
            "Who has the most coins?"), {}

  def _go_on(self, msg, info):
    """An unsolved step's return: lost once TURNS are used, truncated at max_turns."""
    if self.turn >= TURNS:
      self.done = True
      return (f"{msg} Out of turns; the order was {', '.join(self.order)}.", 0.0, True,
              False, info)
    self.done = self.turn >= self.max_turns
    return (f"{msg} Turns left: {TURNS - self.turn}. Who is number {self.placed + 1}?", 0.0,
            False, self.done, info)

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    name = action.strip().strip(".").capitalize()
    if name not in self.order:
      return self._go_on("Name one person: " + ", ".join(NAMES[:PEOPLE]) + ".",
                         {"valid": False})
    if name != self.order[self.placed]:
      return self._go_on(f"No, {name} is not number {self.placed + 1}.", {"valid": True})
    self.placed += 1
    if self.placed == PEOPLE:
      self.done = True
      return "Correct order!", 1.0, True, False, {}
    return self._go_on(f"Yes, {name} is number {self.placed}.", {"valid": True})

  def solution(self):
    return self.order[self.placed:]

  def hint(self):
    first = self.transfers[0]
    return (f"Keep a running total per person: after the first transfer {first[0]} has "
            f"{self.start[first[0]] - first[2]} coins. The fewest coins at the end: "
            f"{self.coins[self.order[-1]]}.")
