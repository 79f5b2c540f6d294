#!/usr/bin/env bash
# The main job: a tiny self-play run on CPU by default. Extra arguments go to the trainer,
# e.g.  bash launch/run.sh --workdir=/tmp/w --config.iterations=5
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/launch/_venv.sh"
ensure_venv requirements.txt
cd "$root"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
exec .venv/bin/python -m launch.train --config=experiments/configs/tiny.py \
  --workdir=/tmp/spade_jax/tiny --verbosity=-1 "$@"
