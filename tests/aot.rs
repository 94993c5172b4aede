//! Ahead-of-time artifacts end to end: `Artifact::write` then `Artifact::load` (no code generation) runs every
//! fixture and every reference model exactly as the JIT does; `kiln compile` + `kiln run DIR` round-trip through
//! the CLI; manifests of another format version, target triple or CPU features are refused by name; damaged
//! weights, a damaged manifest and a missing kernel library are errors, not panics.
//!
//! Linking needs the system `cc`; without one each test prints `SKIPPED: no cc`.

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln::{Artifact, CompileOptions, Model};
use kiln_ir::Tensor;

mod common;

fn have_cc() -> bool {
    let ok = Command::new("cc").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIPPED: no cc");
    }
    ok
}

/// The same numbers up to rounding noise: the artifact's code is the JIT's, compiled from the same kernel IR.
fn assert_same(what: &str, got: &[(String, Tensor)], want: &[(String, Tensor)]) {
    common::assert_outputs(what, got, want, 1e-6, 1e-7);
}

/// Writes `model`'s artifact into `dir` with the default CPU pipeline.
fn write_artifact(model: &Model, dir: &Path) -> Artifact {
    let lowered = model.lower(&CompileOptions::default()).unwrap_or_else(|e| panic!("lower: {e}"));
    Artifact::write(&lowered, dir).unwrap_or_else(|e| panic!("write: {e}"))
}

#[test]
fn every_fixture_runs_from_its_artifact_as_under_the_jit() {
    if !have_cc() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    for (name, mut g) in common::fixtures() {
        common::bind_weights(&mut g);
        let model = Model::from_graph(g).unwrap_or_else(|e| panic!("{name}: {e}"));
        let inputs = common::fixture_inputs(&model);
        let want = model.compile(&CompileOptions { threads: 2, ..Default::default() }).unwrap().run(&inputs).unwrap();
        let dir = root.path().join(&name);
        write_artifact(&model, &dir);
        let loaded = Artifact::load(&dir, 2).unwrap_or_else(|e| panic!("{name}: load: {e}"));
        assert_eq!(loaded.inputs(), model.inputs().as_slice(), "{name}: inputs");
        let got = loaded.run(&inputs).unwrap_or_else(|e| panic!("{name}: run: {e}"));
        assert_same(&name, &got, &want);
    }
}

#[test]
fn reference_models_run_from_artifacts_as_under_the_jit_and_match_onnx_runtime() {
    if !have_cc() {
        return;
    }
    let Some(dirs) = common::model_dirs() else { return };
    let root = tempfile::tempdir().unwrap();
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let t0 = std::time::Instant::now();
        let common::ReferenceCase { model, inputs: given, expected } =
            common::reference_case(dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let jit = model.compile(&CompileOptions { threads: 2, ..Default::default() }).unwrap().run(&given).unwrap();
        let out = root.path().join(&name);
        write_artifact(&model, &out);
        let got = Artifact::load(&out, 2).unwrap_or_else(|e| panic!("{name}: load: {e}")).run(&given).unwrap();
        assert_same(&name, &got, &jit);
        if let Err(e) = common::compare_outputs(got, &expected) {
            panic!("{name}: vs ONNX Runtime: {e}");
        }
        eprintln!("{name}: ok in {:.1} s", t0.elapsed().as_secs_f64());
    }
}

const SMALL: &str = r#"graph "small" {
  %0 = input {name="x"} : f32[2,5]
  %1 = param {name="w"} : f32[5]
  %2 = relu %0 : f32[2,5]
  %3 = broadcast %1 {shape=[2,5]} : f32[2,5]
  %4 = mul %2, %3 : f32[2,5]
  %5 = exp %0 : f32[2,5]
  %6 = add %4, %5 : f32[2,5]
  output "y" = %6
}
"#;

/// `y = relu(x) * w + exp(x)` with its weight bound.
fn small_model() -> Model {
    let mut g = kiln_ir::parse(SMALL).expect("parses");
    common::bind_weights(&mut g);
    Model::from_graph(g).expect("verifies")
}

/// A fresh artifact of the small model in a temporary directory.
fn small_artifact() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("small");
    write_artifact(&small_model(), &dir);
    (root, dir)
}

fn load_error(dir: &Path) -> String {
    match Artifact::load(dir, 1) {
        Ok(_) => panic!("{} should not load", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// Rewrites the manifest with `edit` applied to its JSON and, where the result is still a manifest, its digest
/// recomputed — a crafted manifest, which the checks behind the digest must refuse on their own.
fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("manifest.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    let text = match serde_json::from_value::<kiln::artifact::ArtifactManifest>(v.clone()) {
        Ok(mut m) => {
            kiln_plan::artifact::seal(&mut m);
            serde_json::to_string(&m).unwrap()
        }
        Err(_) => serde_json::to_string(&v).unwrap(),
    };
    std::fs::write(&path, text).unwrap();
}

#[test]
fn a_changed_byte_in_any_file_or_files_swapped_between_artifacts_are_refused_before_anything_runs() {
    if !have_cc() {
        return;
    }
    // Each file of the artifact, one byte changed (the manifest without recomputing its digest).
    for (file, needle) in [
        ("manifest.json", "digest does not match its contents"),
        ("weights.safetensors", "digest does not match the manifest"),
        ("kernels.so", "digest does not match the manifest"),
    ] {
        let (_root, dir) = small_artifact();
        let path = dir.join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = if file == "manifest.json" {
            // Inside a number of the program, so the JSON still parses and only the contents differ.
            let text = String::from_utf8(bytes.clone()).unwrap();
            // The last digit of the arena size: the JSON stays valid, only the contents differ.
            let key = text.find("\"arena_bytes\":").expect("arena_bytes");
            let first = key + text[key..].find(|c: char| c.is_ascii_digit()).expect("a number");
            first + text[first..].find(|c: char| !c.is_ascii_digit()).expect("the number ends") - 1
        } else {
            bytes.len() / 2
        };
        bytes[at] = if file != "manifest.json" {
            bytes[at] ^ 0x5a
        } else if bytes[at] == b'9' {
            b'8'
        } else {
            bytes[at] + 1
        };
        std::fs::write(&path, &bytes).unwrap();
        let e = load_error(&dir);
        assert!(e.contains(needle), "{file}: {e}");
    }
    // The kernel library of another artifact (of another model) in place of this one's.
    let (_root, dir) = small_artifact();
    let other = tempfile::tempdir().unwrap();
    let mut g = kiln_ir::parse(
        "graph \"o\" {\n  %0 = input {name=\"x\"} : f32[4]\n  %1 = exp %0 : f32[4]\n  output \"y\" = %1\n}\n",
    )
    .unwrap();
    common::bind_weights(&mut g);
    write_artifact(&Model::from_graph(g).unwrap(), &other.path().join("o"));
    std::fs::copy(other.path().join("o/kernels.so"), dir.join("kernels.so")).unwrap();
    assert!(load_error(&dir).contains("kernels.so"), "swapped library");
}

#[test]
fn manifests_for_another_format_target_or_cpu_are_refused_by_name() {
    if !have_cc() {
        return;
    }
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 3] = [
        ("format", |v| v["format_version"] = 1.into(), "format version 1 is not supported"),
        (
            "triple",
            |v| v["target"]["triple"] = "riscv64gc-unknown-fakeos".into(),
            "compiled for target `riscv64gc-unknown-fakeos`",
        ),
        (
            "feature",
            |v| v["target"]["cpu_features"].as_array_mut().unwrap().push("avx9000".into()),
            "CPU features this host lacks: avx9000",
        ),
    ];
    for (what, edit, want) in cases {
        let (_root, dir) = small_artifact();
        edit_manifest(&dir, edit);
        let e = load_error(&dir);
        assert!(e.contains(want), "{what}: `{e}` should say `{want}`");
    }
}

/// A model whose program has every kind of step: a prepare step (the weight transpose), a kernel, a library
/// call with an epilogue running in place, and a kernel reading the arena.
const CRAFTED: &str = r#"graph "crafted" {
  %0 = input {name="x"} : f32[2,4]
  %1 = param {name="w"} : f32[3,4]
  %2 = param {name="b"} : f32[3]
  %3 = transpose %1 {perm=[1, 0]} : f32[4,3]
  %4 = matmul %0, %3 : f32[2,3]
  %5 = add %4, %2 : f32[2,3]
  %6 = relu %5 : f32[2,3]
  %7 = exp %0 : f32[2,4]
  %8 = reduce %7 {kind=sum, axes=[1], keep_dims=true} : f32[2,1]
  %9 = reduce %6 {kind=max, axes=[1], keep_dims=true} : f32[2,1]
  %10 = sub %6, %9 : f32[2,3]
  output "y" = %10
  output "z" = %8
}
"#;

#[test]
fn crafted_programs_are_refused_by_the_verifier_even_when_the_manifest_is_resealed() {
    if !have_cc() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mut g = kiln_ir::parse(CRAFTED).unwrap();
    common::bind_weights(&mut g);
    let model = Model::from_graph(g).unwrap();
    let fresh = root.path().join("fresh");
    write_artifact(&model, &fresh);
    Artifact::load(&fresh, 1).expect("the compiler's own artifact loads");
    // The edits below address the program by index: check that it is still the one they were written for.
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fresh.join("manifest.json")).unwrap()).unwrap();
    let e = &v["executable"];
    let layout = (
        e["prepare"].to_string(),
        e["steps"].to_string(),
        e["outputs"].to_string(),
        e["buffers"][5]["home"].to_string(),
        v["kernels"].as_array().unwrap().len(),
    );
    let want = (
        r#"[{"Kernel":{"args":[1,3],"kernel":0}}]"#.to_string(),
        r#"[{"Kernel":{"args":[0,4],"kernel":1}},{"Library":{"epilogue":{"Kernel":{"args":[5,2,5],"kernel":2}},"inputs":[0,3],"op":"MatMul","output":5}},{"Kernel":{"args":[5,6],"kernel":3}}]"#.to_string(),
        r#"[["y",6],["z",4]]"#.to_string(),
        r#"{"Arena":0}"#.to_string(),
        4,
    );
    assert_eq!(layout, want, "the compiler now builds another program for CRAFTED: update the edits of this test");

    type Edit = fn(&mut serde_json::Value);
    let cases: &[(&str, Edit, &str)] = &[
        ("no steps", |v| v["executable"]["steps"] = serde_json::json!([]), "does not hold its value at the end"),
        ("reversed steps", |v| v["executable"]["steps"].as_array_mut().unwrap().reverse(), "before it holds a value"),
        (
            "an extent of 0",
            |v| v["executable"]["buffers"][5]["ty"]["shape"] = serde_json::json!([2, 0]),
            "`matmul` gives f32[2,3], the step writes f32[2,0]",
        ),
        (
            "a result aliased to the input",
            |v| v["executable"]["outputs"][0][1] = 0.into(),
            "results are arena or per-run buffers",
        ),
        (
            "kernel symbols swapped",
            |v| {
                let k = v["kernels"].as_array_mut().unwrap();
                let (a, b) = (k[1]["symbol"].clone(), k[3]["symbol"].clone());
                k[1]["symbol"] = b;
                k[3]["symbol"] = a;
            },
            "are not those its code was compiled with",
        ),
        (
            "a part's extent enlarged",
            |v| v["kernels"][1]["parts"][0]["extent"] = serde_json::json!({ "Const": 1000 }),
            "are not those its code was compiled with",
        ),
        (
            "a kernel's signature edited to allow computing in place",
            |v| v["kernels"][3]["args"][1]["in_place"] = serde_json::json!([0]),
            "are not those its code was compiled with",
        ),
        (
            "a copy from the input to a result",
            |v| v["executable"]["steps"][2] = serde_json::json!({ "Copy": { "src": 0, "dst": 6 } }),
            "it copies f32[2,4] into f32[2,3]",
        ),
        (
            "prepare arguments swapped",
            |v| v["executable"]["prepare"][0]["Kernel"]["args"] = serde_json::json!([3, 1]),
            "argument 0 of kernel 0 is f32[3,4]",
        ),
        ("nothing prepared", |v| v["executable"]["prepare"] = serde_json::json!([]), "never written by `prepare`"),
        (
            "an epilogue launching another kernel",
            |v| v["executable"]["steps"][1]["Library"]["epilogue"]["Kernel"]["kernel"] = 3.into(),
            "kernel 3 takes 2 buffer(s), the step passes 3",
        ),
        (
            "a library call writing its operand",
            |v| v["executable"]["steps"][1]["Library"]["inputs"] = serde_json::json!([0, 3, 5]),
            "does not verify",
        ),
        (
            "a step writing the caller's input",
            |v| v["executable"]["buffers"][4]["home"] = serde_json::json!({ "Input": 0 }),
            "which it may not write",
        ),
        (
            "two buffers at one arena offset, one not computed in place over the other",
            |v| v["executable"]["buffers"][6]["home"] = serde_json::json!({ "Arena": 0 }),
            "which it does not compute in place",
        ),
        (
            "a result overwritten by a later step",
            |v| v["executable"]["buffers"][4]["home"] = serde_json::json!({ "Arena": 0 }),
            "`z` (buffer 4) does not hold its value at the end",
        ),
        (
            "a dtype changed",
            |v| v["executable"]["buffers"][6]["ty"]["dtype"] = "i32".into(),
            "argument 1 of kernel 3 is f32[2,3], the step passes buffer 6 of i32[2,3]",
        ),
    ];
    for (what, edit, want) in cases {
        let dir = root.path().join(what.replace(' ', "_"));
        write_artifact(&model, &dir);
        edit_manifest(&dir, edit);
        let e = load_error(&dir);
        assert!(e.contains(want), "{what}: `{e}` should say `{want}`");
        assert_eq!(e.lines().count(), 1, "{what}: {e}");
    }
}

#[test]
fn damaged_artifacts_are_errors_not_panics() {
    if !have_cc() {
        return;
    }
    // A truncated weight file.
    let (_root, dir) = small_artifact();
    let w = dir.join("weights.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() - 3]).unwrap();
    let e = load_error(&dir);
    assert!(e.contains("weights.safetensors"), "{e}");

    // A missing kernel library.
    let (_root, dir) = small_artifact();
    std::fs::remove_file(dir.join("kernels.so")).unwrap();
    let e = load_error(&dir);
    assert!(e.contains("kernels.so") && e.contains("missing"), "{e}");

    // A truncated manifest.
    let (_root, dir) = small_artifact();
    let m = dir.join("manifest.json");
    let text = std::fs::read_to_string(&m).unwrap();
    std::fs::write(&m, &text[..text.len() / 2]).unwrap();
    let e = load_error(&dir);
    assert!(e.contains("corrupt manifest"), "{e}");

    // Valid JSON describing an executable that points outside itself.
    let (_root, dir) = small_artifact();
    edit_manifest(&dir, |v| v["executable"]["outputs"][0][1] = 9999.into());
    let e = load_error(&dir);
    assert!(e.contains("does not verify") && e.contains("9999"), "{e}");

    // A kernel symbol the library lacks.
    let (_root, dir) = small_artifact();
    edit_manifest(&dir, |v| v["kernels"][0]["symbol"] = "kiln_no_such_kernel".into());
    let e = load_error(&dir);
    assert!(e.contains("kiln_no_such_kernel"), "{e}");

    // A manifest naming a file outside the artifact.
    let (_root, dir) = small_artifact();
    edit_manifest(&dir, |v| v["code"]["file"] = "../elsewhere.so".into());
    let e = load_error(&dir);
    assert!(e.contains("not a file of the artifact"), "{e}");
}

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("the kiln binary runs")
}

/// A temporary directory holding `small.kir` and its weights, `small.safetensors`.
fn small_model_dir() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("small.kir"), SMALL).unwrap();
    kiln::weights::save(&root.path().join("small.safetensors"), &small_model().graph().weights).unwrap();
    root
}

fn ok(o: &std::process::Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "stdout:\n{out}\nstderr:\n{}", String::from_utf8_lossy(&o.stderr));
    out
}

#[test]
fn cli_compile_then_run_matches_running_the_model() {
    if !have_cc() {
        return;
    }
    let root = small_model_dir();
    let p = |name: &str| root.path().join(name).to_string_lossy().into_owned();

    let out = ok(&kiln(&[
        "compile",
        &p("small.kir"),
        "--target",
        "cpu",
        "-O",
        "2",
        "-o",
        &p("art"),
        "--emit",
        "kir,asm,dot",
    ]));
    assert!(out.contains("compiled"), "{out}");
    for f in ["manifest.json", "weights.safetensors", "kernels.so", "model.kir", "kernels.s", "graph.dot"] {
        assert!(root.path().join("art").join(f).is_file(), "{f} is written");
    }
    assert!(
        root.path().join("art/graph.svg").is_file() || out.contains("skipped rendering"),
        "graph.svg is rendered or its skipping said: {out}"
    );
    kiln_ir::parse(&std::fs::read_to_string(root.path().join("art/model.kir")).unwrap()).expect("model.kir parses");

    let out = ok(&kiln(&["run", &p("art"), "-o", &p("aot-out")]));
    assert!(out.contains("loaded in") && out.contains("no code generation"), "{out}");
    ok(&kiln(&["run", &p("small.kir"), "--backend", "cpu", "-o", &p("jit-out")]));
    let aot = kiln::npy::read(&root.path().join("aot-out/y.npy")).unwrap();
    let jit = kiln::npy::read(&root.path().join("jit-out/y.npy")).unwrap();
    assert_eq!(aot, jit);

    let out = ok(&kiln(&["bench", &p("art"), "--runs", "2", "--warmup", "1", "--json"]));
    assert!(out.contains("loaded artifact") && out.contains("\"load_ms\""), "{out}");

    // Options that make no sense for an artifact are refused.
    let o = kiln(&["run", &p("art"), "--backend", "interp"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("compiled artifact"));
}

#[cfg(feature = "ptx")]
#[test]
fn cli_compile_for_cuda_writes_ptx_weights_and_manifest_and_runs_it_only_on_a_gpu() {
    let root = small_model_dir();
    let p = |name: &str| root.path().join(name).to_string_lossy().into_owned();

    let out = ok(&kiln(&[
        "compile",
        &p("small.kir"),
        "--target",
        "cuda",
        "--arch",
        "sm_90",
        "-o",
        &p("gpu"),
        "--emit",
        "kir,ptx",
    ]));
    assert!(out.contains("nvptx64-nvidia-cuda (sm_90, PTX ISA 7.8)"), "{out}");
    for f in ["manifest.json", "weights.safetensors", "kernels.ptx", "model.kir"] {
        assert!(root.path().join("gpu").join(f).is_file(), "{f} is written");
    }
    let manifest: kiln::artifact::ArtifactManifest =
        serde_json::from_str(&std::fs::read_to_string(root.path().join("gpu/manifest.json")).unwrap()).unwrap();
    let kiln::artifact::ArtifactManifest::Cuda(manifest) = manifest else { panic!("the manifest says cuda") };
    assert_eq!(manifest.target.triple, "nvptx64-nvidia-cuda");
    assert_eq!(manifest.target.arch, kiln_codegen::ptx::PtxArch::Sm90);
    manifest.plan.check_references(manifest.common.executable.buffers.len(), manifest.kernels.len()).unwrap();
    assert!(!manifest.kernels.is_empty() && !manifest.plan.steps.is_empty());
    let ptx = std::fs::read_to_string(root.path().join("gpu/kernels.ptx")).unwrap();
    assert!(ptx.contains(".target sm_90") && ptx.contains(".version 7.8"), "{ptx}");
    for k in &manifest.kernels {
        assert!(ptx.contains(&format!(".entry {}(", k.entry)), "entry {} in kernels.ptx", k.entry);
    }
    match kiln_codegen::ptx::ptxas::find() {
        Some(ptxas) => {
            kiln_codegen::ptx::ptxas::assemble(&ptxas, &ptx, kiln_codegen::ptx::PtxArch::Sm90, "small").unwrap()
        }
        None => println!("SKIPPED: ptxas not found: kernels.ptx is not assembled"),
    }

    // `--emit ptx` adds the PTX to a CPU artifact too.
    if have_cc() {
        ok(&kiln(&["compile", &p("small.kir"), "-o", &p("cpu"), "--emit", "ptx"]));
        assert!(std::fs::read_to_string(root.path().join("cpu/kernels.ptx")).unwrap().contains(".target sm_80"));
    }

    let o = kiln(&["compile", &p("small.kir"), "--target", "cuda-emulated", "-o", &p("emu")]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--target cuda-emulated"), "{o:?}");
    assert!(!root.path().join("emu").exists(), "nothing is written for a refused target");

    // The CPU loader refuses it by name; `kiln run` loads it onto GPU 0: without one, the device's one clear line.
    let e = Artifact::load(&root.path().join("gpu"), 1).expect_err("refused").to_string();
    assert!(e.contains("a CUDA artifact (PTX for sm_90)"), "{e}");
    let o = kiln(&["run", &p("gpu")]);
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() {
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("backend `cuda`") && !err.contains("panicked"), "{err}");
    }
    let o = kiln(&["run", &p("gpu"), "--backend", "cpu"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("runs on the cuda backend"), "{o:?}");

    // A damaged plan (a step naming a buffer that does not exist) is refused, not run.
    let path = root.path().join("gpu/manifest.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["plan"]["steps"] = serde_json::json!([{ "Copy": { "src": 0, "dst": 9999 } }]);
    std::fs::write(&path, v.to_string()).unwrap();
    let e = Artifact::load_cuda(&root.path().join("gpu"), 0).expect_err("refused").to_string();
    assert!(e.contains("device plan does not verify") && e.contains("buffer 9999"), "{e}");
    // A plan whose steps run in reverse, re-sealed: the device plan goes through the same verifier.
    let dir = root.path().join("gpu2");
    std::fs::write(root.path().join("crafted.kir"), CRAFTED).unwrap();
    ok(&kiln(&["compile", &p("crafted.kir"), "--random-weights", "1", "--target", "cuda", "-o", &p("gpu2")]));
    edit_manifest(&dir, |v| v["plan"]["steps"].as_array_mut().unwrap().reverse());
    let e = Artifact::load_cuda(&dir, 0).expect_err("refused").to_string();
    assert!(e.contains("device plan does not verify") && e.contains("before it holds a value"), "{e}");
}
