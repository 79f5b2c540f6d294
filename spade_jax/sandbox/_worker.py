"""Sandbox worker: hosts one untrusted environment program in this process.

This file is executed as a standalone script (``python -s -S -P -B _worker.py
CONFIG_JSON``) by :mod:`spade_jax.sandbox.pool`, usually inside bubblewrap or
``unshare`` namespaces. It must import nothing outside the standard library and
nothing from this package, so that a fresh worker starts in a few tens of
milliseconds and the program cannot reach trainer code through ``sys.modules``.

Two modes. Started by itself (``SandboxConfig.fork_server=False``, or where no
fork server can run), in order: take the protocol pipes off fds 0/1 and point
fds 0/1/2 at ``/dev/null`` (program output can never corrupt the protocol),
load the landlock/seccomp code (``_confine.py``: the pool's precompiled copy,
else the source by absolute path) before any mount can hide it, mask
accelerator nodes and mount a private tmpfs over world-writable dirs (as
root under ``unshare``), then the shared hardening: rlimits, pre-imports,
``no_new_privs``, when started as root the drop to the per-worker uid, every
capability cleared, the scratch dir as cwd, then landlock and seccomp.

As the fork server (config ``"zygote": true``; the parent side is
``forkserver.py``) it does the shared part once (confinement code loaded and
prepared, mounts, pre-imports, ``no_new_privs``) and forks one worker per
request. Each forked worker takes its own session and process group, its own
pid namespace (given by the server: it is pid 1 there), mount, ipc and uts
namespaces with a private ``/proc`` and, under bubblewrap, its own scratch
tmpfs, reseeds ``random``, then runs the same shared hardening before serving.

Either way the worker then serves framed JSON requests until EOF; the load
reply says which confinement layers are active, or why one is missing.

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
_OPTIONAL_METHODS = ("solution", "hint", "work")


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
    if method in ("hint", "work"):
      return _check_str(out, method + "()", self.obs_cap)
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


# ---- isolation -------------------------------------------------------------------

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC, _CLONE_NEWPID = 0x20000, 0x04000000, 0x08000000, \
    0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND = 2, 4, 8, 4096


def _libc():
  import ctypes  # pylint: disable=import-outside-toplevel
  return ctypes.CDLL(None, use_errno=True)


def _os_error(libc, what):
  import ctypes  # pylint: disable=import-outside-toplevel
  e = ctypes.get_errno()
  return OSError(e, "%s failed: %s" % (what, os.strerror(e)))


def _mask_paths(paths, libc):
  """Bind-mounts /dev/null over each path (needs root in a private mount ns)."""
  for path in paths:
    libc.mount(b"/dev/null", path.encode(), None, _MS_BIND, None)


def _private_tmp(paths, keep, libc):
  """Mounts a small tmpfs over each world-writable dir, keeping ``keep`` visible.

  Used without bubblewrap, as root in a private mount namespace: after the
  uid drop these are the places outside scratch a program could write to.
  Each dir of ``keep`` (scratch dirs, the pool's base dir) that lies beneath
  one of them is bound back at its own path.
  """
  if not paths:
    return
  kept = [(k, os.open(k, os.O_RDONLY | os.O_DIRECTORY)) for k in keep if os.path.isdir(k)]
  flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
  try:
    for path in paths:
      if libc.mount(b"tmpfs", path.encode(), b"tmpfs", flags, b"size=1m,mode=0755") != 0:
        raise _os_error(libc, "mounting a tmpfs over %s" % path)
      for k, fd in kept:
        if k.startswith(path.rstrip("/") + "/"):
          os.makedirs(k, mode=0o755, exist_ok=True)
          src = ("/proc/self/fd/%d" % fd).encode()
          if libc.mount(src, k.encode(), None, _MS_BIND, None) != 0:
            raise _os_error(libc, "re-binding %s" % k)
  finally:
    for _, fd in kept:
      os.close(fd)


def _set_rlimits(limits):
  for name, value in limits.items():
    soft = int(value)
    hard = soft + 1 if name == "RLIMIT_CPU" else soft
    try:
      resource.setrlimit(getattr(resource, name), (soft, hard))
    except (ValueError, OSError):
      pass


def _load_confine(spec):
  """The ``_confine`` module's namespace, loaded before any mount can hide its files.

  Runs the parent's precompiled code (``spec["code"]``) when it was compiled
  by this interpreter version, else compiles ``spec["source"]`` (the module
  next to this file by default), by absolute path: no ``sys.path`` lookup, so
  it works wherever the checkout lives.

  Returns:
    (namespace, "") or (None, why it is unavailable); (None, "") when neither
    layer is requested.
  """
  if not (spec.get("landlock") or spec.get("seccomp")):
    return None, ""
  try:
    ns = _load_code(spec.get("code"), spec.get("hexversion"))
    if ns is None:
      path = spec.get("source") or os.path.join(
          os.path.dirname(os.path.abspath(__file__)), "_confine.py")
      with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
      ns = {"__name__": "_confine", "__file__": path}
      exec(code, ns)  # pylint: disable=exec-used
    return ns, ""
  except (ImportError, OSError, SyntaxError, ValueError) as e:
    return None, "confinement code unavailable (%s)" % (e,)


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


def _confine(spec, ns, why):
  """Applies the landlock and seccomp layers ``spec`` asks for, from module ``ns``.

  Returns:
    {layer: status}: "active: ..." or "missing: <why>" per requested layer,
    "off" for a layer the config switched off.
  """
  out = {"landlock": "off", "seccomp": "off"}
  if not (spec.get("landlock") or spec.get("seccomp")):
    return out
  try:
    if ns is None:
      raise OSError(why or "confinement code unavailable")
    libc = ns["_libc"]()
    ns["set_no_new_privs"](libc)
  except (OSError, AttributeError) as e:
    for layer in out:
      if spec.get(layer):
        out[layer] = "missing: %s" % (e,)
    return out
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


def _drop_caps(libc):
  """Clears the effective, permitted, inheritable and ambient capability sets."""
  import ctypes  # pylint: disable=import-outside-toplevel
  libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
  header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
  data = (ctypes.c_uint32 * 6)()
  libc.capset(header, data)


def _harden(cfg, confine_ns, confine_why, libc=None):
  """Limits, pre-imports, uid drop, scratch cwd, then landlock and seccomp.

  The part of a worker's start-up shared by a spawned worker and a worker
  forked by the zygote. Returns the confinement layer statuses.
  """
  _set_rlimits(cfg["rlimits"])
  for name in cfg.get("preimport", ()):
    if name not in sys.modules:
      try:
        __import__(name)
      except ImportError:
        pass
  libc = libc or _libc()
  if cfg.get("no_new_privs", True):
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
  uid = cfg.get("uid")
  if uid is not None and os.getuid() == 0:
    if cfg.get("chown_scratch"):
      os.chown(cfg["scratch"], int(uid), int(cfg["gid"]))
    os.setgroups([])
    os.setgid(int(cfg["gid"]))
    os.setuid(int(uid))
  _drop_caps(libc)  # Also the inheritable set, which a uid change keeps.
  os.chdir(cfg["scratch"])
  os.umask(0o077)
  return _confine(cfg.get("confine") or {}, confine_ns, confine_why)


def _isolate(cfg):
  """Start-up of a worker started by itself; returns the protocol fds."""
  rfd = os.dup(0)
  wfd = os.dup(1)
  null = os.open(os.devnull, os.O_RDWR)
  for fd in (0, 1):
    os.dup2(null, fd)
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  # Before any mount: a tmpfs over /tmp hides the pool's files (and a checkout
  # that lives there).
  confine_ns, why = _load_confine(cfg.get("confine") or {})
  if cfg.get("mask_paths") or cfg.get("tmpfs_paths"):
    libc = _libc()
    _mask_paths(cfg.get("mask_paths", ()), libc)
    _private_tmp(cfg.get("tmpfs_paths", ()), [cfg["scratch"]], libc)
  cfg["_layers"] = _harden(cfg, confine_ns, why)
  os.dup2(null, 2)  # Start-up errors above still reach the parent's log file.
  os.close(null)
  return rfd, wfd


# ---- fork server -------------------------------------------------------------------


class _Zygote:
  """State of the fork server: the control socket and the workers it forked."""

  def __init__(self, cfg):
    self.cfg = cfg
    self.ctrl = -1
    self.libc = None
    self.confine_ns = None
    self.confine_why = ""
    self.pidns_fd = None  # Open while each worker gets its own pid namespace.
    self.tracked = set()  # Forked workers, unreaped until the parent says so.
    self.dying = set()  # Workers the parent released: reaped once they exit.


def _frame(obj):
  data = json.dumps(obj).encode("utf-8")
  return _HEADER.pack(len(data)) + data


def _zygote_start(cfg):
  """Sets the fork server up: namespaces-wide mounts, imports, no_new_privs.

  Everything here is shared by every worker it forks; what differs per worker
  (scratch, uid, rlimits, landlock rules, seccomp) is applied in the child.
  """
  import socket  # pylint: disable=import-outside-toplevel
  if not (hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")):
    sys.stderr.write("the fork server needs os.pidfd_open and socket.send_fds (Python >= 3.9 "
                     "on Linux >= 5.3); this is Python %s\n" % sys.version.split()[0])
    os._exit(1)
  z = _Zygote(cfg)
  z.ctrl = os.dup(0)
  null = os.open(os.devnull, os.O_RDWR)
  for fd in (0, 1):
    os.dup2(null, fd)
  os.close(null)
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  z.confine_ns, z.confine_why = _load_confine(cfg.get("confine") or {})
  z.libc = _libc()
  if z.confine_ns is not None:
    z.libc = z.confine_ns["prepare"]()
  for name in ("mount", "unshare", "setns", "prctl", "capset"):
    getattr(z.libc, name)  # Resolved once here, not in every child.
  _set_rlimits(cfg.get("rlimits", {}))
  _mask_paths(cfg.get("mask_paths", ()), z.libc)
  _private_tmp(cfg.get("tmpfs_paths", ()), cfg.get("keep_paths", ()), z.libc)
  for name in cfg.get("preimport", ()):
    try:
      __import__(name)
    except ImportError:
      pass
  z.libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS, inherited by every worker
  os.chdir("/")
  ready = {"ok": True, "pidns": False, "why": ""}
  if cfg.get("pidns"):
    # Each worker gets namespaces of its own (so its whole process tree dies
    # with it) when this process may create them: one probe worker tries.
    z.pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    why = _probe_namespaces(z, cfg.get("scratch_probe"))
    if why:
      os.close(z.pidns_fd)
      z.pidns_fd = None
      ready["why"] = why
    else:
      ready["pidns"] = True
  ready["confine"] = z.confine_why
  import gc  # pylint: disable=import-outside-toplevel
  gc.freeze()  # Children's collections skip the zygote's objects: fewer copied pages.
  os.write(z.ctrl, json.dumps(ready).encode("utf-8"))
  return z


def _own_namespaces(libc, scratch=None, size=None):
  """In a fresh child of the zygote, already pid 1 of its own pid namespace.

  Gives it its own mount, ipc and uts namespaces, a /proc that shows only its
  own processes and, with ``size``, a private tmpfs of that size at ``scratch``.
  """
  if libc.unshare(_CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWUTS) != 0:
    raise _os_error(libc, "unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS)")
  flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
  if libc.mount(b"proc", b"/proc", b"proc", flags, None) != 0:
    raise _os_error(libc, "mounting a private /proc")
  if size:
    opts = ("size=%d,mode=0700" % int(size)).encode()
    if libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) != 0:
      raise _os_error(libc, "mounting a scratch tmpfs at %s" % scratch)


def _probe_namespaces(z, scratch):
  """Forks one child through every per-worker namespace step; "" or why it failed."""
  if z.libc.unshare(_CLONE_NEWPID) != 0:
    return str(_os_error(z.libc, "unshare(CLONE_NEWPID)"))
  rfd, wfd = os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      _own_namespaces(z.libc, scratch, 1 << 20 if scratch else None)
      os._exit(0)
    except BaseException as e:  # pylint: disable=broad-except
      os.write(wfd, str(e).encode("utf-8", "replace")[:2000])
      os._exit(1)
  os.close(wfd)
  if z.libc.setns(z.pidns_fd, _CLONE_NEWPID) != 0:
    os.write(2, ("fork server: %s\n" % _os_error(z.libc, "setns")).encode())
    os._exit(71)
  status = os.waitpid(pid, 0)[1]
  why = os.read(rfd, 4096).decode("utf-8", "replace")
  os.close(rfd)
  if status != 0:
    return why or "a probe worker died with wait status %d" % status
  return ""


def _zygote_fork(z, req, fds):
  """Forks one worker for a spawn request whose fds are (protocol socket, stderr)."""
  import socket  # pylint: disable=import-outside-toplevel
  if len(fds) != 2:
    for fd in fds:
      os.close(fd)
    return
  sock_fd, err_fd = fds
  pid = -1
  detail = ""
  try:
    if z.pidns_fd is not None and z.libc.unshare(_CLONE_NEWPID) != 0:
      raise _os_error(z.libc, "unshare(CLONE_NEWPID)")
    pid = os.fork()
  except OSError as e:
    detail = "the fork server could not fork a worker: %s" % (e,)
  if pid == 0:
    code = 0
    try:
      _child(z, req.get("cfg") or {}, sock_fd, err_fd)
    except BaseException:  # pylint: disable=broad-except
      import traceback  # pylint: disable=import-outside-toplevel
      try:
        os.write(2, traceback.format_exc().encode("utf-8", "replace"))
      except OSError:
        pass
      code = 70
    os._exit(code)
  if z.pidns_fd is not None and z.libc.setns(z.pidns_fd, _CLONE_NEWPID) != 0:
    # Later workers would be born into this worker's namespace: stop serving.
    os.write(2, ("fork server: %s\n" % _os_error(z.libc, "setns")).encode())
    os._exit(71)
  sock = socket.socket(fileno=sock_fd)
  try:
    if pid < 0:
      sock.sendall(_frame({"ok": False, "detail": detail}))
    else:
      z.tracked.add(pid)
      pidfd = os.pidfd_open(pid)
      try:
        socket.send_fds(sock, [_frame({"ok": True, "zpid": pid})], [pidfd])
      finally:
        os.close(pidfd)
  except OSError:
    pass  # The parent went away; the worker sees EOF and exits.
  finally:
    sock.close()
    os.close(err_fd)


def _child(z, cfg, sock_fd, err_fd):
  """Start-up of a forked worker, then its request loop (never returns)."""
  # Own session and process group: the parent kills the whole group, and with
  # scheduler autogrouping each worker gets a CPU share of its own (in the
  # server's session all workers of a pool would split one share), as a
  # worker started by itself does. Entering the new autogroup can cost a cold
  # start up to a scheduler tick on a busy machine.
  os.setsid()
  os.close(z.ctrl)
  if z.pidns_fd is not None:
    os.close(z.pidns_fd)
  os.dup2(err_fd, 2)
  os.close(err_fd)
  rfd, wfd = sock_fd, os.dup(sock_fd)
  for name, value in (cfg.get("env") or {}).items():
    os.environ[name] = value
  rnd = sys.modules.get("random")
  if rnd is not None:
    rnd.seed()  # Not the zygote's state: every worker draws its own stream.
  libc = z.libc
  if z.pidns_fd is not None:
    # Under bubblewrap (scratch_bytes) the scratch dir is a private tmpfs.
    _own_namespaces(libc, cfg["scratch"], cfg.get("scratch_bytes"))
  cfg["_layers"] = _harden(cfg, z.confine_ns, z.confine_why, libc)
  null = os.open(os.devnull, os.O_RDWR)
  os.dup2(null, 2)
  os.close(null)
  _serve(rfd, wfd, cfg)


def _zygote_main(cfg):
  """Fork server loop: spawn and reap requests on the control socket until EOF.

  Requests are single datagrams of JSON: ``{"op": "spawn", "cfg": {...}}``
  with the worker's protocol socket and stderr file as SCM_RIGHTS fds, or
  ``{"op": "reap", "pid": N}``. The spawn reply goes over the worker's own
  socket: a frame ``{"ok": true, "zpid": N}`` with a pidfd of the worker.
  """
  import select  # pylint: disable=import-outside-toplevel
  import socket  # pylint: disable=import-outside-toplevel
  z = _zygote_start(cfg)
  ctrl = socket.socket(fileno=z.ctrl)
  poller = select.poll()
  poller.register(z.ctrl, select.POLLIN)
  while True:
    events = poller.poll(20 if z.dying else None)
    if events:
      try:
        msg, fds, _, _ = socket.recv_fds(ctrl, 1 << 20, 2, socket.MSG_CMSG_CLOEXEC)
      except OSError:
        msg, fds = b"", []
      if not msg:
        break
      try:
        req = json.loads(msg.decode("utf-8"))
      except ValueError:
        req = {}
      if req.get("op") == "spawn":
        _zygote_fork(z, req, fds)
      else:
        for fd in fds:
          os.close(fd)
        pid = req.get("pid")
        if req.get("op") == "reap" and pid in z.tracked:
          try:
            os.kill(pid, signal.SIGKILL)
          except OSError:
            pass
          z.dying.add(pid)
    for pid in list(z.dying):
      try:
        done = os.waitpid(pid, os.WNOHANG)[0] == pid
      except ChildProcessError:
        done = True
      if done:
        z.dying.discard(pid)
        z.tracked.discard(pid)
  # The pool closed (or died): take every worker down with the server.
  for pid in z.tracked:
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass
  os._exit(0)


# ---- request loop --------------------------------------------------------------------


def _serve(rfd, wfd, cfg):
  """Answers framed requests until EOF, then exits."""
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


def main():
  cfg = json.loads(sys.argv[1])
  if cfg.get("zygote"):
    _zygote_main(cfg)
  rfd, wfd = _isolate(cfg)
  _serve(rfd, wfd, cfg)


if __name__ == "__main__":
  main()
