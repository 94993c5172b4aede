//! Building one node's replacement: typed nodes added one at a time (each result type inferred from its
//! operands), then either swapped in for the node or, when the rewrite gives up halfway (an operand of an
//! unexpected type, a result type that differs from the node's), removed again so the graph is as it was.
//! `decompose` and `integer-products` build their rewrites with it.

use kiln_ir::infer::infer;
use kiln_ir::op::{BinaryOp, Constant, Reduce, ReduceKind, UnaryOp};
use kiln_ir::tensor::Data;
use kiln_ir::{DType, Graph, Node, NodeId, Op, Tensor, Value};

/// The nodes of a rewrite in progress, named `name` (the replaced node's name, so profiles and errors still
/// point at the model's node).
pub(crate) struct Rewriter<'a> {
    pub(crate) g: &'a mut Graph,
    name: Option<String>,
    added: Vec<NodeId>,
}

impl<'a> Rewriter<'a> {
    /// A rewrite of `id`: the nodes it adds take `id`'s name.
    pub(crate) fn of(g: &'a mut Graph, id: NodeId) -> Rewriter<'a> {
        let name = g.node(id).name.clone();
        Rewriter { g, name, added: Vec::new() }
    }

    /// Adds `op` on `inputs`; `None` when its types do not check.
    pub(crate) fn op(&mut self, op: Op, inputs: &[Value]) -> Option<Value> {
        let types = inputs.iter().map(|&v| self.g.value_type(v).cloned()).collect::<Option<Vec<_>>>()?;
        let outputs = infer(&op, &types).ok()?;
        let id = self.g.add_node(Node { op, inputs: inputs.to_vec(), outputs, name: self.name.clone() });
        self.added.push(id);
        Some(Value::new(id, 0))
    }

    /// A `constant` of `dtype` holding `values` (as integers), shaped `[]` for one value and `[n]` otherwise.
    pub(crate) fn ints(&mut self, dtype: DType, values: &[i64]) -> Option<Value> {
        let shape = if values.len() == 1 { vec![] } else { vec![values.len()] };
        let t = Tensor::new(shape, Data::from_i64_iter(dtype, values.iter().copied())).ok()?;
        self.op(Op::Constant(Constant { value: t }), &[])
    }

    /// A scalar `constant` of `dtype`.
    pub(crate) fn scalar(&mut self, dtype: DType, v: f64) -> Option<Value> {
        let t = Tensor::new(vec![], Data::from_f64_iter(dtype, std::iter::once(v))).ok()?;
        self.op(Op::Constant(Constant { value: t }), &[])
    }

    pub(crate) fn unary(&mut self, kind: UnaryOp, x: Value) -> Option<Value> {
        self.op(Op::Unary(kind), &[x])
    }

    pub(crate) fn binary(&mut self, kind: BinaryOp, a: Value, b: Value) -> Option<Value> {
        self.op(Op::Binary(kind), &[a, b])
    }

    /// `kind` over `axes`, keeping them (as size 1) so the result broadcasts back.
    pub(crate) fn reduce(&mut self, kind: ReduceKind, x: Value, axes: Vec<i64>) -> Option<Value> {
        self.op(Op::Reduce(Reduce { kind, axes, keep_dims: true }), &[x])
    }

    /// Ends the rewrite of `id`: with a `result` of `id`'s first result type, every use of that result reads
    /// `result` and `id` is removed (`true`); otherwise every node the rewrite added is removed again (`false`).
    pub(crate) fn finish(self, id: NodeId, result: Option<Value>) -> bool {
        let ty = self.g.node(id).outputs.first().cloned();
        match result.filter(|&v| ty.is_some() && self.g.value_type(v) == ty.as_ref()) {
            Some(v) => {
                self.g.replace_uses(Value::new(id, 0), v);
                self.g.remove_node(id);
                true
            }
            None => {
                // Nothing in a half-built rewrite is used yet.
                for n in self.added.into_iter().rev() {
                    self.g.remove_node(n);
                }
                false
            }
        }
    }
}
