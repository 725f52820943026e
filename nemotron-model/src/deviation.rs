//! Deliberate deviations from the model, off by default. They exist so the parity tests can show
//! that each tolerance band discriminates: a plausible wrong implementation (RoPE on q/k, a dt
//! clamp, a whole-width gated norm, the correction bias in the weights, W8A8 run weight-only) must
//! land outside it. They are applied when the model is built; never enable them for inference.

/// Which deviations to apply.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Deviations {
    /// Apply rotary embeddings (this base) to q and k, as a Llama-style port would.
    pub rope_theta: Option<f32>,
    /// Clamp `dt ≥ this` after the softplus, as HF's chunked path does with `time_step_min`.
    pub dt_min_clamp: Option<f32>,
    /// Normalize the gated output over the whole inner width instead of per group.
    pub gated_norm_whole_width: bool,
    /// Weight the experts by the biased scores (`sigmoid + e_score_correction_bias`).
    pub bias_in_routing_weights: bool,
    /// Run the Mamba FP8 linears weight-only (skip the activation quantization).
    pub fp8_weight_only: bool,
}
