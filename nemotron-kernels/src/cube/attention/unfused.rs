//! The four-launch form of decode attention (any head dim): append this step's K/V, the scores,
//! the chunk partials (then [`super::merge`]). See [`super::decode`] for the steps' math.

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
    kv_row: u32,
    k_off: u32,
    v_off: u32,
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
    let src = b * kv_row as usize + g * hd + dd;
    kpool[at] = k[src + k_off as usize];
    vpool[at] = v[src + v_off as usize];
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
    q_row: u32,
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
    let qb = b * q_row as usize + h * hd;
    let mut acc = 0.0f32;
    for dd in 0..hd {
        acc += f32::cast_from(q[qb + dd]) * f32::cast_from(kpool[kb + dd]);
    }
    scores[id] = acc * scale;
}

/// One chunk of one `(row, q head)`'s context: a cube per `(q head, row, chunk)`, one unit per
/// `d`; `m = max σ` over the chunk, `z = Σ exp(σ − m)`, `o[d] = Σ exp(σ_t − m) · V[t, d]`, written
/// to `part [B, NH, chunks, 2 + hd]` (`m`, `z`, then `o`). Chunks past the row's length leave
/// at once (the merge never reads them). With one cube per `(row, head)` walking the whole
/// context serially, a batch-1 step after an 8K prompt spent ≈ 3 ms per attention layer.
#[cube(launch)]
pub fn attn_partial_kernel<F: Float>(
    scores: &[f32],
    vpool: &[F],
    lens: &[i32],
    slots: &[i32],
    part: &mut [f32],
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    cap: u32,
    chunks: u32,
    #[comptime] chunk: usize,
) {
    let (nh, kvh, hd, cap, chunks) = (
        heads as usize,
        kv_heads as usize,
        head_dim as usize,
        cap as usize,
        chunks as usize,
    );
    let h = CUBE_POS_X as usize;
    // (row, chunk) pairs folded over y and z: `rows · chunks` may pass 65,535 cubes.
    let rc = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    if rc >= slots.len() * chunks {
        terminate!();
    }
    let b = rc / chunks;
    let c = rc % chunks;
    let dd = UNIT_POS_X as usize;
    let slot = slots[b];
    // Uniform per cube: pad rows and chunks past the length leave whole.
    if slot < 0 {
        terminate!();
    }
    let s = slot as usize;
    let n = lens[s] as usize + 1;
    let t0 = c * chunk;
    if t0 >= n || dd >= hd {
        terminate!();
    }
    let t1 = (t0 + chunk).min(n);
    let row = (b * nh + h) * cap;
    let mut m = scores[row + t0];
    for t in t0 + 1..t1 {
        m = m.max(scores[row + t]);
    }
    let g = h / (nh / kvh);
    let vb = (s * kvh + g) * cap;
    let mut z = 0.0f32;
    let mut acc = 0.0f32;
    for t in t0..t1 {
        let p = (scores[row + t] - m).exp();
        z += p;
        acc += p * f32::cast_from(vpool[(vb + t) * hd + dd]);
    }
    let pb = ((b * nh + h) * chunks + c) * (hd + 2);
    if dd == 0 {
        part[pb] = m;
        part[pb + 1] = z;
    }
    part[pb + 2 + dd] = acc;
}
