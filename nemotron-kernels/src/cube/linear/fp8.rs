//! Static per-tensor FP8 W8A8 linear (vLLM's ModelOpt FP8 path):
//! `y[s, n] = epi((is[e] · ws[e]) · Σ_k e4m3(clamp(x[r(s), k] / is[e], ±448)) · W8_e[n, k])`, with
//! `(e, r(s))` as in [`super::nvfp4`]. Grid: [`super::dispatch`] (vector GEMV when `K % 16 == 0`
//! and the quantized activation row fits in shared memory, scalar otherwise). Weights are E4M3
//! bytes as u32 words (`[E · N, K/4]`, read 4 words = 16 bytes at a time by the vector kernel).

use super::dispatch::{
    gemv_count, gemv_dim, plane_reduce, rows_per_unit_row, GEMV_LANES, GEMV_UNITS,
};
use super::{e4m3, e4m3_round, e4m3_scaled, epilogue, lane_sum, Call};
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
    let slot = CUBE_POS_X as usize;
    if slot >= slots as usize {
        terminate!();
    }
    let n = ((CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) * CUBE_DIM_Y + UNIT_POS_Y) as usize;
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

/// Activations the vector kernel quantizes into shared memory per cube (f32 each: 48 KiB).
const MAX_SHARED_K: usize = 12_288;

/// One 16-activation chunk `c` of the quantized row against the matching 16-byte chunk of each
/// of the unit row's `rows` rows, into `acc` (weights read as value · 2^-8).
#[cube]
#[allow(clippy::too_many_arguments)]
fn fp8_chunk<NW: Size>(
    xq: &Shared<[f32]>,
    weight: &[Vector<u32, NW>],
    acc: &mut Array<f32>,
    c: usize,
    chunks: usize,
    e: usize,
    n0: usize,
    n_out: usize,
    #[comptime] rows: usize,
) {
    let mut xs = Array::<f32>::new(16usize);
    #[unroll]
    for j in 0..16usize {
        xs[j] = xq[c * 16 + j];
    }
    #[unroll]
    for r in 0..rows {
        let wv = weight[(e * n_out + (n0 + r).min(n_out - 1)) * chunks + c];
        let mut p = 0.0f32;
        #[unroll]
        for w in 0..4usize {
            let word = wv.extract(w);
            p += e4m3_scaled(word, 0u32) * xs[w * 4];
            p += e4m3_scaled(word, 1u32) * xs[w * 4 + 1];
            p += e4m3_scaled(word, 2u32) * xs[w * 4 + 2];
            p += e4m3_scaled(word, 3u32) * xs[w * 4 + 3];
        }
        acc[r] += p;
    }
}

/// The vector GEMV (see [`crate::cube::linear::dispatch`]): the cube quantizes its activation row once into
/// shared memory; a lane dots 16-activation chunks with the matching 16-byte weight chunk of each
/// of its `rows` rows.
#[cube(launch_unchecked)]
pub fn fp8_gemv_kernel<F: Float, NW: Size>(
    x: &[F],
    experts: &[i32],
    weight: &[Vector<u32, NW>],
    input_scales: &[f32],
    weight_scales: &[f32],
    y: &mut [F],
    n_out: u32,
    slots: u32,
    div: u32,
    #[comptime] k: usize,
    #[comptime] rows: usize,
    #[comptime] units: usize,
    #[comptime] plane: bool,
    #[comptime] routed: bool,
    #[comptime] relu2: bool,
) {
    let slot = CUBE_POS_X as usize;
    // Whole cubes leave together, so the barrier below stays uniform.
    if slot >= slots as usize {
        terminate!();
    }
    let n0 = ((CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) * CUBE_DIM_Y + UNIT_POS_Y) as usize * rows;
    let n_out = n_out as usize;
    let mut e = 0usize;
    let mut xrow = slot;
    if routed {
        e = experts[slot] as usize;
        xrow = slot / div as usize;
    }
    let input_scale = input_scales[e];
    let mut xq = Shared::<[f32]>::new_slice(k);
    let mut i = UNIT_POS as usize;
    while i < k {
        let v = (f32::cast_from(x[xrow * k + i]) / input_scale).clamp(-448.0f32, 448.0f32);
        xq[i] = e4m3_round(v);
        i += CUBE_DIM as usize;
    }
    sync_cube();
    let chunks = k / 16;
    let mut acc = Array::<f32>::new(rows);
    #[unroll]
    for r in 0..rows {
        acc[r] = 0.0f32;
    }
    // Two chunks per step: their loads issue together (no branch between them: rows past
    // `n_out` read the last row and are never written).
    let step = CUBE_DIM_X as usize;
    let mut c = UNIT_POS_X as usize;
    while c + step < chunks {
        fp8_chunk(&xq, weight, &mut acc, c, chunks, e, n0, n_out, rows);
        fp8_chunk(&xq, weight, &mut acc, c + step, chunks, e, n0, n_out, rows);
        c += 2 * step;
    }
    if c < chunks {
        fp8_chunk(&xq, weight, &mut acc, c, chunks, e, n0, n_out, rows);
    }
    // The weights were read as value · 2^-8.
    let scale = input_scale * weight_scales[e] * 256.0f32;
    #[unroll]
    for r in 0..rows {
        let total = lane_sum(acc[r], units, plane);
        let n = n0 + r;
        if UNIT_POS_X == 0 && n < n_out {
            y[slot * n_out + n] = F::cast_from(epilogue(total * scale, relu2));
        }
    }
}

/// Launches [`fp8_gemv_kernel()`] (or [`fp8_linear_kernel()`] where it does not apply) for
/// `x [R, in]`.
pub fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    w: Fp8Weights<CubeBackend<R>>,
    rows: Rows<CubeBackend<R>>,
    epi: Epilogue,
) -> CubeTensor<R> {
    let s = w.shape;
    let c = Call::new(x, rows, s.out_features, epi);
    let (is, ws) = (f32_buf(w.input_scales), f32_buf(w.weight_scales));
    if c.k % 16 == 0 && c.k <= MAX_SHARED_K {
        let r = rows_per_unit_row(c.n, c.slots);
        let plane = plane_reduce(&c.x.client, GEMV_LANES);
        macro_rules! vector {
            ($t:ty) => {
                // Safety: `k % 16 == 0` makes every weight row whole 16-byte chunks; rows ≥
                // `n_out` and slots ≥ `slots` are skipped; expert ids come from the routing op.
                unsafe {
                    fp8_gemv_kernel::launch_unchecked::<$t, R>(
                        &c.x.client,
                        gemv_count(c.n, c.slots, r),
                        gemv_dim(),
                        4,
                        arg(&c.x),
                        c.experts_arg(),
                        arg(&w.weight),
                        arg(&is),
                        arg(&ws),
                        arg(&c.y),
                        c.n as u32,
                        c.slots as u32,
                        c.div as u32,
                        c.k,
                        r,
                        GEMV_UNITS,
                        plane,
                        c.routed,
                        c.relu2,
                    )
                }
            };
        }
        with_float!(c.dtype, vector);
        return c.y;
    }
    macro_rules! go {
        ($t:ty) => {
            fp8_linear_kernel::launch::<$t, R>(
                &c.x.client,
                gemv_count(c.n, c.slots, 1),
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
