//! `cse`: common subexpression elimination.
//!
//! Nodes are visited in the graph's topological order (ties broken by node id, so the result is deterministic);
//! a node whose op (attributes included), operands and result types equal those of an earlier surviving node is
//! replaced by it: its uses, graph outputs included, move to the earlier node's results and it is removed. The
//! earlier node keeps its debug name. Operands are compared after earlier merges, so whole duplicated chains fold
//! in one run. `input` and `param` nodes are never merged: they are the graph's interface and its swappable
//! weights, each with its own name. Ops are compared with `Op`'s `==`, under which a constant holding NaN
//! equals nothing, so such constants are conservatively kept apart.

use std::collections::HashMap;

use kiln_ir::{Graph, NodeId, Op, Value};

use crate::declare_pass;
use crate::pass::{Pass, PassContext, PassError, topo_order};

declare_pass! {
    /// Merges nodes with the same op, attributes, operands and result types, in topological order.
    #[derive(Clone, Debug, Default)]
    pub struct Cse = "cse";
}

impl Pass for Cse {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, _: &PassContext) -> Result<bool, PassError> {
        let order = topo_order(g, Self::NAME)?;
        // Candidates by a cheap textual key; equality is then checked on the real op, operands and types.
        let mut seen: HashMap<String, Vec<NodeId>> = HashMap::new();
        let mut changed = false;
        for id in order {
            let node = g.node(id);
            if matches!(node.op, Op::Input(_) | Op::Parameter(_)) {
                continue;
            }
            let key = format!("{}{}{:?}{:?}", node.op.mnemonic(), node.op.attrs_text(), node.inputs, node.outputs);
            let same = seen.get(&key).and_then(|ids| {
                ids.iter().copied().find(|&other| {
                    let o = g.node(other);
                    o.op == node.op && o.inputs == node.inputs && o.outputs == node.outputs
                })
            });
            match same {
                Some(keep) => {
                    for i in 0..node.outputs.len() as u32 {
                        g.replace_uses(Value::new(id, i), Value::new(keep, i));
                    }
                    // Nothing uses it now; its id is never looked at again (the order was taken up front and only
                    // surviving nodes are candidates).
                    g.remove_node(id);
                    changed = true;
                }
                None => seen.entry(key).or_default().push(id),
            }
        }
        Ok(changed)
    }
}
