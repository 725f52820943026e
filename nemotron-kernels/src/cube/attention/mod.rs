//! Attention kernels. Decode over a slot's KV cache: the form's choice and launchers
//! ([`decode`]), one file per form's kernels ([`gqa`], [`split`], [`unfused`]) and the merge
//! they share ([`merge`]). Prefill attention stays composed of Burn ops and the exact matmul
//! until the flash-attention kernel of the prefill issue.

pub mod decode;
pub mod gqa;
pub mod merge;
pub mod split;
pub mod unfused;

/// Context positions per chunk of every decode form ([`unfused::attn_partial_kernel()`], the split
/// and GQA cubes: the flash-decoding split).
pub const ATTN_CHUNK: usize = 64;
