//! The MoE mixer: f32 sigmoid router, grouped top-k selection on `sigmoid + correction bias`,
//! weights from the unbiased scores (renormalized, times `routed_scaling_factor`), non-gated relu²
//! experts, plus a shared expert on the same input.

use crate::mlp::Mlp;
use burn::tensor::{activation::sigmoid, DType, IndexingUpdateOp, Int, Tensor, TensorData};
use nemotron_kernels::NemotronBackend;

/// Masked scores: finite (WGSL has no infinity literal) and far below any real score.
const MASKED: f32 = -1.0e30;
use nemotron_loader::config::MoeConfig;

#[derive(Debug, Clone)]
pub struct Moe<B: NemotronBackend> {
    /// Router, transposed: `[hidden, E]`, f32.
    pub router_t: Tensor<B, 2>,
    /// `[E]`, added to the scores for selection only.
    pub correction_bias: Tensor<B, 1>,
    pub experts: Vec<Mlp<B>>,
    pub shared: Option<Mlp<B>>,
    pub cfg: MoeConfig,
}

impl<B: NemotronBackend> Moe<B> {
    /// Routing for `x` `[N, hidden]`: `(indices [N, k], weights [N, k])`.
    pub fn route(
        &self,
        x: Tensor<B, 2>,
        bias_in_weights: bool,
    ) -> (Tensor<B, 2, Int>, Tensor<B, 2>) {
        let c = &self.cfg;
        let n = x.dims()[0];
        let e = c.n_routed_experts;
        // The router runs in f32 whatever the activation dtype (its weights are kept f32).
        let x = if x.dtype() == DType::F32 {
            x
        } else {
            x.cast(DType::F32)
        };
        let scores = sigmoid(crate::linear::mm(x, self.router_t.clone()));
        let choice = scores.clone() + self.correction_bias.clone().unsqueeze::<2>();
        let choice = if c.n_group > 1 {
            // DeepSeek-V3 rule: a group's score is the sum of its two best biased scores; keep the
            // `topk_group` best groups and select only among their experts.
            let per = e / c.n_group;
            let grouped = choice.clone().reshape([n, c.n_group, per]);
            let group_scores = grouped
                .topk(2.min(per), 2)
                .sum_dim(2)
                .reshape([n, c.n_group]);
            let (_, keep) = group_scores.topk_with_indices(c.topk_group, 1);
            let keep_mask = scatter_ones(Tensor::zeros([n, c.n_group], &choice.device()), keep);
            let dropped = keep_mask
                .unsqueeze_dim::<3>(2)
                .expand([n, c.n_group, per])
                .reshape([n, e])
                .lower_elem(0.5);
            choice.mask_fill(dropped, MASKED)
        } else {
            choice
        };
        let (_, idx) = choice.clone().topk_with_indices(c.top_k, 1);
        let source = if bias_in_weights { choice } else { scores };
        let mut w = source.gather(1, idx.clone());
        if c.norm_topk_prob {
            w = w.clone() / (w.sum_dim(1) + 1e-20);
        }
        (idx, w * c.routed_scaling_factor)
    }

    /// `h`: `[B, T, hidden]`.
    pub fn forward(&self, h: Tensor<B, 3>, bias_in_weights: bool) -> Tensor<B, 3> {
        let [b, t, hid] = h.dims();
        let dev = h.device();
        let x: Tensor<B, 2> = h.reshape([b * t, hid]);
        let (idx, w) = self.route(x.clone(), bias_in_weights);
        let k = self.cfg.top_k;
        // Group tokens by expert on the host (the routing is small: N × k).
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
        // The routed sum accumulates in f32 (as HF does), then returns to the activation dtype.
        let dtype = x.dtype();
        let mut out = Tensor::<B, 2>::zeros([b * t, hid], (&dev, DType::F32));
        for (e, expert) in self.experts.iter().enumerate() {
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
            let ye = expert.forward(x.clone().select(0, tok_t.clone()));
            let ye = if ye.dtype() == DType::F32 {
                ye
            } else {
                ye.cast(DType::F32)
            };
            let wt = Tensor::<B, 1>::from_data(TensorData::new(ws, [m]), (&dev, DType::F32))
                .unsqueeze_dim::<2>(1);
            out = out.select_assign(0, tok_t, ye * wt, IndexingUpdateOp::Add);
        }
        let mut out = if dtype == DType::F32 {
            out
        } else {
            out.cast(dtype)
        };
        if let Some(s) = &self.shared {
            out = out + s.forward(x);
        }
        out.reshape([b, t, hid])
    }
}

/// Sets `mask[r, keep[r, j]] = 1` for every `j`.
fn scatter_ones<B: NemotronBackend>(mask: Tensor<B, 2>, keep: Tensor<B, 2, Int>) -> Tensor<B, 2> {
    let ones = Tensor::<B, 2>::ones(keep.dims(), &mask.device());
    mask.scatter(1, keep, ones, IndexingUpdateOp::Add)
}
