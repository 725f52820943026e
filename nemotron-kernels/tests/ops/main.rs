//! Per-op parity of the CubeCL kernels against the plain-Rust host reference (Flex), on fresh
//! random inputs, one generic body per op (`linear`, `mamba`, `norm`, `route`, `matmul`) stamped by
//! [`arms!`] into three arms:
//!
//! - `wgpu::*` (f32): runs in CI on Mesa lavapipe; without a Vulkan adapter the tests fail and say
//!   so (install `mesa-vulkan-drivers`).
//! - `cuda_f32::*` and `cuda_bf16::*`: `#[ignore]`d — counted as ignored wherever there is no GPU —
//!   and run on the device machine with `--ignored`.
//!
//! Bands (f32): the kernels sum in another order than the reference (strided partial sums, tree
//! reduction), so results differ by f32 rounding: relative 1e-5 of the output scale for the
//! linears and the conv, 1e-4 for the scan (its state compounds over time); the FP8 activation
//! codes are the same on both sides, so W8A8 gets the same band. bf16: see [`BF16`].
#![cfg(feature = "cube")]

mod argmax;
mod attention;
mod linear;
mod mamba;
mod matmul;
mod norm;
mod route;
mod slots;

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use nemotron_kernels::rng::Lcg;

/// Held by every test that sets a process-wide attention setting (the decode form, the prefill
/// kernel), so two of them on parallel threads do not switch each other's mid-comparison.
pub static ATTN_FORM: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held by the tests that set the SSM step's rows per warp (a process-wide setting).
pub static SSM_WALK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The shared generator; with `bf16` set every value is rounded to bf16, so the device arm's bf16
/// inputs and the f32 reference's inputs are the same numbers.
pub struct Rng {
    lcg: Lcg,
    bf16: bool,
}

impl Rng {
    pub fn new(seed: u64, arm: &Arm) -> Self {
        Rng {
            lcg: Lcg::new(seed),
            bf16: arm.band.bf16,
        }
    }
    pub fn next(&mut self) -> f32 {
        self.lcg.uniform()
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        let round = self.bf16;
        (0..n).map(|_| bf(self.next() * scale, round)).collect()
    }
    pub fn round(&self, v: f32) -> f32 {
        bf(v, self.bf16)
    }
}

fn bf(v: f32, round: bool) -> f32 {
    if round {
        burn::tensor::bf16::from_f32(v).to_f32()
    } else {
        v
    }
}

/// Relative bands of one arm: `lin` for the linears, norms and the conv, `scan` for the scan.
#[derive(Clone, Copy)]
pub struct Band {
    pub lin: f32,
    pub scan: f32,
    pub bf16: bool,
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

/// A device under test, the activation dtype it runs in, and its bands.
pub struct Arm {
    pub dev: Device,
    pub dtype: DType,
    pub band: Band,
}

impl Arm {
    /// A float tensor on this arm, in its activation dtype.
    pub fn t<const D: usize>(&self, v: &[f32], shape: [usize; D]) -> Tensor<D> {
        Tensor::from_data(TensorData::new(v.to_vec(), shape), (&self.dev, self.dtype))
    }
    /// An f32 tensor on this arm whatever its activation dtype.
    pub fn f32<const D: usize>(&self, v: &[f32], shape: [usize; D]) -> Tensor<D> {
        Tensor::from_data(TensorData::new(v.to_vec(), shape), (&self.dev, DType::F32))
    }
    pub fn int(&self, v: &[i64]) -> Tensor<1, Int> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &self.dev)
    }
    /// The host reference arm.
    pub fn host() -> Arm {
        Arm {
            dev: Device::flex(),
            dtype: DType::F32,
            band: F32,
        }
    }
}

pub fn host<const D: usize>(x: Tensor<D>) -> Vec<f32> {
    x.into_data().convert::<f32>().into_vec().unwrap()
}

/// Asserts `max |got − want| ≤ rel × max |want|`, printing the worst elements when it fails.
pub fn close(name: &str, got: &[f32], want: &[f32], rel: f32) {
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

/// The prefill attention kernel's key tile from the device's shared memory: 32 keys where they
/// fit (CUDA's 48 KiB), 16 on lavapipe's 32 KiB at `D = 128` (the 32-key cube needs 37,632 bytes:
/// launched anyway it wrote nothing there), a refusal where even 16 do not fit or the head
/// dimension is not a multiple of 8 up to 128 (host arithmetic).
#[test]
fn flash_key_tile_fits_shared_memory() {
    use nemotron_kernels::cube::plans::attention::{flash_keys_per_tile, flash_shared_bytes};
    assert_eq!(flash_keys_per_tile(48 * 1024, 128), Some(32));
    assert_eq!(flash_keys_per_tile(32 * 1024, 128), Some(16));
    assert_eq!(flash_keys_per_tile(32 * 1024, 64), Some(32));
    assert_eq!(flash_keys_per_tile(16 * 1024, 128), None);
    for d in [0, 12, 136, 256] {
        assert_eq!(flash_keys_per_tile(1 << 20, d), None, "head dim {d}");
    }
    for (bc, d) in [(32, 128), (16, 128), (32, 8)] {
        let max = flash_shared_bytes(bc, d);
        assert_eq!(
            flash_keys_per_tile(max, d),
            Some(bc),
            "{bc} keys of {d} in {max} bytes"
        );
        if bc == 32 {
            assert_ne!(flash_keys_per_tile(max - 1, d), Some(32));
        }
    }
}

/// Prefill attention's form: the tensor-core kernel only where asked, in bf16, on a device with
/// bf16 `mma`, heads a multiple of 16, queries in 8-wide vectors and the shared memory for it;
/// else the SIMT kernel with its key tile; nothing for heads no kernel takes (host arithmetic).
#[test]
fn prefill_attention_plan() {
    use nemotron_kernels::cube::plans::attention::{
        flash_mma_shared_bytes, prefill_plan as plan, PrefillForm,
    };
    let cuda = 227 * 1024;
    assert_eq!(
        plan(128, 4608, true, true, cuda, true),
        Some(PrefillForm::Mma)
    );
    let simt = Some(PrefillForm::Simt { keys: 32 });
    assert_eq!(plan(128, 4608, true, true, cuda, false), simt);
    assert_eq!(plan(128, 4608, false, true, cuda, true), simt);
    assert_eq!(plan(128, 4608, true, false, cuda, true), simt);
    assert_eq!(plan(120, 4600, true, true, cuda, true), simt);
    assert_eq!(plan(128, 4100, true, true, cuda, true), simt);
    let tight = flash_mma_shared_bytes(128);
    assert_eq!(
        plan(128, 4608, true, true, tight, true),
        Some(PrefillForm::Mma)
    );
    assert_eq!(plan(128, 4608, true, true, tight - 1, true), simt);
    assert_eq!(
        plan(128, 4608, false, false, 32 * 1024, false),
        Some(PrefillForm::Simt { keys: 16 })
    );
    assert_eq!(plan(136, 4608, true, true, cuda, true), None);
    // Each reason the tensor-core form gives way is named (what `flashmma=on` says on stderr).
    use nemotron_kernels::cube::plans::attention::prefill_mma_refusal as why;
    assert_eq!(why(128, 4608, true, true, cuda), None);
    for (got, says) in [
        (why(128, 4608, false, true, cuda), "not bf16"),
        (why(128, 4608, true, false, cuda), "no bf16 mma"),
        (why(120, 4600, true, true, cuda), "heads of 120"),
        (why(128, 4100, true, true, cuda), "query rows of 4100"),
        (
            why(128, 4608, true, true, tight - 1),
            &format!("need {tight} bytes"),
        ),
    ] {
        let got = got.unwrap_or_default();
        assert!(got.contains(says), "{got:?} should say {says:?}");
    }
}

/// Launch grids past the device limits (65,535 cubes on a dimension): the folds cover every
/// cube once, within the limits, with at most one partial row (host arithmetic).
#[test]
fn grids_fold_within_limits() {
    use nemotron_kernels::cube::plans::grid::{fold_xy, yz, MAX_CUBES};
    for cubes in [
        1usize,
        65_535,
        65_536,
        6 * 10_923,
        131_071,
        1 << 24,
        65_535 * 65_535,
    ] {
        for (name, (a, b)) in [("fold_xy", fold_xy(cubes)), ("yz", yz(cubes))] {
            let (a, b) = (a as usize, b as usize);
            assert!(
                a <= MAX_CUBES && b <= MAX_CUBES,
                "{name}({cubes}) = ({a}, {b})"
            );
            assert!(a * b >= cubes, "{name}({cubes}) = ({a}, {b}) misses cubes");
            assert!(
                a * (b - 1) < cubes,
                "{name}({cubes}) = ({a}, {b}): a whole idle row"
            );
        }
    }
}

/// The environment is read in one module of this crate (`cube/tuning.rs`): no other source
/// file names `std::env` or `env::var` (seen red with `cube/linear/mma.rs`'s former
/// `std::env::var("NEMOTRON_MMA")` put back).
#[test]
fn environment_read_only_in_tuning() {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    walk(&src, &mut files);
    assert!(
        files.len() > 20,
        "the crate's sources under {}",
        src.display()
    );
    let offenders: Vec<String> = files
        .iter()
        .filter(|p| !p.ends_with("cube/tuning.rs"))
        .filter(|p| {
            let s = std::fs::read_to_string(p).unwrap();
            s.contains("std::env") || s.contains("env::var")
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "environment read outside cube/tuning.rs: {offenders:?}"
    );
}

/// The GEMV and small-M grids (slots × row blocks, linearized and folded) fit the limits and
/// hold every (slot, block) pair, with less than one row of idle cubes, at slot counts past
/// 65,535 (a 70,000-row prompt's plain linear on wgpu; 6 routed slots of 12,000 tokens).
#[cfg(feature = "cube")]
#[test]
fn gemv_grids_fold_within_limits() {
    use nemotron_kernels::cube::plans::grid::MAX_CUBES;
    use nemotron_kernels::cube::plans::linear::{gemv_count, small_m_count, GEMV_ROWS};
    let dims = |c: cubecl::prelude::CubeCount| match c {
        cubecl::prelude::CubeCount::Static(x, y, z) => (x as usize, y as usize, z as usize),
        _ => panic!("a GEMV grid is static"),
    };
    let rows = GEMV_ROWS as usize;
    for (n, slots) in [
        (131_072, 1),
        (2_688, 70_000),
        (1_856, 72_000),
        (8, 3 * 65_536),
        (4_096, 200_000),
    ] {
        for (name, c, pairs) in [
            ("gemv r1", gemv_count(n, slots, 1), slots * n.div_ceil(rows)),
            (
                "gemv r2",
                gemv_count(n, slots, 2),
                slots * n.div_ceil(2 * rows),
            ),
            (
                "small-M 8",
                small_m_count(n, slots, 8),
                slots.div_ceil(8) * n.div_ceil(rows),
            ),
        ] {
            let (x, y, z) = dims(c);
            assert!(
                x <= MAX_CUBES && y <= MAX_CUBES && z <= MAX_CUBES,
                "{name}({n}, {slots}) = ({x}, {y}, {z})"
            );
            assert!(x * y * z >= pairs, "{name}({n}, {slots}): misses cubes");
            assert!(
                x * y * z < pairs + x,
                "{name}({n}, {slots}): a whole idle row"
            );
        }
    }
}

/// The row blocks of a plain tensor-core call cover every row once, with no idle block, and
/// their grid rows fold within the limits at any row count.
#[cfg(feature = "cube")]
#[test]
fn mma_row_blocks_cover_rows() {
    use nemotron_kernels::cube::plans::grid::{yz, MAX_CUBES};
    use nemotron_kernels::cube::plans::linear::blocks;
    for nt in [1usize, 2, 4, 8, 16] {
        for rows in [
            1usize,
            7,
            63,
            64,
            65,
            1_024,
            12_288,
            65_535 * 64 + 1,
            1 << 26,
        ] {
            let (block, n) = blocks(rows, nt);
            assert!(
                block >= 8 * nt && block % (8 * nt) == 0,
                "blocks({rows}, {nt}) = ({block}, {n})"
            );
            assert!(
                block * n >= rows,
                "blocks({rows}, {nt}) = ({block}, {n}) misses rows"
            );
            assert!(
                block * (n - 1) < rows,
                "blocks({rows}, {nt}) = ({block}, {n}): an idle block"
            );
            let (y, z) = yz(n);
            assert!((y as usize) <= MAX_CUBES && (z as usize) <= MAX_CUBES);
        }
    }
}

/// The tiled kernels' shapes: token tiles grow with the rows up to the asked maximum, and a
/// cube always has a staged vector for each of its threads (`8 · nt · 16 ≥ 32 · warps`; the
/// kernel's per-thread staging count is that quotient and must not be 0).
#[test]
fn tile_shapes_stage_every_thread() {
    use nemotron_kernels::cube::plans::linear::{tile_warps, tiles_up_to};
    for max in [4usize, 8, 16] {
        let mut last = 0;
        for rows in 0..400usize {
            let nt = tiles_up_to(rows, max);
            assert!(
                [1, 2, 4, 8, 16].contains(&nt) && nt <= max,
                "{rows} rows, max {max}: {nt}"
            );
            assert!(nt >= last, "tiles fall from {last} to {nt} at {rows} rows");
            assert!(
                8 * nt >= rows.min(8 * max),
                "{rows} rows in {nt} tiles (max {max})"
            );
            last = nt;
            for warps in [4usize, 8] {
                let tw = tile_warps(warps, nt);
                assert!(tw == 4 || tw == 8, "{warps} warps, {nt} tiles: {tw}");
                assert!(tw <= warps, "{warps} warps asked, {tw} given");
                let staged = 8 * nt * 16;
                assert!(
                    staged % (32 * tw) == 0 && staged / (32 * tw) >= 1,
                    "{nt} tiles × 16 vectors over {tw} warps"
                );
            }
        }
    }
    assert_eq!(tiles_up_to(1_000, 16), 16);
    assert_eq!(tiles_up_to(60, 4), 4);
    assert_eq!(tile_warps(8, 1), 4);
}

/// The plain FP8 / dense `mma` cubes' split between K parts and row tiles: a cube of the
/// default warps keeps its warp count whatever `m_warps` says, and a widened cube (a small
/// grid) keeps one row tile, so the kernel's `kw · mw` warps always cover K once per tile.
#[test]
fn m_split_keeps_the_cube_and_covers_k() {
    use nemotron_kernels::cube::plans::linear::{m_split, WARPS};
    let w = WARPS as usize;
    for kw in [w, 2 * w, 4 * w] {
        for mw in [1usize, 2, 4] {
            let (k_parts, tiles) = m_split(kw, mw);
            assert!(
                k_parts >= 1 && tiles >= 1,
                "{kw}, {mw}: {k_parts} × {tiles}"
            );
            if kw == w {
                assert_eq!((k_parts * tiles, tiles), (w, mw), "{kw} warps, mw {mw}");
            } else {
                assert_eq!((k_parts, tiles), (kw, 1), "widened {kw} warps, mw {mw}");
            }
        }
    }
}

/// The linear plan (`cube::linear::plan`) at the Lightning shapes with the default settings, on a
/// device with tensor cores and without: each tier where the thresholds put it, and the limits
/// that push a call down a tier (the grid's y for expert groups, `k` for the expert-major and
/// FP8 vector GEMVs, the activation dtype, `k` not a multiple of the chunk).
#[test]
fn linear_plan_picks_each_tier() {
    use nemotron_kernels::cube::plans::linear::GROUPED_MIN_SLOTS;
    use nemotron_kernels::cube::plans::linear::{
        plan, Format, Limits, LinearPath as P, LinearShape, MmaForm,
    };
    use nemotron_kernels::cube::plans::linear::{MmaMin, FP8_INQ_MAX_ROWS};
    let tc = Limits {
        mma: true,
        min: MmaMin::default(),
        grouped_min: GROUPED_MIN_SLOTS,
        inq_max: FP8_INQ_MAX_ROWS,
    };
    let none = Limits { mma: false, ..tc };
    let call = |format, slots, k, routed, experts| LinearShape {
        format,
        bf16: true,
        slots,
        k,
        routed,
        experts,
    };
    let path = |s: LinearShape, l: &Limits| plan(&s, l).path;
    // Routed NVFP4 experts (2688 → 1856, 128 experts, 6 slots a token).
    let up = |slots| call(Format::Nvfp4, slots, 2688, true, 128);
    assert_eq!(path(up(3), &tc), P::Gemv, "below the slot-major threshold");
    assert_eq!(path(up(6), &tc), P::Mma(MmaForm::SlotMajor), "batch 1");
    assert_eq!(path(up(96), &tc), P::Mma(MmaForm::Grouped), "batch 16");
    assert_eq!(
        path(up(6144), &tc),
        P::Tiled { grouped: true },
        "a 1K prompt"
    );
    let many = call(Format::Nvfp4, 6144, 2688, true, 70_000);
    assert_eq!(
        path(many, &tc),
        P::Mma(MmaForm::SlotMajor),
        "experts past grid y"
    );
    assert_eq!(path(up(6144), &none), P::Gemv, "no tensor cores");
    let em = Limits {
        grouped_min: 32,
        ..none
    };
    assert_eq!(path(up(96), &em), P::ExpertMajor);
    let wide = call(Format::Nvfp4, 96, 4128, true, 128);
    assert_eq!(path(wide, &em), P::Gemv, "k past the expert-major GEMV");
    // Plain NVFP4 rows (the shared expert; the lm_head): on the tensor cores from one row
    // (the batch-1 lm_head, PERF 41); under the old start of 4 rows one row took the GEMV and
    // two the small-M kernel.
    let sh = |slots| call(Format::Nvfp4, slots, 2688, false, 1);
    assert_eq!(path(sh(1), &tc), P::Mma(MmaForm::Rows), "batch-1 lm_head");
    assert_eq!(path(sh(2), &tc), P::Mma(MmaForm::Rows));
    let from4 = Limits {
        min: MmaMin {
            nvfp4: 4,
            ..MmaMin::default()
        },
        ..tc
    };
    assert_eq!(path(sh(1), &from4), P::Gemv);
    assert_eq!(path(sh(2), &from4), P::SmallM, "below the tensor-core rows");
    assert_eq!(path(sh(16), &tc), P::Mma(MmaForm::Rows));
    assert_eq!(path(sh(1024), &tc), P::Tiled { grouped: false });
    // Plain rows and grouped slots reach the tiled kernel at their own sizes (PERF 36): a
    // batch-256 step's shared expert (256 rows) tiled, a batch-64 step's 384 routed slots not.
    assert_eq!(path(sh(256), &tc), P::Tiled { grouped: false }, "batch 256");
    assert_eq!(path(sh(255), &tc), P::Mma(MmaForm::Rows));
    assert_eq!(path(up(384), &tc), P::Mma(MmaForm::Grouped), "batch 64");
    assert_eq!(path(up(1536), &tc), P::Tiled { grouped: true }, "batch 256");
    assert_eq!(path(sh(1024), &none), P::SmallM);
    let f32_rows = LinearShape {
        bf16: false,
        ..sh(1024)
    };
    assert_eq!(path(f32_rows, &tc), P::SmallM, "f32 activations");
    assert_eq!(
        path(call(Format::Nvfp4, 1024, 40, false, 1), &tc),
        P::Scalar
    );
    // FP8 (in_proj 2688 → 10304): the tensor cores from one row; tiled only when asked.
    let fp = |slots, k| call(Format::Fp8, slots, k, false, 1);
    assert_eq!(path(fp(1, 2688), &tc), P::Mma(MmaForm::Rows));
    assert_eq!(path(fp(1024, 2688), &tc), P::Mma(MmaForm::Rows));
    let tiled = Limits {
        min: MmaMin {
            fp8_tile: 1,
            ..MmaMin::default()
        },
        ..tc
    };
    assert_eq!(path(fp(1024, 2688), &tiled), P::Tiled { grouped: false });
    let gemm = Limits {
        min: MmaMin {
            fp8_gemm: 512,
            ..tiled.min
        },
        ..tc
    };
    assert_eq!(
        path(fp(1024, 2688), &gemm),
        P::Gemm,
        "the GEMM before the tiled kernel"
    );
    assert_eq!(
        path(fp(511, 2688), &gemm),
        P::Tiled { grouped: false },
        "below the GEMM's rows"
    );
    assert_eq!(
        path(fp(1, 2688), &gemm),
        P::Mma(MmaForm::Rows),
        "one row quantized in-kernel, not the GEMM"
    );
    assert_eq!(
        path(call(Format::Nvfp4, 1024, 2688, false, 1), &gemm),
        P::Tiled { grouped: false },
        "no NVFP4 GEMM"
    );
    assert_eq!(
        path(fp(1, 2688), &tiled),
        P::Mma(MmaForm::Rows),
        "one row quantized in-kernel"
    );
    // The decoded path: from its rows, before every tensor-core tier, on any device and
    // activation type; never routed, never NVFP4.
    let dec = Limits {
        min: MmaMin {
            fp8_mm: 512,
            ..gemm.min
        },
        ..tc
    };
    assert_eq!(path(fp(512, 2688), &dec), P::Decoded, "before the GEMM");
    assert_eq!(path(fp(511, 2688), &dec), P::Tiled { grouped: false });
    let f32_dec = LinearShape {
        bf16: false,
        ..fp(512, 2688)
    };
    let no_mma = Limits { mma: false, ..dec };
    assert_eq!(path(f32_dec, &no_mma), P::Decoded, "any device and dtype");
    assert_eq!(
        path(call(Format::Fp8, 512, 2688, true, 4), &dec),
        P::Gemv,
        "routed FP8 slots are not decoded"
    );
    assert_eq!(
        path(call(Format::Nvfp4, 1024, 2688, false, 1), &dec),
        P::Tiled { grouped: false },
        "no NVFP4 decoded path"
    );
    assert_eq!(
        path(fp(4096, 2688), &tc),
        P::Mma(MmaForm::Rows),
        "off by default"
    );
    assert_eq!(path(fp(2, 2688), &none), P::SmallM);
    assert_eq!(path(fp(1, 2688), &none), P::Gemv);
    assert_eq!(
        path(fp(1, 20_000), &none),
        P::Scalar,
        "k past the vector GEMV"
    );
    assert_eq!(path(fp(1, 40), &tc), P::Scalar, "k not a multiple of 16");
    let routed_fp8 = call(Format::Fp8, 96, 2688, true, 8);
    assert_eq!(
        path(routed_fp8, &tc),
        P::Gemv,
        "no routed FP8 tensor-core path"
    );
    // Every plan says why.
    assert!(!plan(&up(6144), &tc).reason.is_empty());
}

/// The decode attention form (`attention::decode::plan`): the form asked for where it fits —
/// Lightning's 32 query heads over 2 kv heads at head dim 128 keep the GQA form — the split form
/// where a GQA group's rows pass its shared memory, and the unfused one where the head dim does
/// not divide the split cube's units.
#[test]
fn attention_plan_keeps_each_form_where_it_fits() {
    use nemotron_kernels::cube::plans::attention::{plan, AttnForm as F};
    assert_eq!(plan(F::Gqa, 32, 2, 128), F::Gqa);
    assert_eq!(plan(F::Split, 32, 2, 128), F::Split);
    assert_eq!(plan(F::Unfused, 32, 2, 128), F::Unfused);
    // A group of 64 query heads: 64 · (128 + 128 + 128) · 4 bytes = 96 KiB > 40 KiB.
    assert_eq!(plan(F::Gqa, 64, 1, 128), F::Split);
    assert_eq!(
        plan(F::Gqa, 32, 2, 96),
        F::Unfused,
        "96 does not divide 128 units"
    );
    assert_eq!(plan(F::Split, 4, 1, 3), F::Unfused);
}

/// The wave plan of the tensor-core launches on an H100's 132 SMs (at 56 registers a unit: 9
/// cubes of 4 warps an SM, 18 of 2): Lightning's batch-1 routed `down` (1,344 cubes, 1.13 waves)
/// takes 2 warps (one wave); its `up` (928 cubes) and the FP8 `in_proj` (644) already fit one
/// wave; the widened FP8 `out_proj` (168 cubes of 16 warps) fits; batch 64's grouped experts
/// (21,840 cubes) run many full waves and keep theirs; one warp never halves.
#[test]
fn wave_plan_halves_launches_just_past_one_wave() {
    use nemotron_kernels::cube::plans::linear::{wave_warps, MMA_UNIT_REGISTERS};
    assert_eq!(MMA_UNIT_REGISTERS % 8, 0, "a whole allocation granule");
    assert_eq!(wave_warps(1344, 4, 132), 2);
    assert_eq!(wave_warps(928, 4, 132), 4);
    assert_eq!(wave_warps(644, 4, 132), 4);
    assert_eq!(wave_warps(168, 16, 132), 16);
    assert_eq!(wave_warps(21840, 4, 132), 4);
    assert_eq!(wave_warps(5000, 1, 132), 1);
    // Past what half the warps hold in one wave: unchanged.
    assert_eq!(wave_warps(2400, 4, 132), 4);
    // The tuning's `waves` and `kw` reach the launch plan: the routed `down` (15 K steps in
    // groups of 2) halves only with `waves` and a known SM count; `kw=2` starts at 2; the FP8
    // `out_proj`'s 168 cubes widen to 16 warps from either start.
    use nemotron_kernels::cube::plans::linear::{plan_warps, MmaTuning};
    let d = MmaTuning::default();
    let waves = MmaTuning { waves: true, ..d };
    let kw2 = MmaTuning { k_warps: 2, ..d };
    assert_eq!(plan_warps(&d, 1344, 15, 2, Some(132)), 4);
    assert_eq!(plan_warps(&waves, 1344, 15, 2, Some(132)), 2);
    assert_eq!(plan_warps(&waves, 1344, 15, 2, None), 4);
    assert_eq!(plan_warps(&kw2, 1344, 15, 2, Some(132)), 2);
    assert_eq!(plan_warps(&d, 168, 64, 2, Some(132)), 16);
    assert_eq!(plan_warps(&kw2, 168, 64, 2, Some(132)), 16);
}

/// `fp8pipe=on` pipelines the plain FP8 `mma` kernel alone: the key reaches the tuning (and no
/// other field), `fp8_pipe` (what the FP8 launcher asks; the launch itself runs on CUDA only)
/// takes it, and `pipe=on` (every tensor-core kernel) still pipelines FP8 without it.
#[test]
fn fp8_pipe_reaches_the_fp8_launch_alone() {
    use nemotron_kernels::cube::plans::linear::{fp8_pipe, MmaTuning, FP8_PIPE};
    use nemotron_kernels::cube::settings::Settings;
    let d = MmaTuning::default();
    assert_eq!(fp8_pipe(&d), FP8_PIPE || d.pipe);
    let on = Settings::parse("fp8pipe=on").unwrap().tune;
    assert_eq!(
        on,
        MmaTuning {
            fp8_pipe: true,
            ..d
        },
        "fp8pipe sets its own field only"
    );
    assert!(
        fp8_pipe(&on) && !on.pipe,
        "the NVFP4 kernels keep their loads unpipelined"
    );
    let all = Settings::parse("pipe=on").unwrap().tune;
    assert!(fp8_pipe(&all) && !all.fp8_pipe);
    let off = Settings::parse("fp8pipe=off").unwrap().tune;
    assert!(!fp8_pipe(&off));
    let e = Settings::parse("fp8pipe=1").unwrap_err();
    assert!(e.contains("fp8pipe"), "{e}");
}

/// Decode attention's GQA sub-groups (`gqa_split_plan`): Lightning's 16-head groups over 2 kv
/// heads split one head a cube at batch 1 after 128 tokens (6 (row, chunk) pairs), 2 ways after
/// 1K (17 chunks: 68 cubes), stay whole after 8K (129 chunks) and at batches 16 and 64 — the
/// best of the H100's kernel table at each context (§37); a forced split rounds down to a power
/// of two dividing the group; a group of 6 splits at most 2 ways.
#[test]
fn gqa_split_plan_fills_small_grids() {
    use nemotron_kernels::cube::plans::attention::gqa_split_plan as plan;
    assert_eq!(plan(16, 2, 1, 3, 0), 16);
    assert_eq!(plan(16, 2, 1, 17, 0), 2);
    assert_eq!(plan(16, 2, 1, 129, 0), 1);
    assert_eq!(plan(16, 2, 64, 3, 0), 1);
    assert_eq!(plan(16, 2, 16, 3, 0), 1);
    assert_eq!(plan(16, 2, 4, 3, 0), 4);
    assert_eq!(plan(6, 2, 1, 1, 0), 2);
    assert_eq!(plan(16, 2, 64, 3, 4), 4);
    assert_eq!(plan(16, 2, 1, 3, 6), 4);
    assert_eq!(plan(16, 2, 1, 3, 64), 16);
    assert_eq!(plan(6, 2, 1, 1, 16), 2);
}

/// The SSM decode step's rows per warp (`ssm_walk_plan`): Lightning's 64 heads of 64 state rows
/// walk one row a warp up to batch 16 (8,192 cubes), 4 at batch 64, 8 from 128 rows; the
/// strided loop (no register share) always one; a forced setting rounds down to a power of two.
#[test]
fn ssm_walk_plan_keeps_cubes_for_small_batches() {
    use nemotron_kernels::cube::plans::ssm_step::ssm_walk_plan as plan;
    let pairs = |rows: usize| rows * 64;
    assert_eq!(plan(pairs(1), 64, true, 0), 1);
    assert_eq!(plan(pairs(16), 64, true, 0), 1);
    assert_eq!(plan(pairs(32), 64, true, 0), 2);
    assert_eq!(plan(pairs(64), 64, true, 0), 4);
    assert_eq!(plan(pairs(128), 64, true, 0), 8);
    assert_eq!(plan(pairs(256), 64, true, 0), 8);
    assert_eq!(
        plan(pairs(256), 64, false, 0),
        1,
        "the strided loop walks one row"
    );
    assert_eq!(plan(pairs(1), 64, true, 8), 8);
    assert_eq!(plan(pairs(1), 64, true, 6), 4);
    assert_eq!(plan(pairs(1), 64, true, 100), 8);
}

/// The kernel settings' text form (`bench --mma-min`): each key lands in its own field, the
/// `ROWS,SLOTS` form sets the thresholds it names and leaves the rest at the defaults, and bad
/// items are refused naming the item.
#[test]
fn settings_parse_each_key_into_its_field() {
    use nemotron_kernels::cube::plans::attention::AttnForm;
    use nemotron_kernels::cube::settings::Settings;
    let d = Settings::default();
    assert_eq!(Settings::parse("tile=512").unwrap().min.tile, 512);
    let s = Settings::parse(
        "nvfp4=3,fp8=5,dense=7,slotmajor=9,grouped=11,tile=13,tileslots=37,fp8tile=max,fp8gemm=31,inq=2,grp=4,\
         threads=99,tw=4,nt=16,rf=2,buf=2,tp=3,gw=2,gk=2,scanpair=17,scanchunk=19,scanchunkrows=23,scanssd=29,widen=off,\
         pipe=on,fuse=off,attn=split",
    )
    .unwrap();
    let m = s.min;
    assert_eq!(
        (
            m.nvfp4,
            m.fp8,
            m.dense,
            m.slot_major,
            m.grouped,
            m.tile,
            m.tile_slots,
            m.fp8_tile,
            m.fp8_gemm
        ),
        (3, 5, 7, 9, 11, 13, 37, usize::MAX, 31)
    );
    let t = s.tune;
    assert_eq!(
        (
            t.group,
            t.threads,
            t.tile_warps,
            t.tile_tiles,
            t.tile_frags,
            t.tile_buffers,
            t.tile_parts
        ),
        (4, 99, 4, 16, 2, 2, 3)
    );
    assert_eq!((t.widen, t.pipe, s.fused), (false, true, false));
    assert_eq!((t.gemm_warps_n, t.gemm_steps), (2, 2));
    assert!(Settings::parse("fp8direct=on").unwrap().tune.fp8_direct);
    assert_eq!(Settings::parse("mw=4").unwrap().tune.m_warps, 4);
    assert_eq!(Settings::parse("kw=2").unwrap().tune.k_warps, 2);
    assert!(Settings::parse("waves=on").unwrap().tune.waves);
    assert!(!d.tune.waves);
    // `default`: the library's defaults, alone (beside other items it is refused by name).
    assert_eq!(Settings::parse("default").unwrap(), d);
    assert_ne!(Settings::parse("kw=2").unwrap(), d);
    assert!(Settings::parse("default,kw=2")
        .unwrap_err()
        .contains("\"default\""));
    // The K staging of decode attention was measured slower at every context and removed.
    assert!(Settings::parse("attnstage=on")
        .unwrap_err()
        .contains("attnstage"));
    assert_eq!(d.tune.k_warps, 4);
    assert_eq!(Settings::parse("ssmwalk=4").unwrap().ssm_walk, 4);
    assert_eq!(Settings::parse("ssmwalk=auto").unwrap().ssm_walk, 0);
    assert_eq!(Settings::parse("attnsplit=4").unwrap().attn_split, 4);
    assert_eq!(Settings::parse("attnsplit=16").unwrap().attn_split, 16);
    assert_eq!(Settings::parse("attnsplit=auto").unwrap().attn_split, 0);
    assert_eq!(d.attn_split, 0);
    assert_eq!(
        Settings::parse("matrows=256").unwrap().matmul_rows_from,
        256
    );
    assert_eq!(
        Settings::parse("matrows=max").unwrap().matmul_rows_from,
        usize::MAX
    );
    assert_eq!(
        d.matmul_rows_from,
        nemotron_kernels::cube::plans::matmul::MATMUL_ROWS_FROM
    );
    assert!(Settings::parse("matrows=0")
        .unwrap_err()
        .contains("matrows=0"));
    assert!(Settings::parse("attnsplit=3")
        .unwrap_err()
        .contains("attnsplit=3"));
    assert!(Settings::parse("ssmwalk=0").is_err());
    assert!(Settings::parse("ssmwalk=3")
        .unwrap_err()
        .contains("ssmwalk=3"));
    assert!(Settings::parse("bdec=on").unwrap().tune.bf16_decode);
    assert!(!Settings::parse("bdec=off").unwrap().tune.bf16_decode);
    let e = Settings::parse("fp8direct=on,fp8gemm=512").unwrap_err();
    assert!(e.contains("fp8direct"), "{e}");
    // The GEMM alone is accepted whatever the default accumulation is.
    assert_eq!(Settings::parse("fp8gemm=512").unwrap().min.fp8_gemm, 512);
    assert!(
        !Settings::parse("fp8direct=off,fp8gemm=512")
            .unwrap()
            .tune
            .fp8_direct
    );
    let mm = Settings::parse("fp8mm=1024,densemm=256,mmk=ordered").unwrap();
    assert_eq!((mm.min.fp8_mm, mm.min.dense_mm), (1024, 256));
    assert_eq!(
        mm.tiled,
        nemotron_kernels::cube::plans::matmul::TiledKernel::Ordered
    );
    assert!(mm.tiled_f32 && !Settings::parse("mmacc=act").unwrap().tiled_f32);
    assert!(d.flash && mm.flash && !Settings::parse("flash=off").unwrap().flash);
    assert!(d.flash_mma && !Settings::parse("flashmma=off").unwrap().flash_mma);
    assert!(Settings::parse("flash=maybe")
        .unwrap_err()
        .contains("flash"));
    assert!(Settings::parse("mmacc=f16").unwrap_err().contains("mmacc"));
    let e = Settings::parse("mmk=fast").unwrap_err();
    assert!(e.contains("mmk") && e.contains("spectma"), "{e}");
    let both = Settings::parse("fp8direct=on,fp8tile=512").unwrap();
    assert!(both.tune.fp8_direct && both.min.fp8_tile == 512);
    assert_eq!(
        (s.fp8_inq_max, s.scan_pair_min, s.attn),
        (2, 17, AttnForm::Split)
    );
    assert_eq!(
        (s.scan_chunk.len, s.scan_chunk.max_rows, s.scan_ssd_min),
        (19, 23, 29)
    );
    let r = Settings::parse("6, max").unwrap();
    assert_eq!(
        (
            r.min.nvfp4,
            r.min.fp8,
            r.min.dense,
            r.min.slot_major,
            r.min.grouped
        ),
        (6, 6, 6, 6, usize::MAX)
    );
    assert_eq!((r.min.tile, r.tune, r.attn), (d.min.tile, d.tune, d.attn));
    for (bad, names) in [
        ("tile=x", "\"x\""),
        ("tw=5", "tw=5"),
        ("nt=12", "nt=12"),
        ("rf=3", "rf=3"),
        ("tp=0", "tp=0"),
        ("tp=5", "tp=5"),
        ("grp=3", "grp=3"),
        ("mw=3", "mw=3"),
        ("mw=8", "mw=8"),
        ("kw=3", "kw=3"),
        ("kw=8", "kw=8"),
        ("scanchunk=0", "scanchunk=0"),
        ("attn=flash", "attn"),
        ("pipe=maybe", "pipe"),
        ("colour=red", "colour"),
        ("tile", "tile"),
        ("1,2,3", "ROWS,SLOTS"),
    ] {
        let err = Settings::parse(bad).expect_err(bad);
        assert!(err.contains(names), "{bad:?} refused as {err:?}");
    }
}

/// Stamps each `name => body` into a wgpu f32 test and ignored CUDA f32 / bf16 tests.
macro_rules! arms {
    ($($name:ident => $body:path),* $(,)?) => {
        #[cfg(feature = "wgpu")]
        mod wgpu {
            use super::*;
            pub(super) fn arm() -> super::Arm {
                super::Arm {
                    dev: burn::tensor::Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
                    dtype: burn::tensor::DType::F32,
                    band: super::F32,
                }
            }
            $( #[test] fn $name() { $body(&arm()) } )*
        }
        #[cfg(feature = "cuda")]
        mod cuda_f32 {
            use super::*;
            pub(super) fn arm() -> super::Arm {
                super::Arm {
                    dev: burn::tensor::Device::cuda(0),
                    dtype: burn::tensor::DType::F32,
                    band: super::F32,
                }
            }
            $(
                #[test]
                #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
                fn $name() { $body(&arm()) }
            )*
        }
        #[cfg(feature = "cuda")]
        mod cuda_bf16 {
            use super::*;
            pub(super) fn arm() -> super::Arm {
                super::Arm {
                    dev: burn::tensor::Device::cuda(0),
                    dtype: burn::tensor::DType::BF16,
                    band: super::BF16,
                }
            }
            $(
                #[test]
                #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
                fn $name() { $body(&arm()) }
            )*
        }
    };
}

/// The tensor-core tunings beyond the default (they change nothing where every pass is a GEMV,
/// so CUDA bf16 only).
#[cfg(feature = "cuda")]
mod cuda_bf16_tunings {
    use super::cuda_bf16::arm;
    use super::*;
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn mma_linears_k_warps() {
        linear::mma_linears_k_warps_match(&arm())
    }
    #[test]
    #[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
    fn mma_linears_tiled() {
        linear::mma_linears_tiled_match(&arm())
    }
}

arms! {
    argmax_rows => argmax::argmax_rows_matches,
    logprob_rows => argmax::logprob_rows_match,
    nvfp4_linear => linear::nvfp4_linear_matches,
    fp8_linear => linear::fp8_linear_matches,
    fp8_gated_linear => linear::fp8_gated_linear_matches,
    fp8_decoded_linear => linear::fp8_decoded_linear_matches,
    expert_linears => linear::expert_linears_match,
    linears_into_three => linear::linears_into_three_parts_match,
    e4m3_codes => linear::e4m3_codes_decode_as_defined,
    e2m1_codes => linear::e2m1_codes_decode_as_defined,
    mma_linears => linear::mma_linears_match,
    grouped_experts => linear::grouped_experts_match,
    rms_norm => norm::rms_norm_matches,
    add_rms_norm => norm::add_rms_norm_matches,
    add_moe_rms_norm => norm::add_moe_rms_norm_matches,
    moe_route => route::moe_route_matches,
    moe_group => route::moe_group_matches,
    moe_combine => route::moe_combine_matches,
    dt_softplus => mamba::dt_softplus_matches,
    causal_conv1d => mamba::conv_matches,
    causal_conv1d_long => mamba::conv_long_matches,
    selective_scan => mamba::scan_matches,
    selective_scan_tiles => mamba::scan_tiles_match,
    selective_scan_pairs => mamba::scan_pairs_match,
    selective_scan_chunks => mamba::scan_chunks_match,
    selective_scan_ssd => mamba::scan_ssd_match,
    matmul => matmul::matmul_matches,
    dense_linear => matmul::dense_linear_matches,
    dense_linear_rows_invariant => matmul::dense_linear_rows_invariant,
    dense_linear_t => matmul::dense_linear_t_matches,
    dense_linear_tiled => matmul::dense_linear_tiled_matches,
    conv_step => slots::conv_step_matches,
    ssm_step => slots::ssm_step_matches,
    conv_ssm_step => slots::conv_ssm_step_matches,
    attention_step => slots::attention_step_matches,
    attention_prefill => attention::attention_prefill_matches,
    attention_prefill_mma => attention::attention_prefill_mma_matches,
    advance_and_write_slot => slots::advance_and_write_slot_match,
    write_slots => slots::write_slots_match,
    attention_step_kv8 => slots::attention_step_kv8_matches,
    write_slots8 => slots::write_slots8_match,
    conv_ssm_step_bf16 => slots::conv_ssm_step_bf16_matches,
    write_slots_bf16 => slots::write_slots_bf16_match,
}
