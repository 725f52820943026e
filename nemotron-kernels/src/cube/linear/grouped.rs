//! Routed NVFP4 experts for batches, expert-major: the routing slots are grouped by expert on the
//! device ([`moe_group_kernel()`]), then each cube of [`nvfp4_grouped_kernel()`] takes one expert
//! and a block of its output rows and applies every decoded weight chunk to all of that expert's
//! slots, `mt` at a time. The slot-major GEMV decodes each weight once per slot routed to it; at
//! batch 16 (96 slots over ≈ 70 experts) and more that decode is the cost, not the bytes.
//!
//! Same math as the slot-major kernel: each slot's dot product runs over the same chunks in the
//! same order, with the same per-chunk sums and lane reduction (the ops tests compare the two).
//!
//! Grid of the GEMV: x = blocks of [`super::dispatch::GEMV_ROWS`] output rows (one per unit row),
//! y = experts; a cube whose expert has no slot leaves at once.

use super::dispatch::{gemv_dim, plane_reduce, GEMV_LANES, GEMV_UNITS};
use super::{e4m3, e2m1_quarter, epilogue, lane_sum, Call};
use crate::cube::buffers::{arg, empty, with_float};
use crate::Nvfp4Weights;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

/// Routed slots from which the expert-major path runs (below it the slot-major GEMV reads each
/// routed expert once anyway: at batch 1 and 2 almost every slot has its own expert).
pub const GROUPED_MIN_SLOTS: usize = 16;

/// Groups `pairs` routing slots by expert: `counts[e]` = slots routed to `e`, `members[e · pairs
/// ..]` = those slots in increasing order. One cube; the ids are staged in shared memory and each
/// unit scans them for its experts (`e ≡ unit mod units`). Ids outside `0..n_experts` join no
/// group (their slots are never written, as in the slot-major kernels' contract).
#[cube(launch)]
pub fn moe_group_kernel(
    experts: &[i32],
    counts: &mut [u32],
    members: &mut [u32],
    n_experts: u32,
    #[comptime] pairs: usize,
) {
    let mut ids = Shared::<[i32]>::new_slice(pairs);
    let u = UNIT_POS as usize;
    let mut i = u;
    while i < pairs {
        ids[i] = experts[i];
        i += CUBE_DIM as usize;
    }
    sync_cube();
    let mut e = u;
    while e < n_experts as usize {
        let mut c = 0usize;
        for p in 0..pairs {
            if ids[p] == e as i32 {
                members[e * pairs + c] = p as u32;
                c += 1;
            }
        }
        counts[e] = c as u32;
        e += CUBE_DIM as usize;
    }
}

/// `Σ_j wd[base + j] · xs[base + j]` over 8 values, in the order of the slot-major kernel's
/// `word_dot`.
#[cube]
fn wd_dot(wd: &Array<f32>, xs: &Array<f32>, #[comptime] base: usize) -> f32 {
    let mut p = wd[base] * xs[base];
    #[unroll]
    for j in 1..8usize {
        p += wd[base + j] * xs[base + j];
    }
    p
}

/// `y[s, n] = epi(gs[e] · Σ_b s_e[n, b] · Σ_j E2M1[code_e(n, 16b + j)] · x[s / div, 16b + j])` for
/// every slot `s` of expert `e` (`members`), `mt` slots per pass over the row.
#[cube(launch_unchecked)]
pub fn nvfp4_grouped_kernel<F: Float, NX: Size, NW: Size>(
    x: &[Vector<F, NX>],
    counts: &[u32],
    members: &[u32],
    packed: &[Vector<u32, NW>],
    scales: &[u32],
    globals: &[f32],
    y: &mut [F],
    k: u32,
    n_out: u32,
    pairs: u32,
    div: u32,
    #[comptime] mt: usize,
    #[comptime] units: usize,
    #[comptime] plane: bool,
    #[comptime] relu2: bool,
) {
    let e = CUBE_POS_Y as usize;
    let count = counts[e] as usize;
    // Uniform per cube: the lane reductions below stay uniform.
    if count == 0 {
        terminate!();
    }
    let (n_out, k, pairs) = (n_out as usize, k as usize, pairs as usize);
    let n = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
    // Rows past the end compute on the last row and are never written.
    let row = e * n_out + n.min(n_out - 1);
    let (chunks, nb) = (k / 32, k / 16);
    // The codes are read as value / 4.
    let g = globals[e] * 4.0f32;
    let mut acc = Array::<f32>::new(mt);
    let mut xr = Array::<usize>::new(mt);
    let mut wd = Array::<f32>::new(32usize);
    let mut xs = Array::<f32>::new(32usize);
    let mut mb = 0usize;
    while mb < count {
        #[unroll]
        for m in 0..mt {
            acc[m] = 0.0f32;
            // Past the group's end: its last slot again (computed, never written).
            xr[m] = members[e * pairs + (mb + m).min(count - 1)] as usize / div as usize;
        }
        let mut c = UNIT_POS_X as usize;
        while c < chunks {
            let wv = packed[row * chunks + c];
            let si = row * nb + c * 2;
            let sw = scales[si / 4] >> (((si % 4) * 8) as u32);
            let (s0, s1) = (e4m3(sw & 255u32), e4m3((sw >> 8u32) & 255u32));
            #[unroll]
            for w in 0..4usize {
                let word = wv.extract(w);
                #[unroll]
                for j in 0..8usize {
                    wd[w * 8 + j] = e2m1_quarter(word, j as u32);
                }
            }
            #[unroll]
            for m in 0..mt {
                // The slot-major kernel's sums: two blocks of 16, each scaled once.
                let xb = (xr[m] * k + c * 32) / 4;
                #[unroll]
                for v in 0..8usize {
                    let xv = x[xb + v];
                    #[unroll]
                    for j in 0..4usize {
                        xs[v * 4 + j] = f32::cast_from(xv.extract(j));
                    }
                }
                let p0 = wd_dot(&wd, &xs, 0usize) + wd_dot(&wd, &xs, 8usize);
                let p1 = wd_dot(&wd, &xs, 16usize) + wd_dot(&wd, &xs, 24usize);
                acc[m] += p0 * s0 + p1 * s1;
            }
            c += CUBE_DIM_X as usize;
        }
        #[unroll]
        for m in 0..mt {
            let total = lane_sum(acc[m], units, plane);
            if UNIT_POS_X == 0 && n < n_out && mb + m < count {
                let s = members[e * pairs + mb + m] as usize;
                y[s * n_out + n] = F::cast_from(epilogue(total * g, relu2));
            }
        }
        mb += mt;
    }
}

/// The expert-major launch for a routed call of [`GROUPED_MIN_SLOTS`]+ slots with `k % 32 == 0`:
/// the grouping kernel, then the GEMV over `(row block, expert)` cubes. Returns `None` where it
/// does not apply.
pub(crate) fn launch<R: CubeRuntime>(
    c: &Call<R>,
    w: &Nvfp4Weights<CubeBackend<R>>,
) -> Option<CubeTensor<R>> {
    if !c.routed || c.slots < GROUPED_MIN_SLOTS || c.k % 32 != 0 {
        return None;
    }
    let experts = c.experts.as_ref()?;
    let n_experts = w.shape.experts;
    let client = &c.x.client;
    let counts = empty(&c.x, [n_experts], DType::U32);
    let members = empty(&c.x, [n_experts * c.slots], DType::U32);
    moe_group_kernel::launch::<R>(
        client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(256),
        arg(experts),
        arg(&counts),
        arg(&members),
        n_experts as u32,
        c.slots,
    );
    // Slots per pass: more once an expert holds two or more slots on average.
    let mt = if c.slots >= 2 * n_experts { 8 } else { 4 };
    let plane = plane_reduce(client, GEMV_LANES);
    let blocks = c.n.div_ceil(super::dispatch::GEMV_ROWS as usize) as u32;
    macro_rules! go {
        ($t:ty) => {
            // Safety: `k % 32 == 0` makes the activation rows and weight chunks whole vectors;
            // members are slots `< pairs` written by the grouping kernel (so `s / div` is a row
            // of `x`); rows ≥ `n_out` are clamped and never written.
            unsafe {
                nvfp4_grouped_kernel::launch_unchecked::<$t, R>(
                    client,
                    CubeCount::Static(blocks, n_experts as u32, 1),
                    gemv_dim(),
                    4,
                    4,
                    arg(&c.x),
                    arg(&counts),
                    arg(&members),
                    arg(&w.packed),
                    arg(&w.scales),
                    arg(&w.globals),
                    arg(&c.y),
                    c.k as u32,
                    c.n as u32,
                    c.slots as u32,
                    c.div as u32,
                    mt,
                    GEMV_UNITS,
                    plane,
                    c.relu2,
                )
            }
        };
    }
    with_float!(c.dtype, go);
    Some(c.y.clone())
}
