//! Graph capture of a decode step on our own model (the spike the decode engine builds on): one
//! batch-1 decode step of the tiny Lightning-style model captured as a CUDA graph and replayed.
//! Each replay must give the eager step's logits bit for bit, and after the captured token-id
//! buffer is rewritten in place, the next replay must give the eager logits of the new token
//! (the replay really recomputes, from the buffers it captured). CUDA only: `#[ignore]`d and
//! counted as ignored without a GPU; run on the device machine with `--ignored`.
#![cfg(feature = "cuda")]

use crate::common::*;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use nemotron::kernels::cube::write_i32_in_place;
use nemotron::loader::synth::{Geometry, SynthRecipe};
use nemotron::model::NemotronH;

fn replays_bit_identical(dtype: DType) {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 41);
    let dev = Device::cuda(0);
    let m = NemotronH::load_as(dir.path(), &dev, dtype).unwrap();
    let mut s = m.new_state();
    let prompt = ids(9, m.config().vocab_size, 1);
    let _ = m.forward_last(&[&prompt], &mut [&mut s]).unwrap();
    let id =
        |v: i32| Tensor::<2, Int>::from_data(TensorData::new(vec![v], [1, 1]), (&dev, DType::I32));
    let eager = |v: i32| {
        let mut s = s.clone();
        let l = m.forward_last_ids(id(v), &mut [&mut s]).unwrap();
        l.into_data().as_bytes().to_vec()
    };
    let (want_a, want_b) = (eager(42), eager(7));
    assert_ne!(
        want_a, want_b,
        "two tokens give the same logits: the check below proves nothing"
    );
    let ids_t = id(42);
    let mut g = m.capture_step(ids_t.clone(), vec![s.clone()]).unwrap();
    assert!(g.is_hardware(), "CUDA should capture a hardware graph");
    for i in 0..5 {
        let got = unsafe { g.replay() }.clone().into_data();
        assert_eq!(
            got.as_bytes(),
            &want_a[..],
            "replay {i} differs from the eager step"
        );
    }
    write_i32_in_place(&ids_t, &[7]).unwrap();
    let got = unsafe { g.replay() }.clone().into_data();
    assert_eq!(
        got.as_bytes(),
        &want_b[..],
        "after rewriting the token id in place"
    );
    eprintln!(
        "{dtype:?}: 6 replays bit-identical to the eager steps ({} logits)",
        want_a.len() / dtype.size()
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_f32_decode_step_graph_replays_bit_identical() {
    replays_bit_identical(DType::F32);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_bf16_decode_step_graph_replays_bit_identical() {
    replays_bit_identical(DType::BF16);
}
