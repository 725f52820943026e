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
use super::{e4m3, epilogue, hw_decode, lane_sum, word_dot, word_dot_f16, Call};
use crate::cube::buffers::{arg, empty, with_float};
use crate::Nvfp4Weights;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Routed slots from which the expert-major path runs: off by default — its first version measured
/// 896 µs for 96 slots over 83 experts (2688→1856) on the H200 against the slot-major GEMV's
/// 232 µs (few slots per expert, and one chunk in flight per lane); this version is measured by
/// `bench --kernels` both ways before it is turned on. [`set_grouped_min_slots`] changes it.
pub const GROUPED_MIN_SLOTS: usize = usize::MAX;

// A lane holds its whole share of a row: `group ≤ 4` chunks, `in` ≤
// `super::plan::EXPERT_MAJOR_MAX_K` (the plan keeps larger calls off this path).

static MIN_SLOTS: AtomicUsize = AtomicUsize::new(GROUPED_MIN_SLOTS);

/// Sets the routed-slot count from which NVFP4 experts run expert-major (process-wide; for
/// benchmarks and tests).
pub fn set_grouped_min_slots(slots: usize) {
    MIN_SLOTS.store(slots, Ordering::Relaxed);
}

/// The routed-slot count from which NVFP4 experts run expert-major.
pub fn grouped_min_slots() -> usize {
    MIN_SLOTS.load(Ordering::Relaxed)
}

/// Units of [`moe_group_kernel()`]'s cube at most (fewer where the device allows fewer).
pub const GROUP_UNITS_MAX: usize = 1024;

/// Groups `pairs` routing slots by expert: `counts[e]` = slots routed to `e`, `members[e · pairs
/// ..]` = those slots in increasing order, `counts[E + e] = e · pairs` (where they start, the
/// layout of [`crate::cube::moe::group`]). One cube of `units` units (a power of two); the ids are
/// staged in shared memory. Each expert takes `parts` units (the most, a power of two, that the
/// experts leave: 8 for 128 experts on 1,024 units), unit `h` of them over the `h`-th of `parts`
/// consecutive spans of the slots: it counts its span's slots of the expert, then writes them
/// after the earlier spans' counts — the members stay in increasing order. (One unit per expert
/// scanning every slot took 8.1 µs for the batch-64 decode's 384 slots, H100, PERF §38.) Ids
/// outside `0..n_experts` join no group (their slots are never written, as in the slot-major
/// kernels' contract).
#[cube(launch)]
pub fn moe_group_kernel(
    experts: &[i32],
    counts: &mut [u32],
    members: &mut [u32],
    n_experts: u32,
    #[comptime] pairs: usize,
    #[comptime] units: usize,
) {
    let mut ids = Shared::<[i32]>::new_slice(pairs);
    let mut part = Shared::<[u32]>::new_slice(units);
    let u = UNIT_POS as usize;
    let mut i = u;
    while i < pairs {
        ids[i] = experts[i];
        i += units;
    }
    sync_cube();
    let ne = n_experts as usize;
    // Uniform over the cube: every unit computes the same `parts` and rounds.
    let mut parts = 1usize;
    while parts * 2 * ne <= units && parts * 2 <= pairs {
        parts *= 2;
    }
    let span = (pairs + parts - 1) / parts;
    let h = u % parts;
    let lo = (h * span).min(pairs);
    let hi = (lo + span).min(pairs);
    let mut e0 = 0usize;
    while e0 < ne {
        let e = e0 + u / parts;
        let mut c = 0u32;
        if e < ne {
            for p in lo..hi {
                if ids[p] == e as i32 {
                    c += 1;
                }
            }
        }
        part[u] = c;
        sync_cube();
        if e < ne {
            let mut w = 0usize;
            for q in 0..h {
                w += part[u - h + q] as usize;
            }
            for p in lo..hi {
                if ids[p] == e as i32 {
                    members[e * pairs + w] = p as u32;
                    w += 1;
                }
            }
            if h == parts - 1 {
                counts[e] = w as u32;
                counts[ne + e] = (e * pairs) as u32;
            }
        }
        // Every unit has read this round's counts before the next round writes them.
        sync_cube();
        e0 += units / parts;
    }
}

/// `y[s, n] = epi(gs[e] · Σ_b s_e[n, b] · Σ_j E2M1[code_e(n, 16b + j)] · x[s / div, 16b + j])` for
/// every slot `s` of expert `e` (`members`), up to `mt` slots per pass. A lane holds its `group`
/// weight chunks of the row (all of them: `chunks ≤ 32 · group`), loaded once before any slot;
/// per pass each chunk is decoded once and dotted with every slot's activations (slots past the
/// group's end are skipped: the branch is uniform over the cube).
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
    #[comptime] group: usize,
    #[comptime] mt: usize,
    #[comptime] units: usize,
    #[comptime] plane: bool,
    #[comptime] relu2: bool,
    #[comptime] hw: bool,
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
    let lane = UNIT_POS_X as usize;
    let mut words = Array::<u32>::new(group * 4);
    let mut sws = Array::<u32>::new(group);
    #[unroll]
    for g in 0..group {
        // Chunks past the row's end re-read the last one and are masked below.
        let c = (lane + g * 32).min(chunks - 1);
        let wv = packed[row * chunks + c];
        words[g * 4] = wv.extract(0);
        words[g * 4 + 1] = wv.extract(1);
        words[g * 4 + 2] = wv.extract(2);
        words[g * 4 + 3] = wv.extract(3);
        let si = row * nb + c * 2;
        sws[g] = scales[si / 4] >> (((si % 4) * 8) as u32);
    }
    // The codes are read as value / 4 (bits) or value · 2^-14 (f16).
    let gs = globals[e] * if hw { 16384.0f32 } else { 4.0f32 };
    let mut acc = Array::<f32>::new(mt);
    let mut xr = Array::<usize>::new(mt);
    let mut xs = Array::<f32>::new(32usize);
    let mut mb = 0usize;
    while mb < count {
        #[unroll]
        for m in 0..mt {
            acc[m] = 0.0f32;
            xr[m] = members[e * pairs + (mb + m).min(count - 1)] as usize / div as usize;
        }
        #[unroll]
        for g in 0..group {
            let c = lane + g * 32;
            let valid = c < chunks;
            let cc = c.min(chunks - 1);
            let sw = sws[g];
            let (s0, s1) = (e4m3(sw & 255u32), e4m3((sw >> 8u32) & 255u32));
            #[unroll]
            for m in 0..mt {
                if mb + m < count {
                    let xb = (xr[m] * k + cc * 32) / 4;
                    #[unroll]
                    for v in 0..8usize {
                        let xv = x[xb + v];
                        #[unroll]
                        for j in 0..4usize {
                            xs[v * 4 + j] = f32::cast_from(xv.extract(j));
                        }
                    }
                    let (p0, p1) = if hw {
                        (
                            word_dot_f16(words[g * 4], &xs, 0usize)
                                + word_dot_f16(words[g * 4 + 1], &xs, 8usize),
                            word_dot_f16(words[g * 4 + 2], &xs, 16usize)
                                + word_dot_f16(words[g * 4 + 3], &xs, 24usize),
                        )
                    } else {
                        (
                            word_dot(words[g * 4], &xs, 0usize)
                                + word_dot(words[g * 4 + 1], &xs, 8usize),
                            word_dot(words[g * 4 + 2], &xs, 16usize)
                                + word_dot(words[g * 4 + 3], &xs, 24usize),
                        )
                    };
                    let p = p0 * s0 + p1 * s1;
                    acc[m] += if valid { p } else { 0.0f32 };
                }
            }
        }
        #[unroll]
        for m in 0..mt {
            if mb + m < count {
                let total = lane_sum(acc[m], units, plane);
                if lane == 0 && n < n_out {
                    let s = members[e * pairs + mb + m] as usize;
                    y[s * n_out + n] = F::cast_from(epilogue(total * gs, relu2));
                }
            }
        }
        mb += mt;
    }
}

/// Groups the routing slots `ids` by expert in one cube ([`moe_group_kernel`], up to
/// [`super::mma::MMA_MAX_SLOTS`] slots): `counts` = per-expert counts then offsets, `members` the slots.
pub(crate) fn group_in_one_cube<R: CubeRuntime>(
    c: &Call<R>,
    ids: &CubeTensor<R>,
    n_experts: usize,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let counts = empty(&c.x, [2 * n_experts], DType::U32);
    let members = empty(&c.x, [n_experts * c.slots], DType::U32);
    // A power of two, as the kernel's rounds assume.
    let max = c.x.client.properties().hardware.max_units_per_cube as usize;
    let units = 1usize << GROUP_UNITS_MAX.min(max.max(1)).ilog2();
    moe_group_kernel::launch::<R>(
        &c.x.client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(units as u32),
        arg(ids),
        arg(&counts),
        arg(&members),
        n_experts as u32,
        c.slots,
        units,
    );
    (counts, members)
}

/// The expert-major launch of a routed call as [`super::plan`] chose it ([`GROUPED_MIN_SLOTS`]+
/// slots, `k % 32 == 0`, `k` ≤ [`super::plan::EXPERT_MAJOR_MAX_K`]): the grouping kernel, then the GEMV over
/// `(row block, expert)` cubes. `None` for a call without expert ids.
pub(crate) fn launch<R: CubeRuntime>(
    c: &Call<R>,
    w: &Nvfp4Weights<CubeBackend<R>>,
) -> Option<CubeTensor<R>> {
    let group = (c.k / 32).div_ceil(32);
    let hw = hw_decode(&c.x.client);
    let experts = c.experts.as_ref()?;
    let n_experts = w.shape.experts;
    let client = &c.x.client;
    let (counts, members) = group_in_one_cube(c, experts, n_experts);
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
                    group,
                    mt,
                    GEMV_UNITS,
                    plane,
                    c.relu2,
                    hw,
                )
            }
        };
    }
    with_float!(c.dtype, go);
    Some(c.y.clone())
}
