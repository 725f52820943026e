//! Prefill attention in one launch: causal GQA of a prompt chunk over its sequence's keys in a
//! pool, flash attention's tiling on the SIMT units (no `[heads, T, S]` scores in memory, no
//! expanded K/V copies, ragged sequences and a cached prefix in the same launch).
//!
//! **Math.** For sequence `b` with `past` keys before the chunk and chunk row `i < len`, query
//! head `h` (kv head `g = h / rep`) attends keys `0 ..= past + i` of its pool rows:
//! `o = Σ_j softmax_j(scale · q·k_j) · v_j`, every product, the softmax and the sums in f32
//! (inputs in their storage type). The softmax runs online over tiles of [`FLASH_KEYS`] keys:
//! per row the running maximum `m`, the running sum `l`, and the accumulator rescaled by
//! `e^{m_old − m_new}` before each tile's `P·V`, divided by `l` at the end. Rows `len ≤ i < T`
//! are written as zeros.
//!
//! **Tiles.** A cube takes [`FLASH_ROWS`] rows of one `(b, g)`: the rows of its `rep` query
//! heads position by position (row `r` is position `r / rep`, head `g·rep + r % rep`), so the
//! rows of a tile share their causal extent and each K/V tile is read once for the whole group.
//! [`FLASH_UNITS`] units: for the scores unit `u` computes rows `2(u/8)`, `+1` × keys `u%8 + 8j`
//! (`j < bc/8`, `bc` keys per tile: [`keys_per_tile`]), reading `q` and `k` from shared memory (rows padded by one word: conflict-free);
//! one unit per row then takes the tile's maximum, writes `p` and the rescale factor; for `P·V`
//! unit `u` owns rows `2(u/8)`, `+1` × columns `u%8 + 8j` (`j < D/8`) in registers. K and V take
//! turns in one shared buffer. Shared memory at `D = 128`: 37,632 bytes at 32 keys a tile.
//!
//! Grid: one cube per `(b, g, tile)`, the heaviest (last) tiles first, folded over x and y.

use super::super::buffers::{arg, empty, float_buf, fold, i32_buf, with_float};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

/// Query rows (position × head pairs) per cube.
pub const FLASH_ROWS: usize = 32;
/// Keys per tile where shared memory allows ([`keys_per_tile`]; 16 otherwise).
pub const FLASH_KEYS: usize = 32;
/// Units per cube.
pub const FLASH_UNITS: usize = 128;
/// Shared memory (bytes) of a cube with `bc` keys per tile and heads of `d`.
pub fn shared_bytes(bc: usize, d: usize) -> usize {
    4 * (FLASH_ROWS * (d + 1) + bc * (d + 1) + FLASH_ROWS * (bc + 1) + 3 * FLASH_ROWS)
}

/// Keys per tile for heads of `d` on a device with `max_shared` bytes of shared memory per cube:
/// [`FLASH_KEYS`] where it fits (37,632 bytes at `d = 128`), else 16 (27,328 bytes: lavapipe has 32 KiB),
/// else `None` (the head dimension is refused: [`crate::ops::attention_prefill_fits`]).
pub fn keys_per_tile(max_shared: usize, d: usize) -> Option<usize> {
    if !(d > 0 && d % 8 == 0 && d <= crate::MAX_PREFILL_HEAD_DIM) {
        return None;
    }
    [FLASH_KEYS, 16]
        .into_iter()
        .find(|&bc| shared_bytes(bc, d) <= max_shared)
}

/// The shared memory per cube of `client`'s device.
pub fn max_shared<R: CubeRuntime>(client: &ComputeClient<R>) -> usize {
    client.properties().hardware.max_shared_memory_size
}

/// Masked scores (finite: WGSL has no infinity literal), far below any real one.
const MASKED: f32 = crate::MASKED_SCORE;

/// Module docs. `q`: row `(b, i)` at `(b·T + i)·q_stride`, head `h` at `h·D` of it; pools
/// `[S, KVH, cap, D]`; `seqs` `[B, 3]`: slot, keys before the chunk, chunk length; `o`
/// `[B, T, NH, D]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn flash_prefill_kernel<F: Float>(
    q: &[F],
    kpool: &[F],
    vpool: &[F],
    seqs: &[i32],
    o: &mut [F],
    t_len: u32,
    q_stride: u32,
    heads: u32,
    kv_heads: u32,
    cap: u32,
    tiles: u32,
    cubes: u32,
    scale: f32,
    #[comptime] d: usize,
    #[comptime] bc: usize,
) {
    let c = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    // Uniform over the cube (the syncs below need every unit).
    if c >= cubes as usize {
        terminate!();
    }
    let br = comptime!(FLASH_ROWS);
    let units = comptime!(FLASH_UNITS);
    let dp = comptime!(d + 1);
    let cols = comptime!(d / 8);
    let tiles = tiles as usize;
    let tile = tiles - 1 - c % tiles;
    let (kvh, nh, t) = (kv_heads as usize, heads as usize, t_len as usize);
    let (b, g) = ((c / tiles) / kvh, (c / tiles) % kvh);
    let rep = nh / kvh;
    let slot = seqs[b * 3] as usize;
    let past = seqs[b * 3 + 1] as usize;
    let len = (seqs[b * 3 + 2] as usize).min(t);
    let row0 = tile * br;
    let u = UNIT_POS as usize;
    let (tr, tc) = (u / 8, u % 8);
    let (r0, r1) = (2 * tr, 2 * tr + 1);
    let (i0, i1) = ((row0 + r0) / rep, (row0 + r1) / rep);
    // Where rows `r0`, `r1` go in `o` (read only where `i < t`).
    let o0 = ((b * t + i0) * nh + g * rep + (row0 + r0) % rep) * d;
    let o1 = ((b * t + i1) * nh + g * rep + (row0 + r1) % rep) * d;
    // Every row of the tile past the chunk: zeros (uniform over the cube).
    if len == 0 || row0 / rep >= len {
        #[unroll]
        for j in 0..cols {
            if i0 < t {
                o[o0 + tc + 8 * j] = F::new(0.0);
            }
            if i1 < t {
                o[o1 + tc + 8 * j] = F::new(0.0);
            }
        }
        terminate!();
    }
    let mut qs = Shared::<[f32]>::new_slice(comptime!(FLASH_ROWS * (d + 1)));
    let mut kv = Shared::<[f32]>::new_slice(comptime!(bc * (d + 1)));
    let mut ps = Shared::<[f32]>::new_slice(comptime!(FLASH_ROWS * (bc + 1)));
    let mut ms = Shared::<[f32]>::new_slice(comptime!(FLASH_ROWS));
    let mut ls = Shared::<[f32]>::new_slice(comptime!(FLASH_ROWS));
    let mut als = Shared::<[f32]>::new_slice(comptime!(FLASH_ROWS));
    // The query tile, scaled; rows past the chunk staged as zeros.
    let mut e = u;
    while e < br * d {
        let (r, dd) = (e / d, e % d);
        let i = (row0 + r) / rep;
        let mut val = 0.0f32;
        if i < len {
            let h = g * rep + (row0 + r) % rep;
            val = f32::cast_from(q[(b * t + i) * q_stride as usize + h * d + dd]) * scale;
        }
        qs[r * dp + dd] = val;
        e += units;
    }
    if u < br {
        ms[u] = MASKED;
        ls[u] = 0.0;
    }
    // The last key any row of the tile sees (rows past the chunk see what its last row sees).
    let last = past + ((row0 + br - 1) / rep).min(len - 1);
    // Row `r`'s last key.
    let lim0 = past + i0.min(len - 1);
    let lim1 = past + i1.min(len - 1);
    let base = (slot * kvh + g) * cap as usize;
    let mut acc0 = Array::<f32>::new(comptime!(d / 8));
    let mut acc1 = Array::<f32>::new(comptime!(d / 8));
    #[unroll]
    for j in 0..cols {
        acc0[j] = 0.0;
        acc1[j] = 0.0;
    }
    let key_tiles = (last + bc) / bc;
    for kt in 0..key_tiles {
        let k0 = kt * bc;
        // K tile (keys past `last` staged as zeros; masked below).
        let mut e = u;
        while e < bc * d {
            let (r, dd) = (e / d, e % d);
            let mut val = 0.0f32;
            if k0 + r <= last {
                val = f32::cast_from(kpool[(base + k0 + r) * d + dd]);
            }
            kv[r * dp + dd] = val;
            e += units;
        }
        sync_cube();
        let mut s0 = Array::<f32>::new(comptime!(bc / 8));
        let mut s1 = Array::<f32>::new(comptime!(bc / 8));
        #[unroll]
        for j in 0..bc / 8 {
            s0[j] = 0.0;
            s1[j] = 0.0;
        }
        for dd in 0..d {
            let (a0, a1) = (qs[r0 * dp + dd], qs[r1 * dp + dd]);
            #[unroll]
            for j in 0..bc / 8 {
                let kk = kv[(tc + 8 * j) * dp + dd];
                s0[j] += a0 * kk;
                s1[j] += a1 * kk;
            }
        }
        #[unroll]
        for j in 0..bc / 8 {
            let key = k0 + tc + 8 * j;
            let mut v0 = s0[j];
            let mut v1 = s1[j];
            if key > lim0 {
                v0 = MASKED;
            }
            if key > lim1 {
                v1 = MASKED;
            }
            ps[r0 * (bc + 1) + tc + 8 * j] = v0;
            ps[r1 * (bc + 1) + tc + 8 * j] = v1;
        }
        sync_cube();
        // One unit per row: the online softmax; meanwhile the others stage V.
        if u < br {
            let m_old = ms[u];
            let mut mx = m_old;
            for j in 0..bc {
                mx = mx.max(ps[u * (bc + 1) + j]);
            }
            let mut sum = 0.0f32;
            for j in 0..bc {
                let s = ps[u * (bc + 1) + j];
                let mut p = 0.0f32;
                if s > MASKED {
                    p = (s - mx).exp();
                }
                ps[u * (bc + 1) + j] = p;
                sum += p;
            }
            let alpha = (m_old - mx).exp();
            als[u] = alpha;
            ls[u] = ls[u] * alpha + sum;
            ms[u] = mx;
        }
        let mut e = u;
        while e < bc * d {
            let (r, dd) = (e / d, e % d);
            let mut val = 0.0f32;
            if k0 + r <= last {
                val = f32::cast_from(vpool[(base + k0 + r) * d + dd]);
            }
            kv[r * dp + dd] = val;
            e += units;
        }
        sync_cube();
        let (al0, al1) = (als[r0], als[r1]);
        #[unroll]
        for j in 0..cols {
            acc0[j] *= al0;
            acc1[j] *= al1;
        }
        for kk in 0..bc {
            let (p0, p1) = (ps[r0 * (bc + 1) + kk], ps[r1 * (bc + 1) + kk]);
            #[unroll]
            for j in 0..cols {
                let vv = kv[kk * dp + tc + 8 * j];
                acc0[j] += p0 * vv;
                acc1[j] += p1 * vv;
            }
        }
        sync_cube();
    }
    // Rows past the chunk: zeros.
    let mut inv0 = 0.0f32;
    let mut inv1 = 0.0f32;
    if i0 < len {
        inv0 = 1.0f32 / ls[r0];
    }
    if i1 < len {
        inv1 = 1.0f32 / ls[r1];
    }
    #[unroll]
    for j in 0..cols {
        if i0 < t {
            o[o0 + tc + 8 * j] = F::cast_from(acc0[j] * inv0);
        }
        if i1 < t {
            o[o1 + tc + 8 * j] = F::cast_from(acc1[j] * inv1);
        }
    }
}

/// Launches [`flash_prefill_kernel()`] (module docs) with `bc` keys per tile
/// ([`keys_per_tile`]): `q` `[B, T, W]` with head `h` of a row at columns `h·D ..` (`W ≥
/// heads·D`: a fused `q | k | v` row is read in place), `kpool`/`vpool` `[S, KVH, cap, D]`,
/// `seqs` `[B, 3]` (slot, keys before the chunk, chunk length; checked by the caller against
/// `cap` and `T`). Returns `[B, T, heads·D]` in `q`'s dtype.
pub fn launch<R: CubeRuntime>(
    q: CubeTensor<R>,
    kpool: CubeTensor<R>,
    vpool: CubeTensor<R>,
    seqs: CubeTensor<R>,
    heads: usize,
    scale: f32,
    bc: usize,
) -> CubeTensor<R> {
    let q = float_buf(q);
    let dtype = q.dtype;
    let kpool = super::super::buffers::contiguous_as(kpool, dtype);
    let vpool = super::super::buffers::contiguous_as(vpool, dtype);
    let seqs = i32_buf(seqs);
    let [b, t, w] = [q.meta.shape()[0], q.meta.shape()[1], q.meta.shape()[2]];
    let ps = kpool.meta.shape().clone();
    let (kvh, cap, d) = (ps[1], ps[2], ps[3]);
    assert!(
        kvh > 0 && heads % kvh == 0 && w >= heads * d,
        "flash prefill: q [{b}, {t}, {w}] for {heads} heads of {d}, pool {ps:?}"
    );
    assert!(
        bc % 8 == 0 && shared_bytes(bc, d) <= max_shared(&q.client),
        "flash prefill: {bc} keys a tile of heads of {d} (prefill::plan chooses)"
    );
    let o = empty(&q, [b, t, heads * d], dtype);
    let tiles = (t * (heads / kvh)).div_ceil(FLASH_ROWS);
    let cubes = b * kvh * tiles;
    if cubes == 0 {
        return o;
    }
    macro_rules! go {
        ($t:ty) => {
            flash_prefill_kernel::launch::<$t, R>(
                &q.client,
                fold(cubes),
                CubeDim::new_1d(FLASH_UNITS as u32),
                arg(&q),
                arg(&kpool),
                arg(&vpool),
                arg(&seqs),
                arg(&o),
                t as u32,
                w as u32,
                heads as u32,
                kvh as u32,
                cap as u32,
                tiles as u32,
                cubes as u32,
                scale,
                d,
                bc,
            )
        };
    }
    with_float!(dtype, go);
    o
}
