#!/usr/bin/env bash
# Creates .venv-peers with the benchmark peers (Tunix, PyTorch transformers) plus this
# project's own requirements, so one benchmark process can run ours and the peers.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
req="$root/experiments/benchmarks/requirements-peers.txt"
if [ ! -x "$root/.venv-peers/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$root/.venv-peers"
fi
want="$(cat "$req" | sha256sum | cut -d' ' -f1)"
stamp="$root/.venv-peers/.installed"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$root/.venv-peers/bin/python" -m pip install --quiet --upgrade pip
  "$root/.venv-peers/bin/python" -m pip install --quiet -r "$req"
  echo "$want" > "$stamp"
fi
echo "$root/.venv-peers/bin/python"
