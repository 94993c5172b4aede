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
    let (in_size, out_size) = (g.in_size, g.out_size);
    let plane = |p: usize, yp: &mut [f32]| {
        let xp = &x[p * in_size..][..in_size];
        if g.global {
            yp[0] = match attrs.kind {
                PoolKind::Max => max_of(xp),
                PoolKind::Avg => sum_of(xp) / in_size as f32,
            };
        } else {
            g.pool_plane(attrs, xp, yp);
        }
    };
    let planes = y.len() / out_size;
    if par.parallel() && planes > 1 && y.len().saturating_mul(g.window) >= 1 << 15 {
        y.par_chunks_mut(out_size).enumerate().for_each(|(p, yp)| plane(p, yp));
    } else {
        for (p, yp) in y.chunks_mut(out_size).enumerate() {
            plane(p, yp);
        }
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

    /// Pools one `[in…]` plane into one `[out…]` plane, a row (the last spatial dim) at a time: for every real tap
    /// of the outer dims and every tap of the last dim, the valid run of the output row is combined with a
    /// (strided) run of the input row.
    fn pool_plane(&self, p: &Pool, x: &[f32], y: &mut [f32]) {
        let last = self.axes.len() - 1;
        let row = self.output[last];
        let max = p.kind == PoolKind::Max;
        y.fill(if max { f32::NEG_INFINITY } else { 0.0 });
        let count = |w: &(usize, usize, usize)| if p.count_include_pad { w.2 } else { w.1 - w.0 };
        let mut o = vec![0usize; last];
        // A window is its outer taps × its row taps, so each output row first reduces the input rows under its
        // outer taps into one row (contiguous, vectorized), then applies the row taps to that. With a stride
        // above 1 and several row taps, the reduced row is split into its phases (`acc[j·stride + p]`) so that
        // every row tap combines contiguous runs.
        let (s, il) = (self.row_stride, self.row_len);
        let identity = if max { f32::NEG_INFINITY } else { 0.0 };
        let mut acc = vec![identity; il];
        let phased = s > 1 && s <= il && self.row_taps.len() > 1;
        let phase_len = il.div_ceil(s);
        let mut phases = vec![0.0f32; if phased { phase_len * s } else { 0 }];
        for yrow in y.chunks_mut(row) {
            acc.fill(identity);
            self.for_each_outer_tap(&o, 0, 0, &mut |base| {
                let xrow = &x[base..base + il];
                if max {
                    max_into(&mut acc, xrow, 1);
                } else {
                    add_into(&mut acc, xrow, 1);
                }
            });
            if phased {
                split_phases(&acc, s, phase_len, &mut phases);
            }
            for &(lo, hi, first) in &self.row_taps {
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
                let outer = self.axes[..last]
                    .iter()
                    .zip(&o)
                    .fold(1usize, |acc, (a, &i)| acc.saturating_mul(count(&a.windows[i])));
                for (yv, w) in yrow.iter_mut().zip(&self.axes[last].windows) {
                    *yv /= outer.saturating_mul(count(w)) as f32;
                }
            }
            // Next row, the innermost outer dim fastest.
            for d in (0..last).rev() {
                o[d] += 1;
                if o[d] < self.output[d] {
                    break;
                }
                o[d] = 0;
            }
        }
    }

    /// Calls `f(input offset)` for every real tap of the outer dims (all but the last) of the row at outer output
    /// position `o`, from dim `d` on; once with offset 0 for 1-D pooling.
    fn for_each_outer_tap(&self, o: &[usize], d: usize, off: usize, f: &mut impl FnMut(usize)) {
        if d == o.len() {
            f(off);
            return;
        }
        let (lo, hi, _) = self.axes[d].windows[o[d]];
        for &t in &self.axes[d].taps[lo..hi] {
            self.for_each_outer_tap(o, d + 1, off + t, f);
        }
    }
}

/// `ys[i] = max(ys[i], xs[i·stride])` where NaN wins and stays (no comparison with it is true).
#[inline]
fn max_into(ys: &mut [f32], xs: &[f32], stride: usize) {
    // A select, not a conditional store, so that it compiles branch-free (random data mispredicts).
    let combine = |y: &mut f32, v: f32| *y = if (v > *y) | v.is_nan() { v } else { *y };
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

/// The largest element, NaN if any is NaN (-inf for none).
fn max_of(v: &[f32]) -> f32 {
    let mut best = f32::NEG_INFINITY;
    for &x in v {
        best = if (x > best) | x.is_nan() { x } else { best };
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
