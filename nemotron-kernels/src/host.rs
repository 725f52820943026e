//! The host reference: [`NemotronOps`] for Burn's NdArray backend (f32), running the plain-Rust math
//! of [`crate::reference`]. Packed weights are read in place (a borrowed view of the words the
//! device holds), activations are copied out and back.

use crate::reference::{self, Fp8View, Nvfp4View};
use crate::{Epilogue, Fp8Weights, Maybe, NemotronOps, Nvfp4Weights, RouteConfig, Rows, ScanDims};
use burn::backend::ndarray::{NdArray, NdArrayTensor};
use burn::backend::ops::FloatTensorOps;
use burn::backend::TensorMetadata;
use burn::tensor::TensorData;
use std::borrow::Cow;

/// A float tensor's values (row-major) and shape.
fn floats(t: NdArrayTensor) -> (Vec<f32>, Vec<usize>) {
    let shape = t.shape().to_vec();
    let v = match t {
        NdArrayTensor::F32(s) => s.view().iter().copied().collect(),
        NdArrayTensor::F64(s) => s.view().iter().map(|&v| v as f32).collect(),
        other => panic!(
            "host reference: expected a float tensor, got {:?}",
            other.dtype()
        ),
    };
    (v, shape)
}

fn from_floats(v: Vec<f32>, shape: Vec<usize>) -> NdArrayTensor {
    NdArrayTensor::from_data(TensorData::new(v, shape))
}

/// An int tensor's values as indices.
fn indices(t: NdArrayTensor) -> Vec<usize> {
    match t {
        NdArrayTensor::I64(s) => s.view().iter().map(|&v| v as usize).collect(),
        NdArrayTensor::I32(s) => s.view().iter().map(|&v| v as usize).collect(),
        other => panic!(
            "host reference: expected int indices, got {:?}",
            other.dtype()
        ),
    }
}

/// Packed words as the shipped bytes, without a copy when the words are contiguous.
fn bytes(t: &NdArrayTensor) -> Cow<'_, [u8]> {
    let NdArrayTensor::I32(s) = t else {
        panic!(
            "host reference: packed weights must be I32 words, got {:?}",
            t.dtype()
        )
    };
    let view = s.view();
    match view.to_slice() {
        Some(w) => Cow::Borrowed(bytemuck::cast_slice(w)),
        None => Cow::Owned(view.iter().flat_map(|w| w.to_le_bytes()).collect()),
    }
}

/// `(slot experts, div, output rows)` of a linear call over `rows` input rows.
fn routing(rows: Rows<NdArray>, x_rows: usize) -> (Vec<usize>, usize) {
    match rows {
        Rows::Each => (vec![0; x_rows], 1),
        Rows::Routed { experts, div } => (indices(experts), div),
    }
}

impl NemotronOps for NdArray {
    fn matmul(a: NdArrayTensor, b: NdArrayTensor) -> NdArrayTensor {
        <NdArray as FloatTensorOps<NdArray>>::float_matmul(a, b)
    }

    fn nvfp4_linear(
        x: NdArrayTensor,
        w: Nvfp4Weights<NdArray>,
        rows: Rows<NdArray>,
        epilogue: Epilogue,
    ) -> NdArrayTensor {
        let (x, shape) = floats(x);
        let (experts, div) = routing(rows, shape[0]);
        let s = w.shape;
        let (packed, scales, globals) = (bytes(&w.packed), bytes(&w.scales), floats(w.globals).0);
        let (pb, sb) = (
            s.out_features * s.in_features / 2,
            s.out_features * s.in_features / 16,
        );
        let views: Vec<Nvfp4View> = (0..s.experts)
            .map(|e| Nvfp4View {
                out_features: s.out_features,
                in_features: s.in_features,
                packed: &packed[e * pb..(e + 1) * pb],
                block_scales: &scales[e * sb..(e + 1) * sb],
                global_scale: globals[e],
            })
            .collect();
        let n = experts.len();
        let y = reference::nvfp4_expert_linear(&x, &experts, div, &views);
        from_floats(reference::epilogue(y, epilogue), vec![n, s.out_features])
    }

    fn fp8_linear(
        x: NdArrayTensor,
        w: Fp8Weights<NdArray>,
        rows: Rows<NdArray>,
        epilogue: Epilogue,
    ) -> NdArrayTensor {
        let (x, shape) = floats(x);
        let (experts, div) = routing(rows, shape[0]);
        let s = w.shape;
        let weight = bytes(&w.weight);
        let (is, ws) = (floats(w.input_scales).0, floats(w.weight_scales).0);
        let per = s.out_features * s.in_features;
        let views: Vec<Fp8View> = (0..s.experts)
            .map(|e| Fp8View {
                out_features: s.out_features,
                in_features: s.in_features,
                weight: &weight[e * per..(e + 1) * per],
                weight_scale: ws[e],
                input_scale: is[e],
            })
            .collect();
        let n = experts.len();
        let y = reference::fp8_expert_linear(&x, &experts, div, &views);
        from_floats(reference::epilogue(y, epilogue), vec![n, s.out_features])
    }

    fn rms_norm(
        x: NdArrayTensor,
        gate: Maybe<NdArray>,
        weight: NdArrayTensor,
        groups: usize,
        eps: f64,
    ) -> NdArrayTensor {
        let (x, shape) = floats(x);
        let gate = gate.into_option().map(|g| floats(g).0);
        let w = floats(weight).0;
        let y = reference::rms_norm(&x, gate.as_deref(), &w, shape[1], groups, eps);
        from_floats(y, shape)
    }

    fn moe_route(
        logits: NdArrayTensor,
        bias: NdArrayTensor,
        config: RouteConfig,
    ) -> (NdArrayTensor, NdArrayTensor) {
        let (l, shape) = floats(logits);
        let (idx, w) = reference::moe_route(&l, &floats(bias).0, &config);
        let shape = vec![shape[0], config.top_k];
        (
            NdArrayTensor::from_data(TensorData::new(idx, shape.clone())),
            from_floats(w, shape),
        )
    }

    fn dt_softplus(dt: NdArrayTensor, bias: NdArrayTensor, min: Option<f32>) -> NdArrayTensor {
        let (dt, shape) = floats(dt);
        from_floats(reference::dt_softplus(&dt, &floats(bias).0, min), shape)
    }

    fn causal_conv1d(
        x: NdArrayTensor,
        weight: NdArrayTensor,
        bias: Maybe<NdArray>,
        state: NdArrayTensor,
        lens: &[usize],
    ) -> (NdArrayTensor, NdArrayTensor) {
        let (x, shape) = floats(x);
        let (b, t, c) = (shape[0], shape[1], shape[2]);
        let (w, wshape) = floats(weight);
        let bias = bias.into_option().map(|b| floats(b).0);
        let (s, s_shape) = floats(state);
        let lens = full_lens(lens, b, t);
        let (y, ns) =
            reference::causal_conv1d(&x, b, t, c, &w, wshape[1], bias.as_deref(), &s, &lens);
        (from_floats(y, shape), from_floats(ns, s_shape))
    }

    fn selective_scan(
        x: NdArrayTensor,
        dt: NdArrayTensor,
        a: NdArrayTensor,
        b: NdArrayTensor,
        c: NdArrayTensor,
        d: NdArrayTensor,
        state: NdArrayTensor,
        lens: &[usize],
    ) -> (NdArrayTensor, NdArrayTensor) {
        let (x, shape) = floats(x);
        let (bs, t, h, p) = (shape[0], shape[1], shape[2], shape[3]);
        let (bm, bshape) = floats(b);
        let (st, s_shape) = floats(state);
        let dims = ScanDims {
            heads: h,
            head_dim: p,
            groups: bshape[2],
            state: bshape[3],
        };
        let lens = full_lens(lens, bs, t);
        let (y, s) = reference::selective_scan(
            &x,
            &floats(dt).0,
            &floats(a).0,
            &bm,
            &floats(c).0,
            &floats(d).0,
            &st,
            bs,
            t,
            dims,
            &lens,
        );
        (from_floats(y, shape), from_floats(s, s_shape))
    }
}

/// The ops' `lens` (empty: every sequence has `t` tokens) as one length per sequence.
pub(crate) fn full_lens(lens: &[usize], batch: usize, t: usize) -> Vec<usize> {
    if lens.is_empty() {
        vec![t; batch]
    } else {
        lens.to_vec()
    }
}
