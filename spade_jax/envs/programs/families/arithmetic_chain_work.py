def work(self):
  prev = self.values[self.stage - 1] if self.stage else self.start
  kind, operand = self.ops[self.stage]
  sign = {"add": "+", "subtract": "-"}.get(kind, "*")
  return f"{prev} {sign} {operand} = {self.values[self.stage]}"
