//! Attention kernels. Decode over a slot's KV cache: the form's choice and launchers
//! ([`decode`]), one file per form's kernels ([`gqa`], [`split`], [`unfused`]) and the merge
//! they share ([`merge`]). Prefill over a prompt chunk: the form's choice and launch ([`prefill`]),
//! the SIMT kernel ([`flash`]) and the tensor-core one ([`flash_mma`]).

pub mod decode;
pub mod flash;
pub mod flash_mma;
pub mod gqa;
pub mod merge;
pub mod prefill;
pub mod split;
pub mod unfused;

/// Context positions per chunk of every decode form ([`unfused::attn_partial_kernel()`], the split
/// and GQA cubes: the flash-decoding split).
pub const ATTN_CHUNK: usize = 64;
