#!/usr/bin/env python3
"""Shows that the "hf+mamba_ssm-triton" benchmark peer computes the same model as plain HF.

    python3 tools/mamba_peer_check.py --mamba-ssm .whl
        [--dtypes float32,bfloat16] [--shapes 2x150,1x64,1x3] [--decode 8] [--seed 0] [--keep]

Needs a CUDA GPU, torch, transformers (written against 5.17's nemotron_h), triton and einops.
Builds a small random NemotronH (pattern M*MEM-M: Mamba2, attention, MoE, MLP layers; hidden 256,
8 Mamba heads x 64, state 64, 2 groups, conv 4, chunk 64) with realistic-scale weights (A_log =
log U[1,16], D ~ U[0.5,1.5], dt_bias = softplus^-1(logU[1e-3,1e-1]) with one head per Mamba layer
at -12 so that the prefill dt clamp matters, embeddings N(0,1), linears N(0,1/fan_in), conv
U(-0.5,0.5)) and runs it twice, in two fresh processes, on the same weights and prompts:

  torch   -- HF as installed: nemotron_h's torch fallbacks (the script stops if HF does not use
             them here, e.g. because a mamba_ssm is installed site-wide);
  triton  -- the same with --mamba-ssm DIR first on sys.path (as tools/hf_bench.py --mamba-ssm):
             mamba_ssm's Triton chunked scan / selective_state_update and the torch causal_conv1d
             stand-in; the script checks that nemotron_h resolved them from DIR and counts calls.

For each dtype and (batch x prompt) shape: one prefill (use_cache=True, all logits), then --decode
greedy steps with the cache, one token at a time (as hf_bench.py does). The first run (torch, first
dtype) decodes freely; every other run is fed the same tokens, so all logits rows are comparable.
Prints max |diff| and rel = max|diff| / max|reference| of the prefill and decode logits, per Mamba
layer of the prefill mixer outputs, and greedy agreement (a disagreement counts as a near-tie, not
a failure, when the reference's top-2 gap is below 2x the row's max |diff|). Pass rules:

  float32   triton vs torch: logits and Mamba-layer rel <= 2e-2 (Triton's tl.dot runs f32 as TF32),
            no greedy disagreement beyond near-ties.
  bfloat16  with float32 also run: rel(triton-bf16 vs torch-f32) <= max(2 x rel(torch-bf16 vs
            torch-f32), 5e-2), i.e. within twice HF's own bf16 drift; otherwise triton vs torch
            bf16 rel <= 0.1. Greedy as above against torch-bf16. (HF keeps the SSM decode state in
            fp32 on the torch path; mamba_chunk_scan_combined returns it in the input dtype, so
            the Triton peer decodes from a bf16 state -- that is how HF + mamba_ssm behaves.)

Exit 0 on pass, 1 on a mismatch, 2/3 when a run could not be made. The last stdout line is a JSON
summary. Run from the repository root.
"""
import argparse, copy, importlib, json, math, os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_bench  # noqa: E402  (imports nothing heavy at module level)

PATTERN = "M*MEM-M"
CONFIG = dict(
    vocab_size=512,
    hidden_size=256,
    hybrid_override_pattern=PATTERN,
    mamba_num_heads=8,
    mamba_head_dim=64,
    ssm_state_size=64,
    n_groups=2,
    conv_kernel=4,
    chunk_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    moe_shared_expert_intermediate_size=128,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=2.5,
    intermediate_size=256,
    layer_norm_epsilon=1e-5,
    tie_word_embeddings=False,
    use_mamba_kernels=True,
)
TOL_F32 = 2e-2
BF16_FACTOR, BF16_FLOOR, BF16_DIRECT = 2.0, 5e-2, 0.1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mamba-ssm", required=True, metavar="DIR", help="folder with mamba_ssm/ and causal_conv1d/ (.whl)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--shapes", default="2x150,1x64,1x3", help="BxL,...: batch x prompt length")
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (weights, logits)")
    ap.add_argument("--child", choices=["torch", "triton"], help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.dtype_list = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    a.shape_list = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",") if s.strip()]
    if a.child:
        return child(a)
    return parent(a)


# ----------------------------------------------------------------------------------------------
# parent: run the two children, compare
# ----------------------------------------------------------------------------------------------


def parent(a):
    work = tempfile.mkdtemp(prefix="mamba_peer_check.")
    cmd = [sys.executable, os.path.abspath(__file__), "--mamba-ssm", a.mamba_ssm, "--dtypes", a.dtypes,
           "--shapes", a.shapes, "--decode", str(a.decode), "--seed", str(a.seed), "--device", a.device,
           "--work", work]
    for kind in ("torch", "triton"):
        print(f"== {kind} run", flush=True)
        r = subprocess.run(cmd + ["--child", kind])
        if r.returncode != 0:
            print(f"mamba_peer_check: the {kind} run failed (exit {r.returncode}); work folder {work}")
            print(json.dumps({"pass": False, "error": f"{kind} run failed", "exit": r.returncode}))
            return r.returncode if r.returncode in (2, 3) else 2
    import torch
    ref = torch.load(os.path.join(work, "torch.pt"), weights_only=False)
    tri = torch.load(os.path.join(work, "triton.pt"), weights_only=False)
    ok, summary = compare(ref, tri, a)
    if a.keep:
        print(f"work folder kept: {work}")
    else:
        for f in os.listdir(work):
            os.remove(os.path.join(work, f))
        os.rmdir(work)
    summary.update(ref["meta"])
    summary.update({"triton": tri["meta"].get("triton"), "mamba_ssm": tri["meta"].get("mamba_ssm"),
                    "impl_triton": tri["meta"].get("impl_triton"), "calls": tri["meta"].get("calls"), "pass": ok})
    print("PASS: the mamba_ssm Triton peer computes the same model as HF's torch path" if ok
          else "FAIL: the mamba_ssm Triton peer does not match HF's torch path")
    print(json.dumps(summary), flush=True)
    return 0 if ok else 1


def diff(x, ref):
    d = (x - ref).abs().max().item()
    return d, d / max(ref.abs().max().item(), 1e-30)


def greedy(rows_ref, rows_x):
    """rows: [B, S, V] logits rows. (agree, near_ties, bad) of the arg-max picks."""
    p_ref, p_x = rows_ref.argmax(-1), rows_x.argmax(-1)
    agree, ties, bad = int((p_ref == p_x).sum()), 0, 0
    for b, s in (p_ref != p_x).nonzero().tolist():
        top2 = rows_ref[b, s].topk(2).values
        gap = (top2[0] - top2[1]).item()
        err = (rows_ref[b, s] - rows_x[b, s]).abs().max().item()
        if gap <= 2 * err:
            ties += 1
        else:
            bad += 1
    return agree, ties, bad


def compare(ref, tri, a):
    ok = True
    out = {}
    f32 = "float32" in a.dtype_list
    for dt in a.dtype_list:
        out[dt] = {}
        for key, r in ref["runs"][dt].items():
            t = tri["runs"][dt][key]
            pre = diff(t["prefill"], r["prefill"])
            dec = diff(t["rows"], r["rows"])
            agree, ties, bad = greedy(r["rows"], t["rows"])
            total = r["rows"].shape[0] * r["rows"].shape[1]
            layers = [diff(tm, rm)[1] for tm, rm in zip(t["mixers"], r["mixers"])]
            res = {"prefill_max_abs": pre[0], "prefill_rel": pre[1], "rows_max_abs": dec[0], "rows_rel": dec[1],
                   "greedy_agree": agree, "greedy_total": total, "near_ties": ties, "greedy_bad": bad,
                   "mamba_layer_rel": layers}
            why = []
            if bad:
                why.append(f"{bad} greedy picks differ beyond near-ties")
            if dt == "float32":
                if max(pre[1], dec[1]) > TOL_F32:
                    why.append(f"logits rel {max(pre[1], dec[1]):.2e} > {TOL_F32:.0e}")
                if layers and max(layers) > TOL_F32:
                    why.append(f"Mamba layer rel {max(layers):.2e} > {TOL_F32:.0e}")
            elif f32 and dt != "float32":
                base = ref["runs"]["float32"][key]
                d_torch = max(diff(r["prefill"], base["prefill"])[1], diff(r["rows"], base["rows"])[1])
                d_tri = max(diff(t["prefill"], base["prefill"])[1], diff(t["rows"], base["rows"])[1])
                limit = max(BF16_FACTOR * d_torch, BF16_FLOOR)
                res.update({"drift_vs_f32_torch": d_torch, "drift_vs_f32_triton": d_tri, "drift_limit": limit})
                if d_tri > limit:
                    why.append(f"drift from f32 {d_tri:.2e} > limit {limit:.2e} (HF torch {dt}: {d_torch:.2e})")
            elif max(pre[1], dec[1]) > BF16_DIRECT:
                why.append(f"logits rel {max(pre[1], dec[1]):.2e} > {BF16_DIRECT}")
            res["ok"] = not why
            ok &= not why
            out[dt][key] = res
            line = (f"{dt:9s} {key:7s} prefill max|d| {pre[0]:.2e} rel {pre[1]:.2e} | "
                    f"last+decode rows max|d| {dec[0]:.2e} rel {dec[1]:.2e} | greedy {agree}/{total}"
                    f"{f' ({ties} near-ties)' if ties else ''}")
            if "drift_vs_f32_torch" in res:
                line += (f" | drift vs f32 torch: torch {res['drift_vs_f32_torch']:.2e}, "
                         f"triton {res['drift_vs_f32_triton']:.2e} (limit {res['drift_limit']:.2e})")
            print(line)
            print(f"          Mamba layers (prefill mixer output) rel: " + " ".join(f"{v:.1e}" for v in layers))
            for w in why:
                print(f"          MISMATCH: {w}")
    return ok, {"results": out}


# ----------------------------------------------------------------------------------------------
# children: build, run, save
# ----------------------------------------------------------------------------------------------


def child(a):
    if a.child == "triton":
        mamba_dir = hf_bench.use_local_mamba(a.mamba_ssm)  # sys.path + USE_HUB_KERNELS=0, before transformers
    else:
        os.environ["USE_HUB_KERNELS"] = "0"  # same setting on both sides
    import torch
    import transformers
    from transformers import NemotronHConfig, NemotronHForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if not (a.device.startswith("cuda") and torch.cuda.is_available()):
        print("mamba_peer_check: needs a CUDA device (Triton kernels)", file=sys.stderr)
        return 3
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    nh = importlib.import_module(hf_bench.NH_MODULE)

    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(torch.device(a.device)), "pattern": PATTERN}
    impls = hf_bench.resolved_impls()
    meta["impl_" + a.child] = {k: (".".join(v) if v else None) for k, v in impls.items()}
    if a.child == "triton":
        problems = hf_bench.fast_path_problems(mamba_dir)
        if problems:
            print("mamba_peer_check: HF's Mamba fast path is NOT active with " + mamba_dir + ":", file=sys.stderr)
            for p in problems:
                print("  - " + p, file=sys.stderr)
            return 3
        import mamba_ssm, triton
        meta.update({"triton": triton.__version__, "mamba_ssm": mamba_ssm.__version__})
    else:
        kind = hf_bench.peer_kind()
        if kind != "hf-torch":
            print(f"mamba_peer_check: the reference run is not HF's torch fallback ({kind}: {impls}); "
                  "is a mamba_ssm / causal_conv1d installed site-wide?", file=sys.stderr)
            return 3
    print(f"  {a.child}: " + ", ".join(f"{k} -> {meta['impl_' + a.child][k]}" for k in impls), flush=True)

    cfg = NemotronHConfig(**CONFIG)
    cfg._attn_implementation = "eager"
    try:
        cfg._experts_implementation = "eager"  # the per-expert loop: no grouped_mm dtype limits
    except Exception:  # a transformers without selectable experts implementations
        pass
    torch.manual_seed(a.seed)
    base = NemotronHForCausalLM(cfg).float().eval()
    wpath = os.path.join(a.work, "weights.pt")
    if a.child == "torch":
        randomize(base, a.seed)
        torch.save(base.state_dict(), wpath)
        tokens = None
    else:
        base.load_state_dict(torch.load(wpath))
        tokens = torch.load(os.path.join(a.work, "torch.pt"), weights_only=False)["tokens"]

    counts = dict.fromkeys(hf_bench.FAST_FUNCS, 0)
    if a.child == "triton":  # count what the wrappers really call, for the whole run
        def counting(name, impl):
            def f(*args, **kwargs):
                counts[name] += 1
                return impl(*args, **kwargs)
            return f
        for name in hf_bench.FAST_FUNCS:
            cell = hf_bench.impl_cell(getattr(nh, name))
            cell.cell_contents = counting(name, cell.cell_contents)

    n_mamba = sum(isinstance(x, nh.NemotronHMamba2Mixer) for x in base.modules())
    runs = {}
    for i, dt in enumerate(a.dtype_list):
        m = copy.deepcopy(base).to(device=a.device, dtype=getattr(torch, dt))
        for mod in m.modules():  # as from_pretrained keeps it (_keep_in_fp32_modules_strict)
            if isinstance(getattr(mod, "e_score_correction_bias", None), torch.Tensor):
                mod.e_score_correction_bias = mod.e_score_correction_bias.float()
        m.eval()
        runs[dt] = {}
        for B, L in a.shape_list:
            key = f"{B}x{L}"
            forced = None if (tokens is None or key not in tokens) else tokens[key]
            res = run_shape(torch, nh, m, a, B, L, forced)
            if tokens is None or key not in tokens:  # the torch run of the first dtype leads
                tokens = tokens or {}
                tokens[key] = res["pred"]
            runs[dt][key] = res
        del m
        torch.cuda.empty_cache()

    if a.child == "triton":
        per_shape = len(a.dtype_list) * len(a.shape_list)
        want = {"causal_conv1d_fn": per_shape * n_mamba, "mamba2_chunk_scan": per_shape * n_mamba,
                "causal_conv1d_update": per_shape * a.decode * n_mamba,
                "mamba2_selective_state_update": per_shape * a.decode * n_mamba}
        meta["calls"] = dict(counts)
        print(f"  triton: calls {counts} (expected {want})", flush=True)
        missing = [k for k, v in counts.items() if v == 0 and want[k] > 0]
        if missing:
            print(f"mamba_peer_check: never called: {missing}", file=sys.stderr)
            return 3
        if counts != want:
            print("  note: call counts differ from one call per Mamba layer per step", flush=True)

    torch.save({"meta": meta, "runs": runs, "tokens": tokens}, os.path.join(a.work, f"{a.child}.pt"))
    return 0


def run_shape(torch, nh, m, a, B, L, forced):
    """Prefill + a.decode cached steps. Returns CPU f32 tensors: prefill [B,L,V]; rows [B,1+n,V]
    (last prefill row, then each decode step); pred [B,1+n] (arg-max of each row); mixers (each
    Mamba layer's prefill output). Step i feeds forced[:, i] if given, else its own pick."""
    g = torch.Generator().manual_seed(1000 * a.seed + 31 * B + L)
    ids = torch.randint(0, m.config.vocab_size, (B, L), generator=g).to(a.device)
    mixers, capture = [], [True]

    def hook(_mod, _args, output):
        if capture[0]:
            mixers.append(output.detach().float().cpu())

    hooks = [x.register_forward_hook(hook) for x in m.modules() if isinstance(x, nh.NemotronHMamba2Mixer)]
    try:
        with torch.inference_mode():
            out = m(ids, use_cache=True, logits_to_keep=0)
            capture[0] = False
            prefill = out.logits.float().cpu()
            rows = [out.logits[:, -1].float()]
            cache = out.past_key_values
            for i in range(a.decode):
                tok = forced[:, i : i + 1].to(a.device) if forced is not None else rows[-1].argmax(-1, keepdim=True)
                out = m(tok, past_key_values=cache, use_cache=True, logits_to_keep=1,
                        cache_position=torch.tensor([L + i], device=a.device))
                cache = out.past_key_values
                rows.append(out.logits[:, -1].float())
            torch.cuda.synchronize()
    finally:
        for h in hooks:
            h.remove()
    rows = torch.stack(rows, dim=1).cpu()
    return {"prefill": prefill, "rows": rows, "pred": rows.argmax(-1), "mixers": mixers}


def randomize(model, seed):
    """Realistic-scale random weights (as tools/gen_hf_fixtures.py), deterministic on CPU."""
    import torch

    g = torch.Generator().manual_seed(seed + 12345)

    def normal(t, std):
        t.copy_(torch.randn(t.shape, generator=g) * std)

    def uniform(t, lo, hi):
        t.copy_(torch.rand(t.shape, generator=g) * (hi - lo) + lo)

    named = list(model.named_parameters()) + [
        (n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")]
    with torch.no_grad():
        for name, t in named:
            if not t.is_floating_point():
                continue
            if name.endswith("mixer.A_log"):
                t.copy_(torch.log(torch.rand(t.shape, generator=g) * 15.0 + 1.0))  # log U[1,16]
            elif name.endswith("mixer.dt_bias"):
                lo, hi = math.log(1e-3), math.log(1e-1)
                dt = torch.exp(torch.rand(t.shape, generator=g, dtype=torch.float64) * (hi - lo) + lo)
                t.copy_((dt + torch.log(-torch.expm1(-dt))).float())  # softplus^-1
                t[int(torch.randint(0, t.numel(), (1,), generator=g))] = -12.0
            elif name.endswith("mixer.D"):
                uniform(t, 0.5, 1.5)
            elif "conv1d" in name:
                uniform(t, -0.5, 0.5)
            elif name.endswith("e_score_correction_bias"):
                normal(t, 0.5)
            elif name.endswith("embeddings.weight"):
                normal(t, 1.0)
            elif t.dim() == 1:  # norm weights (no other 1-D parameters: no biases in this config)
                t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=g))
            elif t.dim() == 3:  # stacked experts [E, out, in]
                normal(t, 1.0 / math.sqrt(t.shape[-1]))
            elif t.dim() == 2:  # nn.Linear [out, in], router
                normal(t, 1.0 / math.sqrt(t.shape[1]))


if __name__ == "__main__":
    sys.exit(main())
