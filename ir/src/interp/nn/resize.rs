//! `resize`: nearest, (multi-)linear and (multi-)cubic resizing, with ONNX's antialiasing for the latter two.
//!
//! Each output coordinate `o` of a dim maps to a fractional input coordinate `x` by the coordinate mode; then
//! - nearest rounds `x` by the nearest mode and clamps the index into `[0, in)`: a gather, exact for every dtype;
//! - linear clamps `x` into `[0, in - 1]` (ONNX's edge handling) and blends the two neighbours
//!   `floor(x)` and `floor(x) + 1` (the latter clamped) with weights `1 - frac` and `frac`. Dims are interpolated
//!   one at a time, which is the same multilinear blend. A tap of weight exactly 0 is skipped, so sampling exactly
//!   on an input element returns it even beside an infinity.

use super::{load, store, with_real};
use crate::interp::index::for_each_index;
use crate::interp::num::Real;
use crate::op::{CoordMode, NearestMode, Resize, ResizeMode};
use crate::tensor::{Tensor, strides_of};
use crate::types::DType;

pub(super) fn resize(r: &Resize, x: &Tensor, out_shape: &[usize]) -> Result<Tensor, String> {
    let in_shape = x.shape();
    if r.coord != CoordMode::AlignCorners
        && let Some(s) = r.scales.iter().find(|s| !(s.is_finite() && **s > 0.0))
    {
        return Err(format!("scale {s} must be positive and finite"));
    }
    if out_shape.iter().product::<usize>() == 0 {
        return Ok(Tensor::zeros(x.dtype(), out_shape.to_vec()));
    }
    if let Some(d) = in_shape.iter().position(|&n| n == 0) {
        return Err(format!("cannot resize the empty dim {d} to {}", out_shape[d]));
    }
    if r.coord == CoordMode::TfCropAndResize {
        if r.roi.len() != 2 * in_shape.len() {
            return Err(format!(
                "tf_crop_and_resize needs a roi of {} values, got {}",
                2 * in_shape.len(),
                r.roi.len()
            ));
        }
        // The extrapolated elements are written through f64, exact for every dtype but the 64-bit integers.
        if matches!(x.dtype(), DType::I64 | DType::U64) {
            return Err(format!("tf_crop_and_resize of {} is not supported", x.dtype()));
        }
    }
    let resized = resize_inside(r, x, out_shape)?;
    if r.coord != CoordMode::TfCropAndResize {
        return Ok(resized);
    }
    // Elements sampled outside the crop's input along any dim take the extrapolation value.
    let outside: Vec<Vec<bool>> = (0..in_shape.len()).map(|d| outside_taps(r, d, in_shape[d], out_shape[d])).collect();
    let mut values = resized.to_f64_vec();
    let mut k = 0;
    for_each_index(out_shape, |o| {
        if o.iter().enumerate().any(|(d, &i)| outside[d][i]) {
            values[k] = r.extrapolation;
        }
        k += 1;
    });
    Tensor::new(out_shape.to_vec(), crate::tensor::Data::from_f64_iter(x.dtype(), values.into_iter()))
        .map_err(|e| e.to_string())
}

/// For each output index along dim `d` of a `tf_crop_and_resize`, whether its coordinate falls outside
/// `[0, in_len - 1]` (the element then takes the extrapolation value). The interpreter and the compiled kernels
/// both use it.
pub fn outside_taps(r: &Resize, d: usize, in_len: usize, out_len: usize) -> Vec<bool> {
    (0..out_len)
        .map(|o| {
            let x = source_coord(r, d, o, in_len, out_len);
            r.coord == CoordMode::TfCropAndResize && (x < 0.0 || x > (in_len - 1) as f64)
        })
        .collect()
}

/// The resize of `x`, without the extrapolation of `tf_crop_and_resize`.
fn resize_inside(r: &Resize, x: &Tensor, out_shape: &[usize]) -> Result<Tensor, String> {
    let in_shape = x.shape();
    let coords = |d: usize| -> Vec<f64> {
        (0..out_shape[d]).map(|o| source_coord(r, d, o, in_shape[d], out_shape[d])).collect()
    };
    if r.antialias && r.mode == ResizeMode::Linear {
        return filtered(r, x, out_shape);
    }
    match r.mode {
        ResizeMode::Cubic => filtered(r, x, out_shape),
        ResizeMode::Nearest => {
            let in_strides = strides_of(in_shape);
            let maps: Vec<Vec<usize>> =
                (0..in_shape.len()).map(|d| nearest_taps(r, d, in_shape[d], out_shape[d])).collect();
            let mut idx = Vec::with_capacity(out_shape.iter().product());
            for_each_index(out_shape, |o| {
                idx.push((0..o.len()).map(|d| maps[d][o[d]] * in_strides[d]).sum::<usize>());
            });
            Tensor::new(out_shape.to_vec(), x.data().gather(idx.into_iter())).map_err(|e| e.to_string())
        }
        ResizeMode::Linear => with_real!(x.dtype(), F => {
            let mut cur = load::<F>(x);
            let mut shape = in_shape.to_vec();
            for d in 0..shape.len() {
                cur = linear_along(&cur, &shape, d, &coords(d));
                shape[d] = out_shape[d];
            }
            store(x.dtype(), out_shape, cur)
        }),
    }
}

/// Cubic resizing, and antialiased linear or cubic resizing, as ONNX's reference defines them: per dim, each
/// output index blends the input elements at the taps of [`filter_taps`] (clamped to the edge) with their
/// weights, in order and in f64, dims one after another; the result is rounded to the dtype once.
fn filtered(r: &Resize, x: &Tensor, out_shape: &[usize]) -> Result<Tensor, String> {
    if !x.dtype().is_float() {
        return Err(format!("{} resizing of {} is not defined", r.mode.name(), x.dtype()));
    }
    let mut cur = load::<f64>(x);
    let mut shape = x.shape().to_vec();
    for d in 0..shape.len() {
        let taps = filter_taps(r, d, shape[d], out_shape[d])?;
        let (outer, inner, in_len) = (shape[..d].iter().product::<usize>(), shape[d + 1..].iter().product(), shape[d]);
        let mut out = Vec::with_capacity(outer * taps.len() * inner);
        for a in 0..outer {
            for t in &taps {
                for b in 0..inner {
                    // As for linear resizing, a tap of weight 0 is skipped (never `0 · inf`).
                    let taps = t.iter().filter(|&&(_, w)| w != 0.0);
                    out.push(taps.map(|&(i, w)| w * cur[(a * in_len + i) * inner + b]).sum::<f64>());
                }
            }
        }
        cur = out;
        shape[d] = out_shape[d];
    }
    store(x.dtype(), out_shape, cur)
}

/// The taps of cubic or antialiased resizing along dim `d` from `in_len` (at least 1) to `out_len` elements: for
/// each output index, the input indices it blends (clamped into `[0, in_len)`, as ONNX pads the input with its
/// edge values) and their weights, in order. ONNX's reference: the coordinate `x` splits into a base `f` and a
/// ratio `x - f` in `(0, 1]`; the `n` taps are the `n` positions nearest `x` (`f + 1 - n/2` on, kept inside the
/// input padded by `n/2` on each side); cubic weighs them by Keys' kernel with coefficient `cubic_a`, antialiasing
/// stretches the linear or cubic kernel by `1/scale` when downsampling (more taps, weights normalized to sum 1),
/// and `exclude_outside` zeroes the taps outside the input and renormalizes.
/// `Err` when antialiasing by this dim's scale would need more than 2^20 taps per output element (a scale that
/// is not positive, or absurdly small).
pub fn filter_taps(r: &Resize, d: usize, in_len: usize, out_len: usize) -> Result<Vec<Vec<(usize, f64)>>, String> {
    let scale = r.scales[d];
    let a = r.cubic_a;
    // The first tap of a kernel of half-width `half` stretched by 1/scale, relative to the base.
    let first = |half: f64| -> Result<i64, String> {
        let s = scale.min(1.0);
        let start = (-half / s).floor();
        if !(s > 0.0 && start >= -MAX_FILTER_TAPS) {
            return Err(format!("antialiasing by scale {scale:?} along dim {d} needs more than 2^20 taps per element"));
        }
        Ok(start as i64 + 1)
    };
    let (cubic_start, linear_start) = match (r.mode, r.antialias) {
        (ResizeMode::Cubic, true) => (first(2.0)?, 0),
        (_, true) => (0, first(1.0)?),
        _ => (0, 0),
    };
    let per_element = 2 - 2 * cubic_start.min(linear_start).min(-1);
    if (per_element as u128) * (out_len as u128) > MAX_FILTER_TABLE {
        return Err(format!(
            "antialiasing by scale {scale:?} along dim {d} needs {per_element} taps for each of {out_len} elements"
        ));
    }
    Ok((0..out_len)
        .map(|o| {
            let x = source_coord(r, d, o, in_len, out_len);
            let f = if x.fract() == 0.0 { x - 1.0 } else { x.floor() };
            let ratio = x - f;
            let mut w: Vec<f64> = match (r.mode, r.antialias) {
                (ResizeMode::Cubic, false) => {
                    let (p, q) = (ratio, 1.0 - ratio);
                    vec![keys(a, p + 1.0), keys(a, p), keys(a, q), keys(a, q + 1.0)]
                }
                (ResizeMode::Cubic, true) => stretched(cubic_start, ratio, scale.min(1.0), |t| keys(a, t)),
                (_, true) => stretched(linear_start, ratio, scale.min(1.0), |t| (1.0 - t.abs()).clamp(0.0, 1.0)),
                (_, false) => vec![1.0 - ratio, ratio],
            };
            let n = w.len() as i64;
            let pad = (n + 1) / 2;
            let (len, base) = (in_len as i64, f as i64);
            let start = base.saturating_add(1).saturating_sub(n / 2).clamp(-pad, (len + pad - n).max(-pad));
            let positions: Vec<i64> = (start..start + n).collect();
            if r.exclude_outside {
                for (wk, &p) in w.iter_mut().zip(&positions) {
                    if p < 0 || p >= len {
                        *wk = 0.0;
                    }
                }
                let sum: f64 = w.iter().sum();
                if sum != 0.0 {
                    w.iter_mut().for_each(|wk| *wk /= sum);
                }
            }
            positions.iter().map(|&p| p.clamp(0, len - 1) as usize).zip(w).collect()
        })
        .collect())
}

/// The most taps (per side) an antialiasing filter may stretch to: beyond it a resize is an error, not an
/// allocation the size of the scale's inverse.
const MAX_FILTER_TAPS: f64 = (1u64 << 20) as f64;

/// The most taps a dim's filter may hold in all (2^26: 1 GiB of index and weight pairs).
const MAX_FILTER_TABLE: u128 = 1 << 26;

/// Keys' cubic convolution kernel with coefficient `a` at distance `t`.
fn keys(a: f64, t: f64) -> f64 {
    let t = t.abs();
    let (t2, t3) = (t * t, t * t * t);
    if t <= 1.0 {
        (a + 2.0) * t3 - (a + 3.0) * t2 + 1.0
    } else if t < 2.0 {
        a * t3 - 5.0 * a * t2 + 8.0 * a * t - 4.0 * a
    } else {
        0.0
    }
}

/// The weights of a kernel stretched by `1/s` at the taps `start..1 - start` (relative to the base), normalized
/// to sum 1.
fn stretched(start: i64, ratio: f64, s: f64, kernel: impl Fn(f64) -> f64) -> Vec<f64> {
    let w: Vec<f64> = (start..1 - start + 1).map(|i| kernel(s * (i as f64 - ratio))).collect();
    let sum: f64 = w.iter().sum();
    if sum == 0.0 { w } else { w.into_iter().map(|v| v / sum).collect() }
}

/// The input coordinate that output coordinate `o` along dim `d` samples (ONNX `coordinate_transformation_mode`).
fn source_coord(r: &Resize, d: usize, o: usize, in_len: usize, out_len: usize) -> f64 {
    let (o, scale) = (o as f64, r.scales[d]);
    match r.coord {
        CoordMode::HalfPixel => (o + 0.5) / scale - 0.5,
        CoordMode::PytorchHalfPixel if out_len > 1 => (o + 0.5) / scale - 0.5,
        CoordMode::PytorchHalfPixel => 0.0,
        // ONNX measures the resized length as `in * scale` (not the rounded output extent); with sizes given,
        // scale is `out / in` and the two agree.
        CoordMode::AlignCorners => {
            let resized = in_len as f64 * scale;
            if resized == 1.0 || out_len <= 1 { 0.0 } else { o * (in_len - 1) as f64 / (resized - 1.0) }
        }
        CoordMode::Asymmetric => o / scale,
        CoordMode::HalfPixelSymmetric => {
            let adjustment = out_len as f64 / (in_len as f64 * scale);
            in_len as f64 / 2.0 * (1.0 - adjustment) + (o + 0.5) / scale - 0.5
        }
        // As ONNX's reference: the resized length is `in * scale`, unrounded.
        CoordMode::TfCropAndResize => {
            let rank = r.roi.len() / 2;
            let (start, end) = (r.roi.get(d).copied().unwrap_or(0.0), r.roi.get(rank + d).copied().unwrap_or(1.0));
            let (span, resized) = ((in_len - 1) as f64, in_len as f64 * scale);
            let x =
                if resized == 1.0 { (end - start) * span / 2.0 } else { o * (end - start) * span / (resized - 1.0) };
            x + start * span
        }
    }
}

/// The input index nearest resizing along dim `d` from `in_len` (at least 1) to `out_len` elements takes for
/// each output index. The interpreter and the compiled kernels both use it.
pub fn nearest_taps(r: &Resize, d: usize, in_len: usize, out_len: usize) -> Vec<usize> {
    (0..out_len).map(|o| nearest_index(source_coord(r, d, o, in_len, out_len), r.nearest, in_len)).collect()
}

/// The input index nearest mode picks for coordinate `x`, clamped into `[0, in_len)`.
fn nearest_index(x: f64, mode: NearestMode, in_len: usize) -> usize {
    let floor = x.floor();
    let frac = x - floor;
    let i = match mode {
        NearestMode::RoundPreferFloor if frac > 0.5 => floor + 1.0,
        NearestMode::RoundPreferFloor => floor,
        NearestMode::RoundPreferCeil if frac >= 0.5 => floor + 1.0,
        NearestMode::RoundPreferCeil => floor,
        NearestMode::Floor => floor,
        NearestMode::Ceil => x.ceil(),
    };
    i.clamp(0.0, (in_len - 1) as f64) as usize
}

/// The taps of linear resizing along dim `d` from `in_len` (at least 1) to `out_len` elements: for each output
/// index, the two input indices it blends and the weight of the second, `(i0, i1, w)`, the result being
/// `(1 - w)·x[i0] + w·x[i1]` (just `x[i0]` when `w` is 0). The interpreter and the compiled kernels both use it.
pub fn linear_taps(r: &Resize, d: usize, in_len: usize, out_len: usize) -> Vec<(usize, usize, f64)> {
    (0..out_len).map(|o| tap(source_coord(r, d, o, in_len, out_len), in_len)).collect()
}

/// The tap at input coordinate `c`: clamped into `[0, in_len - 1]` (ONNX's edge handling), then split.
fn tap(c: f64, in_len: usize) -> (usize, usize, f64) {
    let x = c.clamp(0.0, (in_len - 1) as f64);
    let i0 = x.floor() as usize;
    (i0, (i0 + 1).min(in_len - 1), x - i0 as f64)
}

/// Linear interpolation of `v` (of `shape`) along dim `d` at the input coordinates `coords`.
fn linear_along<F: Real>(v: &[F], shape: &[usize], d: usize, coords: &[f64]) -> Vec<F> {
    let outer: usize = shape[..d].iter().product();
    let inner: usize = shape[d + 1..].iter().product();
    let in_len = shape[d];
    let taps: Vec<(usize, usize, F)> = coords
        .iter()
        .map(|&c| {
            let (i0, i1, w) = tap(c, in_len);
            (i0, i1, F::of_f64(w))
        })
        .collect();
    let mut out = Vec::with_capacity(outer * coords.len() * inner);
    for a in 0..outer {
        for &(i0, i1, w) in &taps {
            for b in 0..inner {
                let lo = v[(a * in_len + i0) * inner + b];
                let hi = v[(a * in_len + i1) * inner + b];
                out.push(if w == F::ZERO { lo } else { (F::ONE - w) * lo + w * hi });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use crate::op::{CoordMode, NearestMode, Op, Resize, ResizeMode};
    use crate::types::{DType, Shape};

    fn resize(mode: ResizeMode, coord: CoordMode, nearest: NearestMode, shape: &[u64], scales: &[f64]) -> Op {
        Op::Resize(Resize::new(mode, coord, nearest, Shape::of(shape), scales.to_vec()))
    }

    fn nearest(coord: CoordMode, nearest: NearestMode, shape: &[u64], scales: &[f64]) -> Op {
        resize(ResizeMode::Nearest, coord, nearest, shape, scales)
    }

    fn linear(coord: CoordMode, shape: &[u64], scales: &[f64]) -> Op {
        resize(ResizeMode::Linear, coord, NearestMode::Floor, shape, scales)
    }

    #[test]
    fn nearest_matches_hand_values() {
        use CoordMode::*;
        use NearestMode::*;
        let x4 = || f32s(&[4], &ramp(4));
        check(
            &[
                Case {
                    name: "2x upsample, asymmetric floor",
                    op: nearest(Asymmetric, Floor, &[1, 1, 4, 4], &[1.0, 1.0, 2.0, 2.0]),
                    inputs: vec![f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0])],
                    want: vec![(
                        vec![1, 1, 4, 4],
                        vec![1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0, 3.0, 4.0, 4.0],
                    )],
                },
                Case {
                    name: "2x upsample, half_pixel round_prefer_floor",
                    op: nearest(HalfPixel, RoundPreferFloor, &[6], &[2.0]),
                    inputs: vec![f32s(&[3], &[1.0, 2.0, 3.0])],
                    // Coordinates -0.25, 0.25, 0.75, 1.25, 1.75, 2.25.
                    want: vec![(vec![6], vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0])],
                },
                Case {
                    name: "downsample ties, round_prefer_floor",
                    op: nearest(HalfPixel, RoundPreferFloor, &[2], &[0.5]),
                    inputs: vec![x4()],
                    // Coordinates 0.5 and 2.5.
                    want: vec![(vec![2], vec![1.0, 3.0])],
                },
                Case {
                    name: "downsample ties, round_prefer_ceil",
                    op: nearest(HalfPixel, RoundPreferCeil, &[2], &[0.5]),
                    inputs: vec![x4()],
                    want: vec![(vec![2], vec![2.0, 4.0])],
                },
                Case {
                    name: "downsample, floor",
                    op: nearest(HalfPixel, Floor, &[2], &[0.5]),
                    inputs: vec![x4()],
                    want: vec![(vec![2], vec![1.0, 3.0])],
                },
                Case {
                    name: "downsample, ceil",
                    op: nearest(HalfPixel, Ceil, &[2], &[0.5]),
                    inputs: vec![x4()],
                    want: vec![(vec![2], vec![2.0, 4.0])],
                },
                Case {
                    name: "align_corners 4 → 3",
                    op: nearest(AlignCorners, RoundPreferFloor, &[3], &[0.75]),
                    inputs: vec![x4()],
                    // Coordinates 0, 1.5, 3.
                    want: vec![(vec![3], vec![1.0, 2.0, 4.0])],
                },
                Case {
                    name: "pytorch_half_pixel to one element",
                    op: nearest(PytorchHalfPixel, Floor, &[1], &[0.25]),
                    inputs: vec![x4()],
                    want: vec![(vec![1], vec![1.0])],
                },
                Case {
                    name: "half_pixel to one element",
                    op: nearest(HalfPixel, Floor, &[1], &[0.25]),
                    inputs: vec![x4()],
                    // Coordinate 0.5 · 4 - 0.5 = 1.5.
                    want: vec![(vec![1], vec![2.0])],
                },
                Case {
                    name: "ceil clamps past the end",
                    op: nearest(Asymmetric, Ceil, &[4], &[2.0]),
                    inputs: vec![f32s(&[2], &[1.0, 2.0])],
                    // Coordinates 0, 0.5, 1, 1.5 → 0, 1, 1, 2 (clamped to 1).
                    want: vec![(vec![4], vec![1.0, 2.0, 2.0, 2.0])],
                },
                Case {
                    name: "empty batch",
                    op: nearest(Asymmetric, Floor, &[0, 1, 4], &[1.0, 1.0, 2.0]),
                    inputs: vec![f32s(&[0, 1, 2], &[])],
                    want: vec![(vec![0, 1, 4], vec![])],
                },
            ],
            0.0,
        );
    }

    #[test]
    fn nearest_keeps_integers_exact() {
        let op = nearest(CoordMode::Asymmetric, NearestMode::Floor, &[1, 4], &[1.0, 2.0]);
        let big = (1i64 << 60) + 3;
        let x = crate::tensor::Tensor::from_vec(vec![1, 2], vec![big, -7]).unwrap();
        let y = run("i64", &op, &[x]);
        assert_eq!(y[0].as_slice::<i64>().unwrap(), &[big, big, -7, -7]);
    }

    #[test]
    fn linear_matches_hand_values() {
        use CoordMode::*;
        let x2 = || f32s(&[2], &[1.0, 2.0]);
        check(
            &[
                Case {
                    name: "half_pixel 2 → 4",
                    op: linear(HalfPixel, &[4], &[2.0]),
                    inputs: vec![x2()],
                    // Coordinates -0.25 (clamped to 0), 0.25, 0.75, 1.25 (clamped to 1).
                    want: vec![(vec![4], vec![1.0, 1.25, 1.75, 2.0])],
                },
                Case {
                    name: "align_corners 2 → 4",
                    op: linear(AlignCorners, &[4], &[2.0]),
                    inputs: vec![x2()],
                    want: vec![(vec![4], vec![1.0, 4.0 / 3.0, 5.0 / 3.0, 2.0])],
                },
                Case {
                    name: "asymmetric 2 → 4",
                    op: linear(Asymmetric, &[4], &[2.0]),
                    inputs: vec![x2()],
                    want: vec![(vec![4], vec![1.0, 1.5, 2.0, 2.0])],
                },
                Case {
                    name: "pytorch_half_pixel 2 → 4 equals half_pixel",
                    op: linear(PytorchHalfPixel, &[4], &[2.0]),
                    inputs: vec![x2()],
                    want: vec![(vec![4], vec![1.0, 1.25, 1.75, 2.0])],
                },
                Case {
                    name: "half_pixel 4 → 2 averages pairs",
                    op: linear(HalfPixel, &[2], &[0.5]),
                    inputs: vec![f32s(&[4], &ramp(4))],
                    // Coordinates 0.5 and 2.5.
                    want: vec![(vec![2], vec![1.5, 3.5])],
                },
                Case {
                    name: "bilinear align_corners 2x2 → 3x3",
                    op: linear(AlignCorners, &[1, 1, 3, 3], &[1.0, 1.0, 1.5, 1.5]),
                    inputs: vec![f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0])],
                    want: vec![(vec![1, 1, 3, 3], vec![1.0, 1.5, 2.0, 2.0, 2.5, 3.0, 3.0, 3.5, 4.0])],
                },
                Case {
                    name: "bilinear half_pixel 2x2 → 4x4",
                    op: linear(HalfPixel, &[4, 4], &[2.0, 2.0]),
                    inputs: vec![f64s(&[2, 2], &[1.0, 2.0, 3.0, 4.0])],
                    // Rows blend with [1, .75/.25, .25/.75, 1] weights: row r, column c is (1 + 2·t_r) + t_c with
                    // t = [0, 0.25, 0.75, 1].
                    want: vec![(vec![4, 4], {
                        let t = [0.0, 0.25, 0.75, 1.0];
                        let mut v = Vec::new();
                        for r in t {
                            for c in t {
                                v.push(1.0 + 2.0 * r + c);
                            }
                        }
                        v
                    })],
                },
                Case {
                    name: "sampling on an element ignores an infinite neighbour",
                    op: linear(Asymmetric, &[4], &[2.0]),
                    inputs: vec![f32s(&[2], &[1.0, f64::INFINITY])],
                    want: vec![(vec![4], vec![1.0, f64::INFINITY, f64::INFINITY, f64::INFINITY])],
                },
                Case {
                    name: "3-d trilinear corners",
                    op: linear(AlignCorners, &[3, 1, 1], &[1.5, 0.5, 0.5]),
                    inputs: vec![f32s(&[2, 1, 1], &[2.0, 4.0])],
                    want: vec![(vec![3, 1, 1], vec![2.0, 3.0, 4.0])],
                },
                Case {
                    name: "empty batch",
                    op: linear(HalfPixel, &[0, 4], &[1.0, 2.0]),
                    inputs: vec![f32s(&[0, 2], &[])],
                    want: vec![(vec![0, 4], vec![])],
                },
            ],
            1e-6,
        );
    }

    #[test]
    fn bad_resize_operands_are_errors() {
        let x = f32s(&[2], &[1.0, 2.0]);
        expect_err("zero scale", &linear(CoordMode::HalfPixel, &[4], &[0.0]), std::slice::from_ref(&x), "scale");
        expect_err("NaN scale", &linear(CoordMode::Asymmetric, &[4], &[f64::NAN]), std::slice::from_ref(&x), "scale");
        expect_err("rank mismatch", &linear(CoordMode::HalfPixel, &[4, 4], &[2.0, 2.0]), &[x], "rank");
        let op = nearest(CoordMode::Asymmetric, NearestMode::Floor, &[3], &[1.0]);
        expect_err("empty source", &op, &[f32s(&[0], &[])], "empty");
        let ints = tensor(DType::I32, &[2], &[1.0, 2.0]);
        expect_err("linear on ints", &linear(CoordMode::HalfPixel, &[4], &[2.0]), &[ints], "float");
        let op = Op::Resize(Resize::new(
            ResizeMode::Nearest,
            CoordMode::Asymmetric,
            NearestMode::Floor,
            Shape(vec!["n".into()]),
            vec![1.0],
        ));
        expect_err("symbolic target", &op, &[f32s(&[2], &[1.0, 2.0])], "static");
        // Antialiasing by an absurd scale (align-corners coordinates take the extent from `shape`, so the scale is
        // not checked otherwise) is an error, not a filter the size of the scale's inverse.
        for (scale, out) in [(1e-300, 5), (1e-5, 1000)] {
            let mut r = Resize::new(
                ResizeMode::Cubic,
                CoordMode::AlignCorners,
                NearestMode::Floor,
                Shape::of(&[out]),
                vec![scale],
            );
            r.antialias = true;
            expect_err("absurd antialias", &Op::Resize(r), &[f32s(&[5], &[1.0; 5])], "taps");
        }
    }
}
