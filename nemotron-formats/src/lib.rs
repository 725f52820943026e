//! Number formats of the shipped checkpoints: decoders (E2M1, E4M3FN, BF16, F16), NVFP4 / FP8
//! dequantization of a row, and the encoders used to build fixtures the way NVIDIA ModelOpt does.
//!
//! Every reader here takes little-endian bytes and never reinterprets a byte buffer as a typed
//! slice: safetensors data offsets need not be aligned.
// Library code takes no panic from data: every unwrap/expect is an error, or allowed where it
// stands with the invariant that makes it safe written beside it.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

/// E2M1 (FP4) values of the 16 codes: bit 3 is the sign, bits 2..0 index the magnitudes.
pub const E2M1_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Largest finite E4M3FN value.
pub const E4M3_MAX: f32 = 448.0;
/// Largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// NVFP4 block length along the input dimension.
pub const NVFP4_BLOCK: usize = 16;

/// Decodes one E2M1 code (the low 4 bits of `code`).
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    E2M1_VALUES[(code & 0x0F) as usize]
}

/// Decodes one E4M3FN byte: bias 7, no infinities, NaN = 0x7F / 0xFF, subnormals `m/8 · 2^-6`.
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((b >> 3) & 0x0F) as i32;
    let m = (b & 0x07) as f32;
    if e == 0x0F && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if e == 0 {
        sign * (m / 8.0) * 2f32.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

/// True for the two E4M3FN NaN encodings.
#[inline]
pub fn e4m3_is_nan(b: u8) -> bool {
    b & 0x7F == 0x7F
}

/// Encodes an f32 to E4M3FN with round-to-nearest-even (as `torch.Tensor.to(float8_e4m3fn)`).
///
/// Finite values beyond ±448 saturate to ±448 instead of becoming NaN as torch's cast does past
/// 464; the encoders below never produce such inputs. NaN encodes to 0x7F.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    let min_normal = 2f32.powi(-6);
    let code = if a < min_normal {
        // Subnormal grid: multiples of 2^-9. Scaling by a power of two is exact.
        let q = (a * 512.0).round_ties_even() as u32; // 0..=8; 8 is the smallest normal
        q as u8
    } else {
        let e = exponent_of(a); // a in [2^e, 2^(e+1))
        let q = (a * 2f32.powi(3 - e)).round_ties_even() as u32; // 8..=16
        let (e, q) = if q == 16 { (e + 1, 8) } else { (e, q) };
        let biased = e + 7;
        if biased > 15 || (biased == 15 && q - 8 > 6) {
            0x7E // saturate at 448
        } else {
            ((biased as u8) << 3) | (q - 8) as u8
        }
    };
    sign | code
}

/// floor(log2(a)) for a normal positive f32.
fn exponent_of(a: f32) -> i32 {
    ((a.to_bits() >> 23) & 0xFF) as i32 - 127
}

/// Encodes a magnitude-and-sign value to the nearest E2M1 code, ties to the even code, as
/// ModelOpt's `_cast_fp4` does (thresholds 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5; values past 6
/// saturate). The sign bit is set for strictly negative inputs.
pub fn f32_to_e2m1(x: f32) -> u8 {
    let a = x.abs();
    let mag: u8 = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    if x < 0.0 {
        mag | 0x08
    } else {
        mag
    }
}

/// Reads element `i` of a little-endian BF16 buffer.
#[inline]
pub fn bf16_at(bytes: &[u8], i: usize) -> f32 {
    half::bf16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
}

/// Reads element `i` of a little-endian F16 buffer.
#[inline]
pub fn f16_at(bytes: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
}

/// Reads element `i` of a little-endian F32 buffer.
#[inline]
pub fn f32_at(bytes: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([
        bytes[4 * i],
        bytes[4 * i + 1],
        bytes[4 * i + 2],
        bytes[4 * i + 3],
    ])
}

/// f32 → bf16 bits, round-to-nearest-even.
#[inline]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// f32 → f16 bits, round-to-nearest-even.
#[inline]
pub fn f32_to_f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// Dequantizes one NVFP4 row of `cols` elements into `out`:
/// `W[c] = E2M1[nib(c)] · f32(e4m3(scale[c/16])) · weight_scale_2`, evaluated in that order.
/// `packed` holds `cols/2` bytes (low nibble = even column), `scales` holds `cols/16` E4M3 bytes.
pub fn nvfp4_dequant_row(packed: &[u8], scales: &[u8], weight_scale_2: f32, out: &mut [f32]) {
    let cols = out.len();
    debug_assert_eq!(packed.len() * 2, cols);
    debug_assert_eq!(scales.len() * NVFP4_BLOCK, cols);
    for (b, &s) in scales.iter().enumerate() {
        let bs = e4m3_to_f32(s);
        for j in 0..NVFP4_BLOCK / 2 {
            let byte = packed[b * NVFP4_BLOCK / 2 + j];
            let c = b * NVFP4_BLOCK + 2 * j;
            out[c] = e2m1_to_f32(byte & 0x0F) * bs * weight_scale_2;
            out[c + 1] = e2m1_to_f32(byte >> 4) * bs * weight_scale_2;
        }
    }
}

/// Dequantizes one per-tensor FP8 row: `W[c] = f32(e4m3(w[c])) · weight_scale`.
pub fn fp8_dequant_row(weight: &[u8], weight_scale: f32, out: &mut [f32]) {
    for (o, &b) in out.iter_mut().zip(weight) {
        *o = e4m3_to_f32(b) * weight_scale;
    }
}

/// An NVFP4-encoded matrix as ModelOpt exports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Encoded {
    /// `[rows, cols/2]`, low nibble = even column.
    pub packed: Vec<u8>,
    /// `[rows, cols/16]` E4M3 block scales, row-major.
    pub block_scales: Vec<u8>,
    /// The global scale `amax / (6 · 448)`.
    pub weight_scale_2: f32,
}

/// The NVFP4 global scale ModelOpt computes: `amax(|W|) / (6 · 448)`.
pub fn nvfp4_global_scale(w: &[f32]) -> f32 {
    let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    amax / (E2M1_MAX * E4M3_MAX)
}

/// Encodes a row-major `[rows, cols]` matrix to NVFP4 the way ModelOpt's
/// `NVFP4QTensor.quantize(w, 16)` does: global scale `amax/2688`, per-block scale
/// `e4m3(clamp(block_amax / (6 · global), 2^-9, 448))` (1.0 for an all-zero block), codes
/// `round_e2m1(w / (f32(block_scale) · global))`.
///
/// Panics if `cols` is not a multiple of 16 or `w.len() != rows·cols` (fixture code).
pub fn nvfp4_encode(w: &[f32], rows: usize, cols: usize) -> Nvfp4Encoded {
    let gs = nvfp4_global_scale(w);
    nvfp4_encode_with_global(w, rows, cols, gs)
}

/// [`nvfp4_encode`] with a given global scale (the writer streams rows and knows `amax` ahead).
pub fn nvfp4_encode_with_global(w: &[f32], rows: usize, cols: usize, gs: f32) -> Nvfp4Encoded {
    assert_eq!(w.len(), rows * cols, "nvfp4_encode: length");
    assert_eq!(cols % NVFP4_BLOCK, 0, "nvfp4_encode: cols % 16");
    let nb = cols / NVFP4_BLOCK;
    let mut packed = vec![0u8; rows * cols / 2];
    let mut block_scales = vec![0u8; rows * nb];
    for r in 0..rows {
        for b in 0..nb {
            let blk = &w[r * cols + b * NVFP4_BLOCK..r * cols + (b + 1) * NVFP4_BLOCK];
            let bamax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            // ModelOpt: a zero scale becomes 1.0; others are clamped to [2^-9, 448] before the cast.
            let raw = bamax / (E2M1_MAX * gs);
            let s = if raw == 0.0 {
                0x38
            } else {
                f32_to_e4m3(raw.clamp(2f32.powi(-9), E4M3_MAX))
            };
            block_scales[r * nb + b] = s;
            let denom = e4m3_to_f32(s) * gs;
            for j in 0..NVFP4_BLOCK / 2 {
                let lo = f32_to_e2m1(blk[2 * j] / denom);
                let hi = f32_to_e2m1(blk[2 * j + 1] / denom);
                packed[(r * cols + b * NVFP4_BLOCK) / 2 + j] = lo | (hi << 4);
            }
        }
    }
    Nvfp4Encoded {
        packed,
        block_scales,
        weight_scale_2: gs,
    }
}

/// Encodes to per-tensor FP8 as ModelOpt exports `quant_algo: FP8` weights:
/// `weight_scale = amax / 448`, `weight = e4m3(w / weight_scale)`. Returns (bytes, weight_scale).
pub fn fp8_encode(w: &[f32]) -> (Vec<u8>, f32) {
    let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = if amax == 0.0 { 1.0 } else { amax / E4M3_MAX };
    (w.iter().map(|&v| f32_to_e4m3(v / scale)).collect(), scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_anchors() {
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
        assert_eq!(e4m3_to_f32(0x80), 0.0);
        assert!(e4m3_to_f32(0x80).is_sign_negative());
    }

    #[test]
    fn e4m3_roundtrip_all_finite_codes() {
        for b in 0u8..=255 {
            if e4m3_is_nan(b) {
                continue;
            }
            assert_eq!(f32_to_e4m3(e4m3_to_f32(b)), b, "code {b:#04x}");
        }
    }

    #[test]
    fn e2m1_anchors() {
        assert_eq!(e2m1_to_f32(0x7), 6.0);
        assert_eq!(e2m1_to_f32(0xF), -6.0);
        assert_eq!(e2m1_to_f32(0x1), 0.5);
        assert_eq!(e2m1_to_f32(0x9), -0.5);
        // Ties: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5 -> 4.0.
        let ties = [
            (0.25, 0),
            (0.75, 2),
            (1.25, 2),
            (1.75, 4),
            (2.5, 4),
            (3.5, 6),
            (5.0, 6),
        ];
        for (x, c) in ties {
            assert_eq!(f32_to_e2m1(x), c, "tie {x}");
            assert_eq!(f32_to_e2m1(-x), c | 8, "tie -{x}");
        }
        assert_eq!(f32_to_e2m1(100.0), 7);
    }

    #[test]
    fn bf16_round_to_nearest_even() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(f32_to_bf16_bits(1.0 + 2f32.powi(-8)), 0x3F80);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: ties to even (up).
        assert_eq!(f32_to_bf16_bits(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82);
        // Just above the halfway point rounds up.
        assert_eq!(
            f32_to_bf16_bits(1.0 + 2f32.powi(-8) + 2f32.powi(-20)),
            0x3F81
        );
        let b = f32_to_bf16_bits(-2.5).to_le_bytes();
        assert_eq!(bf16_at(&b, 0), -2.5);
    }
}
