//! Warp-cooperative rows: a parallel nest whose body reduces (a softmax, a layer norm, a row sum) runs one row
//! per warp instead of one row per thread. The 32 lanes split each inner loop of the row — lane `l` takes
//! iterations `l, l + 32, …` — and after each reduction loop they combine their partial accumulators with a
//! butterfly of warp shuffles (`shfl.sync.bfly`, offsets 16, 8, 4, 2, 1), after which every lane holds the row's
//! result and goes on with it; stores outside inner loops are made by lane 0. Rows are distributed over the
//! grid's warps with a grid-stride loop.
//!
//! Folding order changes (lane-strided partials, then a tree), which the kernel IR allows for reduction loops
//! (`LoopKind::Reduction`): floats are no longer bit-exact with the sequential fold. The ops are commutative, so
//! every lane ends with the same bits. Eligible rows: every inner loop is innermost (no nested loops), a
//! reduction loop only updates accumulators of value ops (no arg-max/min) and never reads them, no inner
//! parallel loop updates an accumulator, and no `Serial` loop; anything else keeps one thread per row.

use std::collections::HashSet;

use inkwell::IntPredicate;
use inkwell::values::{BasicValueEnum, IntValue};
use kiln_ir::DType;

use super::emit::{Flavor, KernelEmitter, R};
use crate::kernel::{AccVar, Block, Expr, LoopKind, Stmt};

/// Lanes of a warp.
pub(crate) const WARP: u64 = 32;

/// The host function standing in for `shfl.sync.bfly.b32` in the emulation module.
pub(crate) const EMU_SHUFFLE: &str = "kiln_emu_shfl_bfly_i32";

/// Whether the row body `b` (the innermost body of a flattened parallel nest) runs warp-cooperatively.
pub(super) fn eligible(b: &Block) -> bool {
    let mut arg_accs = HashSet::new();
    let mut reduces = false;
    for s in &b.0 {
        match s {
            Stmt::Let { .. } | Stmt::Store { .. } => {}
            Stmt::Acc { var, op, .. } => {
                if op.is_arg() {
                    arg_accs.insert(*var);
                }
            }
            Stmt::Update { .. } => return false,
            Stmt::For { kind: LoopKind::Serial, .. } => return false,
            Stmt::For { kind: LoopKind::Reduction, body, .. } => {
                let updated = updated_accs(body);
                let ok = body.0.iter().all(|s| match s {
                    Stmt::Let { value, .. } => !reads_any(value, &updated),
                    Stmt::Update { acc, value, position } => {
                        position.is_none() && !arg_accs.contains(acc) && !reads_any(value, &updated)
                    }
                    _ => false,
                });
                if !ok {
                    return false;
                }
                reduces = true;
            }
            Stmt::For { body, .. } => {
                if !body.0.iter().all(|s| matches!(s, Stmt::Let { .. } | Stmt::Store { .. })) {
                    return false;
                }
            }
        }
    }
    reduces
}

/// The accumulators a loop body updates, in first-update order.
fn updated_accs(b: &Block) -> Vec<AccVar> {
    let mut out = Vec::new();
    for s in &b.0 {
        if let Stmt::Update { acc, .. } = s
            && !out.contains(acc)
        {
            out.push(*acc);
        }
    }
    out
}

fn reads_any(e: &Expr, accs: &[AccVar]) -> bool {
    match e {
        Expr::Acc(a) => accs.contains(a),
        Expr::Const(_) | Expr::Load { .. } | Expr::Var(_) | Expr::Index { .. } | Expr::Cond(_) => false,
        Expr::Unary(_, x) | Expr::Cast(x, _) => reads_any(x, accs),
        Expr::Binary(_, a, b) => reads_any(a, accs) || reads_any(b, accs),
        Expr::Select(c, a, b) => reads_any(c, accs) || reads_any(a, accs) || reads_any(b, accs),
    }
}

impl<'ctx> KernelEmitter<'_, 'ctx> {
    /// Emits an eligible row body for the warp whose lane this thread is.
    pub(super) fn warp_row(&mut self, b: &Block, lane: IntValue<'ctx>) -> R<()> {
        let i64t = self.ctx.i64_type();
        let step = i64t.const_int(WARP, false);
        for s in &b.0 {
            match s {
                Stmt::Let { .. } | Stmt::Acc { .. } => self.stmt(s)?,
                Stmt::Store { .. } => {
                    let zero = i64t.const_zero();
                    let first = self.b.build_int_compare(IntPredicate::EQ, lane, zero, "lane0")?;
                    let then = self.ctx.append_basic_block(self.func, "lane0_store");
                    let done = self.ctx.append_basic_block(self.func, "lane0_done");
                    self.b.build_conditional_branch(first, then, done)?;
                    self.b.position_at_end(then);
                    self.stmt(s)?;
                    self.b.build_unconditional_branch(done)?;
                    self.b.position_at_end(done);
                }
                Stmt::For { var, extent, kind, body } => {
                    let n = self.iexpr(extent)?;
                    let accs = if *kind == LoopKind::Reduction { updated_accs(body) } else { Vec::new() };
                    // Each lane folds its iterations from the identity; the value before the loop is folded in
                    // once, after the warp has combined the partials.
                    let mut before = Vec::new();
                    for a in &accs {
                        let slot = self.accs[a];
                        let ty = self.reg_type(slot.dtype);
                        before.push(self.b.build_load(ty, slot.value, "before")?);
                        let identity = self.scalar_const(slot.op.identity(slot.dtype))?;
                        self.b.build_store(slot.value, identity)?;
                    }
                    let var = *var;
                    self.counted_loop(lane, n, step, &format!("lane_i{}", var.0), |e, i| {
                        e.loops.insert(var, i);
                        e.block(body)
                    })?;
                    for (a, pre) in accs.iter().zip(before) {
                        let slot = self.accs[a];
                        let ty = self.reg_type(slot.dtype);
                        let mut v = self.b.build_load(ty, slot.value, "partial")?;
                        for offset in [16u64, 8, 4, 2, 1] {
                            let other = self.shuffle_xor(v, slot.dtype, offset)?;
                            v = self.fold(slot.op, v, other, slot.dtype)?;
                        }
                        let v = self.fold(slot.op, pre, v, slot.dtype)?;
                        self.b.build_store(slot.value, v)?;
                    }
                }
                Stmt::Update { .. } => return Err(self.malformed("an update outside a loop in a warp row".into())),
            }
        }
        Ok(())
    }

    /// The value `v` (of dtype `d`) of the lane `lane ^ offset`.
    fn shuffle_xor(&mut self, v: BasicValueEnum<'ctx>, d: DType, offset: u64) -> R<BasicValueEnum<'ctx>> {
        let i32t = self.ctx.i32_type();
        let i64t = self.ctx.i64_type();
        Ok(match d {
            DType::F32 | DType::F16 | DType::BF16 => {
                let bits = self.b.build_bit_cast(v, i32t, "bits")?.into_int_value();
                let o = self.shuffle_i32(bits, offset)?;
                self.b.build_bit_cast(o, self.ctx.f32_type(), "f")?
            }
            DType::F64 | DType::I64 => {
                let bits = self.b.build_bit_cast(v, i64t, "bits")?.into_int_value();
                let lo = self.b.build_int_truncate(bits, i32t, "lo")?;
                let hi = self.b.build_right_shift(bits, i64t.const_int(32, false), false, "hi")?;
                let hi = self.b.build_int_truncate(hi, i32t, "hi")?;
                let lo = self.shuffle_i32(lo, offset)?;
                let hi = self.shuffle_i32(hi, offset)?;
                let lo = self.b.build_int_z_extend(lo, i64t, "lo")?;
                let hi = self.b.build_int_z_extend(hi, i64t, "hi")?;
                let hi = self.b.build_left_shift(hi, i64t.const_int(32, false), "hi")?;
                let bits = self.b.build_or(lo, hi, "bits")?;
                self.b.build_bit_cast(bits, self.reg_type(d), "v")?
            }
            DType::I32 => self.shuffle_i32(v.into_int_value(), offset)?.into(),
            DType::I8 | DType::U8 | DType::Bool => {
                let x = v.into_int_value();
                let w = self.b.build_int_z_extend(x, i32t, "w")?;
                let o = self.shuffle_i32(w, offset)?;
                self.b.build_int_truncate(o, x.get_type(), "n")?.into()
            }
        })
    }

    /// `shfl.sync.bfly.b32` over the full warp (the host function standing in for it when emulating).
    fn shuffle_i32(&mut self, v: IntValue<'ctx>, offset: u64) -> R<IntValue<'ctx>> {
        let i32t = self.ctx.i32_type();
        let lane_mask = i32t.const_int(offset, false);
        let r = match self.flavor {
            Flavor::Nvptx => {
                let full = i32t.const_all_ones();
                let clamp = i32t.const_int(WARP - 1, false);
                self.call(
                    "llvm.nvvm.shfl.sync.bfly.i32",
                    &[full.into(), v.into(), lane_mask.into(), clamp.into()],
                    i32t.into(),
                )?
            }
            Flavor::Host => self.call(EMU_SHUFFLE, &[v.into(), lane_mask.into()], i32t.into())?,
        };
        Ok(r.into_int_value())
    }
}
