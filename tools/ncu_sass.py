#!/usr/bin/env python3
"""Opcode mix of each kernel in an ncu source-page export (SASS per line).

    ncu --import rep.ncu-rep --page source --print-source sass --csv > sass.csv
    python3 tools/ncu_sass.py sass.csv[.xz] [--top 18]

Per profiled launch: warp-level instructions executed, and for each opcode (the mnemonic before
its first dot) its share of them and of the warp-stall samples. `call.sh sass B S` writes the
export.
"""
import argparse
import collections
import csv
import io
import lzma


def launches(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        cur = None
        for r in csv.reader(io.StringIO(f.read())):
            if r and r[0] == "Kernel Name":
                if cur:
                    yield cur
                cur = {"name": r[1], "rows": []}
            elif r and r[0] == "Address" and cur is not None:
                cur["hdr"] = r
            elif r and cur is not None and "hdr" in cur:
                cur["rows"].append(r)
        if cur:
            yield cur


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=18)
    a = ap.parse_args()
    for i, k in enumerate(launches(a.csv)):
        h = k["hdr"]
        ie, src = h.index("Instructions Executed"), h.index("Source")
        samp = h.index("Warp Stall Sampling (All Samples)")
        ops, stalls = collections.Counter(), collections.Counter()
        for r in k["rows"]:
            try:
                n = int(r[ie].replace(",", ""))
            except ValueError:
                continue
            words = r[src].split()
            if not words:
                continue
            op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
            op = op.split(".")[0]
            ops[op] += n
            stalls[op] += int(r[samp].replace(",", "") or 0)
        total, stotal = sum(ops.values()), max(sum(stalls.values()), 1)
        print(f"{i} {k['name']}: {total:,} warp instructions")
        for op, n in ops.most_common(a.top):
            print(f"    {op:<10} {100 * n / total:5.1f} %   stall samples {100 * stalls[op] / stotal:5.1f} %")


if __name__ == "__main__":
    main()
