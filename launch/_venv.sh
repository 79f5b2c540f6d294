# Sourced by run.sh and test.sh: creates or refreshes .venv from a requirements file.
# Usage: ensure_venv REQUIREMENTS_FILE
ensure_venv() {
  local req="$1" root stamp want py
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  py="${PYTHON:-python3}"
  if [ ! -x "$root/.venv/bin/python" ]; then
    echo "[spade_jax] creating $root/.venv" >&2
    "$py" -m venv "$root/.venv"
  fi
  want="$(cat "$root/requirements.txt" "$root/$req" | sha256sum | cut -d' ' -f1)"
  stamp="$root/.venv/.installed-$(basename "$req")"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "[spade_jax] installing $req into .venv (first run takes a few minutes)" >&2
    "$root/.venv/bin/python" -m pip install --quiet --upgrade pip
    "$root/.venv/bin/python" -m pip install --quiet -r "$root/$req"
    echo "$want" > "$stamp"
  fi
}
