//! Host emulation of the NVPTX emitter's kernels: the same LLVM IR the PTX comes from ([`super::emit`] with
//! the host flavor: address space 0, and each special-register read — `tid.x`, `ctaid.x`, `ntid.x`,
//! `nctaid.x` — a call of a host function), optimized by the same pipeline, JIT-compiled for the host by LLVM's
//! MCJIT, and run over an emulated grid: the blocks in turn, and within a block its threads in turn, each to
//! completion. That order is exact for today's kernels, which use no barriers, shared memory or warp shuffles
//! (threads only ever write disjoint elements); a block-cooperative reduction would need the threads of a block
//! run phase by phase between barriers instead.
//!
//! This is how the GPU code path is checked against the reference evaluator on a machine without a GPU: the
//! grid mapping, index arithmetic, the math and every element semantic are the ones the PTX carries; only
//! instruction selection differs.

use std::cell::Cell;

use inkwell::OptimizationLevel;
use inkwell::context::Context;
use inkwell::execution_engine::ExecutionEngine;
use inkwell::targets::{CodeModel, InitializationConfig, RelocMode, Target, TargetMachine};

use super::emit::{self, EMU_WRAPPER_PREFIX, Flavor, Sreg};
use super::{PtxError, PtxKernelInfo};
use crate::kernel::Kernel;

/// An emulated launch geometry.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Blocks (`gridDim.x`).
    pub blocks: u32,
    /// Threads per block (`blockDim.x`).
    pub threads: u32,
}

thread_local! {
    /// The emulated thread's special registers, in [`Sreg::ALL`] order.
    static SREGS: Cell<[u32; 4]> = const { Cell::new([0; 4]) };
}

extern "C" fn tid_x() -> u32 {
    SREGS.with(|s| s.get()[0])
}
extern "C" fn ctaid_x() -> u32 {
    SREGS.with(|s| s.get()[1])
}
extern "C" fn ntid_x() -> u32 {
    SREGS.with(|s| s.get()[2])
}
extern "C" fn nctaid_x() -> u32 {
    SREGS.with(|s| s.get()[3])
}

/// The host function standing in for `r`.
fn host_function(r: Sreg) -> extern "C" fn() -> u32 {
    match r {
        Sreg::Tid => tid_x,
        Sreg::Ctaid => ctaid_x,
        Sreg::Ntid => ntid_x,
        Sreg::Nctaid => nctaid_x,
    }
}

/// The signature of a kernel's host wrapper: one pointer per launch buffer, one i64 per symbol.
type Wrapper = unsafe extern "C" fn(*const *mut u8, *const i64);

/// Kernels JIT-compiled for emulation, ready to launch over emulated grids.
pub struct EmulatedModule<'ctx> {
    _engine: ExecutionEngine<'ctx>,
    wrappers: Vec<Wrapper>,
    infos: Vec<PtxKernelInfo>,
}

/// Builds the host-flavored module of `kernels` (block size `block_size` recorded in their infos), JIT-compiles
/// it and hands it to `f`.
pub fn with_emulated<T>(
    kernels: &[Kernel],
    block_size: u32,
    f: impl FnOnce(&EmulatedModule<'_>) -> T,
) -> Result<T, PtxError> {
    Target::initialize_native(&InitializationConfig::default()).map_err(PtxError::Llvm)?;
    let triple = TargetMachine::get_default_triple();
    let target = Target::from_triple(&triple).map_err(|e| PtxError::Llvm(e.to_string()))?;
    let cpu = TargetMachine::get_host_cpu_name().to_string();
    let features = TargetMachine::get_host_cpu_features().to_string();
    let machine = target
        .create_target_machine(
            &triple,
            &cpu,
            &features,
            OptimizationLevel::Default,
            RelocMode::Default,
            CodeModel::JITDefault,
        )
        .ok_or_else(|| PtxError::Llvm("no target machine for the host".into()))?;
    let ctx = Context::create();
    let (module, infos) = emit::build_module(&ctx, kernels, Flavor::Host, block_size)?;
    module.set_triple(&triple);
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    super::optimize(&module, &machine)?;
    let engine =
        module.create_jit_execution_engine(OptimizationLevel::Default).map_err(|e| PtxError::Llvm(e.to_string()))?;
    for r in Sreg::ALL {
        // The optimizer drops the declaration of a register no kernel reads.
        if let Some(f) = module.get_function(r.host_function()) {
            engine.add_global_mapping(&f, host_function(r) as usize);
        }
    }
    let mut wrappers = Vec::new();
    for info in &infos {
        let name = format!("{EMU_WRAPPER_PREFIX}{}", info.entry);
        let addr = engine.get_function_address(&name).map_err(|e| PtxError::Llvm(format!("{name}: {e}")))?;
        // SAFETY: `name` is the host wrapper `emit` built with exactly the `Wrapper` signature.
        wrappers.push(unsafe { std::mem::transmute::<usize, Wrapper>(addr) });
    }
    let m = EmulatedModule { _engine: engine, wrappers, infos };
    Ok(f(&m))
}

impl EmulatedModule<'_> {
    /// The launch description of kernel `index`.
    pub fn info(&self, index: usize) -> &PtxKernelInfo {
        &self.infos[index]
    }

    /// Runs kernel `index` over `grid`: blocks in turn, the threads of each block in turn.
    ///
    /// # Safety
    /// `buffers` must hold one pointer per launch argument of the kernel, each valid for its whole buffer (read
    /// for inputs, written for outputs) at the shape `symbols` give, and `symbols` one value per kernel symbol.
    pub unsafe fn launch(&self, index: usize, buffers: &[*mut u8], symbols: &[i64], grid: Grid) {
        let f = self.wrappers[index];
        for block in 0..grid.blocks {
            for thread in 0..grid.threads {
                SREGS.with(|s| s.set([thread, block, grid.threads, grid.blocks]));
                // SAFETY: the caller guarantees the buffers and symbols the kernel reads and writes.
                unsafe { f(buffers.as_ptr(), symbols.as_ptr()) };
            }
        }
    }
}
