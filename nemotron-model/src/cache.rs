//! Per-sequence inference state: conv and SSM state per Mamba layer, KV cache per attention layer.

use burn::tensor::Tensor;

/// The state one layer keeps between calls.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// `conv`: the last `K-1` pre-conv `[x|B|C]` inputs, `[C, K-1]` (oldest first), in the
    /// activation dtype; `ssm`: `[H, P, N]`, f32.
    Mamba { conv: Tensor<2>, ssm: Tensor<3> },
    /// Keys and values so far, `[kv_heads, S, head_dim]` each (`None` before the first token).
    Attention {
        k: Option<Tensor<3>>,
        v: Option<Tensor<3>>,
    },
    /// MoE and MLP layers keep nothing.
    Stateless,
}

/// Everything a sequence carries from one forward call to the next.
#[derive(Debug, Clone)]
pub struct SequenceState {
    pub layers: Vec<LayerState>,
    /// Tokens consumed so far. At 0 the sequence has consumed nothing, so its Mamba states are
    /// the zero state whatever `layers` holds (a batch of new sequences starts from zeros
    /// without reading them).
    pub position: usize,
}

/// One layer's states for a whole batch, as the forward computed them (`[B, …]`, before the
/// per-sequence split): what [`crate::NemotronH::prefill_slots`] writes into the slot pools in
/// one launch per pool instead of one per sequence.
#[derive(Debug, Clone)]
pub(crate) enum BatchLayer {
    /// `conv` `[B, C, K-1]`, `ssm` `[B, H, P, N]` f32.
    Mamba {
        conv: Tensor<3>,
        ssm: Tensor<4>,
    },
    /// Keys and values `[B, KVH, T, D]` of a batch prefilled from empty (rows past a sequence's
    /// length: padding, never read).
    Attention {
        k: Tensor<4>,
        v: Tensor<4>,
    },
    Stateless,
}
