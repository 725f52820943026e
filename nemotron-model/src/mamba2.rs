//! The Mamba2 mixer: in_proj → causal conv + SiLU over `[x|B|C]` → selective scan with D skip →
//! gated group RMSNorm → out_proj.

use crate::cache::{LayerState, SequenceState};
use crate::linear::Linear;
use crate::norm::GatedRmsNorm;
use burn::tensor::Tensor;
use nemotron_kernels::NemotronBackend;
use nemotron_loader::config::MambaConfig;

#[derive(Debug, Clone)]
pub struct Mamba2<B: NemotronBackend> {
    pub in_proj: Linear<B>,
    /// `[C, K]`.
    pub conv_weight: Tensor<B, 2>,
    pub conv_bias: Option<Tensor<B, 1>>,
    /// `A = −exp(A_log)`, `[H]`.
    pub a: Tensor<B, 1>,
    pub d: Tensor<B, 1>,
    pub dt_bias: Tensor<B, 1>,
    pub norm: GatedRmsNorm<B>,
    pub out_proj: Linear<B>,
    pub cfg: MambaConfig,
}

impl<B: NemotronBackend> Mamba2<B> {
    pub fn new_state(&self, dev: &B::Device) -> LayerState<B> {
        let c = &self.cfg;
        LayerState::Mamba {
            conv: Tensor::zeros([c.conv_dim(), c.conv_kernel - 1], dev),
            // The SSM state is f32 whatever the activation dtype.
            ssm: Tensor::zeros(
                [c.num_heads, c.head_dim, c.state_size],
                (dev, burn::tensor::DType::F32),
            ),
        }
    }

    /// `h`: `[B, T, hidden]`, right-padded; `lens[b]` valid positions of sequence `b`.
    pub fn forward(
        &self,
        h: Tensor<B, 3>,
        lens: &[usize],
        states: &mut [&mut SequenceState<B>],
        layer: usize,
        dev_opts: &crate::Deviations,
    ) -> Tensor<B, 3> {
        let c = &self.cfg;
        let [bsz, t, _] = h.dims();
        let (i, conv, nh, g, n, p) = (
            c.inner(),
            c.conv_dim(),
            c.num_heads,
            c.n_groups,
            c.state_size,
            c.head_dim,
        );
        let zxbcdt = self.in_proj.forward(h);
        let z = zxbcdt.clone().slice_dim(2, 0..i);
        let xbc = zxbcdt.clone().slice_dim(2, i..i + conv);
        let dt = zxbcdt.slice_dim(2, i + conv..i + conv + nh);

        let (conv_states, ssm_states): (Vec<_>, Vec<_>) = states
            .iter()
            .map(|s| match &s.layers[layer] {
                LayerState::Mamba { conv, ssm } => (conv.clone(), ssm.clone()),
                other => panic!("layer {layer} holds {other:?}, expected Mamba state"),
            })
            .unzip();
        let conv_state = crate::util::stack(conv_states);
        let ssm_state = crate::util::stack(ssm_states);

        let (xbc, conv_state) = B::causal_conv1d(
            xbc,
            self.conv_weight.clone(),
            self.conv_bias.clone(),
            conv_state,
            lens,
        );
        let x = xbc.clone().slice_dim(2, 0..i).reshape([bsz, t, nh, p]);
        let bm = xbc
            .clone()
            .slice_dim(2, i..i + g * n)
            .reshape([bsz, t, g, n]);
        let cm = xbc
            .slice_dim(2, i + g * n..i + 2 * g * n)
            .reshape([bsz, t, g, n]);
        let dt = B::dt_softplus(dt, self.dt_bias.clone(), dev_opts.dt_min_clamp);
        let (y, ssm_state) = B::selective_scan(
            x,
            dt,
            self.a.clone(),
            bm,
            cm,
            self.d.clone(),
            ssm_state,
            lens,
        );

        for (b, s) in states.iter_mut().enumerate() {
            s.layers[layer] = LayerState::Mamba {
                conv: conv_state.clone().slice_dim(0, b..b + 1).squeeze_dim(0),
                ssm: ssm_state.clone().slice_dim(0, b..b + 1).squeeze_dim(0),
            };
        }
        let u = self
            .norm
            .forward(y.reshape([bsz, t, i]), z, dev_opts.gated_norm_whole_width);
        self.out_proj.forward(u)
    }
}
