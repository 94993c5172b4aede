//! [`CudaGpu`]: the [`Gpu`] of a real device — the CUDA driver API through cudarc (loaded at run time), the PTX
//! module JIT-compiled by the driver, cuBLAS for GEMMs. Each handle owns a stream and a cuBLAS handle bound to it
//! (clones share them; [`Gpu::fork`] makes new ones); the module and the device are shared by all handles.
//! Events are CUDA events without timing; host buffers are pinned (`cuMemHostAlloc`), so device-to-host copies
//! into them are truly asynchronous.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::driver::{CudaStream, result, sys};

use super::CudaDevice;
use super::gpu::{DevPtr, Gemm, Gpu};
use crate::RunError;

/// What every handle on one device shares.
struct Shared {
    device: CudaDevice,
    /// The loaded module; none for a device that launches no kernels (GEMMs only).
    module: Option<sys::CUmodule>,
    functions: Vec<sys::CUfunction>,
}

// SAFETY: the module and function handles are plain driver handles, valid in the context on any thread (every
// call binds the context first); cudarc's own `CudaFunction` is `Send + Sync` for the same reason.
unsafe impl Send for Shared {}
// SAFETY: as above; they are only read.
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(module) = self.module
            && self.device.context().bind_to_thread().is_ok()
            && self.device.context().synchronize().is_ok()
        {
            // SAFETY: loaded by `CudaGpu::new`, unloaded once, with no work left in the context.
            let _ = unsafe { result::module::unload(module) };
        }
    }
}

/// A handle's queue: a stream and a cuBLAS handle issuing onto it.
struct Queue {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
}

/// A handle on a CUDA device: see the module docs.
#[derive(Clone)]
pub struct CudaGpu {
    shared: Arc<Shared>,
    queue: Arc<Queue>,
}

/// A CUDA event (no timing), destroyed when dropped.
pub struct CudaEvent {
    event: sys::CUevent,
    shared: Arc<Shared>,
}

// SAFETY: an event handle is usable from any thread with the context bound.
unsafe impl Send for CudaEvent {}
// SAFETY: as above; recording happens once, at creation.
unsafe impl Sync for CudaEvent {}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if self.shared.device.context().bind_to_thread().is_ok() {
            // SAFETY: created by `record`, destroyed once (the driver defers it until the event completes).
            let _ = unsafe { result::event::destroy(self.event) };
        }
    }
}

/// Pinned host memory, freed when dropped.
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
    shared: Arc<Shared>,
}

// SAFETY: the buffer owns its allocation exclusively, like a `Vec<u8>`.
unsafe impl Send for PinnedBuffer {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for PinnedBuffer {}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.shared.device.context().bind_to_thread().is_ok() {
            // SAFETY: allocated by `alloc_host`, freed once; its owner guarantees no copy into it is pending.
            let _ = unsafe { result::free_host(self.ptr as *mut c_void) };
        }
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> RunError {
    RunError::Backend(format!("cuda: {what}: {e}"))
}

impl Queue {
    fn new(device: &CudaDevice) -> Result<Queue, RunError> {
        let stream = device.context().new_stream().map_err(|e| failed("creating a stream", e))?;
        let blas = CudaBlas::new(Arc::clone(&stream)).map_err(|e| failed("creating a cuBLAS handle", e))?;
        Ok(Queue { stream, blas })
    }
}

impl CudaGpu {
    /// Opens `device`, creates its stream and cuBLAS handle, and loads `ptx`, resolving `entries` (in kernel
    /// order; none: no module is loaded). A module the driver cannot JIT-compile (for an architecture above the
    /// device's, say) is a clear error naming it.
    pub fn new(device: CudaDevice, ptx: &str, entries: &[String]) -> Result<CudaGpu, RunError> {
        device.context().bind_to_thread().map_err(|e| failed("binding the context", e))?;
        // cudarc panics on a call into a library it cannot load: ask first.
        // SAFETY: probing only tries to load the library; it calls nothing in it.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(RunError::NoDevice {
                backend: "cuda".into(),
                reason: "cuBLAS (libcublas.so, or libcublas.so.12) was not found: install CUDA's cuBLAS or put its \
                         folder on LD_LIBRARY_PATH"
                    .into(),
            });
        }
        let queue = Queue::new(&device)?;
        let (module, functions) = if entries.is_empty() {
            (None, Vec::new())
        } else {
            let text = CString::new(ptx).map_err(|_| failed("loading the PTX module", "it contains a NUL byte"))?;
            // SAFETY: `text` is a NUL-terminated PTX image that outlives the call.
            let module =
                unsafe { result::module::load_data(text.as_ptr() as *const c_void) }.map_err(|e| RunError::Load {
                    path: "kernels.ptx".into(),
                    message: format!("the driver refused the PTX module: {e}"),
                })?;
            let mut functions = Vec::with_capacity(entries.len());
            for entry in entries {
                let name = CString::new(entry.as_str()).map_err(|_| failed("an entry name", entry))?;
                // SAFETY: `module` is loaded in this context.
                match unsafe { result::module::get_function(module, name) } {
                    Ok(f) => functions.push(f),
                    Err(e) => {
                        // SAFETY: loaded above, unloaded once; nothing uses it yet.
                        let _ = unsafe { result::module::unload(module) };
                        return Err(failed(&format!("finding entry `{entry}`"), e));
                    }
                }
            }
            (Some(module), functions)
        };
        Ok(CudaGpu { shared: Arc::new(Shared { device, module, functions }), queue: Arc::new(queue) })
    }

    /// The device.
    pub fn device(&self) -> &CudaDevice {
        &self.shared.device
    }

    fn bind(&self) -> Result<(), RunError> {
        self.shared.device.context().bind_to_thread().map_err(|e| failed("binding the context", e))
    }

    fn stream(&self) -> sys::CUstream {
        self.queue.stream.cu_stream()
    }

    /// The handle's stream, for libraries that queue on it (NCCL).
    pub(crate) fn raw_stream(&self) -> *mut c_void {
        self.stream() as *mut c_void
    }
}

impl Gpu for CudaGpu {
    type Event = CudaEvent;
    type HostBuffer = PinnedBuffer;

    fn name(&self) -> String {
        self.shared.device.name().to_string()
    }

    fn fork(&self) -> Result<CudaGpu, RunError> {
        self.bind()?;
        Ok(CudaGpu { shared: Arc::clone(&self.shared), queue: Arc::new(Queue::new(&self.shared.device)?) })
    }

    fn record(&self) -> Result<CudaEvent, RunError> {
        self.bind()?;
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(|e| failed("creating an event", e))?;
        let event = CudaEvent { event, shared: Arc::clone(&self.shared) };
        // SAFETY: both handles are live in the bound context.
        unsafe { result::event::record(event.event, self.stream()) }.map_err(|e| failed("recording an event", e))?;
        Ok(event)
    }

    fn wait_for(&self, event: &CudaEvent) -> Result<(), RunError> {
        self.bind()?;
        // SAFETY: both handles are live in the bound context.
        unsafe {
            result::stream::wait_event(self.stream(), event.event, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        }
        .map_err(|e| failed("ordering a stream after an event", e))
    }

    fn event_done(&self, event: &CudaEvent) -> Result<bool, RunError> {
        self.bind()?;
        // SAFETY: a live event in the bound context.
        match unsafe { sys::cuEventQuery(event.event) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(failed("querying an event", format!("{e:?}"))),
        }
    }

    fn event_wait(&self, event: &CudaEvent) -> Result<(), RunError> {
        self.bind()?;
        // SAFETY: a live event in the bound context.
        unsafe { sys::cuEventSynchronize(event.event) }.result().map_err(|e| failed("waiting for an event", e))
    }

    fn alloc_host(&self, bytes: usize) -> Result<PinnedBuffer, RunError> {
        self.bind()?;
        // SAFETY: a plain pinned allocation in the bound context.
        let ptr = unsafe { result::malloc_host(bytes.max(1), 0) }
            .map_err(|e| RunError::Memory(format!("cuda: cannot pin {bytes} bytes of host memory: {e}")))?;
        Ok(PinnedBuffer { ptr: ptr as *mut u8, len: bytes, shared: Arc::clone(&self.shared) })
    }

    fn host_bytes<'b>(&self, buffer: &'b PinnedBuffer) -> &'b [u8] {
        // SAFETY: the allocation holds `len` bytes; the caller reads it only after its download completed.
        unsafe { std::slice::from_raw_parts(buffer.ptr, buffer.len) }
    }

    unsafe fn download_async(&self, src: DevPtr, dst: &mut PinnedBuffer, bytes: usize) -> Result<(), RunError> {
        if bytes > dst.len {
            return Err(failed("copying from the device", format!("{bytes} bytes into a {}-byte buffer", dst.len)));
        }
        self.bind()?;
        // SAFETY: the caller guarantees `src` and keeps `dst` alive and unread until the copy completes.
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst.ptr as *mut c_void, src.0, bytes, self.stream()) }
            .result()
            .map_err(|e| failed("copying from the device", e))
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr, RunError> {
        self.bind()?;
        // SAFETY: a plain allocation in the bound context.
        let p = unsafe { result::malloc_sync(bytes.max(crate::cuda::MIN_ALLOCATION)) }
            .map_err(|e| RunError::Memory(format!("cuda: cannot allocate {bytes} bytes on the device: {e}")))?;
        Ok(DevPtr(p))
    }

    unsafe fn free(&self, ptr: DevPtr) {
        if self.bind().is_ok() {
            // SAFETY: the caller guarantees `ptr` is a live allocation no queued work uses.
            let _ = unsafe { result::free_sync(ptr.0) };
        }
    }

    unsafe fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<(), RunError> {
        self.bind()?;
        // SAFETY: the caller guarantees `dst` holds `src.len()` bytes. From pageable memory the driver stages the
        // bytes before returning, so `src` may be reused at once.
        unsafe { result::memcpy_htod_async(dst.0, src, self.stream()) }.map_err(|e| failed("copying to the device", e))
    }

    unsafe fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<(), RunError> {
        self.bind()?;
        // SAFETY: the caller guarantees `src` holds `dst.len()` bytes; the wait below completes the copy.
        unsafe { result::memcpy_dtoh_async(dst, src.0, self.stream()) }
            .map_err(|e| failed("copying from the device", e))?;
        self.synchronize()
    }

    unsafe fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), RunError> {
        self.bind()?;
        // SAFETY: the caller guarantees both ranges.
        unsafe { result::memcpy_dtod_async(dst.0, src.0, bytes, self.stream()) }
            .map_err(|e| failed("copying on the device", e))
    }

    unsafe fn zero(&self, dst: DevPtr, bytes: usize) -> Result<(), RunError> {
        self.bind()?;
        // SAFETY: the caller guarantees the range.
        unsafe { result::memset_d8_async(dst.0, 0, bytes, self.stream()) }
            .map_err(|e| failed("clearing device memory", e))
    }

    unsafe fn launch(
        &self,
        kernel: usize,
        blocks: u32,
        threads: u32,
        buffers: &[DevPtr],
        symbols: &[i64],
    ) -> Result<(), RunError> {
        let f = *self.shared.functions.get(kernel).ok_or_else(|| failed("launch", format!("no kernel {kernel}")))?;
        self.bind()?;
        // Every parameter is 8 bytes: a global pointer or an i64 symbol.
        let mut values: Vec<u64> = buffers.iter().map(|p| p.0).chain(symbols.iter().map(|&s| s as u64)).collect();
        let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
        // SAFETY: the entry takes exactly these parameters (the manifest's parameter list), the caller guarantees
        // the buffers, and `values` outlives the call (the driver copies parameters at launch).
        unsafe { result::launch_kernel(f, (blocks, 1, 1), (threads, 1, 1), 0, self.stream(), &mut params) }
            .map_err(|e| failed(&format!("launching kernel {kernel}"), e))
    }

    unsafe fn gemm(&self, g: &Gemm) -> Result<(), RunError> {
        self.bind()?;
        let int = |v: usize, what: &str| {
            i32::try_from(v).map_err(|_| failed("gemm", format!("{what} = {v} exceeds cuBLAS's 32-bit sizes")))
        };
        let (alpha, beta) = (1.0f32, if g.accumulate { 1.0f32 } else { 0.0 });
        // cuBLAS is column-major: the row-major C = A·B is the column-major Cᵀ = Bᵀ·Aᵀ, with the same buffers.
        // SAFETY: the caller guarantees the matrices; alpha and beta are host scalars living through the call.
        unsafe {
            cudarc::cublas::result::sgemm_strided_batched(
                *self.queue.blas.handle(),
                cublasOperation_t::CUBLAS_OP_N,
                cublasOperation_t::CUBLAS_OP_N,
                int(g.n, "n")?,
                int(g.m, "m")?,
                int(g.k, "k")?,
                &alpha,
                g.b.0 as *const f32,
                int(g.ldb, "ldb")?,
                g.stride_b as i64,
                g.a.0 as *const f32,
                int(g.lda, "lda")?,
                g.stride_a as i64,
                &beta,
                g.c.0 as *mut f32,
                int(g.ldc, "ldc")?,
                g.stride_c as i64,
                int(g.batch, "batch")?,
            )
        }
        .map_err(|e| failed("cuBLAS sgemm", e))
    }

    fn synchronize(&self) -> Result<(), RunError> {
        self.bind()?;
        self.queue.stream.synchronize().map_err(|e| failed("waiting for the stream", e))
    }
}
