//! Graph capture of a decode step — the spike that proves the mechanism on our own model before the
//! decode engine builds on it.
//!
//! [`NemotronH::capture_step`] records one decode step (token ids already on the device, one
//! sequence state) with Burn's `capture`: on CUDA the step's launches become one CUDA graph, which
//! [`Graph::replay`](burn::tensor::Graph::replay) re-runs against the very buffers it was captured
//! with; other backends re-run the closure. The step is functional — it reads the captured state
//! and writes fresh outputs — so every replay recomputes the same step from the same state: the
//! replayed logits must equal the eager ones bit for bit. Advancing from step to step needs state
//! written in place into fixed buffers (the decode engine's slots), which this spike does not do.
//!
//! What keeps the step capturable: no host write inside it (ids are uploaded before capture; a
//! single new token needs no attention mask; every sequence filling `T` needs no lengths buffer),
//! no host read, and every buffer allocated during the warm-up runs before the capture.

use crate::cache::SequenceState;
use crate::error::ModelError;
use crate::model::NemotronH;
use burn::tensor::{capture, Graph, Int, Tensor};

impl NemotronH {
    /// Captures the step `ids [B, 1] → logits [B, vocab]` from `states` (warm-up runs included).
    /// `replay` then recomputes that same step; the returned graph borrows the model.
    #[allow(
        clippy::expect_used,
        reason = "the ids and states were checked to pair up before capture"
    )]
    pub fn capture_step(
        &self,
        ids: Tensor<2, Int>,
        states: Vec<SequenceState>,
    ) -> Result<Graph<Tensor<2>, impl FnMut() -> Tensor<2> + '_>, ModelError> {
        let [b, t] = ids.dims();
        if b != states.len() || t != 1 {
            return Err(ModelError::Input(format!(
                "a decode step takes [B, 1] ids for B states: got [{b}, {t}] for {}",
                states.len()
            )));
        }
        Ok(capture(self.device(), move || {
            let mut s = states.clone();
            let mut refs: Vec<&mut SequenceState> = s.iter_mut().collect();
            self.forward_last_ids(ids.clone(), &mut refs)
                .expect("checked above: one id row per state")
        }))
    }
}
