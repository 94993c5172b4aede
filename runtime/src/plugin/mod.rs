//! Backend plugins: shared libraries that implement [`Backend`] through the versioned C ABI in [`abi`]
//! (`runtime/include/kiln_backend.h`, documented in `docs/plugins.md`).
//!
//! [`load_plugin`] opens the library, looks up `kiln_backend_entry`, checks the vtable's ABI version and struct
//! size before reading the rest, copies the plugin's name, capabilities and op list, and wraps the vtable in a
//! [`PluginBackend`]. The library stays loaded as long as the backend or any state it handed out is alive.
//!
//! The boundary is where kiln's guarantees end: the host validates everything it is handed (dtype codes, ranks,
//! output order and sizes, UTF-8, null pointers) and turns every failure into [`RunError::Plugin`] naming the
//! plugin; a plugin's own error status becomes that error with the plugin's message. Host callbacks never
//! unwind into plugin code. What the host cannot defend against is a plugin that breaks memory safety (writes
//! past a buffer, frees what it does not own) — that is the plugin's contract to keep.

pub mod abi;

use std::ffi::{CStr, CString, c_char, c_void};
use std::path::Path;
use std::sync::Arc;

use kiln_ir::{DType, Tensor};

use crate::RunError;
use crate::contract::{
    Backend, BackendState, Capabilities, Counters, Node, NodeKind, OpSupport, RunResult, StateHandle,
};
use abi::*;

/// Capacity of the error buffers the host hands to plugins.
const ERROR_CAP: usize = 1024;

/// Most dims an output may have.
const MAX_RANK: u32 = 64;

/// Largest output (or exported state) a plugin may ask the host to allocate: 16 GiB. Bigger requests are refused
/// rather than risking an abort on allocation failure.
const MAX_ALLOC_BYTES: u64 = 16 << 30;

/// The ABI code of a dtype (its position in [`DType::ALL`], matching the `KILN_DTYPE_*` constants).
pub fn dtype_code(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => KILN_DTYPE_F32,
        DType::F16 => KILN_DTYPE_F16,
        DType::BF16 => KILN_DTYPE_BF16,
        DType::F64 => KILN_DTYPE_F64,
        DType::I8 => KILN_DTYPE_I8,
        DType::U8 => KILN_DTYPE_U8,
        DType::I32 => KILN_DTYPE_I32,
        DType::I64 => KILN_DTYPE_I64,
        DType::Bool => KILN_DTYPE_BOOL,
        DType::I16 => KILN_DTYPE_I16,
        DType::U16 => KILN_DTYPE_U16,
        DType::U32 => KILN_DTYPE_U32,
        DType::U64 => KILN_DTYPE_U64,
        DType::F8E4M3FN => KILN_DTYPE_F8E4M3FN,
        DType::F8E4M3FNUZ => KILN_DTYPE_F8E4M3FNUZ,
        DType::F8E5M2 => KILN_DTYPE_F8E5M2,
        DType::F8E5M2FNUZ => KILN_DTYPE_F8E5M2FNUZ,
        DType::F8E8M0 => KILN_DTYPE_F8E8M0,
        DType::F4E2M1 => KILN_DTYPE_F4E2M1,
        DType::I4 => KILN_DTYPE_I4,
        DType::U4 => KILN_DTYPE_U4,
        DType::I2 => KILN_DTYPE_I2,
        DType::U2 => KILN_DTYPE_U2,
    }
}

/// The dtype of an ABI code, or `None` for an unknown code.
pub fn dtype_from_code(code: u32) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| dtype_code(d) == code)
}

/// Loads the plugin at `path`; messages name the plugin by its path until it has told its own name.
pub fn load_plugin(path: &Path) -> Result<Arc<dyn Backend>, RunError> {
    Ok(Arc::new(PluginBackend::load(path, None)?))
}

/// The loaded library and the vtable copied from it. Dropped last of everything that calls into the plugin:
/// every [`PluginBackend`] and every [`PluginState`] hold an `Arc` of it.
struct PluginLibrary {
    /// The name in messages: the registry's name when loaded through the registry, else the plugin's own.
    label: String,
    vtable: KilnBackendVtable,
    /// The ABI version the plugin speaks (its vtable's), which decides how run arguments are filled.
    abi_version: u32,
    /// Declared after `vtable` (whose pointers point into it) and unloaded in `Drop`, after `destroy`.
    library: Option<libloading::Library>,
}

// SAFETY: the vtable's `instance` pointer and functions are shared across threads by the ABI's contract (`run` may
// be called from several threads at once; `release_state` from any thread); the host never mutates the vtable.
unsafe impl Send for PluginLibrary {}
// SAFETY: as above — all access through `&PluginLibrary` is calls the ABI declares thread-safe.
unsafe impl Sync for PluginLibrary {}

impl Drop for PluginLibrary {
    fn drop(&mut self) {
        if let Some(destroy) = self.vtable.destroy {
            // SAFETY: called once, after every state was released (each holds an Arc of this library), with the
            // plugin's own instance pointer, while the library is still loaded.
            unsafe { destroy(self.vtable.instance) };
        }
        drop(self.library.take());
    }
}

impl PluginLibrary {
    fn error(&self, message: impl Into<String>) -> RunError {
        RunError::Plugin { name: self.label.clone(), message: message.into() }
    }
}

/// A [`Backend`] implemented by a plugin through the C ABI.
pub struct PluginBackend {
    lib: Arc<PluginLibrary>,
    /// The plugin's own name (from its vtable).
    plugin_name: String,
    tensor_backend_type: String,
    capabilities: Capabilities,
}

impl std::fmt::Debug for PluginBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginBackend")
            .field("label", &self.lib.label)
            .field("plugin_name", &self.plugin_name)
            .field("capabilities", &self.capabilities)
            .finish()
    }
}

/// Reads a NUL-terminated UTF-8 string the plugin owns; `what` names it in errors.
///
/// # Safety
/// `ptr` is null or points at a NUL-terminated string valid for the call.
unsafe fn plugin_str(ptr: *const c_char, what: &str) -> Result<Option<String>, String> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str().map(|s| Some(s.to_string())).map_err(|_| format!("{what} is not valid UTF-8"))
}

/// The message in a host error buffer after a failed call.
fn buffer_message(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let msg = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    if msg.is_empty() { "(the plugin gave no message)".to_string() } else { msg }
}

impl PluginBackend {
    /// Loads the plugin at `path`. `label` names it in messages (the registry passes its name); without one,
    /// messages use the path until the plugin's own name is known.
    pub fn load(path: &Path, label: Option<&str>) -> Result<PluginBackend, RunError> {
        let shown = path.display().to_string();
        let early = |message: String| RunError::Plugin { name: label.unwrap_or(&shown).to_string(), message };
        if !path.exists() {
            return Err(early(format!("{shown}: no such file")));
        }
        // SAFETY: loading a library runs its initializers; that is what loading a plugin means, and the user
        // named the file. Nothing else is assumed about it yet.
        let library =
            unsafe { libloading::Library::new(path) }.map_err(|e| early(format!("cannot load {shown}: {e}")))?;
        // SAFETY: the symbol's type is the ABI's entry type; a plugin exporting something else under that name
        // breaks the ABI it claims.
        let entry: KilnEntryFn = unsafe {
            *library.get::<KilnEntryFn>(KILN_BACKEND_ENTRY_SYMBOL).map_err(|e| {
                early(format!("{shown} does not export `kiln_backend_entry` (not a kiln backend plugin?): {e}"))
            })?
        };
        // SAFETY: calling the plugin's entry point with the host's ABI version (see `KilnEntryFn` on entries of
        // version 1, which take no argument).
        let table = unsafe { entry(KILN_BACKEND_ABI_VERSION) };
        if table.is_null() {
            return Err(early(format!("{shown}: kiln_backend_entry returned null (the plugin failed to initialize)")));
        }
        // SAFETY: the entry's result, valid until `destroy` by the ABI; the library stays loaded with it.
        unsafe { PluginBackend::adopt(table, Some(library), label.unwrap_or(&shown), label.is_none(), &shown) }
    }

    /// A backend from a vtable already in memory (the seed's construct-from-ABI function): a plugin linked into
    /// the process, or one a host loaded itself. `label` names it in messages. The vtable is checked as a loaded
    /// plugin's is.
    ///
    /// # Safety
    /// `table` is null or points at a vtable of the version it declares whose pointers (strings, op list,
    /// functions, instance) stay valid until its `destroy` is called — which happens when the last backend or
    /// state made from it is dropped.
    pub unsafe fn from_vtable(table: *const KilnBackendVtable, label: &str) -> Result<PluginBackend, RunError> {
        if table.is_null() {
            return Err(RunError::Plugin { name: label.to_string(), message: "the vtable pointer is null".into() });
        }
        // SAFETY: the caller's contract.
        unsafe { PluginBackend::adopt(table, None, label, false, label) }
    }

    /// Checks and copies `table` (version, size, name, functions, capabilities, op list). `rename`: take the
    /// plugin's own name as the label once known.
    ///
    /// # Safety
    /// As [`PluginBackend::from_vtable`]; `library`, when given, is what keeps `table` valid.
    unsafe fn adopt(
        table: *const KilnBackendVtable,
        library: Option<libloading::Library>,
        label: &str,
        rename: bool,
        shown: &str,
    ) -> Result<PluginBackend, RunError> {
        let early = |message: String| RunError::Plugin { name: label.to_string(), message };
        if !(table as usize).is_multiple_of(std::mem::align_of::<KilnBackendVtable>()) {
            return Err(early(format!("{shown}: the vtable is misaligned")));
        }
        // SAFETY: non-null and aligned; every vtable version starts with this header, so reading it is in bounds
        // whatever version the plugin was built against.
        let header = unsafe { *table.cast::<KilnVtableHeader>() };
        if !(KILN_BACKEND_ABI_MIN_VERSION..=KILN_BACKEND_ABI_VERSION).contains(&header.abi_version) {
            return Err(early(format!(
                "{shown}: ABI version {} is not supported (this kiln loads ABI versions \
                 {KILN_BACKEND_ABI_MIN_VERSION} to {KILN_BACKEND_ABI_VERSION})",
                header.abi_version
            )));
        }
        // Versions 1 and 2 share the vtable's layout.
        let expected = std::mem::size_of::<KilnBackendVtable>();
        if header.struct_size as usize != expected {
            return Err(early(format!(
                "{shown}: vtable struct_size is {} bytes, ABI version {} needs {expected} \
                 (built against a different kiln_backend.h?)",
                header.struct_size, header.abi_version
            )));
        }
        // SAFETY: version and size match this host's definition, so the whole struct is readable.
        let vtable = unsafe { *table };
        // From here on, dropping `lib` calls `destroy` and unloads.
        let mut lib = PluginLibrary { label: label.to_string(), vtable, abi_version: header.abi_version, library };
        // SAFETY: the vtable's strings are valid until `destroy` by the ABI.
        let plugin_name = unsafe { plugin_str(vtable.name, "the plugin's name") }
            .map_err(|m| lib.error(m))?
            .filter(|n| !n.is_empty())
            .ok_or_else(|| lib.error(format!("{shown}: the vtable has no name")))?;
        if rename {
            lib.label = plugin_name.clone();
        }
        if vtable.run.is_none() {
            return Err(lib.error("the vtable has no `run` function"));
        }
        // SAFETY: as above.
        let tensor_backend_type =
            unsafe { plugin_str(vtable.tensor_backend_type, "tensor_backend_type") }.map_err(|m| lib.error(m))?;
        let caps = vtable.capabilities;
        let known = KILN_CAP_TENSOR | KILN_CAP_TOKEN | KILN_CAP_CACHE | KILN_CAP_STATE_EXPORT | KILN_CAP_ALL_OPS;
        if caps & !known != 0 {
            return Err(lib.error(format!("unknown capability flags {:#x}", caps & !known)));
        }
        let ops = if caps & KILN_CAP_ALL_OPS != 0 {
            OpSupport::All
        } else {
            let mut names = Vec::new();
            if vtable.op_count > 0 && vtable.ops.is_null() {
                return Err(lib.error(format!("op_count is {} but ops is null", vtable.op_count)));
            }
            for i in 0..vtable.op_count as usize {
                // SAFETY: `ops` holds `op_count` string pointers, valid until `destroy`.
                let name = unsafe { plugin_str(*vtable.ops.add(i), "an op name") }
                    .map_err(|m| lib.error(m))?
                    .ok_or_else(|| lib.error(format!("op name {i} is null")))?;
                // A misspelt mnemonic would silently never be selected: refuse it now.
                if !kiln_ir::Op::mnemonics().contains(&name.as_str()) {
                    return Err(lib.error(format!("declares op `{name}`, which is not a kiln op mnemonic")));
                }
                names.push(name);
            }
            OpSupport::only(names)
        };
        let state_export = caps & KILN_CAP_STATE_EXPORT != 0;
        if state_export && (vtable.export_state.is_none() || vtable.import_state.is_none()) {
            return Err(lib.error("declares state export but lacks export_state or import_state"));
        }
        let capabilities = Capabilities {
            tensor: caps & KILN_CAP_TENSOR != 0,
            token: caps & KILN_CAP_TOKEN != 0,
            cache: caps & KILN_CAP_CACHE != 0,
            state_export,
            ops,
        };
        Ok(PluginBackend {
            lib: Arc::new(lib),
            plugin_name,
            tensor_backend_type: tensor_backend_type.unwrap_or_default(),
            capabilities,
        })
    }

    /// The plugin's own name, as its vtable gives it.
    pub fn plugin_name(&self) -> &str {
        &self.plugin_name
    }

    /// Wraps a state the plugin handed over; a null pointer is no state.
    fn adopt_state(&self, ptr: *mut c_void, bytes: u64, tokens: u64) -> Result<Option<BackendState>, RunError> {
        if ptr.is_null() {
            return Ok(None);
        }
        if self.lib.vtable.release_state.is_none() {
            return Err(self.lib.error("returned a state but has no release_state function (it would leak)"));
        }
        Ok(Some(BackendState::new(PluginState {
            ptr,
            bytes,
            tokens: usize::try_from(tokens).unwrap_or(usize::MAX),
            lib: Arc::clone(&self.lib),
        })))
    }

    /// The plugin pointer inside `state`, if the state is this plugin's.
    fn own_state(&self, state: &BackendState) -> Result<*mut c_void, RunError> {
        match state.downcast::<PluginState>() {
            Some(s) if Arc::ptr_eq(&s.lib, &self.lib) => Ok(s.ptr),
            _ => Err(self.lib.error("was handed a state that another backend created")),
        }
    }
}

/// A state owned by a plugin: released through the plugin's `release_state` when the last handle drops.
struct PluginState {
    ptr: *mut c_void,
    bytes: u64,
    tokens: usize,
    lib: Arc<PluginLibrary>,
}

// SAFETY: the ABI lets plugin states be used and released from any thread; the host never touches the pointee.
unsafe impl Send for PluginState {}
// SAFETY: as above; shared access only passes the pointer back to the plugin as a borrowed prefix state.
unsafe impl Sync for PluginState {}

impl Drop for PluginState {
    fn drop(&mut self) {
        if let Some(release) = self.lib.vtable.release_state {
            // SAFETY: the pointer came from this plugin and is released exactly once, here, while the library
            // is loaded (`lib` is still held).
            unsafe { release(self.lib.vtable.instance, self.ptr) };
        }
    }
}

impl StateHandle for PluginState {
    fn bytes(&self) -> u64 {
        self.bytes
    }
    fn tokens(&self) -> usize {
        self.tokens
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Host memory for one output: the tensor the plugin writes into. `bool` outputs are held as `u8` (a plugin may
/// write any byte) and converted with `byte != 0` afterwards.
struct OutputBuffer {
    tensor: Tensor,
    is_bool: bool,
}

impl OutputBuffer {
    /// The output as the tensor it declared (`bool` from its bytes: non-zero is true).
    fn finish(self) -> Tensor {
        if !self.is_bool {
            return self.tensor;
        }
        let (shape, data) = self.tensor.into_parts();
        let bools: Vec<bool> = (0..data.len()).map(|i| data.get_i64(i) != 0).collect();
        Tensor::from_vec(shape, bools).expect("the same element count as the u8 storage")
    }
}

/// `n` zeroed elements, or `None` when the allocator refuses. Zeroed memory from the allocator is typically
/// mapped lazily, so a large output costs nothing until the plugin writes it, and a refusal is an error rather than
/// the abort of `vec![0; n]`.
fn try_zeroed<T: kiln_ir::Element>(n: usize) -> Option<Vec<T>> {
    if n == 0 || std::mem::size_of::<T>() == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    // SAFETY: the layout has a non-zero size (checked above).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: allocated by the global allocator with exactly this layout (`n` elements of `T`); every `Element`
    // type (floats, integers, `bool`) is valid as all-zero bytes, so all `n` elements are initialized.
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// The host side of a [`KilnOutputSink`]: the outputs allocated so far and the first refused request.
#[derive(Default)]
struct OutputCollector {
    outputs: Vec<OutputBuffer>,
    refused: Option<String>,
}

impl OutputCollector {
    fn allocate(&mut self, index: u32, dtype: u32, rank: u32, shape: *const i64) -> Result<*mut c_void, String> {
        if index as usize != self.outputs.len() {
            return Err(format!("asked for output {index} but the next output is {}", self.outputs.len()));
        }
        let dtype = dtype_from_code(dtype).ok_or_else(|| format!("output {index}: unknown dtype code {dtype}"))?;
        if rank > MAX_RANK {
            return Err(format!("output {index}: rank {rank} exceeds {MAX_RANK}"));
        }
        if rank > 0 && shape.is_null() {
            return Err(format!("output {index}: rank {rank} with a null shape"));
        }
        let mut dims = Vec::with_capacity(rank as usize);
        let mut elements: u64 = 1;
        for k in 0..rank as usize {
            // SAFETY: the plugin passes `rank` extents at `shape` (non-null, checked above).
            let d = unsafe { *shape.add(k) };
            let d = u64::try_from(d).map_err(|_| format!("output {index}: negative extent {d}"))?;
            elements = elements.checked_mul(d).ok_or_else(|| format!("output {index}: element count overflows"))?;
            dims.push(d as usize);
        }
        let bytes = elements
            .checked_mul(dtype.size_bytes() as u64)
            .filter(|&b| b <= MAX_ALLOC_BYTES)
            .ok_or_else(|| format!("output {index}: {elements} elements of {} is too large", dtype.name()))?;
        let is_bool = dtype == DType::Bool;
        let storage = if is_bool { DType::U8 } else { dtype };
        let data =
            kiln_ir::with_dtype!(storage, T => try_zeroed::<T>(elements as usize).map(<T as kiln_ir::Element>::wrap))
                .ok_or_else(|| format!("output {index}: cannot allocate {bytes} bytes"))?;
        let mut tensor = Tensor::new(dims, data).map_err(|e| format!("output {index}: {e}"))?;
        // SAFETY: `storage` is never `bool`, so any bytes the plugin writes are valid elements.
        let ptr = unsafe { tensor.as_bytes_mut() }.as_mut_ptr().cast::<c_void>();
        self.outputs.push(OutputBuffer { tensor, is_bool });
        Ok(ptr)
    }
}

/// The [`KilnAllocOutputFn`] the host hands to plugins.
unsafe extern "C" fn alloc_output(
    ctx: *mut c_void,
    index: u32,
    dtype: u32,
    rank: u32,
    shape: *const i64,
) -> *mut c_void {
    if ctx.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `ctx` is the `OutputCollector` the host put in the sink; it outlives the `run` call this callback is
    // made from, and the plugin calls back from that call only.
    let collector = unsafe { &mut *ctx.cast::<OutputCollector>() };
    // Never unwind into the plugin: a host bug here becomes a refused allocation.
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| collector.allocate(index, dtype, rank, shape)))
            .unwrap_or_else(|_| Err("the host's output allocator failed".to_string()));
    match result {
        Ok(p) => p,
        Err(m) => {
            collector.refused.get_or_insert(m);
            std::ptr::null_mut()
        }
    }
}

/// The host side of a [`KilnByteSink`].
#[derive(Default)]
struct ByteCollector {
    bytes: Option<Vec<u8>>,
    refused: Option<String>,
}

/// The [`KilnAllocBytesFn`] the host hands to plugins.
unsafe extern "C" fn alloc_bytes(ctx: *mut c_void, len: u64) -> *mut u8 {
    if ctx.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `ctx` is the `ByteCollector` of the `export_state` call in progress.
    let collector = unsafe { &mut *ctx.cast::<ByteCollector>() };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if collector.bytes.is_some() {
            return Err("allocated state bytes twice".to_string());
        }
        if len > MAX_ALLOC_BYTES {
            return Err(format!("state of {len} bytes is too large"));
        }
        let mut v = Vec::new();
        v.try_reserve_exact(len as usize).map_err(|_| format!("cannot allocate {len} bytes"))?;
        v.resize(len as usize, 0u8);
        Ok(collector.bytes.insert(v).as_mut_ptr())
    }))
    .unwrap_or_else(|_| Err("the host's byte allocator failed".to_string()));
    match result {
        Ok(p) => p,
        Err(m) => {
            collector.refused.get_or_insert(m);
            std::ptr::null_mut()
        }
    }
}

/// The JSON attributes of a node, as documented for `attrs_json`.
fn attrs_json(node: &Node) -> Result<String, RunError> {
    let json = match &node.kind {
        NodeKind::Op(op) => serde_json::to_string(op),
        NodeKind::Token { model, .. } => serde_json::to_string(&serde_json::json!({ "model": model })),
    };
    json.map_err(|e| RunError::Unsupported { node: node.name.clone(), reason: format!("attributes as JSON: {e}") })
}

/// A C string for the plugin; interior NULs (possible only in user-chosen names) are an error.
fn c_string(s: &str, what: &str, node: &Node) -> Result<CString, RunError> {
    CString::new(s)
        .map_err(|_| RunError::Unsupported { node: node.name.clone(), reason: format!("{what} contains a NUL byte") })
}

impl Backend for PluginBackend {
    fn capabilities(&self) -> Capabilities {
        self.capabilities.clone()
    }

    fn tensor_backend_type(&self) -> &str {
        &self.tensor_backend_type
    }

    fn export_state(&self, state: &BackendState) -> Option<Vec<u8>> {
        let export = self.lib.vtable.export_state?;
        let ptr = self.own_state(state).ok()?;
        let mut collector = ByteCollector::default();
        let sink = KilnByteSink { ctx: (&raw mut collector).cast(), alloc: Some(alloc_bytes) };
        let mut error = vec![0u8; ERROR_CAP];
        // SAFETY: `ptr` is a live state of this plugin (held by `state`); `sink` and `error` outlive the call.
        let status =
            unsafe { export(self.lib.vtable.instance, ptr, &sink, error.as_mut_ptr().cast(), ERROR_CAP as u64) };
        // The contract's export has no error channel: a failed export is "not portable", and resume starts cold.
        if status != KILN_STATUS_OK || collector.refused.is_some() {
            return None;
        }
        collector.bytes
    }

    fn import_state(&self, bytes: &[u8]) -> Result<BackendState, RunError> {
        let Some(import) = self.lib.vtable.import_state else {
            return Err(RunError::State(format!("plugin `{}`: states are not portable", self.lib.label)));
        };
        let mut out: *mut c_void = std::ptr::null_mut();
        let (mut state_bytes, mut state_tokens) = (0u64, 0u64);
        let mut error = vec![0u8; ERROR_CAP];
        // SAFETY: every pointer is to host memory that outlives the call; `bytes` is borrowed for it.
        let status = unsafe {
            import(
                self.lib.vtable.instance,
                bytes.as_ptr(),
                bytes.len() as u64,
                &mut out,
                &mut state_bytes,
                &mut state_tokens,
                error.as_mut_ptr().cast(),
                ERROR_CAP as u64,
            )
        };
        // Adopt first so that a state returned along with an error is still released.
        let state = self.adopt_state(out, state_bytes, state_tokens)?;
        if status != KILN_STATUS_OK {
            return Err(RunError::State(format!("plugin `{}`: {}", self.lib.label, buffer_message(&error))));
        }
        state.ok_or_else(|| RunError::State(format!("plugin `{}`: import returned no state", self.lib.label)))
    }

    fn run_with_cache(
        &self,
        node: &Node,
        inputs: &[Tensor],
        prefix_state: Option<&BackendState>,
        remaining_tokens: u32,
    ) -> Result<RunResult, RunError> {
        let run = self.lib.vtable.run.ok_or_else(|| self.lib.error("no run function"))?;
        let name = c_string(&node.name, "the node name", node)?;
        let kind = c_string(node.kind_name(), "the node kind", node)?;
        let attrs = c_string(&attrs_json(node)?, "the attributes", node)?;
        let prefix = prefix_state.map(|s| self.own_state(s)).transpose()?.unwrap_or(std::ptr::null_mut());
        // Shapes and strides must outlive the descriptors that point into them.
        let dims: Vec<(Vec<i64>, Vec<i64>)> = inputs
            .iter()
            .map(|t| {
                let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
                let mut strides = vec![1i64; shape.len()];
                for k in (0..shape.len().saturating_sub(1)).rev() {
                    strides[k] = strides[k + 1] * shape[k + 1].max(1);
                }
                (shape, strides)
            })
            .collect();
        let descs: Vec<KilnTensorDesc> = inputs
            .iter()
            .zip(&dims)
            .map(|(t, (shape, strides))| {
                let bytes = t.as_bytes();
                KilnTensorDesc {
                    dtype: dtype_code(t.dtype()),
                    rank: shape.len() as u32,
                    shape: shape.as_ptr(),
                    strides: strides.as_ptr(),
                    data: if bytes.is_empty() { std::ptr::null() } else { bytes.as_ptr().cast() },
                    byte_len: bytes.len() as u64,
                }
            })
            .collect();
        let mut collector = OutputCollector::default();
        let sink = KilnOutputSink { ctx: (&raw mut collector).cast(), alloc: Some(alloc_output) };
        let mut error = vec![0u8; ERROR_CAP];
        let max_new_tokens = match &node.kind {
            NodeKind::Token { max_new_tokens, .. } => *max_new_tokens,
            NodeKind::Op(_) => 0,
        };
        // Each plugin is spoken to in its own ABI version.
        let (struct_size, remaining_tokens) = match self.lib.abi_version {
            1 => (KILN_RUN_ARGS_V1_SIZE, max_new_tokens),
            _ => (std::mem::size_of::<KilnRunArgs>() as u32, remaining_tokens),
        };
        let mut args = KilnRunArgs {
            struct_size,
            input_count: u32::try_from(descs.len()).map_err(|_| self.lib.error("too many inputs"))?,
            remaining_tokens,
            counters: KilnCounters::default(),
            node_name: name.as_ptr(),
            kind: kind.as_ptr(),
            attrs_json: attrs.as_ptr(),
            inputs: descs.as_ptr(),
            outputs: &sink,
            prefix_state: prefix,
            state_out: std::ptr::null_mut(),
            state_bytes: 0,
            state_tokens: 0,
            error: error.as_mut_ptr().cast(),
            error_cap: ERROR_CAP as u64,
            max_new_tokens,
            reserved: 0,
        };
        // SAFETY: every pointer in `args` refers to host memory alive until the call returns (the C strings,
        // descriptors and their shapes, the tensors' bytes, the sink and its collector, the error buffer); the
        // prefix state is kept alive by `prefix_state`'s handle.
        let status = unsafe { run(self.lib.vtable.instance, &mut args) };
        // Adopt first so that a state returned along with an error is still released.
        let state = self.adopt_state(args.state_out, args.state_bytes, args.state_tokens)?;
        let node_err = |m: String| self.lib.error(format!("node `{}` ({}): {m}", node.name, node.kind_name()));
        match status {
            KILN_STATUS_OK => {}
            KILN_STATUS_UNSUPPORTED => {
                return Err(RunError::Unsupported {
                    node: node.name.clone(),
                    reason: format!("plugin `{}`: {}", self.lib.label, buffer_message(&error)),
                });
            }
            KILN_STATUS_ERROR => return Err(node_err(buffer_message(&error))),
            other => return Err(node_err(format!("unknown status {other}: {}", buffer_message(&error)))),
        }
        if let Some(m) = collector.refused {
            return Err(node_err(format!("reported success after an output allocation was refused: {m}")));
        }
        if collector.outputs.is_empty() && matches!(node.kind, NodeKind::Op(_)) {
            return Err(node_err("reported success but produced no outputs".into()));
        }
        let mut outputs = Vec::with_capacity(collector.outputs.len());
        for out in collector.outputs {
            outputs.push(out.finish());
        }
        let c = args.counters;
        Ok(RunResult {
            outputs,
            state,
            counters: Counters {
                reused_prefix_len: c.reused_prefix_len,
                compute_steps: c.compute_steps,
                tokens_sent: c.tokens_sent,
                tokens_saved: c.tokens_saved,
                used_cached_state: c.used_cached_state != 0,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_codes_round_trip_and_match_declaration_order() {
        for (i, d) in DType::ALL.into_iter().enumerate() {
            assert_eq!(dtype_code(d), i as u32);
            assert_eq!(dtype_from_code(dtype_code(d)), Some(d));
        }
        assert_eq!(dtype_from_code(DType::ALL.len() as u32), None);
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let Err(err) = load_plugin(Path::new("/nonexistent/libnope.so")) else { panic!("loaded a missing file") };
        assert!(matches!(&err, RunError::Plugin { message, .. } if message.contains("no such file")), "{err}");
    }

    #[test]
    fn attrs_json_is_the_documented_serde_form() {
        use kiln_ir::Op;
        use kiln_ir::op::{BinaryOp, Reduce, ReduceKind, Softmax};
        let sum = Reduce { kind: ReduceKind::Sum, axes: vec![1], keep_dims: false };
        let cases = [
            (Node::op("r", Op::Reduce(sum)), r#"{"op":"reduce","attrs":{"kind":"Sum","axes":[1],"keep_dims":false}}"#),
            (Node::op("s", Op::Softmax(Softmax { axis: -1 })), r#"{"op":"softmax","attrs":{"axis":-1}}"#),
            (Node::op("a", Op::Binary(BinaryOp::Add)), r#"{"op":"binary","attrs":"Add"}"#),
            (Node::op("m", Op::MatMul), r#"{"op":"mat_mul"}"#),
            (Node::token("t", "count", true, 2), r#"{"model":"count"}"#),
        ];
        for (node, want) in cases {
            assert_eq!(attrs_json(&node).unwrap(), want);
        }
    }

    #[test]
    fn output_collector_checks_order_dtype_and_size() {
        let mut c = OutputCollector::default();
        let shape = [2i64, 3];
        assert!(c.allocate(1, KILN_DTYPE_F32, 2, shape.as_ptr()).unwrap_err().contains("next output is 0"));
        assert!(c.allocate(0, 42, 2, shape.as_ptr()).unwrap_err().contains("unknown dtype code 42"));
        let neg = [-1i64];
        assert!(c.allocate(0, KILN_DTYPE_F32, 1, neg.as_ptr()).unwrap_err().contains("negative extent"));
        let huge = [i64::MAX, i64::MAX];
        assert!(c.allocate(0, KILN_DTYPE_F32, 2, huge.as_ptr()).is_err());
        assert!(c.allocate(0, KILN_DTYPE_F32, 2, std::ptr::null()).unwrap_err().contains("null shape"));
        let p = c.allocate(0, KILN_DTYPE_F32, 2, shape.as_ptr()).unwrap();
        assert!(!p.is_null());
        assert_eq!(c.outputs[0].tensor, Tensor::zeros(DType::F32, vec![2, 3]));
        let p = c.allocate(1, KILN_DTYPE_BOOL, 0, std::ptr::null()).unwrap();
        assert!(!p.is_null() && c.outputs[1].is_bool && c.outputs[1].tensor.dtype() == DType::U8);
        // SAFETY: the buffer holds the one u8 element just allocated; a plugin may write any byte there.
        unsafe { *p.cast::<u8>() = 7 };
        let empty = [0i64, 5];
        assert!(!c.allocate(2, KILN_DTYPE_I64, 2, empty.as_ptr()).unwrap().is_null());
        assert!(c.outputs[2].tensor.is_empty());
        let finished: Vec<Tensor> = c.outputs.into_iter().map(OutputBuffer::finish).collect();
        assert_eq!(finished[1], Tensor::scalar(true), "any non-zero byte is true");
        assert_eq!(finished[2].shape(), &[0, 5]);
    }
}
