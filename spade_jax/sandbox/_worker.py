"""Sandbox worker: hosts one untrusted environment program in this process.

This file is executed as a standalone script (``python -s -S -P -B _worker.py
CONFIG_JSON``) by :mod:`spade_jax.sandbox.pool`, usually inside bubblewrap or
``unshare`` namespaces. It must import nothing outside the standard library and
nothing from this package, so that a fresh worker starts in a few tens of
milliseconds and the program cannot reach trainer code through ``sys.modules``.

Start-up, in order: take the protocol pipes off fds 0/1 and point fds 0/1/2 at
``/dev/null`` (program output can never corrupt the protocol), apply rlimits,
move into the private scratch directory, pre-import the allow-listed modules,
set ``no_new_privs``, when started as root drop to the per-worker uid, then
confine the process with landlock and seccomp (``_confine.py``, loaded from
next to this file). Then serve framed JSON requests until EOF; the load reply
says which confinement layers are active, or why one is missing.

Frames are a 4-byte big-endian length followed by that many bytes of UTF-8
JSON. Every reply is ``{"id", "ok", "value"}`` or ``{"id", "ok": false,
"reason", "detail"}``; ``reason`` is one of ``spade_jax.sandbox.FAILURES``.

Action passing: the caller always sends the agent's raw turn text. In "boxed"
mode (programs under the spade_jax contract) the program's ``step`` receives
the content of the last ``\\boxed{...}`` in that text, or the stripped text
when there is none. In "raw" mode (reference-style programs, recognised by
their source mentioning ``boxed``, i.e. parsing it themselves) the program
receives the raw text unchanged. In "tool_call" mode (tool-use programs) it
receives the text inside the last complete ``<tool_call>...</tool_call>``
outside ``<think>...</think>`` blocks, stripped, or the stripped text when
there is none.
"""

import json
import math
import os
import resource
import signal
import struct
import sys

_HEADER = struct.Struct(">I")
_OPTIONAL_METHODS = ("solution", "hint")


class _Reject(Exception):
  """A contract breach or limit hit, answered as ``ok: false`` with a reason."""

  def __init__(self, reason, detail):
    super().__init__(detail)
    self.reason = reason
    self.detail = detail


def _read_exact(fd, n):
  chunks = []
  while n:
    chunk = os.read(fd, min(n, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    n -= len(chunk)
  return b"".join(chunks)


def _recv(fd, max_bytes):
  header = _read_exact(fd, _HEADER.size)
  if header is None:
    return None
  (n,) = _HEADER.unpack(header)
  if n > max_bytes:
    os._exit(3)
  body = _read_exact(fd, n)
  if body is None:
    return None
  return json.loads(body.decode("utf-8"))


def _send(fd, obj, max_bytes):
  try:
    data = json.dumps(obj, ensure_ascii=False, default=repr).encode(
        "utf-8", "surrogatepass")
  except (TypeError, ValueError, RecursionError) as e:
    obj = {"id": obj.get("id"), "ok": False, "reason": "contract",
           "detail": "reply is not serialisable: %s" % (e,)}
    data = json.dumps(obj).encode("utf-8")
  if len(data) > max_bytes:
    obj = {"id": obj.get("id"), "ok": False, "reason": "output_too_large",
           "detail": "reply of %d bytes exceeds the %d-byte message cap"
                     % (len(data), max_bytes)}
    data = json.dumps(obj).encode("utf-8")
  view = memoryview(_HEADER.pack(len(data)) + data)
  while view:
    n = os.write(fd, view)
    view = view[n:]


def _last_boxed(text):
  """Content of the last balanced ``\\boxed{...}`` in ``text``, or None."""
  start = text.rfind("\\boxed{")
  if start < 0:
    return None
  i = start + len("\\boxed{")
  depth = 1
  j = i
  while j < len(text):
    c = text[j]
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return text[i:j]
    j += 1
  return text[i:]


def _without_think(text):
  """``text`` without its complete ``<think>...</think>`` blocks."""
  out = []
  i = 0
  while True:
    start = text.find("<think>", i)
    end = text.find("</think>", start + 7) if start >= 0 else -1
    if end < 0:
      out.append(text[i:])
      return "".join(out)
    out.append(text[i:start])
    i = end + len("</think>")


def _last_tool_call(text):
  """Stripped content of the last complete ``<tool_call>...</tool_call>``, or None."""
  text = _without_think(text)
  found = None
  i = 0
  while True:
    start = text.find("<tool_call>", i)
    if start < 0:
      return found
    end = text.find("</tool_call>", start + 11)
    if end < 0:
      return found
    found = text[start + 11:end].strip()
    i = end + 12


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


def _parses_boxed(source):
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
    raise _Reject("contract", "%s must be str, got %s" % (what, type(value).__name__))
  if len(value) > cap:
    raise _Reject("output_too_large", "%s has %d characters; the cap is %d"
                  % (what, len(value), cap))
  return value


def _check_info(value, what):
  if not isinstance(value, dict):
    raise _Reject("contract", "%s must be dict, got %s" % (what, type(value).__name__))
  return {str(k): v for k, v in value.items()}


def _check_bool(value, what):
  if type(value) is not bool:
    raise _Reject("contract", "%s must be bool, got %s" % (what, type(value).__name__))
  return value


class _Host:
  """Owns the program's namespace and its single env instance."""

  def __init__(self, cfg):
    self.cfg = cfg
    self.obs_cap = int(cfg["max_observation_chars"])
    self.env = None
    self.action_mode = "boxed"
    self.reset_mode = "options"

  def load(self, req):
    source = req["source"]
    namespace = {"__name__": "env_program", "__builtins__": __builtins__}
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
      raise _Reject("contract", "no class whose name ends in 'Env' with reset() "
                    "and step() methods was defined; found %s"
                    % ([getattr(c, "__name__", "?") for c in candidates] or "none"))
    for name in ("reset", "step"):
      if not callable(getattr(cls, name, None)):
        raise _Reject("contract", "%s has no %s() method" % (cls.__name__, name))
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
      mode = "raw" if _parses_boxed(source) else "boxed"
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
      raise _Reject("contract", "reset() must return (observation: str, info: dict), "
                    "got %s" % _describe(out))
    return [_check_str(out[0], "reset() observation", self.obs_cap),
            _check_info(out[1], "reset() info")]

  def step(self, req):
    action = req.get("action")
    if not isinstance(action, str):
      action = str(action)
    if self.action_mode == "boxed":
      boxed = _last_boxed(action)
      action = boxed.strip() if boxed is not None else action.strip()
    elif self.action_mode == "tool_call":
      call = _last_tool_call(action)
      action = call if call is not None else action.strip()
    out = self.env.step(action)
    if not isinstance(out, tuple) or len(out) != 5:
      raise _Reject("contract", "step() must return (observation, reward, terminated, "
                    "truncated, info), got %s" % _describe(out))
    obs, reward, terminated, truncated, info = out
    obs = _check_str(obs, "step() observation", self.obs_cap)
    if type(reward) not in (int, float):
      raise _Reject("contract", "step() reward must be float, got %s" % type(reward).__name__)
    reward = float(reward)
    if not math.isfinite(reward) or not -1.0 <= reward <= 1.0:
      raise _Reject("contract", "step() reward must be finite and in [-1, 1], got %r" % reward)
    return [obs, reward, _check_bool(terminated, "step() terminated"),
            _check_bool(truncated, "step() truncated"), _check_info(info, "step() info")]

  def call(self, req):
    method = req.get("method")
    if method not in _OPTIONAL_METHODS:
      raise _Reject("contract", "method %r is not callable through the sandbox; expected "
                    "one of %s" % (method, list(_OPTIONAL_METHODS)))
    fn = getattr(self.env, method, None)
    if not callable(fn):
      raise _Reject("contract", "%s defines no %s() method" % (type(self.env).__name__, method))
    out = fn()
    if method == "hint":
      return _check_str(out, "hint()", self.obs_cap)
    if not isinstance(out, (list, tuple)):
      raise _Reject("contract", "solution() must return list[str], got %s" % _describe(out))
    if len(out) > 10000:
      raise _Reject("output_too_large", "solution() returned %d actions" % len(out))
    return [_check_str(a, "solution() action", self.obs_cap) for a in out]


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


def _mask_paths(paths):
  """Bind-mounts /dev/null over each path (needs root in a private mount ns)."""
  if not paths:
    return
  import ctypes  # pylint: disable=import-outside-toplevel
  libc = ctypes.CDLL(None, use_errno=True)
  for path in paths:
    libc.mount(b"/dev/null", path.encode(), None, 4096, None)  # MS_BIND


def _private_tmp(paths, scratch):
  """Mounts a small tmpfs over each world-writable dir, keeping scratch visible.

  Used without bubblewrap, as root in a private mount namespace: after the
  uid drop these are the places outside scratch a program could write to.
  """
  if not paths:
    return
  import ctypes  # pylint: disable=import-outside-toplevel
  libc = ctypes.CDLL(None, use_errno=True)
  keep = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
  flags = 2 | 4 | 8  # MS_NOSUID | MS_NODEV | MS_NOEXEC
  for path in paths:
    if libc.mount(b"tmpfs", path.encode(), b"tmpfs", flags, b"size=1m,mode=0755") != 0:
      raise OSError(ctypes.get_errno(), "mounting a tmpfs over %s failed" % path)
    if scratch.startswith(path.rstrip("/") + "/"):
      os.makedirs(scratch, mode=0o755, exist_ok=True)
      src = ("/proc/self/fd/%d" % keep).encode()
      if libc.mount(src, scratch.encode(), None, 4096, None) != 0:  # MS_BIND
        raise OSError(ctypes.get_errno(), "re-binding scratch %s failed" % scratch)
  os.close(keep)


def _isolate(cfg):
  """Applies limits, scratch cwd, and the uid drop; returns the protocol fds."""
  rfd = os.dup(0)
  wfd = os.dup(1)
  null = os.open(os.devnull, os.O_RDWR)
  for fd in (0, 1):
    os.dup2(null, fd)
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  limits = cfg["rlimits"]
  for name, value in limits.items():
    res = getattr(resource, name)
    soft = int(value)
    hard = soft + 1 if name == "RLIMIT_CPU" else soft
    try:
      resource.setrlimit(res, (soft, hard))
    except (ValueError, OSError):
      pass
  _mask_paths(cfg.get("mask_paths", ()))
  _private_tmp(cfg.get("tmpfs_paths", ()), cfg["scratch"])
  for name in cfg.get("preimport", ()):
    try:
      __import__(name)
    except ImportError:
      pass
  if cfg.get("no_new_privs", True):
    try:
      import ctypes  # pylint: disable=import-outside-toplevel
      ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    except (ImportError, OSError, AttributeError):
      pass
  uid = cfg.get("uid")
  if uid is not None and os.getuid() == 0:
    if cfg.get("chown_scratch"):
      os.chown(cfg["scratch"], int(uid), int(cfg["gid"]))
    os.setgroups([])
    os.setgid(int(cfg["gid"]))
    os.setuid(int(uid))
  os.chdir(cfg["scratch"])
  os.umask(0o077)
  cfg["_layers"] = _confine(cfg.get("confine") or {})
  os.dup2(null, 2)  # Start-up errors above still reach the parent's log file.
  os.close(null)
  return rfd, wfd


def _load_code(path, hexversion):
  """Runs the parent's precompiled ``_confine`` module; its namespace, or None.

  Compiling the module source at every worker start costs more than the
  layers themselves; the pool marshals it once per pool instead.
  """
  if not path or hexversion != sys.hexversion:
    return None
  import marshal  # pylint: disable=import-outside-toplevel
  try:
    with open(path, "rb") as f:
      code = marshal.loads(f.read())
  except (OSError, ValueError, EOFError, TypeError):
    return None
  ns = {"__name__": "_confine", "__file__": path}
  exec(code, ns)  # pylint: disable=exec-used
  return ns


def _confine(spec):
  """Applies the landlock and seccomp layers ``spec`` asks for.

  Returns:
    {layer: status}: "active: ..." or "missing: <why>" per requested layer,
    "off" for a layer the config switched off.
  """
  out = {"landlock": "off", "seccomp": "off"}
  if not (spec.get("landlock") or spec.get("seccomp")):
    return out
  here = os.path.dirname(os.path.abspath(__file__))
  sys.path.insert(0, here)
  try:
    ns = _load_code(spec.get("code"), spec.get("hexversion"))
    if ns is None:  # No usable precompiled code: import (cached bytecode, if any).
      import _confine  # pylint: disable=import-outside-toplevel
      ns = vars(_confine)
    libc = ns["_libc"]()
    ns["set_no_new_privs"](libc)
  except (ImportError, OSError, AttributeError) as e:
    for layer in out:
      if spec.get(layer):
        out[layer] = "missing: confinement unavailable (%s)" % (e,)
    return out
  finally:
    sys.path.remove(here)
  ll = spec.get("landlock")
  if ll:
    try:
      out["landlock"] = "active: " + ns["apply_landlock"](
          ll.get("read", ()), ll.get("write", ()), ll.get("dev", ()), libc)
    except (OSError, ValueError) as e:
      out["landlock"] = "missing: %s" % (e.strerror if isinstance(e, OSError) and e.strerror
                                         else e,)
  if spec.get("seccomp"):
    try:
      out["seccomp"] = "active: " + ns["apply_seccomp"](libc)
    except (OSError, ValueError) as e:
      out["seccomp"] = "missing: %s" % (e.strerror if isinstance(e, OSError) and e.strerror
                                        else e,)
  return out


def main():
  cfg = json.loads(sys.argv[1])
  rfd, wfd = _isolate(cfg)
  max_bytes = int(cfg["max_message_bytes"])
  host = _Host(cfg)
  handlers = {"load": host.load, "reset": host.reset, "step": host.step,
              "call": host.call, "ping": lambda req: "pong"}
  while True:
    req = _recv(rfd, max_bytes)
    if req is None:
      os._exit(0)
    rid = req.get("id")
    op = req.get("op")
    try:
      if op not in ("load", "ping") and host.env is None:
        raise _Reject("contract", "no program loaded")
      if op == "load" and host.env is not None:
        raise _Reject("contract", "this worker already hosts an env")
      handler = handlers.get(op)
      if handler is None:
        raise _Reject("contract", "unknown op %r" % (op,))
      reply = {"id": rid, "ok": True, "value": handler(req)}
    except _Reject as e:
      reply = {"id": rid, "ok": False, "reason": e.reason, "detail": e.detail}
    except MemoryError:
      reply = {"id": rid, "ok": False, "reason": "memory",
               "detail": "the program exceeded its memory limit"}
    except RecursionError as e:
      reply = {"id": rid, "ok": False, "reason": "crash", "detail": _program_traceback(e)}
    except SyntaxError as e:
      if op == "load":
        reply = {"id": rid, "ok": False, "reason": "syntax",
                 "detail": "%s (line %s)" % (e.msg, e.lineno)}
      else:
        reply = {"id": rid, "ok": False, "reason": "crash", "detail": _program_traceback(e)}
    except BaseException as e:  # pylint: disable=broad-except
      reply = {"id": rid, "ok": False, "reason": "crash", "detail": _program_traceback(e)}
    _send(wfd, reply, max_bytes)


if __name__ == "__main__":
  main()
