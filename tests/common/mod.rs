//! Helpers shared by the root package's integration tests: the reference models' location and their saved
//! input/output sets.

#![allow(dead_code)] // each test binary uses part of it

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_ir::{Graph, Op, Tensor};

/// `../shared/models`, or `KILN_MODELS_DIR`.
pub fn models_dir() -> PathBuf {
    match std::env::var_os("KILN_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/models"),
    }
}

/// The model folders (holding `model.onnx`) under [`models_dir`], sorted; `None` after a `SKIPPED:` line when
/// the folder is absent.
pub fn model_dirs() -> Option<Vec<PathBuf>> {
    let root = models_dir();
    if !root.is_dir() {
        eprintln!("SKIPPED: reference models not found at {} (set KILN_MODELS_DIR)", root.display());
        return None;
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no model folders (with model.onnx) in {}", root.display());
    Some(dirs)
}

/// A saved tensor set: `manifest.json` (name → file) and the `.npy` files beside it, in manifest order.
pub fn read_manifest(dir: &Path) -> Vec<(String, Tensor)> {
    let text = std::fs::read_to_string(dir.join("manifest.json")).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let entries: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    entries
        .iter()
        .map(|e| {
            let (name, file) = (e["name"].as_str().unwrap(), e["file"].as_str().unwrap());
            (name.to_string(), kiln::npy::read(&dir.join(file)).unwrap_or_else(|e| panic!("{e}")))
        })
        .collect()
}

/// A reference model loaded at its saved inputs' shapes, with those inputs and ONNX Runtime's saved outputs.
pub struct ReferenceCase {
    pub model: kiln::Model,
    pub inputs: BTreeMap<String, Tensor>,
    pub expected: Vec<(String, Tensor)>,
}

/// Loads the reference model in `dir` (symbolic dims — a dynamic batch, a cache length — take the saved inputs'
/// extents).
pub fn reference_case(dir: &Path) -> Result<ReferenceCase, String> {
    let inputs = read_manifest(&dir.join("inputs"));
    let expected = read_manifest(&dir.join("expected"));
    let shapes = inputs.iter().map(|(n, t)| (n.clone(), t.shape().to_vec())).collect();
    let model = kiln::Model::load(&dir.join("model.onnx"), &kiln::LoadOptions { shapes, ..Default::default() })
        .map_err(|e| format!("load: {e}"))?;
    Ok(ReferenceCase { model, inputs: inputs.into_iter().collect(), expected })
}

/// Compares outputs with the expected ones by name (rtol 1e-3, atol 1e-4); `Err` describes every mismatch.
pub fn compare_outputs(got: Vec<(String, Tensor)>, expected: &[(String, Tensor)]) -> Result<(), String> {
    let got: BTreeMap<String, Tensor> = got.into_iter().collect();
    let problems: Vec<String> = expected
        .iter()
        .filter_map(|(name, want)| match got.get(name) {
            None => Some(format!("output `{name}` is missing")),
            Some(g) => kiln::conformance::compare(g, want, 1e-3, 1e-4).err().map(|e| format!("output `{name}`: {e}")),
        })
        .collect();
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

/// Loads one reference model with the saved inputs' shapes, runs it on `backend` and compares with ONNX
/// Runtime's saved outputs (rtol 1e-3, atol 1e-4); `Err` describes every mismatch.
pub fn run_reference_model(dir: &Path, backend: kiln::Backend) -> Result<(), String> {
    let case = reference_case(dir)?;
    let options = kiln::RunOptions { backend, threads: 2, ..Default::default() };
    let outputs = case.model.run(&case.inputs, &options).map_err(|e| format!("run: {e}"))?;
    compare_outputs(outputs, &case.expected)
}

/// Every reference model on `backend` against ONNX Runtime's outputs; a `SKIPPED:` line when they are absent.
pub fn check_reference_models(backend: kiln::Backend) {
    let Some(dirs) = model_dirs() else { return };
    let mut failures = Vec::new();
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let t0 = std::time::Instant::now();
        let result = run_reference_model(dir, backend);
        eprintln!("{name}: {} in {:.1} s", if result.is_ok() { "ok" } else { "FAILED" }, t0.elapsed().as_secs_f64());
        if let Err(e) = result {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} reference models failed on {}:\n{}",
        failures.len(),
        dirs.len(),
        backend.name(),
        failures.join("\n")
    );
}

/// Every `.kir` fixture in `tests/fixtures/`, parsed, by name.
pub fn fixtures() -> Vec<(String, Graph)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out: Vec<(String, Graph)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "kir"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let g = kiln_ir::parse(&std::fs::read_to_string(&p).unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, g)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 12, "the fixture set");
    out
}

/// Binds deterministic random weights to every param without one.
pub fn bind_weights(g: &mut Graph) {
    let params: Vec<(String, kiln_ir::TensorType)> = g
        .params()
        .filter_map(|id| match &g.node(id).op {
            Op::Parameter(p) => Some((p.name.clone(), g.node(id).outputs[0].clone())),
            _ => None,
        })
        .collect();
    for (i, (name, ty)) in params.into_iter().enumerate() {
        if g.weights.get(&name).is_none() {
            let dims = ty.shape.dims().iter().map(|d| d.as_static().unwrap_or(2) as usize).collect();
            g.weights.insert(name, Tensor::random(ty.dtype, dims, 100 + i as u64));
        }
    }
}

/// Deterministic random inputs for `model`, symbolic dims taking the value 2.
pub fn fixture_inputs(model: &kiln::Model) -> BTreeMap<String, Tensor> {
    let shapes: BTreeMap<String, Vec<usize>> = model
        .inputs()
        .into_iter()
        .map(|(n, t)| (n, t.shape.dims().iter().map(|d| d.as_static().unwrap_or(2) as usize).collect()))
        .collect();
    model.random_inputs(&shapes, 3).unwrap_or_else(|e| panic!("inputs: {e}"))
}

/// Same output names in the same order, each within `rtol`/`atol` (NaN matches NaN; integers exactly).
pub fn assert_outputs(what: &str, got: &[(String, Tensor)], want: &[(String, Tensor)], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for ((gn, g), (wn, w)) in got.iter().zip(want) {
        assert_eq!(gn, wn, "{what}: output names");
        if let Err(e) = kiln::conformance::compare(g, w, rtol, atol) {
            panic!("{what}: output `{gn}`: {e}");
        }
    }
}
