r"""The learning recipe's update with and without `hostmem.keep_freed_memory`.

  python -m experiments.benchmarks.update_malloc [--rounds=2] [--steps=8] [--width=512]

Each round runs two fresh processes one after the other (glibc's allocator is set once per
process, so the two settings cannot share one): the update of the learning recipe
(`experiments/configs/learn.py`: SmolLM2-135M's shape, random float32 weights, one CPU
device) on one packed row `--width` tokens wide (2 prompts of 37 tokens, each shared by 8
plays), one step to compile, then `--steps` timed steps. Each process reports its median
step time, the minor page faults per step and its peak resident memory; the script prints
them per round and the ratio kept / default of each round's medians (< 1: keeping freed
memory is faster). The order alternates between rounds so that drift hits both alike.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from absl import app
from absl import flags

_ROUNDS = flags.DEFINE_integer("rounds", 2, "Rounds (each: one process per setting).")
_STEPS = flags.DEFINE_integer("steps", 8, "Timed steps per process.")
_WIDTH = flags.DEFINE_integer("width", 512, "Tokens in the packed row.")
_CHILD = flags.DEFINE_enum("child", None, ["default", "kept"],
                           "Internal: run one process's measurement with that setting.")

PROMPT, PLAYS_PER_PROMPT, PROMPTS = 37, 8, 2


def _measure(kept: bool, steps: int, width: int) -> dict:
  """One process: the recipe's update on one packed row; times, faults, peak memory."""
  from spade_jax import hostmem  # pylint: disable=g-import-not-at-top
  taken = hostmem.keep_freed_memory() if kept else False
  import resource  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks import common  # pylint: disable=g-import-not-at-top
  from spade_jax import parallel, rl  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay.batch import Row, build_batches  # pylint: disable=g-import-not-at-top
  model, train, loss, opt, rules = common.recipe_sections()
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  trainer = rl.Trainer(model, train, loss, opt, mesh, parallel.RULE_SETS[rules])
  state = trainer.init_state(jax.random.key(0))
  rng = np.random.default_rng(0)
  # Completion tokens: each prompt's unit (its first PROMPT - 1 tokens once, then each
  # play from the prompt's last token on) fills at most 1 / PROMPTS of the row.
  n = (width // PROMPTS - (PROMPT - 1)) // PLAYS_PER_PROMPT - 1
  rows = []
  for _ in range(PROMPTS):
    prompt = rng.integers(3, model.vocab_size, PROMPT).tolist()
    for _ in range(PLAYS_PER_PROMPT):
      rows.append(Row(prompt + rng.integers(3, model.vocab_size, n).tolist(),
                      [False] * PROMPT + [True] * n, [0.0] * PROMPT + [-2.0] * n,
                      float(rng.normal()), "agent", temperature=0.7))
  batches, _ = build_batches(rows, 1, max(width, train.seq_len),
                             share_prefix=train.share_prefix, width_bucket=train.width_bucket,
                             widths=[width])
  if len(batches) != 1 or batches[0]["tokens"].shape[1] != width:
    raise app.UsageError(f"--width={width}: the plays do not fill one row of that width "
                         f"(got {len(batches)} x {batches[0]['tokens'].shape[1]}); use a "
                         "multiple of 64.")
  state, m = trainer.step(state, batches)
  jax.block_until_ready(m)
  times = []
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(steps):
    t0 = time.perf_counter()
    state, m = trainer.step(state, batches)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t0)
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
  return {"kept": kept, "taken": taken, "median_s": statistics.median(times),
          "times": times, "faults_per_step": faults / steps,
          "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
          "width": batches[0]["tokens"].shape[1]}


def _child(setting: str) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if "force_host_platform_device_count" not in f)
  proc = subprocess.run([sys.executable, "-m", "experiments.benchmarks.update_malloc",
                         f"--child={setting}", f"--steps={_STEPS.value}",
                         f"--width={_WIDTH.value}"],
                        capture_output=True, text=True, env=env, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    raise RuntimeError(f"the {setting} process failed:\n{proc.stderr[-3000:]}")
  return json.loads(lines[-1])


def main(argv):
  del argv
  least = PROMPTS * (PROMPT + PLAYS_PER_PROMPT * 2)
  if _STEPS.value < 1 or _WIDTH.value < least:
    raise app.UsageError(f"--steps={_STEPS.value} must be >= 1 and --width={_WIDTH.value} "
                         f">= {least}.")
  if _CHILD.value:
    print(json.dumps(_measure(_CHILD.value == "kept", _STEPS.value, _WIDTH.value)), flush=True)
    return
  print(f"update of the learning recipe, one {_WIDTH.value}-token row, {_STEPS.value} timed "
        "steps a process", flush=True)
  print("round  setting   median s  faults/step  peak GiB   steps (s)", flush=True)
  ratios = []
  for r in range(_ROUNDS.value):
    order = ("default", "kept") if r % 2 == 0 else ("kept", "default")
    got = {}
    for setting in order:
      got[setting] = res = _child(setting)
      if setting == "kept" and not res["taken"]:
        print("  (this C library is not glibc or refused a setting: nothing to compare)")
      print(f"{r + 1:5d}  {setting:8s}  {res['median_s']:8.2f}  {res['faults_per_step']:11.0f}"
            f"  {res['peak_rss_gib']:8.2f}   " + " ".join(f"{t:.2f}" for t in res["times"]),
            flush=True)
    ratios.append(got["kept"]["median_s"] / got["default"]["median_s"])
    print(f"       kept / default: {ratios[-1]:.3f}", flush=True)
  print("ratios kept / default by round: " + ", ".join(f"{x:.3f}" for x in ratios)
        + f"; worst {max(ratios):.3f}", flush=True)


if __name__ == "__main__":
  app.run(main)
