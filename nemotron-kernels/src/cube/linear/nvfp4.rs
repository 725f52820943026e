//! NVFP4 weight-only linear (W4A16):
//! `y[s, n] = epi(gs[e] · Σ_b s_e[n, b] · Σ_j E2M1[code_e(n, 16b + j)] · x[r(s), 16b + j])`,
//! with `(e, r(s)) = (0, s)` for a plain linear and `(experts[s], s / div)` for routed experts.
//! Grid: [`super::dispatch`] (GEMV). Codes are u32 words of 8 nibbles, the low nibble first
//! (`[E · N, K/8]`); block scales E4M3 bytes back to back (`E · N · K/16`, read as words);
//! activations in their storage type `F`, accumulated in f32.

use super::dispatch::{gemv_count, gemv_dim, GEMV_UNITS};
use super::{byte_at, e2m1, e4m3, epilogue, Call};
use crate::cube::buffers::{arg, with_float};
use crate::cube::reduce::row_sum;
use crate::{Epilogue, Nvfp4Weights, Rows};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

/// `Σ_b s[row, b] · Σ_j E2M1[code(row, 16b + j)] · x[xrow, 16b + j]` over this lane's blocks
/// (`b ≡ UNIT_POS_X mod CUBE_DIM_X`).
#[cube]
fn nvfp4_partial<F: Float>(
    x: &[F],
    packed: &[u32],
    scales: &[u32],
    row: usize,
    xrow: usize,
    k: usize,
) -> f32 {
    let nb = k / 16;
    let mut acc = 0.0f32;
    let mut b = UNIT_POS_X as usize;
    while b < nb {
        let s = e4m3(byte_at(scales, row * nb + b));
        let wbase = row * (k / 8) + b * 2;
        let xbase = xrow * k + b * 16;
        let mut part = 0.0f32;
        for w in 0..2usize {
            let word = packed[wbase + w];
            for j in 0..8usize {
                let code = (word >> ((j * 4) as u32)) & 15u32;
                part += e2m1(code) * f32::cast_from(x[xbase + w * 8 + j]);
            }
        }
        acc += part * s;
        b += CUBE_DIM_X as usize;
    }
    acc
}

#[cube(launch)]
pub fn nvfp4_linear_kernel<F: Float>(
    x: &[F],
    experts: &[i32],
    packed: &[u32],
    scales: &[u32],
    globals: &[f32],
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
    let mut acc = 0.0f32;
    if n < n_out {
        acc = nvfp4_partial(x, packed, scales, e * n_out + n, xrow, k as usize);
    }
    let total = row_sum(acc, units);
    if UNIT_POS_X == 0 && n < n_out {
        y[slot * n_out + n] = F::cast_from(epilogue(total * globals[e], relu2));
    }
}

/// Launches [`nvfp4_linear_kernel()`] for `x [R, in]`.
pub fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    w: Nvfp4Weights<CubeBackend<R>>,
    rows: Rows<CubeBackend<R>>,
    epi: Epilogue,
) -> CubeTensor<R> {
    let s = w.shape;
    let c = Call::new(x, rows, s.out_features, epi);
    macro_rules! go {
        ($t:ty) => {
            nvfp4_linear_kernel::launch::<$t, R>(
                &c.x.client,
                gemv_count(c.n, c.slots),
                gemv_dim(),
                arg(&c.x),
                c.experts_arg(),
                arg(&w.packed),
                arg(&w.scales),
                arg(&w.globals),
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
