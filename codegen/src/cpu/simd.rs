//! The f32x4 form of an innermost vectorizable or reduction loop.
//!
//! A vectorizable loop qualifies when every statement is an f32 `Let` or a store into an f32 buffer, and every
//! value is built from f32 constants, f32 loads, i32 loads cast to f32 (an integer product's result being
//! scaled), f32 variables and accumulators, float unary and arithmetic binary kinds, and selects whose
//! condition is an f32 comparison; anything else (other dtypes, other casts, index values, bool variables)
//! keeps the whole loop scalar. Four consecutive iterations run as four lanes; the
//! iterations left over run through the scalar loop.
//!
//! A reduction loop qualifies the same way when every statement is an f32 `Let` or an `Update` of an f32
//! `Sum`, `Prod`, `Max` or `Min` accumulator, and no value reads an accumulator the loop folds into (that value
//! would depend on the previous lane's fold). Only the values are vector code: the four lanes are then folded
//! into each accumulator one at a time, lane 0 to 3, by the same scalar step the scalar loop uses, so the
//! folding order — and every rounding in it — is the interpreter's, and results differ from the scalar loop
//! only where an inline approximation below replaces a runtime call. Arg accumulators, other dtypes and
//! bodies with stores keep the loop scalar.
//!
//! Memory: an index affine in the loop variable with coefficient 1 is one vector load or store, coefficient 0
//! is one scalar load splat to all lanes, anything else goes lane by lane (a gather or scatter of four scalar
//! accesses, each index computed for its own iteration). An indirect index ([`IExpr::Read`]) at an index
//! invariant in the loop variable is itself invariant, so `table[row·n + j]` over `j` stays one vector load; a
//! read whose index moves with the loop variable makes the access not affine, so it goes lane by lane, each
//! lane reading its own index (correct without a vector gather instruction). Arithmetic, `min`/`max`
//! (NaN-propagating, as the interpreter), `sqrt`, `abs`, `neg`, `relu`, `sign`, comparisons and selects are
//! vector instructions, as are `floor`/`ceil`/`round` where the target has SSE4.1; `exp`, `log`, `tanh`,
//! `sigmoid` and `erf` are inline approximations (`vmath`, same SSE4.1 condition); every other kind computes
//! lane by lane through the same scalar code (and runtime functions) the scalar loop uses, bit-identical to it.
//! `pow` by the constant 2, 3 or 4 is repeated multiplication in both forms (see `Expr::small_power`).

use std::collections::{HashMap, HashSet};

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value, types};
use kiln_ir::DType;
use kiln_ir::interp::scalar::Scalar;
use kiln_ir::op::{BinaryOp, UnaryOp};

use super::emit::{EResult, Emitter, mem};
use crate::kernel::{AccOp, AccVar, ArgId, Block, Expr, IExpr, LoopVar, Stmt, Var};

/// Lanes per vector.
pub(crate) const LANES: i64 = 4;

fn vector_unary(k: UnaryOp) -> bool {
    !matches!(k, UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::Not | UnaryOp::BitNot)
}

fn vector_binary(k: BinaryOp) -> bool {
    matches!(
        k,
        BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Max
            | BinaryOp::Min
            | BinaryOp::Pow
            | BinaryOp::Mod
            | BinaryOp::Rem
    )
}

fn float_cc(k: BinaryOp) -> Option<FloatCC> {
    Some(match k {
        BinaryOp::Eq => FloatCC::Equal,
        BinaryOp::Lt => FloatCC::LessThan,
        BinaryOp::Le => FloatCC::LessThanOrEqual,
        BinaryOp::Gt => FloatCC::GreaterThan,
        BinaryOp::Ge => FloatCC::GreaterThanOrEqual,
        _ => return None,
    })
}

/// Whether `e` reads any of `accs`.
fn reads_acc(e: &Expr, accs: &HashSet<AccVar>) -> bool {
    match e {
        Expr::Acc(a) => accs.contains(a),
        Expr::Const(_) | Expr::Load { .. } | Expr::Var(_) | Expr::Index { .. } | Expr::Cond(_) => false,
        Expr::Unary(_, x) | Expr::Cast(x, _) => reads_acc(x, accs),
        Expr::Binary(_, a, b) => reads_acc(a, accs) || reads_acc(b, accs),
        Expr::Select(c, a, b) => reads_acc(c, accs) || reads_acc(a, accs) || reads_acc(b, accs),
    }
}

impl Emitter<'_, '_> {
    /// Whether the loop body qualifies for the f32x4 form (see the module docs).
    pub(crate) fn can_vectorize(&self, body: &Block) -> bool {
        let mut inner: HashSet<Var> = HashSet::new();
        for s in &body.0 {
            match s {
                Stmt::Let { var, dtype: DType::F32, value } if self.vector_ok(value, &inner) => {
                    inner.insert(*var);
                }
                Stmt::Store { arg, value, .. }
                    if self.kernel.args.get(arg.0 as usize).is_some_and(|a| a.dtype == DType::F32)
                        && self.vector_ok(value, &inner) => {}
                _ => return false,
            }
        }
        true
    }

    /// Whether a reduction loop's body qualifies for the f32x4 form with an in-order fold (see the module docs).
    pub(crate) fn can_vectorize_reduction(&self, body: &Block) -> bool {
        let folded: HashSet<AccVar> = body
            .0
            .iter()
            .filter_map(|s| match s {
                Stmt::Update { acc, .. } => Some(*acc),
                _ => None,
            })
            .collect();
        let value_ok = |e: &Expr, inner: &HashSet<Var>| self.vector_ok(e, inner) && !reads_acc(e, &folded);
        let mut inner: HashSet<Var> = HashSet::new();
        for s in &body.0 {
            match s {
                Stmt::Let { var, dtype: DType::F32, value } if value_ok(value, &inner) => {
                    inner.insert(*var);
                }
                Stmt::Update { acc, value, position: None }
                    if self.accs.get(acc).is_some_and(|a| {
                        a.dtype == DType::F32 && matches!(a.op, AccOp::Sum | AccOp::Prod | AccOp::Max | AccOp::Min)
                    }) && value_ok(value, &inner) => {}
                _ => return false,
            }
        }
        !folded.is_empty()
    }

    fn vector_ok(&self, e: &Expr, inner: &HashSet<Var>) -> bool {
        match e {
            Expr::Const(Scalar::F32(_)) => true,
            Expr::Load { arg, .. } => self.kernel.args.get(arg.0 as usize).is_some_and(|a| a.dtype == DType::F32),
            // An i32 load converted to f32 (an integer product's result, scaled): one vector conversion.
            Expr::Cast(x, DType::F32) => matches!(&**x, Expr::Load { arg, .. }
                if self.kernel.args.get(arg.0 as usize).is_some_and(|a| a.dtype == DType::I32)),
            Expr::Var(v) => inner.contains(v) || self.lets.get(v).is_some_and(|(_, d)| *d == DType::F32),
            Expr::Acc(a) => self.accs.get(a).is_some_and(|s| !s.op.is_arg() && s.dtype == DType::F32),
            Expr::Unary(k, x) => vector_unary(*k) && self.vector_ok(x, inner),
            Expr::Binary(k, a, b) => vector_binary(*k) && self.vector_ok(a, inner) && self.vector_ok(b, inner),
            Expr::Select(c, a, b) => {
                matches!(&**c, Expr::Binary(k, x, y) if float_cc(*k).is_some()
                    && self.vector_ok(x, inner) && self.vector_ok(y, inner))
                    && self.vector_ok(a, inner)
                    && self.vector_ok(b, inner)
            }
            _ => false,
        }
    }

    /// One group of four iterations starting at `i`; updates fold their four lanes in order.
    pub(crate) fn vector_body(&mut self, var: LoopVar, i: Value, body: &Block) -> EResult<()> {
        let mut vlets: HashMap<Var, Value> = HashMap::new();
        for s in &body.0 {
            match s {
                Stmt::Let { var: v, value, .. } => {
                    let x = self.vexpr(value, var, i, &vlets)?;
                    vlets.insert(*v, x);
                }
                Stmt::Store { arg, index, value } => {
                    let x = self.vexpr(value, var, i, &vlets)?;
                    if index.stride(var) == Some(1) {
                        let addr = self.address(*arg, index, true)?;
                        self.b.ins().store(mem(), x, addr, 0);
                    } else {
                        for lane in 0..LANES {
                            let li = self.b.ins().iadd_imm_s(i, lane);
                            self.lane_index.insert(var, li);
                            let addr = self.address(*arg, index, true);
                            self.lane_index.remove(&var);
                            let addr = addr?;
                            let x = self.b.ins().extractlane(x, lane as u8);
                            self.b.ins().store(mem(), x, addr, 0);
                        }
                    }
                }
                Stmt::Update { acc, value, .. } => {
                    let x = self.vexpr(value, var, i, &vlets)?;
                    let slot = *self
                        .accs
                        .get(acc)
                        .ok_or_else(|| self.malformed(format!("accumulator a{} is not declared", acc.0)))?;
                    // Lane by lane in iteration order: the scalar loop's fold, rounding for rounding.
                    for lane in 0..LANES as u8 {
                        let v = self.b.ins().extractlane(x, lane);
                        let cur = self.b.use_var(slot.value);
                        let folded = self.fold(slot.op, cur, v, DType::F32)?;
                        self.b.def_var(slot.value, folded);
                    }
                }
                _ => return Err(self.malformed("a statement the vector form does not take".into())),
            }
        }
        Ok(())
    }

    fn splat(&mut self, x: Value) -> Value {
        self.b.ins().splat(types::F32X4, x)
    }

    fn vexpr(&mut self, e: &Expr, var: LoopVar, i: Value, vlets: &HashMap<Var, Value>) -> EResult<Value> {
        Ok(match e {
            Expr::Const(s) => {
                let c = self.scalar_const(*s);
                self.splat(c)
            }
            Expr::Load { arg, index } => self.vload(*arg, index, var, i, DType::F32)?,
            Expr::Cast(x, DType::F32) => {
                let Expr::Load { arg, index } = &**x else {
                    return Err(self.malformed("a vector cast of something other than an i32 load".into()));
                };
                let v = self.vload(*arg, index, var, i, DType::I32)?;
                self.b.ins().fcvt_from_sint(types::F32X4, v)
            }
            Expr::Var(v) => match vlets.get(v) {
                Some(x) => *x,
                None => {
                    let (x, _) = self.expr(e)?;
                    self.splat(x)
                }
            },
            Expr::Acc(_) => {
                let (x, _) = self.expr(e)?;
                self.splat(x)
            }
            Expr::Unary(k, x) => {
                let x = self.vexpr(x, var, i, vlets)?;
                self.vunary(*k, x)?
            }
            Expr::Binary(BinaryOp::Pow, a, b) if b.small_power().is_some() => {
                let x = self.vexpr(a, var, i, vlets)?;
                let mut acc = x;
                for _ in 1..b.small_power().unwrap_or(1) {
                    acc = self.b.ins().fmul(acc, x);
                }
                acc
            }
            Expr::Binary(k, a, b) => {
                let a = self.vexpr(a, var, i, vlets)?;
                let b = self.vexpr(b, var, i, vlets)?;
                match k {
                    BinaryOp::Add => self.b.ins().fadd(a, b),
                    BinaryOp::Sub => self.b.ins().fsub(a, b),
                    BinaryOp::Mul => self.b.ins().fmul(a, b),
                    BinaryOp::Div => self.b.ins().fdiv(a, b),
                    BinaryOp::Max => self.b.ins().fmax(a, b),
                    BinaryOp::Min => self.b.ins().fmin(a, b),
                    _ => self.per_lane2(|e, x, y| Ok(e.binary(*k, x, y, DType::F32)?.0), a, b)?,
                }
            }
            Expr::Select(c, a, b) => {
                let Expr::Binary(k, x, y) = &**c else {
                    return Err(self.malformed("vector select without a comparison".into()));
                };
                let cc = float_cc(*k).ok_or_else(|| self.malformed("vector select without a comparison".into()))?;
                let x = self.vexpr(x, var, i, vlets)?;
                let y = self.vexpr(y, var, i, vlets)?;
                let mask = self.b.ins().fcmp(cc, x, y);
                let a = self.vexpr(a, var, i, vlets)?;
                let b = self.vexpr(b, var, i, vlets)?;
                self.select_mask(mask, a, b)
            }
            _ => return Err(self.malformed("an expression the vector form does not take".into())),
        })
    }

    /// Four lanes of `arg` (f32 or i32) at `index` for iterations `i..i + 4` of `var`: one vector load at stride
    /// 1, a splat at stride 0, lane by lane otherwise.
    fn vload(&mut self, arg: ArgId, index: &IExpr, var: LoopVar, i: Value, dtype: DType) -> EResult<Value> {
        let ty = if dtype == DType::I32 { types::I32X4 } else { types::F32X4 };
        Ok(match index.stride(var) {
            Some(1) => {
                let addr = self.address(arg, index, false)?;
                self.b.ins().load(ty, mem(), addr, 0)
            }
            Some(0) => {
                let addr = self.address(arg, index, false)?;
                let x = self.load_scalar(dtype, addr);
                self.b.ins().splat(ty, x)
            }
            _ => {
                let mut lanes = Vec::with_capacity(LANES as usize);
                for lane in 0..LANES {
                    let li = self.b.ins().iadd_imm_s(i, lane);
                    self.lane_index.insert(var, li);
                    let addr = self.address(arg, index, false);
                    self.lane_index.remove(&var);
                    lanes.push(self.load_scalar(dtype, addr?));
                }
                let mut v = self.b.ins().splat(ty, lanes[0]);
                for (lane, x) in lanes.into_iter().enumerate().skip(1) {
                    v = self.b.ins().insertlane(v, x, lane as u8);
                }
                v
            }
        })
    }

    /// Lanes of `a` where the i32x4 `mask` is set, of `b` elsewhere.
    pub(crate) fn select_mask(&mut self, mask: Value, a: Value, b: Value) -> Value {
        let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
        let m = self.b.ins().bitcast(types::F32X4, flags, mask);
        self.b.ins().bitselect(m, a, b)
    }

    fn vunary(&mut self, k: UnaryOp, x: Value) -> EResult<Value> {
        let zero = self.b.ins().f32const(0.0);
        Ok(match k {
            UnaryOp::Neg => self.b.ins().fneg(x),
            UnaryOp::Abs => self.b.ins().fabs(x),
            UnaryOp::Sqrt => self.b.ins().sqrt(x),
            UnaryOp::Relu => {
                let z = self.splat(zero);
                let keep = self.b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, x, z);
                self.select_mask(keep, x, z)
            }
            UnaryOp::Sign => {
                let z = self.splat(zero);
                let one = self.b.ins().f32const(1.0);
                let one = self.splat(one);
                let m1 = self.b.ins().f32const(-1.0);
                let m1 = self.splat(m1);
                let gt = self.b.ins().fcmp(FloatCC::GreaterThan, x, z);
                let lt = self.b.ins().fcmp(FloatCC::LessThan, x, z);
                let v = self.select_mask(lt, m1, x);
                self.select_mask(gt, one, v)
            }
            UnaryOp::Reciprocal | UnaryOp::Rsqrt => {
                let one = self.b.ins().f32const(1.0);
                let one = self.splat(one);
                let d = if k == UnaryOp::Rsqrt { self.b.ins().sqrt(x) } else { x };
                self.b.ins().fdiv(one, d)
            }
            UnaryOp::Floor if self.target.native_rounding => self.b.ins().floor(x),
            UnaryOp::Ceil if self.target.native_rounding => self.b.ins().ceil(x),
            UnaryOp::Round if self.target.native_rounding => self.b.ins().nearest(x),
            _ if let Some(v) = self.vector_math(k, x) => v?,
            _ => self.per_lane(|e, v| Ok(e.unary(k, v, DType::F32)?.0), x)?,
        })
    }

    pub(crate) fn per_lane(
        &mut self,
        mut f: impl FnMut(&mut Self, Value) -> EResult<Value>,
        x: Value,
    ) -> EResult<Value> {
        let mut out = x;
        for lane in 0..LANES as u8 {
            let v = self.b.ins().extractlane(x, lane);
            let r = f(self, v)?;
            out = self.b.ins().insertlane(out, r, lane);
        }
        Ok(out)
    }

    fn per_lane2(
        &mut self,
        mut f: impl FnMut(&mut Self, Value, Value) -> EResult<Value>,
        a: Value,
        b: Value,
    ) -> EResult<Value> {
        let mut out = a;
        for lane in 0..LANES as u8 {
            let x = self.b.ins().extractlane(a, lane);
            let y = self.b.ins().extractlane(b, lane);
            let r = f(self, x, y)?;
            out = self.b.ins().insertlane(out, r, lane);
        }
        Ok(out)
    }
}
