//! Throughput of NemotronH on any backend: prefill and decode tokens/s (median of repeats after a
//! warm-up, device synchronized), batch 1 or more, device memory in use, HF transformers for the
//! same checkpoint in the same run (CPU f32 for the host; GPU bf16, randomly initialized from the
//! same config, on CUDA), and the device-side views:
//!
//! - `--graph`: one batch-1 decode step captured as a graph (CUDA) and replayed, against the same
//!   step run eagerly — host µs and device µs per step, and whether the replayed logits equal the
//!   eager ones bit for bit.
//! - `--split`, `--profile-step`: a step by layer kind, synchronized per block, and CubeCL's
//!   kernel log per block (each kernel synchronized: counts are right, times inflated).
//!
//! `cargo run --release [--features cuda] --example bench -- [--backend flex|ndarray|wgpu|cuda]
//!  [--dtype f32|bf16] [--geometry tiny|small100m | --model DIR | --synthetic lightning]
//!  [--prompt-len 128] [--decode 32] [--batch 1] [--repeats 3] [--no-hf] [--graph]
//!  [--engine [--graphs on|off|on,off]]`
//!
//! Elsewhere: the device-timed kernel table at the Lightning shapes is `benches/kernels.rs`
//! (`cargo bench --bench kernels --features cuda -- --backend cuda --dtype bf16`); one decode step
//! for `ncu` is `examples/profile.rs` (CUDA only).
//!
//! Synthetic geometries on disk are written as BF16 checkpoints (HF cannot read NVFP4/FP8 ones).

use burn::tensor::{DType as BDType, Device, Int, Tensor, TensorData};
use clap::Parser;
use nemotron::kernels::cube::plans::linear as mma;
use nemotron::kernels::ops;
use nemotron::loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
use nemotron::model::generate::device_argmax;
use nemotron::model::layers::block::Mixer;
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
    /// instead of the library's defaults, or `key=value` items (`Settings::parse`); `default`
    /// is the library's defaults. Several, separated by `;`, run the engine once per setting
    /// (one load, paths compared in the same call); other modes take the first.
    #[arg(long, value_delimiter = ';')]
    mma_min: Vec<String>,
    /// With --engine: the engine's step token budget (decode rows first, then pieces of
    /// prompts; 0: no limit). Admission then runs over as many steps as the pieces need, all
    /// timed as the prefill.
    #[arg(long, default_value_t = 0)]
    step_tokens: usize,
    /// With --engine: the most tokens of one prompt a step prefills (0: no limit).
    #[arg(long, default_value_t = 0)]
    prefill_chunk: usize,
    /// With --engine: size the slots from device memory (a size, 24GiB, or a fraction of the
    /// memory free after loading, 0.9; CUDA) instead of one slot per batch row; every batch must
    /// fit the slots that gives.
    #[arg(long)]
    slot_memory: Option<String>,
    /// With --engine: the slots' KV cache, auto (the activation dtype) | fp8 (E4M3 with the
    /// checkpoint's k_scale/v_scale: half the KV bytes of bf16)
    #[arg(long, default_value = "auto")]
    kv_cache_dtype: String,
    /// With --engine: the slots' Mamba SSM state, float32 | bfloat16 (half the state bytes a
    /// decode step reads and writes; the step rounds the new state to nearest even)
    #[arg(long, default_value = "float32")]
    mamba_ssm_cache_dtype: String,
    /// How each MoE layer runs its shared expert: apart (its own two linears) | fold (stacked
    /// with the routed experts: one launch per projection) | auto[:N] (both held, decode steps
    /// of up to N rows folded, 8 by default, prefills apart; `BuildOptions::shared_expert`).
    /// Default: auto, as the library's.
    #[arg(long, default_value = "auto")]
    shared_expert: String,
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
        model(&a, &dev, dtype.burn())
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
    let build = nemotron::model::BuildOptions {
        shared_expert: a
            .shared_expert
            .parse()
            .map_err(|e| format!("--shared-expert {e}"))?,
    };
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
        let m = NemotronH::from_checkpoint_with(ck, dev, dtype, build)?;
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
    Ok((
        NemotronH::load_with(&dir, dev, dtype, build)?,
        dir,
        label,
        tmp,
    ))
}

fn model(a: &Args, dev: &Device, dtype: BDType) -> Res<()> {
    if !a.graphs.is_empty() && !a.engine {
        return Err("--graphs applies to the engine: add --engine".into());
    }
    let kv: nemotron::model::KvCacheDtype = a
        .kv_cache_dtype
        .parse()
        .map_err(|e| format!("--kv-cache-dtype: {e}"))?;
    let ssm: nemotron::model::SsmCacheDtype = a
        .mamba_ssm_cache_dtype
        .parse()
        .map_err(|e| format!("--mamba-ssm-cache-dtype: {e}"))?;
    if (a.step_tokens != 0
        || a.prefill_chunk != 0
        || a.slot_memory.is_some()
        || kv != nemotron::model::KvCacheDtype::Auto
        || ssm != nemotron::model::SsmCacheDtype::F32)
        && !a.engine
    {
        return Err(
            "--step-tokens, --prefill-chunk, --slot-memory, --kv-cache-dtype and \
             --mamba-ssm-cache-dtype apply to the engine: add --engine"
                .into(),
        );
    }
    let t0 = Instant::now();
    let (m, dir, label, _tmp) = load(a, dev, dtype)?;
    let m = m.with_kv_cache(kv)?.with_ssm_cache(ssm)?;
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
    // What the model was built with, not what was asked.
    let folded = m
        .layers()
        .iter()
        .filter(|b| matches!(b.mixer(), Mixer::Moe(moe) if moe.shared_folded()))
        .count();
    println!(
        "model: {label}, {} layers ({}), shared expert {} ({folded} MoE layers folded)",
        m.layers().len(),
        m.config().pattern(),
        a.shared_expert
    );
    if a.engine {
        // Read from the model the engine's slots are made by.
        println!("slot caches: KV {}, SSM {}", m.kv_cache(), m.ssm_cache());
    }
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
                "setting: {t} ({:?}, FP8 in-kernel quantizing up to {} rows, {:?}, attention {:?} \
                 split {} (0: by grid))",
                mma::mma(),
                mma::fp8_inq_max(),
                mma::tuning(),
                nemotron::kernels::cube::plans::attention::form(),
                nemotron::kernels::cube::plans::attention::gqa_split()
            );
            first.get_or_insert(engine_run_one(a, m, batch, plen, graphs)?);
        }
    }
    Ok(first.expect("at least one mode"))
}

/// The slot budget in bytes of the run's first engine (`--slot-memory`), kept for the others.
static SLOT_BUDGET: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

fn engine_run_one(
    a: &Args,
    m: &NemotronH,
    batch: usize,
    plen: usize,
    graphs: bool,
) -> Res<(f64, f64)> {
    use nemotron::model::{Engine, EngineOptions, GenerateOptions, SlotMemory};
    let cap = plen + a.decode + 1;
    let mut opts = match &a.slot_memory {
        None => EngineOptions::new(batch, cap),
        Some(sm) => {
            let sm: SlotMemory = sm.parse()?;
            // A fraction is of the free memory once, at the first engine of the run: later
            // engines (other batches, `--mma-min` settings) would see the pools the allocator
            // keeps from the earlier ones and size fewer slots (0.35 of an H100's free memory
            // held 256 slots, then 152: PERF 39).
            let budget = match SLOT_BUDGET.get() {
                Some(&b) => b,
                None => {
                    let b = sm.budget(m.device())?;
                    let _ = SLOT_BUDGET.set(b);
                    b
                }
            };
            let o = EngineOptions::for_memory(m, budget, cap)?;
            if o.max_batch < batch {
                return Err(format!(
                    "--slot-memory {sm} holds {} slots of {cap} tokens: fewer than batch {batch}",
                    o.max_batch
                )
                .into());
            }
            o
        }
    };
    opts.graphs = graphs;
    opts.step_tokens = a.step_tokens;
    opts.prefill_chunk = a.prefill_chunk;
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
        // One step, or under a token budget as many as the prompts' pieces take.
        let mut firsts = 0;
        while !e.is_idle() {
            firsts += e.step()?.iter().filter(|ev| ev.token.is_some()).count();
        }
        let t1 = Instant::now();
        assert_eq!(
            firsts, batch,
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
        // Admission (one ragged prefill) and the first decode step; under a token budget, the
        // steps until no prompt waits or is part-way (the decode steps of those already
        // admitted included).
        let mut produced = 0;
        loop {
            produced += e.step()?.iter().filter(|ev| ev.token.is_some()).count();
            if e.waiting() == 0 && e.prefilling() == 0 {
                break;
            }
        }
        let t1 = Instant::now();
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
        "nemotron-rs engine (graphs {}{}{}): prefill {p1:.1} tok/s (batch {batch} × {plen}, admission: every first token), {p:.1} incl. one decode step, decode {d:.2} tok/s (batch {batch}; {:.2} ms/step), median of {}; {} slots, {:.1} MiB (KV cache {})",
        if graphs { "on" } else { "off" },
        if a.step_tokens != 0 || a.prefill_chunk != 0 {
            format!(
                ", step budget {} / pieces of {} (0: no limit)",
                a.step_tokens, a.prefill_chunk
            )
        } else {
            String::new()
        },
        if e.captured().is_empty() { ", none captured".to_string() } else { format!(", captured {:?}", e.captured()) },
        1e3 * batch as f64 / d,
        a.repeats.max(1),
        e.slots().slots(),
        e.slots().bytes() as f64 / (1u64 << 20) as f64,
        m.kv_cache()
    );
    // What the allocator holds after the run (weights, slots, graphs and the pages it keeps for
    // reuse, the prefill's activations among them): not a measured peak, as CubeCL releases pages
    // left idle for a while.
    if let Some((total, reserved)) = nemotron::kernels::ops::device_memory(&dev) {
        println!(
            "device memory reserved by the allocator after the run: {:.2} GiB of {:.2} GiB",
            reserved as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64
        );
    }
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
