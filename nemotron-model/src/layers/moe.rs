//! The MoE mixer: f32 sigmoid router, grouped top-k selection on `sigmoid + correction bias`,
//! weights from the unbiased scores (renormalized, times `routed_scaling_factor`), non-gated relu²
//! experts, plus a shared expert on the same input.
//!
//! Routing and expert compute stay on the device: the chosen expert indices feed the expert
//! kernels directly (one output row per routing slot), and the weighted sum over a token's slots
//! is a tensor reduction (NVFP4, FP8 W8A8 and dense experts). Only checkpoints whose experts mix
//! weight forms (none released) fall back to grouping tokens by expert on the host.

use crate::layers::fold::{fold_refusal, fold_shared, SharedExpert};
use crate::layers::linear::{fp8_matrix, nvfp4_matrix};
use crate::layers::mlp::Mlp;
use crate::util::{float, float_transposed, from_f32, to_f32};
use burn::backend::Dispatch;
use burn::tensor::{DType, Device, IndexingUpdateOp, Int, Tensor, TensorData};
use nemotron_kernels::{ops, Epilogue, Fp8Weights, Nvfp4Weights, RouteConfig};
use nemotron_loader::config::MoeConfig;
use nemotron_loader::{LinearWeight as W, MoeWeights};

/// A MoE layer's output rows: the parts [`ops::moe_combine`] combines, or (mixed-form experts)
/// the combined rows.
pub(crate) enum MoeOut {
    Parts {
        routed: Tensor<2>,
        w: Tensor<2>,
        shared: Option<Tensor<2>>,
    },
    Combined(Tensor<2>),
}

#[derive(Debug, Clone)]
pub struct Moe {
    /// Router `[E, hidden]` f32 (logits in f32 whatever the activation dtype).
    router: Tensor<2>,
    /// The router transposed, `[hidden, E]` (contiguous): what the device's many-row product
    /// reads, held so a step does not transpose the router again (1.4 MB a layer on Lightning).
    router_t: Tensor<2>,
    /// `[E]`, f32, added to the scores for selection only.
    correction_bias: Tensor<1>,
    experts: Experts,
    shared: Option<Mlp>,
    /// Routing as configured (`fixed` 0: the folded parts are added per call).
    route: RouteConfig,
    /// The shared expert's parts stacked after the routed experts (0: none).
    fold_parts: usize,
    /// Rows up to which a call routes every token to those parts (weight 1) instead of running
    /// `shared` ([`SharedExpert::fold_rows`]).
    fold_rows: usize,
}

/// The routed experts of one layer, kept in the form they shipped.
#[derive(Debug, Clone)]
pub enum Experts {
    /// All NVFP4 (the released quantized checkpoints): stacked, still packed.
    Nvfp4 {
        up: Nvfp4Weights<Dispatch>,
        down: Nvfp4Weights<Dispatch>,
    },
    /// All FP8 W8A8 (FP8 checkpoints): stacked, 8-bit.
    Fp8 {
        up: Fp8Weights<Dispatch>,
        down: Fp8Weights<Dispatch>,
    },
    /// All dense: stacked and transposed, `up` `[E, hidden, inter]`, `down` `[E, inter, hidden]`.
    Dense { up: Tensor<3>, down: Tensor<3> },
    /// Mixed forms: expert by expert, routing read back on the host.
    PerExpert(Vec<Mlp>),
}

/// Bytes of gathered dense expert weights one dense-expert step may hold (the slots are taken in
/// chunks so a long prefill does not gather every slot's weight at once).
const DENSE_GATHER_BYTES: usize = 256 << 20;

/// `y[s] = x[s] · W[experts[s]]` for dense stacked `w` `[E, in, out]`; `x` `[S, in]`.
fn dense_expert_linear(x: Tensor<2>, experts: Tensor<1, Int>, w: &Tensor<3>) -> Tensor<2> {
    let [s, k] = x.dims();
    let [_, _, n] = w.dims();
    let chunk = (DENSE_GATHER_BYTES / (k * n * 4)).clamp(1, s);
    let parts: Vec<Tensor<2>> = (0..s)
        .step_by(chunk)
        .map(|a| {
            let b = (a + chunk).min(s);
            let ws = w.clone().select(0, experts.clone().slice(a..b));
            let xs = x.clone().slice_dim(0, a..b).reshape([b - a, 1, k]);
            ops::matmul(xs, ws).reshape([b - a, n])
        })
        .collect();
    Tensor::cat(parts, 0)
}

impl Moe {
    /// Builds the mixer from its loaded weights, its shared expert run as `shared` says (a
    /// shared expert that [`fold_refusal`] refuses stays apart: [`crate::NemotronH`]'s build
    /// refuses the option first). `bias_in_weights` is a deviation (tests only).
    pub fn from_weights(
        mut w: MoeWeights,
        cfg: &MoeConfig,
        dev: &Device,
        dtype: DType,
        bias_in_weights: bool,
        shared: SharedExpert,
    ) -> Self {
        let quantized = w
            .experts
            .first()
            .is_some_and(|e| matches!(e.up, W::Nvfp4(_) | W::Fp8(_)));
        let fold_rows = shared.fold_rows(fold_refusal(&w).is_none(), quantized);
        let mut fold_parts = 0;
        if fold_rows > 0 {
            // `Fold` gives the shared expert up; `Auto` keeps it for the calls it runs apart.
            let s = if fold_rows == usize::MAX {
                w.shared.take()
            } else {
                w.shared.clone()
            };
            if let (Some(s), Some(e)) = (s, w.experts.first()) {
                let parts = fold_shared(s, e.up.out_features());
                fold_parts = parts.len();
                w.experts.extend(parts);
            }
        }
        // The router runs in f32 whatever the activation dtype.
        let router = float::<2>(&w.router, dev, DType::F32);
        Moe {
            router_t: ops::contiguous(router.clone().transpose()),
            router,
            correction_bias: crate::util::float(&w.correction_bias, dev, DType::F32),
            experts: Experts::from_weights(w.experts, dev, dtype),
            shared: w.shared.map(|s| Mlp::from_expert(s, dev, dtype)),
            route: RouteConfig {
                top_k: cfg.top_k,
                n_group: cfg.n_group,
                topk_group: cfg.topk_group,
                norm_topk_prob: cfg.norm_topk_prob,
                routed_scaling_factor: cfg.routed_scaling_factor as f32,
                weights_from_biased: bias_in_weights,
                fixed: 0,
            },
            fold_parts,
            fold_rows: if fold_parts > 0 { fold_rows } else { 0 },
        }
    }

    /// Whether the shared expert runs stacked with the routed experts for some calls
    /// (`SharedExpert::Fold`, `SharedExpert::Auto`).
    pub fn shared_folded(&self) -> bool {
        self.fold_rows > 0
    }

    /// Whether a call over `rows` rows runs the shared expert stacked with the routed experts:
    /// always under `Fold`; under `Auto` only a decode `step` (one token per sequence, the slot
    /// step) of up to its rows. A prefill's rows depend on the prompts admitted with it, and the
    /// fold rounds differently from the shared expert apart (its parts summed with the routed
    /// slots in f32), so an `Auto` prefill never folds: a prompt prefills the same alone or
    /// admitted beside others, and its decode steps fold alone as in a batch of up to `max_rows`.
    pub fn folds(&self, rows: usize, step: bool) -> bool {
        self.fold_parts > 0 && (self.fold_rows == usize::MAX || (step && rows <= self.fold_rows))
    }

    /// Routing for `x` `[N, hidden]`: `(indices [N, k], weights [N, k] f32)`.
    /// Where the call folds ([`Self::folds`]; `step`: a decode step), each token's top-k is
    /// followed by the shared expert's parts (weight 1).
    pub fn route(&self, x: Tensor<2>, step: bool) -> (Tensor<2, Int>, Tensor<2>) {
        let route = self.route_for(x.dims()[0], step);
        let logits = ops::dense_linear_t(x, self.router.clone(), self.router_t.clone());
        ops::moe_route(logits, self.correction_bias.clone(), &route)
    }

    /// The routing of a call over `rows` rows: the folded parts appended where it folds.
    fn route_for(&self, rows: usize, step: bool) -> RouteConfig {
        RouteConfig {
            fixed: if self.folds(rows, step) {
                self.fold_parts
            } else {
                0
            },
            ..self.route
        }
    }

    /// `h`: `[B, T, hidden]`, as a prefill (see [`Self::folds`]).
    pub fn forward(&self, h: Tensor<3>) -> Tensor<3> {
        self.forward_as(h, false)
    }

    /// [`Self::forward`] as a decode step (`step`) or a prefill.
    pub fn forward_as(&self, h: Tensor<3>, step: bool) -> Tensor<3> {
        let [b, t, hid] = h.dims();
        let out = match self.forward_parts(h, step) {
            MoeOut::Parts { routed, w, shared } => ops::moe_combine(routed, w, shared),
            MoeOut::Combined(y) => y,
        };
        out.reshape([b, t, hid])
    }

    /// The layer's output over `h` `[B, T, hidden]` as rows `[B·T, hidden]`, left uncombined
    /// where the experts are stacked (the decode step folds the combine into the next norm).
    /// `step`: a decode step ([`Self::folds`]).
    pub(crate) fn forward_parts(&self, h: Tensor<3>, step: bool) -> MoeOut {
        let [b, t, hid] = h.dims();
        let n = b * t;
        let x: Tensor<2> = h.reshape([n, hid]);
        let (idx, w) = self.route(x.clone(), step);
        // Routed slots, then (folded) the shared expert's (weight 1).
        let fold = self.folds(n, step);
        let route = self.route_for(n, step);
        let k = route.top_k + route.fixed;
        let dtype = x.dtype();
        let slots = idx.clone().reshape([n * k]);
        let routed = match &self.experts {
            Experts::Nvfp4 { up, down } => {
                let hs = ops::nvfp4_expert_linear(x.clone(), slots.clone(), k, up, Epilogue::Relu2);
                Some(ops::nvfp4_expert_linear(hs, slots, 1, down, Epilogue::None))
            }
            Experts::Fp8 { up, down } => {
                let hs = ops::fp8_expert_linear(x.clone(), slots.clone(), k, up, Epilogue::Relu2);
                Some(ops::fp8_expert_linear(hs, slots, 1, down, Epilogue::None))
            }
            Experts::Dense { up, down } => {
                let xs = x
                    .clone()
                    .unsqueeze_dim::<3>(1)
                    .expand([n, k, hid])
                    .reshape([n * k, hid]);
                let hs = ops::relu2(dense_expert_linear(xs, slots.clone(), up));
                Some(dense_expert_linear(hs, slots, down))
            }
            Experts::PerExpert(_) => None,
        };
        // The routed sum accumulates in f32 (as HF does), returns to the activation dtype, then
        // the shared expert is added: one launch for the stacked forms (`moe_combine`, or the
        // next norm's).
        let shared = match fold {
            true => None,
            false => self.shared.as_ref().map(|s| s.forward(x.clone())),
        };
        match routed {
            Some(routed) => MoeOut::Parts { routed, w, shared },
            None => {
                let out = from_f32(self.per_expert(x.clone(), idx, w), dtype);
                MoeOut::Combined(match shared {
                    Some(s) => out + s,
                    None => out,
                })
            }
        }
    }

    /// Mixed-form experts: tokens grouped by expert on the host, f32 sum.
    #[allow(
        clippy::expect_used,
        reason = "convert::<T>() makes the elements T, so into_vec::<T> cannot fail"
    )]
    fn per_expert(&self, x: Tensor<2>, idx: Tensor<2, Int>, w: Tensor<2>) -> Tensor<2> {
        let Experts::PerExpert(experts) = &self.experts else {
            unreachable!("per_expert on stacked experts")
        };
        let [n, hid] = x.dims();
        let dev = x.device();
        let k = self.route.top_k;
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
        let mut out = Tensor::<2>::zeros([n, hid], (&dev, DType::F32));
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
            let tok_t = Tensor::<1, Int>::from_data(TensorData::new(toks, [m]), &dev);
            let ye = to_f32(expert.forward(x.clone().select(0, tok_t.clone())));
            let wt = Tensor::<1>::from_data(TensorData::new(ws, [m]), (&dev, DType::F32))
                .unsqueeze_dim::<2>(1);
            out = out.select_assign(0, tok_t, ye * wt, IndexingUpdateOp::Add);
        }
        out
    }
}

impl Experts {
    /// Puts one layer's routed experts on the device: stacked when every expert has the same form
    /// (NVFP4, FP8 or dense), expert by expert otherwise.
    pub fn from_weights(
        experts: Vec<nemotron_loader::ExpertWeights>,
        dev: &Device,
        dtype: DType,
    ) -> Self {
        let all = |f: fn(&W) -> bool| {
            !experts.is_empty() && experts.iter().all(|e| f(&e.up) && f(&e.down))
        };
        if all(|w| matches!(w, W::Nvfp4(_))) {
            let (up, down): (Vec<_>, Vec<_>) = experts
                .into_iter()
                .map(|e| match (e.up, e.down) {
                    (W::Nvfp4(u), W::Nvfp4(d)) => (nvfp4_matrix(u), nvfp4_matrix(d)),
                    _ => unreachable!("checked: all NVFP4"),
                })
                .unzip();
            return Experts::Nvfp4 {
                up: Nvfp4Weights::upload(&up, dev),
                down: Nvfp4Weights::upload(&down, dev),
            };
        }
        if all(|w| matches!(w, W::Fp8(_))) {
            let (up, down): (Vec<_>, Vec<_>) = experts
                .into_iter()
                .map(|e| match (e.up, e.down) {
                    (W::Fp8(u), W::Fp8(d)) => (fp8_matrix(u), fp8_matrix(d)),
                    _ => unreachable!("checked: all FP8"),
                })
                .unzip();
            return Experts::Fp8 {
                up: Fp8Weights::upload(&up, dev),
                down: Fp8Weights::upload(&down, dev),
            };
        }
        if all(|w| matches!(w, W::Dense(_))) {
            let mut ups = Vec::with_capacity(experts.len());
            let mut downs = Vec::with_capacity(experts.len());
            for e in experts {
                let (W::Dense(u), W::Dense(d)) = (e.up, e.down) else {
                    unreachable!("checked: all dense")
                };
                ups.push(float_transposed(&u, dev, dtype));
                downs.push(float_transposed(&d, dev, dtype));
            }
            return Experts::Dense {
                up: Tensor::stack(ups, 0),
                down: Tensor::stack(downs, 0),
            };
        }
        Experts::PerExpert(
            experts
                .into_iter()
                .map(|e| Mlp::from_expert(e, dev, dtype))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    //! The stacked expert paths (indices read on the device) against the expert-by-expert path
    //! (routing read on the host), same weights, on the host (Flex).
    use super::*;
    use crate::layers::linear::Linear;
    use nemotron_kernels::{Fp8Matrix, Nvfp4Matrix};
    use nemotron_loader::formats as fmt;

    fn vals(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        nemotron_kernels::rng::Lcg::new(seed).vec(n, scale)
    }

    fn tensor<const D: usize>(v: Vec<f32>, shape: [usize; D]) -> Tensor<D> {
        Tensor::from_data(TensorData::new(v, shape), (&Device::flex(), DType::F32))
    }

    /// (max |a − b|, max |b|).
    fn max_diff(a: &[f32], b: &[f32]) -> (f32, f32) {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        (d, scale)
    }

    fn moe(experts: Experts, hid: usize, e: usize, groups: usize) -> Moe {
        let router = tensor(vals(e * hid, 1, 1.0), [e, hid]);
        Moe {
            router_t: ops::contiguous(router.clone().transpose()),
            router,
            correction_bias: tensor(vals(e, 2, 0.1), [e]),
            experts,
            shared: None,
            route: RouteConfig {
                top_k: 2,
                n_group: groups,
                topk_group: 1,
                norm_topk_prob: true,
                routed_scaling_factor: 2.5,
                weights_from_biased: false,
                fixed: 0,
            },
            fold_parts: 0,
            fold_rows: 0,
        }
    }

    #[test]
    fn stacked_experts_equal_expert_by_expert() {
        let dev = Device::flex();
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
        let dense = |seed: u64, r: usize, c: usize| tensor(vals(r * c, seed, 0.2), [r, c]);
        let dup: Vec<_> = (0..e).map(|i| dense(50 + i as u64, hid, inter)).collect();
        let ddown: Vec<_> = (0..e).map(|i| dense(60 + i as u64, inter, hid)).collect();
        let per = |up: &dyn Fn(usize) -> Linear, down: &dyn Fn(usize) -> Linear| {
            Experts::PerExpert((0..e).map(|i| Mlp::new(up(i), down(i))).collect())
        };
        let cases: Vec<(&str, Experts, Experts)> = vec![
            (
                "nvfp4",
                Experts::Nvfp4 {
                    up: Nvfp4Weights::upload(&ups, &dev),
                    down: Nvfp4Weights::upload(&downs, &dev),
                },
                per(
                    &|i| Linear::Nvfp4(Nvfp4Weights::upload(&ups[i..i + 1], &dev)),
                    &|i| Linear::Nvfp4(Nvfp4Weights::upload(&downs[i..i + 1], &dev)),
                ),
            ),
            (
                "fp8",
                Experts::Fp8 {
                    up: Fp8Weights::upload(&up8, &dev),
                    down: Fp8Weights::upload(&down8, &dev),
                },
                per(
                    &|i| Linear::Fp8(Fp8Weights::upload(&up8[i..i + 1], &dev)),
                    &|i| Linear::Fp8(Fp8Weights::upload(&down8[i..i + 1], &dev)),
                ),
            ),
            (
                "dense",
                Experts::Dense {
                    up: Tensor::stack(dup.clone(), 0),
                    down: Tensor::stack(ddown.clone(), 0),
                },
                per(&|i| Linear::Dense(dup[i].clone().transpose()), &|i| {
                    Linear::Dense(ddown[i].clone().transpose())
                }),
            ),
        ];
        let h = tensor(vals(2 * 5 * hid, 3, 1.0), [2, 5, hid]);
        for (name, stacked, per) in cases {
            for groups in [1, 2] {
                let a: Vec<f32> = moe(stacked.clone(), hid, e, groups)
                    .forward(h.clone())
                    .into_data()
                    .into_vec()
                    .unwrap();
                let b: Vec<f32> = moe(per.clone(), hid, e, groups)
                    .forward(h.clone())
                    .into_data()
                    .into_vec()
                    .unwrap();
                let (d, scale) = max_diff(&a, &b);
                assert!(scale > 0.1, "{name}: a vanishing output proves nothing");
                assert!(
                    d <= 1e-5 * scale,
                    "{name} groups {groups}: {d} at scale {scale}"
                );
            }
        }
    }

    /// The shared expert folded into the stack (`SharedExpert::Fold`, and `Auto` up to its rows)
    /// gives the layer's output apart, for NVFP4, FP8 and dense experts, with a shared width of
    /// 1.5 experts (the second part half zero padding): the f32 sums in another order only.
    #[test]
    fn folded_shared_expert_equals_apart() {
        use nemotron_loader::{
            DType as HD, ExpertWeights, Fp8Weight, HostTensor, Nvfp4Activations, Nvfp4Weight,
        };
        let dev = Device::flex();
        let (hid, inter, shared_w, e) = (32, 32, 48, 4);
        let host = |name: &str, dtype: HD, shape: Vec<usize>, bytes: Vec<u8>| HostTensor {
            name: name.into(),
            dtype,
            shape,
            bytes,
        };
        let forms: [(&str, fn(usize, usize, u64) -> W); 3] = [
            ("nvfp4", |r, c, seed| {
                let enc = fmt::nvfp4_encode(&vals(r * c, seed, 0.2), r, c);
                W::Nvfp4(Nvfp4Weight {
                    out_features: r,
                    in_features: c,
                    packed: HostTensor {
                        name: "p".into(),
                        dtype: HD::U8,
                        shape: vec![r, c / 2],
                        bytes: enc.packed,
                    },
                    block_scales: HostTensor {
                        name: "s".into(),
                        dtype: HD::F8E4M3,
                        shape: vec![r, c / 16],
                        bytes: enc.block_scales,
                    },
                    weight_scale_2: enc.weight_scale_2,
                    input_scale: None,
                    activations: Nvfp4Activations::W4A16,
                })
            }),
            ("fp8", |r, c, seed| {
                let (q, ws) = fmt::fp8_encode(&vals(r * c, seed, 0.2));
                W::Fp8(Fp8Weight {
                    out_features: r,
                    in_features: c,
                    weight: HostTensor {
                        name: "w".into(),
                        dtype: HD::F8E4M3,
                        shape: vec![r, c],
                        bytes: q,
                    },
                    weight_scale: ws,
                    input_scale: 0.015 + 0.001 * (seed % 11) as f32,
                })
            }),
            ("dense", |r, c, seed| {
                let v = vals(r * c, seed, 0.2);
                W::Dense(HostTensor {
                    name: "d".into(),
                    dtype: HD::F32,
                    shape: vec![r, c],
                    bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                })
            }),
        ];
        let cfg = MoeConfig {
            n_routed_experts: e,
            top_k: 2,
            intermediate_size: inter,
            n_shared_experts: 1,
            shared_intermediate_size: shared_w,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: 2.5,
            bias: true,
        };
        let h = tensor(vals(2 * 5 * hid, 3, 1.0), [2, 5, hid]);
        for (name, make) in forms {
            let f32s = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
            let weights = MoeWeights {
                router: host("r", HD::F32, vec![e, hid], f32s(vals(e * hid, 1, 1.0))),
                correction_bias: host("b", HD::F32, vec![e], f32s(vals(e, 2, 0.1))),
                experts: (0..e as u64)
                    .map(|i| ExpertWeights {
                        up: make(inter, hid, 10 + i),
                        down: make(hid, inter, 20 + i),
                    })
                    .collect(),
                shared: Some(ExpertWeights {
                    up: make(shared_w, hid, 30),
                    down: make(hid, shared_w, 31),
                }),
            };
            assert_eq!(fold_refusal(&weights), None, "{name}");
            // The 10 rows of `h` folded or not, as each mode says for them.
            let run = |mode, folds: bool| -> Vec<f32> {
                let m = Moe::from_weights(weights.clone(), &cfg, &dev, DType::F32, false, mode);
                let held = match mode {
                    SharedExpert::Apart => false,
                    SharedExpert::Fold => true,
                    SharedExpert::Auto { .. } => name != "dense",
                };
                assert_eq!(m.fold_parts, usize::from(held) * 2, "{name} {mode:?}");
                assert_eq!(
                    m.shared.is_some(),
                    mode != SharedExpert::Fold,
                    "{name} {mode:?}"
                );
                assert_eq!(m.folds(10, true), folds, "{name} {mode:?}");
                // A prefill folds under `Fold` alone.
                assert_eq!(
                    m.folds(10, false),
                    held && mode == SharedExpert::Fold,
                    "{name} {mode:?} prefill"
                );
                let (idx, _) = m.route(h.clone().reshape([10, hid]), true);
                assert_eq!(
                    idx.dims(),
                    [10, 2 + usize::from(folds) * 2],
                    "{name} {mode:?}"
                );
                m.forward_as(h.clone(), true)
                    .into_data()
                    .into_vec()
                    .unwrap()
            };
            let a = run(SharedExpert::Apart, false);
            // Auto holds both layouts: decode steps folded up to its rows, apart past them;
            // dense experts never fold under it.
            for (mode, folds) in [
                (SharedExpert::Fold, true),
                (SharedExpert::Auto { max_rows: 10 }, name != "dense"),
                (SharedExpert::Auto { max_rows: 9 }, false),
            ] {
                let b = run(mode, folds);
                let (d, scale) = max_diff(&b, &a);
                assert!(scale > 0.1, "{name}: a vanishing output proves nothing");
                assert!(
                    d <= 1e-5 * scale,
                    "{name} {mode:?}: off apart by {d} at scale {scale}"
                );
            }
        }
    }
}
