//! One decode step between `cuProfilerStart` and `cuProfilerStop`, after a prefill and warm-up
//! steps, for `ncu --profile-from-start off` to time each kernel of that step on the device
//! (`tools/kernel_table.py` turns ncu's CSV into the per-token table: kernel × launches × device
//! µs). CUDA only (`required-features = ["cuda"]`):
//!
//! `ncu --profile-from-start off --metrics gpu__time_duration.sum --csv
//!  target/release/examples/profile (--model DIR | --synthetic lightning) [--dtype bf16]
//!  [--prompt-len 1024] [--engine [--batch 16]] [--mma-min SETTING] [--kv-cache-dtype fp8]`
//!
//! `--synthetic lightning` builds the full-size Lightning checkpoint in memory (`synth
//! --geometry lightning`'s weights, seed 0) instead of reading one. With `--engine` the step is
//! the engine's (`decode_slots` over `--batch` slots, each holding the same prefilled prompt, each
//! row fed its own token so the rows route to different experts as a served batch does); without
//! it, the ragged forward's at batch 1. With `--prefill` the
//! profiled range is instead one prefill of `--batch` prompts of `--prompt-len` tokens (the ragged
//! forward over fresh states, after one warm-up prefill of the same shape): the load and the
//! warm-up run outside ncu's range, so a 64 × 128 prefill is profiled in a fraction of the time
//! `ncu` over a whole `bench` run takes.

use burn::tensor::{DType as BDType, Device, Int, Tensor, TensorData};
use clap::Parser;
use nemotron::model::generate::device_argmax;
use nemotron::model::{NemotronH, SlotState};
use nemotron::{BackendKind, DType};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// The checkpoint directory (`synth --geometry lightning` writes the full-size one).
    #[arg(
        long,
        required_unless_present = "synthetic",
        conflicts_with = "synthetic"
    )]
    model: Option<PathBuf>,
    /// `lightning`: the full-size Lightning checkpoint built in memory (seed 0) instead.
    #[arg(long)]
    synthetic: Option<String>,
    /// The slots' KV cache with --engine: auto | fp8.
    #[arg(long, default_value = "auto")]
    kv_cache_dtype: String,
    /// The slots' Mamba SSM state with --engine: float32 | bfloat16.
    #[arg(long, default_value = "float32")]
    mamba_ssm_cache_dtype: String,
    /// How each MoE layer runs its shared expert: apart | fold | auto[:N] (`bench --shared-expert`).
    #[arg(long, default_value = "auto")]
    shared_expert: String,
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Prompt tokens before the profiled step.
    #[arg(long, default_value_t = 1024)]
    prompt_len: usize,
    /// Profile the engine's slot step instead of the ragged forward's.
    #[arg(long)]
    engine: bool,
    /// Slots of the engine's step (with --engine), or prompts of the profiled prefill (with
    /// --prefill); the ragged decode step is batch 1.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Profile one prefill of --batch prompts of --prompt-len tokens instead of a decode step.
    #[arg(long)]
    prefill: bool,
    /// One kernel setting (`bench --mma-min`'s syntax) instead of the library's defaults.
    #[arg(long)]
    mma_min: Option<String>,
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let a = Args::parse();
    if let Err(e) = run(&a) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(a: &Args) -> Res<()> {
    if a.prefill && a.engine {
        return Err(
            "--prefill profiles the ragged forward's prefill, --engine the engine's decode step: \
             pick one"
                .into(),
        );
    }
    if a.batch != 1 && !a.engine && !a.prefill {
        return Err(
            "--batch applies to the engine's step or a prefill: add --engine or --prefill".into(),
        );
    }
    if a.batch == 0 {
        return Err("--batch 0: at least one slot".into());
    }
    if a.prompt_len == 0 {
        return Err("--prompt-len 0: the step follows a prefill of at least one token".into());
    }
    let dtype: DType = a.dtype.parse()?;
    let dev = BackendKind::Cuda.device(dtype)?;
    if let Some(s) = &a.mma_min {
        use nemotron::kernels::cube::settings::Settings;
        Settings::parse(s)
            .and_then(|s| s.apply())
            .map_err(|e| format!("--mma-min {e}"))?;
    }
    let kv: nemotron::model::KvCacheDtype = a
        .kv_cache_dtype
        .parse()
        .map_err(|e| format!("--kv-cache-dtype: {e}"))?;
    if kv != nemotron::model::KvCacheDtype::Auto && !a.engine {
        return Err("--kv-cache-dtype is the engine's slot cache: add --engine".into());
    }
    let ssm: nemotron::model::SsmCacheDtype = a
        .mamba_ssm_cache_dtype
        .parse()
        .map_err(|e| format!("--mamba-ssm-cache-dtype: {e}"))?;
    if ssm != nemotron::model::SsmCacheDtype::F32 && !a.engine {
        return Err("--mamba-ssm-cache-dtype is the engine's slot state: add --engine".into());
    }
    let build = nemotron::model::BuildOptions {
        shared_expert: a
            .shared_expert
            .parse()
            .map_err(|e| format!("--shared-expert {e}"))?,
    };
    let m = match (&a.model, a.synthetic.as_deref()) {
        (Some(dir), _) => NemotronH::load_with(dir, &dev, dtype.burn(), build)?,
        (None, Some("lightning")) => {
            use nemotron::loader::synth::{build_checkpoint, Geometry, SynthOptions, SynthRecipe};
            let opts = SynthOptions {
                recipe: SynthRecipe::LightningMixed,
                seed: 0,
                max_shard_bytes: 0,
                misalign: false,
            };
            let ck = build_checkpoint(&Geometry::lightning_30b(), &opts)?;
            NemotronH::from_checkpoint_with(ck, &dev, dtype.burn(), build)?
        }
        (None, g) => {
            return Err(format!("--synthetic {g:?}: only `lightning` (or give --model)").into())
        }
    }
    .with_kv_cache(kv)?
    .with_ssm_cache(ssm)?;
    let v = m.config().vocab_size;
    let prompt: Vec<u32> = (0..a.prompt_len)
        .map(|i| ((i * 7919 + 13) % v) as u32)
        .collect();
    if a.prefill {
        prefill_kernels(&m, &dev, &prompt, a.batch)
    } else {
        step_kernels(&m, &dev, &prompt, a.engine, a.batch)
    }
}

/// One prefill of `batch` copies of `prompt` over fresh states, profiled after one warm-up
/// prefill of the same shape.
fn prefill_kernels(m: &NemotronH, dev: &Device, prompt: &[u32], batch: usize) -> Res<()> {
    let prompts = vec![prompt; batch];
    let run = || -> Res<Tensor<2>> {
        let mut states: Vec<_> = (0..batch).map(|_| m.new_state()).collect();
        let mut refs: Vec<_> = states.iter_mut().collect();
        Ok(m.forward_last(&prompts, &mut refs)?)
    };
    drop(run()?);
    let (dispatch, wall) = profiled(dev, run)?;
    println!(
        "profiled one prefill of {batch} × {} tokens: host dispatch {:.1} ms, wall {:.1} ms",
        prompt.len(),
        dispatch * 1e3,
        wall * 1e3
    );
    Ok(())
}

fn sync(dev: &Device) -> Res<()> {
    Ok(dev.sync()?)
}

fn step_kernels(m: &NemotronH, dev: &Device, prompt: &[u32], slots: bool, batch: usize) -> Res<()> {
    let mut state = m.new_state();
    let next = device_argmax(m.forward_last(&[prompt], &mut [&mut state])?)[0];
    let ids = Tensor::<2, Int>::from_data(TensorData::new(vec![next as i32], [1, 1]), dev);
    let mut st = m.new_slots(batch, prompt.len() + 8)?;
    let load_all = |st: &mut SlotState| -> Res<()> {
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
    // Row `r` feeds its own token (the prompt's next one shifted by `r`), so a batch routes to
    // many experts as a served one does (one token repeated would send every row to the same).
    let _ = ids;
    let v = m.config().vocab_size as i32;
    let ids = Tensor::<2, Int>::from_data(
        TensorData::new(
            (0..batch as i32)
                .map(|r| (next as i32 + r * 7919) % v)
                .collect::<Vec<_>>(),
            [batch, 1],
        ),
        (dev, BDType::I32),
    );
    let step = |st: &mut SlotState| -> Res<Tensor<2>> {
        if slots {
            Ok(m.decode_slots(st, &ids, &slot))
        } else {
            let mut s = state.clone();
            Ok(m.forward_last_ids(ids.clone(), &mut [&mut s])?)
        }
    };
    for _ in 0..3 {
        let _ = step(&mut st)?;
    }
    // The slots' lengths advanced with every step: rewind them (outside the profiled range).
    load_all(&mut st)?;
    let (dispatch, wall) = profiled(dev, || step(&mut st))?;
    println!(
        "profiled one {} decode step (batch {batch}): host dispatch {:.1} µs, wall {:.1} µs",
        if slots { "slot (engine)" } else { "ragged" },
        dispatch * 1e6,
        wall * 1e6
    );
    Ok(())
}

/// Runs `f` between `cuProfilerStart` and `cuProfilerStop` after the device's earlier work
/// ends: the seconds to dispatch it and to finish it on the device.
fn profiled<T>(dev: &Device, f: impl FnOnce() -> Res<T>) -> Res<(f64, f64)> {
    sync(dev)?;
    profiler(true)?;
    let t0 = Instant::now();
    let out = f()?;
    let t1 = Instant::now();
    sync(dev)?;
    let t2 = Instant::now();
    profiler(false)?;
    drop(out);
    Ok(((t1 - t0).as_secs_f64(), (t2 - t0).as_secs_f64()))
}

/// `cuProfilerStart` / `cuProfilerStop` in the primary context CubeCL runs in (made current on
/// this thread for the calls).
fn profiler(on: bool) -> Res<()> {
    let ctx = cudarc::driver::CudaContext::new(0)?;
    ctx.bind_to_thread()?;
    if on {
        cudarc::driver::profiler_start()?;
    } else {
        cudarc::driver::profiler_stop()?;
    }
    Ok(())
}
