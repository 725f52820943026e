//! Self-consistency of the host reference on synthetic checkpoints: incremental decode equals one
//! prefill over a long sequence, and a ragged batch equals each sequence run alone; a 1,000-token
//! greedy decode stays on the prefill of its own tokens (host and wgpu: long-run drift).
//!
//! Band: both sides run the same f32 code on the host and differ only in summation order (matmul
//! blocking depends on the row count), so the band is 1e-5 of the logit scale.

use crate::common::*;
use nemotron::loader::synth::{Geometry, SynthRecipe};

const BAND: f32 = 1e-5;

#[test]
fn decode_equals_prefill_over_220_tokens() {
    // Every block type, grouped routing, W4A16 NVFP4 + FP8 W8A8 + BF16.
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 5);
    let m = load_host(dir.path());
    let toks = ids(220, m.config().vocab_size, 9);
    let mut s = m.new_state();
    let full = rows(m.forward_one(&toks, &mut s).unwrap());
    let v = m.config().vocab_size;
    let mut s = m.new_state();
    // Prefill a first part, then decode the rest one token at a time.
    let mut inc = rows(m.forward_one(&toks[..13], &mut s).unwrap());
    for &t in &toks[13..] {
        inc.extend(rows(m.forward_one(&[t], &mut s).unwrap()));
    }
    assert_eq!(s.position, 220);
    let (d, scale) = diff(&inc, &full);
    eprintln!("decode vs prefill: max |Δ| = {d:e} at logit scale {scale}");
    assert!(d <= BAND * scale, "max |Δ| {d} > {BAND} · {scale}");
    assert_eq!(full.len(), 220 * v);
}

/// Chunked prefill: a 90-token prompt in pieces of 1, 3, 7 (not dividing it) and 64 tokens, the
/// state carried between them, gives the one-shot prefill's logits at every position within the
/// f32 band (seen red with the flash kernel's prefix length one short).
fn chunked_prefill_equals_one_shot(dev: burn::tensor::Device) {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 11);
    let m = nemotron::model::NemotronH::load_as(dir.path(), &dev, burn::tensor::DType::F32)
        .expect("tiny model loads");
    let toks = ids(90, m.config().vocab_size, 12);
    let full = rows(m.forward_one(&toks, &mut m.new_state()).unwrap());
    for chunk in [1, 3, 7, 64] {
        let mut s = m.new_state();
        let got = rows(m.forward_one_chunked(&toks, &mut s, chunk).unwrap());
        assert_eq!(s.position, 90, "chunk {chunk}");
        let (d, scale) = diff(&got, &full);
        eprintln!("chunks of {chunk}: max |Δ| = {d:e} at logit scale {scale}");
        assert!(
            d <= BAND * scale,
            "chunks of {chunk}: max |Δ| {d} > {BAND} · {scale}"
        );
    }
}

#[test]
fn host_chunked_prefill_equals_one_shot() {
    chunked_prefill_equals_one_shot(host());
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_chunked_prefill_equals_one_shot() {
    chunked_prefill_equals_one_shot(burn::tensor::Device::wgpu(
        burn::tensor::DeviceKind::DefaultDevice,
    ));
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_f32_chunked_prefill_equals_one_shot() {
    chunked_prefill_equals_one_shot(burn::tensor::Device::cuda(0));
}

#[test]
fn ragged_batch_equals_single() {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 6);
    let m = load_host(dir.path());
    let v = m.config().vocab_size;
    let seqs: Vec<Vec<u32>> = [17usize, 5, 31]
        .iter()
        .enumerate()
        .map(|(i, &n)| ids(n, v, 100 + i as u64))
        .collect();
    let next: Vec<Vec<u32>> = (0..3).map(|i| ids(1 + i, v, 200 + i as u64)).collect();

    // Alone.
    let mut alone = vec![];
    for (p, n) in seqs.iter().zip(&next) {
        let mut s = m.new_state();
        let a = rows(m.forward_one(p, &mut s).unwrap());
        let b = rows(m.forward_one(n, &mut s).unwrap());
        alone.push((a, b));
    }
    // Together: one ragged prefill, then one ragged continuation.
    let mut states: Vec<_> = (0..3).map(|_| m.new_state()).collect();
    let mut refs: Vec<_> = states.iter_mut().collect();
    let toks: Vec<&[u32]> = seqs.iter().map(|s| s.as_slice()).collect();
    let l1 = m.forward(&toks, &mut refs).unwrap();
    let toks: Vec<&[u32]> = next.iter().map(|s| s.as_slice()).collect();
    let l2 = m.forward(&toks, &mut refs).unwrap();
    let (t1, t2) = (l1.dims()[1], l2.dims()[1]);
    let (r1, r2) = (rows(l1), rows(l2));
    for (b, (a, c)) in alone.iter().enumerate() {
        let n1 = seqs[b].len();
        let got1 = &r1[b * t1 * v..(b * t1 + n1) * v];
        let n2 = next[b].len();
        let got2 = &r2[b * t2 * v..(b * t2 + n2) * v];
        let (d1, s1) = diff(got1, a);
        let (d2, s2) = diff(got2, c);
        eprintln!("seq {b}: prefill max |Δ| {d1:e} (scale {s1}), continuation {d2:e} (scale {s2})");
        assert!(
            d1 <= BAND * s1 && d2 <= BAND * s2,
            "sequence {b} differs in a batch"
        );
    }
}

/// Long-run numerics: a 1,000-token greedy decode (each token the arg-max of the previous step's
/// logits, one token per forward) against one prefill over the same 1,001 tokens, compared at every
/// 100th position within the f32 band; the decode's greedy picks must equal the prefill's
/// arg-max wherever the prefill's top two logits are apart by more than the band. Host and wgpu.
fn greedy_decode_stays_on_prefill(dev: burn::tensor::Device) {
    greedy_decode_drift(dev, burn::tensor::DType::F32, BAND);
}

/// Greedy decode of 1,000 tokens, one at a time through the cache, against one prefill over the
/// same tokens: max |Δ| of the logits at every 100th position within `band` of the logit scale,
/// and the same greedy pick wherever the prefill's top two differ by more than twice the band.
/// Off the host it also prints each position's distance from the host's f32 prefill.
fn greedy_decode_drift(dev: burn::tensor::Device, dtype: burn::tensor::DType, band: f32) {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 7);
    let m = nemotron::model::NemotronH::load_as(dir.path(), &dev, dtype).expect("tiny model loads");
    let v = m.config().vocab_size;
    let argmax = |row: &[f32]| {
        row.iter()
            .enumerate()
            .fold((0usize, f32::NEG_INFINITY), |b, (i, &x)| {
                if x > b.1 {
                    (i, x)
                } else {
                    b
                }
            })
            .0 as u32
    };
    let mut toks = vec![11u32];
    let mut s = m.new_state();
    let mut dec: Vec<Vec<f32>> = vec![];
    for _ in 0..1000 {
        let row = rows(m.forward_one(&toks[toks.len() - 1..], &mut s).unwrap());
        toks.push(argmax(&row));
        dec.push(row);
    }
    let mut s = m.new_state();
    let full = rows(m.forward_one(&toks[..1000], &mut s).unwrap());
    let exact = (dtype != burn::tensor::DType::F32).then(|| {
        let h = load_host(dir.path());
        let mut s = h.new_state();
        rows(h.forward_one(&toks[..1000], &mut s).unwrap())
    });
    for p in (99..1000).step_by(100) {
        let want = &full[p * v..(p + 1) * v];
        let (d, scale) = diff(&dec[p], want);
        let vs_f32 = exact.as_ref().map_or(String::new(), |e| {
            let (de, se) = diff(&dec[p], &e[p * v..(p + 1) * v]);
            format!("; vs the host f32 prefill {:.3e} of {se}", de / se)
        });
        eprintln!(
            "position {}: max |Δ| {d:e} at logit scale {scale} ({:.3e}){vs_f32}",
            p + 1,
            d / scale
        );
        assert!(
            d <= band * scale,
            "position {}: max |Δ| {d} > {band} · {scale}",
            p + 1
        );
    }
    for (p, row) in dec.iter().enumerate() {
        let want = &full[p * v..(p + 1) * v];
        let mut sorted = want.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let scale = want.iter().fold(0f32, |a, &x| a.max(x.abs()));
        if sorted[0] - sorted[1] > 2.0 * band * scale {
            assert_eq!(
                argmax(row),
                argmax(want),
                "greedy pick at position {}",
                p + 1
            );
        }
    }
}

#[test]
fn host_greedy_decode_of_1000_tokens_stays_on_prefill() {
    greedy_decode_stays_on_prefill(host());
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_greedy_decode_of_1000_tokens_stays_on_prefill() {
    greedy_decode_stays_on_prefill(burn::tensor::Device::wgpu(
        burn::tensor::DeviceKind::DefaultDevice,
    ));
}

/// The CUDA bf16 drift over 1,000 tokens (issue 12, item 6): decode against a bf16 prefill over
/// the same tokens, band 5e-2 of the logit scale (bf16 keeps 8 bits; both paths round
/// differently at every layer), and each position's distance from the host's f32 prefill printed.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_bf16_greedy_decode_of_1000_tokens_drift() {
    greedy_decode_drift(
        burn::tensor::Device::cuda(0),
        burn::tensor::DType::BF16,
        5e-2,
    );
}
