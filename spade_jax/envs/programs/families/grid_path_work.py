def work(self):
  (r, c), (gr, gc) = self.pos, self.goal
  return f"P row {r} col {c}, G row {gr} col {gc}"
