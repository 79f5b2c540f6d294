"""The program host: one env program's namespace and instance, and the request loop.

Standard library only (see ``__main__.py``). Requests are ``load``, ``reset``, ``step``,
``call`` (an optional method) and ``ping``; values are checked against the env contract
here and again in the parent.

Action passing: the caller always sends the agent's raw turn text; the program's ``step``
receives :func:`actions.program_action` of it in the program's action mode. "auto" picks
"raw" for reference-style programs, recognised by their source parsing ``boxed`` itself
(:func:`parses_boxed`), else "boxed".
"""

import builtins
import math
import os

from . import actions
from . import wire

OPTIONAL_METHODS = ("solution", "hint", "work")


class Reject(Exception):
  """A contract breach or limit hit, answered as ``ok: false`` with a reason."""

  def __init__(self, reason, detail):
    super().__init__(detail)
    self.reason = reason
    self.detail = detail


class SpadeContractError(Exception):
  """Raised by program-side code the library ships (the tool-use harness) for a breach of
  the contract it checks; answered with reason "contract" and the message alone.

  Programs see it as the global ``SpadeContractError``.
  """


_PARSE_CALLS = frozenset({
    "search", "match", "fullmatch", "findall", "finditer", "compile", "sub", "split",
    "rsplit", "find", "rfind", "index", "rindex", "startswith", "endswith", "partition",
    "rpartition", "replace", "count"})


def _mentions_boxed(node):
  import ast  # pylint: disable=import-outside-toplevel
  for sub in ast.walk(node):
    if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and "boxed" in sub.value:
      return True
  return False


def parses_boxed(source):
  """Whether a program extracts ``\\boxed{...}`` from actions itself.

  True when a string mentioning "boxed" is searched for or matched (re.*,
  str.find/split/..., ``in``), or a function has "boxed" in its name; a
  program that merely tells the agent to answer in \\boxed{} is not.
  """
  if "boxed" not in source:
    return False
  import ast  # pylint: disable=import-outside-toplevel
  try:
    tree = ast.parse(source)
  except SyntaxError:
    return True
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "boxed" in node.name.lower():
      return True
    if isinstance(node, ast.Call):
      f = node.func
      name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
      if name in _PARSE_CALLS and (
          any(_mentions_boxed(a) for a in node.args)
          or (isinstance(f, ast.Attribute) and _mentions_boxed(f.value))):
        return True
    if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn))
                                             for op in node.ops):
      if _mentions_boxed(node.left):
        return True
  return False


def _params(fn):
  """(parameter names, accepts **kwargs, positional count) of a callable."""
  if fn is object.__init__:
    return ("self",), False, 1
  fn = getattr(fn, "__func__", fn)
  code = getattr(fn, "__code__", None)
  if code is None:
    try:
      import inspect  # pylint: disable=import-outside-toplevel
      params = inspect.signature(fn).parameters.values()
    except (ImportError, TypeError, ValueError):
      return (), False, 1
    names = tuple(p.name for p in params)
    varkw = any(p.kind == p.VAR_KEYWORD for p in params)
    positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    return names, varkw, positional + 1
  n = code.co_argcount + code.co_kwonlyargcount
  names = code.co_varnames[:n]
  return names, bool(code.co_flags & 0x08), code.co_argcount


def _check_str(value, what, cap):
  if type(value) is not str:
    raise Reject("contract", "%s must be str, got %s" % (what, type(value).__name__))
  if len(value) > cap:
    raise Reject("output_too_large", "%s has %d characters; the cap is %d"
                 % (what, len(value), cap))
  return value


def _check_info(value, what):
  if not isinstance(value, dict):
    raise Reject("contract", "%s must be dict, got %s" % (what, type(value).__name__))
  return {str(k): v for k, v in value.items()}


def _check_bool(value, what):
  if type(value) is not bool:
    raise Reject("contract", "%s must be bool, got %s" % (what, type(value).__name__))
  return value


def _describe(value):
  if isinstance(value, tuple):
    return "tuple of %d (%s)" % (len(value), ", ".join(type(v).__name__ for v in value))
  return type(value).__name__


def _program_traceback(exc):
  lines = []
  tb = exc.__traceback__
  while tb is not None:
    code = tb.tb_frame.f_code
    if code.co_filename == "<env_program>":
      lines.append("line %d in %s" % (tb.tb_lineno, code.co_name))
    tb = tb.tb_next
  lines = lines[-4:]
  text = "%s: %s" % (type(exc).__name__, exc)
  if lines:
    text += " (at " + "; ".join(lines) + ")"
  return text[-2000:]


class Host:
  """Owns the program's namespace and its single env instance."""

  def __init__(self, cfg):
    self.cfg = cfg
    self.obs_cap = int(cfg["max_observation_chars"])
    self.env = None
    self.action_mode = "boxed"
    self.reset_mode = "options"

  def load(self, req):
    source = req["source"]
    namespace = {"__name__": "env_program", "__builtins__": builtins,
                 "SpadeContractError": SpadeContractError}
    code = compile(source, "<env_program>", "exec")
    exec(code, namespace)  # pylint: disable=exec-used
    want = req.get("class_name")
    candidates = [v for k, v in namespace.items()
                  if isinstance(v, type) and k.endswith("Env")
                  and getattr(v, "__module__", None) == "env_program"]
    cls = None
    if want and isinstance(namespace.get(want), type):
      cls = namespace[want]
    else:
      for c in reversed(candidates):
        if callable(getattr(c, "reset", None)) and callable(getattr(c, "step", None)):
          cls = c
          break
    if cls is None:
      raise Reject("contract", "no class whose name ends in 'Env' with reset() "
                   "and step() methods was defined; found %s"
                   % ([getattr(c, "__name__", "?") for c in candidates] or "none"))
    for name in ("reset", "step"):
      if not callable(getattr(cls, name, None)):
        raise Reject("contract", "%s has no %s() method" % (cls.__name__, name))
    names, varkw, _ = _params(cls.__init__)
    kwargs = dict(req.get("kwargs") or {})
    kwargs["max_turns"] = int(req.get("max_turns", 25))
    if not varkw:
      kwargs = {k: v for k, v in kwargs.items() if k in names}
    self.env = cls(**kwargs)
    names, varkw, argc = _params(cls.reset)
    if varkw or "options" in names:
      self.reset_mode = "options"
    elif "seed" in names or argc >= 2:
      self.reset_mode = "seed"
    else:
      self.reset_mode = "none"
    mode = req.get("action_mode") or "auto"
    if mode == "auto":
      mode = "raw" if parses_boxed(source) else "boxed"
    self.action_mode = mode
    return {
        "class_name": cls.__name__,
        "has_solution": callable(getattr(self.env, "solution", None)),
        "has_hint": callable(getattr(self.env, "hint", None)),
        "action_mode": mode,
        "reset_mode": self.reset_mode,
        "pid": os.getpid(),
        "uid": os.getuid(),
        "layers": self.cfg.get("_layers", {}),
    }

  def reset(self, req):
    seed = req.get("seed")
    if self.reset_mode == "options":
      out = self.env.reset(seed=seed, options=req.get("options"))
    elif self.reset_mode == "seed":
      out = self.env.reset(seed)
    else:
      out = self.env.reset()
    if not isinstance(out, tuple) or len(out) != 2:
      raise Reject("contract", "reset() must return (observation: str, info: dict), "
                   "got %s" % _describe(out))
    return [_check_str(out[0], "reset() observation", self.obs_cap),
            _check_info(out[1], "reset() info")]

  def step(self, req):
    action = req.get("action")
    if not isinstance(action, str):
      action = str(action)
    out = self.env.step(actions.program_action(action, self.action_mode))
    if not isinstance(out, tuple) or len(out) != 5:
      raise Reject("contract", "step() must return (observation, reward, terminated, "
                   "truncated, info), got %s" % _describe(out))
    obs, reward, terminated, truncated, info = out
    obs = _check_str(obs, "step() observation", self.obs_cap)
    if type(reward) not in (int, float):
      raise Reject("contract", "step() reward must be float, got %s" % type(reward).__name__)
    reward = float(reward)
    if not math.isfinite(reward) or not -1.0 <= reward <= 1.0:
      raise Reject("contract", "step() reward must be finite and in [-1, 1], got %r" % reward)
    return [obs, reward, _check_bool(terminated, "step() terminated"),
            _check_bool(truncated, "step() truncated"), _check_info(info, "step() info")]

  def call(self, req):
    method = req.get("method")
    if method not in OPTIONAL_METHODS:
      raise Reject("contract", "method %r is not callable through the sandbox; expected "
                   "one of %s" % (method, list(OPTIONAL_METHODS)))
    fn = getattr(self.env, method, None)
    if not callable(fn):
      raise Reject("contract", "%s defines no %s() method" % (type(self.env).__name__, method))
    out = fn()
    if method in ("hint", "work"):
      return _check_str(out, method + "()", self.obs_cap)
    if not isinstance(out, (list, tuple)):
      raise Reject("contract", "solution() must return list[str], got %s" % _describe(out))
    if len(out) > 10000:
      raise Reject("output_too_large", "solution() returned %d actions" % len(out))
    return [_check_str(a, "solution() action", self.obs_cap) for a in out]


def _failure(rid, op, e):
  """The failure reply for an exception ``e`` raised while handling ``op``."""
  if isinstance(e, Reject):
    return {"id": rid, "ok": False, "reason": e.reason, "detail": e.detail}
  if isinstance(e, SpadeContractError):
    return {"id": rid, "ok": False, "reason": "contract", "detail": str(e)[:2000]}
  if isinstance(e, MemoryError):
    return {"id": rid, "ok": False, "reason": "memory",
            "detail": "the program exceeded its memory limit"}
  if isinstance(e, SyntaxError) and op == "load":
    return {"id": rid, "ok": False, "reason": "syntax",
            "detail": "%s (line %s)" % (e.msg, e.lineno)}
  return {"id": rid, "ok": False, "reason": "crash", "detail": _program_traceback(e)}


def serve(rfd, wfd, cfg):
  """Answers framed requests until EOF, then exits."""
  max_bytes = int(cfg["max_message_bytes"])
  host = Host(cfg)
  handlers = {"load": host.load, "reset": host.reset, "step": host.step,
              "call": host.call, "ping": lambda req: "pong"}
  while True:
    req = wire.recv(rfd, max_bytes)
    if req is None:
      os._exit(0)
    rid = req.get("id")
    op = req.get("op")
    try:
      if op not in ("load", "ping") and host.env is None:
        raise Reject("contract", "no program loaded")
      if op == "load" and host.env is not None:
        raise Reject("contract", "this worker already hosts an env")
      handler = handlers.get(op)
      if handler is None:
        raise Reject("contract", "unknown op %r" % (op,))
      reply = {"id": rid, "ok": True, "value": handler(req)}
    except BaseException as e:  # pylint: disable=broad-except
      reply = _failure(rid, op, e)
    wire.send(wfd, reply, max_bytes)
