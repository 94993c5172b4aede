//! `pool` on f32: max and average pooling over the spatial dims of `x[N,C,*]`.
//!
//! A pooling window is a product of per-dim tap sets, so each spatial dim gets a table once per call: for every
//! output position along it, the input positions its taps land on and how many taps the padded input holds. The
//! divisor of a window is the product of its dims' counts, and the reduction is separable: each output row first
//! reduces the input rows under its outer taps into one row, then applies the last dim's taps to that row as
//! contiguous runs. Windows covering the whole unpadded input (global pooling) reduce each plane directly.

use kiln_ir::infer::pool_extent;
use kiln_ir::op::{Pool, PoolKind};
use rayon::prelude::*;

use super::{LibraryError, Par, attr_usizes, check_len, element_count, phase_start, split_phases, strides_of};

const OP: &str = "pool";

/// Max pooling (NaN wins over everything, padding never wins, a window with no input element gives -inf) or
/// average pooling (divided by the real taps, or with `count_include_pad` by the taps inside the explicit pads;
/// no real tap and no pads counted gives NaN) exactly as the interpreter defines them, with the kernel, strides,
/// pads (all begins, then all ends), dilations and `ceil_mode` of [`Pool`]. Runs over `N·C` planes in parallel
/// when `par` allows.
///
/// Errors if the shapes, attributes or slice lengths disagree (the expected `y_shape` is recomputed here).
pub fn pool_f32(
    x: &[f32],
    x_shape: &[usize],
    attrs: &Pool,
    y: &mut [f32],
    y_shape: &[usize],
    par: Par,
) -> Result<(), LibraryError> {
    let g = Geometry::new(x.len(), x_shape, attrs, y.len(), y_shape)?;
    if y.is_empty() {
        return Ok(());
    }
    let out_size = g.out_size;
    let planes = y.len() / out_size;
    if par.parallel() && planes > 1 && y.len().saturating_mul(g.window) >= 1 << 15 {
        // Whole planes per task, about four tasks per worker.
        let per_task = planes.div_ceil(par.threads.max(1) * 4).max(1);
        y.par_chunks_mut(per_task * out_size)
            .enumerate()
            .for_each(|(t, ys)| pool_planes(&g, attrs, x, t * per_task, ys));
    } else {
        pool_planes(&g, attrs, x, 0, y);
    }
    Ok(())
}

/// The window taps of one spatial dim.
struct Axis {
    /// Input offsets (position × the dim's input stride) of the real taps, all output positions concatenated.
    taps: Vec<usize>,
    /// Per output position: its range in `taps` and the number of taps inside the explicit pads.
    windows: Vec<(usize, usize, usize)>,
}

struct Geometry {
    axes: Vec<Axis>,
    output: Vec<usize>,
    in_size: usize,
    out_size: usize,
    /// Taps per window, for the parallel cut-off.
    window: usize,
    /// One window covering each whole plane: reduce the plane directly.
    global: bool,
    /// 2-D pooling of stride 1: whole-plane passes ([`pool_plane_flat`]).
    flat: Option<Flat>,
    /// Per last-dim kernel tap that lands in the input anywhere: the run `lo..hi` of output positions along the
    /// last dim it lands inside for, and the input position of the first.
    row_taps: Vec<(usize, usize, usize)>,
    /// The last dim's stride.
    row_stride: usize,
    /// The input's last extent.
    row_len: usize,
}

impl Geometry {
    fn new(
        x_len: usize,
        x_shape: &[usize],
        p: &Pool,
        y_len: usize,
        y_shape: &[usize],
    ) -> Result<Geometry, LibraryError> {
        if x_shape.len() < 3 {
            return Err(LibraryError::shape(OP, format!("needs x[N,C,*] of rank ≥ 3, got {x_shape:?}")));
        }
        check_len(OP, "x", x_len, x_shape)?;
        check_len(OP, "y", y_len, y_shape)?;
        let sp = x_shape.len() - 2;
        let kernel = attr_usizes(OP, "kernel", &p.kernel, sp, 1)?;
        let strides = attr_usizes(OP, "strides", &p.strides, sp, 1)?;
        let dilations = attr_usizes(OP, "dilations", &p.dilations, sp, 1)?;
        let pads = attr_usizes(OP, "pads", &p.pads, 2 * sp, 0)?;
        let input = &x_shape[2..];
        let mut output = Vec::with_capacity(sp);
        for d in 0..sp {
            let eff = (kernel[d] as u128 - 1) * dilations[d] as u128 + 1;
            let padded = input[d] as u128 + pads[d] as u128 + pads[d + sp] as u128;
            if padded < eff {
                return Err(LibraryError::shape(
                    OP,
                    format!("window extent {eff} exceeds padded input on spatial dim {d}"),
                ));
            }
            if pads[d] as u128 >= eff || pads[d + sp] as u128 >= eff {
                return Err(LibraryError::shape(
                    OP,
                    format!("pads {:?} must be smaller than the window extent {eff}", p.pads),
                ));
            }
            let extent = i64::try_from(input[d]).map_err(|_| LibraryError::shape(OP, "input extent out of range"))?;
            let out =
                pool_extent(extent, p.kernel[d], p.strides[d], p.dilations[d], p.pads[d], p.pads[d + sp], p.ceil_mode);
            output.push(usize::try_from(out).map_err(|_| LibraryError::shape(OP, "output extent out of range"))?);
        }
        let want: Vec<usize> = x_shape[..2].iter().chain(&output).copied().collect();
        if y_shape != want.as_slice() {
            return Err(LibraryError::shape(OP, format!("result shape {y_shape:?} should be {want:?}")));
        }
        let in_strides = strides_of(input);
        // Tap ranges are computed, not enumerated, so that absurd kernels cost nothing; u128 keeps every product
        // of attributes (each below 2^63) and extents exact.
        let axes = (0..sp)
            .map(|d| {
                let (pb, pe, n) = (pads[d] as u128, pads[d + sp] as u128, input[d] as u128);
                let (k, s, dil) = (kernel[d] as u128, strides[d] as u128, dilations[d] as u128);
                // Taps `k` of output `o` with `o·s + k·dil < bound`: `min(kernel, ceil((bound - o·s) / dil))`.
                let below =
                    |o: u128, bound: u128| if o * s >= bound { 0 } else { (bound - o * s).div_ceil(dil).min(k) };
                let mut axis = Axis { taps: Vec::new(), windows: Vec::with_capacity(output[d]) };
                for o in 0..output[d] as u128 {
                    let start = axis.taps.len();
                    // Real taps: pb <= o·s + k·dil < pb + n (at most n of them: distinct positions).
                    let (lo, hi) = (below(o, pb), below(o, pb + n));
                    for t in lo..hi {
                        axis.taps.push((o * s + t * dil - pb) as usize * in_strides[d]);
                    }
                    let padded = below(o, pb + n + pe) as usize;
                    axis.windows.push((start, axis.taps.len(), padded));
                }
                axis
            })
            .collect();
        let last = sp - 1;
        // Last-dim taps that land in the input for some output position: k·dil < pb + n.
        let reaching = (pads[last] + input[last]).div_ceil(dilations[last]).min(kernel[last]);
        let row_taps = (0..reaching)
            .filter_map(|k| {
                let shift = k * dilations[last];
                let (pb, n, s) = (pads[last], input[last], strides[last]);
                // Output positions o with pb <= o·s + shift < pb + n.
                let lo = pb.saturating_sub(shift).div_ceil(s);
                let hi = if pb + n > shift { (pb + n - shift).div_ceil(s).min(output[last]) } else { 0 };
                (lo < hi).then(|| (lo, hi, lo * s + shift - pb))
            })
            .collect();
        let global = kernel == input && pads.iter().all(|&v| v == 0) && dilations.iter().all(|&v| v == 1);
        let flat = Flat::of(input, &output, &kernel, &strides, &dilations, &pads);
        Ok(Geometry {
            axes,
            in_size: element_count(OP, "x", input)?,
            out_size: element_count(OP, "y", &output)?,
            output,
            window: kernel.iter().fold(1usize, |a, &k| a.saturating_mul(k)),
            global,
            flat,
            row_taps,
            row_stride: strides[last],
            row_len: input[last],
        })
    }

    /// Whether the reduced row is split into its stride phases before the row taps apply.
    fn phased(&self) -> bool {
        self.row_stride > 1 && self.row_stride <= self.row_len && self.row_taps.len() > 1
    }

    /// The input offsets of every real tap of the outer dims (all but the last) of the row at outer output
    /// position `o`, into `rows`; one offset 0 for 1-D pooling.
    fn outer_taps(&self, o: &[usize], rows: &mut Vec<usize>) {
        rows.clear();
        if let [od] = o {
            // 2-D pooling: the first dim's taps are the offsets.
            let (lo, hi, _) = self.axes[0].windows[*od];
            rows.extend_from_slice(&self.axes[0].taps[lo..hi]);
            return;
        }
        rows.push(0);
        for (d, &od) in o.iter().enumerate() {
            let (lo, hi, _) = self.axes[d].windows[od];
            let taps = &self.axes[d].taps[lo..hi];
            let before = rows.len();
            for i in 0..before {
                for &t in taps {
                    rows.push(rows[i] + t);
                }
            }
            rows.drain(..before);
        }
    }
}

/// A 2-D, stride-1 pooling laid out over a padded plane of `rows × pitch` (see [`pool_plane_flat`]).
#[derive(Clone, Copy, Debug)]
struct Flat {
    rows: usize,
    pitch: usize,
    /// Leading pads (top, left).
    pad: (usize, usize),
    kernel: (usize, usize),
    dilations: (usize, usize),
    input: (usize, usize),
    output: (usize, usize),
}

impl Flat {
    /// The layout for a 2-D pooling of stride 1 whose padded plane stays within a few times its input and output
    /// (absurd pads or dilations take the row-by-row path), in checked arithmetic.
    fn of(
        input: &[usize],
        output: &[usize],
        kernel: &[usize],
        strides: &[usize],
        dilations: &[usize],
        pads: &[usize],
    ) -> Option<Flat> {
        let (&[ih, iw], &[oh, ow], &[kh, kw], &[1, 1], &[dh, dw]) = (input, output, kernel, strides, dilations) else {
            return None;
        };
        if oh == 0 || ow == 0 || kh == 0 || kw == 0 {
            return None;
        }
        // Every row and column an output reads, from the first leading pad on.
        let reach = |o: usize, k: usize, d: usize| (o - 1).checked_add((k - 1).checked_mul(d)?)?.checked_add(1);
        let rows = reach(oh, kh, dh)?.max(pads[0].checked_add(ih)?);
        let pitch = reach(ow, kw, dw)?.max(pads[1].checked_add(iw)?);
        let size = rows.checked_mul(pitch)?;
        let bound = 4usize.checked_mul(ih.checked_mul(iw)?.checked_add(oh.checked_mul(ow)?)?)?.checked_add(64)?;
        (size <= bound).then_some(Flat {
            rows,
            pitch,
            pad: (pads[0], pads[1]),
            kernel: (kh, kw),
            dilations: (dh, dw),
            input: (ih, iw),
            output: (oh, ow),
        })
    }
}

/// One plane of a 2-D stride-1 pooling in whole-plane passes: the input is copied into a plane of pitch `pitch`
/// with the reduction's identity around it (unless nothing pads it), so that every horizontal tap is one long run
/// over the whole plane (reduced into `h`), and every vertical tap one long run of `h` `dh·pitch` further on (into
/// the result directly when its rows have the plane's pitch); the real columns of each output row are then copied
/// out, and an average divided by its window's taps. Each stage combines all its taps a cache-sized block at a
/// time ([`combine_taps`]): one pass over memory per stage, long runs instead of rows of a few dozen elements
/// (inception's 3×3 pools on 28×28 planes ran at a quarter of ONNX Runtime's speed row by row).
#[inline(always)]
fn pool_plane_flat(f: &Flat, p: &Pool, x: &[f32], y: &mut [f32], s: &mut Scratch) {
    let max = p.kind == PoolKind::Max;
    let identity = if max { f32::NEG_INFINITY } else { 0.0 };
    let ((ih, iw), (oh, ow), (kh, kw), (dh, dw)) = (f.input, f.output, f.kernel, f.dilations);
    let (pitch, size) = (f.pitch, f.rows * f.pitch);
    // The padded plane: the input itself when nothing pads it.
    let padded = f.pad != (0, 0) || pitch != iw || f.rows != ih;
    if padded {
        let plane = &mut s.plane[..size];
        plane[..f.pad.0 * pitch].fill(identity);
        plane[(f.pad.0 + ih) * pitch..].fill(identity);
        for (r, row) in x.chunks_exact(iw).take(ih).enumerate() {
            let line = &mut plane[(f.pad.0 + r) * pitch..][..pitch];
            line[..f.pad.1].fill(identity);
            line[f.pad.1..f.pad.1 + iw].copy_from_slice(row);
            line[f.pad.1 + iw..].fill(identity);
        }
    }
    let plane: &[f32] = if padded { &s.plane[..size] } else { &x[..size] };
    // Horizontal taps over every row at once (none to apply for a one-column window)...
    let nh = size - (kw - 1) * dw;
    let h: &[f32] = if kw == 1 {
        plane
    } else {
        combine_taps(&mut s.h[..nh], plane, dw, kw, max);
        &s.h[..nh]
    };
    // ... then vertical ones over the `n` flat positions of the output rows, into the result when its rows are
    // the plane's.
    let n = (oh - 1) * pitch + ow;
    let direct = pitch == ow;
    if direct {
        combine_taps(&mut y[..n], h, dh * pitch, kh, max);
    } else {
        combine_taps(&mut s.v[..n], h, dh * pitch, kh, max);
    }
    for (o, yrow) in y.chunks_exact_mut(ow).take(oh).enumerate() {
        if !direct {
            yrow.copy_from_slice(&s.v[o * pitch..][..ow]);
        }
        if !max {
            scale_row(yrow, &s.recips[o * ow..][..ow]);
        }
    }
}

/// `dst[i] = src[i] ⊕ src[i + step] ⊕ … ⊕ src[i + (taps-1)·step]` (max or sum, in tap order) a block at a
/// time, so that the block of `dst` stays in the first-level cache while every tap combines into it: one pass
/// over memory whatever the number of taps. `taps ≥ 1`; `src` holds `(taps-1)·step + dst.len()` elements.
#[inline(always)]
fn combine_taps(dst: &mut [f32], src: &[f32], step: usize, taps: usize, max: bool) {
    const BLOCK: usize = 512;
    let mut start = 0;
    while start < dst.len() {
        let end = (start + BLOCK).min(dst.len());
        let block = &mut dst[start..end];
        block.copy_from_slice(&src[start..end]);
        for t in 1..taps {
            let tap = &src[t * step + start..t * step + end];
            if max {
                max_into(block, tap, 1);
            } else {
                add_into(block, tap, 1);
            }
        }
        start = end;
    }
}

widest_vectors! {
    /// Pools the planes `first..` of `x` into `y` (whole `[out…]` planes), compiled for the widest vectors the CPU
    /// has: the row combines below are its inner loops.
    fn pool_planes(g: &Geometry, p: &Pool, x: &[f32], first: usize, y: &mut [f32]) = pool_planes_inline, pool_planes_inline;
}

#[inline(always)]
fn pool_planes_inline(g: &Geometry, p: &Pool, x: &[f32], first: usize, y: &mut [f32]) {
    let mut scratch = Scratch::new(g, p);
    for (i, yp) in y.chunks_mut(g.out_size).enumerate() {
        let xp = &x[(first + i) * g.in_size..][..g.in_size];
        if g.global {
            yp[0] = match p.kind {
                PoolKind::Max => max_of(xp),
                PoolKind::Avg => sum_of(xp) / g.in_size as f32,
            };
        } else if let Some(f) = &g.flat {
            pool_plane_flat(f, p, xp, yp, &mut scratch);
        } else {
            pool_plane(g, p, xp, yp, &mut scratch);
        }
    }
}

/// Buffers one task reuses for all its planes.
struct Scratch {
    /// The input rows under the current output row's outer taps, reduced into one row.
    acc: Vec<f32>,
    /// `acc` split into its stride phases (empty when unused).
    phases: Vec<f32>,
    /// The outer output position of the current row.
    o: Vec<usize>,
    /// The input offsets of the current row's outer taps.
    rows: Vec<usize>,
    /// An average's `1 / taps` per output position of a plane (empty for max pooling).
    recips: Vec<f32>,
    /// The padded plane, its horizontal reduction and the vertical one, for [`pool_plane_flat`] (empty
    /// otherwise).
    plane: Vec<f32>,
    h: Vec<f32>,
    v: Vec<f32>,
}

impl Scratch {
    fn new(g: &Geometry, p: &Pool) -> Scratch {
        let last = g.axes.len() - 1;
        let phases = if g.phased() { g.row_len.div_ceil(g.row_stride) * g.row_stride } else { 0 };
        Scratch {
            acc: vec![0.0; g.row_len],
            phases: vec![0.0; phases],
            o: vec![0; last],
            rows: Vec::new(),
            recips: if p.kind == PoolKind::Avg { reciprocal_counts(g, p) } else { Vec::new() },
            plane: vec![0.0; g.flat.map_or(0, |f| f.rows * f.pitch)],
            h: vec![0.0; g.flat.map_or(0, |f| f.rows * f.pitch)],
            v: vec![0.0; g.flat.map_or(0, |f| f.rows * f.pitch)],
        }
    }
}

/// Pools one `[in…]` plane into one `[out…]` plane, a row (the last spatial dim) at a time: for every real tap of
/// the outer dims and every tap of the last dim, the valid run of the output row is combined with a (strided) run
/// of the input row.
#[inline(always)]
fn pool_plane(g: &Geometry, p: &Pool, x: &[f32], y: &mut [f32], scratch: &mut Scratch) {
    let last = g.axes.len() - 1;
    let row = g.output[last];
    let max = p.kind == PoolKind::Max;
    let identity = if max { f32::NEG_INFINITY } else { 0.0 };
    y.fill(identity);
    // A window is its outer taps × its row taps, so each output row first reduces the input rows under its outer
    // taps into one row (contiguous, vectorized), then applies the row taps to that. With a stride above 1 and
    // several row taps, the reduced row is split into its phases (`acc[j·stride + p]`) so that every row tap
    // combines contiguous runs.
    let (s, il) = (g.row_stride, g.row_len);
    let phased = g.phased();
    let phase_len = il.div_ceil(s);
    let Scratch { acc, phases, o, rows, recips, .. } = scratch;
    o.fill(0);
    for (r, yrow) in y.chunks_mut(row).enumerate() {
        g.outer_taps(o, rows);
        match rows.as_slice() {
            [] => acc.fill(identity),
            [only] => acc.copy_from_slice(&x[*only..*only + il]),
            [first, rest @ ..] => {
                acc.copy_from_slice(&x[*first..*first + il]);
                for &base in rest {
                    let xrow = &x[base..base + il];
                    if max {
                        max_into(acc, xrow, 1);
                    } else {
                        add_into(acc, xrow, 1);
                    }
                }
            }
        }
        if phased {
            split_phases(acc, s, phase_len, phases);
        }
        for &(lo, hi, first) in &g.row_taps {
            let (ys, xs, stride) = if phased {
                (&mut yrow[lo..hi], &phases[phase_start(first, s, phase_len)..], 1)
            } else {
                (&mut yrow[lo..hi], &acc[first..], s)
            };
            if max {
                max_into(ys, xs, stride);
            } else {
                add_into(ys, xs, stride);
            }
        }
        if !max {
            scale_row(yrow, &recips[r * row..][..row]);
        }
        // Next row, the innermost outer dim fastest.
        for d in (0..last).rev() {
            o[d] += 1;
            if o[d] < g.output[d] {
                break;
            }
            o[d] = 0;
        }
    }
}

/// `yrow[j] *= recips[j]`: an average's sums scaled by their windows' `1 / taps`.
#[inline(always)]
fn scale_row(yrow: &mut [f32], recips: &[f32]) {
    for (yv, &r) in yrow.iter_mut().zip(recips) {
        *yv *= r;
    }
}

/// `1 / taps` of every output position's window in a plane, flat: the product of each dim's [`window_count`]
/// (in f64, exact below 2^53, rounded once to f32), inverted once here rather than divided by per element — a
/// division per output cost more than the pooling itself. The result is the correctly rounded quotient within
/// about one ulp (the interpreter divides); a window with no tap gives `1 / 0 = inf`, and its sum 0 times inf
/// NaN, as the interpreter's `0 / 0`.
fn reciprocal_counts(g: &Geometry, p: &Pool) -> Vec<f32> {
    // The counts' products in row-major order: each dim multiplies out the products of the dims before it.
    let mut counts = vec![1.0f64];
    for axis in &g.axes {
        let per: Vec<f64> = axis.windows.iter().map(|w| window_count(p, w) as f64).collect();
        counts = counts.iter().flat_map(|&outer| per.iter().map(move |&c| outer * c)).collect();
    }
    counts.into_iter().map(|c| (1.0 / c) as f32).collect()
}

/// The taps of one dim's window that an average divides by: the real ones, or with `count_include_pad` those
/// inside the explicit pads too.
fn window_count(p: &Pool, w: &(usize, usize, usize)) -> usize {
    if p.count_include_pad { w.2 } else { w.1 - w.0 }
}

/// `ys[i] = max(ys[i], xs[i·stride])` where NaN wins and stays (no comparison with it is true).
#[inline(always)]
fn max_into(ys: &mut [f32], xs: &[f32], stride: usize) {
    let combine = |y: &mut f32, v: f32| *y = nan_max(*y, v);
    if stride == 1 {
        let n = ys.len();
        ys.iter_mut().zip(&xs[..n]).for_each(|(y, &v)| combine(y, v));
    } else {
        // One bounds check for the whole run instead of one per element.
        let xs = &xs[..(ys.len() - 1) * stride + 1];
        for (i, y) in ys.iter_mut().enumerate() {
            combine(y, xs[i * stride]);
        }
    }
}

/// `ys[i] += xs[i·stride]`.
#[inline(always)]
fn add_into(ys: &mut [f32], xs: &[f32], stride: usize) {
    if stride == 1 {
        let n = ys.len();
        ys.iter_mut().zip(&xs[..n]).for_each(|(y, &v)| *y += v);
    } else {
        let xs = &xs[..(ys.len() - 1) * stride + 1];
        for (i, y) in ys.iter_mut().enumerate() {
            *y += xs[i * stride];
        }
    }
}

/// `max(y, v)`, NaN when either is NaN. Written so that neither arm of the outer select is `y` itself: with
/// AVX-512, a select between a loaded value and a new one that is stored back becomes a masked store, and the
/// next pass's load of that element then stalls on it (measured: max pooling 2× slower than the SSE2 blend).
#[inline(always)]
fn nan_max(y: f32, v: f32) -> f32 {
    if y.is_nan() | v.is_nan() {
        y + v
    } else if v > y {
        v
    } else {
        y
    }
}

/// The largest element, NaN if any is NaN (-inf for none).
#[inline(always)]
fn max_of(v: &[f32]) -> f32 {
    let mut best = f32::NEG_INFINITY;
    for &x in v {
        best = nan_max(best, x);
    }
    best
}

/// A sum in eight independent lanes, which the compiler keeps in one vector register.
#[inline(always)]
fn sum_of(v: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let chunks = v.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    lanes.iter().sum::<f32>() + tail
}
