//! Prefill attention's form and launch: the tensor-core kernel ([`super::flash_mma`]) for bf16
//! on a device with bf16 `mma` where `flashmma=on`, else the SIMT kernel ([`super::flash`]) with
//! the key tile the device's shared memory allows. The settings are process-wide.

use super::{flash, flash_mma};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use std::sync::atomic::{AtomicBool, Ordering};

static FLASH: AtomicBool = AtomicBool::new(true);
static FLASH_MMA: AtomicBool = AtomicBool::new(false);

/// Whether the model's prefill attention runs these kernels (default on; off: the composed Burn
/// ops with the `[heads, T, S]` scores in memory, for comparisons). Process-wide.
pub fn set_flash(on: bool) {
    FLASH.store(on, Ordering::Relaxed);
}

/// The current value of [`set_flash`].
pub fn flash() -> bool {
    FLASH.load(Ordering::Relaxed)
}

/// Whether bf16 prefill attention takes the tensor-core kernel where the device has it
/// (default off until a device run shows it correct and faster). Process-wide.
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

/// The form for heads of `d`, queries `q_width` wide, `bf16` activations, a device with bf16
/// `mma` (`mma`) and `max_shared` bytes of shared memory per cube, `flashmma` asked for or not:
/// `None` where no kernel takes the heads (pure; tested on the host).
pub fn plan(
    d: usize,
    q_width: usize,
    bf16: bool,
    mma: bool,
    max_shared: usize,
    flashmma: bool,
) -> Option<PrefillForm> {
    if flashmma
        && bf16
        && mma
        && flash_mma::fits(d)
        && q_width % 8 == 0
        && flash_mma::shared_bytes(d) <= max_shared
    {
        return Some(PrefillForm::Mma);
    }
    flash::keys_per_tile(max_shared, d).map(|keys| PrefillForm::Simt { keys })
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
    let form = plan(
        d,
        w,
        q.dtype == DType::BF16,
        crate::cube::bf16_mma::available(&client),
        flash::max_shared(&client),
        flash_mma(),
    );
    match form {
        Some(PrefillForm::Mma) => flash_mma::launch(q, kpool, vpool, seqs, heads, scale),
        Some(PrefillForm::Simt { keys }) => {
            flash::launch(q, kpool, vpool, seqs, heads, scale, keys)
        }
        None => panic!(
            "prefill attention: no kernel takes heads of {d} on this device (callers check \
             ops::attention_prefill_fits first)"
        ),
    }
}
