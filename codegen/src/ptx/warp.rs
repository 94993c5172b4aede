//! Cooperative reductions. A parallel nest whose body reduces (a softmax, a layer norm, a row sum) runs one row
//! per warp instead of one row per thread; a serial part that reduces (the whole top-level work is a reduction,
//! such as a sum over a whole tensor) runs on block 0 with all its threads.
//!
//! Per warp: The 32 lanes split each inner loop of the row — lane `l` takes
//! iterations `l, l + 32, …` — and after each reduction loop they combine their partial accumulators with a
//! butterfly of warp shuffles (`shfl.sync.bfly`, offsets 16, 8, 4, 2, 1), after which every lane holds the row's
//! result and goes on with it; stores outside inner loops are made by lane 0. Rows are distributed over the
//! grid's warps with a grid-stride loop.
//!
//! For a block, the threads split the loops by their index in the block, each warp combines as above, lane 0 of
//! every warp puts its warp's value in shared memory, and after a barrier every warp loads the (at most 32)
//! values and combines them with the same butterfly, so every thread holds the block's value; a second barrier
//! frees the shared slots for the next reduction. Stores are made by thread 0.
//!
//! Folding order changes (lane-strided partials, then a tree), which the kernel IR allows for reduction loops
//! (`LoopKind::Reduction`): floats are no longer bit-exact with the sequential fold. The ops are commutative, so
//! every lane ends with the same bits. Eligible rows: every inner loop is a perfect nest of one kind (reduction
//! or parallel; its flattened iteration space is split), a reduction only updates accumulators of value ops (no
//! arg-max/min) and never reads them, no parallel loop updates an accumulator, and no `Serial` loop; anything
//! else keeps one thread per row (or thread 0 for a serial part).

use std::collections::HashSet;

use inkwell::module::Linkage;
use inkwell::values::{BasicValueEnum, IntValue, PointerValue};
use inkwell::{AddressSpace, IntPredicate};
use kiln_ir::DType;

use super::emit::{Flavor, KernelEmitter, R};
use crate::kernel::{AccOp, AccVar, Block, Expr, LoopKind, Stmt};

/// Lanes of a warp.
pub(crate) const WARP: u64 = 32;

/// The host function standing in for `shfl.sync.bfly.b32` in the emulation module.
pub(crate) const EMU_SHUFFLE: &str = "kiln_emu_shfl_bfly_i32";

/// The host function standing in for `bar.sync 0` in the emulation module.
pub(crate) const EMU_BARRIER: &str = "kiln_emu_barrier";

/// Reductions shorter than this (a trip count known when compiling) stay sequential in one thread: a warp on a
/// 3×3 window would leave most lanes idle and pay its shuffles for nothing.
pub(crate) const MIN_COOPERATIVE_TRIPS: i64 = 2 * WARP as i64;

/// Whether the statements `stmts` (a row: the innermost body of a flattened parallel nest, or a serial part)
/// run cooperatively: they reduce, in a form lanes can share, and no reduction is known to be short.
pub(super) fn eligible<'s>(stmts: impl IntoIterator<Item = &'s Stmt>) -> bool {
    let mut arg_accs = HashSet::new();
    let mut reduces = false;
    for s in stmts {
        match s {
            Stmt::Let { .. } | Stmt::Store { .. } => {}
            Stmt::Acc { var, op, .. } => {
                if op.is_arg() {
                    arg_accs.insert(*var);
                }
            }
            Stmt::Update { .. } => return false,
            Stmt::For { kind: LoopKind::Serial, .. } => return false,
            Stmt::For { kind: LoopKind::Reduction, .. } => {
                let (loops, body) = reduction_nest(s);
                let trips = loops.iter().try_fold(1i64, |n, (_, e)| match e {
                    crate::kernel::IExpr::Const(c) => Some(n.saturating_mul(*c)),
                    _ => None,
                });
                if trips.is_some_and(|t| t < MIN_COOPERATIVE_TRIPS) {
                    return false;
                }
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
            Stmt::For { .. } => {
                let (_, body) = super::emit::flatten(s);
                if !body.0.iter().all(|s| matches!(s, Stmt::Let { .. } | Stmt::Store { .. })) {
                    return false;
                }
            }
        }
    }
    reduces
}

/// Who cooperates on a row, as seen by this thread.
pub(super) struct Coop<'ctx> {
    /// This thread's index among the cooperating threads (its lane, or its index in the block).
    index: IntValue<'ctx>,
    /// How many threads cooperate.
    count: IntValue<'ctx>,
    /// For a block: this thread's lane, its warp in the block, the block's warps, the shared slots.
    block: Option<BlockScope<'ctx>>,
}

struct BlockScope<'ctx> {
    lane: IntValue<'ctx>,
    warp: IntValue<'ctx>,
    warps: IntValue<'ctx>,
    shared: PointerValue<'ctx>,
}

/// A reduction loop and the perfectly nested reduction loops inside it (a reduction over several axes), and the
/// innermost body: the threads split the nest's flattened iteration space.
fn reduction_nest(s: &Stmt) -> (Vec<(crate::kernel::LoopVar, &crate::kernel::IExpr)>, &Block) {
    super::emit::flatten_where(s, |k| k == LoopKind::Reduction)
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
    /// The cooperation of the warp of global thread `gtid`.
    pub(super) fn warp_scope(&mut self, gtid: IntValue<'ctx>) -> R<Coop<'ctx>> {
        let i64t = self.ctx.i64_type();
        let lane = self.b.build_and(gtid, i64t.const_int(WARP - 1, false), "lane")?;
        Ok(Coop { index: lane, count: i64t.const_int(WARP, false), block: None })
    }

    /// The cooperation of a block, for thread `tid` of `ntid` (a multiple of 32, at most 1024).
    pub(super) fn block_scope(&mut self, tid: IntValue<'ctx>, ntid: IntValue<'ctx>) -> R<Coop<'ctx>> {
        let i64t = self.ctx.i64_type();
        let five = i64t.const_int(5, false);
        let lane = self.b.build_and(tid, i64t.const_int(WARP - 1, false), "lane")?;
        let warp = self.b.build_right_shift(tid, five, false, "warp")?;
        let warps = self.b.build_right_shift(ntid, five, false, "warps")?;
        let shared = self.shared_slots()?;
        Ok(Coop { index: tid, count: ntid, block: Some(BlockScope { lane, warp, warps, shared }) })
    }

    /// The kernel's 32 shared-memory slots of 8 bytes (address space 3 on the GPU; a plain global when
    /// emulating, where the blocks run in turn).
    fn shared_slots(&mut self) -> R<PointerValue<'ctx>> {
        let name = format!("{}_shared", self.func.get_name().to_string_lossy());
        if let Some(g) = self.module.get_global(&name) {
            return Ok(g.as_pointer_value());
        }
        let ty = self.ctx.i64_type().array_type(WARP as u32);
        let g = match self.flavor {
            Flavor::Nvptx => {
                let g = self.module.add_global(ty, Some(AddressSpace::from(3u16)), &name);
                g.set_initializer(&ty.get_undef());
                g
            }
            Flavor::Host => {
                let g = self.module.add_global(ty, None, &name);
                g.set_initializer(&ty.const_zero());
                g
            }
        };
        g.set_linkage(Linkage::Internal);
        g.set_alignment(8);
        Ok(g.as_pointer_value())
    }

    /// `bar.sync 0` (a host function when emulating).
    fn barrier(&mut self) -> R<()> {
        let name = match self.flavor {
            Flavor::Nvptx => "llvm.nvvm.barrier0",
            Flavor::Host => EMU_BARRIER,
        };
        let f = self
            .module
            .get_function(name)
            .unwrap_or_else(|| self.module.add_function(name, self.ctx.void_type().fn_type(&[], false), None));
        self.b.build_call(f, &[], "")?;
        Ok(())
    }

    /// Emits the eligible statements `stmts` of a row, split over the threads of `coop`.
    pub(super) fn cooperative_row(&mut self, stmts: &[&Stmt], coop: &Coop<'ctx>) -> R<()> {
        for s in stmts {
            match s {
                Stmt::Let { .. } | Stmt::Acc { .. } => self.stmt(s)?,
                Stmt::Store { .. } => self.when_zero(coop.index, "leader_store", |e| e.stmt(s))?,
                Stmt::For { kind, .. } => {
                    let (nest, body) =
                        if *kind == LoopKind::Reduction { reduction_nest(s) } else { super::emit::flatten(s) };
                    let (n, extents) = self.nest_extents(&nest)?;
                    let accs = if *kind == LoopKind::Reduction { updated_accs(body) } else { Vec::new() };
                    // Each thread folds its iterations from the identity; the value before the loop is folded in
                    // once, after the threads have combined their partials.
                    let mut before = Vec::new();
                    for a in &accs {
                        let slot = self.accs[a];
                        let ty = self.reg_type(slot.dtype);
                        before.push(self.b.build_load(ty, slot.value, "before")?);
                        let identity = self.scalar_const(slot.op.identity(slot.dtype))?;
                        self.b.build_store(slot.value, identity)?;
                    }
                    self.counted_loop(coop.index, n, coop.count, "coop", |e, i| {
                        e.bind_nest(&nest, &extents, i)?;
                        e.block(body)
                    })?;
                    for (a, pre) in accs.iter().zip(before) {
                        let slot = self.accs[a];
                        let ty = self.reg_type(slot.dtype);
                        let partial = self.b.build_load(ty, slot.value, "partial")?;
                        let mut v = self.warp_all_reduce(slot.op, partial, slot.dtype)?;
                        if let Some(block) = &coop.block {
                            v = self.block_all_reduce(block, slot.op, v, slot.dtype)?;
                        }
                        let v = self.fold(slot.op, pre, v, slot.dtype)?;
                        self.b.build_store(slot.value, v)?;
                    }
                }
                Stmt::Update { .. } => {
                    return Err(self.malformed("an update outside a loop in a cooperative row".into()));
                }
            }
        }
        Ok(())
    }

    /// The warp's values of `v` combined by `op`, in every lane.
    fn warp_all_reduce(&mut self, op: AccOp, v: BasicValueEnum<'ctx>, d: DType) -> R<BasicValueEnum<'ctx>> {
        let mut v = v;
        for offset in [16u64, 8, 4, 2, 1] {
            let other = self.shuffle_xor(v, d, offset)?;
            v = self.fold(op, v, other, d)?;
        }
        Ok(v)
    }

    /// The block's values of `warp_value` (each warp's combined value) combined by `op`, in every thread.
    fn block_all_reduce(
        &mut self,
        block: &BlockScope<'ctx>,
        op: AccOp,
        warp_value: BasicValueEnum<'ctx>,
        d: DType,
    ) -> R<BasicValueEnum<'ctx>> {
        let i64t = self.ctx.i64_type();
        let ty = self.reg_type(d);
        let slot_of = |e: &mut Self, i: IntValue<'ctx>| -> R<PointerValue<'ctx>> {
            // SAFETY: `i` is below 32, the slots' count (a warp index or a lane).
            Ok(unsafe { e.b.build_in_bounds_gep(i64t, block.shared, &[i], "slot")? })
        };
        self.when_zero(block.lane, "publish", |e| {
            let p = slot_of(e, block.warp)?;
            e.b.build_store(p, warp_value)?;
            Ok(())
        })?;
        self.barrier()?;
        // Every warp combines the published values the same way, so every thread ends with the same bits.
        let present = self.b.build_int_compare(IntPredicate::ULT, block.lane, block.warps, "present")?;
        let p = slot_of(self, block.lane)?;
        let loaded = self.b.build_load(ty, p, "published")?;
        let identity = self.scalar_const(op.identity(d))?;
        let v = self.b.build_select(present, loaded, identity, "mine")?;
        let v = self.warp_all_reduce(op, v, d)?;
        self.barrier()?;
        Ok(v)
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
            DType::F64 | DType::I64 | DType::U64 => {
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
            DType::I32 | DType::U32 => self.shuffle_i32(v.into_int_value(), offset)?.into(),
            DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::Bool => {
                let x = v.into_int_value();
                let w = self.b.build_int_z_extend(x, i32t, "w")?;
                let o = self.shuffle_i32(w, offset)?;
                self.b.build_int_truncate(o, x.get_type(), "n")?.into()
            }
            kiln_ir::narrow_dtypes!() => {
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
