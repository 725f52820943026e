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
        // Past 65,535 rows: the grid folds its rows (x) onto z.
        (65_539, 8, 2, true),
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
    // 65,539 rows: past the 65,535 cubes a grid dimension takes on wgpu (rows fold onto y).
    for (r, h) in [(1, 2688), (3, 100), (2, 4103), (65_539, 8)] {
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

/// The residual add with a MoE layer's parts combined inside: within a few ulps of the arm's own
/// `moe_combine` then `add_rms_norm` (the rounding of each separate op replicated; the compilers
/// may contract the products into FMAs differently in the two kernels, so not bit for bit: f32
/// within 1e-6 relative, bf16 within one bf16 ulp of the largest value), and within the band of
/// the host reference; with and without a shared expert.
pub fn add_moe_rms_norm_matches(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(19, arm));
    for (r, h, k, with_shared) in [(1, 2688, 6, true), (3, 100, 2, false), (2, 4103, 6, true)] {
        let x = rng.vec(r * h, 2.0);
        let y = rng.vec(r * k * h, 1.0);
        let cw = rng.vec(r * k, 1.0);
        let sh = rng.vec(r * h, 1.0);
        let w = rng.vec(h, 1.0);
        let run = |a: &Arm, fused: bool| {
            let shared = with_shared.then(|| a.t(&sh, [r, h]));
            let (xt, yt, wt) = (a.t(&x, [r, h]), a.t(&y, [r * k, h]), a.t(&w, [h]));
            let (s, n) = if fused {
                ops::add_moe_rms_norm(xt, yt, a.f32(&cw, [r, k]), shared, wt, 1e-5)
            } else {
                let c = ops::moe_combine(yt, a.f32(&cw, [r, k]), shared);
                ops::add_rms_norm(xt, c, wt, 1e-5)
            };
            (host(s), host(n))
        };
        let (gs, gn) = run(arm, true);
        let (us, un) = run(arm, false);
        let name = format!("add_moe_rms_norm {r}×{h}, k {k}, shared {with_shared}");
        let ulps = if arm.dtype == burn::tensor::DType::F32 {
            1e-6
        } else {
            1.0 / 128.0
        };
        close(&format!("{name} sum vs separate ops"), &gs, &us, ulps);
        close(&format!("{name} norm vs separate ops"), &gn, &un, ulps);
        // Three roundings to the activation dtype (the routed sum, `+ shared`, `+ x`) against
        // the host's f32: twice the linear band (bf16 measured 0.0184 at a scale of 4.7 on the
        // H200, 1.003 × the single band).
        let (rs, _) = run(&href, false);
        close(&format!("{name} sum"), &gs, &rs, 2.0 * arm.band.lin);
        let rn = ops::rms_norm(href.t(&gs, [r, h]), None, href.t(&w, [h]), 1, 1e-5);
        close(&format!("{name} norm"), &gn, &host(rn), arm.band.lin);
    }
}
