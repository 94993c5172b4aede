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

    /// Rows per register tile.
    const MR: usize = 4;

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
        /// Per column: `Σ_k b'` (b' the s8 value).
        col_sums: Vec<i32>,
        /// Per column: the zero point in s8 terms.
        zero: Vec<i32>,
    }

    impl PackedQuads {
        pub(super) fn new(b: Int8<'_>, k: usize, n: usize, b_zero: Int8<'_>) -> PackedQuads {
            let shift = if b.signed { 0 } else { 128 };
            let quads = k.div_ceil(4);
            let panel_len = quads * 4 * NR;
            let mut data = vec![0i8; n.div_ceil(NR) * panel_len];
            data.par_chunks_mut(panel_len.max(1)).enumerate().for_each(|(p, panel)| {
                for j in 0..NR.min(n.saturating_sub(p * NR)) {
                    for kk in 0..k {
                        panel[(kk / 4) * 4 * NR + 4 * j + kk % 4] = (b.get(kk * n + p * NR + j) - shift) as i8;
                    }
                }
            });
            let col_sums =
                (0..n).map(|j| (0..k).fold(0i32, |s, kk| s.wrapping_add(b.get(kk * n + j) - shift))).collect();
            let zero = (0..n).map(|j| super::zero_at(b_zero, j) - shift).collect();
            PackedQuads { quads, k, n, data, col_sums, zero }
        }
    }

    /// `c[rows×n] = (a − za) · (b − zb)` for `a` rows of `k` values (`za(r)` the zero point of row `r`).
    pub(super) fn gemm(
        a: Int8<'_>,
        rows: usize,
        za: impl Fn(usize) -> i32 + Sync,
        b: &PackedQuads,
        c: &mut [i32],
        par: Par,
    ) {
        let (k, n) = (b.k, b.n);
        if rows == 0 || n == 0 {
            return;
        }
        let shift = if a.signed { 128 } else { 0 };
        let lda = 4 * b.quads;
        // The left rows as u8, padded to whole quads, and their sums.
        let mut lhs = vec![0u8; rows * lda];
        let mut row_sums = vec![0i32; rows];
        for (r, (row, sum)) in lhs.chunks_mut(lda.max(1)).zip(row_sums.iter_mut()).enumerate() {
            for (kk, v) in row.iter_mut().enumerate().take(k) {
                let x = a.get(r * k + kk) + shift;
                *v = x as u8;
                *sum = sum.wrapping_add(x);
            }
        }
        let work = rows.saturating_mul(n).saturating_mul(k);
        let rows_per_task = if par.parallel() && work >= PARALLEL_WORK {
            rows.div_ceil(par.threads * 4).next_multiple_of(MR)
        } else {
            rows
        };
        let run = |(t, block): (usize, &mut [i32])| {
            let first = t * rows_per_task;
            let count = block.len() / n;
            for r0 in (0..count).step_by(MR) {
                let m = MR.min(count - r0);
                let row = first + r0;
                let panel_len = b.quads * 4 * NR;
                let panels: Vec<&[i8]> = b.data.chunks(panel_len.max(1)).collect();
                // Two panels (32 columns) per tile where there are two: eight accumulators keep `vpdpbusd`'s
                // latency hidden and each broadcast row quad serves both.
                let mut p = 0;
                while p < panels.len() {
                    let width = if p + 1 < panels.len() { 2 } else { 1 };
                    let mut acc = [[[0i32; NR]; MR]; 2];
                    let rows_a = &lhs[row * lda..(row + m) * lda];
                    // SAFETY: VNNI is present (the operand was packed for it); the rows and each panel hold
                    // `m · lda` and `quads · 4·NR` values.
                    unsafe {
                        if width == 2 {
                            tile2(rows_a, m, b.quads, panels[p], panels[p + 1], &mut acc);
                        } else {
                            tile(rows_a, m, b.quads, panels[p], &mut acc[0]);
                        }
                    }
                    for (w, acc) in acc.iter().enumerate().take(width) {
                        let first_col = (p + w) * NR;
                        let cols = NR.min(n - first_col);
                        for (i, acc_row) in acc.iter().enumerate().take(m) {
                            let r = row + i;
                            let (za, ra) = (za(r) + shift, row_sums[r]);
                            let kza = (k as i32).wrapping_mul(za);
                            let out = &mut block[(r0 + i) * n + first_col..][..cols];
                            for (j, o) in out.iter_mut().enumerate() {
                                let col = first_col + j;
                                let zb = b.zero[col];
                                *o = acc_row[j]
                                    .wrapping_sub(zb.wrapping_mul(ra))
                                    .wrapping_sub(za.wrapping_mul(b.col_sums[col]))
                                    .wrapping_add(kza.wrapping_mul(zb));
                            }
                        }
                    }
                    p += width;
                }
            }
        };
        if rows_per_task >= rows {
            run((0, &mut c[..rows * n]));
        } else {
            c[..rows * n].par_chunks_mut(rows_per_task * n).enumerate().for_each(run);
        }
    }

    /// `acc[i][j] = Σ_q Σ_t a[i][4q+t] · panel[q][j][t]` for `rows ≤ MR` rows: one `vpdpbusd` per row and quad.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and VNNI; `a` holds `rows · 4·quads` values and `panel` `quads · 4·NR`.
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn tile(a: &[u8], rows: usize, quads: usize, panel: &[i8], acc: &mut [[i32; NR]; MR]) {
        assert!(a.len() >= rows * 4 * quads && panel.len() >= quads * 4 * NR && rows <= MR);
        // SAFETY: as this function's; the lengths were checked above.
        unsafe {
            match rows {
                4 => tile_rows::<4>(a, quads, panel, acc),
                3 => tile_rows::<3>(a, quads, panel, acc),
                2 => tile_rows::<2>(a, quads, panel, acc),
                _ => tile_rows::<1>(a, quads, panel, acc),
            }
        }
    }

    /// [`tile`] over two panels at once (32 columns): `acc[w]` for panel `w`.
    ///
    /// # Safety
    /// As [`tile`]'s, for both panels.
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn tile2(a: &[u8], rows: usize, quads: usize, p0: &[i8], p1: &[i8], acc: &mut [[[i32; NR]; MR]; 2]) {
        assert!(a.len() >= rows * 4 * quads && p0.len().min(p1.len()) >= quads * 4 * NR && rows <= MR);
        // SAFETY: as this function's; the lengths were checked above.
        unsafe {
            match rows {
                4 => tile2_rows::<4>(a, quads, p0, p1, acc),
                3 => tile2_rows::<3>(a, quads, p0, p1, acc),
                2 => tile2_rows::<2>(a, quads, p0, p1, acc),
                _ => tile2_rows::<1>(a, quads, p0, p1, acc),
            }
        }
    }

    /// [`tile2`] for exactly `R` rows: `2R` accumulators in registers.
    ///
    /// # Safety
    /// As [`tile2`]'s, with `rows == R`.
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn tile2_rows<const R: usize>(a: &[u8], quads: usize, p0: &[i8], p1: &[i8], acc: &mut [[[i32; NR]; MR]; 2]) {
        use std::arch::x86_64::*;
        let mut v0 = [_mm512_setzero_si512(); R];
        let mut v1 = [_mm512_setzero_si512(); R];
        let lda = 4 * quads;
        let (a, b0, b1) = (a.as_ptr(), p0.as_ptr(), p1.as_ptr());
        for q in 0..quads {
            // SAFETY: q < quads: 64 bytes from q·4·NR are in each panel, and each row's 4 bytes from
            // i·lda + 4q are in `a` (the caller checked the lengths).
            unsafe {
                let bq0 = _mm512_loadu_si512(b0.add(q * 4 * NR).cast());
                let bq1 = _mm512_loadu_si512(b1.add(q * 4 * NR).cast());
                for i in 0..R {
                    let quad = _mm512_set1_epi32(a.add(i * lda + 4 * q).cast::<i32>().read_unaligned());
                    v0[i] = _mm512_dpbusd_epi32(v0[i], quad, bq0);
                    v1[i] = _mm512_dpbusd_epi32(v1[i], quad, bq1);
                }
            }
        }
        for i in 0..R {
            // SAFETY: a row of `acc` holds 16 i32s, one 512-bit store each.
            unsafe {
                _mm512_storeu_si512(acc[0][i].as_mut_ptr().cast(), v0[i]);
                _mm512_storeu_si512(acc[1][i].as_mut_ptr().cast(), v1[i]);
            }
        }
    }

    /// [`tile`] for exactly `R` rows, the accumulators in registers.
    ///
    /// # Safety
    /// As [`tile`]'s, with `rows == R`.
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn tile_rows<const R: usize>(a: &[u8], quads: usize, panel: &[i8], acc: &mut [[i32; NR]; MR]) {
        use std::arch::x86_64::*;
        let mut v = [_mm512_setzero_si512(); R];
        let lda = 4 * quads;
        let (a, b) = (a.as_ptr(), panel.as_ptr());
        for q in 0..quads {
            // SAFETY: q < quads: the 64 bytes from q·4·NR are in the panel, and each row's 4 bytes from
            // i·lda + 4q are in `a` (the caller checked both lengths).
            unsafe {
                let bq = _mm512_loadu_si512(b.add(q * 4 * NR).cast());
                for (i, vi) in v.iter_mut().enumerate() {
                    let quad = a.add(i * lda + 4 * q).cast::<i32>().read_unaligned();
                    *vi = _mm512_dpbusd_epi32(*vi, _mm512_set1_epi32(quad), bq);
                }
            }
        }
        for (out, vi) in acc.iter_mut().zip(&v) {
            // SAFETY: a row of `acc` holds 16 i32s, one 512-bit store.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), *vi) };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod vnni {
    pub(super) fn available() -> bool {
        false
    }
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
