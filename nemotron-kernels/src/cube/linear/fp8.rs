//! Static per-tensor FP8 W8A8 linear (vLLM's ModelOpt FP8 path):
//! `y[s, n] = epi((is[e] · ws[e]) · Σ_k e4m3(clamp(x[r(s), k] / is[e], ±448)) · W8_e[n, k])`, with
//! `(e, r(s))` as in [`super::nvfp4`]. Grid: [`super::dispatch`] (vector GEMV when `K % 16 == 0`
//! and the quantized activation row fits in shared memory, scalar otherwise). Weights are E4M3
//! bytes as u32 words (`[E · N, K/4]`, read 4 words = 16 bytes at a time by the vector kernel).

use super::dispatch::{
    gemv_count, gemv_dim, gemv_group, plane_reduce, rows_per_unit_row, small_m_count, small_m_rows,
    GEMV_LANES, GEMV_UNITS,
};
use super::launcher::Weights;
use super::plan::{Format, LinearPath};
use super::{e4m3, e4m3_round, e4m3_scaled, e4m3x4, epilogue, hw_decode, lane_sum, store3, Call};
use crate::cube::buffers::{arg, elemwise, empty, f32_buf, with_float};
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
    // Cubes numbered x + y · count_x, slots fastest ([`super::dispatch::gemv_count`]).
    let cube = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    let slot = cube % slots as usize;
    let n = ((cube / slots as usize) as u32 * CUBE_DIM_Y + UNIT_POS_Y) as usize;
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
const MAX_SHARED_K: usize = super::plan::FP8_GEMV_MAX_K;

/// Weight chunks a lane of the vector GEMV holds at once (`rows × group`, 16 bytes each; the
/// activations are read from shared memory as they are used).
const FP8_CHUNK_BUDGET: usize = 8;

/// The vector GEMV (see [`crate::cube::linear::dispatch`]): the cube quantizes its activation
/// row once into shared memory; a lane takes the 16-byte chunks (16 weights) `l, l + 32, …` of
/// each of its `rows` rows, `group` chunks per step, all of a step's loads issued before any is
/// used (branch-free, clamped; see [`crate::cube::linear::nvfp4::nvfp4_gemv_kernel()`]).
#[cube(launch_unchecked)]
pub fn fp8_gemv_kernel<F: Float, NW: Size>(
    x: &[F],
    experts: &[i32],
    weight: &[Vector<u32, NW>],
    input_scales: &[f32],
    weight_scales: &[f32],
    y: &mut [F],
    y1: &mut [F],
    y2: &mut [F],
    a: u32,
    b: u32,
    n_out: u32,
    slots: u32,
    div: u32,
    #[comptime] k: usize,
    #[comptime] rows: usize,
    #[comptime] group: usize,
    #[comptime] units: usize,
    #[comptime] plane: bool,
    #[comptime] routed: bool,
    #[comptime] relu2: bool,
    #[comptime] hw: bool,
    #[comptime] split: bool,
) {
    // Cubes numbered x + y · count_x, slots fastest ([`super::dispatch::gemv_count`]).
    let cube = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    let slot = cube % slots as usize;
    let n0 = ((cube / slots as usize) as u32 * CUBE_DIM_Y + UNIT_POS_Y) as usize * rows;
    let n_out = n_out as usize;
    let mut e = 0usize;
    let mut xrow = slot;
    if routed {
        e = experts[slot] as usize;
        xrow = slot / div as usize;
    }
    let chunks = k / 16;
    // The first step's weights do not depend on the activations: issue them before the
    // quantization prologue and its barrier.
    let mut words = Array::<u32>::new(group * rows * 4);
    let step = CUBE_DIM_X as usize;
    let mut c0 = UNIT_POS_X as usize;
    fp8_load(
        weight, &mut words, c0, chunks, step, e, n0, n_out, rows, group,
    );
    let input_scale = input_scales[e];
    let mut xq = Shared::<[f32]>::new_slice(k);
    let mut i = UNIT_POS as usize;
    while i < k {
        let v = (f32::cast_from(x[xrow * k + i]) / input_scale).clamp(-448.0f32, 448.0f32);
        xq[i] = e4m3_round(v);
        i += CUBE_DIM as usize;
    }
    sync_cube();
    let mut acc = Array::<f32>::new(rows);
    #[unroll]
    for r in 0..rows {
        acc[r] = 0.0f32;
    }
    while c0 < chunks {
        #[unroll]
        for g in 0..group {
            let c = c0 + g * step;
            let valid = c < chunks;
            let xb = c.min(chunks - 1) * 16;
            #[unroll]
            for r in 0..rows {
                let i = (g * rows + r) * 4;
                let mut p = 0.0f32;
                #[unroll]
                for w in 0..4usize {
                    let word = words[i + w];
                    if hw {
                        let v = e4m3x4(word);
                        p += v.extract(0) * xq[xb + w * 4];
                        p += v.extract(1) * xq[xb + w * 4 + 1];
                        p += v.extract(2) * xq[xb + w * 4 + 2];
                        p += v.extract(3) * xq[xb + w * 4 + 3];
                    } else {
                        p += e4m3_scaled(word, 0u32) * xq[xb + w * 4];
                        p += e4m3_scaled(word, 1u32) * xq[xb + w * 4 + 1];
                        p += e4m3_scaled(word, 2u32) * xq[xb + w * 4 + 2];
                        p += e4m3_scaled(word, 3u32) * xq[xb + w * 4 + 3];
                    }
                }
                acc[r] += if valid { p } else { 0.0f32 };
            }
        }
        c0 += group * step;
        if c0 < chunks {
            fp8_load(
                weight, &mut words, c0, chunks, step, e, n0, n_out, rows, group,
            );
        }
    }
    // The weights were read as value · 2^-8 (bits) or as their value (hardware conversion).
    let scale = input_scale * weight_scales[e] * if hw { 1.0f32 } else { 256.0f32 };
    #[unroll]
    for r in 0..rows {
        let total = lane_sum(acc[r], units, plane);
        let n = n0 + r;
        if UNIT_POS_X == 0 && n < n_out {
            let v = F::cast_from(epilogue(total * scale, relu2));
            store3(y, y1, y2, slot, n, n_out, a as usize, b as usize, v, split);
        }
    }
}

/// One step's weight loads: chunk `c0 + g · step` (clamped to the last) of each of the unit
/// row's rows (clamped to the last row) into `words`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn fp8_load<NW: Size>(
    weight: &[Vector<u32, NW>],
    words: &mut Array<u32>,
    c0: usize,
    chunks: usize,
    step: usize,
    e: usize,
    n0: usize,
    n_out: usize,
    #[comptime] rows: usize,
    #[comptime] group: usize,
) {
    #[unroll]
    for g in 0..group {
        let c = (c0 + g * step).min(chunks - 1);
        #[unroll]
        for r in 0..rows {
            let wv = weight[(e * n_out + (n0 + r).min(n_out - 1)) * chunks + c];
            let i = (g * rows + r) * 4;
            words[i] = wv.extract(0);
            words[i + 1] = wv.extract(1);
            words[i + 2] = wv.extract(2);
            words[i + 3] = wv.extract(3);
        }
    }
}

/// `xq = e4m3(clamp(x / is, ±448))` elementwise, stored in the activation type `F` (exact: every
/// E4M3 value is a bf16, f16 and f32 value), for [`fp8_small_m_kernel()`].
#[cube(launch)]
pub fn fp8_quantize_kernel<F: Float>(x: &[F], input_scales: &[f32], xq: &mut [F], len: u32) {
    let i = ABSOLUTE_POS as usize;
    if i < len as usize {
        let v = (f32::cast_from(x[i]) / input_scales[0]).clamp(-448.0f32, 448.0f32);
        xq[i] = F::cast_from(e4m3_round(v));
    }
}

/// The small-M path of a plain FP8 linear (2 to 8 rows of `x` per cube, `mrows`): the rows come
/// quantized ([`fp8_quantize_kernel()`], once per call, stored in the activation type: every
/// E4M3 value is exact there), each 16-byte weight chunk is decoded once into registers and used
/// for every row. One output row per unit row; cubes along x cover `mrows` rows each.
/// Measured on the H200 for 16 × 2688→10304: quantizing inside every cube 331 µs (the prologue
/// repeated per cube); this form 122 µs; with the rows quantized to f32 and a lane's chunks loaded
/// in groups, 256 µs (twice the activation bytes through L1 per weight chunk) — so not that.
#[cube(launch_unchecked)]
pub fn fp8_small_m_kernel<F: Float, NX: Size, NW: Size>(
    xq: &[Vector<F, NX>],
    weight: &[Vector<u32, NW>],
    input_scales: &[f32],
    weight_scales: &[f32],
    y: &mut [F],
    y1: &mut [F],
    y2: &mut [F],
    a: u32,
    b: u32,
    k: u32,
    n_out: u32,
    slots: u32,
    #[comptime] mrows: usize,
    #[comptime] units: usize,
    #[comptime] plane: bool,
    #[comptime] relu2: bool,
    #[comptime] hw: bool,
    #[comptime] split: bool,
) {
    let slots = slots as usize;
    // Cubes numbered x + y · count_x, row groups fastest ([`super::dispatch::small_m_count`]).
    let cube = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    let groups = slots.div_ceil(mrows);
    let m0 = (cube % groups) * mrows;
    let n = ((cube / groups) as u32 * CUBE_DIM_Y + UNIT_POS_Y) as usize;
    let (n_out, k) = (n_out as usize, k as usize);
    // Rows past the end compute on the last row and are never written.
    let row = n.min(n_out - 1);
    let chunks = k / 16;
    let mut acc = Array::<f32>::new(mrows);
    #[unroll]
    for m in 0..mrows {
        acc[m] = 0.0f32;
    }
    let mut wd = Array::<f32>::new(16usize);
    let mut c = UNIT_POS_X as usize;
    while c < chunks {
        let wv = weight[row * chunks + c];
        #[unroll]
        for w in 0..4usize {
            let word = wv.extract(w);
            if hw {
                let v = e4m3x4(word);
                wd[w * 4] = v.extract(0);
                wd[w * 4 + 1] = v.extract(1);
                wd[w * 4 + 2] = v.extract(2);
                wd[w * 4 + 3] = v.extract(3);
            } else {
                wd[w * 4] = e4m3_scaled(word, 0u32);
                wd[w * 4 + 1] = e4m3_scaled(word, 1u32);
                wd[w * 4 + 2] = e4m3_scaled(word, 2u32);
                wd[w * 4 + 3] = e4m3_scaled(word, 3u32);
            }
        }
        #[unroll]
        for m in 0..mrows {
            let xb = ((m0 + m).min(slots - 1) * k + c * 16) / 4;
            // The vector GEMV's sum order: weight by weight over the chunk.
            let mut p = 0.0f32;
            #[unroll]
            for v in 0..4usize {
                let xv = xq[xb + v];
                p += wd[v * 4] * f32::cast_from(xv.extract(0));
                p += wd[v * 4 + 1] * f32::cast_from(xv.extract(1));
                p += wd[v * 4 + 2] * f32::cast_from(xv.extract(2));
                p += wd[v * 4 + 3] * f32::cast_from(xv.extract(3));
            }
            acc[m] += p;
        }
        c += CUBE_DIM_X as usize;
    }
    // The weights were read as value · 2^-8 (bits) or as their value (hardware conversion).
    let scale = input_scales[0] * weight_scales[0] * if hw { 1.0f32 } else { 256.0f32 };
    #[unroll]
    for m in 0..mrows {
        let total = lane_sum(acc[m], units, plane);
        if UNIT_POS_X == 0 && n < n_out && m0 + m < slots {
            let v = F::cast_from(epilogue(total * scale, relu2));
            store3(
                y,
                y1,
                y2,
                m0 + m,
                n,
                n_out,
                a as usize,
                b as usize,
                v,
                split,
            );
        }
    }
}

/// `x` quantized to E4M3 values in the activation type (exact), one launch
/// ([`fp8_quantize_kernel()`]): the rows the small-M GEMV and the decoded path read.
fn quantize_rows<R: CubeRuntime>(c: &Call<R>, is: &CubeTensor<R>) -> CubeTensor<R> {
    let len = c.slots * c.k;
    let xq = empty(&c.x, [c.slots, c.k], c.dtype);
    let (count, dim) = elemwise(len);
    macro_rules! quantize {
        ($t:ty) => {
            fp8_quantize_kernel::launch::<$t, R>(
                &c.x.client,
                count,
                dim,
                arg(&c.x),
                arg(is),
                arg(&xq),
                len as u32,
            )
        };
    }
    with_float!(c.dtype, quantize);
    xq
}

/// The decoded path ([`LinearPath::Decoded`]): the rows quantized here, the rest in
/// [`super::decoded::fp8`].
fn decoded<R: CubeRuntime>(c: &Call<R>, w: &Fp8Weights<CubeBackend<R>>) -> Result<(), String> {
    let xq = quantize_rows(c, &f32_buf(w.input_scales.clone()));
    super::decoded::fp8(c, xq, w)
}

/// `launch(rms_norm(x, gate), w)` (Mamba2's gated output norm then `out_proj`): one launch where
/// the tensor-core kernel can compute the norm in its prologue (`super::mma::fp8_gated`, one
/// row); the norm writing E4M3 codes for the tensor-core kernel where many rows take it
/// (`super::mma::fp8_gated_rows`); else the norm kernel and this linear.
pub fn launch_gated<R: CubeRuntime>(
    x: CubeTensor<R>,
    gate: CubeTensor<R>,
    norm_weight: CubeTensor<R>,
    groups: usize,
    eps: f64,
    w: Fp8Weights<CubeBackend<R>>,
) -> CubeTensor<R> {
    let h = x.meta.shape()[1];
    let c = Call::new(x, Rows::Each, w.shape.out_features, Epilogue::None);
    let norm = super::mma::GatedNorm {
        gate: gate.clone(),
        weight: norm_weight.clone(),
        group: h / groups.max(1),
        eps: eps as f32,
    };
    if groups > 0
        && crate::cube::fused()
        && (super::mma::fp8_gated(&c, &w, &norm) || super::mma::fp8_gated_rows(&c, &w, &norm))
    {
        return c.y;
    }
    let u = crate::cube::norm::launch(c.x, Some(gate).into(), norm_weight, groups, eps);
    super::launcher::launch(u, w, Rows::Each, Epilogue::None)
}

/// FP8 at each tier of [`super::launcher`]: the decoded path; [`super::mma`]'s tensor-core
/// launch (its tiled and GEMM forms included); the small-M, vector or scalar GEMV.
impl<R: CubeRuntime> Weights<R> for Fp8Weights<CubeBackend<R>> {
    const FORMAT: Format = Format::Fp8;
    fn experts(&self) -> usize {
        self.shape.experts
    }
    fn out_features(&self) -> usize {
        self.shape.out_features
    }
    /// The vector and small-M kernels write the parts; the scalar one (`k % 16 != 0`) and rows
    /// past the vector GEMV's shared row do not.
    fn splits(&self, k: usize) -> bool {
        k % 16 == 0 && k <= MAX_SHARED_K
    }
    fn decoded(&self, c: &Call<R>) -> Result<(), String> {
        decoded(c, self)
    }
    fn tensor_cores(&self, c: &Call<R>, path: LinearPath) -> bool {
        super::mma::fp8(c, self, path);
        true
    }
    fn gemv(&self, c: &Call<R>, path: LinearPath) {
        gemv(c, self, path)
    }
}

/// The small-M, vector or scalar GEMV for `c`.
fn gemv<R: CubeRuntime>(c: &Call<R>, w: &Fp8Weights<CubeBackend<R>>, path: LinearPath) {
    let (sa, sb) = c.split_args();
    let (is, ws) = (
        f32_buf(w.input_scales.clone()),
        f32_buf(w.weight_scales.clone()),
    );
    let hw = hw_decode(&c.x.client);
    if path == LinearPath::SmallM {
        let xq = quantize_rows(c, &is);
        let mrows = small_m_rows(c.slots);
        let plane = plane_reduce(&c.x.client, GEMV_LANES);
        macro_rules! small {
            ($t:ty) => {{
                // Safety: `k % 16 == 0` makes the rows and weight chunks whole vectors; rows of
                // `x` past `slots` and output rows past `n_out` are clamped and never written.
                unsafe {
                    fp8_small_m_kernel::launch_unchecked::<$t, R>(
                        &c.x.client,
                        small_m_count(c.n, c.slots, mrows),
                        gemv_dim(),
                        4,
                        4,
                        arg(&xq),
                        arg(&w.weight),
                        arg(&is),
                        arg(&ws),
                        arg(&c.y),
                        arg(&c.y1),
                        arg(&c.y2),
                        sa,
                        sb,
                        c.k as u32,
                        c.n as u32,
                        c.slots as u32,
                        mrows,
                        GEMV_UNITS,
                        plane,
                        c.relu2,
                        hw,
                        c.split.is_some(),
                    )
                }
            }};
        }
        with_float!(c.dtype, small);
        return;
    }
    if path == LinearPath::Gemv {
        let r = rows_per_unit_row(c.n, c.slots);
        let group = gemv_group(c.k / 16, r, FP8_CHUNK_BUDGET);
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
                        arg(&c.y1),
                        arg(&c.y2),
                        sa,
                        sb,
                        c.n as u32,
                        c.slots as u32,
                        c.div as u32,
                        c.k,
                        r,
                        group,
                        GEMV_UNITS,
                        plane,
                        c.routed,
                        c.relu2,
                        hw,
                        c.split.is_some(),
                    )
                }
            };
        }
        with_float!(c.dtype, vector);
        return;
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
}
