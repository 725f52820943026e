//! What every tensor-core (`mma`) kernel family shares — the quantized linears ([`super::linear`])
//! and the dense bf16 matmul ([`super::matmul`]): where each path starts ([`MmaMin`], set
//! process-wide), the cubes' shapes and their defaults ([`MmaTuning`]), warps per cube, the sum of
//! K-split warps through shared memory, a step's 16-byte weight loads, and the row blocks and token
//! tiles of a plain call. A leaf below the kernels: it imports no kernel module (only the pure
//! [`super::linear::plan`]'s thresholds), so either family imports it one way.

use super::linear::plan::{
    MmaMin, DENSE_MM_MIN, FP8_MM_MIN, MMA_FP8_MIN_ROWS, MMA_MIN_ROWS, MMA_MIN_SLOTS,
    MMA_NVFP4_MIN_ROWS, MMA_TILE_MIN, MMA_TILE_MIN_ROWS,
};
use cubecl::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Warps per cube, at least: they split K of the cube's 16-row tile (a grid of `n / 16` cubes
/// fills the device even where `n` is a few thousand: 4096→2688 measured 63 µs for 64 rows with
/// one tile per warp, 42 cubes). Grids of few cubes take more (`warps`).
pub const WARPS: u32 = 4;

/// Threads a launch aims to have resident (the default of [`MmaTuning::threads`]; a quarter of
/// an H200's 132 × 2,048): below it the loads in flight cannot cover the memory latency (FP8
/// 4096→2688 at batch 1 is 168 cubes: 21,504 threads of [`WARPS`] warps, ≈ 1.4 MB in flight;
/// 16 warps per cube took the batch-1 Lightning step from 2.99 to 2.80 ms on the H200).
pub const TARGET_THREADS: usize = 64 * 1024;

/// [`plan_warps`] under the tuning in force.
pub(crate) fn warps(cubes: usize, iters: usize, grp: usize, sms: Option<usize>) -> usize {
    plan_warps(&tuning(), cubes, iters, grp, sms)
}

/// Warps per cube for `cubes` cubes over `iters` K steps taken `grp` at a time under `t` (pure;
/// tested on the host): [`MmaTuning::k_warps`], doubled (up to 16) while the grid holds fewer
/// than [`MmaTuning::threads`] threads and every warp still has a load round of its own; then,
/// with [`MmaTuning::waves`] and the device's SM count (`sms`), [`wave_warps`] halves a launch
/// that spills just past one wave.
pub fn plan_warps(
    t: &MmaTuning,
    cubes: usize,
    iters: usize,
    grp: usize,
    sms: Option<usize>,
) -> usize {
    let mut kw = t.k_warps;
    while t.widen && kw < 16 && cubes * kw * 32 < t.threads && 2 * kw * grp <= iters {
        kw *= 2;
    }
    match sms {
        Some(sms) if t.waves => wave_warps(cubes, kw, sms),
        _ => kw,
    }
}

/// Registers a unit of the tensor-core `mma` kernels holds, rounded up to the allocation granule
/// of 8 (ncu on the H100, `docs/PERF.md` §39: 52 for the NVFP4 kernel, 56 for FP8's): what
/// [`wave_warps`] sizes the cubes resident on an SM by.
pub const MMA_UNIT_REGISTERS: usize = 56;
/// Registers of an SM (sm_80 to sm_90).
const SM_REGISTERS: usize = 64 * 1024;

/// Warps splitting K for a launch of `cubes` cubes of `kw` warps on `sms` SMs (pure; tested on
/// the host): half of `kw` where the launch does not fit one wave of resident cubes (by
/// registers, at [`MMA_UNIT_REGISTERS`] a unit) and half the warps would, else `kw`. The
/// batch-1 routed `down` on Lightning is 1,344 cubes of 4 warps: 9 an SM, 1.13 waves on an
/// H100's 132 SMs (ncu: the partial wave up to half the time); of 2 warps, 18 an SM: one wave.
/// Launches of several full waves keep their cubes.
pub fn wave_warps(cubes: usize, kw: usize, sms: usize) -> usize {
    let resident = |kw: usize| {
        (SM_REGISTERS / (MMA_UNIT_REGISTERS * 32 * kw))
            .min(64 / kw)
            .min(32)
            * sms
    };
    if kw > 1 && cubes > resident(kw) && cubes <= resident(kw / 2) {
        kw / 2
    } else {
        kw
    }
}

/// The device's SM count (CUDA reports it; `None` elsewhere).
pub(crate) fn sms<R: cubecl::prelude::Runtime>(
    client: &cubecl::prelude::ComputeClient<R>,
) -> Option<usize> {
    client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .map(|n| n as usize)
}

static MIN: [AtomicUsize; 12] = [
    AtomicUsize::new(MMA_NVFP4_MIN_ROWS),
    AtomicUsize::new(MMA_FP8_MIN_ROWS),
    AtomicUsize::new(MMA_MIN_ROWS),
    AtomicUsize::new(MMA_MIN_ROWS),
    AtomicUsize::new(MMA_MIN_SLOTS),
    AtomicUsize::new(MMA_TILE_MIN_ROWS),
    AtomicUsize::new(usize::MAX),
    AtomicUsize::new(usize::MAX),
    AtomicUsize::new(FP8_MM_MIN),
    AtomicUsize::new(DENSE_MM_MIN),
    AtomicUsize::new(FP8_MM_MIN),
    AtomicUsize::new(MMA_TILE_MIN),
];

/// Sets where each tensor-core path starts (process-wide; for tests and benchmarks).
pub fn set_mma(m: MmaMin) {
    for (cell, v) in MIN.iter().zip([
        m.nvfp4,
        m.fp8,
        m.dense,
        m.slot_major,
        m.grouped,
        m.tile,
        m.fp8_tile,
        m.fp8_gemm,
        m.fp8_mm,
        m.dense_mm,
        m.nvfp4_mm,
        m.tile_slots,
    ]) {
        cell.store(v, Ordering::Relaxed);
    }
}

/// The current thresholds of [`set_mma`].
pub fn mma() -> MmaMin {
    let v = |i: usize| MIN[i].load(Ordering::Relaxed);
    MmaMin {
        nvfp4: v(0),
        fp8: v(1),
        dense: v(2),
        slot_major: v(3),
        grouped: v(4),
        tile: v(5),
        fp8_tile: v(6),
        fp8_gemm: v(7),
        fp8_mm: v(8),
        dense_mm: v(9),
        nvfp4_mm: v(10),
        tile_slots: v(11),
    }
}

/// Every plain and slot-major path from `rows`, grouped routing from `slots` (`usize::MAX`
/// turns a path off); the tiled kernels at their defaults.
pub fn set_mma_min(rows: usize, slots: usize) {
    set_mma(MmaMin {
        nvfp4: rows,
        fp8: rows,
        dense: rows,
        slot_major: rows,
        grouped: slots,
        tile: MMA_TILE_MIN_ROWS,
        tile_slots: MMA_TILE_MIN,
        fp8_tile: usize::MAX,
        fp8_gemm: usize::MAX,
        fp8_mm: FP8_MM_MIN,
        nvfp4_mm: FP8_MM_MIN,
        dense_mm: DENSE_MM_MIN,
    });
}

/// 128/64/32-input steps (NVFP4/FP8/dense) a warp loads before it computes (the default of
/// [`MmaTuning::group`]).
pub const GROUP: usize = 2;

/// How the tensor-core kernels stream their weights: `group` steps per load round (1, 2, 4 or
/// 8), and whether the next round's loads are issued before the current round's work
/// (`pipe`; software pipelining, two rounds in flight per warp).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmaTuning {
    pub group: usize,
    pub pipe: bool,
    /// `pipe` for the FP8 kernel alone ([`fp8_pipe`]): its first load round goes out before the
    /// in-kernel quantizing (and the gated norm) of a few rows, so that prologue runs while the
    /// weights are in flight, without the NVFP4 kernels' extra registers. Off: the whole batch-1
    /// step measured −2.6 % after a 1K prompt and +0.9 % after 8K on an H100 (`docs/PERF.md`
    /// §41); kept for rows quantized before the kernel, where one process of the kernel table
    /// read `in_proj` at 15.7 µs with it against 17.1–19.6 without (to be repeated).
    pub fp8_pipe: bool,
    /// Small grids take more warps per cube (`warps`); off: always [`WARPS`].
    pub widen: bool,
    /// The threads a widened grid aims for.
    pub threads: usize,
    /// Warps splitting K of a tensor-core cube before widening: 1, 2 or 4 ([`WARPS`]). Fewer
    /// warps make smaller cubes, so more stay resident at once where registers limit them
    /// (a grid past one wave runs a second, mostly idle one). 4: `kw=2` was no faster on the
    /// whole batch-1 step on the H100 (`docs/PERF.md` §40).
    pub k_warps: usize,
    /// A launch just past one wave halves its warps where that fits it in one ([`wave_warps`];
    /// off: no faster on the whole batch-1 step on the H100, `docs/PERF.md` §40).
    pub waves: bool,
    /// Warps per cube of the tiled kernels ([`super::linear::tile`]): 4 or 8 (64 or 128 weight rows;
    /// a pass of one token tile stages too few vectors for 8 warps and runs 4,
    /// [`tile_warps`]).
    pub tile_warps: usize,
    /// The most token tiles of 8 a tiled cube takes per pass: 4, 8 or 16 (32, 64 or 128
    /// tokens).
    pub tile_tiles: usize,
    /// Fragments of 16 weight rows per warp of the tiled NVFP4 kernel: 1 or 2 (with 2, each
    /// staged activation word read from shared memory feeds two `mma`s).
    pub tile_frags: usize,
    /// Shared buffers of staged activations in the tiled kernels: 1 (two barriers per
    /// step: the next step's stores wait for every warp's reads) or 2 (one barrier per step:
    /// the next step's stores go to the other buffer).
    pub tile_buffers: usize,
    /// Cube rows per expert of a routed tiled launch: 1 to 4 (each part takes every
    /// `parts`-th pass of the expert's slots).
    pub tile_parts: usize,
    /// Warps along the tokens of the FP8 GEMM ([`super::linear::gemm`]): 2 or 4 (64 or 128 tokens per
    /// cube).
    pub gemm_warps_n: usize,
    /// Groups of 64 inputs per staged step of the FP8 GEMM: 1 or 2.
    pub gemm_steps: usize,
    /// [`super::linear::mma::fp8_mma_kernel()`] and the tiled FP8 kernel accumulate in the `mma` itself (on) instead
    /// of each `k32` `mma` into a zeroed accumulator added to the running sum in f32 (off;
    /// [`super::linear::mma`]'s docs).
    pub fp8_direct: bool,
    /// Warps of a [`WARPS`]-warp cube of the plain FP8 and dense `mma` kernels that take row
    /// tiles side by side: 1, 2 or 4 (the other `WARPS / m_warps` split K). With more than
    /// one, the warps of a cube read the same activations, which then come from L1 instead of
    /// L2 (at 64 × 128 `in_proj`'s 644 single-tile cubes per row block read each activation 644
    /// times from L2). Widened launches (small grids) keep 1.
    pub m_warps: usize,
    /// The NVFP4 tensor-core kernels decode E2M1 in bf16 alone
    /// (`linear::frag::e2m1_pair_bf16`; [`super::linear::tile::TileShape::bf16_decode`]).
    pub bf16_decode: bool,
}

impl Default for MmaTuning {
    fn default() -> Self {
        MmaTuning {
            group: GROUP,
            pipe: PIPE,
            fp8_pipe: FP8_PIPE,
            widen: true,
            threads: TARGET_THREADS,
            k_warps: WARPS as usize,
            waves: false,
            tile_warps: TILE_WARPS,
            tile_tiles: TILE_TILES,
            tile_frags: TILE_FRAGS,
            tile_buffers: TILE_BUFFERS,
            tile_parts: TILE_PARTS,
            gemm_warps_n: GEMM_WARPS_N,
            gemm_steps: GEMM_STEPS,
            fp8_direct: FP8_DIRECT,
            m_warps: M_WARPS,
            bf16_decode: BF16_DECODE,
        }
    }
}

/// The default of [`MmaTuning::pipe`].
pub const PIPE: bool = false;

/// The default of [`MmaTuning::fp8_pipe`]: off (`docs/PERF.md` §41).
pub const FP8_PIPE: bool = false;

/// Whether the plain FP8 `mma` kernel pipelines its loads under `t` (pure; tested on the host):
/// with [`MmaTuning::pipe`] (every tensor-core kernel) or [`MmaTuning::fp8_pipe`] (this one).
pub fn fp8_pipe(t: &MmaTuning) -> bool {
    t.pipe || t.fp8_pipe
}

/// The default of [`MmaTuning::fp8_direct`]. On sm_90 the E4M3 `mma` is no tensor-core FP8
/// instruction: `ptxas` widens each operand to f16 (`F2FP.F16.E4M3.UNPACK_B`) and runs two
/// f16 `HMMA.16816.F32` with a zero accumulator, so every `k32` step costs 4 `FADD`s besides:
/// 40 % of `fp8_mma_kernel`'s instructions at 1,024 rows (ncu source counters, H100, PERF §26),
/// against 10 % `HMMA`. Accumulating in the `HMMA` is the f32 accumulation the bf16 kernels
/// already use. On by default since the whole-model CUDA parity passed with it (16/16,
/// `NEMOTRON_TEST_KERNELS=fp8direct=on`) and it measured +0.6 to +1.8 % prefill at 8 / 16 /
/// 64 × 128 on an H100 (PERF §28, against two runs of the default; §26 had +0.3 to +1.0 %:
/// small, as the kernel waits on latency, 7.7 cycles per issued instruction, more than it
/// issues).
pub const FP8_DIRECT: bool = true;

/// The default of [`MmaTuning::bf16_decode`]: on. On an H100 it measured +3.5 / +4.8 / +3.9 %
/// prefill at 8 / 16 / 64 × 128 and −11 / −10 / −8 % decode step time at batch 8 / 16 / 64
/// (PERF §27). The f16 → f32 → bf16 path had been ≈ 5.6 of the tiled kernel's ≈ 10 instructions
/// per `HMMA` (PERF §26). The products are the same (a power of two moved from the weights to
/// the f32 sums).
pub const BF16_DECODE: bool = true;

/// The default of [`MmaTuning::m_warps`]: 1. On an H100, 2 and 4 measured +0.4 % and −2.2 % prefill
/// at 16 × 128, and slowed decode batches by up to 7 % (PERF §27).
pub const M_WARPS: usize = 1;

/// `(kw, mw)`: warps splitting K and warps side by side over row tiles of a plain FP8 or dense
/// `mma` launch, from the `kw` that [`warps`] chose and the tuning's `m_warps` (pure, tested
/// on the host): a launch of [`WARPS`] warps trades K parts for row tiles; a widened one (a
/// small grid, where more K parts fill the device) keeps one row tile.
pub fn m_split(kw: usize, m_warps: usize) -> (usize, usize) {
    if kw == WARPS as usize && m_warps > 1 && kw.is_multiple_of(m_warps) {
        (kw / m_warps, m_warps)
    } else {
        (kw, 1)
    }
}

static TUNE_GROUP: AtomicUsize = AtomicUsize::new(GROUP);
static TUNE_PIPE: AtomicBool = AtomicBool::new(PIPE);
static TUNE_FP8_PIPE: AtomicBool = AtomicBool::new(FP8_PIPE);
static TUNE_WIDEN: AtomicBool = AtomicBool::new(true);
static TUNE_THREADS: AtomicUsize = AtomicUsize::new(TARGET_THREADS);
static TUNE_K_WARPS: AtomicUsize = AtomicUsize::new(WARPS as usize);
static TUNE_WAVES: AtomicBool = AtomicBool::new(false);
static TUNE_TILE_WARPS: AtomicUsize = AtomicUsize::new(TILE_WARPS);
static TUNE_TILE_TILES: AtomicUsize = AtomicUsize::new(TILE_TILES);
static TUNE_TILE_FRAGS: AtomicUsize = AtomicUsize::new(TILE_FRAGS);
static TUNE_TILE_BUFFERS: AtomicUsize = AtomicUsize::new(TILE_BUFFERS);
static TUNE_TILE_PARTS: AtomicUsize = AtomicUsize::new(TILE_PARTS);
static TUNE_GEMM_WARPS_N: AtomicUsize = AtomicUsize::new(GEMM_WARPS_N);
static TUNE_GEMM_STEPS: AtomicUsize = AtomicUsize::new(GEMM_STEPS);
static TUNE_FP8_DIRECT: AtomicBool = AtomicBool::new(FP8_DIRECT);
static TUNE_M_WARPS: AtomicUsize = AtomicUsize::new(M_WARPS);
static TUNE_BF16_DECODE: AtomicBool = AtomicBool::new(BF16_DECODE);

/// Sets [`MmaTuning`] (process-wide; for tests and benchmarks); a value the kernels cannot take
/// is refused by name ([`MmaTuning::check`]) and nothing is set.
pub fn set_tuning(t: MmaTuning) -> Result<(), String> {
    t.check()?;
    TUNE_TILE_FRAGS.store(t.tile_frags, Ordering::Relaxed);
    TUNE_TILE_BUFFERS.store(t.tile_buffers, Ordering::Relaxed);
    TUNE_TILE_PARTS.store(t.tile_parts, Ordering::Relaxed);
    TUNE_GEMM_WARPS_N.store(t.gemm_warps_n, Ordering::Relaxed);
    TUNE_GEMM_STEPS.store(t.gemm_steps, Ordering::Relaxed);
    TUNE_FP8_DIRECT.store(t.fp8_direct, Ordering::Relaxed);
    TUNE_M_WARPS.store(t.m_warps, Ordering::Relaxed);
    TUNE_BF16_DECODE.store(t.bf16_decode, Ordering::Relaxed);
    TUNE_TILE_WARPS.store(t.tile_warps, Ordering::Relaxed);
    TUNE_TILE_TILES.store(t.tile_tiles, Ordering::Relaxed);
    TUNE_GROUP.store(t.group, Ordering::Relaxed);
    TUNE_PIPE.store(t.pipe, Ordering::Relaxed);
    TUNE_FP8_PIPE.store(t.fp8_pipe, Ordering::Relaxed);
    TUNE_WIDEN.store(t.widen, Ordering::Relaxed);
    TUNE_THREADS.store(t.threads, Ordering::Relaxed);
    TUNE_K_WARPS.store(t.k_warps, Ordering::Relaxed);
    TUNE_WAVES.store(t.waves, Ordering::Relaxed);
    Ok(())
}

impl MmaTuning {
    /// Refuses, naming the knob (by its `bench --mma-min` key) and the values allowed, a group
    /// other than 1, 2, 4 or 8, tile warps other than 4 or 8, token tiles other than 4, 8 or
    /// 16, row fragments or staging buffers other than 1 or 2, parts per expert outside 1–4,
    /// GEMM warps along tokens other than 2 or 4, GEMM groups per step other than 1 or 2, or
    /// warps over row tiles other than 1, 2 or 4.
    pub fn check(&self) -> Result<(), String> {
        let knobs: [(&str, &str, usize, &[usize]); 10] = [
            (
                "kw",
                "tensor-core warps splitting K before widening",
                self.k_warps,
                &[1, 2, 4],
            ),
            (
                "mw",
                "FP8 and dense mma kernel warps over row tiles",
                self.m_warps,
                &[1, 2, 4],
            ),
            ("grp", "tensor-core load group", self.group, &[1, 2, 4, 8]),
            (
                "tw",
                "tiled kernel warps per cube",
                self.tile_warps,
                &[4, 8],
            ),
            (
                "nt",
                "tiled kernel token tiles per pass",
                self.tile_tiles,
                &[4, 8, 16],
            ),
            (
                "rf",
                "tiled kernel row fragments per warp",
                self.tile_frags,
                &[1, 2],
            ),
            (
                "buf",
                "tiled kernel staging buffers",
                self.tile_buffers,
                &[1, 2],
            ),
            (
                "tp",
                "tiled kernel cube rows per expert",
                self.tile_parts,
                &[1, 2, 3, 4],
            ),
            (
                "gw",
                "FP8 GEMM warps along tokens",
                self.gemm_warps_n,
                &[2, 4],
            ),
            (
                "gk",
                "FP8 GEMM 64-input groups per step",
                self.gemm_steps,
                &[1, 2],
            ),
        ];
        for (key, what, v, ok) in knobs {
            if !ok.contains(&v) {
                return Err(format!("{key}={v} ({what}): expected one of {ok:?}"));
            }
        }
        Ok(())
    }
}

/// The current [`MmaTuning`].
pub fn tuning() -> MmaTuning {
    MmaTuning {
        group: TUNE_GROUP.load(Ordering::Relaxed),
        pipe: TUNE_PIPE.load(Ordering::Relaxed),
        fp8_pipe: TUNE_FP8_PIPE.load(Ordering::Relaxed),
        widen: TUNE_WIDEN.load(Ordering::Relaxed),
        threads: TUNE_THREADS.load(Ordering::Relaxed),
        k_warps: TUNE_K_WARPS.load(Ordering::Relaxed),
        waves: TUNE_WAVES.load(Ordering::Relaxed),
        tile_warps: TUNE_TILE_WARPS.load(Ordering::Relaxed),
        tile_tiles: TUNE_TILE_TILES.load(Ordering::Relaxed),
        tile_frags: TUNE_TILE_FRAGS.load(Ordering::Relaxed),
        tile_buffers: TUNE_TILE_BUFFERS.load(Ordering::Relaxed),
        tile_parts: TUNE_TILE_PARTS.load(Ordering::Relaxed),
        gemm_warps_n: TUNE_GEMM_WARPS_N.load(Ordering::Relaxed),
        gemm_steps: TUNE_GEMM_STEPS.load(Ordering::Relaxed),
        fp8_direct: TUNE_FP8_DIRECT.load(Ordering::Relaxed),
        m_warps: TUNE_M_WARPS.load(Ordering::Relaxed),
        bf16_decode: TUNE_BF16_DECODE.load(Ordering::Relaxed),
    }
}

/// Warps per cube, side by side over the weight rows, by default
/// ([`MmaTuning::tile_warps`]: 4 or 8). 8 (128 rows per cube, each staged
/// activation read by twice the rows) measured 1.7–4.6 % faster prefill than 4 on the H200 at
/// 1 × 1,024, 16 × 128 and 64 × 128 (PERF §19).
pub const TILE_WARPS: usize = 8;

/// Fragments of 16 weight rows per warp of the NVFP4 kernel, by default
/// ([`MmaTuning::tile_frags`]: 1 or 2). 2 halves the shared-memory reads per `mma`
/// (the kernel's L1 throughput is 77–88 % busy) but doubles the accumulators: on the H200 it
/// measured 6.5–9 % slower prefill (0.5 % with 16 token tiles at 64 × 128) (PERF §19; the kernel sits at 128 registers, occupancy-bound).
pub const TILE_FRAGS: usize = 1;

/// The most token tiles of 8 per pass, by default ([`MmaTuning::tile_tiles`]: 8 or
/// 16).
pub const TILE_TILES: usize = 8;

/// Shared staging buffers by default ([`MmaTuning::tile_buffers`]: 1 or 2). Two
/// (one barrier per step) measured 1.2 % slower at 1 × 1,024 and 1.2–1.4 % slower with
/// `tp=2` at 16 and 64 × 128 on an H100 (PERF §23): the barrier was not what the kernel waits on.
pub const TILE_BUFFERS: usize = 1;

/// Cube rows per expert of a routed tiled launch by default
/// ([`MmaTuning::tile_parts`]: 1 to 4). 4 measured +6.6 % prefill at 16 × 128 and
/// +8.9 % at 64 × 128 against 1 on an H100 (2: +4.9 / +6.4 %; PERF §23): an expert's passes run
/// side by side instead of one after another in one cube. Prompts whose experts hold at most one
/// pass (64 slots) leave the extra cubes nothing to do; they exit at once.
pub const TILE_PARTS: usize = 4;

/// Warps of a cube along the tokens by default ([`super::linear::gemm::GemmShape::warps_n`]).
pub const GEMM_WARPS_N: usize = 4;

/// Groups of 64 inputs per staged step by default ([`super::linear::gemm::GemmShape::steps`]).
pub const GEMM_STEPS: usize = 1;

/// Sums the warps' accumulators into warp 0's (through shared memory; `kw` warps split K).
/// Every warp of the cube calls it (it synchronizes the cube).
#[cube]
pub(crate) fn warp_sum(
    acc: &mut Array<Vector<f32, Const<2>>>,
    #[comptime] nt: usize,
    #[comptime] kw: usize,
) {
    warp_sum_m(acc, nt, kw, 1usize);
}

/// [`warp_sum`] for a cube of `kw · mw` warps, warp `w` taking row tile `w % mw` and K part
/// `w / mw`: each tile's K parts are summed into its part 0.
#[cube]
pub(crate) fn warp_sum_m(
    acc: &mut Array<Vector<f32, Const<2>>>,
    #[comptime] nt: usize,
    #[comptime] kw: usize,
    #[comptime] mw: usize,
) {
    if kw > 1 {
        let mut sm = Shared::<[f32]>::new_slice(kw * mw * nt * 4 * 32);
        let (warp, lane) = (UNIT_POS_Y as usize, UNIT_POS_X as usize);
        let (mwarp, kwarp) = (warp % mw, warp / mw);
        if kwarp > 0 {
            #[unroll]
            for j in 0..nt * 2 {
                #[unroll]
                for i in 0..2usize {
                    sm[((warp * nt * 2 + j) * 2 + i) * 32 + lane] = acc[j].extract(i);
                }
            }
        }
        sync_cube();
        if kwarp == 0 {
            #[unroll]
            for ww in 1..kw {
                #[unroll]
                for j in 0..nt * 2 {
                    let mut v = acc[j];
                    #[unroll]
                    for i in 0..2usize {
                        v.insert(
                            i,
                            v.extract(i)
                                + sm[(((ww * mw + mwarp) * nt * 2 + j) * 2 + i) * 32 + lane],
                        );
                    }
                    acc[j] = v;
                }
            }
        }
        sync_cube();
    }
}

/// Loads `grp` steps of 16-byte chunks of rows `row0`/`row1` from step `it0` (clamped to the
/// last chunk), for the FP8 and dense kernels.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn chunk_load<NW: Size>(
    w: &[Vector<u32, NW>],
    row0: usize,
    row1: usize,
    chunks: usize,
    it0: usize,
    t: usize,
    wa: &mut Array<Vector<u32, NW>>,
    wb: &mut Array<Vector<u32, NW>>,
    #[comptime] grp: usize,
) {
    #[unroll]
    for q in 0..grp {
        let cc = ((it0 + q) * 4 + t).min(chunks - 1);
        wa[q] = w[row0 * chunks + cc];
        wb[q] = w[row1 * chunks + cc];
    }
}

/// The end of the block of `block` rows from `first` in a call of `count` rows.
#[cube]
pub(crate) fn block_end(first: usize, block: u32, count: usize) -> usize {
    let end = first + block as usize;
    if end < count {
        end
    } else {
        count
    }
}

/// Passes of `8 · nt` rows a plain (unrouted) tensor-core cube takes: one. A prefill's rows
/// then spread over grid y in blocks of one pass instead of one cube row walking them all:
/// at 1,024 rows the FP8 `in_proj` had 644 cubes of 4 warps (≈ 20 warps per H200 SM) and the
/// dense `o_proj` 168 cubes of 16 warps splitting K, each walking 16 passes (ncu, PERF §15).
pub const BLOCK_PASSES: usize = 1;

/// Rows per block and blocks (grid y, folded onto z past 65,535) of a plain call over `rows`
/// rows taken `8 · nt` per pass (pure; tested on the host).
pub fn blocks(rows: usize, nt: usize) -> (usize, usize) {
    let block = 8 * nt * BLOCK_PASSES;
    (block, rows.div_ceil(block).max(1))
}

/// Token tiles of 8 per pass for `per_expert` tokens on average.
pub(crate) fn tiles(per_expert: usize) -> usize {
    tiles_up_to(per_expert, 8)
}

/// Token tiles of 8 per pass for `per_expert` tokens on average, at most `max` (4, 8 or 16;
/// pure, tested on the host).
pub fn tiles_up_to(per_expert: usize, max: usize) -> usize {
    let nt = match per_expert.div_ceil(8) {
        0 | 1 => 1,
        2 => 2,
        3 | 4 => 4,
        5..=8 => 8,
        _ => 16,
    };
    nt.min(max)
}

/// Warps per cube of a tiled launch taking `nt` token tiles per pass with `warps` asked for:
/// a cube stages `8 · nt` tokens × 16 vectors, one vector per thread at least, so 8 warps need
/// 2 tiles or more (pure, tested on the host).
pub fn tile_warps(warps: usize, nt: usize) -> usize {
    warps.min(4 * nt).max(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every threshold set is the one read back: each field has its own cell (a field mapped
    /// to another's cell, or left out, would silently drop a `--mma-min` key).
    #[test]
    fn set_mma_keeps_every_threshold() {
        let saved = mma();
        let m = MmaMin {
            nvfp4: 101,
            fp8: 102,
            dense: 103,
            slot_major: 104,
            grouped: 105,
            tile: 106,
            tile_slots: 107,
            fp8_tile: 108,
            fp8_gemm: 109,
            fp8_mm: 110,
            nvfp4_mm: 111,
            dense_mm: 112,
        };
        set_mma(m);
        let got = mma();
        set_mma(saved);
        assert_eq!(got, m);
    }
}
