"""OS isolation layers: detection, the worker command line, and a live self-test.

Layers, strongest first, used where the host allows them:

* bubblewrap: fresh mount namespace holding only read-only system and
  interpreter directories, the worker package and a size-capped private tmpfs
  as scratch dir; a
  minimal /dev (no /dev/nvidia*, /dev/accel*, /dev/vfio); new pid, net, ipc,
  uts (and cgroup when possible) namespaces; all capabilities dropped except
  the two needed for the uid drop.
* util-linux ``unshare`` (when bubblewrap is missing): new net, pid, ipc, uts and
  mount namespaces; as root, accelerator device nodes masked with /dev/null and
  a small tmpfs over /tmp, /var/tmp, /dev/shm (the host filesystem otherwise
  stays visible, protected by the uid drop and file permissions only).
* per-worker uid (when the pool runs as root): every worker runs as its own
  unprivileged uid, which also makes RLIMIT_NPROC a per-worker limit.
* landlock (``SandboxConfig.landlock``, kernels with landlock): the worker
  may read only beneath the system and interpreter dirs, write only beneath
  its scratch dir, and execve nothing; with landlock ABI >= 4 it cannot bind
  or connect TCP, with ABI >= 6 it cannot signal processes outside the sandbox
  nor reach abstract unix sockets. Holds without any namespace.
* seccomp (``SandboxConfig.seccomp``, x86_64 and aarch64): a BPF filter makes
  ``socket`` (every family), ``ptrace``, ``process_vm_readv/writev``, mounts,
  namespace creation (``unshare``, ``setns``, ``clone`` with ``CLONE_NEW*``),
  ``bpf``, ``perf_event_open``, ``io_uring_*``, ``userfaultfd``, keyrings,
  module loading, ``kexec``, ``reboot``, ``swapon``/``swapoff``, ``acct`` fail
  with EPERM and kills the worker on a foreign syscall ABI (i386, x32); the
  full list is ``_confine.DENIED_SYSCALLS``.
  Both are applied by the worker itself with ``ctypes`` syscalls (see
  ``_confine.py``) after the uid drop and before any program code runs.
* always: rlimits, ``no_new_privs``, no capabilities, a scratch cwd, a
  scrubbed environment, a session and process group of its own so the parent
  can kill the whole group.

With the fork server (``SandboxConfig.fork_server``, ``forkserver.py``) the
launcher wraps one zygote per pool instead of each worker; every worker it
forks still gets each layer above, and under a launcher its own pid, mount,
ipc and uts namespaces (workers of one pool share the network namespace).

:func:`self_test` runs a probe program through the real worker path and
reports which layers actually hold, instead of trusting the flags.
"""

import dataclasses
import functools
import json
import marshal
import logging
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
from collections.abc import Sequence

from spade_jax.sandbox import _confine, worker  # pylint: disable=unused-import

_log = logging.getLogger(__name__)

WORKER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker")
WORKER_SCRIPT = os.path.join(WORKER_DIR, "__main__.py")
CONFINE_SCRIPT = os.path.join(os.path.dirname(WORKER_DIR), "_confine.py")
# Files outside the read-only trees that programs may read (no secrets in them).
_READ_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_DEV_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ACCEL_GLOBS = ("nvidia", "accel", "vfio", "dri", "kfd")


@dataclasses.dataclass(frozen=True)
class IsolationPlan:
  """Which launcher wraps workers and whether workers drop to their own uid."""

  launcher: str  # "bwrap" | "unshare" | "none"
  drop_uid: bool
  python: str
  notes: tuple[str, ...] = ()
  binary: str = ""  # Resolved path of the launcher (workers get PATH=/usr/bin:/bin).


def worker_python(configured: str | None = None) -> str:
  """The interpreter workers run: the base (non-venv) executable, resolved."""
  if configured:
    return configured
  exe = getattr(sys, "_base_executable", None) or sys.executable
  return os.path.realpath(exe)


@functools.lru_cache(maxsize=None)
def _probe_command(argv: tuple[str, ...]) -> bool:
  try:
    return subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=10, check=False).returncode == 0
  except (OSError, subprocess.SubprocessError):
    return False


def plan_isolation(cfg) -> IsolationPlan:
  """Chooses the strongest launcher that works on this host for ``cfg``."""
  python = worker_python(cfg.python)
  is_root = os.geteuid() == 0
  notes = []
  drop_uid = bool(cfg.drop_uid and is_root)
  if cfg.mode != "none" and sys.platform.startswith("linux"):
    bwrap = shutil.which("bwrap")
    if cfg.use_bwrap and bwrap:
      if _probe_command((bwrap, "--unshare-net", "--unshare-pid", "--die-with-parent",
                         "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true")):
        return IsolationPlan("bwrap", drop_uid, python, tuple(notes), bwrap)
      notes.append(f"bubblewrap at {bwrap} failed its probe (user namespaces disabled?)")
    elif cfg.use_bwrap:
      notes.append("bubblewrap is not installed (apt-get install bubblewrap)")
    unshare = shutil.which("unshare")
    if cfg.use_unshare and unshare:
      base = [unshare] + ([] if is_root else ["--map-root-user"])
      argv = base + ["--net", "--pid", "--fork", "--kill-child", "--mount-proc", "true"]
      if _probe_command(tuple(argv)):
        return IsolationPlan("unshare", drop_uid, python, tuple(notes), unshare)
      notes.append("unshare is installed but cannot create namespaces here")
    elif cfg.use_unshare:
      notes.append("util-linux unshare is not installed")
  return IsolationPlan("none", drop_uid, python, tuple(notes))


def python_dirs(python: str) -> list[str]:
  """Interpreter dirs outside the system dirs (read-only to workers)."""
  dirs = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(python))}
  libdir = sysconfig.get_config_var("LIBDIR")
  if libdir:
    dirs.add(os.path.realpath(libdir))
  out = []
  for d in sorted(dirs):
    if not os.path.isdir(d) or any(d == s or d.startswith(s + "/") for s in _SYSTEM_DIRS):
      continue
    if any(d.startswith(o + "/") for o in out):
      continue
    out.append(d)
  return out


def _ancestors(path: str) -> list[str]:
  """Proper ancestors of an absolute path, excluding "/" and system dirs."""
  parts = path.strip("/").split("/")[:-1]
  out = ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]
  return [p for p in out if p not in _SYSTEM_DIRS and not p.startswith("/usr/")]


def accelerator_nodes() -> list[str]:
  """Accelerator device nodes on the host that workers must not see."""
  try:
    names = os.listdir("/dev")
  except OSError:
    return []
  return sorted("/dev/" + n for n in names if n.startswith(_ACCEL_GLOBS))


def world_writable_dirs() -> list[str]:
  """Shared temp dirs a sandbox uid could write to outside its scratch dir."""
  out = []
  for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue"):
    try:
      if not os.path.islink(d) and os.path.isdir(d) and os.stat(d).st_mode & 0o002:
        out.append(d)
    except OSError:
      pass
  return out


def worker_env(scratch: str) -> dict[str, str]:
  """The whole environment of a worker: nothing inherited from the trainer."""
  return {"HOME": scratch, "TMPDIR": scratch, "PATH": "/usr/bin:/bin",
          "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}


BWRAP_SCRATCH = "/scratch"


def inside_scratch(plan: IsolationPlan, host_scratch: str) -> str:
  """Path of the worker's scratch dir as the worker sees it."""
  return BWRAP_SCRATCH if plan.launcher == "bwrap" else host_scratch


def worker_command(plan: IsolationPlan, scratch: str, config_json: str,
                   scratch_bytes: int = 64 << 20,
                   extra_ro_files: Sequence[str] = (), zygote: bool = False) -> list[str]:
  """argv that starts one worker (or, with ``zygote``, the fork server) under ``plan``.

  Under bubblewrap the scratch dir is a private tmpfs of ``scratch_bytes`` at
  :data:`BWRAP_SCRATCH` (gone with the sandbox, never on the host disk);
  otherwise it is the host dir ``scratch``. ``extra_ro_files`` are host files
  the worker reads at their host path (bound read-only under bubblewrap, like the
  worker package's sources and ``_confine.py``).
  As root, the fork server keeps CAP_SYS_ADMIN under bubblewrap: each worker
  it forks creates its own pid, mount, ipc and uts namespaces and scratch
  tmpfs with it, then drops every capability (uid drop or ``capset``) before
  running program code.
  """
  inner = [plan.python, "-s", "-S", "-B"]
  if sys.version_info >= (3, 11):
    inner.append("-P")
  inner += [WORKER_SCRIPT, config_json]
  if plan.launcher == "bwrap":
    argv = [plan.binary or "bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--hostname",
            "sandbox", "--cap-drop", "ALL"]
    if plan.drop_uid:
      argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_CHOWN"]
    if zygote and os.geteuid() == 0:
      argv += ["--cap-add", "CAP_SYS_ADMIN"]
    for d in _SYSTEM_DIRS:
      if os.path.islink(d):
        argv += ["--symlink", os.readlink(d), d]
      elif os.path.isdir(d):
        argv += ["--ro-bind", d, d]
    binds = [("--ro-bind", d) for d in python_dirs(plan.python)]
    binds += [("--ro-bind", p) for p in (WORKER_DIR, CONFINE_SCRIPT) if os.path.exists(p)]
    binds += [("--ro-bind", p) for p in extra_ro_files]
    # bwrap creates missing mount-point parents as 0700 root dirs, which the
    # unprivileged worker uid could not traverse; create them as 0755 first.
    parents = sorted({p for _, d in binds for p in _ancestors(d)})
    for p in parents:
      argv += ["--perms", "0755", "--dir", p]
    for flag, d in binds:
      argv += [flag, d, d]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "0700", "--size",
             str(int(scratch_bytes)), "--tmpfs", BWRAP_SCRATCH, "--clearenv"]
    for k, v in worker_env(BWRAP_SCRATCH).items():
      argv += ["--setenv", k, v]
    return argv + ["--"] + inner
  if plan.launcher == "unshare":
    argv = [plan.binary or "unshare"]
    if os.geteuid() != 0:
      argv.append("--map-root-user")
    argv += ["--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts",
             "--propagation", "private", "--"]
    return argv + inner
  return inner


def _write_code(path: str, code) -> str:
  with open(path, "wb") as f:
    f.write(marshal.dumps(code))
  os.chmod(path, 0o644)
  return path


def _compiled(path: str):
  with open(path, "rb") as f:
    return compile(f.read(), path, "exec")


def write_confine_code(base_dir: str) -> str:
  """Marshals the compiled ``_confine`` module into ``base_dir``; returns the path.

  Workers (or the fork server, once per pool) run this instead of compiling
  the source; one whose interpreter version differs compiles the source.
  """
  return _write_code(os.path.join(base_dir, "confine.code"), _compiled(CONFINE_SCRIPT))


def write_worker_code(base_dir: str) -> str:
  """Marshals the compiled worker modules ({name: code}) into ``base_dir``; returns the path.

  A worker's entry (``worker/__main__.py``) runs these instead of compiling the sources at
  every start; one whose interpreter version differs compiles the sources.
  """
  codes = {name: _compiled(os.path.join(WORKER_DIR, name + ".py")) for name in worker.MODULES}
  return _write_code(os.path.join(base_dir, "worker.code"), codes)


def worker_code_spec(code_path: str, hexversion: int | None) -> dict:
  """The worker config's ``worker_code`` entry for :func:`write_worker_code`'s file."""
  return {"path": code_path, "hexversion": hexversion}


def confine_spec(cfg, plan: IsolationPlan, scratch: str, code_path: str | None = None,
                 hexversion: int | None = None) -> dict:
  """The worker's ``confine`` config: landlock paths as the worker sees them, seccomp.

  Args:
    cfg: the SandboxConfig.
    plan: the launcher plan (paths are the same inside bubblewrap, whose
      mounts mirror the host's system and interpreter dirs).
    scratch: the worker's scratch dir, as the worker sees it.
    code_path: from :func:`write_confine_code`, or None.
    hexversion: ``sys.hexversion`` of the interpreter that compiled it.
  """
  if not sys.platform.startswith("linux"):
    return {}
  spec: dict = {"seccomp": bool(cfg.seccomp), "code": code_path, "hexversion": hexversion,
                "source": CONFINE_SCRIPT}
  if cfg.landlock:
    read = [d for d in _SYSTEM_DIRS if os.path.exists(d)] + python_dirs(plan.python)
    spec["landlock"] = {"read": read + list(_READ_FILES), "write": [scratch],
                        "dev": list(_DEV_FILES)}
  return spec


# A program run through the normal worker path that reports what it can reach.
PROBE_SOURCE = r'''
import json, os

class ProbeEnv:
  def __init__(self, max_turns=25, **kwargs):
    pass

  def reset(self, seed=None, options=None):
    o = options or {}
    facts = {"uid": os.getuid(), "env": sorted(os.environ)}
    try:
      import socket
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.settimeout(1.0)
      s.connect(("127.0.0.1", o["port"]))
      facts["net"] = "connected"
    except ImportError:
      facts["net"] = "unknown"
    except Exception as e:
      facts["net"] = type(e).__name__
    try:
      import socket
      socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()
      facts["socket"] = "allowed"
    except Exception as e:
      facts["socket"] = type(e).__name__
    try:
      with open("/proc/self/status") as f:
        f.read(10)
      facts["outside_read"] = "allowed"
    except Exception as e:
      facts["outside_read"] = type(e).__name__
    for key in ("secret", "trainer_proc"):
      try:
        with open(o[key]) as f:
          facts[key] = f.read(100)
      except Exception as e:
        facts[key] = None
    try:
      with open(os.path.join(o["outside"], "probe"), "w") as f:
        f.write("x")
      facts["outside_write"] = True
    except Exception:
      facts["outside_write"] = False
    facts["devices"] = []
    try:
      names = os.listdir("/dev")
    except PermissionError:  # landlock: no device beyond /dev/null & co opens anyway
      names = []
    for n in names:
      if n.startswith(("nvidia", "accel", "vfio", "dri", "kfd")):
        try:
          masked = os.major(os.stat("/dev/" + n).st_rdev) == 1  # bound over by /dev/null
        except OSError:
          masked = True
        if not masked:
          facts["devices"].append(n)
    return json.dumps(facts), {}

  def step(self, action):
    return "", 0.0, True, False, {}
'''


@dataclasses.dataclass(frozen=True)
class IsolationReport:
  """Layers that held when a probe program tried to break out of a worker."""

  launcher: str
  layers: dict[str, bool]
  notes: tuple[str, ...]
  detail: str = ""
  why: dict[str, str] = dataclasses.field(default_factory=dict)

  @property
  def network_isolated(self) -> bool:
    return self.layers.get("net_namespace", False)

  def summary(self) -> str:
    """One line: the launcher, active layers, missing layers with their reasons."""
    on = [k for k, v in self.layers.items() if v]
    off = [k + (f" ({self.why[k]})" if self.why.get(k) else "")
           for k, v in self.layers.items() if not v]
    return f"launcher={self.launcher}; active: {', '.join(on) or 'none'}; " \
           f"MISSING: {', '.join(off) or 'none'}"


def self_test(pool, base_dir: str) -> IsolationReport:
  """Runs :data:`PROBE_SOURCE` in ``pool`` and checks every layer it reports on."""
  plan = pool.plan
  outside = os.path.join(base_dir, "probe_outside")
  os.makedirs(outside, exist_ok=True)
  os.chmod(outside, 0o777)
  secret = os.path.join(base_dir, "probe_secret")
  with open(secret, "w") as f:
    f.write("probe-secret")
  os.chmod(secret, 0o644)
  listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  listener.bind(("127.0.0.1", 0))
  listener.listen(4)
  listener.setblocking(False)
  options = {"port": listener.getsockname()[1], "secret": secret, "outside": outside,
             "trainer_proc": f"/proc/{os.getpid()}/environ"}
  try:
    handle = pool.start([PROBE_SOURCE], max_turns=1,
                        preimport=tuple(pool.preimport) + ("socket",))[0]
    res = pool.reset_many([handle], seeds=[0], options=options)[0]
    pool.release([handle])
    try:
      conn, _ = listener.accept()
      conn.close()
      accepted = True
    except (BlockingIOError, OSError):
      accepted = False
  finally:
    listener.close()
    shutil.rmtree(outside, ignore_errors=True)
    os.unlink(secret)
  if not res.ok:
    return IsolationReport(plan.launcher, {"probe_ran": False}, plan.notes,
                           f"probe failed: {res.reason}: {res.detail}")
  facts = json.loads(res.value[0])
  status = dict(handle.layers)
  facts["confine"] = status
  why = {}
  for layer in ("landlock", "seccomp"):
    st = status.get(layer, "missing: the worker did not report it")
    if st == "off":
      why[layer] = f"disabled by SandboxConfig.{layer}=False"
    elif not st.startswith("active"):
      why[layer] = st.split(": ", 1)[-1]
  if status.get("seccomp", "").startswith("active") and facts["socket"] != "PermissionError":
    why["seccomp"] = f"filter reported active but socket() gave {facts['socket']}"
  if status.get("landlock", "").startswith("active") \
      and (facts["outside_read"] != "PermissionError" or facts["outside_write"]):
    why["landlock"] = (f"reported active but a read outside the allowed paths gave "
                       f"{facts['outside_read']}")
  layers = {
      "bwrap": plan.launcher == "bwrap",
      "net_namespace": plan.launcher != "none" and not accepted
                       and facts["net"] not in ("connected", "unknown"),
      "pid_namespace": facts["trainer_proc"] is None and plan.launcher != "none",
      "uid_drop": facts["uid"] not in (0, os.getuid()),
      # Only a fresh mount namespace or landlock hides the host filesystem as a
      # whole; the probe's secret merely shows whether that works.
      "host_files_hidden": facts["secret"] is None and (
          plan.launcher == "bwrap" or "landlock" not in why),
      "writes_confined": not facts["outside_write"],
      "accelerators_hidden": not facts["devices"],
      "env_scrubbed": set(facts["env"]) <= set(worker_env("/")) | {"PWD"},
      "rlimits": True,
      "landlock": "landlock" not in why,
      "seccomp": "seccomp" not in why,
  }
  return IsolationReport(plan.launcher, layers, plan.notes, json.dumps(facts), why)
