//! Edges the mutation run (`cargo mutants -p nemotron-loader`, docs/RELIABILITY.md §3) found
//! untested: each test here fails on the mutant named in its comment.

use nemotron_loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
use nemotron_loader::{read_config, Checkpoint, LayerKind, LoadOptions, Plan};
use serde_json::Value;
use std::path::Path;

fn checkpoint(recipe: SynthRecipe) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let opts = SynthOptions {
        recipe,
        seed: 9,
        max_shard_bytes: 0,
        misalign: false,
    };
    write_checkpoint(d.path(), &Geometry::tiny(), &opts).unwrap();
    d
}

fn edit_json(dir: &Path, file: &str, f: impl FnOnce(&mut Value)) {
    let p = dir.join(file);
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(p, v.to_string()).unwrap();
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut Value)) {
    edit_json(dir, "config.json", f);
}

/// The checkpoint's MoE made one without shared experts (count 0, no shared width).
fn without_shared_experts(dir: &Path) {
    edit_config(dir, |v| {
        v["n_shared_experts"] = 0.into();
        v.as_object_mut()
            .unwrap()
            .remove("moe_shared_expert_intermediate_size");
    });
}

fn config_error(dir: &Path) -> String {
    read_config(dir).map(|_| ()).unwrap_err().to_string()
}

/// `count -> 1`; `min_tensors`' `== → !=` (it counted the non-MoE layers).
#[test]
fn layer_counts_and_the_tensor_bound_of_the_tiny_pattern() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    let (cfg, _) = read_config(d.path()).unwrap();
    assert_eq!(cfg.pattern(), "ME*M-E");
    assert_eq!(cfg.count(LayerKind::Mamba), 2);
    assert_eq!(cfg.count(LayerKind::Moe), 2);
    assert_eq!(cfg.count(LayerKind::Attention), 1);
    assert_eq!(cfg.count(LayerKind::Mlp), 1);
    // 8 routed experts × 2 matrices × 2 MoE layers + 6 layer norms + the embeddings.
    assert_eq!(Plan::min_tensors(&cfg), 8 * 2 * 2 + 6 + 1);
}

/// `&& → ||` in the routed_scaling_factor check.
#[test]
fn a_zero_or_negative_routed_scaling_factor_is_refused() {
    for bad in [0.0, -2.5] {
        let d = checkpoint(SynthRecipe::LightningMixed);
        edit_config(d.path(), |v| v["routed_scaling_factor"] = bad.into());
        let e = config_error(d.path());
        assert!(e.contains("routed_scaling_factor"), "{bad}: {e}");
    }
}

/// `> → >=` in `top_k > n_routed_experts`: every expert per token is a valid (dense) routing.
#[test]
fn top_k_equal_to_the_expert_count_is_accepted_and_one_more_is_not() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    edit_config(d.path(), |v| {
        v["n_group"] = 1.into();
        v["topk_group"] = 1.into();
        v["num_experts_per_tok"] = 8.into();
    });
    read_config(d.path()).unwrap();
    edit_config(d.path(), |v| v["num_experts_per_tok"] = 9.into());
    assert!(config_error(d.path()).contains("num_experts_per_tok"));
}

/// `|| → &&` in the bias check: `mlp_bias` must be refused when only MoE layers read it.
#[test]
fn mlp_bias_is_refused_without_mlp_layers() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    edit_config(d.path(), |v| {
        v["hybrid_override_pattern"] = "ME*ME".into();
        v["num_hidden_layers"] = 5.into();
        v["mlp_bias"] = true.into();
    });
    assert!(config_error(d.path()).contains("mlp_bias"));
}

/// `- → /` in the progress byte count: the last report covers every byte, tensor by tensor.
#[test]
fn load_progress_ends_at_its_totals() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    let mut last = None;
    let mut calls = 0;
    let ck = Checkpoint::load_with(
        d.path(),
        LoadOptions {
            progress: Some(Box::new(|p| {
                calls += 1;
                last = Some(p);
            })),
        },
    )
    .unwrap();
    let p = last.expect("progress was reported");
    assert_eq!(p.tensors_done, p.tensors_total);
    assert_eq!(calls, p.tensors_total);
    assert_eq!(p.bytes_done, p.bytes_total);
    assert_eq!(
        p.bytes_total,
        ck.report.source_bytes - ck.report.deferred_bytes
    );
}

/// `delete match arm Role::Fp8Weight in materialize`: a NaN in an FP8 weight is refused.
#[test]
fn a_nan_in_an_fp8_weight_is_refused() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    let p = d.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let (name, start) = header
        .as_object()
        .unwrap()
        .iter()
        .find_map(|(k, v)| {
            (v["dtype"] == "F8_E4M3" && k.ends_with(".weight"))
                .then(|| (k.clone(), v["data_offsets"][0].as_u64().unwrap() as usize))
        })
        .expect("the MIXED recipe has FP8 weights");
    let mut bytes = bytes;
    bytes[8 + n + start + 3] = 0x7f; // E4M3 NaN
    std::fs::write(&p, bytes).unwrap();
    let e = Checkpoint::load(d.path())
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains(&name) && e.contains("NaN"), "{e}");
}

/// `delete field exclude` in `QuantRecipe::from_sources`: with both `config.json`'s
/// `quantization_config` and `hf_quant_config.json`, modules either file excludes stay dense.
#[test]
fn exclusions_from_both_recipe_files_are_merged() {
    let d = checkpoint(SynthRecipe::NanoNvfp4);
    let hq: Value = serde_json::from_str(
        &std::fs::read_to_string(d.path().join("hf_quant_config.json")).unwrap(),
    )
    .unwrap();
    let mut q = hq["quantization"].clone();
    q["quant_method"] = "modelopt".into();
    // config.json's list lacks lm_head: only hf_quant_config.json keeps it dense.
    let ex: Vec<Value> = q["exclude_modules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| *m != "lm_head")
        .cloned()
        .collect();
    q["exclude_modules"] = ex.into();
    edit_config(d.path(), |v| v["quantization_config"] = q);
    let (_, recipe) = read_config(d.path()).unwrap();
    assert!(
        recipe.is_excluded("lm_head"),
        "hf_quant_config.json's exclusion was dropped"
    );
    Checkpoint::load(d.path()).unwrap();
}

/// `== → !=` in `unmatched_entries`: a MIXED entry naming no linear of the model is reported.
#[test]
fn a_recipe_entry_naming_no_linear_is_reported() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    let p = d.path().join("hf_quant_config.json");
    let mut hq: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    hq["quantization"]["quantized_layers"]["backbone.layers.0.mixer.in"] =
        serde_json::json!({"quant_algo": "FP8"});
    std::fs::write(&p, hq.to_string()).unwrap();
    // config.json's copy of the recipe must agree with hf_quant_config.json.
    edit_config(d.path(), |v| {
        v.as_object_mut().unwrap().remove("quantization_config");
    });
    let ck = Checkpoint::load(d.path()).unwrap();
    assert_eq!(
        ck.report.unmatched_recipe_entries,
        vec!["backbone.layers.0.mixer.in".to_string()]
    );
    assert!(ck.report.render().contains("name no linear"));
}

/// `/ → *` in the report's GiB figure.
#[test]
fn the_report_prints_host_bytes_in_gib() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    let r = Checkpoint::load(d.path()).unwrap().report;
    let want = format!(
        "host {} ({:.3} GiB)",
        r.host_bytes,
        r.host_bytes as f64 / (1u64 << 30) as f64
    );
    assert!(r.render().contains(&want), "{}", r.render());
}

/// `is_float -> true`: the dense float dtypes, not the byte-coded ones.
#[test]
fn only_bf16_f16_f32_are_dense_floats() {
    use nemotron_loader::DType;
    assert!(DType::BF16.is_float() && DType::F16.is_float() && DType::F32.is_float());
    assert!(!DType::U8.is_float() && !DType::F8E4M3.is_float());
}

/// `dequant_row -> ()`: a dense row comes back as stored (the packed forms are checked against
/// the format goldens in `formats_modelopt.rs` through the same decoders).
#[test]
fn a_dense_row_dequantizes_to_its_values() {
    use nemotron_loader::{DType, HostTensor, LinearWeight};
    let vals = [1.5f32, -2.0, 0.25, 3.0, -0.5, 8.0];
    let t = HostTensor {
        name: "w".into(),
        dtype: DType::F32,
        shape: vec![2, 3],
        bytes: vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    let w = LinearWeight::Dense(t);
    let mut row = vec![0f32; 3];
    w.dequant_row(1, &mut row);
    assert_eq!(row, vals[3..]);
}

/// Shard 2 of the mutation sample: boundaries of the config checks.
/// `norm_eps > 0 → >= 0`: an epsilon of 0 is refused, never taken.
#[test]
fn a_zero_norm_epsilon_is_refused() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    edit_config(d.path(), |v| {
        let o = v.as_object_mut().unwrap();
        for k in ["layer_norm_epsilon", "norm_eps", "rms_norm_eps"] {
            if o.contains_key(k) {
                o.insert(k.into(), 0.0.into());
            }
        }
    });
    let e = config_error(d.path());
    assert!(e.contains("eps"), "{e}");
}

/// `top_k > topk_group · group size → >=`: the bound itself is a valid routing.
#[test]
fn top_k_may_fill_the_selected_groups() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    // 8 experts in 2 groups of 4, 1 group selected: up to 4 experts per token.
    edit_config(d.path(), |v| v["num_experts_per_tok"] = 4.into());
    read_config(d.path()).unwrap();
    edit_config(d.path(), |v| v["num_experts_per_tok"] = 5.into());
    assert!(config_error(d.path()).contains("num_experts_per_tok"));
}

/// `delete !` in the null filters: a field present as `null` reads as absent.
#[test]
fn null_optional_fields_read_as_absent() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    edit_config(d.path(), |v| {
        v["moe_latent_size"] = Value::Null;
        v["layers_block_type"] = Value::Null;
    });
    read_config(d.path()).unwrap();
    edit_config(d.path(), |v| v["moe_latent_size"] = 1024.into());
    assert!(config_error(d.path()).contains("moe_latent_size"));
}

/// `|| → &&` in the dt-limit check: `(0, None)` is no clamp, like `(0, inf)`.
#[test]
fn an_open_dt_limit_is_accepted_and_a_clamp_is_not() {
    for open in [
        serde_json::json!([0.0, null]),
        serde_json::json!([0.0, "Infinity"]),
    ] {
        let d = checkpoint(SynthRecipe::LightningMixed);
        edit_config(d.path(), |v| v["time_step_limit"] = open.clone());
        read_config(d.path()).unwrap_or_else(|e| panic!("{open}: {e}"));
    }
    let d = checkpoint(SynthRecipe::LightningMixed);
    edit_config(d.path(), |v| {
        v["time_step_limit"] = serde_json::json!([0.0, 0.1])
    });
    assert!(config_error(d.path()).contains("time_step_limit"));
}

/// `== → !=` in the exclusion key fallback: `hf_quant_config.json` spelling its list `ignore`
/// (as some ModelOpt exports do) is read like `exclude_modules`.
#[test]
fn an_ignore_list_excludes_like_exclude_modules() {
    let d = checkpoint(SynthRecipe::NanoNvfp4);
    edit_json(d.path(), "hf_quant_config.json", |hq| {
        let q = hq["quantization"].as_object_mut().unwrap();
        let list = q.remove("exclude_modules").unwrap();
        q.insert("ignore".into(), list);
    });
    let (_, recipe) = read_config(d.path()).unwrap();
    assert!(recipe.is_excluded("lm_head"));
    Checkpoint::load(d.path()).unwrap();
}

// Shard 3/6 (docs/RELIABILITY.md §3, session 15): the misses with a test each.

/// `delete match arm Value::Null` in `check_dt_limit`: `time_step_limit: null` is no clamp.
#[test]
fn a_null_dt_limit_is_accepted() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    edit_config(d.path(), |v| v["time_step_limit"] = Value::Null);
    read_config(d.path()).unwrap();
}

/// `!= → ==` in `parse_layers`: both spellings present must agree, else the second is refused.
#[test]
fn a_layer_list_disagreeing_with_the_pattern_is_refused() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    edit_config(d.path(), |v| {
        v["layers_block_type"] =
            serde_json::json!(["mamba", "moe", "attention", "mamba", "mlp", "mamba"])
    });
    let e = config_error(d.path());
    assert!(
        e.contains("layers_block_type") && e.contains("disagrees"),
        "{e}"
    );
}

/// `> → >=` in `opt_usize`: the largest size the loader takes is accepted, one more is not.
#[test]
fn config_integers_up_to_the_bound_are_accepted() {
    let max = nemotron_loader::config::MAX_CONFIG_INT;
    let d = checkpoint(SynthRecipe::LightningMixed);
    edit_config(d.path(), |v| v["max_position_embeddings"] = max.into());
    let (cfg, _) = read_config(d.path()).unwrap();
    assert_eq!(cfg.max_position_embeddings, Some(max as usize));
    edit_config(d.path(), |v| {
        v["max_position_embeddings"] = (max + 1).into()
    });
    let e = config_error(d.path());
    assert!(
        e.contains("max_position_embeddings") && e.contains("exceeds"),
        "{e}"
    );
}

/// `Fields::bool → Ok(true)`: a required flag that is missing is refused, not read as true.
#[test]
fn required_flags_are_read_not_assumed() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    edit_config(d.path(), |v| {
        v.as_object_mut().unwrap().remove("norm_topk_prob");
    });
    assert!(config_error(d.path()).contains("norm_topk_prob"));
}

/// `== → !=` in `quote_nonfinite`'s string scan: a bare `Infinity` is read while the same word
/// inside a string is left alone (the mutant ends every string at its first character and
/// quotes the word inside it, breaking the JSON).
#[test]
fn bare_infinity_is_read_and_inside_a_string_is_left_alone() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    edit_config(d.path(), |v| {
        v["time_step_limit"] = serde_json::json!([0.0, "BARE"]);
        v["_note"] = "Infinity and NaN, in words".into();
    });
    let p = d.path().join("config.json");
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("\"BARE\"", "Infinity");
    assert!(text.contains("[0.0,Infinity]"), "{text}");
    std::fs::write(&p, text).unwrap();
    read_config(d.path()).unwrap();
}

/// `kv_cache_quant_algo`'s guard `== "FP8"` → `true`: another algorithm is refused by name.
#[test]
fn a_kv_cache_algorithm_other_than_fp8_is_refused() {
    let d = checkpoint(SynthRecipe::NanoNvfp4);
    edit_json(d.path(), "hf_quant_config.json", |hq| {
        hq["quantization"]["kv_cache_quant_algo"] = "INT8".into()
    });
    let e = config_error(d.path());
    assert!(
        e.contains("kv_cache_quant_algo") && e.contains("INT8"),
        "{e}"
    );
}

/// `bytes_identity_holds → true`: the identity is computed, and fails when a count is off.
#[test]
fn the_byte_identity_is_checked() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    let ck = Checkpoint::load(d.path()).unwrap();
    assert!(ck.report.bytes_identity_holds());
    let mut r = ck.report.clone();
    r.host_bytes += 1;
    assert!(!r.bytes_identity_holds());
}

/// `delete match arm "F16"` in `DType::from_name`, and `Display` for `DType`.
#[test]
fn dtype_names_round_trip() {
    use nemotron_loader::DType;
    for t in [
        DType::BF16,
        DType::F16,
        DType::F32,
        DType::U8,
        DType::F8E4M3,
    ] {
        assert_eq!(DType::from_name(&t.to_string()), Some(t), "{t:?}");
    }
    assert_eq!(DType::F16.to_string(), "F16");
    assert_eq!(DType::from_name("F64"), None);
}

/// `|| → &&` in `HostTensor::rows`: a tensor with no rows, or bytes that are not whole rows,
/// gives no rows (the mutant divides by zero on the first).
#[test]
fn rows_of_an_empty_or_ragged_tensor_are_none() {
    use nemotron_loader::{DType, HostTensor};
    let t = |shape: Vec<usize>, bytes: usize| HostTensor {
        name: "t".into(),
        dtype: DType::U8,
        shape,
        bytes: vec![0; bytes],
    };
    assert!(t(vec![0, 4], 0).rows(0..0).is_none());
    assert!(t(vec![3], 7).rows(0..1).is_none());
    assert_eq!(t(vec![3, 2], 6).rows(1..3).unwrap().shape, vec![2, 2]);
}

/// `&& → ||` in `parse_config_json_form`: an 8-bit integer KV-cache scheme is refused by name,
/// not taken for FP8.
#[test]
fn an_int8_kv_cache_scheme_is_refused() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    edit_config(d.path(), |v| {
        v["quantization_config"]["kv_cache_scheme"]["type"] = "int".into();
    });
    let e = config_error(d.path());
    assert!(
        e.contains("kv_cache_scheme") && e.contains("only 8-bit float"),
        "{e}"
    );
}

/// `delete field source` in `QuantRecipe::from_sources` (the recipe's `source` label, an open
/// miss since shard 1/6): a recipe read from both files says so.
#[test]
fn a_recipe_from_both_files_names_both() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    let (_, recipe) = read_config(d.path()).unwrap();
    assert_eq!(
        recipe.source,
        "config.json quantization_config + hf_quant_config.json"
    );
}

/// Shard 4/6, `num_layers -> 0`: the layer count is the pattern's length (the tiny geometry's
/// pattern, read from the file written, not restated).
#[test]
fn num_layers_is_the_patterns_length() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    let raw: Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("config.json")).unwrap())
            .unwrap();
    let pattern = raw["hybrid_override_pattern"].as_str().unwrap().to_string();
    let (cfg, _) = read_config(d.path()).unwrap();
    assert!(!pattern.is_empty());
    assert_eq!(cfg.num_layers(), pattern.chars().count());
}

/// Shard 4/6, the guard `a.len() == 2 → true` in `check_dt_limit`: a one-element
/// `time_step_limit` is refused by name, not read past its end (a panic under the mutant).
#[test]
fn a_one_element_dt_limit_is_refused() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    edit_config(d.path(), |v| {
        v["time_step_limit"] = serde_json::json!([0.0])
    });
    let e = config_error(d.path());
    assert!(e.contains("time_step_limit"), "{e}");
}

/// Shard 5/6, `n_shared_experts > 0` as `>= 0` in `from_value`: a MoE without shared experts needs
/// no shared expert width (under the mutant its absence is refused) and reads as width 0.
#[test]
fn a_moe_without_shared_experts_needs_no_shared_width() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    without_shared_experts(d.path());
    let (cfg, _) = read_config(d.path()).unwrap();
    assert_eq!(cfg.moe.unwrap().shared_intermediate_size, 0);
}

/// Shard 5/6, `opt_str -> Ok(None)`: an activation other than the one implemented is refused by
/// name, not read as absent (`mamba_hidden_act`, `mlp_hidden_act`).
#[test]
fn unsupported_activations_are_refused() {
    for (key, bad) in [("mamba_hidden_act", "gelu"), ("mlp_hidden_act", "silu")] {
        let d = checkpoint(SynthRecipe::LightningMixed);
        edit_config(d.path(), |v| v[key] = bad.into());
        let e = config_error(d.path());
        assert!(e.contains(key) && e.contains(bad), "{key}={bad}: {e}");
    }
}

// Shard 0/6 (docs/RELIABILITY.md §3, session 22): the misses with a test each.

/// Shard 0/6, `> → ==` in `HostTensor::rows`: an empty range is the tensor's rows of nothing,
/// and a reversed range is refused (`None`), never a panic.
#[test]
fn host_tensor_rows_take_an_empty_range_and_refuse_a_reversed_one() {
    use nemotron_loader::{DType, HostTensor};
    let t = HostTensor {
        name: "t".into(),
        dtype: DType::BF16,
        shape: vec![4, 3],
        bytes: (0..24).collect(),
    };
    let empty = t.rows(2..2).expect("an empty range");
    assert_eq!((empty.shape.clone(), empty.bytes.len()), (vec![0, 3], 0));
    assert_eq!(t.rows(1..3).unwrap().bytes, (6..18).collect::<Vec<u8>>());
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = t.rows(3..1);
    assert!(reversed.is_none());
}

/// Shard 0/6, `|| → &&` in `QuantRecipe::is_excluded` and `delete !` in `parse_inner`: a legacy
/// ModelOpt exclusion (< 0.39) names a module by substring, and `module_path*` means the module
/// and everything below it wherever the path sits in the name.
#[test]
fn legacy_exclusions_match_by_substring_and_a_trailing_star() {
    let d = checkpoint(SynthRecipe::NanoNvfp4);
    edit_json(d.path(), "hf_quant_config.json", |hq| {
        let list = hq["quantization"]["exclude_modules"]
            .as_array_mut()
            .unwrap();
        list.push("layers.1.mixer".into());
        list.push("layers.2.mixer*".into());
    });
    let (_, recipe) = read_config(d.path()).unwrap();
    assert!(recipe.is_excluded("backbone.layers.1.mixer.in_proj"));
    assert!(recipe.is_excluded("backbone.layers.2.mixer.out_proj"));
    assert!(!recipe.is_excluded("backbone.layers.3.mixer.in_proj"));
}

/// Shard 0/6, `|| → &&` in `Checkpoint::from_tensors`: a tensor of the right shape but a dtype its
/// role does not allow is refused by name (as one of the right dtype but the wrong shape is).
#[test]
fn from_tensors_refuses_a_wrong_dtype_and_a_wrong_shape() {
    use nemotron_loader::synth::recipe_json;
    use nemotron_loader::{DType, HostTensor, LoadError, NemotronHConfig, QuantRecipe};
    let geom = Geometry::tiny();
    let cfg_json = geom.config_json();
    let cfg = NemotronHConfig::from_value(&cfg_json).unwrap();
    let (qc, hq) = recipe_json(&cfg, SynthRecipe::Bf16).unwrap();
    assert!(
        qc.is_none() && hq.is_none(),
        "plain BF16 has no quantization config"
    );
    let recipe = QuantRecipe::from_sources(&cfg_json, None).unwrap();
    let plan = Plan::new(&cfg, &recipe).unwrap();
    let tensors: Vec<HostTensor> = plan
        .specs
        .iter()
        .filter(|s| !s.optional)
        .map(|s| HostTensor {
            name: s.name.clone(),
            dtype: s.write_dtype,
            shape: s.shape.clone(),
            bytes: vec![0; s.shape.iter().product::<usize>() * s.write_dtype.size()],
        })
        .collect();
    Checkpoint::from_tensors(cfg.clone(), recipe.clone(), tensors.clone()).unwrap();
    let at = tensors
        .iter()
        .position(|t| t.dtype == DType::BF16 && t.shape.len() == 2)
        .unwrap();
    let name = tensors[at].name.clone();
    let mut wrong_dtype = tensors.clone();
    wrong_dtype[at].dtype = DType::U8;
    let half = wrong_dtype[at].bytes.len() / 2;
    wrong_dtype[at].bytes.truncate(half);
    let mut wrong_shape = tensors;
    wrong_shape[at].shape[0] += 1;
    for bad in [wrong_dtype, wrong_shape] {
        match Checkpoint::from_tensors(cfg.clone(), recipe.clone(), bad) {
            Err(LoadError::Shape { tensor, .. }) => assert_eq!(tensor, name),
            Err(e) => panic!("refused as {e}, not by shape/dtype"),
            Ok(_) => panic!("{name} of the wrong dtype or shape accepted"),
        }
    }
}

/// Shard 0/6, `n_shared_experts > 0` as `>= 0` in `Builder::mixer`: the plan of a MoE without
/// shared experts asks for no shared-expert tensors.
#[test]
fn a_moe_without_shared_experts_plans_no_shared_tensors() {
    let d = checkpoint(SynthRecipe::LightningMixed);
    without_shared_experts(d.path());
    let (cfg, recipe) = read_config(d.path()).unwrap();
    let plan = Plan::new(&cfg, &recipe).unwrap();
    assert!(plan
        .specs
        .iter()
        .any(|s| s.name.contains(".experts.0.up_proj")));
    let shared: Vec<_> = plan
        .specs
        .iter()
        .filter(|s| s.name.contains("shared_experts"))
        .map(|s| &s.name)
        .collect();
    assert!(shared.is_empty(), "{shared:?}");
}
