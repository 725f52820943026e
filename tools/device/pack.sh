#!/usr/bin/env bash
# Packs the release test and example binaries for the GPU machine into .device/release/
# (git-ignored): stripped, xz-compressed, with stable names (deps/ops, examples/bench, ...).
# Build first: cargo build --release --all-features --examples --tests
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.device/release
rm -rf .device && mkdir -p "$out/deps" "$out/examples"
for t in ops engine slots decode_graph device_parity consistency; do
  f=$(ls -t target/release/deps/${t}-* 2>/dev/null | grep -v '\.d$' | head -n 1)
  [ -n "$f" ] || { echo "no test binary for $t" >&2; exit 1; }
  strip -o "$out/deps/$t" "$f"
done
for e in bench synth parity loadtest; do
  strip -o "$out/examples/$e" "target/release/examples/$e"
done
xz -T2 -6 "$out"/deps/* "$out"/examples/*
du -sh .device
