//! Linear layers over prepacked weights: [`PackedB`] holds a weight matrix `B[k, n]` rearranged once, at load
//! time, into column panels, and [`matmul_packed_f32`] multiplies row blocks of activations by it.
//!
//! Why not the `gemm` crate: it packs `B` on every call, and with small `m` (1..128 rows, every transformer
//! linear layer) and `B` cold in cache that packing pass costs as much as the product. Packed once, each call
//! streams `B` from memory exactly once, in the order the microkernel reads it.
//!
//! Layout: panel `j` holds columns `32j .. 32j + 32` for every `p` in `0..k`, as `k` rows of [`PANEL`] floats
//! (`panel[p·PANEL + c] = B[p, 32j + c]`), zero-padded past `n`; panels follow each other; storage is 64-byte
//! aligned, so each panel row is two aligned 16-float vectors. The product walks panels outer and row blocks
//! inner so a panel stays in L1/L2 while every row block uses it. Kernels: AVX-512F (12 rows × 32 columns,
//! 24 zmm accumulators), AVX2+FMA (6 × 16, on half panels) and portable scalar code, picked at run time.

use std::ops::Range;

use rayon::prelude::*;

use super::{Epilogue, LibraryError, Par};

const OP: &str = "matmul";

/// Columns per panel: two AVX-512 vectors.
pub const PANEL: usize = 32;

/// Products below this many multiply-adds run on one thread: splitting them costs more than it saves.
const PARALLEL_WORK: usize = 1 << 18;

/// How many panels ahead a product of one row block prefetches the weight.
const PREFETCH_AHEAD_ONE_TILE: usize = 4;

/// One 64-byte line of packed storage; a `Vec` of these is 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A weight matrix `B[k, n]` packed once for repeated products by [`matmul_packed_f32`].
pub struct PackedB {
    k: usize,
    n: usize,
    /// `⌈n / PANEL⌉` panels of `k × PANEL` floats each, zero-padded past column `n`.
    panels: usize,
    storage: Vec<Line>,
}

impl PackedB {
    /// Packs row-major `b` (`k × n` elements) into panels.
    ///
    /// Errors if `b.len() != k·n` or the packed size overflows the address space.
    pub fn pack(b: &[f32], k: usize, n: usize) -> Result<PackedB, LibraryError> {
        PackedB::pack_with(b, k, n, false)
    }

    /// Packs `B = btᵀ` from row-major `bt` (`n × k` elements: a weight stored `[out, in]`, as ONNX's recurrent
    /// weights are).
    ///
    /// Errors if `bt.len() != n·k` or the packed size overflows the address space.
    pub fn pack_transposed(bt: &[f32], k: usize, n: usize) -> Result<PackedB, LibraryError> {
        PackedB::pack_with(bt, k, n, true)
    }

    fn pack_with(b: &[f32], k: usize, n: usize, transposed: bool) -> Result<PackedB, LibraryError> {
        let want = k.checked_mul(n).ok_or_else(|| LibraryError::shape(OP, format!("weight {k}×{n} overflows")))?;
        if b.len() != want {
            let shape = if transposed { format!("[{n}, {k}]") } else { format!("[{k}, {n}]") };
            return Err(LibraryError::shape(
                OP,
                format!("weight has {} elements but shape {shape} needs {want}", b.len()),
            ));
        }
        let panels = n.div_ceil(PANEL);
        let lines = panels
            .checked_mul(k)
            .and_then(|v| v.checked_mul(PANEL / 16))
            .ok_or_else(|| LibraryError::shape(OP, format!("packed weight {k}×{n} overflows")))?;
        let mut storage = vec![Line([0.0; 16]); lines];
        let flat = flat_mut(&mut storage);
        // `max(1)`: with k = 0 there is no storage and nothing to copy.
        for (j, panel) in flat.chunks_exact_mut((k * PANEL).max(1)).enumerate() {
            let (first, cols) = (j * PANEL, PANEL.min(n - j * PANEL));
            if transposed {
                // Column c of the panel is row first + c of `bt`: read it contiguously, write it down the panel.
                for c in 0..cols {
                    for (p, &v) in b[(first + c) * k..(first + c + 1) * k].iter().enumerate() {
                        panel[p * PANEL + c] = v;
                    }
                }
                continue;
            }
            for (p, row) in panel.chunks_exact_mut(PANEL).enumerate() {
                row[..cols].copy_from_slice(&b[p * n + first..p * n + first + cols]);
            }
        }
        Ok(PackedB { k, n, panels, storage })
    }

    /// Rows of `B` (the contraction length).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns of `B` (the result's row length).
    pub fn n(&self) -> usize {
        self.n
    }

    /// The row-major `k × n` matrix back out of the panels: exactly the values packed, bit for bit.
    pub fn unpack(&self) -> Vec<f32> {
        let (k, n) = (self.k, self.n);
        let mut out = vec![0.0f32; k * n];
        for j in 0..self.panels {
            let (first, cols) = (j * PANEL, PANEL.min(n - j * PANEL));
            let panel = self.panel(j);
            for p in 0..k {
                out[p * n + first..p * n + first + cols].copy_from_slice(&panel[p * PANEL..p * PANEL + cols]);
            }
        }
        out
    }

    /// Bytes of packed storage, padding included.
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(self.storage.as_slice())
    }

    /// Panel `j` as `k × PANEL` floats.
    fn panel(&self, j: usize) -> &[f32] {
        let size = self.k * PANEL;
        &flat(&self.storage)[j * size..(j + 1) * size]
    }
}

impl std::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedB").field("k", &self.k).field("n", &self.n).field("panels", &self.panels).finish()
    }
}

fn flat(lines: &[Line]) -> &[f32] {
    // SAFETY: `Line` is `repr(C)` over `[f32; 16]` with size 64 = its alignment, so a run of lines is a run of
    // `16 · len` initialized floats with no padding.
    unsafe { std::slice::from_raw_parts(lines.as_ptr().cast::<f32>(), lines.len() * 16) }
}

fn flat_mut(lines: &mut [Line]) -> &mut [f32] {
    // SAFETY: as in `flat`; the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<f32>(), lines.len() * 16) }
}

/// Whether [`matmul_packed_f32`] beats the `gemm` crate's [`super::matmul_f32`] for `[rows, k] · [k, n]` with
/// the weight as it is in a model run (cold in cache), on this host: up to [`PACKED_MAX_ROWS`] rows, whatever `k`
/// and `n`, when an AVX-512F or AVX2+FMA kernel runs here.
///
/// Measured on an AVX-512 Xeon (2 MiB L2 per core) against `gemm` in the same run, `B` cold (rotated over 64 MiB
/// of weights) and hot, `(k, n)` in {(256, 768), (256, 1024), (1024, 256), (256, 4096), (784, 512)}: at 32 rows the
/// packed path is 1.6–1.9× faster cold (2.0–2.3× on two threads) and 1.0–1.5× hot; at one row, where both stream
/// `B` at memory bandwidth, 1.0–1.5× cold (to 2× on two threads, which `gemm` does not use for a vector) and
/// 1.0–1.6× hot; at 128 rows the packing pass `gemm` pays is amortized and the two tie (0.94–1.1× cold,
/// 1.0–1.2× hot). Past that the two tie at 200–256 rows and `gemm` wins at 512 (0.88–0.96× cold, its blocking
/// over `k`, which the packed path lacks, paying off). The scalar fallback never wins.
pub fn prefer_packed(rows: usize, k: usize, n: usize) -> bool {
    // The measured crossover depends on rows only: both paths read `B` once per call either way.
    let _ = (k, n);
    rows <= PACKED_MAX_ROWS && Isa::detect() != Isa::Scalar
}

/// The most rows for which [`prefer_packed`] picks the packed path.
pub const PACKED_MAX_ROWS: usize = 128;

/// `c[rows, n] = a[rows, k] · B`, then `epilogue` on each finished block (same contract as
/// [`super::matmul_f32`]'s: `(flat offset, block)` pairs covering every element of `c` exactly once, in any order,
/// from any worker). Runs on up to `par.threads` workers of the caller's rayon pool: column panels split among
/// workers when rows are few, row blocks when many.
///
/// Errors if `a.len() != rows·k` or `c.len() != rows·n`.
pub fn matmul_packed_f32(
    a: &[f32],
    rows: usize,
    b: &PackedB,
    c: &mut [f32],
    epilogue: Option<Epilogue>,
    par: Par,
) -> Result<(), LibraryError> {
    matmul_packed_on(Isa::detect(), a, rows, b, c, epilogue, par)
}

/// The instruction set a product runs on.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Isa {
    Avx512,
    Avx2,
    Scalar,
}

impl Isa {
    /// The best kernel set this host runs.
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Rows per microkernel call.
    fn rows_per_tile(self) -> usize {
        match self {
            Isa::Avx512 => 12,
            Isa::Avx2 => 6,
            Isa::Scalar => 4,
        }
    }
}

/// The result buffer shared by workers that write disjoint elements of it.
#[derive(Copy, Clone)]
struct SharedOut(*mut f32);

// SAFETY: workers write disjoint (row range × panel range) parts of the buffer, which outlives the scope.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

fn matmul_packed_on(
    isa: Isa,
    a: &[f32],
    rows: usize,
    b: &PackedB,
    c: &mut [f32],
    epilogue: Option<Epilogue>,
    par: Par,
) -> Result<(), LibraryError> {
    let (k, n) = (b.k, b.n);
    let a_want = rows.checked_mul(k);
    if a_want != Some(a.len()) {
        return Err(LibraryError::shape(OP, format!("a has {} elements but [{rows}, {k}] needs {rows}·{k}", a.len())));
    }
    let c_want = rows.checked_mul(n);
    if c_want != Some(c.len()) {
        return Err(LibraryError::shape(
            OP,
            format!("result has {} elements but [{rows}, {n}] needs {rows}·{n}", c.len()),
        ));
    }
    if c.is_empty() {
        return Ok(());
    }
    if k == 0 {
        c.fill(0.0);
        if let Some(f) = epilogue {
            f(0, c);
        }
        return Ok(());
    }
    let mr = isa.rows_per_tile();
    let out = SharedOut(c.as_mut_ptr());
    let work = rows.saturating_mul(n).saturating_mul(k);
    if !par.parallel() || work < PARALLEL_WORK {
        run_part(isa, a, rows, b, out, 0..b.panels, 0..rows, epilogue);
        return Ok(());
    }
    let threads = par.threads;
    if b.panels >= 2 * threads || rows < 2 * mr * threads {
        // Panels enough to share (or rows too few to split): each worker streams its own share of the weight.
        let parts = threads.min(b.panels);
        (0..parts).into_par_iter().for_each(|w| {
            let panels = b.panels * w / parts..b.panels * (w + 1) / parts;
            run_part(isa, a, rows, b, out, panels, 0..rows, epilogue);
        });
    } else {
        let tiles = rows.div_ceil(mr);
        (0..threads).into_par_iter().for_each(|w| {
            let first = (tiles * w / threads * mr).min(rows);
            let last = (tiles * (w + 1) / threads * mr).min(rows);
            run_part(isa, a, rows, b, out, 0..b.panels, first..last, epilogue);
        });
    }
    Ok(())
}

/// Computes rows `row_range` × the columns of `panels` of the result, then runs the epilogue on them: one block
/// when the part spans whole rows, one per row otherwise.
#[allow(clippy::too_many_arguments)]
fn run_part(
    isa: Isa,
    a: &[f32],
    rows: usize,
    b: &PackedB,
    out: SharedOut,
    panels: Range<usize>,
    row_range: Range<usize>,
    epilogue: Option<Epilogue>,
) {
    let (k, n) = (b.k, b.n);
    debug_assert!(a.len() == rows * k && row_range.end <= rows && panels.end <= b.panels);
    if panels.is_empty() || row_range.is_empty() {
        return;
    }
    let mr = isa.rows_per_tile();
    for j in panels.clone() {
        let panel = b.panel(j);
        // The weight is usually cold: while this panel is multiplied, a later one is fetched into L2, so memory
        // transfers overlap the arithmetic instead of alternating with it. With one row block a panel goes by
        // quickly, so the fetch runs further ahead.
        let ahead = if row_range.len() <= mr { PREFETCH_AHEAD_ONE_TILE } else { 1 };
        let next = if j + ahead < panels.end { b.panel(j + ahead).as_ptr() } else { std::ptr::null() };
        let cols = PANEL.min(n - j * PANEL);
        let mut i = row_range.start;
        while i < row_range.end {
            let tile_rows = mr.min(row_range.end - i);
            // SAFETY: `a` holds rows·k floats so rows `i..i + tile_rows` lie inside it; the panel holds k·PANEL
            // floats; the result holds rows·n floats, and this part owns rows `row_range` × columns
            // `j·PANEL .. j·PANEL + cols` of it, which no other worker touches.
            unsafe {
                let c = out.0.add(i * n + j * PANEL);
                tile(isa, tile_rows, a.as_ptr().add(i * k), k, panel.as_ptr(), next, c, n, cols);
            }
            i += tile_rows;
        }
    }
    let Some(f) = epilogue else { return };
    let (first, last) = (panels.start * PANEL, (panels.end * PANEL).min(n));
    let segment = |offset: usize, len: usize| {
        // SAFETY: the segment lies inside this part's rows and columns (see above), now finished.
        unsafe { std::slice::from_raw_parts_mut(out.0.add(offset), len) }
    };
    if first == 0 && last == n {
        let offset = row_range.start * n;
        f(offset, segment(offset, row_range.len() * n));
    } else {
        for i in row_range {
            let offset = i * n + first;
            f(offset, segment(offset, last - first));
        }
    }
}

/// Dispatches `rows` (at most `isa.rows_per_tile()`) to the kernel compiled for that row count.
///
/// # Safety
/// `a` must hold `rows` rows of `k` floats, `panel` `k × PANEL` 64-byte aligned floats, and `c` `rows` rows of
/// stride `ldc` with `cols ≤ PANEL` writable floats each; `next` is null or another such panel (a prefetch
/// hint).
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    isa: Isa,
    rows: usize,
    a: *const f32,
    k: usize,
    panel: *const f32,
    next: *const f32,
    c: *mut f32,
    ldc: usize,
    cols: usize,
) {
    macro_rules! by_rows {
        ($kernel:ident($panel:expr, $next:expr, $c:expr, $cols:expr), $($mr:literal)*) => {
            match rows {
                // SAFETY: the caller's contract, and the kernel's features were detected by `Isa::detect`.
                $($mr => unsafe { $kernel::<$mr>(a, k, $panel, $next, $c, ldc, $cols) },)*
                _ => unreachable!("packed matmul: {rows} rows in one tile"),
            }
        };
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => by_rows!(tile_avx512(panel, next, c, cols), 1 2 3 4 5 6 7 8 9 10 11 12),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            for half in 0..2 {
                let cols = cols.saturating_sub(half * 16).min(16);
                if cols > 0 {
                    // SAFETY: the half panel starts 16 floats (64 bytes) in, so stays 32-byte aligned.
                    let (panel, c) = unsafe { (panel.add(half * 16), c.add(half * 16)) };
                    let next = if next.is_null() { next } else { next.wrapping_add(half * 16) };
                    by_rows!(tile_avx2(panel, next, c, cols), 1 2 3 4 5 6)
                }
            }
        }
        _ => by_rows!(tile_scalar(panel, next, c, cols), 1 2 3 4),
    }
}

/// `MR × 32` tile on AVX-512F: two zmm accumulators per row; per `p`, both panel vectors are loaded once and
/// each row's `A[i, p]` is broadcast against them.
///
/// # Safety
/// As [`tile`], and the host supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512<const MR: usize>(
    a: *const f32,
    k: usize,
    panel: *const f32,
    next: *const f32,
    c: *mut f32,
    ldc: usize,
    cols: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    // SAFETY: every read is at `a[i·k + p]` (i < MR, p < k) or `panel[p·PANEL .. p·PANEL + 32]`, aligned to 64
    // bytes; every write is at `c[i·ldc + col]`, col < cols, masked.
    unsafe {
        for p in 0..k {
            let row = panel.add(p * PANEL);
            let b0 = _mm512_load_ps(row);
            let b1 = _mm512_load_ps(row.add(16));
            if !next.is_null() {
                // Two 64-byte lines: the next panel's row p.
                _mm_prefetch::<_MM_HINT_T1>(next.add(p * PANEL).cast());
                _mm_prefetch::<_MM_HINT_T1>(next.add(p * PANEL + 16).cast());
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let ai = _mm512_set1_ps(*a.add(i * k + p));
                acc[0] = _mm512_fmadd_ps(ai, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(ai, b1, acc[1]);
            }
        }
        let mask = |cols: usize| -> __mmask16 { ((1u32 << cols.min(16)) - 1) as __mmask16 };
        let (m0, m1) = (mask(cols), mask(cols.saturating_sub(16)));
        for (i, acc) in acc.iter().enumerate() {
            let row = c.add(i * ldc);
            if cols == PANEL {
                _mm512_storeu_ps(row, acc[0]);
                _mm512_storeu_ps(row.add(16), acc[1]);
            } else {
                _mm512_mask_storeu_ps(row, m0, acc[0]);
                _mm512_mask_storeu_ps(row.add(16), m1, acc[1]);
            }
        }
    }
}

/// `MR × 16` tile on AVX2+FMA over one half of a panel (row stride [`PANEL`]).
///
/// # Safety
/// As [`tile`] with `cols ≤ 16`, `panel` 32-byte aligned, and the host supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const MR: usize>(
    a: *const f32,
    k: usize,
    panel: *const f32,
    next: *const f32,
    c: *mut f32,
    ldc: usize,
    cols: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    // SAFETY: reads at `a[i·k + p]` and `panel[p·PANEL .. p·PANEL + 16]` (32-byte aligned); writes at
    // `c[i·ldc + col]`, col < cols (a partial row goes through a local buffer).
    unsafe {
        for p in 0..k {
            let row = panel.add(p * PANEL);
            let b0 = _mm256_load_ps(row);
            let b1 = _mm256_load_ps(row.add(8));
            if !next.is_null() {
                _mm_prefetch::<_MM_HINT_T1>(next.add(p * PANEL).cast());
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let ai = _mm256_set1_ps(*a.add(i * k + p));
                acc[0] = _mm256_fmadd_ps(ai, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(ai, b1, acc[1]);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            let row = c.add(i * ldc);
            if cols == 16 {
                _mm256_storeu_ps(row, acc[0]);
                _mm256_storeu_ps(row.add(8), acc[1]);
            } else {
                let mut tmp = [0.0f32; 16];
                _mm256_storeu_ps(tmp.as_mut_ptr(), acc[0]);
                _mm256_storeu_ps(tmp.as_mut_ptr().add(8), acc[1]);
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), row, cols);
            }
        }
    }
}

/// `MR × 32` tile in portable code, for hosts without a vector kernel.
///
/// # Safety
/// As [`tile`].
unsafe fn tile_scalar<const MR: usize>(
    a: *const f32,
    k: usize,
    panel: *const f32,
    next: *const f32,
    c: *mut f32,
    ldc: usize,
    cols: usize,
) {
    let _ = next;
    let mut acc = [[0.0f32; PANEL]; MR];
    // SAFETY: the caller's contract bounds every read and write below.
    let (a, panel) = unsafe { (std::slice::from_raw_parts(a, MR * k), std::slice::from_raw_parts(panel, k * PANEL)) };
    for (p, brow) in panel.chunks_exact(PANEL).enumerate() {
        for (i, acc) in acc.iter_mut().enumerate() {
            let ai = a[i * k + p];
            for (v, &bv) in acc.iter_mut().zip(brow) {
                *v = ai.mul_add(bv, *v);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        // SAFETY: row i of the tile has `cols` writable floats at `c + i·ldc`.
        unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), c.add(i * ldc), cols) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rnd(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Every kernel set this host runs agrees with a plain triple loop.
    #[test]
    fn every_isa_matches_a_reference() {
        let isas: Vec<Isa> = [Isa::Avx512, Isa::Avx2, Isa::Scalar]
            .into_iter()
            .filter(|&isa| match isa {
                Isa::Avx512 => Isa::detect() == Isa::Avx512,
                Isa::Avx2 => Isa::detect() != Isa::Scalar,
                Isa::Scalar => true,
            })
            .collect();
        for &(rows, k, n) in &[(1, 1, 1), (7, 5, 17), (13, 64, 33), (25, 100, 70), (3, 300, 16)] {
            let a = rnd(rows * k, 1);
            let bm = rnd(k * n, 2);
            let mut want = vec![0.0f64; rows * n];
            for i in 0..rows {
                for p in 0..k {
                    for j in 0..n {
                        want[i * n + j] += f64::from(a[i * k + p]) * f64::from(bm[p * n + j]);
                    }
                }
            }
            let packed = PackedB::pack(&bm, k, n).unwrap();
            for &isa in &isas {
                let mut c = vec![f32::NAN; rows * n];
                matmul_packed_on(isa, &a, rows, &packed, &mut c, None, Par::SERIAL).unwrap();
                for (i, (&g, &w)) in c.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(g) - w).abs() < 1e-4 * (1.0 + w.abs()),
                        "{isa:?} {rows}×{k}×{n} [{i}]: {g} vs {w}"
                    );
                }
            }
        }
    }
}
