//! Loads a NemotronH checkpoint directory and prints the load report.
//!
//! `cargo run --release --example inspect -- <DIR> [--json]`
//!
//! With no directory it writes a tiny synthetic Lightning-style checkpoint (MIXED_PRECISION:
//! W4A16 NVFP4 + FP8 + BF16, FP8 KV scales, an MTP tower) to a temporary directory and inspects it.
//! On a bad checkpoint it prints one line naming the file, tensor or field at fault and exits 1.

use clap::Parser;
use nemotron_loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
use nemotron_loader::{Checkpoint, LoadOptions};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Validate a NemotronH checkpoint directory and report what it holds")]
struct Args {
    /// Checkpoint directory (config.json + safetensors). Omit to inspect a tiny synthetic one.
    dir: Option<PathBuf>,
    /// Print exactly one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let _tmp;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            let t = tempfile::tempdir()?;
            let opts = SynthOptions {
                recipe: SynthRecipe::LightningMixed,
                seed: 7,
                max_shard_bytes: 64 << 10,
                misalign: false,
            };
            write_checkpoint(t.path(), &Geometry::tiny(), &opts)?;
            if !args.json {
                eprintln!(
                    "no directory given: wrote a tiny synthetic Lightning-style checkpoint to {}",
                    t.path().display()
                );
            }
            let p = t.path().to_path_buf();
            _tmp = t;
            p
        }
    };
    let show = !args.json && std::io::stderr().is_terminal();
    let mut last = Instant::now();
    let opts = LoadOptions {
        progress: Some(Box::new(move |p: nemotron_loader::LoadProgress| {
            if show && (last.elapsed().as_millis() > 200 || p.tensors_done == p.tensors_total) {
                last = Instant::now();
                eprint!(
                    "\rloading {}/{} tensors, {:.2}/{:.2} GiB",
                    p.tensors_done,
                    p.tensors_total,
                    p.bytes_done as f64 / (1u64 << 30) as f64,
                    p.bytes_total as f64 / (1u64 << 30) as f64
                );
                if p.tensors_done == p.tensors_total {
                    eprintln!();
                }
            }
        })),
    };
    let t0 = Instant::now();
    let ckpt = Checkpoint::load_with(&dir, opts)?;
    let secs = t0.elapsed().as_secs_f64();
    if args.json {
        let mut v = serde_json::to_value(&ckpt.report)?;
        v["load_seconds"] = serde_json::json!(secs);
        println!("{}", serde_json::to_string(&v)?);
    } else {
        println!("{}", dir.display());
        print!("{}", ckpt.report.render());
        println!("loaded in {secs:.2} s");
    }
    Ok(())
}
