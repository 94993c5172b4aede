//! The C ABI between kiln and backend plugins, version [`KILN_BACKEND_ABI_VERSION`]: the same `#[repr(C)]`
//! types and constants as `runtime/include/kiln_backend.h`, field for field and in the same order.
//!
//! This file is self-contained (it names only `std::ffi` types) so that a Rust plugin can compile it into itself
//! with `#[path = ".../abi.rs"] mod abi;` — the workspace's example plugin does — instead of linking kiln.
//! Ownership and threading rules are stated on each item and, with examples, in `docs/plugins.md`.
//!
//! Nullable function pointers are `Option<unsafe extern "C" fn …>`: Rust guarantees that `None` is the null
//! pointer, so the layout is that of a C function pointer.

#![allow(dead_code)]

use std::ffi::{c_char, c_void};

/// The ABI version this file describes. The host loads plugins of every version from
/// [`KILN_BACKEND_ABI_MIN_VERSION`] to this one and speaks each plugin's own version to it; any other is refused.
/// Any change to a struct's layout or to a function's meaning bumps it. Version 2 passes the host's version to
/// the entry point, gives `remaining_tokens` the seed's meaning (prompt tokens the prefix state does not cover)
/// and moves the tokens to generate to [`KilnRunArgs::max_new_tokens`].
pub const KILN_BACKEND_ABI_VERSION: u32 = 2;

/// The oldest plugin ABI version the host still loads.
pub const KILN_BACKEND_ABI_MIN_VERSION: u32 = 1;

/// `sizeof(kiln_run_args)` of ABI version 1 (everything before [`KilnRunArgs::max_new_tokens`]): what a
/// version-1 plugin is told in `struct_size`.
pub const KILN_RUN_ARGS_V1_SIZE: u32 = std::mem::offset_of!(KilnRunArgs, max_new_tokens) as u32;

/// The one symbol a plugin exports: a [`KilnEntryFn`] named `kiln_backend_entry` (NUL-terminated here).
pub const KILN_BACKEND_ENTRY_SYMBOL: &[u8] = b"kiln_backend_entry\0";

/// Status: the call succeeded.
pub const KILN_STATUS_OK: i32 = 0;
/// Status: the call failed; the plugin wrote a message into the error buffer.
pub const KILN_STATUS_ERROR: i32 = 1;
/// Status: the plugin cannot do this (an op or dtype it does not handle, a state it cannot export); the error
/// buffer says what.
pub const KILN_STATUS_UNSUPPORTED: i32 = 2;

/// Capability flag: runs tensor-op nodes (those named in `ops`, or all with [`KILN_CAP_ALL_OPS`]).
pub const KILN_CAP_TENSOR: u32 = 1 << 0;
/// Capability flag: runs token nodes.
pub const KILN_CAP_TOKEN: u32 = 1 << 1;
/// Capability flag: resumes token nodes from a prefix state.
pub const KILN_CAP_CACHE: u32 = 1 << 2;
/// Capability flag: `export_state`/`import_state` round-trip states.
pub const KILN_CAP_STATE_EXPORT: u32 = 1 << 3;
/// Capability flag: every tensor op (the `ops` list is then ignored).
pub const KILN_CAP_ALL_OPS: u32 = 1 << 4;

/// Dtype code of `f32`.
pub const KILN_DTYPE_F32: u32 = 0;
/// Dtype code of `f16`.
pub const KILN_DTYPE_F16: u32 = 1;
/// Dtype code of `bf16`.
pub const KILN_DTYPE_BF16: u32 = 2;
/// Dtype code of `f64`.
pub const KILN_DTYPE_F64: u32 = 3;
/// Dtype code of `i8`.
pub const KILN_DTYPE_I8: u32 = 4;
/// Dtype code of `u8`.
pub const KILN_DTYPE_U8: u32 = 5;
/// Dtype code of `i32`.
pub const KILN_DTYPE_I32: u32 = 6;
/// Dtype code of `i64`.
pub const KILN_DTYPE_I64: u32 = 7;
/// Dtype code of `bool` (one byte per element, 0 or 1).
pub const KILN_DTYPE_BOOL: u32 = 8;
/// Dtype code of `i16`.
pub const KILN_DTYPE_I16: u32 = 9;
/// Dtype code of `u16`.
pub const KILN_DTYPE_U16: u32 = 10;
/// Dtype code of `u32`.
pub const KILN_DTYPE_U32: u32 = 11;
/// Dtype code of `u64`.
pub const KILN_DTYPE_U64: u32 = 12;
/// Dtype code of `f8e4m3fn`, one element per byte.
pub const KILN_DTYPE_F8E4M3FN: u32 = 13;
/// Dtype code of `f8e4m3fnuz`, one element per byte.
pub const KILN_DTYPE_F8E4M3FNUZ: u32 = 14;
/// Dtype code of `f8e5m2`, one element per byte.
pub const KILN_DTYPE_F8E5M2: u32 = 15;
/// Dtype code of `f8e5m2fnuz`, one element per byte.
pub const KILN_DTYPE_F8E5M2FNUZ: u32 = 16;
/// Dtype code of `f8e8m0`, one element per byte.
pub const KILN_DTYPE_F8E8M0: u32 = 17;
/// Dtype code of `f4e2m1 (low nibble)`, one element per byte.
pub const KILN_DTYPE_F4E2M1: u32 = 18;
/// Dtype code of `i4 (sign-extended)`, one element per byte.
pub const KILN_DTYPE_I4: u32 = 19;
/// Dtype code of `u4`, one element per byte.
pub const KILN_DTYPE_U4: u32 = 20;
/// Dtype code of `i2 (sign-extended)`, one element per byte.
pub const KILN_DTYPE_I2: u32 = 21;
/// Dtype code of `u2`, one element per byte.
pub const KILN_DTYPE_U2: u32 = 22;

/// One input tensor, borrowed by the plugin for the duration of one `run` call.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct KilnTensorDesc {
    /// A `KILN_DTYPE_*` code.
    pub dtype: u32,
    /// Number of dims (0 for a scalar).
    pub rank: u32,
    /// `rank` extents (may be null when `rank` is 0).
    pub shape: *const i64,
    /// `rank` strides in elements (not bytes); element `(i0, i1, …)` is at `data + Σ ik·strides[k]` elements.
    /// Today's host passes row-major contiguous strides, but plugins must honour whatever is given.
    pub strides: *const i64,
    /// The first element; little-endian host order. Null only when the tensor has no elements.
    pub data: *const c_void,
    /// Bytes readable from `data`: every element the shape and strides reach lies inside.
    pub byte_len: u64,
}

/// Counters a `run` reports (see `kiln_runtime::contract::Counters`); the host zeroes them before the call.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct KilnCounters {
    /// Prompt tokens covered by the prefix state that was used.
    pub reused_prefix_len: u32,
    /// Model invocations.
    pub compute_steps: u32,
    /// Tokens fed to the model.
    pub tokens_sent: u32,
    /// Tokens not fed thanks to the prefix state.
    pub tokens_saved: u32,
    /// Non-zero when a prefix state was used.
    pub used_cached_state: u32,
}

/// Host callback that allocates output `index` (outputs are allocated in order 0, 1, 2, … exactly once each) of
/// `dtype` with `rank` extents at `shape`, zero-filled and aligned for `dtype`. Returns the buffer to write the row-major contiguous
/// elements into — owned by the host, valid until `run` returns, never to be freed by the plugin — or null when
/// the request is refused (out of order, a bad dtype or shape, too large); the plugin then returns an error.
/// For a zero-element output the pointer is non-null but points at nothing: write nothing through it.
pub type KilnAllocOutputFn =
    unsafe extern "C" fn(ctx: *mut c_void, index: u32, dtype: u32, rank: u32, shape: *const i64) -> *mut c_void;

/// Where a `run` puts its outputs: call `alloc(ctx, …)` once per output.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct KilnOutputSink {
    /// Host context, passed back unchanged.
    pub ctx: *mut c_void,
    /// The allocator (never null when the host passes a sink).
    pub alloc: Option<KilnAllocOutputFn>,
}

/// Host callback that allocates `len` bytes for an exported state; same ownership as [`KilnAllocOutputFn`]
/// (host-owned, valid until `export_state` returns; null when refused). Call it at most once.
pub type KilnAllocBytesFn = unsafe extern "C" fn(ctx: *mut c_void, len: u64) -> *mut u8;

/// Where `export_state` puts the state's bytes.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct KilnByteSink {
    /// Host context, passed back unchanged.
    pub ctx: *mut c_void,
    /// The allocator (never null).
    pub alloc: Option<KilnAllocBytesFn>,
}

/// Everything one `run` call gets and gives back. The host owns the struct; fields marked *out* start zeroed /
/// null and are written by the plugin.
#[repr(C)]
#[derive(Debug)]
pub struct KilnRunArgs {
    /// `sizeof(KilnRunArgs)` as the host compiled it; a plugin may refuse a size it does not know.
    pub struct_size: u32,
    /// Entries in `inputs`.
    pub input_count: u32,
    /// Token nodes: how many prompt tokens the prefix state does not cover (version 1 plugins: how many tokens to
    /// generate). Tensor nodes: 0.
    pub remaining_tokens: u32,
    /// *out*: the run's counters.
    pub counters: KilnCounters,
    /// The node's name, for messages (NUL-terminated UTF-8, borrowed for the call).
    pub node_name: *const c_char,
    /// The node's kind: an op mnemonic (`add`, `matmul`, `softmax`, …) or `token`.
    pub kind: *const c_char,
    /// The node's attributes as JSON: for an op, kiln's serde form of `ir::Op` (`{"op":"softmax","attrs":
    /// {"axis":-1}}`, `{"op":"binary","attrs":"Add"}`, `{"op":"mat_mul"}`); for a token node, `{"model":"NAME"}`.
    pub attrs_json: *const c_char,
    /// `input_count` input descriptors, borrowed for the call.
    pub inputs: *const KilnTensorDesc,
    /// Where the outputs go.
    pub outputs: *const KilnOutputSink,
    /// A state this plugin returned earlier through `state_out` or `import_state`, or null: borrowed — the
    /// plugin must not release it, and the host keeps it alive during the call.
    pub prefix_state: *mut c_void,
    /// *out*: a new state after the run, or null. Ownership passes to the host, which calls `release_state` on
    /// it exactly once when it drops it (so a plugin returning states must provide `release_state`).
    pub state_out: *mut c_void,
    /// *out*: bytes held by `state_out`, for cache budgets.
    pub state_bytes: u64,
    /// *out*: tokens of prefix `state_out` covers.
    pub state_tokens: u64,
    /// Host-owned buffer for a NUL-terminated error message (truncate to fit).
    pub error: *mut c_char,
    /// Capacity of `error` in bytes, including the NUL.
    pub error_cap: u64,
    /// (Version 2.) Token nodes: how many tokens to generate. Tensor nodes: 0.
    pub max_new_tokens: u32,
    /// Zero.
    pub reserved: u32,
}

/// Runs one node. Returns a `KILN_STATUS_*` code; on anything but OK the host discards outputs and `state_out`
/// (a non-null `state_out` is still released). May be called from several threads at once.
pub type KilnRunFn = unsafe extern "C" fn(instance: *mut c_void, args: *mut KilnRunArgs) -> i32;

/// Externalizes `state` (borrowed) into bytes through `sink`. `KILN_STATUS_UNSUPPORTED` means "not portable".
pub type KilnExportStateFn = unsafe extern "C" fn(
    instance: *mut c_void,
    state: *mut c_void,
    sink: *const KilnByteSink,
    error: *mut c_char,
    error_cap: u64,
) -> i32;

/// Rebuilds a state from `len` bytes at `bytes` (borrowed); on OK writes the new state (owned by the host, as
/// with `state_out`) and its byte and token counts.
pub type KilnImportStateFn = unsafe extern "C" fn(
    instance: *mut c_void,
    bytes: *const u8,
    len: u64,
    state_out: *mut *mut c_void,
    state_bytes: *mut u64,
    state_tokens: *mut u64,
    error: *mut c_char,
    error_cap: u64,
) -> i32;

/// Frees a state the plugin handed to the host. Called exactly once per state, from any thread.
pub type KilnReleaseStateFn = unsafe extern "C" fn(instance: *mut c_void, state: *mut c_void);

/// Tears the plugin instance down. Called once, after every state has been released and before the library is
/// unloaded.
pub type KilnDestroyFn = unsafe extern "C" fn(instance: *mut c_void);

/// The first two fields of every vtable version: the host reads only these before it trusts the rest.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct KilnVtableHeader {
    /// [`KILN_BACKEND_ABI_VERSION`] of the header the plugin was built against.
    pub abi_version: u32,
    /// `sizeof(KilnBackendVtable)` as the plugin compiled it.
    pub struct_size: u32,
}

/// What `kiln_backend_entry` returns. The vtable, its strings and its op list stay valid and unchanged until
/// `destroy` is called (a `static` in the plugin is the usual choice); the host copies what it needs at load.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct KilnBackendVtable {
    /// The version the plugin speaks, from [`KILN_BACKEND_ABI_MIN_VERSION`] to [`KILN_BACKEND_ABI_VERSION`].
    pub abi_version: u32,
    /// Must be `sizeof(KilnBackendVtable)` of this version.
    pub struct_size: u32,
    /// The plugin's own name (NUL-terminated UTF-8, non-null), for messages.
    pub name: *const c_char,
    /// The tensor backend underneath (`cpu`, `cuda`), or null / empty.
    pub tensor_backend_type: *const c_char,
    /// `KILN_CAP_*` flags.
    pub capabilities: u32,
    /// Entries in `ops`.
    pub op_count: u32,
    /// `op_count` op mnemonics (NUL-terminated), when `KILN_CAP_TENSOR` is set without `KILN_CAP_ALL_OPS`.
    pub ops: *const *const c_char,
    /// The plugin's instance pointer, passed as the first argument of every function below.
    pub instance: *mut c_void,
    /// Runs a node (required).
    pub run: Option<KilnRunFn>,
    /// Optional (null: states are not portable).
    pub export_state: Option<KilnExportStateFn>,
    /// Optional (null: states are not portable).
    pub import_state: Option<KilnImportStateFn>,
    /// Required when `run` or `import_state` ever return a state; otherwise may be null.
    pub release_state: Option<KilnReleaseStateFn>,
    /// Optional teardown.
    pub destroy: Option<KilnDestroyFn>,
}

/// The type of `kiln_backend_entry`: receives the host's [`KILN_BACKEND_ABI_VERSION`] and returns the vtable, or
/// null when the plugin cannot serve this host or cannot initialize. (A version-1 entry takes no argument;
/// calling it with one is harmless in the C calling conventions kiln runs on.)
pub type KilnEntryFn = unsafe extern "C" fn(host_abi_version: u32) -> *const KilnBackendVtable;
