//! Generation of one sequence: stopping (stop ids, token budget, context limit) and a streaming
//! iterator over the ragged forward. Several prompts at once run on the decode engine
//! ([`crate::engine`]).

use crate::cache::SequenceState;
use crate::error::ModelError;
use crate::model::NemotronH;
use crate::sampling::{is_plain_greedy, pick, Sampling};
use burn::tensor::{Int, Tensor, TensorData};

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
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 32,
            sampling: Sampling::greedy(),
            stop_ids: vec![],
            max_context: None,
            prefill_chunk: 512,
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

/// `[B, V]` logits on the host, flattened.
#[allow(
    clippy::expect_used,
    reason = "convert::<f32>() makes the elements f32, so into_vec::<f32> cannot fail"
)]
pub fn host_rows(logits: Tensor<2>) -> Vec<f32> {
    logits
        .into_data()
        .convert::<f32>()
        .into_vec()
        .expect("f32 logits")
}

/// Row-wise argmax computed on the device; only `B` ids come back.
#[allow(
    clippy::expect_used,
    reason = "convert::<i64>() makes the elements i64, so into_vec::<i64> cannot fail"
)]
pub fn device_argmax(logits: Tensor<2>) -> Vec<u32> {
    let idx = nemotron_kernels::ops::argmax_rows(logits);
    idx.into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .expect("int ids")
        .into_iter()
        .map(|x| x as u32)
        .collect()
}

/// The last row of `[T, V]` logits on the host.
#[allow(
    clippy::expect_used,
    reason = "convert::<f32>() makes the elements f32, so into_vec::<f32> cannot fail"
)]
pub fn last_row(logits: Tensor<2>) -> Vec<f32> {
    let [t, _] = logits.dims();
    logits
        .slice_dim(0, t - 1..t)
        .into_data()
        .convert::<f32>()
        .into_vec()
        .expect("f32 logits")
}

/// A streaming generation: an iterator over the new tokens of one sequence. Only the sampled
/// ids leave the model each step.
pub struct Generator<'a> {
    model: &'a NemotronH,
    opts: GenerateOptions,
    state: SequenceState,
    history: Vec<u32>,
    prompt: Vec<u32>,
    prefilled: usize,
    produced: usize,
    next_logits: Option<Vec<f32>>,
    rng: u64,
    max_context: Option<usize>,
    stop: Option<StopReason>,
    /// Where decode runs after the prefill: a one-slot state of the decode engine (fewer, in-place
    /// kernels per token), or the ragged forward where slots do not apply.
    decode: Decode,
}

/// The decode path of a [`Generator`], chosen after the prefill.
enum Decode {
    Unset,
    Slots(Box<crate::cache::SlotState>),
    Ragged,
}

impl<'a> Generator<'a> {
    fn new(
        model: &'a NemotronH,
        prompt: &[u32],
        opts: GenerateOptions,
    ) -> Result<Self, ModelError> {
        opts.sampling.validate()?;
        if prompt.is_empty() {
            return Err(ModelError::Input("the prompt is empty".into()));
        }
        let v = model.config().vocab_size;
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= v) {
            return Err(ModelError::Input(format!(
                "prompt token id {bad} is outside the vocabulary ({v})"
            )));
        }
        let max_context = opts.max_context.or(model.config().max_position_embeddings);
        if let Some(c) = max_context {
            if prompt.len() > c {
                return Err(ModelError::ContextTooLong {
                    prompt: prompt.len(),
                    context: c,
                });
            }
        }
        Ok(Generator {
            model,
            rng: opts.sampling.seed,
            opts,
            state: model.new_state(),
            history: prompt.to_vec(),
            prompt: prompt.to_vec(),
            prefilled: 0,
            produced: 0,
            next_logits: None,
            max_context,
            stop: None,
            decode: Decode::Unset,
        })
    }

    /// Runs the prompt through the model (in `prefill_chunk` pieces), calling `progress(done,
    /// total)` after each. Called by the first `next()` if not called before.
    pub fn prefill(&mut self, mut progress: impl FnMut(usize, usize)) -> Result<(), ModelError> {
        let total = self.prompt.len();
        let chunk = if self.opts.prefill_chunk == 0 {
            total
        } else {
            self.opts.prefill_chunk
        };
        while self.prefilled < total {
            let end = (self.prefilled + chunk).min(total);
            let chunk_ids = &self.prompt[self.prefilled..end];
            let logits = self
                .model
                .forward_last(&[chunk_ids], &mut [&mut self.state])?;
            self.prefilled = end;
            if end == total {
                self.next_logits = Some(host_rows(logits));
            }
            progress(end, total);
        }
        Ok(())
    }

    /// Why the generation ended (after the iterator returned `None`).
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop
    }

    /// Tokens in the sequence so far (prompt + generated).
    pub fn tokens(&self) -> &[u32] {
        &self.history
    }

    #[allow(
        clippy::expect_used,
        reason = "the history holds the prompt, and an empty prompt is refused when the generator is made"
    )]
    fn step(&mut self) -> Result<Option<u32>, ModelError> {
        if self.stop.is_some() {
            return Ok(None);
        }
        if self.prefilled < self.prompt.len() {
            self.prefill(|_, _| {})?;
        }
        if self.produced >= self.opts.max_new_tokens {
            self.stop = Some(StopReason::MaxTokens);
            return Ok(None);
        }
        if self.max_context.is_some_and(|c| self.history.len() >= c) {
            self.stop = Some(StopReason::ContextFull);
            return Ok(None);
        }
        let tok = match self.next_logits.take() {
            Some(l) => pick(&l, &self.opts.sampling, &self.history, &mut self.rng),
            None => {
                let last = *self.history.last().expect("non-empty");
                let logits = self.decode_one(last)?;
                if is_plain_greedy(&self.opts.sampling) {
                    // Only the chosen id leaves the device.
                    device_argmax(logits)[0]
                } else {
                    pick(
                        &host_rows(logits),
                        &self.opts.sampling,
                        &self.history,
                        &mut self.rng,
                    )
                }
            }
        };
        self.history.push(tok);
        self.produced += 1;
        if self.opts.stop_ids.contains(&tok) {
            self.stop = Some(StopReason::Stop(tok));
        }
        Ok(Some(tok))
    }
}

impl Generator<'_> {
    /// The logits after feeding `token`: on the one-slot state (set up from the prefilled state
    /// on first use, sized for the prompt plus the budget), else on the ragged forward.
    fn decode_one(&mut self, token: u32) -> Result<Tensor<2>, ModelError> {
        if matches!(self.decode, Decode::Unset) {
            let fed = self.prompt.len() + self.opts.max_new_tokens;
            let cap = self
                .max_context
                .map_or(fed, |c| c.min(fed))
                .max(self.history.len());
            self.decode = match self.model.new_slots(1, cap) {
                Ok(mut st) => {
                    self.model.load_slot(&mut st, 0, &self.state)?;
                    Decode::Slots(Box::new(st))
                }
                // The RoPE deviation has no slot path: the ragged forward serves it.
                Err(ModelError::Unsupported { .. }) => Decode::Ragged,
                Err(e) => return Err(e),
            };
        }
        match &mut self.decode {
            Decode::Slots(st) => {
                let dev = self.model.device();
                let ids = Tensor::<2, Int>::from_data(
                    TensorData::new(vec![token as i32], [1, 1]),
                    (dev, burn::tensor::DType::I32),
                );
                let slot = Tensor::<1, Int>::from_data(
                    TensorData::new(vec![0i32], [1]),
                    (dev, burn::tensor::DType::I32),
                );
                let logits = self.model.decode_slots(st, &ids, &slot);
                st.note_step(&[0]);
                Ok(logits)
            }
            _ => self.model.forward_last(&[&[token]], &mut [&mut self.state]),
        }
    }
}

impl Iterator for Generator<'_> {
    type Item = Result<u32, ModelError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.step().transpose()
    }
}

/// The result of one sequence's generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub stop: StopReason,
}

impl NemotronH {
    /// A streaming generator over the tokens that follow `prompt`.
    pub fn generator(
        &self,
        prompt: &[u32],
        opts: GenerateOptions,
    ) -> Result<Generator<'_>, ModelError> {
        Generator::new(self, prompt, opts)
    }

    /// Generates after `prompt`, calling `on_token` for each new token as it is produced.
    #[allow(
        clippy::expect_used,
        reason = "the token iterator ends only after it has set a stop reason"
    )]
    pub fn generate(
        &self,
        prompt: &[u32],
        opts: GenerateOptions,
        mut on_token: impl FnMut(u32),
    ) -> Result<Generation, ModelError> {
        let mut g = self.generator(prompt, opts)?;
        let mut tokens = vec![];
        for t in &mut g {
            let t = t?;
            on_token(t);
            tokens.push(t);
        }
        Ok(Generation {
            tokens,
            stop: g.stop_reason().expect("finished"),
        })
    }
}
