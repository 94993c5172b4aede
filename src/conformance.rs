//! ONNX backend node-test conformance: run every case folder (`model.onnx` + `test_data_set_*/`) and compare.
//!
//! A case *passes* when every data set's outputs match; it is *unsupported* when import refuses it with the
//! clear list of unsupported features; it *fails* otherwise — imported, then a wrong value, an execution error or
//! a panic (caught per case, so one crash never stops the run). Tolerances are rtol 1e-3, atol 1e-5 for floats
//! (exceptions in [`tolerance`]), exact for integers and bools; NaN matches NaN.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use kiln_ir::Tensor;

use crate::{Backend, LoadOptions, Model, RunOptions};

/// How one case ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every output matched.
    Passed,
    /// Imported, then wrong, erroring or crashing.
    Failed(String),
    /// Refused at import with a clear error.
    Unsupported(String),
}

/// One case's name and outcome.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// The case folder's name (`test_add_bcast`).
    pub name: String,
    /// How it ended.
    pub outcome: Outcome,
}

/// `(rtol, atol)` for an output. The default is rtol 1e-3, atol 1e-5. Exceptions, each with its reason:
/// - f16 and bf16 outputs: 1e-3 is below (bf16) or about two units in the last place of (f16) these formats, and
///   a composed op rounds after every step, so they are compared at a few units in the last place of their own
///   precision: f16 rtol 4e-3 (8 ulp), bf16 rtol 2e-2 (5 ulp), atol scaled alike.
pub fn tolerance(_case: &str, dtype: kiln_ir::DType) -> (f64, f64) {
    match dtype {
        kiln_ir::DType::F16 => (4e-3, 1e-4),
        kiln_ir::DType::BF16 => (2e-2, 1e-3),
        _ => (1e-3, 1e-5),
    }
}

/// Case folders under `root` whose names contain `filter`, sorted: every folder holding a `model.onnx` entry —
/// one that is not a file (a directory, say) is still a case, which then fails saying so, never a silent skip.
pub fn cases(root: &Path, filter: Option<&str>) -> std::io::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").exists())
        .filter(|p| filter.is_none_or(|f| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.contains(f))))
        .collect();
    v.sort();
    Ok(v)
}

/// Runs one case folder.
pub fn run_case(dir: &Path, backend: Backend) -> Outcome {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("?").to_string();
    match std::panic::catch_unwind(AssertUnwindSafe(|| run_case_inner(dir, &name, backend))) {
        Ok(o) => o,
        Err(p) => {
            let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
            Outcome::Failed(format!("panicked: {}", msg.unwrap_or_default()))
        }
    }
}

fn read_set(ds: &Path, prefix: &str) -> Result<Vec<(String, Tensor)>, kiln_onnx::tensor::TensorFileError> {
    let mut out = Vec::new();
    for j in 0.. {
        let p = ds.join(format!("{prefix}_{j}.pb"));
        if !p.exists() {
            break;
        }
        out.push(kiln_onnx::tensor::read_tensor_file(&p)?);
    }
    Ok(out)
}

fn run_case_inner(dir: &Path, name: &str, backend: Backend) -> Outcome {
    if !dir.join("model.onnx").is_file() {
        return Outcome::Failed("model.onnx is not a file".into());
    }
    let mut sets: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()).collect(),
        Err(e) => return Outcome::Failed(format!("cannot list {}: {e}", dir.display())),
    };
    sets.sort();
    if sets.is_empty() {
        return Outcome::Failed("no test_data_set_* folder".into());
    }
    for ds in sets {
        // Test data of a dtype kiln lacks is unsupported; unreadable or corrupt test data is a failure of the
        // case, never a quiet "unsupported".
        let (inputs, expected) = match (read_set(&ds, "input"), read_set(&ds, "output")) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(kiln_onnx::tensor::TensorFileError::Invalid(e)), _)
            | (_, Err(kiln_onnx::tensor::TensorFileError::Invalid(e))) => {
                return Outcome::Failed(format!("test data: {e}"));
            }
            (Err(e), _) | (_, Err(e)) => return Outcome::Unsupported(format!("test data: {e}")),
        };
        // Test data names its tensors, or (older cases) leaves the names empty: those bind by position, as ONNX's
        // backend runner binds them.
        let inputs = match bind_by_position(&dir.join("model.onnx"), inputs) {
            Ok(i) => i,
            Err(e) => return Outcome::Failed(format!("test data: {e}")),
        };
        let shapes: BTreeMap<String, Vec<usize>> =
            inputs.iter().map(|(n, t)| (n.clone(), t.shape().to_vec())).collect();
        let mut options = LoadOptions { shapes, ..LoadOptions::default() };
        let path = dir.join("model.onnx");
        let mut loaded = Model::load(&path, &options);
        // Node tests feed shape arguments (axes, pads, k, repeats…) as graph inputs; a model that needs them known
        // is specialized on this data set's small inputs, as a runtime compiling for fixed arguments would.
        if let Err(crate::Error::Onnx(kiln_onnx::ImportError::Unsupported(list))) = &loaded
            && list.iter().all(|u| u.message.contains("known at import time"))
        {
            options.known_inputs = inputs.iter().filter(|(_, t)| t.len() <= 64).cloned().collect();
            loaded = Model::load(&path, &options);
        }
        let model = match loaded {
            Ok(m) => m,
            Err(crate::Error::Onnx(e @ kiln_onnx::ImportError::Unsupported(_))) => {
                return Outcome::Unsupported(e.to_string().replace('\n', " "));
            }
            Err(e) => return Outcome::Failed(format!("import: {e}")),
        };
        // Inputs the model was specialized on are constants of it now.
        let given: BTreeMap<String, Tensor> =
            inputs.into_iter().filter(|(n, _)| !options.known_inputs.contains_key(n)).collect();
        // Fallbacks are allowed quietly: a case checks results, and `kiln run --fallback deny` checks compilation.
        let quiet = RunOptions { backend, threads: 1, fallback: crate::FallbackPolicy::Allow, ..Default::default() };
        let outputs = match model.run(&given, &quiet) {
            Ok(o) => o,
            Err(e) => return Outcome::Failed(format!("run: {e}")),
        };
        if outputs.len() != expected.len() {
            return Outcome::Failed(format!("{} outputs, expected {}", outputs.len(), expected.len()));
        }
        for ((out_name, got), (_, want)) in outputs.iter().zip(&expected) {
            let (rtol, atol) = tolerance(name, want.dtype());
            if let Err(e) = compare(got, want, rtol, atol) {
                let name = out_name;
                return Outcome::Failed(format!("output `{name}`: {e}"));
            }
        }
    }
    Outcome::Passed
}

/// Names the unnamed tensors of `inputs` after the model's graph inputs at their positions.
fn bind_by_position(model: &Path, inputs: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, String> {
    if inputs.iter().all(|(n, _)| !n.is_empty()) {
        return Ok(inputs);
    }
    let (names, _) = kiln_onnx::port_names(model).map_err(|e| e.to_string())?;
    if inputs.len() > names.len() {
        return Err(format!("{} input tensors, but the model has {} graph input(s)", inputs.len(), names.len()));
    }
    Ok(inputs.into_iter().zip(names).map(|((n, t), name)| (if n.is_empty() { name } else { n }, t)).collect())
}

/// Compares a result with the expected tensor: same dtype and shape; floats within tolerance, NaN matching NaN;
/// everything else exact.
pub fn compare(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {} but expected {}", got.dtype(), want.dtype()));
    }
    if got.shape() != want.shape() {
        return Err(format!("shape {:?} but expected {:?}", got.shape(), want.shape()));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let float = got.dtype().is_float();
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = if float {
            (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * b.abs()
        } else {
            got.data().get_i64(i) == want.data().get_i64(i)
        };
        if !ok {
            let err = if a.is_finite() && b.is_finite() { (a - b).abs() } else { f64::INFINITY };
            if worst.is_none_or(|(_, e)| err > e) {
                worst = Some((i, err));
            }
        }
    }
    match worst {
        None => Ok(()),
        Some((i, _)) => Err(format!("element {i} is {} but expected {} (rtol {rtol}, atol {atol})", g[i], w[i])),
    }
}
