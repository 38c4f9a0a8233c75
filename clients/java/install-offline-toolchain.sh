#!/usr/bin/env bash
# Debian's offline Java gRPC toolchain (no Maven Central here): protoc, the grpc-java plugin and
# the jars as a Maven repository under /usr/share/maven-repo, and libprotobuf-dev for the
# well-known types protoc imports (google/protobuf/*.proto). Idempotent; needs root (apt-get).
set -euo pipefail
packages=(
  maven protobuf-compiler libprotobuf-dev protobuf-compiler-grpc-java-plugin
  libprotobuf-java libgrpc-java libnetty-java libguava-java libperfmark-java
  libgeronimo-annotation-1.3-spec-java libgoogle-gson-java libanimal-sniffer-java
  libsurefire-java
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "java toolchain ready: $(protoc --version), grpc-java plugin $(test -x /usr/bin/grpc_java_plugin && echo present)"
