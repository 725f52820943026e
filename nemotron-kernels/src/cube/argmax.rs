//! Greedy pick: each row's arg-max over the vocabulary (`[B, V]` → `[B]` I32, the lowest index on
//! ties, NaN never wins). Grid: one cube per row (rows folded over x and y, `fold`), up to
//! 1,024 units; each unit keeps the best of
//! its strided share (four loads in flight per step), then a tree arg-max through shared memory.
//! Burn's `argmax` without its autotune walks a row with a single unit — milliseconds for a
//! 131,072-entry row on the H200, which is why decode has its own.

use super::buffers::{arg, empty, float_buf, fold, with_float};
use super::reduce::{argmax_tree, better};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

#[cube(launch)]
pub fn argmax_rows_kernel<F: Float>(
    x: &[F],
    out: &mut [i32],
    rows: u32,
    cols: u32,
    #[comptime] units: usize,
) {
    let row = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    // Uniform over the cube: the folded grid's last cubes past the rows leave.
    if row >= rows as usize {
        terminate!();
    }
    let u = UNIT_POS as usize;
    let cols = cols as usize;
    let none = cols as u32 + 1u32;
    let base = row * cols;
    let mut bv = 0.0f32;
    let mut bi = none;
    let mut c = u;
    // Ascending within a unit, so a later equal value never displaces an earlier one; four
    // independent loads per step while they last.
    while c + 3 * units < cols {
        let v0 = f32::cast_from(x[base + c]);
        let v1 = f32::cast_from(x[base + c + units]);
        let v2 = f32::cast_from(x[base + c + 2 * units]);
        let v3 = f32::cast_from(x[base + c + 3 * units]);
        if better(v0, c as u32, bv, bi, none) {
            bv = v0;
            bi = c as u32;
        }
        if better(v1, (c + units) as u32, bv, bi, none) {
            bv = v1;
            bi = (c + units) as u32;
        }
        if better(v2, (c + 2 * units) as u32, bv, bi, none) {
            bv = v2;
            bi = (c + 2 * units) as u32;
        }
        if better(v3, (c + 3 * units) as u32, bv, bi, none) {
            bv = v3;
            bi = (c + 3 * units) as u32;
        }
        c += 4 * units;
    }
    while c < cols {
        let v = f32::cast_from(x[base + c]);
        if better(v, c as u32, bv, bi, none) {
            bv = v;
            bi = c as u32;
        }
        c += units;
    }
    let mut val = Shared::<[f32]>::new_slice(units);
    let mut ix = Shared::<[u32]>::new_slice(units);
    val[u] = bv;
    ix[u] = bi;
    sync_cube();
    argmax_tree(&mut val, &mut ix, none);
    if u == 0 {
        // A row of NaN only: index 0, as the reference says.
        let b = ix[0];
        out[row] = if b == none { 0i32 } else { b as i32 };
    }
}

pub fn launch<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    let x = float_buf(x);
    let shape = x.meta.shape().clone();
    let (rows, cols) = (shape[0], shape[1]);
    let out = empty(&x, [rows], DType::I32);
    if rows == 0 {
        return out;
    }
    let max = x.client.properties().hardware.max_units_per_cube as usize;
    // A power of two (the tree halves it), at most 1,024 and what the device allows.
    let units = 1usize << (max.clamp(32, 1024).ilog2());
    macro_rules! go {
        ($t:ty) => {
            argmax_rows_kernel::launch::<$t, R>(
                &x.client,
                fold(rows),
                CubeDim::new_1d(units as u32),
                arg(&x),
                arg(&out),
                rows as u32,
                cols as u32,
                units,
            )
        };
    }
    with_float!(x.dtype, go);
    out
}
