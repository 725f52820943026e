//! What the quantized tensor-core kernels ([`super::mma`], [`super::tile`], [`super::gemm`])
//! share of the weight formats: the E2M1 pair decode and the E4M3 words that feed an `mma`
//! fragment, and a step's NVFP4 / FP8 loads. (What every `mma` family shares, the dense matmul's
//! included — sizes, settings, plain loads, the K-split sum — is [`super::super::tensor_core`].)
//! A leaf: it imports no kernel module, so the kernels import it one way.

use super::super::tensor_core::chunk_load;
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
