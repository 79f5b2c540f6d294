"""The OS jail a worker builds around itself before any program code runs.

Standard library only (see ``__main__.py``). Mounts for a worker started as root under
``unshare`` (accelerator nodes masked, a private tmpfs over world-writable dirs), rlimits,
``no_new_privs``, the drop to the per-worker uid, every capability cleared, the scratch dir
as cwd, then landlock and seccomp from the confinement module ``_confine.py`` (the pool's
precompiled copy, else its source, loaded before any mount can hide it).
"""

import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID = 0x20000, 0x04000000, 0x08000000, \
    0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND = 2, 4, 8, 4096


def libc_handle():
  import ctypes  # pylint: disable=import-outside-toplevel
  return ctypes.CDLL(None, use_errno=True)


def os_error(libc, what):
  import ctypes  # pylint: disable=import-outside-toplevel
  e = ctypes.get_errno()
  return OSError(e, "%s failed: %s" % (what, os.strerror(e)))


def mask_paths(paths, libc):
  """Bind-mounts /dev/null over each path (needs root in a private mount ns)."""
  for path in paths:
    libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None)


def private_tmp(paths, keep, libc):
  """Mounts a small tmpfs over each world-writable dir, keeping ``keep`` visible.

  Used without bubblewrap, as root in a private mount namespace: after the
  uid drop these are the places outside scratch a program could write to.
  Each dir of ``keep`` (scratch dirs, the pool's base dir) that lies beneath
  one of them is bound back at its own path.
  """
  if not paths:
    return
  kept = [(k, os.open(k, os.O_RDONLY | os.O_DIRECTORY)) for k in keep if os.path.isdir(k)]
  flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
  try:
    for path in paths:
      if libc.mount(b"tmpfs", path.encode(), b"tmpfs", flags, b"size=1m,mode=0755") != 0:
        raise os_error(libc, "mounting a tmpfs over %s" % path)
      for k, fd in kept:
        if k.startswith(path.rstrip("/") + "/"):
          os.makedirs(k, mode=0o755, exist_ok=True)
          src = ("/proc/self/fd/%d" % fd).encode()
          if libc.mount(src, k.encode(), None, MS_BIND, None) != 0:
            raise os_error(libc, "re-binding %s" % k)
  finally:
    for _, fd in kept:
      os.close(fd)


def set_rlimits(limits):
  for name, value in limits.items():
    soft = int(value)
    hard = soft + 1 if name == "RLIMIT_CPU" else soft
    try:
      resource.setrlimit(getattr(resource, name), (soft, hard))
    except (ValueError, OSError):
      pass


def load_confine(spec):
  """The ``_confine`` module's namespace, loaded before any mount can hide its files.

  Runs the parent's precompiled code (``spec["code"]``) when it was compiled
  by this interpreter version, else compiles ``spec["source"]`` (the module
  in the package above this one by default), by absolute path: no ``sys.path`` lookup, so
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
          os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_confine.py")
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


def build_modules(specs):
  """Builds each ``[import name, source]`` of ``SandboxConfig.modules`` as a module
  programs may import (one already built, e.g. by the fork server, is kept)."""
  import types  # pylint: disable=import-outside-toplevel
  for name, source in specs:
    if name in sys.modules:
      continue
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    try:
      exec(compile(source, "<sandbox module %s>" % name, "exec"), mod.__dict__)
    except BaseException:
      del sys.modules[name]
      raise


def harden(cfg, confine_ns, confine_why, libc=None):
  """Limits, pre-imports, uid drop, scratch cwd, then landlock and seccomp.

  The part of a worker's start-up shared by a spawned worker and a worker
  forked by the zygote. Returns the confinement layer statuses.
  """
  set_rlimits(cfg["rlimits"])
  for name in cfg.get("preimport", ()):
    if name not in sys.modules:
      try:
        __import__(name)
      except ImportError:
        pass
  build_modules(cfg.get("modules", ()))
  libc = libc or libc_handle()
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


def isolate(cfg):
  """Start-up of a worker started by itself; returns the protocol fds."""
  rfd = os.dup(0)
  wfd = os.dup(1)
  null = os.open(os.devnull, os.O_RDWR)
  for fd in (0, 1):
    os.dup2(null, fd)
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  # Before any mount: a tmpfs over /tmp hides the pool's files (and a checkout
  # that lives there).
  confine_ns, why = load_confine(cfg.get("confine") or {})
  if cfg.get("mask_paths") or cfg.get("tmpfs_paths"):
    libc = libc_handle()
    mask_paths(cfg.get("mask_paths", ()), libc)
    private_tmp(cfg.get("tmpfs_paths", ()), [cfg["scratch"]], libc)
  cfg["_layers"] = harden(cfg, confine_ns, why)
  os.dup2(null, 2)  # Start-up errors above still reach the parent's log file.
  os.close(null)
  return rfd, wfd
