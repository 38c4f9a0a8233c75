#!/usr/bin/env bash
# buf over the contracts, offline.
#   proto/buf.sh lint             STANDARD lint rules
#   proto/buf.sh breaking [REF]   FILE-level compatibility against proto/ at REF (default: the
#                                 newest v* tag, else the previous commit)
# buf resolves imports only from its workspace or the Buf Schema Registry (unreachable here), so
# google/rpc/status.proto is copied from the installed googleapis-common-protos package into a
# throwaway workspace, and only our files are checked.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
common_protos="$(python -c 'import google.rpc, os; print(os.path.dirname(os.path.dirname(google.rpc.__path__[0])))')"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

workspace() {  # workspace DIR SOURCE_OF_SCORING_PROTOS
  mkdir -p "$1/vendor/google/rpc" "$1/proto"
  cp "$common_protos/google/rpc/status.proto" "$1/vendor/google/rpc/"
  cp -r "$2/scoring" "$1/proto/"
  printf 'version: v2\nmodules:\n  - path: proto\n    lint:\n      use: [STANDARD]\n    breaking:\n      use: [FILE]\n  - path: vendor\n' > "$1/buf.yaml"
}

case "${1:-lint}" in
  lint)
    workspace "$work/new" "$here"
    (cd "$work/new" && buf lint --path proto/scoring && buf build -o /dev/null)
    echo "buf lint: ok"
    ;;
  breaking)
    ref="${2:-$(git -C "$repo" describe --tags --abbrev=0 --match 'v*' 2>/dev/null || echo HEAD~1)}"
    if ! git -C "$repo" rev-parse --verify -q "$ref^{commit}" >/dev/null; then
      echo "buf breaking: no $ref to compare with (first version)"; exit 0
    fi
    mkdir -p "$work/old-src"
    if ! git -C "$repo" archive "$ref" proto/scoring | tar -x -C "$work/old-src" 2>/dev/null; then
      echo "buf breaking: $ref has no proto/scoring (first version)"; exit 0
    fi
    workspace "$work/new" "$here"
    workspace "$work/old" "$work/old-src/proto"
    (cd "$work/old" && buf build -o "$work/old.binpb")
    (cd "$work/new" && buf build -o "$work/new.binpb")
    buf breaking "$work/new.binpb" --against "$work/old.binpb"
    echo "buf breaking against $ref: ok"
    ;;
  *) echo "usage: $0 lint | breaking [REF]" >&2; exit 2 ;;
esac
