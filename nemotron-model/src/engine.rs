//! The decode engine: continuous batching over fixed state slots, with the decode step replayed as
//! a captured graph where the device supports it (CUDA).
//!
//! Requests wait in a queue; each step admits as many as there are free slots (one ragged prefill
//! over them, their final state written into their slots), then decodes one token for every
//! running sequence in one batched step over the slots. A sequence leaves on a stop id, its token
//! budget or the context limit, and its slot goes to the next waiting request. Tokens stream out as
//! [`Event`]s. Sampling and the stop checks are the generator's (one `Sequence` type in
//! [`crate::request`]: same order of checks, same seeded generator per sequence), so a request
//! decodes the same tokens alone or in a batch.
//!
//! A step is schedule → run → update, as vLLM's engine core shapes it: the
//! [`crate::scheduler`] picks what to admit (queue, free slots, running sequences; no device),
//! the [`crate::runner`] runs the prefill or the decode step on the slots (pools, padded sizes,
//! captured graphs), and the update here chooses each row's token and settles stops and slots.

use crate::error::ModelError;
use crate::model::NemotronH;
use crate::request::{needed_context, GenerateOptions, Generation, Sequence, StopReason};
use crate::runner::Runner;
use crate::sampling::TokenLogprobs;
use crate::scheduler::{Running, Scheduler};
use burn::tensor::{DType, Int, Tensor, TensorData};

pub use crate::scheduler::RequestId;

/// How the engine is sized and run.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// Sequences decoded together at most (the number of state slots).
    pub max_batch: usize,
    /// Tokens one slot holds (prompt and fed-back tokens); a request that needs more is refused
    /// when submitted.
    pub capacity: usize,
    /// Replay captured decode steps where the device supports graphs.
    pub graphs: bool,
    /// Padded batch sizes: a live batch runs at the next one up (empty: exactly its size).
    pub batch_sizes: Vec<usize>,
    /// Tokens one step runs at most: the running sequences' decode rows first, then pieces of
    /// prompts (vLLM's `--max-num-batched-tokens`). 0: no limit — every prompt admitted is
    /// prefilled whole in the step that admits it. Otherwise more than `max_batch`, so a step
    /// always has room for a piece.
    pub step_tokens: usize,
    /// The most tokens of one prompt a step prefills (0: no limit). A longer prompt runs over
    /// several steps, its state carried between them, while the running sequences keep
    /// decoding; its first token comes with its last piece.
    pub prefill_chunk: usize,
}

/// The most slots [`EngineOptions::for_memory`] gives an engine (the largest padded batch size).
pub const MAX_SLOTS: usize = 256;

impl EngineOptions {
    /// `max_batch` slots of `capacity` tokens, graphs on, batches padded to 1, 2, 4, 8, 16, 32,
    /// 64, 128, 256 (and `max_batch`).
    pub fn new(max_batch: usize, capacity: usize) -> Self {
        let mut batch_sizes: Vec<usize> = [1, 2, 4, 8, 16, 32, 64, 128, 256]
            .into_iter()
            .filter(|&b| b < max_batch)
            .collect();
        batch_sizes.push(max_batch);
        EngineOptions {
            max_batch,
            capacity,
            graphs: true,
            batch_sizes,
            step_tokens: 0,
            prefill_chunk: 0,
        }
    }

    /// As many slots of `capacity` tokens as `budget` bytes of device memory hold (each
    /// [`NemotronH::slot_bytes`]), at most [`MAX_SLOTS`] (vLLM sizes its KV cache from a share of
    /// the device's memory the same way). Refused, naming both sizes, where the budget holds no
    /// slot.
    pub fn for_memory(model: &NemotronH, budget: u64, capacity: usize) -> Result<Self, ModelError> {
        if capacity == 0 {
            return Err(ModelError::Input(
                "capacity must be at least 1 token".into(),
            ));
        }
        let per = model.slot_bytes(capacity) as u64;
        let slots = (budget / per).min(MAX_SLOTS as u64) as usize;
        if slots == 0 {
            return Err(ModelError::Input(format!(
                "a slot memory budget of {budget} bytes holds no slot of {capacity} tokens \
                 ({per} bytes each)"
            )));
        }
        Ok(Self::new(slots, capacity))
    }
}

/// How much device memory an engine's slots may take: a size, or a fraction of the memory the
/// device has free once the model is loaded (like vLLM's `--gpu-memory-utilization`, which
/// counts the weights too; here the weights are already in). Written as a user writes it:
/// `24GiB`, `512MiB`, `3GB`, `1000000B` for a size, `0.9` for a fraction (a number in (0, 1]
/// with a decimal point).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SlotMemory {
    Bytes(u64),
    Fraction(f64),
}

impl std::str::FromStr for SlotMemory {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let bad = || {
            format!(
                "slot memory {s:?}: expected a size (24GiB, 512MiB, 3GB, 1000000B) or a fraction \
                 of the free device memory (0.9)"
            )
        };
        let units: [(&str, u64); 7] = [
            ("KiB", 1 << 10),
            ("MiB", 1 << 20),
            ("GiB", 1 << 30),
            ("KB", 1_000),
            ("MB", 1_000_000),
            ("GB", 1_000_000_000),
            ("B", 1),
        ];
        for (unit, scale) in units {
            if let Some(num) = t.strip_suffix(unit) {
                let v: f64 = num.trim().parse().map_err(|_| bad())?;
                if !(v.is_finite() && v > 0.0) {
                    return Err(bad());
                }
                return Ok(SlotMemory::Bytes((v * scale as f64) as u64));
            }
        }
        if !t.contains('.') {
            return Err(bad());
        }
        match t.parse::<f64>() {
            Ok(f) if f > 0.0 && f <= 1.0 => Ok(SlotMemory::Fraction(f)),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for SlotMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            SlotMemory::Bytes(b) if b >= 1 << 30 => {
                write!(f, "{:.2} GiB", b as f64 / (1u64 << 30) as f64)
            }
            SlotMemory::Bytes(b) => write!(f, "{:.1} MiB", b as f64 / (1u64 << 20) as f64),
            SlotMemory::Fraction(x) => write!(f, "{x} of the free device memory"),
        }
    }
}

impl SlotMemory {
    /// The budget in bytes on `device`: a size as it is; a fraction of the device's memory less
    /// what this process holds there ([`nemotron_kernels::ops::device_memory`]:
    /// other processes' use is not seen). A fraction on a device whose size is unknown (the host,
    /// wgpu) is refused, naming the size form.
    pub fn budget(&self, device: &burn::tensor::Device) -> Result<u64, ModelError> {
        match *self {
            SlotMemory::Bytes(b) => Ok(b),
            SlotMemory::Fraction(f) => {
                let (total, reserved) =
                    nemotron_kernels::ops::device_memory(device).ok_or_else(|| {
                        ModelError::Input(format!(
                            "slot memory {f}: a fraction of the free device memory needs a device \
                             that reports its size (CUDA); give a size instead (e.g. 8GiB)"
                        ))
                    })?;
                Ok((total.saturating_sub(reserved) as f64 * f) as u64)
            }
        }
    }
}

/// What one step produced for one request: a token, and the stop reason when it was the last
/// (`token` is `None` only when a request ends without producing one, e.g. `max_new_tokens: 0`);
/// the token's log-probabilities where the request asked for them
/// ([`GenerateOptions::logprobs`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: RequestId,
    pub token: Option<u32>,
    pub stop: Option<StopReason>,
    pub logprobs: Option<TokenLogprobs>,
}

/// Continuous batching over fixed slots (see the module docs).
pub struct Engine<'m> {
    model: &'m NemotronH,
    sched: Scheduler,
    runner: Runner<'m>,
    opts: EngineOptions,
}

impl<'m> Engine<'m> {
    /// Allocates the slots (the only device memory the engine holds besides the model and, with
    /// graphs, one captured step per padded batch size).
    pub fn new(model: &'m NemotronH, mut opts: EngineOptions) -> Result<Self, ModelError> {
        if opts.max_batch == 0 {
            return Err(ModelError::Input("max_batch must be at least 1".into()));
        }
        if opts.step_tokens != 0 && opts.step_tokens <= opts.max_batch {
            return Err(ModelError::Input(format!(
                "step_tokens {} must exceed max_batch {} (the decode rows come first) or be 0 \
                 (no limit)",
                opts.step_tokens, opts.max_batch
            )));
        }
        opts.batch_sizes.retain(|&b| b >= 1 && b <= opts.max_batch);
        opts.batch_sizes.sort_unstable();
        opts.batch_sizes.dedup();
        let runner = Runner::new(
            model,
            opts.max_batch,
            opts.capacity,
            opts.batch_sizes.clone(),
            opts.graphs,
        )?;
        Ok(Engine {
            model,
            sched: Scheduler::new(opts.max_batch),
            runner,
            opts,
        })
    }

    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// The slot pools (sizes, lengths).
    pub fn slots(&self) -> &crate::cache::SlotState {
        self.runner.state()
    }

    /// Decode steps run so far.
    pub fn steps(&self) -> usize {
        self.runner.steps()
    }

    /// Padded batch sizes with a captured graph so far.
    pub fn captured(&self) -> Vec<usize> {
        self.runner.captured()
    }

    /// Queues a request. Refused at once, naming the numbers, if it cannot run: bad sampling
    /// knobs, an empty prompt, an id outside the vocabulary, or more context than a slot holds.
    pub fn submit(
        &mut self,
        prompt: &[u32],
        opts: GenerateOptions,
    ) -> Result<RequestId, ModelError> {
        let seq = Sequence::new(self.model.config(), prompt, opts)?;
        let need = seq.needed_context();
        if need > self.opts.capacity {
            return Err(ModelError::Input(format!(
                "the request needs {need} tokens of context ({} prompt + {} new), a slot holds {}",
                prompt.len(),
                seq.opts.max_new_tokens,
                self.opts.capacity
            )));
        }
        Ok(self.sched.submit(seq))
    }

    /// Requests submitted and not yet admitted to a slot.
    pub fn waiting(&self) -> usize {
        self.sched.waiting()
    }

    /// Sequences decoding in slots.
    pub fn running(&self) -> usize {
        self.sched.running()
    }

    /// Requests holding a slot whose prompt is part-way through a chunked prefill.
    pub fn prefilling(&self) -> usize {
        self.sched.prefilling()
    }

    /// Drops a request wherever it is: out of the queue, out of a prefill part-way through, or
    /// out of its slot (which the next admission reuses; a slot's state is overwritten when it
    /// is loaded). Returns whether the request was still live. No event is produced for it.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        match self.sched.cancel(id) {
            Some(Some(slot)) => {
                self.runner.drop_partial(slot);
                true
            }
            Some(None) => true,
            None => false,
        }
    }

    /// Whether steps run under a token budget ([`EngineOptions::step_tokens`],
    /// [`EngineOptions::prefill_chunk`]).
    fn chunked(&self) -> bool {
        self.opts.step_tokens != 0 || self.opts.prefill_chunk != 0
    }

    /// Whether nothing is waiting or running.
    pub fn is_idle(&self) -> bool {
        self.sched.is_idle()
    }

    /// Admits waiting requests into free slots, then decodes one token for every running
    /// sequence. Returns this step's events, in admission order then slot-row order.
    ///
    /// Under a token budget ([`EngineOptions::step_tokens`], [`EngineOptions::prefill_chunk`])
    /// the running sequences decode first, then the step's pieces of prompts run in one ragged
    /// forward: prompts part-way through first, then new requests while free slots and budget
    /// last. A prompt's first token comes with its last piece.
    pub fn step(&mut self) -> Result<Vec<Event>, ModelError> {
        if self.chunked() {
            let mut events = vec![];
            let decoding = self.sched.running();
            if decoding > 0 {
                events.extend(self.decode()?);
            }
            let budget = match self.opts.step_tokens {
                0 => usize::MAX,
                n => n - decoding,
            };
            events.extend(self.prefill_pieces(budget)?);
            return Ok(events);
        }
        let mut events = self.admit()?;
        if self.sched.running() > 0 {
            events.extend(self.decode()?);
        }
        Ok(events)
    }

    /// The pieces of prompts one step runs under `budget` tokens (see [`Self::step`]); the
    /// prompts that complete take their first token and start decoding.
    fn prefill_pieces(&mut self, budget: usize) -> Result<Vec<Event>, ModelError> {
        let pieces = self.sched.plan_pieces(budget, self.opts.prefill_chunk);
        if pieces.is_empty() {
            return Ok(vec![]);
        }
        let runs: Vec<(usize, &[u32], bool)> = pieces
            .iter()
            .map(|p| {
                let w = &self.sched.prefilling[p.index];
                let end = w.done + p.len;
                (w.slot, &w.seq.history[w.done..end], end == w.seq.prompt_len)
            })
            .collect();
        let finished: Vec<usize> = runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.2)
            .map(|(i, _)| i)
            .collect();
        let logits = match self.runner.prefill_pieces(&runs) {
            Ok(l) => l,
            Err(e) => {
                // Their partial states are gone: the pieces' requests end with the error.
                let ids: Vec<RequestId> = pieces
                    .iter()
                    .map(|p| self.sched.prefilling[p.index].id)
                    .collect();
                for id in ids {
                    self.cancel(id);
                }
                return Err(e);
            }
        };
        for p in &pieces {
            self.sched.prefilling[p.index].done += p.len;
        }
        if finished.is_empty() {
            return Ok(vec![]);
        }
        // The completed prompts leave the prefilling list (highest index first, so the lower
        // indices stay valid), then go back to piece (logits row) order.
        let mut by_index = finished.clone();
        by_index.sort_unstable_by_key(|&row| std::cmp::Reverse(pieces[row].index));
        let mut done: Vec<(usize, Running)> = by_index
            .into_iter()
            .map(|row| {
                let p = self.sched.prefilling.remove(pieces[row].index);
                let seq = p.seq;
                (
                    row,
                    Running {
                        id: p.id,
                        slot: p.slot,
                        seq,
                    },
                )
            })
            .collect();
        done.sort_by_key(|d| d.0);
        let dev = logits.device();
        let idx: Vec<i32> = done.iter().map(|d| d.0 as i32).collect();
        let n = idx.len();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [n]), (&dev, DType::I32));
        let logits = logits.select(0, idx);
        let rows: Vec<Running> = done.into_iter().map(|d| d.1).collect();
        let chosen = if rows.iter().any(|r| r.seq.greedy()) {
            crate::generate::device_argmax(logits.clone())
        } else {
            vec![]
        };
        Ok(self.update(rows, logits, &chosen, true))
    }

    /// Steps until idle, calling `on_event` for every event.
    pub fn run(&mut self, mut on_event: impl FnMut(Event)) -> Result<(), ModelError> {
        while !self.is_idle() {
            let events = self.step()?;
            if events.is_empty() && self.sched.running() == 0 && self.sched.prefilling() == 0 {
                return Err(ModelError::Input(format!(
                    "{} requests wait but no slot frees up (engine bookkeeping broken)",
                    self.sched.waiting()
                )));
            }
            for e in events {
                on_event(e);
            }
        }
        Ok(())
    }

    /// Prefills as many waiting requests as there are free slots in one ragged forward straight
    /// into their slots (each pool written once for the batch; `submit` refused any request
    /// whose prompt a slot cannot hold); each takes its first token from the prefill.
    fn admit(&mut self) -> Result<Vec<Event>, ModelError> {
        let (batch, taken) = self.sched.admit();
        if batch.is_empty() {
            return Ok(vec![]);
        }
        let prompts: Vec<&[u32]> = batch
            .iter()
            .map(|w| &w.seq.history[..w.seq.prompt_len])
            .collect();
        let logits = match self.runner.prefill(&prompts, &taken) {
            Ok(logits) => logits,
            Err(e) => {
                self.sched.release(taken);
                return Err(e);
            }
        };
        let rows: Vec<Running> = batch
            .into_iter()
            .zip(taken)
            .map(|(w, slot)| Running {
                id: w.id,
                slot,
                seq: w.seq,
            })
            .collect();
        // Plain greedy requests take the device's argmax (only their ids come back); the logits
        // rows are read back only when some request samples. At 64 × 128 the host copy and
        // argmax of 64 vocabulary rows was the larger part of the admission's host time.
        let chosen = if rows.iter().any(|r| r.seq.greedy()) {
            crate::generate::device_argmax(logits.clone())
        } else {
            vec![]
        };
        Ok(self.update(rows, logits, &chosen, true))
    }

    /// One batched decode step over the running sequences.
    #[allow(
        clippy::expect_used,
        reason = "a running sequence holds its prompt, and submit refuses empty prompts"
    )]
    fn decode(&mut self) -> Result<Vec<Event>, ModelError> {
        let rows = self.sched.take_running();
        let ids: Vec<u32> = rows
            .iter()
            .map(|r| *r.seq.history.last().expect("a running sequence has tokens"))
            .collect();
        let slots: Vec<usize> = rows.iter().map(|r| r.slot).collect();
        let (logits, chosen) = match self.runner.decode(&ids, &slots) {
            Ok(out) => out,
            Err(e) => {
                for r in rows {
                    self.sched.keep(r);
                }
                return Err(e);
            }
        };
        Ok(self.update(rows, logits, &chosen, false))
    }

    /// The update after a run: row `i`'s token for `rows[i]` (the device's argmax `chosen[i]`
    /// for plain greedy, else drawn from the row's host copy), its stop checks, and its slot
    /// kept or freed. At admission a request may end before its first token (`max_new_tokens:
    /// 0`, or a prompt that fills the context).
    fn update(
        &mut self,
        rows: Vec<Running>,
        logits: Tensor<2>,
        chosen: &[u32],
        admitting: bool,
    ) -> Vec<Event> {
        let b = rows.len();
        let v = self.model.config().vocab_size;
        let host = if rows.iter().all(|r| !r.seq.needs_row()) {
            vec![]
        } else {
            crate::generate::host_rows(logits.clone().slice_dim(0, 0..b))
        };
        // Greedy requests that asked for log-probabilities take them from the device, for the
        // whole batch in one launch (`2 + 2n` numbers a row come back; rows that sample use
        // their host copy).
        let on_device = if rows.iter().any(|r| r.seq.device_logprobs()) {
            let ns: Vec<usize> = rows
                .iter()
                .map(|r| r.seq.opts.logprobs.unwrap_or(0))
                .collect();
            let toks: Vec<u32> = (0..b)
                .map(|i| chosen.get(i).copied().unwrap_or(0))
                .collect();
            crate::generate::device_logprobs(logits.slice_dim(0, 0..b), &toks, &ns)
        } else {
            vec![]
        };
        let mut events = Vec::with_capacity(b);
        for (i, mut r) in rows.into_iter().enumerate() {
            if admitting {
                if let Some(stop) = r.seq.before_token() {
                    events.push(Event {
                        id: r.id,
                        token: None,
                        stop: Some(stop),
                        logprobs: None,
                    });
                    self.sched.release([r.slot]);
                    continue;
                }
            }
            let tok = if r.seq.greedy() {
                chosen[i]
            } else {
                r.seq.sample(&host[i * v..(i + 1) * v])
            };
            let logprobs = if r.seq.device_logprobs() {
                on_device.get(i).cloned()
            } else if r.seq.needs_row() {
                r.seq.logprobs(&host[i * v..(i + 1) * v], tok)
            } else {
                None
            };
            let stop = r.seq.take(tok);
            events.push(Event {
                id: r.id,
                token: Some(tok),
                stop,
                logprobs,
            });
            if stop.is_some() {
                self.sched.release([r.slot]);
            } else {
                self.sched.keep(r);
            }
        }
        events
    }
}

impl NemotronH {
    /// Generates for several prompts at once on the decode engine: continuous batching over
    /// `prompts.len()` slots sized for the longest request, graphs where the device has them.
    /// Sequence `i` samples with seed `seed + i`. `on_token(i, token)` streams. Results equal
    /// generating each prompt alone.
    #[allow(
        clippy::expect_used,
        reason = "every event's id is one of the requests submitted just above"
    )]
    pub fn generate_batch(
        &self,
        prompts: &[Vec<u32>],
        opts: GenerateOptions,
        mut on_token: impl FnMut(usize, u32),
    ) -> Result<Vec<Generation>, ModelError> {
        if prompts.is_empty() {
            return Ok(vec![]);
        }
        let max_context = opts.max_context.or(self.config().max_position_embeddings);
        let capacity = prompts
            .iter()
            .map(|p| needed_context(p.len(), &opts, max_context))
            .max()
            .unwrap_or(1)
            .max(1);
        let mut engine = Engine::new(self, EngineOptions::new(prompts.len(), capacity))?;
        let ids = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut o = opts.clone();
                o.sampling.seed = opts.sampling.seed.wrapping_add(i as u64);
                engine.submit(p, o)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut out: Vec<Generation> = prompts
            .iter()
            .map(|_| Generation {
                tokens: vec![],
                stop: StopReason::MaxTokens,
            })
            .collect();
        engine.run(|e| {
            let i = ids.iter().position(|&id| id == e.id).expect("our request");
            if let Some(t) = e.token {
                on_token(i, t);
                out[i].tokens.push(t);
            }
            if let Some(s) = e.stop {
                out[i].stop = s;
            }
        })?;
        Ok(out)
    }
}
