//! The readable text dump of a kernel, used in snapshot tests and debug output.
//!
//! The format is for people, not for parsing back: a header line, one line per symbol and buffer, then the
//! loop tree with two-space indentation. Loop variables print as `i<n>`, `Let` variables as `v<n>`,
//! accumulators as `a<n>`, buffers as `arg<n>` and symbols as `s<n>`. Index arithmetic is infix: `/` is floor
//! division and `%` the remainder with the divisor's sign (both exact on the non-negative indices lowering
//! produces); an indirect index reads like a load, `arg1[i0]`. Scalar constants carry their dtype (`0.5f32`, `3i64`, `true`). Output is deterministic for a
//! given kernel, so snapshots only change when lowering does.

use std::fmt::Write;

use kiln_ir::interp::scalar::Scalar;

use super::ir::{AccOp, ArgRole, Block, CmpOp, Expr, Extent, ICond, IExpr, Kernel, LoopKind, LoopVar, Stmt};

/// Constants with at most this many elements print their values; larger ones print only their type.
const SHOWN_CONSTANT_ELEMENTS: usize = 16;

/// The kernel as text.
pub fn print(k: &Kernel) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "kernel \"{}\" {{", k.name);
    for (i, s) in k.symbols.iter().enumerate() {
        let _ = writeln!(out, "  sym s{i} = {s}");
    }
    for (i, a) in k.args.iter().enumerate() {
        let shape: Vec<String> = a.shape.iter().map(extent).collect();
        let role = match &a.role {
            ArgRole::Input => "in",
            ArgRole::Output => "out",
            ArgRole::Constant(_) => "const",
        };
        let _ = write!(out, "  arg{i} {role} \"{}\": {}[{}]", a.name, a.dtype, shape.join(","));
        if let ArgRole::Constant(t) = &a.role
            && t.len() <= SHOWN_CONSTANT_ELEMENTS
        {
            let vals: Vec<String> = (0..t.len()).map(|j| scalar_value(Scalar::read(t.data(), j))).collect();
            let _ = write!(out, " = [{}]", vals.join(", "));
        }
        out.push('\n');
    }
    block(&mut out, &k.body, 1);
    out.push_str("}\n");
    out
}

fn extent(e: &Extent) -> String {
    match e {
        Extent::Const(n) => n.to_string(),
        Extent::Sym(s) => format!("s{s}"),
    }
}

fn block(out: &mut String, b: &Block, depth: usize) {
    for s in &b.0 {
        stmt(out, s, depth);
    }
}

fn stmt(out: &mut String, s: &Stmt, depth: usize) {
    let pad = "  ".repeat(depth);
    match s {
        Stmt::For { var, extent, kind, body } => {
            let kind = match kind {
                LoopKind::Parallel => "parallel",
                LoopKind::Vectorizable => "vectorizable",
                LoopKind::Reduction => "reduction",
                LoopKind::Serial => "serial",
            };
            let _ = writeln!(out, "{pad}for {} in 0..{} {kind} {{", loop_var(*var), iexpr(extent));
            block(out, body, depth + 1);
            let _ = writeln!(out, "{pad}}}");
        }
        Stmt::Let { var, dtype, value } => {
            let _ = writeln!(out, "{pad}let v{}: {dtype} = {}", var.0, expr(value));
        }
        Stmt::Acc { var, dtype, op } => {
            let op_name = match op {
                AccOp::Sum => "sum".to_string(),
                AccOp::Prod => "prod".to_string(),
                AccOp::Max => "max".to_string(),
                AccOp::Min => "min".to_string(),
                AccOp::ArgMax { select_last } => format!("argmax{}", if *select_last { " last" } else { "" }),
                AccOp::ArgMin { select_last } => format!("argmin{}", if *select_last { " last" } else { "" }),
            };
            let _ = writeln!(out, "{pad}acc a{}: {dtype} {op_name} = {}", var.0, scalar(op.identity(*dtype)));
        }
        Stmt::Update { acc, value, position } => {
            let at = position.as_ref().map(|p| format!(" at {}", iexpr(p))).unwrap_or_default();
            let _ = writeln!(out, "{pad}a{} <- {}{at}", acc.0, expr(value));
        }
        Stmt::Store { arg, index, value } => {
            let _ = writeln!(out, "{pad}store arg{}[{}] = {}", arg.0, iexpr(index), expr(value));
        }
    }
}

fn loop_var(v: LoopVar) -> String {
    format!("i{}", v.0)
}

/// A constant with its dtype.
fn scalar(s: Scalar) -> String {
    match s {
        Scalar::Bool(b) => b.to_string(),
        _ => format!("{}{}", scalar_value(s), s.dtype()),
    }
}

/// A constant's value alone, in Rust's shortest round-trip spelling.
fn scalar_value(s: Scalar) -> String {
    match s {
        Scalar::F32(v) => format!("{v:?}"),
        Scalar::F16(v) => format!("{:?}", v.to_f32()),
        Scalar::BF16(v) => format!("{:?}", v.to_f32()),
        Scalar::F64(v) => format!("{v:?}"),
        Scalar::Bool(b) => b.to_string(),
        other => other.to_i64().to_string(),
    }
}

/// An expression, function-call style.
pub fn expr(e: &Expr) -> String {
    match e {
        Expr::Const(s) => scalar(*s),
        Expr::Load { arg, index } => format!("arg{}[{}]", arg.0, iexpr(index)),
        Expr::Var(v) => format!("v{}", v.0),
        Expr::Acc(a) => format!("a{}", a.0),
        Expr::Index { value, dtype } => format!("index.{dtype}({})", iexpr(value)),
        Expr::Cond(c) => cond(c),
        Expr::Unary(k, x) => format!("{}({})", k.name(), expr(x)),
        Expr::Binary(k, a, b) => format!("{}({}, {})", k.name(), expr(a), expr(b)),
        Expr::Select(c, a, b) => format!("select({}, {}, {})", expr(c), expr(a), expr(b)),
        Expr::Cast(x, to) => format!("cast.{to}({})", expr(x)),
    }
}

fn cond(c: &ICond) -> String {
    let op = match c.op {
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Eq => "==",
    };
    format!("{} {op} {}", iexpr(&c.lhs), iexpr(&c.rhs))
}

/// An index expression, infix with minimal parentheses.
pub fn iexpr(e: &IExpr) -> String {
    iexpr_prec(e, 0)
}

fn iexpr_prec(e: &IExpr, outer: u8) -> String {
    let (s, prec) = match e {
        IExpr::Const(c) => (c.to_string(), 3),
        IExpr::Var(v) => (loop_var(*v), 3),
        IExpr::Sym(s) => (format!("s{s}"), 3),
        IExpr::Add(a, b) => (format!("{} + {}", iexpr_prec(a, 1), iexpr_prec(b, 2)), 1),
        IExpr::Sub(a, b) => (format!("{} - {}", iexpr_prec(a, 1), iexpr_prec(b, 2)), 1),
        IExpr::Mul(a, b) => (format!("{}*{}", iexpr_prec(a, 2), iexpr_prec(b, 3)), 2),
        IExpr::FloorDiv(a, b) => (format!("{}/{}", iexpr_prec(a, 2), iexpr_prec(b, 3)), 2),
        IExpr::Rem(a, b) => (format!("{}%{}", iexpr_prec(a, 2), iexpr_prec(b, 3)), 2),
        IExpr::Min(a, b) => (format!("min({}, {})", iexpr(a), iexpr(b)), 3),
        IExpr::Max(a, b) => (format!("max({}, {})", iexpr(a), iexpr(b)), 3),
        IExpr::Select(c, a, b) => (format!("select({}, {}, {})", cond(c), iexpr(a), iexpr(b)), 3),
        IExpr::Read { arg, index } => (format!("arg{}[{}]", arg.0, iexpr(index)), 3),
    };
    if prec < outer { format!("({s})") } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::ir::ArgId;

    #[test]
    fn reads_print_like_loads_inside_index_arithmetic() {
        let i0 = IExpr::Var(LoopVar(0));
        let read = IExpr::read(ArgId(1), IExpr::plus(IExpr::times(i0.clone(), IExpr::Const(5)), IExpr::Const(2)));
        assert_eq!(iexpr(&read), "arg1[i0*5 + 2]");
        let row = IExpr::plus(IExpr::times(read.clone(), IExpr::Const(8)), i0);
        assert_eq!(iexpr(&row), "arg1[i0*5 + 2]*8 + i0");
        let wrap =
            IExpr::select(CmpOp::Lt, read.clone(), IExpr::Const(0), IExpr::plus(read.clone(), IExpr::Sym(0)), read);
        assert_eq!(iexpr(&wrap), "select(arg1[i0*5 + 2] < 0, arg1[i0*5 + 2] + s0, arg1[i0*5 + 2])");
        let load = Expr::Load { arg: ArgId(0), index: IExpr::read(ArgId(1), IExpr::Const(3)) };
        assert_eq!(expr(&load), "arg0[arg1[3]]");
    }
}
