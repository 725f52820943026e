//! The dense bf16 linear `y = x · wᵀ` on the tensor cores (CUDA `mma.sync`): the attention
//! projections and the shared dense linears over a batch of rows. A warp computes a 16-row
//! output tile for 8 tokens per `mma` with the weights as the `A` operand, as the quantized
//! linears' kernels do ([`super::super::linear::mma`]'s docs: the K order within a lane's 16-byte
//! chunk); bf16 needs no decode, so both operands are fed as loaded. Sizes, settings and the
//! K-split sum come from [`super::super::tensor_core`].

use super::super::buffers::{arg, contiguous_as, empty, handle_arg, yz};
use super::super::tensor_core::{
    block_end, blocks, chunk_load, m_split, mma, sms, tiles, tuning, warp_sum_m, warps,
};
use burn::tensor::{bf16, DType};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

/// `y[m, n] = Σ_j W[n, j] · x[m, j]` on the tensor cores, bf16 weights and activations (the
/// attention projections over a batch). Both are read as u32 words of two bf16 values: step `h`
/// of a lane's 16-byte chunk (8 inputs) takes words `2h, 2h + 1` as they are, for `A` and `B`.
/// One 16-row tile per cube, `kw` warps splitting K, `grp` 32-input steps loaded at once.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn dense_mma_kernel<NW: Size>(
    x: &[Vector<u32, NW>],
    w: &[Vector<u32, NW>],
    y: &mut [bf16],
    k: u32,
    n_out: u32,
    tokens: u32,
    block: u32,
    #[comptime] nt: usize,
    #[comptime] kw: usize,
    #[comptime] grp: usize,
    #[comptime] pipe: bool,
    #[comptime] mw: usize,
) {
    let count = tokens as usize;
    let first = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize * block as usize;
    let end = block_end(first, block, count);
    let (n_out, k) = (n_out as usize, k as usize);
    // `mw` warps take `mw` row tiles side by side (each walking all of K when `kw == 1`): they
    // read the same activations at about the same time, so `mw - 1` of every `mw` reads hit L1.
    if CUBE_POS_X as usize * mw * 16 >= n_out || first >= end {
        terminate!();
    }
    let (lane, warp_) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    // A tile past `n_out` computes clamped rows and writes nothing (every warp stays for the
    // cube's barriers).
    let (warp, tile) = (warp_ / mw, (CUBE_POS_X as usize * mw + warp_ % mw) * 16);
    let (g, t) = (lane / 4, lane % 4);
    let row0 = (tile + g).min(n_out - 1);
    let row1 = (tile + g + 8).min(n_out - 1);
    let chunks = k / 8;
    let iters = chunks.div_ceil(4);
    let def = MmaDefinition::<bf16, bf16, f32>::new(16usize, 8usize, 16usize);
    let mut pass = first;
    while pass < end {
        let mut xrow = Array::<usize>::new(nt);
        let mut acc = Array::<Vector<f32, Const<2>>>::new(nt * 2);
        #[unroll]
        for j in 0..nt {
            xrow[j] = (pass + j * 8 + g).min(count - 1) * chunks;
            acc[2 * j] = Vector::new(0.0f32);
            acc[2 * j + 1] = Vector::new(0.0f32);
        }
        let step = kw * grp;
        let mut it0 = warp * grp;
        // `pipe`: the next step's loads are issued before this step's `mma`s.
        let mut na = Array::<Vector<u32, NW>>::new(grp);
        let mut nb_ = Array::<Vector<u32, NW>>::new(grp);
        if pipe {
            chunk_load(w, row0, row1, chunks, it0, t, &mut na, &mut nb_, grp);
        }
        while it0 < iters {
            let mut wa = Array::<Vector<u32, NW>>::new(grp);
            let mut wb = Array::<Vector<u32, NW>>::new(grp);
            if pipe {
                #[unroll]
                for q in 0..grp {
                    wa[q] = na[q];
                    wb[q] = nb_[q];
                }
                chunk_load(w, row0, row1, chunks, it0 + step, t, &mut na, &mut nb_, grp);
            } else {
                chunk_load(w, row0, row1, chunks, it0, t, &mut wa, &mut wb, grp);
            }
            #[unroll]
            for q in 0..grp {
                let c = (it0 + q) * 4 + t;
                let cc = c.min(chunks - 1);
                // Chunks past the row's end weigh nothing (+0 · x).
                let z = if c < chunks { 0xFFFF_FFFFu32 } else { 0u32 };
                let (va, vb) = (wa[q], wb[q]);
                #[unroll]
                for h in 0..2usize {
                    let mut ra = Array::<Vector<bf16, Const<2>>>::new(4usize);
                    ra[0] = Vector::<bf16, Const<2>>::reinterpret(va.extract(2 * h) & z);
                    ra[1] = Vector::<bf16, Const<2>>::reinterpret(vb.extract(2 * h) & z);
                    ra[2] = Vector::<bf16, Const<2>>::reinterpret(va.extract(2 * h + 1) & z);
                    ra[3] = Vector::<bf16, Const<2>>::reinterpret(vb.extract(2 * h + 1) & z);
                    #[unroll]
                    for j in 0..nt {
                        let xv = x[xrow[j] + cc];
                        let mut rb = Array::<Vector<bf16, Const<2>>>::new(2usize);
                        rb[0] = Vector::<bf16, Const<2>>::reinterpret(xv.extract(2 * h));
                        rb[1] = Vector::<bf16, Const<2>>::reinterpret(xv.extract(2 * h + 1));
                        let mut cr = Array::<Vector<f32, Const<2>>>::new(2usize);
                        cr[0] = acc[2 * j];
                        cr[1] = acc[2 * j + 1];
                        def.execute_inplace(&ra, &rb, &mut cr);
                        acc[2 * j] = cr[0];
                        acc[2 * j + 1] = cr[1];
                    }
                }
            }
            it0 += step;
        }
        warp_sum_m(&mut acc, nt, kw, mw);
        if warp == 0 {
            #[unroll]
            for j in 0..nt {
                #[unroll]
                for v in 0..2usize {
                    let n = tile + g + 8 * v;
                    #[unroll]
                    for i in 0..2usize {
                        let tok = pass + j * 8 + 2 * t + i;
                        if n < n_out && tok < count {
                            y[tok * n_out + n] = bf16::cast_from(acc[2 * j + v].extract(i));
                        }
                    }
                }
            }
        }
        pass += nt * 8;
    }
}

/// The tensor-core launch of a dense bf16 linear `x [M, K] · w [N, K]ᵀ`, where it applies (both
/// bf16, `k % 8 == 0`, CUDA `mma`, enough rows): `None` otherwise.
pub(crate) fn launch<R: CubeRuntime>(
    x: &CubeTensor<R>,
    w: &CubeTensor<R>,
) -> Option<CubeTensor<R>> {
    let (m, k) = (x.meta.shape()[0], x.meta.shape()[1]);
    let n = w.meta.shape()[0];
    let bf16_mma = cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::BF16).into();
    if x.dtype != DType::BF16
        || w.dtype != DType::BF16
        || k % 8 != 0
        || m < mma().dense
        || !crate::cube::tuning::mma_supported(&x.client, bf16_mma, 16)
    {
        return None;
    }
    let x = contiguous_as(x.clone(), DType::BF16);
    let w = contiguous_as(w.clone(), DType::BF16);
    let y = empty(&x, [m, n], DType::BF16);
    let nt = tiles(m);
    let (block, nblocks) = blocks(m, nt);
    let kw = warps(
        n.div_ceil(16) * nblocks,
        (k / 8).div_ceil(4),
        tuning().group,
        sms(&x.client),
    );
    let (kw, mw) = m_split(kw, tuning().m_warps);
    let (gy, gz) = yz(nblocks);
    // Safety: both buffers are contiguous bf16 of `m · k` and `n · k` values, read as `· / 2` u32
    // words in 16-byte vectors (`k % 8 == 0`); tokens and rows past the ends are clamped and never
    // written.
    unsafe {
        dense_mma_kernel::launch_unchecked::<R>(
            &x.client,
            CubeCount::Static(n.div_ceil(16 * mw) as u32, gy, gz),
            CubeDim::new_2d(32, (kw * mw) as u32),
            4,
            handle_arg(&x.handle, m * k / 2),
            handle_arg(&w.handle, n * k / 2),
            arg(&y),
            k as u32,
            n as u32,
            m as u32,
            block as u32,
            nt,
            kw,
            tuning().group,
            tuning().pipe,
            mw,
        )
    };
    Some(y)
}
