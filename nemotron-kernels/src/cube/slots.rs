//! Slot bookkeeping on the device: advancing the per-slot lengths after a decode step, and
//! writing a prefilled sequence's state into its slot — both in place, so the pools and the
//! lengths keep their buffers (a captured decode graph reads them by address).
//!
//! - advance: one unit per row: `lens[slots[b]] += 1` for non-pad rows (slots are distinct).
//! - write: one unit per source element: `pool[slot, a, l, c] = src[a, l, c]`.
//! - write many: one unit per written element of a batch: `pool[slots[b], a, (l + rot[b]) mod
//!   M, c] = src[b, a, l, c]` (zero past `L`), the units over the folded grid.
//! - write many into an FP8 KV cache: one unit per word of four codes, `pool[slots[b], a, l,
//!   w] = codes of src[b, a, l, 4w .. 4w + 4] / scale` ([`super::kv8`]).
//! - write many into a bf16 SSM state: one unit per word of two bf16, `pool[slots[b], a, l, w]
//!   = src[b, a, l, 2w] | src[b, a, l, 2w + 1] << 16`, each rounded to nearest even.

use super::bf16::bf16_word;
use super::buffers::{arg, contiguous_as, elemwise, float_buf, i32_buf, with_float};
use super::kv8::kv_word;
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

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn write_slots_kernel<F: Float>(
    src: &[F],
    pool: &mut [F],
    slots: &[i32],
    rot: &[i32],
    total: u32,
    a_dim: u32,
    m_dim: u32,
    l_dim: u32,
    c_dim: u32,
    width: u32,
) {
    let i = ABSOLUTE_POS;
    if i >= total as usize {
        terminate!();
    }
    let (a, m, l, c, w) = (
        a_dim as usize,
        m_dim as usize,
        l_dim as usize,
        c_dim as usize,
        width as usize,
    );
    // `i` = ((b · A + a) · width + l) · C + c.
    let ci = i % c;
    let li = (i / c) % w;
    let ai = (i / (c * w)) % a;
    let b = i / (c * w * a);
    let slot = slots[b];
    if slot >= 0 {
        let at = (li + rot[b] as usize) % m;
        let v = if li < l {
            src[((b * a + ai) * l + li) * c + ci]
        } else {
            F::cast_from(0.0f32)
        };
        pool[((slot as usize * a + ai) * m + at) * c + ci] = v;
    }
}

pub fn write_many_launch<R: CubeRuntime>(
    pool: CubeTensor<R>,
    src: CubeTensor<R>,
    slots: CubeTensor<R>,
    rot: CubeTensor<R>,
    width: usize,
) -> CubeTensor<R> {
    assert!(
        pool.is_contiguous(),
        "write_slots: the pool must be contiguous"
    );
    let dtype = pool.dtype;
    let src = contiguous_as(src, dtype);
    let (slots, rot) = (i32_buf(slots), i32_buf(rot));
    let ps = pool.meta.shape().clone();
    let ss = src.meta.shape().clone();
    let total = ss[0] * ss[1] * width * ss[3];
    if total == 0 {
        return pool;
    }
    let (count, dim) = elemwise(total);
    macro_rules! go {
        ($t:ty) => {
            write_slots_kernel::launch::<$t, R>(
                &pool.client,
                count,
                dim,
                arg(&src),
                arg(&pool),
                arg(&slots),
                arg(&rot),
                total as u32,
                ps[1] as u32,
                ps[2] as u32,
                ss[2] as u32,
                ps[3] as u32,
                width as u32,
            )
        };
    }
    with_float!(dtype, go);
    pool
}

/// Words of a packed pool for a batch of sequences: unit `i` = `((b · A + a) · L + l) · W + w`
/// over `src` `[B, A, L, per·W]`, into `pool` `[S, A, M, W]` (rows with a negative slot skipped).
/// `per` values a word: 4 E4M3 codes of `x / scale` (the FP8 KV cache, [`super::kv8`]) or 2 bf16
/// (the bf16 SSM state, [`super::bf16`]; `scale` unused).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn write_slots_packed_kernel<F: Float>(
    src: &[F],
    pool: &mut [u32],
    slots: &[i32],
    total: u32,
    a_dim: u32,
    m_dim: u32,
    l_dim: u32,
    w_dim: u32,
    scale: f32,
    #[comptime] per: usize,
) {
    let i = ABSOLUTE_POS;
    if i >= total as usize {
        terminate!();
    }
    let (a, m, l, w) = (
        a_dim as usize,
        m_dim as usize,
        l_dim as usize,
        w_dim as usize,
    );
    let wi = i % w;
    let li = (i / w) % l;
    let ai = (i / (w * l)) % a;
    let b = i / (w * l * a);
    let slot = slots[b];
    if slot >= 0 {
        let word = if per == 4 {
            kv_word(src, i * 4, scale)
        } else {
            bf16_word(f32::cast_from(src[2 * i]), f32::cast_from(src[2 * i + 1]))
        };
        pool[((slot as usize * a + ai) * m + li) * w + wi] = word;
    }
}

/// [`write_slots_packed_kernel()`]'s launch for FP8 KV codes: `pool` `[S, A, M, W]` I32 words,
/// `src` `[B, A, L, 4W]`.
pub fn write_many8_launch<R: CubeRuntime>(
    pool: CubeTensor<R>,
    src: CubeTensor<R>,
    slots: CubeTensor<R>,
    scale: f32,
) -> CubeTensor<R> {
    write_packed_launch(pool, src, slots, scale, 4, "write_slots8")
}

/// [`write_slots_packed_kernel()`]'s launch for bf16 pairs: `pool` `[S, A, M, W]` I32 words,
/// `src` `[B, A, L, 2W]`.
pub fn write_many_bf16_launch<R: CubeRuntime>(
    pool: CubeTensor<R>,
    src: CubeTensor<R>,
    slots: CubeTensor<R>,
) -> CubeTensor<R> {
    write_packed_launch(pool, src, slots, 1.0, 2, "write_slots_bf16")
}

fn write_packed_launch<R: CubeRuntime>(
    pool: CubeTensor<R>,
    src: CubeTensor<R>,
    slots: CubeTensor<R>,
    scale: f32,
    per: usize,
    op: &str,
) -> CubeTensor<R> {
    assert!(
        pool.is_contiguous() && pool.dtype == burn::tensor::DType::I32,
        "{op}: the pool must be contiguous I32 words"
    );
    let src = float_buf(src);
    let slots = i32_buf(slots);
    let ps = pool.meta.shape().clone();
    let ss = src.meta.shape().clone();
    let total = ss[0] * ss[1] * ss[2] * ps[3];
    if total == 0 {
        return pool;
    }
    let (count, dim) = elemwise(total);
    let dtype = src.dtype;
    macro_rules! go {
        ($t:ty) => {
            write_slots_packed_kernel::launch::<$t, R>(
                &pool.client,
                count,
                dim,
                arg(&src),
                arg(&pool),
                arg(&slots),
                total as u32,
                ps[1] as u32,
                ps[2] as u32,
                ss[2] as u32,
                ps[3] as u32,
                scale,
                per,
            )
        };
    }
    with_float!(dtype, go);
    pool
}
