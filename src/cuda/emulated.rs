//! The emulated device: a [`HostGpu`] whose kernels are the plan's, from `codegen::ptx::emulate` (the PTX's
//! LLVM IR compiled for the host, run over the emulated grid the runtime asks for).

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_codegen::ptx::emulate::{EmulatedModule, Grid, with_emulated};
use kiln_ir::Tensor;
use kiln_runtime::RunError;
use kiln_runtime::cuda::{GpuProgram, HostGpu, HostKernels};

use crate::{Error, Lowered};

/// The most blocks a cooperative kernel's emulated launch uses.
const COOPERATIVE_BLOCKS: u32 = 2;

struct EmulatedKernels<'m, 'ctx>(&'m EmulatedModule<'ctx>);

// SAFETY: an emulated device lives inside one `run_emulated` call, on its thread; the module's engine is only
// read (the kernels' function pointers).
unsafe impl Send for EmulatedKernels<'_, '_> {}
// SAFETY: as above.
unsafe impl Sync for EmulatedKernels<'_, '_> {}

impl HostKernels for EmulatedKernels<'_, '_> {
    unsafe fn launch(
        &self,
        kernel: usize,
        blocks: u32,
        threads: u32,
        buffers: &[*mut u8],
        symbols: &[i64],
    ) -> Result<(), RunError> {
        // A cooperative kernel's emulated threads are OS threads, one per GPU thread of a block: its grid is
        // capped (every kernel's loops are grid-stride, so any grid computes the same result, and a smaller one
        // exercises the striding harder).
        let blocks = if self.0.info(kernel).cooperative { blocks.min(COOPERATIVE_BLOCKS) } else { blocks };
        // SAFETY: the caller guarantees the buffers for the symbols' shapes; the runtime's grids are whole warps.
        unsafe { self.0.launch(kernel, buffers, symbols, Grid { blocks, threads }) };
        Ok(())
    }
}

/// Runs `lowered` on `inputs` through the CUDA runtime on the emulated device, with `block_size` threads per
/// block (see the module docs).
pub fn run_emulated(
    lowered: &Lowered,
    inputs: &BTreeMap<String, Tensor>,
    block_size: u32,
) -> Result<Vec<(String, Tensor)>, Error> {
    let fail = |message: String| Error::Backend { backend: "cuda", message };
    let plan = super::device_plan(lowered)?;
    let kernels = plan.kernels.clone();
    with_emulated(&kernels, block_size, |module| {
        let infos = (0..kernels.len()).map(|i| module.info(i).clone()).collect();
        let gpu = Arc::new(HostGpu::new(EmulatedKernels(module)));
        let program = GpuProgram::with_backends(gpu, lowered.executable.clone(), plan, infos, &lowered.backends)
            .map_err(crate::cuda_run_error)?;
        program.run(inputs).map_err(crate::cuda_run_error)
    })
    .map_err(|e| fail(e.to_string()))?
}
