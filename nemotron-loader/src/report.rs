//! What a load found and holds: counts per form, deferred tensors, and bytes.

use crate::config::NemotronHConfig;
use crate::plan::{Role, Spec};
use crate::quant::{QuantRecipe, RecipeKind, WeightForm};
use crate::shards::ShardSet;
use crate::tensor::DType;
use serde::Serialize;
use std::collections::BTreeMap;

/// The load report. Byte identity: `host_bytes = source_bytes − deferred_bytes + widened_extra_bytes`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LoadReport {
    /// Tensors listed in the shard headers.
    pub tensors_total: usize,
    /// Copied onto the host.
    pub materialized: usize,
    /// Validated and counted but not materialized (the model does not use them yet).
    pub deferred: usize,
    /// Deferred tensors by name prefix.
    pub deferred_prefixes: BTreeMap<String, usize>,
    pub nvfp4_projections: usize,
    pub nvfp4_tensors: usize,
    pub fp8_projections: usize,
    pub fp8_tensors: usize,
    pub kv_scales: usize,
    /// Dense (float) tensors by their shipped dtype, widened ones included.
    pub dense_tensors: BTreeMap<String, usize>,
    /// `A_log`/`D`/`dt_bias` tensors widened to f32.
    pub widened: usize,
    /// Bytes the host holds for the materialized tensors.
    pub host_bytes: u64,
    /// Tensor data bytes of all shards.
    pub source_bytes: u64,
    pub deferred_bytes: u64,
    /// Extra bytes from widening (f32 size − shipped size).
    pub widened_extra_bytes: u64,
    /// Shard files and their total size on disk (headers included).
    pub shards: usize,
    pub file_bytes: u64,
    pub recipe: String,
    pub kv_cache: String,
    pub layer_pattern: String,
    /// MIXED_PRECISION entries that name no linear of this model.
    pub unmatched_recipe_entries: Vec<String>,
}

impl LoadReport {
    pub(crate) fn new(recipe: &QuantRecipe, cfg: &NemotronHConfig, shards: &ShardSet) -> Self {
        let file_bytes = shards.shards.iter().map(|s| s.file_bytes as u64).sum();
        Self::empty(
            recipe,
            cfg,
            shards.entries.len(),
            shards.data_bytes(),
            shards.shards.len(),
            file_bytes,
        )
    }

    pub(crate) fn empty(
        recipe: &QuantRecipe,
        cfg: &NemotronHConfig,
        tensors_total: usize,
        source_bytes: u64,
        shards: usize,
        file_bytes: u64,
    ) -> Self {
        let recipe_s = match &recipe.kind {
            RecipeKind::Unquantized => "unquantized".to_string(),
            RecipeKind::Single(f) => format!(
                "{} (single algorithm, {} exclusion patterns)",
                f.name(),
                recipe.exclude.len()
            ),
            RecipeKind::Mixed(m) => format!("MIXED_PRECISION ({} per-module entries)", m.len()),
        };
        LoadReport {
            tensors_total,
            materialized: 0,
            deferred: 0,
            deferred_prefixes: BTreeMap::new(),
            nvfp4_projections: 0,
            nvfp4_tensors: 0,
            fp8_projections: 0,
            fp8_tensors: 0,
            kv_scales: 0,
            dense_tensors: BTreeMap::new(),
            widened: 0,
            host_bytes: 0,
            source_bytes,
            deferred_bytes: 0,
            widened_extra_bytes: 0,
            shards,
            file_bytes,
            recipe: format!("{recipe_s} from {}", recipe.source),
            kv_cache: if recipe.kv_cache_fp8 {
                "FP8".into()
            } else {
                "model dtype".into()
            },
            layer_pattern: cfg.pattern(),
            unmatched_recipe_entries: vec![],
        }
    }

    pub(crate) fn count_materialized(&mut self, s: &Spec, shipped: DType, source: u64, held: u64) {
        self.materialized += 1;
        self.host_bytes += held;
        match s.role {
            Role::Nvfp4Weight
            | Role::Nvfp4BlockScale
            | Role::Nvfp4GlobalScale
            | Role::Nvfp4InputScale => self.nvfp4_tensors += 1,
            Role::Fp8Weight | Role::Fp8WeightScale | Role::Fp8InputScale => self.fp8_tensors += 1,
            Role::KvScale => self.kv_scales += 1,
            Role::Dense | Role::Widened => {
                *self
                    .dense_tensors
                    .entry(shipped.name().to_string())
                    .or_default() += 1;
                if held != source {
                    self.widened += 1;
                    self.widened_extra_bytes += held - source;
                }
            }
        }
    }

    pub(crate) fn count_deferred(&mut self, prefix: &str, bytes: u64) {
        self.deferred += 1;
        self.deferred_bytes += bytes;
        *self
            .deferred_prefixes
            .entry(prefix.to_string())
            .or_default() += 1;
    }

    pub(crate) fn count_projection(&mut self, form: WeightForm) {
        match form {
            WeightForm::Nvfp4(_) => self.nvfp4_projections += 1,
            WeightForm::Fp8 => self.fp8_projections += 1,
            WeightForm::Dense => {}
        }
    }

    pub(crate) fn finish(&mut self) {
        debug_assert_eq!(
            self.host_bytes,
            self.source_bytes - self.deferred_bytes + self.widened_extra_bytes
        );
    }

    /// The byte identity the report promises.
    pub fn bytes_identity_holds(&self) -> bool {
        self.host_bytes + self.deferred_bytes == self.source_bytes + self.widened_extra_bytes
    }

    /// A human-readable summary.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let _ = writeln!(
            s,
            "layers          {} ({})",
            self.layer_pattern.len(),
            self.layer_pattern
        );
        let _ = writeln!(s, "recipe          {}", self.recipe);
        let _ = writeln!(s, "kv cache        {}", self.kv_cache);
        let _ = writeln!(
            s,
            "shards          {} ({} bytes on disk)",
            self.shards, self.file_bytes
        );
        let _ = writeln!(
            s,
            "tensors         {} in the checkpoint",
            self.tensors_total
        );
        let _ = writeln!(s, "  materialized  {}", self.materialized);
        let deferred: Vec<String> = self
            .deferred_prefixes
            .iter()
            .map(|(p, n)| format!("{p}* {n}"))
            .collect();
        let _ = writeln!(
            s,
            "  deferred      {} ({})",
            self.deferred,
            if deferred.is_empty() {
                "none".into()
            } else {
                deferred.join(", ")
            }
        );
        let _ = writeln!(
            s,
            "NVFP4           {} projections, {} tensors",
            self.nvfp4_projections, self.nvfp4_tensors
        );
        let _ = writeln!(
            s,
            "FP8             {} projections, {} tensors",
            self.fp8_projections, self.fp8_tensors
        );
        let _ = writeln!(s, "KV scales       {}", self.kv_scales);
        let dense: Vec<String> = self
            .dense_tensors
            .iter()
            .map(|(d, n)| format!("{n} {d}"))
            .collect();
        let _ = writeln!(s, "dense           {}", dense.join(" + "));
        let _ = writeln!(
            s,
            "widened to f32  {} (+{} bytes)",
            self.widened, self.widened_extra_bytes
        );
        let _ = writeln!(
            s,
            "bytes           host {} ({:.3} GiB) = source {} − deferred {} + widening {}",
            self.host_bytes,
            gib(self.host_bytes),
            self.source_bytes,
            self.deferred_bytes,
            self.widened_extra_bytes
        );
        if !self.unmatched_recipe_entries.is_empty() {
            let _ = writeln!(
                s,
                "warning         {} recipe entries name no linear of this model (first: {})",
                self.unmatched_recipe_entries.len(),
                self.unmatched_recipe_entries[0]
            );
        }
        s
    }
}
