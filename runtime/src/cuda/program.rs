//! [`GpuProgram`]: an executable's [`DevicePlan`] bound to a [`Gpu`] with its weights resident, run on named
//! inputs.
//!
//! Buffers live where the executable's plan puts them, on the device: weights, constants and prepared weights
//! are uploaded (or computed there) once, when the program is made; a run gets one arena for every planned
//! intermediate (kept between runs), a device copy of each input, and a fresh allocation for each output and
//! unplanned value. Steps are queued in order on the device's one queue; the outputs are copied back at the end.
//! Runs of one program take turns (they share the arena).
//!
//! Step by step: a kernel launches on the grid its [`PtxKernelInfo::launch_geometry`] gives for this run's
//! symbols; a matmul is one GEMM when the batches fold into rows or fall at regular strides (broadcast batches
//! at stride 0), one GEMM per batch otherwise; a one-group conv pre-fills its output with the bias (or zeros),
//! writes the im2col matrix of every image into a scratch buffer (unless the input already is it) and
//! accumulates one GEMM per image; a gather checks its indices on the host before its kernel runs, so an index
//! out of range is the interpreter's error and not a clamped read; an interpreter fallback copies its operands
//! to the host, runs `eval_op` there and copies its results back.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::library::batch_plan;
use kiln_ir::{DType, Tensor, TensorView};
use kiln_plan::device::{DevicePlan, DeviceStep, PtxKernelInfo, PtxParam, conv_gemm_shape};
use kiln_plan::exec::{BufferId, Executable, Home};

use super::gpu::{DevPtr, DeviceBuffer, Gemm, Gpu};
use crate::RunError;

/// A program resident on a device. See the module docs.
pub struct GpuProgram<G: Gpu> {
    gpu: Arc<G>,
    exe: Executable,
    plan: DevicePlan,
    infos: Vec<PtxKernelInfo>,
    /// Device address of each weight, constant and prepared buffer.
    resident: HashMap<BufferId, DevPtr>,
    /// What `resident` owns, freed on drop.
    owned: Vec<DevPtr>,
    /// The arena, reused by run after run (one run at a time).
    arena: Mutex<Option<DevPtr>>,
    /// The registry backends the plan's host steps name.
    placed: crate::placement::PlacedBackends,
}

impl<G: Gpu> std::fmt::Debug for GpuProgram<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuProgram({} on {})", self.exe.name, self.gpu.name())
    }
}

fn backend(message: impl std::fmt::Display) -> RunError {
    RunError::Backend(format!("cuda: {message}"))
}

impl<G: Gpu> GpuProgram<G> {
    /// Binds `exe` (whose weights it uploads) and `plan` to `gpu`, whose loaded module holds `infos.len()`
    /// kernels in [`DevicePlan::kernels`] order, and runs the plan's prepare steps. A plan that places nodes on
    /// other backends needs [`GpuProgram::with_backends`].
    pub fn new(
        gpu: Arc<G>,
        exe: Executable,
        plan: DevicePlan,
        infos: Vec<PtxKernelInfo>,
    ) -> Result<GpuProgram<G>, RunError> {
        GpuProgram::with_backends(gpu, exe, plan, infos, &crate::registry::BackendRegistry::new())
    }

    /// [`GpuProgram::new`], with the backends the plan's host steps name taken from `registry`.
    pub fn with_backends(
        gpu: Arc<G>,
        exe: Executable,
        plan: DevicePlan,
        infos: Vec<PtxKernelInfo>,
        registry: &crate::registry::BackendRegistry,
    ) -> Result<GpuProgram<G>, RunError> {
        plan.check_references(exe.buffers.len(), infos.len()).map_err(backend)?;
        let placed = crate::placement::PlacedBackends::resolve(&plan.placed_nodes(), registry)?;
        let mut program = GpuProgram {
            gpu,
            exe,
            plan,
            infos,
            resident: HashMap::new(),
            owned: Vec::new(),
            arena: Mutex::new(None),
            placed,
        };
        program.upload_weights()?;
        Ok(program)
    }

    /// The executable.
    pub fn executable(&self) -> &Executable {
        &self.exe
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<G> {
        &self.gpu
    }

    /// Times `repeats` device-to-device copies of `bytes` after one warm-up: bytes read plus written per second,
    /// in GB/s.
    pub fn copy_bandwidth_gbps(&self, bytes: usize, repeats: usize) -> Result<f64, RunError> {
        let gpu = self.gpu.as_ref();
        let (src, dst) = (DeviceBuffer::new(gpu, bytes)?, DeviceBuffer::new(gpu, bytes)?);
        // SAFETY: both allocations hold `bytes` bytes.
        unsafe {
            gpu.zero(src.ptr(), bytes)?;
            gpu.copy(dst.ptr(), src.ptr(), bytes)?;
        }
        gpu.synchronize()?;
        let t = std::time::Instant::now();
        for _ in 0..repeats {
            // SAFETY: as above.
            unsafe { gpu.copy(dst.ptr(), src.ptr(), bytes)? };
        }
        gpu.synchronize()?;
        Ok((2 * bytes * repeats) as f64 / t.elapsed().as_secs_f64() / 1e9)
    }

    fn own(&mut self, bytes: usize) -> Result<DevPtr, RunError> {
        let p = self.gpu.alloc(bytes.max(1))?;
        self.owned.push(p);
        Ok(p)
    }

    fn upload_weights(&mut self) -> Result<(), RunError> {
        let no_symbols = HashMap::new();
        let mut by_name: HashMap<String, DevPtr> = HashMap::new();
        for (i, info) in self.exe.buffers.clone().iter().enumerate() {
            let id = BufferId(i as u32);
            let tensor: Arc<Tensor> = match &info.home {
                Home::Weight(name) => {
                    if let Some(&p) = by_name.get(name) {
                        self.resident.insert(id, p);
                        continue;
                    }
                    let t = self.exe.weights.get(name).ok_or_else(|| {
                        RunError::Weights(format!("weight `{name}` is missing (the program reads it)"))
                    })?;
                    Arc::clone(t)
                }
                Home::Constant(t) => Arc::clone(t),
                Home::Prepared(_) => {
                    let dims = self.exe.dims(id, &no_symbols).map_err(backend)?;
                    let bytes = dims.iter().product::<usize>() * info.ty.dtype.size_bytes();
                    let p = self.own(bytes)?;
                    self.resident.insert(id, p);
                    continue;
                }
                _ => continue,
            };
            if tensor.dtype() != info.ty.dtype {
                return Err(RunError::Weights(format!(
                    "a weight is {} where the program expects {}",
                    tensor.dtype(),
                    info.ty.dtype
                )));
            }
            let bytes = tensor.as_bytes();
            let p = self.own(bytes.len())?;
            // SAFETY: `p` holds `bytes.len()` bytes.
            unsafe { self.gpu.upload(p, bytes)? };
            if let Home::Weight(name) = &info.home {
                by_name.insert(name.clone(), p);
            }
            self.resident.insert(id, p);
        }
        if !self.plan.prepare.is_empty() {
            let mut addrs: Vec<DevPtr> = (0..self.exe.buffers.len())
                .map(|i| self.resident.get(&BufferId(i as u32)).copied().unwrap_or(DevPtr(0)))
                .collect();
            let steps = self.plan.prepare.clone();
            let mut scratch = Vec::new();
            let ran = self.run_steps(&self.gpu, &steps, &mut addrs, &mut no_symbols.clone(), &mut scratch);
            free_after_queue(self.gpu.as_ref(), scratch);
            ran?;
        }
        // Weights are uploaded on the program's queue; runs on other queues read them.
        self.gpu.synchronize()
    }

    /// Runs the program on `inputs` (by name) on the program's own queue, with its cached arena; outputs come in
    /// order.
    pub fn run(&self, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
        self.run_views(&crate::bind::views(inputs))
    }

    /// Runs on borrowed inputs (by name), uploaded straight from their memory.
    pub fn run_views(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<(String, Tensor)>, RunError> {
        let mut arena = self.arena.lock().unwrap_or_else(|e| e.into_inner());
        if arena.is_none() {
            *arena = Some(self.gpu.alloc((self.exe.arena_bytes as usize).max(1))?);
        }
        self.queue_run(self.gpu.as_ref(), inputs, *arena)?.wait()
    }

    /// Queues a run on `gpu` (a handle on the program's device, [`Gpu::fork`]ed for a queue of its own) with an
    /// arena of its own, and returns at once (unless a step must come back to the host: an interpreter fallback,
    /// a gather's index check). The run's memory is freed once it has completed.
    pub fn enqueue(&self, gpu: &G, inputs: &BTreeMap<String, Tensor>) -> Result<PendingRun<G>, RunError> {
        self.queue_run(gpu, &crate::bind::views(inputs), None)
    }

    fn queue_run(
        &self,
        gpu: &G,
        inputs: &[(&str, TensorView<'_>)],
        arena: Option<DevPtr>,
    ) -> Result<PendingRun<G>, RunError> {
        let given = crate::bind::check_inputs(&self.exe, inputs)?;
        let mut symbols = crate::bind::bind_symbols(&self.exe, &given)?;
        // Until the run is queued, the run's memory is freed here if anything fails.
        let mut pending =
            PendingRun { gpu: gpu.clone(), event: None, outputs: Vec::new(), owned: Vec::new(), done: false };
        let arena = match arena {
            Some(p) => p,
            None => {
                let p = gpu.alloc((self.exe.arena_bytes as usize).max(1))?;
                pending.owned.push(p);
                p
            }
        };
        let mut addrs = self.place(gpu, &given, &symbols, arena, &mut pending.owned)?;
        self.run_steps(gpu, &self.plan.steps, &mut addrs, &mut symbols, &mut pending.owned)?;
        for (name, b) in &self.exe.outputs {
            let dims = self.exe.dims(*b, &symbols).map_err(backend)?;
            let dtype = self.exe.buffers[b.0 as usize].ty.dtype;
            let bytes = dims.iter().product::<usize>() * dtype.size_bytes();
            let host = if bytes == 0 {
                None
            } else {
                let mut h = gpu.alloc_host(bytes)?;
                // SAFETY: the buffer holds `bytes` for these dims; `pending` keeps `h` until the copy completed.
                unsafe { gpu.download_async(addrs[b.0 as usize], &mut h, bytes)? };
                Some(h)
            };
            pending.outputs.push((name.clone(), dtype, dims, host));
        }
        pending.event = Some(gpu.record()?);
        Ok(pending)
    }

    /// Every buffer's device address for a run: inputs uploaded and outputs and unplanned values allocated (added
    /// to `owned`), planned values in `arena`, weights where they reside. A value whose extent depends on a
    /// data-dependent dim (`non_zero`'s count) gets no memory yet (address 0): the step that binds the dim
    /// allocates it (`GpuProgram::adopt`).
    fn place(
        &self,
        gpu: &G,
        given: &[TensorView<'_>],
        symbols: &HashMap<String, u64>,
        arena: DevPtr,
        owned: &mut Vec<DevPtr>,
    ) -> Result<Vec<DevPtr>, RunError> {
        let mut addrs = vec![DevPtr(0); self.exe.buffers.len()];
        for (i, info) in self.exe.buffers.iter().enumerate() {
            let id = BufferId(i as u32);
            addrs[i] = match &info.home {
                Home::Input(k) => {
                    let bytes = given[*k].as_bytes();
                    let p = gpu.alloc(bytes.len())?;
                    owned.push(p);
                    // SAFETY: `p` holds `bytes.len()` bytes.
                    unsafe { gpu.upload(p, bytes)? };
                    p
                }
                Home::Weight(_) | Home::Constant(_) | Home::Prepared(_) => self.resident[&id],
                Home::Arena(offset) => arena.offset(*offset as usize),
                Home::Dynamic => match crate::bind::known_dims(&self.exe, id, symbols)? {
                    Some(_) => {
                        let p = gpu.alloc(self.bytes(id, symbols)?)?;
                        owned.push(p);
                        p
                    }
                    None => DevPtr(0),
                },
            };
        }
        Ok(addrs)
    }

    /// Binds the data-dependent dims of the results a host step produced (`bind::bind_result`), allocates their
    /// buffers and every per-run buffer the new dims size, and uploads the results.
    fn adopt(
        &self,
        gpu: &G,
        produced: &[(BufferId, Tensor)],
        addrs: &mut [DevPtr],
        symbols: &mut HashMap<String, u64>,
        owned: &mut Vec<DevPtr>,
    ) -> Result<(), RunError> {
        for (b, t) in produced {
            crate::bind::bind_result(&self.exe, *b, t.dtype(), t.shape(), symbols)?;
        }
        for (i, info) in self.exe.buffers.iter().enumerate() {
            let id = BufferId(i as u32);
            if addrs[i] == DevPtr(0)
                && info.home == Home::Dynamic
                && crate::bind::known_dims(&self.exe, id, symbols)?.is_some()
            {
                let p = gpu.alloc(self.bytes(id, symbols)?)?;
                owned.push(p);
                addrs[i] = p;
            }
        }
        for (b, t) in produced {
            if !t.as_bytes().is_empty() {
                // SAFETY: the buffer was just sized for these dims.
                unsafe { gpu.upload(addrs[b.0 as usize], t.as_bytes())? };
            }
        }
        Ok(())
    }

    /// Times the steps alone, with the inputs already on the device and the outputs left there: `warmup` untimed
    /// runs, then `runs` timed ones (each queued, then waited for). What a device-bound workload costs without
    /// the host↔device copies around it.
    pub fn time_resident(
        &self,
        inputs: &BTreeMap<String, Tensor>,
        warmup: usize,
        runs: usize,
    ) -> Result<Vec<std::time::Duration>, RunError> {
        let views = crate::bind::views(inputs);
        let given = crate::bind::check_inputs(&self.exe, &views)?;
        let bound = crate::bind::bind_symbols(&self.exe, &given)?;
        let gpu = self.gpu.as_ref();
        let mut owned = Vec::new();
        let timed = (|| {
            let arena = gpu.alloc((self.exe.arena_bytes as usize).max(1))?;
            owned.push(arena);
            let placed = self.place(gpu, &given, &bound, arena, &mut owned)?;
            let mut times = Vec::with_capacity(runs);
            for i in 0..warmup + runs {
                gpu.synchronize()?;
                let t = std::time::Instant::now();
                let mut scratch = Vec::new();
                // Buffers of data-dependent extent are allocated by each run, into its scratch.
                let (mut addrs, mut symbols) = (placed.clone(), bound.clone());
                let ran = self.run_steps(gpu, &self.plan.steps, &mut addrs, &mut symbols, &mut scratch);
                let waited = gpu.synchronize();
                let elapsed = t.elapsed();
                free_after_queue(gpu, scratch);
                ran.and(waited)?;
                if i >= warmup {
                    times.push(elapsed);
                }
            }
            Ok(times)
        })();
        free_after_queue(gpu, owned);
        timed
    }

    fn bytes(&self, b: BufferId, symbols: &HashMap<String, u64>) -> Result<usize, RunError> {
        let dims = self.exe.dims(b, symbols).map_err(backend)?;
        Ok(dims.iter().product::<usize>() * self.exe.buffers[b.0 as usize].ty.dtype.size_bytes())
    }

    fn download(&self, gpu: &G, b: BufferId, dims: Vec<usize>, at: DevPtr) -> Result<Tensor, RunError> {
        let dtype = self.exe.buffers[b.0 as usize].ty.dtype;
        let mut bytes = vec![0u8; dims.iter().product::<usize>() * dtype.size_bytes()];
        if !bytes.is_empty() {
            // SAFETY: the buffer at `at` holds `bytes.len()` bytes for these dims.
            unsafe { gpu.download(at, &mut bytes)? };
        }
        Tensor::from_bytes(dtype, dims, &bytes).ok_or_else(|| backend("a buffer has the wrong size"))
    }

    /// The kernel's symbol values: bound, or derived dims evaluated from the bound symbols; an unbound symbol
    /// is an error, never a guessed extent.
    fn symbol_values(&self, kernel: usize, symbols: &HashMap<String, u64>) -> Result<Vec<i64>, RunError> {
        self.infos[kernel]
            .params
            .iter()
            .filter_map(|p| match p {
                PtxParam::Symbol { name, .. } => Some(crate::bind::symbol_value(name, symbols)),
                PtxParam::Buffer { .. } => None,
            })
            .collect()
    }

    fn launch(
        &self,
        gpu: &G,
        kernel: usize,
        args: &[BufferId],
        addrs: &[DevPtr],
        symbols: &HashMap<String, u64>,
    ) -> Result<(), RunError> {
        let info = &self.infos[kernel];
        let buffers: Vec<DevPtr> = args.iter().map(|b| addrs[b.0 as usize]).collect();
        let want = info.params.iter().filter(|p| matches!(p, PtxParam::Buffer { .. })).count();
        if buffers.len() != want {
            return Err(backend(format!(
                "kernel `{}` takes {want} buffers, the step passes {}",
                info.kernel,
                args.len()
            )));
        }
        let values = self.symbol_values(kernel, symbols)?;
        let (blocks, threads) = info.launch_geometry(&values).map_err(|e| backend(format!("{}: {e}", info.kernel)))?;
        // SAFETY: the buffers are the executable's, sized for this run's symbols, as the kernel's args expect.
        unsafe { gpu.launch(kernel, blocks, threads, &buffers, &values) }
    }

    /// Queues `steps`; per-run scratch memory (im2col matrices) goes into `scratch`, for the caller to free once
    /// the queue has run them (so no step waits for the device).
    fn run_steps(
        &self,
        gpu: &G,
        steps: &[DeviceStep],
        addrs: &mut [DevPtr],
        symbols: &mut HashMap<String, u64>,
        scratch: &mut Vec<DevPtr>,
    ) -> Result<(), RunError> {
        for step in steps {
            if let Some(produced) = self.run_step(gpu, step, addrs, symbols, scratch)? {
                self.adopt(gpu, &produced, addrs, symbols, scratch)?;
            }
        }
        Ok(())
    }

    /// Runs one step; a host step whose results have a data-dependent extent returns them, to be adopted.
    fn run_step(
        &self,
        gpu: &G,
        step: &DeviceStep,
        addrs: &[DevPtr],
        symbols: &HashMap<String, u64>,
        scratch: &mut Vec<DevPtr>,
    ) -> Result<Option<Vec<(BufferId, Tensor)>>, RunError> {
        let dims = |b: BufferId| self.exe.dims(b, symbols).map_err(backend);
        let at = |b: BufferId| addrs[b.0 as usize];
        {
            match step {
                DeviceStep::Kernel { kernel, args } => self.launch(gpu, *kernel, args, addrs, symbols)?,
                DeviceStep::MatMul { a, b, out } => {
                    self.matmul(gpu, at(*a), &dims(*a)?, at(*b), &dims(*b)?, at(*out))?
                }
                DeviceStep::Conv { x, w, bias, out, im2col } => {
                    let (xd, wd, od) = (dims(*x)?, dims(*w)?, dims(*out)?);
                    let g = conv_gemm_shape(&xd, &wd, &od)
                        .ok_or_else(|| backend(format!("conv of {xd:?} by {wd:?} into {od:?}")))?;
                    let n = xd[0];
                    if n * g.cout * g.p == 0 {
                        return Ok(None);
                    }
                    match bias {
                        Some((b, fill)) => self.launch(gpu, *fill, &[*b, *out], addrs, symbols)?,
                        // SAFETY: the output holds N·Cout·P f32s.
                        None => unsafe { gpu.zero(at(*out), n * g.cout * g.p * 4)? },
                    }
                    let cols = match im2col {
                        Some(k) => {
                            let col = gpu.alloc(n * g.k * g.p * 4)?;
                            scratch.push(col);
                            let buffers = [at(*x), col];
                            let values = self.symbol_values(*k, symbols)?;
                            let (blocks, threads) = self.infos[*k].launch_geometry(&values).map_err(backend)?;
                            // SAFETY: the scratch holds the [N, K, P] matrix the im2col kernel writes.
                            unsafe { gpu.launch(*k, blocks, threads, &buffers, &values)? };
                            col
                        }
                        None => at(*x),
                    };
                    self.gemm(
                        gpu,
                        Gemm {
                            m: g.cout,
                            n: g.p,
                            k: g.k,
                            a: at(*w),
                            lda: g.k,
                            stride_a: 0,
                            b: cols,
                            ldb: g.p,
                            stride_b: g.k * g.p,
                            c: at(*out),
                            ldc: g.p,
                            stride_c: g.cout * g.p,
                            batch: n,
                            accumulate: true,
                        },
                    )?;
                }
                DeviceStep::Gather { kernel, data, indices, out, axis } => {
                    self.check_indices(gpu, *indices, &dims(*indices)?, at(*indices), dims(*data)?[*axis], *axis)?;
                    self.launch(gpu, *kernel, &[*data, *indices, *out], addrs, symbols)?;
                }
                DeviceStep::Copy { src, dst } => {
                    let n = self.bytes(*src, symbols)?;
                    if at(*src) != at(*dst) && n > 0 {
                        // SAFETY: both buffers hold `n` bytes.
                        unsafe { gpu.copy(at(*dst), at(*src), n)? };
                    }
                }
                DeviceStep::Host { backend, op, inputs, outputs, node } => {
                    let mut operands = Vec::with_capacity(inputs.len());
                    for &b in inputs {
                        operands.push(self.download(gpu, b, dims(b)?, at(b))?);
                    }
                    let mut expected = Vec::with_capacity(outputs.len());
                    for &b in outputs {
                        expected.push((
                            self.exe.buffers[b.0 as usize].ty.dtype,
                            crate::bind::known_dims(&self.exe, b, symbols)?,
                        ));
                    }
                    let results = self.placed.run(backend.as_deref(), op, node, &operands, &expected)?;
                    let mut late = Vec::new();
                    for ((&b, t), (_, known)) in outputs.iter().zip(results).zip(&expected) {
                        if known.is_none() {
                            late.push((b, t));
                        } else if !t.as_bytes().is_empty() {
                            // SAFETY: the buffer holds exactly this many bytes for these dims.
                            unsafe { gpu.upload(at(b), t.as_bytes())? };
                        }
                    }
                    if !late.is_empty() {
                        return Ok(Some(late));
                    }
                }
            }
        }
        Ok(None)
    }

    /// `out = a · b` on f32, numpy semantics, as few GEMMs as the batch layout allows.
    fn matmul(&self, gpu: &G, a: DevPtr, ad: &[usize], b: DevPtr, bd: &[usize], out: DevPtr) -> Result<(), RunError> {
        let p = batch_plan(ad, bd).map_err(|e| RunError::Op(e.to_string()))?;
        let (m, k, n) = (p.m, p.k, p.n);
        let one = |batch: usize, stride_a: usize, stride_b: usize| Gemm {
            m,
            n,
            k,
            a,
            lda: k,
            stride_a,
            b,
            ldb: n,
            stride_b,
            c: out,
            ldc: n,
            stride_c: m * n,
            batch,
            accumulate: false,
        };
        if p.foldable {
            return self.gemm(gpu, Gemm { m: m * p.offsets.len(), ..one(1, 0, 0) });
        }
        // Regular strides (broadcast batches at stride 0): one batched GEMM.
        let (sa, sb) = match p.offsets.get(1) {
            Some(&(oa, ob)) => (oa, ob),
            None => (0, 0),
        };
        if p.offsets.iter().enumerate().all(|(i, &o)| o == (i * sa, i * sb)) {
            return self.gemm(gpu, one(p.offsets.len(), sa, sb));
        }
        for (i, &(oa, ob)) in p.offsets.iter().enumerate() {
            let f = DType::F32.size_bytes();
            self.gemm(
                gpu,
                Gemm { a: a.offset(oa * f), b: b.offset(ob * f), c: out.offset(i * m * n * f), ..one(1, 0, 0) },
            )?;
        }
        Ok(())
    }

    /// Queues `g`, handling the empty shapes a GEMM library may refuse.
    fn gemm(&self, gpu: &G, g: Gemm) -> Result<(), RunError> {
        if g.m == 0 || g.n == 0 || g.batch == 0 {
            return Ok(());
        }
        if g.k == 0 {
            if !g.accumulate {
                for i in 0..g.batch {
                    for r in 0..g.m {
                        // SAFETY: row `r` of `C_i` lies in the result buffer.
                        unsafe { gpu.zero(g.c.offset((i * g.stride_c + r * g.ldc) * 4), g.n * 4)? };
                    }
                }
            }
            return Ok(());
        }
        // SAFETY: the descriptor's matrices lie in the operands' and result's buffers (shapes checked above).
        unsafe { gpu.gemm(&g) }
    }

    /// Checks a gather's indices against the axis length, as the interpreter does.
    fn check_indices(
        &self,
        gpu: &G,
        b: BufferId,
        dims: &[usize],
        at: DevPtr,
        len: usize,
        axis: usize,
    ) -> Result<(), RunError> {
        let t = self.download(gpu, b, dims.to_vec(), at)?;
        let values: Vec<i64> = match t.dtype() {
            DType::I64 => t.as_slice::<i64>().map(<[i64]>::to_vec),
            DType::I32 => t.as_slice::<i32>().map(|s| s.iter().map(|&v| i64::from(v)).collect()),
            _ => None,
        }
        .ok_or_else(|| RunError::Op(format!("gather: indices must be i32 or i64, not {}", t.dtype())))?;
        for i in values {
            kiln_ir::interp::resolve_index(i, len, axis).map_err(|e| RunError::Op(format!("gather: {e}")))?;
        }
        Ok(())
    }
}

/// Waits for `gpu`'s queue, then frees `ptrs` (leaked if the device fails: queued work may still use them).
fn free_after_queue<G: Gpu>(gpu: &G, ptrs: Vec<DevPtr>) {
    if gpu.synchronize().is_ok() {
        for p in ptrs {
            // SAFETY: allocated on this device by the caller, freed once, with the queue drained.
            unsafe { gpu.free(p) };
        }
    }
}

/// An output of a queued run: name, dtype, dims and the host buffer it is copied into (none when empty).
type QueuedOutput<G> = (String, DType, Vec<usize>, Option<<G as Gpu>::HostBuffer>);

/// A queued run ([`GpuProgram::enqueue`]): its outputs once it has completed.
pub struct PendingRun<G: Gpu> {
    gpu: G,
    /// Recorded after the run's last copy; `None` while it is being queued.
    event: Option<G::Event>,
    /// Each output and the host buffer it is copied into.
    outputs: Vec<QueuedOutput<G>>,
    /// The run's device memory, freed once it has completed.
    owned: Vec<DevPtr>,
    /// Whether the run is known complete.
    done: bool,
}

impl<G: Gpu> PendingRun<G> {
    /// Whether the run has completed.
    pub fn is_done(&mut self) -> Result<bool, RunError> {
        if !self.done {
            self.done = match &self.event {
                Some(e) => self.gpu.event_done(e)?,
                None => true,
            };
        }
        Ok(self.done)
    }

    /// The event marking the run's end (for ordering other queues after it).
    pub fn event(&self) -> Option<&G::Event> {
        self.event.as_ref()
    }

    /// Waits for the run; its outputs, in order.
    pub fn wait(mut self) -> Result<Vec<(String, Tensor)>, RunError> {
        self.settle()?;
        let outputs = std::mem::take(&mut self.outputs);
        let mut out = Vec::with_capacity(outputs.len());
        for (name, dtype, dims, host) in outputs {
            let bytes = host.as_ref().map_or(&[][..], |h| self.gpu.host_bytes(h));
            let n = dims.iter().product::<usize>() * dtype.size_bytes();
            let t = Tensor::from_bytes(dtype, dims, &bytes[..n.min(bytes.len())])
                .ok_or_else(|| backend(format!("output `{name}` has the wrong size")))?;
            out.push((name, t));
        }
        Ok(out)
    }

    /// Waits for the run's end and frees its device memory (once).
    fn settle(&mut self) -> Result<(), RunError> {
        let waited = match &self.event {
            Some(e) if !self.done => self.gpu.event_wait(e),
            Some(_) => Ok(()),
            // Never queued completely (an error while queueing): wait for whatever was.
            None => self.gpu.synchronize(),
        };
        if waited.is_ok() {
            self.done = true;
            for p in self.owned.drain(..) {
                // SAFETY: allocated for this run on this device, freed once, after the run's last use of it.
                unsafe { self.gpu.free(p) };
            }
        }
        waited
    }
}

impl<G: Gpu> Drop for PendingRun<G> {
    fn drop(&mut self) {
        // A failing device leaks the run's memory rather than free what queued work may still use.
        let _ = self.settle();
    }
}

impl<G: Gpu> Drop for GpuProgram<G> {
    fn drop(&mut self) {
        if self.gpu.synchronize().is_err() {
            return;
        }
        let arena = self.arena.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        for p in self.owned.drain(..).chain(arena) {
            // SAFETY: each was allocated on this device by this program, is freed once, and the queue is drained.
            unsafe { self.gpu.free(p) };
        }
    }
}

#[cfg(test)]
mod tests {
    use kiln_ir::TensorType;
    use kiln_plan::exec::BufferInfo;

    use super::*;
    use crate::cuda::{HostGpu, NoKernels};

    fn exe(buffers: Vec<BufferInfo>) -> Executable {
        Executable {
            inputs: vec![("x".into(), BufferId(0))],
            outputs: vec![("y".into(), BufferId(1))],
            buffers,
            ..Executable::empty("t")
        }
    }

    fn f32s(n: usize) -> TensorType {
        TensorType::new(DType::F32, kiln_ir::Shape::of(&[n as u64]))
    }

    fn host() -> Arc<HostGpu<NoKernels>> {
        Arc::new(HostGpu::new(NoKernels))
    }

    #[test]
    fn plans_naming_missing_buffers_or_kernels_are_refused() {
        let buffers =
            vec![BufferInfo { ty: f32s(4), home: Home::Input(0) }, BufferInfo { ty: f32s(4), home: Home::Dynamic }];
        let plan = |steps| DevicePlan { prepare: Vec::new(), steps, kernels: Vec::new(), fallbacks: Vec::new() };
        let bad_buffer = plan(vec![DeviceStep::Copy { src: BufferId(0), dst: BufferId(7) }]);
        let err = GpuProgram::new(host(), exe(buffers.clone()), bad_buffer, Vec::new()).unwrap_err();
        assert!(err.to_string().contains("buffer 7 of 2"), "{err}");
        let bad_kernel = plan(vec![DeviceStep::Kernel { kernel: 0, args: vec![BufferId(0), BufferId(1)] }]);
        let err = GpuProgram::new(host(), exe(buffers.clone()), bad_kernel, Vec::new()).unwrap_err();
        assert!(err.to_string().contains("kernel 0 of 0"), "{err}");
        let copy = plan(vec![DeviceStep::Copy { src: BufferId(0), dst: BufferId(1) }]);
        let p = GpuProgram::new(host(), exe(buffers), copy, Vec::new()).unwrap();
        let x = Tensor::from_vec(vec![4], vec![1.0f32, -2.0, 3.5, f32::NAN]).unwrap();
        let out = p.run(&BTreeMap::from([("x".to_string(), x.clone())])).unwrap();
        assert_eq!(out[0].1.as_bytes(), x.as_bytes());
        let err = p.run(&BTreeMap::new()).unwrap_err();
        assert!(matches!(&err, RunError::Input(m) if m.contains("`x` is missing")), "{err}");
    }

    #[test]
    fn queued_runs_on_forked_queues_match_and_free_their_memory() {
        let buffers =
            vec![BufferInfo { ty: f32s(3), home: Home::Input(0) }, BufferInfo { ty: f32s(3), home: Home::Dynamic }];
        let copy = DevicePlan {
            prepare: Vec::new(),
            steps: vec![DeviceStep::Copy { src: BufferId(0), dst: BufferId(1) }],
            kernels: Vec::new(),
            fallbacks: Vec::new(),
        };
        let gpu = host();
        let p = GpuProgram::new(Arc::clone(&gpu), exe(buffers), copy, Vec::new()).unwrap();
        let before = gpu.allocated_bytes();
        let lane = gpu.fork().unwrap();
        let inputs = |v: f32| BTreeMap::from([("x".to_string(), Tensor::from_vec(vec![3], vec![v, -v, 0.5]).unwrap())]);
        let mut first = p.enqueue(&lane, &inputs(1.0)).unwrap();
        let second = p.enqueue(&lane, &inputs(2.0)).unwrap();
        assert!(first.is_done().unwrap() && first.event().is_some());
        assert_eq!(second.wait().unwrap()[0].1.to_f64_vec(), [2.0, -2.0, 0.5]);
        assert_eq!(first.wait().unwrap()[0].1.to_f64_vec(), [1.0, -1.0, 0.5]);
        assert_eq!(gpu.allocated_bytes(), before, "a completed run frees its memory");
        let failed = p.enqueue(&lane, &BTreeMap::new());
        assert!(failed.is_err());
        assert_eq!(gpu.allocated_bytes(), before, "a run that fails to queue frees its memory");
        let times = p.time_resident(&inputs(3.0), 1, 4).unwrap();
        assert_eq!(times.len(), 4);
        assert_eq!(gpu.allocated_bytes(), before, "timing frees its memory");
    }

    #[test]
    fn a_missing_weight_is_a_clear_error() {
        let buffers = vec![
            BufferInfo { ty: f32s(4), home: Home::Input(0) },
            BufferInfo { ty: f32s(4), home: Home::Weight("w".into()) },
        ];
        let plan = DevicePlan { prepare: Vec::new(), steps: Vec::new(), kernels: Vec::new(), fallbacks: Vec::new() };
        let err = GpuProgram::new(host(), exe(buffers), plan, Vec::new()).unwrap_err();
        assert!(matches!(&err, RunError::Weights(m) if m.contains("`w`")), "{err}");
    }
}
