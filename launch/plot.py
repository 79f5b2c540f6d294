r"""Plots a training workdir's metrics as PNGs.

  python -m launch.plot --workdir=/tmp/spade_jax/tiny [--out=DIR]

Writes into DIR (default <workdir>/plots): designer_valid.png (valid rate and rejections by
reason), regret.png, reward.png (hinted vs unhinted), reward_by_skill.png (designer reward
per skill, from designer_samples.jsonl), loss.png, kl.png and clip.png (clip fractions and
TIS weight).
"""

from absl import app
from absl import flags

from spade_jax import console

_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir (local or gs://).")
_OUT = flags.DEFINE_string("out", None, "Output directory (default: <workdir>/plots).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _WORKDIR.value:
    raise app.UsageError("Pass --workdir.")
  from spade_jax import plots  # pylint: disable=g-import-not-at-top
  for path in plots.plot_run(_WORKDIR.value, _OUT.value):
    print(path)


if __name__ == "__main__":
  console.run(main)
