//! Text generation with NemotronH.
//!
//! `cargo run --release --example generate` — no arguments: writes a tiny synthetic checkpoint
//! (random weights, a byte tokenizer and a chat template) to a temporary directory and prints
//! generated token ids; with `--prompt TEXT [--chat]` it generates (random) text from it.
//!
//! `cargo run --release --example generate -- --model DIR --prompt "Why is the sky blue?" --chat
//!  [--system TEXT] [--reasoning on|off] [--temperature 0.7 --top-k 40 --top-p 0.9 --min-p 0.05
//!  --repetition-penalty 1.1 --seed 1] [--max-new-tokens 256] [--backend flex] [--dtype f32]`
//!
//! DIR is a Hugging Face checkpoint directory or a Hub id (`nvidia/…`, resolved through the
//! Hugging Face cache, downloading what is missing unless `HF_HUB_OFFLINE=1`; `--revision R`), (`config.json`, safetensors, `tokenizer.json`,
//! `tokenizer_config.json` with `chat_template`, `generation_config.json`). Output streams to stdout;
//! a progress bar (stderr) shows the load and long prefills when stdout is a terminal. Sampling
//! flags default to `generation_config.json` (greedy when it does not sample); temperature 0 is
//! greedy. Generation stops on every EOS id of `generation_config.json`. Errors: one line, exit 1.

use burn::tensor::Device;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use nemotron::synth_text::write_tiny_text_checkpoint;
use nemotron::{dtype_name, BackendKind, DType, Error, GenerateOptions, NemotronH, TextModel};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Generate text (or token ids) with NemotronH")]
struct Args {
    /// Checkpoint directory or Hub id; omit to use a tiny synthetic model.
    #[arg(long)]
    model: Option<String>,
    /// Hub revision (branch, tag or commit) for a Hub id.
    #[arg(long)]
    revision: Option<String>,
    /// Text prompt (needs tokenizer.json).
    #[arg(long)]
    prompt: Option<String>,
    /// Comma-separated prompt token ids (instead of --prompt).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Vec<u32>,
    /// Wrap the prompt in the checkpoint's chat template.
    #[arg(long)]
    chat: bool,
    /// System message for --chat.
    #[arg(long)]
    system: Option<String>,
    /// The template's reasoning switch (`enable_thinking`): on | off.
    #[arg(long)]
    reasoning: Option<String>,
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// 0 = greedy. Default: generation_config.json.
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    min_p: Option<f32>,
    #[arg(long)]
    repetition_penalty: Option<f32>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Context limit (prompt + output); default: the config's max_position_embeddings.
    #[arg(long)]
    context_length: Option<usize>,
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

fn bar(total: u64, msg: &str) -> ProgressBar {
    if !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {pos_msg} ({eta})")
            .unwrap()
            .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
}

fn run(a: Args) -> Result<(), Error> {
    let backend: BackendKind = a.backend.parse()?;
    let dtype: DType = a.dtype.parse()?;
    let dev = backend.device(dtype)?;
    run_on(a, &dev, dtype)
}

/// The backend and activation dtype the loaded model actually runs in.
fn announce(m: &NemotronH, backend: &str) {
    eprintln!("backend: {backend}, activations: {}", dtype_name(m.dtype()));
}

fn run_on(a: Args, dev: &Device, dtype: DType) -> Result<(), Error> {
    let reasoning = match a.reasoning.as_deref() {
        None => None,
        Some("on" | "true") => Some(true),
        Some("off" | "false") => Some(false),
        Some(x) => {
            return Err(Error::Unavailable(format!(
                "--reasoning {x:?}: expected on or off"
            )))
        }
    };
    let (dir, _keep): (PathBuf, _) = match &a.model {
        Some(m) => (
            nemotron::hub::resolve_model(m, a.revision.as_deref())?,
            None,
        ),
        None => {
            let t =
                tempfile::tempdir().map_err(|e| Error::Unavailable(format!("temp dir: {e}")))?;
            write_tiny_text_checkpoint(t.path(), 1)?;
            eprintln!("no --model: a tiny synthetic Lightning-style checkpoint (random weights, byte tokenizer) in {}", t.path().display());
            (t.path().to_path_buf(), Some(t))
        }
    };
    if a.model.is_none() && a.prompt.is_none() {
        if a.system.is_some() || reasoning.is_some() || a.chat {
            return Err(Error::Unavailable(
                "--chat, --system and --reasoning need --prompt".into(),
            ));
        }
        let m = NemotronH::load_as(&dir, dev, dtype.burn())?;
        announce(&m, &a.backend);
        return generate_ids(&m, &a);
    }
    if a.prompt.is_none() {
        if a.prompt_ids.is_empty() {
            return Err(Error::Unavailable(
                "give --prompt TEXT (or --prompt-ids 1,2,3)".into(),
            ));
        }
        let m = NemotronH::load_as(&dir, dev, dtype.burn())?;
        announce(&m, &a.backend);
        return generate_ids(&m, &a);
    }

    let t0 = Instant::now();
    let pb = bar(0, "loading");
    let tm = TextModel::load_with_progress(&dir, dev, dtype.burn(), |p| {
        pb.set_length(p.bytes_total);
        pb.set_position(p.bytes_done);
    })?;
    pb.finish_and_clear();
    eprintln!(
        "loaded {} ({} layers) in {:.1} s",
        dir.display(),
        tm.model.layers().len(),
        t0.elapsed().as_secs_f64()
    );
    announce(&tm.model, &a.backend);

    let user = a.prompt.clone().unwrap_or_default();
    let prompt = if a.chat {
        tm.chat_prompt(a.system.as_deref(), &user, reasoning)?
    } else {
        if a.system.is_some() || reasoning.is_some() {
            return Err(Error::Unavailable(
                "--system and --reasoning need --chat".into(),
            ));
        }
        user
    };
    let mut opts = tm.default_options(a.max_new_tokens);
    apply_sampling(&mut opts, &a);
    opts.max_context = a.context_length.or(opts.max_context);
    let pb = bar(0, "prefill");
    let mut out = std::io::stdout();
    let r = tm.generate_text_with_progress(
        &prompt,
        opts,
        |piece| {
            pb.finish_and_clear();
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        },
        |done, total| {
            if total > 512 {
                pb.set_length(total as u64);
                pb.set_position(done as u64);
            }
        },
    )?;
    println!();
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s; generation: {} tokens, {:.1} tok/s; stop: {:?}",
        r.prompt_tokens,
        r.prompt_tokens_per_second(),
        r.tokens.len(),
        r.generation_tokens_per_second(),
        r.stop
    );
    Ok(())
}

fn apply_sampling(opts: &mut GenerateOptions, a: &Args) {
    let s = &mut opts.sampling;
    if let Some(t) = a.temperature {
        s.temperature = t;
    }
    if let Some(k) = a.top_k {
        s.top_k = k;
    }
    if let Some(p) = a.top_p {
        s.top_p = p;
    }
    if let Some(p) = a.min_p {
        s.min_p = p;
    }
    if let Some(r) = a.repetition_penalty {
        s.repetition_penalty = r;
    }
    s.seed = a.seed;
}

fn generate_ids(m: &NemotronH, a: &Args) -> Result<(), Error> {
    let prompt = if a.prompt_ids.is_empty() {
        vec![1, 17, 42, 99, 7]
    } else {
        a.prompt_ids.clone()
    };
    let mut opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        stop_ids: m.config().eos_token_ids.clone(),
        ..Default::default()
    };
    apply_sampling(&mut opts, a);
    opts.max_context = a.context_length;
    println!("prompt ids: {prompt:?}");
    let t0 = Instant::now();
    let mut g = m.generator(&prompt, opts)?;
    g.prefill(|_, _| {})?;
    let mut out = vec![];
    let mut first = None;
    print!("generated ids:");
    for t in &mut g {
        let t = t?;
        first.get_or_insert_with(Instant::now);
        print!(" {t}");
        let _ = std::io::stdout().flush();
        out.push(t);
    }
    println!();
    let end = Instant::now();
    let first = first.unwrap_or(end);
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s; generation: {} tokens, {:.1} tok/s; stop: {:?}",
        prompt.len(),
        prompt.len() as f64 / (first - t0).as_secs_f64().max(1e-9),
        out.len(),
        out.len().saturating_sub(1) as f64 / (end - first).as_secs_f64().max(1e-9),
        g.stop_reason()
    );
    Ok(())
}
