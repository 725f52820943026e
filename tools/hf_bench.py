#!/usr/bin/env python3
"""HF transformers' speed on a NemotronH checkpoint directory, for the `bench` example's ratio.

    python3 tools/hf_bench.py DIR --prompt-len 128 --decode 32 --batch 1 --repeats 3
        [--device cpu|cuda] [--dtype float32|bfloat16] [--from-config]

--from-config builds the model from DIR/config.json with random weights directly on the device
(for quantized checkpoints HF cannot load, and for the 30B geometry without a 63 GB BF16 copy);
the speed does not depend on the weights' values.
--runs 1x1024,1x8192,16x128 measures several (batch x prompt) shapes after one load, a JSON
line each. Prints one JSON line per shape: {"prefill_tok_s": median, "decode_tok_s": median, ...}. Prefill = one
forward over random prompts (use_cache=True); decode = greedy steps fed one token at a time with
that cache, timed after the prefill.
"""
import argparse, json, statistics, sys, time

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--from-config", action="store_true")
    ap.add_argument("--runs", default="", help="BxP,BxP,...: overrides --batch/--prompt-len")
    a = ap.parse_args()
    import torch, transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    if a.from_config:
        cfg = AutoConfig.from_pretrained(a.dir)
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        cfg._attn_implementation = "eager"
        with torch.device(a.device):
            m = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        m = m.eval()
    else:
        m = AutoModelForCausalLM.from_pretrained(a.dir, dtype=dtype, attn_implementation="eager").to(a.device).eval()
    m.generation_config.eos_token_id = None
    runs = [tuple(int(v) for v in r.split("x")) for r in a.runs.split(",")] if a.runs else [(a.batch, a.prompt_len)]
    for batch, plen in runs:
        measure(m, a, batch, plen)


def measure(m, a, batch, plen):
    import torch, transformers
    V = m.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (batch, plen), generator=g).to(a.device)
    sync = (lambda: torch.cuda.synchronize()) if a.device.startswith("cuda") else (lambda: None)
    pre, dec = [], []
    with torch.inference_mode():
        for r in range(a.repeats + 1):
            sync(); t0 = time.perf_counter()
            out = m(ids, use_cache=True, logits_to_keep=1)
            sync(); t1 = time.perf_counter()
            cache = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            pos = plen
            for _ in range(a.decode):
                out = m(tok, past_key_values=cache, use_cache=True, logits_to_keep=1,
                        cache_position=torch.tensor([pos], device=a.device))
                cache = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)
                pos += 1
            sync(); t2 = time.perf_counter()
            if r > 0:  # the first run warms up
                pre.append(batch * plen / (t1 - t0))
                dec.append(batch * a.decode / (t2 - t1))
            del out, cache
    print(json.dumps({"prefill_tok_s": statistics.median(pre), "decode_tok_s": statistics.median(dec),
                      "transformers": transformers.__version__, "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "device": a.device, "dtype": a.dtype,
                      "batch": batch, "prompt_len": plen, "from_config": a.from_config}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
