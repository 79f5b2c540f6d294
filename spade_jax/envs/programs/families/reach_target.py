import collections
import random

POOL = ('+1', '+2', '+3', '+5', '+7', '-1', '-2', '-3', '*2', '*3')  # the operations an instance offers are drawn from these
LIMIT = 200    # routes stay within [0, LIMIT]


def _apply(value, op):
  n = int(op[1:])
  return value + n if op[0] == "+" else value - n if op[0] == "-" else value * n


class ReachTargetEnv:
  """Each turn the agent applies one offered operation to the value; reach the target."""

  def __init__(self, max_turns=25, **kwargs):
    self.max_turns = max_turns
    self.ops = []
    self.value = self.target = 0
    self.turn = 0
    self.done = False

  def _route(self, src):
    """A shortest list of operations from ``src`` to the target (BFS), or None."""
    prev = {src: None}
    queue = collections.deque([src])
    while queue:
      cur = queue.popleft()
      if cur == self.target:
        out = []
        while prev[cur] is not None:
          cur, op = prev[cur]
          out.append(op)
        return out[::-1]
      for op in self.ops:
        nxt = _apply(cur, op)
        if 0 <= nxt <= LIMIT and nxt not in prev:
          prev[nxt] = (cur, op)
          queue.append(nxt)
    return None

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    best = None
    for _ in range(200):
      start = rng.randint(1, 12)
      ops = rng.sample(POOL, CHOICES)
      dist, queue = {start: 0}, collections.deque([start])
      while queue:  # BFS distances from the start
        cur = queue.popleft()
        for op in ops:
          nxt = _apply(cur, op)
          if 0 <= nxt <= LIMIT and nxt not in dist:
            dist[nxt] = dist[cur] + 1
            queue.append(nxt)
      exact = sorted(v for v, d in dist.items() if d == DEPTH)
      if exact:
        best = (start, ops, rng.choice(exact))
        break
      far = max(dist, key=lambda v: (dist[v], v))
      if best is None or dist[far] > dist.get(best[2], 0):
        best = (start, ops, far)  # fallback: the farthest target seen (shorter route)
    self.value, self.ops, self.target = best
    self.turn, self.done = 0, False
    return (f"Start at {self.value}; reach {self.target}. Each turn apply one operation: "
            f"{', '.join(self.ops)} (answer like \\boxed{{{self.ops[0]}}}). "
            f"Turns: {TURNS}."), {}

  def _go_on(self, msg, info):
    """An unsolved step's return: lost once TURNS are used, truncated at max_turns."""
    if self.turn >= TURNS:
      self.done = True
      return f"{msg} Out of turns.", 0.0, True, False, info
    self.done = self.turn >= self.max_turns
    return f"{msg} Turns left: {TURNS - self.turn}.", 0.0, False, self.done, info

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    op = action.strip().replace(" ", "").replace("x", "*").replace("\u00d7", "*")
    if op not in self.ops:
      return self._go_on(f"Use one of: {', '.join(self.ops)}.", {"valid": False})
    self.value = _apply(self.value, op)
    if self.value == self.target:
      self.done = True
      return f"Reached {self.target}!", 1.0, True, False, {}
    return self._go_on(f"Now {self.value}; target {self.target}.", {"value": self.value})

  def solution(self):
    return self._route(self.value) or []

  def hint(self):
    route = self._route(self.value) or []
    return (f"It can be done in {len(route)} operations; the last one is "
            f"{route[-1] if route else '?'}. Work backwards from {self.target}.")
