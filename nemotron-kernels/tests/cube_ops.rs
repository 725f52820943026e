//! Per-op parity of the CubeCL kernels against the plain-Rust NdArray reference, on fresh random
//! inputs: NVFP4 and FP8 linears (decode- and prefill-shaped), the causal conv and the selective
//! scan (ragged batches, carried state).
//!
//! wgpu (f32): runs in CI on Mesa lavapipe; without a Vulkan adapter the tests fail and say so
//! (install `mesa-vulkan-drivers`). CUDA (f32 in `cuda::`, bf16 in `cuda::bf16::`): `#[ignore]`d —
//! counted as ignored wherever there is no GPU — and run on the device machine with `--ignored`,
//! the two dtypes in separate processes (Burn fixes a device's default float dtype per process).
//!
//! Bands (f32): the kernels sum in another order than the reference (strided partial sums, tree
//! reduction), so results differ by f32 rounding: relative 1e-5 of the output scale for the
//! linears and the conv, 1e-4 for the scan (its state compounds over time); the FP8 activation
//! codes are the same on both sides, so W8A8 gets the same band. bf16: see [`BF16`].
#![cfg(feature = "cube")]

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData};
use nemotron_formats as fmt;
use nemotron_kernels::{Fp8Matrix, NemotronBackend, Nvfp4Matrix};

/// A deterministic generator; with `bf16` set, every value is rounded to bf16 so that the device
/// arm's bf16 inputs and the f32 reference's inputs are the same numbers.
struct Rng(u64, bool);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        let round = self.1;
        (0..n)
            .map(|_| {
                let v = self.next() * scale;
                bf(v, round)
            })
            .collect()
    }
}

fn t<B: NemotronBackend, const D: usize>(
    v: &[f32],
    shape: [usize; D],
    dev: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v.to_vec(), shape), dev)
}

fn host<B: NemotronBackend, const D: usize>(x: Tensor<B, D>) -> Vec<f32> {
    x.into_data().convert::<f32>().into_vec().unwrap()
}

fn close(name: &str, got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let d = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!(
        "{name}: max |Δ| {d:.3e} at scale {scale:.3e} (band {:.1e})",
        rel * scale
    );
    if d > rel * scale {
        let bad: Vec<(usize, f32, f32)> = got
            .iter()
            .zip(want)
            .enumerate()
            .filter(|(_, (a, b))| (*a - *b).abs() > rel * scale)
            .map(|(i, (a, b))| (i, *a, *b))
            .collect();
        eprintln!(
            "  {} of {} differ; first: {:?}",
            bad.len(),
            got.len(),
            &bad[..bad.len().min(12)]
        );
    }
    assert!(d <= rel * scale, "{name}: max |Δ| {d} > {rel} × {scale}");
}

type Ref = NdArray<f32>;

fn bf(v: f32, round: bool) -> f32 {
    if round {
        burn::tensor::bf16::from_f32(v).to_f32()
    } else {
        v
    }
}

/// Relative bands of one arm: `lin` for the linears and the conv, `scan` for the scan.
#[derive(Clone, Copy)]
pub struct Band {
    lin: f32,
    scan: f32,
    bf16: bool,
}
/// f32: summation order only.
pub const F32: Band = Band {
    lin: 1e-5,
    scan: 1e-4,
    bf16: false,
};
/// bf16 activations (inputs pre-rounded, kernels accumulate in f32): the outputs are rounded to
/// bf16 once, a relative error ≤ 2^-9 of each value, so 2^-8 of the output scale bounds it with
/// room for the f32 order; an f32→bf16 accumulator over K ≥ 64 terms lands well outside.
pub const BF16: Band = Band {
    lin: 3.9e-3,
    scan: 3.9e-3,
    bf16: true,
};

fn nvfp4_case(rng: &mut Rng, n: usize, k: usize) -> Nvfp4Matrix {
    let w = rng.vec(n * k, 0.05);
    let e = fmt::nvfp4_encode(&w, n, k);
    Nvfp4Matrix {
        out_features: n,
        in_features: k,
        packed: e.packed,
        block_scales: e.block_scales,
        global_scale: e.weight_scale_2,
    }
}

pub fn nvfp4_linear_matches<B: NemotronBackend>(dev: &B::Device, band: Band) {
    let mut rng = Rng(1, band.bf16);
    for (m, n, k) in [(1, 96, 64), (1, 40, 2688), (7, 33, 128), (33, 20, 48)] {
        let w = nvfp4_case(&mut rng, n, k);
        let x = rng.vec(m * k, 1.0);
        let want = host(Ref::nvfp4_linear(
            t::<Ref, 2>(&x, [m, k], &Default::default()),
            &Ref::nvfp4_weight(w.clone(), &Default::default()),
        ));
        let got = host(B::nvfp4_linear(
            t::<B, 2>(&x, [m, k], dev),
            &B::nvfp4_weight(w.clone(), dev),
        ));
        close(&format!("nvfp4 {m}×{k}→{n}"), &got, &want, band.lin);
        let wr = Ref::nvfp4_weight(w.clone(), &Default::default());
        let want2 = host(Ref::nvfp4_linear_relu2(
            t::<Ref, 2>(&x, [m, k], &Default::default()),
            &wr,
        ));
        let got2 = host(B::nvfp4_linear_relu2(
            t::<B, 2>(&x, [m, k], dev),
            &B::nvfp4_weight(w, dev),
        ));
        // relu² doubles the relative error and squares the scale.
        close(
            &format!("nvfp4 relu² {m}×{k}→{n}"),
            &got2,
            &want2,
            2.0 * band.lin,
        );
    }
}

/// Expert indices for `slots` routing slots of `k` per token (distinct within a token, as top-k
/// gives them), over `e` experts.
fn routing(rng: &mut Rng, tokens: usize, k: usize, e: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(tokens * k);
    for _ in 0..tokens {
        let mut chosen: Vec<i64> = Vec::new();
        while chosen.len() < k {
            let c = (((rng.next() + 1.0) * 0.5 * e as f32) as i64).min(e as i64 - 1);
            if !chosen.contains(&c) {
                chosen.push(c);
            }
        }
        out.extend(chosen);
    }
    out
}

fn int<B: NemotronBackend>(v: &[i64], dev: &B::Device) -> Tensor<B, 1, burn::tensor::Int> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), dev)
}

/// Routed-expert linears (NVFP4 and FP8): up-shaped (`div = k`, slots share a token's row) and
/// down-shaped (`div = 1`), decode (1 token) and prefill (9 tokens) shaped.
pub fn expert_linears_match<B: NemotronBackend>(dev: &B::Device, band: Band) {
    let mut rng = Rng(6, band.bf16);
    let (e, k_top) = (5, 2);
    for (tokens, n, k, div) in [(1, 24, 64, 2), (9, 16, 48, 2), (9, 20, 32, 1)] {
        let slots = tokens * k_top;
        let idx = routing(&mut rng, tokens, k_top, e);
        let rows = slots / div;
        let x = rng.vec(rows * k, 1.0);
        let nv: Vec<Nvfp4Matrix> = (0..e).map(|_| nvfp4_case(&mut rng, n, k)).collect();
        let want = host(Ref::nvfp4_expert_linear(
            t::<Ref, 2>(&x, [rows, k], &Default::default()),
            int::<Ref>(&idx, &Default::default()),
            div,
            &Ref::nvfp4_experts(nv.clone(), &Default::default()),
        ));
        // Independent of the stacking: each slot against the single-matrix reference.
        for (s, &ex) in idx.iter().enumerate() {
            let row = &x[(s / div) * k..(s / div + 1) * k];
            let one = nemotron_kernels::reference::nvfp4_linear(row, 1, &nv[ex as usize]);
            assert_eq!(&want[s * n..(s + 1) * n], &one[..], "reference slot {s}");
        }
        let got = host(B::nvfp4_expert_linear(
            t::<B, 2>(&x, [rows, k], dev),
            int::<B>(&idx, dev),
            div,
            &B::nvfp4_experts(nv.clone(), dev),
        ));
        close(
            &format!("nvfp4 experts {slots} slots {k}→{n} div {div}"),
            &got,
            &want,
            band.lin,
        );
        let want2 = host(Ref::nvfp4_expert_linear_relu2(
            t::<Ref, 2>(&x, [rows, k], &Default::default()),
            int::<Ref>(&idx, &Default::default()),
            div,
            &Ref::nvfp4_experts(nv.clone(), &Default::default()),
        ));
        let got2 = host(B::nvfp4_expert_linear_relu2(
            t::<B, 2>(&x, [rows, k], dev),
            int::<B>(&idx, dev),
            div,
            &B::nvfp4_experts(nv.clone(), dev),
        ));
        close(
            &format!("nvfp4 experts relu² {slots} slots {k}→{n} div {div}"),
            &got2,
            &want2,
            2.0 * band.lin,
        );
        let f8: Vec<Fp8Matrix> = (0..e)
            .map(|i| {
                let (q, ws) = fmt::fp8_encode(&rng.vec(n * k, 0.05));
                Fp8Matrix {
                    out_features: n,
                    in_features: k,
                    weight: q,
                    weight_scale: ws,
                    input_scale: (2.0 + i as f32) / 448.0,
                }
            })
            .collect();
        let want = host(Ref::fp8_expert_linear(
            t::<Ref, 2>(&x, [rows, k], &Default::default()),
            int::<Ref>(&idx, &Default::default()),
            div,
            &Ref::fp8_experts(f8.clone(), &Default::default()),
        ));
        let got = host(B::fp8_expert_linear(
            t::<B, 2>(&x, [rows, k], dev),
            int::<B>(&idx, dev),
            div,
            &B::fp8_experts(f8.clone(), dev),
        ));
        close(
            &format!("fp8 experts {slots} slots {k}→{n} div {div}"),
            &got,
            &want,
            band.lin,
        );
        let want2 = host(Ref::fp8_expert_linear_relu2(
            t::<Ref, 2>(&x, [rows, k], &Default::default()),
            int::<Ref>(&idx, &Default::default()),
            div,
            &Ref::fp8_experts(f8.clone(), &Default::default()),
        ));
        let got2 = host(B::fp8_expert_linear_relu2(
            t::<B, 2>(&x, [rows, k], dev),
            int::<B>(&idx, dev),
            div,
            &B::fp8_experts(f8.clone(), dev),
        ));
        close(
            &format!("fp8 experts relu² {slots} slots {k}→{n} div {div}"),
            &got2,
            &want2,
            2.0 * band.lin,
        );
    }
}

/// The fused RMSNorm against the composed Burn ops (plain and gated, one and several groups,
/// widths above and below the cube's 256 units).
pub fn rms_norm_matches<B: NemotronBackend>(dev: &B::Device, band: Band) {
    let mut rng = Rng(7, band.bf16);
    for (r, h, groups, gated) in [
        (3, 64, 1, false),
        (2, 600, 1, false),
        (5, 96, 4, true),
        (1, 1024, 8, true),
    ] {
        let x = rng.vec(r * h, 2.0);
        let z = rng.vec(r * h, 3.0);
        let w = rng.vec(h, 1.0);
        let d = Default::default();
        let want = host(Ref::rms_norm(
            t::<Ref, 2>(&x, [r, h], &d),
            gated.then(|| t::<Ref, 2>(&z, [r, h], &d)),
            t::<Ref, 1>(&w, [h], &d),
            groups,
            1e-5,
        ));
        let got = host(B::rms_norm(
            t::<B, 2>(&x, [r, h], dev),
            gated.then(|| t::<B, 2>(&z, [r, h], dev)),
            t::<B, 1>(&w, [h], dev),
            groups,
            1e-5,
        ));
        close(
            &format!("rms_norm {r}×{h} groups {groups} gated {gated}"),
            &got,
            &want,
            band.lin,
        );
    }
}

/// The routing kernel against the composed Burn ops: same experts in the same order, same weights
/// (plain and grouped, renormalized or not, the biased-weights deviation).
pub fn moe_route_matches<B: NemotronBackend>(dev: &B::Device, band: Band) {
    use nemotron_kernels::RouteConfig;
    let mut rng = Rng(8, false);
    for (n, e, top_k, n_group, topk_group, renorm, biased) in [
        (1, 128, 6, 1, 1, true, false),
        (7, 16, 4, 4, 2, true, false),
        (5, 32, 8, 8, 3, false, false),
        (3, 16, 2, 2, 1, true, true),
    ] {
        let logits = rng.vec(n * e, 4.0);
        let bias = rng.vec(e, 0.5);
        let c = RouteConfig {
            top_k,
            n_group,
            topk_group,
            norm_topk_prob: renorm,
            routed_scaling_factor: 2.5,
            weights_from_biased: biased,
        };
        let d = Default::default();
        let lf = |v: &[f32]| burn::tensor::TensorData::new(v.to_vec(), [n, e]);
        let (ri, rw) = Ref::moe_route(
            Tensor::from_data(lf(&logits), &d),
            t::<Ref, 1>(&bias, [e], &d),
            &c,
        );
        let (gi, gw) = B::moe_route(
            Tensor::from_data(lf(&logits), (dev, burn::tensor::DType::F32)),
            Tensor::from_data(
                burn::tensor::TensorData::new(bias.clone(), [e]),
                (dev, burn::tensor::DType::F32),
            ),
            &c,
        );

        assert_eq!(
            gi.into_data().convert::<i64>().into_vec::<i64>().unwrap(),
            ri.into_data().convert::<i64>().into_vec::<i64>().unwrap(),
            "route {n}×{e} top-{top_k} groups {n_group}: experts"
        );
        close(
            &format!("route {n}×{e} top-{top_k} groups {n_group}/{topk_group} weights"),
            &host(gw),
            &host(rw),
            band.lin.min(1e-5),
        );
    }
}

/// The fused `softplus(dt + bias)` (with and without the clamp) against the composed ops.
pub fn dt_softplus_matches<B: NemotronBackend>(dev: &B::Device, band: Band) {
    let mut rng = Rng(9, band.bf16);
    let (b, tt, h) = (2, 5, 12);
    // Raw dt over a range that exercises both softplus branches, large and tiny values.
    let dt = rng.vec(b * tt * h, 25.0);
    let bias = rng.vec(h, 4.0);
    for min in [None, Some(1e-3f32)] {
        let d = Default::default();
        let want = host(Ref::dt_softplus(
            t::<Ref, 3>(&dt, [b, tt, h], &d),
            t::<Ref, 1>(&bias, [h], &d),
            min,
        ));
        let got = host(B::dt_softplus(
            t::<B, 3>(&dt, [b, tt, h], dev),
            t::<B, 1>(&bias, [h], dev),
            min,
        ));
        close(&format!("dt softplus min {min:?}"), &got, &want, band.lin);
    }
}

pub fn matmul_matches<B: NemotronBackend>(dev: &B::Device, band: Band) {
    let mut rng = Rng(5, band.bf16);
    for (b, m, k, n) in [
        (1, 1, 64, 96),
        (6, 5, 16, 23),
        (1, 37, 48, 20),
        (2, 3, 7, 40),
        (1, 2, 300, 33),
    ] {
        let a = rng.vec(b * m * k, 1.0);
        let w = rng.vec(b * k * n, 1.0);
        let want = host(Ref::matmul(
            t::<Ref, 3>(&a, [b, m, k], &Default::default()),
            t::<Ref, 3>(&w, [b, k, n], &Default::default()),
        ));
        let got = host(B::matmul(
            t::<B, 3>(&a, [b, m, k], dev),
            t::<B, 3>(&w, [b, k, n], dev),
        ));
        close(&format!("matmul {b}×{m}×{k}·{n}"), &got, &want, band.lin);
    }
}

pub fn fp8_linear_matches<B: NemotronBackend>(dev: &B::Device, band: Band) {
    let mut rng = Rng(2, band.bf16);
    for (m, n, k) in [(1, 50, 64), (9, 24, 256)] {
        let wv = rng.vec(n * k, 0.05);
        let (q, ws) = fmt::fp8_encode(&wv);
        let x = rng.vec(m * k, 3.0);
        // Calibrated below the activation amax so some inputs saturate at ±448.
        let w = Fp8Matrix {
            out_features: n,
            in_features: k,
            weight: q,
            weight_scale: ws,
            input_scale: 2.5 / 448.0,
        };
        let want = host(Ref::fp8_linear(
            t::<Ref, 2>(&x, [m, k], &Default::default()),
            &Ref::fp8_weight(w.clone(), &Default::default()),
        ));
        let got = host(B::fp8_linear(
            t::<B, 2>(&x, [m, k], dev),
            &B::fp8_weight(w.clone(), dev),
        ));
        // Same activation codes ⇒ only summation order differs.
        close(&format!("fp8 {m}×{k}→{n}"), &got, &want, band.lin);
        let want2 = host(Ref::fp8_linear_relu2(
            t::<Ref, 2>(&x, [m, k], &Default::default()),
            &Ref::fp8_weight(w.clone(), &Default::default()),
        ));
        let got2 = host(B::fp8_linear_relu2(
            t::<B, 2>(&x, [m, k], dev),
            &B::fp8_weight(w.clone(), dev),
        ));
        close(
            &format!("fp8 relu² {m}×{k}→{n}"),
            &got2,
            &want2,
            2.0 * band.lin,
        );
    }
}

pub fn conv_matches<B: NemotronBackend>(dev: &B::Device, band: Band) {
    let mut rng = Rng(3, band.bf16);
    let (b, tm, c, k) = (3, 9, 20, 4);
    let lens = [9, 1, 5];
    let x = rng.vec(b * tm * c, 1.0);
    let w = rng.vec(c * k, 0.5);
    let bias = rng.vec(c, 0.5);
    let st = rng.vec(b * c * (k - 1), 1.0);
    let r = Ref::causal_conv1d(
        t::<Ref, 3>(&x, [b, tm, c], &Default::default()),
        t::<Ref, 2>(&w, [c, k], &Default::default()),
        Some(t::<Ref, 1>(&bias, [c], &Default::default())),
        t::<Ref, 3>(&st, [b, c, k - 1], &Default::default()),
        &lens,
    );
    let g = B::causal_conv1d(
        t::<B, 3>(&x, [b, tm, c], dev),
        t::<B, 2>(&w, [c, k], dev),
        Some(t::<B, 1>(&bias, [c], dev)),
        t::<B, 3>(&st, [b, c, k - 1], dev),
        &lens,
    );
    // Padding rows are unspecified: compare the valid ones.
    let (gy, ry) = (host(g.0), host(r.0));
    for (bb, &len) in lens.iter().enumerate() {
        let s = bb * tm * c;
        close(
            &format!("conv y seq {bb}"),
            &gy[s..s + len * c],
            &ry[s..s + len * c],
            band.lin,
        );
    }
    close("conv state", &host(g.1), &host(r.1), band.lin);
}

pub fn scan_matches<B: NemotronBackend>(dev: &B::Device, band: Band) {
    let mut rng = Rng(4, band.bf16);
    let (b, tm, h, p, g, n) = (2, 11, 4, 8, 2, 16);
    let lens = [11, 4];
    let x = rng.vec(b * tm * h * p, 1.0);
    let dt: Vec<f32> = rng
        .vec(b * tm * h, 1.0)
        .iter()
        .map(|v| bf(0.01 + 0.1 * v.abs(), band.bf16))
        .collect();
    let a: Vec<f32> = (0..h).map(|i| -(1.0 + i as f32)).collect();
    let bm = rng.vec(b * tm * g * n, 1.0);
    let cm = rng.vec(b * tm * g * n, 1.0);
    let d = rng.vec(h, 1.0);
    let st = rng.vec(b * h * p * n, 0.5);
    let dr = Default::default();
    let r = Ref::selective_scan(
        t::<Ref, 4>(&x, [b, tm, h, p], &dr),
        t::<Ref, 3>(&dt, [b, tm, h], &dr),
        t::<Ref, 1>(&a, [h], &dr),
        t::<Ref, 4>(&bm, [b, tm, g, n], &dr),
        t::<Ref, 4>(&cm, [b, tm, g, n], &dr),
        t::<Ref, 1>(&d, [h], &dr),
        t::<Ref, 4>(&st, [b, h, p, n], &dr),
        &lens,
    );
    let state_in = t::<B, 4>(&st, [b, h, p, n], dev);
    let gres = B::selective_scan(
        t::<B, 4>(&x, [b, tm, h, p], dev),
        t::<B, 3>(&dt, [b, tm, h], dev),
        t::<B, 1>(&a, [h], dev),
        t::<B, 4>(&bm, [b, tm, g, n], dev),
        t::<B, 4>(&cm, [b, tm, g, n], dev),
        t::<B, 1>(&d, [h], dev),
        state_in.clone(),
        &lens,
    );
    let (gy, ry) = (host(gres.0), host(r.0));
    for (bb, &len) in lens.iter().enumerate() {
        let s = bb * tm * h * p;
        close(
            &format!("scan y seq {bb}"),
            &gy[s..s + len * h * p],
            &ry[s..s + len * h * p],
            band.scan,
        );
    }
    close("scan state", &host(gres.1), &host(r.1), band.scan);
    // The input state tensor is not modified in place.
    close("scan input state untouched", &host(state_in), &st, 0.0);
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use nemotron_kernels::cube::WgpuBackend as B;
    fn dev() -> <B as burn::tensor::backend::BackendTypes>::Device {
        Default::default()
    }
    #[test]
    fn wgpu_nvfp4_linear() {
        super::nvfp4_linear_matches::<B>(&dev(), super::F32);
    }
    #[test]
    fn wgpu_expert_linears() {
        super::expert_linears_match::<B>(&dev(), super::F32);
    }
    #[test]
    fn wgpu_rms_norm() {
        super::rms_norm_matches::<B>(&dev(), super::F32);
    }
    #[test]
    fn wgpu_moe_route() {
        super::moe_route_matches::<B>(&dev(), super::F32);
    }
    #[test]
    fn wgpu_dt_softplus() {
        super::dt_softplus_matches::<B>(&dev(), super::F32);
    }
    #[test]
    fn wgpu_matmul() {
        super::matmul_matches::<B>(&dev(), super::F32);
    }
    #[test]
    fn wgpu_fp8_linear() {
        super::fp8_linear_matches::<B>(&dev(), super::F32);
    }
    #[test]
    fn wgpu_causal_conv1d() {
        super::conv_matches::<B>(&dev(), super::F32);
    }
    #[test]
    fn wgpu_selective_scan() {
        super::scan_matches::<B>(&dev(), super::F32);
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use nemotron_kernels::cube::CudaBackend;
    type B = CudaBackend<f32>;
    fn dev() -> <B as burn::tensor::backend::BackendTypes>::Device {
        Default::default()
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_nvfp4_linear() {
        super::nvfp4_linear_matches::<B>(&dev(), super::F32);
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_expert_linears() {
        super::expert_linears_match::<B>(&dev(), super::F32);
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_rms_norm() {
        super::rms_norm_matches::<B>(&dev(), super::F32);
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_moe_route() {
        super::moe_route_matches::<B>(&dev(), super::F32);
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_dt_softplus() {
        super::dt_softplus_matches::<B>(&dev(), super::F32);
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_matmul() {
        super::matmul_matches::<B>(&dev(), super::F32);
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_fp8_linear() {
        super::fp8_linear_matches::<B>(&dev(), super::F32);
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_causal_conv1d() {
        super::conv_matches::<B>(&dev(), super::F32);
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_selective_scan() {
        super::scan_matches::<B>(&dev(), super::F32);
    }

    /// bf16 activations on CUDA (lavapipe has no bf16).
    mod bf16 {
        use nemotron_kernels::cube::CudaBackend;
        type B = CudaBackend<burn::tensor::bf16>;
        fn dev() -> <B as burn::tensor::backend::BackendTypes>::Device {
            Default::default()
        }
        use super::super::{
            conv_matches, fp8_linear_matches, matmul_matches, nvfp4_linear_matches, scan_matches,
            BF16,
        };
        #[test]
        #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
        fn cuda_bf16_nvfp4_linear() {
            nvfp4_linear_matches::<B>(&dev(), BF16);
        }
        #[test]
        #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
        fn cuda_bf16_expert_linears() {
            super::super::expert_linears_match::<B>(&dev(), BF16);
        }
        #[test]
        #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
        fn cuda_bf16_rms_norm() {
            super::super::rms_norm_matches::<B>(&dev(), BF16);
        }
        #[test]
        #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
        fn cuda_bf16_dt_softplus() {
            super::super::dt_softplus_matches::<B>(&dev(), BF16);
        }
        #[test]
        #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
        fn cuda_bf16_matmul() {
            matmul_matches::<B>(&dev(), BF16);
        }
        #[test]
        #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
        fn cuda_bf16_fp8_linear() {
            fp8_linear_matches::<B>(&dev(), BF16);
        }
        #[test]
        #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
        fn cuda_bf16_causal_conv1d() {
            conv_matches::<B>(&dev(), BF16);
        }
        #[test]
        #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
        fn cuda_bf16_selective_scan() {
            scan_matches::<B>(&dev(), BF16);
        }
    }
}
