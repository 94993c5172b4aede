//! Translation of one kernel to one Cranelift function: the entry ABI, the part switch, loops, and scalar
//! element code with the interpreter's semantics (the vector form of innermost loops is in `simd`).
//!
//! Values live in registers as: f32, f64; f16 and bf16 as f32 holding a value already rounded to the 16-bit
//! format (every operation on them rounds once, as the interpreter does); i8/u8/bool as i8 (bool 0 or 1);
//! i32; i64. Index arithmetic is i64, wrapping, with floor division and remainder by zero giving 0.

use std::collections::HashMap;

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{self, AbiParam, InstBuilder, MemFlagsData, Signature, Type, Value, types};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, Switch, Variable};
use kiln_ir::DType;
use kiln_ir::interp::scalar::Scalar;
use kiln_ir::op::{BinaryOp, UnaryOp};

use super::CpuError;
use super::parts::Part;
use super::runtime::{RtFn, RtSig};
use crate::kernel::{
    AccOp, AccVar, ArgId, ArgRole, Block, CmpOp, Expr, ICond, IExpr, Kernel, LoopKind, LoopVar, Stmt, Var,
};

/// What the emitter may use of the target.
#[derive(Copy, Clone)]
pub(crate) struct Target {
    /// Emit f32x4 code for eligible vectorizable loops.
    pub simd: bool,
    /// `floor`/`ceil`/`nearest` are native instructions (SSE4.1 on x86-64); otherwise they are runtime calls.
    pub native_rounding: bool,
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
        DType::I8 | DType::U8 | DType::Bool => types::I8,
        DType::I32 => types::I32,
        DType::I64 => types::I64,
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
                if d != *dtype {
                    return Err(self.malformed(format!("v{} is declared {dtype} but its value is {d}", var.0)));
                }
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
                let a =
                    self.kernel.args.get(arg.0 as usize).ok_or_else(|| self.malformed(format!("no arg{}", arg.0)))?;
                if a.dtype != d {
                    return Err(self.malformed(format!("store of {d} into `{}` of {}", a.name, a.dtype)));
                }
                let addr = self.address(*arg, index, true)?;
                self.store_scalar(v, d, addr);
                Ok(())
            }
        }
    }

    /// `for var in lo..hi`, vectorized when it is a vectorizable loop the SIMD emitter accepts.
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
        if kind == LoopKind::Vectorizable && self.target.simd && self.can_vectorize(body) {
            // Lanes in groups of four up to the last full group, then the scalar tail.
            let hi_c = self.b.ins().smax(hi, lo);
            let n = self.b.ins().isub(hi_c, lo);
            let full = self.b.ins().band_imm_s(n, -4);
            let vend = self.b.ins().iadd(lo, full);
            self.counted_loop(v, lo, vend, 4, |e, i| e.vector_body(var, i, body))?;
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
                    let var = *self
                        .loops
                        .get(v)
                        .ok_or_else(|| self.malformed(format!("loop variable i{} is not bound", v.0)))?;
                    self.b.use_var(var)
                }
            }
            IExpr::Sym(s) => *self.syms.get(*s).ok_or_else(|| self.malformed(format!("no symbol s{s}")))?,
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
        })
    }

    /// Floor quotient and remainder of `x` by the index `d` (both 0 when `d` is 0), and `d`'s value.
    fn floor_divrem(&mut self, x: Value, d: &IExpr) -> EResult<(Value, Value, Value)> {
        let y = self.iexpr(d)?;
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

    fn icond(&mut self, c: &ICond) -> EResult<Value> {
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
        let a = self.kernel.args.get(arg.0 as usize).ok_or_else(|| self.malformed(format!("no arg{}", arg.0)))?;
        if store != (a.role == ArgRole::Output) {
            let what = if store { "store into" } else { "load from" };
            return Err(self.malformed(format!("{what} `{}`, of role {:?}", a.name, a.role)));
        }
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
                self.call_rt(RtFn::F16ToF32, &[w])
            }
            DType::BF16 => {
                let w = self.b.ins().uextend(types::I32, raw);
                let w = self.b.ins().ishl_imm_s(w, 16);
                self.b.ins().bitcast(types::F32, MemFlagsData::new(), w)
            }
            _ => raw,
        }
    }

    pub(crate) fn store_scalar(&mut self, v: Value, d: DType, addr: Value) {
        let v = match d {
            DType::F16 => {
                let bits = self.call_rt(RtFn::F32ToF16, &[v]);
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

    // ---- element expressions ----

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
        }
    }

    /// A float constant of register type `ty`.
    pub(crate) fn fconst(&mut self, ty: Type, v: f64) -> Value {
        if ty == types::F64 { self.b.ins().f64const(v) } else { self.b.ins().f32const(v as f32) }
    }

    /// Rounds an f32-held result to its 16-bit dtype; other dtypes pass through.
    pub(crate) fn round_to(&mut self, v: Value, d: DType) -> Value {
        match d {
            DType::F16 => self.call_rt(RtFn::RoundF16, &[v]),
            DType::BF16 => self.call_rt(RtFn::RoundBf16, &[v]),
            _ => v,
        }
    }

    pub(crate) fn expr(&mut self, e: &Expr) -> EResult<(Value, DType)> {
        Ok(match e {
            Expr::Const(s) => (self.scalar_const(*s), s.dtype()),
            Expr::Load { arg, index } => {
                let d = self
                    .kernel
                    .args
                    .get(arg.0 as usize)
                    .ok_or_else(|| self.malformed(format!("no arg{}", arg.0)))?
                    .dtype;
                let addr = self.address(*arg, index, false)?;
                (self.load_scalar(d, addr), d)
            }
            Expr::Var(v) => *self.lets.get(v).ok_or_else(|| self.malformed(format!("v{} is not defined", v.0)))?,
            Expr::Acc(a) => {
                let slot =
                    *self.accs.get(a).ok_or_else(|| self.malformed(format!("accumulator a{} is not declared", a.0)))?;
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
            Expr::Binary(k, a, b) => {
                let (a, da) = self.expr(a)?;
                let (b, db) = self.expr(b)?;
                if da != db {
                    return Err(self.malformed(format!("{} on {da} and {db}", k.name())));
                }
                self.binary(*k, a, b, da)?
            }
            Expr::Select(c, a, b) => {
                let (c, dc) = self.expr(c)?;
                let (a, da) = self.expr(a)?;
                let (b, db) = self.expr(b)?;
                if dc != DType::Bool || da != db {
                    return Err(self.malformed(format!("select on {dc}, {da} and {db}")));
                }
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
        let unsigned = d == DType::U8;
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
        let unsigned = d == DType::U8;
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
                _ => {
                    // i8/u8: saturate through i64, then clamp to the narrow range.
                    let w = self.b.ins().fcvt_to_sint_sat(types::I64, x);
                    let (lo, hi) = if to == DType::U8 { (0, 255) } else { (-128, 127) };
                    let lo = self.b.ins().iconst(types::I64, lo);
                    let hi = self.b.ins().iconst(types::I64, hi);
                    let w = self.b.ins().smax(w, lo);
                    let w = self.b.ins().smin(w, hi);
                    self.b.ins().ireduce(types::I8, w)
                }
            };
        }
        // Integer or bool source: widen to its i64 value first.
        let wide = match from {
            DType::I64 => x,
            DType::U8 | DType::Bool => self.b.ins().uextend(types::I64, x),
            _ => self.b.ins().sextend(types::I64, x),
        };
        match to {
            DType::F32 | DType::F64 => self.b.ins().fcvt_from_sint(to_ty, wide),
            DType::F16 => self.call_rt(RtFn::I64ToF16, &[wide]),
            DType::BF16 => self.call_rt(RtFn::I64ToBf16, &[wide]),
            DType::I64 => wide,
            _ => self.b.ins().ireduce(to_ty, wide),
        }
    }

    fn update(&mut self, acc: AccVar, value: &Expr, position: Option<&IExpr>) -> EResult<()> {
        let slot =
            *self.accs.get(&acc).ok_or_else(|| self.malformed(format!("accumulator a{} is not declared", acc.0)))?;
        let (v, d) = self.expr(value)?;
        if d != slot.dtype {
            return Err(self.malformed(format!("update with {d} into a{} of {}", acc.0, slot.dtype)));
        }
        let cur = self.b.use_var(slot.value);
        let folded = match slot.op {
            AccOp::Sum => self.binary(BinaryOp::Add, cur, v, d)?.0,
            AccOp::Prod => self.binary(BinaryOp::Mul, cur, v, d)?.0,
            AccOp::Max if d == DType::Bool => self.b.ins().bor(cur, v),
            AccOp::Min if d == DType::Bool => self.b.ins().band(cur, v),
            AccOp::Max => self.binary(BinaryOp::Max, cur, v, d)?.0,
            AccOp::Min => self.binary(BinaryOp::Min, cur, v, d)?.0,
            AccOp::ArgMax { select_last } | AccOp::ArgMin { select_last } => {
                let max = matches!(slot.op, AccOp::ArgMax { .. });
                let pos =
                    position.ok_or_else(|| self.malformed(format!("an arg update of a{} needs a position", acc.0)))?;
                let p = self.iexpr(pos)?;
                let replace = self.arg_replaces(max, select_last, v, cur, d);
                let cur_pos = self.b.use_var(slot.position);
                let new_pos = self.b.ins().select(replace, p, cur_pos);
                self.b.def_var(slot.position, new_pos);
                self.b.ins().select(replace, v, cur)
            }
        };
        self.b.def_var(slot.value, folded);
        Ok(())
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
        let unsigned = matches!(d, DType::U8 | DType::Bool);
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
