//! [`NemotronOps`] for Burn's CubeCL backends (`CubeBackend<R>` for any CubeCL runtime: CUDA,
//! wgpu), without Burn's fusion layer. Packed weights stay on the device in their shipped form;
//! each op is one launcher of one kernel family:
//!
//! | family | file | ops |
//! |---|---|---|
//! | linear | [`linear`] (`nvfp4`, `fp8`, `dispatch`) | NVFP4 / FP8 W8A8 linears, plain or routed experts, fused epilogue |
//! | Mamba2 | [`mamba`] (`conv`, `softplus`, `scan`, `ssd`) | causal conv, `softplus(dt + bias)`, selective scan (state in registers over staged time tiles; bf16 prompts of 1,024 tokens and more in the chunked matrix form on tensor cores) |
//! | MoE sort | [`moe`] | routing slots sorted by expert on the device (prefill's grouped experts) |
//! | norm | [`norm`] | (gated) group RMSNorm |
//! | routing | [`route`] | MoE sigmoid top-k routing, the weighted combine of the experts' outputs |
//! | matmul | [`matmul`] | exact-f32-accumulation batched matmul; bf16 products of 64+ rows and columns on Burn's tiled matmul |
//! | attention | [`attention`] (`decode`) | GQA decode attention over slot KV caches |
//! | slots | [`slots`], [`mamba::step`] | decode over state slots: conv / SSM steps in place, lengths, slot writes |
//! | greedy pick | [`argmax`] | row-wise arg-max over the vocabulary |
//! | log-probabilities | [`logprobs`] | row-wise log-sum-exp, a token's logit and the top `n` |
//!
//! [`buffers`] turns tensors into kernel buffers; [`reduce`] holds shared reductions. Activations
//! are read and written in their storage type (f32, bf16, f16); the Mamba2 conv and scan compute in
//! f32 (the SSM state is f32 whatever the activation dtype).

// The kernel families are crate-private: [`plans`] is what callers outside may read and set.
pub(crate) mod argmax;
pub(crate) mod attention;
pub(crate) mod bf16;
pub(crate) mod bf16_mma;
pub(crate) mod buffers;
pub(crate) mod kv8;
pub(crate) mod linear;
pub(crate) mod logprobs;
pub(crate) mod mamba;
pub(crate) mod matmul;
pub(crate) mod moe;
pub(crate) mod norm;
pub mod plans;
pub(crate) mod reduce;
pub(crate) mod route;
pub mod settings;
pub(crate) mod slots;
pub(crate) mod tensor_core;
pub mod tuning;

use crate::{Epilogue, Fp8Weights, Maybe, NemotronOps, Nvfp4Weights, RouteConfig, Rows, ScanDims};
use std::sync::atomic::{AtomicBool, Ordering};

static FUSED: AtomicBool = AtomicBool::new(true);

/// Whether the fused launches run (default on): the conv inside the SSM step
/// (`conv_ssm_step`), the gated norm inside the FP8 `out_proj` (`fp8_gated_linear`, one row),
/// and for many rows the gated norm writing the E4M3 codes that `out_proj`'s tensor-core kernel
/// reads. Off, each runs as its two ops — the same values up to the norm's summation order; for
/// benchmarks and tests (process-wide).
pub fn set_fused(on: bool) {
    FUSED.store(on, Ordering::Relaxed);
}

/// Rows up to which the conv runs inside the SSM step when [`fused`]: one. On the H200
/// (Lightning bf16, engine, graphs on) the fusions together took batch 16 from 7.25 to 7.88 ms
/// per step and batch 64 from 15.11 to 17.60 ms (`bench --mma-min 'fuse=on;fuse=off'`,
/// `docs/PERF.md` §14), while batch 1 ran at 2.62 ms (2.72 before them, another build).
pub const FUSED_CONV_MAX_ROWS: usize = 1;

static CONV_MAX_ROWS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(FUSED_CONV_MAX_ROWS);

/// Sets the rows up to which the conv runs inside the SSM step (process-wide; the ops test runs
/// the fused kernel over several rows with it).
pub fn set_fused_conv_max_rows(rows: usize) {
    CONV_MAX_ROWS.store(rows, Ordering::Relaxed);
}

/// The current value of [`set_fused_conv_max_rows`].
pub fn fused_conv_max_rows() -> usize {
    CONV_MAX_ROWS.load(Ordering::Relaxed)
}

/// The current value of [`set_fused`].
pub fn fused() -> bool {
    FUSED.load(Ordering::Relaxed)
}

/// Which prefill kernels run where a size threshold chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillKernels {
    /// The library's thresholds.
    Auto,
    /// Routed experts grouped by expert from one slot, their slots sorted on the device from one
    /// slot (otherwise from 32 and past 1,024 slots), NVFP4 linears on the tiled kernel from
    /// one row or slot (otherwise from 512), and FP8 linears whose rows are quantized apart on
    /// the tiled FP8 kernel (otherwise off): so the tiny fixtures run prefill's grouped MoE and
    /// tiled paths. They take effect where they exist (bf16 on CUDA tensor cores). The scan
    /// chunks time at any row count in chunks of [`TILED_SCAN_CHUNK`] steps (on every cube
    /// backend; a bf16 scan on tensor cores takes the chunked matrix form from one token, in
    /// chunks of 16). The conv kernel has no threshold: it runs at every size.
    Tiled,
}

/// The scan's chunk length under [`PrefillKernels::Tiled`]: short, so the fixtures' few
/// tokens take several chunks.
pub const TILED_SCAN_CHUNK: usize = 3;

/// Sets [`PrefillKernels`] (process-wide: for `parity --prefill-kernels` and tests).
pub fn set_prefill_kernels(k: PrefillKernels) {
    let mut m = tensor_core::mma();
    let chunking = match k {
        PrefillKernels::Auto => mamba::scan::Chunking::default(),
        PrefillKernels::Tiled => mamba::scan::Chunking {
            len: TILED_SCAN_CHUNK,
            max_rows: usize::MAX,
        },
    };
    mamba::scan::store_chunking(chunking);
    mamba::ssd::set_ssd_min(match k {
        PrefillKernels::Auto => mamba::ssd::SSD_MIN_TOKENS,
        PrefillKernels::Tiled => 1,
    });
    match k {
        PrefillKernels::Auto => {
            m.grouped = linear::plan::MmaMin::default().grouped;
            m.tile = linear::plan::MmaMin::default().tile;
            m.tile_slots = linear::plan::MmaMin::default().tile_slots;
            m.fp8_tile = linear::plan::MmaMin::default().fp8_tile;
            m.fp8_gemm = linear::plan::MmaMin::default().fp8_gemm;
            linear::mma::set_sort_min_slots(linear::mma::MMA_MAX_SLOTS + 1);
        }
        PrefillKernels::Tiled => {
            m.grouped = 1;
            m.tile = 1;
            m.tile_slots = 1;
            m.fp8_tile = 1;
            m.fp8_gemm = 1;
            linear::mma::set_sort_min_slots(1);
        }
    }
    tensor_core::set_mma(m);
}

use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};

type T<R> = CubeTensor<R>;

impl<R: CubeRuntime> NemotronOps for CubeBackend<R> {
    fn matmul(a: T<R>, b: T<R>) -> T<R> {
        matmul::launch(a, b)
    }

    fn dense_linear(x: T<R>, w: T<R>) -> T<R> {
        matmul::linear_launch(x, w)
    }

    fn dense_linear_t(x: T<R>, w: T<R>, wt: T<R>) -> T<R> {
        matmul::linear_launch_t(x, w, Some(wt))
    }

    fn nvfp4_linear(x: T<R>, w: Nvfp4Weights<Self>, rows: Rows<Self>, epi: Epilogue) -> T<R> {
        linear::launcher::launch(x, w, rows, epi)
    }

    fn fp8_linear(x: T<R>, w: Fp8Weights<Self>, rows: Rows<Self>, epi: Epilogue) -> T<R> {
        linear::launcher::launch(x, w, rows, epi)
    }

    fn fp8_gated_linear(
        x: T<R>,
        gate: T<R>,
        norm_weight: T<R>,
        groups: usize,
        eps: f64,
        w: Fp8Weights<Self>,
    ) -> T<R> {
        linear::fp8::launch_gated(x, gate, norm_weight, groups, eps, w)
    }

    fn nvfp4_linear3(x: T<R>, w: Nvfp4Weights<Self>, widths: [usize; 3]) -> (T<R>, T<R>, T<R>) {
        linear::launcher::launch3(x, w, widths)
    }

    fn fp8_linear3(x: T<R>, w: Fp8Weights<Self>, widths: [usize; 3]) -> (T<R>, T<R>, T<R>) {
        linear::launcher::launch3(x, w, widths)
    }

    fn rms_norm(x: T<R>, gate: Maybe<Self>, weight: T<R>, groups: usize, eps: f64) -> T<R> {
        norm::launch(x, gate, weight, groups, eps)
    }

    fn add_rms_norm(x: T<R>, y: T<R>, weight: T<R>, eps: f64) -> (T<R>, T<R>) {
        norm::add_launch(x, y, weight, eps)
    }

    fn add_moe_rms_norm(
        x: T<R>,
        routed: T<R>,
        w: T<R>,
        shared: Maybe<Self>,
        weight: T<R>,
        eps: f64,
    ) -> (T<R>, T<R>) {
        norm::add_combine_launch(x, routed, Some(w), shared, weight, eps)
    }

    fn moe_combine(y: T<R>, w: T<R>, shared: Maybe<Self>) -> T<R> {
        route::combine_launch(y, w, shared)
    }

    fn moe_route(logits: T<R>, bias: T<R>, config: RouteConfig) -> (T<R>, T<R>) {
        route::launch(logits, bias, config)
    }

    fn dt_softplus(dt: T<R>, bias: T<R>, min: Option<f32>) -> T<R> {
        mamba::softplus::launch(dt, bias, min)
    }

    fn causal_conv1d(
        x: T<R>,
        weight: T<R>,
        bias: Maybe<Self>,
        state: T<R>,
        lens: &[usize],
    ) -> (T<R>, T<R>) {
        mamba::conv::launch(x, weight, bias, state, lens)
    }

    fn causal_conv1d3(
        x: T<R>,
        weight: T<R>,
        bias: Maybe<Self>,
        state: T<R>,
        lens: &[usize],
        widths: [usize; 3],
    ) -> (T<R>, T<R>, T<R>, T<R>) {
        let ([a, b, c], s) = mamba::conv::launch_split(x, weight, bias, state, lens, widths);
        (a, b, c, s)
    }

    fn selective_scan(
        x: T<R>,
        dt: T<R>,
        a: T<R>,
        b: T<R>,
        c: T<R>,
        d: T<R>,
        state: Maybe<Self>,
        lens: &[usize],
    ) -> (T<R>, T<R>) {
        let state = state.into_option();
        match mamba::ssd::chunks_for(&x, &b) {
            Some(ch) => mamba::ssd::launch(x, dt, a, b, c, d, state, lens, ch.len, ch.count),
            None => {
                let state = state.unwrap_or_else(|| mamba::scan::zero_state(&x, &b));
                mamba::scan::launch(x, dt, a, b, c, d, state, lens)
            }
        }
    }

    fn conv_step(
        x: T<R>,
        weight: T<R>,
        bias: Maybe<Self>,
        pool: T<R>,
        lens: T<R>,
        slots: T<R>,
    ) -> (T<R>, T<R>) {
        mamba::step::conv_launch(x, weight, bias, pool, lens, slots)
    }

    fn conv_ssm_step(
        xbc: T<R>,
        dt: T<R>,
        conv_weight: T<R>,
        conv_bias: Maybe<Self>,
        dt_bias: T<R>,
        a: T<R>,
        d: T<R>,
        conv_pool: T<R>,
        ssm_pool: T<R>,
        lens: T<R>,
        slots: T<R>,
        dims: ScanDims,
        dt_min: Option<f32>,
    ) -> (T<R>, T<R>, T<R>) {
        conv_ssm(
            xbc,
            dt,
            conv_weight,
            conv_bias,
            dt_bias,
            a,
            d,
            conv_pool,
            ssm_pool,
            lens,
            slots,
            dims,
            dt_min,
        )
    }

    fn conv_ssm_step_bf16(
        xbc: T<R>,
        dt: T<R>,
        conv_weight: T<R>,
        conv_bias: Maybe<Self>,
        dt_bias: T<R>,
        a: T<R>,
        d: T<R>,
        conv_pool: T<R>,
        ssm_pool: T<R>,
        lens: T<R>,
        slots: T<R>,
        dims: ScanDims,
        dt_min: Option<f32>,
    ) -> (T<R>, T<R>, T<R>) {
        // The launches read the pool's dtype: I32 words are the bf16 state.
        conv_ssm(
            xbc,
            dt,
            conv_weight,
            conv_bias,
            dt_bias,
            a,
            d,
            conv_pool,
            ssm_pool,
            lens,
            slots,
            dims,
            dt_min,
        )
    }

    fn ssm_step(
        xbc: T<R>,
        dt: T<R>,
        dt_bias: T<R>,
        a: T<R>,
        d: T<R>,
        pool: T<R>,
        slots: T<R>,
        dims: ScanDims,
        dt_min: Option<f32>,
    ) -> (T<R>, T<R>) {
        mamba::step::ssm_launch(xbc, dt, dt_bias, a, d, pool, slots, dims, dt_min)
    }

    fn attention_step(
        q: T<R>,
        k: T<R>,
        v: T<R>,
        kpool: T<R>,
        vpool: T<R>,
        lens: T<R>,
        slots: T<R>,
        scale: f32,
    ) -> (T<R>, T<R>, T<R>) {
        attention::decode::launch(q, k, v, kpool, vpool, lens, slots, scale)
    }

    fn attention_step_qkv(
        qkv: T<R>,
        heads: usize,
        kpool: T<R>,
        vpool: T<R>,
        lens: T<R>,
        slots: T<R>,
        scale: f32,
    ) -> (T<R>, T<R>, T<R>) {
        attention::decode::launch_fused(qkv, heads, kpool, vpool, lens, slots, scale, None)
    }

    fn attention_step_qkv8(
        qkv: T<R>,
        heads: usize,
        kpool: T<R>,
        vpool: T<R>,
        lens: T<R>,
        slots: T<R>,
        scale: f32,
        kv_scales: (f32, f32),
    ) -> (T<R>, T<R>, T<R>) {
        attention::decode::launch_fused(
            qkv,
            heads,
            kpool,
            vpool,
            lens,
            slots,
            scale,
            Some(kv_scales),
        )
    }

    fn write_slots8(pool: T<R>, src: T<R>, slots: T<R>, scale: f32) -> T<R> {
        slots::write_many8_launch(pool, src, slots, scale)
    }

    fn write_slots_bf16(pool: T<R>, src: T<R>, slots: T<R>) -> T<R> {
        slots::write_many_bf16_launch(pool, src, slots)
    }

    fn attention_prefill(
        q: T<R>,
        kpool: T<R>,
        vpool: T<R>,
        seqs: T<R>,
        heads: usize,
        scale: f32,
    ) -> T<R> {
        attention::prefill::launch(q, kpool, vpool, seqs, heads, scale)
    }

    fn argmax_rows(x: T<R>) -> T<R> {
        argmax::launch(x)
    }

    fn logprob_rows(x: T<R>, tokens: T<R>, n: usize) -> (T<R>, T<R>, T<R>) {
        logprobs::launch(x, tokens, n)
    }

    fn advance_lens(lens: T<R>, slots: T<R>) -> T<R> {
        slots::advance_launch(lens, slots)
    }

    fn moe_group(experts: T<R>, n_experts: usize) -> (T<R>, T<R>) {
        let experts = burn_cubecl::kernel::into_contiguous(experts);
        let (mut counts, mut members) = moe::group(&experts, n_experts);
        // U32 buffers of values below 2^31: the same bits as I32.
        counts.dtype = burn::tensor::DType::I32;
        members.dtype = burn::tensor::DType::I32;
        (counts, members)
    }

    fn contiguous(x: T<R>) -> T<R> {
        burn_cubecl::kernel::into_contiguous(x)
    }

    fn contiguous_int(x: T<R>) -> T<R> {
        burn_cubecl::kernel::into_contiguous(x)
    }

    fn write_slot(pool: T<R>, src: T<R>, slot: usize) -> T<R> {
        slots::write_launch(pool, src, slot)
    }

    fn write_slots(pool: T<R>, src: T<R>, slots: T<R>, rot: T<R>, width: usize) -> T<R> {
        slots::write_many_launch(pool, src, slots, rot, width)
    }
}

/// Shared memory per cube (bytes) of a CubeCL device, `None` on other devices.
pub fn max_shared_memory(device: &burn::tensor::Device) -> Option<usize> {
    #[allow(unused_imports)]
    use burn::backend::DispatchDevice;
    use cubecl::Runtime;
    match device.as_dispatch() {
        #[cfg(feature = "cuda")]
        DispatchDevice::Cuda(d) => Some(attention::flash::max_shared(
            &cubecl::cuda::CudaRuntime::client(d),
        )),
        #[cfg(feature = "wgpu")]
        DispatchDevice::Wgpu(d) => {
            Some(attention::flash::max_shared(&cubecl::wgpu::WgpuRuntime::<
                cubecl::wgpu::AutoCompiler,
            >::client(d)))
        }
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// Whether a CubeCL device has the bf16 tensor-core `mma` the prefill kernels use (false on
/// other devices).
pub fn bf16_mma(device: &burn::tensor::Device) -> bool {
    #[allow(unused_imports)]
    use burn::backend::DispatchDevice;
    #[allow(unused_imports)]
    use cubecl::Runtime;
    match device.as_dispatch() {
        #[cfg(feature = "cuda")]
        DispatchDevice::Cuda(d) => bf16_mma::available(&cubecl::cuda::CudaRuntime::client(d)),
        #[cfg(feature = "wgpu")]
        DispatchDevice::Wgpu(d) => {
            bf16_mma::available(&cubecl::wgpu::WgpuRuntime::<cubecl::wgpu::AutoCompiler>::client(d))
        }
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// `(total, reserved)` bytes of a CubeCL device's memory: its size and what this process's
/// allocator holds (the weights, the pools, cached buffers). The total is known on CUDA only:
/// cubecl-cuda (0.11.0-pre.2, the pinned version) sets the device's largest page to a quarter of
/// `cuDeviceTotalMem`; `None` elsewhere (wgpu reports no device size).
pub fn memory_total_and_reserved(device: &burn::tensor::Device) -> Option<(u64, u64)> {
    #[allow(unused_imports)]
    use burn::backend::DispatchDevice;
    #[allow(unused_imports)]
    use cubecl::Runtime;
    match device.as_dispatch() {
        #[cfg(feature = "cuda")]
        DispatchDevice::Cuda(d) => {
            let client = cubecl::cuda::CudaRuntime::client(d);
            let total = client.properties().memory.max_page_size.saturating_mul(4);
            let reserved = client.memory_usage().ok()?.bytes_reserved;
            Some((total, reserved))
        }
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// Bytes of device memory in use on a CubeCL device, `None` on other devices.
pub fn memory_in_use(device: &burn::tensor::Device) -> Option<u64> {
    #[allow(unused_imports)]
    use burn::backend::DispatchDevice;
    use cubecl::Runtime;
    match device.as_dispatch() {
        #[cfg(feature = "cuda")]
        DispatchDevice::Cuda(d) => cubecl::cuda::CudaRuntime::client(d)
            .memory_usage()
            .ok()
            .map(|u| u.bytes_in_use),
        #[cfg(feature = "wgpu")]
        DispatchDevice::Wgpu(d) => {
            cubecl::wgpu::WgpuRuntime::<cubecl::wgpu::AutoCompiler>::client(d)
                .memory_usage()
                .ok()
                .map(|u| u.bytes_in_use)
        }
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// Writes `data` into the device buffer of the contiguous I32 tensor `t`, in place (the same
/// device pointer, ordered on the device's stream): how a captured graph's inputs change between
/// replays. CubeCL devices only; the tensor must be one the graph captured (not a copy of it).
pub fn write_i32_in_place<const D: usize>(
    t: &burn::tensor::Tensor<D, burn::tensor::Int>,
    data: &[i32],
) -> Result<(), String> {
    #[allow(unused_imports)]
    use burn::backend::DispatchDevice;
    if t.dtype() != burn::tensor::DType::I32 || t.shape().num_elements() != data.len() {
        return Err(format!(
            "in-place write of {} i32 values into a {:?} tensor of {} elements",
            data.len(),
            t.dtype(),
            t.shape().num_elements()
        ));
    }
    fn write<R: CubeRuntime>(p: CubeTensor<R>, data: &[i32]) -> Result<(), String> {
        if !p.is_contiguous() {
            return Err("in-place write into a strided tensor".into());
        }
        p.client
            .write(&p.handle, cubecl::bytes::Bytes::from_elems(data.to_vec()));
        Ok(())
    }
    match t.device().as_dispatch() {
        #[cfg(feature = "cuda")]
        DispatchDevice::Cuda(_) => write(
            t.clone()
                .try_into_primitive::<burn::backend::Cuda>()
                .map_err(|e| format!("{e:?}"))?,
            data,
        ),
        #[cfg(feature = "wgpu")]
        DispatchDevice::Wgpu(_) => write(
            t.clone()
                .try_into_primitive::<burn::backend::Wgpu>()
                .map_err(|e| format!("{e:?}"))?,
            data,
        ),
        #[allow(unreachable_patterns)]
        other => Err(format!(
            "in-place writes need a CubeCL device, not {other:?}"
        )),
    }
}

/// Whether `device` runs the CubeCL backends of this build.
pub fn is_cube(device: &burn::tensor::Device) -> bool {
    #[allow(unused_imports)]
    use burn::backend::DispatchDevice;
    match device.as_dispatch() {
        #[cfg(feature = "cuda")]
        DispatchDevice::Cuda(_) => true,
        #[cfg(feature = "wgpu")]
        DispatchDevice::Wgpu(_) => true,
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// [`NemotronOps::conv_ssm_step`] (and its bf16-state form: the pool's dtype tells them apart).
#[allow(clippy::too_many_arguments)]
fn conv_ssm<R: CubeRuntime>(
    xbc: T<R>,
    dt: T<R>,
    conv_weight: T<R>,
    conv_bias: Maybe<CubeBackend<R>>,
    dt_bias: T<R>,
    a: T<R>,
    d: T<R>,
    conv_pool: T<R>,
    ssm_pool: T<R>,
    lens: T<R>,
    slots: T<R>,
    dims: ScanDims,
    dt_min: Option<f32>,
) -> (T<R>, T<R>, T<R>) {
    // Fused up to FUSED_CONV_MAX_ROWS rows only: every (p-block, head) cube recomputes its
    // group's conv taps, which costs more than the saved launch once rows grow.
    if !fused() || xbc.meta.shape()[0] > fused_conv_max_rows() {
        let (x, cp) =
            mamba::step::conv_launch(xbc, conv_weight, conv_bias, conv_pool, lens, slots.clone());
        let (y, sp) = mamba::step::ssm_launch(x, dt, dt_bias, a, d, ssm_pool, slots, dims, dt_min);
        return (y, cp, sp);
    }
    mamba::step::conv_ssm_launch(
        xbc,
        dt,
        mamba::step::ConvIn {
            weight: conv_weight,
            bias: conv_bias,
            pool: conv_pool,
            lens,
        },
        dt_bias,
        a,
        d,
        ssm_pool,
        slots,
        dims,
        dt_min,
    )
}
