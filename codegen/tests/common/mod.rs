//! Shared harness of the kernel tests: lower a whole graph as one group, run the kernel with the reference
//! evaluator and the graph with the interpreter on the same random inputs, and compare.

#![allow(dead_code)] // each test binary uses part of the harness

use std::collections::BTreeMap;

use kiln_codegen::kernel::{self, ArgRole, Extent, Kernel, LowerOptions, SpacePolicy};
use kiln_ir::op::Op;
use kiln_ir::{Dim, Graph, NodeId, Tensor};

/// Every node but the graph's inputs and parameters.
pub fn whole_group(g: &Graph) -> Vec<NodeId> {
    g.node_ids().filter(|&id| !matches!(g.node(id).op, Op::Input(_) | Op::Parameter(_))).collect()
}

/// Lowers `g` as one group, outputs in separate spaces allowed.
pub fn lower_whole(g: &Graph, name: &str) -> Result<Kernel, kernel::LowerError> {
    kernel::lower_with(g, &whole_group(g), name, &LowerOptions { spaces: SpacePolicy::Separate })
}

/// Float results may differ from the interpreter's by this much, relatively.
const FLOAT_TOLERANCE: f64 = 1e-6;

fn bound(shape: &kiln_ir::Shape, bindings: &[(&str, u64)]) -> Vec<usize> {
    shape
        .0
        .iter()
        .map(|d| match d {
            Dim::Static(n) => *n as usize,
            Dim::Sym(s) => {
                bindings.iter().find(|(n, _)| n == s).unwrap_or_else(|| panic!("unbound symbol {s}")).1 as usize
            }
        })
        .collect()
}

/// Checks `kernel` (lowered from `g`) against the interpreter on random inputs for a few seeds.
pub fn check_kernel(case: &str, g: &Graph, k: &Kernel, bindings: &[(&str, u64)]) {
    for seed in 0..3u64 {
        let mut inputs = BTreeMap::new();
        for (i, &id) in g.inputs().iter().enumerate() {
            let node = g.node(id);
            let Op::Input(inp) = &node.op else { unreachable!("inputs are input nodes") };
            let ty = &node.outputs[0];
            let t = Tensor::random(ty.dtype, bound(&ty.shape, bindings), seed * 1000 + i as u64);
            inputs.insert(inp.name.clone(), t);
        }
        let want = kiln_ir::interp::run(g, &inputs).unwrap_or_else(|e| panic!("{case}: interpreter: {e}"));
        let symbols: Vec<i64> = k
            .symbols
            .iter()
            .map(|s| bindings.iter().find(|(n, _)| n == s).unwrap_or_else(|| panic!("{case}: unbound {s}")).1 as i64)
            .collect();
        let mut args: Vec<Tensor> = k
            .launch_args()
            .map(|(_, a)| match a.role {
                ArgRole::Input => inputs.get(&a.name).unwrap_or_else(|| panic!("{case}: no input {}", a.name)).clone(),
                _ => {
                    let shape = a
                        .shape
                        .iter()
                        .map(|e| match e {
                            Extent::Const(n) => *n as usize,
                            Extent::Sym(s) => symbols[*s] as usize,
                        })
                        .collect();
                    Tensor::zeros(a.dtype, shape)
                }
            })
            .collect();
        kernel::eval(k, &mut args, &symbols).unwrap_or_else(|e| panic!("{case}: evaluator: {e}\n{}", kernel::print(k)));
        let compared = k.launch_args().filter(|(_, a)| a.role == ArgRole::Output).count();
        assert!(compared > 0 && compared >= distinct_outputs(g), "{case}: {compared} output buffer(s)");
        for ((_, a), got) in k.launch_args().zip(&args) {
            if a.role != ArgRole::Output {
                continue;
            }
            let (_, expected) =
                want.iter().find(|(n, _)| *n == a.name).unwrap_or_else(|| panic!("{case}: no output {}", a.name));
            compare(&format!("{case} (seed {seed}, output {})", a.name), got, expected, k);
        }
    }
}

/// The number of distinct values the graph outputs (each becomes one output buffer).
fn distinct_outputs(g: &Graph) -> usize {
    let mut vs: Vec<_> = g.outputs().iter().map(|(_, v)| *v).collect();
    vs.sort_unstable();
    vs.dedup();
    vs.len()
}

/// Parses, lowers as one group and checks a `.kir` graph.
pub fn check_kir(case: &str, text: &str, bindings: &[(&str, u64)]) -> Kernel {
    let g = kiln_ir::parse(text).unwrap_or_else(|e| panic!("{case}: parse: {e}"));
    let k = lower_whole(&g, case).unwrap_or_else(|e| panic!("{case}: lower: {e}"));
    check_kernel(case, &g, &k, bindings);
    k
}

fn compare(case: &str, got: &Tensor, want: &Tensor, k: &Kernel) {
    assert_eq!(got.dtype(), want.dtype(), "{case}: dtype");
    assert_eq!(got.shape(), want.shape(), "{case}: shape");
    if !want.dtype().is_float() {
        assert_eq!(got.to_i64_vec(), want.to_i64_vec(), "{case}: values\n{}", kernel::print(k));
        return;
    }
    for (i, (g, w)) in got.to_f64_vec().into_iter().zip(want.to_f64_vec()).enumerate() {
        let ok = (g.is_nan() && w.is_nan())
            || g.to_bits() == w.to_bits()
            || (g - w).abs() <= FLOAT_TOLERANCE * g.abs().max(w.abs());
        assert!(ok, "{case}: element {i} is {g}, the interpreter gives {w}\n{}", kernel::print(k));
    }
}
