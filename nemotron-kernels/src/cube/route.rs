//! MoE routing (DeepSeek-V3-style sigmoid routing, f32): `s = sigmoid(logit)`; groups ranked by
//! the sum of their two best `s + bias`, the `topk_group` best kept; then `k` passes each taking
//! the best not-yet-chosen `s + bias` (dropped groups score `masked`; ties go to the lower index);
//! weights `s` (or the biased score, a test deviation) renormalized and scaled; then `fixed`
//! slots taking experts `E, E+1, …` with weight 1 (a shared expert stacked with the routed ones).
//!
//! Grid: one cube per token, [`units`] units. Each unit scores its strided share of the experts
//! into shared memory once; each of the `k` passes is a local arg-max per unit and a tree arg-max
//! through shared memory (lower index on ties, so the order equals a serial scan: deterministic),
//! or on devices with 32-lane planes (CUDA) a warp-shuffle arg-max and one pass over the warps'
//! winners (same order).
//! The serial one-unit-per-token kernel this replaces took 259 µs per call at 128 experts, top 6
//! on the H200 (`docs/PERF.md` §6). `idx`/`w`: `[N, k + fixed]`.

use super::buffers::{arg, contiguous_as, elemwise, empty, f32_buf, float_buf, with_float, yz};
use super::reduce::{argmax_tree, better, plane_reduce};
use crate::{Maybe, RouteConfig};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

#[cube(launch)]
pub fn moe_route_kernel(
    logits: &[f32],
    bias: &[f32],
    idx: &mut [i32],
    w: &mut [f32],
    tokens: u32,
    n_experts: u32,
    top_k: u32,
    fixed: u32,
    n_group: u32,
    topk_group: u32,
    scaling: f32,
    masked: f32,
    #[comptime] experts: usize,
    #[comptime] units: usize,
    #[comptime] renorm: bool,
    #[comptime] biased_weights: bool,
    #[comptime] plane: bool,
) {
    let t = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    // Whole cubes leave together (every unit of a cube shares `t`), so the barriers stay uniform.
    if t >= tokens as usize {
        terminate!();
    }
    let u = UNIT_POS as usize;
    let (k, ng) = (top_k as usize, n_group as usize);
    // A token's row of `idx`/`w`: its `k` routed slots, then the `fixed` ones.
    let kk = k + fixed as usize;
    let per = experts / ng;
    // `experts` as a runtime value: the "no candidate" index.
    let none = n_experts;
    let row = t * experts;

    let mut score = Shared::<[f32]>::new_slice(experts);
    let mut choice = Shared::<[f32]>::new_slice(experts);
    let mut taken = Shared::<[u32]>::new_slice(experts);
    let mut val = Shared::<[f32]>::new_slice(units);
    let mut ix = Shared::<[u32]>::new_slice(units);
    let mut wk = Shared::<[f32]>::new_slice(experts);

    let mut e = u;
    while e < experts {
        let s = 1.0f32 / (1.0f32 + (-logits[row + e]).exp());
        score[e] = s;
        choice[e] = s + bias[e];
        taken[e] = 0u32;
        e += units;
    }
    sync_cube();

    if ng > 1 {
        // A group scores the sum of its two best biased scores (its only one, if it has one);
        // unit g < n_group (≤ 32 ≤ units) scores group g, unit 0 keeps the `topk_group` best.
        if u < ng {
            let mut b1 = masked;
            let mut b2 = masked;
            let mut first = true;
            for j in 0..per {
                let v = choice[u * per + j];
                if first || v > b1 {
                    b2 = b1;
                    b1 = v;
                } else if v > b2 {
                    b2 = v;
                }
                first = false;
            }
            val[u] = if per > 1 { b1 + b2 } else { b1 };
        }
        sync_cube();
        if u == 0 {
            let mut keep = 0u32;
            for _ in 0..topk_group as usize {
                let mut best_g = ng;
                let mut best_v = 0.0f32;
                for g in 0..ng {
                    if (keep >> g as u32) & 1u32 == 0u32 && (best_g == ng || val[g] > best_v) {
                        best_g = g;
                        best_v = val[g];
                    }
                }
                keep |= 1u32 << best_g as u32;
            }
            ix[0] = keep;
        }
        sync_cube();
        let keep = ix[0];
        sync_cube();
        let mut e = u;
        while e < experts {
            if (keep >> (e / per) as u32) & 1u32 == 0u32 {
                choice[e] = masked;
            }
            e += units;
        }
        sync_cube();
    }

    // `plane`: each pass reduces by warp shuffles, then over the warps' winners (one barrier per
    // pass instead of a tree's log2(units)); the pass's slots of `pv`/`pi` are its own, so no
    // second barrier guards them.
    let warps = comptime!(units / 32);
    let mut pv =
        Shared::<[f32]>::new_slice(comptime!(if plane { experts * units / 32 } else { 1 }));
    let mut pi =
        Shared::<[u32]>::new_slice(comptime!(if plane { experts * units / 32 } else { 1 }));
    for j in 0..k {
        let mut bi = none;
        let mut bv = 0.0f32;
        let mut e = u;
        while e < experts {
            let v = choice[e];
            if taken[e] == 0u32 && (bi == none || v > bv) {
                bi = e as u32;
                bv = v;
            }
            e += units;
        }
        if plane {
            #[unroll]
            for sh in 0..5u32 {
                let mask = 16u32 >> sh;
                let ov = plane_shuffle_xor(bv, mask);
                let oi = plane_shuffle_xor(bi, mask);
                if better(ov, oi, bv, bi, none) {
                    bv = ov;
                    bi = oi;
                }
            }
            if u % 32 == 0 {
                pv[j * warps + u / 32] = bv;
                pi[j * warps + u / 32] = bi;
            }
            sync_cube();
            let mut wv = pv[j * warps];
            let mut wi = pi[j * warps];
            #[unroll]
            for ww in 1..warps {
                let (ov, oi) = (pv[j * warps + ww], pi[j * warps + ww]);
                if better(ov, oi, wv, wi, none) {
                    wv = ov;
                    wi = oi;
                }
            }
            let b = wi as usize;
            // Only the owner of an expert reads its `taken` entry: it marks it itself.
            if b % units == u {
                taken[b] = 1u32;
            }
            if u == 0 {
                idx[t * kk + j] = b as i32;
                wk[j] = if biased_weights { wv } else { score[b] };
            }
        } else {
            val[u] = bv;
            ix[u] = bi;
            sync_cube();
            argmax_tree(&mut val, &mut ix, none);
            if u == 0 {
                let b = ix[0] as usize;
                idx[t * kk + j] = b as i32;
                taken[b] = 1u32;
                wk[j] = if biased_weights { val[0] } else { score[b] };
            }
            sync_cube();
        }
    }

    if u == 0 {
        let mut sum = 0.0f32;
        for j in 0..k {
            sum += wk[j];
        }
        for j in 0..k {
            let mut v = wk[j];
            if renorm {
                v /= sum + 1e-20f32;
            }
            w[t * kk + j] = v * scaling;
        }
        for j in 0..fixed as usize {
            idx[t * kk + k + j] = (n_experts as usize + j) as i32;
            w[t * kk + k + j] = 1.0f32;
        }
    }
}

/// Units per routing cube: a power of two ≥ 32 (so a group index fits), at most 256.
pub fn units(experts: usize) -> usize {
    experts.next_power_of_two().clamp(32, 256)
}

pub fn launch<R: CubeRuntime>(
    logits: CubeTensor<R>,
    bias: CubeTensor<R>,
    c: RouteConfig,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (lg, b) = (f32_buf(logits), f32_buf(bias));
    let shape = lg.meta.shape().clone();
    let (n, e) = (shape[0], shape[1]);
    let idx = empty(&lg, [n, c.top_k + c.fixed], DType::I32);
    let w = empty(&lg, [n, c.top_k + c.fixed], DType::F32);
    if n == 0 {
        return (idx, w);
    }
    let u = units(e);
    let (x, y) = yz(n);
    moe_route_kernel::launch::<R>(
        &lg.client,
        CubeCount::Static(x, y, 1),
        CubeDim::new_1d(u as u32),
        arg(&lg),
        arg(&b),
        arg(&idx),
        arg(&w),
        n as u32,
        e as u32,
        c.top_k as u32,
        c.fixed as u32,
        c.n_group as u32,
        c.topk_group as u32,
        c.routed_scaling_factor,
        crate::MASKED_SCORE,
        e,
        u,
        c.norm_topk_prob,
        c.weights_from_biased,
        plane_reduce(&lg.client, 32) && u % 32 == 0,
    );
    (idx, w)
}

/// `out[t, c] = F(F(Σ_j w[t, j] · y[t·k + j, c]) + shared[t, c])` (f32 sum, rounded as the
/// separate cast and add would); one unit per `(t, c)`.
#[cube(launch)]
pub fn moe_combine_kernel<F: Float>(
    y: &[F],
    w: &[f32],
    shared: &[F],
    out: &mut [F],
    len: u32,
    k: u32,
    h: u32,
    #[comptime] has_shared: bool,
) {
    let i = ABSOLUTE_POS;
    if i >= len as usize {
        terminate!();
    }
    let (k, h) = (k as usize, h as usize);
    let (t, c) = (i / h, i % h);
    let mut acc = 0.0f32;
    for j in 0..k {
        acc += w[t * k + j] * f32::cast_from(y[(t * k + j) * h + c]);
    }
    let mut v = F::cast_from(acc);
    if has_shared {
        v = F::cast_from(f32::cast_from(v) + f32::cast_from(shared[i]));
    }
    out[i] = v;
}

pub fn combine_launch<R: CubeRuntime>(
    y: CubeTensor<R>,
    w: CubeTensor<R>,
    shared: Maybe<CubeBackend<R>>,
) -> CubeTensor<R> {
    let y = float_buf(y);
    let dtype = y.dtype;
    let w = f32_buf(w);
    let h = y.meta.shape()[1];
    let (n, k) = (w.meta.shape()[0], w.meta.shape()[1]);
    let shared = shared.into_option().map(|s| contiguous_as(s, dtype));
    let out = empty(&y, [n, h], dtype);
    let len = n * h;
    if len == 0 {
        return out;
    }
    let (count, dim) = elemwise(len);
    let sh = shared.as_ref().unwrap_or(&y);
    macro_rules! go {
        ($t:ty) => {
            moe_combine_kernel::launch::<$t, R>(
                &y.client,
                count,
                dim,
                arg(&y),
                arg(&w),
                arg(sh),
                arg(&out),
                len as u32,
                k as u32,
                h as u32,
                shared.is_some(),
            )
        };
    }
    with_float!(dtype, go);
    out
}
