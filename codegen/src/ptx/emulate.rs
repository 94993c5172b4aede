//! Host emulation of the NVPTX emitter's kernels: the same LLVM IR the PTX comes from (`ptx::emit` with
//! the host flavor: address space 0, and each special-register read — `tid.x`, `ctaid.x`, `ntid.x`,
//! `nctaid.x` — a call of a host function), optimized by the same pipeline, JIT-compiled for the host by LLVM's
//! MCJIT, and run over an emulated grid: the blocks in turn. Within a block, a kernel whose threads only ever
//! write disjoint elements runs its threads in turn, each to completion; a cooperative kernel
//! ([`PtxKernelInfo::cooperative`]) runs them concurrently, one OS thread each: its warp shuffles
//! (`shfl.sync.bfly`, a host function here) exchange values through a per-warp slot array between two barriers,
//! so every lane sees its partner's value of the same step, and its block barriers (`bar.sync 0`, likewise) wait
//! for every thread of the block, as on the GPU. Blocks run in turn, so the kernel's shared memory (a plain
//! global here) is the running block's.
//!
//! This is how the GPU code path is checked against the reference evaluator on a machine without a GPU: the
//! grid mapping, index arithmetic, the math and every element semantic are the ones the PTX carries; only
//! instruction selection differs.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Barrier, Mutex};

use inkwell::OptimizationLevel;
use inkwell::context::Context;
use inkwell::execution_engine::ExecutionEngine;
use inkwell::targets::{CodeModel, InitializationConfig, RelocMode, Target, TargetMachine};

use super::emit::{self, EMU_WRAPPER_PREFIX, Flavor, Sreg};
use super::warp::{EMU_BARRIER, EMU_SHUFFLE, WARP};
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
    /// The emulated thread's warp, in a cooperative launch.
    static WARP_EXCHANGE: RefCell<Option<Arc<WarpExchange>>> = const { RefCell::new(None) };
    /// The emulated thread's block barrier, in a cooperative launch.
    static BLOCK_BARRIER: RefCell<Option<Arc<Barrier>>> = const { RefCell::new(None) };
}

/// `bar.sync 0` for an emulated thread: wait for every thread of the block.
extern "C" fn barrier0() {
    BLOCK_BARRIER.with(|b| {
        // Only cooperative launches run kernels with barriers (`launch` checks the kernel's info).
        if let Some(b) = b.borrow().as_ref() {
            b.wait();
        }
    });
}

/// Where the lanes of one emulated warp trade values.
struct WarpExchange {
    barrier: Barrier,
    slots: Mutex<[u32; WARP as usize]>,
}

/// `shfl.sync.bfly.b32` for an emulated lane: publish `v`, wait for the warp, read lane `lane ^ lane_mask`'s,
/// wait again so no slot is overwritten before every lane has read it.
extern "C" fn shfl_bfly_i32(v: u32, lane_mask: u32) -> u32 {
    let lane = (tid_x() % WARP as u32) as usize;
    WARP_EXCHANGE.with(|w| {
        let w = w.borrow();
        // Only cooperative launches run kernels that shuffle (`launch` checks the kernel's info).
        let Some(x) = w.as_ref() else { return v };
        x.slots.lock().unwrap_or_else(|e| e.into_inner())[lane] = v;
        x.barrier.wait();
        let r = x.slots.lock().unwrap_or_else(|e| e.into_inner())[lane ^ (lane_mask as usize % WARP as usize)];
        x.barrier.wait();
        r
    })
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
    if let Some(f) = module.get_function(EMU_SHUFFLE) {
        engine.add_global_mapping(&f, shfl_bfly_i32 as *const () as usize);
    }
    if let Some(f) = module.get_function(EMU_BARRIER) {
        engine.add_global_mapping(&f, barrier0 as *const () as usize);
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
    ///
    /// # Panics
    /// For a cooperative kernel, when `grid.threads` is not a multiple of 32.
    pub unsafe fn launch(&self, index: usize, buffers: &[*mut u8], symbols: &[i64], grid: Grid) {
        let f = self.wrappers[index];
        if self.infos[index].cooperative {
            assert!(grid.threads.is_multiple_of(WARP as u32), "a cooperative launch needs whole warps, not {grid:?}");
            // Raw pointers are not `Send`; the threads only pass them on to the kernel, within this call.
            let (bufs, syms) = (buffers.as_ptr() as usize, symbols.as_ptr() as usize);
            for block in 0..grid.blocks {
                let warps: Vec<Arc<WarpExchange>> = (0..grid.threads / WARP as u32)
                    .map(|_| {
                        Arc::new(WarpExchange {
                            barrier: Barrier::new(WARP as usize),
                            slots: Mutex::new([0; WARP as usize]),
                        })
                    })
                    .collect();
                let barrier = Arc::new(Barrier::new(grid.threads as usize));
                std::thread::scope(|s| {
                    for thread in 0..grid.threads {
                        let warp = Arc::clone(&warps[(thread / WARP as u32) as usize]);
                        let barrier = Arc::clone(&barrier);
                        std::thread::Builder::new()
                            .stack_size(1 << 20)
                            .spawn_scoped(s, move || {
                                SREGS.with(|r| r.set([thread, block, grid.threads, grid.blocks]));
                                WARP_EXCHANGE.with(|w| *w.borrow_mut() = Some(warp));
                                BLOCK_BARRIER.with(|b| *b.borrow_mut() = Some(barrier));
                                // SAFETY: as for the sequential launch below; the call returns before `launch`.
                                unsafe { f(bufs as *const *mut u8, syms as *const i64) };
                            })
                            .expect("an emulated GPU thread starts");
                    }
                });
            }
            return;
        }
        for block in 0..grid.blocks {
            for thread in 0..grid.threads {
                SREGS.with(|s| s.set([thread, block, grid.threads, grid.blocks]));
                // SAFETY: the caller guarantees the buffers and symbols the kernel reads and writes.
                unsafe { f(buffers.as_ptr(), symbols.as_ptr()) };
            }
        }
    }
}
