"""Parent side of one worker process: framing, concurrent exchange, and kill.

Frames are a 4-byte big-endian length and that many bytes of UTF-8 JSON (see
``_worker.py``). :func:`exchange` sends one request to each of many workers and
gathers all replies in a single ``poll`` loop with non-blocking pipes, so
workers run concurrently, no slow or hostile worker can block the parent, and
each call has a wall-clock deadline after which the worker's whole process
group is killed.
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


class WorkerProcess:
  """A started worker: its pipes, read buffer and death bookkeeping."""

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
    os.set_blocking(self.wfd, False)
    os.set_blocking(self.rfd, False)
    self.buf = bytearray()
    self.seq = 0
    self.dead = False
    self.reason: str | None = None
    self.detail = ""
    self.loaded = False

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


def _finish_dead(w: WorkerProcess, default_reason: str, default_detail: str) -> None:
  """Worker closed its pipe: wait briefly for its status, then kill the group."""
  rc = w.peek_exit(timeout=0.5)
  reason, detail = death_reason(rc)
  if rc is None:
    reason, detail = default_reason, default_detail
  tail = w.stderr_tail() if not w.loaded else ""
  if tail:
    detail += f"; worker stderr: {tail}"
  w.mark_dead(reason, detail)


def exchange(workers: list[WorkerProcess], requests: list[dict[str, Any]], timeout_s: float,
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
