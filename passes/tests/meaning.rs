//! Passes preserve meaning: every registered pass and every named pipeline, run over every fixture in
//! `tests/fixtures/` with the verifier after each pass, leaves the interpreter's outputs unchanged on
//! deterministic inputs (symbolic dims bound to 2): exactly for integers and bools, within rtol 1e-5 for floats.
//! A new pass is covered as soon as it is in the registry.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kiln_ir::interp::run;
use kiln_ir::{Dim, Graph, Op, Tensor, parse};
use kiln_passes::{Instrumentation, PassContext, PassManager, Reproducer};

/// Parameters above this many elements in total are not given random weights: the graph is still transformed
/// and verified, but not run.
const MAX_RANDOM_WEIGHT_ELEMENTS: u64 = 1 << 20;

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
    assert!(out.len() >= 12, "expected the fixture set, found {}", out.len());
    out
}

fn static_dims(shape: &kiln_ir::Shape) -> Vec<usize> {
    shape.dims().iter().map(|d| d.as_static().map_or(2, |n| n as usize)).collect()
}

/// Binds random weights to unbound params; false when they would be too large to run.
fn bind_weights(g: &mut Graph) -> bool {
    let total: u64 = g.params().map(|id| g.node(id).outputs[0].shape.num_elements().unwrap_or(2)).sum();
    if total > MAX_RANDOM_WEIGHT_ELEMENTS {
        return false;
    }
    let params: Vec<_> = g.params().collect();
    for (i, id) in params.into_iter().enumerate() {
        let node = g.node(id);
        let Op::Parameter(p) = &node.op else { continue };
        if g.weights.get(&p.name).is_none() {
            let t = &node.outputs[0];
            let w = Tensor::random(t.dtype, static_dims(&t.shape), 1000 + i as u64);
            let name = p.name.clone();
            g.weights.insert(name, w);
        }
    }
    true
}

fn inputs(g: &Graph) -> BTreeMap<String, Tensor> {
    g.inputs()
        .iter()
        .enumerate()
        .filter_map(|(i, &id)| {
            let node = g.node(id);
            let Op::Input(inp) = &node.op else { return None };
            let t = &node.outputs[0];
            Some((inp.name.clone(), Tensor::random(t.dtype, static_dims(&t.shape), i as u64)))
        })
        .collect()
}

/// The symbols the inputs bind (each to 2, as `inputs` sizes them). Data-dependent symbols (a `non_zero`'s count,
/// a run-time `top_k`'s k) are left unbound: only a run knows them.
fn symbols(g: &Graph) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for &id in g.inputs() {
        for t in &g.node(id).outputs {
            for d in t.shape.dims() {
                if let Dim::Sym(s) = d {
                    out.insert(s.clone(), 2);
                }
            }
        }
    }
    out
}

/// Equal within the stated tolerances, or a message saying where not.
fn compare(want: &Tensor, got: &Tensor) -> Result<(), String> {
    if want.dtype() != got.dtype() || want.shape() != got.shape() {
        return Err(format!("type changed: {} became {}", want.tensor_type(), got.tensor_type()));
    }
    if !want.dtype().is_float() {
        return if want.to_i64_vec() == got.to_i64_vec() { Ok(()) } else { Err("integer values differ".into()) };
    }
    for (i, (a, b)) in want.to_f64_vec().into_iter().zip(got.to_f64_vec()).enumerate() {
        let same = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-5 * a.abs().max(b.abs());
        if !same {
            return Err(format!("element {i}: expected {a}, got {b}"));
        }
    }
    Ok(())
}

#[test]
fn every_pass_and_pipeline_preserves_every_fixture() {
    let mut pipelines: Vec<String> = kiln_passes::passes().iter().map(|p| p.name.to_string()).collect();
    pipelines.extend(kiln_passes::pipelines().iter().map(|p| p.name.to_string()));
    pipelines.push("fold-constants{max-elements=1}".into());
    let mut failures = Vec::new();
    let mut compared = 0;
    for (name, text) in fixtures() {
        let mut original = parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let runnable = bind_weights(&mut original);
        let ins = inputs(&original);
        let want = if runnable { run(&original, &ins).ok() } else { None };
        for pipeline in &pipelines {
            // infer-shapes also runs specialized, with every symbol bound to the value the inputs give it.
            for cx in [PassContext::default(), PassContext { bindings: symbols(&original), ..Default::default() }] {
                let mut g = original.clone();
                let pm = PassManager::parse(pipeline).expect("registered pipelines parse");
                let mut inst = Instrumentation { verify_each: true, reproducer: Reproducer::Off, ..Default::default() };
                if let Err(e) = pm.run(&mut g, &cx, &mut inst) {
                    failures.push(format!("{name} / {pipeline}: {e}"));
                    continue;
                }
                let Some(want) = &want else { continue };
                match run(&g, &ins) {
                    Err(e) => failures.push(format!("{name} / {pipeline}: the result no longer runs: {e}")),
                    Ok(got) => {
                        compared += 1;
                        let names = |v: &[(String, Tensor)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
                        if names(want) != names(&got) {
                            failures.push(format!("{name} / {pipeline}: outputs changed"));
                        }
                        for ((out, w), (_, gt)) in want.iter().zip(&got) {
                            if let Err(m) = compare(w, gt) {
                                failures.push(format!("{name} / {pipeline}: output `{out}`: {m}"));
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(compared > 100, "only {compared} runs were compared");
}
