//! The import walk: graph inputs, initializers, nodes in order, outputs; constant folding and problem collection.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use kiln_ir::{Builder, DType, Dim, Graph, Op, Shape, Tensor, TensorType, Value};
use onnx_protobuf::{GraphProto, ModelProto, NodeProto, ValueInfoProto};

use crate::node::OnnxNode;
use crate::tensor::{dtype_from_onnx, tensor_from_proto};
use crate::{ImportError, ImportOptions, Unsupported, ops};

/// Lowest and highest default-domain opset kiln imports: 7–21 is the range every handler is written against;
/// 22–28 (ONNX 1.23) changed no semantics of the ops kiln imports (they added types and new ops), which ONNX's
/// own node tests at those opsets confirm in `kiln conformance`.
pub const OPSETS: std::ops::RangeInclusive<i64> = 7..=28;

/// The error of a handler whose subgraph depends on an unsupported node: already reported, so not again.
const REPORTED: &str = "a subgraph output depends on an unsupported node (reported)";

/// Operand sets at most this large are folded at import time when all their values are known.
const FOLD_LIMIT: usize = 1 << 16;

/// An imported ONNX value: its IR value and type, plus what is known about its contents.
#[derive(Clone, Debug)]
pub(crate) struct Val {
    pub v: Value,
    pub ty: TensorType,
    /// The value, when known at import time.
    pub konst: Option<Arc<Tensor>>,
    /// For a rank-0/1 integer tensor holding extents: each element, possibly symbolic.
    pub dims: Option<Vec<DimArg>>,
}

impl Val {
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn rank(&self) -> usize {
        self.ty.shape.rank()
    }

    /// The static extents of this value's type.
    pub fn static_shape(&self) -> Option<Vec<usize>> {
        self.ty.shape.as_static()
    }

    /// The known contents as integers.
    pub fn ints(&self) -> Option<Vec<i64>> {
        self.konst.as_ref().map(|t| t.to_i64_vec())
    }

    /// The known contents as floats.
    pub fn floats(&self) -> Option<Vec<f64>> {
        self.konst.as_ref().map(|t| t.to_f64_vec())
    }

    /// The elements of a rank-0/1 integer tensor as shape arguments: known integers, or tracked symbolic dims.
    pub fn dim_args(&self) -> Option<Vec<DimArg>> {
        match self.ints() {
            Some(v) => Some(v.into_iter().map(DimArg::Int).collect()),
            None => self.dims.clone(),
        }
    }
}

/// One element of a shape argument.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum DimArg {
    Int(i64),
    Sym(String),
}

impl From<Dim> for DimArg {
    fn from(d: Dim) -> DimArg {
        match d {
            Dim::Static(n) => DimArg::Int(n as i64),
            Dim::Sym(s) => DimArg::Sym(s),
        }
    }
}

/// A sequence or an optional, resolved at import time ([`crate::ops::sequence`]): the ONNX names of the tensor
/// values it holds (or of the sequence an optional holds).
#[derive(Clone, Debug)]
pub(crate) enum Composite {
    Seq(Vec<String>),
    Optional(Option<String>),
}

/// Import state.
pub(crate) struct Ctx<'m> {
    pub b: Builder,
    scopes: Vec<HashMap<String, Option<Val>>>,
    /// The sequences and optionals defined so far, by ONNX name, one table per scope of `scopes` (their
    /// elements live there).
    composites: Vec<HashMap<String, Composite>>,
    pub problems: Vec<Unsupported>,
    pub opset: i64,
    pub base_dir: Option<&'m Path>,
    node_name: Option<String>,
    /// The graph inputs a caller feeds (for messages that say how to give a value import needs).
    graph_inputs: std::collections::HashSet<String>,
    /// The data-dependent dims issued so far ([`Ctx::fresh_symbol`]).
    issued: std::collections::HashSet<String>,
    /// The enclosing graphs while a region is imported, outermost first ([`Ctx::region`]).
    frames: Vec<Frame>,
    /// How many subgraphs enclose the node being imported.
    depth: usize,
}

/// An enclosing graph while a region (an `If` branch, a loop body) is imported: its builder, the first of the
/// region's scopes, and the values the region has captured from it.
struct Frame {
    outer: Builder,
    base: usize,
    /// The region's own inputs (`p0`, … before the captures).
    formal: usize,
    /// Each capture: its key (the ONNX name, or a synthetic one) and its value in the enclosing graph.
    captures: Vec<(String, Val)>,
    /// By key: the capture's value inside the region.
    captured: HashMap<String, Val>,
}

/// Work done inside a region before its graph's nodes, given the region's own inputs ([`Ctx::region`]).
pub(crate) type Prelude<'a, 'm> = dyn FnMut(&mut Ctx<'m>, &[Val]) -> Result<(), String> + 'a;

/// An imported region: its body, and the enclosing values its captures bind (the operands after the op's own).
pub(crate) struct Region {
    pub body: kiln_ir::fusion::FusionBody,
    pub captures: Vec<(String, Val)>,
    /// The body's output types, in order.
    pub outputs: Vec<TensorType>,
}

impl<'m> Ctx<'m> {
    /// The value named `name` in the model's graph, outside any region.
    fn find(&self, name: &str) -> Option<&Option<Val>> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }

    /// The value named `name` in the innermost scope that defines it (`Some(None)`: defined by an unsupported
    /// node). Inside a region a value of an enclosing graph is captured on first use: re-created when it is a
    /// small known constant, else bound to a new body input.
    fn lookup(&mut self, name: &str) -> Result<Option<Option<Val>>, String> {
        let Some((index, found)) =
            self.scopes.iter().enumerate().rev().find_map(|(i, s)| s.get(name).map(|v| (i, v.clone())))
        else {
            return Ok(None);
        };
        let Some(v) = found else { return Ok(Some(None)) };
        let level = self.frames.iter().filter(|f| f.base <= index).count();
        self.bring(name, v, level).map(|v| Some(Some(v)))
    }

    /// `v`, a value of the graph at nesting `level` (0: the model's graph), made available in the current region
    /// through every region in between; `key` identifies it among each region's captures.
    fn bring(&mut self, key: &str, mut v: Val, level: usize) -> Result<Val, String> {
        for l in level + 1..=self.frames.len() {
            let f = l - 1;
            if let Some(inner) = self.frames[f].captured.get(key) {
                v = inner.clone();
                continue;
            }
            let index = self.frames[f].formal + self.frames[f].captures.len();
            let b = if l == self.frames.len() { &mut self.b } else { &mut self.frames[l].outer };
            let small = v.konst.as_ref().filter(|k| k.len() <= kiln_ir::builder::INLINE_CONSTANT_LIMIT);
            let id = match small {
                Some(k) => b.constant((**k).clone()),
                None => b.input(&kiln_ir::fusion::FusionBody::param_name(index), v.ty.dtype, v.ty.shape.clone()),
            }
            .map_err(|e| e.to_string())?;
            let inner = Val { v: id, ..v.clone() };
            if small.is_none() {
                self.frames[f].captures.push((key.to_string(), v));
            }
            self.frames[f].captured.insert(key.to_string(), inner.clone());
            v = inner;
        }
        Ok(v)
    }

    /// `v`, a value of the graph enclosing the current region, captured into it.
    pub fn capture(&mut self, v: &Val) -> Result<Val, String> {
        let key = format!("\u{0}{}#{}", v.v.node.0, v.v.index);
        self.bring(&key, v.clone(), self.frames.len() - 1)
    }

    /// The builder of the model's graph, where weights live (region bodies hold no parameters).
    fn root(&mut self) -> &mut Builder {
        match self.frames.first_mut() {
            Some(f) => &mut f.outer,
            None => &mut self.b,
        }
    }

    /// A weight of the model's graph, under `name` or a variant of it that is free, brought into the current
    /// region.
    fn hoisted_weight(&mut self, name: &str, t: Arc<Tensor>) -> Result<Val, String> {
        let root = self.root();
        let mut result = root.weight(name, t.clone());
        let mut k = 1;
        while result.is_err() && k < 1000 {
            result = root.weight(&format!("{name}.{k}"), t.clone());
            k += 1;
        }
        let id = result.map_err(|e| e.to_string())?;
        let ty = t.tensor_type();
        let v = Val { v: id, ty, konst: Some(t), dims: None };
        self.bring(&format!("\u{0}weight{}", id.node.0), v, 0)
    }

    /// One subgraph deeper, within [`kiln_ir::fusion::MAX_NESTING`].
    fn enter(&mut self) -> Result<(), String> {
        if self.depth >= kiln_ir::fusion::MAX_NESTING {
            return Err(format!("subgraphs nest more than {} deep", kiln_ir::fusion::MAX_NESTING));
        }
        self.depth += 1;
        Ok(())
    }

    /// Imports `g` as a region: a body graph whose inputs `p0`, `p1`, … are first the region's own inputs
    /// `formal` (each an ONNX name, empty for none, and a type), then the values `seed` lists (captures of
    /// another region of the same op, so both bind the same operands), then whatever enclosing values `g` reads.
    /// `prelude` runs inside the region before `g`'s nodes (it may define names); `lead` lists formal inputs
    /// that become body outputs before `g`'s own.
    pub fn region(
        &mut self,
        g: &GraphProto,
        formal: &[(String, TensorType)],
        seed: &[(String, Val)],
        prelude: &mut Prelude<'_, 'm>,
        lead: &[usize],
    ) -> Result<Region, String> {
        self.enter()?;
        let name = if g.name.is_empty() { "region".to_string() } else { g.name.clone() };
        let outer = std::mem::replace(&mut self.b, Builder::new(name));
        self.scopes.push(HashMap::new());
        self.composites.push(HashMap::new());
        let base = self.scopes.len() - 1;
        self.frames.push(Frame { outer, base, formal: formal.len(), captures: Vec::new(), captured: HashMap::new() });
        let result = (|| -> Result<Vec<Val>, String> {
            let mut vals = Vec::with_capacity(formal.len());
            for (i, (name, ty)) in formal.iter().enumerate() {
                let id = (self.b.input(&kiln_ir::fusion::FusionBody::param_name(i), ty.dtype, ty.shape.clone()))
                    .map_err(|e| e.to_string())?;
                let v = self.wrap(id, None);
                if !name.is_empty() {
                    self.define(name, Some(v.clone()));
                }
                vals.push(v);
            }
            let level = self.frames.len() - 1;
            for (key, v) in seed {
                self.bring(key, v.clone(), level)?;
            }
            prelude(self, &vals)?;
            self.walk(g)?;
            let mut outs: Vec<Val> = lead.iter().map(|&i| vals[i].clone()).collect();
            for o in &g.output {
                match self.lookup(&o.name)? {
                    Some(Some(v)) => outs.push(v),
                    Some(None) => return Err(REPORTED.into()),
                    None => return Err(self.undefined(&o.name, "subgraph output")),
                }
            }
            Ok(outs)
        })();
        self.scopes.pop();
        self.composites.pop();
        let frame = self.frames.pop().expect("the region's frame");
        self.depth -= 1;
        let body = std::mem::replace(&mut self.b, frame.outer);
        let outs = result?;
        let mut body = body;
        for (k, v) in outs.iter().enumerate() {
            body.output(&format!("o{k}"), v.v);
        }
        Ok(Region {
            body: kiln_ir::fusion::FusionBody(Box::new(body.finish())),
            captures: frame.captures,
            outputs: outs.into_iter().map(|v| v.ty).collect(),
        })
    }

    /// The tensor value named `name` (a sequence's element), captured into the region being imported if it
    /// is an enclosing graph's.
    pub(crate) fn element(&mut self, name: &str) -> Result<Val, String> {
        match self.lookup(name)? {
            Some(Some(v)) => Ok(v),
            Some(None) => Err(REPORTED.into()),
            None => Err(format!("`{name}` is not defined")),
        }
    }

    /// Imports graph `g` inline, its inputs bound to `args` in order, in a scope of its own that sees the
    /// enclosing values (an `If` branch, a `SequenceMap` body once per element); returns its outputs, which must
    /// be tensors.
    pub(crate) fn inline(&mut self, g: &GraphProto, args: Vec<Val>) -> Result<Vec<Val>, String> {
        self.enter()?;
        self.scopes.push(HashMap::new());
        self.composites.push(HashMap::new());
        let result = (|| {
            for (vi, v) in g.input.iter().zip(args) {
                self.define(&vi.name, Some(v));
            }
            self.walk(g)?;
            g.output
                .iter()
                .map(|o| match self.lookup(&o.name)? {
                    Some(Some(v)) => Ok(v),
                    Some(None) => Err(REPORTED.into()),
                    None => Err(self.undefined(&o.name, "subgraph output")),
                })
                .collect()
        })();
        self.scopes.pop();
        self.composites.pop();
        self.depth -= 1;
        result
    }

    /// The sequence or optional named `name` in the innermost scope that defines one.
    fn composite(&self, name: &str) -> Option<&Composite> {
        self.composites.iter().rev().find_map(|c| c.get(name))
    }

    /// Why `name` is no tensor here, for `what` (an operand, an output): a sequence or optional, which only the
    /// sequence ops take, or a name nothing defines.
    fn undefined(&self, name: &str, what: &str) -> String {
        match self.composite(name) {
            Some(Composite::Seq(_)) => {
                format!(
                    "{what} `{name}` is a sequence: only the sequence ops take one (kiln resolves sequences at import)"
                )
            }
            Some(Composite::Optional(_)) => {
                format!("{what} `{name}` is an optional: only the optional ops take one (kiln resolves them at import)")
            }
            None => format!("{what} `{name}` is not defined"),
        }
    }

    /// The operand `name` of a sequence op: a tensor, a sequence or an optional; `Ok(None)` when poisoned (its
    /// cause is reported upstream).
    fn item(&mut self, name: &str, depth: usize) -> Result<Option<ops::sequence::Item>, String> {
        use ops::sequence::Item;
        if let Some(c) = self.composite(name).cloned() {
            return Ok(Some(match c {
                Composite::Seq(elems) => Item::Seq(elems),
                Composite::Optional(None) => Item::Optional(None),
                Composite::Optional(Some(inner)) if depth < 8 => match self.item(&inner, depth + 1)? {
                    Some(i) => Item::Optional(Some(Box::new(i))),
                    None => return Ok(None),
                },
                Composite::Optional(Some(_)) => return Err("optionals nest too deep".into()),
            }));
        }
        match self.lookup(name)? {
            Some(Some(v)) => Ok(Some(Item::Tensor(v))),
            Some(None) => Ok(None),
            None => Err(format!("`{name}`, which is not defined before it")),
        }
    }

    pub(crate) fn define(&mut self, name: &str, v: Option<Val>) {
        self.scopes.last_mut().expect("a scope").insert(name.to_string(), v);
    }

    fn wrap(&self, v: Value, konst: Option<Arc<Tensor>>) -> Val {
        let ty = self.b.graph().value_type(v).expect("a value just built").clone();
        Val { v, ty, konst, dims: None }
    }

    /// A new symbol for a data-dependent dim (the extent of `non_zero`'s result, say), named after the ONNX value
    /// `hint` it sizes (`<hint>_len`, then `<hint>_len2`, …): never a symbol of a graph input nor one issued
    /// before.
    pub fn fresh_symbol(&mut self, hint: &str) -> String {
        let g = self.frames.first().map_or(&self.b, |f| &f.outer).graph();
        let mut taken: std::collections::HashSet<String> = g
            .inputs()
            .iter()
            .flat_map(|&id| g.node(id).outputs.iter().flat_map(|t| t.shape.0.iter()))
            .filter_map(|d| match d {
                Dim::Sym(s) => Some(s.clone()),
                Dim::Static(_) => None,
            })
            .collect();
        taken.extend(self.issued.iter().cloned());
        let base = format!("{}_len", sanitize(hint));
        let name = (1..)
            .map(|k| if k == 1 { base.clone() } else { format!("{base}{k}") })
            .find(|n| !taken.contains(n))
            .expect("an unbounded sequence of names");
        self.issued.insert(name.clone());
        name
    }

    /// A constant value.
    pub fn constant(&mut self, t: Tensor) -> Result<Val, String> {
        if !self.frames.is_empty() && t.len() > kiln_ir::builder::INLINE_CONSTANT_LIMIT {
            return self.hoisted_weight("const", Arc::new(t));
        }
        let t = Arc::new(t);
        let v = self.b.constant((*t).clone()).map_err(|e| e.to_string())?;
        Ok(self.wrap(v, Some(t)))
    }

    /// A scalar constant of `dtype`.
    pub fn scalar(&mut self, dtype: DType, v: f64) -> Result<Val, String> {
        self.constant(
            Tensor::new(vec![], kiln_ir::Data::from_f64_iter(dtype, std::iter::once(v))).expect("one element"),
        )
    }

    /// Applies a single-result op, folding it when every operand is known and small.
    pub fn op(&mut self, op: Op, ins: &[&Val]) -> Result<Val, String> {
        let mut out = self.op_multi(op, ins)?;
        if out.len() != 1 {
            return Err(format!("internal: expected one result, got {}", out.len()));
        }
        Ok(out.remove(0))
    }

    /// Applies an op, folding it when every operand is known and small (nullary ops such as `iota` always fold
    /// when their result is small).
    pub fn op_multi(&mut self, op: Op, ins: &[&Val]) -> Result<Vec<Val>, String> {
        let known: Option<Vec<&Tensor>> = ins.iter().map(|v| v.konst.as_deref()).collect();
        if let Some(known) = known
            && known.iter().map(|t| t.len()).sum::<usize>() <= FOLD_LIMIT
        {
            // Type-check as if built, so folding never hides a type error; and size the results from their types
            // before evaluating, so a huge constant (`ConstantOfShape` of [2^31]) is never materialized.
            let types: Vec<TensorType> = ins.iter().map(|v| v.ty.clone()).collect();
            let result_types = kiln_ir::infer::infer(&op, &types).map_err(|e| format!("{}: {e}", op.mnemonic()))?;
            let small = |t: &TensorType| t.shape.num_elements().is_some_and(|n| n <= FOLD_LIMIT as u64);
            if result_types.iter().all(small) {
                let results = kiln_ir::interp::eval_op(&op, &known).map_err(|e| format!("{}: {e}", op.mnemonic()))?;
                return results.into_iter().map(|t| self.constant(t)).collect();
            }
        }
        let values: Vec<Value> = ins.iter().map(|v| v.v).collect();
        let outs = self.b.named_op(op, &values, self.node_name.clone()).map_err(|e| e.to_string())?;
        Ok(outs.into_iter().map(|v| self.wrap(v, None)).collect())
    }

    /// Imports a subgraph (an `If` branch) in a new scope that sees the enclosing values; returns its outputs.
    pub fn subgraph(&mut self, g: &GraphProto) -> Result<Vec<Val>, String> {
        self.inline(g, Vec::new())
    }

    fn walk(&mut self, g: &GraphProto) -> Result<(), String> {
        for init in &g.initializer {
            let t = tensor_from_proto(init, self.base_dir).map_err(|e| format!("initializer `{}`: {e}", init.name))?;
            let v = self.initializer(&init.name, t)?;
            self.define(&init.name, Some(v));
        }
        for (i, node) in g.node.iter().enumerate() {
            self.node(i, node)?;
        }
        Ok(())
    }

    fn initializer(&mut self, name: &str, t: Tensor) -> Result<Val, String> {
        if t.len() <= kiln_ir::builder::INLINE_CONSTANT_LIMIT {
            return self.constant(t);
        }
        if !self.frames.is_empty() {
            return self.hoisted_weight(name, Arc::new(t));
        }
        let t = Arc::new(t);
        let v = self.b.weight(name, t.clone()).map_err(|e| e.to_string())?;
        Ok(self.wrap(v, Some(t)))
    }

    /// Imports one node. `Err` only for malformed models; unsupported features become problems.
    fn node(&mut self, index: usize, node: &NodeProto) -> Result<(), String> {
        let label = if node.name.is_empty() { format!("#{index}") } else { node.name.clone() };
        if node.op_type.is_empty() {
            return Err(format!("node `{label}` has no op type"));
        }
        let op_type = if node.domain.is_empty() || node.domain == "ai.onnx" {
            node.op_type.clone()
        } else {
            format!("{}.{}", node.domain, node.op_type)
        };
        // Sequence and optional operands are resolved at import time (`ops::sequence`); only the sequence ops
        // take them.
        let sequence_op =
            (node.domain.is_empty() || node.domain == "ai.onnx") && ops::sequence::is_sequence_op(&node.op_type);
        let mut inputs = Vec::with_capacity(node.input.len());
        let mut items = Vec::with_capacity(node.input.len());
        let mut poisoned = false;
        let mut composite_operand = None;
        for name in &node.input {
            if name.is_empty() {
                inputs.push(None);
                items.push(None);
                continue;
            }
            match self.item(name, 0) {
                Ok(Some(item)) => {
                    match &item {
                        ops::sequence::Item::Tensor(v) => inputs.push(Some(v.clone())),
                        _ if !sequence_op => {
                            composite_operand = Some(self.undefined(name, "operand"));
                            inputs.push(None);
                        }
                        _ => inputs.push(None),
                    }
                    items.push(Some(item));
                }
                Ok(None) => {
                    poisoned = true;
                    inputs.push(None);
                    items.push(None);
                }
                Err(e) => return Err(format!("node `{label}` ({op_type}) uses {e}")),
            }
        }
        // Values are single-assignment: a node writing a name already defined in this graph (a graph input, an
        // initializer, another node's output, or twice itself) is a malformed model, never "the last wins".
        let mut writes = std::collections::BTreeSet::new();
        for name in node.output.iter().filter(|n| !n.is_empty()) {
            if self.scopes.last().expect("a scope").contains_key(name)
                || self.composites.last().is_some_and(|c| c.contains_key(name))
                || !writes.insert(name)
            {
                return Err(format!("node `{label}` ({op_type}) writes `{name}`, which is already defined"));
            }
        }
        let handler = match node.domain.as_str() {
            "" | "ai.onnx" => ops::handler(&node.op_type),
            "com.microsoft" => ops::contrib::handler(&node.op_type),
            _ => None,
        };
        // A value an op needs at import time that a graph input feeds: say how to give it.
        // (Operands after the first: the data operand is an input by nature; axes, pads, scales, sizes… follow it.)
        let fed_by_input = node.input.iter().skip(1).any(|i| self.graph_inputs.contains(i.as_str()));
        let problem = |message: String| {
            let message = if fed_by_input && message.contains("known at import time") {
                format!("{message} (it is fed by a graph input: fix its value with --fix-input NAME=FILE.npy)")
            } else {
                message
            };
            Unsupported { node: label.clone(), op_type: op_type.clone(), message }
        };
        // A sequence op has no tensor handler: `ops::sequence::import` serves it below.
        let never: ops::Handler = |_, _| Err("a sequence op reached the tensor handlers (a kiln bug)".into());
        let Some(handler) = handler.or(sequence_op.then_some(never)) else {
            let message = match node.domain.as_str() {
                "" | "ai.onnx" => "op is not supported".to_string(),
                "com.microsoft" => format!(
                    "op is not supported (of ONNX Runtime's com.microsoft ops kiln imports {})",
                    ops::contrib::op_types().collect::<Vec<_>>().join(", ")
                ),
                other => format!("domain `{other}` is not supported"),
            };
            self.problems.push(problem(message));
            self.poison(node);
            return Ok(());
        };
        if poisoned {
            // The cause is already reported upstream; don't cascade.
            self.poison(node);
            return Ok(());
        }
        if let Some(message) = composite_operand {
            self.problems.push(problem(message));
            self.poison(node);
            return Ok(());
        }
        let n = OnnxNode::new(node, inputs, self.opset, self.base_dir);
        self.node_name = Some(label.clone());
        let result = if sequence_op {
            ops::sequence::import(self, &n, &items)
        } else {
            handler(self, &n).map(|vals| vals.into_iter().map(ops::sequence::Produced::Tensor).collect())
        };
        self.node_name = None;
        let unread = n.unread_attributes();
        let mistyped = n.mistyped_attributes();
        // A sequence op reads its operands as resolved items.
        let unread_inputs = if sequence_op { Vec::new() } else { n.unread_inputs() };
        match result {
            // An attribute of the wrong type is the model's error, reported whatever the handler made of it.
            _ if !mistyped.is_empty() => {
                for m in mistyped {
                    self.problems.push(problem(m));
                }
                self.poison(node);
            }
            Ok(_) if !unread.is_empty() => {
                for a in unread {
                    self.problems.push(problem(format!("attribute `{a}` is not supported")));
                }
                self.poison(node);
            }
            Ok(_) if !unread_inputs.is_empty() => {
                for (i, name) in unread_inputs {
                    self.problems.push(problem(format!(
                        "input {i} (`{name}`) is not used by this op (extra, or not supported)"
                    )));
                }
                self.poison(node);
            }
            Ok(outs) => {
                for (i, name) in node.output.iter().enumerate() {
                    if name.is_empty() {
                        continue;
                    }
                    match outs.get(i) {
                        Some(ops::sequence::Produced::Tensor(v)) => self.define(name, Some(v.clone())),
                        Some(ops::sequence::Produced::Composite(c)) => {
                            self.composites.last_mut().expect("a scope").insert(name.clone(), c.clone());
                        }
                        None => {
                            self.problems.push(problem(format!("output {i} (`{name}`) is not supported")));
                            self.define(name, None);
                        }
                    }
                }
            }
            // A subgraph's unsupported node is reported where it is, not again as the node holding it.
            Err(message) if message == REPORTED => self.poison(node),
            Err(message) => {
                self.problems.push(problem(message));
                self.poison(node);
            }
        }
        Ok(())
    }

    fn poison(&mut self, node: &NodeProto) {
        for o in node.output.iter().filter(|o| !o.is_empty()) {
            self.define(o, None);
        }
    }
}

/// Why a graph input has no type: kiln does not support its declaration, or the shape the user gave contradicts
/// it (bad input, not a missing feature).
enum InputTypeError {
    Unsupported(String),
    Contradicted(String),
}

fn input_type(vi: &ValueInfoProto, options: &ImportOptions) -> Result<TensorType, InputTypeError> {
    input_type_declared(vi, options).map_err(InputTypeError::Unsupported).and_then(|(dtype, dims)| {
        given_shape(vi, dims, options).map(|shape| TensorType::new(dtype, shape)).map_err(InputTypeError::Contradicted)
    })
}

/// The declared dtype and dims of graph input `vi` (a missing shape taken from `--shape`).
fn input_type_declared(vi: &ValueInfoProto, options: &ImportOptions) -> Result<(DType, Vec<Dim>), String> {
    use onnx_protobuf::tensor_shape_proto::dimension::Value as Dv;
    use onnx_protobuf::type_proto::Value as Tv;
    let Some(Tv::TensorType(tt)) = vi.type_.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err("only tensor inputs are supported".into());
    };
    let dtype = dtype_from_onnx(tt.elem_type)?;
    let dims: Vec<Dim> = match tt.shape.as_ref() {
        // An input declared without a shape takes the one the user gives (`--shape NAME=DxD`).
        None => match options.shapes.get(&vi.name) {
            Some(given) => given.iter().map(|&n| Dim::Static(n as u64)).collect(),
            None => {
                return Err(format!("has no declared shape: give one with --shape {}=DxD (its extents)", vi.name));
            }
        },
        Some(s) => s
            .dim
            .iter()
            .enumerate()
            .map(|(i, d)| match &d.value {
                Some(Dv::DimValue(n)) if *n >= 0 => Dim::Static(*n as u64),
                Some(Dv::DimParam(p)) if kiln_ir::dim::is_identifier(p) => Dim::Sym(p.clone()),
                Some(Dv::DimParam(p)) => Dim::Sym(sanitize(p)),
                _ => Dim::Sym(format!("{}_{i}", sanitize(&vi.name))),
            })
            .collect(),
    };
    Ok((dtype, dims))
}

/// The shape of graph input `vi` declared `dims`, with the shape the user gave for it (which must fit).
fn given_shape(vi: &ValueInfoProto, dims: Vec<Dim>, options: &ImportOptions) -> Result<Shape, String> {
    let shape = match options.shapes.get(&vi.name) {
        Some(given) => {
            if given.len() != dims.len() {
                return Err(format!(
                    "is declared with rank {}, but the given shape has rank {}",
                    dims.len(),
                    given.len()
                ));
            }
            for (d, &g) in dims.iter().zip(given) {
                if let Dim::Static(n) = d
                    && *n as usize != g
                {
                    return Err(format!(
                        "is declared {}, which the given shape {given:?} contradicts",
                        Shape(dims.clone())
                    ));
                }
            }
            Shape::of(&given.iter().map(|&g| g as u64).collect::<Vec<_>>())
        }
        None => Shape(dims),
    };
    Ok(shape)
}

fn sanitize(s: &str) -> String {
    let mut out: String = s.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if !out.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        out.insert(0, 'd');
    }
    out
}

/// Checks the element types `value_info` and the graph outputs declare against the imported values, as ONNX
/// Runtime does: a different dtype means the model (or kiln) is wrong, so it is an error naming the value. Shapes
/// in `value_info` are advisory (exporters leave stale ones after graph surgery) and kiln's own inference wins.
fn check_declared_types(cx: &Ctx<'_>, g: &GraphProto) -> Result<(), ImportError> {
    use onnx_protobuf::type_proto::Value as Tv;
    for vi in g.value_info.iter().chain(&g.output) {
        let Some(Tv::TensorType(tt)) = vi.type_.as_ref().and_then(|t| t.value.as_ref()) else { continue };
        let (Some(Some(v)), Ok(declared)) = (cx.find(&vi.name), dtype_from_onnx(tt.elem_type)) else { continue };
        if tt.elem_type != 0 && declared != v.dtype() {
            return Err(ImportError::Invalid(format!(
                "value `{}` is declared {} (value_info or graph output), but it computes {}",
                vi.name,
                declared,
                v.dtype()
            )));
        }
    }
    // Graph outputs: a declared shape must fit the computed one (same rank; equal extents where both are
    // static). value_info is left alone: exporters leave stale shapes there that ONNX Runtime ignores too.
    for o in &g.output {
        let Some(Tv::TensorType(tt)) = o.type_.as_ref().and_then(|t| t.value.as_ref()) else { continue };
        let (Some(Some(v)), Some(shape)) = (cx.find(&o.name), tt.shape.as_ref()) else { continue };
        use onnx_protobuf::tensor_shape_proto::dimension::Value as Dv;
        let computed = &v.ty.shape;
        let fits = shape.dim.len() == computed.rank()
            && shape.dim.iter().zip(computed.dims()).all(|(d, c)| match (&d.value, c.as_static()) {
                (Some(Dv::DimValue(n)), Some(m)) => u64::try_from(*n).is_ok_and(|n| n == m),
                _ => true,
            });
        if !fits {
            let declared: Vec<String> = shape
                .dim
                .iter()
                .map(|d| match &d.value {
                    Some(Dv::DimValue(n)) => n.to_string(),
                    Some(Dv::DimParam(p)) => p.clone(),
                    _ => "?".into(),
                })
                .collect();
            return Err(ImportError::Invalid(format!(
                "graph output `{}` is declared [{}], but it computes {}",
                o.name,
                declared.join(","),
                v.ty
            )));
        }
    }
    Ok(())
}

/// Imports a decoded model.
pub fn import_model(
    model: &ModelProto,
    base_dir: Option<&Path>,
    options: &ImportOptions,
) -> Result<Graph, ImportError> {
    let opset =
        model.opset_import.iter().find(|o| o.domain.is_empty() || o.domain == "ai.onnx").map_or(1, |o| o.version);
    let g = model.graph.as_ref().ok_or_else(|| ImportError::Invalid("the model has no graph".into()))?;
    let name = if g.name.is_empty() { "main".to_string() } else { g.name.clone() };
    let mut cx = Ctx {
        b: Builder::new(name),
        scopes: vec![HashMap::new()],
        composites: vec![HashMap::new()],
        problems: Vec::new(),
        opset,
        base_dir,
        node_name: None,
        graph_inputs: {
            let inits: std::collections::HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
            g.input.iter().filter(|i| !inits.contains(i.name.as_str())).map(|i| i.name.clone()).collect()
        },
        issued: std::collections::HashSet::new(),
        frames: Vec::new(),
        depth: 0,
    };
    if !OPSETS.contains(&opset) {
        cx.problems.push(Unsupported {
            node: "(model)".into(),
            op_type: "opset".into(),
            message: format!(
                "default-domain opset {opset} is not supported (kiln imports {}–{})",
                OPSETS.start(),
                OPSETS.end()
            ),
        });
    }
    let initializer_names: std::collections::HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    for name in options.shapes.keys().chain(options.known_inputs.keys()) {
        if !g.input.iter().any(|i| &i.name == name && !initializer_names.contains(i.name.as_str())) {
            let inputs: Vec<String> = g
                .input
                .iter()
                .filter(|i| !initializer_names.contains(i.name.as_str()))
                .map(|i| format!("`{}`", i.name))
                .collect();
            return Err(ImportError::Input(format!("the model has no input `{name}` (inputs: {})", inputs.join(", "))));
        }
    }
    for vi in g.input.iter().filter(|i| !initializer_names.contains(i.name.as_str())) {
        match input_type(vi, options) {
            Ok(ty) => {
                let known = options.known_inputs.get(&vi.name).cloned().map(Arc::new);
                if let Some(k) = &known
                    && k.tensor_type() != ty
                {
                    return Err(ImportError::Input(format!(
                        "the known value of input `{}` is {}, but the input is declared {ty}",
                        vi.name,
                        k.tensor_type()
                    )));
                }
                // An input whose value is given is that constant: the model is specialized on it, and it is no
                // longer an input (a run cannot pass another value than the code was specialized on).
                let val = match known {
                    Some(k) => cx.constant((*k).clone()).map_err(ImportError::Invalid)?,
                    None => {
                        let v =
                            cx.b.input(&vi.name, ty.dtype, ty.shape)
                                .map_err(|e| ImportError::Invalid(e.to_string()))?;
                        cx.wrap(v, None)
                    }
                };
                cx.define(&vi.name, Some(val));
            }
            Err(InputTypeError::Contradicted(message)) => {
                return Err(ImportError::Input(format!("input `{}` {message}", vi.name)));
            }
            Err(InputTypeError::Unsupported(message)) => {
                cx.problems.push(Unsupported { node: vi.name.clone(), op_type: "graph input".into(), message });
                cx.define(&vi.name, None);
            }
        }
    }
    cx.walk(g).map_err(ImportError::Invalid)?;
    check_declared_types(&cx, g)?;
    if g.output.is_empty() {
        return Err(ImportError::Invalid("the graph has no outputs".into()));
    }
    let mut listed = std::collections::BTreeSet::new();
    for o in &g.output {
        if o.name.is_empty() {
            return Err(ImportError::Invalid("a graph output has an empty name".into()));
        }
        if !listed.insert(o.name.as_str()) {
            return Err(ImportError::Invalid(format!("graph output `{}` is listed twice", o.name)));
        }
        match cx.find(&o.name).cloned() {
            Some(Some(v)) => cx.b.output(&o.name, v.v),
            Some(None) => {}
            None if cx.composite(&o.name).is_some() => cx.problems.push(Unsupported {
                node: o.name.clone(),
                op_type: "graph output".into(),
                message: "a sequence or optional as a graph output is not supported (a compiled model returns \
                          tensors: concatenate the sequence, or return its elements)"
                    .into(),
            }),
            None => return Err(ImportError::Invalid(format!("graph output `{}` is not produced by any node", o.name))),
        }
    }
    if !cx.problems.is_empty() {
        return Err(ImportError::Unsupported(cx.problems));
    }
    let graph = cx.b.finish();
    kiln_ir::verify(&graph).map_err(|errs| {
        // Sizes come from the model's data (a shape tensor, a declared dim): too large is the model's problem.
        if let Some(e) = errs.iter().find(|e| e.kind == kiln_ir::verify::VerifyErrorKind::TooLarge) {
            return ImportError::Invalid(format!("a tensor of the model is too large: {e}"));
        }
        ImportError::Invalid(format!(
            "the imported graph does not verify (a kiln bug):\n{}",
            errs.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n")
        ))
    })?;
    Ok(graph)
}
