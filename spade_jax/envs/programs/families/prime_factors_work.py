def work(self):
  rest, p = self._rest(), min(self.left)
  return f"{rest} / {p} = {rest // p}"
