//! The host reference: [`NemotronOps`] for Burn's pure-Rust CPU backends — Flex (the default host
//! arm: as exact as NdArray and faster, `docs/PERF.md` §6) and NdArray — running the plain-Rust
//! math of [`crate::reference`]. Packed weights are read in place
//! where the backend holds them contiguous (a borrowed view of the words), activations are copied
//! out and back.

use crate::reference::{self, Fp8View, Nvfp4View};
use crate::{Epilogue, Fp8Weights, Maybe, NemotronOps, Nvfp4Weights, RouteConfig, Rows, ScanDims};
use burn::backend::ndarray::{NdArray, NdArrayTensor};
use burn::backend::ops::FloatTensorOps;
use burn::backend::{Backend, TensorMetadata};
use burn::tensor::TensorData;
use std::borrow::Cow;

/// What the host reference needs from a CPU backend's tensor primitive.
pub trait HostPrimitive: Sized {
    /// Float values (row-major) and shape.
    fn floats(self) -> (Vec<f32>, Vec<usize>);
    /// Int values.
    fn ints(self) -> Vec<i64>;
    /// Int values as indices.
    fn indices(self) -> Vec<usize> {
        self.ints().into_iter().map(|v| v as usize).collect()
    }
    /// Packed I32 words as the shipped bytes, borrowed when contiguous.
    fn bytes(&self) -> Cow<'_, [u8]>;
    /// The shape.
    fn dims(&self) -> Vec<usize>;
    fn from_data(data: TensorData) -> Self;
}

impl HostPrimitive for NdArrayTensor {
    fn floats(self) -> (Vec<f32>, Vec<usize>) {
        let shape = self.shape().to_vec();
        let v = match self {
            NdArrayTensor::F32(s) => s.view().iter().copied().collect(),
            NdArrayTensor::F64(s) => s.view().iter().map(|&v| v as f32).collect(),
            other => panic!(
                "host reference: expected a float tensor, got {:?}",
                other.dtype()
            ),
        };
        (v, shape)
    }

    fn ints(self) -> Vec<i64> {
        match self {
            NdArrayTensor::I64(s) => s.view().iter().copied().collect(),
            NdArrayTensor::I32(s) => s.view().iter().map(|&v| v as i64).collect(),
            other => panic!(
                "host reference: expected an int tensor, got {:?}",
                other.dtype()
            ),
        }
    }

    fn bytes(&self) -> Cow<'_, [u8]> {
        let NdArrayTensor::I32(s) = self else {
            panic!(
                "host reference: packed weights must be I32 words, got {:?}",
                self.dtype()
            )
        };
        let view = s.view();
        match view.to_slice() {
            Some(w) => Cow::Borrowed(bytemuck::cast_slice(w)),
            None => Cow::Owned(view.iter().flat_map(|w| w.to_le_bytes()).collect()),
        }
    }

    fn dims(&self) -> Vec<usize> {
        self.shape().to_vec()
    }

    fn from_data(data: TensorData) -> Self {
        NdArrayTensor::from_data(data)
    }
}

impl HostPrimitive for burn::backend::flex::FlexTensor {
    fn floats(self) -> (Vec<f32>, Vec<usize>) {
        let shape = self.shape().to_vec();
        let v = self
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .unwrap_or_else(|e| panic!("host reference: float tensor: {e:?}"));
        (v, shape)
    }

    fn ints(self) -> Vec<i64> {
        self.into_data()
            .convert::<i64>()
            .into_vec::<i64>()
            .unwrap_or_else(|e| panic!("host reference: int tensor: {e:?}"))
    }

    fn bytes(&self) -> Cow<'_, [u8]> {
        assert_eq!(
            self.dtype(),
            burn::tensor::DType::I32,
            "host reference: packed weights must be I32 words"
        );
        match self.as_slice::<i32>() {
            Some(w) => Cow::Borrowed(bytemuck::cast_slice(w)),
            None => Cow::Owned(
                self.to_contiguous()
                    .as_slice::<i32>()
                    .unwrap_or_default()
                    .iter()
                    .flat_map(|w| w.to_le_bytes())
                    .collect(),
            ),
        }
    }

    fn dims(&self) -> Vec<usize> {
        self.shape().to_vec()
    }

    fn from_data(data: TensorData) -> Self {
        burn::backend::flex::FlexTensor::from_data(data)
    }
}

fn from_floats<T: HostPrimitive>(v: Vec<f32>, shape: Vec<usize>) -> T {
    T::from_data(TensorData::new(v, shape))
}

/// `(slot experts, div)` of a linear call over `x_rows` input rows.
fn routing<B: Backend>(rows: Rows<B>, x_rows: usize) -> (Vec<usize>, usize)
where
    B::IntTensorPrimitive: HostPrimitive,
{
    match rows {
        Rows::Each => (vec![0; x_rows], 1),
        Rows::Routed { experts, div } => (experts.indices(), div),
    }
}

fn nvfp4_linear<B: Backend>(
    x: B::FloatTensorPrimitive,
    w: Nvfp4Weights<B>,
    rows: Rows<B>,
    epilogue: Epilogue,
) -> B::FloatTensorPrimitive
where
    B::FloatTensorPrimitive: HostPrimitive,
    B::IntTensorPrimitive: HostPrimitive,
{
    let (x, shape) = x.floats();
    let (experts, div) = routing(rows, shape[0]);
    let s = w.shape;
    let (packed, scales, globals) = (w.packed.bytes(), w.scales.bytes(), w.globals.floats().0);
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

fn fp8_linear<B: Backend>(
    x: B::FloatTensorPrimitive,
    w: Fp8Weights<B>,
    rows: Rows<B>,
    epilogue: Epilogue,
) -> B::FloatTensorPrimitive
where
    B::FloatTensorPrimitive: HostPrimitive,
    B::IntTensorPrimitive: HostPrimitive,
{
    let (x, shape) = x.floats();
    let (experts, div) = routing(rows, shape[0]);
    let s = w.shape;
    let weight = w.weight.bytes();
    let (is, ws) = (w.input_scales.floats().0, w.weight_scales.floats().0);
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

/// A `[R, N]` host tensor's columns as three `[R, widths[i]]` tensors.
fn split3<F: HostPrimitive>(y: F, widths: [usize; 3]) -> (F, F, F) {
    let (y, shape) = y.floats();
    let n: usize = widths.iter().sum();
    // The leading dimensions are kept; the last is split.
    let lead = &shape[..shape.len() - 1];
    let r: usize = lead.iter().product();
    let mut parts = widths.map(|w| Vec::with_capacity(r * w));
    for row in y.chunks(n) {
        let mut c = 0;
        for (p, &w) in parts.iter_mut().zip(&widths) {
            p.extend_from_slice(&row[c..c + w]);
            c += w;
        }
    }
    let shape_of = |w: usize| [lead, &[w]].concat();
    let [a, b, c] = parts;
    (
        from_floats(a, shape_of(widths[0])),
        from_floats(b, shape_of(widths[1])),
        from_floats(c, shape_of(widths[2])),
    )
}

fn rms_norm<F: HostPrimitive>(x: F, gate: Option<F>, weight: F, groups: usize, eps: f64) -> F {
    let (x, shape) = x.floats();
    let gate = gate.map(|g| g.floats().0);
    let w = weight.floats().0;
    from_floats(
        reference::rms_norm(&x, gate.as_deref(), &w, shape[1], groups, eps),
        shape,
    )
}

fn add_rms_norm<F: HostPrimitive>(x: F, y: F, weight: F, eps: f64) -> (F, F) {
    let (x, shape) = x.floats();
    let y = y.floats().0;
    let s: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    let h = reference::rms_norm(&s, None, &weight.floats().0, shape[1], 1, eps);
    (from_floats(s, shape.clone()), from_floats(h, shape))
}

fn moe_combine<F: HostPrimitive>(y: F, w: F, shared: Option<F>) -> F {
    let (y, yshape) = y.floats();
    let (w, wshape) = w.floats();
    let shared = shared.map(|s| s.floats().0);
    let (k, h) = (wshape[1], yshape[1]);
    from_floats(
        reference::moe_combine(&y, &w, shared.as_deref(), k, h),
        vec![wshape[0], h],
    )
}

fn moe_route<F: HostPrimitive, I: HostPrimitive>(logits: F, bias: F, c: RouteConfig) -> (I, F) {
    let (l, shape) = logits.floats();
    let (idx, w) = reference::moe_route(&l, &bias.floats().0, &c);
    let shape = vec![shape[0], c.top_k + c.fixed];
    (
        I::from_data(TensorData::new(idx, shape.clone())),
        from_floats(w, shape),
    )
}

fn dt_softplus<F: HostPrimitive>(dt: F, bias: F, min: Option<f32>) -> F {
    let (dt, shape) = dt.floats();
    from_floats(reference::dt_softplus(&dt, &bias.floats().0, min), shape)
}

fn causal_conv1d<F: HostPrimitive>(
    x: F,
    weight: F,
    bias: Option<F>,
    state: F,
    lens: &[usize],
) -> (F, F) {
    let (x, shape) = x.floats();
    let (b, t, c) = (shape[0], shape[1], shape[2]);
    let (w, wshape) = weight.floats();
    let bias = bias.map(|b| b.floats().0);
    let (s, s_shape) = state.floats();
    let lens = full_lens(lens, b, t);
    let (y, ns) = reference::causal_conv1d(&x, b, t, c, &w, wshape[1], bias.as_deref(), &s, &lens);
    (from_floats(y, shape), from_floats(ns, s_shape))
}

#[allow(clippy::too_many_arguments)]
fn selective_scan<F: HostPrimitive>(
    x: F,
    dt: F,
    a: F,
    b: F,
    c: F,
    d: F,
    state: Option<F>,
    lens: &[usize],
) -> (F, F) {
    let (x, shape) = x.floats();
    let (bs, t, h, p) = (shape[0], shape[1], shape[2], shape[3]);
    let (bm, bshape) = b.floats();
    let (st, s_shape) = match state {
        Some(s) => s.floats(),
        None => {
            let s_shape = vec![bs, h, p, bshape[3]];
            (vec![0f32; s_shape.iter().product()], s_shape)
        }
    };
    let dims = ScanDims {
        heads: h,
        head_dim: p,
        groups: bshape[2],
        state: bshape[3],
    };
    let lens = full_lens(lens, bs, t);
    let (y, s) = reference::selective_scan(
        &x,
        &dt.floats().0,
        &a.floats().0,
        &bm,
        &c.floats().0,
        &d.floats().0,
        &st,
        bs,
        t,
        dims,
        &lens,
    );
    (from_floats(y, shape), from_floats(s, s_shape))
}

fn conv_step<F: HostPrimitive, I: HostPrimitive>(
    x: F,
    weight: F,
    bias: Option<F>,
    pool: F,
    lens: I,
    slots: I,
) -> (F, F) {
    let (x, shape) = x.floats();
    let (w, wshape) = weight.floats();
    let bias = bias.map(|b| b.floats().0);
    let (mut p, pshape) = pool.floats();
    let y = reference::conv_step(
        &x,
        &w,
        wshape[1],
        bias.as_deref(),
        &mut p,
        &lens.ints(),
        &slots.ints(),
    );
    (from_floats(y, shape), from_floats(p, pshape))
}

#[allow(clippy::too_many_arguments)]
#[allow(clippy::too_many_arguments)]
fn ssm_step<F: HostPrimitive, I: HostPrimitive>(
    xbc: F,
    dt: F,
    dt_bias: F,
    a: F,
    d: F,
    pool: F,
    slots: I,
    dims: ScanDims,
    dt_min: Option<f32>,
) -> (F, F) {
    let (xbc, shape) = xbc.floats();
    let (mut p, pshape) = pool.floats();
    let (rows, width) = (shape[0], shape[1]);
    let (hp, gn) = (dims.heads * dims.head_dim, dims.groups * dims.state);
    let part = |from: usize, len: usize| -> Vec<f32> {
        xbc.chunks(width)
            .flat_map(|r| r[from..from + len].iter().copied())
            .collect()
    };
    let (x, bm, cm) = (part(0, hp), part(hp, gn), part(hp + gn, gn));
    let dt = reference::dt_softplus(&dt.floats().0, &dt_bias.floats().0, dt_min);
    let y = reference::ssm_step(
        &x,
        &dt,
        &a.floats().0,
        &bm,
        &cm,
        &d.floats().0,
        &mut p,
        &slots.ints(),
        dims,
    );
    (
        from_floats(y, vec![rows, dims.heads, dims.head_dim]),
        from_floats(p, pshape),
    )
}

/// [`ssm_step`] over a bf16 pool: its words decoded to f32, the f32 step, the new state rounded
/// back (rows no slot names round-trip unchanged).
#[allow(clippy::too_many_arguments)]
fn ssm_step_bf16<F: HostPrimitive, I: HostPrimitive>(
    xbc: F,
    dt: F,
    dt_bias: F,
    a: F,
    d: F,
    pool: I,
    slots: I,
    dims: ScanDims,
    dt_min: Option<f32>,
) -> (F, I) {
    let ws = pool.dims();
    let values = reference::bf16_values(&pool.bytes());
    let shape = vec![ws[0], ws[1], ws[2], 2 * ws[3]];
    let (y, p) = ssm_step(
        xbc,
        dt,
        dt_bias,
        a,
        d,
        from_floats::<F>(values, shape),
        slots,
        dims,
        dt_min,
    );
    (y, words(&reference::bf16_bytes(&p.floats().0), ws))
}

#[allow(clippy::too_many_arguments)]
/// The fused-row form: each row's `q | k | v` split on the host, then [`attention_step`]'s
/// reference.
#[allow(clippy::too_many_arguments)]
fn attention_step_qkv<F: HostPrimitive, I: HostPrimitive>(
    qkv: F,
    heads: usize,
    kpool: F,
    vpool: F,
    lens: I,
    slots: I,
    scale: f32,
) -> (F, F, F) {
    let (x, shape) = qkv.floats();
    let (mut kp, pshape) = kpool.floats();
    let mut vp = vpool.floats().0;
    let (kvh, hd) = (pshape[1], pshape[3]);
    let (q, k, v) = split_qkv(&x, shape[1], heads * hd, kvh * hd);
    let o = reference::attention_step(
        &q,
        &k,
        &v,
        &mut kp,
        &mut vp,
        &lens.ints(),
        &slots.ints(),
        (heads, kvh, hd, pshape[2]),
        scale,
    );
    (
        from_floats(o, vec![shape[0], heads, hd]),
        from_floats(kp, pshape.clone()),
        from_floats(vp, pshape),
    )
}

fn attention_prefill<F: HostPrimitive, I: HostPrimitive>(
    q: F,
    kpool: F,
    vpool: F,
    seqs: I,
    heads: usize,
    scale: f32,
) -> F {
    let (q, qshape) = q.floats();
    let (kp, pshape) = kpool.floats();
    let (b, t, w) = (qshape[0], qshape[1], qshape[2]);
    let (kvh, cap, hd) = (pshape[1], pshape[2], pshape[3]);
    let o = reference::attention_prefill(
        &q,
        (b, t, w),
        &kp,
        &vpool.floats().0,
        &seqs.ints(),
        (heads, kvh, hd, cap),
        scale,
    );
    F::from_data(TensorData::new(o, [b, t, heads * hd]))
}

fn attention_step<F: HostPrimitive, I: HostPrimitive>(
    q: F,
    k: F,
    v: F,
    kpool: F,
    vpool: F,
    lens: I,
    slots: I,
    scale: f32,
) -> (F, F, F) {
    let (q, qshape) = q.floats();
    let (k, kshape) = k.floats();
    let (mut kp, pshape) = kpool.floats();
    let mut vp = vpool.floats().0;
    let dims = (qshape[1], kshape[1], qshape[2], pshape[2]);
    let o = reference::attention_step(
        &q,
        &k,
        &v.floats().0,
        &mut kp,
        &mut vp,
        &lens.ints(),
        &slots.ints(),
        dims,
        scale,
    );
    (
        from_floats(o, qshape),
        from_floats(kp, pshape.clone()),
        from_floats(vp, pshape),
    )
}

/// Rows of `width` values `q | k | v` (`qw`, `kw`, `kw` wide) as the three parts, each row-major.
fn split_qkv(x: &[f32], width: usize, qw: usize, kw: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let part = |from: usize, len: usize| -> Vec<f32> {
        x.chunks(width)
            .flat_map(|r| r[from..from + len].iter().copied())
            .collect()
    };
    (part(0, qw), part(qw, kw), part(qw + kw, kw))
}

/// I32 words of `shape` from codes in element order.
fn words<I: HostPrimitive>(codes: &[u8], shape: Vec<usize>) -> I {
    I::from_data(TensorData::new(crate::bytes_to_words(codes), shape))
}

/// The FP8-cache form of [`attention_step_qkv`]: the pools' codes decoded and the step's
/// codes written back by [`reference::attention_step_kv8`].
#[allow(clippy::too_many_arguments)]
fn attention_step_qkv8<F: HostPrimitive, I: HostPrimitive>(
    qkv: F,
    heads: usize,
    kpool: I,
    vpool: I,
    lens: I,
    slots: I,
    scale: f32,
    kv_scales: (f32, f32),
) -> (F, I, I) {
    let (x, shape) = qkv.floats();
    let pshape = kpool.dims();
    let (kvh, cap, hd) = (pshape[1], pshape[2], 4 * pshape[3]);
    let (mut kc, mut vc) = (kpool.bytes().into_owned(), vpool.bytes().into_owned());
    let (q, k, v) = split_qkv(&x, shape[1], heads * hd, kvh * hd);
    let o = reference::attention_step_kv8(
        &q,
        &k,
        &v,
        &mut kc,
        &mut vc,
        &lens.ints(),
        &slots.ints(),
        (heads, kvh, hd, cap),
        scale,
        kv_scales,
    );
    (
        from_floats(o, vec![shape[0], heads, hd]),
        words(&kc, pshape.clone()),
        words(&vc, pshape),
    )
}

fn write_slots8<F: HostPrimitive, I: HostPrimitive>(pool: I, src: F, slots: I, scale: f32) -> I {
    write_slots_packed(pool, src, slots, 4, |row| {
        row.iter().map(|&x| reference::kv8_code(x, scale)).collect()
    })
}

fn write_slots_bf16<F: HostPrimitive, I: HostPrimitive>(pool: I, src: F, slots: I) -> I {
    write_slots_packed(pool, src, slots, 2, reference::bf16_bytes)
}

/// `pool[slots[b], a, l, :]` = the bytes `encode` gives for `src[b, a, l, :]`, `per` values to
/// each I32 word of `pool` `[S, A, M, W]` (rows with a negative slot skipped).
fn write_slots_packed<F: HostPrimitive, I: HostPrimitive>(
    pool: I,
    src: F,
    slots: I,
    per: usize,
    encode: impl Fn(&[f32]) -> Vec<u8>,
) -> I {
    let ps = pool.dims();
    let mut codes = pool.bytes().into_owned();
    let (sv, ss) = src.floats();
    let (a, m, c, l) = (ps[1], ps[2], per * ps[3], ss[2]);
    // Bytes of one row of `c` values.
    let row = 4 * ps[3];
    for (b, slot) in slots.ints().into_iter().enumerate() {
        if slot < 0 {
            continue;
        }
        for ai in 0..a {
            for li in 0..l {
                let dst = ((slot as usize * a + ai) * m + li) * row;
                let from = &sv[((b * a + ai) * l + li) * c..][..c];
                codes[dst..dst + row].copy_from_slice(&encode(from));
            }
        }
    }
    words(&codes, ps)
}

fn argmax_rows<F: HostPrimitive, I: HostPrimitive>(x: F) -> I {
    let (v, shape) = x.floats();
    let cols = shape.last().copied().unwrap_or(1).max(1);
    let ids = reference::argmax_rows(&v, cols);
    let n = ids.len();
    I::from_data(TensorData::new(ids, [n]))
}

fn logprob_rows<F: HostPrimitive, I: HostPrimitive>(x: F, tokens: I, n: usize) -> (F, I, F) {
    let (v, shape) = x.floats();
    let cols = shape.last().copied().unwrap_or(1).max(1);
    let rows = v.len() / cols;
    let (stats, ids, vals) = reference::logprob_rows(&v, cols, &tokens.ints(), n);
    let w = n.max(1);
    (
        F::from_data(TensorData::new(stats, [rows, 2])),
        I::from_data(TensorData::new(ids, [rows, w])),
        F::from_data(TensorData::new(vals, [rows, w])),
    )
}

fn advance_lens<I: HostPrimitive>(lens: I, slots: I) -> I {
    let mut l = lens.ints();
    for s in slots.ints() {
        if s >= 0 {
            l[s as usize] += 1;
        }
    }
    let n = l.len();
    let l: Vec<i32> = l.into_iter().map(|v| v as i32).collect();
    I::from_data(TensorData::new(l, [n]))
}

fn moe_group<I: HostPrimitive>(experts: I, n_experts: usize) -> (I, I) {
    let ids = experts.ints();
    let mut counts = vec![0i32; 2 * n_experts];
    let mut groups = vec![vec![]; n_experts];
    for (s, &e) in ids.iter().enumerate() {
        if (0..n_experts as i64).contains(&e) {
            counts[e as usize] += 1;
            groups[e as usize].push(s as i32);
        }
    }
    let mut members: Vec<i32> = groups.concat();
    let mut run = 0;
    for e in 0..n_experts {
        counts[n_experts + e] = run;
        run += counts[e];
    }
    let n = ids.len().max(1);
    members.resize(n, 0);
    (
        I::from_data(TensorData::new(counts, [2 * n_experts])),
        I::from_data(TensorData::new(members, [n])),
    )
}

fn write_slot<F: HostPrimitive>(pool: F, src: F, slot: usize) -> F {
    let (mut p, ps) = pool.floats();
    let (sv, ss) = src.floats();
    let (a, m, c, l) = (ps[1], ps[2], ps[3], ss[1]);
    for ai in 0..a {
        for li in 0..l {
            let dst = ((slot * a + ai) * m + li) * c;
            p[dst..dst + c].copy_from_slice(&sv[(ai * l + li) * c..][..c]);
        }
    }
    from_floats(p, ps)
}

fn write_slots<F: HostPrimitive, I: HostPrimitive>(
    pool: F,
    src: F,
    slots: I,
    rot: I,
    width: usize,
) -> F {
    let (mut p, ps) = pool.floats();
    let (sv, ss) = src.floats();
    let (a, m, c, l) = (ps[1], ps[2], ps[3], ss[2]);
    for (b, (slot, r)) in slots.ints().into_iter().zip(rot.ints()).enumerate() {
        if slot < 0 {
            continue;
        }
        for ai in 0..a {
            for li in 0..width {
                let dst = ((slot as usize * a + ai) * m + (li + r as usize) % m) * c;
                if li < l {
                    p[dst..dst + c].copy_from_slice(&sv[((b * a + ai) * l + li) * c..][..c]);
                } else {
                    p[dst..dst + c].fill(0.0);
                }
            }
        }
    }
    from_floats(p, ps)
}

/// [`NemotronOps`] for a CPU backend through the generic host functions above; the dense matmul
/// is the backend's own f32 matmul.
macro_rules! host_backend {
    ($b:ty) => {
        impl NemotronOps for $b {
            fn matmul(
                a: burn::backend::tensor::FloatTensor<Self>,
                b: burn::backend::tensor::FloatTensor<Self>,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                <$b as FloatTensorOps<$b>>::float_matmul(a, b)
            }
            fn dense_linear(
                x: burn::backend::tensor::FloatTensor<Self>,
                w: burn::backend::tensor::FloatTensor<Self>,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                // Host tensors are f32: `x · wᵀ` as a plain matmul.
                let wt = <$b as FloatTensorOps<$b>>::float_transpose(w);
                <$b as FloatTensorOps<$b>>::float_matmul(x, wt)
            }
            fn dense_linear_t(
                x: burn::backend::tensor::FloatTensor<Self>,
                w: burn::backend::tensor::FloatTensor<Self>,
                _wt: burn::backend::tensor::FloatTensor<Self>,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                // The host's product transposes `w` as a view: `wt` would change nothing.
                Self::dense_linear(x, w)
            }
            fn nvfp4_linear(
                x: burn::backend::tensor::FloatTensor<Self>,
                w: Nvfp4Weights<Self>,
                rows: Rows<Self>,
                epilogue: Epilogue,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                nvfp4_linear::<$b>(x, w, rows, epilogue)
            }
            fn fp8_linear(
                x: burn::backend::tensor::FloatTensor<Self>,
                w: Fp8Weights<Self>,
                rows: Rows<Self>,
                epilogue: Epilogue,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                fp8_linear::<$b>(x, w, rows, epilogue)
            }
            fn nvfp4_linear3(
                x: burn::backend::tensor::FloatTensor<Self>,
                w: Nvfp4Weights<Self>,
                widths: [usize; 3],
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                split3(nvfp4_linear::<$b>(x, w, Rows::Each, Epilogue::None), widths)
            }
            fn fp8_gated_linear(
                x: burn::backend::tensor::FloatTensor<Self>,
                gate: burn::backend::tensor::FloatTensor<Self>,
                norm_weight: burn::backend::tensor::FloatTensor<Self>,
                groups: usize,
                eps: f64,
                w: Fp8Weights<Self>,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                let u = rms_norm(x, Some(gate), norm_weight, groups, eps);
                fp8_linear::<$b>(u, w, Rows::Each, Epilogue::None)
            }
            fn fp8_linear3(
                x: burn::backend::tensor::FloatTensor<Self>,
                w: Fp8Weights<Self>,
                widths: [usize; 3],
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                split3(fp8_linear::<$b>(x, w, Rows::Each, Epilogue::None), widths)
            }
            fn add_rms_norm(
                x: burn::backend::tensor::FloatTensor<Self>,
                y: burn::backend::tensor::FloatTensor<Self>,
                weight: burn::backend::tensor::FloatTensor<Self>,
                eps: f64,
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                add_rms_norm(x, y, weight, eps)
            }
            fn add_moe_rms_norm(
                x: burn::backend::tensor::FloatTensor<Self>,
                routed: burn::backend::tensor::FloatTensor<Self>,
                w: burn::backend::tensor::FloatTensor<Self>,
                shared: Maybe<Self>,
                weight: burn::backend::tensor::FloatTensor<Self>,
                eps: f64,
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                add_rms_norm(x, moe_combine(routed, w, shared.into_option()), weight, eps)
            }
            fn rms_norm(
                x: burn::backend::tensor::FloatTensor<Self>,
                gate: Maybe<Self>,
                weight: burn::backend::tensor::FloatTensor<Self>,
                groups: usize,
                eps: f64,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                rms_norm(x, gate.into_option(), weight, groups, eps)
            }
            fn moe_combine(
                y: burn::backend::tensor::FloatTensor<Self>,
                w: burn::backend::tensor::FloatTensor<Self>,
                shared: Maybe<Self>,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                moe_combine(y, w, shared.into_option())
            }
            fn moe_route(
                logits: burn::backend::tensor::FloatTensor<Self>,
                bias: burn::backend::tensor::FloatTensor<Self>,
                config: RouteConfig,
            ) -> (
                burn::backend::tensor::IntTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                moe_route(logits, bias, config)
            }
            fn dt_softplus(
                dt: burn::backend::tensor::FloatTensor<Self>,
                bias: burn::backend::tensor::FloatTensor<Self>,
                min: Option<f32>,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                dt_softplus(dt, bias, min)
            }
            fn causal_conv1d(
                x: burn::backend::tensor::FloatTensor<Self>,
                weight: burn::backend::tensor::FloatTensor<Self>,
                bias: Maybe<Self>,
                state: burn::backend::tensor::FloatTensor<Self>,
                lens: &[usize],
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                causal_conv1d(x, weight, bias.into_option(), state, lens)
            }
            fn causal_conv1d3(
                x: burn::backend::tensor::FloatTensor<Self>,
                weight: burn::backend::tensor::FloatTensor<Self>,
                bias: Maybe<Self>,
                state: burn::backend::tensor::FloatTensor<Self>,
                lens: &[usize],
                widths: [usize; 3],
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                let (y, s) = causal_conv1d(x, weight, bias.into_option(), state, lens);
                let (a, b, c) = split3(y, widths);
                (a, b, c, s)
            }
            fn selective_scan(
                x: burn::backend::tensor::FloatTensor<Self>,
                dt: burn::backend::tensor::FloatTensor<Self>,
                a: burn::backend::tensor::FloatTensor<Self>,
                b: burn::backend::tensor::FloatTensor<Self>,
                c: burn::backend::tensor::FloatTensor<Self>,
                d: burn::backend::tensor::FloatTensor<Self>,
                state: Maybe<Self>,
                lens: &[usize],
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                selective_scan(x, dt, a, b, c, d, state.into_option(), lens)
            }
            fn conv_step(
                x: burn::backend::tensor::FloatTensor<Self>,
                weight: burn::backend::tensor::FloatTensor<Self>,
                bias: Maybe<Self>,
                pool: burn::backend::tensor::FloatTensor<Self>,
                lens: burn::backend::tensor::IntTensor<Self>,
                slots: burn::backend::tensor::IntTensor<Self>,
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                conv_step(x, weight, bias.into_option(), pool, lens, slots)
            }
            fn conv_ssm_step(
                xbc: burn::backend::tensor::FloatTensor<Self>,
                dt: burn::backend::tensor::FloatTensor<Self>,
                conv_weight: burn::backend::tensor::FloatTensor<Self>,
                conv_bias: Maybe<Self>,
                dt_bias: burn::backend::tensor::FloatTensor<Self>,
                a: burn::backend::tensor::FloatTensor<Self>,
                d: burn::backend::tensor::FloatTensor<Self>,
                conv_pool: burn::backend::tensor::FloatTensor<Self>,
                ssm_pool: burn::backend::tensor::FloatTensor<Self>,
                lens: burn::backend::tensor::IntTensor<Self>,
                slots: burn::backend::tensor::IntTensor<Self>,
                dims: ScanDims,
                dt_min: Option<f32>,
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                // The two ops, so the conv output is rounded to the activation dtype between
                // them as the separate ops store it.
                let (xbc, cp) = conv_step(
                    xbc,
                    conv_weight,
                    conv_bias.into_option(),
                    conv_pool,
                    lens,
                    slots.clone(),
                );
                let (y, sp) = ssm_step(xbc, dt, dt_bias, a, d, ssm_pool, slots, dims, dt_min);
                (y, cp, sp)
            }
            fn conv_ssm_step_bf16(
                xbc: burn::backend::tensor::FloatTensor<Self>,
                dt: burn::backend::tensor::FloatTensor<Self>,
                conv_weight: burn::backend::tensor::FloatTensor<Self>,
                conv_bias: Maybe<Self>,
                dt_bias: burn::backend::tensor::FloatTensor<Self>,
                a: burn::backend::tensor::FloatTensor<Self>,
                d: burn::backend::tensor::FloatTensor<Self>,
                conv_pool: burn::backend::tensor::FloatTensor<Self>,
                ssm_pool: burn::backend::tensor::IntTensor<Self>,
                lens: burn::backend::tensor::IntTensor<Self>,
                slots: burn::backend::tensor::IntTensor<Self>,
                dims: ScanDims,
                dt_min: Option<f32>,
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::IntTensor<Self>,
            ) {
                let (xbc, cp) = conv_step(
                    xbc,
                    conv_weight,
                    conv_bias.into_option(),
                    conv_pool,
                    lens,
                    slots.clone(),
                );
                let (y, sp) = ssm_step_bf16(xbc, dt, dt_bias, a, d, ssm_pool, slots, dims, dt_min);
                (y, cp, sp)
            }
            fn ssm_step(
                xbc: burn::backend::tensor::FloatTensor<Self>,
                dt: burn::backend::tensor::FloatTensor<Self>,
                dt_bias: burn::backend::tensor::FloatTensor<Self>,
                a: burn::backend::tensor::FloatTensor<Self>,
                d: burn::backend::tensor::FloatTensor<Self>,
                pool: burn::backend::tensor::FloatTensor<Self>,
                slots: burn::backend::tensor::IntTensor<Self>,
                dims: ScanDims,
                dt_min: Option<f32>,
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                ssm_step(xbc, dt, dt_bias, a, d, pool, slots, dims, dt_min)
            }
            fn attention_step(
                q: burn::backend::tensor::FloatTensor<Self>,
                k: burn::backend::tensor::FloatTensor<Self>,
                v: burn::backend::tensor::FloatTensor<Self>,
                kpool: burn::backend::tensor::FloatTensor<Self>,
                vpool: burn::backend::tensor::FloatTensor<Self>,
                lens: burn::backend::tensor::IntTensor<Self>,
                slots: burn::backend::tensor::IntTensor<Self>,
                scale: f32,
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                attention_step(q, k, v, kpool, vpool, lens, slots, scale)
            }
            fn attention_step_qkv(
                qkv: burn::backend::tensor::FloatTensor<Self>,
                heads: usize,
                kpool: burn::backend::tensor::FloatTensor<Self>,
                vpool: burn::backend::tensor::FloatTensor<Self>,
                lens: burn::backend::tensor::IntTensor<Self>,
                slots: burn::backend::tensor::IntTensor<Self>,
                scale: f32,
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                attention_step_qkv(qkv, heads, kpool, vpool, lens, slots, scale)
            }
            fn attention_prefill(
                q: burn::backend::tensor::FloatTensor<Self>,
                kpool: burn::backend::tensor::FloatTensor<Self>,
                vpool: burn::backend::tensor::FloatTensor<Self>,
                seqs: burn::backend::tensor::IntTensor<Self>,
                heads: usize,
                scale: f32,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                attention_prefill(q, kpool, vpool, seqs, heads, scale)
            }
            fn attention_step_qkv8(
                qkv: burn::backend::tensor::FloatTensor<Self>,
                heads: usize,
                kpool: burn::backend::tensor::IntTensor<Self>,
                vpool: burn::backend::tensor::IntTensor<Self>,
                lens: burn::backend::tensor::IntTensor<Self>,
                slots: burn::backend::tensor::IntTensor<Self>,
                scale: f32,
                kv_scales: (f32, f32),
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::IntTensor<Self>,
                burn::backend::tensor::IntTensor<Self>,
            ) {
                attention_step_qkv8(qkv, heads, kpool, vpool, lens, slots, scale, kv_scales)
            }
            fn write_slots8(
                pool: burn::backend::tensor::IntTensor<Self>,
                src: burn::backend::tensor::FloatTensor<Self>,
                slots: burn::backend::tensor::IntTensor<Self>,
                scale: f32,
            ) -> burn::backend::tensor::IntTensor<Self> {
                write_slots8(pool, src, slots, scale)
            }
            fn write_slots_bf16(
                pool: burn::backend::tensor::IntTensor<Self>,
                src: burn::backend::tensor::FloatTensor<Self>,
                slots: burn::backend::tensor::IntTensor<Self>,
            ) -> burn::backend::tensor::IntTensor<Self> {
                write_slots_bf16(pool, src, slots)
            }
            fn argmax_rows(
                x: burn::backend::tensor::FloatTensor<Self>,
            ) -> burn::backend::tensor::IntTensor<Self> {
                argmax_rows::<_, burn::backend::tensor::IntTensor<Self>>(x)
            }
            fn logprob_rows(
                x: burn::backend::tensor::FloatTensor<Self>,
                tokens: burn::backend::tensor::IntTensor<Self>,
                n: usize,
            ) -> (
                burn::backend::tensor::FloatTensor<Self>,
                burn::backend::tensor::IntTensor<Self>,
                burn::backend::tensor::FloatTensor<Self>,
            ) {
                logprob_rows(x, tokens, n)
            }
            fn advance_lens(
                lens: burn::backend::tensor::IntTensor<Self>,
                slots: burn::backend::tensor::IntTensor<Self>,
            ) -> burn::backend::tensor::IntTensor<Self> {
                advance_lens(lens, slots)
            }
            fn moe_group(
                experts: burn::backend::tensor::IntTensor<Self>,
                n_experts: usize,
            ) -> (
                burn::backend::tensor::IntTensor<Self>,
                burn::backend::tensor::IntTensor<Self>,
            ) {
                moe_group(experts, n_experts)
            }
            fn contiguous(
                x: burn::backend::tensor::FloatTensor<Self>,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                x
            }
            fn contiguous_int(
                x: burn::backend::tensor::IntTensor<Self>,
            ) -> burn::backend::tensor::IntTensor<Self> {
                x
            }
            fn write_slot(
                pool: burn::backend::tensor::FloatTensor<Self>,
                src: burn::backend::tensor::FloatTensor<Self>,
                slot: usize,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                write_slot(pool, src, slot)
            }
            fn write_slots(
                pool: burn::backend::tensor::FloatTensor<Self>,
                src: burn::backend::tensor::FloatTensor<Self>,
                slots: burn::backend::tensor::IntTensor<Self>,
                rot: burn::backend::tensor::IntTensor<Self>,
                width: usize,
            ) -> burn::backend::tensor::FloatTensor<Self> {
                write_slots(pool, src, slots, rot, width)
            }
        }
    };
}

host_backend!(burn::backend::Flex);
host_backend!(NdArray);

/// The ops' `lens` (empty: every sequence has `t` tokens) as one length per sequence.
pub(crate) fn full_lens(lens: &[usize], batch: usize, t: usize) -> Vec<usize> {
    if lens.is_empty() {
        vec![t; batch]
    } else {
        lens.to_vec()
    }
}
