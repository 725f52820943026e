//! The streamed answer as Server-Sent Events, one chunk per token per choice as OpenAI sends
//! them, and the usage object both answers carry.

use crate::choice::ChoiceRun;
use crate::logprobs;
use crate::request::Kind;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, BoxStream, StreamExt};
use nemotron::Tokenizer;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// `usage` of a response or of a closing chunk.
pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// The events of `runs` (choices of a `kind` request `id`, created at `created` for `model`
/// over `prompt_tokens` prompt tokens), ended by the usage chunk when `include_usage` and by
/// `[DONE]`. `tok` writes the tokens' texts of their log-probabilities.
#[allow(clippy::too_many_arguments)]
pub fn streamed(
    tok: Arc<Tokenizer>,
    runs: Vec<ChoiceRun>,
    kind: Kind,
    include_usage: bool,
    id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
) -> Response {
    // Streaming: one chunk per token per choice (text possibly empty while a character or a
    // possible stop string is incomplete), a closing chunk with the finish reason and the usage
    // so far, the usage chunk OpenAI sends with `include_usage`, then `[DONE]`.
    let object = match kind {
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
    let per_choice: Vec<BoxStream<'static, Event>> = runs
        .into_iter()
        .map(|r| {
            let chunk = chunk.clone();
            let completion = completion.clone();
            let opening = (kind == Kind::Chat).then(|| {
                chunk(json!([{"index": r.index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]), None)
            });
            let tok = tok.clone();
            let body = stream::unfold(Some((r, 0usize)), move |state| {
                let chunk = chunk.clone();
                let completion = completion.clone();
                let tok = tok.clone();
                async move {
                    // `offset`: the characters of this choice's text sent so far.
                    let (mut r, mut offset) = state?;
                    let i = r.index;
                    let p = r.next().await?;
                    let ev = match p {
                        Err(e) => {
                            let ev = Event::default().data(e.body().to_string());
                            return Some((vec![ev], None));
                        }
                        Ok(p) => p,
                    };
                    // A chunk's token carries its log-probabilities where asked: chat's
                    // `content` entry, or the legacy object of the one token at the offset of
                    // the text emitted with it.
                    let lp = match (&ev.logprobs, kind) {
                        (None, _) => Value::Null,
                        (Some(lp), Kind::Chat) => {
                            json!({ "content": [logprobs::chat_entry(&tok, lp)] })
                        }
                        (Some(lp), Kind::Completion) => {
                            logprobs::completion_object(&tok, &[(lp.clone(), offset)])
                        }
                    };
                    offset += ev.text.chars().count();
                    let text = |t: &str| match kind {
                        Kind::Chat => json!({"index": i, "delta": {"content": t}, "logprobs": lp, "finish_reason": null}),
                        Kind::Completion => json!({"index": i, "text": t, "logprobs": lp, "finish_reason": null}),
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
                    Some((out, Some((r, offset))))
                }
            })
            .flat_map(stream::iter);
            stream::iter(opening).chain(body).boxed()
        })
        .collect();
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
    Sse::new(events).keep_alive(keep).into_response()
}
