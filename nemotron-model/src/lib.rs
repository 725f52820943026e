//! NemotronH (Nemotron-H, Nemotron 3 Nano / 3.5 Lightning) as Burn modules written once over
//! Burn's device-dispatched tensors: the same code runs on the host reference (Burn's Flex or NdArray CPU backends) and on the
//! CubeCL device backends, with the ops Burn lacks from
//! [`nemotron_kernels::NemotronOps`].
//!
//! ```no_run
//! use burn::tensor::{DType, Device};
//! use nemotron_model::{GenerateOptions, NemotronH};
//! let device = Device::flex();
//! let model = NemotronH::load_as("/models/nemotron", &device, DType::F32)?;
//! let out = model.generate(&[1, 2, 3], GenerateOptions::default(), |tok| print!("{tok} "))?;
//! # Ok::<(), nemotron_model::ModelError>(())
//! ```
// Library code takes no panic from data: every unwrap/expect is an error, or allowed where it
// stands with the invariant that makes it safe written beside it.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod cache;
pub mod deviation;
pub mod engine;
pub mod error;
pub mod generate;
pub mod graph;
pub mod layers;
pub mod model;
pub mod request;
pub mod runner;
pub mod sampling;
pub mod scheduler;
pub mod scoring;
pub mod slots;
mod util;

pub use cache::SlotState;
pub use cache::{KvCacheDtype, SequenceState, SsmCacheDtype};
pub use deviation::Deviations;
pub use engine::{Engine, EngineOptions, Event, RequestId, SlotMemory, MAX_SLOTS};
pub use error::ModelError;
pub use generate::{GenerateOptions, Generation, Generator, StopReason};
pub use layers::fold::SharedExpert;
pub use model::{BuildOptions, NemotronH};
pub use nemotron_kernels;
pub use nemotron_loader;
pub use sampling::{Sampling, TokenLogprobs};
pub use scoring::prompt_logprobs;
