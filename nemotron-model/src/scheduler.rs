//! The engine's bookkeeping, apart from the device: the queue of waiting requests, the free
//! slots and the running sequences, and which requests a step admits.

use crate::request::Sequence;
use std::collections::VecDeque;

/// A submitted request's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// A request waiting for a slot.
pub(crate) struct Waiting {
    pub(crate) id: RequestId,
    pub(crate) seq: Sequence,
}

/// A sequence decoding in its slot.
pub(crate) struct Running {
    pub(crate) id: RequestId,
    pub(crate) slot: usize,
    pub(crate) seq: Sequence,
}

/// A request holding a slot whose prompt is being prefilled over several steps (the engine's
/// `prefill_chunk` / `step_tokens`): `done` prompt tokens run so far.
pub(crate) struct Prefilling {
    pub(crate) id: RequestId,
    pub(crate) slot: usize,
    pub(crate) seq: Sequence,
    pub(crate) done: usize,
}

/// One step's piece of a prompt: `len` tokens from `prefilling[i].done`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) index: usize,
    pub(crate) len: usize,
}

/// Queue, free slots and running sequences of an engine of `slots` slots.
pub(crate) struct Scheduler {
    free: Vec<usize>,
    pub(crate) running: Vec<Running>,
    /// Oldest first.
    pub(crate) prefilling: Vec<Prefilling>,
    waiting: VecDeque<Waiting>,
    next_id: u64,
}

impl Scheduler {
    pub(crate) fn new(slots: usize) -> Self {
        Scheduler {
            free: (0..slots).rev().collect(),
            running: vec![],
            prefilling: vec![],
            waiting: VecDeque::new(),
            next_id: 0,
        }
    }

    /// Queues a checked request.
    pub(crate) fn submit(&mut self, seq: Sequence) -> RequestId {
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.waiting.push_back(Waiting { id, seq });
        id
    }

    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub(crate) fn running(&self) -> usize {
        self.running.len()
    }

    pub(crate) fn prefilling(&self) -> usize {
        self.prefilling.len()
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.prefilling.is_empty()
    }

    /// Drops a request wherever it is (its slot, if it had one, goes back to the free list).
    /// Returns the slot of a request that was part-way through its prefill (its partial state
    /// is the runner's to drop), as `Some(Some(slot))`; `Some(None)` for the others found.
    pub(crate) fn cancel(&mut self, id: RequestId) -> Option<Option<usize>> {
        if let Some(i) = self.waiting.iter().position(|w| w.id == id) {
            self.waiting.remove(i);
            return Some(None);
        }
        if let Some(i) = self.prefilling.iter().position(|p| p.id == id) {
            let p = self.prefilling.remove(i);
            self.free.push(p.slot);
            return Some(Some(p.slot));
        }
        if let Some(i) = self.running.iter().position(|r| r.id == id) {
            let r = self.running.remove(i);
            self.free.push(r.slot);
            return Some(None);
        }
        None
    }

    /// A step's prompt pieces under a token budget (vLLM's chunked prefill): `budget` tokens
    /// after the running sequences' decode rows, at most `chunk` of one prompt (0: no limit).
    /// Prompts part-way through go first, oldest first; then waiting requests take free slots,
    /// oldest first, while budget is left. The pieces index [`Scheduler::prefilling`].
    pub(crate) fn plan_pieces(&mut self, budget: usize, chunk: usize) -> Vec<Piece> {
        let chunk = if chunk == 0 { usize::MAX } else { chunk };
        let mut left = budget;
        let mut pieces = vec![];
        for (index, p) in self.prefilling.iter().enumerate() {
            if left == 0 {
                return pieces;
            }
            let len = (p.seq.prompt_len - p.done).min(chunk).min(left);
            left -= len;
            pieces.push(Piece { index, len });
        }
        while left > 0 && !self.free.is_empty() {
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            let slot = self.free.pop().unwrap_or_default();
            let len = w.seq.prompt_len.min(chunk).min(left);
            left -= len;
            pieces.push(Piece {
                index: self.prefilling.len(),
                len,
            });
            self.prefilling.push(Prefilling {
                id: w.id,
                slot,
                seq: w.seq,
                done: 0,
            });
        }
        pieces
    }

    /// The requests this step admits — as many as there are free slots, oldest first — with
    /// the slot each takes (in the order the free list hands them out).
    pub(crate) fn admit(&mut self) -> (Vec<Waiting>, Vec<usize>) {
        let n = self.free.len().min(self.waiting.len());
        let batch: Vec<Waiting> = self.waiting.drain(..n).collect();
        let mut taken = self.free.split_off(self.free.len() - n);
        taken.reverse();
        (batch, taken)
    }

    /// Slots given back: by a failed admission, or by sequences that ended.
    pub(crate) fn release(&mut self, slots: impl IntoIterator<Item = usize>) {
        self.free.extend(slots);
    }

    /// Takes the running sequences for a step's update ([`Scheduler::keep`] puts back those
    /// that go on).
    pub(crate) fn take_running(&mut self) -> Vec<Running> {
        std::mem::take(&mut self.running)
    }

    /// A sequence that goes on decoding.
    pub(crate) fn keep(&mut self, r: Running) {
        self.running.push(r);
    }
}
