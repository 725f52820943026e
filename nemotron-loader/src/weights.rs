//! Typed per-layer weights, still in the form the checkpoint shipped them.

use crate::formats;
use crate::quant::{Nvfp4Activations, WeightForm};
use crate::tensor::HostTensor;

/// NVFP4 weight: packed E2M1 codes, E4M3 block scales and the F32 global scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Weight {
    pub out_features: usize,
    pub in_features: usize,
    /// U8 `[out, in/2]`, low nibble = even input column.
    pub packed: HostTensor,
    /// F8_E4M3 `[out, in/16]`, row-major.
    pub block_scales: HostTensor,
    /// Multiplies every element (`amax / 2688`); never inverted.
    pub weight_scale_2: f32,
    /// Calibrated activation scale of W4A4 checkpoints. Unused: NVFP4 runs weight-only here, as
    /// vLLM runs it on Hopper.
    pub input_scale: Option<f32>,
    pub activations: Nvfp4Activations,
}

/// Per-tensor static FP8 (W8A8) weight.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Weight {
    pub out_features: usize,
    pub in_features: usize,
    /// F8_E4M3 `[out, in]`.
    pub weight: HostTensor,
    pub weight_scale: f32,
    /// Static activation scale: `x` is quantized as `e4m3(clamp(x / input_scale, ±448))`.
    pub input_scale: f32,
}

/// One linear in whichever form it shipped.
#[derive(Debug, Clone, PartialEq)]
pub enum LinearWeight {
    /// BF16/F16/F32 `[out, in]`.
    Dense(HostTensor),
    Nvfp4(Nvfp4Weight),
    Fp8(Fp8Weight),
}

impl LinearWeight {
    pub fn out_features(&self) -> usize {
        match self {
            LinearWeight::Dense(t) => t.shape[0],
            LinearWeight::Nvfp4(w) => w.out_features,
            LinearWeight::Fp8(w) => w.out_features,
        }
    }

    pub fn in_features(&self) -> usize {
        match self {
            LinearWeight::Dense(t) => t.shape[1],
            LinearWeight::Nvfp4(w) => w.in_features,
            LinearWeight::Fp8(w) => w.in_features,
        }
    }

    /// Output features `r` as a linear of their own, in the same form (per-tensor scales carry
    /// over; NVFP4 block scales are per row): how a fused projection splits into its parts.
    /// `None` if `r` is out of bounds.
    pub fn rows(&self, r: std::ops::Range<usize>) -> Option<LinearWeight> {
        Some(match self {
            LinearWeight::Dense(t) => LinearWeight::Dense(t.rows(r)?),
            LinearWeight::Nvfp4(w) => LinearWeight::Nvfp4(Nvfp4Weight {
                out_features: r.len(),
                packed: w.packed.rows(r.clone())?,
                block_scales: w.block_scales.rows(r)?,
                ..w.clone()
            }),
            LinearWeight::Fp8(w) => LinearWeight::Fp8(Fp8Weight {
                out_features: r.len(),
                weight: w.weight.rows(r)?,
                ..w.clone()
            }),
        })
    }

    pub fn form(&self) -> WeightForm {
        match self {
            LinearWeight::Dense(_) => WeightForm::Dense,
            LinearWeight::Nvfp4(w) => WeightForm::Nvfp4(w.activations),
            LinearWeight::Fp8(_) => WeightForm::Fp8,
        }
    }

    /// Dequantizes row `r` (one output feature) into `out` (`in_features` long), following the
    /// format definitions. For references and tests; inference consumes the packed form.
    #[allow(
        clippy::expect_used,
        reason = "a dense linear's dtype is checked to be BF16/F16/F32 when it is loaded"
    )]
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) {
        let k = self.in_features();
        assert_eq!(out.len(), k, "dequant_row: output length");
        match self {
            LinearWeight::Dense(t) => {
                for (c, o) in out.iter_mut().enumerate() {
                    *o = t.f32_at(r * k + c).expect("dense linear has a float dtype");
                }
            }
            LinearWeight::Nvfp4(w) => {
                let nb = k / formats::NVFP4_BLOCK;
                formats::nvfp4_dequant_row(
                    &w.packed.bytes[r * k / 2..(r + 1) * k / 2],
                    &w.block_scales.bytes[r * nb..(r + 1) * nb],
                    w.weight_scale_2,
                    out,
                );
            }
            LinearWeight::Fp8(w) => {
                formats::fp8_dequant_row(&w.weight.bytes[r * k..(r + 1) * k], w.weight_scale, out)
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct MambaWeights {
    pub in_proj: LinearWeight,
    /// `[conv_dim, 1, K]`; `[..., K-1]` multiplies the current token.
    pub conv_weight: HostTensor,
    pub conv_bias: Option<HostTensor>,
    /// Widened to f32 at load.
    pub a_log: Vec<f32>,
    pub d: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// Gated group RMSNorm weight `[I]`.
    pub norm: HostTensor,
    pub out_proj: LinearWeight,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ExpertWeights {
    pub up: LinearWeight,
    pub down: LinearWeight,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MoeWeights {
    /// Router `[E, H]` (F32 in the released NVFP4 checkpoints).
    pub router: HostTensor,
    /// Added to the sigmoid scores for expert selection only.
    pub correction_bias: HostTensor,
    pub experts: Vec<ExpertWeights>,
    pub shared: Option<ExpertWeights>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AttentionWeights {
    pub q: LinearWeight,
    pub k: LinearWeight,
    pub v: LinearWeight,
    pub o: LinearWeight,
    /// FP8 KV-cache scales, when the checkpoint ships them.
    pub k_scale: Option<f32>,
    pub v_scale: Option<f32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MlpWeights {
    pub up: LinearWeight,
    pub down: LinearWeight,
}

#[derive(Debug, Clone, PartialEq)]
pub enum MixerWeights {
    Mamba(MambaWeights),
    Moe(MoeWeights),
    Attention(AttentionWeights),
    Mlp(MlpWeights),
}

#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    /// The block's pre-norm `[H]`.
    pub norm: HostTensor,
    pub mixer: MixerWeights,
}

/// Everything the backbone and head need.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelWeights {
    pub embeddings: HostTensor,
    pub norm_f: HostTensor,
    /// `None` when `tie_word_embeddings` is set (the head reuses the embeddings).
    pub lm_head: Option<LinearWeight>,
    pub layers: Vec<LayerWeights>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Nvfp4Activations;
    use crate::tensor::DType;

    fn tensor(name: &str, dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> HostTensor {
        HostTensor {
            name: name.into(),
            dtype,
            shape,
            bytes,
        }
    }

    /// Each part of a split NVFP4 / FP8 / dense linear dequantizes to the whole's rows.
    #[test]
    fn rows_split_a_linear_into_its_parts() {
        let (n, k) = (7, 32);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
            .collect();
        let e = formats::nvfp4_encode(&w, n, k);
        let (q, ws) = formats::fp8_encode(&w);
        let dense: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let forms = [
            LinearWeight::Nvfp4(Nvfp4Weight {
                out_features: n,
                in_features: k,
                packed: tensor("p", DType::U8, vec![n, k / 2], e.packed),
                block_scales: tensor("s", DType::F8E4M3, vec![n, k / 16], e.block_scales),
                weight_scale_2: e.weight_scale_2,
                input_scale: None,
                activations: Nvfp4Activations::W4A16,
            }),
            LinearWeight::Fp8(Fp8Weight {
                out_features: n,
                in_features: k,
                weight: tensor("w", DType::F8E4M3, vec![n, k], q),
                weight_scale: ws,
                input_scale: 0.5,
            }),
            LinearWeight::Dense(tensor("d", DType::F32, vec![n, k], dense)),
        ];
        for whole in forms {
            let mut want = vec![0f32; k];
            let mut got = vec![0f32; k];
            for r in [0..2, 2..6, 6..7] {
                let part = whole.rows(r.clone()).expect("in bounds");
                assert_eq!(part.out_features(), r.len());
                assert_eq!(part.form(), whole.form());
                for (i, row) in r.clone().enumerate() {
                    whole.dequant_row(row, &mut want);
                    part.dequant_row(i, &mut got);
                    assert_eq!(got, want, "{:?} rows {r:?}, row {row}", whole.form());
                }
            }
            assert!(whole.rows(5..8).is_none(), "past the end is refused");
        }
    }
}
