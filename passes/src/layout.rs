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
//! | `cast(transpose(x, p))` → `transpose(cast(x), p)` | a cast is elementwise |
//!
//! A transpose only moves when the elementwise op is its only user and it is not a graph output, so no value is
//! computed twice and the number of transposes never grows. Each move takes a transpose strictly further down a
//! chain of elementwise ops, so the rewrites terminate. A non-scalar constant operand is not transposed into
//! place, and transposes are not folded into `matmul` operands (matmul has no transposed-operand form); both are
//! left for later work.

use kiln_ir::infer::infer;
use kiln_ir::{Graph, Node, NodeId, Op, Value};

use crate::declare_pass;
use crate::pass::{FromOptions, OptionDoc, OptionError, Pass, PassContext, PassError, PassOptions};

declare_pass! {
    /// Sinks transposes below elementwise ops (unary, cast, binary with a scalar) so transpose pairs can cancel.
    #[derive(Clone, Debug, Default)]
    pub struct Layout = "layout";
}

impl FromOptions for Layout {
    const OPTIONS: &'static [OptionDoc] = &[];

    fn from_options(_: &mut PassOptions<'_>) -> Result<Layout, OptionError> {
        Ok(Layout)
    }
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
        let mut changed = false;
        for _ in 0..MAX_SWEEPS {
            let order =
                g.topo_order().map_err(|c| PassError::at(Self::NAME, g.describe(c.0), "the graph has a cycle"))?;
            let mut swept = false;
            for id in order {
                // A rewrite removes `id` and its transpose operand, both visited by now; new nodes may take their
                // ids, so a removed or replaced id is simply skipped until the next sweep.
                if g.contains(id) && sink(g, id) {
                    swept = true;
                }
            }
            changed |= swept;
            if !swept {
                break;
            }
        }
        Ok(changed)
    }
}

/// Moves the transpose feeding elementwise node `id` below it; whether it did.
fn sink(g: &mut Graph, id: NodeId) -> bool {
    let node = g.node(id);
    let elementwise = matches!(node.op, Op::Unary(_) | Op::Cast(_) | Op::Binary(_));
    if !elementwise || node.outputs.len() != 1 {
        return false;
    }
    let Some(slot) = node.inputs.iter().position(|v| is_movable_transpose(g, *v, id)) else { return false };
    let t = node.inputs[slot];
    // Every other operand must be a scalar, which broadcasts alike whatever the layout.
    let scalars = node
        .inputs
        .iter()
        .enumerate()
        .all(|(i, v)| i == slot || g.value_type(*v).is_some_and(|ty| ty.shape.rank() == 0));
    if !scalars {
        return false;
    }
    let tnode = g.node(t.node);
    let Op::Transpose(perm) = tnode.op.clone() else { return false };
    let x = tnode.inputs[0];
    let mut inputs = node.inputs.clone();
    inputs[slot] = x;
    let op = node.op.clone();
    let result = node.outputs[0].clone();
    let name = node.name.clone();
    let Some(types) = inputs.iter().map(|v| g.value_type(*v).cloned()).collect::<Option<Vec<_>>>() else {
        return false;
    };
    let Ok(inner_types) = infer(&op, &types) else { return false };
    let inner = g.add_node(Node { op, inputs, outputs: inner_types, name });
    let moved = Op::Transpose(perm);
    let types = vec![g.node(inner).outputs[0].clone()];
    // The transpose's type rule must give the elementwise node's declared type back; otherwise undo.
    if infer(&moved, &types).ok().as_deref() != Some(std::slice::from_ref(&result)) {
        g.remove_node(inner);
        return false;
    }
    let outer = g.add_node(Node { op: moved, inputs: vec![Value::new(inner, 0)], outputs: vec![result], name: None });
    g.replace_uses(Value::new(id, 0), Value::new(outer, 0));
    g.remove_node(id);
    g.remove_node(t.node);
    true
}

/// Whether `v` is the result of a `transpose` whose only use is by `user` (once) and which is no graph output.
fn is_movable_transpose(g: &Graph, v: Value, user: NodeId) -> bool {
    g.get(v.node).is_some_and(|n| matches!(n.op, Op::Transpose(_)))
        && g.uses(v).len() == 1
        && g.users(v.node) == [user]
        && !g.outputs().iter().any(|(_, o)| o.node == v.node)
}
