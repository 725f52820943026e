//! GQA causal attention without positional encoding (NemotronH has no RoPE).

use crate::cache::{BatchLayer, KvCacheDtype, LayerState, SequenceState, SlotLayer};
use crate::layers::linear::Linear;
use crate::util::from_vec;
use burn::tensor::{activation::softmax, DType, Device, Int, Tensor, TensorData};
use nemotron_kernels::{ops, Epilogue};
use nemotron_loader::config::AttentionConfig;
use nemotron_loader::AttentionWeights;

/// Masked scores: finite (WGSL has no infinity literal) and far below any real score.
const MASKED: f32 = -1.0e30;

/// The most f32 scores (`B · heads · T²`) the batched prefill of fresh sequences holds at once
/// (1 GiB); larger batches take one sequence at a time, as long prompts did before.
const FRESH_MAX_SCORES: usize = 1 << 28;

/// The q/k/v projections: dense weights stacked into one `[(NH + 2·KVH)·D, hidden]` matrix (one
/// launch for the three, and decode attention reads its row in place), other forms apart.
#[derive(Debug, Clone)]
enum Qkv {
    Fused(Linear),
    Separate { q: Linear, k: Linear, v: Linear },
}

#[derive(Debug, Clone)]
pub struct Attention {
    qkv: Qkv,
    o: Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// FP8 KV-cache scales shipped with the checkpoint (`k_scale`, `v_scale`): applied by an
    /// FP8 slot cache ([`KvCacheDtype::Fp8`]), 1.0 where the checkpoint ships none.
    pub kv_scales: Option<(f32, f32)>,
    /// Rotary embeddings with this base (a deviation; `None` for the model).
    rope_theta: Option<f32>,
}

impl Attention {
    pub fn from_weights(
        w: AttentionWeights,
        cfg: &AttentionConfig,
        dev: &Device,
        dtype: DType,
        rope_theta: Option<f32>,
    ) -> Self {
        let (q, k, v) = (
            Linear::from_weight(w.q, dev, dtype),
            Linear::from_weight(w.k, dev, dtype),
            Linear::from_weight(w.v, dev, dtype),
        );
        let qkv = match (q, k, v) {
            (Linear::Dense(q), Linear::Dense(k), Linear::Dense(v)) => Qkv::Fused(Linear::Dense(
                ops::contiguous(Tensor::cat(vec![q, k, v], 0)),
            )),
            (q, k, v) => Qkv::Separate { q, k, v },
        };
        Attention {
            qkv,
            o: Linear::from_weight(w.o, dev, dtype),
            heads: cfg.num_heads,
            kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            kv_scales: w.k_scale.zip(w.v_scale),
            rope_theta,
        }
    }

    /// Whether this layer carries the RoPE deviation (the slot path does not implement it).
    pub(crate) fn has_rope(&self) -> bool {
        self.rope_theta.is_some()
    }

    /// Whether `k` and `v` are this layer's keys for `position` tokens (`[KVH, position, D]`
    /// each, or none before the first token).
    pub(crate) fn check_state(
        &self,
        k: &Option<Tensor<3>>,
        v: &Option<Tensor<3>>,
        position: usize,
    ) -> Result<(), String> {
        let want = [self.kv_heads, position, self.head_dim];
        match (k, v) {
            (None, None) if position == 0 => Ok(()),
            (Some(k), Some(v)) if k.dims() == want && v.dims() == want => Ok(()),
            _ => Err(format!(
                "holds keys {:?} and values {:?} where a sequence at position {position} needs \
                 {want:?} each",
                k.as_ref().map(|t| t.dims()),
                v.as_ref().map(|t| t.dims())
            )),
        }
    }

    /// Device bytes one slot of `capacity` tokens takes in [`Self::new_slots`]'s pools: K and
    /// V `[KVH, capacity, D]` each in `dtype`, or one byte an element in an FP8 cache.
    pub fn slot_bytes(&self, capacity: usize, dtype: DType, kv: KvCacheDtype) -> usize {
        let elem = match kv {
            KvCacheDtype::Auto => dtype.size(),
            KvCacheDtype::Fp8 => 1,
        };
        2 * self.kv_heads * capacity * self.head_dim * elem
    }

    /// The scales an FP8 cache divides keys and values by: the checkpoint's, else 1.0 (Nano's
    /// NVFP4 checkpoint declares an FP8 KV cache and ships none).
    pub(crate) fn kv8_scales(&self) -> (f32, f32) {
        self.kv_scales.unwrap_or((1.0, 1.0))
    }

    /// Why this layer cannot hold an FP8 cache, if it cannot.
    pub(crate) fn check_kv8(&self) -> Result<(), String> {
        let (ks, vs) = self.kv8_scales();
        if !ops::kv8_fits(self.head_dim) {
            Err(format!(
                "head dim {} is not a multiple of 4 dividing 128",
                self.head_dim
            ))
        } else if !(ks > 0.0 && ks.is_finite() && vs > 0.0 && vs.is_finite()) {
            Err(format!(
                "k_scale {ks} and v_scale {vs} must be positive and finite"
            ))
        } else if self.rope_theta.is_some() {
            Err("the RoPE deviation exists for the ragged reference only".into())
        } else {
            Ok(())
        }
    }

    /// Zero KV pools for `slots` sequences of up to `capacity` tokens: `[S, KVH, cap, D]` each,
    /// in the activation dtype, or `[S, KVH, cap, D/4]` I32 words of E4M3 codes (FP8).
    pub fn new_slots(
        &self,
        slots: usize,
        capacity: usize,
        dev: &Device,
        dtype: DType,
        kv: KvCacheDtype,
    ) -> SlotLayer {
        match kv {
            KvCacheDtype::Auto => {
                let shape = [slots, self.kv_heads, capacity, self.head_dim];
                SlotLayer::Attention {
                    k: ops::contiguous(Tensor::zeros(shape, (dev, dtype))),
                    v: ops::contiguous(Tensor::zeros(shape, (dev, dtype))),
                }
            }
            KvCacheDtype::Fp8 => {
                let shape = [slots, self.kv_heads, capacity, self.head_dim / 4];
                SlotLayer::Attention8 {
                    k: ops::contiguous_int(Tensor::zeros(shape, (dev, DType::I32))),
                    v: ops::contiguous_int(Tensor::zeros(shape, (dev, DType::I32))),
                }
            }
        }
    }

    /// One token per row over slot KV caches: `h` `[B, 1, hidden]`; appends this token's K/V at
    /// each slot's length (`lens`, not advanced here) and attends over the slot's keys.
    pub fn step(
        &self,
        h: Tensor<3>,
        pools: &mut SlotLayer,
        lens: &Tensor<1, Int>,
        slots: &Tensor<1, Int>,
    ) -> Tensor<3> {
        let [bsz, _, _] = h.dims();
        let (nh, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
        let scale = (hd as f64).powf(-0.5) as f32;
        if let SlotLayer::Attention8 { k: kpool, v: vpool } = pools {
            // One `q | k | v` row per token (the fused projection's own, else the three cat).
            let qkv = match &self.qkv {
                Qkv::Fused(w) => w.forward(h, Epilogue::None),
                Qkv::Separate { q, k, v } => Tensor::cat(
                    vec![
                        q.forward(h.clone(), Epilogue::None),
                        k.forward(h.clone(), Epilogue::None),
                        v.forward(h, Epilogue::None),
                    ],
                    2,
                ),
            };
            let (o, kp, vp) = ops::attention_step_qkv8(
                qkv.reshape([bsz, (nh + 2 * kvh) * hd]),
                nh,
                kpool.clone(),
                vpool.clone(),
                lens,
                slots,
                scale,
                self.kv8_scales(),
            );
            *kpool = kp;
            *vpool = vp;
            return self.o.forward(o.reshape([bsz, 1, nh * hd]), Epilogue::None);
        }
        let SlotLayer::Attention { k: kpool, v: vpool } = pools else {
            panic!("an attention layer's slots hold {pools:?}")
        };
        let (o, kp, vp) = match &self.qkv {
            Qkv::Fused(w) => {
                let y = w
                    .forward(h, Epilogue::None)
                    .reshape([bsz, (nh + 2 * kvh) * hd]);
                ops::attention_step_qkv(y, nh, kpool.clone(), vpool.clone(), lens, slots, scale)
            }
            Qkv::Separate { q, k, v } => {
                let q = q.forward(h.clone(), Epilogue::None).reshape([bsz, nh, hd]);
                let k = k.forward(h.clone(), Epilogue::None).reshape([bsz, kvh, hd]);
                let v = v.forward(h, Epilogue::None).reshape([bsz, kvh, hd]);
                ops::attention_step(q, k, v, kpool.clone(), vpool.clone(), lens, slots, scale)
            }
        };
        *kpool = kp;
        *vpool = vp;
        self.o.forward(o.reshape([bsz, 1, nh * hd]), Epilogue::None)
    }

    /// The keys and values a prefilled sequence holds for this layer (`[KVH, S, D]` each).
    pub(crate) fn prefix(state: &LayerState) -> Option<(Tensor<3>, Tensor<3>)> {
        match state {
            LayerState::Attention {
                k: Some(k),
                v: Some(v),
            } => Some((k.clone(), v.clone())),
            _ => None,
        }
    }

    pub fn forward(
        &self,
        h: Tensor<3>,
        lens: &[usize],
        states: &mut [&mut SequenceState],
        layer: usize,
    ) -> Tensor<3> {
        self.forward_kept(h, lens, states, layer).0
    }

    /// [`Self::forward`], also returning the batch's keys and values whole where the batched
    /// prefill of fresh sequences ran (`None` where sequences ran one at a time).
    pub(crate) fn forward_kept(
        &self,
        h: Tensor<3>,
        lens: &[usize],
        states: &mut [&mut SequenceState],
        layer: usize,
    ) -> (Tensor<3>, Option<BatchLayer>) {
        let [bsz, t, _] = h.dims();
        let dev = h.device();
        let dtype = h.dtype();
        let (nh, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
        // `rows`: what the flash kernel reads the queries from (a fused row in place).
        let (q, k, v, rows) = match &self.qkv {
            Qkv::Fused(w) => {
                let y = w.forward(h, Epilogue::None);
                let (a, b) = (nh * hd, (nh + kvh) * hd);
                (
                    y.clone().slice_dim(2, 0..a),
                    y.clone().slice_dim(2, a..b),
                    y.clone().slice_dim(2, b..b + kvh * hd),
                    y,
                )
            }
            Qkv::Separate { q, k, v } => {
                let q = q.forward(h.clone(), Epilogue::None);
                (
                    q.clone(),
                    k.forward(h.clone(), Epilogue::None),
                    v.forward(h, Epilogue::None),
                    q,
                )
            }
        };
        let scale = (hd as f64).powf(-0.5);
        let fresh = states.iter().all(|st| {
            st.position == 0
                && matches!(st.layers[layer], LayerState::Attention { k: None, v: None })
        });
        if self.rope_theta.is_none() && ops::attention_prefill_planned(&dev, hd) {
            return self.forward_flash(rows, k, v, lens, states, layer, fresh);
        }
        if fresh && self.rope_theta.is_none() && bsz > 1 && bsz * nh * t * t <= FRESH_MAX_SCORES {
            let (o, k, v) = self.forward_fresh(q, k, v, lens, states, layer);
            return (o, Some(BatchLayer::Attention { k, v }));
        }
        let mut outs = Vec::with_capacity(bsz);
        for (b, st) in states.iter_mut().enumerate() {
            let len = lens[b];
            let past = st.position;
            let per_head = |x: Tensor<3>, heads: usize| -> Tensor<3> {
                x.slice_dim(0, b..b + 1)
                    .slice_dim(1, 0..len)
                    .reshape([len, heads, hd])
                    .swap_dims(0, 1)
            };
            let mut qb = per_head(q.clone(), nh);
            let mut kb = per_head(k.clone(), kvh);
            let vb = per_head(v.clone(), kvh);
            if let Some(theta) = self.rope_theta {
                qb = rope(qb, past, theta);
                kb = rope(kb, past, theta);
            }
            let LayerState::Attention { k: kc, v: vc } = &mut st.layers[layer] else {
                panic!("layer {layer} holds no attention state")
            };
            let kall = match kc.take() {
                Some(prev) => Tensor::cat(vec![prev, kb], 1),
                None => kb,
            };
            let vall = match vc.take() {
                Some(prev) => Tensor::cat(vec![prev, vb], 1),
                None => vb,
            };
            *kc = Some(kall.clone());
            *vc = Some(vall.clone());
            let s = past + len;
            // Query head i reads kv head i / (nh / kvh).
            let rep = nh / kvh;
            let expand = |x: Tensor<3>| -> Tensor<3> {
                x.unsqueeze_dim::<4>(1)
                    .expand([kvh, rep, s, hd])
                    .reshape([nh, s, hd])
            };
            let scores = ops::matmul(qb, expand(kall).swap_dims(1, 2)) * scale;
            // Softmax in f32 whatever the activation dtype, then back for the value product.
            let scores = crate::util::to_f32(scores);
            // A single new token sees every key: no mask (and no host write in a decode step).
            let scores = if len > 1 {
                // Key j is masked for query i when j > past + i: built on the device (a host
                // mask was T·S bools built and uploaded per layer: 64 M at an 8K prompt).
                let rows = Tensor::<1, Int>::arange(past as i64..(past + len) as i64, &dev)
                    .reshape([len, 1])
                    .expand([len, s]);
                let cols = Tensor::<1, Int>::arange(0..s as i64, &dev)
                    .reshape([1, s])
                    .expand([len, s]);
                let mask = cols.greater(rows).unsqueeze::<3>().expand([nh, len, s]);
                scores.mask_fill(mask, MASKED)
            } else {
                scores
            };
            let probs = crate::util::from_f32(softmax(scores, 2), vall.dtype());
            let o = ops::matmul(probs, expand(vall))
                .swap_dims(0, 1)
                .reshape([len, nh * hd]);
            let o = if len < t {
                Tensor::cat(vec![o, Tensor::zeros([t - len, nh * hd], (&dev, dtype))], 0)
            } else {
                o
            };
            outs.push(o);
        }
        (
            self.o.forward(crate::util::stack(outs), Epilogue::None),
            None,
        )
    }

    /// Prefill attention through [`ops::attention_prefill`] (the flash kernel on device backends:
    /// no `[heads, T, S]` scores in memory): the queries read from `rows` (`[B, T, W]`, query
    /// head `h` at columns `h·D ..`) in place. Fresh sequences (no keys yet) attend over the
    /// batch's own keys `[B, KVH, T, D]` in one launch, which also come back for the slots;
    /// sequences with keys append theirs and run one launch each over their whole keys.
    #[allow(clippy::too_many_arguments)]
    fn forward_flash(
        &self,
        rows: Tensor<3>,
        k: Tensor<3>,
        v: Tensor<3>,
        lens: &[usize],
        states: &mut [&mut SequenceState],
        layer: usize,
        fresh: bool,
    ) -> (Tensor<3>, Option<BatchLayer>) {
        let [bsz, t, _] = rows.dims();
        let (nh, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
        let scale = (hd as f64).powf(-0.5) as f32;
        // [B, T, KVH·D] → [B, KVH, T, D], dense: the kernel's pool and the states' source.
        let heads_major = |x: Tensor<3>| -> Tensor<4> {
            ops::contiguous(x.reshape([bsz, t, kvh, hd]).swap_dims(1, 2))
        };
        let (kh, vh) = (heads_major(k), heads_major(v));
        if fresh {
            for (b, st) in states.iter_mut().enumerate() {
                let one = |x: &Tensor<4>| -> Tensor<3> {
                    x.clone()
                        .slice_dim(0, b..b + 1)
                        .slice_dim(2, 0..lens[b])
                        .reshape([kvh, lens[b], hd])
                };
                st.layers[layer] = LayerState::Attention {
                    k: Some(one(&kh)),
                    v: Some(one(&vh)),
                };
            }
            let slots: Vec<usize> = (0..bsz).collect();
            let o = ops::attention_prefill(
                rows,
                kh.clone(),
                vh.clone(),
                &slots,
                &vec![0; bsz],
                lens,
                nh,
                scale,
            );
            let out = self.o.forward(o, Epilogue::None);
            return (out, Some(BatchLayer::Attention { k: kh, v: vh }));
        }
        let mut outs = Vec::with_capacity(bsz);
        for (b, st) in states.iter_mut().enumerate() {
            let (len, past) = (lens[b], st.position);
            let LayerState::Attention { k: kc, v: vc } = &mut st.layers[layer] else {
                panic!("layer {layer} holds no attention state")
            };
            let mine = |x: &Tensor<4>| -> Tensor<3> {
                x.clone()
                    .slice_dim(0, b..b + 1)
                    .slice_dim(2, 0..len)
                    .reshape([kvh, len, hd])
            };
            let kall = match kc.take() {
                Some(prev) => Tensor::cat(vec![prev, mine(&kh)], 1),
                None => mine(&kh),
            };
            let vall = match vc.take() {
                Some(prev) => Tensor::cat(vec![prev, mine(&vh)], 1),
                None => mine(&vh),
            };
            *kc = Some(kall.clone());
            *vc = Some(vall.clone());
            let o = ops::attention_prefill(
                rows.clone().slice_dim(0, b..b + 1),
                kall.unsqueeze_dim(0),
                vall.unsqueeze_dim(0),
                &[0],
                &[past],
                &[len],
                nh,
                scale,
            );
            outs.push(o.reshape([t, nh * hd]));
        }
        (
            self.o.forward(crate::util::stack(outs), Epilogue::None),
            None,
        )
    }

    /// The prefill of `B` sequences that hold no keys yet (no RoPE) in one batched pass instead
    /// of one pass per sequence (64 × 6 layers of host-driven ops at 64 × 128): query heads
    /// grouped by their kv head, `[B·KVH, rep·T, D] · [B·KVH, D, T]` (no expanded K/V copies),
    /// one causal mask for all, rows past a sequence's length zeroed as the per-sequence pass
    /// leaves them. The same operations per element as that pass (scores scaled in the
    /// activation dtype, softmax in f32, `P · V` in the activation dtype). Returns the output and
    /// the batch's keys and values `[B, KVH, T, D]`.
    fn forward_fresh(
        &self,
        q: Tensor<3>,
        k: Tensor<3>,
        v: Tensor<3>,
        lens: &[usize],
        states: &mut [&mut SequenceState],
        layer: usize,
    ) -> (Tensor<3>, Tensor<4>, Tensor<4>) {
        let [bsz, t, _] = q.dims();
        let (nh, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
        let rep = nh / kvh;
        let (dev, dtype) = (q.device(), q.dtype());
        // Query head `h` reads kv head `h / rep`: [B, T, KVH, rep, D] → [B·KVH, rep·T, D].
        let qg = q
            .reshape([bsz, t, kvh, rep, hd])
            .permute([0, 2, 3, 1, 4])
            .reshape([bsz * kvh, rep * t, hd]);
        let kh = k.reshape([bsz, t, kvh, hd]).swap_dims(1, 2);
        let vh = v.reshape([bsz, t, kvh, hd]).swap_dims(1, 2);
        for (b, st) in states.iter_mut().enumerate() {
            let len = lens[b];
            let one = |x: &Tensor<4>| -> Tensor<3> {
                x.clone()
                    .slice_dim(0, b..b + 1)
                    .slice_dim(2, 0..len)
                    .reshape([kvh, len, hd])
            };
            st.layers[layer] = LayerState::Attention {
                k: Some(one(&kh)),
                v: Some(one(&vh)),
            };
        }
        let (kh_all, vh_all) = (kh.clone(), vh.clone());
        let scale = (hd as f64).powf(-0.5);
        let kt = kh.reshape([bsz * kvh, t, hd]).swap_dims(1, 2);
        let scores = ops::matmul(qg, kt) * scale;
        let scores = crate::util::to_f32(scores).reshape([bsz, nh, t, t]);
        // Key `j` masked for query `i` where `j > i`. A row within its sequence's length sees
        // only keys within it; rows past it are zeroed below, so no length mask is needed.
        let rows = Tensor::<1, Int>::arange(0..t as i64, &dev)
            .reshape([1, 1, t, 1])
            .expand([1, 1, t, t]);
        let cols = Tensor::<1, Int>::arange(0..t as i64, &dev).reshape([1, 1, 1, t]);
        let mask = cols.clone().expand([1, 1, t, t]).greater(rows);
        let scores = scores.mask_fill(mask.expand([bsz, nh, t, t]), MASKED);
        let probs =
            crate::util::from_f32(softmax(scores, 3), dtype).reshape([bsz * kvh, rep * t, t]);
        let o = ops::matmul(probs, vh.reshape([bsz * kvh, t, hd]))
            .reshape([bsz, kvh, rep, t, hd])
            .permute([0, 3, 1, 2, 4])
            .reshape([bsz, t, nh * hd]);
        // Rows past a sequence's length: zeros (the lengths in `arange`'s index dtype).
        let lens_t = Tensor::<1, Int>::from_data(
            TensorData::new(lens.iter().map(|&l| l as i64).collect::<Vec<_>>(), [bsz]),
            (&dev, cols.dtype()),
        );
        let valid = cols
            .reshape([1, t, 1])
            .expand([bsz, t, 1])
            .lower(lens_t.reshape([bsz, 1, 1]).expand([bsz, t, 1]));
        let o = o.mask_fill(valid.bool_not().expand([bsz, t, nh * hd]), 0.0);
        (self.o.forward(o, Epilogue::None), kh_all, vh_all)
    }
}

/// Rotary embedding over the full head dim (half-split convention) — only for the RoPE deviation.
fn rope(x: Tensor<3>, start: usize, theta: f32) -> Tensor<3> {
    let [h, len, hd] = x.dims();
    let half = hd / 2;
    let (dev, dtype) = (x.device(), x.dtype());
    let mut cos = Vec::with_capacity(len * half);
    let mut sin = Vec::with_capacity(len * half);
    for pos in start..start + len {
        for i in 0..half {
            let f = pos as f32 * theta.powf(-2.0 * i as f32 / hd as f32);
            cos.push(f.cos());
            sin.push(f.sin());
        }
    }
    let cos = from_vec::<2>(cos, [len, half], &dev, dtype)
        .unsqueeze::<3>()
        .expand([h, len, half]);
    let sin = from_vec::<2>(sin, [len, half], &dev, dtype)
        .unsqueeze::<3>()
        .expand([h, len, half]);
    let x1 = x.clone().slice_dim(2, 0..half);
    let x2 = x.slice_dim(2, half..hd);
    Tensor::cat(
        vec![
            x1.clone() * cos.clone() - x2.clone() * sin.clone(),
            x2 * cos + x1 * sin,
        ],
        2,
    )
}
