//! Opening a checkpoint directory: config, recipe, shards, validation against the plan,
//! materialization of the still-packed weights, and the load report.

use crate::config::{LayerKind, NemotronHConfig};
use crate::error::{LoadError, Result};
use crate::formats;
use crate::plan::{Plan, Role, Spec, DEFERRED_PREFIXES};
use crate::quant::{QuantRecipe, WeightForm};
use crate::report::LoadReport;
use crate::shards::{Entry, ShardSet};
use crate::tensor::{DType, HostTensor};
use crate::weights::*;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Progress of a load, reported once per materialized tensor.
#[derive(Debug, Clone, Copy)]
pub struct LoadProgress {
    pub tensors_done: usize,
    pub tensors_total: usize,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// Options of [`Checkpoint::load_with`].
#[derive(Default)]
pub struct LoadOptions<'a> {
    /// Called after each tensor is copied out of the mapping.
    pub progress: Option<Box<dyn FnMut(LoadProgress) + 'a>>,
}

/// A loaded checkpoint: validated config, recipe, typed weights and the report.
#[derive(Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: NemotronHConfig,
    pub recipe: QuantRecipe,
    pub weights: ModelWeights,
    pub report: LoadReport,
}

/// Reads `config.json` and the quantization recipe of a checkpoint directory.
pub fn read_config(dir: &Path) -> Result<(NemotronHConfig, QuantRecipe)> {
    let cfg_path = dir.join("config.json");
    let cfg_value = read_json(&cfg_path)?;
    let config = NemotronHConfig::from_value(&cfg_value)?;
    let hq_path = dir.join("hf_quant_config.json");
    let hq = if hq_path.exists() {
        Some(read_json(&hq_path)?)
    } else {
        None
    };
    let recipe = QuantRecipe::from_sources(&cfg_value, hq.as_ref())?;
    Ok((config, recipe))
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: path.into(),
        source,
    })?;
    serde_json::from_str(&text).or_else(|e| {
        // Python's json module writes bare `Infinity` / `NaN` (transformers saves
        // `time_step_limit: [0.0, Infinity]`); read them as the strings "inf" / "nan".
        let fixed = quote_nonfinite(&text);
        if fixed == text {
            return Err(LoadError::Json {
                path: path.into(),
                source: e,
            });
        }
        serde_json::from_str(&fixed).map_err(|_| LoadError::Json {
            path: path.into(),
            source: e,
        })
    })
}

/// Replaces the non-standard number tokens `Infinity`, `-Infinity` and `NaN` outside strings by
/// the JSON strings `"inf"`, `"-inf"` and `"nan"`.
fn quote_nonfinite(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut in_str = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_str {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        let token = [
            ("-Infinity", "\"-inf\""),
            ("Infinity", "\"inf\""),
            ("NaN", "\"nan\""),
        ]
        .into_iter()
        .find(|(t, _)| rest.starts_with(t));
        if let Some((t, q)) = token {
            out.push_str(q);
            rest = &rest[t.len()..];
            continue;
        }
        if c == '"' {
            in_str = true;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

impl Checkpoint {
    /// Loads and validates a checkpoint directory.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_with(dir, LoadOptions::default())
    }

    pub fn load_with(dir: impl AsRef<Path>, mut opts: LoadOptions<'_>) -> Result<Self> {
        let dir = dir.as_ref();
        let (config, recipe) = read_config(dir)?;
        let shards = ShardSet::open(dir)?;
        Plan::check_claims(&config, shards.entries.len())?;
        let plan = Plan::new(&config, &recipe)?;

        // 1. Enumerate: every tensor present must be planned, every planned one present, in the
        //    declared dtype and shape.
        let mut matched: Vec<(&Entry, &Spec)> = Vec::with_capacity(shards.entries.len());
        for e in &shards.entries {
            match plan.get(&e.name) {
                Some(s) => matched.push((e, s)),
                None => {
                    return Err(LoadError::UnexpectedTensor {
                        tensor: e.name.clone(),
                        file: shards.shards[e.shard].path.clone(),
                    })
                }
            }
        }
        for s in &plan.specs {
            match shards.get(&s.name) {
                None if s.optional => {}
                None => {
                    return Err(LoadError::MissingTensor {
                        tensor: s.name.clone(),
                        what: s.what.clone(),
                    })
                }
                Some(e) => check_entry(&shards, e, s)?,
            }
        }
        check_kv_pairs(&plan, &shards)?;

        // 2. Materialize, shard by shard in file order, releasing mapped pages as we go.
        let mut order: Vec<(&Entry, &Spec)> = matched
            .iter()
            .copied()
            .filter(|(_, s)| !s.deferred)
            .collect();
        order.sort_by_key(|(e, _)| (e.shard, e.start));
        let mut progress = LoadProgress {
            tensors_done: 0,
            tensors_total: order.len(),
            bytes_done: 0,
            bytes_total: order.iter().map(|(e, _)| (e.end - e.start) as u64).sum(),
        };
        let mut held: HashMap<String, HostTensor> = HashMap::with_capacity(order.len());
        let mut report = LoadReport::new(&recipe, &config, &shards);
        for (e, s) in order {
            let shipped = e.dtype.clone().map_err(|d| {
                LoadError::Internal(format!("`{}` has unchecked dtype {d}", e.name))
            })?;
            let t = materialize(&shards, e, s)?;
            shards.release(e);
            report.count_materialized(s, shipped, (e.end - e.start) as u64, t.bytes.len() as u64);
            held.insert(t.name.clone(), t);
            progress.tensors_done += 1;
            progress.bytes_done += (e.end - e.start) as u64;
            if let Some(cb) = opts.progress.as_mut() {
                cb(progress);
            }
        }
        for &(e, s) in &matched {
            if s.deferred {
                let prefix = DEFERRED_PREFIXES
                    .iter()
                    .find(|p| e.name.starts_with(**p))
                    .copied()
                    .unwrap_or("other");
                report.count_deferred(prefix, (e.end - e.start) as u64);
            }
        }
        for l in plan.linears.iter().filter(|l| !l.deferred) {
            report.count_projection(l.form);
        }
        report.unmatched_recipe_entries =
            recipe.unmatched_entries(plan.linears.iter().map(|l| l.module.as_str()));
        report.finish();

        // 3. Assemble the typed weights.
        let weights = assemble(&config, &plan, &mut held)?;
        debug_assert!(
            held.is_empty(),
            "unassembled tensors: {:?}",
            held.keys().collect::<Vec<_>>()
        );
        drop(shards);
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            recipe,
            weights,
            report,
        })
    }
}

impl Checkpoint {
    /// Builds a checkpoint from tensors already in memory (the synthetic models), held to the
    /// same plan as a load: unexpected, missing, mistyped or misshapen tensors are refused; the
    /// MTP tower is deferred; `A_log`/`D`/`dt_bias` are widened to f32.
    pub fn from_tensors(
        config: NemotronHConfig,
        recipe: QuantRecipe,
        tensors: Vec<HostTensor>,
    ) -> Result<Self> {
        Plan::check_claims(&config, tensors.len())?;
        let plan = Plan::new(&config, &recipe)?;
        let source: u64 = tensors.iter().map(|t| t.bytes.len() as u64).sum();
        let mut report = LoadReport::empty(&recipe, &config, tensors.len(), source, 0, 0);
        let mut held: HashMap<String, HostTensor> = HashMap::with_capacity(tensors.len());
        let memory = PathBuf::from("<memory>");
        for t in tensors {
            let s = plan
                .get(&t.name)
                .ok_or_else(|| LoadError::UnexpectedTensor {
                    tensor: t.name.clone(),
                    file: memory.clone(),
                })?;
            if !s.allowed.contains(&t.dtype) || !s.shape_matches(&t.shape) {
                return Err(LoadError::Shape {
                    tensor: t.name,
                    file: memory,
                    found: t.shape,
                    expected: s.shape.clone(),
                    what: s.what.clone(),
                });
            }
            if s.deferred {
                let prefix = DEFERRED_PREFIXES
                    .iter()
                    .find(|p| t.name.starts_with(**p))
                    .copied()
                    .unwrap_or("other");
                report.count_deferred(prefix, t.bytes.len() as u64);
                continue;
            }
            let shipped = t.dtype;
            let source = t.bytes.len() as u64;
            let t = if s.role == Role::Widened && t.dtype != DType::F32 {
                let v = t.to_f32_vec().ok_or_else(|| {
                    LoadError::Internal(format!("`{}` is widened but not a float", t.name))
                })?;
                HostTensor {
                    bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    dtype: DType::F32,
                    ..t
                }
            } else {
                t
            };
            report.count_materialized(s, shipped, source, t.bytes.len() as u64);
            held.insert(t.name.clone(), t);
        }
        for s in plan.specs.iter().filter(|s| !s.optional && !s.deferred) {
            if !held.contains_key(&s.name) {
                return Err(LoadError::MissingTensor {
                    tensor: s.name.clone(),
                    what: s.what.clone(),
                });
            }
        }
        for l in plan.linears.iter().filter(|l| !l.deferred) {
            report.count_projection(l.form);
        }
        report.finish();
        let weights = assemble(&config, &plan, &mut held)?;
        Ok(Checkpoint {
            dir: memory,
            config,
            recipe,
            weights,
            report,
        })
    }
}

fn check_entry(shards: &ShardSet, e: &Entry, s: &Spec) -> Result<()> {
    let file = || shards.shards[e.shard].path.clone();
    let allowed = || {
        s.allowed
            .iter()
            .map(|d| d.name())
            .collect::<Vec<_>>()
            .join(" or ")
    };
    match &e.dtype {
        Ok(d) if s.allowed.contains(d) => {}
        Ok(d) => {
            return Err(LoadError::Dtype {
                tensor: e.name.clone(),
                file: file(),
                found: d.name().into(),
                expected: allowed(),
                what: s.what.clone(),
            })
        }
        Err(d) => {
            return Err(LoadError::Dtype {
                tensor: e.name.clone(),
                file: file(),
                found: d.clone(),
                expected: allowed(),
                what: s.what.clone(),
            })
        }
    }
    if !s.shape_matches(&e.shape) {
        return Err(LoadError::Shape {
            tensor: e.name.clone(),
            file: file(),
            found: e.shape.clone(),
            expected: s.shape.clone(),
            what: s.what.clone(),
        });
    }
    Ok(())
}

/// A KV cache scale without its partner would leave one of K/V unscaled.
fn check_kv_pairs(plan: &Plan, shards: &ShardSet) -> Result<()> {
    for s in plan
        .specs
        .iter()
        .filter(|s| s.role == Role::KvScale && s.name.ends_with(".k_scale"))
    {
        let v = s.name.replace("k_proj.k_scale", "v_proj.v_scale");
        match (shards.get(&s.name).is_some(), shards.get(&v).is_some()) {
            (true, false) => {
                return Err(LoadError::MissingTensor {
                    tensor: v,
                    what: format!("{} (its k_scale ships)", s.what),
                })
            }
            (false, true) => {
                return Err(LoadError::MissingTensor {
                    tensor: s.name.clone(),
                    what: format!("{} (its v_scale ships)", s.what),
                })
            }
            _ => {}
        }
    }
    Ok(())
}

/// Copies one tensor out of the mapping (widening `A_log`/`D`/`dt_bias` to f32) and checks the
/// values a wrong byte would make unusable.
fn materialize(shards: &ShardSet, e: &Entry, s: &Spec) -> Result<HostTensor> {
    let src = shards.bytes(e);
    let dtype = e
        .dtype
        .clone()
        .map_err(|d| LoadError::Internal(format!("`{}` has unchecked dtype {d}", e.name)))?;
    let bad = |reason: String| LoadError::BadValue {
        tensor: e.name.clone(),
        file: shards.shards[e.shard].path.clone(),
        reason,
    };
    let (dtype, bytes) = match s.role {
        Role::Widened if dtype != DType::F32 => {
            let n: usize = e.shape.iter().product();
            let mut out = Vec::with_capacity(4 * n);
            for i in 0..n {
                let v = match dtype {
                    DType::BF16 => formats::bf16_at(src, i),
                    DType::F16 => formats::f16_at(src, i),
                    _ => unreachable!("plan allows floats only"),
                };
                out.extend_from_slice(&v.to_le_bytes());
            }
            (DType::F32, out)
        }
        Role::Nvfp4GlobalScale
        | Role::Nvfp4InputScale
        | Role::Fp8WeightScale
        | Role::Fp8InputScale
        | Role::KvScale => {
            let v = formats::f32_at(src, 0);
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(format!(
                    "scale is {v}; the scales of {} must be finite and > 0",
                    s.what
                )));
            }
            (dtype, src.to_vec())
        }
        Role::Nvfp4BlockScale => {
            let cols = e.shape[1];
            if let Some(i) = src
                .iter()
                .position(|&b| formats::e4m3_is_nan(b) || (b & 0x80 != 0 && b != 0x80))
            {
                return Err(bad(format!(
                    "block scale at row {}, block {} is {:#04x} ({}); block scales must be finite and non-negative",
                    i / cols,
                    i % cols,
                    src[i],
                    formats::e4m3_to_f32(src[i])
                )));
            }
            (dtype, src.to_vec())
        }
        Role::Fp8Weight => {
            if let Some(i) = src.iter().position(|&b| formats::e4m3_is_nan(b)) {
                let cols = e.shape[1];
                return Err(bad(format!(
                    "FP8 weight at row {}, column {} is NaN ({:#04x})",
                    i / cols,
                    i % cols,
                    src[i]
                )));
            }
            (dtype, src.to_vec())
        }
        _ => (dtype, src.to_vec()),
    };
    Ok(HostTensor {
        name: e.name.clone(),
        dtype,
        shape: e.shape.clone(),
        bytes,
    })
}

struct Take<'a> {
    held: &'a mut HashMap<String, HostTensor>,
    plan: &'a Plan,
}

impl Take<'_> {
    fn tensor(&mut self, name: &str) -> Result<HostTensor> {
        self.held
            .remove(name)
            .ok_or_else(|| LoadError::MissingTensor {
                tensor: name.into(),
                what: self
                    .plan
                    .get(name)
                    .map_or("the model".into(), |s| s.what.clone()),
            })
    }

    fn opt(&mut self, name: &str) -> Option<HostTensor> {
        self.held.remove(name)
    }

    fn scalar(&mut self, name: &str) -> Result<f32> {
        Ok(formats::f32_at(&self.tensor(name)?.bytes, 0))
    }

    fn f32s(&mut self, name: &str) -> Result<Vec<f32>> {
        self.tensor(name)?
            .to_f32_vec()
            .ok_or_else(|| LoadError::Internal(format!("`{name}` was not widened to f32")))
    }

    fn linear(&mut self, module: &str) -> Result<LinearWeight> {
        let l = self
            .plan
            .linear(module)
            .unwrap_or_else(|| panic!("plan has linear {module}"));
        let (out_features, in_features) = (l.out_features, l.in_features);
        Ok(match l.form {
            WeightForm::Dense => LinearWeight::Dense(self.tensor(&format!("{module}.weight"))?),
            WeightForm::Nvfp4(activations) => LinearWeight::Nvfp4(Nvfp4Weight {
                out_features,
                in_features,
                packed: self.tensor(&format!("{module}.weight"))?,
                block_scales: self.tensor(&format!("{module}.weight_scale"))?,
                weight_scale_2: self.scalar(&format!("{module}.weight_scale_2"))?,
                input_scale: self
                    .opt(&format!("{module}.input_scale"))
                    .map(|t| formats::f32_at(&t.bytes, 0)),
                activations,
            }),
            WeightForm::Fp8 => LinearWeight::Fp8(Fp8Weight {
                out_features,
                in_features,
                weight: self.tensor(&format!("{module}.weight"))?,
                weight_scale: self.scalar(&format!("{module}.weight_scale"))?,
                input_scale: self.scalar(&format!("{module}.input_scale"))?,
            }),
        })
    }
}

fn assemble(
    cfg: &NemotronHConfig,
    plan: &Plan,
    held: &mut HashMap<String, HostTensor>,
) -> Result<ModelWeights> {
    let mut t = Take { held, plan };
    let embeddings = t.tensor("backbone.embeddings.weight")?;
    let norm_f = t.tensor("backbone.norm_f.weight")?;
    let mut layers = Vec::with_capacity(cfg.layers.len());
    for (l, kind) in cfg.layers.iter().enumerate() {
        let p = format!("backbone.layers.{l}");
        let m = format!("{p}.mixer");
        let norm = t.tensor(&format!("{p}.norm.weight"))?;
        let mixer = match kind {
            LayerKind::Mamba => MixerWeights::Mamba(MambaWeights {
                in_proj: t.linear(&format!("{m}.in_proj"))?,
                conv_weight: t.tensor(&format!("{m}.conv1d.weight"))?,
                conv_bias: t.opt(&format!("{m}.conv1d.bias")),
                a_log: t.f32s(&format!("{m}.A_log"))?,
                d: t.f32s(&format!("{m}.D"))?,
                dt_bias: t.f32s(&format!("{m}.dt_bias"))?,
                norm: t.tensor(&format!("{m}.norm.weight"))?,
                out_proj: t.linear(&format!("{m}.out_proj"))?,
            }),
            LayerKind::Moe => {
                let c = cfg
                    .moe
                    .as_ref()
                    .ok_or_else(|| LoadError::Internal("MoE layer without a MoE config".into()))?;
                let router = t.tensor(&format!("{m}.gate.weight"))?;
                let correction_bias = t.tensor(&format!("{m}.gate.e_score_correction_bias"))?;
                let experts = (0..c.n_routed_experts)
                    .map(|x| {
                        Ok(ExpertWeights {
                            up: t.linear(&format!("{m}.experts.{x}.up_proj"))?,
                            down: t.linear(&format!("{m}.experts.{x}.down_proj"))?,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let shared = if c.n_shared_experts > 0 {
                    Some(ExpertWeights {
                        up: t.linear(&format!("{m}.shared_experts.up_proj"))?,
                        down: t.linear(&format!("{m}.shared_experts.down_proj"))?,
                    })
                } else {
                    None
                };
                MixerWeights::Moe(MoeWeights {
                    router,
                    correction_bias,
                    experts,
                    shared,
                })
            }
            LayerKind::Attention => MixerWeights::Attention(AttentionWeights {
                q: t.linear(&format!("{m}.q_proj"))?,
                k: t.linear(&format!("{m}.k_proj"))?,
                v: t.linear(&format!("{m}.v_proj"))?,
                o: t.linear(&format!("{m}.o_proj"))?,
                k_scale: t
                    .opt(&format!("{m}.k_proj.k_scale"))
                    .map(|x| formats::f32_at(&x.bytes, 0)),
                v_scale: t
                    .opt(&format!("{m}.v_proj.v_scale"))
                    .map(|x| formats::f32_at(&x.bytes, 0)),
            }),
            LayerKind::Mlp => MixerWeights::Mlp(MlpWeights {
                up: t.linear(&format!("{m}.up_proj"))?,
                down: t.linear(&format!("{m}.down_proj"))?,
            }),
        };
        layers.push(LayerWeights { norm, mixer });
    }
    let lm_head = if cfg.tie_word_embeddings {
        None
    } else {
        Some(t.linear("lm_head")?)
    };
    Ok(ModelWeights {
        embeddings,
        norm_f,
        lm_head,
        layers,
    })
}
