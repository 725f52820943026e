//! The selective scan with D skip, token by token:
//! `S = exp(dt·A[h])·S + dt·outer(x, B[g])`, `y = S·C[g] + D[h]·x`, `g = h / (H/G)`.
//! Grid: one unit per `(b, h, p)` walking time over its state row `S[b, h, p, :]`, read from
//! `state` and written to `new_state` (f32); positions past a sequence's length leave its state as
//! it was.

use crate::cube::buffers::{arg, contiguous_as, elemwise, empty, f32_buf, handle_arg, lens_buf};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

#[cube(launch)]
pub fn selective_scan_kernel(
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    bm: &[f32],
    cm: &[f32],
    d: &[f32],
    lens: &[u32],
    state: &[f32],
    new_state: &mut [f32],
    y: &mut [f32],
    batch: u32,
    t_max: u32,
    heads: u32,
    head_dim: u32,
    groups: u32,
    n_state: u32,
    #[comptime] ragged: bool,
) {
    let id = ABSOLUTE_POS;
    let (batch, t_max, h, p, g, n) = (
        batch as usize,
        t_max as usize,
        heads as usize,
        head_dim as usize,
        groups as usize,
        n_state as usize,
    );
    if id >= batch * h * p {
        terminate!();
    }
    let b = id / (h * p);
    let hh = (id / p) % h;
    let pp = id % p;
    let gg = hh / (h / g);
    let mut len = t_max;
    if ragged {
        len = lens[b] as usize;
    }
    let srow = ((b * h + hh) * p + pp) * n;
    if len == 0 {
        for nn in 0..n {
            new_state[srow + nn] = state[srow + nn];
        }
    }
    for t in 0..len {
        let dtv = dt[(b * t_max + t) * h + hh];
        let decay = (dtv * a[hh]).exp();
        let xv = x[((b * t_max + t) * h + hh) * p + pp];
        let bc = ((b * t_max + t) * g + gg) * n;
        let mut acc = 0.0f32;
        for nn in 0..n {
            // The first token reads the input state; later ones the state this unit wrote.
            let prev = if t == 0 {
                state[srow + nn]
            } else {
                new_state[srow + nn]
            };
            let s = decay * prev + dtv * xv * bm[bc + nn];
            new_state[srow + nn] = s;
            acc += s * cm[bc + nn];
        }
        y[((b * t_max + t) * h + hh) * p + pp] = acc + d[hh] * xv;
    }
}

#[allow(clippy::too_many_arguments)]
pub fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    dt: CubeTensor<R>,
    a: CubeTensor<R>,
    b: CubeTensor<R>,
    c: CubeTensor<R>,
    d: CubeTensor<R>,
    state: CubeTensor<R>,
    lens: &[usize],
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (dtype, state_dtype) = (x.dtype, state.dtype);
    let xs = x.meta.shape().clone();
    let (bs, t, h, p) = (xs[0], xs[1], xs[2], xs[3]);
    let bsh = b.meta.shape().clone();
    let (g, n) = (bsh[2], bsh[3]);
    let (x, dt, a, bm, cm, d, st) = (
        f32_buf(x),
        f32_buf(dt),
        f32_buf(a),
        f32_buf(b),
        f32_buf(c),
        f32_buf(d),
        f32_buf(state),
    );
    let ns = empty(&x, [bs, h, p, n], DType::F32);
    let y = empty(&x, [bs, t, h, p], DType::F32);
    let client = x.client.clone();
    let lens = lens_buf(&client, lens);
    let (count, dim) = elemwise(bs * h * p);
    selective_scan_kernel::launch::<R>(
        &client,
        count,
        dim,
        arg(&x),
        arg(&dt),
        arg(&a),
        arg(&bm),
        arg(&cm),
        arg(&d),
        match &lens {
            Some((hd, len)) => handle_arg(hd, *len),
            None => arg(&a),
        },
        arg(&st),
        arg(&ns),
        arg(&y),
        bs as u32,
        t as u32,
        h as u32,
        p as u32,
        g as u32,
        n as u32,
        lens.is_some(),
    );
    (contiguous_as(y, dtype), contiguous_as(ns, state_dtype))
}
