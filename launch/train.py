r"""Self-play training entry point.

  python -m launch.train --config=experiments/configs/tiny.py --workdir=/tmp/spade
  python -m launch.train --config=experiments/configs/games.py:model=qwen3_4b_instruct_2507,mesh=v5p-64 \
      --workdir=gs://BUCKET/runs/games_4b [--multihost]
  python -m launch.train --config=experiments/configs/games.py:model=qwen3_30b_a3b_instruct_2507,mesh=v5p-64 \
      --dry_run [--plan_compile]

Reruns with the same --workdir resume from its latest checkpoint. --dry_run builds the
abstract train state on the config's mesh and prints its per-device memory plan without
allocating weights (on a CPU host it fakes the mesh's devices).
"""

import json
import math
import os

from absl import app
from absl import flags
from absl import logging

from spade_jax import console
from spade_jax import hostmem

_CONFIG = console.define_config_file(
    "config", "experiments/configs/tiny.py", "Experiment config file.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/spade_jax/tiny",
                               "Run directory (local or gs://): checkpoints, metrics, memory.")
_MULTIHOST = flags.DEFINE_bool("multihost", False,
                               "Call jax.distributed.initialize() (multi-host pods).")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None,
    "With --multihost off Cloud TPU: host:port of process 0 (TPU slices find it themselves).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "With --coordinator_address.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "With --coordinator_address.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False,
                             "Print the per-device memory plan and exit; no weights.")
_PLAN_COMPILE = flags.DEFINE_bool("plan_compile", False,
                                  "With --dry_run, also compile the train step for its peak.")
_JSON = flags.DEFINE_bool("json", False, "With --dry_run, print the plan as JSON.")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", "default",
    "JAX persistent compilation cache directory (local or gs://): a rerun or resume loads "
    "the step, sampler and scoring programs instead of compiling them again. 'default': "
    "$JAX_COMPILATION_CACHE_DIR if set, else $SPADE_JAX_CACHE/xla (~/.cache/spade_jax/xla); "
    "'' turns it off.")
_COMPILATION_CACHE_MIN_S = flags.DEFINE_float(
    "compilation_cache_min_s", None,
    "Only programs that took at least this many seconds to compile are written to the cache "
    "(default: $JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS if set, else 0.5).")

_KEEP_FREED_MEMORY = flags.DEFINE_bool(
    "keep_freed_memory", False,
    "Have glibc's allocator keep the memory it frees (spade_jax/hostmem.py): XLA:CPU's large "
    "per-step buffers then reuse mapped pages instead of being page-faulted every step; the "
    "process keeps its peak heap until it exits. Off by default: on 2 cores it removes the "
    "faults but not measurably the time (experiments/benchmarks/update_malloc.py).")


def _fake_cpu_devices(config) -> None:
  """On a CPU-only host, create as many virtual devices as the config's mesh names."""
  m = config.mesh
  sizes = [m.get(k, 1) for k in ("data", "fsdp", "tensor", "expert")]
  if any(s < 1 for s in sizes) or os.environ.get("JAX_PLATFORMS", "cpu") != "cpu":
    return
  flag = f"--xla_force_host_platform_device_count={math.prod(sizes)}"
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def _enable_compilation_cache(jax) -> str | None:
  """Points JAX's persistent compilation cache at --compilation_cache; returns the directory."""
  path = _COMPILATION_CACHE.value
  if path == "default":
    from experiments.configs import common  # pylint: disable=g-import-not-at-top
    path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(common.cache_dir(), "xla")
  if not path:
    return None
  min_s = _COMPILATION_CACHE_MIN_S.value
  if min_s is None:
    min_s = float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", 0.5))
  if min_s < 0:
    raise app.UsageError(f"--compilation_cache_min_s={min_s} must be >= 0 seconds.")
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", min_s)
  if "://" not in path:  # a local cache evicts least recently used entries past 4 GiB
    jax.config.update("jax_compilation_cache_max_size", 4 << 30)
  return path


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _DRY_RUN.value:
    _fake_cpu_devices(_CONFIG.value)
  kept = _KEEP_FREED_MEMORY.value and hostmem.keep_freed_memory()
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_threefry_partitionable", True)
  cache = _enable_compilation_cache(jax)
  from spade_jax import parallel, selfplay  # pylint: disable=g-import-not-at-top
  if _MULTIHOST.value:
    parallel.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value,
                                    _PROCESS_ID.value)
  logging.info("Devices: %s; compilation cache: %s; freed memory kept: %s", jax.devices(),
               cache or "off", kept)
  if _DRY_RUN.value:
    from spade_jax.selfplay import plan  # pylint: disable=g-import-not-at-top
    p = plan.plan(_CONFIG.value, compile_step=_PLAN_COMPILE.value)
    print(json.dumps(p, indent=1) if _JSON.value else plan.plan_line(p), flush=True)
    return
  selfplay.train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  console.run(main)
