//! Reductions, arg-reductions, TopK, matrix products (MatMul, Gemm, Einsum), CumSum and CumProd.

use kiln_ir::op::{ArgKind, ArgReduce, BinaryOp as B, Iota, Reduce, ReduceKind, TopK, UnaryOp as U};
use kiln_ir::{DType, Dim, Op, Shape};

use super::{axis, bin, const_ints, reshape, scalar_like, static_shape, transpose, un};
use crate::import::{Ctx, DimArg, Val};
use crate::node::OnnxNode;

fn reduce_op(cx: &mut Ctx<'_>, kind: ReduceKind, x: &Val, axes: &[i64], keep: bool) -> Result<Val, String> {
    cx.op(Op::Reduce(Reduce { kind, axes: axes.to_vec(), keep_dims: keep }), &[x])
}

pub(crate) fn reduce(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let op = n.proto.op_type.as_str();
    // ReduceSum moved `axes` to an input in opset 13, the others in 18.
    let axes_as_input = if op == "ReduceSum" { n.opset >= 13 } else { n.opset >= 18 };
    let axes = if axes_as_input { const_ints(n, 1, "axes")? } else { n.ints("axes") };
    let keep = n.int("keepdims", 1) != 0;
    let noop = n.int("noop_with_empty_axes", 0) != 0;
    let axes = match axes {
        Some(a) if !a.is_empty() => a,
        _ if noop => return Ok(vec![x.clone()]),
        _ => (0..x.rank() as i64).collect(),
    };
    let y = match op {
        "ReduceSum" => reduce_op(cx, ReduceKind::Sum, x, &axes, keep)?,
        "ReduceMean" => reduce_op(cx, ReduceKind::Mean, x, &axes, keep)?,
        "ReduceMax" => reduce_op(cx, ReduceKind::Max, x, &axes, keep)?,
        "ReduceMin" => reduce_op(cx, ReduceKind::Min, x, &axes, keep)?,
        "ReduceProd" => reduce_op(cx, ReduceKind::Prod, x, &axes, keep)?,
        "ReduceL1" => {
            let a = un(cx, U::Abs, x)?;
            reduce_op(cx, ReduceKind::Sum, &a, &axes, keep)?
        }
        "ReduceL2" | "ReduceSumSquare" => {
            let sq = bin(cx, B::Mul, x, x)?;
            let s = reduce_op(cx, ReduceKind::Sum, &sq, &axes, keep)?;
            if op == "ReduceL2" {
                if !x.dtype().is_float() {
                    return Err("ReduceL2 of integers is not supported".into());
                }
                un(cx, U::Sqrt, &s)?
            } else {
                s
            }
        }
        "ReduceLogSumExp" => {
            let e = un(cx, U::Exp, x)?;
            let s = reduce_op(cx, ReduceKind::Sum, &e, &axes, keep)?;
            un(cx, U::Log, &s)?
        }
        other => return Err(format!("internal: `{other}` is not a reduction")),
    };
    Ok(vec![y])
}

pub(crate) fn arg_reduce(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let kind = if n.proto.op_type == "ArgMax" { ArgKind::Max } else { ArgKind::Min };
    let attrs = ArgReduce {
        kind,
        axis: n.int("axis", 0),
        keep_dims: n.int("keepdims", 1) != 0,
        select_last_index: n.int("select_last_index", 0) != 0,
    };
    Ok(vec![cx.op(Op::ArgReduce(attrs), &[n.input(0)?])?])
}

pub(crate) fn top_k(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let static_k = |k: i64| u64::try_from(k).map(Dim::Static).map_err(|_| format!("k={k} is negative"));
    let top_k = |k: Dim| TopK {
        axis: n.int("axis", -1),
        k,
        largest: n.int("largest", 1) != 0,
        sorted: n.int("sorted", 1) != 0,
    };
    // `k` is an attribute before opset 10 and a one-element input from then on: known at import time (a
    // constant, or a graph input's symbolic dim), or read when the model runs.
    if n.opset < 10 {
        let k = static_k(n.opt_int("k").ok_or("`k` is required")?)?;
        return cx.op_multi(Op::TopK(top_k(k)), &[n.input(0)?]);
    }
    let k = n.input(1)?;
    match k.dim_args().as_deref() {
        Some([DimArg::Int(k)]) => cx.op_multi(Op::TopK(top_k(static_k(*k)?)), &[n.input(0)?]),
        Some([DimArg::Sym(s)]) if kiln_ir::dim::is_identifier(s) => {
            cx.op_multi(Op::TopK(top_k(Dim::sym(s.clone()))), &[n.input(0)?])
        }
        Some(args) if args.len() != 1 => Err(format!("`k` must be a one-element tensor, got {} elements", args.len())),
        _ => {
            if k.ty.dtype != DType::I64 || k.ty.shape.num_elements() != Some(1) {
                return Err(format!("`k` must be one int64 element, got {}", k.ty));
            }
            let count = cx.fresh_symbol(n.output_name(0));
            cx.op_multi(Op::TopK(top_k(Dim::Sym(count))), &[n.input(0)?, k])
        }
    }
}

pub(crate) fn matmul(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    Ok(vec![cx.op(Op::MatMul, &[n.input(0)?, n.input(1)?])?])
}

pub(crate) fn gemm(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (a, b) = (n.input(0)?, n.input(1)?);
    let (alpha, beta) = (n.float("alpha", 1.0) as f64, n.float("beta", 1.0) as f64);
    n.ignore(&["broadcast"]);
    let a = if n.int("transA", 0) != 0 { transpose(cx, a, vec![1, 0])? } else { a.clone() };
    let b = if n.int("transB", 0) != 0 { transpose(cx, b, vec![1, 0])? } else { b.clone() };
    let mut y = cx.op(Op::MatMul, &[&a, &b])?;
    if alpha != 1.0 {
        let k = scalar_like(cx, &y, alpha)?;
        y = bin(cx, B::Mul, &y, &k)?;
    }
    if let Some(c) = n.opt_input(2) {
        let c = if beta != 1.0 {
            let k = scalar_like(cx, c, beta)?;
            bin(cx, B::Mul, c, &k)?
        } else {
            c.clone()
        };
        y = bin(cx, B::Add, &y, &c)?;
    }
    Ok(vec![y])
}

pub(crate) fn cumsum(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let a = const_ints(n, 1, "axis")?.and_then(|v| v.first().copied()).ok_or("`axis` is required")?;
    let exclusive = n.int("exclusive", 0) != 0;
    let reverse = n.int("reverse", 0) != 0;
    let d = static_shape(x, "CumSum")?;
    let rank = d.len();
    let a = axis(a, rank)?;
    let len = *d.get(a).ok_or("needs an input of rank ≥ 1")? as u64;
    // Move the axis last, multiply by a triangular 0/1 matrix, move it back: out[j] = Σ_{i ⊲ j} x[i].
    let mut perm: Vec<i64> = (0..rank as i64).filter(|&i| i != a as i64).collect();
    perm.push(a as i64);
    let xt = transpose(cx, x, perm.clone())?;
    let row = cx
        .op(Op::Iota(Iota { dtype: DType::I64, shape: Shape::of(&[len, len]), axis: 0, start: 0.0, step: 1.0 }), &[])?;
    let col = cx
        .op(Op::Iota(Iota { dtype: DType::I64, shape: Shape::of(&[len, len]), axis: 1, start: 0.0, step: 1.0 }), &[])?;
    let rel = match (reverse, exclusive) {
        (false, false) => B::Le,
        (false, true) => B::Lt,
        (true, false) => B::Ge,
        (true, true) => B::Gt,
    };
    let mask = bin(cx, rel, &row, &col)?;
    let tri = cx.op(Op::Cast(kiln_ir::op::Cast { to: x.dtype() }), &[&mask])?;
    let y = cx.op(Op::MatMul, &[&xt, &tri])?;
    let mut inverse = vec![0i64; rank];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p as usize] = i as i64;
    }
    Ok(vec![transpose(cx, &y, inverse)?])
}

/// CumProd: with the axis moved last, `out[j] = Π_{i ⊲ j} x[i]`, as a product over a `[…, j, i]` grid holding
/// `x[i]` where `i ⊲ j` and 1 elsewhere (exact for integers, which wrap; floats multiply in index order).
pub(crate) fn cumprod(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let a = const_ints(n, 1, "axis")?.and_then(|v| v.first().copied()).ok_or("`axis` is required")?;
    let exclusive = n.int("exclusive", 0) != 0;
    let reverse = n.int("reverse", 0) != 0;
    if x.dtype() == DType::Bool {
        return Err("CumProd of bool is not supported".into());
    }
    let d = static_shape(x, "CumProd")?;
    let rank = d.len();
    let a = axis(a, rank)?;
    let len = d[a] as u64;
    let mut perm: Vec<i64> = (0..rank as i64).filter(|&i| i != a as i64).collect();
    perm.push(a as i64);
    let xt = transpose(cx, x, perm.clone())?;
    // [..., 1, i] broadcast to [..., j, i].
    let mut dims: Vec<u64> = perm.iter().map(|&p| d[p as usize] as u64).collect();
    dims.insert(rank - 1, 1);
    let row = reshape(cx, &xt, dims.iter().map(|&v| Dim::Static(v)).collect())?;
    dims[rank - 1] = len;
    let grid = cx.op(Op::Broadcast(kiln_ir::op::Broadcast { shape: Shape::of(&dims) }), &[&row])?;
    let iota =
        |axis: i64| Op::Iota(Iota { dtype: DType::I64, shape: Shape::of(&[len, len]), axis, start: 0.0, step: 1.0 });
    let j = cx.op(iota(0), &[])?;
    let i = cx.op(iota(1), &[])?;
    let rel = match (reverse, exclusive) {
        (false, false) => B::Le,
        (false, true) => B::Lt,
        (true, false) => B::Ge,
        (true, true) => B::Gt,
    };
    let mask = bin(cx, rel, &i, &j)?;
    let one = scalar_like(cx, x, 1.0)?;
    let picked = cx.op(Op::Select, &[&mask, &grid, &one])?;
    let y = reduce_op(cx, ReduceKind::Prod, &picked, &[-1], false)?;
    let mut inverse = vec![0i64; rank];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p as usize] = i as i64;
    }
    Ok(vec![transpose(cx, &y, inverse)?])
}

/// Einsum with one operand (permutation and sums) or two (any contraction: batch, free and summed indices).
pub(crate) fn einsum(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let eq: String =
        n.string("equation").ok_or("`equation` is required")?.chars().filter(|c| !c.is_whitespace()).collect();
    if eq.contains("...") {
        return Err("ellipsis in the equation is not supported".into());
    }
    let (lhs, out) = match eq.split_once("->") {
        Some((l, o)) => (l.to_string(), o.chars().collect::<Vec<char>>()),
        // Implicit output: the indices that appear exactly once, in alphabetical order.
        None => {
            let mut once: Vec<char> = eq.chars().filter(|c| c.is_alphabetic() && eq.matches(*c).count() == 1).collect();
            once.sort_unstable();
            (eq.clone(), once)
        }
    };
    let terms: Vec<Vec<char>> = lhs.split(',').map(|t| t.chars().collect()).collect();
    let ins = n.all_inputs()?;
    if terms.len() != ins.len() {
        return Err(format!("the equation names {} operands, the node has {}", terms.len(), ins.len()));
    }
    for (t, v) in terms.iter().zip(&ins) {
        if t.len() != v.rank() {
            return Err(format!(
                "term `{}` does not match an operand of rank {}",
                t.iter().collect::<String>(),
                v.rank()
            ));
        }
        if (1..t.len()).any(|i| t[..i].contains(&t[i])) {
            return Err("repeated indices within a term (diagonals) are not supported".into());
        }
    }
    match ins.len() {
        1 => {
            let t = &terms[0];
            let summed: Vec<i64> = (0..t.len()).filter(|&i| !out.contains(&t[i])).map(|i| i as i64).collect();
            let kept: Vec<char> = t.iter().copied().filter(|c| out.contains(c)).collect();
            let y = if summed.is_empty() {
                ins[0].clone()
            } else {
                cx.op(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: summed, keep_dims: false }), &[ins[0]])?
            };
            let perm = out
                .iter()
                .map(|c| {
                    kept.iter()
                        .position(|k| k == c)
                        .map(|p| p as i64)
                        .ok_or(format!("output index `{c}` is not in the input"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(vec![transpose(cx, &y, perm)?])
        }
        2 => einsum2(cx, &terms[0], &terms[1], &out, ins[0], ins[1]).map(|v| vec![v]),
        k => Err(format!("einsum with {k} operands is not supported")),
    }
}

fn einsum2(cx: &mut Ctx<'_>, ta: &[char], tb: &[char], out: &[char], a: &Val, b: &Val) -> Result<Val, String> {
    let dim = |t: &[char], v: &Val, c: char| t.iter().position(|&x| x == c).map(|p| v.ty.shape.0[p].clone());
    let batch: Vec<char> = ta.iter().copied().filter(|c| tb.contains(c) && out.contains(c)).collect();
    let contract: Vec<char> = ta.iter().copied().filter(|c| tb.contains(c) && !out.contains(c)).collect();
    let free_a: Vec<char> = ta.iter().copied().filter(|c| !tb.contains(c)).collect();
    let free_b: Vec<char> = tb.iter().copied().filter(|c| !ta.contains(c)).collect();
    if free_a.iter().chain(&free_b).any(|c| !out.contains(c)) {
        return Err("indices summed within one operand are not supported".into());
    }
    let pos = |t: &[char], cs: &[char]| {
        cs.iter().map(|c| t.iter().position(|x| x == c).expect("index in term") as i64).collect::<Vec<_>>()
    };
    let prod = |t: &[char], v: &Val, cs: &[char]| -> Result<Dim, String> {
        super::dim_product(&cs.iter().map(|&c| dim(t, v, c).expect("index in term")).collect::<Vec<_>>())
            .ok_or("symbolic dims in einsum contractions are not supported".to_string())
    };
    // A → [batch..., free_a, contract], B → [batch..., contract, free_b], then one batched matmul.
    let a_perm = [pos(ta, &batch), pos(ta, &free_a), pos(ta, &contract)].concat();
    let b_perm = [pos(tb, &batch), pos(tb, &contract), pos(tb, &free_b)].concat();
    let at = transpose(cx, a, a_perm)?;
    let bt = transpose(cx, b, b_perm)?;
    let batch_dims: Vec<Dim> = batch.iter().map(|&c| dim(ta, a, c).expect("index in term")).collect();
    let (m, k) = (prod(ta, a, &free_a)?, prod(ta, a, &contract)?);
    let nn = prod(tb, b, &free_b)?;
    let a3 = reshape(cx, &at, [batch_dims.clone(), vec![m, k.clone()]].concat())?;
    let b3 = reshape(cx, &bt, [batch_dims.clone(), vec![k, nn]].concat())?;
    let y = cx.op(Op::MatMul, &[&a3, &b3])?;
    let order: Vec<char> = [batch.clone(), free_a.clone(), free_b.clone()].concat();
    let full: Vec<Dim> =
        order.iter().map(|&c| dim(ta, a, c).or_else(|| dim(tb, b, c)).expect("index in a term")).collect();
    let y = reshape(cx, &y, full)?;
    let perm = out
        .iter()
        .map(|c| {
            order.iter().position(|x| x == c).map(|p| p as i64).ok_or(format!("output index `{c}` is in no operand"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    transpose(cx, &y, perm)
}
