#!/usr/bin/env bash
# The test suite (8 virtual CPU devices). Extra arguments go to pytest,
# e.g.  bash launch/test.sh -k sampler -x
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/launch/_venv.sh"
ensure_venv requirements-test.txt
cd "$root"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
# One pytest worker per core (at most 4; each holds its own 8 virtual devices and compiled
# programs): the suite waits mostly on single-threaded XLA compiles. Whole files go to one
# worker (--dist loadfile), so module fixtures are built once. SPADE_JAX_TEST_WORKERS=0 runs
# everything in this process; a later -n in the arguments wins.
workers="${SPADE_JAX_TEST_WORKERS:-$(.venv/bin/python -c 'import os
n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(min(n or 1, 4))')}"
parallel=()
if [ "$workers" -gt 1 ]; then parallel=(-n "$workers" --dist loadfile); fi
exec .venv/bin/python -m pytest -q ${parallel[@]+"${parallel[@]}"} "$@"
