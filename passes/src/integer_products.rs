//! `integer-products`: a `matmul` or `conv` of two dequantized 8-bit operands — what static (QDQ) quantizers
//! emit, a DequantizeLinear on each side of a MatMul, Gemm or Conv — becomes the integer product scaled once:
//!
//! `matmul((qa - za) · sa, (qb - zb) · sb)` → `f32(matmul_integer(qa, qb, za, zb)) · (sa · sb)`
//! `conv((qx - zx) · sx, (qw - zw) · sw, bias)` → `f32(conv_integer(qx, qw, zx, zw)) · (sx · sw) + bias`
//!
//! so the product runs on the library's integer GEMM or conv (u8/i8 operands, exact i32 accumulation, AVX-512
//! VNNI where the CPU has it; the 8-bit weights packed at load, a quarter of the f32 weights' bytes) instead of
//! an f32 GEMM or conv over weights dequantized at load. ONNX Runtime computes QDQ models the same way.
//!
//! A dequantized operand is the import's DequantizeLinear: `mul(cast<f32>(sub(cast<i32>(q), z)), s)` (the `sub`
//! absent without a zero point, the `mul`'s operands in either order), `q` u8 or i8. Conditions:
//! - the left operand's (the conv's input's) zero point is a scalar `constant` and its scale a scalar (`[]` or
//!   `[1]`): one value for the tensor;
//! - a matmul's `b` is rank 2 (`[K, N]`), or the `[1, 0]` transpose of a rank-2 dequantized value (a Gemm with
//!   `transB`); its zero point a `constant` and its scale a value, each either one value or one per column of `b`
//!   (per output channel, as per-channel weight quantization gives): the correction and the scale then apply per
//!   column after the product;
//! - a conv's weights `[M, C/groups, k…]` have a zero point and a scale of one value or one per output channel
//!   (`[M]` or `[M, 1, …]`, as a per-axis DequantizeLinear on axis 0 gives); the bias, if any, is added after
//!   the scaling, per output channel;
//! - the zero points fit their operand's type, and `K · 255² < 2³¹` (`K` the contraction length: `C/groups`
//!   times the window for a conv), so the i32 accumulation is exact;
//! - f32 result.
//!
//! The integer sum is exact, so the rewritten product is at least as accurate as the f32 one: the results differ
//! by the f32 rounding of the original accumulation (within a few ulps times `K`, relative to the terms). The
//! dequantize nodes are left to `dce` when nothing else uses them.

use kiln_ir::op::{BinaryOp, Cast, Conv, Reshape, Transpose};
use kiln_ir::{DType, Dim, Graph, NodeId, Op, Shape, Value};

use crate::declare_pass;
use crate::pass::{Pass, PassContext, PassError};
use crate::rewrite::Rewriter;

declare_pass! {
    /// Rewrites a matmul or conv of two dequantized 8-bit operands (static QDQ) into an integer product scaled
    /// once.
    #[derive(Clone, Debug, Default)]
    pub struct IntegerProducts = "integer-products";
}

impl Pass for IntegerProducts {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, _: &PassContext) -> Result<bool, PassError> {
        let products: Vec<NodeId> =
            g.node_ids().filter(|&id| matches!(g.node(id).op, Op::MatMul | Op::Conv(_))).collect();
        let mut changed = false;
        for id in products {
            let plan = match &g.node(id).op {
                Op::Conv(c) => plan_conv(g, id, c.clone()),
                _ => plan(g, id),
            };
            if let Some(plan) = plan {
                changed |= apply(g, id, plan);
            }
        }
        Ok(changed)
    }
}

/// A dequantized operand: `(q - zero) · scale`.
struct Dequantized {
    /// The 8-bit tensor.
    q: Value,
    /// The zero point's dims and values (as integers); `None` when there is none (zero).
    zero: Option<(Vec<u64>, Vec<i64>)>,
    /// The scale.
    scale: Value,
}

impl Dequantized {
    /// The zero point's values (`[0]` when there is none).
    fn zero_values(&self) -> Vec<i64> {
        self.zero.as_ref().map_or_else(|| vec![0], |(_, v)| v.clone())
    }
}

/// A rewrite worked out before the graph is touched.
struct Plan {
    a: Dequantized,
    b: Dequantized,
    /// The product: a matmul (its `b` maybe the transpose of the dequantized value) or a conv.
    kind: Kind,
    /// The number of columns of `b` (a conv's output channels).
    columns: u64,
}

enum Kind {
    MatMul {
        transposed: bool,
    },
    /// A conv with its attributes, its bias and the rank of its result.
    Conv {
        attrs: Conv,
        bias: Option<Value>,
        rank: usize,
    },
}

/// The dims and values of a non-float `constant` node's result.
fn constant_ints(g: &Graph, v: Value) -> Option<(Vec<u64>, Vec<i64>)> {
    match &g.node(v.node).op {
        Op::Constant(c) if !c.value.dtype().is_float() => {
            let dims = c.value.shape().iter().map(|&d| d as u64).collect();
            Some((dims, c.value.to_f64_vec().into_iter().map(|x| x as i64).collect()))
        }
        _ => None,
    }
}

/// `v` as the import's DequantizeLinear of an 8-bit tensor.
fn dequantized(g: &Graph, v: Value) -> Option<Dequantized> {
    let node = g.node(v.node);
    let (Op::Binary(BinaryOp::Mul), [x, y]) = (&node.op, node.inputs.as_slice()) else { return None };
    let as_f32 = |c: Value| match &g.node(c.node).op {
        Op::Cast(Cast { to: DType::F32 }) => Some(g.node(c.node).inputs[0]),
        _ => None,
    };
    let (diff, scale) = match (as_f32(*x), as_f32(*y)) {
        (Some(d), None) => (d, *y),
        (None, Some(d)) => (d, *x),
        _ => return None,
    };
    if g.value_type(scale)?.dtype != DType::F32 || g.value_type(diff)?.dtype != DType::I32 {
        return None;
    }
    let widened = |c: Value| match &g.node(c.node).op {
        Op::Cast(Cast { to: DType::I32 }) => {
            let q = g.node(c.node).inputs[0];
            matches!(g.value_type(q)?.dtype, DType::U8 | DType::I8).then_some(q)
        }
        _ => None,
    };
    let (q, zero) = match widened(diff) {
        Some(q) => (q, None),
        None => {
            let d = g.node(diff.node);
            let (Op::Binary(BinaryOp::Sub), [w, z]) = (&d.op, d.inputs.as_slice()) else { return None };
            (widened(*w)?, Some(constant_ints(g, *z)?))
        }
    };
    let (lo, hi) = if g.value_type(q)?.dtype == DType::U8 { (0, 255) } else { (-128, 127) };
    let fits = zero.as_ref().is_none_or(|(_, vs)| vs.iter().all(|z| (lo..=hi).contains(z)));
    fits.then_some(Dequantized { q, zero, scale })
}

/// The static dims of `v`.
fn dims(g: &Graph, v: Value) -> Option<Vec<u64>> {
    Some(g.value_type(v)?.shape.as_static()?.into_iter().map(|d| d as u64).collect())
}

/// Whether a parameter of dims `d` holds one value, or one per column of a `[rows, columns]` operand that
/// broadcasts along its rows (per row of the dequantized value when `transposed`: the operand is its transpose).
fn per_column(d: &[u64], columns: u64, transposed: bool) -> bool {
    if d.iter().product::<u64>() == 1 {
        return d.len() <= 2;
    }
    match d {
        [c] => *c == columns && !transposed,
        [r, c] => (if transposed { (*r, *c) } else { (*c, *r) }) == (columns, 1),
        _ => false,
    }
}

/// The left operand (a matmul's `a`, a conv's input) dequantized with one scale and zero point for the tensor.
fn per_tensor(g: &Graph, v: Value) -> Option<Dequantized> {
    let a = dequantized(g, v)?;
    let one_value = |d: &[u64]| d.len() <= 1 && d.iter().product::<u64>() == 1;
    (one_value(&dims(g, a.scale)?) && a.zero.as_ref().is_none_or(|(d, _)| one_value(d))).then_some(a)
}

/// Whether `K` terms of two shifted 8-bit values (each product at most 255² in magnitude) sum exactly in i32.
fn exact_sum(k: u64) -> bool {
    k.checked_mul(255 * 255).is_some_and(|m| m < 1 << 31)
}

fn plan_conv(g: &Graph, id: NodeId, attrs: Conv) -> Option<Plan> {
    let node = g.node(id);
    let (x, w, bias) = match node.inputs.as_slice() {
        [x, w] => (*x, *w, None),
        [x, w, b] => (*x, *w, Some(*b)),
        _ => return None,
    };
    let rank = node.outputs.first().filter(|t| t.dtype == DType::F32)?.shape.0.len();
    let a = per_tensor(g, x)?;
    let b = dequantized(g, w)?;
    let wd = dims(g, b.q)?;
    let (&m, k) = (wd.first()?, wd[1..].iter().product::<u64>());
    // One value, or one per output channel along the weights' first axis.
    let per_channel = |d: &[u64]| {
        let n: u64 = d.iter().product();
        n == 1 && d.len() <= wd.len() || d.first() == Some(&m) && n == m && d.len() <= wd.len()
    };
    let ok = wd.len() >= 3
        && exact_sum(k)
        && b.zero.as_ref().is_none_or(|(d, _)| per_channel(d))
        && per_channel(&dims(g, b.scale)?)
        && bias.is_none_or(|v| dims(g, v).is_some_and(|d| d == [m]));
    ok.then_some(Plan { a, b, kind: Kind::Conv { attrs, bias, rank }, columns: m })
}

fn plan(g: &Graph, id: NodeId) -> Option<Plan> {
    let node = g.node(id);
    let [a, b] = node.inputs.as_slice() else { return None };
    if node.outputs.first()?.dtype != DType::F32 {
        return None;
    }
    let a = per_tensor(g, *a)?;
    let (b, transposed) = match (&g.node(b.node).op, dequantized(g, *b)) {
        (_, Some(d)) => (d, false),
        (Op::Transpose(Transpose { perm }), None) if perm == &[1, 0] => {
            (dequantized(g, g.node(b.node).inputs[0])?, true)
        }
        _ => return None,
    };
    let [rows, cols] = dims(g, b.q)?[..] else { return None };
    let (k, columns) = if transposed { (cols, rows) } else { (rows, cols) };
    let zero_ok = b.zero.as_ref().is_none_or(|(d, _)| per_column(d, columns, transposed));
    (exact_sum(k) && zero_ok && per_column(&dims(g, b.scale)?, columns, transposed)).then_some(Plan {
        a,
        b,
        kind: Kind::MatMul { transposed },
        columns,
    })
}

/// The rewrite's own node builders on top of the shared [`Rewriter`].
impl Rewriter<'_> {
    /// `v` as a scalar or, holding `columns` values, shaped `[columns]` followed by `ones` 1s (a matmul's
    /// per-column vector, or a conv's per-channel `[M, 1, …]` that broadcasts over the spatial dims).
    fn column_vector(&mut self, v: Value, columns: u64, ones: usize) -> Option<Value> {
        let d = dims(self.g, v)?;
        let n: u64 = d.iter().product();
        let shape = if n == 1 {
            vec![]
        } else {
            std::iter::once(columns).chain(std::iter::repeat_n(1, ones)).map(Dim::Static).collect()
        };
        if d.iter().copied().eq(shape.iter().map(|s| s.as_static().unwrap_or(0))) {
            return Some(v);
        }
        self.op(Op::Reshape(Reshape { shape: Shape(shape) }), &[v])
    }

    fn rewrite(&mut self, p: &Plan) -> Option<Value> {
        let dtype = |e: &Self, v: Value| e.g.value_type(v).map(|t| t.dtype);
        let za = self.ints(dtype(self, p.a.q)?, &p.a.zero_values())?;
        let zb = self.ints(dtype(self, p.b.q)?, &p.b.zero_values())?;
        let (product, ones) = match &p.kind {
            Kind::MatMul { transposed } => {
                let qb =
                    if *transposed { self.op(Op::Transpose(Transpose { perm: vec![1, 0] }), &[p.b.q])? } else { p.b.q };
                (self.op(Op::MatMulInteger, &[p.a.q, qb, za, zb])?, 0)
            }
            Kind::Conv { attrs, rank, .. } => {
                (self.op(Op::ConvInteger(attrs.clone()), &[p.a.q, p.b.q, za, zb])?, rank.checked_sub(2)?)
            }
        };
        let product = self.op(Op::Cast(Cast { to: DType::F32 }), &[product])?;
        let sa = self.column_vector(p.a.scale, 1, 0)?;
        let sb = self.column_vector(p.b.scale, p.columns, ones)?;
        let scale = self.op(Op::Binary(BinaryOp::Mul), &[sa, sb])?;
        let y = self.op(Op::Binary(BinaryOp::Mul), &[product, scale])?;
        match &p.kind {
            Kind::Conv { bias: Some(b), .. } => {
                let b = self.column_vector(*b, p.columns, ones)?;
                self.op(Op::Binary(BinaryOp::Add), &[y, b])
            }
            _ => Some(y),
        }
    }
}

fn apply(g: &mut Graph, id: NodeId, p: Plan) -> bool {
    let mut e = Rewriter::of(g, id);
    let y = e.rewrite(&p);
    e.finish(id, y)
}
