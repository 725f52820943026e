#!/usr/bin/env python3
"""Runs cargo-mutants' mutants of one file against tests of another package.

cargo-mutants 27.1.0 tests only the mutated package here, whatever `--test-package` or
`--test-workspace` say (its argv: `cargo test --package=nemotron-model …`), and the sampling
code's tests live in the root crate's `it` binary. This applies each listed mutant with `patch`,
builds and runs the given tests, restores the file with git, and writes one line per mutant:

    cargo mutants -p nemotron-model --file nemotron-model/src/sampling.rs --list --json --diff > m.json
    python3 tools/mutants_apply.py --shard 0/9 --out /tmp/mut0.txt m.json -- \\
        cargo test --release --workspace --all-features --test it -- generation:: engine::

Outcomes: `caught` (tests fail), `missed` (tests pass), `unviable` (the build fails), `timeout`.
Options before the mutants file (what follows it is the test command). Run from the
repository root with a clean tree; never while editing sources.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time


def run(cmd, timeout):
    """`cmd`'s exit status; on timeout its whole process group is killed (a mutant that loops
    leaves the test binary spinning under cargo otherwise)."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mutants")
    ap.add_argument("--shard", default="0/1", help="k/n, round robin over the listed order")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("test", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    test = a.test[1:] if a.test[:1] == ["--"] else a.test
    k, n = map(int, a.shard.split("/"))
    muts = [m for i, m in enumerate(json.load(open(a.mutants))) if i % n == k]
    if subprocess.run(["git", "diff", "--quiet"]).returncode != 0:
        sys.exit("the tree has changes: commit or stash them first")
    # The same command with --no-run builds without testing (a failed build: unviable).
    sep = test.index("--") if "--" in test else len(test)
    build = test[:sep] + ["--no-run"]
    counts = {}
    with open(a.out, "a") as out:
        for m in muts:
            name = m["name"]
            t0 = time.time()
            p = subprocess.run(["patch", "--quiet", "--forward", m["file"]], input=m["diff"], text=True)
            if p.returncode != 0:
                outcome = "unapplied"
            else:
                try:
                    if run(build, 900) != 0:
                        outcome = "unviable"
                    else:
                        outcome = "missed" if run(test, a.timeout) == 0 else "caught"
                except subprocess.TimeoutExpired:
                    outcome = "timeout"
            subprocess.run(["git", "checkout", "--quiet", "--", m["file"]], check=True)
            counts[outcome] = counts.get(outcome, 0) + 1
            line = f"{outcome}\t{time.time() - t0:.0f}s\t{name}"
            print(line, flush=True)
            out.write(line + "\n")
            out.flush()
    print(counts)


if __name__ == "__main__":
    main()
