//! Decode over state slots: the conv and the selective scan for one token per row, each row's
//! state in slot `slots[b]` of a pool, updated in place (a negative slot is a pad row: zeros out,
//! nothing written). Inputs and outputs in the activation storage type `F`, the SSM pool in f32.
//!
//! - conv step: one unit per `(b, c)`: `y = silu(bias + Σ_k<K-1 w[c,k]·S[k] + w[c,K-1]·x)`, then
//!   `S ← (S[1..], x)`.
//! - SSM step: a cube per `(b, h, 8 rows of p)`, [`SSM_LANES`] lanes striding over the state
//!   dimension `n` (coalesced): `dt = softplus(dt_raw + dt_bias)` (floored, rounded to `F` as the
//!   separate op stores it), `S[n] ← exp(dt·A)·S[n] + dt·x·B[n]`, `y = Σ_n S[n]·C[n] + D·x`
//!   (lanes reduced by warp shuffle on CUDA, through shared memory elsewhere); `x`, `B`, `C` are
//!   read in place from the conv step's `[B, H·P + 2·G·N]` output (no slicing copies).

use crate::cube::buffers::{arg, contiguous_as, elemwise, empty, float_buf, i32_buf, with_float};
use crate::cube::reduce::{lane_sum, plane_reduce};
use crate::{Maybe, ScanDims};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

/// Lanes over the state dimension per SSM row, and rows per cube.
pub const SSM_LANES: u32 = 32;
pub const SSM_ROWS: u32 = 8;

#[cube(launch)]
pub fn conv_step_kernel<F: Float>(
    x: &[F],
    w: &[F],
    bias: &[F],
    pool: &mut [F],
    slots: &[i32],
    y: &mut [F],
    rows: u32,
    ch: u32,
    k: u32,
    #[comptime] has_bias: bool,
) {
    let id = ABSOLUTE_POS;
    let (ch, k) = (ch as usize, k as usize);
    if id >= rows as usize * ch {
        terminate!();
    }
    let b = id / ch;
    let c = id % ch;
    let slot = slots[b];
    if slot < 0 {
        y[id] = F::cast_from(0.0f32);
        terminate!();
    }
    let km1 = k - 1;
    let base = (slot as usize * ch + c) * km1;
    let xv = f32::cast_from(x[id]);
    let mut acc = 0.0f32;
    if has_bias {
        acc = f32::cast_from(bias[c]);
    }
    for kk in 0..km1 {
        acc += f32::cast_from(w[c * k + kk]) * f32::cast_from(pool[base + kk]);
    }
    acc += f32::cast_from(w[c * k + km1]) * xv;
    y[id] = F::cast_from(acc / (1.0f32 + (-acc).exp()));
    for kk in 1..km1 {
        pool[base + kk - 1] = pool[base + kk];
    }
    if km1 > 0 {
        pool[base + km1 - 1] = x[id];
    }
}

pub fn conv_launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: Maybe<CubeBackend<R>>,
    pool: CubeTensor<R>,
    slots: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let x = float_buf(x);
    let dtype = x.dtype;
    assert_eq!(
        pool.dtype, dtype,
        "conv_step: the state pool must be in the activation dtype"
    );
    assert!(
        pool.is_contiguous(),
        "conv_step: the state pool must be contiguous"
    );
    let shape = x.meta.shape().clone();
    let (rows, c) = (shape[0], shape[1]);
    let k = weight.meta.shape()[1];
    let w = contiguous_as(weight, dtype);
    let bias = bias.into_option().map(|b| contiguous_as(b, dtype));
    let slots = i32_buf(slots);
    let y = empty(&x, [rows, c], dtype);
    let (count, dim) = elemwise(rows * c);
    macro_rules! go {
        ($t:ty) => {
            conv_step_kernel::launch::<$t, R>(
                &x.client,
                count,
                dim,
                arg(&x),
                arg(&w),
                arg(bias.as_ref().unwrap_or(&w)),
                arg(&pool),
                arg(&slots),
                arg(&y),
                rows as u32,
                c as u32,
                k as u32,
                bias.is_some(),
            )
        };
    }
    with_float!(dtype, go);
    (y, pool)
}

#[cube(launch)]
pub fn ssm_step_kernel<F: Float>(
    xbc: &[F],
    dt: &[F],
    dt_bias: &[F],
    a: &[F],
    d: &[F],
    slots: &[i32],
    pool: &mut [f32],
    y: &mut [F],
    heads: u32,
    head_dim: u32,
    groups: u32,
    n_state: u32,
    dt_floor: f32,
    #[comptime] units: usize,
    #[comptime] plane: bool,
    #[comptime] per: usize,
) {
    let (h, p, g, n) = (
        heads as usize,
        head_dim as usize,
        groups as usize,
        n_state as usize,
    );
    let width = h * p + 2 * g * n;
    let b = CUBE_POS_Z as usize;
    let hh = CUBE_POS_Y as usize;
    let pp = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
    let slot = slots[b];
    let gg = hh / (h / g);
    let mut acc = 0.0f32;
    let mut xv = 0.0f32;
    if slot >= 0 && pp < p {
        // As `dt_softplus` computes and stores it.
        let raw = f32::cast_from(dt[b * h + hh]) + f32::cast_from(dt_bias[hh]);
        let sp = raw.max(0.0f32) + (-raw.abs()).exp().log1p();
        let dtv = f32::cast_from(F::cast_from(sp.max(dt_floor)));
        let decay = (dtv * f32::cast_from(a[hh])).exp();
        xv = f32::cast_from(xbc[b * width + hh * p + pp]);
        let row = ((slot as usize * h + hh) * p + pp) * n;
        let bb = b * width + h * p + gg * n;
        let cb = bb + g * n;
        if per > 0 {
            // `n = per · lanes`: the lane's whole share of the state row, `B` and `C` loaded
            // before any is used, the new state stored after (one memory latency, not `per`).
            let lane = UNIT_POS_X as usize;
            let lanes = CUBE_DIM_X as usize;
            let mut st = Array::<f32>::new(per);
            let mut bv = Array::<f32>::new(per);
            let mut cv = Array::<f32>::new(per);
            #[unroll]
            for i in 0..per {
                let nn = lane + i * lanes;
                st[i] = pool[row + nn];
                bv[i] = f32::cast_from(xbc[bb + nn]);
                cv[i] = f32::cast_from(xbc[cb + nn]);
            }
            #[unroll]
            for i in 0..per {
                let s = decay * st[i] + dtv * xv * bv[i];
                st[i] = s;
                acc += s * cv[i];
            }
            #[unroll]
            for i in 0..per {
                pool[row + lane + i * lanes] = st[i];
            }
        } else {
            let mut nn = UNIT_POS_X as usize;
            while nn < n {
                let s = decay * pool[row + nn] + dtv * xv * f32::cast_from(xbc[bb + nn]);
                pool[row + nn] = s;
                acc += s * f32::cast_from(xbc[cb + nn]);
                nn += CUBE_DIM_X as usize;
            }
        }
    }
    let total = lane_sum(acc, units, plane);
    if UNIT_POS_X == 0 && pp < p {
        let mut out = 0.0f32;
        if slot >= 0 {
            out = total + f32::cast_from(d[hh]) * xv;
        }
        y[(b * h + hh) * p + pp] = F::cast_from(out);
    }
}

#[allow(clippy::too_many_arguments)]
pub fn ssm_launch<R: CubeRuntime>(
    xbc: CubeTensor<R>,
    dt: CubeTensor<R>,
    dt_bias: CubeTensor<R>,
    a: CubeTensor<R>,
    d: CubeTensor<R>,
    pool: CubeTensor<R>,
    slots: CubeTensor<R>,
    dims: ScanDims,
    dt_min: Option<f32>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let xbc = float_buf(xbc);
    let dtype = xbc.dtype;
    assert_eq!(pool.dtype, DType::F32, "ssm_step: the state pool is f32");
    assert!(
        pool.is_contiguous(),
        "ssm_step: the state pool must be contiguous"
    );
    let rows = xbc.meta.shape()[0];
    let ScanDims {
        heads: h,
        head_dim: p,
        groups: g,
        state: n,
    } = dims;
    let same = |t| contiguous_as(t, dtype);
    let (dt, dt_bias, a, d) = (same(dt), same(dt_bias), same(a), same(d));
    let slots = i32_buf(slots);
    let y = empty(&xbc, [rows, h, p], dtype);
    let count = CubeCount::Static(p.div_ceil(SSM_ROWS as usize) as u32, h as u32, rows as u32);
    // A lane's share of a state row held in registers where it divides evenly (up to 8 values:
    // `n` ≤ 256); otherwise the strided loop.
    let per = if n % SSM_LANES as usize == 0 && n / (SSM_LANES as usize) <= 8 {
        n / SSM_LANES as usize
    } else {
        0
    };
    // No floor: one below any softplus value (softplus > 0).
    let floor = dt_min.unwrap_or(-1.0);
    macro_rules! go {
        ($t:ty) => {
            ssm_step_kernel::launch::<$t, R>(
                &xbc.client,
                count,
                CubeDim::new_2d(SSM_LANES, SSM_ROWS),
                arg(&xbc),
                arg(&dt),
                arg(&dt_bias),
                arg(&a),
                arg(&d),
                arg(&slots),
                arg(&pool),
                arg(&y),
                h as u32,
                p as u32,
                g as u32,
                n as u32,
                floor,
                (SSM_LANES * SSM_ROWS) as usize,
                plane_reduce(&xbc.client, SSM_LANES),
                per,
            )
        };
    }
    with_float!(dtype, go);
    (y, pool)
}
