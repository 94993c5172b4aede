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
        Ok(Geometry {
            axes,
            in_size: element_count(OP, "x", input)?,
            out_size: element_count(OP, "y", &output)?,
            output,
            window: kernel.iter().fold(1usize, |a, &k| a.saturating_mul(k)),
            global,
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

widest_vectors! {
    /// Pools the planes `first..` of `x` into `y` (whole `[out…]` planes), compiled for the widest vectors the CPU
    /// has: the row combines below are its inner loops.
    fn pool_planes(g: &Geometry, p: &Pool, x: &[f32], first: usize, y: &mut [f32]) = pool_planes_inline, pool_planes_inline;
}

#[inline(always)]
fn pool_planes_inline(g: &Geometry, p: &Pool, x: &[f32], first: usize, y: &mut [f32]) {
    let mut scratch = Scratch::new(g);
    for (i, yp) in y.chunks_mut(g.out_size).enumerate() {
        let xp = &x[(first + i) * g.in_size..][..g.in_size];
        if g.global {
            yp[0] = match p.kind {
                PoolKind::Max => max_of(xp),
                PoolKind::Avg => sum_of(xp) / g.in_size as f32,
            };
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
}

impl Scratch {
    fn new(g: &Geometry) -> Scratch {
        let last = g.axes.len() - 1;
        let phases = if g.phased() { g.row_len.div_ceil(g.row_stride) * g.row_stride } else { 0 };
        Scratch { acc: vec![0.0; g.row_len], phases: vec![0.0; phases], o: vec![0; last], rows: Vec::new() }
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
    let count = |w: &(usize, usize, usize)| if p.count_include_pad { w.2 } else { w.1 - w.0 };
    // A window is its outer taps × its row taps, so each output row first reduces the input rows under its outer
    // taps into one row (contiguous, vectorized), then applies the row taps to that. With a stride above 1 and
    // several row taps, the reduced row is split into its phases (`acc[j·stride + p]`) so that every row tap
    // combines contiguous runs.
    let (s, il) = (g.row_stride, g.row_len);
    let phased = g.phased();
    let phase_len = il.div_ceil(s);
    let Scratch { acc, phases, o, rows } = scratch;
    o.fill(0);
    for yrow in y.chunks_mut(row) {
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
            let outer = g.axes[..last]
                .iter()
                .zip(o.iter())
                .fold(1usize, |acc, (a, &i)| acc.saturating_mul(count(&a.windows[i])));
            for (yv, w) in yrow.iter_mut().zip(&g.axes[last].windows) {
                *yv /= outer.saturating_mul(count(w)) as f32;
            }
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

/// `ys[i] = max(ys[i], xs[i·stride])` where NaN wins and stays (no comparison with it is true).
#[inline]
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
#[inline]
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
fn max_of(v: &[f32]) -> f32 {
    let mut best = f32::NEG_INFINITY;
    for &x in v {
        best = nan_max(best, x);
    }
    best
}

/// A sum in eight independent lanes, which the compiler keeps in one vector register.
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
