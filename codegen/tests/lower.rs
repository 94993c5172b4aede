//! Differential tests of lowering: each case is a small `.kir` graph lowered as one group; the kernel's
//! reference evaluation must equal the interpreter's results on random inputs (exact for integers and bools,
//! within 1e-6 relative for floats — most are exact).

mod common;

use common::{check_kir, lower_whole, whole_group};
use kiln_codegen::kernel::{self, LowerError};
use kiln_ir::op::{BinaryOp, UnaryOp};
use kiln_ir::{DType, Op, TensorType};

/// (case name, `.kir` text, symbol bindings).
type Case = (&'static str, &'static str, &'static [(&'static str, u64)]);

const CASES: &[Case] = &[
    (
        "elementwise chain",
        r#"graph "g" {
          %0 = input {name="x"} : f32[3,4]
          %1 = neg %0 : f32[3,4]
          %2 = exp %1 : f32[3,4]
          %3 = tanh %2 : f32[3,4]
          %4 = mul %3, %0 : f32[3,4]
          %5 = sigmoid %4 : f32[3,4]
          output "y" = %5
        }"#,
        &[],
    ),
    (
        "broadcast row, column and scalar",
        r#"graph "g" {
          %0 = input {name="x"} : f32[2,3]
          %1 = input {name="row"} : f32[3]
          %2 = input {name="col"} : f32[2,1]
          %3 = constant {value=f32[] [2.0]} : f32[]
          %4 = add %0, %1 : f32[2,3]
          %5 = mul %4, %2 : f32[2,3]
          %6 = sub %5, %3 : f32[2,3]
          output "y" = %6
        }"#,
        &[],
    ),
    (
        "rank-extending broadcast of size-1 dims",
        r#"graph "g" {
          %0 = input {name="a"} : f32[2,1,3]
          %1 = input {name="b"} : f32[4,1]
          %2 = add %0, %1 : f32[2,4,3]
          %3 = broadcast %1 {shape=[3,4,5]} : f32[3,4,5]
          output "y" = %2
          output "z" = %3
        }"#,
        &[],
    ),
    (
        "zero-size dims",
        r#"graph "g" {
          %0 = input {name="x"} : f32[0,3]
          %1 = input {name="b"} : f32[3]
          %2 = add %0, %1 : f32[0,3]
          %3 = input {name="e"} : f32[2,0]
          %4 = reduce %3 {kind=sum, axes=[1], keep_dims=false} : f32[2]
          %5 = reduce %3 {kind=max, axes=[1], keep_dims=true} : f32[2,1]
          %6 = reduce %3 {kind=prod, axes=[0], keep_dims=false} : f32[0]
          output "y" = %2
          output "s" = %4
          output "m" = %5
          output "p" = %6
        }"#,
        &[],
    ),
    (
        "symbolic batch",
        r#"graph "g" {
          %0 = input {name="x"} : f32[batch,3]
          %1 = constant {value=f32[3] [0.5, -1.0, 2.0]} : f32[3]
          %2 = mul %0, %1 : f32[batch,3]
          %3 = relu %2 : f32[batch,3]
          %4 = reduce %3 {kind=sum, axes=[-1], keep_dims=true} : f32[batch,1]
          %5 = div %3, %4 : f32[batch,3]
          output "y" = %5
        }"#,
        &[("batch", 4)],
    ),
    ("symbolic batch of zero", SYMBOLIC_SOFTMAX, &[("batch", 0)]),
    ("symbolic batch of one", SYMBOLIC_SOFTMAX, &[("batch", 1)]),
    ("symbolic batch of five", SYMBOLIC_SOFTMAX, &[("batch", 5)]),
    (
        "float reductions with keep_dims and negative axes",
        r#"graph "g" {
          %0 = input {name="x"} : f32[2,3,4]
          %1 = reduce %0 {kind=sum, axes=[1], keep_dims=true} : f32[2,1,4]
          %2 = reduce %0 {kind=mean, axes=[0, -1], keep_dims=false} : f32[3]
          %3 = reduce %0 {kind=max, axes=[-1], keep_dims=false} : f32[2,3]
          %4 = reduce %0 {kind=min, axes=[-2, -1], keep_dims=true} : f32[2,1,1]
          %5 = reduce %0 {kind=prod, axes=[0, 1, 2], keep_dims=false} : f32[]
          %6 = reduce %0 {kind=sum, axes=[], keep_dims=false} : f32[2,3,4]
          output "sum" = %1
          output "mean" = %2
          output "max" = %3
          output "min" = %4
          output "prod" = %5
          output "identity" = %6
        }"#,
        &[],
    ),
    (
        "integer and bool reductions",
        r#"graph "g" {
          %0 = input {name="x"} : i32[3,4]
          %1 = reduce %0 {kind=sum, axes=[1], keep_dims=false} : i32[3]
          %2 = reduce %0 {kind=mean, axes=[0], keep_dims=false} : i32[4]
          %3 = reduce %0 {kind=max, axes=[0, 1], keep_dims=false} : i32[]
          %4 = reduce %0 {kind=prod, axes=[1], keep_dims=true} : i32[3,1]
          %5 = input {name="b"} : bool[2,3]
          %6 = reduce %5 {kind=max, axes=[1], keep_dims=false} : bool[2]
          %7 = reduce %5 {kind=min, axes=[0], keep_dims=false} : bool[3]
          %8 = input {name="u"} : u8[5]
          %9 = reduce %8 {kind=min, axes=[0], keep_dims=false} : u8[]
          %10 = reduce %8 {kind=mean, axes=[0], keep_dims=false} : u8[]
          output "sum" = %1
          output "mean" = %2
          output "max" = %3
          output "prod" = %4
          output "any" = %6
          output "all" = %7
          output "umin" = %9
          output "umean" = %10
        }"#,
        &[],
    ),
    (
        "f16 and bf16 reductions round once",
        r#"graph "g" {
          %0 = input {name="x"} : f16[4,8]
          %1 = reduce %0 {kind=sum, axes=[1], keep_dims=false} : f16[4]
          %2 = reduce %0 {kind=mean, axes=[0], keep_dims=false} : f16[8]
          %3 = input {name="y"} : bf16[3,5]
          %4 = reduce %3 {kind=prod, axes=[1], keep_dims=false} : bf16[3]
          output "sum" = %1
          output "mean" = %2
          output "prod" = %4
        }"#,
        &[],
    ),
    (
        "arg_reduce",
        r#"graph "g" {
          %0 = input {name="x"} : f32[2,3,4]
          %1 = arg_reduce %0 {kind=max, axis=2, keep_dims=false, select_last_index=false} : i64[2,3]
          %2 = arg_reduce %0 {kind=min, axis=-2, keep_dims=true, select_last_index=true} : i64[2,1,4]
          %3 = input {name="i"} : i32[3,5]
          %4 = arg_reduce %3 {kind=max, axis=1, keep_dims=false, select_last_index=true} : i64[3]
          %5 = arg_reduce %3 {kind=min, axis=0, keep_dims=false, select_last_index=false} : i64[5]
          output "amax" = %1
          output "amin" = %2
          output "imax" = %4
          output "imin" = %5
        }"#,
        &[],
    ),
    (
        "softmax and log_softmax on several axes",
        r#"graph "g" {
          %0 = input {name="x"} : f32[2,3,4]
          %1 = softmax %0 {axis=-1} : f32[2,3,4]
          %2 = softmax %0 {axis=1} : f32[2,3,4]
          %3 = log_softmax %0 {axis=0} : f32[2,3,4]
          %4 = input {name="h"} : f16[3,5]
          %5 = softmax %4 {axis=1} : f16[3,5]
          %6 = input {name="s"} : f64[]
          %7 = log_softmax %6 {axis=0} : f64[]
          output "last" = %1
          output "middle" = %2
          output "first" = %3
          output "half" = %5
          output "scalar" = %7
        }"#,
        &[],
    ),
    (
        "softmax of softmax",
        r#"graph "g" {
          %0 = input {name="x"} : f32[3,4]
          %1 = softmax %0 {axis=1} : f32[3,4]
          %2 = mul %1, %0 : f32[3,4]
          %3 = softmax %2 {axis=0} : f32[3,4]
          output "y" = %3
        }"#,
        &[],
    ),
    (
        "layer_norm with and without bias",
        r#"graph "g" {
          %0 = input {name="x"} : f32[2,3,4]
          %1 = input {name="scale"} : f32[4]
          %2 = input {name="bias"} : f32[4]
          %3 = layer_norm %0, %1, %2 {axis=-1, epsilon=1e-5} : f32[2,3,4]
          %4 = input {name="s2"} : f32[3,1]
          %5 = layer_norm %0, %4 {axis=1, epsilon=0.001} : f32[2,3,4]
          %6 = input {name="h"} : bf16[2,6]
          %7 = input {name="hs"} : bf16[6]
          %8 = layer_norm %6, %7 {axis=1, epsilon=1e-5} : bf16[2,6]
          output "last" = %3
          output "two" = %5
          output "brain" = %8
        }"#,
        &[],
    ),
    (
        "gelu and batch_norm",
        r#"graph "g" {
          %0 = input {name="x"} : f32[2,3,2]
          %1 = gelu %0 {approximate=none} : f32[2,3,2]
          %2 = gelu %0 {approximate=tanh} : f32[2,3,2]
          %3 = constant {value=f32[3] [1.0, 2.0, 0.5]} : f32[3]
          %4 = constant {value=f32[3] [0.0, 0.1, -0.1]} : f32[3]
          %5 = constant {value=f32[3] [0.2, -0.2, 0.0]} : f32[3]
          %6 = constant {value=f32[3] [1.0, 0.5, 2.0]} : f32[3]
          %7 = batch_norm %0, %3, %4, %5, %6 {epsilon=1e-5} : f32[2,3,2]
          output "exact" = %1
          output "approx" = %2
          output "bn" = %7
        }"#,
        &[],
    ),
    (
        "transpose and reshape in the middle of a chain",
        r#"graph "g" {
          %0 = input {name="x"} : f32[2,3]
          %1 = exp %0 : f32[2,3]
          %2 = transpose %1 {perm=[1, 0]} : f32[3,2]
          %3 = input {name="y"} : f32[3,2]
          %4 = add %2, %3 : f32[3,2]
          %5 = reshape %4 {shape=[6]} : f32[6]
          %6 = neg %5 : f32[6]
          %7 = reshape %6 {shape=[2,1,3]} : f32[2,1,3]
          %8 = transpose %7 {perm=[2, 0, 1]} : f32[3,2,1]
          output "y" = %8
        }"#,
        &[],
    ),
    (
        "symbolic reshapes",
        r#"graph "g" {
          %0 = input {name="x"} : f32[batch,4,6]
          %1 = reshape %0 {shape=[batch,24]} : f32[batch,24]
          %2 = sin %1 : f32[batch,24]
          %3 = reshape %2 {shape=[batch,2,12,1]} : f32[batch,2,12,1]
          %4 = reduce %3 {kind=sum, axes=[2], keep_dims=false} : f32[batch,2,1]
          output "y" = %4
          output "z" = %3
        }"#,
        &[("batch", 3)],
    ),
    (
        "pad modes",
        r#"graph "g" {
          %0 = input {name="x"} : f32[2,3]
          %1 = pad %0 {mode=constant, pads=[0, 1, 1, 0], value=-1.5} : f32[3,4]
          %2 = pad %0 {mode=reflect, pads=[1, 2, 0, 2], value=0.0} : f32[3,7]
          %3 = pad %0 {mode=edge, pads=[1, 0, 2, 3], value=0.0} : f32[5,6]
          %4 = pad %0 {mode=constant, pads=[0, -1, 0, 1], value=7.0} : f32[2,3]
          %5 = sqrt %1 : f32[3,4]
          output "constant" = %5
          output "reflect" = %2
          output "edge" = %3
          output "crop" = %4
        }"#,
        &[],
    ),
    (
        "concat, slice and split",
        r#"graph "g" {
          %0 = input {name="a"} : f32[2,3]
          %1 = input {name="b"} : f32[2,1]
          %2 = input {name="c"} : f32[2,0]
          %3 = exp %1 : f32[2,1]
          %4 = concat %0, %2, %3, %0 {axis=1} : f32[2,7]
          %5 = slice %4 {starts=[-1, 6], ends=[-5, 0], axes=[0, 1], steps=[-1, -2]} : f32[2,3]
          %6, %7 = split %4 {axis=-1, sizes=[2, 5]} : f32[2,2], f32[2,5]
          %8 = concat %0, %0 {axis=0} : f32[4,3]
          output "cat" = %4
          output "sliced" = %5
          output "right" = %7
          output "rows" = %8
        }"#,
        &[],
    ),
    (
        "multi-output group sharing a value",
        r#"graph "g" {
          %0 = input {name="x"} : f32[3,4]
          %1 = exp %0 : f32[3,4]
          %2 = reduce %1 {kind=sum, axes=[1], keep_dims=false} : f32[3]
          %3 = mul %1, %1 : f32[3,4]
          %4 = reduce %1 {kind=max, axes=[0], keep_dims=true} : f32[1,4]
          output "e" = %1
          output "rowsum" = %2
          output "sq" = %3
          output "colmax" = %4
        }"#,
        &[],
    ),
    (
        "iota, shape_of, casts and select",
        r#"graph "g" {
          %0 = input {name="x"} : f32[batch,5]
          %1 = shape_of %0 : i64[2]
          %2 = iota {dtype=i64, shape=[5], axis=0, start=0.0, step=1.0} : i64[5]
          %3 = iota {dtype=f16, shape=[2,3], axis=1, start=-1.0, step=0.3} : f16[2,3]
          %4 = cast %2 {to=f32} : f32[5]
          %5 = add %0, %4 : f32[batch,5]
          %6 = constant {value=f32[] [2.5]} : f32[]
          %7 = lt %5, %6 : bool[batch,5]
          %8 = select %7, %5, %0 : f32[batch,5]
          %9 = cast %8 {to=i8} : i8[batch,5]
          %10 = cast %8 {to=bf16} : bf16[batch,5]
          output "shape" = %1
          output "ramp" = %3
          output "picked" = %9
          output "brain" = %10
        }"#,
        &[("batch", 3)],
    ),
    (
        "integer arithmetic wraps",
        r#"graph "g" {
          %0 = input {name="a"} : i8[6]
          %1 = constant {value=i8[] [100]} : i8[]
          %2 = mul %0, %1 : i8[6]
          %3 = constant {value=i8[] [1]} : i8[]
          %4 = add %0, %3 : i8[6]
          %5 = div %2, %4 : i8[6]
          %6 = mod %2, %4 : i8[6]
          %7 = neg %2 : i8[6]
          output "div" = %5
          output "mod" = %6
          output "neg" = %7
        }"#,
        &[],
    ),
];

const SYMBOLIC_SOFTMAX: &str = r#"graph "g" {
  %0 = input {name="x"} : f32[batch,6]
  %1 = input {name="b"} : f32[batch,1]
  %2 = add %0, %1 : f32[batch,6]
  %3 = softmax %2 {axis=1} : f32[batch,6]
  %4 = reduce %3 {kind=max, axes=[0], keep_dims=false} : f32[6]
  output "y" = %3
  output "colmax" = %4
}"#;

#[test]
fn lowered_kernels_match_the_interpreter() {
    for (name, text, bindings) in CASES {
        check_kir(name, text, bindings);
    }
}

/// The dtypes (by name) the type rules accept for `op` applied to `arity` operands of one dtype, with the result
/// dtype: the test follows the op table instead of restating which kind takes which types.
fn accepted(op: &Op, arity: usize, dims: &[u64]) -> Vec<(&'static str, &'static str)> {
    DType::ALL
        .iter()
        .filter_map(|&dt| {
            let ins = vec![TensorType::of(dt, dims); arity];
            kiln_ir::infer::infer(op, &ins).ok().map(|out| (dt.name(), out[0].dtype.name()))
        })
        .collect()
}

/// Every elementwise kind on every dtype it accepts, as a one-node graph.
#[test]
fn every_elementwise_kind_matches() {
    for k in UnaryOp::ALL {
        let dtypes = accepted(&Op::Unary(*k), 1, &[7]);
        assert!(!dtypes.is_empty(), "{} accepts no dtype", k.name());
        for (dt, out) in dtypes {
            let text = format!(
                "graph \"g\" {{\n %0 = input {{name=\"x\"}} : {dt}[7]\n %1 = {} %0 : {out}[7]\n output \"y\" = %1\n}}",
                k.name()
            );
            check_kir(&format!("{} on {dt}", k.name()), &text, &[]);
        }
    }
    for k in BinaryOp::ALL {
        let dtypes = accepted(&Op::Binary(*k), 2, &[3, 4]);
        assert!(!dtypes.is_empty(), "{} accepts no dtype", k.name());
        for (dt, out) in dtypes {
            // Integer divisors are shifted to 1..=10 so that no division by zero happens.
            let int = DType::from_name(dt).is_some_and(DType::is_int);
            let (shift, rhs) = if int {
                (format!(" %2 = constant {{value={dt}[] [1]}} : {dt}[]\n %3 = add %1, %2 : {dt}[3,4]\n"), "%3")
            } else {
                (String::new(), "%1")
            };
            let text = format!(
                "graph \"g\" {{\n %0 = input {{name=\"a\"}} : {dt}[3,4]\n %1 = input {{name=\"b\"}} : {dt}[3,4]\n\
                 {shift} %4 = {} %0, {rhs} : {out}[3,4]\n output \"y\" = %4\n}}",
                k.name()
            );
            check_kir(&format!("{} on {dt}", k.name()), &text, &[]);
        }
    }
}

#[test]
fn library_ops_are_unsupported() {
    let g = kiln_ir::parse(
        r#"graph "g" {
          %0 = input {name="x"} : f32[2,3]
          %1 = input {name="w"} : f32[3,4]
          %2 = matmul %0, %1 : f32[2,4] @"/fc/MatMul"
          %3 = relu %2 : f32[2,4]
          output "y" = %3
        }"#,
    )
    .unwrap();
    let err = lower_whole(&g, "mm").unwrap_err();
    assert_eq!(err, LowerError::Unsupported { node: "matmul `/fc/MatMul`".into(), op: "matmul".into() });
}

#[test]
fn shared_space_policy_rejects_unrelated_outputs() {
    let g = kiln_ir::parse(
        r#"graph "g" {
          %0 = input {name="x"} : f32[2,3]
          %1 = exp %0 : f32[2,3]
          %2 = reduce %1 {kind=sum, axes=[0], keep_dims=false} : f32[3]
          %3 = transpose %1 {perm=[1, 0]} : f32[3,2]
          output "e" = %1
          output "s" = %2
          output "t" = %3
        }"#,
    )
    .unwrap();
    let group = whole_group(&g);
    // Without the transpose, the outputs are `e` and its column sum: one space, [2,3].
    kernel::lower(&g, &group[..2], "ok").unwrap();
    let err = kernel::lower(&g, &group, "bad").unwrap_err();
    match err {
        LowerError::NotLowerable { node, reason } => {
            assert!(node.starts_with("transpose"), "{node}");
            assert!(reason.contains("iteration space [3,2]"), "{reason}");
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn partial_groups_take_outside_values_as_inputs() {
    let g = kiln_ir::parse(
        r#"graph "g" {
          %0 = input {name="x"} : f32[2,3]
          %1 = exp %0 : f32[2,3]
          %2 = neg %1 : f32[2,3]
          %3 = softmax %2 {axis=1} : f32[2,3]
          output "y" = %3
          output "n" = %2
        }"#,
    )
    .unwrap();
    let ids = whole_group(&g);
    // Only the softmax: `neg`'s result comes in as an input, and `y` goes out.
    let k = kernel::lower(&g, &ids[2..], "tail").unwrap();
    let roles: Vec<String> = k.args.iter().map(|a| format!("{:?} {}", a.role, a.name)).collect();
    assert_eq!(roles, vec!["Input n2.0".to_string(), "Output y".to_string()]);
    // The first two: `neg` is both a graph output and used by the softmax outside the group.
    let k = kernel::lower(&g, &ids[..2], "head").unwrap();
    let names: Vec<&str> = k.args.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, vec!["x", "n"]);
}

#[test]
fn malformed_groups_and_unlowerable_uses_are_errors() {
    let g = kiln_ir::parse(
        r#"graph "g" {
          %0 = input {name="x"} : i64[2,3]
          %1 = reduce %0 {kind=mean, axes=[1], keep_dims=false} : i64[2]
          output "m" = %1
        }"#,
    )
    .unwrap();
    let all: Vec<_> = g.node_ids().collect();
    assert!(matches!(kernel::lower(&g, &all, "k"), Err(LowerError::InvalidGroup(_))));
    assert!(matches!(kernel::lower(&g, &[], "k"), Err(LowerError::InvalidGroup(_))));
    match kernel::lower(&g, &whole_group(&g), "k") {
        Err(LowerError::NotLowerable { node, reason }) => {
            assert!(node.starts_with("reduce") && reason.contains("i64 mean"), "{node}: {reason}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn the_evaluator_reports_bad_launches() {
    let g = kiln_ir::parse(
        r#"graph "g" {
          %0 = input {name="x"} : f32[batch,3]
          %1 = exp %0 : f32[batch,3]
          output "y" = %1
        }"#,
    )
    .unwrap();
    let k = kernel::lower(&g, &whole_group(&g), "k").unwrap();
    let x = kiln_ir::Tensor::zeros(kiln_ir::DType::F32, vec![2, 3]);
    let y = kiln_ir::Tensor::zeros(kiln_ir::DType::F32, vec![2, 3]);
    let err = kernel::eval(&k, &mut [x.clone()], &[2]).unwrap_err();
    assert!(err.message.contains("launch argument"), "{err}");
    let err = kernel::eval(&k, &mut [x.clone(), y.clone()], &[]).unwrap_err();
    assert!(err.message.contains("symbol"), "{err}");
    let err = kernel::eval(&k, &mut [x.clone(), y.clone()], &[4]).unwrap_err();
    assert!(err.message.contains("should be f32[4, 3]"), "{err}");
    let mut args = [x, y];
    kernel::eval(&k, &mut args, &[2]).unwrap();
    assert_eq!(args[1].to_f64_vec(), vec![1.0; 6]);
}

/// Sibling reductions over one tensor (a dynamic quantization's range) fold in one sweep: one nest with both
/// accumulators, the lets between moved after it; a reduction that reads such a let, or a nest that stores, is
/// left apart. Results are the interpreter's either way.
#[test]
fn sibling_reductions_share_one_sweep() {
    let text = r#"graph "g" {
      %0 = input {name="x"} : f32[batch,16]
      %1 = reduce %0 {kind=min, axes=[0, 1], keep_dims=false} : f32[]
      %2 = reduce %0 {kind=max, axes=[0, 1], keep_dims=false} : f32[]
      %3 = sub %2, %1 : f32[]
      %4 = div %0, %3 : f32[batch,16]
      %5 = reduce %4 {kind=sum, axes=[0, 1], keep_dims=false} : f32[]
      output "range" = %3
      output "scaled" = %4
      output "total" = %5
    }"#;
    let k = check_kir("siblings", text, &[("batch", 5)]);
    let printed = kernel::print(&k);
    let top_level_fors = printed.lines().filter(|l| l.starts_with("  for ")).count();
    // min+max share a nest; the scaled store and the sum of scaled values (it reads the range) stay apart.
    assert_eq!(top_level_fors, 3, "{printed}");
    // The first nest folds into two accumulators.
    let first_nest: Vec<&str> = printed
        .lines()
        .skip_while(|l| !l.starts_with("  for "))
        .skip(1)
        .take_while(|l| !l.starts_with("  ") || l.starts_with("   "))
        .collect();
    assert_eq!(first_nest.iter().filter(|l| l.contains("<-")).count(), 2, "{printed}");
}
