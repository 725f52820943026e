//! RMSNorm and the Mamba2 gated group RMSNorm (statistics in f32).

use burn::tensor::{backend::Backend, DType, Tensor};

/// `w · x / sqrt(mean(x²) + eps)` over the last dimension.
#[derive(Debug, Clone)]
pub struct RmsNorm<B: Backend> {
    pub weight: Tensor<B, 1>,
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        // Statistics in f32 whatever the activation dtype (a bf16 sum over thousands of channels
        // loses most of its bits); cast back after the weight, as NVIDIA's reference does.
        let dtype = x.dtype();
        let x = to_f32(x);
        let var = x.clone().powi_scalar(2).mean_dim(D - 1);
        let normed = x * (var + self.eps).sqrt().recip();
        from_f32(normed * to_f32(self.weight.clone()).unsqueeze::<D>(), dtype)
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
        let dtype = y.dtype();
        let u = to_f32(y) * burn::tensor::activation::silu(to_f32(z));
        let g = if whole_width { 1 } else { self.groups };
        let u = u.reshape([b, t, g, i / g]);
        let var = u.clone().powi_scalar(2).mean_dim(3);
        let u = (u * (var + self.eps).sqrt().recip()).reshape([b, t, i]);
        from_f32(u * to_f32(self.weight.clone()).unsqueeze::<3>(), dtype)
    }
}

/// `x` as f32 (a no-op for f32 tensors).
pub fn to_f32<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    if x.dtype() == DType::F32 {
        x
    } else {
        x.cast(DType::F32)
    }
}

/// `x` back to `dtype` (a no-op when it already is).
pub fn from_f32<B: Backend, const D: usize>(x: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if x.dtype() == dtype {
        x
    } else {
        x.cast(dtype)
    }
}
