//! The kernels' settings from the environment, read here and nowhere else in this crate (each
//! once): switches that turn a device feature off, and tuning knobs for benchmarks. A value that
//! is not one of those allowed is reported and ignored. (The process-wide setters beside each
//! kernel family — `tensor_core::set_mma`, `attention::decode::set_form`, … — are the API.)

use std::sync::OnceLock;

/// `NEMOTRON_MMA=0`: no tensor-core (`mma`) kernels.
pub fn mma_off() -> bool {
    static CELL: OnceLock<bool> = OnceLock::new();
    *CELL.get_or_init(|| switch_off("NEMOTRON_MMA", "no tensor cores"))
}

/// Whether the device runs `mma` with `a`/`b` inputs of `ab` into f32 at `16 × 8 × k`, and
/// `NEMOTRON_MMA` is not `0` (the one check every tensor-core kernel family asks).
pub fn mma_supported<R: burn_cubecl::CubeRuntime>(
    client: &cubecl::prelude::ComputeClient<R>,
    ab: cubecl::ir::StorageType,
    k: u32,
) -> bool {
    use cubecl::ir::features::MmaConfig;
    use cubecl::ir::{ElemType, FloatKind};
    !mma_off()
        && client.features().matmul.mma.contains(&MmaConfig {
            a_type: ab,
            b_type: ab,
            cd_type: ElemType::Float(FloatKind::F32).into(),
            m: 16,
            n: 8,
            k,
        })
}

/// `NEMOTRON_SCAN_SSD=N|max`: prompt tokens from which a bf16 scan takes the tensor-core (SSD)
/// form, in place of the library's default (`max`: never) — so a whole-model test binary can run
/// with it on or off without a rebuild.
pub fn scan_ssd_min() -> Option<usize> {
    static CELL: OnceLock<Option<usize>> = OnceLock::new();
    *CELL.get_or_init(|| {
        let v = std::env::var("NEMOTRON_SCAN_SSD").ok()?;
        let r = match v.as_str() {
            "max" => Some(usize::MAX),
            n => n.parse().ok(),
        };
        if r.is_none() {
            eprintln!("NEMOTRON_SCAN_SSD={v:?} ignored: expected a token count or max");
        }
        r
    })
}

/// `NEMOTRON_HW_DECODE=0`: E2M1/E4M3 decoded from their bits, not by the device's conversions.
pub fn hw_decode_off() -> bool {
    static CELL: OnceLock<bool> = OnceLock::new();
    *CELL.get_or_init(|| switch_off("NEMOTRON_HW_DECODE", "bit decoders"))
}

/// `NEMOTRON_GEMV_ROWS=1|2|4`: output rows per unit row of the vector GEMVs.
pub fn gemv_rows() -> Option<usize> {
    static CELL: OnceLock<Option<usize>> = OnceLock::new();
    *CELL.get_or_init(|| knob("NEMOTRON_GEMV_ROWS", &[1, 2, 4]))
}

/// `NEMOTRON_GEMV_GROUP=1..8`: chunks per row a GEMV lane loads before it computes.
pub fn gemv_group() -> Option<usize> {
    static CELL: OnceLock<Option<usize>> = OnceLock::new();
    *CELL.get_or_init(|| knob("NEMOTRON_GEMV_GROUP", &[1, 2, 3, 4, 5, 6, 7, 8]))
}

/// `name=0` turns the feature off; unset or `1` leaves it on.
fn switch_off(name: &str, off_means: &str) -> bool {
    match std::env::var(name).as_deref() {
        Ok("0") => true,
        Ok("1") | Err(_) => false,
        Ok(v) => {
            eprintln!("{name}={v:?} ignored: expected 0 ({off_means}) or 1");
            false
        }
    }
}

/// One of `allowed` from `name`, if set.
fn knob(name: &str, allowed: &[usize]) -> Option<usize> {
    let v = std::env::var(name).ok()?;
    let r = v.parse().ok().filter(|r| allowed.contains(r));
    if r.is_none() {
        eprintln!("{name}={v:?} ignored: expected one of {allowed:?}");
    }
    r
}
