//! The non-gated relu² MLP: `down(relu(up · x)²)`, used by the dense `-` layers and by every expert.

use crate::linear::Linear;
use burn::tensor::Tensor;
use nemotron_kernels::NemotronBackend;

#[derive(Debug, Clone)]
pub struct Mlp<B: NemotronBackend> {
    pub up: Linear<B>,
    pub down: Linear<B>,
}

impl<B: NemotronBackend> Mlp<B> {
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.down.forward(self.up.forward_relu2(x))
    }
}
