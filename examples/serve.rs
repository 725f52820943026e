//! An OpenAI-compatible server (chat and text completions, streaming, `/v1/models`, `/health`,
//! `/metrics`) on the continuous-batching decode engine.
//!
//! `cargo run --release --example serve` — no `--model`: the tiny synthetic model (random weights)
//! with a byte tokenizer and a chat template, so text round-trips on any machine:
//!
//! ```sh
//! curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \
//!   -d '{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}'
//! ```
//!
//! `cargo run --release --features cuda --example serve -- --model DIR|HUB_ID [--revision R]
//!  --backend cuda --dtype bf16 [--host 127.0.0.1 --port 8000] [--max-batch 16 | --slot-memory 0.9]
//!  [--max-queue 256]
//!  [--context-length N] [--graphs on|off] [--served-model-name NAME]`
//!
//! A Hub id resolves through the Hugging Face cache (`HF_HOME`, `HF_HUB_CACHE`), downloading
//! what is missing unless `HF_HUB_OFFLINE=1`.

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use nemotron::model::BuildOptions;
use nemotron::synth_text::write_tiny_text_checkpoint;
use nemotron::{BackendKind, DType, Error, TextModel};
use nemotron_server::{Server, ServerOptions};
use std::io::IsTerminal;

#[derive(Parser)]
#[command(about = "Serve NemotronH over the OpenAI API")]
struct Args {
    /// Checkpoint directory or Hub id; omit for the tiny synthetic model.
    #[arg(long)]
    model: Option<String>,
    /// Hub revision (branch, tag or commit) for a Hub id.
    #[arg(long)]
    revision: Option<String>,
    /// The name clients pass as `model` (default: --model as given).
    #[arg(long)]
    served_model_name: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Sequences decoded together (state slots, allocated at start; default 16).
    #[arg(long, conflicts_with = "slot_memory")]
    max_batch: Option<usize>,
    /// Size the slots from device memory instead of --max-batch: as many as fit (at most 256) in
    /// a size (24GiB) or a fraction of the memory free after loading (0.9; CUDA).
    #[arg(long)]
    slot_memory: Option<String>,
    /// Requests that may wait for a slot; past that, 429.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Tokens per sequence, prompt + output (default: max_position_embeddings, at most 8192).
    #[arg(long)]
    context_length: Option<usize>,
    /// Replay captured decode steps (CUDA): on | off.
    #[arg(long, default_value = "on")]
    graphs: String,
    /// Tokens one engine step runs at most, decode rows first, then pieces of prompts (vLLM's
    /// --max-num-batched-tokens; 0: no limit). Must exceed --max-batch.
    #[arg(long, default_value_t = 0)]
    step_tokens: usize,
    /// The most tokens of one prompt a step prefills (0: no limit); longer prompts are admitted
    /// over several steps while running streams keep decoding.
    #[arg(long, default_value_t = 0)]
    prefill_chunk: usize,
    /// The slots' KV cache: auto (the activation dtype) | fp8 (E4M3 with the checkpoint's
    /// k_scale/v_scale, 1.0 where it ships none: half the KV bytes of bf16)
    #[arg(long, default_value = "auto")]
    kv_cache_dtype: String,
    /// The slots' Mamba SSM state: float32 | bfloat16 (half the state bytes a decode step reads
    /// and writes; the new state rounded to nearest even each step)
    #[arg(long, default_value = "float32")]
    mamba_ssm_cache_dtype: String,
    /// How each MoE layer runs its shared expert: apart (its own two linears) | fold (stacked
    /// with the routed experts) | auto[:N] (both held: decode steps of up to N rows
    /// folded, 8 by default, prefills apart; quantized experts only). Default: auto
    #[arg(long, default_value = "auto")]
    shared_expert: String,
    /// flex | ndarray | cuda | wgpu
    #[arg(long, default_value = "flex")]
    backend: String,
    /// f32 | bf16
    #[arg(long, default_value = "f32")]
    dtype: String,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let backend: BackendKind = a.backend.parse()?;
    let dtype: DType = a.dtype.parse()?;
    let dev = backend.device(dtype)?;
    let graphs = match a.graphs.as_str() {
        "on" => true,
        "off" => false,
        x => return Err(format!("--graphs {x:?}: expected on or off").into()),
    };
    let (dir, name, _keep) = match &a.model {
        Some(m) => {
            let dir = nemotron::hub::resolve_model(m, a.revision.as_deref())?;
            (dir, m.clone(), None)
        }
        None => {
            let t = tempfile::tempdir()?;
            write_tiny_text_checkpoint(t.path(), 1)?;
            eprintln!(
                "no --model: the tiny synthetic model (random weights, byte tokenizer) in {}",
                t.path().display()
            );
            (
                t.path().to_path_buf(),
                "nemotron-tiny-synthetic".to_string(),
                Some(t),
            )
        }
    };
    let mut o = ServerOptions::new(a.served_model_name.as_deref().unwrap_or(&name));
    o.max_batch = a.max_batch.unwrap_or(16);
    o.slot_memory = a
        .slot_memory
        .as_deref()
        .map(str::parse::<nemotron::model::SlotMemory>)
        .transpose()?;
    o.max_queue = a.max_queue;
    o.context_length = a.context_length;
    o.graphs = graphs;
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
    let pb = if std::io::stderr().is_terminal() {
        let pb = ProgressBar::new(0);
        pb.set_style(
            ProgressStyle::with_template("loading [{bar:30}] {bytes}/{total_bytes} ({eta})")?
                .progress_chars("=> "),
        );
        pb
    } else {
        ProgressBar::hidden()
    };
    let build = BuildOptions {
        shared_expert: a
            .shared_expert
            .parse()
            .map_err(|e| format!("--shared-expert: {e}"))?,
    };
    let (pb2, dir2, mode) = (pb.clone(), dir.clone(), a.shared_expert.clone());
    let load = move || -> Result<TextModel, Error> {
        let tm = TextModel::load_with(&dir2, &dev, dtype.burn(), build, |p| {
            pb2.set_length(p.bytes_total);
            pb2.set_position(p.bytes_done);
        })?;
        pb2.finish_and_clear();
        // What the model was built with, layer by layer, not what was asked.
        let (folds, moe) = tm.model.shared_expert_folds();
        eprintln!("shared expert {mode}: {folds} of {moe} MoE layers fold it");
        Ok(tm)
    };
    let server = Server::start(load, o, (a.host.as_str(), a.port))?;
    eprintln!(
        "serving {name} ({}, {} on {}) at http://{}/v1",
        dir.display(),
        a.dtype,
        a.backend,
        server.addr()
    );
    server.wait();
    Ok(())
}
