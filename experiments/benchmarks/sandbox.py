r"""Sandboxed env workers vs in-process ``exec`` of the same program.

  python -m experiments.benchmarks.sandbox [--starts=100] [--steps=500] \
      [--episodes=40] [--batch=8] [--work_ms=1.0]

Measures, for a 25-turn program doing about ``--work_ms`` of CPU work per
step: fresh-env start latency (warm spare available), step round-trip of a
no-work step, and episode throughput (fresh env, reset, 25 steps, release),
sequentially, with ``--batch`` episodes stepped together, and reusing one env
(reset per episode). Prints p50/p99 and
sandbox/in-process ratios, and the cold start (interpreter start included,
no warm spare) with the seccomp and landlock layers on and off.
"""

import statistics
import time

from absl import app, flags, logging

from spade_jax.sandbox import EnvPool, SandboxConfig

_STARTS = flags.DEFINE_integer("starts", 100, "Fresh-env starts to time.")
_STEPS = flags.DEFINE_integer("steps", 500, "Step round trips to time.")
_EPISODES = flags.DEFINE_integer("episodes", 40, "Episodes per throughput run.")
_BATCH = flags.DEFINE_integer("batch", 8, "Concurrent episodes in the batched run.")
_WORK_MS = flags.DEFINE_float("work_ms", 1.0, "CPU work per step, in milliseconds.")
_COLD = flags.DEFINE_integer("cold_starts", 20, "Cold starts (no warm spare) to time, per "
                             "setting of the seccomp/landlock layers.")
_TURNS = 25

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
  """Loop count of WorkEnv.step that takes about ``work_ms`` here."""
  env = _in_process(1000)
  env.reset(seed=0)
  t = time.perf_counter()
  for _ in range(50):
    env.step("")
  per_unit = (time.perf_counter() - t) / 50 / 1000
  return max(1, int(work_ms / 1000 / per_unit))


def _in_process(work: int):
  namespace: dict = {}
  exec(compile(PROGRAM, "<bench>", "exec"), namespace)  # pylint: disable=exec-used
  return namespace["WorkEnv"](max_turns=_TURNS, work=work)


def _pct(xs: list[float]) -> tuple[float, float]:
  xs = sorted(xs)
  return statistics.median(xs), xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]


def _fmt(name: str, sandbox: tuple[float, float], local: tuple[float, float]) -> str:
  return (f"{name:<22} sandbox p50={sandbox[0] * 1e3:8.3f} ms p99={sandbox[1] * 1e3:8.3f} ms | "
          f"in-process p50={local[0] * 1e3:8.3f} ms p99={local[1] * 1e3:8.3f} ms | "
          f"p50 ratio {sandbox[0] / max(local[0], 1e-9):8.1f}x")


def _cold_starts(n: int) -> dict[str, tuple[float, float]]:
  """p50/p99 of starting an env in a fresh worker, kernel layers on vs off."""
  settings = {"layers on": SandboxConfig(num_workers=0, self_test=False),
              "layers off": SandboxConfig(num_workers=0, self_test=False, seccomp=False,
                                          landlock=False)}
  pools = {k: EnvPool(c) for k, c in settings.items()}
  times: dict[str, list[float]] = {k: [] for k in settings}
  try:
    for _ in range(n):  # Interleaved, so load changes hit both settings alike.
      for name, pool in pools.items():
        t = time.perf_counter()
        h = pool.start([PROGRAM], max_turns=_TURNS, kwargs={"work": 0})
        times[name].append(time.perf_counter() - t)
        assert h[0].alive, h[0].detail
        pool.release(h)
  finally:
    for pool in pools.values():
      pool.close()
  return {k: _pct(v) for k, v in times.items()}


def run(starts: int, steps: int, episodes: int, batch: int, work_ms: float,
        cold_starts: int = 0) -> dict[str, float]:
  """Runs the comparison and prints it; returns the headline figures."""
  work = _calibrate(work_ms)
  cfg = SandboxConfig(num_workers=max(4, batch))
  with EnvPool(cfg) as pool:
    print(f"isolation: {pool.report.summary() if pool.report else pool.plan.launcher}")
    print(f"step work: {work} loop iterations ~ {work_ms} ms")

    # Fresh-env start with a warm spare ready (spares are topped up off the clock).
    sb, lp = [], []
    for _ in range(starts):
      pool.wait_ready()
      t = time.perf_counter()
      h = pool.start([PROGRAM], max_turns=_TURNS, kwargs={"work": 0})
      sb.append(time.perf_counter() - t)
      assert h[0].alive, h[0].detail
      pool.release(h)
      t = time.perf_counter()
      _in_process(0)
      lp.append(time.perf_counter() - t)
    start_sb, start_lp = _pct(sb), _pct(lp)

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
    step_sb, step_lp = _pct(sb), _pct(lp)

    # Episode throughput: fresh env, reset, 25 steps, release.
    def sandbox_episodes(n: int, width: int) -> float:
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
      return n / (time.perf_counter() - t)

    t = time.perf_counter()
    for i in range(episodes):
      e = _in_process(work)
      e.reset(seed=i)
      for _ in range(_TURNS):
        e.step("1")
    local_eps = episodes / (time.perf_counter() - t)
    seq_eps = sandbox_episodes(episodes, 1)
    batch_eps = sandbox_episodes(episodes, batch)

    # Same program, one env reset per episode (how N plays of one env can run).
    h = pool.start([PROGRAM], max_turns=_TURNS, kwargs={"work": work})
    t = time.perf_counter()
    for i in range(episodes):
      pool.reset_many(h, seeds=[i])
      for _ in range(_TURNS):
        assert pool.step_many(h, ["\\boxed{1}"])[0].ok
    reuse_eps = episodes / (time.perf_counter() - t)
    pool.release(h)

  cold = _cold_starts(cold_starts) if cold_starts else {}
  print(_fmt("fresh-env start", start_sb, start_lp))
  for name, (p50, p99) in cold.items():
    print(f"{'cold start ' + name:<22} sandbox p50={p50 * 1e3:8.3f} ms p99={p99 * 1e3:8.3f} ms")
  print(_fmt("step round trip", step_sb, step_lp))
  print(f"{'episodes/s (25 turns)':<22} in-process {local_eps:7.1f} | sandbox sequential "
        f"{seq_eps:7.1f} ({seq_eps / local_eps:5.1%}) | sandbox batch={batch} {batch_eps:7.1f} "
        f"({batch_eps / local_eps:5.1%}) | sandbox reused env {reuse_eps:7.1f} "
        f"({reuse_eps / local_eps:5.1%})")
  print(f"targets: start p50 <= 50 ms: {'OK' if start_sb[0] <= 0.05 else 'MISSED'}; "
        f"step p50 <= 1 ms: {'OK' if step_sb[0] <= 0.001 else 'MISSED'}; "
        f"sequential throughput >= 25% of in-process: "
        f"{'OK' if seq_eps >= 0.25 * local_eps else 'MISSED'}")
  return {"start_p50_s": start_sb[0], "start_p99_s": start_sb[1], "step_p50_s": step_sb[0],
          "step_p99_s": step_sb[1], "episodes_per_s_in_process": local_eps,
          "episodes_per_s_sequential": seq_eps, "episodes_per_s_batched": batch_eps,
          "episodes_per_s_reused_env": reuse_eps}


def main(argv: list[str]) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  run(_STARTS.value, _STEPS.value, _EPISODES.value, _BATCH.value, _WORK_MS.value, _COLD.value)


if __name__ == "__main__":
  app.run(main)
