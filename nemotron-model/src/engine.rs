//! The decode engine: continuous batching over fixed state slots, with the decode step replayed as
//! a captured graph where the device supports it (CUDA).
//!
//! Requests wait in a queue; each step admits as many as there are free slots (one ragged prefill
//! over them, their final state written into their slots), then decodes one token for every
//! running sequence in one batched step over the slots. A sequence leaves on a stop id, its token
//! budget or the context limit, and its slot goes to the next waiting request. Tokens stream out as
//! [`Event`]s. Sampling is the generator's (same order of checks, same seeded generator per
//! sequence), so a request decodes the same tokens alone or in a batch.
//!
//! The batch is padded up to the next of `batch_sizes` (pad rows carry slot −1 and are skipped by
//! every state kernel). With graphs, each padded size's step is captured once — warmed up and
//! recorded with every row a pad row, so capturing changes no state — and replayed every step
//! after the token ids and slots are written into its input buffers in place. Backends without
//! graphs run the same step eagerly.

use crate::cache::SlotState;
use crate::error::ModelError;
use crate::generate::{GenerateOptions, Generation, StopReason};
use crate::model::NemotronH;
use crate::sampling::{is_plain_greedy, pick};
use burn::tensor::{capture, DType, Graph, Int, Tensor, TensorData};
use nemotron_kernels::ops;
use std::collections::VecDeque;

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
}

impl EngineOptions {
    /// `max_batch` slots of `capacity` tokens, graphs on, batches padded to 1, 2, 4, 8, 16, 32,
    /// 64 (and `max_batch`).
    pub fn new(max_batch: usize, capacity: usize) -> Self {
        let mut batch_sizes: Vec<usize> = [1, 2, 4, 8, 16, 32, 64]
            .into_iter()
            .filter(|&b| b < max_batch)
            .collect();
        batch_sizes.push(max_batch);
        EngineOptions {
            max_batch,
            capacity,
            graphs: true,
            batch_sizes,
        }
    }
}

/// A submitted request's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// What one step produced for one request: a token, and the stop reason when it was the last
/// (`token` is `None` only when a request ends without producing one, e.g. `max_new_tokens: 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub id: RequestId,
    pub token: Option<u32>,
    pub stop: Option<StopReason>,
}

struct Waiting {
    id: RequestId,
    prompt: Vec<u32>,
    opts: GenerateOptions,
}

struct Running {
    id: RequestId,
    slot: usize,
    opts: GenerateOptions,
    history: Vec<u32>,
    produced: usize,
    rng: u64,
    max_context: Option<usize>,
}

type StepFn<'m> = Box<dyn FnMut() -> (Tensor<2>, Tensor<1, Int>) + 'm>;

/// A captured decode step for one padded batch size, with its input buffers.
struct StepGraph<'m> {
    size: usize,
    /// `[size]`: 1-D, so always dense (written in place; the step reads it as `[size, 1]`).
    ids: Tensor<1, Int>,
    slots: Tensor<1, Int>,
    graph: Graph<(Tensor<2>, Tensor<1, Int>), StepFn<'m>>,
}

/// Continuous batching over fixed slots (see the module docs).
pub struct Engine<'m> {
    model: &'m NemotronH,
    state: SlotState,
    free: Vec<usize>,
    running: Vec<Running>,
    waiting: VecDeque<Waiting>,
    next_id: u64,
    graphs: Vec<StepGraph<'m>>,
    opts: EngineOptions,
    steps: usize,
}

impl<'m> Engine<'m> {
    /// Allocates the slots (the only device memory the engine holds besides the model and, with
    /// graphs, one captured step per padded batch size).
    pub fn new(model: &'m NemotronH, mut opts: EngineOptions) -> Result<Self, ModelError> {
        if opts.max_batch == 0 {
            return Err(ModelError::Input("max_batch must be at least 1".into()));
        }
        opts.batch_sizes.retain(|&b| b >= 1 && b <= opts.max_batch);
        opts.batch_sizes.sort_unstable();
        opts.batch_sizes.dedup();
        let state = model.new_slots(opts.max_batch, opts.capacity)?;
        Ok(Engine {
            model,
            state,
            free: (0..opts.max_batch).rev().collect(),
            running: vec![],
            waiting: VecDeque::new(),
            next_id: 0,
            graphs: vec![],
            opts,
            steps: 0,
        })
    }

    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// The slot pools (sizes, lengths).
    pub fn slots(&self) -> &SlotState {
        &self.state
    }

    /// Decode steps run so far.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Padded batch sizes with a captured graph so far.
    pub fn captured(&self) -> Vec<usize> {
        self.graphs.iter().map(|g| g.size).collect()
    }

    /// Queues a request. Refused at once, naming the numbers, if it cannot run: bad sampling
    /// knobs, an empty prompt, an id outside the vocabulary, or more context than a slot holds.
    pub fn submit(
        &mut self,
        prompt: &[u32],
        opts: GenerateOptions,
    ) -> Result<RequestId, ModelError> {
        opts.sampling.validate()?;
        if prompt.is_empty() {
            return Err(ModelError::Input("the prompt is empty".into()));
        }
        let cfg = self.model.config();
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
        let need = needed_context(prompt.len(), &opts, max_context);
        if need > self.opts.capacity {
            return Err(ModelError::Input(format!(
                "the request needs {need} tokens of context ({} prompt + {} new), a slot holds {}",
                prompt.len(),
                opts.max_new_tokens,
                self.opts.capacity
            )));
        }
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.waiting.push_back(Waiting {
            id,
            prompt: prompt.to_vec(),
            opts,
        });
        Ok(id)
    }

    /// Requests submitted and not yet admitted to a slot.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences decoding in slots.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Drops a request wherever it is: out of the queue, or out of its slot (which the next
    /// admission reuses; a slot's state is overwritten when it is loaded). Returns whether the
    /// request was still live. No event is produced for it.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if let Some(i) = self.waiting.iter().position(|w| w.id == id) {
            self.waiting.remove(i);
            return true;
        }
        if let Some(i) = self.running.iter().position(|r| r.id == id) {
            let r = self.running.remove(i);
            self.free.push(r.slot);
            return true;
        }
        false
    }

    /// Whether nothing is waiting or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Admits waiting requests into free slots, then decodes one token for every running
    /// sequence. Returns this step's events, in admission order then slot-row order.
    pub fn step(&mut self) -> Result<Vec<Event>, ModelError> {
        let mut events = self.admit()?;
        if !self.running.is_empty() {
            events.extend(self.decode()?);
        }
        Ok(events)
    }

    /// Steps until idle, calling `on_event` for every event.
    pub fn run(&mut self, mut on_event: impl FnMut(Event)) -> Result<(), ModelError> {
        while !self.is_idle() {
            let events = self.step()?;
            if events.is_empty() && self.running.is_empty() {
                return Err(ModelError::Input(format!(
                    "{} requests wait but no slot frees up (engine bookkeeping broken)",
                    self.waiting.len()
                )));
            }
            for e in events {
                on_event(e);
            }
        }
        Ok(())
    }

    /// Prefills as many waiting requests as there are free slots in one ragged forward and
    /// writes their states into their slots; each samples its first token from the prefill.
    fn admit(&mut self) -> Result<Vec<Event>, ModelError> {
        let n = self.free.len().min(self.waiting.len());
        if n == 0 {
            return Ok(vec![]);
        }
        let batch: Vec<Waiting> = self.waiting.drain(..n).collect();
        // Straight into their slots, each pool written once for the batch (`submit` refused any
        // request whose prompt a slot cannot hold).
        let mut taken = self.free.split_off(self.free.len() - n);
        taken.reverse(); // the order `pop` hands them out in
        let logits = {
            let toks: Vec<&[u32]> = batch.iter().map(|w| w.prompt.as_slice()).collect();
            self.model.prefill_slots(&mut self.state, &toks, &taken)
        };
        let logits = match logits {
            Ok(logits) => logits,
            Err(e) => {
                self.free.append(&mut taken);
                return Err(e);
            }
        };
        let v = self.model.config().vocab_size;
        // As in `decode`: plain greedy requests take the device's argmax (only `n` ids come
        // back); the logits rows are read back only when some request samples. At 64 × 128 the
        // host copy and argmax of 64 vocabulary rows was the larger part of the admission's
        // host time.
        let greedy: Vec<bool> = batch
            .iter()
            .map(|w| is_plain_greedy(&w.opts.sampling))
            .collect();
        let chosen = if greedy.iter().any(|&g| g) {
            crate::generate::device_argmax(logits.clone())
        } else {
            vec![]
        };
        let host = if greedy.iter().all(|&g| g) {
            vec![]
        } else {
            crate::generate::host_rows(logits)
        };
        let mut events = Vec::with_capacity(n);
        for (i, (w, slot)) in batch.into_iter().zip(taken).enumerate() {
            let max_context = w
                .opts
                .max_context
                .or(self.model.config().max_position_embeddings);
            let mut r = Running {
                id: w.id,
                slot,
                rng: w.opts.sampling.seed,
                history: w.prompt,
                produced: 0,
                max_context,
                opts: w.opts,
            };
            if let Some(stop) = r.before_token() {
                events.push(Event {
                    id: r.id,
                    token: None,
                    stop: Some(stop),
                });
                self.free.push(slot);
                continue;
            }
            let tok = r.choose(|| chosen[i], &host, i, v);
            let stop = r.take(tok);
            events.push(Event {
                id: r.id,
                token: Some(tok),
                stop,
            });
            if stop.is_some() {
                self.free.push(slot);
            } else {
                self.running.push(r);
            }
        }
        Ok(events)
    }

    /// One batched decode step over the running sequences.
    #[allow(
        clippy::expect_used,
        reason = "a running sequence holds its prompt, and submit refuses empty prompts; convert::<i64>() makes the elements i64, so into_vec::<i64> cannot fail"
    )]
    fn decode(&mut self) -> Result<Vec<Event>, ModelError> {
        let b = self.running.len();
        let size = self
            .opts
            .batch_sizes
            .iter()
            .copied()
            .find(|&s| s >= b)
            .unwrap_or(b);
        let mut ids = vec![0i32; size];
        let mut slots = vec![-1i32; size];
        for (i, r) in self.running.iter().enumerate() {
            ids[i] = *r.history.last().expect("a running sequence has tokens") as i32;
            slots[i] = r.slot as i32;
        }
        let greedy = self
            .running
            .iter()
            .all(|r| is_plain_greedy(&r.opts.sampling));
        let dev = self.model.device().clone();
        let (logits, argmax) = if self.opts.graphs && nemotron_kernels::ops::supports_graphs(&dev) {
            let g = self.graph(size)?;
            ops::write_i32(&mut g.ids, &ids);
            ops::write_i32(&mut g.slots, &slots);
            // Safety: the graph's closure owns clones of every tensor it reads or writes (the
            // model outlives the engine); refreshes and replays run on this thread's stream.
            let (l, a) = unsafe { g.graph.replay() };
            (l.clone(), a.clone())
        } else {
            let ids_t =
                Tensor::<2, Int>::from_data(TensorData::new(ids, [size, 1]), (&dev, DType::I32));
            let slots_t = Tensor::<1, Int>::from_data(
                TensorData::new(slots.clone(), [size]),
                (&dev, DType::I32),
            );
            let l = self.model.decode_slots(&mut self.state, &ids_t, &slots_t);
            let a = nemotron_kernels::ops::argmax_rows(l.clone());
            (l, a)
        };
        self.state.note_step(&slots);
        self.steps += 1;
        let v = self.model.config().vocab_size;
        let chosen: Vec<i64> = argmax.into_data().convert::<i64>().into_vec().expect("ids");
        let host = if greedy {
            vec![]
        } else {
            crate::generate::host_rows(logits.slice_dim(0, 0..b))
        };
        let mut events = Vec::with_capacity(b);
        let mut still = Vec::with_capacity(b);
        for (i, mut r) in std::mem::take(&mut self.running).into_iter().enumerate() {
            let tok = r.choose(|| chosen[i] as u32, &host, i, v);
            let stop = r.take(tok);
            events.push(Event {
                id: r.id,
                token: Some(tok),
                stop,
            });
            if stop.is_some() {
                self.free.push(r.slot);
            } else {
                still.push(r);
            }
        }
        self.running = still;
        Ok(events)
    }

    /// The captured step for padded size `size`, capturing it on first use.
    #[allow(clippy::expect_used, reason = "the graph was pushed on the line above")]
    fn graph(&mut self, size: usize) -> Result<&mut StepGraph<'m>, ModelError> {
        if let Some(i) = self.graphs.iter().position(|g| g.size == size) {
            return Ok(&mut self.graphs[i]);
        }
        let dev = self.model.device().clone();
        let ids = Tensor::<1, Int>::from_data(
            TensorData::new(vec![0i32; size], [size]),
            (&dev, DType::I32),
        );
        // Every row a pad row while warming up and recording: no state changes.
        let slots = Tensor::<1, Int>::from_data(
            TensorData::new(vec![-1i32; size], [size]),
            (&dev, DType::I32),
        );
        let (model, state) = (self.model, self.state.clone());
        let (gi, gs) = (ids.clone(), slots.clone());
        let step: StepFn<'m> = Box::new(move || {
            let mut st = state.clone();
            let l = model.decode_slots(&mut st, &gi.clone().reshape([size, 1]), &gs);
            let a = nemotron_kernels::ops::argmax_rows(l.clone());
            (l, a)
        });
        let graph = capture(&dev, step);
        if !graph.is_hardware() {
            return Err(ModelError::Unsupported {
                tensor: "decode step".into(),
                reason: format!("graph capture failed on {dev:?}; run with graphs off"),
            });
        }
        self.graphs.push(StepGraph {
            size,
            ids,
            slots,
            graph,
        });
        Ok(self.graphs.last_mut().expect("just pushed"))
    }
}

/// Tokens a request's slot must hold: the prompt and every generated token but the last (which is
/// never fed back), bounded by the context limit.
fn needed_context(prompt: usize, opts: &GenerateOptions, max_context: Option<usize>) -> usize {
    let fed = prompt + opts.max_new_tokens.saturating_sub(1);
    match max_context {
        Some(c) => fed.min(c.saturating_sub(1)).max(prompt),
        None => fed,
    }
}

impl Running {
    /// This request's token from row `i` of a batch: the device's argmax for plain greedy
    /// sampling, otherwise drawn from the row's host copy (`host`: rows of `v` logits, read back
    /// only when some request of the batch samples).
    fn choose(&mut self, argmax: impl FnOnce() -> u32, host: &[f32], i: usize, v: usize) -> u32 {
        if is_plain_greedy(&self.opts.sampling) {
            argmax()
        } else {
            pick(
                &host[i * v..(i + 1) * v],
                &self.opts.sampling,
                &self.history,
                &mut self.rng,
            )
        }
    }

    /// The generator's checks before producing a token.
    fn before_token(&self) -> Option<StopReason> {
        if self.produced >= self.opts.max_new_tokens {
            return Some(StopReason::MaxTokens);
        }
        if self.max_context.is_some_and(|c| self.history.len() >= c) {
            return Some(StopReason::ContextFull);
        }
        None
    }

    /// Records a produced token; the stop reason if the sequence ends with it.
    fn take(&mut self, tok: u32) -> Option<StopReason> {
        self.history.push(tok);
        self.produced += 1;
        if self.opts.stop_ids.contains(&tok) {
            return Some(StopReason::Stop(tok));
        }
        self.before_token()
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
