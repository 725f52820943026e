//! The Mamba2 mixer: in_proj → causal conv + SiLU over `[x|B|C]` → selective scan with D skip →
//! gated group RMSNorm → out_proj.

use crate::cache::{BatchLayer, LayerState, SequenceState, SlotLayer, SsmCacheDtype};
use crate::layers::linear::Linear;
use crate::layers::norm::GatedRmsNorm;
use crate::util::{float, from_vec};
use crate::Deviations;
use burn::tensor::{DType, Device, Int, Tensor};
use nemotron_kernels::{ops, Epilogue, ScanDims};
use nemotron_loader::config::MambaConfig;
use nemotron_loader::MambaWeights;

#[derive(Debug, Clone)]
pub struct Mamba2 {
    /// `in_proj` in its shipped form; its outputs come back as three dense tensors (`z`, `xBC`,
    /// `dt`) from one launch ([`Linear::forward3`]).
    in_proj: Linear,
    /// `[C, K]`.
    conv_weight: Tensor<2>,
    conv_bias: Option<Tensor<1>>,
    /// `A = −exp(A_log)`, `[H]`.
    a: Tensor<1>,
    d: Tensor<1>,
    dt_bias: Tensor<1>,
    norm: GatedRmsNorm,
    out_proj: Linear,
    cfg: MambaConfig,
    /// `dt ≥ this` after the softplus (a deviation; `None` for the model).
    dt_min: Option<f32>,
    /// The zero state (`conv`, `ssm`), shared by every new sequence: a tensor is a value (an op
    /// writes a buffer in place only when it holds the only reference), so a new state costs no
    /// launch — admitting 16 prompts took 736 fill launches on the host's critical path.
    zero: (Tensor<2>, Tensor<3>),
}

impl Mamba2 {
    /// Builds the mixer from its loaded weights: projections in their shipped form, everything
    /// else in the activation `dtype`.
    pub fn from_weights(
        w: MambaWeights,
        cfg: &MambaConfig,
        eps: f64,
        dev: &Device,
        dtype: DType,
        dv: &Deviations,
    ) -> Self {
        let (k, h) = (cfg.conv_kernel, cfg.num_heads);
        let (i, conv) = (cfg.inner(), cfg.conv_dim());
        let need = i + conv + h;
        assert_eq!(
            w.in_proj.out_features(),
            need,
            "in_proj has {} rows, z + xBC + dt = {need} (the loader checks its shape)",
            w.in_proj.out_features()
        );
        let proj = |w| {
            if dv.fp8_weight_only {
                Linear::weight_only(w, dev, dtype)
            } else {
                Linear::from_weight(w, dev, dtype)
            }
        };
        Mamba2 {
            in_proj: proj(w.in_proj),
            conv_weight: float::<3>(&w.conv_weight, dev, dtype).reshape([cfg.conv_dim(), k]),
            conv_bias: w.conv_bias.as_ref().map(|b| float(b, dev, dtype)),
            a: from_vec(w.a_log.iter().map(|v| -v.exp()).collect(), [h], dev, dtype),
            d: from_vec(w.d, [h], dev, dtype),
            dt_bias: from_vec(w.dt_bias, [h], dev, dtype),
            norm: GatedRmsNorm {
                weight: float(&w.norm, dev, dtype),
                groups: if dv.gated_norm_whole_width {
                    1
                } else {
                    cfg.n_groups
                },
                eps,
            },
            out_proj: proj(w.out_proj),
            cfg: cfg.clone(),
            dt_min: dv.dt_min_clamp,
            zero: (
                Tensor::zeros([conv, k - 1], (dev, dtype)),
                Tensor::zeros([h, cfg.head_dim, cfg.state_size], (dev, DType::F32)),
            ),
        }
    }

    /// A zero state: conv in the activation dtype, SSM in f32 whatever the activation dtype.
    pub fn new_state(&self) -> LayerState {
        LayerState::Mamba {
            conv: self.zero.0.clone(),
            ssm: self.zero.1.clone(),
        }
    }

    /// Whether `conv` and `ssm` have this layer's state shapes (`[C, K-1]`, `[H, P, N]`).
    pub(crate) fn check_state(&self, conv: &Tensor<2>, ssm: &Tensor<3>) -> Result<(), String> {
        let (c, s) = (self.zero.0.dims(), self.zero.1.dims());
        if conv.dims() != c || ssm.dims() != s {
            return Err(format!(
                "holds a Mamba state of conv {:?} and SSM {:?} where this layer's are {c:?} and \
                 {s:?}",
                conv.dims(),
                ssm.dims()
            ));
        }
        Ok(())
    }

    /// The SSM state size `N`.
    pub(crate) fn state_size(&self) -> usize {
        self.cfg.state_size
    }

    /// Device bytes one slot of [`Self::new_slots`] takes: the conv ring `[C, K]` in the
    /// activation dtype and the SSM state `[H, P, N]` (f32, or bf16).
    pub fn slot_bytes(&self, ssm: SsmCacheDtype) -> usize {
        let c = &self.cfg;
        let state = match ssm {
            SsmCacheDtype::F32 => DType::F32.size(),
            SsmCacheDtype::Bf16 => DType::BF16.size(),
        };
        c.conv_dim() * c.conv_kernel * self.a.dtype().size()
            + c.num_heads * c.head_dim * c.state_size * state
    }

    /// Zero state pools for `slots` sequences: the conv ring `[S, C, K]` in the activation
    /// dtype (see `NemotronOps::conv_step`), SSM `[S, H, P, N]` f32 (or `[S, H, P, N/2]` I32
    /// words of bf16 pairs).
    pub fn new_slots(&self, slots: usize, ssm: SsmCacheDtype) -> SlotLayer {
        let c = &self.cfg;
        let dev = self.a.device();
        let conv = ops::contiguous(Tensor::zeros(
            [slots, c.conv_dim(), c.conv_kernel],
            (&dev, self.a.dtype()),
        ));
        let shape = [slots, c.num_heads, c.head_dim, c.state_size];
        match ssm {
            SsmCacheDtype::F32 => SlotLayer::Mamba {
                conv,
                ssm: ops::contiguous(Tensor::zeros(shape, (&dev, DType::F32))),
            },
            // Zero words are two bf16 zeros.
            SsmCacheDtype::Bf16 => SlotLayer::Mamba16 {
                conv,
                ssm: ops::contiguous_int(Tensor::zeros(
                    [shape[0], shape[1], shape[2], shape[3] / 2],
                    (&dev, DType::I32),
                )),
            },
        }
    }

    /// One token per row over slot states: `h` `[B, 1, hidden]`; row `b`'s state is slot
    /// `slots[b]` of `pools` (updated in place on device backends), `lens[slot]` tokens before
    /// this one; negative slots are pad rows.
    pub fn step(
        &self,
        h: Tensor<3>,
        pools: &mut SlotLayer,
        lens: &Tensor<1, Int>,
        slots: &Tensor<1, Int>,
    ) -> Tensor<3> {
        let c = &self.cfg;
        let [bsz, _, _] = h.dims();
        let (i, conv, nh, g, n, p) = (
            c.inner(),
            c.conv_dim(),
            c.num_heads,
            c.n_groups,
            c.state_size,
            c.head_dim,
        );
        let [z, xbc, dt] = self.in_proj.forward3(h, [i, conv, nh]);
        let xbc: Tensor<2> = xbc.reshape([bsz, conv]);
        let dt: Tensor<2> = dt.reshape([bsz, nh]);
        let dims = ScanDims {
            heads: nh,
            head_dim: p,
            groups: g,
            state: n,
        };
        let weights = ops::MambaStepWeights {
            conv_weight: &self.conv_weight,
            conv_bias: self.conv_bias.as_ref(),
            dt_bias: &self.dt_bias,
            a: &self.a,
            d: &self.d,
        };
        let y = match pools {
            SlotLayer::Mamba { conv: cpool, ssm } => {
                let (y, cp, sp) = ops::conv_ssm_step(
                    xbc,
                    dt,
                    weights,
                    cpool.clone(),
                    ssm.clone(),
                    lens,
                    slots,
                    dims,
                    self.dt_min,
                );
                (*cpool, *ssm) = (cp, sp);
                y
            }
            SlotLayer::Mamba16 { conv: cpool, ssm } => {
                let (y, cp, sp) = ops::conv_ssm_step_bf16(
                    xbc,
                    dt,
                    weights,
                    cpool.clone(),
                    ssm.clone(),
                    lens,
                    slots,
                    dims,
                    self.dt_min,
                );
                (*cpool, *ssm) = (cp, sp);
                y
            }
            other => panic!("a Mamba layer's slots hold {other:?}"),
        };
        if let Linear::Fp8(w) = &self.out_proj {
            // The gated norm inside `out_proj`'s launch where the backend can.
            let n = &self.norm;
            let y = ops::fp8_gated_linear(
                y.reshape([bsz, i]),
                z.reshape([bsz, i]),
                n.weight.clone(),
                n.groups,
                n.eps,
                w,
            );
            return y.reshape([bsz, 1, self.out_proj.out_features()]);
        }
        let u = self.norm.forward(y.reshape([bsz, 1, i]), z);
        self.out_proj.forward(u, Epilogue::None)
    }

    /// `h`: `[B, T, hidden]`, right-padded; `lens[b]` valid positions of sequence `b`.
    pub fn forward(
        &self,
        h: Tensor<3>,
        lens: &[usize],
        states: &mut [&mut SequenceState],
        layer: usize,
    ) -> Tensor<3> {
        self.forward_kept(h, lens, states, layer).0
    }

    /// [`Self::forward`], also returning the batch's new states whole (they are split into
    /// `states` too).
    pub(crate) fn forward_kept(
        &self,
        h: Tensor<3>,
        lens: &[usize],
        states: &mut [&mut SequenceState],
        layer: usize,
    ) -> (Tensor<3>, BatchLayer) {
        let c = &self.cfg;
        let [bsz, t, _] = h.dims();
        let (i, nh, g, n, p) = (c.inner(), c.num_heads, c.n_groups, c.state_size, c.head_dim);
        let [z, xbc, dt] = self.in_proj.forward3(h, [i, c.conv_dim(), nh]);

        let (conv_states, ssm_states): (Vec<_>, Vec<_>) = states
            .iter()
            .map(|s| match &s.layers[layer] {
                LayerState::Mamba { conv, ssm } => (conv.clone(), ssm.clone()),
                other => panic!("layer {layer} holds {other:?}, expected Mamba state"),
            })
            .unzip();
        // A sequence at position 0 has consumed nothing: its state is the zero state. A batch of
        // them starts the conv from one zero tensor (2 launches) instead of a stack of B copies
        // (B + 1), and the scan from no state at all (its kernels skip the incoming state's terms).
        let fresh = states.iter().all(|s| s.position == 0);
        let conv_state = if fresh && bsz > 1 {
            let dev = self.a.device();
            let [cc, ck] = self.zero.0.dims();
            Tensor::zeros([bsz, cc, ck], (&dev, self.zero.0.dtype()))
        } else {
            crate::util::stack(conv_states)
        };
        let ssm_state = (!fresh).then(|| crate::util::stack(ssm_states));

        // The conv writes x, B and C as three dense tensors: their reshapes are free.
        let ([x, bm, cm], conv_state) = ops::causal_conv1d3(
            xbc,
            self.conv_weight.clone(),
            self.conv_bias.clone(),
            conv_state,
            lens,
            [i, g * n, g * n],
        );
        let x = x.reshape([bsz, t, nh, p]);
        let bm = bm.reshape([bsz, t, g, n]);
        let cm = cm.reshape([bsz, t, g, n]);
        let dt = ops::dt_softplus(dt, self.dt_bias.clone(), self.dt_min);
        let (y, ssm_state) = ops::selective_scan(
            x,
            dt,
            self.a.clone(),
            bm,
            cm,
            self.d.clone(),
            ssm_state,
            lens,
        );

        let kept = BatchLayer::Mamba {
            conv: conv_state.clone(),
            ssm: ssm_state.clone(),
        };
        if let [s] = states {
            s.layers[layer] = LayerState::Mamba {
                conv: conv_state.squeeze_dim(0),
                ssm: ssm_state.squeeze_dim(0),
            };
        } else {
            for (b, s) in states.iter_mut().enumerate() {
                s.layers[layer] = LayerState::Mamba {
                    conv: conv_state.clone().slice_dim(0, b..b + 1).squeeze_dim(0),
                    ssm: ssm_state.clone().slice_dim(0, b..b + 1).squeeze_dim(0),
                };
            }
        }
        if let Linear::Fp8(w) = &self.out_proj {
            // The gated norm and `out_proj` together where the backend can (for many rows the
            // norm writes the E4M3 codes the tensor-core kernel reads).
            let n = &self.norm;
            let y = ops::fp8_gated_linear(
                y.reshape([bsz * t, i]),
                z.reshape([bsz * t, i]),
                n.weight.clone(),
                n.groups,
                n.eps,
                w,
            );
            let y = y.reshape([bsz, t, self.out_proj.out_features()]);
            return (y, kept);
        }
        let u = self.norm.forward(y.reshape([bsz, t, i]), z);
        (self.out_proj.forward(u, Epilogue::None), kept)
    }
}
