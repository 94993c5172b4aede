//! The ONNX importer on bad input: every malformed, hostile or unsupported model gives one clear `ImportError`
//! that names what is wrong (the node, value, domain, initializer or file), and never a panic. Messages are insta
//! snapshots named after their case (`INSTA_UPDATE=always cargo test -p kiln-onnx --test bad_input` re-blesses).

mod model;

use std::path::Path;

use kiln_onnx::ImportOptions;
use model::*;

/// Imports `bytes` with no model folder and snapshots the error as `name`.
fn check(name: &str, bytes: &[u8]) {
    let err = kiln_onnx::import_bytes(bytes, None, &ImportOptions::default()).expect_err("a bad model must not import");
    insta::assert_snapshot!(name, err.to_string());
}

/// Writes `bytes` as `dir/model.onnx`, imports it from there (external data resolves against `dir`), and
/// snapshots the error as `name` with `dir` shown as `[DIR]`.
fn check_in(name: &str, dir: &Path, bytes: &[u8]) {
    let path = dir.join("model.onnx");
    std::fs::write(&path, bytes).unwrap();
    let err = kiln_onnx::import(&path, &ImportOptions::default()).expect_err("a bad model must not import");
    let mut message = err.to_string();
    // Longest first: the canonical form may extend the given one (a symlinked temp folder).
    let mut dirs = vec![dir.canonicalize().unwrap().display().to_string(), dir.display().to_string()];
    dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
    for d in dirs {
        message = message.replace(&d, "[DIR]");
    }
    insta::assert_snapshot!(name, message);
}

/// Deterministic pseudo-random bytes (xorshift64*), so failures reproduce.
fn pseudo_random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.max(1);
    (0..len)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

#[test]
fn every_truncation_of_a_valid_model_is_an_error() {
    let bytes = small_mlp().bytes();
    assert!(kiln_onnx::import_bytes(&bytes, None, &ImportOptions::default()).is_ok(), "the whole model imports");
    // Consecutive prefix lengths with the same message, as `first..=last: message`.
    let mut runs: Vec<(usize, usize, String)> = Vec::new();
    for len in 0..bytes.len() {
        let err = kiln_onnx::import_bytes(&bytes[..len], None, &ImportOptions::default())
            .expect_err("a strict prefix must not import");
        let message = err.to_string();
        match runs.last_mut() {
            Some((_, last, m)) if *m == message => *last = len,
            _ => runs.push((len, len, message)),
        }
    }
    let summary: Vec<String> = runs.iter().map(|(a, b, m)| format!("{a}..={b}: {m}")).collect();
    insta::assert_snapshot!("truncated_prefixes", summary.join("\n"));
}

#[test]
fn random_garbage_is_an_error() {
    for seed in 1..=200u64 {
        let bytes = pseudo_random_bytes(seed, (seed as usize * 37) % 600);
        let err =
            kiln_onnx::import_bytes(&bytes, None, &ImportOptions::default()).expect_err("random bytes must not import");
        let message = err.to_string();
        assert!(
            message.starts_with("not a valid ONNX model: ") || message.starts_with("invalid model: "),
            "seed {seed}: {message}"
        );
    }
    check("garbage_text", b"this is not a protobuf message at all");
    check("garbage_empty", b"");
}

#[test]
fn undefined_value_names_node_and_value() {
    let m = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["2"])
        .node(node("add", "Add", &["x", "ghost"], &["y"]))
        .output("y");
    check("undefined_value", &m.bytes());
    // Defined only later in node order: still undefined where it is used.
    let m = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["2"])
        .node(node("first", "Relu", &["later"], &["y"]))
        .node(node("second", "Relu", &["x"], &["later"]))
        .output("y");
    check("value_defined_after_use", &m.bytes());
}

#[test]
fn unknown_domain_is_named() {
    let mut fancy = node("fancy", "FancyOp", &["x"], &["y"]);
    fancy.domain = "com.example".into();
    let m = ModelBuilder::new("g").input("x", dtype::FLOAT, &["2"]).node(fancy).output("y");
    check("unknown_domain", &m.bytes());
}

#[test]
fn unsupported_contrib_ops_are_named_with_what_is_supported() {
    // An ONNX Runtime contrib op kiln does not import: the message lists the com.microsoft ops it does.
    let mut softmax = node("qsoftmax", "QLinearSoftmax", &["x", "s", "z", "s", "z"], &["y"]);
    softmax.domain = "com.microsoft".into();
    let m = ModelBuilder::new("g")
        .input("x", dtype::UINT8, &["2"])
        .input("s", dtype::FLOAT, &[])
        .input("z", dtype::UINT8, &[])
        .node(softmax)
        .output("y");
    check("unsupported_contrib_op", &m.bytes());
    // A supported one with a per-channel scale where ONNX Runtime's op takes one value per tensor.
    let mut add = node("qadd", "QLinearAdd", &["x", "s", "z", "x", "s", "z", "s", "z"], &["y"]);
    add.domain = "com.microsoft".into();
    let m = ModelBuilder::new("g")
        .input("x", dtype::UINT8, &["2"])
        .input("s", dtype::FLOAT, &["2"])
        .input("z", dtype::UINT8, &[])
        .node(add)
        .output("y");
    check("contrib_op_per_channel_scale", &m.bytes());
}

#[test]
fn initializer_size_disagreeing_with_its_shape_is_named() {
    let m = |t| {
        ModelBuilder::new("g")
            .input("x", dtype::FLOAT, &["4"])
            .initializer(t)
            .node(node("add", "Add", &["x", "w"], &["y"]))
            .output("y")
    };
    check("initializer_raw_too_short", &m(tensor_f32("w", &[4], &[1.0, 2.0, 3.0])).bytes());
    check("initializer_typed_too_long", &m(tensor_i64("w", &[2], &[1, 2, 3])).bytes());
    check("initializer_negative_dim", &m(tensor_f32("w", &[-4], &[])).bytes());
    check("initializer_overflowing_shape", &m(tensor_f32("w", &[1 << 40, 1 << 40], &[])).bytes());
    let mut ragged = tensor_f32("w", &[4], &[0.0; 4]);
    ragged.raw_data.pop();
    check("initializer_raw_ragged", &m(ragged).bytes());
}

/// `y = x + w` with `w` an f32[4] initializer stored externally at `location`.
fn external_model(location: &str, offset: Option<u64>) -> Vec<u8> {
    ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["4"])
        .initializer(tensor_f32_external("w", &[4], location, offset))
        .node(node("add", "Add", &["x", "w"], &["y"]))
        .output("y")
        .bytes()
}

#[test]
fn external_data_escaping_the_model_folder_is_refused() {
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("model");
    std::fs::create_dir(&dir).unwrap();
    let secret = outer.path().join("secret.bin");
    std::fs::write(&secret, [0u8; 16]).unwrap();
    check_in("external_parent_dir", &dir, &external_model("../secret.bin", None));
    check_in("external_nested_parent_dir", &dir, &external_model("sub/../../secret.bin", None));
    // Refused for being absolute, before the file is looked at.
    check_in("external_absolute", &dir, &external_model("/etc/passwd", None));
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&secret, dir.join("link.bin")).unwrap();
        check_in("external_symlink_out", &dir, &external_model("link.bin", None));
        std::fs::create_dir(outer.path().join("elsewhere")).unwrap();
        std::fs::write(outer.path().join("elsewhere/w.bin"), [0u8; 16]).unwrap();
        std::os::unix::fs::symlink(outer.path().join("elsewhere"), dir.join("linked_dir")).unwrap();
        check_in("external_symlinked_folder_out", &dir, &external_model("linked_dir/w.bin", None));
    }
}

#[test]
fn external_data_running_past_its_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("short.bin"), [0u8; 12]).unwrap();
    check_in("external_file_too_short", dir.path(), &external_model("short.bin", None));
    std::fs::write(dir.path().join("w.bin"), [0u8; 16]).unwrap();
    check_in("external_offset_past_end", dir.path(), &external_model("w.bin", Some(4)));
    check_in("external_offset_overflows", dir.path(), &external_model("w.bin", Some(u64::MAX)));
    check_in("external_missing_file", dir.path(), &external_model("absent.bin", None));
    // From bytes there is no folder to read from.
    check("external_without_folder", &external_model("w.bin", None));
}

#[test]
fn graph_output_nobody_produces_is_named() {
    let m = relu_model(&["2"]).output("orphan");
    check("output_not_produced", &m.bytes());
}

#[test]
fn value_info_with_another_dtype_is_refused() {
    // Relu of f32 declared as i64 in value_info: the model (or kiln) is wrong, and the error names the value.
    let m = relu_model(&["2"]).value_info("y", dtype::INT64, &["2"]);
    check("value_info_dtype_mismatch", &m.bytes());
}

#[test]
fn unsupported_input_dtypes_are_named() {
    let m = |elem_type| {
        ModelBuilder::new("g").input("s", elem_type, &["2"]).node(node("id", "Identity", &["s"], &["y"])).output("y")
    };
    check("input_dtype_string", &m(dtype::STRING).bytes());
    check("input_dtype_complex64", &m(dtype::COMPLEX64).bytes());
    check("input_dtype_unknown_code", &m(99).bytes());
}

#[test]
fn structural_problems_are_named() {
    let mut m = relu_model(&["2"]).model();
    m.graph = None.into();
    check("no_graph", &onnx_protobuf::Message::write_to_bytes(&m).unwrap());
    let mut m = relu_model(&["2"]).model();
    m.opset_import[0].version = 3;
    check("opset_too_old", &onnx_protobuf::Message::write_to_bytes(&m).unwrap());
    let m = ModelBuilder::new("g")
        .input_without_shape("x", dtype::FLOAT)
        .node(node("relu", "Relu", &["x"], &["y"]))
        .output("y");
    check("input_without_shape", &m.bytes());
    let m = ModelBuilder::new("g").input("x", dtype::FLOAT, &["2"]).node(node("relu", "Relu", &["x"], &["y"]));
    check("no_outputs", &m.bytes());
    let m = relu_model(&["2"]).node(node("", "", &["x"], &["z"]));
    check("node_without_op_type", &m.bytes());
    let m = relu_model(&["2"]).node(with_attr(node("relu2", "Relu", &["y"], &["z"]), attr_int("alpha", 1)));
    check("unread_attribute", &m.output("z").bytes());
}

/// A model applying `op` to `x: f32[x_dims]` (plus the initializers) into `y`.
fn one_op(x_dims: &[&str], op: onnx_protobuf::NodeProto, inits: Vec<onnx_protobuf::TensorProto>) -> Vec<u8> {
    let mut m = ModelBuilder::new("g").input("x", dtype::FLOAT, x_dims);
    for t in inits {
        m = m.initializer(t);
    }
    m.node(op).output("y").bytes()
}

/// Inputs the fuzz smoke test found panicking in handlers (index out of range, overflow, division by zero), each
/// now an error naming the node.
#[test]
fn handler_edge_cases_found_by_fuzzing_are_errors() {
    let conv = node("conv", "Conv", &["x", "w"], &["y"]);
    check("conv_rank1_weights", &one_op(&["1", "1", "4"], conv.clone(), vec![tensor_f32("w", &[2], &[1.0; 2])]));
    let w = || vec![tensor_f32("w", &[1, 1, 2], &[1.0; 2])];
    check("conv_short_strides", &one_op(&["1", "1", "4"], with_attr(conv.clone(), attr_ints("strides", &[])), w()));
    check("conv_zero_stride", &one_op(&["1", "1", "4"], with_attr(conv, attr_ints("strides", &[0])), w()));
    let pool = with_attr(node("pool", "MaxPool", &["x"], &["y"]), attr_ints("kernel_shape", &[2]));
    check("pool_zero_dilation", &one_op(&["1", "1", "4"], with_attr(pool, attr_ints("dilations", &[0])), vec![]));
    let lp = with_attr(node("lp", "LpPool", &["x"], &["y"]), attr_ints("kernel_shape", &[]));
    check("lp_pool_rank1", &one_op(&["4"], lp, vec![]));
    let huge = 1i64 << 40;
    let reshape = node("reshape", "Reshape", &["x", "shape"], &["y"]);
    check("reshape_overflowing_target", &one_op(&["4"], reshape, vec![tensor_i64("shape", &[3], &[huge, huge, -1])]));
    check(
        "concat_without_inputs",
        &one_op(&["4"], with_attr(node("concat", "Concat", &[], &["y"]), attr_int("axis", 0)), vec![]),
    );
    check(
        "squeeze_scalar",
        &one_op(&[], node("squeeze", "Squeeze", &["x", "axes"], &["y"]), vec![tensor_i64("axes", &[1], &[0])]),
    );
    check("split_scalar", &one_op(&[], node("split", "Split", &["x"], &["y"]), vec![]));
    check(
        "split_num_outputs_disagrees",
        &one_op(&["4"], with_attr(node("split", "Split", &["x"], &["y"]), attr_int("num_outputs", i64::MAX)), vec![]),
    );
    check(
        "cumsum_scalar",
        &one_op(&[], node("cumsum", "CumSum", &["x", "axis"], &["y"]), vec![tensor_i64("axis", &[], &[0])]),
    );
    let nll = node("nll", "NegativeLogLikelihoodLoss", &["x", "t"], &["y"]);
    check("nll_scalar_target", &one_op(&["2", "3"], nll, vec![tensor_i64("t", &[], &[0])]));
}

/// An attribute given with another type than the op declares is the model's error naming the node and the
/// attribute, never a default or a zero read from the wrong field (a Gemm `alpha` given as a string used to become
/// 0, a float `transB` was ignored, a float Softmax `axis` became 0).
#[test]
fn attributes_of_the_wrong_type_are_errors() {
    let gemm = || node("gemm", "Gemm", &["x", "w"], &["y"]);
    let w = || vec![tensor_f32("w", &[2, 2], &[1.0; 4])];
    check("gemm_alpha_as_string", &one_op(&["2", "2"], with_attr(gemm(), attr_string("alpha", "2.0")), w()));
    check("gemm_trans_b_as_float", &one_op(&["2", "2"], with_attr(gemm(), attr_float("transB", 1.0)), w()));
    let softmax = node("softmax", "Softmax", &["x"], &["y"]);
    check("softmax_axis_as_float", &one_op(&["2", "2"], with_attr(softmax, attr_float("axis", 0.0)), vec![]));
    // No declared type: the data decides; data of two kinds is ambiguous.
    check(
        "gemm_alpha_untyped_two_kinds",
        &one_op(&["2", "2"], with_attr(gemm(), attr_untyped("alpha", 2.0, "x")), w()),
    );
    let untyped_ok = one_op(&["2", "2"], with_attr(gemm(), attr_untyped("alpha", 2.0, "")), w());
    kiln_onnx::import_bytes(&untyped_ok, None, &ImportOptions::default()).expect("an untyped float alpha imports");
}

/// Misleading messages, fixed: an input without a declared shape takes the one the user gives (and says how when
/// none is given); a graph output listed twice is the model's error, not "a kiln bug".
#[test]
fn shapeless_inputs_take_given_shapes_and_duplicate_outputs_are_named() {
    let m = ModelBuilder::new("g")
        .input_without_shape("x", dtype::FLOAT)
        .node(node("relu", "Relu", &["x"], &["y"]))
        .output("y");
    let options = ImportOptions { shapes: [("x".to_string(), vec![2, 3])].into(), ..Default::default() };
    let g = kiln_onnx::import_bytes(&m.bytes(), None, &options).expect("the given shape is used");
    assert_eq!(
        kiln_ir::print(&g).lines().find(|l| l.contains("input")).unwrap().trim(),
        "%0 = input {name=\"x\"} : f32[2,3]"
    );
    check("duplicate_graph_output", &relu_model(&["2"]).output("y").bytes());
}

/// Values are single-assignment: a node writing a graph input's name, another node's output, or one name twice is
/// the model's error naming the node (it used to be "the last write wins").
#[test]
fn values_written_twice_are_errors() {
    check("node_output_reuses_graph_input", &relu_model(&["2"]).node(node("again", "Relu", &["y"], &["x"])).bytes());
    check("two_nodes_write_one_value", &relu_model(&["2"]).node(node("again", "Relu", &["x"], &["y"])).bytes());
    let twice =
        ModelBuilder::new("g").input("x", dtype::FLOAT, &["2"]).node(node("split", "Split", &["x"], &["a", "a"]));
    check("one_node_writes_a_name_twice", &twice.output("a").bytes());
}

/// An input a handler never looks at — an extra operand of a one-input op — is reported, never silently ignored.
#[test]
fn extra_inputs_are_reported() {
    check("relu_with_two_inputs", &one_op(&["2"], node("relu", "Relu", &["x", "x"], &["y"]), vec![]));
}

/// A graph output whose declared shape contradicts the computed one is the model's error; a symbolic declared
/// dim fits any extent.
#[test]
fn declared_output_shapes_must_fit() {
    let relu = |dims: &[&str]| {
        ModelBuilder::new("g")
            .input("x", dtype::FLOAT, &["2", "3"])
            .node(node("relu", "Relu", &["x"], &["y"]))
            .output_typed("y", dtype::FLOAT, dims)
    };
    check("output_declared_with_another_extent", &relu(&["2", "4"]).bytes());
    check("output_declared_with_another_rank", &relu(&["6"]).bytes());
    kiln_onnx::import_bytes(&relu(&["n", "3"]).bytes(), None, &ImportOptions::default()).expect("a symbolic dim fits");
}

/// Sequences are resolved at import: what would need one at run time is an error naming the node and why — a
/// position fed by an input, a position out of range, a split of a symbolic extent, a sequence as a graph output
/// or as an ordinary op's operand, the element of an empty optional.
#[test]
fn sequences_that_need_run_time_data_are_named() {
    let split = || node("split", "SplitToSequence", &["x"], &["s"]);
    let m = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["2", "3"])
        .input("i", dtype::INT64, &[])
        .node(split())
        .node(node("at", "SequenceAt", &["s", "i"], &["y"]))
        .output("y");
    check("sequence_position_from_an_input", &m.bytes());
    let at = node("at", "SequenceAt", &["s", "p"], &["y"]);
    let m = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["2", "3"])
        .initializer(tensor_i64("p", &[], &[2]))
        .node(split())
        .node(at)
        .output("y");
    check("sequence_position_out_of_range", &m.bytes());
    let m = ModelBuilder::new("g").input("x", dtype::FLOAT, &["n", "3"]).node(split()).node(node(
        "len",
        "SequenceLength",
        &["s"],
        &["y"],
    ));
    check("split_to_sequence_of_a_symbolic_extent", &m.output("y").bytes());
    let m = ModelBuilder::new("g").input("x", dtype::FLOAT, &["2", "3"]).node(split()).output("s");
    check("sequence_as_graph_output", &m.bytes());
    let m = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["2", "3"])
        .node(split())
        .node(node("relu", "Relu", &["s"], &["y"]))
        .output("y");
    check("sequence_as_an_ordinary_operand", &m.bytes());
    let m = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["2", "3"])
        .node(node("none", "Optional", &[], &["o"]))
        .node(node("get", "OptionalGetElement", &["o"], &["y"]))
        .output("y");
    check("element_of_an_empty_optional", &m.bytes());
}

/// Sequences are unrolled at import, so their size is bounded: a split of a long axis into one-element pieces is
/// a clear error, not a million nodes.
#[test]
fn huge_sequences_are_refused_not_unrolled() {
    let m = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["1", "1000000"])
        .node(with_attr(node("split", "SplitToSequence", &["x"], &["s"]), attr_int("axis", 1)))
        .node(node("len", "SequenceLength", &["s"], &["y"]))
        .output("y");
    check("split_to_sequence_of_a_million_pieces", &m.bytes());
}

/// Split sizes that overflow when added, or a chunk size of i64::MAX, are errors or work — never an overflow.
#[test]
fn split_to_sequence_sizes_never_overflow() {
    let sizes = tensor_i64("sizes", &[2], &[i64::MAX, i64::MAX]);
    let m = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["2", "3"])
        .initializer(sizes)
        .node(node("split", "SplitToSequence", &["x", "sizes"], &["s"]))
        .node(node("len", "SequenceLength", &["s"], &["y"]))
        .output("y");
    check("split_to_sequence_sizes_overflowing", &m.bytes());
    let chunk = tensor_i64("chunk", &[], &[i64::MAX]);
    let m = ModelBuilder::new("g")
        .input("x", dtype::FLOAT, &["2", "3"])
        .initializer(chunk)
        .node(node("split", "SplitToSequence", &["x", "chunk"], &["s"]))
        .node(node("len", "SequenceLength", &["s"], &["y"]))
        .output("y");
    let g = kiln_onnx::import_bytes(&m.bytes(), None, &ImportOptions::default()).expect("one piece of everything");
    assert_eq!(g.outputs().len(), 1);
}
