//! The Mamba2 ops: `softplus(dt + bias)`, the causal conv and the selective scan (ragged batches,
//! carried state).

use super::{close, host, Arm, Rng};
use nemotron_kernels::ops;

/// Held by every scan test for its whole body: two of them change the scan's process-wide
/// settings (pairs, chunks), which would otherwise leak into the others' runs on parallel
/// test threads (every path then gives the same numbers, but not the path a test names).
static SCAN_SETTINGS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn scan_lock() -> std::sync::MutexGuard<'static, ()> {
    SCAN_SETTINGS.lock().unwrap_or_else(|e| e.into_inner())
}

/// With and without the clamp, over a range that exercises both softplus branches.
pub fn dt_softplus_matches(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(9, arm));
    let (b, tt, h) = (2, 5, 12);
    let dt = rng.vec(b * tt * h, 25.0);
    let bias = rng.vec(h, 4.0);
    for min in [None, Some(1e-3f32)] {
        let run = |a: &Arm| host(ops::dt_softplus(a.t(&dt, [b, tt, h]), a.t(&bias, [h]), min));
        close(
            &format!("dt softplus min {min:?}"),
            &run(arm),
            &run(&href),
            arm.band.lin,
        );
    }
}

pub fn conv_matches(arm: &Arm) {
    // Ragged, and every sequence full (the kernels then run without a lengths buffer).
    conv_case(arm, 3, (9, 20, 4), &[vec![9, 1, 5], vec![9, 9, 9]]);
}

/// A long prompt over many channels (`2 · 3,840 · 1,103` ≈ 8.47 M outputs and state entries,
/// past one grid row of 65,535 elementwise cubes): 30 channel blocks, 138 time blocks per
/// sequence (the last ragged), the second sequence 63 tokens shorter.
pub fn conv_long_matches(arm: &Arm) {
    conv_case(arm, 7, (1100, 3840, 4), &[vec![1100, 1037]]);
}

fn conv_case(arm: &Arm, seed: u64, (tm, c, k): (usize, usize, usize), cases: &[Vec<usize>]) {
    let (href, mut rng) = (Arm::host(), Rng::new(seed, arm));
    for lens in cases {
        let b = lens.len();
        let x = rng.vec(b * tm * c, 1.0);
        let w = rng.vec(c * k, 0.5);
        let bias = rng.vec(c, 0.5);
        let st = rng.vec(b * c * (k - 1), 1.0);
        for with_bias in [true, false] {
            let run = |a: &Arm| {
                let (y, s) = ops::causal_conv1d(
                    a.t(&x, [b, tm, c]),
                    a.t(&w, [c, k]),
                    with_bias.then(|| a.t(&bias, [c])),
                    a.t(&st, [b, c, k - 1]),
                    lens,
                );
                (host(y), host(s))
            };
            let ((gy, gs), (ry, rs)) = (run(arm), run(&href));
            // Padding rows are unspecified: compare the valid ones.
            for (bb, &len) in lens.iter().enumerate() {
                let s = bb * tm * c;
                let name = format!("conv y seq {bb} lens {lens:?} bias {with_bias}");
                close(
                    &name,
                    &gy[s..s + len * c],
                    &ry[s..s + len * c],
                    arm.band.lin,
                );
            }
            close(&format!("conv state lens {lens:?}"), &gs, &rs, arm.band.lin);
            // The same conv written as three dense tensors (`x`, `B`, `C`): each part equals
            // its channels of the reference's one output, and the state is the same.
            let widths = [c / 2 + 1, c / 4, c - c / 2 - 1 - c / 4];
            let (parts, s3) = ops::causal_conv1d3(
                arm.t(&x, [b, tm, c]),
                arm.t(&w, [c, k]),
                with_bias.then(|| arm.t(&bias, [c])),
                arm.t(&st, [b, c, k - 1]),
                lens,
                widths,
            );
            let mut c0 = 0;
            for (pi, (part, wd)) in parts.into_iter().zip(widths).enumerate() {
                assert_eq!(part.dims(), [b, tm, wd], "conv part {pi} shape");
                let got = host(part);
                let (mut gv, mut rv) = (vec![], vec![]);
                for (bb, &len) in lens.iter().enumerate() {
                    for tt in 0..len {
                        let (g0, r0) = ((bb * tm + tt) * wd, (bb * tm + tt) * c + c0);
                        gv.extend_from_slice(&got[g0..g0 + wd]);
                        rv.extend_from_slice(&ry[r0..r0 + wd]);
                    }
                }
                let name = format!("conv part {pi} lens {lens:?} bias {with_bias}");
                close(&name, &gv, &rv, arm.band.lin);
                c0 += wd;
            }
            close(
                &format!("conv3 state lens {lens:?}"),
                &host(s3),
                &rs,
                arm.band.lin,
            );
        }
    }
}

/// The scan at small shapes: `N = 16` (the register-row kernel, one partial tile) and `N = 12`
/// (not a multiple of its lanes: the sequential kernel).
pub fn scan_matches(arm: &Arm) {
    let _settings = scan_lock();
    for n in [16, 12] {
        scan_case(arm, 4, (11, 4, 8, 2, n), &[vec![11, 4], vec![11, 11]]);
    }
    // New sequences: no state given, the zero state taken.
    scan_case_from(arm, 5, (11, 4, 8, 2, 16), &[vec![11, 0, 3]], false);
}

/// The register-row scan over several staged tiles: a length past two tiles and not a multiple
/// of one, lengths 0 (the state copied through), 1, and one tile plus one; `P = 20` (a partial
/// block of rows), `N = 128` (the Lightning state: 16 entries per lane, tiles of 16 steps)
/// and `N = 256` (tiles of 8).
pub fn scan_tiles_match(arm: &Arm) {
    let _settings = scan_lock();
    use nemotron_kernels::cube::plans::scan::{plan, Chunking, ScanPath, PAIR_MIN_ROWS};
    let never = Chunking {
        len: 128,
        max_rows: 0,
    };
    let m = PAIR_MIN_ROWS;
    // By default 16 x 128 of the Lightning geometry (65,536 rows) pairs, a 1K prompt not.
    assert_eq!(
        plan(128, 16 * 64 * 64, 128, PAIR_MIN_ROWS, never),
        ScanPath::Rows {
            per: 16,
            tile: 16,
            pair: 2,
            chunks: None,
        }
    );
    assert_eq!(
        plan(128, 4_096, 1024, m, never),
        ScanPath::Rows {
            per: 16,
            tile: 16,
            pair: 1,
            chunks: None,
        }
    );
    assert_eq!(
        plan(128, 64 * 64 * 64, 128, m, never),
        ScanPath::Rows {
            per: 16,
            tile: 16,
            pair: 2,
            chunks: None,
        }
    );
    assert_eq!(
        plan(256, 1, 8, m, never),
        ScanPath::Rows {
            per: 32,
            tile: 8,
            pair: 1,
            chunks: None,
        }
    );
    assert_eq!(
        plan(12, usize::MAX, 1024, m, Chunking::default()),
        ScanPath::Sequential
    );
    let lens = [vec![75, 0, 33, 1]];
    scan_case(arm, 5, (75, 3, 20, 1, 128), &lens);
    scan_case(arm, 6, (40, 2, 16, 2, 256), &[vec![40, 17]]);
}

/// The scan chunked over time (forced at these small sizes): chunks of 1, 5 and 16 steps over
/// ragged lengths (a sequence ending inside a chunk, one of length 0, one of length 1, one
/// shorter than a chunk), `N = 128` with tiles of 16 inside chunks of 40, `N = 16`, and pairs
/// of rows in the chunk-local pass. The plan: where the default chunks (a 1K prompt of the
/// Lightning geometry) and where not (16 × 128, one chunk, a state of `N` not a multiple of 8),
/// and longer chunks past the byte budget for the chunk end states.
pub fn scan_chunks_match(arm: &Arm) {
    let _settings = scan_lock();
    use nemotron_kernels::cube::plans::scan::{
        chunking, pair_min, plan, set_chunking, set_pair_min, Chunking, Chunks, ScanPath,
        CHUNK_STATE_BYTES, PAIR_MIN_ROWS,
    };
    let def = Chunking::default();
    let rows_of = |r: ScanPath| match r {
        ScanPath::Rows { chunks, .. } => chunks,
        ScanPath::Sequential => None,
    };
    assert_eq!(
        rows_of(plan(128, 64 * 64, 1024, PAIR_MIN_ROWS, def)),
        Some(Chunks { len: 128, count: 8 })
    );
    assert_eq!(
        rows_of(plan(128, 16 * 64 * 64, 128, PAIR_MIN_ROWS, def)),
        None
    );
    assert_eq!(rows_of(plan(128, 64 * 64, 128, PAIR_MIN_ROWS, def)), None);
    assert_eq!(
        rows_of(plan(128, 64 * 64, 129, PAIR_MIN_ROWS, def)),
        Some(Chunks { len: 128, count: 2 })
    );
    assert_eq!(plan(12, 4, 1024, PAIR_MIN_ROWS, def), ScanPath::Sequential);
    // 4,096 rows of 128 f32: 2 MiB per chunk, so at most 128 chunks within the budget.
    let most = CHUNK_STATE_BYTES / (64 * 64 * 128 * 4);
    let long = rows_of(plan(128, 64 * 64, 1 << 20, PAIR_MIN_ROWS, def)).unwrap();
    assert!(
        long.count <= most && long.len * long.count >= 1 << 20,
        "{long:?}"
    );
    let (saved, saved_pair) = (chunking(), pair_min());
    for (len, pair) in [(5, usize::MAX), (1, usize::MAX), (16, 1), (40, usize::MAX)] {
        set_chunking(Chunking {
            len,
            max_rows: usize::MAX,
        })
        .unwrap();
        set_pair_min(pair);
        scan_case(arm, 10, (75, 3, 20, 1, 128), &[vec![75, 0, 33, 1]]);
        scan_case(arm, 11, (23, 4, 8, 2, 16), &[vec![23, 4], vec![23, 23]]);
    }
    set_chunking(saved).unwrap();
    set_pair_min(saved_pair);
    assert!(set_chunking(Chunking {
        len: 0,
        max_rows: 1
    })
    .is_err());
}

/// The register-row scan with two state rows per lane (forced at these small sizes): `P = 20`
/// (one cube of 32 rows, its second rows partly past `P`), `P = 40` (a full cube and a partial
/// one), ragged lengths over several tiles, `N = 128` and `N = 16`.
pub fn scan_pairs_match(arm: &Arm) {
    let _settings = scan_lock();
    use nemotron_kernels::cube::plans::scan::{pair_min, set_pair_min};
    let saved = pair_min();
    set_pair_min(1);
    scan_case(arm, 7, (75, 3, 20, 1, 128), &[vec![75, 0, 33, 1]]);
    scan_case(arm, 8, (21, 2, 40, 2, 128), &[vec![21, 16]]);
    scan_case(arm, 9, (11, 4, 8, 2, 16), &[vec![11, 4]]);
    set_pair_min(saved);
}

/// The scan on tensor cores in the chunked matrix form (`cube::mamba::ssd`): its plan on the
/// host (every arm), and on the arm where it runs (bf16 with tensor cores: CUDA bf16) the
/// register scan's cases through it — chunks of 16 (from a requested 3), 32 and 128 steps,
/// ragged lengths incl. 0 and 1, an initial state, `P` padded to 16 (scalar loads of `x`) and
/// `P` = 8, 64 (16-byte loads), `N` = 16 and 128, a prompt of two chunks of 128, new sequences
/// without a state (one chunk and three) — checked to have run in this form. Elsewhere it says the form did not
/// run and why (the cases then exercise the fallback only).
pub fn scan_ssd_match(arm: &Arm) {
    let _settings = scan_lock();
    use nemotron_kernels::cube::plans::scan::{chunking, set_chunking, Chunking, Chunks};
    use nemotron_kernels::cube::plans::ssd::{self, set_ssd_min, ssd_min, ssd_plan};
    // Lightning (N 128, P 64, H 64): a 1K prompt in 8 chunks, 64 × 128 in one each.
    let c = |len, count| Some(Chunks { len, count });
    assert_eq!(ssd_plan(128, 64, 64 * 64, 1, 1024, 1, 128), c(128, 8));
    assert_eq!(ssd_plan(128, 64, 64 * 64 * 64, 64, 128, 1, 128), c(128, 1));
    assert_eq!(ssd_plan(128, 64, 64 * 64, 1, 129, 1, 128), c(128, 2));
    assert_eq!(ssd_plan(128, 64, 64 * 64, 1, 20, 1, 3), c(16, 2));
    assert_eq!(ssd_plan(128, 64, 64 * 64, 1, 20, 1, 500), c(128, 1));
    // Below the token threshold, shapes it does not take, no steps.
    assert_eq!(ssd_plan(128, 64, 64 * 64, 1, 1024, 1025, 128), None);
    assert_eq!(ssd_plan(12, 64, 64 * 64, 1, 64, 1, 128), None);
    assert_eq!(ssd_plan(144, 64, 64 * 64, 1, 64, 1, 128), None);
    assert_eq!(ssd_plan(128, 130, 64 * 64, 1, 64, 1, 128), None);
    assert_eq!(ssd_plan(128, 64, 64 * 64, 1, 0, 0, 128), None);
    // Chunk end states past the byte budget (32 × 64 × 64 rows × 8 chunks × 512 bytes).
    assert_eq!(ssd_plan(128, 64, 32 * 64 * 64, 32, 1024, 1, 128), None);
    assert_eq!(ssd_plan(128, 64, 16 * 64 * 64, 16, 1024, 1, 128), c(128, 8));
    // The bf16 arms are CUDA's, on a device with bf16 tensor cores (sm_80 on).
    let runs = arm.dtype == burn::tensor::DType::BF16;
    let (saved, saved_min, before) = (chunking(), ssd_min(), ssd::launches());
    set_ssd_min(1);
    let mut cases = 0;
    for len in [3, 32, 128] {
        set_chunking(Chunking {
            len,
            max_rows: usize::MAX,
        })
        .unwrap();
        scan_case(arm, 12, (75, 3, 20, 1, 128), &[vec![75, 0, 33, 1]]);
        scan_case(arm, 13, (23, 4, 8, 2, 16), &[vec![23, 4], vec![23, 23]]);
        cases += 3;
    }
    set_chunking(Chunking {
        len: 128,
        max_rows: usize::MAX,
    })
    .unwrap();
    scan_case(arm, 14, (200, 2, 64, 1, 128), &[vec![200, 130, 0, 1]]);
    // New sequences (no state: the incoming state's terms skipped), one chunk and several.
    scan_case_from(arm, 15, (128, 4, 64, 2, 128), &[vec![128, 77, 0]], false);
    scan_case_from(arm, 16, (300, 2, 64, 1, 128), &[vec![300, 129]], false);
    cases += 3;
    set_chunking(saved).unwrap();
    set_ssd_min(saved_min);
    let ran = ssd::launches() - before;
    if runs {
        assert_eq!(ran, cases, "every bf16 case ran in the tensor-core form");
    } else {
        assert_eq!(ran, 0, "the tensor-core form is for bf16 only");
        eprintln!(
            "selective_scan_ssd: the tensor-core form did not run on this arm (bf16 with mma \
             only); its plan was checked and the cases ran through the register scan"
        );
    }
}

fn scan_case(
    arm: &Arm,
    seed: u64,
    dims: (usize, usize, usize, usize, usize),
    cases: &[Vec<usize>],
) {
    scan_case_from(arm, seed, dims, cases, true);
}

/// [`scan_case`] from a random state, or (`with_state` false) from none: new sequences, whose
/// scan starts from the zero state.
fn scan_case_from(
    arm: &Arm,
    seed: u64,
    (tm, h, p, g, n): (usize, usize, usize, usize, usize),
    cases: &[Vec<usize>],
    with_state: bool,
) {
    let (href, mut rng) = (Arm::host(), Rng::new(seed, arm));
    for lens in cases {
        let b = lens.len();
        let x = rng.vec(b * tm * h * p, 1.0);
        let dt: Vec<f32> = rng
            .vec(b * tm * h, 1.0)
            .iter()
            .map(|v| rng.round(0.01 + 0.1 * v.abs()))
            .collect();
        let a: Vec<f32> = (0..h).map(|i| -(1.0 + i as f32)).collect();
        let bm = rng.vec(b * tm * g * n, 1.0);
        let cm = rng.vec(b * tm * g * n, 1.0);
        let d = rng.vec(h, 1.0);
        let st = rng.vec(b * h * p * n, 0.5);
        let run = |ar: &Arm| {
            // The SSM state is f32 on every arm.
            let state_in = ar.f32(&st, [b, h, p, n]);
            let (y, s) = ops::selective_scan(
                ar.t(&x, [b, tm, h, p]),
                ar.t(&dt, [b, tm, h]),
                ar.t(&a, [h]),
                ar.t(&bm, [b, tm, g, n]),
                ar.t(&cm, [b, tm, g, n]),
                ar.t(&d, [h]),
                with_state.then(|| state_in.clone()),
                lens,
            );
            (host(y), host(s), host(state_in))
        };
        let ((gy, gs, g_in), (ry, rs, _)) = (run(arm), run(&href));
        for (bb, &len) in lens.iter().enumerate() {
            let s = bb * tm * h * p;
            let name = format!("scan y seq {bb} lens {lens:?}");
            close(
                &name,
                &gy[s..s + len * h * p],
                &ry[s..s + len * h * p],
                arm.band.scan,
            );
        }
        close(
            &format!("scan state lens {lens:?}"),
            &gs,
            &rs,
            arm.band.scan,
        );
        // The input state tensor is not modified in place.
        close("scan input state untouched", &g_in, &st, 0.0);
    }
}
