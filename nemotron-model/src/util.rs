use burn::tensor::{backend::Backend, Tensor, TensorData};
use nemotron_loader::HostTensor;

/// A float host tensor (BF16/F16/F32) as an f32 Burn tensor of rank `D`.
pub fn to_tensor<B: Backend, const D: usize>(t: &HostTensor, dev: &B::Device) -> Tensor<B, D> {
    let v = t
        .to_f32_vec()
        .unwrap_or_else(|| panic!("{} is not a float tensor", t.name));
    let shape: [usize; D] = t
        .shape
        .clone()
        .try_into()
        .unwrap_or_else(|_| panic!("{} has rank {}", t.name, t.shape.len()));
    Tensor::from_data(TensorData::new(v, shape), dev)
}

pub fn from_vec<B: Backend, const D: usize>(
    v: Vec<f32>,
    shape: [usize; D],
    dev: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v, shape), dev)
}

/// `softplus(x) = max(x, 0) + log1p(exp(-|x|))`: exact for very negative `x`, where
/// `log(1 + exp(x))` rounds to 0 in f32 (dt far below 1e-3 must survive).
pub fn softplus<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.clone().clamp_min(0.0) + x.abs().neg().exp().log1p()
}

/// `relu(x)²`.
pub fn relu2<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let r = burn::tensor::activation::relu(x);
    r.clone() * r
}
