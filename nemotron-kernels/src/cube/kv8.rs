//! The FP8 KV cache's codec, shared by the decode attention kernels and the slot writes: a key
//! or value `x` is stored as the E4M3 code of `clamp(x / scale, ±448)` (round to nearest even,
//! the activations' rounding), four codes to a little-endian u32 word in element order, and read
//! as `f32(code) · scale` — vLLM's convention, with the checkpoint's `k_scale` / `v_scale`.
//!
//! Every function takes `fp8` at compile time: `false` is the plain cache in the activation
//! type (`P = F`), so one kernel text serves both.

use crate::cube::linear::{e4m3, e4m3_byte, e4m3_round};
use cubecl::prelude::*;

/// Element `i` of a pool as f32: `pool[i]` (plain) or code `i` of the u32 words times `scale`.
/// (`&mut`: the kernels hold their pools mutably, and CubeCL does not reborrow them as shared.)
#[cube]
pub(crate) fn kv_read<P: Numeric>(
    pool: &mut [P],
    i: usize,
    scale: f32,
    #[comptime] fp8: bool,
) -> f32 {
    if fp8 {
        let w = u32::cast_from(pool[i / 4]);
        e4m3((w >> (((i % 4) * 8) as u32)) & 255u32) * scale
    } else {
        f32::cast_from(pool[i])
    }
}

/// Elements `at .. at + len` of a pool as f32 into `out` (as [`kv_read`] each). With FP8 codes
/// and `at`, `len` multiples of 4 (`words`, known when compiled) each word is loaded once and its
/// four codes decoded at fixed shifts, where the element-wise read loads it four times and
/// shifts by a runtime amount (a decode step's key row: the FP8 cache's batch-1 cost, PERF 34).
#[cube]
pub(crate) fn kv_read_row<P: Numeric>(
    pool: &mut [P],
    at: usize,
    out: &mut Array<f32>,
    scale: f32,
    #[comptime] len: usize,
    #[comptime] fp8: bool,
    #[comptime] words: bool,
) {
    if fp8 && words {
        #[unroll]
        for w in 0..len / 4 {
            let word = u32::cast_from(pool[at / 4 + w]);
            #[unroll]
            for j in 0..4u32 {
                out[4 * w + j as usize] = e4m3((word >> (8 * j)) & 255u32) * scale;
            }
        }
    } else {
        #[unroll]
        for i in 0..len {
            out[i] = kv_read(pool, at + i, scale, fp8);
        }
    }
}

/// Elements `d0 .. d0 + half` of the key a decode step attends at one position, into `out`:
/// the step's own token (`own`) from `k[from ..]`, rounded as its pool stores it, so it reads
/// what later steps will; an earlier one from the pool row at element `at` ([`kv_read_row`],
/// word-aligned where `half` is a multiple of 4: then so are the head dim and `d0`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn kv_key_half<F: Float, P: Numeric>(
    k: &[F],
    from: usize,
    pool: &mut [P],
    at: usize,
    own: bool,
    out: &mut Array<f32>,
    scale: f32,
    #[comptime] half: usize,
    #[comptime] fp8: bool,
) {
    if own {
        #[unroll]
        for i in 0..half {
            out[i] = kv_round(f32::cast_from(k[from + i]), scale, fp8);
        }
    } else {
        kv_read_row(pool, at, out, scale, half, fp8, comptime!(half % 4 == 0));
    }
}

/// What a pool gives back for `x` once stored: `x` (plain) or its E4M3 round trip.
#[cube]
pub(crate) fn kv_round(x: f32, scale: f32, #[comptime] fp8: bool) -> f32 {
    if fp8 {
        e4m3_round((x / scale).clamp(-448.0f32, 448.0f32)) * scale
    } else {
        x
    }
}

/// The word of codes of `src[at .. at + 4]` divided by `scale`.
#[cube]
pub(crate) fn kv_word<F: Float>(src: &[F], at: usize, scale: f32) -> u32 {
    let mut word = 0u32;
    #[unroll]
    for j in 0..4usize {
        let v = (f32::cast_from(src[at + j]) / scale).clamp(-448.0f32, 448.0f32);
        word |= e4m3_byte(e4m3_round(v)) << ((8 * j) as u32);
    }
    word
}

/// Unit `u`'s share of storing the `hd` values `src[from ..]` as the pool row that starts at
/// element `to` (a multiple of `hd`): element `u` (plain; units `< hd`) or word `u` (`fp8`;
/// units `< hd / 4`, `hd` a multiple of 4).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn kv_store<F: Float, P: Numeric>(
    pool: &mut [P],
    to: usize,
    src: &[F],
    from: usize,
    u: usize,
    scale: f32,
    #[comptime] hd: usize,
    #[comptime] fp8: bool,
) {
    if fp8 {
        if u < hd / 4 {
            pool[to / 4 + u] = P::cast_from(kv_word(src, from + 4 * u, scale));
        }
    } else if u < hd {
        pool[to + u] = P::cast_from(src[from + u]);
    }
}
