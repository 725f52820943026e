//! Attention kernels. Decode over a slot's KV cache: the form's choice and launchers
//! ([`decode`]), one file per form's kernels ([`gqa`], [`split`], [`unfused`]) and the merge
//! they share ([`merge`]). Prefill over a prompt chunk: [`flash`].

pub mod decode;
pub mod flash;
pub mod gqa;
pub mod merge;
pub mod split;
pub mod unfused;

/// Context positions per chunk of every decode form ([`unfused::attn_partial_kernel()`], the split
/// and GQA cubes: the flash-decoding split).
pub const ATTN_CHUNK: usize = 64;
