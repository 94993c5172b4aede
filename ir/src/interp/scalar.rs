//! One-element entry points to the interpreter's elementwise semantics, for evaluators outside this crate (the
//! kernel IR's reference evaluator in `kiln-codegen`) that must compute exactly as the interpreter does, one
//! element at a time.
//!
//! Nothing here is new math: every function forwards to the same scalar kernels the tensor-level ops use
//! (`real_unary`, `int_binary`, the `cast` conversions, `arg_reduce`'s tie rule), so a scalar result is
//! bit-identical to the corresponding element of the tensor op's result. f16 and bf16 compute in f32 and round
//! once per operation, as the tensor ops do.

use half::{bf16, f16};

use crate::op::{ArgKind, BinaryOp, UnaryOp};
use crate::tensor::{Data, Element};
use crate::types::DType;

use super::elementwise::{int_binary, int_unary, real_binary, real_unary};
use super::num::{FloatElem, IntElem, Real, cast_element, from_f64_rounded};

/// One typed element.
#[derive(Copy, Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Scalar {
    F32(f32),
    F16(f16),
    BF16(bf16),
    F64(f64),
    I8(i8),
    U8(u8),
    I32(i32),
    I64(i64),
    Bool(bool),
    I16(i16),
    U16(u16),
    U32(u32),
    U64(u64),
    F8E4M3FN(crate::narrow::F8E4M3FN),
    F8E4M3FNUZ(crate::narrow::F8E4M3FNUZ),
    F8E5M2(crate::narrow::F8E5M2),
    F8E5M2FNUZ(crate::narrow::F8E5M2FNUZ),
    F8E8M0(crate::narrow::F8E8M0),
    F4E2M1(crate::narrow::F4E2M1),
    I4(crate::narrow::I4),
    U4(crate::narrow::U4),
    I2(crate::narrow::I2),
    U2(crate::narrow::U2),
}

macro_rules! scalar_from {
    ($($t:ty => $var:ident),*) => {
        $(impl From<$t> for Scalar {
            fn from(v: $t) -> Scalar {
                Scalar::$var(v)
            }
        })*
    };
}
scalar_from!(f32 => F32, f16 => F16, bf16 => BF16, f64 => F64, i8 => I8, u8 => U8, i32 => I32, i64 => I64,
    bool => Bool, i16 => I16, u16 => U16, u32 => U32, u64 => U64, crate::narrow::F8E4M3FN => F8E4M3FN, crate::narrow::F8E4M3FNUZ => F8E4M3FNUZ, crate::narrow::F8E5M2 => F8E5M2, crate::narrow::F8E5M2FNUZ => F8E5M2FNUZ, crate::narrow::F8E8M0 => F8E8M0, crate::narrow::F4E2M1 => F4E2M1, crate::narrow::I4 => I4, crate::narrow::U4 => U4, crate::narrow::I2 => I2, crate::narrow::U2 => U2);

/// Runs `$body` with `$v` bound to the element inside a [`Scalar`], whatever its dtype.
macro_rules! dispatch_scalar {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            Scalar::F32($v) => $body,
            Scalar::F16($v) => $body,
            Scalar::BF16($v) => $body,
            Scalar::F64($v) => $body,
            Scalar::I8($v) => $body,
            Scalar::U8($v) => $body,
            Scalar::I32($v) => $body,
            Scalar::I64($v) => $body,
            Scalar::Bool($v) => $body,
            Scalar::I16($v) => $body,
            Scalar::U16($v) => $body,
            Scalar::U32($v) => $body,
            Scalar::U64($v) => $body,
            Scalar::F8E4M3FN($v) => $body,
            Scalar::F8E4M3FNUZ($v) => $body,
            Scalar::F8E5M2($v) => $body,
            Scalar::F8E5M2FNUZ($v) => $body,
            Scalar::F8E8M0($v) => $body,
            Scalar::F4E2M1($v) => $body,
            Scalar::I4($v) => $body,
            Scalar::U4($v) => $body,
            Scalar::I2($v) => $body,
            Scalar::U2($v) => $body,
        }
    };
}

impl Scalar {
    /// The element's dtype.
    pub fn dtype(self) -> DType {
        fn dt<T: Element>(_: T) -> DType {
            T::DTYPE
        }
        dispatch_scalar!(self, v => dt(v))
    }

    /// Element `i` of `data`.
    pub fn read(data: &Data, i: usize) -> Scalar {
        crate::dispatch_data!(data, v => Scalar::from(v[i]))
    }

    /// Writes this element at position `i` of `data`; an error if the dtypes differ.
    pub fn write(self, data: &mut Data, i: usize) -> Result<(), String> {
        fn put<T: Element>(data: &mut Data, i: usize, v: T) -> Result<(), String> {
            let dtype = data.dtype();
            let slot = T::unwrap_mut(data)
                .ok_or_else(|| format!("cannot store {} into {dtype} storage", T::DTYPE))?
                .get_mut(i)
                .ok_or_else(|| format!("store position {i} is out of range"))?;
            *slot = v;
            Ok(())
        }
        dispatch_scalar!(self, v => put(data, i, v))
    }

    /// `v` of `dtype`, converted as `cast` converts an f64 (correctly rounded floats, truncated and saturated
    /// integers, `!= 0` for bool).
    pub fn from_f64(dtype: DType, v: f64) -> Scalar {
        crate::with_dtype!(dtype, T => Scalar::from(from_f64_rounded::<T>(v)))
    }

    /// `v` of `dtype`, converted as `cast` converts an i64.
    pub fn from_i64(dtype: DType, v: i64) -> Scalar {
        cast(Scalar::I64(v), dtype)
    }

    /// The value as f64 (lossless except for i64 beyond 2^53).
    pub fn to_f64(self) -> f64 {
        dispatch_scalar!(self, v => v.to_f64())
    }

    /// The first byte of the element's little-endian storage (a narrow element's whole storage).
    pub fn to_le_byte(self) -> u8 {
        let mut out = Vec::new();
        dispatch_scalar!(self, v => v.write_le(&mut out));
        out[0]
    }

    /// The value as i64 (floats truncate toward zero).
    pub fn to_i64(self) -> i64 {
        dispatch_scalar!(self, v => v.to_i64())
    }
}

/// A unary kind on one element, as [`UnaryOp`]'s tensor op computes it.
pub fn unary(k: UnaryOp, x: Scalar) -> Result<Scalar, String> {
    fn float<T: FloatElem + Into<Scalar>>(k: UnaryOp, v: T) -> Result<Scalar, String> {
        match k {
            UnaryOp::IsNan => Ok(Scalar::Bool(v.up().is_nan())),
            UnaryOp::IsInf => Ok(Scalar::Bool(v.up().is_infinite())),
            _ => {
                let f = real_unary::<T::C>(k).ok_or_else(|| format!("{} is not defined on {}", k.name(), T::DTYPE))?;
                Ok(T::down(f(v.up())).into())
            }
        }
    }
    fn int<I: IntElem + Into<Scalar>>(k: UnaryOp, v: I) -> Result<Scalar, String> {
        let f = int_unary::<I>(k).ok_or_else(|| format!("{} is not defined on {}", k.name(), I::DTYPE))?;
        Ok(f(v).into())
    }
    match x {
        Scalar::F32(v) => float(k, v),
        Scalar::F16(v) => float(k, v),
        Scalar::BF16(v) => float(k, v),
        Scalar::F64(v) => float(k, v),
        Scalar::I8(v) => int(k, v),
        Scalar::U8(v) => int(k, v),
        Scalar::I32(v) => int(k, v),
        Scalar::I64(v) => int(k, v),
        Scalar::I16(v) => int(k, v),
        Scalar::U16(v) => int(k, v),
        Scalar::U32(v) => int(k, v),
        Scalar::U64(v) => int(k, v),
        Scalar::Bool(v) if k == UnaryOp::Not => Ok(Scalar::Bool(!v)),
        Scalar::Bool(_) => Err(format!("{} is not defined on bool", k.name())),
        other => {
            Err(format!("{} is not defined on {} (narrow values are only cast and moved)", k.name(), other.dtype()))
        }
    }
}

/// A binary kind on two elements of one dtype, as [`BinaryOp`]'s tensor op computes it (integer division by
/// zero and the like are errors).
pub fn binary(k: BinaryOp, a: Scalar, b: Scalar) -> Result<Scalar, String> {
    fn cmp<T: PartialOrd>(k: BinaryOp, x: T, y: T) -> bool {
        match k {
            BinaryOp::Eq => x == y,
            BinaryOp::Lt => x < y,
            BinaryOp::Le => x <= y,
            BinaryOp::Gt => x > y,
            _ => x >= y,
        }
    }
    fn float<T: FloatElem + Into<Scalar>>(k: BinaryOp, x: T, y: T) -> Result<Scalar, String> {
        if k.is_comparison() {
            return Ok(Scalar::Bool(cmp(k, x, y)));
        }
        let f = real_binary::<T::C>(k).ok_or_else(|| format!("{} is not defined on {}", k.name(), T::DTYPE))?;
        Ok(T::down(f(x.up(), y.up())).into())
    }
    fn int<I: IntElem + Into<Scalar>>(k: BinaryOp, x: I, y: I) -> Result<Scalar, String> {
        if k.is_comparison() {
            return Ok(Scalar::Bool(cmp(k, x, y)));
        }
        let f = int_binary::<I>(k).ok_or_else(|| format!("{} is not defined on {}", k.name(), I::DTYPE))?;
        Ok(f(x, y)?.into())
    }
    match (a, b) {
        (Scalar::F32(x), Scalar::F32(y)) => float(k, x, y),
        (Scalar::F16(x), Scalar::F16(y)) => float(k, x, y),
        (Scalar::BF16(x), Scalar::BF16(y)) => float(k, x, y),
        (Scalar::F64(x), Scalar::F64(y)) => float(k, x, y),
        (Scalar::I8(x), Scalar::I8(y)) => int(k, x, y),
        (Scalar::U8(x), Scalar::U8(y)) => int(k, x, y),
        (Scalar::I32(x), Scalar::I32(y)) => int(k, x, y),
        (Scalar::I64(x), Scalar::I64(y)) => int(k, x, y),
        (Scalar::I16(x), Scalar::I16(y)) => int(k, x, y),
        (Scalar::U16(x), Scalar::U16(y)) => int(k, x, y),
        (Scalar::U32(x), Scalar::U32(y)) => int(k, x, y),
        (Scalar::U64(x), Scalar::U64(y)) => int(k, x, y),
        (Scalar::Bool(x), Scalar::Bool(y)) => match k {
            BinaryOp::And => Ok(Scalar::Bool(x & y)),
            BinaryOp::Or => Ok(Scalar::Bool(x | y)),
            BinaryOp::Xor => Ok(Scalar::Bool(x ^ y)),
            BinaryOp::Eq => Ok(Scalar::Bool(x == y)),
            _ => Err(format!("{} is not defined on bool", k.name())),
        },
        _ if a.dtype() == b.dtype() => {
            Err(format!("{} is not defined on {} (narrow values are only cast and moved)", k.name(), a.dtype()))
        }
        _ => Err(format!("operand dtypes differ: {} and {}", a.dtype(), b.dtype())),
    }
}

/// One element converted to `to` exactly as the `cast` op converts it.
pub fn cast(x: Scalar, to: DType) -> Scalar {
    fn go<S: Element>(s: S, to: DType) -> Scalar {
        crate::with_dtype!(to, T => Scalar::from(cast_element::<S, T>(s)))
    }
    dispatch_scalar!(x, v => go(v, to))
}

/// Whether `candidate` displaces `best` in an `arg_reduce` of `kind` (NaN is the extreme value; ties go to the
/// first index, or the last with `select_last_index`). Both must have one dtype; otherwise false.
pub fn arg_replaces(kind: ArgKind, select_last_index: bool, candidate: Scalar, best: Scalar) -> bool {
    fn go<T: PartialOrd>(kind: ArgKind, last: bool, c: T, b: T) -> bool {
        super::reduce::replaces(c, b, kind, last)
    }
    match (candidate, best) {
        (Scalar::F32(c), Scalar::F32(b)) => go(kind, select_last_index, c, b),
        (Scalar::F16(c), Scalar::F16(b)) => go(kind, select_last_index, c, b),
        (Scalar::BF16(c), Scalar::BF16(b)) => go(kind, select_last_index, c, b),
        (Scalar::F64(c), Scalar::F64(b)) => go(kind, select_last_index, c, b),
        (Scalar::I8(c), Scalar::I8(b)) => go(kind, select_last_index, c, b),
        (Scalar::U8(c), Scalar::U8(b)) => go(kind, select_last_index, c, b),
        (Scalar::I32(c), Scalar::I32(b)) => go(kind, select_last_index, c, b),
        (Scalar::I64(c), Scalar::I64(b)) => go(kind, select_last_index, c, b),
        (Scalar::I16(c), Scalar::I16(b)) => go(kind, select_last_index, c, b),
        (Scalar::U16(c), Scalar::U16(b)) => go(kind, select_last_index, c, b),
        (Scalar::U32(c), Scalar::U32(b)) => go(kind, select_last_index, c, b),
        (Scalar::U64(c), Scalar::U64(b)) => go(kind, select_last_index, c, b),
        (Scalar::Bool(c), Scalar::Bool(b)) => go(kind, select_last_index, c, b),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_follow_the_tensor_ops() {
        assert_eq!(binary(BinaryOp::Add, Scalar::I8(127), Scalar::I8(1)), Ok(Scalar::I8(-128)));
        assert!(binary(BinaryOp::Div, Scalar::I32(1), Scalar::I32(0)).is_err());
        assert_eq!(binary(BinaryOp::Mod, Scalar::I32(-7), Scalar::I32(2)), Ok(Scalar::I32(1)));
        assert_eq!(binary(BinaryOp::Lt, Scalar::F32(1.0), Scalar::F32(2.0)), Ok(Scalar::Bool(true)));
        assert_eq!(unary(UnaryOp::Abs, Scalar::I8(-128)), Ok(Scalar::I8(-128)));
        assert_eq!(unary(UnaryOp::IsNan, Scalar::F16(f16::NAN)), Ok(Scalar::Bool(true)));
        assert_eq!(cast(Scalar::F32(-2.9), DType::I32), Scalar::I32(-2));
        assert_eq!(cast(Scalar::F64(f64::NAN), DType::Bool), Scalar::Bool(true));
        assert_eq!(Scalar::from_f64(DType::U8, 300.0), Scalar::U8(255));
        assert!(arg_replaces(ArgKind::Max, false, Scalar::F32(f32::NAN), Scalar::F32(1.0)));
        assert!(!arg_replaces(ArgKind::Max, false, Scalar::F32(1.0), Scalar::F32(1.0)));
        let mut d = Data::zeros(DType::I64, 2);
        Scalar::I64(5).write(&mut d, 1).unwrap();
        assert_eq!(Scalar::read(&d, 1), Scalar::I64(5));
        assert!(Scalar::F32(1.0).write(&mut d, 0).is_err());
    }
}
