#!/usr/bin/env bash
# On the GPU machine, in the repository root: unpacks .device/release/ and makes the build-time
# CARGO_MANIFEST_DIR (the checkout's path where the binaries were built) resolve here.
set -euo pipefail
# nullglob: a pack may hold no test binaries (a load call packs examples alone).
shopt -s nullglob
for f in .device/release/deps/*.xz .device/release/examples/*.xz; do xz -d -k -f "$f"; done
for f in .device/release/deps/* .device/release/examples/*; do chmod +x "$f"; done
# Every checkout the packed binaries were built from (pack.sh writes .device/roots).
for P in ${BUILD_ROOT:-/work/main} $(cat .device/roots 2>/dev/null); do
  [ "$(realpath -m "$P")" = "$PWD" ] || { mkdir -p "$(dirname "$P")" && ln -sfn "$PWD" "$P"; }
done
