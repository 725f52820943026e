//! Routing slots sorted by expert on the device, for any slot count (a prefill's
//! `tokens × top-k`): counts by atomic increments (each slot keeps its rank among its expert's
//! slots), exclusive prefix sums of the counts, then every slot written at its expert's offset
//! plus its rank. Three launches after a zeroing one; the buffers' sizes depend only on the slot
//! and expert counts, so the sequence can be captured in a graph.
//!
//! Output: `counts` `[2E]` u32 — `counts[e]` slots routed to expert `e`, `counts[E + e]` where
//! they start in `members` `[slots]`. Within an expert the order of its slots is the order the
//! atomics ran in (not sorted): the grouped kernels compute each slot's output on its own, so
//! the order changes no result. Ids outside `0..E` join no group (their slots are never
//! written, as in the slot-major kernels' contract).

use crate::cube::buffers::{arg, elemwise, empty};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

#[cube(launch)]
pub fn moe_zero_kernel(counts: &mut [u32], n: u32) {
    let mut i = UNIT_POS as usize;
    while i < n as usize {
        counts[i] = 0u32;
        i += CUBE_DIM as usize;
    }
}

#[cube(launch)]
pub fn moe_count_kernel(
    experts: &[i32],
    counts: &mut [Atomic<u32>],
    ranks: &mut [u32],
    pairs: u32,
    n_experts: u32,
) {
    let id = ABSOLUTE_POS;
    if id >= pairs as usize {
        terminate!();
    }
    let e = experts[id];
    if e >= 0 && e < n_experts as i32 {
        ranks[id] = counts[e as usize].fetch_add(1u32);
    }
}

/// One unit: `counts[E + e] = Σ_{e' < e} counts[e']` (more experts than [`SCAN_UNITS`]).
#[cube(launch)]
pub fn moe_offsets_kernel(counts: &mut [u32], n_experts: u32) {
    if UNIT_POS == 0 {
        let ne = n_experts as usize;
        let mut run = 0u32;
        for e in 0..ne {
            counts[ne + e] = run;
            run += counts[e];
        }
    }
}

/// The most experts [`moe_offsets_scan_kernel`] takes: one unit each, in one cube.
pub const SCAN_UNITS: usize = 1024;

/// The same offsets by one cube of `width` units (a power of two ≥ E), one expert each: the
/// counts loaded side by side and summed in `log2(width)` rounds in shared memory
/// (Hillis–Steele), where the single unit above waits on `E` dependent loads in turn (≈ 9.7 µs
/// at 130 experts on the H100, 46 launches per batch-256 step: PERF §33).
#[cube(launch)]
pub fn moe_offsets_scan_kernel(counts: &mut [u32], n_experts: u32, #[comptime] width: usize) {
    let mut sums = Shared::<[u32]>::new_slice(width);
    let (u, ne) = (UNIT_POS as usize, n_experts as usize);
    let mut own = 0u32;
    if u < ne {
        own = counts[u];
    }
    sums[u] = own;
    sync_cube();
    let mut d = 1usize;
    while d < width {
        let mut add = 0u32;
        if u >= d {
            add = sums[u - d];
        }
        sync_cube();
        sums[u] += add;
        sync_cube();
        d *= 2;
    }
    if u < ne {
        counts[ne + u] = sums[u] - own;
    }
}

#[cube(launch)]
pub fn moe_scatter_kernel(
    experts: &[i32],
    counts: &[u32],
    ranks: &[u32],
    members: &mut [u32],
    pairs: u32,
    n_experts: u32,
) {
    let id = ABSOLUTE_POS;
    if id >= pairs as usize {
        terminate!();
    }
    let e = experts[id];
    if e >= 0 && e < n_experts as i32 {
        members[(counts[n_experts as usize + e as usize] + ranks[id]) as usize] = id as u32;
    }
}

/// `(counts [2E], members [slots])` of the `slots` expert ids in `experts` (i32, contiguous);
/// see the module docs.
pub fn group<R: CubeRuntime>(
    experts: &CubeTensor<R>,
    n_experts: usize,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let pairs = experts.meta.shape().num_elements();
    let client = &experts.client;
    let counts = empty(experts, [2 * n_experts], DType::U32);
    let members = empty(experts, [pairs.max(1)], DType::U32);
    let ranks = empty(experts, [pairs.max(1)], DType::U32);
    let one = CubeCount::Static(1, 1, 1);
    moe_zero_kernel::launch::<R>(
        client,
        one.clone(),
        CubeDim::new_1d(256),
        arg(&counts),
        n_experts as u32,
    );
    let (count, dim) = elemwise(pairs);
    moe_count_kernel::launch::<R>(
        client,
        count.clone(),
        dim,
        arg(experts),
        arg(&counts),
        arg(&ranks),
        pairs as u32,
        n_experts as u32,
    );
    if n_experts <= SCAN_UNITS {
        let width = n_experts.next_power_of_two().max(32);
        moe_offsets_scan_kernel::launch::<R>(
            client,
            one,
            CubeDim::new_1d(width as u32),
            arg(&counts),
            n_experts as u32,
            width,
        );
    } else {
        moe_offsets_kernel::launch::<R>(
            client,
            one,
            CubeDim::new_1d(32),
            arg(&counts),
            n_experts as u32,
        );
    }
    moe_scatter_kernel::launch::<R>(
        client,
        count,
        dim,
        arg(experts),
        arg(&counts),
        arg(&ranks),
        arg(&members),
        pairs as u32,
        n_experts as u32,
    );
    (counts, members)
}
