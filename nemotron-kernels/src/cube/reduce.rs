//! Reductions shared by the kernels.

use burn_cubecl::CubeRuntime;
use cubecl::ir::features::Plane;
use cubecl::prelude::*;

/// Sums `value` over the `CUBE_DIM_X` lanes of each unit row (`UNIT_POS_Y`) through shared
/// memory; every unit must call it. `units` = `CUBE_DIM_X · CUBE_DIM_Y` (comptime, for the
/// shared allocation).
#[cube]
pub(crate) fn row_sum(value: f32, #[comptime] units: usize) -> f32 {
    let mut sm = Shared::<[f32]>::new_slice(units);
    let lanes = CUBE_DIM_X as usize;
    let base = UNIT_POS_Y as usize * lanes;
    let x = UNIT_POS_X as usize;
    sm[base + x] = value;
    sync_cube();
    // A runtime stride (a comptime one would be folded at expansion time).
    let mut stride = lanes / 2;
    while stride > 0 {
        if x < stride {
            sm[base + x] = sm[base + x] + sm[base + x + stride];
        }
        sync_cube();
        stride /= 2;
    }
    sm[base]
}

/// `value` summed over the lanes of this unit row: a warp shuffle when the unit row is one plane
/// (`plane`, CUDA), else through shared memory ([`row_sum`]). Every unit must call it.
#[cube]
pub(crate) fn lane_sum(value: f32, #[comptime] units: usize, #[comptime] plane: bool) -> f32 {
    if plane {
        plane_sum(value)
    } else {
        row_sum(value, units)
    }
}

/// Whether `lanes` lanes are exactly one plane (warp) on this device, so a unit row of them can
/// reduce by shuffles: CUDA (plane 32), not lavapipe (no plane ops).
pub fn plane_reduce<R: CubeRuntime>(client: &ComputeClient<R>, lanes: u32) -> bool {
    let p = client.properties();
    client.features().plane.contains(Plane::Ops)
        && p.hardware.plane_size_min == lanes
        && p.hardware.plane_size_max == lanes
}

/// `value` summed over every unit of a 1-D cube of `units` units (a multiple of 32 when `plane`):
/// warp shuffles, then the warps' partial sums through shared memory (`plane`, CUDA), else a
/// shared-memory tree ([`row_sum`]). Every unit must call it; every unit gets the total.
#[cube]
pub(crate) fn block_sum(value: f32, #[comptime] units: usize, #[comptime] plane: bool) -> f32 {
    if plane {
        let s = plane_sum(value);
        let mut sm = Shared::<[f32]>::new_slice(units / 32);
        let u = UNIT_POS as usize;
        if u % 32 == 0 {
            sm[u / 32] = s;
        }
        sync_cube();
        let mut t = 0.0f32;
        for i in 0..units / 32 {
            t += sm[i];
        }
        t
    } else {
        row_sum(value, units)
    }
}

/// `(v, i)` beats `(bv, bi)`: larger, or equal and lower (NaN and the empty candidate `i ==
/// none` never beat; anything beats a NaN or the empty candidate `bi == none`). The empty
/// candidate carries the value 0 it was initialized with: before it was excluded by its index,
/// a unit with nothing to offer (a row narrower than the cube, or a router unit whose experts
/// were all taken) beat every negative value, and an all-negative row of 3 columns took index 0.
#[cube]
pub(crate) fn better(v: f32, i: u32, bv: f32, bi: u32, none: u32) -> bool {
    let valid = !v.is_nan() && i != none;
    let empty = bi == none || bv.is_nan();
    valid && (empty || v > bv || (v == bv && i < bi))
}

/// Tree arg-max over the cube's candidates `(val[u], ix[u])` (one per unit, a power-of-two
/// cube; `none` = no candidate) by [`better`]: the larger value, the lower index on ties, so the
/// result equals a serial first-maximum scan. Leaves the winner in slot 0; every unit must call it.
#[cube]
pub(crate) fn argmax_tree(val: &mut Shared<[f32]>, ix: &mut Shared<[u32]>, none: u32) {
    let u = UNIT_POS as usize;
    // A runtime stride (a comptime one cannot be updated).
    let mut stride = CUBE_DIM as usize / 2;
    while stride > 0 {
        if u < stride {
            let (ov, oi) = (val[u + stride], ix[u + stride]);
            if better(ov, oi, val[u], ix[u], none) {
                val[u] = ov;
                ix[u] = oi;
            }
        }
        sync_cube();
        stride /= 2;
    }
}
