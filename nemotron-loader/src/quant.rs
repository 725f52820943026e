//! The quantization recipe: resolves every linear of the model to exactly one [`WeightForm`].
//!
//! Sources, as NVIDIA ModelOpt writes them and vLLM reads them:
//! - `config.json` → `quantization_config` (`quant_method: "modelopt"`, exclusions under `ignore`,
//!   KV cache under `kv_cache_scheme` or `kv_cache_quant_algo`);
//! - `hf_quant_config.json` → `quantization` (exclusions under `exclude_modules`).
//!
//! When both exist they must agree. Forms: MIXED_PRECISION (a per-module `quantized_layers` map),
//! a single legacy algorithm (`NVFP4`, `W4A16_NVFP4`, `FP8`) applied to every linear not excluded,
//! or no quantization.

use crate::error::{LoadError, Result};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The only NVFP4 block size this crate (and every released checkpoint) uses.
pub const SUPPORTED_GROUP_SIZE: u64 = 16;

/// What a NVFP4 checkpoint declared for activations. Both run as weight-only (W4A16) here, the
/// way vLLM runs NVFP4 on Hopper: activations stay in floating point and `input_scale` is unused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Nvfp4Activations {
    /// `quant_algo: NVFP4`: declared W4A4; ships `input_scale`.
    W4A4,
    /// `quant_algo: W4A16_NVFP4`: weight-only; no `input_scale`.
    W4A16,
}

/// The stored form of one linear's weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightForm {
    /// BF16 / F16 / F32 `[out, in]`.
    Dense,
    /// Packed E2M1 `[out, in/2]` + E4M3 block scales `[out, in/16]` + F32 global scale.
    Nvfp4(Nvfp4Activations),
    /// Per-tensor static FP8 W8A8: E4M3 `[out, in]` + F32 `weight_scale` + F32 `input_scale`.
    Fp8,
}

impl WeightForm {
    pub fn name(self) -> &'static str {
        match self {
            WeightForm::Dense => "dense",
            WeightForm::Nvfp4(Nvfp4Activations::W4A4) => "NVFP4 (W4A4-declared)",
            WeightForm::Nvfp4(Nvfp4Activations::W4A16) => "W4A16_NVFP4",
            WeightForm::Fp8 => "FP8 (W8A8 per-tensor)",
        }
    }
}

/// How the recipe is described.
#[derive(Debug, Clone, PartialEq)]
pub enum RecipeKind {
    Unquantized,
    /// One algorithm for every linear not excluded.
    Single(WeightForm),
    /// `MIXED_PRECISION`: per-module algorithms; modules not listed stay dense.
    Mixed(BTreeMap<String, WeightForm>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct QuantRecipe {
    pub kind: RecipeKind,
    /// Exclusion patterns, with ModelOpt's trailing `name*` expanded to `name` and `name.*`.
    pub exclude: Vec<String>,
    /// The KV cache is declared FP8 (k/v scales may ship).
    pub kv_cache_fp8: bool,
    /// Where the recipe came from (for the report).
    pub source: String,
    /// `producer.name` `producer.version`, when given.
    pub producer: Option<String>,
}

impl QuantRecipe {
    pub fn unquantized() -> Self {
        QuantRecipe {
            kind: RecipeKind::Unquantized,
            exclude: vec![],
            kv_cache_fp8: false,
            source: "none".into(),
            producer: None,
        }
    }

    /// Reads the recipe from `config.json`'s `quantization_config` and/or the content of
    /// `hf_quant_config.json`.
    pub fn from_sources(config_json: &Value, hf_quant_config: Option<&Value>) -> Result<Self> {
        let from_config = match config_json
            .get("quantization_config")
            .filter(|v| !v.is_null())
        {
            Some(q) => Some(parse_config_json_form(q)?),
            None => None,
        };
        let from_hf = match hf_quant_config {
            Some(h) => Some(parse_hf_quant_form(h)?),
            None => None,
        };
        match (from_config, from_hf) {
            (None, None) => Ok(QuantRecipe::unquantized()),
            (Some(r), None) | (None, Some(r)) => Ok(r),
            (Some(c), Some(h)) => {
                if c.kind != h.kind {
                    return Err(LoadError::Quant {
                        file: "config.json + hf_quant_config.json".into(),
                        field: "quant_algo".into(),
                        reason: "the two files describe different recipes (algorithm or per-module map differ)".into(),
                    });
                }
                if c.kv_cache_fp8 != h.kv_cache_fp8 {
                    return Err(LoadError::Quant {
                        file: "config.json + hf_quant_config.json".into(),
                        field: "kv_cache_quant_algo".into(),
                        reason: "the two files disagree on the KV cache format".into(),
                    });
                }
                let mut exclude = c.exclude.clone();
                for e in h.exclude {
                    if !exclude.contains(&e) {
                        exclude.push(e);
                    }
                }
                Ok(QuantRecipe {
                    exclude,
                    source: "config.json quantization_config + hf_quant_config.json".into(),
                    ..c
                })
            }
        }
    }

    /// vLLM's exclusion test: exact name, then substring (legacy ModelOpt < 0.39 lists), then
    /// `fnmatch` wildcards.
    pub fn is_excluded(&self, module: &str) -> bool {
        self.exclude.iter().any(|p| {
            p == module
                || module.contains(p.as_str())
                || glob::Pattern::new(p)
                    .map(|g| g.matches(module))
                    .unwrap_or(false)
        })
    }

    /// The stored form of the linear `module` (checkpoint naming, e.g.
    /// `backbone.layers.1.mixer.experts.0.up_proj`, `lm_head`).
    pub fn resolve(&self, module: &str) -> WeightForm {
        if self.is_excluded(module) {
            return WeightForm::Dense;
        }
        match &self.kind {
            RecipeKind::Unquantized => WeightForm::Dense,
            RecipeKind::Single(f) => *f,
            RecipeKind::Mixed(map) => {
                if let Some(f) = map.get(module) {
                    return *f;
                }
                // A container entry (e.g. `...mixer.experts`) covers every linear below it;
                // the deepest one wins.
                module
                    .rmatch_indices('.')
                    .find_map(|(i, _)| map.get(&module[..i]).copied())
                    .unwrap_or(WeightForm::Dense)
            }
        }
    }

    /// Entries of a MIXED_PRECISION map that name no linear among `modules`.
    pub fn unmatched_entries<'a>(&self, modules: impl Iterator<Item = &'a str>) -> Vec<String> {
        let RecipeKind::Mixed(map) = &self.kind else {
            return vec![];
        };
        let mut hit: std::collections::BTreeSet<&str> = Default::default();
        let mods: Vec<&str> = modules.collect();
        for k in map.keys() {
            let covered = mods.iter().any(|m| {
                *m == k || (m.starts_with(k.as_str()) && m.as_bytes().get(k.len()) == Some(&b'.'))
            });
            if covered {
                hit.insert(k);
            }
        }
        map.keys()
            .filter(|k| !hit.contains(k.as_str()))
            .cloned()
            .collect()
    }
}

fn qerr(file: &str, field: impl Into<String>, reason: impl Into<String>) -> LoadError {
    LoadError::Quant {
        file: file.into(),
        field: field.into(),
        reason: reason.into(),
    }
}

const CONFIG: &str = "config.json quantization_config";
const HFQ: &str = "hf_quant_config.json";

fn parse_config_json_form(q: &Value) -> Result<QuantRecipe> {
    let m = q
        .as_object()
        .ok_or_else(|| qerr(CONFIG, "quantization_config", "expected an object"))?;
    if let Some(method) = m.get("quant_method").and_then(Value::as_str) {
        if !method.eq_ignore_ascii_case("modelopt") {
            return Err(qerr(
                CONFIG,
                "quant_method",
                format!("{method:?} is not supported (only ModelOpt checkpoints: \"modelopt\")"),
            ));
        }
    }
    // ModelOpt sometimes nests the legacy form inside config.json too.
    if let Some(inner) = m.get("quantization") {
        return parse_inner(CONFIG, inner, "exclude_modules", m.get("producer"));
    }
    let mut r = parse_inner(CONFIG, q, "ignore", m.get("producer"))?;
    if let Some(s) = m.get("kv_cache_scheme").filter(|v| !v.is_null()) {
        let bits = s.get("num_bits").and_then(Value::as_u64);
        let ty = s.get("type").and_then(Value::as_str);
        if bits == Some(8) && ty == Some("float") {
            r.kv_cache_fp8 = true;
        } else {
            return Err(qerr(
                CONFIG,
                "kv_cache_scheme",
                format!("{s} is not supported (only 8-bit float)"),
            ));
        }
    }
    Ok(r)
}

fn parse_hf_quant_form(h: &Value) -> Result<QuantRecipe> {
    let m = h
        .as_object()
        .ok_or_else(|| qerr(HFQ, "<root>", "expected an object"))?;
    let inner = m
        .get("quantization")
        .ok_or_else(|| qerr(HFQ, "quantization", "missing"))?;
    let mut r = parse_inner(HFQ, inner, "exclude_modules", m.get("producer"))?;
    r.source = HFQ.into();
    Ok(r)
}

fn parse_inner(
    file: &str,
    q: &Value,
    exclude_key: &str,
    producer: Option<&Value>,
) -> Result<QuantRecipe> {
    let m: &Map<String, Value> = q
        .as_object()
        .ok_or_else(|| qerr(file, "quantization", "expected an object"))?;
    let algo = m
        .get("quant_algo")
        .and_then(Value::as_str)
        .ok_or_else(|| qerr(file, "quant_algo", "missing"))?
        .to_ascii_uppercase();

    let exclude_raw = match m.get(exclude_key).or_else(|| {
        m.get(if exclude_key == "ignore" {
            "exclude_modules"
        } else {
            "ignore"
        })
    }) {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| qerr(file, exclude_key, "expected a list of strings"))
            })
            .collect::<Result<Vec<_>>>()?,
        Some(_) => return Err(qerr(file, exclude_key, "expected a list of strings")),
    };
    let mut exclude = vec![];
    for e in exclude_raw {
        // ModelOpt's `module_path*` means the module and everything below it.
        if e.len() >= 2 && e.ends_with('*') && !e.ends_with(".*") {
            exclude.push(e[..e.len() - 1].to_string());
            exclude.push(format!("{}.*", &e[..e.len() - 1]));
        } else {
            exclude.push(e);
        }
    }

    let kv_cache_fp8 = match m.get("kv_cache_quant_algo") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("FP8") => true,
        Some(v) => {
            return Err(qerr(
                file,
                "kv_cache_quant_algo",
                format!("{v} is not supported (only \"FP8\" or null)"),
            ))
        }
    };

    let top_group = m.get("group_size").filter(|v| !v.is_null());
    let kind = if algo == "MIXED_PRECISION" {
        let layers = m
            .get("quantized_layers")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                qerr(
                    file,
                    "quantized_layers",
                    "missing (MIXED_PRECISION needs the per-module map)",
                )
            })?;
        let mut map = BTreeMap::new();
        for (module, entry) in layers {
            let a = entry
                .get("quant_algo")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    qerr(
                        file,
                        format!("quantized_layers.{module}.quant_algo"),
                        "missing",
                    )
                })?
                .to_ascii_uppercase();
            let field = format!("quantized_layers.{module}");
            let form = algo_form(file, &field, &a)?;
            if matches!(form, WeightForm::Nvfp4(_)) {
                check_group(
                    file,
                    &format!("{field}.group_size"),
                    entry
                        .get("group_size")
                        .filter(|v| !v.is_null())
                        .or(top_group),
                )?;
            }
            map.insert(module.clone(), form);
        }
        RecipeKind::Mixed(map)
    } else {
        let form = algo_form(file, "quant_algo", &algo)?;
        if matches!(form, WeightForm::Nvfp4(_)) {
            let g = top_group.ok_or_else(|| {
                qerr(file, "group_size", format!("missing (required for {algo})"))
            })?;
            check_group(file, "group_size", Some(g))?;
        }
        RecipeKind::Single(form)
    };

    let producer = producer.map(|p| {
        let n = p.get("name").and_then(Value::as_str).unwrap_or("?");
        let v = p.get("version").and_then(Value::as_str).unwrap_or("?");
        format!("{n} {v}")
    });
    Ok(QuantRecipe {
        kind,
        exclude,
        kv_cache_fp8,
        source: file.into(),
        producer,
    })
}

fn algo_form(file: &str, field: &str, algo: &str) -> Result<WeightForm> {
    Ok(match algo {
        "NVFP4" => WeightForm::Nvfp4(Nvfp4Activations::W4A4),
        "W4A16_NVFP4" => WeightForm::Nvfp4(Nvfp4Activations::W4A16),
        "FP8" => WeightForm::Fp8,
        "FP8_PER_CHANNEL_PER_TOKEN"
        | "FP8_PB_WO"
        | "MXFP8"
        | "W4A8_AWQ"
        | "W4A16_AWQ"
        | "W8A8_SQ"
        | "NVFP4_AWQ"
        | "W4A8_NVFP4_FP8" => {
            return Err(qerr(file, field, format!("quant_algo {algo} is a known ModelOpt algorithm that this loader does not support yet")));
        }
        "MIXED_PRECISION" => return Err(qerr(file, field, "MIXED_PRECISION cannot be nested")),
        other => return Err(qerr(file, field, format!("unknown quant_algo {other:?}"))),
    })
}

fn check_group(file: &str, field: &str, g: Option<&Value>) -> Result<()> {
    match g {
        None => Ok(()), // vLLM's default for NVFP4 entries is 16
        Some(v) => match v.as_u64() {
            Some(SUPPORTED_GROUP_SIZE) => Ok(()),
            _ => Err(qerr(
                file,
                field,
                format!("{v} is not supported (NVFP4 blocks are 16 elements)"),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn legacy_exclusions_match_like_vllm() {
        let h = json!({"producer": {"name": "modelopt", "version": "0.29.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
            "exclude_modules": ["lm_head", "backbone.layers.4.mixer.in_proj", "*conv1d*", "mtp*"]}});
        let r = QuantRecipe::from_sources(&json!({}), Some(&h)).unwrap();
        assert_eq!(r.resolve("lm_head"), WeightForm::Dense);
        assert_eq!(
            r.resolve("backbone.layers.4.mixer.in_proj"),
            WeightForm::Dense
        );
        assert_eq!(
            r.resolve("backbone.layers.4.mixer.out_proj"),
            WeightForm::Nvfp4(Nvfp4Activations::W4A4)
        );
        assert_eq!(
            r.resolve("backbone.layers.7.mixer.conv1d"),
            WeightForm::Dense
        );
        assert_eq!(r.resolve("mtp.layers.0.eh_proj"), WeightForm::Dense);
        assert_eq!(r.resolve("mtp"), WeightForm::Dense);
        // `mtp*` expands to `mtp` and `mtp.*`; `mtp_head` is not below it (but substring "mtp" matches it,
        // as vLLM's legacy substring rule does).
        assert!(r.kv_cache_fp8);
    }

    #[test]
    fn mixed_precision_exact_and_container() {
        let c = json!({"quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
            "kv_cache_scheme": {"dynamic": false, "num_bits": 8, "type": "float"},
            "ignore": ["mtp*", "backbone.embeddings"],
            "quantized_layers": {
                "backbone.layers.0.mixer.in_proj": {"quant_algo": "FP8"},
                "backbone.layers.1.mixer.experts": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
                "lm_head": {"quant_algo": "W4A16_NVFP4", "group_size": 16}}}});
        let r = QuantRecipe::from_sources(&c, None).unwrap();
        assert_eq!(
            r.resolve("backbone.layers.0.mixer.in_proj"),
            WeightForm::Fp8
        );
        assert_eq!(
            r.resolve("backbone.layers.0.mixer.out_proj"),
            WeightForm::Dense
        );
        assert_eq!(
            r.resolve("backbone.layers.1.mixer.experts.7.up_proj"),
            WeightForm::Nvfp4(Nvfp4Activations::W4A16)
        );
        assert_eq!(
            r.resolve("backbone.layers.1.mixer.experts_x.up_proj"),
            WeightForm::Dense
        );
        assert_eq!(
            r.resolve("lm_head"),
            WeightForm::Nvfp4(Nvfp4Activations::W4A16)
        );
        assert!(r.kv_cache_fp8);
    }

    #[test]
    fn refusals_name_the_culprit() {
        let bad = |q: Value, needle: &str| {
            let e = QuantRecipe::from_sources(&json!({ "quantization_config": q }), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{e} should mention {needle}");
        };
        bad(
            json!({"quant_method": "modelopt", "quant_algo": "INT3"}),
            "INT3",
        );
        bad(
            json!({"quant_method": "modelopt", "quant_algo": "FP8_PB_WO"}),
            "FP8_PB_WO",
        );
        bad(
            json!({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}),
            "group_size",
        );
        bad(
            json!({"quant_method": "modelopt", "quant_algo": "NVFP4"}),
            "group_size",
        );
        bad(
            json!({"quant_method": "gptq", "quant_algo": "NVFP4"}),
            "gptq",
        );
        bad(
            json!({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                "quantized_layers": {"lm_head": {"quant_algo": "W4A16_NVFP4", "group_size": 32}}}),
            "quantized_layers.lm_head.group_size",
        );
        bad(
            json!({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                "quantized_layers": {"backbone.layers.0.mixer.in_proj": {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}}}),
            "backbone.layers.0.mixer.in_proj",
        );
    }
}
