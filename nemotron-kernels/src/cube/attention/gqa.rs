//! The GQA form of decode attention (the default): a cube per `(kv head, row, chunk)` for all
//! the query heads of its group, so each K/V chunk is read once per group (then
//! [`super::merge`]).

use super::ATTN_CHUNK;
use crate::cube::kv8::{kv_key_half, kv_read, kv_round, kv_store};
use cubecl::prelude::*;

/// Units per cube of [`attn_gqa_kernel()`]: two per position of a [`ATTN_CHUNK`] chunk.
pub const GQA_UNITS: usize = 2 * ATTN_CHUNK;
/// Shared memory (bytes) [`attn_gqa_kernel()`] may take; larger groups run [`attn_split_kernel()`](super::split::attn_split_kernel).
pub const GQA_SHARED: usize = 40 * 1024;

/// Max (`max`) or sum over each of the `r` segments of [`ATTN_CHUNK`] values of `a`, left in
/// the segment's first entry: a shared-memory tree over every unit of the cube (no plane ops, so
/// lavapipe runs it too). Every unit must call it.
#[cube]
fn seg_reduce(a: &mut Shared<[f32]>, #[comptime] r: usize, #[comptime] max: bool) {
    let u = UNIT_POS_X as usize;
    // A runtime stride (a comptime one cannot be updated): `CUBE_DIM = GQA_UNITS = 2 · CHUNK`.
    let mut stride = CUBE_DIM_X as usize / 4;
    while stride > 0 {
        #[unroll]
        for i in 0..comptime!((r * ATTN_CHUNK / 2).div_ceil(GQA_UNITS)) {
            let e = u + i * GQA_UNITS;
            if e < r * stride {
                let at = (e / stride) * ATTN_CHUNK + e % stride;
                let (x, y) = (a[at], a[at + stride]);
                a[at] = if max { x.max(y) } else { x + y };
            }
        }
        sync_cube();
        stride /= 2;
    }
}

/// One chunk of [`ATTN_CHUNK`] positions of one `(row, kv head)` for all `r` query heads of its
/// group, in one launch (then [`attn_merge_kernel()`](super::merge::attn_merge_kernel)): the chunk's K and V are read once for the
/// `r` heads instead of once per head, as GQA allows. A cube per `(kv head, row, chunk)`,
/// [`GQA_UNITS`] units: scores with unit `u` on position `u % CHUNK` and half `u / CHUNK` of `d`
/// (its K half-row in registers, the `r` query rows in shared memory), softmax partials by
/// per-head shared-memory trees, `Σ p·V` with unit `u` on `d = u % hd`. The step's K/V row is
/// appended by the cube whose chunk holds it and read from `k`/`v` by the scores. `hd` is even and
/// divides [`GQA_UNITS`]. Small grids split each group over `split` cubes of `r` heads
/// (`split · r` = the group; [`super::decode::gqa_split_plan`]): cube `x` takes kv head
/// `x / split` and its heads `(x % split)·r ..`, and only the group's first cube appends the
/// step's K/V row (the others read it from `k`/`v`, as every cube does). With `fp8` the pools
/// hold E4M3 codes (`P = u32`, [`crate::cube::kv8`]) scaled by `k_scale` / `v_scale`, and the
/// step's own K/V are read as stored.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn attn_gqa_kernel<F: Float, P: Numeric>(
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
    split: u32,
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
    #[comptime] r: usize,
    #[comptime] fp8: bool,
) {
    let (nh, kvh, cap, chunks) = (
        heads as usize,
        kv_heads as usize,
        cap as usize,
        chunks as usize,
    );
    // The cube's `r` query heads: sub-group `sub` of kv head `g`'s group of `split · r`.
    let gh = CUBE_POS_X as usize;
    let g = gh / split as usize;
    let sub = gh % split as usize;
    // (row, chunk) pairs folded over y and z: `rows · chunks` may pass 65,535 cubes.
    let rc = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    if rc >= slots.len() * chunks {
        terminate!();
    }
    let b = rc / chunks;
    let c = rc % chunks;
    let u = UNIT_POS_X as usize;
    let slot = slots[b];
    // Uniform per cube: pad rows and chunks past the length leave whole.
    if slot < 0 {
        terminate!();
    }
    let s = slot as usize;
    let len = lens[s] as usize;
    let n = len + 1;
    let t0 = c * ATTN_CHUNK;
    if t0 >= n {
        terminate!();
    }
    let kvb = (s * kvh + g) * cap;
    let newb = b * kv_row as usize + g * hd;
    let (kb0, vb0) = (newb + k_off as usize, newb + v_off as usize);
    if sub == 0 && len < t0 + ATTN_CHUNK {
        kv_store(kpool, (kvb + len) * hd, k, kb0, u, k_scale, hd, fp8);
        kv_store(vpool, (kvb + len) * hd, v, vb0, u, v_scale, hd, fp8);
    }
    // The sub-group's query rows are contiguous: heads `gh·r .. gh·r + r` of row `b`.
    let qb = b * q_row as usize + gh * r * hd;
    let mut qs = Shared::<[f32]>::new_slice(r * hd);
    #[unroll]
    for i in 0..comptime!((r * hd).div_ceil(GQA_UNITS)) {
        let e = u + i * GQA_UNITS;
        if e < r * hd {
            qs[e] = f32::cast_from(q[qb + e]);
        }
    }
    let half = hd / 2;
    let p = u % ATTN_CHUNK;
    let d0 = (u / ATTN_CHUNK) * half;
    let t = (t0 + p).min(n - 1);
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
    sync_cube();
    let mut sm = Shared::<[f32]>::new_slice(r * GQA_UNITS);
    #[unroll]
    for j in 0..r {
        let mut dot = 0.0f32;
        #[unroll]
        for i in 0..half {
            dot += kv[i] * qs[j * hd + d0 + i];
        }
        sm[j * GQA_UNITS + u] = dot;
    }
    sync_cube();
    let valid = (n - t0).min(ATTN_CHUNK);
    // Scores `[r, CHUNK]` (positions past the length take the chunk's first score: they change
    // no maximum and are zeroed below).
    let mut ps = Shared::<[f32]>::new_slice(r * ATTN_CHUNK);
    let mut red = Shared::<[f32]>::new_slice(r * ATTN_CHUNK);
    #[unroll]
    for i in 0..comptime!((r * ATTN_CHUNK).div_ceil(GQA_UNITS)) {
        let e = u + i * GQA_UNITS;
        if e < r * ATTN_CHUNK {
            let (j, pp) = (e / ATTN_CHUNK, e % ATTN_CHUNK);
            let pv = if pp < valid { pp } else { 0usize };
            let sc = (sm[j * GQA_UNITS + pv] + sm[j * GQA_UNITS + pv + ATTN_CHUNK]) * scale;
            ps[e] = sc;
            red[e] = sc;
        }
    }
    sync_cube();
    seg_reduce(&mut red, r, true);
    #[unroll]
    for i in 0..comptime!((r * ATTN_CHUNK).div_ceil(GQA_UNITS)) {
        let e = u + i * GQA_UNITS;
        if e < r * ATTN_CHUNK {
            let (j, pp) = (e / ATTN_CHUNK, e % ATTN_CHUNK);
            let w = if pp < valid {
                (ps[e] - red[j * ATTN_CHUNK]).exp()
            } else {
                0.0f32
            };
            ps[e] = w;
        }
    }
    // Every unit has read its maxima before the sums overwrite `red`.
    sync_cube();
    let mut mj = 0.0f32;
    if u < r {
        mj = red[u * ATTN_CHUNK];
    }
    sync_cube();
    #[unroll]
    for i in 0..comptime!((r * ATTN_CHUNK).div_ceil(GQA_UNITS)) {
        let e = u + i * GQA_UNITS;
        if e < r * ATTN_CHUNK {
            red[e] = ps[e];
        }
    }
    sync_cube();
    seg_reduce(&mut red, r, false);
    // `Σ p·V`: unit `u` takes `d = u % hd` over the positions `≡ u / hd (mod GQA_UNITS / hd)`.
    let parts = GQA_UNITS / hd;
    let dd = u % hd;
    let j0 = u / hd;
    let per = ATTN_CHUNK / parts;
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
    #[unroll]
    for j in 0..r {
        let mut acc = 0.0f32;
        #[unroll]
        for i in 0..per {
            acc += ps[j * ATTN_CHUNK + j0 + i * parts] * vals[i];
        }
        sm[j * GQA_UNITS + u] = acc;
    }
    sync_cube();
    let hb = (b * nh + gh * r) * chunks + c;
    if u < hd {
        #[unroll]
        for j in 0..r {
            let mut o = 0.0f32;
            #[unroll]
            for jj in 0..parts {
                o += sm[j * GQA_UNITS + jj * hd + u];
            }
            part[(hb + j * chunks) * (hd + 2) + 2 + u] = o;
        }
    }
    if u < r {
        let pb = (hb + u * chunks) * (hd + 2);
        part[pb] = mj;
        part[pb + 1] = red[u * ATTN_CHUNK];
    }
}
