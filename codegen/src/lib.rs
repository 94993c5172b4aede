//! `kiln-codegen`: lowering of fusion groups to the target-independent kernel IR, and (with later issues) the
//! Cranelift CPU emitter, the NVPTX emitter, and the `Executable` they produce.
//!
//! What exists today is [`kernel`]: the loop-level kernel IR both emitters will translate (and nothing else),
//! its text dump, its reference evaluator, and the lowering of a fusion group of graph nodes — elementwise ops,
//! constants, iota, data movement, reductions, softmax, layer/batch norm and gelu — to one kernel. Matmul,
//! convolution, pooling, gather/scatter, resize and the recurrent ops are not lowered here; they become library
//! calls or kernels of their own, and a group holding one is a [`kernel::LowerError::Unsupported`].
//!
//! [`library`] holds the native CPU implementations of what does not become kernel IR: the roots of `library`
//! fusion groups (`matmul`, `conv`, with their elementwise epilogue as a callback) and `pool`.
//!
//! Nothing here runs on a device outside tests.

pub mod cpu;
pub mod exec;
pub mod kernel;
pub mod library;

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
    /// A graph could not become an executable.
    #[error(transparent)]
    Build(#[from] exec::BuildError),
    /// The CPU emitter could not compile a kernel.
    #[error(transparent)]
    Cpu(#[from] cpu::CpuError),
}
