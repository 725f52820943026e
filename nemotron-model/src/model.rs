//! The NemotronH stack: embeddings → blocks → `norm_f` → `lm_head`, built from a loaded checkpoint.

use crate::attention::Attention;
use crate::block::{Block, Mixer};
use crate::cache::{LayerState, SequenceState};
use crate::error::ModelError;
use crate::linear::Linear;
use crate::mamba2::Mamba2;
use crate::mlp::Mlp;
use crate::moe::Moe;
use crate::norm::{GatedRmsNorm, RmsNorm};
use crate::util::{from_vec, to_tensor, to_tensor_transposed};
use crate::Deviations;
use burn::tensor::{Int, Tensor, TensorData};
use nemotron_kernels::NemotronBackend;
use nemotron_loader::{Checkpoint, LinearWeight, LoadReport, MixerWeights, NemotronHConfig};
use std::path::Path;

/// A NemotronH causal LM on backend `B`.
#[derive(Debug, Clone)]
pub struct NemotronH<B: NemotronBackend> {
    pub config: NemotronHConfig,
    /// `[vocab, hidden]`.
    pub embeddings: Tensor<B, 2>,
    pub layers: Vec<Block<B>>,
    pub norm_f: RmsNorm<B>,
    pub lm_head: Linear<B>,
    pub deviations: Deviations,
    /// What the loader found (when built from a checkpoint).
    pub report: Option<LoadReport>,
    device: B::Device,
}

impl<B: NemotronBackend> NemotronH<B> {
    /// Loads a checkpoint directory onto `device`, keeping every weight in its shipped form.
    pub fn load(dir: impl AsRef<Path>, device: &B::Device) -> Result<Self, ModelError> {
        Self::from_checkpoint(Checkpoint::load(dir)?, device)
    }

    /// Builds the model from a loaded checkpoint, consuming its host weights.
    pub fn from_checkpoint(ck: Checkpoint, device: &B::Device) -> Result<Self, ModelError> {
        let Checkpoint {
            config: cfg,
            weights,
            report,
            ..
        } = ck;
        let dev = device;
        let eps = cfg.norm_eps;
        let embeddings = to_tensor::<B, 2>(&weights.embeddings, dev);
        let norm_f = RmsNorm {
            weight: to_tensor(&weights.norm_f, dev),
            eps,
        };
        let lm_head = match weights.lm_head {
            Some(w) => Linear::from_weight(w, dev)?,
            None => Linear::Dense(to_tensor_transposed::<B>(&weights.embeddings, dev)),
        };
        let mut layers = Vec::with_capacity(weights.layers.len());
        for lw in weights.layers {
            let norm = RmsNorm {
                weight: to_tensor(&lw.norm, dev),
                eps,
            };
            let mixer = match lw.mixer {
                MixerWeights::Mamba(m) => {
                    let c = cfg.mamba.clone().expect("validated");
                    let k = c.conv_kernel;
                    let conv = to_tensor::<B, 3>(&m.conv_weight, dev).reshape([c.conv_dim(), k]);
                    let h = c.num_heads;
                    Mixer::Mamba(Mamba2 {
                        in_proj: Linear::from_weight(m.in_proj, dev)?,
                        conv_weight: conv,
                        conv_bias: m.conv_bias.as_ref().map(|b| to_tensor(b, dev)),
                        a: from_vec(m.a_log.iter().map(|v| -v.exp()).collect(), [h], dev),
                        d: from_vec(m.d, [h], dev),
                        dt_bias: from_vec(m.dt_bias, [h], dev),
                        norm: GatedRmsNorm {
                            weight: to_tensor(&m.norm, dev),
                            groups: c.n_groups,
                            eps,
                        },
                        out_proj: Linear::from_weight(m.out_proj, dev)?,
                        cfg: c,
                    })
                }
                MixerWeights::Moe(m) => {
                    let experts = crate::moe::experts_from_weights::<B>(m.experts, dev)?;
                    let shared = match m.shared {
                        Some(s) => Some(Mlp {
                            up: Linear::from_weight(s.up, dev)?,
                            down: Linear::from_weight(s.down, dev)?,
                        }),
                        None => None,
                    };
                    Mixer::Moe(Moe {
                        router_t: crate::util::to_f32_tensor_transposed::<B>(&m.router, dev),
                        correction_bias: crate::util::to_f32_tensor::<B>(&m.correction_bias, dev),
                        experts,
                        shared,
                        cfg: cfg.moe.clone().expect("validated"),
                    })
                }
                MixerWeights::Attention(a) => {
                    let c = cfg.attention.clone().expect("validated");
                    let kv_scales = a.k_scale.zip(a.v_scale);
                    Mixer::Attention(Attention {
                        q: Linear::from_weight(a.q, dev)?,
                        k: Linear::from_weight(a.k, dev)?,
                        v: Linear::from_weight(a.v, dev)?,
                        o: Linear::from_weight(a.o, dev)?,
                        heads: c.num_heads,
                        kv_heads: c.num_kv_heads,
                        head_dim: c.head_dim,
                        kv_scales,
                    })
                }
                MixerWeights::Mlp(m) => Mixer::Mlp(Mlp {
                    up: Linear::from_weight(m.up, dev)?,
                    down: Linear::from_weight(m.down, dev)?,
                }),
            };
            layers.push(Block { norm, mixer });
        }
        Ok(NemotronH {
            config: cfg,
            embeddings,
            layers,
            norm_f,
            lm_head,
            deviations: Deviations::default(),
            report: Some(report),
            device: device.clone(),
        })
    }

    /// Loads with deliberate deviations (tests only: they make the model wrong on purpose).
    #[doc(hidden)]
    pub fn load_with_deviations(
        dir: impl AsRef<Path>,
        device: &B::Device,
        d: Deviations,
    ) -> Result<Self, ModelError> {
        let ck = Checkpoint::load(dir)?;
        let fp8: Vec<(usize, bool, nemotron_loader::Fp8Weight)> = if d.fp8_weight_only {
            ck.weights
                .layers
                .iter()
                .enumerate()
                .filter_map(|(l, lw)| match &lw.mixer {
                    MixerWeights::Mamba(m) => Some(
                        [(true, &m.in_proj), (false, &m.out_proj)]
                            .map(|(is_in, w)| (l, is_in, w.clone())),
                    ),
                    _ => None,
                })
                .flatten()
                .filter_map(|(l, is_in, w)| match w {
                    LinearWeight::Fp8(f) => Some((l, is_in, f)),
                    _ => None,
                })
                .collect()
        } else {
            vec![]
        };
        let mut m = Self::from_checkpoint(ck, device)?;
        for (l, is_in, f) in fp8 {
            if let Mixer::Mamba(mm) = &mut m.layers[l].mixer {
                let lin = if is_in {
                    &mut mm.in_proj
                } else {
                    &mut mm.out_proj
                };
                lin.fp8_as_weight_only(&f, device);
            }
        }
        m.deviations = d;
        Ok(m)
    }

    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// A fresh state for one sequence.
    pub fn new_state(&self) -> SequenceState<B> {
        let layers = self
            .layers
            .iter()
            .map(|b| match &b.mixer {
                Mixer::Mamba(m) => m.new_state(&self.device),
                Mixer::Attention(_) => LayerState::Attention { k: None, v: None },
                _ => LayerState::Stateless,
            })
            .collect();
        SequenceState {
            layers,
            position: 0,
        }
    }

    /// One forward over a batch: `tokens[b]` are the next tokens of sequence `b` (any length ≥ 1,
    /// prefill or decode alike), `states[b]` its state, advanced in place.
    /// Returns logits `[B, T_max, vocab]`; rows `t ≥ tokens[b].len()` are padding.
    pub fn forward(
        &self,
        tokens: &[&[u32]],
        states: &mut [&mut SequenceState<B>],
    ) -> Result<Tensor<B, 3>, ModelError> {
        let x = self.hidden(tokens, states)?;
        Ok(self.lm_head.forward(self.norm_f.forward(x)))
    }

    /// Like [`Self::forward`], but only the logits after each sequence's last new token:
    /// `[B, vocab]`. The head runs on `B` rows instead of `B × T` (what generation needs).
    pub fn forward_last(
        &self,
        tokens: &[&[u32]],
        states: &mut [&mut SequenceState<B>],
    ) -> Result<Tensor<B, 2>, ModelError> {
        let x = self.hidden(tokens, states)?;
        let [b, _, h] = x.dims();
        let rows: Vec<Tensor<B, 2>> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                x.clone()
                    .slice_dim(0, i..i + 1)
                    .slice_dim(1, t.len() - 1..t.len())
                    .reshape([1, h])
            })
            .collect();
        let last = Tensor::cat(rows, 0).reshape([b, 1, h]);
        let logits = self.lm_head.forward(self.norm_f.forward(last));
        let v = logits.dims()[2];
        Ok(logits.reshape([b, v]))
    }

    /// The residual stream of one sequence after the embedding and after each block (`1 + L`
    /// tensors `[T, hidden]`), advancing `state`: where two arms part ways in a parity hunt.
    pub fn trace(
        &self,
        tokens: &[u32],
        state: &mut SequenceState<B>,
    ) -> Result<Vec<Tensor<B, 2>>, ModelError> {
        let mut out = Vec::with_capacity(self.layers.len() + 1);
        let h = self.config.hidden_size;
        self.hidden_with(&[tokens], &mut [state], |x| {
            out.push(x.clone().reshape([tokens.len(), h]))
        })?;
        Ok(out)
    }

    /// The residual stream after the last block, `[B, T_max, hidden]`, advancing the states.
    fn hidden(
        &self,
        tokens: &[&[u32]],
        states: &mut [&mut SequenceState<B>],
    ) -> Result<Tensor<B, 3>, ModelError> {
        self.hidden_with(tokens, states, |_| {})
    }

    fn hidden_with(
        &self,
        tokens: &[&[u32]],
        states: &mut [&mut SequenceState<B>],
        mut seen: impl FnMut(&Tensor<B, 3>),
    ) -> Result<Tensor<B, 3>, ModelError> {
        if tokens.is_empty() || tokens.len() != states.len() {
            return Err(ModelError::Input(format!(
                "{} token lists for {} states",
                tokens.len(),
                states.len()
            )));
        }
        let v = self.config.vocab_size;
        let lens: Vec<usize> = tokens.iter().map(|t| t.len()).collect();
        let t_max = *lens.iter().max().expect("non-empty");
        if lens.contains(&0) {
            return Err(ModelError::Input(
                "every sequence needs at least one new token".into(),
            ));
        }
        let mut ids = vec![0i64; tokens.len() * t_max];
        for (b, ts) in tokens.iter().enumerate() {
            for (t, &id) in ts.iter().enumerate() {
                if id as usize >= v {
                    return Err(ModelError::Input(format!(
                        "token id {id} is outside the vocabulary ({v})"
                    )));
                }
                ids[b * t_max + t] = id as i64;
            }
        }
        let ids = Tensor::<B, 2, Int>::from_data(
            TensorData::new(ids, [tokens.len(), t_max]),
            &self.device,
        );
        let mut x = burn::tensor::module::embedding(self.embeddings.clone(), ids);
        seen(&x);
        for (l, block) in self.layers.iter().enumerate() {
            x = block.forward(x, &lens, states, l, &self.deviations);
            seen(&x);
        }
        for (s, len) in states.iter_mut().zip(&lens) {
            s.position += len;
        }
        Ok(x)
    }

    /// Logits of one sequence: `[T, vocab]` for its new tokens.
    pub fn forward_one(
        &self,
        tokens: &[u32],
        state: &mut SequenceState<B>,
    ) -> Result<Tensor<B, 2>, ModelError> {
        let l = self.forward(&[tokens], &mut [state])?;
        let [_, t, v] = l.dims();
        Ok(l.reshape([t, v]))
    }
}
