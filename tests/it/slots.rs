//! The slot decode path against the ragged forward (the reference): sequences prefilled by the
//! ragged forward, loaded into slots of a shared state (out of order, with a pad row), decoded
//! teacher-forced one token per step through `decode_slots`, against each sequence decoded alone
//! through `forward_last` — and a slot reused by a second sequence carries nothing of the first.
//!
//! Bands: f32 within 1e-5 of the logit scale (both paths are exact f32; they differ in summation
//! order); bf16 within 3.5e-2 of the scale (the bf16 host band of `device_parity`), with up to
//! two rows beyond it forgiven for routing flips. Host (Flex) and wgpu run in CI; CUDA is
//! `#[ignore]`d without a GPU.

use crate::common::*;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use nemotron::loader::synth::{Geometry, SynthRecipe};
use nemotron::model::{NemotronH, SlotState};

fn tensor_i32<const N: usize>(dev: &Device, v: Vec<i32>, shape: [usize; N]) -> Tensor<N, Int> {
    Tensor::from_data(TensorData::new(v, shape), (dev, DType::I32))
}

/// One teacher-forced step of the rows `rows` (slot per row, −1 = pad) with tokens `toks`.
fn step(m: &NemotronH, st: &mut SlotState, rows: &[i32], toks: &[u32]) -> Vec<f32> {
    let dev = m.device();
    let ids = tensor_i32(
        dev,
        toks.iter().map(|&t| t as i32).collect(),
        [toks.len(), 1],
    );
    let slots = tensor_i32(dev, rows.to_vec(), [rows.len()]);
    let l = m.decode_slots(st, &ids, &slots);
    st.note_step(rows);
    rows_of(l)
}

fn rows_of(t: Tensor<2>) -> Vec<f32> {
    rows(t)
}

fn check(dev: Device, dtype: DType, rel: f32, flips: usize) {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 21);
    let m = NemotronH::load_as(dir.path(), &dev, dtype).unwrap();
    let v = m.config().vocab_size;
    let prompts = [ids(13, v, 1), ids(5, v, 2), ids(9, v, 3)];
    let forced: Vec<Vec<u32>> = (0..3).map(|i| ids(6, v, 10 + i)).collect();
    // Alone, through the ragged forward.
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .zip(&forced)
        .map(|(p, f)| {
            let mut s = m.new_state();
            let _ = m.forward_last(&[p], &mut [&mut s]).unwrap();
            f.iter()
                .flat_map(|&t| rows(m.forward_last(&[&[t]], &mut [&mut s]).unwrap()))
                .collect()
        })
        .collect();
    // Sequences 0 and 1 in slots 2 and 0 of three, a pad row between them; sequence 2 reuses
    // slot 2 after sequence 0 is done.
    let mut st = m.new_slots(3, 32).unwrap();
    let prefill = |i: usize| {
        let mut s = m.new_state();
        let _ = m.forward_last(&[&prompts[i]], &mut [&mut s]).unwrap();
        s
    };
    m.load_slot(&mut st, 2, &prefill(0)).unwrap();
    m.load_slot(&mut st, 0, &prefill(1)).unwrap();
    let mut got = vec![vec![]; 3];
    for t in 0..6 {
        let l = step(&m, &mut st, &[2, -1, 0], &[forced[0][t], 0, forced[1][t]]);
        got[0].extend_from_slice(&l[..v]);
        got[1].extend_from_slice(&l[2 * v..]);
    }
    assert_eq!((st.len(2), st.len(0), st.len(1)), (13 + 6, 5 + 6, 0));
    m.load_slot(&mut st, 2, &prefill(2)).unwrap();
    for t in 0..6 {
        let l = step(&m, &mut st, &[2], &[forced[2][t]]);
        got[2].extend_from_slice(&l);
    }
    for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
        rows_close(
            &format!("{dtype:?} sequence {i}: slots vs alone"),
            g,
            a,
            v,
            rel,
            flips,
        );
    }
}

/// At most `flips` rows of `v` logits of `got` differ from `want` by more than `rel` × the
/// logit scale (a routing flip in bf16 moves a whole row).
fn rows_close(what: &str, got: &[f32], want: &[f32], v: usize, rel: f32, flips: usize) {
    let (d, scale) = diff(got, want);
    let beyond = row_diffs(got, want, v)
        .iter()
        .filter(|&&x| x > rel * scale)
        .count();
    eprintln!(
        "{what}: max |Δ| {d:.3e} at scale {scale:.3}, {beyond} rows beyond {:.3e}",
        rel * scale
    );
    assert!(
        beyond <= flips,
        "{what}: {beyond} rows beyond {rel} × {scale} (max {d})"
    );
}

#[test]
fn host_slots_equal_ragged() {
    check(host(), DType::F32, 1e-5, 0);
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_slots_equal_ragged() {
    check(
        Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
        DType::F32,
        1e-5,
        0,
    );
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_f32_slots_equal_ragged() {
    check(Device::cuda(0), DType::F32, 1e-5, 0);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_bf16_slots_equal_ragged() {
    check(Device::cuda(0), DType::BF16, 3.5e-2, 2);
}

/// `prefill_slots` (one ragged forward straight into the slots, each pool written once for the
/// batch) against the per-sequence path (`forward_last` alone, then `load_slot`): prompts of 13,
/// 5 and 7 tokens (conv ring rotations 2, 2 and 0 at the tiny geometry's K = 4) into slots 2, 0
/// and 1, then a single 4-token prompt (rotation 1; attention run one sequence at a time, so its
/// keys enter per sequence) into slot 2 again. The prefill logits and 6 teacher-forced decode
/// steps of every slot must agree within the band of [`check`].
fn check_prefill_slots(dev: Device, dtype: DType, rel: f32, flips: usize) {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 21);
    let m = NemotronH::load_as(dir.path(), &dev, dtype).unwrap();
    let v = m.config().vocab_size;
    let prompts = [ids(13, v, 1), ids(5, v, 2), ids(7, v, 3), ids(4, v, 4)];
    let forced: Vec<Vec<u32>> = (0..4).map(|i| ids(6, v, 10 + i)).collect();
    let alone_logits = |i: usize| {
        let mut s = m.new_state();
        let l = rows(m.forward_last(&[&prompts[i]], &mut [&mut s]).unwrap());
        (l, s)
    };
    let compare = |what: &str, g: &[f32], a: &[f32]| {
        rows_close(&format!("{dtype:?} {what}"), g, a, v, rel, flips)
    };
    let (mut direct, mut apart) = (m.new_slots(3, 32).unwrap(), m.new_slots(3, 32).unwrap());
    let batch: Vec<&[u32]> = prompts[..3].iter().map(|p| p.as_slice()).collect();
    let got = rows(m.prefill_slots(&mut direct, &batch, &[2, 0, 1]).unwrap());
    let mut want = vec![];
    for (i, slot) in [(0, 2), (1, 0), (2, 1)] {
        let (l, s) = alone_logits(i);
        want.extend(l);
        m.load_slot(&mut apart, slot, &s).unwrap();
    }
    compare("prefill_slots logits, 3 prompts", &got, &want);
    for slot in [2, 0, 1] {
        assert_eq!(direct.len(slot), apart.len(slot), "slot {slot}'s length");
    }
    let decode = |st: &mut SlotState, rows: &[i32], seqs: &[usize]| -> Vec<f32> {
        (0..6)
            .flat_map(|t| {
                let toks: Vec<u32> = seqs.iter().map(|&i| forced[i][t]).collect();
                step(&m, st, rows, &toks)
            })
            .collect()
    };
    let (g, a) = (
        decode(&mut direct, &[2, 0, 1], &[0, 1, 2]),
        decode(&mut apart, &[2, 0, 1], &[0, 1, 2]),
    );
    compare("decode after prefill_slots, 3 slots", &g, &a);
    let got = rows(m.prefill_slots(&mut direct, &[&prompts[3]], &[2]).unwrap());
    let (l, s) = alone_logits(3);
    m.load_slot(&mut apart, 2, &s).unwrap();
    compare("prefill_slots logits, 1 prompt", &got, &l);
    let (g, a) = (
        decode(&mut direct, &[2, 0], &[3, 0]),
        decode(&mut apart, &[2, 0], &[3, 0]),
    );
    compare("decode after prefill_slots into a reused slot", &g, &a);
    let e = m
        .prefill_slots(&mut direct, &[&prompts[0], &prompts[1]], &[1, 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("slot 1 given twice"), "{e}");
}

#[test]
fn host_prefill_slots_equal_load_slot() {
    check_prefill_slots(host(), DType::F32, 1e-5, 0);
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_prefill_slots_equal_load_slot() {
    check_prefill_slots(
        Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
        DType::F32,
        1e-5,
        0,
    );
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_bf16_prefill_slots_equal_load_slot() {
    check_prefill_slots(Device::cuda(0), DType::BF16, 3.5e-2, 2);
}

#[test]
fn a_sequence_longer_than_a_slot_is_refused() {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 21);
    let m = load_host(dir.path());
    let mut st = m.new_slots(2, 8).unwrap();
    let mut s = m.new_state();
    let _ = m.forward_last(&[&ids(9, 256, 1)], &mut [&mut s]).unwrap();
    let e = m.load_slot(&mut st, 1, &s).unwrap_err().to_string();
    assert!(e.contains('9') && e.contains('8'), "{e}");
}

/// `parity --decode-path slots` writes the same teacher-forced decode logits as the ragged path
/// (the default) on the host, within the f32 band; an unknown path is refused by name.
#[test]
fn parity_example_decode_paths_agree() {
    let bin = parity_example();
    let tmp = tempfile::tempdir().unwrap();
    let run = |path: &str| -> std::process::Output {
        std::process::Command::new(&bin)
            .args(["--prompt-ids", "3,5,7,11,13", "--force-ids", "17,19,23,29"])
            .args(["--decode-path", path])
            .arg("--model")
            .arg(fixture("all_letters"))
            .arg("--out")
            .arg(tmp.path().join(format!("{path}.safetensors")))
            .output()
            .unwrap()
    };
    let logits = |path: &str| -> Vec<f32> {
        let o = run(path);
        assert!(
            o.status.success(),
            "parity --decode-path {path}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let bytes = std::fs::read(tmp.path().join(format!("{path}.safetensors"))).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let t = st.tensor("decode_logits").unwrap();
        assert_eq!(t.shape()[0], 4, "one row per forced id");
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let (ragged, slots) = (logits("ragged"), logits("slots"));
    let scale = ragged.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = ragged
        .iter()
        .zip(&slots)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        d <= 1e-5 * scale,
        "slots vs ragged: max |Δ| {d} at scale {scale}"
    );
    let bad = run("paged");
    assert!(!bad.status.success(), "an unknown decode path runs");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("--decode-path") && err.contains("paged"),
        "{err}"
    );
}
