//! The `.kir` printer: a [`Graph`] as canonical text.
//!
//! Output is stable: nodes are printed in the graph's stored schedule when it has one, else in
//! [`Graph::topo_order`] (node-id order for a cyclic graph, which still prints), with the `input` nodes among them permuted into the graph's input order so that order survives a round
//! trip; results are numbered `%0, %1, …` in print order; attributes come from [`Op::print_attrs`] in declaration
//! order, with floats in their shortest round-trip form. For every graph the parser accepts,
//! `print(&parse(&print(g))?) == print(g)`. Weights never appear: a `param` prints its name and type only. An
//! invalid graph still prints without panicking; operands that name no existing result print as
//! `%dangling_n<node>_<result>` and forward references keep their numbers, so the parser rejects the text with a
//! positioned error. Comments are not part of the graph and are not printed, except one generated block: a graph
//! with a [`MemoryPlan`](crate::MemoryPlan) ends with `// memory-plan:` comment lines (arena and naive bytes, then
//! one line per value in print order with its byte range, `in place of` the operand it overwrites, or `dynamic`).
//! The parser skips comments, so the text still round-trips, and the parsed file order is the schedule.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::attr::print_string;
use crate::graph::{Graph, NodeId, Value};
use crate::memory::MemoryPlan;
use crate::op::Op;

/// Prints `g` as `.kir` text.
pub fn print(g: &Graph) -> String {
    let mut out = String::new();
    print_nested(g, 0, &mut out);
    out.push('\n');
    if let Some(plan) = g.memory_plan() {
        let order = print_order(g);
        let numbers = numbering(g, &order);
        let value = |v: &Value| {
            numbers.get(v).map_or_else(|| format!("%dangling_n{}_{}", v.node.0, v.index), |n| format!("%{n}"))
        };
        print_plan(plan, &order, g, &value, &mut out);
    }
    out
}

/// Result numbers in print order: `%0, %1, …`.
fn numbering(g: &Graph, order: &[NodeId]) -> HashMap<Value, usize> {
    let mut numbers: HashMap<Value, usize> = HashMap::new();
    for &id in order {
        for k in 0..g.node(id).outputs.len() {
            let next = numbers.len();
            numbers.insert(Value::new(id, k as u32), next);
        }
    }
    numbers
}

/// Appends `g` as `.kir` text whose statements are indented `indent + 2` spaces and whose closing `}` is indented
/// `indent` spaces, without a final newline: the form of a nested body graph (a `fusion` region) printed inside a
/// node line that starts `indent` spaces in. Numbering restarts at `%0`: a body is a graph of its own.
pub fn print_nested(g: &Graph, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent + 2);
    let order = print_order(g);
    let numbers = numbering(g, &order);
    let value = |v: &Value| match numbers.get(v) {
        Some(n) => format!("%{n}"),
        None => format!("%dangling_n{}_{}", v.node.0, v.index),
    };

    out.push_str("graph ");
    print_string(g.name(), out);
    out.push_str(" {\n");
    for &id in &order {
        let node = g.node(id);
        out.push_str(&pad);
        let results: Vec<String> = (0..node.outputs.len()).map(|k| value(&Value::new(id, k as u32))).collect();
        if !results.is_empty() {
            let _ = write!(out, "{} = ", results.join(", "));
        }
        out.push_str(node.op.mnemonic());
        if !node.inputs.is_empty() {
            let operands: Vec<String> = node.inputs.iter().map(value).collect();
            let _ = write!(out, " {}", operands.join(", "));
        }
        // Printed straight into `out`: a nested body takes its indentation from the line it starts on.
        out.push(' ');
        let before = out.len();
        node.op.print_attrs(out);
        if out.len() == before {
            out.pop();
        }
        if !node.outputs.is_empty() {
            let types: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
            let _ = write!(out, " : {}", types.join(", "));
        }
        if let Some(name) = &node.name {
            out.push_str(" @");
            print_string(name, out);
        }
        out.push('\n');
    }
    for (name, v) in g.outputs() {
        let _ = write!(out, "{pad}output ");
        print_string(name, out);
        let _ = writeln!(out, " = {}", value(v));
    }
    out.push_str(&" ".repeat(indent));
    out.push('}');
}

/// The memory plan as trailing comments, values in print order.
fn print_plan(plan: &MemoryPlan, order: &[NodeId], g: &Graph, value: &dyn Fn(&Value) -> String, out: &mut String) {
    let _ = writeln!(out, "// memory-plan: arena {} bytes, naive {} bytes", plan.arena_bytes, plan.naive_bytes);
    for &id in order {
        for k in 0..g.node(id).outputs.len() {
            let v = Value::new(id, k as u32);
            if let Some(b) = plan.assignments.get(&v) {
                let _ = write!(out, "//   {}: [{}, {})", value(&v), b.offset, b.offset + b.size);
                if let Some(o) = plan.in_place.get(&v) {
                    let _ = write!(out, " in place of {}", value(o));
                }
                out.push('\n');
            } else if plan.dynamic.contains(&v) {
                let _ = writeln!(out, "//   {}: dynamic", value(&v));
            }
        }
    }
}

/// Topological order (node-id order if there is a cycle), with the `input` nodes' slots refilled in the graph's
/// input order. Inputs have no operands, so any permutation among their slots is still topological.
fn print_order(g: &Graph) -> Vec<NodeId> {
    let mut order = match g.schedule() {
        Some(s) => s.to_vec(),
        None => g.topo_order().unwrap_or_else(|_| g.node_ids().collect()),
    };
    let is_input = |id: NodeId| matches!(g.node(id).op, Op::Input(_));
    let slots: Vec<usize> = (0..order.len()).filter(|&i| is_input(order[i])).collect();
    let mut inputs: Vec<NodeId> = Vec::with_capacity(slots.len());
    for &id in g.inputs() {
        if g.contains(id) && is_input(id) && !inputs.contains(&id) {
            inputs.push(id);
        }
    }
    for &i in &slots {
        if !inputs.contains(&order[i]) {
            inputs.push(order[i]);
        }
    }
    for (&slot, id) in slots.iter().zip(inputs) {
        order[slot] = id;
    }
    order
}
