//! The program verifier: checks an [`Executable`] (and a CUDA [`DevicePlan`] over it) as a whole, so that a
//! runtime that runs it touches only memory the program owns, in an order that computes what it says.
//!
//! The compiler runs it on every program it builds (`kiln_codegen::exec::build`: a failure is a kiln bug); an
//! artifact's loader runs it on the program its manifest holds ([`crate::artifact::read_manifest`]), with the
//! launch signature of every kernel the manifest records ([`LaunchArg`]): the same checks, whoever wrote the
//! program. Checked, for every step of `prepare` and of a run, in order:
//!
//! - **references**: buffers, kernels, inputs and prepared weights in range
//!   ([`Executable::check_references`]);
//! - **arities and types**: a kernel launch passes one buffer per launch argument of exactly the type the kernel
//!   was compiled for (dtype and every extent, symbolic ones by name); a library call has its op's operand count,
//!   the dtypes the library implements, and the result type the op's type rule gives; an interpreter or backend
//!   step's results have the types its op's rule gives; a copy is between buffers of one type;
//! - **who writes what**: a run writes only arena and per-run buffers, `prepare` only prepared weights; inputs,
//!   weights and constants are never written;
//! - **definition before use**: a step reads only buffers that hold their value — an input, weight or constant,
//!   a prepared weight once `prepare` has written it, an arena or per-run buffer once a step has written it and
//!   no later write to overlapping arena bytes has clobbered it — and every result is written by the end;
//! - **aliasing**: a step's results do not overlap each other in the arena, nor overlap its operands, except a
//!   kernel's result that occupies exactly the bytes of an operand the kernel computes it in place over (its
//!   signature says which: [`LaunchArg::in_place`]) and the steps that work on copies of their operands
//!   (interpreter, other backends); results are arena or per-run buffers.
//!
//! Not checked (the code is not in the program): that a kernel's machine code accesses only its arguments as its
//! signature declares. An artifact's code is bound to its manifest by digest; loading one runs native code, as
//! loading any shared library does (docs/architecture.md, "Artifacts").

use kiln_ir::{DType, Dim, Op, Shape, TensorType};

use crate::device::{DevicePlan, DeviceStep};
use crate::exec::{BufferId, Executable, Home, LibraryOp, Step};
use crate::kernel::{ArgId, ArgRole, Block, Expr, Extent, IExpr, Kernel, Stmt};

/// One launch argument of a kernel, as the kernel was compiled: its buffer type and whether it writes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LaunchArg {
    /// The buffer's type (symbolic extents named by the graph's symbols).
    pub ty: TensorType,
    /// Whether the kernel writes the buffer (an output); it only reads it otherwise.
    pub writes: bool,
    /// For an output: the launch positions of the inputs it may occupy exactly (computed in place) — those the
    /// kernel reads only at the one index it stores the output at, before storing it. Empty for inputs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_place: Vec<usize>,
}

impl Kernel {
    /// The launch signature: each launch argument's type and role, in launch order (constants are carried by the
    /// kernel, not passed).
    pub fn signature(&self) -> Vec<LaunchArg> {
        let launched: Vec<ArgId> = self.launch_args().map(|(id, _)| id).collect();
        self.launch_args()
            .map(|(id, a)| LaunchArg {
                ty: TensorType::new(
                    a.dtype,
                    Shape(
                        a.shape
                            .iter()
                            .map(|e| match e {
                                Extent::Const(n) => Dim::Static(*n),
                                Extent::Sym(i) => Dim::Sym(self.symbols.get(*i).cloned().unwrap_or_default()),
                            })
                            .collect(),
                    ),
                ),
                writes: matches!(a.role, ArgRole::Output),
                in_place: match a.role {
                    ArgRole::Output => launched
                        .iter()
                        .enumerate()
                        .filter(|&(_, &i)| matches!(self.arg(i).role, ArgRole::Input) && pointwise(&self.body, i, id))
                        .map(|(pos, _)| pos)
                        .collect(),
                    _ => Vec::new(),
                },
            })
            .collect()
    }
}

/// Whether output `out` of a kernel with body `body` may occupy exactly the bytes of input `input`: every store
/// to `out` is at one index expression `e`, and every read of `input` is at `e` too and comes before the store
/// in its iteration. Since a kernel stores each output element once, iteration `t` then reads only the element
/// that iteration `t` itself overwrites, after reading it.
fn pointwise(body: &Block, input: ArgId, out: ArgId) -> bool {
    let mut store: Option<&IExpr> = None;
    let mut stored = false;
    let mut ok = true;
    fn reads<'a>(e: &'a Expr, input: ArgId, out: &mut Vec<&'a IExpr>) {
        match e {
            Expr::Load { arg, index } => {
                if *arg == input {
                    out.push(index);
                }
                index_reads(index, input, out);
            }
            Expr::Index { value, .. } => index_reads(value, input, out),
            Expr::Cond(c) => [&c.lhs, &c.rhs].into_iter().for_each(|i| index_reads(i, input, out)),
            Expr::Unary(_, x) | Expr::Cast(x, _) => reads(x, input, out),
            Expr::Binary(_, a, b) => [a, b].into_iter().for_each(|x| reads(x, input, out)),
            Expr::Select(c, a, b) => [c, a, b].into_iter().for_each(|x| reads(x, input, out)),
            Expr::Const(_) | Expr::Var(_) | Expr::Acc(_) => {}
        }
    }
    fn index_reads<'a>(e: &'a IExpr, input: ArgId, out: &mut Vec<&'a IExpr>) {
        if let IExpr::Read { arg, index } = e
            && *arg == input
        {
            out.push(index);
        }
        e.children().into_iter().for_each(|c| index_reads(c, input, out));
    }
    fn walk<'a>(
        b: &'a Block,
        input: ArgId,
        out: ArgId,
        store: &mut Option<&'a IExpr>,
        stored: &mut bool,
        ok: &mut bool,
    ) {
        for st in &b.0 {
            let mut found = Vec::new();
            match st {
                Stmt::For { extent, body, .. } => {
                    index_reads(extent, input, &mut found);
                    if !found.is_empty() {
                        *ok = false;
                    }
                    walk(body, input, out, store, stored, ok);
                    continue;
                }
                Stmt::Let { value, .. } => reads(value, input, &mut found),
                Stmt::Update { value, position, .. } => {
                    reads(value, input, &mut found);
                    position.iter().for_each(|p| index_reads(p, input, &mut found));
                }
                Stmt::Store { index, value, .. } => {
                    reads(value, input, &mut found);
                    index_reads(index, input, &mut found);
                }
                Stmt::Acc { .. } => {}
            }
            // A read after a store in the same iteration order would see the new value.
            if !found.is_empty() && *stored {
                *ok = false;
            }
            for e in found {
                match store {
                    Some(s) if *s != e => *ok = false,
                    Some(_) => {}
                    None => *store = Some(e),
                }
            }
            if let Stmt::Store { arg, index, .. } = st
                && *arg == out
            {
                match store {
                    Some(s) if *s != index => *ok = false,
                    Some(_) => {}
                    None => *store = Some(index),
                }
                *stored = true;
            }
        }
    }
    walk(body, input, out, &mut store, &mut stored, &mut ok);
    ok && stored
}

/// Checks `exe` against the launch signatures of its kernels (see the module docs). `Err` says what is wrong
/// with the first bad step.
pub fn verify_executable(exe: &Executable, signatures: &[&[LaunchArg]]) -> Result<(), String> {
    exe.check_references(signatures.len())?;
    for (i, r) in exe.regions.iter().enumerate() {
        if let Some(b) = r.buffers.iter().find(|b| matches!(b.home, Home::Weight(_) | Home::Prepared(_))) {
            return Err(format!("region body {i} has {} of its own", home_name(&b.home)));
        }
        verify_executable(r, signatures).map_err(|e| format!("region body {i}: {e}"))?;
    }
    let mut state = State::new(exe)?;
    for (phase, steps) in [(Phase::Prepare, &exe.prepare), (Phase::Run, &exe.steps)] {
        state.phase = phase;
        for (i, s) in steps.iter().enumerate() {
            let at = format!("{} step {i} ({})", phase.name(), exe.describe(s));
            state.exec_step(s, signatures).map_err(|e| format!("{at}: {e}"))?;
        }
        if phase == Phase::Prepare {
            state.prepared_done()?;
        }
    }
    state.outputs_written(&exe.outputs)
}

/// Checks the device plan `plan` of `exe` against the launch signatures of its kernels (the executable's, then
/// the builtins), as [`verify_executable`] checks an executable.
pub fn verify_device_plan(exe: &Executable, plan: &DevicePlan, signatures: &[&[LaunchArg]]) -> Result<(), String> {
    exe.check_references(signatures.len())?;
    plan.check_references(exe.buffers.len(), signatures.len())?;
    let mut state = State::new(exe)?;
    for (phase, steps) in [(Phase::Prepare, &plan.prepare), (Phase::Run, &plan.steps)] {
        state.phase = phase;
        for (i, s) in steps.iter().enumerate() {
            state.device_step(s, signatures).map_err(|e| format!("device {} step {i}: {e}", phase.name()))?;
        }
        if phase == Phase::Prepare {
            state.prepared_done()?;
        }
    }
    state.outputs_written(&exe.outputs)
}

#[derive(Copy, Clone, PartialEq, Eq)]
enum Phase {
    Prepare,
    Run,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Prepare => "prepare",
            Phase::Run => "run",
        }
    }
}

/// How a step's results may overlap its operands.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Overlap {
    /// Not at all (a library call or a copy reads operands while writing its result).
    Never,
    /// As the caller checked (a kernel launch: in place where the kernel's signature allows it).
    Checked,
    /// Freely: the step works on copies of its operands.
    Copies,
}

struct State<'e> {
    exe: &'e Executable,
    phase: Phase,
    /// Whether each buffer holds its value now.
    defined: Vec<bool>,
    /// Arena buffers: `(start, end, buffer)`, sorted by start.
    arena: Vec<(u64, u64, usize)>,
}

impl<'e> State<'e> {
    fn new(exe: &'e Executable) -> Result<State<'e>, String> {
        let mut arena = Vec::new();
        let defined = exe
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if let Home::Arena(offset) = b.home {
                    let bytes =
                        kiln_ir::verify::byte_size(&b.ty).ok_or_else(|| format!("arena buffer {i} is too large"))?;
                    if bytes > 0 {
                        arena.push((offset, offset + bytes, i));
                    }
                }
                Ok(matches!(b.home, Home::Input(_) | Home::Weight(_) | Home::Constant(_)))
            })
            .collect::<Result<Vec<bool>, String>>()?;
        arena.sort_unstable();
        Ok(State { exe, phase: Phase::Prepare, defined, arena })
    }

    fn ty(&self, b: BufferId) -> &'e TensorType {
        &self.exe.buffers[b.0 as usize].ty
    }

    fn range(&self, b: BufferId) -> Option<(u64, u64)> {
        match self.exe.buffers[b.0 as usize].home {
            // An empty buffer occupies no bytes.
            Home::Arena(offset) => {
                kiln_ir::verify::byte_size(self.ty(b)).filter(|&n| n > 0).map(|n| (offset, offset + n))
            }
            _ => None,
        }
    }

    /// After `prepare`: every prepared weight must have been written.
    fn prepared_done(&self) -> Result<(), String> {
        for (k, b) in self.exe.prepared.iter().enumerate() {
            if !self.defined[b.0 as usize] {
                return Err(format!("prepared weight {k} (buffer {}) is never written by `prepare`", b.0));
            }
        }
        Ok(())
    }

    fn outputs_written(&self, outputs: &[(String, BufferId)]) -> Result<(), String> {
        for (name, b) in outputs {
            let home = &self.exe.buffers[b.0 as usize].home;
            if !matches!(home, Home::Arena(_) | Home::Dynamic) {
                return Err(format!(
                    "result `{name}` is buffer {}, {}: results are arena or per-run buffers",
                    b.0,
                    home_name(home)
                ));
            }
            if !self.defined[b.0 as usize] {
                return Err(format!(
                    "result `{name}` (buffer {}) does not hold its value at the end (never written, or overwritten \
                     since)",
                    b.0
                ));
            }
        }
        Ok(())
    }

    /// Records one step's effect: `reads` must hold their values; `writes` must be writable in this phase and
    /// respect `overlap`; then the writes define their buffers and clobber whatever else shares their bytes.
    fn access(&mut self, reads: &[BufferId], writes: &[BufferId], overlap: Overlap) -> Result<(), String> {
        for &r in reads {
            if !self.defined[r.0 as usize] {
                return Err(format!(
                    "it reads buffer {} ({}) before it holds a value (not yet written, or overwritten since)",
                    r.0,
                    self.ty(r)
                ));
            }
        }
        for (k, &w) in writes.iter().enumerate() {
            let home = &self.exe.buffers[w.0 as usize].home;
            let writable = match self.phase {
                Phase::Prepare => matches!(home, Home::Prepared(_)),
                Phase::Run => matches!(home, Home::Arena(_) | Home::Dynamic),
            };
            if !writable {
                return Err(format!("it writes buffer {} ({}), which it may not write", w.0, home_name(home)));
            }
            let Some((ws, we)) = self.range(w) else { continue };
            let overlaps = |b: BufferId| self.range(b).is_some_and(|(s, e)| s < we && ws < e);
            for &o in &writes[..k] {
                if o != w && overlaps(o) {
                    return Err(format!("its results {} and {} overlap in the arena", o.0, w.0));
                }
            }
            if overlap == Overlap::Never
                && let Some(&r) = reads.iter().find(|&&r| overlaps(r))
            {
                return Err(format!("its result {} overlaps its operand {} in the arena", w.0, r.0));
            }
        }
        if overlap == Overlap::Never
            && let Some(&r) = reads.iter().find(|r| writes.contains(r))
        {
            return Err(format!("it writes its operand {} while reading it", r.0));
        }
        for &w in writes {
            if let Some((ws, we)) = self.range(w) {
                let first = self.arena.partition_point(|&(_, e, _)| e <= ws);
                for &(s, e, b) in &self.arena[first..] {
                    if s >= we {
                        break;
                    }
                    if e > ws && b != w.0 as usize {
                        self.defined[b] = false;
                    }
                }
            }
            self.defined[w.0 as usize] = true;
        }
        Ok(())
    }

    fn exec_step(&mut self, s: &Step, sigs: &[&[LaunchArg]]) -> Result<(), String> {
        match s {
            Step::Kernel { kernel, args } => self.launch(*kernel, args, sigs),
            Step::Library { op, inputs, output, epilogue } => {
                self.library(op, inputs, *output)?;
                match epilogue.as_deref() {
                    Some(e @ Step::Kernel { .. }) => self.exec_step(e, sigs).map_err(|m| format!("its epilogue: {m}")),
                    Some(_) => Err("its epilogue is not a kernel launch".into()),
                    None => Ok(()),
                }
            }
            Step::Interp { op, inputs, outputs, .. } | Step::Backend { op, inputs, outputs, .. } => {
                self.op_types(op, inputs, outputs)?;
                self.access(inputs, outputs, Overlap::Copies)
            }
            Step::Region { op, bodies, inputs, outputs, .. } => {
                self.op_types(op, inputs, outputs)?;
                for (k, (body, &b)) in op.bodies().into_iter().zip(bodies).enumerate() {
                    let exe = self.exe.regions.get(b).ok_or_else(|| format!("it runs region body {b}"))?;
                    region_interface(&body.0, exe).map_err(|e| format!("body {k} (region {b}): {e}"))?;
                }
                self.access(inputs, outputs, Overlap::Copies)
            }
            Step::Routine { routine, inputs, outputs, .. } => {
                self.op_types(&routine.op(), inputs, outputs)?;
                // A routine reads its operands in place while it writes its results.
                self.access(inputs, outputs, Overlap::Never)
            }
            Step::Copy { src, dst } => self.copy(*src, *dst),
        }
    }

    fn launch(&mut self, kernel: usize, args: &[BufferId], sigs: &[&[LaunchArg]]) -> Result<(), String> {
        let sig = sigs.get(kernel).ok_or_else(|| format!("it launches kernel {kernel} of {}", sigs.len()))?;
        if args.len() != sig.len() {
            return Err(format!("kernel {kernel} takes {} buffer(s), the step passes {}", sig.len(), args.len()));
        }
        let (mut reads, mut writes) = (Vec::new(), Vec::new());
        for (i, (&b, a)) in args.iter().zip(sig.iter()).enumerate() {
            if *self.ty(b) != a.ty {
                return Err(format!(
                    "argument {i} of kernel {kernel} is {}, the step passes buffer {} of {}",
                    a.ty,
                    b.0,
                    self.ty(b)
                ));
            }
            if a.writes { writes.push(b) } else { reads.push(b) }
        }
        // A result shares bytes with an operand only exactly, and only where the kernel computes it in place.
        for (p, (&w, a)) in args.iter().zip(sig.iter()).enumerate().filter(|(_, (_, a))| a.writes) {
            for (q, &r) in args.iter().enumerate().filter(|&(q, _)| !sig[q].writes) {
                let (wr, rr) = (self.range(w), self.range(r));
                let shared = r == w || (wr.is_some() && wr == rr);
                let overlap = wr.zip(rr).is_some_and(|((ws, we), (rs, re))| rs < we && ws < re);
                if shared && !a.in_place.contains(&q) {
                    return Err(format!(
                        "kernel {kernel} writes argument {p} (buffer {}) over argument {q} (buffer {}), which it \
                         does not compute in place",
                        w.0, r.0
                    ));
                }
                if overlap && !shared {
                    return Err(format!("its result {} partly overlaps its operand {} in the arena", w.0, r.0));
                }
            }
        }
        self.access(&reads, &writes, Overlap::Checked)
    }

    fn library(&mut self, op: &LibraryOp, inputs: &[BufferId], output: BufferId) -> Result<(), String> {
        let (ir_op, float_only) = match op {
            LibraryOp::MatMul => (Op::MatMul, true),
            LibraryOp::Conv(c) => (Op::Conv(c.clone()), true),
            LibraryOp::Pool(p) => (Op::Pool(p.clone()), true),
            LibraryOp::Gather(g) => (Op::Gather(g.clone()), false),
            LibraryOp::MatMulInteger => (Op::MatMulInteger, false),
            LibraryOp::ConvInteger(c) => (Op::ConvInteger(c.clone()), false),
            LibraryOp::ConvTranspose(c) => (Op::ConvTranspose(c.clone()), true),
            LibraryOp::Concat(c) => (Op::Concat(c.clone()), false),
            LibraryOp::Softmax { axis, log } => (LibraryOp::softmax_op(*axis, *log), true),
        };
        if float_only && let Some(&b) = inputs.iter().chain([&output]).find(|&&b| self.ty(b).dtype != DType::F32) {
            return Err(format!(
                "the library's {} works on f32, not {} (buffer {})",
                ir_op.mnemonic(),
                self.ty(b),
                b.0
            ));
        }
        if let LibraryOp::Gather(_) = op
            && let Some(&ix) = inputs.get(1)
            && !matches!(self.ty(ix).dtype, DType::I32 | DType::I64)
        {
            return Err(format!("the library's gather takes i32 or i64 indices, not {}", self.ty(ix)));
        }
        self.op_types(&ir_op, inputs, std::slice::from_ref(&output))?;
        self.access(inputs, &[output], Overlap::Never)
    }

    fn copy(&mut self, src: BufferId, dst: BufferId) -> Result<(), String> {
        if self.ty(src) != self.ty(dst) {
            return Err(format!("it copies {} into {}", self.ty(src), self.ty(dst)));
        }
        self.access(&[src], &[dst], Overlap::Never)
    }

    /// The results' types are those `op`'s type rule gives for the operands'.
    fn op_types(&self, op: &Op, inputs: &[BufferId], outputs: &[BufferId]) -> Result<(), String> {
        let ins: Vec<TensorType> = inputs.iter().map(|&b| self.ty(b).clone()).collect();
        let want = match op {
            Op::Fusion(f) => f.body.infer(&ins),
            _ => kiln_ir::infer::infer(op, &ins),
        }
        .map_err(|e| format!("`{}` does not apply to its operands: {e}", op.mnemonic()))?;
        let got: Vec<&TensorType> = outputs.iter().map(|&b| self.ty(b)).collect();
        if want.iter().collect::<Vec<_>>() != got {
            let list = |v: &mut dyn Iterator<Item = String>| v.collect::<Vec<_>>().join(", ");
            return Err(format!(
                "`{}` gives {}, the step writes {}",
                op.mnemonic(),
                list(&mut want.iter().map(|t| t.to_string())),
                list(&mut got.iter().map(|t| t.to_string()))
            ));
        }
        Ok(())
    }

    fn device_step(&mut self, s: &DeviceStep, sigs: &[&[LaunchArg]]) -> Result<(), String> {
        match s {
            DeviceStep::Kernel { kernel, args } => self.launch(*kernel, args, sigs),
            DeviceStep::MatMul { a, b, out } => self.library(&LibraryOp::MatMul, &[*a, *b], *out),
            DeviceStep::Conv { x, w, bias, out, im2col } => {
                let (xt, wt, ot) = (self.ty(*x), self.ty(*w), self.ty(*out));
                let rank = xt.shape.rank();
                let fits = [xt, wt, ot].iter().all(|t| t.dtype == DType::F32 && t.shape.rank() == rank)
                    && rank >= 3
                    && xt.shape.0[0] == ot.shape.0[0]
                    && wt.shape.0[0] == ot.shape.0[1]
                    && wt.shape.0[1] == xt.shape.0[1];
                if !fits {
                    return Err(format!("a one-group f32 convolution cannot take {xt} and {wt} into {ot}"));
                }
                if let Some(k) = im2col {
                    let sig = sigs.get(*k).ok_or_else(|| format!("it launches kernel {k} of {}", sigs.len()))?;
                    if sig.len() != 2 || sig[0].ty != *xt || sig[0].writes || !sig[1].writes {
                        return Err(format!("kernel {k} is not an im2col of {xt}"));
                    }
                }
                let mut reads = vec![*x, *w];
                if let Some((b, k)) = bias {
                    let sig = sigs.get(*k).ok_or_else(|| format!("it launches kernel {k} of {}", sigs.len()))?;
                    let bt = self.ty(*b);
                    if sig.len() != 2 || sig[0].ty != *bt || sig[1].ty != *ot || sig[0].writes || !sig[1].writes {
                        return Err(format!("kernel {k} does not fill {ot} with the bias {bt}"));
                    }
                    reads.push(*b);
                }
                self.access(&reads, &[*out], Overlap::Never)
            }
            DeviceStep::Gather { kernel, data, indices, out, axis } => {
                if *axis >= self.ty(*data).shape.rank() {
                    return Err(format!("it gathers along axis {axis} of {}", self.ty(*data)));
                }
                let sig = sigs.get(*kernel).ok_or_else(|| format!("it launches kernel {kernel} of {}", sigs.len()))?;
                let want = [(*data, false), (*indices, false), (*out, true)];
                if sig.len() != 3 || sig.iter().zip(want).any(|(a, (b, w))| a.ty != *self.ty(b) || a.writes != w) {
                    return Err(format!("kernel {kernel} does not gather {} by {}", self.ty(*data), self.ty(*indices)));
                }
                self.access(&[*data, *indices], &[*out], Overlap::Never)
            }
            DeviceStep::Copy { src, dst } => self.copy(*src, *dst),
            DeviceStep::Host { op, inputs, outputs, .. } => {
                self.op_types(op, inputs, outputs)?;
                self.access(inputs, outputs, Overlap::Copies)
            }
        }
    }
}

/// Checks that the compiled body `exe` takes and gives what the region's IR body `body` declares: its inputs and
/// results in order, of the declared types.
fn region_interface(body: &kiln_ir::Graph, exe: &Executable) -> Result<(), String> {
    let declared_in: Vec<Option<&TensorType>> = body.inputs().iter().map(|&id| body.node(id).outputs.first()).collect();
    let declared_out: Vec<Option<&TensorType>> = body.outputs().iter().map(|(_, v)| body.value_type(*v)).collect();
    for (what, declared, got) in [("input", declared_in, &exe.inputs), ("result", declared_out, &exe.outputs)] {
        if declared.len() != got.len() {
            return Err(format!("the compiled body has {} {what}(s), the op's body {}", got.len(), declared.len()));
        }
        for (i, (d, (_, b))) in declared.iter().zip(got).enumerate() {
            let ty = &exe.buffers[b.0 as usize].ty;
            if *d != Some(ty) {
                return Err(format!("{what} {i} of the compiled body is {ty}, the op's body declares another type"));
            }
        }
    }
    Ok(())
}

fn home_name(home: &Home) -> &'static str {
    match home {
        Home::Input(_) => "a caller's input",
        Home::Weight(_) => "a weight",
        Home::Constant(_) => "a constant",
        Home::Prepared(_) => "a prepared weight",
        Home::Arena(_) => "an arena buffer",
        Home::Dynamic => "a per-run buffer",
    }
}

/// The launch signatures of `kernels`, for [`verify_executable`] on a freshly built program.
pub fn signatures(kernels: &[Kernel]) -> Vec<Vec<LaunchArg>> {
    kernels.iter().map(Kernel::signature).collect()
}

/// Borrows each signature of `sigs`.
pub fn borrowed(sigs: &[Vec<LaunchArg>]) -> Vec<&[LaunchArg]> {
    sigs.iter().map(Vec::as_slice).collect()
}
