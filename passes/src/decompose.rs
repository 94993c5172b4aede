//! `decompose`: lowers composite ops to elementwise and reduce primitives, for targets without kernels for them.
//!
//! Each expansion performs the interpreter's arithmetic in the interpreter's order, in the op's dtype, so for
//! f32 and f64 the result is the same up to the order of the reduction's additions (the interpreter sums along
//! the axis in index order; a `reduce` kernel may sum in another order, within a few ulps times the row length).
//! f16 and bf16 round every intermediate to the dtype where the interpreter's kernel keeps a wider one, so they
//! match within the dtype's precision (about 1e-2 relative), not bit for bit. The expansions (`x` is the operand,
//! reductions keep their dims so they broadcast back):
//!
//! | op | expansion |
//! | --- | --- |
//! | `softmax(x, a)` | `d = x - reduce_max(x, a)`; `exp(d) / reduce_sum(exp(d), a)` |
//! | `log_softmax(x, a)` | `d - log(reduce_sum(exp(d), a))` |
//! | `layer_norm(x, s[, b], a)` over dims `a..` of `n` elements | `m = reduce_sum(x)/n`; `d = x - m`; `v = reduce_sum(d*d)/n`; `d * (1/sqrt(v + eps)) * s [+ b]` |
//! | `batch_norm(x, s, b, m, v)` | with each `[C]` operand reshaped to `[C, 1, …]`: `(x - m) / sqrt(v + eps) * s + b` |
//! | `gelu(x)` exact | `0.5*x * (1 + erf(x / √2))` |
//! | `gelu(x)` tanh | `0.5*x * (1 + tanh(√(2/π) * (x + 0.044715*x*x*x)))` |
//!
//! A `layer_norm` without bias skips the interpreter's `+ 0.0`, so a `-0.0` result stays `-0.0` where the
//! interpreter gives `+0.0` (equal as numbers). Ops other than `gelu` on a scalar operand, on non-float dtypes, or whose operand
//! shapes the expansion cannot reproduce (a `batch_norm` parameter that is not `[C]`) are left alone. The option
//! `ops` chooses which ops to expand (`ops=softmax+gelu`; default: all of `softmax`, `log_softmax`, `layer_norm`,
//! `batch_norm`, `gelu`).

use std::str::FromStr;

use kiln_ir::op::{BinaryOp, GeluApprox, ReduceKind, Reshape, UnaryOp};
use kiln_ir::types::normalize_axis;
use kiln_ir::{Graph, NodeId, Op, Shape, Value};

use crate::declare_pass;
use crate::pass::{FromOptions, OptionDoc, OptionError, Pass, PassContext, PassError, PassOptions};
use crate::rewrite::Rewriter;

/// The ops `decompose` can expand, by mnemonic, in the order docs list them.
pub const COMPOSITE_OPS: &[&str] = &["softmax", "log_softmax", "layer_norm", "batch_norm", "gelu"];

declare_pass! {
    /// Expands softmax, log_softmax, layer_norm, batch_norm and gelu into elementwise and reduce ops.
    #[derive(Clone, Debug)]
    pub struct Decompose = "decompose" {
        /// Which composite ops to expand.
        pub ops: OpSet,
    }
}

impl Default for Decompose {
    fn default() -> Decompose {
        Decompose { ops: OpSet(COMPOSITE_OPS.to_vec()) }
    }
}

/// A set of composite op mnemonics, written `a+b+c`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpSet(pub Vec<&'static str>);

impl FromStr for OpSet {
    type Err = String;

    fn from_str(s: &str) -> Result<OpSet, String> {
        let mut ops = Vec::new();
        for name in s.split('+') {
            match COMPOSITE_OPS.iter().find(|&&k| k == name) {
                Some(&k) if !ops.contains(&k) => ops.push(k),
                Some(_) => {}
                None => {
                    return Err(format!(
                        "`{name}` is not a composite op (expected any of {})",
                        COMPOSITE_OPS.join(", ")
                    ));
                }
            }
        }
        Ok(OpSet(ops))
    }
}

impl FromOptions for Decompose {
    const OPTIONS: &'static [OptionDoc] = &[OptionDoc {
        name: "ops",
        value: "OP+OP…",
        summary: "the ops to expand, `+`-separated (default: softmax+log_softmax+layer_norm+batch_norm+gelu)",
    }];

    fn from_options(options: &mut PassOptions<'_>) -> Result<Decompose, OptionError> {
        Ok(options.take::<OpSet>("ops")?.map_or_else(Decompose::default, |ops| Decompose { ops }))
    }
}

impl Pass for Decompose {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> Result<bool, PassError> {
        let targets: Vec<NodeId> = g
            .node_ids()
            .filter(|&id| {
                let m = g.node(id).op.mnemonic();
                self.ops.0.contains(&m) && !cx.placed_elsewhere.contains(m)
            })
            .collect();
        let mut changed = false;
        for id in targets {
            let mut e = Rewriter::of(&mut *g, id);
            let result = expand(&mut e, id);
            changed |= e.finish(id, result);
        }
        Ok(changed)
    }
}

/// The expansion's result, or `None` when the op is left alone.
fn expand(e: &mut Rewriter<'_>, id: NodeId) -> Option<Value> {
    let node = e.g.node(id).clone();
    let ty = node.outputs.first()?.clone();
    let dtype = ty.dtype;
    let rank = ty.shape.rank();
    // Gelu is elementwise; the others need an axis to reduce over.
    if !dtype.is_float() || (rank == 0 && !matches!(node.op, Op::Gelu(_))) {
        return None;
    }
    let x = *node.inputs.first()?;
    match &node.op {
        Op::Softmax(s) | Op::LogSoftmax(s) => {
            let axis = vec![normalize_axis(s.axis, rank).ok()? as i64];
            let max = e.reduce(ReduceKind::Max, x, axis.clone())?;
            let d = e.binary(BinaryOp::Sub, x, max)?;
            let exp = e.unary(UnaryOp::Exp, d)?;
            let sum = e.reduce(ReduceKind::Sum, exp, axis)?;
            if matches!(node.op, Op::Softmax(_)) {
                e.binary(BinaryOp::Div, exp, sum)
            } else {
                let log = e.unary(UnaryOp::Log, sum)?;
                e.binary(BinaryOp::Sub, d, log)
            }
        }
        Op::LayerNorm(l) => {
            let axis = normalize_axis(l.axis, rank).ok()?;
            let axes: Vec<i64> = (axis..rank).map(|a| a as i64).collect();
            let n = ty.shape.dims()[axis..].iter().map(|d| d.as_static()).product::<Option<u64>>()?;
            let n = e.scalar(dtype, n as f64)?;
            let sum = e.reduce(ReduceKind::Sum, x, axes.clone())?;
            let mean = e.binary(BinaryOp::Div, sum, n)?;
            let d = e.binary(BinaryOp::Sub, x, mean)?;
            let sq = e.binary(BinaryOp::Mul, d, d)?;
            let sq_sum = e.reduce(ReduceKind::Sum, sq, axes)?;
            let var = e.binary(BinaryOp::Div, sq_sum, n)?;
            let eps = e.scalar(dtype, l.epsilon)?;
            let var_eps = e.binary(BinaryOp::Add, var, eps)?;
            let std = e.unary(UnaryOp::Sqrt, var_eps)?;
            let one = e.scalar(dtype, 1.0)?;
            let inv_std = e.binary(BinaryOp::Div, one, std)?;
            let normed = e.binary(BinaryOp::Mul, d, inv_std)?;
            let scaled = e.binary(BinaryOp::Mul, normed, *node.inputs.get(1)?)?;
            let out = match node.inputs.get(2) {
                Some(&b) => e.binary(BinaryOp::Add, scaled, b)?,
                None => scaled,
            };
            (e.g.value_type(out)? == &ty).then_some(out)
        }
        Op::BatchNorm(b) => {
            let [_, scale, bias, mean, var] = node.inputs.as_slice() else { return None };
            if rank < 2 {
                return None;
            }
            let channels = ty.shape.dims().get(1)?.clone();
            // `[C]` → `[C, 1, …]` so that it lines up with dim 1 of `x[N, C, …]`.
            let mut dims = vec![channels.clone()];
            dims.extend(std::iter::repeat_n(kiln_ir::Dim::Static(1), rank - 2));
            let target = Shape(dims);
            let mut per_channel = |v: Value| -> Option<Value> {
                let t = e.g.value_type(v)?;
                if t.shape.dims() != std::slice::from_ref(&channels) || t.dtype != dtype {
                    return None;
                }
                e.op(Op::Reshape(Reshape { shape: target.clone() }), &[v])
            };
            let (scale, bias, mean, var) =
                (per_channel(*scale)?, per_channel(*bias)?, per_channel(*mean)?, per_channel(*var)?);
            let eps = e.scalar(dtype, b.epsilon)?;
            let var_eps = e.binary(BinaryOp::Add, var, eps)?;
            let std = e.unary(UnaryOp::Sqrt, var_eps)?;
            let d = e.binary(BinaryOp::Sub, x, mean)?;
            let q = e.binary(BinaryOp::Div, d, std)?;
            let scaled = e.binary(BinaryOp::Mul, q, scale)?;
            let out = e.binary(BinaryOp::Add, scaled, bias)?;
            (e.g.value_type(out)? == &ty).then_some(out)
        }
        Op::Gelu(gelu) => {
            let half = e.scalar(dtype, 0.5)?;
            let one = e.scalar(dtype, 1.0)?;
            let half_x = e.binary(BinaryOp::Mul, half, x)?;
            let inner = match gelu.approximate {
                GeluApprox::None => {
                    let inv_sqrt2 = e.scalar(dtype, std::f64::consts::FRAC_1_SQRT_2)?;
                    let t = e.binary(BinaryOp::Mul, x, inv_sqrt2)?;
                    e.unary(UnaryOp::Erf, t)?
                }
                GeluApprox::Tanh => {
                    let k = e.scalar(dtype, 0.044715)?;
                    let c = e.scalar(dtype, (2.0 / std::f64::consts::PI).sqrt())?;
                    let kx = e.binary(BinaryOp::Mul, k, x)?;
                    let kx2 = e.binary(BinaryOp::Mul, kx, x)?;
                    let kx3 = e.binary(BinaryOp::Mul, kx2, x)?;
                    let sum = e.binary(BinaryOp::Add, x, kx3)?;
                    let arg = e.binary(BinaryOp::Mul, c, sum)?;
                    e.unary(UnaryOp::Tanh, arg)?
                }
            };
            let factor = e.binary(BinaryOp::Add, one, inner)?;
            e.binary(BinaryOp::Mul, half_x, factor)
        }
        _ => None,
    }
}
