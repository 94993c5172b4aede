//! `.kir` text form: round trips of every fixture (text, structure, JSON), the printer's output for a builder
//! graph, the parser's error messages for a table of bad inputs, and a no-panic check over truncated and mutated
//! fixtures. Snapshots live in `snapshots/`; bless with `INSTA_UPDATE=always cargo test -p kiln-ir`.

use std::path::PathBuf;

use kiln_ir::op::{BinaryOp, Op, Split};
use kiln_ir::{Builder, DType, Dim, Graph, NodeId, Shape, Tensor, parse, print};

fn fixtures() -> Vec<(String, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "kir"))
        .map(|p| {
            let name = p.file_stem().expect("stem").to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).expect("fixture is UTF-8"))
        })
        .collect();
    out.sort();
    assert!(out.len() >= 12, "expected at least 12 fixtures, found {}", out.len());
    out
}

fn parse_ok(name: &str, text: &str) -> Graph {
    parse(text).unwrap_or_else(|e| panic!("fixture {name} does not parse:\n{e}"))
}

/// The graph as plain data in print order: node ids replaced by positions, so two graphs built differently
/// compare equal when they have the same structure. Ops compare by their Debug form so NaN constants match.
fn structure(g: &Graph) -> String {
    let order: Vec<NodeId> = g.topo_order().expect("fixtures are acyclic");
    let pos = |id: NodeId| order.iter().position(|&o| o == id).expect("operand in graph");
    let mut s = format!("graph {:?}\n", g.name());
    for &id in &order {
        let n = g.node(id);
        let ins: Vec<(usize, u32)> = n.inputs.iter().map(|v| (pos(v.node), v.index)).collect();
        s += &format!("{:?} {ins:?} {:?} {:?}\n", n.op, n.outputs, n.name);
    }
    let inputs: Vec<usize> = g.inputs().iter().map(|&i| pos(i)).collect();
    let outputs: Vec<(&str, usize, u32)> =
        g.outputs().iter().map(|(n, v)| (n.as_str(), pos(v.node), v.index)).collect();
    s + &format!("inputs {inputs:?}\noutputs {outputs:?}\n")
}

#[test]
fn every_fixture_parses_and_type_checks() {
    let failures: Vec<String> =
        fixtures().into_iter().filter_map(|(name, text)| parse(&text).err().map(|e| format!("{name}: {e}"))).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_fixture_reaches_a_fixed_point_after_one_print() {
    for (name, text) in fixtures() {
        let g = parse_ok(&name, &text);
        let once = print(&g);
        let again = print(&parse_ok(&name, &once));
        assert_eq!(once, again, "fixture {name}: printing is not a fixed point");
    }
}

#[test]
fn every_fixture_round_trips_structurally() {
    for (name, text) in fixtures() {
        let g = parse_ok(&name, &text);
        let back = parse_ok(&name, &print(&g));
        assert_eq!(structure(&g), structure(&back), "fixture {name}");
    }
}

#[test]
fn every_fixture_round_trips_through_json() {
    for (name, text) in fixtures() {
        let g = parse_ok(&name, &text);
        let json = g.to_json();
        let back = Graph::from_json(&json).unwrap_or_else(|e| panic!("fixture {name}: JSON does not load: {e}"));
        assert_eq!(print(&g), print(&back), "fixture {name}");
    }
}
