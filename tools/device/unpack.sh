#!/usr/bin/env bash
# On the GPU machine, in the repository root: unpacks .device/release/ and makes the build-time
# CARGO_MANIFEST_DIR (the checkout's path where the binaries were built) resolve here.
set -euo pipefail
for f in .device/release/deps/*.xz .device/release/examples/*.xz; do xz -d -k -f "$f"; done
chmod +x .device/release/deps/* .device/release/examples/*
# Every checkout the packed binaries were built from (pack.sh writes .device/roots).
for P in ${BUILD_ROOT:-/work/main} $(cat .device/roots 2>/dev/null); do
  [ "$(realpath -m "$P")" = "$PWD" ] || { mkdir -p "$(dirname "$P")" && ln -sfn "$PWD" "$P"; }
done
