//! Elementwise ONNX ops: unary math, binary math and comparisons, activations composed from IR primitives,
//! casts, clip, where, variadic max/min/sum/mean.

use kiln_ir::op::{BinaryOp as B, Cast, Gelu, GeluApprox, UnaryOp as U};
use kiln_ir::{DType, Op};

use super::{bin, onnx_dtype, scalar_like, un};
use crate::import::{Ctx, DimArg, Val};
use crate::node::OnnxNode;

pub(crate) fn unary(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let kind = match n.proto.op_type.as_str() {
        "Abs" => U::Abs,
        "Acos" => U::Acos,
        "Acosh" => U::Acosh,
        "Asin" => U::Asin,
        "Asinh" => U::Asinh,
        "Atan" => U::Atan,
        "Atanh" => U::Atanh,
        "BitwiseNot" => U::BitNot,
        "Ceil" => U::Ceil,
        "Cos" => U::Cos,
        "Cosh" => U::Cosh,
        "Erf" => U::Erf,
        "Exp" => U::Exp,
        "Floor" => U::Floor,
        "IsNaN" => U::IsNan,
        "Log" => U::Log,
        "Neg" => U::Neg,
        "Not" => U::Not,
        "Reciprocal" => U::Reciprocal,
        "Relu" => U::Relu,
        "Round" => U::Round,
        "Sigmoid" => U::Sigmoid,
        "Sign" => U::Sign,
        "Sin" => U::Sin,
        "Sinh" => U::Sinh,
        "Sqrt" => U::Sqrt,
        "Tan" => U::Tan,
        "Tanh" => U::Tanh,
        other => return Err(format!("internal: `{other}` is not a unary op")),
    };
    n.ignore(&["consumed_inputs"]);
    let x = n.input(0)?;
    Ok(vec![un(cx, kind, x)?])
}

pub(crate) fn binary(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let kind = match n.proto.op_type.as_str() {
        "Add" => B::Add,
        "Sub" => B::Sub,
        "Mul" => B::Mul,
        "Div" => B::Div,
        "Pow" => B::Pow,
        "And" => B::And,
        "Or" => B::Or,
        "Xor" => B::Xor,
        "Equal" => B::Eq,
        "Less" => B::Lt,
        "LessOrEqual" => B::Le,
        "Greater" => B::Gt,
        "GreaterOrEqual" => B::Ge,
        "BitwiseAnd" => B::BitAnd,
        "BitwiseOr" => B::BitOr,
        "BitwiseXor" => B::BitXor,
        "BitShift" => match n.string("direction").as_deref() {
            Some("LEFT") => B::Shl,
            Some("RIGHT") => B::Shr,
            Some(other) => return Err(format!("direction `{other}` is not supported (LEFT or RIGHT)")),
            None => return Err("`direction` is required".into()),
        },
        other => return Err(format!("internal: `{other}` is not a binary op")),
    };
    // Opsets before 7 had explicit broadcast attributes; kiln imports 7 and later, where broadcasting is numpy's.
    n.ignore(&["consumed_inputs"]);
    if n.opt_int("broadcast").is_some_and(|b| b != 0) || n.opt_int("axis").is_some() {
        return Err("legacy broadcast/axis attributes are not supported".into());
    }
    let (a, b) = (n.input(0)?, n.input(1)?);
    let b = if kind == B::Pow && b.dtype() != a.dtype() {
        // Pow allows an exponent of another type; the IR wants one dtype.
        cx.op(Op::Cast(Cast { to: a.dtype() }), &[b])?
    } else {
        b.clone()
    };
    if kind == B::Eq
        && let Some(known) = dim_equality(a, &b)
    {
        // Comparing tracked extents with known values (`shape == -1` in exported expand/reshape arithmetic) is
        // decided here: an extent is never negative, and equal expressions are equal.
        return Ok(vec![cx.constant(known)?]);
    }
    let mut out = bin(cx, kind, a, &b)?;
    if kind == B::Mul || kind == B::Add || kind == B::Sub {
        // Shape arithmetic on tracked extents (a past length plus a new-token count) stays tracked, as derived
        // dims (`kiln_ir::dim`).
        out.dims = dim_arithmetic(kind, a, &b);
    }
    Ok(vec![out])
}

/// `a == b` element by element when both hold tracked extents (rank ≤ 1) and every comparison is decided: two
/// known integers, two equal expressions, or an extent against a negative integer (never equal).
fn dim_equality(a: &Val, b: &Val) -> Option<kiln_ir::Tensor> {
    let (x, y) = (a.dim_args()?, b.dim_args()?);
    let n = x.len().max(y.len());
    if (x.len() != n && x.len() != 1) || (y.len() != n && y.len() != 1) || a.rank() > 1 || b.rank() > 1 {
        return None;
    }
    let decide = |p: &DimArg, q: &DimArg| match (p, q) {
        (DimArg::Int(i), DimArg::Int(j)) => Some(i == j),
        (DimArg::Sym(s), DimArg::Sym(t)) if s == t => Some(true),
        (DimArg::Sym(_), DimArg::Int(i)) | (DimArg::Int(i), DimArg::Sym(_)) if *i < 0 => Some(false),
        _ => None,
    };
    let values: Option<Vec<bool>> = (0..n).map(|i| decide(&x[i.min(x.len() - 1)], &y[i.min(y.len() - 1)])).collect();
    let shape = if a.rank().max(b.rank()) == 0 { vec![] } else { vec![n] };
    kiln_ir::Tensor::from_vec(shape, values?).ok()
}

/// `kind` applied element by element to the extents `a` and `b` hold (one of them may be a single extent), when
/// both are tracked.
fn dim_arithmetic(kind: B, a: &Val, b: &Val) -> Option<Vec<DimArg>> {
    use kiln_ir::dim::DimExpr;
    let (x, y) = (a.dim_args()?, b.dim_args()?);
    let n = x.len().max(y.len());
    if (x.len() != n && x.len() != 1) || (y.len() != n && y.len() != 1) || a.rank() > 1 || b.rank() > 1 {
        return None;
    }
    let expr = |d: &DimArg| match d {
        DimArg::Int(v) => Some(DimExpr::constant(*v)),
        DimArg::Sym(s) => DimExpr::parse(s),
    };
    (0..n)
        .map(|i| {
            let (p, q) = (expr(&x[i.min(x.len() - 1)])?, expr(&y[i.min(y.len() - 1)])?);
            if kind == B::Mul && p.term_count() * q.term_count() > 4096 {
                return None;
            }
            let r = match kind {
                B::Add => p.add(&q),
                B::Sub => p.add(&q.scale(-1)),
                _ => p.mul(&q),
            };
            // Arithmetic that outgrows what a dim may be is not tracked (the value is still computed).
            if !r.within_limits() {
                return None;
            }
            Some(match r.as_constant() {
                Some(v) => DimArg::Int(v),
                None => DimArg::Sym(r.to_string()),
            })
        })
        .collect()
}

pub(crate) fn modulo(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    // fmod=0 is the sign-of-divisor remainder (Python's `%`), fmod=1 C's `fmod`; the IR has both for every
    // numeric dtype, so float inputs with fmod=0 (which the ONNX spec discourages) get Python's semantics too.
    let fmod = n.int("fmod", 0);
    let (a, b) = (n.input(0)?, n.input(1)?);
    Ok(vec![bin(cx, if fmod == 0 { B::Mod } else { B::Rem }, a, b)?])
}

pub(crate) fn identity(_cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    Ok(vec![n.input(0)?.clone()])
}

pub(crate) fn dropout(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    n.ignore(&["seed", "is_test"]);
    let x = n.input(0)?;
    // Before opset 12 the ratio is an attribute (and training is off); from 12 both are inputs.
    let ratio = if n.opset < 12 {
        n.float("ratio", 0.5) as f64
    } else {
        match n.opt_input(1) {
            Some(r) => *r.floats().ok_or("input `ratio` must be known at import time")?.first().ok_or("empty ratio")?,
            None => 0.5,
        }
    };
    let training = match n.opt_input(2) {
        Some(t) => t.ints().ok_or("input `training_mode` must be known at import time")?.iter().any(|&m| m != 0),
        None => false,
    };
    // Without training, or with a zero ratio, nothing is dropped: y = x and the mask is all true.
    if training && ratio != 0.0 {
        return Err(format!("random dropout (training mode with ratio {ratio}) is not supported"));
    }
    let mut outs = vec![x.clone()];
    if n.proto.output.get(1).is_some_and(|o| !o.is_empty()) {
        let t = cx.constant(kiln_ir::Tensor::new(vec![], kiln_ir::Data::Bool(vec![true])).expect("one element"))?;
        let mask = cx.op(Op::Broadcast(kiln_ir::op::Broadcast { shape: x.ty.shape.clone() }), &[&t])?;
        // Before opset 10 the mask has the input's type.
        outs.push(if n.opset < 10 { cx.op(Op::Cast(Cast { to: x.dtype() }), &[&mask])? } else { mask });
    }
    Ok(outs)
}

pub(crate) fn cast(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let to = onnx_dtype(n.opt_int("to").ok_or("the `to` attribute is required")?)?;
    // FLOAT8E8M0's rounding: kiln's cast rounds up, the default.
    if let Some(mode) = n.string("round_mode").filter(|m| m != "up") {
        return Err(format!("round_mode `{mode}` is not supported (kiln rounds up)"));
    }
    cast_saturating(cx, n, n.input(0)?, to)
}

/// A cast honouring `saturate` (which concerns float8 targets only; float4 always saturates).
fn cast_saturating(cx: &mut Ctx<'_>, n: &OnnxNode<'_>, x: &Val, to: DType) -> Result<Vec<Val>, String> {
    if n.int("saturate", 1) == 1 || !to.is_narrow_float() || to == DType::F4E2M1 {
        return cast_to(cx, x, to);
    }
    if x.dtype() == DType::Bool {
        return cast_to(cx, x, to);
    }
    let Some(limit) = kiln_ir::narrow::f8_overflow_threshold(to) else {
        return Err(format!("saturate=0 is not supported for {to}"));
    };
    // kiln's cast saturates; a magnitude past the last value that rounds to a finite one (or ±∞) becomes the
    // type's overflow value instead: NaN (FLOAT8E4M3FN keeps the sign), or ±∞ for FLOAT8E5M2.
    let y = cast_to(cx, x, to)?.remove(0);
    // Compared in f32 (exact for every source but f64 and the widest integers, which cannot straddle a
    // float8 limit by rounding: the limits are small integers).
    let wide = if x.dtype() == DType::F64 { x.clone() } else { cx.op(Op::Cast(Cast { to: DType::F32 }), &[x])? };
    let magnitude = un(cx, U::Abs, &wide)?;
    let limit = scalar_like(cx, &wide, f64::from(limit))?;
    let over = bin(cx, B::Gt, &magnitude, &limit)?;
    let code = |cx: &mut Ctx<'_>, v: f32| {
        let byte = kiln_ir::narrow::encode_f8(to, v, false).expect("a float8 type");
        let data = kiln_ir::Data::from_le_bytes(to, &[byte]).expect("one byte");
        cx.constant(kiln_ir::Tensor::new(vec![], data).expect("a scalar"))
    };
    let (pos, neg) = (code(cx, f32::INFINITY)?, code(cx, f32::NEG_INFINITY)?);
    let zero = scalar_like(cx, &wide, 0.0)?;
    let negative = bin(cx, B::Lt, &wide, &zero)?;
    let overflow = cx.op(Op::Select, &[&negative, &neg, &pos])?;
    Ok(vec![cx.op(Op::Select, &[&over, &overflow, &y])?])
}

fn cast_to(cx: &mut Ctx<'_>, x: &Val, to: DType) -> Result<Vec<Val>, String> {
    if x.dtype() == to {
        return Ok(vec![x.clone()]);
    }
    let mut out = cx.op(Op::Cast(Cast { to }), &[x])?;
    if to.is_int() && x.dtype().is_int() {
        out.dims = x.dims.clone();
    }
    Ok(vec![out])
}

pub(crate) fn cast_like(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let to = n.input(1)?.dtype();
    cast_saturating(cx, n, n.input(0)?, to)
}

pub(crate) fn where_(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (c, a, b) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let mut out = cx.op(Op::Select, &[c, a, b])?;
    // A known condition choosing between tracked extents keeps them tracked.
    if out.rank() <= 1
        && out.dims.is_none()
        && let (Some(cond), Some(x), Some(y)) = (c.konst.as_ref(), a.dim_args(), b.dim_args())
    {
        let pick = |v: &[DimArg], i: usize| v.get(i.min(v.len().saturating_sub(1))).cloned();
        let len = out.ty.shape.as_static().map_or(0, |s| s.iter().product::<usize>());
        let picked: Option<Vec<DimArg>> = (0..len)
            .map(|i| {
                let c = cond.data().get_i64(i.min(cond.len().saturating_sub(1))) != 0;
                if c { pick(&x, i) } else { pick(&y, i) }
            })
            .collect();
        out.dims = picked;
    }
    Ok(vec![out])
}

pub(crate) fn variadic(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let ins = n.all_inputs()?;
    let (first, rest) = ins.split_first().ok_or("needs at least one input")?;
    let kind = match n.proto.op_type.as_str() {
        "Max" => B::Max,
        "Min" => B::Min,
        _ => B::Add,
    };
    let mut acc = (*first).clone();
    for x in rest {
        acc = bin(cx, kind, &acc, x)?;
    }
    if n.proto.op_type == "Mean" {
        if ins.len() > 1 {
            let k = scalar_like(cx, &acc, ins.len() as f64)?;
            acc = bin(cx, B::Div, &acc, &k)?;
        } else {
            // Mean of one input must still broadcast nothing and return it unchanged.
            acc = (*first).clone();
        }
    }
    Ok(vec![acc])
}

pub(crate) fn clip(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let (lo, hi) = if n.opset < 11 {
        let lo = n.float("min", f32::NEG_INFINITY);
        let hi = n.float("max", f32::INFINITY);
        (Some(scalar_like(cx, x, lo as f64)?), Some(scalar_like(cx, x, hi as f64)?))
    } else {
        (n.opt_input(1).cloned(), n.opt_input(2).cloned())
    };
    let mut y = x.clone();
    if let Some(lo) = lo {
        y = bin(cx, B::Max, &y, &lo)?;
    }
    if let Some(hi) = hi {
        y = bin(cx, B::Min, &y, &hi)?;
    }
    Ok(vec![y])
}

pub(crate) fn is_inf(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let (neg, pos) = (n.int("detect_negative", 1) != 0, n.int("detect_positive", 1) != 0);
    let inf = un(cx, U::IsInf, x)?;
    let zero = scalar_like(cx, x, 0.0)?;
    let y = match (neg, pos) {
        (true, true) => inf,
        (false, true) => {
            let p = bin(cx, B::Gt, x, &zero)?;
            bin(cx, B::And, &inf, &p)?
        }
        (true, false) => {
            let p = bin(cx, B::Lt, x, &zero)?;
            bin(cx, B::And, &inf, &p)?
        }
        (false, false) => {
            let f = cx.scalar(DType::Bool, 0.0)?;
            bin(cx, B::And, &inf, &f)?
        }
    };
    Ok(vec![y])
}

pub(crate) fn prelu(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, slope) = (n.input(0)?, n.input(1)?);
    let zero = scalar_like(cx, x, 0.0)?;
    let neg = bin(cx, B::Lt, x, &zero)?;
    let scaled = bin(cx, B::Mul, x, slope)?;
    // select broadcasts all three, so the slope's shape joins the result's as ONNX requires.
    Ok(vec![cx.op(Op::Select, &[&neg, &scaled, x])?])
}

/// Activations that are compositions of IR primitives (or `gelu`).
pub(crate) fn activation(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    if !x.dtype().is_float() {
        return Err(format!("needs a float input, got {}", x.dtype()));
    }
    let c = |cx: &mut Ctx<'_>, v: f64| scalar_like(cx, x, v);
    let y = match n.proto.op_type.as_str() {
        "Celu" => {
            // max(0,x) + min(0, alpha*(exp(x/alpha)-1))
            let alpha = n.float("alpha", 1.0) as f64;
            let a = c(cx, alpha)?;
            let zero = c(cx, 0.0)?;
            let one = c(cx, 1.0)?;
            let pos = bin(cx, B::Max, x, &zero)?;
            let xa = bin(cx, B::Div, x, &a)?;
            let e = un(cx, U::Exp, &xa)?;
            let em1 = bin(cx, B::Sub, &e, &one)?;
            let s = bin(cx, B::Mul, &a, &em1)?;
            let negp = bin(cx, B::Min, &zero, &s)?;
            bin(cx, B::Add, &pos, &negp)?
        }
        "Elu" | "Selu" => {
            let selu = n.proto.op_type == "Selu";
            let alpha = n.float("alpha", if selu { 1.673_263_2 } else { 1.0 }) as f64;
            let gamma = if selu { n.float("gamma", 1.050_701) as f64 } else { 1.0 };
            let zero = c(cx, 0.0)?;
            let one = c(cx, 1.0)?;
            let a = c(cx, alpha)?;
            let e = un(cx, U::Exp, x)?;
            let em1 = bin(cx, B::Sub, &e, &one)?;
            let negv = bin(cx, B::Mul, &a, &em1)?;
            let is_pos = bin(cx, B::Gt, x, &zero)?;
            let y = cx.op(Op::Select, &[&is_pos, x, &negv])?;
            if selu {
                let g = c(cx, gamma)?;
                bin(cx, B::Mul, &g, &y)?
            } else {
                y
            }
        }
        "HardSigmoid" => {
            let alpha = n.float("alpha", 0.2) as f64;
            let beta = n.float("beta", 0.5) as f64;
            hard_sigmoid(cx, x, alpha, beta)?
        }
        "HardSwish" => {
            let h = hard_sigmoid(cx, x, 1.0 / 6.0, 0.5)?;
            bin(cx, B::Mul, x, &h)?
        }
        "LeakyRelu" => {
            let alpha = n.float("alpha", 0.01) as f64;
            let a = c(cx, alpha)?;
            let zero = c(cx, 0.0)?;
            let neg = bin(cx, B::Lt, x, &zero)?;
            let ax = bin(cx, B::Mul, x, &a)?;
            cx.op(Op::Select, &[&neg, &ax, x])?
        }
        "Mish" => {
            let sp = softplus(cx, x)?;
            let t = un(cx, U::Tanh, &sp)?;
            bin(cx, B::Mul, x, &t)?
        }
        "Softplus" => softplus(cx, x)?,
        "Softsign" => {
            let one = c(cx, 1.0)?;
            let a = un(cx, U::Abs, x)?;
            let d = bin(cx, B::Add, &one, &a)?;
            bin(cx, B::Div, x, &d)?
        }
        "ThresholdedRelu" => {
            let alpha = n.float("alpha", 1.0) as f64;
            let a = c(cx, alpha)?;
            let zero = c(cx, 0.0)?;
            let keep = bin(cx, B::Gt, x, &a)?;
            cx.op(Op::Select, &[&keep, x, &zero])?
        }
        "Gelu" => {
            let approximate = match n.string("approximate").as_deref().unwrap_or("none") {
                "none" => GeluApprox::None,
                "tanh" => GeluApprox::Tanh,
                other => return Err(format!("approximate=`{other}` is not supported")),
            };
            cx.op(Op::Gelu(Gelu { approximate }), &[x])?
        }
        other => return Err(format!("internal: `{other}` is not an activation")),
    };
    Ok(vec![y])
}

fn hard_sigmoid(cx: &mut Ctx<'_>, x: &Val, alpha: f64, beta: f64) -> Result<Val, String> {
    let a = scalar_like(cx, x, alpha)?;
    let b = scalar_like(cx, x, beta)?;
    let zero = scalar_like(cx, x, 0.0)?;
    let one = scalar_like(cx, x, 1.0)?;
    let ax = bin(cx, B::Mul, x, &a)?;
    let axb = bin(cx, B::Add, &ax, &b)?;
    let lo = bin(cx, B::Min, &axb, &one)?;
    bin(cx, B::Max, &lo, &zero)
}

/// `log(1 + exp(x))`, computed as `max(x, 0) + log(1 + exp(-|x|))` so large inputs do not overflow.
fn softplus(cx: &mut Ctx<'_>, x: &Val) -> Result<Val, String> {
    let zero = scalar_like(cx, x, 0.0)?;
    let one = scalar_like(cx, x, 1.0)?;
    let pos = bin(cx, B::Max, x, &zero)?;
    let a = un(cx, U::Abs, x)?;
    let na = un(cx, U::Neg, &a)?;
    let e = un(cx, U::Exp, &na)?;
    let ope = bin(cx, B::Add, &one, &e)?;
    let l = un(cx, U::Log, &ope)?;
    bin(cx, B::Add, &pos, &l)
}
