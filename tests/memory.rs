//! The decode engine's device memory: after 1,000 steps (wgpu; 10,000 with graphs on CUDA) it
//! equals that after 100 — a handle leaked per step fails it. A binary of its own: the device's
//! memory counter is process-wide, and the other tests' threads (`tests/it`) allocate on the same
//! devices while these run.

// The shared helpers of tests/it, of which this binary uses a few.
#[path = "it/common.rs"]
#[allow(dead_code)]
mod common;

use burn::tensor::{DType, Device};
use common::*;
use nemotron::loader::synth::{Geometry, SynthRecipe};
use nemotron::model::{Engine, EngineOptions, GenerateOptions, NemotronH};

/// Device memory in use after `steps` engine steps equals that after 100: the slots are allocated
/// once, and nothing a step allocates outlives it (two sequences decoding side by side, greedy,
/// no stop ids, contexts sized for the whole run).
fn memory_stays_flat(dev: Device, dtype: DType, graphs: bool, steps: usize) {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 29);
    let m = NemotronH::load_as(dir.path(), &dev, dtype).unwrap();
    let v = m.config().vocab_size;
    let cap = steps + 16;
    let mut opts = EngineOptions::new(2, cap);
    opts.graphs = graphs;
    let mut e = Engine::new(&m, opts).unwrap();
    let o = GenerateOptions {
        max_new_tokens: steps + 1,
        stop_ids: vec![],
        max_context: Some(cap),
        ..Default::default()
    };
    e.submit(&ids(5, v, 1), o.clone()).unwrap();
    e.submit(&ids(8, v, 2), o).unwrap();
    let in_use = || {
        nemotron::kernels::cube::memory_in_use(&dev).expect("a CubeCL device reports its memory")
    };
    let mut after_100 = None;
    while !e.is_idle() {
        e.step().unwrap();
        if e.steps() == 100 {
            after_100 = Some(in_use());
        }
    }
    assert_eq!(e.steps(), steps, "both sequences decode their whole budget");
    let (a, b) = (after_100.expect("more than 100 steps"), in_use());
    eprintln!("device memory in use: {a} B after 100 steps, {b} B after {steps}");
    assert_eq!(b, a, "device memory grew between step 100 and step {steps}");
}

#[test]
fn wgpu_engine_memory_stays_flat() {
    memory_stays_flat(
        Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
        DType::F32,
        false,
        1_000,
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_bf16_engine_memory_stays_flat_over_10000_steps() {
    memory_stays_flat(Device::cuda(0), DType::BF16, true, 10_000);
}
