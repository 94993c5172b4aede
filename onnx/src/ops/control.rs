//! Control flow: `If` (a condition known at import inlines its branch; a run-time one becomes an `if` region),
//! `Loop` and `Scan` (a `loop` region whose body gathers each scan input's slice).

use kiln_ir::op::{Gather, If, Iota, Loop};
use kiln_ir::{DType, Dim, Op, Shape, Tensor, TensorType};

use super::{axis, bin, reshape, transpose};
use crate::import::{Ctx, Prelude, Region, Val};
use crate::node::OnnxNode;

/// No prelude, no leading outputs.
fn plain(cx: &mut Ctx<'_>, g: &onnx_protobuf::GraphProto, seed: &[(String, Val)]) -> Result<Region, String> {
    cx.region(g, &[], seed, &mut |_, _| Ok(()), &[])
}

pub(crate) fn if_(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let cond = n.input(0)?;
    let then_g = n.graph("then_branch").ok_or("`then_branch` is required")?;
    let else_g = n.graph("else_branch").ok_or("`else_branch` is required")?;
    if let Some(c) = cond.ints() {
        let branch = if c.first().copied().unwrap_or(0) != 0 { then_g } else { else_g };
        return cx.subgraph(branch);
    }
    // Both branches bind one operand list: the else branch starts from the then branch's captures, and the then
    // branch gets (unused) inputs for those only the else branch reads.
    let then_r = plain(cx, then_g, &[])?;
    let else_r = plain(cx, else_g, &then_r.captures)?;
    let mut then_body = kiln_ir::Builder::from_graph(*then_r.body.0);
    for (i, (_, v)) in else_r.captures.iter().enumerate().skip(then_r.captures.len()) {
        then_body
            .input(&kiln_ir::fusion::FusionBody::param_name(i), v.ty.dtype, v.ty.shape.clone())
            .map_err(|e| e.to_string())?;
    }
    let count = cx.fresh_symbol(n.output_name(0));
    let op = Op::If(If {
        then_branch: kiln_ir::fusion::FusionBody(Box::new(then_body.finish())),
        else_branch: else_r.body,
        count,
    });
    let mut operands = vec![cond];
    operands.extend(else_r.captures.iter().map(|(_, v)| v));
    cx.op_multi(op, &operands)
}

/// A one-element operand as a rank-0 one.
fn scalar_of(cx: &mut Ctx<'_>, v: &Val, what: &str) -> Result<Val, String> {
    if v.ty.shape.num_elements() != Some(1) {
        return Err(format!("{what} must hold one element, got {}", v.ty));
    }
    reshape(cx, v, vec![])
}

/// The body input names of `g` (empty for unnamed), which must number `want`.
fn input_names(g: &onnx_protobuf::GraphProto, want: usize, op: &str) -> Result<Vec<String>, String> {
    if g.input.len() != want {
        return Err(format!("the {op} body declares {} input(s), expected {want}", g.input.len()));
    }
    Ok(g.input.iter().map(|i| i.name.clone()).collect())
}

/// Imports a loop body whose first `carried.len()` outputs after the `cond_outputs` leading ones are loop-carried:
/// a carried value whose extent the body changes gets a symbol of its own on the body input (and the body is
/// imported again) until every carried input types what the body gives back.
fn carried_region<'m>(
    cx: &mut Ctx<'m>,
    g: &onnx_protobuf::GraphProto,
    mut formal: Vec<(String, TensorType)>,
    carried: std::ops::Range<usize>,
    prelude: &mut Prelude<'_, 'm>,
    lead: &[usize],
) -> Result<Region, String> {
    // Carried extents given a symbol of their own: the body may make anything of them.
    let mut relaxed = std::collections::HashSet::new();
    for _ in 0..4 {
        let problems = cx.problems.len();
        let r = cx.region(g, &formal, &[], prelude, lead)?;
        let mut changed = false;
        for (k, i) in carried.clone().enumerate() {
            let (input, output) = (formal[i].1.clone(), r.outputs.get(1 + k).ok_or("the body gives too few outputs")?);
            if input.dtype != output.dtype || input.shape.rank() != output.shape.rank() {
                return Err(format!("loop-carried `{}` is {input} but the body gives {output}", formal[i].0));
            }
            for axis in 0..input.shape.rank() {
                if input.shape.0[axis] != output.shape.0[axis] && relaxed.insert((i, axis)) {
                    let sym = cx.fresh_symbol(&formal[i].0);
                    formal[i].1.shape.0[axis] = Dim::sym(sym);
                    changed = true;
                }
            }
        }
        if !changed {
            return Ok(r);
        }
        // The problems of this attempt are reported by the next.
        cx.problems.truncate(problems);
    }
    Err("the loop-carried extents do not settle".into())
}

pub(crate) fn loop_(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let body = n.graph("body").ok_or("`body` is required")?;
    let max_trip = match n.opt_input(0) {
        Some(m) => {
            let m = scalar_of(cx, m, "M")?;
            if m.dtype() != DType::I64 {
                return Err(format!("M must be int64, got {}", m.dtype()));
            }
            m
        }
        None => cx.constant(Tensor::scalar(i64::MAX))?,
    };
    let cond = match n.opt_input(1) {
        Some(c) => scalar_of(cx, c, "cond")?,
        None => cx.constant(Tensor::scalar(true))?,
    };
    let carried: Vec<Val> = (2..n.proto.input.len()).map(|i| n.input(i).cloned()).collect::<Result<_, _>>()?;
    let names = input_names(body, 2 + carried.len(), "Loop")?;
    let mut formal = vec![
        (names[0].clone(), TensorType::new(DType::I64, Shape(vec![]))),
        (names[1].clone(), TensorType::new(DType::Bool, Shape(vec![]))),
    ];
    formal.extend(carried.iter().zip(&names[2..]).map(|(v, name)| (name.clone(), v.ty.clone())));
    let r = carried_region(cx, body, formal, 2..2 + carried.len(), &mut |_, _| Ok(()), &[])?;
    let count = cx.fresh_symbol(n.output_name(0));
    let op = Op::Loop(Loop { body: r.body, carried: carried.len() as i64, count });
    let mut operands = vec![&max_trip, &cond];
    operands.extend(&carried);
    operands.extend(r.captures.iter().map(|(_, v)| v));
    cx.op_multi(op, &operands)
}

/// `v`'s extent along `axis` as an i64 scalar (a constant when static).
fn extent(cx: &mut Ctx<'_>, v: &Val, axis: usize) -> Result<Val, String> {
    if let Dim::Static(e) = v.ty.shape.0[axis] {
        return cx.constant(Tensor::scalar(e as i64));
    }
    let shape = cx.op(Op::ShapeOf, &[v])?;
    let at = cx.constant(Tensor::scalar(axis as i64))?;
    cx.op(Op::Gather(Gather { axis: 0 }), &[&shape, &at])
}

pub(crate) fn scan(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    if n.opset < 9 {
        return Err("Scan before opset 9 (with a batch axis and sequence_lens) is not supported".into());
    }
    let body = n.graph("body").ok_or("`body` is required")?;
    let inputs: Vec<Val> = (0..n.proto.input.len()).map(|i| n.input(i).cloned()).collect::<Result<_, _>>()?;
    let m = usize::try_from(n.int("num_scan_inputs", -1))
        .ok()
        .filter(|&m| (1..=inputs.len()).contains(&m))
        .ok_or("num_scan_inputs must be between 1 and the number of inputs")?;
    let states = inputs.len() - m;
    let scanned = &inputs[states..];
    let per_input = |name: &str, len: usize| -> Result<Vec<i64>, String> {
        let v = n.ints(name).unwrap_or_else(|| vec![0; len]);
        if v.len() != len { Err(format!("`{name}` has {} entries for {len} value(s)", v.len())) } else { Ok(v) }
    };
    let in_axes: Vec<usize> = (per_input("scan_input_axes", m)?.into_iter().zip(scanned))
        .map(|(a, v)| axis(a, v.rank()))
        .collect::<Result<_, _>>()?;
    let in_reverse = per_input("scan_input_directions", m)?;
    let k = body.output.len().checked_sub(states).ok_or("the Scan body gives fewer outputs than states")?;
    let out_axes = per_input("scan_output_axes", k)?;
    let out_reverse = per_input("scan_output_directions", k)?;
    let names = input_names(body, states + m, "Scan")?;
    let trip = extent(cx, &scanned[0], in_axes[0])?;
    for (v, &a) in scanned.iter().zip(&in_axes).skip(1) {
        if v.ty.shape.0[a] != scanned[0].ty.shape.0[in_axes[0]] {
            return Err(format!("the scan inputs have different lengths ({} and {})", scanned[0].ty, v.ty));
        }
    }
    let mut formal = vec![
        (String::new(), TensorType::new(DType::I64, Shape(vec![]))),
        (String::new(), TensorType::new(DType::Bool, Shape(vec![]))),
    ];
    formal.extend(inputs[..states].iter().zip(&names).map(|(v, name)| (name.clone(), v.ty.clone())));
    // Inside the body: slice `iteration` (or its mirror) of each scan input.
    let mut prelude = |cx: &mut Ctx<'_>, formal: &[Val]| -> Result<(), String> {
        for (j, v) in scanned.iter().enumerate() {
            let inner = cx.capture(v)?;
            let at = if in_reverse[j] != 0 {
                let last = cx.capture(&trip)?;
                let one = cx.constant(Tensor::scalar(1i64))?;
                let last = bin(cx, kiln_ir::op::BinaryOp::Sub, &last, &one)?;
                bin(cx, kiln_ir::op::BinaryOp::Sub, &last, &formal[0])?
            } else {
                formal[0].clone()
            };
            let slice = cx.op(Op::Gather(Gather { axis: in_axes[j] as i64 }), &[&inner, &at])?;
            cx.define(&names[states + j], Some(slice));
        }
        Ok(())
    };
    let r = carried_region(cx, body, formal, 2..2 + states, &mut prelude, &[1])?;
    let count = cx.fresh_symbol(n.output_name(0));
    let op = Op::Loop(Loop { body: r.body, carried: states as i64, count: count.clone() });
    let yes = cx.constant(Tensor::scalar(true))?;
    let mut operands = vec![&trip, &yes];
    operands.extend(&inputs[..states]);
    operands.extend(r.captures.iter().map(|(_, v)| v));
    let mut results = cx.op_multi(op, &operands)?;
    // Scan outputs: stacked along axis 0, last iteration first when reversed, then moved to their axis.
    for j in 0..k {
        let mut y = results[states + j].clone();
        if out_reverse[j] != 0 {
            // Gather at `trip - 1 - t`: the iteration count is known only once the loop has run.
            let t = Iota { dtype: DType::I64, shape: Shape(vec![Dim::sym(&count)]), axis: 0, start: 0.0, step: 1.0 };
            let t = cx.op(Op::Iota(t), &[])?;
            let one = cx.constant(Tensor::scalar(1i64))?;
            let last = bin(cx, kiln_ir::op::BinaryOp::Sub, &trip, &one)?;
            let at = bin(cx, kiln_ir::op::BinaryOp::Sub, &last, &t)?;
            y = cx.op(Op::Gather(Gather { axis: 0 }), &[&y, &at])?;
        }
        let a = axis(out_axes[j], y.rank())?;
        if a != 0 {
            let mut perm: Vec<i64> = (1..y.rank() as i64).collect();
            perm.insert(a, 0);
            y = transpose(cx, &y, perm)?;
        }
        results[states + j] = y;
    }
    Ok(results)
}
