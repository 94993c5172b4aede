//! [`CudaGpu`]: the [`Gpu`] of a real device — the CUDA driver API through cudarc (loaded at run time), one
//! stream, the PTX module JIT-compiled by the driver, and cuBLAS for GEMMs.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::driver::{CudaStream, result, sys};

use super::CudaDevice;
use super::gpu::{DevPtr, Gemm, Gpu};
use crate::RunError;

/// A device with a loaded module: see the module docs.
pub struct CudaGpu {
    device: CudaDevice,
    stream: Arc<CudaStream>,
    /// The loaded module; none for a device that launches no kernels (GEMMs only).
    module: Option<sys::CUmodule>,
    functions: Vec<sys::CUfunction>,
    blas: CudaBlas,
}

// SAFETY: the module and function handles are plain driver handles, valid in the context on any thread (every
// call binds the context first); cudarc's own `CudaFunction` is `Send + Sync` for the same reason.
unsafe impl Send for CudaGpu {}
// SAFETY: as above; the stream orders the work callers queue from any thread.
unsafe impl Sync for CudaGpu {}

fn failed(what: &str, e: impl std::fmt::Display) -> RunError {
    RunError::Backend(format!("cuda: {what}: {e}"))
}

impl CudaGpu {
    /// Opens `device`, creates its stream and cuBLAS handle, and loads `ptx`, resolving `entries` (in kernel
    /// order; none: no module is loaded). A module the driver cannot JIT-compile (for an architecture above the
    /// device's, say) is a clear error naming it.
    pub fn new(device: CudaDevice, ptx: &str, entries: &[String]) -> Result<CudaGpu, RunError> {
        let ctx = Arc::clone(device.context());
        ctx.bind_to_thread().map_err(|e| failed("binding the context", e))?;
        let stream = ctx.new_stream().map_err(|e| failed("creating a stream", e))?;
        let blas = CudaBlas::new(Arc::clone(&stream)).map_err(|e| failed("creating the cuBLAS handle", e))?;
        if entries.is_empty() {
            return Ok(CudaGpu { device, stream, module: None, functions: Vec::new(), blas });
        }
        let text = CString::new(ptx).map_err(|_| failed("loading the PTX module", "it contains a NUL byte"))?;
        // SAFETY: `text` is a NUL-terminated PTX image that outlives the call.
        let module = unsafe { result::module::load_data(text.as_ptr() as *const c_void) }.map_err(|e| {
            RunError::Load { path: "kernels.ptx".into(), message: format!("the driver refused the PTX module: {e}") }
        })?;
        let mut functions = Vec::with_capacity(entries.len());
        for entry in entries {
            let name = CString::new(entry.as_str()).map_err(|_| failed("an entry name", entry))?;
            // SAFETY: `module` is loaded in this context.
            let f = unsafe { result::module::get_function(module, name) }
                .map_err(|e| failed(&format!("finding entry `{entry}`"), e))?;
            functions.push(f);
        }
        Ok(CudaGpu { device, stream, module: Some(module), functions, blas })
    }

    /// The device.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    fn bind(&self) -> Result<(), RunError> {
        self.device.context().bind_to_thread().map_err(|e| failed("binding the context", e))
    }
}

impl Drop for CudaGpu {
    fn drop(&mut self) {
        if let Some(module) = self.module
            && self.bind().is_ok()
            && self.stream.synchronize().is_ok()
        {
            // SAFETY: loaded by `new`, unloaded once, with no work left on the stream.
            let _ = unsafe { result::module::unload(module) };
        }
    }
}

impl Gpu for CudaGpu {
    fn name(&self) -> String {
        self.device.name().to_string()
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr, RunError> {
        self.bind()?;
        // SAFETY: a plain allocation in the bound context.
        let p = unsafe { result::malloc_sync(bytes.max(1)) }
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
        // SAFETY: the caller guarantees `dst` holds `src.len()` bytes; the wait below keeps `src` borrowed until
        // the copy is done.
        unsafe { result::memcpy_htod_async(dst.0, src, self.stream.cu_stream()) }
            .map_err(|e| failed("copying to the device", e))?;
        self.synchronize()
    }

    unsafe fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<(), RunError> {
        self.bind()?;
        // SAFETY: the caller guarantees `src` holds `dst.len()` bytes; the wait below completes the copy.
        unsafe { result::memcpy_dtoh_async(dst, src.0, self.stream.cu_stream()) }
            .map_err(|e| failed("copying from the device", e))?;
        self.synchronize()
    }

    unsafe fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), RunError> {
        self.bind()?;
        // SAFETY: the caller guarantees both ranges.
        unsafe { result::memcpy_dtod_async(dst.0, src.0, bytes, self.stream.cu_stream()) }
            .map_err(|e| failed("copying on the device", e))
    }

    unsafe fn zero(&self, dst: DevPtr, bytes: usize) -> Result<(), RunError> {
        self.bind()?;
        // SAFETY: the caller guarantees the range.
        unsafe { result::memset_d8_async(dst.0, 0, bytes, self.stream.cu_stream()) }
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
        let f = *self.functions.get(kernel).ok_or_else(|| failed("launch", format!("no kernel {kernel}")))?;
        self.bind()?;
        // Every parameter is 8 bytes: a global pointer or an i64 symbol.
        let mut values: Vec<u64> = buffers.iter().map(|p| p.0).chain(symbols.iter().map(|&s| s as u64)).collect();
        let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
        // SAFETY: the entry takes exactly these parameters (the manifest's parameter list), the caller guarantees
        // the buffers, and `values` outlives the call (the driver copies parameters at launch).
        unsafe { result::launch_kernel(f, (blocks, 1, 1), (threads, 1, 1), 0, self.stream.cu_stream(), &mut params) }
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
                *self.blas.handle(),
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
        self.stream.synchronize().map_err(|e| failed("waiting for the stream", e))
    }
}
