use burn::tensor::{DType, Device, Tensor, TensorData};
use nemotron_loader::HostTensor;

/// A float host tensor (BF16/F16/F32) as a Burn tensor of rank `D` in `dtype`.
pub fn float<const D: usize>(t: &HostTensor, dev: &Device, dtype: DType) -> Tensor<D> {
    let v = t
        .to_f32_vec()
        .unwrap_or_else(|| panic!("{} is not a float tensor", t.name));
    let shape: [usize; D] = t
        .shape
        .clone()
        .try_into()
        .unwrap_or_else(|_| panic!("{} has rank {}", t.name, t.shape.len()));
    from_vec(v, shape, dev, dtype)
}

/// A host vector as a dense row-major Burn tensor: CUDA may pitch the rows of a fresh 2-D+
/// allocation, and a pitched weight would be copied by every kernel call that reads it (the
/// H200 profile showed each attention projection's 22 MB weight copied per decode step).
pub fn from_vec<const D: usize>(
    v: Vec<f32>,
    shape: [usize; D],
    dev: &Device,
    dtype: DType,
) -> Tensor<D> {
    nemotron_kernels::ops::contiguous(Tensor::from_data(TensorData::new(v, shape), (dev, dtype)))
}

/// `Tensor::stack` along a new leading dim; one tensor is only reshaped (no copy kernel: the
/// batch-1 decode path).
#[allow(
    clippy::expect_used,
    reason = "ts holds exactly one tensor on this branch"
)]
pub fn stack<const D: usize, const D2: usize>(mut ts: Vec<Tensor<D>>) -> Tensor<D2> {
    if ts.len() == 1 {
        ts.pop().expect("one").unsqueeze::<D2>()
    } else {
        Tensor::stack::<D2>(ts, 0)
    }
}

/// A float host matrix `[rows, cols]` as a contiguous `[cols, rows]` Burn tensor in `dtype` (a
/// transposed view would be re-laid out by every matmul on some backends).
pub fn float_transposed(t: &HostTensor, dev: &Device, dtype: DType) -> Tensor<2> {
    let v = t
        .to_f32_vec()
        .unwrap_or_else(|| panic!("{} is not a float tensor", t.name));
    let (r, c) = (t.shape[0], t.shape[1]);
    from_vec(transpose(&v, r, c), [c, r], dev, dtype)
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

/// `x` as f32 (a no-op for f32 tensors).
pub fn to_f32<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    from_f32(x, DType::F32)
}

/// `x` in `dtype` (a no-op when it already is).
pub fn from_f32<const D: usize>(x: Tensor<D>, dtype: DType) -> Tensor<D> {
    if x.dtype() == dtype {
        x
    } else {
        x.cast(dtype)
    }
}
