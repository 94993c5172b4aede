//! The kernel IR verifier: checks every invariant the module docs of [`super::ir`] state that a program can
//! check, and reports all violations at once, each with where it is (a statement path such as
//! `for i0 / let v3`) and what is wrong.
//!
//! The compiler runs it once, after lowering (and on the builtin kernels of device plans); the emitters run
//! it at their entry points, so everything past that point works on verified kernels and does not check again.
//! A failure is a kiln bug, never a user error, and is reported as one.
//!
//! Checked: argument extents name existing symbols and constants fit their declared dtype and shape; every
//! variable (loop, `let`, accumulator) is defined once and used only where it is in scope; `let`s, stores and
//! updates carry values of their declared dtypes; binary operands agree, selects take a bool and two arms of one
//! dtype; loads read inputs and constants, stores write outputs; indirect reads ([`IExpr::Read`]) read i32/i64
//! inputs or constants and never appear in a loop extent; arg-op updates carry a position and others do not.
//! Not checked (they need the values): that indices are in bounds and that every output element is stored once.

use std::collections::{HashMap, HashSet};

use kiln_ir::DType;

use super::ir::{
    AccOp, AccVar, ArgId, ArgRole, Block, Expr, Extent, ICond, IExpr, Kernel, KernelArg, LoopVar, Stmt, Var, VarRef,
};

/// One violation: the kernel, where, and what.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("kernel `{kernel}` at {at}: {message}")]
pub struct VerifyError {
    /// The kernel's name.
    pub kernel: String,
    /// Where: `arg2`, `body`, `for i0 / let v3`, ….
    pub at: String,
    /// What is wrong.
    pub message: String,
}

/// Checks `kernel` (see the module docs); `Err` holds every violation found.
pub fn verify(kernel: &Kernel) -> Result<(), Vec<VerifyError>> {
    let mut v = Verifier {
        k: kernel,
        errors: Vec::new(),
        defined_loops: HashSet::new(),
        defined_lets: HashSet::new(),
        defined_accs: HashSet::new(),
    };
    for (i, a) in kernel.args.iter().enumerate() {
        v.arg(i, a);
    }
    let mut scope = Scope::default();
    v.block(&kernel.body, &mut scope, "body");
    if v.errors.is_empty() { Ok(()) } else { Err(v.errors) }
}

/// Every violation of `kernel` in one line, for error messages.
pub fn verify_message(kernel: &Kernel) -> Result<(), String> {
    verify(kernel)
        .map_err(|errs| errs.iter().map(|e| format!("{}: {}", e.at, e.message)).collect::<Vec<_>>().join("; "))
}

/// What is visible at a point of the body.
#[derive(Clone, Default)]
struct Scope {
    loops: HashSet<LoopVar>,
    lets: HashMap<Var, DType>,
    accs: HashMap<AccVar, (DType, AccOp)>,
}

struct Verifier<'k> {
    k: &'k Kernel,
    errors: Vec<VerifyError>,
    defined_loops: HashSet<LoopVar>,
    defined_lets: HashSet<Var>,
    defined_accs: HashSet<AccVar>,
}

impl Verifier<'_> {
    fn error(&mut self, at: &str, message: String) {
        self.errors.push(VerifyError { kernel: self.k.name.clone(), at: at.to_string(), message });
    }

    fn arg(&mut self, i: usize, a: &KernelArg) {
        let at = format!("arg{i} `{}`", a.name);
        for e in &a.shape {
            if let Extent::Sym(s) = e
                && *s >= self.k.symbols.len()
            {
                self.error(&at, format!("extent names symbol s{s}, but the kernel has {}", self.k.symbols.len()));
            }
        }
        if let ArgRole::Constant(t) = &a.role {
            let dims: Option<Vec<usize>> = a
                .shape
                .iter()
                .map(|e| if let Extent::Const(n) = e { usize::try_from(*n).ok() } else { None })
                .collect();
            if t.dtype() != a.dtype || dims.as_deref() != Some(t.shape()) {
                self.error(
                    &at,
                    format!("constant of {}{:?} declared as {} {:?}", t.dtype(), t.shape(), a.dtype, a.shape),
                );
            }
        }
    }

    fn arg_ref(&mut self, at: &str, arg: ArgId) -> Option<&KernelArg> {
        match self.k.args.get(arg.0 as usize) {
            Some(a) => Some(a),
            None => {
                self.error(at, format!("arg{} does not exist ({} args)", arg.0, self.k.args.len()));
                None
            }
        }
    }

    /// `at` ends in `/` inside a loop (the statements are named by kind there) and is `body` at the top.
    fn block(&mut self, b: &Block, scope: &mut Scope, at: &str) {
        for (i, s) in b.0.iter().enumerate() {
            let here = if at.ends_with('/') { at.to_string() } else { format!("{at}[{i}]") };
            self.stmt(s, scope, &here);
        }
    }

    fn stmt(&mut self, s: &Stmt, scope: &mut Scope, at: &str) {
        match s {
            Stmt::For { var, extent, body, .. } => {
                let at = format!("{at} for i{}", var.0);
                if has_read(extent) {
                    self.error(&at, "the extent reads a buffer (launch geometry must not depend on data)".into());
                }
                self.iexpr(extent, scope, &at);
                if !self.defined_loops.insert(*var) {
                    self.error(&at, format!("loop variable i{} is defined twice", var.0));
                }
                let mut inner = scope.clone();
                inner.loops.insert(*var);
                self.block(body, &mut inner, &format!("{at} /"));
            }
            Stmt::Let { var, dtype, value } => {
                let at = format!("{at} let v{}", var.0);
                if let Some(d) = self.expr(value, scope, &at)
                    && d != *dtype
                {
                    self.error(&at, format!("declared {dtype} but its value is {d}"));
                }
                if !self.defined_lets.insert(*var) {
                    self.error(&at, format!("v{} is defined twice", var.0));
                }
                scope.lets.insert(*var, *dtype);
            }
            Stmt::Acc { var, dtype, op } => {
                let at = format!("{at} acc a{}", var.0);
                if !self.defined_accs.insert(*var) {
                    self.error(&at, format!("a{} is declared twice", var.0));
                }
                scope.accs.insert(*var, (*dtype, *op));
            }
            Stmt::Update { acc, value, position } => {
                let at = format!("{at} update a{}", acc.0);
                let slot = scope.accs.get(acc).copied();
                let d = self.expr(value, scope, &at);
                match slot {
                    None => self.error(&at, format!("accumulator a{} is not declared here", acc.0)),
                    Some((dtype, op)) => {
                        if let Some(d) = d
                            && d != dtype
                        {
                            self.error(&at, format!("updates with {d} an accumulator of {dtype}"));
                        }
                        if op.is_arg() != position.is_some() {
                            let want = if op.is_arg() { "needs" } else { "takes no" };
                            self.error(&at, format!("{op:?} {want} a position"));
                        }
                    }
                }
                if let Some(p) = position {
                    self.iexpr(p, scope, &at);
                }
            }
            Stmt::Store { arg, index, value } => {
                let at = format!("{at} store arg{}", arg.0);
                self.iexpr(index, scope, &at);
                let d = self.expr(value, scope, &at);
                let Some(a) = self.arg_ref(&at, *arg) else { return };
                let (role_ok, ad, name) = (a.role == ArgRole::Output, a.dtype, a.name.clone());
                if !role_ok {
                    self.error(&at, format!("stores into `{name}`, which is not an output"));
                }
                if let Some(d) = d
                    && d != ad
                {
                    self.error(&at, format!("stores {d} into `{name}` of {ad}"));
                }
            }
        }
    }

    fn icond(&mut self, c: &ICond, scope: &Scope, at: &str) {
        self.iexpr(&c.lhs, scope, at);
        self.iexpr(&c.rhs, scope, at);
    }

    fn iexpr(&mut self, e: &IExpr, scope: &Scope, at: &str) {
        for c in e.children() {
            self.iexpr(c, scope, at);
        }
        match e {
            IExpr::Var(v) if !scope.loops.contains(v) => {
                self.error(at, format!("loop variable i{} is not bound here", v.0));
            }
            IExpr::Sym(s) if *s >= self.k.symbols.len() => {
                self.error(at, format!("symbol s{s} does not exist ({} symbols)", self.k.symbols.len()));
            }
            IExpr::Read { arg, .. } => {
                if let Some(a) = self.arg_ref(at, *arg) {
                    let readable = matches!(a.role, ArgRole::Input | ArgRole::Constant(_));
                    let (dtype, name) = (a.dtype, a.name.clone());
                    if !readable || !matches!(dtype, DType::I32 | DType::I64) {
                        self.error(
                            at,
                            format!("index read from `{name}` ({dtype}): needs an i32/i64 input or constant"),
                        );
                    }
                }
            }
            _ => {}
        }
    }

    /// The expression's dtype, or `None` where a violation leaves it unknown.
    fn expr(&mut self, e: &Expr, scope: &Scope, at: &str) -> Option<DType> {
        match e {
            Expr::Const(s) => Some(s.dtype()),
            Expr::Load { arg, index } => {
                self.iexpr(index, scope, at);
                let a = self.arg_ref(at, *arg)?;
                let (dtype, name, output) = (a.dtype, a.name.clone(), a.role == ArgRole::Output);
                if output {
                    self.error(at, format!("loads from `{name}`, an output (kernels never read their outputs)"));
                }
                Some(dtype)
            }
            Expr::Var(v) => {
                let d = scope.lets.get(v).copied();
                if d.is_none() {
                    self.error(at, format!("v{} is not defined here", v.0));
                }
                d
            }
            Expr::Acc(a) => match scope.accs.get(a) {
                Some((d, op)) => Some(if op.is_arg() { DType::I64 } else { *d }),
                None => {
                    self.error(at, format!("accumulator a{} is not declared here", a.0));
                    None
                }
            },
            Expr::Index { value, dtype } => {
                self.iexpr(value, scope, at);
                Some(*dtype)
            }
            Expr::Cond(c) => {
                self.icond(c, scope, at);
                Some(DType::Bool)
            }
            Expr::Unary(..) | Expr::Binary(..) | Expr::Select(..) | Expr::Cast(..) => {
                // Operands first (every violation is reported), then this node's own rule.
                match e {
                    Expr::Unary(_, x) => {
                        self.expr(x, scope, at)?;
                    }
                    Expr::Binary(k, a, b) => {
                        let (da, db) = (self.expr(a, scope, at), self.expr(b, scope, at));
                        if let (Some(da), Some(db)) = (da, db)
                            && da != db
                        {
                            self.error(at, format!("{} on {da} and {db}", k.name()));
                            return None;
                        }
                    }
                    Expr::Select(c, a, b) => {
                        let (dc, da, db) = (self.expr(c, scope, at), self.expr(a, scope, at), self.expr(b, scope, at));
                        if let (Some(dc), Some(da), Some(db)) = (dc, da, db)
                            && (dc != DType::Bool || da != db)
                        {
                            self.error(at, format!("select on {dc}, {da} and {db}"));
                            return None;
                        }
                    }
                    Expr::Cast(x, _) => {
                        self.expr(x, scope, at)?;
                    }
                    _ => unreachable!("matched above"),
                }
                let lets = scope.lets.clone();
                let accs = scope.accs.clone();
                Some(e.dtype(self.k, &|r| match r {
                    VarRef::Let(v) => lets.get(&v).copied().unwrap_or(DType::F32),
                    VarRef::Acc(a) => {
                        accs.get(&a).map_or(DType::F32, |(d, op)| if op.is_arg() { DType::I64 } else { *d })
                    }
                }))
            }
        }
    }
}

/// Whether an index expression reads a buffer anywhere.
fn has_read(e: &IExpr) -> bool {
    matches!(e, IExpr::Read { .. }) || e.children().into_iter().any(has_read)
}

#[cfg(test)]
mod tests {
    use kiln_ir::interp::scalar::Scalar;
    use kiln_ir::op::BinaryOp;

    use super::*;
    use crate::kernel::ir::LoopKind;

    fn arg(name: &str, dtype: DType, role: ArgRole) -> KernelArg {
        KernelArg { name: name.into(), dtype, shape: vec![Extent::Const(4)], role }
    }

    fn kernel(body: Vec<Stmt>) -> Kernel {
        Kernel {
            name: "k".into(),
            args: vec![
                arg("x", DType::F32, ArgRole::Input),
                arg("y", DType::F32, ArgRole::Output),
                arg("idx", DType::I64, ArgRole::Input),
            ],
            symbols: vec![],
            body: Block(body),
        }
    }

    fn for_each(var: u32, body: Vec<Stmt>) -> Stmt {
        Stmt::For { var: LoopVar(var), extent: IExpr::Const(4), kind: LoopKind::Parallel, body: Block(body) }
    }

    fn load(arg: u32) -> Expr {
        Expr::Load { arg: ArgId(arg), index: IExpr::Var(LoopVar(0)) }
    }

    #[test]
    fn a_well_formed_kernel_verifies() {
        let k = kernel(vec![for_each(
            0,
            vec![
                Stmt::Let { var: Var(0), dtype: DType::F32, value: load(0) },
                Stmt::Store {
                    arg: ArgId(1),
                    index: IExpr::Var(LoopVar(0)),
                    value: Expr::Binary(
                        BinaryOp::Add,
                        Box::new(Expr::Var(Var(0))),
                        Box::new(Expr::Const(Scalar::F32(1.0))),
                    ),
                },
            ],
        )]);
        verify(&k).unwrap();
    }

    #[test]
    fn every_violation_is_reported_with_where_it_is() {
        let k = kernel(vec![
            // A loop variable used outside its loop, a store into an input of the wrong dtype.
            for_each(0, vec![Stmt::Let { var: Var(0), dtype: DType::I32, value: load(0) }]),
            Stmt::Store { arg: ArgId(0), index: IExpr::Var(LoopVar(0)), value: Expr::Const(Scalar::I64(1)) },
            // An undefined variable, a missing arg, a read of an f32 buffer, an extent that reads data.
            Stmt::Store { arg: ArgId(1), index: IExpr::Const(0), value: Expr::Var(Var(9)) },
            Stmt::Store { arg: ArgId(7), index: IExpr::Const(0), value: Expr::Const(Scalar::F32(0.0)) },
            Stmt::For {
                var: LoopVar(1),
                extent: IExpr::Read { arg: ArgId(0), index: Box::new(IExpr::Const(0)) },
                kind: LoopKind::Serial,
                body: Block(vec![]),
            },
            // An update without a declared accumulator; a mixed binary.
            Stmt::Update { acc: AccVar(3), value: Expr::Const(Scalar::F32(0.0)), position: None },
            Stmt::Let {
                var: Var(1),
                dtype: DType::F32,
                value: Expr::Binary(
                    BinaryOp::Mul,
                    Box::new(Expr::Const(Scalar::F32(1.0))),
                    Box::new(Expr::Const(Scalar::I64(2))),
                ),
            },
        ]);
        let errs = verify(&k).unwrap_err();
        let text: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        let all = text.join("\n");
        for needle in [
            "body[0] for i0 / let v0: declared i32 but its value is f32",
            "body[1] store arg0: loop variable i0 is not bound here",
            "stores into `x`, which is not an output",
            "stores i64 into `x` of f32",
            "body[2] store arg1: v9 is not defined here",
            "body[3] store arg7: arg7 does not exist",
            "the extent reads a buffer",
            "index read from `x` (f32)",
            "accumulator a3 is not declared here",
            "mul on f32 and i64",
        ] {
            assert!(all.contains(needle), "missing `{needle}` in:\n{all}");
        }
        assert!(text.iter().all(|t| t.starts_with("kernel `k` at ")), "{all}");
    }
}
