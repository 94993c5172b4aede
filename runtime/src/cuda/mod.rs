//! The CUDA backend: finding a device, and running a device plan on it.
//!
//! cudarc loads the driver library (`libcuda.so`) at run time, so kiln builds without a CUDA toolkit and runs on
//! machines without a GPU. Its driver calls panic when the library is missing, so [`CudaDevice::open`] asks
//! first ([`cudarc::driver::sys::is_culib_present`]) and turns every failure into a [`RunError`] naming what is
//! missing.
//!
//! [`GpuProgram`] runs an executable's `codegen::device::DevicePlan` on any [`Gpu`]: [`CudaGpu`] is a real
//! device (the driver API, one stream, the PTX module, cuBLAS); the root crate's host emulation is another, which
//! is how this module is tested on machines without a GPU.

mod driver;
pub mod gpu;
mod host;
mod nccl;
mod node;
mod parameters;
mod program;
mod submission;

use std::sync::Arc;

use cudarc::driver::CudaContext;

/// The smallest device allocation, in bytes: an empty buffer still holds one element of any dtype, so a kernel's
/// clamped read of an empty operand (one a select never picks: a concat's empty past) stays inside it.
pub const MIN_ALLOCATION: usize = 16;

pub use driver::CudaGpu;
pub use gpu::{DevPtr, DeviceBuffer, Gemm, Gpu};
pub use host::{HostGpu, HostKernels, NoKernels};
pub use nccl::{NcclGroup, NcclId};
pub use node::{CUDA_BACKEND, CUDA_PRIORITY, CudaNodeBackend};
pub use parameters::{GpuHostBuffer, GpuMaterialization, GpuParameter, GpuWeight};
pub use program::{GpuProgram, PendingRun};
pub use submission::{GpuBackend, GpuCompletion, GpuExecutor, GpuWork};

use crate::RunError;

/// An opened CUDA device.
pub struct CudaDevice {
    ordinal: usize,
    name: String,
    context: Arc<CudaContext>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice({}: {})", self.ordinal, self.name)
    }
}

fn unavailable(message: impl std::fmt::Display) -> RunError {
    RunError::NoDevice { backend: "cuda".into(), reason: message.to_string() }
}

impl CudaDevice {
    /// Opens device `ordinal`. Without a driver library, without devices, or with a failing driver, a clear error.
    pub fn open(ordinal: usize) -> Result<CudaDevice, RunError> {
        // SAFETY: probing only tries to load the driver library; it calls nothing in it.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(unavailable("no NVIDIA driver on this machine (libcuda.so could not be loaded)"));
        }
        let count = CudaContext::device_count().map_err(|e| unavailable(format!("the driver fails: {e}")))?;
        if count <= 0 {
            return Err(unavailable("the NVIDIA driver sees no device"));
        }
        if ordinal >= count as usize {
            return Err(unavailable(format!("no device {ordinal}: this machine has {count}")));
        }
        let context =
            CudaContext::new(ordinal).map_err(|e| unavailable(format!("cannot open device {ordinal}: {e}")))?;
        let name = context.name().unwrap_or_else(|_| "unknown device".to_string());
        Ok(CudaDevice { ordinal, name, context })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name (`NVIDIA H200`, say).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The compute capability, `(major, minor)`: `(9, 0)` on an H100 or H200.
    pub fn compute_capability(&self) -> Result<(i32, i32), RunError> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        let get = |a| {
            self.context.attribute(a).map_err(|e| unavailable(format!("cannot query device {}: {e}", self.ordinal)))
        };
        Ok((
            get(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            get(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// The driver context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_a_device_never_panics() {
        // On a machine without a driver this is the clear error; with one, device 0 opens and a huge ordinal is
        // refused by name.
        match CudaDevice::open(0) {
            Err(e) => assert!(matches!(e, RunError::NoDevice { .. }) && e.to_string().starts_with("cuda: "), "{e}"),
            Ok(d) => {
                assert!(!d.name().is_empty());
                let err = CudaDevice::open(10_000).unwrap_err().to_string();
                assert!(err.contains("no device 10000"), "{err}");
            }
        }
    }
}
