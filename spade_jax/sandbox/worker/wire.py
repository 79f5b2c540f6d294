"""Framing of the worker protocol: 4-byte big-endian length, then that many bytes of JSON.

Every reply is ``{"id", "ok", "value"}`` or ``{"id", "ok": false, "reason", "detail"}``;
``reason`` is one of ``spade_jax.sandbox.FAILURES``. Standard library only (see
``__main__.py``).
"""

import json
import os
import struct

HEADER = struct.Struct(">I")


def read_exact(fd, n):
  """``n`` bytes from ``fd``, or None at EOF."""
  chunks = []
  while n:
    chunk = os.read(fd, min(n, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    n -= len(chunk)
  return b"".join(chunks)


def recv(fd, max_bytes):
  """The next request, or None at EOF; a frame over ``max_bytes`` ends the worker."""
  header = read_exact(fd, HEADER.size)
  if header is None:
    return None
  (n,) = HEADER.unpack(header)
  if n > max_bytes:
    os._exit(3)
  body = read_exact(fd, n)
  if body is None:
    return None
  return json.loads(body.decode("utf-8"))


def send(fd, obj, max_bytes):
  """Writes one reply; an unserialisable or oversized one becomes a failure reply."""
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
  view = memoryview(HEADER.pack(len(data)) + data)
  while view:
    n = os.write(fd, view)
    view = view[n:]


def frame(obj):
  """One frame of ``obj`` (the fork server's spawn reply)."""
  data = json.dumps(obj).encode("utf-8")
  return HEADER.pack(len(data)) + data
