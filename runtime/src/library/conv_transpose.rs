//! `conv_transpose` on f32: N-d, NC* layout, weights `[C, M/groups, k…]`, optional bias `[M]`.
//!
//! The adjoint of `conv`'s im2col: per image and group, one GEMM multiplies the weights read transposed
//! (`[M/groups · k, C/groups]`) by the input (`[C/groups, in]`) into a column matrix whose row `(m, k…)` holds,
//! for every input position, what that position contributes through tap `k` to output channel `m`; `col2im`
//! then adds each row into the output plane at `i·stride + k·dilation − pad_begin`, dropping what lands outside.
//! The bias seeds the output. Large inputs are taken a band of input rows at a time, so the column matrix stays
//! within a few megabytes whatever the image size.

use kiln_ir::op::ConvTranspose;
use rayon::prelude::*;

use super::matmul::gemm_strided_a;
use super::{LibraryError, Par, attr_usizes, element_count, window_attrs, with_scratch};

const OP: &str = "conv_transpose";

/// The column matrix of one band holds at most this many floats (more rows than that of a single input row
/// still make a band of one row).
const BAND_FLOATS: usize = 1 << 20;

/// Multiply-adds per image below which a call stays on one thread.
const PARALLEL_WORK: usize = 1 << 18;

/// A transposed convolution's shapes and attributes, checked and converted to `usize`.
struct Geometry {
    batch: usize,
    /// Input channels.
    c: usize,
    /// Output channels.
    m: usize,
    groups: usize,
    /// Input channels per group.
    cg: usize,
    /// Output channels per group.
    mg: usize,
    input: Vec<usize>,
    kernel: Vec<usize>,
    output: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    pad_begin: Vec<usize>,
    in_size: usize,
    k_size: usize,
    out_size: usize,
}

impl Geometry {
    #[allow(clippy::too_many_arguments)]
    fn new(
        x_len: usize,
        x_shape: &[usize],
        w_len: usize,
        w_shape: &[usize],
        bias: Option<&[f32]>,
        attrs: &ConvTranspose,
        y_len: usize,
        y_shape: &[usize],
    ) -> Result<Geometry, LibraryError> {
        let [strides, dilations, pads] = window_attrs(
            OP,
            "C,M/groups",
            (x_len, x_shape),
            (w_len, w_shape),
            (y_len, y_shape),
            &attrs.strides,
            &attrs.dilations,
            &attrs.pads,
        )?;
        let sp = x_shape.len() - 2;
        let output_padding = attr_usizes(OP, "output_padding", &attrs.output_padding, sp, 0)?;
        let (batch, c, mg) = (x_shape[0], x_shape[1], w_shape[1]);
        let groups = usize::try_from(attrs.groups).unwrap_or(0);
        if groups == 0 || c % groups != 0 || w_shape[0] != c {
            return Err(LibraryError::shape(
                OP,
                format!("channels {c}, weights {w_shape:?} and groups {} disagree", attrs.groups),
            ));
        }
        let m = mg
            .checked_mul(groups)
            .ok_or_else(|| LibraryError::shape(OP, "the output channel count overflows".to_string()))?;
        if let Some(b) = bias
            && b.len() != m
        {
            return Err(LibraryError::shape(OP, format!("bias has {} elements for {m} output channels", b.len())));
        }
        let (input, kernel) = (x_shape[2..].to_vec(), w_shape[2..].to_vec());
        let mut output = Vec::with_capacity(sp);
        for d in 0..sp {
            // stride·(in − 1) + output_padding + (k − 1)·dilation + 1 − pad_begin − pad_end, in i128 so that no
            // attribute value overflows it.
            let full = strides[d] as i128 * (input[d] as i128 - 1)
                + output_padding[d] as i128
                + (kernel[d] as i128 - 1) * dilations[d] as i128
                + 1;
            let extent = full - pads[d] as i128 - pads[d + sp] as i128;
            match usize::try_from(extent) {
                Ok(e) if kernel[d] > 0 => output.push(e),
                _ => {
                    return Err(LibraryError::shape(
                        OP,
                        format!("input {input:?}, kernel {kernel:?} and pads give no output on spatial dim {d}"),
                    ));
                }
            }
        }
        let want: Vec<usize> = [batch, m].into_iter().chain(output.iter().copied()).collect();
        if y_shape != want.as_slice() {
            return Err(LibraryError::shape(OP, format!("result shape {y_shape:?} should be {want:?}")));
        }
        let k_size = element_count(OP, "w", &kernel)?;
        if mg.checked_mul(k_size).and_then(|r| r.checked_mul(*input.last().unwrap_or(&1))).is_none() {
            return Err(LibraryError::shape(OP, "the column matrix would overflow the address space"));
        }
        Ok(Geometry {
            batch,
            c,
            m,
            groups,
            cg: c / groups,
            mg,
            in_size: element_count(OP, "x", &input)?,
            k_size,
            out_size: element_count(OP, "y", &output)?,
            input,
            kernel,
            output,
            strides,
            dilations,
            pad_begin: pads[..sp].to_vec(),
        })
    }

    /// The output position along spatial dim `d` of input position `i` through tap `k`, if inside the output.
    fn position(&self, d: usize, i: usize, k: usize) -> Option<usize> {
        // i128: strides and pads may be anything up to i64::MAX without the arithmetic overflowing.
        let o = i as i128 * self.strides[d] as i128 + k as i128 * self.dilations[d] as i128 - self.pad_begin[d] as i128;
        usize::try_from(o).ok().filter(|&o| o < self.output[d])
    }

    /// The input positions `i` along spatial dim `d` whose tap `k` lands inside the output, as `lo..hi`.
    fn valid(&self, d: usize, k: usize) -> (usize, usize) {
        let (s, out, input) = (self.strides[d] as i128, self.output[d] as i128, self.input[d] as i128);
        let shift = (k * self.dilations[d]) as i128 - self.pad_begin[d] as i128;
        // 0 <= i·s + shift <= out − 1.
        let lo = if shift >= 0 { 0 } else { (-shift + s - 1) / s }.min(input);
        let last = out - 1 - shift;
        let hi = if last < 0 { 0 } else { (last / s + 1).min(input) }.max(lo);
        (lo as usize, hi as usize)
    }
}

/// N-d transposed convolution (NCHW layout, weights `[C, M/groups, k…]`, optional `bias` `[M]`) with the strides,
/// pads (all begins, then all ends), dilations, output padding and groups of [`ConvTranspose`], as the
/// interpreter defines it (up to the order of the sums). `y` of shape `y_shape` receives the result.
///
/// Errors if the shapes, attributes or slice lengths disagree (the expected `y_shape` is recomputed here).
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose_f32(
    x: &[f32],
    x_shape: &[usize],
    w: &[f32],
    w_shape: &[usize],
    bias: Option<&[f32]>,
    attrs: &ConvTranspose,
    y: &mut [f32],
    y_shape: &[usize],
    par: Par,
) -> Result<(), LibraryError> {
    let g = Geometry::new(x.len(), x_shape, w.len(), w_shape, bias, attrs, y.len(), y_shape)?;
    if y.is_empty() {
        return Ok(());
    }
    for (plane, chunk) in y.chunks_mut(g.out_size.max(1)).enumerate() {
        chunk.fill(bias.map_or(0.0, |b| b[plane % g.m]));
    }
    if g.in_size == 0 || g.c == 0 {
        return Ok(());
    }
    let (image, in_image) = (g.m * g.out_size, g.c * g.in_size);
    let per_image_work = g.in_size.saturating_mul(g.c).saturating_mul(g.mg * g.k_size);
    if par.parallel() && g.batch > 1 && (g.batch >= par.threads || per_image_work < PARALLEL_WORK) {
        y.par_chunks_mut(image).enumerate().for_each(|(n, yi)| {
            transpose_image(&g, &x[n * in_image..][..in_image], w, yi, Par::SERIAL);
        });
        return Ok(());
    }
    let inner = if per_image_work >= PARALLEL_WORK { par } else { Par::SERIAL };
    for (n, yi) in y.chunks_mut(image).enumerate() {
        transpose_image(&g, &x[n * in_image..][..in_image], w, yi, inner);
    }
    Ok(())
}

/// One image: `x` is `[C, in…]`, `yi` is `[M, out…]` (seeded with the bias).
fn transpose_image(g: &Geometry, x: &[f32], w: &[f32], yi: &mut [f32], par: Par) {
    let rows = g.mg * g.k_size;
    let in_last = *g.input.last().unwrap_or(&1);
    let outer_rows = g.in_size / in_last;
    let band = (BAND_FLOATS / (rows * in_last).max(1)).clamp(1, outer_rows);
    for group in 0..g.groups {
        // The group's weights `[C/groups, M/groups · k]`, read transposed.
        let wg = &w[group * g.cg * rows..][..g.cg * rows];
        let xg = &x[group * g.cg * g.in_size..][..g.cg * g.in_size];
        let yg = &mut yi[group * g.mg * g.out_size..][..g.mg * g.out_size];
        let mut first = 0;
        while first < outer_rows {
            let count = band.min(outer_rows - first);
            let cols = count * in_last;
            with_scratch(rows * cols, |col| {
                gemm_strided_a(
                    rows,
                    cols,
                    g.cg,
                    wg,
                    (1, rows),
                    &xg[first * in_last..],
                    g.in_size,
                    col,
                    cols,
                    false,
                    par,
                );
                col2im(g, col, first, count, yg, par);
            });
            first += count;
        }
    }
}

/// Adds the column matrix of input rows `first..first + count` (each `in_last` positions; row `(m, k…)` of
/// `col`) into the group's output planes `yg` (`[M/groups, out…]`), one plane per worker.
fn col2im(g: &Geometry, col: &[f32], first: usize, count: usize, yg: &mut [f32], par: Par) {
    let sp = g.input.len();
    let in_last = g.input[sp - 1];
    let cols = count * in_last;
    let (s_last, out_last) = (g.strides[sp - 1], g.output[sp - 1]);
    // Output strides of the spatial dims (row-major).
    let mut out_strides = vec![1usize; sp];
    for d in (0..sp - 1).rev() {
        out_strides[d] = out_strides[d + 1] * g.output[d + 1];
    }
    let plane = |m: usize, y: &mut [f32]| {
        let mut tap = vec![0usize; sp];
        let mut at = vec![0usize; sp];
        for t in 0..g.k_size {
            // The tap's multi-index, row-major.
            let mut rest = t;
            for d in (0..sp).rev() {
                tap[d] = rest % g.kernel[d];
                rest /= g.kernel[d];
            }
            let (lo, hi) = g.valid(sp - 1, tap[sp - 1]);
            if lo >= hi {
                continue;
            }
            // The output position of input `lo` (inside the output, by `valid`).
            let Some(shift) = g.position(sp - 1, lo, tap[sp - 1]) else { continue };
            let src = &col[(m * g.k_size + t) * cols..][..cols];
            'rows: for r in 0..count {
                // The input row's multi-index over the outer spatial dims, and its output row.
                let mut rest = first + r;
                for d in (0..sp - 1).rev() {
                    at[d] = rest % g.input[d];
                    rest /= g.input[d];
                }
                let mut base = 0;
                for d in 0..sp - 1 {
                    match g.position(d, at[d], tap[d]) {
                        Some(o) => base += o * out_strides[d],
                        None => continue 'rows,
                    }
                }
                let xs = &src[r * in_last + lo..r * in_last + hi];
                let ys = &mut y[base + shift..];
                debug_assert!(shift + (hi - lo - 1) * s_last < out_last);
                for (i, v) in xs.iter().enumerate() {
                    ys[i * s_last] += v;
                }
            }
        }
    };
    if par.parallel() && g.mg > 1 && cols * g.k_size * g.mg >= PARALLEL_WORK {
        yg.par_chunks_mut(g.out_size).enumerate().for_each(|(m, y)| plane(m, y));
    } else {
        for (m, y) in yg.chunks_mut(g.out_size).enumerate() {
            plane(m, y);
        }
    }
}
