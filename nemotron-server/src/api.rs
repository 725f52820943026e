//! The generation endpoints (`/v1/chat/completions`, `/v1/completions`): a request parsed and
//! checked ([`crate::request`]), its choices run ([`crate::choice`]), answered whole or streamed
//! ([`crate::sse`]).

use crate::choice::submit;
use crate::error::ApiError;
use crate::logprobs;
use crate::request::{parse, Kind, Plan};
use crate::sse::{streamed, usage};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
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
            (Some(_), Kind::Completion) => logprobs::completion_object(&st.tokenizer, &lps),
        };
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
