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
