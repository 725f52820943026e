//! What the bf16 tensor-core kernels written over `mma m16n8k16` (bf16 → f32) share: the pair
//! and accumulator vector types, the device check, one `mma` into an accumulator pair, and a
//! scaled accumulator pair. Used by the SSD scan ([`super::mamba::ssd`]) and prefill attention
//! ([`super::attention::flash_mma`]).

use burn::tensor::bf16;
use burn_cubecl::CubeRuntime;
use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

/// Two bf16 values in one 32-bit register (an `mma` operand word).
pub(crate) type Pair = Vector<bf16, Const<2>>;
/// Two f32 values of an `mma` accumulator.
pub(crate) type F2 = Vector<f32, Const<2>>;

/// Whether the device runs bf16 `mma` at `16 × 8 × 16` into f32 and `NEMOTRON_MMA` is not `0`.
pub fn available<R: CubeRuntime>(client: &ComputeClient<R>) -> bool {
    let bf = cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::BF16).into();
    crate::cube::tuning::mma_supported(client, bf, 16)
}

/// `acc[2j], acc[2j + 1] += A · B` for the `A` fragment `ra` (4 pairs) and `B` fragment `rb`
/// (2 pairs).
#[cube]
pub(crate) fn mma_acc(
    def: &MmaDefinition<bf16, bf16, f32>,
    ra: &Array<Pair>,
    rb: &Array<Pair>,
    acc: &mut Array<F2>,
    #[comptime] j: usize,
) {
    let mut cr = Array::<F2>::new(2usize);
    cr[0] = acc[2 * j];
    cr[1] = acc[2 * j + 1];
    def.execute_inplace(ra, rb, &mut cr);
    acc[2 * j] = cr[0];
    acc[2 * j + 1] = cr[1];
}

/// `v · s`.
#[cube]
pub(crate) fn scaled(v: F2, s: f32) -> F2 {
    let mut o = F2::empty();
    o.insert(0usize, v.extract(0) * s);
    o.insert(1usize, v.extract(1) * s);
    o
}
