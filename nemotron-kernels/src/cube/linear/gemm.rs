//! Tensor-core FP8 W8A8 GEMM over many rows (prefill `in_proj` / `out_proj`): both operands
//! staged in shared memory, a cube tile of [`GEMM_ROWS`] weight rows × 64 or 128 tokens
//! ([`GemmShape::warps_n`]), each warp a 64-row × 32-token tile of the cube's.
//!
//! **Why.** [`super::mma::fp8_mma_kernel()`] gives a cube one 16-row tile and its warps split K:
//! every `mma` reads its weight fragment from global memory (L1) and each activation vector is
//! read again by every 16-row tile. At 64 × 128 tokens the Mamba `in_proj` ran at 180 TFLOP/s
//! on an H100 (PERF §24), a tenth of the FP8 `mma` rate. Here a cube reads each 64-input step
//! of its 128 weight rows and 128 tokens from global memory once (coalesced 16-byte vectors,
//! the next step's loads in flight while this step's `mma`s run), and a warp's 8 fragment reads
//! from shared memory (4 × 2 weight rows, 4 token tiles: 16-byte vectors) feed 32 `k32` `mma`s
//! — 43 FLOP per byte of shared memory read against [`super::tile::fp8_tile_kernel()`]'s 32 with its
//! weights from L1 besides.
//!
//! **Math.** Exactly [`super::mma`]'s FP8 math (module docs there): lane `(g, t)` takes 16-byte
//! chunk `4s + t` of step `s` for weight rows `g`, `g + 8` of a fragment and token `g` of a tile,
//! words `2h`, `2h + 1` feeding `k32` `mma` `h` of `A` and `B` alike; each `mma` goes into a
//! zeroed accumulator added to the running f32 sum; `is · ws` and the epilogue at the end.
//! Chunks past the row's end are staged as zeros.
//!
//! **Shared layout.** A step is 4 chunks per row: row `r`'s chunk `c` at `4r + c`, unpadded — a
//! quarter-warp (`g ∈ {0, 1}`, `t ∈ 0..4`) reads two consecutive rows' 64 bytes, 8 distinct
//! 16-byte bank groups. Two buffers: a step's stores go to the buffer the previous step did not
//! read, so one barrier per step.
//!
//! Grid: x = tiles of [`GEMM_ROWS`] weight rows, y = blocks of the cube's tokens (folded
//! onto z past 65,535). CUDA only (the E4M3 `mma`; [`super::plan`] checks).

use super::super::buffers::{arg, yz};
use super::frag::{fp8_a, Fp8E4m3};
use super::tile::mma_e4m3;
use super::{epilogue, store3, Call};
use burn::tensor::bf16;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

/// Warps of a cube along the weight rows.
const WARPS_M: usize = 2;
/// 16-row fragments per warp.
const FRAGS_M: usize = 4;
/// 8-token tiles per warp.
const TILES_N: usize = 4;
/// Weight rows per cube.
pub const GEMM_ROWS: usize = WARPS_M * FRAGS_M * 16;

/// A GEMM launch's cube shape, from [`super::super::tensor_core::MmaTuning`] (the caller passes it, so this
/// module reads no setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmShape {
    /// Warps along the tokens (2 or 4: 64 or 128 tokens per cube).
    pub warps_n: usize,
    /// Groups of 64 inputs per staged step (1 or 2: one barrier per 64 or 128 inputs).
    pub steps: usize,
}

/// `y[m, n] = epi(is · ws · Σ_j W[n, j] · xq[m, j])` on the tensor cores, FP8 weights and E4M3
/// activation codes (rows quantized apart), both staged in shared memory (module docs).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fp8_gemm_kernel<NW: Size>(
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
    #[comptime] wm: usize,
    #[comptime] wn: usize,
    #[comptime] fm: usize,
    #[comptime] tn: usize,
    #[comptime] gk: usize,
    #[comptime] relu2: bool,
    #[comptime] split: bool,
) {
    let bm = comptime!(wm * fm * 16);
    let bn = comptime!(wn * tn * 8);
    let threads = comptime!(wm * wn * 32);
    let count = tokens as usize;
    let first = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize * bn;
    let (n_out, k) = (n_out as usize, k as usize);
    let row0 = CUBE_POS_X as usize * bm;
    // Uniform over the cube (the syncs need every unit).
    if first >= count || row0 >= n_out {
        terminate!();
    }
    let (lane, warp) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let (g, t) = (lane / 4, lane % 4);
    // This warp's rows and tokens within the cube's tile.
    let wr = (warp % wm) * fm * 16;
    let wt = (warp / wm) * tn * 8;
    let chunks = k / 16;
    // A step is `gk` groups of 4 chunks (64 inputs each).
    let steps = chunks.div_ceil(comptime!(4 * gk));
    let def = MmaDefinition::<Fp8E4m3, Fp8E4m3, f32>::new(16usize, 8usize, 32usize);
    // Staging: thread `tid` loads chunk `tid % 4` of rows (tokens) `tid / 4 + r · threads / 4`;
    // rows and tokens past the ends read the last one and are never written.
    let tid = warp * 32 + lane;
    let pa = comptime!(bm * 4 / threads);
    let pb = comptime!(bn * 4 / threads);
    let ct = tid % 4;
    let mut ga = Array::<usize>::new(pa);
    #[unroll]
    for r in 0..pa {
        ga[r] = (row0 + tid / 4 + r * comptime!(threads / 4)).min(n_out - 1) * chunks;
    }
    let mut gb = Array::<usize>::new(pb);
    #[unroll]
    for r in 0..pb {
        gb[r] = (first + tid / 4 + r * comptime!(threads / 4)).min(count - 1) * chunks;
    }
    // A buffer holds a step: group `q`'s row `r`, chunk `c` at `q · rows · 4 + 4r + c`.
    let stage_a = comptime!(gk * bm * 4);
    let stage_b = comptime!(gk * bn * 4);
    let mut sa = Shared::<[Vector<u32, NW>]>::new_slice(comptime!(2 * gk * bm * 4));
    let mut sb = Shared::<[Vector<u32, NW>]>::new_slice(comptime!(2 * gk * bn * 4));
    let mut la = Array::<Vector<u32, NW>>::new(comptime!(gk * pa));
    let mut lb = Array::<Vector<u32, NW>>::new(comptime!(gk * pb));
    gemm_load(
        xq, weight, &ga, &gb, chunks, ct, 0usize, &mut la, &mut lb, pa, pb, gk,
    );
    gemm_store(
        &mut sa, &mut sb, &la, &lb, 0usize, 0usize, tid, pa, pb, gk, bm, bn, threads,
    );
    sync_cube();
    let mut acc = Array::<Vector<f32, Const<2>>>::new(comptime!(fm * tn * 2));
    #[unroll]
    for j in 0..fm * tn * 2 {
        acc[j] = Vector::new(0.0f32);
    }
    let mut off = 0usize;
    let mut s = 0usize;
    while s < steps {
        // The next step's loads (past the last step: clamped, staged, never read).
        gemm_load(
            xq,
            weight,
            &ga,
            &gb,
            chunks,
            ct,
            s + 1,
            &mut la,
            &mut lb,
            pa,
            pb,
            gk,
        );
        #[unroll]
        for q in 0..gk {
            let (oa, ob) = (
                off * stage_a + q * comptime!(bm * 4),
                off * stage_b + q * comptime!(bn * 4),
            );
            let mut vx = Array::<Vector<u32, NW>>::new(tn);
            #[unroll]
            for j in 0..tn {
                vx[j] = sb[ob + (wt + j * 8 + g) * 4 + t];
            }
            #[unroll]
            for i in 0..fm {
                let va = sa[oa + (wr + i * 16 + g) * 4 + t];
                let vb = sa[oa + (wr + i * 16 + g + 8) * 4 + t];
                let r0 = fp8_a(va, vb, 0xFFFF_FFFFu32, 0usize);
                let r1 = fp8_a(va, vb, 0xFFFF_FFFFu32, 1usize);
                #[unroll]
                for j in 0..tn {
                    // Token tiles wholly past the end are skipped (uniform over the warp); their
                    // sums are never stored.
                    if first + wt + j * 8 < count {
                        let v = vx[j];
                        mma_e4m3(
                            &def,
                            &r0,
                            v.extract(0),
                            v.extract(1),
                            &mut acc,
                            i * tn + j,
                            false,
                        );
                        mma_e4m3(
                            &def,
                            &r1,
                            v.extract(2),
                            v.extract(3),
                            &mut acc,
                            i * tn + j,
                            false,
                        );
                    }
                }
            }
        }
        // The other buffer was last read in the previous step, before its barrier.
        gemm_store(
            &mut sa,
            &mut sb,
            &la,
            &lb,
            (1 - off) * stage_a,
            (1 - off) * stage_b,
            tid,
            pa,
            pb,
            gk,
            bm,
            bn,
            threads,
        );
        sync_cube();
        off = 1 - off;
        s += 1;
    }
    let gs = input_scales[0] * weight_scales[0];
    #[unroll]
    for i in 0..fm {
        #[unroll]
        for j in 0..tn {
            #[unroll]
            for h in 0..2usize {
                let n = row0 + wr + i * 16 + g + 8 * h;
                #[unroll]
                for e in 0..2usize {
                    let tok = first + wt + j * 8 + 2 * t + e;
                    if n < n_out && tok < count {
                        let val = epilogue(acc[2 * (i * tn + j) + h].extract(e) * gs, relu2);
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
}

/// Loads step `s`'s chunks of this thread's weight rows (`ga`) and tokens (`gb`): chunk
/// `4 · (gk · s + q) + ct` of group `q`, zero past the row's end (clamped reads).
#[cube]
#[allow(clippy::too_many_arguments)]
fn gemm_load<NW: Size>(
    xq: &[Vector<u32, NW>],
    weight: &[Vector<u32, NW>],
    ga: &Array<usize>,
    gb: &Array<usize>,
    chunks: usize,
    ct: usize,
    s: usize,
    la: &mut Array<Vector<u32, NW>>,
    lb: &mut Array<Vector<u32, NW>>,
    #[comptime] pa: usize,
    #[comptime] pb: usize,
    #[comptime] gk: usize,
) {
    #[unroll]
    for q in 0..gk {
        let c = (s * gk + q) * 4 + ct;
        let cc = c.min(chunks - 1);
        let z = if c < chunks { 0xFFFF_FFFFu32 } else { 0u32 };
        let zv = Vector::<u32, NW>::new(z);
        #[unroll]
        for r in 0..pa {
            la[q * pa + r] = weight[ga[r] + cc] & zv;
        }
        #[unroll]
        for r in 0..pb {
            lb[q * pb + r] = xq[gb[r] + cc] & zv;
        }
    }
}

/// Stores a step's loads ([`gemm_load`]) into the buffers at `oa` / `ob`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn gemm_store<NW: Size>(
    sa: &mut Shared<[Vector<u32, NW>]>,
    sb: &mut Shared<[Vector<u32, NW>]>,
    la: &Array<Vector<u32, NW>>,
    lb: &Array<Vector<u32, NW>>,
    oa: usize,
    ob: usize,
    tid: usize,
    #[comptime] pa: usize,
    #[comptime] pb: usize,
    #[comptime] gk: usize,
    #[comptime] bm: usize,
    #[comptime] bn: usize,
    #[comptime] threads: usize,
) {
    #[unroll]
    for q in 0..gk {
        #[unroll]
        for r in 0..pa {
            sa[oa + q * bm * 4 + tid + r * threads] = la[q * pa + r];
        }
        #[unroll]
        for r in 0..pb {
            sb[ob + q * bn * 4 + tid + r * threads] = lb[q * pb + r];
        }
    }
}

/// The GEMM launch of a plain FP8 call over rows already quantized to E4M3 words `xq` (the
/// caller, [`super::mma::fp8`], has checked bf16, `k % 16 == 0`, the CUDA E4M3 `mma` and
/// [`super::plan::MmaMin::fp8_gemm`]).
pub(crate) fn fp8<R: CubeRuntime>(
    c: &Call<R>,
    xq: &CubeTensor<R>,
    weight: &CubeTensor<R>,
    is: &CubeTensor<R>,
    ws: &CubeTensor<R>,
    shape: GemmShape,
) {
    let (sa, sb) = c.split_args();
    let wn = shape.warps_n;
    let (gy, gz) = yz(c.slots.div_ceil(wn * TILES_N * 8));
    let gx = c.n.div_ceil(GEMM_ROWS) as u32;
    // Safety: `k % 16 == 0` makes rows of codes and weights whole 16-byte vectors (chunk
    // indices clamped to the row); rows and tokens past the ends are clamped and never written.
    unsafe {
        fp8_gemm_kernel::launch_unchecked::<R>(
            &c.x.client,
            CubeCount::Static(gx, gy, gz),
            CubeDim::new_2d(32, (WARPS_M * wn) as u32),
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
            WARPS_M,
            wn,
            FRAGS_M,
            TILES_N,
            shape.steps,
            c.relu2,
            c.split.is_some(),
        )
    };
}
