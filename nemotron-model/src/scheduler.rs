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

/// Queue, free slots and running sequences of an engine of `slots` slots.
pub(crate) struct Scheduler {
    free: Vec<usize>,
    pub(crate) running: Vec<Running>,
    waiting: VecDeque<Waiting>,
    next_id: u64,
}

impl Scheduler {
    pub(crate) fn new(slots: usize) -> Self {
        Scheduler {
            free: (0..slots).rev().collect(),
            running: vec![],
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

    pub(crate) fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Drops a request wherever it is (its slot, if it had one, goes back to the free list).
    pub(crate) fn cancel(&mut self, id: RequestId) -> bool {
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
