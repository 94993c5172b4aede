//! `matmul` on f32 and f64 through the `gemm` crate, and the row-major gemm call `conv` shares.
//!
//! Batch dims broadcast by index mapping: each result batch reads its operands at precomputed offsets, with
//! broadcast dims contributing nothing, so no operand is ever copied. When only the left operand carries batch
//! dims (`[.., m, k] · [k, n]`, every linear layer) the batches fold into one tall product.

use rayon::prelude::*;

use super::{Epilogue, LibraryError, Par, check_len, element_count, strides_of};

const OP: &str = "matmul";

/// Products below this many multiply-adds run on one thread: splitting them costs more than it saves.
const PARALLEL_WORK: usize = 1 << 18;

/// The element types `gemm` multiplies here.
pub(super) trait GemmScalar: Copy + Send + Sync + 'static {
    /// Additive identity.
    const ZERO: Self;
    /// Multiplicative identity.
    const ONE: Self;
}

impl GemmScalar for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
}

impl GemmScalar for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
}

/// An epilogue over any element type; [`Epilogue`] is the f32 one.
type EpilogueOf<'a, T> = &'a (dyn Fn(usize, &mut [T]) + Sync);

/// `C[b] = A[b] · B[b]` with numpy broadcasting over batch dims; shapes as the interpreter's matmul (1-D operands
/// promoted as numpy does: `[k]` on the left is `[1, k]`, on the right `[k, 1]`, the unit dim dropped from the
/// result). `c` holds the result, row-major; `epilogue` runs once on every result element, in row blocks.
///
/// Errors if the shapes do not multiply or a slice length disagrees with its shape.
pub fn matmul_f32(
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    c: &mut [f32],
    epilogue: Option<Epilogue>,
    par: Par,
) -> Result<(), LibraryError> {
    matmul(a, a_shape, b, b_shape, c, epilogue, par)
}

/// [`matmul_f32`] on f64 operands (no epilogue: library epilogues are f32 code).
pub fn matmul_f64(
    a: &[f64],
    a_shape: &[usize],
    b: &[f64],
    b_shape: &[usize],
    c: &mut [f64],
    par: Par,
) -> Result<(), LibraryError> {
    matmul(a, a_shape, b, b_shape, c, None, par)
}

/// The batch layout of one matmul (numpy semantics: rank-1 operands promoted, batch dims broadcast): every
/// backend's matmul follows it, so broadcasting is decided in one place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchPlan {
    /// Rows of each product.
    pub m: usize,
    /// The contraction length.
    pub k: usize,
    /// Columns of each product.
    pub n: usize,
    /// Per result batch, in order: (offset into `a`, offset into `b`) in elements. Result batch `i` starts at
    /// `i·m·n`.
    pub offsets: Vec<(usize, usize)>,
    /// The right operand is one matrix and the left's batches are consecutive: fold batches into rows.
    pub foldable: bool,
}

/// The batch layout of `a · b` for operands of these shapes (an error when they do not multiply).
pub fn batch_plan(a_shape: &[usize], b_shape: &[usize]) -> Result<BatchPlan, LibraryError> {
    let (a_len, b_len) = (a_shape.iter().product(), b_shape.iter().product());
    let c_len = result_len(a_shape, b_shape)?;
    plan(a_len, a_shape, b_len, b_shape, c_len)
}

/// `c[m×n] = a[m×k] · b[k×n]` (or `c += …` with `accumulate`), row-major with leading dims `lda`, `ldb`, `ldc`,
/// on the calling thread: the GEMM other backends' host emulations use.
///
/// # Panics
/// When a slice is too short for its block.
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    gemm_rowmajor(m, n, k, a, lda, b, ldb, c, ldc, accumulate, Par::SERIAL)
}

/// The element count of `a · b` (checked by [`plan`]; an error only for rank-0 operands or overflow).
fn result_len(a_shape: &[usize], b_shape: &[usize]) -> Result<usize, LibraryError> {
    let (ra, rb) = (a_shape.len(), b_shape.len());
    if ra == 0 || rb == 0 {
        return Err(LibraryError::shape(
            OP,
            format!("operands must have rank 1 or more, got {a_shape:?} and {b_shape:?}"),
        ));
    }
    let m = if ra == 1 { 1 } else { a_shape[ra - 2] };
    let n = if rb == 1 { 1 } else { b_shape[rb - 1] };
    let (ba, bb) = (&a_shape[..ra.saturating_sub(2)], &b_shape[..rb.saturating_sub(2)]);
    let rank = ba.len().max(bb.len());
    let dim = |s: &[usize], i: usize| if i + s.len() >= rank { s[i + s.len() - rank] } else { 1 };
    let batches = (0..rank).map(|i| dim(ba, i).max(dim(bb, i))).try_fold(1usize, |acc, d| acc.checked_mul(d));
    batches
        .and_then(|b| b.checked_mul(m))
        .and_then(|b| b.checked_mul(n))
        .ok_or_else(|| LibraryError::shape(OP, format!("{a_shape:?} · {b_shape:?} overflows")))
}

fn plan(
    a_len: usize,
    a_shape: &[usize],
    b_len: usize,
    b_shape: &[usize],
    c_len: usize,
) -> Result<BatchPlan, LibraryError> {
    if a_shape.is_empty() || b_shape.is_empty() {
        return Err(LibraryError::shape(
            OP,
            format!("operands must have rank 1 or more, got {a_shape:?} and {b_shape:?}"),
        ));
    }
    check_len(OP, "a", a_len, a_shape)?;
    check_len(OP, "b", b_len, b_shape)?;
    let a2: Vec<usize> = if a_shape.len() == 1 { vec![1, a_shape[0]] } else { a_shape.to_vec() };
    let b2: Vec<usize> = if b_shape.len() == 1 { vec![b_shape[0], 1] } else { b_shape.to_vec() };
    let (ra, rb) = (a2.len(), b2.len());
    let (m, k, kb, n) = (a2[ra - 2], a2[ra - 1], b2[rb - 2], b2[rb - 1]);
    if k != kb {
        return Err(LibraryError::shape(
            OP,
            format!("contraction dims differ: {a_shape:?} has {k}, {b_shape:?} has {kb}"),
        ));
    }
    let (ba, bb) = (&a2[..ra - 2], &b2[..rb - 2]);
    let rank = ba.len().max(bb.len());
    // Right-aligned operand dims, 1 where an operand has fewer batch dims.
    let dim = |s: &[usize], i: usize| if i + s.len() >= rank { s[i + s.len() - rank] } else { 1 };
    let mut batch = Vec::with_capacity(rank);
    for i in 0..rank {
        let (x, y) = (dim(ba, i), dim(bb, i));
        if x != y && x != 1 && y != 1 {
            return Err(LibraryError::shape(OP, format!("batch dims of {a_shape:?} and {b_shape:?} do not broadcast")));
        }
        batch.push(if x == 1 { y } else { x });
    }
    let batches = element_count(OP, "result", &batch)?;
    let want = batches.checked_mul(m).and_then(|v| v.checked_mul(n));
    if want != Some(c_len) {
        return Err(LibraryError::shape(
            OP,
            format!("result has {c_len} elements but {a_shape:?} · {b_shape:?} has {batches}×{m}×{n}"),
        ));
    }
    // Operand batch strides in matrices, 0 on broadcast dims.
    let stride = |s: &[usize]| -> Vec<usize> {
        let padded: Vec<usize> = (0..rank).map(|i| dim(s, i)).collect();
        let st = strides_of(&padded);
        (0..rank).map(|i| if padded[i] == 1 { 0 } else { st[i] }).collect()
    };
    let (sa, sb) = (stride(ba), stride(bb));
    let out_strides = strides_of(&batch);
    let offsets: Vec<(usize, usize)> = (0..batches)
        .map(|i| {
            let (mut oa, mut ob) = (0, 0);
            for d in 0..rank {
                let idx = (i / out_strides[d]) % batch[d];
                oa += idx * sa[d];
                ob += idx * sb[d];
            }
            (oa * m * k, ob * k * n)
        })
        .collect();
    let foldable = offsets.iter().enumerate().all(|(i, &(oa, ob))| ob == 0 && oa == i * m * k);
    Ok(BatchPlan { m, k, n, offsets, foldable })
}

fn matmul<T: GemmScalar>(
    a: &[T],
    a_shape: &[usize],
    b: &[T],
    b_shape: &[usize],
    c: &mut [T],
    epilogue: Option<EpilogueOf<T>>,
    par: Par,
) -> Result<(), LibraryError> {
    let p = plan(a.len(), a_shape, b.len(), b_shape, c.len())?;
    if c.is_empty() {
        return Ok(());
    }
    let (k, n) = (p.k, p.n);
    let run_epilogue = |offset: usize, block: &mut [T]| {
        if let Some(f) = epilogue {
            f(offset, block);
        }
    };
    if p.foldable {
        // One `[batches·m, k] · [k, n]` product.
        let rows = p.offsets.len() * p.m;
        rows_product(rows, k, n, a, b, c, &run_epilogue, par);
        return Ok(());
    }
    let (m, size) = (p.m, p.m * p.n);
    let one_work = size.saturating_mul(k.max(1));
    if par.parallel() && p.offsets.len() >= par.threads.min(4) && one_work < PARALLEL_WORK * 16 {
        // Many matrices: one per worker at a time, each product serial.
        c.par_chunks_mut(size).zip(p.offsets.par_iter()).enumerate().for_each(|(i, (cb, &(oa, ob)))| {
            gemm_rowmajor(m, n, k, &a[oa..], k, &b[ob..], n, cb, n, false, Par::SERIAL);
            run_epilogue(i * size, cb);
        });
        return Ok(());
    }
    for (i, (cb, &(oa, ob))) in c.chunks_mut(size).zip(&p.offsets).enumerate() {
        let base = i * size;
        rows_product(m, k, n, &a[oa..], &b[ob..], cb, &|off, block| run_epilogue(base + off, block), par);
    }
    Ok(())
}

/// `c[rows, n] = a[rows, k] · b[k, n]`, then the epilogue on every row block (offsets relative to `c`'s start
/// plus whatever the closure adds). With several threads and enough rows, rows split among workers and each
/// block runs its epilogue as soon as it is done; otherwise `gemm` parallelizes inside one product.
fn rows_product<T: GemmScalar>(
    rows: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &[T],
    c: &mut [T],
    epilogue: &(dyn Fn(usize, &mut [T]) + Sync),
    par: Par,
) {
    let work = rows.saturating_mul(n).saturating_mul(k.max(1));
    if par.parallel() && work >= PARALLEL_WORK && rows >= par.threads.saturating_mul(16) {
        let block = rows.div_ceil(par.threads);
        c.par_chunks_mut(block * n).enumerate().for_each(|(i, cb)| {
            let r = cb.len() / n;
            gemm_rowmajor(r, n, k, &a[i * block * k..], k, b, n, cb, n, false, Par::SERIAL);
            epilogue(i * block * n, cb);
        });
        return;
    }
    let threads = if work >= PARALLEL_WORK { par } else { Par::SERIAL };
    gemm_rowmajor(rows, n, k, a, k, b, n, c, n, false, threads);
    epilogue(0, c);
}

/// `c[m, n] (+)= a[m, k] · b[k, n]` on row-major blocks with leading dims `lda`, `ldb`, `ldc`; `accumulate`
/// adds to what `c` holds (a bias, say) instead of overwriting it. Runs on `par.threads` workers of the current
/// pool (inside `gemm`) when more than one.
///
/// Panics if a slice is too short for its block: callers size them from checked shapes, so that is a bug here.
pub(super) fn gemm_rowmajor<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    lda: usize,
    b: &[T],
    ldb: usize,
    c: &mut [T],
    ldc: usize,
    accumulate: bool,
    par: Par,
) {
    // SAFETY: `c` is a live, exclusively borrowed slice of `c.len()` elements.
    unsafe { gemm_rowmajor_raw(m, n, k, a, lda, b, ldb, c.as_mut_ptr(), c.len(), ldc, accumulate, par) }
}

/// [`gemm_rowmajor`] writing through a raw pointer: `c` points at `c_len` elements of which this call writes only
/// the `m × n` block (rows of `ldc`), so workers may fill disjoint blocks of one matrix (column bands) at once.
///
/// # Safety
/// `c` must be valid for reads and writes of `c_len` elements, and no other thread may access the `m × n` block
/// this call writes while it runs.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_rowmajor_raw<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    lda: usize,
    b: &[T],
    ldb: usize,
    c: *mut T,
    c_len: usize,
    ldc: usize,
    accumulate: bool,
    par: Par,
) {
    // SAFETY: `b`'s block is at row stride `ldb`, column stride 1; the rest is the caller's contract.
    unsafe { gemm_general(m, n, k, a, (lda, 1), b, (ldb, 1), c, c_len, ldc, accumulate, par) }
}

/// `c[m×n] = a[m×k] · btᵀ` (or `c += …`), where `bt` is `[n×k]` row-major with leading dim `ldbt`: a product with
/// a weight stored as ONNX stores it (`[out, in]`), without transposing it first. On the calling thread's pool.
///
/// # Panics
/// When a slice is too short for its block.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_bt<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    lda: usize,
    bt: &[T],
    ldbt: usize,
    c: &mut [T],
    ldc: usize,
    accumulate: bool,
    par: Par,
) {
    // SAFETY: `c` is a live, exclusively borrowed slice of `c.len()` elements; `bt` holds `b`'s block at row
    // stride 1, column stride `ldbt` (checked against its length inside).
    unsafe { gemm_general(m, n, k, a, (lda, 1), bt, (1, ldbt), c.as_mut_ptr(), c.len(), ldc, accumulate, par) }
}

/// `c[m×n] (+)= a · b` where `a`'s element (row `r`, column `j`) is at `a[r·a_rs + j·a_cs]` (a weight read
/// transposed, say) and `b` is row-major with leading dim `ldb`. On the calling thread's pool.
///
/// # Panics
/// When a slice is too short for its block.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_strided_a<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    a_strides: (usize, usize),
    b: &[T],
    ldb: usize,
    c: &mut [T],
    ldc: usize,
    accumulate: bool,
    par: Par,
) {
    // SAFETY: `c` is a live, exclusively borrowed slice of `c.len()` elements; the operands' extents are
    // checked against their lengths inside.
    unsafe { gemm_general(m, n, k, a, a_strides, b, (ldb, 1), c.as_mut_ptr(), c.len(), ldc, accumulate, par) }
}

/// The one checked entry to the `gemm` crate: `c[m×n] (+)= a[m×k] · b[k×n]`, `a`'s element (row `r`, column
/// `j`) at `a[r·a_rs + j·a_cs]` and `b`'s at `b[r·b_rs + j·b_cs]`, `c` `c_len` elements at leading dim `ldc`.
/// Panics when an operand is too short for its block.
///
/// # Safety
/// `c` must be valid for reads and writes of `c_len` elements, and no other thread may access the `m × n` block
/// this call writes while it runs.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_general<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    (a_rs, a_cs): (usize, usize),
    b: &[T],
    (b_rs, b_cs): (usize, usize),
    c: *mut T,
    c_len: usize,
    ldc: usize,
    accumulate: bool,
    par: Par,
) {
    if m == 0 || n == 0 {
        return;
    }
    let span = |rows: usize, ld: usize, cols: usize| (rows - 1) * ld + cols;
    assert!(c_len >= span(m, ldc, n), "library gemm: result block out of bounds");
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                // SAFETY: row `r` of the block lies inside the `c_len` elements (asserted above).
                unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), n) }.fill(T::ZERO);
            }
        }
        return;
    }
    let a_extent = (m - 1) * a_rs + (k - 1) * a_cs + 1;
    let b_extent = (k - 1) * b_rs + (n - 1) * b_cs + 1;
    assert!(a.len() >= a_extent && b.len() >= b_extent, "library gemm: operand block out of bounds");
    let parallelism = if par.parallel() { gemm::Parallelism::Rayon(par.threads) } else { gemm::Parallelism::None };
    // SAFETY: the asserts above keep every element `gemm` touches inside the operands and inside `c`'s block,
    // which nobody else touches (the caller's contract); the operands are shared borrows that cannot alias it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            parallelism,
        );
    }
}
