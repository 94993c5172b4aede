//! The CPU backend: runs an [`Executable`] on the host.
//!
//! A [`CpuProgram`] is an executable bound to its kernels' code and its weights. Loading runs the executable's
//! `prepare` steps once (weight transposes and other weight-only work); each [`CpuProgram::run`] then checks
//! the inputs against the declared types (binding symbolic dims), takes an arena of the planned size from a pool
//! (so concurrent runs never share one and sequential runs reuse memory), and runs the steps in order:
//! - kernel steps launch generated code part by part, splitting a parallel part's outermost loop into chunks
//!   across the program's thread pool when it is large enough to pay for it;
//! - library steps call `crate::library` (GEMM, convolution, pooling) inside the same pool, then their
//!   epilogue kernel;
//! - interpreter steps copy their operands into tensors and run `kiln_ir::interp::eval_op`;
//! - copies are `memcpy`.
//!
//! A program is `Send + Sync`: several threads may run it at once. Nothing here panics on a bad input — a wrong
//! name, dtype or shape is a [`RunError`] naming the input.

pub mod node;

use std::collections::{BTreeMap, HashMap};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, RwLock};

use crate::library::{self, Par};
use kiln_ir::{Tensor, TensorView};
use kiln_plan::exec::{BufferId, Executable, Home, LibraryOp, Routine, Step};
use kiln_plan::kernel::{ArgRole, Extent, Kernel};

use crate::RunError;
use crate::placement::PlacedBackends;

pub mod collective;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod parameters;
pub mod submission;
pub mod transfer;
mod weight_set;
pub use collective::LocalGroup;
pub use parameters::{CpuMaterialization, CpuParameter, CpuWeight, DTypeRule, MaterializeOptions, Packing};
pub use submission::{CpuBackend, CpuCompletion, CpuExecutor, CpuWork, Pending};
pub use transfer::{HostBuffer, Layout};
use weight_set::WeightSet;
pub use weight_set::{WeightFingerprint, WeightLoad, WeightLoadReport};

/// Worker threads per core a program may ask for, unless `KILN_MAX_THREADS` says otherwise: more only
/// oversubscribes the machine (100,000 threads used to hang it).
pub const MAX_THREADS_PER_CORE: usize = 4;

/// The environment variable that raises (or lowers) the thread cap of [`resolve_threads`].
pub const MAX_THREADS_VAR: &str = "KILN_MAX_THREADS";

/// The worker threads for a request of `n`: 0 means one per core; more than [`MAX_THREADS_PER_CORE`] per core
/// (or than `KILN_MAX_THREADS`, when set) is an error that says how to raise the cap.
pub fn resolve_threads(n: usize) -> Result<usize, RunError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n == 0 {
        return Ok(cores);
    }
    let cap = match std::env::var(MAX_THREADS_VAR) {
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .map_err(|_| RunError::Input(format!("{MAX_THREADS_VAR}=`{v}` is not a thread count")))?,
        Err(_) => cores * MAX_THREADS_PER_CORE,
    };
    if n > cap {
        return Err(RunError::Input(format!(
            "{n} threads is more than the cap of {cap} ({MAX_THREADS_PER_CORE} per core on this {cores}-core machine; \
             set {MAX_THREADS_VAR} to raise it)"
        )));
    }
    Ok(n)
}

/// Every arena and per-run buffer starts at a multiple of this many bytes.
const ALIGN: usize = 64;

/// Programs with less work than this (multiply-adds plus element computations, static shapes) run on the calling
/// thread whatever `--threads` says: handing a run of a few microseconds to a pool costs more than it gains.
const SMALL_PROGRAM: u64 = 1 << 21;

/// Programs with less work than this (but `SMALL_PROGRAM` or more) are adaptive too (see [`ADAPTIVE_PROBE`]): whether
/// the pool's hand-offs pay for themselves at this size depends on the machine (a virtual machine's idle workers
/// take tens of microseconds to wake: a small CRNN's batch-split conv took 0.10 ms on two threads, 0.05 ms on
/// one), so it is measured, not guessed.
const ADAPTIVE_WORK: u64 = 1 << 25;

/// A program whose work is only known as it runs (`SMALL_PROGRAM` could not decide), or is below
/// [`ADAPTIVE_WORK`], times its runs both ways — through the pool and serial on the caller's thread — and runs the
/// faster way; one run in this many takes the other way, so the choice follows the extents the inputs bring. (A
/// tiny detection head's run costs 5 µs serial and 11 µs handed to the pool.)
const ADAPTIVE_PROBE: u64 = 64;

/// An adaptive program's first runs alternate between the two ways (see [`ADAPTIVE_PROBE`]) until this many have
/// started.
const ADAPTIVE_TRIALS: u64 = 8;

thread_local! {
    /// Set while this thread runs a program's steps on its own (the faster way for it, see [`ADAPTIVE_PROBE`]):
    /// its steps then use one worker and spawn nothing.
    static SERIAL_RUN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Below this many element computations a parallel part runs on the calling thread.
const MIN_PARALLEL_WORK: u64 = 1 << 15;

/// Asks the kernel to back the 2 MiB-aligned part of a large, fresh, untouched buffer with transparent huge
/// pages, so that writing it takes a few faults instead of one per 4 KiB page (a 64 MiB output otherwise costs
/// ~16k faults per run). Advisory: ignored where unsupported.
fn advise_huge_pages(bytes: &mut [u8]) {
    const HUGE: usize = 2 << 20;
    if bytes.len() < 2 * HUGE {
        return;
    }
    let start = bytes.as_mut_ptr() as usize;
    let aligned = start.next_multiple_of(HUGE);
    let len = (start + bytes.len() - aligned) / HUGE * HUGE;
    #[cfg(target_os = "linux")]
    // SAFETY: the range lies inside `bytes` (aligned up, length rounded down); MADV_HUGEPAGE changes no contents
    // and no mapping the program relies on.
    unsafe {
        libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = len;
}

/// Zeroed, 64-byte aligned bytes.
struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its allocation exclusively; access goes through `&`/`&mut` like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; shared references only read.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn zeroed(len: usize) -> Result<AlignedBuf, RunError> {
        if len == 0 {
            return Ok(AlignedBuf { ptr: NonNull::<[u8; ALIGN]>::dangling().cast(), len: 0 });
        }
        let layout = std::alloc::Layout::from_size_align(len, ALIGN)
            .map_err(|_| RunError::Memory(format!("{len} bytes cannot be allocated")))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(raw)
            .map(|ptr| AlignedBuf { ptr, len })
            .ok_or_else(|| RunError::Memory(format!("out of memory allocating {len} bytes")))
    }

    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            let layout = std::alloc::Layout::from_size_align(self.len, ALIGN).expect("checked at allocation");
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// Compiled code for an executable's kernels.
pub enum KernelCode {
    /// Native code: one entry per kernel (from the JIT or a loaded artifact) and what keeps it alive.
    Native {
        /// Entry and launch facts per kernel, by index.
        entries: Vec<(kiln_plan::cpu::KernelFn, kiln_plan::cpu::KernelInfo)>,
        /// The owner of the code (a JIT module or a loaded library).
        owner: Box<dyn std::any::Any + Send + Sync>,
    },
    /// The kernel IR, run by the reference evaluator (slow; for testing the executor without code generation).
    Reference(Vec<Kernel>),
}

/// An executable bound to its code and weights, ready to run. See the module docs.
pub struct CpuProgram {
    exe: Executable,
    /// The code of the root program's kernels, shared with its region bodies (whose steps launch them).
    code: Arc<KernelCode>,
    /// The programs of the executable's region bodies ([`Executable::regions`], same order).
    regions: Vec<CpuProgram>,
    /// Which kernels of `code` this program's steps launch (the symbol values of the others are not computed).
    launched: Vec<bool>,
    /// The weights, prepared weights and packed matmul operands every run reads: read once at the start of a
    /// run (which keeps that set alive to its end), replaced as a whole by a weight swap.
    current: RwLock<Arc<WeightSet>>,
    /// Serializes weight swaps, so two concurrent swaps cannot interleave their builds.
    swapping: Mutex<()>,
    /// The worker pool, shared with every other program of this thread count in the process ([`shared_pool`]).
    pool: Arc<rayon::ThreadPool>,
    threads: usize,
    /// The workers a run actually uses: 1 for programs too small to gain from the pool (see `SMALL_PROGRAM`).
    workers: usize,
    /// For a program whose work is not known before it builds (symbolic or data-dependent extents, regions):
    /// how long runs take through the pool (`[0]`) and serial on the caller's thread (`[1]`), in nanoseconds,
    /// smoothed (0: not measured yet), and a run counter — see [`ADAPTIVE_PROBE`].
    run_ns: [std::sync::atomic::AtomicU64; 2],
    runs: std::sync::atomic::AtomicU64,
    /// Whether the program chooses per run (see [`ADAPTIVE_PROBE`]): several workers, and no static work estimate
    /// or one below [`ADAPTIVE_WORK`].
    adaptive: bool,
    arenas: Mutex<Vec<AlignedBuf>>,
    /// The per-run buffers outside the arena (a library group's intermediate of another dtype than its result,
    /// say) of finished runs, kept for the next: allocating and faulting them in every run cost more than the
    /// arithmetic of a small model. Like the arena, their contents are never read before a step writes them.
    spare: Mutex<Vec<Vec<AlignedBuf>>>,
    /// The registry backends the executable's [`Step::Backend`]s run on.
    placed: PlacedBackends,
}

/// What an empty buffer points at (see `CpuProgram::pointers`): room for one element of any dtype, never written
/// (a kernel stores to an empty output in no iteration).
#[repr(align(64))]
struct EmptyBuffer([u8; 64]);
static EMPTY_BUFFER: EmptyBuffer = EmptyBuffer([0; 64]);

/// Buffer `b` of a run as `n` f32s (an empty slice when `n` is 0, whatever the pointer).
///
/// # Safety
/// The buffer must hold `n` initialized f32s that nobody writes while the slice lives.
unsafe fn f32_view<'a>(ptrs: Ptrs<'a>, b: BufferId, n: usize) -> &'a [f32] {
    if n == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(ptrs.0[b.0 as usize].cast::<f32>(), n) }
}

/// The process-wide pool of `threads` workers: programs of one thread count share it (ten sessions of a service
/// start their workers once, not ten times), and it ends when the last program using it is dropped.
fn shared_pool(threads: usize) -> Result<Arc<rayon::ThreadPool>, RunError> {
    static POOLS: std::sync::LazyLock<Mutex<HashMap<usize, std::sync::Weak<rayon::ThreadPool>>>> =
        std::sync::LazyLock::new(|| Mutex::new(HashMap::new()));
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(pool) = pools.get(&threads).and_then(std::sync::Weak::upgrade) {
        return Ok(pool);
    }
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |i| format!("kiln-cpu{threads}-{i}"))
            .build()
            .map_err(|e| RunError::Backend(format!("cannot start {threads} worker threads: {e}")))?,
    );
    pools.retain(|_, p| p.strong_count() > 0);
    pools.insert(threads, Arc::downgrade(&pool));
    Ok(pool)
}

/// A run's step loop, handed to the pool's thread while the caller waits for it (so nothing it borrows is
/// touched concurrently): its raw buffer pointers are what keeps it from being `Send` by itself.
struct AssertSend<F>(F);

// SAFETY: see the type's docs.
unsafe impl<F> Send for AssertSend<F> {}

impl<F: FnOnce() -> R, R> AssertSend<F> {
    fn call(self) -> R {
        (self.0)()
    }
}

/// What a run updates when a step produces results of a data-dependent extent (see `CpuProgram::adopt`).
struct LateRun<'r> {
    ptrs: &'r mut Vec<*mut u8>,
    symbols: &'r mut HashMap<String, u64>,
    spare: &'r mut Vec<AlignedBuf>,
    dynamic: &'r mut Vec<AlignedBuf>,
    results: &'r mut HashMap<BufferId, Tensor>,
    late: &'r mut Vec<Tensor>,
}

/// Raw buffer pointers of one run, shareable with the pool's threads (the steps' buffer discipline — a step
/// writes only its results, which no concurrent chunk writes at the same element — makes this sound).
#[derive(Clone, Copy)]
struct Ptrs<'a>(&'a [*mut u8]);

// SAFETY: see the type's docs; the pointers outlive the run that shares them.
unsafe impl Send for Ptrs<'_> {}
// SAFETY: as above.
unsafe impl Sync for Ptrs<'_> {}

impl CpuProgram {
    /// Binds `exe` to `code` with `threads` worker threads (at least 1), and runs its prepare steps. An
    /// executable that places nodes on other backends needs [`CpuProgram::with_backends`].
    pub fn new(exe: Executable, code: KernelCode, threads: usize) -> Result<CpuProgram, RunError> {
        CpuProgram::with_backends(exe, code, threads, &crate::registry::BackendRegistry::new())
    }

    /// [`CpuProgram::new`], with the backends the executable's [`Step::Backend`]s name taken from `registry` (a
    /// backend it lacks is an error naming it).
    pub fn with_backends(
        exe: Executable,
        code: KernelCode,
        threads: usize,
        registry: &crate::registry::BackendRegistry,
    ) -> Result<CpuProgram, RunError> {
        CpuProgram::bind(exe, Arc::new(code), threads, registry)
    }

    /// Binds `exe` to `code` (shared with its region bodies, each bound here too).
    fn bind(
        mut exe: Executable,
        code: Arc<KernelCode>,
        threads: usize,
        registry: &crate::registry::BackendRegistry,
    ) -> Result<CpuProgram, RunError> {
        let placed = PlacedBackends::resolve(&exe.placed_nodes(), registry)?;
        let threads = threads.max(1);
        let pool = shared_pool(threads)?;
        let regions = std::mem::take(&mut exe.regions)
            .into_iter()
            .map(|body| CpuProgram::bind(body, Arc::clone(&code), threads, registry))
            .collect::<Result<Vec<_>, _>>()?;
        let kernels = match code.as_ref() {
            KernelCode::Native { entries, .. } => entries.len(),
            KernelCode::Reference(kernels) => kernels.len(),
        };
        let mut launched = vec![false; kernels];
        fn mark(s: &Step, launched: &mut [bool]) {
            match s {
                Step::Kernel { kernel, .. } => {
                    if let Some(l) = launched.get_mut(*kernel) {
                        *l = true;
                    }
                }
                Step::Library { epilogue: Some(e), .. } => mark(e, launched),
                _ => {}
            }
        }
        exe.prepare.iter().chain(&exe.steps).for_each(|s| mark(s, &mut launched));
        let weights = exe.weights.iter().map(|(n, t)| (n.to_string(), Arc::clone(t))).collect();
        let mut program = CpuProgram {
            exe,
            code,
            regions,
            launched,
            current: RwLock::new(Arc::new(WeightSet::default())),
            swapping: Mutex::new(()),
            pool,
            threads,
            workers: threads,
            run_ns: [std::sync::atomic::AtomicU64::new(0), std::sync::atomic::AtomicU64::new(0)],
            runs: std::sync::atomic::AtomicU64::new(0),
            adaptive: false,
            arenas: Mutex::new(Vec::new()),
            spare: Mutex::new(Vec::new()),
            placed,
        };
        match program.static_work() {
            Some(w) if w < SMALL_PROGRAM => program.workers = 1,
            Some(w) if w >= ADAPTIVE_WORK => {}
            _ => program.adaptive = program.workers > 1,
        }
        let set = program.build_weight_set(weights, &HashMap::new())?;
        program.publish(set);
        Ok(program)
    }

    /// The executable.
    pub fn executable(&self) -> &Executable {
        &self.exe
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// An estimate of one run's work (multiply-adds of library calls, element computations of kernels), or
    /// `None` when a shape is symbolic.
    fn static_work(&self) -> Option<u64> {
        let elems = |b: &BufferId| self.exe.buffers[b.0 as usize].ty.shape.num_elements();
        let last = |b: &BufferId| self.exe.buffers[b.0 as usize].ty.shape.0.last().and_then(|d| d.as_static());
        let mut total: u64 = 0;
        for step in &self.exe.steps {
            let w = match step {
                Step::Library { op: LibraryOp::MatMul | LibraryOp::MatMulInteger, inputs, output, .. } => {
                    elems(output)? * last(&inputs[0])?
                }
                Step::Library { op: LibraryOp::Conv(_) | LibraryOp::ConvInteger(_), inputs, output, .. } => {
                    let w = elems(&inputs[1])?;
                    let m = self.exe.buffers[inputs[1].0 as usize].ty.shape.0.first()?.as_static()?.max(1);
                    elems(output)? * (w / m)
                }
                Step::Library { op: LibraryOp::ConvTranspose(_), inputs, .. } => {
                    // Every input element meets every weight of its group: N·C·in · (M/groups)·k.
                    let c = self.exe.buffers[inputs[1].0 as usize].ty.shape.0.first()?.as_static()?.max(1);
                    elems(&inputs[0])? * (elems(&inputs[1])? / c)
                }
                Step::Library { output, .. } => elems(output)?,
                Step::Kernel { kernel, .. } => match self.code.as_ref() {
                    KernelCode::Native { entries, .. } => entries[*kernel]
                        .1
                        .parts
                        .iter()
                        .map(|p| p.trip_count(&[]).map(|n| n.max(0) as u64 * p.cost_per_iteration))
                        .sum::<Option<u64>>()?,
                    KernelCode::Reference(_) => return None,
                },
                Step::Interp { outputs, .. } | Step::Backend { outputs, .. } => {
                    outputs.iter().map(elems).sum::<Option<u64>>()?
                }
                // A loop's iterations are decided by the data.
                Step::Region { .. } => return None,
                // A recurrent step's gates: (gates · hidden) multiply-adds per input and hidden element, per time
                // step; a top_k: a selection over its operand.
                Step::Routine {
                    routine:
                        Routine::TopK(_)
                        | Routine::TopKAtRunTime(_)
                        | Routine::NonZero(_)
                        | Routine::Unique(_)
                        | Routine::NonMaxSuppression(_)
                        | Routine::DynamicQuantize,
                    inputs,
                    ..
                } => elems(&inputs[0])?,
                // Up to 4^r taps per sample (cubic), a few for the common linear case.
                Step::Routine { routine: Routine::GridSample(_) | Routine::RoiAlign(_), outputs, .. } => {
                    elems(&outputs[0])?.saturating_mul(8)
                }
                Step::Routine { inputs, outputs, .. } => elems(inputs.get(1)?)?
                    .saturating_add(elems(inputs.get(2)?)?)
                    .saturating_mul(elems(&outputs[0])? / last(&outputs[0])?.max(1)),
                Step::Copy { dst, .. } => elems(dst)?,
            };
            total = total.saturating_add(w);
        }
        Some(total)
    }

    /// Whether the next run of an adaptive program runs serial: the way not measured yet, either way in turn for
    /// the first [`ADAPTIVE_TRIALS`] runs, then the faster way so far or — one run in [`ADAPTIVE_PROBE`] — the
    /// other way.
    fn choose_serial(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let n = self.runs.fetch_add(1, Relaxed);
        let (pool, serial) = (self.run_ns[0].load(Relaxed), self.run_ns[1].load(Relaxed));
        if pool == 0 {
            return false;
        }
        if serial == 0 {
            return true;
        }
        if n < ADAPTIVE_TRIALS {
            // Both ways several times before the first choice, so one noisy run does not decide.
            return n % 2 == 1;
        }
        (serial <= pool) != (n % ADAPTIVE_PROBE == ADAPTIVE_PROBE - 1)
    }

    /// Folds a run's wall time into its way's smoothed time.
    fn record_run(&self, serial: bool, took: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let t = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
        let slot = &self.run_ns[usize::from(serial)];
        let old = slot.load(Relaxed);
        slot.store(if old == 0 { t } else { (old / 4).saturating_mul(3).saturating_add(t / 4).max(1) }, Relaxed);
    }

    /// The workers this thread's run uses: 1 inside a run kept on the caller's thread (see [`SERIAL_RUN`]), else
    /// the program's.
    fn run_workers(&self) -> usize {
        if SERIAL_RUN.with(std::cell::Cell::get) { 1 } else { self.workers }
    }

    /// Runs the prepare steps on `set`'s weights, filling its prepared weights.
    fn prepare(&self, set: &mut WeightSet) -> Result<(), RunError> {
        let symbols = HashMap::new();
        // The steps write straight into the tensors the weight set keeps (zeroed memory the system hands out
        // lazily: no copy, no page touched twice).
        let mut storage = Vec::with_capacity(self.exe.prepared.len());
        for &b in &self.exe.prepared {
            let dims = self.exe.dims(b, &symbols).map_err(RunError::Backend)?;
            let dtype = self.exe.buffers[b.0 as usize].ty.dtype;
            storage.push(Tensor::try_zeros(dtype, dims).map_err(RunError::Weights)?);
        }
        if !self.exe.prepare.is_empty() {
            // SAFETY: the steps write their declared results: 0 or 1 in every byte of a bool result.
            let targets: Vec<*mut u8> = storage.iter_mut().map(|t| unsafe { t.as_bytes_mut() }.as_mut_ptr()).collect();
            let ptrs = self.pointers(set, &[], &symbols, None, &targets, &mut Vec::new(), &mut Vec::new(), None)?;
            let sym_values = self.symbol_values(&symbols);
            for step in &self.exe.prepare {
                if !self.step(set, step, Ptrs(&ptrs), &symbols, &sym_values)?.is_empty() {
                    return Err(RunError::Backend("a prepare step has a result of data-dependent extent".into()));
                }
            }
        }
        set.prepared = storage.into_iter().map(Arc::new).collect();
        Ok(())
    }

    /// The tensor behind a weight-like buffer (a weight, a constant or a prepared weight).
    fn weight_tensor<'a>(&'a self, set: &'a WeightSet, b: BufferId) -> Option<&'a Tensor> {
        match &self.exe.buffers[b.0 as usize].home {
            Home::Weight(name) => set.weights.get(name).map(|t| t.as_ref()),
            Home::Constant(t) => Some(t.as_ref()),
            Home::Prepared(k) => set.prepared.get(*k).map(|t| t.as_ref()),
            _ => None,
        }
    }

    /// Packs the right operand of every f32 matmul whose right operand is a 2-D weight and whose left operand
    /// may have few enough rows for `library::prefer_packed` (checked again at run time with the real rows).
    /// A weight that arrives already packed (in `prepacked`, by weight name, with the same extents) is used as
    /// it is.
    fn pack_weights(
        &self,
        set: &mut WeightSet,
        prepacked: &HashMap<String, Arc<library::PackedB>>,
    ) -> Result<(), RunError> {
        let mut packed = HashMap::new();
        for b in self.packable_operands() {
            let Some(w) = self.weight_tensor(set, b) else { continue };
            let (Some(data), [k, n]) = (w.as_slice::<f32>(), w.shape()) else { continue };
            let given = match &self.exe.buffers[b.0 as usize].home {
                Home::Weight(name) => prepacked.get(name).filter(|p| p.k() == *k && p.n() == *n),
                _ => None,
            };
            let p = match given {
                Some(p) => Arc::clone(p),
                None => Arc::new(library::PackedB::pack(data, *k, *n).map_err(|e| RunError::Weights(e.to_string()))?),
            };
            packed.insert(b, p);
        }
        set.packed = packed;
        Ok(())
    }

    /// Packs the input and recurrent weights of every LSTM and GRU whose weights are fixed for the program, so
    /// that a run streams packed panels instead of packing `R` (and the `gemm` crate `W`) again per call.
    fn pack_recurrent_weights(&self, set: &mut WeightSet) -> Result<(), RunError> {
        let mut packed = HashMap::new();
        for step in &self.exe.steps {
            let Step::Routine { routine: routine @ (Routine::Lstm(_) | Routine::Gru(_)), inputs, .. } = step else {
                continue;
            };
            let &[x, w, r, ..] = &inputs[..] else { continue };
            if packed.contains_key(&(w, r)) {
                continue;
            }
            let (Some(wt), Some(rt)) = (self.weight_tensor(set, w), self.weight_tensor(set, r)) else { continue };
            let (Some(wd), Some(rd), &[_, rows, input], &[_, _, hidden]) =
                (wt.as_slice::<f32>(), rt.as_slice::<f32>(), wt.shape(), rt.shape())
            else {
                continue;
            };
            // The input width is the operand's last extent; a symbolic one is checked per call.
            let last = self.exe.buffers[x.0 as usize].ty.shape.0.last().and_then(|d| d.as_static());
            if hidden == 0 || !rows.is_multiple_of(hidden) || last.is_some_and(|l| l != input as u64) {
                continue;
            }
            let gru = matches!(routine, Routine::Gru(_));
            let p = library::RnnPacked::pack(wd, rd, rows / hidden, hidden, input, gru)
                .map_err(|e| RunError::Weights(e.to_string()))?;
            packed.insert((w, r), Arc::new(p));
        }
        set.recurrent = packed;
        Ok(())
    }

    /// Transforms the weights of every 3×3 stride-1 f32 conv worth running by Winograd (see
    /// [`library::winograd_pays`]) whose weights are fixed for the program (a weight, constant or prepared value).
    fn transform_conv_weights(&self, set: &mut WeightSet) -> Result<(), RunError> {
        let mut transformed = HashMap::new();
        for step in &self.exe.steps {
            let Step::Library { op: LibraryOp::Conv(attrs), inputs, output, .. } = step else { continue };
            let (w, out) = (inputs[1], &self.exe.buffers[output.0 as usize].ty);
            if transformed.contains_key(&w) {
                continue;
            }
            if out.dtype != kiln_ir::DType::F32 {
                continue;
            }
            let Some(t) = self.weight_tensor(set, w) else { continue };
            let (Some(data), shape) = (t.as_slice::<f32>(), t.shape()) else { continue };
            // A symbolic output extent is decided per run (see `library`); a static one here.
            let spatial: Option<u64> = out.shape.0.iter().skip(2).map(|d| d.as_static()).product();
            if !library::winograd_applies(shape, attrs)
                || !library::winograd_pays(shape[1], shape[0], spatial.unwrap_or(u64::MAX))
            {
                continue;
            }
            let wt = library::WinogradWeights::transform(data, shape).map_err(|e| RunError::Weights(e.to_string()))?;
            transformed.insert(w, Arc::new(wt));
        }
        set.winograd = transformed;
        Ok(())
    }

    /// Packs, once per weight set, the right operand of every integer matmul whose right operand (2-D) and its
    /// zero point are fixed for the program (weights, constants or prepared values), and the weights of every
    /// such integer conv that the VNNI conv serves.
    fn pack_integer_weights(&self, set: &mut WeightSet) -> Result<(), RunError> {
        let (mut packed, mut convs) = (HashMap::new(), HashMap::new());
        let bad = |e: library::LibraryError| RunError::Weights(e.to_string());
        for step in self.exe.steps.iter().chain(&self.exe.prepare) {
            let Step::Library { op: op @ (LibraryOp::MatMulInteger | LibraryOp::ConvInteger(_)), inputs, .. } = step
            else {
                continue;
            };
            let [_, b, _, bz] = inputs[..] else { continue };
            if packed.contains_key(&(b, bz)) || convs.contains_key(&(b, bz)) {
                continue;
            }
            let (Some(bt), Some(zt)) = (self.weight_tensor(set, b), self.weight_tensor(set, bz)) else { continue };
            let (b8, z8) = (
                library::Int8 { bytes: bt.as_bytes(), signed: bt.dtype() == kiln_ir::DType::I8 },
                library::Int8 { bytes: zt.as_bytes(), signed: zt.dtype() == kiln_ir::DType::I8 },
            );
            match op {
                LibraryOp::ConvInteger(attrs) => {
                    let groups = usize::try_from(attrs.groups).unwrap_or(0);
                    if let Some(p) = library::PackedConvInt8::pack(b8, bt.shape(), z8, groups).map_err(bad)? {
                        convs.insert((b, bz), Arc::new(p));
                    }
                }
                _ if bt.shape().len() == 2 => {
                    packed.insert((b, bz), Arc::new(library::PackedInt8::pack(b8, bt.shape(), z8).map_err(bad)?));
                }
                _ => {}
            }
        }
        set.packed_int8 = packed;
        set.packed_conv_int8 = convs;
        Ok(())
    }

    /// The right operands of f32 matmuls worth packing: 2-D weight-like buffers whose left operand may have few
    /// enough rows for `library::prefer_packed`.
    fn packable_operands(&self) -> Vec<BufferId> {
        let mut out = Vec::new();
        for step in &self.exe.steps {
            let Step::Library { op: LibraryOp::MatMul, inputs, .. } = step else { continue };
            let (a, b) = (inputs[0], inputs[1]);
            if out.contains(&b) {
                continue;
            }
            let info = &self.exe.buffers[b.0 as usize];
            if !matches!(info.home, Home::Weight(_) | Home::Constant(_) | Home::Prepared(_)) {
                continue;
            }
            let (Some(k), Some(n)) = (
                info.ty.shape.0.first().and_then(|d| d.as_static()),
                info.ty.shape.0.get(1).and_then(|d| d.as_static()),
            ) else {
                continue;
            };
            if info.ty.dtype != kiln_ir::DType::F32 || info.ty.shape.0.len() != 2 {
                continue;
            }
            let a_ty = &self.exe.buffers[a.0 as usize].ty;
            let rows: Option<u64> =
                a_ty.shape.0[..a_ty.shape.0.len().saturating_sub(1)].iter().map(|d| d.as_static()).product();
            if a_ty.shape.0.len() < 2
                || rows.is_some_and(|r| !library::prefer_packed(r as usize, k as usize, n as usize))
            {
                continue;
            }
            out.push(b);
        }
        out
    }

    /// A complete weight set from `weights`: prepare steps run and matmul operands packed on it. Nothing is
    /// published; the running set is untouched whatever happens here.
    fn build_weight_set(
        &self,
        weights: HashMap<String, Arc<Tensor>>,
        prepacked: &HashMap<String, Arc<library::PackedB>>,
    ) -> Result<WeightSet, RunError> {
        let mut set = WeightSet { weights, ..WeightSet::default() };
        self.prepare(&mut set)?;
        self.pack_weights(&mut set, prepacked)?;
        self.transform_conv_weights(&mut set)?;
        self.pack_integer_weights(&mut set)?;
        self.pack_recurrent_weights(&mut set)?;
        self.release_packed_prepared(&mut set);
        Ok(set)
    }

    /// Drops the prepared weights that no step reads but through their packed form — a weight transpose that
    /// only feeds matmuls whose left operand has static rows the packed path takes (`library::prefer_packed`):
    /// keeping it would hold a third copy of a weight (the weight, its transpose, the packed transpose) for
    /// nothing. A matmul that finds its operand released (which the checks here rule out) is an error, never a
    /// read of the dropped memory.
    fn release_packed_prepared(&self, set: &mut WeightSet) {
        for (k, &b) in self.exe.prepared.iter().enumerate() {
            let Some(p) = set.packed.get(&b) else { continue };
            let packed_read = |s: &Step| match s {
                Step::Library { op: LibraryOp::MatMul, inputs, output, epilogue } if inputs.get(1) == Some(&b) => {
                    let a = &self.exe.buffers[inputs[0].0 as usize].ty.shape.0;
                    let rows: Option<u64> = a[..a.len().saturating_sub(1)].iter().map(|d| d.as_static()).product();
                    a.len() >= 2
                        && inputs[0] != b
                        && *output != b
                        && epilogue.as_deref().is_none_or(|e| !e.buffers().contains(&b))
                        && rows.is_some_and(|r| library::prefer_packed(r as usize, p.k(), p.n()))
                }
                s => !s.buffers().contains(&b),
            };
            let output = self.exe.outputs.iter().any(|(_, o)| *o == b);
            if !output && self.exe.steps.iter().all(packed_read) {
                let dtype = self.exe.buffers[b.0 as usize].ty.dtype;
                set.prepared[k] = Arc::new(Tensor::zeros(dtype, vec![0]));
                set.released.insert(b);
            }
        }
    }

    /// Makes `set` the one new runs read. Runs in flight keep the set they started with.
    fn publish(&self, set: WeightSet) {
        let set = Arc::new(set);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = set;
    }

    /// The weight set runs read now.
    fn weight_set(&self) -> Arc<WeightSet> {
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn bytes(&self, b: BufferId, dims: &[usize]) -> usize {
        dims.iter().product::<usize>() * self.exe.buffers[b.0 as usize].ty.dtype.size_bytes()
    }

    /// Runs the program on `inputs` (by name) and returns its outputs, in order.
    pub fn run(&self, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
        self.execute(&crate::bind::views(inputs), None)
    }

    /// Runs the program on borrowed inputs (by name): their memory is bound as it is, never copied.
    pub fn run_views(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<(String, Tensor)>, RunError> {
        self.execute(inputs, None)
    }

    /// Runs as [`CpuProgram::run`] does and also returns the wall time of each step (by index into
    /// `executable().steps`), for profiles.
    #[allow(clippy::type_complexity)]
    pub fn run_profiled(
        &self,
        inputs: &BTreeMap<String, Tensor>,
    ) -> Result<(Vec<(String, Tensor)>, Vec<std::time::Duration>), RunError> {
        let mut times = Vec::with_capacity(self.exe.steps.len());
        let out = self.execute(&crate::bind::views(inputs), Some(&mut times))?;
        Ok((out, times))
    }

    fn execute(
        &self,
        inputs: &[(&str, TensorView<'_>)],
        mut times: Option<&mut Vec<std::time::Duration>>,
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        let given = crate::bind::check_inputs(&self.exe, inputs)?;
        let mut symbols = crate::bind::bind_symbols(&self.exe, &given)?;
        // Read once: a weight swap during this run does not change what it reads.
        let set = self.weight_set();
        let set = set.as_ref();
        let arena = self.take_arena()?;
        let mut spare = self.spare.lock().ok().and_then(|mut s| s.pop()).unwrap_or_default();
        let mut dynamic = Vec::new();
        let result = (|| {
            let mut results = HashMap::new();
            let mut ptrs =
                self.pointers(set, &given, &symbols, Some(&arena), &[], &mut spare, &mut dynamic, Some(&mut results))?;
            let mut sym_values = self.symbol_values(&symbols);
            // Results of data-dependent extent (`non_zero`'s), owned here: their buffers point into them.
            let mut late = Vec::new();
            let mut steps = || -> Result<(), RunError> {
                for step in &self.exe.steps {
                    let t = std::time::Instant::now();
                    let produced = self.step(set, step, Ptrs(&ptrs), &symbols, &sym_values)?;
                    if !produced.is_empty() {
                        let mut run = LateRun {
                            ptrs: &mut ptrs,
                            symbols: &mut symbols,
                            spare: &mut spare,
                            dynamic: &mut dynamic,
                            results: &mut results,
                            late: &mut late,
                        };
                        self.adopt(produced, &mut run)?;
                        sym_values = self.symbol_values(&symbols);
                    }
                    if let Some(times) = times.as_deref_mut() {
                        times.push(t.elapsed());
                    }
                }
                Ok(())
            };
            // One worker: run on the caller's thread (nothing below spawns work), saving the hand-off to the
            // pool's thread; more: inside the pool, so library calls and chunked kernels use its workers. A program
            // whose work is only known as it runs takes whichever way its runs have been faster
            // (`ADAPTIVE_PROBE`). A run nested in a serial one (a region's body) stays serial.
            if self.workers == 1 || SERIAL_RUN.with(std::cell::Cell::get) {
                steps()?
            } else {
                // The program's first run (cold caches, first-touch pages) is not timed: it would misjudge the
                // way it took.
                let warm = self.runs.load(std::sync::atomic::Ordering::Relaxed) > 0;
                let serial = self.adaptive && self.choose_serial();
                let start = std::time::Instant::now();
                if serial {
                    SERIAL_RUN.with(|f| f.set(true));
                    let r = steps();
                    SERIAL_RUN.with(|f| f.set(false));
                    r?;
                } else {
                    let steps = AssertSend(steps);
                    self.pool.install(move || steps.call())?;
                }
                if self.adaptive && warm {
                    self.record_run(serial, start.elapsed());
                }
            }
            let mut out = Vec::with_capacity(self.exe.outputs.len());
            for (i, (name, b)) in self.exe.outputs.iter().enumerate() {
                let used_again = self.exe.outputs[i + 1..].iter().any(|(_, o)| o == b);
                let direct = if used_again { results.get(b).cloned() } else { results.remove(b) };
                if let Some(t) = direct {
                    out.push((name.clone(), t));
                    continue;
                }
                let dims = self.exe.dims(*b, &symbols).map_err(RunError::Backend)?;
                let n = self.bytes(*b, &dims);
                // SAFETY: the buffer holds `n` bytes, written by the steps.
                let bytes = unsafe { std::slice::from_raw_parts(ptrs[b.0 as usize], n) };
                let dtype = self.exe.buffers[b.0 as usize].ty.dtype;
                let t = Tensor::from_bytes(dtype, dims, bytes)
                    .ok_or_else(|| RunError::Backend(format!("output `{name}` has the wrong size")))?;
                out.push((name.clone(), t));
            }
            Ok(out)
        })();
        self.return_arena(arena);
        if let Ok(mut s) = self.spare.lock() {
            s.push(dynamic);
        }
        result
    }

    /// Symbol values for each kernel, by kernel index, in the kernel's symbol order.
    ///
    /// Native code carries its kernels' symbol lists itself (a loaded artifact's executable has no kernel IR).
    /// A kernel whose symbols the bindings do not determine gets an error, reported if it is launched (the
    /// kernels of `prepare` run before any input binds a symbol, and read none).
    fn symbol_values(&self, symbols: &HashMap<String, u64>) -> Vec<Result<Vec<i64>, RunError>> {
        let values = |k: usize, names: &[String]| {
            if !self.launched.get(k).copied().unwrap_or(true) {
                return Ok(Vec::new());
            }
            names.iter().map(|s| crate::bind::symbol_value(s, symbols)).collect()
        };
        match self.code.as_ref() {
            KernelCode::Native { entries, .. } => {
                entries.iter().enumerate().map(|(k, (_, info))| values(k, &info.symbols)).collect()
            }
            KernelCode::Reference(kernels) => {
                kernels.iter().enumerate().map(|(k, kl)| values(k, &kl.symbols)).collect()
            }
        }
    }

    fn take_arena(&self) -> Result<AlignedBuf, RunError> {
        let want = self.exe.arena_bytes as usize;
        let reused = self.arenas.lock().ok().and_then(|mut a| a.pop());
        match reused {
            Some(a) if a.len == want => Ok(a),
            _ => AlignedBuf::zeroed(want),
        }
    }

    fn return_arena(&self, arena: AlignedBuf) {
        if let Ok(mut a) = self.arenas.lock() {
            a.push(arena);
        }
    }

    /// A pointer for every buffer of the executable; per-run buffers outside the arena come from `spare` (an
    /// earlier run's, same size) or are allocated, and end in `dynamic`.
    #[allow(clippy::too_many_arguments)]
    fn pointers(
        &self,
        set: &WeightSet,
        given: &[TensorView<'_>],
        symbols: &HashMap<String, u64>,
        arena: Option<&AlignedBuf>,
        prepared: &[*mut u8],
        spare: &mut Vec<AlignedBuf>,
        dynamic: &mut Vec<AlignedBuf>,
        mut results: Option<&mut HashMap<BufferId, Tensor>>,
    ) -> Result<Vec<*mut u8>, RunError> {
        let mut out = Vec::with_capacity(self.exe.buffers.len());
        for (i, info) in self.exe.buffers.iter().enumerate() {
            let p = match &info.home {
                Home::Input(k) => match given.get(*k) {
                    Some(t) => t.as_bytes().as_ptr().cast_mut(),
                    None => std::ptr::null_mut(),
                },
                Home::Weight(name) => match set.weights.get(name) {
                    Some(t) => t.as_bytes().as_ptr().cast_mut(),
                    None => return Err(RunError::Weights(format!("weight `{name}` is not bound"))),
                },
                Home::Constant(t) => t.as_bytes().as_ptr().cast_mut(),
                Home::Prepared(k) => match (set.prepared.get(*k), prepared.get(*k)) {
                    (Some(t), _) => t.as_bytes().as_ptr().cast_mut(),
                    (None, Some(&p)) => p,
                    (None, None) => std::ptr::null_mut(),
                },
                Home::Arena(offset) => match arena {
                    // SAFETY: plan-memory placed the buffer inside the arena.
                    Some(a) if (*offset as usize) <= a.len => unsafe { a.as_ptr().add(*offset as usize) },
                    _ => std::ptr::null_mut(),
                },
                Home::Dynamic => {
                    self.dynamic_pointer(BufferId(i as u32), symbols, spare, dynamic, results.as_deref_mut())?
                }
            };
            out.push(self.or_empty(BufferId(i as u32), p, symbols));
        }
        Ok(out)
    }

    /// Memory for per-run buffer `id` when this run's symbols size it (null while a data-dependent one is
    /// unbound): a graph output is the tensor returned to the caller; anything else a buffer of `spare` (an
    /// earlier run's, same size) or a fresh one, kept in `dynamic` for the run.
    fn dynamic_pointer(
        &self,
        id: BufferId,
        symbols: &HashMap<String, u64>,
        spare: &mut Vec<AlignedBuf>,
        dynamic: &mut Vec<AlignedBuf>,
        results: Option<&mut HashMap<BufferId, Tensor>>,
    ) -> Result<*mut u8, RunError> {
        let Ok(dims) = self.exe.dims(id, symbols) else { return Ok(std::ptr::null_mut()) };
        let is_result = self.exe.outputs.iter().any(|(_, b)| *b == id);
        match results {
            Some(results) if is_result => {
                // The returned tensor itself: no copy at the end of the run.
                let mut t =
                    Tensor::try_zeros(self.exe.buffers[id.0 as usize].ty.dtype, dims).map_err(RunError::Memory)?;
                // SAFETY: steps write this buffer only with values of its dtype (bools as 0 or 1); the tensor's
                // heap storage does not move when the tensor moves into the map.
                let bytes = unsafe { t.as_bytes_mut() };
                advise_huge_pages(bytes);
                let p = bytes.as_mut_ptr();
                results.insert(id, t);
                Ok(p)
            }
            _ => {
                let len = self.bytes(id, &dims);
                let buf = match spare.iter().position(|b| b.len == len) {
                    Some(k) => spare.swap_remove(k),
                    None => AlignedBuf::zeroed(len)?,
                };
                let p = buf.as_ptr();
                dynamic.push(buf);
                Ok(p)
            }
        }
    }

    /// `p`, or for an empty buffer a zeroed block: kernels read operands at clamped indices, and the clamped read
    /// of an empty operand (a concat's empty past, never selected) must still be a valid address.
    fn or_empty(&self, id: BufferId, p: *mut u8, symbols: &HashMap<String, u64>) -> *mut u8 {
        let empty = match self.exe.buffers[id.0 as usize].ty.shape.num_elements() {
            Some(n) => n == 0,
            None => self.exe.dims(id, symbols).is_ok_and(|d| d.contains(&0)),
        };
        if empty && !p.is_null() { EMPTY_BUFFER.0.as_ptr().cast_mut() } else { p }
    }

    /// Takes the results of data-dependent extent a step produced: binds the symbols of each one's declared type
    /// to its extents (checking every other dim), keeps the tensor as the buffer's memory (a graph output is
    /// returned as it is), derives the dims that depend on the new symbols, and sizes the per-run buffers they
    /// determine now.
    fn adopt(&self, produced: Vec<(BufferId, Tensor)>, run: &mut LateRun<'_>) -> Result<(), RunError> {
        for (b, mut t) in produced {
            crate::bind::bind_result(&self.exe, b, t.dtype(), t.shape(), run.symbols)?;
            let at = run.ptrs[b.0 as usize];
            if !at.is_null() {
                // A result whose extent was known (`unique`'s inverse): its buffer has memory already.
                let bytes = t.as_bytes();
                // SAFETY: `bind_result` checked the extents, so the buffer holds exactly these bytes.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len()) };
                continue;
            }
            let p = if t.is_empty() {
                EMPTY_BUFFER.0.as_ptr().cast_mut()
            } else {
                // SAFETY: later steps only read this buffer; the heap storage stays put while the tensor moves.
                unsafe { t.as_bytes_mut() }.as_mut_ptr()
            };
            run.ptrs[b.0 as usize] = p;
            if self.exe.outputs.iter().any(|(_, o)| *o == b) {
                run.results.insert(b, t);
            } else {
                run.late.push(t);
            }
        }
        for (i, info) in self.exe.buffers.iter().enumerate() {
            if run.ptrs[i].is_null() && info.home == Home::Dynamic {
                let id = BufferId(i as u32);
                let p = self.dynamic_pointer(id, run.symbols, run.spare, run.dynamic, Some(run.results))?;
                run.ptrs[i] = self.or_empty(id, p, run.symbols);
            }
        }
        Ok(())
    }

    fn step(
        &self,
        set: &WeightSet,
        step: &Step,
        ptrs: Ptrs<'_>,
        symbols: &HashMap<String, u64>,
        sym_values: &[Result<Vec<i64>, RunError>],
    ) -> Result<Vec<(BufferId, Tensor)>, RunError> {
        let done = |r: Result<(), RunError>| r.map(|()| Vec::new());
        match step {
            Step::Kernel { kernel, args } => done(self.launch(*kernel, args, ptrs, symbols, sym_values)),
            Step::Library { op, inputs, output, epilogue } => {
                self.library(set, op, inputs, *output, ptrs, symbols)?;
                match epilogue {
                    Some(e) => self.step(set, e, ptrs, symbols, sym_values),
                    None => Ok(Vec::new()),
                }
            }
            Step::Routine { routine, inputs, outputs, node } if routine.is_data_dependent() => {
                let dims = inputs
                    .iter()
                    .map(|&b| self.exe.dims(b, symbols).map_err(RunError::Backend))
                    .collect::<Result<Vec<_>, _>>()?;
                let views =
                    inputs.iter().zip(&dims).map(|(&b, d)| self.view_at(b, d, ptrs)).collect::<Result<Vec<_>, _>>()?;
                let results = kiln_ir::interp::data_dependent(&routine.op(), &views)
                    .map_err(|e| RunError::Op(format!("{node}: {e}")))?;
                if results.len() != outputs.len() {
                    return Err(RunError::Backend(format!(
                        "{node}: {} results for {} buffers",
                        results.len(),
                        outputs.len()
                    )));
                }
                Ok(outputs.iter().copied().zip(results).collect())
            }
            Step::Routine { routine, inputs, outputs, node } => {
                done(self.routine(set, routine, inputs, outputs, node, ptrs, symbols))
            }
            Step::Interp { op, inputs, outputs, node } => {
                self.host_step(None, op, inputs, outputs, node, ptrs, symbols)
            }
            Step::Region { op, bodies, inputs, outputs, node } => {
                self.region(op, bodies, inputs, outputs, node, ptrs, symbols)
            }
            Step::Backend { backend, op, inputs, outputs, node } => {
                self.host_step(Some(backend), op, inputs, outputs, node, ptrs, symbols)
            }
            Step::Copy { src, dst } => {
                let dims = self.exe.dims(*src, symbols).map_err(RunError::Backend)?;
                let n = self.bytes(*src, &dims);
                let (s, d) = (ptrs.0[src.0 as usize], ptrs.0[dst.0 as usize]);
                if s != d && n > 0 {
                    // SAFETY: both buffers hold `n` bytes; `copy` tolerates overlap.
                    unsafe { std::ptr::copy(s, d, n) };
                }
                Ok(Vec::new())
            }
        }
    }

    /// Runs a library routine (LSTM, GRU, top_k, dynamic_quantize, ...) on its buffers in place.
    #[allow(clippy::too_many_arguments)]
    fn routine(
        &self,
        set: &WeightSet,
        routine: &Routine,
        inputs: &[BufferId],
        outputs: &[BufferId],
        node: &str,
        ptrs: Ptrs<'_>,
        symbols: &HashMap<String, u64>,
    ) -> Result<(), RunError> {
        let dims = |b: BufferId| self.exe.dims(b, symbols).map_err(RunError::Backend);
        let len = |b: BufferId| -> Result<usize, RunError> { Ok(dims(b)?.iter().product()) };
        // SAFETY: `read` and `write` are used only on buffers that hold `len` f32s (each routine's f32 operands and
        // results, their types checked when the program was built and verified; the arms below view the other
        // dtypes themselves); results never overlap operands (`Overlap::Never` in the verifier).
        let read = |b: BufferId| -> Result<&[f32], RunError> { Ok(unsafe { f32_view(ptrs, b, len(b)?) }) };
        // SAFETY: as above; each result buffer is distinct, and borrowed mutably once.
        let write = |b: BufferId| -> Result<&mut [f32], RunError> {
            let n = len(b)?;
            Ok(if n == 0 {
                &mut []
            } else {
                unsafe { std::slice::from_raw_parts_mut(ptrs.0[b.0 as usize].cast::<f32>(), n) }
            })
        };
        let fail = |e: library::LibraryError| RunError::Op(format!("{node}: {e}"));
        let par = Par { threads: self.run_workers() };
        match (routine, inputs, outputs) {
            (Routine::Lstm(l), &[x, w, r, b, h0, c0], &[y, yh, yc]) => {
                let shape = library::RnnShape::new(&dims(x)?, l.hidden_size, l.direction).map_err(fail)?;
                let packed = set.recurrent.get(&(w, r)).map(|p| p.as_ref());
                let (x, w, r, b, h0, c0) = (read(x)?, read(w)?, read(r)?, read(b)?, read(h0)?, read(c0)?);
                let (y, yh, yc) = (write(y)?, write(yh)?, write(yc)?);
                library::lstm_f32(l, &shape, packed, x, w, r, b, h0, c0, y, yh, yc, par).map_err(fail)
            }
            (Routine::Gru(g), &[x, w, r, b, h0], &[y, yh]) => {
                let shape = library::RnnShape::new(&dims(x)?, g.hidden_size, g.direction).map_err(fail)?;
                let packed = set.recurrent.get(&(w, r)).map(|p| p.as_ref());
                let (x, w, r, b, h0) = (read(x)?, read(w)?, read(r)?, read(b)?, read(h0)?);
                let (y, yh) = (write(y)?, write(yh)?);
                library::gru_f32(g, &shape, packed, x, w, r, b, h0, y, yh, par).map_err(fail)
            }
            (Routine::TopK(t), &[x], &[values, indices]) => {
                let (shape, x) = (dims(x)?, read(x)?);
                let n = len(values)?;
                if n == 0 {
                    return Ok(());
                }
                // SAFETY: the results are an f32 and an i64 buffer of `n` elements each (their declared types),
                // distinct from the operand and from each other.
                let (values, indices) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(ptrs.0[values.0 as usize].cast::<f32>(), n),
                        std::slice::from_raw_parts_mut(ptrs.0[indices.0 as usize].cast::<i64>(), n),
                    )
                };
                library::top_k_f32(t, x, &shape, values, indices).map_err(fail)
            }
            (Routine::RoiAlign(a), &[x, rois, idx], &[out]) => {
                let (xd, n) = (dims(x)?, len(idx)?);
                let (x, rois, out) = (read(x)?, read(rois)?, write(out)?);
                // SAFETY: the batch indices are an i64 buffer of `n` elements (the routine's declared dtypes).
                let idx: &[i64] = if n == 0 {
                    &[]
                } else {
                    unsafe { std::slice::from_raw_parts(ptrs.0[idx.0 as usize].cast::<i64>(), n) }
                };
                kiln_ir::interp::roi_align_f32(a, x, &xd, rois, idx, out)
                    .map_err(|e| RunError::Op(format!("{node}: {e}")))
            }
            (Routine::DynamicQuantize, &[x], &[y, scale, zero]) => {
                let x = read(x)?;
                let n = x.len();
                // SAFETY: the result `y` is a u8 buffer of `x`'s `n` elements (the op's type rule, verified), distinct
                // from the operand.
                let y: &mut [u8] = if n == 0 {
                    &mut []
                } else {
                    unsafe { std::slice::from_raw_parts_mut(ptrs.0[y.0 as usize].cast::<u8>(), n) }
                };
                let (s, z) = library::dynamic_quantize_u8(x, y, par).map_err(fail)?;
                // SAFETY: the scale and the zero point are an f32 and a u8 scalar buffer (one element each),
                // distinct from the others; arena slots need not be aligned for an f32, hence the unaligned write.
                unsafe {
                    ptrs.0[scale.0 as usize].cast::<f32>().write_unaligned(s);
                    ptrs.0[zero.0 as usize].cast::<u8>().write(z);
                }
                Ok(())
            }
            (Routine::GridSample(g), &[x, grid], &[out]) => {
                let (xd, gd) = (dims(x)?, dims(grid)?);
                let (x, grid, out) = (read(x)?, read(grid)?, write(out)?);
                kiln_ir::interp::grid_sample_f32(g, x, &xd, grid, &gd, out)
                    .map_err(|e| RunError::Op(format!("{node}: {e}")))
            }
            _ => Err(RunError::Backend(format!(
                "{node}: a routine with {} operands and {} results",
                inputs.len(),
                outputs.len()
            ))),
        }
    }

    /// Runs `op` outside the compiled code — on the reference interpreter (`backend` `None`) or on a registry
    /// backend — over copies of its operands, and copies its checked results into their buffers.
    #[allow(clippy::too_many_arguments)]
    fn host_step(
        &self,
        backend: Option<&str>,
        op: &kiln_ir::Op,
        inputs: &[BufferId],
        outputs: &[BufferId],
        node: &str,
        ptrs: Ptrs<'_>,
        symbols: &HashMap<String, u64>,
    ) -> Result<Vec<(BufferId, Tensor)>, RunError> {
        let (operands, expected) = self.host_operands(inputs, outputs, ptrs, symbols)?;
        let results = self.placed.run(backend, op, node, &operands, &expected)?;
        self.write_results(outputs, results, &expected, node, ptrs)
    }

    /// Copies of the operands `inputs` of a step run outside the compiled code, and what its `outputs` must be
    /// (dtype, and extents unless the data decide them).
    #[allow(clippy::type_complexity)]
    fn host_operands(
        &self,
        inputs: &[BufferId],
        outputs: &[BufferId],
        ptrs: Ptrs<'_>,
        symbols: &HashMap<String, u64>,
    ) -> Result<(Vec<Tensor>, Vec<(kiln_ir::DType, Option<Vec<usize>>)>), RunError> {
        let operands = inputs.iter().map(|&b| self.tensor_at(b, ptrs, symbols)).collect::<Result<Vec<_>, _>>()?;
        let mut expected = Vec::with_capacity(outputs.len());
        for &b in outputs {
            expected.push((self.exe.buffers[b.0 as usize].ty.dtype, crate::bind::known_dims(&self.exe, b, symbols)?));
        }
        Ok((operands, expected))
    }

    /// Runs control-flow node `node` (`op`, an `if` or a `loop`) by the interpreter's own driver with its bodies
    /// run by the compiled programs `bodies` (indices into `regions`), over copies of its operands, and copies
    /// its checked results into their buffers.
    #[allow(clippy::too_many_arguments)]
    fn region(
        &self,
        op: &kiln_ir::Op,
        bodies: &[usize],
        inputs: &[BufferId],
        outputs: &[BufferId],
        node: &str,
        ptrs: Ptrs<'_>,
        symbols: &HashMap<String, u64>,
    ) -> Result<Vec<(BufferId, Tensor)>, RunError> {
        let (operands, expected) = self.host_operands(inputs, outputs, ptrs, symbols)?;
        let operands: Vec<&Tensor> = operands.iter().collect();
        let mut run = |k: usize, args: &[&Tensor]| -> Result<Vec<Tensor>, String> {
            let body = bodies.get(k).and_then(|&b| self.regions.get(b)).ok_or("the region has no such body")?;
            body.run_body(args).map_err(|e| e.to_string())
        };
        let results = match op {
            kiln_ir::Op::If(_) => kiln_ir::interp::run_if(&operands, &mut run),
            kiln_ir::Op::Loop(l) => kiln_ir::interp::run_loop(l, &operands, &mut run),
            other => Err(format!("`{}` has no compiled bodies", other.mnemonic())),
        }
        .map_err(|e| RunError::Op(format!("{node}: {e}")))?;
        crate::placement::check_results(node, "its compiled bodies", &results, &expected)?;
        self.write_results(outputs, results, &expected, node, ptrs)
    }

    /// Runs this program (a region body) on its inputs by position; returns its results in order.
    fn run_body(&self, args: &[&Tensor]) -> Result<Vec<Tensor>, RunError> {
        if args.len() != self.exe.inputs.len() {
            return Err(RunError::Backend(format!(
                "a region body of {} inputs got {} arguments",
                self.exe.inputs.len(),
                args.len()
            )));
        }
        let views: Vec<(&str, TensorView<'_>)> =
            self.exe.inputs.iter().zip(args).map(|((name, _), t)| (name.as_str(), t.view())).collect();
        Ok(self.execute(&views, None)?.into_iter().map(|(_, t)| t).collect())
    }

    /// Copies `results` (checked against `expected`) into the buffers `outputs`; returns those of data-dependent
    /// extent, for the run to adopt.
    fn write_results(
        &self,
        outputs: &[BufferId],
        results: Vec<Tensor>,
        expected: &[(kiln_ir::DType, Option<Vec<usize>>)],
        node: &str,
        ptrs: Ptrs<'_>,
    ) -> Result<Vec<(BufferId, Tensor)>, RunError> {
        let mut late = Vec::new();
        for ((&b, t), (_, dims)) in outputs.iter().zip(results).zip(expected) {
            let Some(dims) = dims else {
                late.push((b, t));
                continue;
            };
            let bytes = t.as_bytes();
            if bytes.len() != self.bytes(b, dims) {
                return Err(RunError::Op(format!("{node}: a result has the wrong byte count")));
            }
            // SAFETY: the destination buffer holds exactly `bytes.len()` bytes (checked above) and does not
            // overlap the freshly computed result.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptrs.0[b.0 as usize], bytes.len()) };
        }
        Ok(late)
    }

    /// A borrowed view of buffer `b`, whose extents this run are `dims`.
    fn view_at<'p>(&self, b: BufferId, dims: &'p [usize], ptrs: Ptrs<'p>) -> Result<TensorView<'p>, RunError> {
        let n = self.bytes(b, dims);
        let p = ptrs.0[b.0 as usize];
        // SAFETY: the buffer holds `n` initialized bytes that no step writes while this step reads them.
        let bytes: &[u8] = if n == 0 { &[] } else { unsafe { std::slice::from_raw_parts(p, n) } };
        TensorView::new(self.exe.buffers[b.0 as usize].ty.dtype, dims, bytes).map_err(RunError::Backend)
    }

    /// A copy of buffer `b` as a tensor.
    fn tensor_at(&self, b: BufferId, ptrs: Ptrs<'_>, symbols: &HashMap<String, u64>) -> Result<Tensor, RunError> {
        let dims = self.exe.dims(b, symbols).map_err(RunError::Backend)?;
        let n = self.bytes(b, &dims);
        let p = ptrs.0[b.0 as usize];
        let bytes: &[u8] = if n == 0 {
            &[]
        } else {
            // SAFETY: the buffer holds `n` initialized bytes.
            unsafe { std::slice::from_raw_parts(p, n) }
        };
        Tensor::from_bytes(self.exe.buffers[b.0 as usize].ty.dtype, dims, bytes)
            .ok_or_else(|| RunError::Backend("a buffer has the wrong size".into()))
    }

    fn library(
        &self,
        set: &WeightSet,
        op: &LibraryOp,
        inputs: &[BufferId],
        output: BufferId,
        ptrs: Ptrs<'_>,
        symbols: &HashMap<String, u64>,
    ) -> Result<(), RunError> {
        let dims = |b: BufferId| self.exe.dims(b, symbols).map_err(RunError::Backend);
        if let LibraryOp::Gather(g) = op {
            let (dd, id) = (dims(inputs[0])?, dims(inputs[1])?);
            let index_dtype = self.exe.buffers[inputs[1].0 as usize].ty.dtype;
            let elem = self.exe.buffers[inputs[0].0 as usize].ty.dtype.size_bytes();
            return gather(
                g,
                ptrs.0[inputs[0].0 as usize],
                &dd,
                elem,
                ptrs.0[inputs[1].0 as usize],
                &id,
                index_dtype,
                ptrs.0[output.0 as usize],
            );
        }
        if let LibraryOp::MatMulInteger | LibraryOp::ConvInteger(_) = op {
            return self.integer_product(set, op, inputs, output, ptrs, symbols);
        }
        if let LibraryOp::Concat(c) = op {
            let elem = self.exe.buffers[output.0 as usize].ty.dtype.size_bytes();
            let parts = inputs
                .iter()
                .map(|&b| Ok((ptrs.0[b.0 as usize].cast_const(), dims(b)?)))
                .collect::<Result<Vec<_>, RunError>>()?;
            return concat(c, &parts, elem, ptrs.0[output.0 as usize], &dims(output)?);
        }
        // SAFETY: an f32 buffer of `n` elements; library operands never overlap the output.
        let f32s = |b: BufferId, dims: &[usize]| -> &[f32] { unsafe { f32_view(ptrs, b, dims.iter().product()) } };
        let out_dims = dims(output)?;
        let n: usize = out_dims.iter().product();
        let out: &mut [f32] = if n == 0 {
            &mut []
        } else {
            // SAFETY: the output buffer holds `n` f32s and no operand overlaps it (plan-memory never places a
            // library result over a live operand).
            unsafe { std::slice::from_raw_parts_mut(ptrs.0[output.0 as usize].cast::<f32>(), n) }
        };
        let par = Par { threads: self.run_workers() };
        // A conv's optional third operand.
        let bias =
            || -> Result<Option<&[f32]>, RunError> { inputs.get(2).map(|&b| Ok(f32s(b, &dims(b)?))).transpose() };
        let r = match op {
            LibraryOp::MatMul => {
                let (ad, bd) = (dims(inputs[0])?, dims(inputs[1])?);
                let rows: usize = ad[..ad.len().saturating_sub(1)].iter().product();
                match set.packed.get(&inputs[1]) {
                    Some(p) if ad.len() >= 2 && library::prefer_packed(rows, p.k(), p.n()) => {
                        library::matmul_packed_f32(f32s(inputs[0], &ad), rows, p, out, None, par)
                    }
                    _ if set.released.contains(&inputs[1]) => Err(library::LibraryError::Shape {
                        op: "matmul",
                        message: format!(
                            "the right operand was released once packed, but the packed path does not take {rows} \
                             rows (a kiln bug)"
                        ),
                    }),
                    _ => library::matmul_f32(f32s(inputs[0], &ad), &ad, f32s(inputs[1], &bd), &bd, out, None, par),
                }
            }
            LibraryOp::Conv(attrs) => {
                let (xd, wd, bias) = (dims(inputs[0])?, dims(inputs[1])?, bias()?);
                // The transformed weights serve every conv of this weight that Winograd computes; another conv
                // of the same weight (a stride-2 one, say: deduplicated constants are shared) runs directly.
                let spatial = out_dims.iter().skip(2).product::<usize>() as u64;
                let pays = library::winograd_applies(&wd, attrs) && library::winograd_pays(wd[1], wd[0], spatial);
                if let Some(wt) = set.winograd.get(&inputs[1]).filter(|_| pays) {
                    return library::conv_winograd_f32(f32s(inputs[0], &xd), &xd, wt, bias, attrs, out, &out_dims, par)
                        .map_err(|e| RunError::Op(e.to_string()));
                }
                library::conv_f32(
                    f32s(inputs[0], &xd),
                    &xd,
                    f32s(inputs[1], &wd),
                    &wd,
                    bias,
                    attrs,
                    out,
                    &out_dims,
                    None,
                    par,
                )
            }
            LibraryOp::ConvTranspose(attrs) => {
                let (xd, wd, bias) = (dims(inputs[0])?, dims(inputs[1])?, bias()?);
                library::conv_transpose_f32(
                    f32s(inputs[0], &xd),
                    &xd,
                    f32s(inputs[1], &wd),
                    &wd,
                    bias,
                    attrs,
                    out,
                    &out_dims,
                    par,
                )
            }
            LibraryOp::Pool(attrs) => {
                let xd = dims(inputs[0])?;
                library::pool_f32(f32s(inputs[0], &xd), &xd, attrs, out, &out_dims, par)
            }
            LibraryOp::Softmax { axis, log } => {
                let xd = dims(inputs[0])?;
                library::softmax_f32(f32s(inputs[0], &xd), &xd, *axis, *log, out, par)
            }
            // Gathers, concatenations and the integer products return before the f32 views are made.
            LibraryOp::Gather(_) | LibraryOp::Concat(_) | LibraryOp::MatMulInteger | LibraryOp::ConvInteger(_) => {
                Err(library::LibraryError::Unsupported { op: "gather", what: "an f32 view of its operands".into() })
            }
        };
        r.map_err(|e| RunError::Op(e.to_string()))
    }

    /// `matmul_integer` and `conv_integer`: 8-bit operands and zero points, an i32 result.
    fn integer_product(
        &self,
        set: &WeightSet,
        op: &LibraryOp,
        inputs: &[BufferId],
        output: BufferId,
        ptrs: Ptrs<'_>,
        symbols: &HashMap<String, u64>,
    ) -> Result<(), RunError> {
        let dims = |b: BufferId| self.exe.dims(b, symbols).map_err(RunError::Backend);
        let operand = |b: BufferId| -> Result<(library::Int8<'_>, Vec<usize>), RunError> {
            let d = dims(b)?;
            let n: usize = d.iter().product();
            let signed = match self.exe.buffers[b.0 as usize].ty.dtype {
                kiln_ir::DType::I8 => true,
                kiln_ir::DType::U8 => false,
                other => return Err(RunError::Backend(format!("an integer product's operand is {other}"))),
            };
            // SAFETY: an 8-bit buffer of `n` elements, only read here.
            let bytes = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(ptrs.0[b.0 as usize], n) } };
            Ok((library::Int8 { bytes, signed }, d))
        };
        let [a, b, az, bz] = inputs else {
            return Err(RunError::Backend(format!("an integer product with {} operands", inputs.len())));
        };
        let packed = set.packed_int8.get(&(*b, *bz)).filter(|_| matches!(op, LibraryOp::MatMulInteger));
        let ((a, ad), (b, bd), (az, _), (bz, _)) = (operand(*a)?, operand(*b)?, operand(*az)?, operand(*bz)?);
        let out_dims = dims(output)?;
        let n: usize = out_dims.iter().product();
        let out: &mut [i32] = if n == 0 {
            &mut []
        } else {
            // SAFETY: the output buffer holds `n` i32s and no operand overlaps it.
            unsafe { std::slice::from_raw_parts_mut(ptrs.0[output.0 as usize].cast::<i32>(), n) }
        };
        let par = Par { threads: self.run_workers() };
        if let Some(p) = packed {
            return library::matmul_integer_packed(a, &ad, az, p, out, par).map_err(|e| RunError::Op(e.to_string()));
        }
        match op {
            LibraryOp::ConvInteger(attrs) => match set.packed_conv_int8.get(&(inputs[1], inputs[3])) {
                Some(w) if w.shape() == bd.as_slice() => {
                    library::conv_integer_packed(a, &ad, az, w, attrs, out, &out_dims, par)
                }
                _ => library::conv_integer(a, &ad, b, &bd, az, bz, attrs, out, &out_dims, par),
            },
            _ => library::matmul_integer(a, &ad, b, &bd, az, bz, out, par),
        }
        .map_err(|e| RunError::Op(e.to_string()))
    }

    fn launch(
        &self,
        kernel: usize,
        args: &[BufferId],
        ptrs: Ptrs<'_>,
        symbols: &HashMap<String, u64>,
        sym_values: &[Result<Vec<i64>, RunError>],
    ) -> Result<(), RunError> {
        let launch: Vec<*mut u8> = args.iter().map(|b| ptrs.0[b.0 as usize]).collect();
        let syms = sym_values[kernel].as_ref().map_err(Clone::clone)?;
        match self.code.as_ref() {
            KernelCode::Native { entries, owner: _ } => {
                let (entry, info) = &entries[kernel];
                let launch = Ptrs(&launch);
                for (part, p) in info.parts.iter().enumerate() {
                    let extent = p.extent.eval(&|_| None, syms).map_err(RunError::Backend)?;
                    if extent <= 0 {
                        continue;
                    }
                    let work = (extent as u64).saturating_mul(p.cost_per_iteration.max(1));
                    let workers = self.run_workers();
                    let chunks = if p.parallel && workers > 1 && work >= MIN_PARALLEL_WORK {
                        (workers as i64 * 4).min(extent)
                    } else {
                        1
                    };
                    let run = |c: i64| {
                        let (begin, end) = (extent * c / chunks, extent * (c + 1) / chunks);
                        let l = launch;
                        // SAFETY: the entry was compiled for this kernel; `l` holds one pointer per launch
                        // argument and `syms` one value per symbol; chunks cover disjoint iterations of a
                        // parallel loop.
                        unsafe { entry(l.0.as_ptr(), syms.as_ptr(), part as i64, begin, end) };
                    };
                    if chunks == 1 {
                        run(0);
                    } else {
                        use rayon::prelude::*;
                        (0..chunks).into_par_iter().for_each(run);
                    }
                }
                Ok(())
            }
            KernelCode::Reference(kernels) => {
                let k = &kernels[kernel];
                let mut tensors = Vec::with_capacity(args.len());
                for (&b, (_, a)) in args.iter().zip(k.launch_args()) {
                    match a.role {
                        ArgRole::Output => {
                            let dims: Vec<usize> = a
                                .shape
                                .iter()
                                .map(|e| match e {
                                    Extent::Const(n) => *n as usize,
                                    Extent::Sym(s) => syms[*s] as usize,
                                })
                                .collect();
                            tensors.push(Tensor::try_zeros(a.dtype, dims).map_err(RunError::Memory)?);
                        }
                        _ => tensors.push(self.tensor_at(b, ptrs, symbols)?),
                    }
                }
                kiln_plan::kernel::eval(k, &mut tensors, syms).map_err(|e| RunError::Op(e.to_string()))?;
                for ((&b, (_, a)), t) in args.iter().zip(k.launch_args()).zip(&tensors) {
                    if a.role == ArgRole::Output {
                        let bytes = t.as_bytes();
                        // SAFETY: the output buffer holds exactly the kernel output's bytes.
                        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptrs.0[b.0 as usize], bytes.len()) };
                    }
                }
                Ok(())
            }
        }
    }
}

/// `gather` of rows: for each outer position and each index, one contiguous run of `inner` elements is copied.
/// Indices are i32 or i64, negative from the end; an index out of range is an error naming it.
#[allow(clippy::too_many_arguments)]
/// `axis` (negative counts from the end) of a rank-`rank` operand of `op`, or an error naming the op.
fn axis_of(op: &str, axis: i64, rank: usize) -> Result<usize, RunError> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if rank == 0 || !(0..rank as i64).contains(&a) {
        return Err(RunError::Op(format!("{op}: axis {axis} is out of range for rank {rank}")));
    }
    Ok(a as usize)
}

/// `concat` of `parts` (each a buffer and its dims) into `out` (dims `out_dims`), elements of `elem` bytes: per
/// position before the axis, each part's contiguous block copied into place. The dims are checked against one
/// another first, so every copy stays inside its buffers.
fn concat(
    c: &kiln_ir::op::Concat,
    parts: &[(*const u8, Vec<usize>)],
    elem: usize,
    out: *mut u8,
    out_dims: &[usize],
) -> Result<(), RunError> {
    let rank = out_dims.len();
    let axis = axis_of("concat", c.axis, rank)?;
    let mut along = 0;
    for (_, d) in parts {
        let same = d.len() == rank && d.iter().zip(out_dims).enumerate().all(|(i, (a, b))| i == axis || a == b);
        if !same {
            return Err(RunError::Op(format!(
                "concat: an operand of dims {d:?} does not fit a result of {out_dims:?}"
            )));
        }
        along += d[axis];
    }
    if along != out_dims[axis] {
        return Err(RunError::Op(format!(
            "concat: the operands give {along} along axis {axis}, not {}",
            out_dims[axis]
        )));
    }
    let outer: usize = out_dims[..axis].iter().product();
    let inner = out_dims[axis + 1..].iter().product::<usize>() * elem;
    let row = out_dims[axis] * inner;
    let mut at = 0;
    for (src, d) in parts {
        let block = d[axis] * inner;
        if block > 0 {
            for o in 0..outer {
                // SAFETY: part `src` holds `outer · block` bytes and the result `outer · row` (dims checked above);
                // block `o` of the part lands at `o · row + at`, inside the result, which no operand overlaps.
                unsafe { std::ptr::copy_nonoverlapping(src.add(o * block), out.add(o * row + at), block) };
            }
        }
        at += block;
    }
    Ok(())
}

fn gather(
    g: &kiln_ir::op::Gather,
    data: *const u8,
    data_dims: &[usize],
    elem: usize,
    indices: *const u8,
    index_dims: &[usize],
    index_dtype: kiln_ir::DType,
    out: *mut u8,
) -> Result<(), RunError> {
    let axis = axis_of("gather", g.axis, data_dims.len())?;
    let outer: usize = data_dims[..axis].iter().product();
    let n = data_dims[axis];
    let row = data_dims[axis + 1..].iter().product::<usize>() * elem;
    let count: usize = index_dims.iter().product();
    let mut rows = Vec::with_capacity(count);
    for k in 0..count {
        // SAFETY: the index buffer holds `count` elements of `index_dtype`.
        let i = unsafe {
            match index_dtype {
                kiln_ir::DType::I32 => i64::from(indices.cast::<i32>().add(k).read_unaligned()),
                kiln_ir::DType::I64 => indices.cast::<i64>().add(k).read_unaligned(),
                d => return Err(RunError::Op(format!("gather: indices must be i32 or i64, not {d}"))),
            }
        };
        rows.push(kiln_ir::interp::resolve_index(i, n, axis).map_err(|e| RunError::Op(format!("gather: {e}")))?);
    }
    if row == 0 {
        return Ok(());
    }
    for o in 0..outer {
        for (k, &r) in rows.iter().enumerate() {
            // SAFETY: `r < n`, so the source row lies inside the data buffer of `outer * n * row` bytes; the
            // destination row lies inside the output of `outer * count * row` bytes; they do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(data.add((o * n + r) * row), out.add((o * count + k) * row), row);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Programs of one thread count share one pool; another count gets its own; a pool lives while a program
    /// uses it.
    #[test]
    fn programs_share_one_pool_per_thread_count() {
        let program = |threads| {
            CpuProgram::new(Executable::empty("empty"), KernelCode::Reference(Vec::new()), threads).expect("binds")
        };
        let (a, b, c) = (program(3), program(3), program(5));
        assert!(Arc::ptr_eq(&a.pool, &b.pool), "one pool for every 3-thread program");
        assert!(!Arc::ptr_eq(&a.pool, &c.pool));
        assert_eq!(a.pool.current_num_threads(), 3);
        let weak = Arc::downgrade(&c.pool);
        drop(c);
        assert!(weak.upgrade().is_none(), "the 5-thread pool ends with its last program");
        let d = program(3);
        assert!(Arc::ptr_eq(&a.pool, &d.pool));
    }

    /// An adaptive program measures the pool first, then serial, alternates for its trial runs, then keeps to the
    /// faster way but for one probe run in `ADAPTIVE_PROBE`; its estimates follow new timings.
    #[test]
    fn adaptive_runs_take_the_faster_way_and_probe_the_other() {
        let p = CpuProgram::new(Executable::empty("empty"), KernelCode::Reference(Vec::new()), 2).expect("binds");
        let us = std::time::Duration::from_micros;
        assert!(!p.choose_serial(), "the pool is measured first");
        p.record_run(false, us(50));
        assert!(p.choose_serial(), "then serial");
        p.record_run(true, us(10));
        let serial: Vec<bool> = (0..2 * ADAPTIVE_PROBE).map(|_| p.choose_serial()).collect();
        let trials = (ADAPTIVE_TRIALS - 2) as usize;
        assert!(serial[..trials].iter().step_by(2).all(|s| !s), "the trial runs alternate");
        assert!(serial[1..trials].iter().step_by(2).all(|s| *s), "the trial runs alternate");
        let pool = serial[trials..].iter().filter(|s| !**s).count();
        assert_eq!(pool, 2, "one probe of the pool per ADAPTIVE_PROBE runs");
        for _ in 0..16 {
            p.record_run(true, us(500));
        }
        // (Run 2 + 2·ADAPTIVE_PROBE is no probe.)
        assert!(!p.choose_serial(), "slow serial runs send it back to the pool");
    }

    /// `concat` copies each operand's blocks into place on any axis and element size (an empty operand adds
    /// nothing); operand dims that do not fit the result are an error, never a copy out of bounds.
    #[test]
    fn concat_copies_blocks_and_checks_dims() {
        let a: Vec<u16> = (0..12).collect(); // [2, 3, 2]
        let b: Vec<u16> = (100..104).collect(); // [2, 1, 2]
        let empty: Vec<u16> = Vec::new(); // [2, 0, 2]
        let mut out = vec![0u16; 16];
        let parts = [
            (a.as_ptr().cast::<u8>(), vec![2, 3, 2]),
            (empty.as_ptr().cast::<u8>(), vec![2, 0, 2]),
            (b.as_ptr().cast::<u8>(), vec![2, 1, 2]),
        ];
        let c = kiln_ir::op::Concat { axis: -2 };
        concat(&c, &parts, 2, out.as_mut_ptr().cast(), &[2, 4, 2]).expect("concatenates");
        assert_eq!(out, [0, 1, 2, 3, 4, 5, 100, 101, 6, 7, 8, 9, 10, 11, 102, 103]);
        for (dims, axis) in [(vec![2, 5, 2], 1), (vec![2, 4, 3], 1), (vec![2, 4, 2], 3)] {
            let err = concat(&kiln_ir::op::Concat { axis }, &parts, 2, out.as_mut_ptr().cast(), &dims);
            assert!(err.is_err(), "{dims:?} axis {axis}");
        }
    }
}
