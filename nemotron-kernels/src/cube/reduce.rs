//! Reductions shared by the kernels.

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
