//! `dynamic_quantize`: dynamic u8 quantization of an f32 tensor (ONNX DynamicQuantizeLinear), the step before
//! every `matmul_integer` and `conv_integer` of a dynamically quantized model.
//!
//! Two passes over `x`, each a straight loop over 16 lanes compiled for the widest vectors the CPU has (AVX-512,
//! AVX2 with FMA, or portable code): the range (lane-wise minimum and maximum, and whether any element is NaN),
//! then the quantization of each element. Large tensors split both passes over the workers (the partial ranges
//! merge exactly: a minimum of minima). The scale, zero point and per-element arithmetic are `kiln_ir::quant`'s,
//! which the interpreter uses too, so the results are the interpreter's bit for bit (tested on every special
//! value).

use kiln_ir::quant::{EMPTY_RANGE, dynamic_u8_params, merge_range};
use rayon::prelude::*;

use super::{LibraryError, Par};

const OP: &str = "dynamic_quantize";
/// Lanes of the loops: one AVX-512 register, two AVX2 ones.
const L: usize = 16;
/// Elements below which a call stays on one thread (a pass over them takes a few microseconds).
const PARALLEL_ELEMENTS: usize = 1 << 17;

/// Quantizes `x` into `y` (as long), returning the scale and zero point; both passes split over `par`'s workers
/// when there is enough work.
///
/// Errors if the lengths differ.
pub fn dynamic_quantize_u8(x: &[f32], y: &mut [u8], par: Par) -> Result<(f32, u8), LibraryError> {
    if y.len() != x.len() {
        return Err(LibraryError::shape(OP, format!("y has {} elements, x {}", y.len(), x.len())));
    }
    let parallel = par.parallel() && x.len() >= PARALLEL_ELEMENTS;
    let chunk = if parallel { x.len().div_ceil(par.threads * 4).next_multiple_of(L) } else { x.len().max(1) };
    let (lo, hi) = if parallel { x.par_chunks(chunk).map(range).reduce(|| EMPTY_RANGE, merge_range) } else { range(x) };
    let (scale, zero) = dynamic_u8_params(lo, hi);
    if parallel {
        x.par_chunks(chunk).zip(y.par_chunks_mut(chunk)).for_each(|(xs, ys)| quantize(xs, ys, scale, zero));
    } else {
        quantize(x, y, scale, zero);
    }
    Ok((scale, zero))
}

widest_vectors! {
    /// The smallest and largest element of `x` (both NaN when it holds a NaN; the identities when it is empty).
    fn range(x: &[f32]) -> (f32, f32) = range_lanes, range_lanes;
}

widest_vectors! {
    /// `quantize_u8(x[i], scale, zero)` into each `y[i]`.
    fn quantize(x: &[f32], y: &mut [u8], scale: f32, zero: u8) = quantize_lanes, quantize_lanes;
}

#[inline(always)]
fn range_lanes(x: &[f32]) -> (f32, f32) {
    // Four registers of lanes per step, so the minimum and maximum chains overlap.
    const R: usize = 4 * L;
    let (body, tail) = x.split_at(x.len() - x.len() % R);
    let (mut lo, mut hi, mut nan) = ([f32::INFINITY; R], [f32::NEG_INFINITY; R], [0u32; R]);
    for c in body.chunks_exact(R) {
        // `f32::min`/`max` skip a NaN operand; NaNs are counted instead.
        for (l, &v) in lo.iter_mut().zip(c) {
            *l = l.min(v);
        }
        for (h, &v) in hi.iter_mut().zip(c) {
            *h = h.max(v);
        }
        for (n, &v) in nan.iter_mut().zip(c) {
            *n |= u32::from(v.is_nan());
        }
    }
    let mut r = EMPTY_RANGE;
    for i in 0..R {
        r = (r.0.min(lo[i]), r.1.max(hi[i]));
    }
    for &v in tail {
        r = merge_range(r, (v, v));
    }
    if nan.iter().any(|&n| n != 0) { (f32::NAN, f32::NAN) } else { r }
}

#[inline(always)]
fn quantize_lanes(x: &[f32], y: &mut [u8], scale: f32, zero: u8) {
    let z = f32::from(zero);
    for (o, &v) in y.iter_mut().zip(x) {
        let q = (v / scale).round_ties_even() + z;
        // `kiln_ir::quant::quantize_u8`'s saturation: a NaN (the comparison fails) gives 0, as the IR's cast.
        let q = if q > 0.0 { q } else { 0.0 };
        let q = if q < 255.0 { q } else { 255.0 };
        // SAFETY: `q` is an integer in [0, 255] (clamped just above, NaN sent to 0), so it fits an i32.
        *o = unsafe { q.to_int_unchecked::<i32>() } as u8;
    }
}

#[cfg(test)]
mod tests {
    use kiln_ir::quant::quantize_u8;

    use super::*;

    /// The interpreter's arithmetic, element by element.
    fn reference(x: &[f32]) -> (Vec<u8>, f32, u8) {
        let (lo, hi) = x.iter().fold(EMPTY_RANGE, |r, &v| merge_range(r, (v, v)));
        let (s, z) = dynamic_u8_params(lo, hi);
        (x.iter().map(|&v| quantize_u8(v, s, z)).collect(), s, z)
    }

    fn check(x: &[f32], par: Par) {
        let mut y = vec![7u8; x.len()];
        let (s, z) = dynamic_quantize_u8(x, &mut y, par).unwrap();
        let (want, ws, wz) = reference(x);
        assert!(s.to_bits() == ws.to_bits() || (s.is_nan() && ws.is_nan()), "scale {s} vs {ws}");
        assert_eq!(z, wz);
        assert_eq!(y, want, "{} elements", x.len());
    }

    #[test]
    fn matches_the_interpreter_on_every_length_and_special_value() {
        let specials = [0.0, -0.0, 0.5, -0.5, 1.5, 2.5, 1e-30, -3e38, 3e38, f32::MIN_POSITIVE / 2.0];
        for n in [0, 1, 5, 15, 16, 17, 33, 100, 257] {
            let mut x: Vec<f32> = (0..n).map(|i| ((i * 7919 % 97) as f32 - 40.0) * 0.173).collect();
            check(&x, Par::SERIAL);
            for (i, &s) in specials.iter().enumerate().take(n) {
                x[i * 3 % n] = s;
            }
            check(&x, Par::SERIAL);
            if n > 0 {
                x[n / 2] = f32::INFINITY;
                check(&x, Par::SERIAL);
                x[n - 1] = f32::NAN;
                check(&x, Par::SERIAL);
            }
        }
        // All positive, all negative, all zero.
        check(&[0.25, 1.0, 3.0], Par::SERIAL);
        check(&[-0.25, -1.0, -3.0], Par::SERIAL);
        check(&[0.0; 40], Par::SERIAL);
    }

    #[test]
    fn split_passes_agree_with_one() {
        let n = PARALLEL_ELEMENTS * 2 + 5;
        let mut x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.001).sin() * 3.0).collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        pool.install(|| check(&x, Par { threads: 3 }));
        x[n - 2] = f32::NAN;
        pool.install(|| check(&x, Par { threads: 3 }));
    }

    #[test]
    fn a_length_mismatch_is_an_error() {
        let err = dynamic_quantize_u8(&[1.0, 2.0], &mut [0u8; 3], Par::SERIAL).unwrap_err();
        assert!(err.to_string().contains("y has 3 elements, x 2"), "{err}");
    }
}
