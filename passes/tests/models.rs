//! O2 on a real model: resnet18 imported from ONNX keeps its outputs (rtol 1e-4 against the unoptimized graph
//! on the interpreter), and no `batch_norm` or `shape_of` survives. The model lives outside the repository
//! (`../shared/models`, or `KILN_MODELS_DIR`); when it is absent the test says so and passes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kiln_ir::interp::run;
use kiln_ir::{Graph, Op, Tensor};
use kiln_passes::{Instrumentation, PassContext, PassManager, Reproducer};

fn model(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("KILN_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models"));
    let path = dir.join(name).join("model.onnx");
    path.exists().then_some(path)
}

fn inputs(g: &Graph) -> BTreeMap<String, Tensor> {
    g.inputs()
        .iter()
        .enumerate()
        .filter_map(|(i, &id)| {
            let node = g.node(id);
            let Op::Input(input) = &node.op else { return None };
            let t = &node.outputs[0];
            let dims = t.shape.dims().iter().map(|d| d.as_static().map_or(1, |n| n as usize)).collect();
            Some((input.name.clone(), Tensor::random(t.dtype, dims, 7 + i as u64)))
        })
        .collect()
}

#[test]
fn o2_keeps_resnet18_outputs_and_folds_its_batch_norms() {
    let Some(path) = model("resnet18") else {
        eprintln!("SKIPPED: resnet18/model.onnx not found (set KILN_MODELS_DIR)");
        return;
    };
    let original = kiln_onnx::import(&path, &kiln_onnx::ImportOptions::default()).expect("resnet18 imports");
    let mut g = original.clone();
    let pm = PassManager::parse("O2").expect("O2 parses");
    let mut inst = Instrumentation { verify_each: true, reproducer: Reproducer::Off, ..Default::default() };
    pm.run(&mut g, &PassContext::default(), &mut inst).expect("O2 runs");
    let left: Vec<String> = g
        .node_ids()
        .filter(|&id| matches!(g.node(id).op, Op::BatchNorm(_) | Op::ShapeOf))
        .map(|id| g.describe(id))
        .collect();
    assert!(left.is_empty(), "O2 left {left:?}");

    let ins = inputs(&original);
    let want = run(&original, &ins).expect("the imported graph runs");
    let got = run(&g, &ins).expect("the optimized graph runs");
    assert_eq!(want.len(), got.len());
    for ((name, w), (_, o)) in want.iter().zip(&got) {
        let (w, o) = (w.to_f64_vec(), o.to_f64_vec());
        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        for (i, (a, b)) in w.iter().zip(&o).enumerate() {
            // rtol 1e-4 relative to the output's largest magnitude: a folded batch norm reassociates products,
            // so an element near zero after cancellation keeps only absolute accuracy.
            assert!((a - b).abs() <= 1e-4 * scale.max(a.abs()), "output `{name}`[{i}]: {a} vs {b}");
        }
    }
}
