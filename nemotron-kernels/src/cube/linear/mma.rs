//! Tensor-core linears (CUDA `mma.sync`, bf16 activations): NVFP4 W4A16 (plain, or routed
//! experts grouped by expert or slot-major) and FP8 W8A8 (plain, from one row; see [`super::plan::MmaMin`]). A warp computes a 16-output-row tile
//! for 8 tokens per `mma` — the weights are the `A` operand (16 × K), the activations `B` (K × 8)
//! — so a weight is decoded once per 8 tokens instead of once per token, and the products run on
//! the tensor cores instead of the FMA pipes. The weights stay packed in device memory and are
//! decoded in registers right before the `mma`.
//!
//! **K order.** A dot product does not care in which order its terms are summed, so each lane
//! feeds the `mma` with the elements it loaded itself: lane `(g, t)` (`g = lane / 4`,
//! `t = lane % 4`) of a step holds, by the `mma` fragment layout, the `A` elements of rows `g`
//! and `g + 8` at logical `k ∈ {2t, 2t+1, 2t+8, 2t+9}` (bf16; `{4t..4t+3, 4t+16..4t+19}` for
//! E4M3), and the `B` elements of token `g` at the same logical `k`. Those logical positions are
//! mapped to physical inputs inside the lane's own 16-byte weight chunk, identically for `A` and
//! `B`, so no data moves between lanes:
//! - NVFP4 (chunk = 32 inputs, two 16-input scale blocks): word `w` of the chunk (8 nibbles)
//!   feeds two steps; the f16 trick of `word_dot_f16` places nibbles `(p, p + 4)` as an
//!   f16 pair `E2M1 · 2^-14`, exact; times `block scale · 2^14` in f32 it is `E2M1 · scale`
//!   exactly (at most 6 significant bits), converted to bf16 exactly. With
//!   [`MmaTuning::bf16_decode`] (the default) the pair is built as bf16 `E2M1 · 2^-126` and
//!   multiplied in bf16 by `scale · 2^112`, which is `E2M1 · scale · 2^-14`, also exact. The sums
//!   then take the `2^14` back with the global scale. Step `2w + h` takes pairs
//!   `2h` (logical `2t, 2t+1`) and `2h + 1` (logical `2t+8, 2t+9`); `B` takes the activations at
//!   the same physical inputs `(8w + p, 8w + p + 4)`.
//! - FP8 (chunk = 16 inputs): step `h` takes words `2h, 2h + 1` of the chunk as they are, for
//!   the weights and for the activations quantized to E4M3 with the static input scale (the
//!   checkpoint's own W8A8 math; no decode at all). Each `k32` step goes into a zeroed
//!   accumulator added to the running sum in f32, so a tensor core's internal FP8 accumulation
//!   spans 32 products only; or, with [`MmaTuning::fp8_direct`], into the running sum itself
//!   (on sm_90 the FP8 `mma` runs as f16 `HMMA`s accumulating in f32: [`FP8_DIRECT`]).
//!
//! The global / tensor scales multiply the f32 sums at the end, as the GEMVs do. Products are
//! exact in both cases (bf16 · bf16 and E4M3 · E4M3 fit f32), so results differ from the GEMVs
//! by summation order only: the bf16 band of the ops tests.
//!
//! Grid: x = 16-row tiles, y = experts (grouped), slots (slot-major) or blocks of rows (plain,
//! [`blocks`]), the last two folded onto z past 65,535; the [`WARPS`] warps of a cube split K
//! and sum through shared memory. Tokens are taken `8 · nt` per pass; a routed cube whose
//! expert has no slot leaves at once.

use super::super::buffers::{arg, contiguous_as, elemwise, empty, f32_buf, yz};
use super::super::reduce::block_sum;
use super::super::tensor_core::{
    block_end, blocks, chunk_load, fp8_pipe, m_split, sms, tiles, tuning, warp_sum, warp_sum_m,
    warps,
};
use super::frag::{e2m1_pair, e2m1_pair_bf16, fp8_a, nvfp4_load, Fp8E4m3, TWO_POW_112_BITS};
use super::grouped::group_in_one_cube;
use super::plan::{Format, LinearPath, MmaForm};
use super::{e4m3, e4m3_byte, e4m3_round, epilogue, store3, Call};
use crate::{Fp8Weights, Nvfp4Weights};
use burn::tensor::{bf16, DType};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Routing slots up to which one cube groups the slots by expert (`group_in_one_cube`, the ids
/// staged in shared memory, compiled per slot count: decode batches, a few padded sizes).
/// Larger routed calls (prefill) sort on the device ([`crate::cube::moe::group`]).
pub const MMA_MAX_SLOTS: usize = 1024;

static SORT_MIN_SLOTS: AtomicUsize = AtomicUsize::new(MMA_MAX_SLOTS + 1);

/// Sets the routed-slot count from which grouped calls sort on the device instead of one cube
/// grouping them (default `MMA_MAX_SLOTS + 1`; never above that: the one-cube grouping stages
/// at most [`MMA_MAX_SLOTS`] ids). Process-wide; for `parity --prefill-kernels tiled` and tests.
pub fn set_sort_min_slots(slots: usize) {
    SORT_MIN_SLOTS.store(slots.min(MMA_MAX_SLOTS + 1), Ordering::Relaxed);
}

/// The current value of [`set_sort_min_slots`].
pub fn sort_min_slots() -> usize {
    SORT_MIN_SLOTS.load(Ordering::Relaxed)
}

/// Rows of `x` up to which the FP8 tensor-core kernel quantizes them itself, in every cube
/// ([`set_fp8_inq_max`]); more rows are quantized by one launch before it. One: at batch 1 the
/// whole Lightning step measured the same either way on the H200 (2.73 against 2.72 ms after a
/// 1K prompt, 2.76 against 2.78 after 8K; `docs/PERF.md` §12), and in-kernel quantizing takes
/// 46 launches fewer per token.
pub const FP8_INQ_MAX_ROWS: usize = 1;

static INQ_MAX_ROWS: AtomicUsize = AtomicUsize::new(FP8_INQ_MAX_ROWS);

/// Sets the rows up to which the FP8 tensor-core kernel quantizes its rows itself (0: never;
/// for tests and benchmarks).
pub fn set_fp8_inq_max(rows: usize) {
    INQ_MAX_ROWS.store(rows, Ordering::Relaxed);
}

/// The current value of [`set_fp8_inq_max`].
pub fn fp8_inq_max() -> usize {
    INQ_MAX_ROWS.load(Ordering::Relaxed)
}

/// One `mma` step `2w + h` of [`nvfp4_mma_kernel()`] for every token tile: the `A` fragment from
/// the words `wa` (row `g`) and `wb` (row `g + 8`), the `B` fragments from each tile's activations
/// at vector `base` of its row.
#[cube]
#[allow(clippy::too_many_arguments)]
fn nvfp4_step<NX: Size>(
    wa: u32,
    wb: u32,
    sa: f32,
    sb: f32,
    ha: bf16,
    hb: bf16,
    x: &[Vector<bf16, NX>],
    xrow: &Array<usize>,
    base: usize,
    acc: &mut Array<Vector<f32, Const<2>>>,
    #[comptime] nt: usize,
    #[comptime] h: u32,
    #[comptime] bdec: bool,
) {
    let def = MmaDefinition::<bf16, bf16, f32>::new(16usize, 8usize, 16usize);
    let mut ra = Array::<Vector<bf16, Const<2>>>::new(4usize);
    // `bdec`: the bf16 scales `ha`, `hb` ([`e2m1_pair_bf16`]); otherwise the f32 ones.
    if bdec {
        ra[0] = e2m1_pair_bf16(wa, ha, 2 * h);
        ra[1] = e2m1_pair_bf16(wb, hb, 2 * h);
        ra[2] = e2m1_pair_bf16(wa, ha, 2 * h + 1);
        ra[3] = e2m1_pair_bf16(wb, hb, 2 * h + 1);
    } else {
        ra[0] = e2m1_pair(wa, sa, 2 * h);
        ra[1] = e2m1_pair(wb, sb, 2 * h);
        ra[2] = e2m1_pair(wa, sa, 2 * h + 1);
        ra[3] = e2m1_pair(wb, sb, 2 * h + 1);
    }
    let (p0, p1) = ((2 * h) as usize, (2 * h + 1) as usize);
    #[unroll]
    for j in 0..nt {
        let xv = x[xrow[j] + base];
        let mut rb = Array::<Vector<bf16, Const<2>>>::new(2usize);
        let mut v0 = Vector::<bf16, Const<2>>::empty();
        v0.insert(0usize, xv.extract(p0));
        v0.insert(1usize, xv.extract(p0 + 4));
        let mut v1 = Vector::<bf16, Const<2>>::empty();
        v1.insert(0usize, xv.extract(p1));
        v1.insert(1usize, xv.extract(p1 + 4));
        rb[0] = v0;
        rb[1] = v1;
        let mut cr = Array::<Vector<f32, Const<2>>>::new(2usize);
        cr[0] = acc[2 * j];
        cr[1] = acc[2 * j + 1];
        def.execute_inplace(&ra, &rb, &mut cr);
        acc[2 * j] = cr[0];
        acc[2 * j + 1] = cr[1];
    }
}

/// `y[s, n] = epi(gs[e] · Σ_j W_e[n, j] · x[s / div, j])` on the tensor cores, NVFP4 weights, bf16
/// activations: for every token of expert `e` (`members`, routed) or every row of `x` (plain).
/// A cube takes one 16-row tile; its `kw` warps split K, each loading `grp` 128-input steps
/// before it decodes any (several 16-byte loads in flight per lane).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn nvfp4_mma_kernel<NX: Size, NW: Size>(
    x: &[Vector<bf16, NX>],
    counts: &[u32],
    members: &[u32],
    packed: &[Vector<u32, NW>],
    scales: &[u32],
    globals: &[f32],
    y: &mut [bf16],
    y1: &mut [bf16],
    y2: &mut [bf16],
    a: u32,
    b: u32,
    k: u32,
    n_out: u32,
    tokens: u32,
    pairs: u32,
    div: u32,
    block: u32,
    #[comptime] nt: usize,
    #[comptime] kw: usize,
    #[comptime] grp: usize,
    #[comptime] routed: bool,
    #[comptime] grouped: bool,
    #[comptime] relu2: bool,
    #[comptime] split: bool,
    #[comptime] pipe: bool,
    #[comptime] bdec: bool,
) {
    // Plain calls run one row of cubes (`CUBE_POS_Y` is 0); grouped routed calls one row per
    // expert; slot-major routed calls one row per slot, whose expert id `members` holds, the
    // rows folded over y and z ([`crate::cube::buffers::yz`]) so any slot count launches.
    let by = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    let slot_major = routed && !grouped;
    // Uniform over the cube: a folded grid's last cubes past the slots leave.
    if slot_major && by >= pairs as usize {
        terminate!();
    }
    // Grouped: the grid row is the expert; slot-major: the slot's expert; plain: one weight
    // (the grid row is a block of rows).
    let mut e = by;
    if slot_major {
        e = members[by] as usize;
    }
    if !routed {
        e = 0u32 as usize;
    }
    let mut count = tokens as usize;
    // Grouped: `counts[e]` slots of expert `e` from `members[counts[E + e]]` (E = the grid's
    // rows, one per expert).
    let mut base = 0usize;
    if routed && grouped {
        count = counts[e] as usize;
        base = counts[CUBE_COUNT_Y as usize + e] as usize;
    }
    if slot_major {
        count = 1u32 as usize;
    }
    // Plain calls: this cube row's block of `block` rows ([`blocks`]).
    // Routed calls pass `block = 0`: every cube starts at its first row.
    let first = by * block as usize;
    let end = if routed {
        count
    } else {
        block_end(first, block, count)
    };
    let (n_out, k) = (n_out as usize, k as usize);
    let tile = CUBE_POS_X as usize * 16;
    // Uniform over the cube (the `mma` and the cube syncs need every unit).
    if count == 0 || tile >= n_out || first >= end {
        terminate!();
    }
    let (lane, warp) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let (g, t) = (lane / 4, lane % 4);
    // Rows past the end compute on the last row and are never written.
    let row0 = e * n_out + (tile + g).min(n_out - 1);
    let row1 = e * n_out + (tile + g + 8).min(n_out - 1);
    let (chunks, nb) = (k / 32, k / 16);
    let iters = chunks.div_ceil(4);
    // `bdec`: the weights enter the `mma`s as `W · 2^-14` (exactly), the sums leave times 2^14.
    let gs = if bdec {
        globals[e] * 16384.0f32
    } else {
        globals[e]
    };
    let mut pass = first;
    while pass < end {
        let mut xrow = Array::<usize>::new(nt);
        let mut acc = Array::<Vector<f32, Const<2>>>::new(nt * 2);
        #[unroll]
        for j in 0..nt {
            // Tokens past the end read the last one and are never written.
            let tok = (pass + j * 8 + g).min(count - 1);
            let s = if slot_major {
                by
            } else if routed {
                members[base + tok] as usize
            } else {
                tok
            };
            xrow[j] = (s / div as usize) * (k / 8);
            acc[2 * j] = Vector::new(0.0f32);
            acc[2 * j + 1] = Vector::new(0.0f32);
        }
        let step = kw * grp;
        let mut it0 = warp * grp;
        // `pipe`: the next step's loads are issued before this step's decode and `mma`, so the
        // memory latency overlaps the work instead of following it.
        let mut na = Array::<Vector<u32, NW>>::new(grp);
        let mut nb_ = Array::<Vector<u32, NW>>::new(grp);
        let mut nsa = Array::<u32>::new(grp);
        let mut nsb = Array::<u32>::new(grp);
        if pipe {
            nvfp4_load(
                packed, scales, row0, row1, chunks, nb, it0, t, &mut na, &mut nb_, &mut nsa,
                &mut nsb, grp,
            );
        }
        while it0 < iters {
            let mut wa = Array::<Vector<u32, NW>>::new(grp);
            let mut wb = Array::<Vector<u32, NW>>::new(grp);
            let mut sa = Array::<u32>::new(grp);
            let mut sb = Array::<u32>::new(grp);
            if pipe {
                #[unroll]
                for q in 0..grp {
                    wa[q] = na[q];
                    wb[q] = nb_[q];
                    sa[q] = nsa[q];
                    sb[q] = nsb[q];
                }
                nvfp4_load(
                    packed,
                    scales,
                    row0,
                    row1,
                    chunks,
                    nb,
                    it0 + step,
                    t,
                    &mut na,
                    &mut nb_,
                    &mut nsa,
                    &mut nsb,
                    grp,
                );
            } else {
                nvfp4_load(
                    packed, scales, row0, row1, chunks, nb, it0, t, &mut wa, &mut wb, &mut sa,
                    &mut sb, grp,
                );
            }
            #[unroll]
            for q in 0..grp {
                let c = (it0 + q) * 4 + t;
                let cc = c.min(chunks - 1);
                // The f16 codes read E2M1 · 2^-14 (bf16 codes E2M1 · 2^-126, `bdec`); chunks
                // past the row's end weigh nothing.
                let unit = comptime!(if bdec {
                    f32::from_bits(TWO_POW_112_BITS)
                } else {
                    16384.0f32
                });
                let mult = if c < chunks { unit } else { 0.0f32 };
                let s00 = e4m3(sa[q] & 255u32) * mult;
                let s01 = e4m3((sa[q] >> 8u32) & 255u32) * mult;
                let s10 = e4m3(sb[q] & 255u32) * mult;
                let s11 = e4m3((sb[q] >> 8u32) & 255u32) * mult;
                let (h00, h01, h10, h11) = (
                    bf16::cast_from(s00),
                    bf16::cast_from(s01),
                    bf16::cast_from(s10),
                    bf16::cast_from(s11),
                );
                let (va, vb) = (wa[q], wb[q]);
                #[unroll]
                for w in 0..4usize {
                    let (ua, ub) = (va.extract(w), vb.extract(w));
                    let (ta, tb) = if w < 2 { (s00, s10) } else { (s01, s11) };
                    let (ha, hb) = if w < 2 { (h00, h10) } else { (h01, h11) };
                    let base = cc * 4 + w;
                    nvfp4_step(
                        ua, ub, ta, tb, ha, hb, x, &xrow, base, &mut acc, nt, 0u32, bdec,
                    );
                    nvfp4_step(
                        ua, ub, ta, tb, ha, hb, x, &xrow, base, &mut acc, nt, 1u32, bdec,
                    );
                }
            }
            it0 += step;
        }
        warp_sum(&mut acc, nt, kw);
        if warp == 0 {
            #[unroll]
            for j in 0..nt {
                #[unroll]
                for v in 0..2usize {
                    let n = tile + g + 8 * v;
                    #[unroll]
                    for i in 0..2usize {
                        let tok = pass + j * 8 + 2 * t + i;
                        if n < n_out && tok < count {
                            let s = if slot_major {
                                by
                            } else if routed {
                                members[base + tok] as usize
                            } else {
                                tok
                            };
                            let val = epilogue(acc[2 * j + v].extract(i) * gs, relu2);
                            store3(
                                y,
                                y1,
                                y2,
                                s,
                                n,
                                n_out,
                                a as usize,
                                b as usize,
                                bf16::cast_from(val),
                                split,
                            );
                        }
                    }
                }
            }
        }
        pass += nt * 8;
    }
}

/// `xq = e4m3(clamp(x / is, ±448))`, four codes per u32 word (little-endian), for
/// [`fp8_mma_kernel()`]; the rounding is `e4m3_round`'s, as the other FP8 paths.
#[cube(launch)]
pub fn fp8_quantize_bytes_kernel<F: Float>(
    x: &[F],
    input_scales: &[f32],
    xq: &mut [u32],
    words: u32,
) {
    let i = ABSOLUTE_POS as usize;
    if i < words as usize {
        let mut word = 0u32;
        #[unroll]
        for j in 0..4usize {
            let v = (f32::cast_from(x[i * 4 + j]) / input_scales[0]).clamp(-448.0f32, 448.0f32);
            word |= e4m3_byte(e4m3_round(v)) << ((8 * j) as u32);
        }
        xq[i] = word;
    }
}

/// Mamba2's gated group norm straight into E4M3 codes for the FP8 `out_proj` (many rows):
/// `xq = e4m3(clamp(bf16(w · u · rsqrt(mean_group(u²) + eps)) / is, ±448))` with
/// `u = x · silu(gate)` — the norm's bf16 output quantized as [`fp8_quantize_bytes_kernel()`]
/// does, without writing it and reading it back. One cube of `units` per `(row, group)`; unit
/// `u` owns the group's 4-channel words `u + i · units` (`i < per`), its values held in
/// registers between the sum and the stores.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn fp8_norm_bytes_kernel(
    x: &[bf16],
    gate: &[bf16],
    norm_w: &[bf16],
    input_scales: &[f32],
    xq: &mut [u32],
    rows: u32,
    h: u32,
    group: u32,
    eps: f32,
    #[comptime] per: usize,
    #[comptime] units: usize,
    #[comptime] plane: bool,
) {
    let (h, group) = (h as usize, group as usize);
    let row = (CUBE_POS_X + CUBE_POS_Z * CUBE_COUNT_X) as usize;
    // Uniform over the cube: the folded grid's last cubes past the rows leave.
    if row >= rows as usize {
        terminate!();
    }
    let g0 = CUBE_POS_Y as usize * group;
    let base = row * h + g0;
    let words = group / 4;
    let u = UNIT_POS_X as usize;
    let mut v = Array::<f32>::new(comptime!(per * 4));
    let mut ss = 0.0f32;
    #[unroll]
    for i in 0..per {
        // Words past the group re-read its last one and add nothing.
        let wi = (u + i * units).min(words - 1);
        let live = u + i * units < words;
        #[unroll]
        for j in 0..4usize {
            let z = f32::cast_from(gate[base + 4 * wi + j]);
            let t = f32::cast_from(x[base + 4 * wi + j]) * (z / (1.0f32 + (-z).exp()));
            v[i * 4 + j] = t;
            ss += if live { t * t } else { 0.0f32 };
        }
    }
    let total = block_sum(ss, units, plane);
    let inv = 1.0f32 / (total / group as f32 + eps).sqrt();
    let is = input_scales[0];
    #[unroll]
    for i in 0..per {
        let wi = u + i * units;
        if wi < words {
            let mut word = 0u32;
            #[unroll]
            for j in 0..4usize {
                let y = v[i * 4 + j] * inv * f32::cast_from(norm_w[g0 + 4 * wi + j]);
                let q = (f32::cast_from(bf16::cast_from(y)) / is).clamp(-448.0f32, 448.0f32);
                word |= e4m3_byte(e4m3_round(q)) << ((8 * j) as u32);
            }
            xq[base / 4 + wi] = word;
        }
    }
}

/// `y[m, n] = epi(is · ws · Σ_j W[n, j] · xq[m, j])` on the tensor cores, FP8 weights and E4M3
/// activation codes (plain linears). One 16-row tile per cube, `kw` warps splitting K, `grp`
/// 64-input steps loaded at once.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fp8_mma_kernel<NW: Size>(
    xq: &[Vector<u32, NW>],
    xb: &[bf16],
    gate: &[bf16],
    norm_w: &[bf16],
    weight: &[Vector<u32, NW>],
    input_scales: &[f32],
    weight_scales: &[f32],
    y: &mut [bf16],
    y1: &mut [bf16],
    y2: &mut [bf16],
    a: u32,
    b: u32,
    k: u32,
    n_out: u32,
    tokens: u32,
    gsize: u32,
    eps: f32,
    block: u32,
    #[comptime] nt: usize,
    #[comptime] kw: usize,
    #[comptime] grp: usize,
    #[comptime] relu2: bool,
    #[comptime] split: bool,
    #[comptime] inq: usize,
    #[comptime] pipe: bool,
    #[comptime] gnorm: bool,
    #[comptime] direct: bool,
    #[comptime] mw: usize,
) {
    let count = tokens as usize;
    let first = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize * block as usize;
    let end = block_end(first, block, count);
    let (n_out, k) = (n_out as usize, k as usize);
    // `mw` warps take `mw` row tiles side by side (each walking all of K when `kw == 1`): they
    // read the same activations at about the same time, so `mw - 1` of every `mw` reads hit L1.
    if CUBE_POS_X as usize * mw * 16 >= n_out || first >= end {
        terminate!();
    }
    let (lane, warp_) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    // A tile past `n_out` computes clamped rows and writes nothing (every warp stays for the
    // cube's barriers).
    let (warp, tile) = (warp_ / mw, (CUBE_POS_X as usize * mw + warp_ % mw) * 16);
    let (g, t) = (lane / 4, lane % 4);
    let row0 = (tile + g).min(n_out - 1);
    let row1 = (tile + g + 8).min(n_out - 1);
    let chunks = k / 16;
    let iters = chunks.div_ceil(4);
    let def = MmaDefinition::<Fp8E4m3, Fp8E4m3, f32>::new(16usize, 8usize, 32usize);
    let gs = input_scales[0] * weight_scales[0];
    let step = kw * grp;
    // `pipe`: the next step's loads are issued before this step's `mma`s; the first step's
    // before the in-kernel quantizing below, so that prologue runs while they are in flight.
    let mut na = Array::<Vector<u32, NW>>::new(grp);
    let mut nb_ = Array::<Vector<u32, NW>>::new(grp);
    if pipe {
        chunk_load(
            weight,
            row0,
            row1,
            chunks,
            warp * grp,
            t,
            &mut na,
            &mut nb_,
            grp,
        );
    }
    // `inq > 0`: the `inq` words of E4M3 codes of the (few) rows are quantized by the cube itself
    // into shared memory (no quantizing launch before this one), as `fp8_quantize_bytes_kernel`;
    // every load of the prologue is issued before any is used.
    let mut sq = Shared::<[u32]>::new_slice(comptime!(inq.max(1)));
    if inq > 0 {
        let per = comptime!(inq.div_ceil(32 * kw));
        let mut xs = Array::<f32>::new(comptime!(per * 4));
        let mut zs = Array::<f32>::new(comptime!(if gnorm { per * 4 } else { 1 }));
        let mut ns = Array::<f32>::new(comptime!(if gnorm { per * 4 } else { 1 }));
        #[unroll]
        for r in 0..per {
            let i = (warp * 32 + lane + r * 32 * kw).min(inq - 1);
            #[unroll]
            for j in 0..4usize {
                xs[r * 4 + j] = f32::cast_from(xb[i * 4 + j]);
                if gnorm {
                    zs[r * 4 + j] = f32::cast_from(gate[i * 4 + j]);
                    ns[r * 4 + j] = f32::cast_from(norm_w[i * 4 + j]);
                }
            }
        }
        if gnorm {
            // Mamba2's gated group norm of the one row first, as `rms_norm_kernel` computes it
            // (`u = x · silu(z)`, `w · u · rsqrt(mean_group(u²) + eps)` rounded to bf16): `Σ u²`
            // per 128 inputs (one warp's words of a round) by warp shuffles into shared memory,
            // then each group's blocks summed in order — deterministic, no atomics.
            let mut part = Shared::<[f32]>::new_slice(comptime!(inq.div_ceil(32)));
            #[unroll]
            for r in 0..per {
                let i = warp * 32 + lane + r * 32 * kw;
                let mut ss = 0.0f32;
                #[unroll]
                for j in 0..4usize {
                    let z = zs[r * 4 + j];
                    let u = xs[r * 4 + j] * (z / (1.0f32 + (-z).exp()));
                    xs[r * 4 + j] = u;
                    ss += u * u;
                }
                let tot = plane_sum(ss);
                if lane == 0 && i < inq {
                    part[i / 32] = tot;
                }
            }
            sync_cube();
            let gs_ = gsize as usize;
            let bpg = gs_ / 128;
            #[unroll]
            for r in 0..per {
                let i = (warp * 32 + lane + r * 32 * kw).min(inq - 1);
                let first = (i * 4 / gs_) * bpg;
                let mut total = 0.0f32;
                for q in 0..bpg {
                    total += part[first + q];
                }
                let inv = 1.0f32 / (total / gsize as f32 + eps).sqrt();
                #[unroll]
                for j in 0..4usize {
                    xs[r * 4 + j] =
                        f32::cast_from(bf16::cast_from(xs[r * 4 + j] * inv * ns[r * 4 + j]));
                }
            }
        }
        #[unroll]
        for r in 0..per {
            let i = warp * 32 + lane + r * 32 * kw;
            let mut word = 0u32;
            #[unroll]
            for j in 0..4usize {
                let v = (xs[r * 4 + j] / input_scales[0]).clamp(-448.0f32, 448.0f32);
                word |= e4m3_byte(e4m3_round(v)) << ((8 * j) as u32);
            }
            if i < inq {
                sq[i] = word;
            }
        }
        sync_cube();
    }
    let mut pass = first;
    while pass < end {
        let mut xrow = Array::<usize>::new(nt);
        let mut acc = Array::<Vector<f32, Const<2>>>::new(nt * 2);
        #[unroll]
        for j in 0..nt {
            xrow[j] = (pass + j * 8 + g).min(count - 1) * chunks;
            acc[2 * j] = Vector::new(0.0f32);
            acc[2 * j + 1] = Vector::new(0.0f32);
        }
        let mut it0 = warp * grp;
        if pipe && pass > first {
            chunk_load(weight, row0, row1, chunks, it0, t, &mut na, &mut nb_, grp);
        }
        while it0 < iters {
            let mut wa = Array::<Vector<u32, NW>>::new(grp);
            let mut wb = Array::<Vector<u32, NW>>::new(grp);
            if pipe {
                #[unroll]
                for q in 0..grp {
                    wa[q] = na[q];
                    wb[q] = nb_[q];
                }
                chunk_load(
                    weight,
                    row0,
                    row1,
                    chunks,
                    it0 + step,
                    t,
                    &mut na,
                    &mut nb_,
                    grp,
                );
            } else {
                chunk_load(weight, row0, row1, chunks, it0, t, &mut wa, &mut wb, grp);
            }
            #[unroll]
            for q in 0..grp {
                let c = (it0 + q) * 4 + t;
                let cc = c.min(chunks - 1);
                // Chunks past the row's end weigh nothing (code 0 is +0).
                let z = if c < chunks { 0xFFFF_FFFFu32 } else { 0u32 };
                let (va, vb) = (wa[q], wb[q]);
                #[unroll]
                for h in 0..2usize {
                    let ra = fp8_a(va, vb, z, h);
                    #[unroll]
                    for j in 0..nt {
                        let (x0, x1) = if inq > 0 {
                            let base = (xrow[j] + cc) * 4 + 2 * h;
                            (sq[base], sq[base + 1])
                        } else {
                            let xv = xq[xrow[j] + cc];
                            (xv.extract(2 * h), xv.extract(2 * h + 1))
                        };
                        let mut rb = Array::<Vector<Fp8E4m3, Const<4>>>::new(2usize);
                        rb[0] = Vector::<Fp8E4m3, Const<4>>::reinterpret(x0);
                        rb[1] = Vector::<Fp8E4m3, Const<4>>::reinterpret(x1);
                        // `direct`: the running sum is the `mma`'s accumulator (register
                        // copies only); otherwise a zeroed one added to it.
                        let mut cr = Array::<Vector<f32, Const<2>>>::new(2usize);
                        if direct {
                            cr[0] = acc[2 * j];
                            cr[1] = acc[2 * j + 1];
                        } else {
                            cr[0] = Vector::new(0.0f32);
                            cr[1] = Vector::new(0.0f32);
                        }
                        def.execute_inplace(&ra, &rb, &mut cr);
                        if direct {
                            acc[2 * j] = cr[0];
                            acc[2 * j + 1] = cr[1];
                        } else {
                            acc[2 * j] += cr[0];
                            acc[2 * j + 1] += cr[1];
                        }
                    }
                }
            }
            it0 += step;
        }
        warp_sum_m(&mut acc, nt, kw, mw);
        if warp == 0 {
            #[unroll]
            for j in 0..nt {
                #[unroll]
                for v in 0..2usize {
                    let n = tile + g + 8 * v;
                    #[unroll]
                    for i in 0..2usize {
                        let tok = pass + j * 8 + 2 * t + i;
                        if n < n_out && tok < count {
                            let val = epilogue(acc[2 * j + v].extract(i) * gs, relu2);
                            store3(
                                y,
                                y1,
                                y2,
                                tok,
                                n,
                                n_out,
                                a as usize,
                                b as usize,
                                bf16::cast_from(val),
                                split,
                            );
                        }
                    }
                }
            }
        }
        pass += nt * 8;
    }
}

/// One cube per 16 output rows (x) and per expert (y) of a grouped launch.
fn grid(n: usize, experts: usize) -> CubeCount {
    CubeCount::Static(n.div_ceil(16) as u32, experts as u32, 1)
}

/// The tensor-core launch of an NVFP4 call in `form`, as [`super::plan`] chose it (bf16,
/// `k % 32 == 0`, CUDA `mma`, enough rows or slots; grouped: `E` within the grid's y limit):
/// `None` for a routed call without expert ids.
pub(crate) fn nvfp4<R: CubeRuntime>(
    c: &Call<R>,
    w: &Nvfp4Weights<CubeBackend<R>>,
    form: MmaForm,
) -> Option<CubeTensor<R>> {
    let grouped = form == MmaForm::Grouped;
    let client = &c.x.client;
    let (sa, sb) = c.split_args();
    let (counts, members, experts, nt) = if c.routed && !grouped {
        // The slots' expert ids stand in for `members` (i32 ids < E read as u32).
        let ids = c.experts.clone()?;
        (c.x.clone(), ids, c.slots, 1)
    } else if c.routed {
        let n_experts = w.shape.experts;
        let ids = c.experts.as_ref()?;
        // Up to MMA_MAX_SLOTS (decode batches) one cube groups them in shared memory; more
        // (prefill) sort on the device by counts, offsets and a scatter.
        let (counts, members) = if c.slots < sort_min_slots() {
            group_in_one_cube(c, ids, n_experts)
        } else {
            crate::cube::moe::group(ids, n_experts)
        };
        (
            counts,
            members,
            n_experts,
            tiles(c.slots.div_ceil(n_experts)),
        )
    } else {
        // Unread stand-ins.
        (c.x.clone(), c.x.clone(), 1, tiles(c.slots))
    };
    // Plain calls: rows in blocks over grid y (routed calls keep y for experts or slots).
    let (block, nblocks) = if c.routed {
        (0, 1)
    } else {
        blocks(c.slots, nt)
    };
    let kw = warps(
        c.n.div_ceil(16) * experts * nblocks,
        (c.k / 32).div_ceil(4),
        tuning().group,
        sms(client),
    );
    // Safety: `k % 32 == 0` makes activation rows and weight chunks whole 16-byte vectors; tokens
    // and rows past the ends are clamped and never written; members are slots `< pairs` written by
    // the grouping kernel (so `s / div` is a row of `x`), or (slot-major) the routing's expert ids
    // `< E`, one per cube row `< slots`.
    unsafe {
        nvfp4_mma_kernel::launch_unchecked::<R>(
            client,
            if grouped {
                grid(c.n, experts)
            } else {
                // Slot-major: one row per slot; plain: one row per block of rows.
                let (y, z) = yz(if c.routed { experts } else { nblocks });
                CubeCount::Static(c.n.div_ceil(16) as u32, y, z)
            },
            CubeDim::new_2d(32, kw as u32),
            8,
            4,
            arg(&c.x),
            arg(&counts),
            arg(&members),
            arg(&w.packed),
            arg(&w.scales),
            arg(&w.globals),
            arg(&c.y),
            arg(&c.y1),
            arg(&c.y2),
            sa,
            sb,
            c.k as u32,
            c.n as u32,
            c.slots as u32,
            c.slots as u32,
            c.div as u32,
            block as u32,
            nt,
            kw,
            tuning().group,
            c.routed,
            grouped,
            c.relu2,
            c.split.is_some(),
            tuning().pipe,
            tuning().bf16_decode,
        )
    };
    Some(c.y.clone())
}

/// Mamba2's gated group norm folded into an FP8 linear's in-kernel quantizing ([`fp8_gated`]):
/// `x` is the SSM output, `gate` the `z` part, `weight` the norm weight (bf16 each), `group`
/// channels per group.
pub(crate) struct GatedNorm<R: CubeRuntime> {
    pub gate: CubeTensor<R>,
    pub weight: CubeTensor<R>,
    pub group: usize,
    pub eps: f32,
}

/// The tensor-core launch of a plain FP8 call, as [`super::plan`] chose it (bf16,
/// `k % 16 == 0`, CUDA E4M3 `mma`, enough rows): a few rows quantized inside the kernel, more to
/// E4M3 bytes once first, then the `mma` kernel, or the tiled kernel or the GEMM where `path`
/// says so.
pub(crate) fn fp8<R: CubeRuntime>(c: &Call<R>, w: &Fp8Weights<CubeBackend<R>>, path: LinearPath) {
    fp8_with(c, w, None, path, None)
}

/// Units per cube of [`fp8_norm_bytes_kernel()`].
const NORM_BYTES_UNITS: usize = 128;

/// [`fp8`] of `rms_norm(x, gate)` for many rows (Mamba2's `out_proj` in a prefill): the norm
/// writes the E4M3 codes the tensor-core kernel reads ([`fp8_norm_bytes_kernel()`]), one
/// launch and one pass over the activations fewer than the norm, then the quantizing launch.
/// `false` where it does not apply: a path that is not a tensor-core one, rows few enough to
/// be quantized inside the `mma` kernel, groups not of whole 4-channel words, or not bf16.
pub(crate) fn fp8_gated_rows<R: CubeRuntime>(
    c: &Call<R>,
    w: &Fp8Weights<CubeBackend<R>>,
    norm: &GatedNorm<R>,
) -> bool {
    let path = c.plan(Format::Fp8, 1).path;
    let tensor_cores = matches!(
        path,
        LinearPath::Tiled { .. } | LinearPath::Mma(_) | LinearPath::Gemm
    );
    let words = c.slots * c.k / 4;
    let inq = c.slots <= INQ_MAX_ROWS.load(Ordering::Relaxed) && words <= 4096;
    if !tensor_cores
        || inq
        || c.split.is_some()
        || norm.group == 0
        || !norm.group.is_multiple_of(4)
        || !c.k.is_multiple_of(norm.group)
        || c.x.dtype != DType::BF16
        || norm.gate.dtype != DType::BF16
        || norm.weight.dtype != DType::BF16
    {
        return false;
    }
    let client = &c.x.client;
    let is = f32_buf(w.input_scales.clone());
    let (gate, nw) = (
        contiguous_as(norm.gate.clone(), DType::BF16),
        contiguous_as(norm.weight.clone(), DType::BF16),
    );
    let xq = empty(&c.x, [words], DType::U32);
    let (gx, gz) = super::super::buffers::fold_xy(c.slots);
    let per = (norm.group / 4).div_ceil(NORM_BYTES_UNITS);
    fp8_norm_bytes_kernel::launch::<R>(
        client,
        CubeCount::Static(gx, (c.k / norm.group) as u32, gz),
        CubeDim::new_1d(NORM_BYTES_UNITS as u32),
        arg(&c.x),
        arg(&gate),
        arg(&nw),
        arg(&is),
        arg(&xq),
        c.slots as u32,
        c.k as u32,
        norm.group as u32,
        norm.eps,
        per,
        NORM_BYTES_UNITS,
        super::super::reduce::plane_reduce(client, 32),
    );
    fp8_with(c, w, None, path, Some(xq));
    true
}

/// [`fp8`] of `rms_norm(x, gate)` with the norm computed by every cube in its prologue (one
/// launch instead of two), where that applies: one row quantized in-kernel
/// ([`set_fp8_inq_max`] ≥ 1), groups of a multiple of 128 channels, warp shuffles. `false`
/// where it does not (the caller runs the norm and the linear apart).
pub(crate) fn fp8_gated<R: CubeRuntime>(
    c: &Call<R>,
    w: &Fp8Weights<CubeBackend<R>>,
    norm: &GatedNorm<R>,
) -> bool {
    let inq_one = c.slots == 1 && INQ_MAX_ROWS.load(Ordering::Relaxed) >= 1 && c.k / 4 <= 4096;
    let planned = c.plan(Format::Fp8, 1).path == LinearPath::Mma(MmaForm::Rows);
    if !planned
        || !inq_one
        || norm.group == 0
        || norm.group % 128 != 0
        || c.k % norm.group != 0
        || norm.gate.dtype != DType::BF16
        || norm.weight.dtype != DType::BF16
        || !super::super::reduce::plane_reduce(&c.x.client, 32)
    {
        return false;
    }
    fp8_with(c, w, Some(norm), LinearPath::Mma(MmaForm::Rows), None);
    true
}

fn fp8_with<R: CubeRuntime>(
    c: &Call<R>,
    w: &Fp8Weights<CubeBackend<R>>,
    norm: Option<&GatedNorm<R>>,
    path: LinearPath,
    codes: Option<CubeTensor<R>>,
) {
    let client = &c.x.client;
    let (sa, sb) = c.split_args();
    let (is, ws) = (
        f32_buf(w.input_scales.clone()),
        f32_buf(w.weight_scales.clone()),
    );
    let words = c.slots * c.k / 4;
    // A few rows are quantized by every cube into shared memory (one launch instead of two).
    // `codes`: the rows' E4M3 codes, written by the caller.
    let inq = if codes.is_none()
        && (norm.is_some() || (c.slots <= INQ_MAX_ROWS.load(Ordering::Relaxed) && words <= 4096))
    {
        words
    } else {
        0
    };
    let (gate, nw) = match norm {
        Some(g) => (
            contiguous_as(g.gate.clone(), DType::BF16),
            contiguous_as(g.weight.clone(), DType::BF16),
        ),
        None => (c.x.clone(), c.x.clone()),
    };
    let (gsize, eps) = norm.map_or((128, 0.0), |g| (g.group, g.eps));
    let xq = if let Some(codes) = codes {
        codes
    } else if inq > 0 {
        // Unread stand-in (u32 words).
        w.weight.clone()
    } else {
        let xq = empty(&c.x, [words], DType::U32);
        let (count, dim) = elemwise(words);
        fp8_quantize_bytes_kernel::launch::<bf16, R>(
            client,
            count,
            dim,
            arg(&c.x),
            arg(&is),
            arg(&xq),
            words as u32,
        );
        xq
    };
    match path {
        LinearPath::Gemm if inq == 0 => {
            let t = tuning();
            let shape = super::gemm::GemmShape {
                warps_n: t.gemm_warps_n,
                steps: t.gemm_steps,
            };
            super::gemm::fp8(c, &xq, &w.weight, &is, &ws, shape);
            return;
        }
        LinearPath::Tiled { .. } if inq == 0 => {
            super::tile::fp8(
                c,
                &xq,
                &w.weight,
                &is,
                &ws,
                super::tile::TileShape::of(&tuning()),
            );
            return;
        }
        _ => {}
    }
    let nt = tiles(c.slots);
    let (block, nblocks) = blocks(c.slots, nt);
    let kw = warps(
        c.n.div_ceil(16) * nblocks,
        (c.k / 16).div_ceil(4),
        tuning().group,
        sms(client),
    );
    // Rows quantized in-kernel (a few rows, a small grid) keep one row tile per cube.
    let (kw, mw) = m_split(kw, if inq > 0 { 1 } else { tuning().m_warps });
    let (gy, gz) = yz(nblocks);
    // Safety: `k % 16 == 0` makes rows of codes and weights whole 16-byte vectors; tokens and rows
    // past the ends are clamped and never written.
    unsafe {
        fp8_mma_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(c.n.div_ceil(16 * mw) as u32, gy, gz),
            CubeDim::new_2d(32, (kw * mw) as u32),
            4,
            arg(&xq),
            arg(&c.x),
            arg(&gate),
            arg(&nw),
            arg(&w.weight),
            arg(&is),
            arg(&ws),
            arg(&c.y),
            arg(&c.y1),
            arg(&c.y2),
            sa,
            sb,
            c.k as u32,
            c.n as u32,
            c.slots as u32,
            gsize as u32,
            eps,
            block as u32,
            nt,
            kw,
            tuning().group,
            c.relu2,
            c.split.is_some(),
            inq,
            fp8_pipe(&tuning()),
            norm.is_some(),
            tuning().fp8_direct,
            mw,
        )
    };
}
