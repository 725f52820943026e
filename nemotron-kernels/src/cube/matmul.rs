//! Batched `c[b, m, n] = Σ_k a[b, m, k] · w[b, k, n]` in any float storage type `F`, accumulated
//! in f32 term by term (no tensor cores, no reordering beyond the split below): the exact matmul
//! every arm shares for the dense linears, the router and attention.
//! Grid: a cube covers [`MATMUL_COLS`] consecutive columns of one row `(b, m)`; its
//! [`MATMUL_SPLITS`] unit rows split `K` (unit row `y` sums `k ≡ y mod splits`) and add their
//! partial sums through shared memory. Reads of `w` are coalesced along the columns; the split
//! keeps a batch-1 GEMV busy.

use super::buffers::{arg, contiguous_as, empty, with_float};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

/// Columns per cube.
pub const MATMUL_COLS: u32 = 32;
/// Unit rows splitting K (a power of two).
pub const MATMUL_SPLITS: u32 = 16;

#[cube(launch)]
pub fn matmul_kernel<F: Float>(
    a: &[F],
    w: &[F],
    c: &mut [F],
    m: u32,
    k: u32,
    n: u32,
    #[comptime] cols: usize,
    #[comptime] splits: usize,
) {
    let (m, k, n) = (m as usize, k as usize, n as usize);
    let col = CUBE_POS_X as usize * cols + UNIT_POS_X as usize;
    let row = CUBE_POS_Y as usize;
    let bb = CUBE_POS_Z as usize;
    let y = UNIT_POS_Y as usize;
    let mut acc = 0.0f32;
    if col < n {
        let mut kk = y;
        while kk < k {
            acc += f32::cast_from(a[(bb * m + row) * k + kk])
                * f32::cast_from(w[(bb * k + kk) * n + col]);
            kk += splits;
        }
    }
    let mut sm = Shared::<[f32]>::new_slice(cols * splits);
    let x = UNIT_POS_X as usize;
    sm[y * cols + x] = acc;
    sync_cube();
    // A runtime stride (a comptime one would be folded at expansion time).
    let mut stride = (CUBE_DIM_Y / 2) as usize;
    while stride > 0 {
        if y < stride {
            sm[y * cols + x] = sm[y * cols + x] + sm[(y + stride) * cols + x];
        }
        sync_cube();
        stride /= 2;
    }
    if y == 0 && col < n {
        c[(bb * m + row) * n + col] = F::cast_from(sm[x]);
    }
}

pub fn launch<R: CubeRuntime>(a: CubeTensor<R>, b: CubeTensor<R>) -> CubeTensor<R> {
    let out_dtype = a.dtype;
    // Read in the storage dtype (a bf16 weight is not widened per call); f32 otherwise.
    let dtype = if a.dtype == b.dtype && matches!(a.dtype, DType::F32 | DType::BF16 | DType::F16) {
        a.dtype
    } else {
        DType::F32
    };
    let (a, b) = (contiguous_as(a, dtype), contiguous_as(b, dtype));
    let (sa, sb) = (a.meta.shape().clone(), b.meta.shape().clone());
    let (bs, m, k, n) = (sa[0], sa[1], sa[2], sb[2]);
    let c = empty(&a, [bs, m, n], dtype);
    let count = CubeCount::Static(n.div_ceil(MATMUL_COLS as usize) as u32, m as u32, bs as u32);
    let dim = CubeDim::new_2d(MATMUL_COLS, MATMUL_SPLITS);
    macro_rules! go {
        ($t:ty) => {
            matmul_kernel::launch::<$t, R>(
                &a.client,
                count,
                dim,
                arg(&a),
                arg(&b),
                arg(&c),
                m as u32,
                k as u32,
                n as u32,
                MATMUL_COLS as usize,
                MATMUL_SPLITS as usize,
            )
        };
    }
    with_float!(dtype, go);
    contiguous_as(c, out_dtype)
}
