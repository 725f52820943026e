//! Model-level errors.

/// Why a model could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Load(#[from] nemotron_loader::LoadError),
    /// The checkpoint holds a form this model cannot use.
    #[error("{tensor}: {reason}")]
    Unsupported { tensor: String, reason: String },
    /// The prompt does not fit the context the state is sized for.
    #[error("the prompt has {prompt} tokens but the context is sized for {context} (raise the context limit or shorten the prompt)")]
    ContextTooLong { prompt: usize, context: usize },
    /// A forward or generation call was given unusable input.
    #[error("{0}")]
    Input(String),
}
