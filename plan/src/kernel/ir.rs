//! The kernel IR's types: a kernel is a list of dense row-major buffers, runtime symbols, and a tree of loops
//! whose leaves compute typed scalars and store them.
//!
//! Invariants every producer keeps and every emitter may rely on:
//! - Index arithmetic ([`IExpr`]) is i64; element values ([`Expr`]) are typed by [`DType`] with the reference
//!   interpreter's scalar semantics (`kiln_ir::interp::scalar`).
//! - Every [`Expr::Load`] and [`Stmt::Store`] index is in bounds for every point its enclosing loops visit. Both
//!   arms of a select are always evaluated (lowering clamps the index of the arm not taken), so an emitter may
//!   compute them unconditionally, as SIMD lanes do.
//! - Variables are defined before use, once: a [`Var`] by one [`Stmt::Let`], an [`AccVar`] by one
//!   [`Stmt::Acc`], a [`LoopVar`] by one [`Stmt::For`]. A `Let` or `Acc` is visible to the statements after it in
//!   its block and everything nested there.
//! - Top-level statements of a kernel never communicate through memory: no statement reads an output buffer, so
//!   the top-level loop nests may run in any order or concurrently.
//! - Indirect indexing ([`IExpr::Read`]) reads one element of a read-only buffer (an `Input` or a `Constant`,
//!   never an output of the same kernel, so every read of one element gives one value during a launch) of dtype
//!   i32 or i64, at an index that is itself in bounds. Its value is data, so nothing bounds it: an index built
//!   from a read must be clamped into bounds by the producer before it addresses a `Load` or `Store` (the
//!   in-bounds invariant above stays the producer's job). Reads never appear in a loop extent: launch geometry
//!   (CPU parts' trip counts, the GPU grid) is computed from extents and symbols alone, without the buffers.

use std::sync::Arc;

use kiln_ir::interp::scalar::Scalar;
use kiln_ir::op::{BinaryOp, UnaryOp};
use kiln_ir::{DType, Tensor};

/// A kernel: buffers, runtime symbols and a loop body.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// A name for the emitted function and for messages.
    pub name: String,
    /// Buffers, addressed by [`ArgId`] (their position here).
    pub args: Vec<KernelArg>,
    /// Runtime i64 extents (the graph's symbolic dims), addressed by position; each is bound at launch.
    pub symbols: Vec<String>,
    /// The statements.
    pub body: Block,
}

/// A dense row-major buffer of the kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelArg {
    /// A name for messages (the graph input's or output's name where there is one).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Extents, outermost first.
    pub shape: Vec<Extent>,
    /// Whether the kernel reads it, writes it, or carries it.
    pub role: ArgRole,
}

/// How a buffer reaches the kernel.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgRole {
    /// Passed at launch, read only.
    Input,
    /// Passed at launch, written (every element exactly once per launch, by one store).
    Output,
    /// Read-only data carried by the kernel itself (a graph constant too large to inline): emitters place it in
    /// read-only memory; it is not passed at launch.
    Constant(Arc<Tensor>),
}

/// One extent of a buffer's shape.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Extent {
    /// Known when compiling.
    Const(u64),
    /// The kernel's symbol at this position.
    Sym(usize),
}

/// A buffer: an index into [`Kernel::args`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ArgId(pub u32);

/// A loop's induction variable (i64, from 0 to the extent, step 1).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct LoopVar(pub u32);

/// A scalar bound once by a [`Stmt::Let`] (SSA).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Var(pub u32);

/// An accumulator declared by a [`Stmt::Acc`] and folded into by [`Stmt::Update`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AccVar(pub u32);

/// A sequence of statements.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block(pub Vec<Stmt>);

/// What the iterations of a loop may assume about each other; emitters choose how to run it from this.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum LoopKind {
    /// Independent iterations (they write disjoint output elements and share no accumulator): may become
    /// threads on the CPU or the grid on the GPU.
    Parallel,
    /// Like `Parallel`, and innermost (its body holds no loops): a candidate for SIMD lanes.
    Vectorizable,
    /// Iterations feed accumulators declared just outside the loop (and nothing else they write is shared):
    /// sequential on the CPU; the GPU emitter may make it a cooperative block reduction. Folding happens in
    /// increasing index order; an emitter that reorders it gives up bit-exactness for floats.
    Reduction,
    /// Iterations must run in order. Not produced by lowering today; for emitters' and later passes' use.
    Serial,
}

/// One statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `for var in 0..extent { body }`.
    For {
        /// The induction variable.
        var: LoopVar,
        /// Trip count; evaluated once, before the first iteration; may be 0.
        extent: IExpr,
        /// Independence annotation.
        kind: LoopKind,
        /// The loop body.
        body: Block,
    },
    /// `let var: dtype = value` — an SSA scalar.
    Let {
        /// The variable.
        var: Var,
        /// Its type (that of `value`).
        dtype: DType,
        /// Its value.
        value: Expr,
    },
    /// Declares an accumulator holding `op`'s identity ([`AccOp::identity`]).
    Acc {
        /// The accumulator.
        var: AccVar,
        /// The type values are folded in (the accumulator reads back as this type, or i64 for arg ops).
        dtype: DType,
        /// How values fold in.
        op: AccOp,
    },
    /// Folds `value` into `acc`; arg ops also take the candidate's `position`.
    Update {
        /// The accumulator.
        acc: AccVar,
        /// The candidate value, of the accumulator's dtype.
        value: Expr,
        /// For [`AccOp::ArgMax`]/[`AccOp::ArgMin`]: the candidate's index along the reduced axis; `None` otherwise.
        position: Option<IExpr>,
    },
    /// `arg[index] = value` (flat row-major element index into an output buffer).
    Store {
        /// The buffer, whose role is [`ArgRole::Output`].
        arg: ArgId,
        /// Element index.
        index: IExpr,
        /// The value, of the buffer's dtype.
        value: Expr,
    },
}

/// How an accumulator folds values, with the interpreter's reduction semantics.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum AccOp {
    /// `acc + v` (wrapping for integers); identity 0.
    Sum,
    /// `acc * v`; identity 1.
    Prod,
    /// `max(acc, v)` (NaN propagates; `or` for bool); identity -inf, the integer minimum, or false.
    Max,
    /// `min(acc, v)` (NaN propagates; `and` for bool); identity +inf, the integer maximum, or true.
    Min,
    /// Position of the largest value: reads back as i64. NaN is the extreme value; ties keep the first
    /// position, or the last with `select_last`. Starts at (the `Max` identity, position 0).
    ArgMax {
        /// Ties go to the later position.
        select_last: bool,
    },
    /// Position of the smallest value; as `ArgMax`, starting at (the `Min` identity, position 0).
    ArgMin {
        /// Ties go to the later position.
        select_last: bool,
    },
}

impl AccOp {
    /// The value an accumulator of this op and `dtype` starts from.
    pub fn identity(self, dtype: DType) -> Scalar {
        let int_bound = |max: bool| {
            // The bound's i64 bit pattern: `from_i64` wraps, so u64's maximum arrives from -1.
            let (lo, hi) = dtype.int_range().unwrap_or((i128::from(i64::MIN), i128::from(i64::MAX)));
            Scalar::from_i64(dtype, if max { hi as i64 } else { lo as i64 })
        };
        match self {
            AccOp::Sum => Scalar::from_f64(dtype, 0.0),
            AccOp::Prod => Scalar::from_f64(dtype, 1.0),
            AccOp::Max | AccOp::ArgMax { .. } => match dtype {
                DType::Bool => Scalar::Bool(false),
                d if d.is_float() => Scalar::from_f64(d, f64::NEG_INFINITY),
                _ => int_bound(false),
            },
            AccOp::Min | AccOp::ArgMin { .. } => match dtype {
                DType::Bool => Scalar::Bool(true),
                d if d.is_float() => Scalar::from_f64(d, f64::INFINITY),
                _ => int_bound(true),
            },
        }
    }

    /// True for the arg ops, whose updates carry a position and which read back as i64.
    pub fn is_arg(self) -> bool {
        matches!(self, AccOp::ArgMax { .. } | AccOp::ArgMin { .. })
    }
}

/// A comparison of two index expressions.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum CmpOp {
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a == b`.
    Eq,
}

/// `lhs op rhs` on indices.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ICond {
    /// The comparison.
    pub op: CmpOp,
    /// Left side.
    pub lhs: IExpr,
    /// Right side.
    pub rhs: IExpr,
}

impl ICond {
    /// Whether the comparison holds, evaluated as [`IExpr::eval`] does.
    pub fn eval(&self, loops: &dyn Fn(LoopVar) -> Option<i64>, symbols: &[i64]) -> Result<bool, String> {
        self.eval_reading(loops, symbols, &no_buffers)
    }

    /// Whether the comparison holds, evaluated as [`IExpr::eval_reading`] does.
    pub fn eval_reading(
        &self,
        loops: &dyn Fn(LoopVar) -> Option<i64>,
        symbols: &[i64],
        read: BufferRead<'_>,
    ) -> Result<bool, String> {
        let (a, b) = (self.lhs.eval_reading(loops, symbols, read)?, self.rhs.eval_reading(loops, symbols, read)?);
        Ok(match self.op {
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Eq => a == b,
        })
    }
}

/// i64 index arithmetic. Wrapping on overflow; division and remainder by zero give 0 (lowering never divides by
/// a zero extent where the result is used).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum IExpr {
    /// A constant.
    Const(i64),
    /// A loop's induction variable.
    Var(LoopVar),
    /// The kernel symbol at this position.
    Sym(usize),
    /// `a + b`.
    Add(Box<IExpr>, Box<IExpr>),
    /// `a - b`.
    Sub(Box<IExpr>, Box<IExpr>),
    /// `a * b`.
    Mul(Box<IExpr>, Box<IExpr>),
    /// `floor(a / b)` (rounds toward -inf).
    FloorDiv(Box<IExpr>, Box<IExpr>),
    /// `a - b * floor(a / b)`: the remainder with the divisor's sign.
    Rem(Box<IExpr>, Box<IExpr>),
    /// The smaller.
    Min(Box<IExpr>, Box<IExpr>),
    /// The larger.
    Max(Box<IExpr>, Box<IExpr>),
    /// `cond ? a : b`.
    Select(Box<ICond>, Box<IExpr>, Box<IExpr>),
    /// Element `index` (flat row-major) of the i32 or i64 buffer `arg`, sign-extended to i64: indirect
    /// indexing (a gather's index, an embedding row). `arg` is an input or constant, `index` is in bounds, and
    /// the value is not: see the module docs for what a producer must do before using it as an address.
    Read {
        /// The buffer (an input or constant of dtype i32 or i64).
        arg: ArgId,
        /// Element index.
        index: Box<IExpr>,
    },
}

/// How [`IExpr::eval_reading`] reads a buffer element: `(arg, flat index)` to the value sign-extended to i64, or
/// `Err` for a missing buffer or an out-of-range index.
pub type BufferRead<'a> = &'a dyn Fn(ArgId, i64) -> Result<i64, String>;

/// The reader of an evaluation that has no buffers (launch geometry, symbols only).
fn no_buffers(arg: ArgId, _: i64) -> Result<i64, String> {
    Err(format!("reads arg{}, but no buffers are bound", arg.0))
}

/// A typed scalar expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// A constant of its own dtype.
    Const(Scalar),
    /// Element `index` (flat row-major) of an input or constant buffer.
    Load {
        /// The buffer.
        arg: ArgId,
        /// Element index.
        index: IExpr,
    },
    /// A `Let`-bound scalar.
    Var(Var),
    /// An accumulator's current value (the position, as i64, for arg ops).
    Acc(AccVar),
    /// An index value converted to `dtype` as `cast` converts an i64 (iota, element counts).
    Index {
        /// The index.
        value: IExpr,
        /// The result type.
        dtype: DType,
    },
    /// An index comparison, as a bool.
    Cond(Box<ICond>),
    /// An elementwise unary kind, with `kiln_ir` semantics.
    Unary(UnaryOp, Box<Expr>),
    /// An elementwise binary kind on operands of one dtype, with `kiln_ir` semantics.
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// `cond ? a : b`; both arms are evaluated.
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// Conversion with `cast` semantics.
    Cast(Box<Expr>, DType),
}

impl KernelArg {
    /// The extents of this buffer with the kernel's symbols bound to `symbols` (by position).
    pub fn dims(&self, symbols: &[i64]) -> Vec<usize> {
        self.shape
            .iter()
            .map(|e| match e {
                Extent::Const(n) => *n as usize,
                Extent::Sym(s) => symbols[*s] as usize,
            })
            .collect()
    }
}

impl Kernel {
    /// The arguments passed at launch (inputs and outputs, not constants), in order, with their ids.
    pub fn launch_args(&self) -> impl Iterator<Item = (ArgId, &KernelArg)> {
        self.args
            .iter()
            .enumerate()
            .filter(|(_, a)| !matches!(a.role, ArgRole::Constant(_)))
            .map(|(i, a)| (ArgId(i as u32), a))
    }

    /// The argument `id`.
    pub fn arg(&self, id: ArgId) -> &KernelArg {
        &self.args[id.0 as usize]
    }
}

impl Expr {
    /// The dtype of this expression; `var_dtype` gives the dtypes of `Let` variables and accumulators' results.
    pub fn dtype(&self, kernel: &Kernel, var_dtype: &dyn Fn(VarRef) -> DType) -> DType {
        match self {
            Expr::Const(s) => s.dtype(),
            Expr::Load { arg, .. } => kernel.arg(*arg).dtype,
            Expr::Var(v) => var_dtype(VarRef::Let(*v)),
            Expr::Acc(a) => var_dtype(VarRef::Acc(*a)),
            Expr::Index { dtype, .. } | Expr::Cast(_, dtype) => *dtype,
            Expr::Cond(_) => DType::Bool,
            Expr::Unary(k, x) => match k {
                UnaryOp::IsNan | UnaryOp::IsInf => DType::Bool,
                _ => x.dtype(kernel, var_dtype),
            },
            Expr::Binary(k, a, _) => {
                if k.is_comparison() {
                    DType::Bool
                } else {
                    a.dtype(kernel, var_dtype)
                }
            }
            Expr::Select(_, a, _) => a.dtype(kernel, var_dtype),
        }
    }
}

/// A reference to a scalar variable, for [`Expr::dtype`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum VarRef {
    /// A `Let` variable.
    Let(Var),
    /// An accumulator's read-back.
    Acc(AccVar),
}

impl IExpr {
    /// The index expressions directly inside this one (a select's condition sides included), for walks that
    /// treat every operand alike.
    pub fn children(&self) -> Vec<&IExpr> {
        match self {
            IExpr::Const(_) | IExpr::Var(_) | IExpr::Sym(_) => Vec::new(),
            IExpr::Read { index, .. } => vec![index],
            IExpr::Add(a, b)
            | IExpr::Sub(a, b)
            | IExpr::Mul(a, b)
            | IExpr::FloorDiv(a, b)
            | IExpr::Rem(a, b)
            | IExpr::Min(a, b)
            | IExpr::Max(a, b) => vec![a, b],
            IExpr::Select(c, a, b) => vec![&c.lhs, &c.rhs, a, b],
        }
    }
}

/// Shorthands for building index expressions.
impl IExpr {
    /// The coefficient of `var` in this index when it is affine in it (`c * var + invariant`), else `None`: 1 for
    /// a contiguous access along `var`, 0 for one that does not move with it. Emitters use it to turn neighbouring
    /// iterations' accesses into vector ones.
    pub fn stride(&self, var: LoopVar) -> Option<i64> {
        let invariant = |xs: &[&IExpr]| xs.iter().all(|x| x.stride(var) == Some(0));
        match self {
            IExpr::Const(_) | IExpr::Sym(_) => Some(0),
            IExpr::Var(v) => Some(i64::from(*v == var)),
            IExpr::Add(a, b) => Some(a.stride(var)?.wrapping_add(b.stride(var)?)),
            IExpr::Sub(a, b) => Some(a.stride(var)?.wrapping_sub(b.stride(var)?)),
            IExpr::Mul(a, b) => match (a.stride(var)?, b.stride(var)?, a.as_const(), b.as_const()) {
                (0, 0, _, _) => Some(0),
                (c, 0, _, Some(k)) | (0, c, Some(k), _) => Some(c.wrapping_mul(k)),
                _ => None,
            },
            IExpr::FloorDiv(a, b) | IExpr::Rem(a, b) | IExpr::Min(a, b) | IExpr::Max(a, b) => {
                invariant(&[a, b]).then_some(0)
            }
            IExpr::Select(c, a, b) => invariant(&[&c.lhs, &c.rhs, a, b]).then_some(0),
            // A read at an invariant index is invariant (the buffer is read-only); otherwise its value is data, so
            // an index using it is not affine.
            IExpr::Read { index, .. } => invariant(&[index]).then_some(0),
        }
    }

    /// `a + b`.
    pub fn plus(a: IExpr, b: IExpr) -> IExpr {
        IExpr::Add(Box::new(a), Box::new(b))
    }

    /// `a - b`.
    pub fn minus(a: IExpr, b: IExpr) -> IExpr {
        IExpr::Sub(Box::new(a), Box::new(b))
    }

    /// `a * b`.
    pub fn times(a: IExpr, b: IExpr) -> IExpr {
        IExpr::Mul(Box::new(a), Box::new(b))
    }

    /// `floor(a / b)`.
    pub fn floor_div(a: IExpr, b: IExpr) -> IExpr {
        IExpr::FloorDiv(Box::new(a), Box::new(b))
    }

    /// `a mod b` (the divisor's sign).
    pub fn modulo(a: IExpr, b: IExpr) -> IExpr {
        IExpr::Rem(Box::new(a), Box::new(b))
    }

    /// The smaller of the two.
    pub fn min(a: IExpr, b: IExpr) -> IExpr {
        IExpr::Min(Box::new(a), Box::new(b))
    }

    /// The larger of the two.
    pub fn max(a: IExpr, b: IExpr) -> IExpr {
        IExpr::Max(Box::new(a), Box::new(b))
    }

    /// `lhs op rhs ? a : b`.
    pub fn select(op: CmpOp, lhs: IExpr, rhs: IExpr, a: IExpr, b: IExpr) -> IExpr {
        IExpr::Select(Box::new(ICond { op, lhs, rhs }), Box::new(a), Box::new(b))
    }

    /// Element `index` of buffer `arg` as an index (see [`IExpr::Read`]).
    pub fn read(arg: ArgId, index: IExpr) -> IExpr {
        IExpr::Read { arg, index: Box::new(index) }
    }

    /// The value with loop variables from `loops` and symbols from `symbols` (wrapping arithmetic; division
    /// and remainder by zero give 0); `Err` names an unbound variable or symbol, or a [`IExpr::Read`], since no
    /// buffers are bound here (see [`IExpr::eval_reading`]).
    pub fn eval(&self, loops: &dyn Fn(LoopVar) -> Option<i64>, symbols: &[i64]) -> Result<i64, String> {
        self.eval_reading(loops, symbols, &no_buffers)
    }

    /// As [`IExpr::eval`], with buffer elements read by `read`.
    pub fn eval_reading(
        &self,
        loops: &dyn Fn(LoopVar) -> Option<i64>,
        symbols: &[i64],
        read: BufferRead<'_>,
    ) -> Result<i64, String> {
        use super::{floor_div, floor_rem};
        let ev = |e: &IExpr| e.eval_reading(loops, symbols, read);
        let bin = |a: &IExpr, b: &IExpr| -> Result<(i64, i64), String> { Ok((ev(a)?, ev(b)?)) };
        Ok(match self {
            IExpr::Const(c) => *c,
            IExpr::Var(v) => loops(*v).ok_or_else(|| format!("loop variable i{} is not bound", v.0))?,
            IExpr::Sym(s) => *symbols.get(*s).ok_or_else(|| format!("symbol s{s} is not bound"))?,
            IExpr::Add(a, b) => bin(a, b).map(|(x, y)| x.wrapping_add(y))?,
            IExpr::Sub(a, b) => bin(a, b).map(|(x, y)| x.wrapping_sub(y))?,
            IExpr::Mul(a, b) => bin(a, b).map(|(x, y)| x.wrapping_mul(y))?,
            IExpr::FloorDiv(a, b) => bin(a, b).map(|(x, y)| if y == 0 { 0 } else { floor_div(x, y) })?,
            IExpr::Rem(a, b) => bin(a, b).map(|(x, y)| if y == 0 { 0 } else { floor_rem(x, y) })?,
            IExpr::Min(a, b) => bin(a, b).map(|(x, y)| x.min(y))?,
            IExpr::Max(a, b) => bin(a, b).map(|(x, y)| x.max(y))?,
            IExpr::Select(c, a, b) => {
                if c.eval_reading(loops, symbols, read)? {
                    ev(a)?
                } else {
                    ev(b)?
                }
            }
            IExpr::Read { arg, index } => read(*arg, ev(index)?)?,
        })
    }

    /// The constant value, if this is one.
    pub fn as_const(&self) -> Option<i64> {
        match self {
            IExpr::Const(c) => Some(*c),
            _ => None,
        }
    }
}

impl Expr {
    /// `k(x)`.
    pub fn unary(k: UnaryOp, x: Expr) -> Expr {
        Expr::Unary(k, Box::new(x))
    }

    /// `k(a, b)`.
    pub fn binary(k: BinaryOp, a: Expr, b: Expr) -> Expr {
        Expr::Binary(k, Box::new(a), Box::new(b))
    }

    /// `Some(n)` when this is the f32 or f64 constant 2, 3 or 4: every emitter computes `pow(x, n)` as `n - 1`
    /// multiplications (within 2 ulp of the correctly rounded power, identical for NaN, infinities and signed
    /// zeros), the form a gelu's `x³` needs to stay in vector registers.
    pub fn small_power(&self) -> Option<u32> {
        let v = match self {
            Expr::Const(Scalar::F32(v)) => f64::from(*v),
            Expr::Const(Scalar::F64(v)) => *v,
            _ => return None,
        };
        [2.0, 3.0, 4.0].contains(&v).then_some(v as u32)
    }

    /// `cond ? a : b`.
    pub fn select(cond: Expr, a: Expr, b: Expr) -> Expr {
        Expr::Select(Box::new(cond), Box::new(a), Box::new(b))
    }

    /// `x` converted to `to` (no node when `from == to`; a constant is converted now, with `cast` semantics).
    pub fn cast(x: Expr, from: DType, to: DType) -> Expr {
        match x {
            _ if from == to => x,
            Expr::Const(s) => Expr::Const(kiln_ir::interp::scalar::cast(s, to)),
            x => Expr::Cast(Box::new(x), to),
        }
    }

    /// `value` converted to `dtype` (a constant index is converted now).
    pub fn index(value: IExpr, dtype: DType) -> Expr {
        match value {
            IExpr::Const(c) => Expr::Const(Scalar::from_i64(dtype, c)),
            value => Expr::Index { value, dtype },
        }
    }

    /// `lhs op rhs` on indices, as a bool.
    pub fn cond(op: CmpOp, lhs: IExpr, rhs: IExpr) -> Expr {
        Expr::Cond(Box::new(ICond { op, lhs, rhs }))
    }
}
