//! Host-reference throughput: prefill and decode tokens/s on NdArray (f32), median of repeated
//! runs, next to HF transformers on CPU for the same checkpoint in the same run (when `python3`
//! with torch + transformers is available; otherwise it says so).
//!
//! `cargo run --release --example bench -- [--geometry tiny|small100m] [--model DIR]
//!  [--prompt-len 128] [--decode 32] [--repeats 3] [--no-hf]`
//!
//! Synthetic geometries are written as BF16 checkpoints (HF cannot read NVFP4/FP8 ones).

use clap::Parser;
use nemotron::loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
use nemotron::model::NemotronH;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// tiny | small100m (ignored with --model)
    #[arg(long, default_value = "small100m")]
    geometry: String,
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    #[arg(long, default_value_t = 32)]
    decode: usize,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Skip the HF transformers comparison.
    #[arg(long)]
    no_hf: bool,
}

type B = burn::backend::NdArray<f32>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let _tmp;
    let (dir, label) = match &a.model {
        Some(d) => (d.clone(), d.display().to_string()),
        None => {
            let geom = match a.geometry.as_str() {
                "tiny" => Geometry::tiny(),
                "small100m" => Geometry::small_100m(),
                g => return Err(format!("unknown --geometry {g:?}").into()),
            };
            let t = tempfile::tempdir()?;
            let opts = SynthOptions {
                recipe: SynthRecipe::Bf16,
                seed: 1,
                max_shard_bytes: 0,
                misalign: false,
            };
            write_checkpoint(t.path(), &geom, &opts)?;
            let p = t.path().to_path_buf();
            _tmp = t;
            (p, format!("synthetic {} (BF16)", a.geometry))
        }
    };
    let dev = Default::default();
    let m = NemotronH::<B>::load(&dir, &dev)?;
    let params: u64 = m.report.as_ref().map_or(0, |r| r.host_bytes / 2);
    let v = m.config.vocab_size;
    let prompt: Vec<u32> = (0..a.prompt_len)
        .map(|i| ((i * 7919 + 13) % v) as u32)
        .collect();
    let (mut pre, mut dec) = (vec![], vec![]);
    for r in 0..=a.repeats {
        let mut s = m.new_state();
        let t0 = Instant::now();
        let l = m.forward_one(&prompt, &mut s)?;
        let mut tok = nemotron::model::generate::argmax(&nemotron::model::generate::last_row(l));
        let t1 = Instant::now();
        for _ in 0..a.decode {
            let l = m.forward_one(&[tok], &mut s)?;
            tok = nemotron::model::generate::argmax(&nemotron::model::generate::last_row(l));
        }
        let t2 = Instant::now();
        if r > 0 {
            pre.push(a.prompt_len as f64 / (t1 - t0).as_secs_f64());
            dec.push(a.decode as f64 / (t2 - t1).as_secs_f64());
        }
    }
    let (p, d) = (median(pre), median(dec));
    println!(
        "model: {label}, {} layers ({}), ~{:.1} M params (bf16 bytes / 2)",
        m.layers.len(),
        m.config.pattern(),
        params as f64 / 1e6
    );
    println!("nemotron-rs NdArray f32: prefill {p:.1} tok/s ({} tokens), decode {d:.2} tok/s ({} steps), median of {}", a.prompt_len, a.decode, a.repeats);
    if a.no_hf {
        println!("HF transformers: skipped (--no-hf)");
        return Ok(());
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/hf_bench.py");
    let out = Command::new("python3")
        .args([
            script,
            dir.to_str().unwrap(),
            "--prompt-len",
            &a.prompt_len.to_string(),
            "--decode",
            &a.decode.to_string(),
            "--repeats",
            &a.repeats.to_string(),
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let line = String::from_utf8_lossy(&o.stdout);
            let j: serde_json::Value = serde_json::from_str(line.lines().last().unwrap_or(""))
                .map_err(|e| format!("HF bench output: {e}"))?;
            let (hp, hd) = (
                j["prefill_tok_s"].as_f64().unwrap_or(0.0),
                j["decode_tok_s"].as_f64().unwrap_or(0.0),
            );
            println!(
                "HF transformers {} (torch {}, {} threads, CPU f32): prefill {hp:.1} tok/s, decode {hd:.2} tok/s",
                j["transformers"].as_str().unwrap_or("?"),
                j["torch"].as_str().unwrap_or("?"),
                j["threads"]
            );
            println!(
                "ratio nemotron-rs / HF: prefill {:.2}x, decode {:.2}x",
                p / hp,
                d / hd
            );
        }
        Ok(o) => println!(
            "HF transformers: NOT MEASURED (python3 {script} failed: {})",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ),
        Err(e) => println!("HF transformers: NOT MEASURED (python3 not runnable: {e})"),
    }
    Ok(())
}
