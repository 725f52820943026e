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
