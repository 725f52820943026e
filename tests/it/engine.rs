//! The decode engine: continuous batching over fixed slots against generating each request alone
//! (the generator over the ragged forward). More requests than slots, of different lengths and
//! budgets, greedy and sampled mixed, so sequences join a running batch mid-way and reuse slots
//! freed by others; every request must produce exactly its single-sequence tokens and stop reason.
//! Host (Flex) and wgpu run in CI (eagerly: no graphs there); CUDA, graphs on and off, is
//! `#[ignore]`d without a GPU. (Device memory over many steps: `tests/memory.rs`.)

use crate::common::*;
use burn::tensor::{DType, Device};
use nemotron::loader::synth::{Geometry, SynthRecipe};
use nemotron::model::{
    Engine, EngineOptions, Event, GenerateOptions, KvCacheDtype, NemotronH, RequestId, Sampling,
    SsmCacheDtype, StopReason,
};
use std::collections::BTreeMap;

fn requests(v: usize) -> Vec<(Vec<u32>, GenerateOptions)> {
    let sampled = |seed| Sampling {
        temperature: 0.9,
        top_k: 30,
        top_p: 0.95,
        seed,
        ..Sampling::greedy()
    };
    let penalized = Sampling {
        repetition_penalty: 3.0,
        ..Sampling::greedy()
    };
    let o = |n: usize, s: Sampling| GenerateOptions {
        max_new_tokens: n,
        sampling: s,
        stop_ids: vec![2],
        ..Default::default()
    };
    vec![
        (ids(7, v, 1), o(9, Sampling::greedy())),
        (ids(3, v, 2), o(4, sampled(5))),
        (ids(12, v, 3), o(12, Sampling::greedy())),
        (ids(5, v, 4), o(6, sampled(9))),
        (ids(9, v, 5), o(0, Sampling::greedy())),
        (ids(4, v, 6), o(7, Sampling::greedy())),
        // Request 2's prompt, greedy with a repetition penalty (its greedy answer repeats token
        // 0): not plain greedy, so picked on the host with the penalty (the device's argmax
        // would ignore it).
        (ids(12, v, 3), o(12, penalized)),
    ]
}

type Got = BTreeMap<usize, (Vec<u32>, Option<StopReason>)>;

/// Records each event into `got` by the request's index in `ids` (no event after a stop).
fn recorder<'a>(ids: &'a [RequestId], got: &'a mut Got) -> impl FnMut(Event) + 'a {
    move |ev: Event| {
        let i = ids.iter().position(|&id| id == ev.id).unwrap();
        let entry = got.entry(i).or_default();
        assert!(
            entry.1.is_none(),
            "request {i} got an event after it stopped"
        );
        entry.0.extend(ev.token);
        entry.1 = ev.stop;
    }
}

/// Every request's tokens and stop reason equal its single-sequence generation.
fn assert_alone(m: &NemotronH, reqs: &[(Vec<u32>, GenerateOptions)], got: &Got) {
    for (i, (p, o)) in reqs.iter().enumerate() {
        let single = m.generate(p, o.clone(), |_| {}).unwrap();
        let (tokens, stop) = got.get(&i).cloned().unwrap_or_default();
        assert_eq!(tokens, single.tokens, "request {i}: tokens");
        assert_eq!(stop, Some(single.stop), "request {i}: stop reason");
    }
}

fn check(dev: Device, dtype: DType, graphs: bool) {
    check_slots(
        dev,
        dtype,
        graphs,
        2,
        KvCacheDtype::Auto,
        SsmCacheDtype::F32,
    );
}

/// With `slots` slots: 2 admits one greedy and one sampled request at first and then one at a
/// time; 4 admits two greedy requests (and two sampled) in one prefill. With `kv` FP8 both the
/// engine and the single sequences (the generator decodes through a slot too) hold E4M3 codes;
/// with `ssm` bf16, both hold the SSM state in bf16.
fn check_slots(
    dev: Device,
    dtype: DType,
    graphs: bool,
    slots: usize,
    kv: KvCacheDtype,
    ssm: SsmCacheDtype,
) {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 23);
    let m = NemotronH::load_as(dir.path(), &dev, dtype)
        .and_then(|m| m.with_kv_cache(kv))
        .and_then(|m| m.with_ssm_cache(ssm))
        .unwrap();
    let reqs = requests(m.config().vocab_size);
    let mut opts = EngineOptions::new(slots, 32);
    opts.graphs = graphs;
    let mut e = Engine::new(&m, opts).unwrap();
    let ids: Vec<_> = reqs
        .iter()
        .map(|(p, o)| e.submit(p, o.clone()).unwrap())
        .collect();
    let mut got = Got::new();
    e.run(recorder(&ids, &mut got)).unwrap();
    assert_alone(&m, &reqs, &got);
    // The penalty must show: with it ignored (`is_plain_greedy` true for it) the engine and the
    // single sequence would both give request 2's tokens. (Over the FP8 cache request 2's greedy
    // tokens happen to repeat nothing the penalty would touch, so it moves none there.)
    assert!(
        kv == KvCacheDtype::Fp8 || got.get(&6).map(|g| &g.0) != got.get(&2).map(|g| &g.0),
        "the repetition penalty changed no token"
    );
    assert!(e.steps() > 0);
    if graphs {
        assert!(!e.captured().is_empty(), "no decode step was captured");
    }
}

#[test]
fn host_engine_equals_single_sequences() {
    check(host(), DType::F32, false);
}

/// Several greedy requests admitted by one prefill each take their own row's argmax.
#[test]
fn host_engine_admitting_four_equals_single_sequences() {
    check_slots(
        host(),
        DType::F32,
        false,
        4,
        KvCacheDtype::Auto,
        SsmCacheDtype::F32,
    );
}

#[test]
fn host_engine_over_an_fp8_kv_cache_equals_single_sequences() {
    check_slots(
        host(),
        DType::F32,
        false,
        4,
        KvCacheDtype::Fp8,
        SsmCacheDtype::F32,
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_engine_over_an_fp8_kv_cache_equals_single_sequences() {
    check_slots(
        Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
        DType::F32,
        false,
        2,
        KvCacheDtype::Fp8,
        SsmCacheDtype::F32,
    );
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_bf16_engine_over_an_fp8_kv_cache_with_graphs_equals_single_sequences() {
    check_slots(
        Device::cuda(0),
        DType::BF16,
        true,
        4,
        KvCacheDtype::Fp8,
        SsmCacheDtype::F32,
    );
}

/// The bf16 SSM state in the engine: admitted in one prefill and stepped with the others, each
/// request takes the tokens it takes alone (the generator holds the same bf16 state).
#[test]
fn host_engine_over_a_bf16_ssm_state_equals_single_sequences() {
    check_slots(
        host(),
        DType::F32,
        false,
        4,
        KvCacheDtype::Auto,
        SsmCacheDtype::Bf16,
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_engine_over_a_bf16_ssm_state_equals_single_sequences() {
    check_slots(
        Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
        DType::F32,
        false,
        2,
        KvCacheDtype::Auto,
        SsmCacheDtype::Bf16,
    );
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_bf16_engine_over_a_bf16_ssm_state_with_graphs_equals_single_sequences() {
    check_slots(
        Device::cuda(0),
        DType::BF16,
        true,
        4,
        KvCacheDtype::Auto,
        SsmCacheDtype::Bf16,
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_engine_equals_single_sequences() {
    check(
        Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
        DType::F32,
        false,
    );
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_f32_engine_with_graphs_equals_single_sequences() {
    check(Device::cuda(0), DType::F32, true);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_f32_engine_without_graphs_equals_single_sequences() {
    check(Device::cuda(0), DType::F32, false);
}

/// Slots sized from a memory budget: the budget for `slots` slots and a half (each
/// [`NemotronH::slot_bytes`]) gives `slots`, and `slots + 4` short requests (greedy and sampled,
/// different lengths) fill every slot at once, wait for freed ones, and each give exactly their
/// single-sequence tokens and stop.
fn check_many(dev: Device, dtype: DType, graphs: bool, slots: usize) {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 23);
    let m = NemotronH::load_as(dir.path(), &dev, dtype).unwrap();
    let cap = 16;
    let per = m.slot_bytes(cap) as u64;
    let mut opts = EngineOptions::for_memory(&m, per * slots as u64 + per / 2, cap).unwrap();
    assert_eq!(opts.max_batch, slots);
    assert_eq!(opts.batch_sizes.last(), Some(&slots));
    opts.graphs = graphs;
    let v = m.config().vocab_size;
    let reqs: Vec<(Vec<u32>, GenerateOptions)> = (0..slots + 4)
        .map(|i| {
            let sampling = if i % 3 == 0 {
                Sampling {
                    temperature: 0.8,
                    seed: i as u64,
                    ..Sampling::greedy()
                }
            } else {
                Sampling::greedy()
            };
            let o = GenerateOptions {
                max_new_tokens: 1 + i % 4,
                sampling,
                ..Default::default()
            };
            (ids(2 + i % 5, v, 100 + i as u64), o)
        })
        .collect();
    let mut e = Engine::new(&m, opts).unwrap();
    assert_eq!(e.slots().slots(), slots);
    assert_eq!(e.slots().bytes() as u64, per * slots as u64);
    let ids: Vec<_> = reqs
        .iter()
        .map(|(p, o)| e.submit(p, o.clone()).unwrap())
        .collect();
    let mut got = Got::new();
    e.run(recorder(&ids, &mut got)).unwrap();
    assert_alone(&m, &reqs, &got);
}

#[test]
fn host_engine_with_256_slots_from_a_memory_budget_equals_single_sequences() {
    check_many(host(), DType::F32, false, 256);
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_engine_with_128_slots_from_a_memory_budget_equals_single_sequences() {
    check_many(
        Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
        DType::F32,
        false,
        128,
    );
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_f32_engine_with_256_slots_and_graphs_equals_single_sequences() {
    check_many(Device::cuda(0), DType::F32, true, 256);
}

/// The slot size is what the slots take: every layer's pools (from their tensors' shapes) and
/// the length, and a budget below one slot is refused naming both sizes.
#[test]
fn slot_bytes_are_what_the_slots_take() {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 23);
    for dtype in [DType::F32, DType::BF16] {
        let m = NemotronH::load_as(dir.path(), &host(), dtype).unwrap();
        for (slots, cap) in [(1, 1), (3, 17), (5, 64)] {
            let st = m.new_slots(slots, cap).unwrap();
            assert_eq!(
                st.bytes(),
                slots * m.slot_bytes(cap),
                "{dtype:?} {slots} × {cap}"
            );
        }
        let per = m.slot_bytes(8) as u64;
        let err = EngineOptions::for_memory(&m, per - 1, 8)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&(per - 1).to_string()) && err.contains(&per.to_string()),
            "{err}"
        );
        let big = EngineOptions::for_memory(&m, u64::MAX, 8).unwrap();
        assert_eq!(big.max_batch, nemotron::model::MAX_SLOTS);
        assert_eq!(&big.batch_sizes[big.batch_sizes.len() - 2..], &[128, 256]);
    }
}

/// Slot memory as a user writes it: sizes with their units, fractions of the free memory, and
/// everything else refused with the forms it takes; a fraction on the host (no device size) is
/// refused naming the size form.
#[test]
fn slot_memory_parses_sizes_and_fractions() {
    use nemotron::model::SlotMemory;
    let ok = |s: &str| s.parse::<SlotMemory>().unwrap();
    assert_eq!(ok("24GiB"), SlotMemory::Bytes(24 << 30));
    assert_eq!(ok("512 MiB"), SlotMemory::Bytes(512 << 20));
    assert_eq!(ok("1.5GB"), SlotMemory::Bytes(1_500_000_000));
    assert_eq!(ok("3KB"), SlotMemory::Bytes(3_000));
    assert_eq!(ok("2KiB"), SlotMemory::Bytes(2_048));
    assert_eq!(ok("1000B"), SlotMemory::Bytes(1_000));
    assert_eq!(ok("0.9"), SlotMemory::Fraction(0.9));
    assert_eq!(ok("1.0"), SlotMemory::Fraction(1.0));
    for bad in [
        "", "24", "0.0", "1.5", "-1GiB", "0GiB", "GiB", "24TB", "nanGiB", "x0.5",
    ] {
        let err = bad.parse::<SlotMemory>().unwrap_err();
        assert!(
            err.contains("24GiB") && err.contains("0.9"),
            "{bad:?}: {err}"
        );
    }
    assert_eq!(SlotMemory::Bytes(77).budget(&host()).unwrap(), 77);
    let err = SlotMemory::Fraction(0.5)
        .budget(&host())
        .unwrap_err()
        .to_string();
    assert!(err.contains("give a size"), "{err}");
}

/// Chunked admission under a token budget (`step_tokens` 16 over 3 slots, pieces of at most 6
/// tokens): the requests of [`requests`] and a 40-token prompt, prefilled over several steps
/// beside the running sequences' decode (whole short prompts in the same steps as pieces of
/// long ones), each give exactly their single-sequence tokens and stop.
fn check_chunked(dev: Device, dtype: DType) {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 23);
    let m = NemotronH::load_as(dir.path(), &dev, dtype).unwrap();
    let v = m.config().vocab_size;
    let mut reqs = requests(v);
    reqs.insert(
        1,
        (
            ids(40, v, 8),
            GenerateOptions {
                max_new_tokens: 6,
                stop_ids: vec![2],
                ..Default::default()
            },
        ),
    );
    let mut opts = EngineOptions::new(3, 64);
    opts.graphs = false;
    opts.step_tokens = 16;
    opts.prefill_chunk = 6;
    let mut e = Engine::new(&m, opts).unwrap();
    let ids: Vec<_> = reqs
        .iter()
        .map(|(p, o)| e.submit(p, o.clone()).unwrap())
        .collect();
    let mut got = Got::new();
    let mut record = recorder(&ids, &mut got);
    let mut partial_steps = 0;
    while !e.is_idle() {
        partial_steps += usize::from(e.prefilling() > 0);
        e.step().unwrap().into_iter().for_each(&mut record);
    }
    drop(record);
    assert!(
        partial_steps >= 7,
        "the 40-token prompt ran in {partial_steps} partial steps"
    );
    assert_alone(&m, &reqs, &got);
}

#[test]
fn host_engine_chunked_admission_equals_single_sequences() {
    check_chunked(host(), DType::F32);
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_engine_chunked_admission_equals_single_sequences() {
    check_chunked(
        Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
        DType::F32,
    );
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run on the device machine with --ignored"]
fn cuda_f32_engine_chunked_admission_equals_single_sequences() {
    check_chunked(Device::cuda(0), DType::F32);
}

/// A long prompt arriving while a stream decodes (`step_tokens` 10, pieces of 8): the stream
/// takes a token in every step of the prompt's prefill, and both give their tokens alone.
#[test]
fn a_long_prompt_admitted_in_pieces_does_not_stall_a_stream() {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 23);
    let m = load_host(dir.path());
    let v = m.config().vocab_size;
    let o = |n| GenerateOptions {
        max_new_tokens: n,
        ..Default::default()
    };
    let (pa, pb) = (ids(5, v, 31), ids(60, v, 32));
    let mut opts = EngineOptions::new(2, 80);
    opts.graphs = false;
    opts.step_tokens = 10;
    opts.prefill_chunk = 8;
    let mut e = Engine::new(&m, opts).unwrap();
    let a = e.submit(&pa, o(24)).unwrap();
    let (mut ta, mut tb) = (vec![], vec![]);
    let mut a_live = true;
    let take = |evs: Vec<Event>, ta: &mut Vec<u32>, tb: &mut Vec<u32>| -> bool {
        let mut a_moved = false;
        for ev in evs {
            if ev.id == a {
                a_moved |= ev.token.is_some();
                ta.extend(ev.token);
            } else {
                tb.extend(ev.token);
            }
        }
        a_moved
    };
    for _ in 0..2 {
        let evs = e.step().unwrap();
        take(evs, &mut ta, &mut tb);
    }
    e.submit(&pb, o(4)).unwrap();
    let mut stalled = 0;
    let mut pieces = 0;
    while !e.is_idle() {
        let before = e.prefilling() > 0 || e.waiting() > 0;
        let evs = e.step().unwrap();
        let a_stopped = evs.iter().any(|ev| ev.id == a && ev.stop.is_some());
        let moved = take(evs, &mut ta, &mut tb);
        if before && a_live {
            pieces += 1;
            stalled += usize::from(!moved);
        }
        a_live &= !a_stopped;
    }
    assert!(
        pieces >= 7,
        "the 60-token prompt ran in {pieces} steps beside the stream"
    );
    assert_eq!(
        stalled, 0,
        "the stream took no token in {stalled} of {pieces} steps"
    );
    assert_eq!(
        ta,
        m.generate(&pa, o(24), |_| {}).unwrap().tokens,
        "the stream"
    );
    assert_eq!(
        tb,
        m.generate(&pb, o(4), |_| {}).unwrap().tokens,
        "the long prompt"
    );
}

#[test]
fn a_request_larger_than_a_slot_is_refused_naming_both_numbers() {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 23);
    let m = load_host(dir.path());
    let mut e = Engine::new(&m, EngineOptions::new(2, 16)).unwrap();
    let o = GenerateOptions {
        max_new_tokens: 10,
        ..Default::default()
    };
    let err = e.submit(&ids(8, 256, 1), o).unwrap_err().to_string();
    assert!(err.contains("17") && err.contains("16"), "{err}");
    assert!(e.is_idle(), "a refused request must not be queued");
    let fits = GenerateOptions {
        max_new_tokens: 9,
        ..Default::default()
    };
    e.submit(&ids(8, 256, 1), fits).unwrap();
}

/// A request cancelled mid-decode frees its slot at once: the waiting request admitted into it
/// and the one still running decode exactly their single-sequence tokens; a cancelled waiting
/// request never runs; neither produces an event after its cancellation.
#[test]
fn a_cancelled_request_frees_its_slot_for_the_next() {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 23);
    let m = load_host(dir.path());
    let v = m.config().vocab_size;
    let o = |n| GenerateOptions {
        max_new_tokens: n,
        ..Default::default()
    };
    let mut e = Engine::new(&m, EngineOptions::new(2, 32)).unwrap();
    let a = e.submit(&ids(6, v, 1), o(20)).unwrap();
    let b = e.submit(&ids(5, v, 2), o(8)).unwrap();
    let c = e.submit(&ids(7, v, 3), o(6)).unwrap();
    let d = e.submit(&ids(4, v, 4), o(6)).unwrap();
    let mut got: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for _ in 0..3 {
        for ev in e.step().unwrap() {
            got.entry(ev.id.0).or_default().extend(ev.token);
        }
    }
    assert_eq!((e.running(), e.waiting()), (2, 2));
    assert!(e.cancel(a), "a was running");
    assert!(e.cancel(d), "d was waiting");
    assert!(!e.cancel(d), "d is gone already");
    assert_eq!((e.running(), e.waiting()), (1, 1));
    // The freed slot takes the waiting request at the very next step (b is far from done).
    for ev in e.step().unwrap() {
        got.entry(ev.id.0).or_default().extend(ev.token);
    }
    assert_eq!(
        (e.running(), e.waiting()),
        (2, 0),
        "the cancelled request's slot was not reused at once"
    );
    e.run(|ev| {
        assert!(ev.id != a && ev.id != d, "an event after cancellation");
        got.entry(ev.id.0).or_default().extend(ev.token);
    })
    .unwrap();
    // Three steps: the prefill token and one decoded token per step.
    assert_eq!(got[&a.0].len(), 4, "a decoded until it was cancelled");
    assert!(!got.contains_key(&d.0), "a cancelled waiting request ran");
    for (id, p, n) in [(b, ids(5, v, 2), 8), (c, ids(7, v, 3), 6)] {
        let alone = m.generate(&p, o(n), |_| {}).unwrap();
        assert_eq!(got[&id.0], alone.tokens, "request {id:?}");
    }
}

/// Log-probabilities (`GenerateOptions::logprobs`) against the model's own logits: each
/// produced token's value equals a log-softmax (written out here in f64) of the teacher-forced
/// forward over the prompt and the tokens before it, its top entries are the `n` most likely in
/// order, and the generator returns the same values as the engine. A greedy request (whose rows
/// the engine otherwise leaves on the device) and a sampled one; more than 20 is refused by name.
#[test]
fn host_engine_logprobs_are_the_teacher_forced_log_softmax() {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 23);
    let m = load_host(dir.path());
    let v = m.config().vocab_size;
    let sampled = Sampling {
        temperature: 0.9,
        seed: 3,
        ..Sampling::greedy()
    };
    let reqs = [
        (ids(6, v, 1), Sampling::greedy(), 5usize),
        (ids(4, v, 2), sampled, 3),
    ];
    let o = |s: &Sampling, n: usize| GenerateOptions {
        max_new_tokens: 5,
        sampling: s.clone(),
        logprobs: Some(n),
        ..Default::default()
    };
    let mut e = Engine::new(&m, EngineOptions::new(2, 32)).unwrap();
    let ids_: Vec<_> = reqs
        .iter()
        .map(|(p, s, n)| e.submit(p, o(s, *n)).unwrap())
        .collect();
    let mut got: BTreeMap<usize, Vec<(u32, nemotron::model::TokenLogprobs)>> = BTreeMap::new();
    e.run(|ev: Event| {
        let i = ids_.iter().position(|&id| id == ev.id).unwrap();
        if let Some(t) = ev.token {
            let lp = ev
                .logprobs
                .expect("a token asked with logprobs carries them");
            got.entry(i).or_default().push((t, lp));
        }
    })
    .unwrap();
    for (i, (p, s, n)) in reqs.iter().enumerate() {
        let toks = &got[&i];
        assert_eq!(toks.len(), 5, "request {i}");
        // The teacher-forced logits over the prompt and every produced token but the last.
        let mut seq = p.clone();
        seq.extend(toks[..toks.len() - 1].iter().map(|t| t.0));
        let mut st = m.new_state();
        let logits = m.forward(&[&seq], &mut [&mut st]).unwrap();
        let rows: Vec<f32> = logits.into_data().convert::<f32>().into_vec().unwrap();
        for (j, (tok, lp)) in toks.iter().enumerate() {
            assert_eq!(lp.token, *tok);
            let at = p.len() - 1 + j;
            let row = &rows[at * v..(at + 1) * v];
            let z: f64 = row.iter().map(|&x| (x as f64).exp()).sum();
            let want = |t: u32| ((row[t as usize] as f64).exp() / z).ln();
            assert!(
                (lp.logprob as f64 - want(*tok)).abs() < 1e-4,
                "request {i} token {j}: {} against {}",
                lp.logprob,
                want(*tok)
            );
            let mut order: Vec<u32> = (0..v as u32).collect();
            order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
            let top: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
            assert_eq!(top, order[..*n], "request {i} token {j}: top ids");
            for &(t, l) in &lp.top {
                assert!((l as f64 - want(t)).abs() < 1e-4, "request {i} top {t}");
            }
        }
        // The streaming generator: the same tokens and values.
        let mut g = m.generator(p, o(s, *n)).unwrap();
        for (j, (tok, lp)) in toks.iter().enumerate() {
            assert_eq!(g.next().unwrap().unwrap(), *tok, "request {i} token {j}");
            let glp = g.last_logprobs().expect("the generator keeps them");
            assert!(
                (glp.logprob - lp.logprob).abs() < 1e-4,
                "request {i} token {j}"
            );
            assert_eq!(
                glp.top.iter().map(|t| t.0).collect::<Vec<_>>(),
                lp.top.iter().map(|t| t.0).collect::<Vec<_>>()
            );
        }
    }
    let err = e
        .submit(&ids(4, v, 2), o(&Sampling::greedy(), 21))
        .unwrap_err()
        .to_string();
    assert!(err.contains("logprobs") && err.contains("21"), "{err}");
}

/// Prompt scoring (`prompt_logprobs`, what `echo` with `max_tokens: 0` answers) against each
/// prefix run alone: token `i + 1`'s value is a log-softmax (written out here in f64) of the
/// last logits row of a fresh forward over tokens `0..=i` — another path than the one-shot
/// forward the function takes — its top entries the `n` most likely in order (computed by
/// `logprob_rows` over all 69 positions at once). One token gives no entries; an empty prompt,
/// a token past the vocabulary and more than 20 are refused by name.
#[test]
fn host_prompt_logprobs_are_each_prefix_log_softmax() {
    use nemotron::model::prompt_logprobs;
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 29);
    let m = load_host(dir.path());
    let v = m.config().vocab_size;
    let (p, n) = (ids(70, v, 4), 4usize);
    let got = prompt_logprobs(&m, &p, n).unwrap();
    assert_eq!(got.len(), p.len() - 1);
    for (i, lp) in got.iter().enumerate() {
        let tok = p[i + 1];
        assert_eq!(lp.token, tok, "entry {i}");
        let mut st = m.new_state();
        let row: Vec<f32> = m
            .forward_last(&[&p[..=i]], &mut [&mut st])
            .unwrap()
            .into_data()
            .convert::<f32>()
            .into_vec()
            .unwrap();
        let z: f64 = row.iter().map(|&x| (x as f64).exp()).sum();
        let want = |t: u32| ((row[t as usize] as f64).exp() / z).ln();
        assert!(
            (lp.logprob as f64 - want(tok)).abs() < 1e-4,
            "entry {i}: {} against {}",
            lp.logprob,
            want(tok)
        );
        let mut order: Vec<u32> = (0..v as u32).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        let top: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(top, order[..n], "entry {i}: top ids");
    }
    assert!(prompt_logprobs(&m, &p[..1], n).unwrap().is_empty());
    let e = prompt_logprobs(&m, &[], n).unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");
    let e = prompt_logprobs(&m, &p, 21).unwrap_err().to_string();
    assert!(e.contains("logprobs") && e.contains("20"), "{e}");
    let e = prompt_logprobs(&m, &[1, 2, v as u32], n)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("vocabulary") && e.contains(&v.to_string()),
        "{e}"
    );
}
