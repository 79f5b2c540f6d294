r"""Self-play training entry point.

  python -m launch.train --config=experiments/configs/tiny.py --workdir=/tmp/spade

Reruns with the same --workdir resume from its latest checkpoint.
"""

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/tiny.py", "Experiment config file.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/spade_jax/tiny",
                               "Run directory: checkpoints, metrics, memory.")
_MULTIHOST = flags.DEFINE_bool("multihost", False,
                               "Call jax.distributed.initialize() (multi-host pods).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_threefry_partitionable", True)
  from spade_jax import parallel, selfplay  # pylint: disable=g-import-not-at-top
  if _MULTIHOST.value:
    parallel.initialize_distributed()
  logging.info("Devices: %s", jax.devices())
  selfplay.train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
