//! Causal depthwise conv + bias + SiLU over time with carried state:
//! `y[b, t, c] = silu(bias[c] + Σ_kk w[c, kk] · in(b, t − (K−1) + kk, c))` where negative times read
//! the state `[B, C, K−1]` (oldest first); the new state is the last `K−1` inputs.
//! Grid: one unit per `(b, c)` walking time (f32 arithmetic; inputs cast to f32).

use crate::cube::buffers::{arg, contiguous_as, elemwise, empty, f32_buf, handle_arg, lens_buf};
use crate::Maybe;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

#[cube(launch)]
pub fn causal_conv1d_kernel(
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    state: &[f32],
    lens: &[u32],
    y: &mut [f32],
    new_state: &mut [f32],
    batch: u32,
    t_max: u32,
    ch: u32,
    k: u32,
    #[comptime] ragged: bool,
    #[comptime] has_bias: bool,
) {
    let id = ABSOLUTE_POS;
    let (batch, t_max, ch, k) = (batch as usize, t_max as usize, ch as usize, k as usize);
    if id >= batch * ch {
        terminate!();
    }
    let b = id / ch;
    let c = id % ch;
    let km1 = k - 1;
    let mut len = t_max;
    if ragged {
        len = lens[b] as usize;
    }
    for t in 0..len {
        let mut acc = 0.0f32;
        if has_bias {
            acc = bias[c];
        }
        for kk in 0..k {
            // Input at time t - (K-1) + kk; negative times read the cached tail.
            let v = if t + kk >= km1 {
                x[(b * t_max + t + kk - km1) * ch + c]
            } else {
                state[(b * ch + c) * km1 + t + kk]
            };
            acc += w[c * k + kk] * v;
        }
        y[(b * t_max + t) * ch + c] = acc / (1.0f32 + (-acc).exp());
    }
    for s in 0..km1 {
        let v = if len + s >= km1 {
            x[(b * t_max + len + s - km1) * ch + c]
        } else {
            state[(b * ch + c) * km1 + len + s]
        };
        new_state[(b * ch + c) * km1 + s] = v;
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
    let (x, w, st) = (f32_buf(x), f32_buf(weight), f32_buf(state));
    let bias = bias.into_option().map(f32_buf);
    let y = empty(&x, [b, t, c], DType::F32);
    let ns = empty(&x, [b, c, k - 1], DType::F32);
    let client = x.client.clone();
    let lens = lens_buf(&client, lens);
    let (count, dim) = elemwise(b * c);
    causal_conv1d_kernel::launch::<R>(
        &client,
        count,
        dim,
        arg(&x),
        arg(&w),
        arg(bias.as_ref().unwrap_or(&w)),
        arg(&st),
        match &lens {
            Some((h, n)) => handle_arg(h, *n),
            None => arg(&x),
        },
        arg(&y),
        arg(&ns),
        b as u32,
        t as u32,
        c as u32,
        k as u32,
        lens.is_some(),
        bias.is_some(),
    );
    (contiguous_as(y, dtype), contiguous_as(ns, state_dtype))
}
