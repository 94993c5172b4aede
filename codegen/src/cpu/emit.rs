//! Translation of one kernel to one Cranelift function: the entry ABI, the part switch, statements, loops,
//! index arithmetic, memory and runtime calls (element expressions are in `scalar`, the vector form of
//! innermost loops in `simd`).
//!
//! Values live in registers as: f32, f64; f16 and bf16 as f32 holding a value already rounded to the 16-bit
//! format (every operation on them rounds once, as the interpreter does); i8/u8/bool as i8 (bool 0 or 1);
//! i32; i64. Index arithmetic is i64, wrapping, with floor division and remainder by zero giving 0.

use std::collections::HashMap;

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{self, AbiParam, InstBuilder, MemFlagsData, Signature, Type, Value, types};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, Switch, Variable};
use kiln_ir::DType;

use super::CpuError;
use super::parts::Part;
use super::runtime::{RtFn, RtSig};
use crate::kernel::{AccOp, AccVar, ArgId, ArgRole, Block, CmpOp, ICond, IExpr, Kernel, LoopKind, LoopVar, Stmt, Var};

/// What the emitter may use of the target.
#[derive(Copy, Clone)]
pub(crate) struct Target {
    /// Emit f32x4 code for eligible vectorizable loops.
    pub simd: bool,
    /// `floor`/`ceil`/`nearest` are native instructions (SSE4.1 on x86-64); otherwise they are runtime calls.
    pub native_rounding: bool,
    /// A fused multiply-add instruction exists (FMA3 on x86-64); used inside the vector approximations only,
    /// never for the graph's own `mul` then `add`, which the interpreter rounds twice.
    pub fused_multiply_add: bool,
    /// The calling convention of runtime functions.
    pub call_conv: CallConv,
    /// Pointer width and the like, for the function builder.
    pub frontend: TargetFrontendConfig,
}

/// An accumulator's storage.
#[derive(Copy, Clone)]
pub(crate) struct AccSlot {
    pub op: AccOp,
    pub dtype: DType,
    pub value: Variable,
    pub position: Variable,
}

/// Loads and stores: never trapping (the IR keeps indices in bounds), alignment unknown (callers' buffers).
pub(crate) fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// The register type a dtype computes in.
pub(crate) fn reg_type(d: DType) -> Type {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => types::F32,
        DType::F64 => types::F64,
        // Narrow types never reach the emitter (lowering refuses them); their storage is a byte.
        DType::I8 | DType::U8 | DType::Bool => types::I8,
        kiln_ir::narrow_dtypes!() => types::I8,
        DType::I16 | DType::U16 => types::I16,
        DType::I32 | DType::U32 => types::I32,
        DType::I64 | DType::U64 => types::I64,
    }
}

/// The type a dtype is stored as.
pub(crate) fn mem_type(d: DType) -> Type {
    match d {
        DType::F16 | DType::BF16 => types::I16,
        d => reg_type(d),
    }
}

pub(crate) struct Emitter<'k, 'f> {
    pub kernel: &'k Kernel,
    pub b: FunctionBuilder<'f>,
    pub target: Target,
    /// Base address of every argument's data (launch pointer or read-only data), defined in the entry block.
    pub bases: Vec<Value>,
    /// Symbol values, defined in the entry block.
    pub syms: Vec<Value>,
    /// Address of the runtime table, defined in the entry block.
    pub table: Value,
    pub loops: HashMap<LoopVar, Variable>,
    /// Loop variables temporarily bound to a value (one SIMD lane's index).
    pub lane_index: HashMap<LoopVar, Value>,
    pub lets: HashMap<Var, (Value, DType)>,
    pub accs: HashMap<AccVar, AccSlot>,
    /// The f32x4 twins of the max/min accumulators of the reduction loop being vectorized (see `simd`).
    pub vaccs: HashMap<AccVar, Variable>,
    /// Runtime signatures imported so far.
    sigs: HashMap<RtSig, ir::SigRef>,
}

pub(crate) type EResult<T> = Result<T, CpuError>;

impl<'k, 'f> Emitter<'k, 'f> {
    /// Emits the whole entry function `(args, syms, part, begin, end)` into `b`'s function; `data` gives the
    /// global value of each constant argument's read-only data, `table` the runtime table's.
    pub(crate) fn emit_kernel(
        kernel: &'k Kernel,
        mut b: FunctionBuilder<'f>,
        target: Target,
        parts: &[Part<'k>],
        data: &HashMap<ArgId, ir::GlobalValue>,
        table: ir::GlobalValue,
    ) -> EResult<()> {
        let ptr = types::I64;
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        b.seal_block(entry);
        let params = b.block_params(entry).to_vec();
        let (args_ptr, syms_ptr, part, begin, end) = (params[0], params[1], params[2], params[3], params[4]);
        let flags = mem().with_readonly();
        let mut slot = 0i32;
        let mut bases = Vec::with_capacity(kernel.args.len());
        for (i, a) in kernel.args.iter().enumerate() {
            let base = match a.role {
                ArgRole::Constant(_) => {
                    let gv = data.get(&ArgId(i as u32)).ok_or_else(|| CpuError::Malformed {
                        kernel: kernel.name.clone(),
                        message: format!("constant `{}` has no data", a.name),
                    })?;
                    b.ins().symbol_value(ptr, *gv)
                }
                _ => {
                    let v = b.ins().load(ptr, flags, args_ptr, slot * 8);
                    slot += 1;
                    v
                }
            };
            bases.push(base);
        }
        let syms = (0..kernel.symbols.len()).map(|s| b.ins().load(types::I64, flags, syms_ptr, s as i32 * 8)).collect();
        let table = b.ins().symbol_value(ptr, table);
        let mut e = Emitter {
            kernel,
            b,
            target,
            bases,
            syms,
            table,
            loops: HashMap::new(),
            lane_index: HashMap::new(),
            lets: HashMap::new(),
            accs: HashMap::new(),
            vaccs: HashMap::new(),
            sigs: HashMap::new(),
        };
        let exit = e.b.create_block();
        let mut switch = Switch::new();
        let part_blocks: Vec<ir::Block> = parts.iter().map(|_| e.b.create_block()).collect();
        for (i, &blk) in part_blocks.iter().enumerate() {
            switch.set_entry(i as u128, blk);
        }
        switch.emit(&mut e.b, part, exit);
        for (p, &blk) in parts.iter().zip(&part_blocks) {
            e.b.switch_to_block(blk);
            e.b.seal_block(blk);
            e.lets.clear();
            e.accs.clear();
            for s in &p.prologue {
                e.stmt(s)?;
            }
            if p.parallel {
                let Some(Stmt::For { var, extent, kind, body }) = p.body.first() else {
                    return Err(e.malformed("a parallel part is not a loop".into()));
                };
                // Clamp the chunk to the loop's range, so a bad [begin, end) cannot run outside it.
                let n = e.iexpr(extent)?;
                let zero = e.b.ins().iconst(types::I64, 0);
                let lo = e.b.ins().smax(begin, zero);
                let hi = e.b.ins().smin(end, n);
                e.for_range(*var, lo, hi, *kind, body)?;
            } else {
                for s in &p.body {
                    e.stmt(s)?;
                }
            }
            e.b.ins().jump(exit, &[]);
        }
        e.b.switch_to_block(exit);
        e.b.seal_block(exit);
        e.b.ins().return_(&[]);
        e.b.finalize(target.frontend);
        Ok(())
    }

    pub(crate) fn malformed(&self, message: String) -> CpuError {
        CpuError::Malformed { kernel: self.kernel.name.clone(), message }
    }

    pub(crate) fn unsupported(&self, what: String) -> CpuError {
        CpuError::Unsupported { kernel: self.kernel.name.clone(), what }
    }

    /// A nested block: its `Let`s and `Acc`s go out of scope at its end, so a malformed use outside it is an
    /// error rather than a value that does not dominate its use.
    fn block(&mut self, b: &Block) -> EResult<()> {
        let (lets, accs) = (self.lets.clone(), self.accs.clone());
        let result = b.0.iter().try_for_each(|s| self.stmt(s));
        self.lets = lets;
        self.accs = accs;
        result
    }

    fn stmt(&mut self, s: &Stmt) -> EResult<()> {
        match s {
            Stmt::For { var, extent, kind, body } => {
                let lo = self.b.ins().iconst(types::I64, 0);
                let hi = self.iexpr(extent)?;
                self.for_range(*var, lo, hi, *kind, body)
            }
            Stmt::Let { var, dtype, value } => {
                let (v, d) = self.expr(value)?;
                debug_assert_eq!(d, *dtype, "verified: v{} holds its declared dtype", var.0);
                self.lets.insert(*var, (v, d));
                Ok(())
            }
            Stmt::Acc { var, dtype, op } => {
                let init = self.scalar_const(op.identity(*dtype));
                let value = self.b.declare_var(reg_type(*dtype));
                self.b.def_var(value, init);
                let position = self.b.declare_var(types::I64);
                let zero = self.b.ins().iconst(types::I64, 0);
                self.b.def_var(position, zero);
                self.accs.insert(*var, AccSlot { op: *op, dtype: *dtype, value, position });
                Ok(())
            }
            Stmt::Update { acc, value, position } => self.update(*acc, value, position.as_ref()),
            Stmt::Store { arg, index, value } => {
                let (v, d) = self.expr(value)?;
                debug_assert_eq!(self.kernel.arg(*arg).dtype, d, "verified: stores carry the buffer's dtype");
                let addr = self.address(*arg, index, true)?;
                self.store_scalar(v, d, addr);
                Ok(())
            }
        }
    }

    /// `for var in lo..hi`, vectorized when it is a vectorizable or reduction loop the SIMD emitter accepts.
    pub(crate) fn for_range(
        &mut self,
        var: LoopVar,
        lo: Value,
        hi: Value,
        kind: LoopKind,
        body: &Block,
    ) -> EResult<()> {
        let v = self.b.declare_var(types::I64);
        self.loops.insert(var, v);
        let mut lo = lo;
        let vector = self.target.simd
            && match kind {
                LoopKind::Vectorizable => self.can_vectorize(body),
                LoopKind::Reduction => self.can_vectorize_reduction(body),
                LoopKind::Parallel | LoopKind::Serial => false,
            };
        if vector {
            // Lanes in groups of four up to the last full group, then the scalar tail.
            let hi_c = self.b.ins().smax(hi, lo);
            let n = self.b.ins().isub(hi_c, lo);
            let full = self.b.ins().band_imm_s(n, -4);
            let vend = self.b.ins().iadd(lo, full);
            if kind == LoopKind::Reduction {
                self.open_vector_accs(body);
            } else {
                // Two groups per trip while eight lanes remain: twice the independent work in flight for the
                // out-of-order core, one loop overhead and one set of splat constants for both; the groups run
                // in iteration order, so the stores and loads keep the scalar loop's order.
                let vend2 = self.b.ins().band_imm_s(n, -8);
                let vend2 = self.b.ins().iadd(lo, vend2);
                self.counted_loop(v, lo, vend2, 8, |e, i| {
                    e.vector_body(var, i, body)?;
                    // The second group's index (the loop variable the body's indices read); the trip's step is
                    // taken from `i`, so redefining it here does not move the loop.
                    let next = e.b.ins().iadd_imm_s(i, 4);
                    e.b.def_var(v, next);
                    e.vector_body(var, next, body)
                })?;
                lo = vend2;
            }
            self.counted_loop(v, lo, vend, 4, |e, i| e.vector_body(var, i, body))?;
            self.close_vector_accs()?;
            lo = vend;
        }
        self.counted_loop(v, lo, hi, 1, |e, _| e.block(body))?;
        self.loops.remove(&var);
        Ok(())
    }

    /// A loop of `var` from `lo` while `< hi` in steps of `step`, `body` getting the current value.
    fn counted_loop(
        &mut self,
        var: Variable,
        lo: Value,
        hi: Value,
        step: i64,
        mut body: impl FnMut(&mut Self, Value) -> EResult<()>,
    ) -> EResult<()> {
        let header = self.b.create_block();
        let inner = self.b.create_block();
        let exit = self.b.create_block();
        self.b.def_var(var, lo);
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let i = self.b.use_var(var);
        let go = self.b.ins().icmp(IntCC::SignedLessThan, i, hi);
        self.b.ins().brif(go, inner, &[], exit, &[]);
        self.b.switch_to_block(inner);
        self.b.seal_block(inner);
        body(self, i)?;
        let next = self.b.ins().iadd_imm_s(i, step);
        self.b.def_var(var, next);
        self.b.ins().jump(header, &[]);
        self.b.seal_block(header);
        self.b.switch_to_block(exit);
        self.b.seal_block(exit);
        Ok(())
    }

    // ---- index arithmetic ----

    pub(crate) fn iexpr(&mut self, e: &IExpr) -> EResult<Value> {
        Ok(match e {
            IExpr::Const(c) => self.b.ins().iconst(types::I64, *c),
            IExpr::Var(v) => {
                if let Some(&x) = self.lane_index.get(v) {
                    x
                } else {
                    let var = *self.loops.get(v).expect("verified: loop variables are used inside their loops");
                    self.b.use_var(var)
                }
            }
            IExpr::Sym(s) => *self.syms.get(*s).expect("verified: symbols exist"),
            IExpr::Add(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.b.ins().iadd(a, b)
            }
            IExpr::Sub(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.b.ins().isub(a, b)
            }
            IExpr::Mul(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.b.ins().imul(a, b)
            }
            IExpr::FloorDiv(a, d) | IExpr::Rem(a, d) => {
                let x = self.iexpr(a)?;
                let (q, r, y) = self.floor_divrem(x, d)?;
                if matches!(e, IExpr::FloorDiv(..)) {
                    let _ = r;
                    q
                } else {
                    let _ = y;
                    r
                }
            }
            IExpr::Min(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.b.ins().smin(a, b)
            }
            IExpr::Max(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.b.ins().smax(a, b)
            }
            IExpr::Select(c, a, b) => {
                let c = self.icond(c)?;
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.b.ins().select(c, a, b)
            }
            IExpr::Read { arg, index } => {
                let ty = match self.kernel.arg(*arg).dtype {
                    DType::I32 => types::I32,
                    _ => types::I64, // verified: index reads are of i32 or i64 buffers
                };
                let addr = self.address(*arg, index, false)?;
                // Read-only for the whole call (the buffer is never an output), so Cranelift may merge equal reads
                // and hoist invariant ones out of loops.
                let v = self.b.ins().load(ty, mem().with_readonly(), addr, 0);
                if ty == types::I64 { v } else { self.b.ins().sextend(types::I64, v) }
            }
        })
    }

    /// Floor quotient and remainder of `x` by the index `d` (both 0 when `d` is 0), and `d`'s value.
    fn floor_divrem(&mut self, x: Value, d: &IExpr) -> EResult<(Value, Value, Value)> {
        let y = self.iexpr(d)?;
        if let Some(c) = d.as_const().filter(|&c| c > 0) {
            let (q, r) = self.floor_divrem_by_positive(x, c);
            return Ok((q, r, y));
        }
        let (q, r) = match d.as_const() {
            Some(c) if c != 0 && c != -1 => (self.b.ins().sdiv_imm_s(x, c), self.b.ins().srem_imm_s(x, c)),
            _ => self.safe_divrem(x, y, true),
        };
        // Move a truncated quotient and remainder to floor semantics: when the remainder is nonzero and its sign
        // differs from the divisor's.
        let zero = self.b.ins().iconst(types::I64, 0);
        let r_nz = self.b.ins().icmp(IntCC::NotEqual, r, zero);
        let r_neg = self.b.ins().icmp(IntCC::SignedLessThan, r, zero);
        let y_neg = self.b.ins().icmp(IntCC::SignedLessThan, y, zero);
        let differ = self.b.ins().bxor(r_neg, y_neg);
        let adjust = self.b.ins().band(r_nz, differ);
        let q1 = self.b.ins().iadd_imm_s(q, -1);
        let r1 = self.b.ins().iadd(r, y);
        let q = self.b.ins().select(adjust, q1, q);
        let r = self.b.ins().select(adjust, r1, r);
        Ok((q, r, y))
    }

    /// Floor quotient and remainder of `x` by the constant `c > 0` in a few pure instructions (shifts and one
    /// high multiply, no division): a signed `sdiv`/`srem` by a constant, which Cranelift rewrites into its own
    /// magic-number sequence, and then the adjustment from truncation to floor cost about twice as many, on
    /// every element of a kernel whose index divides by an extent (a channel shuffle's reshape: shufflenet's
    /// transposes 0.63 → 0.43 ms). For `c = 2^k`, `x >> k` and `x & (c - 1)`. Otherwise with `s` the sign mask
    /// of `x`, `u = x ^ s` is below 2^63 and `floor(x / c) = s ^ floor(u / c)`, where `floor(u / c) = umulhi(u,
    /// m) >> (ℓ - 1)` for `ℓ = ⌈log2 c⌉` and `m = ⌈2^(63+ℓ) / c⌉` (Granlund and Montgomery: exact for 63-bit
    /// numerators, and `m` fits in 64 bits when `c` is not a power of two).
    fn floor_divrem_by_positive(&mut self, x: Value, c: i64) -> (Value, Value) {
        if c == 1 {
            return (x, self.b.ins().iconst(types::I64, 0));
        }
        if c.count_ones() == 1 {
            let q = self.b.ins().sshr_imm_u(x, i64::from(c.trailing_zeros()));
            return (q, self.b.ins().band_imm_s(x, c - 1));
        }
        let (m, shift) = floor_div_magic(c);
        let sign = self.b.ins().sshr_imm_u(x, 63);
        let u = self.b.ins().bxor(x, sign);
        let m = self.b.ins().iconst(types::I64, m as i64);
        let hi = self.b.ins().umulhi(u, m);
        let qu = self.b.ins().ushr_imm_u(hi, i64::from(shift));
        let q = self.b.ins().bxor(qu, sign);
        let qc = self.b.ins().imul_imm_s(q, c);
        (q, self.b.ins().isub(x, qc))
    }

    /// Truncating `x / y` and `x % y` that never trap: by zero both are 0; `MIN / -1` wraps to `MIN` and its
    /// remainder is 0. `signed` picks signed or unsigned division.
    pub(crate) fn safe_divrem(&mut self, x: Value, y: Value, signed: bool) -> (Value, Value) {
        let ty = self.b.func.dfg.value_type(x);
        let zero = self.b.ins().iconst(ty, 0);
        let one = self.b.ins().iconst(ty, 1);
        let is0 = self.b.ins().icmp_imm_s(IntCC::Equal, y, 0);
        if !signed {
            let d = self.b.ins().select(is0, one, y);
            let q = self.b.ins().udiv(x, d);
            let r = self.b.ins().urem(x, d);
            return (self.b.ins().select(is0, zero, q), self.b.ins().select(is0, zero, r));
        }
        let is_m1 = self.b.ins().icmp_imm_s(IntCC::Equal, y, -1);
        let bad = self.b.ins().bor(is0, is_m1);
        let d = self.b.ins().select(bad, one, y);
        let q = self.b.ins().sdiv(x, d);
        let r = self.b.ins().srem(x, d);
        let neg = self.b.ins().ineg(x);
        let q = self.b.ins().select(is0, zero, q);
        let q = self.b.ins().select(is_m1, neg, q);
        let r = self.b.ins().select(bad, zero, r);
        (q, r)
    }

    pub(crate) fn icond(&mut self, c: &ICond) -> EResult<Value> {
        let (a, b) = (self.iexpr(&c.lhs)?, self.iexpr(&c.rhs)?);
        let cc = match c.op {
            CmpOp::Lt => IntCC::SignedLessThan,
            CmpOp::Le => IntCC::SignedLessThanOrEqual,
            CmpOp::Eq => IntCC::Equal,
        };
        Ok(self.b.ins().icmp(cc, a, b))
    }

    /// The address of element `index` of `arg`, which must be an output when `store` is set and must not be one
    /// otherwise.
    pub(crate) fn address(&mut self, arg: ArgId, index: &IExpr, store: bool) -> EResult<Value> {
        let a = self.kernel.arg(arg);
        debug_assert_eq!(store, a.role == ArgRole::Output, "verified: stores write outputs and loads read the rest");
        let size = a.dtype.size_bytes() as i64;
        let i = self.iexpr(index)?;
        let off = self.b.ins().imul_imm_s(i, size);
        Ok(self.b.ins().iadd(self.bases[arg.0 as usize], off))
    }

    // ---- memory ----

    pub(crate) fn load_scalar(&mut self, d: DType, addr: Value) -> Value {
        let raw = self.b.ins().load(mem_type(d), mem(), addr, 0);
        match d {
            DType::F16 => {
                let w = self.b.ins().uextend(types::I32, raw);
                self.f16_bits_to_f32(w)
            }
            DType::BF16 => {
                let w = self.b.ins().uextend(types::I32, raw);
                let w = self.b.ins().ishl_imm_s(w, 16);
                self.b.ins().bitcast(types::F32, MemFlagsData::new(), w)
            }
            _ => raw,
        }
    }

    /// The f32 of the f16 whose bits are the low 16 of the i32 `h`: exact, inline (no runtime call). Normal
    /// numbers rebias the exponent; subnormals renormalize through one exact float subtraction; infinities keep
    /// their sign and NaNs their payload, quieted (as F16C's `vcvtph2ps` and the `half` crate do).
    pub(crate) fn f16_bits_to_f32(&mut self, h: Value) -> Value {
        let b = &mut self.b;
        let sign = b.ins().band_imm_s(h, 0x8000);
        let sign = b.ins().ishl_imm_s(sign, 16);
        let magnitude = b.ins().band_imm_s(h, 0x7fff);
        let o = b.ins().ishl_imm_s(magnitude, 13);
        let exp = b.ins().band_imm_s(o, 0x0f80_0000);
        let normal = b.ins().iadd_imm_s(o, (127 - 15) << 23);
        let special = b.ins().iadd_imm_s(normal, (128 - 16) << 23);
        let mantissa = b.ins().band_imm_s(h, 0x3ff);
        let is_nan_payload = b.ins().icmp_imm_s(IntCC::NotEqual, mantissa, 0);
        let quiet = b.ins().bor_imm_s(special, 0x0040_0000);
        let special = b.ins().select(is_nan_payload, quiet, special);
        // Zero and subnormals: 2^-14 · (1 + m/1024) − 2^-14 = m · 2^-24, exactly.
        let lifted = b.ins().iadd_imm_s(normal, 1 << 23);
        let lifted = b.ins().bitcast(types::F32, MemFlagsData::new(), lifted);
        let two_m14 = b.ins().f32const(f32::from_bits(113 << 23));
        let sub = b.ins().fsub(lifted, two_m14);
        let sub = b.ins().bitcast(types::I32, MemFlagsData::new(), sub);
        let is_special = b.ins().icmp_imm_s(IntCC::Equal, exp, 0x0f80_0000);
        let is_sub = b.ins().icmp_imm_s(IntCC::Equal, exp, 0);
        let r = b.ins().select(is_special, special, normal);
        let r = b.ins().select(is_sub, sub, r);
        let r = b.ins().bor(r, sign);
        b.ins().bitcast(types::F32, MemFlagsData::new(), r)
    }

    /// The f16 nearest to the f32 `v` (ties to even), as bits in the low 16 of an i32: inline. Magnitudes from
    /// 65520 up become infinity; subnormal results round through one float addition (the FPU's nearest-even);
    /// NaNs keep the top of their payload, quieted (as the `half` crate does).
    pub(crate) fn f32_to_f16_bits(&mut self, v: Value) -> Value {
        let b = &mut self.b;
        let bits = b.ins().bitcast(types::I32, MemFlagsData::new(), v);
        let sign = b.ins().band_imm_s(bits, i64::from(0x8000_0000u32 as i32));
        let f = b.ins().bxor(bits, sign);
        // Too large for a finite f16, infinite, or NaN.
        let is_big = b.ins().icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, f, 143 << 23);
        let is_nan = b.ins().icmp_imm_s(IntCC::UnsignedGreaterThan, f, 255 << 23);
        let payload = b.ins().band_imm_s(f, 0x007f_ffff);
        let payload = b.ins().ushr_imm_s(payload, 13);
        let nan = b.ins().bor_imm_s(payload, 0x7e00);
        let inf = b.ins().iconst(types::I32, 0x7c00);
        let big = b.ins().select(is_nan, nan, inf);
        // Results below the smallest normal f16 (2^-14): add 0.5, whose ulp is the f16 subnormal step.
        let is_small = b.ins().icmp_imm_s(IntCC::UnsignedLessThan, f, 113 << 23);
        let ff = b.ins().bitcast(types::F32, MemFlagsData::new(), f);
        let half = b.ins().f32const(0.5);
        let s = b.ins().fadd(ff, half);
        let s = b.ins().bitcast(types::I32, MemFlagsData::new(), s);
        let small = b.ins().iadd_imm_s(s, -(126 << 23));
        // Normal results: rebias, round the 13 dropped bits to nearest even, shift.
        let shifted = b.ins().ushr_imm_s(f, 13);
        let odd = b.ins().band_imm_s(shifted, 1);
        let n = b.ins().iadd_imm_s(f, ((15 - 127) << 23) + 0xfff);
        let n = b.ins().iadd(n, odd);
        let n = b.ins().ushr_imm_s(n, 13);
        let r = b.ins().select(is_small, small, n);
        let r = b.ins().select(is_big, big, r);
        let sign = b.ins().ushr_imm_s(sign, 16);
        b.ins().bor(r, sign)
    }

    /// `v` rounded to the nearest bf16 (ties to even), held as f32: inline. NaNs stay NaN, quieted.
    pub(crate) fn round_bf16_inline(&mut self, v: Value) -> Value {
        let b = &mut self.b;
        let bits = b.ins().bitcast(types::I32, MemFlagsData::new(), v);
        let odd = b.ins().ushr_imm_s(bits, 16);
        let odd = b.ins().band_imm_s(odd, 1);
        let r = b.ins().iadd_imm_s(bits, 0x7fff);
        let r = b.ins().iadd(r, odd);
        let nan = b.ins().bor_imm_s(bits, 0x0040_0000);
        let is_nan = b.ins().fcmp(cranelift_codegen::ir::condcodes::FloatCC::Unordered, v, v);
        let r = b.ins().select(is_nan, nan, r);
        let r = b.ins().band_imm_s(r, i64::from(0xffff_0000u32 as i32));
        b.ins().bitcast(types::F32, MemFlagsData::new(), r)
    }

    pub(crate) fn store_scalar(&mut self, v: Value, d: DType, addr: Value) {
        let v = match d {
            DType::F16 => {
                let bits = self.f32_to_f16_bits(v);
                self.b.ins().ireduce(types::I16, bits)
            }
            DType::BF16 => {
                // The value is already a bf16 value held as f32: its low half is zero.
                let bits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), v);
                let bits = self.b.ins().ushr_imm_s(bits, 16);
                self.b.ins().ireduce(types::I16, bits)
            }
            _ => v,
        };
        self.b.ins().store(mem(), v, addr, 0);
    }

    // ---- runtime calls ----

    /// Calls runtime function `f` through the runtime table.
    pub(crate) fn call_rt(&mut self, f: RtFn, args: &[Value]) -> Value {
        let sig = f.sig();
        let sigref = match self.sigs.get(&sig) {
            Some(s) => *s,
            None => {
                let (params, ret): (&[Type], Type) = match sig {
                    RtSig::F32ToF32 => (&[types::F32], types::F32),
                    RtSig::F64ToF64 => (&[types::F64], types::F64),
                    RtSig::F32F32ToF32 => (&[types::F32, types::F32], types::F32),
                    RtSig::F64F64ToF64 => (&[types::F64, types::F64], types::F64),
                    RtSig::I32ToF32 => (&[types::I32], types::F32),
                    RtSig::F32ToI32 => (&[types::F32], types::I32),
                    RtSig::F64ToF32 => (&[types::F64], types::F32),
                    RtSig::I64ToF32 => (&[types::I64], types::F32),
                    RtSig::I64I64ToI64 => (&[types::I64, types::I64], types::I64),
                };
                let mut s = Signature::new(self.target.call_conv);
                s.params.extend(params.iter().map(|&t| AbiParam::new(t)));
                s.returns.push(AbiParam::new(ret));
                let r = self.b.import_signature(s);
                self.sigs.insert(sig, r);
                r
            }
        };
        let index = RtFn::ALL.iter().position(|&g| g == f).unwrap_or(0) as i32;
        let callee = self.b.ins().load(types::I64, mem().with_readonly(), self.table, index * 8);
        let call = self.b.ins().call_indirect(sigref, callee, args);
        self.b.inst_results(call)[0]
    }
}

/// The multiplier `m = ⌈2^(63+ℓ) / c⌉` and shift `ℓ - 1` (`ℓ = ⌈log2 c⌉`) with which `floor(u / c) = umulhi(u, m)
/// >> (ℓ - 1)` for every `0 ≤ u < 2^63`, for `c ≥ 3` not a power of two (see
/// [`Emitter::floor_divrem_by_positive`]).
fn floor_div_magic(c: i64) -> (u64, u32) {
    debug_assert!(c > 2 && c.count_ones() > 1);
    let c = c as u128;
    let l = 128 - (c - 1).leading_zeros();
    let m = (1u128 << (63 + l)).div_ceil(c);
    (m as u64, l - 1)
}

#[cfg(test)]
mod tests {
    use super::floor_div_magic;

    /// The magic division agrees with floor division on the extremes of the 63-bit range and around multiples
    /// of every divisor tried, for divisors up to 2^62 (emitted code applies it to `x ^ sign`, below 2^63).
    #[test]
    fn magic_division_is_exact_on_63_bit_numerators() {
        let divisors = (3..2000i64).chain([3136, 0x15700, 1_000_003, (1 << 31) - 1, (1 << 40) + 3, (1 << 62) - 1]);
        for c in divisors.filter(|c| c.count_ones() > 1) {
            let (m, shift) = floor_div_magic(c);
            let cu = c as u64;
            let mut probes = vec![0u64, 1, cu - 1, cu, cu + 1, (1 << 63) - 1, (1 << 63) - 2, (1 << 62) + 12345];
            for k in [1u64, 2, 7, 1000, 1 << 20, ((1u64 << 63) - 1) / cu] {
                let base = k.saturating_mul(cu);
                probes.extend([base.wrapping_sub(1), base, base.wrapping_add(1)].into_iter().filter(|&v| v < 1 << 63));
            }
            for u in probes {
                let got = ((u as u128 * m as u128) >> 64) as u64 >> shift;
                assert_eq!(got, u / cu, "{u} / {c}");
            }
        }
    }
}
