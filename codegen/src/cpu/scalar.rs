//! Scalar element code: constants, typed expressions, the unary and binary kinds, casts and accumulator
//! updates, each with `kiln_ir::interp::scalar`'s semantics (see `emit` for how dtypes live in registers).

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{InstBuilder, Type, Value, types};
use kiln_ir::DType;
use kiln_ir::interp::scalar::Scalar;
use kiln_ir::op::{BinaryOp, UnaryOp};

use super::emit::{EResult, Emitter, reg_type};
use super::runtime::RtFn;
use crate::kernel::{AccOp, AccVar, Expr, IExpr};

impl Emitter<'_, '_> {
    pub(crate) fn scalar_const(&mut self, s: Scalar) -> Value {
        match s {
            Scalar::F32(v) => self.b.ins().f32const(v),
            Scalar::F16(v) => self.b.ins().f32const(v.to_f32()),
            Scalar::BF16(v) => self.b.ins().f32const(v.to_f32()),
            Scalar::F64(v) => self.b.ins().f64const(v),
            Scalar::I8(v) => self.b.ins().iconst(types::I8, i64::from(v as u8)),
            Scalar::U8(v) => self.b.ins().iconst(types::I8, i64::from(v)),
            Scalar::I32(v) => self.b.ins().iconst(types::I32, i64::from(v as u32)),
            Scalar::I64(v) => self.b.ins().iconst(types::I64, v),
            Scalar::Bool(v) => self.b.ins().iconst(types::I8, i64::from(v)),
            Scalar::I16(v) => self.b.ins().iconst(types::I16, i64::from(v as u16)),
            Scalar::U16(v) => self.b.ins().iconst(types::I16, i64::from(v)),
            Scalar::U32(v) => self.b.ins().iconst(types::I32, i64::from(v)),
            Scalar::U64(v) => self.b.ins().iconst(types::I64, v as i64),
            // Narrow types never reach the emitter (lowering refuses them): their byte, as stored.
            narrow => self.b.ins().iconst(types::I8, i64::from(narrow.to_le_byte())),
        }
    }

    /// A float constant of register type `ty`.
    pub(crate) fn fconst(&mut self, ty: Type, v: f64) -> Value {
        if ty == types::F64 { self.b.ins().f64const(v) } else { self.b.ins().f32const(v as f32) }
    }

    /// Rounds an f32-held result to its 16-bit dtype; other dtypes pass through.
    pub(crate) fn round_to(&mut self, v: Value, d: DType) -> Value {
        match d {
            DType::F16 => {
                let bits = self.f32_to_f16_bits(v);
                self.f16_bits_to_f32(bits)
            }
            DType::BF16 => self.round_bf16_inline(v),
            _ => v,
        }
    }

    pub(crate) fn expr(&mut self, e: &Expr) -> EResult<(Value, DType)> {
        Ok(match e {
            Expr::Const(s) => (self.scalar_const(*s), s.dtype()),
            Expr::Load { arg, index } => {
                let d = self.kernel.arg(*arg).dtype;
                let addr = self.address(*arg, index, false)?;
                (self.load_scalar(d, addr), d)
            }
            Expr::Var(v) => *self.lets.get(v).expect("verified: lets are defined before their uses"),
            Expr::Acc(a) => {
                let slot = *self.accs.get(a).expect("verified: accumulators are declared before their uses");
                if slot.op.is_arg() {
                    (self.b.use_var(slot.position), DType::I64)
                } else {
                    (self.b.use_var(slot.value), slot.dtype)
                }
            }
            Expr::Index { value, dtype } => {
                let v = self.iexpr(value)?;
                (self.cast(v, DType::I64, *dtype), *dtype)
            }
            Expr::Cond(c) => (self.icond(c)?, DType::Bool),
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
                (self.b.ins().select(c, a, b), da)
            }
            Expr::Cast(x, to) => {
                let (x, d) = self.expr(x)?;
                (self.cast(x, d, *to), *to)
            }
        })
    }

    pub(crate) fn unary(&mut self, k: UnaryOp, x: Value, d: DType) -> EResult<(Value, DType)> {
        let not_defined = |e: &Self| e.unsupported(format!("{} on {d}", k.name()));
        if d.is_float() {
            let ty = reg_type(d);
            let f64_ = ty == types::F64;
            let rt = |f32_fn: RtFn, f64_fn: RtFn| if f64_ { f64_fn } else { f32_fn };
            let v = match k {
                UnaryOp::IsNan => return Ok((self.b.ins().fcmp(FloatCC::Unordered, x, x), DType::Bool)),
                UnaryOp::IsInf => {
                    let a = self.b.ins().fabs(x);
                    let inf = self.fconst(ty, f64::INFINITY);
                    return Ok((self.b.ins().fcmp(FloatCC::Equal, a, inf), DType::Bool));
                }
                UnaryOp::Not | UnaryOp::BitNot => return Err(not_defined(self)),
                UnaryOp::Neg => self.b.ins().fneg(x),
                UnaryOp::Abs => self.b.ins().fabs(x),
                UnaryOp::Sqrt => self.b.ins().sqrt(x),
                UnaryOp::Rsqrt => {
                    let s = self.b.ins().sqrt(x);
                    let one = self.fconst(ty, 1.0);
                    self.b.ins().fdiv(one, s)
                }
                UnaryOp::Reciprocal => {
                    let one = self.fconst(ty, 1.0);
                    self.b.ins().fdiv(one, x)
                }
                UnaryOp::Relu => {
                    let zero = self.fconst(ty, 0.0);
                    let keep = self.b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, x, zero);
                    self.b.ins().select(keep, x, zero)
                }
                UnaryOp::Sign => {
                    let zero = self.fconst(ty, 0.0);
                    let one = self.fconst(ty, 1.0);
                    let m1 = self.fconst(ty, -1.0);
                    let gt = self.b.ins().fcmp(FloatCC::GreaterThan, x, zero);
                    let lt = self.b.ins().fcmp(FloatCC::LessThan, x, zero);
                    let v = self.b.ins().select(lt, m1, x);
                    self.b.ins().select(gt, one, v)
                }
                UnaryOp::Floor if self.target.native_rounding => self.b.ins().floor(x),
                UnaryOp::Ceil if self.target.native_rounding => self.b.ins().ceil(x),
                UnaryOp::Round if self.target.native_rounding => self.b.ins().nearest(x),
                UnaryOp::Sigmoid => {
                    let n = self.b.ins().fneg(x);
                    let e = self.call_rt(rt(RtFn::ExpF32, RtFn::ExpF64), &[n]);
                    let one = self.fconst(ty, 1.0);
                    let den = self.b.ins().fadd(one, e);
                    self.b.ins().fdiv(one, den)
                }
                _ => {
                    let f = match k {
                        UnaryOp::Exp => rt(RtFn::ExpF32, RtFn::ExpF64),
                        UnaryOp::Log => rt(RtFn::LogF32, RtFn::LogF64),
                        UnaryOp::Tanh => rt(RtFn::TanhF32, RtFn::TanhF64),
                        UnaryOp::Erf => rt(RtFn::ErfF32, RtFn::ErfF64),
                        UnaryOp::Sin => rt(RtFn::SinF32, RtFn::SinF64),
                        UnaryOp::Cos => rt(RtFn::CosF32, RtFn::CosF64),
                        UnaryOp::Tan => rt(RtFn::TanF32, RtFn::TanF64),
                        UnaryOp::Asin => rt(RtFn::AsinF32, RtFn::AsinF64),
                        UnaryOp::Acos => rt(RtFn::AcosF32, RtFn::AcosF64),
                        UnaryOp::Atan => rt(RtFn::AtanF32, RtFn::AtanF64),
                        UnaryOp::Sinh => rt(RtFn::SinhF32, RtFn::SinhF64),
                        UnaryOp::Cosh => rt(RtFn::CoshF32, RtFn::CoshF64),
                        UnaryOp::Asinh => rt(RtFn::AsinhF32, RtFn::AsinhF64),
                        UnaryOp::Acosh => rt(RtFn::AcoshF32, RtFn::AcoshF64),
                        UnaryOp::Atanh => rt(RtFn::AtanhF32, RtFn::AtanhF64),
                        // Without native rounding instructions Cranelift would call libm's by name, which object
                        // code could not count on finding.
                        UnaryOp::Floor => rt(RtFn::FloorF32, RtFn::FloorF64),
                        UnaryOp::Ceil => rt(RtFn::CeilF32, RtFn::CeilF64),
                        UnaryOp::Round => rt(RtFn::RoundF32, RtFn::RoundF64),
                        _ => return Err(not_defined(self)),
                    };
                    self.call_rt(f, &[x])
                }
            };
            return Ok((self.round_to(v, d), d));
        }
        if d == DType::Bool {
            return match k {
                UnaryOp::Not => Ok((self.b.ins().bxor_imm_s(x, 1), d)),
                _ => Err(not_defined(self)),
            };
        }
        let unsigned = d.is_unsigned();
        let ty = reg_type(d);
        let v = match k {
            UnaryOp::Neg => self.b.ins().ineg(x),
            UnaryOp::Abs if unsigned => x,
            UnaryOp::Abs => {
                let n = self.b.ins().ineg(x);
                let neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                self.b.ins().select(neg, n, x)
            }
            UnaryOp::Relu if unsigned => x,
            UnaryOp::Relu => {
                let zero = self.b.ins().iconst(ty, 0);
                self.b.ins().smax(x, zero)
            }
            UnaryOp::Sign if unsigned => {
                let one = self.b.ins().iconst(ty, 1);
                self.b.ins().umin(x, one)
            }
            UnaryOp::Sign => {
                let gt = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, x, 0);
                let lt = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                let (gt, lt) = if ty == types::I8 {
                    (gt, lt)
                } else {
                    (self.b.ins().uextend(ty, gt), self.b.ins().uextend(ty, lt))
                };
                self.b.ins().isub(gt, lt)
            }
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => x,
            UnaryOp::BitNot => self.b.ins().bnot(x),
            _ => return Err(not_defined(self)),
        };
        Ok((v, d))
    }

    pub(crate) fn binary(&mut self, k: BinaryOp, a: Value, b: Value, d: DType) -> EResult<(Value, DType)> {
        let not_defined = |e: &Self| e.unsupported(format!("{} on {d}", k.name()));
        if d.is_float() {
            let ty = reg_type(d);
            let f64_ = ty == types::F64;
            let cmp = |cc| Some(cc);
            let cc = match k {
                BinaryOp::Eq => cmp(FloatCC::Equal),
                BinaryOp::Lt => cmp(FloatCC::LessThan),
                BinaryOp::Le => cmp(FloatCC::LessThanOrEqual),
                BinaryOp::Gt => cmp(FloatCC::GreaterThan),
                BinaryOp::Ge => cmp(FloatCC::GreaterThanOrEqual),
                _ => None,
            };
            if let Some(cc) = cc {
                return Ok((self.b.ins().fcmp(cc, a, b), DType::Bool));
            }
            let v = match k {
                BinaryOp::Add => self.b.ins().fadd(a, b),
                BinaryOp::Sub => self.b.ins().fsub(a, b),
                BinaryOp::Mul => self.b.ins().fmul(a, b),
                BinaryOp::Div => self.b.ins().fdiv(a, b),
                // Cranelift's fmax/fmin follow WebAssembly: NaN if either is NaN, and -0 below +0 — the
                // interpreter's IEEE 754-2019 maximum/minimum.
                BinaryOp::Max => self.b.ins().fmax(a, b),
                BinaryOp::Min => self.b.ins().fmin(a, b),
                BinaryOp::Pow => self.call_rt(if f64_ { RtFn::PowF64 } else { RtFn::PowF32 }, &[a, b]),
                BinaryOp::Mod => self.call_rt(if f64_ { RtFn::ModF64 } else { RtFn::ModF32 }, &[a, b]),
                BinaryOp::Rem => self.call_rt(if f64_ { RtFn::FmodF64 } else { RtFn::FmodF32 }, &[a, b]),
                _ => return Err(not_defined(self)),
            };
            return Ok((self.round_to(v, d), d));
        }
        if d == DType::Bool {
            let v = match k {
                BinaryOp::And => self.b.ins().band(a, b),
                BinaryOp::Or => self.b.ins().bor(a, b),
                BinaryOp::Xor => self.b.ins().bxor(a, b),
                BinaryOp::Eq => self.b.ins().icmp(IntCC::Equal, a, b),
                _ => return Err(not_defined(self)),
            };
            return Ok((v, d));
        }
        let unsigned = d.is_unsigned();
        let ty = reg_type(d);
        let pick = |s: IntCC, u: IntCC| if unsigned { u } else { s };
        let cc = match k {
            BinaryOp::Eq => Some(IntCC::Equal),
            BinaryOp::Lt => Some(pick(IntCC::SignedLessThan, IntCC::UnsignedLessThan)),
            BinaryOp::Le => Some(pick(IntCC::SignedLessThanOrEqual, IntCC::UnsignedLessThanOrEqual)),
            BinaryOp::Gt => Some(pick(IntCC::SignedGreaterThan, IntCC::UnsignedGreaterThan)),
            BinaryOp::Ge => Some(pick(IntCC::SignedGreaterThanOrEqual, IntCC::UnsignedGreaterThanOrEqual)),
            _ => None,
        };
        if let Some(cc) = cc {
            return Ok((self.b.ins().icmp(cc, a, b), DType::Bool));
        }
        let bits = ty.bits() as i64;
        let v = match k {
            BinaryOp::Add => self.b.ins().iadd(a, b),
            BinaryOp::Sub => self.b.ins().isub(a, b),
            BinaryOp::Mul => self.b.ins().imul(a, b),
            // Division by zero is an interpreter error; compiled code gives 0 rather than trapping.
            BinaryOp::Div => self.safe_divrem(a, b, !unsigned).0,
            BinaryOp::Rem => self.safe_divrem(a, b, !unsigned).1,
            BinaryOp::Mod => {
                let r = self.safe_divrem(a, b, !unsigned).1;
                if unsigned {
                    r
                } else {
                    let r_nz = self.b.ins().icmp_imm_s(IntCC::NotEqual, r, 0);
                    let r_neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, r, 0);
                    let b_neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, b, 0);
                    let differ = self.b.ins().bxor(r_neg, b_neg);
                    let adjust = self.b.ins().band(r_nz, differ);
                    let moved = self.b.ins().iadd(r, b);
                    self.b.ins().select(adjust, moved, r)
                }
            }
            BinaryOp::Max if unsigned => self.b.ins().umax(a, b),
            BinaryOp::Max => self.b.ins().smax(a, b),
            BinaryOp::Min if unsigned => self.b.ins().umin(a, b),
            BinaryOp::Min => self.b.ins().smin(a, b),
            BinaryOp::BitAnd => self.b.ins().band(a, b),
            BinaryOp::BitOr => self.b.ins().bor(a, b),
            BinaryOp::BitXor => self.b.ins().bxor(a, b),
            BinaryOp::Shl | BinaryOp::Shr => {
                // Out-of-range amounts (negative, or at least the width) are defined by the interpreter, not
                // masked as Cranelift's shifts mask them.
                let in_range = self.b.ins().icmp_imm_s(IntCC::UnsignedLessThan, b, bits);
                let zero = self.b.ins().iconst(ty, 0);
                if k == BinaryOp::Shl {
                    let s = self.b.ins().ishl(a, b);
                    self.b.ins().select(in_range, s, zero)
                } else if unsigned {
                    let s = self.b.ins().ushr(a, b);
                    self.b.ins().select(in_range, s, zero)
                } else {
                    let max = self.b.ins().iconst(ty, bits - 1);
                    let amount = self.b.ins().select(in_range, b, max);
                    self.b.ins().sshr(a, amount)
                }
            }
            BinaryOp::Pow => {
                let wide = |e: &mut Self, v: Value| match (ty == types::I64, unsigned) {
                    (true, _) => v,
                    (false, true) => e.b.ins().uextend(types::I64, v),
                    (false, false) => e.b.ins().sextend(types::I64, v),
                };
                let (x, y) = (wide(self, a), wide(self, b));
                let p = self.call_rt(RtFn::IPow, &[x, y]);
                if ty == types::I64 { p } else { self.b.ins().ireduce(ty, p) }
            }
            _ => return Err(not_defined(self)),
        };
        Ok((v, d))
    }

    /// `x` of dtype `from` converted to `to` with `cast` semantics.
    pub(crate) fn cast(&mut self, x: Value, from: DType, to: DType) -> Value {
        if from == to {
            return x;
        }
        let to_ty = reg_type(to);
        if to == DType::Bool {
            // `!= 0`; NaN is true.
            return if from.is_float() {
                let zero = self.fconst(reg_type(from), 0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
            } else {
                self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0)
            };
        }
        if from.is_float() {
            let from_ty = reg_type(from);
            return match to {
                DType::F32 => {
                    if from_ty == types::F64 {
                        self.b.ins().fdemote(types::F32, x)
                    } else {
                        x
                    }
                }
                DType::F64 => {
                    if from_ty == types::F32 {
                        self.b.ins().fpromote(types::F64, x)
                    } else {
                        x
                    }
                }
                DType::F16 | DType::BF16 => {
                    if from_ty == types::F64 {
                        self.call_rt(if to == DType::F16 { RtFn::F64ToF16 } else { RtFn::F64ToBf16 }, &[x])
                    } else {
                        // Exact f32 values: one rounding.
                        self.round_to(x, to)
                    }
                }
                DType::I32 | DType::I64 => self.b.ins().fcvt_to_sint_sat(to_ty, x),
                DType::U32 | DType::U64 => self.b.ins().fcvt_to_uint_sat(to_ty, x),
                _ => {
                    // 8- and 16-bit: saturate through i64, then clamp to the narrow range.
                    let w = self.b.ins().fcvt_to_sint_sat(types::I64, x);
                    let (lo, hi) = to.int_range().expect("an integer type: float, bool and wide ints are above");
                    let lo = self.b.ins().iconst(types::I64, lo as i64);
                    let hi = self.b.ins().iconst(types::I64, hi as i64);
                    let w = self.b.ins().smax(w, lo);
                    let w = self.b.ins().smin(w, hi);
                    self.b.ins().ireduce(to_ty, w)
                }
            };
        }
        // Integer or bool source: widen to its i64 value (u64: its bit pattern) first.
        let wide = match from {
            DType::I64 | DType::U64 => x,
            d if d.is_unsigned() || d == DType::Bool => self.b.ins().uextend(types::I64, x),
            _ => self.b.ins().sextend(types::I64, x),
        };
        match to {
            DType::F32 | DType::F64 if from == DType::U64 => self.b.ins().fcvt_from_uint(to_ty, wide),
            DType::F32 | DType::F64 => self.b.ins().fcvt_from_sint(to_ty, wide),
            DType::F16 | DType::BF16 if from == DType::U64 => {
                // The i64 helpers read a u64 at or above 2^63 as negative: halve such a value keeping the
                // dropped bit as a sticky bit (the rounding to 8 or 11 bits is the same), convert, double exactly.
                let big = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, wide, 0);
                let low = self.b.ins().band_imm_s(wide, 1);
                let half = self.b.ins().ushr_imm_s(wide, 1);
                let half = self.b.ins().bor(half, low);
                let arg = self.b.ins().select(big, half, wide);
                let r = self.call_rt(if to == DType::F16 { RtFn::I64ToF16 } else { RtFn::I64ToBf16 }, &[arg]);
                let doubled = self.b.ins().fadd(r, r);
                self.b.ins().select(big, doubled, r)
            }
            DType::F16 => self.call_rt(RtFn::I64ToF16, &[wide]),
            DType::BF16 => self.call_rt(RtFn::I64ToBf16, &[wide]),
            DType::I64 | DType::U64 => wide,
            _ => self.b.ins().ireduce(to_ty, wide),
        }
    }

    pub(crate) fn update(&mut self, acc: AccVar, value: &Expr, position: Option<&IExpr>) -> EResult<()> {
        let slot = *self.accs.get(&acc).expect("verified: accumulators are declared before their updates");
        let (v, d) = self.expr(value)?;
        debug_assert_eq!(d, slot.dtype, "verified: updates carry the accumulator's dtype");
        let cur = self.b.use_var(slot.value);
        let folded = match slot.op {
            AccOp::ArgMax { select_last } | AccOp::ArgMin { select_last } => {
                let max = matches!(slot.op, AccOp::ArgMax { .. });
                let pos = position.expect("verified: arg updates carry a position");
                let p = self.iexpr(pos)?;
                let replace = self.arg_replaces(max, select_last, v, cur, d);
                let cur_pos = self.b.use_var(slot.position);
                let new_pos = self.b.ins().select(replace, p, cur_pos);
                self.b.def_var(slot.position, new_pos);
                self.b.ins().select(replace, v, cur)
            }
            op => self.fold(op, cur, v, d)?,
        };
        self.b.def_var(slot.value, folded);
        Ok(())
    }

    /// `cur` combined with the candidate `v` by a value-only op (not an arg op), both of dtype `d`: the one
    /// step both the scalar update and the vector form's lane-by-lane fold use, so they agree bit for bit.
    pub(crate) fn fold(&mut self, op: AccOp, cur: Value, v: Value, d: DType) -> EResult<Value> {
        Ok(match op {
            AccOp::Sum => self.binary(BinaryOp::Add, cur, v, d)?.0,
            AccOp::Prod => self.binary(BinaryOp::Mul, cur, v, d)?.0,
            AccOp::Max if d == DType::Bool => self.b.ins().bor(cur, v),
            AccOp::Min if d == DType::Bool => self.b.ins().band(cur, v),
            AccOp::Max => self.binary(BinaryOp::Max, cur, v, d)?.0,
            AccOp::Min => self.binary(BinaryOp::Min, cur, v, d)?.0,
            AccOp::ArgMax { .. } | AccOp::ArgMin { .. } => {
                return Err(self.malformed(format!("{op:?} folded without a position")));
            }
        })
    }

    /// Whether candidate `c` displaces `best` (NaN is the extreme value; ties go to the later position when
    /// `last`), as the interpreter's `arg_reduce` decides.
    fn arg_replaces(&mut self, max: bool, last: bool, c: Value, best: Value, d: DType) -> Value {
        let last_v = self.b.ins().iconst(types::I8, i64::from(last));
        if d.is_float() {
            let c_nan = self.b.ins().fcmp(FloatCC::Unordered, c, c);
            let b_nan = self.b.ins().fcmp(FloatCC::Unordered, best, best);
            let beats = self.b.ins().fcmp(if max { FloatCC::GreaterThan } else { FloatCC::LessThan }, c, best);
            let eq = self.b.ins().fcmp(FloatCC::Equal, c, best);
            let tie = self.b.ins().band(eq, last_v);
            // Ordered comparisons are false when either is NaN, so this is the both-numbers rule.
            let numbers = self.b.ins().bor(beats, tie);
            let not_b_nan = self.b.ins().bxor_imm_s(b_nan, 1);
            let on_nan = self.b.ins().bor(last_v, not_b_nan);
            return self.b.ins().select(c_nan, on_nan, numbers);
        }
        let unsigned = d.is_unsigned() || d == DType::Bool;
        let cc = match (max, unsigned) {
            (true, false) => IntCC::SignedGreaterThan,
            (true, true) => IntCC::UnsignedGreaterThan,
            (false, false) => IntCC::SignedLessThan,
            (false, true) => IntCC::UnsignedLessThan,
        };
        let beats = self.b.ins().icmp(cc, c, best);
        let eq = self.b.ins().icmp(IntCC::Equal, c, best);
        let tie = self.b.ins().band(eq, last_v);
        self.b.ins().bor(beats, tie)
    }
}
