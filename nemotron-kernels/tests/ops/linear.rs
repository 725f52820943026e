//! NVFP4 and FP8 linears, plain and routed, with and without the relu² epilogue; the E4M3 and E2M1
//! decoders against the format definitions.

use super::{close, host, Arm, Rng};
use nemotron_formats as fmt;
use nemotron_kernels::cube::plans::linear as grouped;
use nemotron_kernels::ops;
use nemotron_kernels::{Epilogue, Fp8Matrix, Fp8Weights, Nvfp4Matrix, Nvfp4Weights};

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

fn fp8_case(rng: &mut Rng, n: usize, k: usize, input_scale: f32) -> Fp8Matrix {
    let (q, ws) = fmt::fp8_encode(&rng.vec(n * k, 0.05));
    Fp8Matrix {
        out_features: n,
        in_features: k,
        weight: q,
        weight_scale: ws,
        input_scale,
    }
}

/// The epilogues and the band each gets: relu² doubles the relative error and squares the scale.
const EPILOGUES: [(Epilogue, f32); 2] = [(Epilogue::None, 1.0), (Epilogue::Relu2, 2.0)];

pub fn nvfp4_linear_matches(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(1, arm));
    // `k % 32 == 0`: one row runs the vector GEMV (4211 and 8453 rows: 2 and 4 rows per unit
    // row, with a ragged tail), several rows the small-M path (2, 4 or 8 rows of `x` per cube,
    // with partial cubes); `k = 48` the scalar kernel.
    for (m, n, k) in [
        (1, 96, 64),
        (1, 40, 2688),
        (7, 33, 128),
        (33, 20, 48),
        (1, 4211, 32),
        (1, 8453, 64),
        (16, 50, 64),
        (3, 40, 2688),
        (19, 9, 32),
    ] {
        let w = [nvfp4_case(&mut rng, n, k)];
        let x = rng.vec(m * k, 1.0);
        for (epi, mult) in EPILOGUES {
            let want = host(ops::nvfp4_linear(
                href.t(&x, [m, k]),
                &Nvfp4Weights::upload(&w, &href.dev),
                epi,
            ));
            let got = host(ops::nvfp4_linear(
                arm.t(&x, [m, k]),
                &Nvfp4Weights::upload(&w, &arm.dev),
                epi,
            ));
            let name = format!("nvfp4 {epi:?} {m}×{k}→{n}");
            close(&name, &got, &want, mult * arm.band.lin);
        }
    }
}

pub fn fp8_linear_matches(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(2, arm));
    // `k % 16 == 0` runs the vector GEMV (8500 rows: 4 per unit row), `k = 20` the scalar one.
    for (m, n, k) in [
        (1, 50, 64),
        (9, 24, 256),
        (3, 10, 20),
        (1, 8500, 32),
        (2, 40, 2688),
    ] {
        // Calibrated below the activation amax so some inputs saturate at ±448.
        let w = [fp8_case(&mut rng, n, k, 2.5 / 448.0)];
        let x = rng.vec(m * k, 3.0);
        for (epi, mult) in EPILOGUES {
            let want = host(ops::fp8_linear(
                href.t(&x, [m, k]),
                &Fp8Weights::upload(&w, &href.dev),
                epi,
            ));
            let got = host(ops::fp8_linear(
                arm.t(&x, [m, k]),
                &Fp8Weights::upload(&w, &arm.dev),
                epi,
            ));
            // Same activation codes ⇒ only summation order differs.
            close(
                &format!("fp8 {epi:?} {m}×{k}→{n}"),
                &got,
                &want,
                mult * arm.band.lin,
            );
        }
    }
}

/// Expert indices for `tokens × k` routing slots (distinct within a token, as top-k gives them),
/// over `e` experts.
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

/// A plain linear whose outputs come back as three tensors (Mamba's `in_proj` into z, xBC,
/// dt), NVFP4 and FP8, against the reference linear's columns: one row (vector GEMV), several
/// (small-M) and an input width the split kernels do not take (sliced after the scalar kernel).
pub fn linears_into_three_parts_match(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(21, arm));
    for (m, k, widths) in [
        (1, 2688, [40, 56, 8]),
        (3, 128, [33, 20, 7]),
        (9, 64, [5, 70, 16]),
        (2, 48, [10, 12, 3]),
    ] {
        let n: usize = widths.iter().sum();
        let x = rng.vec(m * k, 1.0);
        let starts = [0, widths[0], widths[0] + widths[1]];
        let cols = |full: &[f32], i: usize| -> Vec<f32> {
            full.chunks(n)
                .flat_map(|row| row[starts[i]..starts[i] + widths[i]].to_vec())
                .collect()
        };
        let nv = [nvfp4_case(&mut rng, n, k)];
        let want = host(ops::nvfp4_linear(
            href.t(&x, [m, k]),
            &Nvfp4Weights::upload(&nv, &href.dev),
            Epilogue::None,
        ));
        let got = ops::nvfp4_linear3(
            arm.t(&x, [m, k]),
            &Nvfp4Weights::upload(&nv, &arm.dev),
            widths,
        );
        for (i, part) in got.into_iter().enumerate() {
            assert_eq!(part.dims(), [m, widths[i]], "nvfp4 part {i} shape");
            let name = format!("nvfp4 {m}×{k}→{widths:?} part {i}");
            close(&name, &host(part), &cols(&want, i), arm.band.lin);
        }
        if k % 16 != 0 {
            continue;
        }
        let f8 = [fp8_case(&mut rng, n, k, 2.5 / 448.0)];
        let want = host(ops::fp8_linear(
            href.t(&x, [m, k]),
            &Fp8Weights::upload(&f8, &href.dev),
            Epilogue::None,
        ));
        let got = ops::fp8_linear3(
            arm.t(&x, [m, k]),
            &Fp8Weights::upload(&f8, &arm.dev),
            widths,
        );
        for (i, part) in got.into_iter().enumerate() {
            assert_eq!(part.dims(), [m, widths[i]], "fp8 part {i} shape");
            let name = format!("fp8 {m}×{k}→{widths:?} part {i}");
            close(&name, &host(part), &cols(&want, i), arm.band.lin);
        }
    }
}

/// Routed-expert linears (NVFP4 and FP8): up-shaped (`div = k`, slots share a token's row) and
/// down-shaped (`div = 1`), decode (1 token) and prefill (9 tokens) shaped. The NVFP4 ones also
/// run expert-major on the cube arms where there are 16+ slots (grouped on the device; 18–40 slots
/// over 5 experts: groups larger than a pass of 8, and K = 2688 for three chunks per lane).
pub fn expert_linears_match(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(6, arm));
    let (e, k_top) = (5, 2);
    for (tokens, n, k, div) in [
        (1, 24, 64, 2),
        (9, 16, 48, 2),
        (9, 20, 32, 1),
        (20, 40, 64, 2),
        (16, 24, 2688, 1),
    ] {
        let slots = tokens * k_top;
        let idx = routing(&mut rng, tokens, k_top, e);
        let rows = slots / div;
        let x = rng.vec(rows * k, 1.0);
        let nv: Vec<Nvfp4Matrix> = (0..e).map(|_| nvfp4_case(&mut rng, n, k)).collect();
        let f8: Vec<Fp8Matrix> = (0..e)
            .map(|i| fp8_case(&mut rng, n, k, (2.0 + i as f32) / 448.0))
            .collect();
        for (epi, mult) in EPILOGUES {
            let want = host(ops::nvfp4_expert_linear(
                href.t(&x, [rows, k]),
                href.int(&idx),
                div,
                &Nvfp4Weights::upload(&nv, &href.dev),
                epi,
            ));
            if epi == Epilogue::None {
                // Independent of the stacking: each slot against the single-matrix reference.
                for (s, &ex) in idx.iter().enumerate() {
                    let row = &x[(s / div) * k..(s / div + 1) * k];
                    let one =
                        nemotron_kernels::reference::nvfp4_linear(row, 1, &nv[ex as usize].view());
                    assert_eq!(&want[s * n..(s + 1) * n], &one[..], "reference slot {s}");
                }
            }
            // Expert-major from 16 slots, then slot-major (the process-wide switch; both paths
            // are right, so a concurrent test that sees either stays right). Expert-major first:
            // after the slot-major run its output could land in that run's freed buffer, where a
            // slot the grouping dropped would still read right.
            for min_slots in [16, usize::MAX] {
                grouped::set_grouped_min_slots(min_slots);
                let got = host(ops::nvfp4_expert_linear(
                    arm.t(&x, [rows, k]),
                    arm.int(&idx),
                    div,
                    &Nvfp4Weights::upload(&nv, &arm.dev),
                    epi,
                ));
                let path = if slots >= min_slots && k % 32 == 0 {
                    "expert-major"
                } else {
                    "slot-major"
                };
                let name = format!("nvfp4 experts {epi:?} {slots} slots {k}→{n} div {div} {path}");
                close(&name, &got, &want, mult * arm.band.lin);
            }
            grouped::set_grouped_min_slots(grouped::GROUPED_MIN_SLOTS);
            let want = host(ops::fp8_expert_linear(
                href.t(&x, [rows, k]),
                href.int(&idx),
                div,
                &Fp8Weights::upload(&f8, &href.dev),
                epi,
            ));
            let got = host(ops::fp8_expert_linear(
                arm.t(&x, [rows, k]),
                arm.int(&idx),
                div,
                &Fp8Weights::upload(&f8, &arm.dev),
                epi,
            ));
            let name = format!("fp8 experts {epi:?} {slots} slots {k}→{n} div {div}");
            close(&name, &got, &want, mult * arm.band.lin);
        }
    }
}

/// Every E4M3 byte through the device's FP8 linear, against the format definition (NaN codes read
/// as 0 or NaN: the loader refuses them): row `r` of the weight holds code `r % 256` at column `r / 256` and zeros, the input is
/// ones with unit scales, so `y[r]` is the decoded code, exactly.
pub fn e4m3_codes_decode_as_defined(arm: &Arm) {
    // k = 4: the scalar kernel; k = 16: the vector one, the code at each of the 16 positions.
    for k in [4usize, 16] {
        let n = 256 * k;
        let mut weight = vec![0u8; n * k];
        for r in 0..n {
            weight[r * k + r / 256] = (r % 256) as u8;
        }
        let w = [Fp8Matrix {
            out_features: n,
            in_features: k,
            weight,
            weight_scale: 1.0,
            input_scale: 1.0,
        }];
        let got = host(ops::fp8_linear(
            arm.t(&vec![1.0; k], [1, k]),
            &Fp8Weights::upload(&w, &arm.dev),
            Epilogue::None,
        ));
        for (r, &g) in got.iter().enumerate() {
            let b = (r % 256) as u8;
            if fmt::e4m3_is_nan(b) {
                // The loader refuses NaN weights; the bit decoder reads them 0, the hardware
                // conversion (CUDA) NaN.
                assert!(g == 0.0 || g.is_nan(), "E4M3 NaN code {b:#04x} read {g}");
                continue;
            }
            let want = fmt::e4m3_to_f32(b);
            // bf16 activations round the output once (E4M3 values have 4 significant bits: exact).
            assert_eq!(g, want, "E4M3 code {b:#04x} at column {} of {k}", r / 256);
        }
    }
}

/// Every E2M1 code in every nibble position through the device's NVFP4 linear against the format
/// definition: row `r` holds code `r % 16` at column `r / 16` and zeros, with unit block and
/// global scales; the input is ones, so `y[r]` is the decoded code.
pub fn e2m1_codes_decode_as_defined(arm: &Arm) {
    let one = 0x38u8; // E4M3 1.0
                      // k = 16: the scalar kernel; k = 32: the vector one (every nibble of all four words).
    for k in [16usize, 32] {
        let n = 16 * k;
        let mut packed = vec![0u8; n * k / 2];
        for r in 0..n {
            let (code, col) = ((r % 16) as u8, r / 16);
            packed[r * k / 2 + col / 2] = if col % 2 == 0 { code } else { code << 4 };
        }
        let w = [Nvfp4Matrix {
            out_features: n,
            in_features: k,
            packed,
            block_scales: vec![one; n * k / 16],
            global_scale: 1.0,
        }];
        let got = host(ops::nvfp4_linear(
            arm.t(&vec![1.0; k], [1, k]),
            &Nvfp4Weights::upload(&w, &arm.dev),
            Epilogue::None,
        ));
        for (r, &g) in got.iter().enumerate() {
            assert_eq!(
                g,
                fmt::e2m1_to_f32((r % 16) as u8),
                "E2M1 code {} at column {} of {k}",
                r % 16,
                r / 16
            );
        }
    }
}

/// The batched linears with the tensor-core path on and off (it runs where the arm has it: CUDA
/// bf16; elsewhere every pass takes the GEMVs), against the reference: NVFP4 plain (rows from 1:
/// one to eight token tiles per pass, ragged tiles, output rows not a multiple of 16, `k = 1856`
/// whose last 128-input step is half empty), NVFP4 routed experts (grouped by expert, groups of
/// 1–20 slots), FP8 plain into three parts (Mamba's `in_proj`) and plain with relu², dense bf16.
pub fn mma_linears_match(arm: &Arm) {
    mma_linears_under(arm, Tunings::Rounds);
}

/// [`mma_linears_match`] under cubes of one and two warps splitting K (`k_warps`), unwidened and
/// widened (CUDA bf16 only: elsewhere every pass is a GEMV).
pub fn mma_linears_k_warps_match(arm: &Arm) {
    mma_linears_under(arm, Tunings::KWarps);
}

/// [`mma_linears_match`]'s tiled and GEMM paths under their other shapes (CUDA bf16 only).
pub fn mma_linears_tiled_match(arm: &Arm) {
    mma_linears_under(arm, Tunings::Tiled);
}

/// The tensor-core tunings a test runs the linears under, split so each CUDA test stays within
/// a device call (the bf16 test under every tuning took 392–449 s on an H100 before the split).
#[derive(Clone, Copy, PartialEq)]
enum Tunings {
    /// The default, then the load rounds and accumulations (bf16 arms).
    Rounds,
    /// Cubes of fewer warps splitting K.
    KWarps,
    /// The tiled kernels' shapes.
    Tiled,
}

fn mma_linears_under(arm: &Arm, which: Tunings) {
    use nemotron_kernels::cube::plans::linear as mma;
    let bf16 = arm.dtype == burn::tensor::DType::BF16;
    assert!(
        which == Tunings::Rounds || bf16,
        "the tensor-core tunings run on bf16 arms only"
    );
    // The load rounds of the tensor-core kernels (default; pipelined at groups 1 and 4), the
    // latter two with the FP8 kernel's other accumulation (in the `mma` or per `k32` step):
    // they apply to bf16 arms only (elsewhere every pass is a GEMV, so once is enough).
    let mut tunings = vec![mma::MmaTuning::default()];
    if bf16 {
        // The second and fourth decode NVFP4 the other way (`bf16_decode`). Each also with the
        // plain FP8 and dense cubes' warps over another count of row tiles
        // (`m_warps`; it takes effect in the two unwidened tunings: the small grids here would
        // otherwise widen, and a widened cube keeps one tile).
        tunings.push(mma::MmaTuning {
            group: 4,
            pipe: true,
            widen: true,
            threads: mma::TARGET_THREADS,
            fp8_direct: !mma::FP8_DIRECT,
            m_warps: if mma::M_WARPS == 2 { 4 } else { 2 },
            bf16_decode: !mma::BF16_DECODE,
            ..mma::MmaTuning::default()
        });
        tunings.push(mma::MmaTuning {
            group: 1,
            pipe: true,
            widen: false,
            threads: mma::TARGET_THREADS,
            fp8_direct: !mma::FP8_DIRECT,
            m_warps: if mma::M_WARPS == 4 { 1 } else { 4 },
            ..mma::MmaTuning::default()
        });
        tunings.push(mma::MmaTuning {
            widen: false,
            m_warps: if mma::M_WARPS == 2 { 1 } else { 2 },
            bf16_decode: !mma::BF16_DECODE,
            ..mma::MmaTuning::default()
        });
    }
    if which == Tunings::KWarps {
        // Cubes of one and two warps splitting K (`k_warps`), unwidened and widened.
        tunings = [(1, false), (2, true)]
            .into_iter()
            .map(|(k_warps, widen)| mma::MmaTuning {
                k_warps,
                widen,
                ..mma::MmaTuning::default()
            })
            .collect();
    }
    // The tiled kernels' other shapes (bf16 only; the tiled and GEMM paths alone): 4 or 8 warps (64 or
    // 128 weight rows), up to 4, 8 or 16 token tiles, one or two 16-row fragments per warp, one
    // or two staging buffers, 1–4 cube rows per expert; every other one decoding NVFP4 the other
    // way (in bf16 alone, or through f16 and f32), every third accumulating FP8 the other way.
    let mut tiled = vec![];
    if which == Tunings::Tiled {
        // With them the FP8 GEMM's shapes: 2 or 4 warps along tokens, 1 or 2 groups per step.
        for (i, (tile_warps, tile_tiles, tile_frags, tile_buffers, tile_parts)) in [
            (4, 8, 1, 1, 1),
            (8, 8, 1, 2, 2),
            (8, 16, 1, 2, 1),
            (4, 16, 1, 1, 3),
            (4, 8, 2, 2, 1),
            (8, 8, 2, 1, 4),
            (8, 16, 2, 1, 1),
            (8, 4, 2, 2, 2),
            (4, 4, 2, 1, 1),
            (4, 16, 2, 2, 1),
        ]
        .into_iter()
        .enumerate()
        {
            tiled.push(mma::MmaTuning {
                tile_warps,
                tile_tiles,
                tile_frags,
                tile_buffers,
                tile_parts,
                gemm_warps_n: [2, 4][i % 2],
                gemm_steps: [1, 2][(i / 2) % 2],
                bf16_decode: (i % 2 == 1) != mma::BF16_DECODE,
                fp8_direct: (i % 3 == 0) != mma::FP8_DIRECT,
                ..mma::MmaTuning::default()
            });
        }
    }
    if which == Tunings::Tiled {
        tunings.clear();
    }
    for (t, tiled_only) in tunings
        .into_iter()
        .map(|t| (t, false))
        .chain(tiled.into_iter().map(|t| (t, true)))
    {
        eprintln!("tensor-core tuning {t:?}");
        mma::set_tuning(t).expect("a valid tuning");
        mma_linears_case(arm, tiled_only);
    }
    mma::set_tuning(mma::MmaTuning::default()).expect("the default tuning");
}

fn mma_linears_case(arm: &Arm, tiled_only: bool) {
    use nemotron_kernels::cube::plans::linear as mma;
    let (href, mut rng) = (Arm::host(), Rng::new(31, arm));
    let saved = mma::mma();
    // (name, plain rows from, grouped routed slots from, FP8 rows quantized in-kernel up to,
    // tiled NVFP4 and FP8 from, FP8 GEMM from).
    let paths = [
        (
            "tensor cores",
            1usize,
            1usize,
            8usize,
            usize::MAX,
            usize::MAX,
        ),
        ("tensor cores tiled", 1, 1, 8, 1, usize::MAX),
        ("tensor cores FP8 GEMM", 1, 1, 0, usize::MAX, 1),
        (
            "tensor cores slot-major, FP8 rows quantized apart",
            1,
            usize::MAX,
            0,
            usize::MAX,
            usize::MAX,
        ),
        ("GEMV", usize::MAX, usize::MAX, 0, usize::MAX, usize::MAX),
    ];
    let paths: Vec<_> = paths
        .into_iter()
        .filter(|p| !tiled_only || p.0.starts_with("tensor cores tiled") || p.0.ends_with("GEMM"))
        .map(|(name, rows, slots, inq, tile, gemm)| (name, rows, slots, (inq, tile, gemm)))
        .collect();
    let set = |rows: usize, slots: usize, (inq, tile, gemm): (usize, usize, usize)| {
        mma::set_mma_min(rows, slots);
        mma::set_mma(mma::MmaMin {
            tile,
            fp8_tile: tile,
            fp8_gemm: gemm,
            ..mma::mma()
        });
        mma::set_fp8_inq_max(inq);
    };
    for (m, n, k) in [
        (1, 40, 1856),
        (2, 24, 2688),
        (4, 40, 1856),
        (13, 33, 2688),
        (16, 50, 64),
        (37, 24, 128),
        (70, 16, 96),
        // Past one block of rows (grid y): 3 blocks, the last ragged.
        (150, 24, 256),
    ] {
        let w = [nvfp4_case(&mut rng, n, k)];
        let x = rng.vec(m * k, 1.0);
        for (epi, mult) in EPILOGUES {
            let want = host(ops::nvfp4_linear(
                href.t(&x, [m, k]),
                &Nvfp4Weights::upload(&w, &href.dev),
                epi,
            ));
            for (path, rows, slots, knobs) in paths.iter().copied() {
                set(rows, slots, knobs);
                let got = host(ops::nvfp4_linear(
                    arm.t(&x, [m, k]),
                    &Nvfp4Weights::upload(&w, &arm.dev),
                    epi,
                ));
                let name = format!("nvfp4 {path} {epi:?} {m}×{k}→{n}");
                close(&name, &got, &want, mult * arm.band.lin);
            }
        }
    }
    let (e, k_top) = (6, 3);
    for (tokens, n, k, div) in [
        (12, 24, 1856, 3),
        (40, 40, 64, 1),
        // About 100 slots per expert: 16 token tiles per pass where the tuning allows, ragged.
        (200, 40, 128, 1),
        (5, 17, 2688, 3),
        (1, 24, 2688, 3),
    ] {
        let slots = tokens * k_top;
        let idx = routing(&mut rng, tokens, k_top, e);
        let rows = slots / div;
        let x = rng.vec(rows * k, 1.0);
        let nv: Vec<Nvfp4Matrix> = (0..e).map(|_| nvfp4_case(&mut rng, n, k)).collect();
        for (epi, mult) in EPILOGUES {
            let want = host(ops::nvfp4_expert_linear(
                href.t(&x, [rows, k]),
                href.int(&idx),
                div,
                &Nvfp4Weights::upload(&nv, &href.dev),
                epi,
            ));
            for (path, rows_min, slots_min, knobs) in paths.iter().copied() {
                set(rows_min, slots_min, knobs);
                let got = host(ops::nvfp4_expert_linear(
                    arm.t(&x, [rows, k]),
                    arm.int(&idx),
                    div,
                    &Nvfp4Weights::upload(&nv, &arm.dev),
                    epi,
                ));
                let name = format!("nvfp4 experts {path} {epi:?} {slots} slots {k}→{n} div {div}");
                close(&name, &got, &want, mult * arm.band.lin);
            }
        }
    }
    for (m, k, widths) in [
        (1, 2688, [40, 56, 8]),
        (2, 4096, [16, 8, 24]),
        (5, 2688, [40, 56, 8]),
        (16, 48, [5, 70, 16]),
        (33, 4096, [24, 8, 9]),
        (150, 256, [16, 8, 24]),
        // Quantized apart (past the in-kernel rows) with a ragged last step of the tiled
        // kernel (168 chunks: 10.5 steps of 16).
        (20, 2688, [40, 56, 8]),
        // The FP8 GEMM past one cube tile both ways (128 rows × 128 tokens), both ragged, and
        // a last step of one chunk (17 chunks: 4.25 steps of 4).
        (300, 272, [130, 60, 100]),
    ] {
        let n: usize = widths.iter().sum();
        let x = rng.vec(m * k, 3.0);
        let f8 = [fp8_case(&mut rng, n, k, 2.5 / 448.0)];
        let starts = [0, widths[0], widths[0] + widths[1]];
        for (epi, mult) in EPILOGUES {
            let want = host(ops::fp8_linear(
                href.t(&x, [m, k]),
                &Fp8Weights::upload(&f8, &href.dev),
                epi,
            ));
            for (path, rows, slots, knobs) in paths.iter().copied() {
                set(rows, slots, knobs);
                let got = host(ops::fp8_linear(
                    arm.t(&x, [m, k]),
                    &Fp8Weights::upload(&f8, &arm.dev),
                    epi,
                ));
                close(
                    &format!("fp8 {path} {epi:?} {m}×{k}→{n}"),
                    &got,
                    &want,
                    mult * arm.band.lin,
                );
                if epi != Epilogue::None {
                    continue;
                }
                let parts = ops::fp8_linear3(
                    arm.t(&x, [m, k]),
                    &Fp8Weights::upload(&f8, &arm.dev),
                    widths,
                );
                for (i, part) in parts.into_iter().enumerate() {
                    let cols: Vec<f32> = want
                        .chunks(n)
                        .flat_map(|row| row[starts[i]..starts[i] + widths[i]].to_vec())
                        .collect();
                    let name = format!("fp8 {path} {m}×{k}→{widths:?} part {i}");
                    close(&name, &host(part), &cols, arm.band.lin);
                }
            }
        }
    }
    // Dense bf16 (attention projections): `k = 72` leaves a ragged last step.
    for (m, n, k) in [
        (1, 40, 2688),
        (5, 40, 2688),
        (19, 33, 72),
        (64, 24, 4096),
        (150, 33, 72),
    ] {
        let x = rng.vec(m * k, 1.0);
        let w = rng.vec(n * k, 0.05);
        let want = host(ops::dense_linear(href.t(&x, [m, k]), href.t(&w, [n, k])));
        for (path, rows, slots, knobs) in paths.iter().copied() {
            set(rows, slots, knobs);
            let got = host(ops::dense_linear(arm.t(&x, [m, k]), arm.t(&w, [n, k])));
            close(
                &format!("dense {path} {m}×{k}→{n}"),
                &got,
                &want,
                arm.band.lin,
            );
        }
    }
    mma::set_mma(saved);
    mma::set_fp8_inq_max(mma::FP8_INQ_MAX_ROWS);
}

/// Mamba2's gated output norm folded into an FP8 `out_proj` (`fp8_gated_linear`) against the
/// two ops on this arm and against the host: one row (CUDA bf16 computes the norm in the
/// tensor-core kernel's prologue: the Lightning shape 4096→2688 in 8 groups, one group of 512,
/// groups of 256) and where the fused form does not apply (three rows; groups of 96 channels),
/// so both the prologue and the fallback are checked. The inputs are scaled so that the
/// normalized values saturate some E4M3 codes.
pub fn fp8_gated_linear_matches(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(21, arm));
    for (m, k, groups, n) in [
        (1, 4096, 8, 2688),
        (1, 512, 1, 40),
        (1, 1024, 4, 96),
        (3, 1024, 4, 96),
        (1, 384, 4, 40),
        // Rows past those quantized inside the `mma` kernel: on bf16 CUDA the norm writes the
        // E4M3 codes for the tensor-core kernel (`fp8_gated_rows`), one word per unit (groups
        // of 512) and two (one group of 1,024), the last row tile ragged.
        (40, 4096, 8, 96),
        (37, 1024, 1, 40),
    ] {
        let w = [fp8_case(&mut rng, n, k, 1.5 / 448.0)];
        let x = rng.vec(m * k, 2.0);
        let z = rng.vec(m * k, 3.0);
        let nw: Vec<f32> = rng.vec(k, 1.0).iter().map(|v| rng.round(1.0 + v)).collect();
        let eps = 1e-5;
        // `round`: the reference rounds the normalized input to the arm's activation dtype, as
        // the arm stores it; otherwise a bf16 rounding flips E4M3 codes (1/16 apart) and the
        // f32 reference is no longer the same computation.
        let run = |a: &Arm, fused: bool, round: bool| {
            let wt = Fp8Weights::upload(&w, &a.dev);
            let (xt, zt, nt) = (a.t(&x, [m, k]), a.t(&z, [m, k]), a.t(&nw, [k]));
            host(if fused {
                ops::fp8_gated_linear(xt, zt, nt, groups, eps, &wt)
            } else {
                let mut u = ops::rms_norm(xt, Some(zt), nt, groups, eps);
                if round {
                    let v: Vec<f32> = host(u).iter().map(|&v| rng.round(v)).collect();
                    u = a.t(&v, [m, k]);
                }
                ops::fp8_linear(u, &wt, Epilogue::None)
            })
        };
        let name = format!("fp8_gated_linear {m}×{k}→{n}, {groups} groups");
        let (got, apart) = (run(arm, true, false), run(arm, false, false));
        let want = run(&href, false, true);
        close(
            &format!("{name} == norm + linear"),
            &got,
            &apart,
            arm.band.lin,
        );
        close(&name, &got, &want, arm.band.lin);
    }
}

/// Routed experts past the one-cube grouping (1,080 slots > `MMA_MAX_SLOTS`): on bf16 CUDA the
/// slots are sorted by expert on the device and each expert's tile runs on the tensor cores
/// over its own tokens; elsewhere the GEMVs run. Expert 0 is chosen by every token, expert 6 by
/// one token only, expert 7 by none; the others at random. Then the same slots slot-major (one
/// cube row per slot, the rows folded past the grid's y limit on no device here, but through
/// the same index arithmetic).
pub fn grouped_experts_match(arm: &Arm) {
    use nemotron_kernels::cube::plans::linear as mma;
    let (href, mut rng) = (Arm::host(), Rng::new(41, arm));
    let (e, k_top, tokens, n, k) = (8usize, 3usize, 360usize, 24usize, 64usize);
    assert!(tokens * k_top > mma::MMA_MAX_SLOTS);
    let mut idx = Vec::with_capacity(tokens * k_top);
    for t in 0..tokens {
        idx.push(0i64);
        let mut chosen = vec![0i64];
        if t == 5 {
            chosen.push(6);
            idx.push(6);
        }
        while chosen.len() < k_top {
            let c = 1 + (((rng.next() + 1.0) * 0.5 * 5.0) as i64).min(4);
            if !chosen.contains(&c) {
                chosen.push(c);
                idx.push(c);
            }
        }
    }
    let x = rng.vec(tokens * k, 1.0);
    let nv: Vec<Nvfp4Matrix> = (0..e).map(|_| nvfp4_case(&mut rng, n, k)).collect();
    let saved = mma::mma();
    for (epi, mult) in EPILOGUES {
        let want = host(ops::nvfp4_expert_linear(
            href.t(&x, [tokens, k]),
            href.int(&idx),
            k_top,
            &Nvfp4Weights::upload(&nv, &href.dev),
            epi,
        ));
        for (path, slots_min, tile) in [
            ("grouped", 1usize, usize::MAX),
            ("grouped tiled", 1, 1),
            ("slot-major", usize::MAX, usize::MAX),
        ] {
            mma::set_mma_min(1, slots_min);
            mma::set_mma(mma::MmaMin {
                tile,
                tile_slots: tile,
                ..mma::mma()
            });
            let got = host(ops::nvfp4_expert_linear(
                arm.t(&x, [tokens, k]),
                arm.int(&idx),
                k_top,
                &Nvfp4Weights::upload(&nv, &arm.dev),
                epi,
            ));
            let name = format!("nvfp4 experts {path} {epi:?} {} slots", idx.len());
            close(&name, &got, &want, mult * arm.band.lin);
        }
    }
    mma::set_mma(saved);
}

/// The decoded path (`fp8mm`, `nvfp4mm`: weights decoded into the activation type, cubek's
/// tiled matmul into f32, the scales and epilogue after) against the host reference: NVFP4 and
/// FP8 plain rows with both epilogues, an FP8 split into three parts (`in_proj`) and the gated
/// norm's fallback (`out_proj`), through every cubek kernel of [`TiledKernel::ALL`]. The unit kernel runs on
/// every device and must never be refused; a tensor-core kernel a device refuses is named and
/// counted (the call then runs on the next path, which the other tests check), never passed
/// silently; on CUDA the default kernel must run.
/// The band's factor for products summed in the activation type (`mmacc=act`) over `k` inputs:
/// each add rounds the running sum to bf16, and those roundings add up as a random walk, so the
/// error grows as `√k` relative to 256 inputs; below that it does not shrink under twice the
/// band, since the sum's roundings are relative to partial sums that can exceed the output's
/// values (the output's own rounding alone takes one band). Measured on CUDA: 9×256 at 0.5–0.7
/// of the band (H200, session 32), 70×2688 at 1.5 (inside √10.5 = 3.2), 130×128 at 1.1 (H100,
/// session 33, inside 2). A decode or scale error is off by far more: a block scale read from
/// the wrong block put 9×256 off by 12 % of the output scale, where this factor allows 0.78 %
/// there and 1.25 % at 2,688 inputs.
fn acc_band(f32_acc: bool, k: usize) -> f32 {
    if f32_acc {
        1.0
    } else {
        (k as f32 / 256.0).sqrt().max(2.0)
    }
}

pub fn fp8_decoded_linear_matches(arm: &Arm) {
    use nemotron_kernels::cube::plans::matmul::{tiled_refusals, TiledKernel};
    use nemotron_kernels::cube::settings::Settings;
    let (href, mut rng) = (Arm::host(), Rng::new(57, arm));
    let saved = Settings::current();
    let cases = [(1, 50, 64), (9, 24, 256), (70, 40, 2688), (130, 96, 128)];
    let mut refused = vec![];
    // Every kernel with f32 products; the unit and default kernels also with products in the
    // activation type (`mmacc=act`).
    let runs = TiledKernel::ALL
        .iter()
        .map(|&(name, k)| (name, k, true))
        .chain([
            ("unit", TiledKernel::Unit, false),
            (
                Settings::default().tiled.name(),
                Settings::default().tiled,
                false,
            ),
        ]);
    for (name, kernel, f32_acc) in runs {
        let name = if f32_acc {
            name.to_string()
        } else {
            format!("{name}, mmacc=act")
        };
        let name = name.as_str();
        let mut s = saved.clone();
        s.min.fp8_mm = 1;
        s.min.nvfp4_mm = 1;
        s.tiled = kernel;
        s.tiled_f32 = f32_acc;
        s.apply().expect("the decoded path's settings apply");
        let before = tiled_refusals();
        // NVFP4 (plain): E2M1 · block scale decoded, the global scale after.
        for (m, n, k) in [(9, 24, 256), (70, 40, 2688)] {
            let w = [nvfp4_case(&mut rng, n, k)];
            let x = rng.vec(m * k, 1.0);
            for (epi, mult) in EPILOGUES {
                let want = host(ops::nvfp4_linear(
                    href.t(&x, [m, k]),
                    &Nvfp4Weights::upload(&w, &href.dev),
                    epi,
                ));
                let got = host(ops::nvfp4_linear(
                    arm.t(&x, [m, k]),
                    &Nvfp4Weights::upload(&w, &arm.dev),
                    epi,
                ));
                close(
                    &format!("nvfp4 decoded ({name}) {epi:?} {m}×{k}→{n}"),
                    &got,
                    &want,
                    mult * arm.band.lin * acc_band(f32_acc, k),
                );
            }
        }
        for &(m, n, k) in &cases {
            let w = [fp8_case(&mut rng, n, k, 2.5 / 448.0)];
            let x = rng.vec(m * k, 3.0);
            for (epi, mult) in EPILOGUES {
                let want = host(ops::fp8_linear(
                    href.t(&x, [m, k]),
                    &Fp8Weights::upload(&w, &href.dev),
                    epi,
                ));
                let got = host(ops::fp8_linear(
                    arm.t(&x, [m, k]),
                    &Fp8Weights::upload(&w, &arm.dev),
                    epi,
                ));
                close(
                    &format!("fp8 decoded ({name}) {epi:?} {m}×{k}→{n}"),
                    &got,
                    &want,
                    mult * arm.band.lin * acc_band(f32_acc, k),
                );
            }
        }
        // Into three parts, as Mamba's in_proj.
        let (m, k, widths) = (33, 256, [40, 56, 8]);
        let n: usize = widths.iter().sum();
        let w = [fp8_case(&mut rng, n, k, 2.5 / 448.0)];
        let x = rng.vec(m * k, 3.0);
        let want = host(ops::fp8_linear(
            href.t(&x, [m, k]),
            &Fp8Weights::upload(&w, &href.dev),
            Epilogue::None,
        ));
        let parts = ops::fp8_linear3(arm.t(&x, [m, k]), &Fp8Weights::upload(&w, &arm.dev), widths);
        let mut start = 0;
        for (i, p) in parts.into_iter().enumerate() {
            let cols: Vec<f32> = want
                .chunks(n)
                .flat_map(|row| row[start..start + widths[i]].to_vec())
                .collect();
            close(
                &format!("fp8 decoded ({name}) part {i} of {m}×{k}→{widths:?}"),
                &host(p),
                &cols,
                arm.band.lin,
            );
            start += widths[i];
        }
        // The gated norm into out_proj: the norm apart, then the decoded linear.
        let (m, k, groups, n) = (40, 1024, 4, 96);
        let w = [fp8_case(&mut rng, n, k, 1.5 / 448.0)];
        let (x, z) = (rng.vec(m * k, 2.0), rng.vec(m * k, 3.0));
        let nw: Vec<f32> = rng.vec(k, 1.0).iter().map(|v| rng.round(1.0 + v)).collect();
        let got = host(ops::fp8_gated_linear(
            arm.t(&x, [m, k]),
            arm.t(&z, [m, k]),
            arm.t(&nw, [k]),
            groups,
            1e-5,
            &Fp8Weights::upload(&w, &arm.dev),
        ));
        let u = host(ops::rms_norm(
            href.t(&x, [m, k]),
            Some(href.t(&z, [m, k])),
            href.t(&nw, [k]),
            groups,
            1e-5,
        ));
        let u: Vec<f32> = u.iter().map(|&v| rng.round(v)).collect();
        let want = host(ops::fp8_linear(
            href.t(&u, [m, k]),
            &Fp8Weights::upload(&w, &href.dev),
            Epilogue::None,
        ));
        close(
            &format!("fp8 decoded ({name}) gated {m}×{k}→{n}"),
            &got,
            &want,
            arm.band.lin,
        );
        if tiled_refusals() != before {
            eprintln!("fp8 decoded: cubek's {name} kernel refused on this device");
            refused.push(name.to_string());
        }
    }
    saved.apply().expect("the settings in force apply again");
    eprintln!("fp8 decoded: refused {refused:?}");
    let refused: Vec<&str> = refused.iter().map(String::as_str).collect();
    assert!(
        !refused.iter().any(|r| r.starts_with("unit")),
        "the unit kernel was refused"
    );
    let cuda = format!("{:?}", arm.dev).to_lowercase().contains("cuda");
    if cuda && arm.dtype == burn::tensor::DType::BF16 {
        let default = Settings::default().tiled.name();
        assert!(
            !refused.contains(&default),
            "the default kernel {default} was refused"
        );
    }
}
