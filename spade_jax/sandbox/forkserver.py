"""Parent side of the fork server: one pre-imported zygote per pool forks every worker.

The zygote is the worker package (``worker/zygote.py``) started in zygote mode
under the pool's launcher (bubblewrap, ``unshare`` or none), with the same
namespaces, environment and uid as a worker started by itself. It loads the
landlock/seccomp code, does the mounts every worker shares (accelerator nodes
masked, a private tmpfs over world-writable dirs), pre-imports the pool's
modules, then waits. A new worker then costs a ``fork`` instead of an interpreter start.

Each forked worker, before any program code runs, gets: its own session and
process group; under a launcher, its own pid namespace (it is pid 1 there, so
its whole process tree dies with it), mount, ipc and uts namespaces and a
private ``/proc``; under bubblewrap its own size-capped tmpfs scratch dir,
else its own host scratch dir; its own rlimits, uid, ``no_new_privs``, and
its own landlock domain (write access to its scratch dir only) and seccomp
filter. Workers of one pool share the zygote's network namespace, where
``socket()`` is denied by seccomp and TCP by landlock.

Control protocol, over a ``SOCK_SEQPACKET`` socket pair (the zygote's fd 0):
the zygote first sends ``{"ok", "pidns", "why", "confine"}``; the parent then
sends ``{"op": "spawn", "cfg": {...}}`` with the worker's protocol socket and
stderr file as ``SCM_RIGHTS`` fds, and ``{"op": "reap", "pid": N}`` once it has
killed a worker. The zygote answers a spawn on the worker's own socket with
a frame ``{"ok": true, "zpid": N}`` and a pidfd of the worker, or
``{"ok": false, "detail"}``. The zygote never reaps a worker before its reap
request, so the parent's pids stay valid until then.
"""

import json
import os
import select
import signal
import socket
import struct
import subprocess
import threading
import time

from spade_jax.sandbox.process import ForkedWorker

_HEADER = struct.Struct(">I")


class ForkServerError(RuntimeError):
  """The fork server failed to start, died, or stopped answering."""


class ForkFailed(ForkServerError):
  """The fork server is fine but could not fork this worker (e.g. EAGAIN)."""


def supported() -> tuple[bool, str]:
  """(whether this host can run a fork server, why not)."""
  if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
    return False, "needs Linux >= 5.3 and Python >= 3.9 (pidfd_open)"
  if not hasattr(socket, "send_fds"):
    return False, "needs socket.send_fds (Python >= 3.9)"
  try:
    os.close(os.pidfd_open(os.getpid()))
  except OSError as e:
    return False, f"pidfd_open fails here: {e}"
  return True, ""


class ForkServer:
  """A running zygote and the control socket to it.

  Args:
    argv: command that starts the worker package in zygote mode under the launcher.
    env: its whole environment.
    cwd: its working directory on the host.
    err_path: file that receives its stderr.
    timeout_s: how long to wait for it to report ready.

  Raises:
    ForkServerError: it exited or did not report ready in time (the message
      carries its stderr).
  """

  def __init__(self, argv: list[str], env: dict[str, str], cwd: str, err_path: str,
               timeout_s: float):
    self.err_path = err_path
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
      with open(err_path, "wb") as err:
        self.proc = subprocess.Popen(argv, stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                                     stderr=err, env=env, cwd=cwd, start_new_session=True,
                                     close_fds=True)
    finally:
      theirs.close()
    self._ctrl = ours
    self._lock = threading.Lock()
    self._closed = False
    ready = self._ready(timeout_s)
    self.pidns = bool(ready.get("pidns"))
    self.pidns_why = str(ready.get("why") or "")
    self.confine_why = str(ready.get("confine") or "")

  def _ready(self, timeout_s: float) -> dict:
    poller = select.poll()
    poller.register(self._ctrl.fileno(), select.POLLIN)
    deadline = time.monotonic() + timeout_s
    while True:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        self.close()
        raise ForkServerError(f"the fork server did not report ready within {timeout_s:g}s"
                              f"{self._stderr()}")
      if poller.poll(max(1, int(remaining * 1000))):
        break
    try:
      msg = self._ctrl.recv(1 << 16)
      ready = json.loads(msg.decode("utf-8")) if msg else None
    except (OSError, ValueError):
      ready = None
    if not isinstance(ready, dict) or not ready.get("ok"):
      self.proc.poll()
      rc = self.proc.returncode
      self.close()
      raise ForkServerError(f"the fork server exited during start-up (status {rc})"
                            f"{self._stderr()}")
    return ready

  def _stderr(self, n: int = 800) -> str:
    try:
      with open(self.err_path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - n))
        tail = f.read().decode("utf-8", "replace").strip()
    except OSError:
      tail = ""
    return f"; its stderr: {tail}" if tail else ""

  @property
  def alive(self) -> bool:
    return not self._closed and self.proc.poll() is None

  def spawn(self, cfg: dict, scratch: str, err_path: str, uid: int | None,
            timeout_s: float) -> ForkedWorker:
    """Forks one worker with per-worker config ``cfg`` (see ``worker/zygote.py``).

    Raises:
      ForkFailed: the server answered that it could not fork.
      ForkServerError: the server is dead, or did not fork within ``timeout_s``.
      OSError: no socket pair or stderr file here (e.g. out of fds).
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
      err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
      try:
        msg = json.dumps({"op": "spawn", "cfg": cfg}).encode("utf-8")
        self._send(msg, [theirs.fileno(), err_fd])
      finally:
        os.close(err_fd)
    except BaseException:
      ours.close()
      raise
    finally:
      theirs.close()
    try:
      reply, pidfd = self._spawn_reply(ours, timeout_s)
    except BaseException:
      ours.close()
      raise
    return ForkedWorker(self, ours, pidfd, int(reply["zpid"]), scratch, err_path, uid,
                        host_scratch=not cfg.get("scratch_bytes"))

  def _send(self, msg: bytes, fds: list[int]) -> None:
    if not self.alive:
      raise ForkServerError(f"the fork server is not running (status {self.proc.returncode})"
                            f"{self._stderr()}")
    try:
      with self._lock:
        socket.send_fds(self._ctrl, [msg], fds)
    except OSError as e:
      raise ForkServerError(f"the fork server's control socket failed: {e}"
                            f"{self._stderr()}") from e

  def _spawn_reply(self, sock: socket.socket, timeout_s: float) -> tuple[dict, int]:
    sock.settimeout(timeout_s)
    try:
      data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1, socket.MSG_CMSG_CLOEXEC)
    except socket.timeout as e:
      raise ForkServerError(f"the fork server did not fork a worker within {timeout_s:g}s"
                            f"{self._stderr()}") from e
    except OSError as e:
      data, fds = b"", []
    try:
      (n,) = _HEADER.unpack_from(data)
      reply = json.loads(data[_HEADER.size:_HEADER.size + n].decode("utf-8"))
    except (struct.error, ValueError):
      reply = None
    if not isinstance(reply, dict) or not reply.get("ok") or len(fds) != 1:
      for fd in fds:
        os.close(fd)
      if isinstance(reply, dict) and reply.get("detail"):
        raise ForkFailed(str(reply["detail"]))
      self.proc.poll()
      raise ForkServerError("the fork server closed the worker's socket without forking "
                            f"(server status {self.proc.returncode}){self._stderr()}")
    return reply, fds[0]

  def reap(self, zpid: int) -> None:
    """Asks the server to kill and reap worker ``zpid`` (no reply; never raises)."""
    try:
      self._send(json.dumps({"op": "reap", "pid": int(zpid)}).encode("utf-8"), [])
    except ForkServerError:
      pass

  def close(self, timeout_s: float = 2.0) -> None:
    """Stops the server; it kills every worker it still holds."""
    with self._lock:
      if self._closed:
        return
      self._closed = True
      self._ctrl.close()  # EOF: the zygote kills its workers and exits.
    try:
      self.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      pass
    if self.proc.returncode is None:
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except OSError:
        pass
      try:
        self.proc.wait(timeout=timeout_s)
      except subprocess.TimeoutExpired:
        pass
