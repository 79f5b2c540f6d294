"""EnvPool: env programs in sandboxed worker processes, driven in batches.

Each env instance lives in its own worker process (the package ``worker/`` is
what runs inside, ``isolation.py`` the OS layers around it). The workers come
from a :class:`~spade_jax.sandbox.supply.WorkerSupply`: forked by one
pre-imported zygote per pool (``forkserver.py``), so a fresh worker costs a
fork, not an interpreter start, or where the fork server cannot run each
started by itself (launcher + interpreter); it keeps ``num_workers`` warm idle
workers, so a fresh env usually costs one load message. A worker is never
reused for a second program.

Every call returns :class:`CallResult` objects. A crash, hang, limit breach,
bad return type, NaN reward or oversized observation is an outcome with a
reason from :data:`FAILURES`, never an exception. Any failed call ends the
instance (its worker is killed) except a call to a missing optional method
(``hint``/``solution``), which leaves the instance usable.

Thread safety: ``start``/``release``/``close`` may be called from several
threads; one handle must not be used by two threads at once.
"""

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

from spade_jax.registry import names
from spade_jax.sandbox import isolation
from spade_jax.sandbox.config import SandboxConfig
from spade_jax.sandbox.process import ForkedWorker, Outcome, WorkerProcess, exchange
from spade_jax.sandbox.supply import WorkerSupply

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

  Attributes:
    config: the SandboxConfig.
    supply: the worker processes behind the pool (:class:`WorkerSupply`).
    report: the isolation self-test's report (None with ``self_test=False``).
  """

  def __init__(self, config: SandboxConfig | None = None):
    self.config = cfg = config or SandboxConfig()
    self.report: isolation.IsolationReport | None = None
    self.supply = WorkerSupply(cfg, isolation.plan_isolation(cfg))
    if self.plan.launcher == "none" and cfg.mode == "strict":
      self.close()
      raise RuntimeError(
          "SandboxConfig(mode='strict') needs a network namespace, but neither bubblewrap "
          f"nor unshare works on this host ({'; '.join(self.plan.notes)}). Install "
          "bubblewrap, run where user namespaces are allowed, or use mode='best_effort'.")
    if cfg.self_test:
      self.report = isolation.self_test(self, self.supply.base)
      while not self.report.layers.get("probe_ran", True) and self.plan.launcher != "none":
        weaker = dataclasses.replace(cfg, use_bwrap=False, use_unshare=(
            self.plan.launcher == "bwrap" and cfg.use_unshare))
        _log.warning("Sandbox workers fail under %s (%s); falling back to a weaker launcher.",
                     self.plan.launcher, self.report.detail)
        self.supply.adopt(isolation.plan_isolation(weaker))
        self.report = isolation.self_test(self, self.supply.base)
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
    self.supply.refill()

  @property
  def plan(self) -> isolation.IsolationPlan:
    """The launcher plan in use."""
    return self.supply.plan

  @property
  def preimport(self) -> tuple[str, ...]:
    """Modules fresh workers import before the uid drop."""
    return self.supply.preimport

  @property
  def fork_server_note(self) -> str:
    """How workers are started (forked, or one by one and why)."""
    return self.supply.fork_server_note

  @property
  def live_workers(self) -> int:
    return self.supply.live_workers

  @property
  def worker_pids(self) -> list[int]:
    return self.supply.worker_pids

  def wait_ready(self, timeout_s: float = 10.0) -> bool:
    """Blocks until every warm spare answers a ping; True when all did."""
    return self.supply.wait_ready(timeout_s)

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
    supply = getattr(self, "supply", None)
    if supply is not None:
      supply.close()


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
      w = self.supply.take() if preimport is None else self.supply.spawn(preimport)
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
    self.supply.refill_async()
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
    for h in handles:
      w = h._worker  # pylint: disable=protected-access
      h._worker = None  # pylint: disable=protected-access
      if h.reason is None:
        h.reason, h.detail = "crash", "handle was released"
      if w is not None:
        workers.append(w)
    self.supply.release(workers)

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
