//! `pool` on f32: max and average pooling over the spatial dims of `x[N,C,*]`.
//!
//! A pooling window is a product of per-dim tap sets, so each spatial dim gets a table once per call: for every
//! output position along it, the input positions its taps land on and how many taps the padded input holds. A
//! window is then the product of its dims' lists — no bounds checks in the reduction — and its divisor the product
//! of their counts. Windows covering the whole unpadded input (global pooling) reduce each plane directly.

use kiln_ir::infer::pool_extent;
use kiln_ir::op::{Pool, PoolKind};
use rayon::prelude::*;

use super::{LibraryError, Par, attr_usizes, check_len, element_count, strides_of};

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
        let axes = (0..sp)
            .map(|d| {
                let (pb, pe, n) = (pads[d], pads[d + sp], input[d]);
                let mut axis = Axis { taps: Vec::new(), windows: Vec::with_capacity(output[d]) };
                for o in 0..output[d] {
                    let start = axis.taps.len();
                    let mut padded = 0;
                    for k in 0..kernel[d] {
                        // Measured from the start of the left padding, so it stays non-negative.
                        let shifted = o * strides[d] + k * dilations[d];
                        if shifted >= pb && shifted < pb + n {
                            axis.taps.push((shifted - pb) * in_strides[d]);
                        }
                        if shifted < pb + n + pe {
                            padded += 1;
                        }
                    }
                    axis.windows.push((start, axis.taps.len(), padded));
                }
                axis
            })
            .collect();
        let global = kernel == input && pads.iter().all(|&v| v == 0) && dilations.iter().all(|&v| v == 1);
        Ok(Geometry {
            axes,
            in_size: element_count(OP, "x", input)?,
            out_size: element_count(OP, "y", &output)?,
            output,
            window: kernel.iter().product(),
            global,
        })
    }

    /// Pools one `[in…]` plane into one `[out…]` plane.
    fn pool_plane(&self, p: &Pool, x: &[f32], y: &mut [f32]) {
        let mut o = vec![0usize; self.output.len()];
        for yv in y.iter_mut() {
            *yv = match p.kind {
                PoolKind::Max => {
                    let mut best = f32::NEG_INFINITY;
                    self.for_each_tap(&o, 0, 0, &mut |off| {
                        let v = x[off];
                        // Once NaN, `best` stays NaN: no comparison with it is true.
                        if v > best || v.is_nan() {
                            best = v;
                        }
                    });
                    best
                }
                PoolKind::Avg => {
                    let mut sum = 0.0f32;
                    self.for_each_tap(&o, 0, 0, &mut |off| sum += x[off]);
                    let count: usize = self
                        .axes
                        .iter()
                        .zip(&o)
                        .map(|(a, &i)| {
                            let (lo, hi, padded) = a.windows[i];
                            if p.count_include_pad { padded } else { hi - lo }
                        })
                        .product();
                    sum / count as f32
                }
            };
            // Next output position, last dim fastest.
            for d in (0..o.len()).rev() {
                o[d] += 1;
                if o[d] < self.output[d] {
                    break;
                }
                o[d] = 0;
            }
        }
    }

    /// Calls `f(input offset)` for every real tap of the window at output position `o`, from dim `d` on.
    fn for_each_tap(&self, o: &[usize], d: usize, off: usize, f: &mut impl FnMut(usize)) {
        let axis = &self.axes[d];
        let (lo, hi, _) = axis.windows[o[d]];
        let taps = &axis.taps[lo..hi];
        if d + 1 == self.axes.len() {
            for &t in taps {
                f(off + t);
            }
        } else {
            for &t in taps {
                self.for_each_tap(o, d + 1, off + t, f);
            }
        }
    }
}

/// The largest element, NaN if any is NaN (-inf for none).
fn max_of(v: &[f32]) -> f32 {
    let mut best = f32::NEG_INFINITY;
    for &x in v {
        if x > best || x.is_nan() {
            best = x;
        }
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
