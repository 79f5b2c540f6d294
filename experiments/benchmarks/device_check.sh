#!/usr/bin/env bash
# Every accelerator measurement in one run on one GPU (about 9 minutes on an H200), each
# step's output under $OUT:
#   device.txt        the GPU, driver and JAX devices
#   mfu.log,          train-step MFU, bf16, random Qwen3-0.6B and 1.7B shapes
#   gpu_mfu.json      (gpu_mfu.py)
#   decode.log,       decode tokens/s and achieved memory bandwidth, 1.7B shape
#   gpu_decode.json   (gpu_decode.py)
#   rollout.log       a play phase lock step vs overlapped, and design ahead, tiny and 50M
#                     (rollout.py --platform=: JAX's default platform)
# From the repository root, with a python that has jax, flax, optax and orbax:
#   OUT=/tmp/out bash experiments/benchmarks/device_check.sh            # on the GPU
#   OUT=/tmp/out bash experiments/benchmarks/device_check.sh --smoke    # CPU, minutes
# PYTHON= picks the interpreter (default python3). Each step has its own time limit, so one
# slow step cannot eat the others' time; a step's exit status is printed after it.
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
PY="${PYTHON:-python3}"
smoke=0
[[ "${1:-}" == "--smoke" ]] && smoke=1
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "== $name (limit ${limit}s): $*"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "   exit $rc after $((SECONDS - t0)) s"
  grep -v -e '^W[0-9]' -e '^I[0-9]' "$OUT/$name.log" | tail -n 12
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  "$PY" -c "import jax; print(jax.__version__, jax.devices())" 2>&1; } >"$OUT/device.txt"
cat "$OUT/device.txt"

if ((smoke)); then
  step mfu 300 "$PY" experiments/benchmarks/gpu_mfu.py --smoke --out="$OUT"
  step decode 300 "$PY" -m experiments.benchmarks.gpu_decode --smoke --repeats=1 --out="$OUT"
  step rollout 600 "$PY" -m experiments.benchmarks.rollout --models=tiny --episodes=4 \
    --slots=4 --turns=2 --repeats=1 --designs=2 --design_prompt=32 --design_tokens=32 \
    --nosplit
else
  step mfu 180 "$PY" experiments/benchmarks/gpu_mfu.py --out="$OUT"
  step decode 120 "$PY" -m experiments.benchmarks.gpu_decode --out="$OUT"
  step rollout 240 "$PY" -m experiments.benchmarks.rollout --platform= --models=tiny,50m \
    --repeats=3
fi
