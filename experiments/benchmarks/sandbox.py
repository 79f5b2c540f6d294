r"""Sandboxed env workers vs in-process ``exec`` of the same program.

  python -m experiments.benchmarks.sandbox [--starts=100] [--cold_starts=40] \
      [--steps=500] [--episodes=20] [--rounds=3] [--batch=8] [--work_ms=1.0]

Every figure is taken with every isolation layer this host offers (the
start-up line lists them) and workers forked by the pool's fork server, the
default. For a 25-turn program doing about ``--work_ms`` of CPU work per step
it measures:

* cold start: ``start`` of one env with no warm spare (fork, isolation, load),
  p50/p99; for comparison, interleaved with it, the same with the landlock and
  seccomp layers off, and with workers started one by one (interpreter start,
  ``SandboxConfig(fork_server=False)``);
* fresh-env start with a warm spare ready;
* step round trip of a no-work step;
* episode throughput (fresh env, reset, 25 steps, release): sequentially with
  warm spares (the default pool), sequentially with none (every episode a cold
  start), ``--batch`` episodes stepped together, and one env reset per
  episode. The in-process baseline runs interleaved with them, ``--rounds``
  times, so load changes on a shared machine hit both alike.
"""

import statistics
import time

from absl import app, flags, logging

from spade_jax.sandbox import EnvPool, SandboxConfig

_STARTS = flags.DEFINE_integer("starts", 100, "Fresh-env starts (warm spare) to time.")
_COLD = flags.DEFINE_integer("cold_starts", 40, "Cold starts (no warm spare) to time, per "
                             "setting.")
_STEPS = flags.DEFINE_integer("steps", 500, "Step round trips to time.")
_EPISODES = flags.DEFINE_integer("episodes", 20, "Episodes per throughput run and round.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Interleaved rounds of the throughput runs.")
_BATCH = flags.DEFINE_integer("batch", 8, "Concurrent episodes in the batched run.")
_WORK_MS = flags.DEFINE_float("work_ms", 1.0, "CPU work per step, in milliseconds.")
_TURNS = 25
_TARGET_COLD_P50_S = 0.010
_TARGET_SEQUENTIAL = 0.60

PROGRAM = '''
import random


class WorkEnv:

  def __init__(self, max_turns=25, work=1000, **kwargs):
    self.max_turns = max_turns
    self.work = work

  def reset(self, seed=None, options=None):
    self.rng = random.Random(seed)
    self.turn = 0
    return "go", {}

  def step(self, action):
    self.turn += 1
    acc = 0
    for i in range(self.work):
      acc += i * i % 7
    done = self.turn >= self.max_turns
    return "turn %d %d" % (self.turn, acc), 0.0, False, done, {}
'''


def _calibrate(work_ms: float) -> int:
  """Loop count of WorkEnv.step that takes about ``work_ms`` here.

  The fastest of several timings: a moment of load on a shared machine would
  otherwise shrink the work and inflate every overhead ratio.
  """
  env = _in_process(1000)
  env.reset(seed=0)
  per_unit = float("inf")
  for _ in range(10):
    t = time.perf_counter()
    for _ in range(20):
      env.step("")
    per_unit = min(per_unit, (time.perf_counter() - t) / 20 / 1000)
  return max(1, int(work_ms / 1000 / per_unit))


def _in_process(work: int):
  namespace: dict = {}
  exec(compile(PROGRAM, "<bench>", "exec"), namespace)  # pylint: disable=exec-used
  return namespace["WorkEnv"](max_turns=_TURNS, work=work)


def _pct(xs: list[float]) -> tuple[float, float]:
  xs = sorted(xs)
  return statistics.median(xs), xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]


def _ms(name: str, p: tuple[float, float], extra: str = "") -> str:
  return f"{name:<34} p50={p[0] * 1e3:8.3f} ms p99={p[1] * 1e3:8.3f} ms{extra}"


def _cold_starts(n: int) -> dict[str, tuple[float, float]]:
  """p50/p99 of starting an env with no warm spare, per setting, interleaved."""
  settings = {
      "cold start": SandboxConfig(num_workers=0, self_test=False),
      "cold start, landlock+seccomp off": SandboxConfig(num_workers=0, self_test=False,
                                                        seccomp=False, landlock=False),
      "cold start, no fork server": SandboxConfig(num_workers=0, self_test=False,
                                                  fork_server=False),
  }
  pools = {k: EnvPool(c) for k, c in settings.items()}
  times: dict[str, list[float]] = {k: [] for k in settings}
  try:
    for i in range(n):
      for name, pool in pools.items():
        if name.endswith("no fork server") and i >= max(5, n // 4):
          continue  # ~80 ms each: a few suffice.
        t = time.perf_counter()
        h = pool.start([PROGRAM], max_turns=_TURNS, kwargs={"work": 0})
        times[name].append(time.perf_counter() - t)
        assert h[0].alive, h[0].detail
        pool.release(h)
  finally:
    for pool in pools.values():
      pool.close()
  return {k: _pct(v) for k, v in times.items()}


def _episodes(pool: EnvPool, n: int, width: int, work: int) -> float:
  """Seconds for ``n`` fresh-env episodes, ``width`` stepped together."""
  pool.wait_ready()
  t = time.perf_counter()
  done = 0
  while done < n:
    k = min(width, n - done)
    hs = pool.start([PROGRAM] * k, max_turns=_TURNS, kwargs={"work": work})
    pool.reset_many(hs, seeds=list(range(k)))
    for _ in range(_TURNS):
      res = pool.step_many(hs, ["\\boxed{1}"] * k)
      assert all(r.ok for r in res), res
    pool.release(hs)
    done += k
  return time.perf_counter() - t


def run(starts: int, steps: int, episodes: int, batch: int, work_ms: float,
        cold_starts: int = 40, rounds: int = 3) -> dict[str, float]:
  """Runs the comparison and prints it; returns the headline figures."""
  work = _calibrate(work_ms)
  cold = _cold_starts(cold_starts) if cold_starts else {}
  with EnvPool(SandboxConfig(num_workers=max(4, batch))) as pool, \
      EnvPool(SandboxConfig(num_workers=0, self_test=False)) as bare:
    print(f"isolation: {pool.report.summary() if pool.report else pool.plan.launcher}")
    print(f"workers: {pool.fork_server_note}")
    print(f"step work: {work} loop iterations ~ {work_ms} ms")

    # Fresh-env start with a warm spare ready (spares are topped up off the clock).
    warm, local = [], []
    for _ in range(starts):
      pool.wait_ready()
      t = time.perf_counter()
      h = pool.start([PROGRAM], max_turns=_TURNS, kwargs={"work": 0})
      warm.append(time.perf_counter() - t)
      assert h[0].alive, h[0].detail
      pool.release(h)
      t = time.perf_counter()
      _in_process(0)
      local.append(time.perf_counter() - t)

    # Step round trip of a no-work step.
    h = pool.start([PROGRAM], max_turns=10**9, kwargs={"work": 0})
    pool.reset_many(h, seeds=[0])
    env = _in_process(0)
    env.max_turns = 10**9
    env.reset(seed=0)
    sb, lp = [], []
    for _ in range(steps):
      t = time.perf_counter()
      r = pool.step_many(h, ["\\boxed{1}"])[0]
      sb.append(time.perf_counter() - t)
      assert r.ok, r
      t = time.perf_counter()
      env.step("1")
      lp.append(time.perf_counter() - t)
    pool.release(h)

    # Episode throughput, interleaved rounds.
    secs = {"in-process": 0.0, "sequential, warm spares": 0.0,
            "sequential, no spare": 0.0, f"batch={batch}": 0.0, "reused env": 0.0}
    for _ in range(rounds):
      t = time.perf_counter()
      for i in range(episodes):
        e = _in_process(work)
        e.reset(seed=i)
        for _ in range(_TURNS):
          e.step("1")
      secs["in-process"] += time.perf_counter() - t
      secs["sequential, warm spares"] += _episodes(pool, episodes, 1, work)
      secs["sequential, no spare"] += _episodes(bare, episodes, 1, work)
      secs[f"batch={batch}"] += _episodes(pool, episodes, batch, work)
      h = pool.start([PROGRAM], max_turns=_TURNS, kwargs={"work": work})
      t = time.perf_counter()
      for i in range(episodes):
        pool.reset_many(h, seeds=[i])
        for _ in range(_TURNS):
          assert pool.step_many(h, ["\\boxed{1}"])[0].ok
      secs["reused env"] += time.perf_counter() - t
      pool.release(h)
  eps = {k: rounds * episodes / v for k, v in secs.items()}

  for name, p in cold.items():
    print(_ms(name, p))
  warm_p, local_p = _pct(warm), _pct(local)
  print(_ms("fresh-env start, warm spare", warm_p,
            f" | in-process exec p50={local_p[0] * 1e3:.3f} ms"))
  step_p = _pct(sb)
  print(_ms("step round trip", step_p, f" | in-process p50={_pct(lp)[0] * 1e3:.4f} ms"))
  base = eps["in-process"]
  print("episodes/s (25 turns): " + " | ".join(
      f"{k} {v:.1f}" + ("" if k == "in-process" else f" ({v / base:.1%})")
      for k, v in eps.items()))
  seq = eps["sequential, warm spares"]
  cold_p50 = cold["cold start"][0] if cold else float("nan")
  print(f"targets: cold start p50 <= {_TARGET_COLD_P50_S * 1e3:g} ms: "
        f"{'OK' if cold_p50 <= _TARGET_COLD_P50_S else 'MISSED'}; sequential fresh-env "
        f"throughput >= {_TARGET_SEQUENTIAL:.0%} of in-process: "
        f"{'OK' if seq >= _TARGET_SEQUENTIAL * base else 'MISSED'}")
  out = {"cold_start_p50_s": cold_p50, "warm_start_p50_s": warm_p[0],
         "warm_start_p99_s": warm_p[1], "step_p50_s": step_p[0], "step_p99_s": step_p[1]}
  for k, (p50, p99) in cold.items():
    key = k.replace(", ", "_").replace(" ", "_").replace("+", "_")
    out[f"{key}_p50_s"], out[f"{key}_p99_s"] = p50, p99
  out.update({f"episodes_per_s[{k}]": v for k, v in eps.items()})
  return out


def main(argv: list[str]) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  run(_STARTS.value, _STEPS.value, _EPISODES.value, _BATCH.value, _WORK_MS.value, _COLD.value,
      _ROUNDS.value)


if __name__ == "__main__":
  app.run(main)
