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

/// The residual add fused with the next norm: the sum and the normalized sum, at the hidden width
/// and at widths that leave units idle or give them several channels.
pub fn add_rms_norm_matches(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(17, arm));
    for (r, h) in [(1, 2688), (3, 100), (2, 4103)] {
        let x = rng.vec(r * h, 2.0);
        let y = rng.vec(r * h, 1.0);
        let w = rng.vec(h, 1.0);
        let run = |a: &Arm| {
            let (s, n) = ops::add_rms_norm(a.t(&x, [r, h]), a.t(&y, [r, h]), a.t(&w, [h]), 1e-5);
            (host(s), host(n))
        };
        let ((gs, gn), (rs, rn)) = (run(arm), run(&href));
        close(&format!("add_rms_norm {r}×{h} sum"), &gs, &rs, arm.band.lin);
        close(
            &format!("add_rms_norm {r}×{h} norm"),
            &gn,
            &rn,
            arm.band.lin,
        );
    }
}
