//! `schedule`: chooses an execution order that keeps the peak of live intermediate bytes low.
//!
//! The graph has no order of its own, so the pass stores one with [`Graph::set_schedule`]; the printer then
//! prints nodes in it and `plan-memory` plans buffers over it. Any topological order computes the same values, so
//! the choice never changes what the graph means, only how much memory is live at once (measured as in
//! [`Lifetimes::peak_bytes`]: every statically sized intermediate from its definition to its last use).
//!
//! Two candidates are compared and the lower peak wins, ties going to the plain topological order (so the printed
//! text only changes when memory does):
//! - the topological order ([`Graph::topo_order`], ties by node id);
//! - a greedy list schedule: among the nodes whose operands are all computed, take the one that frees the most
//!   bytes minus the bytes it allocates (an operand is freed when this node is its last remaining user and it is
//!   not a graph output), ties by node id. Sources (`input`, `param`, `constant`) allocate nothing.
//!
//! The greedy choice is a heuristic (finding the order of least peak is NP-hard); keeping the better of the two
//! candidates means the pass never makes the peak worse than the default order.

use std::collections::{BTreeMap, BTreeSet};

use kiln_ir::memory::{Lifetimes, computed_at_load, produces_intermediates, static_bytes};
use kiln_ir::{Graph, NodeId, Value};

use crate::declare_pass;
use crate::pass::{Pass, PassContext, PassError};

declare_pass! {
    /// Stores a topological order that lowers the peak of live intermediate bytes (greedy list scheduling).
    #[derive(Clone, Debug, Default)]
    pub struct Schedule = "schedule";
}

impl Pass for Schedule {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, _: &PassContext) -> Result<bool, PassError> {
        let topo = g
            .topo_order()
            .map_err(|c| PassError::at(Self::NAME, g.describe(c.0), "the graph has a cycle through this node"))?;
        let greedy = greedy_order(g, &computed_at_load(g, &topo));
        let topo_peak = Lifetimes::of(g, topo.clone()).peak_bytes(g);
        let greedy_peak = Lifetimes::of(g, greedy.clone()).peak_bytes(g);
        let best = if greedy_peak < topo_peak { greedy } else { topo };
        if g.schedule() == Some(best.as_slice()) {
            return Ok(false);
        }
        g.set_schedule(best).unwrap_or_else(|e| panic!("pass `{}` built an invalid order: {e}", Self::NAME));
        Ok(true)
    }
}

/// Bytes of a value if it is a statically sized intermediate (not a source's, nor one of the nodes `at_load`), else
/// 0.
fn bytes(g: &Graph, at_load: &BTreeSet<NodeId>, v: Value) -> i64 {
    if !produces_intermediates(&g.node(v.node).op) || at_load.contains(&v.node) {
        return 0;
    }
    g.value_type(v).and_then(static_bytes).map_or(0, |b| i64::try_from(b).unwrap_or(i64::MAX))
}

/// The greedy list schedule described in the module docs.
fn greedy_order(g: &Graph, at_load: &BTreeSet<NodeId>) -> Vec<NodeId> {
    let outputs: BTreeSet<Value> = g.outputs().iter().map(|(_, v)| *v).collect();
    // Distinct user nodes left to run, per value.
    let mut users_left: BTreeMap<Value, usize> = BTreeMap::new();
    // Distinct producer nodes not yet scheduled, per node.
    let mut waiting: BTreeMap<NodeId, usize> = BTreeMap::new();
    for id in g.node_ids() {
        let node = g.node(id);
        let operands: BTreeSet<Value> = node.inputs.iter().copied().filter(|v| g.contains(v.node)).collect();
        for v in &operands {
            *users_left.entry(*v).or_default() += 1;
        }
        let producers: BTreeSet<NodeId> = operands.iter().map(|v| v.node).collect();
        waiting.insert(id, producers.len());
    }
    let mut ready: BTreeSet<NodeId> = waiting.iter().filter(|&(_, &n)| n == 0).map(|(&id, _)| id).collect();
    let mut order = Vec::with_capacity(waiting.len());
    let score = |id: NodeId, users_left: &BTreeMap<Value, usize>| -> i64 {
        let node = g.node(id);
        let operands: BTreeSet<Value> = node.inputs.iter().copied().collect();
        let freed: i64 = operands
            .iter()
            .filter(|v| users_left.get(v) == Some(&1) && !outputs.contains(v))
            .map(|&v| bytes(g, at_load, v))
            .sum();
        let allocated: i64 = (0..node.outputs.len()).map(|k| bytes(g, at_load, Value::new(id, k as u32))).sum();
        freed.saturating_sub(allocated)
    };
    while !ready.is_empty() {
        // Highest score; `max_by_key` keeps the last maximum, so iterate in reverse to prefer the lowest id.
        let Some(&id) = ready.iter().rev().max_by_key(|&&id| score(id, &users_left)) else { break };
        ready.remove(&id);
        order.push(id);
        let operands: BTreeSet<Value> = g.node(id).inputs.iter().copied().collect();
        for v in operands {
            if let Some(n) = users_left.get_mut(&v) {
                *n -= 1;
            }
        }
        for user in g.users(id) {
            if let Some(n) = waiting.get_mut(&user) {
                *n -= 1;
                if *n == 0 {
                    ready.insert(user);
                }
            }
        }
    }
    order
}
