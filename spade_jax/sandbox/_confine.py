"""Kernel confinement of a sandbox worker: a seccomp filter and a landlock domain.

Standard library only (``ctypes`` syscalls, no third-party bindings): the worker
runs as ``python -s -S`` without site-packages and loads this file by path
before it executes any program source; the parent imports it as
``spade_jax.sandbox._confine`` for the deny-list and the kernel probes.

seccomp (classic BPF, x86_64 and aarch64): a syscall from any other ABI (i386
or x32 on x86_64) kills the process; :data:`DENIED_SYSCALLS` fail with EPERM:

* ``socket`` for every address family (the worker talks over inherited pipes;
  no program needs a socket, and ``socketpair`` stays allowed);
* process inspection: ``ptrace``, ``process_vm_readv``/``process_vm_writev``;
* mounts and namespaces: ``mount``, ``umount2``, ``pivot_root``, ``chroot``,
  ``unshare``, ``setns``, the new mount API (``open_tree``, ``move_mount``,
  ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``mount_setattr``), and
  ``clone`` with any ``CLONE_NEW*`` flag (``clone3``, whose flags a filter
  cannot read, fails with ENOSYS so libc falls back to ``clone``);
* kernel attack surface: ``bpf``, ``perf_event_open``, ``userfaultfd``,
  ``io_uring_setup``/``enter``/``register`` (io_uring would bypass this
  filter), ``keyctl``/``add_key``/``request_key``, ``open_by_handle_at``;
* host administration: ``kexec_load``/``kexec_file_load``, ``init_module``/
  ``finit_module``/``delete_module``, ``reboot``, ``swapon``/``swapoff``,
  ``acct``.

landlock (any ABI >= 1, features added as the kernel offers them): read-only
access beneath the given interpreter/system paths, full access beneath the
scratch dir only, no execve anywhere; from ABI 4 no TCP bind/connect, from
ABI 6 no signals to processes outside the sandbox and no abstract unix sockets.
"""

import ctypes
import errno
import os
import struct

# ---- seccomp ---------------------------------------------------------------------

# AUDIT_ARCH value and syscall numbers per machine.
_ARCH = {
    "x86_64": (0xC000003E, {
        "socket": 41, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272,
        "setns": 308, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "keyctl": 250, "add_key": 248, "request_key": 249, "open_by_handle_at": 304,
        "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "reboot": 169, "swapon": 167,
        "swapoff": 168, "acct": 163, "clone": 56, "clone3": 435, "seccomp": 317}),
    "aarch64": (0xC00000B7, {
        "socket": 198, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97,
        "setns": 268, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "keyctl": 219, "add_key": 217, "request_key": 218, "open_by_handle_at": 265,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "reboot": 142, "swapon": 224,
        "swapoff": 225, "acct": 89, "clone": 220, "clone3": 435, "seccomp": 277}),
}
# Numbers shared by every architecture (the unified table from 403 on).
_COMMON = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
           "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
           "fsmount": 432, "fspick": 433, "mount_setattr": 442}
DENIED_SYSCALLS = (
    "socket", "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2",
    "pivot_root", "chroot", "unshare", "setns", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "bpf", "perf_event_open",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl",
    "add_key", "request_key", "open_by_handle_at", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct")
# CLONE_NEWTIME | NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NS_FLAGS = 0x80 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 \
    | 0x20000000 | 0x40000000

_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_KILL_PROCESS, _RET_ALLOW, _RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_X32_BIT = 0x40000000


def machine():
  """Kernel machine name, normalised (``arm64`` -> ``aarch64``)."""
  m = os.uname().machine
  return {"arm64": "aarch64", "amd64": "x86_64"}.get(m.lower(), m.lower())


def seccomp_program(arch=None):
  """The filter as a list of ``(code, jt, jf, k)`` classic-BPF instructions.

  Raises:
    ValueError: for an architecture without a syscall table here.
  """
  arch = arch or machine()
  if arch not in _ARCH:
    raise ValueError("no seccomp syscall table for architecture %r; supported: %s"
                     % (arch, sorted(_ARCH)))
  audit_arch, table = _ARCH[arch]
  nrs = dict(_COMMON, **table)
  eperm = _RET_ERRNO | errno.EPERM
  prog = [(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
          (_JEQ_K, 1, 0, audit_arch),
          (_RET_K, 0, 0, _RET_KILL_PROCESS),
          (_LD_W_ABS, 0, 0, 0)]  # seccomp_data.nr
  if arch == "x86_64":
    prog += [(_JGE_K, 0, 1, _X32_BIT), (_RET_K, 0, 0, _RET_KILL_PROCESS)]
  for name in DENIED_SYSCALLS:
    prog += [(_JEQ_K, 0, 1, nrs[name]), (_RET_K, 0, 0, eperm)]
  prog += [(_JEQ_K, 0, 1, nrs["clone3"]), (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS)]
  # clone: the flags are the first argument (low word at offset 16).
  prog += [(_JEQ_K, 0, 3, nrs["clone"]),
           (_LD_W_ABS, 0, 0, 16),
           (_JSET_K, 0, 1, _CLONE_NS_FLAGS),
           (_RET_K, 0, 0, eperm),
           (_RET_K, 0, 0, _RET_ALLOW)]
  return prog


class _SockFprog(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_L = ctypes.c_long


# Filled by prepare() in a process that forks confined children (the fork
# server), so each child only makes the syscalls.
_PREPARED = {}


def _libc():
  lib = _PREPARED.get("libc")
  return lib if lib is not None else ctypes.CDLL(None, use_errno=True)


def prepare():
  """Does once, before forking, what every confined child would repeat.

  Loads libc and resolves the functions used here, asks the kernel for its
  landlock ABI and builds the seccomp filter; later calls in this process
  and its forked children reuse them.
  """
  lib = ctypes.CDLL(None, use_errno=True)
  for name in ("prctl", "syscall"):
    getattr(lib, name)
  _PREPARED["libc"] = lib
  _PREPARED["landlock_abi"] = landlock_abi(lib)
  try:
    _PREPARED["seccomp"] = _seccomp_bytes(machine())
  except ValueError:
    pass
  return lib


def _seccomp_bytes(arch):
  prog = seccomp_program(arch)
  return len(prog), b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def set_no_new_privs(libc=None):
  """prctl(PR_SET_NO_NEW_PRIVS): required before an unprivileged seccomp/landlock."""
  libc = libc or _libc()
  if libc.prctl(38, 1, 0, 0, 0) != 0:
    e = ctypes.get_errno()
    raise OSError(e, "prctl(PR_SET_NO_NEW_PRIVS) failed: %s" % os.strerror(e))


def apply_seccomp(libc=None):
  """Installs the filter on the calling process; returns a status line.

  Raises:
    OSError: the kernel refused the filter (no CONFIG_SECCOMP_FILTER, or no
      ``no_new_privs`` and no CAP_SYS_ADMIN).
    ValueError: unsupported architecture.
  """
  libc = libc or _libc()
  arch = machine()
  n, raw = _PREPARED.get("seccomp") or _seccomp_bytes(arch)
  buf = ctypes.create_string_buffer(raw, len(raw))
  fprog = _SockFprog(n, ctypes.addressof(buf))
  nr = _ARCH[arch][1]["seccomp"]
  # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog)
  rc = libc.syscall(_L(nr), _L(1), _L(1), ctypes.byref(fprog))
  if rc != 0 and ctypes.get_errno() == errno.ENOSYS:
    rc = libc.prctl(22, 2, ctypes.byref(fprog), 0, 0)  # PR_SET_SECCOMP, MODE_FILTER
  if rc != 0:
    e = ctypes.get_errno()
    raise OSError(e, "installing the seccomp filter failed: %s" % os.strerror(e))
  return "%d syscalls denied (%s)" % (len(DENIED_SYSCALLS) + 2, arch)


# ---- landlock ----------------------------------------------------------------------

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 14, 1 << 15
_FS_V1 = (1 << 13) - 1          # execute .. make_sym
_FS_REFER = 1 << 13             # ABI 2
# Rights that apply to a regular (non-directory) file.
_FS_FILE = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
_MAKE_CHAR, _MAKE_SOCK, _MAKE_BLOCK = 1 << 6, 1 << 9, 1 << 11


def landlock_abi(libc=None):
  """(abi, reason): the kernel's landlock ABI version, or 0 and why it is missing."""
  try:
    libc = libc or _libc()
  except OSError as e:
    return 0, "libc not loadable: %s" % e
  if machine() not in _ARCH:
    return 0, "landlock syscall numbers unknown on architecture %r" % machine()
  abi = libc.syscall(_L(_SYS_CREATE_RULESET), None, _L(0), _L(1))  # _VERSION
  if abi >= 1:
    return abi, ""
  e = ctypes.get_errno()
  if e == errno.ENOSYS:
    return 0, "kernel lacks landlock (built without CONFIG_SECURITY_LANDLOCK)"
  if e == errno.EOPNOTSUPP:
    return 0, "landlock is built in but disabled at boot (add landlock to lsm=)"
  return 0, "landlock_create_ruleset failed: %s" % os.strerror(e)


def _fs_rights(abi):
  rights = _FS_V1
  if abi >= 2:
    rights |= _FS_REFER
  if abi >= 3:
    rights |= _FS_TRUNCATE
  if abi >= 5:
    rights |= _FS_IOCTL_DEV
  return rights


def apply_landlock(read_paths, write_paths, dev_paths=(), libc=None):
  """Confines the calling process's filesystem access; returns a status line.

  Args:
    read_paths: trees readable (files and directory listings), never written.
    write_paths: trees with full access except execve and device nodes.
    dev_paths: character devices (``/dev/null``...) readable and writable.
    libc: a ctypes libc handle (default: loaded here).

  Missing paths are skipped. Raises OSError when landlock is unavailable
  (the message says why) or a rule cannot be added.
  """
  libc = libc or _libc()
  abi, why = _PREPARED.get("landlock_abi") or landlock_abi(libc)
  if not abi:
    raise OSError(errno.EOPNOTSUPP, why)
  handled = _fs_rights(abi)
  net = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0
  scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL if abi >= 6 else 0
  attr = struct.pack("=QQQ", handled, net, scoped)
  size = 8 if abi < 4 else (16 if abi < 6 else 24)
  attr_buf = ctypes.create_string_buffer(attr[:size], size)
  ruleset = libc.syscall(_L(_SYS_CREATE_RULESET), attr_buf, _L(size), _L(0))
  if ruleset < 0:
    e = ctypes.get_errno()
    raise OSError(e, "landlock_create_ruleset(abi=%d) failed: %s" % (abi, os.strerror(e)))
  read = _FS_READ_FILE | _FS_READ_DIR
  write = handled & ~(_FS_EXECUTE | _MAKE_CHAR | _MAKE_BLOCK | _MAKE_SOCK)
  dev = (_FS_READ_FILE | _FS_WRITE_FILE | _FS_TRUNCATE) & handled
  rules = 0
  try:
    for paths, access in ((read_paths, read), (write_paths, write), (dev_paths, dev)):
      for path in paths:
        try:
          fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
          continue
        try:
          allowed = access if os.path.isdir(path) else access & _FS_FILE
          rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)
          if libc.syscall(_L(_SYS_ADD_RULE), _L(ruleset), _L(_RULE_PATH_BENEATH), rule,
                          _L(0)) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "landlock_add_rule(%s) failed: %s" % (path, os.strerror(e)))
          rules += 1
        finally:
          os.close(fd)
    if libc.syscall(_L(_SYS_RESTRICT_SELF), _L(ruleset), _L(0)) != 0:
      e = ctypes.get_errno()
      raise OSError(e, "landlock_restrict_self failed: %s" % os.strerror(e))
  finally:
    os.close(ruleset)
  extras = (["tcp"] if net else []) + (["signal", "abstract_unix"] if scoped else [])
  return "abi=%d, %d rules%s" % (abi, rules,
                                 ", scoped: " + "+".join(extras) if extras else "")
