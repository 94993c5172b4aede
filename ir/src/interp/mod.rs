//! The reference interpreter: the plain, obviously correct meaning of every op, against which every pass and
//! backend is tested.
//!
//! [`run`] evaluates a graph in topological order. It binds `input` nodes by name and `param` nodes from the
//! graph's weights, checking each against its declared type, and binds symbolic dims (`batch`) to the extents it
//! sees, which must agree everywhere. After each node it checks the results against the node's declared types
//! (with symbols substituted), so a bug that escaped the verifier surfaces at the node that has it, and it drops
//! every value after its last use. [`eval_op`] evaluates one op on concrete tensors: it first runs the op's type
//! rule ([`infer`]), which validates attributes and operands, then the kernel (`elementwise`, `reduce`, `shape`,
//! `topk`, or `nn` for the neural-net ops), then checks the kernel's results against the rule's types.
//!
//! [`scalar`] exposes the same elementwise semantics one element at a time, for the kernel IR's evaluator.
//!
//! Nothing here panics on user input: out-of-range indices, integer division by zero or `MIN / -1`, negative
//! integer exponents and empty `max`/`min` reductions are errors. Numeric conventions (compute types, wrapping,
//! NaN handling) are stated in each kernel file.

mod control;
mod dynamic;
mod elementwise;
mod index;
mod nn;
mod num;
mod quant;
mod reduce;
pub mod scalar;
mod shape;
mod topk;

pub use control::{BodyRunner, max_loop_iterations, run_if, run_loop};
pub use dynamic::{data_dependent, non_zero};
pub use index::resolve_index;
pub use nn::{filter_taps, grid_sample_f32, linear_taps, nearest_taps, outside_taps, roi_align_f32};

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::graph::{Graph, NodeId, Value};
use crate::infer::infer;
use crate::op::Op;
use crate::tensor::Tensor;
use crate::types::{Dim, TensorType};

/// An op could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{node}: {message}")]
pub struct InterpError {
    /// The node, as [`Graph::describe`] names it.
    pub node: String,
    /// What went wrong.
    pub message: String,
}

/// Evaluates one op on concrete operands (used by constant folding). Returns all results.
///
/// `input` and `param` have no value without a graph and are errors here; symbolic dims in shape attributes
/// must have been substituted (as [`run`] does).
pub fn eval_op(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let from_graph = || Err(format!("{} takes its value from the graph, not from operands", op.mnemonic()));
    if matches!(op, Op::Input(_) | Op::Parameter(_)) {
        return from_graph();
    }
    // Regions are not checked through the type rule: a body typed on symbolic dims binds them to these operands
    // as it runs (and a loop's carried values may change extents between iterations).
    match op {
        Op::Fusion(f) => return f.body.eval(inputs),
        Op::If(i) => return control::if_(i, inputs),
        Op::Loop(l) => return control::loop_(l, inputs),
        _ => {}
    }
    let types: Vec<TensorType> = inputs.iter().map(|t| t.tensor_type()).collect();
    let expected = infer(op, &types)?;
    for t in &expected {
        if let Some(dims) = t.shape.as_static() {
            index::element_count(&dims)?;
        }
    }
    let one = |t: Tensor| vec![t];
    let results = match op {
        Op::Input(_) | Op::Parameter(_) => return from_graph(),
        Op::Fusion(f) => f.body.eval(inputs)?,
        Op::If(i) => control::if_(i, inputs)?,
        Op::Loop(l) => control::loop_(l, inputs)?,
        Op::Constant(c) => one(c.value.clone()),
        Op::Unary(k) => one(elementwise::unary(*k, inputs[0])?),
        Op::Binary(k) => one(elementwise::binary(*k, inputs[0], inputs[1])?),
        Op::Cast(c) => one(elementwise::cast(inputs[0], c.to)?),
        Op::Select => one(elementwise::select(inputs[0], inputs[1], inputs[2])?),
        Op::Reduce(r) => one(reduce::reduce(r, inputs[0])?),
        Op::ArgReduce(r) => one(reduce::arg_reduce(r, inputs[0])?),
        Op::TopK(t) => topk::top_k(t, inputs[0], inputs.get(1).copied())?,
        Op::NonZero(_) | Op::Unique(_) | Op::NonMaxSuppression(_) => {
            let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
            dynamic::data_dependent(op, &views)?
        }
        Op::MatMul => one(reduce::matmul(inputs[0], inputs[1])?),
        Op::MatMulInteger => one(quant::matmul_integer(inputs)?),
        Op::ConvInteger(c) => one(quant::conv_integer(c, inputs)?),
        Op::DynamicQuantize => quant::dynamic_quantize(inputs[0])?,
        Op::Reshape(r) => one(shape::reshape(inputs[0], &r.shape)?),
        Op::Transpose(t) => one(shape::transpose(inputs[0], &t.perm)?),
        Op::Broadcast(b) => one(shape::broadcast(inputs[0], &b.shape)?),
        Op::Slice(s) => one(shape::slice(inputs[0], s)?),
        Op::Concat(c) => one(shape::concat(inputs, c)?),
        Op::Split(s) => shape::split(inputs[0], s)?,
        Op::Pad(p) => one(shape::pad(inputs[0], p)?),
        Op::Gather(g) => one(shape::gather(inputs[0], inputs[1], g)?),
        Op::GatherElements(g) => one(shape::gather_elements(inputs[0], inputs[1], g)?),
        Op::Scatter(s) => one(shape::scatter(inputs[0], inputs[1], inputs[2], s)?),
        Op::Iota(i) => one(shape::iota(i)?),
        Op::ShapeOf => one(shape::shape_of(inputs[0])),
        Op::Conv(_)
        | Op::ConvTranspose(_)
        | Op::Pool(_)
        | Op::Softmax(_)
        | Op::LogSoftmax(_)
        | Op::LayerNorm(_)
        | Op::BatchNorm(_)
        | Op::Gelu(_)
        | Op::Resize(_)
        | Op::GridSample(_)
        | Op::RoiAlign(_)
        | Op::Lstm(_)
        | Op::Gru(_) => nn::eval(op, inputs)?,
    };
    // The kernel must agree with the type rule; a disagreement is a bug in one of them, reported, not hidden.
    let got: Vec<TensorType> = results.iter().map(Tensor::tensor_type).collect();
    if got.len() != expected.len() || got.iter().zip(&expected).any(|(g, e)| !conforms(g, e)) {
        return Err(format!(
            "internal error: {} produced {} but its type rule gives {}",
            op.mnemonic(),
            list(&got),
            list(&expected)
        ));
    }
    Ok(results)
}

/// Whether a kernel's result type `got` (static) is what the type rule gave: equal, except that a data-dependent
/// dim (a symbol of the rule's result on static operands, such as `non_zero`'s count) takes any extent.
fn conforms(got: &TensorType, rule: &TensorType) -> bool {
    got.dtype == rule.dtype
        && got.shape.rank() == rule.shape.rank()
        && got.shape.0.iter().zip(&rule.shape.0).all(|(g, r)| matches!(r, Dim::Sym(_)) || g == r)
}

fn list(types: &[TensorType]) -> String {
    types.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// A value held by [`run`]: borrowed from the caller's inputs, shared with the weight store, or computed.
enum Held<'a> {
    Borrowed(&'a Tensor),
    Shared(Arc<Tensor>),
    Owned(Tensor),
}

impl Held<'_> {
    fn get(&self) -> &Tensor {
        match self {
            Held::Borrowed(t) => t,
            Held::Shared(t) => t,
            Held::Owned(t) => t,
        }
    }

    fn into_tensor(self) -> Tensor {
        match self {
            Held::Borrowed(t) => t.clone(),
            Held::Shared(t) => Arc::unwrap_or_clone(t),
            Held::Owned(t) => t,
        }
    }
}

/// Values of symbolic dims, bound as inputs, parameters and results arrive.
#[derive(Default)]
struct Symbols(BTreeMap<String, u64>);

impl Symbols {
    /// Checks `t` against a declared type, binding unbound symbols to `t`'s extents. `what` names the value.
    fn bind(&mut self, declared: &TensorType, t: &Tensor, what: &str) -> Result<(), String> {
        if t.dtype() != declared.dtype {
            return Err(format!("{what} should be {}, got {}", declared.dtype, t.dtype()));
        }
        let dims = declared.shape.dims();
        if t.shape().len() != dims.len() {
            return Err(format!(
                "{what} should have rank {} ({}), got shape {}",
                dims.len(),
                declared.shape.substitute(&self.0),
                t.tensor_type().shape
            ));
        }
        // Bind into a copy first so a failed check leaves no partial bindings.
        let mut bound = self.0.clone();
        for (d, (want, &got)) in dims.iter().zip(t.shape()).enumerate() {
            let got = got as u64;
            match want {
                Dim::Static(n) if *n != got => {
                    return Err(format!(
                        "{what} should have shape {}, got {} (dim {d} is {got}, not {n})",
                        declared.shape.substitute(&self.0),
                        t.tensor_type().shape
                    ));
                }
                Dim::Static(_) => {}
                // A derived dim is evaluated once the symbols it reads are bound (`crate::dim`).
                Dim::Sym(s) => match bound.get(s).copied().or_else(|| want.substitute(&bound).as_static()) {
                    Some(n) if n != got => {
                        return Err(format!(
                            "{what} has {got} for symbolic dim `{s}` (dim {d}), but `{s}` is already bound to {n}"
                        ));
                    }
                    Some(_) => {}
                    None => {
                        bound.insert(s.clone(), got);
                    }
                },
            }
        }
        self.0 = bound;
        Ok(())
    }

    /// `op` with bound symbols substituted into its dim-valued attributes ([`Op::substitute_dims`]).
    fn substitute<'o>(&self, op: &'o Op) -> Cow<'o, Op> {
        op.substitute_dims(&self.0).map_or(Cow::Borrowed(op), Cow::Owned)
    }
}

/// Runs `g` on named inputs; returns the named outputs in order.
///
/// Every `input` node needs a tensor of its declared dtype, rank and static extents; symbolic dims bind to the
/// extents given and must agree across inputs. Entries in `inputs` that name no graph input are ignored (a pass
/// may have removed an unused input). Symbols that no input binds are bound by the first parameter or result
/// that carries them.
pub fn run(g: &Graph, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, InterpError> {
    run_observed(g, inputs, &mut |_, _| {})
}

/// [`run`], handing every op's results to `observe` (with the node) before later nodes read them; `observe` may
/// change the values but not their dtypes or shapes. Testing tools use it, e.g. to perturb results and estimate
/// how sensitive the outputs are to rounding (`kiln::difftest`).
pub fn run_observed(
    g: &Graph,
    inputs: &BTreeMap<String, Tensor>,
    observe: &mut dyn FnMut(NodeId, &mut [Tensor]),
) -> Result<Vec<(String, Tensor)>, InterpError> {
    let err = |id: NodeId, message: String| InterpError { node: g.describe(id), message };
    let order = g.topo_order().map_err(|c| err(c.0, "the graph has a cycle through this node".into()))?;

    let mut symbols = Symbols::default();
    let mut values: HashMap<Value, Held<'_>> = HashMap::new();
    for &id in g.inputs() {
        let node = g.node(id);
        let Op::Input(inp) = &node.op else { continue };
        let declared = node.outputs.first().ok_or_else(|| err(id, "declares no result type".into()))?;
        let what = format!("input `{}`", inp.name);
        let t = inputs.get(&inp.name).ok_or_else(|| err(id, format!("{what} is missing")))?;
        symbols.bind(declared, t, &what).map_err(|m| err(id, m))?;
        values.insert(Value::new(id, 0), Held::Borrowed(t));
    }

    // Remaining uses of each value; graph outputs count as one use each, released at the end.
    let mut uses: HashMap<Value, usize> = HashMap::new();
    for &id in &order {
        for &v in &g.node(id).inputs {
            *uses.entry(v).or_default() += 1;
        }
    }
    for (_, v) in g.outputs() {
        *uses.entry(*v).or_default() += 1;
    }

    for &id in &order {
        let node = g.node(id);
        let results: Vec<Held<'_>> = match &node.op {
            Op::Input(inp) => {
                if !values.contains_key(&Value::new(id, 0)) {
                    return Err(err(id, format!("input `{}` is not in the graph's input list", inp.name)));
                }
                continue;
            }
            Op::Parameter(p) => {
                let declared = node.outputs.first().ok_or_else(|| err(id, "declares no result type".into()))?;
                let what = format!("parameter `{}`", p.name);
                let w = g.weights.get(&p.name).ok_or_else(|| err(id, format!("{what} has no weight")))?;
                symbols.bind(declared, w, &what).map_err(|m| err(id, m))?;
                vec![Held::Shared(Arc::clone(w))]
            }
            op => {
                let mut operands = Vec::with_capacity(node.inputs.len());
                for (slot, v) in node.inputs.iter().enumerate() {
                    let t = values.get(v).ok_or_else(|| {
                        err(
                            id,
                            format!(
                                "operand {slot} ({}#{}) has no value: its node or result is missing",
                                v.node, v.index
                            ),
                        )
                    })?;
                    operands.push(t.get());
                }
                let op = symbols.substitute(op);
                let mut out = eval_op(&op, &operands).map_err(|m| err(id, m))?;
                observe(id, &mut out);
                if out.len() != node.outputs.len() {
                    return Err(err(id, format!("produced {} results but declares {}", out.len(), node.outputs.len())));
                }
                for (i, (t, declared)) in out.iter().zip(&node.outputs).enumerate() {
                    symbols.bind(declared, t, &format!("result {i}")).map_err(|m| err(id, m))?;
                }
                out.into_iter().map(Held::Owned).collect()
            }
        };
        for (i, h) in results.into_iter().enumerate() {
            let v = Value::new(id, i as u32);
            if uses.get(&v).is_some_and(|&n| n > 0) {
                values.insert(v, h);
            }
        }
        for v in &node.inputs {
            if let Some(n) = uses.get_mut(v) {
                *n -= 1;
                if *n == 0 {
                    values.remove(v);
                }
            }
        }
    }

    let outputs = g.outputs();
    let mut out = Vec::with_capacity(outputs.len());
    for (name, v) in outputs {
        let n = uses.get_mut(v).expect("every output was counted");
        *n -= 1;
        // The last reference to a value takes it; earlier ones (an output listed twice) copy it.
        let held = if *n == 0 { values.remove(v) } else { values.get(v).map(|h| Held::Owned(h.get().clone())) };
        let t = held.ok_or_else(|| InterpError {
            node: format!("output `{name}`"),
            message: format!("refers to {}#{}, which has no value", v.node, v.index),
        })?;
        out.push((name.clone(), t.into_tensor()));
    }
    Ok(out)
}
