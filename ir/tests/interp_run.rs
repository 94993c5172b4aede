//! The interpreter's graph driver: binding inputs, parameters and symbolic dims, checking declared types,
//! reporting errors by node, and returning outputs in order.

mod interp_support;

use std::collections::BTreeMap;

use interp_support::*;
use kiln_ir::interp::{InterpError, eval_op, run};
use kiln_ir::op::{Broadcast, Input, ReduceKind};
use kiln_ir::{Builder, DType, Dim, Graph, Op, Shape, Tensor, TensorType, Value};

fn batch(n: u64) -> Shape {
    Shape(vec![Dim::sym("batch"), Dim::Static(n)])
}

/// `y = relu(x @ w) + broadcast(bias)`, `s = sum(y, -1)`, with `x: f32[batch, 2]`.
fn mlp() -> Graph {
    let mut b = Builder::new("mlp");
    let x = b.input("x", DType::F32, batch(2)).unwrap();
    let w = b.weight("w", f32s(&[2, 2], &[1.0, -1.0, 2.0, 1.0])).unwrap();
    let bias = b.constant(f32s(&[2], &[0.5, -0.5])).unwrap();
    let h = b.matmul(x, w).unwrap();
    let r = b.relu(h).unwrap();
    let bb = b.op(Op::Broadcast(Broadcast { shape: batch(2) }), &[bias]).unwrap();
    let y = b.add(r, bb).unwrap();
    let s = b.reduce(ReduceKind::Sum, y, &[-1], false).unwrap();
    b.output("y", y);
    b.output("s", s);
    b.finish()
}

fn inputs(pairs: &[(&str, Tensor)]) -> BTreeMap<String, Tensor> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

fn run_err(g: &Graph, ins: &[(&str, Tensor)]) -> InterpError {
    match run(g, &inputs(ins)) {
        Ok(out) => panic!("expected an error, got {out:?}"),
        Err(e) => e,
    }
}

fn assert_err(e: &InterpError, node: &str, needle: &str) {
    assert_eq!(e.node, node, "{e}");
    assert!(e.message.contains(needle), "{e:?} does not contain {needle:?}");
}

#[test]
fn symbolic_batch_binds_per_run() {
    let g = mlp();
    // h = [[5,1],[-5,-7],[0,0]]; relu; + [0.5,-0.5].
    let out = run(&g, &inputs(&[("x", f32s(&[3, 2], &[1.0, 2.0, 3.0, -4.0, 0.0, 0.0]))])).unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].0, "y");
    assert!(same(&out[0].1, &f32s(&[3, 2], &[5.5, 0.5, 0.5, -0.5, 0.5, -0.5])), "{:?}", out[0].1);
    assert_eq!(out[1].0, "s");
    assert!(same(&out[1].1, &f32s(&[3], &[6.0, 0.0, 0.0])), "{:?}", out[1].1);
    // A second run binds `batch` afresh.
    let out = run(&g, &inputs(&[("x", f32s(&[1, 2], &[1.0, 1.0]))])).unwrap();
    assert!(same(&out[0].1, &f32s(&[1, 2], &[3.5, -0.5])));
    let out = run(&g, &inputs(&[("x", f32s(&[0, 2], &[]))])).unwrap();
    assert!(same(&out[1].1, &f32s(&[0], &[])));
}

#[test]
fn input_binding_errors() {
    let g = mlp();
    let x_node = g.describe(g.inputs()[0]);
    assert_eq!(x_node, format!("input {}", g.inputs()[0]));
    assert_err(&run_err(&g, &[]), &x_node, "input `x` is missing");
    assert_err(&run_err(&g, &[("x", f64s(&[1, 2], &[1.0, 2.0]))]), &x_node, "should be f32, got f64");
    assert_err(&run_err(&g, &[("x", f32s(&[2], &[1.0, 2.0]))]), &x_node, "should have rank 2");
    assert_err(&run_err(&g, &[("x", f32s(&[1, 3], &[1.0, 2.0, 3.0]))]), &x_node, "dim 1 is 3, not 2");
    // Unknown names are ignored (a pass may have dropped an unused input).
    let extra = [("x", f32s(&[1, 2], &[1.0, 1.0])), ("unused", i32s(&[1], &[0]))];
    assert!(run(&g, &inputs(&extra)).is_ok());
}

#[test]
fn symbols_must_agree_across_inputs() {
    let mut b = Builder::new("pair");
    let x = b.input("x", DType::I32, Shape(vec![Dim::sym("n")])).unwrap();
    let y = b.input("y", DType::I32, Shape(vec![Dim::sym("n")])).unwrap();
    let z = b.add(x, y).unwrap();
    b.output("z", z);
    let g = b.finish();
    let e = run_err(&g, &[("x", i32s(&[2], &[1, 2])), ("y", i32s(&[3], &[1, 2, 3]))]);
    assert_err(&e, &g.describe(y.node), "`n` is already bound to 2");
    let out = run(&g, &inputs(&[("x", i32s(&[2], &[1, 2])), ("y", i32s(&[2], &[10, 20]))])).unwrap();
    assert!(same(&out[0].1, &i32s(&[2], &[11, 22])));
}

#[test]
fn parameter_errors() {
    let mut b = Builder::new("params");
    let w = b.param("w", DType::F32, Shape::of(&[2])).unwrap();
    let y = b.neg(w).unwrap();
    b.output("y", y);
    let mut g = b.finish();
    let w_node = g.describe(w.node);
    assert_err(&run_err(&g, &[]), &w_node, "parameter `w` has no weight");
    g.weights.insert("w", f32s(&[3], &[1.0, 2.0, 3.0]));
    assert_err(&run_err(&g, &[]), &w_node, "parameter `w` should have shape [2]");
    g.weights.insert("w", i32s(&[2], &[1, 2]));
    assert_err(&run_err(&g, &[]), &w_node, "should be f32, got i32");
    g.weights.insert("w", f32s(&[2], &[1.0, -2.0]));
    let out = run(&g, &inputs(&[])).unwrap();
    assert!(same(&out[0].1, &f32s(&[2], &[-1.0, 2.0])));
}

#[test]
fn declared_types_are_checked() {
    let mut g = mlp();
    let relu = g.node_ids().find(|&id| g.node(id).op.mnemonic() == "relu").unwrap();
    g.node_mut(relu).outputs[0] = TensorType::new(DType::F64, batch(2));
    let x = [("x", f32s(&[1, 2], &[1.0, 1.0]))];
    assert_err(&run_err(&g, &x), &g.describe(relu), "result 0 should be f64, got f32");
    g.node_mut(relu).outputs[0] = TensorType::of(DType::F32, &[1, 3]);
    assert_err(&run_err(&g, &x), &g.describe(relu), "should have shape [1,3], got [1,2] (dim 1 is 2, not 3)");
    // A symbol the inputs bound must match too.
    g.node_mut(relu).outputs[0] = TensorType::new(DType::F32, Shape(vec![Dim::sym("batch"), Dim::sym("batch")]));
    assert_err(&run_err(&g, &x), &g.describe(relu), "`batch` is already bound to 1");
}

#[test]
fn evaluation_errors_name_the_node() {
    let mut b = Builder::new("div");
    let x = b.input("x", DType::I64, Shape::of(&[2])).unwrap();
    let d = b.input("d", DType::I64, Shape::of(&[2])).unwrap();
    let q = b.named_op(Op::Binary(kiln_ir::op::BinaryOp::Div), &[x, d], Some("divider".into())).unwrap()[0];
    b.output("q", q);
    let g = b.finish();
    let e = run_err(&g, &[("x", i64s(&[2], &[1, i64::MIN])), ("d", i64s(&[2], &[1, -1]))]);
    assert_err(&e, "div `divider`", "overflows");
    assert_eq!(e.to_string(), format!("div `divider`: {}", e.message));
    let e = run_err(&g, &[("x", i64s(&[2], &[1, 2])), ("d", i64s(&[2], &[0, 1]))]);
    assert_err(&e, "div `divider`", "division by zero");
}

#[test]
fn cycles_and_dangling_operands() {
    let mut b = Builder::new("cycle");
    let x = b.input("x", DType::F32, Shape::of(&[1])).unwrap();
    let a = b.add(x, x).unwrap();
    let n = b.neg(a).unwrap();
    b.output("n", n);
    let mut g = b.finish();
    let mut cyclic = g.clone();
    cyclic.set_input(a.node, 1, n);
    let e = run_err(&cyclic, &[("x", f32s(&[1], &[1.0]))]);
    assert!(e.message.contains("cycle"), "{e}");

    g.remove_node(a.node);
    let e = run_err(&g, &[("x", f32s(&[1], &[1.0]))]);
    assert_err(&e, &g.describe(n.node), "has no value");
}

#[test]
fn outputs_in_order_repeated_and_direct() {
    let mut b = Builder::new("outs");
    let x = b.input("x", DType::U8, Shape::of(&[2])).unwrap();
    let y = b.abs(x).unwrap();
    b.output("second", y);
    b.output("input", x);
    b.output("again", y);
    let g = b.finish();
    let out = run(&g, &inputs(&[("x", u8s(&[2], &[3, 4]))])).unwrap();
    let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["second", "input", "again"]);
    for (_, t) in &out {
        assert!(same(t, &u8s(&[2], &[3, 4])));
    }
    let mut dangling = g.clone();
    dangling.add_output("ghost", Value::new(kiln_ir::NodeId(99), 0));
    let e = run_err(&dangling, &[("x", u8s(&[2], &[3, 4]))]);
    assert_err(&e, "output `ghost`", "no value");
}

#[test]
fn long_chains_run() {
    // Values are dropped after their last use; a long chain must still compute the right answer.
    let mut b = Builder::new("chain");
    let x = b.input("x", DType::I32, Shape::of(&[3])).unwrap();
    let one = b.constant(i32s(&[], &[1])).unwrap();
    let mut v = x;
    for _ in 0..200 {
        v = b.add(v, one).unwrap();
    }
    b.output("v", v);
    let g = b.finish();
    let out = run(&g, &inputs(&[("x", i32s(&[3], &[0, 1, -200]))])).unwrap();
    assert!(same(&out[0].1, &i32s(&[3], &[200, 201, 0])));
}

#[test]
fn eval_op_rejects_graph_sources() {
    let e = eval_op(&Op::Input(Input { name: "x".into() }), &[]).unwrap_err();
    assert!(e.contains("graph"), "{e}");
    let e = eval_op(&Op::MatMul, &[&f32s(&[2], &[1.0, 2.0])]).unwrap_err();
    assert!(e.contains("operand"), "{e}");
}
