"""The fork server (zygote): one pre-imported process per pool that forks every worker.

Standard library only (see ``__main__.py``); the parent side is ``forkserver.py``. The
server does the part shared by all workers once (confinement code loaded and prepared,
mounts, pre-imports, ``no_new_privs``) and forks one worker per request. Each forked worker
takes its own session and process group, its own pid namespace (given by the server: it is
pid 1 there), mount, ipc and uts namespaces with a private ``/proc`` and, under bubblewrap,
its own scratch tmpfs, reseeds ``random``, then runs the jail's shared hardening
(:func:`jail.harden`) before serving requests (:func:`host.serve`).
"""

import json
import os
import signal
import sys

from . import host
from . import jail
from . import wire


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
  z.confine_ns, z.confine_why = jail.load_confine(cfg.get("confine") or {})
  z.libc = jail.libc_handle()
  if z.confine_ns is not None:
    z.libc = z.confine_ns["prepare"]()
  for name in ("mount", "unshare", "setns", "prctl", "capset"):
    getattr(z.libc, name)  # Resolved once here, not in every child.
  jail.set_rlimits(cfg.get("rlimits", {}))
  jail.mask_paths(cfg.get("mask_paths", ()), z.libc)
  jail.private_tmp(cfg.get("tmpfs_paths", ()), cfg.get("keep_paths", ()), z.libc)
  for name in cfg.get("preimport", ()):
    try:
      __import__(name)
    except ImportError:
      pass
  jail.build_modules(cfg.get("modules", ()))
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
  if libc.unshare(jail.CLONE_NEWNS | jail.CLONE_NEWIPC | jail.CLONE_NEWUTS) != 0:
    raise jail.os_error(libc, "unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS)")
  flags = jail.MS_NOSUID | jail.MS_NODEV | jail.MS_NOEXEC
  if libc.mount(b"proc", b"/proc", b"proc", flags, None) != 0:
    raise jail.os_error(libc, "mounting a private /proc")
  if size:
    opts = ("size=%d,mode=0700" % int(size)).encode()
    flags = jail.MS_NOSUID | jail.MS_NODEV
    if libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", flags, opts) != 0:
      raise jail.os_error(libc, "mounting a scratch tmpfs at %s" % scratch)


def _probe_namespaces(z, scratch):
  """Forks one child through every per-worker namespace step; "" or why it failed."""
  if z.libc.unshare(jail.CLONE_NEWPID) != 0:
    return str(jail.os_error(z.libc, "unshare(CLONE_NEWPID)"))
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
  if z.libc.setns(z.pidns_fd, jail.CLONE_NEWPID) != 0:
    os.write(2, ("fork server: %s\n" % jail.os_error(z.libc, "setns")).encode())
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
    if z.pidns_fd is not None and z.libc.unshare(jail.CLONE_NEWPID) != 0:
      raise jail.os_error(z.libc, "unshare(CLONE_NEWPID)")
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
  if z.pidns_fd is not None and z.libc.setns(z.pidns_fd, jail.CLONE_NEWPID) != 0:
    # Later workers would be born into this worker's namespace: stop serving.
    os.write(2, ("fork server: %s\n" % jail.os_error(z.libc, "setns")).encode())
    os._exit(71)
  sock = socket.socket(fileno=sock_fd)
  try:
    if pid < 0:
      sock.sendall(wire.frame({"ok": False, "detail": detail}))
    else:
      z.tracked.add(pid)
      pidfd = os.pidfd_open(pid)
      try:
        socket.send_fds(sock, [wire.frame({"ok": True, "zpid": pid})], [pidfd])
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
  cfg["_layers"] = jail.harden(cfg, z.confine_ns, z.confine_why, libc)
  null = os.open(os.devnull, os.O_RDWR)
  os.dup2(null, 2)
  os.close(null)
  host.serve(rfd, wfd, cfg)


def main(cfg):
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
