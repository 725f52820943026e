//! Host tensors: the bytes exactly as shipped, with their dtype and shape.

use crate::formats;

/// The element types a NemotronH checkpoint ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    BF16,
    F16,
    F32,
    U8,
    F8E4M3,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 => 4,
            DType::U8 | DType::F8E4M3 => 1,
        }
    }

    /// The safetensors spelling.
    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::F32 => "F32",
            DType::U8 => "U8",
            DType::F8E4M3 => "F8_E4M3",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Some(match s {
            "BF16" => DType::BF16,
            "F16" => DType::F16,
            "F32" => DType::F32,
            "U8" => DType::U8,
            "F8_E4M3" => DType::F8E4M3,
            _ => return None,
        })
    }

    /// A dense float (BF16, F16, F32): what a dense linear or a widened tensor may ship as. FP8
    /// and packed NVFP4 bytes are codes, not dense floats.
    pub fn is_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor held on the host in its shipped form (little-endian bytes, row-major).
#[derive(Clone, PartialEq)]
pub struct HostTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HostTensor({} {} {:?}, {} bytes)",
            self.name,
            self.dtype,
            self.shape,
            self.bytes.len()
        )
    }
}

impl HostTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Rows `r` of a row-major tensor (along the first dimension), bytes copied as shipped —
    /// packed and 8-bit rows included, each row being a whole number of bytes. `None` if the
    /// range is out of bounds or the tensor has no rows.
    pub fn rows(&self, r: std::ops::Range<usize>) -> Option<HostTensor> {
        let n = *self.shape.first()?;
        if r.start > r.end || r.end > n || n == 0 || self.bytes.len() % n != 0 {
            return None;
        }
        let per = self.bytes.len() / n;
        let mut shape = self.shape.clone();
        shape[0] = r.len();
        Some(HostTensor {
            name: format!("{}[{}..{}]", self.name, r.start, r.end),
            dtype: self.dtype,
            shape,
            bytes: self.bytes[r.start * per..r.end * per].to_vec(),
        })
    }

    /// Decodes a BF16/F16/F32 tensor to f32 (a copy; for small tensors and for tests).
    /// Returns `None` for packed or 8-bit types, which must never be read as dense.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        let n = self.numel();
        let b = &self.bytes;
        Some(match self.dtype {
            DType::F32 => (0..n).map(|i| formats::f32_at(b, i)).collect(),
            DType::BF16 => (0..n).map(|i| formats::bf16_at(b, i)).collect(),
            DType::F16 => (0..n).map(|i| formats::f16_at(b, i)).collect(),
            DType::U8 | DType::F8E4M3 => return None,
        })
    }

    /// Element `i` of a BF16/F16/F32 tensor as f32.
    pub fn f32_at(&self, i: usize) -> Option<f32> {
        let b = &self.bytes;
        Some(match self.dtype {
            DType::F32 => formats::f32_at(b, i),
            DType::BF16 => formats::bf16_at(b, i),
            DType::F16 => formats::f16_at(b, i),
            DType::U8 | DType::F8E4M3 => return None,
        })
    }
}
