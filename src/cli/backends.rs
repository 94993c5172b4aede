//! `kiln backends`: the backend registry as a run would see it — the built-in backends plus the plugins listed
//! in `KILN_BACKEND_PLUGINS` — one line per backend, best first. With `--check`, every backend also runs a sample
//! node of each op it declares (among the samples below), compared with the reference interpreter: a quick
//! conformance check for plugin authors.

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln_ir::op::{BinaryOp, Softmax, UnaryOp};
use kiln_ir::{DType, Op, Tensor};
use kiln_runtime::contract::{Backend, Node};
use kiln_runtime::registry::{BackendRegistry, PLUGINS_ENV_VAR};

/// Arguments of `kiln backends`.
#[derive(Args, Debug)]
pub struct BackendsArgs {
    /// Also run a sample node of every op each backend declares and compare it with the interpreter (exit 1 on
    /// any mismatch or error).
    #[arg(long)]
    check: bool,
}

pub fn run(a: BackendsArgs) -> Result<()> {
    let (mut registry, no_device) = BackendRegistry::with_devices();
    registry.load_plugins_from_env().with_context(|| format!("loading the plugins in {PLUGINS_ENV_VAR}"))?;
    for line in registry.describe() {
        println!("{line}");
    }
    if let Some(why) = no_device {
        // On stderr: the listing stays the registry's lines alone, for scripts.
        eprintln!("(no cuda backend: {why})");
    }
    if a.check {
        let mut failures = 0;
        for name in registry.names() {
            let backend = registry.get(&name).expect("listed by the registry");
            failures += check(&name, backend.as_ref());
        }
        if failures > 0 {
            bail!("{failures} sample node(s) failed");
        }
    }
    Ok(())
}

/// Deterministic f32 values in about [-scale, scale].
fn sample(shape: &[usize], seed: u64, scale: f64) -> Tensor {
    let t = Tensor::random(DType::F32, shape.to_vec(), seed);
    Tensor::from_vec(shape.to_vec(), t.to_f64_vec().iter().map(|v| (v * scale) as f32).collect()).expect("same length")
}

/// One sample node per op: broadcasting binary ops, unary ops, a matmul, a last-axis softmax.
fn samples() -> Vec<(Op, Vec<Tensor>)> {
    let mut v = Vec::new();
    for (i, k) in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div].into_iter().enumerate() {
        v.push((Op::Binary(k), vec![sample(&[2, 3], i as u64, 3.0), sample(&[3], 10 + i as u64, 3.0)]));
    }
    for (i, k) in [UnaryOp::Relu, UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid].into_iter().enumerate() {
        v.push((Op::Unary(k), vec![sample(&[2, 3], 20 + i as u64, 3.0)]));
    }
    v.push((Op::MatMul, vec![sample(&[2, 3], 30, 2.0), sample(&[3, 4], 31, 2.0)]));
    v.push((Op::Softmax(Softmax { axis: -1 }), vec![sample(&[2, 5], 32, 4.0)]));
    v
}

/// Runs every sample the backend covers; prints one line; returns how many failed.
fn check(name: &str, backend: &dyn Backend) -> usize {
    let caps = backend.capabilities();
    let mut checked = Vec::new();
    let mut failed = Vec::new();
    for (op, inputs) in samples() {
        let node = Node::op(format!("sample {}", op.mnemonic()), op.clone());
        if !caps.covers(&node) {
            continue;
        }
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let want = match kiln_ir::interp::eval_op(&op, &refs) {
            Ok(w) => w,
            Err(e) => {
                failed.push(format!("{}: the interpreter refused the sample: {e}", op.mnemonic()));
                continue;
            }
        };
        match backend.run_with_cache(&node, &inputs, None, 0) {
            Err(e) => failed.push(format!("{}: {e}", op.mnemonic())),
            Ok(got) => match compare(&got.outputs, &want) {
                Ok(()) => checked.push(op.mnemonic()),
                Err(why) => failed.push(format!("{}: {why}", op.mnemonic())),
            },
        }
    }
    if failed.is_empty() {
        println!("check {name}: {} sample ops match the interpreter ({})", checked.len(), checked.join(","));
    } else {
        println!("check {name}: FAILED {}", failed.join("; "));
    }
    failed.len()
}

/// Same shapes and dtypes, values within 1e-5 relative (1e-6 absolute).
fn compare(got: &[Tensor], want: &[Tensor]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g.dtype() != w.dtype() || g.shape() != w.shape() {
            return Err(format!("output {i} is {}{:?}, expected {}{:?}", g.dtype(), g.shape(), w.dtype(), w.shape()));
        }
        for (k, (a, b)) in g.to_f64_vec().into_iter().zip(w.to_f64_vec()).enumerate() {
            if (a - b).abs() > 1e-6 + 1e-5 * b.abs() && !(a.is_nan() && b.is_nan()) {
                return Err(format!("output {i} element {k}: {a} against the interpreter's {b}"));
            }
        }
    }
    Ok(())
}
