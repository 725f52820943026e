//! Generation of one sequence: a streaming iterator over the ragged forward, decoding on a
//! one-slot state after the prefill. The request's checks, sampling state and stopping (stop
//! ids, token budget, context limit) are [`crate::request`]'s, shared with the decode engine
//! ([`crate::engine`]), which runs several prompts at once.

use crate::cache::SequenceState;
use crate::error::ModelError;
use crate::model::NemotronH;
use crate::request::Sequence;
use crate::sampling::TokenLogprobs;
use burn::tensor::{Int, Tensor, TensorData};

pub use crate::request::{GenerateOptions, Generation, StopReason};

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

/// The log-probabilities of `tokens[r]` in each row of `logits` `[R, V]` with the row's `ns[r]`
/// most likely tokens, computed on the device ([`nemotron_kernels::ops::logprob_rows`]): `2 + 2n`
/// numbers a row come back (`n` the most asked), not the vocabulary. The values are the raw
/// log-softmax, as [`crate::sampling::logprobs`] gives from a row on the host (its log-sum-exp
/// summed in f64, this one in f32 on the device: they agree to about 1e-6 of its size).
#[allow(
    clippy::expect_used,
    reason = "convert::<T>() makes the elements T, so into_vec::<T> cannot fail"
)]
pub fn device_logprobs(logits: Tensor<2>, tokens: &[u32], ns: &[usize]) -> Vec<TokenLogprobs> {
    let n = ns.iter().copied().max().unwrap_or(0);
    let dev = logits.device();
    let r = tokens.len();
    let toks: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
    let toks = Tensor::<1, Int>::from_data(TensorData::new(toks, [r]), &dev);
    let out = nemotron_kernels::ops::logprob_rows(logits, &toks, n);
    let stats = host_rows(out.stats);
    let w = n.max(1);
    let ids: Vec<i64> = out
        .ids
        .into_data()
        .convert::<i64>()
        .into_vec()
        .expect("int ids");
    let vals = host_rows(out.values);
    (0..r)
        .map(|i| {
            let lse = stats[2 * i] as f64;
            let lp = |x: f32| (x as f64 - lse) as f32;
            TokenLogprobs {
                token: tokens[i],
                logprob: lp(stats[2 * i + 1]),
                top: (0..ns[i].min(n))
                    .filter(|&j| ids[i * w + j] >= 0)
                    .map(|j| (ids[i * w + j] as u32, lp(vals[i * w + j])))
                    .collect(),
            }
        })
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
    /// The tokens, sampler and stop checks (shared with the engine).
    seq: Sequence,
    state: SequenceState,
    prefilled: usize,
    next_logits: Option<Vec<f32>>,
    stop: Option<StopReason>,
    /// The last token's log-probabilities, where the request asked for them.
    last_logprobs: Option<TokenLogprobs>,
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
        Ok(Generator {
            model,
            seq: Sequence::new(model.config(), prompt, opts)?,
            state: model.new_state(),
            prefilled: 0,
            next_logits: None,
            stop: None,
            last_logprobs: None,
            decode: Decode::Unset,
        })
    }

    /// Runs the prompt through the model (in `prefill_chunk` pieces), calling `progress(done,
    /// total)` after each. Called by the first `next()` if not called before.
    pub fn prefill(&mut self, mut progress: impl FnMut(usize, usize)) -> Result<(), ModelError> {
        let total = self.seq.prompt_len;
        let chunk = if self.seq.opts.prefill_chunk == 0 {
            total
        } else {
            self.seq.opts.prefill_chunk
        };
        while self.prefilled < total {
            let end = (self.prefilled + chunk).min(total);
            let chunk_ids = &self.seq.history[self.prefilled..end];
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

    /// The log-probabilities of the token the iterator returned last, where the request asked
    /// for them ([`GenerateOptions::logprobs`]).
    pub fn last_logprobs(&self) -> Option<&TokenLogprobs> {
        self.last_logprobs.as_ref()
    }

    /// Why the generation ended (after the iterator returned `None`).
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop
    }

    /// Tokens in the sequence so far (prompt + generated).
    pub fn tokens(&self) -> &[u32] {
        &self.seq.history
    }

    #[allow(
        clippy::expect_used,
        reason = "the history holds the prompt, and an empty prompt is refused when the generator is made"
    )]
    fn step(&mut self) -> Result<Option<u32>, ModelError> {
        if self.stop.is_some() {
            return Ok(None);
        }
        if self.prefilled < self.seq.prompt_len {
            self.prefill(|_, _| {})?;
        }
        if let Some(stop) = self.seq.before_token() {
            self.stop = Some(stop);
            return Ok(None);
        }
        let (tok, lp) = match self.next_logits.take() {
            Some(l) => {
                let tok = self.seq.sample(&l);
                (tok, self.seq.logprobs(&l, tok))
            }
            None => {
                let last = *self.seq.history.last().expect("non-empty");
                let logits = self.decode_one(last)?;
                if !self.seq.needs_row() {
                    // Only the chosen id (and the log-probabilities asked for) leave the device.
                    let tok = device_argmax(logits.clone())[0];
                    let lp = self
                        .seq
                        .opts
                        .logprobs
                        .map(|n| device_logprobs(logits, &[tok], &[n]).remove(0));
                    (tok, lp)
                } else {
                    let row = host_rows(logits);
                    let tok = if self.seq.greedy() {
                        crate::sampling::argmax(&row)
                    } else {
                        self.seq.sample(&row)
                    };
                    (tok, self.seq.logprobs(&row, tok))
                }
            }
        };
        self.last_logprobs = lp;
        // The sequence's stop (a stop id, the budget, the context) is known with its last token.
        self.stop = self.seq.take(tok);
        Ok(Some(tok))
    }
}

impl Generator<'_> {
    /// The logits after feeding `token`: on the one-slot state (set up from the prefilled state
    /// on first use, sized for the prompt plus the budget), else on the ragged forward.
    fn decode_one(&mut self, token: u32) -> Result<Tensor<2>, ModelError> {
        if matches!(self.decode, Decode::Unset) {
            let fed = self.seq.prompt_len + self.seq.opts.max_new_tokens;
            let cap = self
                .seq
                .max_context
                .map_or(fed, |c| c.min(fed))
                .max(self.seq.history.len());
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
