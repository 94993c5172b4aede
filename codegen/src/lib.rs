//! `kiln-codegen`: lowering of fusion groups to the target-independent kernel IR, the Cranelift CPU emitter, and
//! (with later issues) the NVPTX emitter and the `Executable` they produce.
//!
//! [`kernel`] is the loop-level kernel IR both emitters translate (and nothing else), its text dump, its
//! reference evaluator, and the lowering of a fusion group of graph nodes — elementwise ops, constants, iota,
//! data movement, reductions, softmax, layer/batch norm and gelu — to one kernel. Matmul, convolution, pooling,
//! gather/scatter, resize and the recurrent ops are not lowered here; they become library calls or kernels of
//! their own, and a group holding one is a [`kernel::LowerError::Unsupported`].
//!
//! [`cpu`] compiles kernels with Cranelift: JIT-compiled into memory, or as ELF object code a runtime links into
//! a shared library, with a per-kernel description of its independently launchable parts.

pub mod cpu;
pub mod kernel;

pub use kiln_ir as ir;

/// Errors of the code generator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A fusion group could not be lowered to kernel IR.
    #[error(transparent)]
    Lower(#[from] kernel::LowerError),
    /// The reference evaluator could not run a kernel.
    #[error(transparent)]
    Eval(#[from] kernel::EvalError),
    /// The CPU emitter could not compile a kernel.
    #[error(transparent)]
    Cpu(#[from] cpu::CpuError),
}
