//! Launch geometry of the linear kernels, and (with the prefill issue) the size thresholds that
//! pick between GEMV and tiled GEMM.
//!
//! GEMV: a cube holds [`GEMV_ROWS`] unit rows of [`GEMV_LANES`] lanes for one output slot.
//! - The **vector** GEMVs (`in` a multiple of 32 for NVFP4, of 16 for FP8: every real shape) give
//!   each unit row `rows` consecutive output rows (1 or 2, see [`rows_per_unit_row`]); lane `l`
//!   takes the 16-byte weight chunks `l, l + 32, …` of each of them, `group` chunks per step
//!   ([`gemv_group`]) with every load of a step issued before any is used, so one activation
//!   chunk serves `rows` weight chunks, a warp reads 512 contiguous bytes per load, and a lane
//!   waits for memory once per step instead of once per chunk.
//!   The lanes reduce by warp shuffle where the device's plane is the 32 lanes ([`plane_reduce`]),
//!   through shared memory elsewhere (lavapipe has no subgroups).
//! - The **small-M** paths of a plain linear over 2+ rows of `x` (batched decode): a cube takes
//!   2, 4 or 8 rows of `x` ([`small_m_rows`]); each weight chunk is decoded once into registers
//!   and multiplied into every row, so the decode work does not grow with the batch. FP8 rows are
//!   quantized once per call by a small elementwise kernel first (quantizing them inside every
//!   cube measured 331 µs for 16 × 2688→10304 on the H200: the prologue repeated per cube).
//! - The **expert-major** path of routed NVFP4 experts from
//!   [`super::grouped::GROUPED_MIN_SLOTS`] slots: slots grouped by expert on the device, one
//!   cube per (row block, expert), each weight chunk decoded once for all of the expert's slots.
//! - The **scalar** GEMVs (any size) give a unit row one output row; lanes stride over its
//!   16-element blocks (or 4-byte words for FP8) and sum through shared memory.

use super::super::buffers::fold_xy;
use cubecl::prelude::*;

/// Lanes per output row (a power of two).
pub const GEMV_LANES: u32 = 32;
/// Unit rows per cube.
pub const GEMV_ROWS: u32 = 8;
/// Units per cube.
pub const GEMV_UNITS: usize = (GEMV_LANES * GEMV_ROWS) as usize;

/// Cubes the vector GEMV aims to have at least (two per SM of an H200 keeps every SM streaming);
/// fewer rows per unit row are taken until the grid reaches it.
const TARGET_CUBES: usize = 264;

pub fn gemv_dim() -> CubeDim {
    CubeDim::new_2d(GEMV_LANES, GEMV_ROWS)
}

/// Cubes for `n` output rows of `slots` output slots, `rows` per unit row: cube `c` (numbered
/// `x + y · count_x`, [`fold_xy`]) takes slot `c % slots` of row block `c / slots`.
/// Consecutive cubes are the slots of one row block, so a weight block is fetched from memory
/// once and the other slots (rows of `x`, or routed slots of the same expert) find it in L2.
/// Folded, the grid fits every runtime's limits whatever the slots (a 70,000-row prompt on
/// wgpu, whose x stops at 65,535); cubes past the last block compute rows past `n` and write
/// nothing.
pub fn gemv_count(n: usize, slots: usize, rows: usize) -> CubeCount {
    let per_cube = GEMV_ROWS as usize * rows;
    let (x, y) = fold_xy(slots.max(1) * n.div_ceil(per_cube));
    CubeCount::Static(x, y, 1)
}

/// Output rows per unit row of the vector GEMV: 2 (each activation chunk reused twice) unless
/// that leaves fewer than `TARGET_CUBES` cubes, then 1. `NEMOTRON_GEMV_ROWS=1|2|4` in the
/// environment forces one value (a tuning knob for `bench --kernels`; read once). Four rows per
/// unit row measured slower than two once the loads were grouped (registers: 79 per unit, 3 cubes
/// per SM).
pub fn rows_per_unit_row(n: usize, slots: usize) -> usize {
    if let Some(r) = crate::cube::tuning::gemv_rows() {
        return r;
    }
    if n.div_ceil(GEMV_ROWS as usize * 2) * slots >= TARGET_CUBES {
        2
    } else {
        1
    }
}

/// Chunks per row a lane loads before it computes (the vector GEMVs' `group`): its whole share
/// of a row (`⌈chunks / 32⌉`) when `rows × group` stays within `budget` chunks of registers,
/// else as many as fit. Grouping the loads is what turns a lane's `⌈chunks / 32⌉` dependent
/// memory round trips into one: every GEMV here is latency-bound, not bandwidth-bound, without
/// it. `NEMOTRON_GEMV_GROUP=1..8` forces one value (tuning knob, read once).
pub fn gemv_group(chunks: usize, rows: usize, budget: usize) -> usize {
    if let Some(g) = crate::cube::tuning::gemv_group() {
        return g;
    }
    chunks
        .div_ceil(GEMV_LANES as usize)
        .clamp(1, (budget / rows).max(1))
}

/// Rows of `x` per cube of the small-M path: 8, 4 or 2 — the largest not above `slots`.
pub fn small_m_rows(slots: usize) -> usize {
    [8, 4, 2].into_iter().find(|&m| m <= slots).unwrap_or(1)
}

/// Cubes of the small-M path: groups of `mrows` rows of `x`, blocks of [`GEMV_ROWS`] output
/// rows; cube `c` ([`fold_xy`]) takes group `c % groups` of block `c / groups`.
pub fn small_m_count(n: usize, slots: usize, mrows: usize) -> CubeCount {
    let (x, y) = fold_xy(slots.div_ceil(mrows).max(1) * n.div_ceil(GEMV_ROWS as usize));
    CubeCount::Static(x, y, 1)
}

pub use crate::cube::reduce::plane_reduce;
