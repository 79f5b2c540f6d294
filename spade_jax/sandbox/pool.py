"""EnvPool: env programs in sandboxed worker processes, driven in batches.

Each env instance lives in its own worker process (see ``_worker.py`` for what
runs inside and ``isolation.py`` for the OS layers around it). Workers are
forked by one pre-imported zygote per pool (``forkserver.py``), so a fresh
worker costs a fork, not an interpreter start; where the fork server cannot
run, each worker is started by itself (launcher + interpreter). The pool
also keeps ``num_workers`` warm idle workers, so a fresh env usually costs one
load message; a worker is never reused for a second program.

Every call returns :class:`CallResult` objects. A crash, hang, limit breach,
bad return type, NaN reward or oversized observation is an outcome with a
reason from :data:`FAILURES`, never an exception. Any failed call ends the
instance (its worker is killed) except a call to a missing optional method
(``hint``/``solution``), which leaves the instance usable.

Thread safety: ``start``/``release``/``close`` may be called from several
threads; one handle must not be used by two threads at once.
"""

import collections
import concurrent.futures
import dataclasses
import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from spade_jax.registry import names
from spade_jax.sandbox import forkserver, isolation
from spade_jax.sandbox.config import DEFAULT_PREIMPORT, SandboxConfig
from spade_jax.sandbox.process import ForkedWorker, Outcome, WorkerProcess, exchange

# Fork-server deaths a pool recovers from by restarting it; after that it
# starts each worker by itself.
_MAX_SERVER_RESTARTS = 3

_log = logging.getLogger(__name__)

# How a sandboxed run can fail: the source does not compile ("syntax"), breaks the
# call contract or returns bad values ("contract"), runs past its deadline or CPU
# limit, runs out of memory, dies, or answers with too much output.
FAILURES = ("syntax", "contract", "timeout", "memory", "crash", "output_too_large")
OPTIONAL_METHODS = ("hint", "solution", "work")
ACTION_MODES = names("auto", "boxed", "raw", "tool_call", kind="action mode")


@dataclasses.dataclass(frozen=True)
class CallResult:
  """Outcome of one sandboxed call.

  Attributes:
    ok: whether the call returned a value that passed the contract checks.
    value: reset -> (obs, info); step -> (obs, reward, terminated, truncated,
      info); hint -> str; solution -> list[str]. None when not ok.
    reason: one of FAILURES when not ok.
    detail: human-readable explanation.
    seconds: wall-clock seconds from sending the request to its reply.
  """

  ok: bool
  value: Any = None
  reason: str | None = None
  detail: str = ""
  seconds: float = 0.0


class EnvHandle:
  """One env instance in one worker. ``alive`` is False once any call failed."""

  def __init__(self, pool: "EnvPool", worker: "WorkerProcess | ForkedWorker | None",
               index: int):
    self._pool = pool
    self._worker = worker
    self.index = index
    self.reason: str | None = None
    self.detail = ""
    self.class_name: str | None = None
    self.has_solution = False
    self.has_hint = False
    self.action_mode = "boxed"
    self.load_seconds = 0.0
    self.layers: dict[str, str] = {}

  @property
  def alive(self) -> bool:
    return self._worker is not None and not self._worker.dead and self.reason is None

  @property
  def pid(self) -> int | None:
    return self._worker.pid if self._worker is not None else None

  @property
  def uid(self) -> int | None:
    """The unprivileged uid the program runs as (None without the uid drop)."""
    return self._worker.uid if self._worker is not None else None

  def _fail(self, reason: str, detail: str) -> None:
    if self.reason is None:
      self.reason, self.detail = reason, detail
    if self._worker is not None:
      self._worker.mark_dead(reason, detail)

  def __repr__(self) -> str:
    state = "alive" if self.alive else f"dead:{self.reason}"
    return f"EnvHandle({self.class_name or '?'}, pid={self.pid}, {state})"


def _check_value(op: str, value: Any, cap: int, method: str | None = None) -> str | None:
  """Re-checks a worker's reply in the parent; returns a problem or None."""
  def text(v, what):
    if not isinstance(v, str):
      return f"{what} must be str, got {type(v).__name__}"
    if len(v) > cap:
      return f"{what} has {len(v)} characters; the cap is {cap}"
    return None
  if op == "reset":
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], dict):
      return "reset() must return (observation: str, info: dict)"
    return text(value[0], "reset() observation")
  if op == "step":
    if not isinstance(value, list) or len(value) != 5:
      return "step() must return (observation, reward, terminated, truncated, info)"
    obs, reward, term, trunc, info = value
    problem = text(obs, "step() observation")
    if problem:
      return problem
    if not isinstance(reward, (int, float)) or isinstance(reward, bool) \
        or not math.isfinite(reward) or not -1.0 <= reward <= 1.0:
      return f"step() reward must be a finite float in [-1, 1], got {reward!r}"
    if not isinstance(term, bool) or not isinstance(trunc, bool) or not isinstance(info, dict):
      return "step() terminated/truncated must be bool and info a dict"
    return None
  if op == "call" and method in ("hint", "work"):
    return text(value, f"{method}()")
  if op == "call":
    if not isinstance(value, list):
      return "solution() must return list[str]"
    for a in value:
      problem = text(a, "solution() action")
      if problem:
        return problem
  return None


class EnvPool:
  """A pool of sandboxed worker processes hosting env programs.

  Use as a context manager; ``close()`` kills every process it ever started.
  """

  def __init__(self, config: SandboxConfig | None = None):
    self.config = config or SandboxConfig()
    cfg = self.config
    self.plan = isolation.plan_isolation(cfg)
    self._base = tempfile.mkdtemp(prefix="spade_sandbox_", dir=cfg.scratch_root)
    os.chmod(self._base, 0o711)
    # Worker scratch dirs only: under a private /tmp the fork server keeps this
    # dir visible, not the rest of the base dir (self-test files, logs).
    self._scratch_root = os.path.join(self._base, "scratch")
    os.mkdir(self._scratch_root, 0o711)
    os.chmod(self._scratch_root, 0o711)
    self._confine_code = isolation.write_confine_code(self._base)
    self._lock = threading.Lock()
    self._spares: collections.deque[WorkerProcess | ForkedWorker] = collections.deque()
    self._live: dict[int, WorkerProcess | ForkedWorker] = {}
    self._counter = 0
    self._spawner = concurrent.futures.ThreadPoolExecutor(
        1, thread_name_prefix="spade-sandbox-spawn")
    self._uid_cursor = random.SystemRandom().randrange(cfg.uid_count)
    self._closed = False
    self._python_hexversion = sys.hexversion if isolation.worker_python(cfg.python) \
        == isolation.worker_python() else None
    self._server: forkserver.ForkServer | None = None
    self._server_lock = threading.Lock()
    self._server_restarts = 0
    self.fork_server_note = ""
    self._adopt(self.plan)
    self.report: isolation.IsolationReport | None = None
    if self.plan.launcher == "none" and cfg.mode == "strict":
      self.close()
      raise RuntimeError(
          "SandboxConfig(mode='strict') needs a network namespace, but neither bubblewrap "
          f"nor unshare works on this host ({'; '.join(self.plan.notes)}). Install "
          "bubblewrap, run where user namespaces are allowed, or use mode='best_effort'.")
    if cfg.self_test:
      self.report = isolation.self_test(self, self._base)
      while not self.report.layers.get("probe_ran", True) and self.plan.launcher != "none":
        weaker = dataclasses.replace(cfg, use_bwrap=False, use_unshare=(
            self.plan.launcher == "bwrap" and cfg.use_unshare))
        _log.warning("Sandbox workers fail under %s (%s); falling back to a weaker launcher.",
                     self.plan.launcher, self.report.detail)
        self._adopt(isolation.plan_isolation(weaker))
        self.report = isolation.self_test(self, self._base)
      missing = [k for k, v in self.report.layers.items() if not v]
      _log.info("Sandbox isolation: %s; workers: %s", self.report.summary(),
                self.fork_server_note)
      if missing:
        _log.warning("SANDBOX IS WEAKER THAN DESIGNED: missing layers %s. %s", missing,
                     " ".join(self.plan.notes))
      if cfg.mode == "strict" and not self.report.network_isolated:
        detail = self.report.detail
        self.close()
        raise RuntimeError("SandboxConfig(mode='strict'): the isolation probe reached the "
                           f"network or did not run ({detail}). Use mode='best_effort' to "
                           "run anyway.")
    else:
      _log.info("Sandbox launcher: %s (self-test disabled); workers: %s", self.plan.launcher,
                self.fork_server_note)
    self._refill()

  def _adopt(self, plan: isolation.IsolationPlan) -> None:
    """Sets the launcher plan and what depends on it, and (re)starts the fork server."""
    self.plan = plan
    unshare_root = plan.launcher == "unshare" and os.geteuid() == 0
    self._mask = isolation.accelerator_nodes() if unshare_root else []
    self._tmpfs = isolation.world_writable_dirs() if unshare_root else []
    with self._server_lock:
      old, self._server = self._server, None
    if old is not None:
      old.close()
    self._server_restarts = 0
    # Pre-imports cost nothing per worker when the zygote holds them; a worker
    # started by itself under bubblewrap boots fastest importing lazily.
    preimport = self.config.preimport
    self.preimport = DEFAULT_PREIMPORT if preimport is None else tuple(preimport)
    server = self._start_server()
    with self._server_lock:
      self._server = server
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
    inside = isolation.inside_scratch(plan, self._base)
    rlimits = {"RLIMIT_AS": cfg.memory_mb << 20, "RLIMIT_FSIZE": cfg.file_size_mb << 20,
               "RLIMIT_NOFILE": max(cfg.max_open_files, 16), "RLIMIT_CORE": 0}
    zcfg = {"zygote": True, "rlimits": rlimits, "mask_paths": self._mask,
            "tmpfs_paths": self._tmpfs,
            "keep_paths": [self._scratch_root] + isolation.python_dirs(plan.python),
            "preimport": list(self.preimport), "pidns": plan.launcher != "none",
            "scratch_probe": isolation.BWRAP_SCRATCH if plan.launcher == "bwrap" else None,
            "confine": isolation.confine_spec(cfg, plan, inside, self._confine_code,
                                              self._python_hexversion)}
    argv = isolation.worker_command(plan, self._base, json.dumps(zcfg), cfg.scratch_mb << 20,
                                    (self._confine_code,), zygote=True)
    with self._lock:
      n = self._counter
      self._counter += 1
    args = (argv, isolation.worker_env(inside), self._base,
            os.path.join(self._base, f"zygote{n}.err"), cfg.load_timeout_s)
    try:
      # From the spawner thread, like every launcher process (see _spawn).
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
      if self._server is not server or self._closed:
        return
      self._server = None  # Meanwhile workers are started by themselves.
      restart = self._server_restarts < _MAX_SERVER_RESTARTS
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
      if self._server is None and not self._closed:
        self._server, new = new, None
    if new is not None:
      new.close()

  # ---- lifecycle -------------------------------------------------------------

  def __enter__(self) -> "EnvPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __deepcopy__(self, memo) -> "EnvPool":
    # A pool is a shared OS resource; copies (e.g. gymnasium.make deep-copying
    # its kwargs) refer to the same pool.
    return self

  def __copy__(self) -> "EnvPool":
    return self

  def __del__(self):
    try:
      self.close()
    except Exception:  # pylint: disable=broad-except
      pass

  def close(self) -> None:
    """Kills every worker this pool started and deletes all scratch dirs."""
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
      server, self._server = self._server, None
    if server is not None:
      server.close()
    shutil.rmtree(self._base, ignore_errors=True)

  @property
  def live_workers(self) -> int:
    return len(self._live)

  @property
  def worker_pids(self) -> list[int]:
    return [w.pid for w in self._live.values()]

  def _spawn(self, preimport: Sequence[str] | None = None, *,
             on_spawner: bool = False) -> WorkerProcess | None:
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
    err_path = os.path.join(self._base, f"w{n}.err")
    wcfg = {"scratch": inside, "chown_scratch": inside != scratch,
            "uid": uid, "gid": uid, "rlimits": rlimits,
            "preimport": list(self.preimport if preimport is None else preimport),
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
    wcfg.update(mask_paths=self._mask, tmpfs_paths=self._tmpfs)
    argv = isolation.worker_command(self.plan, scratch, json.dumps(wcfg), cfg.scratch_mb << 20,
                                    (self._confine_code,))
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
      server = self._server
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

  def _refill(self, on_spawner: bool = False) -> None:
    while not self._closed:
      with self._lock:
        if len(self._spares) >= self.config.num_workers \
            or len(self._live) >= self.config.max_live_workers:
          return
      worker = self._spawn(on_spawner=on_spawner)
      if worker is None:
        return
      with self._lock:
        if self._closed:
          self._live.pop(worker.pid, None)
          self._destroy([worker])
          return
        self._spares.append(worker)

  def _refill_async(self) -> None:
    """Tops up the warm spares from the spawner thread, without waiting."""
    if self.config.num_workers and not self._closed:
      try:
        self._spawner.submit(self._refill, True)
      except RuntimeError:  # Spawner already shut down by close().
        pass

  def _take(self) -> "WorkerProcess | ForkedWorker | None":
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
    return self._spawn()

  def _destroy(self, workers: Sequence[WorkerProcess]) -> None:
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
      self._refill()
    return not bad

  # ---- env API -----------------------------------------------------------------

  def start(self, sources: Sequence[str], max_turns: int = 25, *,
            class_names: Sequence[str | None] | None = None,
            kwargs: dict[str, Any] | None = None,
            action_mode: str = "auto", preimport: Sequence[str] | None = None
            ) -> list[EnvHandle]:
    """Loads each source into its own fresh worker, all concurrently.

    Args:
      sources: program texts (already extracted Python source).
      max_turns: passed to each program's ``__init__``.
      class_names: optional class to instantiate per source (default: the
        last class ending in ``Env`` with reset/step).
      kwargs: extra keyword arguments for ``__init__`` (dropped when the
        program does not accept them).
      action_mode: how ``step`` receives the agent's turn text: "auto" (the
        default, for games: raw for programs that parse ``\\boxed``
        themselves, else boxed extraction), "boxed" (content of the last
        ``\\boxed{...}``, or the stripped text), "raw" (unchanged), or
        "tool_call" (tool use: the stripped JSON text inside the last complete
        ``<tool_call>...</tool_call>`` outside ``<think>`` blocks, or the
        stripped text when there is none, so bare JSON solution actions replay
        as they are).
      preimport: modules for fresh workers to import before the uid drop
        (default: ``config.preimport``); forces fresh workers.

    Returns:
      One handle per source; a failed load gives ``alive == False`` with
      ``reason``/``detail`` set.
    """
    ACTION_MODES.check(action_mode)
    names = list(class_names) if class_names is not None else [None] * len(sources)
    handles, workers, reqs = [], [], []
    for i, src in enumerate(sources):
      w = self._take() if preimport is None else self._spawn(preimport)
      h = EnvHandle(self, w, i)
      handles.append(h)
      if w is None:
        h.reason, h.detail = "crash", (
            f"pool is at max_live_workers={self.config.max_live_workers} or closed; "
            "release handles before starting more")
        continue
      workers.append(w)
      reqs.append({"op": "load", "source": src, "class_name": names[i],
                   "max_turns": int(max_turns), "kwargs": kwargs or {},
                   "action_mode": action_mode})
    self._refill_async()
    outcomes = exchange(workers, reqs, self.config.load_timeout_s,
                        self.config.max_message_bytes)
    live = [h for h in handles if h._worker is not None]  # pylint: disable=protected-access
    for h, o in zip(live, outcomes):
      h.load_seconds = o.seconds
      h._worker.loaded = True  # pylint: disable=protected-access
      res = self._result(h, o, "load")
      if not res.ok:
        continue
      v = res.value
      if not isinstance(v, dict) or not isinstance(v.get("class_name"), str):
        h._fail("crash", "protocol violation: malformed load reply")
        continue
      h.class_name = v["class_name"]
      h.has_solution = bool(v.get("has_solution"))
      h.has_hint = bool(v.get("has_hint"))
      h.action_mode = v.get("action_mode", "boxed")
      h.layers = {str(k): str(s) for k, s in (v.get("layers") or {}).items()}
    return handles

  def reset_many(self, handles: Sequence[EnvHandle], seeds: Sequence[int | None] | None = None,
                 options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None
                 ) -> list[CallResult]:
    """Resets every handle concurrently; value = (obs, info)."""
    seeds = list(seeds) if seeds is not None else [None] * len(handles)
    if isinstance(options, dict) or options is None:
      options = [options] * len(handles)
    if len(seeds) != len(handles) or len(options) != len(handles):
      raise ValueError(f"reset_many got {len(handles)} handles, {len(seeds)} seeds and "
                       f"{len(options)} options; expected equal lengths.")
    reqs = [{"op": "reset", "seed": None if s is None else int(s), "options": o}
            for s, o in zip(seeds, options)]
    return self._run(handles, reqs, "reset")

  def step_many(self, handles: Sequence[EnvHandle], actions: Sequence[str]) -> list[CallResult]:
    """Steps every handle with the agent's raw turn text, concurrently.

    value = (obs, reward, terminated, truncated, info).
    """
    if len(actions) != len(handles):
      raise ValueError(f"step_many got {len(handles)} handles and {len(actions)} actions; "
                       "expected one action per handle.")
    reqs = [{"op": "step", "action": a if isinstance(a, str) else str(a)} for a in actions]
    return self._run(handles, reqs, "step")

  def call_many(self, handles: Sequence[EnvHandle], method: str) -> list[CallResult]:
    """Calls an optional program method on every handle.

    "hint" and "work" return a string, "solution" a list of action strings. "work" is a
    worked step for the current state (e.g. ``19 + 7 = 26``): the procedural families
    define it for scripted players; the run never calls it.
    """
    if method not in OPTIONAL_METHODS:
      return [CallResult(False, None, "contract",
                         f"method {method!r} is not callable; expected one of {OPTIONAL_METHODS}")
              for _ in handles]
    return self._run(handles, [{"op": "call", "method": method}] * len(handles), "call",
                     method=method)

  def release(self, handles: Sequence[EnvHandle]) -> None:
    """Kills the workers behind ``handles`` and deletes their scratch dirs."""
    workers = []
    with self._lock:
      for h in handles:
        w = h._worker  # pylint: disable=protected-access
        h._worker = None  # pylint: disable=protected-access
        if h.reason is None:
          h.reason, h.detail = "crash", "handle was released"
        if w is not None and self._live.pop(w.pid, None) is not None:
          workers.append(w)
    self._destroy(workers)

  # ---- internals -------------------------------------------------------------

  def _run(self, handles: Sequence[EnvHandle], reqs: list[dict[str, Any]], op: str,
           method: str | None = None) -> list[CallResult]:
    results: list[CallResult | None] = [None] * len(handles)
    idx, workers, sent = [], [], []
    for i, h in enumerate(handles):
      if h._pool is not self:  # pylint: disable=protected-access
        results[i] = CallResult(False, None, "contract", "handle belongs to another pool")
      elif not h.alive:
        results[i] = CallResult(False, None, h.reason or "crash", h.detail)
      else:
        idx.append(i)
        workers.append(h._worker)  # pylint: disable=protected-access
        sent.append(reqs[i])
    outcomes = exchange(workers, sent, self.config.call_timeout_s,
                        self.config.max_message_bytes)
    for i, o in zip(idx, outcomes):
      results[i] = self._result(handles[i], o, op, method)
    return results  # type: ignore[return-value]

  def _result(self, h: EnvHandle, o: Outcome, op: str, method: str | None = None) -> CallResult:
    if o.reply is None:
      h._fail(o.reason or "crash", o.detail)  # pylint: disable=protected-access
      return CallResult(False, None, h.reason, h.detail, o.seconds)
    r = o.reply
    if not r.get("ok"):
      reason = r.get("reason") if r.get("reason") in FAILURES else "crash"
      detail = str(r.get("detail", ""))[:4000]
      missing_optional = (op == "call" and reason == "contract"
                          and "defines no" in detail)
      if not missing_optional:
        h._fail(reason, detail)  # pylint: disable=protected-access
      return CallResult(False, None, reason, detail, o.seconds)
    value = r.get("value")
    if op != "load":
      problem = _check_value(op, value, self.config.max_observation_chars, method)
      if problem:
        reason = "output_too_large" if "cap is" in problem else "contract"
        h._fail(reason, problem)  # pylint: disable=protected-access
        return CallResult(False, None, reason, problem, o.seconds)
      if op == "step":
        value[1] = float(value[1])
      if op in ("reset", "step"):
        value = tuple(value)
    return CallResult(True, value, None, "", o.seconds)


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
