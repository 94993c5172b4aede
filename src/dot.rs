//! Graphviz rendering of a graph (`kiln compile --emit dot`): one box per node, edges from producers to
//! consumers labelled with the value's type, and each fusion node drawn as a labelled cluster listing its body ops
//! with their own edges — so what the fuser grouped is visible at a glance.

use std::fmt::Write;

use kiln_ir::{Graph, NodeId, Op};

/// The graph as DOT text.
pub fn to_dot(g: &Graph) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph {} {{", quote(g.name()));
    out.push_str("  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
    out.push_str("  edge [fontname=\"monospace\", fontsize=8];\n");
    for id in g.node_ids() {
        let node = g.node(id);
        match &node.op {
            Op::Fusion(f) => {
                let body: &Graph = &f.body.0;
                let _ = writeln!(out, "  subgraph cluster_{id} {{");
                let _ =
                    writeln!(out, "    label={};", quote(&format!("{} fusion {}", f.kind.name(), fusion_name(g, id))));
                out.push_str("    style=\"rounded,filled\"; fillcolor=\"#eef3fb\";\n");
                let _ = writeln!(out, "    {id} [label={}, shape=point];", quote(&g.describe(id)));
                for b in body.node_ids() {
                    let bn = body.node(b);
                    if matches!(bn.op, Op::Input(_)) {
                        continue;
                    }
                    let _ = writeln!(out, "    {id}_{b} [label={}];", quote(&body.describe(b)));
                    for v in &bn.inputs {
                        if !matches!(body.node(v.node).op, Op::Input(_)) {
                            let _ = writeln!(out, "    {id}_{} -> {id}_{b};", v.node);
                        }
                    }
                }
                out.push_str("  }\n");
            }
            op => {
                let shape =
                    if matches!(op, Op::Input(_) | Op::Parameter(_) | Op::Constant(_)) { "ellipse" } else { "box" };
                let label = format!(
                    "{}\n{}",
                    label_of(g, id),
                    node.outputs.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
                );
                let _ = writeln!(out, "  {id} [label={}, shape={shape}];", quote(&label));
            }
        }
        for v in &node.inputs {
            let ty = g.value_type(*v).map(|t| t.to_string()).unwrap_or_default();
            let _ = writeln!(out, "  {} -> {id} [label={}];", v.node, quote(&ty));
        }
    }
    for (i, (name, v)) in g.outputs().iter().enumerate() {
        let _ = writeln!(out, "  out{i} [label={}, shape=oval, style=bold];", quote(&format!("output {name}")));
        let _ = writeln!(out, "  {} -> out{i};", v.node);
    }
    out.push_str("}\n");
    out
}

/// A fusion node's name, or its id.
fn fusion_name(g: &Graph, id: NodeId) -> String {
    match &g.node(id).name {
        Some(name) => format!("`{name}`"),
        None => id.to_string(),
    }
}

fn label_of(g: &Graph, id: NodeId) -> String {
    match &g.node(id).op {
        Op::Input(i) => format!("input {}", i.name),
        Op::Parameter(p) => format!("param {}", p.name),
        _ => g.describe(id),
    }
}

/// A DOT string literal.
fn quote(s: &str) -> String {
    let mut q = String::from("\"");
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                q.push('\\');
                q.push(c);
            }
            '\n' => q.push_str("\\n"),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusion_nodes_become_clusters_listing_their_ops() {
        let g = kiln_ir::parse(include_str!("../tests/fixtures/fusion.kir")).unwrap();
        let dot = to_dot(&g);
        assert_eq!(dot.matches("subgraph cluster_").count(), 2, "{dot}");
        assert!(dot.contains("label=\"library fusion `fc`\""), "{dot}");
        assert!(dot.contains("matmul") && dot.contains("reduce"), "{dot}");
    }
}
