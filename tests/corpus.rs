//! The public model corpus (`scripts/gen_corpus.py` writes it into `.cache/corpus`; `scripts/test.sh` runs the
//! generator first): real architectures kiln was not tuned on — the `onnx` wheel's light model zoo, and the shared
//! reference models with their batch and image/sequence dims made symbolic — each with input sets and ONNX
//! Runtime's outputs.
//!
//! Every model is loaded as declared (symbolic dims stay symbolic: no shapes given), compiled once for the CPU
//! with `FallbackPolicy::Deny` (no interpreter step), and that one program runs every input set — two different
//! shapes for the symbolic models — matching ONNX Runtime; the same through an ahead-of-time artifact. Without
//! the corpus (no `.cache/corpus`, or `KILN_CORPUS_DIR` pointing nowhere) the test prints `SKIPPED:` and why.
//! The known gaps are listed in `tests/corpus-fallbacks.txt` and must fall back exactly as listed (a ratchet).
//! Outputs match within rtol 1e-3 / atol 1e-4, or the model's `tolerance.json` (the int8 variants: 1% of the
//! output's largest magnitude, as a value on a quantization boundary may round either way).

use std::path::{Path, PathBuf};

use kiln::{Artifact, CompileOptions, FallbackPolicy, Model};

mod common;

fn corpus_dir() -> PathBuf {
    std::env::var_os("KILN_CORPUS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/corpus"))
}

/// One input set of a corpus model: its name, the inputs, and ONNX Runtime's outputs.
struct InputSet {
    name: String,
    inputs: std::collections::BTreeMap<String, kiln_ir::Tensor>,
    expected: Vec<(String, kiln_ir::Tensor)>,
}

/// How closely a corpus model's outputs must match: `|got − want| ≤ atol + rtol·|want|` per element, where atol is
/// the larger of `atol` and `atol_of_max` times the output's largest magnitude, or an output's own entry in
/// `step` (a dequantized 8-bit output: one quantization step, its scale). The model's `tolerance.json` (the
/// generator writes one where the default does not apply, with why) or rtol 1e-3, atol 1e-4.
#[derive(serde::Deserialize)]
struct Tolerance {
    #[serde(default = "default_rtol")]
    rtol: f64,
    #[serde(default = "default_atol")]
    atol: f64,
    #[serde(default)]
    atol_of_max: f64,
    #[serde(default)]
    step: std::collections::BTreeMap<String, f64>,
}

fn default_rtol() -> f64 {
    1e-3
}

fn default_atol() -> f64 {
    1e-4
}

fn tolerance(case: &Path) -> Result<Tolerance, String> {
    match std::fs::read_to_string(case.join("tolerance.json")) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| format!("tolerance.json: {e}")),
        Err(_) => {
            Ok(Tolerance { rtol: default_rtol(), atol: default_atol(), atol_of_max: 0.0, step: Default::default() })
        }
    }
}

/// Compares outputs with the expected ones by name within `t`; `Err` describes every mismatch.
fn compare(
    got: Vec<(String, kiln_ir::Tensor)>,
    expected: &[(String, kiln_ir::Tensor)],
    t: &Tolerance,
) -> Result<(), String> {
    let got: std::collections::BTreeMap<String, kiln_ir::Tensor> = got.into_iter().collect();
    let problems: Vec<String> = expected
        .iter()
        .filter_map(|(name, want)| {
            let Some(g) = got.get(name) else { return Some(format!("output `{name}` is missing")) };
            let max = want.to_f64_vec().iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
            // A quantization step, with room for the f32 rounding of the dequantized value.
            let atol = t.step.get(name).map_or(t.atol.max(t.atol_of_max * max), |s| s * (1.0 + 1e-5));
            kiln::conformance::compare(g, want, t.rtol, atol).err().map(|e| format!("output `{name}`: {e}"))
        })
        .collect();
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

/// The input sets of a corpus model, in set order.
fn sets(case: &Path) -> Vec<InputSet> {
    let mut dirs: Vec<PathBuf> =
        std::fs::read_dir(case.join("sets")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    dirs.sort();
    dirs.iter()
        .map(|d| InputSet {
            name: d.file_name().unwrap().to_string_lossy().into_owned(),
            inputs: common::read_manifest(&d.join("inputs")).into_iter().collect(),
            expected: common::read_manifest(&d.join("expected")),
        })
        .collect()
}

#[test]
fn every_corpus_model_matches_onnx_runtime_compiled_with_no_interpreter_step() {
    let Some(cases) = corpus_cases(|_| true) else { return };
    assert!(cases.len() >= 9, "the corpus should hold the light model zoo at least: {cases:?}");
    let known = known_fallbacks();
    let out = tempfile::tempdir().unwrap();
    check_each(&cases, "", |case, name| {
        let model = Model::load(&case.join("model.onnx"), &Default::default()).map_err(|e| format!("load: {e}"))?;
        let gaps: Vec<&(String, String, usize, String)> = known.iter().filter(|g| g.0 == name).collect();
        let fallback = if gaps.is_empty() { FallbackPolicy::Deny } else { FallbackPolicy::Allow };
        let options = CompileOptions { threads: 2, fallback, ..Default::default() };
        let compiled = model.compile(&options).map_err(|e| format!("compile: {e}"))?;
        let got: Vec<(String, usize, String)> = kiln::fallback_kinds(compiled.fallbacks())
            .into_iter()
            .map(|(op, n, why)| (op.to_string(), n, why.to_string()))
            .collect();
        let want: Vec<(String, usize, String)> = gaps.iter().map(|g| (g.1.clone(), g.2, g.3.clone())).collect();
        if got != want || compiled.report().steps[2] != want.iter().map(|w| w.1).sum::<usize>() {
            return Err(format!(
                "interpreter steps {got:?}, but tests/corpus-fallbacks.txt lists {want:?} (a new fallback, or a \
                     fixed one whose line should go)"
            ));
        }
        for (op, n, why) in &want {
            println!("KNOWN GAP: {name}: {n} `{op}` node(s) run on the interpreter: {why}");
        }
        let lowered = model.lower(&options).map_err(|e| format!("lower: {e}"))?;
        let dir = out.path().join(name);
        Artifact::write(&lowered, &dir).map_err(|e| format!("artifact: {e}"))?;
        let loaded = Artifact::load(&dir, 2).map_err(|e| format!("artifact load: {e}"))?;
        let sets = sets(case);
        let tolerance = tolerance(case)?;
        for set in &sets {
            for (how, program) in [("JIT", &compiled), ("AOT", &loaded)] {
                let got = program.run(&set.inputs).map_err(|e| format!("set {} ({how}): run: {e}", set.name))?;
                compare(got, &set.expected, &tolerance).map_err(|e| format!("set {} ({how}): {e}", set.name))?;
            }
        }
        Ok(sets.len())
    });
}

/// The reduced-precision corpus models (`int8_*`, `fp16_*`: ONNX Runtime's quantizer and onnxconverter-common
/// wrote them) through the CUDA runtime on the emulated device: the device plan (cuBLAS products, PTX kernels for the
/// rest) with `FallbackPolicy::Deny`, so no step may run on the interpreter, matching ONNX Runtime on every input
/// set. The tests of the node ops run on the emulator too (`kiln conformance --backend cuda-emulated`); this
/// checks the quantized and half-precision graphs that real tools write, end to end.
#[test]
fn reduced_precision_corpus_models_match_onnx_runtime_on_the_emulated_device() {
    let reduced = |name: &str| name.starts_with("int8_") || name.starts_with("fp16_");
    let Some(cases) = corpus_cases(reduced) else { return };
    assert!(cases.len() >= 4, "the corpus should hold int8 and fp16 variants: {cases:?}");
    let options =
        kiln::RunOptions { backend: kiln::Backend::CudaEmulated, fallback: FallbackPolicy::Deny, ..Default::default() };
    check_each(&cases, " (cuda-emulated)", |case, _| {
        let model = Model::load(&case.join("model.onnx"), &Default::default()).map_err(|e| format!("load: {e}"))?;
        let tolerance = tolerance(case)?;
        let sets = sets(case);
        for set in &sets {
            let got = model.run(&set.inputs, &options).map_err(|e| format!("set {}: run: {e}", set.name))?;
            compare(got, &set.expected, &tolerance).map_err(|e| format!("set {}: {e}", set.name))?;
        }
        Ok(sets.len())
    });
}

/// The corpus models whose folder name `keep` accepts, sorted; `None` (after printing `SKIPPED:` and why) when there
/// is no corpus.
fn corpus_cases(keep: impl Fn(&str) -> bool) -> Option<Vec<PathBuf>> {
    let root = corpus_dir();
    if !root.join("VERSION").is_file() {
        println!(
            "SKIPPED: no model corpus at {} (scripts/gen_corpus.py writes it; scripts/test.sh runs it)",
            root.display()
        );
        return None;
    }
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").is_file() && keep(&p.file_name().unwrap().to_string_lossy()))
        .collect();
    cases.sort();
    Some(cases)
}

/// Runs `check(case folder, case name)` on every case (it returns how many input sets matched), prints one line
/// per case (its name followed by `how`), and fails naming every case that did not pass.
fn check_each(cases: &[PathBuf], how: &str, check: impl Fn(&Path, &str) -> Result<usize, String>) {
    let mut failures = Vec::new();
    for case in cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let t0 = std::time::Instant::now();
        match check(case, &name) {
            Ok(n) => eprintln!("{name}{how}: ok, {n} input set(s), in {:.1} s", t0.elapsed().as_secs_f64()),
            Err(e) => {
                eprintln!("{name}{how}: FAILED: {e}");
                failures.push(format!("{name}: {e}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} corpus models failed{how}:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// `tests/corpus-fallbacks.txt`: `(model, op, count, why)` per line.
fn known_fallbacks() -> Vec<(String, String, usize, String)> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus-fallbacks.txt")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.splitn(4, " | ").collect();
            let [model, op, n, why] = f[..] else {
                panic!("corpus-fallbacks.txt: `{l}`: expected `model | op | count | why`")
            };
            (model.to_string(), op.to_string(), n.parse().expect("a count"), why.to_string())
        })
        .collect()
}
