//! Symbolic dim expressions: extents computed from named symbols (`batch`, `height`) by the arithmetic shape
//! rules need — sums, products, floor division by a constant.
//!
//! A convolution of a `[N,3,H,W]` input by a 3×3 window with stride 2 and padding 1 has output height
//! `(H-1)/2+1`; a concat of `[N,S]` and `[N,T]` along dim 1 has `S+T`. Such a dim is a [`Dim::Sym`] whose name
//! is the expression's **canonical text**: equal expressions print the same, so dims compare, hash and
//! serialize as strings do, and two branches that compute one extent the same way (a ResNet block's 3×3
//! stride-2 convolution and its 1×1 stride-2 shortcut both give `(H-1)/2+1`) agree without further proof. A
//! plain symbol is the expression of one identifier. The values of derived dims follow from the symbols the
//! inputs bind ([`DimExpr::eval`]); nothing else binds them.
//!
//! The canonical form is a polynomial with integer coefficients over atoms, each atom a symbol or the floor
//! division of a canonical expression by a constant ≥ 2 (which is kept only when it is not exact): terms are
//! ordered by their atoms, the constant comes last, a coefficient of 1 is not written. `/` is floor division
//! and binds like `*`; a divisor is always a positive integer constant.

use std::collections::BTreeMap;
use std::fmt;

use crate::types::Dim;

/// One factor of a term: a symbol, or a canonical expression floor-divided by a constant ≥ 2.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Atom {
    Sym(String),
    Div(Box<DimExpr>, i64),
}

/// A symbolic dim expression in canonical form (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DimExpr {
    /// Monomial (sorted atoms, repeated for powers) → coefficient (never 0).
    terms: BTreeMap<Vec<Atom>, i64>,
    constant: i64,
}

impl DimExpr {
    /// The constant `n`.
    pub fn constant(n: i64) -> DimExpr {
        DimExpr { terms: BTreeMap::new(), constant: n }
    }

    /// The symbol `name`.
    pub fn symbol(name: &str) -> DimExpr {
        let mut terms = BTreeMap::new();
        terms.insert(vec![Atom::Sym(name.to_string())], 1);
        DimExpr { terms, constant: 0 }
    }

    /// The expression of `d`: its extent, or its symbol's (or derived dim's) expression. `None` for a name that
    /// is neither an identifier nor canonical expression text.
    pub fn of(d: &Dim) -> Option<DimExpr> {
        match d {
            Dim::Static(n) => i64::try_from(*n).ok().map(DimExpr::constant),
            Dim::Sym(s) => DimExpr::parse(s),
        }
    }

    /// The dim this expression is: static when constant and non-negative, a plain symbol, or a derived dim
    /// named by its canonical text. `None` for a negative constant (no extent).
    pub fn to_dim(&self) -> Option<Dim> {
        match self.as_constant() {
            Some(n) => u64::try_from(n).ok().map(Dim::Static),
            None => Some(Dim::Sym(self.to_string())),
        }
    }

    /// The value when the expression is constant.
    pub fn as_constant(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.constant)
    }

    /// Whether the expression is within the size a dim may have (terms, factors per term): a model whose shape
    /// arithmetic builds a larger one (repeated squaring of sums) is refused where it would be built.
    pub fn within_limits(&self) -> bool {
        self.terms.len() <= MAX_TERMS && self.terms.keys().all(|m| m.len() <= MAX_FACTORS)
    }

    /// The number of terms (for callers that bound a product before computing it).
    pub fn term_count(&self) -> usize {
        self.terms.len().max(1)
    }

    /// Every symbol the expression reads, sorted, once each.
    pub fn symbols(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.collect_symbols(&mut out);
        out.sort();
        out.dedup();
        out
    }

    fn collect_symbols(&self, out: &mut Vec<String>) {
        for atoms in self.terms.keys() {
            for a in atoms {
                match a {
                    Atom::Sym(s) => out.push(s.clone()),
                    Atom::Div(e, _) => e.collect_symbols(out),
                }
            }
        }
    }

    /// `self + other`.
    pub fn add(&self, other: &DimExpr) -> DimExpr {
        let mut out = self.clone();
        for (atoms, c) in &other.terms {
            out.add_term(atoms.clone(), *c);
        }
        out.constant = out.constant.saturating_add(other.constant);
        out
    }

    /// `self + n`.
    pub fn add_constant(&self, n: i64) -> DimExpr {
        self.add(&DimExpr::constant(n))
    }

    /// `self * n`.
    pub fn scale(&self, n: i64) -> DimExpr {
        if n == 0 {
            return DimExpr::constant(0);
        }
        DimExpr {
            terms: self.terms.iter().map(|(a, c)| (a.clone(), c.saturating_mul(n))).collect(),
            constant: self.constant.saturating_mul(n),
        }
    }

    /// `self * other`.
    pub fn mul(&self, other: &DimExpr) -> DimExpr {
        let mut out = DimExpr::constant(self.constant.saturating_mul(other.constant));
        for (a, ca) in &self.terms {
            out.add_term(a.clone(), ca.saturating_mul(other.constant));
            for (b, cb) in &other.terms {
                let mut atoms = a.clone();
                atoms.extend(b.iter().cloned());
                atoms.sort();
                out.add_term(atoms, ca.saturating_mul(*cb));
            }
        }
        for (b, cb) in &other.terms {
            out.add_term(b.clone(), cb.saturating_mul(self.constant));
        }
        out
    }

    /// `floor(self / d)` for `d ≥ 1`; exact division is carried out, anything else kept as an atom.
    pub fn floor_div(&self, d: i64) -> DimExpr {
        assert!(d >= 1, "dim expressions divide by positive constants");
        if d == 1 {
            return self.clone();
        }
        if self.terms.values().all(|c| c % d == 0) {
            // floor((d·P + c) / d) = P + floor(c / d) for a polynomial P with integer coefficients.
            return DimExpr {
                terms: self.terms.iter().map(|(a, c)| (a.clone(), c / d)).collect(),
                constant: self.constant.div_euclid(d),
            };
        }
        // Pull whole multiples of d out of the constant so equal quotients print alike: floor((P + c)/d) =
        // floor((P + c mod d)/d) + c div d.
        let inner = DimExpr { terms: self.terms.clone(), constant: self.constant.rem_euclid(d) };
        let mut out = DimExpr::constant(self.constant.div_euclid(d));
        out.add_term(vec![Atom::Div(Box::new(inner), d)], 1);
        out
    }

    /// `ceil(self / d)` for `d ≥ 1`.
    pub fn ceil_div(&self, d: i64) -> DimExpr {
        self.add_constant(d - 1).floor_div(d)
    }

    fn add_term(&mut self, atoms: Vec<Atom>, c: i64) {
        if atoms.is_empty() {
            self.constant = self.constant.saturating_add(c);
            return;
        }
        let v = self.terms.entry(atoms.clone()).or_insert(0);
        *v = v.saturating_add(c);
        if *v == 0 {
            self.terms.remove(&atoms);
        }
    }

    /// The value with the symbols bound by `lookup`; `Err` names an unbound symbol or says that the arithmetic
    /// overflows.
    pub fn eval(&self, lookup: &dyn Fn(&str) -> Option<i64>) -> Result<i64, String> {
        let overflow = || "a derived dim overflows 64 bits".to_string();
        let mut sum = self.constant;
        for (atoms, c) in &self.terms {
            let mut term = *c;
            for a in atoms {
                let v = match a {
                    Atom::Sym(s) => lookup(s).ok_or_else(|| format!("symbol `{s}` is unbound"))?,
                    Atom::Div(e, d) => e.eval(lookup)?.div_euclid(*d),
                };
                term = term.checked_mul(v).ok_or_else(overflow)?;
            }
            sum = sum.checked_add(term).ok_or_else(overflow)?;
        }
        Ok(sum)
    }

    /// The expression with the symbols `bindings` binds replaced by their values (re-canonicalized).
    pub fn substitute(&self, bindings: &dyn Fn(&str) -> Option<i64>) -> DimExpr {
        let mut out = DimExpr::constant(self.constant);
        for (atoms, c) in &self.terms {
            let mut term = DimExpr::constant(*c);
            for a in atoms {
                let v = match a {
                    Atom::Sym(s) => bindings(s).map_or_else(|| DimExpr::symbol(s), DimExpr::constant),
                    Atom::Div(e, d) => e.substitute(bindings).floor_div(*d),
                };
                term = term.mul(&v);
            }
            out = out.add(&term);
        }
        out
    }

    /// Parses expression text (identifiers, integers, `+ - * /`, parentheses; `/` by a positive integer
    /// constant) into canonical form. `None` when it is not such text.
    pub fn parse(text: &str) -> Option<DimExpr> {
        let mut p = ExprParser { s: text.as_bytes(), i: 0, depth: 0 };
        let e = p.sum()?;
        (p.i == p.s.len()).then_some(e)
    }
}

/// Whether `name` is a plain symbol: a letter or `_`, then letters, digits and `_`.
pub fn is_identifier(name: &str) -> bool {
    let mut c = name.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_') && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

/// Whether `name` names a valid symbolic dim: a plain symbol, or a derived dim's canonical expression text.
pub fn is_valid_dim_name(name: &str) -> bool {
    is_identifier(name) || DimExpr::parse(name).is_some_and(|e| e.as_constant().is_none() && e.to_string() == name)
}

/// Recursive descent over `sum := product (('+'|'-') product)*`, `product := unary (('*' unary) | ('/' int))*`,
/// `unary := '-' unary | atom`, `atom := int | ident | '(' sum ')'`.
struct ExprParser<'a> {
    s: &'a [u8],
    i: usize,
    depth: u32,
}

/// The most terms, and factors per term, a parsed expression may have: text is user input, and multiplying sums
/// multiplies their terms (`(A+B+C)*(A+B+C)*…` would grow without bound). Shape rules never come near it.
const MAX_TERMS: usize = 64;
const MAX_FACTORS: usize = 16;

impl ExprParser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    /// `e`, when within the size limits.
    fn bounded(e: DimExpr) -> Option<DimExpr> {
        e.within_limits().then_some(e)
    }

    fn sum(&mut self) -> Option<DimExpr> {
        let mut e = self.product()?;
        while let Some(op @ (b'+' | b'-')) = self.peek() {
            self.i += 1;
            let rhs = self.product()?;
            e = Self::bounded(if op == b'+' { e.add(&rhs) } else { e.add(&rhs.scale(-1)) })?;
        }
        Some(e)
    }

    fn product(&mut self) -> Option<DimExpr> {
        let mut e = self.unary()?;
        loop {
            match self.peek() {
                Some(b'*') => {
                    self.i += 1;
                    let rhs = self.unary()?;
                    // Checked before multiplying: the product of two bounded sums is at most their sizes' product.
                    if e.term_count() * rhs.term_count() > MAX_TERMS * MAX_TERMS {
                        return None;
                    }
                    e = Self::bounded(e.mul(&rhs))?;
                }
                Some(b'/') => {
                    self.i += 1;
                    let d = self.integer()?;
                    if d < 1 {
                        return None;
                    }
                    e = e.floor_div(d);
                }
                _ => return Some(e),
            }
        }
    }

    fn unary(&mut self) -> Option<DimExpr> {
        if self.peek() == Some(b'-') {
            self.i += 1;
            self.enter()?;
            let e = self.unary()?.scale(-1);
            self.depth -= 1;
            return Some(e);
        }
        self.atom()
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= 64).then_some(())
    }

    fn integer(&mut self) -> Option<i64> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        std::str::from_utf8(&self.s[start..self.i]).ok()?.parse().ok()
    }

    fn atom(&mut self) -> Option<DimExpr> {
        match self.peek()? {
            b'(' => {
                self.i += 1;
                self.enter()?;
                let e = self.sum()?;
                self.depth -= 1;
                (self.peek() == Some(b')')).then(|| self.i += 1)?;
                Some(e)
            }
            c if c.is_ascii_digit() => self.integer().map(DimExpr::constant),
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.i;
                while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_') {
                    self.i += 1;
                }
                Some(DimExpr::symbol(std::str::from_utf8(&self.s[start..self.i]).ok()?))
            }
            _ => None,
        }
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Sym(s) => f.write_str(s),
            Atom::Div(e, d) => {
                if e.terms.len() + usize::from(e.constant != 0) > 1 || e.terms.values().any(|&c| c != 1) {
                    write!(f, "({e})/{d}")
                } else {
                    write!(f, "{e}/{d}")
                }
            }
        }
    }
}

impl fmt::Display for DimExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (atoms, &c) in &self.terms {
            let (sign, mag) = if c < 0 { ("-", c.unsigned_abs()) } else { ("+", c as u64) };
            if !first || sign == "-" {
                f.write_str(sign)?;
            }
            first = false;
            if mag != 1 {
                write!(f, "{mag}*")?;
            }
            for (i, a) in atoms.iter().enumerate() {
                if i > 0 {
                    f.write_str("*")?;
                }
                // `/` binds like `*`, left to right: a quotient after another factor needs parentheses.
                match a {
                    Atom::Div(..) if i > 0 || mag != 1 => write!(f, "({a})")?,
                    _ => write!(f, "{a}")?,
                }
            }
        }
        if first {
            write!(f, "{}", self.constant)
        } else if self.constant != 0 {
            write!(f, "{}{}", if self.constant < 0 { "-" } else { "+" }, self.constant.unsigned_abs())
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(s: &str) -> DimExpr {
        DimExpr::parse(s).unwrap_or_else(|| panic!("`{s}` parses"))
    }

    #[test]
    fn canonical_text_identifies_equal_expressions() {
        // A 3x3 stride-2 pad-1 conv and a 1x1 stride-2 conv of one input give one extent.
        let h = DimExpr::symbol("H");
        let conv3 = h.add_constant(2 - 3).floor_div(2).add_constant(1);
        let conv1 = h.add_constant(-1).floor_div(2).add_constant(1);
        assert_eq!(conv3, conv1);
        assert_eq!(conv3.to_string(), "(H+1)/2");
        assert_eq!(e("(H-1)/2+1"), conv3);
        assert_eq!(e("2*H/2"), h);
        assert_eq!(e("H+W-W"), h);
        assert_eq!(e("W*H+2*S+T").to_string(), "H*W+2*S+T");
        assert_eq!(e("(S+T)*2").to_string(), "2*S+2*T");
        assert_eq!(e("4-(N-1)").to_string(), "-N+5");
        assert_eq!(e("2*((W+1)/2)").to_string(), "2*((W+1)/2)");
        assert_ne!(e("2*((W+1)/2)"), e("2*(W+1)/2"), "a quotient times 2 is not twice the sum halved");
        assert_eq!(e("((W+1)/2)*H").to_string(), "H*((W+1)/2)");
        for text in ["(H+1)/2", "H*W+2*S+T", "-N+5", "((H+1)/2+1)/2", "N*N", "2*((W+1)/2)", "H*((W+1)/2)", "(H+1)/2/2"]
        {
            assert_eq!(e(text).to_string(), text, "canonical text reparses to itself");
            assert!(is_valid_dim_name(text), "{text}");
        }
        assert!(!is_valid_dim_name("(H-1)/2+1"), "only canonical text names a dim");
        for bad in ["", "H+", "H/0", "H/W", "(H", "H)", "3", "H$", "1/2"] {
            assert!(!is_valid_dim_name(bad), "`{bad}`");
        }
    }

    #[test]
    fn evaluation_floors_and_reports_unbound_symbols() {
        let lookup = |s: &str| match s {
            "H" => Some(224),
            "W" => Some(7),
            _ => None,
        };
        assert_eq!(e("(H+1)/2").eval(&lookup), Ok(112));
        assert_eq!(e("((H+1)/2+1)/2").eval(&lookup), Ok(56));
        assert_eq!(e("(W-8)/2").eval(&lookup), Ok(-1), "floor division rounds toward -inf");
        assert_eq!(e("H*W+3").eval(&lookup), Ok(1571));
        assert!(e("H+Q").eval(&lookup).unwrap_err().contains("`Q`"));
        assert!(e("H*H*H*H*H*H*H*H*H*H").eval(&lookup).unwrap_err().contains("overflows"));
        assert_eq!(e("H-H+4").to_dim(), Some(Dim::Static(4)));
        assert_eq!(e("H").to_dim(), Some(Dim::Sym("H".into())));
        assert_eq!(e("H-H-4").to_dim(), None);
    }

    #[test]
    fn expressions_that_would_grow_without_bound_are_refused() {
        let sum = "(A+B+C+D+E+F+G+H)";
        let power = vec![sum; 40].join("*");
        let t = std::time::Instant::now();
        assert!(DimExpr::parse(&power).is_none());
        assert!(t.elapsed() < std::time::Duration::from_secs(1), "refused quickly");
        assert!(DimExpr::parse(&vec!["H"; 40].join("*")).is_none(), "a term of 40 factors");
        assert!(DimExpr::parse(&vec!["H"; 16].join("*")).is_some());
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let deep = format!("{}H{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(DimExpr::parse(&deep).is_none());
        let neg = format!("{}H", "-".repeat(10_000));
        assert!(DimExpr::parse(&neg).is_none());
    }
}
