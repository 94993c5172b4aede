//! [`HostGpu`]: a [`Gpu`] whose memory is host memory, whose GEMM is the CPU library's, and whose kernels are
//! whatever [`HostKernels`] runs — the root crate's PTX emulation (the plan's kernels as the PTX's LLVM IR
//! compiled for the host), or [`NoKernels`] for work that launches none. Operations run as they are queued, so
//! the queue is always drained. It stands in for a device in tests and on machines without one.

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::gpu::{DevPtr, Gemm, Gpu};
use crate::RunError;

/// Device memory alignment, as `cuMemAlloc` guarantees.
const ALIGN: usize = 256;

/// How a [`HostGpu`] runs kernels.
pub trait HostKernels: Send + Sync {
    /// Runs kernel `kernel` over `blocks × threads` emulated threads.
    ///
    /// # Safety
    /// As [`Gpu::launch`]: every buffer is valid for the shape the symbols give it.
    unsafe fn launch(
        &self,
        kernel: usize,
        blocks: u32,
        threads: u32,
        buffers: &[*mut u8],
        symbols: &[i64],
    ) -> Result<(), RunError>;
}

/// No kernels: a launch is an error (for programs of library steps only).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoKernels;

impl HostKernels for NoKernels {
    unsafe fn launch(&self, kernel: usize, _: u32, _: u32, _: &[*mut u8], _: &[i64]) -> Result<(), RunError> {
        Err(RunError::Backend(format!("host device: no kernel {kernel} is loaded")))
    }
}

/// A device on the host. See the module docs. Clones and forks share everything: operations run as they are
/// queued, so every queue is always drained and every event complete.
pub struct HostGpu<K: HostKernels> {
    shared: Arc<Shared<K>>,
}

impl<K: HostKernels> Clone for HostGpu<K> {
    fn clone(&self) -> Self {
        HostGpu { shared: Arc::clone(&self.shared) }
    }
}

struct Shared<K> {
    kernels: K,
    /// Live allocations: address → layout.
    allocations: Mutex<HashMap<u64, Layout>>,
}

impl<K: HostKernels> HostGpu<K> {
    /// A host device running `kernels`.
    pub fn new(kernels: K) -> HostGpu<K> {
        HostGpu { shared: Arc::new(Shared { kernels, allocations: Mutex::new(HashMap::new()) }) }
    }

    /// Bytes allocated on the device and not freed yet (for leak checks).
    pub fn allocated_bytes(&self) -> usize {
        self.shared.allocations.lock().unwrap_or_else(|e| e.into_inner()).values().map(Layout::size).sum()
    }
}

impl<K> Drop for Shared<K> {
    fn drop(&mut self) {
        for (p, layout) in self.allocations.get_mut().unwrap_or_else(|e| e.into_inner()).drain() {
            // SAFETY: allocated by `alloc` with this layout and not freed yet.
            unsafe { std::alloc::dealloc(p as *mut u8, layout) };
        }
    }
}

impl<K: HostKernels> Gpu for HostGpu<K> {
    type Event = ();
    type HostBuffer = Vec<u8>;

    fn name(&self) -> String {
        "host emulation".into()
    }

    fn fork(&self) -> Result<Self, RunError> {
        Ok(self.clone())
    }

    fn record(&self) -> Result<(), RunError> {
        Ok(())
    }

    fn wait_for(&self, _: &()) -> Result<(), RunError> {
        Ok(())
    }

    fn event_done(&self, _: &()) -> Result<bool, RunError> {
        Ok(true)
    }

    fn event_wait(&self, _: &()) -> Result<(), RunError> {
        Ok(())
    }

    fn alloc_host(&self, bytes: usize) -> Result<Vec<u8>, RunError> {
        Ok(vec![0; bytes])
    }

    fn host_bytes<'b>(&self, buffer: &'b Vec<u8>) -> &'b [u8] {
        buffer
    }

    unsafe fn download_async(&self, src: DevPtr, dst: &mut Vec<u8>, bytes: usize) -> Result<(), RunError> {
        // SAFETY: the caller guarantees `src` holds `bytes` bytes and `dst` at least as many.
        unsafe { self.download(src, &mut dst[..bytes]) }
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr, RunError> {
        let layout = Layout::from_size_align(bytes.max(crate::cuda::MIN_ALLOCATION), ALIGN)
            .map_err(|e| RunError::Memory(format!("cannot allocate {bytes} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size. Zeroed, so a kernel bug reads zeros, not stale host memory.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(RunError::Memory(format!("cannot allocate {bytes} bytes")));
        }
        self.shared.allocations.lock().unwrap_or_else(|e| e.into_inner()).insert(p as u64, layout);
        Ok(DevPtr(p as u64))
    }

    unsafe fn free(&self, ptr: DevPtr) {
        if let Some(layout) = self.shared.allocations.lock().unwrap_or_else(|e| e.into_inner()).remove(&ptr.0) {
            // SAFETY: allocated by `alloc` with this layout; removed from the table, so freed once.
            unsafe { std::alloc::dealloc(ptr.0 as *mut u8, layout) };
        }
    }

    unsafe fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<(), RunError> {
        // SAFETY: the caller guarantees `dst` holds `src.len()` bytes; device memory never overlaps a borrowed
        // slice.
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
        // SAFETY: the caller guarantees the buffers for the symbols' shapes.
        unsafe { self.shared.kernels.launch(kernel, blocks, threads, &ptrs, symbols) }
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
            crate::library::gemm_f32(g.m, g.n, g.k, a, g.lda, b, g.ldb, c, g.ldc, g.accumulate);
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), RunError> {
        Ok(())
    }
}
