//! The graph: typed op nodes on a petgraph `StableGraph`, behind newtype ids.
//!
//! A node owns its op, its operand list ([`Value`]s: a producing node and a result index) and its result types.
//! The operand list is authoritative; the petgraph edges mirror it (one edge per operand, weighted by operand
//! slot) so that graph algorithms — topological order, cycle detection, users — come from petgraph. Every
//! mutation goes through [`Graph`]'s methods, which keep the two in step. Removing a node that still has users
//! leaves those users' operands dangling; the verifier reports them.
//!
//! Graph inputs are `input` nodes listed in order; outputs are named values; weights live in [`Weights`], a
//! name → tensor store shared cheaply between clones, never in the IR text.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use petgraph::Direction;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use serde::{Deserialize, Serialize};

use crate::memory::MemoryPlan;
use crate::op::Op;
use crate::tensor::Tensor;
use crate::types::TensorType;

/// A node's id; stable across removals of other nodes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u32);

impl NodeId {
    fn index(self) -> NodeIndex<u32> {
        NodeIndex::new(self.0 as usize)
    }
}

impl From<NodeIndex<u32>> for NodeId {
    fn from(i: NodeIndex<u32>) -> NodeId {
        NodeId(i.index() as u32)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// One result of a node.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Value {
    /// The producing node.
    pub node: NodeId,
    /// Which of its results.
    pub index: u32,
}

impl Value {
    /// Result `index` of `node`.
    pub fn new(node: NodeId, index: u32) -> Value {
        Value { node, index }
    }
}

/// An op applied to operands, with its result types.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// What the node computes.
    pub op: Op,
    /// Operands, in order.
    pub inputs: Vec<Value>,
    /// Result types, in order.
    pub outputs: Vec<TensorType>,
    /// A name for messages and debugging (an ONNX node name, say); not semantically meaningful.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Edge weight: which operand slot of the consumer, and which result of the producer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Use {
    slot: u32,
    result: u32,
}

/// Named weights; cheap to clone (tensors are shared).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Weights(BTreeMap<String, Arc<Tensor>>);

impl Weights {
    /// The weight called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Tensor>> {
        self.0.get(name)
    }

    /// Sets (or replaces) a weight.
    pub fn insert(&mut self, name: impl Into<String>, t: impl Into<Arc<Tensor>>) {
        self.0.insert(name.into(), t.into());
    }

    /// Removes a weight.
    pub fn remove(&mut self, name: &str) -> Option<Arc<Tensor>> {
        self.0.remove(name)
    }

    /// Weights in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<Tensor>)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of weights.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A tensor graph. See the module docs for its invariants.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    name: String,
    g: StableDiGraph<Node, Use, u32>,
    inputs: Vec<NodeId>,
    outputs: Vec<(String, Value)>,
    /// Weight bytes for `param` nodes, by parameter name.
    pub weights: Weights,
    /// The execution order chosen by the `schedule` pass; cleared by every structural mutation.
    schedule: Option<Vec<NodeId>>,
    /// The arena plan of the `plan-memory` pass; cleared by every mutation and by a new schedule.
    memory_plan: Option<MemoryPlan>,
}

/// A cycle through the named node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle(pub NodeId);

impl Graph {
    /// An empty graph called `name`.
    pub fn new(name: impl Into<String>) -> Graph {
        Graph { name: name.into(), ..Graph::default() }
    }

    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Renames the graph.
    pub fn set_name(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }

    /// Adds a node (no type checking: the builder does that, and the verifier checks after the fact). An
    /// `input` node is appended to the graph's input list. Operands naming nodes that do not exist are kept (and
    /// reported by the verifier) but get no edge.
    pub fn add_node(&mut self, node: Node) -> NodeId {
        self.invalidate();
        let is_input = matches!(node.op, Op::Input(_));
        let inputs = node.inputs.clone();
        let id: NodeId = self.g.add_node(node).into();
        for (slot, v) in inputs.iter().enumerate() {
            if self.g.contains_node(v.node.index()) {
                self.g.add_edge(v.node.index(), id.index(), Use { slot: slot as u32, result: v.index });
            }
        }
        if is_input {
            self.inputs.push(id);
        }
        id
    }

    /// The node `id`, if it exists.
    pub fn get(&self, id: NodeId) -> Option<&Node> {
        self.g.node_weight(id.index())
    }

    /// The node `id`. Panics if it was removed: ids come from this graph.
    pub fn node(&self, id: NodeId) -> &Node {
        self.g.node_weight(id.index()).unwrap_or_else(|| panic!("node {id} is not in graph `{}`", self.name))
    }

    /// Mutable access to a node's op, name and result types. Operands change only through
    /// [`Graph::set_input`] and [`Graph::replace_uses`].
    pub fn node_mut(&mut self, id: NodeId) -> NodeMut<'_> {
        // Result types may change, and with them buffer sizes; the order stays valid.
        self.memory_plan = None;
        let name = self.name.clone();
        let n = self.g.node_weight_mut(id.index()).unwrap_or_else(|| panic!("node {id} is not in graph `{name}`"));
        NodeMut { op: &mut n.op, outputs: &mut n.outputs, name: &mut n.name }
    }

    /// The type of a value, if its node and result exist.
    pub fn value_type(&self, v: Value) -> Option<&TensorType> {
        self.get(v.node).and_then(|n| n.outputs.get(v.index as usize))
    }

    /// Whether `id` names a live node.
    pub fn contains(&self, id: NodeId) -> bool {
        self.g.contains_node(id.index())
    }

    /// Live node ids in insertion order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.g.node_indices().map(NodeId::from)
    }

    /// Number of live nodes.
    pub fn len(&self) -> usize {
        self.g.node_count()
    }

    /// True when the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.g.node_count() == 0
    }

    /// The `input` nodes, in input order.
    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    /// The named outputs, in order.
    pub fn outputs(&self) -> &[(String, Value)] {
        &self.outputs
    }

    /// Appends a named output.
    pub fn add_output(&mut self, name: impl Into<String>, v: Value) {
        self.memory_plan = None;
        self.outputs.push((name.into(), v));
    }

    /// Replaces the output list.
    pub fn set_outputs(&mut self, outputs: Vec<(String, Value)>) {
        self.memory_plan = None;
        self.outputs = outputs;
    }

    /// The `param` nodes, in insertion order.
    pub fn params(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.node_ids().filter(|&id| matches!(self.node(id).op, Op::Parameter(_)))
    }

    /// Sets operand `slot` of `id` to `v`.
    pub fn set_input(&mut self, id: NodeId, slot: usize, v: Value) {
        self.invalidate();
        let old = self.g.edges_directed(id.index(), Direction::Incoming).find(|e| e.weight().slot as usize == slot);
        if let Some(e) = old.map(|e| e.id()) {
            self.g.remove_edge(e);
        }
        if self.g.contains_node(v.node.index()) {
            self.g.add_edge(v.node.index(), id.index(), Use { slot: slot as u32, result: v.index });
        }
        self.g[id.index()].inputs[slot] = v;
    }

    /// Points every use of `old` (operands and graph outputs) at `new`.
    pub fn replace_uses(&mut self, old: Value, new: Value) {
        self.invalidate();
        for (user, slot) in self.uses(old) {
            self.set_input(user, slot, new);
        }
        for (_, v) in &mut self.outputs {
            if *v == old {
                *v = new;
            }
        }
    }

    /// Every (node, operand slot) that uses `v`, in a deterministic order.
    pub fn uses(&self, v: Value) -> Vec<(NodeId, usize)> {
        let mut out: Vec<(NodeId, usize)> = self
            .g
            .edges_directed(v.node.index(), Direction::Outgoing)
            .filter(|e| e.weight().result == v.index)
            .map(|e| (NodeId::from(e.target()), e.weight().slot as usize))
            .collect();
        out.sort_unstable();
        out
    }

    /// Distinct nodes that use any result of `id`.
    pub fn users(&self, id: NodeId) -> Vec<NodeId> {
        let mut out: Vec<NodeId> =
            self.g.neighbors_directed(id.index(), Direction::Outgoing).map(NodeId::from).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Removes a node (and its edges). Users keep dangling operands, which the verifier reports. The id may be
    /// reused by a later [`Graph::add_node`] (petgraph's free list); stale operands naming it then have no edge,
    /// which the verifier also reports.
    pub fn remove_node(&mut self, id: NodeId) -> Option<Node> {
        self.invalidate();
        self.inputs.retain(|&i| i != id);
        self.g.remove_node(id.index())
    }

    /// Operand slots of `id` that name a live node but have no edge mirroring them (the producer was added
    /// after the operand named its id, or took over a removed node's id). Empty for a well-formed graph.
    pub fn unmirrored_operands(&self, id: NodeId) -> Vec<usize> {
        let Some(node) = self.get(id) else { return Vec::new() };
        node.inputs
            .iter()
            .enumerate()
            .filter(|&(slot, v)| {
                self.contains(v.node)
                    && !self.g.edges_directed(id.index(), Direction::Incoming).any(|e| {
                        e.weight().slot as usize == slot
                            && e.weight().result == v.index
                            && NodeId::from(e.source()) == v.node
                    })
            })
            .map(|(slot, _)| slot)
            .collect()
    }

    /// Forgets the schedule and the memory plan: both describe the graph as it was.
    fn invalidate(&mut self) {
        self.schedule = None;
        self.memory_plan = None;
    }

    /// The stored execution order, if a `schedule` pass set one since the last structural change.
    pub fn schedule(&self) -> Option<&[NodeId]> {
        self.schedule.as_deref()
    }

    /// Stores an execution order (and forgets the memory plan, which was made for another order). Refused,
    /// naming the problem, unless `order` lists every node exactly once with operands before users.
    pub fn set_schedule(&mut self, order: Vec<NodeId>) -> Result<(), String> {
        if order.len() != self.len() {
            return Err(format!("the schedule lists {} nodes; the graph has {}", order.len(), self.len()));
        }
        let mut done = std::collections::BTreeSet::new();
        for &id in &order {
            if !self.contains(id) {
                return Err(format!("the schedule names {id}, which is not in the graph"));
            }
            if let Some(p) =
                self.g.neighbors_directed(id.index(), Direction::Incoming).find(|p| !done.contains(&NodeId::from(*p)))
            {
                return Err(format!("the schedule puts {id} before its operand's producer {}", NodeId::from(p)));
            }
            if !done.insert(id) {
                return Err(format!("the schedule lists {id} twice"));
            }
        }
        self.schedule = Some(order);
        self.memory_plan = None;
        Ok(())
    }

    /// Forgets the stored execution order (and the memory plan made for it).
    pub fn clear_schedule(&mut self) {
        self.invalidate();
    }

    /// The stored memory plan, if `plan-memory` set one since the last mutation.
    pub fn memory_plan(&self) -> Option<&MemoryPlan> {
        self.memory_plan.as_ref()
    }

    /// Stores (or clears) the memory plan; see [`MemoryPlan::check`] for what makes one valid.
    pub fn set_memory_plan(&mut self, plan: Option<MemoryPlan>) {
        self.memory_plan = plan;
    }

    /// Nodes in a topological order: operands before users, ties broken by node id so the order is stable.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, Cycle> {
        let mut indegree: BTreeMap<NodeId, usize> = BTreeMap::new();
        for id in self.node_ids() {
            indegree.insert(id, self.g.edges_directed(id.index(), Direction::Incoming).count());
        }
        let mut ready: std::collections::BTreeSet<NodeId> =
            indegree.iter().filter(|&(_, &d)| d == 0).map(|(&id, _)| id).collect();
        let mut order = Vec::with_capacity(indegree.len());
        while let Some(id) = ready.pop_first() {
            order.push(id);
            for e in self.g.edges_directed(id.index(), Direction::Outgoing) {
                let t = NodeId::from(e.target());
                let d = indegree.get_mut(&t).expect("edge target is a node");
                *d -= 1;
                if *d == 0 {
                    ready.insert(t);
                }
            }
        }
        if order.len() != indegree.len() {
            // A stuck node may merely be downstream of a cycle. Every stuck node has a stuck producer, so walking
            // producers from one must revisit a node, and the first node revisited is on a cycle.
            let stuck = |id: &NodeId| indegree.get(id).is_some_and(|&d| d > 0);
            let mut cur = indegree.keys().copied().find(|id| stuck(id)).expect("some node is stuck");
            let mut visited = std::collections::BTreeSet::new();
            while visited.insert(cur) {
                cur = self
                    .g
                    .neighbors_directed(cur.index(), Direction::Incoming)
                    .map(NodeId::from)
                    .filter(|p| stuck(p))
                    .min()
                    .expect("a stuck node has a stuck producer");
            }
            return Err(Cycle(cur));
        }
        Ok(order)
    }

    /// A label for messages: the node's name if it has one, else its id and mnemonic.
    pub fn describe(&self, id: NodeId) -> String {
        match self.get(id) {
            Some(n) => match &n.name {
                Some(name) => format!("{} `{name}`", n.op.mnemonic()),
                None => format!("{} {id}", n.op.mnemonic()),
            },
            None => format!("removed node {id}"),
        }
    }

    /// Total parameter elements and bytes of the declared `param` types (static shapes only).
    pub fn parameter_footprint(&self) -> (u64, u64) {
        // `first()`: a malformed param without a result type (reported by the verifier) counts as nothing.
        self.params().filter_map(|id| self.node(id).outputs.first()).fold((0, 0), |(n, b), t| {
            let e = t.shape.num_elements().unwrap_or(0);
            (n + e, b + e * t.dtype.size_bytes() as u64)
        })
    }
}

/// Mutable view of a node's op, results and name (not its operands).
pub struct NodeMut<'a> {
    /// The op.
    pub op: &'a mut Op,
    /// Result types.
    pub outputs: &'a mut Vec<TensorType>,
    /// Debug name.
    pub name: &'a mut Option<String>,
}

/// The serde (JSON) form of a graph: nodes with explicit ids. Weights are referenced by name, not included.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphDoc {
    /// Graph name.
    pub name: String,
    /// Nodes, each with its id.
    pub nodes: Vec<(NodeId, Node)>,
    /// Named outputs.
    pub outputs: Vec<(String, Value)>,
}

impl Graph {
    /// The serde form, nodes in topological order when the graph is acyclic (insertion order otherwise).
    pub fn to_doc(&self) -> GraphDoc {
        let order = self.topo_order().unwrap_or_else(|_| self.node_ids().collect());
        GraphDoc {
            name: self.name.clone(),
            nodes: order.into_iter().map(|id| (id, self.node(id).clone())).collect(),
            outputs: self.outputs.clone(),
        }
    }

    /// Rebuilds a graph from its serde form. Ids are renumbered; operands naming unknown ids are kept dangling
    /// (pointing past the last node) for the verifier to report.
    pub fn from_doc(doc: GraphDoc) -> Graph {
        let mut g = Graph::new(doc.name);
        let mut map: BTreeMap<NodeId, NodeId> = BTreeMap::new();
        let dangling = NodeId(u32::MAX);
        let remap = |map: &BTreeMap<NodeId, NodeId>, v: Value| Value {
            node: *map.get(&v.node).unwrap_or(&dangling),
            index: v.index,
        };
        // Two rounds so forward references (a cyclic or unordered doc) still resolve: first create, then wire.
        let mut created = Vec::new();
        for (old, node) in &doc.nodes {
            let mut n = node.clone();
            n.inputs.clear();
            let id = g.add_node(n);
            map.insert(*old, id);
            created.push((id, node.inputs.clone()));
        }
        for (id, inputs) in created {
            let wired: Vec<Value> = inputs.iter().map(|&v| remap(&map, v)).collect();
            g.g[id.index()].inputs = vec![Value::new(dangling, 0); wired.len()];
            for (slot, v) in wired.into_iter().enumerate() {
                g.set_input(id, slot, v);
            }
        }
        g.outputs = doc.outputs.into_iter().map(|(n, v)| (n, remap(&map, v))).collect();
        g
    }

    /// JSON text of the serde form.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.to_doc()).expect("graph docs always serialize")
    }

    /// Parses the JSON form.
    pub fn from_json(s: &str) -> Result<Graph, serde_json::Error> {
        serde_json::from_str::<GraphDoc>(s).map(Graph::from_doc)
    }
}
