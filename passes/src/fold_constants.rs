//! `fold-constants`: evaluates nodes whose operands are all known at compile time.
//!
//! Known values are `constant` nodes and `iota` nodes (nullary sources with a static shape), and the results of
//! nodes folded earlier in the same run, so a whole constant chain folds at once. Each foldable node is
//! evaluated with the reference interpreter's [`eval_op`], so folding means exactly what running means. Nodes are
//! left alone when:
//! - an operand is an `input`, or a `param`: weights can be swapped at run time, so nothing is folded into them
//!   (this includes weights an earlier fold created, which keeps a second run from growing them further);
//! - any result has more than `max-elements` elements (default 65536), so folding never bloats the artifact
//!   (`broadcast` of a scalar to a large shape stays a `broadcast`);
//! - evaluation fails (an integer division by zero stays in the graph and fails at run time, where it belongs),
//!   or gives a type other than the node's declared type (symbolic shapes in attributes).
//!
//! A folded result still used by an unfolded node or a graph output becomes a new `constant` node (keeping the
//! folded node's debug name), or, above `kiln_ir::builder::INLINE_CONSTANT_LIMIT` elements, a weight named
//! `const.N` in `graph.weights` with a `param` node referring to it, as `Builder::constant` does. Folded nodes
//! left without users are removed; `constant` and `iota` sources are left to `dce`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use kiln_ir::builder::INLINE_CONSTANT_LIMIT;
use kiln_ir::interp::eval_op;
use kiln_ir::op::{Constant, Parameter};
use kiln_ir::{Graph, Node, NodeId, Op, Tensor, Value};

use crate::declare_pass;
use crate::pass::{FromOptions, OptionDoc, OptionError, Pass, PassContext, PassError, PassOptions, topo_order};

/// The default of `max-elements`.
pub const DEFAULT_MAX_ELEMENTS: usize = 65536;

declare_pass! {
    /// Evaluates nodes whose operands are all constants (or iota) and replaces them by constants.
    #[derive(Clone, Debug)]
    pub struct FoldConstants = "fold-constants" {
        /// Results with more elements than this are not folded.
        pub max_elements: usize,
    }
}

impl Default for FoldConstants {
    fn default() -> FoldConstants {
        FoldConstants { max_elements: DEFAULT_MAX_ELEMENTS }
    }
}

impl FromOptions for FoldConstants {
    const OPTIONS: &'static [OptionDoc] = &[OptionDoc {
        name: "max-elements",
        value: "N",
        summary: "results with more than N elements are not folded (default 65536)",
    }];

    fn from_options(options: &mut PassOptions<'_>) -> Result<FoldConstants, OptionError> {
        Ok(FoldConstants { max_elements: options.take("max-elements")?.unwrap_or(DEFAULT_MAX_ELEMENTS) })
    }
}

impl Pass for FoldConstants {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, _: &PassContext) -> Result<bool, PassError> {
        let order = topo_order(g, Self::NAME)?;
        // Values computed in this run; `constant` operands are read from the graph without copying.
        let mut known: HashMap<Value, Arc<Tensor>> = HashMap::new();
        // Nodes this run evaluated (not the constant and iota sources, which are already as small as they get).
        let mut folded: Vec<NodeId> = Vec::new();
        for &id in &order {
            let node = g.node(id);
            let small = |n: u64| n <= self.max_elements as u64;
            match &node.op {
                Op::Input(_) | Op::Parameter(_) | Op::Constant(_) => continue,
                Op::Iota(i) if !i.shape.num_elements().is_some_and(small) => continue,
                _ => {}
            }
            if !node.outputs.iter().all(|t| t.shape.num_elements().is_some_and(small)) {
                continue;
            }
            let value_of = |v: &Value| match g.get(v.node).map(|n| &n.op) {
                Some(Op::Constant(c)) if v.index == 0 => Some(&c.value),
                _ => known.get(v).map(|t| t.as_ref()),
            };
            let Some(refs) = node.inputs.iter().map(value_of).collect::<Option<Vec<&Tensor>>>() else { continue };
            let Ok(results) = eval_op(&node.op, &refs) else { continue };
            if results.len() != node.outputs.len()
                || results.iter().zip(&node.outputs).any(|(r, t)| &r.tensor_type() != t)
            {
                continue;
            }
            for (i, r) in results.into_iter().enumerate() {
                known.insert(Value::new(id, i as u32), Arc::new(r));
            }
            if !matches!(node.op, Op::Iota(_)) {
                folded.push(id);
            }
        }
        if folded.is_empty() {
            return Ok(false);
        }

        let folded_set: BTreeSet<NodeId> = folded.iter().copied().collect();
        let mut changed = false;
        let mut next_weight = 0usize;
        for &id in &folded {
            let n_results = g.node(id).outputs.len() as u32;
            for i in 0..n_results {
                let v = Value::new(id, i);
                let needed = g.outputs().iter().any(|(_, o)| *o == v)
                    || g.uses(v).iter().any(|(user, _)| !folded_set.contains(user));
                if !needed {
                    continue;
                }
                let value = Arc::clone(&known[&v]);
                let name = g.node(id).name.clone();
                let replacement = materialize(g, value, name, &mut next_weight);
                g.replace_uses(v, replacement);
                changed = true;
            }
        }
        // Folded nodes nobody uses any more, consumers first so their producers free up in the same sweep.
        for &id in folded.iter().rev() {
            let is_output = g.outputs().iter().any(|(_, o)| o.node == id);
            if !is_output && g.users(id).is_empty() {
                g.remove_node(id);
                changed = true;
            }
        }
        Ok(changed)
    }
}

/// A node holding `value`: an inline constant when small, otherwise a `param` over a new `const.N` weight.
fn materialize(g: &mut Graph, value: Arc<Tensor>, name: Option<String>, next_weight: &mut usize) -> Value {
    let ty = value.tensor_type();
    if value.len() <= INLINE_CONSTANT_LIMIT {
        let op = Op::Constant(Constant { value: Arc::unwrap_or_clone(value) });
        return Value::new(g.add_node(Node { op, inputs: vec![], outputs: vec![ty], name }), 0);
    }
    let taken: BTreeSet<String> = g
        .params()
        .filter_map(|id| match &g.node(id).op {
            Op::Parameter(p) => Some(p.name.clone()),
            _ => None,
        })
        .collect();
    let weight = loop {
        let n = format!("const.{next_weight}");
        *next_weight += 1;
        if g.weights.get(&n).is_none() && !taken.contains(&n) {
            break n;
        }
    };
    g.weights.insert(weight.clone(), value);
    let op = Op::Parameter(Parameter { name: weight });
    Value::new(g.add_node(Node { op, inputs: vec![], outputs: vec![ty], name }), 0)
}
