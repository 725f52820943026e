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
    // Slot lengths whose new entry lands at every ring position (and one slot never filled).
    let lens = [5, 0, 2, 7];
    let x = rng.vec(rows.len() * c, 1.0);
    let w = rng.vec(c * k, 0.5);
    let bias = rng.vec(c, 0.5);
    let pool = rng.vec(s * c * k, 1.0);
    let run = |a: &Arm| {
        let p = ops::contiguous(a.t(&pool, [s, c, k]));
        let before = p.clone();
        let (y, p) = ops::conv_step(
            a.t(&x, [rows.len(), c]),
            a.t(&w, [c, k]),
            Some(a.t(&bias, [c])),
            p,
            &slots(a, &lens),
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
        &gp[c * k..2 * c * k],
        &pool[c * k..2 * c * k],
        0.0,
    );
    // The ring against its definition: slot 2 (length 2) of row 0 reads the inputs of times
    // −1, 0, 1 at positions 3, 0, 1 and writes its input at position 2.
    let (ch, ring) = (3, &pool[(2 * c + 3) * k..][..k]);
    let mut acc = bias[ch];
    for (kk, pos) in [3, 0, 1].into_iter().enumerate() {
        acc += w[ch * k + kk] * ring[pos];
    }
    acc += w[ch * k + 3] * x[ch];
    let want = acc / (1.0 + (-acc).exp());
    close("conv_step ring order", &[gy[ch]], &[want], arm.band.lin);
    close(
        "conv_step ring write",
        &[gp[(2 * c + 3) * k + 2]],
        &[x[ch]],
        arm.band.lin,
    );
}

/// The conv and SSM steps in one launch against the two ops (the same arm) and against the
/// host reference, over `K + 2` consecutive steps (each ring wraps), rows out of slot order, a
/// pad row, slots of different lengths; states of 16 (strided loop) and 128 (registers), with
/// and without the conv bias. Several heads share a group, so `B`/`C` are convolved by cubes
/// that did not write their rings.
pub fn conv_ssm_step_matches(arm: &Arm) {
    use nemotron_kernels::cube::plans::ssm_step::set_ssm_walk;
    let _walk = super::SSM_WALK.lock().unwrap_or_else(|e| e.into_inner());
    // The fused kernel over several rows (by default it runs at one row only).
    nemotron_kernels::cube::set_fused_conv_max_rows(usize::MAX);
    // Each warp walking 1, 2 and 8 of the 16 state rows (8: past `p`, rows left idle).
    for walk in [1, 2, 8] {
        set_ssm_walk(walk);
        for (n, bias) in [(16, true), (128, true), (128, false)] {
            conv_ssm_case(arm, n, bias);
        }
    }
    set_ssm_walk(nemotron_kernels::cube::plans::ssm_step::SSM_WALK_DEFAULT);
    nemotron_kernels::cube::set_fused_conv_max_rows(nemotron_kernels::cube::FUSED_CONV_MAX_ROWS);
}

fn conv_ssm_case(arm: &Arm, n: usize, with_bias: bool) {
    let (href, mut rng) = (Arm::host(), Rng::new(13, arm));
    let (s, h, p, g, k) = (3, 4, 16, 2, 4);
    let dims = ScanDims {
        heads: h,
        head_dim: p,
        groups: g,
        state: n,
    };
    let width = h * p + 2 * g * n;
    let rows = [2, -1, 0];
    let b = rows.len();
    let steps = k + 2;
    let xbc: Vec<Vec<f32>> = (0..steps).map(|_| rng.vec(b * width, 1.0)).collect();
    let dt: Vec<Vec<f32>> = (0..steps)
        .map(|_| {
            rng.vec(b * h, 1.0)
                .iter()
                .map(|v| rng.round(v - 3.0))
                .collect()
        })
        .collect();
    let cw = rng.vec(width * k, 0.5);
    let cb = rng.vec(width, 0.5);
    let dt_bias = rng.vec(h, 0.5);
    let a: Vec<f32> = (0..h).map(|i| -(1.0 + i as f32)).collect();
    let d = rng.vec(h, 1.0);
    let cpool0 = rng.vec(s * width * k, 1.0);
    let spool0 = rng.vec(s * h * p * n, 0.5);
    // Per step: y, conv pool, ssm pool. `round`: the conv output is rounded to the arm's
    // activation dtype between the two ops, as the arm stores it (the reference in f32 would
    // otherwise feed the scan other x, B and C than the arm's).
    let run = |ar: &Arm, fused: bool, round: bool| -> Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let mut cp = ops::contiguous(ar.t(&cpool0, [s, width, k]));
        let mut sp = ops::contiguous(ar.f32(&spool0, [s, h, p, n]));
        let (cw, cb) = (ar.t(&cw, [width, k]), ar.t(&cb, [width]));
        let (dtb, at, dd) = (ar.t(&dt_bias, [h]), ar.t(&a, [h]), ar.t(&d, [h]));
        let sl = slots(ar, &rows);
        let mut lens = vec![3i32, 0, 1];
        let mut out = Vec::new();
        for t in 0..steps {
            let ln = slots(ar, &lens);
            let (x, dtt) = (ar.t(&xbc[t], [b, width]), ar.t(&dt[t], [b, h]));
            let bias = with_bias.then(|| cb.clone());
            let y;
            if fused {
                let w = ops::MambaStepWeights {
                    conv_weight: &cw,
                    conv_bias: bias.as_ref(),
                    dt_bias: &dtb,
                    a: &at,
                    d: &dd,
                };
                (y, cp, sp) = ops::conv_ssm_step(x, dtt, w, cp, sp, &ln, &sl, dims, Some(0.04));
            } else {
                let (mut xc, c2) = ops::conv_step(x, cw.clone(), bias, cp, &ln, &sl);
                if round {
                    let v: Vec<f32> = host(xc).iter().map(|&v| rng.round(v)).collect();
                    xc = ar.t(&v, [b, width]);
                }
                let (y2, s2) = ops::ssm_step(
                    xc,
                    dtt,
                    dtb.clone(),
                    at.clone(),
                    dd.clone(),
                    sp,
                    &sl,
                    dims,
                    Some(0.04),
                );
                (y, cp, sp) = (y2, c2, s2);
            }
            for &r in &rows {
                if r >= 0 {
                    lens[r as usize] += 1;
                }
            }
            out.push((host(y), host(cp.clone()), host(sp.clone())));
        }
        out
    };
    let (fused, apart, want) = (
        run(arm, true, false),
        run(arm, false, false),
        run(&href, false, true),
    );
    for t in 0..steps {
        let tag = format!("(n {n}, bias {with_bias}, step {t})");
        let ((fy, fc, fs), (ay, ac, as_), (ry, rc, rs)) = (&fused[t], &apart[t], &want[t]);
        assert!(
            fy[h * p..2 * h * p].iter().all(|&v| v == 0.0),
            "conv_ssm_step: a pad row is not zero {tag}"
        );
        close(
            &format!("conv_ssm_step y == two ops {tag}"),
            fy,
            ay,
            arm.band.lin,
        );
        close(
            &format!("conv_ssm_step conv pool == two ops {tag}"),
            fc,
            ac,
            0.0,
        );
        close(
            &format!("conv_ssm_step ssm pool == two ops {tag}"),
            fs,
            as_,
            arm.band.lin,
        );
        close(&format!("conv_ssm_step y {tag}"), fy, ry, arm.band.scan);
        close(
            &format!("conv_ssm_step conv pool {tag}"),
            fc,
            rc,
            arm.band.lin,
        );
        close(
            &format!("conv_ssm_step ssm pool {tag}"),
            fs,
            rs,
            arm.band.scan,
        );
        close(
            &format!("conv_ssm_step untouched slot {tag}"),
            &fc[width * k..2 * width * k],
            &cpool0[width * k..2 * width * k],
            0.0,
        );
    }
}

/// The slot SSM step reading `x | B | C` from one conv output row and applying the dt softplus
/// itself (with and without the `dt_min` floor), against the reference: a state of 16 (the
/// strided loop) and of 128 (the real one: a lane's share held in registers).
pub fn ssm_step_matches(arm: &Arm) {
    for n in [16, 128] {
        ssm_step_case(arm, n, &[1, -1, 2, 0]);
    }
    // 65,539 rows (pad rows but for the first and the last three): `rows × heads` cubes fold
    // over y and z; with the rows on z alone the launch is past the limit.
    let mut rows = vec![-1; 65_539];
    rows[0] = 1;
    rows[65_536] = 0;
    rows[65_538] = 2;
    ssm_step_case(arm, 16, &rows);
}

fn ssm_step_case(arm: &Arm, n: usize, rows: &[i32]) {
    let (href, mut rng) = (Arm::host(), Rng::new(12, arm));
    let (s, h, p, g) = (3, 4, 8, 2);
    let dims = ScanDims {
        heads: h,
        head_dim: p,
        groups: g,
        state: n,
    };
    let width = h * p + 2 * g * n;
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
                &slots(ar, rows),
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
/// pad row. The GQA form runs with each group in one cube, in cubes of 4 heads and of one (the
/// groups of 16), and by its plan (`gqa_split_plan`: 4 ways for the groups of 16 over 3
/// chunks, whole over 11, 2 ways for the groups of 2 over one chunk).
pub fn attention_step_matches(arm: &Arm) {
    let _form = super::ATTN_FORM.lock().unwrap_or_else(|e| e.into_inner());
    use nemotron_kernels::cube::plans::attention::{set_form, set_gqa_split, AttnForm};
    for (form, split) in [
        (AttnForm::Gqa, 0),
        (AttnForm::Gqa, 1),
        (AttnForm::Gqa, 4),
        (AttnForm::Gqa, 16),
        (AttnForm::Split, 0),
        (AttnForm::Unfused, 0),
    ] {
        set_form(form);
        set_gqa_split(split);
        for (cap, lens, hd, nh) in [
            (8, [3, 0, 5], 16, 4),
            (200, [130, 0, 198], 16, 4),
            (130, [63, 64, 129], 128, 4),
            (300, [127, 5, 256], 128, 4),
            (130, [63, 64, 129], 128, 32),
            (700, [600, 1, 640], 128, 32),
            (200, [130, 0, 198], 16, 6),
        ] {
            // Sub-groups of 4 and 1 forced: the groups of 16 (the real ones).
            if split >= 4 && nh != 32 {
                continue;
            }
            attention_step_case(arm, cap, lens, hd, nh);
        }
    }
    set_form(AttnForm::Gqa);
    set_gqa_split(0);
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
        &format!(
            "attention_step o {:?} split {} (cap {cap}, lens {lens:?}, hd {hd}, {nh} heads)",
            nemotron_kernels::cube::plans::attention::form(),
            nemotron_kernels::cube::plans::attention::gqa_split()
        ),
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
    // The fused-row form: each row `q | k | v`, read in place; the same kernels, so the same
    // values as the separate form on this arm.
    let (qw, kw) = (nh * hd, kvh * hd);
    let qkv: Vec<f32> = (0..b)
        .flat_map(|r| {
            let q = &q[r * qw..][..qw];
            let (k, v) = (&k[r * kw..][..kw], &v[r * kw..][..kw]);
            q.iter().chain(k).chain(v).copied().collect::<Vec<_>>()
        })
        .collect();
    let fused = |a: &Arm| {
        let (kpool, vpool) = (
            ops::contiguous(a.t(&kp, [s, kvh, cap, hd])),
            ops::contiguous(a.t(&vp, [s, kvh, cap, hd])),
        );
        let (o, kpool, vpool) = ops::attention_step_qkv(
            a.t(&qkv, [b, qw + 2 * kw]),
            nh,
            kpool,
            vpool,
            &slots(a, &lens),
            &slots(a, &rows),
            scale,
        );
        (host(o), host(kpool), host(vpool))
    };
    let ((fo, fk, fv), (ho, _, _)) = (fused(arm), fused(&href));
    let tag = format!("(cap {cap}, lens {lens:?}, hd {hd}, {nh} heads)");
    close(
        &format!("attention_step_qkv o == separate {tag}"),
        &fo,
        &go,
        0.0,
    );
    close(&format!("attention_step_qkv o (host) {tag}"), &ho, &ro, 0.0);
    close(&format!("attention_step_qkv K pool {tag}"), &fk, &rk, 0.0);
    close(&format!("attention_step_qkv V pool {tag}"), &fv, &rv, 0.0);
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

/// A batch entering its slots (`write_slots`) against the definition written out here: row 0
/// into slot 3 rotated by 2, row 1 a pad row (slot −1: nothing written), row 2 into slot 0
/// rotated by 5, each writing `width` = 5 entries of which the last (past `L` = 4) is zero and
/// the rotation wraps around `M` = 6; slots 1, 2 and 4 keep their values.
pub fn write_slots_match(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(15, arm));
    let (s, a, m, c, b, l, width) = (5usize, 2usize, 6usize, 3usize, 3usize, 4usize, 5usize);
    let (slot_ids, rot) = ([3i32, -1, 0], [2usize, 1, 5]);
    let pool = rng.vec(s * a * m * c, 1.0);
    let src = rng.vec(b * a * l * c, 1.0);
    let mut want = pool.clone();
    for (bi, (&slot, &r)) in slot_ids.iter().zip(&rot).enumerate() {
        if slot < 0 {
            continue;
        }
        for ai in 0..a {
            for li in 0..width {
                for ci in 0..c {
                    let at = ((slot as usize * a + ai) * m + (li + r) % m) * c + ci;
                    want[at] = if li < l {
                        src[((bi * a + ai) * l + li) * c + ci]
                    } else {
                        0.0
                    };
                }
            }
        }
    }
    let run = |ar: &Arm| {
        let p = ops::contiguous(ar.t(&pool, [s, a, m, c]));
        let before = p.clone();
        let rot: Vec<i32> = rot.iter().map(|&r| r as i32).collect();
        let p = ops::write_slots(
            p,
            ar.t(&src, [b, a, l, c]),
            &slots(ar, &slot_ids),
            &slots(ar, &rot),
            width,
        );
        (host(p), host(before))
    };
    let ((gp, gbefore), (hp, _)) = (run(arm), run(&href));
    close("write_slots", &gp, &want, 0.0);
    close("write_slots (host)", &hp, &want, 0.0);
    close("write_slots in place", &gbefore, &gp, 0.0);
}

/// Random E4M3 codes as I32 words, the two NaN codes avoided (a cache never stores them).
fn code_words(rng: &mut Rng, n_codes: usize) -> (Vec<u8>, Vec<i32>) {
    let codes: Vec<u8> = (0..n_codes)
        .map(|_| {
            let c = (rng.next().abs() * 255.0) as u8;
            if c & 0x7F == 0x7F {
                c ^ 1
            } else {
                c
            }
        })
        .collect();
    let words = nemotron_kernels::bytes_to_words(&codes);
    (codes, words)
}

/// A pool of I32 words in a dense row-major buffer, as the model makes its pools
/// (`ops::contiguous_int`): CUDA pitches the rows of an uploaded tensor (a row of two words takes
/// 16 bytes), and the pool ops, which write in place, take dense buffers only.
fn words4(a: &Arm, w: &[i32], shape: [usize; 4]) -> Tensor<4, Int> {
    ops::contiguous_int(Tensor::from_data(
        TensorData::new(w.to_vec(), shape),
        (&a.dev, burn::tensor::DType::I32),
    ))
}

fn words_of(t: Tensor<4, Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().into_vec().unwrap()
}

/// Decode attention over an FP8 KV cache (E4M3 codes four to a word, `k_scale` 1.7 and
/// `v_scale` 0.45 so a scale applied on one side only moves every score and value) against the
/// host reference, on both fused forms (the unfused one asked runs the split form): the output
/// within the arm's band, the appended codes equal to the host's (the same E4M3 rounding of the
/// same `x / scale`), the pools written in place. Two keys of the step are 3 × 448 · 1.7, so
/// saturation at ±448 is exercised.
pub fn attention_step_kv8_matches(arm: &Arm) {
    let _form = super::ATTN_FORM.lock().unwrap_or_else(|e| e.into_inner());
    use nemotron_kernels::cube::plans::attention::{set_form, set_gqa_split, AttnForm};
    for (form, split) in [
        (AttnForm::Gqa, 0),
        (AttnForm::Gqa, 1),
        (AttnForm::Split, 0),
        (AttnForm::Unfused, 0),
    ] {
        set_form(form);
        set_gqa_split(split);
        for (cap, lens, hd, nh) in [
            (8, [3, 0, 5], 16, 4),
            (130, [63, 64, 129], 128, 32),
            (700, [600, 1, 640], 128, 32),
            (200, [130, 0, 198], 16, 6),
        ] {
            attention_step_kv8_case(arm, form, cap, lens, hd, nh);
        }
    }
    set_form(AttnForm::Gqa);
    set_gqa_split(0);
}

fn attention_step_kv8_case(
    arm: &Arm,
    form: nemotron_kernels::cube::plans::attention::AttnForm,
    cap: usize,
    lens: [i32; 3],
    hd: usize,
    nh: usize,
) {
    let (href, mut rng) = (Arm::host(), Rng::new(16, arm));
    let (s, kvh) = (3, 2);
    let rows = [2, 0, -1, 1];
    let b = rows.len();
    let (qw, kw) = (nh * hd, kvh * hd);
    let mut qkv = rng.vec(b * (qw + 2 * kw), 1.0);
    // A few keys far past the E4M3 range once divided by the scale.
    qkv[qw] = 3.0 * 448.0 * 1.7;
    qkv[qw + 1] = -3.0 * 448.0 * 1.7;
    // The pools: codes of keys and values of the inputs' size (random codes over the whole
    // E4M3 range would put scores in the thousands, where f32 order alone moves the softmax).
    let mut pool_words = |sc: f32| -> Vec<i32> {
        let codes: Vec<u8> = rng
            .vec(s * kvh * cap * hd, 1.0)
            .into_iter()
            .map(|x| nemotron_formats::f32_to_e4m3(x / sc))
            .collect();
        nemotron_kernels::bytes_to_words(&codes)
    };
    let (kwords, vwords) = (pool_words(1.7), pool_words(0.45));
    let scale = 1.0 / (hd as f32).sqrt();
    let shape = [s, kvh, cap, hd / 4];
    let run = |a: &Arm| {
        let (kpool, vpool) = (words4(a, &kwords, shape), words4(a, &vwords, shape));
        let before = kpool.clone();
        let (o, kpool, vpool) = ops::attention_step_qkv8(
            a.t(&qkv, [b, qw + 2 * kw]),
            nh,
            kpool,
            vpool,
            &slots(a, &lens),
            &slots(a, &rows),
            scale,
            (1.7, 0.45),
        );
        (host(o), words_of(kpool), words_of(vpool), words_of(before))
    };
    let ((go, gk, gv, gbefore), (ro, rk, rv, _)) = (run(arm), run(&href));
    let tag = format!(
        "{form:?} split {} (cap {cap}, lens {lens:?}, hd {hd}, {nh} heads)",
        nemotron_kernels::cube::plans::attention::gqa_split()
    );
    close(
        &format!("attention_step_qkv8 o {tag}"),
        &go,
        &ro,
        arm.band.lin,
    );
    assert!(
        go[2 * qw..3 * qw].iter().all(|&v| v == 0.0),
        "attention_step_qkv8: a pad row is not zero"
    );
    assert_eq!(gk, rk, "attention_step_qkv8 K codes {tag}");
    assert_eq!(gv, rv, "attention_step_qkv8 V codes {tag}");
    assert_eq!(gbefore, gk, "attention_step_qkv8 K pool written in place");
    let original: Vec<i64> = kwords.iter().map(|&w| w as i64).collect();
    assert_ne!(gk, original, "attention_step_qkv8 appended nothing");
}

/// A batch entering an FP8 cache (`write_slots8`) against the definition written out here with
/// the format crate's E4M3 encoder (checked against torch's cast): row 0 into slot 3, row 1 a
/// pad row, row 2 into slot 0, `L` = 4 of `M` = 6 positions; everything else keeps its codes.
pub fn write_slots8_match(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(17, arm));
    let (s, a, m, c, b, l) = (5usize, 2usize, 6usize, 8usize, 3usize, 4usize);
    let slot_ids = [3i32, -1, 0];
    let scale = 0.3f32;
    let (mut codes, words) = code_words(&mut rng, s * a * m * c);
    let mut src = rng.vec(b * a * l * c, 200.0);
    src[0] = 1.0e4; // saturates at 448 · scale
    for (bi, &slot) in slot_ids.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        for ai in 0..a {
            for li in 0..l {
                for ci in 0..c {
                    let x = src[((bi * a + ai) * l + li) * c + ci];
                    codes[((slot as usize * a + ai) * m + li) * c + ci] =
                        nemotron_formats::f32_to_e4m3(x / scale);
                }
            }
        }
    }
    let want: Vec<i64> = nemotron_kernels::bytes_to_words(&codes)
        .into_iter()
        .map(|w| w as i64)
        .collect();
    let run = |ar: &Arm| {
        let p = words4(ar, &words, [s, a, m, c / 4]);
        let before = p.clone();
        let p = ops::write_slots8(p, ar.t(&src, [b, a, l, c]), &slots(ar, &slot_ids), scale);
        (words_of(p), words_of(before))
    };
    let ((gp, gbefore), (hp, _)) = (run(arm), run(&href));
    assert_eq!(gp, want, "write_slots8");
    assert_eq!(hp, want, "write_slots8 (host)");
    assert_eq!(gbefore, gp, "write_slots8 in place");
}

/// bf16 pairs as I32 words (element `2w` in the low half), by `half`'s round-to-nearest-even
/// (torch's `.to(torch.bfloat16)`): the format's definition, written here apart from the crate.
fn bf16_words(v: &[f32]) -> Vec<i32> {
    v.chunks(2)
        .map(|p| {
            let lo = half::bf16::from_f32(p[0]).to_bits() as u32;
            let hi = half::bf16::from_f32(p[1]).to_bits() as u32;
            (lo | hi << 16) as i32
        })
        .collect()
}

fn bf16_of_words(w: &[i64]) -> Vec<f32> {
    w.iter()
        .flat_map(|&w| {
            let w = w as u32;
            [f32::from_bits(w << 16), f32::from_bits(w & 0xFFFF_0000)]
        })
        .collect()
}

/// The decode step over a bf16 SSM state (`conv_ssm_step_bf16`) against the f32-state step of
/// the same arm started from the same (decoded) state each step: the same `y` (computed from the
/// f32 new state), and the stored state equal to that step's f32 state rounded to nearest even
/// by `half` — all but a few words where the two kernels' f32 arithmetic may differ in its last
/// bit, which may move a value across a rounding boundary (one bf16 ulp; a truncating or
/// lo/hi-swapped store misses on about half the words or by far more). Over `K + 2` steps, rows
/// out of slot order, a pad row; states of 16 (the strided word loop), 96 (three values a lane:
/// the word loop) and 128 (four a lane: registers), fused and as two launches.
pub fn conv_ssm_step_bf16_matches(arm: &Arm) {
    use nemotron_kernels::cube::plans::ssm_step::set_ssm_walk;
    let _walk = super::SSM_WALK.lock().unwrap_or_else(|e| e.into_inner());
    for walk in [1, 8] {
        set_ssm_walk(walk);
        for fused_rows in [usize::MAX, 0] {
            nemotron_kernels::cube::set_fused_conv_max_rows(fused_rows);
            for n in [16, 96, 128] {
                conv_ssm_bf16_case(arm, n, fused_rows > 0, true);
            }
        }
    }
    set_ssm_walk(nemotron_kernels::cube::plans::ssm_step::SSM_WALK_DEFAULT);
    nemotron_kernels::cube::set_fused_conv_max_rows(nemotron_kernels::cube::FUSED_CONV_MAX_ROWS);
    // The host reference (its ops return new tensors: not in place).
    conv_ssm_bf16_case(&Arm::host(), 128, false, false);
}

fn conv_ssm_bf16_case(arm: &Arm, n: usize, fused: bool, in_place: bool) {
    let mut rng = Rng::new(19, arm);
    let (s, h, p, g, k) = (3, 4, 16, 2, 4);
    let dims = ScanDims {
        heads: h,
        head_dim: p,
        groups: g,
        state: n,
    };
    let width = h * p + 2 * g * n;
    let rows = [2, -1, 0];
    let b = rows.len();
    let cw = arm.t(&rng.vec(width * k, 0.5), [width, k]);
    let cb = arm.t(&rng.vec(width, 0.5), [width]);
    let dt_bias = arm.t(&rng.vec(h, 0.5), [h]);
    let a = arm.t(&(0..h).map(|i| -(1.0 + i as f32)).collect::<Vec<_>>(), [h]);
    let d = arm.t(&rng.vec(h, 1.0), [h]);
    let w = ops::MambaStepWeights {
        conv_weight: &cw,
        conv_bias: Some(&cb),
        dt_bias: &dt_bias,
        a: &a,
        d: &d,
    };
    let cpool0 = rng.vec(s * width * k, 1.0);
    let words0 = bf16_words(&rng.vec(s * h * p * n, 0.5));
    let mut words = words4(arm, &words0, [s, h, p, n / 2]);
    let mut cp = ops::contiguous(arm.t(&cpool0, [s, width, k]));
    let sl = slots(arm, &rows);
    let mut lens = vec![3i32, 0, 1];
    let mut total_off = 0usize;
    for t in 0..k + 2 {
        let tag = format!("(n {n}, fused {fused}, step {t}, {:?})", arm.dtype);
        let ln = slots(arm, &lens);
        let xbc = rng.vec(b * width, 1.0);
        let dt: Vec<f32> = rng
            .vec(b * h, 1.0)
            .iter()
            .map(|v| rng.round(v - 3.0))
            .collect();
        let held = words_of(words.clone());
        let f32_pool = ops::contiguous(arm.f32(&bf16_of_words(&held), [s, h, p, n]));
        let (y32, _, s32) = ops::conv_ssm_step(
            arm.t(&xbc, [b, width]),
            arm.t(&dt, [b, h]),
            ops::MambaStepWeights { ..w },
            cp.clone(),
            f32_pool,
            &ln,
            &sl,
            dims,
            Some(0.04),
        );
        // The f32 step wrote its conv ring in place too: the entry it wrote is the one this step
        // reads no more, and the bf16 step writes the same input there.
        let before = words.clone();
        let (y16, cp16, w16) = ops::conv_ssm_step_bf16(
            arm.t(&xbc, [b, width]),
            arm.t(&dt, [b, h]),
            ops::MambaStepWeights { ..w },
            cp.clone(),
            words,
            &ln,
            &sl,
            dims,
            Some(0.04),
        );
        let (y32, y16) = (host(y32), host(y16));
        assert!(
            y16[h * p..2 * h * p].iter().all(|&v| v == 0.0),
            "conv_ssm_step_bf16: a pad row is not zero {tag}"
        );
        close(
            &format!("conv_ssm_step_bf16 y {tag}"),
            &y16,
            &y32,
            arm.band.lin,
        );
        let got = words_of(w16.clone());
        assert!(
            !in_place || got == words_of(before),
            "conv_ssm_step_bf16: the pool was not written in place {tag}"
        );
        let want: Vec<i64> = bf16_words(&host(s32))
            .into_iter()
            .map(|w| w as i64)
            .collect();
        let slot_words = h * p * n / 2;
        assert_eq!(
            got[slot_words..2 * slot_words],
            held[slot_words..2 * slot_words],
            "conv_ssm_step_bf16: the slot no row names changed {tag}"
        );
        for (i, (&gw, &ww)) in got.iter().zip(&want).enumerate() {
            if gw == ww {
                continue;
            }
            total_off += 1;
            for part in 0..2 {
                let (gv, wv) = (
                    (gw as u32 >> (16 * part)) & 0xFFFF,
                    (ww as u32 >> (16 * part)) & 0xFFFF,
                );
                assert!(
                    gv.abs_diff(wv) <= 1,
                    "conv_ssm_step_bf16: word {i} half {part} holds {gv:#06x} where the f32 \
                     step rounds to {wv:#06x} {tag}"
                );
            }
        }
        (cp, words) = (cp16, w16);
        for &r in &rows {
            if r >= 0 {
                lens[r as usize] += 1;
            }
        }
    }
    let all = (k + 2) * s * h * p * n / 2;
    assert!(
        total_off * 100 <= all,
        "conv_ssm_step_bf16: {total_off} of {all} words differ by an ulp from the f32 step's \
         rounding (n {n}, fused {fused})"
    );
}

/// Prefilled states entering a bf16 state pool (`write_slots_bf16`) against `half`'s rounding:
/// row 0 into slot 3, row 1 a pad row, row 2 into slot 0, `L` = 4 of `M` = 6 positions, one tie
/// to even each way and a value past bf16's largest finite; everything else keeps its words.
pub fn write_slots_bf16_match(arm: &Arm) {
    let (href, mut rng) = (Arm::host(), Rng::new(23, arm));
    let (s, a, m, c, b, l) = (5usize, 2usize, 6usize, 8usize, 3usize, 4usize);
    let slot_ids = [3i32, -1, 0];
    let held = rng.vec(s * a * m * c, 3.0);
    let mut want_v: Vec<f32> = bf16_of_words(
        &bf16_words(&held)
            .iter()
            .map(|&w| w as i64)
            .collect::<Vec<_>>(),
    );
    let mut src = rng.vec(b * a * l * c, 3.0);
    src[0] = f32::from_bits(0x3F80_8000); // halfway between 1.0 and its next bf16: to 1.0
    src[1] = f32::from_bits(0x3F81_8000); // halfway, odd below: up to 0x3F82
    src[2] = 3.40e38; // past bf16's largest finite + half an ulp: infinity
    for (bi, &slot) in slot_ids.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        for ai in 0..a {
            for li in 0..l {
                for ci in 0..c {
                    want_v[((slot as usize * a + ai) * m + li) * c + ci] =
                        src[((bi * a + ai) * l + li) * c + ci];
                }
            }
        }
    }
    let want: Vec<i64> = bf16_words(&want_v).into_iter().map(|w| w as i64).collect();
    let held_words = bf16_words(&held);
    let run = |ar: &Arm| {
        let p = words4(ar, &held_words, [s, a, m, c / 2]);
        let before = p.clone();
        let p = ops::write_slots_bf16(p, ar.f32(&src, [b, a, l, c]), &slots(ar, &slot_ids));
        (words_of(p), words_of(before))
    };
    let ((gp, gbefore), (hp, _)) = (run(arm), run(&href));
    assert_eq!(gp, want, "write_slots_bf16");
    assert_eq!(hp, want, "write_slots_bf16 (host)");
    assert_eq!(gbefore, gp, "write_slots_bf16 in place");
    // Slot 3's first word, and the next: the ties and the overflow as the format defines them.
    let at = 3 * a * m * c / 2;
    assert_eq!(want[at] as u32 & 0xFFFF, 0x3F80, "tie to even, down");
    assert_eq!(want[at] as u32 >> 16, 0x3F82, "tie to even, up");
    assert_eq!(want[at + 1] as u32 & 0xFFFF, 0x7F80, "overflow to infinity");
}
