//! The server on a loopback port, driven by a real HTTP client (ureq): chat and completions,
//! streamed and not, against the library generating the same prompt; every error path; a client
//! leaving mid-stream; a full queue. The model is the tiny synthetic one on the host backend.

use nemotron::synth_text::write_tiny_text_checkpoint;
use nemotron::{DType, GenerateOptions, Message, TextModel};
use nemotron_server::{Server, ServerOptions};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const NAME: &str = "tiny";

/// One checkpoint directory for the whole binary (written once).
fn dir() -> &'static std::path::Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        write_tiny_text_checkpoint(d.path(), 5).unwrap();
        d
    })
    .path()
}

fn reference() -> &'static TextModel {
    static TM: OnceLock<TextModel> = OnceLock::new();
    TM.get_or_init(|| {
        TextModel::load(dir(), &burn::tensor::Device::flex(), DType::F32.burn()).unwrap()
    })
}

fn start(max_batch: usize, max_queue: usize, context: usize) -> Server {
    let mut o = ServerOptions::new(NAME);
    o.max_batch = max_batch;
    o.max_queue = max_queue;
    o.context_length = Some(context);
    Server::start(
        || TextModel::load(dir(), &burn::tensor::Device::flex(), DType::F32.burn()),
        o,
        "127.0.0.1:0",
    )
    .unwrap()
}

fn url(s: &Server, path: &str) -> String {
    format!("http://{}{path}", s.addr())
}

/// Status and JSON body, whatever the status.
fn post(s: &Server, path: &str, body: &Value) -> (u16, Value) {
    post_raw(s, path, &body.to_string())
}

fn post_raw(s: &Server, path: &str, body: &str) -> (u16, Value) {
    let r = ureq::post(&url(s, path))
        .set("Content-Type", "application/json")
        .send_string(body);
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{path}: {e}"),
    };
    let code = resp.status();
    let text = resp.into_string().unwrap();
    (
        code,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn get(s: &Server, path: &str) -> (u16, String) {
    match ureq::get(&url(s, path)).call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap()),
        Err(e) => panic!("{path}: {e}"),
    }
}

/// The `data:` payloads of a streamed response, `[DONE]` included.
fn stream(s: &Server, path: &str, body: &Value) -> Vec<String> {
    let r = ureq::post(&url(s, path)).send_json(body.clone()).unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.content_type().starts_with("text/event-stream"),
        "{}",
        r.content_type()
    );
    BufReader::new(r.into_reader())
        .lines()
        .map(Result::unwrap)
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect()
}

/// The concatenated text of a stream's chunks for choice `i`, its finish reason and its usage.
fn assemble(events: &[String], chat: bool, i: u64) -> (String, String, Value) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "the stream ends with [DONE]"
    );
    let (mut text, mut finish, mut usage) = (String::new(), String::new(), Value::Null);
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        assert!(c.get("error").is_none(), "error chunk: {c}");
        if let Some(u) = c.get("usage") {
            usage = u.clone();
        }
        for ch in c["choices"].as_array().unwrap() {
            if ch["index"].as_u64() != Some(i) {
                continue;
            }
            let piece = if chat {
                &ch["delta"]["content"]
            } else {
                &ch["text"]
            };
            text.push_str(piece.as_str().unwrap_or_default());
            if let Some(f) = ch["finish_reason"].as_str() {
                finish = f.into();
            }
        }
    }
    (text, finish, usage)
}

/// What the library produces for this rendered prompt (greedy, EOS ignored).
fn library(prompt: &str, max_tokens: usize) -> String {
    let tm = reference();
    let opts = GenerateOptions {
        max_new_tokens: max_tokens,
        ..Default::default()
    };
    tm.generate_text(prompt, opts, |_| {}).unwrap().text
}

#[test]
fn chat_streamed_and_not_equal_the_library() {
    let s = start(4, 8, 256);
    for thinking in [false, true] {
        let body = json!({"model": NAME, "messages": [{"role": "system", "content": "Be terse."},
            {"role": "user", "content": [{"type": "text", "text": "Name a prime, "}, {"type": "text", "text": "please."}]}],
            "temperature": 0, "max_tokens": 24, "ignore_eos": true,
            "chat_template_kwargs": {"enable_thinking": thinking}});
        let (code, r) = post(&s, "/v1/chat/completions", &body);
        assert_eq!(code, 200, "{r}");
        assert_eq!(r["object"], "chat.completion");
        assert_eq!(r["model"], NAME);
        let text = r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(r["choices"][0]["finish_reason"], "length");
        assert_eq!(r["usage"]["completion_tokens"], 24);
        let rendered = reference()
            .chat_template
            .as_ref()
            .unwrap()
            .render(
                &[
                    Message::new("system", "Be terse."),
                    Message::new("user", "Name a prime, please."),
                ],
                Some(thinking),
            )
            .unwrap();
        assert_eq!(
            text,
            library(&rendered, 24),
            "thinking {thinking}: the server and the library disagree"
        );
        let ids = reference().tokenizer.encode(&rendered, false).unwrap();
        assert_eq!(r["usage"]["prompt_tokens"], ids.len());

        let mut sb = body.clone();
        sb["stream"] = json!(true);
        sb["stream_options"] = json!({"include_usage": true});
        let ev = stream(&s, "/v1/chat/completions", &sb);
        let (st, finish, usage) = assemble(&ev, true, 0);
        assert_eq!(st, text, "the stream concatenates to the non-streamed text");
        assert_eq!(finish, "length");
        assert_eq!(usage, r["usage"]);
        let first: Value = serde_json::from_str(&ev[0]).unwrap();
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(first["object"], "chat.completion.chunk");
    }
}

/// Chat `logprobs: true, top_logprobs: 3`: one `content` entry per generated token, each equal
/// to what the library returns for the same prompt (the token's text, its log-probability, the
/// three most likely tokens in order), streamed and not alike; without `logprobs` they stay null.
#[test]
fn chat_logprobs_equal_the_library_streamed_and_not() {
    let s = start(4, 8, 256);
    let tm = reference();
    let body = json!({"model": NAME, "messages": [{"role": "user", "content": "Count to three."}],
        "temperature": 0, "max_tokens": 6, "ignore_eos": true, "logprobs": true, "top_logprobs": 3});
    let (code, r) = post(&s, "/v1/chat/completions", &body);
    assert_eq!(code, 200, "{r}");
    let content = r["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content.len(), 6, "{r}");
    // The library on the same rendered prompt.
    let rendered = tm
        .chat_template
        .as_ref()
        .unwrap()
        .render(&[Message::new("user", "Count to three.")], None)
        .unwrap();
    let ids = tm.tokenizer.encode(&rendered, false).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 6,
        logprobs: Some(3),
        ..Default::default()
    };
    let mut g = tm.model.generator(&ids, opts).unwrap();
    for (j, e) in content.iter().enumerate() {
        let tok = g.next().unwrap().unwrap();
        let lp = g.last_logprobs().unwrap();
        let text = tm.tokenizer.decode(&[tok]).unwrap();
        assert_eq!(e["token"], text.as_str(), "token {j}");
        assert_eq!(e["bytes"], json!(text.as_bytes()), "token {j}");
        let got = e["logprob"].as_f64().unwrap();
        assert!(
            (got - lp.logprob as f64).abs() < 1e-4,
            "token {j}: {got} against {}",
            lp.logprob
        );
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "token {j}");
        for (t, &(id, l)) in top.iter().zip(&lp.top) {
            assert_eq!(t["token"], tm.tokenizer.decode(&[id]).unwrap().as_str());
            assert!((t["logprob"].as_f64().unwrap() - l as f64).abs() < 1e-4);
        }
    }
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let ev = stream(&s, "/v1/chat/completions", &sb);
    let mut streamed = vec![];
    for e in &ev[..ev.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        for ch in c["choices"].as_array().unwrap() {
            if let Some(list) = ch["logprobs"]["content"].as_array() {
                streamed.extend(list.iter().cloned());
            }
        }
    }
    assert_eq!(
        streamed, content,
        "the stream's entries equal the whole answer's"
    );
    let mut plain = body.clone();
    plain.as_object_mut().unwrap().remove("logprobs");
    plain.as_object_mut().unwrap().remove("top_logprobs");
    let (_, r) = post(&s, "/v1/chat/completions", &plain);
    assert_eq!(r["choices"][0]["logprobs"], Value::Null, "{r}");
}

/// Completions `logprobs: 2` in the legacy shape: `tokens`, `token_logprobs`, `top_logprobs`
/// (text → log-probability) and `text_offset`, equal to the library generator's values for the
/// same prompt, the offsets rising from 0 inside the answer's text; the stream's per-token
/// objects concatenate to the same lists.
#[test]
fn completion_logprobs_equal_the_library_streamed_and_not() {
    let s = start(4, 8, 256);
    let tm = reference();
    let body = json!({"prompt": "The sky is", "max_tokens": 6, "temperature": 0, "ignore_eos": true, "logprobs": 2});
    let (code, r) = post(&s, "/v1/completions", &body);
    assert_eq!(code, 200, "{r}");
    let text = r["choices"][0]["text"].as_str().unwrap().to_string();
    let lp = &r["choices"][0]["logprobs"];
    let ids = tm.tokenizer.encode("The sky is", true).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 6,
        logprobs: Some(2),
        ..Default::default()
    };
    let mut g = tm.model.generator(&ids, opts).unwrap();
    let mut offset = 0;
    for j in 0..6 {
        let tok = g.next().unwrap().unwrap();
        let want = g.last_logprobs().unwrap();
        let t = tm.tokenizer.decode(&[tok]).unwrap();
        assert_eq!(lp["tokens"][j], t.as_str(), "token {j}: {lp}");
        let got = lp["token_logprobs"][j].as_f64().unwrap();
        assert!((got - want.logprob as f64).abs() < 1e-4, "token {j}");
        let top = lp["top_logprobs"][j].as_object().unwrap();
        assert!(top.len() <= 2 && !top.is_empty(), "token {j}: {top:?}");
        let (id0, l0) = want.top[0];
        let first = &top[&tm.tokenizer.decode(&[id0]).unwrap()];
        assert!(
            (first.as_f64().unwrap() - l0 as f64).abs() < 1e-4,
            "token {j}"
        );
        // Where the text emitted with the token starts: from 0, never back, inside the text.
        let off = lp["text_offset"][j].as_u64().unwrap() as usize;
        assert!(
            off >= offset && off <= text.chars().count(),
            "token {j}: {off}"
        );
        assert!(j > 0 || off == 0);
        offset = off;
    }
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let ev = stream(&s, "/v1/completions", &sb);
    let mut lists: [Vec<Value>; 4] = Default::default();
    for e in &ev[..ev.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        for ch in c["choices"].as_array().unwrap() {
            if ch["logprobs"].is_null() {
                continue;
            }
            for (k, key) in ["tokens", "token_logprobs", "top_logprobs", "text_offset"]
                .iter()
                .enumerate()
            {
                lists[k].extend(ch["logprobs"][key].as_array().unwrap().iter().cloned());
            }
        }
    }
    for (k, key) in ["tokens", "token_logprobs", "top_logprobs", "text_offset"]
        .iter()
        .enumerate()
    {
        assert_eq!(Value::Array(lists[k].clone()), lp[key], "streamed {key}");
    }
}

/// A server admitting prompts in pieces (`step_tokens` 12 over 4 slots, pieces of 5): a long
/// prompt and a short one streamed together each equal the library (seen red with the partial
/// state dropped between pieces); a budget not above the slots fails the start, naming both.
#[test]
fn a_server_with_a_step_budget_answers_as_the_library() {
    let mut o = ServerOptions::new(NAME);
    o.max_batch = 4;
    o.max_queue = 8;
    o.context_length = Some(256);
    o.step_tokens = 12;
    o.prefill_chunk = 5;
    let s = Server::start(
        || TextModel::load(dir(), &burn::tensor::Device::flex(), DType::F32.burn()),
        o.clone(),
        "127.0.0.1:0",
    )
    .unwrap();
    let long = "A long prompt that the server admits over several steps, five tokens at a time.";
    let ev = stream(
        &s,
        "/v1/completions",
        &json!({"prompt": [long, "Why"], "max_tokens": 8, "temperature": 0, "ignore_eos": true, "stream": true}),
    );
    assert_eq!(assemble(&ev, false, 0).0, library(long, 8));
    assert_eq!(assemble(&ev, false, 1).0, library("Why", 8));
    o.step_tokens = 4;
    let err = Server::start(
        || TextModel::load(dir(), &burn::tensor::Device::flex(), DType::F32.burn()),
        o,
        "127.0.0.1:0",
    )
    .err()
    .expect("a step budget of 4 over 4 slots is refused")
    .to_string();
    assert!(
        err.contains("step_tokens 4") && err.contains("max_batch 4"),
        "{err}"
    );
}

/// Slots sized from a memory budget (three slots and a half at 256 tokens; `max_batch` 1 is not
/// read): the HTTP side holds what the engine got — 4 choices (3 slots + a queue of 1) are
/// answered, 5 can never fit and say so with the 3 slots; a budget below one slot fails the
/// start naming both sizes.
#[test]
fn a_server_sized_from_slot_memory_holds_what_fits() {
    use nemotron::model::SlotMemory;
    let per = reference().model.slot_bytes(256) as u64;
    let mut o = ServerOptions::new(NAME);
    o.max_batch = 1;
    o.max_queue = 1;
    o.context_length = Some(256);
    o.slot_memory = Some(SlotMemory::Bytes(3 * per + per / 2));
    let load = || TextModel::load(dir(), &burn::tensor::Device::flex(), DType::F32.burn());
    let s = Server::start(load, o.clone(), "127.0.0.1:0").unwrap();
    let body = |n: u64| json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "n": n, "ignore_eos": true});
    let (code, r) = post(&s, "/v1/completions", &body(4));
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["choices"].as_array().unwrap().len(), 4);
    assert_eq!(r["choices"][3]["text"], library("Hello", 4).as_str());
    let (code, r) = post(&s, "/v1/completions", &body(5));
    assert_eq!(code, 400, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("3 slots"), "{msg}");
    let (_, text) = get(&s, "/metrics");
    assert!(text.contains("nemotron_slots 3\n"), "{text}");
    assert!(
        text.contains(&format!("nemotron_slot_memory_bytes {}\n", 3 * per)),
        "{text}"
    );
    drop(s);
    o.slot_memory = Some(SlotMemory::Bytes(per - 1));
    let err = Server::start(load, o, "127.0.0.1:0")
        .err()
        .expect("a budget below one slot is refused")
        .to_string();
    assert!(
        err.contains(&(per - 1).to_string()) && err.contains(&per.to_string()),
        "{err}"
    );
}

/// `kv_cache: Fp8` (`serve --kv-cache-dtype fp8`): the slots hold E4M3 codes, so the same
/// memory budget as above holds more of them — as many as `slot_bytes` under FP8 says, and
/// `/metrics` reports them — and requests are answered.
#[test]
fn a_server_with_an_fp8_kv_cache_fits_more_slots_in_the_same_memory() {
    use nemotron::model::{KvCacheDtype, SlotMemory};
    let m = reference().model.clone();
    let per = m.slot_bytes(256) as u64;
    let per8 = m.with_kv_cache(KvCacheDtype::Fp8).unwrap().slot_bytes(256) as u64;
    let budget = 3 * per + per / 2;
    let want = (budget / per8) as usize;
    assert!(per8 < per && want > 3, "{per8} vs {per}: {want} slots");
    let mut o = ServerOptions::new(NAME);
    o.max_queue = 1;
    o.context_length = Some(256);
    o.slot_memory = Some(SlotMemory::Bytes(budget));
    o.kv_cache = KvCacheDtype::Fp8;
    let load = || TextModel::load(dir(), &burn::tensor::Device::flex(), DType::F32.burn());
    let s = Server::start(load, o, "127.0.0.1:0").unwrap();
    let (code, r) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(code, 200, "{r}");
    let (_, text) = get(&s, "/metrics");
    assert!(text.contains(&format!("nemotron_slots {want}\n")), "{text}");
    assert!(
        text.contains(&format!(
            "nemotron_slot_memory_bytes {}\n",
            want as u64 * per8
        )),
        "{text}"
    );
}

#[test]
fn completions_text_and_token_ids_equal_the_library() {
    let s = start(4, 8, 256);
    let tm = reference();
    let (code, r) = post(
        &s,
        "/v1/completions",
        &json!({"model": NAME, "prompt": "The sky is", "max_tokens": 16, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    let text = r["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(text, library("The sky is", 16));

    let ids = tm.tokenizer.encode("The sky is", true).unwrap();
    let (code, r2) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 16, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(code, 200, "{r2}");
    assert_eq!(r2["choices"][0]["text"], text.as_str());

    // Two prompts in one request, streamed: each choice equals its prompt alone.
    let ev = stream(
        &s,
        "/v1/completions",
        &json!({"prompt": ["The sky is", "Why"], "max_tokens": 10, "temperature": 0, "ignore_eos": true, "stream": true}),
    );
    let (t0, f0, usage) = assemble(&ev, false, 0);
    let (t1, _, _) = assemble(&ev, false, 1);
    assert_eq!(t0, library("The sky is", 10));
    assert_eq!(t1, library("Why", 10));
    assert_eq!(f0, "length");
    assert_eq!(usage["completion_tokens"], 20, "{usage}");
}

#[test]
fn stop_strings_cut_the_text_streamed_and_not() {
    let s = start(2, 4, 256);
    let full = library("Once upon", 40);
    // A stop string taken from the middle of the greedy output.
    let chars: Vec<(usize, char)> = full.char_indices().collect();
    assert!(chars.len() > 12, "output too short: {full:?}");
    let (a, b) = (chars[8].0, chars[10].0);
    let stop = &full[a..b];
    let expect = &full[..full.find(stop).unwrap()];
    let body = json!({"prompt": "Once upon", "max_tokens": 40, "temperature": 0, "ignore_eos": true, "stop": [stop, "\u{1F600}never"]});
    let (code, r) = post(&s, "/v1/completions", &body);
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["choices"][0]["text"], expect);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (t, f, _) = assemble(&stream(&s, "/v1/completions", &sb), false, 0);
    assert_eq!((t.as_str(), f.as_str()), (expect, "stop"));
}

#[test]
fn seeded_choices_reproduce_and_equal_single_requests() {
    let s = start(4, 8, 256);
    let body = |n: u64, seed: u64| json!({"prompt": "Hello", "max_tokens": 12, "temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": seed, "n": n, "ignore_eos": true});
    let (c, two) = post(&s, "/v1/completions", &body(2, 7));
    assert_eq!(c, 200, "{two}");
    let (_, again) = post(&s, "/v1/completions", &body(2, 7));
    assert_eq!(
        two["choices"], again["choices"],
        "the same seed gives the same choices"
    );
    for j in 0..2 {
        let (_, one) = post(&s, "/v1/completions", &body(1, 7 + j));
        assert_eq!(
            one["choices"][0]["text"], two["choices"][j as usize]["text"],
            "choice {j}"
        );
    }
}

#[test]
fn models_health_and_metrics() {
    let s = start(2, 4, 256);
    let (c, m) = get(&s, "/v1/models");
    assert_eq!(c, 200);
    let m: Value = serde_json::from_str(&m).unwrap();
    assert_eq!(m["data"][0]["id"], NAME);
    assert_eq!(m["data"][0]["max_model_len"], 256);
    assert_eq!(get(&s, "/health").0, 200);
    let (c, _) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 5, "ignore_eos": true}),
    );
    assert_eq!(c, 200);
    let (c, text) = get(&s, "/metrics");
    assert_eq!(c, 200);
    for want in [
        "nemotron_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1",
        "nemotron_generation_tokens_total 5",
        "nemotron_time_to_first_token_seconds_count 1",
        "nemotron_inter_token_latency_seconds_count 4",
        "nemotron_queue_depth 0",
        "nemotron_batch_size 0",
    ] {
        assert!(text.contains(want), "/metrics lacks {want:?}:\n{text}");
    }
}

#[test]
fn bad_requests_are_refused_with_openai_errors() {
    let s = start(2, 4, 64);
    let ok = json!({"prompt": "hi", "max_tokens": 4});
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"prompt": "hi", "model": "gpt-4"}), "model", "gpt-4"),
        (
            json!({"prompt": "hi", "temperature": -1}),
            "temperature",
            "-1",
        ),
        (
            json!({"prompt": "hi", "temperature": "hot"}),
            "temperature",
            "number",
        ),
        (json!({"prompt": "hi", "top_p": 0}), "top_p", "(0, 1]"),
        (json!({"prompt": "hi", "top_k": -5}), "top_k", "-5"),
        (json!({"prompt": "hi", "min_p": 2}), "min_p", "2"),
        (
            json!({"prompt": "hi", "repetition_penalty": 0}),
            "repetition_penalty",
            "0",
        ),
        (
            json!({"prompt": "hi", "max_tokens": 0}),
            "max_tokens",
            "≥ 1",
        ),
        (
            json!({"prompt": "hi", "max_tokens": 1.5}),
            "max_tokens",
            "integer",
        ),
        (json!({"prompt": "hi", "n": 0}), "n", "n must be"),
        (json!({"prompt": "hi", "n": 7}), "n", "never fit"),
        (json!({"prompt": "hi", "stop": 3}), "stop", "stop"),
        (json!({"prompt": "hi", "stop": [""]}), "stop", "non-empty"),
        (
            json!({"prompt": "hi", "logprobs": 21}),
            "logprobs",
            "0 to 20",
        ),
        (
            json!({"prompt": "hi", "logprobs": true}),
            "logprobs",
            "integer",
        ),
        (
            json!({"prompt": "hi", "echo": true, "stream": true}),
            "echo",
            "not supported with stream",
        ),
        (
            json!({"prompt": "hi", "presence_penalty": 0.5}),
            "presence_penalty",
            "not supported",
        ),
        (
            json!({"prompt": "hi", "stream_options": {"include_usage": true}}),
            "stream_options",
            "stream: true",
        ),
        (json!({"prompt": [1, 2, 999999]}), "prompt", "999999"),
        (json!({"prompt": ""}), "prompt", "no tokens"),
        (json!({"prompt": []}), "prompt", "empty"),
        (json!({"prompt": {"x": 1}}), "prompt", "prompt must be"),
        (json!({}), "prompt", "required"),
        (
            json!({"prompt": "hi", "max_tokens": 63}),
            "max_tokens",
            "64",
        ),
        (json!({"prompt": vec![5u32; 64]}), "prompt", "64"),
    ];
    for (body, param, needle) in cases {
        let (code, r) = post(&s, "/v1/completions", &body);
        assert_eq!(code, 400, "{body} → {r}");
        let e = &r["error"];
        assert_eq!(e["type"], "invalid_request_error", "{body} → {r}");
        assert_eq!(e["param"], param, "{body} → {r}");
        let msg = e["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{body} → {msg:?} lacks {needle:?}");
    }
    // The context refusal names both numbers.
    let (_, r) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": vec![5u32; 10], "max_tokens": 60}),
    );
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("64") && msg.contains("70"), "{msg}");
    assert_eq!(r["error"]["code"], "context_length_exceeded");

    let chat = [
        (json!({"messages": []}), "messages"),
        (json!({"messages": "hi"}), "messages"),
        (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
            "messages[0].content[0]",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tools": []}}),
            "chat_template_kwargs",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": "yes"}}),
            "chat_template_kwargs",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "logprobs": "yes"}),
            "logprobs",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 100}),
            "max_tokens",
        ),
    ];
    for (body, param) in chat {
        let (code, r) = post(&s, "/v1/chat/completions", &body);
        assert_eq!(code, 400, "{body} → {r}");
        assert_eq!(r["error"]["param"], param, "{body} → {r}");
    }
    for raw in ["{not json", "[1, 2]", ""] {
        let (code, r) = post_raw(&s, "/v1/completions", raw);
        assert_eq!(code, 400, "{raw:?} → {r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains("JSON"),
            "{r}"
        );
    }
    let (code, body) = get(&s, "/v1/nothing");
    assert_eq!(code, 404);
    assert!(body.contains("\"error\""), "{body}");
    let (code, body) = get(&s, "/v1/completions");
    assert_eq!(code, 405);
    assert!(body.contains("\"error\""), "{body}");
    // Nothing above broke the server.
    assert_eq!(post(&s, "/v1/completions", &ok).0, 200);
    assert_eq!(get(&s, "/health").0, 200);
}

fn metric(s: &Server, name: &str) -> f64 {
    let (_, text) = get(s, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// A long streaming request whose client reads three chunks and hangs up.
fn leave_after_three_chunks(s: &Server) {
    let body = json!({"prompt": "x", "max_tokens": 1500, "ignore_eos": true, "stream": true});
    let r = ureq::post(&url(s, "/v1/completions"))
        .send_json(body)
        .unwrap();
    let mut lines = BufReader::new(r.into_reader()).lines();
    let mut seen = 0;
    while seen < 3 {
        if lines.next().unwrap().unwrap().starts_with("data: ") {
            seen += 1;
        }
    }
}

#[test]
fn a_client_that_leaves_mid_stream_frees_its_slot() {
    let s = start(1, 4, 2048);
    leave_after_three_chunks(&s);
    // One slot: this request can only run once the first one's slot is free.
    let t = Instant::now();
    let (code, r) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": "y", "max_tokens": 8, "ignore_eos": true}),
    );
    assert_eq!(code, 200, "{r}");
    let after = metric(&s, "nemotron_generation_tokens_total");
    assert!(
        after < 300.0,
        "{after} tokens generated: the departed client's request ran on (of 1,500) instead of being cancelled"
    );
    eprintln!(
        "second request done {:?} after the first client left; {after} tokens in all",
        t.elapsed()
    );
    assert_eq!(metric(&s, "nemotron_batch_size"), 0.0);
}

#[test]
fn a_full_queue_answers_429() {
    let s = start(1, 1, 2048);
    let hold = |s: &Server| {
        let body = json!({"prompt": "x", "max_tokens": 1500, "ignore_eos": true, "stream": true});
        let r = ureq::post(&url(s, "/v1/completions"))
            .send_json(body)
            .unwrap();
        BufReader::new(r.into_reader())
    };
    let mut a = hold(&s); // runs
    let mut line = String::new();
    a.read_line(&mut line).unwrap();
    let _b = hold(&s); // waits (the queue holds one)
    let (code, r) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": "z", "max_tokens": 4}),
    );
    assert_eq!(code, 429, "{r}");
    assert_eq!(r["error"]["code"], "queue_full", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("retry"),
        "{r}"
    );
    drop(a);
    drop(_b);
    // Once both clients are gone the server takes requests again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, r) = post(
            &s,
            "/v1/completions",
            &json!({"prompt": "z", "max_tokens": 4}),
        );
        if code == 200 {
            break;
        }
        assert_eq!(code, 429, "{r}");
        assert!(Instant::now() < deadline, "the slots never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `echo` on completions (what lm-evaluation-harness scores with): with `max_tokens: 0` the
/// choice's text is the prompt's and its `logprobs` list the prompt's tokens, the first with
/// `null` values and the others equal to the library's `prompt_logprobs`, offsets rising from 0
/// inside the text; nothing is generated. With `max_tokens: 3` the text and lists are the
/// prompt's then the same request's without `echo`. `echo` with `stream`, a non-boolean `echo`
/// and `max_tokens: 0` without `echo` are refused naming the field.
#[test]
fn completion_echo_scores_the_prompt_as_the_library() {
    let s = start(4, 8, 256);
    let tm = reference();
    let prompt = "The sky is blue and";
    let ids = tm.tokenizer.encode(prompt, true).unwrap();
    let want = nemotron::model::prompt_logprobs(&tm.model, &ids, 2).unwrap();
    let body = json!({"prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 2});
    let (code, r) = post(&s, "/v1/completions", &body);
    assert_eq!(code, 200, "{r}");
    let ch = &r["choices"][0];
    let text = ch["text"].as_str().unwrap();
    assert_eq!(text, tm.tokenizer.decode(&ids).unwrap());
    assert_eq!(r["usage"]["completion_tokens"], 0, "{r}");
    let lp = &ch["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), ids.len(), "{lp}");
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    let mut offset = 0;
    for (i, w) in want.iter().enumerate() {
        let got = lp["token_logprobs"][i + 1].as_f64().unwrap();
        assert!(
            (got - w.logprob as f64).abs() < 1e-4,
            "token {}: {got} against {}",
            i + 1,
            w.logprob
        );
        let top = lp["top_logprobs"][i + 1].as_object().unwrap();
        let first = &top[&tm.tokenizer.decode(&[w.top[0].0]).unwrap()];
        assert!((first.as_f64().unwrap() - w.top[0].1 as f64).abs() < 1e-4);
        let off = lp["text_offset"][i + 1].as_u64().unwrap() as usize;
        assert!(
            off >= offset && off <= text.chars().count(),
            "token {}: {off}",
            i + 1
        );
        offset = off;
    }
    assert_eq!(lp["text_offset"][0], 0);

    // Echo then generate: the prompt's text and entries, then the plain answer's.
    let gen = json!({"prompt": prompt, "max_tokens": 3, "temperature": 0, "ignore_eos": true, "logprobs": 2});
    let (_, plain) = post(&s, "/v1/completions", &gen);
    let mut eb = gen.clone();
    eb["echo"] = json!(true);
    let (code, both) = post(&s, "/v1/completions", &eb);
    assert_eq!(code, 200, "{both}");
    let ptext = plain["choices"][0]["text"].as_str().unwrap();
    assert_eq!(
        both["choices"][0]["text"].as_str().unwrap(),
        format!("{text}{ptext}")
    );
    let (bl, pl) = (
        &both["choices"][0]["logprobs"],
        &plain["choices"][0]["logprobs"],
    );
    for key in ["tokens", "token_logprobs", "top_logprobs"] {
        let b = bl[key].as_array().unwrap();
        assert_eq!(b.len(), ids.len() + 3, "{key}");
        assert_eq!(
            b[..ids.len()],
            lp[key].as_array().unwrap()[..],
            "{key}: the prompt's"
        );
        assert_eq!(
            b[ids.len()..],
            pl[key].as_array().unwrap()[..],
            "{key}: the answer's"
        );
    }
    let shift = text.chars().count() as u64;
    for j in 0..3 {
        let o = pl["text_offset"][j].as_u64().unwrap();
        assert_eq!(
            bl["text_offset"][ids.len() + j].as_u64().unwrap(),
            o + shift
        );
    }

    for (bad, field) in [
        (
            json!({"prompt": prompt, "max_tokens": 2, "echo": true, "stream": true}),
            "echo",
        ),
        (
            json!({"prompt": prompt, "max_tokens": 2, "echo": "yes"}),
            "echo",
        ),
        (json!({"prompt": prompt, "max_tokens": 0}), "max_tokens"),
    ] {
        let (code, r) = post(&s, "/v1/completions", &bad);
        assert_eq!(code, 400, "{bad}: {r}");
        assert_eq!(r["error"]["param"], field, "{bad}: {r}");
    }
}
