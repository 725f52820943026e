//! NemotronH as Burn modules (skeleton): the modules arrive with the host reference issue.
pub use nemotron_kernels;
pub use nemotron_loader;
