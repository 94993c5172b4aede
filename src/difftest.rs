//! Differential testing of the CPU backend against the reference interpreter — a testing utility, not part of
//! the compiler.
//!
//! The random graphs come from `kiln_ir::random` (re-exported here: [`random_graph`], [`GenOptions`], [`OpKind`],
//! [`SplitMix64`]). [`check`] compiles one for the CPU with one and with two worker threads, runs it, and compares
//! every output with the interpreter's.
//! `tests/differential.rs` runs a fixed seed range; the `differential` fuzz target lets libFuzzer choose seeds.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;

pub use kiln_ir::random::{GenOptions, OpKind, SplitMix64, random_graph};
use kiln_ir::{Graph, Tensor};

use crate::{CompileOptions, Model, RunOptions};

/// Float outputs match when `|cpu - interp| <= ATOL + RTOL * |interp| + SPREAD * spread` (or both are NaN), where
/// `spread` is how far the element moves when every intermediate float result is perturbed by a few units in the
/// last place (see [`rounding_spread`]); integers match exactly.
pub const RTOL: f64 = 1e-4;
/// See [`RTOL`].
pub const ATOL: f64 = 1e-5;
/// See [`RTOL`]: how many times an output element's observed rounding spread a compiled result may differ by.
pub const SPREAD: f64 = 4.0;
/// How many perturbed interpreter runs [`rounding_spread`] makes.
const PERTURBED_RUNS: u64 = 3;
/// The largest relative perturbation of an intermediate result, in machine epsilons of its dtype.
const PERTURBATION: f64 = 2.0;

/// Checks seed `seed` with the default [`GenOptions`]; see [`check_with`].
pub fn check(seed: u64) -> Result<(), String> {
    check_with(seed, &GenOptions::default())
}

/// Builds the graph for `seed`, runs it on the interpreter and compiled for the CPU (one and two threads), and
/// compares: every output within [`RTOL`]/[`ATOL`] (floats, NaN matching NaN) or equal (integers). When the
/// interpreter fails, the CPU backend must fail too; a panic anywhere is a failure. The error names the seed,
/// what differed, and the graph's `.kir` text.
pub fn check_with(seed: u64, options: &GenOptions) -> Result<(), String> {
    let (graph, inputs) = random_graph(seed, options);
    let text = kiln_ir::print(&graph);
    compare_backends(graph, &inputs).map_err(|e| format!("seed {seed}: {e}\n--- graph ---\n{text}"))
}

fn compare_backends(graph: Graph, inputs: &BTreeMap<String, Tensor>) -> Result<(), String> {
    let model = Model::from_graph(graph).map_err(|e| format!("the generator built an invalid graph: {e}"))?;
    let want = guarded("the interpreter", || {
        model.run(inputs, &RunOptions { backend: crate::Backend::Interp, threads: 1, ..Default::default() })
    })?;
    let mut spread: Option<Vec<Vec<f64>>> = None;
    for threads in [1, 2] {
        let got = guarded("the CPU backend", || {
            model.compile(&CompileOptions { threads, ..CompileOptions::default() })?.run(inputs)
        })?;
        let (want, got) = match (&want, got) {
            (Err(_), Err(_)) => continue,
            (Err(w), Ok(_)) => {
                return Err(format!("{threads} thread(s): the interpreter failed ({w}) but the CPU backend ran"));
            }
            (Ok(_), Err(e)) => return Err(format!("{threads} thread(s): the CPU backend failed: {e}")),
            (Ok(want), Ok(got)) => (want, got),
        };
        if want.len() != got.len() {
            return Err(format!("{threads} thread(s): {} outputs, the interpreter gave {}", got.len(), want.len()));
        }
        for (i, ((gn, g), (wn, w))) in got.iter().zip(want).enumerate() {
            if gn != wn {
                return Err(format!("{threads} thread(s): output `{gn}` where the interpreter has `{wn}`"));
            }
            if crate::conformance::compare(g, w, RTOL, ATOL).is_ok() {
                continue;
            }
            // Outside the fixed tolerance: allow for ill-conditioned arithmetic (cancellation, a normalization of
            // nearly equal values), whose result rounding alone moves, by measuring how far it moves.
            let spread = spread.get_or_insert_with(|| rounding_spread(model.graph(), inputs, want));
            compare_within(g, w, spread.get(i).map(Vec::as_slice))
                .map_err(|e| format!("{threads} thread(s): output `{gn}`: {e}"))?;
        }
    }
    Ok(())
}

/// Per output and element, how far the interpreter's result moves when every intermediate float result is
/// perturbed by up to [`PERTURBATION`] machine epsilons (relative, independently per element; Monte Carlo arithmetic): the largest
/// distance from `want` over [`PERTURBED_RUNS`] runs — infinite where a perturbed run gives a non-finite value
/// that `want` does not have, or fails. A well-conditioned element moves by about its own rounding; one computed
/// by cancellation moves by the amplified rounding, which is what a compiled kernel that rounds differently may
/// legitimately differ by.
pub fn rounding_spread(graph: &Graph, inputs: &BTreeMap<String, Tensor>, want: &[(String, Tensor)]) -> Vec<Vec<f64>> {
    let wants: Vec<Vec<f64>> = want.iter().map(|(_, t)| t.to_f64_vec()).collect();
    let mut spread: Vec<Vec<f64>> = wants.iter().map(|w| vec![0.0; w.len()]).collect();
    for run in 0..PERTURBED_RUNS {
        let mut rng = SplitMix64::new(0x0005_eed0_fa11 ^ run);
        let mut perturb = move |t: &Tensor| -> Tensor {
            if !t.dtype().is_float() {
                return t.clone();
            }
            let size = PERTURBATION * t.dtype().epsilon().unwrap_or(0.0);
            let moved = t.to_f64_vec().into_iter().map(|x| x * (1.0 + size * (2.0 * rng.unit() - 1.0)));
            Tensor::new(t.shape().to_vec(), kiln_ir::Data::from_f64_iter(t.dtype(), moved))
                .expect("the same shape and dtype")
        };
        // Inputs and weights too: an op's own rounding of exact operands counts as much as its operands'.
        let inputs: BTreeMap<String, Tensor> = inputs.iter().map(|(n, t)| (n.clone(), perturb(t))).collect();
        let mut graph = graph.clone();
        let weights: Vec<(String, Tensor)> = graph.weights.iter().map(|(n, t)| (n.to_string(), perturb(t))).collect();
        for (name, t) in weights {
            graph.weights.insert(name, t);
        }
        let mut observe = |_: kiln_ir::NodeId, results: &mut [Tensor]| {
            for t in results.iter_mut() {
                *t = perturb(t);
            }
        };
        let got =
            std::panic::catch_unwind(AssertUnwindSafe(|| kiln_ir::interp::run_observed(&graph, &inputs, &mut observe)));
        for (k, w) in wants.iter().enumerate() {
            let got = match &got {
                Ok(Ok(outs)) => outs.get(k).map(|(_, t)| t.to_f64_vec()),
                _ => None,
            };
            for (j, &b) in w.iter().enumerate() {
                let moved = match got.as_ref().and_then(|g| g.get(j)) {
                    Some(&a) if a.is_finite() && b.is_finite() => (a - b).abs(),
                    Some(&a) if a == b || (a.is_nan() && b.is_nan()) => 0.0,
                    _ => f64::INFINITY,
                };
                spread[k][j] = spread[k][j].max(moved);
            }
        }
    }
    spread
}

/// `got` within `ATOL + RTOL * |want| + SPREAD * spread` of `want`, element by element (floats; NaN matches NaN).
fn compare_within(got: &Tensor, want: &Tensor, spread: Option<&[f64]>) -> Result<(), String> {
    crate::conformance::compare(got, want, RTOL, ATOL).or_else(|e| {
        let (Some(spread), true) = (spread, want.dtype().is_float()) else { return Err(e) };
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        for (i, ((&a, &b), &s)) in g.iter().zip(&w).zip(spread).enumerate() {
            // An infinite spread says a perturbed run went non-finite (or failed): a non-finite result is then
            // acceptable, a finite one still has to be close.
            let allowance = if s.is_finite() { SPREAD * s } else { 0.0 };
            let ok = (a.is_nan() && b.is_nan())
                || a == b
                || (s.is_infinite() && !a.is_finite())
                || (a - b).abs() <= ATOL + RTOL * b.abs() + allowance;
            if !ok {
                return Err(format!(
                    "element {i} is {a} but expected {b} (rtol {RTOL}, atol {ATOL}, rounding spread {s:e} × {SPREAD})"
                ));
            }
        }
        Ok(())
    })
}

/// Runs `f`, turning a panic into an error naming `who`.
fn guarded<T>(who: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
        format!("{who} panicked: {}", msg.unwrap_or_default())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spread_of(text: &str, inputs: &[(&str, Vec<usize>, Vec<f32>)]) -> (Vec<f64>, Vec<f64>) {
        let graph = kiln_ir::parse(text).expect("valid .kir");
        let inputs: BTreeMap<String, Tensor> = inputs
            .iter()
            .map(|(n, shape, v)| (n.to_string(), Tensor::from_vec(shape.clone(), v.clone()).expect("shape")))
            .collect();
        let want = kiln_ir::interp::run(&graph, &inputs).expect("runs");
        let spread = rounding_spread(&graph, &inputs, &want);
        (want[0].1.to_f64_vec(), spread[0].clone())
    }

    #[test]
    fn well_conditioned_results_get_about_their_own_rounding() {
        let (want, spread) = spread_of(
            "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[4]\n  %1 = exp %0 : f32[4]\n  %2 = add %1, %0 : f32[4]\n  \
             output \"y\" = %2\n}\n",
            &[("x", vec![4], vec![0.5, -1.0, 2.0, 3.0])],
        );
        for (w, s) in want.iter().zip(&spread) {
            assert!(*s <= 8.0 * f64::from(f32::EPSILON) * w.abs(), "spread {s} of {w}");
        }
        // A wrong answer stays wrong.
        let got = Tensor::from_vec(vec![4], want.iter().map(|&w| (w * 1.001) as f32).collect()).expect("shape");
        let want = Tensor::from_vec(vec![4], want.iter().map(|&w| w as f32).collect()).expect("shape");
        assert!(compare_within(&got, &want, Some(&spread)).is_err());
    }

    #[test]
    fn cancellation_gets_its_amplified_rounding() {
        // The layer norm of nearly equal values is its rounding noise times 1/sqrt(epsilon).
        let (_, spread) = spread_of(
            "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[8]\n  %1 = input {name=\"s\"} : f32[]\n  \
             %2 = layer_norm %0, %1 {axis=0, epsilon=1e-5} : f32[8]\n  output \"y\" = %2\n}\n",
            &[("x", vec![8], vec![3.3; 8]), ("s", vec![], vec![1.0])],
        );
        assert!(spread.iter().any(|&s| s > 1e-5), "spread {spread:?}");
    }
}
