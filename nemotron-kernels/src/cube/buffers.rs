//! Tensors as kernel buffers: contiguous, in a dtype the kernels read, and outputs allocated
//! contiguous (CUDA's default allocation may pitch rows, and the kernels index dense row-major
//! buffers).

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::{cast, into_contiguous};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::server::Handle;

/// `t` contiguous, cast to `dtype` first where it differs.
pub(crate) fn contiguous_as<R: CubeRuntime>(t: CubeTensor<R>, dtype: DType) -> CubeTensor<R> {
    let t = if t.dtype == dtype { t } else { cast(t, dtype) };
    into_contiguous(t)
}

/// A float tensor contiguous in a storage type the kernels read as `F` (f32, bf16, f16; any other
/// float goes through f32).
pub(crate) fn float_buf<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    match t.dtype {
        DType::F32 | DType::BF16 | DType::F16 => into_contiguous(t),
        _ => contiguous_as(t, DType::F32),
    }
}

/// A float tensor as a contiguous f32 buffer.
pub(crate) fn f32_buf<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    contiguous_as(t, DType::F32)
}

/// An int tensor as a contiguous i32 buffer (expert indices).
pub(crate) fn i32_buf<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    contiguous_as(t, DType::I32)
}

/// A contiguous tensor of `shape` and `dtype` on `like`'s device, uninitialized.
pub(crate) fn empty<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: impl Into<Shape>,
    dtype: DType,
) -> CubeTensor<R> {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        dtype,
    )
}

/// The buffer of a contiguous tensor, by element count.
pub(crate) fn arg<R: CubeRuntime>(t: &CubeTensor<R>) -> BufferArg<R> {
    let len = t.meta.shape().num_elements();
    // Safety: `len` is the element count of the tensor that owns the handle.
    unsafe { BufferArg::from_raw_parts(t.handle.clone(), len) }
}

/// A raw device buffer of `len` elements.
pub(crate) fn handle_arg<R: CubeRuntime>(h: &Handle, len: usize) -> BufferArg<R> {
    // Safety: callers pass the length the handle was created with.
    unsafe { BufferArg::from_raw_parts(h.clone(), len) }
}

/// The lengths buffer of [`lens_buf`] as a kernel argument, or `stand_in` (any buffer: the
/// kernel's `ragged` flag is off and it reads no lengths) when every sequence fills `T`.
pub(crate) fn lens_arg<R: CubeRuntime>(
    lens: &Option<(Handle, usize)>,
    stand_in: &CubeTensor<R>,
) -> BufferArg<R> {
    match lens {
        Some((h, len)) => handle_arg(h, *len),
        None => arg(stand_in),
    }
}

/// Per-sequence lengths as a u32 buffer, or `None` when every sequence fills `T` (the kernels
/// then take `T` for every sequence: no host write, so a decode step stays graph-capturable).
pub(crate) fn lens_buf<R: CubeRuntime>(
    client: &ComputeClient<R>,
    lens: &[usize],
) -> Option<(Handle, usize)> {
    if lens.is_empty() {
        return None;
    }
    let v: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
    Some((client.create_from_slice(u32::as_bytes(&v)), v.len()))
}

/// Runs `$launch!(T)` with `T` the Rust type of float dtype `$dtype` (f32, bf16 or f16).
macro_rules! with_float {
    ($dtype:expr, $launch:ident) => {
        match $dtype {
            burn::tensor::DType::BF16 => $launch!(burn::tensor::bf16),
            burn::tensor::DType::F16 => $launch!(burn::tensor::f16),
            _ => $launch!(f32),
        }
    };
}
pub(crate) use with_float;

/// Elementwise launch geometry: `n` units in cubes of [`ELEMWISE_BLOCK`], the cubes [`fold`]ed
/// (the kernels index by `ABSOLUTE_POS`, which is linear over the folded grid on every runtime).
pub(crate) fn elemwise(n: usize) -> (CubeCount, CubeDim) {
    (
        fold(n.div_ceil(ELEMWISE_BLOCK as usize)),
        CubeDim::new_1d(ELEMWISE_BLOCK),
    )
}

/// The most cubes along one grid dimension on every runtime this crate launches on (wgpu's
/// limit on x, y and z; CUDA's on y and z).
pub const MAX_CUBES: usize = 65_535;

/// `(x, y)` cube counts for `cubes` cubes numbered `x + y · count_x` (at least one cube): x up
/// to [`MAX_CUBES`], the rest on y. A kernel launched on it takes its cube index as
/// `CUBE_POS_X + CUBE_POS_Y · CUBE_COUNT_X` (or `ABSOLUTE_POS`) and leaves past `cubes`.
pub fn fold_xy(cubes: usize) -> (u32, u32) {
    let x = cubes.clamp(1, MAX_CUBES);
    (x as u32, cubes.div_ceil(x).max(1) as u32)
}

/// [`fold_xy`] as a launch count.
pub(crate) fn fold(cubes: usize) -> CubeCount {
    let (x, y) = fold_xy(cubes);
    CubeCount::Static(x, y, 1)
}

/// Units per cube of the elementwise kernels.
pub(crate) const ELEMWISE_BLOCK: u32 = 128;

/// `(y, z)` cube counts covering `n` along y, spilling onto z beyond [`MAX_CUBES`].
pub fn yz(n: usize) -> (u32, u32) {
    let y = n.clamp(1, MAX_CUBES);
    (y as u32, n.div_ceil(y).max(1) as u32)
}
