//! `roi_align`: ONNX RoiAlign after its reference (`onnx/reference/ops/op_roi_align.py`, a port of ONNX
//! Runtime's kernel): per box, the bilinear sampling positions and weights of every bin are worked out once and
//! serve every channel.

use super::super::num::Real;
use super::{load, store, with_real};
use crate::op::{PoolKind, RoiAlign};
use crate::tensor::Tensor;

/// The most sampling points one bin may take (a huge box with `sampling_ratio` 0 asks for `ceil(box / output)`
/// per dim): past it the call is an error, not a loop that runs for hours.
const MAX_SAMPLES_PER_BIN: u64 = 1 << 20;

/// `roi_align(x, rois, batch_indices)` on tensors (any float data; the type rule checked the shapes).
pub(super) fn roi_align(a: &RoiAlign, inputs: &[&Tensor], out_shape: &[usize]) -> Result<Tensor, String> {
    let (x, rois, idx) = (inputs[0], inputs[1], inputs[2]);
    let indices = idx.to_i64_vec();
    with_real!(x.dtype(), F => {
        let mut out = vec![F::ZERO; out_shape.iter().product()];
        pool(a, &load::<F>(x), x.shape(), &load::<F>(rois), &indices, &mut out)?;
        store(x.dtype(), out_shape, out)
    })
}

/// `roi_align` on f32 data and boxes and i64 batch indices, into `out` (`[R, C, output_height, output_width]`):
/// the CPU runtime's routine.
///
/// Errors if the shapes or lengths disagree, a batch index names no image, or a bin would take more than 2^20
/// samples.
pub fn roi_align_f32(
    a: &RoiAlign,
    x: &[f32],
    x_shape: &[usize],
    rois: &[f32],
    batch_indices: &[i64],
    out: &mut [f32],
) -> Result<(), String> {
    pool(a, x, x_shape, rois, batch_indices, out)
}

/// One sampling point: the four corner offsets in the image plane and their weights (all 0 outside).
#[derive(Clone, Copy)]
struct Sample<F> {
    at: [usize; 4],
    w: [F; 4],
}

fn pool<F: Real + Into<f64>>(
    a: &RoiAlign,
    x: &[F],
    xs: &[usize],
    rois: &[F],
    idx: &[i64],
    out: &mut [F],
) -> Result<(), String> {
    let [batch, channels, height, width] = xs[..] else {
        return Err(format!("data {xs:?} is not [N, C, H, W]"));
    };
    let (oh, ow) = (a.output_height.max(1) as usize, a.output_width.max(1) as usize);
    let count = idx.len();
    if x.len() != batch * channels * height * width
        || rois.len() != 4 * count
        || out.len() != count * channels * oh * ow
    {
        return Err(format!(
            "{} data, {} box and {} result elements for data {xs:?} and {count} boxes",
            x.len(),
            rois.len(),
            out.len()
        ));
    }
    let (scale, offset) = (F::of_f64(a.spatial_scale), F::of_f64(if a.half_pixel { 0.5 } else { 0.0 }));
    let (h, w) = (F::of_f64(height as f64), F::of_f64(width as f64));
    let minus_one = -F::ONE;
    let mut samples: Vec<Sample<F>> = Vec::new();
    for (r, &b) in idx.iter().enumerate() {
        let image = usize::try_from(b)
            .ok()
            .filter(|&b| b < batch)
            .ok_or_else(|| format!("box {r}: batch index {b} names no image of {batch}"))?;
        let corner = |k: usize| rois[4 * r + k] * scale - offset;
        let (start_w, start_h, end_w, end_h) = (corner(0), corner(1), corner(2), corner(3));
        let (mut roi_w, mut roi_h) = (end_w - start_w, end_h - start_h);
        if !a.half_pixel {
            roi_w = max(roi_w, F::ONE);
            roi_h = max(roi_h, F::ONE);
        }
        let (bin_h, bin_w) = (roi_h / F::of_f64(oh as f64), roi_w / F::of_f64(ow as f64));
        let grid = |extent: F| -> u64 {
            if a.sampling_ratio > 0 {
                a.sampling_ratio as u64
            } else {
                let v: f64 = to_f64(extent).ceil();
                if v > 0.0 { v.min(u64::MAX as f64) as u64 } else { 0 }
            }
        };
        let (grid_h, grid_w) = (grid(bin_h), grid(bin_w));
        let per_bin = grid_h.checked_mul(grid_w).filter(|&p| p <= MAX_SAMPLES_PER_BIN).ok_or_else(|| {
            format!("box {r}: a bin of {grid_h}×{grid_w} sampling points is too many (box {roi_w:?}×{roi_h:?})")
        })? as usize;
        let (gh, gw) = (F::of_f64(grid_h as f64), F::of_f64(grid_w as f64));
        samples.clear();
        for ph in 0..oh {
            for pw in 0..ow {
                for iy in 0..grid_h {
                    let yy = start_h + F::of_f64(ph as f64) * bin_h + F::of_f64(iy as f64 + 0.5) * bin_h / gh;
                    for ix in 0..grid_w {
                        let xx = start_w + F::of_f64(pw as f64) * bin_w + F::of_f64(ix as f64 + 0.5) * bin_w / gw;
                        samples.push(bilinear(yy, xx, h, w, height, width, minus_one));
                    }
                }
            }
        }
        let divisor = F::of_f64(per_bin.max(1) as f64);
        for c in 0..channels {
            let plane = &x[(image * channels + c) * height * width..][..height * width];
            let dst = &mut out[(r * channels + c) * oh * ow..][..oh * ow];
            for (bin, o) in dst.iter_mut().enumerate() {
                let taps = samples[bin * per_bin..(bin + 1) * per_bin].iter();
                *o = match a.mode {
                    PoolKind::Avg => {
                        let mut acc = F::ZERO;
                        for s in taps {
                            acc = acc
                                + (s.w[0] * plane[s.at[0]]
                                    + s.w[1] * plane[s.at[1]]
                                    + s.w[2] * plane[s.at[2]]
                                    + s.w[3] * plane[s.at[3]]);
                        }
                        acc / divisor
                    }
                    PoolKind::Max => {
                        let mut best: Option<F> = None;
                        for s in taps {
                            let v = (1..4).fold(s.w[0] * plane[s.at[0]], |m, k| max(m, s.w[k] * plane[s.at[k]]));
                            best = Some(best.map_or(v, |b| max(b, v)));
                        }
                        best.unwrap_or(F::ZERO)
                    }
                };
            }
        }
    }
    Ok(())
}

/// The larger of two values as Python's `max` picks it: `b` only when it is greater.
fn max<F: Real>(a: F, b: F) -> F {
    if b > a { b } else { a }
}

fn to_f64<F: Real + Into<f64>>(v: F) -> f64 {
    v.into()
}

/// The sampling point `(y, x)`: zero weights more than one pixel outside the image, else the four corners
/// around the point clamped into the image.
fn bilinear<F: Real + Into<f64>>(y: F, x: F, h: F, w: F, height: usize, width: usize, minus_one: F) -> Sample<F> {
    // NaN coordinates fail every comparison: sample nothing; so does an empty image.
    if !(y >= minus_one && y <= h && x >= minus_one && x <= w) || height == 0 || width == 0 {
        return Sample { at: [0; 4], w: [F::ZERO; 4] };
    }
    let (mut y, mut x) = (max(y, F::ZERO), max(x, F::ZERO));
    let (mut y_low, mut x_low) = (to_f64(y) as usize, to_f64(x) as usize);
    let y_high = if y_low >= height - 1 {
        y_low = height - 1;
        y = F::of_f64(y_low as f64);
        y_low
    } else {
        y_low + 1
    };
    let x_high = if x_low >= width - 1 {
        x_low = width - 1;
        x = F::of_f64(x_low as f64);
        x_low
    } else {
        x_low + 1
    };
    let (ly, lx) = (y - F::of_f64(y_low as f64), x - F::of_f64(x_low as f64));
    let (hy, hx) = (F::ONE - ly, F::ONE - lx);
    Sample {
        at: [y_low * width + x_low, y_low * width + x_high, y_high * width + x_low, y_high * width + x_high],
        w: [hy * hx, hy * lx, ly * hx, ly * lx],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(mode: PoolKind, sampling_ratio: i64, half_pixel: bool) -> RoiAlign {
        RoiAlign { mode, output_height: 2, output_width: 2, sampling_ratio, spatial_scale: 1.0, half_pixel }
    }

    #[test]
    fn pools_constant_and_ramp_images_and_zeros_outside() {
        // One 4×4 image: x[y][x] = x (a ramp along the width).
        let x: Vec<f32> = (0..16).map(|i| (i % 4) as f32).collect();
        let mut out = vec![f32::NAN; 8];
        // A box over the whole image (output_half_pixel: coordinates as given), then one far outside.
        let rois = [0.0, 0.0, 4.0, 4.0, 50.0, 50.0, 60.0, 60.0];
        roi_align_f32(&attrs(PoolKind::Avg, 2, false), &x, &[1, 1, 4, 4], &rois, &[0, 0], &mut out).unwrap();
        // Bin columns cover x in [0, 2) and [2, 4): samples at 0.5, 1.5 and 2.5, 3.5 (3.5 clamps to 3).
        assert_eq!(&out[..4], &[1.0, 2.75, 1.0, 2.75]);
        assert_eq!(&out[4..], &[0.0; 4]);
        let mut peak = vec![f32::NAN; 4];
        roi_align_f32(&attrs(PoolKind::Max, 2, false), &x, &[1, 1, 4, 4], &rois[..4], &[0], &mut peak).unwrap();
        // The largest weighted corner (reference semantics: weights and all): in the top bins every sample
        // weighs its corners by 1/2 along y, so 1/4 · 2 = 0.5 and, clamped at x = 3, 1/2 · 3 = 1.5; the bottom
        // bins' samples at y = 3.5 clamp to row 3 (weight 1): 1/2 · 2 = 1 and 3.
        assert_eq!(peak, vec![0.5, 1.5, 1.0, 3.0]);
    }

    #[test]
    fn bad_batch_indices_and_huge_boxes_are_errors() {
        let x = vec![1.0f32; 16];
        let mut out = vec![0.0f32; 4];
        let a = attrs(PoolKind::Avg, 0, true);
        let err = roi_align_f32(&a, &x, &[1, 1, 4, 4], &[0.0, 0.0, 2.0, 2.0], &[1], &mut out).unwrap_err();
        assert!(err.contains("batch index 1 names no image of 1"), "{err}");
        let err = roi_align_f32(&a, &x, &[1, 1, 4, 4], &[0.0, 0.0, 1e12, 1e12], &[0], &mut out).unwrap_err();
        assert!(err.contains("too many"), "{err}");
        // NaN boxes sample nothing (0), without panicking.
        roi_align_f32(&a, &x, &[1, 1, 4, 4], &[f32::NAN; 4], &[0], &mut out).unwrap();
        assert!(roi_align_f32(&a, &x, &[1, 1, 4, 4], &[0.0; 3], &[0], &mut out).is_err());
    }
}
