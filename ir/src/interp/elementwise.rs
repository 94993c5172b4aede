//! Elementwise ops: unary math, binary math and comparisons with numpy broadcasting, `cast` and `select`.
//!
//! Floats compute in their [`Real`] type (f16/bf16 widen to f32 and round once per element); integers wrap;
//! bool supports only the logical kinds and `eq`; the bitwise kinds and shifts take integers only. Integer
//! `div`/`mod`/`rem` by zero, `MIN / -1` and negative `pow` exponents are errors, never traps. The scalar kernels ([`real_binary`], [`int_binary`]) are shared with
//! `scatter`'s reductions so the two cannot disagree.

use crate::op::{BinaryOp, UnaryOp};
use crate::tensor::{Data, Element, Tensor};
use crate::types::DType;

use super::index::{broadcast_offsets, broadcast_shapes};
use super::num::{FloatElem, IntElem, Real, by_family, cast_element};

/// Applies a unary kind elementwise.
pub(super) fn unary(k: UnaryOp, x: &Tensor) -> Result<Tensor, String> {
    let data = by_family!(x.data(),
        float v => unary_float(k, v)?,
        int v => {
            let f = int_unary(k).ok_or_else(|| format!("{} is not defined on {}", k.name(), x.dtype()))?;
            Element::wrap(v.iter().map(|&a| f(a)).collect::<Vec<_>>())
        },
        bool v => match k {
            UnaryOp::Not => Data::Bool(v.iter().map(|&a| !a).collect()),
            _ => return Err(format!("{} is not defined on bool", k.name())),
        },
    );
    Ok(Tensor::new(x.shape().to_vec(), data).expect("elementwise results keep the operand's element count"))
}

fn unary_float<T: FloatElem>(k: UnaryOp, v: &[T]) -> Result<Data, String> {
    Ok(match k {
        UnaryOp::IsNan => Data::Bool(v.iter().map(|&a| a.up().is_nan()).collect()),
        UnaryOp::IsInf => Data::Bool(v.iter().map(|&a| a.up().is_infinite()).collect()),
        _ => {
            let f = real_unary::<T::C>(k).ok_or_else(|| format!("{} is not defined on {}", k.name(), T::DTYPE))?;
            T::wrap(v.iter().map(|&a| T::down(f(a.up()))).collect())
        }
    })
}

/// The scalar function of a float unary kind (`None` for `not`, `is_nan`, `is_inf`, whose results are bool).
pub(super) fn real_unary<R: Real>(k: UnaryOp) -> Option<fn(R) -> R> {
    Some(match k {
        UnaryOp::Neg => |x: R| -x,
        UnaryOp::Abs => R::abs,
        UnaryOp::Exp => R::exp,
        UnaryOp::Log => R::ln,
        UnaryOp::Sqrt => R::sqrt,
        UnaryOp::Rsqrt => |x: R| R::ONE / x.sqrt(),
        UnaryOp::Reciprocal => |x: R| R::ONE / x,
        UnaryOp::Tanh => R::tanh,
        // Accurate at both ends: exp(-x) overflows to inf for very negative x, giving exactly 0.
        UnaryOp::Sigmoid => |x: R| R::ONE / (R::ONE + (-x).exp()),
        UnaryOp::Erf => R::erf,
        UnaryOp::Relu => |x: R| if x.is_nan() || x > R::ZERO { x } else { R::ZERO },
        UnaryOp::Sin => R::sin,
        UnaryOp::Cos => R::cos,
        UnaryOp::Tan => R::tan,
        UnaryOp::Asin => R::asin,
        UnaryOp::Acos => R::acos,
        UnaryOp::Atan => R::atan,
        UnaryOp::Sinh => R::sinh,
        UnaryOp::Cosh => R::cosh,
        UnaryOp::Asinh => R::asinh,
        UnaryOp::Acosh => R::acosh,
        UnaryOp::Atanh => R::atanh,
        UnaryOp::Floor => R::floor,
        UnaryOp::Ceil => R::ceil,
        UnaryOp::Round => R::round_even,
        // NaN and ±0 map to themselves.
        UnaryOp::Sign => |x: R| {
            if x > R::ZERO {
                R::ONE
            } else if x < R::ZERO {
                -R::ONE
            } else {
                x
            }
        },
        UnaryOp::Not | UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::BitNot => return None,
    })
}

/// The scalar function of an integer unary kind: wrapping `neg`/`abs`, `relu`, `sign`, and rounding as the
/// identity. `None` for float-only and bool kinds.
pub(super) fn int_unary<I: IntElem>(k: UnaryOp) -> Option<fn(I) -> I> {
    Some(match k {
        UnaryOp::Neg => I::wneg,
        UnaryOp::Abs => I::wabs,
        UnaryOp::Relu => |x: I| if x.is_negative() { I::ZERO } else { x },
        UnaryOp::Sign => I::sign,
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => |x: I| x,
        UnaryOp::BitNot => |x: I| !x,
        _ => return None,
    })
}

/// Applies a binary kind elementwise with numpy broadcasting.
pub(super) fn binary(k: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    if a.dtype() != b.dtype() {
        return Err(format!("operand dtypes differ: {} and {}", a.dtype(), b.dtype()));
    }
    let shape = broadcast_shapes(&[a.shape(), b.shape()])?;
    let oa = broadcast_offsets(a.shape(), &shape)?;
    let ob = broadcast_offsets(b.shape(), &shape)?;
    let pairs = || oa.iter().zip(&ob);
    let data = if k.is_comparison() {
        crate::dispatch_data!(a.data(), va => {
            let vb = same_dtype(va, b)?;
            let cmp = comparison(k).expect("k is a comparison");
            Data::Bool(pairs().map(|(&i, &j)| cmp(&va[i], &vb[j])).collect())
        })
    } else {
        by_family!(a.data(),
            float va => {
                let vb = same_dtype(va, b)?;
                let f = real_binary(k).ok_or_else(|| format!("{} is not defined on {}", k.name(), a.dtype()))?;
                Element::wrap(pairs().map(|(&i, &j)| down_like(va, f(va[i].up(), vb[j].up()))).collect::<Vec<_>>())
            },
            int va => {
                let vb = same_dtype(va, b)?;
                let f = int_binary(k).ok_or_else(|| format!("{} is not defined on {}", k.name(), a.dtype()))?;
                Element::wrap(pairs().map(|(&i, &j)| f(va[i], vb[j])).collect::<Result<Vec<_>, _>>()?)
            },
            bool va => {
                let vb = same_dtype(va, b)?;
                let f: fn(bool, bool) -> bool = match k {
                    BinaryOp::And => |x, y| x & y,
                    BinaryOp::Or => |x, y| x | y,
                    BinaryOp::Xor => |x, y| x ^ y,
                    _ => return Err(format!("{} is not defined on bool", k.name())),
                };
                Data::Bool(pairs().map(|(&i, &j)| f(va[i], vb[j])).collect())
            },
        )
    };
    Ok(Tensor::new(shape, data).expect("one result per broadcast position"))
}

/// `T::down`, with `T` taken from a slice so a closure over the slice's elements can name it.
fn down_like<T: FloatElem>(_: &[T], c: T::C) -> T {
    T::down(c)
}

/// The elements of `t`, which must have the same dtype as `like`.
pub(super) fn same_dtype<'a, T: Element>(like: &[T], t: &'a Tensor) -> Result<&'a [T], String> {
    let _ = like;
    t.as_slice::<T>().ok_or_else(|| format!("operand dtypes differ: {} and {}", T::DTYPE, t.dtype()))
}

fn comparison<T: PartialOrd>(k: BinaryOp) -> Option<fn(&T, &T) -> bool> {
    Some(match k {
        BinaryOp::Eq => |x, y| x == y,
        BinaryOp::Lt => |x, y| x < y,
        BinaryOp::Le => |x, y| x <= y,
        BinaryOp::Gt => |x, y| x > y,
        BinaryOp::Ge => |x, y| x >= y,
        _ => return None,
    })
}

/// The scalar function of a float arithmetic kind (`None` for comparisons and logical kinds).
pub(super) fn real_binary<R: Real>(k: BinaryOp) -> Option<fn(R, R) -> R> {
    Some(match k {
        BinaryOp::Add => |x, y| x + y,
        BinaryOp::Sub => |x, y| x - y,
        BinaryOp::Mul => |x, y| x * y,
        BinaryOp::Div => |x, y| x / y,
        BinaryOp::Pow => R::powf,
        BinaryOp::Max => real_max,
        BinaryOp::Min => real_min,
        BinaryOp::Mod => real_mod,
        BinaryOp::Rem => |x, y| x % y,
        _ => return None,
    })
}

/// The larger of two floats; NaN if either is NaN, and +0 above -0 (IEEE 754-2019 `maximum`).
pub(super) fn real_max<R: Real>(x: R, y: R) -> R {
    if x.is_nan() || y.is_nan() {
        R::NAN
    } else if x > y || (x == y && !x.is_sign_negative()) {
        x
    } else {
        y
    }
}

/// The smaller of two floats; NaN if either is NaN, and -0 below +0 (IEEE 754-2019 `minimum`).
pub(super) fn real_min<R: Real>(x: R, y: R) -> R {
    if x.is_nan() || y.is_nan() {
        R::NAN
    } else if x < y || (x == y && x.is_sign_negative()) {
        x
    } else {
        y
    }
}

/// Python's `%` on floats, as numpy's `remainder`: `fmod`, moved into the divisor's sign; a zero result takes
/// the divisor's sign; `x mod 0` is NaN.
fn real_mod<R: Real>(x: R, y: R) -> R {
    let r = x % y;
    if r == R::ZERO {
        R::ZERO.copysign(y)
    } else if (r < R::ZERO) != (y < R::ZERO) {
        r + y
    } else {
        r
    }
}

/// A fallible integer scalar kernel.
pub(super) type IntBinaryFn<I> = fn(I, I) -> Result<I, String>;

/// The scalar function of an integer arithmetic kind (`None` for comparisons and logical kinds). Errors name
/// the operands.
pub(super) fn int_binary<I: IntElem>(k: BinaryOp) -> Option<IntBinaryFn<I>> {
    Some(match k {
        BinaryOp::Add => |x: I, y| Ok(x.wadd(y)),
        BinaryOp::Sub => |x: I, y| Ok(x.wsub(y)),
        BinaryOp::Mul => |x: I, y| Ok(x.wmul(y)),
        BinaryOp::Div => |x: I, y| {
            x.checked_div(y).ok_or_else(|| {
                if y == I::ZERO {
                    format!("integer division by zero ({x:?} / 0)")
                } else {
                    format!("integer division overflows ({x:?} / {y:?})")
                }
            })
        },
        BinaryOp::Pow => int_pow,
        BinaryOp::Max => |x: I, y| Ok(x.max(y)),
        BinaryOp::Min => |x: I, y| Ok(x.min(y)),
        BinaryOp::Mod => |x: I, y| {
            let r = x.checked_rem(y).ok_or_else(|| format!("integer modulo by zero ({x:?} mod 0)"))?;
            // |r| < |y| and the signs differ, so the sum cannot overflow.
            Ok(if r != I::ZERO && r.is_negative() != y.is_negative() { r.wadd(y) } else { r })
        },
        BinaryOp::Rem => |x: I, y| x.checked_rem(y).ok_or_else(|| format!("integer remainder by zero ({x:?} rem 0)")),
        BinaryOp::BitAnd => |x: I, y| Ok(x & y),
        BinaryOp::BitOr => |x: I, y| Ok(x | y),
        BinaryOp::BitXor => |x: I, y| Ok(x ^ y),
        BinaryOp::Shl => |x: I, y| Ok(x.shl(y)),
        BinaryOp::Shr => |x: I, y| Ok(x.shr(y)),
        _ => return None,
    })
}

/// `x ^ e` by repeated squaring, wrapping; a negative exponent is an error.
fn int_pow<I: IntElem>(x: I, e: I) -> Result<I, String> {
    if e.is_negative() {
        return Err(format!("negative integer exponent ({x:?} pow {e:?})"));
    }
    let mut e = e.to_i64() as u64;
    let (mut base, mut acc) = (x, I::ONE);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wmul(base);
        }
        base = base.wmul(base);
        e >>= 1;
    }
    Ok(acc)
}

/// Converts every element to `to`: floats → ints truncate toward zero and saturate (NaN → 0); ints → ints wrap;
/// anything → bool is `!= 0` (NaN → true); bool → number is 0 or 1; float → float and int → float round to
/// nearest, ties to even, once.
pub(super) fn cast(x: &Tensor, to: DType) -> Result<Tensor, String> {
    fn go<S: Element>(v: &[S], to: DType) -> Data {
        crate::with_dtype!(to, T => T::wrap(v.iter().map(|&s| cast_element::<S, T>(s)).collect()))
    }
    let data = crate::dispatch_data!(x.data(), v => go(v, to));
    Ok(Tensor::new(x.shape().to_vec(), data).expect("cast keeps the element count"))
}

/// `select(cond, a, b)` with all three broadcast together.
pub(super) fn select(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let c = cond.as_slice::<bool>().ok_or_else(|| format!("the condition must be bool, got {}", cond.dtype()))?;
    if a.dtype() != b.dtype() {
        return Err(format!("branch dtypes differ: {} and {}", a.dtype(), b.dtype()));
    }
    let shape = broadcast_shapes(&[cond.shape(), a.shape(), b.shape()])?;
    let oc = broadcast_offsets(cond.shape(), &shape)?;
    let oa = broadcast_offsets(a.shape(), &shape)?;
    let ob = broadcast_offsets(b.shape(), &shape)?;
    let data = crate::dispatch_data!(a.data(), va => {
        let vb = same_dtype(va, b)?;
        Element::wrap((0..oc.len()).map(|i| if c[oc[i]] { va[oa[i]] } else { vb[ob[i]] }).collect::<Vec<_>>())
    });
    Ok(Tensor::new(shape, data).expect("one result per broadcast position"))
}
