//! Scalar element code for the NVPTX emitter: constants, typed expressions, the unary and binary kinds, casts
//! and accumulator updates, each with `kiln_ir::interp::scalar`'s semantics, mirroring the CPU emitter's
//! `cpu::scalar` operation by operation (16-bit floats live in f32 registers and are rounded after each
//! operation; bools are i1).

use inkwell::types::{BasicType, BasicTypeEnum};
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::DType;
use kiln_ir::interp::scalar::Scalar;
use kiln_ir::op::{BinaryOp, UnaryOp};

use super::emit::{KernelEmitter, R};
use crate::kernel::{AccOp, AccVar, Expr, IExpr};

type V<'ctx> = BasicValueEnum<'ctx>;

impl<'ctx> KernelEmitter<'_, 'ctx> {
    pub(super) fn scalar_const(&mut self, s: Scalar) -> R<V<'ctx>> {
        let c = self.ctx;
        Ok(match s {
            Scalar::F32(v) => c.f32_type().const_float(f64::from(v)).into(),
            Scalar::F16(v) => c.f32_type().const_float(f64::from(v.to_f32())).into(),
            Scalar::BF16(v) => c.f32_type().const_float(f64::from(v.to_f32())).into(),
            Scalar::F64(v) => c.f64_type().const_float(v).into(),
            Scalar::I8(v) => c.i8_type().const_int(u64::from(v as u8), false).into(),
            Scalar::U8(v) => c.i8_type().const_int(u64::from(v), false).into(),
            Scalar::I32(v) => c.i32_type().const_int(u64::from(v as u32), false).into(),
            Scalar::I64(v) => c.i64_type().const_int(v as u64, true).into(),
            Scalar::Bool(v) => c.bool_type().const_int(u64::from(v), false).into(),
            Scalar::I16(v) => c.i16_type().const_int(u64::from(v as u16), false).into(),
            Scalar::U16(v) => c.i16_type().const_int(u64::from(v), false).into(),
            Scalar::U32(v) => c.i32_type().const_int(u64::from(v), false).into(),
            Scalar::U64(v) => c.i64_type().const_int(v, false).into(),
            // Narrow types never reach the emitter (lowering refuses them): their byte, as stored.
            narrow => c.i8_type().const_int(u64::from(narrow.to_le_byte()), false).into(),
        })
    }

    /// A float constant of the register type of `like`.
    pub(super) fn fconst(&self, like: FloatValue<'ctx>, v: f64) -> FloatValue<'ctx> {
        like.get_type().const_float(v)
    }

    /// Calls the LLVM intrinsic (or declared function) `name` of result type `ret`.
    pub(super) fn call(&mut self, name: &str, args: &[V<'ctx>], ret: BasicTypeEnum<'ctx>) -> R<V<'ctx>> {
        let f = match self.module.get_function(name) {
            Some(f) => f,
            None => {
                let params: Vec<_> = args.iter().map(|a| a.get_type().into()).collect();
                self.module.add_function(name, ret.fn_type(&params, false), None)
            }
        };
        let args: Vec<BasicMetadataValueEnum> = args.iter().map(|a| (*a).into()).collect();
        Ok(self.b.build_call(f, &args, "call")?.try_as_basic_value().basic().expect("a value"))
    }

    /// A float intrinsic `llvm.<op>.f32|f64` on one operand.
    pub(super) fn fintrinsic(&mut self, op: &str, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let suffix = if x.get_type() == self.ctx.f64_type() { "f64" } else { "f32" };
        Ok(self.call(&format!("llvm.{op}.{suffix}"), &[x.into()], x.get_type().into())?.into_float_value())
    }

    /// Rounds an f32-held result to its 16-bit dtype; other dtypes pass through.
    pub(super) fn round_to(&mut self, v: V<'ctx>, d: DType) -> R<V<'ctx>> {
        Ok(match d {
            DType::F16 => {
                let bits = self.f32_to_f16_bits(v.into_float_value())?;
                self.f16_bits_to_f32(bits)?.into()
            }
            DType::BF16 => {
                let bits = self.f32_to_bf16_bits(v.into_float_value())?;
                self.bf16_bits_to_f32(bits)?.into()
            }
            _ => v,
        })
    }

    pub(super) fn expr(&mut self, e: &Expr) -> R<(V<'ctx>, DType)> {
        Ok(match e {
            Expr::Const(s) => (self.scalar_const(*s)?, s.dtype()),
            Expr::Load { arg, index } => self.load(arg.0 as usize, index)?,
            Expr::Var(v) => *self.lets.get(v).expect("verified: lets are defined before their uses"),
            Expr::Acc(a) => {
                let slot = *self.accs.get(a).expect("verified: accumulators are declared before their uses");
                if slot.op.is_arg() {
                    (self.b.build_load(self.ctx.i64_type(), slot.position, "pos")?, DType::I64)
                } else {
                    (self.b.build_load(self.reg_type(slot.dtype), slot.value, "acc")?, slot.dtype)
                }
            }
            Expr::Index { value, dtype } => {
                let v = self.iexpr(value)?;
                (self.cast(v.into(), DType::I64, *dtype)?, *dtype)
            }
            Expr::Cond(c) => (self.icond(c)?.into(), DType::Bool),
            Expr::Unary(k, x) => {
                let (x, d) = self.expr(x)?;
                self.unary(*k, x, d)?
            }
            Expr::Binary(k, a, bx) => {
                let (a, da) = self.expr(a)?;
                let (b, db) = self.expr(bx)?;
                debug_assert_eq!(da, db, "verified: binary operands share a dtype");
                match bx.small_power() {
                    Some(n) if *k == BinaryOp::Pow && matches!(da, DType::F32 | DType::F64) => {
                        let mut acc = a;
                        for _ in 1..n {
                            acc = self.binary(BinaryOp::Mul, acc, a, da)?.0;
                        }
                        (acc, da)
                    }
                    _ => self.binary(*k, a, b, da)?,
                }
            }
            Expr::Select(c, a, b) => {
                let (c, dc) = self.expr(c)?;
                let (a, da) = self.expr(a)?;
                let (b, db) = self.expr(b)?;
                debug_assert!(dc == DType::Bool && da == db, "verified: select on bool and two arms of one dtype");
                (self.b.build_select(c.into_int_value(), a, b, "sel")?, da)
            }
            Expr::Cast(x, to) => {
                let (x, d) = self.expr(x)?;
                (self.cast(x, d, *to)?, *to)
            }
        })
    }

    pub(super) fn unary(&mut self, k: UnaryOp, x: V<'ctx>, d: DType) -> R<(V<'ctx>, DType)> {
        let not_defined = |e: &Self| e.unsupported(format!("`{}` on {d}", k.name()));
        if d.is_float() {
            let x = x.into_float_value();
            let f64_ = d == DType::F64;
            let v: FloatValue = match k {
                UnaryOp::IsNan => {
                    return Ok((self.b.build_float_compare(FloatPredicate::UNO, x, x, "isnan")?.into(), DType::Bool));
                }
                UnaryOp::IsInf => {
                    let a = self.fintrinsic("fabs", x)?;
                    let inf = self.fconst(x, f64::INFINITY);
                    return Ok((self.b.build_float_compare(FloatPredicate::OEQ, a, inf, "isinf")?.into(), DType::Bool));
                }
                UnaryOp::Not | UnaryOp::BitNot => return Err(not_defined(self)),
                UnaryOp::Neg => self.b.build_float_neg(x, "neg")?,
                UnaryOp::Abs => self.fintrinsic("fabs", x)?,
                UnaryOp::Sqrt => self.fintrinsic("sqrt", x)?,
                UnaryOp::Rsqrt => {
                    let s = self.fintrinsic("sqrt", x)?;
                    let one = self.fconst(x, 1.0);
                    self.b.build_float_div(one, s, "rsqrt")?
                }
                UnaryOp::Reciprocal => {
                    let one = self.fconst(x, 1.0);
                    self.b.build_float_div(one, x, "recip")?
                }
                UnaryOp::Relu => {
                    let zero = self.fconst(x, 0.0);
                    let keep = self.b.build_float_compare(FloatPredicate::UGT, x, zero, "keep")?;
                    self.b.build_select(keep, x, zero, "relu")?.into_float_value()
                }
                UnaryOp::Sign => {
                    let zero = self.fconst(x, 0.0);
                    let one = self.fconst(x, 1.0);
                    let m1 = self.fconst(x, -1.0);
                    let gt = self.b.build_float_compare(FloatPredicate::OGT, x, zero, "gt")?;
                    let lt = self.b.build_float_compare(FloatPredicate::OLT, x, zero, "lt")?;
                    let v = self.b.build_select(lt, m1, x, "s")?.into_float_value();
                    self.b.build_select(gt, one, v, "sign")?.into_float_value()
                }
                UnaryOp::Floor => self.fintrinsic("floor", x)?,
                UnaryOp::Ceil => self.fintrinsic("ceil", x)?,
                UnaryOp::Round => self.fintrinsic("roundeven", x)?,
                UnaryOp::Exp if f64_ => self.exp_f64(x)?,
                UnaryOp::Log if f64_ => self.log_f64(x)?,
                UnaryOp::Tanh if f64_ => self.tanh_f64(x)?,
                UnaryOp::Exp => self.exp_f32(x)?,
                UnaryOp::Log => self.log_f32(x)?,
                UnaryOp::Tanh => self.tanh_f32(x)?,
                UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Tan => self.trig(k, x)?,
                UnaryOp::Asin | UnaryOp::Acos | UnaryOp::Atan => self.inverse_trig(k, x)?,
                UnaryOp::Sinh | UnaryOp::Cosh | UnaryOp::Asinh | UnaryOp::Acosh | UnaryOp::Atanh => {
                    self.hyperbolic(k, x)?
                }
                UnaryOp::Erf if f64_ => self.erf_f64(x)?,
                UnaryOp::Erf => self.erf_f32(x)?,
                UnaryOp::Sigmoid => {
                    let n = self.b.build_float_neg(x, "negx")?;
                    let e = if f64_ { self.exp_f64(n)? } else { self.exp_f32(n)? };
                    let one = self.fconst(x, 1.0);
                    let den = self.b.build_float_add(one, e, "den")?;
                    self.b.build_float_div(one, den, "sigmoid")?
                }
            };
            return Ok((self.round_to(v.into(), d)?, d));
        }
        let x = x.into_int_value();
        if d == DType::Bool {
            return match k {
                UnaryOp::Not => Ok((self.b.build_not(x, "not")?.into(), d)),
                _ => Err(not_defined(self)),
            };
        }
        let unsigned = d.is_unsigned();
        let ty = x.get_type();
        let zero = ty.const_zero();
        let v: IntValue = match k {
            UnaryOp::Neg => self.b.build_int_sub(zero, x, "neg")?,
            UnaryOp::Abs | UnaryOp::Relu if unsigned => x,
            UnaryOp::Abs => {
                let n = self.b.build_int_sub(zero, x, "neg")?;
                let neg = self.b.build_int_compare(IntPredicate::SLT, x, zero, "isneg")?;
                self.b.build_select(neg, n, x, "abs")?.into_int_value()
            }
            UnaryOp::Relu => {
                let pos = self.b.build_int_compare(IntPredicate::SGT, x, zero, "pos")?;
                self.b.build_select(pos, x, zero, "relu")?.into_int_value()
            }
            UnaryOp::Sign if unsigned => {
                let nz = self.b.build_int_compare(IntPredicate::NE, x, zero, "nz")?;
                self.b.build_int_z_extend(nz, ty, "sign")?
            }
            UnaryOp::Sign => {
                let gt = self.b.build_int_compare(IntPredicate::SGT, x, zero, "gt")?;
                let lt = self.b.build_int_compare(IntPredicate::SLT, x, zero, "lt")?;
                let gt = self.b.build_int_z_extend(gt, ty, "gt")?;
                let lt = self.b.build_int_z_extend(lt, ty, "lt")?;
                self.b.build_int_sub(gt, lt, "sign")?
            }
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => x,
            UnaryOp::BitNot => self.b.build_not(x, "bitnot")?,
            _ => return Err(not_defined(self)),
        };
        Ok((v.into(), d))
    }

    pub(super) fn binary(&mut self, k: BinaryOp, a: V<'ctx>, b: V<'ctx>, d: DType) -> R<(V<'ctx>, DType)> {
        let not_defined = |e: &Self| e.unsupported(format!("`{}` on {d}", k.name()));
        if d.is_float() {
            let p = match k {
                BinaryOp::Eq => Some(FloatPredicate::OEQ),
                BinaryOp::Lt => Some(FloatPredicate::OLT),
                BinaryOp::Le => Some(FloatPredicate::OLE),
                BinaryOp::Gt => Some(FloatPredicate::OGT),
                BinaryOp::Ge => Some(FloatPredicate::OGE),
                _ => None,
            };
            if let Some(p) = p {
                return Ok((self.fcmp(p, a, b)?.into(), DType::Bool));
            }
            let (a, b) = (a.into_float_value(), b.into_float_value());
            let v = match k {
                BinaryOp::Add => self.b.build_float_add(a, b, "add")?,
                BinaryOp::Sub => self.b.build_float_sub(a, b, "sub")?,
                BinaryOp::Mul => self.b.build_float_mul(a, b, "mul")?,
                BinaryOp::Div => self.b.build_float_div(a, b, "div")?,
                BinaryOp::Pow => self.pow(a, b)?,
                BinaryOp::Rem => self.fmod(a, b)?,
                BinaryOp::Mod => self.python_mod(a, b)?,
                BinaryOp::Max => self.float_max_min(a, b, true)?,
                BinaryOp::Min => self.float_max_min(a, b, false)?,
                _ => return Err(not_defined(self)),
            };
            return Ok((self.round_to(v.into(), d)?, d));
        }
        let (a, b) = (a.into_int_value(), b.into_int_value());
        if d == DType::Bool {
            let v = match k {
                BinaryOp::And => self.b.build_and(a, b, "and")?,
                BinaryOp::Or => self.b.build_or(a, b, "or")?,
                BinaryOp::Xor => self.b.build_xor(a, b, "xor")?,
                BinaryOp::Eq => self.b.build_int_compare(IntPredicate::EQ, a, b, "eq")?,
                _ => return Err(not_defined(self)),
            };
            return Ok((v.into(), d));
        }
        let unsigned = d.is_unsigned();
        let pick = |s: IntPredicate, u: IntPredicate| if unsigned { u } else { s };
        let p = match k {
            BinaryOp::Eq => Some(IntPredicate::EQ),
            BinaryOp::Lt => Some(pick(IntPredicate::SLT, IntPredicate::ULT)),
            BinaryOp::Le => Some(pick(IntPredicate::SLE, IntPredicate::ULE)),
            BinaryOp::Gt => Some(pick(IntPredicate::SGT, IntPredicate::UGT)),
            BinaryOp::Ge => Some(pick(IntPredicate::SGE, IntPredicate::UGE)),
            _ => None,
        };
        if let Some(p) = p {
            return Ok((self.b.build_int_compare(p, a, b, "icmp")?.into(), DType::Bool));
        }
        let ty = a.get_type();
        let bits = u64::from(ty.get_bit_width());
        let zero = ty.const_zero();
        let v: IntValue = match k {
            BinaryOp::Add => self.b.build_int_add(a, b, "add")?,
            BinaryOp::Sub => self.b.build_int_sub(a, b, "sub")?,
            BinaryOp::Mul => self.b.build_int_mul(a, b, "mul")?,
            // Division by zero is an interpreter error; compiled code gives 0 rather than trapping.
            BinaryOp::Div => self.safe_divrem(a, b, !unsigned)?.0,
            BinaryOp::Rem => self.safe_divrem(a, b, !unsigned)?.1,
            BinaryOp::Mod => {
                let r = self.safe_divrem(a, b, !unsigned)?.1;
                if unsigned {
                    r
                } else {
                    let r_nz = self.b.build_int_compare(IntPredicate::NE, r, zero, "r_nz")?;
                    let r_neg = self.b.build_int_compare(IntPredicate::SLT, r, zero, "r_neg")?;
                    let b_neg = self.b.build_int_compare(IntPredicate::SLT, b, zero, "b_neg")?;
                    let differ = self.b.build_xor(r_neg, b_neg, "differ")?;
                    let adjust = self.b.build_and(r_nz, differ, "adjust")?;
                    let moved = self.b.build_int_add(r, b, "moved")?;
                    self.b.build_select(adjust, moved, r, "mod")?.into_int_value()
                }
            }
            BinaryOp::Max | BinaryOp::Min => {
                let p = match (k == BinaryOp::Max, unsigned) {
                    (true, false) => IntPredicate::SGT,
                    (true, true) => IntPredicate::UGT,
                    (false, false) => IntPredicate::SLT,
                    (false, true) => IntPredicate::ULT,
                };
                let c = self.b.build_int_compare(p, a, b, "c")?;
                self.b.build_select(c, a, b, "minmax")?.into_int_value()
            }
            BinaryOp::Pow => {
                // The CPU runtime's `ipow` on the widened values, truncated back (wrapping commutes with it).
                let i64t = self.ctx.i64_type();
                let wide = |e: &mut Self, v: IntValue<'ctx>| -> R<IntValue<'ctx>> {
                    Ok(match (bits == 64, unsigned) {
                        (true, _) => v,
                        (false, true) => e.b.build_int_z_extend(v, i64t, "w")?,
                        (false, false) => e.b.build_int_s_extend(v, i64t, "w")?,
                    })
                };
                let (x, y) = (wide(self, a)?, wide(self, b)?);
                let p = self.ipow(x, y)?;
                if bits == 64 { p } else { self.b.build_int_truncate(p, ty, "pow")? }
            }
            BinaryOp::BitAnd => self.b.build_and(a, b, "band")?,
            BinaryOp::BitOr => self.b.build_or(a, b, "bor")?,
            BinaryOp::BitXor => self.b.build_xor(a, b, "bxor")?,
            BinaryOp::Shl | BinaryOp::Shr => {
                // Out-of-range amounts (negative, or at least the width) follow the interpreter; the amount is
                // masked first so LLVM never sees an over-wide shift (poison).
                let width = ty.const_int(bits, false);
                let in_range = self.b.build_int_compare(IntPredicate::ULT, b, width, "in_range")?;
                let masked = self.b.build_and(b, ty.const_int(bits - 1, false), "amount")?;
                if k == BinaryOp::Shl {
                    let s = self.b.build_left_shift(a, masked, "shl")?;
                    self.b.build_select(in_range, s, zero, "shl")?.into_int_value()
                } else if unsigned {
                    let s = self.b.build_right_shift(a, masked, false, "shr")?;
                    self.b.build_select(in_range, s, zero, "shr")?.into_int_value()
                } else {
                    let max = ty.const_int(bits - 1, false);
                    let amount = self.b.build_select(in_range, masked, max, "amount")?.into_int_value();
                    self.b.build_right_shift(a, amount, true, "sar")?
                }
            }
            _ => return Err(not_defined(self)),
        };
        Ok((v.into(), d))
    }

    /// Wrapping `x^e` on i64 by repeated squaring over all 64 bits of `e`; a negative exponent gives 0.
    fn ipow(&mut self, x: IntValue<'ctx>, e: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let i64t = self.ctx.i64_type();
        let acc = self.entry_alloca(i64t.into(), "ipow_acc")?;
        let base = self.entry_alloca(i64t.into(), "ipow_base")?;
        self.b.build_store(acc, i64t.const_int(1, false))?;
        self.b.build_store(base, x)?;
        let (zero, one) = (i64t.const_zero(), i64t.const_int(1, false));
        self.counted_loop(zero, i64t.const_int(64, false), one, "ipow", |em, k| {
            let bit = em.b.build_right_shift(e, k, false, "bit")?;
            let bit = em.b.build_and(bit, one, "bit")?;
            let set = em.b.build_int_compare(IntPredicate::NE, bit, zero, "set")?;
            let a = em.b.build_load(i64t, acc, "acc")?.into_int_value();
            let b = em.b.build_load(i64t, base, "base")?.into_int_value();
            let m = em.b.build_int_mul(a, b, "m")?;
            let a = em.b.build_select(set, m, a, "acc")?;
            em.b.build_store(acc, a)?;
            let sq = em.b.build_int_mul(b, b, "sq")?;
            em.b.build_store(base, sq)?;
            Ok(())
        })?;
        let r = self.b.build_load(i64t, acc, "ipow")?.into_int_value();
        let negative = self.b.build_int_compare(IntPredicate::SLT, e, zero, "neg_exp")?;
        Ok(self.b.build_select(negative, zero, r, "ipow")?.into_int_value())
    }

    /// IEEE 754-2019 `maximum`/`minimum`: NaN if either is NaN, and -0 below +0.
    fn float_max_min(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, max: bool) -> R<FloatValue<'ctx>> {
        let nan = self.b.build_float_compare(FloatPredicate::UNO, a, b, "nan")?;
        let (pa, pb) =
            if max { (FloatPredicate::OGT, FloatPredicate::OLT) } else { (FloatPredicate::OLT, FloatPredicate::OGT) };
        let a_wins = self.b.build_float_compare(pa, a, b, "a_wins")?;
        let b_wins = self.b.build_float_compare(pb, a, b, "b_wins")?;
        // Equal values: only ±0 differ in bits; `and` of the bits picks +0 (max), `or` picks -0 (min).
        let ity = if a.get_type() == self.ctx.f64_type() { self.ctx.i64_type() } else { self.ctx.i32_type() };
        let ai = self.b.build_bit_cast(a, ity, "ai")?.into_int_value();
        let bi = self.b.build_bit_cast(b, ity, "bi")?.into_int_value();
        let tie = if max { self.b.build_and(ai, bi, "tie")? } else { self.b.build_or(ai, bi, "tie")? };
        let tie = self.b.build_bit_cast(tie, a.get_type(), "tief")?.into_float_value();
        let quiet = self.b.build_float_add(a, b, "quiet")?;
        let v = self.b.build_select(b_wins, b, tie, "v")?.into_float_value();
        let v = self.b.build_select(a_wins, a, v, "v")?.into_float_value();
        Ok(self.b.build_select(nan, quiet, v, "maxmin")?.into_float_value())
    }

    /// `x` of dtype `from` converted to `to` with `cast` semantics.
    pub(super) fn cast(&mut self, x: V<'ctx>, from: DType, to: DType) -> R<V<'ctx>> {
        if from == to {
            return Ok(x);
        }
        let to_ty = self.reg_type(to);
        if to == DType::Bool {
            // `!= 0`; NaN is true.
            return Ok(if from.is_float() {
                let x = x.into_float_value();
                let zero = self.fconst(x, 0.0);
                self.b.build_float_compare(FloatPredicate::UNE, x, zero, "tobool")?.into()
            } else {
                let x = x.into_int_value();
                self.b.build_int_compare(IntPredicate::NE, x, x.get_type().const_zero(), "tobool")?.into()
            });
        }
        if from.is_float() {
            let x = x.into_float_value();
            let from_f64 = from == DType::F64;
            return Ok(match to {
                DType::F32 if from_f64 => self.b.build_float_trunc(x, self.ctx.f32_type(), "f32")?.into(),
                DType::F32 => x.into(),
                DType::F64 => self.b.build_float_ext(x, self.ctx.f64_type(), "f64")?.into(),
                DType::F16 | DType::BF16 if from_f64 => {
                    let t = self.f64_to_f32_odd(x)?;
                    self.round_to(t.into(), to)?
                }
                // Exact f32 values: one rounding.
                DType::F16 | DType::BF16 => self.round_to(x.into(), to)?,
                DType::I32 | DType::I64 | DType::U32 | DType::U64 => {
                    let op = if to.is_unsigned() { "fptoui" } else { "fptosi" };
                    let bits = to.int_bits().expect("an integer type");
                    let name = format!("llvm.{op}.sat.i{bits}.{}", ftype(from));
                    self.call(&name, &[x.into()], to_ty)?
                }
                _ => {
                    // 8- and 16-bit: saturate through i64, then clamp to the narrow range.
                    let i64t = self.ctx.i64_type();
                    let name = format!("llvm.fptosi.sat.i64.{}", ftype(from));
                    let w = self.call(&name, &[x.into()], i64t.into())?.into_int_value();
                    let (lo, hi) = to.int_range().expect("an integer type: float, bool and wide ints are above");
                    let (lo, hi) = (i64t.const_int(lo as u64, true), i64t.const_int(hi as u64, true));
                    let below = self.b.build_int_compare(IntPredicate::SLT, w, lo, "below")?;
                    let w = self.b.build_select(below, lo, w, "w")?.into_int_value();
                    let above = self.b.build_int_compare(IntPredicate::SGT, w, hi, "above")?;
                    let w = self.b.build_select(above, hi, w, "w")?.into_int_value();
                    self.b.build_int_truncate(w, to_ty.into_int_type(), "narrow")?.into()
                }
            });
        }
        // Integer or bool source: widen to its i64 value (u64: its bit pattern) first.
        let x = x.into_int_value();
        let i64t = self.ctx.i64_type();
        let wide = match from {
            DType::I64 | DType::U64 => x,
            d if d.is_unsigned() || d == DType::Bool => self.b.build_int_z_extend(x, i64t, "wide")?,
            _ => self.b.build_int_s_extend(x, i64t, "wide")?,
        };
        Ok(match to {
            DType::F32 | DType::F64 if from == DType::U64 => {
                self.b.build_unsigned_int_to_float(wide, to_ty.into_float_type(), "utof")?.into()
            }
            DType::F32 | DType::F64 => self.b.build_signed_int_to_float(wide, to_ty.into_float_type(), "itof")?.into(),
            DType::F16 | DType::BF16 if from == DType::U64 => {
                // As on the CPU: a value at or above 2^63 is halved with the dropped bit kept as a sticky bit
                // (the same rounding to 8 or 11 bits), converted, and doubled exactly.
                let big = self.b.build_int_compare(IntPredicate::SLT, wide, i64t.const_zero(), "big")?;
                let low = self.b.build_and(wide, i64t.const_int(1, false), "low")?;
                let half = self.b.build_right_shift(wide, i64t.const_int(1, false), false, "half")?;
                let half = self.b.build_or(half, low, "half")?;
                let arg = self.b.build_select(big, half, wide, "arg")?.into_int_value();
                let t = self.i64_to_f32_odd(arg)?;
                let r = self.round_to(t.into(), to)?.into_float_value();
                let doubled = self.b.build_float_add(r, r, "doubled")?;
                self.b.build_select(big, doubled, r, "r")?
            }
            DType::F16 | DType::BF16 => {
                let t = self.i64_to_f32_odd(wide)?;
                self.round_to(t.into(), to)?
            }
            DType::I64 | DType::U64 => wide.into(),
            _ => self.b.build_int_truncate(wide, to_ty.into_int_type(), "narrow")?.into(),
        })
    }

    pub(super) fn update(&mut self, acc: AccVar, value: &Expr, position: Option<&IExpr>) -> R<()> {
        let slot = *self.accs.get(&acc).expect("verified: accumulators are declared before their updates");
        let (v, d) = self.expr(value)?;
        debug_assert_eq!(d, slot.dtype, "verified: updates carry the accumulator's dtype");
        let cur = self.b.build_load(self.reg_type(d), slot.value, "cur")?;
        let folded = match slot.op {
            AccOp::ArgMax { select_last } | AccOp::ArgMin { select_last } => {
                let max = matches!(slot.op, AccOp::ArgMax { .. });
                let pos = position.expect("verified: arg updates carry a position");
                let p = self.iexpr(pos)?;
                let replace = self.arg_replaces(max, select_last, v, cur, d)?;
                let cur_pos = self.b.build_load(self.ctx.i64_type(), slot.position, "cur_pos")?;
                let new_pos = self.b.build_select(replace, p.into(), cur_pos, "pos")?;
                self.b.build_store(slot.position, new_pos)?;
                self.b.build_select(replace, v, cur, "best")?
            }
            op => self.fold(op, cur, v, d)?,
        };
        self.b.build_store(slot.value, folded)?;
        Ok(())
    }

    /// `cur` combined with `v` by a value-only op (not an arg op), both of dtype `d`: the step of sequential
    /// updates and of the warp's combining tree alike.
    pub(super) fn fold(&mut self, op: AccOp, cur: V<'ctx>, v: V<'ctx>, d: DType) -> R<V<'ctx>> {
        Ok(match op {
            AccOp::Sum => self.binary(BinaryOp::Add, cur, v, d)?.0,
            AccOp::Prod => self.binary(BinaryOp::Mul, cur, v, d)?.0,
            AccOp::Max if d == DType::Bool => self.b.build_or(cur.into_int_value(), v.into_int_value(), "or")?.into(),
            AccOp::Min if d == DType::Bool => self.b.build_and(cur.into_int_value(), v.into_int_value(), "and")?.into(),
            AccOp::Max => self.binary(BinaryOp::Max, cur, v, d)?.0,
            AccOp::Min => self.binary(BinaryOp::Min, cur, v, d)?.0,
            AccOp::ArgMax { .. } | AccOp::ArgMin { .. } => {
                return Err(self.malformed(format!("{op:?} folded without a position")));
            }
        })
    }

    /// Whether candidate `c` displaces `best` (NaN is the extreme value; ties go to the later position when
    /// `last`), as the interpreter's `arg_reduce` decides.
    fn arg_replaces(&mut self, max: bool, last: bool, c: V<'ctx>, best: V<'ctx>, d: DType) -> R<IntValue<'ctx>> {
        let last_v = self.ctx.bool_type().const_int(u64::from(last), false);
        if d.is_float() {
            let (cf, bf) = (c.into_float_value(), best.into_float_value());
            let c_nan = self.b.build_float_compare(FloatPredicate::UNO, cf, cf, "c_nan")?;
            let b_nan = self.b.build_float_compare(FloatPredicate::UNO, bf, bf, "b_nan")?;
            let p = if max { FloatPredicate::OGT } else { FloatPredicate::OLT };
            let beats = self.b.build_float_compare(p, cf, bf, "beats")?;
            let eq = self.b.build_float_compare(FloatPredicate::OEQ, cf, bf, "eq")?;
            let tie = self.b.build_and(eq, last_v, "tie")?;
            // Ordered comparisons are false when either is NaN, so this is the both-numbers rule.
            let numbers = self.b.build_or(beats, tie, "numbers")?;
            let not_b_nan = self.b.build_not(b_nan, "not_b_nan")?;
            let on_nan = self.b.build_or(last_v, not_b_nan, "on_nan")?;
            return Ok(self.b.build_select(c_nan, on_nan, numbers, "replace")?.into_int_value());
        }
        let (ci, bi) = (c.into_int_value(), best.into_int_value());
        let unsigned = d.is_unsigned() || d == DType::Bool;
        let p = match (max, unsigned) {
            (true, false) => IntPredicate::SGT,
            (true, true) => IntPredicate::UGT,
            (false, false) => IntPredicate::SLT,
            (false, true) => IntPredicate::ULT,
        };
        let beats = self.b.build_int_compare(p, ci, bi, "beats")?;
        let eq = self.b.build_int_compare(IntPredicate::EQ, ci, bi, "eq")?;
        let tie = self.b.build_and(eq, last_v, "tie")?;
        Ok(self.b.build_or(beats, tie, "replace")?)
    }
}

/// The LLVM type suffix of a float dtype's register.
fn ftype(d: DType) -> &'static str {
    if d == DType::F64 { "f64" } else { "f32" }
}
