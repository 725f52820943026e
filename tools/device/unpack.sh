#!/usr/bin/env bash
# On the GPU machine, in the repository root: unpacks .device/release/ and makes the build-time
# CARGO_MANIFEST_DIR (the checkout's path where the binaries were built) resolve here.
set -euo pipefail
# nullglob: a pack may hold no test binaries (a load call packs examples alone).
shopt -s nullglob
# .device is git-ignored: a call carries it only where `run`'s carry names it. Without it every
# later step would fail on a missing binary, each after its own setup: stop here instead.
if [ ! -d .device/release ]; then
  echo "unpack: no .device/release here: pass carry [\".device\"] (or the dev3 copy) to run" >&2
  exit 1
fi
for f in .device/release/deps/*.xz .device/release/examples/*.xz; do xz -d -k -f "$f"; done
for f in .device/release/deps/* .device/release/examples/*; do chmod +x "$f"; done
# Every checkout the packed binaries were built from (pack.sh writes .device/roots).
for P in ${BUILD_ROOT:-/work/main} $(cat .device/roots 2>/dev/null); do
  [ "$(realpath -m "$P")" = "$PWD" ] || { mkdir -p "$(dirname "$P")" && ln -sfn "$PWD" "$P"; }
done
