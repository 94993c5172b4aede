//! The `kiln` CLI end to end: `run`, `opt`, `inspect` on every fixture, and every kind of bad input getting one
//! clear error line, a non-zero exit and no panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln_ir::{DType, Tensor};

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("the kiln binary runs")
}

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "kir"))
        .collect();
    v.sort();
    assert!(v.len() >= 10, "expected the fixture set in {}", dir.display());
    v
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A failed command: a user-error exit code (1, or 3–5 by kind: see docs/cli.md), one `error:` line first, and
/// nothing that looks like a panic.
fn assert_clean_failure(o: &Output, needle: &str) {
    let err = stderr(o);
    assert!(matches!(o.status.code(), Some(1 | 3 | 4 | 5)), "expected a user-error exit code, stderr:\n{err}");
    assert!(err.starts_with("error: "), "stderr should start with `error: `:\n{err}");
    assert!(!err.contains("panicked") && !err.contains("internal error") && !err.contains("RUST_BACKTRACE"), "{err}");
    assert!(err.contains(needle), "stderr should mention `{needle}`:\n{err}");
}

fn is_runnable(path: &Path) -> bool {
    // Fixtures with parameters need weights; the rest run on pseudo-random inputs, with symbolic dims set to 2.
    let text = std::fs::read_to_string(path).unwrap();
    !text.contains(" = param ")
}

fn shape_args(path: &Path) -> Vec<String> {
    let model = kiln::Model::load(path, &kiln::LoadOptions::default()).unwrap();
    model
        .inputs()
        .into_iter()
        .filter(|(_, t)| !t.shape.is_static())
        .map(|(n, t)| {
            let dims: Vec<String> = t.shape.0.iter().map(|d| d.as_static().unwrap_or(2).to_string()).collect();
            format!("{n}={}", dims.join("x"))
        })
        .flat_map(|s| ["--shape".to_string(), s])
        .collect()
}

#[test]
fn run_writes_outputs_and_manifest_for_every_fixture() {
    let tmp = tempfile::tempdir().unwrap();
    let mut ran = 0;
    for f in fixtures().iter().filter(|f| is_runnable(f)) {
        let out = tmp.path().join(f.file_stem().unwrap());
        let mut args =
            vec!["run".to_string(), f.display().to_string(), "--output-dir".into(), out.display().to_string()];
        args.extend(shape_args(f));
        let o = kiln(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{}: {}", f.display(), stderr(&o));
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
        let entries = manifest.as_array().expect("manifest is a list");
        let model = kiln::Model::load(f, &kiln::LoadOptions::default()).unwrap();
        assert_eq!(entries.len(), model.graph().outputs().len(), "{}", f.display());
        for (entry, (name, _)) in entries.iter().zip(model.graph().outputs()) {
            assert_eq!(entry["name"], name.as_str());
            let file = entry["file"].as_str().unwrap();
            let t = kiln::npy::read(&out.join(file)).unwrap();
            assert_eq!(entry["dtype"], t.dtype().name());
            assert_eq!(entry["shape"].as_array().unwrap().len(), t.shape().len());
            for (d, &n) in entry["shape"].as_array().unwrap().iter().zip(t.shape()) {
                assert_eq!(d.as_u64(), Some(n as u64));
            }
        }
        ran += 1;
    }
    assert!(ran >= 8, "only {ran} fixtures were runnable");
}

#[test]
fn run_output_matches_the_library_interpreter() {
    let f = fixtures().into_iter().find(|f| is_runnable(f) && shape_args(f).is_empty()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let o = kiln(&["run", f.to_str().unwrap(), "--seed", "5", "--output-dir", tmp.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let model = kiln::Model::load(&f, &kiln::LoadOptions::default()).unwrap();
    let inputs = model.random_inputs(&Default::default(), 5).unwrap();
    let expected = model
        .run(&inputs, &kiln::RunOptions { backend: kiln::Backend::Interp, threads: 1, ..Default::default() })
        .unwrap();
    for (name, t) in expected {
        let got = kiln::npy::read(
            &tmp.path()
                .join(format!("{name}.npy").replace(|c: char| !c.is_ascii_alphanumeric() && !"_.-".contains(c), "_")),
        )
        .unwrap();
        // The CLI runs the compiled CPU code, whose transcendental approximations are within a few ulp.
        kiln::conformance::compare(&got, &t, 1e-5, 1e-6).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn given_inputs_are_used() {
    let tmp = tempfile::tempdir().unwrap();
    let model_path = tmp.path().join("double.kir");
    std::fs::write(
        &model_path,
        "graph \"double\" {\n  %0 = input {name=\"x\"} : f32[3]\n  %1 = add %0, %0 : f32[3]\n  output \"y\" = %1\n}\n",
    )
    .unwrap();
    let x = tmp.path().join("x.npy");
    kiln::npy::write(&x, &Tensor::from_vec(vec![3], vec![1.0f32, -2.0, 0.5]).unwrap()).unwrap();
    let out = tmp.path().join("out");
    let o = kiln(&[
        "run",
        model_path.to_str().unwrap(),
        "--input",
        &format!("x={}", x.display()),
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let y = kiln::npy::read(&out.join("y.npy")).unwrap();
    assert_eq!(y.as_slice::<f32>().unwrap(), &[2.0, -4.0, 1.0]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("y: f32[3]"), "{stdout}");
}

#[test]
fn opt_round_trip_is_a_fixed_point_on_every_fixture() {
    let tmp = tempfile::tempdir().unwrap();
    for f in fixtures() {
        let y = tmp.path().join("y.kir");
        let z = tmp.path().join("z.kir");
        let o = kiln(&["opt", f.to_str().unwrap(), "-o", y.to_str().unwrap()]);
        assert!(o.status.success(), "{}: {}", f.display(), stderr(&o));
        let o = kiln(&["opt", y.to_str().unwrap(), "-o", z.to_str().unwrap()]);
        assert!(o.status.success(), "{}: {}", f.display(), stderr(&o));
        assert_eq!(std::fs::read_to_string(&y).unwrap(), std::fs::read_to_string(&z).unwrap(), "{}", f.display());
        // Without -o the same text goes to stdout.
        let o = kiln(&["opt", y.to_str().unwrap()]);
        assert_eq!(String::from_utf8_lossy(&o.stdout), std::fs::read_to_string(&y).unwrap());
    }
}

#[test]
fn opt_writes_weights_beside_the_text() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("m.kir");
    std::fs::write(
        &src,
        "graph \"m\" {\n  %0 = input {name=\"x\"} : f32[2,3]\n  %1 = param {name=\"w\"} : f32[3,2]\n  %2 = matmul %0, %1 : f32[2,2]\n  output \"y\" = %2\n}\n",
    )
    .unwrap();
    let mut w = kiln_ir::Weights::default();
    w.insert("w", Tensor::random(DType::F32, vec![3, 2], 1));
    kiln::weights::save(&tmp.path().join("m.safetensors"), &w).unwrap();
    let out = tmp.path().join("copy.kir");
    let o = kiln(&["opt", src.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(kiln::weights::load(&tmp.path().join("copy.safetensors")).unwrap(), w);
    let o = kiln(&["run", out.to_str().unwrap(), "--output-dir", tmp.path().join("o").to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn random_weights_bind_every_param_without_a_weight() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("m.kir");
    std::fs::write(
        &src,
        "graph \"m\" {\n  %0 = input {name=\"x\"} : f32[batch,3]\n  %1 = param {name=\"w\"} : f32[3,2]\n  %2 = param {name=\"b\"} : f16[2]\n  %3 = matmul %0, %1 : f32[batch,2]\n  %4 = cast %2 {to=f32} : f32[2]\n  %5 = add %3, %4 : f32[batch,2]\n  output \"y\" = %5\n}\n",
    )
    .unwrap();
    let (m, dir) = (src.to_str().unwrap(), tmp.path());
    // Without weights the model does not run; with them it does, the same way twice, and the seed matters.
    let o = kiln(&["run", m, "--shape", "x=2x3", "--backend", "interp", "-o", dir.join("none").to_str().unwrap()]);
    assert_clean_failure(&o, "w");
    let run = |seed: &str, out: &str| {
        let out = dir.join(out);
        let o = kiln(&["run", m, "--random-weights", seed, "--shape", "x=2x3", "-o", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        kiln::npy::read(&out.join("y.npy")).unwrap()
    };
    assert_eq!(run("7", "a"), run("7", "b"));
    assert_ne!(run("7", "a"), run("8", "c"));
    // The i-th param, in graph order, gets seed SEED + i.
    let copy = dir.join("copy.kir");
    let o = kiln(&["opt", m, "--random-weights", "7", "-o", copy.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut expected = kiln_ir::Weights::default();
    expected.insert("w", Tensor::random(DType::F32, vec![3, 2], 7));
    expected.insert("b", Tensor::random(DType::F16, vec![2], 8));
    assert_eq!(kiln::weights::load(&dir.join("copy.safetensors")).unwrap(), expected);
    // A weight that is given is kept: only the missing ones are made up.
    let mut given = kiln_ir::Weights::default();
    given.insert("w", Tensor::random(DType::F32, vec![3, 2], 100));
    kiln::weights::save(&dir.join("w.safetensors"), &given).unwrap();
    let w = dir.join("w.safetensors");
    let o = kiln(&["opt", m, "--weights", w.to_str().unwrap(), "--random-weights", "7", "-o", copy.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    given.insert("b", Tensor::random(DType::F16, vec![2], 8));
    assert_eq!(kiln::weights::load(&dir.join("copy.safetensors")).unwrap(), given);
    // A param with symbolic dims cannot be made up: the error names it.
    let sym = dir.join("sym.kir");
    std::fs::write(
        &sym,
        "graph \"s\" {\n  %0 = input {name=\"x\"} : f32[n]\n  %1 = param {name=\"scale\"} : f32[n]\n  %2 = mul %0, %1 : f32[n]\n  output \"y\" = %2\n}\n",
    )
    .unwrap();
    let o = kiln(&["run", sym.to_str().unwrap(), "--random-weights", "0", "--shape", "x=4"]);
    assert_clean_failure(&o, "param `scale` has symbolic dims");
    // A compiled artifact carries its weights: nothing to make up.
    if !have_cc() {
        return;
    }
    let artifact = dir.join("artifact");
    let o = kiln(&["compile", m, "--random-weights", "7", "--shape", "x=2x3", "-o", artifact.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for cmd in ["run", "bench"] {
        let o = kiln(&[cmd, artifact.to_str().unwrap(), "--random-weights", "7"]);
        assert_clean_failure(&o, "--random-weights: a compiled artifact carries its weights");
    }
}

fn have_cc() -> bool {
    let ok = Command::new("cc").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIPPED: no cc: no artifact is compiled");
    }
    ok
}

/// scripts/gpu-bundle.sh links resnet18's batch-32 weights to the batch-1 artifact's: a relative symlink in place of
/// `weights.safetensors` loads as the file it points to.
#[cfg(unix)]
#[test]
fn artifact_weights_may_be_a_relative_symlink() {
    if !have_cc() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mlp_params.kir");
    let (a, b) = (tmp.path().join("a/artifact"), tmp.path().join("b/artifact"));
    for dir in [&a, &b] {
        let o = kiln(&[
            "compile",
            fixture.to_str().unwrap(),
            "--random-weights",
            "3",
            "--shape",
            "x=2x784",
            "-o",
            dir.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    std::fs::remove_file(b.join("weights.safetensors")).unwrap();
    std::os::unix::fs::symlink("../../a/artifact/weights.safetensors", b.join("weights.safetensors")).unwrap();
    let run = |dir: &Path, out: &str| {
        let out = tmp.path().join(out);
        let o = kiln(&["run", dir.to_str().unwrap(), "--seed", "1", "--shape", "x=2x784", "-o", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        kiln::npy::read(&out.join("logits.npy")).unwrap()
    };
    assert_eq!(run(&a, "oa"), run(&b, "ob"));
}

#[test]
fn inspect_reports_inputs_outputs_ops_and_parameters() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("m.kir");
    std::fs::write(
        &src,
        "graph \"m\" {\n  %0 = input {name=\"x\"} : f32[batch,3]\n  %1 = param {name=\"w\"} : f32[3,4]\n  %2 = matmul %0, %1 : f32[batch,4]\n  %3 = relu %2 : f32[batch,4]\n  %4 = relu %3 : f32[batch,4]\n  output \"y\" = %4\n}\n",
    )
    .unwrap();
    let o = kiln(&["inspect", src.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for needle in
        ["x: f32[batch,3]", "y: f32[batch,4]", "2  relu", "1  matmul", "parameters: 1 tensors, 12 elements, 48 bytes"]
    {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
    let o = kiln(&["inspect", src.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["parameter_bytes"], 48);
    assert_eq!(v["ops"][0]["op"], "relu");
}

#[test]
fn every_subcommand_has_help() {
    for sub in [&["--help"][..], &["run", "--help"], &["opt", "--help"], &["inspect", "--help"]] {
        let o = kiln(sub);
        assert!(o.status.success());
        assert!(String::from_utf8_lossy(&o.stdout).contains("Usage"));
    }
}

struct BadCase {
    name: &'static str,
    args: Vec<String>,
    needle: &'static str,
}

#[test]
fn bad_input_is_one_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n).display().to_string();
    std::fs::write(
        p("ok.kir"),
        "graph \"ok\" {\n  %0 = input {name=\"x\"} : f32[2,3]\n  %1 = exp %0 : f32[2,3]\n  output \"y\" = %1\n}\n",
    )
    .unwrap();
    std::fs::write(
        p("bad.kir"),
        "graph \"bad\" {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = frobnicate %0 : f32[2]\n}\n",
    )
    .unwrap();
    std::fs::write(p("garbage.kir"), [0xffu8, 0xfe, 0x00, 0x41]).unwrap();
    std::fs::write(p("sym.kir"), "graph \"sym\" {\n  %0 = input {name=\"x\"} : f32[batch,3]\n  output \"y\" = %0\n}\n")
        .unwrap();
    std::fs::write(p("noweights.kir"), "graph \"nw\" {\n  %0 = param {name=\"w\"} : f32[2]\n  output \"y\" = %0\n}\n")
        .unwrap();
    std::fs::write(p("model.onnx"), b"\x08\x07").unwrap();
    std::fs::write(p("junk.npy"), b"definitely not numpy").unwrap();
    kiln::npy::write(Path::new(&p("i64.npy")), &Tensor::zeros(DType::I64, vec![2, 3])).unwrap();
    kiln::npy::write(Path::new(&p("wrongshape.npy")), &Tensor::zeros(DType::F32, vec![3, 2])).unwrap();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let out = p("out");
    let cases = vec![
        BadCase { name: "malformed kir", args: s(&["run", &p("bad.kir")]), needle: "3:" },
        BadCase { name: "binary garbage", args: s(&["opt", &p("garbage.kir")]), needle: "garbage.kir" },
        BadCase { name: "missing model", args: s(&["inspect", &p("nope.kir")]), needle: "nope.kir" },
        BadCase {
            name: "unknown input",
            args: s(&["run", &p("ok.kir"), "--input", &format!("z={}", p("i64.npy")), "--output-dir", &out]),
            needle: "no input `z`",
        },
        BadCase {
            name: "wrong dtype",
            args: s(&["run", &p("ok.kir"), "--input", &format!("x={}", p("i64.npy")), "--output-dir", &out]),
            needle: "must be f32",
        },
        BadCase {
            name: "wrong shape",
            args: s(&["run", &p("ok.kir"), "--input", &format!("x={}", p("wrongshape.npy")), "--output-dir", &out]),
            needle: "must have shape [2,3]",
        },
        BadCase {
            name: "missing npy",
            args: s(&["run", &p("ok.kir"), "--input", &format!("x={}", p("absent.npy")), "--output-dir", &out]),
            needle: "absent.npy",
        },
        BadCase {
            name: "junk npy",
            args: s(&["run", &p("ok.kir"), "--input", &format!("x={}", p("junk.npy")), "--output-dir", &out]),
            needle: "junk.npy",
        },
        BadCase {
            name: "input without =",
            args: s(&["run", &p("ok.kir"), "--input", "x", "--output-dir", &out]),
            needle: "expected --input as NAME=FILE.npy",
        },
        BadCase {
            name: "symbolic dim without shape",
            args: s(&["run", &p("sym.kir"), "--output-dir", &out]),
            needle: "--shape x=1x3",
        },
        BadCase {
            name: "bad --shape",
            args: s(&["run", &p("sym.kir"), "--shape", "x=2xq", "--output-dir", &out]),
            needle: "bad dimension",
        },
        BadCase {
            name: "shape of wrong rank",
            args: s(&["run", &p("sym.kir"), "--shape", "x=2", "--output-dir", &out]),
            needle: "must have shape",
        },
        BadCase {
            name: "missing weights",
            args: s(&["run", &p("noweights.kir"), "--output-dir", &out]),
            needle: "`w`",
        },
        BadCase { name: "onnx without a graph", args: s(&["run", &p("model.onnx")]), needle: "invalid model" },
        BadCase {
            name: "cuda backend not built",
            args: s(&["run", &p("ok.kir"), "--backend", "cuda", "--output-dir", &out]),
            needle: "backend `cuda`",
        },
        BadCase {
            name: "missing weights file",
            args: s(&["run", &p("ok.kir"), "--weights", &p("w.safetensors")]),
            needle: "w.safetensors",
        },
    ];
    for c in cases {
        let o = kiln(&c.args.iter().map(String::as_str).collect::<Vec<_>>());
        eprintln!("case `{}`: {}", c.name, stderr(&o).trim_end());
        assert_clean_failure(&o, c.needle);
    }
    // A usage error (unknown backend name) is clap's: exit 2, still no panic.
    let o = kiln(&["run", &p("ok.kir"), "--backend", "tpu"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown backend `tpu`"));
}

#[test]
fn opt_runs_pipelines_with_instrumentation() {
    let f = fixtures().into_iter().find(|f| f.ends_with("mlp_symbolic_batch.kir")).expect("fixture");
    let o = kiln(&["opt", f.to_str().unwrap(), "-O2", "--print-after-all", "--time-passes", "--verify-each"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for pass in ["infer-shapes", "canonicalize", "fold-constants", "cse", "dce"] {
        assert!(err.contains(&format!("IR Dump After {pass}")), "no dump after {pass}:\n{err}");
    }
    assert!(err.contains("Pass execution timing report"), "{err}");
    // The optimized text still parses and runs.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o.kir");
    std::fs::write(&out, &o.stdout).unwrap();
    let o = kiln(&[
        "run",
        out.to_str().unwrap(),
        "--shape",
        "x=2x4",
        "--output-dir",
        tmp.path().join("d").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A malformed pipeline is one clear error with a caret.
    let o = kiln(&["opt", f.to_str().unwrap(), "--pipeline", "cse,,dce"]);
    assert_clean_failure(&o, "^");
    let o = kiln(&["opt", f.to_str().unwrap(), "--pipeline", "frobnicate"]);
    assert_clean_failure(&o, "frobnicate");
}

/// A graph with one node the compiled backends do not compile yet (`scatter`), for the fallback report tests.
const ONE_FALLBACK: &str = "graph \"one_fallback\" {\n  %0 = input {name=\"x\"} : f32[4,8]\n  \
    %1 = constant {value=i64[1,8] [0, 1, 2, 3, 0, 1, 2, 3]} : i64[1,8]\n  \
    %2 = constant {value=f32[1,8] [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]} : f32[1,8]\n  \
    %3 = scatter %0, %1, %2 {axis=0, reduction=add} : f32[4,8]\n  output \"v\" = %3\n}\n";

#[test]
fn logging_is_off_by_default_and_follows_verbosity_and_kiln_log() {
    let root = tempfile::tempdir().unwrap();
    let fixture = root.path().join("one_fallback.kir");
    std::fs::write(&fixture, ONE_FALLBACK).unwrap();
    let f = fixture.to_str().unwrap();
    let out = root.path().join("out");
    let run = |extra: &[&str], log: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
        cmd.args(["run", f, "--random-weights", "0", "-o"]).arg(&out).args(extra);
        match log {
            Some(v) => cmd.env("KILN_LOG", v),
            None => cmd.env_remove("KILN_LOG"),
        };
        cmd.output().unwrap()
    };
    // The graph holds a scatter, which runs on the interpreter: logged at -v, silent by default.
    // Nothing is logged by default: stderr holds only the note saying which inputs were made up.
    let quiet = run(&[], None);
    let only_note = stderr(&quiet).lines().all(|l| l.starts_with("note: inputs not given"));
    assert!(quiet.status.success() && only_note, "{}", stderr(&quiet));
    // The fallback itself is always said, once per op kind, with how many and why.
    let said = String::from_utf8_lossy(&quiet.stdout);
    assert!(said.contains("fallback: 1 `scatter` node(s) run on the reference interpreter: "), "{said}");
    let verbose = run(&["-v"], None);
    assert!(stderr(&verbose).contains("interpreter fallback") && stderr(&verbose).contains("scatter"));
    let filtered = run(&[], Some("kiln_codegen=info"));
    assert!(stderr(&filtered).contains("interpreter fallback"), "{}", stderr(&filtered));
    assert_clean_failure(&run(&[], Some("[[[")), "KILN_LOG");
    let both = kiln(&["-v", "-q", "backends"]);
    assert_eq!(both.status.code(), Some(2), "usage error: {}", stderr(&both));
}

/// `--fallback`: `warn` (the default) runs interpreter fallbacks and says so, `allow` runs them quietly, `deny`
/// refuses the model naming each op kind — when compiling it, and when loading an artifact compiled with them.
#[test]
fn fallback_policy_warns_allows_or_denies() {
    let root = tempfile::tempdir().unwrap();
    let fixture = root.path().join("one_fallback.kir");
    std::fs::write(&fixture, ONE_FALLBACK).unwrap();
    let f = fixture.to_str().unwrap();
    let out = root.path().join("out");
    let o = |args: &[&str]| kiln(&[args, &["-o", out.to_str().unwrap()]].concat());
    let stdout = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let line = "fallback: 1 `scatter` node(s) run on the reference interpreter: kiln does not compile `scatter` yet";
    let warn = o(&["run", f, "--random-weights", "0"]);
    assert!(warn.status.success() && stdout(&warn).contains(line), "{}", stdout(&warn));
    let allow = o(&["run", f, "--random-weights", "0", "--fallback", "allow"]);
    assert!(allow.status.success() && !stdout(&allow).contains("fallback:"), "{}", stdout(&allow));
    let want = "1 node(s) would run on the reference interpreter (fallback policy `deny`): 1 `scatter`";
    for backend in ["cpu", "cuda-emulated"] {
        assert_clean_failure(
            &o(&["run", f, "--random-weights", "0", "--fallback", "deny", "--backend", backend]),
            want,
        );
    }
    assert_clean_failure(&kiln(&["bench", f, "--random-weights", "0", "--fallback", "deny", "--runs", "1"]), want);
    let art = root.path().join("art");
    let a = art.to_str().unwrap();
    assert_clean_failure(&kiln(&["compile", f, "--random-weights", "0", "--fallback", "deny", "-o", a]), want);
    assert!(!art.exists(), "nothing is written for a refused model");
    let compiled = kiln(&["compile", f, "--random-weights", "0", "-o", a]);
    assert!(compiled.status.success() && stdout(&compiled).contains(line), "{}", stdout(&compiled));
    assert_clean_failure(&o(&["run", a, "--fallback", "deny"]), want);
    let bad = kiln(&["run", f, "--fallback", "sometimes"]);
    assert!(bad.status.code() == Some(2) && stderr(&bad).contains("allow, warn or deny"), "{}", stderr(&bad));
}

/// Sizes and files a hostile user gives: devices, lying `.npy` headers, absurd thread and run counts — each one
/// line and exit 1, never an abort, a hang or a crash.
#[test]
fn hostile_sizes_and_files_are_one_line_errors() {
    let root = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/elementwise_broadcast.kir");
    let f = fixture.to_str().unwrap();
    let input = {
        let text = std::fs::read_to_string(&fixture).unwrap();
        let at = text.find("name=\"").expect("the fixture has a named input") + 6;
        text[at..at + text[at..].find('"').unwrap()].to_string()
    };
    // A 128-byte .npy whose header claims (2^62, 4) f32s.
    let lying = root.path().join("lying.npy");
    let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }";
    let mut text = dict.as_bytes().to_vec();
    while !(10 + text.len() + 1).is_multiple_of(64) {
        text.push(b' ');
    }
    text.push(b'\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((text.len() as u16).to_le_bytes());
    bytes.extend(text);
    bytes.resize(128.max(bytes.len()), 0);
    std::fs::write(&lying, &bytes).unwrap();
    let out = root.path().join("out");
    let o = out.to_str().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["run".into(), f.into(), "--input".into(), format!("{input}=/dev/zero"), "-o".into(), o.into()],
            "not a regular file",
        ),
        (
            vec![
                "run".into(),
                f.into(),
                "--input".into(),
                format!("{input}={}", lying.display()),
                "-o".into(),
                o.into(),
            ],
            "overflows",
        ),
        (vec!["run".into(), "/dev/zero".into(), "-o".into(), o.into()], "/dev/zero"),
        (vec!["run".into(), f.into(), "--threads".into(), "100000".into(), "-o".into(), o.into()], "more than the cap"),
        (
            vec!["run".into(), f.into(), "--threads".into(), "18446744073709551615".into(), "-o".into(), o.into()],
            "more than the cap",
        ),
        (vec!["bench".into(), f.into(), "--runs".into(), "18446744073709551615".into()], "--runs must be 1 to"),
        (vec!["bench".into(), f.into(), "--warmup".into(), "18446744073709551615".into()], "--warmup at most"),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = kiln(&args);
        assert_clean_failure(&o, needle);
        assert_eq!(stderr(&o).lines().count(), 1, "{args:?}: {}", stderr(&o));
    }
}

/// Element counts that overflow, and sizes no machine can allocate, are one-line errors wherever they enter: a
/// `.kir` type or reshape, a `--shape` for a symbolic input.
#[test]
fn overflowing_and_unallocatable_sizes_are_one_line_errors() {
    let root = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = root.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let reshape = write(
        "reshape.kir",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[4]\n  %1 = reshape %0 {shape=[4611686018427387904, 4]} : f32[4611686018427387904,4]\n  output \"y\" = %1\n}\n",
    );
    let huge_input = write(
        "input.kir",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[4611686018427387904,4]\n  %1 = relu %0 : f32[4611686018427387904,4]\n  output \"y\" = %1\n}\n",
    );
    let symbolic = write(
        "sym.kir",
        "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[n,m]\n  %1 = relu %0 : f32[n,m]\n  output \"y\" = %1\n}\n",
    );
    let out = root.path().join("out");
    let o = out.to_str().unwrap();
    for (args, needle) in [
        (vec!["run", reshape.as_str(), "-o", o], "more than 2^63"),
        (vec!["run", huge_input.as_str(), "-o", o], "more than 2^63"),
        (vec!["compile", huge_input.as_str(), "-o", o], "more than 2^63"),
        (vec!["run", symbolic.as_str(), "--shape", "x=4611686018427387904x4", "-o", o], "more than 2^63 bytes"),
        (vec!["run", symbolic.as_str(), "--shape", "x=1000000000x100000", "-o", o], "cannot be allocated"),
    ] {
        let out = kiln(&args);
        assert_clean_failure(&out, needle);
        // One line, or the verifier's list (a line per error) for a graph with several.
        let err = stderr(&out);
        assert!(err.lines().count() == 1 || err.lines().nth(1).is_some_and(|l| l.starts_with("  ")), "{args:?}: {err}");
        assert_eq!(err.matches("error:").count(), 1, "{args:?}: said once: {err}");
    }
}

/// Messages a new user met (the Python/C/CLI issue): a missing model is named once, not twice; a directory that
/// is not an artifact names no Rust API; `inspect` reads an artifact as `kiln-serve inspect` does.
#[test]
fn missing_files_directories_and_artifacts_are_described_plainly() {
    let root = tempfile::tempdir().unwrap();
    for cmd in ["run", "check", "inspect", "bench"] {
        let o = kiln(&[cmd, "nope.onnx"]);
        assert_clean_failure(&o, "nope.onnx: No such file");
        assert_eq!(stderr(&o).matches("nope.onnx").count(), 1, "{cmd}: {}", stderr(&o));
    }
    let o = kiln(&["run", root.path().to_str().unwrap()]);
    assert_clean_failure(&o, "a directory is not a model (nor an artifact");
    assert!(!stderr(&o).contains("Artifact::load"), "{}", stderr(&o));
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mlp_symbolic_batch.kir");
    let art = root.path().join("art");
    let c = kiln(&["compile", fixture.to_str().unwrap(), "--random-weights", "1", "-o", art.to_str().unwrap()]);
    assert!(c.status.success(), "{}", stderr(&c));
    let o = kiln(&["inspect", art.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains(": cpu for ") && out.contains("inputs:") && out.contains("steps: "),
        "{out}"
    );
    let o = kiln(&["inspect", art.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("inspect --json of an artifact is JSON");
    assert_eq!(v["kind"], "cpu");
}

/// A two-input model for the CLI friction tests: y = tanh(x + b), x f32[2,3], b f32[3].
fn two_input_model(dir: &Path) -> PathBuf {
    let path = dir.join("two.kir");
    std::fs::write(
        &path,
        "graph \"two\" {\n  %0 = input {name=\"x\"} : f32[2,3]\n  %1 = input {name=\"b\"} : f32[3]\n  \
         %2 = add %0, %1 : f32[2,3]\n  %3 = tanh %2 : f32[2,3]\n  output \"y\" = %3\n}\n",
    )
    .unwrap();
    path
}

/// A failure with exit code `code` (docs/cli.md's table) and one clean `error:` line saying `needle`.
fn assert_exit(o: &Output, code: i32, needle: &str) {
    assert_clean_failure(o, needle);
    assert_eq!(o.status.code(), Some(code), "{}", stderr(o));
}

/// Inputs that are not given are filled, and said so on stderr; `--require-inputs` refuses; `--inputs DIR` reads the
/// manifest format `run` writes, so one run's outputs feed the next.
#[test]
fn inputs_not_given_are_said_and_folders_of_inputs_are_read() {
    let root = tempfile::tempdir().unwrap();
    let model = two_input_model(root.path());
    let m = model.to_str().unwrap();
    let out = root.path().join("out");
    let o = kiln(&["run", m, "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("note: inputs not given, filled with pseudo-random values (seed 0): x, b"),
        "{}",
        stderr(&o)
    );
    let o = kiln(&["bench", m, "--runs", "1", "--seed", "3"]);
    assert!(o.status.success() && stderr(&o).contains("(seed 3): x, b"), "{}", stderr(&o));
    for cmd in ["run", "bench"] {
        assert_exit(&kiln(&[cmd, m, "--require-inputs"]), 5, "inputs not given: x, b (--require-inputs)");
    }
    // A folder in the manifest format of `run`'s outputs.
    let inputs = root.path().join("inputs");
    let x = Tensor::from_vec(vec![2, 3], vec![0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6]).unwrap();
    let b = Tensor::from_vec(vec![3], vec![1.0f32, 0.0, -1.0]).unwrap();
    kiln::npy::write_output_dir(&inputs, &[("x".to_string(), x.clone()), ("b".to_string(), b.clone())]).unwrap();
    let o =
        kiln(&["run", m, "--inputs", inputs.to_str().unwrap(), "--require-inputs", "--output", out.to_str().unwrap()]);
    assert!(o.status.success() && !stderr(&o).contains("note:"), "{}", stderr(&o));
    let y = kiln::npy::read(&out.join("y.npy")).unwrap();
    let want: Vec<f32> = [1.1f32, 0.2, -0.7, 1.4, 0.5, -0.4].iter().map(|v| v.tanh()).collect();
    for (g, w) in y.as_slice::<f32>().unwrap().iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "{g} vs {w}");
    }
    // `--input` adds to the folder; naming one input twice is an error.
    let o =
        kiln(&["run", m, "--inputs", inputs.to_str().unwrap(), "-i", &format!("x={}", inputs.join("x.npy").display())]);
    assert_clean_failure(&o, "--input `x` is given twice");
    assert_exit(&kiln(&["run", m, "--inputs", root.path().to_str().unwrap()]), 3, "manifest.json");
}

/// Messages that misled a new user: an unknown input lists the valid ones; a file that is no model names ONNX
/// among the formats; a rank mismatch is an input error, not an "unsupported feature"; nothing suggests a flag
/// the command lacks; exit codes say the kind (3 could not read, 4 unsupported, 5 invalid input).
#[test]
fn misleading_messages_are_fixed_and_exit_codes_say_the_kind() {
    let root = tempfile::tempdir().unwrap();
    let model = two_input_model(root.path());
    let m = model.to_str().unwrap();
    let npy = root.path().join("x.npy");
    kiln::npy::write(&npy, &Tensor::zeros(DType::F32, vec![6])).unwrap();
    let o = kiln(&["run", m, "-i", &format!("nope={}", npy.display())]);
    assert_exit(&o, 5, "the model has no input `nope` (inputs: `x`, `b`)");
    let o = kiln(&["run", m, "-i", &format!("x={}", npy.display())]);
    assert_exit(&o, 5, "input `x`");
    assert!(!stderr(&o).contains("unsupported"), "{}", stderr(&o));
    let text = root.path().join("hostname");
    std::fs::write(&text, "myhost\n").unwrap();
    let o = kiln(&["run", text.to_str().unwrap()]);
    assert_exit(&o, 3, "expected an .onnx, .kir or kiln graph .json file");
    assert_exit(&kiln(&["run", root.path().join("nope.onnx").to_str().unwrap()]), 3, "No such file");
    let o = kiln(&["backends"]);
    assert!(!stderr(&o).contains("--backend"), "`kiln backends` has no --backend flag: {}", stderr(&o));
}

/// Flags mean the same on every command: `-o`/`--output`, `--threads` (all cores by default), `-O`/`--pipeline`
/// wherever a model is compiled; `compile --help` states the defaults it has.
#[test]
fn flags_are_consistent_across_commands() {
    let root = tempfile::tempdir().unwrap();
    let model = two_input_model(root.path());
    let m = model.to_str().unwrap();
    let (out, art, kir) = (root.path().join("out"), root.path().join("art"), root.path().join("o.kir"));
    let o = kiln(&["run", m, "--output", out.to_str().unwrap(), "-O", "2"]);
    assert!(o.status.success() && out.join("y.npy").exists(), "{}", stderr(&o));
    let o = kiln(&["run", m, "--output-dir", out.to_str().unwrap(), "--pipeline", "canonicalize"]);
    assert!(o.status.success(), "--output-dir stays an alias: {}", stderr(&o));
    let o = kiln(&["opt", m, "--output", kir.to_str().unwrap()]);
    assert!(o.status.success() && kir.exists(), "{}", stderr(&o));
    let o = kiln(&["bench", m, "--runs", "1", "-O", "1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let last = String::from_utf8_lossy(&o.stdout).lines().last().unwrap().to_string();
    let v: serde_json::Value = serde_json::from_str(&last).unwrap();
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(v["threads"], cores, "bench uses all cores by default, as run does");
    assert!(v["io_bytes"].as_u64() == Some(6 * 4 + 3 * 4 + 6 * 4), "io_bytes is real on the cpu backend: {v}");
    assert_clean_failure(&kiln(&["run", m, "-O", "9"]), "optimization levels are 0 to 3");
    if have_cc() {
        let o = kiln(&["compile", m, "--output", art.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_clean_failure(&kiln(&["run", art.to_str().unwrap(), "-O", "2"]), "passes ran when it was compiled");
    }
    // `--emit` is not only compile's: run writes the listings beside its outputs, bench into --emit-dir.
    let o = kiln(&["run", m, "-o", out.to_str().unwrap(), "--emit", "kir,dot"]);
    assert!(o.status.success() && out.join("model.kir").exists() && out.join("graph.dot").exists(), "{}", stderr(&o));
    let listings = root.path().join("listings");
    let o = kiln(&["bench", m, "--runs", "1", "--emit", "asm", "--emit-dir", listings.to_str().unwrap()]);
    assert!(o.status.success() && listings.join("kernels.s").exists(), "{}", stderr(&o));
    let help = String::from_utf8_lossy(&kiln(&["compile", "--help"]).stdout).into_owned();
    assert!(!help.contains("default O0"), "compile's default pipeline is the target's, not O0:\n{help}");
}

/// `bench --profile` naming steps by the model's nodes with a per-kind table, and `--trace` writing a Chrome trace.
#[test]
fn machine_readable_output_and_profiles_that_map_back_to_the_model() {
    let root = tempfile::tempdir().unwrap();
    let model = two_input_model(root.path());
    let m = model.to_str().unwrap();
    let o = kiln(&["bench", m, "--runs", "1", "--profile", "--trace", root.path().join("t.json").to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.contains("by kind of step (its ops):") && out.contains("add+tanh"), "{out}");
    assert!(out.contains("[add ") || out.contains("[add `"), "steps name their nodes: {out}");
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.path().join("t.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    assert!(!events.is_empty() && events.iter().all(|e| e["ph"] == "X" && e["dur"].as_f64().is_some()), "{trace}");
    assert_eq!(events[0]["cat"], "add+tanh");
    // (ONNX op types and `check --json`: tests/onnx_cli.rs.) A model that does not parse: exit 3, even with --json.
    let bad = root.path().join("bad.kir");
    std::fs::write(&bad, "graph \"g\" {\n").unwrap();
    assert_exit(&kiln(&["inspect", bad.to_str().unwrap(), "--json"]), 3, "bad.kir");
}

/// A failed `compile` leaves no half-written artifact directory; an existing directory that is not an artifact
/// is never overwritten; an artifact is replaced only once the new one is complete.
#[test]
fn a_failed_compile_leaves_nothing_behind() {
    if !have_cc() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let model = two_input_model(root.path());
    let m = model.to_str().unwrap();
    let art = root.path().join("art");
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["compile", m, "-o", art.to_str().unwrap()])
        .env("CC", "false")
        .output()
        .unwrap();
    assert_clean_failure(&o, "art");
    assert!(!art.exists(), "a failed compile left {}", art.display());
    let leftovers: Vec<_> =
        std::fs::read_dir(root.path()).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert_eq!(leftovers.len(), 1, "only the model remains: {leftovers:?}");
    let ok = kiln(&["compile", m, "-o", art.to_str().unwrap()]);
    assert!(ok.status.success() && art.join("manifest.json").exists(), "{}", stderr(&ok));
    // Failing again over a good artifact keeps the good one.
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["compile", m, "-o", art.to_str().unwrap()])
        .env("CC", "false")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(kiln(&["run", art.to_str().unwrap(), "-o", root.path().join("out").to_str().unwrap()]).status.success());
    // A folder with other files is refused, untouched.
    let other = root.path().join("notes");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("todo.txt"), "keep me").unwrap();
    assert_exit(&kiln(&["compile", m, "-o", other.to_str().unwrap()]), 3, "exists and is not an artifact");
    assert_eq!(std::fs::read_to_string(other.join("todo.txt")).unwrap(), "keep me");
}

/// docs/cli.md documents every option each subcommand's `--help` shows, in the command's section or a shared
/// section naming the command; and every option its tables list exists.
#[test]
fn cli_docs_match_help() {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md")).unwrap();
    let mut sections: Vec<(String, String)> = Vec::new();
    for part in doc.split("\n## ").skip(1) {
        let (head, body) = part.split_once('\n').unwrap_or((part, ""));
        sections.push((head.to_string(), body.to_string()));
    }
    let flags = |text: &str| -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        let b = text.as_bytes();
        let mut i = 0;
        while let Some(k) = text[i..].find("--") {
            let start = i + k;
            let mut end = start + 2;
            while end < b.len() && (b[end].is_ascii_lowercase() || b[end].is_ascii_digit() || b[end] == b'-') {
                end += 1;
            }
            let prev_ok = start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'-');
            if end > start + 2 && prev_ok {
                out.insert(text[start..end].trim_end_matches('-').to_string());
            }
            i = end.max(start + 2);
        }
        out
    };
    let global = ["--help", "--version", "--verbose", "--quiet"];
    for sub in ["run", "compile", "bench", "opt", "inspect", "check", "conformance", "backends", "generate"] {
        let help = String::from_utf8_lossy(&kiln(&[sub, "--help"]).stdout).into_owned();
        let documented: String = sections
            .iter()
            .filter(|(h, _)| h.starts_with(&format!("`kiln {sub}")) || h.contains(&format!("`{sub}`")))
            .map(|(h, b)| format!("{h}\n{b}"))
            .collect();
        assert!(!documented.is_empty(), "docs/cli.md has no section for `kiln {sub}`");
        let in_help = flags(&help);
        let in_doc = flags(&documented);
        let undocumented: Vec<&String> =
            in_help.iter().filter(|f| !global.contains(&f.as_str()) && !in_doc.contains(*f)).collect();
        assert!(
            undocumented.is_empty(),
            "kiln {sub}: --help shows {undocumented:?}, docs/cli.md does not document them"
        );
        // The option tables of the command's own section name only options it has.
        if let Some((_, body)) = sections.iter().find(|(h, _)| h.starts_with(&format!("`kiln {sub}"))) {
            let table: String =
                body.lines().filter(|l| l.starts_with("| `-")).map(|l| l.split(" | ").next().unwrap_or("")).collect();
            let stale: Vec<String> = flags(&table).into_iter().filter(|f| !in_help.contains(f)).collect();
            assert!(stale.is_empty(), "kiln {sub}: docs/cli.md lists {stale:?}, which --help does not have");
        }
    }
}
