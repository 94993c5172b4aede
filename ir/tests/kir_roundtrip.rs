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
fn every_fixture_is_written_in_canonical_form() {
    // Fixtures keep their comments; apart from those they read exactly as the printer writes them.
    for (name, text) in fixtures() {
        let stripped: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .map(|l| l.split(" //").next().unwrap_or(l).trim_end())
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(print(&parse_ok(&name, &text)), stripped, "fixture {name}");
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

/// A small graph from the builder: symbolic batch, parameter, inline constant, a multi-result op, a node name.
fn builder_graph() -> Graph {
    let mut b = Builder::new("builder \"mlp\"");
    let build = |b: &mut Builder| -> Result<(), kiln_ir::Error> {
        let x = b.input("x", DType::F32, Shape(vec![Dim::sym("batch"), Dim::Static(4)]))?;
        let w = b.param("fc.weight", DType::F32, Shape::of(&[4, 6]))?;
        let bias =
            b.constant(Tensor::from_vec(vec![6], vec![0.5f32, -1.0, 0.1, 1e-7, 0.0, 3.25]).expect("6 elements"))?;
        let h = b.matmul(x, w)?;
        let h = b.add(h, bias)?;
        let parts =
            b.named_op(Op::Split(Split { axis: -1, sizes: vec![2, 4] }), &[h], Some("/split \"heads\"".into()))?;
        let act = b.relu(parts[1])?;
        let s = b.reduce(kiln_ir::op::ReduceKind::Mean, act, &[1], true)?;
        let gated = b.binary(BinaryOp::Mul, parts[0], s)?;
        let two = b.scalar(DType::F32, 2.0)?;
        let y = b.pow(gated, two)?;
        let late = b.input("late input", DType::I64, Shape::scalar())?;
        b.output("y", y);
        b.output("late", late);
        Ok(())
    };
    build(&mut b).expect("builder graph is well typed");
    b.finish()
}

#[test]
fn printer_output_of_a_builder_graph() {
    let g = builder_graph();
    let text = print(&g);
    insta::assert_snapshot!("builder_graph", text);
    let back = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(structure(&g), structure(&back));
    assert_eq!(print(&back), text);
}

#[test]
fn input_order_survives_the_round_trip() {
    let mut b = Builder::new("inputs");
    let c = b.scalar(DType::F32, 1.0).expect("scalar");
    let first = b.input("first", DType::F32, Shape::scalar()).expect("input");
    let second = b.input("second", DType::F32, Shape::scalar()).expect("input");
    let s = b.add(second, c).expect("add");
    let s = b.add(s, first).expect("add");
    b.output("s", s);
    let mut g = b.finish();
    // Reverse the declared input order: it is part of the graph, not an accident of node ids.
    let mut reversed = Graph::new("inputs");
    let ids: Vec<NodeId> = g.topo_order().expect("acyclic");
    let mut map = std::collections::HashMap::new();
    for &id in ids
        .iter()
        .rev()
        .filter(|&&id| matches!(g.node(id).op, Op::Input(_)))
        .chain(ids.iter().filter(|&&id| !matches!(g.node(id).op, Op::Input(_))))
    {
        let mut n = g.node(id).clone();
        n.inputs = n.inputs.iter().map(|v| kiln_ir::Value::new(map[&v.node], v.index)).collect();
        map.insert(id, reversed.add_node(n));
    }
    for (name, v) in g.outputs() {
        reversed.add_output(name.clone(), kiln_ir::Value::new(map[&v.node], v.index));
    }
    g = reversed;
    let text = print(&g);
    let back = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let names = |g: &Graph| -> Vec<String> { g.inputs().iter().map(|&i| g.node(i).op.attrs_text()).collect() };
    assert_eq!(names(&back), vec!["{name=\"second\"}", "{name=\"first\"}"]);
    assert_eq!(names(&g), names(&back));
    assert_eq!(print(&back), text);
}

#[test]
fn invalid_graphs_still_print() {
    let mut g = Graph::new("cyclic");
    let ty = kiln_ir::TensorType::of(DType::F32, &[2]);
    let relu = |inputs| kiln_ir::Node {
        op: Op::Unary(kiln_ir::op::UnaryOp::Relu),
        inputs,
        outputs: vec![ty.clone()],
        name: None,
    };
    let a = g.add_node(relu(vec![kiln_ir::Value::new(NodeId(1), 0)]));
    let b = g.add_node(relu(vec![kiln_ir::Value::new(a, 0)]));
    g.set_input(a, 0, kiln_ir::Value::new(b, 0));
    let dangling = g.add_node(relu(vec![kiln_ir::Value::new(NodeId(40), 3)]));
    g.add_output("y", kiln_ir::Value::new(dangling, 0));
    let text = print(&g);
    insta::assert_snapshot!("invalid_graph", text);
    let err = parse(&text).expect_err("forward references do not parse");
    assert!(err.message.contains("undefined value `%1`"), "{err}");
}

/// Bad inputs and the error each must give: (snapshot name, source).
const BAD_INPUTS: &[(&str, &str)] = &[
    ("missing_header", "%0 = input {name=\"x\"} : f32[2]\n"),
    ("graph_name_not_a_string", "graph mlp {\n}\n"),
    ("unknown_mnemonic", "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = relux %0 : f32[2]\n}\n"),
    ("undefined_value", "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = relu %9 : f32[2]\n}\n"),
    ("value_redefined", "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %0 = relu %0 : f32[2]\n}\n"),
    ("wrong_operand_count", "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = add %0 : f32[2]\n}\n"),
    (
        "unknown_attribute",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = reduce %0 {kind=sum, axis=[0], keep_dims=true} : f32[1]\n}\n",
    ),
    ("missing_attribute", "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = softmax %0 : f32[2]\n}\n"),
    (
        "bad_attribute_value",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = reduce %0 {kind=total, axes=[0], keep_dims=true} : f32[1]\n}\n",
    ),
    (
        "attribute_given_twice",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = softmax %0 {axis=0, axis=0} : f32[2]\n}\n",
    ),
    (
        "attribute_syntax",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2,2]\n  %1 = transpose %0 {perm=[1 0]} : f32[2,2]\n}\n",
    ),
    ("takes_no_attributes", "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = relu %0 {axis=0} : f32[2]\n}\n"),
    ("unknown_dtype", "graph \"g\" {\n  %0 = input {name=\"x\"} : f33[2]\n}\n"),
    ("malformed_type", "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2,\n  output \"y\" = %0\n}\n"),
    ("negative_dim", "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[-1]\n}\n"),
    (
        "missing_result_types",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = relu %0\n  output \"y\" = %1\n}\n",
    ),
    (
        "result_count_mismatch",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = split %0 {axis=0, sizes=[1, 1]} : f32[1]\n}\n",
    ),
    (
        "declared_type_disagrees",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[batch,2]\n  %1 = relu %0 : f32[2,batch]\n}\n",
    ),
    (
        "inference_error",
        "graph \"g\" {\n  %0 = input {name=\"a\"} : f32[2,3]\n  %1 = input {name=\"b\"} : f32[2,3]\n  %2 = matmul %0, %1 : f32[2,3]\n}\n",
    ),
    (
        "duplicate_output",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  output \"y\" = %0\n  output \"y\" = %0\n}\n",
    ),
    ("duplicate_input", "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = input {name=\"x\"} : f32[2]\n}\n"),
    ("trailing_garbage", "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n}\n}\n"),
    ("missing_close_brace", "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  output \"y\" = %0\n"),
    ("unterminated_string", "graph \"g\" {\n  %0 = input {name=\"x} : f32[2]\n}\n"),
    ("bad_escape", "graph \"g\" {\n  %0 = input {name=\"a\\qb\"} : f32[2]\n}\n"),
    (
        "integer_out_of_range",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = softmax %0 {axis=99999999999999999999} : f32[2]\n}\n",
    ),
    (
        "float_out_of_range",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = gelu %0 {approximate=none} : f32[2]\n  %2 = pad %1 {mode=constant, pads=[1, 1], value=1e999} : f32[4]\n}\n",
    ),
    ("element_out_of_range", "graph \"g\" {\n  %0 = constant {value=i8[2] [1, 300]} : i8[2]\n}\n"),
    ("stray_character", "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[2] #\n}\n"),
    ("tab_indented_caret", "graph \"g\" {\n\t%0 = input {name=\"x\"} : f32[2]\n\t%1 = exp %0 : i32[2]\n}\n"),
];

#[test]
fn parse_errors() {
    assert!(BAD_INPUTS.len() >= 15);
    for &(name, src) in BAD_INPUTS {
        let err = match parse(src) {
            Ok(g) => panic!("case {name} parsed:\n{}", print(&g)),
            Err(e) => e,
        };
        insta::with_settings!({ description => src, omit_expression => true }, {
            insta::assert_snapshot!(format!("error_{name}"), err.to_string());
        });
    }
}

/// splitmix64, so the mutations are the same on every run and platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Parses `src`; when it is accepted, its printed form must be a fixed point too.
fn parse_must_not_panic(src: &str) {
    if let Ok(g) = parse(src) {
        let once = print(&g);
        let again = parse(&once).unwrap_or_else(|e| panic!("printed form of an accepted input fails: {e}\n{once}"));
        assert_eq!(print(&again), once, "input:\n{src}");
    }
}

#[test]
fn truncated_and_mutated_fixtures_never_panic() {
    const SPLICES: &[&str] = &[
        "9223372036854775807",
        "-9223372036854775808",
        "18446744073709551616",
        "4294967296",
        "-1",
        "0",
        "1e999",
        "nan",
        "-inf",
        "%0",
        "%99",
        ",",
        "]",
        "}",
        "{",
        "\"",
        "\\",
        "batch",
        ":",
        "=",
        "é",
        "\u{0}",
    ];
    // `KIR_MUTATIONS=n` runs a deeper search than the default.
    let rounds = std::env::var("KIR_MUTATIONS").ok().and_then(|s| s.parse().ok()).unwrap_or(400);
    let mut rng = Rng(0x6b69_6c6e);
    for (name, text) in fixtures() {
        for end in (0..text.len()).filter(|&i| text.is_char_boundary(i)) {
            parse_must_not_panic(&text[..end]);
        }
        let bytes = text.as_bytes();
        for _ in 0..rounds {
            let mut m = bytes.to_vec();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(m.len());
                match rng.below(4) {
                    0 => {
                        m.remove(at.min(m.len().saturating_sub(1)));
                    }
                    1 => m.insert(at, (rng.next() & 0xff) as u8),
                    2 => {
                        let splice = SPLICES[rng.below(SPLICES.len())].as_bytes();
                        let len = rng.below(4).min(m.len() - at);
                        m.splice(at..at + len, splice.iter().copied());
                    }
                    _ => {
                        // Replace a digit run with an extreme number.
                        let start = (at..m.len()).find(|&i| m[i].is_ascii_digit()).unwrap_or(at);
                        let end = (start..m.len()).find(|&i| !m[i].is_ascii_digit()).unwrap_or(m.len());
                        let splice = SPLICES[rng.below(8)].as_bytes();
                        m.splice(start..end, splice.iter().copied());
                    }
                }
            }
            let src = String::from_utf8_lossy(&m);
            let result = std::panic::catch_unwind(|| parse_must_not_panic(&src));
            assert!(result.is_ok(), "fixture {name}: mutated input panicked:\n{src}");
        }
    }
}

/// Derived dims print in canonical form and parse back to themselves, including a canonical form that starts
/// with a negated term (`B-A` prints as `-A+B`: found by the `kir_parse` fuzz campaign, where the parser did not
/// take a leading `-` as the start of a dim expression).
#[test]
fn derived_dims_round_trip_through_text() {
    for (written, canonical) in
        [("B-A", "-A+B"), ("(H-1)/2+1", "(H+1)/2"), ("2*(S+T)", "2*S+2*T"), ("W*H", "H*W"), ("-A+B+3", "-A+B+3")]
    {
        let text = format!("graph \"g\" {{\n  %0 = input {{name=\"x\"}} : f32[1,{written}]\n  output \"y\" = %0\n}}\n");
        let g = kiln_ir::parse(&text).unwrap_or_else(|e| panic!("{written}: {e}"));
        let printed = kiln_ir::print(&g);
        assert!(printed.contains(&format!("f32[1,{canonical}]")), "{written}: {printed}");
        let again = kiln_ir::parse(&printed).unwrap_or_else(|e| panic!("{written}: printed text does not parse: {e}"));
        assert_eq!(kiln_ir::print(&again), printed, "{written}: printing is a fixed point");
    }
}

/// Dim-valued attributes take derived dims as types do (`2*h`, `(w+1)/2`): what the printer writes for a resize
/// or reshape on symbolic extents (as ONNX import makes them) parses back, and a derived `k` ends at the `}`.
#[test]
fn derived_dims_in_attributes_round_trip() {
    let text = "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[1,2,h,w]\n  \
                %1 = resize %0 {mode=linear, coord=half_pixel, nearest=round_prefer_floor, shape=[1,2,2*h,(w+1)/2], \
                scales=[1.0, 1.0, 2.0, 0.5]} : f32[1,2,2*h,(w+1)/2]\n  \
                %2 = reshape %1 {shape=[2,2*h,(w+1)/2]} : f32[2,2*h,(w+1)/2]\n  \
                %3, %4 = top_k %1 {axis=2, k=h*2, largest=true, sorted=true} : f32[1,2,2*h,(w+1)/2], i64[1,2,2*h,(w+1)/2]\n  \
                output \"y\" = %3\n  output \"flat\" = %2\n}\n";
    let g = parse_ok("derived", text);
    let printed = kiln_ir::print(&g);
    let again = parse_ok("derived, printed", &printed);
    assert_eq!(kiln_ir::print(&again), printed);
    assert!(printed.contains("shape=[1,2,2*h,(w+1)/2]"), "{printed}");
}
