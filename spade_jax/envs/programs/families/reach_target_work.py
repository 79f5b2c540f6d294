def work(self):
  route = self._route(self.value)
  if not route:
    return ""
  op = route[0]
  return f"{self.value} {op[0]} {op[1:]} = {_apply(self.value, op)}, target {self.target}"
