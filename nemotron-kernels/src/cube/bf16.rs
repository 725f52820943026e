//! The bf16 SSM state's codec, shared by the decode step and the slot writes: two bf16 to a u32
//! word, element `2w` in the low half (little-endian element order, as the FP8 KV words), read
//! exactly as f32 and written rounded to nearest even. (NaN payloads held only in the low 16
//! bits round to infinity; a finite state never has them.)

use cubecl::prelude::*;

/// The bf16 in the low half of a word, as f32 (exact).
#[cube]
pub(crate) fn bf16_lo(w: u32) -> f32 {
    f32::reinterpret(w << 16u32)
}

/// The bf16 in the high half of a word, as f32 (exact).
#[cube]
pub(crate) fn bf16_hi(w: u32) -> f32 {
    f32::reinterpret(w & 0xFFFF_0000u32)
}

/// `lo` and `hi` rounded to the nearest bf16 (ties to even, as `torch.to(bfloat16)` and
/// `half::bf16::from_f32`), packed `lo | hi << 16`.
#[cube]
pub(crate) fn bf16_word(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) | (bf16_bits(hi) << 16u32)
}

#[cube]
fn bf16_bits(x: f32) -> u32 {
    let b = u32::reinterpret(x);
    (b + 0x7FFFu32 + ((b >> 16u32) & 1u32)) >> 16u32
}
