#!/usr/bin/env bash
# The test suite (8 virtual CPU devices). Extra arguments go to pytest,
# e.g.  bash launch/test.sh -k sampler -x
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/launch/_venv.sh"
ensure_venv requirements-test.txt
cd "$root"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
exec .venv/bin/python -m pytest -q "$@"
