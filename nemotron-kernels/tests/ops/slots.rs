//! Decode over state slots: the conv and SSM steps, decode attention, the length advance and the
//! slot write, against the host reference — pad rows, rows out of slot order, and the pools
//! written in place (a clone taken before the call sees the new values: same buffer).

use super::{close, host, Arm, Rng};
use burn::tensor::{Int, Tensor, TensorData};
use nemotron_kernels::{ops, ScanDims};

fn slots(a: &Arm, v: &[i32]) -> Tensor<1, Int> {
    Tensor::from_data(
        TensorData::new(v.to_vec(), [v.len()]),
        (&a.dev, burn::tensor::DType::I32),
    )
}

fn ints(t: Tensor<1, Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().into_vec().unwrap()
}

pub fn conv_step_matches(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(11, arm));
    let (s, c, k) = (4, 20, 4);
    let rows = [2, -1, 0];
    let x = rng.vec(rows.len() * c, 1.0);
    let w = rng.vec(c * k, 0.5);
    let bias = rng.vec(c, 0.5);
    let pool = rng.vec(s * c * (k - 1), 1.0);
    let run = |a: &Arm| {
        let p = ops::contiguous(a.t(&pool, [s, c, k - 1]));
        let before = p.clone();
        let (y, p) = ops::conv_step(
            a.t(&x, [rows.len(), c]),
            a.t(&w, [c, k]),
            Some(a.t(&bias, [c])),
            p,
            &slots(a, &rows),
        );
        (host(y), host(p), host(before))
    };
    let ((gy, gp, gbefore), (ry, rp, _)) = (run(arm), run(&href));
    close("conv_step y", &gy, &ry, arm.band.lin);
    assert!(
        gy[c..2 * c].iter().all(|&v| v == 0.0),
        "conv_step: a pad row is not zero"
    );
    close("conv_step pool", &gp, &rp, arm.band.lin);
    close("conv_step pool written in place", &gbefore, &gp, 0.0);
    close(
        "conv_step untouched slots",
        &gp[c * (k - 1)..2 * c * (k - 1)],
        &pool[c * (k - 1)..2 * c * (k - 1)],
        0.0,
    );
}

/// The slot SSM step reading `x | B | C` from one conv output row and applying the dt softplus
/// itself (with and without the `dt_min` floor), against the reference: a state of 16 (the
/// strided loop) and of 128 (the real one: a lane's share held in registers).
pub fn ssm_step_matches(arm: &Arm) {
    for n in [16, 128] {
        ssm_step_case(arm, n);
    }
}

fn ssm_step_case(arm: &Arm, n: usize) {
    let (href, mut rng) = (Arm::host(), Rng::new(12, arm));
    let (s, h, p, g) = (3, 4, 8, 2);
    let dims = ScanDims {
        heads: h,
        head_dim: p,
        groups: g,
        state: n,
    };
    let width = h * p + 2 * g * n;
    let rows = [1, -1, 2, 0];
    let b = rows.len();
    let xbc = rng.vec(b * width, 1.0);
    // Raw dt around −3: softplus ≈ 0.05, the floor 0.04 clamps some of them.
    let dt: Vec<f32> = rng
        .vec(b * h, 1.0)
        .iter()
        .map(|v| rng.round(v - 3.0))
        .collect();
    let dt_bias = rng.vec(h, 0.5);
    let a: Vec<f32> = (0..h).map(|i| -(1.0 + i as f32)).collect();
    let d = rng.vec(h, 1.0);
    let pool = rng.vec(s * h * p * n, 0.5);
    for dt_min in [None, Some(0.04)] {
        let run = |ar: &Arm| {
            let pl = ops::contiguous(ar.f32(&pool, [s, h, p, n]));
            let before = pl.clone();
            let (y, pl) = ops::ssm_step(
                ar.t(&xbc, [b, width]),
                ar.t(&dt, [b, h]),
                ar.t(&dt_bias, [h]),
                ar.t(&a, [h]),
                ar.t(&d, [h]),
                pl,
                &slots(ar, &rows),
                dims,
                dt_min,
            );
            (host(y), host(pl), host(before))
        };
        let ((gy, gp, gbefore), (ry, rp, _)) = (run(arm), run(&href));
        close(
            &format!("ssm_step y (n {n}, dt_min {dt_min:?})"),
            &gy,
            &ry,
            arm.band.scan,
        );
        assert!(
            gy[h * p..2 * h * p].iter().all(|&v| v == 0.0),
            "ssm_step: a pad row is not zero"
        );
        close(
            &format!("ssm_step pool (n {n}, dt_min {dt_min:?})"),
            &gp,
            &rp,
            arm.band.scan,
        );
        close("ssm_step pool written in place", &gbefore, &gp, 0.0);
    }
}

/// Decode attention over slots: a short context (one chunk of the split) and a long one (several
/// chunks of `ATTN_CHUNK`, the last partial; an empty slot), a pad row, GQA.
/// Every device form (per kv group + merge, the default; per query head + merge; the four-launch
/// form) against the host: head dims 16 and 128 (the real one), groups of 2 and 16 query heads
/// (the real one), lengths whose new token opens, ends or sits inside a 64-position chunk, a
/// capacity that is not a multiple of the chunk, a context past 8 chunks (the merge's rounds), a
/// pad row.
pub fn attention_step_matches(arm: &Arm) {
    use nemotron_kernels::cube::attention::decode::{set_form, AttnForm};
    for form in [AttnForm::Gqa, AttnForm::Split, AttnForm::Unfused] {
        set_form(form);
        for (cap, lens, hd, nh) in [
            (8, [3, 0, 5], 16, 4),
            (200, [130, 0, 198], 16, 4),
            (130, [63, 64, 129], 128, 4),
            (300, [127, 5, 256], 128, 4),
            (130, [63, 64, 129], 128, 32),
            (700, [600, 1, 640], 128, 32),
            (200, [130, 0, 198], 16, 6),
        ] {
            attention_step_case(arm, cap, lens, hd, nh);
        }
    }
    set_form(AttnForm::Gqa);
}

fn attention_step_case(arm: &Arm, cap: usize, lens: [i32; 3], hd: usize, nh: usize) {
    let (href, mut rng) = (Arm::host(), Rng::new(13, arm));
    let (s, kvh) = (3, 2);
    let rows = [2, 0, -1, 1];
    let b = rows.len();
    let q = rng.vec(b * nh * hd, 1.0);
    let k = rng.vec(b * kvh * hd, 1.0);
    let v = rng.vec(b * kvh * hd, 1.0);
    let kp = rng.vec(s * kvh * cap * hd, 1.0);
    let vp = rng.vec(s * kvh * cap * hd, 1.0);
    let scale = 1.0 / (hd as f32).sqrt();
    let run = |a: &Arm| {
        let (kpool, vpool) = (
            ops::contiguous(a.t(&kp, [s, kvh, cap, hd])),
            ops::contiguous(a.t(&vp, [s, kvh, cap, hd])),
        );
        let before = kpool.clone();
        let lens_t = slots(a, &lens);
        let (o, kpool, vpool) = ops::attention_step(
            a.t(&q, [b, nh, hd]),
            a.t(&k, [b, kvh, hd]),
            a.t(&v, [b, kvh, hd]),
            kpool,
            vpool,
            &lens_t,
            &slots(a, &rows),
            scale,
        );
        (
            host(o),
            host(kpool),
            host(vpool),
            host(before),
            ints(lens_t),
        )
    };
    let ((go, gk, gv, gbefore, glens), (ro, rk, rv, _, _)) = (run(arm), run(&href));
    close(
        &format!("attention_step o (cap {cap}, lens {lens:?}, hd {hd}, {nh} heads)"),
        &go,
        &ro,
        arm.band.lin,
    );
    assert!(
        go[2 * nh * hd..3 * nh * hd].iter().all(|&v| v == 0.0),
        "attention_step: a pad row is not zero"
    );
    close("attention_step K pool", &gk, &rk, 0.0);
    close("attention_step V pool", &gv, &rv, 0.0);
    close("attention_step K pool written in place", &gbefore, &gk, 0.0);
    let want: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
    assert_eq!(glens, want, "attention_step advanced the lengths");
}

pub fn advance_and_write_slot_match(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(14, arm));
    let run = |a: &Arm| {
        let lens = slots(a, &[3, 0, 5, 7]);
        let before = lens.clone();
        let lens = ops::advance_lens(lens, &slots(a, &[2, -1, 0]));
        (ints(lens), ints(before))
    };
    let ((gl, gbefore), (rl, _)) = (run(arm), run(&href));
    assert_eq!(gl, vec![4, 0, 6, 7], "advance_lens");
    assert_eq!(gl, rl, "advance_lens against the host");
    assert_eq!(gbefore, gl, "advance_lens in place");
    let (s, a, m, c, l) = (3, 2, 6, 4, 5);
    let pool = rng.vec(s * a * m * c, 1.0);
    let src = rng.vec(a * l * c, 1.0);
    let run = |ar: &Arm| {
        let p = ops::contiguous(ar.t(&pool, [s, a, m, c]));
        let before = p.clone();
        let p = ops::write_slot(p, ar.t(&src, [a, l, c]), 1);
        (host(p), host(before))
    };
    let ((gp, gbefore), (rp, _)) = (run(arm), run(&href));
    close("write_slot", &gp, &rp, 0.0);
    close("write_slot in place", &gbefore, &gp, 0.0);
    assert_ne!(gp, pool, "write_slot wrote nothing");
}
