//! Trigonometric functions for the NVPTX emitter, computed in f64.
//!
//! `sin`, `cos` and `tan` reduce the argument exactly, for every finite value: `x · 2/π` is taken modulo 4 chunk
//! by chunk, 2/π being split into 29-bit pieces (eight, 232 bits, for an f32 argument), so each product
//! `x · piece` is exact in f64 (24 + 29 bits); each product's remainder near a multiple of 4 is exact,
//! and the remainders are summed with error-free transformations (TwoSum), which leaves the reduced argument
//! with full relative precision even next to a multiple of π/2. The quadrant selects between the Taylor
//! polynomials of `sin` and `cos` on [-π/4, π/4] (to degree 17 and 18). An f64 argument is split into three parts
//! of at most 24 bits and 2/π taken to 1160 bits (40 pieces): the same exact scheme covers every finite f64.
//!
//! `atan` (both widths) folds its argument into [-tan(π/8), tan(π/8)] (`1/x` above 1, `(t-1)/(t+1)` above
//! tan(π/8)) and sums its Taylor series to degree 49; `asin x = atan(x / sqrt((1-x)(1+x)))` and
//! `acos x = 2 atan(sqrt((1-x)/(1+x)))`.

use inkwell::values::FloatValue;
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::op::UnaryOp;

use super::emit::{KernelEmitter, R};

/// 2/π in 29-bit pieces: piece `i` is `TWO_OVER_PI_PIECES[i] · 2^(-29 (i + 1))` (1160 bits; f32 arguments use the
/// first 8, f64 ones all 40). Computed with Machin's formula in 1300-bit integer arithmetic.
const TWO_OVER_PI_PIECES: [u32; 40] = [
    341_782_637,
    423_170_132,
    352_195_499,
    488_592_205,
    461_485_765,
    90_590_992,
    478_285_810,
    291_744_734,
    393_784_374,
    479_312_105,
    19_327_344,
    6_591_214,
    336_831_268,
    121_603_962,
    417_696_077,
    121_563_266,
    113_157_591,
    219_288_486,
    238_555_994,
    100_131_859,
    321_105_011,
    13_946_493,
    82_060_028,
    196_999_464,
    123_993_874,
    536_836_118,
    201_848_727,
    286_832_032,
    349_847_258,
    228_570_057,
    509_103_546,
    256_261_990,
    332_135_749,
    366_255_851,
    66_450_168,
    397_660_275,
    334_435_493,
    79_338_238,
    452_823_292,
    224_200_790,
];

/// π/2 as a double-double.
const PIO2_HI: f64 = std::f64::consts::FRAC_PI_2;
const PIO2_LO: f64 = 6.123_233_995_736_766e-17;

impl<'ctx> KernelEmitter<'_, 'ctx> {
    /// `sin`, `cos` or `tan` of `x` (f32-held or f64), in `x`'s register type.
    pub(super) fn trig(&mut self, k: UnaryOp, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let f64t = self.ctx.f64_type();
        let c = |v: f64| f64t.const_float(v);
        let wide = x.get_type() == f64t;
        let xd = if wide { x } else { self.b.build_float_ext(x, f64t, "xd")? };
        let ax = self.fintrinsic("fabs", xd)?;
        let finite = self.b.build_float_compare(FloatPredicate::OLT, ax, c(f64::INFINITY), "finite")?;
        let xs = self.b.build_select(finite, xd, c(0.0), "xs")?.into_float_value();
        // x in parts of at most 24 significant bits, so each part times a 29-bit piece is exact in f64.
        let (parts, pieces) = if wide { (self.split_24(xs)?, 40) } else { (vec![xs], 8) };
        // Σ (part · piece mod 4, as a remainder in [-2, 2]), summed as hi + lo without rounding error.
        let (mut hi, mut lo) = (c(0.0), c(0.0));
        // The deepest pieces' values are subnormal (inexact): those multiply parts scaled down by 2^-SHIFT instead
        // (exact: a part of an argument beyond π/4 is far above 2^-400).
        const SHIFT: i32 = 600;
        let mut scaled_parts = Vec::new();
        for &part in &parts {
            scaled_parts.push(self.b.build_float_mul(part, c(libm::ldexp(1.0, -SHIFT)), "scaled")?);
        }
        for (i, &piece) in TWO_OVER_PI_PIECES[..pieces].iter().enumerate() {
            let weight = -29 * (i as i32 + 1);
            let deep = weight < -900;
            for (&part, &scaled) in parts.iter().zip(&scaled_parts) {
                // `ldexp`, not `powi`: `powi` computes 2^-n as 1/2^n, which is 0 from 2^-1024 on.
                let (part, scale) = if deep {
                    (scaled, libm::ldexp(f64::from(piece), weight + SHIFT))
                } else {
                    (part, libm::ldexp(f64::from(piece), weight))
                };
                let p = self.b.build_float_mul(part, c(scale), "p")?;
                let quarter = self.b.build_float_mul(p, c(0.25), "quarter")?;
                let n = self.fintrinsic("roundeven", quarter)?;
                let n4 = self.b.build_float_mul(n, c(4.0), "n4")?;
                let r = self.b.build_float_sub(p, n4, "r")?;
                // Beyond 2^55 a product is a multiple of 8: nothing modulo 4 (and `p/4` could lose bits there).
                let ap = self.fintrinsic("fabs", p)?;
                let huge = self.b.build_float_compare(FloatPredicate::OGE, ap, c(2f64.powi(55)), "huge")?;
                let r = self.b.build_select(huge, c(0.0), r, "r")?.into_float_value();
                let (s, e) = self.two_sum(hi, r)?;
                hi = s;
                lo = self.b.build_float_add(lo, e, "lo")?;
            }
        }
        let q = self.fintrinsic("roundeven", hi)?;
        let y_hi = self.b.build_float_sub(hi, q, "yhi")?;
        // (y_hi + lo) · π/2 in double-double: y_hi·hi + (y_hi·lo' + lo·hi).
        let t1 = self.b.build_float_mul(y_hi, c(PIO2_LO), "t1")?;
        let t2 = self.b.build_float_mul(lo, c(PIO2_HI), "t2")?;
        let tail = self.b.build_float_add(t1, t2, "tail")?;
        let f64t_ = f64t;
        let reduced =
            self.call("llvm.fma.f64", &[y_hi.into(), c(PIO2_HI).into(), tail.into()], f64t_.into())?.into_float_value();
        let qi = self.b.build_float_to_signed_int(q, self.ctx.i64_type(), "qi")?;
        let quadrant = self.b.build_and(qi, self.ctx.i64_type().const_int(3, false), "quadrant")?;
        // Below π/4 in magnitude the argument is its own reduction (and keeps the sign of a zero).
        let small = self.b.build_float_compare(FloatPredicate::OLE, ax, c(std::f64::consts::FRAC_PI_4), "small")?;
        let r = self.b.build_select(small, xs, reduced, "r")?.into_float_value();
        let i64t = self.ctx.i64_type();
        let quadrant = self.b.build_select(small, i64t.const_zero(), quadrant, "quadrant")?.into_int_value();
        let z = self.b.build_float_mul(r, r, "z")?;
        // sin r = r Σ (-1)^n z^n / (2n+1)!, cos r = Σ (-1)^n z^n / (2n)!, highest degree first.
        let (mut sin_c, mut cos_c) = (Vec::new(), Vec::new());
        let mut factorial = 1.0f64;
        for n in 0..=18u32 {
            if n > 0 {
                factorial *= f64::from(n);
            }
            let sign = if (n / 2) % 2 == 0 { 1.0 } else { -1.0 };
            if n % 2 == 0 { &mut cos_c } else { &mut sin_c }.push(sign / factorial);
        }
        sin_c.reverse();
        cos_c.reverse();
        let ps = self.horner_f64(z, &sin_c)?;
        let sin_r = self.b.build_float_mul(ps, r, "sin_r")?;
        let cos_r = self.horner_f64(z, &cos_c)?;
        let neg_sin = self.b.build_float_neg(sin_r, "nsin")?;
        let neg_cos = self.b.build_float_neg(cos_r, "ncos")?;
        let pick = |e: &mut Self, vals: [FloatValue<'ctx>; 4]| -> R<FloatValue<'ctx>> {
            let mut v = vals[0];
            for (q, cand) in vals.iter().enumerate().skip(1) {
                let is = e.b.build_int_compare(IntPredicate::EQ, quadrant, i64t.const_int(q as u64, false), "is")?;
                v = e.b.build_select(is, *cand, v, "pick")?.into_float_value();
            }
            Ok(v)
        };
        let sin = pick(self, [sin_r, cos_r, neg_sin, neg_cos])?;
        let cos = pick(self, [cos_r, neg_sin, neg_cos, sin_r])?;
        let v = match k {
            UnaryOp::Sin => sin,
            UnaryOp::Cos => cos,
            _ => self.b.build_float_div(sin, cos, "tan")?,
        };
        // NaN and infinities give NaN.
        let v = self.b.build_select(finite, v, c(f64::NAN), "v")?.into_float_value();
        let is_nan = self.b.build_float_compare(FloatPredicate::UNO, xd, xd, "nan")?;
        let v = self.b.build_select(is_nan, xd, v, "v")?.into_float_value();
        Ok(if wide { v } else { self.b.build_float_trunc(v, self.ctx.f32_type(), "trig")? })
    }

    /// The f64 `x` as three parts of at most 24 significant bits (`x = a + b + c` exactly): its top 24 bits, the
    /// next 24, the last 5.
    fn split_24(&mut self, x: FloatValue<'ctx>) -> R<Vec<FloatValue<'ctx>>> {
        let i64t = self.ctx.i64_type();
        let mask = i64t.const_int(!((1u64 << 29) - 1), false);
        let top = |e: &mut Self, v: FloatValue<'ctx>| -> R<FloatValue<'ctx>> {
            let bits = e.b.build_bit_cast(v, i64t, "bits")?.into_int_value();
            let bits = e.b.build_and(bits, mask, "top")?;
            Ok(e.b.build_bit_cast(bits, v.get_type(), "topf")?.into_float_value())
        };
        let a = top(self, x)?;
        let rest = self.b.build_float_sub(x, a, "rest")?;
        let b = top(self, rest)?;
        let c = self.b.build_float_sub(rest, b, "last")?;
        Ok(vec![a, b, c])
    }

    /// Knuth's TwoSum: `a + b = s + e` exactly, `s` the rounded sum.
    fn two_sum(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let s = self.b.build_float_add(a, b, "s")?;
        let bb = self.b.build_float_sub(s, a, "bb")?;
        let aa = self.b.build_float_sub(s, bb, "aa")?;
        let db = self.b.build_float_sub(b, bb, "db")?;
        let da = self.b.build_float_sub(a, aa, "da")?;
        let e = self.b.build_float_add(da, db, "e")?;
        Ok((s, e))
    }

    /// `asin`, `acos` or `atan` of `x` (f32-held or f64), computed in f64, returned in `x`'s register type.
    pub(super) fn inverse_trig(&mut self, k: UnaryOp, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let f64t = self.ctx.f64_type();
        let c = |v: f64| f64t.const_float(v);
        let narrow = x.get_type() != f64t;
        let xd = if narrow { self.b.build_float_ext(x, f64t, "xd")? } else { x };
        let one = c(1.0);
        let v = match k {
            UnaryOp::Atan => self.atan_f64(xd)?,
            UnaryOp::Asin => {
                let a = self.b.build_float_sub(one, xd, "a")?;
                let b = self.b.build_float_add(one, xd, "b")?;
                let p = self.b.build_float_mul(a, b, "p")?;
                let s = self.fintrinsic("sqrt", p)?;
                let t = self.b.build_float_div(xd, s, "t")?;
                // |x| = 1 gives ±inf here (atan: ±π/2); beyond, the square root is NaN.
                self.atan_f64(t)?
            }
            _ => {
                let a = self.b.build_float_sub(one, xd, "a")?;
                let b = self.b.build_float_add(one, xd, "b")?;
                let q = self.b.build_float_div(a, b, "q")?;
                let s = self.fintrinsic("sqrt", q)?;
                let t = self.atan_f64(s)?;
                self.b.build_float_add(t, t, "acos")?
            }
        };
        Ok(if narrow { self.b.build_float_trunc(v, self.ctx.f32_type(), "narrow")? } else { v })
    }

    /// `atan x` on f64.
    fn atan_f64(&mut self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let f64t = self.ctx.f64_type();
        let c = |v: f64| f64t.const_float(v);
        let one = c(1.0);
        let ax = self.fintrinsic("fabs", x)?;
        let inv = self.b.build_float_compare(FloatPredicate::OGT, ax, one, "inv")?;
        let recip = self.b.build_float_div(one, ax, "recip")?;
        let t = self.b.build_select(inv, recip, ax, "t")?.into_float_value();
        let mid = self.b.build_float_compare(FloatPredicate::OGT, t, c(std::f64::consts::SQRT_2 - 1.0), "mid")?;
        let tm1 = self.b.build_float_sub(t, one, "tm1")?;
        let tp1 = self.b.build_float_add(t, one, "tp1")?;
        let folded = self.b.build_float_div(tm1, tp1, "folded")?;
        let u = self.b.build_select(mid, folded, t, "u")?.into_float_value();
        let z = self.b.build_float_mul(u, u, "z")?;
        let mut coeffs: Vec<f64> =
            (0..25).map(|n: i32| if n % 2 == 0 { 1.0 } else { -1.0 } / f64::from(2 * n + 1)).collect();
        coeffs.reverse();
        let p = self.horner_f64(z, &coeffs)?;
        let a = self.b.build_float_mul(p, u, "a")?;
        let shifted = self.b.build_float_add(a, c(std::f64::consts::FRAC_PI_4), "shifted")?;
        let a = self.b.build_select(mid, shifted, a, "a")?.into_float_value();
        let flipped = self.b.build_float_sub(c(std::f64::consts::FRAC_PI_2), a, "flipped")?;
        let a = self.b.build_select(inv, flipped, a, "a")?.into_float_value();
        // x's sign (a zero keeps its own); NaN stays NaN.
        let bits = self.b.build_bit_cast(x, self.ctx.i64_type(), "bits")?.into_int_value();
        let negative = self.b.build_int_compare(IntPredicate::SLT, bits, self.ctx.i64_type().const_zero(), "neg")?;
        let na = self.b.build_float_neg(a, "na")?;
        Ok(self.b.build_select(negative, na, a, "atan")?.into_float_value())
    }
}
