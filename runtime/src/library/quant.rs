//! Integer GEMM for the quantized ops: `matmul_integer` and (through im2col, in `conv`) `conv_integer`.
//!
//! Both operands are 8-bit (i8 or u8) with zero points; once the zero point is subtracted every value fits an i16
//! (`[-255, 255]`), so the products are `i16 × i16 → i32` sums of pairs: the right operand is packed in
//! *k-pairs* over panels of [`NR`] columns (`[b[2p][j], b[2p+1][j]]` side by side), the left in rows of i16 padded
//! to an even length, and the kernel multiplies a broadcast pair of the left row by a panel row of pairs — one
//! AVX2 `vpmaddwd` per eight columns and two contraction steps, when the CPU has AVX2, or the same arithmetic in
//! portable code. A constant right operand of a matmul packed at load ([`PackedInt8`]) uses AVX-512 VNNI
//! (`vpdpbusd`, u8 × s8 four at a time, zero points as row- and column-sum corrections; module `vnni`) where the
//! CPU has it. Accumulation is i32 and wraps, exactly as the interpreter's (ONNX's) integer semantics.

use rayon::prelude::*;

use super::{LibraryError, Par, check_len};

/// Columns per packed panel.
pub(super) const NR: usize = 16;
/// Rows per register tile.
const MR: usize = 4;
/// Multiply-adds below which a call stays on one thread.
const PARALLEL_WORK: usize = 1 << 18;

const OP: &str = "matmul_integer";

/// An 8-bit operand: its bytes and whether they are i8 (else u8).
#[derive(Copy, Clone, Debug)]
pub struct Int8<'a> {
    /// The elements' bytes.
    pub bytes: &'a [u8],
    /// i8 (two's complement) when true, u8 when false.
    pub signed: bool,
}

impl Int8<'_> {
    #[inline]
    pub(super) fn get(&self, i: usize) -> i32 {
        let b = self.bytes[i];
        if self.signed { i32::from(b as i8) } else { i32::from(b) }
    }
}

/// The right operand of an integer GEMM (`k × n`, already less its zero points), packed in k-pairs.
pub(super) struct PackedPairs {
    /// Contraction pairs (`ceil(k / 2)`).
    pairs: usize,
    n: usize,
    /// Panel `p` holds `pairs · 2·NR` values from `p · pairs · 2·NR`.
    data: Vec<i16>,
}

impl PackedPairs {
    /// Packs `b[kk][j] = value(kk, j)` for `kk < k`, `j < n` (zeros pad the last pair and panel).
    pub(super) fn new(k: usize, n: usize, value: impl Fn(usize, usize) -> i16 + Sync) -> PackedPairs {
        PackedPairs::new_in(Vec::new(), k, n, value)
    }

    /// [`PackedPairs::new`] in `data`'s allocation (take it back with [`PackedPairs::into_data`]): a caller that
    /// packs per call reuses one buffer instead of faulting in fresh pages each time.
    pub(super) fn new_in(
        mut data: Vec<i16>,
        k: usize,
        n: usize,
        value: impl Fn(usize, usize) -> i16 + Sync,
    ) -> PackedPairs {
        let pairs = k.div_ceil(2);
        let panel_len = pairs * 2 * NR;
        data.clear();
        data.resize(n.div_ceil(NR) * panel_len, 0);
        data.par_chunks_mut(panel_len.max(1)).enumerate().for_each(|(p, panel)| {
            for (pair, row) in panel.chunks_mut(2 * NR).enumerate() {
                for j in 0..NR.min(n.saturating_sub(p * NR)) {
                    for t in 0..2 {
                        let kk = 2 * pair + t;
                        if kk < k {
                            row[2 * j + t] = value(kk, p * NR + j);
                        }
                    }
                }
            }
        });
        PackedPairs { pairs, n, data }
    }

    /// The buffer, for reuse.
    pub(super) fn into_data(self) -> Vec<i16> {
        self.data
    }
}

thread_local! {
    /// The i16 buffers of the last integer product on this thread (left rows, im2col matrix, packed panels),
    /// kept to save allocating — and faulting in — them per call.
    static SCRATCH: std::cell::Cell<[Vec<i16>; 3]> = const { std::cell::Cell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// Runs `f` on this thread's three scratch buffers (any contents, any length), taken out of the thread-local
/// slot while in use so that a nested call (rayon work stealing) gets fresh ones instead of aliasing them.
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut [Vec<i16>; 3]) -> R) -> R {
    let mut bufs = SCRATCH.with(std::cell::Cell::take);
    let r = f(&mut bufs);
    SCRATCH.with(|s| s.set(bufs));
    r
}

/// `c[m×n] = a · b` with `a` given as rows of `2·b.pairs` i16 (its zero points subtracted, the odd tail padded
/// with 0) and `c` row-major; rows are split over `par`'s workers.
pub(super) fn gemm(a: &[i16], m: usize, b: &PackedPairs, c: &mut [i32], par: Par) {
    let (n, lda) = (b.n, 2 * b.pairs);
    debug_assert!(a.len() >= m * lda && c.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    let work = m.saturating_mul(n).saturating_mul(lda);
    let rows_per_task =
        if par.parallel() && work >= PARALLEL_WORK { m.div_ceil(par.threads * 4).next_multiple_of(MR) } else { m };
    let run = |(t, block): (usize, &mut [i32])| {
        let first = t * rows_per_task;
        let rows = block.len() / n;
        gemm_rows(&a[first * lda..(first + rows) * lda], rows, b, block);
    };
    if rows_per_task >= m {
        run((0, &mut c[..m * n]));
    } else {
        c[..m * n].par_chunks_mut(rows_per_task * n).enumerate().for_each(run);
    }
}

/// [`gemm`] on one thread.
fn gemm_rows(a: &[i16], m: usize, b: &PackedPairs, c: &mut [i32]) {
    let (n, lda) = (b.n, 2 * b.pairs);
    let panel_len = b.pairs * 2 * NR;
    for (p, panel) in b.data.chunks(panel_len.max(1)).enumerate().take(n.div_ceil(NR)) {
        let cols = NR.min(n - p * NR);
        let mut r = 0;
        while r < m {
            let rows = MR.min(m - r);
            let mut acc = [[0i32; NR]; MR];
            tile(&a[r * lda..(r + rows) * lda], rows, b.pairs, panel, &mut acc);
            for (i, row) in acc.iter().enumerate().take(rows) {
                c[(r + i) * n + p * NR..][..cols].copy_from_slice(&row[..cols]);
            }
            r += rows;
        }
    }
}

/// One register tile: `acc[i][j] = Σ_p a[i][2p]·panel[p][j].0 + a[i][2p+1]·panel[p][j].1` for `rows ≤ MR` rows.
#[inline]
fn tile(a: &[i16], rows: usize, pairs: usize, panel: &[i16], acc: &mut [[i32; NR]; MR]) {
    assert!(a.len() >= rows * 2 * pairs && panel.len() >= pairs * 2 * NR && rows <= MR);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present; the lengths were checked above.
        unsafe { tile_avx2(a, rows, pairs, panel, acc) };
        return;
    }
    for (i, out) in acc.iter_mut().enumerate().take(rows) {
        let row = &a[i * 2 * pairs..][..2 * pairs];
        for (p, pr) in panel.chunks_exact(2 * NR).take(pairs).enumerate() {
            let (a0, a1) = (i32::from(row[2 * p]), i32::from(row[2 * p + 1]));
            for (j, o) in out.iter_mut().enumerate() {
                let v = a0.wrapping_mul(i32::from(pr[2 * j])).wrapping_add(a1.wrapping_mul(i32::from(pr[2 * j + 1])));
                *o = o.wrapping_add(v);
            }
        }
    }
}

/// [`tile`] with AVX2: two `vpmaddwd` per row and pair step.
///
/// # Safety
/// The CPU must support AVX2; `a` holds `rows · 2·pairs` values and `panel` `pairs · 2·NR` (as [`tile`] checks).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile_avx2(a: &[i16], rows: usize, pairs: usize, panel: &[i16], acc: &mut [[i32; NR]; MR]) {
    use std::arch::x86_64::*;
    let mut v = [[_mm256_setzero_si256(); 2]; MR];
    let lda = 2 * pairs;
    for p in 0..pairs {
        // SAFETY: p < pairs, so the 32 values from p·2·NR are inside the panel.
        let (b0, b1) = unsafe {
            let at = panel.as_ptr().add(p * 2 * NR);
            (_mm256_loadu_si256(at.cast()), _mm256_loadu_si256(at.add(NR).cast()))
        };
        for (i, vi) in v.iter_mut().enumerate().take(rows) {
            let at = i * lda + 2 * p;
            let pair = (u32::from(a[at] as u16) | (u32::from(a[at + 1] as u16) << 16)) as i32;
            let av = _mm256_set1_epi32(pair);
            vi[0] = _mm256_add_epi32(vi[0], _mm256_madd_epi16(av, b0));
            vi[1] = _mm256_add_epi32(vi[1], _mm256_madd_epi16(av, b1));
        }
    }
    for (out, vi) in acc.iter_mut().zip(&v).take(rows) {
        // SAFETY: each row of `acc` holds NR = 16 i32s, two 256-bit stores.
        unsafe {
            _mm256_storeu_si256(out.as_mut_ptr().cast(), vi[0]);
            _mm256_storeu_si256(out.as_mut_ptr().add(8).cast(), vi[1]);
        }
    }
}

/// `a`'s rows less their zero points as i16, each padded to `2·pairs` values: row `r` of `k` values starting at
/// element `start(r)` of `a`, zero point `zero(r)`.
pub(super) fn shifted_rows(
    a: Int8<'_>,
    rows: usize,
    k: usize,
    start: impl Fn(usize) -> usize,
    zero: impl Fn(usize) -> i32,
) -> Vec<i16> {
    let mut out = Vec::new();
    shifted_rows_into(&mut out, a, rows, k, start, zero);
    out
}

/// [`shifted_rows`] into `out` (resized).
pub(super) fn shifted_rows_into(
    out: &mut Vec<i16>,
    a: Int8<'_>,
    rows: usize,
    k: usize,
    start: impl Fn(usize) -> usize,
    zero: impl Fn(usize) -> i32,
) {
    let lda = 2 * k.div_ceil(2);
    out.clear();
    out.resize(rows * lda, 0);
    for (r, row) in out.chunks_mut(lda.max(1)).enumerate().take(rows) {
        let (s, z) = (start(r), zero(r));
        for (kk, o) in row.iter_mut().enumerate().take(k) {
            *o = (a.get(s + kk) - z) as i16;
        }
    }
}

/// A zero point's value for row/column/channel `i`: its only value, or its `i`-th.
pub(super) fn zero_at(z: Int8<'_>, i: usize) -> i32 {
    if z.bytes.len() == 1 { z.get(0) } else { z.get(i) }
}

/// A 2-D right operand of integer matmuls (`[k, n]`) less its zero points, packed once (at weight load) for
/// [`matmul_integer_packed`].
pub struct PackedInt8 {
    k: usize,
    n: usize,
    b: Packing,
}

/// How a [`PackedInt8`] holds its operand.
enum Packing {
    /// Less its zero points, as i16 k-pairs for [`gemm`] (AVX2 `vpmaddwd` or portable code).
    Pairs(PackedPairs),
    /// As s8 k-quads for AVX-512 VNNI (`vpdpbusd`), with the zero-point corrections' column terms.
    #[cfg(target_arch = "x86_64")]
    Quads(vnni::PackedQuads),
}

impl PackedInt8 {
    /// Packs `b` (`shape` `[k, n]`) with its zero point `b_zero` (one value, or one per column): for AVX-512 VNNI
    /// when the CPU has it, else for the pair kernel.
    pub fn pack(b: Int8<'_>, shape: &[usize], b_zero: Int8<'_>) -> Result<PackedInt8, LibraryError> {
        PackedInt8::pack_for(b, shape, b_zero, vnni::available())
    }

    /// [`PackedInt8::pack`] for the pair kernel whatever the CPU (tests use it to cover both paths).
    pub fn pack_pairs(b: Int8<'_>, shape: &[usize], b_zero: Int8<'_>) -> Result<PackedInt8, LibraryError> {
        PackedInt8::pack_for(b, shape, b_zero, false)
    }

    fn pack_for(b: Int8<'_>, shape: &[usize], b_zero: Int8<'_>, quads: bool) -> Result<PackedInt8, LibraryError> {
        let [k, n] = shape[..] else {
            return Err(LibraryError::shape(OP, format!("packs a 2-D operand, not {shape:?}")));
        };
        check_len(OP, "b", b.bytes.len(), shape)?;
        if b_zero.bytes.len() != 1 && b_zero.bytes.len() != n {
            return Err(LibraryError::shape(
                OP,
                format!("b's zero point has {} values, not 1 or {n}", b_zero.bytes.len()),
            ));
        }
        #[cfg(target_arch = "x86_64")]
        if quads {
            return Ok(PackedInt8 { k, n, b: Packing::Quads(vnni::PackedQuads::new(b, k, n, b_zero)) });
        }
        let _ = quads;
        let pairs = PackedPairs::new(k, n, |kk, j| (b.get(kk * n + j) - zero_at(b_zero, j)) as i16);
        Ok(PackedInt8 { k, n, b: Packing::Pairs(pairs) })
    }
}

/// [`matmul_integer`] with a right operand packed by [`PackedInt8::pack`]: `a` has shape `[…, m, k]`, the
/// result `[…, m, n]`.
pub fn matmul_integer_packed(
    a: Int8<'_>,
    a_shape: &[usize],
    a_zero: Int8<'_>,
    b: &PackedInt8,
    out: &mut [i32],
    par: Par,
) -> Result<(), LibraryError> {
    check_len(OP, "a", a.bytes.len(), a_shape)?;
    let (k, n) = (b.k, b.n);
    let Some((&ak, batch)) = a_shape.split_last().filter(|(ak, b)| **ak == k && !b.is_empty()) else {
        return Err(LibraryError::shape(OP, format!("a of shape {a_shape:?} does not multiply a packed [{k}, {n}]")));
    };
    let m = batch[batch.len() - 1];
    let rows: usize = batch.iter().product();
    if out.len() != rows * n || (a_zero.bytes.len() != 1 && a_zero.bytes.len() != m) {
        return Err(LibraryError::shape(
            OP,
            format!("a result of {} elements or a zero point of {} values", out.len(), a_zero.bytes.len()),
        ));
    }
    match &b.b {
        Packing::Pairs(pairs) => with_scratch(|[lhs, _, _]| {
            shifted_rows_into(lhs, a, rows, ak, |r| r * k, |r| zero_at(a_zero, r % m.max(1)));
            gemm(lhs, rows, pairs, out, par);
        }),
        #[cfg(target_arch = "x86_64")]
        Packing::Quads(q) => vnni::gemm(a, rows, |r| zero_at(a_zero, r % m.max(1)), q, out, par),
    }
    Ok(())
}

/// The AVX-512 VNNI kernel: `vpdpbusd` multiplies u8 by s8 four at a time into i32. Every operand pairing maps
/// onto it: an s8 left operand becomes u8 by adding 128 (to its zero point too), a u8 right operand becomes s8 by
/// subtracting 128; then `Σ (a − za)(b − zb) = Σ ab − zb·Σa − za·Σb + k·za·zb`, every term in wrapping i32 —
/// exactly the wrapped exact sum. The column sums `Σb` are taken when packing, the row sums `Σa` when the left
/// rows are laid out.
#[cfg(target_arch = "x86_64")]
mod vnni {
    use rayon::prelude::*;

    use super::{Int8, NR, PARALLEL_WORK, Par};

    /// Rows per register tile: with two panels, 16 accumulators (of AVX-512's 32 registers) keep `vpdpbusd`'s
    /// latency hidden, and each broadcast row quad serves two panels, each panel load eight rows.
    const MR: usize = 8;

    /// Whether the CPU runs the VNNI kernel.
    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512vnni")
    }

    /// The right operand as s8 k-quads over panels of 16 columns: panel `p`, quad `q` holds
    /// `[b[4q][j], b[4q+1][j], b[4q+2][j], b[4q+3][j]]` for its 16 columns `j` (zeros pad k and n).
    pub(in super::super) struct PackedQuads {
        quads: usize,
        k: usize,
        n: usize,
        data: Vec<i8>,
        /// Per column (padded with zeros to whole panels): `Σ_k b'` (b' the s8 value).
        col_sums: Vec<i32>,
        /// Per column (padded to whole panels): the zero point in s8 terms.
        zero: Vec<i32>,
    }

    impl PackedQuads {
        pub(super) fn new(b: Int8<'_>, k: usize, n: usize, b_zero: Int8<'_>) -> PackedQuads {
            PackedQuads::from_fn(k, n, b.signed, |kk, j| b.get(kk * n + j), |j| super::zero_at(b_zero, j))
        }

        /// Packs `b[kk][j] = value(kk, j)` for `kk < k`, `j < n` — raw values, i8 when `signed`, else u8 — with
        /// column `j`'s zero point `zero(j)` (raw, of the same type).
        pub(in super::super) fn from_fn(
            k: usize,
            n: usize,
            signed: bool,
            value: impl Fn(usize, usize) -> i32 + Sync,
            zero: impl Fn(usize) -> i32,
        ) -> PackedQuads {
            let shift = if signed { 0 } else { 128 };
            let quads = k.div_ceil(4);
            let panel_len = quads * 4 * NR;
            let mut data = vec![0i8; n.div_ceil(NR) * panel_len];
            data.par_chunks_mut(panel_len.max(1)).enumerate().for_each(|(p, panel)| {
                for j in 0..NR.min(n.saturating_sub(p * NR)) {
                    for kk in 0..k {
                        panel[(kk / 4) * 4 * NR + 4 * j + kk % 4] = (value(kk, p * NR + j) - shift) as i8;
                    }
                }
            });
            let padded = n.div_ceil(NR) * NR;
            let col_sums = (0..padded)
                .map(|j| if j < n { (0..k).fold(0i32, |s, kk| s.wrapping_add(value(kk, j) - shift)) } else { 0 })
                .collect();
            let zero = (0..padded).map(|j| if j < n { zero(j) - shift } else { 0 }).collect();
            PackedQuads { quads, k, n, data, col_sums, zero }
        }

        /// Whether some column's zero point (in s8 terms) is not 0, so the left rows' sums enter the result.
        fn needs_row_sums(&self) -> bool {
            self.zero.iter().any(|&z| z != 0)
        }
    }

    /// The result's base pointer, shared by tasks that write disjoint tiles of it, and its layout: row-major
    /// `[rows, n]`, or with `transposed` column-major — `[n, rows]`, element `(r, j)` at `j·rows + r`.
    #[derive(Copy, Clone)]
    struct Out {
        ptr: *mut i32,
        transposed: Option<usize>,
    }
    // SAFETY: tasks write disjoint element sets through it (disjoint column blocks or row ranges), and the
    // borrow it comes from outlives them (rayon joins before `gemm` returns).
    unsafe impl Send for Out {}
    // SAFETY: as above.
    unsafe impl Sync for Out {}

    /// The left rows laid out for the kernel: u8 values padded to whole quads, and per row the zero-point terms.
    struct Lhs {
        bytes: Vec<u8>,
        /// Per row: `za` (in u8 terms) and `Σa − k·za` (0 when no column's zero point needs it).
        terms: Vec<(i32, i32)>,
        lda: usize,
    }

    /// Rows per task when the left rows are laid out in parallel.
    const LHS_ROWS_PER_TASK: usize = 64;

    impl Lhs {
        /// `rows` rows of `k` u8 values for `b`, in `bytes`' allocation: `fill(r, row)` writes all of row `r`'s
        /// `k` bytes in u8 terms (an s8 operand already xored with 0x80), the quad padding is zeros;
        /// `za(r)` is row `r`'s zero point in the same terms. The rows' sums are taken only when `b` needs them.
        fn build(
            mut bytes: Vec<u8>,
            rows: usize,
            b: &PackedQuads,
            fill: impl Fn(usize, &mut [u8]) + Sync,
            za: impl Fn(usize) -> i32 + Sync,
            par: Par,
        ) -> Lhs {
            let (k, lda) = (b.k, 4 * b.quads);
            let sums = b.needs_row_sums();
            // Every byte is written below (rows by `fill`, the padding here): no clearing pass, and the buffer
            // only grows (shrinking it would make the next, larger call zero the difference again).
            if bytes.len() < rows * lda {
                bytes.resize(rows * lda, 0);
            }
            let used = &mut bytes[..rows * lda];
            let mut terms = vec![(0, 0); rows];
            /// A task's share: its index, its rows' bytes and its rows' terms.
            type Share<'s> = (usize, (&'s mut [u8], &'s mut [(i32, i32)]));
            let lay = |(t, (chunk, terms)): Share<'_>| {
                for (i, (row, term)) in chunk.chunks_mut(lda.max(1)).zip(terms.iter_mut()).enumerate() {
                    let r = t * LHS_ROWS_PER_TASK + i;
                    fill(r, &mut row[..k]);
                    row[k..].fill(0);
                    let z = za(r);
                    let sum = if sums { row[..k].iter().fold(0i32, |s, &x| s.wrapping_add(i32::from(x))) } else { 0 };
                    *term = (z, if sums { sum.wrapping_sub((k as i32).wrapping_mul(z)) } else { 0 });
                }
            };
            let chunk = (LHS_ROWS_PER_TASK * lda).max(1);
            if par.parallel() && rows.saturating_mul(k) >= PARALLEL_WORK / 8 {
                used.par_chunks_mut(chunk).zip(terms.par_chunks_mut(LHS_ROWS_PER_TASK)).enumerate().for_each(lay);
            } else {
                used.chunks_mut(chunk).zip(terms.chunks_mut(LHS_ROWS_PER_TASK)).enumerate().for_each(lay);
            }
            Lhs { bytes, terms, lda }
        }
    }

    thread_local! {
        /// The left rows of the last VNNI product on this thread, kept to save faulting in fresh pages per call.
        static LHS: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    }

    /// `c[rows×n] = (a − za) · (b − zb)` for `a` rows of `k` values (`za(r)` the zero point of row `r`).
    ///
    /// Every operand pairing becomes u8 × s8 (see the module above); then
    /// `Σ (a − za)(b − zb) = Σ ab − zb·(Σa − k·za) − za·Σb`, each term in wrapping i32, applied to the tile's
    /// accumulators before they are stored. The loops run over column blocks of two panels outermost, so a block
    /// of the packed operand stays in cache while every row block multiplies it; the work is split over column
    /// blocks when there are enough of them for the workers, else over rows.
    pub(super) fn gemm(
        a: Int8<'_>,
        rows: usize,
        za: impl Fn(usize) -> i32 + Sync,
        b: &PackedQuads,
        c: &mut [i32],
        par: Par,
    ) {
        let k = b.k;
        assert!(a.bytes.len() >= rows * k);
        let shift = if a.signed { 128 } else { 0 };
        let fill = |r: usize, row: &mut [u8]| {
            let src = &a.bytes[r * k..][..k];
            if a.signed {
                for (v, &x) in row.iter_mut().zip(src) {
                    *v = x ^ 0x80;
                }
            } else {
                row.copy_from_slice(src);
            }
        };
        gemm_rows_of(rows, fill, |r| za(r) + shift, b, c, false, par);
    }

    /// `c = (a − za) · (b − zb)` for left rows laid out by `fill` (see [`Lhs::build`]; `za` in u8 terms), `c`
    /// row-major `[rows, n]`, or column-major (`[n, rows]`: a conv's channel-major result) when `transposed`.
    pub(in super::super) fn gemm_rows_of(
        rows: usize,
        fill: impl Fn(usize, &mut [u8]) + Sync,
        za: impl Fn(usize) -> i32 + Sync,
        b: &PackedQuads,
        c: &mut [i32],
        transposed: bool,
        par: Par,
    ) {
        let (k, n) = (b.k, b.n);
        if rows == 0 || n == 0 {
            return;
        }
        assert!(c.len() >= rows * n);
        let lhs = Lhs::build(LHS.with(std::cell::Cell::take), rows, b, fill, za, par);
        let blocks = n.div_ceil(2 * NR);
        let out = Out { ptr: c.as_mut_ptr(), transposed: transposed.then_some(rows) };
        // SAFETY (both closures): each call writes rows `r` × the columns of blocks `blk`, inside `c` (checked
        // above), and concurrent calls get disjoint ranges.
        let run = |r: std::ops::Range<usize>, blk: std::ops::Range<usize>| unsafe { tiles(&lhs, b, out, r, blk) };
        let work = rows.saturating_mul(n).saturating_mul(k);
        if !par.parallel() || work < PARALLEL_WORK {
            run(0..rows, 0..blocks);
        } else if blocks >= 2 * par.threads {
            // One task per worker: a VNNI product of a few million multiply-adds is tens of microseconds, where
            // more, smaller tasks cost more in hand-offs than they even out (int8 gpt2_small, 2 threads: 0.94 →
            // 0.68 ms of integer products per run).
            let tasks = par.threads;
            (0..tasks).into_par_iter().for_each(|t| run(0..rows, t * blocks / tasks..(t + 1) * blocks / tasks));
        } else {
            let per = rows.div_ceil(par.threads * 4).next_multiple_of(MR);
            (0..rows.div_ceil(per)).into_par_iter().for_each(|t| run(t * per..((t + 1) * per).min(rows), 0..blocks));
        }
        LHS.with(|l| l.set(lhs.bytes));
    }

    /// The tiles of rows `r` and column blocks `blk` (two panels each, the last maybe one or a part).
    ///
    /// # Safety
    /// `out` points at the `rows × b.n` result, rows `r` lie inside it, and no other thread writes these tiles.
    unsafe fn tiles(lhs: &Lhs, b: &PackedQuads, out: Out, r: std::ops::Range<usize>, blk: std::ops::Range<usize>) {
        let panel_len = b.quads * 4 * NR;
        let panels = b.n.div_ceil(NR);
        for bi in blk {
            let p = 2 * bi;
            let two = p + 1 < panels;
            let p0 = &b.data[p * panel_len..][..panel_len];
            let p1 = if two { &b.data[(p + 1) * panel_len..][..panel_len] } else { p0 };
            let cols = (b.n - p * NR).min(2 * NR);
            let mut r0 = r.start;
            while r0 < r.end {
                let m = MR.min(r.end - r0);
                let tile = Tile {
                    a: &lhs.bytes[r0 * lhs.lda..(r0 + m) * lhs.lda],
                    terms: &lhs.terms[r0..r0 + m],
                    quads: b.quads,
                    p0,
                    p1,
                    zero: &b.zero[p * NR..],
                    col_sums: &b.col_sums[p * NR..],
                    cols,
                };
                // SAFETY: VNNI is present (the operand was packed for it); the tile's rows and columns lie inside
                // the result, at row `r0` and column `p·NR` of a row-major `· × n` matrix (the caller's promise).
                match out.transposed {
                    // SAFETY: as above, for a column-major `b.n × rows` matrix.
                    Some(ld) => unsafe { tile.run(out.ptr.add(p * NR * ld + r0), ld, true) },
                    None => unsafe { tile.run(out.ptr.add(r0 * b.n + p * NR), b.n, false) },
                }
                r0 += m;
            }
        }
    }

    /// One register tile: up to [`MR`] rows of the left operand against one or two panels.
    struct Tile<'a> {
        a: &'a [u8],
        terms: &'a [(i32, i32)],
        quads: usize,
        p0: &'a [i8],
        p1: &'a [i8],
        /// The panels' zero points and column sums (whole panels: 16 or 32 values from the first).
        zero: &'a [i32],
        col_sums: &'a [i32],
        /// Valid columns from the first panel's first (up to 32; more than 16 means both panels).
        cols: usize,
    }

    impl Tile<'_> {
        /// Multiplies and stores the corrected results at `c`: row `i`, column `j` at `i·ldc + j`, or at
        /// `j·ldc + i` when `transposed`.
        ///
        /// # Safety
        /// The CPU has AVX-512F and VNNI; `c` is valid for `terms.len()` rows of `cols` values at pitch `ldc` (or
        /// `cols` columns of `terms.len()` values at pitch `ldc` when `transposed`).
        unsafe fn run(&self, c: *mut i32, ldc: usize, transposed: bool) {
            let rows = self.terms.len();
            assert!(
                rows <= MR
                    && self.a.len() >= rows * 4 * self.quads
                    && self.p0.len().min(self.p1.len()) >= self.quads * 4 * NR
                    && self.zero.len().min(self.col_sums.len()) >= self.cols.next_multiple_of(NR)
            );
            macro_rules! by_rows {
                ($($r:literal)*) => {
                    match rows {
                        // SAFETY: as this function's; the lengths were checked above.
                        $($r => unsafe { self.rows::<$r>(c, ldc, transposed) },)*
                        _ => {}
                    }
                };
            }
            by_rows!(1 2 3 4 5 6 7 8);
        }

        /// [`Tile::run`] for exactly `R` rows: `2R` accumulators in registers.
        ///
        /// # Safety
        /// As [`Tile::run`]'s, with `R` rows.
        #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2")]
        unsafe fn rows<const R: usize>(&self, c: *mut i32, ldc: usize, transposed: bool) {
            use std::arch::x86_64::*;
            let mut v0 = [_mm512_setzero_si512(); R];
            let mut v1 = [_mm512_setzero_si512(); R];
            let lda = 4 * self.quads;
            let (a, b0, b1) = (self.a.as_ptr(), self.p0.as_ptr(), self.p1.as_ptr());
            let two = self.cols > NR;
            for q in 0..self.quads {
                // SAFETY: q < quads: 64 bytes from q·4·NR are in each panel, and each row's 4 bytes from
                // i·lda + 4q are in `a` (the caller checked the lengths).
                unsafe {
                    let bq0 = _mm512_loadu_si512(b0.add(q * 4 * NR).cast());
                    if two {
                        let bq1 = _mm512_loadu_si512(b1.add(q * 4 * NR).cast());
                        for i in 0..R {
                            let quad = _mm512_set1_epi32(a.add(i * lda + 4 * q).cast::<i32>().read_unaligned());
                            v0[i] = _mm512_dpbusd_epi32(v0[i], quad, bq0);
                            v1[i] = _mm512_dpbusd_epi32(v1[i], quad, bq1);
                        }
                    } else {
                        for i in 0..R {
                            let quad = _mm512_set1_epi32(a.add(i * lda + 4 * q).cast::<i32>().read_unaligned());
                            v0[i] = _mm512_dpbusd_epi32(v0[i], quad, bq0);
                        }
                    }
                }
            }
            // The zero-point corrections: acc − zb·(Σa − k·za) − za·Σb.
            let halves = if two { 2 } else { 1 };
            for h in 0..halves {
                let valid = (self.cols - h * NR).min(NR);
                let mask: __mmask16 = if valid == NR { !0 } else { (1u16 << valid) - 1 };
                // SAFETY: the panels' zero points and column sums are padded to whole panels (checked above).
                let (zb, cs) = unsafe {
                    (
                        _mm512_loadu_si512(self.zero.as_ptr().add(h * NR).cast()),
                        _mm512_loadu_si512(self.col_sums.as_ptr().add(h * NR).cast()),
                    )
                };
                let mut done = [_mm512_setzero_si512(); MR];
                for i in 0..R {
                    let (za, t) = self.terms[i];
                    let acc = if h == 0 { v0[i] } else { v1[i] };
                    let acc = _mm512_sub_epi32(acc, _mm512_mullo_epi32(zb, _mm512_set1_epi32(t)));
                    done[i] = _mm512_sub_epi32(acc, _mm512_mullo_epi32(cs, _mm512_set1_epi32(za)));
                    if !transposed {
                        // SAFETY: row i's `valid` columns from h·NR lie inside the result (the caller's promise).
                        unsafe { _mm512_mask_storeu_epi32(c.add(i * ldc + h * NR).cast(), mask, done[i]) };
                    }
                }
                if transposed {
                    // Each column's R values are adjacent: two 8×8 transposes (the rows past R are zeros and
                    // not stored), then one masked 8-lane store per valid column.
                    let row_mask: __mmask8 = if R == 8 { !0 } else { (1u8 << R) - 1 };
                    for half in 0..2 {
                        let cols = valid.saturating_sub(8 * half).min(8);
                        if cols == 0 {
                            break;
                        }
                        let block: [__m256i; 8] = std::array::from_fn(|i| {
                            if half == 0 {
                                _mm512_castsi512_si256(done[i])
                            } else {
                                _mm512_extracti64x4_epi64::<1>(done[i])
                            }
                        });
                        let columns = transpose8(block);
                        for (j, col) in columns.iter().enumerate().take(cols) {
                            let at = (h * NR + 8 * half + j) * ldc;
                            // SAFETY: column h·NR + 8·half + j < cols is valid, its R rows from `c` lie inside
                            // the result (the caller's promise).
                            unsafe { _mm256_mask_storeu_epi32(c.add(at).cast(), row_mask, *col) };
                        }
                    }
                }
            }
        }
    }

    /// The transpose of an 8×8 block of i32 (rows in, columns out).
    #[target_feature(enable = "avx2")]
    fn transpose8(r: [std::arch::x86_64::__m256i; 8]) -> [std::arch::x86_64::__m256i; 8] {
        use std::arch::x86_64::*;
        let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
        let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
        let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
        let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
        let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
        let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
        let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
        let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
        let u0 = _mm256_unpacklo_epi64(t0, t2);
        let u1 = _mm256_unpackhi_epi64(t0, t2);
        let u2 = _mm256_unpacklo_epi64(t1, t3);
        let u3 = _mm256_unpackhi_epi64(t1, t3);
        let u4 = _mm256_unpacklo_epi64(t4, t6);
        let u5 = _mm256_unpackhi_epi64(t4, t6);
        let u6 = _mm256_unpacklo_epi64(t5, t7);
        let u7 = _mm256_unpackhi_epi64(t5, t7);
        [
            _mm256_permute2x128_si256::<0x20>(u0, u4),
            _mm256_permute2x128_si256::<0x20>(u1, u5),
            _mm256_permute2x128_si256::<0x20>(u2, u6),
            _mm256_permute2x128_si256::<0x20>(u3, u7),
            _mm256_permute2x128_si256::<0x31>(u0, u4),
            _mm256_permute2x128_si256::<0x31>(u1, u5),
            _mm256_permute2x128_si256::<0x31>(u2, u6),
            _mm256_permute2x128_si256::<0x31>(u3, u7),
        ]
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod vnni {
    use super::Par;

    pub(super) fn available() -> bool {
        false
    }

    /// Never built: there is no VNNI kernel off x86-64.
    pub(in super::super) enum PackedQuads {}

    pub(in super::super) fn gemm_rows_of(
        _: usize,
        _: impl Fn(usize, &mut [u8]) + Sync,
        _: impl Fn(usize) -> i32 + Sync,
        b: &PackedQuads,
        _: &mut [i32],
        _: bool,
        _: Par,
    ) {
        match *b {}
    }
}

/// The most spatial dims a conv packed for VNNI may have (more keep the pair kernel; ONNX models use 1 to 3).
pub(super) const MAX_PACKED_RANK: usize = 8;

/// Output channels per group below which a conv keeps the pair kernel: the VNNI product's columns are output
/// channels in panels of 16, so fewer would leave most of each panel empty.
const VNNI_CONV_MIN_CHANNELS: usize = 8;

/// The weights of an integer conv (`[M, C/groups, k…]`) less nothing — raw 8-bit values with their zero points —
/// packed once for the AVX-512 VNNI conv ([`super::conv_integer_packed`]): per group the `[taps·cg, mg]` right
/// operand, tap-major with the input channel innermost (the order in which an image laid out channels-last
/// gives a patch's bytes), output channels as its columns.
pub struct PackedConvInt8 {
    shape: Vec<usize>,
    groups: Vec<vnni::PackedQuads>,
}

impl PackedConvInt8 {
    /// Packs `w` (`shape` `[M, C/groups, k…]`) with its zero point `w_zero` (one value or one per output
    /// channel) for a conv of `groups` groups; `None` where the CPU has no VNNI, a group has fewer than
    /// [`VNNI_CONV_MIN_CHANNELS`] output channels or the window no dims or more than [`MAX_PACKED_RANK`] (the
    /// pair kernel serves those).
    pub fn pack(
        w: Int8<'_>,
        shape: &[usize],
        w_zero: Int8<'_>,
        groups: usize,
    ) -> Result<Option<PackedConvInt8>, LibraryError> {
        const OP: &str = "conv_integer";
        check_len(OP, "w", w.bytes.len(), shape)?;
        let (Some(&m), Some(&cg)) = (shape.first(), shape.get(1)) else {
            return Err(LibraryError::shape(OP, format!("weights of shape {shape:?}")));
        };
        if groups == 0 || !m.is_multiple_of(groups) || (w_zero.bytes.len() != 1 && w_zero.bytes.len() != m) {
            return Err(LibraryError::shape(
                OP,
                format!("{m} output channels in {groups} groups with {} zero points", w_zero.bytes.len()),
            ));
        }
        let (mg, taps) = (m / groups, shape[2..].iter().product::<usize>());
        let spatial = shape.len() - 2;
        if !vnni::available() || mg < VNNI_CONV_MIN_CHANNELS || spatial == 0 || spatial > MAX_PACKED_RANK {
            return Ok(None);
        }
        #[cfg(target_arch = "x86_64")]
        {
            let k = taps * cg;
            let packed = (0..groups)
                .map(|grp| {
                    let channel = |j: usize| grp * mg + j;
                    vnni::PackedQuads::from_fn(
                        k,
                        mg,
                        w.signed,
                        |kk, j| w.get((channel(j) * cg + kk % cg) * taps + kk / cg),
                        |j| zero_at(w_zero, channel(j)),
                    )
                })
                .collect();
            return Ok(Some(PackedConvInt8 { shape: shape.to_vec(), groups: packed }));
        }
        #[allow(unreachable_code)]
        Ok(None)
    }

    /// The weights' shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Group `grp`'s operand.
    pub(super) fn group(&self, grp: usize) -> Option<&vnni::PackedQuads> {
        self.groups.get(grp)
    }
}

/// `c = (a − za) · (b − zb)` on the VNNI kernel for `b` one group of a [`PackedConvInt8`] and `c` column-major
/// (`[n, rows]`: output channels by positions), the left rows laid out by `fill` in u8 terms (see
/// `vnni::Lhs::build`) and `za` their zero point in the same terms.
pub(super) fn conv_gemm(
    rows: usize,
    fill: impl Fn(usize, &mut [u8]) + Sync,
    za: i32,
    b: &vnni::PackedQuads,
    c: &mut [i32],
    par: Par,
) {
    vnni::gemm_rows_of(rows, fill, |_| za, b, c, true, par);
}

/// ONNX MatMulInteger: `out = (a − a_zero) · (b − b_zero)` in i32 with numpy matmul shapes (batch dims broadcast),
/// `a_zero` one value or one per row of `a`, `b_zero` one value or one per column of `b`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_integer(
    a: Int8<'_>,
    a_shape: &[usize],
    b: Int8<'_>,
    b_shape: &[usize],
    a_zero: Int8<'_>,
    b_zero: Int8<'_>,
    out: &mut [i32],
    par: Par,
) -> Result<(), LibraryError> {
    check_len(OP, "a", a.bytes.len(), a_shape)?;
    check_len(OP, "b", b.bytes.len(), b_shape)?;
    let plan = super::batch_plan(a_shape, b_shape).map_err(|e| LibraryError::shape(OP, e.to_string()))?;
    let (m, k, n) = (plan.m, plan.k, plan.n);
    if out.len() != plan.offsets.len() * m * n {
        return Err(LibraryError::shape(
            OP,
            format!("the result has {} elements, not {}", out.len(), plan.offsets.len() * m * n),
        ));
    }
    for (what, z, per) in [("a", a_zero, m), ("b", b_zero, n)] {
        if z.bytes.len() != 1 && z.bytes.len() != per {
            return Err(LibraryError::shape(
                OP,
                format!("{what}'s zero point has {} values, not 1 or {per}", z.bytes.len()),
            ));
        }
    }
    // The right operand's distinct matrices, packed once each.
    let mut packed: Vec<(usize, PackedPairs)> = Vec::new();
    for &(_, bo) in &plan.offsets {
        if !packed.iter().any(|(o, _)| *o == bo) {
            let p = PackedPairs::new(k, n, |kk, j| (b.get(bo + kk * n + j) - zero_at(b_zero, j)) as i16);
            packed.push((bo, p));
        }
    }
    let lhs = |first: usize, rows: usize| shifted_rows(a, rows, k, |r| first + r * k, |r| zero_at(a_zero, r % m));
    if plan.foldable && packed.len() == 1 {
        let rows = plan.offsets.len() * m;
        let rows16 = lhs(plan.offsets.first().map_or(0, |o| o.0), rows);
        gemm(&rows16, rows, &packed[0].1, out, par);
        return Ok(());
    }
    for (i, &(ao, bo)) in plan.offsets.iter().enumerate() {
        let pb = &packed.iter().find(|(o, _)| *o == bo).expect("packed above").1;
        gemm(&lhs(ao, m), m, pb, &mut out[i * m * n..][..m * n], par);
    }
    Ok(())
}
