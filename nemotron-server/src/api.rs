//! The OpenAI-compatible endpoints: the handlers (a request is parsed and checked by
//! [`crate::request`]), the per-choice token streams, and the response and Server-Sent-Events
//! bodies.

use crate::error::ApiError;
use crate::request::{parse, Kind, Plan};
use crate::state::AppState;
use crate::stop::StopMatcher;
use crate::worker::{Cmd, Out};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, BoxStream, StreamExt};
use nemotron::StopReason;
use nemotron::{TokenStream, Tokenizer};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

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
