"""WorkerSupply: the worker processes behind one pool.

It starts workers (forked by the pool's fork server, ``forkserver.py``, or where that
cannot run each started by itself: launcher + interpreter), restarts a fork server that
died (a few times, then starts workers by themselves), hands each worker its own uid and
scratch dir, keeps ``num_workers`` warm spares, and kills and cleans up what it started.
What runs inside a worker is the package ``worker/``; the OS layers around it are in
``isolation.py``. The batched env API on top is :class:`spade_jax.sandbox.EnvPool`.

Thread safety: every method may be called from several threads. Launcher processes are
started from one long-lived spawner thread (see :meth:`WorkerSupply.spawn`).
"""

import collections
import concurrent.futures
import importlib
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

from spade_jax.sandbox import forkserver, isolation
from spade_jax.sandbox.config import DEFAULT_PREIMPORT, SandboxConfig
from spade_jax.sandbox.process import ForkedWorker, WorkerProcess, exchange

# Fork-server deaths a supply recovers from by restarting it; after that it
# starts each worker by itself.
MAX_SERVER_RESTARTS = 3

_log = logging.getLogger(__name__)

Worker = WorkerProcess | ForkedWorker


class WorkerSupply:
  """Worker processes for one pool, under one launcher plan.

  Attributes:
    config: the SandboxConfig.
    plan: the launcher plan in use (see :meth:`adopt`).
    base: the pool's private dir (worker scratch dirs, logs, the precompiled code).
    preimport: modules fresh workers import before the uid drop.
    fork_server_note: how workers are started, and why not forked when they are not.
    server: the fork server, or None while workers are started by themselves.
  """

  def __init__(self, config: SandboxConfig, plan: isolation.IsolationPlan):
    self.config = cfg = config
    self.base = tempfile.mkdtemp(prefix="spade_sandbox_", dir=cfg.scratch_root)
    os.chmod(self.base, 0o711)
    # Worker scratch dirs only: under a private /tmp the fork server keeps this
    # dir visible, not the rest of the base dir (self-test files, logs).
    self._scratch_root = os.path.join(self.base, "scratch")
    os.mkdir(self._scratch_root, 0o711)
    os.chmod(self._scratch_root, 0o711)
    self._confine_code = isolation.write_confine_code(self.base)
    self._worker_code = isolation.write_worker_code(self.base)
    self._lock = threading.Lock()
    self._spares: collections.deque[Worker] = collections.deque()
    self._live: dict[int, Worker] = {}
    self._counter = 0
    self._spawner = concurrent.futures.ThreadPoolExecutor(
        1, thread_name_prefix="spade-sandbox-spawn")
    self._uid_cursor = random.SystemRandom().randrange(cfg.uid_count)
    self._closed = False
    self._python_hexversion = sys.hexversion if isolation.worker_python(cfg.python) \
        == isolation.worker_python() else None
    self.server: forkserver.ForkServer | None = None
    self._server_lock = threading.Lock()
    self._server_restarts = 0
    self.fork_server_note = ""
    self.preimport: tuple[str, ...] = ()
    self.modules = worker_modules(cfg.modules)
    self.plan = plan
    self.adopt(plan)

  @property
  def closed(self) -> bool:
    return self._closed

  def _code_files(self) -> tuple[str, ...]:
    """The precompiled code every worker reads at start (bound under bubblewrap)."""
    return (self._confine_code, self._worker_code)

  def _worker_code_spec(self) -> dict:
    return isolation.worker_code_spec(self._worker_code, self._python_hexversion)

  def adopt(self, plan: isolation.IsolationPlan) -> None:
    """Sets the launcher plan and what depends on it, and (re)starts the fork server."""
    self.plan = plan
    unshare_root = plan.launcher == "unshare" and os.geteuid() == 0
    self._mask = isolation.accelerator_nodes() if unshare_root else []
    self._tmpfs = isolation.world_writable_dirs() if unshare_root else []
    with self._server_lock:
      old, self.server = self.server, None
    if old is not None:
      old.close()
    self._server_restarts = 0
    # Pre-imports cost nothing per worker when the zygote holds them; a worker
    # started by itself under bubblewrap boots fastest importing lazily.
    preimport = self.config.preimport
    self.preimport = DEFAULT_PREIMPORT if preimport is None else tuple(preimport)
    server = self._start_server()
    with self._server_lock:
      self.server = server
    if preimport is None and plan.launcher == "bwrap" and server is None:
      self.preimport = ()

  def _start_server(self) -> "forkserver.ForkServer | None":
    """Starts a fork server under the current plan; None (with a note why) if it cannot run."""
    cfg = self.config
    if not cfg.fork_server:
      self.fork_server_note = "started one by one (SandboxConfig.fork_server=False)"
      return None
    ok, why = forkserver.supported()
    if not ok:
      self.fork_server_note = f"started one by one (no fork server: {why})"
      _log.info("Sandbox fork server unavailable (%s); starting each worker by itself.", why)
      return None
    plan = self.plan
    inside = isolation.inside_scratch(plan, self.base)
    rlimits = {"RLIMIT_AS": cfg.memory_mb << 20, "RLIMIT_FSIZE": cfg.file_size_mb << 20,
               "RLIMIT_NOFILE": max(cfg.max_open_files, 16), "RLIMIT_CORE": 0}
    zcfg = {"zygote": True, "rlimits": rlimits, "mask_paths": self._mask,
            "tmpfs_paths": self._tmpfs,
            "keep_paths": [self._scratch_root] + isolation.python_dirs(plan.python),
            "preimport": list(self.preimport), "modules": self.modules,
            "pidns": plan.launcher != "none",
            "scratch_probe": isolation.BWRAP_SCRATCH if plan.launcher == "bwrap" else None,
            "confine": isolation.confine_spec(cfg, plan, inside, self._confine_code,
                                              self._python_hexversion),
            "worker_code": self._worker_code_spec()}
    argv = isolation.worker_command(plan, self.base, json.dumps(zcfg), cfg.scratch_mb << 20,
                                    self._code_files(), zygote=True)
    with self._lock:
      n = self._counter
      self._counter += 1
    args = (argv, isolation.worker_env(inside), self.base,
            os.path.join(self.base, f"zygote{n}.err"), cfg.load_timeout_s)
    try:
      # From the spawner thread, like every launcher process (see spawn).
      if threading.current_thread().name.startswith("spade-sandbox-spawn"):
        server = forkserver.ForkServer(*args)
      else:
        server = self._spawner.submit(forkserver.ForkServer, *args).result()
    except (forkserver.ForkServerError, OSError, RuntimeError) as e:
      self.fork_server_note = f"started one by one (the fork server failed: {e})"
      _log.warning("Sandbox fork server failed to start under %s (%s); starting each worker "
                   "by itself.", plan.launcher, e)
      return None
    if plan.launcher != "none" and not server.pidns:
      server.close()
      why = server.pidns_why
      self.fork_server_note = ("started one by one (the fork server cannot give each worker "
                               f"its own pid namespace: {why})")
      _log.warning("Sandbox fork server cannot give each worker its own pid namespace under "
                   "%s (%s); starting each worker by itself.", plan.launcher, why)
      return None
    self.fork_server_note = "forked by the fork server"
    return server

  def _server_failed(self, server: "forkserver.ForkServer", error: Exception) -> None:
    """Restarts a fork server that died (a few times), then starts workers by themselves."""
    with self._server_lock:
      if self.server is not server or self._closed:
        return
      self.server = None  # Meanwhile workers are started by themselves.
      restart = self._server_restarts < MAX_SERVER_RESTARTS
      self._server_restarts += restart
    server.close()
    if not restart:
      self.fork_server_note = f"started one by one (the fork server kept failing: {error})"
      _log.warning("Sandbox fork server failed %d times (%s); starting each worker by "
                   "itself from now on.", self._server_restarts + 1, error)
      return
    _log.warning("Sandbox fork server failed (%s); restarting it.", error)
    new = self._start_server()  # Not under the lock: it may wait for the spawner thread.
    with self._server_lock:
      if self.server is None and not self._closed:
        self.server, new = new, None
    if new is not None:
      new.close()


  def close(self) -> None:
    """Kills every worker this supply started and deletes all scratch dirs."""
    with self._lock:
      if self._closed:
        return
      self._closed = True
    on_spawner = threading.current_thread().name.startswith("spade-sandbox-spawn")
    self._spawner.shutdown(wait=not on_spawner, cancel_futures=True)
    with self._lock:
      workers = list(self._live.values())
      self._live.clear()
      self._spares.clear()
    self._destroy(workers)
    with self._server_lock:
      server, self.server = self.server, None
    if server is not None:
      server.close()
    shutil.rmtree(self.base, ignore_errors=True)

  @property
  def live_workers(self) -> int:
    return len(self._live)

  @property
  def worker_pids(self) -> list[int]:
    return [w.pid for w in self._live.values()]

  def spawn(self, preimport: Sequence[str] | None = None, *,
            on_spawner: bool = False) -> Worker | None:
    """A fresh worker (forked when the fork server runs); None once closed.

    Args:
      preimport: modules it imports before the uid drop (default: :attr:`preimport`).
      on_spawner: the caller is the spawner thread itself.
    """
    cfg = self.config
    with self._lock:
      if self._closed:
        return None
      n = self._counter
      self._counter += 1
    scratch = os.path.join(self._scratch_root, f"w{n}")
    os.mkdir(scratch, 0o700)
    uid = None
    if self.plan.drop_uid:
      uid = self._next_uid()
      os.chown(scratch, uid, uid)
    rlimits = {"RLIMIT_AS": cfg.memory_mb << 20, "RLIMIT_CPU": cfg.cpu_seconds,
               "RLIMIT_FSIZE": cfg.file_size_mb << 20, "RLIMIT_NOFILE": cfg.max_open_files,
               "RLIMIT_CORE": 0}
    if uid is not None:
      rlimits["RLIMIT_NPROC"] = cfg.max_processes
    inside = isolation.inside_scratch(self.plan, scratch)
    err_path = os.path.join(self.base, f"w{n}.err")
    wcfg = {"scratch": inside, "chown_scratch": inside != scratch,
            "uid": uid, "gid": uid, "rlimits": rlimits,
            "preimport": list(self.preimport if preimport is None else preimport),
            "modules": self.modules,
            "no_new_privs": self.plan.launcher != "bwrap",
            "max_message_bytes": cfg.max_message_bytes,
            "max_observation_chars": cfg.max_observation_chars,
            "confine": isolation.confine_spec(cfg, self.plan, inside, self._confine_code,
                                              self._python_hexversion)}
    worker = self._fork(wcfg, scratch, err_path, uid)
    if worker is not None:
      with self._lock:
        self._live[worker.pid] = worker
      return worker
    wcfg.update(mask_paths=self._mask, tmpfs_paths=self._tmpfs,
                worker_code=self._worker_code_spec())
    argv = isolation.worker_command(self.plan, scratch, json.dumps(wcfg), cfg.scratch_mb << 20,
                                    self._code_files())
    # Workers are started from one long-lived thread: the launchers tie the
    # worker's life to the thread that forked it (PR_SET_PDEATHSIG), and a
    # caller's short-lived thread would take its workers down when it exits.
    args = (argv, isolation.worker_env(inside), scratch, err_path, uid)
    if on_spawner:
      worker = WorkerProcess(*args)
    else:
      worker = self._spawner.submit(WorkerProcess, *args).result()
    with self._lock:
      self._live[worker.pid] = worker
    return worker

  def _fork(self, wcfg: dict[str, Any], scratch: str, err_path: str,
            uid: int | None) -> "ForkedWorker | None":
    """A worker forked by the fork server; None to start this one by itself.

    Any thread may fork: the zygote, not this process, is the worker's parent.
    A dead or unresponsive server is restarted (or given up, see
    :meth:`_server_failed`) and asked once more; a server that merely could
    not fork this worker is left running.
    """
    fcfg = dict(wcfg, env=isolation.worker_env(wcfg["scratch"]))
    if self.plan.launcher == "bwrap":
      fcfg["scratch_bytes"] = self.config.scratch_mb << 20
    for _ in range(2):
      server = self.server
      if server is None:
        return None
      try:
        return server.spawn(fcfg, scratch, err_path, uid, self.config.load_timeout_s)
      except forkserver.ForkFailed as e:
        _log.warning("Sandbox fork server could not fork a worker (%s); starting it by "
                     "itself.", e)
        return None
      except forkserver.ForkServerError as e:
        self._server_failed(server, e)
    return None

  def _next_uid(self) -> int:
    """A uid of the configured range not used by any live worker of this pool.

    Each pool starts at a random offset in the range, so pools in different
    processes on one host are unlikely to hand out the same uid.
    """
    cfg = self.config
    with self._lock:
      used = {w.uid for w in self._live.values()}
      for _ in range(cfg.uid_count):
        uid = cfg.uid_base + self._uid_cursor % cfg.uid_count
        self._uid_cursor += 1
        if uid not in used:
          return uid
    raise RuntimeError(f"all {cfg.uid_count} sandbox uids are in use; raise "
                       "SandboxConfig.uid_count or release handles.")

  def refill(self, on_spawner: bool = False) -> None:
    """Starts workers until ``num_workers`` warm spares wait (or the live cap is hit)."""
    while not self._closed:
      with self._lock:
        if len(self._spares) >= self.config.num_workers \
            or len(self._live) >= self.config.max_live_workers:
          return
      worker = self.spawn(on_spawner=on_spawner)
      if worker is None:
        return
      with self._lock:
        if self._closed:
          self._live.pop(worker.pid, None)
          self._destroy([worker])
          return
        self._spares.append(worker)

  def refill_async(self) -> None:
    """Tops up the warm spares from the spawner thread, without waiting."""
    if self.config.num_workers and not self._closed:
      try:
        self._spawner.submit(self.refill, True)
      except RuntimeError:  # Spawner already shut down by close().
        pass

  def take(self) -> Worker | None:
    """A warm spare that is still alive, else a fresh worker; None when at the cap or closed."""
    while True:
      with self._lock:
        if not self._spares:
          if self._closed or len(self._live) >= self.config.max_live_workers:
            return None
          break
        worker = self._spares.popleft()
      if not worker.exited():
        return worker
      # A spare that died idle (e.g. with its fork server): never hand it out.
      with self._lock:
        self._live.pop(worker.pid, None)
      self._destroy([worker])
    return self.spawn()

  def release(self, workers: Sequence[Worker]) -> None:
    """Kills ``workers`` (those this supply still counts as live) and deletes their dirs."""
    with self._lock:
      mine = [w for w in workers if self._live.pop(w.pid, None) is not None]
    self._destroy(mine)

  def _destroy(self, workers: Sequence[Worker]) -> None:
    for w in workers:
      w.kill()
    for w in workers:
      w.reap()
      w.close_pipes()
      if self.plan.launcher == "none" and w.uid is not None:
        _kill_uid(w.uid)
      shutil.rmtree(w.scratch, ignore_errors=True)
      try:
        os.unlink(w.err_path)
      except OSError:
        pass

  def wait_ready(self, timeout_s: float = 10.0) -> bool:
    """Blocks until every warm spare answers a ping; True when all did."""
    with self._lock:
      spares = list(self._spares)
    res = exchange(spares, [{"op": "ping"}] * len(spares), timeout_s,
                   self.config.max_message_bytes)
    bad = [w for w, r in zip(spares, res) if r.reply is None]
    if bad:
      with self._lock:
        for w in bad:
          if w in self._spares:
            self._spares.remove(w)
          self._live.pop(w.pid, None)
      self._destroy(bad)
      self.refill()
    return not bad


def _kill_uid(uid: int) -> None:
  """Kills every process running as ``uid`` (workers own their uid)."""
  try:
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
  except OSError:
    return
  for pid in pids:
    try:
      if os.stat(f"/proc/{pid}").st_uid == uid:
        os.kill(pid, 9)
    except OSError:
      pass


def worker_modules(names: Sequence[str]) -> list[list[str]]:
  """[import name, source] of each ``SandboxConfig.modules`` entry (a host module whose
  ``sandbox_module()`` gives them), checked here so a bad name fails at pool start."""
  out = []
  for name in names:
    try:
      make = getattr(importlib.import_module(name), "sandbox_module")
    except (ImportError, AttributeError) as e:
      raise ValueError(f"SandboxConfig.modules entry {name!r}: expected an importable module "
                       f"defining sandbox_module() -> (import name, source) ({e})") from e
    import_name, source = make()
    compile(source, f"<sandbox module {import_name}>", "exec")  # a syntax error fails here
    out.append([import_name, source])
  return out
