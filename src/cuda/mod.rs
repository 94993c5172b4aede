//! The CUDA backend from the facade: a model (or a CUDA artifact) bound to a device and run there.
//!
//! [`Model::compile_cuda`] lowers the model (`cuda-default` pipeline, the target-independent executable), turns
//! it into a [`DevicePlan`] (library ops as GEMMs and builtin kernels), compiles the plan's kernels to PTX for the
//! device's architecture, and binds it all to the device: a [`CudaCompiled`]. A CUDA artifact
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
use std::sync::Arc;

use kiln_codegen::device::{DevicePlan, PtxKernelInfo};
use kiln_codegen::exec::Executable;
use kiln_ir::Tensor;
use kiln_runtime::cuda::{CudaDevice, CudaGpu, GpuCompletion, GpuExecutor, GpuProgram, PendingRun};

#[cfg(feature = "ptx")]
pub use emulated::run_emulated;

use crate::{CompileReport, Error};

fn cuda_error(message: impl std::fmt::Display) -> Error {
    Error::Backend { backend: "cuda", message: message.to_string() }
}

/// A model bound to a CUDA device, ready to run.
pub struct CudaCompiled {
    program: GpuProgram<CudaGpu>,
    inputs: Vec<(String, kiln_ir::TensorType)>,
    report: CompileReport,
}

impl std::fmt::Debug for CudaCompiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaCompiled({:?})", self.program)
    }
}

impl CudaCompiled {
    /// Binds `exe` (with its weights) and `plan` to device `device`, loading `ptx` whose kernels `infos`
    /// describe.
    pub(crate) fn bind(
        device: CudaDevice,
        exe: Executable,
        plan: DevicePlan,
        ptx: &str,
        infos: Vec<PtxKernelInfo>,
        report: CompileReport,
        backends: &crate::BackendRegistry,
    ) -> Result<CudaCompiled, Error> {
        let entries: Vec<String> = infos.iter().map(|i| i.entry.clone()).collect();
        let gpu = CudaGpu::new(device, ptx, &entries).map_err(crate::cuda_run_error)?;
        let inputs = exe.inputs.iter().map(|(n, b)| (n.clone(), exe.buffers[b.0 as usize].ty.clone())).collect();
        let program =
            GpuProgram::with_backends(Arc::new(gpu), exe, plan, infos, backends).map_err(crate::cuda_run_error)?;
        Ok(CudaCompiled { program, inputs, report })
    }

    /// Wraps a program the runtime bound (a loaded artifact's).
    pub(crate) fn from_program(program: GpuProgram<CudaGpu>, report: CompileReport) -> CudaCompiled {
        let exe = program.executable();
        let inputs = exe.inputs.iter().map(|(n, b)| (n.clone(), exe.buffers[b.0 as usize].ty.clone())).collect();
        CudaCompiled { program, inputs, report }
    }

    /// Runs the model on named inputs; outputs come in the model's order.
    pub fn run(&self, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, Error> {
        self.program.run(inputs).map_err(crate::cuda_run_error)
    }

    /// `count` executors: streams of their own on the model's device (the contract's submission lanes).
    pub fn executors(&self, count: usize) -> Result<Vec<GpuExecutor<CudaGpu>>, Error> {
        use kiln_runtime::contract::SubmissionBackend;
        let root = GpuExecutor::new("cuda0", self.program.gpu().as_ref().clone());
        kiln_runtime::cuda::GpuBackend::fork_executors(&root, count).map_err(crate::cuda_run_error)
    }

    /// Queues a run on `executor`'s stream and returns at once; the request's completion is an event after its
    /// last copy (order other executors after it with `GpuBackend::order_after`).
    pub fn submit(
        &self,
        executor: &GpuExecutor<CudaGpu>,
        inputs: &BTreeMap<String, Tensor>,
    ) -> Result<CudaRequest, Error> {
        let pending = self.program.enqueue(executor.gpu(), inputs).map_err(crate::cuda_run_error)?;
        let completion = executor.mark().map_err(crate::cuda_run_error)?;
        Ok(CudaRequest { pending, completion })
    }

    /// The steps' own time on the device, inputs resident and outputs left there: `runs` timings after `warmup`
    /// untimed runs (see `GpuProgram::time_resident`).
    pub fn time_resident(
        &self,
        inputs: &BTreeMap<String, Tensor>,
        warmup: usize,
        runs: usize,
    ) -> Result<Vec<std::time::Duration>, Error> {
        self.program.time_resident(inputs, warmup, runs).map_err(crate::cuda_run_error)
    }

    /// The device's copy bandwidth in GB/s (bytes read plus bytes written per second, device to device, over
    /// 256 MiB copies): what a memory-bound kernel is measured against.
    pub fn copy_bandwidth_gbps(&self) -> Result<f64, Error> {
        self.program.copy_bandwidth_gbps(256 << 20, 10).map_err(crate::cuda_run_error)
    }

    /// The device's name.
    pub fn device_name(&self) -> String {
        kiln_runtime::cuda::Gpu::name(self.program.gpu().as_ref())
    }

    pub(crate) fn set_load_time(&mut self, load: std::time::Duration) {
        self.report.load = load;
    }

    /// What compiling (or loading) produced.
    pub fn report(&self) -> &CompileReport {
        &self.report
    }

    /// The model's inputs, names and declared types, in order.
    pub fn inputs(&self) -> &[(String, kiln_ir::TensorType)] {
        &self.inputs
    }

    /// `given` plus random values for the inputs it lacks (as [`crate::Model::complete_inputs`]).
    pub fn complete_inputs(
        &self,
        given: BTreeMap<String, Tensor>,
        shapes: &BTreeMap<String, Vec<usize>>,
        seed: u64,
    ) -> Result<BTreeMap<String, Tensor>, Error> {
        crate::complete_inputs(&self.inputs, given, shapes, seed)
    }
}

/// A run submitted with [`CudaCompiled::submit`].
pub struct CudaRequest {
    pending: PendingRun<CudaGpu>,
    completion: GpuCompletion<CudaGpu>,
}

impl CudaRequest {
    /// The run's completion: poll it, or order another executor after it.
    pub fn completion(&self) -> &GpuCompletion<CudaGpu> {
        &self.completion
    }

    /// Waits for the run; its outputs in the model's order.
    pub fn wait(self) -> Result<Vec<(String, Tensor)>, Error> {
        self.pending.wait().map_err(crate::cuda_run_error)
    }
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

/// The device plan of `exe` and its PTX.
#[cfg(feature = "ptx")]
pub fn compile_device(exe: &Executable, options: &kiln_codegen::ptx::PtxOptions) -> Result<DeviceCode, Error> {
    let plan = kiln_codegen::device::build_plan(exe).map_err(cuda_error)?;
    let module = kiln_codegen::ptx::compile(&plan.kernels, options).map_err(cuda_error)?;
    Ok(DeviceCode { plan, module })
}

impl crate::Model {
    /// Runs the model through the CUDA runtime on the emulated device ([`crate::Backend::CudaEmulated`]).
    pub fn run_cuda_emulated(
        &self,
        inputs: &BTreeMap<String, Tensor>,
        backends: &crate::BackendRegistry,
    ) -> Result<Vec<(String, Tensor)>, Error> {
        #[cfg(feature = "ptx")]
        {
            let options = crate::CompileOptions {
                backend: crate::Backend::Cuda,
                pipeline: "cuda-default".into(),
                threads: 1,
                backends: backends.clone(),
            };
            run_emulated(&self.lower(&options)?, inputs, kiln_codegen::ptx::DEFAULT_BLOCK_SIZE)
        }
        #[cfg(not(feature = "ptx"))]
        {
            let _ = (inputs, backends);
            Err(cuda_error("this kiln was built without the PTX emitter (feature `ptx`), which the emulation needs"))
        }
    }

    /// Compiles the model for CUDA device `ordinal` and binds it there (see the module docs). Without a device,
    /// the device's clear error, before any compilation.
    pub fn compile_cuda(
        &self,
        ordinal: usize,
        pipeline: Option<&str>,
        backends: &crate::BackendRegistry,
    ) -> Result<CudaCompiled, Error> {
        let device = CudaDevice::open(ordinal).map_err(crate::cuda_run_error)?;
        #[cfg(feature = "ptx")]
        {
            let options = crate::CompileOptions {
                backend: crate::Backend::Cuda,
                pipeline: pipeline.unwrap_or("cuda-default").to_string(),
                threads: 1,
                backends: backends.clone(),
            };
            let crate::Lowered { executable: exe, mut report, .. } = self.lower(&options)?;
            let t = std::time::Instant::now();
            let ptx_options = kiln_codegen::ptx::PtxOptions { arch: arch_for(&device)?, ..Default::default() };
            let code = compile_device(&exe, &ptx_options)?;
            report.codegen = t.elapsed();
            report.kernels = code.plan.kernels.len();
            CudaCompiled::bind(device, exe, code.plan, &code.module.ptx, code.module.kernels, report, backends)
        }
        #[cfg(not(feature = "ptx"))]
        {
            let _ = (device, pipeline, backends);
            Err(cuda_error(
                "this kiln was built without the PTX emitter (feature `ptx`); compile a CUDA artifact with \
                 `kiln compile --target cuda` on a full build and run that",
            ))
        }
    }
}
