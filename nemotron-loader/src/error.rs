//! Every refusal of the loader, each naming the file, tensor or config field at fault.

use std::path::PathBuf;

/// Why a checkpoint directory was refused.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A config.json field is missing, has the wrong type, or fails validation.
    #[error("config.json: `{field}`: {reason}")]
    Config { field: String, reason: String },
    /// The quantization recipe is malformed or not supported.
    #[error("{file}: `{field}`: {reason}")]
    Quant {
        file: String,
        field: String,
        reason: String,
    },
    /// A safetensors file is malformed (header, offsets, truncation).
    #[error("{file}: not a valid safetensors file: {reason}")]
    Shard { file: PathBuf, reason: String },
    /// The shard index is malformed or names a shard that is not there.
    #[error("{index}: {reason}")]
    Index { index: PathBuf, reason: String },
    /// A broken internal invariant: a bug in the loader, never the input's fault.
    #[error("internal error (a loader bug; please report it): {0}")]
    Internal(String),
    #[error("tensor `{tensor}` is missing: {what} needs it")]
    MissingTensor { tensor: String, what: String },
    #[error("{file}: unexpected tensor `{tensor}`: the config and quantization recipe imply no such tensor")]
    UnexpectedTensor { tensor: String, file: PathBuf },
    #[error("tensor `{tensor}` appears twice: in {first} and in {second}")]
    DuplicateTensor {
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("{file}: tensor `{tensor}` is {found} but {what} needs {expected}")]
    Dtype {
        tensor: String,
        file: PathBuf,
        found: String,
        expected: String,
        what: String,
    },
    #[error("{file}: tensor `{tensor}` has shape {found:?} but {what} needs {expected:?}")]
    Shape {
        tensor: String,
        file: PathBuf,
        found: Vec<usize>,
        expected: Vec<usize>,
        what: String,
    },
    /// A value inside a tensor is unusable (NaN or non-positive scale, NaN block scale, ...).
    #[error("{file}: tensor `{tensor}`: {reason}")]
    BadValue {
        tensor: String,
        file: PathBuf,
        reason: String,
    },
}

impl LoadError {
    pub(crate) fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        LoadError::Config {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = LoadError> = std::result::Result<T, E>;
