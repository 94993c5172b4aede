//! Transcendental functions and 16-bit float conversions as plain LLVM IR, for a target without libdevice.
//!
//! `exp`, `log`, `tanh` and `erf` on f32 (and `pow`, through them) evaluate the polynomials of [`crate::approx`] — the ones the CPU
//! emitter's vector loops use — on the whole f32 range: where the CPU's vector form falls back to the exact
//! scalar function (NaN, infinities, subnormal or overflowing results, subnormal `log` arguments), these
//! handle the case inline: arguments are clamped before range reduction (so no float→int conversion ever sees
//! a NaN or an out-of-range value), `2^n` is applied as two normal factors (so subnormal results are produced
//! by the last multiplication), `log` rescales subnormal arguments by 2^23, and special values are selected at
//! the end. Horner steps use `llvm.fma` (one rounding per step), as the CPU does where it has FMA.
//!
//! The f16 and bf16 conversions are the `half` crate's (the interpreter's) algorithms in integer arithmetic:
//! round to nearest even, overflow to infinity, subnormals, NaN kept NaN.

use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::op::UnaryOp;

use super::emit::{KernelEmitter, R};
use crate::approx::{
    ERF_ONE_FROM, ERF_P, ERF_Q, EXP_CLAMP, EXP_P, LN2_HI, LN2_LO, LOG_P, LOG2_E, TANH_CLAMP, TANH_P, TANH_Q,
};

/// fdlibm's split of ln 2 for f64: the high part has 32 significant bits (so `n * LN2_HI_F64` is exact for the
/// `n` of any finite result), the low part carries the rest. Written as published.
#[allow(clippy::excessive_precision)]
const LN2_HI_F64: f64 = 6.931_471_803_691_238_164_9e-1;
/// See [`LN2_HI_F64`].
#[allow(clippy::excessive_precision)]
const LN2_LO_F64: f64 = 1.908_214_929_270_587_700_02e-10;

impl<'ctx> KernelEmitter<'_, 'ctx> {
    fn f(&self, v: f32) -> FloatValue<'ctx> {
        self.ctx.f32_type().const_float(f64::from(v))
    }

    fn i32c(&self, v: u32) -> IntValue<'ctx> {
        self.ctx.i32_type().const_int(u64::from(v), false)
    }

    fn fsel(&mut self, c: IntValue<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "fsel")?.into_float_value())
    }

    fn isel(&mut self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "isel")?.into_int_value())
    }

    fn fcmp_f(&mut self, p: FloatPredicate, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(p, a, b, "fc")?)
    }

    fn icmp(&mut self, p: IntPredicate, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_compare(p, a, b, "ic")?)
    }

    fn fmul(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_mul(a, b, "m")?)
    }

    fn fadd(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_add(a, b, "a")?)
    }

    fn fsub(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_sub(a, b, "s")?)
    }

    /// `p(x)` by Horner's rule with fused steps, coefficients highest degree first.
    fn horner(&mut self, x: FloatValue<'ctx>, coeffs: &[f32]) -> R<FloatValue<'ctx>> {
        let mut acc = self.f(coeffs[0]);
        for &c in &coeffs[1..] {
            let c = self.f(c);
            acc = self
                .call("llvm.fma.f32", &[acc.into(), x.into(), c.into()], self.ctx.f32_type().into())?
                .into_float_value();
        }
        Ok(acc)
    }

    /// `x` with the sign of `sign_of` when that is negative (`-0` and NaN keep `x`).
    fn with_sign(&mut self, x: FloatValue<'ctx>, sign_of: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let zero = self.f(0.0);
        let negative = self.fcmp_f(FloatPredicate::OLT, sign_of, zero)?;
        let n = self.b.build_float_neg(x, "n")?;
        self.fsel(negative, n, x)
    }

    /// `e^x` on f32.
    pub(super) fn exp_f32(&mut self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let nan = self.fcmp_f(FloatPredicate::UNO, x, x)?;
        let (lo, hi) = (self.f(EXP_CLAMP.0), self.f(EXP_CLAMP.1));
        let below = self.fcmp_f(FloatPredicate::OLT, x, lo)?;
        let xc = self.fsel(below, lo, x)?;
        let above = self.fcmp_f(FloatPredicate::OGT, xc, hi)?;
        let xc = self.fsel(above, hi, xc)?;
        let zero = self.f(0.0);
        let xc = self.fsel(nan, zero, xc)?;
        let log2e = self.f(LOG2_E);
        let t = self.fmul(xc, log2e)?;
        let n = self.fintrinsic("roundeven", t)?;
        let hi_part = self.f(LN2_HI);
        let a = self.fmul(n, hi_part)?;
        let r = self.fsub(xc, a)?;
        let lo_part = self.f(LN2_LO);
        let a = self.fmul(n, lo_part)?;
        let r = self.fsub(r, a)?;
        let z = self.fmul(r, r)?;
        let p = self.horner(r, &EXP_P)?;
        let p = self.fmul(p, z)?;
        let p = self.fadd(p, r)?;
        let one = self.f(1.0);
        let p = self.fadd(p, one)?;
        // 2^n as two normal factors: n is in [-150, 129] after the clamp.
        let ni = self.b.build_float_to_signed_int(n, self.ctx.i32_type(), "ni")?;
        let n1 = self.b.build_right_shift(ni, self.i32c(1), true, "n1")?;
        let n2 = self.b.build_int_sub(ni, n1, "n2")?;
        let s1 = self.pow2(n1)?;
        let s2 = self.pow2(n2)?;
        let v = self.fmul(p, s1)?;
        let v = self.fmul(v, s2)?;
        self.fsel(nan, x, v)
    }

    /// `x^y` on f32 or f64 with C's `pow` special cases, as `e^(y ln|x|)` with the sign of an odd integer power of
    /// a negative base (relative error below 3e-5 on f32, about `|y ln x|` ulps on f64).
    pub(super) fn pow(&mut self, x: FloatValue<'ctx>, y: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let f64_ = x.get_type() == self.ctx.f64_type();
        let ity = if f64_ { self.ctx.i64_type() } else { self.ctx.i32_type() };
        let c = |v: f64| x.get_type().const_float(v);
        let (zero, one) = (c(0.0), c(1.0));
        let ax = self.fintrinsic("fabs", x)?;
        let l = if f64_ { self.log_f64(ax)? } else { self.log_f32(ax)? };
        let t = self.fmul(y, l)?;
        let r = if f64_ { self.exp_f64(t)? } else { self.exp_f32(t)? };
        // y an integer (infinities count as even ones), and odd: below 2^mantissa bits and its lowest bit set.
        let fy = self.fintrinsic("floor", y)?;
        let integer = self.fcmp_f(FloatPredicate::OEQ, fy, y)?;
        let ay = self.fintrinsic("fabs", y)?;
        let exact_limit = if f64_ { 9_007_199_254_740_992.0 } else { 16_777_216.0 };
        let small = self.fcmp_f(FloatPredicate::OLT, ay, c(exact_limit))?;
        let yc = self.fsel(small, y, zero)?;
        let yi = self.b.build_float_to_signed_int(yc, ity, "yi")?;
        let low = self.b.build_and(yi, ity.const_int(1, false), "low")?;
        let low = self.icmp(IntPredicate::NE, low, ity.const_zero())?;
        let odd = self.b.build_and(integer, low, "odd")?;
        let odd = self.b.build_and(odd, small, "odd")?;
        // A negative base (or -0): an odd power keeps its sign, a non-integer one is NaN.
        let xbits = self.b.build_bit_cast(x, ity, "xbits")?.into_int_value();
        let negative = self.icmp(IntPredicate::SLT, xbits, ity.const_zero())?;
        let nr = self.b.build_float_neg(r, "nr")?;
        let flip = self.b.build_and(negative, odd, "flip")?;
        let r = self.fsel(flip, nr, r)?;
        let x_finite_neg = self.fcmp_f(FloatPredicate::OLT, x, zero)?;
        let inf = c(f64::INFINITY);
        let x_inf = self.fcmp_f(FloatPredicate::OEQ, ax, inf)?;
        let x_not_inf = self.b.build_not(x_inf, "x_not_inf")?;
        let x_finite_neg = self.b.build_and(x_finite_neg, x_not_inf, "x_finite_neg")?;
        let not_integer = self.b.build_not(integer, "not_integer")?;
        let y_finite = self.fcmp_f(FloatPredicate::OLT, ay, inf)?;
        let bad = self.b.build_and(x_finite_neg, not_integer, "bad")?;
        let bad = self.b.build_and(bad, y_finite, "bad")?;
        let r = self.fsel(bad, c(f64::NAN), r)?;
        // |x| = 1 with y = ±inf is 1 (0 · inf would be NaN); y = ±0 and x = 1 give 1 whatever the other is.
        let unit = self.fcmp_f(FloatPredicate::OEQ, ax, one)?;
        let y_inf = self.fcmp_f(FloatPredicate::OEQ, ay, inf)?;
        let unit_inf = self.b.build_and(unit, y_inf, "unit_inf")?;
        let r = self.fsel(unit_inf, one, r)?;
        let y0 = self.fcmp_f(FloatPredicate::OEQ, y, zero)?;
        let x1 = self.fcmp_f(FloatPredicate::OEQ, x, one)?;
        let one_result = self.b.build_or(y0, x1, "one_result")?;
        self.fsel(one_result, one, r)
    }

    /// `2^n` for `n` in [-126, 127], from its exponent bits.
    fn pow2(&mut self, n: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        let e = self.b.build_int_add(n, self.i32c(127), "e")?;
        let e = self.b.build_left_shift(e, self.i32c(23), "e")?;
        Ok(self.b.build_bit_cast(e, self.ctx.f32_type(), "p2")?.into_float_value())
    }

    /// `ln x` on f32.
    pub(super) fn log_f32(&mut self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let min_normal = self.f(f32::MIN_POSITIVE);
        let sub = self.fcmp_f(FloatPredicate::OLT, x, min_normal)?;
        let scale = self.f(8_388_608.0); // 2^23
        let scaled = self.fmul(x, scale)?;
        let xs = self.fsel(sub, scaled, x)?;
        let (adj, zero) = (self.f(23.0), self.f(0.0));
        let eadj = self.fsel(sub, adj, zero)?;
        // xs = m * 2^e with m in [0.5, 1).
        let bits = self.b.build_bit_cast(xs, self.ctx.i32_type(), "bits")?.into_int_value();
        let e = self.b.build_right_shift(bits, self.i32c(23), false, "e")?;
        let e = self.b.build_int_sub(e, self.i32c(126), "e")?;
        let m = self.b.build_and(bits, self.i32c(0x807F_FFFF), "m")?;
        let m = self.b.build_or(m, self.i32c(0x3F00_0000), "m")?;
        let m = self.b.build_bit_cast(m, self.ctx.f32_type(), "m")?.into_float_value();
        let ef = self.b.build_signed_int_to_float(e, self.ctx.f32_type(), "ef")?;
        let ef = self.fsub(ef, eadj)?;
        // Below sqrt(1/2), use 2m - 1 and e - 1, so the reduced argument lies in [sqrt(1/2) - 1, sqrt(2) - 1).
        let sqrt_half = self.f(std::f32::consts::FRAC_1_SQRT_2);
        let below = self.fcmp_f(FloatPredicate::OLT, m, sqrt_half)?;
        let one = self.f(1.0);
        let m2 = self.fadd(m, m)?;
        let shifted = self.fsel(below, m2, m)?;
        let r = self.fsub(shifted, one)?;
        let dec = self.fsel(below, one, zero)?;
        let ef = self.fsub(ef, dec)?;
        let z = self.fmul(r, r)?;
        let p = self.horner(r, &LOG_P)?;
        let p = self.fmul(p, r)?;
        let y = self.fmul(p, z)?;
        let lo = self.f(LN2_LO);
        let t = self.fmul(ef, lo)?;
        let y = self.fadd(y, t)?;
        let h = self.f(0.5);
        let t = self.fmul(z, h)?;
        let y = self.fsub(y, t)?;
        let y = self.fadd(r, y)?;
        let hi = self.f(LN2_HI);
        let t = self.fmul(ef, hi)?;
        let y = self.fadd(y, t)?;
        // Special arguments: 0 → -inf, +inf → +inf, negative → NaN, NaN → itself.
        let is0 = self.fcmp_f(FloatPredicate::OEQ, x, zero)?;
        let ninf = self.f(f32::NEG_INFINITY);
        let y = self.fsel(is0, ninf, y)?;
        let inf = self.f(f32::INFINITY);
        let is_inf = self.fcmp_f(FloatPredicate::OEQ, x, inf)?;
        let y = self.fsel(is_inf, inf, y)?;
        let neg = self.fcmp_f(FloatPredicate::OLT, x, zero)?;
        let nan = self.f(f32::NAN);
        let y = self.fsel(neg, nan, y)?;
        let is_nan = self.fcmp_f(FloatPredicate::UNO, x, x)?;
        self.fsel(is_nan, x, y)
    }

    /// `tanh x` on f32: the CPU's vector approximation (`approx`): `x P(x^2) / Q(x^2)` on the argument clamped to
    /// ±`TANH_CLAMP`, the result clamped to [-1, 1]; a NaN stays NaN (every comparison with it is false).
    pub(super) fn tanh_f32(&mut self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let (hi, lo) = (self.f(TANH_CLAMP), self.f(-TANH_CLAMP));
        let x = self.clamp_f(x, lo, hi)?;
        let z = self.fmul(x, x)?;
        let p = self.horner(z, &TANH_P)?;
        let q = self.horner(z, &TANH_Q)?;
        let num = self.fmul(x, p)?;
        let y = self.b.build_float_div(num, q, "tanh")?;
        let (one, minus_one) = (self.f(1.0), self.f(-1.0));
        self.clamp_f(y, minus_one, one)
    }

    /// `x` clamped to `[lo, hi]`, a NaN passing through.
    fn clamp_f(&mut self, x: FloatValue<'ctx>, lo: FloatValue<'ctx>, hi: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let above = self.fcmp_f(FloatPredicate::OGT, x, hi)?;
        let x = self.fsel(above, hi, x)?;
        let below = self.fcmp_f(FloatPredicate::OLT, x, lo)?;
        self.fsel(below, lo, x)
    }

    /// `erf x` on f32: the CPU's vector approximation (`approx`): `x P(x^2) / Q(x^2)` below `ERF_ONE_FROM` in
    /// magnitude, exactly ±1 from there; a NaN stays NaN.
    pub(super) fn erf_f32(&mut self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let z = self.fmul(x, x)?;
        let p = self.horner(z, &ERF_P)?;
        let q = self.horner(z, &ERF_Q)?;
        let num = self.fmul(x, p)?;
        // Large arguments may overflow to inf / inf here; they are replaced below.
        let y = self.b.build_float_div(num, q, "erf")?;
        let ax = self.fintrinsic("fabs", x)?;
        let limit = self.f(ERF_ONE_FROM);
        let saturated = self.fcmp_f(FloatPredicate::OGE, ax, limit)?;
        let one = self.f(1.0);
        let unit = self.with_sign(one, x)?;
        self.fsel(saturated, unit, y)
    }

    /// The f16 bits (i16) of f32 `x`, rounded to nearest even.
    pub(super) fn f32_to_f16_bits(&mut self, x: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        let bits = self.b.build_bit_cast(x, self.ctx.i32_type(), "bits")?.into_int_value();
        let sign = self.b.build_and(bits, self.i32c(0x8000_0000), "sign")?;
        let hsign = self.b.build_right_shift(sign, self.i32c(16), false, "hsign")?;
        let exp = self.b.build_and(bits, self.i32c(0x7F80_0000), "exp")?;
        let man = self.b.build_and(bits, self.i32c(0x007F_FFFF), "man")?;
        let zero = self.i32c(0);
        // Infinity or NaN (a NaN keeps a mantissa bit).
        let is_special = self.icmp(IntPredicate::EQ, exp, self.i32c(0x7F80_0000))?;
        let man_nz = self.icmp(IntPredicate::NE, man, zero)?;
        let nan_bit = self.isel(man_nz, self.i32c(0x0200), zero)?;
        let man_hi = self.b.build_right_shift(man, self.i32c(13), false, "man_hi")?;
        let special = self.b.build_or(hsign, self.i32c(0x7C00), "sp")?;
        let special = self.b.build_or(special, nan_bit, "sp")?;
        let special = self.b.build_or(special, man_hi, "sp")?;
        // The f16 exponent (signed).
        let e = self.b.build_right_shift(exp, self.i32c(23), false, "e")?;
        let half_exp = self.b.build_int_sub(e, self.i32c(127 - 15), "hexp")?;
        let overflow = self.icmp(IntPredicate::SGE, half_exp, self.i32c(0x1F))?;
        let inf = self.b.build_or(hsign, self.i32c(0x7C00), "inf")?;
        // Normal: round the mantissa at bit 13 (a carry may reach the exponent, up to infinity).
        let he = self.b.build_left_shift(half_exp, self.i32c(10), "he")?;
        let normal = self.b.build_or(hsign, he, "nrm")?;
        let normal = self.b.build_or(normal, man_hi, "nrm")?;
        let round = self.round_up(man, self.i32c(0x1000))?;
        let normal = self.b.build_int_add(normal, round, "nrm")?;
        // Subnormal: shift the mantissa with its hidden bit by 14 - half_exp (>= 14), zero beyond 24.
        let shift = self.b.build_int_sub(self.i32c(14), half_exp, "shift")?;
        let underflow = self.icmp(IntPredicate::SGT, shift, self.i32c(24))?;
        let in_range = self.icmp(IntPredicate::ULT, shift, self.i32c(25))?;
        let shift = self.isel(in_range, shift, self.i32c(24))?;
        let m = self.b.build_or(man, self.i32c(0x0080_0000), "m")?;
        let hm = self.b.build_right_shift(m, shift, false, "hm")?;
        let rshift = self.b.build_int_sub(shift, self.i32c(1), "rshift")?;
        let round_bit = self.b.build_left_shift(self.i32c(1), rshift, "rbit")?;
        let round = self.round_up(m, round_bit)?;
        let hm = self.b.build_int_add(hm, round, "hm")?;
        let subnormal = self.b.build_or(hsign, hm, "sub")?;
        let subnormal = self.isel(underflow, hsign, subnormal)?;
        let is_sub = self.icmp(IntPredicate::SLE, half_exp, zero)?;
        let v = self.isel(is_sub, subnormal, normal)?;
        let v = self.isel(overflow, inf, v)?;
        let v = self.isel(is_special, special, v)?;
        Ok(self.b.build_int_truncate(v, self.ctx.i16_type(), "f16")?)
    }

    /// 1 when the bits of `man` below and at `round_bit` round the kept part up (nearest, ties to even), else 0.
    fn round_up(&mut self, man: IntValue<'ctx>, round_bit: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let zero = self.i32c(0);
        let rb = self.b.build_and(man, round_bit, "rb")?;
        let has_rb = self.icmp(IntPredicate::NE, rb, zero)?;
        // 3 * round_bit - 1: the bits below the round bit and the lowest kept bit.
        let three = self.b.build_int_mul(round_bit, self.i32c(3), "three")?;
        let mask = self.b.build_int_sub(three, self.i32c(1), "mask")?;
        let rest = self.b.build_and(man, mask, "rest")?;
        let has_rest = self.icmp(IntPredicate::NE, rest, zero)?;
        let up = self.b.build_and(has_rb, has_rest, "up")?;
        Ok(self.b.build_int_z_extend(up, self.ctx.i32_type(), "up")?)
    }

    /// The f32 value of f16 bits (i16).
    pub(super) fn f16_bits_to_f32(&mut self, h: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        let h = self.b.build_int_z_extend(h, self.ctx.i32_type(), "h")?;
        let sign = self.b.build_and(h, self.i32c(0x8000), "sign")?;
        let sign = self.b.build_left_shift(sign, self.i32c(16), "sign")?;
        let exp = self.b.build_right_shift(h, self.i32c(10), false, "exp")?;
        let exp = self.b.build_and(exp, self.i32c(0x1F), "exp")?;
        let man = self.b.build_and(h, self.i32c(0x3FF), "man")?;
        let man13 = self.b.build_left_shift(man, self.i32c(13), "man13")?;
        // Normal.
        let e = self.b.build_int_add(exp, self.i32c(127 - 15), "e")?;
        let e = self.b.build_left_shift(e, self.i32c(23), "e")?;
        let normal = self.b.build_or(sign, e, "n")?;
        let normal = self.b.build_or(normal, man13, "n")?;
        // Infinity or NaN.
        let special = self.b.build_or(sign, self.i32c(0x7F80_0000), "sp")?;
        let special = self.b.build_or(special, man13, "sp")?;
        // Zero or subnormal: man * 2^-24, exactly.
        let mf = self.b.build_unsigned_int_to_float(man, self.ctx.f32_type(), "mf")?;
        let scale = self.f(1.0 / 16_777_216.0);
        let sub = self.fmul(mf, scale)?;
        let sub = self.b.build_bit_cast(sub, self.ctx.i32_type(), "sub")?.into_int_value();
        let sub = self.b.build_or(sub, sign, "sub")?;
        let is_sub = self.icmp(IntPredicate::EQ, exp, self.i32c(0))?;
        let is_special = self.icmp(IntPredicate::EQ, exp, self.i32c(0x1F))?;
        let v = self.isel(is_sub, sub, normal)?;
        let v = self.isel(is_special, special, v)?;
        Ok(self.b.build_bit_cast(v, self.ctx.f32_type(), "f")?.into_float_value())
    }

    /// The bf16 bits (i16) of f32 `x`, rounded to nearest even (NaN stays NaN).
    pub(super) fn f32_to_bf16_bits(&mut self, x: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        let bits = self.b.build_bit_cast(x, self.ctx.i32_type(), "bits")?.into_int_value();
        let abs = self.b.build_and(bits, self.i32c(0x7FFF_FFFF), "abs")?;
        let is_nan = self.icmp(IntPredicate::UGT, abs, self.i32c(0x7F80_0000))?;
        let hi = self.b.build_right_shift(bits, self.i32c(16), false, "hi")?;
        let nan = self.b.build_or(hi, self.i32c(0x40), "nan")?;
        let round = self.round_up(bits, self.i32c(0x8000))?;
        let v = self.b.build_int_add(hi, round, "r")?;
        let v = self.isel(is_nan, nan, v)?;
        Ok(self.b.build_int_truncate(v, self.ctx.i16_type(), "bf16")?)
    }

    /// The f32 value of bf16 bits (i16).
    pub(super) fn bf16_bits_to_f32(&mut self, h: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        let h = self.b.build_int_z_extend(h, self.ctx.i32_type(), "h")?;
        let v = self.b.build_left_shift(h, self.i32c(16), "v")?;
        Ok(self.b.build_bit_cast(v, self.ctx.f32_type(), "f")?.into_float_value())
    }

    /// `d` rounded to f32 with round-to-odd (truncate, then set the last bit when inexact): rounding that again
    /// to f16 or bf16 gives the single correctly rounded result, as the CPU runtime's `f64_to_f32_round_odd`.
    pub(super) fn f64_to_f32_odd(&mut self, d: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let t = self.b.build_float_trunc(d, self.ctx.f32_type(), "t")?;
        let back = self.b.build_float_ext(t, self.ctx.f64_type(), "back")?;
        // Ordered: a NaN is "exact" and stays itself.
        let inexact = self.fcmp_f(FloatPredicate::ONE, back, d)?;
        let ab = self.fintrinsic("fabs", back)?;
        let ad = self.fintrinsic("fabs", d)?;
        let too_big = self.fcmp_f(FloatPredicate::OGT, ab, ad)?;
        self.odd(t, inexact, too_big)
    }

    /// The i64 `v` rounded to f32 with round-to-odd (see [`Self::f64_to_f32_odd`]).
    pub(super) fn i64_to_f32_odd(&mut self, v: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        let i64t = self.ctx.i64_type();
        let t = self.b.build_signed_int_to_float(v, self.ctx.f32_type(), "t")?;
        let back = self.call("llvm.fptosi.sat.i64.f32", &[t.into()], i64t.into())?.into_int_value();
        let inexact = self.icmp(IntPredicate::NE, back, v)?;
        // (Saturation only hides 2^63 rounded from i64::MAX, which then is exact enough: it is the answer.)
        let nonneg = self.icmp(IntPredicate::SGE, v, i64t.const_zero())?;
        let above = self.icmp(IntPredicate::SGT, back, v)?;
        let below = self.icmp(IntPredicate::SLT, back, v)?;
        let too_big = self.isel(nonneg, above, below)?;
        self.odd(t, inexact, too_big)
    }

    /// Round-to-odd from a round-to-nearest `t`: step its magnitude down one ulp when it rounded away from zero,
    /// then set the last mantissa bit when inexact.
    fn odd(&mut self, t: FloatValue<'ctx>, inexact: IntValue<'ctx>, too_big: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        let bits = self.b.build_bit_cast(t, self.ctx.i32_type(), "bits")?.into_int_value();
        let down = self.b.build_int_sub(bits, self.i32c(1), "down")?;
        let bits = self.isel(too_big, down, bits)?;
        let odd = self.b.build_or(bits, self.i32c(1), "odd")?;
        let bits = self.isel(inexact, odd, bits)?;
        Ok(self.b.build_bit_cast(bits, self.ctx.f32_type(), "f")?.into_float_value())
    }

    /// `p(x)` by Horner's rule with fused steps on f64, coefficients highest degree first.
    pub(super) fn horner_f64(&mut self, x: FloatValue<'ctx>, coeffs: &[f64]) -> R<FloatValue<'ctx>> {
        let f64t = self.ctx.f64_type();
        let mut acc = f64t.const_float(coeffs[0]);
        for &c in &coeffs[1..] {
            let c = f64t.const_float(c);
            acc = self.call("llvm.fma.f64", &[acc.into(), x.into(), c.into()], f64t.into())?.into_float_value();
        }
        Ok(acc)
    }

    /// `2^n` on f64 for `n` (i64) in [-1022, 1023], from its exponent bits.
    fn pow2_f64(&mut self, n: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        let i64t = self.ctx.i64_type();
        let e = self.b.build_int_add(n, i64t.const_int(1023, false), "e")?;
        let e = self.b.build_left_shift(e, i64t.const_int(52, false), "e")?;
        Ok(self.b.build_bit_cast(e, self.ctx.f64_type(), "p2")?.into_float_value())
    }

    /// `e^x` on f64: Cody–Waite reduction by ln 2 (fdlibm's split), then the Taylor polynomial of degree 13 on
    /// `|r| <= ln2/2` (truncation below 1e-17 relative), scaled by `2^n` in two normal factors.
    pub(super) fn exp_f64(&mut self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let c = |e: &Self, v: f64| e.ctx.f64_type().const_float(v);
        let nan = self.fcmp_f(FloatPredicate::UNO, x, x)?;
        let (lo, hi) = (c(self, -746.0), c(self, 710.0));
        let below = self.fcmp_f(FloatPredicate::OLT, x, lo)?;
        let xc = self.fsel(below, lo, x)?;
        let above = self.fcmp_f(FloatPredicate::OGT, xc, hi)?;
        let xc = self.fsel(above, hi, xc)?;
        let xc = self.fsel(nan, c(self, 0.0), xc)?;
        let t = self.fmul(xc, c(self, std::f64::consts::LOG2_E))?;
        let n = self.fintrinsic("roundeven", t)?;
        let a = self.fmul(n, c(self, LN2_HI_F64))?;
        let r = self.fsub(xc, a)?;
        let a = self.fmul(n, c(self, LN2_LO_F64))?;
        let r = self.fsub(r, a)?;
        let mut coeffs = [0.0f64; 14];
        let mut factorial = 1.0f64;
        for k in 0..14 {
            if k > 0 {
                factorial *= k as f64;
            }
            coeffs[13 - k] = 1.0 / factorial;
        }
        let p = self.horner_f64(r, &coeffs)?;
        // n is in [-1077, 1025] after the clamp: two factors of at most 2^±539.
        let i64t = self.ctx.i64_type();
        let ni = self.b.build_float_to_signed_int(n, i64t, "ni")?;
        let n1 = self.b.build_right_shift(ni, i64t.const_int(1, false), true, "n1")?;
        let n2 = self.b.build_int_sub(ni, n1, "n2")?;
        let s1 = self.pow2_f64(n1)?;
        let s2 = self.pow2_f64(n2)?;
        let v = self.fmul(p, s1)?;
        let v = self.fmul(v, s2)?;
        self.fsel(nan, x, v)
    }

    /// `ln x` on f64: `x = m 2^e` with `m` in [sqrt(1/2), sqrt(2)), `ln m = 2 atanh(s)`, `s = (m-1)/(m+1)`, by
    /// its series to `s^23` (`|s| < 0.172`: truncation below 1e-17 relative).
    pub(super) fn log_f64(&mut self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let c = |e: &Self, v: f64| e.ctx.f64_type().const_float(v);
        let i64t = self.ctx.i64_type();
        let ic = |v: u64| i64t.const_int(v, false);
        let zero = c(self, 0.0);
        let sub = self.fcmp_f(FloatPredicate::OLT, x, c(self, f64::MIN_POSITIVE))?;
        let scaled = self.fmul(x, c(self, 18_014_398_509_481_984.0))?; // 2^54
        let xs = self.fsel(sub, scaled, x)?;
        let eadj = self.fsel(sub, c(self, 54.0), zero)?;
        let bits = self.b.build_bit_cast(xs, i64t, "bits")?.into_int_value();
        let e = self.b.build_right_shift(bits, ic(52), false, "e")?;
        let e = self.b.build_int_sub(e, ic(1022), "e")?;
        let m = self.b.build_and(bits, ic(0x800F_FFFF_FFFF_FFFF), "m")?;
        let m = self.b.build_or(m, ic(0x3FE0_0000_0000_0000), "m")?;
        let m = self.b.build_bit_cast(m, self.ctx.f64_type(), "m")?.into_float_value();
        let ef = self.b.build_signed_int_to_float(e, self.ctx.f64_type(), "ef")?;
        let ef = self.fsub(ef, eadj)?;
        let below = self.fcmp_f(FloatPredicate::OLT, m, c(self, std::f64::consts::FRAC_1_SQRT_2))?;
        let m2 = self.fadd(m, m)?;
        let m = self.fsel(below, m2, m)?;
        let one = c(self, 1.0);
        let dec = self.fsel(below, one, zero)?;
        let ef = self.fsub(ef, dec)?;
        let num = self.fsub(m, one)?;
        let den = self.fadd(m, one)?;
        let s_ = self.b.build_float_div(num, den, "s")?;
        let z = self.fmul(s_, s_)?;
        let coeffs: Vec<f64> = (0..12).rev().map(|k| 2.0 / (2 * k + 1) as f64).collect();
        let p = self.horner_f64(z, &coeffs)?;
        let lm = self.fmul(p, s_)?;
        let t = self.fmul(ef, c(self, LN2_LO_F64))?;
        let y = self.fadd(lm, t)?;
        let t = self.fmul(ef, c(self, LN2_HI_F64))?;
        let y = self.fadd(y, t)?;
        let is0 = self.fcmp_f(FloatPredicate::OEQ, x, zero)?;
        let y = self.fsel(is0, c(self, f64::NEG_INFINITY), y)?;
        let inf = c(self, f64::INFINITY);
        let is_inf = self.fcmp_f(FloatPredicate::OEQ, x, inf)?;
        let y = self.fsel(is_inf, inf, y)?;
        let neg = self.fcmp_f(FloatPredicate::OLT, x, zero)?;
        let y = self.fsel(neg, c(self, f64::NAN), y)?;
        let is_nan = self.fcmp_f(FloatPredicate::UNO, x, x)?;
        self.fsel(is_nan, x, y)
    }

    /// `tanh x` on f64: its odd series to `x^15` below 0.1 in magnitude, `1 - 2/(e^2|x| + 1)` above, ±1 beyond
    /// 20.
    pub(super) fn tanh_f64(&mut self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let c = |e: &Self, v: f64| e.ctx.f64_type().const_float(v);
        let ax = self.fintrinsic("fabs", x)?;
        let z = self.fmul(x, x)?;
        // Coefficients 2^2n (2^2n - 1) B_2n / (2n)!, highest degree first.
        let series = [
            -929_569.0 / 638_512_875.0,
            21_844.0 / 6_081_075.0,
            -1_382.0 / 155_925.0,
            62.0 / 2_835.0,
            -17.0 / 315.0,
            2.0 / 15.0,
            -1.0 / 3.0,
            0.0,
        ];
        let p = self.horner_f64(z, &series)?;
        let p = self.fmul(p, x)?;
        let small = self.fadd(p, x)?;
        let sat = c(self, 20.0);
        let saturated = self.fcmp_f(FloatPredicate::OGT, ax, sat)?;
        let xc = self.fsel(saturated, sat, ax)?;
        let two_x = self.fadd(xc, xc)?;
        let e = self.exp_f64(two_x)?;
        let (one, two) = (c(self, 1.0), c(self, 2.0));
        let d = self.fadd(e, one)?;
        let q = self.b.build_float_div(two, d, "q")?;
        let big = self.fsub(one, q)?;
        let big = self.fsel(saturated, one, big)?;
        let zero = c(self, 0.0);
        let negative = self.fcmp_f(FloatPredicate::OLT, x, zero)?;
        let nbig = self.b.build_float_neg(big, "nbig")?;
        let big = self.fsel(negative, nbig, big)?;
        let is_small = self.fcmp_f(FloatPredicate::OLT, ax, c(self, 0.1))?;
        self.fsel(is_small, small, big)
    }

    /// `erf x` on f64: its Taylor series to `x^61` below 2 in magnitude (relative error below 1e-15), above
    /// `1 - erfc(x)` with `erfc` from its continued fraction `e^-x² / √π / (x + (1/2)/(x + 1/(x + (3/2)/…)))` to
    /// depth 60 (relative error of `erfc` below 4e-15), ±1 beyond 6.
    pub(super) fn erf_f64(&mut self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let c = |e: &Self, v: f64| e.ctx.f64_type().const_float(v);
        let two_over_sqrt_pi = std::f64::consts::FRAC_2_SQRT_PI;
        // Coefficients 2/√π (-1)^n / (n! (2n+1)), highest degree first.
        let mut factorial = 1.0f64;
        let mut coeffs: Vec<f64> = (0..=30)
            .map(|n: i32| {
                if n > 0 {
                    factorial *= f64::from(n);
                }
                let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
                two_over_sqrt_pi * sign / (factorial * f64::from(2 * n + 1))
            })
            .collect();
        coeffs.reverse();
        let z = self.fmul(x, x)?;
        let p = self.horner_f64(z, &coeffs)?;
        let small = self.fmul(p, x)?;
        let ax = self.fintrinsic("fabs", x)?;
        let (lo, hi) = (c(self, 2.0), c(self, 6.0));
        let below = self.fcmp_f(FloatPredicate::OLT, ax, lo)?;
        let xc = self.fsel(below, lo, ax)?;
        let saturated = self.fcmp_f(FloatPredicate::OGT, xc, hi)?;
        let xc = self.fsel(saturated, hi, xc)?;
        let mut t = xc;
        for k in (1..=60).rev() {
            let q = self.b.build_float_div(c(self, f64::from(k) / 2.0), t, "q")?;
            t = self.fadd(xc, q)?;
        }
        let x2 = self.fmul(xc, xc)?;
        let nx2 = self.b.build_float_neg(x2, "nx2")?;
        let e = self.exp_f64(nx2)?;
        let e = self.fmul(e, c(self, 1.0 / std::f64::consts::PI.sqrt()))?;
        let erfc = self.b.build_float_div(e, t, "erfc")?;
        let one = c(self, 1.0);
        let big = self.fsub(one, erfc)?;
        let big = self.fsel(saturated, one, big)?;
        let zero = c(self, 0.0);
        let negative = self.fcmp_f(FloatPredicate::OLT, x, zero)?;
        let nbig = self.b.build_float_neg(big, "nbig")?;
        let big = self.fsel(negative, nbig, big)?;
        self.fsel(below, small, big)
    }

    /// `e^x` of either float width.
    fn exp_any(&mut self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        if x.get_type() == self.ctx.f64_type() { self.exp_f64(x) } else { self.exp_f32(x) }
    }

    /// `ln x` of either float width.
    fn log_any(&mut self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        if x.get_type() == self.ctx.f64_type() { self.log_f64(x) } else { self.log_f32(x) }
    }

    /// `ln(1 + d)` without losing the low bits of a small `d`: `ln(u) · d / (u - 1)` with `u = 1 + d` (the
    /// rounding of `u` cancels out; Goldberg's method), `d` itself when `u` rounds to 1, `d` when `u` is infinite.
    fn log1p(&mut self, d: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let c = |v: f64| d.get_type().const_float(v);
        let one = c(1.0);
        let u = self.fadd(one, d)?;
        let l = self.log_any(u)?;
        let um1 = self.fsub(u, one)?;
        let q = self.b.build_float_div(d, um1, "q")?;
        let v = self.fmul(l, q)?;
        let exact = self.fcmp_f(FloatPredicate::OEQ, u, one)?;
        let v = self.fsel(exact, d, v)?;
        let inf = self.fcmp_f(FloatPredicate::OEQ, u, c(f64::INFINITY))?;
        self.fsel(inf, u, v)
    }

    /// The hyperbolic functions but `tanh` (which has its own), on either float width: `sinh` (its series below
    /// 0.5 in magnitude, `(e^|x| - e^-|x|)/2` above), `cosh`, `asinh` and `acosh` (through `log1p` in fdlibm's
    /// forms), `atanh` (`log1p(2x/(1-x))/2`); `e^|x|/2` as `(e^(|x|/2)/2) e^(|x|/2)` near overflow.
    pub(super) fn hyperbolic(&mut self, k: UnaryOp, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let f64_ = x.get_type() == self.ctx.f64_type();
        let c = |v: f64| x.get_type().const_float(v);
        let (zero, half, one) = (c(0.0), c(0.5), c(1.0));
        let ax = self.fintrinsic("fabs", x)?;
        // Where e^|x| overflows but e^|x| / 2 may not.
        let big_limit = c(if f64_ { 709.0 } else { 88.0 });
        let huge = self.fcmp_f(FloatPredicate::OGT, ax, big_limit)?;
        let half_exp = |e: &mut Self| -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
            let ex = e.exp_any(ax)?;
            let h = e.fmul(ex, half)?;
            let inv = e.b.build_float_div(half, ex, "inv")?;
            // e^|x| / 2 as (e^(|x|/2) / 2) e^(|x|/2): |x|/2 is exact, so no rounding of the argument is magnified.
            let halfx = e.fmul(ax, half)?;
            let eh = e.exp_any(halfx)?;
            let far = e.fmul(eh, half)?;
            let far = e.fmul(far, eh)?;
            let h = e.fsel(huge, far, h)?;
            let inv = e.fsel(huge, zero, inv)?;
            Ok((h, inv))
        };
        let v = match k {
            UnaryOp::Sinh => {
                let (h, inv) = half_exp(self)?;
                let big = self.fsub(h, inv)?;
                // Below 0.5: x + x^3/3! + … + x^17/17!.
                let mut coeffs = Vec::new();
                let mut factorial = 1.0f64;
                for n in 1..=17u32 {
                    factorial *= f64::from(n);
                    if n % 2 == 1 && n > 1 {
                        coeffs.push(1.0 / factorial);
                    }
                }
                coeffs.reverse();
                coeffs.push(0.0);
                let z = self.fmul(ax, ax)?;
                let p = if f64_ { self.horner_f64(z, &coeffs)? } else { self.horner_any_f32(z, &coeffs)? };
                let p = self.fmul(p, ax)?;
                let small = self.fadd(p, ax)?;
                let is_small = self.fcmp_f(FloatPredicate::OLT, ax, half)?;
                let v = self.fsel(is_small, small, big)?;
                return self.with_sign_any(v, x);
            }
            UnaryOp::Cosh => {
                let (h, inv) = half_exp(self)?;
                self.fadd(h, inv)?
            }
            UnaryOp::Asinh => {
                // log1p(|x| + x^2 / (1 + sqrt(1 + x^2))), or ln|x| + ln 2 where x^2 would overflow.
                let z = self.fmul(ax, ax)?;
                let zp1 = self.fadd(one, z)?;
                let sq = self.fintrinsic("sqrt", zp1)?;
                let den = self.fadd(one, sq)?;
                let q = self.b.build_float_div(z, den, "q")?;
                let d = self.fadd(ax, q)?;
                let near = self.log1p(d)?;
                let l = self.log_any(ax)?;
                let far = self.fadd(l, c(std::f64::consts::LN_2))?;
                let far_limit = c(if f64_ { 2f64.powi(28) } else { 2f64.powi(12) });
                let is_far = self.fcmp_f(FloatPredicate::OGT, ax, far_limit)?;
                let v = self.fsel(is_far, far, near)?;
                return self.with_sign_any(v, x);
            }
            UnaryOp::Acosh => {
                // log1p((x - 1) + sqrt((x - 1)(x + 1))), ln x + ln 2 for large x, NaN below 1.
                let xm1 = self.fsub(x, one)?;
                let xp1 = self.fadd(x, one)?;
                let prod = self.fmul(xm1, xp1)?;
                let sq = self.fintrinsic("sqrt", prod)?;
                let d = self.fadd(xm1, sq)?;
                let near = self.log1p(d)?;
                let l = self.log_any(x)?;
                let far = self.fadd(l, c(std::f64::consts::LN_2))?;
                let far_limit = c(if f64_ { 2f64.powi(28) } else { 2f64.powi(12) });
                let is_far = self.fcmp_f(FloatPredicate::OGT, x, far_limit)?;
                let v = self.fsel(is_far, far, near)?;
                let below = self.fcmp_f(FloatPredicate::OLT, x, one)?;
                self.fsel(below, c(f64::NAN), v)?
            }
            UnaryOp::Atanh => {
                // log1p(2|x| / (1 - |x|)) / 2, with x's sign; ±1 → ±inf, beyond → NaN.
                let den = self.fsub(one, ax)?;
                let two_x = self.fadd(ax, ax)?;
                let d = self.b.build_float_div(two_x, den, "d")?;
                let l = self.log1p(d)?;
                let v = self.fmul(l, half)?;
                let beyond = self.fcmp_f(FloatPredicate::OGT, ax, one)?;
                let v = self.fsel(beyond, c(f64::NAN), v)?;
                return self.with_sign_any(v, x);
            }
            _ => unreachable!("hyperbolic is called with sinh, cosh, asinh, acosh or atanh"),
        };
        Ok(v)
    }

    /// `p(x)` by Horner's rule with fused steps on f32, from f64 coefficients.
    fn horner_any_f32(&mut self, x: FloatValue<'ctx>, coeffs: &[f64]) -> R<FloatValue<'ctx>> {
        let narrowed: Vec<f32> = coeffs.iter().map(|&c| c as f32).collect();
        self.horner(x, &narrowed)
    }

    /// `v` with `sign_of`'s sign when that is negative or -0 (NaN `v` stays NaN).
    fn with_sign_any(&mut self, v: FloatValue<'ctx>, sign_of: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let ity = if v.get_type() == self.ctx.f64_type() { self.ctx.i64_type() } else { self.ctx.i32_type() };
        let bits = self.b.build_bit_cast(sign_of, ity, "bits")?.into_int_value();
        let negative = self.icmp(IntPredicate::SLT, bits, ity.const_zero())?;
        let n = self.b.build_float_neg(v, "n")?;
        self.fsel(negative, n, v)
    }
}
