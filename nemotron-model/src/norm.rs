//! RMSNorm and the Mamba2 gated group RMSNorm (statistics in f32).

use burn::tensor::{backend::Backend, Tensor};

/// `w · x / sqrt(mean(x²) + eps)` over the last dimension.
#[derive(Debug, Clone)]
pub struct RmsNorm<B: Backend> {
    pub weight: Tensor<B, 1>,
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let var = x.clone().powi_scalar(2).mean_dim(D - 1);
        let normed = x * (var + self.eps).sqrt().recip();
        normed * self.weight.clone().unsqueeze::<D>()
    }
}

/// The Mamba2 output norm: `u = y · silu(z)` (gate before the norm), RMS-normalized within each of
/// `groups` contiguous channel groups, times the weight.
#[derive(Debug, Clone)]
pub struct GatedRmsNorm<B: Backend> {
    pub weight: Tensor<B, 1>,
    pub groups: usize,
    pub eps: f64,
}

impl<B: Backend> GatedRmsNorm<B> {
    /// `y`, `z`: `[B, T, I]`.
    pub fn forward(&self, y: Tensor<B, 3>, z: Tensor<B, 3>, whole_width: bool) -> Tensor<B, 3> {
        let [b, t, i] = y.dims();
        let u = y * burn::tensor::activation::silu(z);
        let g = if whole_width { 1 } else { self.groups };
        let u = u.reshape([b, t, g, i / g]);
        let var = u.clone().powi_scalar(2).mean_dim(3);
        let u = (u * (var + self.eps).sqrt().recip()).reshape([b, t, i]);
        u * self.weight.clone().unsqueeze::<3>()
    }
}
