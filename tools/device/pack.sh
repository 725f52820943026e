#!/usr/bin/env bash
# Packs the release test and example binaries for the GPU machine into .device/release/
# (git-ignored): stripped, xz-compressed, with stable names (deps/ops, examples/bench, ...).
# Build first: cargo build --release --all-features --examples --tests
# (and --benches for the kernel table, deps/kernels, packed where built).
# SKIP="memory loadtest parity" leaves those binaries out (a call carries at most 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.device/release
rm -rf .device && mkdir -p "$out/deps" "$out/examples"
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
# The checkout each binary was built from (its CARGO_MANIFEST_DIR, from cargo's .d file, less a
# member crate's folder): a clean-clone CI run with this target/ rebuilds binaries under its own
# path, and their fixture paths point there. unpack.sh links every root listed in .device/roots.
# An example's uplifted .d names no environment but lists its sources by absolute path.
roots() {
  { sed -n 's/^# env-dep:CARGO_MANIFEST_DIR=//p' "$1.d"
    head -n 1 "$1.d" | sed -nE 's#^[^:]*: (/[^ ]*)/examples/[^ /]*\.rs.*#\1#p'; } 2>/dev/null |
    sed -E 's#/nemotron-[a-z]+$##'
}
for t in ops it memory kernels; do
  skip "$t" && continue
  # The root crate's `it` (the loader has its own `it`): the one whose sources are tests/it/.
  f=$(ls -t target/release/deps/${t}-* 2>/dev/null | grep -v '\.d$' |
    while read -r c; do
      if [ "$t" != it ] || grep -q ' tests/it/main.rs' "$c.d" 2>/dev/null; then echo "$c"; fi
    done | head -n 1 || true)
  # The kernel table is a bench target (built with --benches): packed where built.
  if [ -z "$f" ] && [ "$t" = kernels ]; then continue; fi
  [ -n "$f" ] || { echo "no test binary for $t" >&2; exit 1; }
  strip -o "$out/deps/$t" "$f"
  roots "$f" >>.device/roots.all
done
for e in bench profile synth parity loadtest; do
  skip "$e" && continue
  strip -o "$out/examples/$e" "target/release/examples/$e"
  roots "target/release/examples/$e" >>.device/roots.all
done
sort -u .device/roots.all >.device/roots && rm .device/roots.all
echo "built under: $(tr '\n' ' ' <.device/roots)"
xz -T2 -6 "$out"/deps/* "$out"/examples/*
du -sh .device
# A call carries the tracked files and .device together, 64 MiB at most: past it the call is
# refused (or a helper carries a part and a binary goes missing), so say so here.
tracked=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
packed=$(du -sb .device | cut -f1)
if [ $((tracked + packed)) -gt 67108864 ]; then
  echo "warning: .device ($packed B) + tracked files ($tracked B) = $((tracked + packed)) B, over" \
    "the 64 MiB a call carries: pack fewer binaries (SKIP=\"memory loadtest\", or loadtest alone)" >&2
fi
