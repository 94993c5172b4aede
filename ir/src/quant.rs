//! The scalar arithmetic of dynamic u8 quantization — ONNX `DynamicQuantizeLinear`, as ONNX Runtime computes
//! it — in one place: the interpreter's `dynamic_quantize` and the CPU runtime's vectorized routine both use
//! these functions (the routine's lanes are tested against them), so every backend agrees bit for bit.
//!
//! Over a tensor `x` with minimum `lo` and maximum `hi`:
//! - the range `[min(lo, 0), max(hi, 0)]` is mapped onto `[0, 255]`: `scale = (hi' - lo') / 255`, or 1 when the
//!   range is empty (all zeros);
//! - the zero point is `round(saturate(-lo' / scale))` (saturating to `[0, 255]` first, rounding half to even
//!   second, as the spec says);
//! - each element is `saturate(round(x / scale) + zero)`.
//!
//! `min` and `max` propagate NaN as the IR's ops do: a NaN anywhere in `x` makes the scale NaN, and a NaN
//! quantizes to 0 (the IR's `cast` of NaN to an integer). An empty tensor has the range `[0, 0]`.
//!
//! [`expand_dynamic_quantize`] writes the same arithmetic as IR primitives (whole-tensor reductions, then
//! elementwise ops): what a target without a native routine — a device plan — lowers to one kernel.

use crate::Error;
use crate::builder::Builder;
use crate::op::{BinaryOp as B, Cast, Op, Reduce, ReduceKind, UnaryOp as U};
use crate::{DType, Value};

/// The IR's `min`: NaN when either operand is NaN.
fn min_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() { f32::NAN } else { a.min(b) }
}

/// The IR's `max`: NaN when either operand is NaN.
fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) }
}

/// The smallest and largest element of a tensor before any element: the identities of [`merge_range`].
pub const EMPTY_RANGE: (f32, f32) = (f32::INFINITY, f32::NEG_INFINITY);

/// Two partial `(smallest, largest)` ranges as one, NaN in both when either holds a NaN (the IR's `min` and
/// `max` propagate it): folded over the elements (each `(v, v)`) from [`EMPTY_RANGE`], in any grouping, it gives
/// the range [`dynamic_u8_params`] takes.
pub fn merge_range(a: (f32, f32), b: (f32, f32)) -> (f32, f32) {
    if a.0.is_nan() || b.0.is_nan() { (f32::NAN, f32::NAN) } else { (a.0.min(b.0), a.1.max(b.1)) }
}

/// The largest u8 level, as f32.
const LEVELS: f32 = 255.0;

/// The scale and zero point of dynamic u8 quantization of a tensor whose smallest element is `lo` and largest
/// `hi` (NaN when it holds a NaN; `+inf` and `-inf`, the reductions' identities, when it is empty).
pub fn dynamic_u8_params(lo: f32, hi: f32) -> (f32, u8) {
    let lo = min_nan(lo, 0.0);
    let hi = max_nan(hi, 0.0);
    let span = hi - lo;
    let scale = if span == 0.0 { 1.0 } else { span / LEVELS };
    let initial = max_nan(min_nan(-(lo / scale), LEVELS), 0.0);
    (scale, saturate_u8(initial.round_ties_even()))
}

/// `saturate(round(x / scale) + zero)` as u8: rounding half to even, NaN to 0.
pub fn quantize_u8(x: f32, scale: f32, zero: u8) -> u8 {
    saturate_u8((x / scale).round_ties_even() + f32::from(zero))
}

/// An integral `v` clamped to `[0, 255]` (NaN-propagating, as the IR's `min`/`max`) and cast to u8 (NaN → 0).
fn saturate_u8(v: f32) -> u8 {
    let v = max_nan(min_nan(v, LEVELS), 0.0);
    // `as` saturates and sends NaN to 0, as the IR's `cast` does.
    v as u8
}

/// `dynamic_quantize(x)` written as IR primitives in `b`, in [`dynamic_u8_params`]' and [`quantize_u8`]'s order
/// of operations (so the interpreter evaluates it to the same bits): `[y, scale, zero]`.
pub fn expand_dynamic_quantize(b: &mut Builder, x: Value) -> Result<[Value; 3], Error> {
    let rank = b.type_of(x)?.shape.rank();
    let all: Vec<i64> = (0..rank as i64).collect();
    let whole = |b: &mut Builder, kind| b.op(Op::Reduce(Reduce { kind, axes: all.clone(), keep_dims: false }), &[x]);
    let (lo, hi) = (whole(b, ReduceKind::Min)?, whole(b, ReduceKind::Max)?);
    let zero = b.scalar(DType::F32, 0.0)?;
    let levels = b.scalar(DType::F32, f64::from(LEVELS))?;
    let one = b.scalar(DType::F32, 1.0)?;
    let lo = b.op(Op::Binary(B::Min), &[lo, zero])?;
    let hi = b.op(Op::Binary(B::Max), &[hi, zero])?;
    let span = b.op(Op::Binary(B::Sub), &[hi, lo])?;
    let scaled = b.op(Op::Binary(B::Div), &[span, levels])?;
    let empty = b.op(Op::Binary(B::Eq), &[span, zero])?;
    let scale = b.op(Op::Select, &[empty, one, scaled])?;
    let shift = b.op(Op::Binary(B::Div), &[lo, scale])?;
    let initial = b.op(Op::Unary(U::Neg), &[shift])?;
    let initial = b.op(Op::Binary(B::Min), &[initial, levels])?;
    let initial = b.op(Op::Binary(B::Max), &[initial, zero])?;
    let initial = b.op(Op::Unary(U::Round), &[initial])?;
    let zp = saturate_u8_ops(b, initial, zero, levels)?;
    let q = b.op(Op::Binary(B::Div), &[x, scale])?;
    let q = b.op(Op::Unary(U::Round), &[q])?;
    let zf = b.op(Op::Cast(Cast { to: DType::F32 }), &[zp])?;
    let q = b.op(Op::Binary(B::Add), &[q, zf])?;
    let y = saturate_u8_ops(b, q, zero, levels)?;
    Ok([y, scale, zp])
}

/// [`saturate_u8`] as IR ops.
fn saturate_u8_ops(b: &mut Builder, v: Value, zero: Value, levels: Value) -> Result<Value, Error> {
    let v = b.op(Op::Binary(B::Min), &[v, levels])?;
    let v = b.op(Op::Binary(B::Max), &[v, zero])?;
    b.op(Op::Cast(Cast { to: DType::U8 }), &[v])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{Data, Tensor};

    #[test]
    fn parameters_follow_the_spec() {
        // The range always holds 0: [0.5, 2] quantizes over [0, 2].
        assert_eq!(dynamic_u8_params(0.5, 2.0), (2.0 / 255.0, 0));
        assert_eq!(dynamic_u8_params(-1.0, -0.5), (1.0 / 255.0, 255));
        let (s, z) = dynamic_u8_params(-1.0, 3.0);
        assert_eq!(s, 4.0 / 255.0);
        // -(-1) / (4/255) = 63.75 → 64.
        assert_eq!(z, 64);
        // All zeros (and empty): scale 1, zero point 0.
        assert_eq!(dynamic_u8_params(0.0, 0.0), (1.0, 0));
        assert_eq!(dynamic_u8_params(f32::INFINITY, f32::NEG_INFINITY), (1.0, 0));
        let (s, z) = dynamic_u8_params(f32::NAN, f32::NAN);
        assert!(s.is_nan());
        assert_eq!(z, 0);
    }

    #[test]
    fn elements_round_half_to_even_and_saturate() {
        assert_eq!(quantize_u8(2.5, 1.0, 0), 2);
        assert_eq!(quantize_u8(3.5, 1.0, 0), 4);
        assert_eq!(quantize_u8(-3.0, 1.0, 10), 7);
        assert_eq!(quantize_u8(1e9, 1.0, 0), 255);
        assert_eq!(quantize_u8(-1e9, 1.0, 0), 0);
        assert_eq!(quantize_u8(f32::INFINITY, 1.0, 3), 255);
        assert_eq!(quantize_u8(f32::NEG_INFINITY, 1.0, 3), 0);
        assert_eq!(quantize_u8(f32::NAN, 1.0, 3), 0);
        assert_eq!(quantize_u8(1.0, f32::NAN, 3), 0);
    }

    #[test]
    fn the_primitive_expansion_evaluates_to_the_op() {
        let specials = [0.0, -0.0, 1.5, -2.5, 1e-8, 3e38, -7.25, 0.1];
        let cases: Vec<Vec<f32>> = vec![
            specials.to_vec(),
            vec![0.0; 6],
            vec![0.5, 2.0, 1.25, 0.0],
            vec![-1.0, -0.5, -0.75, -0.125],
            (0..37).map(|i| (i as f32 * 0.37).sin() * 5.0).collect(),
            vec![1.0, f32::NAN, 2.0, 0.0],
            vec![1.0, f32::INFINITY, -2.0, 0.0],
        ];
        for xs in cases {
            let x = Tensor::new(vec![xs.len()], Data::F32(xs.clone())).unwrap();
            let want = crate::interp::eval_op(&Op::DynamicQuantize, &[&x]).unwrap();
            let mut b = Builder::new("dq");
            let input = b.input("x", DType::F32, crate::Shape::of(&[xs.len() as u64])).unwrap();
            let [y, s, z] = expand_dynamic_quantize(&mut b, input).unwrap();
            b.output("y", y);
            b.output("s", s);
            b.output("z", z);
            let inputs = std::collections::BTreeMap::from([("x".to_string(), x)]);
            let got = crate::interp::run(&b.finish(), &inputs).unwrap();
            for ((_, g), w) in got.iter().zip(&want) {
                assert_eq!(format!("{:?}", g.data()), format!("{:?}", w.data()), "{xs:?}");
            }
        }
    }
}
