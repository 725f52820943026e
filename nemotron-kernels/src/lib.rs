//! The backend seam of NemotronH: [`NemotronBackend`], one extension trait over Burn's `Backend`
//! with the ops Burn lacks — linears against packed NVFP4 and FP8 weights, the Mamba2 causal conv
//! and the selective scan — plus their plain-Rust implementation for NdArray, the host reference
//! every other arm is judged against.
//!
//! Every op takes any number of new tokens per sequence (`T ≥ 1`) with the per-sequence state, so
//! prefill and decode are the same call; batches are right-padded to a common `T` and carry each
//! sequence's valid length, and padded positions never touch the state.

#[cfg(feature = "cube")]
pub mod cube;
pub mod ndarray;
pub mod reference;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

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
}

/// A selection score far below any real one (finite: WGSL has no infinity literal).
pub const MASKED_SCORE: f32 = -1.0e30;

/// `relu(x)²`.
pub fn relu2<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let r = burn::tensor::activation::relu(x);
    r.clone() * r
}

/// Top `k` along dim 1 with indices; `k` may equal the width (Burn's `topk` wants fewer).
fn top_k<B: Backend>(t: Tensor<B, 2>, k: usize) -> (Tensor<B, 2>, Tensor<B, 2, Int>) {
    if t.dims()[1] > k {
        t.topk_with_indices(k, 1)
    } else {
        t.sort_descending_with_indices(1)
    }
}

/// Mamba2 dimensions an op needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanDims {
    pub heads: usize,
    pub head_dim: usize,
    pub groups: usize,
    pub state: usize,
}

/// The ops NemotronH needs beyond Burn's. Tensors are in the backend's float dtype; the SSM state
/// is always f32 in value (on NdArray everything is f32).
pub trait NemotronBackend: Backend {
    /// An NVFP4 matrix resident on the device, still packed.
    type Nvfp4Weight: Clone + Send + Sync + std::fmt::Debug;
    /// An FP8 matrix resident on the device, still 8-bit.
    type Fp8Weight: Clone + Send + Sync + std::fmt::Debug;

    /// The NVFP4 routed experts of one projection of one MoE layer (all experts, same shape),
    /// resident on the device, still packed.
    type Nvfp4Experts: Clone + Send + Sync + std::fmt::Debug;

    /// The FP8 (W8A8) routed experts of one projection of one MoE layer, resident on the device.
    type Fp8Experts: Clone + Send + Sync + std::fmt::Debug;

    fn nvfp4_weight(w: Nvfp4Matrix, device: &burn::tensor::Device<Self>) -> Self::Nvfp4Weight;

    /// Uploads the FP8 experts `[E]` of one projection; every matrix has the same shape, each
    /// keeps its own weight and input scales.
    fn fp8_experts(w: Vec<Fp8Matrix>, device: &burn::tensor::Device<Self>) -> Self::Fp8Experts;

    /// [`Self::nvfp4_expert_linear`] for FP8 W8A8 experts (each slot quantizes its input with its
    /// expert's static input scale).
    fn fp8_expert_linear(
        x: Tensor<Self, 2>,
        experts: Tensor<Self, 1, burn::tensor::Int>,
        div: usize,
        w: &Self::Fp8Experts,
    ) -> Tensor<Self, 2>;

    /// Uploads the experts `[E]` of one projection; every matrix has the same shape.
    fn nvfp4_experts(
        w: Vec<Nvfp4Matrix>,
        device: &burn::tensor::Device<Self>,
    ) -> Self::Nvfp4Experts;

    /// Bytes of device memory in use, where the backend can tell.
    fn memory_in_use(_device: &burn::tensor::Device<Self>) -> Option<u64> {
        None
    }
    fn fp8_weight(w: Fp8Matrix, device: &burn::tensor::Device<Self>) -> Self::Fp8Weight;

    /// Batched `a [B, M, K] · b [B, K, N]`, accumulated in f32 element by element (no
    /// reduced-precision tensor-core modes, no per-shape autotuning): the dense products of the
    /// model (dense linears, the router, attention) go through it so every arm computes the same
    /// math. NdArray uses Burn's f32 matmul.
    fn matmul(a: Tensor<Self, 3>, b: Tensor<Self, 3>) -> Tensor<Self, 3>;

    /// `y[m, n] = Σ_k x[m, k] · W[n, k]` with `W` dequantized block by block inside the product
    /// (W4A16: activations stay float; a W4A4-declared checkpoint runs the same way).
    fn nvfp4_linear(x: Tensor<Self, 2>, w: &Self::Nvfp4Weight) -> Tensor<Self, 2>;

    /// Routed-expert linear, one output row per routing slot: `y[s] = W[e(s)] · x[s / div]` with
    /// `e(s) = experts[s]` (`x`: `[R, in]`, `experts`: `[S]` indices, `y`: `[S, out]`). With
    /// `div = top_k` the slots of a token share its input row (up projections); with `div = 1`
    /// each slot has its own (down projections). Indices are read on the device: nothing comes
    /// back to the host.
    fn nvfp4_expert_linear(
        x: Tensor<Self, 2>,
        experts: Tensor<Self, 1, burn::tensor::Int>,
        div: usize,
        w: &Self::Nvfp4Experts,
    ) -> Tensor<Self, 2>;

    /// `relu(nvfp4_linear(x, w))²` (up projections): device backends square in the kernel.
    fn nvfp4_linear_relu2(x: Tensor<Self, 2>, w: &Self::Nvfp4Weight) -> Tensor<Self, 2> {
        relu2(Self::nvfp4_linear(x, w))
    }

    /// `relu(fp8_linear(x, w))²`.
    fn fp8_linear_relu2(x: Tensor<Self, 2>, w: &Self::Fp8Weight) -> Tensor<Self, 2> {
        relu2(Self::fp8_linear(x, w))
    }

    /// `relu(nvfp4_expert_linear(..))²`.
    fn nvfp4_expert_linear_relu2(
        x: Tensor<Self, 2>,
        experts: Tensor<Self, 1, Int>,
        div: usize,
        w: &Self::Nvfp4Experts,
    ) -> Tensor<Self, 2> {
        relu2(Self::nvfp4_expert_linear(x, experts, div, w))
    }

    /// `relu(fp8_expert_linear(..))²`.
    fn fp8_expert_linear_relu2(
        x: Tensor<Self, 2>,
        experts: Tensor<Self, 1, Int>,
        div: usize,
        w: &Self::Fp8Experts,
    ) -> Tensor<Self, 2> {
        relu2(Self::fp8_expert_linear(x, experts, div, w))
    }

    /// Mamba2's `dt = softplus(dt_raw + dt_bias)` (`[B, T, H]`, bias `[H]`), then `max(dt, min)`
    /// where a minimum is given (HF's prefill clamp, a deviation here). Fused on device backends.
    fn dt_softplus(
        dt: Tensor<Self, 3>,
        bias: Tensor<Self, 1>,
        min: Option<f32>,
    ) -> Tensor<Self, 3> {
        let x = dt + bias.unsqueeze::<3>();
        let y = x.clone().clamp_min(0.0) + x.abs().neg().exp().log1p();
        match min {
            Some(m) => y.clamp_min(m),
            None => y,
        }
    }

    /// Static W8A8: `xq = e4m3(clamp(x / input_scale, ±448))`,
    /// `y = (xq · e4m3(W)ᵀ) · (input_scale · weight_scale)`.
    fn fp8_linear(x: Tensor<Self, 2>, w: &Self::Fp8Weight) -> Tensor<Self, 2>;

    /// RMSNorm within `groups` contiguous channel groups of the last dimension, statistics in f32:
    /// `y = w · u / sqrt(mean_group(u²) + eps)` with `u = x · silu(gate)` when a gate is given
    /// (Mamba2's gated norm: gate before the norm) and `u = x` otherwise. `x`, `gate`: `[R, H]`;
    /// `weight`: `[H]`; the result is in `x`'s dtype. The default composes Burn ops; device
    /// backends fuse it into one kernel.
    fn rms_norm(
        x: Tensor<Self, 2>,
        gate: Option<Tensor<Self, 2>>,
        weight: Tensor<Self, 1>,
        groups: usize,
        eps: f64,
    ) -> Tensor<Self, 2> {
        use burn::tensor::DType;
        let f32_of = |t: Tensor<Self, 2>| {
            if t.dtype() == DType::F32 {
                t
            } else {
                t.cast(DType::F32)
            }
        };
        let [r, h] = x.dims();
        let dtype = x.dtype();
        let mut u = f32_of(x);
        if let Some(z) = gate {
            u = u * burn::tensor::activation::silu(f32_of(z));
        }
        let u = u.reshape([r, groups, h / groups]);
        let var = u.clone().powi_scalar(2).mean_dim(2);
        let u = (u * (var + eps).sqrt().recip()).reshape([r, h]);
        let w = f32_of(weight.unsqueeze::<2>());
        let y = u * w;
        if dtype == DType::F32 {
            y
        } else {
            y.cast(dtype)
        }
    }

    /// MoE routing from the router's f32 logits `[N, E]` and the selection bias `[E]` (f32):
    /// `s = sigmoid(logits)`; experts are chosen by `s + bias` — with groups, only among the
    /// `topk_group` groups whose two best biased scores sum highest — and weighted by `s`
    /// (renormalized over the chosen when `norm_topk_prob`), times `routed_scaling_factor`.
    /// Returns `(indices [N, k], weights [N, k] f32)`, both on the device.
    fn moe_route(
        logits: Tensor<Self, 2>,
        bias: Tensor<Self, 1>,
        c: &RouteConfig,
    ) -> (Tensor<Self, 2, Int>, Tensor<Self, 2>) {
        use burn::tensor::IndexingUpdateOp;
        let [n, e] = logits.dims();
        let scores = burn::tensor::activation::sigmoid(logits);
        let choice = scores.clone() + bias.unsqueeze::<2>();
        let choice = if c.n_group > 1 {
            let per = e / c.n_group;
            let grouped = choice.clone().reshape([n, c.n_group, per]);
            let best = if per > 2 { grouped.topk(2, 2) } else { grouped };
            let group_scores = best.sum_dim(2).reshape([n, c.n_group]);
            let (_, keep) = top_k(group_scores, c.topk_group);
            let dev = choice.device();
            let ones = Tensor::<Self, 2>::ones(keep.dims(), &dev);
            let keep_mask = Tensor::<Self, 2>::zeros([n, c.n_group], &dev).scatter(
                1,
                keep,
                ones,
                IndexingUpdateOp::Add,
            );
            let dropped = keep_mask
                .unsqueeze_dim::<3>(2)
                .expand([n, c.n_group, per])
                .reshape([n, e])
                .lower_elem(0.5);
            choice.mask_fill(dropped, MASKED_SCORE)
        } else {
            choice
        };
        let (_, idx) = top_k(choice.clone(), c.top_k);
        let source = if c.weights_from_biased {
            choice
        } else {
            scores
        };
        let mut w = source.gather(1, idx.clone());
        if c.norm_topk_prob {
            w = w.clone() / (w.sum_dim(1) + 1e-20);
        }
        (idx, w * c.routed_scaling_factor)
    }

    /// Depthwise causal conv over time + bias + SiLU.
    /// `x`: `[B, T, C]`; `weight`: `[C, K]` (`[.., K-1]` multiplies the current token);
    /// `state`: `[B, C, K-1]`, the last `K-1` inputs before this call (zeros for a new sequence).
    /// Returns `(y [B, T, C], new_state)`; positions `t ≥ lens[b]` are padding.
    fn causal_conv1d(
        x: Tensor<Self, 3>,
        weight: Tensor<Self, 2>,
        bias: Option<Tensor<Self, 1>>,
        state: Tensor<Self, 3>,
        lens: &[usize],
    ) -> (Tensor<Self, 3>, Tensor<Self, 3>);

    /// The Mamba2 selective scan with the D skip, per head `h` of group `g = h / (H/G)`:
    /// `S = exp(dt·A[h])·S + dt·outer(x, B[g])`, `y = S·C[g] + D[h]·x`.
    /// `x`: `[B, T, H, P]`; `dt`: `[B, T, H]` (after softplus); `a`: `[H]` (= −exp(A_log));
    /// `b`, `c`: `[B, T, G, N]`; `d`: `[H]`; `state`: `[B, H, P, N]`.
    /// Returns `(y [B, T, H, P], new_state)`; positions `t ≥ lens[b]` leave the state untouched.
    #[allow(clippy::too_many_arguments)]
    fn selective_scan(
        x: Tensor<Self, 4>,
        dt: Tensor<Self, 3>,
        a: Tensor<Self, 1>,
        b: Tensor<Self, 4>,
        c: Tensor<Self, 4>,
        d: Tensor<Self, 1>,
        state: Tensor<Self, 4>,
        lens: &[usize],
    ) -> (Tensor<Self, 4>, Tensor<Self, 4>);
}
