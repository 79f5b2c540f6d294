"""Parent side of one worker process: framing, concurrent exchange, and kill.

A worker is a :class:`WorkerProcess` (started by itself, talking over pipes)
or a :class:`ForkedWorker` (forked by the pool's fork server, talking over a
unix socket). Frames are a 4-byte big-endian length and that many bytes of
UTF-8 JSON (see ``worker/wire.py``). :func:`exchange` sends one request to each of
many workers and gathers all replies in a single ``poll`` loop with
non-blocking fds, so workers run concurrently, no slow or hostile worker can
block the parent, and each call has a wall-clock deadline after which the
worker (with its whole process group or pid namespace) is killed.
"""

import dataclasses
import json
import os
import select
import signal
import struct
import subprocess
import time
from typing import Any

_HEADER = struct.Struct(">I")
_READ_CHUNK = 1 << 16


class _Worker:
  """What every worker has, however it was started: protocol fds and death bookkeeping."""

  scratch: str
  err_path: str
  uid: int | None
  pid: int
  rfd: int
  wfd: int

  def _init_state(self) -> None:
    os.set_blocking(self.wfd, False)
    os.set_blocking(self.rfd, False)
    self.buf = bytearray()
    self.seq = 0
    self.dead = False
    self.reason: str | None = None
    self.detail = ""
    self.loaded = False

  def kill(self) -> None:
    raise NotImplementedError

  def exited(self) -> bool:
    """Whether the worker process has already exited (without waiting)."""
    raise NotImplementedError

  def mark_dead(self, reason: str, detail: str) -> None:
    if not self.dead:
      self.dead, self.reason, self.detail = True, reason, detail
    self.kill()

  def stderr_tail(self, n: int = 600) -> str:
    try:
      with open(self.err_path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - n))
        return f.read().decode("utf-8", "replace").strip()
    except OSError:
      return ""


class WorkerProcess(_Worker):
  """A worker started by itself (launcher + interpreter): its pipes and process."""

  def __init__(self, argv: list[str], env: dict[str, str], scratch: str, err_path: str,
               uid: int | None):
    self.scratch = scratch
    self.err_path = err_path
    self.uid = uid
    with open(err_path, "wb") as err:
      self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=err, env=env, cwd=scratch, bufsize=0,
                                   start_new_session=True, close_fds=True)
    self.pid = self.proc.pid
    self.wfd = self.proc.stdin.fileno()
    self.rfd = self.proc.stdout.fileno()
    self._init_state()

  def kill(self) -> None:
    """SIGKILLs the worker's process group (idempotent, never raises).

    Does nothing once the leader is reaped: its pid, and so the group id,
    may then belong to an unrelated process.
    """
    if self.proc.returncode is not None:
      return
    for target in (lambda: os.killpg(self.pid, signal.SIGKILL),
                   lambda: self.proc.kill()):
      try:
        target()
      except (ProcessLookupError, PermissionError, OSError):
        pass

  def exited(self) -> bool:
    return self.peek_exit(0) is not None

  def peek_exit(self, timeout: float) -> int | None:
    """Exit status (Popen convention) once the leader exits, without reaping it."""
    if self.proc.returncode is not None:
      return self.proc.returncode
    deadline = time.monotonic() + timeout
    while True:
      try:
        info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
      except ChildProcessError:
        return self.proc.returncode
      if info is not None:
        if info.si_code == os.CLD_EXITED:
          return info.si_status
        return -info.si_status
      if time.monotonic() >= deadline:
        return None
      time.sleep(0.005)

  def reap(self, timeout: float = 2.0) -> int | None:
    try:
      return self.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      return None

  def close_pipes(self) -> None:
    for f in (self.proc.stdin, self.proc.stdout):
      try:
        f.close()
      except OSError:
        pass


class ForkedWorker(_Worker):
  """A worker forked by the pool's fork server (see ``forkserver.py``).

  The fork server (the worker's parent) keeps the worker unreaped until
  :meth:`reap`, so its pid and process group id cannot be reused before then
  and killing the group is safe. Death is watched through a pidfd, which
  names exactly this process even across pid namespaces.

  Args:
    server: the :class:`~spade_jax.sandbox.forkserver.ForkServer` that forked it.
    sock: the parent end of the worker's protocol socket.
    pidfd: a pidfd of the worker (from the fork server).
    zpid: the worker's pid as the fork server sees it (for its reap request).
    scratch: host path of the scratch dir.
    err_path: file that receives the worker's start-up errors.
    uid: the worker's uid, or None without the uid drop.
    host_scratch: whether the worker writes to the host dir ``scratch`` (else
      its scratch is a tmpfs of its own and ``scratch`` stays empty).
  """

  def __init__(self, server, sock, pidfd: int, zpid: int, scratch: str, err_path: str,
               uid: int | None, host_scratch: bool = True):
    self.server = server
    self.sock = sock
    self.pidfd = pidfd
    self.zpid = zpid
    self.scratch = scratch
    self.err_path = err_path
    self.uid = uid
    self.pid = pidfd_pid(pidfd)
    self.rfd = sock.fileno()
    self.wfd = os.dup(self.rfd)
    self._init_state()
    self._status: int | None = None
    self._reaped = False
    self._host_scratch = host_scratch

  def kill(self) -> None:
    """SIGKILLs the worker and, where it shares a pid namespace, its process group.

    A worker in a pid namespace of its own takes every process in it down when
    it dies; otherwise its group is killed too, while the fork server still
    holds the worker's pid (so the group id cannot name another process).
    """
    if self._reaped:
      return
    try:
      signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
    except OSError:
      pass
    if not self.server.pidns and self.pid > 0 and self.server.alive:
      try:
        os.killpg(self.pid, signal.SIGKILL)
      except OSError:
        pass

  def exited(self) -> bool:
    if self._reaped:
      return True
    if self.server.pidns and not self.server.alive:
      return True  # Its pid namespace lives inside the server's: it dies (or died) with it.
    poller = select.poll()
    poller.register(self.pidfd, select.POLLIN)
    return bool(poller.poll(0))

  def peek_exit(self, timeout: float) -> int | None:
    """Exit status (Popen convention) once the worker exits; None before that."""
    if self._reaped:
      return self._status
    poller = select.poll()
    poller.register(self.pidfd, select.POLLIN)
    if not poller.poll(max(0, int(timeout * 1000))):
      return None
    if not self.server.alive:
      return None  # Its pid may already be reused: the status is unknown.
    return exit_status(self.pid)

  def reap(self, timeout: float = 2.0) -> int | None:
    """Waits up to ``timeout`` for the (killed) worker to exit, then lets the server reap it.

    The wait is what makes deleting a host scratch dir afterwards safe (a
    write in flight when SIGKILL landed has finished). A worker with a tmpfs
    scratch of its own leaves nothing on the host, so it is not waited for:
    its exit (tearing down its mount namespace and tmpfs, a few ms) then
    overlaps with the caller's work.
    """
    if self._reaped:
      return self._status
    self._status = self.peek_exit(timeout if self._host_scratch else 0)
    self._reaped = True
    self.server.reap(self.zpid)
    return self._status

  def close_pipes(self) -> None:
    for close in (self.sock.close, lambda: os.close(self.wfd), lambda: os.close(self.pidfd)):
      try:
        close()
      except OSError:
        pass
    self.wfd = self.pidfd = -1


def pidfd_pid(pidfd: int) -> int:
  """The pid, in this process's pid namespace, of the process a pidfd refers to (-1: gone)."""
  try:
    with open(f"/proc/self/fdinfo/{pidfd}", "rb") as f:
      for line in f:
        if line.startswith(b"Pid:"):
          return int(line.split()[1])
  except (OSError, ValueError, IndexError):
    pass
  return -1


def exit_status(pid: int) -> int | None:
  """Popen-style exit status of an exited, unreaped process, from /proc; None if unknown."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      fields = f.read().rsplit(b")", 1)[1].split()
  except (OSError, IndexError):
    return None
  if len(fields) < 50 or fields[0] not in (b"Z", b"X"):
    return None
  status = int(fields[49])  # exit_code: the wait status
  if os.WIFSIGNALED(status):
    return -os.WTERMSIG(status)
  return os.WEXITSTATUS(status)


def death_reason(rc: int | None) -> tuple[str, str]:
  """Maps a worker's exit status to (reason, detail)."""
  if rc is None:
    return "crash", "worker closed its pipe but did not exit"
  sig = -rc if rc < 0 else (rc - 128 if rc > 128 else 0)
  if sig:
    try:
      name = signal.Signals(sig).name
    except ValueError:
      name = f"signal {sig}"
    if sig == signal.SIGXCPU:
      return "timeout", f"worker exceeded its CPU-time limit ({name})"
    if sig == signal.SIGXFSZ:
      return "output_too_large", f"worker exceeded its file-size limit ({name})"
    if sig == signal.SIGKILL:
      return "crash", "worker was killed by SIGKILL (out of memory or CPU hard limit?)"
    return "crash", f"worker died from {name}"
  if rc == 3:
    return "output_too_large", "request exceeded the worker's message cap"
  return "crash", f"worker exited with status {rc}"


@dataclasses.dataclass
class Outcome:
  """Result of one request: the reply dict, or a failure reason."""

  reply: dict[str, Any] | None = None
  reason: str | None = None
  detail: str = ""
  seconds: float = 0.0


def _encode(obj: dict[str, Any]) -> bytes:
  data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
  return _HEADER.pack(len(data)) + data


def _finish_dead(w: _Worker, default_reason: str, default_detail: str) -> None:
  """Worker closed its pipe: wait briefly for its status, then kill the group."""
  rc = w.peek_exit(timeout=0.5)
  reason, detail = death_reason(rc)
  if rc is None:
    reason, detail = default_reason, default_detail
  tail = w.stderr_tail() if not w.loaded else ""
  if tail:
    detail += f"; worker stderr: {tail}"
  w.mark_dead(reason, detail)


def exchange(workers: list[_Worker], requests: list[dict[str, Any]], timeout_s: float,
             max_bytes: int) -> list[Outcome]:
  """Sends ``requests[i]`` to ``workers[i]``, all first, then gathers every reply.

  Never raises for worker misbehaviour: a dead, slow, oversized or garbled
  worker yields an :class:`Outcome` with a reason and the worker marked dead.
  """
  n = len(workers)
  out = [Outcome() for _ in range(n)]
  t0 = time.monotonic()
  deadline = t0 + timeout_s
  pending_w: dict[int, tuple[int, memoryview]] = {}
  pending_r: dict[int, int] = {}
  poller = select.poll()
  for i, (w, req) in enumerate(zip(workers, requests)):
    if w.dead:
      out[i] = Outcome(None, w.reason, w.detail)
      continue
    w.seq += 1
    req = dict(req, id=w.seq)
    if w.buf:
      w.mark_dead("crash", "protocol violation: unsolicited bytes from the worker")
      out[i] = Outcome(None, w.reason, w.detail)
      continue
    data = memoryview(_encode(req))
    if len(data) - _HEADER.size > max_bytes:
      out[i] = Outcome(None, "output_too_large",
                       f"request of {len(data)} bytes exceeds max_message_bytes={max_bytes}")
      continue
    try:
      sent = os.write(w.wfd, data)
    except BlockingIOError:
      sent = 0
    except OSError:
      sent = len(data)  # Broken pipe: the reader side will see EOF.
    if sent < len(data):
      pending_w[w.wfd] = (i, data[sent:])
      poller.register(w.wfd, select.POLLOUT)
    pending_r[w.rfd] = i
    poller.register(w.rfd, select.POLLIN)

  def finish(i: int, reason: str | None = None, detail: str = "",
             reply: dict[str, Any] | None = None) -> None:
    w = workers[i]
    out[i] = Outcome(reply, reason, detail, time.monotonic() - t0)
    pending_r.pop(w.rfd, None)
    for fd in (w.rfd, w.wfd):
      try:
        poller.unregister(fd)
      except KeyError:
        pass
    pending_w.pop(w.wfd, None)

  while pending_r:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      break
    for fd, ev in poller.poll(max(1, int(remaining * 1000))):
      if fd in pending_w:
        i, data = pending_w[fd]
        w = workers[i]
        try:
          sent = os.write(fd, data)
        except BlockingIOError:
          continue
        except OSError:
          sent = len(data)
        if sent >= len(data):
          del pending_w[fd]
          poller.unregister(fd)
        else:
          pending_w[fd] = (i, data[sent:])
        continue
      i = pending_r.get(fd)
      if i is None:
        continue
      w = workers[i]
      try:
        chunk = os.read(fd, _READ_CHUNK)
      except BlockingIOError:
        continue
      except OSError:
        chunk = b""
      if not chunk:
        _finish_dead(w, "crash", "worker closed its pipe")
        finish(i, w.reason, w.detail)
        continue
      w.buf += chunk
      if len(w.buf) < _HEADER.size:
        continue
      (size,) = _HEADER.unpack_from(w.buf)
      if size > max_bytes:
        w.mark_dead("output_too_large",
                    f"reply of {size} bytes exceeds max_message_bytes={max_bytes}")
        finish(i, w.reason, w.detail)
        continue
      if len(w.buf) < _HEADER.size + size:
        continue
      body = bytes(w.buf[_HEADER.size:_HEADER.size + size])
      del w.buf[:_HEADER.size + size]
      try:
        reply = json.loads(body.decode("utf-8", "surrogatepass"))
        if not isinstance(reply, dict) or reply.get("id") != w.seq:
          raise ValueError("reply id does not match the request")
      except (ValueError, UnicodeDecodeError, RecursionError) as e:
        w.mark_dead("crash", f"protocol violation: {e}")
        finish(i, w.reason, w.detail)
        continue
      finish(i, reply=reply)
  for fd, i in list(pending_r.items()):
    w = workers[i]
    w.mark_dead("timeout", f"no reply within the {timeout_s:g}s deadline")
    finish(i, w.reason, w.detail)
  return out
