//! `conv` on f32: N-d, NC* layout, weights `[M, C/groups, k…]`, optional bias `[M]`.
//!
//! Three strategies, chosen per call: a pointwise conv (1×…×1 kernel, stride 1, no pads) is one gemm per image
//! and group straight on the input; a conv with one input channel per group (depthwise, with or without a channel
//! multiplier) is a direct loop whose innermost loop runs along an output row; everything else copies the input
//! windows into a column matrix (`im2col`, `[C/groups · k, out]`) and multiplies the weights by it. The bias seeds
//! the result before the products accumulate into it, and the epilogue runs once per image while it is warm.

use kiln_ir::op::Conv;
use rayon::prelude::*;

use super::matmul::{gemm_rowmajor, gemm_rowmajor_raw};
use super::quant::{self, Int8};
use super::{
    Epilogue, LibraryError, Par, element_count, phase_start, split_phases, strides_of, window_attrs, with_scratch,
};

const OP: &str = "conv";

/// Convolutions with fewer multiply-adds per image than this stay on one thread.
const PARALLEL_WORK: usize = 1 << 18;

/// N-d convolution (NCHW layout, weights `[M, C/groups, k…]`, optional `bias` `[M]`) with the strides, pads (all
/// begins, then all ends), dilations and groups of [`Conv`], exactly as the interpreter defines it. `y` of shape
/// `y_shape` receives the result; `epilogue` runs once on every result element, one image at a time (offset
/// `image·M·out`).
///
/// Errors if the shapes, attributes or slice lengths disagree (the expected `y_shape` is recomputed here).
pub fn conv_f32(
    x: &[f32],
    x_shape: &[usize],
    w: &[f32],
    w_shape: &[usize],
    bias: Option<&[f32]>,
    attrs: &Conv,
    y: &mut [f32],
    y_shape: &[usize],
    epilogue: Option<Epilogue>,
    par: Par,
) -> Result<(), LibraryError> {
    let g = Geometry::new(x.len(), x_shape, w.len(), w_shape, bias, attrs, y.len(), y_shape)?;
    if y.is_empty() {
        return Ok(());
    }
    let image = g.m * g.out_size;
    let in_image = g.c * g.in_size;
    let run_epilogue = |offset: usize, block: &mut [f32]| {
        if let Some(f) = epilogue {
            f(offset, block);
        }
    };
    let per_image_work = image.saturating_mul(g.cg * g.k_size);
    if par.parallel() && g.batch > 1 && (g.batch >= par.threads || per_image_work < PARALLEL_WORK) {
        y.par_chunks_mut(image).enumerate().for_each(|(n, yi)| {
            conv_image(&g, &x[n * in_image..][..in_image], w, bias, yi, Par::SERIAL);
            run_epilogue(n * image, yi);
        });
        return Ok(());
    }
    let inner = if per_image_work >= PARALLEL_WORK { par } else { Par::SERIAL };
    for (n, yi) in y.chunks_mut(image).enumerate() {
        conv_image(&g, &x[n * in_image..][..in_image], w, bias, yi, inner);
        if inner.parallel() && epilogue.is_some() {
            // Whole channel planes per block, so blocks start on output rows.
            let block = g.m.div_ceil(inner.threads) * g.out_size;
            yi.par_chunks_mut(block).enumerate().for_each(|(i, b)| run_epilogue(n * image + i * block, b));
        } else {
            run_epilogue(n * image, yi);
        }
    }
    Ok(())
}

/// A conv call's shapes and attributes, checked and converted to `usize`.
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
    pointwise: bool,
}

impl Geometry {
    fn new(
        x_len: usize,
        x_shape: &[usize],
        w_len: usize,
        w_shape: &[usize],
        bias: Option<&[f32]>,
        attrs: &Conv,
        y_len: usize,
        y_shape: &[usize],
    ) -> Result<Geometry, LibraryError> {
        let [strides, dilations, pads] = window_attrs(
            OP,
            "M,C/groups",
            (x_len, x_shape),
            (w_len, w_shape),
            (y_len, y_shape),
            &attrs.strides,
            &attrs.dilations,
            &attrs.pads,
        )?;
        let sp = x_shape.len() - 2;
        let (batch, c, m, cg) = (x_shape[0], x_shape[1], w_shape[0], w_shape[1]);
        let groups = usize::try_from(attrs.groups).unwrap_or(0);
        if groups == 0 || c % groups != 0 || m % groups != 0 || cg.checked_mul(groups) != Some(c) {
            return Err(LibraryError::shape(
                OP,
                format!("channels {c}, weights {w_shape:?} and groups {} disagree", attrs.groups),
            ));
        }
        if let Some(b) = bias
            && b.len() != m
        {
            return Err(LibraryError::shape(OP, format!("bias has {} elements for {m} output channels", b.len())));
        }
        let (input, kernel) = (x_shape[2..].to_vec(), w_shape[2..].to_vec());
        let mut output = Vec::with_capacity(sp);
        for d in 0..sp {
            let eff = (kernel[d].max(1) - 1).checked_mul(dilations[d]).map(|e| e + 1);
            let padded = input[d].checked_add(pads[d]).and_then(|v| v.checked_add(pads[d + sp]));
            match (eff, padded) {
                (Some(eff), Some(padded)) if kernel[d] > 0 && padded >= eff => {
                    output.push((padded - eff) / strides[d] + 1);
                }
                _ => {
                    return Err(LibraryError::shape(
                        OP,
                        format!("kernel {kernel:?} does not fit the padded input {input:?} on spatial dim {d}"),
                    ));
                }
            }
        }
        let want: Vec<usize> = [batch, m].into_iter().chain(output.iter().copied()).collect();
        if y_shape != want.as_slice() {
            return Err(LibraryError::shape(OP, format!("result shape {y_shape:?} should be {want:?}")));
        }
        let k_size = element_count(OP, "w", &kernel)?;
        let out_size = element_count(OP, "y", &output)?;
        // The im2col scratch of one group must be addressable.
        if cg.checked_mul(k_size).and_then(|v| v.checked_mul(out_size)).is_none() {
            return Err(LibraryError::shape(OP, "the column matrix would overflow the address space"));
        }
        let pointwise =
            kernel.iter().all(|&k| k == 1) && strides.iter().all(|&s| s == 1) && pads.iter().all(|&p| p == 0);
        Ok(Geometry {
            batch,
            c,
            m,
            groups,
            cg,
            mg: m / groups,
            in_size: element_count(OP, "x", &input)?,
            k_size,
            out_size,
            input,
            kernel,
            output,
            strides,
            dilations,
            pad_begin: pads[..sp].to_vec(),
            pointwise,
        })
    }

    /// The range of output positions `o` along spatial dim `d` whose tap `k` lands inside the input
    /// (`o·stride + k·dilation - pad_begin` in `[0, input)`), as `lo..hi` (empty when none does).
    fn valid(&self, d: usize, k: usize) -> (usize, usize) {
        // i128: strides may be anything up to i64::MAX without the arithmetic overflowing.
        let (s, out) = (self.strides[d] as i128, self.output[d] as i128);
        let shift = (k * self.dilations[d]) as i128 - self.pad_begin[d] as i128;
        // o·s + shift >= 0  and  o·s + shift <= input - 1.
        let lo = if shift >= 0 { 0 } else { (-shift + s - 1) / s }.min(out);
        let last = self.input[d] as i128 - 1 - shift;
        let hi = if last < 0 { 0 } else { (last / s + 1).min(out) }.max(lo);
        (lo as usize, hi as usize)
    }

    /// The taps `[lo, hi)` along dim `d` whose input position for output `o` is inside the input (an interval
    /// when the dilation is 1; empty as `lo >= hi`).
    fn valid_taps(&self, d: usize, o: usize) -> (usize, usize) {
        let start = o * self.strides[d];
        let lo = self.pad_begin[d].saturating_sub(start).min(self.kernel[d]);
        let hi = (self.input[d] + self.pad_begin[d]).saturating_sub(start).min(self.kernel[d]);
        (lo, hi)
    }

    /// The input position of output `o`, tap `k` along dim `d`, if inside the input.
    fn position(&self, d: usize, o: usize, k: usize) -> Option<usize> {
        (o * self.strides[d] + k * self.dilations[d]).checked_sub(self.pad_begin[d]).filter(|&p| p < self.input[d])
    }
}

/// One image: `x` is `[C, in…]`, `yi` is `[M, out…]`.
fn conv_image(g: &Geometry, x: &[f32], w: &[f32], bias: Option<&[f32]>, yi: &mut [f32], par: Par) {
    let out = g.out_size;
    if g.cg == 1 {
        direct_image(g, x, w, bias, yi, par);
        return;
    }
    if let Some(b) = bias {
        for (plane, &bv) in yi.chunks_mut(out).zip(b) {
            plane.fill(bv);
        }
    }
    // Without a bias the products overwrite.
    let accumulate = bias.is_some();
    let (wk, group_out) = (g.cg * g.k_size, g.mg * out);
    for grp in 0..g.groups {
        let xg = &x[grp * g.cg * g.in_size..][..g.cg * g.in_size];
        let wg = &w[grp * g.mg * wk..][..g.mg * wk];
        let yg = &mut yi[grp * group_out..][..group_out];
        if g.pointwise {
            split_output_channels(g.mg, out, g.cg, wg, xg, g.in_size, yg, 0, out, accumulate, par);
            continue;
        }
        // The column matrix is built a band of output rows at a time, so that it is still in cache when the gemm
        // reads it; bands stay wide enough for an efficient gemm. With more threads, each band's gemm is split
        // by output channels among them (every worker reads the same band, writes its own channel planes).
        let row = g.output[g.output.len() - 1];
        let rows = out / row;
        let band = band_rows(wk, row, rows);
        // With several workers, the bands are evened out to a multiple of the worker count; when that leaves
        // them wide enough for an efficient gemm, each worker builds and multiplies whole bands, writing its own
        // output columns. Otherwise (small outputs, deep layers) each band's gemm is split by output channels.
        let workers = par.threads.max(1);
        let parallel_band = rows.div_ceil(rows.div_ceil(band.max(1)).max(workers).next_multiple_of(workers)).max(1);
        if par.parallel() && parallel_band * row >= MIN_PARALLEL_BAND_COLUMNS {
            let band = parallel_band;
            let bands = rows.div_ceil(band);
            let y_len = yg.len();
            let shared = SharedOut(yg.as_mut_ptr());
            (0..bands).into_par_iter().for_each(|i| {
                let first = i * band;
                let count = band.min(rows - first);
                let cols = count * row;
                let shared = &shared;
                with_scratch(wk * cols, |col| {
                    im2col(g, xg, col, first, count, Par::SERIAL);
                    // SAFETY: `shared.0` points at the group's `y_len` output elements, which outlive this
                    // loop; band `i` writes only columns `first·row .. first·row + cols` of each channel plane,
                    // which no other band writes.
                    unsafe {
                        gemm_rowmajor_raw(
                            g.mg,
                            cols,
                            wk,
                            wg,
                            wk,
                            col,
                            cols,
                            shared.0.add(first * row),
                            y_len - first * row,
                            out,
                            accumulate,
                            Par::SERIAL,
                        )
                    };
                });
            });
            continue;
        }
        for first in (0..rows).step_by(band) {
            let count = band.min(rows - first);
            let cols = count * row;
            with_scratch(wk * cols, |col| {
                im2col(g, xg, col, first, count, Par::SERIAL);
                split_output_channels(g.mg, cols, wk, wg, col, cols, yg, first * row, out, accumulate, par);
            });
        }
    }
}

/// The output matrix shared by workers that write disjoint column bands of it.
struct SharedOut(*mut f32);

// SAFETY: workers write disjoint elements through it (see its use), and the matrix outlives them.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

/// `y[m, offset..offset+cols] (+)= w[m, k] · b[k, cols]` for every output channel `m < mg` (`y` rows of `ldy`,
/// `b` rows of `ldb`), the channels split into contiguous blocks among `par.threads` workers when the product is
/// large enough, each block a serial gemm: no nested parallelism, and each worker writes only its own planes.
#[allow(clippy::too_many_arguments)]
fn split_output_channels(
    mg: usize,
    cols: usize,
    k: usize,
    w: &[f32],
    b: &[f32],
    ldb: usize,
    y: &mut [f32],
    offset: usize,
    ldy: usize,
    accumulate: bool,
    par: Par,
) {
    let work = mg.saturating_mul(cols).saturating_mul(k);
    if !par.parallel() || work < PARALLEL_WORK || mg < 2 * par.threads {
        gemm_rowmajor(mg, cols, k, w, k, b, ldb, &mut y[offset..], ldy, accumulate, Par::SERIAL);
        return;
    }
    let block = mg.div_ceil(par.threads);
    y[..mg * ldy].par_chunks_mut(block * ldy).enumerate().for_each(|(i, yc)| {
        let m = yc.len() / ldy;
        gemm_rowmajor(m, cols, k, &w[i * block * k..], k, b, ldb, &mut yc[offset..], ldy, accumulate, Par::SERIAL);
    });
}

/// Output rows per serial im2col band: about `COLUMN_BLOCK` elements of column matrix, at least `MIN_COLUMNS`
/// columns.
fn band_rows(wk: usize, row: usize, rows: usize) -> usize {
    let cols = (COLUMN_BLOCK / wk.max(1)).max(MIN_COLUMNS);
    cols.div_ceil(row).clamp(1, rows.max(1))
}

/// Column-matrix elements per serial band (1 MiB, inside L2). On a loaded 2-core AVX-512 Xeon, bands of this
/// size measured up to ~15% faster than the whole matrix for 56×56 and 112×112 outputs, and never slower.
const COLUMN_BLOCK: usize = 1 << 18;
/// Fewest columns per band for workers to take whole bands; below it they split each band's output channels.
const MIN_PARALLEL_BAND_COLUMNS: usize = 128;
/// Fewest columns per band: narrower gemms lose more to packing the weights than the cache saves.
const MIN_COLUMNS: usize = 512;

/// Calls `f(outer index, flat offset of the row from row `first`)` for `count` output rows from row `first`: a row
/// is a multi-index over all spatial dims but the last (one empty index for 1-D), rows in row-major order.
fn for_each_row(output: &[usize], first: usize, count: usize, mut f: impl FnMut(&[usize], usize)) {
    let outer = &output[..output.len() - 1];
    let row = output[output.len() - 1];
    let mut idx = vec![0; outer.len()];
    let mut rest = first;
    for d in (0..outer.len()).rev() {
        idx[d] = rest % outer[d];
        rest /= outer[d];
    }
    for r in 0..count {
        f(&idx, r * row);
        for d in (0..outer.len()).rev() {
            idx[d] += 1;
            if idx[d] < outer[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Kernel taps as multi-indices, flattened: tap `t` is `taps[t*rank..(t+1)*rank]`, in weight order.
fn kernel_taps(kernel: &[usize]) -> Vec<usize> {
    let rank = kernel.len();
    let count: usize = kernel.iter().product();
    let ks = strides_of(kernel);
    let mut taps = Vec::with_capacity(count * rank);
    for t in 0..count {
        taps.extend((0..rank).map(|d| (t / ks[d]) % kernel[d]));
    }
    taps
}

/// The input offset of an output row's start for tap `k` over all dims but the last, or `None` when the row
/// lands in the padding.
fn row_offset(g: &Geometry, in_strides: &[usize], outer: &[usize], k: &[usize]) -> Option<usize> {
    let mut off = 0;
    for d in 0..outer.len() {
        off += g.position(d, outer[d], k[d])? * in_strides[d];
    }
    Some(off)
}

/// Fills `col` (`[cg · k_size, rows · row]`) with the input under every kernel tap for `rows` output rows from row
/// `first`: row `(c, tap)`, column `p` holds `x[c, p·stride + tap·dilation - pad_begin]` (`p` counted from the
/// band's first output), or 0 in the padding.
///
/// Works an input row at a time: for each input channel, outer kernel tap and output row, the input row it reads
/// is fixed, and every tap of the last kernel dim copies a run of it. With a stride above 1 the row is first split
/// into its `stride` phases (`x[j·stride + p]`), so that those runs become contiguous copies.
fn im2col(g: &Geometry, x: &[f32], col: &mut [f32], first: usize, rows: usize, par: Par) {
    let taps = kernel_taps(&g.kernel);
    let in_strides = strides_of(&g.input);
    let (rank, last) = (g.kernel.len(), g.kernel.len() - 1);
    let (s, dil, pb) = (g.strides[last], g.dilations[last], g.pad_begin[last]);
    let (ow, il, kl) = (g.output[last], g.input[last], g.kernel[last]);
    let cols = rows * ow;
    let ranges: Vec<(usize, usize)> = (0..kl).map(|kw| g.valid(last, kw)).collect();
    // Splitting a row costs a pass over it, repaid only when several taps read it.
    let phased = s > 1 && s <= il && kl > 1;
    let phase_len = il.div_ceil(s);
    let fill_channel = |ci: usize, chunk: &mut [f32]| {
        let xc = &x[ci * g.in_size..][..g.in_size];
        let mut phases = vec![0.0f32; if phased { phase_len * s } else { 0 }];
        // `kl` consecutive col rows share their outer kernel taps.
        for (ko, group) in chunk.chunks_mut(kl * cols).enumerate() {
            let k_outer = &taps[ko * kl * rank..][..last];
            for_each_row(&g.output, first, rows, |outer, flat| {
                let Some(base) = row_offset(g, &in_strides, outer, k_outer) else {
                    for kw in 0..kl {
                        group[kw * cols + flat..][..ow].fill(0.0);
                    }
                    return;
                };
                let xrow = &xc[base..base + il];
                if phased {
                    split_phases(xrow, s, phase_len, &mut phases);
                }
                for (kw, &(lo, hi)) in ranges.iter().enumerate() {
                    let seg = &mut group[kw * cols + flat..][..ow];
                    seg[..lo].fill(0.0);
                    seg[hi..].fill(0.0);
                    if lo >= hi {
                        continue;
                    }
                    // Input index of the run's first element; `valid` keeps the run inside the row.
                    let first = lo * s + kw * dil - pb;
                    if phased {
                        let start = phase_start(first, s, phase_len);
                        seg[lo..hi].copy_from_slice(&phases[start..start + (hi - lo)]);
                    } else {
                        copy_strided(&mut seg[lo..hi], &xrow[first..], s);
                    }
                }
            });
        }
    };
    let per_channel = g.k_size * cols;
    if par.parallel() && g.cg > 1 {
        col.par_chunks_mut(per_channel).enumerate().for_each(|(ci, chunk)| fill_channel(ci, chunk));
    } else {
        for (ci, chunk) in col.chunks_mut(per_channel).enumerate() {
            fill_channel(ci, chunk);
        }
    }
}

/// Convs with one input channel per group (depthwise): output channel `mo` reads input channel `mo / mg`,
/// starting from its bias (or 0). One and two spatial dims take the register-blocked plane kernel
/// ([`depthwise_plane`]); more take a row-at-a-time loop.
fn direct_image(g: &Geometry, x: &[f32], w: &[f32], bias: Option<&[f32]>, yi: &mut [f32], par: Par) {
    let plane = PlaneGeometry::of(g);
    if let Some((plane, flat)) = plane.as_ref().and_then(|p| Some((p, p.flat()?))).filter(|_| g.mg > 1) {
        // Several output channels read each input channel (a one-channel image into many features): its padded
        // plane is built once for all of them.
        let (rows, pitch) = flat;
        let out_len = (plane.output.0 - 1) * pitch + plane.output.1;
        let mut padded = vec![0.0f32; rows * pitch];
        for (ci, ys) in yi.chunks_mut(g.mg * g.out_size).enumerate() {
            pad_plane(plane, flat, &x[ci * g.in_size..][..g.in_size], &mut padded);
            let run = |j: usize, yp: &mut [f32]| {
                let mo = ci * g.mg + j;
                let (wm, init) = (&w[mo * g.k_size..][..g.k_size], bias.map_or(0.0, |b| b[mo]));
                with_scratch(out_len, |out| plane_taps(plane, flat, &padded, wm, init, yp, out));
            };
            if par.parallel() {
                ys.par_chunks_mut(g.out_size).enumerate().for_each(|(j, yp)| run(j, yp));
            } else {
                for (j, yp) in ys.chunks_mut(g.out_size).enumerate() {
                    run(j, yp);
                }
            }
        }
        return;
    }
    if let Some(plane) = plane {
        let scratch = plane.scratch_len();
        let run = |mo: usize, yp: &mut [f32]| {
            let xc = &x[(mo / g.mg) * g.in_size..][..g.in_size];
            let init = bias.map_or(0.0, |b| b[mo]);
            let wm = &w[mo * g.k_size..][..g.k_size];
            with_scratch(scratch, |s| match plane.flat() {
                Some(flat) => depthwise_plane_flat(&plane, flat, xc, wm, init, yp, s),
                None => depthwise_plane(&plane, xc, wm, init, yp, s),
            });
        };
        if par.parallel() {
            yi.par_chunks_mut(g.out_size).enumerate().for_each(|(mo, yp)| run(mo, yp));
        } else {
            for (mo, yp) in yi.chunks_mut(g.out_size).enumerate() {
                run(mo, yp);
            }
        }
        return;
    }
    match bias {
        Some(b) => {
            for (plane, &bv) in yi.chunks_mut(g.out_size).zip(b) {
                plane.fill(bv);
            }
        }
        None => yi.fill(0.0),
    }
    let taps = kernel_taps(&g.kernel);
    let in_strides = strides_of(&g.input);
    let (rank, last) = (g.kernel.len(), g.kernel.len() - 1);
    let (s, dil, pb) = (g.strides[last], g.dilations[last], g.pad_begin[last]);
    let (ow, il, kl) = (g.output[last], g.input[last], g.kernel[last]);
    let ranges: Vec<(usize, usize)> = (0..kl).map(|kw| g.valid(last, kw)).collect();
    // As in im2col: strided input rows read by several taps are split into phases first.
    let phased = s > 1 && s <= il && kl > 1;
    let phase_len = il.div_ceil(s);
    let plane = |mo: usize, yp: &mut [f32]| {
        let xc = &x[(mo / g.mg) * g.in_size..][..g.in_size];
        let wm = &w[mo * g.k_size..][..g.k_size];
        let mut phases = vec![0.0f32; if phased { phase_len * s } else { 0 }];
        for_each_row(&g.output, 0, g.out_size / ow, |outer, flat| {
            let yrow = &mut yp[flat..flat + ow];
            // `kl` consecutive taps share their outer kernel taps, hence their input row.
            for (ko, wk) in wm.chunks(kl).enumerate() {
                let k_outer = &taps[ko * kl * rank..][..last];
                let Some(base) = row_offset(g, &in_strides, outer, k_outer) else { continue };
                let xrow = &xc[base..base + il];
                if phased {
                    split_phases(xrow, s, phase_len, &mut phases);
                }
                for (kw, &(lo, hi)) in ranges.iter().enumerate() {
                    if lo >= hi {
                        continue;
                    }
                    let first = lo * s + kw * dil - pb;
                    if phased {
                        axpy_strided(&mut yrow[lo..hi], wk[kw], &phases[phase_start(first, s, phase_len)..], 1);
                    } else {
                        axpy_strided(&mut yrow[lo..hi], wk[kw], &xrow[first..], s);
                    }
                }
            }
        });
    };
    if par.parallel() {
        yi.par_chunks_mut(g.out_size).enumerate().for_each(|(mo, yp)| plane(mo, yp));
    } else {
        for (mo, yp) in yi.chunks_mut(g.out_size).enumerate() {
            plane(mo, yp);
        }
    }
}

/// A depthwise conv's plane geometry with one or two spatial dims (one dim is a plane of one row): rows `.0`,
/// columns `.1` of input, output, kernel, stride, dilation and leading pad.
struct PlaneGeometry {
    input: (usize, usize),
    output: (usize, usize),
    kernel: (usize, usize),
    strides: (usize, usize),
    dilations: (usize, usize),
    pad_begin: (usize, usize),
}

impl PlaneGeometry {
    fn of(g: &Geometry) -> Option<PlaneGeometry> {
        let pair = |v: &[usize], one: usize| match v {
            [c] => Some((one, *c)),
            [r, c] => Some((*r, *c)),
            _ => None,
        };
        let p = PlaneGeometry {
            input: pair(&g.input, 1)?,
            output: pair(&g.output, 1)?,
            kernel: pair(&g.kernel, 1)?,
            strides: pair(&g.strides, 1)?,
            dilations: pair(&g.dilations, 1)?,
            pad_begin: pair(&g.pad_begin, 0)?,
        };
        // A padded (phase-split) row must stay about as small as the rows it pads and the outputs it serves
        // (huge pads, strides or dilations, which leave few outputs, take the general loop), in checked
        // arithmetic.
        let reach = (p.output.1.max(1) - 1)
            .checked_mul(p.strides.1)?
            .checked_add((p.kernel.1.max(1) - 1).checked_mul(p.dilations.1)?)?
            .checked_add(p.pad_begin.1)?;
        let bound = 4 * (p.input.1 + p.output.1 * p.kernel.1) + 64;
        let sizes = p.input.0 > 0 && p.input.1 > 0 && p.output.1 > 0 && p.kernel.1 > 0;
        (sizes && reach <= bound && p.strides.1 <= bound).then_some(p)
    }

    /// The input row of output row `o` through kernel row `k`, if inside the input.
    fn input_row(&self, o: usize, k: usize) -> Option<usize> {
        let r = o as i128 * self.strides.0 as i128 + k as i128 * self.dilations.0 as i128 - self.pad_begin.0 as i128;
        usize::try_from(r).ok().filter(|&r| r < self.input.0)
    }

    /// How [`depthwise_plane`] lays out input rows: whether they are copied (padded, phase-split), the padded
    /// width (every column an output row reads, from the first leading pad on, the row itself at least), the
    /// phase length and the length of a laid-out row.
    fn rows(&self) -> (bool, usize, usize, usize) {
        let reach = (self.output.1 - 1) * self.strides.1 + (self.kernel.1 - 1) * self.dilations.1 + 1;
        let width = reach.max(self.pad_begin.1 + self.input.1);
        let sw = self.strides.1;
        let copied = sw > 1 || width > self.input.1;
        let phase_len = width.div_ceil(sw);
        (copied, width, phase_len, if copied { sw * phase_len } else { self.input.1 })
    }

    /// The scratch floats [`depthwise_plane`] or [`depthwise_plane_flat`] needs.
    fn scratch_len(&self) -> usize {
        if let Some((rows, pitch)) = self.flat() {
            return (rows + self.output.0) * pitch;
        }
        match self.rows() {
            (true, width, _, row_len) => self.input.0 * row_len + width,
            _ => 0,
        }
    }

    /// For a conv of stride 1, the rows and pitch of the padded input plane [`depthwise_plane_flat`] reads: every
    /// row and column an output reads, from the first leading pad on. `None` for other strides, or when the
    /// vertical padding would make the plane much larger than the input and output.
    fn flat(&self) -> Option<(usize, usize)> {
        if self.strides != (1, 1) || self.output.0 == 0 || self.kernel.0 == 0 {
            return None;
        }
        let reach = (self.output.0 - 1).checked_add((self.kernel.0 - 1).checked_mul(self.dilations.0)?)? + 1;
        let rows = reach.max(self.pad_begin.0.checked_add(self.input.0)?);
        (rows <= 4 * (self.input.0 + self.output.0 * self.kernel.0) + 64).then(|| (rows, self.rows().1))
    }
}

/// One output plane of a depthwise conv: `xc` is the input plane, `wm` the plane's kernel, `init` its bias (or 0).
/// Every output row sums its taps in registers through [`madd_rows`], blocks of 32 and 8 columns at a time,
/// each tap a contiguous run of an input row: when the row's padding or a column stride above 1 would break
/// that, the plane's rows are first copied (into `scratch`, [`PlaneGeometry::scratch_len`] floats of any
/// contents) with zeros in the padding and split into their stride phases. Kernel rows that fall in the padding
/// are skipped.
fn depthwise_plane(p: &PlaneGeometry, xc: &[f32], wm: &[f32], init: f32, yp: &mut [f32], scratch: &mut [f32]) {
    let ((ih, iw), (oh, ow), (kh, kw)) = (p.input, p.output, p.kernel);
    let (sw, dw, pw) = (p.strides.1, p.dilations.1, p.pad_begin.1);
    let (copied, width, phase_len, row_len) = p.rows();
    if copied {
        let (rows, padded) = scratch.split_at_mut(ih * row_len);
        // Only the row's own columns change from row to row: the padding is zeroed once.
        padded.fill(0.0);
        for (row, out) in xc.chunks_exact(iw).zip(rows.chunks_exact_mut(row_len)) {
            padded[pw..pw + iw].copy_from_slice(row);
            if sw == 1 {
                out.copy_from_slice(&padded[..width]);
            } else {
                split_phases(&padded[..width], sw, phase_len, out);
            }
        }
    }
    let src: &[f32] = if copied { &scratch[..ih * row_len] } else { xc };
    // Where kernel column kx's run over the output row starts in a (padded, phase-split) input row.
    let starts: Vec<usize> =
        (0..kw).map(|kx| if copied { phase_start(kx * dw, sw, phase_len) } else { kx * dw }).collect();
    let mut taps: Vec<(&[f32], f32)> = Vec::with_capacity(kh * kw);
    for (o, yrow) in yp.chunks_exact_mut(ow).enumerate().take(oh) {
        taps.clear();
        for ky in 0..kh {
            let Some(r) = p.input_row(o, ky) else { continue };
            let row = &src[r * row_len..][..row_len];
            taps.extend(starts.iter().zip(&wm[ky * kw..][..kw]).map(|(&start, &wv)| (&row[start..start + ow], wv)));
        }
        madd_rows(yrow, init, &taps);
    }
}

/// [`depthwise_plane`] for a stride of 1: the input is copied into a zero-padded plane of pitch `pitch`
/// ([`pad_plane`]), where every tap `(ky, kx)` of output `(o, c)` — flat index `o·pitch + c` — reads the flat
/// element `ky·dil·pitch + kx·dil` further on, so the whole plane is one long run per tap ([`plane_taps`]).
fn depthwise_plane_flat(
    p: &PlaneGeometry,
    flat: (usize, usize),
    xc: &[f32],
    wm: &[f32],
    init: f32,
    yp: &mut [f32],
    scratch: &mut [f32],
) {
    let (plane, out) = scratch.split_at_mut(flat.0 * flat.1);
    pad_plane(p, flat, xc, plane);
    plane_taps(p, flat, plane, wm, init, yp, out);
}

/// Copies the input plane `xc` into `plane` (`rows × pitch`, from [`PlaneGeometry::flat`]) with zeros around it.
fn pad_plane(p: &PlaneGeometry, (_, pitch): (usize, usize), xc: &[f32], plane: &mut [f32]) {
    let iw = p.input.1;
    let (ph, pw) = p.pad_begin;
    plane.fill(0.0);
    for (r, row) in xc.chunks_exact(iw).enumerate() {
        plane[(ph + r) * pitch + pw..][..iw].copy_from_slice(row);
    }
}

/// One output plane of a stride-1 conv from its padded input plane (see [`depthwise_plane_flat`]): [`madd_rows`]
/// at full width whatever the row length, into `out` (`(oh - 1)·pitch + ow` floats of any contents) when the
/// pitch differs from the output row, whose `ow` real columns of each row are then copied out.
fn plane_taps(
    p: &PlaneGeometry,
    (_, pitch): (usize, usize),
    plane: &[f32],
    wm: &[f32],
    init: f32,
    yp: &mut [f32],
    out: &mut [f32],
) {
    let (oh, ow, (kh, kw)) = (p.output.0, p.output.1, p.kernel);
    let (dh, dw) = p.dilations;
    let n = (oh - 1) * pitch + ow;
    let mut taps: Vec<(&[f32], f32)> = Vec::with_capacity(kh * kw);
    for ky in 0..kh {
        for kx in 0..kw {
            let off = ky * dh * pitch + kx * dw;
            taps.push((&plane[off..off + n], wm[ky * kw + kx]));
        }
    }
    if pitch == ow {
        madd_rows(&mut yp[..n], init, &taps);
        return;
    }
    madd_rows(&mut out[..n], init, &taps);
    for (o, yrow) in yp.chunks_exact_mut(ow).enumerate().take(oh) {
        yrow.copy_from_slice(&out[o * pitch..][..ow]);
    }
}

widest_vectors! {
    /// `y[i] = init + Σ_t w_t · x_t[i]` over the taps `(x_t, w_t)` (each `x_t` as long as `y`), compiled for the
    /// widest vectors this CPU has.
    fn madd_rows(y: &mut [f32], init: f32, taps: &[(&[f32], f32)]) = madd_rows_with::<true>, madd_rows_with::<false>;
}

/// [`madd_rows`]: `FMA` fuses each multiply-add (only where the CPU has the instruction; elsewhere `mul_add`
/// would be a library call).
#[inline(always)]
fn madd_rows_with<const FMA: bool>(y: &mut [f32], init: f32, taps: &[(&[f32], f32)]) {
    /// `y[i..i + B] = init + Σ_t w_t · x_t[i..i + B]`.
    #[inline(always)]
    fn block<const FMA: bool, const B: usize>(y: &mut [f32], i: usize, init: f32, taps: &[(&[f32], f32)]) {
        let mut acc = [init; B];
        for &(x, w) in taps {
            let xs: &[f32; B] = x[i..i + B].try_into().expect("a block of the tap's row");
            for (a, &v) in acc.iter_mut().zip(xs) {
                *a = if FMA { w.mul_add(v, *a) } else { *a + w * v };
            }
        }
        y[i..i + B].copy_from_slice(&acc);
    }
    let n = y.len();
    if n < 8 {
        // Tap by tap, so that the elements' sums do not wait on one another.
        y.fill(init);
        for &(x, w) in taps {
            for (v, &xv) in y.iter_mut().zip(x) {
                *v = if FMA { w.mul_add(xv, *v) } else { *v + w * xv };
            }
        }
        return;
    }
    let mut i = 0;
    while i + 32 <= n {
        block::<FMA, 32>(y, i, init, taps);
        i += 32;
    }
    // What is left, at most three blocks of 8 and a ragged end, in one pass over the taps (independent sums in
    // flight); the ragged end is the row's last 8 elements, whose overlap with a block is summed the same.
    match (n - i) / 8 {
        3 => block::<FMA, 24>(y, i, init, taps),
        2 => block::<FMA, 16>(y, i, init, taps),
        1 => block::<FMA, 8>(y, i, init, taps),
        _ => {}
    }
    if !n.is_multiple_of(8) {
        block::<FMA, 8>(y, n - 8, init, taps);
    }
}

/// `ys[i] = xs[i·stride]`.
#[inline]
fn copy_strided(ys: &mut [f32], xs: &[f32], stride: usize) {
    let n = ys.len();
    if stride == 1 {
        ys.copy_from_slice(&xs[..n]);
    } else if n > 0 {
        // One bounds check for the run instead of one per element.
        let xs = &xs[..(n - 1) * stride + 1];
        for (i, y) in ys.iter_mut().enumerate() {
            *y = xs[i * stride];
        }
    }
}

/// `ys[i] += a · xs[i·stride]`.
#[inline]
fn axpy_strided(ys: &mut [f32], a: f32, xs: &[f32], stride: usize) {
    let n = ys.len();
    if stride == 1 {
        for (y, &x) in ys.iter_mut().zip(&xs[..n]) {
            *y += a * x;
        }
    } else if n > 0 {
        let xs = &xs[..(n - 1) * stride + 1];
        for (i, y) in ys.iter_mut().enumerate() {
            *y += a * xs[i * stride];
        }
    }
}

/// ONNX ConvInteger: `y = conv(x − x_zero, w − w_zero)` in i32 (padding adds 0), any groups, strides, pads,
/// dilations and spatial rank; `x_zero` one value, `w_zero` one value or one per output channel. Per image and
/// group: the im2col matrix of `x − x_zero` as i16, packed in k-pairs, times the group's weight rows
/// ([`super::quant::gemm`]).
#[allow(clippy::too_many_arguments)]
pub fn conv_integer(
    x: Int8<'_>,
    x_shape: &[usize],
    w: Int8<'_>,
    w_shape: &[usize],
    x_zero: Int8<'_>,
    w_zero: Int8<'_>,
    attrs: &Conv,
    y: &mut [i32],
    y_shape: &[usize],
    par: Par,
) -> Result<(), LibraryError> {
    const OP: &str = "conv_integer";
    let g = Geometry::new(x.bytes.len(), x_shape, w.bytes.len(), w_shape, None, attrs, y.len(), y_shape)
        .map_err(|e| LibraryError::shape(OP, e.to_string()))?;
    if x_zero.bytes.len() != 1 || (w_zero.bytes.len() != 1 && w_zero.bytes.len() != g.m) {
        return Err(LibraryError::shape(
            OP,
            format!(
                "zero points of {} and {} values, expected 1 and 1 or {}",
                x_zero.bytes.len(),
                w_zero.bytes.len(),
                g.m
            ),
        ));
    }
    if y.is_empty() {
        return Ok(());
    }
    let (kdim, p) = (g.cg * g.k_size, g.out_size);
    let xz = x_zero.get(0);
    let weights: Vec<Vec<i16>> = (0..g.groups)
        .map(|grp| {
            quant::shifted_rows(w, g.mg, kdim, |r| (grp * g.mg + r) * kdim, |r| quant::zero_at(w_zero, grp * g.mg + r))
        })
        .collect();
    let taps = kernel_taps(&g.kernel);
    quant::with_scratch(|[_, col, panels]| {
        col.resize(kdim * p, 0);
        for n in 0..g.batch {
            for (grp, a) in weights.iter().enumerate() {
                let first_channel = n * g.c + grp * g.cg;
                im2col_shifted(&g, &taps, x, first_channel, xz, col);
                let col: &[i16] = col;
                let packed = quant::PackedPairs::new_in(std::mem::take(panels), kdim, p, |kk, j| col[kk * p + j]);
                let out = &mut y[(n * g.m + grp * g.mg) * p..][..g.mg * p];
                quant::gemm(a, g.mg, &packed, out, par);
                *panels = packed.into_data();
            }
        }
    });
    Ok(())
}

/// One window row of a patch (`seg`: its taps of `cg` bytes each): taps `lo..hi` copied from `src` (their pixels,
/// adjacent channels-last), the taps before and after them — and all of them without `src` — the zero point.
#[inline]
fn tap_run(seg: &mut [u8], lo: usize, hi: usize, cg: usize, src: Option<&[u8]>, zero: u8) {
    match src {
        Some(src) => {
            seg[..lo * cg].fill(zero);
            seg[lo * cg..hi * cg].copy_from_slice(&src[..(hi - lo) * cg]);
            seg[hi * cg..].fill(zero);
        }
        None => seg.fill(zero),
    }
}

/// Positions `first..first + out.len() / c` of a channel-major image (`c` planes of `plane` bytes) laid out
/// channels-last into `out` (`out[i·c + ch] = image[ch·plane + first + i] ^ flip`): 16×16 byte blocks transposed
/// in SSE2 registers, the ragged channels and positions byte by byte.
fn channels_last(image: &[u8], plane: usize, first: usize, out: &mut [u8], c: usize, flip: u8) {
    let count = out.len() / c.max(1);
    let (full_c, full_p) = (c / 16 * 16, count / 16 * 16);
    #[cfg(target_arch = "x86_64")]
    for ch0 in (0..full_c).step_by(16) {
        for p0 in (0..full_p).step_by(16) {
            use std::arch::x86_64::*;
            // SAFETY: SSE2 is part of x86-64. Rows ch0..ch0 + 16 hold 16 bytes from `first + p0` (p0 + 16 ≤ count
            // positions of the block, inside the plane), and positions p0..p0 + 16 of `out` hold 16 bytes from
            // channel ch0 (ch0 + 16 ≤ c): every load and store is inside its slice, as the slicing checks.
            unsafe {
                let f = _mm_set1_epi8(flip as i8);
                let rows: [__m128i; 16] = std::array::from_fn(|k| {
                    let src = &image[(ch0 + k) * plane + first + p0..][..16];
                    _mm_xor_si128(_mm_loadu_si128(src.as_ptr().cast()), f)
                });
                for (j, col) in transpose16(rows).into_iter().enumerate() {
                    let dst = &mut out[(p0 + j) * c + ch0..][..16];
                    _mm_storeu_si128(dst.as_mut_ptr().cast(), col);
                }
            }
        }
    }
    let simd = cfg!(target_arch = "x86_64");
    for ch in 0..c {
        let src = &image[ch * plane + first..][..count];
        // What the blocks above did not cover: the channels past the last whole 16, or the positions past it.
        let from = if simd && ch < full_c { full_p } else { 0 };
        for (i, &v) in src.iter().enumerate().skip(from) {
            out[i * c + ch] = v ^ flip;
        }
    }
}

/// The transpose of a 16×16 byte block (rows in, columns out): byte, word, dword and qword interleaves.
#[cfg(target_arch = "x86_64")]
fn transpose16(r: [std::arch::x86_64::__m128i; 16]) -> [std::arch::x86_64::__m128i; 16] {
    use std::arch::x86_64::*;
    // SAFETY (every block below): SSE2 is part of x86-64; these are register-only operations.
    let t: [__m128i; 16] = std::array::from_fn(|i| unsafe {
        let (a, b) = (r[2 * (i % 8)], r[2 * (i % 8) + 1]);
        if i < 8 { _mm_unpacklo_epi8(a, b) } else { _mm_unpackhi_epi8(a, b) }
    });
    // u[8h + 4q + 2s + w]: columns 8h + 4w .. + 4, rows 8q + 4s .. + 4, from t[8h + 4q + 2s] and the next.
    let u: [__m128i; 16] = std::array::from_fn(|i| unsafe {
        let (h, q, s, w) = (i / 8, (i / 4) % 2, (i / 2) % 2, i % 2);
        let (a, b) = (t[8 * h + 4 * q + 2 * s], t[8 * h + 4 * q + 2 * s + 1]);
        if w == 0 { _mm_unpacklo_epi16(a, b) } else { _mm_unpackhi_epi16(a, b) }
    });
    // v[8h + 4w + 2q + z]: columns 8h + 4w + 2z .. + 2, rows 8q .. + 8.
    let v: [__m128i; 16] = std::array::from_fn(|i| unsafe {
        let (h, w, q, z) = (i / 8, (i / 4) % 2, (i / 2) % 2, i % 2);
        let (a, b) = (u[8 * h + 4 * q + w], u[8 * h + 4 * q + 2 + w]);
        if z == 0 { _mm_unpacklo_epi32(a, b) } else { _mm_unpackhi_epi32(a, b) }
    });
    // Column 8h + 4w + 2z + e: rows 0..8 from v[8h + 4w + z], rows 8..16 from v[8h + 4w + 2 + z].
    std::array::from_fn(|col| unsafe {
        let (h, w, z, e) = (col / 8, (col / 4) % 2, (col / 2) % 2, col % 2);
        let (a, b) = (v[8 * h + 4 * w + z], v[8 * h + 4 * w + 2 + z]);
        if e == 0 { _mm_unpacklo_epi64(a, b) } else { _mm_unpackhi_epi64(a, b) }
    })
}

/// Input positions per task when a VNNI conv lays its input out channels-last.
const HWC_BLOCK: usize = 64;

thread_local! {
    /// The channels-last image of the last VNNI conv on this thread.
    static NHWC: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// [`conv_integer`] with weights packed by [`quant::PackedConvInt8::pack`], on AVX-512 VNNI: per image the input
/// is laid out channels-last once (in u8 terms: an i8 input xored with 0x80, its zero point moved by 128), each
/// output position's patch is one row of the left operand — tap-major, channels innermost, so a patch row of a
/// one-group conv with unit dilation along the last dim is one copy per outer tap, and taps in the padding hold
/// the zero point (they add nothing) — and each group is one u8 × s8 product of `[positions, taps·cg]` by the
/// packed `[taps·cg, mg]`, its tiles stored channel-major (transposed in registers). Same results as
/// [`conv_integer`] (exact wrapping i32).
#[allow(clippy::too_many_arguments)]
pub fn conv_integer_packed(
    x: Int8<'_>,
    x_shape: &[usize],
    x_zero: Int8<'_>,
    w: &quant::PackedConvInt8,
    attrs: &Conv,
    y: &mut [i32],
    y_shape: &[usize],
    par: Par,
) -> Result<(), LibraryError> {
    const OP: &str = "conv_integer";
    let w_len = element_count(OP, "w", w.shape())?;
    let g = Geometry::new(x.bytes.len(), x_shape, w_len, w.shape(), None, attrs, y.len(), y_shape)
        .map_err(|e| LibraryError::shape(OP, e.to_string()))?;
    if x_zero.bytes.len() != 1 {
        return Err(LibraryError::shape(OP, format!("an input zero point of {} values", x_zero.bytes.len())));
    }
    if w.group(g.groups - 1).is_none() || w.group(g.groups).is_some() {
        return Err(LibraryError::shape(OP, format!("weights packed for another group count than {}", g.groups)));
    }
    if y.is_empty() {
        return Ok(());
    }
    let flip = if x.signed { 0x80u8 } else { 0 };
    let za = x_zero.get(0) + i32::from(flip);
    let (c, cg, mg, p, in_size) = (g.c, g.cg, g.mg, g.out_size, g.in_size);
    let (rank, taps) = (g.kernel.len(), kernel_taps(&g.kernel));
    let count = taps.len() / rank.max(1);
    let last = rank - 1;
    let kw = g.kernel[last];
    let in_strides = strides_of(&g.input);
    // One copy per outer tap when a patch's taps along the last dim are adjacent pixels of all channels.
    let runs = g.groups == 1 && g.dilations[last] == 1;
    let parallel = par.parallel() && p.saturating_mul(g.m).saturating_mul(cg * count) >= PARALLEL_WORK;
    let mut hwc = NHWC.with(std::cell::Cell::take);
    for n in 0..g.batch {
        let image = &x.bytes[n * c * in_size..][..c * in_size];
        // The buffer only grows: shrinking it would make a later, larger image zero the difference again.
        if hwc.len() < in_size * c {
            hwc.resize(in_size * c, 0);
        }
        let used = &mut hwc[..in_size * c];
        let to_hwc = |(b, block): (usize, &mut [u8])| channels_last(image, in_size, b * HWC_BLOCK, block, c, flip);
        if parallel {
            used.par_chunks_mut(HWC_BLOCK * c).enumerate().for_each(to_hwc);
        } else {
            used.chunks_mut(HWC_BLOCK * c).enumerate().for_each(to_hwc);
        }
        let hwc: &[u8] = used;
        for grp in 0..g.groups {
            let Some(b) = w.group(grp) else { break };
            let fill = |r: usize, row: &mut [u8]| {
                // The output position's index per dim (spatial ranks up to MAX_PACKED_RANK: see the packing).
                let mut o = [0usize; quant::MAX_PACKED_RANK];
                let mut rest = r;
                for d in (0..rank).rev() {
                    (o[d], rest) = (rest % g.output[d], rest / g.output[d]);
                }
                for ot in 0..count / kw.max(1) {
                    let k = &taps[ot * kw * rank..][..rank];
                    let seg = &mut row[ot * kw * cg..][..kw * cg];
                    let mut offset = Some(0);
                    for d in 0..last {
                        offset = offset.and_then(|off| g.position(d, o[d], k[d]).map(|i| off + i * in_strides[d]));
                    }
                    let Some(off) = offset else {
                        seg.fill(za as u8);
                        continue;
                    };
                    let at = |t: usize| g.position(last, o[last], t).map(|i| (off + i) * c + grp * cg);
                    if runs {
                        let (lo, hi) = g.valid_taps(last, o[last]);
                        tap_run(seg, lo, hi, cg, at(lo).filter(|_| lo < hi).map(|src| &hwc[src..]), za as u8);
                    } else {
                        for (t, tap) in seg.chunks_mut(cg).enumerate() {
                            match at(t) {
                                Some(src) => tap.copy_from_slice(&hwc[src..][..cg]),
                                None => tap.fill(za as u8),
                            }
                        }
                    }
                }
            };
            let out = &mut y[(n * g.m + grp * mg) * p..][..mg * p];
            if rank == 2 && runs {
                // The common 2-D one-group conv: per row of the window, one copy of the valid taps' pixels.
                let (ow_n, kh_n) = (g.output[1], g.kernel[0]);
                let run = kw * c;
                let plain = |r: usize, row: &mut [u8]| {
                    let (oh, ow) = (r / ow_n, r % ow_n);
                    let (lo, hi) = g.valid_taps(1, ow);
                    for (kh, seg) in row.chunks_exact_mut(run).take(kh_n).enumerate() {
                        let src = g.position(0, oh, kh).filter(|_| lo < hi).map(|ih| {
                            let iw = ow * g.strides[1] + lo - g.pad_begin[1];
                            &hwc[(ih * g.input[1] + iw) * c..]
                        });
                        tap_run(seg, lo, hi, c, src, za as u8);
                    }
                };
                quant::conv_gemm(p, plain, za, b, out, par);
            } else {
                quant::conv_gemm(p, fill, za, b, out, par);
            }
        }
    }
    NHWC.with(|s| s.set(hwc));
    Ok(())
}

/// The im2col matrix `[cg·taps, out_size]` of `x − x_zero` for the `cg` channels from `first_channel` (counted
/// over the whole input, images included); positions in the padding are 0.
fn im2col_shifted(g: &Geometry, taps: &[usize], x: Int8<'_>, first_channel: usize, xz: i32, col: &mut [i16]) {
    let rank = g.kernel.len();
    let last = rank - 1;
    let (ow, p) = (g.output[last], g.out_size);
    let in_strides = strides_of(&g.input);
    let out_strides = strides_of(&g.output);
    let count = taps.len() / rank.max(1);
    for ci in 0..g.cg {
        let base = (first_channel + ci) * g.in_size;
        for t in 0..count {
            let k = &taps[t * rank..][..rank];
            let row = &mut col[(ci * count + t) * p..][..p];
            let (lo, hi) = g.valid(last, k[last]);
            for (o, seg) in row.chunks_mut(ow.max(1)).enumerate() {
                seg.fill(0);
                // The input offset of this output row for tap k, over all dims but the last.
                let mut offset = Some(base);
                for d in 0..last {
                    let od = (o * ow / out_strides[d].max(1)) % g.output[d].max(1);
                    offset = offset.and_then(|off| g.position(d, od, k[d]).map(|i| off + i * in_strides[d]));
                }
                let Some(off) = offset else { continue };
                for (oi, v) in seg.iter_mut().enumerate().take(hi).skip(lo) {
                    let i = oi * g.strides[last] + k[last] * g.dilations[last] - g.pad_begin[last];
                    *v = (x.get(off + i) - xz) as i16;
                }
            }
        }
    }
}
