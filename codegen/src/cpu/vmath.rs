//! Inline f32x4 approximations of `exp`, `log`, `tanh`, `sigmoid` and `erf` for vector loops.
//!
//! `exp` (and `sigmoid`, built on it), `tanh` and `erf` cover every float without a branch: the argument is
//! clamped (a NaN lane passes through the clamps and the arithmetic and stays NaN), and `exp`'s `2^n` is applied as
//! two normal factors, so a subnormal result or an overflow to infinity comes out of the last multiplication. No
//! call and no per-lane path sits in a loop that uses them, whatever the data (a softmax over a masked row, whose
//! lanes reach -10000, runs at the speed of any other). `log` is guarded: when a lane is not a normal positive
//! float (zero, negative, subnormal, infinite, NaN) the whole group of four goes lane by lane through the exact
//! scalar runtime function. The polynomial coefficients of `exp` and `log` are published ones — Cephes'
//! single-precision library (S. Moshier) —, with Cody–Waite range reduction; `tanh`'s and `erf`'s are kiln's own
//! fits:
//! - `exp`: relative error below 2e-7 (1.2e-7 measured) where the result is normal; a subnormal result is within
//!   2e-7 of the smallest normal float (one rounding to the subnormal grid); 0 below -104, infinity above 88.73;
//! - `log` on normal positive floats: relative error below 2e-7 away from 1, absolute error below 1e-7 near 1;
//! - `tanh` on every float: below 3e-7 relative with FMA (4e-7 without): one rational function
//!   `x P(x^2) / Q(x^2)` of kiln's own fit on the argument clamped to ±9.1, the result clamped to [-1, 1] (exactly
//!   ±1 far out);
//! - `sigmoid`, as `1 / (1 + e^-x)` (the interpreter's formula): below 3e-7 relative (2.3e-7 measured) where the
//!   result is normal;
//! - `erf` on every float: below 3e-7 relative with FMA (2.9e-7 measured; 3.6e-7 without FMA): one
//!   rational function `x P(x^2) / Q(x^2)` of kiln's own fit below 3.92 in magnitude, exactly ±1 above.
//!
//! Where the target has fused multiply-add (FMA3), the polynomials' Horner steps use it (one rounding per step).
//! These bounds are checked on dense sweeps by the emitter's tests. Results may therefore differ from the scalar
//! tail (and the interpreter) in the last bit or two; everything else the vector form computes is exact.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{BlockArg, InstBuilder, MemFlagsData, Value, types};
use kiln_ir::DType;
use kiln_ir::op::UnaryOp;

use super::emit::{EResult, Emitter};
use crate::approx::{
    ERF_CLAMP, ERF_P, ERF_Q, EXP_CLAMP, EXP_P, LN2_HI, LN2_LO, LOG_P, LOG2_E, TANH_CLAMP, TANH_P, TANH_Q,
};

impl Emitter<'_, '_> {
    /// The inline approximation of `k` on `x`, if there is one for this target.
    pub(crate) fn vector_math(&mut self, k: UnaryOp, x: Value) -> Option<EResult<Value>> {
        // Range reduction rounds to nearest in vector registers.
        if !self.target.native_rounding {
            return None;
        }
        Some(match k {
            // No guard: these approximations cover every float (a NaN lane stays NaN through the arithmetic), so
            // the loop has no call in it and keeps its values in registers.
            UnaryOp::Exp => Ok(self.vexp(x)),
            UnaryOp::Sigmoid => {
                let n = self.b.ins().fneg(x);
                let t = self.vexp(n);
                let one = self.vconst(1.0);
                let d = self.b.ins().fadd(one, t);
                Ok(self.b.ins().fdiv(one, d))
            }
            UnaryOp::Tanh => Ok(self.vtanh(x)),
            UnaryOp::Erf => Ok(self.verf(x)),
            UnaryOp::Log => {
                let ok = self.in_range(x, f32::MIN_POSITIVE, f32::MAX);
                self.guarded(k, x, ok, |e, x| e.vlog(x))
            }
            _ => return None,
        })
    }

    pub(crate) fn vconst(&mut self, c: f32) -> Value {
        let s = self.b.ins().f32const(c);
        self.b.ins().splat(types::F32X4, s)
    }

    fn iconst4(&mut self, c: i64) -> Value {
        let s = self.b.ins().iconst(types::I32, c);
        self.b.ins().splat(types::I32X4, s)
    }

    /// Lanes where `lo <= x <= hi` (false for NaN), as an i32x4 mask.
    fn in_range(&mut self, x: Value, lo: f32, hi: f32) -> Value {
        let l = self.vconst(lo);
        let h = self.vconst(hi);
        let a = self.b.ins().fcmp(FloatCC::GreaterThanOrEqual, x, l);
        let b = self.b.ins().fcmp(FloatCC::LessThanOrEqual, x, h);
        self.b.ins().band(a, b)
    }

    /// `fast(x)` when every lane of `ok` is set, else the exact scalar `k` lane by lane.
    fn guarded(
        &mut self,
        k: UnaryOp,
        x: Value,
        ok: Value,
        fast: impl FnOnce(&mut Self, Value) -> Value,
    ) -> EResult<Value> {
        let all = self.b.ins().vall_true(ok);
        let fast_block = self.b.create_block();
        let slow_block = self.b.create_block();
        let merge = self.b.create_block();
        self.b.append_block_param(merge, types::F32X4);
        self.b.ins().brif(all, fast_block, &[], slow_block, &[]);
        self.b.switch_to_block(fast_block);
        self.b.seal_block(fast_block);
        let v = fast(self, x);
        self.b.ins().jump(merge, &[BlockArg::Value(v)]);
        self.b.switch_to_block(slow_block);
        self.b.seal_block(slow_block);
        let v = self.per_lane(|e, l| Ok(e.unary(k, l, DType::F32)?.0), x)?;
        self.b.ins().jump(merge, &[BlockArg::Value(v)]);
        self.b.switch_to_block(merge);
        self.b.seal_block(merge);
        Ok(self.b.block_params(merge)[0])
    }

    /// `p(x)` by Horner's rule, coefficients highest degree first.
    fn horner(&mut self, x: Value, coeffs: &[f32]) -> Value {
        let mut acc = self.vconst(coeffs[0]);
        for &c in &coeffs[1..] {
            let c = self.vconst(c);
            acc = if self.target.fused_multiply_add {
                // One rounding per step instead of two: as accurate or better, and half the instructions.
                self.b.ins().fma(acc, x, c)
            } else {
                let m = self.b.ins().fmul(acc, x);
                self.b.ins().fadd(m, c)
            };
        }
        acc
    }

    /// `min(hi, max(lo, x))` lane by lane, a NaN lane passing through (`minps`/`maxps`-shaped selects).
    fn clamp_keep_nan(&mut self, x: Value, lo: f32, hi: f32) -> Value {
        let (hi, lo) = (self.vconst(hi), self.vconst(lo));
        // min(hi, x): `hi < x ? hi : x`, NaN → x.
        let above = self.b.ins().fcmp(FloatCC::LessThan, hi, x);
        let x = self.select_mask(above, hi, x);
        // max(lo, x): `x < lo ? lo : x`, NaN → x.
        let below = self.b.ins().fcmp(FloatCC::LessThan, x, lo);
        self.select_mask(below, lo, x)
    }

    /// `e^x` for every lane: the argument clamped to [`EXP_CLAMP`], `2^n` applied as two normal factors.
    fn vexp(&mut self, x: Value) -> Value {
        let x = self.clamp_keep_nan(x, EXP_CLAMP.0, EXP_CLAMP.1);
        let log2e = self.vconst(LOG2_E);
        let t = self.b.ins().fmul(x, log2e);
        let n = self.b.ins().nearest(t);
        let hi = self.vconst(LN2_HI);
        let lo = self.vconst(LN2_LO);
        let a = self.b.ins().fmul(n, hi);
        let r = self.b.ins().fsub(x, a);
        let a = self.b.ins().fmul(n, lo);
        let r = self.b.ins().fsub(r, a);
        let z = self.b.ins().fmul(r, r);
        let p = self.horner(r, &EXP_P);
        let p = self.b.ins().fmul(p, z);
        let p = self.b.ins().fadd(p, r);
        let one = self.vconst(1.0);
        let p = self.b.ins().fadd(p, one);
        // 2^n = 2^n1 · 2^n2 with n1 = n >> 1, both normal: n is in [-150, 129] on the clamped range (0 for a
        // NaN lane, whose p is NaN).
        let ni = self.b.ins().fcvt_to_sint_sat(types::I32X4, n);
        let n1 = self.b.ins().sshr_imm_s(ni, 1);
        let n2 = self.b.ins().isub(ni, n1);
        let s1 = self.pow2(n1);
        let s2 = self.pow2(n2);
        let p = self.b.ins().fmul(p, s1);
        self.b.ins().fmul(p, s2)
    }

    /// `2^n` for i32 lanes `n` in [-126, 127], from its exponent bits.
    fn pow2(&mut self, n: Value) -> Value {
        let bias = self.iconst4(127);
        let e = self.b.ins().iadd(n, bias);
        let e = self.b.ins().ishl_imm_s(e, 23);
        let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
        self.b.ins().bitcast(types::F32X4, flags, e)
    }

    /// `tanh(x)` for every lane (NaN in, NaN out): one rational function, `x P(x^2) / Q(x^2)`, of the argument
    /// clamped to ±[`TANH_CLAMP`], the result clamped to [-1, 1] (so exactly ±1 far out). No `exp`, one division.
    fn vtanh(&mut self, x: Value) -> Value {
        let x = self.clamp_keep_nan(x, -TANH_CLAMP, TANH_CLAMP);
        let z = self.b.ins().fmul(x, x);
        let p = self.horner(z, &TANH_P);
        let q = self.horner(z, &TANH_Q);
        let num = self.b.ins().fmul(x, p);
        let y = self.b.ins().fdiv(num, q);
        self.clamp_keep_nan(y, -1.0, 1.0)
    }

    /// `erf(x)` for every lane (NaN in, NaN out): one rational function, `x P(x^2) / Q(x^2)`, of the argument
    /// clamped to ±4, where that function is exactly ±1 in f32. One division, no `exp` and no select: the clamps
    /// are `minps`/`maxps` (Cranelift matches `pmin`/`pmax`-shaped selects), whose operand order lets a NaN lane
    /// through.
    fn verf(&mut self, x: Value) -> Value {
        let x = self.clamp_keep_nan(x, -ERF_CLAMP, ERF_CLAMP);
        let z = self.b.ins().fmul(x, x);
        let p = self.horner(z, &ERF_P);
        let q = self.horner(z, &ERF_Q);
        let num = self.b.ins().fmul(x, p);
        self.b.ins().fdiv(num, q)
    }

    /// `ln(x)` for normal positive finite lanes.
    fn vlog(&mut self, x: Value) -> Value {
        let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
        let bits = self.b.ins().bitcast(types::I32X4, flags, x);
        // x = m * 2^e with m in [0.5, 1).
        let e = self.b.ins().ushr_imm_s(bits, 23);
        let bias = self.iconst4(126);
        let e = self.b.ins().isub(e, bias);
        let mask = self.iconst4(0x807F_FFFF);
        let m = self.b.ins().band(bits, mask);
        let half = self.iconst4(0x3F00_0000);
        let m = self.b.ins().bor(m, half);
        let m = self.b.ins().bitcast(types::F32X4, flags, m);
        let e = self.b.ins().fcvt_from_sint(types::F32X4, e);
        // Below sqrt(1/2), use 2m - 1 and e - 1, so the reduced argument lies in [sqrt(1/2) - 1, sqrt(2) - 1).
        let sqrt_half = self.vconst(std::f32::consts::FRAC_1_SQRT_2);
        let below = self.b.ins().fcmp(FloatCC::LessThan, m, sqrt_half);
        let one = self.vconst(1.0);
        let zero = self.vconst(0.0);
        let m2 = self.b.ins().fadd(m, m);
        let shifted = self.select_mask(below, m2, m);
        let r = self.b.ins().fsub(shifted, one);
        let dec = self.select_mask(below, one, zero);
        let e = self.b.ins().fsub(e, dec);
        let z = self.b.ins().fmul(r, r);
        let p = self.horner(r, &LOG_P);
        let p = self.b.ins().fmul(p, r);
        let y = self.b.ins().fmul(p, z);
        let lo = self.vconst(LN2_LO);
        let t = self.b.ins().fmul(e, lo);
        let y = self.b.ins().fadd(y, t);
        let h = self.vconst(0.5);
        let t = self.b.ins().fmul(z, h);
        let y = self.b.ins().fsub(y, t);
        let y = self.b.ins().fadd(r, y);
        let hi = self.vconst(LN2_HI);
        let t = self.b.ins().fmul(e, hi);
        self.b.ins().fadd(y, t)
    }
}
