//! O2 on the shared reference models: resnet18 keeps its outputs (rtol 1e-4 against the unoptimized graph on the
//! interpreter) with no `batch_norm` or `shape_of` left; every model's O2 output is snapshot-tested
//! (`<model>@O2`, weights are `param` declarations and stay out of the text); and the fusion groups the pipeline
//! promises are formed (each conv of resnet18 with its bias, relu and residual add; bert_small's and
//! gpt2_small's bias adds, layer norms, softmaxes and gelus one group each, nothing duplicated). The models live
//! outside the repository (`../shared/models`, or `KILN_MODELS_DIR`); when they are absent each test prints a
//! `SKIPPED:` line and passes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kiln_ir::interp::run;
use kiln_ir::op::UnaryOp;
use kiln_ir::{Graph, Op, Tensor};
use kiln_passes::{Instrumentation, PassContext, PassManager, Reproducer};

fn model(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("KILN_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/models"));
    let path = dir.join(name).join("model.onnx");
    path.exists().then_some(path)
}

/// Imports `name` (static shapes: the saved input set's extents where the model has symbolic dims) and runs O2
/// with verification after each pass. `None` (after a `SKIPPED:` line) when the model is absent.
fn optimized(name: &str) -> Option<(Graph, Graph)> {
    let Some(path) = model(name) else {
        eprintln!("SKIPPED: {name}/model.onnx not found (set KILN_MODELS_DIR)");
        return None;
    };
    let mut options = kiln_onnx::ImportOptions::default();
    if name == "gpt2_small_step" {
        // The saved set: 16 new tokens after a 16-token cache.
        options.shapes.insert("input_ids".into(), vec![1, 16]);
        options.shapes.insert("position_ids".into(), vec![1, 16]);
        options.shapes.insert("attention_mask".into(), vec![1, 32]);
        for layer in 0..4 {
            for kv in ["key", "value"] {
                options.shapes.insert(format!("past_key_values.{layer}.{kv}"), vec![1, 4, 16, 64]);
            }
        }
    }
    let original = kiln_onnx::import(&path, &options).unwrap_or_else(|e| panic!("{name} imports: {e}"));
    let mut g = original.clone();
    let pm = PassManager::parse("O2").expect("O2 parses");
    let mut inst = Instrumentation { verify_each: true, reproducer: Reproducer::Off, ..Default::default() };
    pm.run(&mut g, &PassContext::default(), &mut inst).unwrap_or_else(|e| panic!("O2 on {name}: {e}"));
    Some((original, g))
}

/// Every op of `g`, fusion bodies included, with whether it sits in a body and the body's op count.
fn all_ops(g: &Graph) -> Vec<(Op, Option<usize>)> {
    let mut out = Vec::new();
    for id in g.node_ids() {
        let op = &g.node(id).op;
        if let Op::Fusion(f) = op {
            let body = &f.body.0;
            let size = body.node_ids().filter(|&b| !matches!(body.node(b).op, Op::Input(_))).count();
            out.extend(body.node_ids().map(|b| (body.node(b).op.clone(), Some(size))));
        }
        out.push((op.clone(), None));
    }
    out
}

fn count(ops: &[(Op, Option<usize>)], pred: impl Fn(&Op) -> bool) -> usize {
    ops.iter().filter(|(op, _)| pred(op)).count()
}

#[test]
fn o2_snapshot_of_each_reference_model() {
    for name in ["mlp", "mlp_dynbatch", "resnet18", "bert_small", "gpt2_small", "gpt2_small_step"] {
        let Some((_, g)) = optimized(name) else { continue };
        let text = kiln_ir::print(&g);
        // Weights are `param` declarations; only small folded constants are printed.
        assert!(g.params().count() > 0 && text.len() < 64 << 10, "{name}: weights must stay out of the text");
        insta::assert_snapshot!(format!("{name}@O2"), text);
    }
}

#[test]
fn o2_fuses_each_resnet18_conv_with_its_bias_relu_and_residual_add() {
    let Some((original, g)) = optimized("resnet18") else { return };
    let top: Vec<String> = g.node_ids().filter(|&id| g.node(id).op.is_elementwise()).map(|id| g.describe(id)).collect();
    assert!(top.is_empty(), "elementwise ops left outside fusion groups: {top:?}");
    let mut convs_in_groups = 0;
    for id in g.node_ids() {
        if let Op::Fusion(f) = &g.node(id).op {
            let convs = f.body.0.node_ids().filter(|&b| matches!(f.body.0.node(b).op, Op::Conv(_))).count();
            assert!(convs <= 1, "{} holds {convs} convs", g.describe(id));
            convs_in_groups += convs;
        }
    }
    let convs = count(&all_ops(&original), |op| matches!(op, Op::Conv(_)));
    let standalone = g.node_ids().filter(|&id| matches!(g.node(id).op, Op::Conv(_))).count();
    assert_eq!(convs_in_groups + standalone, convs, "every conv is kept exactly once");
    // The only convs left alone are the three downsampling 1x1 convs, whose result feeds a residual add that
    // joined the group of the conv on the other path.
    assert!(standalone <= 3, "{standalone} convs form no group");
}

#[test]
fn o2_forms_one_group_per_transformer_pattern() {
    for name in ["bert_small", "gpt2_small"] {
        let Some((original, g)) = optimized(name) else { continue };
        let top: Vec<String> =
            g.node_ids().filter(|&id| g.node(id).op.is_elementwise()).map(|id| g.describe(id)).collect();
        assert!(top.is_empty(), "{name}: elementwise ops (bias adds, residuals) left outside fusion groups: {top:?}");
        let (before, after) = (all_ops(&original), all_ops(&g));
        for (what, pred) in [
            ("layer_norm", (|op: &Op| matches!(op, Op::LayerNorm(_))) as fn(&Op) -> bool),
            ("softmax", |op| matches!(op, Op::Softmax(_))),
            ("matmul", |op| matches!(op, Op::MatMul)),
            ("gelu's erf/tanh", |op| matches!(op, Op::Unary(UnaryOp::Erf | UnaryOp::Tanh))),
        ] {
            assert_eq!(count(&before, pred), count(&after, pred), "{name}: {what} count changed (duplicated?)");
            assert!(count(&after, pred) > 0, "{name}: no {what}");
        }
        // Each gelu (x·½·(1+erf(x/√2)) or the tanh form) is one group: its erf/tanh sits in a body with the
        // rest of the pattern's arithmetic, never split across kernels.
        for (op, body) in &after {
            if let Op::Unary(u @ (UnaryOp::Erf | UnaryOp::Tanh)) = op {
                assert!(body.is_some_and(|n| n >= 5), "{name}: a gelu's {u:?} is not grouped with its arithmetic");
            }
        }
    }
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

/// Outputs agree within rtol 1e-4 of each output's largest magnitude (folding batch norms and reassociating
/// constants changes rounding, so an element near zero after cancellation keeps only absolute accuracy).
fn close(name: &str, want: &[(String, Tensor)], got: &[(String, Tensor)]) -> Result<(), String> {
    if want.len() != got.len() {
        return Err(format!("{name}: {} outputs became {}", want.len(), got.len()));
    }
    for ((out, w), (out2, o)) in want.iter().zip(got) {
        if out != out2 || w.tensor_type() != o.tensor_type() {
            return Err(format!("{name}: output `{out}` {} became `{out2}` {}", w.tensor_type(), o.tensor_type()));
        }
        let (w, o) = (w.to_f64_vec(), o.to_f64_vec());
        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        if let Some((i, (a, b))) = w
            .iter()
            .zip(&o)
            .enumerate()
            .find(|(_, (a, b))| !(a.is_nan() && b.is_nan()) && (*a - *b).abs() > 1e-4 * scale.max(a.abs()))
        {
            return Err(format!("{name}: output `{out}`[{i}]: {a} vs {b}"));
        }
    }
    Ok(())
}

/// Runs every registered pass alone and every named pipeline over the reference model `name` and compares the
/// interpreter's outputs with the imported graph's.
fn every_pass_and_pipeline_preserves(name: &str) {
    let mut pipelines: Vec<String> = kiln_passes::passes().iter().map(|p| p.name.to_string()).collect();
    pipelines.extend(kiln_passes::pipelines().iter().map(|p| p.name.to_string()));
    // `optimized` imports with the saved set's static shapes.
    let Some((original, _)) = optimized(name) else { return };
    let ins = inputs(&original);
    let want = run(&original, &ins).unwrap_or_else(|e| panic!("{name} runs on the interpreter: {e}"));
    let mut failures = Vec::new();
    for pipeline in &pipelines {
        let mut g = original.clone();
        let pm = PassManager::parse(pipeline).expect("registered pipelines parse");
        let mut inst = Instrumentation { verify_each: true, reproducer: Reproducer::Off, ..Default::default() };
        let result = pm
            .run(&mut g, &PassContext::default(), &mut inst)
            .map_err(|e| e.to_string())
            .and_then(|_| run(&g, &ins).map_err(|e| format!("the result no longer runs: {e}")))
            .and_then(|got| close(name, &want, &got));
        if let Err(e) = result {
            failures.push(format!("{name} / {pipeline}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

macro_rules! meaning_tests {
    ($($test:ident = $model:literal;)*) => {$(
        #[test]
        fn $test() {
            every_pass_and_pipeline_preserves($model);
        }
    )*};
}

meaning_tests! {
    every_pass_and_pipeline_preserves_mlp = "mlp";
    every_pass_and_pipeline_preserves_mlp_dynbatch = "mlp_dynbatch";
    every_pass_and_pipeline_preserves_resnet18 = "resnet18";
    every_pass_and_pipeline_preserves_bert_small = "bert_small";
    every_pass_and_pipeline_preserves_gpt2_small = "gpt2_small";
    every_pass_and_pipeline_preserves_gpt2_small_step = "gpt2_small_step";
}
