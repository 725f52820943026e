//! Throughput of NemotronH on any backend: prefill and decode tokens/s (median of repeats after a
//! warm-up, device synchronized), batch 1 or more, device memory in use, HF transformers for the
//! same checkpoint in the same run (CPU f32 for the host; GPU bf16, randomly initialized from the
//! same config, on CUDA), and the device-side views:
//!
//! - `--graph`: one batch-1 decode step captured as a graph (CUDA) and replayed, against the same
//!   step run eagerly — host µs and device µs per step, and whether the replayed logits equal the
//!   eager ones bit for bit.
//! - `--kernels`: a device-timed kernel table at the Lightning shapes (no model): each op timed as
//!   N back-to-back launches between two syncs, and as N launches captured once and replayed
//!   (the launch gaps gone: device time), with bytes, GB/s and % of the copy ceiling measured in the
//!   same run (FLOP/s for the matmuls).
//! - `--step-kernels`: one batch-1 decode step between `cuProfilerStart`/`cuProfilerStop`, for
//!   `ncu --profile-from-start off` to time each kernel on the device (`tools/kernel_table.py` turns
//!   its CSV into the per-token table: kernel × launches × device µs).
//! - `--split`, `--profile-step`: a step by layer kind, synchronized per block, and CubeCL's
//!   kernel log per block (each kernel synchronized: counts are right, times inflated).
//!
//! `cargo run --release [--features cuda] --example bench -- [--backend flex|ndarray|wgpu|cuda]
//!  [--dtype f32|bf16] [--geometry tiny|small100m | --model DIR | --synthetic lightning]
//!  [--prompt-len 128] [--decode 32] [--batch 1] [--repeats 3] [--no-hf] [--graph] [--kernels]
//!  [--engine [--graphs on|off|on,off]]`
//!
//! Synthetic geometries on disk are written as BF16 checkpoints (HF cannot read NVFP4/FP8 ones).

use burn::tensor::{DType as BDType, Device, Int, Tensor, TensorData};
use clap::Parser;
use nemotron::kernels::cube::linear::mma;
use nemotron::kernels::rng::Lcg;
use nemotron::kernels::{ops, Epilogue, Fp8Matrix, Fp8Weights, Nvfp4Matrix, Nvfp4Weights};
use nemotron::loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
use nemotron::model::block::Mixer;
use nemotron::model::generate::device_argmax;
use nemotron::model::{NemotronH, SequenceState};
use nemotron::{dtype_name, BackendKind, DType};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

#[derive(Parser, Clone)]
struct Args {
    #[arg(long, default_value = "flex")]
    backend: String,
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// tiny | small100m (ignored with --model or --synthetic)
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
    /// Weight seed for --synthetic (`synth`'s default is 0: `--synthetic lightning --seed 0`
    /// builds in memory the weights `synth --geometry lightning` writes, so the routing, and
    /// with it the experts' load, is the same; refused without --synthetic).
    #[arg(long)]
    seed: Option<u64>,
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
    /// After the throughput runs, measure eager vs graph-replayed batch-1 decode steps; with
    /// --engine, the engine's captured slot step at each --batch: replays back to back against
    /// engine round trips (`--decode 0` skips the throughput runs).
    #[arg(long)]
    graph: bool,
    /// Decode on the engine (fixed slots, continuous batching) instead of the ragged forward.
    #[arg(long)]
    engine: bool,
    /// With --engine: replay captured decode steps (on, the default) or run them eagerly (off);
    /// `on,off` measures both after one load.
    #[arg(long, value_delimiter = ',')]
    graphs: Vec<String>,
    /// Skip the model; the device-timed kernel table at the Lightning shapes.
    #[arg(long)]
    kernels: bool,
    /// Skip the throughput runs; one batch-1 decode step between cuProfilerStart/Stop (for ncu);
    /// with --engine the engine's slot step.
    #[arg(long)]
    step_kernels: bool,
    /// Also split one batch-1 decode step by layer kind (synchronizing after every block).
    #[arg(long)]
    split: bool,
    /// Log every kernel of one batch-1 decode step (count and time per kernel name) through
    /// CubeCL's profiler (sets CUBECL_DEBUG_OPTION=profile, CUBECL_DEBUG_LOG=stdout; cube
    /// backends only). Run it last: profiling stays on for the rest of the process.
    #[arg(long)]
    profile_step: bool,
    /// Tensor-core thresholds `ROWS,SLOTS` (plain linears from ROWS rows of `x`, routed experts
    /// grouped by expert from SLOTS slots, slot-major from ROWS below that; `max` turns one off)
    /// instead of the library's defaults. Several, separated by `;`, run the engine once per
    /// setting (one load, paths compared in the same call); other modes take the first.
    #[arg(long, value_delimiter = ';')]
    mma_min: Vec<String>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let a = Args::parse();
    if a.profile_step {
        // Before any device exists: CubeCL reads its configuration once, at first use.
        std::env::set_var("CUBECL_DEBUG_OPTION", "profile");
        std::env::set_var("CUBECL_DEBUG_LOG", "stdout");
    }
    let r = (|| -> Res<()> {
        let kind: BackendKind = a.backend.parse()?;
        let dtype: DType = a.dtype.parse()?;
        let dev = kind.device(dtype)?;
        if let Some(first) = a.mma_min.first() {
            apply_setting(first)?;
        }
        if a.kernels {
            kernels(&a, &dev, dtype.burn())
        } else {
            model(&a, &dev, dtype.burn())
        }
    })();
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Applies one `--mma-min` setting, from the library's defaults (the syntax:
/// [`nemotron::kernels::cube::settings::Settings::parse`]).
fn apply_setting(t: &str) -> Res<()> {
    use nemotron::kernels::cube::settings::Settings;
    Settings::parse(t)
        .and_then(|s| s.apply())
        .map_err(|e| format!("--mma-min {e}").into())
}

fn sync(dev: &Device) {
    dev.sync().expect("device sync");
}

fn geometry(name: &str) -> Res<Geometry> {
    Ok(match name {
        "tiny" => Geometry::tiny(),
        "small100m" => Geometry::small_100m(),
        "nano" => Geometry::nano_30b(),
        "lightning" => Geometry::lightning_30b(),
        g => return Err(format!("unknown geometry {g:?}").into()),
    })
}

/// Loads the model the arguments name; returns it with the directory HF reads and a label.
fn load(
    a: &Args,
    dev: &Device,
    dtype: BDType,
) -> Res<(NemotronH, PathBuf, String, Option<tempfile::TempDir>)> {
    if let Some(g) = &a.synthetic {
        let geom = geometry(g)?;
        let recipe = SynthRecipe::parse(&a.recipe)
            .ok_or_else(|| format!("unknown --recipe {:?}", a.recipe))?;
        let opts = SynthOptions {
            recipe,
            seed: a.seed.unwrap_or(1),
            max_shard_bytes: 0,
            misalign: false,
        };
        let t0 = Instant::now();
        let ck = nemotron::loader::synth::build_checkpoint(&geom, &opts)?;
        println!(
            "built synthetic {g} ({}) in memory in {:.1} s",
            a.recipe,
            t0.elapsed().as_secs_f64()
        );
        // The config alone, for HF's from-config peer.
        let cfg_dir = tempfile::tempdir()?;
        let mut cfg = geom.config_json();
        if let Some(o) = cfg.as_object_mut() {
            o.remove("quantization_config");
        }
        std::fs::write(cfg_dir.path().join("config.json"), cfg.to_string())?;
        let m = NemotronH::from_checkpoint(ck, dev, dtype)?;
        let p = cfg_dir.path().to_path_buf();
        return Ok((
            m,
            p,
            format!("synthetic {g} ({}, in memory)", a.recipe),
            Some(cfg_dir),
        ));
    }
    if a.seed.is_some() {
        return Err(
            "--seed sets the weights of --synthetic; without it there is nothing to seed".into(),
        );
    }
    let (dir, label, tmp) = match &a.model {
        Some(d) => (d.clone(), d.display().to_string(), None),
        None => {
            let geom = geometry(&a.geometry)?;
            let t = tempfile::tempdir()?;
            let opts = SynthOptions {
                recipe: SynthRecipe::Bf16,
                seed: 1,
                max_shard_bytes: 0,
                misalign: false,
            };
            write_checkpoint(t.path(), &geom, &opts)?;
            let p = t.path().to_path_buf();
            (p, format!("synthetic {} (BF16)", a.geometry), Some(t))
        }
    };
    Ok((NemotronH::load_as(&dir, dev, dtype)?, dir, label, tmp))
}

fn model(a: &Args, dev: &Device, dtype: BDType) -> Res<()> {
    if !a.graphs.is_empty() && !a.engine {
        return Err("--graphs applies to the engine: add --engine".into());
    }
    let t0 = Instant::now();
    let (m, dir, label, _tmp) = load(a, dev, dtype)?;
    sync(dev);
    let load = t0.elapsed().as_secs_f64();
    let report = m
        .report()
        .cloned()
        .ok_or("the model was not loaded from a checkpoint")?;
    // The dtype the model's tensors hold, not the one asked for.
    println!(
        "backend: {}  activations: {}",
        a.backend,
        dtype_name(m.dtype())
    );
    println!(
        "model: {label}, {} layers ({})",
        m.layers().len(),
        m.config().pattern()
    );
    println!(
        "load: {load:.1} s; checkpoint bytes held {} ({:.2} GiB)",
        report.host_bytes,
        report.host_bytes as f64 / (1u64 << 30) as f64
    );
    #[cfg(feature = "cuda")]
    if let Some(mem) = nemotron::kernels::cube::memory_in_use(dev) {
        println!(
            "device memory in use after load: {mem} bytes ({:.2} GiB) = {:.3} × the held checkpoint bytes",
            mem as f64 / (1u64 << 30) as f64,
            mem as f64 / report.host_bytes as f64
        );
    }
    let v = m.config().vocab_size;
    let prompt: Vec<u32> = (0..a.prompt_len[0].min(1024))
        .map(|i| ((i * 7919 + 13) % v) as u32)
        .collect();
    if a.step_kernels {
        return step_kernels(&m, dev, &prompt, a.engine, a.batch[0]);
    }
    let mut first = (0.0, 0.0);
    let runs: Vec<(usize, usize)> = if a.decode == 0 {
        vec![]
    } else {
        a.batch
            .iter()
            .flat_map(|&b| {
                if b > 1 {
                    vec![(b, a.prompt_len[0].min(128))]
                } else {
                    a.prompt_len.iter().map(|&p| (1, p)).collect()
                }
            })
            .collect()
    };
    for (batch, plen) in runs {
        if a.engine {
            let (p, d) = engine_run(a, &m, batch, plen)?;
            if first == (0.0, 0.0) {
                first = (p, d);
            }
            continue;
        }
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
            sync(dev);
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
    if a.graph && a.engine {
        for &b in &a.batch {
            slot_step(a, &m, dev, &prompt, b)?;
        }
    } else if a.graph {
        graph_step(a, &m, dev, &prompt)?;
    }
    if a.split {
        split_decode(&m, dev, &prompt);
    }
    if a.profile_step {
        profile_step(&m, dev, &prompt);
    }
    if a.no_hf || a.decode == 0 {
        println!("HF transformers: skipped");
        return Ok(());
    }
    hf(a, &dir, p, d)
}

/// Prefill and decode on the decode engine: `batch` requests of `plen` tokens, `decode` new tokens
/// each, greedy; the first repeat warms up (and captures the graphs). Returns (prefill tok/s,
/// decode tok/s).
fn engine_run(a: &Args, m: &NemotronH, batch: usize, plen: usize) -> Res<(f64, f64)> {
    let mut first = None;
    let modes = if a.graphs.is_empty() {
        vec!["on".to_string()]
    } else {
        a.graphs.clone()
    };
    for g in &modes {
        let graphs = match g.as_str() {
            "on" => true,
            "off" => false,
            g => return Err(format!("--graphs {g:?}: expected on or off").into()),
        };
        if a.mma_min.is_empty() {
            first.get_or_insert(engine_run_one(a, m, batch, plen, graphs)?);
        }
        for t in &a.mma_min {
            apply_setting(t)?;
            println!(
                "setting: {t} ({:?}, FP8 in-kernel quantizing up to {} rows, {:?}, attention {:?})",
                mma::mma(),
                mma::fp8_inq_max(),
                mma::tuning(),
                nemotron::kernels::cube::attention::decode::form()
            );
            first.get_or_insert(engine_run_one(a, m, batch, plen, graphs)?);
        }
    }
    Ok(first.expect("at least one mode"))
}

fn engine_run_one(
    a: &Args,
    m: &NemotronH,
    batch: usize,
    plen: usize,
    graphs: bool,
) -> Res<(f64, f64)> {
    use nemotron::model::{Engine, EngineOptions, GenerateOptions};
    let mut opts = EngineOptions::new(batch, plen + a.decode + 1);
    opts.graphs = graphs;
    let mut e = Engine::new(m, opts)?;
    let v = m.config().vocab_size;
    let dev = m.device().clone();
    let (mut pre, mut adm, mut dec) = (vec![], vec![], vec![]);
    let prompt = |b: usize, r: usize| -> Vec<u32> {
        (0..plen)
            .map(|i| ((i * 7919 + 13 + b * 104729 + r) % v) as u32)
            .collect()
    };
    for r in 0..=a.repeats.max(1) {
        // Admission alone, as HF's prefill is timed (one forward over the prompts): every
        // request stops at its first token, so the step runs no decode.
        for b in 0..batch {
            let o = GenerateOptions {
                max_new_tokens: 1,
                ..Default::default()
            };
            e.submit(&prompt(b, r + 1000), o)?;
        }
        sync(&dev);
        let t0 = Instant::now();
        let firsts = e.step()?;
        let t1 = Instant::now();
        assert!(
            e.is_idle() && firsts.iter().filter(|ev| ev.token.is_some()).count() == batch,
            "admission alone answers every request with its first token and decodes nothing"
        );
        if r > 0 {
            adm.push((batch * plen) as f64 / (t1 - t0).as_secs_f64());
        }
        for b in 0..batch {
            let o = GenerateOptions {
                max_new_tokens: a.decode + 1,
                ..Default::default()
            };
            e.submit(&prompt(b, r), o)?;
        }
        sync(&dev);
        let t0 = Instant::now();
        let first = e.step()?; // admission (one ragged prefill) and the first decode step
        let t1 = Instant::now();
        let mut produced = first.iter().filter(|ev| ev.token.is_some()).count();
        let steps0 = e.steps();
        while !e.is_idle() {
            produced += e.step()?.iter().filter(|ev| ev.token.is_some()).count();
        }
        let t2 = Instant::now();
        let steps = e.steps() - steps0;
        if r > 0 {
            pre.push((batch * plen) as f64 / (t1 - t0).as_secs_f64());
            dec.push((batch * steps) as f64 / (t2 - t1).as_secs_f64());
        }
        assert_eq!(
            produced,
            batch * (a.decode + 1),
            "every request decodes its budget"
        );
    }
    let (p1, p, d) = (median(adm), median(pre), median(dec));
    println!(
        "nemotron-rs engine (graphs {}{}): prefill {p1:.1} tok/s (batch {batch} × {plen}, admission: every first token), {p:.1} incl. one decode step, decode {d:.2} tok/s (batch {batch}; {:.2} ms/step), median of {}; slots {:.1} MiB",
        if graphs { "on" } else { "off" },
        if e.captured().is_empty() { ", none captured".to_string() } else { format!(", captured {:?}", e.captured()) },
        1e3 * batch as f64 / d,
        a.repeats.max(1),
        e.slots().bytes() as f64 / (1u64 << 20) as f64
    );
    Ok((p1, d))
}

/// HF transformers on the same checkpoint (or config), in the same run.
fn hf(a: &Args, dir: &std::path::Path, p: f64, d: f64) -> Res<()> {
    let cuda = a.backend == "cuda";
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/hf_bench.py");
    let mut args = vec![
        script.to_string(),
        dir.display().to_string(),
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

/// A prefilled batch-1 state and the next token's ids on the device.
fn prefilled(m: &NemotronH, dev: &Device, prompt: &[u32]) -> Res<(SequenceState, Tensor<2, Int>)> {
    let mut s = m.new_state();
    let next = device_argmax(m.forward_last(&[prompt], &mut [&mut s])?)[0];
    let ids = Tensor::<2, Int>::from_data(TensorData::new(vec![next as i32], [1, 1]), dev);
    Ok((s, ids))
}

/// Eager decode steps against graph replays of the same step (batch 1, same state each time).
fn graph_step(a: &Args, m: &NemotronH, dev: &Device, prompt: &[u32]) -> Res<()> {
    let (state, ids) = prefilled(m, dev, prompt)?;
    let n = 20usize;
    let eager_step = || -> Tensor<2> {
        let mut s = state.clone();
        m.forward_last_ids(ids.clone(), &mut [&mut s])
            .expect("one id row")
    };
    let eager = eager_step().into_data();
    // Eager: host time to issue N steps, then the wall time once the device is done.
    let (mut host, mut wall) = (vec![], vec![]);
    for _ in 0..a.repeats.max(1) + 1 {
        sync(dev);
        let t0 = Instant::now();
        let mut keep = Vec::with_capacity(n);
        for _ in 0..n {
            keep.push(eager_step());
        }
        let t1 = Instant::now();
        sync(dev);
        let t2 = Instant::now();
        host.push((t1 - t0).as_secs_f64() / n as f64);
        wall.push((t2 - t0).as_secs_f64() / n as f64);
    }
    let (eh, ew) = (median(host[1..].to_vec()), median(wall[1..].to_vec()));
    let t0 = Instant::now();
    let mut g = m.capture_step(ids.clone(), vec![state.clone()])?;
    sync(dev);
    let capture_s = t0.elapsed().as_secs_f64();
    let (mut host, mut wall) = (vec![], vec![]);
    for _ in 0..a.repeats.max(1) + 1 {
        sync(dev);
        let t0 = Instant::now();
        for _ in 0..n {
            // Safety: the model, `ids` and the captured state clones outlive the graph; nothing
            // else touches them while it replays (one stream, this thread).
            unsafe {
                g.replay();
            }
        }
        let t1 = Instant::now();
        sync(dev);
        let t2 = Instant::now();
        host.push((t1 - t0).as_secs_f64() / n as f64);
        wall.push((t2 - t0).as_secs_f64() / n as f64);
    }
    let (rh, rw) = (median(host[1..].to_vec()), median(wall[1..].to_vec()));
    let replayed = g.output().clone().into_data();
    let same = replayed.as_bytes() == eager.as_bytes();
    println!(
        "decode step, batch 1 ({} layers, position {}): graph {} (captured in {:.2} s incl. warm-up)",
        m.layers().len(),
        prompt.len(),
        if g.is_hardware() { "captured on the device" } else { "not supported here: replay re-runs the step" },
        capture_s
    );
    println!("  eager : host {:>9.1} µs/step, wall {:>9.1} µs/step ({:.1} tok/s), median of {} × {n} steps", eh * 1e6, ew * 1e6, 1.0 / ew, a.repeats.max(1));
    println!(
        "  replay: host {:>9.1} µs/step, wall {:>9.1} µs/step ({:.1} tok/s)",
        rh * 1e6,
        rw * 1e6,
        1.0 / rw
    );
    println!("  replayed logits bit-identical to eager: {same}");
    if !same {
        return Err("replayed logits differ from the eager step".into());
    }
    Ok(())
}

/// One decode step between cuProfilerStart and cuProfilerStop (after warm-up steps), for
/// `ncu --profile-from-start off`; prints the step's host and wall time. With `slots`, the step is
/// the engine's (`decode_slots` over `batch` slots, each holding the same prefilled prompt),
/// otherwise the ragged forward's (batch 1).
fn step_kernels(m: &NemotronH, dev: &Device, prompt: &[u32], slots: bool, batch: usize) -> Res<()> {
    let batch = if slots { batch.max(1) } else { 1 };
    let (state, ids) = prefilled(m, dev, prompt)?;
    let mut st = m.new_slots(batch, prompt.len() + 8)?;
    let load_all = |st: &mut nemotron::model::SlotState| -> Res<()> {
        for s in 0..batch {
            m.load_slot(st, s, &state)?;
        }
        Ok(())
    };
    load_all(&mut st)?;
    let slot = Tensor::<1, Int>::from_data(
        TensorData::new((0..batch as i32).collect::<Vec<_>>(), [batch]),
        (dev, BDType::I32),
    );
    let ids = ids.cast(BDType::I32).repeat_dim(0, batch);
    let step = |st: &mut nemotron::model::SlotState| -> Tensor<2> {
        if slots {
            m.decode_slots(st, &ids, &slot)
        } else {
            let mut s = state.clone();
            m.forward_last_ids(ids.clone(), &mut [&mut s])
                .expect("one id row")
        }
    };
    for _ in 0..3 {
        let _ = step(&mut st);
    }
    // The slots' lengths advanced with every step: rewind them (outside the profiled range).
    load_all(&mut st)?;
    sync(dev);
    profiler(true)?;
    let t0 = Instant::now();
    let out = step(&mut st);
    let t1 = Instant::now();
    sync(dev);
    let t2 = Instant::now();
    profiler(false)?;
    drop(out);
    println!(
        "profiled one {} decode step (batch {batch}): host dispatch {:.1} µs, wall {:.1} µs",
        if slots { "slot (engine)" } else { "ragged" },
        (t1 - t0).as_secs_f64() * 1e6,
        (t2 - t0).as_secs_f64() * 1e6
    );
    Ok(())
}

/// The engine's decode step over `batch` slots (each holding the same prefilled prompt, fed a different token), captured
/// as the engine captures it: `n` replays back to back between two syncs, what the device takes
/// per step (the engine's own step time adds the host's share).
fn slot_step(a: &Args, m: &NemotronH, dev: &Device, prompt: &[u32], batch: usize) -> Res<()> {
    use burn::tensor::capture;
    let n = 20usize;
    let reps = a.repeats.max(1) + 1;
    let (state, ids) = prefilled(m, dev, prompt)?;
    // Every replay advances the slots' lengths on the device: room for all of them.
    let mut st = m.new_slots(batch, prompt.len() + 4 * n * reps + 16)?;
    for s in 0..batch {
        m.load_slot(&mut st, s, &state)?;
    }
    let tok: Vec<i64> = ids
        .into_data()
        .convert::<i64>()
        .into_vec()
        .map_err(|e| format!("{e:?}"))?;
    // A different token per row, so the rows route to different experts as a real batch does
    // (the same token in every row sends the whole batch to one expert set: a step of batch 16
    // measured 5.4 ms that way against the engine's 8.1).
    let v = m.config().vocab_size;
    let ids_host: Vec<i32> = (0..batch)
        .map(|b| ((tok[0] as usize + b * 7919) % v) as i32)
        .collect();
    let gi = Tensor::<1, Int>::from_data(
        TensorData::new(ids_host.clone(), [batch]),
        (dev, BDType::I32),
    );
    let gs = Tensor::<1, Int>::from_data(
        TensorData::new((0..batch as i32).collect::<Vec<_>>(), [batch]),
        (dev, BDType::I32),
    );
    let (ci, cs, cst) = (gi.clone(), gs.clone(), st.clone());
    let mut g = capture(dev, move || {
        let mut s = cst.clone();
        let l = m.decode_slots(&mut s, &ci.clone().reshape([batch, 1]), &cs);
        let am = ops::argmax_rows(l.clone());
        (l, am)
    });
    if !g.is_hardware() {
        println!("slot step, batch {batch}: graphs not supported on this device; skipped");
        return Ok(());
    }
    let mut dev_t = vec![];
    for _ in 0..reps {
        sync(dev);
        let t0 = Instant::now();
        for _ in 0..n {
            // Safety: the model and the captured clones outlive the graph; one stream, this thread.
            unsafe {
                g.replay();
            }
        }
        sync(dev);
        dev_t.push(t0.elapsed().as_secs_f64() / n as f64);
    }
    let d = median(dev_t[1..].to_vec());
    println!(
        "slot step, batch {batch}, position {}: {n} replays back to back {:.1} µs/step ({:.1} tok/s; \
         the engine's step above adds the host's share: ids written, greedy ids read back), median of {}",
        prompt.len(),
        d * 1e6,
        batch as f64 / d,
        reps - 1
    );
    // The host's share taken apart: each step as the engine runs it (ids and slots written, the
    // replay, the greedy ids read back), and without the writes.
    let (mut wi, mut ws) = (gi.clone(), gs.clone());
    let slots_host: Vec<i32> = (0..batch as i32).collect();
    for writes in [true, false] {
        let mut t = vec![];
        for _ in 0..reps {
            sync(dev);
            let t0 = Instant::now();
            for _ in 0..n {
                if writes {
                    ops::write_i32(&mut wi, &ids_host);
                    ops::write_i32(&mut ws, &slots_host);
                }
                // Safety: as above.
                let (_, am) = unsafe { g.replay() };
                // `into_vec` forces the read (`into_data` alone is lazy on CUDA).
                let _ = am.clone().into_data().into_vec::<i32>();
            }
            t.push(t0.elapsed().as_secs_f64() / n as f64);
        }
        let h = median(t[1..].to_vec());
        println!(
            "slot step, batch {batch}: replay + greedy ids read back{} {:.1} µs/step (host share {:.1} µs)",
            if writes { " + ids and slots written" } else { "" },
            h * 1e6,
            (h - d) * 1e6
        );
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn profiler(on: bool) -> Res<()> {
    // The primary context CubeCL runs in, current on this thread for the profiler calls.
    let ctx = cudarc::driver::CudaContext::new(0)?;
    ctx.bind_to_thread()?;
    if on {
        cudarc::driver::profiler_start()?;
    } else {
        cudarc::driver::profiler_stop()?;
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn profiler(_on: bool) -> Res<()> {
    Err("--step-kernels needs the cuda feature (cuProfilerStart for ncu)".into())
}

/// One batch-1 decode step block by block under CubeCL's kernel profiler: a marker line after each
/// block (after a sync and a pause for the asynchronous log), so the kernel lines between two
/// markers are that block's.
fn profile_step(m: &NemotronH, dev: &Device, prompt: &[u32]) {
    let mut s = m.new_state();
    let _ = m.forward_last(&[prompt], &mut [&mut s]).expect("prefill");
    let pause = || std::thread::sleep(std::time::Duration::from_millis(100));
    sync(dev);
    pause();
    println!("=== profile: begin (one batch-1 decode step)");
    let blocks = m.layers();
    let _ = m.trace_step(7, &mut s, |l| {
        sync(dev);
        pause();
        match l {
            Some(l) => println!("=== profile: layer {l} {}", kind(blocks[l].mixer())),
            None => println!("=== profile: embedding"),
        }
    });
    sync(dev);
    pause();
    println!("=== profile: head");
}

fn kind(m: &Mixer) -> &'static str {
    match m {
        Mixer::Mamba(_) => "mamba2",
        Mixer::Moe(_) => "moe",
        Mixer::Attention(_) => "attention",
        Mixer::Mlp(_) => "mlp",
    }
}

/// Batch-1 decode steps, synchronizing after each block, timed by layer kind.
fn split_decode(m: &NemotronH, dev: &Device, prompt: &[u32]) {
    let mut s = m.new_state();
    let _ = m.forward_last(&[prompt], &mut [&mut s]).expect("prefill");
    let mut totals = std::collections::BTreeMap::<&str, (f64, usize)>::new();
    let blocks = m.layers();
    let steps = 8;
    for step in 0..steps {
        sync(dev);
        let mut t = Instant::now();
        let _ = m.trace_step((step * 31 % 100) as u32, &mut s, |l| {
            sync(dev);
            let name = match l {
                Some(l) => kind(blocks[l].mixer()),
                None => "embedding",
            };
            let e = totals.entry(name).or_default();
            e.0 += t.elapsed().as_secs_f64();
            e.1 += 1;
            t = Instant::now();
        });
        sync(dev);
        let e = totals.entry("norm_f + lm_head").or_default();
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

/// One kernel-table row: an op at one shape, its bytes and FLOPs.
struct Row<'a> {
    name: String,
    bytes: f64,
    flops: f64,
    op: Box<dyn FnMut() + 'a>,
}

/// Times `op` as `n` back-to-back launches between two syncs, and as `n` launches captured once
/// and replayed (CUDA graph; the closure re-run elsewhere): seconds per op, (eager, replayed).
fn device_time(dev: &Device, op: &mut dyn FnMut(), n: usize, reps: usize) -> (f64, f64) {
    for _ in 0..3 {
        op();
    }
    sync(dev);
    let mut eager = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..n {
            op();
        }
        sync(dev);
        eager.push(t.elapsed().as_secs_f64() / n as f64);
    }
    let mut g = burn::tensor::capture(dev, || {
        for _ in 0..n {
            op();
        }
    });
    sync(dev);
    let mut replay = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        // Safety: the op's inputs are owned by the closure's captures and outlive the graph.
        unsafe {
            g.replay();
        }
        sync(dev);
        replay.push(t.elapsed().as_secs_f64() / n as f64);
    }
    (median(eager), median(replay))
}

/// The device-timed kernel table at the Lightning shapes.
fn kernels(a: &Args, dev: &Device, dtype: BDType) -> Res<()> {
    let (n, reps) = (50, a.repeats.max(5));
    let esize = if dtype == BDType::F32 { 4.0 } else { 2.0 };
    let mut rng = Lcg::new(1);
    let act = |rng: &mut Lcg, shape: Vec<usize>| -> Tensor<2> {
        let len = shape.iter().product();
        Tensor::<1>::from_data(TensorData::new(rng.vec(len, 1.0), [len]), (dev, dtype))
            .reshape([shape[0], len / shape[0]])
    };
    // The copy ceiling in this run: a 1 GiB buffer read and written.
    let big = Tensor::<1>::from_data(
        TensorData::new(vec![1.0f32; 1 << 28], [1 << 28]),
        (dev, BDType::F32),
    );
    let (ce, cr) = device_time(dev, &mut || drop(big.clone() + 1.0), 10, reps);
    let ceiling = 2.0 * (1u64 << 30) as f64 / ce.min(cr);
    println!(
        "kernel table ({}, activations {}; µs per op call; eager = {n} launches between two syncs, \
         replay = the same {n} launches as one captured graph; median of {reps})",
        a.backend,
        dtype_name(dtype)
    );
    println!(
        "copy ceiling measured here: {:.0} GB/s (1 GiB read + written; eager {:.1} µs, replay {:.1} µs)",
        ceiling / 1e9,
        ce * 1e6,
        cr * 1e6
    );
    let nvfp4 = |rng: &mut Lcg, e: usize, nout: usize, k: usize| -> Vec<Nvfp4Matrix> {
        (0..e)
            .map(|_| Nvfp4Matrix {
                out_features: nout,
                in_features: k,
                packed: rng.bytes(nout * k / 2),
                // Scale bytes kept below 0x7F so none decodes to NaN.
                block_scales: rng
                    .bytes(nout * k / 16)
                    .into_iter()
                    .map(|b| 0x30 + (b % 16))
                    .collect(),
                global_scale: 1e-3,
            })
            .collect()
    };
    let fp8 = |rng: &mut Lcg, nout: usize, k: usize| -> Fp8Matrix {
        Fp8Matrix {
            out_features: nout,
            in_features: k,
            weight: rng.bytes(nout * k).into_iter().map(|b| b & 0x7E).collect(),
            weight_scale: 1e-3,
            input_scale: 1e-2,
        }
    };
    let mut rows: Vec<Row> = vec![];
    // Batch 1 on both paths: the GEMVs, and the tensor cores with one token of eight used
    // (routed: slot-major, one cube row per slot).
    let gemv = (usize::MAX, usize::MAX);
    let tc = (1usize, 1usize);
    let tc1 = (1usize, usize::MAX);
    let b1_paths = [("GEMV", gemv), ("tensor cores", tc1)];
    for (k, nout) in [
        (2688, 1856),
        (1856, 2688),
        (2688, 3712),
        (3712, 2688),
        (2688, 10304),
        (4096, 2688),
        (2688, 131072),
    ] {
        let w = Nvfp4Weights::upload(&nvfp4(&mut rng, 1, nout, k), dev);
        let x = act(&mut rng, vec![1, k]);
        for (path, min) in b1_paths {
            let (x, w) = (x.clone(), w.clone());
            rows.push(Row {
                name: format!("NVFP4 GEMV {k}→{nout} {path}"),
                bytes: (nout * k / 2 + nout * k / 16) as f64 + esize * (k + nout) as f64,
                flops: 2.0 * (k * nout) as f64,
                op: Box::new(move || {
                    let saved = mma::mma();
                    mma::set_mma_min(min.0, min.1);
                    drop(ops::nvfp4_linear(x.clone(), &w, Epilogue::None));
                    mma::set_mma(saved);
                }),
            });
        }
    }
    for (k, nout, div, epi) in [
        (2688, 1856, 6, Epilogue::Relu2),
        (1856, 2688, 1, Epilogue::None),
    ] {
        let w = Nvfp4Weights::upload(&nvfp4(&mut rng, 128, nout, k), dev);
        let x = act(&mut rng, vec![6 / div, k]);
        let idx =
            Tensor::<1, Int>::from_data(TensorData::new(vec![3i32, 17, 42, 77, 90, 121], [6]), dev);
        for (path, min) in b1_paths {
            let (x, w, idx) = (x.clone(), w.clone(), idx.clone());
            rows.push(Row {
                name: format!("NVFP4 experts 6 of 128 {k}→{nout} ({epi:?}) {path}"),
                bytes: 6.0 * (nout * k / 2 + nout * k / 16) as f64
                    + esize * (6 / div * k + 6 * nout) as f64,
                flops: 12.0 * (k * nout) as f64,
                op: Box::new(move || {
                    let saved = mma::mma();
                    mma::set_mma_min(min.0, min.1);
                    drop(ops::nvfp4_expert_linear(
                        x.clone(),
                        idx.clone(),
                        div,
                        &w,
                        epi,
                    ));
                    mma::set_mma(saved);
                }),
            });
        }
    }
    // Batches 16 and 64: 96 / 384 routed slots over 128 experts (duplicates, as routing gives
    // them), slot-major GEMV and tensor cores (grouped by expert).
    for tokens in [16usize, 64] {
        let (k, nout) = (2688, 1856);
        let w = Nvfp4Weights::upload(&nvfp4(&mut rng, 128, nout, k), dev);
        let x = act(&mut rng, vec![tokens, k]);
        let ids: Vec<i32> = (0..tokens * 6)
            .map(|i| ((i * 7919 + (i / 6) * 31) % 128) as i32)
            .collect();
        let uniq = ids.iter().collect::<std::collections::HashSet<_>>().len();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(ids, [tokens * 6]), dev);
        for (path, min) in [("slot-major GEMV", gemv), ("tensor cores", tc)] {
            let (x, idx, w) = (x.clone(), idx.clone(), w.clone());
            rows.push(Row {
                name: format!(
                    "NVFP4 experts {} slots ({uniq} experts) {k}→{nout} {path}",
                    tokens * 6
                ),
                bytes: uniq as f64 * (nout * k / 2 + nout * k / 16) as f64
                    + esize * (tokens * k + tokens * 6 * nout) as f64,
                flops: 2.0 * (tokens * 6 * k * nout) as f64,
                op: Box::new(move || {
                    let saved = mma::mma();
                    mma::set_mma_min(min.0, min.1);
                    drop(ops::nvfp4_expert_linear(
                        x.clone(),
                        idx.clone(),
                        6,
                        &w,
                        Epilogue::Relu2,
                    ));
                    mma::set_mma(saved);
                }),
            });
        }
    }
    // Batched plain linears: the shared expert's up projection and lm_head (NVFP4), Mamba's
    // in_proj and out_proj (FP8), small-M GEMV against tensor cores.
    for (tokens, k, nout, fp8w) in [
        (16usize, 2688usize, 3712usize, false),
        (64, 2688, 3712, false),
        (16, 2688, 131072, false),
        (16, 2688, 10304, true),
        (64, 2688, 10304, true),
        (64, 4096, 2688, true),
    ] {
        let x = act(&mut rng, vec![tokens, k]);
        let (wbytes, run): (f64, Box<dyn Fn(Tensor<2>)>) = if fp8w {
            let w = Fp8Weights::upload(&[fp8(&mut rng, nout, k)], dev);
            (
                (nout * k) as f64,
                Box::new(move |x| drop(ops::fp8_linear(x, &w, Epilogue::None))),
            )
        } else {
            let w = Nvfp4Weights::upload(&nvfp4(&mut rng, 1, nout, k), dev);
            (
                (nout * k / 2 + nout * k / 16) as f64,
                Box::new(move |x| drop(ops::nvfp4_linear(x, &w, Epilogue::None))),
            )
        };
        let run = std::rc::Rc::new(run);
        for (path, min) in [("small-M GEMV", gemv), ("tensor cores", tc)] {
            let (x, run) = (x.clone(), run.clone());
            rows.push(Row {
                name: format!(
                    "{} {tokens} rows {k}→{nout} {path}",
                    if fp8w { "FP8 W8A8" } else { "NVFP4" }
                ),
                bytes: wbytes + esize * tokens as f64 * (k + nout) as f64,
                flops: 2.0 * (tokens * k * nout) as f64,
                op: Box::new(move || {
                    let saved = mma::mma();
                    mma::set_mma_min(min.0, min.1);
                    run(x.clone());
                    mma::set_mma(saved);
                }),
            });
        }
    }
    // The Mamba in_proj whole and as the engine runs it (z, xBC, dt), and out_proj.
    for (k, nout) in [
        (2688, 10304),
        (2688, 4096),
        (2688, 6144),
        (2688, 64),
        (4096, 2688),
    ] {
        let w = Fp8Weights::upload(&[fp8(&mut rng, nout, k)], dev);
        let x = act(&mut rng, vec![1, k]);
        for (path, min, inq) in [
            ("GEMV", gemv, 0),
            ("tensor cores, quantized in-kernel", tc1, 8),
            ("tensor cores, quantized apart", tc1, 0),
        ] {
            let (x, w) = (x.clone(), w.clone());
            rows.push(Row {
                name: format!("FP8 W8A8 GEMV {k}→{nout} {path}"),
                bytes: (nout * k) as f64 + esize * (k + nout) as f64,
                flops: 2.0 * (k * nout) as f64,
                op: Box::new(move || {
                    let saved = mma::mma();
                    mma::set_mma_min(min.0, min.1);
                    mma::set_fp8_inq_max(inq);
                    drop(ops::fp8_linear(x.clone(), &w, Epilogue::None));
                    mma::set_mma(saved);
                    mma::set_fp8_inq_max(mma::FP8_INQ_MAX_ROWS);
                }),
            });
        }
    }
    // Attention q and k/v projections (bf16) and the router (f32 weight over bf16 activations),
    // as the engine calls them: `dense_linear` against `w [N, K]`.
    for (k, nout, f32_weights) in [(2688, 4096, false), (2688, 256, false), (2688, 128, true)] {
        let wd = if f32_weights { BDType::F32 } else { dtype };
        let w = Tensor::<1>::from_data(
            TensorData::new(rng.vec(k * nout, 0.05), [k * nout]),
            (dev, wd),
        )
        .reshape([nout, k]);
        let x = act(&mut rng, vec![1, k]);
        let ws = if f32_weights { 4.0 } else { esize };
        for (path, min) in b1_paths {
            let (x, w) = (x.clone(), w.clone());
            rows.push(Row {
                name: format!("dense GEMV {k}→{nout} ({}) {path}", dtype_name(wd)),
                bytes: ws * (k * nout) as f64 + esize * k as f64 + ws * nout as f64,
                flops: 2.0 * (k * nout) as f64,
                op: Box::new(move || {
                    let saved = mma::mma();
                    mma::set_mma_min(min.0, min.1);
                    drop(ops::dense_linear(x.clone(), w.clone()));
                    mma::set_mma(saved);
                }),
            });
        }
    }
    {
        let (h, p, ns, g) = (64, 64, 128, 8);
        let st = Tensor::<4>::zeros([1, h, p, ns], (dev, BDType::F32));
        let x = act(&mut rng, vec![1, h * p]).reshape([1, 1, h, p]);
        let dt = Tensor::<3>::ones([1, 1, h], (dev, dtype)) * 0.01;
        let av = Tensor::<1>::ones([h], (dev, dtype)) * -1.0;
        let bm = act(&mut rng, vec![1, g * ns]).reshape([1, 1, g, ns]);
        let d = Tensor::<1>::ones([h], (dev, dtype));
        rows.push(Row {
            name: format!("selective scan, 1 token {h}×{p}×{ns} (ragged path)"),
            bytes: 2.0 * (h * p * ns * 4) as f64,
            flops: 5.0 * (h * p * ns) as f64,
            op: Box::new(move || {
                drop(ops::selective_scan(
                    x.clone(),
                    dt.clone(),
                    av.clone(),
                    bm.clone(),
                    bm.clone(),
                    d.clone(),
                    Some(st.clone()),
                    &[1],
                ))
            }),
        });
        // The engine's step: the state slot updated in place, x | B | C read from the conv
        // output row, the dt softplus inside.
        let pool = Tensor::<4>::zeros([1, h, p, ns], (dev, BDType::F32));
        let slot0 = Tensor::<1, Int>::from_data(TensorData::new(vec![0i32], [1]), dev);
        let xbc = act(&mut rng, vec![1, h * p + 2 * g * ns]);
        let dts = Tensor::<2>::ones([1, h], (dev, dtype)) * -4.0;
        let dims = nemotron::kernels::ScanDims {
            heads: h,
            head_dim: p,
            groups: g,
            state: ns,
        };
        let (av2, d2, bias2) = (
            Tensor::<1>::ones([h], (dev, dtype)) * -1.0,
            Tensor::<1>::ones([h], (dev, dtype)),
            Tensor::<1>::zeros([h], (dev, dtype)),
        );
        rows.push(Row {
            name: format!("SSM state step {h}×{p}×{ns} (slot, in place)"),
            bytes: 2.0 * (h * p * ns * 4) as f64,
            flops: 5.0 * (h * p * ns) as f64,
            op: Box::new(move || {
                drop(ops::ssm_step(
                    xbc.clone(),
                    dts.clone(),
                    bias2.clone(),
                    av2.clone(),
                    d2.clone(),
                    pool.clone(),
                    &slot0,
                    dims,
                    None,
                ))
            }),
        });
        let c = 6144;
        let x = act(&mut rng, vec![1, c]).reshape([1, 1, c]);
        let w = act(&mut rng, vec![c, 4]);
        let st = Tensor::<3>::zeros([1, c, 3], (dev, dtype));
        rows.push(Row {
            name: format!("causal conv step {c} channels, K=4"),
            bytes: esize * (c * (1 + 4 + 3 + 3 + 1)) as f64,
            flops: 8.0 * c as f64,
            op: Box::new(move || {
                drop(ops::causal_conv1d(
                    x.clone(),
                    w.clone(),
                    None,
                    st.clone(),
                    &[1],
                ))
            }),
        });
        let dtr = act(&mut rng, vec![1, h]).reshape([1, 1, h]);
        let bias = Tensor::<1>::ones([h], (dev, dtype));
        rows.push(Row {
            name: format!("dt softplus {h} heads"),
            bytes: esize * (3 * h) as f64,
            flops: 0.0,
            op: Box::new(move || drop(ops::dt_softplus(dtr.clone(), bias.clone(), None))),
        });
    }
    {
        let e = 128;
        let logits = act(&mut rng, vec![1, e]).cast(BDType::F32);
        let bias = Tensor::<1>::zeros([e], (dev, BDType::F32));
        let c = nemotron::kernels::RouteConfig {
            top_k: 6,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: 2.5,
            weights_from_biased: false,
        };
        // Decode attention (batch 1, 32 q heads over 2 kv heads, head 128) at 1K and 8K of
        // context: append, scores, chunk partials, merge.
        for ctx in [1024usize, 8192] {
            let (nh, kvh, hd, cap) = (32usize, 2usize, 128usize, ctx + 64);
            let q = act(&mut rng, vec![1, nh * hd]).reshape([1, nh, hd]);
            let k = act(&mut rng, vec![1, kvh * hd]).reshape([1, kvh, hd]);
            let v = act(&mut rng, vec![1, kvh * hd]).reshape([1, kvh, hd]);
            let kp = nemotron::kernels::ops::contiguous(Tensor::<4>::zeros(
                [1, kvh, cap, hd],
                (dev, dtype),
            ));
            let vp = nemotron::kernels::ops::contiguous(Tensor::<4>::zeros(
                [1, kvh, cap, hd],
                (dev, dtype),
            ));
            let lens = Tensor::<1, Int>::from_data(TensorData::new(vec![ctx as i32], [1]), dev);
            let slot0 = Tensor::<1, Int>::from_data(TensorData::new(vec![0i32], [1]), dev);
            rows.push(Row {
                name: format!("decode attention 1×{nh} heads, {ctx} context"),
                bytes: esize * (2 * kvh * (ctx + 1) * hd) as f64,
                flops: 4.0 * (nh * (ctx + 1) * hd) as f64,
                op: Box::new(move || {
                    drop(ops::attention_step(
                        q.clone(),
                        k.clone(),
                        v.clone(),
                        kp.clone(),
                        vp.clone(),
                        &lens,
                        &slot0,
                        1.0 / (hd as f32).sqrt(),
                    ))
                }),
            });
        }
        rows.push(Row {
            name: "MoE routing 128 experts, top 6".into(),
            bytes: (4 * 2 * e + 8 * 6) as f64,
            flops: 0.0,
            op: Box::new(move || drop(ops::moe_route(logits.clone(), bias.clone(), &c))),
        });
        let v = 131_072;
        let logits = act(&mut rng, vec![1, v]);
        let l2 = logits.clone();
        rows.push(Row {
            name: format!("vocab argmax 1×{v} (ours)"),
            bytes: esize * v as f64,
            flops: 0.0,
            op: Box::new(move || drop(ops::argmax_rows(logits.clone()))),
        });
        rows.push(Row {
            name: format!("vocab argmax 1×{v} (Burn's argmax)"),
            bytes: esize * v as f64,
            flops: 0.0,
            op: Box::new(move || drop(l2.clone().argmax(1))),
        });
        let h = 2688;
        let x = act(&mut rng, vec![1, h]);
        let w = Tensor::<1>::ones([h], (dev, dtype));
        rows.push(Row {
            name: format!("RMSNorm 1×{h}"),
            bytes: esize * (3 * h) as f64,
            flops: 0.0,
            op: Box::new(move || drop(ops::rms_norm(x.clone(), None, w.clone(), 1, 1e-5))),
        });
        let (x2, y2) = (act(&mut rng, vec![1, h]), act(&mut rng, vec![1, h]));
        let w2 = Tensor::<1>::ones([h], (dev, dtype));
        rows.push(Row {
            name: format!("residual add + RMSNorm 1×{h}"),
            bytes: esize * (5 * h) as f64,
            flops: 0.0,
            op: Box::new(move || drop(ops::add_rms_norm(x2.clone(), y2.clone(), w2.clone(), 1e-5))),
        });
        let i = 4096;
        let y = act(&mut rng, vec![1, i]);
        let z = act(&mut rng, vec![1, i]);
        let w = Tensor::<1>::ones([i], (dev, dtype));
        rows.push(Row {
            name: format!("gated group RMSNorm 1×{i}, 8 groups"),
            bytes: esize * (4 * i) as f64,
            flops: 0.0,
            op: Box::new(move || {
                drop(ops::rms_norm(
                    y.clone(),
                    Some(z.clone()),
                    w.clone(),
                    8,
                    1e-5,
                ))
            }),
        });
    }
    println!(
        "{:<44} {:>10} {:>10} {:>11} {:>9} {:>8} {:>10}",
        "op", "eager µs", "replay µs", "bytes", "GB/s", "% copy", "GFLOP/s"
    );
    for mut r in rows {
        let (e, g) = device_time(dev, &mut r.op, n, reps);
        let t = g.min(e);
        println!(
            "{:<44} {:>10.2} {:>10.2} {:>11.0} {:>9.1} {:>7.1}% {:>10}",
            r.name,
            e * 1e6,
            g * 1e6,
            r.bytes,
            r.bytes / t / 1e9,
            100.0 * r.bytes / t / ceiling,
            if r.flops > 0.0 {
                format!("{:.1}", r.flops / t / 1e9)
            } else {
                "-".into()
            }
        );
    }
    Ok(())
}
