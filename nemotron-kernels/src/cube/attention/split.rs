//! The split form of decode attention: a cube per `(q head, row, chunk)` scores its chunk,
//! takes the chunk's softmax partials and `Σ p·V` in one launch (then [`super::merge`]).

use super::ATTN_CHUNK;
use crate::cube::kv8::{kv_key_half, kv_read, kv_round, kv_store};
use cubecl::prelude::*;

/// Context positions per cube of [`attn_split_kernel()`].
pub const SPLIT_CHUNK: usize = ATTN_CHUNK;
/// Units per cube of [`attn_split_kernel()`]: two per position while scoring (each half of `d`).
pub const SPLIT_UNITS: usize = 2 * SPLIT_CHUNK;

/// One chunk of [`SPLIT_CHUNK`] positions of one `(row, q head)`, in one launch: scores, the
/// chunk's softmax partials and `Σ p·V` (then [`attn_merge_kernel()`](super::merge::attn_merge_kernel)), with this step's K/V row
/// appended by one cube of its kv group. A cube per `(q head, row, chunk)`, [`SPLIT_UNITS`]
/// units. Every loop runs a comptime count with its loads issued before their use, so a chunk
/// costs a few memory latencies; the position being appended is read from `k`/`v` (the pool
/// is written by another cube of the same launch). `hd` divides [`SPLIT_UNITS`] and is even.
/// With `fp8` the pools hold E4M3 codes (`P = u32`, [`crate::cube::kv8`]) scaled by `k_scale` /
/// `v_scale`, and the step's own K/V are read as stored.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn attn_split_kernel<F: Float, P: Numeric>(
    q: &[F],
    k: &[F],
    v: &[F],
    lens: &[i32],
    slots: &[i32],
    kpool: &mut [P],
    vpool: &mut [P],
    part: &mut [f32],
    heads: u32,
    kv_heads: u32,
    cap: u32,
    chunks: u32,
    scale: f32,
    q_row: u32,
    kv_row: u32,
    k_off: u32,
    v_off: u32,
    k_scale: f32,
    v_scale: f32,
    #[comptime] hd: usize,
    #[comptime] fp8: bool,
) {
    let (nh, kvh, cap, chunks) = (
        heads as usize,
        kv_heads as usize,
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
    let u = UNIT_POS_X as usize;
    let slot = slots[b];
    // Uniform per cube: pad rows and chunks past the length leave whole (the merge writes the
    // pad rows' zeros and never reads the chunks past the length).
    if slot < 0 {
        terminate!();
    }
    let s = slot as usize;
    let len = lens[s] as usize;
    let n = len + 1;
    let t0 = c * SPLIT_CHUNK;
    if t0 >= n {
        terminate!();
    }
    let r = nh / kvh;
    let g = h / r;
    let kvb = (s * kvh + g) * cap;
    let newb = b * kv_row as usize + g * hd;
    let (kb0, vb0) = (newb + k_off as usize, newb + v_off as usize);
    // The append: the kv group's first head's cube whose chunk holds `len`.
    if h % r == 0 && len < t0 + SPLIT_CHUNK {
        kv_store(kpool, (kvb + len) * hd, k, kb0, u, k_scale, hd, fp8);
        kv_store(vpool, (kvb + len) * hd, v, vb0, u, v_scale, hd, fp8);
    }
    // Scores: unit `u` takes position `t0 + u % CHUNK`, half `u / CHUNK` of `d`.
    let half = hd / 2;
    let p = u % SPLIT_CHUNK;
    let d0 = (u / SPLIT_CHUNK) * half;
    let t = (t0 + p).min(n - 1);
    let qb = b * q_row as usize + h * hd + d0;
    let mut kv = Array::<f32>::new(half);
    kv_key_half(
        k,
        kb0 + d0,
        kpool,
        (kvb + t) * hd + d0,
        t == len,
        &mut kv,
        k_scale,
        half,
        fp8,
    );
    let mut dot = 0.0f32;
    #[unroll]
    for i in 0..half {
        dot += kv[i] * f32::cast_from(q[qb + i]);
    }
    let mut sm = Shared::<[f32]>::new_slice(SPLIT_UNITS);
    sm[u] = dot;
    sync_cube();
    let mut ps = Shared::<[f32]>::new_slice(SPLIT_CHUNK);
    if u < SPLIT_CHUNK {
        ps[u] = (sm[u] + sm[u + SPLIT_CHUNK]) * scale;
    }
    sync_cube();
    let valid = (n - t0).min(SPLIT_CHUNK);
    let mut m = ps[0];
    for i in 1..valid {
        m = m.max(ps[i]);
    }
    sync_cube();
    if u < SPLIT_CHUNK {
        ps[u] = if u < valid { (ps[u] - m).exp() } else { 0.0f32 };
    }
    sync_cube();
    // `Σ p·V`: unit `u` takes `d = u % hd` over the positions `≡ u / hd (mod SPLIT_UNITS / hd)`.
    let parts = SPLIT_UNITS / hd;
    let dd = u % hd;
    let j0 = u / hd;
    let per = SPLIT_CHUNK / parts;
    let mut vals = Array::<f32>::new(per);
    #[unroll]
    for i in 0..per {
        let tt = (t0 + j0 + i * parts).min(n - 1);
        vals[i] = if tt == len {
            kv_round(f32::cast_from(v[vb0 + dd]), v_scale, fp8)
        } else {
            kv_read(vpool, (kvb + tt) * hd + dd, v_scale, fp8)
        };
    }
    let mut acc = 0.0f32;
    let mut z = 0.0f32;
    #[unroll]
    for i in 0..per {
        let w = ps[j0 + i * parts];
        acc += w * vals[i];
    }
    for i in 0..valid {
        z += ps[i];
    }
    sync_cube();
    sm[u] = acc;
    sync_cube();
    let pb = ((b * nh + h) * chunks + c) * (hd + 2);
    if u < hd {
        let mut o = 0.0f32;
        #[unroll]
        for j in 0..parts {
            o += sm[j * hd + u];
        }
        part[pb + 2 + u] = o;
    }
    if u == 0 {
        part[pb] = m;
        part[pb + 1] = z;
    }
}
