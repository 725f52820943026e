//! One linear type for every weight form: dense, NVFP4 (packed) and FP8 (W8A8 static).

use crate::error::ModelError;
use burn::tensor::Tensor;
use nemotron_kernels::{Fp8Matrix, NemotronBackend, Nvfp4Matrix};
use nemotron_loader::LinearWeight;

/// `y = x · Wᵀ` in whichever form the checkpoint shipped `W`.
#[derive(Debug, Clone)]
pub enum Linear<B: NemotronBackend> {
    /// Stored transposed, `[in, out]`, for a plain matmul.
    Dense(Tensor<B, 2>),
    Nvfp4 {
        weight: B::Nvfp4Weight,
        in_features: usize,
        out_features: usize,
    },
    Fp8 {
        weight: B::Fp8Weight,
        in_features: usize,
        out_features: usize,
        dequant: Option<Tensor<B, 2>>,
    },
}

impl<B: NemotronBackend> Linear<B> {
    /// Moves a loaded weight onto the backend in the same form.
    pub fn from_weight(w: LinearWeight, dev: &B::Device) -> Result<Self, ModelError> {
        Ok(match w {
            LinearWeight::Dense(t) => {
                Linear::Dense(crate::util::to_tensor_transposed::<B>(&t, dev))
            }
            LinearWeight::Nvfp4(n) => {
                let (in_features, out_features) = (n.in_features, n.out_features);
                Linear::Nvfp4 {
                    weight: B::nvfp4_weight(nvfp4_matrix(n), dev),
                    in_features,
                    out_features,
                }
            }
            LinearWeight::Fp8(f) => {
                let (in_features, out_features) = (f.in_features, f.out_features);
                Linear::Fp8 {
                    weight: B::fp8_weight(fp8_matrix(f), dev),
                    in_features,
                    out_features,
                    dequant: None,
                }
            }
        })
    }

    pub fn in_features(&self) -> usize {
        match self {
            Linear::Dense(w) => w.dims()[0],
            Linear::Nvfp4 { in_features, .. } | Linear::Fp8 { in_features, .. } => *in_features,
        }
    }

    pub fn out_features(&self) -> usize {
        match self {
            Linear::Dense(w) => w.dims()[1],
            Linear::Nvfp4 { out_features, .. } | Linear::Fp8 { out_features, .. } => *out_features,
        }
    }

    /// Applies the linear over the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dims = x.dims();
        let k = dims[D - 1];
        let rows = dims.iter().take(D - 1).product::<usize>();
        let x2: Tensor<B, 2> = x.reshape([rows, k]);
        let y = match self {
            Linear::Dense(w) => mm(x2, w.clone()),
            Linear::Nvfp4 { weight, .. } => B::nvfp4_linear(x2, weight),
            Linear::Fp8 {
                dequant: Some(w), ..
            } => mm(x2, w.clone()),
            Linear::Fp8 { weight, .. } => B::fp8_linear(x2, weight),
        };
        let mut out = dims;
        out[D - 1] = self.out_features();
        y.reshape(out)
    }

    /// `relu(self.forward(x))²`, squared inside the quantized kernels (the MLP up projections).
    pub fn forward_relu2<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dims = x.dims();
        let k = dims[D - 1];
        let rows = dims.iter().take(D - 1).product::<usize>();
        let x2: Tensor<B, 2> = x.reshape([rows, k]);
        let y = match self {
            Linear::Nvfp4 { weight, .. } => B::nvfp4_linear_relu2(x2, weight),
            Linear::Fp8 {
                weight,
                dequant: None,
                ..
            } => B::fp8_linear_relu2(x2, weight),
            _ => nemotron_kernels::relu2(self.forward(x2)),
        };
        let mut out = dims;
        out[D - 1] = self.out_features();
        y.reshape(out)
    }

    /// For the W8A8-as-weight-only deviation: replaces the FP8 path by a dense dequantized weight.
    pub(crate) fn fp8_as_weight_only(&mut self, w: &nemotron_loader::Fp8Weight, dev: &B::Device) {
        if let Linear::Fp8 { dequant, .. } = self {
            let k = w.in_features;
            let mut v = vec![0f32; w.out_features * k];
            for (r, row) in v.chunks_mut(k).enumerate() {
                nemotron_loader::formats::fp8_dequant_row(
                    &w.weight.bytes[r * k..(r + 1) * k],
                    w.weight_scale,
                    row,
                );
            }
            *dequant = Some(crate::util::from_vec::<B, 2>(
                crate::util::transpose(&v, w.out_features, k),
                [k, w.out_features],
                dev,
            ));
        }
    }
}

/// A loaded NVFP4 weight as the kernels' matrix (the bytes move, nothing is decoded).
pub(crate) fn nvfp4_matrix(n: nemotron_loader::Nvfp4Weight) -> Nvfp4Matrix {
    Nvfp4Matrix {
        out_features: n.out_features,
        in_features: n.in_features,
        packed: n.packed.bytes,
        block_scales: n.block_scales.bytes,
        global_scale: n.weight_scale_2,
    }
}

/// A loaded FP8 weight as the kernels' matrix.
pub(crate) fn fp8_matrix(f: nemotron_loader::Fp8Weight) -> Fp8Matrix {
    Fp8Matrix {
        out_features: f.out_features,
        in_features: f.in_features,
        weight: f.weight.bytes,
        weight_scale: f.weight_scale,
        input_scale: f.input_scale,
    }
}

/// `[M, K] · [K, N]` through the backend's exact-f32 matmul.
pub(crate) fn mm<B: NemotronBackend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Tensor<B, 2> {
    B::matmul(x.unsqueeze::<3>(), w.unsqueeze::<3>()).squeeze_dim(0)
}
