//! `config.json`, read once into a validated [`NemotronHConfig`].
//!
//! Fields that change the math are never defaulted: a missing norm epsilon, head dimension or
//! routing parameter is refused by name. Sub-configs (Mamba, MoE, attention, MLP) are required
//! only when the layer pattern (or the MTP pattern) uses that block type.

use crate::error::{LoadError, Result};
use serde_json::{Map, Value};

/// The largest integer a config field may hold (2^26: 512× the released vocabularies, 64× their
/// context). Every size the plan derives is a product of at most two such fields times small
/// counts, so no derived size overflows; the fuzz test found `n_shared_experts ×
/// moe_shared_expert_intermediate_size` and `num_heads × head_dim` overflowing without it.
pub const MAX_CONFIG_INT: u64 = 1 << 26;

/// The mixer of one layer, by its pattern letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// `M`: Mamba2 mixer.
    Mamba,
    /// `E`: mixture of experts.
    Moe,
    /// `*`: GQA attention without positional encoding.
    Attention,
    /// `-`: dense relu² MLP.
    Mlp,
}

impl LayerKind {
    pub fn letter(self) -> char {
        match self {
            LayerKind::Mamba => 'M',
            LayerKind::Moe => 'E',
            LayerKind::Attention => '*',
            LayerKind::Mlp => '-',
        }
    }

    fn from_letter(c: char) -> Option<Self> {
        Some(match c {
            'M' => LayerKind::Mamba,
            'E' => LayerKind::Moe,
            '*' => LayerKind::Attention,
            '-' => LayerKind::Mlp,
            _ => return None,
        })
    }

    /// Both list spellings: legacy (`mamba`, `attention`) and transformers ≥ 5.15
    /// (`linear_attention`, `full_attention`).
    fn from_name(s: &str) -> Option<Self> {
        Some(match s {
            "mamba" | "linear_attention" => LayerKind::Mamba,
            "moe" => LayerKind::Moe,
            "attention" | "full_attention" => LayerKind::Attention,
            "mlp" => LayerKind::Mlp,
            _ => return None,
        })
    }
}

/// Renders a layer list as a pattern string (`MEM*E…`).
pub fn pattern_string(layers: &[LayerKind]) -> String {
    layers.iter().map(|k| k.letter()).collect()
}

#[derive(Debug, Clone, PartialEq)]
pub struct MambaConfig {
    pub num_heads: usize,
    pub head_dim: usize,
    pub state_size: usize,
    pub n_groups: usize,
    pub conv_kernel: usize,
    pub chunk_size: usize,
    pub conv_bias: bool,
    pub proj_bias: bool,
}

impl MambaConfig {
    /// `I = H · P` (not `expand · hidden`).
    pub fn inner(&self) -> usize {
        self.num_heads * self.head_dim
    }
    /// Width of the convolved `[x | B | C]` slice.
    pub fn conv_dim(&self) -> usize {
        self.inner() + 2 * self.n_groups * self.state_size
    }
    /// Width of `in_proj`'s output `[z | x | B | C | dt]`.
    pub fn in_proj_dim(&self) -> usize {
        self.inner() + self.conv_dim() + self.num_heads
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AttentionConfig {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub bias: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub n_routed_experts: usize,
    pub top_k: usize,
    pub intermediate_size: usize,
    pub n_shared_experts: usize,
    /// Width of the shared expert (already multiplied by `n_shared_experts`, as vLLM does).
    pub shared_intermediate_size: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
    pub bias: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MlpConfig {
    pub intermediate_size: usize,
    pub bias: bool,
}

/// The validated model configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct NemotronHConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub layers: Vec<LayerKind>,
    /// The epsilon of every RMSNorm (block norms, `norm_f`, the Mamba gated norm).
    pub norm_eps: f64,
    /// Which key the epsilon came from.
    pub norm_eps_field: &'static str,
    pub tie_word_embeddings: bool,
    pub mamba: Option<MambaConfig>,
    pub attention: Option<AttentionConfig>,
    pub moe: Option<MoeConfig>,
    pub mlp: Option<MlpConfig>,
    /// The multi-token-prediction tower's layer kinds (empty when there is none).
    pub mtp_layers: Vec<LayerKind>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    /// The trained context length, when the config states it (nothing in the math depends on it:
    /// there is no positional encoding); generation uses it as the default context limit.
    pub max_position_embeddings: Option<usize>,
}

impl NemotronHConfig {
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn count(&self, kind: LayerKind) -> usize {
        self.layers.iter().filter(|&&k| k == kind).count()
    }

    pub fn pattern(&self) -> String {
        pattern_string(&self.layers)
    }

    /// Parses and validates `config.json` text.
    pub fn from_json_str(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text).map_err(|e| LoadError::Json {
            path: "config.json".into(),
            source: e,
        })?;
        Self::from_value(&v)
    }

    /// Parses and validates an already-decoded `config.json`.
    pub fn from_value(v: &Value) -> Result<Self> {
        let m = v
            .as_object()
            .ok_or_else(|| LoadError::config("<root>", "expected a JSON object"))?;
        let f = Fields(m);

        if let Some(mt) = m.get("model_type").and_then(Value::as_str) {
            if mt != "nemotron_h" {
                return Err(LoadError::config(
                    "model_type",
                    format!("is {mt:?}, expected \"nemotron_h\""),
                ));
            }
        }

        let vocab_size = f.pos("vocab_size")?;
        let hidden_size = f.pos("hidden_size")?;
        let layers = parse_layers(m)?;
        if let Some(n) = f.opt_usize("num_hidden_layers")? {
            if n != layers.len() {
                return Err(LoadError::config(
                    "num_hidden_layers",
                    format!("is {n} but the layer pattern has {} layers", layers.len()),
                ));
            }
        }
        if layers.is_empty() {
            return Err(LoadError::config(
                "hybrid_override_pattern",
                "the layer pattern is empty",
            ));
        }

        let (norm_eps, norm_eps_field) = ["layer_norm_epsilon", "norm_eps", "rms_norm_eps"]
            .into_iter()
            .find_map(|k| m.get(k).filter(|v| !v.is_null()).map(|_| k))
            .map(|k| f.f64(k).map(|e| (e, k)))
            .transpose()?
            .ok_or_else(|| {
                LoadError::config(
                    "layer_norm_epsilon",
                    "missing (also no `norm_eps` or `rms_norm_eps`): the RMSNorm epsilon changes the math and is never defaulted",
                )
            })?;
        if !(norm_eps.is_finite() && norm_eps > 0.0) {
            return Err(LoadError::config(
                norm_eps_field,
                format!("must be finite and > 0, got {norm_eps}"),
            ));
        }

        let tie_word_embeddings = f.opt_bool("tie_word_embeddings")?.unwrap_or(false);

        let mtp_layers = parse_mtp_layers(m)?;
        let uses = |k: LayerKind| layers.contains(&k) || mtp_layers.contains(&k);

        let mamba = if uses(LayerKind::Mamba) {
            for (key, want) in [("mamba_hidden_act", "silu")] {
                if let Some(a) = f.opt_str(key)? {
                    if a != want {
                        return Err(LoadError::config(
                            key,
                            format!("{a:?} is not supported (only {want:?})"),
                        ));
                    }
                }
            }
            if let Some(lim) = m.get("time_step_limit").or_else(|| m.get("mamba_dt_limit")) {
                check_dt_limit(lim)?;
            }
            let c = MambaConfig {
                num_heads: f.pos("mamba_num_heads")?,
                head_dim: f.pos("mamba_head_dim")?,
                state_size: f.pos("ssm_state_size")?,
                n_groups: f.pos("n_groups")?,
                conv_kernel: f.pos("conv_kernel")?,
                chunk_size: f.pos("chunk_size")?,
                conv_bias: f.bool("use_conv_bias")?,
                proj_bias: f.opt_bool("use_bias")?.unwrap_or(false),
            };
            if c.num_heads % c.n_groups != 0 {
                return Err(LoadError::config(
                    "n_groups",
                    format!(
                        "mamba_num_heads {} is not divisible by n_groups {}",
                        c.num_heads, c.n_groups
                    ),
                ));
            }
            Some(c)
        } else {
            None
        };

        let attention = if uses(LayerKind::Attention) {
            let num_heads = f.pos("num_attention_heads")?;
            let num_kv_heads = f.pos("num_key_value_heads")?;
            let head_dim = match f.opt_usize("head_dim")? {
                Some(d) => d,
                None => f.opt_usize("attention_head_dim")?.ok_or_else(|| {
                    LoadError::config("head_dim", "missing (also no `attention_head_dim`); it is never derived from hidden_size")
                })?,
            };
            if head_dim == 0 {
                return Err(LoadError::config("head_dim", "must be > 0"));
            }
            if num_heads % num_kv_heads != 0 {
                return Err(LoadError::config(
                    "num_key_value_heads",
                    format!("num_attention_heads {num_heads} is not divisible by num_key_value_heads {num_kv_heads}"),
                ));
            }
            if let Some(w) = m.get("sliding_window").filter(|v| !v.is_null()) {
                return Err(LoadError::config(
                    "sliding_window",
                    format!("{w} is not supported (expected null)"),
                ));
            }
            Some(AttentionConfig {
                num_heads,
                num_kv_heads,
                head_dim,
                bias: f.opt_bool("attention_bias")?.unwrap_or(false),
            })
        } else {
            None
        };

        let relu2 = |f: &Fields| -> Result<()> {
            if let Some(a) = f.opt_str("mlp_hidden_act")? {
                if a != "relu2" {
                    return Err(LoadError::config(
                        "mlp_hidden_act",
                        format!("{a:?} is not supported (only \"relu2\")"),
                    ));
                }
            }
            Ok(())
        };

        let moe = if uses(LayerKind::Moe) {
            relu2(&f)?;
            if let Some(l) = m.get("moe_latent_size").filter(|v| !v.is_null()) {
                return Err(LoadError::config(
                    "moe_latent_size",
                    format!("{l}: latent MoE (Super) is not supported yet"),
                ));
            }
            let n_routed_experts = f.pos("n_routed_experts")?;
            let top_k = f.pos("num_experts_per_tok")?;
            let n_shared_experts = f.usize("n_shared_experts")?;
            let n_group = f.pos("n_group")?;
            let topk_group = f.pos("topk_group")?;
            let shared_intermediate_size = if n_shared_experts > 0 {
                let per = f.pos("moe_shared_expert_intermediate_size")?;
                n_shared_experts.checked_mul(per).ok_or_else(|| {
                    LoadError::config(
                        "moe_shared_expert_intermediate_size",
                        format!("{per} × n_shared_experts {n_shared_experts} overflows"),
                    )
                })?
            } else {
                0
            };
            let routed_scaling_factor = f.f64("routed_scaling_factor")?;
            if !(routed_scaling_factor.is_finite() && routed_scaling_factor > 0.0) {
                return Err(LoadError::config(
                    "routed_scaling_factor",
                    format!("must be finite and > 0, got {routed_scaling_factor}"),
                ));
            }
            if top_k > n_routed_experts {
                return Err(LoadError::config(
                    "num_experts_per_tok",
                    format!("{top_k} exceeds n_routed_experts {n_routed_experts}"),
                ));
            }
            if n_routed_experts % n_group != 0 {
                return Err(LoadError::config(
                    "n_group",
                    format!(
                        "n_routed_experts {n_routed_experts} is not divisible by n_group {n_group}"
                    ),
                ));
            }
            if topk_group > n_group {
                return Err(LoadError::config(
                    "topk_group",
                    format!("{topk_group} exceeds n_group {n_group}"),
                ));
            }
            if n_group > 1 && top_k > topk_group * (n_routed_experts / n_group) {
                return Err(LoadError::config(
                    "num_experts_per_tok",
                    format!("{top_k} exceeds the experts in the {topk_group} kept groups"),
                ));
            }
            Some(MoeConfig {
                n_routed_experts,
                top_k,
                intermediate_size: f.pos("moe_intermediate_size")?,
                n_shared_experts,
                shared_intermediate_size,
                n_group,
                topk_group,
                norm_topk_prob: f.bool("norm_topk_prob")?,
                routed_scaling_factor,
                bias: f.opt_bool("mlp_bias")?.unwrap_or(false),
            })
        } else {
            None
        };

        let mlp = if uses(LayerKind::Mlp) {
            relu2(&f)?;
            Some(MlpConfig {
                intermediate_size: f.pos("intermediate_size")?,
                bias: f.opt_bool("mlp_bias")?.unwrap_or(false),
            })
        } else {
            None
        };

        for (key, on) in [
            ("use_bias", mamba.as_ref().is_some_and(|c| c.proj_bias)),
            ("attention_bias", attention.as_ref().is_some_and(|c| c.bias)),
            (
                "mlp_bias",
                moe.as_ref().is_some_and(|c| c.bias) || mlp.as_ref().is_some_and(|c| c.bias),
            ),
        ] {
            if on {
                return Err(LoadError::config(
                    key,
                    "projection biases are not supported (no released NemotronH has them)",
                ));
            }
        }

        let eos_token_ids = match m.get("eos_token_id") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_u64()
                        .map(|x| x as u32)
                        .ok_or_else(|| LoadError::config("eos_token_id", "expected integers"))
                })
                .collect::<Result<_>>()?,
            Some(x) => vec![x
                .as_u64()
                .ok_or_else(|| LoadError::config("eos_token_id", "expected an integer or a list"))?
                as u32],
        };

        Ok(NemotronHConfig {
            vocab_size,
            hidden_size,
            layers,
            norm_eps,
            norm_eps_field,
            tie_word_embeddings,
            mamba,
            attention,
            moe,
            mlp,
            mtp_layers,
            bos_token_id: f.opt_usize("bos_token_id")?.map(|x| x as u32),
            eos_token_ids,
            pad_token_id: f.opt_usize("pad_token_id")?.map(|x| x as u32),
            max_position_embeddings: f.opt_usize("max_position_embeddings")?,
        })
    }
}

/// vLLM and llama.cpp run dt unclamped; a config asking for a positive lower limit would change
/// the math in a way we do not implement, so it is refused rather than ignored.
fn check_dt_limit(v: &Value) -> Result<()> {
    let ok = match v {
        Value::Null => true,
        Value::Array(a) if a.len() == 2 => {
            let lo = a[0].as_f64();
            // transformers ≥ 5.2x writes `{"__float__": "Infinity"}`; Python's json module a bare
            // `Infinity` (read as "inf").
            let hi = a[1].get("__float__").unwrap_or(&a[1]);
            let hi_inf = hi.is_null()
                || hi.as_f64().is_some_and(|x| x.is_infinite())
                || matches!(hi.as_str(), Some("inf" | "Infinity"));
            lo == Some(0.0) && hi_inf
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(LoadError::config(
            "time_step_limit",
            format!("{v} is not supported: only (0.0, inf), i.e. no dt clamp"),
        ))
    }
}

fn parse_layers(m: &Map<String, Value>) -> Result<Vec<LayerKind>> {
    if let Some(p) = m.get("hybrid_override_pattern").filter(|v| !v.is_null()) {
        let s = p
            .as_str()
            .ok_or_else(|| LoadError::config("hybrid_override_pattern", "expected a string"))?;
        let layers = parse_pattern("hybrid_override_pattern", s)?;
        // Both spellings present: they must agree.
        if let Some(l) = m.get("layers_block_type").filter(|v| !v.is_null()) {
            let other = parse_list("layers_block_type", l)?;
            if other != layers {
                return Err(LoadError::config(
                    "layers_block_type",
                    format!(
                        "{} disagrees with hybrid_override_pattern {s}",
                        pattern_string(&other)
                    ),
                ));
            }
        }
        return Ok(layers);
    }
    if let Some(l) = m.get("layers_block_type").filter(|v| !v.is_null()) {
        return parse_list("layers_block_type", l);
    }
    Err(LoadError::config(
        "hybrid_override_pattern",
        "missing (also no `layers_block_type`): the layer pattern is required",
    ))
}

fn parse_mtp_layers(m: &Map<String, Value>) -> Result<Vec<LayerKind>> {
    let layers = if let Some(v) = m.get("mtp_layers_block_type").filter(|v| !v.is_null()) {
        parse_list("mtp_layers_block_type", v)?
    } else if let Some(v) = m
        .get("mtp_hybrid_override_pattern")
        .filter(|v| !v.is_null())
    {
        let s = v
            .as_str()
            .ok_or_else(|| LoadError::config("mtp_hybrid_override_pattern", "expected a string"))?;
        parse_pattern("mtp_hybrid_override_pattern", s)?
    } else {
        vec![]
    };
    let n =
        match m.get("num_nextn_predict_layers") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                LoadError::config("num_nextn_predict_layers", "expected an integer")
            })?),
        };
    match (n, layers.is_empty()) {
        (Some(0), _) | (None, true) => Ok(vec![]),
        (Some(1), false) | (None, false) => Ok(layers),
        (Some(1), true) => Err(LoadError::config(
            "mtp_layers_block_type",
            "missing while num_nextn_predict_layers is 1 (also no `mtp_hybrid_override_pattern`)",
        )),
        (Some(k), _) => Err(LoadError::config(
            "num_nextn_predict_layers",
            format!("{k} is not supported (0 or 1)"),
        )),
    }
}

fn parse_pattern(field: &str, s: &str) -> Result<Vec<LayerKind>> {
    s.chars()
        .enumerate()
        .map(|(i, c)| {
            LayerKind::from_letter(c).ok_or_else(|| {
                LoadError::config(
                    field,
                    format!("unknown layer letter {c:?} at position {i} (expected M, E, * or -)"),
                )
            })
        })
        .collect()
}

fn parse_list(field: &str, v: &Value) -> Result<Vec<LayerKind>> {
    let a = v
        .as_array()
        .ok_or_else(|| LoadError::config(field, "expected a list of layer type names"))?;
    a.iter()
        .enumerate()
        .map(|(i, x)| {
            let s = x.as_str().ok_or_else(|| LoadError::config(field, format!("entry {i} is not a string")))?;
            LayerKind::from_name(s).ok_or_else(|| {
                LoadError::config(
                    field,
                    format!("unknown layer type {s:?} at index {i} (expected mamba/linear_attention, moe, attention/full_attention or mlp)"),
                )
            })
        })
        .collect()
}

/// Typed, field-naming accessors over the JSON object.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }
    fn opt_usize(&self, k: &str) -> Result<Option<usize>> {
        self.get(k)
            .map(|v| {
                let x = v.as_u64().ok_or_else(|| {
                    LoadError::config(k, format!("expected a non-negative integer, got {v}"))
                })?;
                if x > MAX_CONFIG_INT {
                    return Err(LoadError::config(
                        k,
                        format!("{x} exceeds {MAX_CONFIG_INT}, the largest size this loader takes"),
                    ));
                }
                Ok(x as usize)
            })
            .transpose()
    }
    fn usize(&self, k: &str) -> Result<usize> {
        self.opt_usize(k)?
            .ok_or_else(|| LoadError::config(k, "missing"))
    }
    fn pos(&self, k: &str) -> Result<usize> {
        let x = self.usize(k)?;
        if x == 0 {
            return Err(LoadError::config(k, "must be > 0"));
        }
        Ok(x)
    }
    fn f64(&self, k: &str) -> Result<f64> {
        let v = self.get(k).ok_or_else(|| LoadError::config(k, "missing"))?;
        v.as_f64()
            .ok_or_else(|| LoadError::config(k, format!("expected a number, got {v}")))
    }
    fn opt_bool(&self, k: &str) -> Result<Option<bool>> {
        self.get(k)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| LoadError::config(k, format!("expected true/false, got {v}")))
            })
            .transpose()
    }
    fn bool(&self, k: &str) -> Result<bool> {
        self.opt_bool(k)?
            .ok_or_else(|| LoadError::config(k, "missing"))
    }
    fn opt_str(&self, k: &str) -> Result<Option<&str>> {
        self.get(k)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| LoadError::config(k, format!("expected a string, got {v}")))
            })
            .transpose()
    }
}
