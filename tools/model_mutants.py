# Mutation check for the model tests: applies each deliberate bug, runs the test binary that must
# catch it, prints RED/green, and restores the file. Run from the repository root:
#   python3 tools/model_mutants.py [name substring ...]
import subprocess
muts = [
 ("conv state keeps the oldest inputs", "nemotron-kernels/src/reference.rs",
  "let j = len as isize - km1 as isize + s as isize;", "let j = s as isize - km1 as isize;", "consistency"),
 ("scan runs every sequence for the first one's length", "nemotron-kernels/src/reference.rs",
  "for t in 0..lens[b] {", "for t in 0..lens[0].min(t_max) {", "consistency"),
 ("SSM decay without dt", "nemotron-kernels/src/reference.rs",
  "let decay = (dtv * a[hh]).exp();", "let decay = a[hh].exp();", "hf_parity"),
 ("routing weights not renormalized", "nemotron-kernels/src/reference.rs",
  "if c.norm_topk_prob {", "if false && c.norm_topk_prob {", "hf_parity"),
 # The CubeCL kernels, caught on wgpu (Mesa lavapipe) by the per-op tests.
 ("routing kernel never renormalizes", "nemotron-kernels/src/cube/route.rs",
  "if renorm {\n                v /= sum + 1e-20f32;", "if false && renorm {\n                v /= sum + 1e-20f32;", "ops"),
 ("tree arg-max (routing, greedy pick) prefers the higher index on ties", "nemotron-kernels/src/cube/reduce.rs",
  "(v == bv && i < bi)", "(v == bv && i > bi)", "ops"),
 ("add_rms_norm drops the mixer output", "nemotron-kernels/src/cube/norm.rs",
  "f32::cast_from(x[base + c]) + f32::cast_from(y[base + c])", "f32::cast_from(x[base + c])", "ops"),
 ("moe_combine ignores the routing weights", "nemotron-kernels/src/cube/route.rs",
  "acc += w[t * k + j] * f32::cast_from(", "acc += f32::cast_from(", "ops"),
 ("ssm_step ignores the dt floor", "nemotron-kernels/src/cube/mamba/step.rs",
  "F::cast_from(sp.max(dt_floor))", "F::cast_from(sp)", "ops"),
 ("vector NVFP4 GEMV swaps a chunk's two block scales", "nemotron-kernels/src/cube/linear/nvfp4.rs",
  "let p = p0 * e4m3(sw & 255u32) + p1 * e4m3((sw >> 8u32) & 255u32);",
  "let p = p1 * e4m3(sw & 255u32) + p0 * e4m3((sw >> 8u32) & 255u32);", "ops"),
 ("E2M1 register decode skips the subnormal repair", "nemotron-kernels/src/cube/linear/mod.rs",
  "let q = v.min(2.0f32 * v - 0.25f32);", "let q = v;", "ops"),
 ("small-M NVFP4 path reads the first row of x for every row", "nemotron-kernels/src/cube/linear/nvfp4.rs",
  "let xb = ((m0 + m).min(slots - 1) * k + cc * 32) / 4;", "let xb = (m0.min(slots - 1) * k + cc * 32) / 4;", "ops"),
 ("dense GEMV drops a lane of each 4-vector", "nemotron-kernels/src/cube/matmul.rs",
  "+ xf[g * 4 + 3] * wf[i + 3];", ";", "ops"),
 ("generator's slot decode feeds token 0", "nemotron-model/src/generate.rs",
  "TensorData::new(vec![token as i32], [1, 1]),", "TensorData::new(vec![0i32], [1, 1]),", "generation"),
 ("in_proj's dense split hands dt the last xBC columns", "nemotron-model/src/layers/linear.rs",
  "[0..a, a..b, b..b + widths[2]]", "[0..a, a..b, b - widths[2]..b]", "hf_parity"),
 ("three-part store puts the first xBC output into z", "nemotron-kernels/src/cube/linear/mod.rs",
  "        if n < a {\n            y[slot * a + n] = v;", "        if n <= a && n < b {\n            y[slot * a + n.min(a - 1)] = v;", "ops"),
 ("expert-major path gives every slot of an expert the first slot's input", "nemotron-kernels/src/cube/linear/grouped.rs",
  "xr[m] = members[e * pairs + (mb + m).min(count - 1)] as usize / div as usize;",
  "xr[m] = members[e * pairs + mb.min(count - 1)] as usize / div as usize;", "ops"),
 ("FP8 small-M rows are not quantized", "nemotron-kernels/src/cube/linear/fp8.rs",
  "        xq[i] = F::cast_from(e4m3_round(v));", "        xq[i] = F::cast_from(v);", "ops"),
 ("routed-expert kernel reads expert 0's weights", "nemotron-kernels/src/cube/linear/nvfp4.rs",
  "acc = nvfp4_partial(x, packed, scales, e * n_out + n, xrow, k as usize);", "acc = nvfp4_partial(x, packed, scales, n, xrow, k as usize);", "ops"),
 ("relu² epilogue skipped", "nemotron-kernels/src/cube/linear/mod.rs",
  "    if relu2 {\n        let r", "    if false {\n        let r", "ops"),
 ("RMSNorm kernel ignores the gate", "nemotron-kernels/src/cube/norm.rs",
  "        if gated {\n            let z = f32::cast_from(gate[base + c]);\n            u *= z / (1.0f32 + (-z).exp());\n        }\n        ss += u * u;",
  "        ss += u * u;", "ops"),
 ("dt softplus kernel drops dt_bias", "nemotron-kernels/src/cube/mamba/softplus.rs",
  "f32::cast_from(dt[i]) + f32::cast_from(bias[i % heads as usize])", "f32::cast_from(dt[i])", "ops"),
 ("E2M1 decode drops the sign", "nemotron-kernels/src/cube/linear/mod.rs",
  "f32::reinterpret(bits | ((code & 8u32) << 28u32))", "f32::reinterpret(bits)", "ops"),
 ("E4M3 decode with exponent bias 6", "nemotron-kernels/src/cube/linear/mod.rs",
  "((e + 120u32) << 23u32)", "((e + 121u32) << 23u32)", "ops"),
 ("E4M3 NaN codes decoded as numbers", "nemotron-kernels/src/cube/linear/mod.rs",
  "if (byte & 127u32) == 127u32 {", "if (byte & 127u32) == 128u32 {", "ops"),
 ("scan's first token reads its unwritten output state", "nemotron-kernels/src/cube/mamba/scan.rs",
  "            let prev = if t == 0 {\n                state[srow + nn]", "            let prev = if t == 0 {\n                new_state[srow + nn]", "ops"),
 ("conv kernel ignores the sequence lengths", "nemotron-kernels/src/cube/mamba/conv.rs",
  "    if ragged {\n        len = lens[b] as usize;", "    if false {\n        len = lens[b] as usize;", "ops"),
 ("decode attention reads query head h's own kv head", "nemotron-kernels/src/cube/attention/decode.rs",
  "    let g = h / (nh / kvh);\n    let kb", "    let g = h % kvh;\n    let kb", "ops"),
 ("decode attention merges only the first chunk of a long context", "nemotron-kernels/src/cube/attention/decode.rs",
  "    let used = n.div_ceil(chunk);", "    let used = 1usize.min(n.div_ceil(chunk));", "ops"),
 ("conv step does not shift its state", "nemotron-kernels/src/cube/mamba/step.rs",
  "    for kk in 1..km1 {\n        pool[base + kk - 1] = pool[base + kk];\n    }", "", "ops"),
 ("length advance skipped", "nemotron-kernels/src/cube/slots.rs",
  "        lens[s as usize] += 1;", "        lens[s as usize] += 0;", "ops"),
 ("a reused slot keeps the old conv state", "nemotron-model/src/slots.rs",
  "c.clone().reshape([ch, km1, 1]),", "conv.clone().slice_dim(0, slot..slot + 1).reshape([ch, km1, 1]),", "slots"),
 ("engine never frees a slot after decode", "nemotron-model/src/engine.rs",
  "            if stop.is_some() {\n                self.free.push(r.slot);\n            } else {\n                still.push(r);",
  "            if stop.is_some() {\n            } else {\n                still.push(r);", "engine"),
 ("top-k keeps one too many", "nemotron-model/src/sampling.rs",
  "idx.truncate(s.top_k);", "idx.truncate(s.top_k + 1);", "generation"),
 ("top-p drops the token that crosses p", "nemotron-model/src/sampling.rs",
  ".map_or(p.len(), |k| k + 1);", ".map_or(p.len(), |k| k.max(1));", "generation"),
 ("stop ids ignored", "nemotron-model/src/generate.rs",
  "if self.opts.stop_ids.contains(&tok) {", "if false && self.opts.stop_ids.contains(&tok) {", "generation"),
 ("stream releases incomplete characters", "src/text.rs",
  "&& !text.ends_with('\\u{FFFD}')", "", "generation"),
 ("batch ignores per-sequence seeds", "nemotron-model/src/engine.rs",
  "o.sampling.seed = opts.sampling.seed.wrapping_add(i as u64);", "o.sampling.seed = opts.sampling.seed;", "generation"),
]
import sys
only = sys.argv[1:]  # substrings of mutant names to run (all when empty)
for name, path, old, new, test in muts:
    if only and not any(o in name for o in only):
        continue
    s = open(path).read()
    assert old in s, name
    open(path, "w").write(s.replace(old, new, 1))
    # The root crate's tests are modules of one binary (tests/it): run the named module.
    cmd = ["cargo", "test", "--release", "--test", "it", "--", f"{test}::"]
    if test == "ops":  # the kernels' per-op tests on the wgpu arm (needs a Vulkan adapter)
        cmd = ["cargo", "test", "--release", "-p", "nemotron-kernels", "--all-features", "--test", test]
    r = subprocess.run(cmd, capture_output=True, text=True)
    failed = [l.split()[1] for l in r.stdout.splitlines() if l.startswith("test ") and l.endswith("FAILED")]
    print(f"{name}: {'RED' if r.returncode else 'green?!'} ({len(failed)} failed: {', '.join(failed)})", flush=True)
    open(path, "w").write(s)
