//! Normalizations and activations built from reductions and elementwise math: softmax, log_softmax,
//! layer_norm, batch_norm and gelu.
//!
//! Each follows the interpreter's formula operation for operation, in the compute type (f32 for f16/bf16), so
//! results are exact: softmax is a max reduction, a sum of `exp(x - max)`, then `exp(x - max) / sum` (or
//! `x - max - log(sum)`); layer_norm is a sum, `mean = sum / n`, a sum of `(x - mean)²`, then
//! `(x - mean) * (1 / sqrt(sq / n + eps)) * scale + bias`. The statistics are memoized per row, so each is
//! computed once per row, in the row loop, before the loop over the row's elements.

use kiln_ir::interp::scalar::Scalar;
use kiln_ir::op::{BinaryOp, GeluApprox, LayerNorm, UnaryOp};
use kiln_ir::types::normalize_axis;
use kiln_ir::{DType, Shape, Value};

use super::super::ir::{AccOp, Expr, IExpr};
use super::{Ctx, Key, LowerError, compute_type};

fn bin(k: BinaryOp, a: Expr, b: Expr) -> Expr {
    Expr::binary(k, a, b)
}

impl Ctx<'_> {
    /// The float compute type of `x`, or an error if it is not a float.
    fn float_compute(&self, v: Value, x: Value) -> Result<(DType, DType), LowerError> {
        let dtype = self.dtype(x)?;
        if !dtype.is_float() {
            return Err(self.node_err(v.node, format!("needs a float operand, got {dtype}")));
        }
        Ok((dtype, compute_type(dtype)))
    }

    /// `x` at `idx`, in the compute type.
    fn load_compute(&mut self, x: Value, idx: &[IExpr], c: DType) -> Result<Expr, LowerError> {
        let dtype = self.dtype(x)?;
        Ok(Expr::cast(self.value_at(x, idx)?, dtype, c))
    }

    pub(super) fn softmax(&mut self, v: Value, axis: i64, log: bool, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let x = self.graph.node(v.node).inputs[0];
        let (dtype, c) = self.float_compute(v, x)?;
        let shape = self.shape(x)?;
        // A scalar is a row of one.
        let (row, extent, axis) = if shape.rank() == 0 {
            (Vec::new(), IExpr::Const(1), None)
        } else {
            let a = normalize_axis(axis, shape.rank()).map_err(|m| self.node_err(v.node, m))?;
            let mut row = idx.to_vec();
            row.remove(a);
            (row, self.dim(&shape.0[a]), Some(a))
        };
        let at = |k: &IExpr| -> Vec<IExpr> {
            let mut own = idx.to_vec();
            if let Some(a) = axis {
                own[a] = k.clone();
            }
            own
        };
        let depth = self.index_depth(&row);
        let max = self.reduction(
            Key::Internal(v.node, 0, row.clone()),
            depth,
            c,
            AccOp::Max,
            vec![extent.clone()],
            |cx, vars| Ok((cx.load_compute(x, &at(&vars[0]), c)?, None)),
        )?;
        let sum =
            self.reduction(Key::Internal(v.node, 1, row.clone()), depth, c, AccOp::Sum, vec![extent], |cx, vars| {
                let e = cx.load_compute(x, &at(&vars[0]), c)?;
                Ok((Expr::unary(UnaryOp::Exp, bin(BinaryOp::Sub, e, max.clone())), None))
            })?;
        let d = bin(BinaryOp::Sub, self.load_compute(x, idx, c)?, max);
        let y = if log {
            let log_sum = self.bind(Key::Internal(v.node, 2, row), Expr::unary(UnaryOp::Log, sum), c);
            bin(BinaryOp::Sub, d, log_sum)
        } else {
            bin(BinaryOp::Div, Expr::unary(UnaryOp::Exp, d), sum)
        };
        Ok(Expr::cast(y, c, dtype))
    }

    pub(super) fn layer_norm(&mut self, v: Value, l: &LayerNorm, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let ins = self.graph.node(v.node).inputs.clone();
        let x = ins[0];
        let (dtype, c) = self.float_compute(v, x)?;
        let shape = self.shape(x)?;
        let a = normalize_axis(l.axis, shape.rank()).map_err(|m| self.node_err(v.node, m))?;
        let norm = Shape(shape.0[a..].to_vec());
        let row = idx[..a].to_vec();
        let extents: Vec<IExpr> = norm.0.iter().map(|d| self.dim(d)).collect();
        let count = self.dims_product(&norm.0);
        let n = Expr::cast(Expr::index(count, DType::F64), DType::F64, c);
        let depth = self.index_depth(&row);
        let at = |vars: &[IExpr]| -> Vec<IExpr> { row.iter().chain(vars).cloned().collect() };
        let sum = self.reduction(
            Key::Internal(v.node, 0, row.clone()),
            depth,
            c,
            AccOp::Sum,
            extents.clone(),
            |cx, vars| Ok((cx.load_compute(x, &at(vars), c)?, None)),
        )?;
        let mean = self.bind(Key::Internal(v.node, 1, row.clone()), bin(BinaryOp::Div, sum, n.clone()), c);
        let sq = self.reduction(Key::Internal(v.node, 2, row.clone()), depth, c, AccOp::Sum, extents, |cx, vars| {
            let own = at(vars);
            let e = cx.load_compute(x, &own, c)?;
            let d = cx.bind(Key::Internal(v.node, 4, own), bin(BinaryOp::Sub, e, mean.clone()), c);
            Ok((bin(BinaryOp::Mul, d.clone(), d), None))
        })?;
        let eps = Expr::Const(Scalar::from_f64(c, l.epsilon));
        let var = bin(BinaryOp::Add, bin(BinaryOp::Div, sq, n), eps);
        let one = Expr::Const(Scalar::from_f64(c, 1.0));
        let inv_std = bin(BinaryOp::Div, one, Expr::unary(UnaryOp::Sqrt, var));
        let inv_std = self.bind(Key::Internal(v.node, 3, row), inv_std, c);
        let centered = bin(BinaryOp::Sub, self.load_compute(x, idx, c)?, mean);
        let scale = self.broadcast_operand(ins[1], &idx[a..], &norm)?;
        let scale = Expr::cast(scale, self.dtype(ins[1])?, c);
        let bias = match ins.get(2) {
            Some(&b) => {
                let e = self.broadcast_operand(b, &idx[a..], &norm)?;
                Expr::cast(e, self.dtype(b)?, c)
            }
            // The interpreter adds a zero bias, which turns -0 into +0; so does this.
            None => Expr::Const(Scalar::from_f64(c, 0.0)),
        };
        let y = bin(BinaryOp::Add, bin(BinaryOp::Mul, bin(BinaryOp::Mul, centered, inv_std), scale), bias);
        Ok(Expr::cast(y, c, dtype))
    }

    /// `(x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c]` over channel dim 1.
    pub(super) fn batch_norm(&mut self, v: Value, epsilon: f64, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let ins = self.graph.node(v.node).inputs.clone();
        let (dtype, c) = self.float_compute(v, ins[0])?;
        if idx.len() < 2 {
            return Err(self.node_err(v.node, "needs an operand of rank 2 or more"));
        }
        let ch = [idx[1].clone()];
        let scale = self.load_compute(ins[1], &ch, c)?;
        let bias = self.load_compute(ins[2], &ch, c)?;
        let mean = self.load_compute(ins[3], &ch, c)?;
        let var = self.load_compute(ins[4], &ch, c)?;
        let eps = Expr::Const(Scalar::from_f64(c, epsilon));
        let std = Expr::unary(UnaryOp::Sqrt, bin(BinaryOp::Add, var, eps));
        let std = self.bind(Key::Internal(v.node, 0, ch.to_vec()), std, c);
        let x = self.load_compute(ins[0], idx, c)?;
        let y =
            bin(BinaryOp::Add, bin(BinaryOp::Mul, bin(BinaryOp::Div, bin(BinaryOp::Sub, x, mean), std), scale), bias);
        Ok(Expr::cast(y, c, dtype))
    }

    /// GELU, exact (erf) or tanh-approximated, in the compute type.
    pub(super) fn gelu(&mut self, v: Value, approx: GeluApprox, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let x = self.graph.node(v.node).inputs[0];
        let (dtype, c) = self.float_compute(v, x)?;
        let k = |f: f64| Expr::Const(Scalar::from_f64(c, f));
        let e = self.load_compute(x, idx, c)?;
        let x = self.bind(Key::Internal(v.node, 0, idx.to_vec()), e, c);
        let half_x = bin(BinaryOp::Mul, k(0.5), x.clone());
        let inner = match approx {
            GeluApprox::None => Expr::unary(UnaryOp::Erf, bin(BinaryOp::Mul, x, k(std::f64::consts::FRAC_1_SQRT_2))),
            GeluApprox::Tanh => {
                let cube = bin(
                    BinaryOp::Mul,
                    bin(BinaryOp::Mul, bin(BinaryOp::Mul, k(0.044715), x.clone()), x.clone()),
                    x.clone(),
                );
                let arg = bin(BinaryOp::Mul, k((2.0 / std::f64::consts::PI).sqrt()), bin(BinaryOp::Add, x, cube));
                Expr::unary(UnaryOp::Tanh, arg)
            }
        };
        let y = bin(BinaryOp::Mul, half_x, bin(BinaryOp::Add, k(1.0), inner));
        Ok(Expr::cast(y, c, dtype))
    }
}
