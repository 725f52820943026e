//! Model-level errors.

/// Why a model could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Load(#[from] nemotron_loader::LoadError),
    /// The checkpoint holds a form this model cannot use.
    #[error("{tensor}: {reason}")]
    Unsupported { tensor: String, reason: String },
    /// A forward or generation call was given unusable input.
    #[error("{0}")]
    Input(String),
}
