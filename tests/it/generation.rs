//! Generation and the text layer: greedy == the parity path's argmax, seeded sampling is
//! reproducible and respects top-k / top-p / min-p (distribution checks), stop ids stop, streaming
//! concatenates to the full decode without broken characters, the chat template renders as
//! expected, batch generation equals single, and every user error is one line.

use crate::common::*;
use nemotron::loader::synth::{Geometry, SynthRecipe};
use nemotron::model::sampling::{filtered_probs, pick};
use nemotron::{
    BackendKind, ChatTemplate, DType, Error, GenerateOptions, Message, NemotronH, Sampling,
    StopReason, TextModel, TokenStream, Tokenizer,
};

fn model() -> (tempfile::TempDir, NemotronH) {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 21);
    let m = load_host(dir.path());
    (dir, m)
}

fn opts(n: usize, s: Sampling) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        sampling: s,
        ..Default::default()
    }
}

#[test]
fn greedy_generation_equals_the_parity_path_argmax() {
    let (_d, m) = model();
    let prompt = ids(9, 256, 3);
    let g = m
        .generate(&prompt, opts(20, Sampling::greedy()), |_| {})
        .unwrap();
    assert_eq!(g.tokens.len(), 20);
    assert_eq!(g.stop, StopReason::MaxTokens);
    // The parity path: one prefill, then teacher-forced single steps with the same tokens.
    let mut s = m.new_state();
    let mut want = vec![nemotron::model::sampling::argmax(
        &nemotron::model::generate::last_row(m.forward_one(&prompt, &mut s).unwrap()),
    )];
    for &t in &g.tokens[..19] {
        want.push(nemotron::model::sampling::argmax(&rows(
            m.forward_one(&[t], &mut s).unwrap(),
        )));
    }
    assert_eq!(g.tokens, want);
}

#[test]
fn seeded_sampling_is_reproducible() {
    let (_d, m) = model();
    let s = |seed| Sampling {
        temperature: 1.5,
        top_k: 50,
        top_p: 0.95,
        seed,
        ..Sampling::greedy()
    };
    let a = m.generate(&[5, 6, 7], opts(24, s(7)), |_| {}).unwrap();
    let b = m.generate(&[5, 6, 7], opts(24, s(7)), |_| {}).unwrap();
    let c = m.generate(&[5, 6, 7], opts(24, s(8)), |_| {}).unwrap();
    assert_eq!(a, b);
    assert_ne!(
        a.tokens, c.tokens,
        "another seed should give another sample"
    );
}

/// Empirical frequencies of `pick` against the filtered distribution, over many draws.
fn check_distribution(logits: &[f32], s: &Sampling, allowed: &[u32]) {
    let probs = filtered_probs(logits, s);
    let ids: Vec<u32> = probs.iter().map(|p| p.0).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, allowed, "support of the filtered distribution");
    let n = 40_000;
    let mut counts = vec![0usize; logits.len()];
    let mut rng = s.seed;
    for _ in 0..n {
        counts[pick(logits, s, &[], &mut rng) as usize] += 1;
    }
    for (i, &c) in counts.iter().enumerate() {
        let want = probs.iter().find(|p| p.0 == i as u32).map_or(0.0, |p| p.1);
        let got = c as f32 / n as f32;
        assert!(
            (got - want).abs() < 0.012,
            "token {i}: frequency {got} vs probability {want} ({s:?})"
        );
        if want == 0.0 {
            assert_eq!(c, 0, "token {i} is outside the allowed set but was drawn");
        }
    }
}

#[test]
fn top_k_top_p_min_p_shape_the_distribution() {
    // Softmax of these at temperature 1: ≈ [0.411, 0.249, 0.151, 0.092, 0.056, 0.034, 0.008].
    let logits = [2.0f32, 1.5, 1.0, 0.5, 0.0, -0.5, -2.0];
    let base = Sampling {
        temperature: 1.0,
        seed: 3,
        ..Sampling::greedy()
    };
    check_distribution(&logits, &base, &[0, 1, 2, 3, 4, 5, 6]);
    check_distribution(
        &logits,
        &Sampling {
            top_k: 3,
            ..base.clone()
        },
        &[0, 1, 2],
    );
    // 0.411 + 0.249 = 0.66 < 0.7 ≤ 0.81: the nucleus is the top three.
    check_distribution(
        &logits,
        &Sampling {
            top_p: 0.7,
            ..base.clone()
        },
        &[0, 1, 2],
    );
    // min_p 0.2 keeps p ≥ 0.082: the top four.
    check_distribution(
        &logits,
        &Sampling {
            min_p: 0.2,
            ..base.clone()
        },
        &[0, 1, 2, 3],
    );
    // Temperature sharpens: at 0.5 the top token has p = e⁴ / Σ ≈ 0.6336.
    let p = filtered_probs(
        &logits,
        &Sampling {
            temperature: 0.5,
            ..base.clone()
        },
    );
    assert!((p[0].1 - 0.6336).abs() < 1e-3, "{p:?}");
}

/// `pick`'s uniform draws are SplitMix64's stream (Vigna's `splitmix64.c`): from state 0 its
/// first outputs are `e220a8397b1dcdaf`, `6e789e6aa1b965f4`, `06c45d188009454f`,
/// `f88bb8a8724c81ec`, `1b39896a51a8749b` (the published reference values). Over 256 equally
/// likely tokens each draw picks token `output >> 56` (the probabilities `1/256` and their
/// running sums are exact in f32), so the picks pin the generator bit for bit in their top byte.
#[test]
fn sampling_draws_follow_splitmix64() {
    let logits = [0.5f32; 256];
    let s = Sampling {
        temperature: 1.0,
        ..Sampling::greedy()
    };
    let mut rng = 0u64;
    let got: Vec<u32> = (0..5).map(|_| pick(&logits, &s, &[], &mut rng)).collect();
    assert_eq!(got, [0xe2, 0x6e, 0x06, 0xf8, 0x1b]);
}

/// Logits far from 0 at a low temperature: the softmax is taken relative to the largest logit,
/// so nothing overflows (1000 / 0.05 alone would be `exp(20000)`), and the distribution is the
/// exact one: `p₁ / p₀ = e^(−1 / 0.05) = e^−20`.
#[test]
fn large_logits_at_low_temperature_stay_finite() {
    let logits = [999.0f32, 1000.0, -1000.0];
    let s = Sampling {
        temperature: 0.05,
        ..Sampling::greedy()
    };
    let p = filtered_probs(&logits, &s);
    assert!(p.iter().all(|x| x.1.is_finite()), "{p:?}");
    assert_eq!(p[0].0, 1, "{p:?}");
    assert!((p[0].1 - 1.0).abs() < 1e-6, "{p:?}");
    assert!((p[1].1 / (-20.0f32).exp() - 1.0).abs() < 1e-3, "{p:?}");
}

/// `top_p` is a probability mass in (0, 1]: 0 keeps nothing and is refused by name, 1 keeps all.
#[test]
fn top_p_of_zero_is_refused_and_one_accepted() {
    let s = |top_p| Sampling {
        temperature: 1.0,
        top_p,
        ..Sampling::greedy()
    };
    let e = s(0.0).validate().unwrap_err().to_string();
    assert!(e.contains("top_p 0"), "{e}");
    assert!(s(1.0).validate().is_ok());
    assert!(s(1.5).validate().is_err());
}

/// Temperature: finite and at least 0; repetition penalty: finite and above 0 (each bound seen
/// red under its mutant: `&&` as `||`, `>` as `>=`).
#[test]
fn temperature_and_repetition_penalty_bounds_are_checked() {
    let t = |temperature| Sampling {
        temperature,
        ..Sampling::greedy()
    };
    let r = |repetition_penalty| Sampling {
        repetition_penalty,
        ..Sampling::greedy()
    };
    for bad in [-0.5, f32::INFINITY, f32::NAN] {
        let e = t(bad).validate().unwrap_err().to_string();
        assert!(e.contains("temperature"), "{e}");
    }
    assert!(t(0.0).validate().is_ok() && t(2.0).validate().is_ok());
    for bad in [0.0, -1.0, f32::INFINITY, f32::NAN] {
        let e = r(bad).validate().unwrap_err().to_string();
        assert!(e.contains("repetition_penalty"), "{e}");
    }
    assert!(r(1.0).validate().is_ok() && r(0.5).validate().is_ok());
}

/// Greedy picks the first of equal largest logits.
#[test]
fn greedy_picks_the_first_of_tied_logits() {
    assert_eq!(nemotron::model::sampling::argmax(&[1.0, 3.0, 3.0, -2.0]), 1);
    let mut rng = 0;
    assert_eq!(pick(&[0.5, 0.5], &Sampling::greedy(), &[], &mut rng), 0);
}

#[test]
fn repetition_penalty_follows_hf() {
    let logits = [2.0f32, 1.9, -1.0, -1.1];
    let s = Sampling {
        repetition_penalty: 2.0,
        ..Sampling::greedy()
    };
    let mut rng = 0;
    // Token 0 was seen: 2.0 / 2 = 1.0 < 1.9, so greedy picks 1.
    assert_eq!(pick(&logits, &s, &[0], &mut rng), 1);
    assert_eq!(pick(&logits, &Sampling::greedy(), &[0], &mut rng), 0);
    // Negative logits are multiplied: the seen token 0 drops from −1.0 to −2.0, below −1.05.
    let l2 = [-1.0f32, -1.05];
    assert_eq!(pick(&l2, &s, &[0], &mut rng), 1);
    // Divided, not reduced modulo: 3.0 / 1.2 = 2.5 stays above 2.0 (3.0 % 1.2 = 0.6 would not).
    let s12 = Sampling {
        repetition_penalty: 1.2,
        ..Sampling::greedy()
    };
    assert_eq!(pick(&[3.0, 2.0], &s12, &[0], &mut rng), 0);
}

#[test]
fn stop_ids_stop_generation() {
    let (_d, m) = model();
    let prompt = [9, 8, 7, 6];
    let free = m
        .generate(&prompt, opts(12, Sampling::greedy()), |_| {})
        .unwrap();
    let stop = free.tokens[3];
    let first = free.tokens.iter().position(|&t| t == stop).unwrap();
    let o = GenerateOptions {
        stop_ids: vec![stop],
        ..opts(12, Sampling::greedy())
    };
    let g = m.generate(&prompt, o, |_| {}).unwrap();
    assert_eq!(g.tokens, free.tokens[..=first].to_vec());
    assert_eq!(g.stop, StopReason::Stop(stop));
}

#[test]
fn prompt_longer_than_the_context_is_refused() {
    let (_d, m) = model();
    let o = GenerateOptions {
        max_context: Some(4),
        ..opts(4, Sampling::greedy())
    };
    let e = m
        .generate(&[1, 2, 3, 4, 5], o.clone(), |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("5 tokens") && e.contains("sized for 4"), "{e}");
    // At the limit, generation stops when the sequence fills the context.
    let g = m.generate(&[1, 2, 3], o, |_| {}).unwrap();
    assert_eq!((g.tokens.len(), g.stop), (1, StopReason::ContextFull));
}

#[test]
fn batch_generation_equals_single() {
    let (_d, m) = model();
    let prompts = vec![ids(7, 256, 1), ids(3, 256, 2), ids(12, 256, 3)];
    for s in [
        Sampling::greedy(),
        Sampling {
            temperature: 1.0,
            top_k: 20,
            seed: 40,
            ..Sampling::greedy()
        },
    ] {
        let o = GenerateOptions {
            stop_ids: vec![2],
            ..opts(10, s.clone())
        };
        let mut streamed = vec![vec![]; 3];
        let batch = m
            .generate_batch(&prompts, o.clone(), |i, t| streamed[i].push(t))
            .unwrap();
        for (i, p) in prompts.iter().enumerate() {
            let mut oi = o.clone();
            oi.sampling.seed = s.seed + i as u64;
            let single = m.generate(p, oi, |_| {}).unwrap();
            assert_eq!(batch[i], single, "sequence {i} with {s:?}");
            assert_eq!(streamed[i], single.tokens);
        }
    }
}

#[test]
fn streaming_never_breaks_a_character_and_concatenates_to_the_decode() {
    let dir = tempfile::tempdir().unwrap();
    add_text_files(dir.path(), 4);
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let text = "héllo wörld 🎉 — ok ✓";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(ids.len(), text.len(), "one token per byte");
    let mut st = TokenStream::new(&tok);
    let mut pieces = vec![];
    for &i in &ids {
        if let Some(p) = st.push(i).unwrap() {
            assert!(
                !p.contains('\u{FFFD}'),
                "piece {p:?} holds a broken character"
            );
            pieces.push(p);
        }
    }
    pieces.extend(st.finish().unwrap());
    assert_eq!(pieces.concat(), text);
    assert_eq!(tok.decode(&ids).unwrap(), text);
    assert!(
        pieces.iter().any(|p| p == "🎉"),
        "the 4-byte emoji is released whole: {pieces:?}"
    );
}

#[test]
fn text_generation_streams_the_decode_of_its_tokens() {
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 21);
    add_text_files(dir.path(), 4);
    let tm = TextModel::load(dir.path(), &host(), burn::tensor::DType::F32).unwrap();
    assert_eq!(tm.defaults.eos_token_ids, vec![2, 4]);
    let prompt = tm
        .chat_prompt(Some("Be brief."), "Hi", Some(false))
        .unwrap();
    let mut streamed = String::new();
    let r = tm
        .generate_text(&prompt, tm.default_options(40), |p| streamed.push_str(p))
        .unwrap();
    assert_eq!(streamed, r.text);
    assert_eq!(r.text, tm.tokenizer.decode(&r.tokens).unwrap());
    assert!(matches!(
        r.stop,
        StopReason::Stop(2) | StopReason::Stop(4) | StopReason::MaxTokens
    ));
    if let StopReason::Stop(id) = r.stop {
        assert_eq!(*r.tokens.last().unwrap(), id);
    }
    // The chat prompt's special tokens were encoded as single ids, not added again.
    let ids = tm.tokenizer.encode(&prompt, false).unwrap();
    assert_eq!(r.prompt_tokens, ids.len());
    assert_eq!(ids[0], 3, "<|im_start|> is one token");
}

#[test]
fn chat_template_renders_the_expected_prompt() {
    let t = ChatTemplate {
        source: CHAT_TEMPLATE.into(),
        bos_token: "<s>".into(),
        eos_token: "</s>".into(),
    };
    let msgs = [
        Message::new("system", "  Be brief. "),
        Message::new("user", "Why?"),
    ];
    let off = t.render(&msgs, Some(false)).unwrap();
    assert_eq!(off, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n<think></think>");
    let on = t.render(&msgs, Some(true)).unwrap();
    assert!(on.ends_with("<|im_start|>assistant\n<think>\n"), "{on:?}");
    assert_eq!(
        t.render(&msgs, None).unwrap(),
        on,
        "the template's default is reasoning on"
    );
    let user_only = t.render(&[Message::new("user", "x")], None).unwrap();
    assert!(user_only.starts_with("<|im_start|>user\nx<|im_end|>"));
}

/// A hostile template is stopped: one that loops without end runs out of its instruction budget,
/// one that builds a huge prompt hits the output limit — each a one-line error, quickly.
#[test]
fn hostile_templates_are_stopped() {
    let base = ChatTemplate {
        source: String::new(),
        bos_token: String::new(),
        eos_token: String::new(),
    };
    let cases = [
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
            "budget",
        ),
        ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "MiB"),
    ];
    for (source, says) in cases {
        let t = ChatTemplate {
            source: source.into(),
            ..base.clone()
        };
        let t0 = std::time::Instant::now();
        let e = t
            .render(&[Message::new("user", "x")], None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("chat template:") && e.contains(says) && !e.contains('\n'),
            "{source}: {e}"
        );
        assert!(
            t0.elapsed().as_secs() < 20,
            "{source}: took {:?}",
            t0.elapsed()
        );
    }
}

#[test]
fn template_errors_are_one_line() {
    let t = ChatTemplate {
        source: CHAT_TEMPLATE.into(),
        bos_token: String::new(),
        eos_token: String::new(),
    };
    let e = t
        .render(&[Message::new("tool", "x")], None)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("chat template:") && e.contains("unknown role tool") && !e.contains('\n'),
        "{e}"
    );
    let broken = ChatTemplate {
        source: "{% for m in messages %}{{ m.content }".into(),
        ..t.clone()
    };
    let e = broken
        .render(&[Message::new("user", "x")], None)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("chat template:") && !e.contains('\n'), "{e}");
    let plain = ChatTemplate {
        source: "{{ messages[0].content }}".into(),
        ..t
    };
    assert!(matches!(
        plain.render(&[Message::new("user", "x")], Some(true)),
        Err(Error::NoReasoningSwitch)
    ));
}

#[test]
fn missing_tokenizer_is_named() {
    let dir = synth(SynthRecipe::Bf16, &Geometry::tiny(), 1);
    let e = TextModel::load(dir.path(), &host(), burn::tensor::DType::F32)
        .err()
        .expect("no tokenizer")
        .to_string();
    assert!(e.contains("tokenizer.json") && e.contains("missing"), "{e}");
}

/// A tokenizer whose ids run past the model's vocabulary is refused naming both sizes.
#[test]
fn tokenizer_larger_than_the_vocabulary_is_refused() {
    let dir = synth(SynthRecipe::Bf16, &Geometry::tiny(), 1);
    add_text_files(dir.path(), 4);
    let path = dir.path().join("tokenizer.json");
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let vocab = Geometry::tiny().vocab_size;
    tok["added_tokens"]
        .as_array_mut()
        .expect("the test tokenizer lists added tokens")
        // The tokenizers crate gives it the next free id (`vocab`), whatever id it names.
        .push(
            serde_json::json!({"id": vocab + 40, "content": "<extra>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
        );
    std::fs::write(&path, tok.to_string()).unwrap();
    let e = TextModel::load(dir.path(), &host(), burn::tensor::DType::F32)
        .err()
        .expect("a tokenizer past the vocabulary")
        .to_string();
    assert!(
        e.contains("tokenizer.json")
            && e.contains(&format!("run to {vocab}"))
            && e.contains(&format!("vocab_size (config.json) {vocab}")),
        "{e}"
    );
}

#[test]
fn no_chat_template_is_named() {
    let dir = synth(SynthRecipe::Bf16, &Geometry::tiny(), 1);
    add_text_files(dir.path(), 4);
    std::fs::write(dir.path().join("tokenizer_config.json"), "{}").unwrap();
    let tm = TextModel::load(dir.path(), &host(), burn::tensor::DType::F32).unwrap();
    let e = tm.chat_prompt(None, "x", None).unwrap_err().to_string();
    assert!(e.contains("no chat template"), "{e}");
}

#[test]
fn unknown_backend_or_dtype_is_named() {
    assert!(matches!("tpu".parse::<BackendKind>(), Err(Error::UnknownBackend(s)) if s == "tpu"));
    assert!(matches!("f8".parse::<DType>(), Err(Error::UnknownDtype(s)) if s == "f8"));
    assert_eq!(
        "ndarray".parse::<BackendKind>().unwrap(),
        BackendKind::NdArray
    );
    assert_eq!("flex".parse::<BackendKind>().unwrap(), BackendKind::Flex);
    assert_eq!("host".parse::<BackendKind>().unwrap(), BackendKind::Flex);
    let e = BackendKind::NdArray
        .check(DType::Bf16)
        .unwrap_err()
        .to_string();
    let l = e.to_lowercase();
    assert!(
        l.contains("bf16") && l.contains("ndarray") && l.contains("not available"),
        "{e}"
    );
}

/// The embedded default's byte tokenizer (`synth_text`): any UTF-8 text encodes to ids below the
/// tiny vocabulary and decodes back exactly; special tokens are single ids; the chat template's
/// reasoning switch changes the rendered prompt; the model loads with it and streams text.
#[test]
fn the_synthetic_byte_tokenizer_round_trips_text() {
    use nemotron::synth_text::{write_tiny_text_checkpoint, BYTE_VOCAB, IM_END_ID};
    let dir = tempfile::tempdir().unwrap();
    write_tiny_text_checkpoint(dir.path(), 2).unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert!(
        tok.id_bound() <= 256 && tok.id_bound() == BYTE_VOCAB,
        "{}",
        tok.id_bound()
    );
    for text in [
        "héllo, 世界 🙂\n\ttabs  and  spaces",
        "",
        " a",
        "\u{7f}\u{0}\u{10FFFF}",
    ] {
        let ids = tok.encode(text, false).unwrap();
        assert!(ids.iter().all(|&i| (i as usize) < BYTE_VOCAB));
        assert_eq!(ids.len(), text.len(), "one id per byte: {text:?}");
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
    assert_eq!(tok.encode("<|im_end|>", false).unwrap(), vec![IM_END_ID]);
    let tm = TextModel::load(dir.path(), &host(), burn::tensor::DType::F32).unwrap();
    let on = tm.chat_prompt(None, "hi", Some(true)).unwrap();
    let off = tm.chat_prompt(None, "hi", Some(false)).unwrap();
    assert_eq!(
        on,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    );
    assert!(off.ends_with("<think></think>"), "{off:?}");
    let opts = GenerateOptions {
        max_new_tokens: 8,
        ..Default::default()
    };
    let mut streamed = String::new();
    let out = tm
        .generate_text(&on, opts, |p| streamed.push_str(p))
        .unwrap();
    assert_eq!(streamed, out.text);
    assert_eq!(out.tokens.len(), 8);
}

/// A state that is not this model's — a layer short, two layers' states swapped, keys for
/// another position, a Mamba state of other shapes — is refused before any work, naming the
/// sequence, the layer and what it holds (the layers used to panic on it), and the state is left
/// as it was.
#[test]
fn a_state_not_of_this_model_is_refused_naming_the_layer() {
    use nemotron::model::cache::LayerState;
    let dir = synth(SynthRecipe::LightningMixed, &Geometry::tiny(), 5);
    let m = load_host(dir.path());
    let toks = ids(5, m.config().vocab_size, 3);
    let mut good = m.new_state();
    m.forward_one(&toks, &mut good).unwrap();
    let kind = |want: fn(&LayerState) -> bool| good.layers.iter().position(want).unwrap();
    let mamba = kind(|l| matches!(l, LayerState::Mamba { .. }));
    let attn = kind(|l| matches!(l, LayerState::Attention { .. }));
    let refused = |st: &mut nemotron::model::SequenceState| -> String {
        let before = st.position;
        let err = m.forward_one(&toks[..1], st).unwrap_err().to_string();
        assert_eq!(st.position, before, "{err}");
        err
    };

    let mut short = good.clone();
    short.layers.pop();
    let err = refused(&mut short);
    assert!(
        err.contains(&format!("has {} layers", m.layers().len() - 1)),
        "{err}"
    );

    let mut swapped = good.clone();
    swapped.layers.swap(mamba, attn);
    let err = refused(&mut swapped);
    let first = mamba.min(attn);
    assert!(err.contains(&format!("state 0, layer {first}:")), "{err}");
    assert!(err.contains("where the layer is"), "{err}");

    let mut moved = good.clone();
    moved.position += 1;
    let err = refused(&mut moved);
    assert!(
        err.contains(&format!("layer {attn}:")) && err.contains("position 6"),
        "{err}"
    );

    let mut reshaped = good.clone();
    if let LayerState::Mamba { conv, .. } = &mut reshaped.layers[mamba] {
        *conv = conv.clone().slice_dim(0, 0..1);
    }
    let err = refused(&mut reshaped);
    assert!(
        err.contains(&format!("layer {mamba}:")) && err.contains("conv"),
        "{err}"
    );

    // This model's state still runs.
    m.forward_one(&toks[..1], &mut good).unwrap();
    assert_eq!(good.position, 6);
}
