def work(self):
  total = self.lo + self.hi
  return f"{self.lo} + {self.hi} = {total}, {total} / 2 = {total // 2}"
