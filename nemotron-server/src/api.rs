//! The generation endpoints (`/v1/chat/completions`, `/v1/completions`): a request parsed and
//! checked ([`crate::request`]), its choices run ([`crate::choice`]), answered whole or streamed
//! ([`crate::sse`]).

use crate::choice::submit;
use crate::error::ApiError;
use crate::logprobs;
use crate::request::{parse, Kind, Plan};
use crate::sse::{streamed, usage};
use crate::state::AppState;
use crate::worker::Cmd;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use nemotron::model::TokenLogprobs;
use nemotron::TokenStream;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

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
/// An echoed prompt: its text (its tokens decoded as generated text is) and, with `logprobs`,
/// its tokens' entries (the first without values).
struct Echo {
    text: String,
    tokens: Vec<(u32, Option<TokenLogprobs>, usize)>,
}

/// The prompt's [`Echo`]; its log-probabilities scored by the engine's worker.
async fn echo(st: &AppState, prompt: &[u32], logprobs: Option<usize>) -> Result<Echo, ApiError> {
    let err = |e: String| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e);
    let mut ts = TokenStream::new(st.tokenizer.clone());
    let mut text = String::new();
    let mut offsets = Vec::with_capacity(prompt.len());
    for &t in prompt {
        offsets.push(text.chars().count());
        if let Some(piece) = ts.push(t).map_err(|e| err(e.to_string()))? {
            text.push_str(&piece);
        }
    }
    if let Some(piece) = ts.finish().map_err(|e| err(e.to_string()))? {
        text.push_str(&piece);
    }
    let mut values: Vec<Option<TokenLogprobs>> = vec![None; prompt.len()];
    if let Some(n) = logprobs {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let cmd = Cmd::Score {
            prompt: prompt.to_vec(),
            n,
            tx,
        };
        let gone = || ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped");
        st.cmd
            .lock()
            .map_err(|_| err("engine channel poisoned".into()))?
            .send(cmd)
            .map_err(|_| gone())?;
        let scored = rx.await.map_err(|_| gone())?.map_err(err)?;
        for (v, lp) in values.iter_mut().skip(1).zip(scored) {
            *v = Some(lp);
        }
    }
    let tokens = prompt
        .iter()
        .zip(values)
        .zip(offsets)
        .map(|((&t, v), o)| (t, v, o))
        .collect();
    Ok(Echo { text, tokens })
}

async fn run(st: Arc<AppState>, plan: Plan, arrived: Instant) -> Result<Response, ApiError> {
    let prompt_tokens: usize = plan.prompts.iter().map(Vec::len).sum();
    let mut echoes = vec![];
    if plan.echo {
        for p in &plan.prompts {
            echoes.push(echo(&st, p, plan.opts.logprobs).await?);
        }
    }
    if plan.echo && plan.opts.max_new_tokens == 0 {
        // Scoring only: nothing is generated.
        let key = st
            .next_key
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut choices = vec![];
        for (pi, e) in echoes.iter().enumerate() {
            for j in 0..plan.n {
                let logprobs = match plan.opts.logprobs {
                    None => Value::Null,
                    Some(_) => echo_object(&st, e, &[], 0),
                };
                choices.push(json!({"index": pi * plan.n + j, "text": e.text, "logprobs": logprobs, "finish_reason": "length"}));
            }
        }
        return Ok(Json(json!({
            "id": format!("cmpl-{key}"), "object": "text_completion", "created": now_unix(),
            "model": st.model_name.clone(), "choices": choices, "usage": usage(prompt_tokens, 0),
        }))
        .into_response());
    }
    let mut runs = submit(&st, &plan, arrived)?;
    let key = runs.first().map_or(0, |r| r.key);
    let id = match plan.kind {
        Kind::Chat => format!("chatcmpl-{key}"),
        Kind::Completion => format!("cmpl-{key}"),
    };
    let created = now_unix();
    let model = st.model_name.clone();
    if plan.stream {
        return Ok(streamed(
            st.tokenizer.clone(),
            runs,
            plan.kind,
            plan.include_usage,
            id,
            created,
            model,
            prompt_tokens,
        ));
    }
    let mut choices = vec![];
    let mut completion = 0;
    for r in &mut runs {
        let mut text = String::new();
        let mut finish = "length";
        // Each token's log-probabilities with the offset (in characters) of the text emitted
        // with it.
        let mut lps = vec![];
        while let Some(p) = r.next().await {
            let p = p?;
            if let Some(lp) = p.logprobs {
                lps.push((lp, text.chars().count()));
            }
            text.push_str(&p.text);
            if let Some(f) = p.finish {
                finish = f;
            }
        }
        completion += r.tokens;
        let logprobs = match (plan.opts.logprobs, plan.kind) {
            (None, _) => Value::Null,
            (Some(_), Kind::Chat) => {
                let content: Vec<Value> = lps
                    .iter()
                    .map(|(lp, _)| logprobs::chat_entry(&st.tokenizer, lp))
                    .collect();
                json!({ "content": content })
            }
            (Some(_), Kind::Completion) => match echoes.get(r.index / plan.n) {
                Some(e) => echo_object(&st, e, &lps, e.text.chars().count()),
                None => logprobs::completion_object(&st.tokenizer, &lps),
            },
        };
        if let Some(e) = echoes.get(r.index / plan.n) {
            text.insert_str(0, &e.text);
        }
        choices.push(match plan.kind {
            Kind::Chat => json!({"index": r.index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": finish}),
            Kind::Completion => json!({"index": r.index, "text": text, "logprobs": logprobs, "finish_reason": finish}),
        });
    }
    let object = match plan.kind {
        Kind::Chat => "chat.completion",
        Kind::Completion => "text_completion",
    };
    Ok(Json(json!({
        "id": id, "object": object, "created": created, "model": model,
        "choices": choices, "usage": usage(prompt_tokens, completion),
    }))
    .into_response())
}

/// The legacy `logprobs` object of an echoed prompt's tokens then the generated ones (`lps`, their
/// offsets in the generated text, moved past the prompt's `shift` characters).
fn echo_object(st: &AppState, e: &Echo, lps: &[(TokenLogprobs, usize)], shift: usize) -> Value {
    let mut entries: Vec<logprobs::Entry> = e
        .tokens
        .iter()
        .map(|(t, v, o)| logprobs::Entry {
            token: *t,
            lp: v.as_ref(),
            offset: *o,
        })
        .collect();
    entries.extend(lps.iter().map(|(lp, o)| logprobs::Entry {
        token: lp.token,
        lp: Some(lp),
        offset: o + shift,
    }));
    logprobs::completion_entries(&st.tokenizer, &entries)
}
