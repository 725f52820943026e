//! Batched `c[b, m, n] = Σ_k a[b, m, k] · w[b, k, n]` in any float storage type `F`, accumulated
//! in f32 term by term (no tensor cores, no reordering beyond the split below): the exact matmul
//! every arm shares for the dense linears, the router and attention.
//! Grid: a cube covers [`MATMUL_COLS`] consecutive columns of [`MATMUL_ROWS`] rows of one batch
//! (one row in products of fewer than [`MATMUL_BLOCK_FROM`] rows); its [`MATMUL_SPLITS`] unit
//! rows split `K` (unit row `y` sums `k ≡ y mod splits`) and add their partial sums through
//! shared memory. Reads of `w` are coalesced along the columns and shared by the cube's rows
//! (one row per cube read `w` once per row: the prefill router at 1,024 rows re-read its
//! 32-column slabs 1,024 times, 0.21 ms per layer on the H200, PERF §15); the split keeps a
//! batch-1 GEMV busy. Every output's sum runs in the same order whatever the rows per cube.

//!
//! [`linear_launch`] (`x · wᵀ` for `w [N, K]`): from `dense_mm` rows in the weight's type,
//! cubek's tiled matmul ([`tiled`]); from `dense` bf16 rows, the tensor-core kernel ([`mma`]; both
//! thresholds are [`super::tensor_core::mma`]'s); up to [`GEMV_MAX_ROWS`] rows, the dense GEMV —
//! the linear kernels' geometry ([`super::linear::dispatch`]): a unit row per 1–4 output rows,
//! lanes over 4-element chunks of `w`'s rows (16-byte loads for f32 weights), warp-shuffle sums
//! on CUDA; more rows go through [`matmul_kernel()`] over `wᵀ` made contiguous.

pub(crate) mod mma;

use super::buffers::{arg, contiguous_as, empty, float_buf, with_float, yz};
use super::linear::dispatch::{
    gemv_count, gemv_dim, gemv_group, plane_reduce, rows_per_unit_row, GEMV_LANES, GEMV_ROWS,
    GEMV_UNITS,
};
use super::reduce::lane_sum;
use burn::backend::ops::FloatTensorOps;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

/// Rows of `x` up to which [`linear_launch`] runs the GEMV (each row re-reads `w`, from L2).
pub const GEMV_MAX_ROWS: usize = 16;

/// Weight chunks (4 elements each) a lane of the dense GEMV holds at once (`rows × group`).
const DENSE_CHUNK_BUDGET: usize = 8;

/// `y[m, n] = Σ_k x[m, k] · w[n, k]`: the linear kernels' GEMV geometry over 4-element chunks,
/// `group` chunks of each row per step with every load of the step issued before any is used.
#[cube(launch_unchecked)]
pub fn dense_gemv_kernel<F: Float, W: Float, NV: Size>(
    x: &[Vector<F, NV>],
    w: &[Vector<W, NV>],
    y: &mut [W],
    chunks: u32,
    n_out: u32,
    slots: u32,
    #[comptime] rows: usize,
    #[comptime] group: usize,
    #[comptime] units: usize,
    #[comptime] plane: bool,
    #[comptime] ksplit: usize,
) {
    // Cubes numbered x + y · count_x, slots fastest ([`super::linear::dispatch::gemv_count`]).
    let cube = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    let m = cube % slots as usize;
    let (chunks, n_out) = (chunks as usize, n_out as usize);
    // `ksplit` unit rows share an output row (few outputs: more cubes, shorter K per lane).
    let y_unit = UNIT_POS_Y as usize;
    let kpart = y_unit % ksplit;
    let n0 = ((cube / slots as usize) * (CUBE_DIM_Y as usize / ksplit) + y_unit / ksplit) * rows;
    let mut acc = Array::<f32>::new(rows);
    #[unroll]
    for r in 0..rows {
        acc[r] = 0.0f32;
    }
    let mut wf = Array::<f32>::new(group * rows * 4);
    let mut xf = Array::<f32>::new(group * 4);
    let step = CUBE_DIM_X as usize * ksplit;
    let mut c0 = UNIT_POS_X as usize + kpart * CUBE_DIM_X as usize;
    while c0 < chunks {
        // Loads first (clamped: chunks past the end re-read the last one and are masked below,
        // rows past `n_out` read the last row and are never written).
        #[unroll]
        for g in 0..group {
            let c = (c0 + g * step).min(chunks - 1);
            let xv = x[m * chunks + c];
            #[unroll]
            for j in 0..4usize {
                xf[g * 4 + j] = f32::cast_from(xv.extract(j));
            }
            #[unroll]
            for r in 0..rows {
                let wv = w[(n0 + r).min(n_out - 1) * chunks + c];
                let i = (g * rows + r) * 4;
                #[unroll]
                for j in 0..4usize {
                    wf[i + j] = f32::cast_from(wv.extract(j));
                }
            }
        }
        #[unroll]
        for g in 0..group {
            let valid = c0 + g * step < chunks;
            #[unroll]
            for r in 0..rows {
                let i = (g * rows + r) * 4;
                let p = xf[g * 4] * wf[i]
                    + xf[g * 4 + 1] * wf[i + 1]
                    + xf[g * 4 + 2] * wf[i + 2]
                    + xf[g * 4 + 3] * wf[i + 3];
                acc[r] += if valid { p } else { 0.0f32 };
            }
        }
        c0 += group * step;
    }
    let mut parts = Shared::<[f32]>::new_slice(comptime!(units / 32 * rows));
    #[unroll]
    for r in 0..rows {
        let mut total = lane_sum(acc[r], units, plane);
        if ksplit > 1 {
            if UNIT_POS_X == 0 {
                parts[y_unit * rows + r] = total;
            }
            sync_cube();
            total = 0.0f32;
            #[unroll]
            for j in 0..ksplit {
                total += parts[(y_unit - kpart + j) * rows + r];
            }
        }
        let n = n0 + r;
        if UNIT_POS_X == 0 && kpart == 0 && n < n_out {
            y[m * n_out + n] = W::cast_from(total);
        }
    }
}

/// `x · wᵀ` for `x [M, K]`, `w [N, K]`, in `w`'s dtype.
pub fn linear_launch<R: CubeRuntime>(x: CubeTensor<R>, w: CubeTensor<R>) -> CubeTensor<R> {
    linear_launch_t(x, w, None)
}

/// [`linear_launch`] with `wt` (`w` transposed, `[K, N]`) where the caller holds it: the
/// many-row path reads it instead of transposing `w` (same kernel, same sums).
pub fn linear_launch_t<R: CubeRuntime>(
    x: CubeTensor<R>,
    w: CubeTensor<R>,
    wt: Option<CubeTensor<R>>,
) -> CubeTensor<R> {
    let wd = match w.dtype {
        DType::F32 | DType::BF16 | DType::F16 => w.dtype,
        _ => DType::F32,
    };
    let w = contiguous_as(w, wd);
    if let Some(y) = dense_tiled(&x, &w) {
        return y;
    }
    if let Some(y) = mma::launch(&x, &w) {
        return y;
    }
    let (m, k) = (x.meta.shape()[0], x.meta.shape()[1]);
    let n = w.meta.shape()[0];
    if m > GEMV_MAX_ROWS || k % 4 != 0 {
        type B<R> = CubeBackend<R>;
        let wt = match wt {
            Some(wt) => contiguous_as(wt, wd),
            None => <B<R> as FloatTensorOps<B<R>>>::float_swap_dims(w, 0, 1),
        };
        let wt = <B<R> as FloatTensorOps<B<R>>>::float_reshape(wt, [1, k, n].into());
        let x =
            <B<R> as FloatTensorOps<B<R>>>::float_reshape(contiguous_as(x, wd), [1, m, k].into());
        // The exact kernel whatever the dtype: the router's logits decide experts by margins
        // a reordered bf16 sum can flip.
        let c = launch_with(x, wt, false);
        return <B<R> as FloatTensorOps<B<R>>>::float_reshape(c, [m, n].into());
    }
    let x = float_buf(x);
    let y = empty(&x, [m, n], wd);
    let r = rows_per_unit_row(n, m);
    let ksplit = dense_ksplit(n, m, r);
    let group = gemv_group((k / 4).div_ceil(ksplit), r, DENSE_CHUNK_BUDGET);
    let plane = plane_reduce(&x.client, GEMV_LANES);
    let g = Gemv {
        k,
        n,
        m,
        rows: r,
        group,
        plane,
        ksplit,
    };
    macro_rules! pick {
        ($f:ty) => {
            match wd {
                DType::BF16 => g.go::<$f, burn::tensor::bf16, R>(&x, &w, &y),
                DType::F16 => g.go::<$f, burn::tensor::f16, R>(&x, &w, &y),
                _ => g.go::<$f, f32, R>(&x, &w, &y),
            }
        };
    }
    with_float!(x.dtype, pick);
    y
}

/// `x · wᵀ` on cubek's tiled matmul ([`tiled`], `w` read transposed in place) for rows from
/// [`super::tensor_core::mma`]'s `dense_mm` whose activations are in the weight's type; `None`
/// where that does not apply or the kernel refuses the shape.
fn dense_tiled<R: CubeRuntime>(x: &CubeTensor<R>, w: &CubeTensor<R>) -> Option<CubeTensor<R>> {
    type B<R> = CubeBackend<R>;
    let (m, k) = (x.meta.shape()[0], x.meta.shape()[1]);
    let n = w.meta.shape()[0];
    // Activations in the weight's type only: the router's f32 weight over bf16 activations
    // keeps the exact kernel (a reordered sum can flip its experts).
    if x.dtype != w.dtype || m < super::tensor_core::mma().dense_mm || m < TILED_MIN {
        return None;
    }
    let dtype = w.dtype;
    let x = contiguous_as(x.clone(), dtype);
    let x = <B<R> as FloatTensorOps<B<R>>>::float_reshape(x, [1, m, k].into());
    let w = <B<R> as FloatTensorOps<B<R>>>::float_reshape(w.clone(), [1, n, k].into());
    let wt = <B<R> as FloatTensorOps<B<R>>>::float_swap_dims(w, 1, 2);
    let y = tiled(x, wt, dtype, tiled_kernel())
        .map_err(|e| tiled_refused("dense", &e))
        .ok()?;
    Some(<B<R> as FloatTensorOps<B<R>>>::float_reshape(
        y,
        [m, n].into(),
    ))
}

/// One dense GEMV launch's sizes.
struct Gemv {
    k: usize,
    n: usize,
    m: usize,
    rows: usize,
    group: usize,
    plane: bool,
    ksplit: usize,
}

/// Unit rows per output row of the dense GEMV: the fewest of 1, 2, 4, 8 that give the grid
/// [`DENSE_TARGET_CUBES`] cubes (the router's 128 outputs made 16 cubes of 8 rows: 7.3 µs for
/// 1.4 MB on the H200).
fn dense_ksplit(n: usize, m: usize, rows: usize) -> usize {
    let cubes = |ks: usize| (n * ks).div_ceil(GEMV_ROWS as usize * rows) * m.max(1);
    [1, 2, 4, 8]
        .into_iter()
        .find(|&ks| cubes(ks) >= DENSE_TARGET_CUBES)
        .unwrap_or(GEMV_ROWS as usize)
}

/// Cubes the dense GEMV aims for (one per SM of an H200).
const DENSE_TARGET_CUBES: usize = 128;

impl Gemv {
    fn go<F: Float, W: Float, R: CubeRuntime>(
        &self,
        x: &CubeTensor<R>,
        w: &CubeTensor<R>,
        y: &CubeTensor<R>,
    ) {
        // Safety: `k % 4 == 0` makes every row whole 4-vectors; rows ≥ `n` and slots ≥ `m` are
        // skipped.
        unsafe {
            dense_gemv_kernel::launch_unchecked::<F, W, R>(
                &x.client,
                gemv_count(self.n * self.ksplit, self.m, self.rows),
                gemv_dim(),
                4,
                arg(x),
                arg(w),
                arg(y),
                (self.k / 4) as u32,
                self.n as u32,
                self.m as u32,
                self.rows,
                self.group,
                GEMV_UNITS,
                self.plane,
                self.ksplit,
            )
        }
    }
}

/// Which kernel a batched matmul runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulPath {
    /// [`matmul_kernel()`]: f32 accumulation term by term, every arm's shared exact product.
    Exact,
    /// Burn's tiled matmul (cubek; tensor cores where the device has them, f32 accumulation):
    /// bf16/f16 products of at least [`TILED_MIN`] in `m` and `n` and 16 in `k` (attention
    /// prefill's `Q·Kᵀ` and `P·V`, dense experts over many rows). The f32 arms keep the exact
    /// kernel, so cross-backend parity in f32 is unchanged.
    Tiled,
}

/// The smallest `m` and `n` of a [`MatmulPath::Tiled`] product.
pub const TILED_MIN: usize = 64;

/// The path of a `[m, k] · [k, n]` product (per batch) in `dtype` (pure; tested on the host).
pub fn plan(dtype: DType, m: usize, k: usize, n: usize) -> MatmulPath {
    if matches!(dtype, DType::BF16 | DType::F16) && m >= TILED_MIN && n >= TILED_MIN && k >= 16 {
        MatmulPath::Tiled
    } else {
        MatmulPath::Exact
    }
}

/// Columns per cube.
pub const MATMUL_COLS: u32 = 32;
/// Unit rows splitting K (a power of two).
pub const MATMUL_SPLITS: u32 = 16;
/// Rows of one batch per cube of [`matmul_kernel()`], from [`MATMUL_BLOCK_FROM`] rows in all.
pub const MATMUL_ROWS: usize = 8;
/// Rows (all batches) from which [`matmul_kernel()`]'s cubes take [`MATMUL_ROWS`] rows: below,
/// one row per cube keeps the grid wide (a decode batch's router, 64 rows × 4 column blocks,
/// would shrink to 32 cubes). At 256 rows (the batch-256 decode router, 4 × 32 = 128 cubes) one
/// row per cube read the whole 1.4 MB f32 weight once per row, 71.5 µs a layer on the H100
/// (`docs/PERF.md` §33). That router now runs [`matmul_rows_kernel()`] ([`MATMUL_ROWS_FROM`]);
/// these blocks serve products of 256 rows and more with `n % 4 ≠ 0`.
pub const MATMUL_BLOCK_FROM: usize = 256;
/// Rows (all batches) from which the register-blocked [`matmul_rows_kernel()`] runs (the
/// default of [`set_rows_from`]). The router `2688 → 128` (H100 kernel table, µs a
/// `dense_linear` with its cast and transpose, replayed; PERF §38): at 64 rows 21.8 here
/// ([`matmul_kernel()`], one row a cube) against 46.1 there (8 cubes); at 256 rows 92.3 here
/// (8-row cubes) against **50.3** there (32 cubes of 8 rows).
pub const MATMUL_ROWS_FROM: usize = 256;
/// `k`s of a unit whose loads [`matmul_kernel()`] issues together.
pub const MATMUL_AHEAD: usize = 4;

static ROWS_FROM: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(MATMUL_ROWS_FROM);

/// Rows (all batches) from which the exact matmul runs [`matmul_rows_kernel()`] rather than
/// [`matmul_kernel()`] (both sum in one order, so the choice changes time only). Process-wide;
/// for tests and benchmarks.
pub fn set_rows_from(rows: usize) {
    ROWS_FROM.store(rows, std::sync::atomic::Ordering::Relaxed);
}

/// The setting of [`set_rows_from`].
pub fn rows_from() -> usize {
    ROWS_FROM.load(std::sync::atomic::Ordering::Relaxed)
}

/// Rows per cube of [`matmul_kernel()`] for `bs` batches of `m` rows (pure; the sums do not
/// depend on it).
pub fn block_rows(bs: usize, m: usize) -> usize {
    if m >= MATMUL_ROWS && bs * m >= MATMUL_BLOCK_FROM {
        MATMUL_ROWS
    } else {
        1
    }
}

#[cube(launch)]
pub fn matmul_kernel<F: Float>(
    a: &[F],
    w: &[F],
    c: &mut [F],
    batch: u32,
    m: u32,
    k: u32,
    n: u32,
    #[comptime] cols: usize,
    #[comptime] splits: usize,
    #[comptime] rows: usize,
) {
    let (m, k, n) = (m as usize, k as usize, n as usize);
    let col = CUBE_POS_X as usize * cols + UNIT_POS_X as usize;
    // Blocks of `rows` rows of one batch folded over y and z ([`yz`]); cubes past them leave
    // (uniform per cube).
    let mb = m.div_ceil(rows);
    let r = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    if r >= batch as usize * mb {
        terminate!();
    }
    let row0 = (r % mb) * rows;
    let bb = r / mb;
    let y = UNIT_POS_Y as usize;
    let mut acc = Array::<f32>::new(rows);
    #[unroll]
    for i in 0..rows {
        acc[i] = 0.0f32;
    }
    if col < n {
        // Row and column offsets hoisted out of the K loop: with the index arithmetic inside it
        // (several 64-bit multiplies and a clamp per product) the loop was issue-bound — the
        // prefill router, 2,048 × 2,688 → 128 in f32, took 0.64 ms per layer on the H200.
        let mut arow = Array::<usize>::new(rows);
        #[unroll]
        for i in 0..rows {
            // Rows past the end repeat the last one and are never written.
            arow[i] = (bb * m + (row0 + i).min(m - 1)) * k;
        }
        let wstep = splits * n;
        let mut wi = (bb * k + y) * n + col;
        let mut kk = y;
        // [`MATMUL_AHEAD`] of the unit's `k`s a pass, every load issued before any product (the
        // loop waited on each load in turn: 36 µs for the batch-64 decode router, one row a
        // cube, and 157 µs at batch 256, 8 rows a cube, H100, PERF §38; ≈ 14 and ≈ 84 after);
        // each sum still adds in increasing `k`.
        let ahead = comptime!(MATMUL_AHEAD);
        while kk + (ahead - 1) * splits < k {
            let mut wv = Array::<f32>::new(ahead);
            let mut av = Array::<f32>::new(ahead * rows);
            #[unroll]
            for u in 0..ahead {
                wv[u] = f32::cast_from(w[wi + u * wstep]);
            }
            #[unroll]
            for u in 0..ahead {
                #[unroll]
                for i in 0..rows {
                    av[u * rows + i] = f32::cast_from(a[arow[i] + kk + u * splits]);
                }
            }
            #[unroll]
            for u in 0..ahead {
                #[unroll]
                for i in 0..rows {
                    acc[i] += av[u * rows + i] * wv[u];
                }
            }
            kk += ahead * splits;
            wi += ahead * wstep;
        }
        while kk < k {
            let wv = f32::cast_from(w[wi]);
            #[unroll]
            for i in 0..rows {
                acc[i] += f32::cast_from(a[arow[i] + kk]) * wv;
            }
            kk += splits;
            wi += wstep;
        }
    }
    let mut sm = Shared::<[f32]>::new_slice(cols * splits * rows);
    let x = UNIT_POS_X as usize;
    #[unroll]
    for i in 0..rows {
        sm[(i * splits + y) * cols + x] = acc[i];
    }
    sync_cube();
    // A runtime stride (a comptime one would be folded at expansion time).
    let mut stride = (CUBE_DIM_Y / 2) as usize;
    while stride > 0 {
        if y < stride {
            #[unroll]
            for i in 0..rows {
                let at = (i * splits + y) * cols + x;
                sm[at] = sm[at] + sm[at + stride * cols];
            }
        }
        sync_cube();
        stride /= 2;
    }
    if y == 0 && col < n {
        #[unroll]
        for i in 0..rows {
            if row0 + i < m {
                c[(bb * m + row0 + i) * n + col] = F::cast_from(sm[i * splits * cols + x]);
            }
        }
    }
}

/// Rows of one batch per cube of [`matmul_rows_kernel()`] (8 where 16 would leave fewer than
/// [`MATMUL_TILE_CUBES`] cubes).
pub const MATMUL_TILE_ROWS: usize = 16;
/// Cubes of 16 rows below which [`matmul_rows_kernel()`] takes 8 rows per cube: the router
/// at 1,024 rows ran 64 cubes on the H200's 132 SMs, 0.176 ms as at 2,048 rows (PERF §17).
pub const MATMUL_TILE_CUBES: usize = 264;

/// Rows per cube of [`matmul_rows_kernel()`] for `bs` batches of `m` rows (the sums do not
/// depend on it).
pub fn tile_rows(bs: usize, m: usize) -> usize {
    if bs * m.div_ceil(MATMUL_TILE_ROWS) < MATMUL_TILE_CUBES {
        8
    } else {
        MATMUL_TILE_ROWS
    }
}
/// Columns per cube of [`matmul_rows_kernel()`]: 32 lanes × 4.
pub const MATMUL_TILE_COLS: usize = 128;
/// Output rows per pass of [`matmul_rows_kernel()`]'s split sum: its buffer, splits × rows ×
/// 128 f32 (8 KB), shares memory with the two staged `a` buffers (8.7 KB), within wgpu's 16 KB
/// of workgroup memory.
const MATMUL_SLAB: usize = 1;

/// [`matmul_kernel()`]'s products in its order, register-blocked for many rows: a cube takes
/// [`MATMUL_TILE_ROWS`] rows × 128 columns, a unit 16 rows × 4 columns (64 sums) of its split
/// `y` (`k ≡ y mod splits`, in increasing `k`, then the same tree over the splits), so one
/// 16-byte load of `w` feeds 64 products; the rows' `a` values for a stage of `4 · splits` `k`s
/// are staged in shared memory (`[k][row]`, padded to 17 per `k` against bank conflicts), read
/// as warp broadcasts; two stage buffers, the next stage's `a` and `w` loaded while this
/// stage's products run, one barrier per stage (a cube is 32 lanes × `splits`). [`matmul_kernel()`] re-read the same `w` column per 8 rows and issued one
/// global load of `a` per product: the prefill router (2,048 × 2,688 → 128, f32) ran at
/// 2.2 TFLOP/s (PERF §16). Needs `n % 4 == 0`.
#[cube(launch_unchecked)]
pub fn matmul_rows_kernel<F: Float, NV: Size>(
    a: &[F],
    w: &[Vector<F, NV>],
    c: &mut [F],
    batch: u32,
    m: u32,
    k: u32,
    n: u32,
    #[comptime] splits: usize,
    #[comptime] rows: usize,
    #[comptime] slab: usize,
) {
    let (m, k, n) = (m as usize, k as usize, n as usize);
    let nv = n / 4;
    let x = UNIT_POS_X as usize;
    let y = UNIT_POS_Y as usize;
    let lanes = CUBE_DIM_X as usize;
    let cv = CUBE_POS_X as usize * lanes + x;
    let mb = m.div_ceil(rows);
    let r = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    if r >= batch as usize * mb {
        terminate!();
    }
    let row0 = (r % mb) * rows;
    let bb = r / mb;
    let mut acc = Array::<f32>::new(rows * 4);
    #[unroll]
    for i in 0..rows * 4 {
        acc[i] = 0.0f32;
    }
    // Columns past `n` read the last vector and are never written.
    let wcol = bb * k * nv + cv.min(nv - 1);
    let stage = comptime!(splits * 4);
    let pitch = comptime!(rows + 1);
    let half = comptime!(splits * 4 * (rows + 1));
    // Two stage buffers, then (after the K loop) the split sums' buffer in the same memory.
    let mut sa = Shared::<[f32]>::new_slice(comptime!(
        (2 * splits * 4 * (rows + 1)).max(splits * slab * MATMUL_TILE_COLS)
    ));
    let t = y * lanes + x;
    // Staging: unit `t` takes `k` offset `t % stage` of rows `t / stage + p · threads / stage`
    // (lanes along `k`: coalesced reads); rows past `m` repeat the last one, never written.
    let threads = comptime!(32 * splits);
    let per = comptime!(splits * 4 * rows / (32 * splits));
    let kq0 = t % stage;
    let mut arow = Array::<usize>::new(per);
    let mut aat = Array::<usize>::new(per);
    #[unroll]
    for p in 0..per {
        let i = t / stage + p * comptime!(threads / (splits * 4));
        arow[p] = (bb * m + (row0 + i).min(m - 1)) * k;
        aat[p] = kq0 * pitch + i;
    }
    let mut av = Array::<f32>::new(per);
    let mut wc = Array::<Vector<F, NV>>::new(4usize);
    let mut wn = Array::<Vector<F, NV>>::new(4usize);
    // Stage 0 into buffer 0.
    #[unroll]
    for p in 0..per {
        av[p] = if kq0 < k {
            f32::cast_from(a[arow[p] + kq0])
        } else {
            0.0f32
        };
        sa[aat[p]] = av[p];
    }
    #[unroll]
    for j in 0..4usize {
        wc[j] = w[wcol + (y + j * splits).min(k - 1) * nv];
    }
    sync_cube();
    let mut off = 0usize;
    let mut k0 = 0usize;
    while k0 < k {
        // The next stage's `a` and `w` (past `k`: zeros or clamped reads, never used) are in
        // flight while this stage's products run; one barrier per stage.
        let kn = k0 + stage;
        #[unroll]
        for p in 0..per {
            let kg = kn + kq0;
            av[p] = if kg < k {
                f32::cast_from(a[arow[p] + kg])
            } else {
                0.0f32
            };
        }
        #[unroll]
        for j in 0..4usize {
            wn[j] = w[wcol + (kn + y + j * splits).min(k - 1) * nv];
        }
        #[unroll]
        for j in 0..4usize {
            let kq = y + j * splits;
            // Uniform per warp (a warp is one `y`).
            if k0 + kq < k {
                let wv = wc[j];
                let w0 = f32::cast_from(wv.extract(0));
                let w1 = f32::cast_from(wv.extract(1));
                let w2 = f32::cast_from(wv.extract(2));
                let w3 = f32::cast_from(wv.extract(3));
                let base = off + kq * pitch;
                #[unroll]
                for i in 0..rows {
                    let v = sa[base + i];
                    acc[i * 4] += v * w0;
                    acc[i * 4 + 1] += v * w1;
                    acc[i * 4 + 2] += v * w2;
                    acc[i * 4 + 3] += v * w3;
                }
            }
        }
        // The other buffer was last read in the previous stage, before its barrier.
        let other = half - off;
        #[unroll]
        for p in 0..per {
            sa[other + aat[p]] = av[p];
        }
        #[unroll]
        for j in 0..4usize {
            wc[j] = wn[j];
        }
        sync_cube();
        off = other;
        k0 = kn;
    }
    // The splits' partial sums, `slab` rows at a time: each unit then sums one output's
    // partials over the same tree as [`matmul_kernel()`] (stride splits/2, …, 1).
    let cols = lanes * 4;
    let oi = t / cols;
    let oc = t % cols;
    let col = CUBE_POS_X as usize * cols + oc;
    #[unroll]
    for s in 0..rows / slab {
        #[unroll]
        for i in 0..slab {
            #[unroll]
            for q in 0..4usize {
                sa[(y * slab + i) * cols + x * 4 + q] = acc[(s * slab + i) * 4 + q];
            }
        }
        sync_cube();
        if oi < slab {
            let mut st = (CUBE_DIM_Y / 2) as usize;
            while st > 0 {
                let mut yy = 0usize;
                while yy < st {
                    let at = (yy * slab + oi) * cols + oc;
                    sa[at] = sa[at] + sa[at + st * slab * cols];
                    yy += 1;
                }
                st /= 2;
            }
            let row = row0 + s * slab + oi;
            if row < m && col < n {
                c[(bb * m + row) * n + col] = F::cast_from(sa[oi * cols + oc]);
            }
        }
        sync_cube();
    }
}

/// `c = a · b` batched (`[B, M, K] · [B, K, N]`), on the path [`plan`] picks.
pub fn launch<R: CubeRuntime>(a: CubeTensor<R>, b: CubeTensor<R>) -> CubeTensor<R> {
    launch_with(a, b, true)
}

/// [`launch`], with `tiled: false` forcing the exact kernel.
fn launch_with<R: CubeRuntime>(a: CubeTensor<R>, b: CubeTensor<R>, tiled: bool) -> CubeTensor<R> {
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
    if tiled && plan(dtype, m, k, n) == MatmulPath::Tiled {
        use burn_cubecl::kernel::matmul::{matmul, MatmulStrategy};
        if let Ok(c) = matmul(a.clone(), b.clone(), None, MatmulStrategy::Cube, dtype) {
            return contiguous_as(c, out_dtype);
        }
    }
    let c = empty(&a, [bs, m, n], dtype);
    if n % 4 == 0 && m >= MATMUL_TILE_ROWS && bs * m >= rows_from() {
        let rows = tile_rows(bs, m);
        let (gy, gz) = yz(bs * m.div_ceil(rows));
        let count = CubeCount::Static(n.div_ceil(MATMUL_TILE_COLS) as u32, gy, gz);
        let dim = CubeDim::new_2d(MATMUL_TILE_COLS as u32 / 4, MATMUL_SPLITS);
        macro_rules! go {
            ($t:ty) => {
                // Safety: `n % 4 == 0` makes `b`'s rows whole 4-vectors; reads are clamped
                // into the buffers and writes guarded by `m` and `n`.
                unsafe {
                    matmul_rows_kernel::launch_unchecked::<$t, R>(
                        &a.client,
                        count,
                        dim,
                        4,
                        arg(&a),
                        arg(&b),
                        arg(&c),
                        bs as u32,
                        m as u32,
                        k as u32,
                        n as u32,
                        MATMUL_SPLITS as usize,
                        rows,
                        MATMUL_SLAB,
                    )
                }
            };
        }
        with_float!(dtype, go);
        return contiguous_as(c, out_dtype);
    }
    let rows = block_rows(bs, m);
    let (gy, gz) = yz(bs * m.div_ceil(rows));
    let count = CubeCount::Static(n.div_ceil(MATMUL_COLS as usize) as u32, gy, gz);
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
                bs as u32,
                m as u32,
                k as u32,
                n as u32,
                MATMUL_COLS as usize,
                MATMUL_SPLITS as usize,
                rows,
            )
        };
    }
    with_float!(dtype, go);
    contiguous_as(c, out_dtype)
}

/// Which of cubek's tiled matmul kernels [`tiled`] runs (`mmk=` in the kernel settings): its
/// simple cyclic kernel on `cmma` (what cubek's `Auto` runs first) or `mma`, one of its
/// pipelined forms on `mma`, with the arguments Burn's autotune list gives them, or its unit
/// kernel (no tensor cores: every device, lavapipe included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TiledKernel {
    SimpleCmma,
    Unit,
    Simple,
    Ordered,
    Double,
    DoubleSpecialized,
    Specialized,
    Tma,
    SpecializedTma,
}

impl TiledKernel {
    /// Every kernel with its settings name.
    pub const ALL: [(&'static str, TiledKernel); 9] = [
        ("simplecmma", TiledKernel::SimpleCmma),
        ("unit", TiledKernel::Unit),
        ("simple", TiledKernel::Simple),
        ("ordered", TiledKernel::Ordered),
        ("double", TiledKernel::Double),
        ("doublespec", TiledKernel::DoubleSpecialized),
        ("spec", TiledKernel::Specialized),
        ("tma", TiledKernel::Tma),
        ("spectma", TiledKernel::SpecializedTma),
    ];

    /// The kernel called `name` in [`Self::ALL`].
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|&(_, k)| k)
    }

    /// The settings name of this kernel.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, k)| *k == self)
            .map_or("?", |(n, _)| n)
    }

    fn strategy(self) -> cubek::matmul::strategy::Strategy {
        use cubek::matmul::components::tile::TileMatmulKind::{Cmma, Mma};
        use cubek::matmul::routines::batch::{
            double_buffering::DoubleBufferingArgs, ordered_double_buffering::OrderedSelectionArgs,
            simple::SimpleArgs,
        };
        use cubek::matmul::routines::BlueprintStrategy::Inferred;
        use cubek::matmul::strategy::Strategy as S;
        let simple = |tile_matmul| SimpleArgs {
            multi_rows: true,
            tile_matmul,
        };
        match self {
            TiledKernel::SimpleCmma => S::SimpleCyclicCmma(Inferred(SimpleArgs {
                multi_rows: false,
                tile_matmul: Cmma,
            })),
            TiledKernel::Unit => S::SimpleUnit(Default::default()),
            TiledKernel::Simple => S::SimpleCyclicMma(Inferred(simple(Mma))),
            TiledKernel::Ordered => S::OrderedDoubleMma(Inferred(OrderedSelectionArgs {
                partition_k: Some(2),
                row_count: Some(8),
                rows_per_plane: Some(2),
                tile_matmul: Mma,
            })),
            TiledKernel::Double => S::DoubleCyclicMma(Inferred(DoubleBufferingArgs {
                specialized: false,
                tile_matmul: Mma,
            })),
            TiledKernel::DoubleSpecialized => S::DoubleCyclicMma(Inferred(DoubleBufferingArgs {
                specialized: true,
                tile_matmul: Mma,
            })),
            TiledKernel::Specialized => S::SpecializedCyclicMma(Inferred(().into())),
            TiledKernel::Tma => S::SimpleTmaMma(Inferred(simple(Mma))),
            TiledKernel::SpecializedTma => S::SpecializedTmaMma(Inferred(().into())),
        }
    }
}

/// Says once per process that a path a setting asked for ([`tiled`]'s) was refused and the
/// call ran on the next path.
pub(crate) fn tiled_refused(path: &str, e: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ONCE.call_once(|| {
        eprintln!("nemotron: the {path} path on cubek's tiled matmul was refused ({e}); running the next path")
    });
}

static REFUSED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many calls a setting sent to [`tiled`] ran on the next path instead (the kernel refused
/// them), since the process started: tests check that the path they force did run.
pub fn tiled_refusals() -> usize {
    REFUSED.load(std::sync::atomic::Ordering::Relaxed)
}

static TILED_KERNEL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Sets the kernel [`tiled`] runs when asked for the current one (process-wide; for benchmarks).
pub fn set_tiled_kernel(k: TiledKernel) {
    let i = TiledKernel::ALL
        .iter()
        .position(|(_, t)| *t == k)
        .unwrap_or(0);
    TILED_KERNEL.store(i, std::sync::atomic::Ordering::Relaxed);
}

/// The kernel of [`set_tiled_kernel`] (default [`TiledKernel::SimpleCmma`]).
pub fn tiled_kernel() -> TiledKernel {
    TiledKernel::ALL[TILED_KERNEL.load(std::sync::atomic::Ordering::Relaxed)].1
}

static TILED_F32: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether the decoded path's products come out of [`tiled`] in f32 (the default: one rounding,
/// after the scales) or in the activation type (`mmacc=act`: half the bytes written and read
/// back, the sum rounded once more before the scales). Process-wide; for benchmarks.
pub fn set_tiled_f32(on: bool) {
    TILED_F32.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The output type choice of [`set_tiled_f32`].
pub fn tiled_f32() -> bool {
    TILED_F32.load(std::sync::atomic::Ordering::Relaxed)
}

fn storage(d: DType) -> cubecl::ir::StorageType {
    use cubecl::ir::{ElemType, FloatKind, StorageType};
    StorageType::Scalar(ElemType::Float(match d {
        DType::BF16 => FloatKind::BF16,
        DType::F16 => FloatKind::F16,
        _ => FloatKind::F32,
    }))
}

/// `a [1, M, K] · b [1, K, N]` (`b` may be a transposed view) on cubek's tiled matmul `kernel`
/// (f32 accumulation), written as `out_dtype`; the kernel's refusal (a shape or a device it
/// does not take) comes back as text, never a panic.
pub fn tiled<R: CubeRuntime>(
    a: CubeTensor<R>,
    b: CubeTensor<R>,
    out_dtype: DType,
    kernel: TiledKernel,
) -> Result<CubeTensor<R>, String> {
    use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
    use cubek::std::InputBinding;
    let (sa, sb) = (a.meta.shape().clone(), b.meta.shape().clone());
    if sa.num_dims() != 3 || sb.num_dims() != 3 || sa[2] != sb[1] || sa[0] != sb[0] {
        return Err(format!("tiled matmul: shapes {sa:?} · {sb:?}"));
    }
    // Tensor cores multiply f32 as TF32 (10 mantissa bits: ≈ 1e-3 relative, where an f32 model
    // is held to 1e-5 of HF's f32): an f32 product runs on the unit kernel or the next path.
    if kernel != TiledKernel::Unit && (a.dtype == DType::F32 || b.dtype == DType::F32) {
        return Err(format!(
            "cubek {}: f32 inputs would be multiplied as TF32",
            kernel.name()
        ));
    }
    let out = empty(&a, [sa[0], sa[1], sb[2]], out_dtype);
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: storage(a.dtype),
        rhs: storage(b.dtype),
        out: storage(out_dtype),
    });
    let client = a.client.clone();
    let (da, db) = (storage(a.dtype), storage(b.dtype));
    cubek::matmul::launch::launch_ref(
        &kernel.strategy(),
        &client,
        InputBinding::new(a.binding(), da),
        InputBinding::new(b.binding(), db),
        out.clone().binding(),
        &mut dtypes,
    )
    .map_err(|e| format!("cubek {}: {e:?}", kernel.name()))?;
    Ok(out)
}
