//! Decode state in fixed slots: every layer's state for `S` sequences allocated once — a conv
//! ring `[S, C, K]` and f32 SSM `[S, H, P, N]` per Mamba layer, K/V `[S, KVH, capacity, D]` per
//! attention layer — plus each slot's length on the device. A decode step reads the token ids and
//! the slot of each row from device tensors and updates the pools and lengths in place (on device
//! backends), so one captured step replays correctly from step to step; pad rows carry slot −1.
//! A prefilled sequence (the ragged forward, which stays the reference and the prefill path)
//! enters its slot with [`NemotronH::load_slot`].

use crate::cache::{BatchLayer, LayerState, SequenceState, SlotLayer, SlotState};
use crate::error::ModelError;
use crate::layers::attention::Attention;
use crate::layers::block::Mixer;
use crate::layers::moe::MoeOut;
use crate::model::NemotronH;
use burn::tensor::{DType, Int, Tensor, TensorData};
use nemotron_kernels::{ops, Epilogue};

impl NemotronH {
    /// Device bytes one slot of `capacity` tokens takes (every layer's pools and its length):
    /// what [`Self::new_slots`] allocates per slot, so an engine can size its slots from a
    /// memory budget ([`crate::EngineOptions::for_memory`]). An FP8 KV cache
    /// ([`Self::with_kv_cache`]) takes half the KV bytes of bf16, a bf16 SSM cache
    /// ([`Self::with_ssm_cache`]) half the SSM bytes of f32.
    pub fn slot_bytes(&self, capacity: usize) -> usize {
        self.layers()
            .iter()
            .map(|b| b.slot_bytes(capacity, self.dtype(), self.kv_cache(), self.ssm_cache()))
            .sum::<usize>()
            + DType::I32.size()
    }

    /// Zero pools for `slots` sequences of up to `capacity` tokens each.
    pub fn new_slots(&self, slots: usize, capacity: usize) -> Result<SlotState, ModelError> {
        if slots == 0 || capacity == 0 {
            return Err(ModelError::Input(format!(
                "slot state needs at least one slot and one token of capacity (got {slots} slots of {capacity})"
            )));
        }
        if self
            .layers()
            .iter()
            .any(|b| matches!(b.mixer(), Mixer::Attention(a) if a.has_rope()))
        {
            return Err(ModelError::Unsupported {
                tensor: "attention".into(),
                reason: "the RoPE deviation exists for the ragged reference only".into(),
            });
        }
        let dev = self.device();
        let layers = self
            .layers()
            .iter()
            .map(|b| {
                b.new_slots(
                    slots,
                    capacity,
                    dev,
                    self.dtype(),
                    self.kv_cache(),
                    self.ssm_cache(),
                )
            })
            .collect();
        Ok(SlotState {
            layers,
            lens: Tensor::from_data(
                TensorData::new(vec![0i32; slots], [slots]),
                (dev, DType::I32),
            ),
            host_lens: vec![0; slots],
            capacity,
        })
    }

    /// Writes a prefilled sequence's state into slot `slot` (whatever the slot held before: its
    /// conv and SSM state are overwritten, its KV cache is read only up to the new length).
    pub fn load_slot(
        &self,
        st: &mut SlotState,
        slot: usize,
        seq: &SequenceState,
    ) -> Result<(), ModelError> {
        if slot >= st.slots() {
            return Err(ModelError::Input(format!(
                "slot {slot} of {} slots",
                st.slots()
            )));
        }
        if seq.position > st.capacity {
            return Err(ModelError::ContextTooLong {
                prompt: seq.position,
                context: st.capacity,
            });
        }
        let ring = |conv: &mut Tensor<3>, c: &Tensor<2>| {
            *conv = ops::write_slot(
                conv.clone().unsqueeze_dim::<4>(3),
                conv_ring(c.clone(), seq.position).unsqueeze_dim(2),
                slot,
            )
            .squeeze_dim(3);
        };
        for (l, (pools, state)) in st.layers.iter_mut().zip(&seq.layers).enumerate() {
            match (pools, state) {
                (SlotLayer::Mamba { conv, ssm }, LayerState::Mamba { conv: c, ssm: s }) => {
                    ring(conv, c);
                    *ssm = ops::write_slot(ssm.clone(), s.clone(), slot);
                }
                (SlotLayer::Mamba16 { conv, ssm }, LayerState::Mamba { conv: c, ssm: s }) => {
                    ring(conv, c);
                    let one = Tensor::<1, Int>::from_data(
                        TensorData::new(vec![slot as i32], [1]),
                        (self.device(), DType::I32),
                    );
                    *ssm = ops::write_slots_bf16(ssm.clone(), s.clone().unsqueeze_dim(0), &one);
                }
                (SlotLayer::Attention { k, v }, st) => {
                    if let Some((ks, vs)) = Attention::prefix(st) {
                        *k = ops::write_slot(k.clone(), ks, slot);
                        *v = ops::write_slot(v.clone(), vs, slot);
                    }
                }
                (SlotLayer::Attention8 { k, v }, st) => self.load_kv8(l, k, v, st, slot)?,
                (SlotLayer::Stateless, LayerState::Stateless) => {}
                (p, s) => {
                    return Err(ModelError::Input(format!(
                        "a sequence state {s:?} does not fit the slot layer {p:?}"
                    )))
                }
            }
        }
        st.host_lens[slot] = seq.position;
        let lens: Vec<i32> = st.host_lens.iter().map(|&l| l as i32).collect();
        ops::write_i32(&mut st.lens, &lens);
        Ok(())
    }

    /// Prefills new sequences (`tokens[b]`, each from empty) in one ragged forward straight into
    /// the distinct slots `slots[b]`, overwriting whatever they held: what
    /// [`Self::forward_last`] and [`Self::load_slot`] per sequence do, with each pool written once
    /// for the whole batch (at 64 prompts the per-sequence writes were ≈ 8,000 launches).
    /// Returns the logits after each sequence's last token, `[B, vocab]`. Layers whose batch
    /// state the forward did not keep whole (attention run one sequence at a time) enter their
    /// slots per sequence.
    pub fn prefill_slots(
        &self,
        st: &mut SlotState,
        tokens: &[&[u32]],
        slots: &[usize],
    ) -> Result<Tensor<2>, ModelError> {
        if tokens.len() != slots.len() {
            return Err(ModelError::Input(format!(
                "{} prompts for {} slots",
                tokens.len(),
                slots.len()
            )));
        }
        for (i, &slot) in slots.iter().enumerate() {
            if slot >= st.slots() {
                return Err(ModelError::Input(format!(
                    "slot {slot} of {} slots",
                    st.slots()
                )));
            }
            if slots[..i].contains(&slot) {
                return Err(ModelError::Input(format!(
                    "slot {slot} given twice in one prefill"
                )));
            }
        }
        if let Some(long) = tokens.iter().map(|t| t.len()).find(|&l| l > st.capacity) {
            return Err(ModelError::ContextTooLong {
                prompt: long,
                context: st.capacity,
            });
        }
        let mut states: Vec<SequenceState> = tokens.iter().map(|_| self.new_state()).collect();
        let (x, kept) = {
            let mut refs: Vec<&mut SequenceState> = states.iter_mut().collect();
            self.hidden_kept(tokens, &mut refs)?
        };
        let logits = self.head(self.last_rows(x, tokens));
        let dev = self.device();
        let b = slots.len();
        let ints =
            |v: Vec<i32>| Tensor::<1, Int>::from_data(TensorData::new(v, [b]), (dev, DType::I32));
        let slot_t = ints(slots.iter().map(|&s| s as i32).collect());
        let zero_t = ints(vec![0; b]);
        let mut ring_t = None;
        // `[state | 0]` column `j` of a sequence of `len` tokens belongs at ring entry
        // `(len + 1 + j) mod K` (`conv_ring`).
        let mut ring = |conv: &mut Tensor<3>, c: Tensor<3>| {
            let k = conv.dims()[2];
            let rot = ring_t
                .get_or_insert_with(|| {
                    ints(tokens.iter().map(|t| ((t.len() + 1) % k) as i32).collect())
                })
                .clone();
            *conv = ops::write_slots(
                conv.clone().unsqueeze_dim::<4>(3),
                c.unsqueeze_dim(3),
                &slot_t,
                &rot,
                k,
            )
            .squeeze_dim(3);
        };
        for (l, (pools, kept)) in st.layers.iter_mut().zip(kept).enumerate() {
            match (pools, kept) {
                (SlotLayer::Mamba { conv, ssm }, Some(BatchLayer::Mamba { conv: c, ssm: s })) => {
                    ring(conv, c);
                    let p = ssm.dims()[2];
                    *ssm = ops::write_slots(ssm.clone(), s, &slot_t, &zero_t, p);
                }
                (SlotLayer::Mamba16 { conv, ssm }, Some(BatchLayer::Mamba { conv: c, ssm: s })) => {
                    ring(conv, c);
                    *ssm = ops::write_slots_bf16(ssm.clone(), s, &slot_t);
                }
                (SlotLayer::Attention { k, v }, Some(BatchLayer::Attention { k: kb, v: vb })) => {
                    let t = kb.dims()[2];
                    *k = ops::write_slots(k.clone(), kb, &slot_t, &zero_t, t);
                    *v = ops::write_slots(v.clone(), vb, &slot_t, &zero_t, t);
                }
                (SlotLayer::Attention { k, v }, None) => {
                    for (seq, &slot) in states.iter().zip(slots) {
                        if let Some((ks, vs)) = Attention::prefix(&seq.layers[l]) {
                            *k = ops::write_slot(k.clone(), ks, slot);
                            *v = ops::write_slot(v.clone(), vs, slot);
                        }
                    }
                }
                (SlotLayer::Attention8 { k, v }, Some(BatchLayer::Attention { k: kb, v: vb })) => {
                    let (sk, sv) = self.kv8_scales(l)?;
                    *k = ops::write_slots8(k.clone(), kb, &slot_t, sk);
                    *v = ops::write_slots8(v.clone(), vb, &slot_t, sv);
                }
                (SlotLayer::Attention8 { k, v }, None) => {
                    for (seq, &slot) in states.iter().zip(slots) {
                        self.load_kv8(l, k, v, &seq.layers[l], slot)?;
                    }
                }
                (SlotLayer::Stateless, Some(BatchLayer::Stateless)) => {}
                (p, k) => {
                    return Err(ModelError::Input(format!(
                        "layer {l}: a batch state {k:?} does not fit the slot layer {p:?}"
                    )))
                }
            }
        }
        for (t, &slot) in tokens.iter().zip(slots) {
            st.host_lens[slot] = t.len();
        }
        let lens: Vec<i32> = st.host_lens.iter().map(|&l| l as i32).collect();
        ops::write_i32(&mut st.lens, &lens);
        Ok(logits)
    }

    /// One decode step over slot states: `ids` `[B, 1]` (I32), `slots` `[B]` (I32; −1 for pad
    /// rows). Returns the logits `[B, vocab]` (pad rows: meaningless) and advances the lengths of
    /// the non-pad slots on the device; call [`SlotState::note_step`] with the same slots to keep
    /// the host's copy. Performs no host write or read, so it can be captured as a graph.
    pub fn decode_slots(
        &self,
        st: &mut SlotState,
        ids: &Tensor<2, Int>,
        slots: &Tensor<1, Int>,
    ) -> Tensor<2> {
        let [b, _] = ids.dims();
        let x = burn::tensor::module::embedding(self.embeddings().clone(), ids.clone());
        let [_, _, hid] = x.dims();
        let layers = self.layers();
        let mut x: Tensor<2> = x.reshape([b, hid]);
        let mut h = match layers.first() {
            Some(l) => l.norm().forward(x.clone()),
            None => self.norm_f().forward(x.clone()),
        };
        // Each block's residual add is fused with the next block's norm (the final norm after
        // the last block), so the hidden state crosses a block in one launch.
        for (i, (block, pools)) in layers.iter().zip(st.layers.iter_mut()).enumerate() {
            let y = block.mix_step(h.reshape([b, 1, hid]), pools, &st.lens, slots);
            let next = layers.get(i + 1).map_or(self.norm_f(), |l| l.norm());
            let (w, eps) = (next.weight.clone(), next.eps);
            (x, h) = match y {
                MoeOut::Combined(y) => ops::add_rms_norm(x, y, w, eps),
                MoeOut::Parts {
                    routed,
                    w: cw,
                    shared,
                } => ops::add_moe_rms_norm(x, routed, cw, shared, w, eps),
            };
        }
        st.lens = ops::advance_lens(st.lens.clone(), slots);
        self.lm_head().forward(h, Epilogue::None)
    }

    /// Layer `l`'s FP8 KV-cache scales (an FP8 pool on a layer that is not attention is refused).
    fn kv8_scales(&self, l: usize) -> Result<(f32, f32), ModelError> {
        match self.layers()[l].mixer() {
            Mixer::Attention(a) => Ok(a.kv8_scales()),
            _ => Err(ModelError::Input(format!(
                "layer {l}: an FP8 KV cache where the layer is not attention"
            ))),
        }
    }

    /// A prefilled sequence's keys and values of layer `l` (`state`, if it holds any) into
    /// slot `slot` of that layer's FP8 pools.
    fn load_kv8(
        &self,
        l: usize,
        k: &mut Tensor<4, Int>,
        v: &mut Tensor<4, Int>,
        state: &LayerState,
        slot: usize,
    ) -> Result<(), ModelError> {
        let (sk, sv) = self.kv8_scales(l)?;
        if let Some((ks, vs)) = Attention::prefix(state) {
            let one = Tensor::<1, Int>::from_data(
                TensorData::new(vec![slot as i32], [1]),
                (self.device(), DType::I32),
            );
            *k = ops::write_slots8(k.clone(), ks.unsqueeze_dim(0), &one, sk);
            *v = ops::write_slots8(v.clone(), vs.unsqueeze_dim(0), &one, sv);
        }
        Ok(())
    }
}

/// A prefilled conv state `[C, K-1]` (oldest first, the inputs of times `len − K + 1 … len − 1`)
/// as the slot's ring `[C, K]`: time `t` at `t mod K` (the entry of `len mod K`, free, zero).
fn conv_ring(state: Tensor<2>, len: usize) -> Tensor<2> {
    let [c, km1] = state.dims();
    let k = km1 + 1;
    let dev = state.device();
    let zero = Tensor::zeros([c, 1], (&dev, state.dtype()));
    // Column `j` of `[state | 0]` holds time `len − (K−1) + j`, which belongs at
    // `(len + 1 + j) mod K`: a rotation right by `(len + 1) mod K`.
    let full = Tensor::cat(vec![state, zero], 1);
    let r = (len + 1) % k;
    if r == 0 {
        return full;
    }
    Tensor::cat(
        vec![
            full.clone().slice_dim(1, k - r..k),
            full.slice_dim(1, 0..k - r),
        ],
        1,
    )
}
