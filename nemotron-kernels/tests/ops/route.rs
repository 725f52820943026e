//! MoE routing: the same experts in the same order and the same weights as the reference (plain
//! and grouped, renormalized or not, the biased-weights deviation, ties). Routing runs in f32 on
//! every arm.

use super::{close, host, Arm, Rng};
use nemotron_kernels::{ops, RouteConfig};

pub fn moe_route_matches(arm: &Arm) {
    let href = Arm::host();
    let mut rng = Rng::new(8, &href);
    for (case, (n, e, top_k, n_group, topk_group, renorm, biased, ties)) in [
        (1, 128, 6, 1, 1, true, false, false),
        (7, 16, 4, 4, 2, true, false, false),
        (5, 32, 8, 8, 3, false, false, false),
        (3, 16, 2, 2, 1, true, true, false),
        // Two experts per unit (256 units), and groups with more experts than units hold.
        (2, 512, 22, 1, 1, true, false, false),
        (3, 512, 8, 16, 4, true, false, false),
        // Logits on a coarse grid and no bias: many equal scores, the lower index must win.
        (4, 128, 8, 1, 1, true, false, true),
        (4, 64, 6, 8, 3, true, false, true),
    ]
    .into_iter()
    .enumerate()
    {
        // 0, 1 or 2 fixed slots (a shared expert stacked as experts E, E+1) after the routed ones.
        let fixed = case % 3;
        let mut logits = rng.vec(n * e, 4.0);
        let mut bias = rng.vec(e, 0.5);
        if ties {
            logits.iter_mut().for_each(|v| *v = (*v * 0.5).round());
            bias.iter_mut().for_each(|v| *v = 0.0);
        }
        let c = RouteConfig {
            top_k,
            n_group,
            topk_group,
            norm_topk_prob: renorm,
            routed_scaling_factor: 2.5,
            weights_from_biased: biased,
            fixed,
        };
        let run = |a: &Arm| {
            let (i, w) = ops::moe_route(a.f32(&logits, [n, e]), a.f32(&bias, [e]), &c);
            let i: Vec<i64> = i.into_data().convert::<i64>().into_vec().unwrap();
            (i, host(w))
        };
        let ((gi, gw), (ri, rw)) = (run(arm), run(&href));
        // The fixed slots: experts E.. in order, weight 1, after each token's routed ones.
        let kk = top_k + fixed;
        for t in 0..n {
            for j in 0..fixed {
                assert_eq!(
                    gi[t * kk + top_k + j],
                    (e + j) as i64,
                    "route fixed slot {j}"
                );
                assert_eq!(gw[t * kk + top_k + j], 1.0, "route fixed slot {j} weight");
            }
        }
        assert_eq!(
            gi, ri,
            "route {n}×{e} top-{top_k} groups {n_group}: experts"
        );
        let name = format!("route {n}×{e} top-{top_k} groups {n_group}/{topk_group} weights");
        close(&name, &gw, &rw, 1e-5);
    }
}

/// The weighted combine of the routed experts' outputs, with and without a shared expert.
pub fn moe_combine_matches(arm: &Arm) {
    let href = Arm::host();
    let mut rng = Rng::new(18, arm);
    for (n, k, h, shared) in [(3, 6, 2688, true), (5, 2, 100, false), (1, 22, 64, true)] {
        let y = rng.vec(n * k * h, 1.0);
        let w: Vec<f32> = rng.vec(n * k, 1.0).iter().map(|v| v.abs()).collect();
        let s = rng.vec(n * h, 1.0);
        let run = |a: &Arm| {
            host(ops::moe_combine(
                a.t(&y, [n * k, h]),
                a.f32(&w, [n, k]),
                shared.then(|| a.t(&s, [n, h])),
            ))
        };
        close(
            &format!("moe_combine {n}×{k}×{h} shared {shared}"),
            &run(arm),
            &run(&href),
            arm.band.lin,
        );
    }
}
