//! The backend seam of NemotronH: [`NemotronOps`], one Burn backend extension with the ops Burn
//! lacks — linears against packed NVFP4 and FP8 weights, the Mamba2 causal conv and selective scan,
//! fused norms and MoE routing — implemented by the host reference ([`host`], plain Rust over
//! Burn's Flex and NdArray CPU backends) and by the CubeCL kernels ([`cube`], CUDA and wgpu). Model code calls the tensor-level
//! functions of [`ops`], which dispatch on the device a tensor lives on.
//!
//! Every op takes any number of new tokens per sequence (`T ≥ 1`) with the per-sequence state, so
//! prefill and decode are the same call; batches are right-padded to a common `T` and carry each
//! sequence's valid length, and padded positions never touch the state.
//!
//! The extension covers the plain backends: `Flex`, `NdArray`, and `Cuda` / `Wgpu` **without** Burn's
//! `fusion` feature (with it, `burn::backend::Cuda` names a fusion wrapper this crate does not
//! implement, and the build fails on the missing impl).
// Library code takes no panic from data: every unwrap/expect is an error, or allowed where it
// stands with the invariant that makes it safe written beside it.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
// The kernel families are crate-private (`cube::plans` is their public face); their docs still
// link each other, read with `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

#[cfg(feature = "cube")]
pub mod cube;
pub mod host;
pub mod ops;
pub mod reference;
pub mod rng;

use burn::backend::tensor::{FloatTensor, IntTensor};
// `#[backend_extension]` names the backends it dispatches to bare: they must be in scope.
#[cfg(feature = "cuda")]
#[allow(unused_imports)]
use burn::backend::Cuda;
#[allow(unused_imports)]
use burn::backend::Flex;
#[allow(unused_imports)]
use burn::backend::NdArray;
#[cfg(feature = "wgpu")]
#[allow(unused_imports)]
use burn::backend::Wgpu;
use burn::backend::{backend_extension, Backend, ExtensionType};

/// An NVFP4 matrix as shipped: `out × in`, E2M1 codes packed two per byte along `in` (low nibble =
/// even column), one E4M3 scale per 16 inputs, one f32 global scale that multiplies every element.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Matrix {
    pub out_features: usize,
    pub in_features: usize,
    /// `[out, in/2]`.
    pub packed: Vec<u8>,
    /// `[out, in/16]` E4M3 bytes.
    pub block_scales: Vec<u8>,
    pub global_scale: f32,
}

/// A per-tensor static FP8 (W8A8) matrix: `W = e4m3(weight) · weight_scale`; activations are
/// quantized with the static `input_scale` before the product.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Matrix {
    pub out_features: usize,
    pub in_features: usize,
    /// `[out, in]` E4M3 bytes.
    pub weight: Vec<u8>,
    pub weight_scale: f32,
    pub input_scale: f32,
}

/// The shape of a stack of same-shaped matrices (a linear is a stack of one; the routed experts
/// of one MoE projection a stack of `E`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StackShape {
    pub experts: usize,
    pub out_features: usize,
    pub in_features: usize,
}

/// NVFP4 matrices resident on a device, still packed: the shipped bytes of every matrix back to
/// back (matrix-major, then row-major), as little-endian u32 words (`I32` tensors; the total is
/// zero-padded to a whole word).
#[derive(ExtensionType, Debug, Clone)]
pub struct Nvfp4Weights<B: Backend> {
    /// E2M1 codes, `E · out · in/2` bytes.
    pub packed: IntTensor<B>,
    /// E4M3 block scales, `E · out · in/16` bytes.
    pub scales: IntTensor<B>,
    /// Each matrix's f32 global scale, `[E]`.
    pub globals: FloatTensor<B>,
    pub shape: StackShape,
}

/// Per-tensor FP8 W8A8 matrices resident on a device: E4M3 bytes back to back as u32 words
/// (`I32`), each matrix's static input scale and weight scale (`[E]` f32 each).
#[derive(ExtensionType, Debug, Clone)]
pub struct Fp8Weights<B: Backend> {
    pub weight: IntTensor<B>,
    pub input_scales: FloatTensor<B>,
    pub weight_scales: FloatTensor<B>,
    pub shape: StackShape,
}

/// Which matrix each output row uses, and which input row it reads.
#[derive(ExtensionType, Debug, Clone)]
pub enum Rows<B: Backend> {
    /// Row `m` of the output is `W[0] · x[m]` (a plain linear; the stack holds one matrix).
    Each,
    /// Routed experts, one output row per routing slot: `y[s] = W[e(s)] · x[s / div]` with
    /// `e(s) = experts[s]` (`[S]` indices, read on the device). With `div = top_k` the slots of a
    /// token share its input row (up projections); with `div = 1` each slot has its own.
    Routed { experts: IntTensor<B>, div: usize },
}

/// An optional float tensor argument (the extension macro passes tensors only inside tensor types).
#[derive(ExtensionType, Debug, Clone)]
pub enum Maybe<B: Backend> {
    Some(FloatTensor<B>),
    None,
}

impl<B: Backend> From<Option<FloatTensor<B>>> for Maybe<B> {
    fn from(t: Option<FloatTensor<B>>) -> Self {
        match t {
            Some(t) => Maybe::Some(t),
            None => Maybe::None,
        }
    }
}

impl<B: Backend> Maybe<B> {
    pub fn into_option(self) -> Option<FloatTensor<B>> {
        match self {
            Maybe::Some(t) => Some(t),
            Maybe::None => None,
        }
    }
}

/// What a linear does to its output before writing it (fused in the device kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Epilogue {
    #[default]
    None,
    /// `relu(v)²` (NemotronH's MLP and expert activation).
    Relu2,
}

impl Epilogue {
    pub fn apply(self, v: f32) -> f32 {
        match self {
            Epilogue::None => v,
            Epilogue::Relu2 => {
                let r = v.max(0.0);
                r * r
            }
        }
    }
}

/// How a MoE layer picks its experts (DeepSeek-V3-style sigmoid routing).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouteConfig {
    pub top_k: usize,
    /// Expert groups (1 = no grouping) and how many of them stay selectable.
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
    /// Deliberately wrong (tests only): weight by the biased scores.
    pub weights_from_biased: bool,
    /// Slots appended to each token's `top_k`, taking the experts past the router's `E, E+1, …`
    /// with weight 1 (a shared expert stacked with the routed ones): `[N, top_k + fixed]` out.
    pub fixed: usize,
}

/// A selection score far below any real one (finite: WGSL has no infinity literal).
pub const MASKED_SCORE: f32 = -1.0e30;

/// Mamba2 dimensions an op needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanDims {
    pub heads: usize,
    pub head_dim: usize,
    pub groups: usize,
    pub state: usize,
}

/// The most ranked entries [`ops::logprob_rows`] returns per row (OpenAI's and vLLM's limit on
/// `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The largest head dimension [`ops::attention_prefill`] takes on device backends (which also
/// want a multiple of 8): what the flash kernel stages in shared memory.
pub const MAX_PREFILL_HEAD_DIM: usize = 128;

/// The ops NemotronH needs beyond Burn's, over backend primitives. Float inputs come in the
/// activation dtype (f32, bf16 or f16 on device backends; f32 on the host); results are in the
/// activation dtype unless stated otherwise; the SSM state, router logits and routing weights are
/// f32 whatever the activation dtype. Shapes are checked by [`ops`] before the call.
#[backend_extension(Flex, NdArray, Wgpu: cfg(feature = "wgpu"), Cuda: cfg(feature = "cuda"))]
pub trait NemotronOps: Backend {
    /// Batched `a [B, M, K] · b [B, K, N]`, accumulated in f32 term by term (no reduced-precision
    /// tensor-core modes, no per-shape autotuning): the dense products of the model (dense
    /// linears, the router, attention) go through it so every arm computes the same math.
    fn matmul(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;

    /// A dense linear `y = x · wᵀ` for `x [M, K]` and `w [N, K]` (the checkpoint's `[out, in]`
    /// layout, rows contiguous: what a GEMV streams), accumulated in f32; `x` is read in its own
    /// dtype, `y` comes out in `w`'s (an f32 router over bf16 activations gives f32 logits
    /// without a cast launch).
    fn dense_linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self>;

    /// [`Self::dense_linear`] with `wt` = `w` transposed (`[K, N]`, contiguous) held by the
    /// caller: the same product, bit for bit, where the device backends' many-row path reads
    /// `wt` instead of transposing `w` every call (the router past 16 rows: a 1.4 MB copy a
    /// layer, ≈ 5 µs on the H100, `docs/PERF.md` §38).
    fn dense_linear_t(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        wt: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// NVFP4 weight-only linear `y[r, n] = epi(gs · Σ_b s[n, b] · Σ_j E2M1[n, 16b + j] ·
    /// x[row(r), 16b + j])` over `x [R, in]`, the rows as [`Rows`] says; `y`: `[rows, out]`.
    fn nvfp4_linear(
        x: FloatTensor<Self>,
        #[extension_type] w: Nvfp4Weights<Self>,
        #[extension_type] rows: Rows<Self>,
        epilogue: Epilogue,
    ) -> FloatTensor<Self>;

    /// A plain NVFP4 linear (no epilogue) whose output columns come back as three dense tensors
    /// of `widths` columns (Mamba's `in_proj` into `z`, `xBC`, `dt`): one launch where the device
    /// can write the three directly.
    fn nvfp4_linear3(
        x: FloatTensor<Self>,
        #[extension_type] w: Nvfp4Weights<Self>,
        widths: [usize; 3],
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// [`Self::nvfp4_linear3`] for a static W8A8 FP8 linear.
    fn fp8_linear3(
        x: FloatTensor<Self>,
        #[extension_type] w: Fp8Weights<Self>,
        widths: [usize; 3],
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// Static W8A8: `xq = e4m3(clamp(x / input_scale, ±448))`,
    /// `y = epi((xq · e4m3(W)ᵀ) · (input_scale · weight_scale))`, rows as [`Rows`] says.
    fn fp8_linear(
        x: FloatTensor<Self>,
        #[extension_type] w: Fp8Weights<Self>,
        #[extension_type] rows: Rows<Self>,
        epilogue: Epilogue,
    ) -> FloatTensor<Self>;

    /// Mamba2's output: `fp8_linear(rms_norm(x, gate, norm_weight, groups, eps), w)`, in one
    /// launch where the backend can (CubeCL on CUDA, one bf16 row: the FP8 tensor-core kernel
    /// computes the norm in its prologue before quantizing); the values of the two ops up to the
    /// order of the norm's `Σ u²`.
    fn fp8_gated_linear(
        x: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        norm_weight: FloatTensor<Self>,
        groups: usize,
        eps: f64,
        #[extension_type] w: Fp8Weights<Self>,
    ) -> FloatTensor<Self>;

    /// The residual add and the next pre-norm in one: `s = x + y` (rounded to the activation
    /// dtype, as a separate add would), `h = RMSNorm(s) · weight` with f32 statistics over the
    /// whole row (`[R, H]` each). Returns `(s, h)`.
    fn add_rms_norm(
        x: FloatTensor<Self>,
        y: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// [`Self::add_rms_norm`] with `y` given as a MoE layer's parts, combined inside exactly as
    /// [`Self::moe_combine`] combines them (`routed` `[R·k, H]`, `w` `[R, k]` f32, the shared
    /// expert's output `[R, H]` where there is one): the decode step's MoE output never takes a
    /// launch of its own.
    fn add_moe_rms_norm(
        x: FloatTensor<Self>,
        routed: FloatTensor<Self>,
        w: FloatTensor<Self>,
        #[extension_type] shared: Maybe<Self>,
        weight: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// RMSNorm within `groups` contiguous channel groups of the last dimension, statistics in
    /// f32: `y = w · u / sqrt(mean_group(u²) + eps)` with `u = x · silu(gate)` when a gate is
    /// given (Mamba2's gated norm: gate before the norm) and `u = x` otherwise. `x`, `gate`:
    /// `[R, H]`; `weight`: `[H]`.
    fn rms_norm(
        x: FloatTensor<Self>,
        #[extension_type] gate: Maybe<Self>,
        weight: FloatTensor<Self>,
        groups: usize,
        eps: f64,
    ) -> FloatTensor<Self>;

    /// The MoE output for `N` tokens: `y` `[N·k, H]` (the routed experts' outputs, slot `t·k + j`
    /// for token `t`'s `j`-th expert), `w` `[N, k]` f32 routing weights, the shared expert's
    /// output `[N, H]` where there is one: `out = (Σ_j w[t,j]·y[t·k+j])` accumulated in f32 and
    /// rounded to the activation dtype, `+ shared` (rounded again, as a separate add would).
    fn moe_combine(
        y: FloatTensor<Self>,
        w: FloatTensor<Self>,
        #[extension_type] shared: Maybe<Self>,
    ) -> FloatTensor<Self>;

    /// MoE routing from the router's f32 logits `[N, E]` and the selection bias `[E]` (f32):
    /// `s = sigmoid(logits)`; experts are chosen by `s + bias` — with groups, only among the
    /// `topk_group` groups whose two best biased scores sum highest — and weighted by `s`
    /// (renormalized over the chosen when `norm_topk_prob`), times `routed_scaling_factor`.
    /// Then `fixed` slots per token take experts `E, E+1, …` with weight 1. Returns
    /// `(indices [N, k + fixed] I32, weights [N, k + fixed] f32)`, both on the device.
    fn moe_route(
        logits: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        config: RouteConfig,
    ) -> (IntTensor<Self>, FloatTensor<Self>);

    /// Mamba2's `dt = softplus(dt_raw + dt_bias)` (`[B, T, H]`, bias `[H]`), evaluated as
    /// `max(x, 0) + log1p(exp(−|x|))`, then `max(dt, min)` where a minimum is given (HF's prefill
    /// clamp, a deviation here).
    fn dt_softplus(
        dt: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        min: Option<f32>,
    ) -> FloatTensor<Self>;

    /// Depthwise causal conv over time + bias + SiLU.
    /// `x`: `[B, T, C]`; `weight`: `[C, K]` (`[.., K-1]` multiplies the current token);
    /// `state`: `[B, C, K-1]`, the last `K-1` inputs before this call (zeros for a new sequence).
    /// Returns `(y [B, T, C], new_state)`; positions `t ≥ lens[b]` are padding (`lens` empty: every
    /// sequence has `T` tokens).
    fn causal_conv1d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        #[extension_type] bias: Maybe<Self>,
        state: FloatTensor<Self>,
        lens: &[usize],
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// [`Self::causal_conv1d`] whose output channels come back as three dense tensors
    /// `[B, T, widths[i]]` (Mamba's `x`, `B`, `C`), then the new state: one launch where the
    /// device can write the three directly, so the scan reads them without copies.
    fn causal_conv1d3(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        #[extension_type] bias: Maybe<Self>,
        state: FloatTensor<Self>,
        lens: &[usize],
        widths: [usize; 3],
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );

    /// The Mamba2 selective scan with the D skip, per head `h` of group `g = h / (H/G)`:
    /// `S = exp(dt·A[h])·S + dt·outer(x, B[g])`, `y = S·C[g] + D[h]·x`.
    /// `x`: `[B, T, H, P]`; `dt`: `[B, T, H]` (after softplus); `a`: `[H]` (= −exp(A_log));
    /// `b`, `c`: `[B, T, G, N]`; `d`: `[H]`; `state`: `[B, H, P, N]` f32, or none: every
    /// sequence starts from the zero state (new sequences; the kernels then skip the incoming
    /// state's terms instead of reading zeros).
    /// Returns `(y [B, T, H, P], new_state f32)`; positions `t ≥ lens[b]` leave the state
    /// untouched (`lens` empty: every sequence has `T` tokens).
    #[allow(clippy::too_many_arguments)]
    fn selective_scan(
        x: FloatTensor<Self>,
        dt: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        c: FloatTensor<Self>,
        d: FloatTensor<Self>,
        #[extension_type] state: Maybe<Self>,
        lens: &[usize],
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    // Decode over state slots: one new token per row, each row's state in a slot of a pool
    // allocated once; the slot indices are read on the device and the pools are updated in place
    // on device backends (the returned pool is the same buffer), so a captured step stays valid
    // from step to step. A negative slot marks a pad row: zeros out, nothing written.

    /// The causal conv for one token per row: `x` `[B, C]`, `weight` `[C, K]`, the state of row
    /// `b` in `pool[slots[b]]` (`[S, C, K]`, a ring: with `L = lens[slot]` tokens before this
    /// one, the input of time `t` sits at `t mod K`), the new input written at `L mod K` in place
    /// (`lens` is read, not advanced). A ring of `K` rather than a shifted window of `K − 1`
    /// lets one launch read a channel's window while another cube writes its newest entry, which
    /// is what fusing the conv into the SSM step needs. Returns `(y [B, C], pool)`.
    fn conv_step(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        #[extension_type] bias: Maybe<Self>,
        pool: FloatTensor<Self>,
        lens: IntTensor<Self>,
        slots: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// [`Self::conv_step`] then [`Self::ssm_step`] on its output, in one launch where the backend
    /// can (CubeCL: each SSM cube convolves the channels it reads, the group's `B`/`C` once per
    /// cube into shared memory); the same values as the two ops. `xbc` `[B, H·P + 2·G·N]` is the
    /// raw `in_proj` part. Returns `(y [B, H, P], conv pool, ssm pool)`.
    #[allow(clippy::too_many_arguments)]
    fn conv_ssm_step(
        xbc: FloatTensor<Self>,
        dt: FloatTensor<Self>,
        conv_weight: FloatTensor<Self>,
        #[extension_type] conv_bias: Maybe<Self>,
        dt_bias: FloatTensor<Self>,
        a: FloatTensor<Self>,
        d: FloatTensor<Self>,
        conv_pool: FloatTensor<Self>,
        ssm_pool: FloatTensor<Self>,
        lens: IntTensor<Self>,
        slots: IntTensor<Self>,
        dims: ScanDims,
        dt_min: Option<f32>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// [`Self::conv_ssm_step`] over a bf16 SSM state (vLLM's `--mamba-ssm-cache-dtype
    /// bfloat16`; HF transformers keeps the state in the model dtype): `ssm_pool`
    /// `[S, H, P, N/2]` I32 words, each two bf16 (element `2w` in the low half), `N` even. The
    /// step computes in f32 from the stored values, `y` from the f32 new state, and stores that
    /// state rounded to the nearest bf16 (ties to even). Returns `(y, conv pool, ssm pool)`.
    #[allow(clippy::too_many_arguments)]
    fn conv_ssm_step_bf16(
        xbc: FloatTensor<Self>,
        dt: FloatTensor<Self>,
        conv_weight: FloatTensor<Self>,
        #[extension_type] conv_bias: Maybe<Self>,
        dt_bias: FloatTensor<Self>,
        a: FloatTensor<Self>,
        d: FloatTensor<Self>,
        conv_pool: FloatTensor<Self>,
        ssm_pool: IntTensor<Self>,
        lens: IntTensor<Self>,
        slots: IntTensor<Self>,
        dims: ScanDims,
        dt_min: Option<f32>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, IntTensor<Self>);

    /// The selective scan for one token per row, reading its inputs where the conv step left
    /// them: `xbc` `[B, H·P + 2·G·N]` = `x | B | C` (`dims`), `dt` `[B, H]` raw — the op applies
    /// `softplus(dt + dt_bias)`, floored at `dt_min` where given, rounded to the activation dtype
    /// as [`Self::dt_softplus`] stores it — `a`, `d` `[H]`; the state of row `b` in
    /// `pool[slots[b]]` (`[S, H, P, N]`, f32), updated in place. Returns `(y [B, H, P], pool)`.
    #[allow(clippy::too_many_arguments)]
    fn ssm_step(
        xbc: FloatTensor<Self>,
        dt: FloatTensor<Self>,
        dt_bias: FloatTensor<Self>,
        a: FloatTensor<Self>,
        d: FloatTensor<Self>,
        pool: FloatTensor<Self>,
        slots: IntTensor<Self>,
        dims: ScanDims,
        dt_min: Option<f32>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// GQA attention for one token per row over its slot's KV cache: appends `k`, `v`
    /// (`[B, KVH, D]`) at position `lens[slot]` of `kpool`/`vpool` (`[S, KVH, cap, D]`, in place),
    /// then attends `q` (`[B, NH, D]`) over the `lens[slot] + 1` keys, scores times `scale`,
    /// softmax in f32; query head `h` reads kv head `h / (NH / KVH)`. `lens` (`[S]`) is read, not
    /// advanced. Returns `(o [B, NH, D], kpool, vpool)`.
    #[allow(clippy::too_many_arguments)]
    fn attention_step(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        kpool: FloatTensor<Self>,
        vpool: FloatTensor<Self>,
        lens: IntTensor<Self>,
        slots: IntTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// Causal GQA attention of a prompt chunk over its sequences' keys in a pool (flash
    /// attention: no score matrix in memory): `q` `[B, T, W]`, query head `h` of row `(b, i)` at
    /// columns `h·D ..` (`W ≥ heads·D`, so a fused `q | k | v` row is read in place); `kpool`,
    /// `vpool` `[S, KVH, cap, D]` already holding the chunk's keys after the sequence's earlier
    /// ones; `seqs` `[B, 3]` I32: slot, keys before the chunk (`past`), chunk length (`len ≤ T`,
    /// `past + len ≤ cap`). Row `i < len` attends keys `0 ..= past + i` (query head `h` the kv
    /// head `h / (heads / KVH)`), scores, softmax and sums in f32; rows `i ≥ len` are zeros.
    /// Returns `[B, T, heads·D]`.
    fn attention_prefill(
        q: FloatTensor<Self>,
        kpool: FloatTensor<Self>,
        vpool: FloatTensor<Self>,
        seqs: IntTensor<Self>,
        heads: usize,
        scale: f32,
    ) -> FloatTensor<Self>;

    /// [`Self::attention_step`] with `q | k | v` as one projection row per token: `qkv`
    /// `[B, (heads + 2·KVH)·D]` (the layout of a fused q/k/v linear), read in place on device
    /// backends (no slicing copies). Returns `(o [B, heads, D], kpool, vpool)`.
    #[allow(clippy::too_many_arguments)]
    fn attention_step_qkv(
        qkv: FloatTensor<Self>,
        heads: usize,
        kpool: FloatTensor<Self>,
        vpool: FloatTensor<Self>,
        lens: IntTensor<Self>,
        slots: IntTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// [`Self::attention_step_qkv`] over an FP8 KV cache: pools `[S, KVH, cap, D/4]` of I32
    /// words, each four E4M3 codes (little-endian, in element order) of `x / scale`, read as
    /// `f32(code) · scale` with `kv_scales = (k_scale, v_scale)` (vLLM's convention). The step's
    /// own K/V are stored the same way and attended as stored. `D` must be a multiple of 4 that
    /// [`crate::ops::kv8_fits`]. Returns `(o [B, heads, D], kpool, vpool)`.
    #[allow(clippy::too_many_arguments)]
    fn attention_step_qkv8(
        qkv: FloatTensor<Self>,
        heads: usize,
        kpool: IntTensor<Self>,
        vpool: IntTensor<Self>,
        lens: IntTensor<Self>,
        slots: IntTensor<Self>,
        scale: f32,
        kv_scales: (f32, f32),
    ) -> (FloatTensor<Self>, IntTensor<Self>, IntTensor<Self>);

    /// `pool[slots[b], a, l, :]` = the FP8 KV codes of `src[b, a, l, :] / scale` for every
    /// `l < L` and every row with `slots[b] ≥ 0` (`pool` `[S, A, M, C/4]` I32 words as in
    /// [`Self::attention_step_qkv8`], `src` `[B, A, L, C]`, `L ≤ M`), in place: prefilled keys or
    /// values entering an FP8 cache. Returns `pool`.
    fn write_slots8(
        pool: IntTensor<Self>,
        src: FloatTensor<Self>,
        slots: IntTensor<Self>,
        scale: f32,
    ) -> IntTensor<Self>;

    /// `pool[slots[b], a, l, :]` = the bf16 words of `src[b, a, l, :]` (each value rounded to
    /// nearest even, two a word as in [`Self::conv_ssm_step_bf16`]) for every `l < L` and every
    /// row with `slots[b] ≥ 0` (`pool` `[S, A, M, C/2]` I32, `src` `[B, A, L, C]`, `L ≤ M`), in
    /// place: prefilled SSM states entering a bf16 state pool. Returns `pool`.
    fn write_slots_bf16(
        pool: IntTensor<Self>,
        src: FloatTensor<Self>,
        slots: IntTensor<Self>,
    ) -> IntTensor<Self>;

    /// Each row's arg-max over `x` `[B, V]` (the lowest index on ties; NaN never wins): `[B]`
    /// I32. Greedy sampling on the device — one launch, `B` ids to read back.
    fn argmax_rows(x: FloatTensor<Self>) -> IntTensor<Self>;

    /// Per row of `x` `[R, V]`: `stats` `[R, 2]` f32 (the log-sum-exp, the logit of
    /// `tokens[r]`, −∞ for a token outside the row), and the `n` largest logits (`n` ≤ 20) as
    /// `ids` `[R, max(n, 1)]` I32 and `values` `[R, max(n, 1)]` f32, by decreasing value, the
    /// lower id on ties, NaN never ranking (id −1 past the ranked entries). Log-probabilities
    /// without the vocabulary row on the host.
    fn logprob_rows(
        x: FloatTensor<Self>,
        tokens: IntTensor<Self>,
        n: usize,
    ) -> (FloatTensor<Self>, IntTensor<Self>, FloatTensor<Self>);

    /// `lens[slots[b]] += 1` for every non-pad row, in place. Returns `lens`.
    fn advance_lens(lens: IntTensor<Self>, slots: IntTensor<Self>) -> IntTensor<Self>;

    /// The routing slots `experts` `[S]` (expert ids) grouped by expert, as the grouped
    /// tensor-core kernels read them: `counts` `[2E]` (`counts[e]` slots routed to `e`,
    /// `counts[E + e] = Σ_{e' < e} counts[e']` where they start) and `members` `[max(S, 1)]`
    /// (the slots of expert `e` at `counts[E + e] ..`, in no set order within it; ids outside
    /// `0..E` join no group). I32 both. CUDA runs it inside prefill's grouped kernels; an op so
    /// every arm can test it.
    fn moe_group(experts: IntTensor<Self>, n_experts: usize) -> (IntTensor<Self>, IntTensor<Self>);

    /// `x` in a dense row-major buffer (CUDA's default allocation may pitch rows; the slot pools
    /// are written in place by kernels that index dense buffers). A no-op where already dense.
    fn contiguous(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// [`Self::contiguous`] for an int tensor (the FP8 KV pools' words).
    fn contiguous_int(x: IntTensor<Self>) -> IntTensor<Self>;

    /// `pool[slot, :, 0..L, :] = src` for `pool` `[S, A, M, C]` and `src` `[A, L, C]` (`L ≤ M`),
    /// in place: how a prefilled sequence's state enters its slot. Returns `pool`.
    fn write_slot(
        pool: FloatTensor<Self>,
        src: FloatTensor<Self>,
        slot: usize,
    ) -> FloatTensor<Self>;

    /// `pool[slots[b], a, (l + rot[b]) mod M, c] = src[b, a, l, c]` for `l < L`, and `0` for
    /// `L ≤ l < width`, over every row `b` with `slots[b] ≥ 0` (`pool` `[S, A, M, C]`, `src`
    /// `[B, A, L, C]`, `slots` and `rot` `[B]` I32, `width ≤ M`), in place: a batch of prefilled
    /// sequences entering their slots in one launch per pool (a conv ring takes its rotation
    /// and its free zero entry the same way). Returns `pool`.
    fn write_slots(
        pool: FloatTensor<Self>,
        src: FloatTensor<Self>,
        slots: IntTensor<Self>,
        rot: IntTensor<Self>,
        width: usize,
    ) -> FloatTensor<Self>;
}

/// Shipped bytes as little-endian u32 words (as `i32` bits), zero-padded to a whole word.
pub fn bytes_to_words(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            i32::from_le_bytes(w)
        })
        .collect()
}
