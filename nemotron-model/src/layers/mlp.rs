//! The non-gated relu² MLP: `down(relu(up · x)²)`, used by the dense `-` layers and by every expert.

use crate::layers::linear::Linear;
use burn::tensor::{DType, Device, Tensor};
use nemotron_kernels::Epilogue;
use nemotron_loader::{ExpertWeights, MlpWeights};

#[derive(Debug, Clone)]
pub struct Mlp {
    up: Linear,
    down: Linear,
}

impl Mlp {
    pub fn new(up: Linear, down: Linear) -> Self {
        Mlp { up, down }
    }

    pub fn from_weights(w: MlpWeights, dev: &Device, dtype: DType) -> Self {
        Self::new(
            Linear::from_weight(w.up, dev, dtype),
            Linear::from_weight(w.down, dev, dtype),
        )
    }

    pub fn from_expert(w: ExpertWeights, dev: &Device, dtype: DType) -> Self {
        Self::from_weights(
            MlpWeights {
                up: w.up,
                down: w.down,
            },
            dev,
            dtype,
        )
    }

    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        self.down
            .forward(self.up.forward(x, Epilogue::Relu2), Epilogue::None)
    }
}
