//! What the tensor-core kernels ([`super::mma`], [`super::tile`], [`super::gemm`]) share: the E2M1
//! pair decode and the E4M3 words that feed an `mma` fragment, the weight loads of a step, and the row-block and token-tile
//! arithmetic of their grids. A leaf: it imports no kernel module, so the kernels import it one
//! way.

use burn::tensor::{bf16, f16};
use cubecl::prelude::*;

/// The E4M3 element type of the FP8 `mma`.
pub(super) type Fp8E4m3 = cubecl::e4m3;

/// `E2M1 · scale` of nibbles `(p, p + 4)` of `word` as a bf16 pair, exactly ([`super::mma`]):
/// the nibbles as f16 `E2M1 · 2^-14`, to f32, times `scale` (which carries the `2^14`), to bf16.
#[cube]
pub(super) fn e2m1_pair(word: u32, scale: f32, #[comptime] p: u32) -> Vector<bf16, Const<2>> {
    let mag = if p < 3 {
        (word << (9 - 4 * p)) & 0x0E00_0E00u32
    } else {
        (word >> 3u32) & 0x0E00_0E00u32
    };
    let sign = (word << (12 - 4 * p)) & 0x8000_8000u32;
    let h = Vector::<f16, Const<2>>::reinterpret(mag | sign);
    let f = Vector::<f32, Const<2>>::cast_from(h) * Vector::new(scale);
    Vector::<bf16, Const<2>>::cast_from(f)
}

/// `E2M1 · scale · 2^-14` of nibbles `(p, p + 4)` of `word` as a bf16 pair, exactly, in
/// bf16 alone ([`super::tile`] with [`super::tile::TileShape::bf16_decode`]): the magnitude
/// bits `e1 e0 m` land in the bf16 exponent's two low bits and the mantissa's top bit, which
/// reads `E2M1 · 2^-126` for every code (`2^(e−127) · (1 + m/2)` for `e ≥ 1`, the subnormal
/// `2^-126 · m/2` for `e = 0`), the sign in bit 15; one bf16 multiply by `scale` (the block
/// scale `· 2^112`, exact in bf16: E4M3 has 4 significant bits) gives `E2M1 · block scale ·
/// 2^-14`, a multiple of `2^-24` of at most 6 significant bits below 0.17: exact. The caller
/// multiplies its f32 sums by `2^14` (a power of two: the same sums as [`e2m1_pair`]'s).
/// Three integer operations and one bf16 multiply per pair, against [`e2m1_pair`]'s f16 → f32
/// conversions, f32 multiplies and pack.
#[cube]
pub(super) fn e2m1_pair_bf16(word: u32, scale: bf16, #[comptime] p: u32) -> Vector<bf16, Const<2>> {
    let m = 0x01C0_01C0u32;
    let mag = if p == 0 {
        (word << 6u32) & m
    } else if p == 1 {
        (word << 2u32) & m
    } else if p == 2 {
        (word >> 2u32) & m
    } else {
        (word >> 6u32) & m
    };
    let sign = (word << (12 - 4 * p)) & 0x8000_8000u32;
    Vector::<bf16, Const<2>>::reinterpret(mag | sign) * Vector::new(scale)
}

/// `2^112` (f32 bits `(112 + 127) << 23`): the factor [`e2m1_pair_bf16`]'s scale carries.
pub(super) const TWO_POW_112_BITS: u32 = 0x7780_0000;

/// The E4M3 `A` fragment of `k32` step `h` (0 or 1) of a 16-byte FP8 chunk pair ([`super::mma`]):
/// words `2h`, `2h + 1` of rows `g` (`va`) and `g + 8` (`vb`) in the `mma`'s register order,
/// each word ANDed with `z` (all ones, or zero for a chunk past the row's end).
#[cube]
pub(super) fn fp8_a<NW: Size>(
    va: Vector<u32, NW>,
    vb: Vector<u32, NW>,
    z: u32,
    #[comptime] h: usize,
) -> Array<Vector<Fp8E4m3, Const<4>>> {
    let mut r = Array::<Vector<Fp8E4m3, Const<4>>>::new(4usize);
    r[0] = Vector::<Fp8E4m3, Const<4>>::reinterpret(va.extract(2 * h) & z);
    r[1] = Vector::<Fp8E4m3, Const<4>>::reinterpret(vb.extract(2 * h) & z);
    r[2] = Vector::<Fp8E4m3, Const<4>>::reinterpret(va.extract(2 * h + 1) & z);
    r[3] = Vector::<Fp8E4m3, Const<4>>::reinterpret(vb.extract(2 * h + 1) & z);
    r
}

/// Loads `grp` 128-input steps of rows `row0`/`row1` from step `it0` (clamped to the last
/// chunk: [`chunk_load`]) with their block-scale words, for the NVFP4 kernels.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn nvfp4_load<NW: Size>(
    packed: &[Vector<u32, NW>],
    scales: &[u32],
    row0: usize,
    row1: usize,
    chunks: usize,
    nb: usize,
    it0: usize,
    t: usize,
    wa: &mut Array<Vector<u32, NW>>,
    wb: &mut Array<Vector<u32, NW>>,
    sa: &mut Array<u32>,
    sb: &mut Array<u32>,
    #[comptime] grp: usize,
) {
    chunk_load(packed, row0, row1, chunks, it0, t, wa, wb, grp);
    #[unroll]
    for q in 0..grp {
        let cc = ((it0 + q) * 4 + t).min(chunks - 1);
        let si0 = row0 * nb + cc * 2;
        let si1 = row1 * nb + cc * 2;
        sa[q] = scales[si0 / 4] >> (((si0 % 4) * 8) as u32);
        sb[q] = scales[si1 / 4] >> (((si1 % 4) * 8) as u32);
    }
}

/// Loads `grp` steps of 16-byte chunks of rows `row0`/`row1` from step `it0` (clamped to the
/// last chunk), for the FP8 and dense kernels.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_load<NW: Size>(
    w: &[Vector<u32, NW>],
    row0: usize,
    row1: usize,
    chunks: usize,
    it0: usize,
    t: usize,
    wa: &mut Array<Vector<u32, NW>>,
    wb: &mut Array<Vector<u32, NW>>,
    #[comptime] grp: usize,
) {
    #[unroll]
    for q in 0..grp {
        let cc = ((it0 + q) * 4 + t).min(chunks - 1);
        wa[q] = w[row0 * chunks + cc];
        wb[q] = w[row1 * chunks + cc];
    }
}

/// The end of the block of `block` rows from `first` in a call of `count` rows.
#[cube]
pub(super) fn block_end(first: usize, block: u32, count: usize) -> usize {
    let end = first + block as usize;
    if end < count {
        end
    } else {
        count
    }
}

/// Passes of `8 · nt` rows a plain (unrouted) tensor-core cube takes: one. A prefill's rows
/// then spread over grid y in blocks of one pass instead of one cube row walking them all:
/// at 1,024 rows the FP8 `in_proj` had 644 cubes of 4 warps (≈ 20 warps per H200 SM) and the
/// dense `o_proj` 168 cubes of 16 warps splitting K, each walking 16 passes (ncu, PERF §15).
pub const BLOCK_PASSES: usize = 1;

/// Rows per block and blocks (grid y, folded onto z past 65,535) of a plain call over `rows`
/// rows taken `8 · nt` per pass (pure; tested on the host).
pub fn blocks(rows: usize, nt: usize) -> (usize, usize) {
    let block = 8 * nt * BLOCK_PASSES;
    (block, rows.div_ceil(block).max(1))
}

/// Token tiles of 8 per pass for `per_expert` tokens on average.
pub(super) fn tiles(per_expert: usize) -> usize {
    tiles_up_to(per_expert, 8)
}

/// Token tiles of 8 per pass for `per_expert` tokens on average, at most `max` (4, 8 or 16;
/// pure, tested on the host).
pub fn tiles_up_to(per_expert: usize, max: usize) -> usize {
    let nt = match per_expert.div_ceil(8) {
        0 | 1 => 1,
        2 => 2,
        3 | 4 => 4,
        5..=8 => 8,
        _ => 16,
    };
    nt.min(max)
}

/// Warps per cube of a tiled launch taking `nt` token tiles per pass with `warps` asked for:
/// a cube stages `8 · nt` tokens × 16 vectors, one vector per thread at least, so 8 warps need
/// 2 tiles or more (pure, tested on the host).
pub fn tile_warps(warps: usize, nt: usize) -> usize {
    warps.min(4 * nt).max(4)
}
