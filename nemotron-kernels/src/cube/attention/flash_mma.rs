//! Prefill attention on the tensor cores (bf16, CUDA): the math, rows and masking of
//! [`super::flash`], with both products as `mma` `m16n8k16` (bf16 → f32), as FlashAttention-2
//! arranges them.
//!
//! **Tiles.** A cube takes [`MMA_ROWS`] query rows of one `(b, g)` (row `r`: position
//! `r / rep`, head `g·rep + r % rep`), a warp 16 of them; keys come in tiles of [`MMA_KEYS`].
//! Per key tile a warp computes `S = Q·Kᵀ` for its 16 rows (its `Q` fragments held in
//! registers for the whole launch, `K` from shared memory), scales and masks it, takes each
//! row's maximum over the four lanes that hold it (`shuffle_xor` 1 and 2), rescales its running
//! sum and its `O` accumulator, and multiplies `P·V` with `P` straight from the `S` accumulator
//! (the accumulator layout of two `n`-tiles is the `A` layout of one `k`-tile), rounded to bf16
//! as FlashAttention does; every sum is f32. Each lane's running sum covers its own columns;
//! the four lanes of a row add theirs at the end.
//!
//! **Shared memory** (bf16 pairs, one 32-bit word each; rows padded by [`PAD`] words so a
//! fragment load's 8 rows × 4 words fall in 32 banks): `Q` rows (pairs along `D`), the key
//! tile's `K` rows (pairs along `D`) and `V` transposed (rows of `D`, pairs along keys). At
//! `D = 128`: 53,248 bytes.
//!
//! Grid: one cube per `(b, g, tile)`, the heaviest (last) tiles first, folded over x and y;
//! 4 warps. CUDA only ([`crate::cube::bf16_mma::available`]); bf16 inputs and output; `D` a multiple of 16 up to
//! [`crate::MAX_PREFILL_HEAD_DIM`].

use super::super::bf16_mma::{mma_acc, scaled, Pair, F2};
use super::super::buffers::{arg, contiguous_as, empty, fold, i32_buf};
use burn::tensor::{bf16, DType};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

/// Query rows per cube (4 warps of 16).
pub const MMA_ROWS: usize = 64;
/// Keys per tile.
pub const MMA_KEYS: usize = 64;
/// Padding words per shared row.
pub const PAD: usize = 4;

/// Masked scores, far below any real one.
const MASKED: f32 = crate::MASKED_SCORE;

/// Whether heads of `d` fit the kernel (pure).
pub fn fits(d: usize) -> bool {
    d >= 16 && d % 16 == 0 && d <= crate::MAX_PREFILL_HEAD_DIM
}

/// Shared memory (bytes) of a cube for heads of `d`.
pub fn shared_bytes(d: usize) -> usize {
    4 * (MMA_ROWS * (d / 2 + PAD) + MMA_KEYS * (d / 2 + PAD) + d * (MMA_KEYS / 2 + PAD))
}

/// Stages `rows` rows of `D` (16-byte vectors of 8 bf16) starting at vector `base` of `src`
/// into `dst` as pair words (row `r` at `r · stride`); rows at or past `valid` as zeros.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_rows<NV: Size>(
    src: &[Vector<bf16, NV>],
    dst: &mut Shared<[Pair]>,
    base: usize,
    valid: usize,
    stride: usize,
    tid: usize,
    #[comptime] rows: usize,
    #[comptime] d: usize,
) {
    let nv = comptime!(d / 8);
    let per = comptime!((rows * (d / 8)).div_ceil(128));
    #[unroll]
    for i in 0..per {
        let j = i * 128 + tid;
        if j < comptime!(rows * (d / 8)) {
            let (r, v) = (j / nv, j % nv);
            let rr = r.min(valid.max(1) - 1);
            let w = Vector::<u32, Const<4>>::reinterpret(src[base + rr * nv + v]);
            #[unroll]
            for m in 0..4usize {
                let mut u = w.extract(m);
                if r >= valid {
                    u = 0u32;
                }
                dst[r * stride + 4 * v + m] = Pair::reinterpret(u);
            }
        }
    }
}

/// Module docs. `q`: row `(b, i)` at element `(b·T + i)·q_stride` (vectors of 8), head `h` at
/// `h·D`; pools `[S, KVH, cap, D]`; `seqs` `[B, 3]`; `o` `[B, T, NH, D]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn flash_mma_kernel<NV: Size>(
    q: &[Vector<bf16, NV>],
    kpool: &[Vector<bf16, NV>],
    vpool: &[Vector<bf16, NV>],
    seqs: &[i32],
    o: &mut [bf16],
    t_len: u32,
    q_stride: u32,
    heads: u32,
    kv_heads: u32,
    cap: u32,
    tiles: u32,
    cubes: u32,
    scale: f32,
    #[comptime] d: usize,
) {
    let c = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    if c >= cubes as usize {
        terminate!();
    }
    let br = comptime!(MMA_ROWS);
    let bc = comptime!(MMA_KEYS);
    let tiles = tiles as usize;
    let tile = tiles - 1 - c % tiles;
    let (kvh, nh, t) = (kv_heads as usize, heads as usize, t_len as usize);
    let (b, g) = ((c / tiles) / kvh, (c / tiles) % kvh);
    let rep = nh / kvh;
    let slot = seqs[b * 3] as usize;
    let past = seqs[b * 3 + 1] as usize;
    let len = (seqs[b * 3 + 2] as usize).min(t);
    let row0 = tile * br;
    let (lane, warp) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let tid = warp * 32 + lane;
    let (gq, tq) = (lane / 4, lane % 4);
    // Every row of the tile past the chunk: zeros (uniform over the cube).
    if len == 0 || row0 / rep >= len {
        let mut e = tid;
        while e < comptime!(MMA_ROWS * d) {
            let (r, dd) = (e / d, e % d);
            let i = (row0 + r) / rep;
            if i < t {
                let h = g * rep + (row0 + r) % rep;
                o[((b * t + i) * nh + h) * d + dd] = bf16::cast_from(0.0f32);
            }
            e += 128;
        }
        terminate!();
    }
    let qw = comptime!(d / 2 + PAD);
    let vw = comptime!(MMA_KEYS / 2 + PAD);
    let mut qs = Shared::<[Pair]>::new_slice(comptime!(MMA_ROWS * (d / 2 + PAD)));
    let mut ks = Shared::<[Pair]>::new_slice(comptime!(MMA_KEYS * (d / 2 + PAD)));
    let mut vt = Shared::<[Pair]>::new_slice(comptime!(d * (MMA_KEYS / 2 + PAD)));
    let nv = comptime!(d / 8);
    // The query tile: row `r`'s vectors from its own (position, head); rows past the chunk zero.
    let qv = q_stride as usize / 8;
    #[unroll]
    for i in 0..comptime!((MMA_ROWS * (d / 8)).div_ceil(128)) {
        let j = i * 128 + tid;
        if j < comptime!(MMA_ROWS * (d / 8)) {
            let (r, v) = (j / nv, j % nv);
            let pos = (row0 + r) / rep;
            let h = g * rep + (row0 + r) % rep;
            let at = (b * t + pos.min(len - 1)) * qv + h * nv + v;
            let w = Vector::<u32, Const<4>>::reinterpret(q[at]);
            #[unroll]
            for m in 0..4usize {
                let mut u = w.extract(m);
                if pos >= len {
                    u = 0u32;
                }
                qs[r * qw + 4 * v + m] = Pair::reinterpret(u);
            }
        }
    }
    sync_cube();
    let def = MmaDefinition::<bf16, bf16, f32>::new(16usize, 8usize, 16usize);
    // This warp's rows `ra`, `rb` (= `ra + 8`) and their positions, heads and last keys.
    let ra = warp * 16 + gq;
    let rb = ra + 8;
    let (ia, ib) = ((row0 + ra) / rep, (row0 + rb) / rep);
    let lim_a = past + ia.min(len - 1);
    let lim_b = past + ib.min(len - 1);
    let mut qf = Array::<Pair>::new(comptime!(d / 16 * 4));
    #[unroll]
    for kk in 0..comptime!(d / 16) {
        qf[4 * kk] = qs[ra * qw + kk * 8 + tq];
        qf[4 * kk + 1] = qs[rb * qw + kk * 8 + tq];
        qf[4 * kk + 2] = qs[ra * qw + kk * 8 + 4 + tq];
        qf[4 * kk + 3] = qs[rb * qw + kk * 8 + 4 + tq];
    }
    let mut oacc = Array::<F2>::new(comptime!(d / 8 * 2));
    #[unroll]
    for j in 0..comptime!(d / 8 * 2) {
        oacc[j] = F2::new(0.0f32);
    }
    // Runtime values (a variable initialised from a constant cannot be reassigned).
    let mut m_a = scale * 0.0f32 + MASKED;
    let mut m_b = scale * 0.0f32 + MASKED;
    let mut l_a = 0.0f32;
    let mut l_b = 0.0f32;
    let last = past + ((row0 + br - 1) / rep).min(len - 1);
    let base = (slot * kvh + g) * cap as usize;
    let key_tiles = (last + bc) / bc;
    for kt in 0..key_tiles {
        let k0 = kt * bc;
        let valid = (last + 1 - k0).min(bc);
        stage_rows(kpool, &mut ks, (base + k0) * nv, valid, qw, tid, bc, d);
        // V transposed: unit items of (key pair, 8 columns), both keys' vectors loaded.
        #[unroll]
        for i in 0..comptime!((MMA_KEYS / 2 * (d / 8)).div_ceil(128)) {
            let j = i * 128 + tid;
            if j < comptime!(MMA_KEYS / 2 * (d / 8)) {
                let (kp, v) = (j % comptime!(MMA_KEYS / 2), j / comptime!(MMA_KEYS / 2));
                let (r0, r1) = (2 * kp, 2 * kp + 1);
                let wa = Vector::<u32, Const<4>>::reinterpret(
                    vpool[(base + k0 + r0.min(valid - 1)) * nv + v],
                );
                let wz = Vector::<u32, Const<4>>::reinterpret(
                    vpool[(base + k0 + r1.min(valid - 1)) * nv + v],
                );
                #[unroll]
                for m in 0..4usize {
                    let mut u0 = wa.extract(m);
                    let mut u1 = wz.extract(m);
                    if r0 >= valid {
                        u0 = 0u32;
                    }
                    if r1 >= valid {
                        u1 = 0u32;
                    }
                    let lo = (u0 & 0xFFFFu32) | (u1 << 16u32);
                    let hi = (u0 >> 16u32) | (u1 & 0xFFFF_0000u32);
                    vt[(v * 8 + 2 * m) * vw + kp] = Pair::reinterpret(lo);
                    vt[(v * 8 + 2 * m + 1) * vw + kp] = Pair::reinterpret(hi);
                }
            }
        }
        sync_cube();
        // S = Q·Kᵀ over the tile's 8 key tiles of 8.
        let mut sacc = Array::<F2>::new(comptime!(MMA_KEYS / 8 * 2));
        #[unroll]
        for j in 0..comptime!(MMA_KEYS / 8 * 2) {
            sacc[j] = F2::new(0.0f32);
        }
        #[unroll]
        for kk in 0..comptime!(d / 16) {
            let mut fa = Array::<Pair>::new(4usize);
            fa[0] = qf[4 * kk];
            fa[1] = qf[4 * kk + 1];
            fa[2] = qf[4 * kk + 2];
            fa[3] = qf[4 * kk + 3];
            #[unroll]
            for jt in 0..comptime!(MMA_KEYS / 8) {
                let mut fb = Array::<Pair>::new(2usize);
                fb[0] = ks[(jt * 8 + gq) * qw + kk * 8 + tq];
                fb[1] = ks[(jt * 8 + gq) * qw + kk * 8 + 4 + tq];
                mma_acc(&def, &fa, &fb, &mut sacc, jt);
            }
        }
        // Scale and mask; each row's maximum over its four lanes.
        let mut mx_a = scale * 0.0f32 + MASKED;
        let mut mx_b = scale * 0.0f32 + MASKED;
        #[unroll]
        for jt in 0..comptime!(MMA_KEYS / 8) {
            let mut sa = F2::empty();
            let mut sb = F2::empty();
            #[unroll]
            for i in 0..2usize {
                let key = k0 + jt * 8 + 2 * tq + i;
                let mut va = sacc[2 * jt].extract(i) * scale;
                let mut vb = sacc[2 * jt + 1].extract(i) * scale;
                if key > lim_a {
                    va = MASKED;
                }
                if key > lim_b {
                    vb = MASKED;
                }
                mx_a = mx_a.max(va);
                mx_b = mx_b.max(vb);
                sa.insert(i, va);
                sb.insert(i, vb);
            }
            sacc[2 * jt] = sa;
            sacc[2 * jt + 1] = sb;
        }
        mx_a = mx_a.max(plane_shuffle_xor(mx_a, 1u32));
        mx_a = mx_a.max(plane_shuffle_xor(mx_a, 2u32));
        mx_b = mx_b.max(plane_shuffle_xor(mx_b, 1u32));
        mx_b = mx_b.max(plane_shuffle_xor(mx_b, 2u32));
        let new_a = m_a.max(mx_a);
        let new_b = m_b.max(mx_b);
        let (al_a, al_b) = ((m_a - new_a).exp(), (m_b - new_b).exp());
        m_a = new_a;
        m_b = new_b;
        let mut sum_a = 0.0f32;
        let mut sum_b = 0.0f32;
        #[unroll]
        for jt in 0..comptime!(MMA_KEYS / 8) {
            let mut pa = F2::empty();
            let mut pb = F2::empty();
            #[unroll]
            for i in 0..2usize {
                let (va, vb) = (sacc[2 * jt].extract(i), sacc[2 * jt + 1].extract(i));
                let mut ea = 0.0f32;
                let mut eb = 0.0f32;
                if va > MASKED {
                    ea = (va - new_a).exp();
                }
                if vb > MASKED {
                    eb = (vb - new_b).exp();
                }
                sum_a += ea;
                sum_b += eb;
                pa.insert(i, ea);
                pb.insert(i, eb);
            }
            sacc[2 * jt] = pa;
            sacc[2 * jt + 1] = pb;
        }
        l_a = l_a * al_a + sum_a;
        l_b = l_b * al_b + sum_b;
        #[unroll]
        for jp in 0..comptime!(d / 8) {
            oacc[2 * jp] = scaled(oacc[2 * jp], al_a);
            oacc[2 * jp + 1] = scaled(oacc[2 * jp + 1], al_b);
        }
        // O += P·V by k-tiles of 16 keys, P from the S accumulator in bf16.
        #[unroll]
        for k2 in 0..comptime!(MMA_KEYS / 16) {
            let mut fa = Array::<Pair>::new(4usize);
            #[unroll]
            for w in 0..4usize {
                fa[w] = Pair::cast_from(sacc[4 * k2 + w]);
            }
            #[unroll]
            for jp in 0..comptime!(d / 8) {
                let mut fb = Array::<Pair>::new(2usize);
                fb[0] = vt[(jp * 8 + gq) * vw + k2 * 8 + tq];
                fb[1] = vt[(jp * 8 + gq) * vw + k2 * 8 + 4 + tq];
                mma_acc(&def, &fa, &fb, &mut oacc, jp);
            }
        }
        sync_cube();
    }
    l_a += plane_shuffle_xor(l_a, 1u32);
    l_a += plane_shuffle_xor(l_a, 2u32);
    l_b += plane_shuffle_xor(l_b, 1u32);
    l_b += plane_shuffle_xor(l_b, 2u32);
    // Rows past the chunk: zeros; rows past `T`: not written.
    let mut inv_a = 0.0f32;
    let mut inv_b = 0.0f32;
    if ia < len {
        inv_a = 1.0f32 / l_a;
    }
    if ib < len {
        inv_b = 1.0f32 / l_b;
    }
    let ha = g * rep + (row0 + ra) % rep;
    let hb = g * rep + (row0 + rb) % rep;
    #[unroll]
    for jp in 0..comptime!(d / 8) {
        #[unroll]
        for i in 0..2usize {
            let col = jp * 8 + 2 * tq + i;
            if ia < t {
                o[((b * t + ia) * nh + ha) * d + col] =
                    bf16::cast_from(oacc[2 * jp].extract(i) * inv_a);
            }
            if ib < t {
                o[((b * t + ib) * nh + hb) * d + col] =
                    bf16::cast_from(oacc[2 * jp + 1].extract(i) * inv_b);
            }
        }
    }
}

/// Launches [`flash_mma_kernel()`] over bf16 `q` `[B, T, W]` (`W` a multiple of 8), pools
/// `[S, KVH, cap, D]` and `seqs` `[B, 3]` (as [`super::flash::launch`]); the caller checked
/// bf16 `mma` ([`crate::cube::bf16_mma::available`]) and [`fits`]. Returns `[B, T, heads·D]` in bf16.
pub fn launch<R: CubeRuntime>(
    q: CubeTensor<R>,
    kpool: CubeTensor<R>,
    vpool: CubeTensor<R>,
    seqs: CubeTensor<R>,
    heads: usize,
    scale: f32,
) -> CubeTensor<R> {
    let q = contiguous_as(q, DType::BF16);
    let kpool = contiguous_as(kpool, DType::BF16);
    let vpool = contiguous_as(vpool, DType::BF16);
    let seqs = i32_buf(seqs);
    let [b, t, w] = [q.meta.shape()[0], q.meta.shape()[1], q.meta.shape()[2]];
    let ps = kpool.meta.shape().clone();
    let (kvh, cap, d) = (ps[1], ps[2], ps[3]);
    assert!(
        fits(d) && w % 8 == 0 && kvh > 0 && heads % kvh == 0 && w >= heads * d,
        "flash mma prefill: q [{b}, {t}, {w}] for {heads} heads of {d}, pool {ps:?}"
    );
    let o = empty(&q, [b, t, heads * d], DType::BF16);
    let tiles = (t * (heads / kvh)).div_ceil(MMA_ROWS);
    let cubes = b * kvh * tiles;
    if cubes == 0 {
        return o;
    }
    flash_mma_kernel::launch::<R>(
        &q.client,
        fold(cubes),
        CubeDim::new_2d(32, (MMA_ROWS / 16) as u32),
        8,
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
    );
    o
}
