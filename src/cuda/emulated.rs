//! A [`Gpu`] on the host: memory from the host allocator, kernels from `codegen::ptx::emulate` (the plan's
//! kernels as the PTX's LLVM IR, compiled for the host, run over the emulated grid the runtime asks for), GEMMs
//! from the CPU library. Operations run as they are queued, so the queue is always drained.

use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use kiln_codegen::device::DevicePlan;
use kiln_codegen::ptx::emulate::{EmulatedModule, Grid, with_emulated};
use kiln_ir::Tensor;
use kiln_runtime::RunError;
use kiln_runtime::cuda::{DevPtr, Gemm, Gpu, GpuProgram};

use crate::{Error, Lowered};

/// Device memory alignment, as `cuMemAlloc` guarantees.
const ALIGN: usize = 256;

/// The most blocks a cooperative kernel's emulated launch uses.
const COOPERATIVE_BLOCKS: u32 = 2;

struct EmulatedGpu<'m, 'ctx> {
    module: &'m EmulatedModule<'ctx>,
    /// Live allocations: address → layout.
    allocations: Mutex<HashMap<u64, Layout>>,
}

// SAFETY: an emulated device lives inside one `run_emulated` call, on its thread; the module's engine is only
// read (function pointers), and allocations are behind a mutex.
unsafe impl Send for EmulatedGpu<'_, '_> {}
// SAFETY: as above.
unsafe impl Sync for EmulatedGpu<'_, '_> {}

impl Drop for EmulatedGpu<'_, '_> {
    fn drop(&mut self) {
        for (p, layout) in self.allocations.get_mut().unwrap_or_else(|e| e.into_inner()).drain() {
            // SAFETY: allocated by `alloc` with this layout and not freed yet.
            unsafe { std::alloc::dealloc(p as *mut u8, layout) };
        }
    }
}

impl Gpu for EmulatedGpu<'_, '_> {
    fn name(&self) -> String {
        "host emulation".into()
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr, RunError> {
        let layout = Layout::from_size_align(bytes.max(1), ALIGN)
            .map_err(|e| RunError::Memory(format!("cannot allocate {bytes} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size. Zeroed, so a kernel bug reads zeros, not stale host memory.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(RunError::Memory(format!("cannot allocate {bytes} bytes")));
        }
        self.allocations.lock().unwrap_or_else(|e| e.into_inner()).insert(p as u64, layout);
        Ok(DevPtr(p as u64))
    }

    unsafe fn free(&self, ptr: DevPtr) {
        if let Some(layout) = self.allocations.lock().unwrap_or_else(|e| e.into_inner()).remove(&ptr.0) {
            // SAFETY: allocated by `alloc` with this layout; removed from the table, so freed once.
            unsafe { std::alloc::dealloc(ptr.0 as *mut u8, layout) };
        }
    }

    unsafe fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<(), RunError> {
        // SAFETY: the caller guarantees `dst` holds `src.len()` bytes; host memory never overlaps a borrowed slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.0 as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<(), RunError> {
        // SAFETY: the caller guarantees `src` holds `dst.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.0 as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), RunError> {
        // SAFETY: the caller guarantees both ranges; `copy` tolerates overlap.
        unsafe { std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, bytes) };
        Ok(())
    }

    unsafe fn zero(&self, dst: DevPtr, bytes: usize) -> Result<(), RunError> {
        // SAFETY: the caller guarantees the range.
        unsafe { std::ptr::write_bytes(dst.0 as *mut u8, 0, bytes) };
        Ok(())
    }

    unsafe fn launch(
        &self,
        kernel: usize,
        blocks: u32,
        threads: u32,
        buffers: &[DevPtr],
        symbols: &[i64],
    ) -> Result<(), RunError> {
        let ptrs: Vec<*mut u8> = buffers.iter().map(|p| p.0 as *mut u8).collect();
        // A cooperative kernel's emulated threads are OS threads, one per GPU thread of a block: its grid is
        // capped (every kernel's loops are grid-stride, so any grid computes the same result, and a smaller one
        // exercises the striding harder).
        let blocks = if self.module.info(kernel).cooperative { blocks.min(COOPERATIVE_BLOCKS) } else { blocks };
        // SAFETY: the caller guarantees the buffers for the symbols' shapes; the runtime's grids are whole warps.
        unsafe { self.module.launch(kernel, &ptrs, symbols, Grid { blocks, threads }) };
        Ok(())
    }

    unsafe fn gemm(&self, g: &Gemm) -> Result<(), RunError> {
        let span = |rows: usize, ld: usize, cols: usize| if rows == 0 { 0 } else { (rows - 1) * ld + cols };
        for i in 0..g.batch {
            // SAFETY: the caller guarantees every matrix of the descriptor lies in valid memory, and that `C`
            // overlaps neither operand.
            let (a, b, c) = unsafe {
                (
                    std::slice::from_raw_parts((g.a.0 as *const f32).add(i * g.stride_a), span(g.m, g.lda, g.k)),
                    std::slice::from_raw_parts((g.b.0 as *const f32).add(i * g.stride_b), span(g.k, g.ldb, g.n)),
                    std::slice::from_raw_parts_mut((g.c.0 as *mut f32).add(i * g.stride_c), span(g.m, g.ldc, g.n)),
                )
            };
            kiln_codegen::library::gemm_f32(g.m, g.n, g.k, a, g.lda, b, g.ldb, c, g.ldc, g.accumulate);
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), RunError> {
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
    let plan = DevicePlan::build(&lowered.executable).map_err(|e| fail(e.to_string()))?;
    let kernels = plan.kernels.clone();
    with_emulated(&kernels, block_size, |module| {
        let infos = (0..kernels.len()).map(|i| module.info(i).clone()).collect();
        let gpu = Arc::new(EmulatedGpu { module, allocations: Mutex::new(HashMap::new()) });
        let program = GpuProgram::new(gpu, lowered.executable.clone(), plan, infos).map_err(crate::cuda_run_error)?;
        program.run(inputs).map_err(crate::cuda_run_error)
    })
    .map_err(|e| fail(e.to_string()))?
}
