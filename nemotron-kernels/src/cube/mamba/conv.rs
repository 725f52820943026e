//! Causal depthwise conv + bias + SiLU over time with carried state:
//! `y[b, t, c] = silu(bias[c] + Σ_kk w[c, kk] · in(b, t − (K−1) + kk, c))` where negative times read
//! the state `[B, C, K−1]` (oldest first); the new state is the last `K−1` inputs.
//!
//! Grid: a unit takes one channel over [`CONV_STEPS`] consecutive times (x = blocks of
//! [`CONV_UNITS`] channels, so loads and stores are coalesced; y/z = (sequence, time block),
//! folded), keeping the window of `K − 1 + CONV_STEPS` inputs in registers: each input is read
//! once per unit instead of `K` times, and the unit's indices come from the cube position (one
//! division per unit). The units of the last `B` cube rows write the new states. `x` and `y` stay
//! in the activation type; the arithmetic is f32, each output's sum in the same order as
//! before. The output may be split along channels into three dense tensors ([`launch_split`]:
//! Mamba's `x`, `B`, `C`), so the scan reads them without the three copies that slicing one
//! `[B, T, C]` output took (225 µs of a 64 × 128-token Lightning layer on the H100, PERF §28). The former one-unit-per-output form spent three 64-bit divisions per output and was
//! issue-bound: 0.0585 ms for a 1,024-token Lightning layer (≈ 25 MB) on the H200 (PERF §16).

use crate::cube::buffers::{
    arg, contiguous_as, empty, f32_buf, handle_arg, lens_buf, with_float, yz,
};
use crate::Maybe;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

/// Channels per cube.
pub const CONV_UNITS: u32 = 128;
/// Times per unit.
pub const CONV_STEPS: usize = 8;

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn causal_conv1d_kernel<F: Float>(
    x: &[F],
    w: &[f32],
    bias: &[f32],
    state: &[f32],
    lens: &[u32],
    y: &mut [F],
    y1: &mut [F],
    y2: &mut [F],
    new_state: &mut [f32],
    batch: u32,
    t_max: u32,
    ch: u32,
    w0: u32,
    w1: u32,
    #[comptime] k: usize,
    #[comptime] steps: usize,
    #[comptime] ragged: bool,
    #[comptime] has_bias: bool,
) {
    let (batch, t_max, ch) = (batch as usize, t_max as usize, ch as usize);
    let km1 = comptime!(k - 1);
    let c = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    let r = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    let tblocks = t_max.div_ceil(steps);
    if c >= ch || r >= batch * (tblocks + 1) {
        terminate!();
    }
    if r < batch * tblocks {
        let b = r / tblocks;
        let t0 = (r % tblocks) * steps;
        let mut len = t_max;
        if ragged {
            len = lens[b] as usize;
        }
        // Padding positions are left unwritten.
        if t0 < len {
            // The window: inputs at times t0 − (K−1) .. t0 + steps; negative times read the
            // cached tail, times past the sequence are never used for a written output.
            let mut win = Array::<f32>::new(comptime!(k - 1 + steps));
            #[unroll]
            for i in 0..comptime!(k - 1 + steps) {
                let tt = t0 + i;
                win[i] = if tt >= km1 {
                    f32::cast_from(x[(b * t_max + (tt - km1).min(t_max - 1)) * ch + c])
                } else {
                    state[(b * ch + c) * km1 + tt]
                };
            }
            let mut wk = Array::<f32>::new(k);
            #[unroll]
            for kk in 0..k {
                wk[kk] = w[c * k + kk];
            }
            let mut b0 = 0.0f32;
            if has_bias {
                b0 = bias[c];
            }
            // Which output the channel goes to, its column there and that output's width:
            // channels `[0, w0)` to `y`, `[w0, w0 + w1)` to `y1`, the rest to `y2`.
            let (w0, w1) = (w0 as usize, w1 as usize);
            let mut part = 0u32;
            let mut col = c;
            let mut width = w0;
            if c >= w0 + w1 {
                part = 2u32;
                col = c - w0 - w1;
                width = ch - w0 - w1;
            } else if c >= w0 {
                part = 1u32;
                col = c - w0;
                width = w1;
            }
            #[unroll]
            for j in 0..steps {
                let t = t0 + j;
                if t < len {
                    let mut acc = b0;
                    #[unroll]
                    for kk in 0..k {
                        acc += wk[kk] * win[j + kk];
                    }
                    let v = F::cast_from(acc / (1.0f32 + (-acc).exp()));
                    let at = (b * t_max + t) * width + col;
                    if part == 0u32 {
                        y[at] = v;
                    } else if part == 1u32 {
                        y1[at] = v;
                    } else {
                        y2[at] = v;
                    }
                }
            }
        }
    } else {
        // The new state of sequence `b`: its last `K − 1` inputs (oldest first).
        let b = r - batch * tblocks;
        let mut len = t_max;
        if ragged {
            len = lens[b] as usize;
        }
        #[unroll]
        for s in 0..km1 {
            let v = if len + s >= km1 {
                f32::cast_from(x[(b * t_max + len + s - km1) * ch + c])
            } else {
                state[(b * ch + c) * km1 + len + s]
            };
            new_state[(b * ch + c) * km1 + s] = v;
        }
    }
}

/// The conv of `x` `[B, T, C]`: `(y, new_state)`.
pub fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: Maybe<CubeBackend<R>>,
    state: CubeTensor<R>,
    lens: &[usize],
) -> (CubeTensor<R>, CubeTensor<R>) {
    let c = x.meta.shape()[2];
    let (mut ys, ns) = run(x, weight, bias, state, lens, [c, 0, 0]);
    (ys.swap_remove(0), ns)
}

/// [`launch`] with the output's channels split into three dense tensors `[B, T, widths[i]]`
/// (each width > 0, summing to `C`), written by the same launch.
pub fn launch_split<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: Maybe<CubeBackend<R>>,
    state: CubeTensor<R>,
    lens: &[usize],
    widths: [usize; 3],
) -> ([CubeTensor<R>; 3], CubeTensor<R>) {
    let (ys, ns) = run(x, weight, bias, state, lens, widths);
    let [a, b, c]: [CubeTensor<R>; 3] = ys.try_into().unwrap_or_else(|_| unreachable!());
    ([a, b, c], ns)
}

/// The launch: outputs of `widths` channels (a zero width: no output, a 1-element stand-in
/// bound in its place). Returns the outputs of nonzero width, in order.
fn run<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: Maybe<CubeBackend<R>>,
    state: CubeTensor<R>,
    lens: &[usize],
    widths: [usize; 3],
) -> (Vec<CubeTensor<R>>, CubeTensor<R>) {
    let (dtype, state_dtype) = (x.dtype, state.dtype);
    let shape = x.meta.shape().clone();
    let (b, t, c) = (shape[0], shape[1], shape[2]);
    debug_assert_eq!(widths.iter().sum::<usize>(), c);
    let k = weight.meta.shape()[1];
    let act = match dtype {
        DType::BF16 | DType::F16 => dtype,
        _ => DType::F32,
    };
    let (x, w, st) = (contiguous_as(x, act), f32_buf(weight), f32_buf(state));
    let bias = bias.into_option().map(f32_buf);
    let ys: Vec<_> = widths
        .iter()
        .map(|&wd| empty(&x, if wd > 0 { vec![b, t, wd] } else { vec![1] }, act))
        .collect();
    let ns = empty(&x, [b, c, k - 1], DType::F32);
    let client = x.client.clone();
    let lens = lens_buf(&client, lens);
    let (gy, gz) = yz(b * (t.div_ceil(CONV_STEPS) + 1));
    let count = CubeCount::Static(c.div_ceil(CONV_UNITS as usize) as u32, gy, gz);
    macro_rules! go {
        ($ty:ty) => {
            causal_conv1d_kernel::launch::<$ty, R>(
                &client,
                count,
                CubeDim::new_1d(CONV_UNITS),
                arg(&x),
                arg(&w),
                arg(bias.as_ref().unwrap_or(&w)),
                arg(&st),
                match &lens {
                    Some((h, n)) => handle_arg(h, *n),
                    None => arg(&w),
                },
                arg(&ys[0]),
                arg(&ys[1]),
                arg(&ys[2]),
                arg(&ns),
                b as u32,
                t as u32,
                c as u32,
                widths[0] as u32,
                widths[1] as u32,
                k,
                CONV_STEPS,
                lens.is_some(),
                bias.is_some(),
            )
        };
    }
    with_float!(act, go);
    let ys = ys
        .into_iter()
        .zip(widths)
        .filter(|(_, wd)| *wd > 0)
        .map(|(y, _)| contiguous_as(y, dtype))
        .collect();
    (ys, contiguous_as(ns, state_dtype))
}
