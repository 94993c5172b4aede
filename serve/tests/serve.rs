//! `kiln-serve` end to end: artifacts written by the compiler (the `kiln` library, a dev-dependency only) run
//! under the runtime-only binary exactly as they do in the full `kiln`, and bad input is one line and exit 1.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

/// `y = relu(x·w + x) * x`, with its weight bound.
const MODEL: &str = r#"graph "served" {
  %0 = input {name="x"} : f32[4,8]
  %1 = param {name="w"} : f32[8,8]
  %2 = matmul %0, %1 : f32[4,8]
  %3 = add %2, %0 : f32[4,8]
  %4 = relu %3 : f32[4,8]
  %5 = mul %4, %0 : f32[4,8]
  output "y" = %5
}
"#;

fn model() -> kiln::Model {
    let mut g = kiln::ir::parse(MODEL).unwrap();
    g.weights.insert("w", kiln::ir::Tensor::random(kiln::ir::DType::F32, vec![8, 8], 7));
    kiln::Model::from_graph(g).unwrap()
}

fn serve(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln-serve")).args(args).env_remove("KILN_BACKEND_PLUGINS").output().unwrap()
}

/// A failure with exit code `code` (1 other, 3 could not read, 4 unsupported, 5 invalid input: as `kiln`'s) and
/// one line saying `needle`.
fn one_line_error(o: &Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(needle), "`{err}` should contain `{needle}`");
}

#[test]
fn artifacts_run_and_bench_without_the_compiler_as_under_the_jit() {
    let root = tempfile::tempdir().unwrap();
    let art = root.path().join("art");
    let m = model();
    let lowered = m.lower(&kiln::CompileOptions::default()).unwrap();
    kiln::Artifact::write(&lowered, &art).unwrap();
    let x = kiln::ir::Tensor::random(kiln::ir::DType::F32, vec![4, 8], 3);
    let xf = root.path().join("x.npy");
    kiln::npy::write(&xf, &x).unwrap();
    let p = |s: &Path| s.to_str().unwrap().to_string();
    let out = root.path().join("out");
    let o = serve(&["run", &p(&art), "--input", &format!("x={}", p(&xf)), "-o", &p(&out)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("(cpu backend): loaded in"), "{o:?}");
    let got = kiln::npy::read(&out.join("y.npy")).unwrap();
    let want =
        m.compile(&kiln::CompileOptions::default()).unwrap().run(&BTreeMap::from([("x".to_string(), x)])).unwrap();
    assert_eq!(got, want[0].1);

    let o = serve(&["bench", &p(&art), "--runs", "3", "--warmup", "1", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["backend"].as_str(), v["runs"].as_u64()), (Some("cpu"), Some(3)));
    assert!(v["median_ms"].as_f64().unwrap() > 0.0 && v["peak_rss_kib"].as_u64().unwrap() > 0, "{v}");

    let o = serve(&["inspect", &p(&art)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && text.contains(": cpu for "), "{text}");
    assert!(text.contains("x: f32[4,8]") && text.contains("y: f32[4,8]"), "{text}");

    // Bad input: one line, exit 1, nothing runs.
    one_line_error(&serve(&["bench", &p(&art), "--runs", "0"]), 1, "--runs must be 1 to 1,000,000");
    one_line_error(&serve(&["run", &p(&art), "--threads", "100000", "-o", &p(&out)]), 5, "more than the cap");
    one_line_error(&serve(&["run", &p(&art), "--input", "nope=/nonexistent.npy"]), 3, "/nonexistent.npy");
    one_line_error(&serve(&["run", &p(&root.path().join("missing"))]), 3, "manifest.json");
    let o = Command::new(env!("CARGO_BIN_EXE_kiln-serve"))
        .args(["run", &p(&art)])
        .env("KILN_BACKEND_PLUGINS", "a=x.so:3")
        .output()
        .unwrap();
    one_line_error(&o, 1, "KILN_BACKEND_PLUGINS");
    // A tampered kernel library is refused before it is loaded.
    let lib = art.join("kernels.so");
    let mut bytes = std::fs::read(&lib).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&lib, &bytes).unwrap();
    one_line_error(&serve(&["run", &p(&art)]), 3, "does not match the manifest");
}

/// An artifact with a node on the reference interpreter says so: `warn` (the default) prints a `fallback:` line
/// (in `bench --json` too), `allow` leaves it out, `deny` refuses the artifact with one line naming the op — as
/// `kiln run` does.
#[test]
fn artifact_fallbacks_are_never_silent() {
    let text = "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[4,8]\n  \
                %1 = constant {value=i64[1,8] [0, 1, 2, 3, 0, 1, 2, 3]} : i64[1,8]\n  \
                %2 = constant {value=f32[1,8] [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]} : f32[1,8]\n  \
                %3 = scatter %0, %1, %2 {axis=0, reduction=add} : f32[4,8]\n  output \"v\" = %3\n}\n";
    let m = kiln::Model::from_graph(kiln::ir::parse(text).unwrap()).unwrap();
    let root = tempfile::tempdir().unwrap();
    let art = root.path().join("art");
    let lowered = m.lower(&kiln::CompileOptions::default()).unwrap();
    assert!(!lowered.executable.fallbacks.is_empty(), "a scatter runs on the interpreter: this test needs one");
    kiln::Artifact::write(&lowered, &art).unwrap();
    let (art, out) = (art.to_str().unwrap(), root.path().join("out"));
    let line = "fallback: 1 `scatter` node(s) run on the reference interpreter";
    let o = serve(&["run", art, "-o", out.to_str().unwrap()]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains(line), "{o:?}");
    let o = serve(&["run", art, "-o", out.to_str().unwrap(), "--fallback", "allow"]);
    assert!(o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("fallback:"), "{o:?}");
    let o = serve(&["bench", art, "--runs", "2", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["fallbacks"][0].as_str().is_some_and(|l| l.contains(line)), "{v}");
    one_line_error(
        &serve(&["bench", art, "--fallback", "deny"]),
        4,
        "1 `scatter` (kiln does not compile `scatter` yet)",
    );
}
