//! The model's layers, each a Burn module over [`nemotron_kernels::NemotronOps`] that takes its
//! own typed state from [`crate::cache`]: `linear` (the weight formats behind one call), `norm`,
//! `mlp`, `moe` (with `fold`, its shared expert cut into routed-shaped experts), `attention`,
//! `mamba2`, and `block` (one of those mixers between a norm and the
//! residual add). The model ([`crate::NemotronH`]), the slot and engine code sit above them; a
//! layer imports only `cache`, `util`, the crate's error and deviation types, and the layers below
//! it.

pub mod attention;
pub mod block;
pub mod fold;
pub mod linear;
pub mod mamba2;
pub mod mlp;
pub mod moe;
pub mod norm;
