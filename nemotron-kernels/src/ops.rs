//! The ops of [`NemotronOps`] over Burn tensors: what model code calls. Each
//! checks its shapes (a mismatch is a bug in the caller, reported by name) and dispatches on the
//! device the tensors live on.

use crate::{
    bytes_to_words, Epilogue, Fp8Matrix, Fp8Weights, Maybe, NemotronOps, Nvfp4Matrix, Nvfp4Weights,
    RouteConfig, Rows, ScanDims, StackShape,
};
use burn::backend::Dispatch;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use nemotron_formats as fmt;

type D = Dispatch;

fn words_tensor(bytes: &[u8], device: &Device) -> burn::backend::DispatchTensor {
    let w = bytes_to_words(bytes);
    let n = w.len();
    Tensor::<1, Int>::from_data(TensorData::new(w, [n]), (device, DType::I32)).into_dispatch()
}

fn f32_tensor(v: Vec<f32>, device: &Device) -> burn::backend::DispatchTensor {
    let n = v.len();
    Tensor::<1>::from_data(TensorData::new(v, [n]), (device, DType::F32)).into_dispatch()
}

/// One shape for a stack, or the name of the first matrix that differs.
#[allow(
    clippy::expect_used,
    reason = "stacks come from loaded layers: the loader checks every expert's shape against the \
              config, and n_routed_experts ≥ 1"
)]
fn stack_shape(shapes: impl Iterator<Item = (usize, usize)>) -> StackShape {
    let mut experts = 0;
    let mut first = None;
    for (i, s) in shapes.enumerate() {
        match first {
            None => first = Some(s),
            Some(f) => assert_eq!(
                f, s,
                "matrix {i} of a stack has another shape than matrix 0"
            ),
        }
        experts += 1;
    }
    let (out_features, in_features) = first.expect("a stack holds at least one matrix");
    StackShape {
        experts,
        out_features,
        in_features,
    }
}

impl Nvfp4Weights<Dispatch> {
    /// Moves NVFP4 matrices (one linear, or the experts of one projection) onto `device` as
    /// shipped: bytes are copied, nothing is decoded.
    pub fn upload(mats: &[Nvfp4Matrix], device: &Device) -> Self {
        let shape = stack_shape(mats.iter().map(|m| (m.out_features, m.in_features)));
        assert!(
            shape.in_features % fmt::NVFP4_BLOCK == 0,
            "NVFP4 in_features {} is not a multiple of {}",
            shape.in_features,
            fmt::NVFP4_BLOCK
        );
        let packed: Vec<u8> = mats.iter().flat_map(|m| m.packed.iter().copied()).collect();
        let scales: Vec<u8> = mats
            .iter()
            .flat_map(|m| m.block_scales.iter().copied())
            .collect();
        Nvfp4Weights {
            packed: words_tensor(&packed, device),
            scales: words_tensor(&scales, device),
            globals: f32_tensor(mats.iter().map(|m| m.global_scale).collect(), device),
            shape,
        }
    }
}

impl Fp8Weights<Dispatch> {
    /// Moves per-tensor FP8 matrices onto `device` as shipped (E4M3 bytes and their scales).
    pub fn upload(mats: &[Fp8Matrix], device: &Device) -> Self {
        let shape = stack_shape(mats.iter().map(|m| (m.out_features, m.in_features)));
        assert!(
            shape.in_features % 4 == 0,
            "FP8 in_features {} is not a multiple of 4",
            shape.in_features
        );
        let weight: Vec<u8> = mats.iter().flat_map(|m| m.weight.iter().copied()).collect();
        Fp8Weights {
            weight: words_tensor(&weight, device),
            input_scales: f32_tensor(mats.iter().map(|m| m.input_scale).collect(), device),
            weight_scales: f32_tensor(mats.iter().map(|m| m.weight_scale).collect(), device),
            shape,
        }
    }
}

fn out<const N: usize>(t: burn::backend::DispatchTensor) -> Tensor<N> {
    Tensor::from_dispatch(t)
}

/// Batched `a [B, M, K] · b [B, K, N]` in f32 accumulation (see [`NemotronOps::matmul`]).
pub fn matmul(a: Tensor<3>, b: Tensor<3>) -> Tensor<3> {
    let ([bs, m, k], [bs2, k2, n]) = (a.dims(), b.dims());
    assert!(
        bs == bs2 && k == k2,
        "matmul: [{bs}, {m}, {k}] · [{bs2}, {k2}, {n}]"
    );
    out(<D as NemotronOps>::matmul(
        a.into_dispatch(),
        b.into_dispatch(),
    ))
}

/// `[M, K] · [K, N]` through [`matmul`].
pub fn mm(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    matmul(x.unsqueeze::<3>(), w.unsqueeze::<3>()).squeeze_dim(0)
}

/// `y = x · wᵀ` for a dense `w` `[out, in]` (see [`NemotronOps::dense_linear`]); `y` in `w`'s
/// dtype.
pub fn dense_linear(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    let ([_, k], [_, kw]) = (x.dims(), w.dims());
    assert_eq!(
        k, kw,
        "dense_linear: x has {k} columns, the weight {kw} inputs"
    );
    out(<D as NemotronOps>::dense_linear(
        x.into_dispatch(),
        w.into_dispatch(),
    ))
}

/// [`dense_linear`] with `wt`, `w` transposed (`[in, out]`), held by the caller so the device
/// backends' many-row path need not transpose `w` each call (see
/// [`NemotronOps::dense_linear_t`]). The same product as [`dense_linear`].
pub fn dense_linear_t(x: Tensor<2>, w: Tensor<2>, wt: Tensor<2>) -> Tensor<2> {
    let ([_, k], [n, kw], wtd) = (x.dims(), w.dims(), wt.dims());
    assert_eq!(
        k, kw,
        "dense_linear_t: x has {k} columns, the weight {kw} inputs"
    );
    assert_eq!(
        wtd,
        [kw, n],
        "dense_linear_t: the transposed weight is {wtd:?}, the weight [{n}, {kw}]"
    );
    out(<D as NemotronOps>::dense_linear_t(
        x.into_dispatch(),
        w.into_dispatch(),
        wt.into_dispatch(),
    ))
}

fn check_rows(op: &str, x: &Tensor<2>, shape: StackShape, experts: Option<&Tensor<1, Int>>) {
    let [_, k] = x.dims();
    assert_eq!(
        k, shape.in_features,
        "{op}: x has {k} columns, the weight {} inputs",
        shape.in_features
    );
    if experts.is_none() {
        assert_eq!(
            shape.experts, 1,
            "{op}: a plain linear over a stack of {}",
            shape.experts
        );
    }
}

/// A quantized weight format's stack as the linears take it: its shape, and the backend op that
/// runs it. The format difference lives here once; the four linears below share one body.
trait QuantWeights: Clone {
    fn shape(&self) -> StackShape;
    fn launch(
        x: burn::backend::DispatchTensor,
        w: Self,
        rows: Rows<D>,
        epilogue: Epilogue,
    ) -> burn::backend::DispatchTensor;
}

impl QuantWeights for Nvfp4Weights<D> {
    fn shape(&self) -> StackShape {
        self.shape
    }
    fn launch(
        x: burn::backend::DispatchTensor,
        w: Self,
        rows: Rows<D>,
        epilogue: Epilogue,
    ) -> burn::backend::DispatchTensor {
        <D as NemotronOps>::nvfp4_linear(x, w, rows, epilogue)
    }
}

impl QuantWeights for Fp8Weights<D> {
    fn shape(&self) -> StackShape {
        self.shape
    }
    fn launch(
        x: burn::backend::DispatchTensor,
        w: Self,
        rows: Rows<D>,
        epilogue: Epilogue,
    ) -> burn::backend::DispatchTensor {
        <D as NemotronOps>::fp8_linear(x, w, rows, epilogue)
    }
}

/// The one body of the quantized linears: `epi(x · Wᵀ)`, or per routed slot
/// `epi(W[experts[s]] · x[s / div])`, shapes checked under the op's name.
fn quant_linear<W: QuantWeights>(
    op: &str,
    x: Tensor<2>,
    w: &W,
    routed: Option<(Tensor<1, Int>, usize)>,
    epilogue: Epilogue,
) -> Tensor<2> {
    check_rows(op, &x, w.shape(), routed.as_ref().map(|(e, _)| e));
    let rows = match routed {
        Some((experts, div)) => Rows::Routed {
            experts: experts.into_dispatch(),
            div,
        },
        None => Rows::Each,
    };
    out(W::launch(x.into_dispatch(), w.clone(), rows, epilogue))
}

/// `epi(x · Wᵀ)` for an NVFP4 linear (weight-only: activations stay float).
pub fn nvfp4_linear(x: Tensor<2>, w: &Nvfp4Weights<D>, epilogue: Epilogue) -> Tensor<2> {
    quant_linear("nvfp4_linear", x, w, None, epilogue)
}

/// Routed-expert NVFP4 linear: `y[s] = epi(W[experts[s]] · x[s / div])`.
pub fn nvfp4_expert_linear(
    x: Tensor<2>,
    experts: Tensor<1, Int>,
    div: usize,
    w: &Nvfp4Weights<D>,
    epilogue: Epilogue,
) -> Tensor<2> {
    quant_linear("nvfp4_expert_linear", x, w, Some((experts, div)), epilogue)
}

/// `epi(x · Wᵀ)` for a static W8A8 FP8 linear.
pub fn fp8_linear(x: Tensor<2>, w: &Fp8Weights<D>, epilogue: Epilogue) -> Tensor<2> {
    quant_linear("fp8_linear", x, w, None, epilogue)
}

/// Routed-expert FP8 W8A8 linear (each slot quantizes with its expert's input scale).
pub fn fp8_expert_linear(
    x: Tensor<2>,
    experts: Tensor<1, Int>,
    div: usize,
    w: &Fp8Weights<D>,
    epilogue: Epilogue,
) -> Tensor<2> {
    quant_linear("fp8_expert_linear", x, w, Some((experts, div)), epilogue)
}

/// `x · Wᵀ` for a plain NVFP4 linear, its output columns as three dense tensors of `widths`
/// columns (one launch on the device backends).
pub fn nvfp4_linear3(x: Tensor<2>, w: &Nvfp4Weights<D>, widths: [usize; 3]) -> [Tensor<2>; 3] {
    check_rows("nvfp4_linear3", &x, w.shape, None);
    check_widths("nvfp4_linear3", widths, w.shape.out_features);
    let (a, b, c) = <D as NemotronOps>::nvfp4_linear3(x.into_dispatch(), w.clone(), widths);
    [out(a), out(b), out(c)]
}

/// `x · Wᵀ` for a plain FP8 linear, its output columns as three dense tensors of `widths`
/// columns (one launch, plus one quantization launch for 2+ rows, on the device backends).
pub fn fp8_linear3(x: Tensor<2>, w: &Fp8Weights<D>, widths: [usize; 3]) -> [Tensor<2>; 3] {
    check_rows("fp8_linear3", &x, w.shape, None);
    check_widths("fp8_linear3", widths, w.shape.out_features);
    let (a, b, c) = <D as NemotronOps>::fp8_linear3(x.into_dispatch(), w.clone(), widths);
    [out(a), out(b), out(c)]
}

fn check_widths(op: &str, widths: [usize; 3], n: usize) {
    assert!(
        widths.iter().sum::<usize>() == n && widths.iter().all(|&w| w > 0),
        "{op}: widths {widths:?} do not split the {n} outputs into three"
    );
}

/// `fp8_linear(rms_norm(x, Some(gate), norm_weight, groups, eps), w)` (Mamba2's gated output
/// norm then an FP8 `out_proj`), one launch where the backend can (see
/// [`NemotronOps::fp8_gated_linear`]).
pub fn fp8_gated_linear(
    x: Tensor<2>,
    gate: Tensor<2>,
    norm_weight: Tensor<1>,
    groups: usize,
    eps: f64,
    w: &Fp8Weights<D>,
) -> Tensor<2> {
    let [r, h] = x.dims();
    assert!(
        groups > 0 && h % groups == 0,
        "fp8_gated_linear: {groups} groups do not divide {h} channels"
    );
    assert_eq!(gate.dims(), [r, h], "fp8_gated_linear: gate shape");
    assert_eq!(
        norm_weight.dims(),
        [h],
        "fp8_gated_linear: norm weight for {h} channels"
    );
    check_rows("fp8_gated_linear", &x, w.shape, None);
    out(<D as NemotronOps>::fp8_gated_linear(
        x.into_dispatch(),
        gate.into_dispatch(),
        norm_weight.into_dispatch(),
        groups,
        eps,
        w.clone(),
    ))
}

/// `relu(x)²`.
pub fn relu2<const N: usize>(x: Tensor<N>) -> Tensor<N> {
    let r = burn::tensor::activation::relu(x);
    r.clone() * r
}

/// Group RMSNorm, optionally gated (see [`NemotronOps::rms_norm`]).
pub fn rms_norm(
    x: Tensor<2>,
    gate: Option<Tensor<2>>,
    weight: Tensor<1>,
    groups: usize,
    eps: f64,
) -> Tensor<2> {
    let [r, h] = x.dims();
    assert!(
        groups > 0 && h % groups == 0,
        "rms_norm: {groups} groups do not divide {h} channels"
    );
    assert_eq!(weight.dims(), [h], "rms_norm: weight for {h} channels");
    if let Some(g) = &gate {
        assert_eq!(g.dims(), [r, h], "rms_norm: gate shape");
    }
    let gate: Maybe<D> = gate.map(|g| g.into_dispatch()).into();
    out(<D as NemotronOps>::rms_norm(
        x.into_dispatch(),
        gate,
        weight.into_dispatch(),
        groups,
        eps,
    ))
}

/// The residual add and the next pre-norm in one launch (see [`NemotronOps::add_rms_norm`]):
/// `(x + y, RMSNorm(x + y) · weight)`, `[R, H]` each.
pub fn add_rms_norm(
    x: Tensor<2>,
    y: Tensor<2>,
    weight: Tensor<1>,
    eps: f64,
) -> (Tensor<2>, Tensor<2>) {
    let [r, h] = x.dims();
    assert_eq!(y.dims(), [r, h], "add_rms_norm: y shape");
    assert_eq!(weight.dims(), [h], "add_rms_norm: weight for {h} channels");
    let (s, n) = <D as NemotronOps>::add_rms_norm(
        x.into_dispatch(),
        y.into_dispatch(),
        weight.into_dispatch(),
        eps,
    );
    (out(s), out(n))
}

/// [`add_rms_norm`] with `y` as a MoE layer's parts (see [`NemotronOps::add_moe_rms_norm`]):
/// `(x + moe_combine(routed, w, shared), RMSNorm(·) · weight)` in one launch on device backends.
pub fn add_moe_rms_norm(
    x: Tensor<2>,
    routed: Tensor<2>,
    w: Tensor<2>,
    shared: Option<Tensor<2>>,
    weight: Tensor<1>,
    eps: f64,
) -> (Tensor<2>, Tensor<2>) {
    let ([r, h], [s, hr], [n, k]) = (x.dims(), routed.dims(), w.dims());
    assert!(
        n == r && s == r * k && hr == h,
        "add_moe_rms_norm: x [{r}, {h}], routed [{s}, {hr}], weights [{n}, {k}]"
    );
    if let Some(sh) = &shared {
        assert_eq!(
            sh.dims(),
            [r, h],
            "add_moe_rms_norm: shared expert output shape"
        );
    }
    assert_eq!(
        weight.dims(),
        [h],
        "add_moe_rms_norm: weight for {h} channels"
    );
    let shared: Maybe<D> = shared.map(|t| t.into_dispatch()).into();
    let (s, n) = <D as NemotronOps>::add_moe_rms_norm(
        x.into_dispatch(),
        routed.into_dispatch(),
        w.into_dispatch(),
        shared,
        weight.into_dispatch(),
        eps,
    );
    (out(s), out(n))
}

/// The MoE output from the routed experts' outputs `y` `[N·k, H]`, the routing weights `w`
/// `[N, k]` (f32) and the shared expert's output `[N, H]` (see [`NemotronOps::moe_combine`]).
pub fn moe_combine(y: Tensor<2>, w: Tensor<2>, shared: Option<Tensor<2>>) -> Tensor<2> {
    let ([s, h], [n, k]) = (y.dims(), w.dims());
    assert_eq!(
        s,
        n * k,
        "moe_combine: {s} expert rows for {n} tokens × {k}"
    );
    if let Some(sh) = &shared {
        assert_eq!(sh.dims(), [n, h], "moe_combine: shared expert output shape");
    }
    let shared: Maybe<D> = shared.map(|t| t.into_dispatch()).into();
    out(<D as NemotronOps>::moe_combine(
        y.into_dispatch(),
        w.into_dispatch(),
        shared,
    ))
}

/// MoE routing (see [`NemotronOps::moe_route`]): `(indices [N, k + fixed], weights [N, k + fixed]
/// f32)`.
pub fn moe_route(
    logits: Tensor<2>,
    bias: Tensor<1>,
    config: &RouteConfig,
) -> (Tensor<2, Int>, Tensor<2>) {
    let [_, e] = logits.dims();
    let c = config;
    assert!(
        c.n_group >= 1
            && c.n_group <= 32
            && e % c.n_group == 0
            && c.top_k <= e
            && c.topk_group <= c.n_group,
        "moe_route: {e} experts, {} groups (top {}), top-{}",
        c.n_group,
        c.topk_group,
        c.top_k
    );
    assert_eq!(bias.dims(), [e], "moe_route: bias for {e} experts");
    let (i, w) =
        <D as NemotronOps>::moe_route(logits.into_dispatch(), bias.into_dispatch(), *config);
    (Tensor::from_dispatch(i), out(w))
}

/// `softplus(dt + bias)`, then `max(·, min)` where given (see [`NemotronOps::dt_softplus`]).
pub fn dt_softplus(dt: Tensor<3>, bias: Tensor<1>, min: Option<f32>) -> Tensor<3> {
    let [_, _, h] = dt.dims();
    assert_eq!(bias.dims(), [h], "dt_softplus: bias for {h} heads");
    out(<D as NemotronOps>::dt_softplus(
        dt.into_dispatch(),
        bias.into_dispatch(),
        min,
    ))
}

/// `lens` for the ops: empty when every sequence fills `t` (no lengths buffer on the device,
/// which keeps a decode step free of host writes).
fn ragged(lens: &[usize], batch: usize, t: usize) -> &[usize] {
    assert_eq!(
        lens.len(),
        batch,
        "{} lengths for a batch of {batch}",
        lens.len()
    );
    assert!(
        lens.iter().all(|&l| l <= t),
        "a sequence length exceeds T = {t}: {lens:?}"
    );
    if lens.iter().all(|&l| l == t) {
        &[]
    } else {
        lens
    }
}

/// Causal depthwise conv + bias + SiLU with carried state (see [`NemotronOps::causal_conv1d`]).
pub fn causal_conv1d(
    x: Tensor<3>,
    weight: Tensor<2>,
    bias: Option<Tensor<1>>,
    state: Tensor<3>,
    lens: &[usize],
) -> (Tensor<3>, Tensor<3>) {
    let [b, t, c] = x.dims();
    let [wc, k] = weight.dims();
    assert!(
        wc == c && k >= 1,
        "causal_conv1d: weight [{wc}, {k}] for {c} channels"
    );
    assert_eq!(state.dims(), [b, c, k - 1], "causal_conv1d: state shape");
    let lens = ragged(lens, b, t);
    let bias: Maybe<D> = bias.map(|b| b.into_dispatch()).into();
    let (y, s) = <D as NemotronOps>::causal_conv1d(
        x.into_dispatch(),
        weight.into_dispatch(),
        bias,
        state.into_dispatch(),
        lens,
    );
    (out(y), out(s))
}

/// [`causal_conv1d`] with the output's channels split into three dense tensors of `widths`
/// channels (see [`NemotronOps::causal_conv1d3`]): `([x, B, C], new_state)`.
pub fn causal_conv1d3(
    x: Tensor<3>,
    weight: Tensor<2>,
    bias: Option<Tensor<1>>,
    state: Tensor<3>,
    lens: &[usize],
    widths: [usize; 3],
) -> ([Tensor<3>; 3], Tensor<3>) {
    let [b, t, c] = x.dims();
    let [wc, k] = weight.dims();
    assert!(
        wc == c && k >= 1,
        "causal_conv1d3: weight [{wc}, {k}] for {c} channels"
    );
    assert_eq!(state.dims(), [b, c, k - 1], "causal_conv1d3: state shape");
    assert!(
        widths.iter().all(|&w| w > 0) && widths.iter().sum::<usize>() == c,
        "causal_conv1d3: widths {widths:?} do not split {c} channels into three"
    );
    let lens = ragged(lens, b, t);
    let bias: Maybe<D> = bias.map(|b| b.into_dispatch()).into();
    let (y0, y1, y2, s) = <D as NemotronOps>::causal_conv1d3(
        x.into_dispatch(),
        weight.into_dispatch(),
        bias,
        state.into_dispatch(),
        lens,
        widths,
    );
    ([out(y0), out(y1), out(y2)], out(s))
}

/// The selective scan with D skip and carried f32 state (see [`NemotronOps::selective_scan`]);
/// `state` `None`: every sequence starts from the zero state.
#[allow(clippy::too_many_arguments)]
pub fn selective_scan(
    x: Tensor<4>,
    dt: Tensor<3>,
    a: Tensor<1>,
    b: Tensor<4>,
    c: Tensor<4>,
    d: Tensor<1>,
    state: Option<Tensor<4>>,
    lens: &[usize],
) -> (Tensor<4>, Tensor<4>) {
    let [bs, t, h, p] = x.dims();
    let [_, _, g, n] = b.dims();
    assert!(
        g > 0 && h % g == 0,
        "selective_scan: {g} groups for {h} heads"
    );
    assert_eq!(dt.dims(), [bs, t, h], "selective_scan: dt shape");
    assert_eq!(c.dims(), [bs, t, g, n], "selective_scan: C shape");
    if let Some(state) = &state {
        assert_eq!(state.dims(), [bs, h, p, n], "selective_scan: state shape");
    }
    let lens = ragged(lens, bs, t);
    let state: Maybe<D> = state.map(|s| s.into_dispatch()).into();
    let (y, s) = <D as NemotronOps>::selective_scan(
        x.into_dispatch(),
        dt.into_dispatch(),
        a.into_dispatch(),
        b.into_dispatch(),
        c.into_dispatch(),
        d.into_dispatch(),
        state,
        lens,
    );
    (out(y), out(s))
}

// Decode over state slots (see the trait's docs). Pools are passed by value and returned: on
// device backends the returned pool is the same buffer, written in place; callers store it back.

/// The causal conv for one token per row over slot states: `x` `[B, C]`, `pool` `[S, C, K]` (a
/// ring, see [`NemotronOps::conv_step`]), `lens` `[S]` the tokens before this one.
pub fn conv_step(
    x: Tensor<2>,
    weight: Tensor<2>,
    bias: Option<Tensor<1>>,
    pool: Tensor<3>,
    lens: &Tensor<1, Int>,
    slots: &Tensor<1, Int>,
) -> (Tensor<2>, Tensor<3>) {
    let ([b, c], [wc, k], [s, pc, pk]) = (x.dims(), weight.dims(), pool.dims());
    assert!(
        wc == c && pc == c && pk == k,
        "conv_step: x [{b}, {c}], weight [{wc}, {k}], pool [_, {pc}, {pk}]"
    );
    assert_eq!(slots.dims(), [b], "conv_step: one slot per row");
    assert_eq!(lens.dims(), [s], "conv_step: one length per slot");
    let bias: Maybe<D> = bias.map(|b| b.into_dispatch()).into();
    let (y, p) = <D as NemotronOps>::conv_step(
        x.into_dispatch(),
        weight.into_dispatch(),
        bias,
        pool.into_dispatch(),
        lens.clone().into_dispatch(),
        slots.clone().into_dispatch(),
    );
    (out(y), out(p))
}

/// Weights of a Mamba layer's decode step: the conv's `[C, K]` and bias, and the scan's
/// `dt_bias`, `A`, `D` (`[H]` each).
pub struct MambaStepWeights<'a> {
    pub conv_weight: &'a Tensor<2>,
    pub conv_bias: Option<&'a Tensor<1>>,
    pub dt_bias: &'a Tensor<1>,
    pub a: &'a Tensor<1>,
    pub d: &'a Tensor<1>,
}

/// [`conv_step`] and [`ssm_step`] in one launch on CubeCL backends (see
/// [`NemotronOps::conv_ssm_step`]): `xbc` `[B, H·P + 2·G·N]` raw from `in_proj`, `dt` `[B, H]`
/// raw; the conv ring `[S, C, K]` and the SSM pool `[S, H, P, N]` f32, both updated in place.
#[allow(clippy::too_many_arguments)]
pub fn conv_ssm_step(
    xbc: Tensor<2>,
    dt: Tensor<2>,
    w: MambaStepWeights<'_>,
    conv_pool: Tensor<3>,
    ssm_pool: Tensor<4>,
    lens: &Tensor<1, Int>,
    slots: &Tensor<1, Int>,
    dims: ScanDims,
    dt_min: Option<f32>,
) -> (Tensor<3>, Tensor<3>, Tensor<4>) {
    let [ss, ph, pp, pn] = ssm_pool.dims();
    check_conv_ssm(
        &xbc,
        &dt,
        &w,
        &conv_pool,
        [ss, ph, pp, pn],
        lens,
        slots,
        dims,
    );
    assert_eq!(
        ssm_pool.dtype(),
        DType::F32,
        "conv_ssm_step: the SSM state is f32"
    );
    let bias: Maybe<D> = w.conv_bias.map(|b| b.clone().into_dispatch()).into();
    let (y, cp, sp) = <D as NemotronOps>::conv_ssm_step(
        xbc.into_dispatch(),
        dt.into_dispatch(),
        w.conv_weight.clone().into_dispatch(),
        bias,
        w.dt_bias.clone().into_dispatch(),
        w.a.clone().into_dispatch(),
        w.d.clone().into_dispatch(),
        conv_pool.into_dispatch(),
        ssm_pool.into_dispatch(),
        lens.clone().into_dispatch(),
        slots.clone().into_dispatch(),
        dims,
        dt_min,
    );
    (out(y), out(cp), out(sp))
}

/// [`conv_ssm_step`] over a bf16 SSM state (see [`NemotronOps::conv_ssm_step_bf16`]):
/// `ssm_pool` `[S, H, P, N/2]` I32 words of bf16 pairs, `N` even, updated in place.
#[allow(clippy::too_many_arguments)]
pub fn conv_ssm_step_bf16(
    xbc: Tensor<2>,
    dt: Tensor<2>,
    w: MambaStepWeights<'_>,
    conv_pool: Tensor<3>,
    ssm_pool: Tensor<4, Int>,
    lens: &Tensor<1, Int>,
    slots: &Tensor<1, Int>,
    dims: ScanDims,
    dt_min: Option<f32>,
) -> (Tensor<3>, Tensor<3>, Tensor<4, Int>) {
    let [ss, ph, pp, pw] = ssm_pool.dims();
    assert!(
        dims.state.is_multiple_of(2) && ssm_pool.dtype() == DType::I32,
        "conv_ssm_step_bf16: the pool holds I32 words of bf16 pairs, so the state size {} must \
         be even",
        dims.state
    );
    check_conv_ssm(
        &xbc,
        &dt,
        &w,
        &conv_pool,
        [ss, ph, pp, 2 * pw],
        lens,
        slots,
        dims,
    );
    let bias: Maybe<D> = w.conv_bias.map(|b| b.clone().into_dispatch()).into();
    let (y, cp, sp) = <D as NemotronOps>::conv_ssm_step_bf16(
        xbc.into_dispatch(),
        dt.into_dispatch(),
        w.conv_weight.clone().into_dispatch(),
        bias,
        w.dt_bias.clone().into_dispatch(),
        w.a.clone().into_dispatch(),
        w.d.clone().into_dispatch(),
        conv_pool.into_dispatch(),
        ssm_pool.into_dispatch(),
        lens.clone().into_dispatch(),
        slots.clone().into_dispatch(),
        dims,
        dt_min,
    );
    (out(y), out(cp), Tensor::from_dispatch(sp))
}

/// The shapes [`conv_ssm_step`] and [`conv_ssm_step_bf16`] take; `ssm` is the pool's shape in
/// state values.
#[allow(clippy::too_many_arguments)]
fn check_conv_ssm(
    xbc: &Tensor<2>,
    dt: &Tensor<2>,
    w: &MambaStepWeights<'_>,
    conv_pool: &Tensor<3>,
    ssm: [usize; 4],
    lens: &Tensor<1, Int>,
    slots: &Tensor<1, Int>,
    dims: ScanDims,
) {
    let ScanDims {
        heads: h,
        head_dim: p,
        groups: g,
        state: n,
    } = dims;
    let [rows, width] = xbc.dims();
    let ([wc, k], [s, pc, pk]) = (w.conv_weight.dims(), conv_pool.dims());
    assert!(
        g > 0 && h % g == 0,
        "conv_ssm_step: {g} groups for {h} heads"
    );
    assert_eq!(
        width,
        h * p + 2 * g * n,
        "conv_ssm_step: xbc width for {dims:?}"
    );
    assert!(
        wc == width && pc == width && pk == k && k >= 1,
        "conv_ssm_step: xbc [{rows}, {width}], conv weight [{wc}, {k}], pool [_, {pc}, {pk}]"
    );
    assert_eq!(dt.dims(), [rows, h], "conv_ssm_step: dt shape");
    for (name, t) in [("dt_bias", w.dt_bias), ("a", w.a), ("d", w.d)] {
        assert_eq!(t.dims(), [h], "conv_ssm_step: {name} for {h} heads");
    }
    assert!(
        ssm == [s, h, p, n],
        "conv_ssm_step: ssm pool {ssm:?} (in state values) for [{s}, {h}, {p}, {n}]"
    );
    assert_eq!(slots.dims(), [rows], "conv_ssm_step: one slot per row");
    assert_eq!(lens.dims(), [s], "conv_ssm_step: one length per slot");
}

/// The selective scan for one token per row over slot states, straight from the conv step's
/// output (see [`NemotronOps::ssm_step`]): `xbc` `[B, H·P + 2·G·N]`, `dt` `[B, H]` raw (the
/// softplus with `dt_bias` and the `dt_min` floor happen inside), `pool` `[S, H, P, N]` f32.
#[allow(clippy::too_many_arguments)]
pub fn ssm_step(
    xbc: Tensor<2>,
    dt: Tensor<2>,
    dt_bias: Tensor<1>,
    a: Tensor<1>,
    d: Tensor<1>,
    pool: Tensor<4>,
    slots: &Tensor<1, Int>,
    dims: ScanDims,
    dt_min: Option<f32>,
) -> (Tensor<3>, Tensor<4>) {
    let ScanDims {
        heads: h,
        head_dim: p,
        groups: g,
        state: n,
    } = dims;
    let [rows, width] = xbc.dims();
    assert!(g > 0 && h % g == 0, "ssm_step: {g} groups for {h} heads");
    assert_eq!(width, h * p + 2 * g * n, "ssm_step: xbc width for {dims:?}");
    assert_eq!(dt.dims(), [rows, h], "ssm_step: dt shape");
    for (name, t) in [("dt_bias", &dt_bias), ("a", &a), ("d", &d)] {
        assert_eq!(t.dims(), [h], "ssm_step: {name} for {h} heads");
    }
    let [_, ph, pp, pn] = pool.dims();
    assert!(ph == h && pp == p && pn == n, "ssm_step: pool shape");
    assert_eq!(pool.dtype(), DType::F32, "ssm_step: the SSM state is f32");
    assert_eq!(slots.dims(), [rows], "ssm_step: one slot per row");
    let (y, s) = <D as NemotronOps>::ssm_step(
        xbc.into_dispatch(),
        dt.into_dispatch(),
        dt_bias.into_dispatch(),
        a.into_dispatch(),
        d.into_dispatch(),
        pool.into_dispatch(),
        slots.clone().into_dispatch(),
        dims,
        dt_min,
    );
    (out(y), out(s))
}

/// [`attention_step`] reading `q | k | v` from one fused projection row per token: `qkv`
/// `[B, (heads + 2·KVH)·D]`, pools `[S, KVH, cap, D]`, `lens` `[S]`.
pub fn attention_step_qkv(
    qkv: Tensor<2>,
    heads: usize,
    kpool: Tensor<4>,
    vpool: Tensor<4>,
    lens: &Tensor<1, Int>,
    slots: &Tensor<1, Int>,
    scale: f32,
) -> (Tensor<3>, Tensor<4>, Tensor<4>) {
    let [b, w] = qkv.dims();
    let [s, kvh, _, hd] = kpool.dims();
    assert!(
        kvh > 0 && heads % kvh == 0 && w == (heads + 2 * kvh) * hd,
        "attention_step_qkv: qkv [{b}, {w}] for {heads} heads, pool [{s}, {kvh}, _, {hd}]"
    );
    assert_eq!(
        vpool.dims(),
        kpool.dims(),
        "attention_step_qkv: V pool shape"
    );
    assert_eq!(slots.dims(), [b], "attention_step_qkv: one slot per row");
    assert_eq!(lens.dims(), [s], "attention_step_qkv: one length per slot");
    let (o, kp, vp) = <D as NemotronOps>::attention_step_qkv(
        qkv.into_dispatch(),
        heads,
        kpool.into_dispatch(),
        vpool.into_dispatch(),
        lens.clone().into_dispatch(),
        slots.clone().into_dispatch(),
        scale,
    );
    (out(o), out(kp), out(vp))
}

/// Whether an FP8 KV cache ([`attention_step_qkv8`]) takes heads of `head_dim`: a multiple of 4
/// (four codes to a word) dividing 128 (the fused decode forms' cube), on every backend alike.
pub fn kv8_fits(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(4) && 128usize.is_multiple_of(head_dim)
}

/// [`attention_step_qkv`] over an FP8 KV cache (see [`NemotronOps::attention_step_qkv8`]):
/// pools `[S, KVH, cap, D/4]` I32 words of E4M3 codes, `kv_scales = (k_scale, v_scale)`.
#[allow(clippy::too_many_arguments)]
pub fn attention_step_qkv8(
    qkv: Tensor<2>,
    heads: usize,
    kpool: Tensor<4, Int>,
    vpool: Tensor<4, Int>,
    lens: &Tensor<1, Int>,
    slots: &Tensor<1, Int>,
    scale: f32,
    kv_scales: (f32, f32),
) -> (Tensor<3>, Tensor<4, Int>, Tensor<4, Int>) {
    let [b, w] = qkv.dims();
    let [s, kvh, _, words] = kpool.dims();
    let hd = 4 * words;
    assert!(
        kvh > 0 && heads % kvh == 0 && w == (heads + 2 * kvh) * hd && kv8_fits(hd),
        "attention_step_qkv8: qkv [{b}, {w}] for {heads} heads, pool [{s}, {kvh}, _, {words}] \
         (head dim {hd})"
    );
    assert!(
        vpool.dims() == kpool.dims() && kpool.dtype() == DType::I32 && vpool.dtype() == DType::I32,
        "attention_step_qkv8: K and V pools must be I32 words of one shape"
    );
    assert!(
        kv_scales.0 > 0.0
            && kv_scales.1 > 0.0
            && kv_scales.0.is_finite()
            && kv_scales.1.is_finite(),
        "attention_step_qkv8: KV scales {kv_scales:?} must be positive and finite"
    );
    assert_eq!(slots.dims(), [b], "attention_step_qkv8: one slot per row");
    assert_eq!(lens.dims(), [s], "attention_step_qkv8: one length per slot");
    let (o, kp, vp) = <D as NemotronOps>::attention_step_qkv8(
        qkv.into_dispatch(),
        heads,
        kpool.into_dispatch(),
        vpool.into_dispatch(),
        lens.clone().into_dispatch(),
        slots.clone().into_dispatch(),
        scale,
        kv_scales,
    );
    (out(o), Tensor::from_dispatch(kp), Tensor::from_dispatch(vp))
}

/// `pool[slots[b], a, l, :]` = the FP8 KV codes of `src[b, a, l, :] / scale` (`pool`
/// `[S, A, M, C/4]` I32 words, `src` `[B, A, L, C]`, rows with a negative slot skipped): see
/// [`NemotronOps::write_slots8`]. Shapes are checked here; the slots are the caller's.
pub fn write_slots8(
    pool: Tensor<4, Int>,
    src: Tensor<4>,
    slots: &Tensor<1, Int>,
    scale: f32,
) -> Tensor<4, Int> {
    let ([s, a, m, w], [b, sa, l, c]) = (pool.dims(), src.dims());
    assert!(
        pool.dtype() == DType::I32 && sa == a && c == 4 * w && l <= m && slots.dims() == [b],
        "write_slots8: src [{b}, {sa}, {l}, {c}] ({} slots) into [{s}, {a}, {m}, {w}] words",
        slots.dims()[0]
    );
    assert!(
        scale > 0.0 && scale.is_finite(),
        "write_slots8: scale {scale} must be positive and finite"
    );
    Tensor::from_dispatch(<D as NemotronOps>::write_slots8(
        pool.into_dispatch(),
        src.into_dispatch(),
        slots.clone().into_dispatch(),
        scale,
    ))
}

/// `pool[slots[b], a, l, :]` = the bf16 words of `src[b, a, l, :]` (`pool` `[S, A, M, C/2]`
/// I32, `src` `[B, A, L, C]`, rows with a negative slot skipped): see
/// [`NemotronOps::write_slots_bf16`]. Shapes are checked here; the slots are the caller's.
pub fn write_slots_bf16(
    pool: Tensor<4, Int>,
    src: Tensor<4>,
    slots: &Tensor<1, Int>,
) -> Tensor<4, Int> {
    let ([s, a, m, w], [b, sa, l, c]) = (pool.dims(), src.dims());
    assert!(
        pool.dtype() == DType::I32 && sa == a && c == 2 * w && l <= m && slots.dims() == [b],
        "write_slots_bf16: src [{b}, {sa}, {l}, {c}] ({} slots) into [{s}, {a}, {m}, {w}] words",
        slots.dims()[0]
    );
    Tensor::from_dispatch(<D as NemotronOps>::write_slots_bf16(
        pool.into_dispatch(),
        src.into_dispatch(),
        slots.clone().into_dispatch(),
    ))
}

/// Causal GQA prefill attention of a prompt chunk over key pools, in one launch (flash
/// attention: no `[heads, T, S]` scores in memory): `q` `[B, T, W]` with query head `h` of a row
/// at columns `h·D ..` (`W ≥ heads·D`: a fused `q | k | v` projection is read in place); `kpool`,
/// `vpool` `[S, KVH, cap, D]` holding, for row `b`, the sequence's keys at positions
/// `0 .. past[b] + lens[b]` of slot `slots[b]` (the chunk's own keys already written). Row
/// `i < lens[b]` attends keys `0 ..= past[b] + i`; rows past the length are zeros. Returns
/// `[B, T, heads·D]`. Device backends take head dims that [`attention_prefill_fits`].
#[allow(clippy::too_many_arguments)]
pub fn attention_prefill(
    q: Tensor<3>,
    kpool: Tensor<4>,
    vpool: Tensor<4>,
    slots: &[usize],
    past: &[usize],
    lens: &[usize],
    heads: usize,
    scale: f32,
) -> Tensor<3> {
    let [b, t, w] = q.dims();
    let [s, kvh, cap, hd] = kpool.dims();
    assert!(
        kvh > 0 && heads % kvh == 0 && w >= heads * hd,
        "attention_prefill: q [{b}, {t}, {w}] for {heads} heads, pool [{s}, {kvh}, {cap}, {hd}]"
    );
    assert_eq!(
        vpool.dims(),
        kpool.dims(),
        "attention_prefill: V pool shape"
    );
    assert!(
        slots.len() == b && past.len() == b && lens.len() == b,
        "attention_prefill: {b} rows, {} slots, {} pasts, {} lengths",
        slots.len(),
        past.len(),
        lens.len()
    );
    let mut seqs = Vec::with_capacity(3 * b);
    for r in 0..b {
        assert!(
            slots[r] < s && lens[r] <= t && past[r] + lens[r] <= cap,
            "attention_prefill: row {r}: slot {} of {s}, {} + {} keys, T {t}, cap {cap}",
            slots[r],
            past[r],
            lens[r]
        );
        seqs.extend([slots[r], past[r], lens[r]].map(|v| v as i64));
    }
    let dev = q.device();
    let seqs = Tensor::<2, Int>::from_data(TensorData::new(seqs, [b, 3]), &dev);
    out(<D as NemotronOps>::attention_prefill(
        q.into_dispatch(),
        kpool.into_dispatch(),
        vpool.into_dispatch(),
        seqs.into_dispatch(),
        heads,
        scale,
    ))
}

/// Whether [`attention_prefill`] takes heads of `head_dim` on `device`: any on the host; on
/// device backends a multiple of 8 up to [`crate::MAX_PREFILL_HEAD_DIM`] whose tiles fit the
/// device's shared memory.
pub fn attention_prefill_fits(device: &Device, head_dim: usize) -> bool {
    #[cfg(feature = "cube")]
    if let Some(max) = crate::cube::max_shared_memory(device) {
        return crate::cube::plans::attention::flash_keys_per_tile(max, head_dim).is_some();
    }
    let _ = (device, head_dim);
    true
}

/// Whether a model's prefill attention takes [`attention_prefill`] on `device`: where it
/// [fits](attention_prefill_fits), unless a device backend's `flash=off` setting asks for the
/// composed ops (the host always takes it: its reference has no tiles to fit).
pub fn attention_prefill_planned(device: &Device, head_dim: usize) -> bool {
    #[cfg(feature = "cube")]
    if crate::cube::is_cube(device) && !crate::cube::plans::attention::flash() {
        return false;
    }
    attention_prefill_fits(device, head_dim)
}

/// GQA attention for one token per row over slot KV caches (appends `k`, `v` at each slot's
/// length; the lengths are not advanced): `q` `[B, NH, D]`, `k`/`v` `[B, KVH, D]`, pools
/// `[S, KVH, cap, D]`, `lens` `[S]`.
#[allow(clippy::too_many_arguments)]
pub fn attention_step(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    kpool: Tensor<4>,
    vpool: Tensor<4>,
    lens: &Tensor<1, Int>,
    slots: &Tensor<1, Int>,
    scale: f32,
) -> (Tensor<3>, Tensor<4>, Tensor<4>) {
    let ([b, nh, hd], [_, kvh, kd]) = (q.dims(), k.dims());
    let [s, pk, _, pd] = kpool.dims();
    assert!(
        kvh > 0 && nh % kvh == 0 && kd == hd && pk == kvh && pd == hd,
        "attention_step: q [{b}, {nh}, {hd}], k [_, {kvh}, {kd}], pool [{s}, {pk}, _, {pd}]"
    );
    assert_eq!(
        kpool.dims(),
        vpool.dims(),
        "attention_step: K and V pools differ"
    );
    assert_eq!(lens.dims(), [s], "attention_step: one length per slot");
    assert_eq!(slots.dims(), [b], "attention_step: one slot per row");
    let (o, kp, vp) = <D as NemotronOps>::attention_step(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        kpool.into_dispatch(),
        vpool.into_dispatch(),
        lens.clone().into_dispatch(),
        slots.clone().into_dispatch(),
        scale,
    );
    (out(o), out(kp), out(vp))
}

/// Each row's arg-max (the lowest index on ties): `[B]` I32 — greedy decoding on the device.
/// (Burn's own `argmax` walks a row with one unit when its autotune is off: milliseconds over a
/// 131,072-entry vocabulary on the H200.)
pub fn argmax_rows(x: Tensor<2>) -> Tensor<1, Int> {
    Tensor::from_dispatch(<D as NemotronOps>::argmax_rows(x.into_dispatch()))
}

/// Log-probabilities of rows of logits `x` `[R, V]` on the device: per row the log-sum-exp
/// `lse`, the logit of `tokens[r]` and the `n` (≤ 20) largest logits with their ids (decreasing,
/// the lower id on ties) — read back as `2 + 2n` numbers a row. A token's log-probability is
/// its logit minus `lse`.
pub fn logprob_rows(x: Tensor<2>, tokens: &Tensor<1, Int>, n: usize) -> LogprobRows {
    let [r, _] = x.dims();
    assert!(
        n <= crate::MAX_TOP_LOGPROBS,
        "logprob_rows: n = {n}, at most {}",
        crate::MAX_TOP_LOGPROBS
    );
    assert_eq!(
        tokens.dims()[0],
        r,
        "logprob_rows: {} tokens for {r} rows",
        tokens.dims()[0]
    );
    let (stats, ids, vals) =
        <D as NemotronOps>::logprob_rows(x.into_dispatch(), tokens.clone().into_dispatch(), n);
    LogprobRows {
        stats: out(stats),
        ids: Tensor::from_dispatch(ids),
        values: out(vals),
    }
}

/// What [`logprob_rows`] returns (on the device until read).
pub struct LogprobRows {
    /// `[R, 2]` f32: the log-sum-exp, the token's logit.
    pub stats: Tensor<2>,
    /// `[R, max(n, 1)]` I32: the top ids (−1 past the ranked entries).
    pub ids: Tensor<2, Int>,
    /// `[R, max(n, 1)]` f32: their logits.
    pub values: Tensor<2>,
}

/// `lens[slots[b]] += 1` for the non-pad rows.
pub fn advance_lens(lens: Tensor<1, Int>, slots: &Tensor<1, Int>) -> Tensor<1, Int> {
    Tensor::from_dispatch(<D as NemotronOps>::advance_lens(
        lens.into_dispatch(),
        slots.clone().into_dispatch(),
    ))
}

/// The routing slots `experts` `[S]` grouped by expert: `(counts [2E], members [max(S, 1)])`
/// (see [`NemotronOps::moe_group`]).
pub fn moe_group(experts: Tensor<1, Int>, n_experts: usize) -> (Tensor<1, Int>, Tensor<1, Int>) {
    assert!(n_experts > 0, "moe_group: no experts");
    let (c, m) = <D as NemotronOps>::moe_group(experts.into_dispatch(), n_experts);
    (Tensor::from_dispatch(c), Tensor::from_dispatch(m))
}

/// `x` in a dense row-major buffer (slot pools must be, to be written in place).
pub fn contiguous<const N: usize>(x: Tensor<N>) -> Tensor<N> {
    out(<D as NemotronOps>::contiguous(x.into_dispatch()))
}

/// An int tensor in a dense row-major buffer (the FP8 KV pools, written in place).
pub fn contiguous_int<const N: usize>(x: Tensor<N, Int>) -> Tensor<N, Int> {
    Tensor::from_dispatch(<D as NemotronOps>::contiguous_int(x.into_dispatch()))
}

/// `pool[slot, :, 0..L, :] = src` (`pool` `[S, A, M, C]`, `src` `[A, L, C]`).
pub fn write_slot(pool: Tensor<4>, src: Tensor<3>, slot: usize) -> Tensor<4> {
    let ([s, a, m, c], [sa, l, sc]) = (pool.dims(), src.dims());
    assert!(
        slot < s && sa == a && sc == c && l <= m,
        "write_slot: src [{sa}, {l}, {sc}] into slot {slot} of [{s}, {a}, {m}, {c}]"
    );
    out(<D as NemotronOps>::write_slot(
        pool.into_dispatch(),
        src.into_dispatch(),
        slot,
    ))
}

/// `pool[slots[b], :, (l + rot[b]) mod M, :] = src[b, :, l, :]` for `l < L`, zero for
/// `L ≤ l < width`, rows with a negative slot skipped (`pool` `[S, A, M, C]`, `src`
/// `[B, A, L, C]`, `slots` / `rot` `[B]` I32 with `0 ≤ rot`). Shapes are checked here; the slots
/// and rotations are the caller's (in range: a slot past `S` would write out of the pool).
pub fn write_slots(
    pool: Tensor<4>,
    src: Tensor<4>,
    slots: &Tensor<1, Int>,
    rot: &Tensor<1, Int>,
    width: usize,
) -> Tensor<4> {
    let ([s, a, m, c], [b, sa, l, sc]) = (pool.dims(), src.dims());
    let ([nb], [nr]) = (slots.dims(), rot.dims());
    assert!(
        sa == a && sc == c && l <= width && width <= m && nb == b && nr == b,
        "write_slots: src [{b}, {sa}, {l}, {sc}] ({nb} slots, {nr} rotations, width {width}) \
         into [{s}, {a}, {m}, {c}]"
    );
    out(<D as NemotronOps>::write_slots(
        pool.into_dispatch(),
        src.into_dispatch(),
        slots.clone().into_dispatch(),
        rot.clone().into_dispatch(),
        width,
    ))
}

/// Sets the I32 tensor `t` to `data`: in place on CubeCL devices (same buffer, so a captured
/// graph sees the new values), by replacement elsewhere.
pub fn write_i32<const N: usize>(t: &mut Tensor<N, Int>, data: &[i32]) {
    assert!(
        t.dtype() == DType::I32 && t.shape().num_elements() == data.len(),
        "write_i32: {} values into a {:?} tensor of {} elements",
        data.len(),
        t.dtype(),
        t.shape().num_elements()
    );
    #[cfg(feature = "cube")]
    if crate::cube::is_cube(&t.device()) {
        crate::cube::write_i32_in_place(t, data).unwrap_or_else(|e| panic!("write_i32: {e}"));
        return;
    }
    let shape = t.shape();
    *t = Tensor::from_data(
        TensorData::new(data.to_vec(), shape),
        (&t.device(), DType::I32),
    );
}

/// `(total, reserved)` bytes of `device`'s memory where the device reports its size (CUDA:
/// [`crate::cube::memory_total_and_reserved`]); `None` on the host and wgpu.
pub fn device_memory(device: &Device) -> Option<(u64, u64)> {
    #[cfg(feature = "cube")]
    return crate::cube::memory_total_and_reserved(device);
    #[cfg(not(feature = "cube"))]
    {
        let _ = device;
        None
    }
}

/// Whether `device` captures decode steps as hardware graphs (CUDA); elsewhere a captured step
/// would only re-run its closure.
pub fn supports_graphs(device: &Device) -> bool {
    #[allow(unused_imports)]
    use burn::backend::DispatchDevice;
    match device.as_dispatch() {
        #[cfg(feature = "cuda")]
        DispatchDevice::Cuda(_) => true,
        #[allow(unreachable_patterns)]
        _ => false,
    }
}
