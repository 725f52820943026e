//! Prefill attention's form and launch: the tensor-core kernel ([`super::flash_mma`]) for bf16
//! on a device with bf16 `mma` where `flashmma=on` (the default), else the SIMT kernel
//! ([`super::flash`]) with the key tile the device's shared memory allows. The settings are
//! process-wide.

use super::{flash, flash_mma};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static FLASH: AtomicBool = AtomicBool::new(true);
static FLASH_MMA: AtomicBool = AtomicBool::new(true);

/// Whether the model's prefill attention runs these kernels (default on: on the H200 the SIMT
/// kernel took 1 × 8,192 prefill from 12,994 to 17,440 tok/s and 1 × 1,024 from 17,854 to
/// 18,977, PERF §31; off: the composed Burn ops with the `[heads, T, S]` scores in memory, for
/// comparisons). Process-wide.
pub fn set_flash(on: bool) {
    FLASH.store(on, Ordering::Relaxed);
}

/// The current value of [`set_flash`].
pub fn flash() -> bool {
    FLASH.load(Ordering::Relaxed)
}

/// Whether bf16 prefill attention takes the tensor-core kernel where the device has it (default
/// on: 1 × 8,192 prefill 17,878 → 24,605 tok/s and 1 × 1,024 18,912 → 19,662 against the SIMT
/// kernel on an H100, batches of 128-token prompts +1 %, PERF §32; whole-model CUDA parity green
/// with it on the H200, PERF §31; off: the SIMT kernel). f32 activations and devices without bf16
/// `mma` run the SIMT kernel whatever this says. Process-wide.
pub fn set_flash_mma(on: bool) {
    FLASH_MMA.store(on, Ordering::Relaxed);
}

/// The current value of [`set_flash_mma`].
pub fn flash_mma() -> bool {
    FLASH_MMA.load(Ordering::Relaxed)
}

/// A prefill attention launch's form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillForm {
    /// [`super::flash_mma`]: bf16 `mma`, 64 rows and 64 keys a cube.
    Mma,
    /// [`super::flash`] with this many keys a tile.
    Simt { keys: usize },
}

/// Why the tensor-core form cannot take heads of `d`, queries `q_width` wide, `bf16`
/// activations or not, on a device with bf16 `mma` (`mma`) and `max_shared` bytes of shared
/// memory per cube; `None` where it can (pure; tested on the host).
pub fn mma_refusal(
    d: usize,
    q_width: usize,
    bf16: bool,
    mma: bool,
    max_shared: usize,
) -> Option<String> {
    if !bf16 {
        return Some("the activations are not bf16".into());
    }
    if !mma {
        return Some("the device has no bf16 mma".into());
    }
    if !flash_mma::fits(d) {
        return Some(format!(
            "heads of {d} are not a multiple of 16 up to {}",
            crate::MAX_PREFILL_HEAD_DIM
        ));
    }
    if q_width % 8 != 0 {
        return Some(format!("query rows of {q_width} are not a multiple of 8"));
    }
    let need = flash_mma::shared_bytes(d);
    if need > max_shared {
        return Some(format!(
            "its tiles need {need} bytes of shared memory, the device has {max_shared}"
        ));
    }
    None
}

/// The form for heads of `d`, queries `q_width` wide, `bf16` activations, a device with bf16
/// `mma` (`mma`) and `max_shared` bytes of shared memory per cube, `flashmma` asked for or not:
/// the tensor-core kernel where asked and [`mma_refusal`] finds nothing against it, else the
/// SIMT kernel; `None` where no kernel takes the heads (pure; tested on the host).
pub fn plan(
    d: usize,
    q_width: usize,
    bf16: bool,
    mma: bool,
    max_shared: usize,
    flashmma: bool,
) -> Option<PrefillForm> {
    if flashmma && mma_refusal(d, q_width, bf16, mma, max_shared).is_none() {
        return Some(PrefillForm::Mma);
    }
    flash::keys_per_tile(max_shared, d).map(|keys| PrefillForm::Simt { keys })
}

static MMA_FALLBACKS: AtomicUsize = AtomicUsize::new(0);
static MMA_LAUNCHES: AtomicUsize = AtomicUsize::new(0);

/// Launches that ran the tensor-core kernel (for tests: that `flashmma=on` reached it).
pub fn flash_mma_launches() -> usize {
    MMA_LAUNCHES.load(Ordering::Relaxed)
}

/// Launches that `flashmma=on` asked onto the tensor cores but ran on the SIMT kernel (the
/// first one's reason is said on stderr): a setting is honoured or said to be unheeded, never
/// silently ignored.
pub fn flash_mma_fallbacks() -> usize {
    MMA_FALLBACKS.load(Ordering::Relaxed)
}

/// Launches the planned form (see [`crate::NemotronOps::attention_prefill`]).
pub fn launch<R: CubeRuntime>(
    q: CubeTensor<R>,
    kpool: CubeTensor<R>,
    vpool: CubeTensor<R>,
    seqs: CubeTensor<R>,
    heads: usize,
    scale: f32,
) -> CubeTensor<R> {
    let d = kpool.meta.shape()[3];
    let w = q.meta.shape()[2];
    let client = q.client.clone();
    let (bf16, mma, max_shared) = (
        q.dtype == DType::BF16,
        crate::cube::bf16_mma::available(&client),
        flash::max_shared(&client),
    );
    let form = plan(d, w, bf16, mma, max_shared, flash_mma());
    if flash_mma() && form != Some(PrefillForm::Mma) {
        // Said once, where the tensor cores could have run it (bf16 on a device with bf16
        // `mma`): f32 activations and other devices take the SIMT kernel by design.
        if MMA_FALLBACKS.fetch_add(1, Ordering::Relaxed) == 0 && bf16 && mma {
            let why = mma_refusal(d, w, bf16, mma, max_shared).unwrap_or_default();
            eprintln!("flashmma=on: prefill attention runs the SIMT kernel here: {why}");
        }
    }
    match form {
        Some(PrefillForm::Mma) => {
            MMA_LAUNCHES.fetch_add(1, Ordering::Relaxed);
            flash_mma::launch(q, kpool, vpool, seqs, heads, scale)
        }
        Some(PrefillForm::Simt { keys }) => {
            flash::launch(q, kpool, vpool, seqs, heads, scale, keys)
        }
        None => panic!(
            "prefill attention: no kernel takes heads of {d} on this device (callers check \
             ops::attention_prefill_fits first)"
        ),
    }
}
