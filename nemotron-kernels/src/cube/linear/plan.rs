//! Which kernel runs a quantized linear call, and why: one pure function of the call's shape,
//! whether the device has the tensor-core instruction, and the size settings. The launchers
//! ([`super::launcher`], over each format's tiers) run the path it returns; nothing else in
//! [`super`] decides.
//! Tested on the host (`tests/ops`, `linear_plan`), for both formats at the real shapes.
//!
//! Tiers, first that applies:
//! 0. **Decoded** (plain rows from [`MmaMin::fp8_mm`] / [`MmaMin::nvfp4_mm`], any activation
//!    type, `k` a multiple of 16): the weights decoded into the activation type and cubek's tiled
//!    matmul ([`super::decoded`]).
//! 1. **Tensor cores** (bf16 activations, `k` a multiple of 32 (NVFP4) or 16 (FP8), the device's
//!    `mma`, enough rows — [`MmaMin`]): the tiled kernel ([`super::tile`]) from
//!    [`MmaMin::tile`] plain NVFP4 rows or [`MmaMin::tile_slots`] grouped slots (FP8:
//!    [`MmaMin::fp8_tile`] rows quantized apart; before it, [`MmaMin::fp8_gemm`] rows for [`super::gemm`]), else [`super::mma`]'s kernel over plain rows, slots grouped by expert
//!    (from [`MmaMin::grouped`], `E` within the grid's y limit) or slot-major.
//! 2. **Expert-major GEMV** ([`super::grouped`]; routed NVFP4 from its slot threshold, `k` up
//!    to 4,096).
//! 3. **GEMVs**: small-M (2+ plain rows), vector (one row or routed; FP8 `k` up to 12,288), scalar
//!    (any size).

/// Rows of `x` from which a dense linear, and slot-major routing, run on the tensor cores
/// (bf16, CUDA); plain NVFP4 from [`MMA_NVFP4_MIN_ROWS`].
pub const MMA_MIN_ROWS: usize = 4;
/// Rows of `x` from which a plain NVFP4 linear runs on the tensor cores: every row. At batch 1
/// that is the lm_head (the shared expert folds into the routed stack at decode): one token of
/// eight per `mma`, but E2M1 pairs decoded straight into bf16 fragments, where the GEMV, bound
/// by what it issues, decodes and multiplies each weight in f32. The whole batch-1 Lightning
/// step on an H100 (one process, median of 2): 2.37 →
/// 2.29 ms after a 1K prompt and 2.52 → 2.44 ms after 8K (`docs/PERF.md` §41); from 4 rows
/// every plain NVFP4 linear already ran here.
pub const MMA_NVFP4_MIN_ROWS: usize = 1;
/// Rows of `x` from which a plain FP8 linear runs on the tensor cores: every row. At batch 1
/// the `mma` over one token of eight still beat the FP8 GEMV in the whole Lightning step on the
/// H200 (3.15 → 2.91 ms per token after a 1K prompt; the GEMV is issue-bound on its decode).
pub const MMA_FP8_MIN_ROWS: usize = 1;
/// Routing slots from which routed NVFP4 experts run on the tensor cores, grouped by expert.
pub const MMA_MIN_SLOTS: usize = 32;

/// Where each tensor-core path starts (`usize::MAX`: never): plain linears by rows of `x` and
/// weight kind, routed NVFP4 experts by routing slots — slot-major (one token per cube) from
/// `slot_major`, grouped by expert from `grouped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmaMin {
    pub nvfp4: usize,
    pub fp8: usize,
    pub dense: usize,
    pub slot_major: usize,
    pub grouped: usize,
    /// Plain NVFP4 rows from which NVFP4 runs the tiled kernel ([`super::tile`]: activations
    /// staged in shared memory, 64 weight rows per cube).
    pub tile: usize,
    /// Grouped routing slots from which routed NVFP4 experts run the tiled kernel.
    pub tile_slots: usize,
    /// Plain FP8 rows (quantized apart) from which FP8 runs the tiled kernel
    /// ([`super::tile::fp8_tile_kernel()`]). Off by default: on the H200 it measured no faster
    /// than [`super::mma::fp8_mma_kernel()`] at 1,024 rows (`in_proj` 0.338 against 0.333 ms per layer,
    /// `out_proj` 0.145 against 0.121; PERF §17).
    pub fp8_tile: usize,
    /// Plain FP8 rows (quantized apart) from which FP8 runs the GEMM with both operands staged
    /// in shared memory ([`super::gemm`]); before the tiled kernel. Off by default: measured
    /// 25 % slower than [`super::mma::fp8_mma_kernel()`] at 8–64 × 128 prefills (PERF §25).
    pub fp8_gemm: usize,
    /// Plain FP8 rows from which the weights are decoded into the activation type and the
    /// product runs on cubek's tiled matmul ([`LinearPath::Decoded`]; any activation type, any
    /// device). Before every tensor-core tier.
    pub fp8_mm: usize,
    /// Plain NVFP4 rows from which the weights are decoded (`E2M1 · block scale`, exact in the
    /// activation type) for cubek's tiled matmul ([`LinearPath::Decoded`]).
    pub nvfp4_mm: usize,
    /// Rows from which a dense linear whose activations are in its weight's type runs on
    /// cubek's tiled matmul instead of
    /// [`crate::cube::matmul::mma::dense_mma_kernel()`] ([`crate::cube::matmul::linear_launch`]).
    pub dense_mm: usize,
}

impl Default for MmaMin {
    fn default() -> Self {
        MmaMin {
            nvfp4: MMA_NVFP4_MIN_ROWS,
            fp8: MMA_FP8_MIN_ROWS,
            dense: MMA_MIN_ROWS,
            slot_major: MMA_MIN_ROWS,
            grouped: MMA_MIN_SLOTS,
            tile: MMA_TILE_MIN_ROWS,
            tile_slots: MMA_TILE_MIN,
            fp8_tile: usize::MAX,
            fp8_gemm: usize::MAX,
            fp8_mm: FP8_MM_MIN,
            nvfp4_mm: FP8_MM_MIN,
            dense_mm: DENSE_MM_MIN,
        }
    }
}

/// Plain FP8 (and NVFP4) rows from which the decoded-weight path runs by default
/// ([`MmaMin::fp8_mm`], [`MmaMin::nvfp4_mm`]): off until measured.
pub const FP8_MM_MIN: usize = usize::MAX;
/// Rows from which dense bf16 linears run on cubek's matmul by default ([`MmaMin::dense_mm`]):
/// off until measured.
pub const DENSE_MM_MIN: usize = usize::MAX;

/// Grouped routing slots from which routed NVFP4 experts run the tiled kernel (the default of
/// [`MmaMin::tile_slots`]): batch 256's 1,536 slots and prompts, not batch 64's 384 (the H100
/// decoded batch 64 2.2 % slower with them tiled, PERF 36).
pub const MMA_TILE_MIN: usize = 512;
/// Plain NVFP4 rows from which NVFP4 runs the tiled kernel (the default of [`MmaMin::tile`]):
/// from batch 256 (the shared expert and lm_head), where it took a decode step 29.87 → 27.87 ms
/// on the H100 (PERF 36); below it the `mma` kernel.
pub const MMA_TILE_MIN_ROWS: usize = 256;

/// The weight format of a quantized linear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// NVFP4 (W4A16): E2M1 values, E4M3 block scales of 16, an f32 global scale.
    Nvfp4,
    /// FP8 (static W8A8): E4M3 weights and activations, per-tensor scales.
    Fp8,
}

/// The tensor-core kernel's form ([`super::mma`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmaForm {
    /// Plain rows of `x` in blocks.
    Rows,
    /// Routed slots grouped by expert on the device (one grid row per expert).
    Grouped,
    /// Routed slots one per cube row, each reading its own expert.
    SlotMajor,
}

/// The kernel a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearPath {
    /// The tiled tensor-core kernel ([`super::tile`]): plain rows, or (NVFP4) slots grouped by
    /// expert.
    Tiled { grouped: bool },
    /// The FP8 GEMM with both operands staged in shared memory ([`super::gemm`]): plain rows.
    Gemm,
    /// The weights decoded into the activation type (exact), the product on cubek's tiled
    /// matmul (f32 accumulation), the scales and epilogue applied after: plain rows
    /// ([`super::decoded`]).
    Decoded,
    /// The tensor-core kernel of [`super::mma`].
    Mma(MmaForm),
    /// Routed NVFP4 slots grouped by expert, GEMV cubes per (row block, expert)
    /// ([`super::grouped`]).
    ExpertMajor,
    /// 2+ plain rows, each weight chunk decoded once for 2–8 rows.
    SmallM,
    /// One row, or routed slots: 16-byte weight chunks per lane.
    Gemv,
    /// Any size: one output row per unit row.
    Scalar,
}

/// A path and why it was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearPlan {
    pub path: LinearPath,
    pub reason: &'static str,
}

/// The call as the plan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearShape {
    pub format: Format,
    /// Whether the activations are bf16 (the tensor-core kernels' input).
    pub bf16: bool,
    /// Output rows: rows of `x`, or routing slots.
    pub slots: usize,
    /// Input features.
    pub k: usize,
    /// Whether the rows are routed slots over a stack of experts.
    pub routed: bool,
    /// Experts in the weight stack (1 for a plain linear).
    pub experts: usize,
}

/// What the plan depends on besides the shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Whether the device runs the format's `mma` (bf16 `16×8×16` for NVFP4, E4M3 `16×8×32`
    /// for FP8) into f32, and tensor cores are not switched off.
    pub mma: bool,
    /// Where each tensor-core path starts.
    pub min: MmaMin,
    /// Routed NVFP4 slots from which the expert-major GEMV runs.
    pub grouped_min: usize,
    /// FP8 rows quantized inside the tensor-core kernel, up to (rows of at most 4,096 words).
    pub inq_max: usize,
}

/// The most inputs the expert-major GEMV takes ([`super::grouped`]: a lane holds its whole
/// share of a row, 4 chunks of 32).
pub const EXPERT_MAJOR_MAX_K: usize = 32 * 32 * 4;
/// The most inputs of the FP8 vector GEMV (its quantized row staged in shared memory).
pub const FP8_GEMV_MAX_K: usize = 12_288;

/// The most cubes along a grid's y (every runtime): the expert-grouped forms give each expert a
/// grid row.
const MAX_EXPERTS: usize = super::super::buffers::MAX_CUBES;
/// FP8 words (4 codes each) a cube quantizes in its prologue, at most.
const INQ_MAX_WORDS: usize = 4096;

/// The path of a call (see the module docs).
pub fn plan(s: &LinearShape, l: &Limits) -> LinearPlan {
    tensor_cores(s, l).unwrap_or_else(|| gemv(s, l))
}

fn tensor_cores(s: &LinearShape, l: &Limits) -> Option<LinearPlan> {
    let m = &l.min;
    let decoded_min = match s.format {
        Format::Fp8 => m.fp8_mm,
        Format::Nvfp4 => m.nvfp4_mm,
    };
    if !s.routed && s.experts == 1 && s.slots >= decoded_min && s.k % 16 == 0 {
        return Some(LinearPlan {
            path: LinearPath::Decoded,
            reason: "enough rows for the decoded weights on the tiled matmul",
        });
    }
    let step = match s.format {
        Format::Nvfp4 => 32,
        Format::Fp8 => 16,
    };
    if !s.bf16 || s.k % step != 0 || !l.mma {
        return None;
    }
    let p = |path, reason| Some(LinearPlan { path, reason });
    match s.format {
        Format::Nvfp4 => {
            let grouped = s.routed && s.slots >= m.grouped && s.experts <= MAX_EXPERTS;
            if s.routed && !grouped && s.slots < m.slot_major {
                return None;
            }
            if !s.routed && s.slots < m.nvfp4 {
                return None;
            }
            let tile_min = if grouped { m.tile_slots } else { m.tile };
            if (grouped || !s.routed) && s.slots >= tile_min {
                return p(
                    LinearPath::Tiled { grouped },
                    "enough rows for the tiled kernel",
                );
            }
            if grouped {
                p(
                    LinearPath::Mma(MmaForm::Grouped),
                    "routed slots past the grouping threshold",
                )
            } else if s.routed {
                p(
                    LinearPath::Mma(MmaForm::SlotMajor),
                    "routed slots below the grouping threshold",
                )
            } else {
                p(LinearPath::Mma(MmaForm::Rows), "plain rows")
            }
        }
        Format::Fp8 => {
            if s.routed || s.slots < m.fp8 {
                return None;
            }
            // A few rows are quantized inside the kernel; more apart first (the tiled kernel
            // reads them quantized).
            let inq = s.slots <= l.inq_max && s.slots * s.k / 4 <= INQ_MAX_WORDS;
            if !inq && s.slots >= m.fp8_gemm {
                return p(LinearPath::Gemm, "enough rows for the FP8 GEMM");
            }
            if !inq && s.slots >= m.fp8_tile {
                return p(
                    LinearPath::Tiled { grouped: false },
                    "enough rows for the tiled kernel",
                );
            }
            p(LinearPath::Mma(MmaForm::Rows), "plain rows")
        }
    }
}

/// The GEMV tiers (the tensor cores aside): also where a planned tensor-core launch that cannot
/// be made falls back to.
pub fn gemv(s: &LinearShape, l: &Limits) -> LinearPlan {
    let p = |path, reason| LinearPlan { path, reason };
    match s.format {
        Format::Nvfp4 => {
            if s.routed && s.slots >= l.grouped_min && s.k % 32 == 0 && s.k <= EXPERT_MAJOR_MAX_K {
                p(
                    LinearPath::ExpertMajor,
                    "routed slots past the expert-major threshold",
                )
            } else if s.k % 32 != 0 {
                p(LinearPath::Scalar, "inputs not a multiple of 32")
            } else if !s.routed && s.slots >= 2 {
                p(LinearPath::SmallM, "2+ plain rows")
            } else {
                p(LinearPath::Gemv, "one row, or routed slots")
            }
        }
        Format::Fp8 => {
            if s.k % 16 != 0 {
                p(LinearPath::Scalar, "inputs not a multiple of 16")
            } else if !s.routed && s.slots >= 2 {
                p(LinearPath::SmallM, "2+ plain rows")
            } else if s.k <= FP8_GEMV_MAX_K {
                p(LinearPath::Gemv, "one row, or routed slots")
            } else {
                p(
                    LinearPath::Scalar,
                    "inputs past the vector GEMV's shared row",
                )
            }
        }
    }
}
