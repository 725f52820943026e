//! The backends and dtypes a user can ask for by name, and the device that runs them.

use crate::error::Error;
use burn::tensor::{Device, FloatDType, Tensor};
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The host reference on Burn's Flex CPU backend (f32): the default.
    Flex,
    /// The host reference on Burn's NdArray CPU backend (f32).
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
            "flex" | "cpu" | "host" => Ok(BackendKind::Flex),
            "ndarray" => Ok(BackendKind::NdArray),
            "cuda" => Ok(BackendKind::Cuda),
            "wgpu" => Ok(BackendKind::Wgpu),
            _ => Err(Error::UnknownBackend(s.into())),
        }
    }
}

/// An activation dtype a user can ask for.
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

impl DType {
    /// Burn's dtype.
    pub fn burn(self) -> burn::tensor::DType {
        match self {
            DType::F32 => burn::tensor::DType::F32,
            DType::Bf16 => burn::tensor::DType::BF16,
        }
    }
}

/// Burn's float dtype by the name a user would type (`f32`, `bf16`, …).
pub fn dtype_name(d: burn::tensor::DType) -> String {
    match d {
        burn::tensor::DType::F32 => "f32".into(),
        burn::tensor::DType::BF16 => "bf16".into(),
        burn::tensor::DType::F16 => "f16".into(),
        other => format!("{other:?}"),
    }
}

fn built() -> String {
    let mut arms = vec!["flex (f32)", "ndarray (f32)"];
    if cfg!(feature = "wgpu") {
        arms.push("wgpu (f32)");
    }
    if cfg!(feature = "cuda") {
        arms.push("cuda (f32, bf16)");
    }
    if arms.len() == 2 {
        arms.push("rebuild with --features wgpu and/or cuda for the device arms");
    }
    arms.join(", ")
}

impl BackendKind {
    /// Whether this build can run `self` with `dtype`; the reason when it cannot.
    pub fn check(self, dtype: DType) -> Result<(), Error> {
        let ok = matches!(
            (self, dtype),
            (BackendKind::NdArray, DType::F32)
                | (BackendKind::Flex, DType::F32)
                | (BackendKind::Wgpu, DType::F32)
                | (BackendKind::Cuda, DType::F32)
                | (BackendKind::Cuda, DType::Bf16)
        ) && match self {
            BackendKind::NdArray => true,
            BackendKind::Flex => true,
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

    /// Device 0 of this backend, started, with `dtype` as its default float dtype where the
    /// device's defaults are still open (the model creates every tensor in its own dtype either
    /// way). Fails with one line when the backend is not built in or no device answers.
    pub fn device(self, dtype: DType) -> Result<Device, Error> {
        self.check(dtype)?;
        let mut device = match self {
            BackendKind::NdArray => Device::ndarray(),
            BackendKind::Flex => Device::flex(),
            #[cfg(feature = "wgpu")]
            BackendKind::Wgpu => Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => Device::cuda(0),
            #[allow(unreachable_patterns)]
            _ => unreachable!("checked: built in"),
        };
        let what = match self {
            BackendKind::NdArray => "ndarray",
            BackendKind::Flex => "flex",
            BackendKind::Cuda => {
                "CUDA (no driver or no GPU: libcuda could not be loaded or no device answered)"
            }
            BackendKind::Wgpu => {
                "wgpu (no adapter: install a Vulkan driver, e.g. mesa-vulkan-drivers)"
            }
        };
        let float = match dtype {
            DType::F32 => FloatDType::F32,
            DType::Bf16 => FloatDType::BF16,
        };
        // Already initialized (an earlier call in this process): the defaults stay as they are.
        let _ = device.configure(float);
        probe(&device, dtype, what)?;
        Ok(device)
    }
}

/// Starts the device once in `dtype`, turning the runtime's panic on a missing driver or device
/// into an error (the panic message is kept out of the user's terminal).
fn probe(device: &Device, dtype: DType, what: &str) -> Result<(), Error> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(|| {
        let t = Tensor::<1>::zeros([1], (device, dtype.burn()));
        t.into_data().dtype
    });
    std::panic::set_hook(hook);
    match r {
        Ok(got) if got == dtype.burn() => Ok(()),
        Ok(got) => Err(Error::Unavailable(format!(
            "{what}: asked for {dtype:?}, the device made {got:?}"
        ))),
        Err(_) => Err(Error::Unavailable(what.to_string())),
    }
}
