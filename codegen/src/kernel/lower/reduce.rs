//! `reduce` and `arg_reduce`: an accumulator and `Reduction` loops over the reduced axes, opened at the
//! consumer's point and hoisted to the loops the result varies with.
//!
//! Floats accumulate in the compute type (f32 for f16/bf16) and round once; integers wrap; bool `max`/`min` are
//! `or`/`and`. Integer `mean` sums in i64 and divides, truncating toward zero, as the interpreter's exact sum
//! does for i8, u8 and i32; an i64 `mean` (whose sum may not fit) is not lowered. Loops run over the reduced
//! axes in increasing order, innermost last, which is the interpreter's row-major order: results are exact.

use kiln_ir::op::{ArgKind, ArgReduce, BinaryOp, Reduce, ReduceKind};
use kiln_ir::{DType, Value};

use super::super::ir::{AccOp, Expr, IExpr};
use super::{Ctx, Key, LowerError, acc_op, compute_type};

impl Ctx<'_> {
    /// The operand index of a reduction: reduced dims take the loop variables, kept dims the result's index.
    fn reduced_operand_index(
        rank: usize,
        axes: &[usize],
        keep_dims: bool,
        idx: &[IExpr],
        vars: &[IExpr],
    ) -> Vec<IExpr> {
        let mut kept = 0;
        (0..rank)
            .map(|d| match axes.iter().position(|&a| a == d) {
                Some(k) => vars[k].clone(),
                None => {
                    let i = if keep_dims { idx[d].clone() } else { idx[kept].clone() };
                    kept += 1;
                    i
                }
            })
            .collect()
    }

    /// The deepest loop any of `idx` reads.
    pub(super) fn index_depth(&self, idx: &[IExpr]) -> usize {
        idx.iter().map(|i| self.iexpr_depth(i)).max().unwrap_or(0)
    }

    pub(super) fn reduce(&mut self, v: Value, r: &Reduce, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let x = self.graph.node(v.node).inputs[0];
        let shape = self.shape(x)?;
        let rank = shape.rank();
        let axes = kiln_ir::infer::normalize_axes(&r.axes, rank).map_err(|m| self.node_err(v.node, m))?;
        let dtype = self.dtype(x)?;
        let int_mean = r.kind == ReduceKind::Mean && dtype.is_int();
        if int_mean && dtype == DType::I64 {
            return Err(self.node_err(v.node, "an i64 mean is not lowered: its sum may not fit in i64"));
        }
        let acc_dtype = if int_mean { DType::I64 } else { compute_type(dtype) };
        let extents: Vec<IExpr> = axes.iter().map(|&a| self.dim(&shape.0[a])).collect();
        let count = {
            let dims: Vec<_> = axes.iter().map(|&a| shape.0[a].clone()).collect();
            self.dims_product(&dims)
        };
        let key = Key::Internal(v.node, 0, idx.to_vec());
        let depth = self.index_depth(idx);
        let keep = r.keep_dims;
        let acc = self.reduction(key, depth, acc_dtype, acc_op(r.kind), extents, |cx, vars| {
            let own = Ctx::reduced_operand_index(rank, &axes, keep, idx, vars);
            let e = cx.value_at(x, &own)?;
            Ok((Expr::cast(e, dtype, acc_dtype), None))
        })?;
        let result = match r.kind {
            ReduceKind::Mean if int_mean => Expr::binary(BinaryOp::Div, acc, Expr::index(count, DType::I64)),
            ReduceKind::Mean => {
                let n = Expr::cast(Expr::index(count, DType::F64), DType::F64, acc_dtype);
                Expr::binary(BinaryOp::Div, acc, n)
            }
            _ => acc,
        };
        Ok(Expr::cast(result, acc_dtype, dtype))
    }

    pub(super) fn arg_reduce(&mut self, v: Value, r: &ArgReduce, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let x = self.graph.node(v.node).inputs[0];
        let shape = self.shape(x)?;
        let rank = shape.rank();
        let axis = kiln_ir::types::normalize_axis(r.axis, rank).map_err(|m| self.node_err(v.node, m))?;
        let dtype = self.dtype(x)?;
        let op = match r.kind {
            ArgKind::Max => AccOp::ArgMax { select_last: r.select_last_index },
            ArgKind::Min => AccOp::ArgMin { select_last: r.select_last_index },
        };
        let extent = self.dim(&shape.0[axis]);
        let key = Key::Internal(v.node, 0, idx.to_vec());
        let depth = self.index_depth(idx);
        let keep = r.keep_dims;
        self.reduction(key, depth, dtype, op, vec![extent], |cx, vars| {
            let own = Ctx::reduced_operand_index(rank, &[axis], keep, idx, vars);
            Ok((cx.value_at(x, &own)?, Some(vars[0].clone())))
        })
    }
}
