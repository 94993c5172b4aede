//! The reference evaluator: runs kernel IR directly, one scalar at a time, with the interpreter's semantics.
//!
//! [`eval`] is how lowering is tested (its results must match `kiln_ir::interp::run` on the graph) and how the
//! emitters will be tested (their results must match it on the kernel). Every scalar operation goes through
//! `kiln_ir::interp::scalar`, so an elementwise chain gives bit-identical results to the interpreter, and a
//! reduction that folds in the interpreter's order does too. Statements run in order, loops from 0 upwards.
//!
//! Nothing panics on a malformed kernel or mismatched arguments: out-of-range loads and stores, undefined
//! variables, dtype mismatches and integer division by zero are [`EvalError`]s.

use std::collections::HashMap;

use kiln_ir::interp::scalar::{self, Scalar};
use kiln_ir::op::{ArgKind, BinaryOp};
use kiln_ir::tensor::Data;
use kiln_ir::{DType, Tensor};

use super::ir::{AccOp, AccVar, ArgId, ArgRole, Block, Expr, Extent, IExpr, Kernel, LoopVar, Stmt, Var};

/// Evaluating a kernel failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernel `{kernel}`: {message}")]
pub struct EvalError {
    /// The kernel's name.
    pub kernel: String,
    /// What went wrong.
    pub message: String,
}

/// Runs `kernel` on `args` — one tensor per launch argument ([`Kernel::launch_args`]: inputs and outputs in
/// `kernel.args` order, constants skipped) — with `symbols` bound in order. Outputs are written in place; each
/// must already have its declared dtype and shape.
pub fn eval(kernel: &Kernel, args: &mut [Tensor], symbols: &[i64]) -> Result<(), EvalError> {
    let err = |message: String| EvalError { kernel: kernel.name.clone(), message };
    if symbols.len() != kernel.symbols.len() {
        return Err(err(format!("needs {} symbol value(s), got {}", kernel.symbols.len(), symbols.len())));
    }
    let launch: Vec<ArgId> = kernel.launch_args().map(|(id, _)| id).collect();
    if args.len() != launch.len() {
        return Err(err(format!("needs {} launch argument(s), got {}", launch.len(), args.len())));
    }
    for (t, &id) in args.iter().zip(&launch) {
        let a = kernel.arg(id);
        let want: Vec<i64> = a
            .shape
            .iter()
            .map(|e| match e {
                Extent::Const(n) => *n as i64,
                Extent::Sym(s) => symbols.get(*s).copied().unwrap_or(-1),
            })
            .collect();
        let got: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
        if t.dtype() != a.dtype || got != want {
            return Err(err(format!("argument `{}` should be {}{want:?}, got {}{got:?}", a.name, a.dtype, t.dtype(),)));
        }
    }
    // Work on the raw storage and put the tensors back whatever happens.
    let mut data: Vec<(Vec<usize>, Data)> =
        args.iter_mut().map(|t| std::mem::replace(t, Tensor::zeros(DType::Bool, vec![0])).into_parts()).collect();
    let mut slots: Vec<Slot> = vec![Slot::Missing; kernel.args.len()];
    for (i, &id) in launch.iter().enumerate() {
        slots[id.0 as usize] = Slot::Launch(i);
    }
    let result = {
        let mut m = Machine { kernel, symbols, slots, data: &mut data, env: Env::default() };
        m.block(&kernel.body)
    };
    for (t, (shape, d)) in args.iter_mut().zip(data) {
        *t = Tensor::new(shape, d).expect("the evaluator keeps every buffer's length");
    }
    result.map_err(err)
}

#[derive(Copy, Clone, Debug)]
enum Slot {
    Missing,
    Launch(usize),
}

/// An accumulator's state.
#[derive(Copy, Clone, Debug)]
struct AccState {
    op: AccOp,
    value: Scalar,
    position: i64,
}

#[derive(Default)]
struct Env {
    loops: HashMap<LoopVar, i64>,
    lets: HashMap<Var, Scalar>,
    accs: HashMap<AccVar, AccState>,
}

struct Machine<'a> {
    kernel: &'a Kernel,
    symbols: &'a [i64],
    slots: Vec<Slot>,
    data: &'a mut Vec<(Vec<usize>, Data)>,
    env: Env,
}

impl Machine<'_> {
    fn block(&mut self, b: &Block) -> Result<(), String> {
        for s in &b.0 {
            self.stmt(s)?;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), String> {
        match s {
            Stmt::For { var, extent, body, .. } => {
                let n = self.index(extent)?;
                for i in 0..n.max(0) {
                    self.env.loops.insert(*var, i);
                    self.block(body)?;
                }
                self.env.loops.remove(var);
            }
            Stmt::Let { var, dtype, value } => {
                let v = self.expr(value)?;
                if v.dtype() != *dtype {
                    return Err(format!("v{} is declared {dtype} but its value is {}", var.0, v.dtype()));
                }
                self.env.lets.insert(*var, v);
            }
            Stmt::Acc { var, dtype, op } => {
                self.env.accs.insert(*var, AccState { op: *op, value: op.identity(*dtype), position: 0 });
            }
            Stmt::Update { acc, value, position } => {
                let v = self.expr(value)?;
                let pos = position.as_ref().map(|p| self.index(p)).transpose()?;
                let st = *self.env.accs.get(acc).ok_or_else(|| format!("accumulator a{} is not declared", acc.0))?;
                let folded = fold(st, v, pos).map_err(|m| format!("a{}: {m}", acc.0))?;
                self.env.accs.insert(*acc, folded);
            }
            Stmt::Store { arg, index, value } => {
                let v = self.expr(value)?;
                let i = self.index(index)?;
                let a = self.kernel.args.get(arg.0 as usize).ok_or_else(|| format!("no argument arg{}", arg.0))?;
                if a.role != ArgRole::Output {
                    return Err(format!("store into `{}`, which is not an output", a.name));
                }
                let Slot::Launch(slot) = self.slots[arg.0 as usize] else {
                    return Err(format!("output `{}` has no buffer", a.name));
                };
                let data = &mut self.data[slot].1;
                let i = usize::try_from(i)
                    .ok()
                    .filter(|&i| i < data.len())
                    .ok_or_else(|| format!("store to `{}` at {i} is out of range (length {})", a.name, data.len()))?;
                v.write(data, i).map_err(|m| format!("store to `{}`: {m}", a.name))?;
            }
        }
        Ok(())
    }

    fn index(&self, e: &IExpr) -> Result<i64, String> {
        e.eval_reading(&|v| self.env.loops.get(&v).copied(), self.symbols, &|arg, i| self.read_index(arg, i))
    }

    /// Element `i` of a read-only buffer (what `what` does, for messages).
    fn element(&self, arg: ArgId, i: i64, what: &str) -> Result<Scalar, String> {
        let a = self.kernel.args.get(arg.0 as usize).ok_or_else(|| format!("no argument arg{}", arg.0))?;
        let data = match (&a.role, self.slots[arg.0 as usize]) {
            (ArgRole::Constant(t), _) => t.data(),
            (ArgRole::Input, Slot::Launch(s)) => &self.data[s].1,
            _ => return Err(format!("{what} `{}`, which is not an input or constant", a.name)),
        };
        let i = usize::try_from(i)
            .ok()
            .filter(|&i| i < data.len())
            .ok_or_else(|| format!("{what} `{}` at {i} is out of range (length {})", a.name, data.len()))?;
        Ok(Scalar::read(data, i))
    }

    /// An [`IExpr::Read`]: element `i` of an i32 or i64 buffer, sign-extended.
    fn read_index(&self, arg: ArgId, i: i64) -> Result<i64, String> {
        match self.element(arg, i, "index read from")? {
            Scalar::I32(v) => Ok(i64::from(v)),
            Scalar::I64(v) => Ok(v),
            other => Err(format!("index read from arg{} of {}, not i32 or i64", arg.0, other.dtype())),
        }
    }

    fn expr(&self, e: &Expr) -> Result<Scalar, String> {
        match e {
            Expr::Const(s) => Ok(*s),
            Expr::Load { arg, index } => self.element(*arg, self.index(index)?, "load from"),
            Expr::Var(v) => self.env.lets.get(v).copied().ok_or_else(|| format!("v{} is not defined", v.0)),
            Expr::Acc(a) => {
                let st = self.env.accs.get(a).ok_or_else(|| format!("accumulator a{} is not declared", a.0))?;
                Ok(if st.op.is_arg() { Scalar::I64(st.position) } else { st.value })
            }
            Expr::Index { value, dtype } => Ok(Scalar::from_i64(*dtype, self.index(value)?)),
            Expr::Cond(c) => {
                Ok(Scalar::Bool(c.eval_reading(&|v| self.env.loops.get(&v).copied(), self.symbols, &|arg, i| {
                    self.read_index(arg, i)
                })?))
            }
            Expr::Unary(k, x) => scalar::unary(*k, self.expr(x)?),
            Expr::Binary(k, a, b) => scalar::binary(*k, self.expr(a)?, self.expr(b)?),
            Expr::Select(c, a, b) => {
                // Both arms are evaluated, as the IR promises emitters they may be.
                let (c, a, b) = (self.expr(c)?, self.expr(a)?, self.expr(b)?);
                match c {
                    Scalar::Bool(c) => Ok(if c { a } else { b }),
                    other => Err(format!("select condition is {}, not bool", other.dtype())),
                }
            }
            Expr::Cast(x, to) => Ok(scalar::cast(self.expr(x)?, *to)),
        }
    }
}

/// Folds `v` (at `position`, for arg ops) into an accumulator.
fn fold(st: AccState, v: Scalar, position: Option<i64>) -> Result<AccState, String> {
    if v.dtype() != st.value.dtype() {
        return Err(format!("update with {} into a {} accumulator", v.dtype(), st.value.dtype()));
    }
    let logical = |k: BinaryOp| scalar::binary(k, st.value, v);
    let value = match st.op {
        AccOp::Sum => scalar::binary(BinaryOp::Add, st.value, v)?,
        AccOp::Prod => scalar::binary(BinaryOp::Mul, st.value, v)?,
        AccOp::Max if v.dtype() == DType::Bool => logical(BinaryOp::Or)?,
        AccOp::Min if v.dtype() == DType::Bool => logical(BinaryOp::And)?,
        AccOp::Max => scalar::binary(BinaryOp::Max, st.value, v)?,
        AccOp::Min => scalar::binary(BinaryOp::Min, st.value, v)?,
        AccOp::ArgMax { select_last } | AccOp::ArgMin { select_last } => {
            let kind = if matches!(st.op, AccOp::ArgMax { .. }) { ArgKind::Max } else { ArgKind::Min };
            let position = position.ok_or("an arg update needs a position")?;
            return Ok(if scalar::arg_replaces(kind, select_last, v, st.value) {
                AccState { value: v, position, ..st }
            } else {
                st
            });
        }
    };
    Ok(AccState { value, ..st })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::ir::{KernelArg, LoopKind};

    /// `y[i] = x[idx[i]]` for `i < n`, with `idx` of `index_dtype`: no clamping, so bad indices reach the loads.
    fn indirect(index_dtype: DType) -> Kernel {
        let i = IExpr::Var(LoopVar(0));
        let arg =
            |name: &str, dtype, n, role| KernelArg { name: name.into(), dtype, shape: vec![Extent::Const(n)], role };
        Kernel {
            name: "indirect".into(),
            args: vec![
                arg("x", DType::F32, 4, ArgRole::Input),
                arg("idx", index_dtype, 3, ArgRole::Input),
                arg("y", DType::F32, 3, ArgRole::Output),
            ],
            symbols: vec![],
            body: Block(vec![Stmt::For {
                var: LoopVar(0),
                extent: IExpr::Const(3),
                kind: LoopKind::Parallel,
                body: Block(vec![Stmt::Store {
                    arg: ArgId(2),
                    index: i.clone(),
                    value: Expr::Load { arg: ArgId(0), index: IExpr::read(ArgId(1), i) },
                }]),
            }]),
        }
    }

    fn run(k: &Kernel, idx: Tensor) -> Result<Vec<f64>, EvalError> {
        let x = Tensor::from_vec(vec![4], vec![10f32, 11.0, 12.0, 13.0]).unwrap();
        let mut args = vec![x, idx, Tensor::zeros(DType::F32, vec![3])];
        eval(k, &mut args, &[])?;
        Ok(args[2].to_f64_vec())
    }

    #[test]
    fn reads_index_buffers_sign_extended() {
        let idx = Tensor::from_vec(vec![3], vec![3i32, 0, 2]).unwrap();
        assert_eq!(run(&indirect(DType::I32), idx).unwrap(), [13.0, 10.0, 12.0]);
        let idx = Tensor::from_vec(vec![3], vec![1i64, 1, 3]).unwrap();
        assert_eq!(run(&indirect(DType::I64), idx).unwrap(), [11.0, 11.0, 13.0]);
        // -1 as i32 is -1 as an index (sign extension), so the load it addresses is out of range.
        let idx = Tensor::from_vec(vec![3], vec![0i32, -1, 0]).unwrap();
        let e = run(&indirect(DType::I32), idx).unwrap_err();
        assert!(e.message.contains("load from `x` at -1"), "{e}");
    }

    #[test]
    fn bad_reads_are_errors() {
        // The read's own index out of range.
        let mut k = indirect(DType::I64);
        let Stmt::For { body, .. } = &mut k.body.0[0] else { unreachable!() };
        let Stmt::Store { value: Expr::Load { index, .. }, .. } = &mut body.0[0] else { unreachable!() };
        *index = IExpr::read(ArgId(1), IExpr::Const(3));
        let e = run(&k, Tensor::from_vec(vec![3], vec![0i64, 0, 0]).unwrap()).unwrap_err();
        assert!(e.message.contains("index read from `idx` at 3 is out of range"), "{e}");
        // A float buffer, and an output.
        let e = run(&indirect(DType::F32), Tensor::from_vec(vec![3], vec![0f32; 3]).unwrap()).unwrap_err();
        assert!(e.message.contains("not i32 or i64"), "{e}");
        let mut k = indirect(DType::I64);
        let Stmt::For { body, .. } = &mut k.body.0[0] else { unreachable!() };
        let Stmt::Store { value: Expr::Load { index, .. }, .. } = &mut body.0[0] else { unreachable!() };
        *index = IExpr::read(ArgId(2), IExpr::Const(0));
        let e = run(&k, Tensor::from_vec(vec![3], vec![0i64, 0, 0]).unwrap()).unwrap_err();
        assert!(e.message.contains("not an input or constant"), "{e}");
        // No buffers bound at all (launch geometry).
        let e = IExpr::read(ArgId(0), IExpr::Const(0)).eval(&|_| None, &[]).unwrap_err();
        assert!(e.contains("no buffers"), "{e}");
    }
}
