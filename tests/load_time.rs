//! Work that depends on no input runs once, when the weights are bound: a computed weight (here an `iota`
//! chain too large for `fold-constants`, as ONNX `ConstantOfShape` weights of model-zoo files are) becomes a
//! prepare step whose result lives outside the arena — also when a run's kernel reads it, which fusion does not
//! merge with it — and matmuls read it packed. The compiled program gives the
//! interpreter's answer whether or not a run can take the packed path (static rows, symbolic rows at several
//! extents), and whether or not another step also reads the computed weight unpacked.

use std::collections::BTreeMap;

use kiln::{Backend, CompileOptions, Model, RunOptions};
use kiln_ir::{DType, Tensor};

/// `w[i, j] = 0.001·j − 0.002·i` over [256, 300] (76 800 elements: above `fold-constants`' 65 536), transposed,
/// then the right operand of a one-row matmul and of a matmul of `rows` rows (`n`, symbolic, or a number).
/// `extra` is spliced in before the outputs (another reader of the transposed weight, or nothing).
fn graph(rows: &str, extra: &str) -> String {
    format!(
        r#"graph "computed_weights" {{
  %x = input {{name="x"}} : f32[1,300]
  %y = input {{name="y"}} : f32[{rows},300]
  %c = iota {{dtype=f32, shape=[256,300], axis=1, start=0.0, step=0.001}} : f32[256,300]
  %r = iota {{dtype=f32, shape=[256,300], axis=0, start=0.0, step=-0.002}} : f32[256,300]
  %w = add %c, %r : f32[256,300]
  %wt = transpose %w {{perm=[1, 0]}} : f32[300,256]
  %a = matmul %x, %wt : f32[1,256]
  %b = matmul %y, %wt : f32[{rows},256]
{extra}  output "a" = %a
  output "b" = %b
}}
"#
    )
}

fn inputs(n: usize) -> BTreeMap<String, Tensor> {
    BTreeMap::from([
        ("x".to_string(), Tensor::random(DType::F32, vec![1, 300], 1)),
        ("y".to_string(), Tensor::random(DType::F32, vec![n, 300], 2)),
    ])
}

/// Compiles `text`, checks it against the interpreter with `y` of each of `rows` rows, and returns the arena's
/// bytes.
fn check(text: &str, rows: &[usize], outputs: usize) -> u64 {
    let model = Model::from_graph(kiln_ir::parse(text).expect("parses")).expect("verifies");
    let compiled = model.compile(&CompileOptions { threads: 2, ..Default::default() }).expect("compiles");
    let report = compiled.report();
    assert_eq!(report.steps[2], 0, "no interpreter step");
    for &n in rows {
        let want = model
            .run(&inputs(n), &RunOptions { backend: Backend::Interp, threads: 1, ..Default::default() })
            .expect("interprets");
        let got = compiled.run(&inputs(n)).expect("runs");
        assert_eq!(got.len(), outputs);
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            assert_eq!(g.shape(), w.shape(), "{name} at n = {n}");
            let (g, w) = (g.as_slice::<f32>().unwrap(), w.as_slice::<f32>().unwrap());
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{name}[{i}] at n = {n}: {a} vs {b}");
            }
        }
    }
    report.arena_bytes
}

#[test]
fn a_weight_computed_from_no_input_is_prepared_once_and_read_packed() {
    // Static rows: the matmuls read only the packed weight (its unpacked copy is released). Symbolic rows: a run
    // of many rows reads it unpacked.
    for (rows, extents, arena_max) in [("4", &[4][..], 5 * 1024), ("n", &[1, 3, 200][..], 1024)] {
        let arena = check(&graph(rows, ""), extents, 2);
        // The 300×256 weight is no intermediate of a run: the arena holds only the static results.
        assert!(arena <= arena_max, "{rows} rows: the arena ({arena} bytes) holds the computed weight");
    }
}

#[test]
fn a_computed_weight_that_a_kernel_also_reads_stays_readable() {
    // A run's kernel reads the transposed weight directly (scaled by the input): it must stay readable once
    // packed, and fusion keeps the weight's computation a group of its own (prepared once), not a result of the
    // kernel that reads it.
    let extra = "  %q = reshape %x {shape=[300,1]} : f32[300,1]
  %qb = broadcast %q {shape=[300,256]} : f32[300,256]
  %p = mul %wt, %qb : f32[300,256]
  %s = reduce %p {kind=sum, axes=[0], keep_dims=false} : f32[256]
  output \"s\" = %s
";
    for (rows, extents, arena_max) in [("4", &[4][..], 6 * 1024), ("n", &[1, 200][..], 2048)] {
        let arena = check(&graph(rows, extra), extents, 3);
        assert!(arena <= arena_max, "{rows} rows: the arena ({arena} bytes) holds the computed weight");
    }
}
