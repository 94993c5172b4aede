//! The verifier: checks a [`Graph`]'s structure and types and reports every problem at once.
//!
//! Modelled on Cranelift's verifier: it never stops at the first error. Each [`VerifyError`] names the node (as
//! [`Graph::describe`] labels it, or `graph` for graph-level problems), says what is wrong with enough context to
//! act on (expected vs declared types, the other node of a duplicate, the nodes of a cycle), and carries a
//! machine-checkable [`VerifyErrorKind`]. Errors come in a deterministic order: node id order, then check order
//! (the order of the [`VerifyErrorKind`] variants), then graph-level errors.
//!
//! Checks do not cascade: a node whose operands are dangling, on a cycle, or produced by a node that is itself
//! broken (see [`VerifyErrorKind::breaks_types`]) is not type checked, since its operand types cannot be trusted.
//! A `param` without weight data is valid here (weights may be bound later); executors call
//! [`verify_weights_bound`] to require data for every parameter.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use crate::graph::{Graph, NodeId, Value};
use crate::infer::infer;
use crate::op::Op;
use crate::types::{Dim, Shape, TensorType};

/// What kind of problem a [`VerifyError`] reports. Variants are declared in check order, which is also the order
/// errors of one node are reported in.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VerifyErrorKind {
    /// An operand names a node that is not in the graph.
    DanglingOperand,
    /// An operand names a result index past the producer's results.
    BadResultIndex,
    /// An operand names a live node, but the graph's edges do not mirror the use (a removed node's id was
    /// reused by a later node, or the operand named its producer before the producer was added).
    UnmirroredOperand,
    /// The node is on a cycle (reported once per cycle, on its lowest node id).
    Cycle,
    /// The operand count does not fit the op's arity.
    Arity,
    /// An `input` or `param` has an empty name.
    EmptyName,
    /// Two `input` nodes, or two `param` nodes, share a name.
    DuplicateName,
    /// An `input` node is missing from the graph's input list.
    UnlistedInput,
    /// A `param`'s declared type differs from its weight data's type.
    WeightMismatch,
    /// A `constant`'s declared type differs from its value's type.
    ConstantMismatch,
    /// The node declares a different number of results than its op produces.
    ResultCount,
    /// A `fusion` node's body is malformed (its own verifier errors, input names or count, a `param` inside).
    FusionBody,
    /// The operand types are invalid for the op (type inference failed).
    TypeError,
    /// A declared result type differs from the type inferred from the operands.
    TypeMismatch,
    /// A symbolic dim's name is not a valid identifier.
    BadSymbol,
    /// A result (or a shape attribute) has static dims whose element count or byte size does not fit in 63 bits.
    TooLarge,
    /// The graph's input list names a missing node, a non-`input` node, or one node twice.
    BadInputList,
    /// The graph has no outputs.
    NoOutputs,
    /// A graph output has an empty name.
    EmptyOutputName,
    /// Two graph outputs share a name.
    DuplicateOutputName,
    /// A graph output names a node that is not in the graph, or a result past its results.
    DanglingOutput,
    /// A `param` has no weight data (reported only by [`verify_weights_bound`]).
    UnboundParameter,
}

impl VerifyErrorKind {
    /// A stable kebab-case name, for tests and tools.
    pub fn name(self) -> &'static str {
        match self {
            VerifyErrorKind::DanglingOperand => "dangling-operand",
            VerifyErrorKind::BadResultIndex => "bad-result-index",
            VerifyErrorKind::UnmirroredOperand => "unmirrored-operand",
            VerifyErrorKind::Cycle => "cycle",
            VerifyErrorKind::Arity => "arity",
            VerifyErrorKind::EmptyName => "empty-name",
            VerifyErrorKind::DuplicateName => "duplicate-name",
            VerifyErrorKind::UnlistedInput => "unlisted-input",
            VerifyErrorKind::WeightMismatch => "weight-mismatch",
            VerifyErrorKind::ConstantMismatch => "constant-mismatch",
            VerifyErrorKind::ResultCount => "result-count",
            VerifyErrorKind::FusionBody => "fusion-body",
            VerifyErrorKind::TypeError => "type-error",
            VerifyErrorKind::TypeMismatch => "type-mismatch",
            VerifyErrorKind::BadSymbol => "bad-symbol",
            VerifyErrorKind::TooLarge => "too-large",
            VerifyErrorKind::BadInputList => "bad-input-list",
            VerifyErrorKind::NoOutputs => "no-outputs",
            VerifyErrorKind::EmptyOutputName => "empty-output-name",
            VerifyErrorKind::DuplicateOutputName => "duplicate-output-name",
            VerifyErrorKind::DanglingOutput => "dangling-output",
            VerifyErrorKind::UnboundParameter => "unbound-parameter",
        }
    }

    /// True when an error of this kind means the node's declared result types cannot be trusted, so its users
    /// are not type checked against them.
    pub fn breaks_types(self) -> bool {
        matches!(
            self,
            VerifyErrorKind::DanglingOperand
                | VerifyErrorKind::BadResultIndex
                | VerifyErrorKind::UnmirroredOperand
                | VerifyErrorKind::Cycle
                | VerifyErrorKind::Arity
                | VerifyErrorKind::ConstantMismatch
                | VerifyErrorKind::ResultCount
                | VerifyErrorKind::FusionBody
                | VerifyErrorKind::TypeError
                | VerifyErrorKind::TypeMismatch
        )
    }
}

impl fmt::Display for VerifyErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One problem found by the verifier, naming the node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{node}: {message}")]
pub struct VerifyError {
    /// The node, as [`Graph::describe`] names it (or `graph` for graph-level problems).
    pub node: String,
    /// What is wrong.
    pub message: String,
    /// The category, for code that reacts to errors.
    pub kind: VerifyErrorKind,
    /// The node's id; `None` for graph-level problems.
    pub id: Option<NodeId>,
}

/// Checks `g`, returning every problem found (see the module docs for the order).
pub fn verify(g: &Graph) -> Result<(), Vec<VerifyError>> {
    Verifier::new(g).run()
}

/// Reports every `param` whose weight is not in `g.weights`, in node id order. Executors call this after
/// [`verify`]: a graph may be valid with weights still unbound, but it cannot run that way.
pub fn verify_weights_bound(g: &Graph) -> Result<(), Vec<VerifyError>> {
    let errors: Vec<VerifyError> = g
        .params()
        .filter_map(|id| match &g.node(id).op {
            Op::Parameter(p) if g.weights.get(&p.name).is_none() => Some(VerifyError {
                node: g.describe(id),
                message: format!("parameter `{}` has no weight data", p.name),
                kind: VerifyErrorKind::UnboundParameter,
                id: Some(id),
            }),
            _ => None,
        })
        .collect();
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

impl Graph {
    /// Runs [`verify`], folding the error list into [`crate::Error::Verify`] (whose message lists every error).
    pub fn verify(&self) -> Result<(), crate::Error> {
        verify(self).map_err(crate::Error::Verify)
    }
}

/// The bytes a value of type `t` takes, when its dims are static and that fits in 63 bits; `Some(0)` for a
/// type with symbolic dims (checked when they are bound), `None` when it overflows.
pub fn byte_size(t: &TensorType) -> Option<u64> {
    if t.shape.dims().iter().any(|d| d.as_static().is_none()) {
        return Some(0);
    }
    let n = t.shape.num_elements()?;
    n.checked_mul(t.dtype.size_bytes() as u64).filter(|&b| b <= i64::MAX as u64)
}

/// True when `s` can name a symbolic dim: an ASCII letter or `_`, then ASCII letters, digits and `_`.
pub fn is_valid_symbol(s: &str) -> bool {
    crate::dim::is_identifier(s)
}

/// One verification run: live node ids in ascending order, and the errors found per node (by dense index).
struct Verifier<'g> {
    g: &'g Graph,
    ids: Vec<NodeId>,
    dense: BTreeMap<NodeId, usize>,
    errors: Vec<Vec<VerifyError>>,
    /// Nodes on a cycle; only the lowest id of each cycle gets the error, but all are broken.
    on_cycle: Vec<bool>,
    graph_errors: Vec<VerifyError>,
}

impl<'g> Verifier<'g> {
    fn new(g: &'g Graph) -> Verifier<'g> {
        let ids: Vec<NodeId> = g.node_ids().collect();
        let dense = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        let errors = vec![Vec::new(); ids.len()];
        let on_cycle = vec![false; ids.len()];
        Verifier { g, ids, dense, errors, on_cycle, graph_errors: Vec::new() }
    }

    fn run(mut self) -> Result<(), Vec<VerifyError>> {
        for i in 0..self.ids.len() {
            self.check_operands(i);
            self.check_arity(i);
            self.check_symbols(i);
        }
        self.check_sources();
        let order = self.check_cycles();
        for i in order {
            self.check_types(i);
        }
        self.check_input_list();
        self.check_outputs();

        let mut all = Vec::new();
        for mut errs in self.errors {
            // Stable: errors of one kind keep their discovery order (operand slot order, say).
            errs.sort_by_key(|e| e.kind);
            all.extend(errs);
        }
        all.extend(self.graph_errors);
        if all.is_empty() { Ok(()) } else { Err(all) }
    }

    fn report(&mut self, i: usize, kind: VerifyErrorKind, message: String) {
        let id = self.ids[i];
        self.errors[i].push(VerifyError { node: self.g.describe(id), message, kind, id: Some(id) });
    }

    fn report_graph(&mut self, kind: VerifyErrorKind, message: String) {
        self.graph_errors.push(VerifyError { node: "graph".into(), message, kind, id: None });
    }

    fn is_broken(&self, i: usize) -> bool {
        self.on_cycle[i] || self.errors[i].iter().any(|e| e.kind.breaks_types())
    }

    /// Why value `v` cannot be used, if it cannot: `(kind, message)` where the message starts after the
    /// `operand 0` or `output y` prefix.
    fn value_problem(&self, v: Value) -> Option<(VerifyErrorKind, String)> {
        let Some(producer) = self.g.get(v.node) else {
            // `Graph::from_doc` points operands naming ids its document never defined at `u32::MAX`.
            let msg = if v.node.0 == u32::MAX {
                "refers to a node id that the serialized graph did not define".to_string()
            } else {
                format!("refers to {}, which is not in the graph", v.node)
            };
            return Some((VerifyErrorKind::DanglingOperand, msg));
        };
        let count = producer.outputs.len();
        if v.index as usize >= count {
            return Some((
                VerifyErrorKind::BadResultIndex,
                format!("uses result {} of {}, which has {count} result(s)", v.index, self.g.describe(v.node)),
            ));
        }
        None
    }

    fn check_operands(&mut self, i: usize) {
        let id = self.ids[i];
        let node = self.g.node(id);
        let unmirrored = self.g.unmirrored_operands(id);
        for (slot, &v) in node.inputs.iter().enumerate() {
            if let Some((kind, msg)) = self.value_problem(v) {
                self.report(i, kind, format!("operand {slot} {msg}"));
            } else if unmirrored.contains(&slot) {
                let msg = format!(
                    "operand {slot} refers to {}, but the graph has no edge for that use (a removed node's id was \
                     reused, or the operand was set before its producer existed)",
                    self.g.describe(v.node)
                );
                self.report(i, VerifyErrorKind::UnmirroredOperand, msg);
            }
        }
    }

    fn check_arity(&mut self, i: usize) {
        let node = self.g.node(self.ids[i]);
        let arity = node.op.arity();
        if !arity.accepts(node.inputs.len()) {
            let msg = format!("takes {arity} operand(s), got {}", node.inputs.len());
            self.report(i, VerifyErrorKind::Arity, msg);
        }
    }

    /// Symbol names in the declared result types and in shape-valued attributes, each bad name once per node.
    fn check_symbols(&mut self, i: usize) {
        let node = self.g.node(self.ids[i]);
        let mut shapes: Vec<&Shape> = node.outputs.iter().map(|t| &t.shape).collect();
        shapes.extend(node.op.shape_attr());
        let mut bad: Vec<&str> = Vec::new();
        for d in shapes.iter().flat_map(|s| s.dims()).chain(node.op.dim_attrs()) {
            if let Dim::Sym(name) = d
                && !crate::dim::is_valid_dim_name(name)
                && !bad.contains(&name.as_str())
            {
                bad.push(name);
            }
        }
        for name in bad {
            let msg = format!(
                "symbolic dim {name:?} is not a valid identifier (a letter or `_`, then letters, digits, `_`) \
                 nor a derived dim's canonical expression"
            );
            self.report(i, VerifyErrorKind::BadSymbol, msg);
        }
        // Sizes are computed from static dims everywhere downstream (buffers, kernels' index arithmetic, memory
        // plans): one that overflows would wrap, so it is refused here, where the user's graph enters.
        for t in &node.outputs {
            if byte_size(t).is_none() {
                let msg = format!("result type {t} has more than 2^63 bytes (or elements): no buffer can hold it");
                self.report(i, VerifyErrorKind::TooLarge, msg);
            }
        }
        for shape in &shapes[node.outputs.len()..] {
            if shape.dims().iter().all(|d| d.as_static().is_some())
                && shape.num_elements().is_none_or(|n| n > i64::MAX as u64)
            {
                let msg = format!("shape {shape} has more than 2^63 elements");
                self.report(i, VerifyErrorKind::TooLarge, msg);
            }
        }
    }

    /// `input`, `param` and `constant` nodes: names, the input list, weights, declared types.
    fn check_sources(&mut self) {
        let listed: BTreeSet<NodeId> = self.g.inputs().iter().copied().collect();
        let mut input_names: BTreeMap<&str, NodeId> = BTreeMap::new();
        let mut param_names: BTreeMap<&str, NodeId> = BTreeMap::new();
        for i in 0..self.ids.len() {
            let id = self.ids[i];
            let node = self.g.node(id);
            let (what, name, seen) = match &node.op {
                Op::Input(inp) => ("input", inp.name.as_str(), &mut input_names),
                Op::Parameter(p) => ("parameter", p.name.as_str(), &mut param_names),
                Op::Constant(c) => {
                    let ty = c.value.tensor_type();
                    if node.outputs.len() != 1 || node.outputs[0] != ty {
                        let msg = format!("value is {ty}, but the node declares {}", list_types(&node.outputs));
                        self.report(i, VerifyErrorKind::ConstantMismatch, msg);
                    }
                    continue;
                }
                _ => continue,
            };
            if name.is_empty() {
                self.report(i, VerifyErrorKind::EmptyName, format!("{what} has an empty name"));
            } else if let Some(&first) = seen.get(name) {
                let msg = format!("{what} name `{name}` is already used by {}", self.g.describe(first));
                self.report(i, VerifyErrorKind::DuplicateName, msg);
            } else {
                seen.insert(name, id);
            }
            if what == "input" && !listed.contains(&id) {
                let msg = format!("input `{name}` is not in the graph's input list");
                self.report(i, VerifyErrorKind::UnlistedInput, msg);
            }
            if node.outputs.len() != 1 {
                let msg = format!("declares {} result(s); {what} nodes have exactly 1", node.outputs.len());
                self.report(i, VerifyErrorKind::ResultCount, msg);
            } else if what == "parameter"
                && let Some(w) = self.g.weights.get(name)
            {
                // Weights are concrete, so the declared type must be exactly the data's (no symbolic dims).
                let data = w.tensor_type();
                if node.outputs[0] != data {
                    let msg = format!("parameter `{name}` is declared {}, but its weight is {data}", node.outputs[0]);
                    self.report(i, VerifyErrorKind::WeightMismatch, msg);
                }
            }
        }
    }

    /// Finds the strongly connected components of the use graph, reports each cycle once, and returns the
    /// acyclic nodes in a topological order (producers first) for type checking.
    fn check_cycles(&mut self) -> Vec<usize> {
        let n = self.ids.len();
        let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, &id) in self.ids.iter().enumerate() {
            for v in &self.g.node(id).inputs {
                if let Some(&p) = self.dense.get(&v.node) {
                    succ[p].push(i);
                }
            }
        }
        let sccs = tarjan_scc(&succ);
        let mut order = Vec::with_capacity(n);
        // Tarjan emits components consumers first; reversed, producers come first.
        for scc in sccs.iter().rev() {
            let cyclic = scc.len() > 1 || succ[scc[0]].contains(&scc[0]);
            if !cyclic {
                order.push(scc[0]);
                continue;
            }
            let first = *scc.iter().min().expect("components are non-empty");
            let members: BTreeSet<usize> = scc.iter().copied().collect();
            let path = shortest_cycle(&succ, &members, first);
            let describe = |js: &[usize]| js.iter().map(|&j| self.g.describe(self.ids[j])).collect::<Vec<_>>();
            let mut msg = format!("is on a cycle: {}", elide(describe(&path), " -> "));
            let on_path: BTreeSet<usize> = path.iter().copied().collect();
            let others: Vec<usize> = members.difference(&on_path).copied().collect();
            if !others.is_empty() {
                msg.push_str(&format!("; also on cycles with it: {}", elide(describe(&others), ", ")));
            }
            self.report(first, VerifyErrorKind::Cycle, msg);
            for &j in scc {
                self.on_cycle[j] = true;
            }
        }
        order
    }

    fn check_types(&mut self, i: usize) {
        let id = self.ids[i];
        let node = self.g.node(id);
        if node.op.is_source() && !matches!(node.op, Op::Iota(_)) {
            return; // Declared types; checked in `check_sources`.
        }
        if self.is_broken(i) {
            return;
        }
        let bodies = node.op.bodies();
        if !bodies.is_empty() {
            // Each body is a graph of its own: all its errors, each prefixed so the node is named too. (An `if`
            // branch binds the operands after the condition; a loop body's own inputs are checked by the type rule.)
            let mut problems = Vec::new();
            for body in bodies {
                match &node.op {
                    Op::If(_) => problems.extend(body.problems(node.inputs.len().saturating_sub(1))),
                    _ => problems.extend(body.problems(node.inputs.len())),
                }
                problems.extend(verify(&body.0).err().into_iter().flatten().map(|e| e.to_string()));
            }
            if !problems.is_empty() {
                for p in problems {
                    self.report(i, VerifyErrorKind::FusionBody, format!("body: {p}"));
                }
                return;
            }
        }
        let mut operand_types: Vec<TensorType> = Vec::with_capacity(node.inputs.len());
        for v in &node.inputs {
            let Some(&p) = self.dense.get(&v.node) else { return };
            if self.is_broken(p) {
                return;
            }
            match self.g.value_type(*v) {
                Some(t) => operand_types.push(t.clone()),
                None => return,
            }
        }
        match infer(&node.op, &operand_types) {
            Err(e) => {
                let msg = if operand_types.is_empty() {
                    e
                } else {
                    format!("{e} (operand types: {})", list_types(&operand_types))
                };
                self.report(i, VerifyErrorKind::TypeError, msg);
            }
            Ok(expected) if expected.len() != node.outputs.len() => {
                let msg = format!(
                    "declares {} result(s) {}, but its operands give {} result(s) {}",
                    node.outputs.len(),
                    list_types(&node.outputs),
                    expected.len(),
                    list_types(&expected)
                );
                self.report(i, VerifyErrorKind::ResultCount, msg);
            }
            Ok(expected) => {
                for (r, (decl, exp)) in node.outputs.iter().zip(&expected).enumerate() {
                    if decl != exp {
                        let msg = format!("result {r} is declared {decl}, but its operands give {exp}");
                        self.report(i, VerifyErrorKind::TypeMismatch, msg);
                    }
                }
            }
        }
    }

    fn check_input_list(&mut self) {
        let mut seen: BTreeSet<NodeId> = BTreeSet::new();
        for (pos, &id) in self.g.inputs().iter().enumerate() {
            let repeated = !seen.insert(id);
            let problem = match self.g.get(id) {
                None => Some(format!("input list entry {pos} refers to {id}, which is not in the graph")),
                Some(n) if !matches!(n.op, Op::Input(_)) => {
                    Some(format!("input list entry {pos} is {}, which is not an input node", self.g.describe(id)))
                }
                Some(_) if repeated => Some(format!("input list entry {pos} repeats {}", self.g.describe(id))),
                Some(_) => None,
            };
            if let Some(msg) = problem {
                self.report_graph(VerifyErrorKind::BadInputList, msg);
            }
        }
    }

    fn check_outputs(&mut self) {
        if self.g.outputs().is_empty() {
            self.report_graph(VerifyErrorKind::NoOutputs, "has no outputs".into());
        }
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        for (pos, (name, v)) in self.g.outputs().iter().enumerate() {
            if name.is_empty() {
                self.report_graph(VerifyErrorKind::EmptyOutputName, format!("output {pos} has an empty name"));
            } else if !seen.insert(name) {
                self.report_graph(
                    VerifyErrorKind::DuplicateOutputName,
                    format!("output name `{name}` is used more than once (again at output {pos})"),
                );
            }
            if let Some((_, msg)) = self.value_problem(*v) {
                self.report_graph(VerifyErrorKind::DanglingOutput, format!("output `{name}` {msg}"));
            }
        }
    }
}

/// Joins `names` with `sep`, keeping the first and last few of a long list: a cycle through thousands of nodes
/// should still read as one line.
fn elide(names: Vec<String>, sep: &str) -> String {
    const KEEP: usize = 5;
    if names.len() <= 2 * KEEP + 1 {
        return names.join(sep);
    }
    let skipped = names.len() - 2 * KEEP;
    format!("{}{sep}({skipped} more){sep}{}", names[..KEEP].join(sep), names[names.len() - KEEP..].join(sep))
}

/// `[f32[2], i64[]]`: a type list for messages.
fn list_types(ts: &[TensorType]) -> String {
    format!("[{}]", ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", "))
}

/// Strongly connected components of a graph given as successor lists, in Tarjan's order (a component comes
/// before every component that reaches it). Iterative, so deep graphs cannot overflow the stack.
fn tarjan_scc(succ: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = succ.len();
    let mut index: Vec<Option<usize>> = vec![None; n];
    let mut low = vec![0usize; n];
    let mut on_stack = vec![false; n];
    let mut stack: Vec<usize> = Vec::new();
    let mut sccs = Vec::new();
    let mut next = 0usize;
    for root in 0..n {
        if index[root].is_some() {
            continue;
        }
        // Each frame: a node and how many of its successors have been visited.
        let mut frames: Vec<(usize, usize)> = vec![(root, 0)];
        index[root] = Some(next);
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut child)) = frames.last_mut() {
            if let Some(&w) = succ[v].get(*child) {
                *child += 1;
                match index[w] {
                    None => {
                        index[w] = Some(next);
                        low[w] = next;
                        next += 1;
                        stack.push(w);
                        on_stack[w] = true;
                        frames.push((w, 0));
                    }
                    Some(iw) if on_stack[w] => low[v] = low[v].min(iw),
                    Some(_) => {}
                }
                continue;
            }
            frames.pop();
            if Some(low[v]) == index[v] {
                let mut scc = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                sccs.push(scc);
            }
            if let Some(&(u, _)) = frames.last() {
                low[u] = low[u].min(low[v]);
            }
        }
    }
    sccs
}

/// The shortest cycle through `start` inside `scc`, as a path that begins and ends with `start`.
fn shortest_cycle(succ: &[Vec<usize>], scc: &BTreeSet<usize>, start: usize) -> Vec<usize> {
    let mut parent: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        let mut next: Vec<usize> = succ[v].iter().copied().filter(|w| scc.contains(w)).collect();
        next.sort_unstable();
        for w in next {
            if w == start {
                // Walk back from `v` to `start`, then read the walk forwards.
                let mut back = Vec::new();
                let mut cur = v;
                while cur != start {
                    back.push(cur);
                    cur = *parent.get(&cur).expect("every visited node but the start has a parent");
                }
                let mut path = vec![start];
                path.extend(back.into_iter().rev());
                path.push(start);
                return path;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = parent.entry(w) {
                e.insert(v);
                queue.push_back(w);
            }
        }
    }
    // Unreachable for a cyclic component; a one-node path keeps the message sensible regardless.
    vec![start, start]
}
