//! Tensor-core NVFP4 linears over many rows (prefill): a cube of `tw` warps (4 or 8,
//! [`MmaTuning::tile_warps`]) takes `16 · tw` weight rows × `8 · nt` tokens (`nt` up
//! to 8 or 16, [`MmaTuning::tile_tiles`]), the warps side by side over the rows instead
//! of splitting K ([`super::mma`]'s kernel), and the tokens' activations staged in shared memory
//! one 128-input step at a time.
//!
//! **Why.** In [`super::mma::nvfp4_mma_kernel()`] every lane loads its `B` fragments from global
//! memory for each `mma`, and the 4 warps of a cube read different K ranges, so an activation
//! vector fed 16 weight rows and was read again by every other row tile (L1/L2): at 1,024 tokens
//! the routed experts ran at 66 TFLOP/s (PERF §15). Here a step's activations are read from
//! global memory once per cube (coalesced, 256 bytes per token), feed `16 · tw` weight rows, and the
//! next step's loads (activations and weights) are in flight while the current step's `mma`s
//! run. No cross-warp sum: each warp owns its rows' whole K (with `rf = 2`,
//! [`MmaTuning::tile_frags`], two fragments of 16 rows, each staged word feeding two
//! `mma`s).
//!
//! **Math.** Exactly [`super::mma`]'s (module docs there): lane `(g, t)` decodes the E2M1 pairs
//! of its own 16-byte weight chunk (chunk `4s + t` of step `s`) and feeds `B` with the
//! activations at the same physical inputs, so every output's products and their per-chunk
//! order match that kernel; f32 accumulation, the global scale and epilogue at the end.
//!
//! **Shared layout.** A step holds 16 vectors of 8 bf16 per token, each staged as the four
//! `B` words its `mma`s take (`pair_words`: the pairing done once per staged vector, not per
//! `mma`); vector `v` (chunk `v / 4`, word `v % 4`) sits at `tok · RS + (v % 4) · 4 + v / 4`
//! with `RS` = [`ROW_STRIDE`] = 20: the 8 lanes of a quarter-warp (`g ∈ {0, 1}`, `t ∈ 0..4`)
//! then read 8 distinct 16-byte bank groups (4 consecutive vectors of one token, and the next
//! token's 320 bytes on: 64 modulo the banks' 128) — no bank conflicts. With two buffers
//! ([`TileShape::buffers`]) steps alternate between them and a step needs one barrier (after
//! its stores) instead of two (the second kept the next step's stores from overwriting what a
//! slower warp still reads).
//!
//! **FP8** ([`fp8_tile_kernel()`], plain W8A8 linears over rows quantized to E4M3 apart): the
//! same structure with [`crate::cube::linear::mma::fp8_mma_kernel()`]'s math; a step is 256
//! inputs (16 vectors of 16 codes per token, vector `v` at `tok · RS + v`: a quarter-warp reads
//! vectors `4q + t` of two tokens, again 8 distinct bank groups), each lane's two rows × 4
//! chunks of weights loaded for the next step while this one's `mma`s run.
//!
//! Grid: x = tiles of `16 · tw` rows; y = experts (grouped routing: expert `e`'s slots
//! from `members[counts[E + e]]`) or blocks of `8 · nt` rows (plain, [`super::super::tensor_core::blocks`],
//! folded onto z past 65,535).

use super::super::buffers::{arg, empty, yz, MAX_CUBES};
use super::super::tensor_core::{
    block_end, blocks, chunk_load, tile_warps, tiles_up_to, MmaTuning,
};
use super::frag::{e2m1_pair, e2m1_pair_bf16, fp8_a, Fp8E4m3, TWO_POW_112_BITS};
use super::{e4m3, epilogue, store3, Call};
use crate::Nvfp4Weights;
use burn::tensor::{bf16, DType};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

/// A tiled launch's cube shape, from [`MmaTuning`] (the caller passes it, so this
/// module reads no setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileShape {
    /// Warps per cube (4 or 8).
    pub warps: usize,
    /// The most token tiles of 8 per pass (8 or 16).
    pub tiles: usize,
    /// 16-row fragments per warp of the NVFP4 kernel (1 or 2).
    pub frags: usize,
    /// Shared staging buffers (1 or 2).
    pub buffers: usize,
    /// Cube rows per expert of a routed launch (1–4), each taking every `parts`-th pass of the
    /// expert's slots: more, shorter cubes for the same work.
    pub parts: usize,
    /// The NVFP4 kernel decodes E2M1 pairs in bf16 alone
    /// ([`super::frag::e2m1_pair_bf16()`]: 3 integer operations and a bf16 multiply per pair)
    /// instead of through f16 and f32 ([`super::frag::e2m1_pair()`]); the same products.
    pub bf16_decode: bool,
    /// The FP8 kernel accumulates in the `mma` itself instead of per `k32` step into a zeroed
    /// accumulator added in f32 ([`MmaTuning::fp8_direct`]).
    pub fp8_direct: bool,
}

impl TileShape {
    /// The tiled kernels' cube shape under tuning `t`.
    pub fn of(t: &MmaTuning) -> Self {
        TileShape {
            warps: t.tile_warps,
            tiles: t.tile_tiles,
            frags: t.tile_frags,
            buffers: t.tile_buffers,
            parts: t.tile_parts,
            bf16_decode: t.bf16_decode,
            fp8_direct: t.fp8_direct,
        }
    }
}

/// Shared-memory vectors per staged token (16 used, 4 of padding; module docs).
pub const ROW_STRIDE: usize = 20;

/// `y[s, n] = epi(gs[e] · Σ_j W_e[n, j] · x[s / div, j])` on the tensor cores, NVFP4 weights,
/// bf16 activations staged in shared memory (module docs): for every slot of expert `e`
/// (`routed`, grouped) or every row of `x` (plain). Each warp takes `rf` fragments of 16 rows
/// (1 or 2): with 2, each staged `B` word read from shared memory feeds two `mma`s.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn nvfp4_tile_kernel<NX: Size, NW: Size>(
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
    div: u32,
    block: u32,
    parts: u32,
    #[comptime] nt: usize,
    #[comptime] tw: usize,
    #[comptime] rf: usize,
    #[comptime] bufs: usize,
    #[comptime] routed: bool,
    #[comptime] relu2: bool,
    #[comptime] split: bool,
    #[comptime] bdec: bool,
) {
    let by = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    // Routed: `parts` cube rows per expert, part `p` taking the expert's passes `p`, `p + parts`,
    // … (plain calls: 1).
    let parts = parts as usize;
    let mut e = by / parts;
    let mut count = tokens as usize;
    let mut base = 0usize;
    if !routed {
        e = 0u32 as usize;
    }
    if routed {
        count = counts[e] as usize;
        base = counts[CUBE_COUNT_Y as usize / parts + e] as usize;
    }
    // Plain: this cube row's block of rows; routed: the part's first pass (`block = 0`).
    let mut first = by * block as usize;
    if routed {
        first = (by % parts) * comptime!(nt * 8);
    }
    let end = if routed {
        count
    } else {
        block_end(first, block, count)
    };
    let (n_out, k) = (n_out as usize, k as usize);
    let tile0 = CUBE_POS_X as usize * 16 * tw * rf;
    // Uniform over the cube (the syncs need every unit).
    if count == 0 || tile0 >= n_out || first >= end {
        terminate!();
    }
    let (lane, warp) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let (g, t) = (lane / 4, lane % 4);
    let tile = tile0 + warp * 16 * rf;
    // A warp whose rows are past the end computes on the last row and writes nothing.
    let mut rows0 = Array::<usize>::new(rf);
    let mut rows1 = Array::<usize>::new(rf);
    #[unroll]
    for f in 0..rf {
        rows0[f] = e * n_out + (tile + 16 * f + g).min(n_out - 1);
        rows1[f] = e * n_out + (tile + 16 * f + g + 8).min(n_out - 1);
    }
    let (chunks, nb, vecs) = (k / 32, k / 16, k / 8);
    let iters = chunks.div_ceil(4);
    // `bdec`: the weights enter the `mma`s as `W · 2^-14` (exactly), the sums leave times 2^14.
    let gs = if bdec {
        globals[e] * 16384.0f32
    } else {
        globals[e]
    };
    let def = MmaDefinition::<bf16, bf16, f32>::new(16usize, 8usize, 16usize);
    // Staging: thread `tid` loads vector `tid % 16` of tokens `r · (threads / 16) + tid / 16`.
    let tid = warp * 32 + lane;
    let per = comptime!(nt * 8 * 16 / (tw * 32));
    let tstep = comptime!(tw * 32 / 16);
    let vt = tid % 16;
    let sp = (vt % 4) * 4 + vt / 4;
    // `bufs` buffers of one step each; `off` is the one this step uses (uniform over the cube).
    let stage = comptime!(nt * 8 * ROW_STRIDE);
    let mut sx = Shared::<[Vector<u32, NW>]>::new_slice(comptime!(bufs * nt * 8 * ROW_STRIDE));
    let mut off = 0usize;
    let mut pass = first;
    while pass < end {
        let mut xr = Array::<usize>::new(per);
        #[unroll]
        for r in 0..per {
            // Tokens past the end read the last one and are never written.
            let tok = (pass + r * tstep + tid / 16).min(count - 1);
            let s = if routed {
                members[base + tok] as usize
            } else {
                tok
            };
            xr[r] = (s / div as usize) * vecs;
        }
        let mut acc = Array::<Vector<f32, Const<2>>>::new(nt * 2 * rf);
        #[unroll]
        for j in 0..nt * 2 * rf {
            acc[j] = Vector::new(0.0f32);
        }
        // Step 0's loads; each step then issues the next step's before its `mma`s.
        let mut xv = Array::<Vector<bf16, NX>>::new(per);
        #[unroll]
        for r in 0..per {
            xv[r] = x[xr[r] + vt.min(vecs - 1)];
        }
        let mut wa = Array::<Vector<u32, NW>>::new(rf);
        let mut wb = Array::<Vector<u32, NW>>::new(rf);
        let mut sa = Array::<u32>::new(rf);
        let mut sb = Array::<u32>::new(rf);
        nvfp4_load_rows(
            packed, scales, &rows0, &rows1, chunks, nb, 0usize, t, &mut wa, &mut wb, &mut sa,
            &mut sb, rf,
        );
        let mut s = 0usize;
        while s < iters {
            #[unroll]
            for r in 0..per {
                sx[off + (r * tstep + tid / 16) * ROW_STRIDE + sp] = pair_words::<NX, NW>(xv[r]);
            }
            sync_cube();
            let c = s * 4 + t;
            // The f16 codes read E2M1 · 2^-14 (bf16 codes E2M1 · 2^-126, `bdec`); chunks past
            // the row's end weigh nothing.
            let unit = comptime!(if bdec {
                f32::from_bits(TWO_POW_112_BITS)
            } else {
                16384.0f32
            });
            let mult = if c < chunks { unit } else { 0.0f32 };
            // This step's weights and scales (fragment `f`: words `va[f]`, `vb[f]`; scales
            // `sc[4f..4f + 4]` = rows `g`, `g + 8` × the chunk's two blocks).
            let mut va = Array::<Vector<u32, NW>>::new(rf);
            let mut vb = Array::<Vector<u32, NW>>::new(rf);
            let mut sc = Array::<f32>::new(4 * rf);
            #[unroll]
            for f in 0..rf {
                va[f] = wa[f];
                vb[f] = wb[f];
                sc[4 * f] = e4m3(sa[f] & 255u32) * mult;
                sc[4 * f + 1] = e4m3((sa[f] >> 8u32) & 255u32) * mult;
                sc[4 * f + 2] = e4m3(sb[f] & 255u32) * mult;
                sc[4 * f + 3] = e4m3((sb[f] >> 8u32) & 255u32) * mult;
            }
            let mut sh = Array::<bf16>::new(comptime!(if bdec { 4 * rf } else { 1 }));
            if bdec {
                #[unroll]
                for i in 0..4 * rf {
                    sh[i] = bf16::cast_from(sc[i]);
                }
            }
            // The next step's loads (clamped past the last step: read, never used).
            let v_next = ((s + 1) * 16 + vt).min(vecs - 1);
            #[unroll]
            for r in 0..per {
                xv[r] = x[xr[r] + v_next];
            }
            nvfp4_load_rows(
                packed,
                scales,
                &rows0,
                &rows1,
                chunks,
                nb,
                s + 1,
                t,
                &mut wa,
                &mut wb,
                &mut sa,
                &mut sb,
                rf,
            );
            #[unroll]
            for w in 0..4usize {
                // Steps `2w` and `2w + 1` (h = 0, 1): pairs (0, 1) and (2, 3) of the word.
                // Fragment 0 (rows `tile`…) and, when `rf == 2`, fragment 1 (rows `tile + 16`…).
                let mut r0 = Array::<Vector<bf16, Const<2>>>::new(4usize);
                let mut r1 = Array::<Vector<bf16, Const<2>>>::new(4usize);
                decode_frag(
                    va[0].extract(w),
                    vb[0].extract(w),
                    &sc,
                    &sh,
                    w,
                    0usize,
                    &mut r0,
                    &mut r1,
                    bdec,
                );
                let mut q0 = Array::<Vector<bf16, Const<2>>>::new(4usize);
                let mut q1 = Array::<Vector<bf16, Const<2>>>::new(4usize);
                if comptime!(rf > 1) {
                    decode_frag(
                        va[rf - 1].extract(w),
                        vb[rf - 1].extract(w),
                        &sc,
                        &sh,
                        w,
                        rf - 1,
                        &mut q0,
                        &mut q1,
                        bdec,
                    );
                }
                #[unroll]
                for j in 0..nt {
                    // Token tiles wholly past the pass's end are skipped (uniform over the
                    // cube); their sums are never stored.
                    if pass + j * 8 < end {
                        let v = sx[off + (j * 8 + g) * ROW_STRIDE + w * 4 + t];
                        mma_w(&def, &r0, v.extract(0), v.extract(1), &mut acc, j);
                        mma_w(&def, &r1, v.extract(2), v.extract(3), &mut acc, j);
                        if comptime!(rf > 1) {
                            mma_w(&def, &q0, v.extract(0), v.extract(1), &mut acc, nt + j);
                            mma_w(&def, &q1, v.extract(2), v.extract(3), &mut acc, nt + j);
                        }
                    }
                }
            }
            // One buffer: the next step's stores wait for every warp's reads. Two: they go to
            // the other buffer, whose reads (two steps back) ended before this step's barrier.
            if comptime!(bufs == 1) {
                sync_cube();
            } else {
                off = stage - off;
            }
            s += 1;
        }
        #[unroll]
        for f in 0..rf {
            #[unroll]
            for j in 0..nt {
                #[unroll]
                for h in 0..2usize {
                    let n = tile + 16 * f + g + 8 * h;
                    #[unroll]
                    for i in 0..2usize {
                        let tok = pass + j * 8 + 2 * t + i;
                        if n < n_out && tok < end {
                            let slot = if routed {
                                members[base + tok] as usize
                            } else {
                                tok
                            };
                            let val = epilogue(acc[2 * (f * nt + j) + h].extract(i) * gs, relu2);
                            store3(
                                y,
                                y1,
                                y2,
                                slot,
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
        pass += parts * comptime!(nt * 8);
    }
}

/// Fragment `f`'s `A` registers for steps `2w` (`r0`) and `2w + 1` (`r1`) from its rows' words
/// `ua` (row `g`) and `ub` (row `g + 8`): pairs (0, 1) and (2, 3) of the words, with the
/// chunk's first block scale for words 0–1 and its second for 2–3 (`sc[4f..4f + 4]` = rows
/// `g`, `g + 8` × the two blocks; `sh` the same as bf16 where `bdec`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn decode_frag(
    ua: u32,
    ub: u32,
    sc: &Array<f32>,
    sh: &Array<bf16>,
    w: usize,
    #[comptime] f: usize,
    r0: &mut Array<Vector<bf16, Const<2>>>,
    r1: &mut Array<Vector<bf16, Const<2>>>,
    #[comptime] bdec: bool,
) {
    let (ia, ib) = if w < 2 {
        (4 * f, 4 * f + 2)
    } else {
        (4 * f + 1, 4 * f + 3)
    };
    if bdec {
        let (ta, tb) = (sh[ia], sh[ib]);
        r0[0] = e2m1_pair_bf16(ua, ta, 0u32);
        r0[1] = e2m1_pair_bf16(ub, tb, 0u32);
        r0[2] = e2m1_pair_bf16(ua, ta, 1u32);
        r0[3] = e2m1_pair_bf16(ub, tb, 1u32);
        r1[0] = e2m1_pair_bf16(ua, ta, 2u32);
        r1[1] = e2m1_pair_bf16(ub, tb, 2u32);
        r1[2] = e2m1_pair_bf16(ua, ta, 3u32);
        r1[3] = e2m1_pair_bf16(ub, tb, 3u32);
    } else {
        let (ta, tb) = (sc[ia], sc[ib]);
        r0[0] = e2m1_pair(ua, ta, 0u32);
        r0[1] = e2m1_pair(ub, tb, 0u32);
        r0[2] = e2m1_pair(ua, ta, 1u32);
        r0[3] = e2m1_pair(ub, tb, 1u32);
        r1[0] = e2m1_pair(ua, ta, 2u32);
        r1[1] = e2m1_pair(ub, tb, 2u32);
        r1[2] = e2m1_pair(ua, ta, 3u32);
        r1[3] = e2m1_pair(ub, tb, 3u32);
    }
}

/// Loads step `it` of the weight rows `rows0[f]` / `rows1[f]` (16-byte chunk `4 · it + t`,
/// clamped to the last) and their block-scale words, for each of `rf` row fragments.
#[cube]
#[allow(clippy::too_many_arguments)]
fn nvfp4_load_rows<NW: Size>(
    packed: &[Vector<u32, NW>],
    scales: &[u32],
    rows0: &Array<usize>,
    rows1: &Array<usize>,
    chunks: usize,
    nb: usize,
    it: usize,
    t: usize,
    wa: &mut Array<Vector<u32, NW>>,
    wb: &mut Array<Vector<u32, NW>>,
    sa: &mut Array<u32>,
    sb: &mut Array<u32>,
    #[comptime] rf: usize,
) {
    let cc = (it * 4 + t).min(chunks - 1);
    #[unroll]
    for f in 0..rf {
        wa[f] = packed[rows0[f] * chunks + cc];
        wb[f] = packed[rows1[f] * chunks + cc];
        let si0 = rows0[f] * nb + cc * 2;
        let si1 = rows1[f] * nb + cc * 2;
        sa[f] = scales[si0 / 4] >> (((si0 % 4) * 8) as u32);
        sb[f] = scales[si1 / 4] >> (((si1 % 4) * 8) as u32);
    }
}

/// `y[m, n] = epi(is · ws · Σ_j W[n, j] · xq[m, j])` on the tensor cores, FP8 weights and E4M3
/// activation codes staged in shared memory 256 inputs at a time (module docs), over blocks of
/// `block` rows. Each `k32` `mma` goes into a zeroed accumulator added to the running f32 sum,
/// or with `direct` into the running sum itself, as in
/// [`crate::cube::linear::mma::fp8_mma_kernel()`].
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fp8_tile_kernel<NW: Size>(
    xq: &[Vector<u32, NW>],
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
    block: u32,
    #[comptime] nt: usize,
    #[comptime] tw: usize,
    #[comptime] bufs: usize,
    #[comptime] relu2: bool,
    #[comptime] split: bool,
    #[comptime] direct: bool,
) {
    let count = tokens as usize;
    let first = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize * block as usize;
    let end = block_end(first, block, count);
    let (n_out, k) = (n_out as usize, k as usize);
    let tile0 = CUBE_POS_X as usize * 16 * tw;
    // Uniform over the cube (the syncs need every unit).
    if tile0 >= n_out || first >= end {
        terminate!();
    }
    let (lane, warp) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let (g, t) = (lane / 4, lane % 4);
    let tile = tile0 + warp * 16;
    // A warp whose rows are past the end computes on the last row and writes nothing.
    let row0 = (tile + g).min(n_out - 1);
    let row1 = (tile + g + 8).min(n_out - 1);
    let chunks = k / 16;
    let steps = chunks.div_ceil(16);
    let def = MmaDefinition::<Fp8E4m3, Fp8E4m3, f32>::new(16usize, 8usize, 32usize);
    let gs = input_scales[0] * weight_scales[0];
    // Staging: thread `tid` loads vector `tid % 16` of tokens `r · (threads / 16) + tid / 16`.
    let tid = warp * 32 + lane;
    let per = comptime!(nt * 8 * 16 / (tw * 32));
    let tstep = comptime!(tw * 32 / 16);
    let vt = tid % 16;
    // `bufs` buffers of one step each; `off` is the one this step uses (uniform over the cube).
    let stage = comptime!(nt * 8 * ROW_STRIDE);
    let mut sx = Shared::<[Vector<u32, NW>]>::new_slice(comptime!(bufs * nt * 8 * ROW_STRIDE));
    let mut off = 0usize;
    let mut pass = first;
    while pass < end {
        let mut xr = Array::<usize>::new(per);
        #[unroll]
        for r in 0..per {
            // Tokens past the end read the last one and are never written.
            xr[r] = (pass + r * tstep + tid / 16).min(count - 1) * chunks;
        }
        let mut acc = Array::<Vector<f32, Const<2>>>::new(nt * 2);
        #[unroll]
        for j in 0..nt * 2 {
            acc[j] = Vector::new(0.0f32);
        }
        // Step 0's loads; each step then issues the next step's before its `mma`s.
        let mut xv = Array::<Vector<u32, NW>>::new(per);
        #[unroll]
        for r in 0..per {
            xv[r] = xq[xr[r] + vt.min(chunks - 1)];
        }
        let mut wa = Array::<Vector<u32, NW>>::new(4usize);
        let mut wb = Array::<Vector<u32, NW>>::new(4usize);
        chunk_load(
            weight, row0, row1, chunks, 0usize, t, &mut wa, &mut wb, 4usize,
        );
        let mut s = 0usize;
        while s < steps {
            #[unroll]
            for r in 0..per {
                sx[off + (r * tstep + tid / 16) * ROW_STRIDE + vt] = xv[r];
            }
            sync_cube();
            let mut ca = Array::<Vector<u32, NW>>::new(4usize);
            let mut cb = Array::<Vector<u32, NW>>::new(4usize);
            #[unroll]
            for q in 0..4usize {
                ca[q] = wa[q];
                cb[q] = wb[q];
            }
            // The next step's loads (clamped past the last step: read, never used).
            let v_next = ((s + 1) * 16 + vt).min(chunks - 1);
            #[unroll]
            for r in 0..per {
                xv[r] = xq[xr[r] + v_next];
            }
            chunk_load(
                weight,
                row0,
                row1,
                chunks,
                (s + 1) * 4,
                t,
                &mut wa,
                &mut wb,
                4usize,
            );
            #[unroll]
            for q in 0..4usize {
                let c = (s * 4 + q) * 4 + t;
                // Chunks past the row's end weigh nothing (code 0 is +0).
                let z = if c < chunks { 0xFFFF_FFFFu32 } else { 0u32 };
                let (va, vb) = (ca[q], cb[q]);
                let r0 = fp8_a(va, vb, z, 0usize);
                let r1 = fp8_a(va, vb, z, 1usize);
                #[unroll]
                for j in 0..nt {
                    let v = sx[off + (j * 8 + g) * ROW_STRIDE + q * 4 + t];
                    mma_e4m3(&def, &r0, v.extract(0), v.extract(1), &mut acc, j, direct);
                    mma_e4m3(&def, &r1, v.extract(2), v.extract(3), &mut acc, j, direct);
                }
            }
            // One buffer: the next step's stores wait for every warp's reads. Two: they go to
            // the other buffer, whose reads (two steps back) ended before this step's barrier.
            if comptime!(bufs == 1) {
                sync_cube();
            } else {
                off = stage - off;
            }
            s += 1;
        }
        if tile < n_out {
            #[unroll]
            for j in 0..nt {
                #[unroll]
                for h in 0..2usize {
                    let n = tile + g + 8 * h;
                    #[unroll]
                    for i in 0..2usize {
                        let tok = pass + j * 8 + 2 * t + i;
                        if n < n_out && tok < end {
                            let val = epilogue(acc[2 * j + h].extract(i) * gs, relu2);
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

/// One E4M3 `k32` `mma` of token tile `j` into a zeroed accumulator, added to `acc` in f32:
/// `A` = `ra`, `B` = the activation words `x0`, `x1`.
#[cube]
pub(super) fn mma_e4m3(
    def: &MmaDefinition<Fp8E4m3, Fp8E4m3, f32>,
    ra: &Array<Vector<Fp8E4m3, Const<4>>>,
    x0: u32,
    x1: u32,
    acc: &mut Array<Vector<f32, Const<2>>>,
    #[comptime] j: usize,
    #[comptime] direct: bool,
) {
    let mut rb = Array::<Vector<Fp8E4m3, Const<4>>>::new(2usize);
    rb[0] = Vector::<Fp8E4m3, Const<4>>::reinterpret(x0);
    rb[1] = Vector::<Fp8E4m3, Const<4>>::reinterpret(x1);
    let mut cr = Array::<Vector<f32, Const<2>>>::new(2usize);
    if direct {
        cr[0] = acc[2 * j];
        cr[1] = acc[2 * j + 1];
    } else {
        cr[0] = Vector::new(0.0f32);
        cr[1] = Vector::new(0.0f32);
    }
    def.execute_inplace(ra, &rb, &mut cr);
    if direct {
        acc[2 * j] = cr[0];
        acc[2 * j + 1] = cr[1];
    } else {
        acc[2 * j] += cr[0];
        acc[2 * j + 1] += cr[1];
    }
}

/// An activation vector of 8 bf16 `[v0 … v7]` as the `B` words its `mma`s take: `(v0, v4)`,
/// `(v1, v5)`, `(v2, v6)`, `(v3, v7)` — the physical inputs of pairs `p` and `p + 1` of a lane's
/// weight word (pairs `(p, p + 4)`, [`super::frag::e2m1_pair()`]) for `p = 0` (words 0, 1) and
/// `p = 2` (words 2, 3). Done once when a vector is staged instead of per `mma` that reads it.
#[cube]
fn pair_words<NX: Size, NW: Size>(v: Vector<bf16, NX>) -> Vector<u32, NW> {
    let w = Vector::<u32, NW>::reinterpret(v);
    let (w0, w1, w2, w3) = (w.extract(0), w.extract(1), w.extract(2), w.extract(3));
    let mut out = Vector::<u32, NW>::empty();
    out.insert(0usize, (w0 & 0xFFFFu32) | (w2 << 16u32));
    out.insert(1usize, (w0 >> 16u32) | (w2 & 0xFFFF_0000u32));
    out.insert(2usize, (w1 & 0xFFFFu32) | (w3 << 16u32));
    out.insert(3usize, (w1 >> 16u32) | (w3 & 0xFFFF_0000u32));
    out
}

/// One `mma` of token tile `j`: `A` = `ra`, `B` = the staged words `b0`, `b1` ([`pair_words`]).
#[cube]
fn mma_w(
    def: &MmaDefinition<bf16, bf16, f32>,
    ra: &Array<Vector<bf16, Const<2>>>,
    b0: u32,
    b1: u32,
    acc: &mut Array<Vector<f32, Const<2>>>,
    #[comptime] j: usize,
) {
    let mut rb = Array::<Vector<bf16, Const<2>>>::new(2usize);
    rb[0] = Vector::<bf16, Const<2>>::reinterpret(b0);
    rb[1] = Vector::<bf16, Const<2>>::reinterpret(b1);
    let mut cr = Array::<Vector<f32, Const<2>>>::new(2usize);
    cr[0] = acc[2 * j];
    cr[1] = acc[2 * j + 1];
    def.execute_inplace(ra, &rb, &mut cr);
    acc[2 * j] = cr[0];
    acc[2 * j + 1] = cr[1];
}

/// The tiled launch of an NVFP4 call (the caller, [`super::mma`], has checked bf16, `k % 32 == 0`,
/// CUDA `mma` and `MmaMin::tile`): routed calls grouped by expert (sorted on the device from
/// `sort_min` slots), plain calls over blocks of rows.
pub(crate) fn nvfp4<R: CubeRuntime>(
    c: &Call<R>,
    w: &Nvfp4Weights<CubeBackend<R>>,
    sort_min: usize,
    shape: TileShape,
) -> Option<CubeTensor<R>> {
    let client = &c.x.client;
    let (sa, sb) = c.split_args();
    let (counts, members, nt, gy, gz, block, parts) = if c.routed {
        let n_experts = w.shape.experts;
        if n_experts > MAX_CUBES {
            return None;
        }
        let ids = c.experts.as_ref()?;
        let (counts, members) = if c.slots < sort_min {
            super::grouped::group_in_one_cube(c, ids, n_experts)
        } else {
            crate::cube::moe::group(ids, n_experts)
        };
        let nt = tiles_up_to(c.slots.div_ceil(n_experts), shape.tiles);
        // Within the grid's y (the check above at one part).
        let parts = shape.parts.clamp(1, (MAX_CUBES / n_experts).max(1));
        (counts, members, nt, (n_experts * parts) as u32, 1, 0, parts)
    } else {
        let nt = tiles_up_to(c.slots, shape.tiles);
        let (block, nblocks) = blocks(c.slots, nt);
        let (gy, gz) = yz(nblocks);
        // Unread stand-ins.
        let stand = empty(&c.x, [1], DType::U32);
        (stand.clone(), stand, nt, gy, gz, block, 1)
    };
    let tw = tile_warps(shape.warps, nt);
    let rf = shape.frags;
    let gx = c.n.div_ceil(16 * tw * rf) as u32;
    // Safety: `k % 32 == 0` makes activation rows and weight chunks whole 16-byte vectors (the
    // vector indices are clamped to the row); tokens and rows past the ends are clamped and never
    // written; members are slots `< slots` written by the grouping (so `s / div` is a row of `x`).
    unsafe {
        nvfp4_tile_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(gx, gy, gz),
            CubeDim::new_2d(32, tw as u32),
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
            c.div as u32,
            block as u32,
            parts as u32,
            nt,
            tw,
            rf,
            shape.buffers,
            c.routed,
            c.relu2,
            c.split.is_some(),
            shape.bf16_decode,
        )
    };
    Some(c.y.clone())
}

/// The tiled launch of a plain FP8 call over rows already quantized to E4M3 words `xq` (the
/// caller, [`super::mma::fp8`], has checked bf16, `k % 16 == 0`, CUDA E4M3 `mma` and
/// [`super::mma::MmaMin::tile`]).
pub(crate) fn fp8<R: CubeRuntime>(
    c: &Call<R>,
    xq: &CubeTensor<R>,
    weight: &CubeTensor<R>,
    is: &CubeTensor<R>,
    ws: &CubeTensor<R>,
    shape: TileShape,
) {
    let (sa, sb) = c.split_args();
    let nt = tiles_up_to(c.slots, shape.tiles);
    let (block, nblocks) = blocks(c.slots, nt);
    let (gy, gz) = yz(nblocks);
    let tw = tile_warps(shape.warps, nt);
    let gx = c.n.div_ceil(16 * tw) as u32;
    // Safety: `k % 16 == 0` makes rows of codes and weights whole 16-byte vectors (vector
    // indices clamped to the row); tokens and rows past the ends are clamped and never written.
    unsafe {
        fp8_tile_kernel::launch_unchecked::<R>(
            &c.x.client,
            CubeCount::Static(gx, gy, gz),
            CubeDim::new_2d(32, tw as u32),
            4,
            arg(xq),
            arg(weight),
            arg(is),
            arg(ws),
            arg(&c.y),
            arg(&c.y1),
            arg(&c.y2),
            sa,
            sb,
            c.k as u32,
            c.n as u32,
            c.slots as u32,
            block as u32,
            nt,
            tw,
            shape.buffers,
            c.relu2,
            c.split.is_some(),
            shape.fp8_direct,
        )
    };
}
