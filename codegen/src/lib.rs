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
//! [`exec::build`] makes the [`exec::Executable`] — a compiled graph's steps and buffers — from an optimized
//! graph, and [`device::build_plan`] its steps for a device. The types they produce (the executable, the kernel
//! IR, launch facts, device plans) are the compiler–runtime contract in `kiln_plan`, re-exported here; the CPU
//! library the steps call (GEMM, convolution, pooling) is the runtime's (`kiln_runtime::library`).

mod approx;
pub mod cpu;
pub mod device;
pub mod exec;
pub mod kernel;
#[cfg(feature = "ptx")]
pub mod ptx;

pub use kiln_ir as ir;
pub use kiln_plan as plan;

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
