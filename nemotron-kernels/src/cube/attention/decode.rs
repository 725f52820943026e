//! GQA decode attention over state slots, one new token per row, no RoPE, softmax in f32:
//!
//! 1. append: one unit per `(b, kv head, d)`: `K[s, g, len[s], d] = k[b, g, d]` (same for V);
//! 2. scores: one unit per `(b, q head, t)`, `t ≤ len[s]`: `σ[b, h, t] = scale · q[b, h]·K[s, h/r, t]`
//!    (f32 scratch `[B, NH, cap]`; units past the length exit);
//! 3. combine: a cube per `(b, q head)` with one unit per `d`: `m = max σ`, `z = Σ exp(σ − m)`,
//!    `o[d] = Σ_t exp(σ_t − m) / z · V[s, h/r, t, d]` (each unit reads the row's scores, V reads
//!    coalesced along `d`).
//!
//! The lengths and slots are read on the device (`len[s]` before this step's token), so the same
//! launches serve every step of a captured graph; pad rows (`slot < 0`) write zeros.

use crate::cube::buffers::{arg, contiguous_as, elemwise, empty, float_buf, i32_buf, with_float};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

#[cube(launch)]
pub fn kv_append_kernel<F: Float>(
    k: &[F],
    v: &[F],
    lens: &[i32],
    slots: &[i32],
    kpool: &mut [F],
    vpool: &mut [F],
    rows: u32,
    kv_heads: u32,
    head_dim: u32,
    cap: u32,
) {
    let id = ABSOLUTE_POS;
    let (kvh, hd, cap) = (kv_heads as usize, head_dim as usize, cap as usize);
    if id >= rows as usize * kvh * hd {
        terminate!();
    }
    let b = id / (kvh * hd);
    let g = (id / hd) % kvh;
    let dd = id % hd;
    let slot = slots[b];
    if slot < 0 {
        terminate!();
    }
    let s = slot as usize;
    let at = ((s * kvh + g) * cap + lens[s] as usize) * hd + dd;
    kpool[at] = k[id];
    vpool[at] = v[id];
}

#[cube(launch)]
pub fn attn_scores_kernel<F: Float>(
    q: &[F],
    kpool: &[F],
    lens: &[i32],
    slots: &[i32],
    scores: &mut [f32],
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    cap: u32,
    scale: f32,
) {
    let id = ABSOLUTE_POS;
    let (nh, kvh, hd, cap) = (
        heads as usize,
        kv_heads as usize,
        head_dim as usize,
        cap as usize,
    );
    if id >= rows as usize * nh * cap {
        terminate!();
    }
    let b = id / (nh * cap);
    let h = (id / cap) % nh;
    let t = id % cap;
    let slot = slots[b];
    if slot < 0 {
        terminate!();
    }
    let s = slot as usize;
    if t > lens[s] as usize {
        terminate!();
    }
    let g = h / (nh / kvh);
    let kb = ((s * kvh + g) * cap + t) * hd;
    let qb = (b * nh + h) * hd;
    let mut acc = 0.0f32;
    for dd in 0..hd {
        acc += f32::cast_from(q[qb + dd]) * f32::cast_from(kpool[kb + dd]);
    }
    scores[id] = acc * scale;
}

#[cube(launch)]
pub fn attn_combine_kernel<F: Float>(
    scores: &[f32],
    vpool: &[F],
    lens: &[i32],
    slots: &[i32],
    o: &mut [F],
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    cap: u32,
) {
    let (nh, kvh, hd, cap) = (
        heads as usize,
        kv_heads as usize,
        head_dim as usize,
        cap as usize,
    );
    let b = CUBE_POS_Y as usize;
    let h = CUBE_POS_X as usize;
    let dd = UNIT_POS_X as usize;
    if dd >= hd {
        terminate!();
    }
    let oi = (b * nh + h) * hd + dd;
    let slot = slots[b];
    if slot < 0 {
        o[oi] = F::cast_from(0.0f32);
        terminate!();
    }
    let s = slot as usize;
    let n = lens[s] as usize + 1;
    let row = (b * nh + h) * cap;
    let mut m = scores[row];
    for t in 1..n {
        m = m.max(scores[row + t]);
    }
    let mut z = 0.0f32;
    for t in 0..n {
        z += (scores[row + t] - m).exp();
    }
    let g = h / (nh / kvh);
    let vb = (s * kvh + g) * cap;
    let mut acc = 0.0f32;
    for t in 0..n {
        let p = (scores[row + t] - m).exp() / z;
        acc += p * f32::cast_from(vpool[(vb + t) * hd + dd]);
    }
    o[oi] = F::cast_from(acc);
}

#[allow(clippy::too_many_arguments)]
pub fn launch<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    kpool: CubeTensor<R>,
    vpool: CubeTensor<R>,
    lens: CubeTensor<R>,
    slots: CubeTensor<R>,
    scale: f32,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let q = float_buf(q);
    let dtype = q.dtype;
    for (name, p) in [("K", &kpool), ("V", &vpool)] {
        assert_eq!(
            p.dtype, dtype,
            "attention_step: the {name} pool must be in the activation dtype"
        );
        assert!(
            p.is_contiguous(),
            "attention_step: the {name} pool must be contiguous"
        );
    }
    let (k, v) = (contiguous_as(k, dtype), contiguous_as(v, dtype));
    let (lens, slots) = (i32_buf(lens), i32_buf(slots));
    let qs = q.meta.shape().clone();
    let (rows, nh, hd) = (qs[0], qs[1], qs[2]);
    let ps = kpool.meta.shape().clone();
    let (kvh, cap) = (ps[1], ps[2]);
    let scores = empty(&q, [rows, nh, cap], DType::F32);
    let o = empty(&q, [rows, nh, hd], dtype);
    let client = q.client.clone();
    let (ac, ad) = elemwise(rows * kvh * hd);
    let (sc, sd) = elemwise(rows * nh * cap);
    macro_rules! go {
        ($t:ty) => {{
            kv_append_kernel::launch::<$t, R>(
                &client,
                ac,
                ad,
                arg(&k),
                arg(&v),
                arg(&lens),
                arg(&slots),
                arg(&kpool),
                arg(&vpool),
                rows as u32,
                kvh as u32,
                hd as u32,
                cap as u32,
            );
            attn_scores_kernel::launch::<$t, R>(
                &client,
                sc,
                sd,
                arg(&q),
                arg(&kpool),
                arg(&lens),
                arg(&slots),
                arg(&scores),
                rows as u32,
                nh as u32,
                kvh as u32,
                hd as u32,
                cap as u32,
                scale,
            );
            attn_combine_kernel::launch::<$t, R>(
                &client,
                CubeCount::Static(nh as u32, rows as u32, 1),
                CubeDim::new_1d(hd as u32),
                arg(&scores),
                arg(&vpool),
                arg(&lens),
                arg(&slots),
                arg(&o),
                nh as u32,
                kvh as u32,
                hd as u32,
                cap as u32,
            );
        }};
    }
    with_float!(dtype, go);
    (o, kpool, vpool)
}
