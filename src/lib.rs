//! `nemotron`: NemotronH inference on Burn. Re-exports the workspace crates.
pub use nemotron_kernels as kernels;
pub use nemotron_loader as loader;
pub use nemotron_model as model;
