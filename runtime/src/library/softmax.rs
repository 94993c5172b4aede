//! `softmax` and `log_softmax` on f32 over one axis.
//!
//! The interpreter's formula — the row's maximum `m`, `s = Σ e^(x-m)`, then `e^(x-m) / s` or `x - m - ln s` — in
//! three passes over each row, each a straight loop over 16 lanes that compiles to the widest vectors the CPU has
//! (AVX-512, AVX2 with FMA, or portable code): the max, then `e^(x-m)` written to the result while it is summed
//! (so `exp` runs once per element), then the division (or, for `log_softmax`, `x - m - ln s` after a summing
//! pass). Rows along the last axis are contiguous; over another axis the same passes run across the `inner`
//! elements that follow the axis, which are contiguous, with per-position maxima and sums.
//!
//! Special values come out as the interpreter's: a NaN, or an infinity, on a row makes `x - m` NaN somewhere and
//! so its sum and every result NaN; `-inf` entries give 0 (or `-inf`). `exp` is [`super::vmath::exp`] (relative
//! error below 2·10⁻⁷; results below 2^-126 flush to 0, where the interpreter's libm gives a subnormal).

use rayon::prelude::*;

use super::vmath::exp;
use super::{LibraryError, Par, check_len};

const OP: &str = "softmax";
/// Lanes of the row loops: one AVX-512 register, two AVX2 ones.
const L: usize = 16;
/// Elements below which a call stays on one thread.
const PARALLEL_ELEMENTS: usize = 1 << 15;

/// `softmax` (or, with `log`, `log_softmax`) of `x` (shape `shape`; a scalar is a row of one) along `axis`
/// (negative counts from the end) into `y`, rows split over `par`'s workers when there is enough work.
///
/// Errors if `axis` is out of range or the slice lengths disagree with `shape`.
pub fn softmax_f32(
    x: &[f32],
    shape: &[usize],
    axis: i64,
    log: bool,
    y: &mut [f32],
    par: Par,
) -> Result<(), LibraryError> {
    let n = check_len(OP, "x", x.len(), shape)?;
    if y.len() != n {
        return Err(LibraryError::shape(OP, format!("y has {} elements, x {n}", y.len())));
    }
    let rank = shape.len().max(1) as i64;
    let a = if axis < 0 { axis + rank } else { axis };
    if !(0..rank).contains(&a) {
        return Err(LibraryError::shape(OP, format!("axis {axis} of a rank-{} operand", shape.len())));
    }
    if n == 0 {
        return Ok(());
    }
    let a = a as usize;
    let (len, inner) = match shape.get(a) {
        Some(&len) => (len, shape[a + 1..].iter().product::<usize>()),
        None => (1, 1),
    };
    // One slab is `len × inner`: the rows a position before the axis owns.
    let slab = len * inner;
    let run = |xs: &[f32], ys: &mut [f32]| dispatch(xs, ys, len, inner, log);
    let slabs = n / slab;
    if par.parallel() && slabs > 1 && n >= PARALLEL_ELEMENTS {
        let per = slabs.div_ceil(par.threads * 4).max(1) * slab;
        x.par_chunks(per).zip(y.par_chunks_mut(per)).for_each(|(xs, ys)| run(xs, ys));
    } else {
        run(x, y);
    }
    Ok(())
}

widest_vectors! {
    /// [`slabs`] compiled for the widest vectors this CPU has.
    fn dispatch(x: &[f32], y: &mut [f32], len: usize, inner: usize, log: bool) = slabs, slabs;
}

/// Every slab of `x` (a whole number of `len × inner` slabs) into `y`.
#[inline(always)]
fn slabs(x: &[f32], y: &mut [f32], len: usize, inner: usize, log: bool) {
    let slab = len * inner;
    if inner == 1 {
        for (xs, ys) in x.chunks_exact(slab).zip(y.chunks_exact_mut(slab)) {
            if log { row::<true>(xs, ys) } else { row::<false>(xs, ys) }
        }
        return;
    }
    let mut stats = vec![0.0f32; 2 * inner];
    let (m, s) = stats.split_at_mut(inner);
    for (xs, ys) in x.chunks_exact(slab).zip(y.chunks_exact_mut(slab)) {
        if log { columns::<true>(xs, ys, inner, m, s) } else { columns::<false>(xs, ys, inner, m, s) }
    }
}

/// `a > b ? a : b` (a NaN operand gives `b`: a NaN on the row still makes it NaN through its `x - m`).
#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// One contiguous row.
#[inline(always)]
fn row<const LOG: bool>(x: &[f32], y: &mut [f32]) {
    let split = x.len() - x.len() % L;
    let (body, tail) = x.split_at(split);
    let mut lanes = [f32::NEG_INFINITY; L];
    for c in body.chunks_exact(L) {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = max(v, *m);
        }
    }
    let m = tail.iter().fold(lanes.into_iter().fold(f32::NEG_INFINITY, |a, b| max(b, a)), |a, &b| max(b, a));
    let mut sums = [0.0f32; L];
    let (ybody, ytail) = y.split_at_mut(split);
    for (c, out) in body.chunks_exact(L).zip(ybody.chunks_exact_mut(L)) {
        for ((s, o), &v) in sums.iter_mut().zip(out).zip(c) {
            let e = exp(v - m);
            if !LOG {
                *o = e;
            }
            *s += e;
        }
    }
    let mut s = sums.iter().sum::<f32>();
    for (o, &v) in ytail.iter_mut().zip(tail) {
        let e = exp(v - m);
        if !LOG {
            *o = e;
        }
        s += e;
    }
    if LOG {
        let ls = s.ln();
        for (o, &v) in y.iter_mut().zip(x) {
            *o = (v - m) - ls;
        }
    } else {
        for o in y.iter_mut() {
            *o /= s;
        }
    }
}

/// One slab whose rows run across `inner` contiguous positions: `m` and `s` (each `inner` long) hold each
/// position's maximum and sum.
#[inline(always)]
fn columns<const LOG: bool>(x: &[f32], y: &mut [f32], inner: usize, m: &mut [f32], s: &mut [f32]) {
    m.fill(f32::NEG_INFINITY);
    s.fill(0.0);
    for xr in x.chunks_exact(inner) {
        for (mv, &v) in m.iter_mut().zip(xr) {
            *mv = max(v, *mv);
        }
    }
    for (xr, yr) in x.chunks_exact(inner).zip(y.chunks_exact_mut(inner)) {
        for ((o, sv), (&v, &mv)) in yr.iter_mut().zip(s.iter_mut()).zip(xr.iter().zip(m.iter())) {
            let e = exp(v - mv);
            if !LOG {
                *o = e;
            }
            *sv += e;
        }
    }
    if LOG {
        for sv in s.iter_mut() {
            *sv = sv.ln();
        }
        for (xr, yr) in x.chunks_exact(inner).zip(y.chunks_exact_mut(inner)) {
            for (o, ((&v, &mv), &ls)) in yr.iter_mut().zip(xr.iter().zip(m.iter()).zip(s.iter())) {
                *o = (v - mv) - ls;
            }
        }
    } else {
        for yr in y.chunks_exact_mut(inner) {
            for (o, &sv) in yr.iter_mut().zip(s.iter()) {
                *o /= sv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use kiln_ir::Tensor;
    use kiln_ir::interp::eval_op;
    use kiln_ir::op::{Op, Softmax};

    use super::*;

    /// The interpreter's softmax of `x`.
    fn reference(x: &[f32], shape: &[usize], axis: i64, log: bool) -> Vec<f32> {
        let t = Tensor::from_vec(shape.to_vec(), x.to_vec()).unwrap();
        let op = if log { Op::LogSoftmax(Softmax { axis }) } else { Op::Softmax(Softmax { axis }) };
        eval_op(&op, &[&t]).unwrap().remove(0).to_f64_vec().into_iter().map(|v| v as f32).collect()
    }

    /// Within 2e-6 relative (plus `atol`: a log-softmax near 0 is a difference of nearly equal logarithms).
    fn close(got: &[f32], want: &[f32], atol: f32, what: &str) {
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 2e-6 * w.abs() + atol;
            assert!(ok, "{what}: element {i}: {g} vs the interpreter's {w}");
        }
    }

    #[test]
    fn matches_the_interpreter_on_every_axis_and_length() {
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 40.0 - 20.0
        };
        for shape in [vec![3usize, 1], vec![2, 17], vec![5, 33], vec![2, 3, 40], vec![4, 5, 6, 7], vec![1, 130]] {
            let n: usize = shape.iter().product();
            let x: Vec<f32> = (0..n).map(|_| next()).collect();
            for axis in -(shape.len() as i64)..shape.len() as i64 {
                for log in [false, true] {
                    let mut y = vec![0.0; n];
                    softmax_f32(&x, &shape, axis, log, &mut y, Par { threads: 2 }).unwrap();
                    close(
                        &y,
                        &reference(&x, &shape, axis, log),
                        if log { 1e-6 } else { 1e-37 },
                        &format!("{shape:?} axis {axis} log {log}"),
                    );
                }
            }
        }
        // A scalar is a row of one.
        let mut y = [0.0];
        softmax_f32(&[3.5], &[], 0, false, &mut y, Par::SERIAL).unwrap();
        assert_eq!(y, [1.0]);
    }

    #[test]
    fn special_values_come_out_as_the_interpreters() {
        let inf = f32::INFINITY;
        // A masked row (-10000 and -inf entries), a row with a NaN, a row with +inf, an all -inf row; 20 wide so
        // the special values sit in both the vector body and the tail.
        let mut x = vec![0.5f32; 4 * 20];
        x[3] = -10_000.0;
        x[18] = -inf;
        x[20 + 5] = f32::NAN;
        x[40 + 19] = inf;
        x[60..80].fill(-inf);
        for log in [false, true] {
            let mut y = vec![0.0; x.len()];
            softmax_f32(&x, &[4, 20], -1, log, &mut y, Par::SERIAL).unwrap();
            close(
                &y,
                &reference(&x, &[4, 20], -1, log),
                if log { 1e-6 } else { 1e-37 },
                &format!("special values, log {log}"),
            );
        }
    }

    #[test]
    fn bad_calls_are_errors() {
        let mut y = [0.0; 4];
        assert!(softmax_f32(&[0.0; 4], &[2, 2], 2, false, &mut y, Par::SERIAL).is_err());
        assert!(softmax_f32(&[0.0; 4], &[2, 2], -3, false, &mut y, Par::SERIAL).is_err());
        assert!(softmax_f32(&[0.0; 3], &[2, 2], 0, false, &mut y, Par::SERIAL).is_err());
        assert!(softmax_f32(&[0.0; 4], &[2, 2], 0, false, &mut y[..3], Par::SERIAL).is_err());
    }
}
