//! Verifier tests: broken graphs built through the raw `Graph` API (the builder refuses bad types), one case per
//! error kind, a graph with many errors at once, and clean graphs. Each case snapshots the full error list, one
//! `[kind] node: message` line per error, under its own name; re-bless with `INSTA_UPDATE=always`.

use kiln_ir::graph::GraphDoc;
use kiln_ir::op::{BinaryOp, Constant, Input, Parameter, ReduceKind, Reshape, UnaryOp};
use kiln_ir::verify::{VerifyErrorKind, verify_weights_bound};
use kiln_ir::{Builder, DType, Dim, Graph, Node, NodeId, Op, Shape, Tensor, TensorType, Value, verify};

fn f32t(dims: &[u64]) -> TensorType {
    TensorType::of(DType::F32, dims)
}

fn node(op: Op, inputs: &[Value], outputs: &[TensorType]) -> Node {
    Node { op, inputs: inputs.to_vec(), outputs: outputs.to_vec(), name: None }
}

fn input(g: &mut Graph, name: &str, t: TensorType) -> Value {
    Value::new(g.add_node(node(Op::Input(Input { name: name.into() }), &[], &[t])), 0)
}

fn param(g: &mut Graph, name: &str, t: TensorType) -> Value {
    Value::new(g.add_node(node(Op::Parameter(Parameter { name: name.into() }), &[], &[t])), 0)
}

fn relu(g: &mut Graph, x: Value, t: TensorType) -> Value {
    Value::new(g.add_node(node(Op::Unary(UnaryOp::Relu), &[x], &[t])), 0)
}

fn add(g: &mut Graph, a: Value, b: Value, t: TensorType) -> Value {
    Value::new(g.add_node(node(Op::Binary(BinaryOp::Add), &[a, b], &[t])), 0)
}

fn render(result: Result<(), Vec<kiln_ir::VerifyError>>) -> String {
    match result {
        Ok(()) => "ok".into(),
        Err(errors) => errors.iter().map(|e| format!("[{}] {e}", e.kind)).collect::<Vec<_>>().join("\n"),
    }
}

/// Snapshots the verifier's report on `g` as the case `name`.
fn check(name: &str, g: &Graph) {
    insta::assert_snapshot!(name, render(kiln_ir::verify(g)));
}

fn kinds(g: &Graph) -> Vec<VerifyErrorKind> {
    verify(g).err().unwrap_or_default().iter().map(|e| e.kind).collect()
}

/// `x: f32[2,3]` → relu → output `y`: a valid base to break.
fn base() -> (Graph, Value, Value) {
    let mut g = Graph::new("base");
    let x = input(&mut g, "x", f32t(&[2, 3]));
    let y = relu(&mut g, x, f32t(&[2, 3]));
    g.add_output("y", y);
    (g, x, y)
}

#[test]
fn clean_builder_graph() {
    let mut b = Builder::new("mlp");
    let x = b.input("x", DType::F32, Shape(vec![Dim::sym("batch"), Dim::Static(4)])).unwrap();
    let w = b.weight("w", Tensor::zeros(DType::F32, vec![4, 2])).unwrap();
    let bias = b.param("b", DType::F32, Shape::of(&[2])).unwrap();
    let h = b.matmul(x, w).unwrap();
    let h = b.add(h, bias).unwrap();
    let y = b.relu(h).unwrap();
    let s = b.reduce(ReduceKind::Sum, y, &[1], false).unwrap();
    b.output("y", y);
    b.output("s", s);
    let g = b.finish();
    check("clean_builder_graph", &g);
    assert!(g.verify().is_ok());
    // The unbound `b` is fine for `verify`, not for an executor.
    insta::assert_snapshot!("clean_builder_graph_unbound", render(verify_weights_bound(&g)));
}

#[test]
fn dangling_operand_after_remove() {
    let (mut g, x, y) = base();
    let z = add(&mut g, y, x, f32t(&[2, 3]));
    g.set_outputs(vec![("z".into(), z)]);
    g.remove_node(y.node);
    check("dangling_operand_after_remove", &g);
}

#[test]
fn dangling_operand_from_json() {
    let (g, _, _) = base();
    let mut doc: GraphDoc = g.to_doc();
    doc.nodes[1].1.inputs[0] = Value::new(NodeId(42), 0);
    let json = serde_json::to_string(&doc).unwrap();
    let g = Graph::from_json(&json).unwrap();
    check("dangling_operand_from_json", &g);
}

#[test]
fn bad_result_index() {
    let (mut g, x, _) = base();
    let z = relu(&mut g, Value::new(x.node, 1), f32t(&[2, 3]));
    g.add_output("z", z);
    check("bad_result_index", &g);
}

#[test]
fn unmirrored_operand_after_id_reuse() {
    let (mut g, x, y) = base();
    let z = relu(&mut g, y, f32t(&[2, 3]));
    g.add_output("z", z);
    g.remove_node(y.node);
    // petgraph reuses the freed slot: the new node takes `y`'s id, and `z`'s stale operand now names it.
    let reused = g.add_node(node(Op::Unary(UnaryOp::Neg), &[x], &[f32t(&[2, 3])]));
    assert_eq!(reused, y.node);
    check("unmirrored_operand_after_id_reuse", &g);
}

#[test]
fn unmirrored_operand_forward_reference() {
    let mut g = Graph::new("forward");
    let x = input(&mut g, "x", f32t(&[2]));
    // Names node 2 before it exists, so no edge is recorded.
    let y = relu(&mut g, Value::new(NodeId(2), 0), f32t(&[2]));
    let _ = relu(&mut g, x, f32t(&[2]));
    g.add_output("y", y);
    check("unmirrored_operand_forward_reference", &g);
}

/// A doc whose nodes reference each other: `from_doc` wires forward references with edges.
fn cyclic_doc() -> GraphDoc {
    let t = f32t(&[2]);
    let v = |n: u32| Value::new(NodeId(n), 0);
    GraphDoc {
        name: "cyclic".into(),
        nodes: vec![
            (NodeId(0), node(Op::Input(Input { name: "x".into() }), &[], std::slice::from_ref(&t))),
            (NodeId(1), node(Op::Binary(BinaryOp::Add), &[v(0), v(3)], std::slice::from_ref(&t))),
            (NodeId(2), node(Op::Unary(UnaryOp::Relu), &[v(1)], std::slice::from_ref(&t))),
            (NodeId(3), node(Op::Unary(UnaryOp::Exp), &[v(2)], std::slice::from_ref(&t))),
            // Downstream of the cycle, with its own (unreported: not cascaded) wrong type.
            (NodeId(4), node(Op::Unary(UnaryOp::Neg), &[v(3)], &[f32t(&[9])])),
            // Independent of the cycle, with a wrong type that is reported.
            (NodeId(5), node(Op::Unary(UnaryOp::Neg), &[v(0)], &[f32t(&[7])])),
        ],
        outputs: vec![("y".into(), v(4)), ("z".into(), v(5))],
    }
}

#[test]
fn cycle_reported_once() {
    let g = Graph::from_doc(cyclic_doc());
    check("cycle_reported_once", &g);
    assert_eq!(kinds(&g), vec![VerifyErrorKind::Cycle, VerifyErrorKind::TypeMismatch]);
    // `topo_order` names a node on the cycle, not one merely downstream of it.
    let kiln_ir::graph::Cycle(on) = g.topo_order().unwrap_err();
    assert!([1, 2, 3].contains(&on.0), "{on}");
}

#[test]
fn self_loop() {
    let mut g = Graph::new("self_loop");
    let x = input(&mut g, "x", f32t(&[2]));
    let a = add(&mut g, x, x, f32t(&[2]));
    g.set_input(a.node, 1, a);
    g.add_output("a", a);
    check("self_loop", &g);
}

#[test]
fn cycle_with_extra_members() {
    // Two cycles sharing n1: n1 -> n2 -> n1 and n1 -> n3 -> n4 -> n1.
    let t = f32t(&[2]);
    let v = |n: u32| Value::new(NodeId(n), 0);
    let ts = std::slice::from_ref(&t);
    let doc = GraphDoc {
        name: "two_cycles".into(),
        nodes: vec![
            (NodeId(0), node(Op::Input(Input { name: "x".into() }), &[], ts)),
            (NodeId(1), node(Op::Select, &[v(0), v(2), v(4)], ts)),
            (NodeId(2), node(Op::Unary(UnaryOp::Neg), &[v(1)], ts)),
            (NodeId(3), node(Op::Unary(UnaryOp::Exp), &[v(1)], ts)),
            (NodeId(4), node(Op::Unary(UnaryOp::Log), &[v(3)], ts)),
        ],
        outputs: vec![("y".into(), v(4))],
    };
    check("cycle_with_extra_members", &Graph::from_doc(doc));
}

#[test]
fn arity() {
    let (mut g, x, _) = base();
    let z = Value::new(g.add_node(node(Op::Binary(BinaryOp::Add), &[x], &[f32t(&[2, 3])])), 0);
    let w = Value::new(g.add_node(node(Op::Unary(UnaryOp::Exp), &[x, x], &[f32t(&[2, 3])])), 0);
    g.add_output("z", z);
    g.add_output("w", w);
    check("arity", &g);
}

#[test]
fn input_and_param_names() {
    let (mut g, _, y) = base();
    let x2 = input(&mut g, "x", f32t(&[2, 3]));
    let e = input(&mut g, "", f32t(&[2, 3]));
    let p1 = param(&mut g, "w", f32t(&[2, 3]));
    let p2 = param(&mut g, "w", f32t(&[2, 3]));
    let p3 = param(&mut g, "", f32t(&[2, 3]));
    let mut acc = y;
    for v in [x2, e, p1, p2, p3] {
        acc = add(&mut g, acc, v, f32t(&[2, 3]));
    }
    g.set_outputs(vec![("acc".into(), acc)]);
    check("input_and_param_names", &g);
}

#[test]
fn unlisted_input_and_bad_input_list() {
    let (mut g, x, y) = base();
    // An op rewritten into an input is not in the input list; the old input is no longer an input node.
    *g.node_mut(y.node).op = Op::Input(Input { name: "late".into() });
    *g.node_mut(x.node).op = Op::Parameter(Parameter { name: "x".into() });
    let gone = input(&mut g, "gone", f32t(&[1]));
    g.remove_node(gone.node);
    check("unlisted_input_and_bad_input_list", &g);
}

#[test]
fn weight_mismatch() {
    let mut g = Graph::new("weights");
    let x = input(&mut g, "x", f32t(&[3, 4]));
    let w = param(&mut g, "w", f32t(&[4, 2]));
    let s = param(&mut g, "s", TensorType::new(DType::F32, Shape(vec![Dim::sym("n")])));
    let i = param(&mut g, "i", TensorType::of(DType::I32, &[2]));
    g.weights.insert("w", Tensor::zeros(DType::F32, vec![2, 4]));
    g.weights.insert("s", Tensor::zeros(DType::F32, vec![5]));
    g.weights.insert("i", Tensor::zeros(DType::I64, vec![2]));
    let h = Value::new(g.add_node(node(Op::MatMul, &[x, w], &[f32t(&[3, 2])])), 0);
    g.add_output("h", h);
    g.add_output("s", s);
    g.add_output("i", i);
    check("weight_mismatch", &g);
}

#[test]
fn constant_mismatch() {
    let mut g = Graph::new("constants");
    let value = Tensor::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap();
    let c = g.add_node(node(Op::Constant(Constant { value: value.clone() }), &[], &[f32t(&[3])]));
    let d = g.add_node(node(Op::Constant(Constant { value }), &[], &[TensorType::of(DType::I64, &[2])]));
    // Users of a broken constant are not type checked (no cascade).
    let r = relu(&mut g, Value::new(c, 0), f32t(&[4]));
    g.add_output("r", r);
    g.add_output("d", Value::new(d, 0));
    check("constant_mismatch", &g);
}

#[test]
fn result_count() {
    let (mut g, x, _) = base();
    let two = g.add_node(node(Op::Unary(UnaryOp::Exp), &[x], &[f32t(&[2, 3]), f32t(&[2, 3])]));
    let none = g.add_node(node(Op::Input(Input { name: "nothing".into() }), &[], &[]));
    g.add_output("two", Value::new(two, 0));
    g.add_output("none", Value::new(none, 0));
    check("result_count", &g);
}

#[test]
fn type_error() {
    let mut g = Graph::new("types");
    let a = input(&mut g, "a", f32t(&[2]));
    let b = input(&mut g, "b", TensorType::of(DType::I64, &[2]));
    let s = add(&mut g, a, b, f32t(&[2]));
    g.add_output("s", s);
    check("type_error", &g);
}

#[test]
fn type_mismatch() {
    let mut g = Graph::new("types");
    let a = input(&mut g, "a", f32t(&[3, 4]));
    let b = input(&mut g, "b", f32t(&[4, 5]));
    let m = g.add_node(Node {
        op: Op::MatMul,
        inputs: vec![a, b],
        outputs: vec![TensorType::of(DType::F64, &[3, 4])],
        name: Some("proj".into()),
    });
    g.add_output("m", Value::new(m, 0));
    check("type_mismatch", &g);
}

#[test]
fn bad_symbols() {
    let mut g = Graph::new("symbols");
    let dims = |tail: &[u64]| {
        let mut d = vec![Dim::sym("batch size"), Dim::sym("1seq")];
        d.extend(tail.iter().map(|&n| Dim::Static(n)));
        Shape(d)
    };
    let x = input(&mut g, "x", TensorType::new(DType::F32, dims(&[4])));
    // The bad names recur in the reshape's attribute and result: reported once for the node.
    let r = g.add_node(node(
        Op::Reshape(Reshape { shape: dims(&[2, 2]) }),
        &[x],
        &[TensorType::new(DType::F32, dims(&[2, 2]))],
    ));
    let e = input(&mut g, "e", TensorType::new(DType::F32, Shape(vec![Dim::sym(""), Dim::sym("_ok1")])));
    g.add_output("r", Value::new(r, 0));
    g.add_output("e", e);
    check("bad_symbols", &g);
}

#[test]
fn outputs() {
    let (mut g, x, y) = base();
    g.set_outputs(vec![
        ("y".into(), y),
        ("".into(), x),
        ("y".into(), x),
        ("gone".into(), Value::new(NodeId(99), 0)),
        ("past".into(), Value::new(y.node, 3)),
    ]);
    check("outputs", &g);
}

#[test]
fn no_outputs() {
    let (mut g, _, _) = base();
    g.set_outputs(vec![]);
    check("no_outputs", &g);
}

#[test]
fn no_cascade_from_broken_producer() {
    let (mut g, x, y) = base();
    // Break `y`'s declared type; its users are then not checked against it.
    g.node_mut(y.node).outputs[0] = f32t(&[5]);
    let z = add(&mut g, y, x, f32t(&[2, 3]));
    // A user of the (unchecked) `z` is checked against `z`'s declared type.
    let w = relu(&mut g, z, f32t(&[1]));
    g.set_outputs(vec![("w".into(), w)]);
    check("no_cascade_from_broken_producer", &g);
}

#[test]
fn many_errors_at_once() {
    let mut g = Graph::new("many");
    let x = input(&mut g, "x", f32t(&[2, 3]));
    let _dup = input(&mut g, "x", f32t(&[2, 3]));
    let w = param(&mut g, "w", f32t(&[3, 4]));
    g.weights.insert("w", Tensor::zeros(DType::F32, vec![4, 3]));
    let m = Value::new(g.add_node(node(Op::MatMul, &[x, w], &[f32t(&[2, 3])])), 0);
    // Not checked: its operand `m` is broken.
    let bad_add = add(&mut g, m, x, f32t(&[9]));
    let dead = relu(&mut g, x, f32t(&[2, 3]));
    let uses_dead = relu(&mut g, dead, f32t(&[2, 3]));
    let e = g.add_node(node(Op::Unary(UnaryOp::Exp), &[x, x], &[f32t(&[2, 3])]));
    let i = input(&mut g, "i", TensorType::of(DType::I64, &[2, 3]));
    let mixed = add(&mut g, x, i, f32t(&[2, 3]));
    let weird = input(&mut g, "x y", TensorType::new(DType::F32, Shape(vec![Dim::sym("2b")])));
    let c1 = relu(&mut g, x, f32t(&[2, 3]));
    let c2 = relu(&mut g, c1, f32t(&[2, 3]));
    g.set_input(c1.node, 0, c2);
    g.remove_node(dead.node);
    g.set_outputs(vec![
        ("a".into(), bad_add),
        ("a".into(), uses_dead),
        ("e".into(), Value::new(e, 0)),
        ("".into(), weird),
        ("gone".into(), Value::new(NodeId(77), 0)),
        ("mixed".into(), mixed),
        ("c".into(), c2),
    ]);
    check("many_errors_at_once", &g);
    let errors = verify(&g).unwrap_err();
    // Node id order, then check order, then graph-level errors.
    let ids: Vec<Option<NodeId>> = errors.iter().map(|e| e.id).collect();
    let node_ids: Vec<NodeId> = ids.iter().flatten().copied().collect();
    assert!(node_ids.windows(2).all(|w| w[0] <= w[1]), "{ids:?}");
    assert!(ids.iter().skip_while(|i| i.is_some()).all(|i| i.is_none()), "{ids:?}");
    let mut kinds = kinds(&g);
    kinds.sort();
    kinds.dedup();
    assert!(kinds.len() >= 8, "{kinds:?}");
    // The crate error lists them all.
    let text = g.verify().unwrap_err().to_string();
    assert!(text.starts_with(&format!("the graph has {} error(s):", errors.len())), "{text}");
}

#[test]
fn unbound_parameters() {
    let mut g = Graph::new("params");
    let a = param(&mut g, "a", f32t(&[2]));
    let b = param(&mut g, "b", f32t(&[2]));
    let c = param(&mut g, "c", f32t(&[2]));
    g.weights.insert("b", Tensor::zeros(DType::F32, vec![2]));
    let s = add(&mut g, a, b, f32t(&[2]));
    let s = add(&mut g, s, c, f32t(&[2]));
    g.add_output("s", s);
    check("unbound_parameters_verify", &g);
    insta::assert_snapshot!("unbound_parameters", render(verify_weights_bound(&g)));
}

#[test]
fn extreme_attributes_are_type_errors_not_panics() {
    use kiln_ir::op::{Concat, Conv, ConvTranspose, Lstm, Pad, PadMode, Pool, PoolKind, RnnDirection, Slice, Split};
    let mut g = Graph::new("extreme");
    let x = input(&mut g, "x", f32t(&[2, 3, 4, 5]));
    let big = input(&mut g, "big", TensorType::of(DType::F32, &[u64::MAX, 2]));
    let w = input(&mut g, "w", f32t(&[1, 3, 1, 1]));
    let wt = input(&mut g, "wt", f32t(&[3, 1, 3, 1]));
    let s = input(&mut g, "s", f32t(&[1, 1, 1]));
    let max = i64::MAX;
    let ops: Vec<(Op, Vec<Value>)> = vec![
        (Op::Slice(Slice { starts: vec![0], ends: vec![max], axes: vec![0], steps: vec![max] }), vec![x]),
        (Op::Slice(Slice { starts: vec![max], ends: vec![i64::MIN], axes: vec![0], steps: vec![i64::MIN] }), vec![x]),
        (Op::Split(Split { axis: 0, sizes: vec![max, max] }), vec![x]),
        (Op::Pad(Pad { mode: PadMode::Constant, pads: vec![max, 0, 0, 0, max, 0, 0, 0], value: 0.0 }), vec![x]),
        (Op::Concat(Concat { axis: 0 }), vec![big, big]),
        (
            Op::Conv(Conv { strides: vec![1, 1], pads: vec![max, 0, max, 0], dilations: vec![1, 1], groups: 1 }),
            vec![x, w],
        ),
        (
            Op::ConvTranspose(ConvTranspose {
                strides: vec![max, 1],
                pads: vec![0; 4],
                dilations: vec![1, 1],
                output_padding: vec![0, 0],
                groups: 1,
            }),
            vec![x, wt],
        ),
        (
            Op::Pool(Pool {
                kind: PoolKind::Max,
                kernel: vec![max, 1],
                strides: vec![1, 1],
                pads: vec![0; 4],
                dilations: vec![2, 1],
                ceil_mode: false,
                count_include_pad: false,
            }),
            vec![x],
        ),
        (
            Op::Lstm(Lstm { hidden_size: max, direction: RnnDirection::Forward, clip: 0.0, input_forget: false }),
            vec![s; 6],
        ),
    ];
    for (op, inputs) in ops {
        let v = g.add_node(node(op, &inputs, &[f32t(&[1])]));
        g.add_output(format!("o{}", v.0), Value::new(v, 0));
    }
    check("extreme_attributes_are_type_errors_not_panics", &g);
}

#[test]
fn deep_chain_does_not_overflow() {
    let mut b = Builder::new("deep");
    let mut v = b.input("x", DType::F32, Shape::of(&[1])).unwrap();
    for _ in 0..50_000 {
        v = b.relu(v).unwrap();
    }
    b.output("y", v);
    let mut g = b.finish();
    assert!(verify(&g).is_ok());
    // Close the chain into one long cycle: one error, its path elided to one readable line.
    g.set_input(NodeId(1), 0, v);
    let errors = verify(&g).unwrap_err();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].kind, VerifyErrorKind::Cycle);
    assert!(errors[0].message.contains(" -> (49991 more) -> "), "{}", errors[0].message);
    assert!(errors[0].message.len() < 200, "{}", errors[0].message);
}
