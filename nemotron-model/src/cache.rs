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
