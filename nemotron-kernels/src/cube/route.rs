//! MoE routing (DeepSeek-V3-style sigmoid routing, f32): `s = sigmoid(logit)`; groups ranked by
//! the sum of their two best `s + bias`, the `topk_group` best kept (a bit mask); then `k` passes
//! each taking the best not-yet-chosen `s + bias` (dropped groups score `masked`; ties go to the
//! lower index); weights `s` (or the biased score, a test deviation) renormalized and scaled.
//! Grid: one unit per token, `E · k` work each (deterministic). `idx`/`w`: `[N, k]`.

use super::buffers::{arg, elemwise, empty, f32_buf};
use crate::RouteConfig;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

#[cube(launch)]
pub fn moe_route_kernel(
    logits: &[f32],
    bias: &[f32],
    idx: &mut [i32],
    w: &mut [f32],
    tokens: u32,
    experts: u32,
    top_k: u32,
    n_group: u32,
    topk_group: u32,
    scaling: f32,
    masked: f32,
    #[comptime] renorm: bool,
    #[comptime] biased_weights: bool,
) {
    let t = ABSOLUTE_POS;
    if t >= tokens as usize {
        terminate!();
    }
    let (e_n, k, ng) = (experts as usize, top_k as usize, n_group as usize);
    let per = e_n / ng;
    let row = t * e_n;
    // Kept groups as a bit mask (n_group ≤ 32).
    let mut keep = 0u32;
    if ng > 1 {
        for _ in 0..topk_group as usize {
            let mut best_g = ng;
            let mut best_v = 0.0f32;
            for g in 0..ng {
                if (keep >> g as u32) & 1u32 == 0u32 {
                    let mut b1 = masked;
                    let mut b2 = masked;
                    for j in 0..per {
                        let e = g * per + j;
                        let v = 1.0f32 / (1.0f32 + (-logits[row + e]).exp()) + bias[e];
                        if v > b1 {
                            b2 = b1;
                            b1 = v;
                        } else if v > b2 {
                            b2 = v;
                        }
                    }
                    let gs = if per > 1 { b1 + b2 } else { b1 };
                    if best_g == ng || gs > best_v {
                        best_g = g;
                        best_v = gs;
                    }
                }
            }
            keep |= 1u32 << best_g as u32;
        }
    } else {
        keep = 1u32;
    }
    let mut sum = 0.0f32;
    for j in 0..k {
        let mut best_e = e_n;
        let mut best_v = 0.0f32;
        for e in 0..e_n {
            let mut taken = false;
            for i in 0..j {
                if idx[t * k + i] == e as i32 {
                    taken = true;
                }
            }
            if !taken {
                let g = e / per;
                let allowed = (keep >> g as u32) & 1u32 == 1u32;
                let v = if allowed {
                    1.0f32 / (1.0f32 + (-logits[row + e]).exp()) + bias[e]
                } else {
                    masked
                };
                if best_e == e_n || v > best_v {
                    best_e = e;
                    best_v = v;
                }
            }
        }
        idx[t * k + j] = best_e as i32;
        let s = 1.0f32 / (1.0f32 + (-logits[row + best_e]).exp());
        let wv = if biased_weights { best_v } else { s };
        w[t * k + j] = wv;
        sum += wv;
    }
    for j in 0..k {
        let mut v = w[t * k + j];
        if renorm {
            v /= sum + 1e-20f32;
        }
        w[t * k + j] = v * scaling;
    }
}

pub fn launch<R: CubeRuntime>(
    logits: CubeTensor<R>,
    bias: CubeTensor<R>,
    c: RouteConfig,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (lg, b) = (f32_buf(logits), f32_buf(bias));
    let shape = lg.meta.shape().clone();
    let (n, e) = (shape[0], shape[1]);
    let idx = empty(&lg, [n, c.top_k], DType::I32);
    let w = empty(&lg, [n, c.top_k], DType::F32);
    let (count, dim) = elemwise(n);
    moe_route_kernel::launch::<R>(
        &lg.client,
        count,
        dim,
        arg(&lg),
        arg(&b),
        arg(&idx),
        arg(&w),
        n as u32,
        e as u32,
        c.top_k as u32,
        c.n_group as u32,
        c.topk_group as u32,
        c.routed_scaling_factor,
        crate::MASKED_SCORE,
        c.norm_topk_prob,
        c.weights_from_biased,
    );
    (idx, w)
}
