//! A pre-norm residual block with one mixer: `x + mixer(RMSNorm(x))`.

use crate::attention::Attention;
use crate::cache::SequenceState;
use crate::mamba2::Mamba2;
use crate::mlp::Mlp;
use crate::moe::Moe;
use crate::norm::RmsNorm;
use crate::Deviations;
use burn::tensor::Tensor;
use nemotron_kernels::NemotronBackend;

#[derive(Debug, Clone)]
pub enum Mixer<B: NemotronBackend> {
    Mamba(Mamba2<B>),
    Moe(Moe<B>),
    Attention(Attention<B>),
    Mlp(Mlp<B>),
}

#[derive(Debug, Clone)]
pub struct Block<B: NemotronBackend> {
    pub norm: RmsNorm<B>,
    pub mixer: Mixer<B>,
}

impl<B: NemotronBackend> Block<B> {
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        lens: &[usize],
        states: &mut [&mut SequenceState<B>],
        layer: usize,
        dev: &Deviations,
    ) -> Tensor<B, 3> {
        let h = self.norm.forward(x.clone());
        let y = match &self.mixer {
            Mixer::Mamba(m) => m.forward(h, lens, states, layer, dev),
            Mixer::Moe(m) => m.forward(h, dev.bias_in_routing_weights),
            Mixer::Attention(a) => a.forward(h, lens, states, layer, dev.rope_theta),
            Mixer::Mlp(m) => m.forward(h),
        };
        x + y
    }
}
