//! Placement: which backend of the registry runs each node of a compiled model, and running the steps that the
//! placement put on a backend other than the compiled code.
//!
//! The rule is the registry's own ([`BackendRegistry::select`]): a node goes to the highest-priority backend
//! whose declared capabilities cover it, ties to the name that sorts first. The compiled targets (`cpu`, and
//! `cuda` where a device is registered) and the reference backend are entries of the registry like any plugin;
//! a node whose best backend is one of those [built-in](is_builtin) entries is compiled into the model's code,
//! and a node whose best backend is another one (a plugin) becomes a `Step::Backend` that this module runs:
//! the runtime copies the operands out of the program's buffers, calls the backend, checks every result's dtype
//! and shape against the program's declaration, and copies it back. [`for_ops`] computes the rule
//! per op kind for the compiler ([`for_ops`]), which keeps placed ops out of fusion groups.

use std::collections::{BTreeMap, HashMap};

pub use kiln_plan::exec::Placement;
use std::sync::Arc;

use kiln_ir::{DType, Op, Tensor};

use crate::RunError;
use crate::contract::{Backend, Node};
use crate::registry::{BackendRegistry, COMPILED_CPU_BACKEND, REFERENCE_BACKEND};

/// Whether `name` is a backend kiln registers itself for compiled code or reference runs: the compiled CPU code
/// (`cpu`), a CUDA device (`cuda`), the reference interpreter. Nodes these win are compiled into the model.
pub fn is_builtin(name: &str) -> bool {
    name == COMPILED_CPU_BACKEND || name == REFERENCE_BACKEND || name == crate::cuda::CUDA_BACKEND
}

/// The placement of every op kind kiln has by `registry`'s selection rule: the op kinds whose best backend is
/// not [built in](is_builtin), with that backend. Everything else is compiled.
pub fn for_ops(registry: &BackendRegistry) -> Placement {
    let ops: BTreeMap<String, (String, i32)> = Op::mnemonics()
        .iter()
        .filter_map(|&m| {
            let (name, priority) = registry.select_kind(m)?;
            (!is_builtin(&name)).then(|| (m.to_string(), (name, priority)))
        })
        .collect();
    for (op, (backend, priority)) in &ops {
        tracing::debug!(op = %op, backend = %backend, priority, "placement: op kind taken from the compiled code");
    }
    Placement { ops }
}

/// The backends a program's `Step::Backend`s name, resolved from a registry when the program is bound.
#[derive(Clone, Default)]
pub struct PlacedBackends {
    by_name: HashMap<String, Arc<dyn Backend>>,
}

impl std::fmt::Debug for PlacedBackends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.by_name.keys()).finish()
    }
}

impl PlacedBackends {
    /// Resolves every backend in `placed` (backend name → the nodes it runs) from `registry`. A backend that is
    /// not registered is an error naming it and a node it would run, with the variable that registers plugins.
    pub fn resolve(
        placed: &BTreeMap<String, Vec<String>>,
        registry: &BackendRegistry,
    ) -> Result<PlacedBackends, RunError> {
        let mut by_name = HashMap::new();
        for (name, nodes) in placed {
            let backend = registry.get(name).ok_or_else(|| {
                RunError::Registry(format!(
                    "the program places {} node(s) ({}{}) on backend `{name}`, which is not registered (register \
                     the plugin with {})",
                    nodes.len(),
                    nodes.first().map(String::as_str).unwrap_or("?"),
                    if nodes.len() > 1 { ", …" } else { "" },
                    crate::registry::PLUGINS_ENV_VAR
                ))
            })?;
            tracing::info!(backend = %name, nodes = nodes.len(), "placement: nodes bound to a registry backend");
            by_name.insert(name.clone(), backend);
        }
        Ok(PlacedBackends { by_name })
    }

    /// Runs `op` of node `node` on `backend` (or on the reference interpreter when `None`) and checks that the
    /// results are `expected` (dtype and extents, in order). Every error names the backend and the node.
    pub fn run(
        &self,
        backend: Option<&str>,
        op: &Op,
        node: &str,
        operands: &[Tensor],
        expected: &[(DType, Option<Vec<usize>>)],
    ) -> Result<Vec<Tensor>, RunError> {
        // An op whose shape attribute is symbolic (a resize to `2*((H+1)/2)`) gets this run's extents: its result
        // shape, which is what the attribute says.
        let specialized = with_result_shape(op, expected);
        let op = specialized.as_ref();
        let (who, results) = match backend {
            None => {
                let refs: Vec<&Tensor> = operands.iter().collect();
                let results = kiln_ir::interp::eval_op(op, &refs).map_err(|e| RunError::Op(format!("{node}: {e}")))?;
                ("the interpreter".to_string(), results)
            }
            Some(name) => {
                let b = self.by_name.get(name).ok_or_else(|| {
                    RunError::Registry(format!("{node} is placed on backend `{name}`, which is not bound"))
                })?;
                let shown = format!("node `{node}` ({})", op.mnemonic());
                let r = b.run_with_cache(&Node::op(node, op.clone()), operands, None, 0).map_err(|e| {
                    // A plugin's own error already names it and the node; say each once.
                    let message = match e {
                        RunError::Plugin { message, .. } => {
                            message.strip_prefix(&format!("{shown}: ")).map(str::to_string).unwrap_or(message)
                        }
                        e => e.to_string(),
                    };
                    RunError::Placed { backend: name.to_string(), node: shown.clone(), message }
                })?;
                (format!("backend `{name}`"), r.outputs)
            }
        };
        check_results(node, &who, &results, expected)?;
        Ok(results)
    }
}

/// Checks that `results`, which `who` computed for node `node`, are `expected` (dtype and extents, in order; a
/// result of data-dependent extent, `None`, is checked against its declared type when it is bound).
pub(crate) fn check_results(
    node: &str,
    who: &str,
    results: &[Tensor],
    expected: &[(DType, Option<Vec<usize>>)],
) -> Result<(), RunError> {
    if results.len() != expected.len() {
        return Err(RunError::Op(format!(
            "{node}: {who} returned {} result(s), the program expects {}",
            results.len(),
            expected.len()
        )));
    }
    for (i, (t, (dtype, dims))) in results.iter().zip(expected).enumerate() {
        if t.dtype() != *dtype || dims.as_ref().is_some_and(|d| t.shape() != d.as_slice()) {
            let dims = dims.as_ref().map_or_else(|| "[data-dependent]".to_string(), |d| format!("{d:?}"));
            return Err(RunError::Op(format!(
                "{node}: {who} returned result {i} as {}{:?}, the program expects {dtype}{dims}",
                t.dtype(),
                t.shape()
            )));
        }
    }
    Ok(())
}

/// Where one step of a program runs, and why: a line of `kiln inspect --placement`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StepPlacement {
    /// The step's position in the run (prepare steps first, marked `prepare`).
    pub step: String,
    /// The backend that runs it.
    pub backend: String,
    /// What the step is (`kernel k3_fusion -> f32[1,128,256]`, `add `/bert/…/Add``).
    pub what: String,
    /// Why it runs there.
    pub why: String,
}

/// Explains where each step of `exe` runs, given the `registry` that placed it and the name of the compiled
/// code's backend (`cpu`, `cuda`).
pub fn explain(exe: &kiln_plan::exec::Executable, registry: &BackendRegistry, compiled_as: &str) -> Vec<StepPlacement> {
    use kiln_plan::exec::Step;
    let compiled_priority = registry.priority(compiled_as).unwrap_or_default();
    let mut out = Vec::new();
    let steps = exe.prepare.iter().map(|s| ("prepare", s)).chain(exe.steps.iter().map(|s| ("run", s)));
    for (i, (phase, s)) in steps.enumerate() {
        let step = format!("{phase} {i}");
        let (backend, why) = match s {
            Step::Backend { backend, op, .. } => {
                let priority = registry.priority(backend).map_or("?".to_string(), |p| p.to_string());
                (
                    backend.clone(),
                    format!(
                        "`{backend}` declares `{}` at priority {priority}, above the compiled code (`{compiled_as}`, \
                         priority {compiled_priority})",
                        op.mnemonic()
                    ),
                )
            }
            Step::Interp { node, .. } => {
                let reason = exe
                    .fallbacks
                    .iter()
                    .find(|f| f.node == *node && f.region.is_none())
                    .map_or("not compiled", |f| f.why.as_str());
                (compiled_as.to_string(), format!("interpreter fallback inside the compiled code: {reason}"))
            }
            Step::Region { node, .. } => {
                let within = |r: &str| r == node || r.starts_with(&format!("{node} > "));
                let inside = exe.fallbacks.iter().filter(|f| f.region.as_deref().is_some_and(within)).count();
                let why = match inside {
                    0 => "compiled: its bodies are compiled programs".to_string(),
                    n => format!("compiled: its bodies are compiled programs, with {n} interpreter fallback(s) inside"),
                };
                (compiled_as.to_string(), why)
            }
            Step::Kernel { .. } | Step::Library { .. } | Step::Routine { .. } | Step::Copy { .. } => {
                (compiled_as.to_string(), "compiled: no registered backend outranks the compiled code".to_string())
            }
        };
        out.push(StepPlacement { step, backend, what: exe.describe(s), why });
    }
    out
}

/// `op` with its symbolic dim-valued attributes ([`Op::with_result_dims`]) read off the run's result extents
/// `expected[0]`.
fn with_result_shape<'o>(op: &'o Op, expected: &[(DType, Option<Vec<usize>>)]) -> std::borrow::Cow<'o, Op> {
    use std::borrow::Cow;
    let Some((_, Some(dims))) = expected.first() else { return Cow::Borrowed(op) };
    let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    op.with_result_dims(&dims).map_or(Cow::Borrowed(op), Cow::Owned)
}
