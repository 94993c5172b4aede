//! `kiln-plugin-elementwise`: an example kiln backend plugin written in Rust, loaded as a shared library through
//! the C ABI (`runtime/include/kiln_backend.h`, `docs/plugins.md`).
//!
//! It runs f32 elementwise ops itself, over the raw tensor descriptors (any strides), without linking kiln:
//! binary `add`, `sub`, `mul`, `div` with numpy broadcasting, and unary `relu`, `neg`, `exp`, `tanh`, `sigmoid`.
//! Anything else (another op, another dtype, a token node) is answered with `KILN_STATUS_UNSUPPORTED` and a
//! message saying what.
//!
//! Every entry point catches panics (`std::panic::catch_unwind`) and turns them into `KILN_STATUS_ERROR`: a panic
//! must never unwind into the host (that would abort the process). **Containment test hook:** a node named
//! [`PANIC_HOOK_NODE`] makes `run` panic on purpose, so tests can check that the panic is contained and the host
//! keeps working. Real graphs never use that name. (This relies on unwinding: do not build the plugin with
//! `panic = "abort"`.)
//!
//! The ABI types come from the host's own `abi.rs`, compiled into this crate with `#[path]`, so both sides share
//! one definition; a plugin outside the kiln tree would copy that file (or bind the header with bindgen).

#[path = "../../../runtime/src/plugin/abi.rs"]
mod abi;

use std::ffi::{CStr, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use abi::*;

/// The node name that makes `run` panic deliberately — the panic-containment test hook (see the crate docs).
pub const PANIC_HOOK_NODE: &str = "__kiln_plugin_test_panic__";

/// The environment variable of the run-time failure test hook: when it holds a number N, every `run` call after
/// the first N fails with an error (so tests can check how a failing plugin inside a compiled model is reported).
pub const FAIL_AFTER_VAR: &str = "KILN_PLUGIN_ELEMENTWISE_FAIL_AFTER";

/// `run` calls so far, in this process (what [`kiln_plugin_elementwise_calls`] reports).
static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times kiln called `run` in this process: the plugin's own counter, so a test (or a curious user with
/// `dlsym`) can see that the host really placed nodes here.
#[unsafe(no_mangle)]
pub extern "C" fn kiln_plugin_elementwise_calls() -> u64 {
    CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

/// The failure hook's threshold, read once.
fn fail_after() -> Option<u64> {
    static AFTER: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *AFTER.get_or_init(|| std::env::var(FAIL_AFTER_VAR).ok().and_then(|v| v.trim().parse().ok()))
}

/// A plugin-owned string pointer in a `static` (raw pointers are not `Sync` on their own).
#[repr(transparent)]
struct StaticStr(*const c_char);
// SAFETY: points at a `'static`, immutable C string literal.
unsafe impl Sync for StaticStr {}

/// The vtable in a `static`.
#[repr(transparent)]
struct StaticVtable(KilnBackendVtable);
// SAFETY: the vtable is never mutated; its pointers are to `'static` immutable data and its functions are
// thread-safe (the plugin has no mutable state at all).
unsafe impl Sync for StaticVtable {}

static OPS: [StaticStr; 9] = [
    StaticStr(c"add".as_ptr()),
    StaticStr(c"sub".as_ptr()),
    StaticStr(c"mul".as_ptr()),
    StaticStr(c"div".as_ptr()),
    StaticStr(c"relu".as_ptr()),
    StaticStr(c"neg".as_ptr()),
    StaticStr(c"exp".as_ptr()),
    StaticStr(c"tanh".as_ptr()),
    StaticStr(c"sigmoid".as_ptr()),
];

static VTABLE: StaticVtable = StaticVtable(KilnBackendVtable {
    abi_version: KILN_BACKEND_ABI_VERSION,
    struct_size: std::mem::size_of::<KilnBackendVtable>() as u32,
    name: c"elementwise-rs".as_ptr(),
    tensor_backend_type: c"cpu".as_ptr(),
    capabilities: KILN_CAP_TENSOR,
    op_count: OPS.len() as u32,
    ops: OPS.as_ptr().cast::<*const c_char>(),
    instance: std::ptr::null_mut(),
    run: Some(run),
    export_state: None,
    import_state: None,
    release_state: None,
    destroy: None,
});

/// The plugin's entry point: kiln looks this symbol up and checks the vtable's version and size.
///
/// It also installs a one-line panic hook. A cdylib carries its own copy of `std`, so the hook covers panics in
/// this plugin only (they are caught and reported as errors anyway); the host's hook is untouched.
#[unsafe(no_mangle)]
pub extern "C" fn kiln_backend_entry(_host_abi_version: u32) -> *const KilnBackendVtable {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            eprintln!(
                "kiln-plugin-elementwise: {} (contained, reported to kiln as an error)",
                info.to_string().replace('\n', " ")
            )
        }))
    });
    &VTABLE.0
}

/// A failure to report: a status code and a message.
#[derive(Debug, PartialEq)]
pub struct Failure {
    /// `KILN_STATUS_ERROR` or `KILN_STATUS_UNSUPPORTED`.
    pub status: i32,
    /// What went wrong.
    pub message: String,
}

fn error(message: impl Into<String>) -> Failure {
    Failure { status: KILN_STATUS_ERROR, message: message.into() }
}

fn unsupported(message: impl Into<String>) -> Failure {
    Failure { status: KILN_STATUS_UNSUPPORTED, message: message.into() }
}

/// A strided f32 tensor view: element `(i0, i1, …)` is `data[Σ ik·strides[k]]`.
#[derive(Clone, Debug)]
pub struct View<'a> {
    /// Extents.
    pub shape: Vec<usize>,
    /// Strides in elements.
    pub strides: Vec<isize>,
    /// The elements reachable from the first one.
    pub data: &'a [f32],
}

/// Numpy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, Failure> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for k in 0..rank {
        let da = if k + a.len() >= rank { a[k + a.len() - rank] } else { 1 };
        let db = if k + b.len() >= rank { b[k + b.len() - rank] } else { 1 };
        out[k] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(error(format!("shapes {a:?} and {b:?} do not broadcast"))),
        };
    }
    Ok(out)
}

/// The strides with which `v` is read at each index of `out_shape` (0 along broadcast dims).
fn broadcast_strides(v: &View, out_shape: &[usize]) -> Vec<isize> {
    let shift = out_shape.len() - v.shape.len();
    (0..out_shape.len()).map(|k| if k < shift || v.shape[k - shift] == 1 { 0 } else { v.strides[k - shift] }).collect()
}

/// Applies `f` elementwise to `views` broadcast to `out_shape`, writing row-major into `out`.
fn map_broadcast(
    views: &[&View],
    out_shape: &[usize],
    out: &mut [f32],
    f: impl Fn(&[f32]) -> f32,
) -> Result<(), Failure> {
    let strides: Vec<Vec<isize>> = views.iter().map(|v| broadcast_strides(v, out_shape)).collect();
    let mut index = vec![0usize; out_shape.len()];
    let mut offsets = vec![0isize; views.len()];
    let mut args = vec![0f32; views.len()];
    for slot in out.iter_mut() {
        for (j, v) in views.iter().enumerate() {
            args[j] = usize::try_from(offsets[j])
                .ok()
                .and_then(|o| v.data.get(o).copied())
                .ok_or_else(|| error(format!("operand {j}: element offset {} lies outside its data", offsets[j])))?;
        }
        *slot = f(&args);
        // Odometer step: bump the last index, carrying into earlier dims.
        for k in (0..out_shape.len()).rev() {
            index[k] += 1;
            for (j, s) in strides.iter().enumerate() {
                offsets[j] += s[k];
            }
            if index[k] < out_shape[k] {
                break;
            }
            for (j, s) in strides.iter().enumerate() {
                offsets[j] -= s[k] * index[k] as isize;
            }
            index[k] = 0;
        }
    }
    Ok(())
}

/// The elementwise function of a binary mnemonic.
fn binary_fn(kind: &str) -> Option<fn(f32, f32) -> f32> {
    Some(match kind {
        "add" => |a, b| a + b,
        "sub" => |a, b| a - b,
        "mul" => |a, b| a * b,
        "div" => |a, b| a / b,
        _ => return None,
    })
}

/// The elementwise function of a unary mnemonic (the interpreter's definitions).
fn unary_fn(kind: &str) -> Option<fn(f32) -> f32> {
    Some(match kind {
        "relu" => |x: f32| if x.is_nan() || x > 0.0 { x } else { 0.0 },
        "neg" => |x: f32| -x,
        "exp" => f32::exp,
        "tanh" => f32::tanh,
        "sigmoid" => |x: f32| 1.0 / (1.0 + (-x).exp()),
        _ => return None,
    })
}

/// Runs op `kind` on `inputs`; `alloc` is given the output's shape and returns the buffer to fill.
pub fn compute<'o>(
    kind: &str,
    inputs: &[View],
    alloc: impl FnOnce(&[usize]) -> Result<&'o mut [f32], Failure>,
) -> Result<(), Failure> {
    let arity = |n: usize| {
        if inputs.len() == n {
            Ok(())
        } else {
            Err(error(format!("{kind} takes {n} operand(s), got {}", inputs.len())))
        }
    };
    if let Some(f) = binary_fn(kind) {
        arity(2)?;
        let shape = broadcast_shapes(&inputs[0].shape, &inputs[1].shape)?;
        let out = alloc(&shape)?;
        map_broadcast(&[&inputs[0], &inputs[1]], &shape, out, |a| f(a[0], a[1]))
    } else if let Some(f) = unary_fn(kind) {
        arity(1)?;
        let shape = inputs[0].shape.clone();
        let out = alloc(&shape)?;
        map_broadcast(&[&inputs[0]], &shape, out, |a| f(a[0]))
    } else {
        Err(unsupported(format!(
            "op `{kind}` is not one of this plugin's (add, sub, mul, div, relu, neg, exp, tanh, sigmoid)"
        )))
    }
}

/// Reads a C string argument.
///
/// # Safety
/// `p` is null or a NUL-terminated string valid for `'a`.
unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(error(format!("{what} is null")));
    }
    // SAFETY: non-null, NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| error(format!("{what} is not UTF-8")))
}

/// Builds a view of descriptor `d`, checking dtype, shape and data.
///
/// # Safety
/// `d` follows the ABI: `shape`/`strides` hold `rank` entries, `data` has `byte_len` readable bytes.
unsafe fn view<'a>(i: usize, d: &KilnTensorDesc) -> Result<View<'a>, Failure> {
    if d.dtype != KILN_DTYPE_F32 {
        return Err(unsupported(format!("operand {i}: dtype code {} is not f32 (this plugin is f32-only)", d.dtype)));
    }
    let rank = d.rank as usize;
    if rank > 0 && (d.shape.is_null() || d.strides.is_null()) {
        return Err(error(format!("operand {i}: null shape or strides")));
    }
    let (shape, strides): (&[i64], &[i64]) = if rank == 0 {
        (&[], &[])
    } else {
        // SAFETY: `rank` entries each, non-null (checked).
        unsafe { (std::slice::from_raw_parts(d.shape, rank), std::slice::from_raw_parts(d.strides, rank)) }
    };
    let shape: Vec<usize> = shape
        .iter()
        .map(|&e| usize::try_from(e).map_err(|_| error(format!("operand {i}: negative extent {e}"))))
        .collect::<Result<_, _>>()?;
    let strides: Vec<isize> = strides.iter().map(|&s| s as isize).collect();
    let len = (d.byte_len / 4) as usize;
    let data: &[f32] = if len == 0 || d.data.is_null() {
        &[]
    } else if !(d.data as usize).is_multiple_of(std::mem::align_of::<f32>()) {
        return Err(error(format!("operand {i}: data is not 4-byte aligned")));
    } else {
        // SAFETY: `byte_len` bytes are readable from the aligned, non-null `data` for the call.
        unsafe { std::slice::from_raw_parts(d.data.cast::<f32>(), len) }
    };
    Ok(View { shape, strides, data })
}

/// `run` without the panic guard.
///
/// # Safety
/// `args` follows the ABI.
unsafe fn run_checked(args: &mut KilnRunArgs) -> Result<(), Failure> {
    if args.struct_size as usize != std::mem::size_of::<KilnRunArgs>() {
        return Err(error(format!(
            "run args are {} bytes, this plugin was built for {}",
            args.struct_size,
            std::mem::size_of::<KilnRunArgs>()
        )));
    }
    // SAFETY: the ABI's strings are NUL-terminated and live for the call.
    let (kind, node) = unsafe { (c_str(args.kind, "kind")?, c_str(args.node_name, "node name")?) };
    if node == PANIC_HOOK_NODE {
        panic!("deliberate panic for node `{node}` (the containment test hook)");
    }
    if kind == "token" {
        return Err(unsupported("token nodes are not supported"));
    }
    let descs: &[KilnTensorDesc] = if args.input_count == 0 {
        &[]
    } else if args.inputs.is_null() {
        return Err(error("inputs is null"));
    } else {
        // SAFETY: `input_count` descriptors, borrowed for the call.
        unsafe { std::slice::from_raw_parts(args.inputs, args.input_count as usize) }
    };
    let views: Vec<View> = descs
        .iter()
        .enumerate()
        // SAFETY: each descriptor follows the ABI.
        .map(|(i, d)| unsafe { view(i, d) })
        .collect::<Result<_, _>>()?;
    if args.outputs.is_null() {
        return Err(error("no output sink"));
    }
    // SAFETY: non-null, host-owned for the call.
    let sink = unsafe { *args.outputs };
    let alloc_fn = sink.alloc.ok_or_else(|| error("the output sink has no allocator"))?;
    compute(kind, &views, |shape| {
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let n: usize = shape.iter().product();
        // SAFETY: calling the host's allocator with its own context and `dims.len()` extents.
        let p = unsafe { alloc_fn(sink.ctx, 0, KILN_DTYPE_F32, dims.len() as u32, dims.as_ptr()) };
        if p.is_null() {
            return Err(error(format!("the host refused an f32 output of shape {shape:?}")));
        }
        if n == 0 {
            return Ok(&mut []);
        }
        // SAFETY: the host allocated `n` zeroed, aligned f32 slots for us until `run` returns.
        Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<f32>(), n) })
    })
}

/// Copies `message` into the host's error buffer, truncated and NUL-terminated.
///
/// # Safety
/// `buf` is null or has `cap` writable bytes.
unsafe fn write_error(buf: *mut c_char, cap: u64, message: &str) {
    if buf.is_null() || cap == 0 {
        return;
    }
    let n = message.len().min(cap as usize - 1);
    // SAFETY: `n + 1 <= cap` bytes are written into the host's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(message.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
}

/// The ABI's `run`.
unsafe extern "C" fn run(_instance: *mut c_void, args: *mut KilnRunArgs) -> i32 {
    if args.is_null() {
        return KILN_STATUS_ERROR;
    }
    // SAFETY: non-null and host-owned for the call.
    let args = unsafe { &mut *args };
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if fail_after().is_some_and(|n| call >= n) {
        // SAFETY: the host's buffer of `error_cap` bytes.
        unsafe {
            write_error(
                args.error,
                args.error_cap,
                &format!("failing on purpose after {call} calls ({FAIL_AFTER_VAR})"),
            )
        };
        return KILN_STATUS_ERROR;
    }
    // SAFETY: `args` follows the ABI.
    let outcome = catch_unwind(AssertUnwindSafe(|| unsafe { run_checked(args) }));
    let failure = match outcome {
        Ok(Ok(())) => return KILN_STATUS_OK,
        Ok(Err(f)) => f,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string());
            error(format!("panicked: {what}"))
        }
    };
    // SAFETY: the host's buffer of `error_cap` bytes.
    unsafe { write_error(args.error, args.error_cap, &failure.message) };
    failure.status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_kind(kind: &str, inputs: &[View]) -> Result<(Vec<usize>, Vec<f32>), Failure> {
        let mut buf = Vec::new();
        let mut shape = Vec::new();
        let mut storage = vec![0f32; 64];
        compute(kind, inputs, |s| {
            shape = s.to_vec();
            let n: usize = s.iter().product();
            Ok(&mut storage[..n])
        })?;
        buf.extend_from_slice(&storage[..shape.iter().product()]);
        Ok((shape, buf))
    }

    #[test]
    fn strided_and_broadcast_operands() {
        // a = [[0,1,2],[3,4,5]] stored transposed (column-major): strides [1, 2].
        let col_major = [0.0f32, 3.0, 1.0, 4.0, 2.0, 5.0];
        let a = View { shape: vec![2, 3], strides: vec![1, 2], data: &col_major };
        let b = View { shape: vec![3], strides: vec![1], data: &[10.0, 20.0, 30.0] };
        let (shape, out) = run_kind("add", &[a.clone(), b]).unwrap();
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(out, vec![10.0, 21.0, 32.0, 13.0, 24.0, 35.0]);
        let col = View { shape: vec![2, 1], strides: vec![1, 1], data: &[1.0, 2.0] };
        let (shape, out) = run_kind("mul", &[col, a.clone()]).unwrap();
        assert_eq!((shape, out), (vec![2, 3], vec![0.0, 1.0, 2.0, 6.0, 8.0, 10.0]));
        let (_, out) = run_kind("neg", &[a]).unwrap();
        assert_eq!(out, vec![-0.0, -1.0, -2.0, -3.0, -4.0, -5.0]);
    }

    #[test]
    fn bad_requests_are_failures() {
        let a = View { shape: vec![2], strides: vec![1], data: &[1.0, 2.0] };
        let b = View { shape: vec![3], strides: vec![1], data: &[1.0, 2.0, 3.0] };
        assert!(run_kind("add", &[a.clone(), b]).unwrap_err().message.contains("do not broadcast"));
        assert_eq!(run_kind("matmul", std::slice::from_ref(&a)).unwrap_err().status, KILN_STATUS_UNSUPPORTED);
        assert!(run_kind("relu", &[a.clone(), a.clone()]).unwrap_err().message.contains("takes 1 operand"));
        let short = View { shape: vec![4], strides: vec![1], data: &[1.0, 2.0] };
        assert!(run_kind("exp", &[short]).unwrap_err().message.contains("outside its data"));
    }
}
