//! Sibling reductions in one pass: a reduction nest followed — with only accumulator declarations and lets the
//! second nest does not read between (those move before and after the merged nest) — by
//! another nest over the same iteration space (a dynamic quantization's min and max of one tensor, a mean and a
//! mean of squares) becomes one nest whose innermost body folds into both accumulators. Each accumulator sees
//! the same values in the same order as before, so results are unchanged; the operand is read in one sweep
//! instead of two.
//!
//! Merged only when both nests are pure reductions (no stores), have equal extents and loop kinds at every
//! level, and the second does not read an accumulator the first folds into.

use std::collections::{HashMap, HashSet};

use crate::kernel::{AccVar, Block, Expr, ICond, IExpr, LoopVar, Stmt, Var};

/// Fuses sibling reduction nests throughout `block` (see the module docs).
pub(super) fn fuse(block: &mut Block) {
    for s in &mut block.0 {
        if let Stmt::For { body, .. } = s {
            fuse(body);
        }
    }
    let mut i = 0;
    while i < block.0.len() {
        // The next nest after `i`, past accumulator declarations and lets only.
        let mut j = i + 1;
        while j < block.0.len() && matches!(block.0[j], Stmt::Acc { .. } | Stmt::Let { .. }) {
            j += 1;
        }
        // Lets between move after the merged nest: only when the second nest does not read them.
        let between_lets: HashSet<Var> = block.0[i + 1..j.min(block.0.len())]
            .iter()
            .filter_map(|s| if let Stmt::Let { var, .. } = s { Some(*var) } else { None })
            .collect();
        let movable = j < block.0.len() && !reads_vars(&block.0[j], &between_lets);
        if movable && let Some(merged) = merge(&block.0[i], &block.0[j], &mut HashMap::new()) {
            let between: Vec<Stmt> = block.0.drain(i + 1..j).collect();
            block.0.remove(i + 1); // the second nest, now right after the first
            let (decls, lets): (Vec<Stmt>, Vec<Stmt>) =
                between.into_iter().partition(|s| matches!(s, Stmt::Acc { .. }));
            block.0[i] = merged;
            for (k, l) in lets.into_iter().enumerate() {
                block.0.insert(i + 1 + k, l);
            }
            for (k, d) in decls.into_iter().enumerate() {
                block.0.insert(i + k, d);
            }
            // The merged nest may take the next sibling too.
            continue;
        }
        i += 1;
    }
}

/// Whether `s` reads any of `vars`.
fn reads_vars(s: &Stmt, vars: &HashSet<Var>) -> bool {
    fn expr(e: &Expr, vars: &HashSet<Var>) -> bool {
        match e {
            Expr::Var(v) => vars.contains(v),
            Expr::Const(_) | Expr::Load { .. } | Expr::Acc(_) | Expr::Index { .. } | Expr::Cond(_) => false,
            Expr::Unary(_, x) | Expr::Cast(x, _) => expr(x, vars),
            Expr::Binary(_, x, y) => expr(x, vars) || expr(y, vars),
            Expr::Select(c, x, y) => expr(c, vars) || expr(x, vars) || expr(y, vars),
        }
    }
    match s {
        Stmt::Let { value, .. } | Stmt::Update { value, .. } | Stmt::Store { value, .. } => expr(value, vars),
        Stmt::For { body, .. } => body.0.iter().any(|s| reads_vars(s, vars)),
        Stmt::Acc { .. } => false,
    }
}

/// `a` and `b` as one nest, when they qualify; `rename` maps `b`'s loop variables to `a`'s.
fn merge(a: &Stmt, b: &Stmt, rename: &mut HashMap<LoopVar, LoopVar>) -> Option<Stmt> {
    let (Stmt::For { var: va, extent: ea, kind: ka, body: ba }, Stmt::For { var: vb, extent: eb, kind: kb, body: bb }) =
        (a, b)
    else {
        return None;
    };
    if ka != kb || *ea != rename_iexpr(eb, rename) || has_store(ba) || has_store(bb) {
        return None;
    }
    rename.insert(*vb, *va);
    let body = match (&ba.0[..], &bb.0[..]) {
        ([inner_a @ Stmt::For { .. }], [inner_b @ Stmt::For { .. }]) => Block(vec![merge(inner_a, inner_b, rename)?]),
        _ => {
            // Innermost: the second body must not read what the first folds into.
            let folded: HashSet<AccVar> = updates(ba);
            if reads_any(bb, &folded) {
                return None;
            }
            let mut stmts = ba.0.clone();
            stmts.extend(bb.0.iter().map(|s| rename_stmt(s, rename)));
            Block(stmts)
        }
    };
    Some(Stmt::For { var: *va, extent: ea.clone(), kind: *ka, body })
}

fn has_store(b: &Block) -> bool {
    b.0.iter().any(|s| match s {
        Stmt::Store { .. } => true,
        Stmt::For { body, .. } => has_store(body),
        _ => false,
    })
}

fn updates(b: &Block) -> HashSet<AccVar> {
    let mut out = HashSet::new();
    for s in &b.0 {
        match s {
            Stmt::Update { acc, .. } => {
                out.insert(*acc);
            }
            Stmt::For { body, .. } => out.extend(updates(body)),
            _ => {}
        }
    }
    out
}

fn reads_any(b: &Block, accs: &HashSet<AccVar>) -> bool {
    fn expr(e: &Expr, accs: &HashSet<AccVar>) -> bool {
        match e {
            Expr::Acc(a) => accs.contains(a),
            Expr::Const(_) | Expr::Load { .. } | Expr::Var(_) | Expr::Index { .. } | Expr::Cond(_) => false,
            Expr::Unary(_, x) | Expr::Cast(x, _) => expr(x, accs),
            Expr::Binary(_, x, y) => expr(x, accs) || expr(y, accs),
            Expr::Select(c, x, y) => expr(c, accs) || expr(x, accs) || expr(y, accs),
        }
    }
    b.0.iter().any(|s| match s {
        Stmt::Let { value, .. } | Stmt::Update { value, .. } | Stmt::Store { value, .. } => expr(value, accs),
        Stmt::For { body, .. } => reads_any(body, accs),
        Stmt::Acc { .. } => false,
    })
}

fn rename_iexpr(e: &IExpr, m: &HashMap<LoopVar, LoopVar>) -> IExpr {
    let r = |x: &IExpr| Box::new(rename_iexpr(x, m));
    match e {
        IExpr::Var(v) => IExpr::Var(*m.get(v).unwrap_or(v)),
        IExpr::Const(_) | IExpr::Sym(_) => e.clone(),
        IExpr::Add(a, b) => IExpr::Add(r(a), r(b)),
        IExpr::Sub(a, b) => IExpr::Sub(r(a), r(b)),
        IExpr::Mul(a, b) => IExpr::Mul(r(a), r(b)),
        IExpr::FloorDiv(a, b) => IExpr::FloorDiv(r(a), r(b)),
        IExpr::Rem(a, b) => IExpr::Rem(r(a), r(b)),
        IExpr::Min(a, b) => IExpr::Min(r(a), r(b)),
        IExpr::Max(a, b) => IExpr::Max(r(a), r(b)),
        IExpr::Select(c, a, b) => IExpr::Select(Box::new(rename_cond(c, m)), r(a), r(b)),
        IExpr::Read { arg, index } => IExpr::Read { arg: *arg, index: r(index) },
    }
}

fn rename_cond(c: &ICond, m: &HashMap<LoopVar, LoopVar>) -> ICond {
    ICond { op: c.op, lhs: rename_iexpr(&c.lhs, m), rhs: rename_iexpr(&c.rhs, m) }
}

fn rename_expr(e: &Expr, m: &HashMap<LoopVar, LoopVar>) -> Expr {
    let r = |x: &Expr| Box::new(rename_expr(x, m));
    match e {
        Expr::Const(_) | Expr::Var(_) | Expr::Acc(_) => e.clone(),
        Expr::Load { arg, index } => Expr::Load { arg: *arg, index: rename_iexpr(index, m) },
        Expr::Index { value, dtype } => Expr::Index { value: rename_iexpr(value, m), dtype: *dtype },
        Expr::Cond(c) => Expr::Cond(Box::new(rename_cond(c, m))),
        Expr::Unary(k, x) => Expr::Unary(*k, r(x)),
        Expr::Binary(k, x, y) => Expr::Binary(*k, r(x), r(y)),
        Expr::Select(c, x, y) => Expr::Select(r(c), r(x), r(y)),
        Expr::Cast(x, d) => Expr::Cast(r(x), *d),
    }
}

fn rename_stmt(s: &Stmt, m: &HashMap<LoopVar, LoopVar>) -> Stmt {
    match s {
        Stmt::For { var, extent, kind, body } => Stmt::For {
            var: *var,
            extent: rename_iexpr(extent, m),
            kind: *kind,
            body: Block(body.0.iter().map(|s| rename_stmt(s, m)).collect()),
        },
        Stmt::Let { var, dtype, value } => Stmt::Let { var: *var, dtype: *dtype, value: rename_expr(value, m) },
        Stmt::Acc { .. } => s.clone(),
        Stmt::Update { acc, value, position } => Stmt::Update {
            acc: *acc,
            value: rename_expr(value, m),
            position: position.as_ref().map(|p| rename_iexpr(p, m)),
        },
        Stmt::Store { arg, index, value } => {
            Stmt::Store { arg: *arg, index: rename_iexpr(index, m), value: rename_expr(value, m) }
        }
    }
}
