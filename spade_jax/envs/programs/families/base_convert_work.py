def work(self):
  place = BASE ** (DIGITS - 1 - self.given)
  rest = self.number % (place * BASE)
  digit = rest // place
  return f"{rest} = {digit} * {place} + {rest - digit * place}"
