//! The host reference: [`NemotronBackend`] for Burn's NdArray backend (f32), running the
//! plain-Rust math of [`crate::reference`].

use crate::{reference, Fp8Matrix, NemotronBackend, Nvfp4Matrix, ScanDims};
use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData};
use std::sync::Arc;

type B = NdArray<f32>;

fn host<const D: usize>(t: Tensor<B, D>) -> (Vec<f32>, [usize; D]) {
    let dims = t.dims();
    (
        t.into_data()
            .into_vec::<f32>()
            .expect("NdArray<f32> holds f32"),
        dims,
    )
}

fn indices(t: Tensor<B, 1, burn::tensor::Int>) -> Vec<usize> {
    t.into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .expect("int indices")
        .into_iter()
        .map(|v| v as usize)
        .collect()
}

fn device<const D: usize>(
    v: Vec<f32>,
    shape: [usize; D],
    dev: &burn::tensor::Device<B>,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v, shape), dev)
}

impl NemotronBackend for B {
    type Nvfp4Weight = Arc<Nvfp4Matrix>;
    type Fp8Weight = Arc<Fp8Matrix>;
    type Nvfp4Experts = Arc<Vec<Nvfp4Matrix>>;
    type Fp8Experts = Arc<Vec<Fp8Matrix>>;

    fn fp8_experts(w: Vec<Fp8Matrix>, _device: &burn::tensor::Device<Self>) -> Self::Fp8Experts {
        Arc::new(w)
    }

    fn fp8_expert_linear(
        x: Tensor<Self, 2>,
        experts: Tensor<Self, 1, burn::tensor::Int>,
        div: usize,
        w: &Self::Fp8Experts,
    ) -> Tensor<Self, 2> {
        let dev = x.device();
        let (x, _) = host(x);
        let e = indices(experts);
        let out = w[0].out_features;
        let n = e.len();
        device(reference::fp8_expert_linear(&x, &e, div, w), [n, out], &dev)
    }

    fn nvfp4_experts(
        w: Vec<Nvfp4Matrix>,
        _device: &burn::tensor::Device<Self>,
    ) -> Self::Nvfp4Experts {
        Arc::new(w)
    }

    fn nvfp4_expert_linear(
        x: Tensor<Self, 2>,
        experts: Tensor<Self, 1, burn::tensor::Int>,
        div: usize,
        w: &Self::Nvfp4Experts,
    ) -> Tensor<Self, 2> {
        let dev = x.device();
        let (x, _) = host(x);
        let e = indices(experts);
        let out = w[0].out_features;
        let n = e.len();
        device(
            reference::nvfp4_expert_linear(&x, &e, div, w),
            [n, out],
            &dev,
        )
    }

    fn nvfp4_weight(w: Nvfp4Matrix, _device: &burn::tensor::Device<Self>) -> Self::Nvfp4Weight {
        Arc::new(w)
    }

    fn fp8_weight(w: Fp8Matrix, _device: &burn::tensor::Device<Self>) -> Self::Fp8Weight {
        Arc::new(w)
    }

    fn matmul(a: Tensor<Self, 3>, b: Tensor<Self, 3>) -> Tensor<Self, 3> {
        a.matmul(b)
    }

    fn nvfp4_linear(x: Tensor<Self, 2>, w: &Self::Nvfp4Weight) -> Tensor<Self, 2> {
        let dev = x.device();
        let (x, [m, _]) = host(x);
        device(reference::nvfp4_linear(&x, m, w), [m, w.out_features], &dev)
    }

    fn fp8_linear(x: Tensor<Self, 2>, w: &Self::Fp8Weight) -> Tensor<Self, 2> {
        let dev = x.device();
        let (x, [m, _]) = host(x);
        device(reference::fp8_linear(&x, m, w), [m, w.out_features], &dev)
    }

    fn causal_conv1d(
        x: Tensor<Self, 3>,
        weight: Tensor<Self, 2>,
        bias: Option<Tensor<Self, 1>>,
        state: Tensor<Self, 3>,
        lens: &[usize],
    ) -> (Tensor<Self, 3>, Tensor<Self, 3>) {
        let dev = x.device();
        let (x, [b, t, c]) = host(x);
        let (w, [_, k]) = host(weight);
        let bias = bias.map(|b| host(b).0);
        let (s, s_shape) = host(state);
        let (y, ns) = reference::causal_conv1d(&x, b, t, c, &w, k, bias.as_deref(), &s, lens);
        (device(y, [b, t, c], &dev), device(ns, s_shape, &dev))
    }

    fn selective_scan(
        x: Tensor<Self, 4>,
        dt: Tensor<Self, 3>,
        a: Tensor<Self, 1>,
        b: Tensor<Self, 4>,
        c: Tensor<Self, 4>,
        d: Tensor<Self, 1>,
        state: Tensor<Self, 4>,
        lens: &[usize],
    ) -> (Tensor<Self, 4>, Tensor<Self, 4>) {
        let dev = x.device();
        let (x, [bs, t, h, p]) = host(x);
        let (bm, [_, _, g, n]) = host(b);
        let dims = ScanDims {
            heads: h,
            head_dim: p,
            groups: g,
            state: n,
        };
        let (y, s) = reference::selective_scan(
            &x,
            &host(dt).0,
            &host(a).0,
            &bm,
            &host(c).0,
            &host(d).0,
            &host(state).0,
            bs,
            t,
            dims,
            lens,
        );
        (
            device(y, [bs, t, h, p], &dev),
            device(s, [bs, h, p, n], &dev),
        )
    }
}
