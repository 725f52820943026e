//! The selective scan with D skip over a prompt:
//! `S = exp(dt·A[h])·S + dt·outer(x, B[g])`, `y = S·C[g] + D[h]·x`, `g = h / (H/G)`.
//!
//! (A bf16 scan on a device with tensor cores runs in Mamba2's chunked matrix form instead,
//! `ssd.rs` beside this file, sharing this module's carry and out kernels for prompts of several
//! chunks.) Two kernels, chosen by [`plan`]:
//! - [`scan_rows_kernel()`] (the prefill path): the state lives in registers. A cube takes
//!   [`ROWS`] state rows `(b, h, p)`; [`LANES`] lanes split each row's `N` entries (`N / LANES`
//!   each). Time runs in tiles of up to [`TILE`] steps: the cube stages the tile's `B`, `C` rows
//!   of its group, `exp(dt·A)`, `dt` and `x` in shared memory (coalesced loads, one barrier), then
//!   every lane walks the tile from shared memory, and a row's `y` is its lanes' partial
//!   `S·C` summed by warp shuffles (CUDA) or through shared memory (wgpu). Only the recurrence
//!   itself is sequential, and it is a register FMA per entry and step: ≈ 50 instructions per
//!   lane and step against the old kernel's state row read and written in global memory per step.
//!   Over many rows ([`PAIR_MIN_ROWS`], [`set_pair_min`]) each lane takes two state
//!   rows `ROWS` apart (a cube `2 · ROWS` rows), so every `B`/`C` value read from shared memory
//!   updates both.
//!   Grid: one cube per `(b, h, p-block)` on x, folded onto y past the device's x limit.
//! - [`selective_scan_kernel()`] (the fallback, where `N` is not a multiple of [`LANES`]): one unit
//!   per `(b, h, p)` walking time over its state row in global memory.
//!
//! - **Chunked over time** (where the rows alone leave the device idle: a long prompt of few
//!   sequences; [`Chunking`]): the prompt is cut into chunks of `len` steps that never span two
//!   sequences, and three launches replace the walk over all of `T`:
//!   1. [`scan_rows_kernel()`] per `(b, chunk, h, p-block)`: the recurrence over the chunk from a
//!      zero state (the sequence's own state for its first chunk), writing each chunk's local
//!      outputs (f32), its end state and its decay `Π exp(dt·A)` over the chunk;
//!   2. [`scan_carry_kernel()`] per state entry: the state passed between chunks,
//!      `E_c = decay_c · E_{c-1} + S_c`, sequential over the chunks only; the last is the new state;
//!   3. [`scan_out_kernel()`] per `(b, chunk, h, p-block)`: the incoming state's contribution
//!      `y_t += (Π_{s ≤ t in chunk} exp(dt_s·A)) · C_t · E_{c-1}`, and the cast to the activation type.
//!   This is the state passing of Mamba2's chunked (SSD) algorithm with the in-chunk part still
//!   the recurrence: 1.5× the FMAs of one walk, spread over `chunks` times the cubes.
//!
//! All read `state` and write `new_state` (f32); positions past a sequence's length leave its
//! state as it was, so a length-0 sequence copies its state through.

use crate::cube::buffers::{
    arg, contiguous_as, elemwise, empty, f32_buf, fold, lens_arg, lens_buf, with_float,
};
use crate::cube::reduce::plane_reduce;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

/// Lanes that split one state row's `N` entries (a divisor of 32, so a warp holds whole rows).
pub const LANES: usize = 8;
const _: () = assert!(
    LANES == 8,
    "the shuffle masks of scan_rows_kernel assume 8 lanes"
);
/// State rows per cube of [`scan_rows_kernel()`] (`LANES · ROWS` = 128 units).
pub const ROWS: usize = 16;
/// Time steps staged per tile, at most; fewer for larger `N` ([`tile`]).
pub const TILE: usize = 32;

/// Which scan kernel runs, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanPath {
    /// [`scan_rows_kernel()`] with `per = N / LANES` entries per lane, `tile` steps per tile and
    /// `pair` state rows per lane (1 or 2: with 2, each `B`/`C` value read from shared memory
    /// updates two rows, halving the shared reads per FLOP, and a cube takes `2 · ROWS` rows).
    Rows {
        per: usize,
        tile: usize,
        pair: usize,
        /// The time axis cut into chunks (three launches), or one walk over all of `T`.
        chunks: Option<Chunks>,
    },
    /// [`selective_scan_kernel()`]: `N` is not a multiple of [`LANES`] (or is 0).
    Sequential,
}

/// State rows (`B · H · P`) from which a lane takes two rows, by default: 32,768 rows are
/// 2,048 cubes of [`ROWS`], so paired cubes still fill the device, while a 1K prompt of the
/// Lightning geometry (4,096 rows) keeps one row per lane. Measured on the H200 (PERF §20,
/// admission alone, median of 2): +1.7 % at 16 × 128 and +3.1 % at 64 × 128 over one row per
/// lane (the kernel is bound by its shared-memory reads: L1 89 % busy at 64 × 128, PERF §19).
pub const PAIR_MIN_ROWS: usize = 32_768;

static PAIR_MIN: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(PAIR_MIN_ROWS);

/// Sets the state rows from which lanes take two rows (process-wide; for tests and benchmarks;
/// `usize::MAX`: never).
pub fn set_pair_min(rows: usize) {
    PAIR_MIN.store(rows, std::sync::atomic::Ordering::Relaxed);
}

/// The current [`set_pair_min`] setting.
pub fn pair_min() -> usize {
    PAIR_MIN.load(std::sync::atomic::Ordering::Relaxed)
}

/// Chunks of the time axis: `count` chunks of `len` steps (the last may be shorter or, for a
/// shorter sequence of a ragged batch, past its end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunks {
    pub len: usize,
    pub count: usize,
}

/// When the scan cuts time into chunks: over at most `max_rows` state rows (`B · H · P`: fewer
/// rows leave cubes of the device idle while each walks all of `T`), in chunks of `len` steps,
/// for prompts of more than one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunking {
    pub len: usize,
    pub max_rows: usize,
}

/// Steps per chunk by default (Lightning's `chunk_size`; here only a work split: any length
/// gives the same math).
pub const CHUNK_LEN: usize = 128;
/// State rows up to which the scan chunks time, by default: 16,384 rows are 1,024 cubes of
/// [`ROWS`] (≈ 8 per H200 SM). A 1K prompt of the Lightning geometry (4,096 rows: 256 cubes,
/// each walking 1,024 steps) chunks; 16 × 128 (65,536 rows) does not.
pub const CHUNK_MAX_ROWS: usize = 16_384;
/// The chunk end states (`chunks · rows · N` f32) take at most this many bytes: a longer prompt
/// takes longer chunks rather than more of them.
pub const CHUNK_STATE_BYTES: usize = 256 << 20;

impl Default for Chunking {
    fn default() -> Self {
        Chunking {
            len: CHUNK_LEN,
            max_rows: CHUNK_MAX_ROWS,
        }
    }
}

static CHUNK_LEN_SET: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(CHUNK_LEN);
static CHUNK_ROWS_SET: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(CHUNK_MAX_ROWS);

/// Sets [`Chunking`] (process-wide; for tests, benchmarks and `parity --prefill-kernels tiled`;
/// `max_rows: 0` never chunks). A zero length is refused.
pub fn set_chunking(c: Chunking) -> Result<(), String> {
    if c.len == 0 {
        return Err("scanchunk=0: a chunk takes at least one step".into());
    }
    store_chunking(c);
    Ok(())
}

/// Stores a chunking whose length the caller knows is nonzero (a constant of this crate).
pub(crate) fn store_chunking(c: Chunking) {
    CHUNK_LEN_SET.store(c.len.max(1), std::sync::atomic::Ordering::Relaxed);
    CHUNK_ROWS_SET.store(c.max_rows, std::sync::atomic::Ordering::Relaxed);
}

/// The current [`set_chunking`] setting.
pub fn chunking() -> Chunking {
    Chunking {
        len: CHUNK_LEN_SET.load(std::sync::atomic::Ordering::Relaxed),
        max_rows: CHUNK_ROWS_SET.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// The path for a state of `n` entries per row over `rows` state rows and `t` steps, pairing
/// rows from `pair_min` (counted over every chunk's rows) and chunking time as `chunking` says
/// (pure; tested on the host).
pub fn plan(n: usize, rows: usize, t: usize, pair_min: usize, chunking: Chunking) -> ScanPath {
    if n == 0 || n % LANES != 0 {
        return ScanPath::Sequential;
    }
    let mut chunks = None;
    let len = chunking.len.max(1);
    if rows > 0 && rows <= chunking.max_rows && t > len {
        // Within the byte budget for the chunk end states; at least two chunks to be worth it.
        let most = (CHUNK_STATE_BYTES / (rows * n * 4)).max(2);
        let len = len.max(t.div_ceil(most));
        let count = t.div_ceil(len);
        if count >= 2 {
            chunks = Some(Chunks { len, count });
        }
    }
    let units = rows.saturating_mul(chunks.map_or(1, |c| c.count));
    ScanPath::Rows {
        per: n / LANES,
        tile: tile(n),
        pair: if units >= pair_min { 2 } else { 1 },
        chunks,
    }
}

/// Steps per staged tile for `n` state entries: [`TILE`], fewer so `B` and `C` (`2 · tile · N`
/// f32) take at most 16 KiB of shared memory — 16 steps at `N = 128`. (A 32-step tile at
/// `N = 128`, 35.5 KiB in all, did not launch on lavapipe: its outputs stayed unwritten.)
pub fn tile(n: usize) -> usize {
    (2048 / n.max(1)).clamp(1, TILE)
}

/// `y[b, t, h, p]` and the final state of rows `(b, h, p)` of one cube; see the module docs.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn scan_rows_kernel<F: Float, Y: Float>(
    x: &[F],
    dt: &[f32],
    a: &[f32],
    bm: &[F],
    cm: &[F],
    d: &[f32],
    lens: &[u32],
    state: &[f32],
    new_state: &mut [f32],
    decays: &mut [f32],
    y: &mut [Y],
    batch: u32,
    t_max: u32,
    heads: u32,
    head_dim: u32,
    groups: u32,
    chunk_len: u32,
    chunks: u32,
    #[comptime] per: usize,
    #[comptime] tile: usize,
    #[comptime] pair: usize,
    #[comptime] ragged: bool,
    #[comptime] plane: bool,
    #[comptime] chunked: bool,
) {
    let n = comptime!(per * LANES);
    // Rows per cube: `ROWS` unit rows, each lane taking `pair` state rows `ROWS` apart.
    let crows = comptime!(ROWS * pair);
    let (t_max, h, p, g, nc) = (
        t_max as usize,
        heads as usize,
        head_dim as usize,
        groups as usize,
        chunks as usize,
    );
    let blocks = p.div_ceil(crows);
    let cube = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    // Cubes past the end (the folded grid's last row) leave; uniform over the cube.
    if cube >= batch as usize * nc * h * blocks {
        terminate!();
    }
    let pb = cube % blocks;
    let hh = (cube / blocks) % h;
    let c = (cube / (blocks * h)) % nc;
    let b = cube / (blocks * h * nc);
    let lane = UNIT_POS_X as usize;
    let row = UNIT_POS_Y as usize;
    let u = row * LANES + lane;
    let gg = hh / (h / g);
    let mut len = t_max;
    if ragged {
        len = lens[b] as usize;
    }
    // This cube's steps: chunk `c` (all of `T` unchunked). A chunk past a shorter sequence's end
    // has nothing to do (its first chunk still writes the state through, for the carry).
    let ts = c * chunk_len as usize;
    if c > 0 && ts >= len {
        terminate!();
    }
    let te = (ts + chunk_len as usize).min(len);
    // This unit's state rows `pp[k] = pb · crows + row + k · ROWS`; rows past `P` compute on the
    // last row and are never written. A chunk after the first starts from zero.
    let mut srow = Array::<usize>::new(pair);
    let mut s = Array::<f32>::new(comptime!(per * pair));
    #[unroll]
    for k in 0..pair {
        let pr = (pb * crows + row + k * ROWS).min(p - 1);
        srow[k] = ((b * nc + c) * h + hh) * p + pr;
        let from = ((b * h + hh) * p + pr) * n;
        #[unroll]
        for i in 0..per {
            s[k * per + i] = if c == 0 {
                state[from + lane + i * LANES]
            } else {
                0.0f32
            };
        }
    }
    let mut decay_all = 1.0f32;
    let (av, dv) = (a[hh], d[hh]);
    let mut bs = Shared::<[f32]>::new_slice(comptime!(tile * n));
    let mut cs = Shared::<[f32]>::new_slice(comptime!(tile * n));
    let mut xs = Shared::<[f32]>::new_slice(comptime!(tile * ROWS * pair));
    let mut ds = Shared::<[f32]>::new_slice(tile);
    let mut es = Shared::<[f32]>::new_slice(tile);
    let mut part =
        Shared::<[f32]>::new_slice(comptime!(if plane { 1 } else { ROWS * LANES * pair }));
    let units = comptime!(ROWS * LANES);
    let mut t0 = ts;
    while t0 < te {
        let steps = (te - t0).min(tile);
        // Stage the tile: B and C rows of group `gg`, dt and its decay, x of the cube's rows.
        let mut j = u;
        while j < steps * n {
            let tl = j / n;
            let at = ((b * t_max + t0 + tl) * g + gg) * n + j % n;
            bs[j] = f32::cast_from(bm[at]);
            cs[j] = f32::cast_from(cm[at]);
            j += units;
        }
        if u < steps {
            let dtv = dt[(b * t_max + t0 + u) * h + hh];
            ds[u] = dtv;
            es[u] = (dtv * av).exp();
        }
        j = u;
        while j < steps * crows {
            let tl = j / crows;
            let r = (pb * crows + j % crows).min(p - 1);
            xs[j] = f32::cast_from(x[((b * t_max + t0 + tl) * h + hh) * p + r]);
            j += units;
        }
        sync_cube();
        for tl in 0..steps {
            let decay = es[tl];
            if chunked {
                decay_all *= decay;
            }
            let mut xv = Array::<f32>::new(pair);
            let mut dx = Array::<f32>::new(pair);
            let mut acc = Array::<f32>::new(pair);
            #[unroll]
            for k in 0..pair {
                xv[k] = xs[tl * crows + row + k * ROWS];
                dx[k] = ds[tl] * xv[k];
                acc[k] = 0.0f32;
            }
            #[unroll]
            for i in 0..per {
                let at = tl * n + lane + i * LANES;
                let (bv, cv) = (bs[at], cs[at]);
                #[unroll]
                for k in 0..pair {
                    let v = decay * s[k * per + i] + dx[k] * bv;
                    s[k * per + i] = v;
                    acc[k] += v * cv;
                }
            }
            if plane {
                #[unroll]
                for k in 0..pair {
                    let mut sum = acc[k];
                    // Masks 4, 2, 1: the row's 8 lanes ([`LANES`]) are consecutive in the warp.
                    #[unroll]
                    for sh in 0..3u32 {
                        sum += plane_shuffle_xor(sum, 4u32 >> sh);
                    }
                    let pp = pb * crows + row + k * ROWS;
                    if lane == 0 && pp < p {
                        let out = ((b * t_max + t0 + tl) * h + hh) * p + pp;
                        y[out] = Y::cast_from(sum + dv * xv[k]);
                    }
                }
            } else {
                #[unroll]
                for k in 0..pair {
                    part[k * units + u] = acc[k];
                }
                sync_cube();
                if lane == 0 {
                    #[unroll]
                    for k in 0..pair {
                        let pp = pb * crows + row + k * ROWS;
                        if pp < p {
                            let mut sum = 0.0f32;
                            #[unroll]
                            for l in 0..LANES {
                                sum += part[k * units + row * LANES + l];
                            }
                            let out = ((b * t_max + t0 + tl) * h + hh) * p + pp;
                            y[out] = Y::cast_from(sum + dv * xv[k]);
                        }
                    }
                }
                sync_cube();
            }
        }
        sync_cube();
        t0 += tile;
    }
    #[unroll]
    for k in 0..pair {
        if pb * crows + row + k * ROWS < p {
            #[unroll]
            for i in 0..per {
                new_state[srow[k] * n + lane + i * LANES] = s[k * per + i];
            }
        }
    }
    if chunked && u == 0 {
        decays[(b * nc + c) * h + hh] = decay_all;
    }
}

/// The state passed between chunks, one unit per state entry `(b, h, p, n)`:
/// `E_0 = S_0`, `E_c = decay_c · E_{c-1} + S_c` over the sequence's chunks (written back over
/// `S_c` for [`scan_out_kernel()`]); the last is the new state, or the input state for a
/// length-0 sequence.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn scan_carry_kernel(
    ends: &mut [f32],
    decays: &[f32],
    lens: &[u32],
    state: &[f32],
    new_state: &mut [f32],
    batch: u32,
    t_max: u32,
    heads: u32,
    entries: u32,
    chunk_len: u32,
    chunks: u32,
    #[comptime] ragged: bool,
) {
    let id = ABSOLUTE_POS;
    let (h, e, nc) = (heads as usize, entries as usize, chunks as usize);
    if id >= batch as usize * h * e {
        terminate!();
    }
    let b = id / (h * e);
    let rest = id % (h * e);
    let hh = rest / e;
    let mut len = t_max as usize;
    if ragged {
        len = lens[b] as usize;
    }
    let used = len.div_ceil(chunk_len as usize);
    if used == 0 {
        new_state[id] = state[id];
    } else {
        let mut v = ends[b * nc * h * e + rest];
        for c in 1..used {
            let at = (b * nc + c) * h * e + rest;
            v = decays[(b * nc + c) * h + hh] * v + ends[at];
            ends[at] = v;
        }
        new_state[id] = v;
    }
}

/// The incoming state's part of a chunk's outputs, and the cast: per `(b, chunk, h, p-block)`
/// cube as [`scan_rows_kernel()`], lanes holding `E_{c-1}` of their rows in registers and the
/// chunk's `C` rows and decays staged in shared memory by tiles:
/// `y_t = y_local_t + (Π_{s ≤ t in chunk} exp(dt_s·A)) · C_t · E_{c-1}` (the first chunk: `y_local`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn scan_out_kernel<F: Float>(
    local: &[f32],
    dt: &[f32],
    a: &[f32],
    cm: &[F],
    lens: &[u32],
    ends: &[f32],
    y: &mut [F],
    batch: u32,
    t_max: u32,
    heads: u32,
    head_dim: u32,
    groups: u32,
    chunk_len: u32,
    chunks: u32,
    #[comptime] per: usize,
    #[comptime] tile: usize,
    #[comptime] ragged: bool,
    #[comptime] plane: bool,
) {
    let n = comptime!(per * LANES);
    let (t_max, h, p, g, nc) = (
        t_max as usize,
        heads as usize,
        head_dim as usize,
        groups as usize,
        chunks as usize,
    );
    let blocks = p.div_ceil(ROWS);
    let cube = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    if cube >= batch as usize * nc * h * blocks {
        terminate!();
    }
    let pb = cube % blocks;
    let hh = (cube / blocks) % h;
    let c = (cube / (blocks * h)) % nc;
    let b = cube / (blocks * h * nc);
    let lane = UNIT_POS_X as usize;
    let row = UNIT_POS_Y as usize;
    let u = row * LANES + lane;
    let gg = hh / (h / g);
    let mut len = t_max;
    if ragged {
        len = lens[b] as usize;
    }
    let ts = c * chunk_len as usize;
    if ts >= len {
        terminate!();
    }
    let te = (ts + chunk_len as usize).min(len);
    let pp = pb * ROWS + row;
    if c == 0 {
        // No incoming state beyond the one the first chunk started from: the cast only, every
        // unit taking `(step, row)` pairs in turn.
        let mut j = u;
        while j < (te - ts) * ROWS {
            let q = pb * ROWS + j % ROWS;
            if q < p {
                let out = ((b * t_max + ts + j / ROWS) * h + hh) * p + q;
                y[out] = F::cast_from(local[out]);
            }
            j += comptime!(ROWS * LANES);
        }
        terminate!();
    }
    let pr = pp.min(p - 1);
    let from = (((b * nc + c - 1) * h + hh) * p + pr) * n;
    let mut e = Array::<f32>::new(per);
    #[unroll]
    for i in 0..per {
        e[i] = ends[from + lane + i * LANES];
    }
    let av = a[hh];
    let mut cs = Shared::<[f32]>::new_slice(comptime!(tile * n));
    let mut es = Shared::<[f32]>::new_slice(tile);
    let mut part = Shared::<[f32]>::new_slice(comptime!(if plane { 1 } else { ROWS * LANES }));
    let units = comptime!(ROWS * LANES);
    let mut decay = 1.0f32;
    let mut t0 = ts;
    while t0 < te {
        let steps = (te - t0).min(tile);
        let mut j = u;
        while j < steps * n {
            let at = ((b * t_max + t0 + j / n) * g + gg) * n + j % n;
            cs[j] = f32::cast_from(cm[at]);
            j += units;
        }
        if u < steps {
            es[u] = (dt[(b * t_max + t0 + u) * h + hh] * av).exp();
        }
        sync_cube();
        for tl in 0..steps {
            decay *= es[tl];
            let mut acc = 0.0f32;
            #[unroll]
            for i in 0..per {
                acc += e[i] * cs[tl * n + lane + i * LANES];
            }
            let out = ((b * t_max + t0 + tl) * h + hh) * p + pp;
            if plane {
                let mut sum = acc;
                #[unroll]
                for sh in 0..3u32 {
                    sum += plane_shuffle_xor(sum, 4u32 >> sh);
                }
                if lane == 0 && pp < p {
                    y[out] = F::cast_from(local[out] + decay * sum);
                }
            } else {
                part[u] = acc;
                sync_cube();
                if lane == 0 && pp < p {
                    let mut sum = 0.0f32;
                    #[unroll]
                    for l in 0..LANES {
                        sum += part[row * LANES + l];
                    }
                    y[out] = F::cast_from(local[out] + decay * sum);
                }
                sync_cube();
            }
        }
        sync_cube();
        t0 += tile;
    }
}

#[cube(launch)]
pub fn selective_scan_kernel(
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    bm: &[f32],
    cm: &[f32],
    d: &[f32],
    lens: &[u32],
    state: &[f32],
    new_state: &mut [f32],
    y: &mut [f32],
    batch: u32,
    t_max: u32,
    heads: u32,
    head_dim: u32,
    groups: u32,
    n_state: u32,
    #[comptime] ragged: bool,
) {
    let id = ABSOLUTE_POS;
    let (batch, t_max, h, p, g, n) = (
        batch as usize,
        t_max as usize,
        heads as usize,
        head_dim as usize,
        groups as usize,
        n_state as usize,
    );
    if id >= batch * h * p {
        terminate!();
    }
    let b = id / (h * p);
    let hh = (id / p) % h;
    let pp = id % p;
    let gg = hh / (h / g);
    let mut len = t_max;
    if ragged {
        len = lens[b] as usize;
    }
    let srow = ((b * h + hh) * p + pp) * n;
    if len == 0 {
        for nn in 0..n {
            new_state[srow + nn] = state[srow + nn];
        }
    }
    for t in 0..len {
        let dtv = dt[(b * t_max + t) * h + hh];
        let decay = (dtv * a[hh]).exp();
        let xv = x[((b * t_max + t) * h + hh) * p + pp];
        let bc = ((b * t_max + t) * g + gg) * n;
        let mut acc = 0.0f32;
        for nn in 0..n {
            // The first token reads the input state; later ones the state this unit wrote.
            let prev = if t == 0 {
                state[srow + nn]
            } else {
                new_state[srow + nn]
            };
            let s = decay * prev + dtv * xv * bm[bc + nn];
            new_state[srow + nn] = s;
            acc += s * cm[bc + nn];
        }
        y[((b * t_max + t) * h + hh) * p + pp] = acc + d[hh] * xv;
    }
}

/// The zero state `[B, H, P, N]` (f32) of a scan of `x` `[B, T, H, P]` with `b` `[B, T, G, N]`
/// (new sequences, for the kernels that read a state).
pub fn zero_state<R: CubeRuntime>(x: &CubeTensor<R>, b: &CubeTensor<R>) -> CubeTensor<R> {
    let (xs, n) = (x.meta.shape(), b.meta.shape()[3]);
    burn_cubecl::ops::numeric::zeros_client(
        x.client.clone(),
        x.device.clone(),
        burn::tensor::Shape::new([xs[0], xs[2], xs[3], n]),
        DType::F32,
    )
}

/// The scan of `x` `[B, T, H, P]` with `dt` `[B, T, H]`, `B`/`C` `[B, T, G, N]` from `state`
/// `[B, H, P, N]` (f32); see [`crate::NemotronOps::selective_scan`].
#[allow(clippy::too_many_arguments)]
pub fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    dt: CubeTensor<R>,
    a: CubeTensor<R>,
    b: CubeTensor<R>,
    c: CubeTensor<R>,
    d: CubeTensor<R>,
    state: CubeTensor<R>,
    lens: &[usize],
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (dtype, state_dtype) = (x.dtype, state.dtype);
    let xs = x.meta.shape().clone();
    let (bs, t, h, p) = (xs[0], xs[1], xs[2], xs[3]);
    let bsh = b.meta.shape().clone();
    let (g, n) = (bsh[2], bsh[3]);
    let ScanPath::Rows {
        per,
        tile,
        pair,
        chunks,
    } = plan(n, bs * h * p, t, pair_min(), chunking())
    else {
        return launch_sequential(x, dt, a, b, c, d, state, lens);
    };
    // x, B, C and y in the activation type where it is a kernel float type, else f32.
    let act = match dtype {
        DType::BF16 | DType::F16 => dtype,
        _ => DType::F32,
    };
    let (x, bm, cm) = (
        contiguous_as(x, act),
        contiguous_as(b, act),
        contiguous_as(c, act),
    );
    let (dt, a, d, st) = (f32_buf(dt), f32_buf(a), f32_buf(d), f32_buf(state));
    let ns = empty(&x, [bs, h, p, n], DType::F32);
    let y = empty(&x, [bs, t, h, p], act);
    let client = x.client.clone();
    let lens = lens_buf(&client, lens);
    let plane = plane_reduce(&client, 32);
    let Some(Chunks { len: cl, count: nc }) = chunks else {
        let count = fold(bs * h * p.div_ceil(ROWS * pair));
        let dim = CubeDim::new_2d(LANES as u32, ROWS as u32);
        // Unchunked: no decays are written (a one-element buffer of its own stands in).
        let unused = empty(&x, [1], DType::F32);
        macro_rules! go {
            ($t:ty) => {
                scan_rows_kernel::launch::<$t, $t, R>(
                    &client,
                    count.clone(),
                    dim,
                    arg(&x),
                    arg(&dt),
                    arg(&a),
                    arg(&bm),
                    arg(&cm),
                    arg(&d),
                    lens_arg(&lens, &a),
                    arg(&st),
                    arg(&ns),
                    arg(&unused),
                    arg(&y),
                    bs as u32,
                    t as u32,
                    h as u32,
                    p as u32,
                    g as u32,
                    t as u32,
                    1,
                    per,
                    tile,
                    pair,
                    lens.is_some(),
                    plane,
                    false,
                )
            };
        }
        with_float!(act, go);
        return (contiguous_as(y, dtype), contiguous_as(ns, state_dtype));
    };
    // Chunked: local outputs (f32) and chunk end states, the carry, the incoming states' part.
    let local = empty(&x, [bs, t, h, p], DType::F32);
    let ends = empty(&x, [bs, nc, h, p, n], DType::F32);
    let decays = empty(&x, [bs, nc, h], DType::F32);
    let dim = CubeDim::new_2d(LANES as u32, ROWS as u32);
    let count = fold(bs * nc * h * p.div_ceil(ROWS * pair));
    macro_rules! local {
        ($t:ty) => {
            scan_rows_kernel::launch::<$t, f32, R>(
                &client,
                count.clone(),
                dim,
                arg(&x),
                arg(&dt),
                arg(&a),
                arg(&bm),
                arg(&cm),
                arg(&d),
                lens_arg(&lens, &a),
                arg(&st),
                arg(&ends),
                arg(&decays),
                arg(&local),
                bs as u32,
                t as u32,
                h as u32,
                p as u32,
                g as u32,
                cl as u32,
                nc as u32,
                per,
                tile,
                pair,
                lens.is_some(),
                plane,
                true,
            )
        };
    }
    with_float!(act, local);
    carry_and_out(
        &client,
        &local,
        &dt,
        &a,
        &cm,
        &lens,
        &st,
        &ends,
        &decays,
        &ns,
        &y,
        (bs, t, h, p, g, n),
        (cl, nc),
        act,
    );
    (contiguous_as(y, dtype), contiguous_as(ns, state_dtype))
}

/// The chunked path's last two launches, after the chunk-local pass (this module's or
/// `ssd.rs`'s): [`scan_carry_kernel()`] passes the state between chunks (writing the new
/// state `ns`), [`scan_out_kernel()`] adds the incoming states' part to the f32 `local` outputs
/// and casts them into `y` (of `act`, as `cm`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn carry_and_out<R: CubeRuntime>(
    client: &ComputeClient<R>,
    local: &CubeTensor<R>,
    dt: &CubeTensor<R>,
    a: &CubeTensor<R>,
    cm: &CubeTensor<R>,
    lens: &Option<(cubecl::server::Handle, usize)>,
    st: &CubeTensor<R>,
    ends: &CubeTensor<R>,
    decays: &CubeTensor<R>,
    ns: &CubeTensor<R>,
    y: &CubeTensor<R>,
    (bs, t, h, p, g, n): (usize, usize, usize, usize, usize, usize),
    (cl, nc): (usize, usize),
    act: DType,
) {
    let (per, tile, plane) = (n / LANES, tile(n), plane_reduce(client, 32));
    let (count, edim) = elemwise(bs * h * p * n);
    scan_carry_kernel::launch::<R>(
        client,
        count,
        edim,
        arg(ends),
        arg(decays),
        lens_arg(lens, a),
        arg(st),
        arg(ns),
        bs as u32,
        t as u32,
        h as u32,
        (p * n) as u32,
        cl as u32,
        nc as u32,
        lens.is_some(),
    );
    let dim = CubeDim::new_2d(LANES as u32, ROWS as u32);
    let count = fold(bs * nc * h * p.div_ceil(ROWS));
    macro_rules! out {
        ($t:ty) => {
            scan_out_kernel::launch::<$t, R>(
                client,
                count.clone(),
                dim,
                arg(local),
                arg(dt),
                arg(a),
                arg(cm),
                lens_arg(lens, a),
                arg(ends),
                arg(y),
                bs as u32,
                t as u32,
                h as u32,
                p as u32,
                g as u32,
                cl as u32,
                nc as u32,
                per,
                tile,
                lens.is_some(),
                plane,
            )
        };
    }
    with_float!(act, out);
}

/// [`selective_scan_kernel()`]'s launch (any `N`; the reference's order of operations).
#[allow(clippy::too_many_arguments)]
pub fn launch_sequential<R: CubeRuntime>(
    x: CubeTensor<R>,
    dt: CubeTensor<R>,
    a: CubeTensor<R>,
    b: CubeTensor<R>,
    c: CubeTensor<R>,
    d: CubeTensor<R>,
    state: CubeTensor<R>,
    lens: &[usize],
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (dtype, state_dtype) = (x.dtype, state.dtype);
    let xs = x.meta.shape().clone();
    let (bs, t, h, p) = (xs[0], xs[1], xs[2], xs[3]);
    let bsh = b.meta.shape().clone();
    let (g, n) = (bsh[2], bsh[3]);
    let (x, dt, a, bm, cm, d, st) = (
        f32_buf(x),
        f32_buf(dt),
        f32_buf(a),
        f32_buf(b),
        f32_buf(c),
        f32_buf(d),
        f32_buf(state),
    );
    let ns = empty(&x, [bs, h, p, n], DType::F32);
    let y = empty(&x, [bs, t, h, p], DType::F32);
    let client = x.client.clone();
    let lens = lens_buf(&client, lens);
    let (count, dim) = elemwise(bs * h * p);
    selective_scan_kernel::launch::<R>(
        &client,
        count,
        dim,
        arg(&x),
        arg(&dt),
        arg(&a),
        arg(&bm),
        arg(&cm),
        arg(&d),
        lens_arg(&lens, &a),
        arg(&st),
        arg(&ns),
        arg(&y),
        bs as u32,
        t as u32,
        h as u32,
        p as u32,
        g as u32,
        n as u32,
        lens.is_some(),
    );
    (contiguous_as(y, dtype), contiguous_as(ns, state_dtype))
}
