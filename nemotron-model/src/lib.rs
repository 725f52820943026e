//! NemotronH (Nemotron-H, Nemotron 3 Nano / 3.5 Lightning) as Burn modules generic over
//! [`NemotronBackend`](nemotron_kernels::NemotronBackend): the same code runs on the NdArray host
//! reference and on the device backends.
//!
//! ```no_run
//! use burn::backend::NdArray;
//! use nemotron_model::{GenerateOptions, NemotronH};
//! let device = Default::default();
//! let model = NemotronH::<NdArray<f32>>::load("/models/nemotron", &device)?;
//! let out = model.generate(&[1, 2, 3], GenerateOptions::default(), |tok| print!("{tok} "))?;
//! # Ok::<(), nemotron_model::ModelError>(())
//! ```

pub mod attention;
pub mod block;
pub mod cache;
pub mod deviation;
pub mod error;
pub mod generate;
pub mod linear;
pub mod mamba2;
pub mod mlp;
pub mod model;
pub mod moe;
pub mod norm;
mod util;

pub use cache::SequenceState;
pub use deviation::Deviations;
pub use error::ModelError;
pub use generate::{GenerateOptions, Generation, Generator, Sampling, StopReason};
pub use model::NemotronH;
pub use nemotron_kernels;
pub use nemotron_loader;
