//! `Graph` tests: rewiring (`replace_uses`, `set_input`), removal and the dangling uses it leaves, use lists,
//! topological order (stable ties, a cycle named by a node on it), the serde form's round trip, and the
//! parameter footprint.

use kiln_ir::graph::{Cycle, GraphDoc};
use kiln_ir::op::{BinaryOp, Input, Parameter, UnaryOp};
use kiln_ir::verify::VerifyErrorKind;
use kiln_ir::{Builder, DType, Dim, Graph, Node, NodeId, Op, Shape, Tensor, TensorType, Value, verify};

fn f32t(dims: &[u64]) -> TensorType {
    TensorType::of(DType::F32, dims)
}

fn node(op: Op, inputs: &[Value], outputs: &[TensorType]) -> Node {
    Node { op, inputs: inputs.to_vec(), outputs: outputs.to_vec(), name: None }
}

/// `x` → `a = relu(x)` → `b = exp(a)`, `c = a + a`; outputs `a`, `b`, `c`.
fn diamond() -> (Graph, [Value; 4]) {
    let mut b = Builder::new("diamond");
    let x = b.input("x", DType::F32, Shape::of(&[2])).unwrap();
    let a = b.relu(x).unwrap();
    let e = b.exp(a).unwrap();
    let c = b.add(a, a).unwrap();
    b.output("a", a);
    b.output("b", e);
    b.output("c", c);
    (b.finish(), [x, a, e, c])
}

#[test]
fn uses_and_users() {
    let (g, [x, a, e, c]) = diamond();
    assert_eq!(g.uses(x), vec![(a.node, 0)]);
    assert_eq!(g.uses(a), vec![(e.node, 0), (c.node, 0), (c.node, 1)]);
    assert_eq!(g.uses(c), vec![]);
    // A result index nothing uses.
    assert_eq!(g.uses(Value::new(a.node, 1)), vec![]);
    assert_eq!(g.users(a.node), vec![e.node, c.node], "distinct, sorted");
    assert_eq!(g.users(c.node), vec![]);
}

#[test]
fn replace_uses_rewires_operands_and_outputs() {
    let (mut g, [x, a, e, c]) = diamond();
    let n = Value::new(g.add_node(node(Op::Unary(UnaryOp::Neg), &[x], &[f32t(&[2])])), 0);
    g.replace_uses(a, n);
    assert_eq!(g.uses(a), vec![]);
    assert_eq!(g.users(a.node), vec![]);
    assert_eq!(g.uses(n), vec![(e.node, 0), (c.node, 0), (c.node, 1)]);
    assert_eq!(g.node(c.node).inputs, vec![n, n]);
    assert_eq!(g.outputs()[0], ("a".to_string(), n));
    assert!(verify(&g).is_ok());
    // `a` is now dead; removing it leaves nothing dangling.
    g.remove_node(a.node);
    assert!(verify(&g).is_ok());
    assert_eq!(g.topo_order().unwrap(), vec![x.node, n.node, e.node, c.node]);
}

#[test]
fn set_input_moves_one_edge() {
    let (mut g, [x, a, e, c]) = diamond();
    g.set_input(c.node, 1, x);
    assert_eq!(g.uses(a), vec![(e.node, 0), (c.node, 0)]);
    assert_eq!(g.uses(x), vec![(a.node, 0), (c.node, 1)]);
    assert!(g.unmirrored_operands(c.node).is_empty());
}

#[test]
fn remove_node_leaves_dangling_uses_for_the_verifier() {
    let (mut g, [x, a, e, c]) = diamond();
    let removed = g.remove_node(a.node).expect("a was live");
    assert_eq!(removed.op, Op::Unary(UnaryOp::Relu));
    assert!(!g.contains(a.node));
    assert!(g.get(a.node).is_none());
    assert_eq!(g.describe(a.node), "removed node n1");
    assert_eq!(g.uses(x), vec![], "the edge to the removed node is gone");
    // The users keep their operands.
    assert_eq!(g.node(c.node).inputs, vec![a, a]);
    let errors = verify(&g).unwrap_err();
    let got: Vec<(Option<NodeId>, VerifyErrorKind)> = errors.iter().map(|e| (e.id, e.kind)).collect();
    assert_eq!(
        got,
        vec![
            (Some(e.node), VerifyErrorKind::DanglingOperand),
            (Some(c.node), VerifyErrorKind::DanglingOperand),
            (Some(c.node), VerifyErrorKind::DanglingOperand),
            (None, VerifyErrorKind::DanglingOutput),
        ]
    );
    // Removing an input drops it from the input list too.
    g.remove_node(x.node);
    assert!(g.inputs().is_empty());
    assert_eq!(g.remove_node(x.node), None);
}

#[test]
fn topo_order_is_stable_and_breaks_ties_by_id() {
    // Ids do not follow dependencies: n0 uses n3, n1 uses n2, n4 uses both.
    let t = f32t(&[1]);
    let ts = std::slice::from_ref(&t);
    let v = |n: u32| Value::new(NodeId(n), 0);
    let g = Graph::from_doc(GraphDoc {
        name: "order".into(),
        nodes: vec![
            (NodeId(0), node(Op::Unary(UnaryOp::Neg), &[v(3)], ts)),
            (NodeId(1), node(Op::Unary(UnaryOp::Exp), &[v(2)], ts)),
            (NodeId(2), node(Op::Input(Input { name: "b".into() }), &[], ts)),
            (NodeId(3), node(Op::Input(Input { name: "a".into() }), &[], ts)),
            (NodeId(4), node(Op::Binary(BinaryOp::Add), &[v(0), v(1)], ts)),
        ],
        outputs: vec![("y".into(), v(4))],
    });
    let [n0, n1, n2, n3, n4] = [0, 1, 2, 3, 4].map(NodeId);
    let order = g.topo_order().unwrap();
    // Ready set {n2, n3}: n2 first (lower id), which readies n1 (< n3); then n3, n0, n4.
    assert_eq!(order, vec![n2, n1, n3, n0, n4]);
    for _ in 0..3 {
        assert_eq!(g.topo_order().unwrap(), order);
    }
    assert_eq!(g.clone().topo_order().unwrap(), order);
}

#[test]
fn topo_order_names_a_node_on_the_cycle() {
    // n1 is only downstream of the cycle n2 <-> n3, yet has the lowest id of the stuck nodes.
    let t = f32t(&[1]);
    let ts = std::slice::from_ref(&t);
    let v = |n: u32| Value::new(NodeId(n), 0);
    let doc = GraphDoc {
        name: "cycle".into(),
        nodes: vec![
            (NodeId(0), node(Op::Input(Input { name: "x".into() }), &[], ts)),
            (NodeId(1), node(Op::Unary(UnaryOp::Neg), &[v(3)], ts)),
            (NodeId(2), node(Op::Binary(BinaryOp::Add), &[v(0), v(3)], ts)),
            (NodeId(3), node(Op::Unary(UnaryOp::Relu), &[v(2)], ts)),
        ],
        outputs: vec![("y".into(), v(1))],
    };
    let g = Graph::from_doc(doc);
    let Cycle(on) = g.topo_order().unwrap_err();
    assert!(on == NodeId(2) || on == NodeId(3), "{on} is not on the cycle");
    // `to_doc` still works on a cyclic graph (insertion order).
    assert_eq!(g.to_doc().nodes.len(), 4);
}

#[test]
fn doc_round_trip() {
    let (mut g, _) = diamond();
    g.weights.insert("unused", Tensor::zeros(DType::F32, vec![1]));
    let doc = g.to_doc();
    let back = Graph::from_doc(doc.clone());
    assert_eq!(back.to_doc(), doc);
    assert_eq!(back.inputs(), g.inputs());
    assert!(back.weights.is_empty(), "weights are not part of the doc");
    // Through JSON text too.
    let json = g.to_json();
    let back = Graph::from_json(&json).unwrap();
    assert_eq!(back.to_doc(), doc);
    assert_eq!(back.to_json(), json);
    assert!(verify(&back).is_ok());
}

#[test]
fn doc_round_trip_renumbers_to_topological_order() {
    let (mut g, [x, a, _, _]) = diamond();
    // A node added last but used first: ids stop following the order.
    let n = Value::new(g.add_node(node(Op::Unary(UnaryOp::Neg), &[x], &[f32t(&[2])])), 0);
    g.set_input(a.node, 0, n);
    let doc = g.to_doc();
    let ids: Vec<u32> = doc.nodes.iter().map(|(id, _)| id.0).collect();
    assert_eq!(ids, vec![0, 4, 1, 2, 3]);
    let once = Graph::from_doc(doc).to_doc();
    let ids: Vec<u32> = once.nodes.iter().map(|(id, _)| id.0).collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4], "renumbered in topological order");
    // From then on the round trip is exact.
    assert_eq!(Graph::from_doc(once.clone()).to_doc(), once);
}

#[test]
fn from_json_rejects_malformed_text() {
    assert!(Graph::from_json("{").is_err());
    assert!(Graph::from_json(r#"{"name": "g", "nodes": [], "outputs": [], "extra": 1}"#).is_ok());
    assert!(Graph::from_json(r#"{"name": "g", "nodes": [[0, {"op": "nope"}]], "outputs": []}"#).is_err());
}

#[test]
fn parameter_footprint() {
    let mut b = Builder::new("params");
    let _x = b.input("x", DType::F32, Shape::of(&[100])).unwrap();
    b.param("w", DType::F32, Shape::of(&[4, 2])).unwrap();
    b.param("h", DType::F16, Shape::of(&[3])).unwrap();
    b.param("dyn", DType::F32, Shape(vec![Dim::sym("n"), Dim::Static(8)])).unwrap();
    b.weight("k", Tensor::zeros(DType::I64, vec![2])).unwrap();
    b.constant(Tensor::zeros(DType::U8, vec![100])).unwrap();
    b.constant(Tensor::zeros(DType::F32, vec![3])).unwrap();
    let mut g = b.finish();
    // Inputs and inline constants do not count; symbolic params count as nothing; large constants are weights.
    assert_eq!(g.parameter_footprint(), (8 + 3 + 2 + 100, 32 + 6 + 16 + 100));
    // A malformed param (no result type) is the verifier's business, not a panic here.
    g.add_node(node(Op::Parameter(Parameter { name: "broken".into() }), &[], &[]));
    assert_eq!(g.parameter_footprint(), (113, 154));
    assert_eq!(Graph::new("empty").parameter_footprint(), (0, 0));
}

#[test]
fn a_schedule_is_checked_printed_in_order_and_forgotten_on_mutation() {
    let src = "graph \"g\" {\n  %x = input {name=\"x\"} : f32[2]\n  %a = exp %x : f32[2]\n  %b = neg %x : f32[2]\n  %s = add %a, %b : f32[2]\n  output \"s\" = %s\n}\n";
    let mut g = kiln_ir::parse(src).unwrap();
    let [x, a, b, s]: [NodeId; 4] = g.topo_order().unwrap().try_into().unwrap();
    assert!(g.set_schedule(vec![x, a, s, b]).is_err(), "a user before its operand");
    assert!(g.set_schedule(vec![x, a, b]).is_err(), "a node missing");
    g.set_schedule(vec![x, b, a, s]).unwrap();
    let text = kiln_ir::print(&g);
    assert!(text.find("neg").unwrap() < text.find("exp").unwrap(), "{text}");
    // The parser keeps file order, so the printed schedule round-trips.
    assert_eq!(kiln_ir::print(&kiln_ir::parse(&text).unwrap()), text);
    g.set_memory_plan(Some(kiln_ir::MemoryPlan::default()));
    assert!(kiln_ir::print(&g).ends_with("}\n// memory-plan: arena 0 bytes, naive 0 bytes\n"));
    g.set_memory_plan(None);
    g.replace_uses(Value::new(a, 0), Value::new(b, 0));
    assert!(g.schedule().is_none());
}

#[test]
fn a_memory_plan_round_trips_through_json_and_check_finds_overlaps() {
    use kiln_ir::memory::Buffer;
    let src = "graph \"g\" {\n  %x = input {name=\"x\"} : f32[16]\n  %a = exp %x : f32[16]\n  %b = neg %x : f32[16]\n  %s = add %a, %b : f32[16]\n  output \"s\" = %s\n}\n";
    let g = kiln_ir::parse(src).unwrap();
    let [_, a, b, s]: [NodeId; 4] = g.topo_order().unwrap().try_into().unwrap();
    let buf = |offset| Buffer { offset, size: 64 };
    let mut plan = kiln_ir::MemoryPlan { arena_bytes: 128, naive_bytes: 192, ..Default::default() };
    plan.assignments.insert(Value::new(a, 0), buf(0));
    plan.assignments.insert(Value::new(b, 0), buf(64));
    plan.assignments.insert(Value::new(s, 0), buf(0));
    plan.in_place.insert(Value::new(s, 0), Value::new(a, 0));
    plan.check(&g).unwrap();
    let json = serde_json::to_string(&plan).unwrap();
    assert_eq!(serde_json::from_str::<kiln_ir::MemoryPlan>(&json).unwrap(), plan);
    // `a` and `b` are live together: sharing bytes is an error.
    plan.assignments.insert(Value::new(b, 0), buf(0));
    assert!(plan.check(&g).is_err());
}
