//! Kernel IR → LLVM IR: one function per kernel, the grid mapping of its parts, loops, index arithmetic and
//! memory. Element arithmetic is in `scalar`, the transcendental functions and 16-bit float rounding in
//! `math`. The same code builds the NVPTX module and the host-emulation module; only [`Flavor`] differs
//! (address spaces, the entry's calling convention, where the special registers are read from).

use std::collections::{HashMap, HashSet};

use inkwell::AddressSpace;
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicMetadataTypeEnum, BasicTypeEnum};
use inkwell::values::{BasicValueEnum, FunctionValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::DType;

use super::{PtxError, PtxKernelInfo};
use crate::cpu::parts::{self, Part};
use crate::kernel::{AccOp, AccVar, ArgRole, Block, CmpOp, ICond, IExpr, Kernel, LoopKind, LoopVar, Stmt, Var};

pub(super) type R<T> = Result<T, PtxError>;

/// Which module is being built.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// PTX: global pointers in address space 1, entries with the `ptx_kernel` convention, NVVM special
    /// registers.
    Nvptx,
    /// Host emulation: the same code in address space 0, with special registers read from host functions and
    /// one `kiln_emu_<entry>(buffers, symbols)` wrapper per entry.
    Host,
}

/// LLVM's `ptx_kernel` calling convention.
const PTX_KERNEL_CC: u32 = 71;

/// Innermost iterations a thread takes at a time in a parallel part whose innermost extent is a known multiple of
/// it (so LLVM can merge their loads and stores into vector ones).
const COARSEN: i64 = 4;

/// The name prefix of the host wrappers.
pub(crate) const EMU_WRAPPER_PREFIX: &str = "kiln_emu_";

/// A special register of the thread grid (x dimension).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Sreg {
    /// Thread index in its block.
    Tid,
    /// Block index in the grid.
    Ctaid,
    /// Threads per block.
    Ntid,
    /// Blocks in the grid.
    Nctaid,
}

impl Sreg {
    /// Every register, in the order the emulator's host functions are listed.
    pub(crate) const ALL: [Sreg; 4] = [Sreg::Tid, Sreg::Ctaid, Sreg::Ntid, Sreg::Nctaid];

    /// The NVVM intrinsic reading it.
    fn intrinsic(self) -> &'static str {
        match self {
            Sreg::Tid => "llvm.nvvm.read.ptx.sreg.tid.x",
            Sreg::Ctaid => "llvm.nvvm.read.ptx.sreg.ctaid.x",
            Sreg::Ntid => "llvm.nvvm.read.ptx.sreg.ntid.x",
            Sreg::Nctaid => "llvm.nvvm.read.ptx.sreg.nctaid.x",
        }
    }

    /// The host function standing in for it in the emulation module.
    pub(crate) fn host_function(self) -> &'static str {
        match self {
            Sreg::Tid => "kiln_emu_tid_x",
            Sreg::Ctaid => "kiln_emu_ctaid_x",
            Sreg::Ntid => "kiln_emu_ntid_x",
            Sreg::Nctaid => "kiln_emu_nctaid_x",
        }
    }
}

/// Builds the module of `kernels` for `flavor`, with the launch description of each.
pub(crate) fn build_module<'ctx>(
    ctx: &'ctx Context,
    kernels: &[Kernel],
    flavor: Flavor,
    block_size: u32,
) -> R<(Module<'ctx>, Vec<PtxKernelInfo>)> {
    let module = ctx.create_module("kiln");
    let mut taken = HashSet::new();
    let mut infos = Vec::new();
    for (i, k) in kernels.iter().enumerate() {
        // The emitter works on verified kernels only (and does not check their invariants again).
        crate::kernel::verify_message(k).map_err(|what| PtxError::Malformed { kernel: k.name.clone(), what })?;
        let entry = super::entry_name(&k.name, i, &mut taken);
        let (work, cooperative) = KernelEmitter::emit(ctx, &module, k, &entry, flavor)?;
        infos.push(PtxKernelInfo {
            entry,
            kernel: k.name.clone(),
            params: super::params(k),
            args: k.signature(),
            block_size,
            work,
            cooperative,
        });
    }
    Ok((module, infos))
}

/// An accumulator's storage.
#[derive(Copy, Clone)]
pub(super) struct AccSlot<'ctx> {
    pub value: PointerValue<'ctx>,
    pub position: PointerValue<'ctx>,
    pub dtype: DType,
    pub op: AccOp,
}

/// Emits one kernel's function.
pub(super) struct KernelEmitter<'a, 'ctx> {
    pub ctx: &'ctx Context,
    pub module: &'a Module<'ctx>,
    pub b: Builder<'ctx>,
    pub kernel: &'a Kernel,
    pub func: FunctionValue<'ctx>,
    pub flavor: Flavor,
    /// Base pointer of each argument, by position in `kernel.args`.
    pub bufs: Vec<PointerValue<'ctx>>,
    pub syms: Vec<IntValue<'ctx>>,
    pub loops: HashMap<LoopVar, IntValue<'ctx>>,
    pub lets: HashMap<Var, (BasicValueEnum<'ctx>, DType)>,
    pub accs: HashMap<AccVar, AccSlot<'ctx>>,
    /// Whether some part runs cooperatively.
    pub cooperative: bool,
    entry_block: BasicBlock<'ctx>,
    /// While set, stores are collected here (address, value) instead of emitted: a coarsened part emits its
    /// lanes' stores after all their loads, so no store stands between loads LLVM could merge.
    deferred_stores: Option<Vec<(PointerValue<'ctx>, BasicValueEnum<'ctx>)>>,
    /// While a coarsened part emits its lanes: which lane, and lane 0's address of each contiguous access.
    coarse: Option<Coarse<'ctx>>,
}

/// The lanes of a coarsened part: lane `j`'s access to an index contiguous along `inner` is lane 0's address plus
/// `j` elements — one base for all four, as LLVM's load/store vectorizer needs to see them side by side.
struct Coarse<'ctx> {
    inner: LoopVar,
    lane: u64,
    /// (argument, printed index) → lane 0's address.
    first: HashMap<(usize, String), PointerValue<'ctx>>,
}

impl<'a, 'ctx> KernelEmitter<'a, 'ctx> {
    /// Emits `k` as function `entry` (and its host wrapper for [`Flavor::Host`]); returns the work of each part
    /// and whether some part runs cooperatively.
    fn emit(
        ctx: &'ctx Context,
        module: &'a Module<'ctx>,
        k: &'a Kernel,
        entry: &str,
        flavor: Flavor,
    ) -> R<(Vec<IExpr>, bool)> {
        let space = match flavor {
            Flavor::Nvptx => AddressSpace::from(1u16),
            Flavor::Host => AddressSpace::default(),
        };
        let gptr = ctx.ptr_type(space);
        let i64t = ctx.i64_type();
        let mut param_types: Vec<BasicMetadataTypeEnum> = Vec::new();
        for _ in k.launch_args() {
            param_types.push(gptr.into());
        }
        for _ in &k.symbols {
            param_types.push(i64t.into());
        }
        let fn_type = ctx.void_type().fn_type(&param_types, false);
        let func = module.add_function(entry, fn_type, None);
        if flavor == Flavor::Nvptx {
            func.set_call_conventions(PTX_KERNEL_CC);
            let md = ctx.metadata_node(&[
                func.as_global_value().as_pointer_value().into(),
                ctx.metadata_string("kernel").into(),
                ctx.i32_type().const_int(1, false).into(),
            ]);
            module.add_global_metadata("nvvm.annotations", &md).map_err(|e| PtxError::Llvm(e.to_string()))?;
        }
        let entry_block = ctx.append_basic_block(func, "entry");
        let b = ctx.create_builder();
        b.position_at_end(entry_block);
        // Buffers: launch arguments are parameters, constants are module globals.
        let mut bufs = Vec::with_capacity(k.args.len());
        let mut next_param = 0;
        for (i, a) in k.args.iter().enumerate() {
            match &a.role {
                ArgRole::Constant(t) => {
                    let bytes = t.data().to_le_bytes();
                    let init = ctx.const_string(&bytes, false);
                    let g = module.add_global(init.get_type(), Some(space), &format!("{entry}_const{i}"));
                    g.set_initializer(&init);
                    g.set_constant(true);
                    g.set_linkage(Linkage::Internal);
                    g.set_alignment(16);
                    bufs.push(g.as_pointer_value());
                }
                _ => {
                    let p = func.get_nth_param(next_param).expect("one parameter per launch argument");
                    if flavor == Flavor::Nvptx {
                        // The runtime's buffers start 16-byte aligned or better (`cuMemAlloc`: 256 bytes; the
                        // arena's slots: `ir::memory::ALIGNMENT`, 64): what lets LLVM merge neighbouring loads
                        // and stores into vector ones. The host flavor's callers promise nothing of the kind.
                        let align = ctx.create_enum_attribute(Attribute::get_named_enum_kind_id("align"), 16);
                        func.add_attribute(AttributeLoc::Param(next_param), align);
                    }
                    next_param += 1;
                    bufs.push(p.into_pointer_value());
                }
            }
        }
        let syms = (0..k.symbols.len())
            .map(|s| func.get_nth_param(next_param + s as u32).expect("one parameter per symbol").into_int_value())
            .collect();
        let mut e = KernelEmitter {
            ctx,
            module,
            b,
            kernel: k,
            func,
            flavor,
            bufs,
            syms,
            loops: HashMap::new(),
            lets: HashMap::new(),
            accs: HashMap::new(),
            cooperative: false,
            entry_block,
            deferred_stores: None,
            coarse: None,
        };
        let work = e.body()?;
        e.b.build_return(None)?;
        if flavor == Flavor::Host {
            e.host_wrapper(entry)?;
        }
        Ok((work, e.cooperative))
    }

    /// The kernel body: each part mapped onto the grid.
    fn body(&mut self) -> R<Vec<IExpr>> {
        let parts = parts::split(self.kernel);
        let tid = self.sreg(Sreg::Tid)?;
        let ctaid = self.sreg(Sreg::Ctaid)?;
        let ntid = self.sreg(Sreg::Ntid)?;
        let nctaid = self.sreg(Sreg::Nctaid)?;
        let base = self.b.build_int_nuw_mul(ctaid, ntid, "base")?;
        let gtid = self.b.build_int_add(base, tid, "gtid")?;
        let stride = self.b.build_int_nuw_mul(ntid, nctaid, "stride")?;
        let regs = GridRegs { tid, ctaid, ntid, gtid, stride };
        let mut work = Vec::new();
        for part in &parts {
            // Scalar set-up every part needs (re-run per part, as on the CPU).
            self.lets.clear();
            self.accs.clear();
            for s in &part.prologue {
                self.stmt(s)?;
            }
            work.push(self.part(part, &regs)?);
        }
        Ok(work)
    }

    /// One part: a grid-stride loop over its flattened parallel nest, or its statements on thread 0 (or on
    /// block 0, cooperatively, when they reduce).
    fn part(&mut self, part: &Part<'_>, regs: &GridRegs<'ctx>) -> R<IExpr> {
        let GridRegs { tid, ctaid, ntid, gtid, stride } = *regs;
        let i64t = self.ctx.i64_type();
        if !part.parallel && super::warp::eligible(part.body.iter().copied()) {
            // The whole top-level work is a reduction: block 0 runs it with all its threads.
            self.cooperative = true;
            self.when_zero(ctaid, "block_reduce", |e| {
                let coop = e.block_scope(tid, ntid)?;
                e.cooperative_row(&part.body, &coop)
            })?;
            return Ok(IExpr::Const(1));
        }
        if !part.parallel {
            self.when_zero(gtid, "serial", |e| part.body.iter().try_for_each(|s| e.stmt(s)))?;
            return Ok(IExpr::Const(1));
        }
        let [outer] = part.body.as_slice() else {
            return Err(self.malformed("a parallel part is not one loop".into()));
        };
        let (nest, body) = flatten(outer);
        let cooperative = super::warp::eligible(&body.0);
        let (total, extents) = self.nest_extents(&nest)?;
        let mut work = IExpr::Const(1);
        for (_, extent) in &nest {
            let clamped = match extent.as_const() {
                Some(c) => IExpr::Const(c.max(0)),
                None => IExpr::max((*extent).clone(), IExpr::Const(0)),
            };
            work = match (work.as_const(), clamped.as_const()) {
                (Some(a), Some(b)) => IExpr::Const(a.wrapping_mul(b)),
                (Some(1), None) => clamped,
                _ => IExpr::times(work, clamped),
            };
        }
        if cooperative {
            // One row per warp (see `warp`): rows grid-stride over the grid's warps.
            self.cooperative = true;
            let five = i64t.const_int(5, false);
            let warp = self.b.build_right_shift(gtid, five, false, "warp")?;
            let warps = self.b.build_right_shift(stride, five, false, "warps")?;
            let coop = self.warp_scope(gtid)?;
            let stmts: Vec<&Stmt> = body.0.iter().collect();
            self.counted_loop(warp, total, warps, "rows", |e, i| {
                e.bind_nest(&nest, &extents, i)?;
                e.cooperative_row(&stmts, &coop)
            })?;
            return Ok(IExpr::times(work, IExpr::Const(super::warp::WARP as i64)));
        }
        if let Some(&(inner, extent)) = nest.last()
            && extent.as_const().is_some_and(|c| c > 0 && c % COARSEN == 0)
            && body.0.iter().all(|s| matches!(s, Stmt::Let { .. } | Stmt::Store { .. }))
        {
            // Four consecutive innermost iterations per thread (the innermost extent is a known multiple of four, so
            // they share their outer indices): neighbouring elements are loaded and stored side by side, which
            // LLVM's load/store vectorizer turns into `ld.global.v4`/`st.global.v4` where the buffers' alignment
            // proves it. Consecutive threads still take consecutive groups: coalesced.
            let four = i64t.const_int(COARSEN as u64, false);
            let groups = self.b.build_int_unsigned_div(total, four, "groups")?;
            self.counted_loop(gtid, groups, stride, "grid4", |e, g| {
                let first = e.b.build_int_nuw_mul(g, four, "first")?;
                e.bind_nest(&nest, &extents, first)?;
                let base = *e.loops.get(&inner).ok_or_else(|| e.malformed("the innermost loop is unbound".into()))?;
                // Every lane's loads first, then every lane's stores (no statement reads an output buffer, and an
                // in-place launch reads each element before its own store either way).
                e.deferred_stores = Some(Vec::new());
                e.coarse = Some(Coarse { inner, lane: 0, first: HashMap::new() });
                let mut lanes = || -> R<()> {
                    for j in 0..COARSEN as u64 {
                        let lane =
                            if j == 0 { base } else { e.b.build_int_nuw_add(base, i64t.const_int(j, false), "lane")? };
                        e.loops.insert(inner, lane);
                        if let Some(c) = &mut e.coarse {
                            c.lane = j;
                        }
                        e.block(body)?;
                    }
                    Ok(())
                };
                let r = lanes();
                e.coarse = None;
                let pending = e.deferred_stores.take().unwrap_or_default();
                r?;
                for (ptr, value) in pending {
                    e.b.build_store(ptr, value)?;
                }
                Ok(())
            })?;
            return Ok(IExpr::floor_div(work, IExpr::Const(COARSEN)));
        }
        self.counted_loop(gtid, total, stride, "grid", |e, i| {
            e.bind_nest(&nest, &extents, i)?;
            e.block(body)
        })?;
        Ok(work)
    }

    /// The extents of a flattened nest (negative ones as 0) and their product.
    pub(super) fn nest_extents(&mut self, nest: &[(LoopVar, &IExpr)]) -> R<(IntValue<'ctx>, Vec<IntValue<'ctx>>)> {
        let i64t = self.ctx.i64_type();
        let mut total = i64t.const_int(1, false);
        let mut extents = Vec::new();
        for (_, extent) in nest {
            let e = self.iexpr(extent)?;
            let zero = i64t.const_zero();
            let neg = self.b.build_int_compare(IntPredicate::SLT, e, zero, "neg")?;
            let e = self.b.build_select(neg, zero, e, "extent")?.into_int_value();
            total = self.b.build_int_mul(total, e, "total")?;
            extents.push(e);
        }
        Ok((total, extents))
    }

    /// Binds the variables of a flattened nest from linear index `i`, innermost fastest.
    pub(super) fn bind_nest(
        &mut self,
        nest: &[(LoopVar, &IExpr)],
        extents: &[IntValue<'ctx>],
        i: IntValue<'ctx>,
    ) -> R<()> {
        let mut rest = i;
        for (k, ((var, _), extent)) in nest.iter().zip(extents).enumerate().rev() {
            let v = if k == 0 {
                rest
            } else {
                let v = self.b.build_int_unsigned_rem(rest, *extent, "idx")?;
                rest = self.b.build_int_unsigned_div(rest, *extent, "rest")?;
                v
            };
            self.loops.insert(*var, v);
        }
        Ok(())
    }

    /// `if x == 0 { body }`.
    pub(super) fn when_zero(&mut self, x: IntValue<'ctx>, name: &str, body: impl FnOnce(&mut Self) -> R<()>) -> R<()> {
        let zero = x.get_type().const_zero();
        let first = self.b.build_int_compare(IntPredicate::EQ, x, zero, "is0")?;
        let then = self.ctx.append_basic_block(self.func, name);
        let done = self.ctx.append_basic_block(self.func, &format!("{name}_done"));
        self.b.build_conditional_branch(first, then, done)?;
        self.b.position_at_end(then);
        body(self)?;
        self.b.build_unconditional_branch(done)?;
        self.b.position_at_end(done);
        Ok(())
    }

    /// `for i = start; i < end; i += step { body(i) }` (signed comparison).
    pub(super) fn counted_loop(
        &mut self,
        start: IntValue<'ctx>,
        end: IntValue<'ctx>,
        step: IntValue<'ctx>,
        name: &str,
        body: impl FnOnce(&mut Self, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        let pre = self.b.get_insert_block().expect("positioned");
        let header = self.ctx.append_basic_block(self.func, &format!("{name}_head"));
        let body_block = self.ctx.append_basic_block(self.func, &format!("{name}_body"));
        let exit = self.ctx.append_basic_block(self.func, &format!("{name}_exit"));
        self.b.build_unconditional_branch(header)?;
        self.b.position_at_end(header);
        let phi = self.b.build_phi(self.ctx.i64_type(), name)?;
        phi.add_incoming(&[(&start, pre)]);
        let i = phi.as_basic_value().into_int_value();
        let go = self.b.build_int_compare(IntPredicate::SLT, i, end, "go")?;
        self.b.build_conditional_branch(go, body_block, exit)?;
        self.b.position_at_end(body_block);
        body(self, i)?;
        let next = self.b.build_int_add(i, step, "next")?;
        let latch = self.b.get_insert_block().expect("positioned");
        self.b.build_unconditional_branch(header)?;
        phi.add_incoming(&[(&next, latch)]);
        self.b.position_at_end(exit);
        Ok(())
    }

    /// Emits a nested block: what it binds is visible to the rest of the block only.
    pub(super) fn block(&mut self, b: &Block) -> R<()> {
        let (lets, accs) = (self.lets.clone(), self.accs.clone());
        let r = b.0.iter().try_for_each(|s| self.stmt(s));
        self.lets = lets;
        self.accs = accs;
        r
    }

    pub(super) fn stmt(&mut self, s: &Stmt) -> R<()> {
        match s {
            // Inner loops of every kind run sequentially in one thread, in increasing index order (so
            // reductions fold as the interpreter folds them).
            Stmt::For { var, extent, body, .. } => {
                let n = self.iexpr(extent)?;
                let i64t = self.ctx.i64_type();
                let (zero, one) = (i64t.const_zero(), i64t.const_int(1, false));
                let var = *var;
                self.counted_loop(zero, n, one, &format!("i{}", var.0), |e, i| {
                    e.loops.insert(var, i);
                    e.block(body)
                })
            }
            Stmt::Let { var, dtype, value } => {
                let (v, d) = self.expr(value)?;
                debug_assert_eq!(d, *dtype, "verified: v{} holds its declared dtype", var.0);
                self.lets.insert(*var, (v, d));
                Ok(())
            }
            Stmt::Acc { var, dtype, op } => {
                let ty = self.reg_type(*dtype);
                let value = self.entry_alloca(ty, &format!("a{}", var.0))?;
                let position = self.entry_alloca(self.ctx.i64_type().into(), &format!("a{}_pos", var.0))?;
                let init = self.scalar_const(op.identity(*dtype))?;
                self.b.build_store(value, init)?;
                self.b.build_store(position, self.ctx.i64_type().const_zero())?;
                self.accs.insert(*var, AccSlot { value, position, dtype: *dtype, op: *op });
                Ok(())
            }
            Stmt::Update { acc, value, position } => self.update(*acc, value, position.as_ref()),
            Stmt::Store { arg, index, value } => {
                let d = self.kernel.arg(*arg).dtype;
                let (v, vd) = self.expr(value)?;
                debug_assert_eq!(vd, d, "verified: stores carry the buffer's dtype");
                let ptr = self.address(arg.0 as usize, index)?;
                let m = self.memory_form(v, d)?;
                match &mut self.deferred_stores {
                    Some(pending) => pending.push((ptr, m)),
                    None => {
                        self.b.build_store(ptr, m)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// An alloca in the entry block (so LLVM promotes it to registers), whatever the current position.
    pub(super) fn entry_alloca(&mut self, ty: BasicTypeEnum<'ctx>, name: &str) -> R<PointerValue<'ctx>> {
        let here = self.b.get_insert_block().expect("positioned");
        match self.entry_block.get_first_instruction() {
            Some(i) => self.b.position_before(&i),
            None => self.b.position_at_end(self.entry_block),
        }
        let p = self.b.build_alloca(ty, name)?;
        self.b.position_at_end(here);
        Ok(p)
    }

    /// The address of element `index` of argument `arg`.
    pub(super) fn address(&mut self, arg: usize, index: &IExpr) -> R<PointerValue<'ctx>> {
        let d = self.kernel.args[arg].dtype;
        let ty = self.mem_type(d);
        // In a coarsened part, lane j of a contiguous access is lane 0's address plus j elements.
        let contiguous =
            self.coarse.as_ref().map(|c| (c.inner, c.lane)).filter(|&(inner, _)| index.stride(inner) == Some(1));
        let key = contiguous.map(|_| (arg, crate::kernel::print_iexpr(index)));
        if let (Some((_, lane)), Some(key)) = (contiguous, &key)
            && lane > 0
            && let Some(&first) = self.coarse.as_ref().and_then(|c| c.first.get(key))
        {
            let j = self.ctx.i64_type().const_int(lane, false);
            // SAFETY: as below; lane j's element is in bounds by the same invariant.
            return Ok(unsafe { self.b.build_in_bounds_gep(ty, first, &[j], "lane_elt")? });
        }
        let i = self.iexpr(index)?;
        // SAFETY: not memory-unsafe for this program: the GEP only computes an address; the kernel IR's
        // invariant (every index in bounds) makes the later access valid.
        let p = unsafe { self.b.build_in_bounds_gep(ty, self.bufs[arg], &[i], "elt")? };
        if let (Some((_, 0)), Some(key), Some(c)) = (contiguous, key, self.coarse.as_mut()) {
            c.first.insert(key, p);
        }
        Ok(p)
    }

    /// Reads a special register as i64.
    fn sreg(&mut self, r: Sreg) -> R<IntValue<'ctx>> {
        let i32t = self.ctx.i32_type();
        let name = match self.flavor {
            Flavor::Nvptx => r.intrinsic(),
            Flavor::Host => r.host_function(),
        };
        let f = self
            .module
            .get_function(name)
            .unwrap_or_else(|| self.module.add_function(name, i32t.fn_type(&[], false), None));
        let v = self.b.build_call(f, &[], "sreg")?.try_as_basic_value().basic().expect("i32 result").into_int_value();
        Ok(self.b.build_int_z_extend(v, self.ctx.i64_type(), "sreg64")?)
    }

    /// `kiln_emu_<entry>(ptr buffers, ptr symbols)`: loads each launch buffer and symbol and calls the entry.
    fn host_wrapper(&mut self, entry: &str) -> R<()> {
        let ptr = self.ctx.ptr_type(AddressSpace::default());
        let i64t = self.ctx.i64_type();
        let f = self.module.add_function(
            &format!("{EMU_WRAPPER_PREFIX}{entry}"),
            self.ctx.void_type().fn_type(&[ptr.into(), ptr.into()], false),
            None,
        );
        let bb = self.ctx.append_basic_block(f, "entry");
        self.b.position_at_end(bb);
        let bufs = f.get_nth_param(0).expect("buffers").into_pointer_value();
        let syms = f.get_nth_param(1).expect("symbols").into_pointer_value();
        let mut args = Vec::new();
        for (i, _) in self.kernel.launch_args().enumerate() {
            let idx = i64t.const_int(i as u64, false);
            // SAFETY: the caller passes one pointer per launch argument.
            let p = unsafe { self.b.build_in_bounds_gep(ptr, bufs, &[idx], "bufp")? };
            args.push(self.b.build_load(ptr, p, "buf")?.into());
        }
        for s in 0..self.kernel.symbols.len() {
            let idx = i64t.const_int(s as u64, false);
            // SAFETY: the caller passes one i64 per symbol.
            let p = unsafe { self.b.build_in_bounds_gep(i64t, syms, &[idx], "symp")? };
            args.push(self.b.build_load(i64t, p, "sym")?.into());
        }
        self.b.build_call(self.func, &args, "")?;
        self.b.build_return(None)?;
        Ok(())
    }

    pub(super) fn iexpr(&mut self, e: &IExpr) -> R<IntValue<'ctx>> {
        let i64t = self.ctx.i64_type();
        Ok(match e {
            IExpr::Const(c) => i64t.const_int(*c as u64, true),
            IExpr::Var(v) => *self.loops.get(v).expect("verified: loop variables are used inside their loops"),
            IExpr::Sym(s) => *self.syms.get(*s).expect("verified: symbols exist"),
            IExpr::Add(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.b.build_int_add(a, b, "add")?
            }
            IExpr::Sub(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.b.build_int_sub(a, b, "sub")?
            }
            IExpr::Mul(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.b.build_int_mul(a, b, "mul")?
            }
            IExpr::FloorDiv(a, d) | IExpr::Rem(a, d) => {
                let (x, y) = (self.iexpr(a)?, self.iexpr(d)?);
                let (q, r) = self.floor_divrem(x, y)?;
                if matches!(e, IExpr::FloorDiv(..)) { q } else { r }
            }
            IExpr::Min(a, b) | IExpr::Max(a, b) => {
                let (x, y) = (self.iexpr(a)?, self.iexpr(b)?);
                let p = if matches!(e, IExpr::Min(..)) { IntPredicate::SLT } else { IntPredicate::SGT };
                let c = self.b.build_int_compare(p, x, y, "cmp")?;
                self.b.build_select(c, x, y, "minmax")?.into_int_value()
            }
            IExpr::Select(c, a, b) => {
                let c = self.icond(c)?;
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.b.build_select(c, a, b, "sel")?.into_int_value()
            }
            IExpr::Read { arg, index } => {
                // Verified: an i32/i64 input or constant.
                let (v, d) = self.load(arg.0 as usize, index)?;
                let v = v.into_int_value();
                if d == DType::I64 { v } else { self.b.build_int_s_extend(v, i64t, "sext")? }
            }
        })
    }

    pub(super) fn icond(&mut self, c: &ICond) -> R<IntValue<'ctx>> {
        let (a, b) = (self.iexpr(&c.lhs)?, self.iexpr(&c.rhs)?);
        let p = match c.op {
            CmpOp::Lt => IntPredicate::SLT,
            CmpOp::Le => IntPredicate::SLE,
            CmpOp::Eq => IntPredicate::EQ,
        };
        Ok(self.b.build_int_compare(p, a, b, "icond")?)
    }

    /// Floor quotient and remainder (both 0 for a zero divisor).
    fn floor_divrem(&mut self, x: IntValue<'ctx>, y: IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let (q, r) = self.safe_divrem(x, y, true)?;
        let zero = x.get_type().const_zero();
        let r_nz = self.b.build_int_compare(IntPredicate::NE, r, zero, "r_nz")?;
        let r_neg = self.b.build_int_compare(IntPredicate::SLT, r, zero, "r_neg")?;
        let y_neg = self.b.build_int_compare(IntPredicate::SLT, y, zero, "y_neg")?;
        let differ = self.b.build_xor(r_neg, y_neg, "differ")?;
        let adjust = self.b.build_and(r_nz, differ, "adjust")?;
        let q1 = self.b.build_int_sub(q, x.get_type().const_int(1, false), "q1")?;
        let r1 = self.b.build_int_add(r, y, "r1")?;
        let q = self.b.build_select(adjust, q1, q, "fq")?.into_int_value();
        let r = self.b.build_select(adjust, r1, r, "fr")?.into_int_value();
        Ok((q, r))
    }

    /// Truncating quotient and remainder that never trap: by zero both are 0; `MIN / -1` wraps to `MIN` with
    /// remainder 0 (the CPU emitter's `safe_divrem`).
    pub(super) fn safe_divrem(
        &mut self,
        x: IntValue<'ctx>,
        y: IntValue<'ctx>,
        signed: bool,
    ) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let ty = x.get_type();
        let zero = ty.const_zero();
        let one = ty.const_int(1, false);
        let is0 = self.b.build_int_compare(IntPredicate::EQ, y, zero, "y0")?;
        if !signed {
            let d = self.b.build_select(is0, one, y, "d")?.into_int_value();
            let q = self.b.build_int_unsigned_div(x, d, "q")?;
            let r = self.b.build_int_unsigned_rem(x, d, "r")?;
            let q = self.b.build_select(is0, zero, q, "q")?.into_int_value();
            let r = self.b.build_select(is0, zero, r, "r")?.into_int_value();
            return Ok((q, r));
        }
        let is_m1 = self.b.build_int_compare(IntPredicate::EQ, y, ty.const_all_ones(), "ym1")?;
        let bad = self.b.build_or(is0, is_m1, "bad")?;
        let d = self.b.build_select(bad, one, y, "d")?.into_int_value();
        let q = self.b.build_int_signed_div(x, d, "q")?;
        let r = self.b.build_int_signed_rem(x, d, "r")?;
        let neg = self.b.build_int_sub(zero, x, "negx")?;
        let q = self.b.build_select(is0, zero, q, "q")?.into_int_value();
        let q = self.b.build_select(is_m1, neg, q, "q")?.into_int_value();
        let r = self.b.build_select(bad, zero, r, "r")?.into_int_value();
        Ok((q, r))
    }

    pub(super) fn malformed(&self, what: String) -> PtxError {
        PtxError::Malformed { kernel: self.kernel.name.clone(), what }
    }

    pub(super) fn unsupported(&self, what: String) -> PtxError {
        PtxError::Unsupported { kernel: self.kernel.name.clone(), what }
    }

    /// The register type of a dtype: 16-bit floats live in f32, bools in i1.
    pub(super) fn reg_type(&self, d: DType) -> BasicTypeEnum<'ctx> {
        match d {
            DType::F32 | DType::F16 | DType::BF16 => self.ctx.f32_type().into(),
            DType::F64 => self.ctx.f64_type().into(),
            DType::I8 | DType::U8 => self.ctx.i8_type().into(),
            // Narrow types never reach the emitter (lowering refuses them); their storage is a byte.
            kiln_ir::narrow_dtypes!() => self.ctx.i8_type().into(),
            DType::I16 | DType::U16 => self.ctx.i16_type().into(),
            DType::I32 | DType::U32 => self.ctx.i32_type().into(),
            DType::I64 | DType::U64 => self.ctx.i64_type().into(),
            DType::Bool => self.ctx.bool_type().into(),
        }
    }

    /// The memory type of a dtype: 16-bit floats as their i16 bits, bools as bytes.
    pub(super) fn mem_type(&self, d: DType) -> BasicTypeEnum<'ctx> {
        match d {
            DType::F16 | DType::BF16 => self.ctx.i16_type().into(),
            DType::Bool => self.ctx.i8_type().into(),
            d => self.reg_type(d),
        }
    }

    /// Loads element `index` of argument `arg` into its register form.
    pub(super) fn load(&mut self, arg: usize, index: &IExpr) -> R<(BasicValueEnum<'ctx>, DType)> {
        let d = self.kernel.args[arg].dtype;
        let ptr = self.address(arg, index)?;
        let m = self.b.build_load(self.mem_type(d), ptr, "ld")?;
        let v = match d {
            DType::Bool => {
                let z = self.ctx.i8_type().const_zero();
                self.b.build_int_compare(IntPredicate::NE, m.into_int_value(), z, "b")?.into()
            }
            DType::F16 => self.f16_bits_to_f32(m.into_int_value())?.into(),
            DType::BF16 => self.bf16_bits_to_f32(m.into_int_value())?.into(),
            _ => m,
        };
        Ok((v, d))
    }

    /// A register value of dtype `d` in its memory form.
    fn memory_form(&mut self, v: BasicValueEnum<'ctx>, d: DType) -> R<BasicValueEnum<'ctx>> {
        Ok(match d {
            DType::Bool => self.b.build_int_z_extend(v.into_int_value(), self.ctx.i8_type(), "byte")?.into(),
            DType::F16 => self.f32_to_f16_bits(v.into_float_value())?.into(),
            DType::BF16 => self.f32_to_bf16_bits(v.into_float_value())?.into(),
            _ => v,
        })
    }

    /// Whether `a` and `b` compare by `p` (floats ordered).
    pub(super) fn fcmp(
        &mut self,
        p: FloatPredicate,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
    ) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(p, a.into_float_value(), b.into_float_value(), "fcmp")?)
    }
}

/// The special registers (as i64) and the global thread index and count.
#[derive(Copy, Clone)]
struct GridRegs<'ctx> {
    tid: IntValue<'ctx>,
    ctaid: IntValue<'ctx>,
    ntid: IntValue<'ctx>,
    gtid: IntValue<'ctx>,
    stride: IntValue<'ctx>,
}

/// The perfectly nested parallel loops starting at `outer` whose extents do not depend on each other's
/// variables, and the innermost body.
pub(super) fn flatten(outer: &Stmt) -> (Vec<(LoopVar, &IExpr)>, &Block) {
    flatten_where(outer, |k| matches!(k, LoopKind::Parallel | LoopKind::Vectorizable))
}

/// The perfectly nested loops starting at `outer` whose inner loops are of a kind `inner_kind` accepts and whose
/// extents do not depend on each other's variables, and the innermost body.
pub(super) fn flatten_where(outer: &Stmt, inner_kind: impl Fn(LoopKind) -> bool) -> (Vec<(LoopVar, &IExpr)>, &Block) {
    let mut nest = Vec::new();
    let mut cur = outer;
    loop {
        let Stmt::For { var, extent, body, .. } = cur else { unreachable!("flatten starts at a loop") };
        nest.push((*var, extent));
        match body.0.as_slice() {
            [inner @ Stmt::For { kind, extent, .. }]
                if inner_kind(*kind) && !nest.iter().any(|(v, _)| mentions(extent, *v)) =>
            {
                cur = inner;
            }
            _ => return (nest, body),
        }
    }
}

/// Whether `e` reads loop variable `v`.
fn mentions(e: &IExpr, v: LoopVar) -> bool {
    matches!(e, IExpr::Var(x) if *x == v) || e.children().into_iter().any(|c| mentions(c, v))
}
