//! The fused (gated) group RMSNorm.

use super::{close, host, Arm, Rng};
use nemotron_kernels::ops;

/// Plain and gated, one and several groups, widths above and below the cube's 256 units.
pub fn rms_norm_matches(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(7, arm));
    for (r, h, groups, gated) in [
        (3, 64, 1, false),
        (2, 600, 1, false),
        (5, 96, 4, true),
        (1, 1024, 8, true),
    ] {
        let x = rng.vec(r * h, 2.0);
        let z = rng.vec(r * h, 3.0);
        let w = rng.vec(h, 1.0);
        let run = |a: &Arm| {
            host(ops::rms_norm(
                a.t(&x, [r, h]),
                gated.then(|| a.t(&z, [r, h])),
                a.t(&w, [h]),
                groups,
                1e-5,
            ))
        };
        let name = format!("rms_norm {r}×{h} groups {groups} gated {gated}");
        close(&name, &run(arm), &run(&href), arm.band.lin);
    }
}
