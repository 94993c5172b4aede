//! Exact float remainders for the NVPTX emitter: `rem` is C's `fmod` (Rust's `%` on floats), `mod` is Python's
//! `%` built on it (the interpreter's float `mod`, as the CPU runtime's `python_mod`). LLVM would lower `frem` on
//! NVPTX to `x - trunc(x/y) * y`, which is not exact; this is musl's `fmodf`/`fmod` in integer arithmetic: the
//! mantissas are normalized, then reduced by shift-and-subtract once per binade of `|x| / |y|` (at most 277
//! steps on f32, 2098 on f64), so the result is exact, as `fmod`'s always is.

use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

use super::emit::{KernelEmitter, R};

impl<'ctx> KernelEmitter<'_, 'ctx> {
    /// `fmod(x, y)` on f32 or f64, exactly.
    pub(super) fn fmod(&mut self, x: FloatValue<'ctx>, y: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let f64_ = x.get_type() == self.ctx.f64_type();
        let (w, m) = if f64_ { (64u64, 52u64) } else { (32, 23) };
        let ity = if f64_ { self.ctx.i64_type() } else { self.ctx.i32_type() };
        let i64t = self.ctx.i64_type();
        let k = |v: u64| ity.const_int(v, false);
        let emax = (1u64 << (w - m - 1)) - 1;
        let sign_mask = 1u64 << (w - 1);
        let ux = self.b.build_bit_cast(x, ity, "ux")?.into_int_value();
        let uy = self.b.build_bit_cast(y, ity, "uy")?.into_int_value();
        let sx = self.b.build_and(ux, k(sign_mask), "sx")?;
        let ax = self.b.build_and(ux, k(sign_mask - 1), "ax")?;
        let ay = self.b.build_and(uy, k(sign_mask - 1), "ay")?;
        let ex = self.b.build_right_shift(ax, k(m), false, "ex")?;
        let ey = self.b.build_right_shift(ay, k(m), false, "ey")?;
        // NaN for y = ±0, y NaN, x infinite or NaN.
        let y_zero = self.b.build_int_compare(IntPredicate::EQ, ay, k(0), "y0")?;
        let y_nan = self.b.build_float_compare(FloatPredicate::UNO, y, y, "ynan")?;
        let x_special = self.b.build_int_compare(IntPredicate::EQ, ex, k(emax), "xsp")?;
        let nan_result = self.b.build_or(y_zero, y_nan, "nanr")?;
        let nan_result = self.b.build_or(nan_result, x_special, "nanr")?;
        // |x| <= |y|: x itself, or a zero of x's sign when equal.
        let not_bigger = self.b.build_int_compare(IntPredicate::ULE, ax, ay, "le")?;
        let equal = self.b.build_int_compare(IntPredicate::EQ, ax, ay, "eq")?;
        // Mantissas with their leading bit at position m, exponents as i64 (subnormals normalized below 1).
        let (mx, ex) = self.normalized(ax, ex, m, w)?;
        let (my, ey) = self.normalized(ay, ey, m, w)?;
        let acc = self.entry_alloca(ity.into(), "fmod_mx")?;
        let zero_flag = self.entry_alloca(self.ctx.bool_type().into(), "fmod_zero")?;
        self.b.build_store(acc, mx)?;
        self.b.build_store(zero_flag, self.ctx.bool_type().const_zero())?;
        let steps = self.b.build_int_sub(ex, ey, "steps")?;
        let (start, one) = (i64t.const_zero(), i64t.const_int(1, false));
        // Shift-and-subtract once per binade; the loop runs 0 times when ex <= ey.
        self.counted_loop(start, steps, one, "fmod", |e, _| {
            let mx = e.b.build_load(ity, acc, "mx")?.into_int_value();
            let d = e.b.build_int_sub(mx, my, "d")?;
            let fits = e.b.build_int_compare(IntPredicate::SGE, d, k(0), "fits")?;
            let exact = e.b.build_int_compare(IntPredicate::EQ, d, k(0), "exact")?;
            let zero = e.b.build_load(e.ctx.bool_type(), zero_flag, "z")?.into_int_value();
            let now_zero = e.b.build_or(zero, exact, "nz")?;
            e.b.build_store(zero_flag, now_zero)?;
            let mx = e.b.build_select(fits, d, mx, "mx")?.into_int_value();
            let mx = e.b.build_left_shift(mx, k(1), "mx")?;
            e.b.build_store(acc, mx)?;
            Ok(())
        })?;
        let mx = self.b.build_load(ity, acc, "mx")?.into_int_value();
        let d = self.b.build_int_sub(mx, my, "d")?;
        let fits = self.b.build_int_compare(IntPredicate::SGE, d, k(0), "fits")?;
        let exact = self.b.build_int_compare(IntPredicate::EQ, d, k(0), "exact")?;
        let zero = self.b.build_load(self.ctx.bool_type(), zero_flag, "z")?.into_int_value();
        let zero = self.b.build_or(zero, exact, "zero")?;
        let mx = self.b.build_select(fits, d, mx, "mx")?.into_int_value();
        let ex = {
            let later = self.b.build_int_compare(IntPredicate::SGT, ex, ey, "later")?;
            self.b.build_select(later, ey, ex, "ex")?.into_int_value()
        };
        // Renormalize: bring the leading bit back to position m (mx is nonzero unless `zero`).
        let safe = self.b.build_select(zero, k(1 << m), mx, "safe")?.into_int_value();
        let ctlz = format!("llvm.ctlz.i{w}");
        let lz =
            self.call(&ctlz, &[safe.into(), self.ctx.bool_type().const_zero().into()], ity.into())?.into_int_value();
        let shift = self.b.build_int_sub(lz, k(w - 1 - m), "shift")?;
        let mx = self.b.build_left_shift(safe, shift, "mx")?;
        let shift64 = self.b.build_int_z_extend_or_bit_cast(shift, i64t, "shift64")?;
        let ex = self.b.build_int_sub(ex, shift64, "ex")?;
        // Scale back: a normal result gets its exponent, a subnormal one is shifted down (exactly).
        let normal = self.b.build_int_compare(IntPredicate::SGT, ex, i64t.const_zero(), "normal")?;
        let ex_bits = self.b.build_int_truncate_or_bit_cast(ex, ity, "exb")?;
        let ex_bits = self.b.build_left_shift(ex_bits, k(m), "exb")?;
        let frac = self.b.build_int_sub(mx, k(1 << m), "frac")?;
        let normal_bits = self.b.build_or(frac, ex_bits, "nb")?;
        let down = self.b.build_int_sub(i64t.const_int(1, false), ex, "down")?;
        // `down` is at least 1 where used; clamp it below the width so the unused arm is no poison.
        let down = self.b.build_int_truncate_or_bit_cast(down, ity, "down")?;
        let in_range = self.b.build_int_compare(IntPredicate::ULT, down, k(w), "inr")?;
        let down = self.b.build_select(in_range, down, k(w - 1), "down")?.into_int_value();
        let sub_bits = self.b.build_right_shift(mx, down, false, "sb")?;
        let bits = self.b.build_select(normal, normal_bits, sub_bits, "bits")?.into_int_value();
        let bits = self.b.build_or(bits, sx, "bits")?;
        let r = self.b.build_bit_cast(bits, x.get_type(), "r")?.into_float_value();
        // Zero results keep x's sign.
        let signed_zero = self.b.build_bit_cast(sx, x.get_type(), "sz")?.into_float_value();
        let r = self.b.build_select(zero, signed_zero, r, "r")?.into_float_value();
        let r = self.b.build_select(not_bigger, x, r, "r")?.into_float_value();
        let r = self.b.build_select(equal, signed_zero, r, "r")?.into_float_value();
        let nan = x.get_type().const_float(f64::NAN);
        Ok(self.b.build_select(nan_result, nan, r, "fmod")?.into_float_value())
    }

    /// The mantissa of the magnitude bits `a` with its leading bit at position `m`, and the matching exponent
    /// (as i64; below 1 for a subnormal).
    fn normalized(
        &mut self,
        a: IntValue<'ctx>,
        e: IntValue<'ctx>,
        m: u64,
        w: u64,
    ) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let ity = a.get_type();
        let i64t = self.ctx.i64_type();
        let k = |v: u64| ity.const_int(v, false);
        let e64 = self.b.build_int_z_extend_or_bit_cast(e, i64t, "e64")?;
        let mant = self.b.build_and(a, k((1 << m) - 1), "mant")?;
        let normal_m = self.b.build_or(mant, k(1 << m), "nm")?;
        // Subnormal: shift the leading bit up to position m; the exponent drops by the same amount less one.
        let safe = self.b.build_select(self.b.build_int_compare(IntPredicate::EQ, a, k(0), "a0")?, k(1), a, "safe")?;
        let ctlz = format!("llvm.ctlz.i{w}");
        let lz = self.call(&ctlz, &[safe, self.ctx.bool_type().const_zero().into()], ity.into())?.into_int_value();
        let shift = self.b.build_int_sub(lz, k(w - 1 - m), "shift")?;
        let sub_m = self.b.build_left_shift(safe.into_int_value(), shift, "sm")?;
        let shift64 = self.b.build_int_z_extend_or_bit_cast(shift, i64t, "shift64")?;
        let sub_e = self.b.build_int_sub(i64t.const_int(1, false), shift64, "se")?;
        let is_sub = self.b.build_int_compare(IntPredicate::EQ, e, k(0), "sub")?;
        let mant = self.b.build_select(is_sub, sub_m, normal_m, "m")?.into_int_value();
        let exp = self.b.build_select(is_sub, sub_e, e64, "e")?.into_int_value();
        Ok((mant, exp))
    }

    /// Python's `%` on floats: `fmod` moved into the divisor's sign, a zero result taking the divisor's sign.
    pub(super) fn python_mod(&mut self, x: FloatValue<'ctx>, y: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let r = self.fmod(x, y)?;
        let zero = x.get_type().const_float(0.0);
        let is_zero = self.b.build_float_compare(FloatPredicate::OEQ, r, zero, "r0")?;
        let r_neg = self.b.build_float_compare(FloatPredicate::OLT, r, zero, "rneg")?;
        let y_neg = self.b.build_float_compare(FloatPredicate::OLT, y, zero, "yneg")?;
        let differ = self.b.build_xor(r_neg, y_neg, "differ")?;
        let moved = self.b.build_float_add(r, y, "moved")?;
        let v = self.b.build_select(differ, moved, r, "v")?.into_float_value();
        let ity = if x.get_type() == self.ctx.f64_type() { self.ctx.i64_type() } else { self.ctx.i32_type() };
        let ybits = self.b.build_bit_cast(y, ity, "yb")?.into_int_value();
        let sign = self.b.build_and(ybits, ity.const_int(1u64 << (ity.get_bit_width() - 1), false), "ys")?;
        let signed_zero = self.b.build_bit_cast(sign, x.get_type(), "sz")?.into_float_value();
        Ok(self.b.build_select(is_zero, signed_zero, v, "mod")?.into_float_value())
    }
}
