//! What a generation request asks for and when it ends, written once for the streaming
//! [`crate::generate::Generator`] and the decode [`crate::engine::Engine`]: the options, the stop
//! reasons, the checks a request passes before any work, and a sequence's progress (its tokens,
//! the sampler's state, and the stop checks around each token).

use crate::error::ModelError;
use crate::sampling::{is_plain_greedy, logprobs, pick, Sampling, TokenLogprobs, MAX_TOP_LOGPROBS};
use nemotron_loader::NemotronHConfig;

/// What a generation call may do.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Stop after emitting any of these (the checkpoint's EOS ids).
    pub stop_ids: Vec<u32>,
    /// The context the state is sized for: a prompt longer than this is refused, and generation
    /// stops when the sequence reaches it. `None` = the config's `max_position_embeddings`
    /// (unlimited if the config has none).
    pub max_context: Option<usize>,
    /// Prefill at most this many prompt tokens per forward call (bounds activation memory and
    /// lets callers show progress). 0 = the whole prompt at once.
    pub prefill_chunk: usize,
    /// Return each produced token's log-probability with the `n` most likely tokens at its
    /// position (`Some(n)`, `n` ≤ [`MAX_TOP_LOGPROBS`]; [`TokenLogprobs`]). The logits rows then
    /// come back to the host even for greedy requests.
    pub logprobs: Option<usize>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 32,
            sampling: Sampling::greedy(),
            stop_ids: vec![],
            max_context: None,
            prefill_chunk: 512,
            logprobs: None,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// A stop id was emitted (it is the last token of the output).
    Stop(u32),
    /// `max_new_tokens` were produced.
    MaxTokens,
    /// The sequence reached the context limit.
    ContextFull,
}

/// The result of one sequence's generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub stop: StopReason,
}

/// One sequence's generation in progress: its tokens (prompt first), the tokens produced, the
/// sampler's generator state and the context limit in force.
#[derive(Debug, Clone)]
pub(crate) struct Sequence {
    pub(crate) opts: GenerateOptions,
    pub(crate) history: Vec<u32>,
    pub(crate) prompt_len: usize,
    produced: usize,
    rng: u64,
    pub(crate) max_context: Option<usize>,
}

impl Sequence {
    /// A request checked before any work, each refusal naming its numbers: sampling knobs in
    /// range, a non-empty prompt of ids inside the vocabulary, no longer than the context limit
    /// (`opts.max_context`, else the config's `max_position_embeddings`).
    pub(crate) fn new(
        cfg: &NemotronHConfig,
        prompt: &[u32],
        opts: GenerateOptions,
    ) -> Result<Self, ModelError> {
        opts.sampling.validate()?;
        if let Some(n) = opts.logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            return Err(ModelError::Input(format!(
                "logprobs {n} is out of range (at most {MAX_TOP_LOGPROBS})"
            )));
        }
        if prompt.is_empty() {
            return Err(ModelError::Input("the prompt is empty".into()));
        }
        let v = cfg.vocab_size;
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= v) {
            return Err(ModelError::Input(format!(
                "prompt token id {bad} is outside the vocabulary ({v})"
            )));
        }
        let max_context = opts.max_context.or(cfg.max_position_embeddings);
        if let Some(c) = max_context {
            if prompt.len() > c {
                return Err(ModelError::ContextTooLong {
                    prompt: prompt.len(),
                    context: c,
                });
            }
        }
        Ok(Sequence {
            rng: opts.sampling.seed,
            opts,
            history: prompt.to_vec(),
            prompt_len: prompt.len(),
            produced: 0,
            max_context,
        })
    }

    /// Tokens a slot must hold for this request: the prompt and every generated token but the
    /// last (which is never fed back), bounded by the context limit.
    pub(crate) fn needed_context(&self) -> usize {
        needed_context(self.prompt_len, &self.opts, self.max_context)
    }

    /// Whether the sampler is plain greedy (the device's argmax stands for it).
    pub(crate) fn greedy(&self) -> bool {
        is_plain_greedy(&self.opts.sampling)
    }

    /// Whether this request needs its logits rows on the host: it samples. A plain greedy
    /// request takes the device's argmax, and its log-probabilities, where asked, come from the
    /// device too ([`crate::generate::device_logprobs`]).
    pub(crate) fn needs_row(&self) -> bool {
        !self.greedy()
    }

    /// Whether this plain greedy request asked for log-probabilities (taken on the device).
    pub(crate) fn device_logprobs(&self) -> bool {
        self.greedy() && self.opts.logprobs.is_some()
    }

    /// The log-probabilities of `tok` in `row` where the request asked for them.
    pub(crate) fn logprobs(&self, row: &[f32], tok: u32) -> Option<TokenLogprobs> {
        self.opts.logprobs.map(|n| logprobs(row, tok, n))
    }

    /// The stop checks made before producing a token: the budget, then the context limit.
    pub(crate) fn before_token(&self) -> Option<StopReason> {
        if self.produced >= self.opts.max_new_tokens {
            return Some(StopReason::MaxTokens);
        }
        if self.max_context.is_some_and(|c| self.history.len() >= c) {
            return Some(StopReason::ContextFull);
        }
        None
    }

    /// A token drawn from one row of logits with this sequence's sampler (its seeded generator
    /// and repetition history).
    pub(crate) fn sample(&mut self, row: &[f32]) -> u32 {
        pick(row, &self.opts.sampling, &self.history, &mut self.rng)
    }

    /// Records a produced token; the stop reason if the sequence ends with it (a stop id, or
    /// the checks of [`Sequence::before_token`] for the next one).
    pub(crate) fn take(&mut self, tok: u32) -> Option<StopReason> {
        self.history.push(tok);
        self.produced += 1;
        if self.opts.stop_ids.contains(&tok) {
            return Some(StopReason::Stop(tok));
        }
        self.before_token()
    }
}

/// Tokens a request's slot must hold: the prompt and every generated token but the last (which is
/// never fed back), bounded by the context limit.
pub(crate) fn needed_context(
    prompt: usize,
    opts: &GenerateOptions,
    max_context: Option<usize>,
) -> usize {
    let fed = prompt + opts.max_new_tokens.saturating_sub(1);
    match max_context {
        Some(c) => fed.min(c.saturating_sub(1)).max(prompt),
        None => fed,
    }
}
