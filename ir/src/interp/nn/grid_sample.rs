//! `grid_sample`: ONNX GridSample after its reference (`onnx/reference/ops/op_grid_sample.py`), any number of
//! spatial dims.
//!
//! Per grid point the taps of every spatial dim — input index (or none: a zero) and weight — are worked out once
//! and serve every channel. Coordinates are f32, as the reference computes them; weights and sums are in the
//! compute type ([`Real`]). A NaN or infinite coordinate gives a NaN result (the reference fails on one).

use super::super::num::Real;
use super::{load, store, with_real};
use crate::op::{GridPadding, GridSample, ResizeMode};
use crate::tensor::Tensor;

/// `grid_sample(x, grid)` on tensors (any float dtypes; the type rule checked the shapes).
pub(super) fn grid_sample(g: &GridSample, x: &Tensor, grid: &Tensor, out_shape: &[usize]) -> Result<Tensor, String> {
    let points: Vec<f32> = grid.to_f64_vec().into_iter().map(|v| v as f32).collect();
    with_real!(x.dtype(), F => {
        let xv = load::<F>(x);
        let mut out = vec![F::ZERO; out_shape.iter().product()];
        sample(g, &xv, x.shape(), &points, grid.shape(), &mut out)?;
        store(x.dtype(), out_shape, out)
    })
}

/// `grid_sample` on f32 data and an f32 grid, into `out` (`[N, C, O…]`): the CPU runtime's routine.
///
/// Errors if the shapes or slice lengths disagree.
pub fn grid_sample_f32(
    g: &GridSample,
    x: &[f32],
    x_shape: &[usize],
    grid: &[f32],
    grid_shape: &[usize],
    out: &mut [f32],
) -> Result<(), String> {
    sample(g, x, x_shape, grid, grid_shape, out)
}

/// One spatial dim's taps for a grid point: (input index, or `None` for a zero; weight) — at most four (cubic),
/// held inline so that working them out per point touches no heap.
#[derive(Clone, Copy)]
struct Taps<F> {
    len: usize,
    taps: [(Option<usize>, F); 4],
}

impl<F: Real> Taps<F> {
    fn new() -> Taps<F> {
        Taps { len: 0, taps: [(None, F::ZERO); 4] }
    }

    fn clear(&mut self) {
        self.len = 0;
    }

    fn push(&mut self, tap: (Option<usize>, F)) {
        self.taps[self.len] = tap;
        self.len += 1;
    }

    fn first(&self) -> Option<&(Option<usize>, F)> {
        self.as_slice().first()
    }

    fn as_slice(&self) -> &[(Option<usize>, F)] {
        &self.taps[..self.len]
    }
}

fn sample<F: Real>(
    g: &GridSample,
    x: &[F],
    xs: &[usize],
    grid: &[f32],
    gs: &[usize],
    out: &mut [F],
) -> Result<(), String> {
    let rank = xs.len();
    if rank < 3 || gs.len() != rank || gs[rank - 1] != rank - 2 || gs[0] != xs[0] {
        return Err(format!("data {xs:?} and grid {gs:?} do not match"));
    }
    let (batch, channels, dims) = (xs[0], xs[1], &xs[2..]);
    let r = dims.len();
    let in_size: usize = dims.iter().product();
    let points: usize = gs[1..rank - 1].iter().product();
    if x.len() != batch * channels * in_size
        || grid.len() != batch * points * r
        || out.len() != batch * channels * points
    {
        return Err(format!(
            "{} data, {} grid and {} result elements for data {xs:?} and grid {gs:?}",
            x.len(),
            grid.len(),
            out.len()
        ));
    }
    let mut strides = vec![1usize; r];
    for d in (0..r.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let mut taps: Vec<Taps<F>> = vec![Taps::new(); r];
    for b in 0..batch {
        for p in 0..points {
            let point = &grid[(b * points + p) * r..][..r];
            // The grid lists the coordinates innermost dim first.
            let finite = (0..r).all(|d| dim_taps(g, point[r - 1 - d], dims[d], &mut taps[d]));
            for c in 0..channels {
                let plane = &x[(b * channels + c) * in_size..][..in_size];
                out[(b * channels + c) * points + p] = if !finite {
                    F::NAN
                } else if g.mode == ResizeMode::Nearest {
                    nearest(plane, &taps, &strides)
                } else if r == 2 {
                    combine2(plane, &taps, strides[0])
                } else {
                    combine(plane, &taps, &strides, 0, 0)
                };
            }
        }
    }
    Ok(())
}

/// Fills `taps` for normalized coordinate `v` over an extent `len`; false when the coordinate is NaN or infinite.
#[inline]
fn dim_taps<F: Real>(g: &GridSample, v: f32, len: usize, taps: &mut Taps<F>) -> bool {
    taps.clear();
    let l = len as f32;
    let mut x = if g.align_corners { (v + 1.0) / 2.0 * (l - 1.0) } else { ((v + 1.0) * l - 1.0) / 2.0 };
    if !x.is_finite() {
        return false;
    }
    if g.mode == ResizeMode::Nearest {
        x = x.round_ties_even();
    }
    let (lo, hi) = if g.align_corners { (0.0, l - 1.0) } else { (-0.5, l - 0.5) };
    if x < lo || x > hi {
        match g.padding {
            GridPadding::Border => x = x.clamp(0.0, l - 1.0),
            GridPadding::Reflection => x = reflect(x, lo, hi),
            GridPadding::Zeros => {}
        }
    }
    // An index as the reference's integer conversions make it (saturating here), then resolved by the padding.
    let at = |i: i64| -> Option<usize> {
        let last = len as i64 - 1;
        match g.padding {
            GridPadding::Zeros => (0..len as i64).contains(&i).then_some(i as usize),
            GridPadding::Border => Some(i.clamp(0, last.max(0)) as usize),
            GridPadding::Reflection => Some((reflect(i as f32, lo, hi) as i64).clamp(0, last.max(0)) as usize),
        }
    };
    let floor = floor_f32(x);
    let t = F::of_f64(f64::from(x - floor));
    let x0 = floor as i64;
    match g.mode {
        ResizeMode::Nearest => taps.push((at(x as i64), F::ONE)),
        ResizeMode::Linear => {
            taps.push((at(x0), F::ONE - t));
            taps.push((at(x0.saturating_add(1)), t));
        }
        ResizeMode::Cubic => {
            for (k, w) in cubic_weights(t).into_iter().enumerate() {
                taps.push((at(x0.saturating_add(k as i64 - 1)), w));
            }
        }
    }
    true
}

/// `x.floor()` for a finite `x` without a libm call (the crate targets the x86-64 baseline, which has no rounding
/// instruction): from magnitude 2^23 on, every f32 is an integer.
fn floor_f32(x: f32) -> f32 {
    if x.abs() < 8_388_608.0 {
        let t = x as i32 as f32;
        // An integral `x` is its own floor (`-0.0` included).
        if t > x {
            t - 1.0
        } else if t == x {
            x
        } else {
            t
        }
    } else {
        x
    }
}

/// Reflects `x` at the borders `lo` and `hi` until it lies between them, as the reference does.
fn reflect(x: f32, lo: f32, hi: f32) -> f32 {
    let range = hi - lo;
    if range <= 0.0 {
        return lo;
    }
    let (dx, from_low) = if x < lo {
        (lo - x, true)
    } else if x > hi {
        (x - hi, false)
    } else {
        return x;
    };
    let n = (dx / range).trunc();
    let r = dx - n * range;
    if (n % 2.0 == 0.0) == from_low { lo + r } else { hi - r }
}

/// Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1 and 2 for a fraction `t` in `[0, 1)`.
fn cubic_weights<F: Real>(t: F) -> [F; 4] {
    let c = |v: f64| F::of_f64(v);
    let a = c(-0.75);
    let (one, two) = (F::ONE, c(2.0));
    let far = |x: F| ((a * x - c(5.0) * a) * x + c(8.0) * a) * x - c(4.0) * a;
    let near = |x: F| ((a + two) * x - (a + c(3.0))) * x * x + one;
    [far(t + one), near(t), near(one - t), far(two - t)]
}

/// The nearest tap's element (0 when it lies outside the input).
fn nearest<F: Real>(plane: &[F], taps: &[Taps<F>], strides: &[usize]) -> F {
    let mut at = 0;
    for (d, t) in taps.iter().enumerate() {
        match t.first() {
            Some(&(Some(i), _)) => at += i * strides[d],
            _ => return F::ZERO,
        }
    }
    plane[at]
}

/// [`combine`] over two spatial dims (rows of `stride` elements), unrolled: the same sums in the same order.
fn combine2<F: Real>(plane: &[F], taps: &[Taps<F>], stride: usize) -> F {
    let mut acc = F::ZERO;
    for &(row, wy) in taps[0].as_slice() {
        let v = match row {
            None => F::ZERO,
            Some(i) => {
                let mut inner = F::ZERO;
                for &(col, wx) in taps[1].as_slice() {
                    inner = inner + wx * col.map_or(F::ZERO, |j| plane[i * stride + j]);
                }
                inner
            }
        };
        acc = acc + wy * v;
    }
    acc
}

/// The interpolated value over dims `dim..` from offset `base`: each dim's taps weight the values of the dims
/// inside it, innermost first, as the reference's recursion sums them.
fn combine<F: Real>(plane: &[F], taps: &[Taps<F>], strides: &[usize], dim: usize, base: usize) -> F {
    let mut acc = F::ZERO;
    for &(index, w) in taps[dim].as_slice() {
        let v = match index {
            None => F::ZERO,
            Some(i) if dim + 1 == taps.len() => plane[base + i * strides[dim]],
            Some(i) => combine(plane, taps, strides, dim + 1, base + i * strides[dim]),
        };
        acc = acc + w * v;
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    fn gs(mode: ResizeMode, padding: GridPadding, align_corners: bool) -> GridSample {
        GridSample { mode, padding, align_corners }
    }

    fn run(g: &GridSample, x: &[f32], xs: &[usize], grid: &[f32], gs: &[usize]) -> Vec<f32> {
        let n: usize = [xs[0], xs[1]].iter().chain(&gs[1..gs.len() - 1]).product();
        let mut out = vec![0.0; n];
        grid_sample_f32(g, x, xs, grid, gs, &mut out).unwrap();
        out
    }

    #[test]
    fn the_inline_floor_is_libm_floor_bit_for_bit() {
        let mut xs =
            vec![0.0f32, -0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 8_388_607.5, -8_388_607.5, 8_388_608.0, -8_388_609.0];
        xs.extend([f32::MAX, f32::MIN, f32::MIN_POSITIVE, -f32::MIN_POSITIVE, 1e-45, -1e-45, 2.5e9, -2.5e9]);
        xs.extend((0..20_000).map(|i| (i as f32 - 10_000.0) * 0.0137));
        for x in xs {
            assert_eq!(floor_f32(x).to_bits(), x.floor().to_bits(), "{x}");
        }
    }

    #[test]
    fn corners_centres_and_padding() {
        // x = [[0, 1], [2, 3]]; points (x, y) at the corners with align_corners, and outside.
        let x = [0.0, 1.0, 2.0, 3.0];
        let grid = [-1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 1.0, 1.0, 3.0, 0.0];
        let shape = [1, 5, 1, 2];
        let lin = run(&gs(ResizeMode::Linear, GridPadding::Zeros, true), &x, &[1, 1, 2, 2], &grid, &shape);
        assert_eq!(lin, vec![0.0, 1.0, 1.5, 3.0, 0.0]);
        let border = run(&gs(ResizeMode::Linear, GridPadding::Border, true), &x, &[1, 1, 2, 2], &grid, &shape);
        assert_eq!(border, vec![0.0, 1.0, 1.5, 3.0, 2.0]);
        // Without align_corners the corners are the pixels' outer edges: (-1, -1) is half outside both ways.
        let edge =
            run(&gs(ResizeMode::Linear, GridPadding::Zeros, false), &x, &[1, 1, 2, 2], &grid[..2], &[1, 1, 1, 2]);
        assert_eq!(edge, vec![0.0]);
        let near = run(&gs(ResizeMode::Nearest, GridPadding::Reflection, true), &x, &[1, 1, 2, 2], &grid, &shape);
        // Column 2 on [0, 1] with align_corners reflects to 0; row 0.5 rounds (half to even) to 0.
        assert_eq!(near, vec![0.0, 1.0, 0.0, 3.0, 0.0]);
    }

    #[test]
    fn cubic_is_exact_on_a_line_and_nan_coordinates_give_nan() {
        // A linear ramp is reproduced by Keys' cubic away from the borders.
        let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let g = gs(ResizeMode::Cubic, GridPadding::Border, true);
        let v = 2.5f32 / 7.0 * 2.0 - 1.0; // coordinate 2.5
        let out = run(&g, &x, &[1, 1, 8], &[v], &[1, 1, 1]);
        assert!((out[0] - 2.5).abs() < 1e-5, "{out:?}");
        let out = run(&g, &x, &[1, 1, 8], &[f32::NAN], &[1, 1, 1]);
        assert!(out[0].is_nan());
        let half = Tensor::from_vec(vec![1, 1, 8], x.iter().map(|&v| half::f16::from_f32(v)).collect()).unwrap();
        let grid = Tensor::from_vec(vec![1, 1, 1], vec![f64::from(v)]).unwrap();
        let got = grid_sample(&g, &half, &grid, &[1, 1, 1]).unwrap();
        assert_eq!(got.dtype(), DType::F16);
        assert!((got.to_f64_vec()[0] - 2.5).abs() < 1e-2);
    }

    #[test]
    fn mismatched_lengths_are_errors() {
        let g = gs(ResizeMode::Linear, GridPadding::Zeros, false);
        let mut out = vec![0.0; 2];
        assert!(grid_sample_f32(&g, &[0.0; 3], &[1, 1, 2, 2], &[0.0; 2], &[1, 1, 1, 2], &mut out).is_err());
        assert!(grid_sample_f32(&g, &[0.0; 4], &[1, 1, 2, 2], &[0.0; 2], &[1, 1, 1, 3], &mut out).is_err());
    }
}
