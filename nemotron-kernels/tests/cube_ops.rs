//! Per-op parity of the CubeCL kernels against the plain-Rust NdArray reference, on fresh random
//! inputs: NVFP4 and FP8 linears (decode- and prefill-shaped), the causal conv and the selective
//! scan (ragged batches, carried state).
//!
//! wgpu (f32): runs in CI on Mesa lavapipe; without a Vulkan adapter the tests fail and say so
//! (install `mesa-vulkan-drivers`). CUDA (f32): `#[ignore]`d — counted as ignored wherever there is
//! no GPU — and run on the device machine with `--ignored`.
//!
//! Bands (f32): the kernels sum in another order than the reference (strided partial sums, tree
//! reduction), so results differ by f32 rounding: relative 1e-5 of the output scale for the
//! linears and the conv, 1e-4 for the scan (its state compounds over time). W8A8 is compared
//! per element, allowing an activation-rounding flip to move an output by at most one E4M3 step.
#![cfg(feature = "cube")]

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData};
use nemotron_formats as fmt;
use nemotron_kernels::{Fp8Matrix, NemotronBackend, Nvfp4Matrix};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
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

pub fn nvfp4_linear_matches<B: NemotronBackend>(dev: &B::Device) {
    let mut rng = Rng(1);
    for (m, n, k) in [(1, 96, 64), (1, 40, 2688), (7, 33, 128), (33, 20, 48)] {
        let w = nvfp4_case(&mut rng, n, k);
        let x = rng.vec(m * k, 1.0);
        let want = host(Ref::nvfp4_linear(
            t::<Ref, 2>(&x, [m, k], &Default::default()),
            &Ref::nvfp4_weight(w.clone(), &Default::default()),
        ));
        let got = host(B::nvfp4_linear(
            t::<B, 2>(&x, [m, k], dev),
            &B::nvfp4_weight(w, dev),
        ));
        close(&format!("nvfp4 {m}×{k}→{n}"), &got, &want, 1e-5);
    }
}

pub fn matmul_matches<B: NemotronBackend>(dev: &B::Device) {
    let mut rng = Rng(5);
    for (b, m, k, n) in [(1, 1, 64, 96), (6, 5, 16, 23), (1, 37, 48, 20)] {
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
        close(&format!("matmul {b}×{m}×{k}·{n}"), &got, &want, 1e-5);
    }
}

pub fn fp8_linear_matches<B: NemotronBackend>(dev: &B::Device) {
    let mut rng = Rng(2);
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
        close(&format!("fp8 {m}×{k}→{n}"), &got, &want, 1e-5);
    }
}

pub fn conv_matches<B: NemotronBackend>(dev: &B::Device) {
    let mut rng = Rng(3);
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
            1e-5,
        );
    }
    close("conv state", &host(g.1), &host(r.1), 1e-6);
}

pub fn scan_matches<B: NemotronBackend>(dev: &B::Device) {
    let mut rng = Rng(4);
    let (b, tm, h, p, g, n) = (2, 11, 4, 8, 2, 16);
    let lens = [11, 4];
    let x = rng.vec(b * tm * h * p, 1.0);
    let dt: Vec<f32> = rng
        .vec(b * tm * h, 1.0)
        .iter()
        .map(|v| 0.01 + 0.1 * v.abs())
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
            1e-4,
        );
    }
    close("scan state", &host(gres.1), &host(r.1), 1e-4);
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
        super::nvfp4_linear_matches::<B>(&dev());
    }
    #[test]
    fn wgpu_matmul() {
        super::matmul_matches::<B>(&dev());
    }
    #[test]
    fn wgpu_fp8_linear() {
        super::fp8_linear_matches::<B>(&dev());
    }
    #[test]
    fn wgpu_causal_conv1d() {
        super::conv_matches::<B>(&dev());
    }
    #[test]
    fn wgpu_selective_scan() {
        super::scan_matches::<B>(&dev());
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
        super::nvfp4_linear_matches::<B>(&dev());
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_matmul() {
        super::matmul_matches::<B>(&dev());
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_fp8_linear() {
        super::fp8_linear_matches::<B>(&dev());
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_causal_conv1d() {
        super::conv_matches::<B>(&dev());
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_selective_scan() {
        super::scan_matches::<B>(&dev());
    }
}
