//! The index simplifier: keeps emitted address arithmetic lean.
//!
//! [`simplify`] rewrites an [`IExpr`] bottom-up into an equal one. Sums are put in a linear form (atoms times
//! constant coefficients plus a constant, atoms in order of first appearance, equal atoms merged), which folds
//! constants and drops `x*1`, `x+0`, `x*0`. Division and remainder by a positive constant `c` use value ranges:
//! the linear form splits into a part whose coefficients are multiples of `c` and a rest, so `(x*c + r)/c` is
//! `x` and `(x*c + r) mod c` is `r` whenever the rest provably lies in `0..c` (which covers `(x*c)/c` and
//! reshape round trips). Ranges come from loop extents (`0..n`), symbols (`0..`), constants and the operators;
//! `min`, `max` and `select` fold when ranges decide them. A buffer read ([`IExpr::Read`]) is an opaque atom of
//! unknown range: its index simplifies, its value never folds (equal reads still cancel, since a read-only
//! buffer gives one value per element). Every rewrite is exact for all values in range, so it never changes
//! what an index evaluates to.

use super::ir::{CmpOp, ICond, IExpr, LoopVar};

/// Static loop extents the simplifier may assume (`None`: unknown, at least 0).
pub type Extents<'a> = &'a dyn Fn(LoopVar) -> Option<u64>;

/// An equal, simpler index expression.
pub fn simplify(e: &IExpr, ext: Extents<'_>) -> IExpr {
    match e {
        IExpr::Const(_) | IExpr::Var(_) | IExpr::Sym(_) => e.clone(),
        IExpr::Add(..) | IExpr::Sub(..) | IExpr::Mul(..) => linear(e, ext).build(),
        IExpr::FloorDiv(a, b) => div_rem(simplify(a, ext), simplify(b, ext), ext, true),
        IExpr::Rem(a, b) => div_rem(simplify(a, ext), simplify(b, ext), ext, false),
        IExpr::Min(a, b) | IExpr::Max(a, b) => {
            let is_min = matches!(e, IExpr::Min(..));
            let (a, b) = (simplify(a, ext), simplify(b, ext));
            let (ra, rb) = (range(&a, ext), range(&b, ext));
            // `a <= b` everywhere decides min and max.
            let a_le_b = matches!((ra.hi, rb.lo), (Some(h), Some(l)) if h <= l);
            let b_le_a = matches!((rb.hi, ra.lo), (Some(h), Some(l)) if h <= l);
            match (is_min, a_le_b, b_le_a) {
                (true, true, _) | (false, _, true) => a,
                (true, _, true) | (false, true, _) => b,
                (true, ..) => IExpr::min(a, b),
                (false, ..) => IExpr::max(a, b),
            }
        }
        IExpr::Select(c, a, b) => {
            let (lhs, rhs) = (simplify(&c.lhs, ext), simplify(&c.rhs, ext));
            let (a, b) = (simplify(a, ext), simplify(b, ext));
            match decide(c.op, &lhs, &rhs, ext) {
                Some(true) => a,
                Some(false) => b,
                None if a == b => a,
                None => IExpr::Select(Box::new(ICond { op: c.op, lhs, rhs }), Box::new(a), Box::new(b)),
            }
        }
        // A buffer's value is opaque: only its index simplifies.
        IExpr::Read { arg, index } => IExpr::read(*arg, simplify(index, ext)),
    }
}

/// Whether `lhs op rhs` holds everywhere (`Some(true)`), nowhere (`Some(false)`), or depends on the point.
pub fn decide(op: CmpOp, lhs: &IExpr, rhs: &IExpr, ext: Extents<'_>) -> Option<bool> {
    let d = linear(&IExpr::minus(lhs.clone(), rhs.clone()), ext).build();
    let r = range(&d, ext);
    match op {
        CmpOp::Lt if r.hi.is_some_and(|h| h < 0) => Some(true),
        CmpOp::Lt if r.lo.is_some_and(|l| l >= 0) => Some(false),
        CmpOp::Le if r.hi.is_some_and(|h| h <= 0) => Some(true),
        CmpOp::Le if r.lo.is_some_and(|l| l > 0) => Some(false),
        CmpOp::Eq if r.lo == Some(0) && r.hi == Some(0) => Some(true),
        CmpOp::Eq if r.lo.is_some_and(|l| l > 0) || r.hi.is_some_and(|h| h < 0) => Some(false),
        _ => None,
    }
}

/// Inclusive bounds of an index expression's values (`None`: unbounded on that side).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Range {
    /// Lower bound.
    pub lo: Option<i64>,
    /// Upper bound.
    pub hi: Option<i64>,
}

impl Range {
    fn exact(c: i64) -> Range {
        Range { lo: Some(c), hi: Some(c) }
    }

    fn within(&self, lo: i64, hi: i64) -> bool {
        self.lo.is_some_and(|l| l >= lo) && self.hi.is_some_and(|h| h <= hi)
    }
}

fn opt2(a: Option<i64>, b: Option<i64>, f: impl Fn(i64, i64) -> Option<i64>) -> Option<i64> {
    f(a?, b?)
}

/// The range of `e`'s values.
pub fn range(e: &IExpr, ext: Extents<'_>) -> Range {
    let nonneg = Range { lo: Some(0), hi: None };
    match e {
        IExpr::Const(c) => Range::exact(*c),
        IExpr::Var(v) => match ext(*v) {
            Some(n) => Range { lo: Some(0), hi: i64::try_from(n.max(1) - 1).ok() },
            None => nonneg,
        },
        IExpr::Sym(_) => nonneg,
        IExpr::Add(a, b) => {
            let (a, b) = (range(a, ext), range(b, ext));
            Range { lo: opt2(a.lo, b.lo, i64::checked_add), hi: opt2(a.hi, b.hi, i64::checked_add) }
        }
        IExpr::Sub(a, b) => {
            let (a, b) = (range(a, ext), range(b, ext));
            Range { lo: opt2(a.lo, b.hi, i64::checked_sub), hi: opt2(a.hi, b.lo, i64::checked_sub) }
        }
        IExpr::Mul(a, b) => {
            let (a, b) = (range(a, ext), range(b, ext));
            let corners = [(a.lo, b.lo), (a.lo, b.hi), (a.hi, b.lo), (a.hi, b.hi)];
            let prods: Option<Vec<i64>> = corners.iter().map(|&(x, y)| opt2(x, y, i64::checked_mul)).collect();
            match prods {
                Some(p) => Range { lo: p.iter().min().copied(), hi: p.iter().max().copied() },
                // Unbounded factors: only the sign survives, when both are non-negative.
                None if a.lo.is_some_and(|l| l >= 0) && b.lo.is_some_and(|l| l >= 0) => nonneg,
                None => Range { lo: None, hi: None },
            }
        }
        IExpr::FloorDiv(a, b) => match b.as_const() {
            Some(c) if c > 0 => {
                let a = range(a, ext);
                Range { lo: a.lo.map(|l| l.div_euclid(c)), hi: a.hi.map(|h| h.div_euclid(c)) }
            }
            _ => Range { lo: None, hi: None },
        },
        IExpr::Rem(_, b) => match b.as_const() {
            Some(c) if c > 0 => Range { lo: Some(0), hi: Some(c - 1) },
            _ => Range { lo: None, hi: None },
        },
        IExpr::Min(a, b) => {
            let (a, b) = (range(a, ext), range(b, ext));
            Range { lo: opt2(a.lo, b.lo, |x, y| Some(x.min(y))), hi: min_opt(a.hi, b.hi) }
        }
        IExpr::Max(a, b) => {
            let (a, b) = (range(a, ext), range(b, ext));
            Range { lo: max_opt(a.lo, b.lo), hi: opt2(a.hi, b.hi, |x, y| Some(x.max(y))) }
        }
        IExpr::Select(_, a, b) => {
            let (a, b) = (range(a, ext), range(b, ext));
            Range { lo: opt2(a.lo, b.lo, |x, y| Some(x.min(y))), hi: opt2(a.hi, b.hi, |x, y| Some(x.max(y))) }
        }
        IExpr::Read { .. } => Range { lo: None, hi: None },
    }
}

/// The smaller of two upper bounds, either of which may be missing (unbounded).
fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) | (None, x) => x,
    }
}

/// The larger of two lower bounds, either of which may be missing.
fn max_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) | (None, x) => x,
    }
}

/// `Σ coeff·atom + constant`, atoms in order of first appearance.
#[derive(Clone, Debug, Default)]
struct Linear {
    terms: Vec<(IExpr, i64)>,
    constant: i64,
}

impl Linear {
    fn add_term(&mut self, atom: IExpr, coeff: i64) {
        if coeff == 0 {
            return;
        }
        match self.terms.iter_mut().find(|(a, _)| *a == atom) {
            Some((_, c)) => *c = c.wrapping_add(coeff),
            None => self.terms.push((atom, coeff)),
        }
        self.terms.retain(|(_, c)| *c != 0);
    }

    fn add(&mut self, other: Linear, sign: i64) {
        for (a, c) in other.terms {
            self.add_term(a, c.wrapping_mul(sign));
        }
        self.constant = self.constant.wrapping_add(other.constant.wrapping_mul(sign));
    }

    fn scale(&mut self, k: i64) {
        for (_, c) in &mut self.terms {
            *c = c.wrapping_mul(k);
        }
        self.terms.retain(|(_, c)| *c != 0);
        self.constant = self.constant.wrapping_mul(k);
    }

    /// Folds `k·c·(x/c) + k·(x mod c)` back into `k·x` (floor division and remainder recombine exactly).
    fn merge_div_rem(&mut self) {
        let mut i = 0;
        while i < self.terms.len() {
            let (IExpr::FloorDiv(x, c), k_div) = &self.terms[i] else {
                i += 1;
                continue;
            };
            let Some(cv) = c.as_const().filter(|&cv| cv > 0 && k_div % cv == 0) else {
                i += 1;
                continue;
            };
            let k = k_div / cv;
            let rem = IExpr::Rem(x.clone(), c.clone());
            match self.terms.iter().position(|(t, kr)| *t == rem && *kr == k) {
                Some(j) => {
                    let x = (**x).clone();
                    let (hi, lo) = (i.max(j), i.min(j));
                    self.terms.remove(hi);
                    self.terms.remove(lo);
                    self.add_term(x, k);
                    i = 0;
                }
                None => i += 1,
            }
        }
    }

    fn as_const(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.constant)
    }

    /// Positive terms first (in order), then negative ones subtracted, then the constant.
    fn build(&self) -> IExpr {
        let term = |a: &IExpr, c: i64| if c == 1 { a.clone() } else { IExpr::times(a.clone(), IExpr::Const(c)) };
        let mut acc: Option<IExpr> = None;
        let mut constant = self.constant;
        // `c - t` reads better than `t*-1 + c` when nothing is added.
        if constant > 0 && self.terms.iter().all(|(_, c)| *c < 0) {
            acc = Some(IExpr::Const(constant));
            constant = 0;
        }
        for (a, c) in self.terms.iter().filter(|(_, c)| *c > 0) {
            let t = term(a, *c);
            acc = Some(match acc {
                None => t,
                Some(x) => IExpr::plus(x, t),
            });
        }
        for (a, c) in self.terms.iter().filter(|(_, c)| *c < 0) {
            let t = term(a, c.wrapping_neg());
            acc = Some(match acc {
                None => IExpr::times(t, IExpr::Const(-1)),
                Some(x) => IExpr::minus(x, t),
            });
        }
        match acc {
            None => IExpr::Const(constant),
            Some(x) if constant > 0 => IExpr::plus(x, IExpr::Const(constant)),
            Some(x) if constant < 0 => IExpr::minus(x, IExpr::Const(constant.wrapping_neg())),
            Some(x) => x,
        }
    }
}

/// The linear form of `e`, simplifying non-linear parts as atoms.
fn linear(e: &IExpr, ext: Extents<'_>) -> Linear {
    let mut l = linear_parts(e, ext);
    l.merge_div_rem();
    l
}

fn linear_parts(e: &IExpr, ext: Extents<'_>) -> Linear {
    match e {
        IExpr::Const(c) => Linear { terms: Vec::new(), constant: *c },
        IExpr::Add(a, b) | IExpr::Sub(a, b) => {
            let mut l = linear(a, ext);
            l.add(linear(b, ext), if matches!(e, IExpr::Add(..)) { 1 } else { -1 });
            l
        }
        IExpr::Mul(a, b) => {
            let (la, lb) = (linear(a, ext), linear(b, ext));
            match (la.as_const(), lb.as_const()) {
                (Some(x), _) => {
                    let mut l = lb;
                    l.scale(x);
                    l
                }
                (_, Some(y)) => {
                    let mut l = la;
                    l.scale(y);
                    l
                }
                _ => atom(IExpr::times(la.build(), lb.build())),
            }
        }
        other => {
            let s = simplify(other, ext);
            match s.as_const() {
                Some(c) => Linear { terms: Vec::new(), constant: c },
                None => atom(s),
            }
        }
    }
}

fn atom(e: IExpr) -> Linear {
    Linear { terms: vec![(e, 1)], constant: 0 }
}

/// `floor(a / b)` (`div`) or `a mod b`, both already simplified.
fn div_rem(a: IExpr, b: IExpr, ext: Extents<'_>, div: bool) -> IExpr {
    let make = |a: IExpr, b: IExpr| if div { IExpr::floor_div(a, b) } else { IExpr::modulo(a, b) };
    let Some(c) = b.as_const() else { return make(a, b) };
    if c == 0 {
        return IExpr::Const(0);
    }
    if let Some(x) = a.as_const() {
        return IExpr::Const(if div { floor_div(x, c) } else { floor_rem(x, c) });
    }
    if c == 1 {
        return if div { a } else { IExpr::Const(0) };
    }
    if c < 0 {
        return make(a, b);
    }
    // a = q·c + rest, with the constant split so that the rest's constant lies in 0..c.
    let l = linear(&a, ext);
    let mut q = Linear { terms: Vec::new(), constant: l.constant.div_euclid(c) };
    let mut rest = Linear { terms: Vec::new(), constant: l.constant.rem_euclid(c) };
    for (t, k) in l.terms {
        if k % c == 0 {
            q.add_term(t, k / c);
        } else {
            rest.add_term(t, k);
        }
    }
    let rest_e = rest.build();
    let rest_in_range = range(&rest_e, ext).within(0, c - 1);
    if div {
        if rest_in_range {
            return q.build();
        }
        if q.terms.is_empty() && q.constant == 0 {
            return make(rest_e, b);
        }
        let mut sum = q;
        sum.add(atom(make(rest_e, b)), 1);
        sum.build()
    } else if rest_in_range {
        rest_e
    } else {
        make(rest_e, b)
    }
}

pub use kiln_plan::kernel::{floor_div, floor_rem};

#[cfg(test)]
mod tests {
    use super::*;

    fn v(i: u32) -> IExpr {
        IExpr::Var(LoopVar(i))
    }

    fn c(x: i64) -> IExpr {
        IExpr::Const(x)
    }

    fn ext(v: LoopVar) -> Option<u64> {
        [Some(4), Some(6), None].get(v.0 as usize).copied().flatten()
    }

    #[test]
    fn folds_and_cancels() {
        let s = |e: IExpr| simplify(&e, &ext);
        assert_eq!(s(IExpr::plus(IExpr::times(v(0), c(1)), c(0))), v(0));
        assert_eq!(s(IExpr::times(IExpr::plus(c(2), c(3)), c(4))), c(20));
        assert_eq!(s(IExpr::floor_div(IExpr::times(v(2), c(3)), c(3))), v(2));
        // (i0*6 + i1) / 6 = i0 and mod 6 = i1, since i1 < 6.
        let flat = IExpr::plus(IExpr::times(v(0), c(6)), v(1));
        assert_eq!(s(IExpr::floor_div(flat.clone(), c(6))), v(0));
        assert_eq!(s(IExpr::modulo(flat.clone(), c(6))), v(1));
        // i0 < 4, so i0 mod 8 is i0, and i0 / 8 is 0.
        assert_eq!(s(IExpr::modulo(v(0), c(8))), v(0));
        assert_eq!(s(IExpr::floor_div(v(0), c(8))), c(0));
        // The unbounded var keeps its division.
        assert_eq!(s(IExpr::floor_div(v(2), c(2))), IExpr::floor_div(v(2), c(2)));
        assert_eq!(s(IExpr::min(v(0), c(3))), v(0));
        assert_eq!(s(IExpr::max(IExpr::minus(v(0), c(0)), c(0))), v(0));
        assert_eq!(s(IExpr::select(CmpOp::Lt, v(1), c(6), v(0), c(9))), v(0));
        assert_eq!(s(IExpr::minus(v(1), v(1))), c(0));
        assert_eq!(s(IExpr::modulo(c(-7), c(3))), c(2));
        assert_eq!(s(IExpr::floor_div(c(-7), c(2))), c(-4));
        // (i2/6)*6 + i2%6 is i2 again.
        let split = IExpr::plus(IExpr::times(IExpr::floor_div(v(2), c(6)), c(6)), IExpr::modulo(v(2), c(6)));
        assert_eq!(s(IExpr::plus(split, v(0))), IExpr::plus(v(2), v(0)));
        assert_eq!(s(IExpr::minus(c(4), v(0))), IExpr::minus(c(4), v(0)));
    }

    #[test]
    fn reads_are_opaque_atoms() {
        use crate::kernel::ir::ArgId;
        let s = |e: IExpr| simplify(&e, &ext);
        let r = |i: IExpr| IExpr::read(ArgId(1), i);
        // The index inside simplifies; the value is never assumed in range, so no clamp or select folds.
        assert_eq!(s(r(IExpr::plus(v(0), c(0)))), r(v(0)));
        let clamp = IExpr::max(IExpr::min(r(v(0)), c(9)), c(0));
        assert_eq!(s(clamp.clone()), clamp);
        let wrap = IExpr::select(CmpOp::Lt, r(v(0)), c(0), IExpr::plus(r(v(0)), c(10)), r(v(0)));
        assert_eq!(s(wrap.clone()), wrap);
        assert_eq!(range(&r(v(0)), &ext), Range { lo: None, hi: None });
        assert_eq!(s(IExpr::floor_div(r(v(0)), c(4))), IExpr::floor_div(r(v(0)), c(4)));
        // In linear forms a read is an atom: coefficients fold around it, and equal reads (one element of a
        // read-only buffer) cancel.
        assert_eq!(s(IExpr::plus(IExpr::times(r(v(1)), c(2)), r(v(1)))), IExpr::times(r(v(1)), c(3)));
        assert_eq!(s(IExpr::minus(r(v(1)), r(v(1)))), c(0));
        assert_ne!(s(IExpr::minus(r(v(1)), r(v(0)))), c(0));
    }
}
