def _plus(a, b):
  return f"{a} + {b}" if b >= 0 else f"{a} - {-b}"


def work(self):
  t, i = self.terms, SHOWN + self.given
  a, b, c = t[i - 1], t[i - 2], t[i - 3]
  if self.kind == "add":
    return f"{a} - {b} = {a - b}, {_plus(a, a - b)} = {t[i]}"
  if self.kind == "alternate":
    return f"{b} - {c} = {b - c}, {_plus(a, b - c)} = {t[i]}"
  if self.kind == "grow":
    s1, s0 = a - b, b - c
    return f"steps {s0}, {s1}, {s1 + s1 - s0}: {_plus(a, s1 + s1 - s0)} = {t[i]}"
  if self.kind == "double":
    k = a - 2 * b
    return f"{a} - 2 * {b} = {k}, 2 * {a} = {2 * a}, {_plus(2 * a, k)} = {t[i]}"
  return f"{b} + {a} = {t[i]}"
