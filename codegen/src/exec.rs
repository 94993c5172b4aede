//! Building an [`Executable`] (the plan types live in `kiln_plan::exec`, re-exported here) from an optimized
//! graph.
//!
//! [`build`] turns an optimized graph (after the target's pipeline: fused, scheduled and memory-planned) into
//! one, choosing per node:
//! - a `loop` fusion group, or any single node [`kernel::lower`] accepts (layer norm, softmax, transposes,
//!   concat, elementwise ops left alone…): a [`Step::Kernel`];
//! - a `library` fusion group (matmul or conv with an elementwise epilogue), a lone `matmul`, `conv` or `pool`
//!   on f32: the library call, then the epilogue as a kernel over the library's result, in place;
//! - a node whose operands are all weights or constants (a weight transpose, say): a step of
//!   [`Executable::prepare`], run once when the weights are bound, its result kept as a prepared weight;
//! - a node the placement puts on another backend of the registry: a [`Step::Backend`];
//! - a `conv_transpose`: on f32 the library call (a GEMM, then `col2im`), on other float types the gather-form
//!   builtin kernel ([`kernel::builtin::conv_transpose`]);
//! - the recurrent ops, `top_k` and the ops with data-dependent extents: a [`Step::Routine`] of the library;
//! - an `if` or a `loop`: a [`Step::Region`] whose bodies are built (recursively) as executables of their own in
//!   [`Executable::regions`], launching kernels of this executable's table;
//! - anything else not supported yet (scatter, narrow float types, other dtypes of the library ops): a
//!   [`Step::Interp`] that runs the reference interpreter's `eval_op` on copies of its operands —
//!   correct, and named in [`Executable::fallbacks`] so its cost is visible. A lowering failure that signals a
//!   compiler bug fails the build instead.
//!
//! Identical kernels (same text) are emitted once and shared by every step that launches them.

use std::collections::HashMap;
use std::sync::Arc;

use kiln_ir::op::{Fusibility, Fusion, FusionKind};
use kiln_ir::{DType, Graph, NodeId, Op, TensorType, Value};

pub use kiln_plan::exec::*;

use crate::kernel::{self, ArgRole, Kernel, LowerError, LowerOptions, SpacePolicy};
/// Why a node is not compiled.
enum NotCompiled {
    /// A feature not supported yet: the node runs on the interpreter (a reported fallback).
    Unsupported(String),
    /// A broken invariant of the compiler: the build fails, naming it as a kiln bug.
    Bug(String),
}

impl From<LowerError> for NotCompiled {
    fn from(e: LowerError) -> NotCompiled {
        match e {
            LowerError::InvalidGroup(_) => NotCompiled::Bug(e.to_string()),
            LowerError::Unsupported { op, .. } => NotCompiled::Unsupported(format!("kiln does not compile `{op}` yet")),
            LowerError::NotLowerable { .. } => NotCompiled::Unsupported(e.to_string()),
        }
    }
}

/// Why a graph could not become an executable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The graph is not well formed (a cycle, a missing operand).
    #[error("cannot compile graph `{graph}`: {message}")]
    Graph {
        /// The graph's name.
        graph: String,
        /// What is wrong.
        message: String,
    },
}

/// Builds the executable of `g` (see the module docs). `g` should have been through its target's pipeline;
/// a graph without a memory plan still builds, with every intermediate allocated per run.
pub fn build(g: &Graph) -> Result<Executable, BuildError> {
    build_placed(g, &Placement::default())
}

/// [`build`], with the nodes whose op `placement` gives to another backend of the registry as
/// [`Step::Backend`]s. A fusion node is compiled whole: the `fuse` pass keeps placed ops out of groups when its
/// context names them (`kiln_passes::PassContext::placed_elsewhere`).
pub fn build_placed(g: &Graph, placement: &Placement) -> Result<Executable, BuildError> {
    Builder::new(g, placement)?.run()
}

struct Builder<'g> {
    g: &'g Graph,
    placement: &'g Placement,
    order: Vec<NodeId>,
    /// The nodes computed when the weights are bound ([`kiln_ir::memory::computed_at_load`]).
    at_load: std::collections::BTreeSet<NodeId>,
    exe: Executable,
    buffer_of: HashMap<Value, BufferId>,
    kernel_index: HashMap<String, usize>,
    /// Kernels the verifier refused: lowering bugs, which fail the build.
    bugs: Vec<String>,
    /// Whether the graph is a region body: its parameters become constants (a body carries no weights of its
    /// own).
    body: bool,
}

impl<'g> Builder<'g> {
    fn new(g: &'g Graph, placement: &'g Placement) -> Result<Builder<'g>, BuildError> {
        let err = |message: String| BuildError::Graph { graph: g.name().to_string(), message };
        let order = match g.schedule() {
            Some(s) => s.to_vec(),
            None => g.topo_order().map_err(|c| err(format!("it has a cycle through {}", c.0)))?,
        };
        let at_load = kiln_ir::memory::computed_at_load(g, &order);
        Ok(Builder {
            g,
            placement,
            order,
            at_load,
            exe: Executable {
                name: g.name().to_string(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                buffers: Vec::new(),
                arena_bytes: g.memory_plan().map_or(0, |p| p.arena_bytes),
                prepare: Vec::new(),
                prepared: Vec::new(),
                steps: Vec::new(),
                kernels: Vec::new(),
                weights: g.weights.clone(),
                fallbacks: Vec::new(),
                sources: Vec::new(),
                regions: Vec::new(),
            },
            buffer_of: HashMap::new(),
            kernel_index: HashMap::new(),
            bugs: Vec::new(),
            body: false,
        })
    }

    fn run(mut self) -> Result<Executable, BuildError> {
        self.build()?;
        Ok(self.exe)
    }

    /// Builds every step, the outputs, and verifies the program.
    fn build(&mut self) -> Result<(), BuildError> {
        let g = self.g;
        for (i, &id) in g.inputs().iter().enumerate() {
            let Op::Input(inp) = &g.node(id).op else { continue };
            let b = self.add_buffer(g.node(id).outputs[0].clone(), Home::Input(i));
            self.buffer_of.insert(Value::new(id, 0), b);
            self.exe.inputs.push((inp.name.clone(), b));
        }
        let order = std::mem::take(&mut self.order);
        for &id in &order {
            self.node(id)?;
        }
        for (name, v) in g.outputs() {
            let b = self.buffer(*v)?;
            // An output that is an input, a weight or a constant is copied into a buffer of its own.
            let b = match self.exe.buffers[b.0 as usize].home {
                Home::Arena(_) | Home::Dynamic => b,
                _ => {
                    let dst = self.add_buffer(self.exe.buffers[b.0 as usize].ty.clone(), Home::Dynamic);
                    self.exe.steps.push(Step::Copy { src: b, dst });
                    self.exe
                        .sources
                        .push(StepSource { nodes: vec![format!("output `{name}`")], ops: vec!["copy".into()] });
                    dst
                }
            };
            self.exe.outputs.push((name.clone(), b));
        }
        // The same verifier an artifact's program goes through when it is loaded.
        let sigs = kiln_plan::verify::signatures(&self.exe.kernels);
        if let Err(e) = kiln_plan::verify::verify_executable(&self.exe, &kiln_plan::verify::borrowed(&sigs)) {
            self.bugs.push(format!("the program does not verify: {e}"));
        }
        if !self.bugs.is_empty() {
            return Err(BuildError::Graph {
                graph: g.name().to_string(),
                message: format!("{} (a kiln bug)", self.bugs.join("; ")),
            });
        }
        Ok(())
    }

    fn add_buffer(&mut self, ty: TensorType, home: Home) -> BufferId {
        self.exe.buffers.push(BufferInfo { ty, home });
        BufferId(self.exe.buffers.len() as u32 - 1)
    }

    fn buffer(&self, v: Value) -> Result<BufferId, BuildError> {
        self.buffer_of.get(&v).copied().ok_or_else(|| BuildError::Graph {
            graph: self.g.name().to_string(),
            message: format!("{} is used before it is computed", self.g.describe(v.node)),
        })
    }

    /// The buffer of an intermediate result: its arena slot when planned, else a per-run allocation.
    fn result_buffer(&mut self, v: Value, prepared: bool) -> BufferId {
        let ty = self.g.value_type(v).cloned().expect("results of scheduled nodes have types");
        let home = if prepared {
            let k = self.exe.prepared.len();
            Home::Prepared(k)
        } else if self.g.outputs().iter().any(|(_, o)| *o == v) {
            // A graph output is written straight into the tensor the run returns.
            Home::Dynamic
        } else {
            match self.g.memory_plan().and_then(|p| p.assignments.get(&v)) {
                Some(buf) => Home::Arena(buf.offset),
                None => Home::Dynamic,
            }
        };
        let b = self.add_buffer(ty, home);
        if prepared {
            self.exe.prepared.push(b);
        }
        self.buffer_of.insert(v, b);
        b
    }

    fn node(&mut self, id: NodeId) -> Result<(), BuildError> {
        let g = self.g;
        let node = g.node(id);
        match &node.op {
            Op::Input(_) => return Ok(()),
            Op::Parameter(p) => {
                let home = if self.body {
                    match g.weights.get(&p.name) {
                        Some(t) => Home::Constant(Arc::clone(t)),
                        None => {
                            let message = format!("weight `{}` of a region body is not bound", p.name);
                            return Err(BuildError::Graph { graph: g.name().to_string(), message });
                        }
                    }
                } else {
                    Home::Weight(p.name.clone())
                };
                let b = self.add_buffer(node.outputs[0].clone(), home);
                self.buffer_of.insert(Value::new(id, 0), b);
                return Ok(());
            }
            Op::Constant(c) => {
                let b = self.add_buffer(node.outputs[0].clone(), Home::Constant(Arc::new(c.value.clone())));
                self.buffer_of.insert(Value::new(id, 0), b);
                return Ok(());
            }
            _ => {}
        }
        let inputs: Vec<BufferId> = node.inputs.iter().map(|&v| self.buffer(v)).collect::<Result<_, _>>()?;
        // Weight transposes, constant broadcasts and the like run once when the weights are bound; the memory
        // plan left their results out of the arena by the same rule.
        let prepared = self.at_load.contains(&id);
        let outputs: Vec<BufferId> =
            (0..node.outputs.len()).map(|i| self.result_buffer(Value::new(id, i as u32), prepared)).collect();
        let step = self.step(id, &inputs, &outputs);
        if prepared {
            self.exe.prepare.push(step)
        } else {
            self.exe.steps.push(step);
            self.exe.sources.push(source_of(g, id));
        }
        Ok(())
    }

    /// The step computing node `id` from `inputs` into `outputs`.
    fn step(&mut self, id: NodeId, inputs: &[BufferId], outputs: &[BufferId]) -> Step {
        let g = self.g;
        let node = g.node(id);
        let f32_only = node.outputs.iter().all(|t| t.dtype == DType::F32)
            && node.inputs.iter().all(|&v| g.value_type(v).is_some_and(|t| t.dtype == DType::F32));
        let library = |op: LibraryOp| Step::Library { op, inputs: inputs.to_vec(), output: outputs[0], epilogue: None };
        if let Some(backend) = self.placement.backend_for(&node.op) {
            return Step::Backend {
                backend: backend.to_string(),
                op: node.op.clone(),
                inputs: inputs.to_vec(),
                outputs: outputs.to_vec(),
                node: node.name.clone().unwrap_or_else(|| id.to_string()),
            };
        }
        let operand_dtypes: Vec<DType> = node.inputs.iter().filter_map(|&v| g.value_type(v).map(|t| t.dtype)).collect();
        if let Some(routine) = Routine::of(&node.op, &operand_dtypes) {
            return Step::Routine {
                routine,
                inputs: inputs.to_vec(),
                outputs: outputs.to_vec(),
                node: self.g.describe(id),
            };
        }
        match &node.op {
            Op::MatMul if f32_only => return library(LibraryOp::MatMul),
            Op::Conv(c) if f32_only => return library(LibraryOp::Conv(c.clone())),
            Op::Pool(p) if f32_only => return library(LibraryOp::Pool(p.clone())),
            Op::ConvTranspose(c) if f32_only => return library(LibraryOp::ConvTranspose(c.clone())),
            Op::Softmax(s) if f32_only => return library(LibraryOp::Softmax { axis: s.axis, log: false }),
            Op::LogSoftmax(s) if f32_only => return library(LibraryOp::Softmax { axis: s.axis, log: true }),
            Op::Gather(gather) => return library(LibraryOp::Gather(gather.clone())),
            Op::Concat(c) => return library(LibraryOp::Concat(c.clone())),
            Op::MatMulInteger => return library(LibraryOp::MatMulInteger),
            Op::ConvInteger(c) => return library(LibraryOp::ConvInteger(c.clone())),
            Op::MatMul | Op::Conv(_) | Op::Pool(_) => {
                let dtype =
                    node.inputs.first().and_then(|&v| g.value_type(v)).map_or(node.outputs[0].dtype, |t| t.dtype);
                let why = format!("the library has no {dtype} {}", node.op.mnemonic());
                return self.fallback(id, inputs, outputs, NotCompiled::Unsupported(why));
            }
            Op::ConvTranspose(_) => {
                let name = format!("k{}_{}", self.exe.kernels.len(), node.op.mnemonic());
                let tys: Vec<TensorType> = node.inputs.iter().filter_map(|&v| g.value_type(v).cloned()).collect();
                let built = builtin_kernel(&name, &node.op, &tys, &node.outputs[0]);
                let mut values = node.inputs.clone();
                values.push(Value::new(id, 0));
                let known: HashMap<Value, BufferId> =
                    values.iter().filter_map(|v| self.buffer_of.get(v).map(|&b| (*v, b))).collect();
                return built
                    .and_then(|k| self.kernel_step(k, &values, &|v| known.get(&v).copied()))
                    .unwrap_or_else(|why| self.fallback(id, inputs, outputs, why));
            }
            Op::Fusion(f) => match self.fusion(f, inputs, outputs) {
                Ok(step) => return step,
                Err(why) => return self.fallback(id, inputs, outputs, why),
            },
            Op::If(_) | Op::Loop(_) => return self.region(id, inputs, outputs),
            _ => {}
        }
        let name = format!("k{}_{}", self.exe.kernels.len(), node.op.mnemonic());
        match kernel::lower_mapped(g, &[id], &name, &Self::lower_options()) {
            Ok((k, values)) => {
                let known: HashMap<Value, BufferId> =
                    values.iter().filter_map(|v| self.buffer_of.get(v).map(|&b| (*v, b))).collect();
                self.kernel_step(k, &values, &|v| known.get(&v).copied())
            }
            Err(e) => Err(NotCompiled::from(e)),
        }
        .unwrap_or_else(|why| self.fallback(id, inputs, outputs, why))
    }

    fn lower_options() -> LowerOptions {
        // Outputs of a fusion group may live in different iteration spaces (a reshape beside the value it
        // reshapes); each space gets its own loop nest.
        LowerOptions { spaces: SpacePolicy::Separate }
    }

    /// The interpreter step of node `id`, which is not compiled because of `why`: a feature not supported yet is
    /// a fallback (reported in [`Executable::fallbacks`]); a compiler bug fails the build instead.
    fn fallback(&mut self, id: NodeId, inputs: &[BufferId], outputs: &[BufferId], why: NotCompiled) -> Step {
        let node = self.g.describe(id);
        match why {
            NotCompiled::Unsupported(why) => {
                // Lowering errors name the node; the fallback names it already.
                let why = why.strip_prefix(&format!("{node}: ")).map_or(why.clone(), str::to_string);
                tracing::info!(node = %node, why = %why, "interpreter fallback");
                let op = self.g.node(id).op.mnemonic().to_string();
                self.exe.fallbacks.push(Fallback { op, node: node.clone(), why, region: None });
            }
            NotCompiled::Bug(why) => self.bugs.push(format!("{node}: {why}")),
        }
        Step::Interp { op: self.g.node(id).op.clone(), inputs: inputs.to_vec(), outputs: outputs.to_vec(), node }
    }

    /// The step of control-flow node `id`: each body built as an executable of its own (in
    /// [`Executable::regions`]) whose kernels join this one's table; the fallbacks inside a body are reported as
    /// this program's, naming the region.
    fn region(&mut self, id: NodeId, inputs: &[BufferId], outputs: &[BufferId]) -> Step {
        let (g, node) = (self.g, self.g.describe(id));
        let op = &g.node(id).op;
        let mut bodies = Vec::with_capacity(2);
        for body in op.bodies() {
            match self.body(&body.0, &node) {
                Ok(exe) => {
                    self.exe.regions.push(exe);
                    bodies.push(self.exe.regions.len() - 1);
                }
                Err(why) => return self.fallback(id, inputs, outputs, NotCompiled::Bug(why)),
            }
        }
        // The step's op is what a backend without compiled regions interprets: its bodies' memory plans (the
        // compiled bodies' business) stay out, so the op reads back from an artifact as it was written.
        fn unplanned(g: &mut Graph) {
            g.set_memory_plan(None);
            let regions: Vec<NodeId> = g.node_ids().filter(|&n| !g.node(n).op.bodies().is_empty()).collect();
            for n in regions {
                for body in g.node_mut(n).op.bodies_mut() {
                    unplanned(&mut body.0);
                }
            }
        }
        let mut op = op.clone();
        for body in op.bodies_mut() {
            unplanned(&mut body.0);
        }
        Step::Region { op, bodies, inputs: inputs.to_vec(), outputs: outputs.to_vec(), node }
    }

    /// The executable of region body `body` of node `region`, its kernels added to this builder's table.
    fn body(&mut self, body: &Graph, region: &str) -> Result<Executable, String> {
        let mut sub = Builder::new(body, self.placement).map_err(|e| e.to_string())?;
        sub.body = true;
        sub.exe.kernels = std::mem::take(&mut self.exe.kernels);
        sub.kernel_index = std::mem::take(&mut self.kernel_index);
        let built = sub.build();
        let mut exe = sub.exe;
        self.exe.kernels = std::mem::take(&mut exe.kernels);
        self.kernel_index = sub.kernel_index;
        built.map_err(|e| e.to_string())?;
        exe.weights = Default::default();
        for mut f in std::mem::take(&mut exe.fallbacks) {
            f.region = Some(match f.region {
                Some(inner) => format!("{region} > {inner}"),
                None => region.to_string(),
            });
            self.exe.fallbacks.push(f);
        }
        Ok(exe)
    }

    /// A kernel step for `k`, whose args hold `values` (mapped to buffers by `buffer`); the kernel is shared
    /// with an identical one emitted before.
    fn kernel_step(
        &mut self,
        k: Kernel,
        values: &[Value],
        buffer: &dyn Fn(Value) -> Option<BufferId>,
    ) -> Result<Step, NotCompiled> {
        // Verified once, here, after lowering: a violation is a bug in the lowering, reported as an error of
        // the build (never an interpreter fallback).
        if let Err(why) = kernel::verify_message(&k) {
            self.bugs.push(format!("kernel `{}` (lowered from this graph) is malformed: {why}", k.name));
        }
        if let Some(why) = integer_division_hazard(&k) {
            return Err(NotCompiled::Unsupported(why));
        }
        let mut args = Vec::new();
        for ((_, a), &v) in k.args.iter().enumerate().zip(values) {
            if matches!(a.role, ArgRole::Constant(_)) {
                continue;
            }
            args.push(
                buffer(v).ok_or_else(|| NotCompiled::Bug(format!("kernel argument `{}` has no buffer", a.name)))?,
            );
        }
        // Kernels are keyed by their text with the name blanked, so identical bodies share code.
        let key = kernel::print(&Kernel { name: String::new(), ..k.clone() });
        let constants_equal = |i: usize| {
            let other = &self.exe.kernels[i];
            other.args.iter().zip(&k.args).all(|(x, y)| match (&x.role, &y.role) {
                (ArgRole::Constant(a), ArgRole::Constant(b)) => a == b,
                _ => true,
            })
        };
        let kernel = match self.kernel_index.get(&key) {
            Some(&i) if constants_equal(i) => i,
            _ => {
                self.exe.kernels.push(k);
                self.kernel_index.insert(key, self.exe.kernels.len() - 1);
                self.exe.kernels.len() - 1
            }
        };
        Ok(Step::Kernel { kernel, args })
    }

    /// The step of a fusion node; `Err` (why) when it falls back to the interpreter.
    fn fusion(&mut self, f: &Fusion, inputs: &[BufferId], outputs: &[BufferId]) -> Result<Step, NotCompiled> {
        use NotCompiled::{Bug, Unsupported};
        let body: &Graph = &f.body.0;
        // Body value → executable buffer: body inputs are the operands; body outputs the results.
        let mut map: HashMap<Value, BufferId> = HashMap::new();
        for (i, &bid) in body.inputs().iter().enumerate() {
            map.insert(Value::new(bid, 0), *inputs.get(i).ok_or(Bug("operand count mismatch".into()))?);
        }
        let mut copies = Vec::new();
        for (i, (_, v)) in body.outputs().iter().enumerate() {
            let dst = outputs[i];
            match map.get(v) {
                // A body output that is an operand, or a value already bound to another result.
                Some(&src) => copies.push(Step::Copy { src, dst }),
                None => {
                    map.insert(*v, dst);
                }
            }
        }
        if !copies.is_empty() {
            return Err(Unsupported("a result of the fused group is one of its operands or another result".into()));
        }
        let members: Vec<NodeId> =
            body.node_ids().filter(|&b| !matches!(body.node(b).op, Op::Input(_) | Op::Parameter(_))).collect();
        let name = format!("k{}_{}", self.exe.kernels.len(), f.kind.name());
        match f.kind {
            FusionKind::Loop => {
                let (k, values) =
                    kernel::lower_mapped(body, &members, &name, &Self::lower_options()).map_err(NotCompiled::from)?;
                self.kernel_step(k, &values, &|v| map.get(&v).copied())
            }
            FusionKind::Library => {
                let roots: Vec<NodeId> = members
                    .iter()
                    .copied()
                    .filter(|&b| body.node(b).op.fusibility() == Fusibility::LibraryRoot)
                    .collect();
                let [root] = roots[..] else {
                    return Err(Bug("a library group needs exactly one matmul/conv".into()));
                };
                let rnode = body.node(root);
                let f32_only = rnode.outputs[0].dtype == DType::F32
                    && rnode.inputs.iter().all(|&v| body.value_type(v).is_some_and(|t| t.dtype == DType::F32));
                if !f32_only {
                    return Err(Unsupported(format!(
                        "the library has no {} {}",
                        rnode.outputs[0].dtype,
                        rnode.op.mnemonic()
                    )));
                }
                let op = match &rnode.op {
                    Op::Conv(c) => LibraryOp::Conv(c.clone()),
                    Op::MatMul => LibraryOp::MatMul,
                    other => {
                        return Err(Bug(format!("`{}` is a library root without a library call", other.mnemonic())));
                    }
                };
                let mut lib_inputs = Vec::with_capacity(rnode.inputs.len());
                for v in &rnode.inputs {
                    let b = match (map.get(v), &body.node(v.node).op) {
                        (Some(&b), _) => b,
                        // A small constant (a bias) cloned into the body.
                        (None, Op::Constant(c)) => {
                            let ty = rnode_input_type(body, *v).map_err(Bug)?;
                            self.add_buffer(ty, Home::Constant(Arc::new(c.value.clone())))
                        }
                        (None, _) => {
                            return Err(Bug(format!("{} is not an operand of the group", body.describe(v.node))));
                        }
                    };
                    lib_inputs.push(b);
                }
                let root_value = Value::new(root, 0);
                let epi = epilogue_nodes(body, root, &members);
                if epi.is_empty() {
                    let output = *map.get(&root_value).ok_or(Bug("the root is not a result".into()))?;
                    return Ok(Step::Library { op, inputs: lib_inputs, output, epilogue: None });
                }
                // The epilogue reads the root's result; it runs in place over the group's result when the
                // shapes agree, else the root gets a buffer of its own.
                let root_ty = rnode.outputs[0].clone();
                let final_ty = body.value_type(body.outputs()[0].1).cloned().ok_or(Bug("untyped result".into()))?;
                let scratch = if body.outputs().len() == 1 && root_ty == final_ty && !map.contains_key(&root_value) {
                    outputs[0]
                } else {
                    match map.get(&root_value) {
                        Some(&b) => b,
                        None => self.add_buffer(root_ty, Home::Dynamic),
                    }
                };
                map.insert(root_value, scratch);
                let (k, values) =
                    kernel::lower_mapped(body, &epi, &name, &Self::lower_options()).map_err(NotCompiled::from)?;
                let epilogue = self.kernel_step(k, &values, &|v| map.get(&v).copied())?;
                Ok(Step::Library { op, inputs: lib_inputs, output: scratch, epilogue: Some(Box::new(epilogue)) })
            }
        }
    }
}

/// The epilogue of a library group: the members downstream of `root`, plus the constants (and iotas) only they
/// use. Constants feeding the root itself (a bias cloned into the body) stay out.
fn epilogue_nodes(body: &Graph, root: NodeId, members: &[NodeId]) -> Vec<NodeId> {
    let mut downstream: std::collections::HashSet<NodeId> = std::collections::HashSet::new();
    let mut work = vec![root];
    while let Some(n) = work.pop() {
        for user in body.users(n) {
            if downstream.insert(user) {
                work.push(user);
            }
        }
    }
    members
        .iter()
        .copied()
        .filter(|&n| {
            downstream.contains(&n)
                || (body.node(n).op.is_source()
                    && !body.users(n).is_empty()
                    && body.users(n).iter().all(|u| downstream.contains(u)))
        })
        .collect()
}

/// Why a kernel must not be compiled: it divides integers by a value that may be zero (an integer `div`,
/// `mod` or `rem` by a run-time value, or an integer mean over a possibly empty set). The interpreter reports
/// such a division as an error; compiled code would give 0, a wrong answer, so the node runs on the
/// interpreter instead. Real models divide integers only in shape arithmetic, which is folded before this.
fn integer_division_hazard(k: &Kernel) -> Option<String> {
    use kernel::{Block, Expr, Stmt, VarRef};
    use kiln_ir::interp::scalar::Scalar;
    use kiln_ir::op::BinaryOp;
    let mut lets = HashMap::new();
    let mut accs = HashMap::new();
    fn collect(b: &Block, lets: &mut HashMap<kernel::Var, DType>, accs: &mut HashMap<kernel::AccVar, DType>) {
        for s in &b.0 {
            match s {
                Stmt::Let { var, dtype, .. } => {
                    lets.insert(*var, *dtype);
                }
                Stmt::Acc { var, dtype, op } => {
                    accs.insert(*var, if op.is_arg() { DType::I64 } else { *dtype });
                }
                Stmt::For { body, .. } => collect(body, lets, accs),
                _ => {}
            }
        }
    }
    collect(&k.body, &mut lets, &mut accs);
    let var_dtype = |v: VarRef| match v {
        VarRef::Let(v) => lets.get(&v).copied().unwrap_or(DType::F32),
        VarRef::Acc(a) => accs.get(&a).copied().unwrap_or(DType::F32),
    };
    fn walk(e: &Expr, hazard: &mut dyn FnMut(&Expr, &Expr) -> bool) -> bool {
        match e {
            Expr::Binary(op, a, b) => {
                (matches!(op, BinaryOp::Div | BinaryOp::Mod | BinaryOp::Rem) && hazard(a, b))
                    || walk(a, hazard)
                    || walk(b, hazard)
            }
            Expr::Unary(_, x) | Expr::Cast(x, _) => walk(x, hazard),
            Expr::Select(c, a, b) => walk(c, hazard) || walk(a, hazard) || walk(b, hazard),
            _ => false,
        }
    }
    let mut hazard = |a: &Expr, b: &Expr| {
        let int = !a.dtype(k, &var_dtype).is_float();
        let safe = match b {
            Expr::Const(s) => !matches!(s, Scalar::I8(0) | Scalar::U8(0) | Scalar::I32(0) | Scalar::I64(0)),
            _ => false,
        };
        int && !safe
    };
    fn block_has(b: &Block, f: &mut dyn FnMut(&Expr) -> bool) -> bool {
        b.0.iter().any(|s| match s {
            Stmt::For { body, .. } => block_has(body, f),
            Stmt::Let { value, .. } | Stmt::Store { value, .. } | Stmt::Update { value, .. } => f(value),
            Stmt::Acc { .. } => false,
        })
    }
    block_has(&k.body, &mut |e| walk(e, &mut hazard)).then(|| {
        "it divides integers by a value that may be zero (an error the interpreter reports, not compiled code)"
            .to_string()
    })
}

/// The type of body value `v`.
fn rnode_input_type(body: &Graph, v: Value) -> Result<TensorType, String> {
    body.value_type(v).cloned().ok_or_else(|| format!("{} has no type", body.describe(v.node)))
}

/// The hand-built kernel (`kernel::builtin`) computing `op` on operands of types `tys` into `out` (transposed
/// convolutions: the CPU library has no call for them).
fn builtin_kernel(name: &str, op: &Op, tys: &[TensorType], out: &TensorType) -> Result<Kernel, NotCompiled> {
    use kernel::builtin;
    let built = match (op, tys) {
        (Op::ConvTranspose(ct), [x, w, rest @ ..]) => builtin::conv_transpose(name, x, w, rest.first(), ct, out),
        _ => return Err(NotCompiled::Bug(format!("`{}` without its operands", op.mnemonic()))),
    };
    built.map_err(NotCompiled::from)
}

/// The model nodes node `id` computes: itself, or the nodes of its fusion body (inputs and constants aside).
fn source_of(g: &Graph, id: NodeId) -> StepSource {
    fn add(g: &Graph, id: NodeId, out: &mut StepSource) {
        let node = g.node(id);
        if let Op::Fusion(f) = &node.op {
            let body = &f.body.0;
            for inner in body.node_ids() {
                add(body, inner, out);
            }
            return;
        }
        if node.op.is_source() {
            return;
        }
        out.nodes.push(node.name.clone().unwrap_or_else(|| g.describe(id)));
        let op = node.op.mnemonic();
        if !out.ops.iter().any(|o| o == op) {
            out.ops.push(op.to_string());
        }
    }
    let mut out = StepSource::default();
    add(g, id, &mut out);
    out
}
