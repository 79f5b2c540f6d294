#!/usr/bin/env bash
# Every accelerator measurement on one GPU, each step's output under $OUT. On an H200
# (2026-12-04) mfu took 64 s, decode 48 s (one kernel then; two now), rollout_tiny about
# 3 minutes and rollout_50m more than 5 (mostly XLA compiles of the overlapped schedule's
# shapes): all four do not fit one 10-minute command, so name the steps a call runs
# (default: all of them):
#   device.txt        the GPU, driver and JAX devices
#   mfu.log,          train-step MFU, bf16, random Qwen3-0.6B and 1.7B shapes
#   gpu_mfu.json      (gpu_mfu.py)
#   decode.log,       decode tokens/s and achieved memory bandwidth, 1.7B shape, decode
#                     attention "auto" (block walk) and "whole" (two dots a layer)
#   gpu_decode.json   (gpu_decode.py)
#   rollout_tiny.log  a play phase lock step vs overlapped, and design ahead, tiny model
#   rollout_50m.log   the same on the 50M model, 2 rounds (rollout.py --platform=: JAX's
#                     default platform)
# From the repository root, with a python that has jax, flax, optax, orbax and gymnasium
# (the H200 image lacks gymnasium: carry its wheel and farama-notifications'):
#   OUT=/tmp/out bash experiments/benchmarks/device_check.sh                 # on the GPU
#   OUT=/tmp/out bash experiments/benchmarks/device_check.sh rollout_50m     # one step
#   OUT=/tmp/out bash experiments/benchmarks/device_check.sh --smoke         # CPU, minutes
# PYTHON= picks the interpreter (default python3). Each step has its own time limit, so one
# slow step cannot eat the others' time; a step's exit status is printed after it.
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
PY="${PYTHON:-python3}"
smoke=0
[[ "${1:-}" == "--smoke" ]] && { smoke=1; shift; }
steps=("$@")
((${#steps[@]})) || steps=(mfu decode rollout_tiny rollout_50m)
for s in "${steps[@]}"; do
  case $s in mfu|decode|rollout_tiny|rollout_50m) ;;
    *) echo "unknown step '$s': name any of mfu decode rollout_tiny rollout_50m" >&2; exit 2;;
  esac
done
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step() {  # step NAME LIMIT_S COMMAND... (skipped unless NAME was asked for)
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  [[ " ${steps[*]} " == *" $name "* ]] || return 0
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
  step rollout_tiny 600 "$PY" -m experiments.benchmarks.rollout --models=tiny --episodes=4 \
    --slots=4 --turns=2 --repeats=1 --designs=2 --design_prompt=32 --design_tokens=32 \
    --nosplit
else
  step mfu 120 "$PY" experiments/benchmarks/gpu_mfu.py --out="$OUT"
  step decode 150 "$PY" -m experiments.benchmarks.gpu_decode --out="$OUT"
  step rollout_tiny 240 "$PY" -m experiments.benchmarks.rollout --platform= --models=tiny \
    --repeats=3
  step rollout_50m 540 "$PY" -m experiments.benchmarks.rollout --platform= --models=50m \
    --repeats=2 --nosplit
fi
