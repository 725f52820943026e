//! The engine thread: owns the model and the decode engine, takes submissions and cancellations
//! from the HTTP side over a channel, steps the engine while anything is live and sends each
//! request its tokens. A request whose receiver is gone (the client left) is cancelled at its next
//! token; an explicit cancel (a dropped response) frees its slot before the next step.

use crate::metrics::Metrics;
use nemotron::model::{Engine, EngineOptions, RequestId, TokenLogprobs};
use nemotron::{GenerateOptions, StopReason, TextModel};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// What the engine thread sends a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    /// A token, with the stop reason if it was the last, and its log-probabilities where the
    /// request asked for them.
    Token(u32, Option<StopReason>, Option<TokenLogprobs>),
    /// The request ended without another token.
    Done(StopReason),
    /// The engine refused the request when it was submitted (one line).
    Refused(String),
    /// The engine failed while running it (one line).
    Failed(String),
}

pub enum Cmd {
    Submit {
        key: u64,
        prompt: Vec<u32>,
        opts: GenerateOptions,
        tx: UnboundedSender<Out>,
    },
    Cancel(u64),
    /// Scores a prompt (`echo` with `logprobs`): each token's log-probability given the ones
    /// before it ([`nemotron::model::prompt_logprobs`]), computed between engine steps.
    Score {
        prompt: Vec<u32>,
        n: usize,
        tx: tokio::sync::oneshot::Sender<Result<Vec<TokenLogprobs>, String>>,
    },
    Shutdown,
}

/// Counters the HTTP side reads.
#[derive(Default)]
pub struct Load {
    /// Requests submitted and not yet finished (waiting or running).
    pub live: AtomicUsize,
    /// Set when the engine thread has stopped.
    pub stopped: AtomicBool,
}

struct Live {
    key: u64,
    tx: UnboundedSender<Out>,
}

/// Runs the engine until `Shutdown` or until every sender is gone.
pub fn run<'m>(
    tm: &'m TextModel,
    mut engine: Engine<'m>,
    opts: EngineOptions,
    rx: mpsc::Receiver<Cmd>,
    load: Arc<Load>,
    metrics: Arc<Metrics>,
) {
    let mut live: HashMap<RequestId, Live> = HashMap::new();
    let mut ids: HashMap<u64, RequestId> = HashMap::new();
    let finish = |live: &mut HashMap<RequestId, Live>, ids: &mut HashMap<u64, RequestId>, id| {
        if let Some(l) = live.remove(&id) {
            ids.remove(&l.key);
            load.live.fetch_sub(1, Ordering::SeqCst);
        }
    };
    'outer: loop {
        let first = if engine.is_idle() {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => break,
            }
        } else {
            None
        };
        for cmd in first.into_iter().chain(rx.try_iter()) {
            match cmd {
                Cmd::Submit {
                    key,
                    prompt,
                    opts,
                    tx,
                } => match engine.submit(&prompt, opts) {
                    Ok(id) => {
                        metrics.prompt_tokens.inc_by(prompt.len() as u64);
                        live.insert(id, Live { key, tx });
                        ids.insert(key, id);
                    }
                    Err(e) => {
                        let _ = tx.send(Out::Refused(e.to_string()));
                        load.live.fetch_sub(1, Ordering::SeqCst);
                    }
                },
                Cmd::Cancel(key) => {
                    if let Some(id) = ids.get(&key).copied() {
                        engine.cancel(id);
                        finish(&mut live, &mut ids, id);
                    }
                }
                Cmd::Score { prompt, n, tx } => {
                    let scored = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        nemotron::model::prompt_logprobs(&tm.model, &prompt, n)
                    }));
                    let _ = tx.send(match scored {
                        Ok(Ok(v)) => Ok(v),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err("scoring the prompt panicked".into()),
                    });
                }
                Cmd::Shutdown => break 'outer,
            }
        }
        if engine.is_idle() {
            continue;
        }
        let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| engine.step()));
        let events = match stepped {
            Ok(Ok(ev)) => ev,
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    Err(p) => format!(
                        "the engine panicked: {}",
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default()
                    ),
                    Ok(Ok(_)) => unreachable!(),
                };
                eprintln!("engine step failed: {why}");
                // Every live request fails; the slots start over.
                for (_, l) in live.drain() {
                    let _ = l.tx.send(Out::Failed(why.clone()));
                    load.live.fetch_sub(1, Ordering::SeqCst);
                }
                ids.clear();
                match Engine::new(&tm.model, opts.clone()) {
                    Ok(e) => engine = e,
                    Err(e) => {
                        eprintln!("engine: {e}");
                        break;
                    }
                }
                continue;
            }
        };
        metrics.decode_steps.inc();
        // Before the tokens go out, so a client that has its last token sees the gauges after it.
        metrics.queue_depth.set(engine.waiting() as i64);
        metrics.batch_size.set(engine.running() as i64);
        for e in events {
            let Some(l) = live.get(&e.id) else { continue };
            let out = match (e.token, e.stop) {
                (Some(t), s) => Out::Token(t, s, e.logprobs),
                (None, Some(s)) => Out::Done(s),
                (None, None) => continue,
            };
            if e.token.is_some() {
                metrics.generation_tokens.inc();
            }
            let gone = l.tx.send(out).is_err();
            if gone && e.stop.is_none() {
                engine.cancel(e.id);
            }
            if gone || e.stop.is_some() {
                finish(&mut live, &mut ids, e.id);
            }
        }
        metrics.queue_depth.set(engine.waiting() as i64);
        metrics.batch_size.set(engine.running() as i64);
    }
    metrics.queue_depth.set(0);
    metrics.batch_size.set(0);
    for (_, l) in live.drain() {
        let _ = l.tx.send(Out::Failed("the server is shutting down".into()));
    }
    load.stopped.store(true, Ordering::SeqCst);
}
