//! The [`Executable`]: what a compiled graph is, for any backend that runs it — ordered steps (a generated
//! kernel, a library call, an interpreter fallback, a copy), the buffers they read and write with where each
//! lives (caller's input, weight, constant, arena slot from `plan-memory`, run-time allocation, or a weight
//! prepared once at load), and the kernels the steps launch.
//!
//! `kiln_codegen::exec::build` makes one from an optimized graph; a backend runs it. Its serde form is an
//! ahead-of-time artifact's program.

use std::collections::HashMap;
use std::sync::Arc;

use kiln_ir::graph::Weights;
use kiln_ir::{Dim, Op, Tensor, TensorType};

use crate::kernel::Kernel;

/// A buffer of an [`Executable`]: an index into [`Executable::buffers`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct BufferId(pub u32);

/// Where a buffer's bytes live.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Home {
    /// The caller's input tensor at this position of [`Executable::inputs`].
    Input(usize),
    /// The weight of this name (in [`Executable::weights`], or bound later).
    Weight(String),
    /// A constant of the graph.
    Constant(Arc<Tensor>),
    /// A prepared weight: computed by [`Executable::prepare`] when the weights are bound, at this index.
    Prepared(usize),
    /// A slot of the run's arena, at this byte offset (planned by `plan-memory`).
    Arena(u64),
    /// Allocated for each run (a graph output — the tensor returned to the caller —, a symbolic shape, or a
    /// value not planned).
    Dynamic,
}

/// A buffer: a dense row-major tensor of a type whose dims may be symbolic (bound per run from the inputs).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BufferInfo {
    /// Its type.
    pub ty: TensorType,
    /// Where it lives.
    pub home: Home,
}

/// The library operations a step may call.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum LibraryOp {
    /// `out = a · b`, numpy matmul semantics.
    MatMul,
    /// Convolution; operands x, w and an optional bias.
    Conv(kiln_ir::op::Conv),
    /// Pooling.
    Pool(kiln_ir::op::Pool),
    /// `gather` along an axis (any data dtype; i32 or i64 indices): whole inner rows are copied.
    Gather(kiln_ir::op::Gather),
    /// `matmul_integer`: operands a, b, a_zero, b_zero (i8/u8), i32 result.
    MatMulInteger,
    /// `conv_integer`: operands x, w, x_zero, w_zero (i8/u8), i32 result.
    ConvInteger(kiln_ir::op::Conv),
    /// Transposed convolution (a GEMM into a column matrix, then `col2im`); operands x, w and an optional bias.
    ConvTranspose(kiln_ir::op::ConvTranspose),
    /// `concat` of operands of any one dtype: each operand's contiguous blocks copied into place (a device plan
    /// launches the op lowered to a kernel).
    Concat(kiln_ir::op::Concat),
    /// `softmax` on f32 along `axis` (with `log`, `log_softmax`), one operand: a routine of the CPU library
    /// (vectorized to the CPU's widest registers, `exp` once per element); device plans launch the op lowered to
    /// a kernel.
    Softmax {
        /// The axis (negative counts from the end).
        axis: i64,
        /// `log_softmax` when true.
        log: bool,
    },
}

impl LibraryOp {
    /// The IR op of a [`LibraryOp::Softmax`].
    pub fn softmax_op(axis: i64, log: bool) -> Op {
        let s = kiln_ir::op::Softmax { axis };
        if log { Op::LogSoftmax(s) } else { Op::Softmax(s) }
    }
}

/// A routine of the runtime's library with several results, run natively on the host: the recurrent layers,
/// whose time steps depend on one another (the input projections of every time step are one GEMM, then a small
/// GEMM and the fused gate arithmetic per step), and `top_k` (a selection, then a sort of the k best).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Routine {
    /// ONNX LSTM, f32: operands x, w, r, b, h0, c0; results y, y_h, y_c.
    Lstm(kiln_ir::op::Lstm),
    /// ONNX GRU, f32: operands x, w, r, b, h0; results y, y_h.
    Gru(kiln_ir::op::Gru),
    /// `top_k` on f32: operand x; results values (f32) and indices (i64).
    TopK(kiln_ir::op::TopK),
    /// `top_k` with a run-time `k` (a second operand), on any computable dtype: the results are sized when it
    /// runs.
    TopKAtRunTime(kiln_ir::op::TopK),
    /// `non_zero` on any computable dtype: operand x; result the i64 indices, whose extent (the count) the
    /// routine binds when it runs (a data-dependent dim: the result's buffer is sized then).
    NonZero(kiln_ir::op::NonZero),
    /// `unique` on any computable dtype: four results sized when it runs.
    Unique(kiln_ir::op::Unique),
    /// `non_max_suppression`: the kept rows, sized when it runs.
    NonMaxSuppression(kiln_ir::op::NonMaxSuppression),
    /// `grid_sample` on f32 data and an f32 grid: operands x, grid; result the samples.
    GridSample(kiln_ir::op::GridSample),
    /// `roi_align` on f32 data and boxes with i64 batch indices: operands x, rois, batch_indices.
    RoiAlign(kiln_ir::op::RoiAlign),
    /// `dynamic_quantize` of f32: operand x; results y (u8), scale (f32 scalar), zero point (u8 scalar). Two
    /// vectorized passes over x (its range, then the quantization), split over the workers; a device plan
    /// launches the op's primitive expansion as one kernel instead.
    DynamicQuantize,
}

impl Routine {
    /// The routine of an IR op, when the library has one for it and these dtypes (every operand f32, but the
    /// data-dependent ones, which take any).
    pub fn of(op: &Op, dtypes: &[kiln_ir::DType]) -> Option<Routine> {
        match op {
            Op::NonZero(n) => return Some(Routine::NonZero(n.clone())),
            Op::Unique(u) => return Some(Routine::Unique(u.clone())),
            Op::NonMaxSuppression(n) => return Some(Routine::NonMaxSuppression(n.clone())),
            Op::TopK(t) if dtypes.len() == 2 => return Some(Routine::TopKAtRunTime(t.clone())),
            Op::RoiAlign(a) if dtypes == [kiln_ir::DType::F32, kiln_ir::DType::F32, kiln_ir::DType::I64] => {
                return Some(Routine::RoiAlign(a.clone()));
            }
            _ => {}
        }
        if !dtypes.iter().all(|&d| d == kiln_ir::DType::F32) {
            return None;
        }
        match op {
            Op::Lstm(l) => Some(Routine::Lstm(l.clone())),
            Op::Gru(g) => Some(Routine::Gru(g.clone())),
            Op::TopK(t) => Some(Routine::TopK(t.clone())),
            Op::GridSample(g) => Some(Routine::GridSample(g.clone())),
            Op::DynamicQuantize => Some(Routine::DynamicQuantize),
            _ => None,
        }
    }

    /// The IR op it computes (what the verifier checks its buffers against).
    pub fn op(&self) -> Op {
        match self {
            Routine::Lstm(l) => Op::Lstm(l.clone()),
            Routine::Gru(g) => Op::Gru(g.clone()),
            Routine::TopK(t) | Routine::TopKAtRunTime(t) => Op::TopK(t.clone()),
            Routine::NonZero(n) => Op::NonZero(n.clone()),
            Routine::Unique(u) => Op::Unique(u.clone()),
            Routine::NonMaxSuppression(n) => Op::NonMaxSuppression(n.clone()),
            Routine::GridSample(g) => Op::GridSample(g.clone()),
            Routine::RoiAlign(a) => Op::RoiAlign(a.clone()),
            Routine::DynamicQuantize => Op::DynamicQuantize,
        }
    }

    /// Whether a device plan launches it as a kernel of its own (its primitive expansion) rather than running it
    /// on the host.
    pub fn runs_as_device_kernel(&self) -> bool {
        matches!(self, Routine::DynamicQuantize)
    }

    /// Whether its results' extents depend on the data (`non_zero`, `unique`, `non_max_suppression`, `top_k` with
    /// a run-time `k`): the routine returns them as tensors, and the runtime binds their dims and adopts them as
    /// the buffers.
    pub fn is_data_dependent(&self) -> bool {
        matches!(
            self,
            Routine::NonZero(_) | Routine::Unique(_) | Routine::NonMaxSuppression(_) | Routine::TopKAtRunTime(_)
        )
    }
}

/// One step of a run.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Step {
    /// Launch kernel `kernel` with these buffers, one per launch argument (inputs and outputs in the kernel's
    /// argument order, constants skipped).
    Kernel {
        /// Index into [`Executable::kernels`].
        kernel: usize,
        /// The launch arguments.
        args: Vec<BufferId>,
    },
    /// A library call writing `output`, then (optionally) an epilogue kernel step that reads it and writes the
    /// group's result.
    Library {
        /// The operation.
        op: LibraryOp,
        /// Its operands.
        inputs: Vec<BufferId>,
        /// Its result.
        output: BufferId,
        /// The elementwise epilogue.
        epilogue: Option<Box<Step>>,
    },
    /// A routine of the runtime's library with several results (see [`Routine`]).
    Routine {
        /// The routine.
        routine: Routine,
        /// Its operands.
        inputs: Vec<BufferId>,
        /// Its results.
        outputs: Vec<BufferId>,
        /// The node, as `Graph::describe` names it, for messages.
        node: String,
    },
    /// The reference interpreter runs `op` (a fallback: see [`Executable::fallbacks`]).
    Interp {
        /// The op.
        op: Op,
        /// Its operands.
        inputs: Vec<BufferId>,
        /// Its results.
        outputs: Vec<BufferId>,
        /// The node, as `Graph::describe` names it, for messages.
        node: String,
    },
    /// Another backend of the registry runs `op` (the placement put the node there: a plugin that declared the
    /// op at a higher priority than the compiled code). The runtime hands it copies of the operands and copies
    /// its results back, checked against the declared types.
    Backend {
        /// The registered backend's name.
        backend: String,
        /// The op.
        op: Op,
        /// Its operands.
        inputs: Vec<BufferId>,
        /// Its results.
        outputs: Vec<BufferId>,
        /// The node's name (its id when it has none): what the backend is told, and what messages say.
        node: String,
    },
    /// A control-flow node (`if`, `loop`) whose bodies are compiled: each body is an executable of its own,
    /// [`Executable::regions`]`[bodies[i]]` for the op's `i`th body (an `if`'s then and else branches, a loop's
    /// body), whose steps launch kernels of the root executable's [`Executable::kernels`]. The runtime drives
    /// them with `kiln_ir::interp::{run_if, run_loop}` — the interpreter's own semantics — over copies of the
    /// operands; results whose extents the data decide (an `if` whose branches differ, a loop's scan outputs)
    /// are sized when it runs. `op` is the IR op with its (optimized) bodies: what a backend without compiled
    /// regions runs on the interpreter, and what the verifier checks the buffers against.
    Region {
        /// The op.
        op: Op,
        /// Its bodies, as indices into [`Executable::regions`].
        bodies: Vec<usize>,
        /// Its operands.
        inputs: Vec<BufferId>,
        /// Its results.
        outputs: Vec<BufferId>,
        /// The node, as `Graph::describe` names it, for messages.
        node: String,
    },
    /// Copy all of `src` to `dst` (same byte count).
    Copy {
        /// Source.
        src: BufferId,
        /// Destination.
        dst: BufferId,
    },
}

/// A node the compiled program runs on the reference interpreter, and why (see [`Executable::fallbacks`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fallback {
    /// The op's mnemonic (`resize`, `top_k`, …).
    pub op: String,
    /// The node, as `Graph::describe` names it (`<op> <name or id>`).
    pub node: String,
    /// Why it is not compiled: a feature not supported yet (never a compiler bug, which fails the build).
    pub why: String,
    /// The control-flow node whose compiled body holds it (as `Graph::describe` names it; the outermost first,
    /// joined by ` > ` when regions nest), or `None` at the top level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

impl Step {
    /// Every buffer the step reads or writes (an epilogue's included), in no particular order.
    pub fn buffers(&self) -> Vec<BufferId> {
        match self {
            Step::Kernel { args, .. } => args.clone(),
            Step::Library { inputs, output, epilogue, .. } => {
                let mut v: Vec<BufferId> = inputs.iter().chain([output]).copied().collect();
                v.extend(epilogue.as_deref().map(Step::buffers).unwrap_or_default());
                v
            }
            Step::Interp { inputs, outputs, .. }
            | Step::Routine { inputs, outputs, .. }
            | Step::Region { inputs, outputs, .. }
            | Step::Backend { inputs, outputs, .. } => inputs.iter().chain(outputs).copied().collect(),
            Step::Copy { src, dst } => vec![*src, *dst],
        }
    }
}

/// The nodes of `fallbacks` grouped by op kind, in op order: `(op, how many, why the first was not compiled)`.
pub fn fallback_kinds(fallbacks: &[Fallback]) -> Vec<(&str, usize, &str)> {
    let mut kinds: std::collections::BTreeMap<&str, (usize, &str)> = std::collections::BTreeMap::new();
    for f in fallbacks {
        kinds.entry(f.op.as_str()).or_insert((0, f.why.as_str())).0 += 1;
    }
    kinds.into_iter().map(|(op, (n, why))| (op, n, why)).collect()
}

/// One line per op kind of `fallbacks`, as the CLIs print them (`fallback: N `op` node(s) run on the reference
/// interpreter: why`); none when everything is compiled.
pub fn fallback_lines(fallbacks: &[Fallback]) -> Vec<String> {
    fallback_kinds(fallbacks)
        .into_iter()
        .map(|(op, n, why)| format!("fallback: {n} `{op}` node(s) run on the reference interpreter: {why}"))
        .collect()
}

/// The refusal of a program with `fallbacks` under a policy that denies them: `N node(s) would run on the reference
/// interpreter (fallback policy `deny`): n `op` (why); …`.
pub fn fallback_refusal(fallbacks: &[Fallback]) -> String {
    let kinds: Vec<String> =
        fallback_kinds(fallbacks).iter().map(|(op, n, why)| format!("{n} `{op}` ({why})")).collect();
    format!(
        "{} node(s) would run on the reference interpreter (fallback policy `deny`): {}",
        fallbacks.len(),
        kinds.join("; ")
    )
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.region {
            Some(r) => write!(f, "{} (in the body of {r}): {}", self.node, self.why),
            None => write!(f, "{}: {}", self.node, self.why),
        }
    }
}

/// Where the backend registry puts each kind of op, for the compiler: the op kinds (mnemonics) that a backend
/// other than the compiled code takes, with that backend's name and priority. Everything else is compiled.
/// (`kiln_runtime::placement::for_ops` computes it from a registry.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Op mnemonic → (backend, priority).
    pub ops: std::collections::BTreeMap<String, (String, i32)>,
}

impl Placement {
    /// The backend that runs `op`, when it is not the compiled code.
    pub fn backend_for(&self, op: &Op) -> Option<&str> {
        self.ops.get(op.mnemonic()).map(|(name, _)| name.as_str())
    }

    /// Whether nothing is placed off the compiled code.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The op kinds placed off the compiled code.
    pub fn op_kinds(&self) -> std::collections::BTreeSet<String> {
        self.ops.keys().cloned().collect()
    }
}

/// A compiled graph, ready for a backend to load. See the module docs.
///
/// Its serde form (an ahead-of-time artifact's manifest) leaves out the kernels and the weights: an artifact
/// carries those as object code and a weight file.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Executable {
    /// The graph's name.
    pub name: String,
    /// The inputs the caller passes, in order: name and buffer.
    pub inputs: Vec<(String, BufferId)>,
    /// The results, in order: name and buffer.
    pub outputs: Vec<(String, BufferId)>,
    /// Every buffer.
    pub buffers: Vec<BufferInfo>,
    /// Bytes of the per-run arena.
    pub arena_bytes: u64,
    /// Steps run once when weights are bound, writing [`Home::Prepared`] buffers.
    pub prepare: Vec<Step>,
    /// The prepared buffers, by [`Home::Prepared`] index.
    pub prepared: Vec<BufferId>,
    /// The steps of a run, in order.
    pub steps: Vec<Step>,
    /// The kernels steps launch.
    #[serde(skip)]
    pub kernels: Vec<Kernel>,
    /// The weights (params) the graph carries.
    #[serde(skip)]
    pub weights: Weights,
    /// Nodes run by the interpreter fallback, with why they were not compiled.
    pub fallbacks: Vec<Fallback>,
    /// What model nodes each step of [`Executable::steps`] computes, by step (empty in artifacts written before
    /// kiln recorded it): how profiles name steps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<StepSource>,
    /// The compiled bodies of its [`Step::Region`]s. A body has no kernels or weights of its own: its kernel
    /// steps index the root executable's kernels, and its weights are constants.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<Executable>,
}

/// The model nodes a step computes: their names (as the model names them; `<op> <id>` for unnamed nodes) and
/// their ops, for profiles (`kiln bench --profile`, `--trace`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepSource {
    /// The nodes, in graph order.
    pub nodes: Vec<String>,
    /// Their distinct op mnemonics, in first-seen order.
    pub ops: Vec<String>,
}

impl StepSource {
    /// The step's kind for aggregate profiles: its ops joined by `+` (`matmul+add+gelu`), or `what` when the
    /// step has no recorded source.
    pub fn kind(&self, what: &str) -> String {
        if self.ops.is_empty() { what.to_string() } else { self.ops.join("+") }
    }
}

impl Executable {
    /// An executable called `name` with nothing in it: no buffers, steps, kernels or weights (to fill in).
    pub fn empty(name: &str) -> Executable {
        Executable {
            name: name.to_string(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            buffers: Vec::new(),
            arena_bytes: 0,
            prepare: Vec::new(),
            prepared: Vec::new(),
            steps: Vec::new(),
            kernels: Vec::new(),
            weights: Weights::default(),
            fallbacks: Vec::new(),
            sources: Vec::new(),
            regions: Vec::new(),
        }
    }

    /// The source of step `i` of [`Executable::steps`] (an empty one where none is recorded).
    pub fn source(&self, i: usize) -> StepSource {
        self.sources.get(i).cloned().unwrap_or_default()
    }

    /// The extents of buffer `b` with `symbols` bound; `Err` names an unbound symbol, or says that the buffer's
    /// size with these symbols does not fit in 63 bits (so every size computed from the extents afterwards is
    /// exact, never wrapped).
    pub fn dims(&self, b: BufferId, symbols: &HashMap<String, u64>) -> Result<Vec<usize>, String> {
        let ty = &self.buffers[b.0 as usize].ty;
        let dims: Vec<usize> =
            ty.shape
                .0
                .iter()
                .map(|d| match d {
                    Dim::Static(n) => usize::try_from(*n).map_err(|_| format!("extent {n} does not fit this machine")),
                    Dim::Sym(s) => symbols.get(s).ok_or_else(|| format!("symbol `{s}` is unbound")).and_then(|&n| {
                        usize::try_from(n).map_err(|_| format!("`{s}` = {n} does not fit this machine"))
                    }),
                })
                .collect::<Result<_, _>>()?;
        let bytes = dims.iter().try_fold(ty.dtype.size_bytes(), |acc, &d| acc.checked_mul(d));
        if bytes.is_none_or(|b| b > isize::MAX as usize) {
            return Err(format!(
                "a buffer of type {} would be {} with these sizes: more than 2^63 bytes",
                ty,
                dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")
            ));
        }
        Ok(dims)
    }

    /// A one-line description of `step` for profiles: its kind, kernel (by name, or by index when the kernels
    /// are not at hand, as in an artifact's program) or op, and result shape. Its buffers must be in range
    /// ([`Executable::check_references`]).
    pub fn describe(&self, step: &Step) -> String {
        let ty = |b: &BufferId| self.buffers[b.0 as usize].ty.to_string();
        match step {
            Step::Kernel { kernel, args } => {
                let name = self.kernels.get(*kernel).map_or_else(|| kernel.to_string(), |k| k.name.clone());
                format!("kernel {name} -> {}", args.last().map(ty).unwrap_or_default())
            }
            Step::Library { op, output, epilogue, .. } => {
                let name = match op {
                    LibraryOp::MatMul => "matmul".to_string(),
                    LibraryOp::Conv(c) => format!("conv{}", if c.groups > 1 { " (grouped)" } else { "" }),
                    LibraryOp::Pool(p) => format!("{} pool", p.kind.name()),
                    LibraryOp::Gather(_) => "gather".to_string(),
                    LibraryOp::MatMulInteger => "matmul_integer".to_string(),
                    LibraryOp::ConvInteger(_) => "conv_integer".to_string(),
                    LibraryOp::ConvTranspose(c) => {
                        format!("conv_transpose{}", if c.groups > 1 { " (grouped)" } else { "" })
                    }
                    LibraryOp::Concat(_) => "concat".to_string(),
                    LibraryOp::Softmax { log, .. } => if *log { "log_softmax" } else { "softmax" }.to_string(),
                };
                let epi = if epilogue.is_some() { " + epilogue" } else { "" };
                format!("library {name}{epi} -> {}", ty(output))
            }
            Step::Routine { routine, outputs, .. } => {
                let tys: Vec<String> = outputs.iter().map(ty).collect();
                format!("library {} -> {}", routine.op().mnemonic(), tys.join(", "))
            }
            Step::Interp { node, .. } => format!("interpreter {node}"),
            Step::Region { node, bodies, .. } => {
                let steps: usize = bodies.iter().filter_map(|&b| self.regions.get(b)).map(|r| r.steps.len()).sum();
                let n = bodies.len();
                format!("region {node} ({n} {}, {steps} steps)", if n == 1 { "body" } else { "bodies" })
            }
            Step::Backend { backend, node, op, .. } => format!("backend {backend}: {} `{node}`", op.mnemonic()),
            Step::Copy { dst, .. } => format!("copy -> {}", ty(dst)),
        }
    }

    /// Checks that every reference inside the executable is in range — buffers, prepared weights, input
    /// positions and kernel indices below `kernels` — so that one read back from a file (whose kernels are
    /// carried apart) cannot index out of bounds when run. `Err` names the first bad reference.
    pub fn check_references(&self, kernels: usize) -> Result<(), String> {
        let buffer = |b: &BufferId, what: &str| {
            if (b.0 as usize) < self.buffers.len() {
                Ok(())
            } else {
                Err(format!("{what} refers to buffer {} of {}", b.0, self.buffers.len()))
            }
        };
        fn step_refs(
            s: &Step,
            kernels: usize,
            buffer: &dyn Fn(&BufferId, &str) -> Result<(), String>,
        ) -> Result<(), String> {
            match s {
                Step::Kernel { kernel, args } => {
                    if *kernel >= kernels {
                        return Err(format!("a step launches kernel {kernel} of {kernels}"));
                    }
                    args.iter().try_for_each(|b| buffer(b, "a kernel step"))
                }
                Step::Library { inputs, output, epilogue, .. } => {
                    inputs.iter().chain([output]).try_for_each(|b| buffer(b, "a library step"))?;
                    epilogue.as_deref().map_or(Ok(()), |e| step_refs(e, kernels, buffer))
                }
                Step::Interp { inputs, outputs, node, .. } => {
                    inputs.iter().chain(outputs).try_for_each(|b| buffer(b, &format!("the fallback for {node}")))
                }
                Step::Routine { inputs, outputs, node, .. } => {
                    inputs.iter().chain(outputs).try_for_each(|b| buffer(b, &format!("the routine of {node}")))
                }
                Step::Region { inputs, outputs, node, .. } => {
                    inputs.iter().chain(outputs).try_for_each(|b| buffer(b, &format!("the region {node}")))
                }
                Step::Backend { inputs, outputs, node, backend, .. } => inputs
                    .iter()
                    .chain(outputs)
                    .try_for_each(|b| buffer(b, &format!("the step of {node} on `{backend}`"))),
                Step::Copy { src, dst } => [src, dst].into_iter().try_for_each(|b| buffer(b, "a copy")),
            }
        }
        for s in self.prepare.iter().chain(&self.steps) {
            step_refs(s, kernels, &buffer)?;
            if let Step::Region { op, bodies, node, .. } = s {
                if bodies.len() != op.bodies().len() {
                    return Err(format!("the region {node} has {} bodies, its op {}", bodies.len(), op.bodies().len()));
                }
                if let Some(b) = bodies.iter().find(|&&b| b >= self.regions.len()) {
                    return Err(format!("the region {node} runs body {b} of {}", self.regions.len()));
                }
            }
        }
        for (i, r) in self.regions.iter().enumerate() {
            r.check_references(kernels).map_err(|e| format!("region body {i}: {e}"))?;
        }
        for (name, b) in self.inputs.iter().chain(&self.outputs) {
            buffer(b, &format!("`{name}`"))?;
        }
        self.prepared.iter().try_for_each(|b| buffer(b, "a prepared weight"))?;
        for (i, info) in self.buffers.iter().enumerate() {
            match info.home {
                Home::Input(k) if k >= self.inputs.len() => {
                    return Err(format!("buffer {i} is input {k} of {}", self.inputs.len()));
                }
                Home::Prepared(k) if k >= self.prepared.len() => {
                    return Err(format!("buffer {i} is prepared weight {k} of {}", self.prepared.len()));
                }
                Home::Arena(offset) => {
                    let bytes = info.ty.shape.num_elements().map(|n| n * info.ty.dtype.size_bytes() as u64);
                    if bytes.is_none_or(|n| offset.checked_add(n).is_none_or(|end| end > self.arena_bytes)) {
                        return Err(format!("buffer {i} does not fit the {}-byte arena", self.arena_bytes));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Number of library, kernel, interpreter, copy and other-backend steps, for reports (a region's count is
    /// its bodies' steps).
    pub fn step_counts(&self) -> [usize; 5] {
        let mut n = [0; 5];
        for r in &self.regions {
            for (total, k) in n.iter_mut().zip(r.step_counts()) {
                *total += k;
            }
        }
        for s in self.prepare.iter().chain(&self.steps) {
            n[match s {
                Step::Region { .. } => continue,
                Step::Library { .. } | Step::Routine { .. } => 0,
                Step::Kernel { .. } => 1,
                Step::Interp { .. } => 2,
                Step::Copy { .. } => 3,
                Step::Backend { .. } => 4,
            }] += 1;
        }
        n
    }

    /// The nodes each other backend runs ([`Step::Backend`]), by backend name, in step order.
    pub fn placed_nodes(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for s in self.prepare.iter().chain(&self.steps) {
            if let Step::Backend { backend, node, op, .. } = s {
                out.entry(backend.clone()).or_default().push(format!("{} `{node}`", op.mnemonic()));
            }
        }
        for r in &self.regions {
            for (backend, nodes) in r.placed_nodes() {
                out.entry(backend).or_default().extend(nodes);
            }
        }
        out
    }
}
