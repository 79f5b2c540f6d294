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
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
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


def _fake_cpu_devices(config) -> None:
  """On a CPU-only host, create as many virtual devices as the config's mesh names."""
  m = config.mesh
  sizes = [m.get(k, 1) for k in ("data", "fsdp", "tensor", "expert")]
  if any(s < 1 for s in sizes) or os.environ.get("JAX_PLATFORMS", "cpu") != "cpu":
    return
  flag = f"--xla_force_host_platform_device_count={math.prod(sizes)}"
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _DRY_RUN.value:
    _fake_cpu_devices(_CONFIG.value)
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_threefry_partitionable", True)
  from spade_jax import parallel, selfplay  # pylint: disable=g-import-not-at-top
  if _MULTIHOST.value:
    parallel.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value,
                                    _PROCESS_ID.value)
  logging.info("Devices: %s", jax.devices())
  if _DRY_RUN.value:
    from spade_jax.selfplay import plan  # pylint: disable=g-import-not-at-top
    p = plan.plan(_CONFIG.value, compile_step=_PLAN_COMPILE.value)
    print(json.dumps(p, indent=1) if _JSON.value else plan.plan_line(p), flush=True)
    return
  selfplay.train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
