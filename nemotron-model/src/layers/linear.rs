//! One linear type for every weight form: dense, NVFP4 (packed) and FP8 (W8A8 static).

use crate::util::{float, from_vec};
use burn::backend::Dispatch;
use burn::tensor::{DType, Device, Tensor};
use nemotron_kernels::{ops, Epilogue, Fp8Matrix, Fp8Weights, Nvfp4Matrix, Nvfp4Weights};
use nemotron_loader::LinearWeight;

/// `y = epi(x · Wᵀ)` in whichever form the checkpoint shipped `W`.
#[derive(Debug, Clone)]
pub enum Linear {
    /// `[out, in]` as shipped: rows contiguous, what the decode GEMV streams.
    Dense(Tensor<2>),
    Nvfp4(Nvfp4Weights<Dispatch>),
    Fp8(Fp8Weights<Dispatch>),
}

impl Linear {
    /// Moves a loaded weight onto the device in the same form (dense weights in `dtype`).
    pub fn from_weight(w: LinearWeight, dev: &Device, dtype: DType) -> Self {
        match w {
            LinearWeight::Dense(t) => Linear::Dense(float::<2>(&t, dev, dtype)),
            LinearWeight::Nvfp4(n) => Linear::Nvfp4(Nvfp4Weights::upload(&[nvfp4_matrix(n)], dev)),
            LinearWeight::Fp8(f) => Linear::Fp8(Fp8Weights::upload(&[fp8_matrix(f)], dev)),
        }
    }

    /// For the W8A8-as-weight-only deviation: an FP8 weight dequantized into a dense linear
    /// (activations then go unquantized); other forms as [`Self::from_weight`].
    pub(crate) fn weight_only(w: LinearWeight, dev: &Device, dtype: DType) -> Self {
        let LinearWeight::Fp8(f) = w else {
            return Self::from_weight(w, dev, dtype);
        };
        let k = f.in_features;
        let mut v = vec![0f32; f.out_features * k];
        for (r, row) in v.chunks_mut(k).enumerate() {
            nemotron_loader::formats::fp8_dequant_row(
                &f.weight.bytes[r * k..(r + 1) * k],
                f.weight_scale,
                row,
            );
        }
        Linear::Dense(from_vec(v, [f.out_features, k], dev, dtype))
    }

    pub fn in_features(&self) -> usize {
        match self {
            Linear::Dense(w) => w.dims()[1],
            Linear::Nvfp4(w) => w.shape.in_features,
            Linear::Fp8(w) => w.shape.in_features,
        }
    }

    pub fn out_features(&self) -> usize {
        match self {
            Linear::Dense(w) => w.dims()[0],
            Linear::Nvfp4(w) => w.shape.out_features,
            Linear::Fp8(w) => w.shape.out_features,
        }
    }

    /// `x · Wᵀ` over the last dimension of `x`, its outputs as three dense tensors of `widths`
    /// (Mamba's `in_proj` into z, xBC, dt): one launch for the packed forms on device backends;
    /// a dense weight's output is sliced.
    pub fn forward3<const D: usize>(&self, x: Tensor<D>, widths: [usize; 3]) -> [Tensor<D>; 3] {
        let dims = x.dims();
        let k = dims[D - 1];
        let rows = dims.iter().take(D - 1).product::<usize>();
        let x2: Tensor<2> = x.reshape([rows, k]);
        let parts = match self {
            Linear::Dense(w) => {
                let y = ops::dense_linear(x2, w.clone());
                let (a, b) = (widths[0], widths[0] + widths[1]);
                [0..a, a..b, b..b + widths[2]]
                    .map(|r| ops::contiguous(y.clone().slice([0..rows, r])))
            }
            Linear::Nvfp4(w) => ops::nvfp4_linear3(x2, w, widths),
            Linear::Fp8(w) => ops::fp8_linear3(x2, w, widths),
        };
        let mut i = 0;
        parts.map(|p| {
            let mut out = dims;
            out[D - 1] = widths[i];
            i += 1;
            p.reshape(out)
        })
    }

    /// `epi(x · Wᵀ)` over the last dimension of `x`; the quantized kernels fuse the epilogue.
    pub fn forward<const D: usize>(&self, x: Tensor<D>, epi: Epilogue) -> Tensor<D> {
        let dims = x.dims();
        let k = dims[D - 1];
        let rows = dims.iter().take(D - 1).product::<usize>();
        let x2: Tensor<2> = x.reshape([rows, k]);
        let y = match self {
            Linear::Dense(w) => {
                let y = ops::dense_linear(x2, w.clone());
                match epi {
                    Epilogue::None => y,
                    Epilogue::Relu2 => ops::relu2(y),
                }
            }
            Linear::Nvfp4(w) => ops::nvfp4_linear(x2, w, epi),
            Linear::Fp8(w) => ops::fp8_linear(x2, w, epi),
        };
        let mut out = dims;
        out[D - 1] = self.out_features();
        y.reshape(out)
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
