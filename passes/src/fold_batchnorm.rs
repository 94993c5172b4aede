//! `fold-batchnorm`: folds inference `batch_norm` into the weights of the `conv` or `matmul` that feeds it, or,
//! without one, into the per-channel affine map it is.
//!
//! Inference batch norm is an affine map per channel `c` (dim 1):
//! `y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c] = x * s[c] + t[c]` with
//! `s = scale / sqrt(var + eps)` and `t = bias - mean * s`. Both producers below are linear in their weights per
//! output channel, so the map moves into them. The rules:
//!
//! | rule | why it holds |
//! | --- | --- |
//! | `batch_norm(conv(x, w[, b]))` → `conv(x, w', b')` with `w'[m, …] = w[m, …] * s[m]`, `b' = b * s + t` (`b = 0` when absent) | conv output channel `m` is linear in `w[m, …]` and adds `b[m]` last; channel dim 1 of the conv output is `m` |
//! | `batch_norm(matmul(x, w[K, M]))` → `add(matmul(x, w'), t)` with `w'[k, m] = w[k, m] * s[m]`, when the result has rank 2 | column `m` of a rank-2 product is linear in column `m` of `w`, and dim 1 of `[N, M]` is that column |
//! | `batch_norm(add(matmul(x, w[K, M]), b[M]))` → `add(matmul(x, w'), b')` with `b' = b * s + t`, rank-2 result | as above, plus the bias as in the conv rule |
//! | any other `batch_norm(x)` with `x` of rank ≥ 2 → `x * s' + t'` with `s'`, `t'` shaped `[C, 1, …]` | the map itself, per channel of dim 1; two elementwise ops fuse with their neighbours (a conv's epilogue, a ReLU) where the normalization computed a square root and a division per element |
//! | a batch norm whose statistics are not all stored (computed from weights, or run-time inputs) → the same `x * s' + t'`, with `s = scale / sqrt(var + eps)`, `t = bias - mean * s` computed by graph nodes on the `[C]` values | the same map; nodes computed from weights run once at load, and run-time statistics cost a few ops per channel |
//!
//! Conditions of the folds into weights: every batch-norm operand and the producer's weights (and bias) are
//! `constant`s or `param`s with data in the graph's weight store; every `var + eps` is positive (otherwise the batch norm is NaN-producing or
//! infinite and is left alone); to fold into a producer, the producer's result (and, for the gemm pattern, the
//! matmul's) has the batch norm as its only user and is not a graph output; float dtypes only. The folded values are computed in f64
//! from the stored values and rounded once to the weights' dtype, so the result differs from the unfolded graph
//! only by the rounding of a reassociated product: within 1e-5 relative for f32 on well-conditioned outputs (a
//! cancelling sum loses relative accuracy the same way in both forms). New weights get derived names
//! (`<w>.bn_folded`, `<b>.bn_folded`, made unique; a small result computed only from inline constants stays an
//! inline constant); weights are never changed in place, because another node
//! may still use them. The unused originals are left to `dce`. A batch norm whose statistics are not all stored
//! becomes the affine map computed by graph nodes (last row of the table): the same map up to rounding, except
//! where `var + eps` is exactly 0 (the normalization gives ±inf there, the map inf − inf = NaN for some `x`); one
//! that is not `[C]`-shaped or not float stays (`decompose` can lower it).

use std::sync::Arc;

use kiln_ir::builder::INLINE_CONSTANT_LIMIT;
use kiln_ir::op::{BinaryOp, Constant, Parameter, Reshape, UnaryOp};
use kiln_ir::tensor::Data;
use kiln_ir::{Dim, Graph, Node, NodeId, Op, Shape, Tensor, Value};

use crate::declare_pass;
use crate::pass::{Pass, PassContext, PassError};
use crate::rewrite::Rewriter;

declare_pass! {
    /// Folds inference `batch_norm` into the weights and bias of a preceding `conv` or rank-2 `matmul`, else into a per-channel `x * s + t`.
    #[derive(Clone, Debug, Default)]
    pub struct FoldBatchnorm = "fold-batchnorm";
}

impl Pass for FoldBatchnorm {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> Result<bool, PassError> {
        let bns: Vec<NodeId> = g.node_ids().filter(|&id| matches!(g.node(id).op, Op::BatchNorm(_))).collect();
        let mut changed = false;
        for bn in bns {
            if let Some(plan) = plan(g, bn) {
                apply(g, bn, plan);
                changed = true;
                continue;
            }
            // A batch norm another backend of the registry runs stays one node for it (as `decompose` leaves it).
            if cx.placed_elsewhere.contains("batch_norm") {
                continue;
            }
            let mut e = Rewriter::of(&mut *g, bn);
            let result = affine_nodes(&mut e, bn);
            changed |= e.finish(bn, result);
        }
        Ok(changed)
    }
}

/// The producer shapes the pass folds into.
enum Producer {
    /// `conv(x, w[, b])`: the conv node.
    Conv(NodeId),
    /// `matmul(x, w)`, optionally followed by `add(_, b)`: the matmul, and the add if any.
    MatMul { matmul: NodeId, add: Option<NodeId> },
    /// Any other `x`: the batch norm becomes `x * s + t` with `s`, `t` as `[C, 1, …]` (an elementwise pair that
    /// fuses with its neighbours, instead of a normalization computing `sqrt` and a division per element).
    Affine,
}

/// A fold worked out before the graph is touched.
struct Plan {
    producer: Producer,
    /// Folded weights, and the name of the weight they derive from (for [`Producer::Affine`]: `s`).
    weights: (Tensor, String),
    /// Folded bias `b * s + t`, and the name of the value it derives from (for [`Producer::Affine`]: `t`).
    bias: (Tensor, String),
}

fn plan(g: &Graph, bn: NodeId) -> Option<Plan> {
    let node = g.node(bn);
    let Op::BatchNorm(attrs) = &node.op else { return None };
    let [x, scale, bias, mean, var] = node.inputs.as_slice() else { return None };
    let dtype = node.outputs.first()?.dtype;
    if !dtype.is_float() {
        return None;
    }
    let (scale_name, bias_name) = (known(g, *scale)?.1, known(g, *bias)?.1);
    let (scale, bias, mean, var) =
        (known(g, *scale)?.0.to_f64_vec(), known(g, *bias)?.0.to_f64_vec(), known(g, *mean)?.0.to_f64_vec(), {
            known(g, *var)?.0.to_f64_vec()
        });
    let channels = scale.len();
    if [bias.len(), mean.len(), var.len()].iter().any(|&n| n != channels) {
        return None;
    }
    if !var.iter().all(|&v| (v + attrs.epsilon).is_finite() && v + attrs.epsilon > 0.0) {
        return None;
    }
    let s: Vec<f64> = scale.iter().zip(&var).map(|(sc, v)| sc / (v + attrs.epsilon).sqrt()).collect();
    let t: Vec<f64> = bias.iter().zip(&mean).zip(&s).map(|((b, m), s)| b - m * s).collect();
    let sole_user = |v: Value, user: NodeId| {
        g.users(v.node) == [user] && g.uses(v).len() == 1 && !g.outputs().iter().any(|(_, o)| o.node == v.node)
    };
    into_producer(g, bn, &s, &t, sole_user).or_else(|| {
        // No producer to fold into: `x * s + t`, per channel (dim 1) of `x`.
        let rank = g.value_type(*x)?.shape.rank();
        if rank < 2 || g.value_type(*x)?.shape.dims()[1].as_static() != Some(channels as u64) {
            return None;
        }
        let mut shape = vec![channels];
        shape.resize(rank - 1, 1);
        let column = |v: &[f64]| Tensor::new(shape.clone(), Data::from_f64_iter(dtype, v.iter().copied())).ok();
        Some(Plan { producer: Producer::Affine, weights: (column(&s)?, scale_name), bias: (column(&t)?, bias_name) })
    })
}

/// The fold of batch norm `bn` (per-channel `s`, `t`) into the conv or matmul producing its operand, if it has
/// one of those shapes.
fn into_producer(
    g: &Graph,
    bn: NodeId,
    s: &[f64],
    t: &[f64],
    sole_user: impl Fn(Value, NodeId) -> bool,
) -> Option<Plan> {
    let node = g.node(bn);
    let x = node.inputs[0];
    let dtype = node.outputs.first()?.dtype;
    let channels = s.len();
    if !sole_user(x, bn) || x.index != 0 {
        return None;
    }
    let producer = g.get(x.node)?;
    match &producer.op {
        Op::Conv(_) => {
            let (w, w_name) = known(g, *producer.inputs.get(1)?)?;
            if w.dtype() != dtype || w.shape().first() != Some(&channels) {
                return None;
            }
            let inner = w.len() / channels.max(1);
            let folded_w = scaled(&w, |i| s[i / inner.max(1)])?;
            let (b, b_name) = match producer.inputs.get(2) {
                Some(&b) => {
                    let (b, name) = known(g, b)?;
                    (b.to_f64_vec(), name)
                }
                None => (vec![0.0; channels], format!("{w_name}.bias")),
            };
            if b.len() != channels {
                return None;
            }
            let folded_b = affine(dtype, &b, s, t)?;
            Some(Plan { producer: Producer::Conv(x.node), weights: (folded_w, w_name), bias: (folded_b, b_name) })
        }
        Op::MatMul | Op::Binary(BinaryOp::Add) => {
            let (matmul, add, b) = if let Op::Binary(_) = producer.op {
                let [a, b] = producer.inputs.as_slice() else { return None };
                let (mm, b) = if matches!(g.get(a.node)?.op, Op::MatMul) { (*a, *b) } else { (*b, *a) };
                if !matches!(g.get(mm.node)?.op, Op::MatMul) || !sole_user(mm, x.node) {
                    return None;
                }
                // The bias must be a per-column vector `[M]` (it then broadcasts over rows, as batch norm's does).
                let (bt, name) = known(g, b)?;
                if bt.shape() != [channels] || bt.dtype() != dtype {
                    return None;
                }
                (mm.node, Some(x.node), Some((bt.to_f64_vec(), name)))
            } else {
                (x.node, None, None)
            };
            let mm = g.node(matmul);
            if mm.outputs.first()?.shape.rank() != 2 || node.outputs.first()?.shape.rank() != 2 {
                return None;
            }
            let (w, w_name) = known(g, *mm.inputs.get(1)?)?;
            if w.dtype() != dtype || w.shape().len() != 2 || w.shape()[1] != channels {
                return None;
            }
            let folded_w = scaled(&w, |i| s[i % channels])?;
            let (b, b_name) = b.unwrap_or_else(|| (vec![0.0; channels], format!("{w_name}.bias")));
            let folded_b = affine(dtype, &b, s, t)?;
            Some(Plan {
                producer: Producer::MatMul { matmul, add },
                weights: (folded_w, w_name),
                bias: (folded_b, b_name),
            })
        }
        _ => None,
    }
}

/// The batch norm `bn` as `x * s + t`, `s` and `t` computed by graph nodes from its operands, for statistics not
/// all known at compile time: computed from weights (those nodes then run once, at load) or given at run time (a
/// few ops on `[C]` values per run, where the normalization divided every element). `None` (left alone) unless
/// the result is a float of rank ≥ 2 and every statistic is `[C]` of its dtype.
fn affine_nodes(e: &mut Rewriter<'_>, bn: NodeId) -> Option<Value> {
    let node = e.g.node(bn).clone();
    let Op::BatchNorm(attrs) = &node.op else { return None };
    let ty = node.outputs.first()?.clone();
    let rank = ty.shape.rank();
    let [x, scale, bias, mean, var] = node.inputs[..] else { return None };
    if !ty.dtype.is_float() || rank < 2 {
        return None;
    }
    let channels = ty.shape.dims()[1].clone();
    for v in [scale, bias, mean, var] {
        let t = e.g.value_type(v)?;
        if t.shape.dims() != std::slice::from_ref(&channels) || t.dtype != ty.dtype {
            return None;
        }
    }
    let eps = e.scalar(ty.dtype, attrs.epsilon)?;
    let var_eps = e.binary(BinaryOp::Add, var, eps)?;
    let std = e.unary(UnaryOp::Sqrt, var_eps)?;
    let s = e.binary(BinaryOp::Div, scale, std)?;
    let ms = e.binary(BinaryOp::Mul, mean, s)?;
    let t = e.binary(BinaryOp::Sub, bias, ms)?;
    // `[C]` → `[C, 1, …]`, lined up with dim 1 of the operand.
    let mut dims = vec![channels];
    dims.resize(rank - 1, Dim::Static(1));
    let column = Op::Reshape(Reshape { shape: Shape(dims) });
    let (s, t) = (e.op(column.clone(), &[s])?, e.op(column, &[t])?);
    let scaled = e.binary(BinaryOp::Mul, x, s)?;
    let out = e.binary(BinaryOp::Add, scaled, t)?;
    (e.g.value_type(out)? == &ty).then_some(out)
}

/// `w` with element `i` multiplied by `factor(i)`, computed in f64 and rounded once to `w`'s dtype.
fn scaled(w: &Tensor, factor: impl Fn(usize) -> f64) -> Option<Tensor> {
    let v = w.to_f64_vec();
    let data = Data::from_f64_iter(w.dtype(), v.iter().enumerate().map(|(i, x)| x * factor(i)));
    Tensor::new(w.shape().to_vec(), data).ok()
}

/// `b * s + t` as a `[C]` tensor of `dtype`.
fn affine(dtype: kiln_ir::DType, b: &[f64], s: &[f64], t: &[f64]) -> Option<Tensor> {
    let data = Data::from_f64_iter(dtype, b.iter().zip(s).zip(t).map(|((b, s), t)| b * s + t));
    Tensor::new(vec![b.len()], data).ok()
}

/// The value of `v` when it is known at compile time (a `constant`, or a `param` with stored data), and a name
/// to derive new weight names from.
fn known(g: &Graph, v: Value) -> Option<(Arc<Tensor>, String)> {
    let node = g.get(v.node)?;
    match &node.op {
        Op::Constant(c) => Some((Arc::new(c.value.clone()), CONSTANT_BASE.into())),
        Op::Parameter(p) => Some((Arc::clone(g.weights.get(&p.name)?), p.name.clone())),
        _ => None,
    }
}

/// The base name of values folded from inline constants; a small result derived only from constants stays an
/// inline constant, since nothing can swap it at run time.
const CONSTANT_BASE: &str = "const";

/// The base name of a bias added to a conv or matmul whose weights were an inline constant.
const CONSTANT_BIAS_BASE: &str = "const.bias";

fn apply(g: &mut Graph, bn: NodeId, plan: Plan) {
    let Plan { producer, weights, bias } = plan;
    let w = new_weight(g, &weights.1, weights.0);
    let b = new_weight(g, &bias.1, bias.0);
    let result = match producer {
        Producer::Affine => {
            let ty = g.node(bn).outputs[0].clone();
            let name = g.node(bn).name.clone();
            let x = g.node(bn).inputs[0];
            let node = |op, inputs, ty| Node { op, inputs, outputs: vec![ty], name: name.clone() };
            let scaled = g.add_node(node(Op::Binary(BinaryOp::Mul), vec![x, w], ty.clone()));
            Value::new(g.add_node(node(Op::Binary(BinaryOp::Add), vec![Value::new(scaled, 0), b], ty)), 0)
        }
        Producer::Conv(conv) => {
            g.set_input(conv, 1, w);
            if g.node(conv).inputs.len() == 3 {
                g.set_input(conv, 2, b);
            } else {
                // Adding an operand slot: rebuild the node so its edges mirror its operands.
                let Node { op, mut inputs, outputs, name } = g.node(conv).clone();
                inputs.push(b);
                let new = g.add_node(Node { op, inputs, outputs, name });
                finish(g, bn, Value::new(new, 0));
                g.remove_node(conv);
                return;
            }
            Value::new(conv, 0)
        }
        Producer::MatMul { matmul, add } => {
            g.set_input(matmul, 1, w);
            match add {
                Some(add) => {
                    let slot = usize::from(g.node(add).inputs[0].node == matmul);
                    g.set_input(add, slot, b);
                    Value::new(add, 0)
                }
                None => {
                    let ty = g.node(matmul).outputs[0].clone();
                    let name = g.node(bn).name.clone();
                    let op = Op::Binary(BinaryOp::Add);
                    let add = g.add_node(Node { op, inputs: vec![Value::new(matmul, 0), b], outputs: vec![ty], name });
                    Value::new(add, 0)
                }
            }
        }
    };
    finish(g, bn, result);
}

/// Points the batch norm's uses at `result` and removes it.
fn finish(g: &mut Graph, bn: NodeId, result: Value) {
    g.replace_uses(Value::new(bn, 0), result);
    g.remove_node(bn);
}

/// A `param` over a new weight named after `base` (`<base>.bn_folded`, then `.bn_folded.1`, … until unused), or
/// an inline constant when the value is small and derives only from inline constants.
fn new_weight(g: &mut Graph, base: &str, value: Tensor) -> Value {
    if (base == CONSTANT_BASE || base == CONSTANT_BIAS_BASE) && value.len() <= INLINE_CONSTANT_LIMIT {
        let ty = value.tensor_type();
        let op = Op::Constant(Constant { value });
        return Value::new(g.add_node(Node { op, inputs: vec![], outputs: vec![ty], name: None }), 0);
    }
    let taken = |g: &Graph, n: &str| {
        g.weights.get(n).is_some() || g.params().any(|id| matches!(&g.node(id).op, Op::Parameter(p) if p.name == n))
    };
    let mut name = format!("{base}.bn_folded");
    let mut k = 1;
    while taken(g, &name) {
        name = format!("{base}.bn_folded.{k}");
        k += 1;
    }
    let ty = value.tensor_type();
    g.weights.insert(name.clone(), value);
    let op = Op::Parameter(Parameter { name: name.clone() });
    Value::new(g.add_node(Node { op, inputs: vec![], outputs: vec![ty], name: Some(name) }), 0)
}
