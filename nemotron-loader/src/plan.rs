//! The tensor set a config and recipe imply: every name, shape and accepted dtype, grouped by
//! linear. The loader validates a checkpoint against it; the synthetic writer writes it.

use crate::config::{LayerKind, NemotronHConfig};
use crate::error::{LoadError, Result};
use crate::formats::NVFP4_BLOCK;
use crate::quant::{Nvfp4Activations, QuantRecipe, WeightForm};
use crate::tensor::DType;
use std::collections::{BTreeMap, HashMap};

/// The part a tensor plays; the report counts by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A float tensor kept as shipped (norms, embeddings, conv, router, dense projections).
    Dense,
    /// `A_log`, `D`, `dt_bias`: widened to f32 at load (the one widening allowed).
    Widened,
    Nvfp4Weight,
    Nvfp4BlockScale,
    Nvfp4GlobalScale,
    Nvfp4InputScale,
    Fp8Weight,
    Fp8WeightScale,
    Fp8InputScale,
    /// `k_proj.k_scale` / `v_proj.v_scale` of an FP8 KV cache.
    KvScale,
}

const FLOATS: &[DType] = &[DType::BF16, DType::F16, DType::F32];
const F32_ONLY: &[DType] = &[DType::F32];
const U8_ONLY: &[DType] = &[DType::U8];
const E4M3_ONLY: &[DType] = &[DType::F8E4M3];

/// One expected tensor.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    /// `[]` for scalars (`[1]` is accepted too).
    pub shape: Vec<usize>,
    pub allowed: &'static [DType],
    /// The dtype the synthetic writer uses.
    pub write_dtype: DType,
    pub role: Role,
    /// May be absent (KV scales, the W4A16 `input_scale`).
    pub optional: bool,
    /// Validated by name and shape, counted, but not materialized (the MTP tower).
    pub deferred: bool,
    /// What needs it, for error messages.
    pub what: String,
    /// Index into [`Plan::linears`] for the parts of a linear.
    pub linear: Option<usize>,
}

impl Spec {
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    pub fn shape_matches(&self, found: &[usize]) -> bool {
        found == self.shape.as_slice() || (self.is_scalar() && found == [1])
    }
}

/// One linear (`nn.Linear` in the reference) and the form the recipe gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedLinear {
    /// Module name, e.g. `backbone.layers.0.mixer.in_proj`.
    pub module: String,
    pub form: WeightForm,
    pub out_features: usize,
    pub in_features: usize,
    pub deferred: bool,
}

/// The expected tensor set, in a stable order (root, then layers in order, then MTP).
#[derive(Debug, Clone)]
pub struct Plan {
    pub specs: Vec<Spec>,
    pub linears: Vec<PlannedLinear>,
    by_name: HashMap<String, usize>,
    linear_by_module: HashMap<String, usize>,
}

/// Prefixes of the tensors the model does not use yet.
pub const DEFERRED_PREFIXES: &[&str] = &["mtp."];

/// Counts a plan implies (what the full-size test checks against the real enumerations).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlanCounts {
    pub tensors_total: usize,
    pub materialized: usize,
    pub deferred: usize,
    pub nvfp4_projections: usize,
    pub nvfp4_tensors: usize,
    pub fp8_projections: usize,
    pub fp8_tensors: usize,
    pub kv_scales: usize,
    pub dense_tensors: BTreeMap<String, usize>,
    pub widened: usize,
    /// Tensor data bytes (at the written dtypes).
    pub bytes: u64,
}

impl Plan {
    /// A lower bound on the tensors `cfg` implies (two per routed expert of every MoE layer, one
    /// norm per layer, the embeddings): arithmetic on the config, no allocation, saturating.
    pub fn min_tensors(cfg: &NemotronHConfig) -> u64 {
        let experts = cfg
            .moe
            .as_ref()
            .map_or(0, |c| (c.n_routed_experts as u64).saturating_mul(2));
        // The backbone's layers only: the MTP tower's tensors are deferred and may be absent.
        let moe_layers = cfg.layers.iter().filter(|&&k| k == LayerKind::Moe).count() as u64;
        experts
            .saturating_mul(moe_layers)
            .saturating_add(cfg.layers.len() as u64)
            .saturating_add(1)
    }

    /// Refuses a config that implies more tensors than the checkpoint holds (`held`), before the
    /// plan is built: the plan enumerates every claimed expert, so a config claiming 10^9 experts
    /// would otherwise cost time and memory in proportion to the claim before any refusal.
    pub fn check_claims(cfg: &NemotronHConfig, held: usize) -> Result<()> {
        let need = Self::min_tensors(cfg);
        if need > held as u64 {
            let experts = cfg.moe.as_ref().map_or(0, |c| c.n_routed_experts);
            return Err(LoadError::Config {
                field: "n_routed_experts".into(),
                reason: format!(
                    "{experts} routed experts over the config's layers imply at least {need} \
                     tensors; the checkpoint holds {held}"
                ),
            });
        }
        Ok(())
    }

    pub fn new(cfg: &NemotronHConfig, recipe: &QuantRecipe) -> Result<Self> {
        let mut b = Builder {
            cfg,
            recipe,
            specs: vec![],
            linears: vec![],
            deferred: false,
        };
        let h = cfg.hidden_size;
        b.dense(
            "backbone.embeddings.weight",
            vec![cfg.vocab_size, h],
            "the embeddings",
        );
        b.dense("backbone.norm_f.weight", vec![h], "the final norm");
        for (l, kind) in cfg.layers.iter().enumerate() {
            let p = format!("backbone.layers.{l}");
            b.dense(
                &format!("{p}.norm.weight"),
                vec![h],
                &format!("layer {l} norm"),
            );
            b.mixer(&p, *kind, &format!("layer {l}"))?;
        }
        if !cfg.tie_word_embeddings {
            b.linear("lm_head", cfg.vocab_size, h, "lm_head")?;
        }
        b.deferred = true;
        let n = cfg.mtp_layers.len();
        for (i, kind) in cfg.mtp_layers.iter().enumerate() {
            let p = format!("mtp.layers.{i}");
            let what = format!("MTP layer {i}");
            if i == 0 {
                b.dense(&format!("{p}.enorm.weight"), vec![h], &what);
                b.dense(&format!("{p}.hnorm.weight"), vec![h], &what);
                b.linear(&format!("{p}.eh_proj"), h, 2 * h, &what)?;
            }
            b.dense(&format!("{p}.norm.weight"), vec![h], &what);
            b.mixer(&p, *kind, &what)?;
            if i + 1 == n {
                b.dense(&format!("{p}.final_layernorm.weight"), vec![h], &what);
            }
        }
        let by_name = b
            .specs
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        let linear_by_module = b
            .linears
            .iter()
            .enumerate()
            .map(|(i, l)| (l.module.clone(), i))
            .collect();
        Ok(Plan {
            specs: b.specs,
            linears: b.linears,
            by_name,
            linear_by_module,
        })
    }

    pub fn get(&self, name: &str) -> Option<&Spec> {
        self.by_name.get(name).map(|&i| &self.specs[i])
    }

    /// The planned linear named `module`.
    pub fn linear(&self, module: &str) -> Option<&PlannedLinear> {
        self.linear_by_module.get(module).map(|&i| &self.linears[i])
    }

    /// The counts this plan implies when the optional tensors for which `ships` is true ship.
    pub fn counts(&self, ships: impl Fn(&Spec) -> bool) -> PlanCounts {
        let mut c = PlanCounts::default();
        for s in self.specs.iter().filter(|s| !s.optional || ships(s)) {
            c.tensors_total += 1;
            let bytes = s
                .shape
                .iter()
                .try_fold(s.write_dtype.size() as u64, |a, &d| a.checked_mul(d as u64));
            c.bytes = c.bytes.saturating_add(bytes.unwrap_or(u64::MAX));
            if s.deferred {
                c.deferred += 1;
                continue;
            }
            c.materialized += 1;
            match s.role {
                Role::Nvfp4Weight
                | Role::Nvfp4BlockScale
                | Role::Nvfp4GlobalScale
                | Role::Nvfp4InputScale => c.nvfp4_tensors += 1,
                Role::Fp8Weight | Role::Fp8WeightScale | Role::Fp8InputScale => c.fp8_tensors += 1,
                Role::KvScale => c.kv_scales += 1,
                Role::Dense | Role::Widened => {
                    *c.dense_tensors
                        .entry(s.write_dtype.name().to_string())
                        .or_default() += 1;
                    if s.role == Role::Widened && s.write_dtype != DType::F32 {
                        c.widened += 1;
                    }
                }
            }
        }
        for l in self.linears.iter().filter(|l| !l.deferred) {
            match l.form {
                WeightForm::Nvfp4(_) => c.nvfp4_projections += 1,
                WeightForm::Fp8 => c.fp8_projections += 1,
                WeightForm::Dense => {}
            }
        }
        c
    }
}

struct Builder<'a> {
    cfg: &'a NemotronHConfig,
    recipe: &'a QuantRecipe,
    specs: Vec<Spec>,
    linears: Vec<PlannedLinear>,
    deferred: bool,
}

impl Builder<'_> {
    fn push(
        &mut self,
        name: String,
        shape: Vec<usize>,
        allowed: &'static [DType],
        write: DType,
        role: Role,
        what: &str,
    ) {
        self.specs.push(Spec {
            name,
            shape,
            allowed,
            write_dtype: write,
            role,
            optional: false,
            deferred: self.deferred,
            what: what.to_string(),
            linear: None,
        });
    }

    fn dense(&mut self, name: &str, shape: Vec<usize>, what: &str) {
        self.push(name.into(), shape, FLOATS, DType::BF16, Role::Dense, what);
    }

    fn linear(&mut self, module: &str, out: usize, inp: usize, what: &str) -> Result<()> {
        let form = self.recipe.resolve(module);
        let idx = self.linears.len();
        let leaf = module.rsplit('.').next().unwrap_or(module);
        let what = if what == leaf {
            format!("{what} ({})", form.name())
        } else {
            format!("{what} {leaf} ({})", form.name())
        };
        let first = self.specs.len();
        match form {
            WeightForm::Dense => {
                self.push(
                    format!("{module}.weight"),
                    vec![out, inp],
                    FLOATS,
                    DType::BF16,
                    Role::Dense,
                    &what,
                );
            }
            WeightForm::Nvfp4(act) => {
                if inp % NVFP4_BLOCK != 0 {
                    return Err(LoadError::Quant {
                        file: self.recipe.source.clone(),
                        field: module.into(),
                        reason: format!(
                            "NVFP4 needs in_features divisible by 16, this linear has {inp}"
                        ),
                    });
                }
                self.push(
                    format!("{module}.weight"),
                    vec![out, inp / 2],
                    U8_ONLY,
                    DType::U8,
                    Role::Nvfp4Weight,
                    &what,
                );
                self.push(
                    format!("{module}.weight_scale"),
                    vec![out, inp / NVFP4_BLOCK],
                    E4M3_ONLY,
                    DType::F8E4M3,
                    Role::Nvfp4BlockScale,
                    &what,
                );
                self.push(
                    format!("{module}.weight_scale_2"),
                    vec![],
                    F32_ONLY,
                    DType::F32,
                    Role::Nvfp4GlobalScale,
                    &what,
                );
                self.push(
                    format!("{module}.input_scale"),
                    vec![],
                    F32_ONLY,
                    DType::F32,
                    Role::Nvfp4InputScale,
                    &what,
                );
                // W4A16 ships no input_scale; W4A4 must.
                if let Some(last) = self.specs.last_mut() {
                    last.optional = act == Nvfp4Activations::W4A16;
                }
            }
            WeightForm::Fp8 => {
                self.push(
                    format!("{module}.weight"),
                    vec![out, inp],
                    E4M3_ONLY,
                    DType::F8E4M3,
                    Role::Fp8Weight,
                    &what,
                );
                self.push(
                    format!("{module}.weight_scale"),
                    vec![],
                    F32_ONLY,
                    DType::F32,
                    Role::Fp8WeightScale,
                    &what,
                );
                self.push(
                    format!("{module}.input_scale"),
                    vec![],
                    F32_ONLY,
                    DType::F32,
                    Role::Fp8InputScale,
                    &what,
                );
            }
        }
        for s in &mut self.specs[first..] {
            s.linear = Some(idx);
        }
        self.linears.push(PlannedLinear {
            module: module.into(),
            form,
            out_features: out,
            in_features: inp,
            deferred: self.deferred,
        });
        Ok(())
    }

    fn mixer(&mut self, p: &str, kind: LayerKind, what: &str) -> Result<()> {
        let cfg = self.cfg;
        let h = cfg.hidden_size;
        let m = format!("{p}.mixer");
        match kind {
            LayerKind::Mamba => {
                let c = cfg.mamba.as_ref().ok_or_else(|| {
                    LoadError::Internal("a Mamba layer without its config".into())
                })?;
                let what = format!("{what} Mamba2");
                self.linear(&format!("{m}.in_proj"), c.in_proj_dim(), h, &what)?;
                self.dense(
                    &format!("{m}.conv1d.weight"),
                    vec![c.conv_dim(), 1, c.conv_kernel],
                    &what,
                );
                if c.conv_bias {
                    self.dense(&format!("{m}.conv1d.bias"), vec![c.conv_dim()], &what);
                }
                for t in ["A_log", "D", "dt_bias"] {
                    self.push(
                        format!("{m}.{t}"),
                        vec![c.num_heads],
                        FLOATS,
                        DType::BF16,
                        Role::Widened,
                        &what,
                    );
                }
                self.dense(&format!("{m}.norm.weight"), vec![c.inner()], &what);
                self.linear(&format!("{m}.out_proj"), h, c.inner(), &what)?;
            }
            LayerKind::Moe => {
                let c = cfg
                    .moe
                    .as_ref()
                    .ok_or_else(|| LoadError::Internal("a MoE layer without its config".into()))?;
                let what = format!("{what} MoE");
                let e = c.n_routed_experts;
                self.push(
                    format!("{m}.gate.weight"),
                    vec![e, h],
                    FLOATS,
                    DType::F32,
                    Role::Dense,
                    &what,
                );
                self.push(
                    format!("{m}.gate.e_score_correction_bias"),
                    vec![e],
                    FLOATS,
                    DType::F32,
                    Role::Dense,
                    &what,
                );
                for x in 0..e {
                    let ew = format!("{what} expert {x}");
                    self.linear(
                        &format!("{m}.experts.{x}.up_proj"),
                        c.intermediate_size,
                        h,
                        &ew,
                    )?;
                    self.linear(
                        &format!("{m}.experts.{x}.down_proj"),
                        h,
                        c.intermediate_size,
                        &ew,
                    )?;
                }
                if c.n_shared_experts > 0 {
                    let sw = format!("{what} shared expert");
                    self.linear(
                        &format!("{m}.shared_experts.up_proj"),
                        c.shared_intermediate_size,
                        h,
                        &sw,
                    )?;
                    self.linear(
                        &format!("{m}.shared_experts.down_proj"),
                        h,
                        c.shared_intermediate_size,
                        &sw,
                    )?;
                }
            }
            LayerKind::Attention => {
                let c = cfg.attention.as_ref().ok_or_else(|| {
                    LoadError::Internal("a attention layer without its config".into())
                })?;
                let what = format!("{what} attention");
                let q = c.num_heads * c.head_dim;
                let kv = c.num_kv_heads * c.head_dim;
                self.linear(&format!("{m}.q_proj"), q, h, &what)?;
                self.linear(&format!("{m}.k_proj"), kv, h, &what)?;
                self.linear(&format!("{m}.v_proj"), kv, h, &what)?;
                self.linear(&format!("{m}.o_proj"), h, q, &what)?;
                if self.recipe.kv_cache_fp8 {
                    for (proj, s) in [("k_proj", "k_scale"), ("v_proj", "v_scale")] {
                        self.push(
                            format!("{m}.{proj}.{s}"),
                            vec![],
                            F32_ONLY,
                            DType::F32,
                            Role::KvScale,
                            &format!("{what} FP8 KV cache"),
                        );
                        if let Some(last) = self.specs.last_mut() {
                            last.optional = true;
                        }
                    }
                }
            }
            LayerKind::Mlp => {
                let c = cfg
                    .mlp
                    .as_ref()
                    .ok_or_else(|| LoadError::Internal("a MLP layer without its config".into()))?;
                let what = format!("{what} MLP");
                self.linear(&format!("{m}.up_proj"), c.intermediate_size, h, &what)?;
                self.linear(&format!("{m}.down_proj"), h, c.intermediate_size, &what)?;
            }
        }
        Ok(())
    }
}
