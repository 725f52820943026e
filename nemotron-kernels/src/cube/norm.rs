//! Group RMSNorm, optionally gated (Mamba2's output norm: gate before the norm), statistics in
//! f32: `y = w · u · rsqrt(mean_group(u²) + eps)` with `u = x · silu(gate)` or `u = x`.
//! Also the residual add fused with the next block's (ungrouped, ungated) norm.
//! Grid: one cube of [`NORM_UNITS`] per `(row, group)`; the units stride over the group's
//! channels, reduce `Σ u²` (`reduce::block_sum`: warp shuffles then one shared step on CUDA, a shared
//! tree elsewhere), then write. Reads and writes the activation storage type `F`.

use super::buffers::{arg, contiguous_as, empty, float_buf, with_float};
use super::reduce::{block_sum, plane_reduce};
use crate::Maybe;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

/// Units per cube (a power of two).
pub const NORM_UNITS: u32 = 256;

#[cube(launch)]
pub fn rms_norm_kernel<F: Float>(
    x: &[F],
    gate: &[F],
    weight: &[F],
    y: &mut [F],
    h: u32,
    group: u32,
    eps: f32,
    #[comptime] gated: bool,
    #[comptime] units: usize,
    #[comptime] plane: bool,
) {
    let (h, group) = (h as usize, group as usize);
    let base = CUBE_POS_X as usize * h + CUBE_POS_Y as usize * group;
    let wbase = CUBE_POS_Y as usize * group;
    let mut ss = 0.0f32;
    let mut c = UNIT_POS_X as usize;
    while c < group {
        let mut u = f32::cast_from(x[base + c]);
        if gated {
            let z = f32::cast_from(gate[base + c]);
            u *= z / (1.0f32 + (-z).exp());
        }
        ss += u * u;
        c += CUBE_DIM_X as usize;
    }
    let total = block_sum(ss, units, plane);
    let inv = 1.0f32 / (total / group as f32 + eps).sqrt();
    let mut c = UNIT_POS_X as usize;
    while c < group {
        let mut u = f32::cast_from(x[base + c]);
        if gated {
            let z = f32::cast_from(gate[base + c]);
            u *= z / (1.0f32 + (-z).exp());
        }
        y[base + c] = F::cast_from(u * inv * f32::cast_from(weight[wbase + c]));
        c += CUBE_DIM_X as usize;
    }
}

pub fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    gate: Maybe<CubeBackend<R>>,
    weight: CubeTensor<R>,
    groups: usize,
    eps: f64,
) -> CubeTensor<R> {
    let x = float_buf(x);
    let dtype = x.dtype;
    let shape = x.meta.shape().clone();
    let (r, h) = (shape[0], shape[1]);
    let w = contiguous_as(weight, dtype);
    let g = gate.into_option().map(|g| contiguous_as(g, dtype));
    let y = empty(&x, [r, h], dtype);
    let gated = g.is_some();
    let gate_arg = g.as_ref().unwrap_or(&x);
    macro_rules! go {
        ($t:ty) => {
            rms_norm_kernel::launch::<$t, R>(
                &x.client,
                CubeCount::Static(r as u32, groups as u32, 1),
                CubeDim::new_1d(NORM_UNITS),
                arg(&x),
                arg(gate_arg),
                arg(&w),
                arg(&y),
                h as u32,
                (h / groups) as u32,
                eps as f32,
                gated,
                NORM_UNITS as usize,
                plane_reduce(&x.client, 32),
            )
        };
    }
    with_float!(dtype, go);
    y
}

#[cube(launch)]
pub fn add_rms_norm_kernel<F: Float>(
    x: &[F],
    y: &[F],
    weight: &[F],
    sum: &mut [F],
    out: &mut [F],
    h: u32,
    eps: f32,
    #[comptime] units: usize,
    #[comptime] plane: bool,
) {
    let h = h as usize;
    let base = CUBE_POS_X as usize * h;
    let mut ss = 0.0f32;
    let mut c = UNIT_POS_X as usize;
    while c < h {
        // Rounded to `F` first, exactly as a separate add would store it.
        let s = F::cast_from(f32::cast_from(x[base + c]) + f32::cast_from(y[base + c]));
        sum[base + c] = s;
        let v = f32::cast_from(s);
        ss += v * v;
        c += CUBE_DIM_X as usize;
    }
    let total = block_sum(ss, units, plane);
    let inv = 1.0f32 / (total / h as f32 + eps).sqrt();
    // Each unit reads back only what it wrote.
    let mut c = UNIT_POS_X as usize;
    while c < h {
        let v = f32::cast_from(sum[base + c]);
        out[base + c] = F::cast_from(v * inv * f32::cast_from(weight[c]));
        c += CUBE_DIM_X as usize;
    }
}

pub fn add_launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    y: CubeTensor<R>,
    weight: CubeTensor<R>,
    eps: f64,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let x = float_buf(x);
    let dtype = x.dtype;
    let y = contiguous_as(y, dtype);
    let w = contiguous_as(weight, dtype);
    let shape = x.meta.shape().clone();
    let (r, h) = (shape[0], shape[1]);
    let sum = empty(&x, [r, h], dtype);
    let out = empty(&x, [r, h], dtype);
    macro_rules! go {
        ($t:ty) => {
            add_rms_norm_kernel::launch::<$t, R>(
                &x.client,
                CubeCount::Static(r as u32, 1, 1),
                CubeDim::new_1d(NORM_UNITS),
                arg(&x),
                arg(&y),
                arg(&w),
                arg(&sum),
                arg(&out),
                h as u32,
                eps as f32,
                NORM_UNITS as usize,
                plane_reduce(&x.client, 32),
            )
        };
    }
    with_float!(dtype, go);
    (sum, out)
}
