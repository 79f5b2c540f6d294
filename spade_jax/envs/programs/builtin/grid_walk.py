"""Spatial reasoning: walk from S to G on a small grid with walls."""

import collections
import random

_MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
_WORDS = {"UP": "U", "DOWN": "D", "LEFT": "L", "RIGHT": "R"}


class GridPathEnv:
  """Each turn the agent sends one or more moves (U/D/L/R) to reach the goal."""

  def __init__(self, max_turns=25, size=5, wall_fraction=0.25, **kwargs):
    self.max_turns = max_turns
    self.size = size
    self.wall_fraction = wall_fraction
    self.walls = set()
    self.pos = self.start = self.goal = (0, 0)
    self.turn = 0
    self.done = False

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    n = self.size
    while True:
      cells = [(r, c) for r in range(n) for c in range(n)]
      self.start, self.goal = rng.sample(cells, 2)
      if abs(self.start[0] - self.goal[0]) + abs(self.start[1] - self.goal[1]) < n - 1:
        continue
      free = [x for x in cells if x not in (self.start, self.goal)]
      self.walls = set(rng.sample(free, int(self.wall_fraction * len(free))))
      if self._path(self.start) is not None:
        break
    self.pos, self.turn, self.done = self.start, 0, False
    return ("Move from S to G on this grid (# is a wall, . is open):\n" + self._render() +
            "\nRows go down, columns go right. Each turn send one or more moves from "
            "U, D, L, R, e.g. \\boxed{RRD}. Hitting a wall or the edge wastes the move."), {}

  def _render(self):
    rows = []
    for r in range(self.size):
      row = ""
      for c in range(self.size):
        x = (r, c)
        row += ("P" if x == self.pos and self.turn else "S" if x == self.start else
                "G" if x == self.goal else "#" if x in self.walls else ".")
      rows.append(row)
    return "\n".join(rows)

  def _path(self, src):
    prev = {src: None}
    queue = collections.deque([src])
    while queue:
      cur = queue.popleft()
      if cur == self.goal:
        moves = []
        while prev[cur] is not None:
          cur, move = prev[cur]
          moves.append(move)
        return moves[::-1]
      for move, (dr, dc) in _MOVES.items():
        nxt = (cur[0] + dr, cur[1] + dc)
        if nxt not in prev and self._open(nxt):
          prev[nxt] = (cur, move)
          queue.append(nxt)
    return None

  def _open(self, cell):
    return 0 <= cell[0] < self.size and 0 <= cell[1] < self.size and cell not in self.walls

  def step(self, action):
    if self.done:
      return "The game is over.", 0.0, True, False, {}
    self.turn += 1
    out_of_turns = self.turn >= self.max_turns
    text = action.strip().upper()
    moves = _WORDS.get(text) or text.replace(" ", "").replace(",", "")
    if not moves or any(m not in _MOVES for m in moves):
      self.done = out_of_turns
      return ("Send moves made only of U, D, L, R.", 0.0, False, out_of_turns,
              {"valid": False})
    for m in moves:
      nxt = (self.pos[0] + _MOVES[m][0], self.pos[1] + _MOVES[m][1])
      if self._open(nxt):
        self.pos = nxt
      if self.pos == self.goal:
        self.done = True
        return "You reached the goal!", 1.0, True, False, {}
    self.done = out_of_turns
    return ("Now at P:\n" + self._render(), 0.0, False, out_of_turns, {"pos": list(self.pos)})

  def solution(self):
    return self._path(self.pos)

  def hint(self):
    return "A shortest path from the start is: " + "".join(self._path(self.start)) + "."
