#!/usr/bin/env python3
"""HF transformers' speed on a NemotronH checkpoint directory, for the `bench` example's ratio.

    python3 tools/hf_bench.py DIR --prompt-len 128 --decode 32 --batch 1 --repeats 3
        [--device cpu|cuda] [--dtype float32|bfloat16] [--from-config] [--mamba-ssm DIR]

--from-config builds the model from DIR/config.json with random weights directly on the device
(for quantized checkpoints HF cannot load, and for the 30B geometry without a 63 GB BF16 copy);
the speed does not depend on the weights' values.
--runs 1x1024,1x8192,16x128 measures several (batch x prompt) shapes after one load, a JSON
line each. Prints one JSON line per shape: {"prefill_tok_s": median, "decode_tok_s": median, ...}. Prefill = one
forward over random prompts (use_cache=True); decode = greedy steps fed one token at a time with
that cache, timed after the prefill.
--mamba-ssm DIR (CUDA only) makes the stronger peer "hf+mamba_ssm-triton": DIR (the repo's
git-ignored .whl/, see .whl/README.txt) goes first on sys.path before transformers is imported,
so HF's nemotron_h finds mamba_ssm's Triton kernels (chunked-scan prefill, selective_state_update
decode) and a pure-torch causal_conv1d stand-in, instead of its torch fallbacks; USE_HUB_KERNELS=0
keeps the `kernels` Hub package out. Before measuring, the script checks that nemotron_h resolved
those functions from DIR and that an 8-token prefill + 1 decode step really calls each of them;
otherwise it exits 2 naming what is missing (e.g. einops not installed). Without the flag nothing
changes ("peer": "hf-torch" when HF runs its torch fallbacks). Diagnostics go to stderr; stdout
has only the JSON lines (the `bench` example reads the last one).
"""
import argparse, json, os, statistics, sys, time

# HF nemotron_h (transformers 5.17) wrappers made by use_kernel_func_from_hub_with_fallback, and
# the module each must resolve to for the Triton peer. mamba2_split_conv1d_scan_combined (training
# only) is left out.
FAST_FUNCS = {
    "causal_conv1d_fn": "causal_conv1d",
    "causal_conv1d_update": "causal_conv1d",
    "mamba2_chunk_scan": "mamba_ssm.ops.triton.ssd_combined",
    "mamba2_selective_state_update": "mamba_ssm.ops.triton.selective_state_update",
}
NH_MODULE = "transformers.models.nemotron_h.modeling_nemotron_h"


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
    ap.add_argument("--mamba-ssm", default="", metavar="DIR",
                    help="folder holding mamba_ssm/ (Triton kernels) and causal_conv1d/ (stand-in)")
    a = ap.parse_args()
    if a.mamba_ssm:
        if not a.device.startswith("cuda"):
            sys.exit("hf_bench: --mamba-ssm needs --device cuda (Triton kernels)")
        a.mamba_ssm = use_local_mamba(a.mamba_ssm)
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
    if a.mamba_ssm:
        problems = fast_path_problems(a.mamba_ssm)
        if not problems:
            problems = probe_calls(m, a.device)
        if problems:
            print("hf_bench: --mamba-ssm: HF's Mamba fast path is NOT active:", file=sys.stderr)
            for p in problems:
                print("  - " + p, file=sys.stderr)
            sys.exit(2)
        print(f"hf_bench: HF nemotron_h runs mamba_ssm Triton kernels from {a.mamba_ssm} "
              "(causal conv: torch stand-in)", file=sys.stderr)
    a.peer = peer_kind()
    runs = [tuple(int(v) for v in r.split("x")) for r in a.runs.split(",")] if a.runs else [(a.batch, a.prompt_len)]
    for batch, plen in runs:
        measure(m, a, batch, plen)


def use_local_mamba(path):
    """Put PATH first on sys.path (before transformers is imported) and keep the Hub out."""
    d = os.path.abspath(path)
    for pkg in ("mamba_ssm", "causal_conv1d"):
        if not os.path.isfile(os.path.join(d, pkg, "__init__.py")):
            sys.exit(f"hf_bench: --mamba-ssm {path}: no {pkg}/__init__.py there (see .whl/README.txt)")
    if "transformers" in sys.modules:
        sys.exit("hf_bench: --mamba-ssm must be applied before transformers is imported")
    sys.path.insert(0, d)
    # transformers reads this when integrations.hub_kernels is imported: the `kernels` Hub
    # package (if installed) then wraps nothing, and the local packages are what HF uses.
    os.environ["USE_HUB_KERNELS"] = "0"
    return d


def impl_cell(fn):
    """The closure cell `implementation` of a transformers use_kernel_func_from_hub_with_fallback
    wrapper (what the wrapper calls), or None if FN is not such a wrapper."""
    seen = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
        if code is not None and cells:
            named = dict(zip(code.co_freevars, cells))
            if "implementation" in named:
                return named["implementation"]
        fn = getattr(fn, "__wrapped__", None)
    return None


def resolved_impls():
    """{wrapper name: (module, qualname) of the function HF's nemotron_h wrapper calls, or None}."""
    import importlib
    nh = importlib.import_module(NH_MODULE)
    out = {}
    for name in FAST_FUNCS:
        cell = impl_cell(getattr(nh, name, None))
        impl = cell.cell_contents if cell is not None else None
        out[name] = None if impl is None else (getattr(impl, "__module__", "?"), getattr(impl, "__qualname__", "?"))
    return out


def peer_kind():
    """'hf+mamba_ssm-triton' when all four Mamba functions come from mamba_ssm / causal_conv1d,
    'hf-torch' when all are HF's torch fallbacks (or the wrappers are not found), else 'hf-mixed'."""
    try:
        impls = resolved_impls()
    except Exception:
        return "hf-torch"
    fast = [v is not None and v[0] == FAST_FUNCS[k] for k, v in impls.items()]
    return "hf+mamba_ssm-triton" if all(fast) else ("hf-mixed" if any(fast) else "hf-torch")


def fast_path_problems(mamba_dir):
    """[] when HF's nemotron_h resolved its Mamba functions to mamba_ssm's Triton kernels and the
    causal_conv1d stand-in under MAMBA_DIR; else one line per missing piece."""
    import importlib
    problems = []
    for mod in ("triton", "einops", "packaging"):
        try:
            importlib.import_module(mod)
        except Exception as e:
            problems.append(f"cannot import {mod} ({e!r}); mamba_ssm's Triton files need it")
    for mod in ("causal_conv1d", "mamba_ssm.ops.triton.selective_state_update", "mamba_ssm.ops.triton.ssd_combined"):
        try:
            f = os.path.abspath(importlib.import_module(mod).__file__)
            if not f.startswith(mamba_dir + os.sep):
                problems.append(f"{mod} is imported from {f}, not from {mamba_dir}")
        except Exception as e:
            problems.append(f"cannot import {mod} ({e!r})")
    try:
        impls = resolved_impls()
    except Exception as e:
        return problems + [f"cannot import {NH_MODULE} ({e!r})"]
    for name, want in FAST_FUNCS.items():
        got = impls[name]
        if got is None:
            problems.append(f"{NH_MODULE}.{name} is missing or not a use_kernel_func_from_hub_with_fallback "
                            "wrapper: this transformers version selects its kernels differently")
        elif got[0] != want:
            problems.append(f"{name} resolved to {got[0]}.{got[1]} (torch fallback), not {want}")
    return problems


def probe_calls(m, device):
    """An 8-token prefill and one decode step with call counters on the four resolved functions:
    [] if each was called (once per Mamba layer), else what was not."""
    import importlib, torch
    nh = importlib.import_module(NH_MODULE)
    counts = dict.fromkeys(FAST_FUNCS, 0)
    saved = []

    def counting(name, impl):
        def f(*args, **kwargs):
            counts[name] += 1
            return impl(*args, **kwargs)
        return f

    n_mamba = sum(isinstance(x, nh.NemotronHMamba2Mixer) for x in m.modules())
    for name in FAST_FUNCS:
        cell = impl_cell(getattr(nh, name))
        saved.append((cell, cell.cell_contents))
        cell.cell_contents = counting(name, cell.cell_contents)
    try:
        with torch.inference_mode():
            ids = torch.randint(0, m.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1)).to(device)
            out = m(ids, use_cache=True, logits_to_keep=1)
            tok = out.logits[:, -1:].argmax(-1)
            m(tok, past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1,
              cache_position=torch.tensor([8], device=device))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
    except Exception as e:
        import traceback
        traceback.print_exc()
        return [f"probe forward failed: {e!r}"]
    finally:
        for cell, impl in saved:
            cell.cell_contents = impl
    return [f"{name} was called {c} times in the probe (expected {n_mamba}, once per Mamba layer)"
            for name, c in counts.items() if c != n_mamba or n_mamba == 0]


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
    rec = {"prefill_tok_s": statistics.median(pre), "decode_tok_s": statistics.median(dec),
           "transformers": transformers.__version__, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "device": a.device, "dtype": a.dtype,
           "batch": batch, "prompt_len": plen, "from_config": a.from_config, "peer": a.peer}
    if a.mamba_ssm:
        import mamba_ssm, triton
        rec.update({"mamba_ssm": mamba_ssm.__version__, "triton": triton.__version__})
    print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    sys.exit(main())
