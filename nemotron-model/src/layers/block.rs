//! A pre-norm residual block with one mixer: `x + mixer(RMSNorm(x))`.

use crate::cache::{BatchLayer, KvCacheDtype, LayerState, SequenceState, SlotLayer, SsmCacheDtype};
use crate::layers::attention::Attention;
use crate::layers::fold::SharedExpert;
use crate::layers::mamba2::Mamba2;
use crate::layers::mlp::Mlp;
use crate::layers::moe::{Moe, MoeOut};
use crate::layers::norm::RmsNorm;
use crate::util::float;
use crate::Deviations;
use burn::tensor::{DType, Device, Int, Tensor};
use nemotron_kernels::ops;
use nemotron_loader::{LayerWeights, MixerWeights, NemotronHConfig};

#[derive(Debug, Clone)]
pub enum Mixer {
    Mamba(Mamba2),
    Moe(Moe),
    Attention(Attention),
    Mlp(Mlp),
}

#[derive(Debug, Clone)]
pub struct Block {
    norm: RmsNorm,
    mixer: Mixer,
}

impl Block {
    /// Builds a block from its loaded weights; the config was validated by the loader, so every
    /// mixer kind present has its section. `shared`: how a MoE mixer runs its shared expert.
    pub fn from_weights(
        w: LayerWeights,
        cfg: &NemotronHConfig,
        dev: &Device,
        dtype: DType,
        dv: &Deviations,
        shared: SharedExpert,
    ) -> Self {
        let eps = cfg.norm_eps;
        let section = |what: &str| -> ! { panic!("validated config has no {what} section") };
        let mixer = match w.mixer {
            MixerWeights::Mamba(m) => {
                let c = cfg.mamba.as_ref().unwrap_or_else(|| section("mamba"));
                Mixer::Mamba(Mamba2::from_weights(m, c, eps, dev, dtype, dv))
            }
            MixerWeights::Moe(m) => {
                let c = cfg.moe.as_ref().unwrap_or_else(|| section("moe"));
                Mixer::Moe(Moe::from_weights(
                    m,
                    c,
                    dev,
                    dtype,
                    dv.bias_in_routing_weights,
                    shared,
                ))
            }
            MixerWeights::Attention(a) => {
                let c = cfg
                    .attention
                    .as_ref()
                    .unwrap_or_else(|| section("attention"));
                Mixer::Attention(Attention::from_weights(a, c, dev, dtype, dv.rope_theta))
            }
            MixerWeights::Mlp(m) => Mixer::Mlp(Mlp::from_weights(m, dev, dtype)),
        };
        Block {
            norm: RmsNorm {
                weight: float(&w.norm, dev, dtype),
                eps,
            },
            mixer,
        }
    }

    pub fn mixer(&self) -> &Mixer {
        &self.mixer
    }

    /// This block's part of a fresh sequence state.
    pub fn new_state(&self) -> LayerState {
        match &self.mixer {
            Mixer::Mamba(m) => m.new_state(),
            Mixer::Attention(_) => LayerState::Attention { k: None, v: None },
            Mixer::Moe(_) | Mixer::Mlp(_) => LayerState::Stateless,
        }
    }

    /// Whether `st` is this block's kind of state with its shapes, for a sequence at
    /// `position` (metadata only: nothing is read from the device).
    pub(crate) fn check_state(&self, st: &LayerState, position: usize) -> Result<(), String> {
        let kind = |st: &LayerState| match st {
            LayerState::Mamba { .. } => "a Mamba state",
            LayerState::Attention { .. } => "an attention state",
            LayerState::Stateless => "no state",
        };
        match (&self.mixer, st) {
            (Mixer::Mamba(m), LayerState::Mamba { conv, ssm }) => m.check_state(conv, ssm),
            (Mixer::Attention(a), LayerState::Attention { k, v }) => a.check_state(k, v, position),
            (Mixer::Moe(_) | Mixer::Mlp(_), LayerState::Stateless) => Ok(()),
            (mixer, st) => Err(format!(
                "holds {} where the layer is {}",
                kind(st),
                match mixer {
                    Mixer::Mamba(_) => "a Mamba mixer",
                    Mixer::Attention(_) => "an attention mixer",
                    Mixer::Moe(_) => "a MoE",
                    Mixer::Mlp(_) => "an MLP",
                }
            )),
        }
    }

    /// Device bytes one slot of `capacity` tokens takes in [`Self::new_slots`]'s pools.
    pub fn slot_bytes(
        &self,
        capacity: usize,
        dtype: DType,
        kv: KvCacheDtype,
        ssm: SsmCacheDtype,
    ) -> usize {
        match &self.mixer {
            Mixer::Mamba(m) => m.slot_bytes(ssm),
            Mixer::Attention(a) => a.slot_bytes(capacity, dtype, kv),
            Mixer::Moe(_) | Mixer::Mlp(_) => 0,
        }
    }

    /// This block's part of fresh slot pools.
    pub fn new_slots(
        &self,
        slots: usize,
        capacity: usize,
        dev: &Device,
        dtype: DType,
        kv: KvCacheDtype,
        ssm: SsmCacheDtype,
    ) -> SlotLayer {
        match &self.mixer {
            Mixer::Mamba(m) => m.new_slots(slots, ssm),
            Mixer::Attention(a) => a.new_slots(slots, capacity, dev, dtype, kv),
            Mixer::Moe(_) | Mixer::Mlp(_) => SlotLayer::Stateless,
        }
    }

    /// One token per row over slot states (see [`crate::NemotronH::decode_slots`]).
    /// The block's pre-norm (the decode step fuses it with the previous residual add).
    pub(crate) fn norm(&self) -> &RmsNorm {
        &self.norm
    }

    /// The mixer alone over slot states, on the already-normalized `h` `[B, 1, hidden]`, as rows
    /// `[B, hidden]` (a MoE's left uncombined): the decode step adds the residual, combines and
    /// applies the next norm in one fused op.
    pub(crate) fn mix_step(
        &self,
        h: Tensor<3>,
        pools: &mut SlotLayer,
        lens: &Tensor<1, Int>,
        slots: &Tensor<1, Int>,
    ) -> MoeOut {
        let [b, _, hid] = h.dims();
        let rows = |y: Tensor<3>| MoeOut::Combined(y.reshape([b, hid]));
        match &self.mixer {
            Mixer::Mamba(m) => rows(m.step(h, pools, lens, slots)),
            Mixer::Moe(m) => m.forward_parts(h, true),
            Mixer::Attention(a) => rows(a.step(h, pools, lens, slots)),
            Mixer::Mlp(m) => rows(m.forward(h)),
        }
    }

    pub fn forward(
        &self,
        x: Tensor<3>,
        lens: &[usize],
        states: &mut [&mut SequenceState],
        layer: usize,
    ) -> Tensor<3> {
        self.forward_kept(x, lens, states, layer).0
    }

    /// [`Self::forward`], also returning the batch's new layer state whole where the mixer kept
    /// it (see [`BatchLayer`]).
    pub(crate) fn forward_kept(
        &self,
        x: Tensor<3>,
        lens: &[usize],
        states: &mut [&mut SequenceState],
        layer: usize,
    ) -> (Tensor<3>, Option<BatchLayer>) {
        let [b, t, hid] = x.dims();
        let h = self.norm.forward(x.clone());
        let (y, kept) = self.mix_kept(h, lens, states, layer);
        let y = match y {
            MoeOut::Combined(y) => y,
            MoeOut::Parts { routed, w, shared } => ops::moe_combine(routed, w, shared),
        };
        (x + y.reshape([b, t, hid]), kept)
    }

    /// The mixer alone over a ragged batch, on the already-normalized `h` `[B, T, hidden]`, as
    /// rows `[B·T, hidden]` (a MoE's left uncombined), with the batch's new layer state where the
    /// mixer kept it: the prefill adds the residual, combines and applies the next norm in one
    /// fused op, as the decode step does ([`Self::mix_step`]).
    pub(crate) fn mix_kept(
        &self,
        h: Tensor<3>,
        lens: &[usize],
        states: &mut [&mut SequenceState],
        layer: usize,
    ) -> (MoeOut, Option<BatchLayer>) {
        let [b, t, hid] = h.dims();
        let rows = |y: Tensor<3>| MoeOut::Combined(y.reshape([b * t, hid]));
        match &self.mixer {
            Mixer::Mamba(m) => {
                let (y, kept) = m.forward_kept(h, lens, states, layer);
                (rows(y), Some(kept))
            }
            Mixer::Moe(m) => (m.forward_parts(h, false), Some(BatchLayer::Stateless)),
            Mixer::Attention(a) => {
                let (y, kept) = a.forward_kept(h, lens, states, layer);
                (rows(y), kept)
            }
            Mixer::Mlp(m) => (rows(m.forward(h)), Some(BatchLayer::Stateless)),
        }
    }
}
