//! The f32x4 form of an innermost vectorizable or reduction loop.
//!
//! A vectorizable loop qualifies when every statement is a `Let` or a store of a float (f32, f16, bf16) or
//! integer-lane (i32, u8, i8) value into a buffer of its type, and every value is built from constants, loads
//! and variables of those types, f32 accumulators, casts among them, float unary and arithmetic binary kinds,
//! i32 `add`/`sub`/`mul`/`max`/`min`, and selects of floats whose condition is a float comparison; anything else
//! (other dtypes, index values, bool variables) keeps the whole loop scalar. Integer lanes are i32x4 whatever the
//! type — an 8-bit value is always within its type's range there — and follow the scalar code exactly: f32 to
//! an integer truncates and saturates (NaN → 0, then an 8-bit type's clamp), narrowing between integers wraps,
//! i32 arithmetic wraps, 8-bit loads widen four bytes by their signedness and 8-bit stores narrow four lanes
//! into one 32-bit store. That is what quantization lowers to (`f32 → u8 → i32 − zero point → f32`), so a
//! QuantizeLinear/DequantizeLinear chain runs four lanes at a time. Half-precision values live in f32
//! lanes, exactly; every operation on them rounds its lanes to the type (ties to even, inline integer
//! arithmetic — the lane-wise twin of the scalar conversions, bit for bit), loads widen four 16-bit values in
//! one `uload16x4`, and stores narrow four into one 64-bit store. Four consecutive iterations run as four lanes, two such groups per
//! trip of a vectorizable loop (twice the independent work in flight, one loop overhead); a last group of four,
//! then the iterations left over run through the scalar loop.
//!
//! A reduction loop qualifies the same way when every statement is an f32 `Let` or an `Update` of an f32
//! `Sum`, `Prod`, `Max` or `Min` accumulator, and no value reads an accumulator the loop folds into (that value
//! would depend on the previous lane's fold). Sum, max and min accumulators fold lane-wise into an f32x4 twin,
//! and the twin's four lanes into the accumulator once after the loop (`acc + ((l0 + l1) + (l2 + l3))` for a
//! sum): max and min are exact and NaN-propagating, so that is the interpreter's value bit for bit; a sum is
//! reassociated into four interleaved partial sums — as every vectorizing compiler and math library does (the
//! library calls too) — so it differs from the interpreter's in-order sum by summation rounding only, and runs
//! at one vector add per four elements instead of a chain of four dependent scalar adds. Product accumulators
//! keep the in-order fold: the four lanes fold into the accumulator one at a time, lane 0 to 3, by the scalar
//! loop's step. Arg accumulators, other dtypes and bodies with stores keep the loop scalar. A loop-invariant integer converted to f32 (a quantization's zero point) is converted once and
//! splat.
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

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value, types};
use kiln_ir::DType;
use kiln_ir::interp::scalar::Scalar;
use kiln_ir::op::{BinaryOp, UnaryOp};

use super::emit::{EResult, Emitter, mem};
use crate::kernel::{AccOp, AccVar, ArgId, Block, Expr, IExpr, LoopVar, Stmt, Var};

/// Little-endian flags for the bitcasts between vector types.
fn little() -> MemFlagsData {
    MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little)
}

/// The operands of a `max`/`min` with an f32 constant that is not NaN: the other operand and the constant.
fn clamp_operands<'e>(a: &'e Expr, b: &'e Expr) -> Option<(&'e Expr, f32)> {
    match (a, b) {
        (x, Expr::Const(Scalar::F32(c))) | (Expr::Const(Scalar::F32(c)), x) if !c.is_nan() => Some((x, *c)),
        _ => None,
    }
}

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

/// The float dtypes whose values the vector form holds as f32 lanes (a half type rounds after every operation,
/// as the scalar code does).
fn floatish(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// The integer dtypes whose values the vector form holds as i32 lanes (8-bit values always within their type's
/// range, so they widen and narrow exactly).
fn int_lanes(d: DType) -> bool {
    matches!(d, DType::I32 | DType::U8 | DType::I8)
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
        let mut inner: HashMap<Var, DType> = HashMap::new();
        for s in &body.0 {
            match s {
                Stmt::Let { var, dtype, value } if self.vtype(value, &inner) == Some(*dtype) => {
                    inner.insert(*var, *dtype);
                }
                Stmt::Store { arg, value, .. }
                    if self.kernel.args.get(arg.0 as usize).map(|a| a.dtype) == self.vtype(value, &inner) => {}
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
        let value_ok =
            |e: &Expr, inner: &HashMap<Var, DType>, d: DType| self.vtype(e, inner) == Some(d) && !reads_acc(e, &folded);
        let mut inner: HashMap<Var, DType> = HashMap::new();
        for s in &body.0 {
            match s {
                Stmt::Let { var, dtype, value } if value_ok(value, &inner, *dtype) => {
                    inner.insert(*var, *dtype);
                }
                Stmt::Update { acc, value, position: None }
                    if self.accs.get(acc).is_some_and(|a| {
                        a.dtype == DType::F32 && matches!(a.op, AccOp::Sum | AccOp::Prod | AccOp::Max | AccOp::Min)
                    }) && value_ok(value, &inner, DType::F32) => {}
                _ => return false,
            }
        }
        !folded.is_empty()
    }

    /// Whether `e` is a variable of the enclosing scope (not the loop body's `inner` lets) holding an integer:
    /// the same value in every iteration.
    fn invariant_int(&self, e: &Expr, inner: &HashMap<Var, DType>) -> bool {
        matches!(e, Expr::Var(v) if !inner.contains_key(v)
            && self.lets.get(v).is_some_and(|(_, d)| !d.is_float() && *d != DType::Bool))
    }

    /// The dtype of `e`'s lanes when the vector form takes it (f32, or f16/bf16 held as f32 lanes), `None` when
    /// it does not; `inner` holds the dtypes of the loop body's own lets.
    fn vtype(&self, e: &Expr, inner: &HashMap<Var, DType>) -> Option<DType> {
        let lanes = |d: DType| (floatish(d) || int_lanes(d)).then_some(d);
        match e {
            Expr::Const(s) => lanes(s.dtype()),
            Expr::Load { arg, .. } => self.kernel.args.get(arg.0 as usize).and_then(|a| lanes(a.dtype)),
            // A loop-invariant integer (a zero point) converted to f32: converted once, splat.
            Expr::Cast(x, DType::F32) if self.invariant_int(x, inner) => Some(DType::F32),
            Expr::Cast(x, to) => {
                let from = self.vtype(x, inner)?;
                let to = lanes(*to)?;
                // Float to float, float (f32) to integer (saturating), integer to integer (wrapping), integer
                // to f32 (exact for 8-bit values, rounded once for i32).
                let ok = match (floatish(from), floatish(to)) {
                    (true, true) | (false, false) => true,
                    (true, false) => from == DType::F32,
                    (false, true) => to == DType::F32,
                };
                ok.then_some(to)
            }
            Expr::Var(v) => inner.get(v).copied().or_else(|| self.lets.get(v).and_then(|(_, d)| lanes(*d))),
            Expr::Acc(a) => self.accs.get(a).filter(|s| !s.op.is_arg() && s.dtype == DType::F32).map(|_| DType::F32),
            Expr::Unary(k, x) if vector_unary(*k) => self.vtype(x, inner).filter(|&d| floatish(d)),
            Expr::Binary(k, a, b) => {
                let d = self.vtype(a, inner)?;
                let ok = if floatish(d) {
                    vector_binary(*k)
                } else {
                    // i32 lanes wrap as the scalar i32 arithmetic does; 8-bit arithmetic would need re-wrapping.
                    d == DType::I32
                        && matches!(k, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min)
                };
                (ok && self.vtype(b, inner) == Some(d)).then_some(d)
            }
            Expr::Select(c, a, b) => {
                let Expr::Binary(k, x, y) = &**c else { return None };
                let cd = self.vtype(x, inner).filter(|&d| floatish(d))?;
                let d = self.vtype(a, inner).filter(|&d| floatish(d))?;
                (float_cc(*k).is_some() && self.vtype(y, inner) == Some(cd) && self.vtype(b, inner) == Some(d))
                    .then_some(d)
            }
            _ => None,
        }
    }

    /// One group of four iterations starting at `i`; updates fold their four lanes in order.
    pub(crate) fn vector_body(&mut self, var: LoopVar, i: Value, body: &Block) -> EResult<()> {
        let mut vlets: HashMap<Var, (Value, DType)> = HashMap::new();
        for s in &body.0 {
            match s {
                Stmt::Let { var: v, value, .. } => {
                    let x = self.vexpr(value, var, i, &vlets)?;
                    vlets.insert(*v, x);
                }
                Stmt::Store { arg, index, value } => {
                    let (x, d) = self.vexpr(value, var, i, &vlets)?;
                    if index.stride(var) == Some(1) {
                        let addr = self.address(*arg, index, true)?;
                        if matches!(d, DType::F32 | DType::I32) {
                            self.b.ins().store(mem(), x, addr, 0);
                        } else if int_lanes(d) {
                            // Four in-range 8-bit values: narrowed twice (exactly), stored as one i32.
                            let v16 = self.b.ins().snarrow(x, x);
                            let v8 = if d == DType::U8 {
                                self.b.ins().unarrow(v16, v16)
                            } else {
                                self.b.ins().snarrow(v16, v16)
                            };
                            let words = self.b.ins().bitcast(types::I32X4, little(), v8);
                            let low = self.b.ins().extractlane(words, 0);
                            self.b.ins().store(mem(), low, addr, 0);
                        } else {
                            // Four 16-bit values: narrowed into the low half of a vector, stored as one i64.
                            let bits = self.vhalf_bits(x, d);
                            let narrow = self.b.ins().unarrow(bits, bits);
                            let wide = self.b.ins().bitcast(types::I64X2, little(), narrow);
                            let low = self.b.ins().extractlane(wide, 0);
                            self.b.ins().store(mem(), low, addr, 0);
                        }
                    } else {
                        // `store_scalar` converts half types and stores f32 as it is; an 8-bit lane is its low byte.
                        self.store_lanes(*arg, index, var, i, x, |e, v, addr| {
                            let v =
                                if matches!(d, DType::U8 | DType::I8) { e.b.ins().ireduce(types::I8, v) } else { v };
                            e.store_scalar(v, d, addr)
                        })?;
                    }
                }
                Stmt::Update { acc, value, .. } if self.vaccs.contains_key(acc) => {
                    // A sum, max or min: lane-wise into its vector twin, folded once after the loop.
                    let (x, _) = self.vexpr(value, var, i, &vlets)?;
                    let twin = self.vaccs[acc];
                    let op = self.accs[acc].op;
                    let cur = self.b.use_var(twin);
                    let next = match op {
                        AccOp::Max => self.b.ins().fmax(cur, x),
                        AccOp::Min => self.b.ins().fmin(cur, x),
                        _ => self.b.ins().fadd(cur, x),
                    };
                    self.b.def_var(twin, next);
                }
                Stmt::Update { acc, value, .. } => {
                    let (x, _) = self.vexpr(value, var, i, &vlets)?;
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

    /// Before a vectorized reduction loop: an f32x4 twin for each f32 sum, max or min accumulator the body folds
    /// into — four partial sums starting at 0, or the accumulator's max/min in every lane. Max and min are exact
    /// and NaN-propagating, so lane-wise partial results folded at the end equal the in-order fold the scalar loop
    /// does, bit for bit; sums are reassociated (see the module docs); products keep their in-order lane fold.
    pub(crate) fn open_vector_accs(&mut self, body: &Block) {
        for s in &body.0 {
            let Stmt::Update { acc, position: None, .. } = s else { continue };
            let Some(slot) = self.accs.get(acc).copied() else { continue };
            if slot.dtype != DType::F32
                || !matches!(slot.op, AccOp::Sum | AccOp::Max | AccOp::Min)
                || self.vaccs.contains_key(acc)
            {
                continue;
            }
            let twin = self.b.declare_var(types::F32X4);
            let start = if slot.op == AccOp::Sum { self.b.ins().f32const(0.0) } else { self.b.use_var(slot.value) };
            let lanes = self.splat(start);
            self.b.def_var(twin, lanes);
            self.vaccs.insert(*acc, twin);
        }
    }

    /// After a vectorized reduction loop: each twin's four lanes folded into its accumulator (a sum's pairwise,
    /// then added to the accumulator).
    pub(crate) fn close_vector_accs(&mut self) -> EResult<()> {
        for (acc, twin) in std::mem::take(&mut self.vaccs) {
            let slot = self.accs[&acc];
            let v = self.b.use_var(twin);
            let cur = self.b.use_var(slot.value);
            let lanes: Vec<Value> = (0..LANES as u8).map(|lane| self.b.ins().extractlane(v, lane)).collect();
            let folded = if slot.op == AccOp::Sum {
                let low = self.b.ins().fadd(lanes[0], lanes[1]);
                let high = self.b.ins().fadd(lanes[2], lanes[3]);
                let all = self.b.ins().fadd(low, high);
                self.b.ins().fadd(cur, all)
            } else {
                let mut folded = cur;
                for x in lanes {
                    folded = self.fold(slot.op, folded, x, DType::F32)?;
                }
                folded
            };
            self.b.def_var(slot.value, folded);
        }
        Ok(())
    }

    fn splat(&mut self, x: Value) -> Value {
        self.b.ins().splat(types::F32X4, x)
    }

    /// The four lanes of `e` for iterations `i..i + 4` of `var`, and their dtype: f32 lanes (f16/bf16 values held
    /// exactly as f32, each result rounded to its type as the scalar code rounds it).
    fn vexpr(
        &mut self,
        e: &Expr,
        var: LoopVar,
        i: Value,
        vlets: &HashMap<Var, (Value, DType)>,
    ) -> EResult<(Value, DType)> {
        Ok(match e {
            Expr::Const(s) => {
                let c = self.scalar_const(*s);
                (self.any_splat(c, s.dtype()), s.dtype())
            }
            Expr::Load { arg, index } => {
                let d = self.kernel.arg(*arg).dtype;
                (self.vload(*arg, index, var, i, d)?, d)
            }
            Expr::Cast(x, DType::F32)
                if !matches!(&**x, Expr::Var(v) if vlets.contains_key(v)) && self.invariant_int(x, &HashMap::new()) =>
            {
                let (x, d) = self.expr(e)?;
                (self.splat(x), d)
            }
            Expr::Cast(x, to) => {
                let (v, from) = self.vexpr(x, var, i, vlets)?;
                let v = match (floatish(from), floatish(*to)) {
                    // A half value is exact in f32; narrowing rounds once.
                    (true, true) if *to == DType::F32 || *to == from => v,
                    (true, true) => self.vround(v, *to),
                    (true, false) => self.vfloat_to_int(v, *to),
                    (false, false) => self.vint_to_int(v, from, *to),
                    (false, true) => self.b.ins().fcvt_from_sint(types::F32X4, v),
                };
                (v, *to)
            }
            Expr::Var(v) => match vlets.get(v) {
                Some(x) => *x,
                None => {
                    let (x, d) = self.expr(e)?;
                    (self.any_splat(x, d), d)
                }
            },
            Expr::Acc(_) => {
                let (x, d) = self.expr(e)?;
                (self.splat(x), d)
            }
            Expr::Unary(k, x) => {
                let (x, d) = self.vexpr(x, var, i, vlets)?;
                let v = self.vunary(*k, x)?;
                (self.vround(v, d), d)
            }
            Expr::Binary(BinaryOp::Pow, a, b) if b.small_power().is_some() => {
                let (x, d) = self.vexpr(a, var, i, vlets)?;
                let v = if d == DType::F32 {
                    let mut acc = x;
                    for _ in 1..b.small_power().unwrap_or(1) {
                        acc = self.b.ins().fmul(acc, x);
                    }
                    acc
                } else {
                    // The scalar code calls pow for half types: the same, lane by lane.
                    let (y, _) = self.vexpr(b, var, i, vlets)?;
                    self.per_lane2(|e, x, y| Ok(e.binary(BinaryOp::Pow, x, y, DType::F32)?.0), x, y)?
                };
                (self.vround(v, d), d)
            }
            Expr::Binary(k @ (BinaryOp::Max | BinaryOp::Min), a, b)
                if let Some((x, c)) = clamp_operands(a, b)
                    && !(*k == BinaryOp::Min && c == 0.0 && c.is_sign_negative()) =>
            {
                // A clamp to a constant (`max(x, 0)`, `min(x, 255)`): one `maxps`/`minps`-shaped select instead of
                // the general NaN- and signed-zero-exact sequence. With the constant first, a NaN lane of `x`
                // fails the comparison and passes through; the one signed-zero case the select gets wrong
                // (`max(-0, +0)` must be +0) is put right by adding +0, which changes nothing else. (`min` with
                // -0 keeps the general form.)
                let (xv, d) = self.vexpr(x, var, i, vlets)?;
                let cv = self.vconst(c);
                let v = if *k == BinaryOp::Min {
                    let above = self.b.ins().fcmp(FloatCC::LessThan, cv, xv);
                    self.select_mask(above, cv, xv)
                } else {
                    let below = self.b.ins().fcmp(FloatCC::LessThan, xv, cv);
                    let v = self.select_mask(below, cv, xv);
                    if c == 0.0 && c.is_sign_positive() {
                        let zero = self.vconst(0.0);
                        self.b.ins().fadd(v, zero)
                    } else {
                        v
                    }
                };
                (self.vround(v, d), d)
            }
            Expr::Binary(k, a, b) => {
                let (a, d) = self.vexpr(a, var, i, vlets)?;
                let (b, _) = self.vexpr(b, var, i, vlets)?;
                if int_lanes(d) {
                    // i32 lanes (the only integer arithmetic `vtype` admits): wrapping, as the scalar code.
                    let v = match k {
                        BinaryOp::Add => self.b.ins().iadd(a, b),
                        BinaryOp::Sub => self.b.ins().isub(a, b),
                        BinaryOp::Mul => self.b.ins().imul(a, b),
                        BinaryOp::Max => self.b.ins().smax(a, b),
                        BinaryOp::Min => self.b.ins().smin(a, b),
                        _ => return Err(self.malformed(format!("{} on integer lanes", k.name()))),
                    };
                    return Ok((v, d));
                }
                let v = match k {
                    BinaryOp::Add => self.b.ins().fadd(a, b),
                    BinaryOp::Sub => self.b.ins().fsub(a, b),
                    BinaryOp::Mul => self.b.ins().fmul(a, b),
                    BinaryOp::Div => self.b.ins().fdiv(a, b),
                    BinaryOp::Max => self.b.ins().fmax(a, b),
                    BinaryOp::Min => self.b.ins().fmin(a, b),
                    _ => self.per_lane2(|e, x, y| Ok(e.binary(*k, x, y, DType::F32)?.0), a, b)?,
                };
                (self.vround(v, d), d)
            }
            Expr::Select(c, a, b) => {
                let Expr::Binary(k, x, y) = &**c else {
                    return Err(self.malformed("vector select without a comparison".into()));
                };
                let cc = float_cc(*k).ok_or_else(|| self.malformed("vector select without a comparison".into()))?;
                let (x, _) = self.vexpr(x, var, i, vlets)?;
                let (y, _) = self.vexpr(y, var, i, vlets)?;
                let mask = self.b.ins().fcmp(cc, x, y);
                let (a, d) = self.vexpr(a, var, i, vlets)?;
                let (b, _) = self.vexpr(b, var, i, vlets)?;
                (self.select_mask(mask, a, b), d)
            }
            _ => return Err(self.malformed("an expression the vector form does not take".into())),
        })
    }

    /// Stores the four lanes of `x` one by one, each at `index` for its own iteration of `var` (from `i`), through
    /// `store(emitter, lane value, address)`: the form of a store whose index does not move by one per iteration.
    fn store_lanes(
        &mut self,
        arg: ArgId,
        index: &IExpr,
        var: LoopVar,
        i: Value,
        x: Value,
        mut store: impl FnMut(&mut Self, Value, Value),
    ) -> EResult<()> {
        for lane in 0..LANES {
            let li = self.b.ins().iadd_imm_s(i, lane);
            self.lane_index.insert(var, li);
            let addr = self.address(arg, index, true);
            self.lane_index.remove(&var);
            let addr = addr?;
            let v = self.b.ins().extractlane(x, lane as u8);
            store(self, v, addr);
        }
        Ok(())
    }

    /// f32 lanes rounded to `d` (f16 or bf16: to the nearest value of the type, ties to even, held as f32);
    /// f32 lanes as they are.
    fn vround(&mut self, v: Value, d: DType) -> Value {
        match d {
            DType::F16 => {
                let bits = self.vhalf_bits(v, d);
                self.vf16_to_f32(bits)
            }
            DType::BF16 => {
                let bits = self.vhalf_bits(v, d);
                let bits = self.b.ins().ishl_imm_s(bits, 16);
                self.b.ins().bitcast(types::F32X4, little(), bits)
            }
            _ => v,
        }
    }

    /// A scalar of `d` in every lane: f32 lanes for the float types, i32 lanes (8-bit values widened by their
    /// signedness) for the integer ones.
    fn any_splat(&mut self, x: Value, d: DType) -> Value {
        if !int_lanes(d) {
            return self.splat(x);
        }
        let x = match d {
            DType::U8 => self.b.ins().uextend(types::I32, x),
            DType::I8 => self.b.ins().sextend(types::I32, x),
            _ => x,
        };
        self.b.ins().splat(types::I32X4, x)
    }

    /// f32 lanes converted to an integer type as the scalar cast converts them: truncated and saturated to i32
    /// (NaN → 0), then clamped to an 8-bit type's range.
    fn vfloat_to_int(&mut self, v: Value, to: DType) -> Value {
        let v = self.b.ins().fcvt_to_sint_sat(types::I32X4, v);
        let Some((lo, hi)) = to.int_range().filter(|_| to != DType::I32) else { return v };
        let lo = self.isplat(lo as i64);
        let hi = self.isplat(hi as i64);
        let v = self.b.ins().smax(v, lo);
        self.b.ins().smin(v, hi)
    }

    /// Integer lanes converted between integer types as the scalar cast converts them: widening keeps the value
    /// (8-bit lanes already hold it), narrowing to 8 bits wraps.
    fn vint_to_int(&mut self, v: Value, from: DType, to: DType) -> Value {
        match to {
            DType::U8 | DType::I8 if to != from => {
                let v = self.b.ins().ishl_imm_s(v, 24);
                if to == DType::U8 { self.b.ins().ushr_imm_s(v, 24) } else { self.b.ins().sshr_imm_s(v, 24) }
            }
            _ => v,
        }
    }

    fn isplat(&mut self, k: i64) -> Value {
        let c = self.b.ins().iconst(types::I32, k);
        self.b.ins().splat(types::I32X4, c)
    }

    /// The f16 (or bf16) bits, in the low 16 of each i32 lane, of the type's value nearest each f32 lane (ties
    /// to even): the lane-wise form of `Emitter::f32_to_f16_bits` / `round_bf16_inline`, bit for bit.
    fn vhalf_bits(&mut self, v: Value, d: DType) -> Value {
        let bits = self.b.ins().bitcast(types::I32X4, little(), v);
        if d == DType::BF16 {
            let odd = self.b.ins().ushr_imm_s(bits, 16);
            let one = self.isplat(1);
            let odd = self.b.ins().band(odd, one);
            let bias = self.isplat(0x7fff);
            let r = self.b.ins().iadd(bits, bias);
            let r = self.b.ins().iadd(r, odd);
            let quiet = self.isplat(0x0040_0000);
            let nan = self.b.ins().bor(bits, quiet);
            let is_nan = self.b.ins().fcmp(FloatCC::Unordered, v, v);
            let r = self.b.ins().bitselect(is_nan, nan, r);
            return self.b.ins().ushr_imm_s(r, 16);
        }
        let sign_mask = self.isplat(i64::from(0x8000_0000u32 as i32));
        let sign = self.b.ins().band(bits, sign_mask);
        let f = self.b.ins().bxor(bits, sign);
        // |v| < 2^31 as an integer, so signed comparisons serve.
        let max = self.isplat(143 << 23);
        let is_big = self.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, f, max);
        let inf_bits = self.isplat(255 << 23);
        let is_nan = self.b.ins().icmp(IntCC::SignedGreaterThan, f, inf_bits);
        let payload_mask = self.isplat(0x007f_ffff);
        let payload = self.b.ins().band(f, payload_mask);
        let payload = self.b.ins().ushr_imm_s(payload, 13);
        let qnan = self.isplat(0x7e00);
        let nan = self.b.ins().bor(payload, qnan);
        let inf = self.isplat(0x7c00);
        let big = self.b.ins().bitselect(is_nan, nan, inf);
        let min_normal = self.isplat(113 << 23);
        let is_small = self.b.ins().icmp(IntCC::SignedLessThan, f, min_normal);
        let ff = self.b.ins().bitcast(types::F32X4, little(), f);
        let half = self.b.ins().f32const(0.5);
        let half = self.splat(half);
        let s = self.b.ins().fadd(ff, half);
        let s = self.b.ins().bitcast(types::I32X4, little(), s);
        let unbias = self.isplat(-(126 << 23));
        let small = self.b.ins().iadd(s, unbias);
        let shifted = self.b.ins().ushr_imm_s(f, 13);
        let one = self.isplat(1);
        let odd = self.b.ins().band(shifted, one);
        let rebias = self.isplat(((15 - 127) << 23) + 0xfff);
        let n = self.b.ins().iadd(f, rebias);
        let n = self.b.ins().iadd(n, odd);
        let n = self.b.ins().ushr_imm_s(n, 13);
        let r = self.b.ins().bitselect(is_small, small, n);
        let r = self.b.ins().bitselect(is_big, big, r);
        let sign = self.b.ins().ushr_imm_s(sign, 16);
        self.b.ins().bor(r, sign)
    }

    /// f16 bits in the low 16 of each i32 lane as f32 lanes: the lane-wise form of `Emitter::f16_bits_to_f32`.
    fn vf16_to_f32(&mut self, h: Value) -> Value {
        let sign_mask = self.isplat(0x8000);
        let sign = self.b.ins().band(h, sign_mask);
        let sign = self.b.ins().ishl_imm_s(sign, 16);
        let magnitude_mask = self.isplat(0x7fff);
        let magnitude = self.b.ins().band(h, magnitude_mask);
        let o = self.b.ins().ishl_imm_s(magnitude, 13);
        let exp_mask = self.isplat(0x0f80_0000);
        let exp = self.b.ins().band(o, exp_mask);
        let rebias = self.isplat((127 - 15) << 23);
        let normal = self.b.ins().iadd(o, rebias);
        let rebias2 = self.isplat((128 - 16) << 23);
        let special = self.b.ins().iadd(normal, rebias2);
        let mantissa_mask = self.isplat(0x3ff);
        let mantissa = self.b.ins().band(h, mantissa_mask);
        let zero = self.isplat(0);
        let no_payload = self.b.ins().icmp(IntCC::Equal, mantissa, zero);
        let quiet_bit = self.isplat(0x0040_0000);
        let quiet = self.b.ins().bor(special, quiet_bit);
        let special = self.b.ins().bitselect(no_payload, special, quiet);
        let one_exp = self.isplat(1 << 23);
        let lifted = self.b.ins().iadd(normal, one_exp);
        let lifted = self.b.ins().bitcast(types::F32X4, little(), lifted);
        let two_m14 = self.b.ins().f32const(f32::from_bits(113 << 23));
        let two_m14 = self.splat(two_m14);
        let sub = self.b.ins().fsub(lifted, two_m14);
        let sub = self.b.ins().bitcast(types::I32X4, little(), sub);
        let is_special = self.b.ins().icmp(IntCC::Equal, exp, exp_mask);
        let is_sub = self.b.ins().icmp(IntCC::Equal, exp, zero);
        let r = self.b.ins().bitselect(is_special, special, normal);
        let r = self.b.ins().bitselect(is_sub, sub, r);
        let r = self.b.ins().bor(r, sign);
        self.b.ins().bitcast(types::F32X4, little(), r)
    }

    /// Four lanes of `arg` (f32, f16/bf16 as f32 lanes, or i32) at `index` for iterations `i..i + 4` of `var`: one vector load at stride
    /// 1, a splat at stride 0, lane by lane otherwise.
    fn vload(&mut self, arg: ArgId, index: &IExpr, var: LoopVar, i: Value, dtype: DType) -> EResult<Value> {
        let ty = if int_lanes(dtype) { types::I32X4 } else { types::F32X4 };
        let byte = matches!(dtype, DType::U8 | DType::I8);
        Ok(match index.stride(var) {
            Some(1) if byte => {
                // Four bytes in one load, widened twice to i32 lanes by their signedness.
                let addr = self.address(arg, index, false)?;
                let word = self.b.ins().load(types::I32, mem(), addr, 0);
                let v = self.b.ins().scalar_to_vector(types::I32X4, word);
                let v = self.b.ins().bitcast(types::I8X16, little(), v);
                if dtype == DType::U8 {
                    let v = self.b.ins().uwiden_low(v);
                    self.b.ins().uwiden_low(v)
                } else {
                    let v = self.b.ins().swiden_low(v);
                    self.b.ins().swiden_low(v)
                }
            }
            Some(1) if matches!(dtype, DType::F16 | DType::BF16) => {
                // Four 16-bit values widened to i32 lanes in one load, then converted.
                let addr = self.address(arg, index, false)?;
                let bits = self.b.ins().uload16x4(mem(), addr, 0);
                if dtype == DType::F16 {
                    self.vf16_to_f32(bits)
                } else {
                    let bits = self.b.ins().ishl_imm_s(bits, 16);
                    self.b.ins().bitcast(types::F32X4, little(), bits)
                }
            }
            Some(1) => {
                let addr = self.address(arg, index, false)?;
                self.b.ins().load(ty, mem(), addr, 0)
            }
            Some(0) => {
                let addr = self.address(arg, index, false)?;
                let x = self.load_scalar(dtype, addr);
                self.any_splat(x, dtype)
            }
            _ => {
                let mut lanes = Vec::with_capacity(LANES as usize);
                for lane in 0..LANES {
                    let li = self.b.ins().iadd_imm_s(i, lane);
                    self.lane_index.insert(var, li);
                    let addr = self.address(arg, index, false);
                    self.lane_index.remove(&var);
                    let x = self.load_scalar(dtype, addr?);
                    lanes.push(match dtype {
                        DType::U8 => self.b.ins().uextend(types::I32, x),
                        DType::I8 => self.b.ins().sextend(types::I32, x),
                        _ => x,
                    });
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
