//! Launch geometry of the linear kernels, and (with the prefill issue) the size thresholds that
//! pick between GEMV and tiled GEMM.
//!
//! GEMV (every size today): a cube holds [`GEMV_ROWS`] output rows of one output slot, a row per
//! unit row; the [`GEMV_LANES`] lanes of a unit row stride over the row's 16-element blocks (or
//! 4-byte words for FP8), so weight reads are coalesced, and sum through shared memory.

use super::super::buffers::yz;
use cubecl::prelude::*;

/// Lanes per output row (a power of two).
pub const GEMV_LANES: u32 = 32;
/// Output rows per cube.
pub const GEMV_ROWS: u32 = 8;
/// Units per cube.
pub const GEMV_UNITS: usize = (GEMV_LANES * GEMV_ROWS) as usize;

pub fn gemv_dim() -> CubeDim {
    CubeDim::new_2d(GEMV_LANES, GEMV_ROWS)
}

/// Cubes for `n` output rows of `slots` output slots (slots along y, spilling onto z).
pub fn gemv_count(n: usize, slots: usize) -> CubeCount {
    let (y, z) = yz(slots);
    CubeCount::Static(n.div_ceil(GEMV_ROWS as usize) as u32, y, z)
}
