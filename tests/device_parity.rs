//! Cross-backend parity: the same model code on the device arms against the committed HF goldens
//! and against the NdArray host reference.
//!
//! - wgpu (f32) runs here and in CI on Mesa lavapipe (install `mesa-vulkan-drivers`; without a
//!   Vulkan adapter these tests fail and say so).
//! - CUDA (f32 and bf16) tests are `#[ignore]`d: counted as ignored wherever there is no GPU, run
//!   on the device machine with `--ignored`.
//!
//! Bands. f32 on a device sums in another order than the host (tree reductions, strided partial
//! sums), so it gets the host's band: max |Δ| ≤ 1e-5 × logit scale against HF (0.15 absolute for
//! W8A8, see `hf_parity.rs`). bf16 rounds every activation to 8 bits of mantissa: its band is
//! measured on the H200 (see `BF16_BAND`). Each band is armed: the dt-clamp deviation must land
//! outside it on the same backend.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

mod common;
use common::*;
use nemotron::kernels::NemotronBackend;
use nemotron::loader::synth::{Geometry, SynthRecipe};
use nemotron::model::{Deviations, NemotronH};

const F32_BAND: f32 = 1e-5;
const W8A8_BAND: f32 = 0.15;
/// bf16 activations (weights as shipped, f32 router/scan state), relative to the logit scale.
/// Provisional: the bf16 arm does not meet it yet (docs/PERF.md §4); to be set from a
/// measurement once it does.
const BF16_BAND: f32 = 0.05;

fn hf<Bk: NemotronBackend>(
    dev: &Bk::Device,
    name: &str,
    suffix: &str,
    d: Deviations,
) -> (f32, f32, f32) {
    let m = NemotronH::<Bk>::load_with_deviations(fixture(name), dev, d).unwrap();
    let (dp, dd, scale) = compare(&m, &reference(name, suffix));
    eprintln!(
        "{} {name}{suffix} {d:?}: prefill max |Δ| {dp:.3e}, decode {dd:.3e}, scale {scale:.3}",
        std::any::type_name::<Bk>()
    );
    (dp, dd, scale)
}

/// Every HF fixture within `band(scale)` (W8A8 within its absolute band) on backend `Bk`.
pub fn hf_fixtures_match<Bk: NemotronBackend>(dev: &Bk::Device, rel: f32, w8a8: f32) {
    for name in ["all_letters", "grouped_routing", "nano_nvfp4"] {
        let (dp, dd, s) = hf::<Bk>(dev, name, "", Deviations::default());
        assert!(
            dp <= rel * s && dd <= rel * s,
            "{name}: {dp}, {dd} > {rel} × {s}"
        );
    }
    let (dp, dd, _) = hf::<Bk>(dev, "lightning_mixed", "", Deviations::default());
    assert!(
        dp <= w8a8 && dd <= w8a8,
        "lightning_mixed W8A8: {dp}, {dd} > {w8a8}"
    );
    let wo = Deviations {
        fp8_weight_only: true,
        ..Default::default()
    };
    let (dp, dd, s) = hf::<Bk>(dev, "lightning_mixed", "_w8a16", wo);
    assert!(
        dp <= rel * s && dd <= rel * s,
        "lightning_mixed W8A16: {dp}, {dd} > {rel} × {s}"
    );
}

/// The band rejects a plausible wrong model on this backend.
pub fn band_is_armed<Bk: NemotronBackend>(dev: &Bk::Device, rel: f32) {
    let clamp = Deviations {
        dt_min_clamp: Some(1e-3),
        ..Default::default()
    };
    let (dp, dd, s) = hf::<Bk>(dev, "all_letters", "", clamp);
    assert!(
        dp > rel * s && dd > rel * s,
        "the dt clamp stays inside the band ({dp}, {dd} vs {})",
        rel * s
    );
}

/// Same synthetic checkpoint (all block types, W4A16 NVFP4 + FP8 + BF16) on the host and on the
/// device: prefill over 37 tokens and 12 decode steps.
pub fn device_matches_host<Bk: NemotronBackend>(dev: &Bk::Device, rel: f32) {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 31);
    let host = NemotronH::<B>::load(dir.path(), &Default::default()).unwrap();
    let m = NemotronH::<Bk>::load(dir.path(), dev).unwrap();
    let toks = ids(49, 256, 77);
    let (mut sh, mut sd) = (host.new_state(), m.new_state());
    let mut h = rows(host.forward_one(&toks[..37], &mut sh).unwrap());
    let mut d = rows_any(m.forward_one(&toks[..37], &mut sd).unwrap());
    for &t in &toks[37..] {
        h.extend(rows(host.forward_one(&[t], &mut sh).unwrap()));
        d.extend(rows_any(m.forward_one(&[t], &mut sd).unwrap()));
    }
    let (diff, scale) = diff(&d, &h);
    eprintln!(
        "{} vs NdArray: max |Δ| {diff:.3e} at scale {scale:.3}",
        std::any::type_name::<Bk>()
    );
    assert!(
        diff <= rel * scale,
        "device vs host: {diff} > {rel} × {scale}"
    );
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use nemotron::kernels::cube::WgpuBackend as W;
    #[test]
    fn wgpu_f32_matches_hf() {
        super::hf_fixtures_match::<W>(&Default::default(), super::F32_BAND, super::W8A8_BAND);
    }
    #[test]
    fn wgpu_f32_band_is_armed() {
        super::band_is_armed::<W>(&Default::default(), super::F32_BAND);
    }
    #[test]
    fn wgpu_f32_matches_host() {
        super::device_matches_host::<W>(&Default::default(), super::F32_BAND);
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use burn::tensor::bf16;
    use nemotron::kernels::cube::CudaBackend;
    const IGNORE: &str = "needs a CUDA GPU: run on the device machine with --ignored";
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_f32_matches_hf() {
        let _ = IGNORE;
        super::hf_fixtures_match::<CudaBackend<f32>>(
            &Default::default(),
            super::F32_BAND,
            super::W8A8_BAND,
        );
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_f32_band_is_armed() {
        super::band_is_armed::<CudaBackend<f32>>(&Default::default(), super::F32_BAND);
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn cuda_f32_matches_host() {
        super::device_matches_host::<CudaBackend<f32>>(&Default::default(), super::F32_BAND);
    }
    // The bf16 tests FAILED at the last H200 run (2026-11-29: max |Δ| 1.34 vs HF, 3.2 vs the host
    // at logit scale ≈ 4; f32 on the same GPU is within 3.5e-6). Norm statistics and softmax
    // moved to f32 afterwards, not yet re-measured: run them with --ignored on a GPU.
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored (bf16: known failing, see docs/PERF.md §4)"]
    fn cuda_bf16_matches_hf() {
        super::hf_fixtures_match::<CudaBackend<bf16>>(
            &Default::default(),
            super::BF16_BAND,
            super::W8A8_BAND.max(super::BF16_BAND * 4.0),
        );
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored (bf16: known failing, see docs/PERF.md §4)"]
    fn cuda_bf16_band_is_armed() {
        super::band_is_armed::<CudaBackend<bf16>>(&Default::default(), super::BF16_BAND);
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored (bf16: known failing, see docs/PERF.md §4)"]
    fn cuda_bf16_matches_host() {
        super::device_matches_host::<CudaBackend<bf16>>(&Default::default(), super::BF16_BAND);
    }
}
