//! The device a [`super::GpuProgram`] runs on, as a trait: memory, copies, kernel launches and GEMMs, all ordered
//! on one queue (a CUDA stream). [`super::driver::CudaGpu`] implements it with the CUDA driver and cuBLAS; the
//! root crate's host emulation implements it with host memory, the emulated PTX kernels and a host GEMM, so
//! everything above this trait — buffer placement, launch geometry, symbol binding, the GEMM layouts of matmul
//! and conv — is tested without a GPU.

use crate::RunError;

/// A device address (`CUdeviceptr`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevPtr(pub u64);

impl DevPtr {
    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevPtr {
        DevPtr(self.0 + bytes as u64)
    }
}

/// A row-major, strided, batched f32 GEMM: for `i` in `0..batch`, `C_i = A_i · B_i` (or `C_i += A_i · B_i` with
/// `accumulate`), where `A_i` is `m × k` at `a + i·stride_a` with rows `lda` apart (elements), `B_i` is `k × n`
/// at `b + i·stride_b`, `C_i` is `m × n` at `c + i·stride_c`. A stride of 0 broadcasts one matrix.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Gemm {
    /// Rows of `A` and `C`.
    pub m: usize,
    /// Columns of `B` and `C`.
    pub n: usize,
    /// The contraction.
    pub k: usize,
    /// `A`.
    pub a: DevPtr,
    /// `A`'s row stride (elements).
    pub lda: usize,
    /// Elements between consecutive `A_i`.
    pub stride_a: usize,
    /// `B`.
    pub b: DevPtr,
    /// `B`'s row stride.
    pub ldb: usize,
    /// Elements between consecutive `B_i`.
    pub stride_b: usize,
    /// `C`.
    pub c: DevPtr,
    /// `C`'s row stride.
    pub ldc: usize,
    /// Elements between consecutive `C_i`.
    pub stride_c: usize,
    /// How many products.
    pub batch: usize,
    /// Add to `C` instead of overwriting it.
    pub accumulate: bool,
}

/// A handle on a device — its memory, its loaded module, its GEMM library — with a queue of its own (a CUDA
/// stream). Every operation is queued in call order; [`Gpu::download`] and [`Gpu::synchronize`] wait for what was
/// queued before them. Clones share the queue; [`Gpu::fork`] makes a handle with a new one.
pub trait Gpu: Clone + Send + Sync {
    /// A marker in a queue (a CUDA event): complete once everything queued before it is.
    type Event: Send + Sync;
    /// Host memory the device copies into without the host waiting (pinned memory on a real device).
    type HostBuffer: Send + Sync;

    /// The device's name, for reports.
    fn name(&self) -> String;

    /// Another handle on the same device (memory, module and weights shared) with a new queue.
    fn fork(&self) -> Result<Self, RunError>;

    /// Marks the end of what is queued so far.
    fn record(&self) -> Result<Self::Event, RunError>;

    /// Makes this queue wait for `event` (of any handle on the device) before running what is queued next; the
    /// host does not wait.
    fn wait_for(&self, event: &Self::Event) -> Result<(), RunError>;

    /// Whether everything before `event` has run.
    fn event_done(&self, event: &Self::Event) -> Result<bool, RunError>;

    /// Waits on the host until everything before `event` has run.
    fn event_wait(&self, event: &Self::Event) -> Result<(), RunError>;

    /// Host memory of `bytes` bytes for [`Gpu::download_async`].
    fn alloc_host(&self, bytes: usize) -> Result<Self::HostBuffer, RunError>;

    /// The bytes of a host buffer (read them only once the download into it has completed).
    fn host_bytes<'b>(&self, buffer: &'b Self::HostBuffer) -> &'b [u8];

    /// Queues a copy of `bytes` device bytes from `src` into `dst`; the host does not wait.
    ///
    /// # Safety
    /// `src` is valid for `bytes` bytes, `dst` holds at least `bytes`, and `dst` is neither read nor dropped
    /// before an event recorded after this call has completed.
    unsafe fn download_async(&self, src: DevPtr, dst: &mut Self::HostBuffer, bytes: usize) -> Result<(), RunError>;

    /// Allocates `bytes` (at least 1) of device memory, 256-byte aligned.
    fn alloc(&self, bytes: usize) -> Result<DevPtr, RunError>;

    /// Frees an allocation.
    ///
    /// # Safety
    /// `ptr` came from [`Gpu::alloc`] of this device, is not freed yet, and no queued work still uses it.
    unsafe fn free(&self, ptr: DevPtr);

    /// Queues a copy of host bytes to `dst` (the host slice may be reused once this returns).
    ///
    /// # Safety
    /// `dst` is valid for `src.len()` bytes.
    unsafe fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<(), RunError>;

    /// Waits for the queued work, then copies device bytes from `src` into `dst`.
    ///
    /// # Safety
    /// `src` is valid for `dst.len()` bytes.
    unsafe fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<(), RunError>;

    /// Copies `bytes` from `src` to `dst` on the device.
    ///
    /// # Safety
    /// Both are valid for `bytes` bytes.
    unsafe fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), RunError>;

    /// Sets `bytes` at `dst` to zero.
    ///
    /// # Safety
    /// `dst` is valid for `bytes` bytes.
    unsafe fn zero(&self, dst: DevPtr, bytes: usize) -> Result<(), RunError>;

    /// Launches kernel `kernel` of the loaded module on `blocks × threads` threads with one pointer per launch
    /// buffer and one value per kernel symbol.
    ///
    /// # Safety
    /// Every buffer is valid for the shape the symbols give it (read for inputs, written for outputs).
    unsafe fn launch(
        &self,
        kernel: usize,
        blocks: u32,
        threads: u32,
        buffers: &[DevPtr],
        symbols: &[i64],
    ) -> Result<(), RunError>;

    /// Queues a GEMM.
    ///
    /// # Safety
    /// Every matrix the descriptor names lies in valid device memory; `C` overlaps neither `A` nor `B`.
    unsafe fn gemm(&self, g: &Gemm) -> Result<(), RunError>;

    /// Waits for all queued work.
    fn synchronize(&self) -> Result<(), RunError>;
}

/// An allocation freed when dropped (after waiting for the queue, so no queued work still uses it).
pub struct DeviceBuffer<'g, G: Gpu> {
    gpu: &'g G,
    ptr: DevPtr,
}

impl<'g, G: Gpu> DeviceBuffer<'g, G> {
    /// Allocates `bytes` on `gpu`.
    pub fn new(gpu: &'g G, bytes: usize) -> Result<DeviceBuffer<'g, G>, RunError> {
        Ok(DeviceBuffer { gpu, ptr: gpu.alloc(bytes.max(1))? })
    }

    /// Its address.
    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }
}

impl<G: Gpu> Drop for DeviceBuffer<'_, G> {
    fn drop(&mut self) {
        // A failing device cannot be helped here; freeing after a failed wait would risk use after free, so the
        // allocation is leaked instead.
        if self.gpu.synchronize().is_ok() {
            // SAFETY: allocated by `new` on this device, freed once, and the queue is drained.
            unsafe { self.gpu.free(self.ptr) };
        }
    }
}
