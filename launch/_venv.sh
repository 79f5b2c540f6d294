# Sourced by run.sh and test.sh: creates or refreshes .venv from a requirements file
# (plus requirements-nodeps.txt, installed without dependencies).
# Usage: ensure_venv REQUIREMENTS_FILE
ensure_venv() {
  local req="$1" root stamp want py
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  py="${PYTHON:-python3}"
  if [ ! -x "$root/.venv/bin/python" ]; then
    echo "[spade_jax] creating $root/.venv" >&2
    "$py" -m venv "$root/.venv"
  fi
  want="$(cat "$root/requirements.txt" "$root/$req" "$root/requirements-nodeps.txt" \
    | sha256sum | cut -d' ' -f1)"
  stamp="$root/.venv/.installed-$(basename "$req")"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "[spade_jax] installing $req into .venv (first run takes a few minutes)" >&2
    "$root/.venv/bin/python" -m pip install --quiet --upgrade pip
    "$root/.venv/bin/python" -m pip install --quiet -r "$root/$req"
    # Packages whose declared dependencies we must not take (see the file).
    "$root/.venv/bin/python" -m pip install --quiet --no-deps -r "$root/requirements-nodeps.txt"
    echo "$want" > "$stamp"
  fi
}
