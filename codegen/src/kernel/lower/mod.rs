//! Lowering a fusion group of graph nodes to one [`Kernel`].
//!
//! **Group boundary.** Operands produced outside the group become `Input` buffers (named after the graph input
//! or parameter where there is one); values used outside the group, or named as graph outputs, become `Output`
//! buffers (graph outputs first, in graph order). Constants of one element, or whose elements are all equal,
//! are inlined as scalars; other constants become `Constant` buffers carried by the kernel, so a kernel is
//! self-contained and its launch takes only real inputs and outputs.
//!
//! **Loop structure.** Each output is computed point by point in a loop nest over an iteration space: its own
//! shape, or — for a `reduce`/`arg_reduce` output reducing a suffix of its operand's dims — the operand's shape,
//! whose outer loops then carry the reduction and its store (a row reduction sits inside the row loop). Outputs
//! with the same iteration space share one nest, so values they share are computed once per point. Space
//! loops are `Parallel` (`Vectorizable` when innermost); reductions open `Reduction` loops over the reduced
//! axes, in increasing axis order, so floats fold in the interpreter's order and match it exactly.
//!
//! **Evaluation by index.** A value is produced where it is consumed, at the index the consumer asks for:
//! elementwise ops recurse into their operands, data movement (broadcast, reshape, transpose, slice, pad,
//! concat, split) only rewrites the index, reductions and normalizations open their loops at that point.
//!
//! **Sharing and hoisting rule.** A value with more than one use inside the group (an operand slot each, plus
//! one if it is an output) is bound to a `Let` the first time it is produced at a given (simplified) index, and
//! reused wherever the same index is asked for again while that binding is in scope; single-use values are
//! inlined into their consumer. Reductions (and a normalization's statistics) are memoized the same way, per
//! reduced-away index. Every `Let`, accumulator and store is placed in the outermost open loop where the loop
//! variables it reads are bound, so row statistics are computed once per row and broadcast operands once per
//! the loops they vary with. A value used at *different* indices (a softmax input read by its max loop, its sum
//! loop and its output) is recomputed per use; the cost is bounded by the group's structure, never per-element
//! quadratic, since every reduction is computed once per point of its own result.
//!
//! **Dtypes.** Elementwise ops compute in their own dtype (f16/bf16 round after each op, as the interpreter
//! does). Reductions, softmax, layer norm, batch norm and gelu compute in the interpreter's compute type (f32
//! for f16/bf16) through explicit casts, rounding once at the end.

mod nn;
mod reduce;
mod shape;
mod siblings;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kiln_ir::interp::scalar::Scalar;
use kiln_ir::op::{Iota, Op, ReduceKind};
use kiln_ir::{DType, Dim, Graph, NodeId, Shape, Value};

use super::ir::{
    AccOp, AccVar, ArgId, ArgRole, Block, Expr, Extent, IExpr, Kernel, KernelArg, LoopKind, LoopVar, Stmt, Var,
};
use super::simplify::simplify;

/// Why a group could not be lowered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LowerError {
    /// The group holds an op that is not lowered to kernel IR (a library call or a kernel of its own).
    #[error("{node}: `{op}` is not lowered to kernel IR (it becomes a library call or a kernel of its own)")]
    Unsupported {
        /// The node, as `Graph::describe` names it.
        node: String,
        /// The op's mnemonic.
        op: String,
    },
    /// A supported op whose particular use cannot be lowered (or an output outside the group's iteration space).
    #[error("{node}: {reason}")]
    NotLowerable {
        /// The node, as `Graph::describe` names it.
        node: String,
        /// Why.
        reason: String,
    },
    /// The node list is not a fusion group of this graph.
    #[error("invalid fusion group: {0}")]
    InvalidGroup(String),
}

/// How lowering treats outputs with different iteration spaces.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum SpacePolicy {
    /// Every output must have the group's iteration space or be a reduction over it (what the fuse pass
    /// forms); otherwise lowering fails, naming the output.
    #[default]
    Shared,
    /// Outputs may have unrelated iteration spaces; each space gets its own top-level loop nest. Used to lower
    /// whole test graphs as one kernel.
    Separate,
}

/// Lowering options.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct LowerOptions {
    /// Which output iteration spaces are accepted.
    pub spaces: SpacePolicy,
}

/// Lowers the nodes `group` of `graph` to a kernel called `name`, with [`LowerOptions::default`].
pub fn lower(graph: &Graph, group: &[NodeId], name: &str) -> Result<Kernel, LowerError> {
    lower_with(graph, group, name, &LowerOptions::default())
}

/// Lowers the nodes `group` of `graph` to a kernel called `name`.
pub fn lower_with(graph: &Graph, group: &[NodeId], name: &str, options: &LowerOptions) -> Result<Kernel, LowerError> {
    lower_mapped(graph, group, name, options).map(|(k, _)| k)
}

/// Lowers as [`lower_with`] does, and also says which graph value each of the kernel's args holds (in
/// `Kernel::args` order; a `Constant` arg holds its `constant` node's result): how a caller binds buffers.
pub fn lower_mapped(
    graph: &Graph,
    group: &[NodeId],
    name: &str,
    options: &LowerOptions,
) -> Result<(Kernel, Vec<Value>), LowerError> {
    let mut cx = Ctx::new(graph, group)?;
    let outputs = cx.outputs()?;
    // Iteration spaces: (domain shape, outputs computed in it).
    let mut nests: Vec<(Shape, Vec<NestOutput>)> = Vec::new();
    let mut first_space: Option<(Shape, Value)> = None;
    for &(arg, v) in &outputs {
        let (domain, how, space) = cx.output_domain(v)?;
        match &first_space {
            None => first_space = Some((space, v)),
            Some((s, first)) if options.spaces == SpacePolicy::Shared && *s != space => {
                return Err(LowerError::NotLowerable {
                    node: graph.describe(v.node),
                    reason: format!(
                        "its iteration space {space} differs from {s} (that of {}); outputs must share one \
                         iteration space or be reductions over it",
                        graph.describe(first.node)
                    ),
                });
            }
            Some(_) => {}
        }
        match nests.iter_mut().find(|(d, _)| *d == domain) {
            Some((_, outs)) => outs.push((arg, v, how)),
            None => nests.push((domain, vec![(arg, v, how)])),
        }
    }
    for (domain, outs) in nests {
        cx.nest(&domain, &outs)?;
    }
    let mut body = Block(cx.frames.pop().expect("the kernel body frame").stmts);
    siblings::fuse(&mut body);
    Ok((Kernel { name: name.to_string(), args: cx.args, symbols: cx.symbols.0, body }, cx.arg_values))
}

/// An output computed in a nest: its buffer, its value, and how its index derives from the nest's loops.
type NestOutput = (ArgId, Value, OutIndex);

/// How an output's index derives from its nest's loop variables.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum OutIndex {
    /// All of them.
    Full,
    /// The first `kept` (a reduction over the remaining, trailing dims); with `keep_dims`, zeros follow.
    Prefix { kept: usize, keep_dims: bool },
}

/// The kernel symbols a kernel's dims name so far: each distinct `Dim::Sym` becomes one, by the graph's symbol
/// name (the runtime binds symbols by name). Shared by lowering and the built-in kernels (`builtin`).
#[derive(Clone, Debug, Default)]
pub(crate) struct SymbolTable(pub(crate) Vec<String>);

impl SymbolTable {
    /// The position of symbol `name`, added if new.
    pub(crate) fn symbol(&mut self, name: &str) -> usize {
        match self.0.iter().position(|s| s == name) {
            Some(i) => i,
            None => {
                self.0.push(name.to_string());
                self.0.len() - 1
            }
        }
    }

    /// A dim as a buffer extent.
    pub(crate) fn extent(&mut self, d: &Dim) -> Extent {
        match d {
            Dim::Static(n) => Extent::Const(*n),
            Dim::Sym(s) => Extent::Sym(self.symbol(s)),
        }
    }

    /// A dim as an index expression.
    pub(crate) fn dim(&mut self, d: &Dim) -> IExpr {
        match d {
            Dim::Static(n) => IExpr::Const(*n as i64),
            Dim::Sym(s) => IExpr::Sym(self.symbol(s)),
        }
    }
}

/// What a memoized scalar is the value of.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// A graph value at an index.
    Value(Value, Vec<IExpr>),
    /// An internal quantity of a node (a softmax's row max, say: `tag` tells which) at an index.
    Internal(NodeId, u8, Vec<IExpr>),
}

/// One open block: the kernel body or a loop's body.
struct Frame {
    stmts: Vec<Stmt>,
    header: Option<(LoopVar, IExpr, LoopKind)>,
    memo: HashMap<Key, Expr>,
}

impl Frame {
    fn new(header: Option<(LoopVar, IExpr, LoopKind)>) -> Frame {
        Frame { stmts: Vec::new(), header, memo: HashMap::new() }
    }
}

/// Lowering state for one group.
struct Ctx<'g> {
    graph: &'g Graph,
    in_group: BTreeSet<NodeId>,
    args: Vec<KernelArg>,
    /// The graph value each arg holds (a constant arg: its `constant` node's result).
    arg_values: Vec<Value>,
    symbols: SymbolTable,
    inputs: HashMap<Value, ArgId>,
    constants: HashMap<NodeId, ArgId>,
    /// Uses of each group value inside the group, plus one if it is an output.
    uses: HashMap<Value, usize>,
    /// Open blocks, outermost (the kernel body) first; a statement's depth is its frame's position.
    frames: Vec<Frame>,
    loop_depth: HashMap<LoopVar, usize>,
    loop_extent: HashMap<LoopVar, Option<u64>>,
    var_depth: HashMap<Var, usize>,
    acc_depth: HashMap<AccVar, usize>,
    next_loop: u32,
    next_var: u32,
    next_acc: u32,
}

impl<'g> Ctx<'g> {
    fn new(graph: &'g Graph, group: &[NodeId]) -> Result<Ctx<'g>, LowerError> {
        let mut in_group = BTreeSet::new();
        for &id in group {
            let node =
                graph.get(id).ok_or_else(|| LowerError::InvalidGroup(format!("node {id} is not in the graph")))?;
            if matches!(node.op, Op::Input(_) | Op::Parameter(_)) {
                return Err(LowerError::InvalidGroup(format!(
                    "{} is a graph source; its value is a kernel input, not part of a group",
                    graph.describe(id)
                )));
            }
            let types = node.outputs.iter().map(|t| t.dtype);
            if let Some(d) = types
                .chain(node.inputs.iter().filter_map(|&v| graph.value_type(v).map(|t| t.dtype)))
                .find(|d| d.is_narrow())
            {
                return Err(LowerError::NotLowerable {
                    node: graph.describe(id),
                    reason: format!("{d} values are not compiled yet (kiln casts and moves them on the interpreter)"),
                });
            }
            in_group.insert(id);
        }
        if in_group.is_empty() {
            return Err(LowerError::InvalidGroup("the group is empty".into()));
        }
        let mut cx = Ctx {
            graph,
            in_group,
            args: Vec::new(),
            arg_values: Vec::new(),
            symbols: SymbolTable::default(),
            inputs: HashMap::new(),
            constants: HashMap::new(),
            uses: HashMap::new(),
            frames: vec![Frame::new(None)],
            loop_depth: HashMap::new(),
            loop_extent: HashMap::new(),
            var_depth: HashMap::new(),
            acc_depth: HashMap::new(),
            next_loop: 0,
            next_var: 0,
            next_acc: 0,
        };
        let order = graph.topo_order().map_err(|c| LowerError::InvalidGroup(format!("cycle through {}", c.0)))?;
        let members: Vec<NodeId> = order.into_iter().filter(|id| cx.in_group.contains(id)).collect();
        for id in members {
            for &v in &graph.node(id).inputs {
                *cx.uses.entry(v).or_default() += 1;
                if !cx.in_group.contains(&v.node) && !cx.inputs.contains_key(&v) {
                    let name = match &graph.get(v.node).map(|n| &n.op) {
                        Some(Op::Input(i)) => i.name.clone(),
                        Some(Op::Parameter(p)) => p.name.clone(),
                        _ => format!("{}.{}", v.node, v.index),
                    };
                    let id = cx.add_arg(name, v, ArgRole::Input)?;
                    cx.inputs.insert(v, id);
                }
            }
        }
        Ok(cx)
    }

    /// The output buffers: graph outputs produced in the group (in graph order), then values used outside it.
    fn outputs(&mut self) -> Result<Vec<(ArgId, Value)>, LowerError> {
        let mut outs: Vec<(String, Value)> = Vec::new();
        for (name, v) in self.graph.outputs() {
            if self.in_group.contains(&v.node) && !outs.iter().any(|(_, o)| o == v) {
                outs.push((name.clone(), *v));
            }
        }
        let mut external: BTreeMap<Value, ()> = BTreeMap::new();
        for &id in &self.in_group {
            for i in 0..self.graph.node(id).outputs.len() {
                let v = Value::new(id, i as u32);
                if self.graph.uses(v).iter().any(|(user, _)| !self.in_group.contains(user)) {
                    external.insert(v, ());
                }
            }
        }
        for v in external.into_keys() {
            if !outs.iter().any(|(_, o)| *o == v) {
                outs.push((format!("{}.{}", v.node, v.index), v));
            }
        }
        if outs.is_empty() {
            return Err(LowerError::InvalidGroup("no value of the group is used outside it".into()));
        }
        let mut result = Vec::with_capacity(outs.len());
        for (name, v) in outs {
            *self.uses.entry(v).or_default() += 1;
            let id = self.add_arg(name, v, ArgRole::Output)?;
            result.push((id, v));
        }
        Ok(result)
    }

    fn add_arg(&mut self, name: String, v: Value, role: ArgRole) -> Result<ArgId, LowerError> {
        let ty = self.value_type(v)?;
        let shape = ty.shape.0.iter().map(|d| self.extent(d)).collect();
        self.args.push(KernelArg { name, dtype: ty.dtype, shape, role });
        self.arg_values.push(v);
        Ok(ArgId(self.args.len() as u32 - 1))
    }

    fn value_type(&self, v: Value) -> Result<kiln_ir::TensorType, LowerError> {
        self.graph.value_type(v).cloned().ok_or_else(|| {
            LowerError::InvalidGroup(format!(
                "operand {}#{} has no type: its node or result is missing",
                v.node, v.index
            ))
        })
    }

    fn shape(&self, v: Value) -> Result<Shape, LowerError> {
        Ok(self.value_type(v)?.shape)
    }

    fn dtype(&self, v: Value) -> Result<DType, LowerError> {
        Ok(self.value_type(v)?.dtype)
    }

    fn extent(&mut self, d: &Dim) -> Extent {
        self.symbols.extent(d)
    }

    /// A dim as an index expression.
    fn dim(&mut self, d: &Dim) -> IExpr {
        self.symbols.dim(d)
    }

    /// The product of dims as an index expression.
    fn dims_product(&mut self, dims: &[Dim]) -> IExpr {
        let mut acc = IExpr::Const(1);
        for d in dims {
            let e = self.dim(d);
            acc = IExpr::times(acc, e);
        }
        self.simp(acc)
    }

    fn simp(&self, e: IExpr) -> IExpr {
        simplify(&e, &|v| self.loop_extent.get(&v).copied().flatten())
    }

    /// The row-major element offset of `idx` in `shape`.
    fn flat(&mut self, idx: &[IExpr], shape: &Shape) -> IExpr {
        let mut acc = IExpr::Const(0);
        for (i, d) in idx.iter().zip(&shape.0) {
            let n = self.dim(d);
            acc = IExpr::plus(IExpr::times(acc, n), i.clone());
        }
        self.simp(acc)
    }

    fn node_err(&self, id: NodeId, reason: impl Into<String>) -> LowerError {
        LowerError::NotLowerable { node: self.graph.describe(id), reason: reason.into() }
    }

    // ---- placement -------------------------------------------------------------------------------------------

    fn iexpr_depth(&self, e: &IExpr) -> usize {
        let own = match e {
            IExpr::Var(v) => self.loop_depth.get(v).copied().unwrap_or(0),
            _ => 0,
        };
        e.children().into_iter().map(|c| self.iexpr_depth(c)).fold(own, usize::max)
    }

    fn expr_depth(&self, e: &Expr) -> usize {
        match e {
            Expr::Const(_) => 0,
            Expr::Load { index, .. } | Expr::Index { value: index, .. } => self.iexpr_depth(index),
            Expr::Var(v) => self.var_depth.get(v).copied().unwrap_or(0),
            Expr::Acc(a) => self.acc_depth.get(a).copied().unwrap_or(0),
            Expr::Cond(c) => self.iexpr_depth(&c.lhs).max(self.iexpr_depth(&c.rhs)),
            Expr::Unary(_, x) | Expr::Cast(x, _) => self.expr_depth(x),
            Expr::Binary(_, a, b) => self.expr_depth(a).max(self.expr_depth(b)),
            Expr::Select(c, a, b) => self.expr_depth(c).max(self.expr_depth(a)).max(self.expr_depth(b)),
        }
    }

    fn lookup(&self, key: &Key) -> Option<Expr> {
        self.frames.iter().rev().find_map(|f| f.memo.get(key).cloned())
    }

    /// Binds `e` to a `Let` in the outermost frame where it can be computed, remembering it under `key`.
    fn bind(&mut self, key: Key, e: Expr, dtype: DType) -> Expr {
        if matches!(e, Expr::Const(_) | Expr::Var(_) | Expr::Acc(_)) {
            return e;
        }
        let depth = self.expr_depth(&e);
        let var = Var(self.next_var);
        self.next_var += 1;
        self.var_depth.insert(var, depth);
        let frame = &mut self.frames[depth];
        frame.stmts.push(Stmt::Let { var, dtype, value: e });
        frame.memo.insert(key, Expr::Var(var));
        Expr::Var(var)
    }

    /// Opens a loop over `0..extent` and returns its variable — or, for an extent of 1, opens nothing and
    /// returns 0 (the second result says whether a loop was opened).
    fn new_loop(&mut self, extent: IExpr, kind: LoopKind) -> (IExpr, bool) {
        let extent = self.simp(extent);
        if extent == IExpr::Const(1) {
            return (IExpr::Const(0), false);
        }
        let var = LoopVar(self.next_loop);
        self.next_loop += 1;
        self.loop_depth.insert(var, self.frames.len());
        self.loop_extent.insert(var, extent.as_const().map(|c| c.max(0) as u64));
        self.frames.push(Frame::new(Some((var, extent, kind))));
        (IExpr::Var(var), true)
    }

    /// Closes the innermost loop, appending it to its parent unless its body is empty (`keep_empty` aside).
    fn close_loop(&mut self, keep_empty: bool) {
        let frame = self.frames.pop().expect("an open loop");
        let (var, extent, kind) = frame.header.expect("a loop frame");
        if frame.stmts.is_empty() && !keep_empty {
            return;
        }
        let innermost = !frame.stmts.iter().any(|s| matches!(s, Stmt::For { .. }));
        let kind = if kind == LoopKind::Parallel && innermost { LoopKind::Vectorizable } else { kind };
        let parent = self.frames.last_mut().expect("a parent frame");
        parent.stmts.push(Stmt::For { var, extent, kind, body: Block(frame.stmts) });
    }

    /// A reduction memoized under `key`, computed in the outermost frame where `index_depth`'s variables are
    /// bound: an accumulator, `Reduction` loops over `extents`, and an update with what `body` gives for the
    /// loops' variables (a value of `dtype`, and a position for arg ops).
    fn reduction(
        &mut self,
        key: Key,
        index_depth: usize,
        dtype: DType,
        op: AccOp,
        extents: Vec<IExpr>,
        body: impl FnOnce(&mut Self, &[IExpr]) -> Result<(Expr, Option<IExpr>), LowerError>,
    ) -> Result<Expr, LowerError> {
        if let Some(e) = self.lookup(&key) {
            return Ok(e);
        }
        let stashed = self.frames.split_off(index_depth + 1);
        let acc = AccVar(self.next_acc);
        self.next_acc += 1;
        self.acc_depth.insert(acc, index_depth);
        self.frames[index_depth].stmts.push(Stmt::Acc { var: acc, dtype, op });
        let loops: Vec<(IExpr, bool)> = extents.into_iter().map(|e| self.new_loop(e, LoopKind::Reduction)).collect();
        let opened = loops.iter().filter(|l| l.1).count();
        let vars: Vec<IExpr> = loops.into_iter().map(|l| l.0).collect();
        let result = body(self, &vars);
        let ok = result.is_ok();
        if let Ok((value, position)) = result.as_ref() {
            let top = self.frames.last_mut().expect("a frame");
            top.stmts.push(Stmt::Update { acc, value: value.clone(), position: position.clone() });
        }
        for _ in 0..opened {
            self.close_loop(true);
        }
        self.frames.extend(stashed);
        if !ok {
            return result.map(|_| Expr::Acc(acc));
        }
        self.frames[index_depth].memo.insert(key, Expr::Acc(acc));
        Ok(Expr::Acc(acc))
    }

    // ---- nests and values ------------------------------------------------------------------------------------

    /// The iteration space an output is computed in, how its index derives from that space's loops, and the
    /// space it belongs to for [`SpacePolicy::Shared`].
    fn output_domain(&self, v: Value) -> Result<(Shape, OutIndex, Shape), LowerError> {
        let node = self.graph.node(v.node);
        let own = self.shape(v)?;
        let reduced = match &node.op {
            Op::Reduce(r) => Some((r.axes.clone(), r.keep_dims)),
            Op::ArgReduce(r) => Some((vec![r.axis], r.keep_dims)),
            _ => None,
        };
        let Some((axes, keep_dims)) = reduced else { return Ok((own.clone(), OutIndex::Full, own)) };
        let operand = self.shape(node.inputs[0])?;
        let rank = operand.rank();
        let axes = kiln_ir::infer::normalize_axes(&axes, rank).map_err(|m| self.node_err(v.node, m))?;
        let kept = rank - axes.len();
        if axes.iter().enumerate().all(|(i, &a)| a == kept + i) {
            Ok((operand.clone(), OutIndex::Prefix { kept, keep_dims }, operand))
        } else {
            Ok((own, OutIndex::Full, operand))
        }
    }

    /// One top-level loop nest over `domain`, storing `outputs`.
    fn nest(&mut self, domain: &Shape, outputs: &[NestOutput]) -> Result<(), LowerError> {
        let mut vars = Vec::with_capacity(domain.rank());
        let mut opened = 0;
        for d in &domain.0 {
            let e = self.dim(d);
            let (var, open) = self.new_loop(e, LoopKind::Parallel);
            vars.push(var);
            opened += usize::from(open);
        }
        let mut result = Ok(());
        for &(arg, v, how) in outputs {
            let idx: Vec<IExpr> = match how {
                OutIndex::Full => vars.clone(),
                OutIndex::Prefix { kept, keep_dims } => {
                    let mut idx = vars[..kept].to_vec();
                    if keep_dims {
                        idx.extend((kept..vars.len()).map(|_| IExpr::Const(0)));
                    }
                    idx
                }
            };
            let stored = self.value_at(v, &idx).and_then(|value| {
                let shape = self.shape(v)?;
                Ok((self.flat(&idx, &shape), value))
            });
            match stored {
                Ok((index, value)) => {
                    let depth = self.iexpr_depth(&index).max(self.expr_depth(&value));
                    self.frames[depth].stmts.push(Stmt::Store { arg, index, value });
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        for _ in 0..opened {
            self.close_loop(false);
        }
        result
    }

    /// The scalar value of `v` at `idx` (one index per dim of its shape).
    fn value_at(&mut self, v: Value, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let idx: Vec<IExpr> = idx.iter().map(|i| self.simp(i.clone())).collect();
        let shared = self.uses.get(&v).copied().unwrap_or(0) > 1;
        let key = Key::Value(v, idx.clone());
        if shared && let Some(e) = self.lookup(&key) {
            return Ok(e);
        }
        let e = match self.inputs.get(&v) {
            Some(&arg) => {
                let shape = self.shape(v)?;
                Expr::Load { arg, index: self.flat(&idx, &shape) }
            }
            None => self.node_at(v, &idx)?,
        };
        Ok(if shared { self.bind(key, e, self.dtype(v)?) } else { e })
    }

    fn node_at(&mut self, v: Value, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let graph = self.graph;
        let node = graph.node(v.node);
        let ins = &node.inputs;
        let out_shape = self.shape(v)?;
        match &node.op {
            Op::Constant(c) => Ok(self.constant(v.node, &c.value, idx)),
            Op::Iota(i) => self.iota(v.node, i, idx),
            Op::Unary(k) => Ok(Expr::unary(*k, self.value_at(ins[0], idx)?)),
            Op::Binary(k) => {
                let a = self.broadcast_operand(ins[0], idx, &out_shape)?;
                let b = self.broadcast_operand(ins[1], idx, &out_shape)?;
                Ok(Expr::binary(*k, a, b))
            }
            Op::Cast(c) => Ok(Expr::cast(self.value_at(ins[0], idx)?, self.dtype(ins[0])?, c.to)),
            Op::Select => {
                let c = self.broadcast_operand(ins[0], idx, &out_shape)?;
                let a = self.broadcast_operand(ins[1], idx, &out_shape)?;
                let b = self.broadcast_operand(ins[2], idx, &out_shape)?;
                Ok(Expr::select(c, a, b))
            }
            Op::Broadcast(_) => self.broadcast_operand(ins[0], idx, &out_shape),
            Op::Reshape(_) => self.reshape(ins[0], idx, &out_shape),
            Op::Transpose(t) => self.transpose(ins[0], &t.perm, idx),
            Op::Slice(s) => self.slice(v.node, ins[0], s, idx),
            Op::Pad(p) => self.pad(v.node, ins[0], p, idx),
            Op::Resize(r) => {
                let inside = match r.mode {
                    kiln_ir::op::ResizeMode::Nearest => self.resize_nearest(v.node, ins[0], r, &out_shape, idx),
                    kiln_ir::op::ResizeMode::Linear if !r.antialias => {
                        self.resize_linear(v.node, ins[0], r, &out_shape, idx)
                    }
                    kiln_ir::op::ResizeMode::Linear | kiln_ir::op::ResizeMode::Cubic => {
                        self.resize_filtered(v.node, ins[0], r, &out_shape, idx)
                    }
                }?;
                self.crop_extrapolation(v.node, ins[0], r, &out_shape, idx, inside)
            }
            Op::Concat(c) => self.concat(v.node, ins, c.axis, idx),
            Op::Split(s) => self.split(v.node, ins[0], s, v.index as usize, idx),
            Op::ShapeOf => self.shape_of(ins[0], idx),
            Op::Reduce(r) => self.reduce(v, r, idx),
            Op::ArgReduce(r) => self.arg_reduce(v, r, idx),
            Op::Softmax(s) => self.softmax(v, s.axis, false, idx),
            Op::LogSoftmax(s) => self.softmax(v, s.axis, true, idx),
            Op::LayerNorm(l) => self.layer_norm(v, l, idx),
            Op::BatchNorm(b) => self.batch_norm(v, b.epsilon, idx),
            Op::Gelu(g) => self.gelu(v, g.approximate, idx),
            Op::Input(_) | Op::Parameter(_) => {
                Err(LowerError::InvalidGroup(format!("{} is a graph source inside the group", graph.describe(v.node))))
            }
            op @ (Op::MatMul
            | Op::Conv(_)
            | Op::MatMulInteger
            | Op::ConvInteger(_)
            | Op::DynamicQuantize
            | Op::ConvTranspose(_)
            | Op::Pool(_)
            | Op::Gather(_)
            | Op::GatherElements(_)
            | Op::Scatter(_)
            | Op::Lstm(_)
            | Op::Gru(_)
            | Op::TopK(_)
            | Op::NonZero(_)
            | Op::Unique(_)
            | Op::NonMaxSuppression(_)
            | Op::GridSample(_)
            | Op::RoiAlign(_)
            | Op::If(_)
            | Op::Loop(_)
            | Op::Fusion(_)) => {
                Err(LowerError::Unsupported { node: graph.describe(v.node), op: op.mnemonic().to_string() })
            }
        }
    }

    /// `v` read at the broadcast of `idx` (an index of `to`) onto its own shape (numpy rules).
    fn broadcast_operand(&mut self, v: Value, idx: &[IExpr], to: &Shape) -> Result<Expr, LowerError> {
        let from = self.shape(v)?;
        let lead = to.rank() - from.rank();
        let own: Vec<IExpr> = from
            .0
            .iter()
            .enumerate()
            .map(|(d, dim)| if *dim == Dim::Static(1) { IExpr::Const(0) } else { idx[lead + d].clone() })
            .collect();
        self.value_at(v, &own)
    }

    /// A constant's element: inline when it has one distinct value, otherwise a load from a constant buffer.
    fn constant(&mut self, id: NodeId, t: &kiln_ir::Tensor, idx: &[IExpr]) -> Expr {
        if t.is_empty() {
            // Never evaluated: no loop visits an element of an empty value.
            return Expr::Const(AccOp::Sum.identity(t.dtype()));
        }
        let first = Scalar::read(t.data(), 0);
        if (1..t.len()).all(|i| Scalar::read(t.data(), i) == first) {
            return Expr::Const(first);
        }
        let arg = match self.constants.get(&id) {
            Some(&a) => a,
            None => {
                let shape = t.shape().iter().map(|&d| Extent::Const(d as u64)).collect();
                let name = format!("{}", id);
                let role = ArgRole::Constant(Arc::new(t.clone()));
                self.args.push(KernelArg { name, dtype: t.dtype(), shape, role });
                self.arg_values.push(Value::new(id, 0));
                let a = ArgId(self.args.len() as u32 - 1);
                self.constants.insert(id, a);
                a
            }
        };
        let shape = t.tensor_type().shape;
        Expr::Load { arg, index: self.flat(idx, &shape) }
    }

    /// A constant table the lowering made (not a graph constant), as a new constant arg; `near` is the value it
    /// serves (what the arg is listed as holding: constants are never bound to buffers).
    fn table(&mut self, near: Value, t: kiln_ir::Tensor) -> ArgId {
        let shape = t.shape().iter().map(|&d| Extent::Const(d as u64)).collect();
        let name = format!("table{}", self.args.len());
        self.args.push(KernelArg { name, dtype: t.dtype(), shape, role: ArgRole::Constant(Arc::new(t)) });
        self.arg_values.push(near);
        ArgId(self.args.len() as u32 - 1)
    }

    /// `start + i * step` in f64, converted to the dtype as `cast` converts.
    fn iota(&mut self, id: NodeId, i: &Iota, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let axis = kiln_ir::types::normalize_axis(i.axis, idx.len()).map_err(|m| self.node_err(id, m))?;
        let pos = Expr::index(idx[axis].clone(), DType::F64);
        let scaled = Expr::binary(kiln_ir::op::BinaryOp::Mul, pos, Expr::Const(Scalar::F64(i.step)));
        let value = Expr::binary(kiln_ir::op::BinaryOp::Add, Expr::Const(Scalar::F64(i.start)), scaled);
        Ok(Expr::cast(value, DType::F64, i.dtype))
    }
}

/// The dtype arithmetic of reductions and normalizations runs in: f32 for f16 and bf16, else the dtype itself.
pub(crate) fn compute_type(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

/// The accumulator op of a reduction kind (mean sums, then divides).
fn acc_op(kind: ReduceKind) -> AccOp {
    match kind {
        ReduceKind::Sum | ReduceKind::Mean => AccOp::Sum,
        ReduceKind::Prod => AccOp::Prod,
        ReduceKind::Max => AccOp::Max,
        ReduceKind::Min => AccOp::Min,
    }
}
