//! The backends and dtypes a user can ask for by name.

use crate::error::Error;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The host reference (f32).
    NdArray,
    Cuda,
    Wgpu,
}

impl FromStr for BackendKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "ndarray" | "cpu" | "host" => Ok(BackendKind::NdArray),
            "cuda" => Ok(BackendKind::Cuda),
            "wgpu" => Ok(BackendKind::Wgpu),
            _ => Err(Error::UnknownBackend(s.into())),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    Bf16,
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(DType::F32),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            _ => Err(Error::UnknownDtype(s.into())),
        }
    }
}

impl BackendKind {
    /// Whether this build can run `self` with `dtype`; the reason when it cannot.
    pub fn check(self, dtype: DType) -> Result<(), Error> {
        match (self, dtype) {
            (BackendKind::NdArray, DType::F32) => Ok(()),
            (BackendKind::NdArray, DType::Bf16) => Err(Error::Unavailable(
                "--dtype bf16 is not available on ndarray (the host reference computes in f32)"
                    .into(),
            )),
            (b, _) => Err(Error::Unavailable(format!(
                "backend {b:?} is not available in this build (available: ndarray)"
            ))),
        }
    }
}
