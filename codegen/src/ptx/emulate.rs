//! Host emulation of the NVPTX emitter's kernels: the same LLVM IR the PTX comes from (`ptx::emit` with
//! the host flavor: address space 0, and each special-register read — `tid.x`, `ctaid.x`, `ntid.x`,
//! `nctaid.x` — a call of a host function), optimized by the same pipeline, JIT-compiled for the host by LLVM's
//! MCJIT, and run over an emulated grid: the blocks in turn. Within a block, a kernel whose threads only ever
//! write disjoint elements runs its threads in turn, each to completion; a cooperative kernel
//! ([`PtxKernelInfo::cooperative`]) runs each thread as a stackful coroutine (`corosensei`) on the launching
//! thread, and a scheduler resumes them until each reaches a synchronization point: its warp shuffles
//! (`shfl.sync.bfly`, a host function here) publish the lane's value in a slot (two banks, used in turn), wait for
//! the warp and read the partner's slot, so every lane sees its partner's value of the same step; its block barriers
//! (`bar.sync 0`, likewise) wait for every thread of the block, as on the GPU. A thread switch is a few
//! instructions, not an operating-system context switch: emulating a block of 256 threads that reduce with
//! shuffles costs about what running them in turn does (OS threads and futex barriers made int8 gpt2_small's
//! layer norms and softmaxes take minutes). Blocks run in turn, so the kernel's shared memory (a plain global
//! here) is the running block's.
//!
//! This is how the GPU code path is checked against the reference evaluator on a machine without a GPU: the
//! grid mapping, index arithmetic, the math and every element semantic are the ones the PTX carries; only
//! instruction selection differs.

use std::cell::{Cell, RefCell};

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};

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

/// What an emulated thread of a cooperative launch waits for when it suspends.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Wait {
    /// Every lane of its warp (a shuffle's step).
    Warp,
    /// Every thread of its block (`bar.sync 0`).
    Block,
}

thread_local! {
    /// The emulated thread's special registers, in [`Sreg::ALL`] order (set by the scheduler before it resumes
    /// a thread of a cooperative launch).
    static SREGS: Cell<[u32; 4]> = const { Cell::new([0; 4]) };
    /// The running coroutine's yielder, in a cooperative launch; null otherwise.
    static YIELDER: Cell<*const Yielder<(), Wait>> = const { Cell::new(std::ptr::null()) };
    /// The running block's shuffle slots, in a cooperative launch.
    static SLOTS: RefCell<Slots> = const { RefCell::new(Slots { values: Vec::new(), bank: Vec::new() }) };
}

/// Where the lanes of a cooperative block trade values in shuffles: two banks of one slot per thread, and the bank
/// each thread's next shuffle uses.
struct Slots {
    values: Vec<u32>,
    bank: Vec<bool>,
}

/// Suspends the running emulated thread until every thread `w` names has arrived, then makes its yielder the
/// running one again. Without a cooperative launch (no yielder) it returns at once.
fn wait(w: Wait) {
    let y = YIELDER.with(Cell::get);
    if y.is_null() {
        return;
    }
    // SAFETY: the yielder belongs to the coroutine running this code (set when it started and restored here after
    // every suspension), which lives until its closure returns.
    unsafe { (*y).suspend(w) };
    YIELDER.with(|c| c.set(y));
}

/// `bar.sync 0` for an emulated thread: wait for every thread of the block.
extern "C" fn barrier0() {
    wait(Wait::Block);
}

/// `shfl.sync.bfly.b32` for an emulated lane: publish `v`, wait for the warp, read lane `lane ^ lane_mask`'s.
///
/// Successive shuffles of a thread use the two banks of slots in turn, so a lane that has read may go on and
/// publish its next value while a slower lane still reads this one: that value lands in the other bank, and the
/// bank it read is written again only after the next shuffle's wait, which every lane of the warp reaches after
/// its read. One wait per shuffle, not two.
extern "C" fn shfl_bfly_i32(v: u32, lane_mask: u32) -> u32 {
    if YIELDER.with(Cell::get).is_null() {
        // Only cooperative launches run kernels that shuffle (`launch` checks the kernel's info).
        return v;
    }
    let tid = tid_x() as usize;
    let warp = WARP as usize;
    let partner = (tid - tid % warp) + ((tid % warp) ^ (lane_mask as usize % warp));
    let bank = SLOTS.with(|s| {
        let mut s = s.borrow_mut();
        let n = s.bank.len();
        let bank = usize::from(s.bank[tid]);
        s.bank[tid] ^= true;
        s.values[bank * n + tid] = v;
        bank
    });
    wait(Wait::Warp);
    SLOTS.with(|s| {
        let s = s.borrow();
        s.values[bank * s.bank.len() + partner]
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

/// Runs a cooperative kernel over `grid`: per block, one coroutine per thread, resumed in thread order until each
/// suspends at a synchronization point or returns; a warp (a block) whose threads have all arrived is released
/// together. Stacks are allocated once per launch and reused by every block.
///
/// # Panics
/// When a block's threads can make no progress (some wait at a barrier that a finished thread never reaches: a
/// kernel bug, which would hang a GPU) or a stack cannot be mapped.
fn run_cooperative(f: Wrapper, buffers: &[*mut u8], symbols: &[i64], grid: Grid) {
    #[derive(Copy, Clone, PartialEq, Eq)]
    enum State {
        Runnable,
        Waiting(Wait),
        Done,
    }
    let n = grid.threads as usize;
    let warp = WARP as usize;
    // Raw pointers are not `'static`; the coroutines only pass them on to the kernel, within this call.
    let (bufs, syms) = (buffers.as_ptr() as usize, symbols.as_ptr() as usize);
    let mut stacks: Vec<DefaultStack> =
        (0..n).map(|_| DefaultStack::new(1 << 20).expect("an emulated GPU thread's stack maps")).collect();
    let fresh = || Slots { values: vec![0; 2 * n], bank: vec![false; n] };
    let saved_slots = SLOTS.with(|s| std::mem::replace(&mut *s.borrow_mut(), fresh()));
    let saved_yielder = YIELDER.with(Cell::get);
    for block in 0..grid.blocks {
        SLOTS.with(|s| *s.borrow_mut() = fresh());
        let mut threads: Vec<Coroutine<(), Wait, (), DefaultStack>> = stacks
            .drain(..)
            .map(|stack| {
                Coroutine::with_stack(stack, move |y: &Yielder<(), Wait>, ()| {
                    YIELDER.with(|c| c.set(y));
                    // SAFETY: as for the sequential launch; every coroutine finishes before `launch` returns.
                    unsafe { f(bufs as *const *mut u8, syms as *const i64) };
                })
            })
            .collect();
        let mut state = vec![State::Runnable; n];
        let mut arrived_warp = vec![0usize; n / warp];
        let mut arrived_block = 0usize;
        let mut done = 0usize;
        while done < n {
            let mut progress = false;
            for t in 0..n {
                if state[t] != State::Runnable {
                    continue;
                }
                progress = true;
                SREGS.with(|r| r.set([t as u32, block, grid.threads, grid.blocks]));
                match threads[t].resume(()) {
                    CoroutineResult::Return(()) => {
                        state[t] = State::Done;
                        done += 1;
                    }
                    CoroutineResult::Yield(w) => {
                        state[t] = State::Waiting(w);
                        let (count, members) = match w {
                            Wait::Warp => (&mut arrived_warp[t / warp], (t - t % warp)..(t - t % warp + warp)),
                            Wait::Block => (&mut arrived_block, 0..n),
                        };
                        *count += 1;
                        if *count == members.len() {
                            *count = 0;
                            for m in members {
                                state[m] = State::Runnable;
                            }
                        }
                    }
                }
            }
            assert!(progress, "emulated block {block}: threads wait at a barrier that finished threads never reach");
        }
        stacks.extend(threads.into_iter().map(Coroutine::into_stack));
    }
    YIELDER.with(|c| c.set(saved_yielder));
    SLOTS.with(|s| *s.borrow_mut() = saved_slots);
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
            run_cooperative(f, buffers, symbols, grid);
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
