"""Validation of env programs before they are used for training (DESIGN 4.2).

Pipeline: extract -> static checks -> load in the sandbox -> API probe ->
determinism -> feasibility -> triviality. All dynamic stages run together in
one lockstep pass over several fresh instances of the program:

* ``a`` and ``b``: same seed, same actions (``solution()`` when present, else a
  fixed probe sequence); their transcripts must match (determinism), and ``a``
  must end with terminal reward 1.0 when a solution exists (feasibility).
* ``noop``: the empty action every turn; must not solve the env, and must end
  (terminated or truncated) within ``max_turns`` steps.
* ``random_*``: short random plays on other seeds; solving too often means the
  env is trivial.

Every rejection carries a reason from :data:`REASONS`.
"""

import concurrent.futures
import dataclasses
import random
import time
from collections.abc import Sequence
from typing import Any

from spade_jax.envs import contract
from spade_jax.envs import program as program_lib
from spade_jax.envs import tools as tools_lib
from spade_jax.envs.contract import REASONS, SETTINGS
from spade_jax.sandbox import CallResult, EnvHandle, EnvPool, SandboxConfig

_SOLVED = 1.0 - 1e-6
_RANDOM_WORDS = ("yes", "no", "up", "down", "left", "right", "north", "a", "b", "c", "A",
                 "B", "true", "false", "0", "1", "2", "hint", "solve", "help", "x", "?")


@dataclasses.dataclass(frozen=True)
class ValidationConfig:
  """Knobs of :func:`validate_program`.

  Attributes:
    max_turns: passed to the program's ``__init__``; the no-op episode must end
      within this many steps.
    seed: seed of the determinism/feasibility/no-op instances; random plays use
      ``seed + 1 + i``.
    probe_steps: actions replayed for determinism when there is no solution().
    random_episodes: number of random-play instances.
    random_steps: turns of each random play.
    max_random_solve_rate: trivial when a larger fraction of random plays solve.
    require_solution: reject programs without solution() as infeasible.
    check_termination: reject programs whose no-op episode never ends.
    behaviour_checks: run the determinism, feasibility, termination and triviality
      checks; False stops after the program loads and resets (closer to the reference,
      which checks no behaviour).
    setting: the programs' setting (`envs.SETTINGS`). Tool-use programs run under the
      tool-use harness and also pass the reset gate: for seeds 0-2, no criterion raises
      on the reset state; and they must not hold every criterion at reset, nor win by
      answering "done" at once (the no-op play).
    skip_static_checks: skip the AST quality filter (the sandbox still holds).
    extract: run :func:`extract_program` on the input text first.
    allowed_imports: import allow-list of the static checks.
    max_source_bytes: size cap of the program.
    time_budget_s: wall-clock budget of the dynamic stages.
    sandbox: config of the temporary pool used when no pool is passed.
  """

  max_turns: int = 25
  seed: int = 0
  probe_steps: int = 6
  random_episodes: int = 3
  random_steps: int = 6
  max_random_solve_rate: float = 0.5
  require_solution: bool = False
  check_termination: bool = True
  behaviour_checks: bool = True
  setting: str = "games"
  skip_static_checks: bool = False
  extract: bool = True
  allowed_imports: tuple[str, ...] = contract.ALLOWED_IMPORTS
  max_source_bytes: int = contract.MAX_SOURCE_BYTES
  time_budget_s: float = 60.0
  sandbox: SandboxConfig = dataclasses.field(default_factory=SandboxConfig)


@dataclasses.dataclass(frozen=True)
class Verdict:
  """Outcome of validating one program.

  Attributes:
    valid: whether the program may be used.
    reason: None when valid, else one of REASONS.
    detail: human-readable explanation.
    source: the extracted source (None when no code was found).
    class_name: the env class that was checked.
    has_solution: whether the program defines solution().
    has_hint: whether the program defines hint().
    timings: seconds per stage ("extract", "static", "load", "play", "total").
    transcript: the determinism/solution play of instance ``a``: tuples of
      (action, observation, reward, terminated, truncated); the first entry
      has action None and holds the reset observation.
    hint: the program's hint() for the validation seed, when defined.
  """

  valid: bool
  reason: str | None
  detail: str = ""
  source: str | None = None
  class_name: str | None = None
  has_solution: bool = False
  has_hint: bool = False
  timings: dict[str, float] = dataclasses.field(default_factory=dict)
  transcript: tuple[tuple[Any, ...], ...] = ()
  hint: str | None = None

  def __post_init__(self):
    if self.reason is not None and self.reason not in REASONS:
      raise ValueError(f"Verdict.reason={self.reason!r}; expected one of {REASONS}.")


def random_actions(rng: random.Random, n: int) -> list[str]:
  """A mixed bag of plausible and implausible actions."""
  out = []
  for _ in range(n):
    kind = rng.randrange(4)
    if kind == 0:
      out.append(str(rng.randint(-10, 100)))
    elif kind == 1:
      out.append(rng.choice(_RANDOM_WORDS))
    elif kind == 2:
      out.append(" ".join(str(rng.randint(0, 9)) for _ in range(rng.randint(2, 4))))
    else:
      out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 ,")
                         for _ in range(rng.randint(1, 12))))
  return out


def _as_turn(action: str, handle: EnvHandle, tools: bool = False) -> str:
  """Turns a program-level action into agent turn text for that program."""
  if not tools and handle.action_mode == "raw" and "\\boxed" not in action:
    return "\\boxed{" + action + "}"
  return action


class _Reject(Exception):

  def __init__(self, reason: str, detail: str):
    super().__init__(detail)
    self.reason, self.detail = reason, detail


def _need(res: CallResult, what: str) -> Any:
  if not res.ok:
    raise _Reject(res.reason or "crash", f"{what}: {res.detail}")
  return res.value


def validate_program(text: str, pool: EnvPool | None = None,
                     config: ValidationConfig | None = None) -> Verdict:
  """Validates one env program (model output or raw source); never raises.

  Args:
    text: model output holding a program (or the source itself).
    pool: sandbox pool to run it in; a temporary one is made when None.
    config: validation knobs.

  Returns:
    The :class:`Verdict`.
  """
  cfg = config or ValidationConfig()
  timings: dict[str, float] = {}
  t0 = time.perf_counter()
  source = program_lib.extract_program(text) if cfg.extract else text
  timings["extract"] = time.perf_counter() - t0
  if not source or not source.strip():
    timings["total"] = time.perf_counter() - t0
    return Verdict(False, "no_code", "no Python code block defining an ...Env class found",
                   None, timings=timings)
  t = time.perf_counter()
  if cfg.skip_static_checks:
    size = len(source.encode("utf-8", "surrogatepass"))
    reason, detail, class_name = None, "", None
    if size > cfg.max_source_bytes:
      reason, detail = "too_large", f"program is {size} bytes; the cap is {cfg.max_source_bytes}"
  else:
    reason, detail, class_name = program_lib.check_static(
        source, cfg.allowed_imports, cfg.max_source_bytes,
        tools=SETTINGS[cfg.setting].tool_harness)
  timings["static"] = time.perf_counter() - t
  if reason is not None:
    timings["total"] = time.perf_counter() - t0
    return Verdict(False, reason, detail, source, class_name, timings=timings)
  if pool is None:
    with EnvPool(dataclasses.replace(cfg.sandbox, num_workers=0, self_test=False)) as tmp:
      return _dynamic(source, class_name, tmp, cfg, timings, t0)
  return _dynamic(source, class_name, pool, cfg, timings, t0)


def _dynamic(source: str, class_name: str | None, pool: EnvPool, cfg: ValidationConfig,
             timings: dict[str, float], t0: float) -> Verdict:
  info: dict[str, Any] = {"class_name": class_name, "has_solution": False, "has_hint": False,
                          "transcript": (), "hint": None}
  n = 3 + cfg.random_episodes + (2 if SETTINGS[cfg.setting].tool_harness else 0)
  t = time.perf_counter()
  handles = tools_lib.start(pool, [source] * n, cfg.setting, cfg.max_turns,
                            class_names=[class_name] * n)
  timings["load"] = time.perf_counter() - t
  t = time.perf_counter()
  try:
    _play(pool, handles, cfg, info, t0)
    reason, detail = None, ""
  except _Reject as e:
    reason, detail = e.reason, e.detail
  finally:
    pool.release(handles)
  timings["play"] = time.perf_counter() - t
  timings["total"] = time.perf_counter() - t0
  return Verdict(reason is None, reason, detail, source, info["class_name"],
                 info["has_solution"], info["has_hint"], timings,
                 tuple(info["transcript"]), info["hint"])


def _play(pool: EnvPool, handles: list[EnvHandle], cfg: ValidationConfig,
          info: dict[str, Any], t0: float) -> None:
  for h in handles:
    if not h.alive:
      raise _Reject(h.reason or "crash", f"loading the program: {h.detail}")
  tools = SETTINGS[cfg.setting].tool_harness
  gate = handles[3 + cfg.random_episodes:] if tools else []
  a, b, noop = handles[0], handles[1], handles[2]
  rnd = handles[3:3 + cfg.random_episodes]
  info.update(class_name=info["class_name"] if tools else a.class_name,
              has_solution=a.has_solution, has_hint=a.has_hint)
  seeds = ([cfg.seed] * 3 + [cfg.seed + 1 + i for i in range(len(rnd))]
           + [cfg.seed + 1 + i for i in range(len(gate))])
  resets = pool.reset_many(handles, seeds=seeds)
  obs = [_need(r, "reset()")[0] for r in resets]
  if tools:
    _reset_gate([(seeds[0], resets[0])] + [(seeds[3 + len(rnd) + i], r) for i, r in
                                          enumerate(resets[3 + len(rnd):])])
  if not cfg.behaviour_checks:
    return
  if obs[0] != obs[1]:
    raise _Reject("nondeterministic", "two fresh instances reset with the same seed gave "
                  f"different observations: {obs[0][:200]!r} vs {obs[1][:200]!r}")
  transcript: list[tuple[Any, ...]] = [(None, obs[0], 0.0, False, False)]
  info["transcript"] = transcript
  if a.has_hint:
    info["hint"] = _need(pool.call_many([a], "hint")[0], "hint()")
  if cfg.require_solution and not a.has_solution:
    raise _Reject("infeasible", "the program defines no solution(), which is required")
  rng = random.Random(cfg.seed)
  if a.has_solution:
    sa, sb = (_need(r, "solution()") for r in pool.call_many([a, b], "solution"))
    if sa != sb:
      raise _Reject("nondeterministic", "solution() differs between two instances reset with "
                    "the same seed")
    if not sa:
      raise _Reject("infeasible", "solution() returned no actions")
    if len(sa) > cfg.max_turns:
      raise _Reject("infeasible", f"solution() needs {len(sa)} actions but max_turns is "
                    f"{cfg.max_turns}")
    script = [_as_turn(x, a, tools) for x in sa]
  else:
    script = [_as_turn(x, a, tools) for x in random_actions(rng, cfg.probe_steps)]
  rnd_scripts = [[_as_turn(x, h, tools) for x in random_actions(rng, cfg.random_steps)]
                 for h in rnd]
  # The no-op play: the empty turn; for tool use, answering "done" at once.
  noop_turn, noop_what = (("<answer>done</answer>", 'answering "done" at once') if tools
                          else ("", "playing the no-op action"))
  trans_b: list[tuple[Any, ...]] = [(None, obs[1], 0.0, False, False)]
  done = {id(h): False for h in handles}
  rnd_solved = 0
  for turn in range(cfg.max_turns + 1):
    if time.perf_counter() - t0 > cfg.time_budget_s:
      raise _Reject("timeout", f"validation exceeded its {cfg.time_budget_s:g}s budget")
    batch: list[tuple[EnvHandle, str, str]] = []
    what = "replaying " + ("solution()" if a.has_solution else "probe actions")
    for h in (a, b):
      if not done[id(h)] and turn < len(script):
        batch.append((h, script[turn], what))
    if not done[id(noop)]:
      batch.append((noop, noop_turn, noop_what))
    for h, s in zip(rnd, rnd_scripts):
      if not done[id(h)] and turn < len(s):
        batch.append((h, s[turn], "playing random actions"))
    if not batch:
      break
    results = pool.step_many([x[0] for x in batch], [x[1] for x in batch])
    for (h, action, what), res in zip(batch, results):
      o, reward, term, trunc, _ = _need(res, f"step() while {what} (turn {turn + 1})")
      solved = reward >= _SOLVED
      if h is a:
        transcript.append((action, o, reward, term, trunc))
      elif h is b:
        trans_b.append((action, o, reward, term, trunc))
      elif h is noop and solved:
        raise _Reject("trivial", f"{noop_what} ({noop_turn!r}) solved the env at turn "
                      f"{turn + 1}")
      elif solved:
        rnd_solved += 1
      if term or trunc or (solved and h not in (a, b)):
        done[id(h)] = True
  for i, (x, y) in enumerate(zip(transcript, trans_b)):
    if x != y:
      raise _Reject("nondeterministic", f"same seed and actions diverged at step {i}: "
                    f"{x[1][:160]!r} (reward {x[2]}) vs {y[1][:160]!r} (reward {y[2]})")
  if a.has_solution:
    last = transcript[-1]
    if not (last[3] and last[2] >= _SOLVED):
      raise _Reject("infeasible", f"replaying solution() ({len(script)} actions) ended with "
                    f"reward {last[2]}, terminated={last[3]}; expected terminal reward 1.0")
  if cfg.check_termination and not done[id(noop)]:
    raise _Reject("contract", f"the episode did not end within max_turns={cfg.max_turns} "
                  "steps of the no-op action; set truncated=True when turns run out")
  if rnd and rnd_solved / len(rnd) > cfg.max_random_solve_rate:
    raise _Reject("trivial", f"{rnd_solved} of {len(rnd)} random plays solved the env")


def _reset_gate(resets) -> None:
  """docs/METHOD.md §5's reset gate for tool-use programs (criteria on the reset state)."""
  for seed, res in resets:
    info = res.value[1]
    if info.get("gate_errors"):
      raise _Reject("reset_gate", f"seed {seed}: {info['gate_errors'][0]} on the reset "
                    "state; criteria must be evaluable from the start")
  first = resets[0][1].value[1].get("satisfied_at_reset") or []
  if first and all(first):
    raise _Reject("trivial", "every request's criterion already holds on the reset state")


def validate_many(texts: Sequence[str], pool: EnvPool, config: ValidationConfig | None = None,
                  max_parallel: int = 4) -> list[Verdict]:
  """Validates several programs concurrently in one pool."""
  with concurrent.futures.ThreadPoolExecutor(max(1, max_parallel)) as ex:
    return list(ex.map(lambda t: validate_program(t, pool, config), texts))
