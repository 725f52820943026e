//! Generates tokens with NemotronH on the host reference (NdArray, f32).
//!
//! `cargo run --release --example generate` writes a tiny synthetic checkpoint to a temporary
//! directory and generates from it; `--model DIR` loads a real checkpoint directory.
//! Prints the generated token ids and tokens/s.

use clap::Parser;
use nemotron::loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
use nemotron::model::{NemotronH, Sampling};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Generate token ids with NemotronH")]
struct Args {
    /// Checkpoint directory; omit to use a tiny synthetic model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Comma-separated prompt token ids.
    #[arg(long, value_delimiter = ',', default_value = "1,17,42,99,7")]
    prompt_ids: Vec<u32>,
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

type B = burn::backend::NdArray<f32>;

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let _tmp;
    let dir = match a.model {
        Some(d) => d,
        None => {
            let t = tempfile::tempdir()?;
            let opts = SynthOptions {
                recipe: SynthRecipe::LightningMixed,
                seed: 1,
                max_shard_bytes: 0,
                misalign: false,
            };
            write_checkpoint(t.path(), &Geometry::tiny(), &opts)?;
            eprintln!("no --model: using a tiny synthetic Lightning-style checkpoint (random weights) in {}", t.path().display());
            let p = t.path().to_path_buf();
            _tmp = t;
            p
        }
    };
    let dev = Default::default();
    let t0 = Instant::now();
    let m = NemotronH::<B>::load(&dir, &dev)?;
    eprintln!(
        "loaded {} layers ({}) in {:.2} s",
        m.layers.len(),
        m.config.pattern(),
        t0.elapsed().as_secs_f64()
    );
    let s = Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
        stop_ids: m.config.eos_token_ids.clone(),
    };
    println!("prompt: {:?}", a.prompt_ids);
    let t1 = Instant::now();
    let mut first = None;
    let out = m.generate(&a.prompt_ids, a.max_new_tokens, &s, |_| {
        first.get_or_insert_with(Instant::now);
    })?;
    let total = t1.elapsed().as_secs_f64();
    println!("generated: {out:?}");
    let prefill = first.map_or(total, |f| f.duration_since(t1).as_secs_f64());
    let decode = total - prefill;
    println!(
        "prompt {} tokens in {:.3} s ({:.1} tok/s); {} new tokens in {:.3} s ({:.1} tok/s after the first)",
        a.prompt_ids.len(),
        prefill,
        a.prompt_ids.len() as f64 / prefill,
        out.len(),
        total,
        (out.len().saturating_sub(1)) as f64 / decode.max(1e-9)
    );
    Ok(())
}
