//! `codegen::ptx`: the NVPTX emitter. It translates the kernel IR (and nothing else) to LLVM IR through inkwell
//! (LLVM 19), and LLVM's NVPTX backend turns that into PTX text for `nvptx64-nvidia-cuda`, `sm_80` or `sm_90`,
//! pinned to PTX ISA 7.8 (`+ptx78`) so CUDA 11.8's `ptxas` accepts it.
//!
//! # Kernels and launch geometry
//! Each kernel becomes one `.entry` (the `ptx_kernel` calling convention and the `nvvm.annotations` mark LLVM 19
//! reads). Its parameters are the launch buffers ([`Kernel::launch_args`], global pointers, in order), then the
//! kernel's symbols as i64 ([`PtxParam`]). `Constant` buffers become read-only globals of the module.
//!
//! The top-level block is split into parts exactly as the CPU emitter splits it (`cpu::parts`): a parallel part
//! (a top-level `Parallel`/`Vectorizable` loop) flattens its perfectly nested parallel loops (whose extents do
//! not depend on each other) into one linear index and runs it as a grid-stride loop
//! (`for i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x`); inner loops, reduction
//! loops included, stay sequential loops of one thread — unless the nest's body reduces, when it runs one row per
//! warp with shuffles (`warp`). A serial part runs on global thread 0 only, or on block 0 with all its threads
//! (shuffles, shared memory, barriers) when it reduces. Top-level
//! `Let`s and `Acc`s a part needs are re-run by every thread (they are scalar set-up). One block size, chosen
//! when compiling ([`PtxOptions::block_size`]), is recorded with the grid rule in [`PtxKernelInfo`].
//!
//! # Semantics
//! Element semantics are `kiln_ir::interp::scalar`'s, as in the CPU emitter: integer division by zero gives 0,
//! shifts by out-of-range amounts follow the interpreter, float→int casts saturate (NaN → 0), `max`/`min` are
//! IEEE 754-2019 maximum/minimum, 16-bit floats are computed in f32 and rounded after every operation (with
//! integer bit arithmetic, so no libcall and no hardware conversion is needed). No fast-math flag is ever set.
//! There is no libdevice: `exp`, `log`, `tanh`, `sigmoid` and `erf` on f32 are the polynomial approximations
//! of `codegen::approx` (the CPU emitter's vector forms), extended to the whole f32 range (specials, subnormal
//! results and arguments) by `math`; on f64, `exp`, `log`, `tanh`, `sigmoid` and `erf` use series (and a
//! continued fraction) accurate to a few ulps; `pow`, `sinh`, `cosh`, `asinh`, `acosh` and `atanh` are built from
//! `exp` and `log` (and `log1p` from `log`) on both widths; `sin`/`cos`/`tan` reduce the argument exactly (with
//! 2/π to 1160 bits) and compute in f64 (`trig`), as do `asin`/`acos`/`atan`; float `rem`/`mod` are exact
//! (`fmod`). Every unary and binary kind the interpreter defines for a dtype is implemented; one it does not
//! define (`exp` on i32, `bit_not` on f32) is a [`PtxError::Unsupported`] naming the kernel and the construct,
//! and a kernel breaking the IR's invariants a [`PtxError::Malformed`].
//!
//! # Validation without a GPU
//! [`emulate`] builds the very same LLVM IR for the host (x86-64) instead, with the special-register reads
//! (`tid`, `ctaid`, `ntid`, `nctaid`) calling host functions, JIT-compiles it with LLVM's MCJIT and runs an
//! emulated grid: blocks in turn, the threads of a block in turn, or as coroutines for a cooperative kernel.

mod emit;
pub mod emulate;
mod fmod;
mod math;
pub mod ptxas;
mod scalar;
mod trig;
mod warp;

use inkwell::OptimizationLevel;
use inkwell::context::Context;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple};

pub use crate::device::{DEFAULT_BLOCK_SIZE, MAX_BLOCKS, PtxArch, PtxKernelInfo, PtxParam};
use crate::kernel::{ArgId, Kernel};

/// The target triple PTX is generated for.
pub const PTX_TRIPLE: &str = "nvptx64-nvidia-cuda";

/// The target features: PTX ISA 7.8, the newest CUDA 11.8's `ptxas` reads.
pub const PTX_FEATURES: &str = "+ptx78";

/// How kernels are compiled to PTX.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PtxOptions {
    /// The architecture.
    pub arch: PtxArch,
    /// Threads per block every launch uses (a multiple of 32, at most 1024).
    pub block_size: u32,
}

impl Default for PtxOptions {
    fn default() -> Self {
        PtxOptions { arch: PtxArch::Sm80, block_size: DEFAULT_BLOCK_SIZE }
    }
}

/// A compiled PTX module: its text and one [`PtxKernelInfo`] per kernel, in order.
#[derive(Clone, Debug)]
pub struct PtxModule {
    /// The PTX assembly.
    pub ptx: String,
    /// How to launch each kernel.
    pub kernels: Vec<PtxKernelInfo>,
}

/// Why kernels could not be compiled to PTX (or emulated).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PtxError {
    /// The kernel uses a construct the NVPTX emitter does not implement yet.
    #[error("kernel `{kernel}`: the NVPTX emitter does not support {what} yet")]
    Unsupported {
        /// The kernel.
        kernel: String,
        /// The construct and dtype.
        what: String,
    },
    /// The kernel breaks an invariant of the kernel IR.
    #[error("kernel `{kernel}` is malformed: {what}")]
    Malformed {
        /// The kernel.
        kernel: String,
        /// What is wrong.
        what: String,
    },
    /// LLVM refused the module or failed to generate code.
    #[error("LLVM: {0}")]
    Llvm(String),
    /// Options out of range.
    #[error("invalid PTX options: {0}")]
    Options(String),
}

impl From<inkwell::builder::BuilderError> for PtxError {
    fn from(e: inkwell::builder::BuilderError) -> Self {
        PtxError::Llvm(e.to_string())
    }
}

/// Compiles `kernels` into one PTX module.
pub fn compile(kernels: &[Kernel], options: &PtxOptions) -> Result<PtxModule, PtxError> {
    check_options(options)?;
    Target::initialize_nvptx(&InitializationConfig::default());
    let triple = TargetTriple::create(PTX_TRIPLE);
    let target = Target::from_triple(&triple).map_err(|e| PtxError::Llvm(e.to_string()))?;
    let machine = target
        .create_target_machine(
            &triple,
            options.arch.name(),
            PTX_FEATURES,
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| PtxError::Llvm(format!("no target machine for {PTX_TRIPLE} {}", options.arch.name())))?;
    let ctx = Context::create();
    let (module, infos) = emit::build_module(&ctx, kernels, emit::Flavor::Nvptx, options.block_size)?;
    module.set_triple(&triple);
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    optimize(&module, &machine)?;
    let buffer =
        machine.write_to_memory_buffer(&module, FileType::Assembly).map_err(|e| PtxError::Llvm(e.to_string()))?;
    let ptx = String::from_utf8_lossy(buffer.as_slice()).trim_end_matches('\0').to_string();
    Ok(PtxModule { ptx, kernels: infos })
}

/// The textual LLVM IR of `kernels` for NVPTX, before optimization (for inspection and tests).
pub fn llvm_ir(kernels: &[Kernel], options: &PtxOptions) -> Result<String, PtxError> {
    check_options(options)?;
    let ctx = Context::create();
    let (module, _) = emit::build_module(&ctx, kernels, emit::Flavor::Nvptx, options.block_size)?;
    Ok(module.print_to_string().to_string())
}

fn check_options(options: &PtxOptions) -> Result<(), PtxError> {
    let b = options.block_size;
    if b == 0 || !b.is_multiple_of(32) || b > 1024 {
        return Err(PtxError::Options(format!("block size {b} is not a multiple of 32 in 32..=1024")));
    }
    Ok(())
}

/// Verifies `module` and runs LLVM's O2 pipeline on it (promoting accumulators to registers, hoisting index
/// arithmetic); no fast-math flag exists in the IR, so this preserves every result bit.
fn optimize(module: &inkwell::module::Module<'_>, machine: &TargetMachine) -> Result<(), PtxError> {
    module.verify().map_err(|e| PtxError::Llvm(format!("invalid module: {e}")))?;
    module.run_passes("default<O2>", machine, PassBuilderOptions::create()).map_err(|e| PtxError::Llvm(e.to_string()))
}

/// The entry name of a kernel: its name with every character outside `[A-Za-z0-9_]` replaced by `_`, prefixed
/// so it never starts with a digit, and suffixed with its position when that would collide.
fn entry_name(kernel: &str, index: usize, taken: &mut std::collections::HashSet<String>) -> String {
    let mut s: String = kernel.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert_str(0, "k_");
    }
    if !taken.insert(s.clone()) {
        s = format!("{s}_{index}");
        taken.insert(s.clone());
    }
    s
}

/// The parameters of `k`'s entry, in order.
fn params(k: &Kernel) -> Vec<PtxParam> {
    k.launch_args()
        .map(|(ArgId(arg), a)| PtxParam::Buffer { arg, name: a.name.clone(), dtype: a.dtype })
        .chain(k.symbols.iter().enumerate().map(|(index, name)| PtxParam::Symbol { index, name: name.clone() }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::IExpr;

    fn info(work: Vec<IExpr>, block_size: u32) -> PtxKernelInfo {
        PtxKernelInfo {
            entry: "k".into(),
            kernel: "k".into(),
            params: Vec::new(),
            args: Vec::new(),
            block_size,
            work,
            cooperative: false,
        }
    }

    #[test]
    fn launch_geometry_covers_the_largest_part_up_to_the_block_cap() {
        let n = IExpr::max(IExpr::Sym(0), IExpr::Const(0));
        let k = info(vec![IExpr::Const(1), IExpr::times(n, IExpr::Const(3))], 128);
        assert_eq!(k.launch_geometry(&[0]).unwrap(), (1, 128));
        assert_eq!(k.launch_geometry(&[1]).unwrap(), (1, 128));
        assert_eq!(k.launch_geometry(&[43]).unwrap(), (2, 128));
        assert_eq!(k.launch_geometry(&[1 << 30]).unwrap(), (MAX_BLOCKS, 128));
        assert!(k.launch_geometry(&[]).unwrap_err().contains("s0"));
    }

    #[test]
    fn entry_names_are_ptx_identifiers_and_distinct() {
        let mut taken = std::collections::HashSet::new();
        assert_eq!(entry_name("fused/add.relu", 0, &mut taken), "fused_add_relu");
        assert_eq!(entry_name("fused/add-relu", 1, &mut taken), "fused_add_relu_1");
        assert_eq!(entry_name("3d", 2, &mut taken), "k_3d");
        assert_eq!(entry_name("", 3, &mut taken), "k_");
    }

    #[test]
    fn block_sizes_are_whole_warps_up_to_1024() {
        for ok in [32, 96, 256, 1024] {
            assert!(check_options(&PtxOptions { block_size: ok, ..PtxOptions::default() }).is_ok());
        }
        for bad in [0, 31, 100, 2048] {
            assert!(check_options(&PtxOptions { block_size: bad, ..PtxOptions::default() }).is_err());
        }
        assert_eq!("sm_90".parse::<PtxArch>(), Ok(PtxArch::Sm90));
        assert!("sm_75".parse::<PtxArch>().unwrap_err().contains("sm_80 or sm_90"));
    }
}
