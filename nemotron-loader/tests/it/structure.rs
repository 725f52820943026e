//! Structural counts: each recipe on tiny synthetic checkpoints (written, loaded, reported), and the
//! full-size 30B-A3B enumerations against the numbers of the real released checkpoints.

use nemotron_loader::plan::{Plan, PlanCounts};
use nemotron_loader::synth::{
    recipe_json, ships_optional, write_checkpoint, Geometry, SynthOptions, SynthRecipe,
};
use nemotron_loader::{
    Checkpoint, LinearWeight, MixerWeights, NemotronHConfig, QuantRecipe, WeightForm,
};
use std::collections::BTreeMap;

fn plan_for(geom: &Geometry, recipe: SynthRecipe) -> Plan {
    let mut cfg_json = geom.config_json();
    let cfg = NemotronHConfig::from_value(&cfg_json).unwrap();
    let (qc, hq) = recipe_json(&cfg, recipe).unwrap();
    if let Some(qc) = qc {
        cfg_json["quantization_config"] = qc;
    }
    let r = QuantRecipe::from_sources(&cfg_json, hq.as_ref()).unwrap();
    Plan::new(&cfg, &r).unwrap()
}

fn dense(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Nemotron 3.5 Lightning 30B-A3B: 18,487 tensors (270 MTP), 5,935 W4A16 NVFP4 projections of 3
/// tensors, 46 FP8 projections of 3, 12 KV scales, 216 BF16 + 46 F32 dense, 69 widened.
#[test]
fn full_size_lightning_enumeration_matches_the_release() {
    let plan = plan_for(&Geometry::lightning_30b(), SynthRecipe::LightningMixed);
    let c = plan.counts(|s| ships_optional(s, SynthRecipe::LightningMixed));
    let want = PlanCounts {
        tensors_total: 18_487,
        materialized: 18_217,
        deferred: 270,
        nvfp4_projections: 5_935,
        nvfp4_tensors: 17_805,
        fp8_projections: 46,
        fp8_tensors: 138,
        kv_scales: 12,
        dense_tensors: dense(&[("BF16", 216), ("F32", 46)]),
        widened: 69,
        bytes: c.bytes,
    };
    assert_eq!(c, want);
    // ≈20.1 GiB on disk (third-party enumeration); the expert weights alone are 16.5 GB packed.
    let gib = c.bytes as f64 / (1u64 << 30) as f64;
    assert!((19.5..20.5).contains(&gib), "{gib} GiB");
}

/// Nemotron 3 Nano 30B-A3B NVFP4 (ModelOpt 0.29.0): 24,147 tensors, 19,339,781,632 bytes, 5,968
/// NVFP4 (W4A4-declared, 4 tensors each) matrices, no FP8, no KV scales shipped.
#[test]
fn full_size_nano_nvfp4_enumeration_matches_the_release() {
    let plan = plan_for(&Geometry::nano_30b(), SynthRecipe::NanoNvfp4);
    let c = plan.counts(|s| ships_optional(s, SynthRecipe::NanoNvfp4));
    assert_eq!(c.tensors_total, 24_147);
    assert_eq!(c.bytes, 19_339_781_632);
    assert_eq!(c.nvfp4_projections, 5_968);
    assert_eq!(c.nvfp4_tensors, 4 * 5_968);
    assert_eq!((c.fp8_projections, c.kv_scales, c.deferred), (0, 0, 0));
    // The six Mamba layers in front of attention stay BF16.
    for l in [4, 11, 18, 25, 32, 41] {
        assert_eq!(
            plan.linear(&format!("backbone.layers.{l}.mixer.in_proj"))
                .unwrap()
                .form,
            WeightForm::Dense,
            "layer {l}"
        );
    }
    assert_eq!(plan.linear("lm_head").unwrap().form, WeightForm::Dense);
}

/// Nano BF16: 6,243 tensors and 31,577,940,288 parameters.
#[test]
fn full_size_bf16_enumeration() {
    let plan = plan_for(&Geometry::nano_30b(), SynthRecipe::Bf16);
    let c = plan.counts(|_| false);
    assert_eq!(c.tensors_total, 6_243);
    let params: u64 = plan
        .specs
        .iter()
        .map(|s| s.shape.iter().product::<usize>() as u64)
        .sum();
    assert_eq!(params, 31_577_940_288);
}

fn load_tiny(recipe: SynthRecipe) -> (Checkpoint, PlanCounts) {
    let dir = tempfile::tempdir().unwrap();
    let opts = SynthOptions {
        recipe,
        seed: 3,
        max_shard_bytes: 32 << 10,
        misalign: false,
    };
    let summary = write_checkpoint(dir.path(), &Geometry::tiny(), &opts).unwrap();
    let ck = Checkpoint::load(dir.path()).unwrap();
    let counts = plan_for(&Geometry::tiny(), recipe).counts(|s| ships_optional(s, recipe));
    assert_eq!(ck.report.tensors_total, summary.tensors);
    assert!(summary.shards > 1, "the tiny checkpoints are sharded");
    (ck, counts)
}

fn assert_report_matches(ck: &Checkpoint, c: &PlanCounts) {
    let r = &ck.report;
    assert_eq!(
        (
            r.tensors_total,
            r.materialized,
            r.deferred,
            r.nvfp4_projections,
            r.nvfp4_tensors,
            r.fp8_projections,
            r.fp8_tensors,
            r.kv_scales,
            r.widened
        ),
        (
            c.tensors_total,
            c.materialized,
            c.deferred,
            c.nvfp4_projections,
            c.nvfp4_tensors,
            c.fp8_projections,
            c.fp8_tensors,
            c.kv_scales,
            c.widened
        )
    );
    assert_eq!(r.dense_tensors, c.dense_tensors);
    assert_eq!(r.source_bytes, c.bytes);
    assert!(r.bytes_identity_holds());
    assert_eq!(
        r.host_bytes,
        r.source_bytes - r.deferred_bytes + r.widened_extra_bytes
    );
}

// Tiny geometry "ME*M-E" + MTP "*E": 2 Mamba, 2 MoE (8 experts + shared), 1 attention, 1 MLP.

#[test]
fn tiny_lightning_mixed_counts() {
    let (ck, c) = load_tiny(SynthRecipe::LightningMixed);
    assert_report_matches(&ck, &c);
    let r = &ck.report;
    // 2 MoE × (16 expert + 2 shared) + lm_head = 37 W4A16 projections of 3 tensors.
    assert_eq!((r.nvfp4_projections, r.nvfp4_tensors), (37, 111));
    assert_eq!(
        (r.fp8_projections, r.fp8_tensors, r.kv_scales, r.widened),
        (4, 12, 2, 6)
    );
    // MTP "*E": layer 0 = 3 fusion + norm + 4 attention; layer 1 = norm + 2 router + 16 + 2 + final norm.
    assert_eq!(r.deferred, 8 + 22);
    assert_eq!(r.deferred_prefixes.get("mtp."), Some(&30));
    let w = &ck.weights;
    assert!(matches!(w.lm_head, Some(LinearWeight::Nvfp4(ref n)) if n.input_scale.is_none()));
    match &w.layers[0].mixer {
        MixerWeights::Mamba(m) => {
            assert!(matches!(m.in_proj, LinearWeight::Fp8(_)));
            assert_eq!(m.a_log.len(), 8);
        }
        other => panic!("layer 0 is Mamba, got {other:?}"),
    }
    match &w.layers[2].mixer {
        MixerWeights::Attention(a) => {
            assert!(matches!(a.q, LinearWeight::Dense(_)));
            assert!(a.k_scale.unwrap() >= 1.0 && a.v_scale.unwrap() >= 1.0);
        }
        other => panic!("layer 2 is attention, got {other:?}"),
    }
}

#[test]
fn tiny_nano_nvfp4_counts() {
    let (ck, c) = load_tiny(SynthRecipe::NanoNvfp4);
    assert_report_matches(&ck, &c);
    let r = &ck.report;
    // Neither Mamba layer (0, 3) precedes attention, so both are quantized: 4 Mamba projections,
    // 2 × 18 expert projections and the MLP's 2, W4A4-declared (4 tensors each); lm_head and
    // attention are excluded.
    assert_eq!((r.nvfp4_projections, r.nvfp4_tensors), (42, 168));
    assert_eq!((r.fp8_projections, r.kv_scales), (0, 0));
    assert!(matches!(ck.weights.lm_head, Some(LinearWeight::Dense(_))));
    match &ck.weights.layers[1].mixer {
        MixerWeights::Moe(m) => assert!(
            matches!(m.experts[0].up, LinearWeight::Nvfp4(ref n) if n.input_scale.is_some())
        ),
        other => panic!("layer 1 is MoE, got {other:?}"),
    }
}

#[test]
fn tiny_bf16_counts() {
    let (ck, c) = load_tiny(SynthRecipe::Bf16);
    assert_report_matches(&ck, &c);
    let r = &ck.report;
    assert_eq!(
        (r.nvfp4_projections, r.fp8_projections, r.kv_scales),
        (0, 0, 0)
    );
    assert_eq!(r.recipe, "unquantized from none");
}

#[test]
fn in_memory_build_equals_the_written_checkpoint() {
    for recipe in [
        SynthRecipe::LightningMixed,
        SynthRecipe::NanoNvfp4,
        SynthRecipe::Bf16,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let opts = SynthOptions {
            recipe,
            seed: 9,
            max_shard_bytes: 0,
            misalign: false,
        };
        write_checkpoint(dir.path(), &Geometry::tiny(), &opts).unwrap();
        let disk = Checkpoint::load(dir.path()).unwrap();
        let mem = nemotron_loader::synth::build_checkpoint(&Geometry::tiny(), &opts).unwrap();
        assert_eq!(disk.weights, mem.weights, "{recipe:?}");
        assert_eq!(disk.config, mem.config);
        let (a, b) = (&disk.report, &mem.report);
        assert_eq!(
            (
                a.tensors_total,
                a.materialized,
                a.deferred,
                a.host_bytes,
                a.source_bytes
            ),
            (
                b.tensors_total,
                b.materialized,
                b.deferred,
                b.host_bytes,
                b.source_bytes
            )
        );
    }
}
