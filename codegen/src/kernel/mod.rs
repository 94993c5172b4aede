//! `codegen::kernel`: the target-independent loop-level kernel IR (defined in `kiln_plan::kernel`, re-exported
//! here), the lowering of fusion groups to it, and its simplifier.
//!
//! One lowering, two emitters: the Cranelift (CPU) and NVPTX (GPU) emitters translate a [`Kernel`] and nothing
//! else. The IR is therefore small and explicit:
//! - buffers ([`KernelArg`]: dense row-major, static or symbolic extents) and runtime symbols (i64 extents);
//! - a tree of loops ([`Stmt::For`]) annotated with a [`LoopKind`] — `Parallel` (threads / the grid),
//!   `Vectorizable` (innermost parallel: SIMD lanes), `Reduction` (feeds accumulators: sequential on the CPU, a
//!   cooperative block reduction on the GPU), `Serial`;
//! - SSA scalars ([`Stmt::Let`]), accumulators ([`Stmt::Acc`], [`Stmt::Update`], with [`AccOp`] identities and
//!   the interpreter's folding rules, arg-max/min included so the GPU emitter can reduce (value, index) pairs),
//!   and stores ([`Stmt::Store`]) at flat element indices;
//! - i64 index arithmetic ([`IExpr`], kept lean by [`simplify`]) apart from typed element arithmetic
//!   ([`Expr`]), which reuses `kiln_ir`'s unary/binary/cast semantics exactly; an index may read an element of
//!   an i32/i64 input ([`IExpr::Read`]: indirect indexing, as a gather needs), which the producer clamps into
//!   bounds before it addresses memory.
//!
//! Two choices differ from the first sketch of this IR, for the emitters' sake: accumulators take their
//! initial value from their op ([`AccOp::identity`]) rather than an arbitrary expression, so an emitter always
//! knows the neutral element a parallel reduction needs; and large constants are `Constant` buffers carried by
//! the kernel (read-only data in the object file or PTX), so a launch passes only real inputs and outputs.
//!
//! [`builtin`] builds the library ops' kernels (conv, pool, gather) for devices without a native library for them.
//!
//! [`lower`] turns a fusion group into a kernel (see its module for coverage and the sharing rule), [`print()`]
//! dumps one as text for snapshots, and [`eval`] runs one with the interpreter's scalar semantics — the oracle
//! lowering is tested against, and later the emitters.

pub mod builtin;
mod lower;
pub mod simplify;

// The IR itself, its printer and its evaluator are the compiler–runtime contract's (`kiln_plan::kernel`).
pub use kiln_plan::kernel::*;
// `super::ir::…` paths of the lowering modules name the contract's IR.
use kiln_plan::kernel as ir;
pub use lower::{LowerError, LowerOptions, SpacePolicy, lower, lower_mapped, lower_with};
