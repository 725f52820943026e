#!/usr/bin/env python3
"""Per-token kernel table from Nsight Compute: kernel name x launches x device time.

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
        target/release/examples/profile --model DIR [--engine --batch B] > step.csv
    python3 tools/kernel_table.py step.csv[.xz] [--top 40] [--range A:B]

`examples/profile` runs one decode step between cuProfilerStart/cuProfilerStop, so
ncu times exactly that step's kernels, one at a time, on the device (ncu serializes kernels: the
sum is device time without launch gaps). Names are grouped with their template/generic suffixes
stripped down to the kernel function's name.
"""
import argparse, collections, csv, io, lzma, re, sys

UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
         "second": 1e6, "s": 1e6}


def short(name):
    # CubeCL kernels: "<fn>_<hash>" or templated C++ names; keep the function name.
    n = name.split("(")[0].split("<")[0].strip()
    n = re.sub(r"_[0-9a-f]{8,}$", "", n)
    n = re.sub(r"^void ", "", n)
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=60)
    ap.add_argument("--range", default="", help="A:B: only kernels A..B-1 (in launch order), for a "
                    "run profiled without a profiler range")
    a = ap.parse_args()
    raw = open(a.csv, "rb").read()
    if a.csv.endswith(".xz"):
        raw = lzma.decompress(raw)
    text = raw.decode("utf-8", errors="replace")
    # ncu prints its own log lines before the CSV; the CSV starts at the header row.
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"{a.csv}: no ncu CSV header found")
    rows = [r for r in csv.DictReader(io.StringIO(text[start:]))
            if r.get("Metric Name") == "gpu__time_duration.sum"]
    if a.range:
        lo, hi = (int(x) if x else None for x in a.range.split(":"))
        rows = rows[lo:hi]
    by = collections.OrderedDict()
    total = 0.0
    for r in rows:
        v = float(r["Metric Value"].replace(",", ""))
        us = v * UNITS.get(r.get("Metric Unit", "nsecond"), 1e-3)
        k = short(r["Kernel Name"])
        n, t = by.get(k, (0, 0.0))
        by[k] = (n + 1, t + us)
        total += us
    launches = sum(n for n, _ in by.values())
    print(f"{launches} kernels, {total:.1f} us of device time (ncu, serialized)")
    print(f"{'kernel':<60} {'launches':>8} {'total us':>10} {'per launch':>10} {'share':>7}")
    for k, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"{k[:60]:<60} {n:>8} {t:>10.1f} {t / n:>10.2f} {100 * t / total:>6.1f}%")


if __name__ == "__main__":
    main()
