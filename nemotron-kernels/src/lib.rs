//! The backend seam (skeleton): the extension trait and its implementations arrive with the host
//! reference issue.
pub use burn;
