//! `dt = softplus(dt_raw + bias[h])` as `max(x, 0) + log1p(exp(−|x|))` (keeps dt far below 1e-3
//! in f32), then `max(dt, min)` (`min` below any softplus value when unclamped). Elementwise over
//! `[N, H]`, one unit per element, in the activation storage type `F`.

use crate::cube::buffers::{arg, contiguous_as, elemwise, empty, float_buf, with_float};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

#[cube(launch)]
pub fn dt_softplus_kernel<F: Float>(
    dt: &[F],
    bias: &[F],
    y: &mut [F],
    len: u32,
    heads: u32,
    min: f32,
) {
    let i = ABSOLUTE_POS;
    if i >= len as usize {
        terminate!();
    }
    let x = f32::cast_from(dt[i]) + f32::cast_from(bias[i % heads as usize]);
    let sp = x.max(0.0f32) + (-x.abs()).exp().log1p();
    y[i] = F::cast_from(sp.max(min));
}

pub fn launch<R: CubeRuntime>(
    dt: CubeTensor<R>,
    bias: CubeTensor<R>,
    min: Option<f32>,
) -> CubeTensor<R> {
    let x = float_buf(dt);
    let dtype = x.dtype;
    let shape = x.meta.shape().clone();
    let len = shape.num_elements();
    let h = shape[shape.len() - 1];
    let bias = contiguous_as(bias, dtype);
    let y = empty(&x, shape, dtype);
    let (count, dim) = elemwise(len);
    // No clamp: a floor below any softplus value (softplus > 0).
    let floor = min.unwrap_or(-1.0);
    macro_rules! go {
        ($t:ty) => {
            dt_softplus_kernel::launch::<$t, R>(
                &x.client,
                count,
                dim,
                arg(&x),
                arg(&bias),
                arg(&y),
                len as u32,
                h as u32,
                floor,
            )
        };
    }
    with_float!(dtype, go);
    y
}
