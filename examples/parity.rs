//! Writes the logits other tools compare against:
//!
//! `cargo run --release --example parity -- --model DIR --prompt-ids 3,5,7 [--force-ids 9,11,13]
//!  --out FILE.safetensors [--backend flex] [--dtype f32] [--decode-path ragged|slots]
//!  [--prefill-chunk N] [--kv-cache-dtype auto|fp8]`
//!
//! The output holds `prefill_logits` (F32 `[T, V]`, one prefill over the prompt, or with
//! `--prefill-chunk N` one per piece of N tokens with the state carried between them) and
//! `decode_logits` (F32 `[n, V]`, n = number of force ids): row 0 = logits after the prompt,
//! row i = logits after feeding `force-ids[i-1]` through incremental decode with the cache —
//! the ragged forward's (`--decode-path ragged`, the default: what `generate` uses) or the
//! decode engine's fixed state slot (`--decode-path slots`), whose KV cache `--kv-cache-dtype fp8`
//! holds as E4M3 codes with the checkpoint's scales.
//! Prints the backend and the activation dtype the model runs in. Bad arguments or a bad
//! checkpoint: one line on stderr and exit 1.

use burn::tensor::{Device, Int, Tensor, TensorData};
use clap::Parser;
use nemotron::model::{KvCacheDtype, NemotronH};
use nemotron::{dtype_name, BackendKind, DType};
use safetensors::{serialize_to_file, Dtype, View};
use std::borrow::Cow;
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "Prefill and teacher-forced decode logits of a NemotronH checkpoint")]
struct Args {
    #[arg(long)]
    model: PathBuf,
    /// Comma-separated prompt token ids.
    #[arg(long, value_delimiter = ',', required = true)]
    prompt_ids: Vec<u32>,
    /// Comma-separated ids fed one by one after the prompt.
    #[arg(long, value_delimiter = ',')]
    force_ids: Vec<u32>,
    #[arg(long)]
    out: PathBuf,
    /// flex | ndarray | wgpu | cuda
    #[arg(long, default_value = "flex")]
    backend: String,
    /// f32 | bf16 (cuda)
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// ragged (the per-sequence cache `generate` uses) | slots (the decode engine's state slot)
    #[arg(long, default_value = "ragged")]
    decode_path: String,
    /// auto (the library's size thresholds) | tiled (prefill's grouped-expert path from one
    /// routing slot, sorted on the device, where it exists: bf16 on CUDA)
    #[arg(long, default_value = "auto")]
    prefill_kernels: String,
    /// Prefill the prompt in pieces of N tokens, the state carried between them (0: one piece)
    #[arg(long, default_value_t = 0)]
    prefill_chunk: usize,
    /// auto (the activation dtype) | fp8 (E4M3 with the checkpoint's k_scale/v_scale): the
    /// slot's KV cache, so with `--decode-path slots` only
    #[arg(long, default_value = "auto")]
    kv_cache_dtype: String,
}

struct F32s(Vec<f32>, Vec<usize>);

impl View for &F32s {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.1
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.0.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
    fn data_len(&self) -> usize {
        self.0.len() * 4
    }
}

fn main() {
    let args = Args::parse();
    let r = (|| -> Result<(), String> {
        let kind: BackendKind = args
            .backend
            .parse()
            .map_err(|e: nemotron::Error| e.to_string())?;
        let dtype: DType = args
            .dtype
            .parse()
            .map_err(|e: nemotron::Error| e.to_string())?;
        let dev = kind.device(dtype).map_err(|e| e.to_string())?;
        run(&args, &dev, dtype)
    })();
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn host(t: Tensor<2>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .into_vec()
        .expect("f32 logits")
}

/// Applies `--prefill-kernels` (refused by name when unknown; `tiled` in a build without a cube
/// backend, where no threshold exists, is refused rather than ignored).
fn prefill_kernels(v: &str) -> Result<(), String> {
    match v {
        "auto" => Ok(()),
        "tiled" => force_tiled(),
        v => Err(format!("--prefill-kernels {v:?}: expected auto or tiled")),
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn force_tiled() -> Result<(), String> {
    use nemotron::kernels::cube::{set_prefill_kernels, PrefillKernels};
    set_prefill_kernels(PrefillKernels::Tiled);
    Ok(())
}

#[cfg(not(any(feature = "cuda", feature = "wgpu")))]
fn force_tiled() -> Result<(), String> {
    Err("--prefill-kernels tiled needs a build with the cuda or wgpu feature".into())
}

fn run(a: &Args, dev: &Device, dtype: DType) -> Result<(), String> {
    prefill_kernels(&a.prefill_kernels)?;
    let kv: KvCacheDtype = a
        .kv_cache_dtype
        .parse()
        .map_err(|e| format!("--kv-cache-dtype: {e}"))?;
    if kv != KvCacheDtype::Auto && a.decode_path != "slots" {
        return Err(format!(
            "--kv-cache-dtype {kv} is the decode slots' cache: add --decode-path slots (the \
             ragged path keeps keys in the activation dtype)"
        ));
    }
    let m = NemotronH::load_as(&a.model, dev, dtype.burn())
        .and_then(|m| m.with_kv_cache(kv))
        .map_err(|e| e.to_string())?;
    // The dtype the model's tensors hold, not the one asked for: a mismatch must show.
    println!(
        "backend: {}, activations: {}",
        a.backend,
        dtype_name(m.dtype())
    );
    let v = m.config().vocab_size;
    if let Some(bad) = a
        .prompt_ids
        .iter()
        .chain(&a.force_ids)
        .find(|&&i| i as usize >= v)
    {
        return Err(format!("token id {bad} is outside the vocabulary ({v})"));
    }
    let t = a.prompt_ids.len();
    let mut s = m.new_state();
    let prefill = host(
        m.forward_one_chunked(&a.prompt_ids, &mut s, a.prefill_chunk)
            .map_err(|e| e.to_string())?,
    );

    let n = a.force_ids.len();
    let slots = match a.decode_path.as_str() {
        "ragged" => false,
        "slots" => true,
        p => return Err(format!("--decode-path {p:?}: expected ragged or slots")),
    };
    let mut decode = Vec::with_capacity(n * v);
    if n > 0 {
        let mut s = m.new_state();
        let first = m
            .forward_one_chunked(&a.prompt_ids, &mut s, a.prefill_chunk)
            .map_err(|e| e.to_string())?;
        decode.extend(nemotron::model::generate::last_row(first));
        if slots {
            let dev = m.device().clone();
            let mut st = m.new_slots(1, t + n).map_err(|e| e.to_string())?;
            m.load_slot(&mut st, 0, &s).map_err(|e| e.to_string())?;
            let slot = Tensor::<1, Int>::from_data(
                TensorData::new(vec![0i32], [1]),
                (&dev, burn::tensor::DType::I32),
            );
            for &id in &a.force_ids[..n - 1] {
                let ids = Tensor::<2, Int>::from_data(
                    TensorData::new(vec![id as i32], [1, 1]),
                    (&dev, burn::tensor::DType::I32),
                );
                let logits = m.decode_slots(&mut st, &ids, &slot);
                st.note_step(&[0]);
                decode.extend(host(logits));
            }
        } else {
            for &id in &a.force_ids[..n - 1] {
                decode.extend(host(
                    m.forward_one(&[id], &mut s).map_err(|e| e.to_string())?,
                ));
            }
        }
    }
    let p = F32s(prefill, vec![t, v]);
    let d = F32s(decode, vec![n, v]);
    serialize_to_file(
        [("prefill_logits", &p), ("decode_logits", &d)],
        None,
        &a.out,
    )
    .map_err(|e| format!("{}: {e}", a.out.display()))?;
    Ok(())
}
