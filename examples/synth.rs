//! Writes a synthetic NemotronH checkpoint directory in the real layout.
//!
//! `cargo run --release --example synth -- --out DIR [--geometry tiny|nano|lightning]
//!  [--recipe bf16|nano-nvfp4|lightning-mixed] [--shard-mb N] [--seed S] [--misalign] [--text]`
//!
//! The full Lightning geometry with `lightning-mixed` is about 20 GB and is streamed to disk.

use clap::Parser;
use nemotron_loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Write a synthetic NemotronH checkpoint")]
struct Args {
    #[arg(long)]
    out: PathBuf,
    /// tiny | nano | lightning
    #[arg(long, default_value = "tiny")]
    geometry: String,
    /// bf16 | nano-nvfp4 | lightning-mixed
    #[arg(long, default_value = "lightning-mixed")]
    recipe: String,
    /// Shard size in MiB (0 = a single model.safetensors).
    #[arg(long, default_value_t = 400)]
    shard_mb: u64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Make every tensor offset odd.
    #[arg(long)]
    misalign: bool,
    /// Write only config.json (without its quantization config): what HF's from-config peer in
    /// `tools/hf_bench.py --from-config` needs.
    #[arg(long)]
    config_only: bool,
    /// Also write the byte tokenizer, a chat template and generation_config.json
    /// (`nemotron::synth_text`), so `serve` and `generate --prompt` run on the checkpoint.
    #[arg(long)]
    text: bool,
}

fn main() {
    let a = Args::parse();
    let geom = match a.geometry.as_str() {
        "tiny" => Geometry::tiny(),
        "nano" => Geometry::nano_30b(),
        "lightning" => Geometry::lightning_30b(),
        g => fail(&format!("unknown --geometry {g:?} (tiny, nano, lightning)")),
    };
    let recipe = SynthRecipe::parse(&a.recipe).unwrap_or_else(|| {
        fail(&format!(
            "unknown --recipe {:?} (bf16, nano-nvfp4, lightning-mixed)",
            a.recipe
        ))
    });
    let opts = SynthOptions {
        recipe,
        seed: a.seed,
        max_shard_bytes: a.shard_mb << 20,
        misalign: a.misalign,
    };
    if a.config_only {
        let mut cfg = geom.config_json();
        if let Some(o) = cfg.as_object_mut() {
            o.remove("quantization_config");
        }
        let r = std::fs::create_dir_all(&a.out)
            .and_then(|_| std::fs::write(a.out.join("config.json"), cfg.to_string()));
        match r {
            Ok(()) => println!("wrote {}", a.out.join("config.json").display()),
            Err(e) => fail(&format!("{}: {e}", a.out.display())),
        }
        return;
    }
    let t0 = Instant::now();
    match write_checkpoint(&a.out, &geom, &opts) {
        Ok(s) => println!(
            "wrote {} tensors in {} shard(s), {} data bytes, to {} in {:.1} s",
            s.tensors,
            s.shards,
            s.data_bytes,
            a.out.display(),
            t0.elapsed().as_secs_f64()
        ),
        Err(e) => fail(&e.to_string()),
    }
    if a.text {
        if let Err(e) = nemotron::synth_text::write_text_files(&a.out, geom.vocab_size) {
            fail(&e.to_string());
        }
        println!("wrote the byte tokenizer and chat template");
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}
