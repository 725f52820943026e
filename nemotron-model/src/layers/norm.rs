//! RMSNorm and the Mamba2 gated group RMSNorm (statistics in f32).

use burn::tensor::Tensor;
use nemotron_kernels::ops;

/// `w · x / sqrt(mean(x²) + eps)` over the last dimension.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    pub weight: Tensor<1>,
    pub eps: f64,
}

impl RmsNorm {
    /// Statistics in f32 whatever the activation dtype (a bf16 sum over thousands of channels
    /// loses most of its bits); cast back after the weight, as NVIDIA's reference does.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dims = x.dims();
        let h = dims[D - 1];
        let x2: Tensor<2> = x.reshape([dims.iter().product::<usize>() / h, h]);
        ops::rms_norm(x2, None, self.weight.clone(), 1, self.eps).reshape(dims)
    }
}

/// The Mamba2 output norm: `u = y · silu(z)` (gate before the norm), RMS-normalized within each of
/// `groups` contiguous channel groups, times the weight.
#[derive(Debug, Clone)]
pub struct GatedRmsNorm {
    pub weight: Tensor<1>,
    pub groups: usize,
    pub eps: f64,
}

impl GatedRmsNorm {
    /// `y`, `z`: `[B, T, I]`.
    pub fn forward(&self, y: Tensor<3>, z: Tensor<3>) -> Tensor<3> {
        let [b, t, i] = y.dims();
        ops::rms_norm(
            y.reshape([b * t, i]),
            Some(z.reshape([b * t, i])),
            self.weight.clone(),
            self.groups,
            self.eps,
        )
        .reshape([b, t, i])
    }
}
