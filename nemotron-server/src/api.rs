//! The OpenAI-compatible endpoints: request parsing (every field checked by name), the
//! per-choice token streams, and the response and Server-Sent-Events bodies.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::stop::StopMatcher;
use crate::worker::{Cmd, Load, Out};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, BoxStream, StreamExt};
use nemotron::model::Sampling;
use nemotron::{ChatTemplate, GenerateOptions, GenerationDefaults, Message, StopReason};
use nemotron::{TokenStream, Tokenizer};
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// Choices one request may ask for (prompts × `n`).
pub const MAX_CHOICES: usize = 64;
/// Stop strings one request may give.
pub const MAX_STOPS: usize = 16;

/// What the handlers share.
pub struct AppState {
    pub model_name: String,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Option<ChatTemplate>,
    pub defaults: GenerationDefaults,
    pub vocab_size: usize,
    /// Tokens a sequence may hold: prompt + output (the slot capacity).
    pub context_length: usize,
    pub max_batch: usize,
    pub max_queue: usize,
    pub cmd: Mutex<mpsc::Sender<Cmd>>,
    pub load: Arc<Load>,
    pub metrics: Arc<Metrics>,
    pub next_key: AtomicU64,
    pub created: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

impl Kind {
    fn endpoint(self) -> &'static str {
        match self {
            Kind::Chat => "/v1/chat/completions",
            Kind::Completion => "/v1/completions",
        }
    }
}

/// A parsed, checked request.
struct Plan {
    kind: Kind,
    prompts: Vec<Vec<u32>>,
    n: usize,
    opts: GenerateOptions,
    /// Seed of choice 0; choice `j` of a prompt uses `seed + j`.
    seed: u64,
    stops: Vec<String>,
    stream: bool,
    include_usage: bool,
}

type Obj = Map<String, Value>;

fn number(o: &Obj, name: &str) -> Result<Option<f64>, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(x)) => Ok(x.as_f64()),
        Some(_) => Err(ApiError::invalid(name, format!("{name} must be a number"))),
    }
}

fn integer(o: &Obj, name: &str) -> Result<Option<i64>, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(x)) => x
            .as_i64()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(name, format!("{name} must be an integer, got {x}"))),
        Some(_) => Err(ApiError::invalid(
            name,
            format!("{name} must be an integer"),
        )),
    }
}

fn boolean(o: &Obj, name: &str) -> Result<Option<bool>, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid(
            name,
            format!("{name} must be true or false"),
        )),
    }
}

/// A field this server does not implement is refused when it asks for something, not ignored.
fn unsupported_unless(
    o: &Obj,
    name: &str,
    harmless: impl Fn(&Value) -> bool,
) -> Result<(), ApiError> {
    match o.get(name) {
        Some(v) if !v.is_null() && !harmless(v) => Err(ApiError::invalid(
            name,
            format!("{name} is not supported by this server (got {v})"),
        )),
        _ => Ok(()),
    }
}

fn random_seed(st: &AppState) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let k = st.next_key.fetch_add(1, Ordering::Relaxed);
    (t ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15)).rotate_left(17)
}

/// The fields both endpoints share: model, sampling, budgets, stops, streaming.
fn common(
    st: &AppState,
    o: &Obj,
    kind: Kind,
) -> Result<
    (
        GenerateOptions,
        u64,
        usize,
        Vec<String>,
        bool,
        bool,
        Option<usize>,
    ),
    ApiError,
> {
    match o.get("model") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if *m == st.model_name => {}
        Some(Value::String(m)) => {
            return Err(ApiError::invalid(
                "model",
                format!(
                    "the model {m:?} does not exist here; this server serves {:?}",
                    st.model_name
                ),
            )
            .with_code("model_not_found"))
        }
        Some(_) => return Err(ApiError::invalid("model", "model must be a string")),
    }
    for f in ["presence_penalty", "frequency_penalty"] {
        unsupported_unless(o, f, |v| v.as_f64() == Some(0.0))?;
    }
    unsupported_unless(o, "logit_bias", |v| {
        v.as_object().is_some_and(Map::is_empty)
    })?;
    unsupported_unless(o, "tools", |v| v.as_array().is_some_and(Vec::is_empty))?;
    unsupported_unless(o, "functions", |v| v.as_array().is_some_and(Vec::is_empty))?;
    unsupported_unless(o, "tool_choice", |v| v.as_str() == Some("none"))?;
    unsupported_unless(o, "response_format", |v| {
        v.get("type").and_then(Value::as_str) == Some("text")
    })?;
    match kind {
        Kind::Chat => {
            unsupported_unless(o, "logprobs", |v| v == &Value::Bool(false))?;
            unsupported_unless(o, "top_logprobs", |v| v.as_i64() == Some(0))?;
        }
        Kind::Completion => {
            unsupported_unless(o, "logprobs", |_| false)?;
            unsupported_unless(o, "echo", |v| v == &Value::Bool(false))?;
            unsupported_unless(o, "suffix", |v| v.as_str() == Some(""))?;
        }
    }

    let mut s: Sampling = st.defaults.sampling();
    if let Some(t) = number(o, "temperature")? {
        if !(t.is_finite() && t >= 0.0) {
            return Err(ApiError::invalid(
                "temperature",
                format!("temperature must be ≥ 0, got {t}"),
            ));
        }
        s.temperature = t as f32;
    }
    if let Some(p) = number(o, "top_p")? {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::invalid(
                "top_p",
                format!("top_p must be in (0, 1], got {p}"),
            ));
        }
        s.top_p = p as f32;
    }
    if let Some(k) = integer(o, "top_k")? {
        s.top_k = match k {
            -1 | 0 => 0,
            k if k > 0 => k as usize,
            k => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("top_k must be ≥ 1 (or 0 / -1 for all), got {k}"),
                ))
            }
        };
    }
    if let Some(p) = number(o, "min_p")? {
        if !(0.0..=1.0).contains(&p) {
            return Err(ApiError::invalid(
                "min_p",
                format!("min_p must be in [0, 1], got {p}"),
            ));
        }
        s.min_p = p as f32;
    }
    if let Some(r) = number(o, "repetition_penalty")? {
        if !(r.is_finite() && r > 0.0) {
            return Err(ApiError::invalid(
                "repetition_penalty",
                format!("repetition_penalty must be > 0, got {r}"),
            ));
        }
        s.repetition_penalty = r as f32;
    }
    let seed = match integer(o, "seed")? {
        Some(x) => x as u64,
        None => random_seed(st),
    };
    let n = match integer(o, "n")? {
        None => 1,
        Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                "n",
                format!("n must be in 1..={MAX_CHOICES}, got {n}"),
            ))
        }
    };
    if let Some(b) = integer(o, "best_of")? {
        if b as usize != n {
            return Err(ApiError::invalid(
                "best_of",
                "best_of other than n is not supported",
            ));
        }
    }
    let names: &[&str] = match kind {
        Kind::Chat => &["max_completion_tokens", "max_tokens"],
        Kind::Completion => &["max_tokens"],
    };
    let mut max_tokens = None;
    for &name in names {
        if let Some(m) = integer(o, name)? {
            if m < 1 {
                return Err(ApiError::invalid(
                    name,
                    format!("{name} must be ≥ 1, got {m}"),
                ));
            }
            max_tokens.get_or_insert(m as usize);
        }
    }
    let stops = match o.get("stop") {
        None | Some(Value::Null) => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::invalid("stop", "stop must be a string or a list of strings")
            })?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "stop must be a string or a list of strings",
            ))
        }
    };
    if stops.len() > MAX_STOPS || stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop",
            format!("stop takes at most {MAX_STOPS} non-empty strings"),
        ));
    }
    let mut stop_ids = if boolean(o, "ignore_eos")?.unwrap_or(false) {
        vec![]
    } else {
        st.defaults.eos_token_ids.clone()
    };
    match o.get("stop_token_ids") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for v in a {
                match v.as_u64() {
                    Some(t) if (t as usize) < st.vocab_size => stop_ids.push(t as u32),
                    _ => {
                        return Err(ApiError::invalid(
                            "stop_token_ids",
                            format!(
                                "stop_token_ids must be token ids below {}, got {v}",
                                st.vocab_size
                            ),
                        ))
                    }
                }
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "stop_token_ids",
                "stop_token_ids must be a list of token ids",
            ))
        }
    }
    let stream = boolean(o, "stream")?.unwrap_or(false);
    let include_usage = match o.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(so)) if stream => boolean(so, "include_usage")
            .map_err(|_| {
                ApiError::invalid(
                    "stream_options",
                    "stream_options.include_usage must be true or false",
                )
            })?
            .unwrap_or(false),
        Some(Value::Object(_)) => {
            return Err(ApiError::invalid(
                "stream_options",
                "stream_options needs stream: true",
            ))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "stream_options must be an object",
            ))
        }
    };
    let opts = GenerateOptions {
        max_new_tokens: 0,
        sampling: s,
        stop_ids,
        max_context: Some(st.context_length),
        ..Default::default()
    };
    Ok((opts, seed, n, stops, stream, include_usage, max_tokens))
}

/// The text of a message's `content`: a string, or a list of `{"type": "text", "text": …}` parts.
fn content_text(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut s = String::new();
            for (i, p) in parts.iter().enumerate() {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => s.push_str(t),
                    _ => return Err(ApiError::invalid(
                        &format!("{at}.content[{i}]"),
                        "only text content parts ({\"type\": \"text\", \"text\": …}) are supported",
                    )),
                }
            }
            Ok(s)
        }
        Some(_) => Err(ApiError::invalid(
            &format!("{at}.content"),
            "content must be a string or a list of text parts",
        )),
    }
}

fn chat_prompt(st: &AppState, o: &Obj) -> Result<Vec<u32>, ApiError> {
    let tmpl = st.chat_template.as_ref().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "this model has no chat template: use /v1/completions",
        )
    })?;
    let msgs = match o.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::invalid("messages", "messages is empty")),
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("messages", "messages is required"))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "messages",
                "messages must be a list of messages",
            ))
        }
    };
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(&format!("{at}.role"), "each message needs a role"))?;
        if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
            return Err(ApiError::invalid(
                &format!("{at}.role"),
                format!(
                    "unknown role {role:?} (expected system, developer, user, assistant or tool)"
                ),
            ));
        }
        let role = if role == "developer" { "system" } else { role };
        out.push(Message::new(role, &content_text(m.get("content"), &at)?));
    }
    let reasoning = match o.get("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(kw)) => {
            if let Some(k) = kw.keys().find(|k| *k != "enable_thinking") {
                return Err(ApiError::invalid(
                    "chat_template_kwargs",
                    format!("chat_template_kwargs.{k} is not supported (only enable_thinking)"),
                ));
            }
            boolean(kw, "enable_thinking").map_err(|_| {
                ApiError::invalid(
                    "chat_template_kwargs",
                    "chat_template_kwargs.enable_thinking must be true or false",
                )
            })?
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs",
                "chat_template_kwargs must be an object",
            ))
        }
    };
    let text = tmpl
        .render(&out, reasoning)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    st.tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

fn token_ids(a: &[Value], at: &str, vocab: usize) -> Result<Vec<u32>, ApiError> {
    a.iter()
        .enumerate()
        .map(|(i, v)| match v.as_u64() {
            Some(t) if (t as usize) < vocab => Ok(t as u32),
            _ => Err(ApiError::invalid(
                at,
                format!("{at}[{i}] = {v} is not a token id below the vocabulary size {vocab}"),
            )),
        })
        .collect()
}

fn completion_prompts(st: &AppState, o: &Obj) -> Result<Vec<Vec<u32>>, ApiError> {
    let enc = |s: &str| {
        st.tokenizer
            .encode(s, true)
            .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
    };
    let bad = || {
        ApiError::invalid("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of such lists")
    };
    match o.get("prompt") {
        None | Some(Value::Null) => Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Value::String(s)) => Ok(vec![enc(s)?]),
        Some(Value::Array(a)) if a.is_empty() => {
            Err(ApiError::invalid("prompt", "prompt is empty"))
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
            .iter()
            .map(|s| enc(s.as_str().unwrap_or_default()))
            .collect(),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => {
            Ok(vec![token_ids(a, "prompt", st.vocab_size)?])
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => a
            .iter()
            .enumerate()
            .map(|(i, p)| {
                token_ids(
                    p.as_array().map_or(&[][..], Vec::as_slice),
                    &format!("prompt[{i}]"),
                    st.vocab_size,
                )
            })
            .collect(),
        Some(_) => Err(bad()),
    }
}

fn parse(st: &AppState, body: Result<Bytes, BytesRejection>, kind: Kind) -> Result<Plan, ApiError> {
    let body = body.map_err(|r| ApiError::status(r.status(), r.body_text()))?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(o) = v else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    let (mut opts, seed, n, stops, stream, include_usage, max_tokens) = common(st, &o, kind)?;
    let prompts = match kind {
        Kind::Chat => vec![chat_prompt(st, &o)?],
        Kind::Completion => completion_prompts(st, &o)?,
    };
    if prompts.len() * n > MAX_CHOICES {
        return Err(ApiError::invalid(
            "n",
            format!(
                "{} prompts × n {n} = {} choices; at most {MAX_CHOICES} per request",
                prompts.len(),
                prompts.len() * n
            ),
        ));
    }
    let hold = st.max_batch + st.max_queue;
    if prompts.len() * n > hold {
        return Err(ApiError::invalid(
            "n",
            format!(
                "{} choices can never fit: this server holds {hold} sequences ({} slots + a queue of {})",
                prompts.len() * n,
                st.max_batch,
                st.max_queue
            ),
        ));
    }
    let c = st.context_length;
    let mut budget = usize::MAX;
    for (i, p) in prompts.iter().enumerate() {
        let param = if kind == Kind::Chat {
            "messages"
        } else {
            "prompt"
        };
        if p.is_empty() {
            return Err(ApiError::invalid(
                param,
                format!("prompt {i} has no tokens"),
            ));
        }
        match max_tokens {
            Some(m) if p.len() + m > c => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!(
                        "this model's context length is {c} tokens; the request asks for {} ({} prompt tokens + max_tokens {m})",
                        p.len() + m,
                        p.len()
                    ),
                )
                .with_code("context_length_exceeded"))
            }
            None if p.len() >= c => {
                return Err(ApiError::invalid(
                    param,
                    format!("this model's context length is {c} tokens; the prompt has {}, leaving no room for output", p.len()),
                )
                .with_code("context_length_exceeded"))
            }
            _ => budget = budget.min(c - p.len()),
        }
    }
    opts.max_new_tokens = max_tokens.unwrap_or(budget);
    Ok(Plan {
        kind,
        prompts,
        n,
        opts,
        seed,
        stops,
        stream,
        include_usage,
    })
}

/// One choice's tokens as they arrive: detokenized, stop strings applied, timed. Dropping it
/// cancels the request on the engine (a client that left frees its slot).
struct ChoiceRun {
    index: usize,
    key: u64,
    rx: UnboundedReceiver<Out>,
    text: TokenStream<Arc<Tokenizer>>,
    stop: StopMatcher,
    tokens: usize,
    /// No more pieces to give.
    finished: bool,
    /// The engine holds the request no longer (else dropping the run cancels it there).
    released: bool,
    arrived: Instant,
    last: Option<Instant>,
    st: Arc<AppState>,
}

impl Drop for ChoiceRun {
    fn drop(&mut self) {
        if !self.released {
            if let Ok(tx) = self.st.cmd.lock() {
                let _ = tx.send(Cmd::Cancel(self.key));
            }
        }
    }
}

/// A piece of one choice's output; `finish` on its last.
struct Piece {
    text: String,
    finish: Option<&'static str>,
    /// Whether a token arrived with it (streams send one chunk per token).
    token: bool,
}

fn finish_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::Stop(_) => "stop",
        StopReason::MaxTokens | StopReason::ContextFull => "length",
    }
}

impl ChoiceRun {
    /// The next piece; `None` once finished.
    async fn next(&mut self) -> Option<Result<Piece, ApiError>> {
        if self.finished {
            return None;
        }
        let out = self.rx.recv().await;
        let internal =
            |e: nemotron::Error| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
        let mut token = false;
        let (piece, ended) = match out {
            None => {
                (self.finished, self.released) = (true, true);
                return Some(Err(ApiError::status(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the engine stopped before the request finished",
                )));
            }
            Some(Out::Failed(msg)) => {
                (self.finished, self.released) = (true, true);
                return Some(Err(ApiError::status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("engine: {msg}"),
                )));
            }
            Some(Out::Refused(msg)) => {
                (self.finished, self.released) = (true, true);
                return Some(Err(ApiError::bad_request(msg)));
            }
            Some(Out::Token(t, stop)) => {
                let now = Instant::now();
                match self.last {
                    None => self
                        .st
                        .metrics
                        .time_to_first_token
                        .observe((now - self.arrived).as_secs_f64()),
                    Some(l) => self
                        .st
                        .metrics
                        .inter_token_latency
                        .observe((now - l).as_secs_f64()),
                }
                self.last = Some(now);
                self.tokens += 1;
                token = true;
                match self.text.push(t) {
                    Ok(p) => (p.unwrap_or_default(), stop),
                    Err(e) => {
                        // Dropping the run cancels it on the engine.
                        self.finished = true;
                        return Some(Err(internal(e)));
                    }
                }
            }
            Some(Out::Done(stop)) => (String::new(), Some(stop)),
        };
        let (mut text, hit) = self.stop.push(&piece);
        if hit {
            // Done here: the rest is cancelled on the engine at once.
            self.end_metrics();
            if ended.is_none() {
                let _ = self.st.cmd.lock().map(|tx| tx.send(Cmd::Cancel(self.key)));
            }
            (self.finished, self.released) = (true, true);
            return Some(Ok(Piece {
                text,
                finish: Some("stop"),
                token,
            }));
        }
        let Some(reason) = ended else {
            return Some(Ok(Piece {
                text,
                finish: None,
                token,
            }));
        };
        (self.finished, self.released) = (true, true);
        self.end_metrics();
        let mut reason = finish_reason(reason);
        if let Ok(Some(tail)) = self.text.finish() {
            let (t, hit) = self.stop.push(&tail);
            text.push_str(&t);
            if hit {
                reason = "stop";
            }
        }
        text.push_str(&self.stop.finish());
        Some(Ok(Piece {
            text,
            finish: Some(reason),
            token,
        }))
    }

    fn end_metrics(&self) {
        self.st
            .metrics
            .request_latency
            .observe(self.arrived.elapsed().as_secs_f64());
    }
}

/// Submits every choice of the plan, or refuses the whole request when the queue is full.
fn submit(st: &Arc<AppState>, plan: &Plan, arrived: Instant) -> Result<Vec<ChoiceRun>, ApiError> {
    use std::sync::atomic::Ordering::SeqCst;
    if st.load.stopped.load(SeqCst) {
        return Err(ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine has stopped",
        ));
    }
    let k = plan.prompts.len() * plan.n;
    let limit = st.max_batch + st.max_queue;
    let before = st.load.live.fetch_add(k, SeqCst);
    if before + k > limit {
        st.load.live.fetch_sub(k, SeqCst);
        return Err(ApiError::status(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "the server is full: {before} sequences running or queued, {} slots + a queue of {}; retry later",
                st.max_batch, st.max_queue
            ),
        )
        .with_code("queue_full"));
    }
    let tx = st
        .cmd
        .lock()
        .map_err(|_| {
            ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "engine channel poisoned")
        })?
        .clone();
    let mut runs = Vec::with_capacity(k);
    for (pi, p) in plan.prompts.iter().enumerate() {
        for j in 0..plan.n {
            let key = st.next_key.fetch_add(1, SeqCst);
            let (otx, orx) = tokio::sync::mpsc::unbounded_channel();
            let mut opts = plan.opts.clone();
            opts.sampling.seed = plan.seed.wrapping_add(j as u64);
            let cmd = Cmd::Submit {
                key,
                prompt: p.clone(),
                opts,
                tx: otx,
            };
            let sent = tx.send(cmd).is_ok();
            runs.push(ChoiceRun {
                index: pi * plan.n + j,
                key,
                rx: orx,
                text: TokenStream::new(st.tokenizer.clone()),
                stop: StopMatcher::new(plan.stops.clone()),
                tokens: 0,
                finished: !sent,
                released: !sent,
                arrived,
                last: None,
                st: st.clone(),
            });
            if !sent {
                // Count back what never reached the engine (this one and the rest).
                st.load.live.fetch_sub(k - (runs.len() - 1), SeqCst);
                return Err(ApiError::status(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the engine has stopped",
                ));
            }
        }
    }
    Ok(runs)
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub async fn chat_completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(st, body, Kind::Chat).await
}

pub async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(st, body, Kind::Completion).await
}

async fn handle(st: Arc<AppState>, body: Result<Bytes, BytesRejection>, kind: Kind) -> Response {
    let arrived = Instant::now();
    let r = match parse(&st, body, kind) {
        Ok(plan) => run(st.clone(), plan, arrived).await,
        Err(e) => Err(e),
    };
    let resp = r.unwrap_or_else(IntoResponse::into_response);
    st.metrics
        .count_request(kind.endpoint(), resp.status().as_u16());
    resp
}

async fn run(st: Arc<AppState>, plan: Plan, arrived: Instant) -> Result<Response, ApiError> {
    let mut runs = submit(&st, &plan, arrived)?;
    let prompt_tokens: usize = plan.prompts.iter().map(Vec::len).sum();
    let key = runs.first().map_or(0, |r| r.key);
    let id = match plan.kind {
        Kind::Chat => format!("chatcmpl-{key}"),
        Kind::Completion => format!("cmpl-{key}"),
    };
    let created = now_unix();
    let model = st.model_name.clone();
    if !plan.stream {
        let mut choices = vec![];
        let mut completion = 0;
        for r in &mut runs {
            let mut text = String::new();
            let mut finish = "length";
            while let Some(p) = r.next().await {
                let p = p?;
                text.push_str(&p.text);
                if let Some(f) = p.finish {
                    finish = f;
                }
            }
            completion += r.tokens;
            choices.push(match plan.kind {
                Kind::Chat => json!({"index": r.index, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish}),
                Kind::Completion => json!({"index": r.index, "text": text, "logprobs": null, "finish_reason": finish}),
            });
        }
        let object = match plan.kind {
            Kind::Chat => "chat.completion",
            Kind::Completion => "text_completion",
        };
        return Ok(Json(json!({
            "id": id, "object": object, "created": created, "model": model,
            "choices": choices, "usage": usage(prompt_tokens, completion),
        }))
        .into_response());
    }

    // Streaming: one chunk per token per choice (text possibly empty while a character or a
    // possible stop string is incomplete), a closing chunk with the finish reason and the usage
    // so far, the usage chunk OpenAI sends with `include_usage`, then `[DONE]`.
    let object = match plan.kind {
        Kind::Chat => "chat.completion.chunk",
        Kind::Completion => "text_completion",
    };
    let completion = Arc::new(AtomicU64::new(0));
    let chunk = {
        let (id, model) = (id.clone(), model.clone());
        move |choices: Value, usage: Option<Value>| -> Event {
            let mut c = json!({"id": id, "object": object, "created": created, "model": model, "choices": choices});
            if let Some(u) = usage {
                c["usage"] = u;
            }
            Event::default().data(c.to_string())
        }
    };
    let kind = plan.kind;
    let per_choice: Vec<BoxStream<'static, Event>> = runs
        .into_iter()
        .map(|r| {
            let chunk = chunk.clone();
            let completion = completion.clone();
            let opening = (kind == Kind::Chat).then(|| {
                chunk(json!([{"index": r.index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]), None)
            });
            let body = stream::unfold(Some(r), move |r| {
                let chunk = chunk.clone();
                let completion = completion.clone();
                async move {
                    let mut r = r?;
                    let i = r.index;
                    let p = r.next().await?;
                    let ev = match p {
                        Err(e) => {
                            let ev = Event::default().data(e.body().to_string());
                            return Some((vec![ev], None));
                        }
                        Ok(p) => p,
                    };
                    let text = |t: &str| match kind {
                        Kind::Chat => json!({"index": i, "delta": {"content": t}, "logprobs": null, "finish_reason": null}),
                        Kind::Completion => json!({"index": i, "text": t, "logprobs": null, "finish_reason": null}),
                    };
                    let mut out = vec![];
                    match ev.finish {
                        None => out.push(chunk(json!([text(&ev.text)]), None)),
                        Some(f) => {
                            if !ev.text.is_empty() || ev.token {
                                out.push(chunk(json!([text(&ev.text)]), None));
                            }
                            let total = completion.fetch_add(r.tokens as u64, Ordering::SeqCst) + r.tokens as u64;
                            let closing = match kind {
                                Kind::Chat => json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": f}),
                                Kind::Completion => json!({"index": i, "text": "", "logprobs": null, "finish_reason": f}),
                            };
                            out.push(chunk(json!([closing]), Some(usage(prompt_tokens, total as usize))));
                            return Some((out, None));
                        }
                    }
                    Some((out, Some(r)))
                }
            })
            .flat_map(stream::iter);
            stream::iter(opening).chain(body).boxed()
        })
        .collect();
    let include_usage = plan.include_usage;
    let tail = stream::once(async move {
        let mut evs = vec![];
        if include_usage {
            let c = completion.load(Ordering::SeqCst) as usize;
            evs.push(chunk(json!([]), Some(usage(prompt_tokens, c))));
        }
        evs.push(Event::default().data("[DONE]"));
        evs
    })
    .flat_map(stream::iter);
    let events = stream::select_all(per_choice)
        .chain(tail)
        .map(Ok::<_, Infallible>);
    // A comment line every second: a client that left is noticed (the write fails) even while its
    // request waits for a slot or a long prefill.
    let keep = KeepAlive::new().interval(std::time::Duration::from_secs(1));
    Ok(Sse::new(events).keep_alive(keep).into_response())
}

pub async fn models(State(st): State<Arc<AppState>>) -> Response {
    st.metrics.count_request("/v1/models", 200);
    Json(json!({"object": "list", "data": [{
        "id": st.model_name, "object": "model", "created": st.created, "owned_by": "nemotron-rs",
        "max_model_len": st.context_length,
    }]}))
    .into_response()
}

pub async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.load.stopped.load(Ordering::SeqCst) {
        st.metrics.count_request("/health", 503);
        return ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped")
            .into_response();
    }
    st.metrics.count_request("/health", 200);
    Json(json!({"status": "ok"})).into_response()
}

pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    st.metrics.count_request("/metrics", 200);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.metrics.render(),
    )
        .into_response()
}

pub async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError::status(StatusCode::NOT_FOUND, format!("no route {}", uri.path())).into_response()
}

pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    ApiError::status(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not allowed on {}", uri.path()),
    )
    .into_response()
}
