//! What the handlers share: the model's name, tokenizer and template, the limits every request
//! is checked against, the channel to the engine's worker, the load and the metrics.

use crate::metrics::Metrics;
use crate::worker::{Cmd, Load};
use nemotron::{ChatTemplate, GenerationDefaults, Tokenizer};
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc, Mutex};

/// What the handlers share.
pub struct AppState {
    pub model_name: String,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Option<ChatTemplate>,
    pub defaults: GenerationDefaults,
    pub vocab_size: usize,
    /// Tokens a sequence may hold: prompt + output (the slot capacity).
    pub context_length: usize,
    pub max_batch: usize,
    pub max_queue: usize,
    pub cmd: Mutex<mpsc::Sender<Cmd>>,
    pub load: Arc<Load>,
    pub metrics: Arc<Metrics>,
    pub next_key: AtomicU64,
    pub created: u64,
}
