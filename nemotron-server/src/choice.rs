//! One choice of a request as it runs: submitted to the engine's worker, its tokens received,
//! detokenized, cut at stop strings and timed; dropping it cancels it on the engine.

use crate::error::ApiError;
use crate::request::Plan;
use crate::state::AppState;
use crate::stop::StopMatcher;
use crate::worker::{Cmd, Out};
use axum::http::StatusCode;
use nemotron::model::TokenLogprobs;
use nemotron::StopReason;
use nemotron::{TokenStream, Tokenizer};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// One choice's tokens as they arrive: detokenized, stop strings applied, timed. Dropping it
/// cancels the request on the engine (a client that left frees its slot).
pub struct ChoiceRun {
    pub index: usize,
    pub key: u64,
    rx: UnboundedReceiver<Out>,
    text: TokenStream<Arc<Tokenizer>>,
    stop: StopMatcher,
    pub tokens: usize,
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
pub struct Piece {
    pub text: String,
    pub finish: Option<&'static str>,
    /// Whether a token arrived with it (streams send one chunk per token).
    pub token: bool,
    /// The token's log-probabilities, where the request asked for them
    /// ([`crate::logprobs`] writes them in the endpoint's shape).
    pub logprobs: Option<TokenLogprobs>,
}

fn finish_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::Stop(_) => "stop",
        StopReason::MaxTokens | StopReason::ContextFull => "length",
    }
}

impl ChoiceRun {
    /// The next piece; `None` once finished.
    pub async fn next(&mut self) -> Option<Result<Piece, ApiError>> {
        if self.finished {
            return None;
        }
        let out = self.rx.recv().await;
        let internal =
            |e: nemotron::Error| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
        let mut token = false;
        let mut logprobs = None;
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
            Some(Out::Token(t, stop, lp)) => {
                logprobs = lp;
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
                logprobs,
            }));
        }
        let Some(reason) = ended else {
            return Some(Ok(Piece {
                text,
                finish: None,
                token,
                logprobs,
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
            logprobs,
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
pub fn submit(
    st: &Arc<AppState>,
    plan: &Plan,
    arrived: Instant,
) -> Result<Vec<ChoiceRun>, ApiError> {
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
