//! GQA decode attention over state slots, one new token per row, no RoPE, softmax in f32:
//!
//! 1. append: one unit per `(b, kv head, d)`: `K[s, g, len[s], d] = k[b, g, d]` (same for V);
//! 2. scores: one unit per `(b, q head, t)`, `t ≤ len[s]`: `σ[b, h, t] = scale · q[b, h]·K[s, h/r, t]`
//!    (f32 scratch `[B, NH, cap]`; units past the length exit);
//! 3. partials: a cube per `(b, q head, chunk of ATTN_CHUNK positions)`, one unit per `d`:
//!    `m = max σ`, `z = Σ exp(σ − m)`, `o[d] = Σ_t exp(σ_t − m) · V[s, h/r, t, d]` over the chunk
//!    (V reads coalesced along `d`);
//! 4. merge: a cube per `(b, q head)`: the chunks' partials rescaled to the row's maximum,
//!    `o = Σ o_c · e^(m_c − M) / Σ z_c · e^(m_c − M)` (flash-decoding).
//!
//! Where the head dim allows (even, dividing 128 — every real config), 1–3 run as one launch with
//! the append folded in, then the merge: two launches per layer. By default
//! ([`AttnForm::Gqa`], [`attn_gqa_kernel()`]) a cube takes one `(kv head, row, chunk of 64
//! positions)` for all the query heads of its group, so each K/V chunk is read once per group
//! (16 query heads share a kv head in the Nano/Lightning geometry); [`attn_split_kernel()`] (a
//! cube per query head) stays for groups too large for its shared memory. The four-launch form
//! stays for other head dims.
//!
//! Grids: the `(row, chunk)` pairs (or rows, for the merge) fold over y and z, so any batch and
//! capacity fit the launch limits.
//!
//! The lengths and slots are read on the device (`len[s]` before this step's token), so the same
//! launches serve every step of a captured graph; pad rows (`slot < 0`) write zeros.

use crate::cube::buffers::{
    arg, contiguous_as, elemwise, empty, float_buf, i32_buf, with_float, yz,
};
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

/// Context positions per partial of [`attn_partial_kernel()`] (the flash-decoding split).
pub const ATTN_CHUNK: usize = 64;

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

/// Context positions per cube of [`attn_split_kernel()`].
pub const SPLIT_CHUNK: usize = ATTN_CHUNK;
/// Units per cube of [`attn_split_kernel()`]: two per position while scoring (each half of `d`).
pub const SPLIT_UNITS: usize = 2 * SPLIT_CHUNK;

/// One chunk of [`SPLIT_CHUNK`] positions of one `(row, q head)`, in one launch: scores, the
/// chunk's softmax partials and `Σ p·V` (then [`attn_merge_kernel()`]), with this step's K/V row
/// appended by one cube of its kv group. A cube per `(q head, row, chunk)`, [`SPLIT_UNITS`]
/// units. Every loop runs a comptime count with its loads issued before their use, so a chunk
/// costs a few memory latencies; the position being appended is read from `k`/`v` (the pool
/// is written by another cube of the same launch). `hd` divides [`SPLIT_UNITS`] and is even.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn attn_split_kernel<F: Float>(
    q: &[F],
    k: &[F],
    v: &[F],
    lens: &[i32],
    slots: &[i32],
    kpool: &mut [F],
    vpool: &mut [F],
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
    #[comptime] hd: usize,
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
    if h % r == 0 && len < t0 + SPLIT_CHUNK && u < hd {
        kpool[(kvb + len) * hd + u] = k[kb0 + u];
        vpool[(kvb + len) * hd + u] = v[vb0 + u];
    }
    // Scores: unit `u` takes position `t0 + u % CHUNK`, half `u / CHUNK` of `d`.
    let half = hd / 2;
    let p = u % SPLIT_CHUNK;
    let d0 = (u / SPLIT_CHUNK) * half;
    let t = (t0 + p).min(n - 1);
    let qb = b * q_row as usize + h * hd + d0;
    let mut kv = Array::<f32>::new(half);
    if t == len {
        #[unroll]
        for i in 0..half {
            kv[i] = f32::cast_from(k[kb0 + d0 + i]);
        }
    } else {
        let kb = (kvb + t) * hd + d0;
        #[unroll]
        for i in 0..half {
            kv[i] = f32::cast_from(kpool[kb + i]);
        }
    }
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
            f32::cast_from(v[vb0 + dd])
        } else {
            f32::cast_from(vpool[(kvb + tt) * hd + dd])
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

/// Chunk partials the merge reads per round (loads issued before use: a round costs one
/// memory latency, where a serial walk cost one per chunk — ≈ 40 µs per layer after an 8K prompt).
const MERGE_UNROLL: usize = 8;

/// Merges a `(row, q head)`'s chunk partials: `M = max m_c`, `Z = Σ z_c · e^(m_c − M)`,
/// `o[d] = Σ o_c[d] · e^(m_c − M) / Z` (pad rows write zeros). A cube per `(q head, row)`, a unit
/// per `d`; chunks taken `MERGE_UNROLL` at a time.
#[cube(launch)]
pub fn attn_merge_kernel<F: Float>(
    part: &[f32],
    lens: &[i32],
    slots: &[i32],
    o: &mut [F],
    heads: u32,
    head_dim: u32,
    chunks: u32,
    #[comptime] chunk: usize,
) {
    let (nh, hd, chunks) = (heads as usize, head_dim as usize, chunks as usize);
    // Rows folded over y and z (past 65,535 rows).
    let b = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    if b >= slots.len() {
        terminate!();
    }
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
    let n = lens[slot as usize] as usize + 1;
    let used = n.div_ceil(chunk);
    let stride = hd + 2;
    let base = (b * nh + h) * chunks * stride;
    // Chunk 0 always holds a position; rounds clamp to the last used chunk (a repeat changes
    // neither the maximum nor, masked, the sums).
    let mut mm = part[base];
    let mut c0 = 0usize;
    while c0 < used {
        let mut ms = Array::<f32>::new(MERGE_UNROLL);
        #[unroll]
        for i in 0..MERGE_UNROLL {
            ms[i] = part[base + (c0 + i).min(used - 1) * stride];
        }
        #[unroll]
        for i in 0..MERGE_UNROLL {
            mm = mm.max(ms[i]);
        }
        c0 += MERGE_UNROLL;
    }
    let mut z = 0.0f32;
    let mut acc = 0.0f32;
    c0 = 0usize;
    while c0 < used {
        let mut ms = Array::<f32>::new(MERGE_UNROLL);
        let mut zs = Array::<f32>::new(MERGE_UNROLL);
        let mut os = Array::<f32>::new(MERGE_UNROLL);
        #[unroll]
        for i in 0..MERGE_UNROLL {
            let pb = base + (c0 + i).min(used - 1) * stride;
            ms[i] = part[pb];
            zs[i] = part[pb + 1];
            os[i] = part[pb + 2 + dd];
        }
        #[unroll]
        for i in 0..MERGE_UNROLL {
            let f = if c0 + i < used {
                (ms[i] - mm).exp()
            } else {
                0.0f32
            };
            z += zs[i] * f;
            acc += os[i] * f;
        }
        c0 += MERGE_UNROLL;
    }
    o[oi] = F::cast_from(acc / z);
}

/// Units per cube of [`attn_gqa_kernel()`]: two per position of a [`SPLIT_CHUNK`] chunk.
pub const GQA_UNITS: usize = 2 * SPLIT_CHUNK;
/// Shared memory (bytes) [`attn_gqa_kernel()`] may take; larger groups run [`attn_split_kernel()`].
const GQA_SHARED: usize = 40 * 1024;

/// Max (`max`) or sum over each of the `r` segments of [`SPLIT_CHUNK`] values of `a`, left in
/// the segment's first entry: a shared-memory tree over every unit of the cube (no plane ops, so
/// lavapipe runs it too). Every unit must call it.
#[cube]
fn seg_reduce(a: &mut Shared<[f32]>, #[comptime] r: usize, #[comptime] max: bool) {
    let u = UNIT_POS_X as usize;
    // A runtime stride (a comptime one cannot be updated): `CUBE_DIM = GQA_UNITS = 2 · CHUNK`.
    let mut stride = CUBE_DIM_X as usize / 4;
    while stride > 0 {
        #[unroll]
        for i in 0..comptime!((r * SPLIT_CHUNK / 2).div_ceil(GQA_UNITS)) {
            let e = u + i * GQA_UNITS;
            if e < r * stride {
                let at = (e / stride) * SPLIT_CHUNK + e % stride;
                let (x, y) = (a[at], a[at + stride]);
                a[at] = if max { x.max(y) } else { x + y };
            }
        }
        sync_cube();
        stride /= 2;
    }
}

/// One chunk of [`SPLIT_CHUNK`] positions of one `(row, kv head)` for all `r` query heads of its
/// group, in one launch (then [`attn_merge_kernel()`]): the chunk's K and V are read once for the
/// `r` heads instead of once per head, as GQA allows. A cube per `(kv head, row, chunk)`,
/// [`GQA_UNITS`] units: scores with unit `u` on position `u % CHUNK` and half `u / CHUNK` of `d`
/// (its K half-row in registers, the `r` query rows in shared memory), softmax partials by
/// per-head shared-memory trees, `Σ p·V` with unit `u` on `d = u % hd`. The step's K/V row is
/// appended by the cube whose chunk holds it and read from `k`/`v` by the scores. `hd` is even and
/// divides [`GQA_UNITS`].
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn attn_gqa_kernel<F: Float>(
    q: &[F],
    k: &[F],
    v: &[F],
    lens: &[i32],
    slots: &[i32],
    kpool: &mut [F],
    vpool: &mut [F],
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
    #[comptime] hd: usize,
    #[comptime] r: usize,
) {
    let (nh, kvh, cap, chunks) = (
        heads as usize,
        kv_heads as usize,
        cap as usize,
        chunks as usize,
    );
    let g = CUBE_POS_X as usize;
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
    let t0 = c * SPLIT_CHUNK;
    if t0 >= n {
        terminate!();
    }
    let kvb = (s * kvh + g) * cap;
    let newb = b * kv_row as usize + g * hd;
    let (kb0, vb0) = (newb + k_off as usize, newb + v_off as usize);
    if len < t0 + SPLIT_CHUNK && u < hd {
        kpool[(kvb + len) * hd + u] = k[kb0 + u];
        vpool[(kvb + len) * hd + u] = v[vb0 + u];
    }
    // The group's query rows are contiguous: heads `g·r .. g·r + r` of row `b`.
    let qb = b * q_row as usize + g * r * hd;
    let mut qs = Shared::<[f32]>::new_slice(r * hd);
    #[unroll]
    for i in 0..comptime!((r * hd).div_ceil(GQA_UNITS)) {
        let e = u + i * GQA_UNITS;
        if e < r * hd {
            qs[e] = f32::cast_from(q[qb + e]);
        }
    }
    let half = hd / 2;
    let p = u % SPLIT_CHUNK;
    let d0 = (u / SPLIT_CHUNK) * half;
    let t = (t0 + p).min(n - 1);
    let mut kv = Array::<f32>::new(half);
    if t == len {
        #[unroll]
        for i in 0..half {
            kv[i] = f32::cast_from(k[kb0 + d0 + i]);
        }
    } else {
        let kb = (kvb + t) * hd + d0;
        #[unroll]
        for i in 0..half {
            kv[i] = f32::cast_from(kpool[kb + i]);
        }
    }
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
    let valid = (n - t0).min(SPLIT_CHUNK);
    // Scores `[r, CHUNK]` (positions past the length take the chunk's first score: they change
    // no maximum and are zeroed below).
    let mut ps = Shared::<[f32]>::new_slice(r * SPLIT_CHUNK);
    let mut red = Shared::<[f32]>::new_slice(r * SPLIT_CHUNK);
    #[unroll]
    for i in 0..comptime!((r * SPLIT_CHUNK).div_ceil(GQA_UNITS)) {
        let e = u + i * GQA_UNITS;
        if e < r * SPLIT_CHUNK {
            let (j, pp) = (e / SPLIT_CHUNK, e % SPLIT_CHUNK);
            let pv = if pp < valid { pp } else { 0usize };
            let sc = (sm[j * GQA_UNITS + pv] + sm[j * GQA_UNITS + pv + SPLIT_CHUNK]) * scale;
            ps[e] = sc;
            red[e] = sc;
        }
    }
    sync_cube();
    seg_reduce(&mut red, r, true);
    #[unroll]
    for i in 0..comptime!((r * SPLIT_CHUNK).div_ceil(GQA_UNITS)) {
        let e = u + i * GQA_UNITS;
        if e < r * SPLIT_CHUNK {
            let (j, pp) = (e / SPLIT_CHUNK, e % SPLIT_CHUNK);
            let w = if pp < valid {
                (ps[e] - red[j * SPLIT_CHUNK]).exp()
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
        mj = red[u * SPLIT_CHUNK];
    }
    sync_cube();
    #[unroll]
    for i in 0..comptime!((r * SPLIT_CHUNK).div_ceil(GQA_UNITS)) {
        let e = u + i * GQA_UNITS;
        if e < r * SPLIT_CHUNK {
            red[e] = ps[e];
        }
    }
    sync_cube();
    seg_reduce(&mut red, r, false);
    // `Σ p·V`: unit `u` takes `d = u % hd` over the positions `≡ u / hd (mod GQA_UNITS / hd)`.
    let parts = GQA_UNITS / hd;
    let dd = u % hd;
    let j0 = u / hd;
    let per = SPLIT_CHUNK / parts;
    let mut vals = Array::<f32>::new(per);
    #[unroll]
    for i in 0..per {
        let tt = (t0 + j0 + i * parts).min(n - 1);
        vals[i] = if tt == len {
            f32::cast_from(v[vb0 + dd])
        } else {
            f32::cast_from(vpool[(kvb + tt) * hd + dd])
        };
    }
    #[unroll]
    for j in 0..r {
        let mut acc = 0.0f32;
        #[unroll]
        for i in 0..per {
            acc += ps[j * SPLIT_CHUNK + j0 + i * parts] * vals[i];
        }
        sm[j * GQA_UNITS + u] = acc;
    }
    sync_cube();
    let hb = (b * nh + g * r) * chunks + c;
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
        part[pb + 1] = red[u * SPLIT_CHUNK];
    }
}

/// Whether [`attn_split_kernel()`] takes head dim `hd` (even, dividing its 128 units: 2 … 128).
fn split_applies(hd: usize) -> bool {
    hd >= 2 && hd % 2 == 0 && SPLIT_UNITS % hd == 0
}

/// Which form of decode attention [`launch`] runs where the head dim allows the fused ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnForm {
    /// [`attn_gqa_kernel()`] + merge: one cube per `(kv head, row, chunk)` for the group's heads.
    Gqa,
    /// [`attn_split_kernel()`] + merge: one cube per `(q head, row, chunk)`.
    Split,
    /// Append, scores, partials, merge: four launches.
    Unfused,
}

/// The form that runs when `asked` is set, for `heads` query heads over `kv_heads`, head dim
/// `hd` (pure; tested on the host): the GQA form where its cube's shared memory holds the
/// group's rows (`r` query rows, `r` unit sums and two `r × CHUNK` score arrays), else the split
/// form; either fused form only where the head dim divides the split cube's units, else the
/// unfused one.
pub fn plan(asked: AttnForm, heads: usize, kv_heads: usize, hd: usize) -> AttnForm {
    let group = heads / kv_heads.max(1);
    let gqa_bytes = group * (hd + GQA_UNITS + 2 * SPLIT_CHUNK) * 4;
    if !split_applies(hd) {
        AttnForm::Unfused
    } else if asked == AttnForm::Gqa && gqa_bytes > GQA_SHARED {
        AttnForm::Split
    } else {
        asked
    }
}

static FORM: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sets the decode attention form (process-wide; for tests and benchmarks). The default is
/// [`AttnForm::Gqa`].
pub fn set_form(f: AttnForm) {
    let v = match f {
        AttnForm::Gqa => 0,
        AttnForm::Split => 1,
        AttnForm::Unfused => 2,
    };
    FORM.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// The form [`set_form`] chose.
pub fn form() -> AttnForm {
    match FORM.load(std::sync::atomic::Ordering::Relaxed) {
        0 => AttnForm::Gqa,
        1 => AttnForm::Split,
        _ => AttnForm::Unfused,
    }
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
    let (k, v) = (contiguous_as(k, dtype), contiguous_as(v, dtype));
    let qs = q.meta.shape().clone();
    let (rows, nh, hd) = (qs[0], qs[1], qs[2]);
    let kvh = kpool.meta.shape()[1];
    let layout = Layout {
        rows,
        heads: nh,
        q_row: nh * hd,
        kv_row: kvh * hd,
        k_off: 0,
        v_off: 0,
    };
    run(q, k, v, layout, kpool, vpool, lens, slots, scale)
}

/// [`launch`] with `q | k | v` read in place from one projection row per token: `qkv`
/// `[B, (NH + 2·KVH)·D]` (no slicing copies, one projection launch instead of three).
#[allow(clippy::too_many_arguments)]
pub fn launch_fused<R: CubeRuntime>(
    qkv: CubeTensor<R>,
    heads: usize,
    kpool: CubeTensor<R>,
    vpool: CubeTensor<R>,
    lens: CubeTensor<R>,
    slots: CubeTensor<R>,
    scale: f32,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let x = float_buf(qkv);
    let xs = x.meta.shape().clone();
    let (rows, width) = (xs[0], xs[1]);
    let ps = kpool.meta.shape().clone();
    let (kvh, hd) = (ps[1], ps[3]);
    assert_eq!(
        width,
        (heads + 2 * kvh) * hd,
        "attention_step_qkv: a row of {width} for {heads} + 2 × {kvh} heads of {hd}"
    );
    let layout = Layout {
        rows,
        heads,
        q_row: width,
        kv_row: width,
        k_off: heads * hd,
        v_off: (heads + kvh) * hd,
    };
    run(
        x.clone(),
        x.clone(),
        x,
        layout,
        kpool,
        vpool,
        lens,
        slots,
        scale,
    )
}

/// Where a row's query heads and new K/V sit in the `q`, `k`, `v` buffers (values).
struct Layout {
    rows: usize,
    heads: usize,
    q_row: usize,
    kv_row: usize,
    k_off: usize,
    v_off: usize,
}

#[allow(clippy::too_many_arguments)]
fn run<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    layout: Layout,
    kpool: CubeTensor<R>,
    vpool: CubeTensor<R>,
    lens: CubeTensor<R>,
    slots: CubeTensor<R>,
    scale: f32,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
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
    let (lens, slots) = (i32_buf(lens), i32_buf(slots));
    let (rows, nh) = (layout.rows, layout.heads);
    let ps = kpool.meta.shape().clone();
    let (kvh, cap, hd) = (ps[1], ps[2], ps[3]);
    let (q_row, kv_row, k_off, v_off) = (
        layout.q_row as u32,
        layout.kv_row as u32,
        layout.k_off as u32,
        layout.v_off as u32,
    );
    let chunks = cap.div_ceil(ATTN_CHUNK);
    let part = empty(&q, [rows, nh, chunks, hd + 2], DType::F32);
    let o = empty(&q, [rows, nh, hd], dtype);
    let client = q.client.clone();
    let form = plan(form(), nh, kvh, hd);
    if form != AttnForm::Unfused {
        macro_rules! split {
            ($t:ty) => {{
                if form == AttnForm::Gqa {
                    attn_gqa_kernel::launch::<$t, R>(
                        &client,
                        {
                            let (y, z) = yz(rows * chunks);
                            CubeCount::Static(kvh as u32, y, z)
                        },
                        CubeDim::new_1d(GQA_UNITS as u32),
                        arg(&q),
                        arg(&k),
                        arg(&v),
                        arg(&lens),
                        arg(&slots),
                        arg(&kpool),
                        arg(&vpool),
                        arg(&part),
                        nh as u32,
                        kvh as u32,
                        cap as u32,
                        chunks as u32,
                        scale,
                        q_row,
                        kv_row,
                        k_off,
                        v_off,
                        hd,
                        nh / kvh,
                    );
                } else {
                    attn_split_kernel::launch::<$t, R>(
                        &client,
                        {
                            let (y, z) = yz(rows * chunks);
                            CubeCount::Static(nh as u32, y, z)
                        },
                        CubeDim::new_1d(SPLIT_UNITS as u32),
                        arg(&q),
                        arg(&k),
                        arg(&v),
                        arg(&lens),
                        arg(&slots),
                        arg(&kpool),
                        arg(&vpool),
                        arg(&part),
                        nh as u32,
                        kvh as u32,
                        cap as u32,
                        chunks as u32,
                        scale,
                        q_row,
                        kv_row,
                        k_off,
                        v_off,
                        hd,
                    );
                }
                attn_merge_kernel::launch::<$t, R>(
                    &client,
                    {
                        let (y, z) = yz(rows);
                        CubeCount::Static(nh as u32, y, z)
                    },
                    CubeDim::new_1d(hd as u32),
                    arg(&part),
                    arg(&lens),
                    arg(&slots),
                    arg(&o),
                    nh as u32,
                    hd as u32,
                    chunks as u32,
                    ATTN_CHUNK,
                );
            }};
        }
        with_float!(dtype, split);
        return (o, kpool, vpool);
    }
    let scores = empty(&q, [rows, nh, cap], DType::F32);
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
                kv_row,
                k_off,
                v_off,
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
                q_row,
            );
            attn_partial_kernel::launch::<$t, R>(
                &client,
                {
                    let (y, z) = yz(rows * chunks);
                    CubeCount::Static(nh as u32, y, z)
                },
                CubeDim::new_1d(hd as u32),
                arg(&scores),
                arg(&vpool),
                arg(&lens),
                arg(&slots),
                arg(&part),
                nh as u32,
                kvh as u32,
                hd as u32,
                cap as u32,
                chunks as u32,
                ATTN_CHUNK,
            );
            attn_merge_kernel::launch::<$t, R>(
                &client,
                {
                    let (y, z) = yz(rows);
                    CubeCount::Static(nh as u32, y, z)
                },
                CubeDim::new_1d(hd as u32),
                arg(&part),
                arg(&lens),
                arg(&slots),
                arg(&o),
                nh as u32,
                hd as u32,
                chunks as u32,
                ATTN_CHUNK,
            );
        }};
    }
    with_float!(dtype, go);
    (o, kpool, vpool)
}
