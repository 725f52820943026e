//! Slot bookkeeping on the device: advancing the per-slot lengths after a decode step, and
//! writing a prefilled sequence's state into its slot — both in place, so the pools and the
//! lengths keep their buffers (a captured decode graph reads them by address).
//!
//! - advance: one unit per row: `lens[slots[b]] += 1` for non-pad rows (slots are distinct).
//! - write: one unit per source element: `pool[slot, a, l, c] = src[a, l, c]`.

use super::buffers::{arg, contiguous_as, elemwise, i32_buf, with_float};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

#[cube(launch)]
pub fn advance_lens_kernel(slots: &[i32], lens: &mut [i32], rows: u32) {
    let b = ABSOLUTE_POS;
    if b >= rows as usize {
        terminate!();
    }
    let s = slots[b];
    if s >= 0 {
        lens[s as usize] += 1;
    }
}

pub fn advance_launch<R: CubeRuntime>(lens: CubeTensor<R>, slots: CubeTensor<R>) -> CubeTensor<R> {
    assert_eq!(
        lens.dtype,
        burn::tensor::DType::I32,
        "advance_lens: lengths are I32"
    );
    assert!(
        lens.is_contiguous(),
        "advance_lens: lengths must be contiguous"
    );
    let slots = i32_buf(slots);
    let rows = slots.meta.shape().num_elements();
    let (count, dim) = elemwise(rows);
    advance_lens_kernel::launch::<R>(
        &lens.client,
        count,
        dim,
        arg(&slots),
        arg(&lens),
        rows as u32,
    );
    lens
}

#[cube(launch)]
pub fn write_slot_kernel<F: Float>(
    src: &[F],
    pool: &mut [F],
    len: u32,
    a_dim: u32,
    m_dim: u32,
    l_dim: u32,
    c_dim: u32,
    slot: u32,
) {
    let i = ABSOLUTE_POS;
    if i >= len as usize {
        terminate!();
    }
    let (a, m, l, c) = (
        a_dim as usize,
        m_dim as usize,
        l_dim as usize,
        c_dim as usize,
    );
    let ci = i % c;
    let li = (i / c) % l;
    let ai = i / (c * l);
    pool[((slot as usize * a + ai) * m + li) * c + ci] = src[i];
}

pub fn write_launch<R: CubeRuntime>(
    pool: CubeTensor<R>,
    src: CubeTensor<R>,
    slot: usize,
) -> CubeTensor<R> {
    assert!(
        pool.is_contiguous(),
        "write_slot: the pool must be contiguous"
    );
    let dtype = pool.dtype;
    let src = contiguous_as(src, dtype);
    let ps = pool.meta.shape().clone();
    let ss = src.meta.shape().clone();
    let len = ss.num_elements();
    let (count, dim) = elemwise(len);
    macro_rules! go {
        ($t:ty) => {
            write_slot_kernel::launch::<$t, R>(
                &pool.client,
                count,
                dim,
                arg(&src),
                arg(&pool),
                len as u32,
                ps[1] as u32,
                ps[2] as u32,
                ss[1] as u32,
                ps[3] as u32,
                slot as u32,
            )
        };
    }
    with_float!(dtype, go);
    pool
}
