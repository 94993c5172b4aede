//! `plan-memory`: liveness-based buffer assignment of every intermediate value in one arena.
//!
//! The plan is made over the graph's schedule (set by `schedule`), else its topological order, and stored with
//! [`Graph::set_memory_plan`]; codegen reads it and the `.kir` printer shows it as a trailing comment block. The
//! rules (see [`kiln_ir::memory`] for the liveness definitions, and [`MemoryPlan::check`], which re-verifies
//! every plan in the tests):
//!
//! | rule | why it is exact |
//! | --- | --- |
//! | only results of nodes other than `input`, `param`, `constant` and the nodes computed when the weights are bound ([`kiln_ir::memory::computed_at_load`]: weight transposes, constant broadcasts) are planned | the caller, the weight store and the constant pool own those bytes; prepared weights live as long as the weights |
//! | an elementwise node (unary, binary, cast, select, gelu) writes its result over an operand that dies at that node, is not a graph output, and has the same element count and element size | element `i` of the result reads only element `i` of each operand, so no unread byte is overwritten |
//! | otherwise two values share bytes only if their lifetimes (definition to last use, both included) are disjoint | a value is never overwritten while it may still be read, nor written while its inputs are read |
//! | buffers are placed greedily by size, largest first, each in the smallest gap (best fit) left by the already placed buffers whose lifetimes overlap its own; offsets are multiples of 64 | placement only chooses among legal offsets; the order makes the result deterministic |
//! | values with symbolic dims are listed as `dynamic` and left out of the arena | their size is unknown until run time; planning the rest still saves memory, and pipelines like `O2` keep working on graphs with a symbolic batch |
//!
//! The naive figure is the sum of the sizes of all statically sized intermediates. The pass changes nothing the
//! graph computes; it reports a change only when the stored plan differs from the one it computes.

use std::collections::BTreeMap;

use kiln_ir::memory::{ALIGNMENT, Buffer, Interval, Lifetimes, same_layout, static_bytes};
use kiln_ir::{Graph, MemoryPlan, Value};

use crate::declare_pass;
use crate::pass::{Pass, PassContext, PassError};

declare_pass! {
    /// Assigns every intermediate value an aligned offset in one arena, reusing buffers after their last use.
    #[derive(Clone, Debug, Default)]
    pub struct PlanMemory = "plan-memory";
}

impl Pass for PlanMemory {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, _: &PassContext) -> Result<bool, PassError> {
        let Some(lifetimes) = Lifetimes::of_graph(g) else {
            let at = g.topo_order().err().map_or_else(|| "graph".to_string(), |c| g.describe(c.0));
            return Err(PassError::at(Self::NAME, at, "the graph has a cycle through this node"));
        };
        let plan = plan(g, &lifetimes);
        if g.memory_plan() == Some(&plan) {
            return Ok(false);
        }
        g.set_memory_plan(Some(plan));
        Ok(true)
    }
}

/// Values that share one buffer (a chain of in-place results) and the union of their lifetimes.
struct Group {
    members: Vec<Value>,
    live: Interval,
    size: u64,
}

fn align(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// The plan described in the module docs.
pub fn plan(g: &Graph, lt: &Lifetimes) -> MemoryPlan {
    let end = lt.order.len();
    let mut out = MemoryPlan::default();
    let mut sizes: BTreeMap<Value, u64> = BTreeMap::new();
    for &v in lt.live.keys() {
        match g.value_type(v).and_then(static_bytes) {
            Some(b) => {
                sizes.insert(v, b);
            }
            None => out.dynamic.push(v),
        }
    }
    out.naive_bytes = sizes.values().sum();

    // In-place chains, in execution order so a chain grows from its head.
    let mut groups: Vec<Group> = Vec::new();
    let mut group_of: BTreeMap<Value, usize> = BTreeMap::new();
    for (p, &id) in lt.order.iter().enumerate() {
        let node = g.node(id);
        for k in 0..node.outputs.len() {
            let r = Value::new(id, k as u32);
            let (Some(&size), Some(&live)) = (sizes.get(&r), lt.live.get(&r)) else { continue };
            let host = node
                .op
                .is_elementwise()
                .then(|| {
                    node.inputs.iter().copied().find(|o| {
                        let dies_here = lt.live.get(o).is_some_and(|i| i.last == p && i.last < end);
                        let free = group_of.get(o).is_some_and(|&gi| groups[gi].live.last == p)
                            && !out.in_place.values().any(|taken| taken == o);
                        dies_here
                            && free
                            && sizes.get(o) == Some(&size)
                            && g.value_type(*o).zip(g.value_type(r)).is_some_and(|(a, b)| same_layout(a, b))
                    })
                })
                .flatten();
            match host {
                Some(o) => {
                    let gi = group_of[&o];
                    groups[gi].members.push(r);
                    groups[gi].live.last = live.last;
                    group_of.insert(r, gi);
                    out.in_place.insert(r, o);
                }
                None => {
                    group_of.insert(r, groups.len());
                    groups.push(Group { members: vec![r], live, size });
                }
            }
        }
    }

    // Greedy by size, best fit among the buffers whose lifetimes overlap.
    let mut by_size: Vec<usize> = (0..groups.len()).collect();
    by_size.sort_by_key(|&i| (std::cmp::Reverse(groups[i].size), groups[i].live.def, groups[i].members[0]));
    let mut placed: Vec<(usize, u64)> = Vec::new();
    for i in by_size {
        let need = align(groups[i].size);
        let mut taken: Vec<(u64, u64)> = placed
            .iter()
            .filter(|(j, _)| groups[*j].live.overlaps(&groups[i].live))
            .map(|&(j, off)| (off, off + align(groups[j].size)))
            .filter(|(s, e)| s < e)
            .collect();
        taken.sort_unstable();
        let mut best: Option<(u64, u64)> = None; // (gap, offset)
        let mut cursor = 0;
        for (s, e) in taken {
            if s > cursor {
                let gap = s - cursor;
                if gap >= need && best.is_none_or(|(b, _)| gap < b) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(e);
        }
        let offset = best.map_or(cursor, |(_, off)| off);
        placed.push((i, offset));
        out.arena_bytes = out.arena_bytes.max(offset + need);
        for &v in &groups[i].members {
            out.assignments.insert(v, Buffer { offset, size: sizes[&v] });
        }
    }
    out
}
