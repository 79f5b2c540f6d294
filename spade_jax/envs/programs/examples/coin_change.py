import random


class CoinChangeEnv:
  """Pay an amount with the fewest coins from a seeded coin system."""

  def __init__(self, max_turns: int = 25, **kwargs):
    self.max_turns = max_turns

  def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
    rng = random.Random(seed)
    self.coins = sorted(rng.sample(range(2, 30), 4) + [1])
    self.amount = rng.randint(40, 120)
    self.best = self._fewest()
    self.turns = 0
    return (f"Coins: {self.coins}. Pay exactly {self.amount} with as few coins as possible. "
            "Answer with the coin values separated by '+'."), {}

  def _fewest(self) -> list[int]:
    best = [[]] + [None] * self.amount
    for a in range(1, self.amount + 1):
      options = [best[a - c] + [c] for c in self.coins if c <= a and best[a - c] is not None]
      best[a] = min(options, key=len) if options else None
    return best[self.amount]

  def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
    self.turns += 1
    truncated = self.turns >= self.max_turns
    try:
      used = [int(x) for x in action.split("+")]
    except ValueError:
      return "Use the form 5+5+1.", 0.0, False, truncated, {}
    if sum(used) != self.amount or any(c not in self.coins for c in used):
      return "That does not pay the amount with the given coins.", 0.0, False, truncated, {}
    if len(used) == len(self.best):
      return "Optimal.", 1.0, True, False, {}
    return f"Valid, but {len(used)} coins is not the fewest.", 0.0, False, truncated, {}

  def solution(self) -> list[str]:
    return ["+".join(map(str, self.best))]

  def hint(self) -> str:
    return "Greedy choice can fail here; compute the fewest coins for every smaller amount first."
