//! The math of each op in plain Rust over row-major f32 slices, written to follow the model
//! description as literally as possible. The host backends (Flex, NdArray) run these; device kernels are tested
//! against them.

use crate::{Epilogue, Fp8Matrix, Nvfp4Matrix, RouteConfig, ScanDims, MASKED_SCORE};
use nemotron_formats as fmt;

/// A borrowed NVFP4 matrix: the shipped bytes (see [`Nvfp4Matrix`]).
#[derive(Debug, Clone, Copy)]
pub struct Nvfp4View<'a> {
    pub out_features: usize,
    pub in_features: usize,
    pub packed: &'a [u8],
    pub block_scales: &'a [u8],
    pub global_scale: f32,
}

/// A borrowed per-tensor FP8 matrix (see [`Fp8Matrix`]).
#[derive(Debug, Clone, Copy)]
pub struct Fp8View<'a> {
    pub out_features: usize,
    pub in_features: usize,
    pub weight: &'a [u8],
    pub weight_scale: f32,
    pub input_scale: f32,
}

impl Nvfp4Matrix {
    pub fn view(&self) -> Nvfp4View<'_> {
        Nvfp4View {
            out_features: self.out_features,
            in_features: self.in_features,
            packed: &self.packed,
            block_scales: &self.block_scales,
            global_scale: self.global_scale,
        }
    }
}

impl Fp8Matrix {
    pub fn view(&self) -> Fp8View<'_> {
        Fp8View {
            out_features: self.out_features,
            in_features: self.in_features,
            weight: &self.weight,
            weight_scale: self.weight_scale,
            input_scale: self.input_scale,
        }
    }
}

/// Runs `f(row_range)` over `n` rows split across the machine's cores, collecting each part.
fn par_rows<T: Send>(n: usize, f: impl Fn(std::ops::Range<usize>) -> Vec<T> + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(n.max(1));
    if threads <= 1 || n < 64 {
        return f(0..n);
    }
    let per = n.div_ceil(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                s.spawn(move || f((t * per).min(n)..((t + 1) * per).min(n)))
            })
            .collect();
        #[allow(
            clippy::expect_used,
            reason = "re-raises a worker's panic on the caller's thread; workers compute on checked shapes"
        )]
        let out = hs
            .into_iter()
            .flat_map(|h| h.join().expect("worker"))
            .collect();
        out
    })
}

/// `y[m, n] = Σ_k x[m, k] · W[n, k]` for `x` of `rows × k` and `W` given row by row by
/// `dequant_row(n, &mut buf)`. Output is `rows × out`.
fn matmul_rows(
    x: &[f32],
    rows: usize,
    k: usize,
    out: usize,
    dequant_row: impl Fn(usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    // Each worker owns a range of output features (weight rows): dequantize once, dot with all x.
    let cols: Vec<Vec<f32>> = par_rows(out, |range| {
        let mut w = vec![0f32; k];
        range
            .map(|n| {
                dequant_row(n, &mut w);
                (0..rows)
                    .map(|m| dot(&x[m * k..(m + 1) * k], &w))
                    .collect::<Vec<f32>>()
            })
            .collect()
    });
    let mut y = vec![0f32; rows * out];
    for (n, col) in cols.iter().enumerate() {
        for m in 0..rows {
            y[m * out + n] = col[m];
        }
    }
    y
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// NVFP4 weight-only linear.
pub fn nvfp4_linear(x: &[f32], rows: usize, w: &Nvfp4View) -> Vec<f32> {
    let k = w.in_features;
    assert_eq!(
        x.len(),
        rows * k,
        "nvfp4_linear: x is not rows × in_features"
    );
    let nb = k / fmt::NVFP4_BLOCK;
    matmul_rows(x, rows, k, w.out_features, |n, buf| {
        fmt::nvfp4_dequant_row(
            &w.packed[n * k / 2..(n + 1) * k / 2],
            &w.block_scales[n * nb..(n + 1) * nb],
            w.global_scale,
            buf,
        )
    })
}

/// Routed-expert linear: row `s` of the output is `W[experts[s]] · x[s / div]`, with
/// `linear(x_rows, rows, W)` the single-matrix product. The slots of one expert are gathered and
/// multiplied together (each weight is decoded once per call).
fn expert_linear<M>(
    x: &[f32],
    experts: &[usize],
    div: usize,
    w: &[M],
    (k, out): (usize, usize),
    linear: impl Fn(&[f32], usize, &M) -> Vec<f32>,
) -> Vec<f32> {
    let mut y = vec![0f32; experts.len() * out];
    for (e, m) in w.iter().enumerate() {
        let slots: Vec<usize> = (0..experts.len()).filter(|&s| experts[s] == e).collect();
        if slots.is_empty() {
            continue;
        }
        let xs: Vec<f32> = slots
            .iter()
            .flat_map(|&s| x[(s / div) * k..(s / div + 1) * k].iter().copied())
            .collect();
        let ys = linear(&xs, slots.len(), m);
        for (i, &s) in slots.iter().enumerate() {
            y[s * out..(s + 1) * out].copy_from_slice(&ys[i * out..(i + 1) * out]);
        }
    }
    y
}

/// Routed-expert NVFP4 linear (slots grouped by expert, as in `expert_linear`).
pub fn nvfp4_expert_linear(x: &[f32], experts: &[usize], div: usize, w: &[Nvfp4View]) -> Vec<f32> {
    let shape = (w[0].in_features, w[0].out_features);
    expert_linear(x, experts, div, w, shape, nvfp4_linear)
}

/// Routed-expert FP8 W8A8 linear (slots grouped by expert, as in `expert_linear`).
pub fn fp8_expert_linear(x: &[f32], experts: &[usize], div: usize, w: &[Fp8View]) -> Vec<f32> {
    let shape = (w[0].in_features, w[0].out_features);
    expert_linear(x, experts, div, w, shape, fp8_linear)
}

/// Static per-tensor FP8 W8A8 linear (vLLM's ModelOpt FP8 path): the activation is quantized
/// with the static input scale, the E4M3 products are accumulated, then scaled once.
pub fn fp8_linear(x: &[f32], rows: usize, w: &Fp8View) -> Vec<f32> {
    let k = w.in_features;
    assert_eq!(x.len(), rows * k, "fp8_linear: x is not rows × in_features");
    let xq: Vec<f32> = x
        .iter()
        .map(|&v| fp8_quantize_value(v, w.input_scale))
        .collect();
    let scale = w.input_scale * w.weight_scale;
    let mut y = matmul_rows(&xq, rows, k, w.out_features, |n, buf| {
        fmt::fp8_dequant_row(&w.weight[n * k..(n + 1) * k], 1.0, buf)
    });
    y.iter_mut().for_each(|v| *v *= scale);
    y
}

/// `e4m3(clamp(v / scale, ±448))` as its f32 value (the quantized activation, unscaled).
pub fn fp8_quantize_value(v: f32, scale: f32) -> f32 {
    fmt::e4m3_to_f32(fmt::f32_to_e4m3(
        (v / scale).clamp(-fmt::E4M3_MAX, fmt::E4M3_MAX),
    ))
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// Causal depthwise conv + bias + SiLU. Shapes as in [`crate::NemotronOps::causal_conv1d`].
#[allow(clippy::too_many_arguments)]
pub fn causal_conv1d(
    x: &[f32],
    batch: usize,
    t_max: usize,
    ch: usize,
    weight: &[f32],
    k: usize,
    bias: Option<&[f32]>,
    state: &[f32],
    lens: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(lens.len(), batch);
    let km1 = k - 1;
    let mut y = vec![0f32; batch * t_max * ch];
    let mut new_state = vec![0f32; batch * ch * km1];
    for b in 0..batch {
        let len = lens[b];
        assert!(len <= t_max, "sequence length {len} exceeds T {t_max}");
        // The input at "time" j, where j < 0 reaches into the cached tail.
        let input = |j: isize, c: usize| -> f32 {
            if j >= 0 {
                x[(b * t_max + j as usize) * ch + c]
            } else {
                let s = (km1 as isize + j) as usize; // state column: oldest first
                state[(b * ch + c) * km1 + s]
            }
        };
        for t in 0..len {
            for c in 0..ch {
                let mut acc = bias.map_or(0.0, |bb| bb[c]);
                for kk in 0..k {
                    let j = t as isize - (km1 - kk) as isize;
                    acc += weight[c * k + kk] * input(j, c);
                }
                y[(b * t_max + t) * ch + c] = silu(acc);
            }
        }
        for c in 0..ch {
            for s in 0..km1 {
                let j = len as isize - km1 as isize + s as isize;
                new_state[(b * ch + c) * km1 + s] = input(j, c);
            }
        }
    }
    (y, new_state)
}

/// The selective scan, token by token. Shapes as in [`crate::NemotronOps::selective_scan`].
#[allow(clippy::too_many_arguments)]
pub fn selective_scan(
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    bm: &[f32],
    cm: &[f32],
    d: &[f32],
    state: &[f32],
    batch: usize,
    t_max: usize,
    dims: ScanDims,
    lens: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let ScanDims {
        heads: h,
        head_dim: p,
        groups: g,
        state: n,
    } = dims;
    let per_group = h / g;
    let mut s = state.to_vec();
    let mut y = vec![0f32; batch * t_max * h * p];
    for b in 0..batch {
        for t in 0..lens[b] {
            for hh in 0..h {
                let gg = hh / per_group;
                let dtv = dt[(b * t_max + t) * h + hh];
                let decay = (dtv * a[hh]).exp();
                let bvec = &bm[((b * t_max + t) * g + gg) * n..][..n];
                let cvec = &cm[((b * t_max + t) * g + gg) * n..][..n];
                for pp in 0..p {
                    let xv = x[((b * t_max + t) * h + hh) * p + pp];
                    let srow = &mut s[((b * h + hh) * p + pp) * n..][..n];
                    let mut acc = 0f32;
                    for nn in 0..n {
                        srow[nn] = decay * srow[nn] + dtv * xv * bvec[nn];
                        acc += srow[nn] * cvec[nn];
                    }
                    y[((b * t_max + t) * h + hh) * p + pp] = acc + d[hh] * xv;
                }
            }
        }
    }
    (y, s)
}

/// `epi` applied to every element.
pub fn epilogue(mut y: Vec<f32>, epi: Epilogue) -> Vec<f32> {
    if epi != Epilogue::None {
        y.iter_mut().for_each(|v| *v = epi.apply(*v));
    }
    y
}

/// Group RMSNorm, optionally gated, over `rows × h` (see [`crate::NemotronOps::rms_norm`]).
pub fn rms_norm(
    x: &[f32],
    gate: Option<&[f32]>,
    weight: &[f32],
    h: usize,
    groups: usize,
    eps: f64,
) -> Vec<f32> {
    let per = h / groups;
    let mut y = vec![0f32; x.len()];
    for (r, row) in x.chunks(h).enumerate() {
        for g in 0..groups {
            let cols = g * per..(g + 1) * per;
            let u: Vec<f32> = cols
                .clone()
                .map(|c| match gate {
                    Some(z) => row[c] * silu(z[r * h + c]),
                    None => row[c],
                })
                .collect();
            let mean = u.iter().map(|v| v * v).sum::<f32>() / per as f32;
            let inv = 1.0 / (mean + eps as f32).sqrt();
            for (i, c) in cols.enumerate() {
                y[r * h + c] = u[i] * inv * weight[c];
            }
        }
    }
    y
}

/// Index of the largest value (the lowest index on ties), among `allowed`.
fn best(v: &[f32], allowed: impl Fn(usize) -> bool) -> usize {
    let mut b = usize::MAX;
    for (i, &x) in v.iter().enumerate() {
        if allowed(i) && (b == usize::MAX || x > v[b]) {
            b = i;
        }
    }
    b
}

/// MoE routing over `logits` `[n, e]` (see [`crate::NemotronOps::moe_route`]): `(indices, weights)`
/// `[n, top_k]` each, experts in order of decreasing biased score, ties to the lower index.
pub fn moe_route(logits: &[f32], bias: &[f32], c: &RouteConfig) -> (Vec<i32>, Vec<f32>) {
    let e = bias.len();
    let per = e / c.n_group;
    let mut idx = Vec::with_capacity(logits.len() / e * c.top_k);
    let mut wts = Vec::with_capacity(idx.capacity());
    for row in logits.chunks(e) {
        let scores: Vec<f32> = row.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
        let mut choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
        if c.n_group > 1 {
            // A group scores the sum of its two best biased scores (its only one, if it has one).
            let group_score: Vec<f32> = choice
                .chunks(per)
                .map(|g| {
                    let first = best(g, |_| true);
                    let second = best(g, |i| i != first);
                    g[first] + if second == usize::MAX { 0.0 } else { g[second] }
                })
                .collect();
            let mut keep = vec![false; c.n_group];
            for _ in 0..c.topk_group {
                let g = best(&group_score, |g| !keep[g]);
                keep[g] = true;
            }
            for (i, v) in choice.iter_mut().enumerate() {
                if !keep[i / per] {
                    *v = MASKED_SCORE;
                }
            }
        }
        let mut chosen: Vec<usize> = Vec::with_capacity(c.top_k);
        for _ in 0..c.top_k {
            let b = best(&choice, |i| !chosen.contains(&i));
            chosen.push(b);
        }
        let mut w: Vec<f32> = chosen
            .iter()
            .map(|&i| {
                if c.weights_from_biased {
                    choice[i]
                } else {
                    scores[i]
                }
            })
            .collect();
        if c.norm_topk_prob {
            let sum: f32 = w.iter().sum();
            w.iter_mut().for_each(|v| *v /= sum + 1e-20);
        }
        idx.extend(chosen.iter().map(|&i| i as i32));
        wts.extend(w.iter().map(|v| v * c.routed_scaling_factor));
        idx.extend((0..c.fixed).map(|j| (e + j) as i32));
        wts.extend(std::iter::repeat_n(1.0, c.fixed));
    }
    (idx, wts)
}

/// `softplus(dt + bias[h])` as `max(x, 0) + log1p(exp(−|x|))`, then `max(·, min)` where given,
/// over `[.., h]`.
pub fn dt_softplus(dt: &[f32], bias: &[f32], min: Option<f32>) -> Vec<f32> {
    let h = bias.len();
    dt.iter()
        .enumerate()
        .map(|(i, &v)| {
            let x = v + bias[i % h];
            let y = x.max(0.0) + (-x.abs()).exp().ln_1p();
            min.map_or(y, |m| y.max(m))
        })
        .collect()
}

/// One decode token per row through the conv with its state held in a slot pool
/// (see [`crate::NemotronOps::conv_step`]): `x` `[B, C]`, `pool` `[S, C, K]` a ring updated in
/// place (the input of time `t` at `t mod K`; `lens[slot]` tokens precede this one),
/// `slots[b]` the row's slot (negative: a pad row, output zeros, pool untouched).
pub fn conv_step(
    x: &[f32],
    weight: &[f32],
    k: usize,
    bias: Option<&[f32]>,
    pool: &mut [f32],
    lens: &[i64],
    slots: &[i64],
) -> Vec<f32> {
    let c = weight.len() / k;
    let km1 = k - 1;
    let mut y = vec![0f32; x.len()];
    for (b, &s) in slots.iter().enumerate() {
        if s < 0 {
            continue;
        }
        let s = s as usize;
        let len = lens[s] as usize;
        for ch in 0..c {
            let ring = &mut pool[(s * c + ch) * k..][..k];
            let mut acc = bias.map_or(0.0, |bb| bb[ch]);
            // Time `len − (K−1) + kk` sits at `(len + 1 + kk) mod K`.
            for kk in 0..km1 {
                acc += weight[ch * k + kk] * ring[(len + 1 + kk) % k];
            }
            acc += weight[ch * k + km1] * x[b * c + ch];
            y[b * c + ch] = silu(acc);
            ring[len % k] = x[b * c + ch];
        }
    }
    y
}

/// One decode token per row through the selective scan with its state in a slot pool (see
/// [`crate::NemotronOps::ssm_step`]): `x` `[B, H, P]`, `dt` `[B, H]`, `bm`/`cm` `[B, G, N]`,
/// `pool` `[S, H, P, N]` updated in place; negative slots are pad rows.
#[allow(clippy::too_many_arguments)]
pub fn ssm_step(
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    bm: &[f32],
    cm: &[f32],
    d: &[f32],
    pool: &mut [f32],
    slots: &[i64],
    dims: ScanDims,
) -> Vec<f32> {
    let ScanDims {
        heads: h,
        head_dim: p,
        groups: g,
        state: n,
    } = dims;
    let per_group = h / g;
    let mut y = vec![0f32; x.len()];
    for (b, &s) in slots.iter().enumerate() {
        if s < 0 {
            continue;
        }
        let s = s as usize;
        for hh in 0..h {
            let gg = hh / per_group;
            let dtv = dt[b * h + hh];
            let decay = (dtv * a[hh]).exp();
            let bvec = &bm[(b * g + gg) * n..][..n];
            let cvec = &cm[(b * g + gg) * n..][..n];
            for pp in 0..p {
                let xv = x[(b * h + hh) * p + pp];
                let row = &mut pool[((s * h + hh) * p + pp) * n..][..n];
                let mut acc = 0f32;
                for nn in 0..n {
                    row[nn] = decay * row[nn] + dtv * xv * bvec[nn];
                    acc += row[nn] * cvec[nn];
                }
                y[(b * h + hh) * p + pp] = acc + d[hh] * xv;
            }
        }
    }
    y
}

/// One decode token per row through GQA attention over a slot's KV cache (see
/// [`crate::NemotronOps::attention_step`]): appends `k`, `v` (`[B, KVH, D]`) at position
/// `lens[slot]` of `kpool`/`vpool` (`[S, KVH, cap, D]`, in place), then attends `q` (`[B, NH, D]`)
/// over the `lens[slot] + 1` keys with softmax in f32. `lens` is not advanced. Pad rows (negative
/// slots) give zeros.
#[allow(clippy::too_many_arguments)]
pub fn attention_step(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    kpool: &mut [f32],
    vpool: &mut [f32],
    lens: &[i64],
    slots: &[i64],
    (nh, kvh, hd, cap): (usize, usize, usize, usize),
    scale: f32,
) -> Vec<f32> {
    let mut o = vec![0f32; q.len()];
    let rep = nh / kvh;
    for (b, &s) in slots.iter().enumerate() {
        if s < 0 {
            continue;
        }
        let s = s as usize;
        let len = lens[s] as usize;
        assert!(len < cap, "slot {s} is full ({len} of {cap} positions)");
        for g in 0..kvh {
            let at = ((s * kvh + g) * cap + len) * hd;
            kpool[at..at + hd].copy_from_slice(&k[(b * kvh + g) * hd..][..hd]);
            vpool[at..at + hd].copy_from_slice(&v[(b * kvh + g) * hd..][..hd]);
        }
        for qh in 0..nh {
            let g = qh / rep;
            let qv = &q[(b * nh + qh) * hd..][..hd];
            let scores: Vec<f32> = (0..=len)
                .map(|t| {
                    let kt = &kpool[((s * kvh + g) * cap + t) * hd..][..hd];
                    qv.iter().zip(kt).map(|(a, b)| a * b).sum::<f32>() * scale
                })
                .collect();
            let m = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let e: Vec<f32> = scores.iter().map(|&x| (x - m).exp()).collect();
            let z: f32 = e.iter().sum();
            let out = &mut o[(b * nh + qh) * hd..][..hd];
            for (t, w) in e.iter().enumerate() {
                let vt = &vpool[((s * kvh + g) * cap + t) * hd..][..hd];
                for (od, vd) in out.iter_mut().zip(vt) {
                    *od += w / z * vd;
                }
            }
        }
    }
    o
}

/// The values of a bf16 SSM pool's bytes (little-endian bf16, element `2w` in the low half of
/// word `w`): each exactly as f32.
pub fn bf16_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
        .collect()
}

/// The bytes of `v` stored as a bf16 SSM pool: each value rounded to the nearest bf16, ties to
/// even (`half`'s conversion, as torch's `.to(torch.bfloat16)`).
pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes())
        .collect()
}

/// The E4M3 code an FP8 KV cache stores for `x` under `scale`: `e4m3(x / scale)`, round to
/// nearest even, saturating at ±448 (the format crate's encoder, checked against torch's cast).
pub fn kv8_code(x: f32, scale: f32) -> u8 {
    fmt::f32_to_e4m3(x / scale)
}

/// The value an FP8 KV cache reads back for `code` under `scale`.
pub fn kv8_value(code: u8, scale: f32) -> f32 {
    fmt::e4m3_to_f32(code) * scale
}

/// [`attention_step`] over an FP8 KV cache (see [`crate::NemotronOps::attention_step_qkv8`]):
/// `kcodes`/`vcodes` the pools' E4M3 codes in element order (`[S, KVH, cap, D]`); the step's
/// `k`, `v` are stored as codes and attended as stored, like every earlier position.
#[allow(clippy::too_many_arguments)]
pub fn attention_step_kv8(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    kcodes: &mut [u8],
    vcodes: &mut [u8],
    lens: &[i64],
    slots: &[i64],
    dims: (usize, usize, usize, usize),
    scale: f32,
    (ks, vs): (f32, f32),
) -> Vec<f32> {
    let (_, kvh, hd, cap) = dims;
    let (kq, vq): (Vec<u8>, Vec<u8>) = (
        k.iter().map(|&x| kv8_code(x, ks)).collect(),
        v.iter().map(|&x| kv8_code(x, vs)).collect(),
    );
    let values = |c: &[u8], sc: f32| -> Vec<f32> { c.iter().map(|&c| kv8_value(c, sc)).collect() };
    let (mut kp, mut vp) = (values(kcodes, ks), values(vcodes, vs));
    let o = attention_step(
        q,
        &values(&kq, ks),
        &values(&vq, vs),
        &mut kp,
        &mut vp,
        lens,
        slots,
        dims,
        scale,
    );
    for (b, &s) in slots.iter().enumerate() {
        if s < 0 {
            continue;
        }
        let (s, len) = (s as usize, lens[s as usize] as usize);
        for g in 0..kvh {
            let at = ((s * kvh + g) * cap + len) * hd;
            kcodes[at..at + hd].copy_from_slice(&kq[(b * kvh + g) * hd..][..hd]);
            vcodes[at..at + hd].copy_from_slice(&vq[(b * kvh + g) * hd..][..hd]);
        }
    }
    o
}

/// Causal GQA prefill attention over a key pool (see [`crate::NemotronOps::attention_prefill`]):
/// `q` `[B, T, W]` (head `h` at columns `h·D ..`), pools `[S, KVH, cap, D]`, `seqs` `[B, 3]`
/// (slot, keys before the chunk, chunk length). Two passes per row (the maximum, then the
/// normalized sum), no tiling. Rows past a chunk's length are zeros.
pub fn attention_prefill(
    q: &[f32],
    (b, t, w): (usize, usize, usize),
    kpool: &[f32],
    vpool: &[f32],
    seqs: &[i64],
    (nh, kvh, hd, cap): (usize, usize, usize, usize),
    scale: f32,
) -> Vec<f32> {
    let mut o = vec![0f32; b * t * nh * hd];
    let rep = nh / kvh;
    for bi in 0..b {
        let (slot, past, len) = (
            seqs[bi * 3] as usize,
            seqs[bi * 3 + 1] as usize,
            seqs[bi * 3 + 2] as usize,
        );
        assert!(
            len <= t && past + len <= cap,
            "sequence {bi}: {past} + {len} keys, T {t}, cap {cap}"
        );
        for i in 0..len {
            for h in 0..nh {
                let g = h / rep;
                let qv = &q[(bi * t + i) * w + h * hd..][..hd];
                let key = |j: usize| ((slot * kvh + g) * cap + j) * hd;
                let scores: Vec<f32> = (0..=past + i)
                    .map(|j| {
                        let kj = &kpool[key(j)..][..hd];
                        qv.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale
                    })
                    .collect();
                let m = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let e: Vec<f32> = scores.iter().map(|&x| (x - m).exp()).collect();
                let z: f32 = e.iter().sum();
                let out = &mut o[((bi * t + i) * nh + h) * hd..][..hd];
                for (j, p) in e.iter().enumerate() {
                    let vj = &vpool[key(j)..][..hd];
                    for (od, vd) in out.iter_mut().zip(vj) {
                        *od += p / z * vd;
                    }
                }
            }
        }
    }
    o
}

/// Each `cols`-wide row's arg-max, the lowest index on ties (NaN never wins: a row of NaN gives 0).
pub fn argmax_rows(x: &[f32], cols: usize) -> Vec<i32> {
    x.chunks(cols)
        .map(|row| {
            let mut b = 0usize;
            for (i, &v) in row.iter().enumerate() {
                if v > row[b] || (row[b].is_nan() && !v.is_nan()) {
                    b = i;
                }
            }
            b as i32
        })
        .collect()
}

/// Per row of `x` (`cols` wide): `[log-sum-exp, x[tokens[r]]]` (−∞ outside the row; the sum in
/// f64), and the `n` largest values with their ids by decreasing value, the lower id on ties
/// (−0 ties with 0), NaN never ranking (`-1` / 0 past the ranked entries), `max(n, 1)` per row.
#[allow(clippy::type_complexity)]
pub fn logprob_rows(
    x: &[f32],
    cols: usize,
    tokens: &[i64],
    n: usize,
) -> (Vec<f32>, Vec<i32>, Vec<f32>) {
    let w = n.max(1);
    let (mut stats, mut ids, mut vals) = (vec![], vec![], vec![]);
    for (r, row) in x.chunks(cols).enumerate() {
        let m = row
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row
            .iter()
            .filter(|v| !v.is_nan())
            .map(|&v| ((v - m) as f64).exp())
            .sum();
        stats.push((m as f64 + sum.ln()) as f32);
        let t = tokens.get(r).copied().unwrap_or(-1);
        stats.push(if t >= 0 && (t as usize) < cols {
            row[t as usize]
        } else {
            f32::NEG_INFINITY
        });
        // By value as floats compare (−0 equals 0: the lower id first), NaN left out.
        let mut order: Vec<usize> = (0..cols).filter(|&i| !row[i].is_nan()).collect();
        order.sort_by(|&a, &b| {
            row[b]
                .partial_cmp(&row[a])
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.cmp(&b))
        });
        for j in 0..w {
            match order.get(j).filter(|_| j < n) {
                Some(&i) => {
                    ids.push(i as i32);
                    vals.push(row[i]);
                }
                None => {
                    ids.push(-1);
                    vals.push(0.0);
                }
            }
        }
    }
    (stats, ids, vals)
}

/// `Σ_j w[t, j] · y[t·k + j, :]` (`+ shared[t, :]`) over `N` tokens of width `h`.
pub fn moe_combine(y: &[f32], w: &[f32], shared: Option<&[f32]>, k: usize, h: usize) -> Vec<f32> {
    let n = w.len() / k.max(1);
    let mut out = vec![0f32; n * h];
    for t in 0..n {
        for c in 0..h {
            let mut acc = 0f32;
            for j in 0..k {
                acc += w[t * k + j] * y[(t * k + j) * h + c];
            }
            out[t * h + c] = acc + shared.map_or(0.0, |s| s[t * h + c]);
        }
    }
    out
}
