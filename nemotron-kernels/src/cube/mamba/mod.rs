//! The Mamba2 mixer's own ops: the depthwise causal conv with carried state, `softplus(dt + bias)`,
//! and the selective scan with carried f32 state. Sequence lengths come as a device buffer for
//! ragged batches, or not at all when every sequence fills `T` (a decode step then performs no
//! host write and can be captured in a graph).

pub mod conv;
pub mod scan;
pub mod softplus;
pub mod ssd;
pub mod step;
