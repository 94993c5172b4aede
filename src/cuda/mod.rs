//! The CUDA backend from the facade: a model (or a CUDA artifact) bound to a device and run there.
//!
//! [`Model::compile_cuda`] lowers the model (`cuda-default` pipeline, the target-independent executable), turns
//! it into a [`DevicePlan`] (library ops as GEMMs and builtin kernels), compiles the plan's kernels to PTX for the
//! device's architecture, and binds it all to the device: a [`crate::Compiled`] whose program is the runtime's
//! `GpuProgram` (the same handle the CPU gives; `Compiled::device` adds device timings). A CUDA artifact
//! ([`crate::Artifact::load_cuda`]) holds the same plan and PTX, so loading it needs no LLVM. Every step that
//! needs a device opens it first, so a machine without one gets the one clear error of
//! [`kiln_runtime::cuda::CudaDevice::open`] before any work.
//!
//! [`run_emulated`] runs the very same plan on the host: [`GpuProgram`] over an emulated device whose kernels are
//! the plan's, compiled for the host by `codegen::ptx::emulate`, whose memory is host memory and whose GEMM is
//! the CPU library's. It is how the CUDA runtime's own logic (buffer placement, launch geometry, symbols, GEMM
//! layouts, the builtin kernels) is tested without a GPU.

#[cfg(feature = "ptx")]
mod emulated;

use std::collections::BTreeMap;
#[cfg(feature = "ptx")]
use std::sync::Arc;

#[cfg(feature = "ptx")]
pub use emulated::run_emulated;
#[cfg(feature = "ptx")]
use kiln_codegen::device::{DevicePlan, PtxKernelInfo};
#[cfg(feature = "ptx")]
use kiln_codegen::exec::Executable;
use kiln_ir::Tensor;
use kiln_runtime::cuda::CudaDevice;
#[cfg(feature = "ptx")]
use kiln_runtime::cuda::{CudaGpu, GpuProgram};

#[cfg(feature = "ptx")]
use crate::CompileReport;
use crate::Error;

fn cuda_error(message: impl std::fmt::Display) -> Error {
    Error::Backend { backend: "cuda", message: message.to_string() }
}

/// Binds `exe` (with its weights) and `plan` to device `device`, loading `ptx` whose kernels `infos` describe,
/// with the backends its placed steps name from `backends`: a [`crate::Compiled`] on the cuda backend.
#[cfg(feature = "ptx")]
fn bind(
    device: CudaDevice,
    exe: Executable,
    plan: DevicePlan,
    ptx: &str,
    infos: Vec<PtxKernelInfo>,
    report: CompileReport,
    backends: &crate::BackendRegistry,
) -> Result<crate::Compiled, Error> {
    let entries: Vec<String> = infos.iter().map(|i| i.entry.clone()).collect();
    let gpu = CudaGpu::new(device, ptx, &entries).map_err(crate::cuda_run_error)?;
    let program =
        GpuProgram::with_backends(Arc::new(gpu), exe, plan, infos, backends).map_err(crate::cuda_run_error)?;
    Ok(crate::Compiled::from_program(program, report))
}

/// The architecture PTX is compiled for on `device`: `sm_90` from compute capability 9.0 on, `sm_80` from 8.0;
/// older devices are refused by name.
#[cfg(feature = "ptx")]
pub fn arch_for(device: &CudaDevice) -> Result<kiln_codegen::ptx::PtxArch, Error> {
    use kiln_codegen::ptx::PtxArch;
    let (major, minor) = device.compute_capability().map_err(crate::cuda_run_error)?;
    match major {
        9.. => Ok(PtxArch::Sm90),
        8 => Ok(PtxArch::Sm80),
        _ => Err(cuda_error(format!(
            "device {} ({}) has compute capability {major}.{minor}; kiln's PTX needs 8.0 (sm_80) or newer",
            device.ordinal(),
            device.name()
        ))),
    }
}

/// A device plan and its kernels compiled to PTX.
#[cfg(feature = "ptx")]
#[derive(Clone, Debug)]
pub struct DeviceCode {
    /// The plan (its kernels included).
    pub plan: DevicePlan,
    /// The PTX module of `plan.kernels`.
    pub module: kiln_codegen::ptx::PtxModule,
}

/// The device plan of `lowered`, under its fallback policy: what the plan runs on the host beyond the
/// executable's own fallbacks (the CPU library's routines, control-flow regions) is enforced (denied, warned)
/// like them.
#[cfg(feature = "ptx")]
pub fn device_plan(lowered: &crate::Lowered) -> Result<DevicePlan, Error> {
    let exe = &lowered.executable;
    let plan = kiln_codegen::device::build_plan(exe).map_err(cuda_error)?;
    let more: Vec<_> = plan.fallbacks.iter().filter(|f| !exe.fallbacks.contains(f)).cloned().collect();
    lowered.fallback.enforce(&more)?;
    Ok(plan)
}

/// The device plan of `lowered` ([`device_plan`]) and its PTX.
#[cfg(feature = "ptx")]
pub fn compile_device(lowered: &crate::Lowered, options: &kiln_codegen::ptx::PtxOptions) -> Result<DeviceCode, Error> {
    let plan = device_plan(lowered)?;
    let module = kiln_codegen::ptx::compile(&plan.kernels, options).map_err(cuda_error)?;
    Ok(DeviceCode { plan, module })
}

impl crate::Model {
    /// Runs the model through the CUDA runtime on the emulated device ([`crate::Backend::CudaEmulated`]).
    pub fn run_cuda_emulated(
        &self,
        inputs: &BTreeMap<String, Tensor>,
        run: &crate::RunOptions,
    ) -> Result<Vec<(String, Tensor)>, Error> {
        #[cfg(feature = "ptx")]
        {
            let options = crate::CompileOptions {
                backend: crate::Backend::Cuda,
                pipeline: "cuda-default".into(),
                threads: 1,
                backends: run.backends.clone(),
                fallback: run.fallback,
            };
            run_emulated(&self.lower(&options)?, inputs, kiln_codegen::ptx::DEFAULT_BLOCK_SIZE)
        }
        #[cfg(not(feature = "ptx"))]
        {
            let _ = (inputs, run);
            Err(cuda_error("this kiln was built without the PTX emitter (feature `ptx`), which the emulation needs"))
        }
    }

    /// Compiles the model for CUDA device `ordinal` and binds it there (see the module docs), with `pipeline`
    /// (default `cuda-default`) and the registry and fallback policy of `options`. Without a device, the
    /// device's clear error, before any compilation.
    pub fn compile_cuda(
        &self,
        ordinal: usize,
        pipeline: Option<&str>,
        options: &crate::CompileOptions,
    ) -> Result<crate::Compiled, Error> {
        let device = CudaDevice::open(ordinal).map_err(crate::cuda_run_error)?;
        let backends = &options.backends;
        #[cfg(feature = "ptx")]
        {
            let options = crate::CompileOptions {
                backend: crate::Backend::Cuda,
                pipeline: pipeline.unwrap_or("cuda-default").to_string(),
                threads: 1,
                backends: backends.clone(),
                fallback: options.fallback,
            };
            let lowered = self.lower(&options)?;
            let t = std::time::Instant::now();
            let ptx_options = kiln_codegen::ptx::PtxOptions { arch: arch_for(&device)?, ..Default::default() };
            let code = compile_device(&lowered, &ptx_options)?;
            let crate::Lowered { executable: exe, mut report, .. } = lowered;
            report.codegen = t.elapsed();
            report.kernels = code.plan.kernels.len();
            report.fallbacks = code.plan.fallbacks.clone();
            bind(device, exe, code.plan, &code.module.ptx, code.module.kernels, report, backends)
        }
        #[cfg(not(feature = "ptx"))]
        {
            let _ = (device, pipeline, backends, options);
            Err(cuda_error(
                "this kiln was built without the PTX emitter (feature `ptx`); compile a CUDA artifact with \
                 `kiln compile --target cuda` on a full build and run that",
            ))
        }
    }
}
