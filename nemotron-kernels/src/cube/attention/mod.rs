//! Attention kernels: decode over a slot's KV cache (`decode`). Prefill attention stays composed
//! of Burn ops and the exact matmul until the flash-attention kernel of the prefill issue.

pub mod decode;
