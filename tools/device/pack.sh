#!/usr/bin/env bash
# Packs the release test and example binaries for the GPU machine into .device/release/
# (git-ignored): stripped, xz-compressed, with stable names (deps/ops, examples/bench, ...).
# Build first: cargo build --release --all-features --examples --tests
# SKIP="memory loadtest parity" leaves those binaries out (a call carries at most 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.device/release
rm -rf .device && mkdir -p "$out/deps" "$out/examples"
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
for t in ops it memory; do
  skip "$t" && continue
  f=$(ls -t target/release/deps/${t}-* 2>/dev/null | grep -v '\.d$' | head -n 1)
  [ -n "$f" ] || { echo "no test binary for $t" >&2; exit 1; }
  strip -o "$out/deps/$t" "$f"
done
for e in bench synth parity loadtest; do
  skip "$e" && continue
  strip -o "$out/examples/$e" "target/release/examples/$e"
done
xz -T2 -6 "$out"/deps/* "$out"/examples/*
du -sh .device
