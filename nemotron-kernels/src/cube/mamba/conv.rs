//! Causal depthwise conv + bias + SiLU over time with carried state:
//! `y[b, t, c] = silu(bias[c] + Σ_kk w[c, kk] · in(b, t − (K−1) + kk, c))` where negative times read
//! the state `[B, C, K−1]` (oldest first); the new state is the last `K−1` inputs.
//!
//! Grid: one unit per output `(b, t, c)` (channels fastest, so loads and stores are coalesced and
//! the `K` taps of neighbouring tokens hit the same cache lines), then one per new state entry
//! `(b, c, s)`, in a single launch: the work is bandwidth, `x` read and `y` written once (a
//! 1,024-token Lightning layer is ≈ 25 MB in bf16). `x` and `y` stay in the activation type;
//! the arithmetic is f32. A launch takes at most one grid row of cubes and its units stride
//! over the rest, so no prompt length exceeds a launch limit.

use crate::cube::buffers::{
    arg, contiguous_as, empty, f32_buf, fold, handle_arg, lens_buf, with_float, ELEMWISE_BLOCK,
    MAX_CUBES,
};
use crate::Maybe;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

/// Cubes of one launch, at most (one grid row: 8.4 M units, ≈ 30 waves of an H200); units
/// stride over the rest.
const MAX_LAUNCH_CUBES: usize = MAX_CUBES;

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn causal_conv1d_kernel<F: Float>(
    x: &[F],
    w: &[f32],
    bias: &[f32],
    state: &[f32],
    lens: &[u32],
    y: &mut [F],
    new_state: &mut [f32],
    batch: u32,
    t_max: u32,
    ch: u32,
    k: u32,
    #[comptime] ragged: bool,
    #[comptime] has_bias: bool,
) {
    let (batch, t_max, ch, k) = (batch as usize, t_max as usize, ch as usize, k as usize);
    let km1 = k - 1;
    let outputs = batch * t_max * ch;
    let total = outputs + batch * ch * km1;
    let stride = CUBE_COUNT * CUBE_DIM as usize;
    let mut id = ABSOLUTE_POS;
    while id < total {
        if id < outputs {
            let c = id % ch;
            let t = (id / ch) % t_max;
            let b = id / (ch * t_max);
            let mut len = t_max;
            if ragged {
                len = lens[b] as usize;
            }
            // Padding positions are left unwritten.
            if t < len {
                let mut acc = 0.0f32;
                if has_bias {
                    acc = bias[c];
                }
                for kk in 0..k {
                    // Input at time t - (K-1) + kk; negative times read the cached tail.
                    let v = if t + kk >= km1 {
                        f32::cast_from(x[(b * t_max + t + kk - km1) * ch + c])
                    } else {
                        state[(b * ch + c) * km1 + t + kk]
                    };
                    acc += w[c * k + kk] * v;
                }
                y[id] = F::cast_from(acc / (1.0f32 + (-acc).exp()));
            }
        } else {
            let j = id - outputs;
            let s = j % km1;
            let c = (j / km1) % ch;
            let b = j / (km1 * ch);
            let mut len = t_max;
            if ragged {
                len = lens[b] as usize;
            }
            let v = if len + s >= km1 {
                f32::cast_from(x[(b * t_max + len + s - km1) * ch + c])
            } else {
                state[(b * ch + c) * km1 + len + s]
            };
            new_state[j] = v;
        }
        id += stride;
    }
}

pub fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: Maybe<CubeBackend<R>>,
    state: CubeTensor<R>,
    lens: &[usize],
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (dtype, state_dtype) = (x.dtype, state.dtype);
    let shape = x.meta.shape().clone();
    let (b, t, c) = (shape[0], shape[1], shape[2]);
    let k = weight.meta.shape()[1];
    let act = match dtype {
        DType::BF16 | DType::F16 => dtype,
        _ => DType::F32,
    };
    let (x, w, st) = (contiguous_as(x, act), f32_buf(weight), f32_buf(state));
    let bias = bias.into_option().map(f32_buf);
    let y = empty(&x, [b, t, c], act);
    let ns = empty(&x, [b, c, k - 1], DType::F32);
    let client = x.client.clone();
    let lens = lens_buf(&client, lens);
    let units = b * c * (t + k - 1);
    let cubes = units
        .div_ceil(ELEMWISE_BLOCK as usize)
        .clamp(1, MAX_LAUNCH_CUBES);
    macro_rules! go {
        ($ty:ty) => {
            causal_conv1d_kernel::launch::<$ty, R>(
                &client,
                fold(cubes),
                CubeDim::new_1d(ELEMWISE_BLOCK),
                arg(&x),
                arg(&w),
                arg(bias.as_ref().unwrap_or(&w)),
                arg(&st),
                match &lens {
                    Some((h, n)) => handle_arg(h, *n),
                    None => arg(&w),
                },
                arg(&y),
                arg(&ns),
                b as u32,
                t as u32,
                c as u32,
                k as u32,
                lens.is_some(),
                bias.is_some(),
            )
        };
    }
    with_float!(act, go);
    (contiguous_as(y, dtype), contiguous_as(ns, state_dtype))
}
