//! Per-sequence inference state: conv and SSM state per Mamba layer, KV cache per attention layer.

use burn::tensor::{backend::Backend, Tensor};

/// The state one layer keeps between calls.
#[derive(Debug, Clone)]
pub enum LayerState<B: Backend> {
    /// `conv`: the last `K-1` pre-conv `[x|B|C]` inputs, `[C, K-1]` (oldest first);
    /// `ssm`: `[H, P, N]`, f32.
    Mamba {
        conv: Tensor<B, 2>,
        ssm: Tensor<B, 3>,
    },
    /// Keys and values so far, `[kv_heads, S, head_dim]` each (`None` before the first token).
    Attention {
        k: Option<Tensor<B, 3>>,
        v: Option<Tensor<B, 3>>,
    },
    /// MoE and MLP layers keep nothing.
    Stateless,
}

/// Everything a sequence carries from one forward call to the next.
#[derive(Debug, Clone)]
pub struct SequenceState<B: Backend> {
    pub layers: Vec<LayerState<B>>,
    /// Tokens consumed so far.
    pub position: usize,
}
