//! `fuse`: forms `fusion` nodes, each meant to become one kernel or one library call.
//!
//! | Group | Members | Why it is exact |
//! |---|---|---|
//! | `library` | a [`Fusibility::LibraryRoot`] (`matmul`, `conv`) and a chain of [`Fusibility::Elementwise`] consumers (`unary`, `binary`, `cast`, `select`, `gelu`) and [`Fusibility::Channelwise`] ones of the chain's value (`batch_norm`), each the *only* user of the previous value (which is not a graph output) | the body computes the same ops on the same operands; only the chain's last value escapes |
//! | `loop` | connected elementwise, channelwise and [`Fusibility::Loop`] ops (`broadcast`, `reshape`, `transpose`, `reduce`, `softmax`, `log_softmax`, `layer_norm`) | the body computes the same ops; every value used outside the group is a result |
//!
//! Which op is which is the op table's answer ([`kiln_ir::Op::fusibility`]), not a list kept here.
//!
//! Library groups are formed first. Loop groups grow greedily in topological order: a node joins the group of
//! the first operand producer (in operand order) whose group stays **convex** (no path from the group through
//! a node outside it back into it, with other groups counted as one node each, since each becomes one node) and
//! no larger than `max-ops` ops. Convexity is what keeps the graph acyclic once each group is one node. One
//! exception: a whole-tensor reduction does not join the group of a value it would make the kernel evaluate again
//! — one with other uses whose producers in the group include a transcendental op (`recomputed_at_cost`) — but a
//! group already reducing that same value, so the value is stored once and its reductions share a pass.
//!
//! Work that depends on no input ([`kiln_ir::memory::computed_at_load`]: weight transposes, constant broadcasts)
//! runs once, as a prepare step, when its group holds only such nodes; so such a node never joins a group with
//! run-time members, and a run-time node joins a group computed at load only to recompute it inline where that
//! costs nothing: the group only moves data (broadcast, reshape, transpose) and none of its values is used
//! elsewhere. A library chain does not cross between the two kinds either.
//!
//! Nothing expensive is duplicated: every grouped node moves into exactly one body, and a value used outside
//! its group (or a graph output) becomes a result of the fusion node instead of being recomputed. Only `constant`
//! and `iota` nodes of at most 64 elements are *cloned* into a body (they cost nothing to recompute); the
//! original goes when nothing else uses it. Params and every other value reach the body as operands, bound to
//! the body's `input` nodes `p0`, `p1`, … by position. A group of a single node is left alone.

use std::collections::{HashMap, HashSet};

use kiln_ir::fusion::FusionBody;
use kiln_ir::op::{BinaryOp, Fusibility, Fusion, FusionKind, Input, UnaryOp};
use kiln_ir::{Graph, Node, NodeId, Op, Value};

use crate::declare_pass;
use crate::pass::{FromOptions, OptionDoc, OptionError, Pass, PassContext, PassError, PassOptions, topo_order};

/// Largest number of ops in one group unless `max-ops` says otherwise.
const DEFAULT_MAX_OPS: usize = 32;

/// Constants and iotas with at most this many elements are cloned into bodies instead of becoming operands.
const MAX_CLONED_ELEMENTS: u64 = 64;

declare_pass! {
    /// Groups elementwise, layout and reduction ops (loop) and matmul/conv with their epilogues (library) into fusion nodes.
    #[derive(Clone, Debug)]
    pub struct Fuse = "fuse" {
        /// No group holds more ops than this.
        pub max_ops: usize,
    }
}

impl Default for Fuse {
    fn default() -> Fuse {
        Fuse { max_ops: DEFAULT_MAX_OPS }
    }
}

impl FromOptions for Fuse {
    const OPTIONS: &'static [OptionDoc] =
        &[OptionDoc { name: "max-ops", value: "N", summary: "no group holds more than N ops (default 32)" }];

    fn from_options(options: &mut PassOptions<'_>) -> Result<Fuse, OptionError> {
        Ok(Fuse { max_ops: options.take("max-ops")?.unwrap_or(DEFAULT_MAX_OPS) })
    }
}

impl Pass for Fuse {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> Result<bool, PassError> {
        let order = topo_order(g, Self::NAME)?;
        let groups = form_groups(g, &order, self.max_ops.max(1), &cx.placed_elsewhere);
        let changed = !groups.is_empty();
        for (i, (kind, members)) in groups.into_iter().enumerate() {
            build_fusion(g, kind, &members, i);
        }
        Ok(changed)
    }
}

/// Ops a loop group may hold.
fn is_loop_op(op: &Op) -> bool {
    matches!(op.fusibility(), Fusibility::Elementwise | Fusibility::Channelwise | Fusibility::Loop)
}

/// A constant or iota small enough to clone into a body.
fn is_cheap_source(node: &Node) -> bool {
    let elements = match &node.op {
        Op::Constant(c) => Some(c.value.len() as u64),
        Op::Iota(_) => node.outputs.first().and_then(|t| t.shape.num_elements()),
        _ => None,
    };
    elements.is_some_and(|n| n <= MAX_CLONED_ELEMENTS)
}

/// Whether a run-time node may join `members`, a group computed at load (see the module docs): only when the
/// group moves data (broadcast, reshape, transpose: cheaper to recompute inline than to read back) and no value of
/// it is used outside it but by `joining` — otherwise the merged kernel would compute the group in every run
/// (and store the escaping values) where a prepare step computes it once.
fn inline_at_load(g: &Graph, members: &[NodeId], joining: NodeId) -> bool {
    members.iter().all(|&m| {
        let node = g.node(m);
        matches!(node.op, Op::Broadcast(_) | Op::Reshape(_) | Op::Transpose(_))
            && (0..node.outputs.len()).all(|k| {
                let v = Value::new(m, k as u32);
                !is_output(g, v) && g.uses(v).iter().all(|(u, _)| *u == joining || members.contains(u))
            })
    })
}

/// Whether `v` is a graph output.
fn is_output(g: &Graph, v: Value) -> bool {
    g.outputs().iter().any(|(_, o)| *o == v)
}

/// The groups to fuse, each with at least two members listed in topological order.
fn form_groups(
    g: &Graph,
    order: &[NodeId],
    max_ops: usize,
    placed_elsewhere: &std::collections::BTreeSet<String>,
) -> Vec<(FusionKind, Vec<NodeId>)> {
    // Ops another backend runs stay single nodes: that backend runs them one node at a time.
    let kept = |id: NodeId| placed_elsewhere.contains(g.node(id).op.mnemonic());
    // Nodes computed once at load stay in groups of their own kind (see the module docs).
    let at_load = kiln_ir::memory::computed_at_load(g, order);
    let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut group_of: HashMap<NodeId, usize> = HashMap::new();
    let mut groups: Vec<(FusionKind, Vec<NodeId>)> = Vec::new();

    // Library groups: a root and its chain of sole-user elementwise consumers.
    for &id in order {
        if g.node(id).op.fusibility() != Fusibility::LibraryRoot || group_of.contains_key(&id) || kept(id) {
            continue;
        }
        let mut members = vec![id];
        let mut cur = id;
        while members.len() < max_ops {
            let v = Value::new(cur, 0);
            if g.node(cur).outputs.len() != 1 || is_output(g, v) {
                break;
            }
            let uses = g.uses(v);
            let [(user, _)] = uses.as_slice() else { break };
            let epilogue = match g.node(*user).op.fusibility() {
                Fusibility::Elementwise => true,
                // A batch norm of the chain's value (not one scaling by it).
                Fusibility::Channelwise => g.node(*user).inputs.first() == Some(&v),
                _ => false,
            };
            if group_of.contains_key(user)
                || !epilogue
                || kept(*user)
                || at_load.contains(&cur) != at_load.contains(user)
            {
                break;
            }
            members.push(*user);
            cur = *user;
        }
        if members.len() > 1 {
            for &m in &members {
                group_of.insert(m, groups.len());
            }
            groups.push((FusionKind::Library, members));
        }
    }

    // Loop groups, grown greedily in topological order.
    let mut loop_groups: Vec<Vec<NodeId>> = Vec::new();
    let first_loop = groups.len();
    for &id in order {
        let node = g.node(id);
        if !is_loop_op(&node.op) || group_of.contains_key(&id) || kept(id) {
            continue;
        }
        let mut joined = None;
        let mut refused = None;
        for v in &node.inputs {
            let Some(&gi) = group_of.get(&v.node) else { continue };
            if gi < first_loop || loop_groups[gi - first_loop].len() >= max_ops {
                continue;
            }
            let members = &loop_groups[gi - first_loop];
            let group_at_load = members.iter().all(|m| at_load.contains(m));
            if at_load.contains(&id) && !group_at_load
                || !at_load.contains(&id) && group_at_load && !inline_at_load(g, members, id)
            {
                continue;
            }
            if recomputed_at_cost(g, &node.op, *v, &loop_groups[gi - first_loop]) {
                refused = Some(*v);
                continue;
            }
            if convex_with(g, &pos, &group_of, &groups, &loop_groups, first_loop, gi, id) {
                joined = Some(gi);
                break;
            }
        }
        // A reduction kept out of its operand's group joins a group already reducing the same value, so that
        // value's reductions (dynamic quantization's min and max) still share one pass over it.
        if let (None, Some(v)) = (joined, refused) {
            joined = g
                .uses(v)
                .iter()
                .filter(|(user, _)| *user != id && matches!(g.node(*user).op, Op::Reduce(_)))
                .filter_map(|(user, _)| group_of.get(user).copied())
                .find(|&gi| {
                    gi >= first_loop
                        && loop_groups[gi - first_loop].iter().all(|m| at_load.contains(m)) == at_load.contains(&id)
                        && loop_groups[gi - first_loop].len() < max_ops
                        && convex_with(g, &pos, &group_of, &groups, &loop_groups, first_loop, gi, id)
                });
        }
        let gi = joined.unwrap_or_else(|| {
            loop_groups.push(Vec::new());
            first_loop + loop_groups.len() - 1
        });
        loop_groups[gi - first_loop].push(id);
        group_of.insert(id, gi);
    }
    groups.extend(loop_groups.into_iter().filter(|m| m.len() > 1).map(|m| (FusionKind::Loop, m)));
    groups
}

/// Whether a whole-tensor reduction `op` of `v` joining `v`'s group would recompute costly arithmetic: the kernel
/// evaluates a value once per loop nest that reads it, and a reduction over every axis reads `v` in a nest of its
/// own that must finish before any consumer of its result starts another pass over the whole tensor. When `v` has
/// another use as well (an output, or an elementwise consumer after the reduction — dynamic quantization's min
/// and max before its quantize, say) and its producer cone in the group `members` holds a transcendental op, the
/// group would evaluate that op two or more times per element where storing `v` once costs a write and a read.
/// `v` then ends its group and the reduction starts the next. (A row reduction — a softmax written out — keeps
/// recomputing within the row, whose inputs are still in cache.)
fn recomputed_at_cost(g: &Graph, op: &Op, v: Value, members: &[NodeId]) -> bool {
    let rank = g.value_type(v).map_or(0, |t| t.shape.rank());
    let whole = match op {
        Op::Reduce(r) => {
            let axes: HashSet<usize> =
                r.axes.iter().filter_map(|&a| kiln_ir::types::normalize_axis(a, rank).ok()).collect();
            rank > 0 && axes.len() == rank
        }
        _ => false,
    };
    if !whole || (g.uses(v).len() < 2 && !is_output(g, v)) {
        return false;
    }
    let member: HashSet<NodeId> = members.iter().copied().collect();
    let mut seen = HashSet::new();
    let mut work = vec![v.node];
    while let Some(id) = work.pop() {
        if !member.contains(&id) || !seen.insert(id) {
            continue;
        }
        let costly = match &g.node(id).op {
            Op::Unary(k) => matches!(
                k,
                UnaryOp::Exp
                    | UnaryOp::Log
                    | UnaryOp::Tanh
                    | UnaryOp::Sigmoid
                    | UnaryOp::Erf
                    | UnaryOp::Sin
                    | UnaryOp::Cos
                    | UnaryOp::Tan
                    | UnaryOp::Asin
                    | UnaryOp::Acos
                    | UnaryOp::Atan
                    | UnaryOp::Sinh
                    | UnaryOp::Cosh
                    | UnaryOp::Asinh
                    | UnaryOp::Acosh
                    | UnaryOp::Atanh
            ),
            Op::Binary(BinaryOp::Pow) | Op::Gelu(_) | Op::Softmax(_) | Op::LogSoftmax(_) | Op::LayerNorm(_) => true,
            _ => false,
        };
        if costly {
            return true;
        }
        work.extend(g.node(id).inputs.iter().map(|i| i.node));
    }
    false
}

/// Whether group `gi` plus node `n` is convex: no path leaves it and comes back, where reaching any member of
/// another group reaches all of that group (it becomes one node).
#[allow(clippy::too_many_arguments)]
fn convex_with(
    g: &Graph,
    pos: &HashMap<NodeId, usize>,
    group_of: &HashMap<NodeId, usize>,
    groups: &[(FusionKind, Vec<NodeId>)],
    loop_groups: &[Vec<NodeId>],
    first_loop: usize,
    gi: usize,
    n: NodeId,
) -> bool {
    let members_of =
        |i: usize| -> &[NodeId] { if i < first_loop { &groups[i].1 } else { &loop_groups[i - first_loop] } };
    let inside: HashSet<NodeId> = members_of(gi).iter().copied().chain([n]).collect();
    let last = inside.iter().map(|id| pos[id]).max().unwrap_or(0);
    let mut seen: HashSet<NodeId> = HashSet::new();
    let mut expanded: HashSet<usize> = HashSet::new();
    let mut work: Vec<NodeId> = Vec::new();
    for &m in &inside {
        work.extend(g.users(m).into_iter().filter(|u| !inside.contains(u)));
    }
    while let Some(x) = work.pop() {
        if inside.contains(&x) {
            return false;
        }
        // Nothing after the group's last member leads back into it, except through a group that spans it.
        if !seen.insert(x) {
            continue;
        }
        let mut from = vec![x];
        if let Some(&h) = group_of.get(&x)
            && expanded.insert(h)
        {
            from.extend(members_of(h).iter().copied());
        }
        for y in from {
            for u in g.users(y) {
                if inside.contains(&u) {
                    return false;
                }
                if pos[&u] <= last || group_of.contains_key(&u) {
                    work.push(u);
                }
            }
        }
    }
    true
}

/// Replaces the group `members` (live ids, in topological order) by one fusion node.
fn build_fusion(g: &mut Graph, kind: FusionKind, members: &[NodeId], index: usize) {
    let inside: HashSet<NodeId> = members.iter().copied().collect();
    let label = match kind {
        FusionKind::Loop => "loop",
        FusionKind::Library => "library",
    };
    let mut body = Graph::new(format!("{label}{index}"));
    let mut map: HashMap<Value, Value> = HashMap::new();
    let mut operands: Vec<Value> = Vec::new();
    let mut cloned: Vec<NodeId> = Vec::new();
    for &m in members {
        let node = g.node(m).clone();
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &v in &node.inputs {
            if let Some(&b) = map.get(&v) {
                inputs.push(b);
                continue;
            }
            let producer = g.node(v.node);
            let b = if is_cheap_source(producer) {
                cloned.push(v.node);
                let id = body.add_node(producer.clone());
                Value::new(id, v.index)
            } else {
                let ty = g.value_type(v).cloned().expect("operands of a verified graph have types");
                let name = FusionBody::param_name(operands.len());
                operands.push(v);
                let id = body.add_node(Node {
                    op: Op::Input(Input { name }),
                    inputs: vec![],
                    outputs: vec![ty],
                    name: None,
                });
                Value::new(id, 0)
            };
            map.insert(v, b);
            inputs.push(b);
        }
        let results = node.outputs.len() as u32;
        let id = body.add_node(Node { inputs, ..node });
        for i in 0..results {
            map.insert(Value::new(m, i), Value::new(id, i));
        }
    }
    // Values used outside the group, or graph outputs, become results.
    let mut escaping: Vec<Value> = Vec::new();
    for &m in members {
        for i in 0..g.node(m).outputs.len() as u32 {
            let v = Value::new(m, i);
            if is_output(g, v) || g.uses(v).iter().any(|(u, _)| !inside.contains(u)) {
                escaping.push(v);
            }
        }
    }
    let mut types = Vec::with_capacity(escaping.len());
    for (i, &v) in escaping.iter().enumerate() {
        body.add_output(format!("r{i}"), map[&v]);
        types.push(g.value_type(v).cloned().expect("results have types"));
    }
    let name = g.node(members[0]).name.clone();
    let op = Op::Fusion(Fusion { kind, body: FusionBody(Box::new(body)) });
    let fused = g.add_node(Node { op, inputs: operands, outputs: types, name });
    for (i, &v) in escaping.iter().enumerate() {
        g.replace_uses(v, Value::new(fused, i as u32));
    }
    for &m in members.iter().rev() {
        g.remove_node(m);
    }
    cloned.sort_unstable();
    cloned.dedup();
    for id in cloned {
        let unused = g.users(id).is_empty() && !g.outputs().iter().any(|(_, v)| v.node == id);
        if unused {
            g.remove_node(id);
        }
    }
}
