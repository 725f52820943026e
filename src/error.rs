//! Errors of the text layer, each one line a user can act on.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Model(#[from] nemotron_model::ModelError),
    #[error(transparent)]
    Load(#[from] nemotron_loader::LoadError),
    #[error("{path}: missing: {what}")]
    MissingFile { path: PathBuf, what: String },
    #[error("{path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error("{0}: this checkpoint has no chat template (no `chat_template` in tokenizer_config.json and no chat_template.jinja); drop --chat")]
    NoChatTemplate(PathBuf),
    #[error("this chat template has no reasoning switch (it never reads `enable_thinking`); drop --reasoning")]
    NoReasoningSwitch,
    #[error("unknown backend {0:?} (expected flex, ndarray, cuda or wgpu)")]
    UnknownBackend(String),
    #[error("unknown dtype {0:?} (expected f32 or bf16)")]
    UnknownDtype(String),
    #[error("{0}")]
    Unavailable(String),
}
