#!/usr/bin/env python3
"""lm-evaluation-harness against our server: a multiple-choice task scored by log-likelihood
(`/v1/completions` with `echo`, `max_tokens: 0`, `logprobs`) and a generate-until task, both
defined from local JSON files (tools/lm_eval/*.jsonl), so no network is needed.

    pip install lm_eval==0.4.13
    cargo build --release --workspace --all-features --examples
    python3 tools/lm_eval_check.py          # starts target/release/examples/serve itself

With no `--url` the embedded tiny model (random weights, byte tokenizer) serves: the scores are
meaningless, the run must complete. lm_eval's `local-completions` model needs a tokenizer to cut
each context from its continuation: the served model's own (`--tokenizer DIR`; the tiny model's
directory is read from `serve`'s first line). Exits non-zero unless both tasks report a metric
for every sample. CI does not run it (no Python there).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import local_serve

HERE = os.path.dirname(os.path.abspath(__file__))

MC = """task: nemotron_local_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/mc.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
target_delimiter: " "
metric_list:
  - metric: acc
"""

GEN = """task: nemotron_local_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", help="a running server's base URL (…/v1)")
    ap.add_argument("--model", default="nemotron-tiny-synthetic")
    ap.add_argument("--tokenizer", help="the served model's tokenizer directory")
    ap.add_argument("--serve", default="target/release/examples/serve")
    a = ap.parse_args()

    proc, url, tok = None, a.url, a.tokenizer
    if url is None:
        proc, url, first = local_serve.start(a.serve)
        m = re.search(r" in (\S+)$", first.strip())
        if tok is None and m:
            tok = m.group(1)
    if tok is None:
        sys.exit("--tokenizer DIR: the served model's tokenizer is needed")
    try:
        with tempfile.TemporaryDirectory() as d:
            for name, text in (("mc.yaml", MC), ("gen.yaml", GEN)):
                with open(os.path.join(d, name), "w") as f:
                    f.write(text.format(data=os.path.join(HERE, "lm_eval")))
            out = os.path.join(d, "out")
            args = ",".join([
                f"model={a.model}", f"base_url={url}/completions", "tokenizer_backend=huggingface",
                f"tokenizer={tok}", "tokenized_requests=True", "num_concurrent=1", "max_retries=1",
                "max_length=256",
            ])
            cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
                   args, "--tasks", "nemotron_local_mc,nemotron_local_gen", "--include_path", d,
                   "--batch_size", "1", "--output_path", out]
            print("$", " ".join(cmd), flush=True)
            r = subprocess.run(cmd, env=dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1"))
            if r.returncode != 0:
                sys.exit(f"lm_eval exited {r.returncode}")
            found = [os.path.join(p, f) for p, _, fs in os.walk(out) for f in fs if f.startswith("results")]
            if not found:
                sys.exit(f"lm_eval wrote no results under {out}")
            res = json.load(open(found[0]))
            for task, metric, n in (("nemotron_local_mc", "acc,none", 4), ("nemotron_local_gen", "exact_match,none", 3)):
                got = res["results"].get(task, {})
                assert metric in got, (task, got)
                samples = res.get("n-samples", {}).get(task, {}).get("effective", n)
                assert samples == n, (task, samples)
                print(f"{task}: {metric} = {got[metric]} over {samples} samples")
            print("lm_eval: both tasks completed")
    finally:
        local_serve.stop(proc)

if __name__ == "__main__":
    main()
