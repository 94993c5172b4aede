//! Quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, ConvInteger,
//! QLinearMatMul and QLinearConv.
//!
//! The integer products are the IR's `matmul_integer` and `conv_integer` (i8/u8 operands, zero points, exact i32
//! accumulation), DynamicQuantizeLinear is the IR's `dynamic_quantize`; everything around them — scaling, rounding half to even, adding the zero point, saturating —
//! is elementwise IR that fuses into the neighbouring kernels. Quantized types are u8 and i8; the others ONNX
//! allows (int16, int4, float8, …) are refused by name when a tensor of them is read.

use kiln_ir::builder::INLINE_CONSTANT_LIMIT;
use kiln_ir::op::{BinaryOp as B, Gather, UnaryOp as U};
use kiln_ir::{DType, Data, Dim, Op, Tensor};

use super::nn::conv_attrs;
use super::{axis, bin, cast, i64_tensor, onnx_dtype, reshape, un};
use crate::import::{Ctx, Val};
use crate::node::OnnxNode;

/// The saturation range of a quantized type.
pub(super) fn range(d: DType) -> Result<(f64, f64), String> {
    match d {
        DType::U8 | DType::I8 | DType::U16 | DType::I16 => {
            let (lo, hi) = d.int_range().expect("an integer type");
            Ok((lo as f64, hi as f64))
        }
        DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
            let (lo, hi) = d.narrow_int_range().expect("a narrow integer type");
            Ok((lo as f64, hi as f64))
        }
        other => Err(format!(
            "quantized type {other} is not supported (kiln quantizes to 2-, 4-, 8- and 16-bit integers and the \
             float8/float4 types)"
        )),
    }
}

/// A known scale must be finite and non-zero (a zero scale divides by zero; NaN poisons every result).
pub(super) fn check_scale(s: &Val, what: &str) -> Result<(), String> {
    if !s.dtype().is_float() {
        return Err(format!("{what} must be a float tensor, got {}", s.dtype()));
    }
    if let Some(v) = s.floats()
        && let Some(bad) = v.iter().find(|x| !x.is_finite() || **x == 0.0)
    {
        return Err(format!("{what} holds {bad}: a scale must be finite and non-zero"));
    }
    Ok(())
}

/// A quantization parameter (scale or zero point) shaped to broadcast against `x`: a scalar (or `[1]`) as it
/// is; per axis, a 1-D `[D]` (D = x's extent on `axis`) reshaped to `[D, 1, …]`; blocked (`block > 0`), a tensor
/// of x's rank whose extent on `axis` is `ceil(D / block)`, each entry repeated over its block.
fn granular(cx: &mut Ctx<'_>, p: &Val, x: &Val, axis_attr: i64, block: i64, what: &str) -> Result<Val, String> {
    let scalar = p.rank() == 0 || (p.rank() == 1 && p.ty.shape.0[0] == Dim::Static(1));
    if scalar && block == 0 {
        return Ok(p.clone());
    }
    let a = axis(axis_attr, x.rank())?;
    let along = &x.ty.shape.0[a];
    if block == 0 {
        if p.rank() != 1 || &p.ty.shape.0[0] != along {
            return Err(format!("{what} has shape {}; per-axis quantization needs [{along}] (axis {a})", p.ty.shape));
        }
        return leading(cx, p, x.rank() - a - 1);
    }
    if block < 0 {
        return Err(format!("block_size {block} must be positive"));
    }
    let d = along.as_static().ok_or_else(|| format!("blocked quantization on symbolic dim `{along}`"))?;
    let blocks = d.div_ceil(block as u64);
    let agree = p.rank() == x.rank()
        && p.ty
            .shape
            .0
            .iter()
            .zip(&x.ty.shape.0)
            .enumerate()
            .all(|(i, (pd, xd))| if i == a { *pd == Dim::Static(blocks) } else { pd == xd });
    if !agree {
        return Err(format!(
            "{what} has shape {}; blocked quantization of {} with block_size {block} on axis {a} needs extent \
             {blocks} there and x's elsewhere",
            p.ty.shape, x.ty.shape
        ));
    }
    let index = cx.constant(i64_tensor((0..d as i64).map(|i| i / block).collect()))?;
    cx.op(Op::Gather(Gather { axis: a as i64 }), &[p, &index])
}

/// `saturate(round_half_even(v) + zero)` as `to` (`v` a float tensor, `zero` broadcastable, of dtype `to`).
fn saturate_round(cx: &mut Ctx<'_>, v: &Val, zero: Option<&Val>, to: DType) -> Result<Val, String> {
    let (lo, hi) = range(to)?;
    let mut q = un(cx, U::Round, v)?;
    if let Some(z) = zero {
        let z = cast(cx, z, v.dtype())?;
        q = bin(cx, B::Add, &q, &z)?;
    }
    let (lo, hi) = (cx.scalar(v.dtype(), lo)?, cx.scalar(v.dtype(), hi)?);
    let q = bin(cx, B::Min, &q, &hi)?;
    let q = bin(cx, B::Max, &q, &lo)?;
    cast(cx, &q, to)
}

/// `saturate(round(x / scale) + zero)` as `to`, dividing in `compute`.
pub(super) fn quantize(
    cx: &mut Ctx<'_>,
    x: &Val,
    scale: &Val,
    zero: Option<&Val>,
    to: DType,
    compute: DType,
) -> Result<Val, String> {
    let (x, s) = (cast(cx, x, compute)?, cast(cx, scale, compute)?);
    let v = bin(cx, B::Div, &x, &s)?;
    if to.is_narrow_float() {
        // float8/float4: the cast rounds to nearest even and saturates.
        let v = match zero {
            Some(z) => {
                let z = cast(cx, z, compute)?;
                bin(cx, B::Add, &v, &z)?
            }
            None => v,
        };
        return cast(cx, &v, to);
    }
    saturate_round(cx, &v, zero, to)
}

/// `(q - zero) * scale` as `out`: the subtraction in i32 (exact), the product in f32.
pub(super) fn dequantize(
    cx: &mut Ctx<'_>,
    q: &Val,
    scale: &Val,
    zero: Option<&Val>,
    out: DType,
) -> Result<Val, String> {
    // float8/float4 values subtract in f32 (exact: both are exact f32 values far from f32's precision).
    let diff = if q.dtype().is_narrow_float() { DType::F32 } else { DType::I32 };
    // An 8-bit weight stays 8-bit: folded here it would become f32 weights, and the `integer-products` pass
    // could no longer run its matmul or conv on the integer kernels (the pass pipeline's constant folding still
    // folds a dequantized weight that nothing multiplies).
    let stored_8bit =
        matches!(q.dtype(), DType::U8 | DType::I8) && q.konst.as_ref().is_some_and(|t| t.len() > INLINE_CONSTANT_LIMIT);
    let q = &if stored_8bit { Val { konst: None, ..q.clone() } } else { q.clone() };
    let mut d = cast(cx, q, diff)?;
    if let Some(z) = zero {
        let z = cast(cx, z, diff)?;
        d = bin(cx, B::Sub, &d, &z)?;
    }
    let (d, s) = (cast(cx, &d, DType::F32)?, cast(cx, scale, DType::F32)?);
    let y = bin(cx, B::Mul, &d, &s)?;
    cast(cx, &y, out)
}

/// A float dtype attribute (`precision`, `output_dtype`): `None` when absent or 0 (unset).
fn dtype_attr(n: &OnnxNode<'_>, name: &str) -> Result<Option<DType>, String> {
    match n.opt_int(name) {
        None | Some(0) => Ok(None),
        Some(code) => onnx_dtype(code).map(Some),
    }
}

pub(crate) fn quantize_linear(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, scale, zero) = (n.input(0)?, n.input(1)?, n.opt_input(2));
    let saturate = n.int("saturate", 1);
    let to = match (zero, dtype_attr(n, "output_dtype")?) {
        (Some(z), Some(d)) if d != z.dtype() => {
            return Err(format!("output_dtype {d} disagrees with the zero point's type {}", z.dtype()));
        }
        (Some(z), _) => z.dtype(),
        (None, Some(d)) => d,
        (None, None) => DType::U8,
    };
    if to.is_narrow_float() {
        // `saturate` concerns only these.
        if saturate != 1 {
            return Err("saturate=0 (float8 only) is not supported".into());
        }
    } else {
        range(to)?;
    }
    if !x.dtype().is_float() && x.dtype() != DType::I32 {
        return Err(format!("quantizes float or i32 tensors, got {}", x.dtype()));
    }
    check_scale(scale, "y_scale")?;
    let compute = dtype_attr(n, "precision")?.unwrap_or(scale.dtype());
    if !compute.is_float() {
        return Err(format!("precision {compute} is not a float type"));
    }
    let (a, block) = (n.int("axis", 1), n.int("block_size", 0));
    let s = granular(cx, scale, x, a, block, "y_scale")?;
    let z = zero.map(|z| granular(cx, z, x, a, block, "y_zero_point")).transpose()?;
    Ok(vec![quantize(cx, x, &s, z.as_ref(), to, compute)?])
}

pub(crate) fn dequantize_linear(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, scale, zero) = (n.input(0)?, n.input(1)?, n.opt_input(2));
    match x.dtype() {
        DType::U8 | DType::I8 | DType::U16 | DType::I16 => {}
        d if d.is_narrow() => {}
        DType::I32 => {
            if zero.and_then(Val::ints).is_some_and(|z| z.iter().any(|&v| v != 0)) {
                return Err("an i32 input needs a zero point of 0".into());
            }
        }
        other => return Err(format!("dequantizes integer, float8 or float4 tensors, got {other}")),
    }
    if let Some(z) = zero
        && z.dtype() != x.dtype()
    {
        return Err(format!("x_zero_point is {} but x is {}", z.dtype(), x.dtype()));
    }
    check_scale(scale, "x_scale")?;
    let out = dtype_attr(n, "output_dtype")?.unwrap_or(scale.dtype());
    if !out.is_float() {
        return Err(format!("output_dtype {out} is not a float type"));
    }
    let (a, block) = (n.int("axis", 1), n.int("block_size", 0));
    let s = granular(cx, scale, x, a, block, "x_scale")?;
    let z = zero.map(|z| granular(cx, z, x, a, block, "x_zero_point")).transpose()?;
    Ok(vec![dequantize(cx, x, &s, z.as_ref(), out)?])
}

/// ONNX DynamicQuantizeLinear, as ONNX Runtime computes it: one `dynamic_quantize` op (its arithmetic is
/// `kiln_ir::quant`'s), which the CPU runs as a vectorized routine and a device plan as one kernel.
pub(crate) fn dynamic_quantize_linear(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    if x.dtype() != DType::F32 {
        return Err(format!("quantizes f32 tensors, got {}", x.dtype()));
    }
    cx.op_multi(Op::DynamicQuantize, &[x])
}

/// An optional zero-point operand, or a scalar 0 of `like`'s dtype.
pub(super) fn zero_or_default(cx: &mut Ctx<'_>, z: Option<&Val>, like: &Val) -> Result<Val, String> {
    match z {
        Some(z) => Ok(z.clone()),
        None => cx.constant(Tensor::new(vec![], Data::from_i64_iter(like.dtype(), std::iter::once(0))).expect("one")),
    }
}

/// A per-row, per-channel or per-axis parameter (`[D]`, D ≠ 1) as `[D, 1, …]` with `trailing` ones, so that it
/// broadcasts along its operand's dim; a scalar or `[1]` as it is.
fn leading(cx: &mut Ctx<'_>, p: &Val, trailing: usize) -> Result<Val, String> {
    match p.ty.shape.0.as_slice() {
        [d] if *d != Dim::Static(1) => {
            let mut dims = vec![Dim::Static(1); trailing + 1];
            dims[0] = d.clone();
            reshape(cx, p, dims)
        }
        _ => Ok(p.clone()),
    }
}

pub(crate) fn matmul_integer(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (a, b) = (n.input(0)?, n.input(1)?);
    let az = zero_or_default(cx, n.opt_input(2), a)?;
    let bz = zero_or_default(cx, n.opt_input(3), b)?;
    Ok(vec![cx.op(Op::MatMulInteger, &[a, b, &az, &bz])?])
}

pub(crate) fn conv_integer(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, w) = (n.input(0)?, n.input(1)?);
    let attrs = conv_attrs(n, x, w, "ConvInteger")?;
    let xz = zero_or_default(cx, n.opt_input(2), x)?;
    let wz = zero_or_default(cx, n.opt_input(3), w)?;
    Ok(vec![cx.op(Op::ConvInteger(attrs), &[x, w, &xz, &wz])?])
}

/// `saturate(round(acc · multiplier) + zero)`, the requantization of an i32 accumulator, in f32 as ONNX Runtime
/// and the ONNX reference compute it.
pub(super) fn requantize(cx: &mut Ctx<'_>, acc: &Val, multiplier: &Val, zero: &Val) -> Result<Val, String> {
    let (acc, m) = (cast(cx, acc, DType::F32)?, cast(cx, multiplier, DType::F32)?);
    let v = bin(cx, B::Mul, &acc, &m)?;
    saturate_round(cx, &v, Some(zero), zero.dtype())
}

/// `a_scale · b_scale / y_scale` (each already shaped to broadcast), in the scales' own type as the ONNX
/// reference computes it.
pub(super) fn multiplier(cx: &mut Ctx<'_>, a: &Val, b: &Val, y: &Val) -> Result<Val, String> {
    let ab = bin(cx, B::Mul, a, b)?;
    bin(cx, B::Div, &ab, y)
}

pub(crate) fn qlinear_matmul(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (a, a_scale, az) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let (b, b_scale, bz) = (n.input(3)?, n.input(4)?, n.input(5)?);
    let (y_scale, yz) = (n.input(6)?, n.input(7)?);
    for (s, what) in [(a_scale, "a_scale"), (b_scale, "b_scale"), (y_scale, "y_scale")] {
        check_scale(s, what)?;
    }
    range(yz.dtype())?;
    let acc = cx.op(Op::MatMulInteger, &[a, b, az, bz])?;
    let a_scale = leading(cx, a_scale, 1)?;
    let m = multiplier(cx, &a_scale, b_scale, y_scale)?;
    Ok(vec![requantize(cx, &acc, &m, yz)?])
}

pub(crate) fn qlinear_conv(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, x_scale, xz) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let (w, w_scale, wz) = (n.input(3)?, n.input(4)?, n.input(5)?);
    let (y_scale, yz) = (n.input(6)?, n.input(7)?);
    for (s, what) in [(x_scale, "x_scale"), (w_scale, "w_scale"), (y_scale, "y_scale")] {
        check_scale(s, what)?;
    }
    range(yz.dtype())?;
    let attrs = conv_attrs(n, x, w, "QLinearConv")?;
    let k = x.rank().saturating_sub(2);
    let mut acc = cx.op(Op::ConvInteger(attrs), &[x, w, xz, wz])?;
    if let Some(bias) = n.opt_input(8) {
        if bias.dtype() != DType::I32 {
            return Err(format!("the bias must be i32, got {}", bias.dtype()));
        }
        let bias = leading(cx, bias, k)?;
        acc = bin(cx, B::Add, &acc, &bias)?;
    }
    let w_scale = leading(cx, w_scale, k)?;
    let m = multiplier(cx, x_scale, &w_scale, y_scale)?;
    Ok(vec![requantize(cx, &acc, &m, yz)?])
}
