#!/usr/bin/env bash
# Builds and tests the Java client offline, against Debian's jars, with the same pom users build
# from Maven Central: the `offline` profile and the Debian versions as property overrides.
#   clients/java/build-offline.sh PYTHON [MAVEN GOALS...]   (default goal: verify)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${1:?usage: build-offline.sh PYTHON [goals...]}"
shift
google_protos="$("$python" -c 'import google.rpc, os; print(os.path.dirname(os.path.dirname(google.rpc.__path__[0])))')"
cd "$here"
exec mvn -B -U -s offline-settings.xml -P 'offline,!central' \
  -Dgrpc.version=1.41.3 -Dprotobuf.version=3.21.12 -Dsurefire-plugin.version=2.22.3 \
  -Dgoogle.protos.dir="$google_protos" -Dscoring.python="$python" \
  "${@:-verify}"
