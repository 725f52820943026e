//! [`NemotronBackend`] for Burn's CubeCL backends (`CubeBackend<R, …>` for any CubeCL runtime:
//! CUDA, wgpu), used without Burn's fusion layer. Packed weights live on the device in their
//! shipped form; the ops run the runtime-generic kernels of [`kernels`]. Activations enter the
//! kernels as f32 (a bf16 model casts around them); the SSM state is f32.
//!
//! Kernels index dense row-major buffers: inputs go through `into_contiguous` and outputs are
//! allocated contiguous (CUDA's default allocation may pitch rows).

pub mod kernels;

use crate::{Fp8Matrix, NemotronBackend, Nvfp4Matrix};
use burn::tensor::{DType, Shape, Tensor, TensorPrimitive};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;
use cubecl::server::Handle;
use nemotron_formats as fmt;

/// The wgpu arm (f32; CI runs it on Mesa lavapipe).
#[cfg(feature = "wgpu")]
pub type WgpuBackend = CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u32>;

/// The CUDA arm; `F` is the activation dtype (f32 or `half::bf16`).
#[cfg(feature = "cuda")]
pub type CudaBackend<F = f32> = CubeBackend<cubecl::cuda::CudaRuntime, F, i32, u8>;

/// Linear kernels: lanes per output row (a power of two) × output rows per cube.
const LINEAR_LANES: u32 = 32;
const LINEAR_ROWS: u32 = 8;
const LINEAR_UNITS: u32 = LINEAR_LANES * LINEAR_ROWS;

fn linear_dim() -> CubeDim {
    CubeDim::new_2d(LINEAR_LANES, LINEAR_ROWS)
}

/// Cubes for `n` output rows of `m` input rows.
fn linear_grid(n: usize, m: usize) -> CubeCount {
    CubeCount::Static(n.div_ceil(LINEAR_ROWS as usize) as u32, m as u32, 1)
}
const ELEMWISE_BLOCK: u32 = 128;
/// Units per RMSNorm cube (a power of two).
const NORM_UNITS: u32 = 256;
/// Matmul cube: columns per cube × unit rows splitting K (a power of two).
const MATMUL_COLS: u32 = 32;
const MATMUL_SPLITS: u32 = 16;

/// Decode tables built from the format definitions (uploaded once per weight; 1 KiB).
#[derive(Clone)]
struct Luts {
    e4m3: Handle,
}

fn luts<R: CubeRuntime>(client: &ComputeClient<R>) -> Luts {
    let e4m3: Vec<f32> = (0..=255u8)
        .map(|b| {
            if fmt::e4m3_is_nan(b) {
                0.0
            } else {
                fmt::e4m3_to_f32(b)
            }
        })
        .collect();
    Luts {
        e4m3: client.create_from_slice(f32::as_bytes(&e4m3)),
    }
}

/// Bytes as little-endian u32 words, each row padded to whole words.
fn words(bytes: &[u8], rows: usize, row_bytes: usize) -> (Vec<u32>, usize) {
    let per = row_bytes.div_ceil(4);
    let mut out = vec![0u32; rows * per];
    for r in 0..rows {
        for (i, &b) in bytes[r * row_bytes..(r + 1) * row_bytes].iter().enumerate() {
            out[r * per + i / 4] |= (b as u32) << (8 * (i % 4));
        }
    }
    (out, per)
}

/// An NVFP4 matrix on the device: E2M1 codes (u32 words of 8), E4M3 block scales (u32 words of 4
/// per row), the f32 global scale.
#[derive(Clone)]
pub struct CubeNvfp4<R: CubeRuntime> {
    client: ComputeClient<R>,
    packed: Handle,
    scales: Handle,
    scale_words: usize,
    luts: Luts,
    pub global_scale: f32,
    pub out_features: usize,
    pub in_features: usize,
}

impl<R: CubeRuntime> std::fmt::Debug for CubeNvfp4<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CubeNvfp4({}×{}, {} packed bytes)",
            self.out_features,
            self.in_features,
            self.out_features * self.in_features / 2
        )
    }
}

/// One projection of all routed experts of a layer on the device, stacked: E2M1 words
/// `[E · out, in/8]`, E4M3 block-scale words `[E · out, sw]`, the f32 global scales `[E]`.
#[derive(Clone)]
pub struct CubeNvfp4Experts<R: CubeRuntime> {
    client: ComputeClient<R>,
    packed: Handle,
    scales: Handle,
    globals: Handle,
    scale_words: usize,
    luts: Luts,
    pub experts: usize,
    pub out_features: usize,
    pub in_features: usize,
}

impl<R: CubeRuntime> std::fmt::Debug for CubeNvfp4Experts<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CubeNvfp4Experts({} × {}×{})",
            self.experts, self.out_features, self.in_features
        )
    }
}

/// One projection of all FP8 routed experts of a layer on the device: E4M3 words
/// `[E · out, in/4]` and each expert's scales.
#[derive(Clone)]
pub struct CubeFp8Experts<R: CubeRuntime> {
    client: ComputeClient<R>,
    weight: Handle,
    input_scales: Handle,
    weight_scales: Handle,
    luts: Luts,
    pub experts: usize,
    pub out_features: usize,
    pub in_features: usize,
}

impl<R: CubeRuntime> std::fmt::Debug for CubeFp8Experts<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CubeFp8Experts({} × {}×{})",
            self.experts, self.out_features, self.in_features
        )
    }
}

/// Int indices as a contiguous i32 device buffer.
fn index_cube<R, F, I, BT>(
    t: Tensor<CubeBackend<R, F, I, BT>, 1, burn::tensor::Int>,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    into_contiguous(t.cast(burn::tensor::IntDType::I32).into_primitive())
}

/// The cube grid for `LINEAR_ROWS` output rows of one slot per cube.
fn slot_grid(n: usize, slots: usize) -> CubeCount {
    let cy = slots.clamp(1, MAX_CUBES_Y);
    let cz = slots.div_ceil(cy).max(1);
    CubeCount::Static(
        n.div_ceil(LINEAR_ROWS as usize) as u32,
        cy as u32,
        cz as u32,
    )
}

/// The most cubes along y (CUDA's limit); more slots spill onto z.
const MAX_CUBES_Y: usize = 65_535;

/// A per-tensor FP8 matrix on the device (E4M3 bytes as u32 words of 4) with its scales.
#[derive(Clone)]
pub struct CubeFp8<R: CubeRuntime> {
    client: ComputeClient<R>,
    weight: Handle,
    luts: Luts,
    pub weight_scale: f32,
    pub input_scale: f32,
    pub out_features: usize,
    pub in_features: usize,
}

impl<R: CubeRuntime> std::fmt::Debug for CubeFp8<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CubeFp8({}×{})", self.out_features, self.in_features)
    }
}

fn f32_cube<
    R: CubeRuntime,
    B: burn::tensor::backend::Backend<FloatTensorPrimitive = CubeTensor<R>>,
    const D: usize,
>(
    t: Tensor<B, D>,
) -> CubeTensor<R> {
    let t = if t.dtype() == DType::F32 {
        t
    } else {
        t.cast(DType::F32)
    };
    into_contiguous(t.into_primitive().tensor())
}

/// A float tensor as a contiguous buffer in a storage type the kernels read (f32, bf16, f16;
/// others go through f32), with that dtype.
fn float_cube<
    R: CubeRuntime,
    B: burn::tensor::backend::Backend<FloatTensorPrimitive = CubeTensor<R>>,
    const D: usize,
>(
    t: Tensor<B, D>,
) -> (CubeTensor<R>, DType) {
    let t = match t.dtype() {
        DType::F32 | DType::BF16 | DType::F16 => t,
        _ => t.cast(DType::F32),
    };
    let dtype = t.dtype();
    (into_contiguous(t.into_primitive().tensor()), dtype)
}

/// Runs `$launch!(T)` with `T` the Rust type of float dtype `$dtype`.
macro_rules! with_float {
    ($dtype:expr, $launch:ident) => {
        match $dtype {
            DType::BF16 => $launch!(burn::tensor::bf16),
            DType::F16 => $launch!(burn::tensor::f16),
            _ => $launch!(f32),
        }
    };
}

fn from_cube<B: burn::tensor::backend::Backend, const D: usize>(
    t: B::FloatTensorPrimitive,
    dtype: DType,
) -> Tensor<B, D> {
    let t = Tensor::<B, D>::from_primitive(TensorPrimitive::Float(t));
    if dtype == DType::F32 {
        t
    } else {
        t.cast(dtype)
    }
}

fn array<R: CubeRuntime>(t: &CubeTensor<R>) -> ArrayArg<R> {
    unsafe { ArrayArg::from_raw_parts(t.handle.clone(), t.meta.shape().num_elements()) }
}

fn handle_array<R: CubeRuntime>(h: &Handle, len: usize) -> ArrayArg<R> {
    unsafe { ArrayArg::from_raw_parts(h.clone(), len) }
}

fn lens_handle<R: CubeRuntime>(client: &ComputeClient<R>, lens: &[usize]) -> (Handle, usize) {
    let v: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
    (client.create_from_slice(u32::as_bytes(&v)), v.len())
}

fn elemwise_count(n: usize) -> (CubeCount, CubeDim) {
    let cubes = n.div_ceil(ELEMWISE_BLOCK as usize).max(1) as u32;
    (
        CubeCount::Static(cubes, 1, 1),
        CubeDim::new_1d(ELEMWISE_BLOCK),
    )
}

fn nvfp4_linear_impl<R, F, I, BT>(
    x: Tensor<CubeBackend<R, F, I, BT>, 2>,
    w: &CubeNvfp4<R>,
    relu2: bool,
) -> Tensor<CubeBackend<R, F, I, BT>, 2>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let dtype = x.dtype();
    let [m, k] = x.dims();
    assert_eq!(
        k, w.in_features,
        "nvfp4_linear: x has {k} columns, the weight {} inputs",
        w.in_features
    );
    let (x, xdtype) = float_cube(x);
    let n = w.out_features;
    let y = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([m, n]),
        xdtype,
    );
    macro_rules! go {
        ($t:ty) => {
            kernels::nvfp4_linear_kernel::launch::<$t, R>(
                &w.client,
                linear_grid(n, m),
                linear_dim(),
                array(&x),
                handle_array(&w.packed, n * k / 8),
                handle_array(&w.scales, n * w.scale_words),
                handle_array(&w.luts.e4m3, 256),
                array(&y),
                k as u32,
                n as u32,
                w.scale_words as u32,
                w.global_scale,
                LINEAR_UNITS,
                relu2,
            )
        };
    }
    with_float!(xdtype, go);
    from_cube::<CubeBackend<R, F, I, BT>, 2>(y, dtype)
}

fn fp8_linear_impl<R, F, I, BT>(
    x: Tensor<CubeBackend<R, F, I, BT>, 2>,
    w: &CubeFp8<R>,
    relu2: bool,
) -> Tensor<CubeBackend<R, F, I, BT>, 2>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let dtype = x.dtype();
    let [m, k] = x.dims();
    assert_eq!(
        k, w.in_features,
        "fp8_linear: x has {k} columns, the weight {} inputs",
        w.in_features
    );
    let (x, xdtype) = float_cube(x);
    let n = w.out_features;
    let y = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([m, n]),
        xdtype,
    );
    macro_rules! go {
        ($t:ty) => {
            kernels::fp8_linear_kernel::launch::<$t, R>(
                &w.client,
                linear_grid(n, m),
                linear_dim(),
                array(&x),
                handle_array(&w.weight, n * k / 4),
                handle_array(&w.luts.e4m3, 256),
                array(&y),
                k as u32,
                n as u32,
                w.input_scale,
                w.weight_scale,
                LINEAR_UNITS,
                relu2,
            )
        };
    }
    with_float!(xdtype, go);
    from_cube::<CubeBackend<R, F, I, BT>, 2>(y, dtype)
}

fn nvfp4_expert_linear_impl<R, F, I, BT>(
    x: Tensor<CubeBackend<R, F, I, BT>, 2>,
    experts: Tensor<CubeBackend<R, F, I, BT>, 1, burn::tensor::Int>,
    div: usize,
    w: &CubeNvfp4Experts<R>,
    relu2: bool,
) -> Tensor<CubeBackend<R, F, I, BT>, 2>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let dtype = x.dtype();
    let [_, k] = x.dims();
    assert_eq!(
        k, w.in_features,
        "nvfp4_expert_linear: x has {k} columns, the experts {} inputs",
        w.in_features
    );
    let [slots] = experts.dims();
    let (x, xdtype) = float_cube(x);
    let idx = index_cube(experts);
    let n = w.out_features;
    let y = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([slots, n]),
        xdtype,
    );
    macro_rules! go {
        ($t:ty) => {
            kernels::nvfp4_expert_linear_kernel::launch::<$t, R>(
                &w.client,
                slot_grid(n, slots),
                linear_dim(),
                array(&x),
                array(&idx),
                handle_array(&w.packed, w.experts * n * k / 8),
                handle_array(&w.scales, w.experts * n * w.scale_words),
                handle_array(&w.globals, w.experts),
                handle_array(&w.luts.e4m3, 256),
                array(&y),
                k as u32,
                n as u32,
                w.scale_words as u32,
                slots as u32,
                div as u32,
                LINEAR_UNITS,
                relu2,
            )
        };
    }
    with_float!(xdtype, go);
    from_cube::<CubeBackend<R, F, I, BT>, 2>(y, dtype)
}

fn fp8_expert_linear_impl<R, F, I, BT>(
    x: Tensor<CubeBackend<R, F, I, BT>, 2>,
    experts: Tensor<CubeBackend<R, F, I, BT>, 1, burn::tensor::Int>,
    div: usize,
    w: &CubeFp8Experts<R>,
    relu2: bool,
) -> Tensor<CubeBackend<R, F, I, BT>, 2>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let dtype = x.dtype();
    let [_, k] = x.dims();
    assert_eq!(
        k, w.in_features,
        "fp8_expert_linear: x has {k} columns, the experts {} inputs",
        w.in_features
    );
    let [slots] = experts.dims();
    let (x, xdtype) = float_cube(x);
    let idx = index_cube(experts);
    let n = w.out_features;
    let y = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([slots, n]),
        xdtype,
    );
    macro_rules! go {
        ($t:ty) => {
            kernels::fp8_expert_linear_kernel::launch::<$t, R>(
                &w.client,
                slot_grid(n, slots),
                linear_dim(),
                array(&x),
                array(&idx),
                handle_array(&w.weight, w.experts * n * k / 4),
                handle_array(&w.input_scales, w.experts),
                handle_array(&w.weight_scales, w.experts),
                handle_array(&w.luts.e4m3, 256),
                array(&y),
                k as u32,
                n as u32,
                slots as u32,
                div as u32,
                LINEAR_UNITS,
                relu2,
            )
        };
    }
    with_float!(xdtype, go);
    from_cube::<CubeBackend<R, F, I, BT>, 2>(y, dtype)
}

impl<R, F, I, BT> NemotronBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    type Nvfp4Weight = CubeNvfp4<R>;
    type Fp8Weight = CubeFp8<R>;
    type Nvfp4Experts = CubeNvfp4Experts<R>;
    type Fp8Experts = CubeFp8Experts<R>;

    fn fp8_experts(w: Vec<Fp8Matrix>, device: &burn::tensor::Device<Self>) -> Self::Fp8Experts {
        let client = R::client(device);
        let (n, k) = (w[0].out_features, w[0].in_features);
        assert!(
            k % 4 == 0 && w.iter().all(|m| m.out_features == n && m.in_features == k),
            "fp8_experts: experts of one projection differ in shape (or in_features % 4 ≠ 0)"
        );
        let mut weight = Vec::with_capacity(w.len() * n * k / 4);
        for m in &w {
            weight.extend(words(&m.weight, n, k).0);
        }
        let is: Vec<f32> = w.iter().map(|m| m.input_scale).collect();
        let ws: Vec<f32> = w.iter().map(|m| m.weight_scale).collect();
        CubeFp8Experts {
            weight: client.create_from_slice(u32::as_bytes(&weight)),
            input_scales: client.create_from_slice(f32::as_bytes(&is)),
            weight_scales: client.create_from_slice(f32::as_bytes(&ws)),
            luts: luts(&client),
            client,
            experts: w.len(),
            out_features: n,
            in_features: k,
        }
    }

    fn fp8_expert_linear(
        x: Tensor<Self, 2>,
        experts: Tensor<Self, 1, burn::tensor::Int>,
        div: usize,
        w: &Self::Fp8Experts,
    ) -> Tensor<Self, 2> {
        fp8_expert_linear_impl(x, experts, div, w, false)
    }

    fn fp8_expert_linear_relu2(
        x: Tensor<Self, 2>,
        experts: Tensor<Self, 1, burn::tensor::Int>,
        div: usize,
        w: &Self::Fp8Experts,
    ) -> Tensor<Self, 2> {
        fp8_expert_linear_impl(x, experts, div, w, true)
    }

    fn nvfp4_experts(
        w: Vec<Nvfp4Matrix>,
        device: &burn::tensor::Device<Self>,
    ) -> Self::Nvfp4Experts {
        let client = R::client(device);
        let (n, k) = (w[0].out_features, w[0].in_features);
        assert!(
            w.iter().all(|m| m.out_features == n && m.in_features == k),
            "nvfp4_experts: experts of one projection differ in shape"
        );
        let mut packed = Vec::with_capacity(w.len() * n * k / 8);
        let mut scales = Vec::new();
        let mut scale_words = 0;
        for m in &w {
            packed.extend(words(&m.packed, n, k / 2).0);
            let (s, sw) = words(&m.block_scales, n, k / fmt::NVFP4_BLOCK);
            scales.extend(s);
            scale_words = sw;
        }
        let globals: Vec<f32> = w.iter().map(|m| m.global_scale).collect();
        CubeNvfp4Experts {
            packed: client.create_from_slice(u32::as_bytes(&packed)),
            scales: client.create_from_slice(u32::as_bytes(&scales)),
            globals: client.create_from_slice(f32::as_bytes(&globals)),
            scale_words,
            luts: luts(&client),
            client,
            experts: w.len(),
            out_features: n,
            in_features: k,
        }
    }

    fn nvfp4_expert_linear(
        x: Tensor<Self, 2>,
        experts: Tensor<Self, 1, burn::tensor::Int>,
        div: usize,
        w: &Self::Nvfp4Experts,
    ) -> Tensor<Self, 2> {
        nvfp4_expert_linear_impl(x, experts, div, w, false)
    }

    fn nvfp4_expert_linear_relu2(
        x: Tensor<Self, 2>,
        experts: Tensor<Self, 1, burn::tensor::Int>,
        div: usize,
        w: &Self::Nvfp4Experts,
    ) -> Tensor<Self, 2> {
        nvfp4_expert_linear_impl(x, experts, div, w, true)
    }

    fn nvfp4_weight(w: Nvfp4Matrix, device: &burn::tensor::Device<Self>) -> Self::Nvfp4Weight {
        let client = R::client(device);
        let (packed, _) = words(&w.packed, w.out_features, w.in_features / 2);
        let (scales, scale_words) = words(
            &w.block_scales,
            w.out_features,
            w.in_features / fmt::NVFP4_BLOCK,
        );
        CubeNvfp4 {
            packed: client.create_from_slice(u32::as_bytes(&packed)),
            scales: client.create_from_slice(u32::as_bytes(&scales)),
            scale_words,
            luts: luts(&client),
            client,
            global_scale: w.global_scale,
            out_features: w.out_features,
            in_features: w.in_features,
        }
    }

    fn memory_in_use(device: &burn::tensor::Device<Self>) -> Option<u64> {
        R::client(device)
            .memory_usage()
            .ok()
            .map(|u| u.bytes_in_use)
    }

    fn fp8_weight(w: Fp8Matrix, device: &burn::tensor::Device<Self>) -> Self::Fp8Weight {
        assert!(
            w.in_features % 4 == 0,
            "FP8 in_features {} must be a multiple of 4",
            w.in_features
        );
        let client = R::client(device);
        let (weight, _) = words(&w.weight, w.out_features, w.in_features);
        CubeFp8 {
            weight: client.create_from_slice(u32::as_bytes(&weight)),
            luts: luts(&client),
            client,
            weight_scale: w.weight_scale,
            input_scale: w.input_scale,
            out_features: w.out_features,
            in_features: w.in_features,
        }
    }

    fn matmul(a: Tensor<Self, 3>, b: Tensor<Self, 3>) -> Tensor<Self, 3> {
        let [bs, m, k] = a.dims();
        let [bs2, k2, n] = b.dims();
        assert!(
            bs == bs2 && k == k2,
            "matmul: [{bs}, {m}, {k}] · [{bs2}, {k2}, {n}]"
        );
        let out_dtype = a.dtype();
        // Read in the storage dtype (a bf16 weight is not widened per call); f32 otherwise.
        let dtype = if a.dtype() == b.dtype()
            && matches!(a.dtype(), DType::F32 | DType::BF16 | DType::F16)
        {
            a.dtype()
        } else {
            DType::F32
        };
        let (a, b) = (a.cast(dtype), b.cast(dtype));
        let a = into_contiguous(a.into_primitive().tensor());
        let b = into_contiguous(b.into_primitive().tensor());
        let client = a.client.clone();
        let c = empty_device_contiguous_dtype(
            client.clone(),
            a.device.clone(),
            Shape::new([bs, m, n]),
            dtype,
        );
        let count = CubeCount::Static(n.div_ceil(MATMUL_COLS as usize) as u32, m as u32, bs as u32);
        let dim = CubeDim::new_2d(MATMUL_COLS, MATMUL_SPLITS);
        let args = (array(&a), array(&b), array(&c));
        macro_rules! launch {
            ($t:ty) => {
                kernels::matmul_kernel::launch::<$t, R>(
                    &client,
                    count,
                    dim,
                    args.0,
                    args.1,
                    args.2,
                    m as u32,
                    k as u32,
                    n as u32,
                    MATMUL_COLS,
                    MATMUL_SPLITS,
                )
            };
        }
        match dtype {
            DType::BF16 => launch!(burn::tensor::bf16),
            DType::F16 => launch!(burn::tensor::f16),
            _ => launch!(f32),
        }
        let c = Tensor::<Self, 3>::from_primitive(TensorPrimitive::Float(c));
        if out_dtype == dtype {
            c
        } else {
            c.cast(out_dtype)
        }
    }

    fn nvfp4_linear(x: Tensor<Self, 2>, w: &Self::Nvfp4Weight) -> Tensor<Self, 2> {
        nvfp4_linear_impl(x, w, false)
    }

    fn nvfp4_linear_relu2(x: Tensor<Self, 2>, w: &Self::Nvfp4Weight) -> Tensor<Self, 2> {
        nvfp4_linear_impl(x, w, true)
    }

    fn fp8_linear(x: Tensor<Self, 2>, w: &Self::Fp8Weight) -> Tensor<Self, 2> {
        fp8_linear_impl(x, w, false)
    }

    fn fp8_linear_relu2(x: Tensor<Self, 2>, w: &Self::Fp8Weight) -> Tensor<Self, 2> {
        fp8_linear_impl(x, w, true)
    }

    fn rms_norm(
        x: Tensor<Self, 2>,
        gate: Option<Tensor<Self, 2>>,
        weight: Tensor<Self, 1>,
        groups: usize,
        eps: f64,
    ) -> Tensor<Self, 2> {
        let dtype = x.dtype();
        let [r, h] = x.dims();
        assert!(
            groups > 0 && h % groups == 0,
            "rms_norm: {groups} groups do not divide {h} channels"
        );
        let (x, xdtype) = float_cube(x);
        let same = |t: CubeTensor<R>| -> CubeTensor<R> {
            let t = Tensor::<Self, 1>::from_primitive(TensorPrimitive::Float(t));
            let t = if t.dtype() == xdtype {
                t
            } else {
                t.cast(xdtype)
            };
            into_contiguous(t.into_primitive().tensor())
        };
        let w = same(weight.into_primitive().tensor());
        let g = gate.map(|z| same(z.reshape([r * h]).into_primitive().tensor()));
        let y = empty_device_contiguous_dtype(
            x.client.clone(),
            x.device.clone(),
            Shape::new([r, h]),
            xdtype,
        );
        let client = x.client.clone();
        let gated = g.is_some();
        let gate_arg = g.as_ref().unwrap_or(&x);
        macro_rules! go {
            ($t:ty) => {
                kernels::rms_norm_kernel::launch::<$t, R>(
                    &client,
                    CubeCount::Static(r as u32, groups as u32, 1),
                    CubeDim::new_1d(NORM_UNITS),
                    array(&x),
                    array(gate_arg),
                    array(&w),
                    array(&y),
                    h as u32,
                    (h / groups) as u32,
                    eps as f32,
                    gated,
                    NORM_UNITS,
                )
            };
        }
        with_float!(xdtype, go);
        from_cube::<Self, 2>(y, dtype)
    }

    fn moe_route(
        logits: Tensor<Self, 2>,
        bias: Tensor<Self, 1>,
        c: &crate::RouteConfig,
    ) -> (Tensor<Self, 2, burn::tensor::Int>, Tensor<Self, 2>) {
        let [n, e] = logits.dims();
        assert!(
            c.n_group >= 1 && c.n_group <= 32 && e % c.n_group == 0 && c.top_k <= e,
            "moe_route: {e} experts, {} groups, top-{}",
            c.n_group,
            c.top_k
        );
        let (lg, b) = (f32_cube(logits), f32_cube(bias));
        let client = lg.client.clone();
        let idx = empty_device_contiguous_dtype(
            client.clone(),
            lg.device.clone(),
            Shape::new([n, c.top_k]),
            DType::I32,
        );
        let w = empty_device_contiguous_dtype(
            client.clone(),
            lg.device.clone(),
            Shape::new([n, c.top_k]),
            DType::F32,
        );
        let (count, dim) = elemwise_count(n);
        kernels::moe_route_kernel::launch::<R>(
            &client,
            count,
            dim,
            array(&lg),
            array(&b),
            array(&idx),
            array(&w),
            n as u32,
            e as u32,
            c.top_k as u32,
            c.n_group as u32,
            c.topk_group as u32,
            c.routed_scaling_factor,
            crate::MASKED_SCORE,
            c.norm_topk_prob,
            c.weights_from_biased,
        );
        (
            Tensor::from_primitive(idx),
            Tensor::from_primitive(TensorPrimitive::Float(w)),
        )
    }

    fn dt_softplus(
        dt: Tensor<Self, 3>,
        bias: Tensor<Self, 1>,
        min: Option<f32>,
    ) -> Tensor<Self, 3> {
        let dtype = dt.dtype();
        let [b, t, h] = dt.dims();
        let (x, xdtype) = float_cube(dt);
        let bias = bias.cast(xdtype);
        let bias = into_contiguous(bias.into_primitive().tensor());
        let client = x.client.clone();
        let y = empty_device_contiguous_dtype(
            client.clone(),
            x.device.clone(),
            Shape::new([b, t, h]),
            xdtype,
        );
        let len = b * t * h;
        let (count, dim) = elemwise_count(len);
        // No clamp: a floor below any softplus value (softplus > 0).
        let floor = min.unwrap_or(-1.0);
        macro_rules! go {
            ($t:ty) => {
                kernels::dt_softplus_kernel::launch::<$t, R>(
                    &client,
                    count,
                    dim,
                    array(&x),
                    array(&bias),
                    array(&y),
                    len as u32,
                    h as u32,
                    floor,
                )
            };
        }
        with_float!(xdtype, go);
        from_cube::<Self, 3>(y, dtype)
    }

    fn causal_conv1d(
        x: Tensor<Self, 3>,
        weight: Tensor<Self, 2>,
        bias: Option<Tensor<Self, 1>>,
        state: Tensor<Self, 3>,
        lens: &[usize],
    ) -> (Tensor<Self, 3>, Tensor<Self, 3>) {
        let dtype = x.dtype();
        let state_dtype = state.dtype();
        let [b, t, c] = x.dims();
        let [_, k] = weight.dims();
        let dev = x.device();
        let bias = bias.unwrap_or_else(|| Tensor::zeros([c], &dev));
        let (x, w, bias, st) = (
            f32_cube(x),
            f32_cube(weight),
            f32_cube(bias),
            f32_cube(state),
        );
        let client = x.client.clone();
        let y = empty_device_contiguous_dtype(
            client.clone(),
            x.device.clone(),
            Shape::new([b, t, c]),
            DType::F32,
        );
        let ns = empty_device_contiguous_dtype(
            client.clone(),
            x.device.clone(),
            Shape::new([b, c, k - 1]),
            DType::F32,
        );
        let (lh, ll) = lens_handle(&client, lens);
        let (count, dim) = elemwise_count(b * c);
        kernels::causal_conv1d_kernel::launch::<R>(
            &client,
            count,
            dim,
            array(&x),
            array(&w),
            array(&bias),
            array(&st),
            handle_array(&lh, ll),
            array(&y),
            array(&ns),
            b as u32,
            t as u32,
            c as u32,
            k as u32,
        );
        (
            from_cube::<Self, 3>(y, dtype),
            from_cube::<Self, 3>(ns, state_dtype),
        )
    }

    fn selective_scan(
        x: Tensor<Self, 4>,
        dt: Tensor<Self, 3>,
        a: Tensor<Self, 1>,
        b: Tensor<Self, 4>,
        c: Tensor<Self, 4>,
        d: Tensor<Self, 1>,
        state: Tensor<Self, 4>,
        lens: &[usize],
    ) -> (Tensor<Self, 4>, Tensor<Self, 4>) {
        let dtype = x.dtype();
        let state_dtype = state.dtype();
        let [bs, t, h, p] = x.dims();
        let [_, _, g, n] = b.dims();
        // The kernel updates the state in place: give it a buffer nobody else holds.
        let state = if state.dtype() == DType::F32 {
            state.add_scalar(0.0)
        } else {
            state.cast(DType::F32)
        };
        let (x, dt, a, bm, cm, d, st) = (
            f32_cube(x),
            f32_cube(dt),
            f32_cube(a),
            f32_cube(b),
            f32_cube(c),
            f32_cube(d),
            f32_cube(state),
        );
        let client = x.client.clone();
        let y = empty_device_contiguous_dtype(
            client.clone(),
            x.device.clone(),
            Shape::new([bs, t, h, p]),
            DType::F32,
        );
        let (lh, ll) = lens_handle(&client, lens);
        let (count, dim) = elemwise_count(bs * h * p);
        kernels::selective_scan_kernel::launch::<R>(
            &client,
            count,
            dim,
            array(&x),
            array(&dt),
            array(&a),
            array(&bm),
            array(&cm),
            array(&d),
            handle_array(&lh, ll),
            array(&st),
            array(&y),
            bs as u32,
            t as u32,
            h as u32,
            p as u32,
            g as u32,
            n as u32,
        );
        (
            from_cube::<Self, 4>(y, dtype),
            from_cube::<Self, 4>(st, state_dtype),
        )
    }
}
