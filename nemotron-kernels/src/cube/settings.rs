//! Every kernel setting a benchmark or a test may change, as one value: parsed from the text a
//! user writes (`bench --mma-min`), applied process-wide, and read back. The settings themselves
//! stay beside their kernels (`tensor_core::set_mma`, `attention::decode::set_form`, …); this
//! module only gathers them, and nothing in the crate imports it. (The environment switches are
//! [`super::tuning`]'s.)

use super::attention::decode::{self, AttnForm};
use super::attention::prefill as flash;
use super::linear::mma;
use super::linear::plan::MmaMin;
use super::mamba::{scan, ssd, step};
use super::matmul::{self, TiledKernel};
use super::tensor_core::{self as tc, MmaTuning};

/// The kernel settings (see [`Settings::parse`] for the text form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Where each tensor-core path starts.
    pub min: MmaMin,
    /// FP8 rows quantized inside the tensor-core kernel, up to.
    pub fp8_inq_max: usize,
    /// The decode attention form.
    pub attn: AttnForm,
    /// How the tensor-core kernels stream their weights and shape their cubes.
    pub tune: MmaTuning,
    /// The conv inside the SSM step and the gated norm inside the FP8 `out_proj` (decode).
    pub fused: bool,
    /// State rows from which the scan's lanes take two rows.
    pub scan_pair_min: usize,
    /// When and in what lengths the scan cuts time into chunks.
    pub scan_chunk: scan::Chunking,
    /// Prompt tokens from which a bf16 scan takes the tensor-core (SSD) form.
    pub scan_ssd_min: usize,
    /// cubek's kernel for the decoded FP8 and dense paths ([`MmaMin::fp8_mm`],
    /// [`MmaMin::dense_mm`]).
    pub tiled: TiledKernel,
    /// Whether the decoded path's products come out in f32 ([`matmul::set_tiled_f32`]).
    pub tiled_f32: bool,
    /// Whether prefill attention runs the flash kernels ([`flash::set_flash`]).
    pub flash: bool,
    /// Whether bf16 prefill attention takes the tensor-core kernel ([`flash::set_flash_mma`]).
    pub flash_mma: bool,
    /// State rows per warp of the SSM decode step, 0 for its plan by batch
    /// ([`step::set_ssm_walk`]).
    pub ssm_walk: usize,
    /// Cubes per GQA group of decode attention, 0 for its plan by grid
    /// ([`decode::set_gqa_split`]).
    pub attn_split: usize,
    /// Rows from which the exact matmul runs its register-blocked kernel
    /// ([`matmul::set_rows_from`]).
    pub matmul_rows_from: usize,
}

impl Default for Settings {
    /// The library's defaults.
    fn default() -> Self {
        Settings {
            min: MmaMin::default(),
            fp8_inq_max: mma::FP8_INQ_MAX_ROWS,
            attn: AttnForm::Gqa,
            tune: MmaTuning::default(),
            fused: true,
            scan_pair_min: scan::PAIR_MIN_ROWS,
            scan_chunk: scan::Chunking::default(),
            scan_ssd_min: ssd::SSD_MIN_TOKENS,
            tiled: TiledKernel::SimpleCmma,
            tiled_f32: true,
            flash: true,
            flash_mma: true,
            ssm_walk: step::SSM_WALK_DEFAULT,
            attn_split: 0,
            matmul_rows_from: matmul::MATMUL_ROWS_FROM,
        }
    }
}

impl Settings {
    /// The settings in force now.
    pub fn current() -> Self {
        Settings {
            min: tc::mma(),
            fp8_inq_max: mma::fp8_inq_max(),
            attn: decode::form(),
            tune: tc::tuning(),
            fused: super::fused(),
            scan_pair_min: scan::pair_min(),
            scan_chunk: scan::chunking(),
            scan_ssd_min: ssd::ssd_min(),
            tiled: matmul::tiled_kernel(),
            tiled_f32: matmul::tiled_f32(),
            flash: flash::flash(),
            flash_mma: flash::flash_mma(),
            ssm_walk: step::ssm_walk(),
            attn_split: decode::gqa_split(),
            matmul_rows_from: matmul::rows_from(),
        }
    }

    /// Applies every setting (process-wide). A tuning the kernels cannot take is refused by
    /// name ([`MmaTuning::check`]) before anything is set.
    pub fn apply(&self) -> Result<(), String> {
        tc::set_tuning(self.tune)?;
        scan::set_chunking(self.scan_chunk)?;
        tc::set_mma(self.min);
        mma::set_fp8_inq_max(self.fp8_inq_max);
        decode::set_form(self.attn);
        super::set_fused(self.fused);
        scan::set_pair_min(self.scan_pair_min);
        ssd::set_ssd_min(self.scan_ssd_min);
        matmul::set_tiled_kernel(self.tiled);
        matmul::set_tiled_f32(self.tiled_f32);
        flash::set_flash(self.flash);
        flash::set_flash_mma(self.flash_mma);
        step::set_ssm_walk(self.ssm_walk);
        decode::set_gqa_split(self.attn_split);
        matmul::set_rows_from(self.matmul_rows_from);
        Ok(())
    }

    /// The library's defaults changed by `text`: either `ROWS,SLOTS` (every plain and
    /// slot-major tensor-core path from ROWS rows, grouped routing from SLOTS slots) or
    /// comma-separated `key=value` items — `nvfp4`, `fp8`, `dense`, `slotmajor`, `grouped`,
    /// `tile` (the tiled NVFP4 kernel: plain rows), `tileslots` (the same: grouped routing
    /// slots), `fp8tile` (the tiled FP8
    /// kernel: plain rows), `fp8gemm` (the FP8 GEMM staging both operands: plain rows) (rows or slots; `max` for off); `inq` (FP8 rows quantized in-kernel
    /// up to); `attn=gqa|split|unfused` (decode attention form); `grp=N` (tensor-core load
    /// rounds of N steps); `pipe=on|off` (the next round loaded before the work); `fp8pipe=on|off` (the same for the
    /// plain FP8 `mma` kernel alone);
    /// `fp8direct=on|off` (the FP8 `mma` and tiled kernels accumulate in the `mma`, not per
    /// `k32` step; refused beside `fp8gemm`, whose kernel it does not change); `mw=1|2|4`
    /// (warps of a plain FP8 or dense `mma` cube taking row tiles side by side); `bdec=on|off`
    /// (the NVFP4 tensor-core kernels decode E2M1 in bf16 alone);
    /// `widen=on|off` (small tensor-core grids take up to 16 warps per cube); `threads=N` (the
    /// threads a widened grid aims for); `kw=1|2|4` (warps splitting K of a tensor-core cube
    /// before widening); `waves=on|off` (a launch just past one wave halves its warps where that
    /// fits it in one); `tw=4|8` (warps per cube of the tiled kernels);
    /// `nt=4|8|16` (the most token tiles of 8 a tiled cube takes per pass); `buf=1|2` (its
    /// shared staging buffers: two barriers per step, or one); `tp=1..4` (cube rows per expert
    /// of a routed tiled launch); `gw=2|4` (warps along tokens of the FP8 GEMM: 64 or 128 tokens
    /// per cube); `gk=1|2` (its 64-input groups per staged step); `rf=1|2` (16-row
    /// fragments per warp of the tiled NVFP4 kernel); `scanpair=N` (the scan's lanes take two
    /// state rows from N state rows); `scanchunk=N` (steps per chunk where the scan chunks
    /// time, at least 1); `scanchunkrows=N` (the scan chunks time over up to N state rows; 0
    /// never); `scanssd=N` (a bf16 scan on tensor cores in the chunked matrix form from N prompt
    /// tokens; `max` never); `fuse=on|off` (the decode fusions); `flash=on|off` (prefill attention
    /// in the flash kernels, or composed of Burn ops with the scores in memory); `flashmma=on|off`
    /// (bf16 prefill attention on the tensor cores where the device has them, the default; off:
    /// the SIMT flash kernel); `fp8mm=N` (plain FP8 rows
    /// from which the weights are decoded for cubek's tiled matmul; `max` never); `nvfp4mm=N`
    /// (the same for plain NVFP4 rows); `densemm=N`
    /// (dense rows, activations in the weight's type, from which cubek's tiled matmul runs them); `mmk=NAME` (that matmul's
    /// kernel: `simplecmma`, `simple`, `ordered`, `double`, `doublespec`, `spec`, `tma`,
    /// `spectma`); `mmacc=f32|act` (its products out in f32, or in the activation type);
    /// `ssmwalk=auto|1|2|4|8` (state rows per warp of the SSM decode step; `auto`: its plan by
    /// batch, the default; 1: one row a warp, as before); `attnsplit=auto|1|2|4|8|16` (cubes per
    /// GQA group of decode attention; `auto`: its plan by grid, the default; 1: one cube a
    /// group, as before); `matrows=N` (rows from which the exact f32 matmul, the router's,
    /// runs its register-blocked kernel; `max` never). `default` alone is the library's
    /// defaults (so `bench --mma-min default --mma-min grp=4` compares a knob with them in one
    /// process). Unknown keys, bad numbers and values outside a knob's range are refused, naming
    /// the item.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim() == "default" {
            return Ok(Settings::default());
        }
        let num = |v: &str| -> Result<usize, String> {
            match v.trim() {
                "max" => Ok(usize::MAX),
                v => v
                    .parse::<usize>()
                    .map_err(|e| format!("{text:?}: {v:?}: {e}")),
            }
        };
        let on_off = |k: &str, v: &str| -> Result<bool, String> {
            match v {
                "on" => Ok(true),
                "off" => Ok(false),
                v => Err(format!("{k}={v:?}: on or off")),
            }
        };
        let mut s = Settings::default();
        // `fp8direct=on` written out (it is also the default).
        let mut direct_asked = false;
        let items: Vec<&str> = text.split(',').map(str::trim).collect();
        if items.iter().all(|i| !i.contains('=')) {
            let [rows, slots] = items[..] else {
                return Err(format!(
                    "expected ROWS,SLOTS or key=value items, got {text:?}"
                ));
            };
            let (rows, slots) = (num(rows)?, num(slots)?);
            s.min = MmaMin {
                nvfp4: rows,
                fp8: rows,
                dense: rows,
                slot_major: rows,
                grouped: slots,
                ..MmaMin::default()
            };
            return Ok(s);
        }
        for item in items {
            let Some((k, v)) = item.split_once('=') else {
                return Err(format!("{text:?}: {item:?} is not key=value"));
            };
            match k {
                "nvfp4" => s.min.nvfp4 = num(v)?,
                "fp8" => s.min.fp8 = num(v)?,
                "dense" => s.min.dense = num(v)?,
                "slotmajor" => s.min.slot_major = num(v)?,
                "grouped" => s.min.grouped = num(v)?,
                "tile" => s.min.tile = num(v)?,
                "tileslots" => s.min.tile_slots = num(v)?,
                "fp8tile" => s.min.fp8_tile = num(v)?,
                "fp8gemm" => s.min.fp8_gemm = num(v)?,
                "fp8mm" => s.min.fp8_mm = num(v)?,
                "nvfp4mm" => s.min.nvfp4_mm = num(v)?,
                "densemm" => s.min.dense_mm = num(v)?,
                "mmacc" => {
                    s.tiled_f32 = match v {
                        "f32" => true,
                        "act" => false,
                        v => return Err(format!("mmacc={v:?}: f32 or act")),
                    }
                }
                "mmk" => {
                    s.tiled = TiledKernel::parse(v).ok_or_else(|| {
                        let names: Vec<_> = TiledKernel::ALL.iter().map(|(n, _)| *n).collect();
                        format!("mmk={v:?}: one of {}", names.join(", "))
                    })?
                }
                "inq" => s.fp8_inq_max = num(v)?,
                "grp" => s.tune.group = num(v)?,
                "threads" => s.tune.threads = num(v)?,
                "kw" => s.tune.k_warps = num(v)?,
                "waves" => s.tune.waves = on_off(k, v)?,
                "tw" => s.tune.tile_warps = num(v)?,
                "nt" => s.tune.tile_tiles = num(v)?,
                "rf" => s.tune.tile_frags = num(v)?,
                "buf" => s.tune.tile_buffers = num(v)?,
                "tp" => s.tune.tile_parts = num(v)?,
                "gw" => s.tune.gemm_warps_n = num(v)?,
                "gk" => s.tune.gemm_steps = num(v)?,
                "mw" => s.tune.m_warps = num(v)?,
                "scanpair" => s.scan_pair_min = num(v)?,
                "scanchunk" => match num(v)? {
                    0 => return Err(format!("{text:?}: scanchunk=0: at least one step")),
                    n => s.scan_chunk.len = n,
                },
                "scanchunkrows" => s.scan_chunk.max_rows = num(v)?,
                "scanssd" => s.scan_ssd_min = num(v)?,
                "widen" => s.tune.widen = on_off(k, v)?,
                "pipe" => s.tune.pipe = on_off(k, v)?,
                "fp8pipe" => s.tune.fp8_pipe = on_off(k, v)?,
                "fp8direct" => {
                    s.tune.fp8_direct = on_off(k, v)?;
                    direct_asked = s.tune.fp8_direct;
                }
                "bdec" => s.tune.bf16_decode = on_off(k, v)?,
                "fuse" => s.fused = on_off(k, v)?,
                "flash" => s.flash = on_off(k, v)?,
                "flashmma" => s.flash_mma = on_off(k, v)?,
                "ssmwalk" => match v {
                    "auto" => s.ssm_walk = 0,
                    v => match num(v)? {
                        w @ (1 | 2 | 4 | 8) => s.ssm_walk = w,
                        w => return Err(format!("{text:?}: ssmwalk={w}: auto, 1, 2, 4 or 8")),
                    },
                },
                "attnsplit" => match v {
                    "auto" => s.attn_split = 0,
                    v => match num(v)? {
                        w @ (1 | 2 | 4 | 8 | 16) => s.attn_split = w,
                        w => {
                            return Err(format!("{text:?}: attnsplit={w}: auto, 1, 2, 4, 8 or 16"))
                        }
                    },
                },
                "matrows" => match num(v)? {
                    0 => return Err(format!("{text:?}: matrows=0: at least 1 (or max)")),
                    r => s.matmul_rows_from = r,
                },
                "attn" => {
                    s.attn = match v {
                        "gqa" => AttnForm::Gqa,
                        "split" => AttnForm::Split,
                        "unfused" => AttnForm::Unfused,
                        v => return Err(format!("attn={v:?}: gqa, split or unfused")),
                    }
                }
                k => return Err(format!("{text:?}: unknown key {k:?}")),
            }
        }
        s.tune.check().map_err(|e| format!("{text:?}: {e}"))?;
        // `fp8direct` changes `fp8_mma_kernel` and the tiled FP8 kernel: with the GEMM also
        // asked for, its rows would keep their per-step adds, so the pair written out is refused
        // (the default alone is not a request).
        if direct_asked && s.min.fp8_gemm != usize::MAX {
            return Err(format!(
                "{text:?}: fp8direct=on applies to the FP8 mma and tiled kernels, not with fp8gemm"
            ));
        }
        Ok(s)
    }
}
