//! Linears against packed weights: NVFP4 (W4A16) and FP8 (static W8A8), plain or routed over a
//! stack of experts, with the epilogue fused. GEMVs for one or few rows; [`mma`] runs batches of
//! bf16 rows on CUDA tensor cores; [`dispatch`] names the GEMVs' launch geometry.

pub mod decoded;
pub mod dispatch;
pub mod fp8;
pub mod frag;
pub mod gemm;
pub mod grouped;
pub mod launcher;
pub mod mma;
pub mod nvfp4;
pub mod plan;
pub mod tile;

use super::buffers::{arg, empty, float_buf, i32_buf};
pub(crate) use super::reduce::lane_sum;
use crate::{Epilogue, Rows};
use burn::tensor::f16;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;
/// CubeCL's E4M3 element (the name `e4m3` is this module's bit-level decoder).
type Fp8E4m3 = cubecl::e4m3;

/// The value of an E2M1 code (bit 3 sign, bits 0-2 magnitude: 0, 0.5, 1, 1.5, 2, 3, 4, 6) built
/// from its bits, without a table lookup: magnitudes ≥ 2 are `2^((m>>1)-1) · (1 + (m&1)/2)`, i.e.
/// f32 exponent `(m>>1) + 126` and the top mantissa bit `m&1`; 1 is 0.5 (0x3F000000), 0 is 0.
#[cube]
pub(crate) fn e2m1(code: u32) -> f32 {
    let m = code & 7u32;
    let normal = (((m >> 1u32) + 126u32) << 23u32) | ((m & 1u32) << 22u32);
    let small = m * 0x3F000000u32;
    let bits = if m >= 2u32 { normal } else { small };
    f32::reinterpret(bits | ((code & 8u32) << 28u32))
}

/// The value of an E4M3 (FN) byte built from its bits: exponent bias 7, normals
/// `2^(e−7) · (1 + m/8)` (f32 exponent field `e + 120`, mantissa `m << 20`), subnormals
/// `m · 2^−9`; the NaN codes (0x7F, 0xFF) read as 0 (the loader refuses NaN scales).
#[cube]
pub(crate) fn e4m3(byte: u32) -> f32 {
    let e = (byte >> 3u32) & 15u32;
    let m = byte & 7u32;
    let normal = f32::reinterpret(((e + 120u32) << 23u32) | (m << 20u32));
    let sub = f32::cast_from(m) * 0.001953125f32;
    let mag = if e == 0u32 { sub } else { normal };
    let v = if (byte & 128u32) != 0u32 { -mag } else { mag };
    if (byte & 127u32) == 127u32 {
        0.0f32
    } else {
        v
    }
}

/// E2M1 code `j` (nibble `j`, low first) of `word`, divided by 4 — exactly, in a few integer
/// and float operations: the magnitude bits `e1 e0 m` land in the f32 exponent's low bits and the
/// top mantissa bit over an exponent base of 124 (`0x3E000000`, OR-able: its low two exponent
/// bits are clear), giving `v = 2^(e−3)·(1 + m/2)` = the value / 4 for `e ≥ 1`; for `e = 0` that
/// reads `1/8 + m/16` where `m/8` is wanted, which is `2v − 1/4` — and `min(v, 2v − 1/4)` picks
/// the right one for every code (for `e ≥ 1`, `v ≥ 1/4` so `2v − 1/4 ≥ v`). The sign bit is
/// XORed in last (code 8 gives −0, as the format says).
#[cube]
pub(crate) fn e2m1_quarter(word: u32, #[comptime] j: u32) -> f32 {
    let bits = if j <= 5 {
        word << (22 - 4 * j)
    } else {
        word >> (4 * j - 22)
    };
    let v = f32::reinterpret((bits & 0x01C0_0000u32) | 0x3E00_0000u32);
    let q = v.min(2.0f32 * v - 0.25f32);
    let sign = (word << (28 - 4 * j)) & 0x8000_0000u32;
    f32::reinterpret(u32::reinterpret(q) ^ sign)
}

/// `Σ_j E2M1[code j of word] · xs[base + j] / 4` over a word's 8 nibbles.
#[cube]
pub(crate) fn word_dot(word: u32, xs: &Array<f32>, #[comptime] base: usize) -> f32 {
    let mut p = e2m1_quarter(word, 0u32) * xs[base];
    p += e2m1_quarter(word, 1u32) * xs[base + 1];
    p += e2m1_quarter(word, 2u32) * xs[base + 2];
    p += e2m1_quarter(word, 3u32) * xs[base + 3];
    p += e2m1_quarter(word, 4u32) * xs[base + 4];
    p += e2m1_quarter(word, 5u32) * xs[base + 5];
    p += e2m1_quarter(word, 6u32) * xs[base + 6];
    p += e2m1_quarter(word, 7u32) * xs[base + 7];
    p
}

/// `Σ_j E2M1[code j of word] · 2^−14 · xs[base + j]` over a word's 8 nibbles through the
/// device's f16 conversions: a nibble pair `(j, j + 4)` sits 16 bits apart, so two shifts and
/// two masks place both as f16 bit patterns at once — magnitude bits `e1 e0 m` in the low
/// exponent bits and the top mantissa bit, the sign on bit 15 — which read exactly as
/// `E2M1 · 2^−14` (f16 subnormals give the 0.5 codes, exactly); the f16 → f32 conversion is one
/// instruction per value. About half the integer work of [`e2m1_quarter`]. CUDA only (f16
/// conversions), chosen by [`hw_decode`].
#[cube]
pub(crate) fn word_dot_f16(word: u32, xs: &Array<f32>, #[comptime] base: usize) -> f32 {
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
    let mut p = f0.extract(0) * xs[base];
    p += f1.extract(0) * xs[base + 1];
    p += f2.extract(0) * xs[base + 2];
    p += f3.extract(0) * xs[base + 3];
    p += f0.extract(1) * xs[base + 4];
    p += f1.extract(1) * xs[base + 5];
    p += f2.extract(1) * xs[base + 6];
    p += f3.extract(1) * xs[base + 7];
    p
}

/// The 4 E4M3 bytes of `word` as f32 values through the device's FP8 conversions (two
/// `e4m3x2 → f16x2` and the f16 → f32 conversions; exact). NaN codes read NaN (the loader refuses
/// them). CUDA on sm_89+ only, chosen by [`hw_decode`].
#[cube]
pub(crate) fn e4m3x4(word: u32) -> Vector<f32, Const<4>> {
    Vector::<f32, Const<4>>::cast_from(Vector::<Fp8E4m3, Const<4>>::reinterpret(word))
}

/// Whether the device decodes E2M1/E4M3 with its own conversions (`word_dot_f16`, `e4m3x4`):
/// CUDA devices that convert E4M3 (sm_89+). Elsewhere (lavapipe) the kernels build the values
/// from their bits (`e2m1_quarter`, `e4m3_scaled`). `NEMOTRON_HW_DECODE=0` forces the bit path.
pub fn hw_decode<R: CubeRuntime>(client: &ComputeClient<R>) -> bool {
    use cubecl::ir::{ElemType, FloatKind, StorageType};
    let off = crate::cube::tuning::hw_decode_off();
    !off && client
        .features()
        .type_usage(StorageType::Scalar(ElemType::Float(FloatKind::E4M3)))
        .contains(cubecl::ir::features::TypeUsage::Conversion)
}

/// E4M3 byte `j` of `word` times 2^−8 — exactly, as [`e2m1_quarter`] does it: exponent and
/// mantissa bits over an exponent base of 112 (`0x38000000`, clear of the 4 exponent bits) give
/// `v = 2^(e−15)·(1 + m/8)` = the value · 2^−8 for normals; subnormals (`e = 0`, value
/// `m · 2^−9`) are `2v − 2^−14`, and `min(v, 2v − 2^−14)` picks right for every code. NaN codes
/// (`0x7F`, `0xFF`) read 0 as in [`e4m3`].
#[cube]
pub(crate) fn e4m3_scaled(word: u32, #[comptime] j: u32) -> f32 {
    let bits = if j <= 2 {
        word << (20 - 8 * j)
    } else {
        word >> 4u32
    };
    let body = bits & 0x07F0_0000u32;
    let v = f32::reinterpret(body | 0x3800_0000u32);
    let q = v.min(2.0f32 * v - 0.000_061_035_156_25f32);
    let sign = (word << (24 - 8 * j)) & 0x8000_0000u32;
    let r = f32::reinterpret(u32::reinterpret(q) ^ sign);
    if body == 0x07F0_0000u32 {
        0.0f32
    } else {
        r
    }
}

/// Byte `i` of a buffer of little-endian u32 words.
#[cube]
pub(crate) fn byte_at(words: &[u32], i: usize) -> u32 {
    (words[i / 4] >> (((i % 4) * 8) as u32)) & 255u32
}

/// E4M3 round-to-nearest-even of `v` (already clamped to ±448), returned as its f32 value.
#[cube]
pub(crate) fn e4m3_round(v: f32) -> f32 {
    let a = v.abs();
    let min_normal = 0.015625f32; // 2^-6
                                  // Keep 3 mantissa bits: drop 20 with round-half-even (a carry moves the exponent up).
                                  // Subnormals are multiples of 2^-9: shifted into [2^-6, 2^-5), that is the ulp there.
    let shifted = a < min_normal;
    let base = if shifted { a + min_normal } else { a };
    let bits = u32::reinterpret(base);
    let lsb = (bits >> 20u32) & 1u32;
    let rounded = f32::reinterpret((bits + 0x7FFFFu32 + lsb) & 0xFFF00000u32);
    let r = if shifted {
        rounded - min_normal
    } else {
        rounded
    };
    if v < 0.0f32 {
        -r
    } else {
        r
    }
}

/// The E4M3 byte of `v`, an exact E4M3 value (already rounded and clamped): normals `sign ·
/// (e + 7) · 8 + m` from the f32 exponent and top 3 mantissa bits, subnormals `m = |v| · 2^9`.
#[cube]
pub(crate) fn e4m3_byte(v: f32) -> u32 {
    let bits = u32::reinterpret(v);
    let sign = (bits >> 24u32) & 128u32;
    let a = v.abs();
    let normal = ((((bits >> 23u32) & 255u32) - 120u32) << 3u32) | ((bits >> 20u32) & 7u32);
    let sub = u32::cast_from(a * 512.0f32);
    let mag = if a < 0.015625f32 { sub } else { normal };
    sign | mag
}

/// Writes output `n` of row `slot`: into `y [R, n_out]`, or when `split` into the part it falls
/// in — `y [R, a]`, `y1 [R, b − a]`, `y2 [R, n_out − b]` (a linear whose outputs are three
/// tensors, e.g. Mamba's `in_proj`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn store3<F: Float>(
    y: &mut [F],
    y1: &mut [F],
    y2: &mut [F],
    slot: usize,
    n: usize,
    n_out: usize,
    a: usize,
    b: usize,
    v: F,
    #[comptime] split: bool,
) {
    if split {
        if n < a {
            y[slot * a + n] = v;
        } else if n < b {
            y1[slot * (b - a) + n - a] = v;
        } else {
            y2[slot * (n_out - b) + n - b] = v;
        }
    } else {
        y[slot * n_out + n] = v;
    }
}

/// `relu(v)²` when `relu2`, `v` otherwise.
#[cube]
pub(crate) fn epilogue(v: f32, #[comptime] relu2: bool) -> f32 {
    if relu2 {
        let r = v.max(0.0f32);
        r * r
    } else {
        v
    }
}

/// One linear call prepared for a kernel: the activation buffer, the routing (expert index
/// buffer, or `x` itself as an unread stand-in), the output, and the grid sizes.
pub(crate) struct Call<R: CubeRuntime> {
    pub x: CubeTensor<R>,
    pub experts: Option<CubeTensor<R>>,
    pub y: CubeTensor<R>,
    pub dtype: DType,
    /// Output rows (input rows, or routing slots).
    pub slots: usize,
    pub div: usize,
    pub k: usize,
    pub n: usize,
    pub routed: bool,
    pub relu2: bool,
    /// The second and third output parts (`split`), or 1-element stand-ins (never written).
    pub y1: CubeTensor<R>,
    pub y2: CubeTensor<R>,
    /// Where the parts start: `(a, b)` = outputs `0..a` in `y`, `a..b` in `y1`, `b..` in `y2`.
    pub split: Option<(usize, usize)>,
}

impl<R: CubeRuntime> Call<R> {
    pub fn new(x: CubeTensor<R>, rows: Rows<CubeBackend<R>>, n: usize, epilogue: Epilogue) -> Self {
        let out_dtype = x.dtype;
        let x = float_buf(x);
        let dtype = x.dtype;
        let shape = x.meta.shape().clone();
        let (m, k) = (shape[0], shape[1]);
        let (experts, slots, div) = match rows {
            Rows::Each => (None, m, 1),
            Rows::Routed { experts, div } => {
                let e = i32_buf(experts);
                let s = e.meta.shape().num_elements();
                (Some(e), s, div)
            }
        };
        debug_assert_eq!(
            out_dtype, dtype,
            "activation dtype {out_dtype:?} has no kernel"
        );
        let y = empty(&x, [slots, n], dtype);
        let (y1, y2) = (empty(&x, [1], dtype), empty(&x, [1], dtype));
        Call {
            routed: experts.is_some(),
            x,
            experts,
            y,
            dtype,
            slots,
            div,
            k,
            n,
            relu2: epilogue == Epilogue::Relu2,
            y1,
            y2,
            split: None,
        }
    }

    /// A plain linear (no epilogue) whose outputs go to three tensors of `widths` columns.
    pub fn new3(x: CubeTensor<R>, widths: [usize; 3]) -> Self {
        let n = widths.iter().sum();
        let mut c = Self::new(x, Rows::Each, n, Epilogue::None);
        c.y = empty(&c.x, [c.slots, widths[0]], c.dtype);
        c.y1 = empty(&c.x, [c.slots, widths[1]], c.dtype);
        c.y2 = empty(&c.x, [c.slots, widths[2]], c.dtype);
        c.split = Some((widths[0], widths[0] + widths[1]));
        c
    }

    /// The split points as kernel arguments (unused when unsplit).
    pub fn split_args(&self) -> (u32, u32) {
        let (a, b) = self.split.unwrap_or((self.n, self.n));
        (a as u32, b as u32)
    }

    /// The three parts of an unsplit output `[slots, n]` (a kernel without the split store),
    /// each made dense.
    pub fn slice3(
        y: CubeTensor<R>,
        widths: [usize; 3],
    ) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
        use burn_cubecl::kernel::{into_contiguous, slice};
        let r = y.meta.shape()[0];
        let (a, b) = (widths[0], widths[0] + widths[1]);
        let n = b + widths[2];
        let part =
            |range: std::ops::Range<usize>| into_contiguous(slice(y.clone(), &[0..r, range]));
        (part(0..a), part(a..b), part(b..n))
    }

    /// This call's path ([`plan::plan`]) on its device with the current settings, `experts`
    /// the weight stack's.
    pub fn plan(&self, format: plan::Format, experts: usize) -> plan::LinearPlan {
        self.plan_with(format, experts, super::tensor_core::mma())
    }

    /// [`Self::plan`] with the decoded path off (where it was refused).
    pub fn plan_without_decoded(&self, format: plan::Format, experts: usize) -> plan::LinearPlan {
        let min = plan::MmaMin {
            fp8_mm: usize::MAX,
            nvfp4_mm: usize::MAX,
            ..super::tensor_core::mma()
        };
        self.plan_with(format, experts, min)
    }

    fn plan_with(
        &self,
        format: plan::Format,
        experts: usize,
        min: plan::MmaMin,
    ) -> plan::LinearPlan {
        use cubecl::ir::{ElemType, FloatKind};
        let (kind, k) = match format {
            plan::Format::Nvfp4 => (FloatKind::BF16, 16),
            plan::Format::Fp8 => (FloatKind::E4M3, 32),
        };
        let shape = plan::LinearShape {
            format,
            bf16: self.dtype == DType::BF16,
            slots: self.slots,
            k: self.k,
            routed: self.routed,
            experts,
        };
        let limits = plan::Limits {
            mma: crate::cube::tuning::mma_supported(
                &self.x.client,
                ElemType::Float(kind).into(),
                k,
            ),
            min,
            grouped_min: grouped::grouped_min_slots(),
            inq_max: mma::fp8_inq_max(),
        };
        plan::plan(&shape, &limits)
    }

    /// The expert index buffer (the activations stand in when unrouted: never read).
    pub fn experts_arg(&self) -> BufferArg<R> {
        arg(self.experts.as_ref().unwrap_or(&self.x))
    }
}
