//! Group RMSNorm, optionally gated (Mamba2's output norm: gate before the norm), statistics in
//! f32: `y = w · u · rsqrt(mean_group(u²) + eps)` with `u = x · silu(gate)` or `u = x`.
//! Also the residual add fused with the next block's (ungrouped, ungated) norm, its row held in
//! registers ([`add_rms_norm_kernel()`]).
//! Grid: one cube of [`NORM_UNITS`] per `(row, group)`, rows on x folded onto z past 65,535
//! ([`fold_xy`]: a prompt of 70,000 tokens is 70,000 rows; wgpu allows 65,535 cubes on x); the
//! units stride over the group's
//! channels, reduce `Σ u²` (`reduce::block_sum`: warp shuffles then one shared step on CUDA, a shared
//! tree elsewhere), then write. Reads and writes the activation storage type `F`.

use super::buffers::{arg, contiguous_as, empty, float_buf, fold, fold_xy, with_float};
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
    rows: u32,
    h: u32,
    group: u32,
    eps: f32,
    #[comptime] gated: bool,
    #[comptime] units: usize,
    #[comptime] plane: bool,
) {
    let (h, group) = (h as usize, group as usize);
    let row = (CUBE_POS_X + CUBE_POS_Z * CUBE_COUNT_X) as usize;
    // Uniform over the cube: the folded grid's last cubes past the rows leave.
    if row >= rows as usize {
        terminate!();
    }
    let base = row * h + CUBE_POS_Y as usize * group;
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
    let (gx, gz) = fold_xy(r);
    macro_rules! go {
        ($t:ty) => {
            rms_norm_kernel::launch::<$t, R>(
                &x.client,
                CubeCount::Static(gx, groups as u32, gz),
                CubeDim::new_1d(NORM_UNITS),
                arg(&x),
                arg(gate_arg),
                arg(&w),
                arg(&y),
                r as u32,
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

/// `sum = x + y` (rounded to `F`), `out = w · sum · rsqrt(mean(sum²) + eps)` per row. Unit `u`
/// owns elements `u + i · units` for `i < per` (`per = ⌈h / units⌉`, comptime): all of its loads
/// (`x`, `y`, `w`) are issued first and the values stay in registers, so the kernel waits for
/// memory once — with the stores interleaved, each load had waited for the store before it
/// (the buffers may alias as far as the compiler knows): 11 µs for one 2,688-wide row on the H200.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm_kernel<F: Float>(
    x: &[F],
    y: &[F],
    cw: &[f32],
    shared: &[F],
    weight: &[F],
    sum: &mut [F],
    out: &mut [F],
    rows: u32,
    h: u32,
    eps: f32,
    #[comptime] per: usize,
    #[comptime] units: usize,
    #[comptime] plane: bool,
    #[comptime] k: usize,
    #[comptime] has_shared: bool,
) {
    let h = h as usize;
    // Rows over the folded grid ([`fold`]); cubes past them leave (uniform over the cube).
    let row = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    if row >= rows as usize {
        terminate!();
    }
    let base = row * h;
    let u = UNIT_POS_X as usize;
    let mut s = Array::<f32>::new(per);
    let mut w = Array::<f32>::new(per);
    let mut ss = 0.0f32;
    // `k > 0`: `y` holds the MoE's `k` routed outputs per row, combined here as `moe_combine`
    // does (f32 sum rounded to `F`, then `+ shared` rounded again).
    let mut rw = Array::<f32>::new(comptime!(k.max(1)));
    #[unroll]
    for j in 0..k {
        rw[j] = cw[row * k + j];
    }
    #[unroll]
    for i in 0..per {
        let c = (u + i * units).min(h - 1);
        let yv = if k == 0 {
            f32::cast_from(y[base + c])
        } else {
            let mut acc = 0.0f32;
            #[unroll]
            for j in 0..k {
                acc += rw[j] * f32::cast_from(y[(row * k + j) * h + c]);
            }
            let r = f32::cast_from(F::cast_from(acc));
            if has_shared {
                f32::cast_from(F::cast_from(r + f32::cast_from(shared[base + c])))
            } else {
                r
            }
        };
        // Rounded to `F` first, exactly as a separate add would store it.
        let v = f32::cast_from(F::cast_from(f32::cast_from(x[base + c]) + yv));
        s[i] = v;
        w[i] = f32::cast_from(weight[c]);
    }
    #[unroll]
    for i in 0..per {
        let v = s[i];
        ss += if u + i * units < h { v * v } else { 0.0f32 };
    }
    let total = block_sum(ss, units, plane);
    let inv = 1.0f32 / (total / h as f32 + eps).sqrt();
    #[unroll]
    for i in 0..per {
        let c = u + i * units;
        if c < h {
            sum[base + c] = F::cast_from(s[i]);
            out[base + c] = F::cast_from(s[i] * inv * w[i]);
        }
    }
}

/// Widest row [`add_rms_norm_kernel()`] takes (its units hold `⌈h / units⌉` values each in
/// registers; 1,024 units × 32).
pub const ADD_NORM_MAX_H: usize = 32 * 1024;

pub fn add_launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    y: CubeTensor<R>,
    weight: CubeTensor<R>,
    eps: f64,
) -> (CubeTensor<R>, CubeTensor<R>) {
    add_combine_launch(x, y, None, Maybe::None, weight, eps)
}

/// [`add_launch`] with `y` as the MoE's parts: routed outputs `[R·k, H]`, routing weights
/// `cw` `[R, k]` (f32) and the shared expert's output `[R, H]` where there is one.
pub fn add_combine_launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    y: CubeTensor<R>,
    cw: Option<CubeTensor<R>>,
    shared: Maybe<CubeBackend<R>>,
    weight: CubeTensor<R>,
    eps: f64,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let x = float_buf(x);
    let dtype = x.dtype;
    let y = contiguous_as(y, dtype);
    let w = contiguous_as(weight, dtype);
    let cw = cw.map(super::buffers::f32_buf);
    let k = cw.as_ref().map_or(0, |c| c.meta.shape()[1]);
    let shared = shared.into_option().map(|s| contiguous_as(s, dtype));
    let shape = x.meta.shape().clone();
    let (r, h) = (shape[0], shape[1]);
    let sum = empty(&x, [r, h], dtype);
    let out = empty(&x, [r, h], dtype);
    assert!(
        h <= ADD_NORM_MAX_H,
        "add_rms_norm: rows of {h} exceed the kernel's {ADD_NORM_MAX_H}"
    );
    // Enough units that each holds at most 16 values (up to 1,024 units, then up to 32 values);
    // with a combine, at most 4 (each value takes `k + 2` loads: one cube of 256 units measured
    // 9.0 µs for a 2,688-wide row and 6 experts on the H200, the separate combine and add 7.5).
    let most = if k > 0 { 4 } else { 16 };
    let units = h
        .div_ceil(most)
        .next_power_of_two()
        .clamp(NORM_UNITS as usize, 1024);
    let per = h.div_ceil(units);
    // Unread stand-ins where a part is absent.
    let cwa = cw.as_ref().unwrap_or(&x);
    let sh = shared.as_ref().unwrap_or(&x);
    macro_rules! go {
        ($t:ty) => {
            add_rms_norm_kernel::launch::<$t, R>(
                &x.client,
                fold(r),
                CubeDim::new_1d(units as u32),
                arg(&x),
                arg(&y),
                arg(cwa),
                arg(sh),
                arg(&w),
                arg(&sum),
                arg(&out),
                r as u32,
                h as u32,
                eps as f32,
                per,
                units,
                plane_reduce(&x.client, 32),
                k,
                shared.is_some(),
            )
        };
    }
    with_float!(dtype, go);
    (sum, out)
}
