#!/usr/bin/env python3
"""Where one prefill pass goes, from `call.sh pncu` / `pncu16` / `pncu64` CSV (ncu,
`gpu__time_duration.sum`, every kernel of a `bench` run without --engine), or from `call.sh
pncup B` (`examples/profile --prefill`: the CSV holds one prefill pass and nothing else; give
`--skip 0`).

    python3 tools/ncu_passes.py ncu_prefill64.csv[.xz] [--top N] [--launches NAME GRID]

A pass is found by its scan launches (`scan_rows` or `ssd_chunk`, one per Mamba layer, `--mamba-layers`, 23 on Lightning),
extended back and forward to the `argmax_rows` launches around it. The process's first
`--skip` kernels (2: a fill and the 44 M-element copy of the load, in every such run so far) fall
before the first pass and are left out. Per kernel name and grid:
total ms in the pass, launches, mean, min and max µs. `--launches NAME GRID` prints the pass's
launches of that kernel in order (where one name and grid serve two linears, e.g. the routed
and the shared expert's `down` at 64 × 128, they alternate).
"""
import argparse
import collections
import csv
import lzma


def rows(path):
    opener = lzma.open if path.endswith(".xz") else open
    out = []
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith('"') and "gpu__time_duration" in line:
                r = next(csv.reader([line]))
                out.append((r[4], r[8], float(r[14].replace(",", ""))))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--mamba-layers", type=int, default=23)
    ap.add_argument("--launches", nargs=2, metavar=("NAME", "GRID"))
    ap.add_argument("--skip", type=int, default=2)
    a = ap.parse_args()
    ks = rows(a.csv)
    # A Mamba layer's scan: the register scan's rows kernel, or the tensor-core (SSD) chunk
    # kernel (bf16 prompts of 1,024 tokens and more, by default).
    scans = [i for i, k in enumerate(ks) if k[0].startswith(("scan_rows", "ssd_chunk"))]
    if len(scans) < a.mamba_layers:
        raise SystemExit(f"{len(scans)} scan launches: fewer than one pass of {a.mamba_layers}")
    first, last = scans[0], scans[a.mamba_layers - 1]
    while first > a.skip and not ks[first - 1][0].startswith("argmax"):
        first -= 1
    while last < len(ks) and not ks[last][0].startswith("argmax"):
        last += 1
    seg = ks[first:last + 1]
    print(f"pass: kernels {first}..{last}, {len(seg)} launches, {sum(k[2] for k in seg) / 1e6:.2f} ms")
    agg = collections.OrderedDict()
    for name, grid, ns in seg:
        agg.setdefault((name[:40], grid), []).append(ns)
    for (name, grid), v in sorted(agg.items(), key=lambda kv: -sum(kv[1]))[: a.top]:
        print(f"  {sum(v) / 1e6:8.3f} ms {len(v):4d}x  mean {sum(v) / len(v) / 1e3:8.1f}  "
              f"min {min(v) / 1e3:8.1f}  max {max(v) / 1e3:8.1f} us  {name:40s} {grid}")
    if a.launches:
        name, grid = a.launches
        v = [ns for n, g, ns in seg if n.startswith(name) and g == grid]
        print(f"{name} {grid}: " + " ".join(f"{ns / 1e3:.0f}" for ns in v) + " us")


if __name__ == "__main__":
    main()
