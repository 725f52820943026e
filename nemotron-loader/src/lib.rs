// Library code takes no panic from data: every unwrap/expect is an error, or allowed where it
// stands with the invariant that makes it safe written beside it.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![recursion_limit = "256"]
//! `nemotron-loader`: a NemotronH checkpoint directory → validated config + typed, still-packed
//! host weights, with a report of what was found.
//!
//! Reads every released form — ModelOpt MIXED_PRECISION (W4A16 NVFP4 + FP8 W8A8 + BF16), legacy
//! single-algorithm NVFP4/FP8 with `exclude_modules`, plain BF16 — without dequantizing. Every tensor
//! is enumerated against what the config implies; the MTP tower is deferred by name and counted.
//! No Burn dependency.
//!
//! ```no_run
//! let ckpt = nemotron_loader::Checkpoint::load("/models/nemotron-3.5-lightning")?;
//! println!("{}", ckpt.report.render());
//! # Ok::<(), nemotron_loader::LoadError>(())
//! ```

pub mod config;
pub mod error;
/// The number formats (re-exported from `nemotron-formats`).
pub use nemotron_formats as formats;
pub mod load;
pub mod plan;
pub mod quant;
pub mod report;
pub mod shards;
pub mod synth;
pub mod tensor;
pub mod weights;

pub use config::{LayerKind, NemotronHConfig};
pub use error::LoadError;
pub use load::{read_config, Checkpoint, LoadOptions, LoadProgress};
pub use plan::Plan;
pub use quant::{Nvfp4Activations, QuantRecipe, WeightForm};
pub use report::LoadReport;
pub use tensor::{DType, HostTensor};
pub use weights::*;
