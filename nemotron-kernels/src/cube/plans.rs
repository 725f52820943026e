//! What leaves the crate of the kernels' choices: the pure plan functions that pick a kernel
//! (tested on the host), the thresholds, shapes and tunings they read, and the process-wide
//! setters benchmarks and tests use. The kernel modules themselves are crate-private, so a
//! kernel's launch arguments and helpers can change without touching a caller outside.

/// Grid arithmetic: counts folded past the device's 65,535 cubes per grid dimension.
pub mod grid {
    pub use crate::cube::buffers::{fold_xy, yz, MAX_CUBES};
}

/// The quantized linears (NVFP4, FP8) and routed experts: [`plan`](linear::plan)'s tiers, the
/// tensor-core thresholds ([`MmaMin`](linear::MmaMin)) and cube shapes
/// ([`MmaTuning`](linear::MmaTuning)), the GEMV grids.
pub mod linear {
    pub use crate::cube::linear::dispatch::{gemv_count, small_m_count, GEMV_ROWS};
    pub use crate::cube::linear::gemm::GemmShape;
    pub use crate::cube::linear::grouped::{
        grouped_min_slots, set_grouped_min_slots, GROUPED_MIN_SLOTS,
    };
    pub use crate::cube::linear::mma::{
        fp8_inq_max, set_fp8_inq_max, set_sort_min_slots, sort_min_slots, FP8_INQ_MAX_ROWS,
        MMA_MAX_SLOTS,
    };
    pub use crate::cube::linear::plan::{
        gemv, plan, Format, Limits, LinearPath, LinearPlan, LinearShape, MmaForm, MmaMin,
        DENSE_MM_MIN, EXPERT_MAJOR_MAX_K, FP8_GEMV_MAX_K, FP8_MM_MIN, MMA_FP8_MIN_ROWS,
        MMA_MIN_ROWS, MMA_MIN_SLOTS, MMA_NVFP4_MIN_ROWS, MMA_TILE_MIN, MMA_TILE_MIN_ROWS,
    };
    pub use crate::cube::linear::tile::TileShape;
    pub use crate::cube::tensor_core::{
        blocks, fp8_pipe, m_split, mma, plan_warps, set_mma, set_mma_min, set_tuning, tile_warps,
        tiles_up_to, tuning, wave_warps, MmaTuning, BF16_DECODE, BLOCK_PASSES, FP8_DIRECT,
        FP8_PIPE, GEMM_STEPS, GEMM_WARPS_N, MMA_UNIT_REGISTERS, M_WARPS, TARGET_THREADS,
        TILE_BUFFERS, TILE_FRAGS, TILE_PARTS, TILE_TILES, TILE_WARPS, WARPS,
    };
}

/// Decode attention's form (split, GQA, …); the prefill kernel's key tile.
pub mod attention {
    pub use crate::cube::attention::decode::{
        form, gqa_split, gqa_split_plan, plan, set_form, set_gqa_split, AttnForm, GQA_MIN_CUBES,
    };
    pub use crate::cube::attention::flash::{
        keys_per_tile as flash_keys_per_tile, shared_bytes as flash_shared_bytes, FLASH_KEYS,
        FLASH_ROWS,
    };
    pub use crate::cube::attention::flash_mma::{
        fits as flash_mma_fits, shared_bytes as flash_mma_shared_bytes, MMA_KEYS, MMA_ROWS,
    };
    pub use crate::cube::attention::prefill::{
        flash, flash_mma, flash_mma_fallbacks, flash_mma_launches,
        mma_refusal as prefill_mma_refusal, plan as prefill_plan, set_flash, set_flash_mma,
        PrefillForm,
    };
}

/// The selective scan's form (register scan, row pairs, chunked over time).
pub mod scan {
    pub use crate::cube::mamba::scan::{
        chunking, pair_min, plan, set_chunking, set_pair_min, Chunking, Chunks, ScanPath,
        CHUNK_LEN, CHUNK_MAX_ROWS, CHUNK_STATE_BYTES, PAIR_MIN_ROWS,
    };
}

/// The scan's chunked matrix form on tensor cores (SSD): from how many prompt tokens, and in
/// which chunks.
pub mod ssd {
    pub use crate::cube::mamba::ssd::{
        launches, set_ssd_min, ssd_min, ssd_plan, SSD_MAX_CHUNK, SSD_MAX_DIM, SSD_MIN_TOKENS,
    };
}

/// The SSM decode step's state rows per warp.
pub mod ssm_step {
    pub use crate::cube::mamba::step::{
        set_ssm_walk, ssm_walk, ssm_walk_plan, SSM_ROWS, SSM_WALK_DEFAULT, SSM_WALK_MAX,
        SSM_WALK_MIN_CUBES,
    };
}

/// The batched matmul's path and the router product's rows per cube.
pub mod matmul {
    pub use crate::cube::matmul::{
        block_rows, plan, rows_from, set_rows_from, set_tiled_kernel, tile_rows, tiled_kernel,
        tiled_refusals, MatmulPath, TiledKernel, MATMUL_ROWS_FROM, MATMUL_TILE_ROWS, TILED_MIN,
    };
}
