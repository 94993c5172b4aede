//! Element types, dimensions and shapes.
//!
//! A [`Shape`] is a list of [`Dim`]s; a dim is either a static extent or a named symbolic extent (`batch`) whose
//! value is bound when concrete inputs arrive. Broadcasting follows numpy: shapes are aligned on the right, and a
//! dim of 1 stretches to the other side. Two different symbols never broadcast against each other, since either
//! could be 1 at run time and the result type would depend on values.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A pattern matching every narrow storage dtype (float8, float4, int4/uint4, int2/uint2): one byte per
/// element in memory, converted but never computed on. Matches that treat them alike use it, so adding a narrow
/// type is one edit here.
#[macro_export]
macro_rules! narrow_dtypes {
    () => {
        $crate::DType::F8E4M3FN
            | $crate::DType::F8E4M3FNUZ
            | $crate::DType::F8E5M2
            | $crate::DType::F8E5M2FNUZ
            | $crate::DType::F8E8M0
            | $crate::DType::F4E2M1
            | $crate::DType::I4
            | $crate::DType::U4
            | $crate::DType::I2
            | $crate::DType::U2
    };
}

/// The element type of a tensor.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
    /// IEEE 754 binary64.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Boolean, one byte per element (0 or 1).
    Bool,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// float8 e4m3 without infinities (ONNX FLOAT8E4M3FN), one byte per element.
    F8E4M3FN,
    /// float8 e4m3 without infinities or negative zero (ONNX FLOAT8E4M3FNUZ).
    F8E4M3FNUZ,
    /// float8 e5m2 (ONNX FLOAT8E5M2).
    F8E5M2,
    /// float8 e5m2 without infinities or negative zero (ONNX FLOAT8E5M2FNUZ).
    F8E5M2FNUZ,
    /// float8 e8m0, a power of two (ONNX FLOAT8E8M0).
    F8E8M0,
    /// float4 e2m1 (ONNX FLOAT4E2M1), one element per byte in memory (packed two per byte in ONNX files).
    F4E2M1,
    /// Signed 4-bit integer, one element per byte in memory (sign-extended).
    I4,
    /// Unsigned 4-bit integer, one element per byte in memory.
    U4,
    /// Signed 2-bit integer, one element per byte in memory (sign-extended).
    I2,
    /// Unsigned 2-bit integer, one element per byte in memory.
    U2,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 23] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::I16,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F8E8M0,
        DType::F4E2M1,
        DType::I4,
        DType::U4,
        DType::I2,
        DType::U2,
    ];

    /// The text spelling (`f32`, `bf16`, `bool`, …) used by `.kir` and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F8E4M3FNUZ => "f8e4m3fnuz",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E5M2FNUZ => "f8e5m2fnuz",
            DType::F8E8M0 => "f8e8m0",
            DType::F4E2M1 => "f4e2m1",
            DType::I4 => "i4",
            DType::U4 => "u4",
            DType::I2 => "i2",
            DType::U2 => "u2",
        }
    }

    /// Parses a dtype from its text spelling.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool | crate::narrow_dtypes!() => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// The machine epsilon of a floating-point type (the distance from 1.0 to the next value), `None` for the
    /// others.
    pub fn epsilon(self) -> Option<f64> {
        match self {
            DType::F32 => Some(f64::from(f32::EPSILON)),
            DType::F16 => Some(2f64.powi(-10)),
            DType::BF16 => Some(2f64.powi(-7)),
            DType::F64 => Some(f64::EPSILON),
            _ => None,
        }
    }

    /// True for the integer types (not bool).
    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::I32 | DType::U32 | DType::I64 | DType::U64
        )
    }

    /// True for the storage types narrower than a byte or of 8-bit float formats (float8, float4, int4, uint4,
    /// int2, uint2): kiln keeps one element per byte in memory, converts them with `cast` (and the quantization
    /// ops), moves them (reshape, transpose, gather, concat, …) and computes nothing else on them. They run on
    /// the reference interpreter.
    pub fn is_narrow(self) -> bool {
        matches!(self, crate::narrow_dtypes!())
    }

    /// True for the narrow float formats (float8, float4).
    pub fn is_narrow_float(self) -> bool {
        self.is_narrow() && self.narrow_int_range().is_none()
    }

    /// The value range of the narrow integer types (`None` for the others).
    pub fn narrow_int_range(self) -> Option<(i64, i64)> {
        match self {
            DType::I4 => Some((-8, 7)),
            DType::U4 => Some((0, 15)),
            DType::I2 => Some((-2, 1)),
            DType::U2 => Some((0, 3)),
            _ => None,
        }
    }

    /// The bits an element takes in an ONNX file (4 for float4/int4/uint4, 2 for int2/uint2, else 8 × the size).
    pub fn packed_bits(self) -> u32 {
        match self {
            DType::F4E2M1 | DType::I4 | DType::U4 => 4,
            DType::I2 | DType::U2 => 2,
            d => 8 * d.size_bytes() as u32,
        }
    }

    /// True for the unsigned integer types (not bool).
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::U8 | DType::U16 | DType::U32 | DType::U64)
    }

    /// The bit width of an integer type (`None` for the others).
    pub fn int_bits(self) -> Option<u32> {
        match self {
            DType::I8 | DType::U8 => Some(8),
            DType::I16 | DType::U16 => Some(16),
            DType::I32 | DType::U32 => Some(32),
            DType::I64 | DType::U64 => Some(64),
            _ => None,
        }
    }

    /// The smallest and largest value of an integer type, as i128 (`None` for the others).
    pub fn int_range(self) -> Option<(i128, i128)> {
        let bits = self.int_bits()?;
        Some(if self.is_unsigned() {
            (0, (1i128 << bits) - 1)
        } else {
            (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
        })
    }

    /// True for signed numeric types (floats and signed integers).
    pub fn is_signed(self) -> bool {
        self.is_float() || matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One dimension of a shape: a static extent or a named symbol.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Dim {
    /// A known extent.
    Static(u64),
    /// A named extent bound at run time (`batch`, `seq`).
    Sym(String),
}

impl Dim {
    /// The static extent, if known.
    pub fn as_static(&self) -> Option<u64> {
        match self {
            Dim::Static(n) => Some(*n),
            Dim::Sym(_) => None,
        }
    }

    /// A symbolic dim named `name`.
    pub fn sym(name: impl Into<String>) -> Dim {
        Dim::Sym(name.into())
    }

    /// This dim with the symbols `bindings` binds replaced by their values: a bound symbol becomes static, a
    /// derived dim ([`crate::dim`]) is re-evaluated (static once every symbol it reads is bound).
    pub fn substitute(&self, bindings: &std::collections::BTreeMap<String, u64>) -> Dim {
        match self {
            Dim::Static(_) => self.clone(),
            Dim::Sym(s) => match bindings.get(s) {
                Some(&n) => Dim::Static(n),
                None if crate::dim::is_identifier(s) => self.clone(),
                None => crate::dim::DimExpr::parse(s)
                    .map(|e| e.substitute(&|name| bindings.get(name).and_then(|&n| i64::try_from(n).ok())))
                    .and_then(|e| e.to_dim())
                    .unwrap_or_else(|| self.clone()),
            },
        }
    }

    /// Whether this is a derived dim: an expression over symbols ([`crate::dim`]), not a static extent or a
    /// plain symbol.
    pub fn is_derived(&self) -> bool {
        matches!(self, Dim::Sym(s) if !crate::dim::is_identifier(s))
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Dim {
        Dim::Static(n)
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Static(n as u64)
    }
}

impl From<&str> for Dim {
    fn from(name: &str) -> Dim {
        Dim::Sym(name.to_string())
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Static(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// A tensor shape: static and symbolic dims, outermost first. The empty shape is a scalar.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    /// A fully static shape.
    pub fn of(dims: &[u64]) -> Shape {
        Shape(dims.iter().map(|&d| Dim::Static(d)).collect())
    }

    /// The scalar shape `[]`.
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The dims.
    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    /// The extents if every dim is static.
    pub fn as_static(&self) -> Option<Vec<usize>> {
        self.0.iter().map(|d| d.as_static().map(|n| n as usize)).collect()
    }

    /// True when every dim is static.
    pub fn is_static(&self) -> bool {
        self.0.iter().all(|d| matches!(d, Dim::Static(_)))
    }

    /// Element count when static.
    pub fn num_elements(&self) -> Option<u64> {
        self.0.iter().try_fold(1u64, |acc, d| d.as_static().and_then(|n| acc.checked_mul(n)))
    }

    /// Replaces each symbol bound in `bindings` by its value, and evaluates what that makes of derived dims
    /// ([`crate::dim`]).
    pub fn substitute(&self, bindings: &std::collections::BTreeMap<String, u64>) -> Shape {
        Shape(self.0.iter().map(|d| d.substitute(bindings)).collect())
    }

    /// The numpy broadcast of two shapes, or a message saying which dims disagree.
    pub fn broadcast(&self, other: &Shape) -> Result<Shape, String> {
        let rank = self.rank().max(other.rank());
        let mut out = Vec::with_capacity(rank);
        for i in 0..rank {
            let a = dim_from_right(self, rank - i);
            let b = dim_from_right(other, rank - i);
            out.push(
                broadcast_dim(&a, &b)
                    .ok_or_else(|| format!("shapes {self} and {other} do not broadcast (dim {a} vs {b})"))?,
            );
        }
        Ok(Shape(out))
    }

    /// Normalizes a possibly negative axis against this rank.
    pub fn axis(&self, axis: i64) -> Result<usize, String> {
        normalize_axis(axis, self.rank())
    }
}

fn dim_from_right(s: &Shape, from_right: usize) -> Dim {
    if from_right > s.rank() { Dim::Static(1) } else { s.0[s.rank() - from_right].clone() }
}

fn broadcast_dim(a: &Dim, b: &Dim) -> Option<Dim> {
    match (a, b) {
        (Dim::Static(1), x) | (x, Dim::Static(1)) => Some(x.clone()),
        (x, y) if x == y => Some(x.clone()),
        _ => None,
    }
}

/// Normalizes `axis` (negative counts from the end) against `rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank.max(1) as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) { Ok(a as usize) } else { Err(format!("axis {axis} is out of range for rank {rank}")) }
}

/// Broadcasts two static shapes (numpy rules).
pub fn broadcast_static(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let get = |s: &[usize], i: usize| if i + s.len() < rank { 1 } else { s[i + s.len() - rank] };
    (0..rank)
        .map(|i| match (get(a, i), get(b, i)) {
            (1, y) => Some(y),
            (x, 1) => Some(x),
            (x, y) if x == y => Some(x),
            _ => None,
        })
        .collect()
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The type of a value: dtype and shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Shape,
}

impl TensorType {
    /// A tensor type.
    pub fn new(dtype: DType, shape: Shape) -> TensorType {
        TensorType { dtype, shape }
    }

    /// A static tensor type.
    pub fn of(dtype: DType, dims: &[u64]) -> TensorType {
        TensorType { dtype, shape: Shape::of(dims) }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_rules() {
        let a = Shape(vec![Dim::sym("batch"), Dim::Static(1), Dim::Static(4)]);
        let b = Shape::of(&[3, 1]);
        assert_eq!(a.broadcast(&b).unwrap().to_string(), "[batch,3,4]");
        assert!(Shape::of(&[2]).broadcast(&Shape::of(&[3])).is_err());
        assert!(Shape(vec![Dim::sym("a")]).broadcast(&Shape(vec![Dim::sym("b")])).is_err());
        assert_eq!(broadcast_static(&[0, 1], &[3]), Some(vec![0, 3]));
    }

    #[test]
    fn axes() {
        assert_eq!(normalize_axis(-1, 3), Ok(2));
        assert_eq!(normalize_axis(0, 0), Ok(0));
        assert!(normalize_axis(3, 3).is_err());
        assert!(normalize_axis(-4, 3).is_err());
    }
}
