//! NVFP4 weight-only linear (W4A16):
//! `y[s, n] = epi(gs[e] · Σ_b s_e[n, b] · Σ_j E2M1[code_e(n, 16b + j)] · x[r(s), 16b + j])`,
//! with `(e, r(s)) = (0, s)` for a plain linear and `(experts[s], s / div)` for routed experts.
//! Grid: [`super::dispatch`] (vector GEMV when `K % 32 == 0`, scalar otherwise). Codes are u32
//! words of 8 nibbles, the low nibble first (`[E · N, K/8]`, read 4 words = 2 blocks at a time by
//! the vector kernel); block scales E4M3 bytes back to back (`E · N · K/16`, read as words);
//! activations in their storage type `F`, accumulated in f32.

use super::dispatch::{
    gemv_count, gemv_dim, gemv_group, plane_reduce, rows_per_unit_row, small_m_count, small_m_rows,
    GEMV_LANES, GEMV_UNITS,
};
use super::launcher::Weights;
use super::plan::{Format, LinearPath};
use super::{
    byte_at, e2m1, e2m1_quarter, e4m3, epilogue, hw_decode, lane_sum, store3, word_dot,
    word_dot_f16, Call,
};
use crate::cube::buffers::{arg, with_float};
use crate::cube::reduce::row_sum;
use crate::Nvfp4Weights;
use burn::tensor::f16;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

/// Weight chunks a lane of the vector GEMV holds at once (`rows × group`): 16 bytes each, plus
/// the 32 decoded activations of the chunk in use.
const NVFP4_CHUNK_BUDGET: usize = 8;

/// `Σ_b s[row, b] · Σ_j E2M1[code(row, 16b + j)] · x[xrow, 16b + j]` over this lane's blocks
/// (`b ≡ UNIT_POS_X mod CUBE_DIM_X`).
#[cube]
fn nvfp4_partial<F: Float>(
    x: &[F],
    packed: &[u32],
    scales: &[u32],
    row: usize,
    xrow: usize,
    k: usize,
) -> f32 {
    let nb = k / 16;
    let mut acc = 0.0f32;
    let mut b = UNIT_POS_X as usize;
    while b < nb {
        let s = e4m3(byte_at(scales, row * nb + b));
        let wbase = row * (k / 8) + b * 2;
        let xbase = xrow * k + b * 16;
        let mut part = 0.0f32;
        for w in 0..2usize {
            let word = packed[wbase + w];
            for j in 0..8usize {
                let code = (word >> ((j * 4) as u32)) & 15u32;
                part += e2m1(code) * f32::cast_from(x[xbase + w * 8 + j]);
            }
        }
        acc += part * s;
        b += CUBE_DIM_X as usize;
    }
    acc
}

#[cube(launch)]
pub fn nvfp4_linear_kernel<F: Float>(
    x: &[F],
    experts: &[i32],
    packed: &[u32],
    scales: &[u32],
    globals: &[f32],
    y: &mut [F],
    k: u32,
    n_out: u32,
    slots: u32,
    div: u32,
    #[comptime] units: usize,
    #[comptime] routed: bool,
    #[comptime] relu2: bool,
) {
    // Cubes numbered x + y · count_x, slots fastest ([`super::dispatch::gemv_count`]).
    let cube = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    let slot = cube % slots as usize;
    let n = ((cube / slots as usize) as u32 * CUBE_DIM_Y + UNIT_POS_Y) as usize;
    let n_out = n_out as usize;
    let mut e = 0usize;
    let mut xrow = slot;
    if routed {
        e = experts[slot] as usize;
        xrow = slot / div as usize;
    }
    let mut acc = 0.0f32;
    if n < n_out {
        acc = nvfp4_partial(x, packed, scales, e * n_out + n, xrow, k as usize);
    }
    let total = row_sum(acc, units);
    if UNIT_POS_X == 0 && n < n_out {
        y[slot * n_out + n] = F::cast_from(epilogue(total * globals[e], relu2));
    }
}

/// The vector GEMV (see [`crate::cube::linear::dispatch`]): unit row `u` of cube `c` owns output rows
/// `(c · 8 + u) · rows ..+ rows`; a lane takes the 16-byte chunks (2 blocks of 16 codes)
/// `l, l + 32, …` of each of its rows, `group` chunks per step: every weight and scale load of a
/// step is issued before any of them is used (a branch-free, clamped prologue), so one memory
/// latency covers the step — a lane's whole share of a row at the real shapes. Then each
/// activation chunk is read once (from L1) and dotted with the step's chunks of every row.
#[cube(launch_unchecked)]
pub fn nvfp4_gemv_kernel<F: Float, NX: Size, NW: Size>(
    x: &[Vector<F, NX>],
    experts: &[i32],
    packed: &[Vector<u32, NW>],
    scales: &[u32],
    globals: &[f32],
    y: &mut [F],
    y1: &mut [F],
    y2: &mut [F],
    a: u32,
    b: u32,
    k: u32,
    n_out: u32,
    slots: u32,
    div: u32,
    #[comptime] rows: usize,
    #[comptime] group: usize,
    #[comptime] units: usize,
    #[comptime] plane: bool,
    #[comptime] routed: bool,
    #[comptime] relu2: bool,
    #[comptime] hw: bool,
    #[comptime] split: bool,
) {
    // Cubes numbered x + y · count_x, slots fastest ([`super::dispatch::gemv_count`]).
    let cube = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    let slot = cube % slots as usize;
    let n0 = ((cube / slots as usize) as u32 * CUBE_DIM_Y + UNIT_POS_Y) as usize * rows;
    let (n_out, k) = (n_out as usize, k as usize);
    let mut e = 0usize;
    let mut xrow = slot;
    if routed {
        e = experts[slot] as usize;
        xrow = slot / div as usize;
    }
    let (chunks, nb) = (k / 32, k / 16);
    let mut acc = Array::<f32>::new(rows);
    #[unroll]
    for r in 0..rows {
        acc[r] = 0.0f32;
    }
    let mut words = Array::<u32>::new(group * rows * 4);
    let mut sws = Array::<u32>::new(group * rows);
    let mut xs = Array::<f32>::new(32usize);
    let step = CUBE_DIM_X as usize;
    let mut c0 = UNIT_POS_X as usize;
    while c0 < chunks {
        // Loads: chunks past the row's end read its last chunk and are masked below; rows past
        // `n_out` read the last row and are never written.
        #[unroll]
        for g in 0..group {
            let c = (c0 + g * step).min(chunks - 1);
            #[unroll]
            for r in 0..rows {
                let row = e * n_out + (n0 + r).min(n_out - 1);
                let wv = packed[row * chunks + c];
                let i = (g * rows + r) * 4;
                words[i] = wv.extract(0);
                words[i + 1] = wv.extract(1);
                words[i + 2] = wv.extract(2);
                words[i + 3] = wv.extract(3);
                // The chunk's two scale bytes: an even byte offset, so one half of a word.
                let si = row * nb + c * 2;
                sws[g * rows + r] = scales[si / 4] >> (((si % 4) * 8) as u32);
            }
        }
        #[unroll]
        for g in 0..group {
            let c = c0 + g * step;
            let valid = c < chunks;
            // 32 activations = 8 vectors of 4.
            let xb = (xrow * k + c.min(chunks - 1) * 32) / 4;
            #[unroll]
            for v in 0..8usize {
                let xv = x[xb + v];
                #[unroll]
                for j in 0..4usize {
                    xs[v * 4 + j] = f32::cast_from(xv.extract(j));
                }
            }
            #[unroll]
            for r in 0..rows {
                let i = (g * rows + r) * 4;
                let sw = sws[g * rows + r];
                let (p0, p1) = if hw {
                    (
                        word_dot_f16(words[i], &xs, 0usize)
                            + word_dot_f16(words[i + 1], &xs, 8usize),
                        word_dot_f16(words[i + 2], &xs, 16usize)
                            + word_dot_f16(words[i + 3], &xs, 24usize),
                    )
                } else {
                    (
                        word_dot(words[i], &xs, 0usize) + word_dot(words[i + 1], &xs, 8usize),
                        word_dot(words[i + 2], &xs, 16usize) + word_dot(words[i + 3], &xs, 24usize),
                    )
                };
                let p = p0 * e4m3(sw & 255u32) + p1 * e4m3((sw >> 8u32) & 255u32);
                acc[r] += if valid { p } else { 0.0f32 };
            }
        }
        c0 += group * step;
    }
    // The codes were read as value / 4 (bits) or value · 2^-14 (f16).
    let g = globals[e] * if hw { 16384.0f32 } else { 4.0f32 };
    #[unroll]
    for r in 0..rows {
        let total = lane_sum(acc[r], units, plane);
        let n = n0 + r;
        if UNIT_POS_X == 0 && n < n_out {
            let v = F::cast_from(epilogue(total * g, relu2));
            store3(y, y1, y2, slot, n, n_out, a as usize, b as usize, v, split);
        }
    }
}

/// `wd[base + j] = E2M1[code j of word] / 4 · s` for the word's 8 codes (exact: at most 2 + 4
/// significant bits).
#[cube]
fn decode_word(word: u32, s: f32, wd: &mut Array<f32>, #[comptime] base: usize) {
    wd[base] = e2m1_quarter(word, 0u32) * s;
    wd[base + 1] = e2m1_quarter(word, 1u32) * s;
    wd[base + 2] = e2m1_quarter(word, 2u32) * s;
    wd[base + 3] = e2m1_quarter(word, 3u32) * s;
    wd[base + 4] = e2m1_quarter(word, 4u32) * s;
    wd[base + 5] = e2m1_quarter(word, 5u32) * s;
    wd[base + 6] = e2m1_quarter(word, 6u32) * s;
    wd[base + 7] = e2m1_quarter(word, 7u32) * s;
}

/// `wd[base + j] = E2M1[code j of word] · 2^-14 · s` for the word's 8 codes through the f16
/// conversions (see [`super::word_dot_f16`]; exact: at most 2 + 4 significant bits).
#[cube]
fn decode_word_f16(word: u32, s: f32, wd: &mut Array<f32>, #[comptime] base: usize) {
    let m = 0x0E00_0E00u32;
    let sg = 0x8000_8000u32;
    let h0 = ((word << 9u32) & m) | ((word << 12u32) & sg);
    let h1 = ((word << 5u32) & m) | ((word << 8u32) & sg);
    let h2 = ((word << 1u32) & m) | ((word << 4u32) & sg);
    let h3 = ((word >> 3u32) & m) | (word & sg);
    let f0 = Vector::<f32, Const<2>>::cast_from(Vector::<f16, Const<2>>::reinterpret(h0));
    let f1 = Vector::<f32, Const<2>>::cast_from(Vector::<f16, Const<2>>::reinterpret(h1));
    let f2 = Vector::<f32, Const<2>>::cast_from(Vector::<f16, Const<2>>::reinterpret(h2));
    let f3 = Vector::<f32, Const<2>>::cast_from(Vector::<f16, Const<2>>::reinterpret(h3));
    wd[base] = f0.extract(0) * s;
    wd[base + 1] = f1.extract(0) * s;
    wd[base + 2] = f2.extract(0) * s;
    wd[base + 3] = f3.extract(0) * s;
    wd[base + 4] = f0.extract(1) * s;
    wd[base + 5] = f1.extract(1) * s;
    wd[base + 6] = f2.extract(1) * s;
    wd[base + 7] = f3.extract(1) * s;
}

/// The small-M path of a plain linear (2 to 8 rows of `x` per cube, `mrows`): each 16-byte weight
/// chunk is decoded once into registers and used for every row, so the decode cost does not grow
/// with the batch. One output row per unit row; cubes along x cover `mrows` rows of `x` each.
#[cube(launch_unchecked)]
pub fn nvfp4_small_m_kernel<F: Float, NX: Size, NW: Size>(
    x: &[Vector<F, NX>],
    packed: &[Vector<u32, NW>],
    scales: &[u32],
    globals: &[f32],
    y: &mut [F],
    y1: &mut [F],
    y2: &mut [F],
    a: u32,
    b: u32,
    k: u32,
    n_out: u32,
    slots: u32,
    #[comptime] mrows: usize,
    #[comptime] group: usize,
    #[comptime] units: usize,
    #[comptime] plane: bool,
    #[comptime] relu2: bool,
    #[comptime] hw: bool,
    #[comptime] split: bool,
) {
    let slots = slots as usize;
    // Cubes numbered x + y · count_x, row groups fastest ([`super::dispatch::small_m_count`]).
    let cube = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    let groups = slots.div_ceil(mrows);
    let m0 = (cube % groups) * mrows;
    let n = ((cube / groups) as u32 * CUBE_DIM_Y + UNIT_POS_Y) as usize;
    let (n_out, k) = (n_out as usize, k as usize);
    // Rows past the end compute on the last row and are never written.
    let row = n.min(n_out - 1);
    let (chunks, nb) = (k / 32, k / 16);
    let mut acc = Array::<f32>::new(mrows);
    #[unroll]
    for m in 0..mrows {
        acc[m] = 0.0f32;
    }
    let mut words = Array::<u32>::new(group * 4);
    let mut sws = Array::<u32>::new(group);
    let mut wd = Array::<f32>::new(32usize);
    let step = CUBE_DIM_X as usize;
    let mut c0 = UNIT_POS_X as usize;
    while c0 < chunks {
        // A step's weight and scale loads first (clamped; chunks past the end masked below).
        #[unroll]
        for g in 0..group {
            let c = (c0 + g * step).min(chunks - 1);
            let wv = packed[row * chunks + c];
            words[g * 4] = wv.extract(0);
            words[g * 4 + 1] = wv.extract(1);
            words[g * 4 + 2] = wv.extract(2);
            words[g * 4 + 3] = wv.extract(3);
            let si = row * nb + c * 2;
            sws[g] = scales[si / 4] >> (((si % 4) * 8) as u32);
        }
        #[unroll]
        for g in 0..group {
            let c = c0 + g * step;
            let valid = c < chunks;
            let cc = c.min(chunks - 1);
            let sw = sws[g];
            let (s0, s1) = (e4m3(sw & 255u32), e4m3((sw >> 8u32) & 255u32));
            if hw {
                decode_word_f16(words[g * 4], s0, &mut wd, 0usize);
                decode_word_f16(words[g * 4 + 1], s0, &mut wd, 8usize);
                decode_word_f16(words[g * 4 + 2], s1, &mut wd, 16usize);
                decode_word_f16(words[g * 4 + 3], s1, &mut wd, 24usize);
            } else {
                decode_word(words[g * 4], s0, &mut wd, 0usize);
                decode_word(words[g * 4 + 1], s0, &mut wd, 8usize);
                decode_word(words[g * 4 + 2], s1, &mut wd, 16usize);
                decode_word(words[g * 4 + 3], s1, &mut wd, 24usize);
            }
            #[unroll]
            for m in 0..mrows {
                let xb = ((m0 + m).min(slots - 1) * k + cc * 32) / 4;
                let mut p = 0.0f32;
                #[unroll]
                for v in 0..8usize {
                    let xv = x[xb + v];
                    p += wd[v * 4] * f32::cast_from(xv.extract(0))
                        + wd[v * 4 + 1] * f32::cast_from(xv.extract(1))
                        + wd[v * 4 + 2] * f32::cast_from(xv.extract(2))
                        + wd[v * 4 + 3] * f32::cast_from(xv.extract(3));
                }
                acc[m] += if valid { p } else { 0.0f32 };
            }
        }
        c0 += group * step;
    }
    // The codes were read as value / 4 (bits) or value · 2^-14 (f16).
    let g = globals[0] * if hw { 16384.0f32 } else { 4.0f32 };
    #[unroll]
    for m in 0..mrows {
        let total = lane_sum(acc[m], units, plane);
        if UNIT_POS_X == 0 && n < n_out && m0 + m < slots {
            let v = F::cast_from(epilogue(total * g, relu2));
            store3(
                y,
                y1,
                y2,
                m0 + m,
                n,
                n_out,
                a as usize,
                b as usize,
                v,
                split,
            );
        }
    }
}

/// NVFP4 at each tier of [`super::launcher`]: the decoded path (plain rows); the tiled kernel
/// ([`super::tile`]) or [`super::mma`]'s; the expert-major GEMV ([`super::grouped`], the vector
/// GEMV where it cannot be launched), the small-M, vector or scalar GEMV.
impl<R: CubeRuntime> Weights<R> for Nvfp4Weights<CubeBackend<R>> {
    const FORMAT: Format = Format::Nvfp4;
    fn experts(&self) -> usize {
        self.shape.experts
    }
    fn out_features(&self) -> usize {
        self.shape.out_features
    }
    /// The vector and small-M kernels write the parts; the scalar one (`k % 32 != 0`) does not.
    fn splits(&self, k: usize) -> bool {
        k % 32 == 0
    }
    fn decoded(&self, c: &Call<R>) -> Result<(), String> {
        super::decoded::nvfp4(c, self)
    }
    fn tensor_cores(&self, c: &Call<R>, path: LinearPath) -> bool {
        match path {
            LinearPath::Tiled { .. } => super::tile::nvfp4(
                c,
                self,
                super::mma::sort_min_slots(),
                super::tile::TileShape::of(&super::super::tensor_core::tuning()),
            )
            .is_some(),
            LinearPath::Mma(form) => super::mma::nvfp4(c, self, form).is_some(),
            _ => false,
        }
    }
    fn gemv(&self, c: &Call<R>, path: LinearPath) {
        if path == LinearPath::ExpertMajor {
            // A call without expert ids: the vector GEMV.
            if super::grouped::launch(c, self).is_none() {
                gemv(c, self, LinearPath::Gemv);
            }
            return;
        }
        gemv(c, self, path)
    }
}

/// Launches the small-M, vector (`Gemv`, and the expert-major path's fallback) or scalar kernel
/// for `c`.
fn gemv<R: CubeRuntime>(c: &Call<R>, w: &Nvfp4Weights<CubeBackend<R>>, path: LinearPath) {
    let (sa, sb) = c.split_args();
    if path == LinearPath::SmallM {
        let mrows = small_m_rows(c.slots);
        let group = gemv_group(c.k / 32, 1, NVFP4_CHUNK_BUDGET / 2);
        let hw = hw_decode(&c.x.client);
        let plane = plane_reduce(&c.x.client, GEMV_LANES);
        macro_rules! small {
            ($t:ty) => {
                // Safety: as below; rows of `x` past `slots` are clamped and never written.
                unsafe {
                    nvfp4_small_m_kernel::launch_unchecked::<$t, R>(
                        &c.x.client,
                        small_m_count(c.n, c.slots, mrows),
                        gemv_dim(),
                        4,
                        4,
                        arg(&c.x),
                        arg(&w.packed),
                        arg(&w.scales),
                        arg(&w.globals),
                        arg(&c.y),
                        arg(&c.y1),
                        arg(&c.y2),
                        sa,
                        sb,
                        c.k as u32,
                        c.n as u32,
                        c.slots as u32,
                        mrows,
                        group,
                        GEMV_UNITS,
                        plane,
                        c.relu2,
                        hw,
                        c.split.is_some(),
                    )
                }
            };
        }
        with_float!(c.dtype, small);
        return;
    }
    if path != LinearPath::Scalar {
        let r = rows_per_unit_row(c.n, c.slots);
        let group = gemv_group(c.k / 32, r, NVFP4_CHUNK_BUDGET);
        let hw = hw_decode(&c.x.client);
        let plane = plane_reduce(&c.x.client, GEMV_LANES);
        macro_rules! vector {
            ($t:ty) => {
                // Safety: every index stays inside its buffer: `k % 32 == 0` makes the activation
                // row and weight chunks whole vectors; rows ≥ `n_out` and slots ≥ `slots` are
                // skipped; expert ids come from the routing op (< E).
                unsafe {
                    nvfp4_gemv_kernel::launch_unchecked::<$t, R>(
                        &c.x.client,
                        gemv_count(c.n, c.slots, r),
                        gemv_dim(),
                        4,
                        4,
                        arg(&c.x),
                        c.experts_arg(),
                        arg(&w.packed),
                        arg(&w.scales),
                        arg(&w.globals),
                        arg(&c.y),
                        arg(&c.y1),
                        arg(&c.y2),
                        sa,
                        sb,
                        c.k as u32,
                        c.n as u32,
                        c.slots as u32,
                        c.div as u32,
                        r,
                        group,
                        GEMV_UNITS,
                        plane,
                        c.routed,
                        c.relu2,
                        hw,
                        c.split.is_some(),
                    )
                }
            };
        }
        with_float!(c.dtype, vector);
        return;
    }
    macro_rules! go {
        ($t:ty) => {
            nvfp4_linear_kernel::launch::<$t, R>(
                &c.x.client,
                gemv_count(c.n, c.slots, 1),
                gemv_dim(),
                arg(&c.x),
                c.experts_arg(),
                arg(&w.packed),
                arg(&w.scales),
                arg(&w.globals),
                arg(&c.y),
                c.k as u32,
                c.n as u32,
                c.slots as u32,
                c.div as u32,
                GEMV_UNITS,
                c.routed,
                c.relu2,
            )
        };
    }
    with_float!(c.dtype, go);
}
