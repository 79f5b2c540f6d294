"""Static configuration of the sandbox worker pool."""

import dataclasses

from spade_jax.registry import names

MODES = names("best_effort", "strict", "none", kind="sandbox mode", field="sandbox.mode")

# Pure-stdlib modules a worker imports before the uid drop when the program
# might not be able to import them afterwards (no private mount namespace and
# an interpreter prefix the sandbox uid cannot read, e.g. under /root).
DEFAULT_PREIMPORT = (
    "random", "math", "re", "json", "itertools", "collections", "string",
    "functools", "heapq", "bisect", "dataclasses", "typing", "fractions",
    "decimal", "statistics", "copy", "enum", "operator", "textwrap",
    "hashlib", "abc", "datetime", "array", "numbers", "unicodedata", "ast",
)


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  """How env programs are isolated and limited.

  Attributes:
    mode: "best_effort" (default) uses every isolation layer the host allows
      and warns loudly about missing ones; "strict" refuses to start without a
      network namespace (bubblewrap or unshare); "none" uses no namespaces,
      only rlimits, a scratch cwd and (on Linux) the uid drop, seccomp and
      landlock layers (for hosts without namespaces, e.g. macOS laptops).
    num_workers: warm idle workers kept ready, so a fresh env costs one load
      message instead of an interpreter start.
    max_live_workers: cap on worker processes alive at once; starts beyond it
      return dead handles.
    call_timeout_s: wall-clock deadline of one reset/step/call, enforced by the
      parent; a breach kills the worker's whole process group.
    load_timeout_s: wall-clock deadline of starting an env (interpreter start
      when no warm worker is ready, exec of the source, __init__).
    memory_mb: RLIMIT_AS of each worker.
    cpu_seconds: RLIMIT_CPU of each worker over its whole life.
    file_size_mb: RLIMIT_FSIZE: largest file a program may write in scratch.
    scratch_mb: size of the private tmpfs scratch dir under bubblewrap (other
      launchers use a host dir, limited per file by file_size_mb only).
    max_open_files: RLIMIT_NOFILE.
    max_processes: RLIMIT_NPROC (threads count too); enforced per worker since
      each worker runs under its own uid when the pool runs as root.
    max_message_bytes: cap on one protocol frame in either direction.
    max_observation_chars: cap on an observation, hint or solution action.
    use_bwrap: use bubblewrap when installed (mount, pid, net, ipc, uts
      namespaces; read-only system, no /dev accelerators).
    use_unshare: fall back to util-linux ``unshare`` (net, pid, ipc, uts,
      mount namespaces) when bubblewrap is missing or unusable.
    seccomp: install a seccomp-BPF filter in every worker (after the uid drop,
      before any program code runs): sockets of every family, ptrace,
      process_vm_*, mounts, namespaces, bpf, perf, io_uring, keyrings, module
      loading, kexec, reboot and swap fail with EPERM, foreign syscall ABIs
      kill the worker (list: ``spade_jax.sandbox._confine.DENIED_SYSCALLS``).
      x86_64 and aarch64 only; reported missing elsewhere.
    landlock: confine every worker's filesystem access with landlock: read-only
      beneath the system and interpreter dirs, read-write beneath its scratch
      dir only, no execve; with newer kernels also no TCP bind/connect and no
      signals to processes outside the sandbox. Reported missing (with the
      reason) on kernels without landlock.
    drop_uid: when running as root, run each worker as its own unprivileged uid.
    uid_base: first uid of the per-worker uid range.
    uid_count: size of that range.
    scratch_root: parent directory of worker scratch dirs (default: system tmp).
    preimport: modules imported by a worker before the uid drop; None (default)
      picks DEFAULT_PREIMPORT, imported once by the fork server, or, for
      workers started one by one, nothing under bubblewrap (the interpreter is
      mounted readable, so programs import lazily and workers boot fastest)
      and DEFAULT_PREIMPORT otherwise.
    modules: host modules (dotted names) whose ``sandbox_module()`` returns
      ``(import name, source)``: every worker builds that module from the source
      (after ``preimport``, before it is confined), so programs may import it by
      name (e.g. ``spade_jax.envs.families.library``: ``from families import ...``).
      The source runs inside the sandbox like a program; allow its import name in
      ``ValidationConfig.allowed_imports``.
    self_test: run an isolation probe program when the pool starts and log the
      layers that actually hold.
    python: interpreter for workers (default: the running interpreter's base
      executable).
    fork_server: fork every worker from one pre-imported zygote per pool,
      started under the same launcher (``sandbox/forkserver.py``), so a fresh
      worker costs a fork instead of an interpreter start. Each forked worker
      still gets its own scratch dir, uid, rlimits, process group, landlock
      domain and seccomp filter and, under a launcher, its own pid, mount,
      ipc and uts namespaces; workers of one pool share a network namespace.
      Where the server cannot run (no pidfd, or no pid namespace per worker,
      e.g. bubblewrap without root) or keeps dying, workers are started one
      by one, with the reason logged.
  """

  mode: str = "best_effort"
  num_workers: int = 4
  max_live_workers: int = 1024
  call_timeout_s: float = 5.0
  load_timeout_s: float = 10.0
  memory_mb: int = 1024
  cpu_seconds: int = 300
  file_size_mb: int = 16
  scratch_mb: int = 64
  max_open_files: int = 64
  max_processes: int = 16
  max_message_bytes: int = 4 << 20
  max_observation_chars: int = 32768
  use_bwrap: bool = True
  use_unshare: bool = True
  seccomp: bool = True
  landlock: bool = True
  drop_uid: bool = True
  uid_base: int = 400000
  uid_count: int = 60000
  scratch_root: str | None = None
  preimport: tuple[str, ...] | None = None
  modules: tuple[str, ...] = ()
  self_test: bool = True
  python: str | None = None
  fork_server: bool = True

  def __post_init__(self):
    MODES.check(self.mode)
    for name in ("call_timeout_s", "load_timeout_s", "memory_mb", "cpu_seconds",
                 "max_message_bytes", "max_observation_chars", "max_live_workers"):
      if getattr(self, name) <= 0:
        raise ValueError(f"SandboxConfig.{name}={getattr(self, name)!r}; expected a "
                         "positive value.")
    if self.num_workers < 0:
      raise ValueError(f"SandboxConfig.num_workers={self.num_workers}; expected >= 0.")
