//! The `kiln` CLI on ONNX models: `check` on supported and unsupported models (exit codes, every problem named,
//! no panic), `run` with `.npy` inputs and `--shape` for symbolic dims, `inspect` and `opt` reading `.onnx`; and
//! the reference models (`../shared/models/`, or `KILN_MODELS_DIR`) run on the interpreter and compared with ONNX
//! Runtime's saved outputs. Without the reference models that test prints a `SKIPPED:` line and passes.
//!
//! The models here are written with a few lines of protobuf encoding ([`pb`]) rather than `onnx-protobuf`, which
//! the root package does not depend on; what they decode to is checked by the importer's own tests.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use kiln_ir::Tensor;

mod common;

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("the kiln binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_no_panic(o: &Output) {
    let err = stderr(o);
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "{err}");
}

/// Protobuf wire encoding of the few ONNX messages these tests need (field numbers from `onnx.proto`).
mod pb {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// A message under construction.
    #[derive(Default)]
    pub struct Msg(Vec<u8>);

    impl Msg {
        pub fn int(mut self, field: u32, v: i64) -> Msg {
            varint(&mut self.0, u64::from(field) << 3);
            varint(&mut self.0, v as u64);
            self
        }

        pub fn bytes(mut self, field: u32, b: &[u8]) -> Msg {
            varint(&mut self.0, u64::from(field) << 3 | 2);
            varint(&mut self.0, b.len() as u64);
            self.0.extend_from_slice(b);
            self
        }

        pub fn str(self, field: u32, s: &str) -> Msg {
            self.bytes(field, s.as_bytes())
        }

        pub fn msg(self, field: u32, m: Msg) -> Msg {
            self.bytes(field, &m.0)
        }

        pub fn finish(self) -> Vec<u8> {
            self.0
        }
    }

    /// `ValueInfoProto` of an f32 tensor; dims are extents or `dim_param` names.
    pub fn f32_input(name: &str, dims: &[&str]) -> Msg {
        let shape = dims.iter().fold(Msg::default(), |s, d| {
            let dim = match d.parse::<i64>() {
                Ok(n) => Msg::default().int(1, n),
                Err(_) => Msg::default().str(2, d),
            };
            s.msg(1, dim)
        });
        let tensor_type = Msg::default().int(1, 1).msg(2, shape);
        Msg::default().str(1, name).msg(2, Msg::default().msg(1, tensor_type))
    }

    /// `ValueInfoProto` with only a name (graph outputs).
    pub fn output(name: &str) -> Msg {
        Msg::default().str(1, name)
    }

    /// `NodeProto`.
    pub fn node(name: &str, op_type: &str, inputs: &[&str], outputs: &[&str]) -> Msg {
        let m = inputs.iter().fold(Msg::default(), |m, i| m.str(1, i));
        let m = outputs.iter().fold(m, |m, o| m.str(2, o));
        m.str(3, name).str(4, op_type)
    }

    /// `TensorProto` of f32 values in `raw_data`.
    pub fn f32_tensor(name: &str, dims: &[i64], data: &[f32]) -> Msg {
        let m = dims.iter().fold(Msg::default(), |m, &d| m.int(1, d));
        let raw: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        m.int(2, 1).str(8, name).bytes(9, &raw)
    }

    /// `ModelProto` at opset 17 around a `GraphProto`.
    pub fn model(graph: Msg) -> Vec<u8> {
        Msg::default().int(1, 8).msg(8, Msg::default().int(2, 17)).msg(7, graph).finish()
    }
}

const W: [f32; 12] = [0.5, -1.0, 0.25, 1.5, 0.0, -0.5, 2.0, 1.0, -2.0, 0.75, -0.25, 1.0];
const B: [f32; 3] = [0.1, -0.2, 0.3];

/// `y = Relu(x @ W + b)` on `x: f32[batch, 4]`.
fn mlp_model() -> Vec<u8> {
    pb::model(
        pb::Msg::default()
            .msg(1, pb::node("matmul", "MatMul", &["x", "W"], &["xw"]))
            .msg(1, pb::node("add", "Add", &["xw", "b"], &["h"]))
            .msg(1, pb::node("relu", "Relu", &["h"], &["y"]))
            .str(2, "mlp")
            .msg(5, pb::f32_tensor("W", &[4, 3], &W))
            .msg(5, pb::f32_tensor("b", &[3], &B))
            .msg(11, pb::f32_input("x", &["batch", "4"]))
            .msg(12, pb::output("y")),
    )
}

/// The reference result of [`mlp_model`].
fn mlp_reference(x: &[f32]) -> Vec<f32> {
    x.chunks(4)
        .flat_map(|row| (0..3).map(move |j| (B[j] + (0..4).map(|k| row[k] * W[k * 3 + j]).sum::<f32>()).max(0.0)))
        .collect()
}

/// Two different unsupported ops and a supported one between them.
fn unsupported_model() -> Vec<u8> {
    pb::model(
        pb::Msg::default()
            .msg(1, pb::node("det", "Det", &["x"], &["idx"]))
            .msg(1, pb::node("relu", "Relu", &["x"], &["r"]))
            .msg(1, pb::node("bern", "Bernoulli", &["r"], &["u"]))
            .str(2, "unsupported")
            .msg(11, pb::f32_input("x", &["4"]))
            .msg(12, pb::output("idx"))
            .msg(12, pb::output("u")),
    )
}

fn write_models(dir: &Path) -> (String, String) {
    let (mlp, bad) = (dir.join("mlp.onnx"), dir.join("unsupported.onnx"));
    std::fs::write(&mlp, mlp_model()).unwrap();
    std::fs::write(&bad, unsupported_model()).unwrap();
    (mlp.display().to_string(), bad.display().to_string())
}

#[test]
fn check_reports_a_supported_model() {
    let tmp = tempfile::tempdir().unwrap();
    let (mlp, _) = write_models(tmp.path());
    let o = kiln(&["check", &mlp]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("mlp.onnx: supported"), "{}", stdout(&o));
}

/// Machine-readable output for scripts: `check --json` (same exit code as the text form) and `inspect --json` with
/// the model's ONNX op types beside the IR ops they became.
#[test]
fn check_and_inspect_speak_json_with_onnx_op_types() {
    let tmp = tempfile::tempdir().unwrap();
    let (mlp, bad) = write_models(tmp.path());
    let o = kiln(&["check", &mlp, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("check --json prints JSON");
    assert!(o.status.success() && v["supported"] == true && v["unsupported"].as_array().unwrap().is_empty(), "{v}");
    let o = kiln(&["check", &bad, "--json"]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("check --json prints JSON");
    let ops: Vec<&str> = v["unsupported"].as_array().unwrap().iter().map(|u| u["op_type"].as_str().unwrap()).collect();
    assert_eq!(ops, ["Det", "Bernoulli"], "{v}");
    assert_eq!(v["unsupported"][0]["node"], "det");
    let o = kiln(&["inspect", &mlp, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("inspect --json prints JSON");
    let onnx_ops: Vec<&str> =
        v["onnx_ops"].as_array().unwrap().iter().map(|o| o["op_type"].as_str().unwrap()).collect();
    assert!(!onnx_ops.is_empty() && onnx_ops.iter().all(|o| o.chars().next().unwrap().is_uppercase()), "{v}");
    assert!(!v["ops"].as_array().unwrap().is_empty(), "{v}");
    let text = stdout(&kiln(&["inspect", &mlp]));
    assert!(text.contains("ONNX ops:") && text.contains("ops (kiln IR):"), "{text}");
}

#[test]
fn check_names_every_unsupported_op_and_exits_4() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, bad) = write_models(tmp.path());
    let o = kiln(&["check", &bad]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert_no_panic(&o);
    let out = stdout(&o);
    assert!(out.contains("unsupported: Det (node `det`)"), "{out}");
    assert!(out.contains("unsupported: Bernoulli (node `bern`)"), "{out}");
    assert_eq!(out.lines().count(), 2, "one line per problem:\n{out}");
    assert!(stderr(&o).starts_with("error: ") && stderr(&o).contains("2 unsupported feature(s)"), "{}", stderr(&o));
    // Other commands refuse it with the same list.
    let o = kiln(&["run", &bad, "--output-dir", tmp.path().join("out").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(4));
    assert_no_panic(&o);
    assert!(
        stderr(&o).contains("Det (node `det`)") && stderr(&o).contains("Bernoulli (node `bern`)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn check_on_unreadable_files_is_one_error() {
    let tmp = tempfile::tempdir().unwrap();
    let garbage = tmp.path().join("garbage.onnx");
    std::fs::write(&garbage, b"\xff\xff\xff not protobuf").unwrap();
    for (path, needle) in [(garbage, "not a valid ONNX model"), (tmp.path().join("absent.onnx"), "absent.onnx")] {
        let o = kiln(&["check", path.to_str().unwrap()]);
        // Exit 3: could not read.
        assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
        assert_no_panic(&o);
        assert!(stderr(&o).starts_with("error: ") && stderr(&o).contains(needle), "{}", stderr(&o));
    }
}

#[test]
fn run_takes_npy_inputs_and_shapes_for_symbolic_dims() {
    let tmp = tempfile::tempdir().unwrap();
    let (mlp, _) = write_models(tmp.path());
    let xs: Vec<f32> = (0..8).map(|i| i as f32 * 0.5 - 2.0).collect();
    let x = tmp.path().join("x.npy");
    kiln::npy::write(&x, &Tensor::from_vec(vec![2, 4], xs.clone()).unwrap()).unwrap();
    let out = tmp.path().join("out");
    let o = kiln(&[
        "run",
        &mlp,
        "--backend",
        "interp",
        "--input",
        &format!("x={}", x.display()),
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("y: f32[2,3]"), "{}", stdout(&o));
    let y = kiln::npy::read(&out.join("y.npy")).unwrap();
    let want = Tensor::from_vec(vec![2, 3], mlp_reference(&xs)).unwrap();
    kiln::conformance::compare(&y, &want, 1e-6, 1e-6).unwrap();

    // Random inputs need the symbolic batch given.
    let o = kiln(&["run", &mlp, "--shape", "x=5x4", "--output-dir", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(kiln::npy::read(&out.join("y.npy")).unwrap().shape(), &[5, 3]);
    let o = kiln(&["run", &mlp, "--output-dir", out.to_str().unwrap()]);
    // Exit 5: the input (its shape) is missing.
    assert_eq!(o.status.code(), Some(5));
    assert_no_panic(&o);
    assert!(stderr(&o).contains("--shape x="), "{}", stderr(&o));
}

#[test]
fn inspect_and_opt_read_onnx() {
    let tmp = tempfile::tempdir().unwrap();
    let (mlp, _) = write_models(tmp.path());
    let o = kiln(&["inspect", &mlp]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for needle in ["graph mlp", "x: f32[batch,4]", "y: f32[batch,3]", "matmul", "relu"] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
    let kir = tmp.path().join("mlp.kir");
    let o = kiln(&["opt", &mlp, "-o", kir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&kir).unwrap();
    assert!(text.starts_with("graph \"mlp\""), "{text}");
    // The printed model runs like the original.
    let xs = [1.0f32, -1.0, 0.5, 2.0];
    let given = BTreeMap::from([("x".to_string(), Tensor::from_vec(vec![1, 4], xs.to_vec()).unwrap())]);
    let from_kir = kiln::Model::load(&kir, &kiln::LoadOptions::default()).unwrap();
    let y = &from_kir.run(&given, &kiln::RunOptions::default()).unwrap()[0].1;
    kiln::conformance::compare(y, &Tensor::from_vec(vec![1, 3], mlp_reference(&xs)).unwrap(), 1e-6, 1e-6).unwrap();
}

#[test]
fn reference_models_match_onnx_runtime_on_the_interpreter() {
    common::check_reference_models(kiln::Backend::Interp);
}

/// Conformance never hides a broken case: corrupt or unreadable test data fails its case (not "unsupported"), a
/// case whose `model.onnx` is a directory fails saying so, and the run exits 1; good data still passes, named or
/// (old-style, empty names) bound by position.
#[test]
fn conformance_reports_broken_cases_as_failures() {
    let root = tempfile::tempdir().unwrap();
    let case = |name: &str, model: Option<&[u8]>, input: &[u8], output: &[u8]| {
        let dir = root.path().join(name);
        let ds = dir.join("test_data_set_0");
        std::fs::create_dir_all(&ds).unwrap();
        match model {
            Some(bytes) => std::fs::write(dir.join("model.onnx"), bytes).unwrap(),
            None => std::fs::create_dir_all(dir.join("model.onnx")).unwrap(),
        }
        std::fs::write(ds.join("input_0.pb"), input).unwrap();
        std::fs::write(ds.join("output_0.pb"), output).unwrap();
    };
    let x = [1.0f32, -2.0, 3.0, -4.0, 0.5, 0.0, -1.0, 2.0];
    let y = mlp_reference(&x);
    let input = pb::f32_tensor("x", &[2, 4], &x).finish();
    let output = pb::f32_tensor("y", &[2, 3], &y).finish();
    case("test_good", Some(&mlp_model()), &input, &output);
    case("test_corrupt_input", Some(&mlp_model()), b"\xff\xff\xff garbage", &output);
    case("test_model_is_a_directory", None, &input, &output);
    // Old-style test data with empty tensor names binds by position, as ONNX's backend runner does.
    let unnamed = pb::f32_tensor("", &[2, 4], &x).finish();
    case("test_unnamed_data", Some(&mlp_model()), &unnamed, &pb::f32_tensor("", &[2, 3], &y).finish());
    let o = kiln(&["conformance", root.path().to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert_no_panic(&o);
    assert!(out.lines().any(|l| l.starts_with("passed") && l.ends_with("test_good")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("passed") && l.ends_with("test_unnamed_data")), "{out}");
    assert!(out.lines().any(|l| l.contains("test_corrupt_input") && l.starts_with("FAILED")), "{out}");
    assert!(out.lines().any(|l| l.contains("test_model_is_a_directory") && l.contains("not a file")), "{out}");
    assert!(out.trim_end().ends_with("2 passed, 2 failed, 0 unsupported"), "{out}");
}

/// `--fix-input NAME=FILE.npy` specializes an ONNX model on an input's value: a Resize whose scales are a graph
/// input is refused (saying how to fix it) until its scales are fixed, then compiles (no interpreter step) and
/// computes the nearest upsampling; the fixed input is no longer one the run takes.
#[test]
fn fix_input_specializes_on_an_inputs_value() {
    let root = tempfile::tempdir().unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx/resize_scales_input.onnx");
    let m = model.to_str().unwrap();
    let p = |name: &str| root.path().join(name).to_string_lossy().into_owned();
    kiln::npy::write(
        Path::new(&p("x.npy")),
        &Tensor::from_vec(vec![1, 1, 2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap(),
    )
    .unwrap();
    kiln::npy::write(Path::new(&p("scales.npy")), &Tensor::from_vec(vec![4], vec![1.0f32, 1.0, 2.0, 2.0]).unwrap())
        .unwrap();
    let refused = kiln(&["run", m, "--input", &format!("x={}", p("x.npy")), "-o", &p("out")]);
    assert!(!refused.status.success() && stderr(&refused).contains("--fix-input"), "{}", stderr(&refused));
    let o = kiln(&[
        "run",
        m,
        "--input",
        &format!("x={}", p("x.npy")),
        "--fix-input",
        &format!("scales={}", p("scales.npy")),
        "--fallback",
        "deny",
        "-o",
        &p("out"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let y = kiln::npy::read(Path::new(&p("out/y.npy"))).unwrap();
    let want: Vec<f32> = [1., 1., 2., 2., 3., 3.]
        .iter()
        .chain(&[1., 1., 2., 2., 3., 3.])
        .chain(&[4., 4., 5., 5., 6., 6.])
        .chain(&[4., 4., 5., 5., 6., 6.])
        .copied()
        .collect();
    assert_eq!(y, Tensor::from_vec(vec![1, 1, 4, 6], want).unwrap());
    let checked = kiln(&["check", m, "--fix-input", &format!("scales={}", p("scales.npy"))]);
    assert!(checked.status.success(), "{}", stderr(&checked));
    let twice = kiln(&[
        "run",
        m,
        "--input",
        &format!("scales={}", p("scales.npy")),
        "--fix-input",
        &format!("scales={}", p("scales.npy")),
    ]);
    assert!(stderr(&twice).contains("cannot also be given"), "{}", stderr(&twice));
}
