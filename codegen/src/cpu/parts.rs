//! Splitting a kernel's top-level block into parts, the units the runtime launches.
//!
//! Each top-level `For` of kind `Parallel` or `Vectorizable` is a parallel part: the runtime may cut its
//! iteration space into `[begin, end)` chunks and run them concurrently. Every maximal run of other top-level
//! statements is one serial part (extent 1). Top-level `Let`s and `Acc`s are cheap scalar set-up, so each part
//! re-runs, in its prologue, every one that precedes it; a run made only of them stores nothing and is no part.
//! A kernel where a top-level parallel loop reads a top-level accumulator (a reduction over the whole tensor
//! whose result every element then uses) is one serial part: the value exists only after its reduction loop.

use std::collections::HashSet;

use crate::kernel::{AccVar, Block, Expr, IExpr, Kernel, LoopKind, Stmt, Var};

use super::PartInfo;

/// One part: the prologue statements it re-runs and its own statements.
pub(crate) struct Part<'k> {
    /// Top-level `Let`s and `Acc`s before the part, in order.
    pub prologue: Vec<&'k Stmt>,
    /// The part's statements: one parallel `For`, or a serial run.
    pub body: Vec<&'k Stmt>,
    /// Whether `body` is one parallel loop to be chunked.
    pub parallel: bool,
}

/// The parts of `kernel`, in top-level order.
pub(crate) fn split(kernel: &Kernel) -> Vec<Part<'_>> {
    // A top-level accumulator is folded by a top-level reduction loop and read by later statements (a reduction
    // over the whole tensor, then its normalized output): re-running its declaration in a later part would
    // read the identity, so such a kernel runs as one serial part.
    if reads_top_level_accumulator(kernel) {
        return vec![Part { prologue: Vec::new(), body: kernel.body.0.iter().collect(), parallel: false }];
    }
    let mut parts = Vec::new();
    let mut setup: Vec<&Stmt> = Vec::new();
    let mut run: Vec<&Stmt> = Vec::new();
    let mut run_setup: Vec<&Stmt> = Vec::new();
    for s in &kernel.body.0 {
        match s {
            Stmt::For { kind: LoopKind::Parallel | LoopKind::Vectorizable, .. } => {
                flush(&mut run, &mut run_setup, &mut parts);
                parts.push(Part { prologue: setup.clone(), body: vec![s], parallel: true });
            }
            _ => {
                if run.is_empty() {
                    run_setup = setup.clone();
                }
                run.push(s);
                if matches!(s, Stmt::Let { .. } | Stmt::Acc { .. }) {
                    setup.push(s);
                }
            }
        }
    }
    flush(&mut run, &mut run_setup, &mut parts);
    parts
}

/// Whether a top-level accumulator (directly or through a `Let`) is read by a top-level parallel loop, or by any
/// top-level statement after a parallel loop that follows its declaration: either way the reader would land in a
/// part of its own, whose prologue re-declares the accumulator (its identity, not its value).
fn reads_top_level_accumulator(kernel: &Kernel) -> bool {
    let mut tainted_accs = HashSet::new();
    let mut tainted_vars = HashSet::new();
    // Whether a parallel loop (a part boundary) came after some accumulator's declaration.
    let mut split_since_acc = false;
    for s in &kernel.body.0 {
        match s {
            Stmt::Acc { var, .. } => {
                tainted_accs.insert(*var);
            }
            Stmt::Let { var, value, .. } if expr_reads(value, &tainted_accs, &tainted_vars) => {
                if split_since_acc {
                    return true;
                }
                tainted_vars.insert(*var);
            }
            Stmt::Store { value, .. } if split_since_acc && expr_reads(value, &tainted_accs, &tainted_vars) => {
                return true;
            }
            Stmt::Update { value, .. } if split_since_acc && expr_reads(value, &tainted_accs, &tainted_vars) => {
                return true;
            }
            Stmt::For { kind: LoopKind::Parallel | LoopKind::Vectorizable, body, .. } => {
                if block_reads(body, &tainted_accs, &tainted_vars) {
                    return true;
                }
                split_since_acc |= !tainted_accs.is_empty();
            }
            Stmt::For { body, .. } if split_since_acc && block_reads(body, &tainted_accs, &tainted_vars) => {
                return true;
            }
            _ => {}
        }
    }
    false
}

fn block_reads(b: &Block, accs: &HashSet<AccVar>, vars: &HashSet<Var>) -> bool {
    b.0.iter().any(|s| match s {
        Stmt::For { body, .. } => block_reads(body, accs, vars),
        Stmt::Let { value, .. } | Stmt::Store { value, .. } | Stmt::Update { value, .. } => {
            expr_reads(value, accs, vars)
        }
        Stmt::Acc { .. } => false,
    })
}

fn expr_reads(e: &Expr, accs: &HashSet<AccVar>, vars: &HashSet<Var>) -> bool {
    match e {
        Expr::Acc(a) => accs.contains(a),
        Expr::Var(v) => vars.contains(v),
        Expr::Const(_) | Expr::Load { .. } | Expr::Index { .. } | Expr::Cond(_) => false,
        Expr::Unary(_, x) | Expr::Cast(x, _) => expr_reads(x, accs, vars),
        Expr::Binary(_, a, b) => expr_reads(a, accs, vars) || expr_reads(b, accs, vars),
        Expr::Select(c, a, b) => [c, a, b].iter().any(|x| expr_reads(x, accs, vars)),
    }
}

/// Closes a serial run: it becomes a part unless it only sets up scalars.
fn flush<'k>(run: &mut Vec<&'k Stmt>, run_setup: &mut Vec<&'k Stmt>, parts: &mut Vec<Part<'k>>) {
    if run.iter().any(|s| !matches!(s, Stmt::Let { .. } | Stmt::Acc { .. })) {
        parts.push(Part { prologue: std::mem::take(run_setup), body: std::mem::take(run), parallel: false });
    }
    run.clear();
    run_setup.clear();
}

/// The launch description of a part.
pub(crate) fn info(part: &Part<'_>) -> PartInfo {
    let (extent, cost) = match (part.parallel, part.body.first()) {
        (true, Some(Stmt::For { extent, body, .. })) => (extent.clone(), block_cost(body)),
        _ => (IExpr::Const(1), part.body.iter().map(|s| stmt_cost(s)).fold(0u64, u64::saturating_add)),
    };
    PartInfo { extent, parallel: part.parallel, cost_per_iteration: cost.max(1) }
}

/// Trip count assumed for a symbolic inner loop when estimating work.
const SYMBOLIC_TRIP_COUNT: u64 = 64;

fn block_cost(b: &Block) -> u64 {
    b.0.iter().map(stmt_cost).fold(0, u64::saturating_add)
}

fn stmt_cost(s: &Stmt) -> u64 {
    match s {
        Stmt::For { extent, body, .. } => {
            let n = match extent.as_const() {
                Some(c) => c.max(0) as u64,
                None => SYMBOLIC_TRIP_COUNT,
            };
            n.saturating_mul(block_cost(body))
        }
        Stmt::Store { .. } | Stmt::Update { .. } => 1,
        Stmt::Let { .. } | Stmt::Acc { .. } => 0,
    }
}
