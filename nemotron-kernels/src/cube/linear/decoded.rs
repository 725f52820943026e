//! The decoded path of a plain quantized linear ([`super::plan::LinearPath::Decoded`]): the
//! weights decoded into the activation type, the product on cubek's tiled matmul
//! ([`crate::cube::matmul::tiled`], f32 accumulation; f32 output, or the activation type with
//! `mmacc=act`), then the per-tensor scales and the epilogue in one pass (whole, or into three
//! parts):
//! - FP8: `y = epi((is · ws) · xq · W8ᵀ)`, `xq` the rows quantized to E4M3 values (by the
//!   caller); every E4M3 value is exact in bf16, f16 and f32.
//! - NVFP4: `y = epi(gs · x · Wᵀ)` with `W[n, k] = E2M1 · s[n, k / 16]`: a 2-bit significand
//!   times a 4-bit one, in `[2^−10, 2,688]`, exact in bf16 and f16 too.
//!
//! So the products are the format's exactly; only the sum order is the matmul's. Each call
//! writes the decoded weights anew (`N · K` values: 55 MB for Lightning's bf16 `in_proj`), so the
//! path pays from many rows (a prefill), where the matmul's tensor-core pipeline outruns the
//! kernels that decode in registers.

use super::{byte_at, e2m1, e4m3, e4m3x4, epilogue, hw_decode, store3, Call};
use crate::cube::buffers::{arg, elemwise, empty, f32_buf, with_float};
use crate::cube::matmul;
use crate::{Fp8Weights, Nvfp4Weights};
use burn::backend::ops::FloatTensorOps;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

/// Every FP8 weight byte as its E4M3 value in `F`, one word (4 weights) per unit.
#[cube(launch)]
pub fn fp8_decode_kernel<F: Float>(
    weight: &[u32],
    out: &mut [F],
    words: u32,
    #[comptime] hw: bool,
) {
    let i = ABSOLUTE_POS as usize;
    if i < words as usize {
        let word = weight[i];
        if hw {
            let v = e4m3x4(word);
            out[i * 4] = F::cast_from(v.extract(0));
            out[i * 4 + 1] = F::cast_from(v.extract(1));
            out[i * 4 + 2] = F::cast_from(v.extract(2));
            out[i * 4 + 3] = F::cast_from(v.extract(3));
        } else {
            #[unroll]
            for j in 0..4u32 {
                out[i * 4 + j as usize] = F::cast_from(e4m3((word >> (j * 8)) & 255u32));
            }
        }
    }
}

/// Every NVFP4 weight as `E2M1 · block scale` in `F`, one word (8 codes, half a block) per
/// unit; `k` the row length (a multiple of 16).
#[cube(launch)]
pub fn nvfp4_decode_kernel<F: Float>(
    packed: &[u32],
    scales: &[u32],
    out: &mut [F],
    words: u32,
    k: u32,
) {
    let i = ABSOLUTE_POS as usize;
    if i < words as usize {
        let k = k as usize;
        let (row, w) = (i / (k / 8), i % (k / 8));
        let s = e4m3(byte_at(scales, row * (k / 16) + w / 2));
        let word = packed[i];
        #[unroll]
        for j in 0..8u32 {
            out[i * 8 + j as usize] = F::cast_from(e2m1((word >> (j * 4)) & 15u32) * s);
        }
    }
}

/// `y = F(epi(a[0] · b[0] · acc))` (`a[0] · acc` unless `both`) over the products
/// `acc [R, n_out]` (f32, or the activation type), stored whole or into the three parts
/// ([`store3`]).
#[cube(launch)]
pub fn decoded_scale_kernel<F: Float, A: Float>(
    acc: &[A],
    a_scale: &[f32],
    b_scale: &[f32],
    y: &mut [F],
    y1: &mut [F],
    y2: &mut [F],
    a: u32,
    b: u32,
    n_out: u32,
    len: u32,
    #[comptime] both: bool,
    #[comptime] relu2: bool,
    #[comptime] split: bool,
) {
    let i = ABSOLUTE_POS as usize;
    if i < len as usize {
        let n_out = n_out as usize;
        let scale = if both {
            a_scale[0] * b_scale[0]
        } else {
            a_scale[0]
        };
        let v = F::cast_from(epilogue(f32::cast_from(acc[i]) * scale, relu2));
        store3(
            y,
            y1,
            y2,
            i / n_out,
            i % n_out,
            n_out,
            a as usize,
            b as usize,
            v,
            split,
        );
    }
}

/// FP8: `xq [R, K]` the rows already quantized (E4M3 values in the activation type).
pub(crate) fn fp8<R: CubeRuntime>(
    c: &Call<R>,
    xq: CubeTensor<R>,
    w: &Fp8Weights<CubeBackend<R>>,
) -> Result<(), String> {
    let words = c.n * c.k / 4;
    let wd = empty(&c.x, [c.n, c.k], c.dtype);
    let hw = hw_decode(&c.x.client);
    let (count, dim) = elemwise(words);
    macro_rules! decode {
        ($t:ty) => {
            fp8_decode_kernel::launch::<$t, R>(
                &c.x.client,
                count,
                dim,
                arg(&w.weight),
                arg(&wd),
                words as u32,
                hw,
            )
        };
    }
    with_float!(c.dtype, decode);
    let (is, ws) = (
        f32_buf(w.input_scales.clone()),
        f32_buf(w.weight_scales.clone()),
    );
    product(c, xq, wd, &is, Some(&ws))
}

/// NVFP4 (a plain linear: one matrix in the stack).
pub(crate) fn nvfp4<R: CubeRuntime>(
    c: &Call<R>,
    w: &Nvfp4Weights<CubeBackend<R>>,
) -> Result<(), String> {
    let words = c.n * c.k / 8;
    let wd = empty(&c.x, [c.n, c.k], c.dtype);
    let (count, dim) = elemwise(words);
    macro_rules! decode {
        ($t:ty) => {
            nvfp4_decode_kernel::launch::<$t, R>(
                &c.x.client,
                count,
                dim,
                arg(&w.packed),
                arg(&w.scales),
                arg(&wd),
                words as u32,
                c.k as u32,
            )
        };
    }
    with_float!(c.dtype, decode);
    let gs = f32_buf(w.globals.clone());
    product(c, c.x.clone(), wd, &gs, None)
}

/// `xs [R, K] · wdᵀ` (`wd [N, K]` read transposed in place) on cubek's tiled matmul into f32
/// (or the activation type: [`matmul::tiled_f32`]), then the scales, the epilogue and the split
/// store.
fn product<R: CubeRuntime>(
    c: &Call<R>,
    xs: CubeTensor<R>,
    wd: CubeTensor<R>,
    a_scale: &CubeTensor<R>,
    b_scale: Option<&CubeTensor<R>>,
) -> Result<(), String> {
    type B<R> = CubeBackend<R>;
    let xs = <B<R> as FloatTensorOps<B<R>>>::float_reshape(xs, [1, c.slots, c.k].into());
    let wd = <B<R> as FloatTensorOps<B<R>>>::float_reshape(wd, [1, c.n, c.k].into());
    let wt = <B<R> as FloatTensorOps<B<R>>>::float_swap_dims(wd, 1, 2);
    let f32_acc = matmul::tiled_f32();
    let acc_dtype = if f32_acc { DType::F32 } else { c.dtype };
    let acc = matmul::tiled(xs, wt, acc_dtype, matmul::tiled_kernel())?;
    let (sa, sb) = c.split_args();
    let len = c.slots * c.n;
    let (count, dim) = elemwise(len);
    macro_rules! scale {
        ($t:ty) => {
            if f32_acc {
                scale!($t, f32)
            } else {
                scale!($t, $t)
            }
        };
        ($t:ty, $a:ty) => {
            decoded_scale_kernel::launch::<$t, $a, R>(
                &c.x.client,
                count,
                dim,
                arg(&acc),
                arg(a_scale),
                arg(b_scale.unwrap_or(a_scale)),
                arg(&c.y),
                arg(&c.y1),
                arg(&c.y2),
                sa,
                sb,
                c.n as u32,
                len as u32,
                b_scale.is_some(),
                c.relu2,
                c.split.is_some(),
            )
        };
    }
    with_float!(c.dtype, scale);
    Ok(())
}
