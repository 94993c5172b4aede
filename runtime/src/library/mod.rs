//! Native CPU implementations of the ops the fuse pass leaves to library calls: `matmul`, `conv`,
//! `conv_transpose` and `pool`, and `matmul` over weights prepacked at load time ([`PackedB`]).
//!
//! The CPU runtime calls these on raw row-major buffers. Every function checks its slice lengths and shapes
//! against each other and against the op's shape rule up front and answers [`LibraryError`] on any mismatch, so
//! a bad call never panics or reads out of bounds. Results match `kiln_ir::interp::eval_op` up to summation order.
//!
//! Parallelism is the caller's: a call runs inside the caller's rayon pool and uses at most [`Par::threads`]
//! workers of it; with one thread nothing is spawned. A library group's elementwise epilogue is passed as an
//! [`Epilogue`] that each call runs on finished output blocks while they are still in cache.

/// Defines `fn $name(args) -> ret` that runs `$fast(args)` compiled for AVX-512F, or for AVX2 with FMA — whichever
/// is the widest this CPU has, checked at run time — and `$base(args)` compiled for the baseline otherwise.
/// `$fast` and `$base` must be `#[inline(always)]` so that their loops are compiled with the chosen features.
macro_rules! widest_vectors {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $fast:expr, $base:expr;) => {
        $(#[$m])*
        fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $fast($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $fast($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F (checked just above).
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has AVX2 and FMA (checked just above).
                    return unsafe { avx2($($arg),*) };
                }
            }
            $base($($arg),*)
        }
    };
}

mod conv;
mod conv_transpose;
mod dynquant;
mod matmul;
mod packed;
mod pool;
mod quant;
mod rnn;
mod softmax;
mod topk;
mod vmath;
mod winograd;

pub use conv::{conv_f32, conv_integer, conv_integer_packed};
pub use conv_transpose::conv_transpose_f32;
pub use dynquant::dynamic_quantize_u8;
pub use matmul::{BatchPlan, batch_plan, gemm_f32, matmul_f32, matmul_f64};
pub use packed::{PACKED_MAX_ROWS, PANEL, PackedB, matmul_packed_f32, prefer_packed};
pub use pool::pool_f32;
pub use quant::{Int8, PackedConvInt8, PackedInt8, matmul_integer, matmul_integer_packed};
pub use rnn::{RnnPacked, RnnShape, gru_f32, lstm_f32};
pub use softmax::softmax_f32;
pub use topk::top_k_f32;
pub use winograd::{WinogradWeights, conv_winograd_f32, winograd_applies, winograd_pays};

use kiln_ir::DType;
use kiln_ir::op::{Op, PoolKind};

/// How much parallelism a library call may use: it runs inside the caller's rayon pool; `threads` is that pool's
/// size (1 = run serially, never spawn).
#[derive(Copy, Clone, Debug)]
pub struct Par {
    /// Workers the call may occupy; 0 is treated as 1.
    pub threads: usize,
}

impl Par {
    /// One thread: the call runs on the caller's thread and spawns nothing.
    pub const SERIAL: Par = Par { threads: 1 };

    /// Whether the call may fan out to other workers.
    fn parallel(self) -> bool {
        self.threads > 1
    }
}

thread_local! {
    /// The scratch of the last call on this thread that needed one (im2col's column matrix, Winograd's transformed
    /// tiles and products), kept to save allocating — and faulting in — megabytes per call.
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs `f` on a scratch buffer of `len` floats (contents unspecified). The buffer is taken out of the
/// thread-local slot while in use, so a nested call on the same thread (rayon work stealing inside `gemm`) gets a
/// fresh one instead of aliasing it.
fn with_scratch(len: usize, f: impl FnOnce(&mut [f32])) {
    let mut buf = SCRATCH.with(std::cell::Cell::take);
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    f(&mut buf[..len]);
    SCRATCH.with(|s| s.set(buf));
}

/// A library call's failure (unsupported dtype/attribute combination, bad shapes) — names the op.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LibraryError {
    /// The op has no library implementation for this dtype or attribute combination.
    #[error("{op}: no library implementation for {what}")]
    Unsupported {
        /// The op's mnemonic (`matmul`, `conv`, `pool`, …).
        op: &'static str,
        /// What is unsupported, e.g. `dtype i32`.
        what: String,
    },
    /// Shapes, slice lengths or attributes are inconsistent with each other.
    #[error("{op}: {message}")]
    Shape {
        /// The op's mnemonic.
        op: &'static str,
        /// What disagrees, with the values involved.
        message: String,
    },
}

impl LibraryError {
    fn shape(op: &'static str, message: impl Into<String>) -> LibraryError {
        LibraryError::Shape { op, message: message.into() }
    }
}

/// Epilogue hook: called on each finished block of output rows while it is hot in cache:
/// (flat element offset of the block start in the output, the block as a mutable slice). May be a no-op.
///
/// Every output element is passed exactly once, in blocks that never overlap; blocks may arrive in any order and
/// from any worker of the pool.
pub type Epilogue<'a> = &'a (dyn Fn(usize, &mut [f32]) + Sync);

/// Whether a library implementation exists for `op` on operands of `dtype`, as the runtime asks before it plans a
/// library call. `Ok` means the matching `*_f32`/`*_f64` function accepts the call (shape errors aside).
pub fn supported(op: &Op, dtype: DType) -> Result<(), LibraryError> {
    let unsupported = |op: &'static str, what: String| Err(LibraryError::Unsupported { op, what });
    match op {
        Op::MatMul => match dtype {
            DType::F32 | DType::F64 => Ok(()),
            other => unsupported("matmul", format!("dtype {other}")),
        },
        Op::Conv(_) => match dtype {
            DType::F32 => Ok(()),
            other => unsupported("conv", format!("dtype {other}")),
        },
        Op::ConvTranspose(_) => match dtype {
            DType::F32 => Ok(()),
            other => unsupported("conv_transpose", format!("dtype {other}")),
        },
        Op::Pool(p) => match (dtype, p.kind) {
            (DType::F32, PoolKind::Max | PoolKind::Avg) => Ok(()),
            (other, _) => unsupported("pool", format!("dtype {other}")),
        },
        other => unsupported(other.mnemonic(), "this op (not a library op)".to_string()),
    }
}

/// The checks a convolution-like call (`conv`, `conv_transpose`) makes before anything else: `x` and `w` of one
/// rank ≥ 3 (`w_layout` names `w`'s dims in the message), the three slices as long as their shapes, and the
/// strides, dilations (≥ 1 each) and pads (≥ 0; all begins, then all ends) one per spatial dim, as `usize`.
#[allow(clippy::too_many_arguments)]
fn window_attrs(
    op: &'static str,
    w_layout: &str,
    (x_len, x_shape): (usize, &[usize]),
    (w_len, w_shape): (usize, &[usize]),
    (y_len, y_shape): (usize, &[usize]),
    strides: &[i64],
    dilations: &[i64],
    pads: &[i64],
) -> Result<[Vec<usize>; 3], LibraryError> {
    let rank = x_shape.len();
    if rank < 3 || w_shape.len() != rank {
        return Err(LibraryError::shape(
            op,
            format!("needs x[N,C,*] and w[{w_layout},*] of one rank ≥ 3, got {x_shape:?} and {w_shape:?}"),
        ));
    }
    check_len(op, "x", x_len, x_shape)?;
    check_len(op, "w", w_len, w_shape)?;
    check_len(op, "y", y_len, y_shape)?;
    let sp = rank - 2;
    Ok([
        attr_usizes(op, "strides", strides, sp, 1)?,
        attr_usizes(op, "dilations", dilations, sp, 1)?,
        attr_usizes(op, "pads", pads, 2 * sp, 0)?,
    ])
}

/// Checks that a buffer of `len` elements holds a tensor of `shape`; `what` names the operand.
fn check_len(op: &'static str, what: &str, len: usize, shape: &[usize]) -> Result<usize, LibraryError> {
    let want = element_count(op, what, shape)?;
    if len != want {
        return Err(LibraryError::shape(op, format!("{what} has {len} elements but shape {shape:?} needs {want}")));
    }
    Ok(want)
}

/// The element count of `shape`, or an error if it overflows `usize`.
fn element_count(op: &'static str, what: &str, shape: &[usize]) -> Result<usize, LibraryError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| LibraryError::shape(op, format!("{what} shape {shape:?} overflows the address space")))
}

/// Converts non-negative `i64` attributes to `usize`; `min` is the smallest allowed value.
fn attr_usizes(op: &'static str, name: &str, v: &[i64], len: usize, min: i64) -> Result<Vec<usize>, LibraryError> {
    if v.len() != len {
        return Err(LibraryError::shape(op, format!("{name} has {} entries for {len} spatial dims", v.len())));
    }
    v.iter()
        .map(|&x| {
            if x < min {
                Err(LibraryError::shape(op, format!("{name} {v:?} must be at least {min}")))
            } else {
                usize::try_from(x).map_err(|_| LibraryError::shape(op, format!("{name} {v:?} is out of range")))
            }
        })
        .collect()
}

/// Row-major strides of `shape` in elements.
fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Splits `row` into its `stride` phases: `phases[p·phase_len + j] = row[j·stride + p]` (`phase_len` at least
/// `row.len().div_ceil(stride)`), so that a strided run of the row becomes a contiguous run of one phase: the run
/// from row index `first` starts at phase index [`phase_start`]. Always inlined, so that it is compiled with the
/// vector features of its caller.
#[inline(always)]
fn split_phases(row: &[f32], stride: usize, phase_len: usize, phases: &mut [f32]) {
    if stride == 2 {
        // The common case, written so that it compiles to shuffles rather than a strided gather.
        let (even, odd) = phases.split_at_mut(phase_len);
        let pairs = row.chunks_exact(2);
        if let [last] = pairs.remainder() {
            even[row.len() / 2] = *last;
        }
        for ((e, o), pair) in even.iter_mut().zip(odd.iter_mut()).zip(pairs) {
            *e = pair[0];
            *o = pair[1];
        }
        return;
    }
    for p in 0..stride.min(row.len()) {
        for (d, &v) in phases[p * phase_len..].iter_mut().zip(row[p..].iter().step_by(stride)) {
            *d = v;
        }
    }
}

/// Where row index `first` lies in the phases written by [`split_phases`].
#[inline]
fn phase_start(first: usize, stride: usize, phase_len: usize) -> usize {
    (first % stride) * phase_len + first / stride
}
