//! Generation: sampling (greedy, temperature, top-k, top-p, min-p, repetition penalty; seeded),
//! stopping (stop ids, token budget, context limit), a streaming iterator, and batch generation of
//! several prompts through one ragged forward per step.

use crate::cache::SequenceState;
use crate::error::ModelError;
use crate::model::NemotronH;
use burn::tensor::Tensor;
use nemotron_kernels::NemotronBackend;

/// How to pick the next token. `temperature == 0` is greedy (the other knobs are then unused
/// except `repetition_penalty`). Applied in HF `generate`'s order: repetition penalty,
/// temperature, top-k, top-p, min-p.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p ×` the most likely one's (0 = off).
    pub min_p: f32,
    /// HF's CTRL-style penalty on every token already in the prompt or output: positive logits
    /// are divided by it, negative ones multiplied (1 = off).
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Self::greedy()
    }
}

impl Sampling {
    pub fn greedy() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }

    /// Checks the knobs are in range; names the one that is not.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad =
            |what: &str, v: f32| Err(ModelError::Input(format!("{what} {v} is out of range")));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p);
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("repetition_penalty", self.repetition_penalty);
        }
        Ok(())
    }
}

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

/// Picks a token from one row of logits. `history` feeds the repetition penalty.
pub fn pick(logits: &[f32], s: &Sampling, history: &[u32], rng: &mut u64) -> u32 {
    let mut l = logits.to_vec();
    if s.repetition_penalty != 1.0 {
        let mut seen = vec![false; l.len()];
        for &t in history {
            if let Some(x) = seen.get_mut(t as usize) {
                *x = true;
            }
        }
        for (v, _) in l.iter_mut().zip(&seen).filter(|(_, &s)| s) {
            *v = if *v > 0.0 {
                *v / s.repetition_penalty
            } else {
                *v * s.repetition_penalty
            };
        }
    }
    if s.temperature <= 0.0 {
        return argmax(&l);
    }
    let probs = filtered_probs(&l, s);
    let u = next_unit(rng);
    let mut acc = 0.0;
    for &(id, p) in &probs {
        acc += p;
        if u < acc {
            return id;
        }
    }
    probs.last().expect("at least one candidate").0
}

/// The candidate distribution after temperature, top-k, top-p and min-p: `(id, p)` sorted by
/// decreasing probability, summing to 1.
pub fn filtered_probs(logits: &[f32], s: &Sampling) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    idx.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    if s.top_k > 0 {
        idx.truncate(s.top_k);
    }
    let m = logits[idx[0] as usize];
    let mut p: Vec<(u32, f32)> = idx
        .iter()
        .map(|&i| (i, ((logits[i as usize] - m) / s.temperature).exp()))
        .collect();
    normalize(&mut p);
    if s.top_p < 1.0 {
        let mut acc = 0.0;
        let keep = p
            .iter()
            .position(|&(_, x)| {
                acc += x;
                acc >= s.top_p
            })
            .map_or(p.len(), |k| k + 1);
        p.truncate(keep);
        normalize(&mut p);
    }
    if s.min_p > 0.0 {
        let floor = s.min_p * p[0].1;
        p.retain(|&(_, x)| x >= floor);
        normalize(&mut p);
    }
    p
}

fn normalize(p: &mut [(u32, f32)]) {
    let total: f32 = p.iter().map(|x| x.1).sum();
    p.iter_mut().for_each(|x| x.1 /= total);
}

/// Index of the largest value (the first on ties).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn next_unit(state: &mut u64) -> f32 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 24) as f32
}

fn is_plain_greedy(s: &Sampling) -> bool {
    s.temperature <= 0.0 && s.repetition_penalty == 1.0
}

/// `[B, V]` logits on the host, flattened.
pub fn host_rows<B: NemotronBackend>(logits: Tensor<B, 2>) -> Vec<f32> {
    logits
        .into_data()
        .convert::<f32>()
        .into_vec()
        .expect("f32 logits")
}

/// Row-wise argmax computed on the device; only `B` ids come back.
pub fn device_argmax<B: NemotronBackend>(logits: Tensor<B, 2>) -> Vec<u32> {
    let [b, _] = logits.dims();
    let idx = logits.argmax(1).reshape([b]);
    idx.into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .expect("int ids")
        .into_iter()
        .map(|x| x as u32)
        .collect()
}

/// The last row of `[T, V]` logits on the host.
pub fn last_row<B: NemotronBackend>(logits: Tensor<B, 2>) -> Vec<f32> {
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
pub struct Generator<'a, B: NemotronBackend> {
    model: &'a NemotronH<B>,
    opts: GenerateOptions,
    state: SequenceState<B>,
    history: Vec<u32>,
    prompt: Vec<u32>,
    prefilled: usize,
    produced: usize,
    next_logits: Option<Vec<f32>>,
    rng: u64,
    max_context: Option<usize>,
    stop: Option<StopReason>,
}

impl<'a, B: NemotronBackend> Generator<'a, B> {
    fn new(
        model: &'a NemotronH<B>,
        prompt: &[u32],
        opts: GenerateOptions,
    ) -> Result<Self, ModelError> {
        opts.sampling.validate()?;
        if prompt.is_empty() {
            return Err(ModelError::Input("the prompt is empty".into()));
        }
        let v = model.config.vocab_size;
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= v) {
            return Err(ModelError::Input(format!(
                "prompt token id {bad} is outside the vocabulary ({v})"
            )));
        }
        let max_context = opts.max_context.or(model.config.max_position_embeddings);
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
                let logits = self
                    .model
                    .forward_last(&[&[last]], &mut [&mut self.state])?;
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

impl<B: NemotronBackend> Iterator for Generator<'_, B> {
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

impl<B: NemotronBackend> NemotronH<B> {
    /// A streaming generator over the tokens that follow `prompt`.
    pub fn generator(
        &self,
        prompt: &[u32],
        opts: GenerateOptions,
    ) -> Result<Generator<'_, B>, ModelError> {
        Generator::new(self, prompt, opts)
    }

    /// Generates after `prompt`, calling `on_token` for each new token as it is produced.
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

    /// Generates for several prompts at once: one ragged prefill, then one batched forward per
    /// step over the sequences still running. Sequence `i` samples with seed `seed + i`.
    /// `on_token(i, token)` streams. Results equal generating each prompt alone.
    pub fn generate_batch(
        &self,
        prompts: &[Vec<u32>],
        opts: GenerateOptions,
        mut on_token: impl FnMut(usize, u32),
    ) -> Result<Vec<Generation>, ModelError> {
        let mut gens = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut o = opts.clone();
                o.sampling.seed = opts.sampling.seed.wrapping_add(i as u64);
                Generator::new(self, p, o)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut out: Vec<Vec<u32>> = vec![vec![]; gens.len()];
        // Ragged prefill of every prompt in one forward.
        {
            let owned: Vec<Vec<u32>> = prompts.to_vec();
            let toks: Vec<&[u32]> = owned.iter().map(|p| p.as_slice()).collect();
            let mut states: Vec<&mut SequenceState<B>> =
                gens.iter_mut().map(|g| &mut g.state).collect();
            let logits = self.forward(&toks, &mut states)?;
            let [_, t, v] = logits.dims();
            let host: Vec<f32> = logits
                .into_data()
                .convert::<f32>()
                .into_vec()
                .expect("f32 logits");
            for (b, g) in gens.iter_mut().enumerate() {
                let last = g.prompt.len() - 1;
                g.next_logits = Some(host[(b * t + last) * v..(b * t + last + 1) * v].to_vec());
                g.prefilled = g.prompt.len();
            }
        }
        loop {
            // Each running sequence samples from its pending logits.
            let mut running = vec![];
            for (i, g) in gens.iter_mut().enumerate() {
                if let Some(tok) = g.step()? {
                    on_token(i, tok);
                    out[i].push(tok);
                    if g.stop.is_none() {
                        running.push(i);
                    }
                }
            }
            // Sequences that will ask for another step need their next logits.
            running.retain(|&i| {
                let g = &gens[i];
                g.produced < g.opts.max_new_tokens
                    && !g.max_context.is_some_and(|c| g.history.len() >= c)
            });
            if running.is_empty() {
                break;
            }
            let toks: Vec<Vec<u32>> = running
                .iter()
                .map(|&i| vec![*gens[i].history.last().unwrap()])
                .collect();
            let tok_refs: Vec<&[u32]> = toks.iter().map(|t| t.as_slice()).collect();
            let mut states: Vec<&mut SequenceState<B>> = gens
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| running.contains(i))
                .map(|(_, g)| &mut g.state)
                .collect();
            let logits = self.forward(&tok_refs, &mut states)?;
            let v = logits.dims()[2];
            let host: Vec<f32> = logits
                .into_data()
                .convert::<f32>()
                .into_vec()
                .expect("f32 logits");
            for (b, &i) in running.iter().enumerate() {
                gens[i].next_logits = Some(host[b * v..(b + 1) * v].to_vec());
            }
        }
        for g in gens.iter_mut() {
            // Settle the stop reason of sequences that ended on budget or context.
            let _ = g.step()?;
        }
        Ok(gens
            .into_iter()
            .zip(out)
            .map(|(g, tokens)| Generation {
                tokens,
                stop: g.stop.expect("finished"),
            })
            .collect())
    }
}
