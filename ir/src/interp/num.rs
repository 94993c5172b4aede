//! Scalar arithmetic for the interpreter: the numeric traits its kernels are generic over, and typed dispatch.
//!
//! Floats compute in a [`Real`] type: f32 and f64 in themselves, f16 and bf16 in f32 (widened exactly, rounded
//! once back when the op is done), as [`FloatElem`] states. Integers use [`IntElem`], whose arithmetic wraps
//! (two's complement) and whose division reports zero divisors and overflow instead of trapping. Kernels choose
//! an implementation per dtype family with [`by_family!`]. These items are shared by every interpreter file,
//! including the neural-net ops, and are kept stable.

use std::ops::{Add, Div, Mul, Neg, Rem, Sub};

use half::{bf16, f16};

use crate::tensor::Element;
use crate::types::DType;

/// A float type the interpreter computes in (f32 or f64), with the math it needs.
pub(super) trait Real:
    Copy
    + PartialOrd
    + std::fmt::Debug
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Rem<Output = Self>
    + Neg<Output = Self>
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// A quiet NaN.
    const NAN: Self;
    /// Rounds an f64 to this type (to nearest, ties to even).
    fn of_f64(v: f64) -> Self;
    /// `e^x`.
    fn exp(self) -> Self;
    /// Natural log.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// The error function.
    fn erf(self) -> Self;
    /// Sine.
    fn sin(self) -> Self;
    /// Cosine.
    fn cos(self) -> Self;
    /// Tangent.
    fn tan(self) -> Self;
    /// Arc sine.
    fn asin(self) -> Self;
    /// Arc cosine.
    fn acos(self) -> Self;
    /// Arc tangent.
    fn atan(self) -> Self;
    /// Hyperbolic sine.
    fn sinh(self) -> Self;
    /// Hyperbolic cosine.
    fn cosh(self) -> Self;
    /// Inverse hyperbolic sine.
    fn asinh(self) -> Self;
    /// Inverse hyperbolic cosine.
    fn acosh(self) -> Self;
    /// Inverse hyperbolic tangent.
    fn atanh(self) -> Self;
    /// Round toward -inf.
    fn floor(self) -> Self;
    /// Round toward +inf.
    fn ceil(self) -> Self;
    /// Round half to even.
    fn round_even(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// `self ^ e`.
    fn powf(self, e: Self) -> Self;
    /// True for NaN.
    fn is_nan(self) -> bool;
    /// True for ±inf.
    fn is_infinite(self) -> bool;
    /// True when the sign bit is set (also for -0 and negative NaNs).
    fn is_sign_negative(self) -> bool;
    /// `|self|` with the sign of `sign`.
    fn copysign(self, sign: Self) -> Self;
}

macro_rules! real {
    ($t:ty, $erf:path) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NAN: Self = <$t>::NAN;
            fn of_f64(v: f64) -> Self {
                v as $t
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            fn erf(self) -> Self {
                // std's erf is unstable (`float_erf`); libm is the same musl implementation.
                $erf(self)
            }
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            fn tan(self) -> Self {
                <$t>::tan(self)
            }
            fn asin(self) -> Self {
                <$t>::asin(self)
            }
            fn acos(self) -> Self {
                <$t>::acos(self)
            }
            fn atan(self) -> Self {
                <$t>::atan(self)
            }
            fn sinh(self) -> Self {
                <$t>::sinh(self)
            }
            fn cosh(self) -> Self {
                <$t>::cosh(self)
            }
            fn asinh(self) -> Self {
                <$t>::asinh(self)
            }
            fn acosh(self) -> Self {
                <$t>::acosh(self)
            }
            fn atanh(self) -> Self {
                <$t>::atanh(self)
            }
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            fn ceil(self) -> Self {
                <$t>::ceil(self)
            }
            fn round_even(self) -> Self {
                <$t>::round_ties_even(self)
            }
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn is_infinite(self) -> bool {
                <$t>::is_infinite(self)
            }
            fn is_sign_negative(self) -> bool {
                <$t>::is_sign_negative(self)
            }
            fn copysign(self, sign: Self) -> Self {
                <$t>::copysign(self, sign)
            }
        }
    };
}

real!(f32, libm::erff);
real!(f64, libm::erf);

/// A float element type and the [`Real`] type it computes in.
pub(super) trait FloatElem: Element {
    /// The compute type: the element type itself for f32 and f64, f32 for f16 and bf16.
    type C: Real;
    /// Widens exactly to the compute type.
    fn up(self) -> Self::C;
    /// Rounds a computed value back (to nearest, ties to even).
    fn down(c: Self::C) -> Self;
}

impl FloatElem for f32 {
    type C = f32;
    fn up(self) -> f32 {
        self
    }
    fn down(c: f32) -> f32 {
        c
    }
}

impl FloatElem for f64 {
    type C = f64;
    fn up(self) -> f64 {
        self
    }
    fn down(c: f64) -> f64 {
        c
    }
}

impl FloatElem for f16 {
    type C = f32;
    fn up(self) -> f32 {
        self.to_f32()
    }
    fn down(c: f32) -> f16 {
        f16::from_f32(c)
    }
}

impl FloatElem for bf16 {
    type C = f32;
    fn up(self) -> f32 {
        self.to_f32()
    }
    fn down(c: f32) -> bf16 {
        bf16::from_f32(c)
    }
}

/// An integer element type with two's-complement wrapping arithmetic.
pub(super) trait IntElem:
    Element
    + Ord
    + std::ops::BitAnd<Output = Self>
    + std::ops::BitOr<Output = Self>
    + std::ops::BitXor<Output = Self>
    + std::ops::Not<Output = Self>
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// `a + b`, wrapping.
    fn wadd(self, b: Self) -> Self;
    /// `a - b`, wrapping.
    fn wsub(self, b: Self) -> Self;
    /// `a * b`, wrapping.
    fn wmul(self, b: Self) -> Self;
    /// `-a`, wrapping (`-MIN == MIN`; for u8, `256 - a`).
    fn wneg(self) -> Self;
    /// `|a|`, wrapping (`|MIN| == MIN`).
    fn wabs(self) -> Self;
    /// `a / b` truncated toward zero; `None` for a zero divisor or `MIN / -1`.
    fn checked_div(self, b: Self) -> Option<Self>;
    /// `a % b` with the dividend's sign (`MIN % -1 == 0`); `None` for a zero divisor.
    fn checked_rem(self, b: Self) -> Option<Self>;
    /// -1, 0 or 1.
    fn sign(self) -> Self;
    /// True when below zero.
    fn is_negative(self) -> bool;
    /// `a << b`, dropping the bits shifted out; 0 when `b` is negative or at least the bit width.
    fn shl(self, b: Self) -> Self;
    /// `a >> b`, sign-filling for signed types; all sign bits when `b` is negative or at least the bit width.
    fn shr(self, b: Self) -> Self;
}

macro_rules! int_elem {
    ($t:ty, $abs:expr, $sign:expr, $neg:expr) => {
        impl IntElem for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            fn wadd(self, b: Self) -> Self {
                self.wrapping_add(b)
            }
            fn wsub(self, b: Self) -> Self {
                self.wrapping_sub(b)
            }
            fn wmul(self, b: Self) -> Self {
                self.wrapping_mul(b)
            }
            fn wneg(self) -> Self {
                self.wrapping_neg()
            }
            fn wabs(self) -> Self {
                let f: fn($t) -> $t = $abs;
                f(self)
            }
            fn checked_div(self, b: Self) -> Option<Self> {
                <$t>::checked_div(self, b)
            }
            fn checked_rem(self, b: Self) -> Option<Self> {
                if b == 0 { None } else { Some(self.wrapping_rem(b)) }
            }
            fn sign(self) -> Self {
                let f: fn($t) -> $t = $sign;
                f(self)
            }
            fn is_negative(self) -> bool {
                let f: fn($t) -> bool = $neg;
                f(self)
            }
            fn shl(self, b: Self) -> Self {
                match u32::try_from(b.to_i64()) {
                    Ok(n) if n < <$t>::BITS => self << n,
                    _ => 0,
                }
            }
            fn shr(self, b: Self) -> Self {
                match u32::try_from(b.to_i64()) {
                    Ok(n) if n < <$t>::BITS => self >> n,
                    _ if self.is_negative() => !0,
                    _ => 0,
                }
            }
        }
    };
}

int_elem!(i8, i8::wrapping_abs, i8::signum, i8::is_negative);
int_elem!(i32, i32::wrapping_abs, i32::signum, i32::is_negative);
int_elem!(i64, i64::wrapping_abs, i64::signum, i64::is_negative);
int_elem!(u8, |x| x, |x| x.min(1), |_| false);
int_elem!(i16, i16::wrapping_abs, i16::signum, i16::is_negative);
int_elem!(u16, |x| x, |x| x.min(1), |_| false);
int_elem!(u32, |x| x, |x| x.min(1), |_| false);
int_elem!(u64, |x| x, |x| x.min(1), |_| false);

/// True when `x` is unordered with itself (a NaN); false for every non-float type.
pub(super) fn is_nan<T: PartialOrd>(x: T) -> bool {
    x.partial_cmp(&x).is_none()
}

/// `i64` → f64 rounded to odd: exact when representable, otherwise the odd-mantissa neighbour of `v`. Rounding
/// that result again to a narrower float gives the correctly rounded conversion of `v`, which rounding
/// `v as f64` again would not always do (double rounding).
pub(super) fn i64_to_f64_round_odd(v: i64) -> f64 {
    let f = v as f64;
    // |f| <= 2^63, so the i128 holds it exactly.
    let back = f as i128;
    if back == v as i128 || f.to_bits() & 1 == 1 {
        return f;
    }
    // Inexact and even: the other neighbour of `v`, one ulp toward it in magnitude, is odd.
    f64::from_bits(if (v as i128).abs() > back.abs() { f.to_bits() + 1 } else { f.to_bits() - 1 })
}

pub(super) use crate::narrow::f64_to_f32_round_odd;

/// `v` converted to any element type as `cast` converts: correctly rounded (to nearest, ties to even) for
/// floats, truncated and saturated for integers (NaN → 0), `!= 0` for bool.
///
/// `half`'s own `f64` conversions drop the low mantissa bits before rounding, which can round a value that lies
/// just above a tie the wrong way; going through f32 rounded to odd gives the correct result.
pub(super) fn from_f64_rounded<T: Element>(v: f64) -> T {
    match T::DTYPE {
        DType::F16 => T::read_le(&f16::from_f32(f64_to_f32_round_odd(v)).to_le_bytes()),
        DType::BF16 => T::read_le(&bf16::from_f32(f64_to_f32_round_odd(v)).to_le_bytes()),
        _ => T::from_f64(v),
    }
}

/// `s` converted to `T` exactly as the `cast` op converts one element: floats → ints truncate toward zero and
/// saturate (NaN → 0); ints → ints wrap; anything → bool is `!= 0` (NaN → true); bool → number is 0 or 1;
/// float → float and int → float round to nearest, ties to even, once. The one conversion the tensor and the
/// scalar forms of `cast` share.
pub(super) fn cast_element<S: Element, T: Element>(s: S) -> T {
    if S::DTYPE.is_float() || S::DTYPE.is_narrow_float() {
        // f32/f16/bf16 and the narrow floats widen exactly to f64, so one rounding (or truncation) happens, here.
        return from_f64_rounded::<T>(s.to_f64());
    }
    if S::DTYPE == DType::U64 && (T::DTYPE.is_float() || T::DTYPE.is_narrow()) {
        // `to_i64` wraps a u64 above 2^63; its float value goes through the unsigned conversions.
        let u = s.to_i64() as u64;
        return match T::DTYPE {
            DType::F64 => T::from_f64(u as f64),
            DType::F32 => T::from_f64(f64::from(u as f32)),
            _ => from_f64_rounded::<T>(u64_to_f64_round_odd(u)),
        };
    }
    if matches!(T::DTYPE, DType::F16 | DType::BF16) {
        return from_f64_rounded::<T>(i64_to_f64_round_odd(s.to_i64()));
    }
    // Exact integer view; `from_i64` wraps for narrower ints, rounds once for f32/f64 (`as`).
    T::from_i64(s.to_i64())
}

/// `u64` → f64 rounded to odd (see [`i64_to_f64_round_odd`]).
fn u64_to_f64_round_odd(v: u64) -> f64 {
    let f = v as f64;
    // f <= 2^64, so the u128 holds it exactly.
    let back = f as u128;
    if back == u128::from(v) || f.to_bits() & 1 == 1 {
        return f;
    }
    f64::from_bits(if u128::from(v) > back { f.to_bits() + 1 } else { f.to_bits() - 1 })
}

/// Matches a [`Data`](crate::tensor::Data) by dtype family, binding the inner `Vec` of floats (as `$f`, whose
/// element type implements [`FloatElem`]), integers (`$i`, [`IntElem`]) or bools (`$b`) for the matching arm.
macro_rules! by_family {
    ($data:expr, float $f:ident => $fe:expr, int $i:ident => $ie:expr, bool $b:ident => $be:expr $(,)?) => {
        match $data {
            $crate::tensor::Data::F32($f) => $fe,
            $crate::tensor::Data::F16($f) => $fe,
            $crate::tensor::Data::BF16($f) => $fe,
            $crate::tensor::Data::F64($f) => $fe,
            $crate::tensor::Data::I8($i) => $ie,
            $crate::tensor::Data::U8($i) => $ie,
            $crate::tensor::Data::I32($i) => $ie,
            $crate::tensor::Data::I64($i) => $ie,
            $crate::tensor::Data::Bool($b) => $be,
            $crate::tensor::Data::I16($i) => $ie,
            $crate::tensor::Data::U16($i) => $ie,
            $crate::tensor::Data::U32($i) => $ie,
            $crate::tensor::Data::U64($i) => $ie,
            // The narrow storage types are converted and moved, never computed on.
            other => return Err(format!("{} values are only cast and moved, not computed on", other.dtype())),
        }
    };
}
pub(super) use by_family;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_odd_avoids_double_rounding() {
        // 2^60 + 2^52 + 1: bf16 keeps bits 60..53; bit 52 is the round bit and bit 0 makes it round up.
        let v: i64 = (1 << 60) + (1 << 52) + 1;
        let direct: bf16 = from_f64_rounded(i64_to_f64_round_odd(v));
        assert_eq!(direct.to_f64(), ((1u64 << 60) + (1u64 << 53)) as f64);
        // Through a plain f64 the sticky bit is lost and the tie goes to even (down).
        assert_eq!(bf16::from_f32(v as f64 as f32).to_f64(), (1u64 << 60) as f64);
        assert_eq!(i64_to_f64_round_odd(-v), -i64_to_f64_round_odd(v));
        assert_eq!(i64_to_f64_round_odd(12345), 12345.0);
        // u64 above 2^63 converts as unsigned, correctly rounded.
        let big = u64::MAX - 1024;
        assert_eq!(cast_element::<u64, f64>(big), big as f64);
        assert_eq!(cast_element::<u64, f32>(big), big as f32);
        assert_eq!(cast_element::<u64, f16>(big).to_f64(), f64::INFINITY);
        assert_eq!(cast_element::<u64, i64>(big), -1025);
        assert_eq!(cast_element::<f32, u64>(-3.5), 0);
        assert_eq!(cast_element::<f64, u16>(1e9), u16::MAX);
        assert_eq!(cast_element::<i32, u16>(-1), u16::MAX);
    }

    #[test]
    fn f64_to_half_is_correctly_rounded() {
        // 1 + 2^-11 + 2^-40 is just above the tie between f16's 1 and 1 + 2^-10: it must round up.
        let v = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(from_f64_rounded::<f16>(v).to_f64(), 1.0 + 2f64.powi(-10));
        let exact_tie = 1.0 + 2f64.powi(-11);
        assert_eq!(from_f64_rounded::<f16>(exact_tie).to_f64(), 1.0);
        // bf16: 1 + 2^-8 + 2^-40 rounds up to 1 + 2^-7.
        assert_eq!(from_f64_rounded::<bf16>(1.0 + 2f64.powi(-8) + 2f64.powi(-40)).to_f64(), 1.0 + 2f64.powi(-7));
        assert_eq!(from_f64_rounded::<bf16>(-1e-300).to_f64(), -0.0);
        assert!(from_f64_rounded::<f16>(f64::NAN).is_nan());
        assert_eq!(from_f64_rounded::<f16>(1e10).to_f64(), f64::INFINITY);
        assert_eq!(from_f64_rounded::<i8>(300.7), 127);
        assert_eq!(from_f64_rounded::<i32>(-2.9), -2);
    }

    #[test]
    fn integer_helpers() {
        assert_eq!(i8::MIN.wabs(), i8::MIN);
        assert_eq!(200u8.wneg(), 56);
        assert_eq!(IntElem::checked_div(i64::MIN, -1), None);
        assert_eq!(IntElem::checked_rem(i64::MIN, -1), Some(0));
        assert_eq!(IntElem::checked_rem(7i32, 0), None);
        assert_eq!(9u8.sign(), 1);
        assert!(is_nan(f32::NAN) && !is_nan(1i32));
    }
}
