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
/// and at widths that leave units idle or give them several channels. The norm is checked against
/// the reference norm of the arm's own sum (in bf16 that sum is rounded before the norm, as a
/// separate add would store it).
pub fn add_rms_norm_matches(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(17, arm));
    for (r, h) in [(1, 2688), (3, 100), (2, 4103)] {
        let x = rng.vec(r * h, 2.0);
        let y = rng.vec(r * h, 1.0);
        let w = rng.vec(h, 1.0);
        let (s, n) = ops::add_rms_norm(arm.t(&x, [r, h]), arm.t(&y, [r, h]), arm.t(&w, [h]), 1e-5);
        let (gs, gn) = (host(s), host(n));
        let (rs, _) = ops::add_rms_norm(
            href.t(&x, [r, h]),
            href.t(&y, [r, h]),
            href.t(&w, [h]),
            1e-5,
        );
        close(
            &format!("add_rms_norm {r}×{h} sum"),
            &gs,
            &host(rs),
            arm.band.lin,
        );
        let rn = ops::rms_norm(href.t(&gs, [r, h]), None, href.t(&w, [h]), 1, 1e-5);
        close(
            &format!("add_rms_norm {r}×{h} norm"),
            &gn,
            &host(rn),
            arm.band.lin,
        );
    }
}
