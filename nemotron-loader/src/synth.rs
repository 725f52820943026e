//! Synthetic checkpoints in the real layout: names, dtypes, shapes, shards + index, `config.json`,
//! `hf_quant_config.json` / `quantization_config`, MTP tensors; seeded random weights at realistic
//! scales, streamed to disk tensor by tensor so the full 30B-A3B geometry fits in memory.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "the synthetic-checkpoint writer: serializing its own JSON values and joining its own encoder threads; no input reaches these"
)]

use crate::config::{LayerKind, NemotronHConfig};
use crate::error::{LoadError, Result};
use crate::formats;
use crate::plan::{Plan, PlannedLinear, Role, Spec};
use crate::quant::{QuantRecipe, WeightForm};
use crate::shards::{INDEX_FILE, SINGLE_FILE};
use crate::tensor::DType;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// A model geometry (what `config.json` says).
#[derive(Debug, Clone, PartialEq)]
pub struct Geometry {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub pattern: String,
    pub mamba_num_heads: usize,
    pub mamba_head_dim: usize,
    pub ssm_state_size: usize,
    pub n_groups: usize,
    pub conv_kernel: usize,
    pub chunk_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub moe_shared_expert_intermediate_size: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f64,
    pub intermediate_size: usize,
    /// MTP tower pattern (`"*E"` for Lightning), empty for none.
    pub mtp_pattern: String,
    pub norm_eps: f64,
    /// The released configs' context limit (the engine refuses longer prompts by it).
    pub max_position_embeddings: usize,
}

impl Geometry {
    /// A tiny model with every block type, GQA with q width ≠ hidden, grouped routing and an MTP
    /// tower; every NVFP4 input dimension is a multiple of 16.
    pub fn tiny() -> Self {
        Geometry {
            vocab_size: 256,
            hidden_size: 64,
            pattern: "ME*M-E".into(),
            mamba_num_heads: 8,
            mamba_head_dim: 8,
            ssm_state_size: 16,
            n_groups: 2,
            conv_kernel: 4,
            chunk_size: 8,
            num_attention_heads: 6,
            num_key_value_heads: 2,
            head_dim: 16,
            n_routed_experts: 8,
            num_experts_per_tok: 2,
            moe_intermediate_size: 32,
            moe_shared_expert_intermediate_size: 48,
            n_group: 2,
            topk_group: 1,
            routed_scaling_factor: 2.5,
            intermediate_size: 32,
            mtp_pattern: "*E".into(),
            norm_eps: 1e-5,
            max_position_embeddings: 4096,
        }
    }

    /// About 115 M parameters (vocab 32000, hidden 768, 12 layers of every mixer but `-`), for
    /// host benchmarks.
    pub fn small_100m() -> Self {
        Geometry {
            vocab_size: 32000,
            hidden_size: 768,
            pattern: "MEM*EMEM*EME".into(),
            mamba_num_heads: 24,
            mamba_head_dim: 32,
            ssm_state_size: 64,
            n_groups: 2,
            conv_kernel: 4,
            chunk_size: 64,
            num_attention_heads: 12,
            num_key_value_heads: 4,
            head_dim: 64,
            n_routed_experts: 16,
            num_experts_per_tok: 4,
            moe_intermediate_size: 384,
            moe_shared_expert_intermediate_size: 768,
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: 2.5,
            intermediate_size: 1536,
            mtp_pattern: String::new(),
            norm_eps: 1e-5,
            max_position_embeddings: 4096,
        }
    }

    /// Nemotron 3 Nano 30B-A3B (no MTP).
    pub fn nano_30b() -> Self {
        Geometry {
            vocab_size: 131072,
            hidden_size: 2688,
            pattern: "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME".into(),
            mamba_num_heads: 64,
            mamba_head_dim: 64,
            ssm_state_size: 128,
            n_groups: 8,
            conv_kernel: 4,
            chunk_size: 128,
            num_attention_heads: 32,
            num_key_value_heads: 2,
            head_dim: 128,
            n_routed_experts: 128,
            num_experts_per_tok: 6,
            moe_intermediate_size: 1856,
            moe_shared_expert_intermediate_size: 3712,
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: 2.5,
            intermediate_size: 1856,
            mtp_pattern: String::new(),
            norm_eps: 1e-5,
            max_position_embeddings: 262_144,
        }
    }

    /// Nemotron 3.5 Lightning 30B-A3B: the Nano geometry plus a `*E` MTP tower.
    pub fn lightning_30b() -> Self {
        Geometry {
            mtp_pattern: "*E".into(),
            max_position_embeddings: 1_048_576,
            ..Self::nano_30b()
        }
    }

    /// The `config.json` content (string pattern spelling, as the Nano release writes it).
    pub fn config_json(&self) -> Value {
        let mut v = json!({
            "architectures": ["NemotronHForCausalLM"],
            "model_type": "nemotron_h",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.pattern.len(),
            "hybrid_override_pattern": self.pattern,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "attention_bias": false,
            "attention_dropout": 0.0,
            "sliding_window": null,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": 10000,
            "partial_rotary_factor": 1.0,
            "mamba_num_heads": self.mamba_num_heads,
            "mamba_head_dim": self.mamba_head_dim,
            "ssm_state_size": self.ssm_state_size,
            "n_groups": self.n_groups,
            "conv_kernel": self.conv_kernel,
            "chunk_size": self.chunk_size,
            "expand": 2,
            "mamba_hidden_act": "silu",
            "use_conv_bias": true,
            "use_bias": false,
            "mamba_proj_bias": false,
            "time_step_min": 0.001,
            "time_step_max": 0.1,
            "time_step_floor": 0.0001,
            "mamba_ssm_cache_dtype": "float32",
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "n_shared_experts": 1,
            "moe_shared_expert_intermediate_size": self.moe_shared_expert_intermediate_size,
            "n_group": self.n_group,
            "topk_group": self.topk_group,
            "norm_topk_prob": true,
            "routed_scaling_factor": self.routed_scaling_factor,
            "mlp_hidden_act": "relu2",
            "mlp_bias": false,
            "intermediate_size": self.intermediate_size,
            "layer_norm_epsilon": self.norm_eps,
            "norm_eps": self.norm_eps,
            "residual_in_fp32": false,
            "tie_word_embeddings": false,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            "torch_dtype": "bfloat16",
        });
        if !self.mtp_pattern.is_empty() {
            let names: Vec<&str> = self
                .mtp_pattern
                .chars()
                .map(|c| match c {
                    'M' => "mamba",
                    'E' => "moe",
                    '*' => "attention",
                    _ => "mlp",
                })
                .collect();
            v["num_nextn_predict_layers"] = json!(1);
            v["mtp_layers_block_type"] = json!(names);
        }
        v
    }
}

/// The quantization recipes of the released checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthRecipe {
    /// Plain BF16 (no quantization config).
    Bf16,
    /// Nemotron 3 Nano NVFP4: legacy `quant_algo: NVFP4` (W4A4-declared, ships `input_scale`) in
    /// `hf_quant_config.json` with an explicit `exclude_modules` list; FP8 KV declared, no scales.
    NanoNvfp4,
    /// Nemotron 3.5 Lightning: MIXED_PRECISION (W4A16 NVFP4 experts/shared/lm_head, FP8 Mamba
    /// projections), BF16 attention, FP8 KV with k/v scales; in both config files.
    LightningMixed,
}

impl SynthRecipe {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "bf16" => SynthRecipe::Bf16,
            "nano-nvfp4" => SynthRecipe::NanoNvfp4,
            "lightning-mixed" => SynthRecipe::LightningMixed,
            _ => return None,
        })
    }
}

/// How to write.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    pub recipe: SynthRecipe,
    pub seed: u64,
    /// Split into shards of at most about this many bytes (a linear is never split); 0 = one
    /// `model.safetensors`.
    pub max_shard_bytes: u64,
    /// Make every tensor's absolute file offset odd (header length ≢ 0 mod 8), to prove readers
    /// never form typed pointers into the mapping.
    pub misalign: bool,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            recipe: SynthRecipe::Bf16,
            seed: 0,
            max_shard_bytes: 0,
            misalign: false,
        }
    }
}

/// What was written.
#[derive(Debug, Clone)]
pub struct SynthSummary {
    pub tensors: usize,
    pub shards: usize,
    pub data_bytes: u64,
}

/// The quantization JSON a recipe writes for a parsed config: (`quantization_config` for
/// config.json, `hf_quant_config.json` content).
pub fn recipe_json(
    cfg: &NemotronHConfig,
    recipe: SynthRecipe,
) -> Result<(Option<Value>, Option<Value>)> {
    // Enumerate the linears with an unquantized plan.
    let plain = Plan::new(cfg, &QuantRecipe::unquantized())?;
    let modules: Vec<&PlannedLinear> = plain.linears.iter().collect();
    let layer_of = |m: &str| -> Option<usize> {
        m.strip_prefix("backbone.layers.")?
            .split('.')
            .next()?
            .parse()
            .ok()
    };
    Ok(match recipe {
        SynthRecipe::Bf16 => (None, None),
        SynthRecipe::NanoNvfp4 => {
            let mut exclude = vec!["lm_head".to_string()];
            for (l, k) in cfg.layers.iter().enumerate() {
                match k {
                    LayerKind::Attention => {
                        for p in ["q_proj", "k_proj", "v_proj", "o_proj"] {
                            exclude.push(format!("backbone.layers.{l}.mixer.{p}"));
                        }
                    }
                    LayerKind::Mamba => {
                        if cfg.layers.get(l + 1) == Some(&LayerKind::Attention) {
                            exclude.push(format!("backbone.layers.{l}.mixer.in_proj"));
                            exclude.push(format!("backbone.layers.{l}.mixer.out_proj"));
                        }
                        exclude.push(format!("backbone.layers.{l}.mixer.conv1d"));
                    }
                    _ => {}
                }
            }
            if !cfg.mtp_layers.is_empty() {
                exclude.push("mtp*".into());
            }
            let hq = json!({
                "producer": {"name": "modelopt", "version": "0.29.0"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                                 "exclude_modules": exclude}
            });
            (None, Some(hq))
        }
        SynthRecipe::LightningMixed => {
            let mut layers = Map::new();
            let (mut fp8, mut fp4) = (vec![], vec![]);
            for l in &modules {
                if l.module.starts_with("mtp.") {
                    continue;
                }
                let is_mamba =
                    layer_of(&l.module).is_some_and(|i| cfg.layers[i] == LayerKind::Mamba);
                let is_expert = l.module.contains(".experts.")
                    || l.module.contains(".shared_experts.")
                    || l.module == "lm_head";
                if is_mamba {
                    layers.insert(l.module.clone(), json!({"quant_algo": "FP8"}));
                    fp8.push(l.module.clone());
                } else if is_expert {
                    layers.insert(
                        l.module.clone(),
                        json!({"quant_algo": "W4A16_NVFP4", "group_size": 16}),
                    );
                    fp4.push(l.module.clone());
                }
            }
            let mut ignore: Vec<String> = vec![
                "backbone.embeddings".into(),
                "*conv1d*".into(),
                "*mixer.gate*".into(),
            ];
            for (l, k) in cfg.layers.iter().enumerate() {
                if *k == LayerKind::Attention {
                    ignore.push(format!("backbone.layers.{l}.mixer.*_proj"));
                }
            }
            if !cfg.mtp_layers.is_empty() {
                ignore.push("mtp*".into());
            }
            let producer = json!({"name": "modelopt", "version": "0.44.0rc5"});
            let qc = json!({
                "quant_method": "modelopt",
                "quant_algo": "MIXED_PRECISION",
                "producer": producer,
                "kv_cache_scheme": {"dynamic": false, "num_bits": 8, "type": "float"},
                "ignore": ignore,
                "quantized_layers": layers.clone(),
                "config_groups": {
                    "group_0": {"weights": {"num_bits": 8, "type": "float", "dynamic": false},
                                "input_activations": {"num_bits": 8, "type": "float", "dynamic": false},
                                "targets": fp8},
                    "group_1": {"weights": {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": false},
                                "targets": fp4}
                }
            });
            let hq = json!({
                "producer": producer,
                "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8", "quantized_layers": layers}
            });
            (Some(qc), Some(hq))
        }
    })
}

/// Whether a recipe ships an optional tensor (Lightning ships KV scales for the backbone; no
/// W4A16 module ships an `input_scale`).
pub fn ships_optional(s: &Spec, recipe: SynthRecipe) -> bool {
    match s.role {
        Role::KvScale => recipe == SynthRecipe::LightningMixed && !s.deferred,
        _ => false,
    }
}

/// Writes a complete checkpoint directory. Returns what was written.
pub fn write_checkpoint(dir: &Path, geom: &Geometry, opts: &SynthOptions) -> Result<SynthSummary> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LoadError::Io {
            path: path.clone(),
            source,
        }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut cfg_json = geom.config_json();
    let cfg = NemotronHConfig::from_value(&cfg_json)?;
    let (qc, hq) = recipe_json(&cfg, opts.recipe)?;
    if let Some(qc) = qc {
        cfg_json["quantization_config"] = qc;
    }
    let write_json = |name: &str, v: &Value| -> Result<()> {
        let p = dir.join(name);
        std::fs::write(&p, serde_json::to_string_pretty(v).expect("json")).map_err(io(&p))
    };
    write_json("config.json", &cfg_json)?;
    if let Some(hq) = &hq {
        write_json("hf_quant_config.json", hq)?;
    }
    let recipe = QuantRecipe::from_sources(&cfg_json, hq.as_ref())?;
    let plan = Plan::new(&cfg, &recipe)?;
    let specs: Vec<&Spec> = plan
        .specs
        .iter()
        .filter(|s| !s.optional || ships_optional(s, opts.recipe))
        .collect();

    // Shard assignment: greedy by size, never splitting a linear's parts.
    let size = |s: &Spec| (s.shape.iter().product::<usize>() * s.write_dtype.size()) as u64;
    let mut shards: Vec<Vec<&Spec>> = vec![vec![]];
    let mut cur = 0u64;
    for (i, s) in specs.iter().enumerate() {
        let same_linear = i > 0 && s.linear.is_some() && specs[i - 1].linear == s.linear;
        if opts.max_shard_bytes > 0
            && cur > 0
            && cur + size(s) > opts.max_shard_bytes
            && !same_linear
        {
            shards.push(vec![]);
            cur = 0;
        }
        shards.last_mut().unwrap().push(s);
        cur += size(s);
    }
    let n = shards.len();
    let names: Vec<String> = if n == 1 {
        vec![SINGLE_FILE.into()]
    } else {
        (1..=n)
            .map(|i| format!("model-{i:05}-of-{n:05}.safetensors"))
            .collect()
    };

    let mut gen = Generator {
        seed: opts.seed,
        cache: BTreeMap::new(),
    };
    let mut weight_map = Map::new();
    let mut total = 0u64;
    for (specs, fname) in shards.iter().zip(&names) {
        let path = dir.join(fname);
        let mut header = Map::new();
        header.insert("__metadata__".into(), json!({"format": "pt"}));
        let mut off = 0u64;
        for s in specs {
            header.insert(
                s.name.clone(),
                json!({"dtype": s.write_dtype.name(), "shape": s.shape, "data_offsets": [off, off + size(s)]}),
            );
            off += size(s);
            weight_map.insert(s.name.clone(), json!(fname));
        }
        total += off;
        let mut h = serde_json::to_string(&Value::Object(header)).expect("json");
        // Pad with spaces to 8 (what the reference writer does) or, when misaligning, to 8k + 3.
        let target = if opts.misalign { 3 } else { 0 };
        while h.len() % 8 != target {
            h.push(' ');
        }
        let f = std::fs::File::create(&path).map_err(io(&path))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 22, f);
        w.write_all(&(h.len() as u64).to_le_bytes())
            .map_err(io(&path))?;
        w.write_all(h.as_bytes()).map_err(io(&path))?;
        for s in specs {
            let bytes = gen.bytes(s, &plan);
            debug_assert_eq!(bytes.len() as u64, size(s), "{}", s.name);
            w.write_all(&bytes).map_err(io(&path))?;
        }
        w.flush().map_err(io(&path))?;
    }
    if n > 1 {
        write_json(
            INDEX_FILE,
            &json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
        )?;
    }
    Ok(SynthSummary {
        tensors: specs.len(),
        shards: n,
        data_bytes: total,
    })
}

/// Builds the same synthetic checkpoint in memory, without writing files (for benchmarks of
/// full-size geometries on machines with slow disks).
pub fn build_checkpoint(geom: &Geometry, opts: &SynthOptions) -> Result<crate::Checkpoint> {
    let mut cfg_json = geom.config_json();
    let cfg = NemotronHConfig::from_value(&cfg_json)?;
    let (qc, hq) = recipe_json(&cfg, opts.recipe)?;
    if let Some(qc) = qc {
        cfg_json["quantization_config"] = qc;
    }
    let recipe = QuantRecipe::from_sources(&cfg_json, hq.as_ref())?;
    let plan = Plan::new(&cfg, &recipe)?;
    let specs: Vec<&Spec> = plan
        .specs
        .iter()
        .filter(|s| !s.optional || ships_optional(s, opts.recipe))
        .collect();
    // Built on every core: a linear's parts in one group (its first part encodes them all, in
    // the plan's order), every other tensor a group of its own. A tensor's bytes depend only on
    // the seed and its name, so the result is the sequential build's, byte for byte (the full
    // Lightning checkpoint took ≈ 150 s on one core of the device machine).
    let mut groups: Vec<Vec<usize>> = vec![];
    let mut of_linear: BTreeMap<usize, usize> = BTreeMap::new();
    for (i, s) in specs.iter().enumerate() {
        match s.linear {
            Some(li) => {
                let g = *of_linear.entry(li).or_insert_with(|| {
                    groups.push(vec![]);
                    groups.len() - 1
                });
                groups[g].push(i);
            }
            None => groups.push(vec![i]),
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, groups.len().max(1));
    let built: Vec<Vec<(usize, crate::HostTensor)>> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| {
                    let mut gen = Generator {
                        seed: opts.seed,
                        cache: BTreeMap::new(),
                    };
                    let mut done = vec![];
                    while let Some(group) =
                        groups.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                    {
                        for &i in group {
                            let s = specs[i];
                            done.push((
                                i,
                                crate::HostTensor {
                                    name: s.name.clone(),
                                    dtype: s.write_dtype,
                                    shape: s.shape.clone(),
                                    bytes: gen.bytes(s, &plan),
                                },
                            ));
                        }
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut tensors: Vec<(usize, crate::HostTensor)> = built.into_iter().flatten().collect();
    tensors.sort_by_key(|t| t.0);
    let tensors = tensors.into_iter().map(|t| t.1).collect();
    crate::Checkpoint::from_tensors(cfg, recipe, tensors)
}

/// Deterministic per-tensor values: a tensor's bytes depend only on the seed and its name.
struct Generator {
    seed: u64,
    /// Encoded parts of the linear being written (`.weight` comes first, then its companions).
    cache: BTreeMap<String, Vec<u8>>,
}

impl Generator {
    fn bytes(&mut self, s: &Spec, plan: &Plan) -> Vec<u8> {
        if let Some(b) = self.cache.remove(&s.name) {
            return b;
        }
        let seed = mix(self.seed ^ fnv(&s.name));
        let n: usize = s.shape.iter().product();
        let name = s.name.as_str();
        if let Some(li) = s.linear {
            let l = &plan.linears[li];
            if l.form != WeightForm::Dense {
                self.encode_linear(l, seed);
                return self.cache.remove(&s.name).expect("linear part generated");
            }
            let std = 1.0 / (l.in_features as f32).sqrt();
            return to_dtype(&normal(n, seed, std), s.write_dtype);
        }
        let mut r = Rng(seed);
        let vals: Vec<f32> = if name.ends_with(".A_log") {
            (0..n).map(|_| (1.0 + 15.0 * r.unif()).ln()).collect()
        } else if name.ends_with(".D") {
            (0..n).map(|_| 0.5 + r.unif()).collect()
        } else if name.ends_with(".dt_bias") {
            (0..n)
                .map(|_| {
                    let dt = (1e-3f32.ln() + r.unif() * (1e-1f32.ln() - 1e-3f32.ln())).exp();
                    dt + (-(-dt).exp_m1()).ln() // inverse softplus
                })
                .collect()
        } else if name.contains(".conv1d.") {
            (0..n).map(|_| r.unif() - 0.5).collect()
        } else if name.ends_with("e_score_correction_bias") {
            normal(n, seed, 0.05)
        } else if name.ends_with(".k_scale") || name.ends_with(".v_scale") {
            vec![1.0 + r.unif()]
        } else if name.ends_with("gate.weight") || name.ends_with("embeddings.weight") {
            normal(n, seed, 0.02)
        } else {
            // RMSNorm weights.
            normal(n, seed, 0.05).into_iter().map(|x| 1.0 + x).collect()
        };
        to_dtype(&vals, s.write_dtype)
    }

    fn encode_linear(&mut self, l: &PlannedLinear, seed: u64) {
        let (rows, cols) = (l.out_features, l.in_features);
        let w = normal(rows * cols, seed, 1.0 / (cols as f32).sqrt());
        let mut r = Rng(seed ^ 0x5eed);
        let m = &l.module;
        match l.form {
            WeightForm::Nvfp4(_) => {
                let gs = formats::nvfp4_global_scale(&w);
                let enc = parallel_nvfp4(&w, rows, cols, gs);
                self.cache.insert(format!("{m}.weight"), enc.packed);
                self.cache
                    .insert(format!("{m}.weight_scale"), enc.block_scales);
                self.cache
                    .insert(format!("{m}.weight_scale_2"), gs.to_le_bytes().to_vec());
                let is = (1.0 + 7.0 * r.unif()) / (formats::E2M1_MAX * formats::E4M3_MAX);
                self.cache
                    .insert(format!("{m}.input_scale"), is.to_le_bytes().to_vec());
            }
            WeightForm::Fp8 => {
                let (q, scale) = formats::fp8_encode(&w);
                self.cache.insert(format!("{m}.weight"), q);
                self.cache
                    .insert(format!("{m}.weight_scale"), scale.to_le_bytes().to_vec());
                let is = (1.0 + 7.0 * r.unif()) / formats::E4M3_MAX;
                self.cache
                    .insert(format!("{m}.input_scale"), is.to_le_bytes().to_vec());
            }
            WeightForm::Dense => unreachable!(),
        }
        // Companions that this recipe does not write (W4A16 input_scale) are dropped on the next
        // linear; keep the cache from growing.
        self.cache.retain(|k, _| k.starts_with(m.as_str()));
    }
}

/// NVFP4-encodes row ranges on all cores (the result does not depend on the thread count).
fn parallel_nvfp4(w: &[f32], rows: usize, cols: usize, gs: f32) -> formats::Nvfp4Encoded {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(rows.max(1));
    let per = rows.div_ceil(threads);
    let parts: Vec<formats::Nvfp4Encoded> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (r0, r1) = ((t * per).min(rows), ((t + 1) * per).min(rows));
                sc.spawn(move || {
                    formats::nvfp4_encode_with_global(&w[r0 * cols..r1 * cols], r1 - r0, cols, gs)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("encoder thread"))
            .collect()
    });
    let mut out = formats::Nvfp4Encoded {
        packed: vec![],
        block_scales: vec![],
        weight_scale_2: gs,
    };
    for p in parts {
        out.packed.extend(p.packed);
        out.block_scales.extend(p.block_scales);
    }
    out
}

fn to_dtype(v: &[f32], d: DType) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * d.size());
    match d {
        DType::F32 => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        DType::BF16 => v
            .iter()
            .for_each(|x| out.extend_from_slice(&formats::f32_to_bf16_bits(*x).to_le_bytes())),
        DType::F16 => v
            .iter()
            .for_each(|x| out.extend_from_slice(&formats::f32_to_f16_bits(*x).to_le_bytes())),
        DType::U8 | DType::F8E4M3 => unreachable!("packed parts come from the encoders"),
    }
    out
}

/// Approximately normal values (Irwin–Hall of 4 uniforms), in fixed 64K chunks seeded by index so
/// the result is independent of the thread count. Fast enough for the 30B geometry.
fn normal(n: usize, seed: u64, std: f32) -> Vec<f32> {
    const CHUNK: usize = 1 << 16;
    let mut v = vec![0f32; n];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let chunks: Vec<(usize, &mut [f32])> = v.chunks_mut(CHUNK).enumerate().collect();
    let per = chunks.len().div_ceil(threads).max(1);
    let mut groups: Vec<Vec<(usize, &mut [f32])>> = vec![];
    let mut it = chunks.into_iter().peekable();
    while it.peek().is_some() {
        groups.push(it.by_ref().take(per).collect());
    }
    std::thread::scope(|sc| {
        for g in groups {
            sc.spawn(move || {
                for (ci, c) in g {
                    let mut r = Rng(mix(seed ^ (ci as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
                    for x in c.iter_mut() {
                        let u = r.next();
                        let s =
                            (u & 0xFFFF) + ((u >> 16) & 0xFFFF) + ((u >> 32) & 0xFFFF) + (u >> 48);
                        // Sum of 4 U(0,1) has mean 2, variance 1/3.
                        *x = ((s as f32 / 65536.0) - 2.0) * 1.732_050_8 * std;
                    }
                }
            });
        }
    });
    v
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }
    fn unif(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}
