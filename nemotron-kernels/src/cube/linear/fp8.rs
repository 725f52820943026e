//! Static per-tensor FP8 W8A8 linear (vLLM's ModelOpt FP8 path):
//! `y[s, n] = epi((is[e] · ws[e]) · Σ_k e4m3(clamp(x[r(s), k] / is[e], ±448)) · W8_e[n, k])`, with
//! `(e, r(s))` as in [`super::nvfp4`]. Grid: [`super::dispatch`] (GEMV, lanes over 4-byte words).
//! Weights are E4M3 bytes as u32 words (`[E · N, K/4]`).

use super::dispatch::{gemv_count, gemv_dim, GEMV_UNITS};
use super::{e4m3, e4m3_round, epilogue, Call};
use crate::cube::buffers::{arg, f32_buf, with_float};
use crate::cube::reduce::row_sum;
use crate::{Epilogue, Fp8Weights, Rows};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

/// `Σ e4m3(clamp(x / is, ±448)) · W8[row, k]` over this lane's words (`w ≡ UNIT_POS_X mod
/// CUBE_DIM_X`).
#[cube]
fn fp8_partial<F: Float>(
    x: &[F],
    weight: &[u32],
    row: usize,
    xrow: usize,
    k: usize,
    input_scale: f32,
) -> f32 {
    let nw = k / 4;
    let mut acc = 0.0f32;
    let mut w = UNIT_POS_X as usize;
    while w < nw {
        let word = weight[row * nw + w];
        for j in 0..4usize {
            let byte = (word >> ((j * 8) as u32)) & 255u32;
            let xv =
                (f32::cast_from(x[xrow * k + w * 4 + j]) / input_scale).clamp(-448.0f32, 448.0f32);
            acc += e4m3_round(xv) * e4m3(byte);
        }
        w += CUBE_DIM_X as usize;
    }
    acc
}

#[cube(launch)]
pub fn fp8_linear_kernel<F: Float>(
    x: &[F],
    experts: &[i32],
    weight: &[u32],
    input_scales: &[f32],
    weight_scales: &[f32],
    y: &mut [F],
    k: u32,
    n_out: u32,
    slots: u32,
    div: u32,
    #[comptime] units: usize,
    #[comptime] routed: bool,
    #[comptime] relu2: bool,
) {
    let slot = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    if slot >= slots as usize {
        terminate!();
    }
    let n = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
    let n_out = n_out as usize;
    let mut e = 0usize;
    let mut xrow = slot;
    if routed {
        e = experts[slot] as usize;
        xrow = slot / div as usize;
    }
    let input_scale = input_scales[e];
    let mut acc = 0.0f32;
    if n < n_out {
        acc = fp8_partial(x, weight, e * n_out + n, xrow, k as usize, input_scale);
    }
    let total = row_sum(acc, units);
    if UNIT_POS_X == 0 && n < n_out {
        y[slot * n_out + n] =
            F::cast_from(epilogue(total * (input_scale * weight_scales[e]), relu2));
    }
}

/// Launches [`fp8_linear_kernel()`] for `x [R, in]`.
pub fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    w: Fp8Weights<CubeBackend<R>>,
    rows: Rows<CubeBackend<R>>,
    epi: Epilogue,
) -> CubeTensor<R> {
    let s = w.shape;
    let c = Call::new(x, rows, s.out_features, epi);
    let (is, ws) = (f32_buf(w.input_scales), f32_buf(w.weight_scales));
    macro_rules! go {
        ($t:ty) => {
            fp8_linear_kernel::launch::<$t, R>(
                &c.x.client,
                gemv_count(c.n, c.slots),
                gemv_dim(),
                arg(&c.x),
                c.experts_arg(),
                arg(&w.weight),
                arg(&is),
                arg(&ws),
                arg(&c.y),
                c.k as u32,
                c.n as u32,
                c.slots as u32,
                c.div as u32,
                GEMV_UNITS,
                c.routed,
                c.relu2,
            )
        };
    }
    with_float!(c.dtype, go);
    c.y
}
