//! `fusion` nodes: the interpreter runs the body on the operands, the verifier names the fusion node for body
//! errors, and the parser points into the body.

use std::collections::BTreeMap;

use kiln_ir::{Tensor, interp, parse, verify};

const FUSED: &str = r#"graph "g" {
  %0 = input {name="x"} : f32[n]
  %1 = input {name="y"} : f32[n]
  %2, %3 = fusion %0, %1 {kind=loop, body=graph "b" {
    %0 = input {name="p0"} : f32[n]
    %1 = input {name="p1"} : f32[n]
    %2 = mul %0, %1 : f32[n]
    %3 = relu %2 : f32[n]
    output "a" = %3
    output "m" = %2
  }} : f32[n], f32[n]
  output "a" = %2
  output "m" = %3
}
"#;

#[test]
fn interpreter_runs_the_body() {
    let g = parse(FUSED).expect("parses");
    verify(&g).expect("valid");
    let x = Tensor::from_vec(vec![3], vec![1.0f32, -2.0, 3.0]).expect("tensor");
    let y = Tensor::from_vec(vec![3], vec![2.0f32, 2.0, -1.0]).expect("tensor");
    let inputs = BTreeMap::from([("x".to_string(), x), ("y".to_string(), y)]);
    let out = interp::run(&g, &inputs).expect("runs");
    assert_eq!(out[0].1, Tensor::from_vec(vec![3], vec![2.0f32, 0.0, 0.0]).expect("tensor"));
    assert_eq!(out[1].1, Tensor::from_vec(vec![3], vec![2.0f32, -4.0, -3.0]).expect("tensor"));
}

#[test]
fn parse_errors_inside_a_body() {
    let bad = FUSED.replace("%2 = mul %0, %1", "%2 = mul %0, %9");
    let e = parse(&bad).expect_err("undefined value");
    assert_eq!((e.line, e.col), (7, 18), "{e}");
    assert!(e.message.contains("undefined value `%9`"), "{e}");
    let bad = FUSED.replace(r#"{name="p1"}"#, r#"{name="q"}"#);
    let e = parse(&bad).expect_err("misnamed input");
    assert!(e.message.contains("body input 1 is named \"q\", not \"p1\""), "{e}");
    let bad = FUSED.replace("%1 = input {name=\"y\"} : f32[n]", "%1 = input {name=\"y\"} : f32[m]");
    let e = parse(&bad).expect_err("type mismatch");
    assert!(e.message.contains("operand 1 is f32[m], but body input p1 is f32[n]"), "{e}");
}

#[test]
fn verifier_names_the_fusion_node() {
    let mut g = parse(FUSED).expect("parses");
    let id = g.node_ids().find(|&id| g.node(id).op.mnemonic() == "fusion").expect("fusion node");
    if let kiln_ir::Op::Fusion(f) = g.node_mut(id).op {
        f.body.0.set_outputs(Vec::new());
    }
    let errs = verify(&g).expect_err("broken body");
    let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert!(text.iter().any(|e| e.starts_with("fusion n2: body: the body has no outputs")), "{text:?}");
    assert!(errs.iter().all(|e| e.kind.name() == "fusion-body"), "{text:?}");
}
