//! kiln's C API: `include/kiln.h`, built as `libkiln_c.so`.
//!
//! A session handle is a number, never a pointer kiln dereferences: open sessions live in a table, and every call
//! looks its handle up there, so a closed (or made-up) handle is an error code, not a use after free. Handles are
//! never reused. Every entry point checks its pointers, catches panics, and leaves a one-line message for
//! `kiln_last_error` on the calling thread. Runs take an `Arc` of the session, so a close while another thread
//! runs it waits for nothing and frees nothing in use.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, RwLock};

use kiln::{Backend, ErrorKind, FallbackPolicy, Session, SessionOptions};
use kiln_ir::{DType, Dim, TensorType, TensorView};

/// The API version of `include/kiln.h` this library implements.
pub const API_VERSION: u32 = 1;

/// `kiln_status`.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Status {
    Ok = 0,
    InvalidArgument = 1,
    IoError = 2,
    InvalidModel = 3,
    Unsupported = 4,
    InvalidInput = 5,
    BufferTooSmall = 6,
    RuntimeError = 7,
}

/// `kiln_options`.
#[repr(C)]
#[derive(Debug)]
pub struct Options {
    /// `sizeof(kiln_options)` as the caller knows it.
    pub struct_size: usize,
    /// Worker threads (0: all cores).
    pub threads: u32,
    /// `cpu`, `cuda` or `interp`; null: cpu.
    pub backend: *const c_char,
    /// `kiln_fallback`: 0 warn, 1 allow, 2 deny.
    pub fallback: u32,
}

/// `kiln_tensor_info`.
#[repr(C)]
#[derive(Debug)]
pub struct TensorInfo {
    /// The name.
    pub name: *const c_char,
    /// `kiln_dtype`.
    pub dtype: u32,
    /// The rank.
    pub rank: usize,
    /// `rank` extents, -1 for symbolic dims.
    pub dims: *const i64,
    /// `rank` names of symbolic dims (null for static ones).
    pub dim_names: *const *const c_char,
}

/// `kiln_tensor`.
#[repr(C)]
#[derive(Debug)]
pub struct Tensor {
    /// The input or output's name.
    pub name: *const c_char,
    /// `kiln_dtype`.
    pub dtype: u32,
    /// The rank.
    pub rank: usize,
    /// `rank` extents (read for inputs, written for outputs).
    pub dims: *mut i64,
    /// The elements.
    pub data: *mut c_void,
    /// Input: the tensor's bytes; output: the buffer's size.
    pub capacity_bytes: usize,
}

/// An input or output of an open session, with the C strings `kiln_tensor_info` points into.
struct Port {
    name: String,
    c_name: CString,
    ty: TensorType,
    dims: Vec<i64>,
    dim_names: Vec<Option<CString>>,
    /// Pointers into `dim_names` (null for static dims), for `kiln_tensor_info::dim_names`.
    dim_name_ptrs: Vec<usize>,
}

impl Port {
    fn new(name: &str, ty: &TensorType) -> Port {
        let dims = ty.shape.0.iter().map(|d| d.as_static().map_or(-1, |n| n as i64)).collect();
        let dim_names: Vec<Option<CString>> = ty
            .shape
            .0
            .iter()
            .map(|d| match d {
                Dim::Sym(s) => Some(c_string(s)),
                Dim::Static(_) => None,
            })
            .collect();
        let dim_name_ptrs = dim_names.iter().map(|n| n.as_ref().map_or(0, |c| c.as_ptr() as usize)).collect();
        Port { name: name.to_string(), c_name: c_string(name), ty: ty.clone(), dims, dim_names, dim_name_ptrs }
    }
}

/// A C string of `s` (an interior NUL, which names never hold, becomes a space).
fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

struct Open {
    session: Session,
    inputs: Vec<Port>,
    outputs: Vec<Port>,
}

static SESSIONS: LazyLock<RwLock<HashMap<u64, Arc<Open>>>> = LazyLock::new(|| RwLock::new(HashMap::new()));
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A failed call: its status and message.
struct Failure(Status, String);

fn invalid(message: impl Into<String>) -> Failure {
    Failure(Status::InvalidArgument, message.into())
}

impl From<kiln::Error> for Failure {
    fn from(e: kiln::Error) -> Failure {
        let status = match e.kind() {
            ErrorKind::Io => Status::IoError,
            ErrorKind::InvalidModel => Status::InvalidModel,
            ErrorKind::Unsupported => Status::Unsupported,
            ErrorKind::InvalidInput => Status::InvalidInput,
            ErrorKind::Runtime => Status::RuntimeError,
        };
        Failure(status, e.to_string())
    }
}

/// Runs an entry point: its status, with the message of a failure (or a panic) kept for `kiln_last_error`.
fn guard(f: impl FnOnce() -> Result<(), Failure>) -> Status {
    let outcome = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Failure(Status::RuntimeError, format!("internal error (a bug in kiln): {what}")))
    });
    let (status, message) = match outcome {
        Ok(()) => (Status::Ok, String::new()),
        Err(Failure(status, message)) => (status, message),
    };
    LAST_ERROR.with(|e| *e.borrow_mut() = c_string(&message));
    status
}

/// The open session behind a handle.
fn lookup(handle: *const c_void) -> Result<Arc<Open>, Failure> {
    if handle.is_null() {
        return Err(invalid("session is NULL"));
    }
    let sessions = SESSIONS.read().unwrap_or_else(|e| e.into_inner());
    sessions
        .get(&(handle as u64))
        .cloned()
        .ok_or_else(|| invalid(format!("session {handle:p} is not open (closed already, or never opened)")))
}

/// A C string argument, as UTF-8.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-null, and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| invalid(format!("{what} is not UTF-8")))
}

fn dtype_from(code: u32) -> Option<DType> {
    Some(match code {
        1 => DType::F32,
        2 => DType::F16,
        3 => DType::BF16,
        4 => DType::F64,
        5 => DType::I8,
        6 => DType::U8,
        7 => DType::I32,
        8 => DType::I64,
        9 => DType::Bool,
        10 => DType::I16,
        11 => DType::U16,
        12 => DType::U32,
        13 => DType::U64,
        14 => DType::F8E4M3FN,
        15 => DType::F8E4M3FNUZ,
        16 => DType::F8E5M2,
        17 => DType::F8E5M2FNUZ,
        18 => DType::F8E8M0,
        19 => DType::F4E2M1,
        20 => DType::I4,
        21 => DType::U4,
        22 => DType::I2,
        23 => DType::U2,
        _ => return None,
    })
}

fn dtype_code(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => 1,
        DType::F16 => 2,
        DType::BF16 => 3,
        DType::F64 => 4,
        DType::I8 => 5,
        DType::U8 => 6,
        DType::I32 => 7,
        DType::I64 => 8,
        DType::Bool => 9,
        DType::I16 => 10,
        DType::U16 => 11,
        DType::U32 => 12,
        DType::U64 => 13,
        DType::F8E4M3FN => 14,
        DType::F8E4M3FNUZ => 15,
        DType::F8E5M2 => 16,
        DType::F8E5M2FNUZ => 17,
        DType::F8E8M0 => 18,
        DType::F4E2M1 => 19,
        DType::I4 => 20,
        DType::U4 => 21,
        DType::I2 => 22,
        DType::U2 => 23,
    }
}

/// The API version this library implements (`KILN_API_VERSION`).
#[unsafe(no_mangle)]
pub extern "C" fn kiln_api_version() -> u32 {
    API_VERSION
}

/// kiln's version, a static NUL-terminated string.
#[unsafe(no_mangle)]
pub extern "C" fn kiln_version() -> *const c_char {
    static VERSION: LazyLock<CString> = LazyLock::new(|| c_string(env!("CARGO_PKG_VERSION")));
    VERSION.as_ptr()
}

/// The calling thread's last error message (empty after a success); valid until its next call into kiln.
#[unsafe(no_mangle)]
pub extern "C" fn kiln_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The bytes of one element of `dtype`; 0 for an unknown code.
#[unsafe(no_mangle)]
pub extern "C" fn kiln_dtype_size(dtype: u32) -> usize {
    dtype_from(dtype).map_or(0, DType::size_bytes)
}

/// Opens a model file or an artifact directory.
///
/// # Safety
/// `path` is null or NUL-terminated; `options` is null or points at a `kiln_options` of `struct_size` bytes;
/// `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kiln_session_open(
    path: *const c_char,
    options: *const Options,
    out: *mut *mut c_void,
) -> Status {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        // SAFETY: checked non-null; writable by contract. Cleared first so a failure leaves no stale handle.
        unsafe { *out = std::ptr::null_mut() };
        // SAFETY: by contract.
        let path = unsafe { str_arg(path, "path") }?;
        let mut opts = SessionOptions::default();
        if !options.is_null() {
            // SAFETY: non-null; at least `struct_size` readable bytes by contract, checked against what we read.
            let o = unsafe { &*options };
            if o.struct_size < std::mem::size_of::<Options>() {
                return Err(invalid(format!(
                    "options.struct_size is {} (expected at least {}: set it to sizeof(kiln_options))",
                    o.struct_size,
                    std::mem::size_of::<Options>()
                )));
            }
            opts.threads = o.threads as usize;
            kiln::resolve_threads(opts.threads).map_err(|e| invalid(format!("options.threads: {e}")))?;
            if !o.backend.is_null() {
                // SAFETY: non-null, NUL-terminated by contract.
                let b = unsafe { str_arg(o.backend, "options.backend") }?;
                opts.backend = b.parse::<Backend>().map_err(|e| invalid(format!("options.backend: {e}")))?;
            }
            opts.fallback = match o.fallback {
                0 => FallbackPolicy::Warn,
                1 => FallbackPolicy::Allow,
                2 => FallbackPolicy::Deny,
                n => return Err(invalid(format!("options.fallback is {n} (0 warn, 1 allow, 2 deny)"))),
            };
        }
        let session = Session::open(Path::new(path), &opts)?;
        if opts.fallback == FallbackPolicy::Warn {
            for line in kiln::fallback_lines(session.fallbacks()) {
                eprintln!("kiln: {line}");
            }
        }
        let inputs = session.inputs().iter().map(|(n, t)| Port::new(n, t)).collect();
        let outputs = session.outputs().iter().map(|(n, t)| Port::new(n, t)).collect();
        let handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        SESSIONS.write().unwrap_or_else(|e| e.into_inner()).insert(handle, Arc::new(Open { session, inputs, outputs }));
        // SAFETY: checked above.
        unsafe { *out = handle as *mut c_void };
        Ok(())
    })
}

/// Closes a session; null is accepted. Runs in flight finish first (they hold the session).
#[unsafe(no_mangle)]
pub extern "C" fn kiln_session_close(session: *mut c_void) -> Status {
    guard(|| {
        if session.is_null() {
            return Ok(());
        }
        let removed = SESSIONS.write().unwrap_or_else(|e| e.into_inner()).remove(&(session as u64));
        match removed {
            Some(_) => Ok(()),
            None => Err(invalid(format!("session {session:p} is not open (closed already, or never opened)"))),
        }
    })
}

/// # Safety
/// `out` is null or writable.
unsafe fn count(session: *const c_void, out: *mut usize, ports: impl Fn(&Open) -> usize) -> Status {
    guard(|| {
        let open = lookup(session)?;
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        // SAFETY: checked non-null, writable by contract.
        unsafe { *out = ports(&open) };
        Ok(())
    })
}

/// The number of inputs.
///
/// # Safety
/// `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kiln_session_input_count(session: *const c_void, out: *mut usize) -> Status {
    // SAFETY: passed through.
    unsafe { count(session, out, |o| o.inputs.len()) }
}

/// The number of outputs.
///
/// # Safety
/// `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kiln_session_output_count(session: *const c_void, out: *mut usize) -> Status {
    // SAFETY: passed through.
    unsafe { count(session, out, |o| o.outputs.len()) }
}

/// # Safety
/// `out` is null or writable.
unsafe fn info(session: *const c_void, index: usize, out: *mut TensorInfo, inputs: bool) -> Status {
    guard(|| {
        let open = lookup(session)?;
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let ports = if inputs { &open.inputs } else { &open.outputs };
        let what = if inputs { "input" } else { "output" };
        let port = ports
            .get(index)
            .ok_or_else(|| invalid(format!("{what} index {index} is out of range (the model has {})", ports.len())))?;
        // SAFETY: checked non-null, writable by contract. The pointers point into the session's ports, which live
        // until the session is closed (the table holds them; closing while the caller still reads them is the
        // caller's error, as documented).
        unsafe {
            *out = TensorInfo {
                name: port.c_name.as_ptr(),
                dtype: dtype_code(port.ty.dtype),
                rank: port.dims.len(),
                dims: port.dims.as_ptr(),
                dim_names: port.dim_name_ptrs.as_ptr().cast::<*const c_char>(),
            }
        };
        debug_assert_eq!(port.dim_names.len(), port.dims.len());
        Ok(())
    })
}

/// Input `index`'s name, dtype and shape.
///
/// # Safety
/// `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kiln_session_input_info(session: *const c_void, index: usize, out: *mut TensorInfo) -> Status {
    // SAFETY: passed through.
    unsafe { info(session, index, out, true) }
}

/// Output `index`'s name, dtype and shape.
///
/// # Safety
/// `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kiln_session_output_info(
    session: *const c_void,
    index: usize,
    out: *mut TensorInfo,
) -> Status {
    // SAFETY: passed through.
    unsafe { info(session, index, out, false) }
}

/// The extents of a caller tensor, checked (rank ≤ 64, no negative extent).
///
/// # Safety
/// `t.dims` is null or holds `t.rank` readable values.
unsafe fn read_dims(t: &Tensor, what: &str) -> Result<Vec<usize>, Failure> {
    if t.rank > 64 {
        return Err(invalid(format!("{what}: rank {} is absurd", t.rank)));
    }
    if t.rank == 0 {
        return Ok(Vec::new());
    }
    if t.dims.is_null() {
        return Err(invalid(format!("{what}: dims is NULL with rank {}", t.rank)));
    }
    // SAFETY: non-null, `rank` values by contract.
    let dims = unsafe { std::slice::from_raw_parts(t.dims, t.rank) };
    dims.iter().map(|&d| usize::try_from(d).map_err(|_| invalid(format!("{what}: extent {d} is negative")))).collect()
}

/// Runs the model on caller buffers.
///
/// # Safety
/// `inputs` is null or holds `input_count` tensors whose names are NUL-terminated, whose `dims` hold `rank`
/// values and whose `data` holds `capacity_bytes` readable bytes; `outputs` likewise, with writable `dims` and
/// `data`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kiln_session_run(
    session: *mut c_void,
    inputs: *const Tensor,
    input_count: usize,
    outputs: *mut Tensor,
    output_count: usize,
) -> Status {
    guard(|| {
        let open = lookup(session)?;
        let slice = |p: *const Tensor, n: usize, what: &str| -> Result<&[Tensor], Failure> {
            match (p.is_null(), n) {
                (_, 0) => Ok(&[]),
                (true, _) => Err(invalid(format!("{what} is NULL with a count of {n}"))),
                (false, n) if n > 1 << 16 => Err(invalid(format!("{what}: a count of {n} is absurd"))),
                // SAFETY: non-null, `n` tensors by contract.
                (false, n) => Ok(unsafe { std::slice::from_raw_parts(p, n) }),
            }
        };
        let given = slice(inputs, input_count, "inputs")?;
        let wanted = slice(outputs, output_count, "outputs")?;
        // Inputs: checked views of the caller's memory (bound without a copy).
        let mut shapes = Vec::with_capacity(given.len());
        let mut names = Vec::with_capacity(given.len());
        for (i, t) in given.iter().enumerate() {
            // SAFETY: by contract.
            let name = unsafe { str_arg(t.name, &format!("inputs[{i}].name")) }?;
            // SAFETY: by contract.
            shapes.push(unsafe { read_dims(t, &format!("input `{name}`")) }?);
            names.push(name);
        }
        let mut views = Vec::with_capacity(given.len());
        for (i, t) in given.iter().enumerate() {
            let name = names[i];
            let dtype = dtype_from(t.dtype).ok_or_else(|| {
                Failure(Status::InvalidInput, format!("input `{name}`: dtype code {} is unknown", t.dtype))
            })?;
            let bytes: &[u8] = match (t.data.is_null(), t.capacity_bytes) {
                (_, 0) => &[],
                (true, n) => return Err(invalid(format!("input `{name}`: data is NULL with {n} bytes"))),
                // SAFETY: non-null, `capacity_bytes` readable bytes by contract.
                (false, n) => unsafe { std::slice::from_raw_parts(t.data.cast::<u8>(), n) },
            };
            let view = TensorView::new(dtype, &shapes[i], bytes)
                .map_err(|e| Failure(Status::InvalidInput, format!("input `{name}`: {e}")))?;
            views.push((name, view));
        }
        // Outputs asked for, by name; checked before the run.
        let mut targets = Vec::with_capacity(wanted.len());
        for (i, t) in wanted.iter().enumerate() {
            // SAFETY: by contract.
            let name = unsafe { str_arg(t.name, &format!("outputs[{i}].name")) }?;
            let k = open.outputs.iter().position(|p| p.name == name).ok_or_else(|| {
                let all: Vec<String> = open.outputs.iter().map(|p| format!("`{}`", p.name)).collect();
                Failure(Status::InvalidInput, format!("the model has no output `{name}` (outputs: {})", all.join(", ")))
            })?;
            let port = &open.outputs[k];
            if dtype_from(t.dtype) != Some(port.ty.dtype) {
                return Err(Failure(
                    Status::InvalidInput,
                    format!(
                        "output `{name}` is {} (dtype code {}), got dtype code {}",
                        port.ty.dtype,
                        dtype_code(port.ty.dtype),
                        t.dtype
                    ),
                ));
            }
            if t.rank != port.dims.len() {
                return Err(Failure(
                    Status::InvalidInput,
                    format!("output `{name}` has rank {}, got a tensor of rank {}", port.dims.len(), t.rank),
                ));
            }
            if t.rank > 0 && t.dims.is_null() {
                return Err(invalid(format!("output `{name}`: dims is NULL with rank {}", t.rank)));
            }
            if t.capacity_bytes > 0 && t.data.is_null() {
                return Err(invalid(format!("output `{name}`: data is NULL with {} bytes", t.capacity_bytes)));
            }
            targets.push(k);
        }
        let results = open.session.run_views(&views)?;
        let mut too_small = Vec::new();
        for (t, &k) in wanted.iter().zip(&targets) {
            let value = &results[k].1;
            let bytes = value.as_bytes();
            // SAFETY: checked non-null above for rank > 0; `rank` writable values by contract.
            let dims =
                if t.rank == 0 { &mut [][..] } else { unsafe { std::slice::from_raw_parts_mut(t.dims, t.rank) } };
            for (d, &n) in dims.iter_mut().zip(value.shape()) {
                *d = n as i64;
            }
            if bytes.len() > t.capacity_bytes {
                too_small.push(format!(
                    "`{}` needs {} bytes, has {}",
                    open.outputs[k].name,
                    bytes.len(),
                    t.capacity_bytes
                ));
                continue;
            }
            if !bytes.is_empty() {
                // SAFETY: `data` is non-null (checked) with `capacity_bytes` ≥ `bytes.len()` writable bytes by
                // contract; kiln's result is a distinct allocation.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), t.data.cast::<u8>(), bytes.len()) };
            }
        }
        if !too_small.is_empty() {
            return Err(Failure(
                Status::BufferTooSmall,
                format!("output buffer(s) too small: {} (dims are set to the outputs' shapes)", too_small.join(", ")),
            ));
        }
        Ok(())
    })
}
