//! The NemotronH stack: embeddings → blocks → `norm_f` → `lm_head`, built from a loaded checkpoint.

use crate::cache::{BatchLayer, KvCacheDtype, SequenceState, SsmCacheDtype};
use crate::error::ModelError;
use crate::layers::block::{Block, Mixer};
use crate::layers::fold::{fold_refusal, SharedExpert};
use crate::layers::linear::Linear;
use crate::layers::moe::MoeOut;
use crate::layers::norm::RmsNorm;
use crate::util::float;
use crate::Deviations;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use nemotron_kernels::{ops, Epilogue};
use nemotron_loader::{Checkpoint, LoadReport, MixerWeights, NemotronHConfig};
use std::path::Path;

/// Weight layouts chosen when the model is built (they change which kernels run, not the model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BuildOptions {
    /// How each MoE layer runs its shared expert (`Auto` by default: the quantized layers that
    /// can fold their decode steps of up to its rows, and run prefills, larger steps and the
    /// other layers apart; `Fold` is refused, naming the layer, where a shared expert cannot join
    /// its routed stack).
    pub shared_expert: SharedExpert,
}

/// A NemotronH causal LM on one device, with one activation dtype.
#[derive(Debug, Clone)]
pub struct NemotronH {
    config: NemotronHConfig,
    /// `[vocab, hidden]`.
    embeddings: Tensor<2>,
    layers: Vec<Block>,
    norm_f: RmsNorm,
    lm_head: Linear,
    report: Option<LoadReport>,
    device: Device,
    /// How slot states hold keys and values ([`Self::with_kv_cache`]).
    kv_cache: KvCacheDtype,
    /// How slot states hold the SSM state ([`Self::with_ssm_cache`]).
    ssm_cache: SsmCacheDtype,
}

/// The activation dtypes the model runs in.
pub const ACTIVATION_DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

impl NemotronH {
    /// Loads a checkpoint directory onto `device`, keeping every weight in its shipped form;
    /// activations in the device's default float dtype (`Device::configure`).
    pub fn load(dir: impl AsRef<Path>, device: &Device) -> Result<Self, ModelError> {
        let dtype: DType = device.settings().float_dtype.into();
        Self::load_as(dir, device, dtype)
    }

    /// Like [`Self::load`], with activations in `dtype` whatever the device's default.
    pub fn load_as(
        dir: impl AsRef<Path>,
        device: &Device,
        dtype: DType,
    ) -> Result<Self, ModelError> {
        Self::from_checkpoint(Checkpoint::load(dir)?, device, dtype)
    }

    /// Builds the model from a loaded checkpoint, consuming its host weights.
    pub fn from_checkpoint(
        ck: Checkpoint,
        device: &Device,
        dtype: DType,
    ) -> Result<Self, ModelError> {
        Self::build(
            ck,
            device,
            dtype,
            &Deviations::default(),
            BuildOptions::default(),
        )
    }

    /// [`Self::from_checkpoint`] with the weight layouts `opts` chooses.
    pub fn from_checkpoint_with(
        ck: Checkpoint,
        device: &Device,
        dtype: DType,
        opts: BuildOptions,
    ) -> Result<Self, ModelError> {
        Self::build(ck, device, dtype, &Deviations::default(), opts)
    }

    /// [`Self::load_as`] with the weight layouts `opts` chooses.
    pub fn load_with(
        dir: impl AsRef<Path>,
        device: &Device,
        dtype: DType,
        opts: BuildOptions,
    ) -> Result<Self, ModelError> {
        Self::from_checkpoint_with(Checkpoint::load(dir)?, device, dtype, opts)
    }

    /// Loads with deliberate deviations (tests only: they make the model wrong on purpose).
    #[doc(hidden)]
    pub fn load_with_deviations(
        dir: impl AsRef<Path>,
        device: &Device,
        dtype: DType,
        d: Deviations,
    ) -> Result<Self, ModelError> {
        Self::build(
            Checkpoint::load(dir)?,
            device,
            dtype,
            &d,
            BuildOptions::default(),
        )
    }

    /// [`Self::load_with_deviations`] with build options (tests only).
    #[doc(hidden)]
    pub fn load_with_deviations_and(
        dir: impl AsRef<Path>,
        device: &Device,
        dtype: DType,
        d: Deviations,
        opts: BuildOptions,
    ) -> Result<Self, ModelError> {
        Self::build(Checkpoint::load(dir)?, device, dtype, &d, opts)
    }

    fn build(
        ck: Checkpoint,
        dev: &Device,
        dtype: DType,
        dv: &Deviations,
        opts: BuildOptions,
    ) -> Result<Self, ModelError> {
        if !ACTIVATION_DTYPES.contains(&dtype) {
            return Err(ModelError::Unsupported {
                tensor: "activations".into(),
                reason: format!("dtype {dtype:?} (expected one of {ACTIVATION_DTYPES:?})"),
            });
        }
        if !dev.supports_dtype(dtype) {
            return Err(ModelError::Unsupported {
                tensor: "activations".into(),
                reason: format!("device {dev:?} does not support {dtype:?}"),
            });
        }
        let Checkpoint {
            config: cfg,
            weights,
            report,
            ..
        } = ck;
        if opts.shared_expert == SharedExpert::Fold {
            for (i, l) in weights.layers.iter().enumerate() {
                if let MixerWeights::Moe(m) = &l.mixer {
                    if let Some(reason) = fold_refusal(m) {
                        return Err(ModelError::Unsupported {
                            tensor: format!("backbone.layers.{i}.mixer.shared_experts"),
                            reason: format!(
                                "folding the shared expert into the routed stack: {reason}"
                            ),
                        });
                    }
                }
            }
        }
        let embeddings = float::<2>(&weights.embeddings, dev, dtype);
        let norm_f = RmsNorm {
            weight: float(&weights.norm_f, dev, dtype),
            eps: cfg.norm_eps,
        };
        let lm_head = match weights.lm_head {
            Some(w) => Linear::from_weight(w, dev, dtype),
            None => Linear::Dense(embeddings.clone()),
        };
        let layers = weights
            .layers
            .into_iter()
            .map(|lw| Block::from_weights(lw, &cfg, dev, dtype, dv, opts.shared_expert))
            .collect();
        Ok(NemotronH {
            config: cfg,
            embeddings,
            layers,
            norm_f,
            lm_head,
            report: Some(report),
            device: dev.clone(),
            kv_cache: KvCacheDtype::Auto,
            ssm_cache: SsmCacheDtype::F32,
        })
    }

    pub fn config(&self) -> &NemotronHConfig {
        &self.config
    }

    /// This model with slot states ([`Self::new_slots`], so the engine, the generator and the
    /// server) holding keys and values as `kv` says. The ragged forward over
    /// [`crate::SequenceState`]s (the reference path) keeps them in the activation dtype. An FP8
    /// cache is refused, by layer, where a head dim is not a multiple of 4 dividing 128, or a
    /// checkpoint's KV scale is not positive and finite.
    pub fn with_kv_cache(mut self, kv: KvCacheDtype) -> Result<Self, ModelError> {
        if kv == KvCacheDtype::Fp8 {
            for (i, b) in self.layers.iter().enumerate() {
                if let Mixer::Attention(a) = b.mixer() {
                    a.check_kv8().map_err(|reason| ModelError::Unsupported {
                        tensor: format!("backbone.layers.{i}.mixer"),
                        reason: format!("an FP8 KV cache: {reason}"),
                    })?;
                }
            }
        }
        self.kv_cache = kv;
        Ok(self)
    }

    /// How slot states hold keys and values.
    pub fn kv_cache(&self) -> KvCacheDtype {
        self.kv_cache
    }

    /// This model with slot states ([`Self::new_slots`], so the engine, the generator and the
    /// server) holding the Mamba layers' SSM state as `ssm` says. The ragged forward over
    /// [`crate::SequenceState`]s (prefill, and the reference path) keeps it in f32; a prefilled
    /// state is rounded as it enters its slot. A bf16 state is refused, by layer, where the state
    /// size is odd (two values to a word).
    pub fn with_ssm_cache(mut self, ssm: SsmCacheDtype) -> Result<Self, ModelError> {
        if ssm == SsmCacheDtype::Bf16 {
            for (i, b) in self.layers.iter().enumerate() {
                if let Mixer::Mamba(m) = b.mixer() {
                    if !m.state_size().is_multiple_of(2) {
                        return Err(ModelError::Unsupported {
                            tensor: format!("backbone.layers.{i}.mixer"),
                            reason: format!(
                                "a bf16 SSM cache packs two values to a word: the state size \
                                 {} is odd",
                                m.state_size()
                            ),
                        });
                    }
                }
            }
        }
        self.ssm_cache = ssm;
        Ok(self)
    }

    /// How slot states hold the SSM state.
    pub fn ssm_cache(&self) -> SsmCacheDtype {
        self.ssm_cache
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The activation dtype the model runs in, as its tensors hold it.
    pub fn dtype(&self) -> DType {
        self.embeddings.dtype()
    }

    pub fn layers(&self) -> &[Block] {
        &self.layers
    }

    /// The MoE layers that run their shared expert stacked with the routed experts for some
    /// calls, and all MoE layers (how [`BuildOptions::shared_expert`] came out, layer by layer).
    pub fn shared_expert_folds(&self) -> (usize, usize) {
        let moe = self.layers.iter().filter_map(|b| match b.mixer() {
            Mixer::Moe(m) => Some(m.shared_folded()),
            _ => None,
        });
        moe.fold((0, 0), |(f, n), folds| (f + usize::from(folds), n + 1))
    }

    /// What the loader found (when built from a checkpoint).
    pub fn report(&self) -> Option<&LoadReport> {
        self.report.as_ref()
    }

    /// A fresh state for one sequence.
    pub fn new_state(&self) -> SequenceState {
        SequenceState {
            layers: self.layers.iter().map(Block::new_state).collect(),
            position: 0,
        }
    }

    /// One forward over a batch: `tokens[b]` are the next tokens of sequence `b` (any length ≥ 1,
    /// prefill or decode alike), `states[b]` its state, advanced in place.
    /// Returns logits `[B, T_max, vocab]`; rows `t ≥ tokens[b].len()` are padding.
    pub fn forward(
        &self,
        tokens: &[&[u32]],
        states: &mut [&mut SequenceState],
    ) -> Result<Tensor<3>, ModelError> {
        let x = self.hidden(tokens, states)?;
        Ok(self.head(x))
    }

    pub(crate) fn norm_f(&self) -> &crate::layers::norm::RmsNorm {
        &self.norm_f
    }

    pub(crate) fn lm_head(&self) -> &Linear {
        &self.lm_head
    }

    pub(crate) fn embeddings(&self) -> &Tensor<2> {
        &self.embeddings
    }

    pub(crate) fn head<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        self.lm_head.forward(self.norm_f.forward(x), Epilogue::None)
    }

    /// Like [`Self::forward`], but only the logits after each sequence's last new token:
    /// `[B, vocab]`. The head runs on `B` rows instead of `B × T` (what generation needs).
    pub fn forward_last(
        &self,
        tokens: &[&[u32]],
        states: &mut [&mut SequenceState],
    ) -> Result<Tensor<2>, ModelError> {
        let x = self.hidden(tokens, states)?;
        Ok(self.head(self.last_rows(x, tokens)))
    }

    /// Row `len_b − 1` of each sequence `b` of `x` `[B, T, hidden]`: `[B, hidden]`, in one gather
    /// (a slice per sequence and a concatenation took `B + 1` launches).
    pub(crate) fn last_rows(&self, x: Tensor<3>, tokens: &[&[u32]]) -> Tensor<2> {
        let [b, t, h] = x.dims();
        if t == 1 {
            return x.reshape([b, h]);
        }
        let idx: Vec<i32> = tokens
            .iter()
            .enumerate()
            .map(|(i, s)| (i * t + s.len() - 1) as i32)
            .collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [b]), &x.device());
        x.reshape([b * t, h]).select(0, idx)
    }

    /// [`Self::forward_last`] from token ids already on the device (`[B, T]`, every sequence `T`
    /// new tokens): a step that performs no host write, so it can be captured in a graph.
    pub fn forward_last_ids(
        &self,
        ids: Tensor<2, Int>,
        states: &mut [&mut SequenceState],
    ) -> Result<Tensor<2>, ModelError> {
        let [b, t] = ids.dims();
        if b != states.len() {
            return Err(ModelError::Input(format!(
                "{b} id rows for {} states",
                states.len()
            )));
        }
        let lens = vec![t; b];
        let x = self.blocks(ids, &lens, states, |_| {});
        let [_, _, h] = x.dims();
        let last = x.slice_dim(1, t - 1..t).reshape([b, h]);
        Ok(self.head(last))
    }

    /// The residual stream of one sequence after the embedding and after each block (`1 + L`
    /// tensors `[T, hidden]`), advancing `state`: where two arms part ways in a parity hunt.
    pub fn trace(
        &self,
        tokens: &[u32],
        state: &mut SequenceState,
    ) -> Result<Vec<Tensor<2>>, ModelError> {
        let mut out = Vec::with_capacity(self.layers.len() + 1);
        let h = self.config.hidden_size;
        self.hidden_with(&[tokens], &mut [state], |x| {
            out.push(x.clone().reshape([tokens.len(), h]))
        })?;
        Ok(out)
    }

    /// One batch-1 decode step of token `id`, calling `after(None)` once the embedding is issued
    /// and `after(Some(l))` once block `l` is (for timing or profiling per block), then the head:
    /// logits `[1, vocab]`.
    #[doc(hidden)]
    pub fn trace_step(
        &self,
        id: u32,
        state: &mut SequenceState,
        mut after: impl FnMut(Option<usize>),
    ) -> Result<Tensor<2>, ModelError> {
        let mut seen = 0usize;
        let x = self.hidden_with(&[&[id]], &mut [state], |_| {
            after(seen.checked_sub(1));
            seen += 1;
        })?;
        let h = self.config.hidden_size;
        Ok(self.head(x.reshape([1, h])))
    }

    /// The residual stream after the last block, `[B, T_max, hidden]`, advancing the states.
    fn hidden(
        &self,
        tokens: &[&[u32]],
        states: &mut [&mut SequenceState],
    ) -> Result<Tensor<3>, ModelError> {
        self.hidden_with(tokens, states, |_| {})
    }

    fn hidden_with(
        &self,
        tokens: &[&[u32]],
        states: &mut [&mut SequenceState],
        seen: impl FnMut(&Tensor<3>),
    ) -> Result<Tensor<3>, ModelError> {
        let ids = self.token_ids(tokens, states)?;
        let lens: Vec<usize> = tokens.iter().map(|t| t.len()).collect();
        Ok(self.blocks(ids, &lens, states, seen))
    }

    /// The residual stream after the last block and each layer's batch state whole where its
    /// mixer kept it ([`Self::blocks_kept`]), advancing the states.
    pub(crate) fn hidden_kept(
        &self,
        tokens: &[&[u32]],
        states: &mut [&mut SequenceState],
    ) -> Result<(Tensor<3>, Vec<Option<BatchLayer>>), ModelError> {
        let ids = self.token_ids(tokens, states)?;
        let lens: Vec<usize> = tokens.iter().map(|t| t.len()).collect();
        Ok(self.blocks_kept(ids, &lens, states, |_| {}))
    }

    /// The token lists as right-padded ids `[B, T_max]` on the device, checked: one list per
    /// state, none empty, every id inside the vocabulary, and every state this model's (a layer
    /// per block, each of its block's kind and shapes; a state from another model or taken apart
    /// is refused naming the sequence and layer instead of failing inside a layer).
    fn token_ids(
        &self,
        tokens: &[&[u32]],
        states: &[&mut SequenceState],
    ) -> Result<Tensor<2, Int>, ModelError> {
        if tokens.is_empty() || tokens.len() != states.len() {
            return Err(ModelError::Input(format!(
                "{} token lists for {} states",
                tokens.len(),
                states.len()
            )));
        }
        for (b, st) in states.iter().enumerate() {
            if st.layers.len() != self.layers.len() {
                return Err(ModelError::Input(format!(
                    "state {b} has {} layers where the model has {}",
                    st.layers.len(),
                    self.layers.len()
                )));
            }
            for (i, (block, layer)) in self.layers.iter().zip(&st.layers).enumerate() {
                block
                    .check_state(layer, st.position)
                    .map_err(|why| ModelError::Input(format!("state {b}, layer {i}: {why}")))?;
            }
        }
        let v = self.config.vocab_size;
        let lens: Vec<usize> = tokens.iter().map(|t| t.len()).collect();
        let t_max = lens.iter().copied().max().unwrap_or(0);
        if lens.contains(&0) {
            return Err(ModelError::Input(
                "every sequence needs at least one new token".into(),
            ));
        }
        let mut ids = vec![0i32; tokens.len() * t_max];
        for (b, ts) in tokens.iter().enumerate() {
            for (t, &id) in ts.iter().enumerate() {
                if id as usize >= v {
                    return Err(ModelError::Input(format!(
                        "token id {id} is outside the vocabulary ({v})"
                    )));
                }
                ids[b * t_max + t] = id as i32;
            }
        }
        Ok(Tensor::<2, Int>::from_data(
            TensorData::new(ids, [tokens.len(), t_max]),
            &self.device,
        ))
    }

    /// Embedding and blocks; advances the states' positions.
    fn blocks(
        &self,
        ids: Tensor<2, Int>,
        lens: &[usize],
        states: &mut [&mut SequenceState],
        seen: impl FnMut(&Tensor<3>),
    ) -> Tensor<3> {
        self.blocks_kept(ids, lens, states, seen).0
    }

    /// [`Self::blocks`], also returning each layer's batch state whole where its mixer kept it.
    pub(crate) fn blocks_kept(
        &self,
        ids: Tensor<2, Int>,
        lens: &[usize],
        states: &mut [&mut SequenceState],
        mut seen: impl FnMut(&Tensor<3>),
    ) -> (Tensor<3>, Vec<Option<BatchLayer>>) {
        let x = burn::tensor::module::embedding(self.embeddings.clone(), ids);
        seen(&x);
        let [b, t, hid] = x.dims();
        // The residual stream as rows; each block's residual add (and a MoE's combine) is fused
        // with the next block's norm, as in the decode step: one launch between two mixers
        // instead of an add, a combine and a norm. After the last block the head normalizes
        // only the rows it needs, so that block's add stays plain.
        let mut x: Tensor<2> = x.reshape([b * t, hid]);
        let mut h = match self.layers.first() {
            Some(l) => l.norm().forward(x.clone()),
            None => x.clone(),
        };
        let mut kept = Vec::with_capacity(self.layers.len());
        for (l, block) in self.layers.iter().enumerate() {
            let (y, k) = block.mix_kept(h.clone().reshape([b, t, hid]), lens, states, l);
            kept.push(k);
            (x, h) = match (self.layers.get(l + 1), y) {
                (Some(next), MoeOut::Combined(y)) => {
                    ops::add_rms_norm(x, y, next.norm().weight.clone(), next.norm().eps)
                }
                (Some(next), MoeOut::Parts { routed, w, shared }) => ops::add_moe_rms_norm(
                    x,
                    routed,
                    w,
                    shared,
                    next.norm().weight.clone(),
                    next.norm().eps,
                ),
                (None, MoeOut::Combined(y)) => (x + y, h),
                (None, MoeOut::Parts { routed, w, shared }) => {
                    (x + ops::moe_combine(routed, w, shared), h)
                }
            };
            seen(&x.clone().reshape([b, t, hid]));
        }
        let x = x.reshape([b, t, hid]);
        for (s, len) in states.iter_mut().zip(lens) {
            s.position += len;
        }
        (x, kept)
    }

    /// [`Self::forward_one`] in pieces of `chunk` tokens (0: one piece), the conv, SSM and KV
    /// state carried from piece to piece: the logits of the whole prompt `[T, vocab]`, equal to
    /// one forward's within the arms' rounding, with the activations of one piece at a time.
    pub fn forward_one_chunked(
        &self,
        tokens: &[u32],
        state: &mut SequenceState,
        chunk: usize,
    ) -> Result<Tensor<2>, ModelError> {
        if chunk == 0 || chunk >= tokens.len() {
            return self.forward_one(tokens, state);
        }
        let mut pieces = Vec::with_capacity(tokens.len().div_ceil(chunk));
        for piece in tokens.chunks(chunk) {
            pieces.push(self.forward_one(piece, state)?);
        }
        Ok(Tensor::cat(pieces, 0))
    }

    /// Logits of one sequence: `[T, vocab]` for its new tokens.
    pub fn forward_one(
        &self,
        tokens: &[u32],
        state: &mut SequenceState,
    ) -> Result<Tensor<2>, ModelError> {
        let l = self.forward(&[tokens], &mut [state])?;
        let [_, t, v] = l.dims();
        Ok(l.reshape([t, v]))
    }
}
