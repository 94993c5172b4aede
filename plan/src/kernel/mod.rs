//! The target-independent loop-level kernel IR: the data both emitters translate (and nothing else), its text
//! dump, and its reference evaluator.
//!
//! - buffers ([`KernelArg`]: dense row-major, static or symbolic extents) and runtime symbols (i64 extents);
//! - a tree of loops ([`Stmt::For`]) annotated with a [`LoopKind`] — `Parallel` (threads / the grid),
//!   `Vectorizable` (innermost parallel: SIMD lanes), `Reduction` (feeds accumulators: sequential on the CPU, a
//!   cooperative block reduction on the GPU), `Serial`;
//! - SSA scalars ([`Stmt::Let`]), accumulators ([`Stmt::Acc`], [`Stmt::Update`], with [`AccOp`] identities and
//!   the interpreter's folding rules, arg-max/min included so the GPU emitter can reduce (value, index) pairs),
//!   and stores ([`Stmt::Store`]) at flat element indices;
//! - i64 index arithmetic ([`IExpr`]) apart from typed element arithmetic ([`Expr`]), which reuses `kiln_ir`'s
//!   unary/binary/cast semantics exactly; an index may read an element of an i32/i64 input ([`IExpr::Read`]:
//!   indirect indexing, as a gather needs), which the producer clamps into bounds before it addresses memory.
//!
//! Accumulators take their initial value from their op ([`AccOp::identity`]) rather than an arbitrary
//! expression, so an emitter always knows the neutral element a parallel reduction needs; large constants are
//! `Constant` buffers carried by the kernel (read-only data in the object file or PTX), so a launch passes only
//! real inputs and outputs.
//!
//! The kernel IR lives in the contract crate because the runtime reads it too: kernel launch facts are written
//! in [`IExpr`]s, and the runtime's reference executor runs kernels with [`eval()`]. Lowering, simplification
//! and the emitters are the compiler's (`kiln_codegen::kernel`).

mod eval;
mod ir;
mod print;
mod verify;

pub use eval::{EvalError, eval};
pub use ir::*;
pub use print::{expr as print_expr, iexpr as print_iexpr, print};
pub use verify::{VerifyError, verify, verify_message};

/// `floor(x / c)`, for `c != 0`.
pub fn floor_div(x: i64, c: i64) -> i64 {
    let q = x.wrapping_div(c);
    if x.wrapping_rem(c) != 0 && (x < 0) != (c < 0) { q - 1 } else { q }
}

/// `x mod c` with the divisor's sign, for `c != 0`.
pub fn floor_rem(x: i64, c: i64) -> i64 {
    let r = x.wrapping_rem(c);
    if r != 0 && (r < 0) != (c < 0) { r + c } else { r }
}
