//! Greedy pick: the row-wise arg-max equals the reference's (lowest index on ties, NaN never
//! wins) over a vocabulary-sized row, ragged small rows, rows full of ties, and rows with NaN.

use super::{Arm, Rng};
use nemotron_kernels::{ops, reference};

pub fn argmax_rows_matches(arm: &Arm) {
    let mut rng = Rng::new(11, arm);
    for (rows, cols, kind) in [
        (1, 131_072, "random"),
        (3, 1000, "random"),
        (5, 7, "random"),
        (4, 4099, "ties"),
        (2, 2048, "nan"),
        // Past the 65,535 cubes a grid dimension takes on wgpu: rows fold onto y.
        (7, 3, "random"),
        (65_539, 3, "random"),
    ] {
        let mut x = rng.vec(rows * cols, 8.0);
        match kind {
            // Eight distinct values: every row's maximum repeats many times.
            "ties" => x.iter_mut().for_each(|v| *v = (*v * 0.5).round()),
            // A NaN where the maximum would be, and one at the front of the row.
            "nan" => {
                for r in 0..rows {
                    let row = &mut x[r * cols..(r + 1) * cols];
                    row[0] = f32::NAN;
                    row[cols / 2] = f32::NAN;
                    row[cols - 1] = 100.0 + r as f32;
                }
            }
            _ => {}
        }
        let want = reference::argmax_rows(&x, cols);
        let got: Vec<i32> = ops::argmax_rows(arm.t(&x, [rows, cols]))
            .into_data()
            .convert::<i32>()
            .into_vec()
            .unwrap();
        assert_eq!(got, want, "argmax {rows}×{cols} ({kind})");
    }
}

/// Log-probabilities on the device (`ops::logprob_rows`) against the reference (f64 sum, a full
/// sort): the log-sum-exp within 2e-6 of its size plus 1e-5, the token's logit and the top `n`
/// ids and values exactly — on a vocabulary-sized row, rows full of ties (the lower id first),
/// rows with NaN and −∞, a row narrower than `n`, tokens outside the row, and `n` = 0, 1, 5, 20.
/// The values are multiples of 1/4 below 16 in size, exact in bf16, so every arm ranks the same
/// numbers.
pub fn logprob_rows_match(arm: &Arm) {
    let mut rng = Rng::new(13, arm);
    for (rows, cols, kind) in [
        (1, 131_072, "random"),
        (3, 1000, "ties"),
        (2, 2048, "nan"),
        (2, 7, "random"),
        (65_537, 3, "random"),
    ] {
        let mut x: Vec<f32> = rng
            .vec(rows * cols, 12.0)
            .iter()
            .map(|v| (v * 4.0).round() / 4.0)
            .collect();
        match kind {
            "ties" => x.iter_mut().for_each(|v| *v = (*v * 0.25).round()),
            "nan" => {
                for r in 0..rows {
                    let row = &mut x[r * cols..(r + 1) * cols];
                    row[0] = f32::NAN;
                    row[cols / 2] = f32::NAN;
                    row[3] = f32::NEG_INFINITY;
                    row[cols - 1] = 15.0;
                }
            }
            _ => {}
        }
        // Tokens: inside, the last column, and outside the row.
        let tokens: Vec<i64> = (0..rows)
            .map(|r| match r % 3 {
                0 => (r * 7 % cols) as i64,
                1 => cols as i64 - 1,
                _ => cols as i64 + 5,
            })
            .collect();
        // The folded grid once (lavapipe is slow over 65,537 cubes).
        let ns: &[usize] = if rows > 65_535 { &[5] } else { &[0, 1, 5, 20] };
        for &n in ns {
            let (ws, wi, wv) = reference::logprob_rows(&x, cols, &tokens, n);
            let got = ops::logprob_rows(arm.t(&x, [rows, cols]), &arm.int(&tokens), n);
            let gs = super::host(got.stats);
            let gi: Vec<i32> = got.ids.into_data().convert::<i32>().into_vec().unwrap();
            let gv = super::host(got.values);
            let name = format!("logprob_rows {rows}×{cols} ({kind}) n = {n}");
            for r in 0..rows {
                let (lse, want) = (gs[2 * r], ws[2 * r]);
                assert!(
                    (lse - want).abs() <= 2e-6 * want.abs() + 1e-5,
                    "{name}: row {r} log-sum-exp {lse} against {want}"
                );
                let (t, tw) = (gs[2 * r + 1], ws[2 * r + 1]);
                assert!(
                    t == tw || (t.is_nan() && tw.is_nan()),
                    "{name}: row {r} token logit {t} against {tw}"
                );
            }
            let w = n.max(1);
            if let Some(r) = (0..rows).find(|&r| {
                gi[r * w..(r + 1) * w] != wi[r * w..(r + 1) * w]
                    || gv[r * w..(r + 1) * w] != wv[r * w..(r + 1) * w]
            }) {
                panic!(
                    "{name}: row {r} top {:?} / {:?} against {:?} / {:?} (row {:?})",
                    &gi[r * w..(r + 1) * w],
                    &gv[r * w..(r + 1) * w],
                    &wi[r * w..(r + 1) * w],
                    &wv[r * w..(r + 1) * w],
                    &x[r * cols..(r * cols + cols.min(8))]
                );
            }
        }
    }
}
