//! The backends and dtypes a user can ask for by name, and running generic code on the one asked
//! for.

use crate::error::Error;
use nemotron_kernels::NemotronBackend;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The host reference (f32).
    NdArray,
    /// CUDA through CubeCL (f32 or bf16 activations); build with `--features cuda`.
    Cuda,
    /// wgpu through CubeCL (f32); build with `--features wgpu`.
    Wgpu,
}

impl FromStr for BackendKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "ndarray" | "cpu" | "host" => Ok(BackendKind::NdArray),
            "cuda" => Ok(BackendKind::Cuda),
            "wgpu" => Ok(BackendKind::Wgpu),
            _ => Err(Error::UnknownBackend(s.into())),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    Bf16,
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(DType::F32),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            _ => Err(Error::UnknownDtype(s.into())),
        }
    }
}

/// Code generic over the backend, run by [`BackendKind::run`] on the backend a user named.
pub trait BackendTask {
    type Output;
    fn run<B: NemotronBackend>(self, device: &B::Device) -> Self::Output;
}

fn built() -> &'static str {
    match (cfg!(feature = "wgpu"), cfg!(feature = "cuda")) {
        (false, false) => {
            "ndarray (f32); rebuild with --features wgpu and/or cuda for the device arms"
        }
        (true, false) => "ndarray (f32), wgpu (f32)",
        (false, true) => "ndarray (f32), cuda (f32, bf16)",
        (true, true) => "ndarray (f32), wgpu (f32), cuda (f32, bf16)",
    }
}

impl BackendKind {
    /// Whether this build can run `self` with `dtype`; the reason when it cannot.
    pub fn check(self, dtype: DType) -> Result<(), Error> {
        let ok = matches!(
            (self, dtype),
            (BackendKind::NdArray, DType::F32)
                | (BackendKind::Wgpu, DType::F32)
                | (BackendKind::Cuda, DType::F32)
                | (BackendKind::Cuda, DType::Bf16)
        ) && match self {
            BackendKind::NdArray => true,
            BackendKind::Wgpu => cfg!(feature = "wgpu"),
            BackendKind::Cuda => cfg!(feature = "cuda"),
        };
        if ok {
            Ok(())
        } else {
            Err(Error::Unavailable(format!(
                "{self:?} with {dtype:?} is not available in this build (available: {})",
                built()
            )))
        }
    }

    /// Runs `task` on this backend with `dtype` (device 0).
    pub fn run<T: BackendTask>(self, dtype: DType, task: T) -> Result<T::Output, Error> {
        self.check(dtype)?;
        #[cfg(feature = "cuda")]
        if self == BackendKind::Cuda {
            probe::<nemotron_kernels::cube::CudaBackend<f32>>(
                "CUDA (no driver or no GPU: libcuda could not be loaded or no device answered)",
            )?;
        }
        #[cfg(feature = "wgpu")]
        if self == BackendKind::Wgpu {
            probe::<nemotron_kernels::cube::WgpuBackend>(
                "wgpu (no adapter: install a Vulkan driver, e.g. mesa-vulkan-drivers)",
            )?;
        }
        Ok(match (self, dtype) {
            #[cfg(feature = "wgpu")]
            (BackendKind::Wgpu, DType::F32) => {
                task.run::<nemotron_kernels::cube::WgpuBackend>(&Default::default())
            }
            #[cfg(feature = "cuda")]
            (BackendKind::Cuda, DType::F32) => {
                task.run::<nemotron_kernels::cube::CudaBackend<f32>>(&Default::default())
            }
            #[cfg(feature = "cuda")]
            (BackendKind::Cuda, DType::Bf16) => {
                task.run::<nemotron_kernels::cube::CudaBackend<burn::tensor::bf16>>(
                    &Default::default(),
                )
            }
            _ => task.run::<burn::backend::NdArray<f32>>(&Default::default()),
        })
    }
}

/// Starts the device once, turning the runtime's panic on a missing driver or device into an
/// error (the panic message is kept out of the user's terminal).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn probe<B: NemotronBackend>(what: &str) -> Result<(), Error> {
    use burn::tensor::Tensor;
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(|| {
        let t = Tensor::<B, 1>::zeros([1], &Default::default());
        let _ = t.into_data();
    });
    std::panic::set_hook(hook);
    r.map_err(|_| Error::Unavailable(format!("{what}")))
}
