//! The shared expert stacked with the routed experts (`BuildOptions { shared_expert: Fold }`:
//! cut into routed-width experts every token takes with weight 1) against HF transformers'
//! `nemotron_h` f32 goldens: prefill, the teacher-forced ragged decode, and the decode through a
//! slot (where the step's combine, folded into the next norm, has no shared row of its own).
//! Fixtures: dense experts (`all_letters`, `grouped_routing`: a shared width of 48 over experts of
//! 32, so the second part is half zero padding), NVFP4 (`nano_nvfp4`, and `lightning_mixed`'s
//! W4A16 experts, its FP8 layers weight-only for the tight goldens).
//!
//! Band: `hf_parity`'s 1e-5 of the logit scale. In f32 the fold changes only the order of the
//! sums (the shared rows join the routed f32 sum before one rounding), ≈ 1e-7 relative. Seen red
//! with the fixed slots weighted 0.5 in the routing (host reference and kernel).

use crate::common::*;
use burn::tensor::{DType, Device};
use nemotron::model::{BuildOptions, Deviations, NemotronH, SharedExpert};

const BAND: f32 = 1e-5;

fn fold() -> BuildOptions {
    BuildOptions {
        shared_expert: SharedExpert::Fold,
    }
}

/// Both layouts, folded for one-row decode steps only: the prompt and the ragged decode run
/// apart and the decode through a slot folded, in one sequence (quantized experts; the dense
/// fixtures stay apart under it).
fn auto1() -> BuildOptions {
    BuildOptions {
        shared_expert: SharedExpert::Auto { max_rows: 1 },
    }
}

fn check(dev: &Device) {
    let w8a16 = Deviations {
        fp8_weight_only: true,
        ..Default::default()
    };
    for (name, suffix, d) in [
        ("all_letters", "", Deviations::default()),
        ("grouped_routing", "", Deviations::default()),
        ("nano_nvfp4", "", Deviations::default()),
        ("lightning_mixed", "_w8a16", w8a16),
    ] {
        let r = reference(name, suffix);
        for opts in [fold(), auto1()] {
            let m = NemotronH::load_with_deviations_and(fixture(name), dev, DType::F32, d, opts)
                .unwrap();
            let (dp, dd, scale) = compare(&m, &r);
            let (ds, _) = diff(&slot_decode(&m, &r), &r.decode);
            let mode = opts.shared_expert;
            eprintln!(
                "{dev:?} {name}{suffix} {mode:?}: prefill max |Δ| {dp:.3e}, decode {dd:.3e}, \
                 decode through a slot {ds:.3e}, scale {scale:.3}"
            );
            for (what, v) in [("prefill", dp), ("decode", dd), ("slot decode", ds)] {
                assert!(
                    v <= BAND * scale,
                    "{name}{suffix} {mode:?}: {what} max |Δ| {v} > {BAND} × {scale}"
                );
            }
        }
    }
}

#[test]
fn host_folded_shared_expert_matches_hf() {
    check(&host());
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_folded_shared_expert_matches_hf() {
    check(&Device::wgpu(burn::tensor::DeviceKind::DefaultDevice));
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_f32_folded_shared_expert_matches_hf() {
    check(&Device::cuda(0));
}

/// A layer whose shared expert has another weight form than its routed experts cannot join
/// their stack: the fold is refused by layer before anything is built, not silently left apart.
#[test]
fn fold_is_refused_by_layer_where_the_forms_differ() {
    use nemotron::loader::{Checkpoint, HostTensor, LinearWeight, MixerWeights};
    // `lightning_mixed` with its first MoE layer's shared `up` made f32 (the same shape) where
    // the routed experts are NVFP4.
    let broken = || {
        let mut ck = Checkpoint::load(fixture("lightning_mixed")).unwrap();
        let (i, moe) = ck
            .weights
            .layers
            .iter_mut()
            .enumerate()
            .find_map(|(i, l)| match &mut l.mixer {
                MixerWeights::Moe(m) => Some((i, m)),
                _ => None,
            })
            .unwrap();
        let s = moe.shared.as_mut().unwrap();
        let (o, n) = (s.up.out_features(), s.up.in_features());
        s.up = LinearWeight::Dense(HostTensor {
            name: "shared up, dense".into(),
            dtype: nemotron::loader::DType::F32,
            shape: vec![o, n],
            bytes: vec![0; o * n * 4],
        });
        (i, ck)
    };
    let (i, ck) = broken();
    let e = NemotronH::from_checkpoint_with(ck, &host(), DType::F32, fold())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("backbone.layers.{i}.mixer.shared_experts")) && e.contains("form"),
        "{e}"
    );
    // Apart, the same checkpoint builds; so it does under `Auto` ("where it can"), that layer
    // apart.
    NemotronH::from_checkpoint(broken().1, &host(), DType::F32).unwrap();
    NemotronH::from_checkpoint_with(broken().1, &host(), DType::F32, auto1()).unwrap();
}

/// `bench --shared-expert` is honoured: the line it prints counts the MoE layers the model was
/// built with folded (from the model, not from the flag), none apart, every one folded.
#[test]
fn bench_builds_the_shared_expert_as_asked() {
    let run = |mode: &str| -> String {
        let o = std::process::Command::new(example("bench"))
            .args(["--geometry", "tiny", "--prompt-len", "4", "--decode", "1"])
            .args(["--repeats", "1", "--no-hf", "--shared-expert", mode])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            o.status.success(),
            "bench --shared-expert {mode}: {out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    };
    let cfg = nemotron::loader::synth::Geometry::tiny().config_json();
    let moe_layers = cfg["hybrid_override_pattern"]
        .as_str()
        .unwrap()
        .matches('E')
        .count();
    assert!(moe_layers > 0, "the tiny geometry has MoE layers");
    let apart = run("apart");
    assert!(
        apart.contains("shared expert apart (0 MoE layers folded)"),
        "{apart}"
    );
    let fold = run("fold");
    assert!(
        fold.contains(&format!(
            "shared expert fold ({moe_layers} MoE layers folded)"
        )),
        "{fold}"
    );
    // The tiny geometry's experts are dense: `auto` holds them apart (folding dense experts is
    // slower, see `SharedExpert::Fold`).
    let auto = run("auto");
    assert!(
        auto.contains("shared expert auto (0 MoE layers folded)"),
        "{auto}"
    );
    let o = std::process::Command::new(example("bench"))
        .args([
            "--geometry",
            "tiny",
            "--no-hf",
            "--shared-expert",
            "auto:many",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("auto:N"), "{err}");
}
