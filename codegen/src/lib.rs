//! `kiln-codegen`: lowering of fusion groups to the target-independent kernel IR, the Cranelift CPU emitter, the
//! NVPTX emitter (feature `ptx`, which needs LLVM 19), and the executables backends run.
//!
//! [`kernel`] is the loop-level kernel IR both emitters translate (and nothing else), its text dump, its
//! reference evaluator, and the lowering of a fusion group of graph nodes — elementwise ops, constants, iota,
//! data movement, reductions, softmax, layer/batch norm and gelu — to one kernel. Matmul, convolution, pooling,
//! gather/scatter, resize and the recurrent ops are not lowered here; they become library calls or kernels of
//! their own, and a group holding one is a [`kernel::LowerError::Unsupported`].
//!
//! [`cpu`] compiles kernels with Cranelift: JIT-compiled into memory, or as ELF object code a runtime links into
//! a shared library, with a per-kernel description of its independently launchable parts.
//!
//! `ptx` (feature `ptx`) compiles the same kernels through LLVM's NVPTX backend to PTX text for `sm_80`/`sm_90`,
//! and emulates that code on the host (the same LLVM IR JIT-compiled for the CPU) to test it without a GPU.
//!
//! [`library`] holds the native CPU implementations of what does not become kernel IR: the roots of `library`
//! fusion groups (`matmul`, `conv`, with their elementwise epilogue as a callback) and `pool`.
//!
//! [`exec`] is the [`exec::Executable`]: a compiled graph's steps and buffers, built from an optimized graph.

mod approx;
pub mod cpu;
pub mod device;
pub mod exec;
pub mod kernel;
pub mod library;
#[cfg(feature = "ptx")]
pub mod ptx;

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
    /// The NVPTX emitter could not compile a kernel.
    #[cfg(feature = "ptx")]
    #[error(transparent)]
    Ptx(#[from] ptx::PtxError),
}
