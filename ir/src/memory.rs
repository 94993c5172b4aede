//! Memory plans: where each intermediate value lives in one arena, and the liveness facts a plan rests on.
//!
//! An *intermediate* value is a result of any node but `input`, `param` and `constant` (those live in memory the
//! caller or the weight store owns) and the nodes [`computed_at_load`] (their results are prepared weights). Over an execution order (the graph's schedule, else its topological order)
//! a value is live from the step that defines it to the step of its last use, both included; a graph output
//! stays live to the end. A [`MemoryPlan`] gives every intermediate with a static shape a [`Buffer`] in one arena
//! (offsets aligned to [`ALIGNMENT`]); values with symbolic dims are listed in [`MemoryPlan::dynamic`] and
//! allocated at run time. Two values may share bytes only when their lifetimes are disjoint, or when one is
//! computed *in place* of the other: an elementwise node may write its result over an operand that dies at that
//! node and has the same element count and element size, because element `i` of the result depends only on
//! element `i` of each operand. [`MemoryPlan::check`] verifies exactly these rules.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::graph::{Graph, NodeId, Value};
use crate::op::Op;
use crate::types::TensorType;

/// Every buffer offset in a plan is a multiple of this many bytes.
pub const ALIGNMENT: u64 = 64;

/// A byte range of the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Buffer {
    /// Start, a multiple of [`ALIGNMENT`].
    pub offset: u64,
    /// Bytes the value occupies (its tensor's size, not rounded).
    pub size: u64,
}

impl Buffer {
    /// Whether the two byte ranges share a byte (empty buffers share none).
    pub fn overlaps(&self, other: &Buffer) -> bool {
        self.size > 0
            && other.size > 0
            && self.offset < other.offset + other.size
            && other.offset < self.offset + self.size
    }
}

/// Where every intermediate value lives. See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPlan {
    /// Bytes of the arena: the end of the last buffer, rounded up to [`ALIGNMENT`].
    pub arena_bytes: u64,
    /// The naive figure: the sum of the sizes of all statically sized intermediates, each in its own buffer.
    pub naive_bytes: u64,
    /// The buffer of each statically sized intermediate value.
    #[serde(with = "pairs")]
    pub assignments: BTreeMap<Value, Buffer>,
    /// Results computed in place: result → the operand whose buffer it takes over.
    #[serde(with = "pairs")]
    pub in_place: BTreeMap<Value, Value>,
    /// Intermediates with symbolic dims: not in the arena, allocated at run time.
    pub dynamic: Vec<Value>,
}

/// Maps with struct keys as sequences of pairs (JSON object keys must be strings).
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer, K: Serialize, V: Serialize>(m: &BTreeMap<K, V>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(m.iter())
    }

    pub fn deserialize<'de, D, K, V>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        D: Deserializer<'de>,
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
    {
        Vec::<(K, V)>::deserialize(d).map(|v| v.into_iter().collect())
    }
}

/// The steps of an order at which a value is live: defined at `def`, last read at `last` (both included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// Position of the defining node in the order.
    pub def: usize,
    /// Position of the last user; the order's length for a graph output.
    pub last: usize,
}

impl Interval {
    /// Whether the two lifetimes share a step.
    pub fn overlaps(&self, other: &Interval) -> bool {
        self.def <= other.last && other.def <= self.last
    }
}

/// Lifetimes of the intermediate values over one execution order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifetimes {
    /// The order: every node once, operands first.
    pub order: Vec<NodeId>,
    /// Each intermediate value's lifetime.
    pub live: BTreeMap<Value, Interval>,
}

impl Lifetimes {
    /// Lifetimes over `order`, which must list every node of `g` once, operands first.
    pub fn of(g: &Graph, order: Vec<NodeId>) -> Lifetimes {
        let mut live = BTreeMap::new();
        let at_load = computed_at_load(g, &order);
        for (p, &id) in order.iter().enumerate() {
            let node = g.node(id);
            for &v in &node.inputs {
                if let Some(i) = live.get_mut(&v) {
                    let i: &mut Interval = i;
                    i.last = i.last.max(p);
                }
            }
            if produces_intermediates(&node.op) && !at_load.contains(&id) {
                for k in 0..node.outputs.len() {
                    live.insert(Value::new(id, k as u32), Interval { def: p, last: p });
                }
            }
        }
        for (_, v) in g.outputs() {
            if let Some(i) = live.get_mut(v) {
                i.last = order.len();
            }
        }
        Lifetimes { order, live }
    }

    /// Lifetimes over the graph's schedule, else its topological order; `None` for a cyclic graph.
    pub fn of_graph(g: &Graph) -> Option<Lifetimes> {
        let order = match g.schedule() {
            Some(s) => s.to_vec(),
            None => g.topo_order().ok()?,
        };
        Some(Lifetimes::of(g, order))
    }

    /// The most bytes of statically sized intermediates live at any one step (no reuse, no in-place).
    pub fn peak_bytes(&self, g: &Graph) -> u64 {
        let mut delta = vec![0i128; self.order.len() + 2];
        for (v, i) in &self.live {
            let bytes = g.value_type(*v).and_then(static_bytes).unwrap_or(0) as i128;
            delta[i.def] += bytes;
            delta[i.last + 1] -= bytes;
        }
        let (mut cur, mut peak) = (0i128, 0i128);
        for d in delta {
            cur += d;
            peak = peak.max(cur);
        }
        peak as u64
    }
}

/// Whether a node's results are intermediates (not caller-, weight- or constant-owned memory).
pub fn produces_intermediates(op: &Op) -> bool {
    !matches!(op, Op::Input(_) | Op::Parameter(_) | Op::Constant(_))
}

/// The nodes of `g` whose results are computed once, when the weights are bound, instead of in every run: nodes
/// other than `input`, `param` and `constant` whose operands are all weights, constants or results of such nodes
/// — nullary nodes included (a fusion broadcasting a constant, as ONNX `ConstantOfShape` weights too large to
/// fold become; an `iota`) — and whose results all have static shapes. The IR has no random or stateful op, so
/// such a node gives the same tensor in every run; its results are prepared weights, outside the arena. `order`
/// lists every node of `g` once, operands first.
pub fn computed_at_load(g: &Graph, order: &[NodeId]) -> BTreeSet<NodeId> {
    let mut at_load = BTreeSet::new();
    let known = |v: &Value, at_load: &BTreeSet<NodeId>| {
        at_load.contains(&v.node) || matches!(g.node(v.node).op, Op::Parameter(_) | Op::Constant(_))
    };
    for &id in order {
        let node = g.node(id);
        if produces_intermediates(&node.op)
            && node.outputs.iter().all(|t| t.shape.num_elements().is_some())
            && node.inputs.iter().all(|v| known(v, &at_load))
        {
            at_load.insert(id);
        }
    }
    at_load
}

/// Bytes of a tensor of type `t`, when its shape is static.
pub fn static_bytes(t: &TensorType) -> Option<u64> {
    t.shape.num_elements()?.checked_mul(t.dtype.size_bytes() as u64)
}

/// Whether `result` may be written over `operand` at the same node: same element count and element size.
pub fn same_layout(operand: &TensorType, result: &TensorType) -> bool {
    operand.dtype.size_bytes() == result.dtype.size_bytes()
        && operand.shape.num_elements().is_some()
        && operand.shape.num_elements() == result.shape.num_elements()
}

impl MemoryPlan {
    /// Checks the plan against `g` over its schedule (else topological order): every static intermediate has an
    /// aligned buffer of its size inside the arena, every in-place pair is legal, and no two values live at the
    /// same step share a byte unless one is computed in place of the other. Returns every problem found.
    pub fn check(&self, g: &Graph) -> Result<(), Vec<String>> {
        let Some(lt) = Lifetimes::of_graph(g) else { return Err(vec!["the graph has a cycle".into()]) };
        let mut problems = Vec::new();
        let mut position = BTreeMap::new();
        for (p, &id) in lt.order.iter().enumerate() {
            position.insert(id, p);
        }
        for &v in lt.live.keys() {
            let ty = g.value_type(v).expect("a live value has a type");
            match (static_bytes(ty), self.assignments.get(&v)) {
                (Some(bytes), Some(b)) => {
                    if b.size != bytes {
                        problems.push(format!("{v:?}: buffer of {} bytes for a {bytes}-byte {ty}", b.size));
                    }
                    if b.offset % ALIGNMENT != 0 {
                        problems.push(format!("{v:?}: offset {} is not {ALIGNMENT}-byte aligned", b.offset));
                    }
                    if b.offset + b.size > self.arena_bytes {
                        problems.push(format!("{v:?}: buffer ends past the {}-byte arena", self.arena_bytes));
                    }
                }
                (Some(_), None) => problems.push(format!("{v:?} ({ty}) has no buffer")),
                (None, _) if !self.dynamic.contains(&v) => {
                    problems.push(format!("{v:?} ({ty}) has symbolic dims but is not listed as dynamic"))
                }
                (None, _) => {}
            }
        }
        for v in self.assignments.keys() {
            if !lt.live.contains_key(v) {
                problems.push(format!("{v:?} has a buffer but is not an intermediate value"));
            }
        }
        for (&r, &o) in &self.in_place {
            let node = g.get(r.node);
            let legal = node.is_some_and(|n| n.op.is_elementwise() && n.inputs.contains(&o))
                && lt.live.get(&o).map(|i| i.last) == position.get(&r.node).copied()
                && self.assignments.contains_key(&r)
                && self.assignments.get(&r) == self.assignments.get(&o);
            if !legal {
                problems.push(format!("{r:?} cannot be computed in place of {o:?}"));
            }
        }
        let placed: Vec<(Value, Buffer, Interval)> =
            self.assignments.iter().filter_map(|(v, b)| Some((*v, *b, *lt.live.get(v)?))).collect();
        for (i, (a, ba, la)) in placed.iter().enumerate() {
            for (b, bb, lb) in &placed[i + 1..] {
                let touching_in_place = (self.in_place.get(b) == Some(a) && la.last == lb.def)
                    || (self.in_place.get(a) == Some(b) && lb.last == la.def);
                if ba.overlaps(bb) && la.overlaps(lb) && !touching_in_place {
                    problems.push(format!("{a:?} and {b:?} are live at the same time and share bytes"));
                }
            }
        }
        if problems.is_empty() { Ok(()) } else { Err(problems) }
    }
}
