import collections
import random

MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


class GridPathEnv:
  """Each turn the agent moves one cell (U/D/L/R); reach the goal G."""

  def __init__(self, max_turns=25, **kwargs):
    self.max_turns = max_turns
    self.walls = set()
    self.pos = self.goal = (0, 0)
    self.turn = 0
    self.done = False

  def _routes(self, src):
    """Cell -> a shortest list of moves from ``src`` to it (BFS over open cells)."""
    routes, queue = {src: ""}, collections.deque([src])
    while queue:
      cur = queue.popleft()
      for m, (dr, dc) in MOVES.items():
        nxt = (cur[0] + dr, cur[1] + dc)
        if nxt not in routes and self._open(nxt):
          routes[nxt] = routes[cur] + m
          queue.append(nxt)
    return routes

  def _open(self, cell):
    return 0 <= cell[0] < SIZE and 0 <= cell[1] < SIZE and cell not in self.walls

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    cells = [(r, c) for r in range(SIZE) for c in range(SIZE)]
    for _ in range(100):  # else the last try's farthest cell (a shorter route)
      self.walls = set(rng.sample(cells, SIZE * SIZE * WALLS // 100))
      self.pos = rng.choice([x for x in cells if x not in self.walls])
      routes = self._routes(self.pos)
      goals = [x for x in routes if len(routes[x]) == STEPS]
      if goals:
        break
    self.goal = rng.choice(goals or [max(routes, key=lambda x: len(routes[x]))])
    self.turn, self.done = 0, False
    return ("Move from P to G (# is a wall, . is open; rows go down, columns right):\n" +
            self._render() + "\nEach turn send one move: U, D, L or R, like \\boxed{R}. "
            f"Hitting a wall or the edge wastes the turn. Turns: {TURNS}."), {}

  def _render(self):
    return "\n".join("".join("P" if (r, c) == self.pos else "G" if (r, c) == self.goal
                             else "#" if (r, c) in self.walls else "."
                             for c in range(SIZE)) for r in range(SIZE))

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
    move = action.strip().upper()
    if move not in MOVES:
      return self._go_on("Send one move: U, D, L or R.", {"valid": False})
    nxt = (self.pos[0] + MOVES[move][0], self.pos[1] + MOVES[move][1])
    if not self._open(nxt):
      return self._go_on(self._render() + "\nBlocked.", {"valid": True})
    self.pos = nxt
    if self.pos == self.goal:
      self.done = True
      return "You reached the goal!", 1.0, True, False, {}
    return self._go_on(self._render() + f"\nMoved {move}.", {"valid": True})

  def solution(self):
    return list(self._routes(self.pos)[self.goal])

  def hint(self):
    route = self._routes(self.pos)[self.goal]
    return f"The goal is {len(route)} moves away; the first move is {route[0]}."
