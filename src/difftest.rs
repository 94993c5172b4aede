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

/// Float outputs match when `|cpu - interp| <= ATOL + RTOL * |interp|` (or both are NaN); integers match exactly.
pub const RTOL: f64 = 1e-4;
/// See [`RTOL`].
pub const ATOL: f64 = 1e-5;

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
        for ((gn, g), (wn, w)) in got.iter().zip(want) {
            if gn != wn {
                return Err(format!("{threads} thread(s): output `{gn}` where the interpreter has `{wn}`"));
            }
            crate::conformance::compare(g, w, RTOL, ATOL)
                .map_err(|e| format!("{threads} thread(s): output `{gn}`: {e}"))?;
        }
    }
    Ok(())
}

/// Runs `f`, turning a panic into an error naming `who`.
fn guarded<T>(who: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
        format!("{who} panicked: {}", msg.unwrap_or_default())
    })
}
