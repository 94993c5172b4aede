//! `simplify-shape-arith`: shape computations on statically known shapes become constants.
//!
//! Imported graphs compute shapes at run time (`shape_of` → `gather` → `concat` → …) even when every shape is
//! already known. This pass replaces what the types already say, then folds the integer arithmetic that this
//! enables, so that with static input shapes no shape-arithmetic node survives. The rules:
//!
//! | rule | exact because |
//! | --- | --- |
//! | `shape_of(x)` → `constant` when `x`'s shape is static | the verified type of `x` is its run-time shape |
//! | `gather(shape_of(x), c)` → `constant` when `c` is a constant and every dim it picks is static | picks only dims the type fixes, even when others are symbolic |
//! | an integer-typed node whose operands are all constants and whose result has at most 64 elements → `constant` | evaluated with the interpreter's [`eval_op`], so it means exactly what running means; an evaluation error (division by zero) leaves the node alone |
//! | `reshape(x)` or `broadcast(x)` to `x`'s own type → `x` | moves and copies nothing |
//!
//! The integer fold is deliberately narrow (small integer results only): it is what shape arithmetic looks like,
//! and general folding is `fold-constants`' job, whose limits (params, size) this pass does not second-guess.
//! Integer folds read only `constant` operands, never `param`s. Nodes a rewrite leaves unused are removed;
//! sources are left to `dce`.

use kiln_ir::interp::eval_op;
use kiln_ir::op::Constant;
use kiln_ir::tensor::Data;
use kiln_ir::types::normalize_axis;
use kiln_ir::{DType, Graph, Node, NodeId, Op, Tensor, Value};

use crate::declare_pass;
use crate::pass::{Pass, PassContext, PassError, sweep_until_stable};

declare_pass! {
    /// Replaces `shape_of` of statically shaped values by constants and folds the shape arithmetic it enables.
    #[derive(Clone, Debug, Default)]
    pub struct SimplifyShapeArith = "simplify-shape-arith";
}

/// Integer results up to this many elements count as shape arithmetic (a shape vector of rank ≤ 64).
const MAX_SHAPE_ELEMENTS: u64 = 64;

impl Pass for SimplifyShapeArith {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, _: &PassContext) -> Result<bool, PassError> {
        // One sweep in topological order suffices: each rewrite only makes later nodes' operands more constant.
        // New constant nodes may take removed ids, but every id in the order is visited before it could be reused
        // (removal happens only behind the sweep, on producers of the node being rewritten).
        sweep_until_stable(g, Self::NAME, 1, |g, id| {
            let Some(rewrite) = rewrite(g, id) else { return false };
            let old = Value::new(id, 0);
            let new = match rewrite {
                Rewrite::Forward(v) => v,
                Rewrite::Constant(t) => {
                    let ty = t.tensor_type();
                    let name = g.node(id).name.clone();
                    let op = Op::Constant(Constant { value: t });
                    Value::new(g.add_node(Node { op, inputs: vec![], outputs: vec![ty], name }), 0)
                }
            };
            g.replace_uses(old, new);
            remove_if_unused(g, id);
            true
        })
    }
}

/// What a rule does to a single-result node.
enum Rewrite {
    /// Uses go to this value instead.
    Forward(Value),
    /// The node's result is this constant.
    Constant(Tensor),
}

fn rewrite(g: &Graph, id: NodeId) -> Option<Rewrite> {
    let node = g.node(id);
    let [result] = node.outputs.as_slice() else { return None };
    let operand = |i: usize| node.inputs.get(i).copied();
    match &node.op {
        Op::Input(_) | Op::Parameter(_) | Op::Constant(_) | Op::Iota(_) => None,
        Op::ShapeOf => {
            let x = g.value_type(operand(0)?)?;
            let dims = x.shape.as_static()?;
            shape_constant(result.dtype, dims.iter().map(|&d| d as i64).collect())
        }
        Op::Reshape(_) | Op::Broadcast(_) => {
            let x = operand(0)?;
            (g.value_type(x)? == result).then_some(Rewrite::Forward(x))
        }
        Op::Gather(gather) if picks_static_dims(g, node.inputs.as_slice(), gather.axis).is_some() => {
            let dims = picks_static_dims(g, node.inputs.as_slice(), gather.axis)?;
            let shape = result.shape.as_static()?;
            let t = Tensor::new(shape, Data::from_i64_iter(result.dtype, dims.into_iter())).ok()?;
            (t.tensor_type() == *result).then_some(Rewrite::Constant(t))
        }
        _ => {
            if !result.dtype.is_int() || result.shape.num_elements().is_none_or(|n| n > MAX_SHAPE_ELEMENTS) {
                return None;
            }
            let values = node
                .inputs
                .iter()
                .map(|v| match g.get(v.node).map(|n| &n.op) {
                    Some(Op::Constant(c)) if v.index == 0 => Some(&c.value),
                    _ => None,
                })
                .collect::<Option<Vec<&Tensor>>>()?;
            let [t] = <[Tensor; 1]>::try_from(eval_op(&node.op, &values).ok()?).ok()?;
            (t.tensor_type() == *result).then_some(Rewrite::Constant(t))
        }
    }
}

/// For `gather(shape_of(x), c)` on axis 0 with constant indices that all pick static dims of `x`: those dims.
fn picks_static_dims(g: &Graph, inputs: &[Value], axis: i64) -> Option<Vec<i64>> {
    let [data, indices] = inputs else { return None };
    let producer = g.get(data.node)?;
    let Op::ShapeOf = producer.op else { return None };
    if normalize_axis(axis, 1).ok()? != 0 {
        return None;
    }
    let x = g.value_type(*producer.inputs.first()?)?;
    let Some(Op::Constant(c)) = g.get(indices.node).map(|n| &n.op) else { return None };
    let rank = x.shape.rank() as i64;
    c.value
        .to_i64_vec()
        .into_iter()
        .map(|i| {
            let i = if i < 0 { i + rank } else { i };
            let dim = x.shape.dims().get(usize::try_from(i).ok()?)?;
            dim.as_static().and_then(|d| i64::try_from(d).ok())
        })
        .collect()
}

/// A rank-1 integer constant of `dtype` holding `values`.
fn shape_constant(dtype: DType, values: Vec<i64>) -> Option<Rewrite> {
    if !dtype.is_int() {
        return None;
    }
    let n = values.len();
    Tensor::new(vec![n], Data::from_i64_iter(dtype, values.into_iter())).ok().map(Rewrite::Constant)
}

/// Removes a computed node nobody uses, then producers this leaves unused; sources are left for `dce`.
fn remove_if_unused(g: &mut Graph, id: NodeId) {
    let mut work = vec![id];
    while let Some(id) = work.pop() {
        let computed = g.get(id).is_some_and(|n| !n.op.is_source());
        if computed
            && g.users(id).is_empty()
            && !g.outputs().iter().any(|(_, v)| v.node == id)
            && let Some(node) = g.remove_node(id)
        {
            work.extend(node.inputs.iter().map(|v| v.node));
        }
    }
}
