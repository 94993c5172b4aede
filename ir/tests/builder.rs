//! Builder tests: type errors name the op (and the node, when named), symbolic dims flow through the type rules,
//! constants stay inline when small and become `const.N` weights when large, and every graph the builder makes
//! passes the verifier.

use kiln_ir::op::{Op, ReduceKind};
use kiln_ir::{Builder, DType, Dim, Error, Graph, Shape, Tensor, TensorType, Value, verify};

fn sym(dims: &[&str]) -> Shape {
    Shape(dims.iter().map(|d| d.parse::<u64>().map_or_else(|_| Dim::sym(*d), Dim::Static)).collect())
}

/// The builder error of `build`, as displayed, snapshotted under `name`.
fn check_error(name: &str, build: impl FnOnce(&mut Builder) -> Result<Value, Error>) {
    let mut b = Builder::new(name);
    let err = build(&mut b).expect_err("the builder should refuse this");
    assert!(matches!(err, Error::Build { .. }), "{err:?}");
    insta::assert_snapshot!(name, err.to_string());
}

#[test]
fn matmul_contraction_mismatch() {
    check_error("matmul_contraction_mismatch", |b| {
        let x = b.input("x", DType::F32, Shape::of(&[3, 4]))?;
        let w = b.input("w", DType::F32, Shape::of(&[5, 6]))?;
        b.matmul(x, w)
    });
}

#[test]
fn add_f32_i64() {
    check_error("add_f32_i64", |b| {
        let x = b.input("x", DType::F32, Shape::of(&[2]))?;
        let y = b.input("y", DType::I64, Shape::of(&[2]))?;
        b.add(x, y)
    });
}

#[test]
fn reshape_element_count() {
    check_error("reshape_element_count", |b| {
        let x = b.input("x", DType::F32, Shape::of(&[2, 3]))?;
        b.reshape(x, Shape::of(&[4]))
    });
}

#[test]
fn reshape_symbolic_element_count() {
    check_error("reshape_symbolic_element_count", |b| {
        let x = b.input("x", DType::F32, sym(&["batch", "6"]))?;
        b.reshape(x, sym(&["seq", "6"]))
    });
}

#[test]
fn named_node_in_error() {
    check_error("named_node_in_error", |b| {
        let x = b.input("x", DType::F32, Shape::of(&[2]))?;
        let y = b.input("y", DType::F32, Shape::of(&[3]))?;
        let vs = b.named_op(Op::Binary(kiln_ir::op::BinaryOp::Mul), &[x, y], Some("scale".into()))?;
        Ok(vs[0])
    });
}

#[test]
fn duplicate_input() {
    check_error("duplicate_input", |b| {
        b.input("x", DType::F32, Shape::of(&[2]))?;
        b.input("x", DType::F32, Shape::of(&[2]))
    });
}

#[test]
fn duplicate_param() {
    check_error("duplicate_param", |b| {
        b.weight("w", Tensor::zeros(DType::F32, vec![2]))?;
        b.param("w", DType::F32, Shape::of(&[3]))
    });
}

#[test]
fn duplicate_weight_keeps_the_first_data() {
    let mut b = Builder::new("weights");
    b.weight("w", Tensor::zeros(DType::F32, vec![2])).unwrap();
    assert!(b.weight("w", Tensor::zeros(DType::I64, vec![5])).is_err());
    assert_eq!(b.graph().weights.get("w").map(|t| t.tensor_type()), Some(TensorType::of(DType::F32, &[2])));
    // A builder continuing a graph knows its parameters.
    let mut b = Builder::from_graph(b.finish());
    assert!(b.param("w", DType::F32, Shape::of(&[2])).is_err());
    let c = b.constant(Tensor::zeros(DType::F32, vec![100])).unwrap();
    assert_eq!(b.graph().node(c.node).op, Op::Parameter(kiln_ir::op::Parameter { name: "const.0".into() }));
}

#[test]
fn exp_of_bool() {
    check_error("exp_of_bool", |b| {
        let x = b.input("x", DType::Bool, Shape::of(&[2]))?;
        b.exp(x)
    });
}

#[test]
fn symbolic_batch_flows_through() {
    let mut b = Builder::new("batch");
    let x = b.input("x", DType::F32, sym(&["batch", "seq", "4"])).unwrap();
    let w = b.param("w", DType::F32, Shape::of(&[4, 8])).unwrap();
    let bias = b.param("b", DType::F32, Shape::of(&[8])).unwrap();
    let scale = b.input("scale", DType::F32, sym(&["batch", "1", "1"])).unwrap();
    let h = b.matmul(x, w).unwrap();
    let h = b.add(h, bias).unwrap();
    let h = b.mul(h, scale).unwrap();
    let s = b.reduce(ReduceKind::Sum, h, &[-1], false).unwrap();
    let k = b.reduce(ReduceKind::Max, h, &[1], true).unwrap();
    // Batched matmul of two symbolic operands: batch dims broadcast, the contraction dim is symbolic too.
    let q = b.input("q", DType::F32, sym(&["batch", "heads", "seq", "d"])).unwrap();
    let kt = b.input("kt", DType::F32, sym(&["batch", "1", "d", "seq"])).unwrap();
    let att = b.matmul(q, kt).unwrap();
    let sm = b.softmax(att, -1).unwrap();
    let flat = b.reshape(x, sym(&["batch", "seq", "2", "2"])).unwrap();
    b.output("s", s);
    b.output("k", k);
    b.output("att", sm);
    b.output("flat", flat);
    let ty = |v: Value| b.type_of(v).unwrap().to_string();
    let got = [("matmul", h), ("sum", s), ("max", k), ("attention", att), ("reshape", flat)].map(|(n, v)| (n, ty(v)));
    assert_eq!(
        got,
        [
            ("matmul", "f32[batch,seq,8]".to_string()),
            ("sum", "f32[batch,seq]".to_string()),
            ("max", "f32[batch,1,8]".to_string()),
            ("attention", "f32[batch,heads,seq,seq]".to_string()),
            ("reshape", "f32[batch,seq,2,2]".to_string()),
        ]
    );
    let g = b.finish();
    assert_eq!(verify(&g), Ok(()));
    // Different symbols never broadcast (either could be 1 at run time).
    let mut b = Builder::from_graph(g);
    let other = b.input("other", DType::F32, sym(&["other", "seq", "8"])).unwrap();
    let msg = b.add(h, other).unwrap_err().to_string();
    assert!(msg.starts_with("add: shapes [batch,seq,8] and [other,seq,8] do not broadcast"), "{msg}");
}

fn constant_ops(g: &Graph) -> Vec<String> {
    g.node_ids()
        .map(|id| match &g.node(id).op {
            Op::Constant(c) => format!("constant {}", c.value.tensor_type()),
            Op::Parameter(p) => format!("param {} {}", p.name, g.node(id).outputs[0]),
            other => other.mnemonic().to_string(),
        })
        .collect()
}

#[test]
fn constants_inline_when_small_weights_when_large() {
    let limit = kiln_ir::builder::INLINE_CONSTANT_LIMIT;
    let mut b = Builder::new("consts");
    b.constant(Tensor::zeros(DType::F32, vec![limit])).unwrap();
    b.constant(Tensor::zeros(DType::F32, vec![limit + 1])).unwrap();
    b.scalar(DType::I64, 3.0).unwrap();
    // `const.1` is taken by a declared parameter, so the next large constant skips to `const.2`.
    b.param("const.1", DType::F32, Shape::of(&[1])).unwrap();
    b.constant(Tensor::zeros(DType::I32, vec![8, 9])).unwrap();
    b.output("c", Value::new(kiln_ir::NodeId(0), 0));
    let g = b.finish();
    assert_eq!(
        constant_ops(&g),
        vec![
            format!("constant f32[{limit}]"),
            format!("param const.0 f32[{}]", limit + 1),
            "constant i64[]".to_string(),
            "param const.1 f32[1]".to_string(),
            "param const.2 i32[8,9]".to_string(),
        ]
    );
    let names: Vec<&str> = g.weights.iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec!["const.0", "const.2"]);
    assert_eq!(g.weights.get("const.2").map(|t| t.tensor_type()), Some(TensorType::of(DType::I32, &[8, 9])));
    assert_eq!(verify(&g), Ok(()));
}
