//! The engine's device side: the slot pools, the padded batch sizes and the captured decode
//! steps. A prefill into slots and a decode step each advance the slots' lengths on the device
//! and on the host in the same call.
//!
//! The batch is padded up to the next of the padded sizes (pad rows carry slot −1 and are
//! skipped by every state kernel). With graphs, each padded size's step is captured once —
//! warmed up and recorded with every row a pad row, so capturing changes no state — and replayed
//! every step after the token ids and slots are written into its input buffers in place.
//! Backends without graphs run the same step eagerly.

use crate::cache::{SequenceState, SlotState};
use crate::error::ModelError;
use crate::model::NemotronH;
use burn::tensor::{capture, DType, Graph, Int, Tensor, TensorData};
use nemotron_kernels::ops;
use std::collections::HashMap;

type StepFn<'m> = Box<dyn FnMut() -> (Tensor<2>, Tensor<1, Int>) + 'm>;

/// A captured decode step for one padded batch size, with its input buffers.
struct StepGraph<'m> {
    size: usize,
    /// `[size]`: 1-D, so always dense (written in place; the step reads it as `[size, 1]`).
    ids: Tensor<1, Int>,
    slots: Tensor<1, Int>,
    graph: Graph<(Tensor<2>, Tensor<1, Int>), StepFn<'m>>,
}

/// The slots and the steps that run on them.
pub(crate) struct Runner<'m> {
    model: &'m NemotronH,
    state: SlotState,
    graphs: Vec<StepGraph<'m>>,
    /// Padded batch sizes, ascending (empty: a batch runs at its own size).
    batch_sizes: Vec<usize>,
    use_graphs: bool,
    steps: usize,
    /// The state of prompts part-way through a chunked prefill, by slot (loaded into the slot
    /// when the prompt completes).
    partial: HashMap<usize, SequenceState>,
}

impl<'m> Runner<'m> {
    /// `slots` slots of `capacity` tokens.
    pub(crate) fn new(
        model: &'m NemotronH,
        slots: usize,
        capacity: usize,
        batch_sizes: Vec<usize>,
        use_graphs: bool,
    ) -> Result<Self, ModelError> {
        Ok(Runner {
            model,
            state: model.new_slots(slots, capacity)?,
            graphs: vec![],
            batch_sizes,
            use_graphs,
            steps: 0,
            partial: HashMap::new(),
        })
    }

    pub(crate) fn state(&self) -> &SlotState {
        &self.state
    }

    pub(crate) fn steps(&self) -> usize {
        self.steps
    }

    pub(crate) fn captured(&self) -> Vec<usize> {
        self.graphs.iter().map(|g| g.size).collect()
    }

    /// New sequences prefilled straight into their slots; the logits after each one's last
    /// token, `[B, vocab]`.
    pub(crate) fn prefill(
        &mut self,
        prompts: &[&[u32]],
        slots: &[usize],
    ) -> Result<Tensor<2>, ModelError> {
        self.model.prefill_slots(&mut self.state, prompts, slots)
    }

    /// Prompt pieces: `pieces[i]` = (slot, tokens, whether they end the prompt). Whole prompts
    /// (a first piece that is also the last) are prefilled straight into their slots as
    /// [`Self::prefill`] does (the pools written once for the batch); the other pieces run in
    /// one ragged forward, each continuing its slot's partial state (a new one for a first
    /// piece), a last piece loading its state into the slot. Returns the logits after each
    /// piece's last token, `[pieces, vocab]`, in the pieces' order.
    pub(crate) fn prefill_pieces(
        &mut self,
        pieces: &[(usize, &[u32], bool)],
    ) -> Result<Tensor<2>, ModelError> {
        let whole: Vec<usize> = (0..pieces.len())
            .filter(|&i| pieces[i].2 && !self.partial.contains_key(&pieces[i].0))
            .collect();
        if whole.is_empty() {
            return self.continue_pieces(pieces);
        }
        let prompts: Vec<&[u32]> = whole.iter().map(|&i| pieces[i].1).collect();
        let slots: Vec<usize> = whole.iter().map(|&i| pieces[i].0).collect();
        let first = self.prefill(&prompts, &slots)?;
        if whole.len() == pieces.len() {
            return Ok(first);
        }
        let rest: Vec<usize> = (0..pieces.len()).filter(|i| !whole.contains(i)).collect();
        let others: Vec<(usize, &[u32], bool)> = rest.iter().map(|&i| pieces[i]).collect();
        let second = self.continue_pieces(&others)?;
        // Piece `i`'s row of `[first; second]`: `whole`'s rows first, then `rest`'s.
        let mut order = vec![0i32; pieces.len()];
        for (row, &i) in whole.iter().chain(&rest).enumerate() {
            order[i] = row as i32;
        }
        let dev = first.device();
        let n = order.len();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(order, [n]), (&dev, DType::I32));
        Ok(Tensor::cat(vec![first, second], 0).select(0, idx))
    }

    /// The pieces of [`Self::prefill_pieces`] that continue or leave a partial state, in one
    /// ragged forward.
    fn continue_pieces(
        &mut self,
        pieces: &[(usize, &[u32], bool)],
    ) -> Result<Tensor<2>, ModelError> {
        let mut states: Vec<SequenceState> = pieces
            .iter()
            .map(|&(slot, _, _)| {
                self.partial
                    .remove(&slot)
                    .unwrap_or_else(|| self.model.new_state())
            })
            .collect();
        let tokens: Vec<&[u32]> = pieces.iter().map(|p| p.1).collect();
        let logits = {
            let mut refs: Vec<&mut SequenceState> = states.iter_mut().collect();
            self.model.forward_last(&tokens, &mut refs)?
        };
        for (&(slot, _, last), st) in pieces.iter().zip(states) {
            if last {
                self.model.load_slot(&mut self.state, slot, &st)?;
            } else {
                self.partial.insert(slot, st);
            }
        }
        Ok(logits)
    }

    /// Drops the partial state of a prompt cancelled part-way through its prefill.
    pub(crate) fn drop_partial(&mut self, slot: usize) {
        self.partial.remove(&slot);
    }

    /// One decode step: row `i` feeds `ids[i]` to slot `slots[i]`. Returns the logits of every
    /// row of the padded batch (the live rows first; pad rows meaningless) and the device's
    /// argmax of each live row.
    #[allow(
        clippy::expect_used,
        reason = "convert::<i64>() makes the elements i64, so into_vec::<i64> cannot fail"
    )]
    pub(crate) fn decode(
        &mut self,
        ids: &[u32],
        slots: &[usize],
    ) -> Result<(Tensor<2>, Vec<u32>), ModelError> {
        let b = ids.len();
        let size = self
            .batch_sizes
            .iter()
            .copied()
            .find(|&s| s >= b)
            .unwrap_or(b);
        let mut id_row = vec![0i32; size];
        let mut slot_row = vec![-1i32; size];
        for i in 0..b {
            id_row[i] = ids[i] as i32;
            slot_row[i] = slots[i] as i32;
        }
        let dev = self.model.device().clone();
        let (logits, argmax) = if self.use_graphs && ops::supports_graphs(&dev) {
            let g = self.graph(size)?;
            ops::write_i32(&mut g.ids, &id_row);
            ops::write_i32(&mut g.slots, &slot_row);
            // Safety: the graph's closure owns clones of every tensor it reads or writes (the
            // model outlives the engine); refreshes and replays run on this thread's stream.
            let (l, a) = unsafe { g.graph.replay() };
            (l.clone(), a.clone())
        } else {
            let ids_t =
                Tensor::<2, Int>::from_data(TensorData::new(id_row, [size, 1]), (&dev, DType::I32));
            let slots_t = Tensor::<1, Int>::from_data(
                TensorData::new(slot_row.clone(), [size]),
                (&dev, DType::I32),
            );
            let l = self.model.decode_slots(&mut self.state, &ids_t, &slots_t);
            let a = ops::argmax_rows(l.clone());
            (l, a)
        };
        // The device advanced the live slots' lengths inside the step; the host's copy here.
        self.state.note_step(&slot_row);
        self.steps += 1;
        let chosen: Vec<i64> = argmax.into_data().convert::<i64>().into_vec().expect("ids");
        let chosen = chosen[..b].iter().map(|&t| t as u32).collect();
        Ok((logits, chosen))
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
            let a = ops::argmax_rows(l.clone());
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
