//! Inference state, apart from the model that reads and writes it: per sequence (conv and SSM
//! state per Mamba layer, KV cache per attention layer), per batch as a forward computed it, and
//! in fixed decode slots ([`SlotState`]; written by the model's `slots.rs`).

use burn::tensor::{Int, Tensor};

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

/// How slot KV caches hold keys and values (vLLM's `--kv-cache-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDtype {
    /// The activation dtype.
    #[default]
    Auto,
    /// E4M3 codes of `x / scale` with the checkpoint's `k_scale` / `v_scale` (1.0 where it
    /// ships none), read as `f32(code) · scale`: half the bytes of bf16. Decode steps store and
    /// attend the codes; a prompt's own prefill attends its keys in the activation dtype and
    /// then stores them as codes.
    Fp8,
}

impl std::str::FromStr for KvCacheDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(KvCacheDtype::Auto),
            "fp8" | "fp8_e4m3" => Ok(KvCacheDtype::Fp8),
            other => Err(format!(
                "KV cache dtype `{other}`: expected `auto` (the activation dtype) or `fp8` (E4M3)"
            )),
        }
    }
}

impl std::fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Fp8 => "fp8",
        })
    }
}

/// How slot states hold the Mamba layers' SSM state (vLLM's `--mamba-ssm-cache-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SsmCacheDtype {
    /// f32 whatever the activation dtype (the reference: the state carries a long prompt's
    /// history, and f32 keeps its rounding out of the decode).
    #[default]
    F32,
    /// bf16, two to an I32 word: half the bytes a decode step reads and writes (at batch 256
    /// the state is the step's largest traffic after the weights). The step computes in f32 and
    /// rounds the new state to nearest even, as HF transformers' and `mamba_ssm`'s bf16 caches
    /// store it. Prefill runs in f32 as before; its final state is rounded as it enters a slot.
    Bf16,
}

impl std::str::FromStr for SsmCacheDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "float32" | "f32" => Ok(SsmCacheDtype::F32),
            "bfloat16" | "bf16" => Ok(SsmCacheDtype::Bf16),
            other => Err(format!(
                "SSM cache dtype `{other}`: expected `float32` (the default) or `bfloat16`"
            )),
        }
    }
}

impl std::fmt::Display for SsmCacheDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SsmCacheDtype::F32 => "float32",
            SsmCacheDtype::Bf16 => "bfloat16",
        })
    }
}

/// One layer's share of the slot pools.
#[derive(Debug, Clone)]
pub enum SlotLayer {
    Mamba {
        conv: Tensor<3>,
        ssm: Tensor<4>,
    },
    /// A bf16 SSM state ([`SsmCacheDtype::Bf16`]): `ssm` `[S, H, P, N/2]` I32 words, two bf16
    /// each (element `2w` in the low half).
    Mamba16 {
        conv: Tensor<3>,
        ssm: Tensor<4, Int>,
    },
    Attention {
        k: Tensor<4>,
        v: Tensor<4>,
    },
    /// An FP8 KV cache ([`KvCacheDtype::Fp8`]): `[S, KVH, capacity, D/4]` I32 words, four E4M3
    /// codes each.
    Attention8 {
        k: Tensor<4, Int>,
        v: Tensor<4, Int>,
    },
    Stateless,
}

/// The decode state of up to `slots` sequences of up to `capacity` tokens each.
#[derive(Debug, Clone)]
pub struct SlotState {
    pub(crate) layers: Vec<SlotLayer>,
    /// Tokens held by each slot, `[S]` I32 on the device (read by the attention kernels).
    pub(crate) lens: Tensor<1, Int>,
    /// The same lengths on the host.
    pub(crate) host_lens: Vec<usize>,
    pub(crate) capacity: usize,
}

impl SlotState {
    pub fn slots(&self) -> usize {
        self.host_lens.len()
    }

    /// Tokens each slot can hold (prompt and generated together).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Tokens slot `slot` holds.
    pub fn len(&self, slot: usize) -> usize {
        self.host_lens[slot]
    }

    /// Device bytes the pools take.
    pub fn bytes(&self) -> usize {
        let size = |t: &Tensor<3>| t.shape().num_elements() * t.dtype().size();
        let size4 = |t: &Tensor<4>| t.shape().num_elements() * t.dtype().size();
        self.layers
            .iter()
            .map(|l| match l {
                SlotLayer::Mamba { conv, ssm } => size(conv) + size4(ssm),
                SlotLayer::Mamba16 { conv, ssm } => {
                    size(conv) + ssm.shape().num_elements() * ssm.dtype().size()
                }
                SlotLayer::Attention { k, v } => size4(k) + size4(v),
                SlotLayer::Attention8 { k, v } => {
                    let words = |t: &Tensor<4, Int>| t.shape().num_elements() * t.dtype().size();
                    words(k) + words(v)
                }
                SlotLayer::Stateless => 0,
            })
            .sum::<usize>()
            + 4 * self.slots()
    }

    /// Records on the host that the rows of `slots` (negative: pad) took one more token, as
    /// [`crate::NemotronH::decode_slots`] did on the device.
    pub fn note_step(&mut self, slots: &[i32]) {
        for &s in slots {
            if s >= 0 {
                self.host_lens[s as usize] += 1;
            }
        }
    }
}
