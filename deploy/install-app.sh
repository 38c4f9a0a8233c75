#!/usr/bin/env bash
# Installs this project's three packages (client stubs generated from proto/, the vLLM plugin,
# the server) into an environment that already has vLLM.
#   deploy/install-app.sh PYTHON            resolve our dependencies from the index (GPU image)
#   deploy/install-app.sh PYTHON --locked   dependencies already installed from the lock (CPU)
#   add --editable for a development checkout (plugin and server edited in place)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="${1:?usage: install-app.sh PYTHON [--locked] [--editable]}"
shift
flags=()
editable=""
for arg in "$@"; do
  case "$arg" in
    --locked) flags+=(--no-deps --no-build-isolation) ;;
    --editable) editable="-e" ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
"$py" -m pip install --quiet "${flags[@]}" "$repo/clients/python"
"$py" -m pip install --quiet "${flags[@]}" $editable "$repo/plugin" $editable "$repo/server"
"$py" -c "import vllm, scoring.v1, scoring_client, scoring_plugin, scoring_server; print('scoring service installed on vllm', vllm.__version__)"
