//! `layout`: sinks transposes below elementwise ops so that transpose pairs meet and cancel.
//!
//! Elementwise ops commute with any permutation of the dims: applying `f` to each element and then moving the
//! elements gives what moving them and then applying `f` gives. The pass moves a `transpose` below its sole user
//! when that user is elementwise, so that a later `transpose` meets it; merging the two (`transpose ∘ transpose`
//! → one `transpose`, or nothing) is `canonicalize`'s rule, which this pass does not duplicate, so pipelines run
//! `canonicalize` after it. The rules:
//!
//! | rule | exact because |
//! | --- | --- |
//! | `unary(transpose(x, p))` → `transpose(unary(x), p)` | elementwise `f` commutes with moving elements |
//! | `binary(transpose(x, p), c)`, `binary(c, transpose(x, p))` → `transpose(binary(x, c), p)` where `c` is a rank-0 value | a scalar broadcasts to every element alike, before or after the move |
//! | the same with `c` a `constant` of the result's rank → `transpose(binary(x, c'), p)`, `c' = transpose(c, p⁻¹)` | `c'` is `c` in `x`'s layout, so each element meets the same partner; size-1 dims move with it and broadcast alike |
//! | `cast(transpose(x, p))` → `transpose(cast(x), p)` | a cast is elementwise |
//!
//! A transpose only moves when the elementwise op is its only user and it is not a graph output, so no value is
//! computed twice and the number of transposes never grows. Each move takes a transpose strictly further down a
//! chain of elementwise ops, so the rewrites terminate. A `param` or lower-rank operand stops the move, and
//! transposes are not folded into `matmul` operands (matmul has no transposed-operand form); both are left for
//! later work.

use kiln_ir::infer::infer;
use kiln_ir::interp::eval_op;
use kiln_ir::op::{Constant, Transpose};
use kiln_ir::types::normalize_axis;
use kiln_ir::{Graph, Node, NodeId, Op, Tensor, Value};

use crate::declare_pass;
use crate::pass::{Pass, PassContext, PassError, sweep_until_stable};

declare_pass! {
    /// Sinks transposes below elementwise ops (unary, cast, binary with a scalar) so transpose pairs can cancel.
    #[derive(Clone, Debug, Default)]
    pub struct Layout = "layout";
}

/// Sweeps after which the pass stops even if a transpose could still move (each sweep moves every movable
/// transpose at least one op down, so real graphs stop far earlier).
const MAX_SWEEPS: usize = 64;

impl Pass for Layout {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, _: &PassContext) -> Result<bool, PassError> {
        // A rewrite removes the node and its transpose operand, both visited by then; new nodes may take their ids,
        // so a removed or replaced id is simply skipped until the next sweep.
        sweep_until_stable(g, Self::NAME, MAX_SWEEPS, sink)
    }
}

/// Moves the transpose feeding elementwise node `id` below it; whether it did.
fn sink(g: &mut Graph, id: NodeId) -> bool {
    let node = g.node(id);
    if !node.op.is_elementwise() || node.outputs.len() != 1 {
        return false;
    }
    let Some(slot) = node.inputs.iter().position(|v| is_movable_transpose(g, *v, id)) else { return false };
    let t = node.inputs[slot];
    let tnode = g.node(t.node);
    let Op::Transpose(perm) = tnode.op.clone() else { return false };
    let x = tnode.inputs[0];
    let rank = node.outputs[0].shape.rank();
    let mut inputs = node.inputs.clone();
    inputs[slot] = x;
    // Every other operand must be a scalar, which broadcasts alike whatever the layout, or a full-rank constant,
    // which is moved into `x`'s layout by the inverse permutation.
    let mut relaid: Vec<(usize, Tensor)> = Vec::new();
    for (i, v) in node.inputs.iter().enumerate() {
        if i == slot || g.value_type(*v).is_some_and(|ty| ty.shape.rank() == 0) {
            continue;
        }
        match constant_in_layout(g, *v, &perm.perm, rank) {
            Some(c) => relaid.push((i, c)),
            None => return false,
        }
    }
    let op = node.op.clone();
    let result = node.outputs[0].clone();
    let name = node.name.clone();
    let mut added = Vec::new();
    for (i, c) in relaid {
        let ty = c.tensor_type();
        let op = Op::Constant(Constant { value: c });
        let constant = g.add_node(Node { op, inputs: vec![], outputs: vec![ty], name: None });
        added.push(constant);
        inputs[i] = Value::new(constant, 0);
    }
    let undo = |g: &mut Graph, added: &[NodeId]| {
        for &n in added.iter().rev() {
            g.remove_node(n);
        }
    };
    let types = inputs.iter().map(|v| g.value_type(*v).cloned()).collect::<Option<Vec<_>>>();
    let Some(Ok(inner_types)) = types.map(|types| infer(&op, &types)) else {
        undo(g, &added);
        return false;
    };
    let inner = g.add_node(Node { op, inputs, outputs: inner_types, name });
    let moved = Op::Transpose(perm);
    let types = vec![g.node(inner).outputs[0].clone()];
    // The transpose's type rule must give the elementwise node's declared type back; otherwise undo.
    if infer(&moved, &types).ok().as_deref() != Some(std::slice::from_ref(&result)) {
        added.push(inner);
        undo(g, &added);
        return false;
    }
    let outer = g.add_node(Node { op: moved, inputs: vec![Value::new(inner, 0)], outputs: vec![result], name: None });
    g.replace_uses(Value::new(id, 0), Value::new(outer, 0));
    g.remove_node(id);
    g.remove_node(t.node);
    true
}

/// The `constant` `v` (of rank `rank`) permuted by the inverse of `perm`, i.e. laid out as the transpose's operand.
fn constant_in_layout(g: &Graph, v: Value, perm: &[i64], rank: usize) -> Option<Tensor> {
    let Op::Constant(c) = &g.get(v.node)?.op else { return None };
    if c.value.shape().len() != rank || perm.len() != rank {
        return None;
    }
    let mut inverse = vec![0i64; rank];
    for (i, &p) in perm.iter().enumerate() {
        *inverse.get_mut(normalize_axis(p, rank).ok()?)? = i as i64;
    }
    let mut out = eval_op(&Op::Transpose(Transpose { perm: inverse }), &[&c.value]).ok()?;
    (out.len() == 1).then(|| out.remove(0))
}

/// Whether `v` is the result of a `transpose` whose only use is by `user` (once) and which is no graph output.
fn is_movable_transpose(g: &Graph, v: Value, user: NodeId) -> bool {
    g.get(v.node).is_some_and(|n| matches!(n.op, Op::Transpose(_)))
        && g.uses(v).len() == 1
        && g.users(v.node) == [user]
        && !g.outputs().iter().any(|(_, o)| o.node == v.node)
}
