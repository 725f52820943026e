//! A bounded load test of the OpenAI server, loopback only: N concurrent streaming clients, each
//! sending M completion requests one after another (token-id prompts of `--prompt-len` tokens,
//! `--max-tokens` out, EOS ignored so every request is the same length). Reports requests/s,
//! output tokens/s, p50/p99 time to first token and inter-token latency (as each client sees
//! them: one SSE chunk per token), and failed requests. Stops by itself.
//!
//! `cargo run --release --example loadtest -- [--url http://127.0.0.1:8000]` against a running
//! server, or with no `--url` it starts one in-process on the same options `serve` takes
//! (`--model DIR --backend cuda --dtype bf16 --context-length N`; no `--model`: the tiny synthetic
//! one). `--clients 1,16,64` runs each level in turn; `--json FILE` writes the results.
//!
//! Mixed load (`--long-prompt N`): at each level one more request, a prompt of N tokens, is sent
//! once the streams are flowing (`--long-after` tokens streamed in all), and the streams'
//! inter-token gaps are reported in three phases: before it was sent, during its admission (a gap
//! overlapping the span from its sending to its first token) and after. That shows what a long
//! prompt arriving at a busy server costs the running streams (`serve --step-tokens` /
//! `--prefill-chunk` bound it).

use clap::Parser;
use nemotron::model::BuildOptions;
use nemotron::synth_text::write_tiny_text_checkpoint;
use nemotron::{BackendKind, DType, TextModel};
use nemotron_server::{Server, ServerOptions};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "Load-test the OpenAI server over loopback")]
struct Args {
    /// A running server (loopback only); omit to start one in-process.
    #[arg(long)]
    url: Option<String>,
    /// Concurrent clients per level.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    clients: Vec<usize>,
    /// Requests per client per level.
    #[arg(long, default_value_t = 4)]
    requests: usize,
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// With --url: the served model's vocabulary (prompt ids are drawn below it). A server started
    /// here reads it from the checkpoint's config.
    #[arg(long, default_value_t = 256)]
    vocab: usize,
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    // In-process server:
    #[arg(long)]
    model: Option<String>,
    #[arg(long, default_value = "flex")]
    backend: String,
    #[arg(long, default_value = "f32")]
    dtype: String,
    #[arg(long)]
    context_length: Option<usize>,
    /// Slots of the in-process server (default: the largest --clients).
    #[arg(long, conflicts_with = "slot_memory")]
    max_batch: Option<usize>,
    /// The in-process server's slots sized from device memory instead (`serve --slot-memory`:
    /// 24GiB, or 0.9 of the memory free after loading on CUDA).
    #[arg(long)]
    slot_memory: Option<String>,
    #[arg(long, default_value = "on")]
    graphs: String,
    /// The in-process server's step token budget (`serve --step-tokens`; 0: no limit).
    #[arg(long, default_value_t = 0)]
    step_tokens: usize,
    /// The in-process server's prompt piece per step (`serve --prefill-chunk`; 0: no limit).
    #[arg(long, default_value_t = 0)]
    prefill_chunk: usize,
    /// The in-process server's KV cache (`serve --kv-cache-dtype`): auto | fp8.
    #[arg(long, default_value = "auto")]
    kv_cache_dtype: String,
    /// The in-process server's Mamba SSM state (`serve --mamba-ssm-cache-dtype`): float32 |
    /// bfloat16.
    #[arg(long, default_value = "float32")]
    mamba_ssm_cache_dtype: String,
    /// The in-process server's shared experts (`serve --shared-expert`): apart | fold |
    /// auto[:N] (default: auto, as serve's).
    #[arg(long)]
    shared_expert: Option<String>,
    /// Mixed load: one request of this many prompt tokens sent into each level's streams.
    #[arg(long)]
    long_prompt: Option<usize>,
    /// Tokens the long request generates (with --long-prompt; default 8).
    #[arg(long)]
    long_max_tokens: Option<usize>,
    /// Send the long request once this many tokens have streamed at the level (default: 8 per
    /// client; with --long-prompt).
    #[arg(long)]
    long_after: Option<usize>,
}

#[derive(Default)]
struct ClientStats {
    ok: usize,
    failed: usize,
    tokens: usize,
    ttft: Vec<f64>,
    /// Inter-token gaps: when each began and ended (the previous token's arrival and this one's).
    gaps: Vec<(Instant, Instant)>,
    errors: Vec<String>,
}

impl ClientStats {
    fn itl(&self) -> Vec<f64> {
        self.gaps
            .iter()
            .map(|(a, b)| (*b - *a).as_secs_f64())
            .collect()
    }
}

/// The long request of a mixed level: when it was sent, when its first token came (None if it
/// failed) and its error.
struct Long {
    sent: Instant,
    first: Option<Instant>,
    error: Option<String>,
}

/// The phase of a stream's inter-token gap `[a, b]` against the long request's admission span
/// `[sent, first]`: 0 ended before it was sent, 1 overlaps the span, 2 began after its first token.
fn phase(a: Instant, b: Instant, sent: Instant, first: Instant) -> usize {
    if b < sent {
        0
    } else if a > first {
        2
    } else {
        1
    }
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i]
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let max_clients = a.clients.iter().copied().max().unwrap_or(1);
    if a.long_prompt.is_none() && (a.long_max_tokens.is_some() || a.long_after.is_some()) {
        return Err(
            "--long-max-tokens and --long-after shape the mixed load: give --long-prompt".into(),
        );
    }
    // The long request is one more stream: its own slot and queue place.
    let extra = usize::from(a.long_prompt.is_some());
    let mut vocab = a.vocab;
    let mut _keep = None;
    let server;
    let base = match &a.url {
        Some(u) => {
            let host = u
                .trim_start_matches("http://")
                .split(['/', ':'])
                .next()
                .unwrap_or_default();
            if !matches!(host, "127.0.0.1" | "localhost" | "[") {
                return Err(format!("--url {u}: loopback only (127.0.0.1 / localhost)").into());
            }
            if a.step_tokens != 0
                || a.prefill_chunk != 0
                || a.max_batch.is_some()
                || a.slot_memory.is_some()
                || a.kv_cache_dtype != "auto"
                || a.mamba_ssm_cache_dtype != "float32"
                || a.shared_expert.is_some()
            {
                return Err(
                    "--step-tokens, --prefill-chunk, --max-batch, --slot-memory, \
                     --kv-cache-dtype, --mamba-ssm-cache-dtype and --shared-expert size the \
                     in-process server: not with --url (give them to that server's serve)"
                        .into(),
                );
            }
            u.trim_end_matches('/').to_string()
        }
        None => {
            let backend: BackendKind = a.backend.parse()?;
            let dtype: DType = a.dtype.parse()?;
            let dev = backend.device(dtype)?;
            let dir = match &a.model {
                Some(m) => nemotron::hub::resolve_model(m, None)?,
                None => {
                    let t = tempfile::tempdir()?;
                    write_tiny_text_checkpoint(t.path(), 1)?;
                    let p = t.path().to_path_buf();
                    _keep = Some(t);
                    p
                }
            };
            let mut o = ServerOptions::new("load");
            o.max_batch = a.max_batch.unwrap_or(max_clients + extra);
            o.slot_memory = a
                .slot_memory
                .as_deref()
                .map(str::parse::<nemotron::model::SlotMemory>)
                .transpose()?;
            o.max_queue = (max_clients + extra) * 2;
            o.context_length = a.context_length;
            o.step_tokens = a.step_tokens;
            o.prefill_chunk = a.prefill_chunk;
            o.kv_cache = a
                .kv_cache_dtype
                .parse()
                .map_err(|e| format!("--kv-cache-dtype: {e}"))?;
            o.ssm_cache = a
                .mamba_ssm_cache_dtype
                .parse()
                .map_err(|e| format!("--mamba-ssm-cache-dtype: {e}"))?;
            o.graphs = match a.graphs.as_str() {
                "on" => true,
                "off" => false,
                x => return Err(format!("--graphs {x:?}: expected on or off").into()),
            };
            let cfg = nemotron::loader::read_config(&dir)?.0;
            vocab = cfg.vocab_size;
            let t0 = Instant::now();
            let mode = a.shared_expert.clone().unwrap_or_else(|| "auto".into());
            let build = BuildOptions {
                shared_expert: mode.parse().map_err(|e| format!("--shared-expert: {e}"))?,
            };
            server = Server::start(
                move || {
                    let tm = TextModel::load_with(&dir, &dev, dtype.burn(), build, |_| {})?;
                    // What the model was built with, layer by layer.
                    let (folds, moe) = tm.model.shared_expert_folds();
                    eprintln!("shared expert {mode}: {folds} of {moe} MoE layers fold it");
                    Ok(tm)
                },
                o,
                "127.0.0.1:0",
            )?;
            eprintln!(
                "server up in {:.1} s at {}",
                t0.elapsed().as_secs_f64(),
                server.addr()
            );
            format!("http://{}", server.addr())
        }
    };
    let url = format!("{base}/v1/completions");
    let long = a.long_prompt.map(|n| LongSpec {
        prompt_len: n,
        max_tokens: a.long_max_tokens.unwrap_or(8),
        after: a.long_after,
    });
    if let Some(l) = &long {
        if l.prompt_len == 0 || l.max_tokens == 0 {
            return Err("--long-prompt and --long-max-tokens: at least 1".into());
        }
        // Warm-up: the long prompt alone (its prefill's kernels compiled outside the levels).
        let agent = ureq::AgentBuilder::new()
            .timeout_read(Duration::from_secs(600))
            .build();
        let body = request_body(&mut 7, l.prompt_len, 2, vocab);
        one(&agent, &url, &body).map_err(|e| format!("warm-up of the long prompt failed: {e}"))?;
    }
    // Warm-up: one request per padded batch size the levels will use (captures graphs).
    for &n in &a.clients {
        let (r, _) = level(&url, n, 1, a.prompt_len, 4, vocab, 99, None);
        if r.failed > 0 {
            return Err(format!("warm-up at {n} clients failed: {:?}", r.errors).into());
        }
    }
    let mut results = vec![];
    println!("| clients | requests | failed | wall s | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut mixed_rows = vec![];
    for &n in &a.clients {
        let t0 = Instant::now();
        let (s, lg) = level(
            &url,
            n,
            a.requests,
            a.prompt_len,
            a.max_tokens,
            vocab,
            1,
            long.as_ref(),
        );
        let wall = t0.elapsed().as_secs_f64();
        let mut itl = s.itl();
        let mut ttft = s.ttft.clone();
        let mut row = json!({
            "clients": n, "requests": s.ok + s.failed, "failed": s.failed, "wall_s": wall,
            "requests_per_s": s.ok as f64 / wall, "output_tok_per_s": s.tokens as f64 / wall,
            "ttft_p50_ms": pct(&mut ttft, 0.5) * 1e3, "ttft_p99_ms": pct(&mut ttft, 0.99) * 1e3,
            "itl_p50_ms": pct(&mut itl, 0.5) * 1e3, "itl_p99_ms": pct(&mut itl, 0.99) * 1e3,
            "prompt_len": a.prompt_len, "max_tokens": a.max_tokens,
        });
        println!(
            "| {n} | {} | {} | {wall:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
            s.ok + s.failed,
            s.failed,
            row["requests_per_s"].as_f64().unwrap_or(0.0),
            row["output_tok_per_s"].as_f64().unwrap_or(0.0),
            row["ttft_p50_ms"].as_f64().unwrap_or(0.0),
            row["ttft_p99_ms"].as_f64().unwrap_or(0.0),
            row["itl_p50_ms"].as_f64().unwrap_or(0.0),
            row["itl_p99_ms"].as_f64().unwrap_or(0.0),
        );
        for e in s.errors.iter().take(3) {
            eprintln!("  failure: {e}");
        }
        if let (Some(l), Some(lg)) = (&long, lg) {
            let m = mixed(&s, &lg, l, t0);
            if lg.error.is_some() {
                row["failed"] = json!(s.failed + 1);
            }
            mixed_rows.push((n, m.clone()));
            row["mixed"] = m;
        }
        results.push(row);
    }
    if let Some(l) = &long {
        println!();
        println!(
            "Mixed load: one {}-token prompt ({} out) sent into the streams; their inter-token gaps before it was sent, during its admission (overlapping sent → its first token), after.",
            l.prompt_len, l.max_tokens
        );
        println!("| clients | long sent at s | long TTFT ms | phase | gaps | ITL p50 ms | ITL p99 ms | ITL max ms |");
        println!("|---|---|---|---|---|---|---|---|");
        for (n, m) in &mixed_rows {
            for ph in PHASES {
                let p = &m["phases"][ph];
                println!(
                    "| {n} | {:.2} | {:.1} | {ph} | {} | {:.2} | {:.2} | {:.2} |",
                    m["long_sent_s"].as_f64().unwrap_or(f64::NAN),
                    m["long_ttft_ms"].as_f64().unwrap_or(f64::NAN),
                    p["gaps"],
                    p["itl_p50_ms"].as_f64().unwrap_or(f64::NAN),
                    p["itl_p99_ms"].as_f64().unwrap_or(f64::NAN),
                    p["itl_max_ms"].as_f64().unwrap_or(f64::NAN),
                );
            }
            if let Some(e) = m["long_error"].as_str() {
                eprintln!("  long request failed: {e}");
            }
        }
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&results)?)?;
    }
    if results.iter().any(|r| r["failed"].as_u64() != Some(0)) {
        return Err("some requests failed".into());
    }
    Ok(())
}

/// The mixed load's long request.
struct LongSpec {
    prompt_len: usize,
    max_tokens: usize,
    after: Option<usize>,
}

const PHASES: [&str; 3] = ["before", "during", "after"];

/// A mixed level's phases (see the module comment), as JSON.
fn mixed(s: &ClientStats, lg: &Long, l: &LongSpec, t0: Instant) -> Value {
    let mut by: [Vec<f64>; 3] = Default::default();
    // A long request that failed has no first token: its span is the instant it was sent (a gap
    // across that instant is "during", every later one "after").
    let first = lg.first.unwrap_or(lg.sent);
    for &(a, b) in &s.gaps {
        by[phase(a, b, lg.sent, first)].push((b - a).as_secs_f64());
    }
    let mut phases = serde_json::Map::new();
    for (name, v) in PHASES.iter().zip(by.iter_mut()) {
        let max = v.iter().copied().fold(f64::NAN, f64::max);
        phases.insert(
            name.to_string(),
            json!({"gaps": v.len(), "itl_p50_ms": pct(v, 0.5) * 1e3,
                   "itl_p99_ms": pct(v, 0.99) * 1e3, "itl_max_ms": max * 1e3}),
        );
    }
    json!({
        "long_prompt": l.prompt_len, "long_max_tokens": l.max_tokens,
        "long_sent_s": (lg.sent - t0).as_secs_f64(),
        "long_ttft_ms": lg.first.map(|f| (f - lg.sent).as_secs_f64() * 1e3),
        "long_error": lg.error,
        "phases": phases,
    })
}

/// A streaming completion request of `prompt_len` ids drawn below `vocab` from the generator `x`.
fn request_body(x: &mut u64, prompt_len: usize, max_tokens: usize, vocab: usize) -> Value {
    let prompt: Vec<u64> = (0..prompt_len)
        .map(|_| {
            *x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*x >> 33) % vocab as u64
        })
        .collect();
    json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true,
        "temperature": 0, "stream": true})
}

/// `clients` threads × `requests` streaming requests each; with `long`, one more request of its
/// prompt sent once `long.after` tokens have streamed (or every client is done).
#[allow(clippy::too_many_arguments)]
fn level(
    url: &str,
    clients: usize,
    requests: usize,
    prompt_len: usize,
    max_tokens: usize,
    vocab: usize,
    seed: u64,
    long: Option<&LongSpec>,
) -> (ClientStats, Option<Long>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let agent = ureq::AgentBuilder::new()
        .timeout_read(Duration::from_secs(600))
        .build();
    let streamed = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let (agent, url) = (agent.clone(), url.to_string());
            let (streamed, finished) = (streamed.clone(), finished.clone());
            std::thread::spawn(move || {
                let mut st = ClientStats::default();
                let mut x = seed
                    .wrapping_mul(1_000_003)
                    .wrapping_add(c as u64 * 7919 + 1);
                for _ in 0..requests {
                    let body = request_body(&mut x, prompt_len, max_tokens, vocab);
                    match one_counted(&agent, &url, &body, Some(&streamed)) {
                        Ok((tokens, ttft, gaps)) => {
                            st.ok += 1;
                            st.tokens += tokens;
                            st.ttft.push(ttft);
                            st.gaps.extend(gaps);
                        }
                        Err(e) => {
                            st.failed += 1;
                            st.errors.push(e);
                        }
                    }
                }
                finished.fetch_add(1, Ordering::SeqCst);
                st
            })
        })
        .collect();
    let long = long.map(|l| {
        let after = l.after.unwrap_or(8 * clients);
        while streamed.load(Ordering::SeqCst) < after && finished.load(Ordering::SeqCst) < clients {
            std::thread::sleep(Duration::from_millis(1));
        }
        let body = request_body(&mut 11, l.prompt_len, l.max_tokens, vocab);
        let sent = Instant::now();
        match one(&agent, url, &body) {
            Ok((_, ttft, _)) => Long {
                sent,
                first: Some(sent + Duration::from_secs_f64(ttft)),
                error: None,
            },
            Err(e) => Long {
                sent,
                first: None,
                error: Some(e),
            },
        }
    });
    let mut all = ClientStats::default();
    for h in handles {
        let s = h.join().unwrap_or_else(|_| ClientStats {
            failed: 1,
            errors: vec!["client thread panicked".into()],
            ..Default::default()
        });
        all.ok += s.ok;
        all.failed += s.failed;
        all.tokens += s.tokens;
        all.ttft.extend(s.ttft);
        all.gaps.extend(s.gaps);
        all.errors.extend(s.errors);
    }
    (all, long)
}

type Gaps = Vec<(Instant, Instant)>;

/// One streaming request: (tokens, time to first token in seconds, inter-token gaps).
fn one(agent: &ureq::Agent, url: &str, body: &Value) -> Result<(usize, f64, Gaps), String> {
    one_counted(agent, url, body, None)
}

/// [`one`], adding each token to `streamed` as it arrives.
fn one_counted(
    agent: &ureq::Agent,
    url: &str,
    body: &Value,
    streamed: Option<&std::sync::atomic::AtomicUsize>,
) -> Result<(usize, f64, Gaps), String> {
    let t0 = Instant::now();
    let r = agent
        .post(url)
        .send_json(body.clone())
        .map_err(|e| e.to_string())?;
    let mut last: Option<Instant> = None;
    let (mut ttft, mut itl, mut tokens) = (0.0, vec![], 0usize);
    let mut usage = None;
    let mut done = false;
    for line in BufReader::new(r.into_reader()).lines() {
        let line = line.map_err(|e| e.to_string())?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
        if let Some(e) = v.get("error") {
            return Err(e.to_string());
        }
        if let Some(u) = v.get("usage") {
            usage = u["completion_tokens"].as_u64();
        }
        let is_token = v["choices"][0]["finish_reason"].is_null()
            && v["choices"].as_array().is_some_and(|c| !c.is_empty());
        if is_token {
            let now = Instant::now();
            match last {
                None => ttft = (now - t0).as_secs_f64(),
                Some(l) => itl.push((l, now)),
            }
            last = Some(now);
            tokens += 1;
            if let Some(c) = streamed {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }
    if !done {
        return Err("the stream ended without [DONE]".into());
    }
    if usage != Some(tokens as u64) {
        return Err(format!("{tokens} token chunks, usage says {usage:?}"));
    }
    Ok((tokens, ttft, itl))
}
