//! The ONNX importer on small, valid models built in Rust: symbolic `dim_param` inputs, shape arithmetic folded at
//! import time (and tracked dim by dim under a symbolic batch), `If` on a known condition, external data, and the
//! complete list of unsupported ops. Each case checks the imported graph's structure and, where it computes
//! numbers, runs it on the reference interpreter.

mod model;

use std::collections::BTreeMap;

use kiln_ir::{Dim, Graph, Op, Shape, Tensor};
use kiln_onnx::{ImportError, ImportOptions};
use model::*;

fn import(bytes: &[u8]) -> Graph {
    kiln_onnx::import_bytes(bytes, None, &ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn input_shape(g: &Graph, name: &str) -> Shape {
    g.inputs()
        .iter()
        .map(|&id| g.node(id))
        .find(|n| matches!(&n.op, Op::Input(i) if i.name == name))
        .unwrap_or_else(|| panic!("no input `{name}`"))
        .outputs[0]
        .shape
        .clone()
}

fn output_shape(g: &Graph, name: &str) -> Shape {
    let (_, v) = g.outputs().iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no output `{name}`"));
    g.value_type(*v).unwrap().shape.clone()
}

fn mnemonics(g: &Graph) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = g.node_ids().map(|id| g.node(id).op.mnemonic()).collect();
    v.sort_unstable();
    v
}

fn run(g: &Graph, inputs: &[(&str, Tensor)]) -> BTreeMap<String, Tensor> {
    let inputs: BTreeMap<String, Tensor> = inputs.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    kiln_ir::interp::run(g, &inputs).unwrap().into_iter().collect()
}

fn iota_f32(shape: Vec<usize>) -> Tensor {
    let n = shape.iter().product::<usize>();
    Tensor::from_vec(shape, (0..n).map(|i| i as f32).collect()).unwrap()
}

#[test]
fn dim_params_become_symbolic_dims() {
    let g = import(&relu_model(&["batch", "3"]).bytes());
    assert_eq!(input_shape(&g, "x"), Shape(vec![Dim::sym("batch"), Dim::Static(3)]));
    assert_eq!(output_shape(&g, "y"), Shape(vec![Dim::sym("batch"), Dim::Static(3)]));
    // Names that are not identifiers are sanitized; a dim with neither value nor param gets a name of its own.
    let mut m = relu_model(&["batch size", "3"]).model();
    let graph = m.graph.as_mut().unwrap();
    let onnx_protobuf::type_proto::Value::TensorType(tt) =
        graph.input[0].type_.as_mut().unwrap().value.as_mut().unwrap()
    else {
        unreachable!("built as a tensor input")
    };
    tt.shape.as_mut().unwrap().dim.push(Default::default());
    let g = import(&onnx_protobuf::Message::write_to_bytes(&m).unwrap());
    assert_eq!(input_shape(&g, "x"), Shape(vec![Dim::sym("batch_size"), Dim::Static(3), Dim::sym("x_2")]));
    // A given static shape replaces the symbols.
    let options = ImportOptions { shapes: BTreeMap::from([("x".to_string(), vec![5, 3])]), ..Default::default() };
    let g = kiln_onnx::import_bytes(&relu_model(&["batch", "3"]).bytes(), None, &options).unwrap();
    assert_eq!(output_shape(&g, "y"), Shape::of(&[5, 3]));
}

#[test]
fn shape_chain_with_static_shapes_folds_to_a_constant_target() {
    let g = import(&flatten_chain(&["2", "3", "4"]).bytes());
    let ops = mnemonics(&g);
    assert!(!ops.contains(&"shape_of") && !ops.contains(&"gather") && !ops.contains(&"concat"), "{ops:?}");
    // Folded shape arithmetic leaves dead constants behind for DCE; the only computation left is the reshape.
    let computing: Vec<&str> = ops.into_iter().filter(|m| !matches!(*m, "input" | "constant")).collect();
    assert_eq!(computing, ["reshape"], "{}", kiln_ir::print(&g));
    assert_eq!(output_shape(&g, "y"), Shape::of(&[2, 12]));
    let y = &run(&g, &[("x", iota_f32(vec![2, 3, 4]))])["y"];
    assert_eq!(y, &iota_f32(vec![2, 12]));
}

#[test]
fn shape_chain_with_a_symbolic_batch_resolves() {
    let g = import(&flatten_chain(&["batch", "3", "4"]).bytes());
    assert_eq!(output_shape(&g, "y"), Shape(vec![Dim::sym("batch"), Dim::Static(12)]));
    for batch in [1, 5] {
        let y = &run(&g, &[("x", iota_f32(vec![batch, 3, 4]))])["y"];
        assert_eq!(y, &iota_f32(vec![batch, 12]), "batch {batch}");
    }
}

#[test]
fn if_on_a_constant_condition_inlines_the_taken_branch() {
    let x = Tensor::from_vec(vec![3], vec![-1.0f32, 2.0, -3.0]).unwrap();
    for (cond, op, other, want) in [(true, "neg", "abs", [1.0f32, -2.0, 3.0]), (false, "abs", "neg", [1.0, 2.0, 3.0])] {
        let g = import(&if_model(cond).bytes());
        let ops = mnemonics(&g);
        assert!(ops.contains(&op) && !ops.contains(&other), "cond {cond}: {ops:?}");
        assert_eq!(run(&g, &[("x", x.clone())])["y"].as_slice::<f32>().unwrap(), &want, "cond {cond}");
    }
}

#[test]
fn external_data_inside_the_model_folder_loads() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let w = [0.5f32, -1.0, 2.0, 4.0];
    // Eight bytes of something else first, so the offset matters.
    let mut file = vec![0xAAu8; 8];
    file.extend(w.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(dir.path().join("data/weights.bin"), &file).unwrap();
    let bytes = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["4"])
        .initializer(tensor_f32_external("w", &[4], "data/weights.bin", Some(8)))
        .node(node("add", "Add", &["x", "w"], &["y"]))
        .output("y")
        .bytes();
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, bytes).unwrap();
    let g = kiln_onnx::import(&path, &ImportOptions::default()).unwrap();
    let y = &run(&g, &[("x", Tensor::from_vec(vec![4], vec![1.0f32; 4]).unwrap())])["y"];
    assert_eq!(y.as_slice::<f32>().unwrap(), &[1.5, 0.0, 3.0, 5.0]);
}

#[test]
fn every_unsupported_op_is_listed_by_node() {
    let bytes = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["4"])
        .node(node("det", "Det", &["x"], &["idx"]))
        .node(node("relu", "Relu", &["x"], &["r"]))
        .node(node("bern", "Bernoulli", &["r"], &["u"]))
        // Fed by an unsupported node: not reported again.
        .node(node("cast", "Cast", &["idx"], &["c"]))
        .output("c")
        .output("u")
        .bytes();
    let err = kiln_onnx::import_bytes(&bytes, None, &ImportOptions::default()).unwrap_err();
    let ImportError::Unsupported(list) = &err else { panic!("expected Unsupported, got {err}") };
    let found: Vec<(&str, &str)> = list.iter().map(|u| (u.node.as_str(), u.op_type.as_str())).collect();
    assert_eq!(found, [("det", "Det"), ("bern", "Bernoulli")]);
    insta::assert_snapshot!("two_unsupported_ops", err.to_string());

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, &bytes).unwrap();
    let checked = kiln_onnx::check(&path, &ImportOptions::default()).unwrap();
    assert_eq!(&checked, list);
    std::fs::write(&path, relu_model(&["4"]).bytes()).unwrap();
    assert_eq!(kiln_onnx::check(&path, &ImportOptions::default()).unwrap(), []);
}

#[test]
fn huge_constant_of_shape_is_built_not_folded() {
    // Folding would materialize 2^31 floats; the op stays in the graph, typed, for the backend to handle.
    let bytes = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["1"])
        .node(constant("shape", "s", tensor_i64("", &[1], &[i32::MAX as i64])))
        .node(node("fill", "ConstantOfShape", &["s"], &["y"]))
        .output("y")
        .bytes();
    let g = import(&bytes);
    assert_eq!(output_shape(&g, "y"), Shape::of(&[i32::MAX as u64]));
    assert!(mnemonics(&g).contains(&"broadcast"), "{}", kiln_ir::print(&g));
}

/// `If` on a run-time condition becomes an `if` region. The branches read the enclosing graph's input and a large
/// initializer (captured as operands, not copied), and one holds a large initializer of its own (hoisted to a
/// weight of the model and captured: region bodies hold no parameters). Both branches bind one operand list.
#[test]
fn if_on_a_run_time_condition_is_a_region_with_captures() {
    let w: Vec<f32> = (0..100).map(|i| i as f32 * 0.5).collect();
    let own: Vec<f32> = (0..100).map(|i| 100.0 - i as f32).collect();
    let then_branch = ModelBuilder::new("then").node(node("mul", "Mul", &["x", "w"], &["t"])).output("t").graph();
    let else_branch = ModelBuilder::new("else")
        .initializer(tensor_f32("own", &[100], &own))
        .node(node("add", "Add", &["x", "own"], &["e"]))
        .output("e")
        .graph();
    let iff = with_attr(
        with_attr(node("if", "If", &["c"], &["y"]), attr_graph("then_branch", then_branch)),
        attr_graph("else_branch", else_branch),
    );
    let bytes = ModelBuilder::new("g")
        .input("c", dtype::BOOL, &[])
        .input("x", dtype::FLOAT, &["100"])
        .initializer(tensor_f32("w", &[100], &w))
        .node(iff)
        .output("y")
        .bytes();
    let g = import(&bytes);
    let node = g.node_ids().map(|id| g.node(id)).find(|n| matches!(n.op, Op::If(_))).expect("an if node");
    let Op::If(op) = &node.op else { unreachable!() };
    for body in [&op.then_branch, &op.else_branch] {
        assert!(body.0.params().next().is_none(), "{}", body.text());
        assert_eq!(body.0.inputs().len(), node.inputs.len() - 1, "{}", body.text());
    }
    assert_eq!(g.params().count(), 2, "the weight and the hoisted initializer");
    let x = Tensor::from_vec(vec![100], vec![2.0f32; 100]).unwrap();
    let y = &run(&g, &[("c", Tensor::scalar(true)), ("x", x.clone())])["y"];
    assert_eq!(y.as_slice::<f32>().unwrap()[..3], [0.0, 1.0, 2.0]);
    let y = &run(&g, &[("c", Tensor::scalar(false)), ("x", x)])["y"];
    assert_eq!(y.as_slice::<f32>().unwrap()[..3], [102.0, 101.0, 100.0]);
}

/// `Loop` with a trip count and a condition: a carried vector that grows every iteration gets a body symbol of its
/// own and a data-dependent result extent; a scan output stacks per-iteration values; an `If` nested in the body
/// reads a value two graphs out.
#[test]
fn loops_carry_growing_values_and_nest_regions() {
    let inner_then = ModelBuilder::new("t").node(node("neg", "Neg", &["k"], &["kt"])).output("kt").graph();
    let inner_else = ModelBuilder::new("e").node(node("id", "Identity", &["k"], &["ke"])).output("ke").graph();
    let body = ModelBuilder::new("body")
        .input("i", dtype::INT64, &[])
        .input("c_in", dtype::BOOL, &[])
        .input("acc_in", dtype::FLOAT, &["1"])
        .node(with_attr(node("cast", "Cast", &["i"], &["fi"]), attr_int("to", 1)))
        .node(constant("ax", "ax", tensor_i64("", &[1], &[0])))
        .node(node("unsq", "Unsqueeze", &["fi", "ax"], &["fi1"]))
        .node(with_attr(node("cat", "Concat", &["acc_in", "fi1"], &["acc_out"]), attr_int("axis", 0)))
        .node(node("pos", "Greater", &["fi", "limit"], &["big"]))
        .node(with_attr(
            with_attr(node("if", "If", &["big"], &["kk"]), attr_graph("then_branch", inner_then)),
            attr_graph("else_branch", inner_else),
        ))
        .node(node("keep", "Identity", &["c_in"], &["c_out"]))
        .output("c_out")
        .output("acc_out")
        .output("kk")
        .graph();
    let lp = with_attr(node("loop", "Loop", &["m", "", "acc0"], &["acc", "ks"]), attr_graph("body", body));
    let bytes = ModelBuilder::new("g")
        .input("m", dtype::INT64, &[])
        .input("k", dtype::FLOAT, &["2"])
        .initializer(tensor_f32("acc0", &[1], &[7.0]))
        .initializer(tensor_f32("limit", &[], &[1.0]))
        .node(lp)
        .output("acc")
        .output("ks")
        .bytes();
    let g = import(&bytes);
    assert!(mnemonics(&g).contains(&"loop"), "{:?}", mnemonics(&g));
    let k = Tensor::from_vec(vec![2], vec![1.0f32, -3.0]).unwrap();
    let out = run(&g, &[("m", Tensor::scalar(4i64)), ("k", k.clone())]);
    assert_eq!(out["acc"].as_slice::<f32>().unwrap(), &[7.0, 0.0, 1.0, 2.0, 3.0]);
    assert_eq!(out["ks"].shape(), &[4, 2]);
    assert_eq!(out["ks"].as_slice::<f32>().unwrap(), &[1.0, -3.0, 1.0, -3.0, -1.0, 3.0, -1.0, 3.0]);
    let out = run(&g, &[("m", Tensor::scalar(0i64)), ("k", k)]);
    assert_eq!(out["acc"].as_slice::<f32>().unwrap(), &[7.0]);
    assert_eq!(out["ks"].shape(), &[0, 2]);
}

/// Subgraphs nested past `MAX_NESTING` are a problem named at the node, never unbounded recursion.
#[test]
fn subgraphs_nested_too_deep_are_refused() {
    let leaf = ModelBuilder::new("leaf").node(node("neg", "Neg", &["x"], &["y0"])).output("y0").graph();
    let mut inner = leaf.clone();
    for depth in 1..20 {
        let out = format!("y{depth}");
        let iff = with_attr(
            with_attr(node("if", "If", &["c"], &[&out]), attr_graph("then_branch", inner)),
            attr_graph("else_branch", leaf.clone()),
        );
        inner = ModelBuilder::new("level").node(iff).output(&out).graph();
    }
    let bytes = ModelBuilder::new("g")
        .input("c", dtype::BOOL, &[])
        .input("x", dtype::FLOAT, &["2"])
        .node(with_attr(
            with_attr(node("top", "If", &["c"], &["y"]), attr_graph("then_branch", inner)),
            attr_graph("else_branch", leaf),
        ))
        .output("y")
        .bytes();
    let err = kiln_onnx::import_bytes(&bytes, None, &ImportOptions::default()).unwrap_err();
    let ImportError::Unsupported(list) = &err else { panic!("expected Unsupported, got {err}") };
    assert_eq!(list.len(), 1, "{err}");
    assert!(list[0].message.contains("nest more than 16 deep"), "{err}");
}

/// `TopK` whose `k` is a graph input is read when the model runs (a data-dependent extent named after the
/// output); one whose `k` is a symbolic dim of an input (`Shape` → `Gather`) keeps that dim; a constant `k` stays
/// static.
#[test]
fn top_k_takes_k_at_run_time_or_as_a_symbolic_dim() {
    let topk = |name: &str, ins: &[&str], outs: &[&str]| with_attr(node(name, "TopK", ins, outs), attr_int("axis", 1));
    let bytes = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["2", "len"])
        .input("k", dtype::INT64, &["1"])
        .initializer(tensor_i64("one", &[1], &[1]))
        .initializer(tensor_i64("two", &[1], &[2]))
        .node(topk("by_input", &["x", "k"], &["v", "i"]))
        .node(node("shape", "Shape", &["x"], &["s"]))
        .node(with_attr(node("gather", "Gather", &["s", "one"], &["n"]), attr_int("axis", 0)))
        .node(topk("by_dim", &["x", "n"], &["sorted", "order"]))
        .node(topk("by_constant", &["x", "two"], &["top2", "top2_at"]))
        .output("v")
        .output("i")
        .output("sorted")
        .output("top2")
        .bytes();
    let g = import(&bytes);
    assert_eq!(output_shape(&g, "v"), Shape(vec![Dim::Static(2), Dim::sym("v_len")]));
    assert_eq!(output_shape(&g, "sorted"), Shape(vec![Dim::Static(2), Dim::sym("len")]));
    assert_eq!(output_shape(&g, "top2"), Shape(vec![Dim::Static(2), Dim::Static(2)]));
    let x = Tensor::from_vec(vec![2, 4], vec![3.0f32, 9.0, 1.0, 5.0, 0.0, -2.0, 8.0, 4.0]).unwrap();
    for (k, want) in [(1i64, vec![9.0f32, 8.0]), (3, vec![9.0, 5.0, 3.0, 8.0, 4.0, 0.0])] {
        let out = run(&g, &[("x", x.clone()), ("k", Tensor::from_vec(vec![1], vec![k]).unwrap())]);
        assert_eq!(out["v"].shape(), &[2, k as usize]);
        assert_eq!(out["v"].as_slice::<f32>().unwrap(), want.as_slice());
        assert_eq!(out["sorted"].as_slice::<f32>().unwrap(), [9.0, 5.0, 3.0, 1.0, 8.0, 4.0, 0.0, -2.0]);
    }
    // A k larger than the axis is a run-time error naming the node, not a crash.
    let inputs: BTreeMap<String, Tensor> =
        [("x".to_string(), x), ("k".to_string(), Tensor::from_vec(vec![1], vec![5i64]).unwrap())].into();
    let err = kiln_ir::interp::run(&g, &inputs).unwrap_err().to_string();
    assert!(err.contains("out of range"), "{err}");
}

/// Resize with `sizes` and a `keep_aspect_ratio_policy`: one scale for every resized axis (the least for
/// `not_larger`, the greatest for `not_smaller`), each extent that scale times the input's, rounded half up.
#[test]
fn resize_keeps_the_aspect_ratio_when_asked() {
    for (policy, want) in [("not_larger", [2, 3]), ("not_smaller", [3, 5]), ("stretch", [3, 3])] {
        let resize = with_attr(
            with_attr(node("resize", "Resize", &["x", "", "", "sizes"], &["y"]), attr_ints("axes", &[2, 3])),
            attr_string("keep_aspect_ratio_policy", policy),
        );
        let bytes = ModelBuilder::new("g")
            .opset(19)
            .input("x", dtype::FLOAT, &["1", "1", "4", "6"])
            .initializer(tensor_i64("sizes", &[2], &[3, 3]))
            .node(resize)
            .output("y")
            .bytes();
        let g = import(&bytes);
        let want = Shape(vec![Dim::Static(1), Dim::Static(1), Dim::Static(want[0]), Dim::Static(want[1])]);
        assert_eq!(output_shape(&g, "y"), want, "{policy}");
    }
}

/// GatherND with two batch dims: each index tuple picks from its own batch element's data (checked against a
/// direct computation), a negative index counts from the end; batch dims that differ between data and indices
/// are an error naming both.
#[test]
fn gather_nd_with_batch_dims_picks_within_each_batch_element() {
    let model = |idx_dims: &[i64], idx: &[i64]| {
        ModelBuilder::new("g")
            .opset(13)
            .input("x", dtype::FLOAT, &["2", "3", "4", "5"])
            .initializer(tensor_i64("i", idx_dims, idx))
            .node(with_attr(node("g", "GatherND", &["x", "i"], &["y"]), attr_int("batch_dims", 2)))
            .output("y")
            .bytes()
    };
    // indices [2, 3, 2, 1]: two single-axis picks per batch element (b0, b1).
    let picks: Vec<i64> = (0..12).map(|k| (k * 7 % 4) as i64 - if k % 5 == 0 { 4 } else { 0 }).collect();
    let g = import(&model(&[2, 3, 2, 1], &picks));
    assert_eq!(output_shape(&g, "y"), Shape::of(&[2, 3, 2, 5]));
    let x = iota_f32(vec![2, 3, 4, 5]);
    let y = run(&g, &[("x", x.clone())]).remove("y").unwrap();
    let (xv, yv) = (x.to_f64_vec(), y.to_f64_vec());
    for b0 in 0..2 {
        for b1 in 0..3 {
            for j in 0..2 {
                let pick = picks[(b0 * 3 + b1) * 2 + j].rem_euclid(4) as usize;
                for c in 0..5 {
                    let want = xv[((b0 * 3 + b1) * 4 + pick) * 5 + c];
                    assert_eq!(yv[((b0 * 3 + b1) * 2 + j) * 5 + c], want, "[{b0},{b1},{j},{c}]");
                }
            }
        }
    }
    let err = kiln_onnx::import_bytes(&model(&[2, 4, 1], &[0; 8]), None, &ImportOptions::default()).unwrap_err();
    assert!(err.to_string().contains("batch dims of data [2, 3] and indices [2, 4] differ"), "{err}");
}

/// A spatial transformer's sampling as exporters write it: AffineGrid of a run-time `theta` over a constant
/// `size`, into GridSample, on a symbolic batch. The identity transform samples every pixel centre (without
/// `align_corners`), so the image comes back unchanged; a `size` computed at run time or a `theta` of the wrong
/// shape is a clear error.
#[test]
fn affine_grid_into_grid_sample_reproduces_the_image_under_the_identity() {
    let model = |theta_dims: &[&str], size: Option<&[i64]>| {
        let mut b = ModelBuilder::new("g").opset(20).input("x", dtype::FLOAT, &["N", "2", "4", "5"]).input(
            "theta",
            dtype::FLOAT,
            theta_dims,
        );
        b = match size {
            Some(s) => b.initializer(tensor_i64("size", &[4], s)),
            None => b.input("size", dtype::INT64, &["4"]),
        };
        b.node(node("grid", "AffineGrid", &["theta", "size"], &["grid"]))
            .node(node("sample", "GridSample", &["x", "grid"], &["y"]))
            .output("y")
            .bytes()
    };
    let g = import(&model(&["N", "2", "3"], Some(&[1, 2, 4, 5])));
    assert_eq!(output_shape(&g, "y"), Shape(vec![Dim::sym("N"), Dim::Static(2), Dim::Static(4), Dim::Static(5)]));
    let x = iota_f32(vec![3, 2, 4, 5]);
    let identity: Vec<f32> = (0..3).flat_map(|_| [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]).collect();
    let theta = Tensor::from_vec(vec![3, 2, 3], identity).unwrap();
    let y = run(&g, &[("x", x.clone()), ("theta", theta)]).remove("y").unwrap();
    for (i, (a, b)) in y.to_f64_vec().iter().zip(x.to_f64_vec()).enumerate() {
        assert!((a - b).abs() < 1e-4, "element {i}: {a} vs {b}");
    }
    let err =
        |bytes: Vec<u8>| kiln_onnx::import_bytes(&bytes, None, &ImportOptions::default()).unwrap_err().to_string();
    let e = err(model(&["N", "2", "3"], None));
    assert!(e.contains("size") && e.contains("known at import time"), "{e}");
    let e = err(model(&["N", "3", "3"], Some(&[1, 2, 4, 5])));
    assert!(e.contains("theta must be [N, 2, 3]"), "{e}");
}

/// Col2Im runs as a grouped transposed convolution with one-hot weights: each value lands where its block and tap
/// say (checked against a direct scatter), overlaps add, on a symbolic batch; a block count that does not match
/// the image is an error naming both.
#[test]
fn col2im_scatters_blocks_back_into_images() {
    let model = |l: &str| {
        ModelBuilder::new("g")
            .opset(18)
            .input("x", dtype::FLOAT, &["N", "8", l])
            .initializer(tensor_i64("image", &[2], &[3, 4]))
            .initializer(tensor_i64("block", &[2], &[2, 2]))
            .node(node("c", "Col2Im", &["x", "image", "block"], &["y"]))
            .output("y")
            .bytes()
    };
    let g = import(&model("6"));
    assert_eq!(output_shape(&g, "y"), Shape(vec![Dim::sym("N"), Dim::Static(2), Dim::Static(3), Dim::Static(4)]));
    let x = iota_f32(vec![2, 8, 6]);
    let y = run(&g, &[("x", x.clone())]).remove("y").unwrap().to_f64_vec();
    let xv = x.to_f64_vec();
    let mut want = vec![0.0; 2 * 2 * 12];
    for n in 0..2 {
        for ck in 0..8 {
            let (c, k) = (ck / 4, ck % 4);
            for l in 0..6 {
                let (row, col) = (l / 3 + k / 2, l % 3 + k % 2);
                want[((n * 2 + c) * 3 + row) * 4 + col] += xv[(n * 8 + ck) * 6 + l];
            }
        }
    }
    assert_eq!(y, want);
    let err = kiln_onnx::import_bytes(&model("7"), None, &ImportOptions::default()).unwrap_err().to_string();
    assert!(err.contains("7 block positions") && err.contains("give 6"), "{err}");
}

/// DFT as constant twiddle matrices: zero-padding to a longer `dft_length` and truncation to a shorter one, the
/// one-sided spectrum, and the inverse of a complex spectrum, each against a direct f64 sum.
#[test]
fn dft_pads_truncates_and_inverts_like_the_definition() {
    let signal: Vec<f32> = (0..10).map(|i| ((i * 7 % 5) as f32 - 2.0) * 0.5).collect(); // [2, 5, 1]
    let naive = |x: &[(f64, f64)], len: usize, bins: usize, inverse: bool| -> Vec<(f64, f64)> {
        (0..bins)
            .map(|k| {
                let (mut re, mut im) = (0.0, 0.0);
                for (j, &(a, b)) in x.iter().enumerate().take(len) {
                    let t = 2.0 * std::f64::consts::PI * (j * k) as f64 / len as f64;
                    let (c, s) = (t.cos(), if inverse { t.sin() } else { -t.sin() });
                    re += a * c - b * s;
                    im += a * s + b * c;
                }
                if inverse { (re / len as f64, im / len as f64) } else { (re, im) }
            })
            .collect()
    };
    for (len, onesided, inverse) in [(8, false, false), (3, false, false), (8, true, false), (5, false, true)] {
        let parts = if inverse { 2 } else { 1 };
        let mut dft = node("d", "DFT", &["x", "len"], &["y"]);
        dft = with_attr(with_attr(dft, attr_int("onesided", onesided as i64)), attr_int("inverse", inverse as i64));
        let bytes = ModelBuilder::new("g")
            .opset(19)
            .input("x", dtype::FLOAT, &["2", "5", &parts.to_string()])
            .initializer(tensor_i64("len", &[], &[len as i64]))
            .node(with_attr(dft, attr_int("axis", 1)))
            .output("y")
            .bytes();
        let g = import(&bytes);
        let xs: Vec<f32> = if inverse { signal.iter().flat_map(|&v| [v, 1.0 - v]).collect() } else { signal.clone() };
        let x = Tensor::from_vec(vec![2, 5, parts], xs.clone()).unwrap();
        let y = run(&g, &[("x", x)]).remove("y").unwrap();
        let bins = if onesided { len / 2 + 1 } else { len };
        assert_eq!(y.shape(), &[2, bins, 2], "len {len} onesided {onesided} inverse {inverse}");
        let got = y.to_f64_vec();
        for b in 0..2 {
            let row: Vec<(f64, f64)> = (0..5)
                .map(|j| {
                    let at = (b * 5 + j) * parts;
                    (f64::from(xs[at]), if inverse { f64::from(xs[at + 1]) } else { 0.0 })
                })
                .collect();
            for (k, (re, im)) in naive(&row, len, bins, inverse).into_iter().enumerate() {
                let at = (b * bins + k) * 2;
                assert!(
                    (got[at] - re).abs() < 1e-5 && (got[at + 1] - im).abs() < 1e-5,
                    "bin {k}: {:?}",
                    &got[at..at + 2]
                );
            }
        }
    }
}

/// Constants a handler builds are bounded: a mel filter bank over a 2^24-point spectrum, or a Col2Im over a
/// huge declared channel count, is a clear error at import, never an allocation of terabytes.
#[test]
fn absurd_signal_and_col2im_constants_are_errors() {
    let mel = ModelBuilder::new("g")
        .opset(17)
        .initializer(tensor_i64("mels", &[], &[65536]))
        .initializer(tensor_i64("len", &[], &[1 << 24]))
        .initializer(tensor_i64("rate", &[], &[16000]))
        .initializer(tensor_f32("lo", &[], &[0.0]))
        .initializer(tensor_f32("hi", &[], &[8000.0]))
        .node(node("m", "MelWeightMatrix", &["mels", "len", "rate", "lo", "hi"], &["y"]))
        .output("y")
        .bytes();
    let err = kiln_onnx::import_bytes(&mel, None, &ImportOptions::default()).unwrap_err().to_string();
    assert!(err.contains("too large"), "{err}");
    let col = ModelBuilder::new("g")
        .opset(18)
        .input("x", dtype::FLOAT, &["1", "4294967296", "1"])
        .initializer(tensor_i64("image", &[2], &[1, 1]))
        .initializer(tensor_i64("block", &[2], &[1, 1]))
        .node(node("c", "Col2Im", &["x", "image", "block"], &["y"]))
        .output("y")
        .bytes();
    let err = kiln_onnx::import_bytes(&col, None, &ImportOptions::default()).unwrap_err().to_string();
    assert!(err.contains("too large"), "{err}");
}
