//! `dce`: dead code elimination.
//!
//! A node is live when one of its results is a graph output or an operand of a live node; everything else is
//! removed, except `input` nodes, which are the graph's interface and stay even when unused (callers bind inputs
//! by name). A removed `param` also drops its bytes from the graph's weight store, so folding and dead code do
//! not leave orphaned weights in the artifact. Ops have no side effects, so removal never changes an output; a
//! dead node that would have failed at run time (an integer division by zero) no longer does, as in any compiler.

use std::collections::BTreeSet;

use kiln_ir::{Graph, NodeId, Op};

use crate::declare_pass;
use crate::pass::{Pass, PassContext, PassError};

declare_pass! {
    /// Removes nodes whose results reach no graph output (`input` nodes always stay).
    #[derive(Clone, Debug, Default)]
    pub struct Dce = "dce";
}

impl Pass for Dce {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, _: &PassContext) -> Result<bool, PassError> {
        Ok(remove_dead(g))
    }
}

/// Removes every node no output depends on (keeping `input` nodes); says whether any was removed. Other passes
/// call this to clean up after themselves.
pub fn remove_dead(g: &mut Graph) -> bool {
    let mut live: BTreeSet<NodeId> = BTreeSet::new();
    let mut work: Vec<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    while let Some(id) = work.pop() {
        if !g.contains(id) || !live.insert(id) {
            continue;
        }
        work.extend(g.node(id).inputs.iter().map(|v| v.node));
    }
    let dead: Vec<NodeId> =
        g.node_ids().filter(|id| !live.contains(id) && !matches!(g.node(*id).op, Op::Input(_))).collect();
    for &id in &dead {
        if let Some(node) = g.remove_node(id)
            && let Op::Parameter(p) = node.op
        {
            g.weights.remove(&p.name);
        }
    }
    !dead.is_empty()
}
