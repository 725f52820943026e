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

/// The routing slots grouped by expert (the device sort of CUDA's grouped prefill kernels):
/// counts and start offsets exactly as counted here, each expert's members the slots that chose
/// it (in any order). Cases: an expert every slot-group takes, one taken once, one never, ids
/// outside `0..E` (no group); Lightning's 130 experts (with the folded shared expert) at a
/// batch-256 step's 1,536 slots; more experts than one cube's units (the one-unit kernel).
pub fn moe_group_matches(arm: &Arm) {
    use burn::tensor::{Int, Tensor};
    let mut rng = Rng::new(61, &Arm::host());
    let ints =
        |t: Tensor<1, Int>| -> Vec<i64> { t.into_data().convert::<i64>().into_vec().unwrap() };
    for (e, slots) in [(8usize, 1080usize), (130, 1536), (2000, 300), (32, 1)] {
        let mut ids: Vec<i64> = (0..slots)
            .map(|s| match s % 7 {
                0 => 0,
                _ => 1 + (((rng.next() + 1.0) * 0.5 * (e - 2) as f32) as i64).min(e as i64 - 3),
            })
            .collect();
        if slots > 10 {
            ids[3] = e as i64 - 2;
            ids[4] = -1;
            ids[5] = e as i64;
        }
        let (counts, members) = ops::moe_group(arm.int(&ids), e);
        let (counts, members) = (ints(counts), ints(members));
        let name = format!("moe_group {e} experts, {slots} slots");
        assert_eq!(counts.len(), 2 * e, "{name}");
        let mut run = 0;
        for x in 0..e {
            let want: Vec<i64> = (0..slots as i64)
                .filter(|&s| ids[s as usize] == x as i64)
                .collect();
            assert_eq!(counts[x], want.len() as i64, "{name}: count of expert {x}");
            assert_eq!(counts[e + x], run, "{name}: start of expert {x}");
            let (a, b) = (run as usize, run as usize + want.len());
            let mut got = members[a..b].to_vec();
            got.sort();
            assert_eq!(got, want, "{name}: members of expert {x}");
            run += want.len() as i64;
        }
        if e > 2 && slots > 10 {
            assert_eq!(counts[e - 1], 0, "{name}: an expert no slot chose");
        }
    }
}
