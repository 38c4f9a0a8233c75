#!/usr/bin/env bash
# Lints the contracts with buf (STANDARD). buf resolves imports only from its workspace or the
# Buf Schema Registry, which is unreachable offline, so google/rpc/status.proto is taken from the
# installed googleapis-common-protos package into a throwaway workspace, and only our files are
# linted.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
common_protos="$(python -c 'import google.rpc, os; print(os.path.dirname(os.path.dirname(google.rpc.__path__[0])))')"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/vendor/google/rpc"
cp "$common_protos/google/rpc/status.proto" "$work/vendor/google/rpc/"
cp -r "$here" "$work/proto"
cat > "$work/buf.yaml" <<YAML
version: v2
modules:
  - path: proto
    lint:
      use: [STANDARD]
  - path: vendor
YAML
cd "$work"
buf lint --path proto/scoring
buf build -o /dev/null
echo "buf lint: ok"
