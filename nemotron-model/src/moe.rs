//! The MoE mixer: f32 sigmoid router, grouped top-k selection on `sigmoid + correction bias`,
//! weights from the unbiased scores (renormalized, times `routed_scaling_factor`), non-gated relu²
//! experts, plus a shared expert on the same input.
//!
//! Routing and expert compute stay on the device: the chosen expert indices feed the expert
//! kernels directly (one output row per routing slot), and the weighted sum over a token's slots
//! is a tensor reduction (NVFP4, FP8 W8A8 and dense experts). Only checkpoints whose experts mix
//! weight forms (none released) fall back to grouping tokens by expert on the host.

use crate::mlp::Mlp;
use crate::util::{from_f32, to_f32};
use burn::tensor::{DType, IndexingUpdateOp, Int, Tensor, TensorData};
use nemotron_kernels::relu2;
use nemotron_kernels::NemotronBackend;

use nemotron_loader::config::MoeConfig;

#[derive(Debug, Clone)]
pub struct Moe<B: NemotronBackend> {
    /// Router, transposed: `[hidden, E]`, f32.
    pub router_t: Tensor<B, 2>,
    /// `[E]`, added to the scores for selection only.
    pub correction_bias: Tensor<B, 1>,
    pub experts: Experts<B>,
    pub shared: Option<Mlp<B>>,
    pub cfg: MoeConfig,
}

/// The routed experts of one layer, kept in the form they shipped.
#[derive(Debug, Clone)]
pub enum Experts<B: NemotronBackend> {
    /// All NVFP4 (the released quantized checkpoints): stacked, still packed.
    Nvfp4 {
        up: B::Nvfp4Experts,
        down: B::Nvfp4Experts,
    },
    /// All FP8 W8A8 (FP8 checkpoints): stacked, 8-bit.
    Fp8 {
        up: B::Fp8Experts,
        down: B::Fp8Experts,
    },
    /// All dense: stacked and transposed, `up` `[E, hidden, inter]`, `down` `[E, inter, hidden]`.
    Dense {
        up: Tensor<B, 3>,
        down: Tensor<B, 3>,
    },
    /// Mixed forms: expert by expert, routing read back on the host.
    PerExpert(Vec<Mlp<B>>),
}

/// Bytes of gathered dense expert weights one dense-expert step may hold (the slots are taken in
/// chunks so a long prefill does not gather every slot's weight at once).
const DENSE_GATHER_BYTES: usize = 256 << 20;

/// `y[s] = x[s] · W[experts[s]]` for dense stacked `w` `[E, in, out]`; `x` `[S, in]`.
fn dense_expert_linear<B: NemotronBackend>(
    x: Tensor<B, 2>,
    experts: Tensor<B, 1, Int>,
    w: &Tensor<B, 3>,
) -> Tensor<B, 2> {
    let [s, k] = x.dims();
    let [_, _, n] = w.dims();
    let chunk = (DENSE_GATHER_BYTES / (k * n * 4)).clamp(1, s);
    let parts: Vec<Tensor<B, 2>> = (0..s)
        .step_by(chunk)
        .map(|a| {
            let b = (a + chunk).min(s);
            let ws = w.clone().select(0, experts.clone().slice(a..b));
            let xs = x.clone().slice_dim(0, a..b).reshape([b - a, 1, k]);
            B::matmul(xs, ws).reshape([b - a, n])
        })
        .collect();
    Tensor::cat(parts, 0)
}

impl<B: NemotronBackend> Moe<B> {
    /// Routing for `x` `[N, hidden]`: `(indices [N, k], weights [N, k])`.
    pub fn route(
        &self,
        x: Tensor<B, 2>,
        bias_in_weights: bool,
    ) -> (Tensor<B, 2, Int>, Tensor<B, 2>) {
        let c = &self.cfg;
        // The router runs in f32 whatever the activation dtype (its weights are kept f32).
        let logits = crate::linear::mm(to_f32(x), self.router_t.clone());
        let rc = nemotron_kernels::RouteConfig {
            top_k: c.top_k,
            n_group: c.n_group,
            topk_group: c.topk_group,
            norm_topk_prob: c.norm_topk_prob,
            routed_scaling_factor: c.routed_scaling_factor as f32,
            weights_from_biased: bias_in_weights,
        };
        B::moe_route(logits, self.correction_bias.clone(), &rc)
    }

    /// `h`: `[B, T, hidden]`.
    pub fn forward(&self, h: Tensor<B, 3>, bias_in_weights: bool) -> Tensor<B, 3> {
        let [b, t, hid] = h.dims();
        let n = b * t;
        let x: Tensor<B, 2> = h.reshape([n, hid]);
        let (idx, w) = self.route(x.clone(), bias_in_weights);
        let k = self.cfg.top_k;
        let dtype = x.dtype();
        let slots = idx.clone().reshape([n * k]);
        let routed = match &self.experts {
            Experts::Nvfp4 { up, down } => {
                let hs = B::nvfp4_expert_linear_relu2(x.clone(), slots.clone(), k, up);
                Some(B::nvfp4_expert_linear(hs, slots, 1, down))
            }
            Experts::Fp8 { up, down } => {
                let hs = B::fp8_expert_linear_relu2(x.clone(), slots.clone(), k, up);
                Some(B::fp8_expert_linear(hs, slots, 1, down))
            }
            Experts::Dense { up, down } => {
                let xs = x
                    .clone()
                    .unsqueeze_dim::<3>(1)
                    .expand([n, k, hid])
                    .reshape([n * k, hid]);
                let hs = relu2(dense_expert_linear(xs, slots.clone(), up));
                Some(dense_expert_linear(hs, slots, down))
            }
            Experts::PerExpert(_) => None,
        };
        // The routed sum accumulates in f32 (as HF does), then returns to the activation dtype.
        let out = match routed {
            Some(y) => (to_f32(y).reshape([n, k, hid]) * w.unsqueeze_dim::<3>(2))
                .sum_dim(1)
                .reshape([n, hid]),
            None => self.per_expert(x.clone(), idx, w),
        };
        let mut out = from_f32(out, dtype);
        if let Some(s) = &self.shared {
            out = out + s.forward(x);
        }
        out.reshape([b, t, hid])
    }

    /// Mixed-form experts: tokens grouped by expert on the host, f32 sum.
    fn per_expert(&self, x: Tensor<B, 2>, idx: Tensor<B, 2, Int>, w: Tensor<B, 2>) -> Tensor<B, 2> {
        let Experts::PerExpert(experts) = &self.experts else {
            unreachable!("per_expert on stacked experts")
        };
        let [n, hid] = x.dims();
        let dev = x.device();
        let k = self.cfg.top_k;
        let idx_h: Vec<i64> = idx
            .into_data()
            .convert::<i64>()
            .into_vec()
            .expect("int indices");
        let w_h: Vec<f32> = w
            .into_data()
            .convert::<f32>()
            .into_vec()
            .expect("f32 weights");
        let mut out = Tensor::<B, 2>::zeros([n, hid], (&dev, DType::F32));
        for (e, expert) in experts.iter().enumerate() {
            let (toks, ws): (Vec<i64>, Vec<f32>) = idx_h
                .iter()
                .enumerate()
                .filter(|(_, &x)| x as usize == e)
                .map(|(p, _)| ((p / k) as i64, w_h[p]))
                .unzip();
            if toks.is_empty() {
                continue;
            }
            let m = toks.len();
            let tok_t = Tensor::<B, 1, Int>::from_data(TensorData::new(toks, [m]), &dev);
            let ye = to_f32(expert.forward(x.clone().select(0, tok_t.clone())));
            let wt = Tensor::<B, 1>::from_data(TensorData::new(ws, [m]), (&dev, DType::F32))
                .unsqueeze_dim::<2>(1);
            out = out.select_assign(0, tok_t, ye * wt, IndexingUpdateOp::Add);
        }
        out
    }
}

/// Puts one layer's routed experts on the device: stacked when every expert has the same form
/// (NVFP4, FP8 or dense), expert by expert otherwise.
pub fn experts_from_weights<B: NemotronBackend>(
    experts: Vec<nemotron_loader::ExpertWeights>,
    dev: &B::Device,
) -> Result<Experts<B>, crate::error::ModelError> {
    use crate::linear::{fp8_matrix, nvfp4_matrix};
    use nemotron_loader::LinearWeight as W;
    let all_nvfp4 = experts
        .iter()
        .all(|e| matches!((&e.up, &e.down), (W::Nvfp4(_), W::Nvfp4(_))));
    let all_fp8 = experts
        .iter()
        .all(|e| matches!((&e.up, &e.down), (W::Fp8(_), W::Fp8(_))));
    let all_dense = experts
        .iter()
        .all(|e| matches!((&e.up, &e.down), (W::Dense(_), W::Dense(_))));
    if all_nvfp4 && !experts.is_empty() {
        let (up, down): (Vec<_>, Vec<_>) = experts
            .into_iter()
            .map(|e| match (e.up, e.down) {
                (W::Nvfp4(u), W::Nvfp4(d)) => (nvfp4_matrix(u), nvfp4_matrix(d)),
                _ => unreachable!("checked: all NVFP4"),
            })
            .unzip();
        return Ok(Experts::Nvfp4 {
            up: B::nvfp4_experts(up, dev),
            down: B::nvfp4_experts(down, dev),
        });
    }
    if all_fp8 && !experts.is_empty() {
        let (up, down): (Vec<_>, Vec<_>) = experts
            .into_iter()
            .map(|e| match (e.up, e.down) {
                (W::Fp8(u), W::Fp8(d)) => (fp8_matrix(u), fp8_matrix(d)),
                _ => unreachable!("checked: all FP8"),
            })
            .unzip();
        return Ok(Experts::Fp8 {
            up: B::fp8_experts(up, dev),
            down: B::fp8_experts(down, dev),
        });
    }
    if all_dense && !experts.is_empty() {
        let mut ups = Vec::with_capacity(experts.len());
        let mut downs = Vec::with_capacity(experts.len());
        for e in experts {
            let (W::Dense(u), W::Dense(d)) = (e.up, e.down) else {
                unreachable!("checked: all dense")
            };
            ups.push(crate::util::to_tensor_transposed::<B>(&u, dev));
            downs.push(crate::util::to_tensor_transposed::<B>(&d, dev));
        }
        return Ok(Experts::Dense {
            up: Tensor::stack(ups, 0),
            down: Tensor::stack(downs, 0),
        });
    }
    let per = experts
        .into_iter()
        .map(|e| {
            Ok(Mlp {
                up: crate::linear::Linear::from_weight(e.up, dev)?,
                down: crate::linear::Linear::from_weight(e.down, dev)?,
            })
        })
        .collect::<Result<Vec<_>, crate::error::ModelError>>()?;
    Ok(Experts::PerExpert(per))
}

#[cfg(test)]
mod tests {
    //! The stacked expert paths (indices read on the device) against the expert-by-expert path
    //! (routing read on the host), same weights, NdArray.
    use super::*;
    use crate::linear::Linear;
    use burn::backend::NdArray;
    use nemotron_kernels::{Fp8Matrix, Nvfp4Matrix};
    use nemotron_loader::formats as fmt;
    type B = NdArray<f32>;

    fn vals(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn moe(experts: Experts<B>, hid: usize, e: usize, groups: usize) -> Moe<B> {
        let dev = Default::default();
        Moe {
            router_t: Tensor::from_data(TensorData::new(vals(hid * e, 1, 1.0), [hid, e]), &dev),
            correction_bias: Tensor::from_data(TensorData::new(vals(e, 2, 0.1), [e]), &dev),
            experts,
            shared: None,
            cfg: MoeConfig {
                n_routed_experts: e,
                top_k: 2,
                intermediate_size: 16,
                n_shared_experts: 0,
                shared_intermediate_size: 0,
                n_group: groups,
                topk_group: 1,
                norm_topk_prob: true,
                routed_scaling_factor: 2.5,
                bias: false,
            },
        }
    }

    #[test]
    fn stacked_experts_equal_expert_by_expert() {
        let dev = Default::default();
        let (hid, inter, e) = (32, 16, 4);
        let nv = |r: usize, c: usize, seed: u64| {
            let enc = fmt::nvfp4_encode(&vals(r * c, seed, 0.2), r, c);
            Nvfp4Matrix {
                out_features: r,
                in_features: c,
                packed: enc.packed,
                block_scales: enc.block_scales,
                global_scale: enc.weight_scale_2,
            }
        };
        let f8 = |r: usize, c: usize, seed: u64| {
            let (q, ws) = fmt::fp8_encode(&vals(r * c, seed, 0.2));
            Fp8Matrix {
                out_features: r,
                in_features: c,
                weight: q,
                weight_scale: ws,
                input_scale: 0.01 * seed as f32,
            }
        };
        let ups: Vec<_> = (0..e).map(|i| nv(inter, hid, 10 + i as u64)).collect();
        let downs: Vec<_> = (0..e).map(|i| nv(hid, inter, 20 + i as u64)).collect();
        let up8: Vec<_> = (0..e).map(|i| f8(inter, hid, 30 + i as u64)).collect();
        let down8: Vec<_> = (0..e).map(|i| f8(hid, inter, 40 + i as u64)).collect();
        let dense = |seed: u64, r: usize, c: usize| {
            Tensor::<B, 2>::from_data(TensorData::new(vals(r * c, seed, 0.2), [r, c]), &dev)
        };
        let dup: Vec<_> = (0..e).map(|i| dense(50 + i as u64, hid, inter)).collect();
        let ddown: Vec<_> = (0..e).map(|i| dense(60 + i as u64, inter, hid)).collect();
        let cases: Vec<(&str, Experts<B>, Experts<B>)> = vec![
            (
                "nvfp4",
                Experts::Nvfp4 {
                    up: B::nvfp4_experts(ups.clone(), &dev),
                    down: B::nvfp4_experts(downs.clone(), &dev),
                },
                Experts::PerExpert(
                    (0..e)
                        .map(|i| Mlp {
                            up: Linear::Nvfp4 {
                                weight: B::nvfp4_weight(ups[i].clone(), &dev),
                                in_features: hid,
                                out_features: inter,
                            },
                            down: Linear::Nvfp4 {
                                weight: B::nvfp4_weight(downs[i].clone(), &dev),
                                in_features: inter,
                                out_features: hid,
                            },
                        })
                        .collect(),
                ),
            ),
            (
                "fp8",
                Experts::Fp8 {
                    up: B::fp8_experts(up8.clone(), &dev),
                    down: B::fp8_experts(down8.clone(), &dev),
                },
                Experts::PerExpert(
                    (0..e)
                        .map(|i| Mlp {
                            up: Linear::Fp8 {
                                weight: B::fp8_weight(up8[i].clone(), &dev),
                                in_features: hid,
                                out_features: inter,
                                dequant: None,
                            },
                            down: Linear::Fp8 {
                                weight: B::fp8_weight(down8[i].clone(), &dev),
                                in_features: inter,
                                out_features: hid,
                                dequant: None,
                            },
                        })
                        .collect(),
                ),
            ),
            (
                "dense",
                Experts::Dense {
                    up: Tensor::stack(dup.clone(), 0),
                    down: Tensor::stack(ddown.clone(), 0),
                },
                Experts::PerExpert(
                    (0..e)
                        .map(|i| Mlp {
                            up: Linear::Dense(dup[i].clone()),
                            down: Linear::Dense(ddown[i].clone()),
                        })
                        .collect(),
                ),
            ),
        ];
        let h = Tensor::<B, 3>::from_data(
            TensorData::new(vals(2 * 5 * hid, 3, 1.0), [2, 5, hid]),
            &dev,
        );
        for (name, stacked, per) in cases {
            for groups in [1, 2] {
                let a: Vec<f32> = moe(stacked.clone(), hid, e, groups)
                    .forward(h.clone(), false)
                    .into_data()
                    .into_vec()
                    .unwrap();
                let b: Vec<f32> = moe(per.clone(), hid, e, groups)
                    .forward(h.clone(), false)
                    .into_data()
                    .into_vec()
                    .unwrap();
                let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = a
                    .iter()
                    .zip(&b)
                    .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(scale > 0.1, "{name}: a vanishing output proves nothing");
                assert!(
                    d <= 1e-5 * scale,
                    "{name} groups {groups}: {d} at scale {scale}"
                );
            }
        }
    }
}
