//! The request bodies of `/v1/chat/completions` and `/v1/completions` as types
//! ([`ChatRequest`], [`CompletionRequest`], the fields they share in [`Common`]), and
//! [`parse`]: the body read into one, then every field checked by name into a [`Plan`]. A
//! field this server does not implement is refused when it asks for something, never ignored.

use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use nemotron::model::sampling::MAX_TOP_LOGPROBS;
use nemotron::model::Sampling;
use nemotron::{GenerateOptions, Message};
use serde::de::{DeserializeOwned, Deserializer};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::sync::atomic::Ordering;

/// Choices one request may ask for (prompts × `n`).
pub const MAX_CHOICES: usize = 64;
/// Stop strings one request may give.
pub const MAX_STOPS: usize = 16;

/// Which endpoint a request came to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Chat,
    Completion,
}

impl Kind {
    pub fn endpoint(self) -> &'static str {
        match self {
            Kind::Chat => "/v1/chat/completions",
            Kind::Completion => "/v1/completions",
        }
    }
}

/// A parsed, checked request.
#[derive(Debug)]
pub struct Plan {
    pub kind: Kind,
    pub prompts: Vec<Vec<u32>>,
    pub n: usize,
    pub opts: GenerateOptions,
    /// Seed of choice 0; choice `j` of a prompt uses `seed + j`.
    pub seed: u64,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Completions' `echo`: each choice's text starts with its prompt's (and with `logprobs`,
    /// its log-probabilities start with the prompt tokens'). With `max_tokens: 0` nothing is
    /// generated (`opts.max_new_tokens == 0`).
    pub echo: bool,
}

/// A field as the client sent it: absent (or `null`), of its type, or of another type — kept,
/// so that the refusal names the field (serde's own error would name a line and column).
#[derive(Debug, Clone)]
pub enum Field<T> {
    Absent,
    Given(T),
    Wrong(Value),
}

impl<T> Default for Field<T> {
    fn default() -> Self {
        Field::Absent
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        if v.is_null() {
            return Ok(Field::Absent);
        }
        Ok(match T::deserialize(&v) {
            Ok(t) => Field::Given(t),
            Err(_) => Field::Wrong(v),
        })
    }
}

impl Field<f64> {
    fn number(self, name: &str) -> Result<Option<f64>, ApiError> {
        match self {
            Field::Absent => Ok(None),
            Field::Given(x) => Ok(Some(x)),
            Field::Wrong(_) => Err(ApiError::invalid(name, format!("{name} must be a number"))),
        }
    }
}

impl Field<i64> {
    fn integer(self, name: &str) -> Result<Option<i64>, ApiError> {
        match self {
            Field::Absent => Ok(None),
            Field::Given(x) => Ok(Some(x)),
            Field::Wrong(v @ Value::Number(_)) => Err(ApiError::invalid(
                name,
                format!("{name} must be an integer, got {v}"),
            )),
            Field::Wrong(_) => Err(ApiError::invalid(
                name,
                format!("{name} must be an integer"),
            )),
        }
    }
}

impl Field<bool> {
    fn boolean(self, name: &str) -> Result<Option<bool>, ApiError> {
        match self {
            Field::Absent => Ok(None),
            Field::Given(b) => Ok(Some(b)),
            Field::Wrong(_) => Err(ApiError::invalid(
                name,
                format!("{name} must be true or false"),
            )),
        }
    }
}

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StreamOptions {
    pub include_usage: Field<bool>,
}

/// `chat_template_kwargs` (only `enable_thinking`; any other key is refused by name).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct TemplateKwargs {
    pub enable_thinking: Field<bool>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// A chat message: a role and a text content (a string or a list of text parts).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ChatMessage {
    pub role: Field<String>,
    pub content: Option<Value>,
}

/// The fields both endpoints share: model, sampling, budgets, stops, streaming; and the
/// OpenAI fields this server does not implement (refused unless they ask for nothing).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Common {
    pub model: Field<String>,
    pub temperature: Field<f64>,
    pub top_p: Field<f64>,
    pub top_k: Field<i64>,
    pub min_p: Field<f64>,
    pub repetition_penalty: Field<f64>,
    pub seed: Field<i64>,
    pub n: Field<i64>,
    pub best_of: Field<i64>,
    pub max_tokens: Field<i64>,
    pub stop: Field<Stop>,
    pub ignore_eos: Field<bool>,
    pub stop_token_ids: Field<Vec<Value>>,
    pub stream: Field<bool>,
    pub stream_options: Field<StreamOptions>,
    pub presence_penalty: Option<Value>,
    pub frequency_penalty: Option<Value>,
    pub logit_bias: Option<Value>,
    pub tools: Option<Value>,
    pub functions: Option<Value>,
    pub tool_choice: Option<Value>,
    pub response_format: Option<Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ChatRequest {
    #[serde(flatten)]
    pub common: Common,
    pub messages: Field<Vec<ChatMessage>>,
    pub max_completion_tokens: Field<i64>,
    pub chat_template_kwargs: Field<TemplateKwargs>,
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<Value>,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub common: Common,
    /// A string, a list of strings, a list of token ids or a list of such lists.
    pub prompt: Option<Value>,
    pub logprobs: Option<Value>,
    pub echo: Option<Value>,
    pub suffix: Option<Value>,
}

/// What [`Common`] checks to.
struct Checked {
    opts: GenerateOptions,
    seed: u64,
    n: usize,
    max_tokens: Option<usize>,
    stops: Vec<String>,
    stream: bool,
    include_usage: bool,
}

/// A field this server does not implement is refused when it asks for something.
fn unsupported_unless(
    v: &Option<Value>,
    name: &str,
    harmless: impl Fn(&Value) -> bool,
) -> Result<(), ApiError> {
    match v {
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

/// The output budget: the first of `fields` given (each checked ≥ 1).
fn max_tokens(fields: Vec<(&str, Field<i64>)>) -> Result<Option<usize>, ApiError> {
    let mut max = None;
    for (name, f) in fields {
        if let Some(m) = f.integer(name)? {
            if m < 1 {
                return Err(ApiError::invalid(
                    name,
                    format!("{name} must be ≥ 1, got {m}"),
                ));
            }
            max.get_or_insert(m as usize);
        }
    }
    Ok(max)
}

impl Common {
    /// The model, and the fields this server does not implement.
    fn refuse_unsupported(&self, st: &AppState) -> Result<(), ApiError> {
        match &self.model {
            Field::Absent => {}
            Field::Given(m) if *m == st.model_name => {}
            Field::Given(m) => {
                return Err(ApiError::invalid(
                    "model",
                    format!(
                        "the model {m:?} does not exist here; this server serves {:?}",
                        st.model_name
                    ),
                )
                .with_code("model_not_found"))
            }
            Field::Wrong(_) => return Err(ApiError::invalid("model", "model must be a string")),
        }
        let zero = |v: &Value| v.as_f64() == Some(0.0);
        unsupported_unless(&self.presence_penalty, "presence_penalty", zero)?;
        unsupported_unless(&self.frequency_penalty, "frequency_penalty", zero)?;
        unsupported_unless(&self.logit_bias, "logit_bias", |v| {
            v.as_object().is_some_and(Map::is_empty)
        })?;
        let empty = |v: &Value| v.as_array().is_some_and(Vec::is_empty);
        unsupported_unless(&self.tools, "tools", empty)?;
        unsupported_unless(&self.functions, "functions", empty)?;
        unsupported_unless(&self.tool_choice, "tool_choice", |v| {
            v.as_str() == Some("none")
        })?;
        unsupported_unless(&self.response_format, "response_format", |v| {
            v.get("type").and_then(Value::as_str) == Some("text")
        })
    }

    /// The rest, in order: sampling, seed, choices, the output budget (the first of
    /// `max_fields` given), stops, streaming.
    fn check(
        self,
        st: &AppState,
        max_fields: Vec<(&str, Field<i64>)>,
    ) -> Result<Checked, ApiError> {
        let mut s: Sampling = st.defaults.sampling();
        if let Some(t) = self.temperature.number("temperature")? {
            if !(t.is_finite() && t >= 0.0) {
                return Err(ApiError::invalid(
                    "temperature",
                    format!("temperature must be ≥ 0, got {t}"),
                ));
            }
            s.temperature = t as f32;
        }
        if let Some(p) = self.top_p.number("top_p")? {
            if !(p > 0.0 && p <= 1.0) {
                return Err(ApiError::invalid(
                    "top_p",
                    format!("top_p must be in (0, 1], got {p}"),
                ));
            }
            s.top_p = p as f32;
        }
        if let Some(k) = self.top_k.integer("top_k")? {
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
        if let Some(p) = self.min_p.number("min_p")? {
            if !(0.0..=1.0).contains(&p) {
                return Err(ApiError::invalid(
                    "min_p",
                    format!("min_p must be in [0, 1], got {p}"),
                ));
            }
            s.min_p = p as f32;
        }
        if let Some(r) = self.repetition_penalty.number("repetition_penalty")? {
            if !(r.is_finite() && r > 0.0) {
                return Err(ApiError::invalid(
                    "repetition_penalty",
                    format!("repetition_penalty must be > 0, got {r}"),
                ));
            }
            s.repetition_penalty = r as f32;
        }
        let seed = match self.seed.integer("seed")? {
            Some(x) => x as u64,
            None => random_seed(st),
        };
        let n = match self.n.integer("n")? {
            None => 1,
            Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => n as usize,
            Some(n) => {
                return Err(ApiError::invalid(
                    "n",
                    format!("n must be in 1..={MAX_CHOICES}, got {n}"),
                ))
            }
        };
        if let Some(b) = self.best_of.integer("best_of")? {
            if b as usize != n {
                return Err(ApiError::invalid(
                    "best_of",
                    "best_of other than n is not supported",
                ));
            }
        }
        let max_tokens = max_tokens(max_fields)?;
        let stops = match self.stop {
            Field::Absent => vec![],
            Field::Given(Stop::One(s)) => vec![s],
            Field::Given(Stop::Many(v)) => v,
            Field::Wrong(_) => {
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
        let mut stop_ids = if self.ignore_eos.boolean("ignore_eos")?.unwrap_or(false) {
            vec![]
        } else {
            st.defaults.eos_token_ids.clone()
        };
        match self.stop_token_ids {
            Field::Absent => {}
            Field::Given(a) => {
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
            Field::Wrong(_) => {
                return Err(ApiError::invalid(
                    "stop_token_ids",
                    "stop_token_ids must be a list of token ids",
                ))
            }
        }
        let stream = self.stream.boolean("stream")?.unwrap_or(false);
        let include_usage = match self.stream_options {
            Field::Absent => false,
            Field::Given(so) if stream => so
                .include_usage
                .boolean("include_usage")
                .map_err(|_| {
                    ApiError::invalid(
                        "stream_options",
                        "stream_options.include_usage must be true or false",
                    )
                })?
                .unwrap_or(false),
            Field::Given(_) => {
                return Err(ApiError::invalid(
                    "stream_options",
                    "stream_options needs stream: true",
                ))
            }
            Field::Wrong(_) => {
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
        Ok(Checked {
            opts,
            seed,
            n,
            max_tokens,
            stops,
            stream,
            include_usage,
        })
    }
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

impl ChatRequest {
    /// `logprobs` (a boolean) and `top_logprobs` (0–20, only with `logprobs: true`), as OpenAI
    /// takes them: `Some(top)` where the answer carries log-probabilities.
    fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        let on = match &self.logprobs {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(ApiError::invalid(
                    "logprobs",
                    format!("logprobs must be a boolean (got {v})"),
                ))
            }
        };
        let top = match &self.top_logprobs {
            None | Some(Value::Null) => 0,
            Some(v) => match v.as_u64() {
                Some(n) if n as usize <= MAX_TOP_LOGPROBS => n as usize,
                _ => {
                    return Err(ApiError::invalid(
                        "top_logprobs",
                        format!(
                            "top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS} (got {v})"
                        ),
                    ))
                }
            },
        };
        if top > 0 && !on {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ));
        }
        Ok(on.then_some(top))
    }

    /// The prompt rendered by the model's template.
    fn prompt(self, st: &AppState) -> Result<Vec<u32>, ApiError> {
        let tmpl = st.chat_template.as_ref().ok_or_else(|| {
            ApiError::invalid(
                "messages",
                "this model has no chat template: use /v1/completions",
            )
        })?;
        let msgs = match self.messages {
            Field::Given(a) if !a.is_empty() => a,
            Field::Given(_) => return Err(ApiError::invalid("messages", "messages is empty")),
            Field::Absent => return Err(ApiError::invalid("messages", "messages is required")),
            Field::Wrong(_) => {
                return Err(ApiError::invalid(
                    "messages",
                    "messages must be a list of messages",
                ))
            }
        };
        let mut out = Vec::with_capacity(msgs.len());
        for (i, m) in msgs.into_iter().enumerate() {
            let at = format!("messages[{i}]");
            let Field::Given(role) = m.role else {
                return Err(ApiError::invalid(
                    &format!("{at}.role"),
                    "each message needs a role",
                ));
            };
            if !matches!(
                role.as_str(),
                "system" | "developer" | "user" | "assistant" | "tool"
            ) {
                return Err(ApiError::invalid(
                    &format!("{at}.role"),
                    format!(
                        "unknown role {role:?} (expected system, developer, user, assistant or tool)"
                    ),
                ));
            }
            let role = if role == "developer" {
                "system"
            } else {
                role.as_str()
            };
            out.push(Message::new(role, &content_text(m.content.as_ref(), &at)?));
        }
        let reasoning = match self.chat_template_kwargs {
            Field::Absent => None,
            Field::Given(kw) => {
                if let Some(k) = kw.other.keys().next() {
                    return Err(ApiError::invalid(
                        "chat_template_kwargs",
                        format!("chat_template_kwargs.{k} is not supported (only enable_thinking)"),
                    ));
                }
                kw.enable_thinking.boolean("enable_thinking").map_err(|_| {
                    ApiError::invalid(
                        "chat_template_kwargs",
                        "chat_template_kwargs.enable_thinking must be true or false",
                    )
                })?
            }
            Field::Wrong(_) => {
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

impl CompletionRequest {
    /// `logprobs` (0–20: the most likely tokens listed with each token's own): `Some(n)` where
    /// the answer carries log-probabilities.
    fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match &self.logprobs {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n as usize <= MAX_TOP_LOGPROBS => Ok(Some(n as usize)),
                _ => Err(ApiError::invalid(
                    "logprobs",
                    format!("logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS} (got {v})"),
                )),
            },
        }
    }

    /// `echo` (a boolean).
    fn echo(&self) -> Result<bool, ApiError> {
        match &self.echo {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(ApiError::invalid(
                "echo",
                format!("echo must be true or false (got {v})"),
            )),
        }
    }

    /// The completion-only fields this server does not implement.
    fn refuse_unsupported(&self) -> Result<(), ApiError> {
        unsupported_unless(&self.suffix, "suffix", |v| v.as_str() == Some(""))
    }

    /// The prompts (text encoded, ids checked).
    fn prompts(self, st: &AppState) -> Result<Vec<Vec<u32>>, ApiError> {
        let enc = |s: &str| {
            st.tokenizer
                .encode(s, true)
                .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
        };
        let bad = || {
            ApiError::invalid("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of such lists")
        };
        match self.prompt {
            None | Some(Value::Null) => Err(ApiError::invalid("prompt", "prompt is required")),
            Some(Value::String(s)) => Ok(vec![enc(&s)?]),
            Some(Value::Array(a)) if a.is_empty() => {
                Err(ApiError::invalid("prompt", "prompt is empty"))
            }
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
                .iter()
                .map(|s| enc(s.as_str().unwrap_or_default()))
                .collect(),
            Some(Value::Array(a)) if a.iter().all(Value::is_number) => {
                Ok(vec![token_ids(&a, "prompt", st.vocab_size)?])
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
}

/// The body read as the endpoint's request type, every field checked, the prompts tokenized and
/// fitted to the server's limits (choices, sequences held, context length).
pub fn parse(
    st: &AppState,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Result<Plan, ApiError> {
    let body = body.map_err(|r| ApiError::status(r.status(), r.body_text()))?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    let shape = |e: serde_json::Error| ApiError::bad_request(format!("the body: {e}"));
    // The order of the checks: the model and every unsupported field, the shared fields, the
    // prompt (so a request with several faults is refused for the same one on both endpoints).
    let (checked, prompts, echo, score_only) = match kind {
        Kind::Chat => {
            let mut r = ChatRequest::deserialize(&v).map_err(shape)?;
            r.common.refuse_unsupported(st)?;
            let logprobs = r.logprobs()?;
            let common = std::mem::take(&mut r.common);
            let max_fields = vec![
                (
                    "max_completion_tokens",
                    std::mem::take(&mut r.max_completion_tokens),
                ),
                ("max_tokens", common.max_tokens.clone()),
            ];
            let mut checked = common.check(st, max_fields)?;
            checked.opts.logprobs = logprobs;
            (checked, vec![r.prompt(st)?], false, false)
        }
        Kind::Completion => {
            let mut r = CompletionRequest::deserialize(&v).map_err(shape)?;
            r.common.refuse_unsupported(st)?;
            r.refuse_unsupported()?;
            let logprobs = r.logprobs()?;
            let echo = r.echo()?;
            let mut common = std::mem::take(&mut r.common);
            // `max_tokens: 0` with `echo` scores the prompt without generating (elsewhere a
            // budget is at least 1).
            let score_only = echo && matches!(common.max_tokens, Field::Given(0));
            if score_only {
                common.max_tokens = Field::Absent;
            }
            let max_fields = vec![("max_tokens", common.max_tokens.clone())];
            let mut checked = common.check(st, max_fields)?;
            checked.opts.logprobs = logprobs;
            if echo && checked.stream {
                return Err(ApiError::invalid(
                    "echo",
                    "echo is not supported with stream by this server",
                ));
            }
            (checked, r.prompts(st)?, echo, score_only)
        }
    };
    let Checked {
        mut opts,
        seed,
        n,
        max_tokens,
        stops,
        stream,
        include_usage,
    } = checked;
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
    opts.max_new_tokens = if score_only {
        0
    } else {
        max_tokens.unwrap_or(budget)
    };
    Ok(Plan {
        kind,
        prompts,
        n,
        opts,
        seed,
        stops,
        stream,
        include_usage,
        echo,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A field reads as absent (missing or `null`), given (its type), or wrong (kept to be named):
    /// an integer field given 1.5 or a string is wrong, never a failed body.
    #[test]
    fn fields_keep_what_the_client_sent() {
        let r = CompletionRequest::deserialize(&json!({
            "prompt": "x", "max_tokens": 1.5, "n": null, "seed": 7, "stop": ["a", "b"],
            "stream_options": {"include_usage": "yes"}, "temperature": "hot"
        }))
        .unwrap();
        let c = r.common;
        assert!(matches!(c.max_tokens, Field::Wrong(ref v) if v == &json!(1.5)));
        assert!(matches!(c.n, Field::Absent));
        assert!(matches!(c.best_of, Field::Absent));
        assert!(matches!(c.seed, Field::Given(7)));
        assert!(matches!(c.stop, Field::Given(Stop::Many(ref v)) if v.len() == 2));
        assert!(matches!(c.temperature, Field::Wrong(_)));
        let Field::Given(so) = c.stream_options else {
            panic!("stream_options is an object")
        };
        assert!(matches!(so.include_usage, Field::Wrong(_)));
        let e = Field::<i64>::Wrong(json!(1.5))
            .integer("max_tokens")
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(e.message.contains("1.5"), "{}", e.message);
        let chat = ChatRequest::deserialize(&json!({
            "messages": [{"role": "user", "content": "hi"}],
            "chat_template_kwargs": {"enable_thinking": true, "tools": []}
        }))
        .unwrap();
        let Field::Given(kw) = chat.chat_template_kwargs else {
            panic!("kwargs is an object")
        };
        assert!(matches!(kw.enable_thinking, Field::Given(true)));
        assert_eq!(kw.other.keys().collect::<Vec<_>>(), ["tools"]);
    }
}
