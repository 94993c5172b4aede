//! ONNX Runtime's contrib quantization ops (domain `com.microsoft`): what its quantizer writes in the QOperator
//! format (QLinearAdd, QLinearMul, QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat, QLinearSigmoid,
//! QLinearLeakyRelu, QGemm) and what its graph optimizer fuses dynamic quantization into (DynamicQuantizeMatMul,
//! MatMulIntegerToFloat), plus the domain's QuantizeLinear/DequantizeLinear/QLinearConv, which are the standard
//! ops'.
//!
//! Each is defined by ONNX Runtime as dequantize → the float op → quantize, and imported as that composition:
//! the float op compiles like any other, the quantize/dequantize arithmetic fuses into its neighbours, and the
//! integer products (QGemm, DynamicQuantizeMatMul, MatMulIntegerToFloat) are the IR's `matmul_integer`, so they
//! run on the integer kernels. ONNX Runtime computes some of them with integer lookup tables or fixed-point
//! rescaling; results agree within one quantization step (a value on a rounding boundary may round either way).
//! Zero points are optional (0 of the quantized type); a per-tensor scale is a scalar or `[1]`.

use kiln_ir::op::{BinaryOp as B, Concat, PoolKind, Reduce, ReduceKind, UnaryOp as U};
use kiln_ir::{DType, Op};

use super::quant::{self, check_scale, dequantize, multiplier, quantize, range, requantize, zero_or_default};
use super::{Handler, bin, cast, nn, transpose, un};
use crate::import::{Ctx, Val};
use crate::node::OnnxNode;

/// Every supported op type of the `com.microsoft` domain and its handler.
const TABLE: &[(&str, Handler)] = &[
    ("DequantizeLinear", quant::dequantize_linear),
    ("DynamicQuantizeMatMul", dynamic_quantize_matmul),
    ("MatMulIntegerToFloat", matmul_integer_to_float),
    ("QGemm", qgemm),
    ("QLinearAdd", qlinear_binary),
    ("QLinearAveragePool", qlinear_average_pool),
    ("QLinearConcat", qlinear_concat),
    ("QLinearConv", qlinear_conv),
    ("QLinearGlobalAveragePool", qlinear_global_average_pool),
    ("QLinearLeakyRelu", qlinear_unary),
    ("QLinearMul", qlinear_binary),
    ("QLinearSigmoid", qlinear_unary),
    ("QuantizeLinear", quant::quantize_linear),
];

/// The handler for an op type of the `com.microsoft` domain.
pub(crate) fn handler(op_type: &str) -> Option<Handler> {
    TABLE.iter().find(|(n, _)| *n == op_type).map(|(_, h)| *h)
}

/// The supported op types of the `com.microsoft` domain.
pub(crate) fn op_types() -> impl Iterator<Item = &'static str> {
    TABLE.iter().map(|(n, _)| *n)
}

/// A quantized operand at `at` (its scale at `at + 1`, its optional zero point at `at + 2`) dequantized to f32.
fn operand(cx: &mut Ctx<'_>, n: &OnnxNode<'_>, at: usize) -> Result<Val, String> {
    let (q, scale, zero) = (n.input(at)?, n.input(at + 1)?, n.opt_input(at + 2));
    quantized_type(q)?;
    per_tensor(scale, "scale")?;
    if let Some(z) = zero {
        per_tensor(z, "zero point")?;
        if z.dtype() != q.dtype() {
            return Err(format!("a zero point of {} for a {} tensor", z.dtype(), q.dtype()));
        }
    }
    dequantize(cx, q, scale, zero, DType::F32)
}

/// `v` quantized with the scale at `at` and the optional zero point at `at + 1`; the result has the zero
/// point's type, or `like`'s without one.
fn result(cx: &mut Ctx<'_>, n: &OnnxNode<'_>, v: &Val, at: usize, like: DType) -> Result<Val, String> {
    let (scale, zero) = (n.input(at)?, n.opt_input(at + 1));
    per_tensor(scale, "y_scale")?;
    let to = zero.map_or(like, Val::dtype);
    range(to)?;
    quantize(cx, v, scale, zero, to, DType::F32)
}

fn quantized_type(q: &Val) -> Result<(), String> {
    match q.dtype() {
        DType::U8 | DType::I8 => Ok(()),
        other => Err(format!("quantized tensors are u8 or i8, got {other}")),
    }
}

/// A per-tensor parameter: one value (`[]` or `[1]`); a scale also finite and non-zero.
fn per_tensor(p: &Val, what: &str) -> Result<(), String> {
    if p.ty.shape.num_elements() != Some(1) || p.rank() > 1 {
        return Err(format!("the {what} must be one value (per tensor), got shape {}", p.ty.shape));
    }
    if what.contains("scale") {
        check_scale(p, what)?;
    }
    Ok(())
}

/// QLinearAdd, QLinearMul: `C = quantize(dequantize(A) ∘ dequantize(B))`, broadcasting.
fn qlinear_binary(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let kind = if n.proto.op_type == "QLinearAdd" { B::Add } else { B::Mul };
    let (a, b) = (operand(cx, n, 0)?, operand(cx, n, 3)?);
    let c = bin(cx, kind, &a, &b)?;
    Ok(vec![result(cx, n, &c, 6, n.input(0)?.dtype())?])
}

/// QLinearSigmoid, QLinearLeakyRelu (`alpha`, default 0.01): `Y = quantize(f(dequantize(X)))`.
fn qlinear_unary(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = operand(cx, n, 0)?;
    let y = if n.proto.op_type == "QLinearSigmoid" {
        un(cx, U::Sigmoid, &x)?
    } else {
        // x where x ≥ 0, alpha·x elsewhere: max(x, 0) + alpha·min(x, 0).
        let alpha = cx.scalar(DType::F32, f64::from(n.float("alpha", 0.01)))?;
        let zero = cx.scalar(DType::F32, 0.0)?;
        let pos = bin(cx, B::Max, &x, &zero)?;
        let neg = bin(cx, B::Min, &x, &zero)?;
        let neg = bin(cx, B::Mul, &neg, &alpha)?;
        bin(cx, B::Add, &pos, &neg)?
    };
    Ok(vec![result(cx, n, &y, 3, n.input(0)?.dtype())?])
}

/// `x` with its channels moved from last to second (`channels_last=1`), or as it is.
fn channels_first(cx: &mut Ctx<'_>, x: &Val, channels_last: bool) -> Result<Val, String> {
    if !channels_last {
        return Ok(x.clone());
    }
    let r = x.rank() as i64;
    if r < 3 {
        return Err(format!("channels_last needs an input of rank ≥ 3, got {}", x.ty.shape));
    }
    transpose(cx, x, std::iter::once(0).chain(std::iter::once(r - 1)).chain(1..r - 1).collect())
}

/// The inverse of [`channels_first`].
fn channels_back(cx: &mut Ctx<'_>, y: &Val, channels_last: bool) -> Result<Val, String> {
    if !channels_last {
        return Ok(y.clone());
    }
    let r = y.rank() as i64;
    transpose(cx, y, std::iter::once(0).chain(2..r).chain(std::iter::once(1)).collect())
}

/// QLinearGlobalAveragePool (`channels_last`): the mean over the spatial dims, kept as size 1.
fn qlinear_global_average_pool(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let last = n.int("channels_last", 0) != 0;
    let x = operand(cx, n, 0)?;
    if x.rank() < 3 {
        return Err(format!("needs an input of rank ≥ 3, got {}", x.ty.shape));
    }
    let r = x.rank() as i64;
    let axes: Vec<i64> = if last { (1..r - 1).collect() } else { (2..r).collect() };
    let y = cx.op(Op::Reduce(Reduce { kind: ReduceKind::Mean, axes, keep_dims: true }), &[&x])?;
    Ok(vec![result(cx, n, &y, 3, n.input(0)?.dtype())?])
}

/// QLinearAveragePool: AveragePool's attributes (and `channels_last`) on the dequantized input.
fn qlinear_average_pool(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let last = n.int("channels_last", 0) != 0;
    let x = operand(cx, n, 0)?;
    let x = channels_first(cx, &x, last)?;
    let attrs = nn::pool_attrs(n, &x, PoolKind::Avg)?;
    let y = cx.op(Op::Pool(attrs), &[&x])?;
    let y = channels_back(cx, &y, last)?;
    Ok(vec![result(cx, n, &y, 3, n.input(0)?.dtype())?])
}

/// QLinearConcat (`axis`): inputs `Y_scale, Y_zero_point`, then a `(X, X_scale, X_zero_point)` triple per
/// operand; each operand dequantized, concatenated, requantized.
fn qlinear_concat(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let count = n.proto.input.len();
    if count < 5 || !(count - 2).is_multiple_of(3) {
        return Err(format!("needs Y_scale, Y_zero_point and (X, X_scale, X_zero_point) triples, got {count} inputs"));
    }
    let axis = n.opt_int("axis").ok_or("the `axis` attribute is required")?;
    let parts = (2..count).step_by(3).map(|at| operand(cx, n, at)).collect::<Result<Vec<_>, _>>()?;
    let refs: Vec<&Val> = parts.iter().collect();
    let y = cx.op(Op::Concat(Concat { axis }), &refs)?;
    Ok(vec![result(cx, n, &y, 0, n.input(2)?.dtype())?])
}

/// The com.microsoft QLinearConv: the standard op's, in the default channel-first layout.
fn qlinear_conv(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    if n.int("channels_last", 0) != 0 {
        return Err("channels_last=1 is not supported".into());
    }
    quant::qlinear_conv(cx, n)
}

/// QGemm (`alpha`, `transA`, `transB`): `acc = (A' − za)·(B' − zb) [+ C]` in i32 (`C` an i32 bias in the scale
/// `a_scale·b_scale`), then `acc · alpha·a_scale·b_scale` — requantized with `y_scale`/`y_zero_point` when
/// `y_scale` is given, f32 otherwise. `b`'s scale and zero point may be one per column.
fn qgemm(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let Product { a, b, za, zb, sa, sb } = product(cx, n, [0, 3, 1, 4, 2, 5])?;
    let a = if n.int("transA", 0) != 0 { transpose(cx, &a, vec![1, 0])? } else { a };
    let b = if n.int("transB", 0) != 0 { transpose(cx, &b, vec![1, 0])? } else { b };
    let mut acc = cx.op(Op::MatMulInteger, &[&a, &b, &za, &zb])?;
    if let Some(c) = n.opt_input(6) {
        if c.dtype() != DType::I32 {
            return Err(format!("the bias C must be i32, got {}", c.dtype()));
        }
        acc = bin(cx, B::Add, &acc, c)?;
    }
    let alpha = cx.scalar(DType::F32, f64::from(n.float("alpha", 1.0)))?;
    let scale = bin(cx, B::Mul, &sa, &sb)?;
    let scale = bin(cx, B::Mul, &scale, &alpha)?;
    match n.opt_input(7) {
        Some(ys) => {
            per_tensor(ys, "y_scale")?;
            let one = cx.scalar(DType::F32, 1.0)?;
            let m = multiplier(cx, &scale, &one, ys)?;
            let yz = zero_or_default(cx, n.opt_input(8), n.input(0)?)?;
            range(yz.dtype())?;
            Ok(vec![requantize(cx, &acc, &m, &yz)?])
        }
        None => {
            let y = cast(cx, &acc, DType::F32)?;
            Ok(vec![bin(cx, B::Mul, &y, &scale)?])
        }
    }
}

/// `f32((A − za)·(B − zb)) · (sa·sb) [+ bias]`, the float result of an integer matmul.
fn scaled_product(cx: &mut Ctx<'_>, a: &Val, b: &Val, za: &Val, zb: &Val, sa: &Val, sb: &Val) -> Result<Val, String> {
    let acc = cx.op(Op::MatMulInteger, &[a, b, za, zb])?;
    let y = cast(cx, &acc, DType::F32)?;
    let scale = bin(cx, B::Mul, sa, sb)?;
    bin(cx, B::Mul, &y, &scale)
}

fn with_bias(cx: &mut Ctx<'_>, y: Val, bias: Option<&Val>) -> Result<Vec<Val>, String> {
    Ok(vec![match bias {
        Some(b) => bin(cx, B::Add, &y, b)?,
        None => y,
    }])
}

/// DynamicQuantizeMatMul: `A` (f32) quantized to u8 with its own range (DynamicQuantizeLinear), times the 8-bit
/// `B` (scale and zero point per tensor or per column), scaled back to f32, plus the optional f32 bias.
fn dynamic_quantize_matmul(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (a, b, sb) = (n.input(0)?, n.input(1)?, n.input(2)?);
    if a.dtype() != DType::F32 {
        return Err(format!("A must be f32, got {}", a.dtype()));
    }
    quantized_type(b)?;
    check_scale(sb, "b_scale")?;
    let zb = zero_or_default(cx, n.opt_input(3), b)?;
    let q = cx.op_multi(Op::DynamicQuantize, &[a])?;
    let [qa, sa, za] = q.as_slice() else { return Err(format!("dynamic_quantize gave {} results", q.len())) };
    let y = scaled_product(cx, qa, b, za, &zb, sa, sb)?;
    with_bias(cx, y, n.opt_input(4))
}

/// MatMulIntegerToFloat: inputs `A, B, a_scale, b_scale, a_zero_point?, b_zero_point?, bias?`;
/// `f32((A − za)·(B − zb)) · (a_scale·b_scale) + bias`.
fn matmul_integer_to_float(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let Product { a, b, za, zb, sa, sb } = product(cx, n, [0, 1, 2, 3, 4, 5])?;
    let y = scaled_product(cx, &a, &b, &za, &zb, &sa, &sb)?;
    with_bias(cx, y, n.opt_input(6))
}

/// The operands of an integer product and their quantization parameters.
struct Product {
    a: Val,
    b: Val,
    za: Val,
    zb: Val,
    sa: Val,
    sb: Val,
}

/// The operands at input positions `[a, b, a_scale, b_scale, a_zero, b_zero]` (zero points optional: 0 of their
/// operand's type), checked: 8-bit operands, finite non-zero scales, `A`'s per tensor (a per-column scale of A
/// would scale the contraction's terms differently: not one factor of the sum), `B`'s per tensor or per column.
fn product(cx: &mut Ctx<'_>, n: &OnnxNode<'_>, at: [usize; 6]) -> Result<Product, String> {
    let (a, b, sa, sb) = (n.input(at[0])?, n.input(at[1])?, n.input(at[2])?, n.input(at[3])?);
    quantized_type(a)?;
    quantized_type(b)?;
    per_tensor(sa, "a_scale")?;
    check_scale(sb, "b_scale")?;
    let za = zero_or_default(cx, n.opt_input(at[4]), a)?;
    let zb = zero_or_default(cx, n.opt_input(at[5]), b)?;
    Ok(Product { a: a.clone(), b: b.clone(), za, zb, sa: sa.clone(), sb: sb.clone() })
}
