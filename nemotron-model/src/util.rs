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

/// `Tensor::stack` along a new leading dim; one tensor is only reshaped (no copy kernel: the
/// batch-1 decode path).
pub fn stack<B: Backend, const D: usize, const D2: usize>(
    mut ts: Vec<Tensor<B, D>>,
) -> Tensor<B, D2> {
    if ts.len() == 1 {
        ts.pop().expect("one").unsqueeze::<D2>()
    } else {
        Tensor::stack::<D2>(ts, 0)
    }
}

/// A float host matrix `[rows, cols]` as a contiguous `[cols, rows]` Burn tensor (a transposed
/// view would be re-laid out by every matmul on some backends).
pub fn to_tensor_transposed<B: Backend>(t: &HostTensor, dev: &B::Device) -> Tensor<B, 2> {
    let v = t
        .to_f32_vec()
        .unwrap_or_else(|| panic!("{} is not a float tensor", t.name));
    let (r, c) = (t.shape[0], t.shape[1]);
    Tensor::from_data(TensorData::new(transpose(&v, r, c), [c, r]), dev)
}

/// Row-major `[r, c]` → `[c, r]`.
pub fn transpose(v: &[f32], r: usize, c: usize) -> Vec<f32> {
    let mut out = vec![0f32; v.len()];
    const BLK: usize = 64;
    for i0 in (0..r).step_by(BLK) {
        for j0 in (0..c).step_by(BLK) {
            for i in i0..(i0 + BLK).min(r) {
                for j in j0..(j0 + BLK).min(c) {
                    out[j * r + i] = v[i * c + j];
                }
            }
        }
    }
    out
}

/// Like [`to_tensor_transposed`], but stored as f32 whatever the backend's float dtype (the
/// router stays f32 on bf16 backends).
pub fn to_f32_tensor_transposed<B: Backend>(t: &HostTensor, dev: &B::Device) -> Tensor<B, 2> {
    let v = t
        .to_f32_vec()
        .unwrap_or_else(|| panic!("{} is not a float tensor", t.name));
    let (r, c) = (t.shape[0], t.shape[1]);
    Tensor::from_data(
        TensorData::new(transpose(&v, r, c), [c, r]),
        (dev, burn::tensor::DType::F32),
    )
}

/// A float host vector as an f32 Burn tensor whatever the backend's float dtype.
pub fn to_f32_tensor<B: Backend>(t: &HostTensor, dev: &B::Device) -> Tensor<B, 1> {
    let v = t
        .to_f32_vec()
        .unwrap_or_else(|| panic!("{} is not a float tensor", t.name));
    let n = v.len();
    Tensor::from_data(TensorData::new(v, [n]), (dev, burn::tensor::DType::F32))
}

/// `x` as f32 (a no-op for f32 tensors).
pub fn to_f32<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    if x.dtype() == burn::tensor::DType::F32 {
        x
    } else {
        x.cast(burn::tensor::DType::F32)
    }
}

/// `x` back to `dtype` (a no-op when it already is).
pub fn from_f32<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    dtype: burn::tensor::DType,
) -> Tensor<B, D> {
    if x.dtype() == dtype {
        x
    } else {
        x.cast(dtype)
    }
}
