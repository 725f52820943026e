//! The exact-f32-accumulation batched matmul.

use super::{close, host, Arm, Rng};
use nemotron_kernels::ops;

pub fn matmul_matches(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(5, arm));
    for (b, m, k, n) in [
        (1, 1, 64, 96),
        (6, 5, 16, 23),
        (1, 37, 48, 20),
        (2, 3, 7, 40),
        (1, 2, 300, 33),
        // Past 1,024 rows (MATMUL_ROWS_FROM is 256): blocks of rows per batch, the last ragged (the
        // register-blocked kernel where `n % 4 == 0`: two column blocks, the second of 4
        // columns, `k` past three shared stages; in bf16 too where the product is too narrow
        // for the tiled path).
        (2, 519, 24, 40),
        (1, 1100, 200, 132),
        (64, 17, 40, 20),
        (1, 1030, 40, 22),
        // Blocks of 8 rows in the plain kernel (256 rows and up, `n % 4 ≠ 0`), the last ragged;
        // `k` long enough for its passes of four `k`s a unit and a tail.
        (1, 300, 100, 22),
    ] {
        let a = rng.vec(b * m * k, 1.0);
        let w = rng.vec(b * k * n, 1.0);
        let run = |x: &Arm| host(ops::matmul(x.t(&a, [b, m, k]), x.t(&w, [b, k, n])));
        close(
            &format!("matmul {b}×{m}×{k}·{n}"),
            &run(arm),
            &run(&href),
            arm.band.lin,
        );
    }
}

/// The dense linear `x · wᵀ`: the GEMV (1, 2 and 4 output rows per unit row, an f32 weight over
/// the arm's activations as the router has it) and the matmul fallback (many rows, `K % 4 ≠ 0`).
pub fn dense_linear_matches(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(15, arm));
    for (m, k, n, f32_weight) in [
        (1, 2688, 128, true),
        (3, 64, 40, false),
        (1, 32, 4300, false),
        (2, 16, 8500, true),
        (20, 48, 24, false),
        (2, 6, 10, false),
    ] {
        let x = rng.vec(m * k, 1.0);
        let w = rng.vec(n * k, 1.0);
        let run = |a: &Arm| {
            let wt = if f32_weight {
                a.f32(&w, [n, k])
            } else {
                a.t(&w, [n, k])
            };
            let y = ops::dense_linear(a.t(&x, [m, k]), wt);
            let want = if f32_weight {
                burn::tensor::DType::F32
            } else {
                a.dtype
            };
            assert_eq!(
                y.dtype(),
                want,
                "dense_linear: output in the weight's dtype"
            );
            host(y)
        };
        close(
            &format!("dense_linear {m}×{k}·({n}×{k})ᵀ f32 weight {f32_weight}"),
            &run(arm),
            &run(&href),
            arm.band.lin,
        );
    }
}

/// `dense_linear_t` (the weight's transpose held by the caller, as the router holds it) is
/// `dense_linear` bit for bit: one row (the GEMV), 40 rows (the exact matmul's plain kernel, past
/// the GEMV's 16) and 300 (its register-blocked kernel), an f32 weight over activations in the
/// arm's dtype.
pub fn dense_linear_t_matches(arm: &Arm) {
    let mut rng = Rng::new(17, arm);
    for (m, k, n) in [(1, 2688, 128), (40, 264, 132), (300, 264, 132)] {
        let x = rng.vec(m * k, 1.0);
        let w = rng.vec(n * k, 1.0);
        let (xa, wa) = (arm.t(&x, [m, k]), arm.f32(&w, [n, k]));
        let wt = ops::contiguous(wa.clone().transpose());
        let held = host(ops::dense_linear_t(xa.clone(), wa.clone(), wt));
        let plain = host(ops::dense_linear(xa, wa));
        close(
            &format!("dense_linear_t {m}×{k}·({n}×{k})ᵀ == dense_linear"),
            &held,
            &plain,
            0.0,
        );
    }
}

/// The exact matmul sums every output in one order whatever the rows around it: the rows of the
/// batch-256 decode router (2688 → 128, the register-blocked kernel, 8 rows per cube), of a 1,030-row
/// router product (register-blocked kernel, 8 rows per cube) and of a 4,300-row one (16 rows per
/// cube) are bit for bit those of the same rows alone (20 rows: one row per cube), and so are
/// the batch-256 router's on the plain kernel's 8-row cubes (`matrows=max`). Cube arms only
/// (the host reference is another code).
pub fn dense_linear_rows_invariant(arm: &Arm) {
    use nemotron_kernels::cube::plans::matmul::block_rows;
    assert_eq!(
        block_rows(1, 256),
        8,
        "the batch-256 router in blocks of rows"
    );
    assert_eq!(block_rows(1, 20), 1, "20 rows: one per cube");
    for (m, k, n) in [(256, 2688, 128), (1030, 264, 132), (4300, 72, 8)] {
        rows_invariant_case(arm, m, k, n);
    }
    // `matrows` moves the register-blocked kernel's start: the batch-256 router off it (the
    // plain kernel's 8-row cubes) still sums as the plain kernel's 20 rows.
    use nemotron_kernels::cube::settings::Settings;
    let saved = Settings::current();
    let mut s = saved.clone();
    s.matmul_rows_from = usize::MAX;
    s.apply().expect("matrows applies");
    rows_invariant_case(arm, 256, 2688, 128);
    saved.apply().expect("the settings restore");
}

fn rows_invariant_case(arm: &Arm, m: usize, k: usize, n: usize) {
    use nemotron_kernels::cube::plans::matmul::tile_rows;
    let mut rng = Rng::new(16, arm);
    let few = 20;
    eprintln!("{m} rows: {} per cube", tile_rows(1, m));
    let x = rng.vec(m * k, 1.0);
    let w = rng.vec(n * k, 1.0);
    let wt = arm.f32(&w, [n, k]);
    let all = host(ops::dense_linear(arm.t(&x, [m, k]), wt.clone()));
    let part = host(ops::dense_linear(arm.t(&x[..few * k], [few, k]), wt));
    let off = all[..few * n]
        .iter()
        .zip(&part)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        off,
        0,
        "dense_linear: {off} of {} outputs of the first {few} rows differ between {m} rows and {few}",
        few * n
    );
}

/// Dense linears on cubek's tiled matmul (`densemm`, every kernel of [`TiledKernel::ALL`]),
/// activations and weights in the arm's type, against the host: rows past the tiled minimum,
/// ragged against every tile. The unit kernel runs on every device and must never be refused
/// (on lavapipe it is the only one); a kernel the device refuses is named (the call ran on the
/// next path, checked above).
pub fn dense_linear_tiled_matches(arm: &Arm) {
    use nemotron_kernels::cube::plans::matmul::{tiled_refusals, TiledKernel};
    use nemotron_kernels::cube::settings::Settings;
    let (href, mut rng) = (Arm::host(), Rng::new(16, arm));
    let saved = Settings::current();
    let mut refused = vec![];
    for (name, kernel) in TiledKernel::ALL {
        let mut s = saved.clone();
        s.min.dense_mm = 1;
        s.tiled = kernel;
        s.apply().expect("the dense tiled settings apply");
        let before = tiled_refusals();
        for (m, k, n) in [(64, 64, 64), (130, 2688, 96), (200, 128, 72)] {
            let (x, w) = (rng.vec(m * k, 1.0), rng.vec(n * k, 1.0));
            let run = |a: &Arm| host(ops::dense_linear(a.t(&x, [m, k]), a.t(&w, [n, k])));
            close(
                &format!("dense_linear tiled ({name}) {m}×{k}·({n}×{k})ᵀ"),
                &run(arm),
                &run(&href),
                arm.band.lin,
            );
        }
        if tiled_refusals() != before {
            eprintln!("dense_linear tiled: cubek's {name} kernel refused on this device");
            refused.push(name);
        }
    }
    saved.apply().expect("the settings in force apply again");
    eprintln!("dense_linear tiled: refused {refused:?}");
    assert!(!refused.contains(&"unit"), "the unit kernel was refused");
}
