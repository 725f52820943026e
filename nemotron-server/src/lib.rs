//! An OpenAI-compatible HTTP server on the nemotron decode engine.
//!
//! `POST /v1/chat/completions` (the checkpoint's chat template; `chat_template_kwargs:
//! {"enable_thinking": bool}` sets its reasoning switch as vLLM accepts it), `POST /v1/completions`
//! (text or token-id prompts), `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text).
//! `stream: true` answers with Server-Sent Events in OpenAI's chunk format, ending `data: [DONE]`.
//!
//! Why axum on tokio: the HTTP side is I/O and waiting, the model is one thread's work. Requests
//! are parsed, tokenized and detokenized on tokio tasks; one engine thread owns the model and the
//! decode engine ([`nemotron::model::Engine`]) and steps it while anything is live, so concurrent
//! requests share one continuously batched decode. Each request's tokens come back over its own
//! channel; a response that is dropped (the client left) cancels its request on the engine, which
//! frees the slot before the next step. The number of live sequences is bounded (slots + queue):
//! past that a request gets 429 with a JSON error, never an unbounded wait.
//!
//! ```no_run
//! use nemotron::{DType, TextModel};
//! use nemotron_server::{Server, ServerOptions};
//!
//! let dev = burn::tensor::Device::flex();
//! let server = Server::start(
//!     move || TextModel::load("/models/nemotron-3-nano", &dev, DType::F32.burn()),
//!     ServerOptions::new("nemotron-3-nano"),
//!     "127.0.0.1:8000",
//! )?;
//! println!("listening on http://{}", server.addr());
//! server.wait();
//! # Ok::<(), nemotron_server::ServerError>(())
//! ```
// Library code takes no panic from data: every unwrap/expect is an error, or allowed where it
// stands with the invariant that makes it safe written beside it.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
pub mod choice;
pub mod error;
pub mod info;
pub mod logprobs;
pub mod metrics;
pub mod request;
pub mod sse;
pub mod state;
pub mod stop;
pub mod worker;

use axum::routing::{get, post};
use axum::Router;
use metrics::Metrics;
use nemotron::model::{EngineOptions, SlotMemory};
pub use nemotron::model::{KvCacheDtype, SsmCacheDtype};
use nemotron::{ChatTemplate, GenerationDefaults, TextModel, Tokenizer};
use state::AppState;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use worker::{Cmd, Load};

pub use error::ApiError;

/// Context a slot holds when neither `--context-length` nor a smaller `max_position_embeddings`
/// says otherwise (slots are allocated up front: `max_batch ×` this many tokens of KV cache).
pub const DEFAULT_CONTEXT: usize = 8192;

/// How the server is sized.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The name clients pass as `model` (and `/v1/models` lists).
    pub model_name: String,
    /// Sequences decoded together (state slots); unless `slot_memory` sizes them.
    pub max_batch: usize,
    /// Size the slots from device memory instead (as many as fit, at most
    /// [`nemotron::model::MAX_SLOTS`]); `max_batch` is then not read.
    pub slot_memory: Option<SlotMemory>,
    /// Requests that may wait for a slot; past that, 429.
    pub max_queue: usize,
    /// Tokens per sequence (prompt + output); default: the config's `max_position_embeddings`,
    /// at most [`DEFAULT_CONTEXT`].
    pub context_length: Option<usize>,
    /// Replay captured decode steps where the device has graphs (CUDA).
    pub graphs: bool,
    /// Tokens one engine step runs at most, decode rows first, then prompt pieces (vLLM's
    /// `--max-num-batched-tokens`; 0: no limit, every admitted prompt prefilled whole).
    pub step_tokens: usize,
    /// The most tokens of one prompt a step prefills (0: no limit): longer prompts are admitted
    /// over several steps while the running streams keep decoding.
    pub prefill_chunk: usize,
    /// How the slots hold keys and values (`--kv-cache-dtype`): the activation dtype, or E4M3
    /// codes with the checkpoint's scales (half the KV bytes; refused by name where a layer
    /// cannot hold it).
    pub kv_cache: KvCacheDtype,
    /// How the slots hold the Mamba layers' SSM state (`--mamba-ssm-cache-dtype`): f32, or bf16
    /// (half the state bytes; refused by name where a layer's state size is odd).
    pub ssm_cache: SsmCacheDtype,
}

impl ServerOptions {
    pub fn new(model_name: &str) -> Self {
        ServerOptions {
            model_name: model_name.into(),
            max_batch: 16,
            slot_memory: None,
            max_queue: 256,
            context_length: None,
            graphs: true,
            step_tokens: 0,
            prefill_chunk: 0,
            kv_cache: KvCacheDtype::Auto,
            ssm_cache: SsmCacheDtype::F32,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Load(#[from] nemotron::Error),
    #[error("cannot listen on {addr}: {reason}")]
    Bind { addr: String, reason: String },
    #[error("{0}")]
    Options(String),
    #[error("the engine thread stopped while starting: {0}")]
    Engine(String),
}

/// What the engine thread reports once the model is loaded.
struct Ready {
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    defaults: GenerationDefaults,
    vocab_size: usize,
    context_length: usize,
    slot_bytes: usize,
    /// The slots the engine has (from `max_batch` or the slot memory).
    max_batch: usize,
}

/// A running server: the HTTP side on a tokio runtime, the model on the engine thread.
/// Dropping it shuts both down.
pub struct Server {
    addr: SocketAddr,
    cmd: mpsc::Sender<Cmd>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    http: Option<JoinHandle<()>>,
    engine: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `addr` (port 0: any free port), loads the model with `load` on the engine thread
    /// (the model never leaves it), then serves. Returns once requests can be answered.
    pub fn start<F>(
        load: F,
        opts: ServerOptions,
        addr: impl ToSocketAddrs,
    ) -> Result<Server, ServerError>
    where
        F: FnOnce() -> Result<TextModel, nemotron::Error> + Send + 'static,
    {
        if opts.max_batch == 0 && opts.slot_memory.is_none() {
            return Err(ServerError::Options(
                "--max-batch must be at least 1".into(),
            ));
        }
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| ServerError::Bind {
                addr: "?".into(),
                reason: e.to_string(),
            })?
            .collect();
        let listener = std::net::TcpListener::bind(&addrs[..]).map_err(|e| ServerError::Bind {
            addr: format!("{addrs:?}"),
            reason: e.to_string(),
        })?;
        let local = listener.local_addr().map_err(|e| ServerError::Bind {
            addr: format!("{addrs:?}"),
            reason: e.to_string(),
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| ServerError::Bind {
                addr: local.to_string(),
                reason: e.to_string(),
            })?;

        let (cmd_tx, cmd_rx) = mpsc::channel::<Cmd>();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<Ready, ServerError>>(1);
        let load_state = Arc::new(Load::default());
        let metrics = Arc::new(Metrics::new());
        let engine = {
            let (load_state, metrics, opts) = (load_state.clone(), metrics.clone(), opts.clone());
            std::thread::Builder::new()
                .name("nemotron-engine".into())
                .spawn(move || engine_thread(load, opts, cmd_rx, ready_tx, load_state, metrics))
                .map_err(|e| ServerError::Engine(e.to_string()))?
        };
        let ready = match ready_rx.recv() {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                let _ = engine.join();
                return Err(e);
            }
            Err(_) => {
                let why = match engine.join() {
                    Err(p) => p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "it panicked".into()),
                    Ok(()) => "it exited".into(),
                };
                return Err(ServerError::Engine(why));
            }
        };
        eprintln!(
            "engine: {} slots × {} tokens of context ({:.1} MiB of state, KV cache {}, SSM state \
             {}{}), queue {}",
            ready.max_batch,
            ready.context_length,
            ready.slot_bytes as f64 / (1 << 20) as f64,
            opts.kv_cache,
            opts.ssm_cache,
            match opts.slot_memory {
                Some(m) => format!(", sized from slot memory {m}"),
                None => String::new(),
            },
            opts.max_queue
        );
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let state = Arc::new(AppState {
            model_name: opts.model_name.clone(),
            tokenizer: Arc::new(ready.tokenizer),
            chat_template: ready.chat_template,
            defaults: ready.defaults,
            vocab_size: ready.vocab_size,
            context_length: ready.context_length,
            max_batch: ready.max_batch,
            max_queue: opts.max_queue,
            cmd: Mutex::new(cmd_tx.clone()),
            load: load_state,
            metrics,
            next_key: AtomicU64::new(1),
            created,
        });
        let app = router(state);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (up_tx, up_rx) = mpsc::sync_channel::<Result<(), String>>(1);
        let http = std::thread::Builder::new()
            .name("nemotron-http".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = up_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = up_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    let _ = up_tx.send(Ok(()));
                    let served = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = stop_rx.await;
                        })
                        .await;
                    if let Err(e) = served {
                        eprintln!("http: {e}");
                    }
                });
            })
            .map_err(|e| ServerError::Engine(e.to_string()))?;
        match up_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(ServerError::Bind {
                    addr: local.to_string(),
                    reason: e,
                })
            }
            Err(_) => {
                return Err(ServerError::Bind {
                    addr: local.to_string(),
                    reason: "the HTTP thread stopped".into(),
                })
            }
        }
        Ok(Server {
            addr: local,
            cmd: cmd_tx,
            shutdown: Some(stop_tx),
            http: Some(http),
            engine: Some(engine),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until the process ends.
    pub fn wait(mut self) {
        if let Some(h) = self.http.take() {
            let _ = h.join();
        }
    }

    /// Stops accepting, ends live requests and joins both threads.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        let _ = self.cmd.send(Cmd::Shutdown);
        if let Some(h) = self.engine.take() {
            let _ = h.join();
        }
        if let Some(h) = self.http.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn engine_thread<F>(
    load: F,
    opts: ServerOptions,
    rx: mpsc::Receiver<Cmd>,
    ready: mpsc::SyncSender<Result<Ready, ServerError>>,
    load_state: Arc<Load>,
    metrics: Arc<Metrics>,
) where
    F: FnOnce() -> Result<TextModel, nemotron::Error>,
{
    let fail = |e: ServerError| {
        load_state.stopped.store(true, Ordering::SeqCst);
        let _ = ready.send(Err(e));
    };
    let mut tm = match load() {
        Ok(tm) => tm,
        Err(e) => return fail(e.into()),
    };
    tm.model = match tm
        .model
        .with_kv_cache(opts.kv_cache)
        .and_then(|m| m.with_ssm_cache(opts.ssm_cache))
    {
        Ok(m) => m,
        Err(e) => return fail(ServerError::Load(e.into())),
    };
    let cfg = tm.model.config();
    let max_pos = cfg.max_position_embeddings;
    let context_length = match (opts.context_length, max_pos) {
        (Some(c), Some(m)) if c > m => {
            return fail(ServerError::Options(format!(
                "--context-length {c} is past the model's max_position_embeddings {m}"
            )))
        }
        (Some(0), _) => {
            return fail(ServerError::Options(
                "--context-length must be at least 2".into(),
            ))
        }
        (Some(c), _) => c,
        (None, Some(m)) => m.min(DEFAULT_CONTEXT),
        (None, None) => DEFAULT_CONTEXT,
    };
    let mut eopts = match opts.slot_memory {
        None => EngineOptions::new(opts.max_batch, context_length),
        Some(m) => {
            match m
                .budget(tm.model.device())
                .and_then(|b| EngineOptions::for_memory(&tm.model, b, context_length))
            {
                Ok(o) => o,
                Err(e) => return fail(ServerError::Load(e.into())),
            }
        }
    };
    eopts.graphs = opts.graphs;
    eopts.step_tokens = opts.step_tokens;
    eopts.prefill_chunk = opts.prefill_chunk;
    // The slots are allocated here, so a size that does not fit fails the start.
    let engine = match nemotron::model::Engine::new(&tm.model, eopts.clone()) {
        Ok(e) => e,
        Err(e) => return fail(ServerError::Load(e.into())),
    };
    let slot_bytes = engine.slots().bytes();
    metrics.slots.set(eopts.max_batch as i64);
    metrics.slot_bytes.set(slot_bytes as i64);
    let r = Ready {
        tokenizer: tm.tokenizer.clone(),
        chat_template: tm.chat_template.clone(),
        defaults: tm.defaults.clone(),
        vocab_size: cfg.vocab_size,
        context_length,
        slot_bytes,
        max_batch: eopts.max_batch,
    };
    if ready.send(Ok(r)).is_err() {
        return;
    }
    worker::run(&tm, engine, eopts, rx, load_state, metrics);
}

/// The routes (exposed so an application can mount them into its own router).
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(api::chat_completions))
        .route("/v1/completions", post(api::completions))
        .route("/v1/models", get(info::models))
        .route("/health", get(info::health))
        .route("/metrics", get(info::metrics))
        .fallback(info::not_found)
        .method_not_allowed_fallback(info::method_not_allowed)
        .with_state(state)
}
