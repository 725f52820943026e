//! Throughput of NemotronH on any backend: prefill and decode tokens/s (median of repeats after a
//! warm-up, device synchronized), batch 1 or more, device memory in use, a per-layer-kind split of
//! one decode step, kernel microbenchmarks, and HF transformers for the same checkpoint in the same
//! run (CPU f32 for the host; GPU bf16, randomly initialized from the same config, on CUDA).
//!
//! `cargo run --release [--features cuda] --example bench -- [--backend ndarray|wgpu|cuda]
//!  [--dtype f32|bf16] [--geometry tiny|small100m | --model DIR] [--prompt-len 128] [--decode 32]
//!  [--batch 1] [--repeats 3] [--no-hf] [--kernels]`
//!
//! Synthetic geometries are written as BF16 checkpoints (HF cannot read NVFP4/FP8 ones).

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use clap::Parser;
use nemotron::kernels::{Fp8Matrix, NemotronBackend, Nvfp4Matrix};
use nemotron::loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
use nemotron::model::block::Mixer;
use nemotron::model::generate::device_argmax;
use nemotron::model::NemotronH;
use nemotron::{BackendKind, BackendTask, DType};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

#[derive(Parser, Clone)]
struct Args {
    #[arg(long, default_value = "ndarray")]
    backend: String,
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// tiny | small100m (ignored with --model)
    #[arg(long, default_value = "small100m")]
    geometry: String,
    #[arg(long)]
    model: Option<PathBuf>,
    /// Build a synthetic geometry in memory (tiny | small100m | nano | lightning), no files;
    /// HF (on CUDA) is then built from the same config with random weights.
    #[arg(long)]
    synthetic: Option<String>,
    /// Recipe for --synthetic: bf16 | nano-nvfp4 | lightning-mixed
    #[arg(long, default_value = "lightning-mixed")]
    recipe: String,
    /// Prompt lengths; a list (`1024,8192`) measures batch-1 prefill at each (HF at the first).
    #[arg(long, value_delimiter = ',', default_value = "128")]
    prompt_len: Vec<usize>,
    #[arg(long, default_value_t = 32)]
    decode: usize,
    /// Sequences per forward; a list (`1,16`) measures each after one load (batches above 1 use
    /// prompts of at most 128 tokens).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    batch: Vec<usize>,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long)]
    no_hf: bool,
    /// Skip the model; time the NVFP4 / FP8 linears and the state update at the 30B shapes.
    #[arg(long)]
    kernels: bool,
    /// Also split one batch-1 decode step by layer kind (synchronizing after every block).
    #[arg(long)]
    split: bool,
    /// Log every kernel of one batch-1 decode step (count and time per kernel name) through
    /// CubeCL's profiler (sets CUBECL_DEBUG_OPTION=profile, CUBECL_DEBUG_LOG=stdout; cube
    /// backends only). Run it last: profiling stays on for the rest of the process.
    #[arg(long)]
    profile_step: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let a = Args::parse();
    if a.profile_step {
        // Before any device exists: CubeCL reads its configuration once, at first use.
        std::env::set_var("CUBECL_DEBUG_OPTION", "profile");
        std::env::set_var("CUBECL_DEBUG_LOG", "stdout");
    }
    let r = (|| -> Result<(), String> {
        let kind: BackendKind = a
            .backend
            .parse()
            .map_err(|e: nemotron::Error| e.to_string())?;
        let dtype: DType = a
            .dtype
            .parse()
            .map_err(|e: nemotron::Error| e.to_string())?;
        kind.run(dtype, Task(a.clone()))
            .map_err(|e| e.to_string())?
    })();
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

struct Task(Args);

impl BackendTask for Task {
    type Output = Result<(), String>;
    fn run<B: NemotronBackend>(self, dev: &B::Device) -> Self::Output {
        if self.0.kernels {
            kernels::<B>(&self.0, dev)
        } else {
            model::<B>(&self.0, dev).map_err(|e| e.to_string())
        }
    }
}

fn sync<B: Backend>(dev: &B::Device) {
    B::sync(dev).expect("device sync");
}

fn model<B: NemotronBackend>(a: &Args, dev: &B::Device) -> Result<(), Box<dyn std::error::Error>> {
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
    let t0 = Instant::now();
    let (m, dir, label) = match &a.synthetic {
        None => (NemotronH::<B>::load(&dir, dev)?, dir, label),
        Some(g) => {
            let geom = match g.as_str() {
                "tiny" => Geometry::tiny(),
                "small100m" => Geometry::small_100m(),
                "nano" => Geometry::nano_30b(),
                "lightning" => Geometry::lightning_30b(),
                g => return Err(format!("unknown --synthetic {g:?}").into()),
            };
            let recipe = SynthRecipe::parse(&a.recipe)
                .ok_or_else(|| format!("unknown --recipe {:?}", a.recipe))?;
            let opts = SynthOptions {
                recipe,
                seed: 1,
                max_shard_bytes: 0,
                misalign: false,
            };
            let ck = nemotron::loader::synth::build_checkpoint(&geom, &opts)?;
            println!(
                "built synthetic {g} ({}) in memory in {:.1} s",
                a.recipe,
                t0.elapsed().as_secs_f64()
            );
            // The config alone, for HF's from-config peer.
            let cfg_dir = tempfile::tempdir()?;
            let mut cfg = geom.config_json();
            cfg.as_object_mut().unwrap().remove("quantization_config");
            std::fs::write(cfg_dir.path().join("config.json"), cfg.to_string())?;
            let p = cfg_dir.path().to_path_buf();
            std::mem::forget(cfg_dir);
            (
                NemotronH::<B>::from_checkpoint(ck, dev)?,
                p,
                format!("synthetic {g} ({}, in memory)", a.recipe),
            )
        }
    };
    sync::<B>(dev);
    let load = t0.elapsed().as_secs_f64();
    let report = m.report.clone().expect("loaded from a checkpoint");
    println!("backend: {}  dtype: {}", a.backend, a.dtype);
    println!(
        "model: {label}, {} layers ({})",
        m.layers.len(),
        m.config.pattern()
    );
    println!(
        "load: {load:.1} s; checkpoint bytes held {} ({:.2} GiB)",
        report.host_bytes,
        report.host_bytes as f64 / (1u64 << 30) as f64
    );
    if let Some(mem) = B::memory_in_use(dev) {
        println!("device memory in use after load: {mem} bytes ({:.2} GiB) = {:.3} × the held checkpoint bytes", mem as f64 / (1u64 << 30) as f64, mem as f64 / report.host_bytes as f64);
    }
    let v = m.config.vocab_size;
    let mut first = (0.0, 0.0);
    let runs: Vec<(usize, usize)> = a
        .batch
        .iter()
        .flat_map(|&b| {
            if b > 1 {
                vec![(b, a.prompt_len[0].min(128))]
            } else {
                a.prompt_len.iter().map(|&p| (1, p)).collect()
            }
        })
        .collect();
    for (batch, plen) in runs {
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|b| {
                (0..plen)
                    .map(|i| ((i * 7919 + 13 + b * 104729) % v) as u32)
                    .collect()
            })
            .collect();
        let (mut pre, mut dec) = (vec![], vec![]);
        for r in 0..=a.repeats {
            let mut states: Vec<_> = (0..batch).map(|_| m.new_state()).collect();
            let mut refs: Vec<_> = states.iter_mut().collect();
            let toks: Vec<&[u32]> = prompts.iter().map(|p| p.as_slice()).collect();
            sync::<B>(dev);
            let t0 = Instant::now();
            let mut next = device_argmax(m.forward_last(&toks, &mut refs)?);
            let t1 = Instant::now();
            for _ in 0..a.decode {
                let step: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
                let toks: Vec<&[u32]> = step.iter().map(|s| s.as_slice()).collect();
                next = device_argmax(m.forward_last(&toks, &mut refs)?);
            }
            let t2 = Instant::now();
            if r > 0 || a.repeats == 0 {
                pre.push((batch * plen) as f64 / (t1 - t0).as_secs_f64());
                dec.push((batch * a.decode) as f64 / (t2 - t1).as_secs_f64());
            }
        }
        let (p, d) = (median(pre), median(dec));
        if first == (0.0, 0.0) {
            first = (p, d);
        }
        println!(
            "nemotron-rs: prefill {p:.1} tok/s (batch {batch} × {plen} tokens), decode {d:.2} tok/s (batch {batch}, {} steps; {:.2} ms/step), median of {}",
            a.decode,
            1e3 * batch as f64 / d,
            a.repeats.max(1)
        );
    }
    let (p, d) = first;
    if a.split || a.profile_step {
        let prompt: Vec<u32> = (0..a.prompt_len[0].min(1024))
            .map(|i| ((i * 7919 + 13) % v) as u32)
            .collect();
        if a.split {
            split_decode(&m, dev, &prompt);
        }
        if a.profile_step {
            profile_step(&m, dev, &prompt);
        }
    }
    if a.no_hf {
        println!("HF transformers: skipped (--no-hf)");
        return Ok(());
    }
    let cuda = a.backend == "cuda";
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/hf_bench.py");
    let mut args = vec![
        script.to_string(),
        dir.to_str().unwrap().to_string(),
        "--prompt-len".into(),
        a.prompt_len[0].to_string(),
        "--decode".into(),
        a.decode.to_string(),
        "--batch".into(),
        a.batch[0].to_string(),
        "--repeats".into(),
        a.repeats.max(1).to_string(),
    ];
    if cuda {
        args.extend(["--device", "cuda", "--dtype", "bfloat16"].map(String::from));
    }
    if cuda || a.synthetic.is_some() {
        args.push("--from-config".into());
    }
    match Command::new("python3").args(&args).output() {
        Ok(o) if o.status.success() => {
            let line = String::from_utf8_lossy(&o.stdout);
            let j: serde_json::Value = serde_json::from_str(line.lines().last().unwrap_or(""))
                .map_err(|e| format!("HF bench output: {e}"))?;
            let (hp, hd) = (
                j["prefill_tok_s"].as_f64().unwrap_or(0.0),
                j["decode_tok_s"].as_f64().unwrap_or(0.0),
            );
            println!(
                "HF transformers {} (torch {}, {} {}): prefill {hp:.1} tok/s, decode {hd:.2} tok/s",
                j["transformers"].as_str().unwrap_or("?"),
                j["torch"].as_str().unwrap_or("?"),
                j["device"].as_str().unwrap_or("?"),
                j["dtype"].as_str().unwrap_or("?"),
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

/// One batch-1 decode step block by block under CubeCL's kernel profiler: a marker line after each
/// block (after a sync and a pause for the asynchronous log), so the kernel lines between two
/// markers are that block's.
fn profile_step<B: NemotronBackend>(m: &NemotronH<B>, dev: &B::Device, prompt: &[u32]) {
    let mut s = m.new_state();
    let _ = m.forward_last(&[prompt], &mut [&mut s]).expect("prefill");
    let pause = || std::thread::sleep(std::time::Duration::from_millis(100));
    let ids =
        Tensor::<B, 2, burn::tensor::Int>::from_data(TensorData::new(vec![7i64], [1, 1]), dev);
    sync::<B>(dev);
    pause();
    println!("=== profile: begin (one batch-1 decode step)");
    let mut x = burn::tensor::module::embedding(m.embeddings.clone(), ids);
    sync::<B>(dev);
    pause();
    println!("=== profile: embedding");
    for (l, block) in m.layers.iter().enumerate() {
        x = block.forward(x, &[1], &mut [&mut s], l, &Default::default());
        sync::<B>(dev);
        pause();
        println!("=== profile: layer {l} {}", kind(&block.mixer));
    }
    let logits = m.lm_head.forward(m.norm_f.forward(x));
    let _ = device_argmax(logits.reshape([1, m.config.vocab_size]));
    sync::<B>(dev);
    pause();
    println!("=== profile: head");
}

fn kind<B: NemotronBackend>(m: &Mixer<B>) -> &'static str {
    match m {
        Mixer::Mamba(_) => "mamba2",
        Mixer::Moe(_) => "moe",
        Mixer::Attention(_) => "attention",
        Mixer::Mlp(_) => "mlp",
    }
}

/// One batch-1 decode step, synchronizing after each block, timed by layer kind.
fn split_decode<B: NemotronBackend>(m: &NemotronH<B>, dev: &B::Device, prompt: &[u32]) {
    let mut s = m.new_state();
    let _ = m.forward_last(&[prompt], &mut [&mut s]).expect("prefill");
    let mut totals = std::collections::BTreeMap::<&str, (f64, usize)>::new();
    let steps = 8;
    for step in 0..steps {
        let ids = Tensor::<B, 2, burn::tensor::Int>::from_data(
            TensorData::new(vec![(step * 31 % 100) as i64], [1, 1]),
            dev,
        );
        sync::<B>(dev);
        let t = Instant::now();
        let mut x = burn::tensor::module::embedding(m.embeddings.clone(), ids);
        sync::<B>(dev);
        let e = totals.entry("embedding").or_default();
        e.0 += t.elapsed().as_secs_f64();
        e.1 += 1;
        for (l, block) in m.layers.iter().enumerate() {
            let kind = match block.mixer {
                Mixer::Mamba(_) => "mamba2",
                Mixer::Moe(_) => "moe",
                Mixer::Attention(_) => "attention",
                Mixer::Mlp(_) => "mlp",
            };
            let t = Instant::now();
            x = block.forward(x, &[1], &mut [&mut s], l, &Default::default());
            sync::<B>(dev);
            let e = totals.entry(kind).or_default();
            e.0 += t.elapsed().as_secs_f64();
            e.1 += 1;
        }
        s.position += 1;
        let t = Instant::now();
        let logits = m.lm_head.forward(m.norm_f.forward(x));
        let _ = device_argmax(logits.reshape([1, m.config.vocab_size]));
        let e = totals.entry("norm_f + lm_head + argmax").or_default();
        e.0 += t.elapsed().as_secs_f64();
        e.1 += 1;
    }
    let all: f64 = totals.values().map(|v| v.0).sum();
    println!("decode step split (batch 1, synchronized after each block, mean of {steps} steps): {:.2} ms/step", 1e3 * all / steps as f64);
    for (k, (t, n)) in &totals {
        println!(
            "  {k:<28} {:>8.3} ms/step  ({:>5.1} %, {:.3} ms per call)",
            1e3 * t / steps as f64,
            100.0 * t / all,
            1e3 * t / *n as f64
        );
    }
}

/// Kernel microbenchmarks at the 30B-A3B shapes: achieved bandwidth of the batch-1 NVFP4 linear
/// (packed + scale bytes read per second), the FP8 linear, and the state update.
fn kernels<B: NemotronBackend>(a: &Args, dev: &B::Device) -> Result<(), String> {
    let reps = 20.max(a.repeats);
    let mut seed = 1u64;
    let mut rnd = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 56) as u8
            })
            .collect()
    };
    let time = |f: &mut dyn FnMut()| -> f64 {
        f();
        sync::<B>(dev);
        let mut ts = vec![];
        for _ in 0..reps {
            let t = Instant::now();
            f();
            sync::<B>(dev);
            ts.push(t.elapsed().as_secs_f64());
        }
        median(ts)
    };
    println!(
        "kernel microbenchmarks ({}, {}, median of {reps})",
        a.backend, a.dtype
    );
    for (k, n) in [
        (2688, 1856),
        (1856, 2688),
        (2688, 10304),
        (4096, 2688),
        (2688, 131072),
    ] {
        // Scale bytes kept below 0x7F so none decodes to NaN.
        let scales: Vec<u8> = rnd(n * k / 16)
            .into_iter()
            .map(|b| 0x30 + (b % 16))
            .collect();
        let w = B::nvfp4_weight(
            Nvfp4Matrix {
                out_features: n,
                in_features: k,
                packed: rnd(n * k / 2),
                block_scales: scales,
                global_scale: 1e-3,
            },
            dev,
        );
        let x = Tensor::<B, 2>::from_data(TensorData::new(vec![0.5f32; k], [1, k]), dev);
        let s = time(&mut || {
            let _ = B::nvfp4_linear(x.clone(), &w);
        });
        let bytes = (n * k / 2 + n * k / 16) as f64;
        println!(
            "  NVFP4 GEMV {k:>5}→{n:<6}: {:>8.1} µs, {:>7.1} GB/s of packed weight + scales",
            s * 1e6,
            bytes / s / 1e9
        );
    }
    let (k, n) = (2688, 10304);
    let w = B::fp8_weight(
        Fp8Matrix {
            out_features: n,
            in_features: k,
            weight: rnd(n * k).into_iter().map(|b| b & 0x7E).collect(),
            weight_scale: 1e-3,
            input_scale: 1e-2,
        },
        dev,
    );
    let x = Tensor::<B, 2>::from_data(TensorData::new(vec![0.5f32; k], [1, k]), dev);
    let s = time(&mut || {
        let _ = B::fp8_linear(x.clone(), &w);
    });
    println!(
        "  FP8 W8A8 GEMV {k}→{n}: {:>8.1} µs, {:>7.1} GB/s of weight",
        s * 1e6,
        (n * k) as f64 / s / 1e9
    );
    let (h, p, nn, g) = (64, 64, 128, 8);
    let st = Tensor::<B, 4>::zeros([1, h, p, nn], (dev, burn::tensor::DType::F32));
    let x = Tensor::<B, 4>::ones([1, 1, h, p], dev);
    let dt = Tensor::<B, 3>::ones([1, 1, h], dev) * 0.01;
    let av = Tensor::<B, 1>::ones([h], dev) * -1.0;
    let bm = Tensor::<B, 4>::ones([1, 1, g, nn], dev);
    let d = Tensor::<B, 1>::ones([h], dev);
    let s = time(&mut || {
        let _ = B::selective_scan(
            x.clone(),
            dt.clone(),
            av.clone(),
            bm.clone(),
            bm.clone(),
            d.clone(),
            st.clone(),
            &[1],
        );
    });
    let bytes = 2.0 * (h * p * nn * 4) as f64; // state read + written (f32)
    println!("  selective state update 64×64×128 f32: {:>8.1} µs, {:>7.1} GB/s of state read+written (includes the state copy)", s * 1e6, bytes / s / 1e9);
    Ok(())
}
