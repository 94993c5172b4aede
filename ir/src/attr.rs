//! Attribute values and their text form.
//!
//! Every op attribute struct is declared with [`attrs!`](crate::attrs), which generates the struct, its printer
//! and its parser from one field list, so the `.kir` form of an op's attributes cannot drift from its Rust form.
//! Attributes print as `{name=value, …}` in declaration order; parsing requires every field, in any order, and
//! rejects unknown or repeated names.

use std::fmt::Write as _;

use crate::tensor::{Data, Tensor};
use crate::types::{DType, Dim, Shape};

/// A token-level reader of attribute values, implemented by the `.kir` parser.
pub trait AttrSource {
    /// Reads a signed integer.
    fn int(&mut self) -> Result<i64, String>;
    /// Reads an integer literal of any 64-bit type, signed or unsigned (for constants of `u64`).
    fn wide_int(&mut self) -> Result<i128, String>;
    /// Reads a float (`1.5`, `-2e-3`, `nan`, `inf`, `-inf`; integers are accepted).
    fn float(&mut self) -> Result<f64, String>;
    /// Reads a bare identifier (`true`, `sum`, `f32`, `batch`).
    fn ident(&mut self) -> Result<String, String>;
    /// Reads a quoted string.
    fn string(&mut self) -> Result<String, String>;
    /// Consumes `c` if it is the next character (after whitespace); says whether it did.
    fn eat(&mut self, c: char) -> bool;
    /// Requires `c` next.
    fn expect(&mut self, c: char) -> Result<(), String>;
    /// Reads a type `dtype[dims]`.
    fn tensor_type(&mut self) -> Result<(DType, Shape), String>;
    /// Reads one dim as a type writes it: an extent, a symbol, or a derived dim (`2*H`, `(H+1)/2`).
    fn dim(&mut self) -> Result<Dim, String>;
    /// Reads a nested graph `graph "name" { … }` (a `fusion` body), type-checked as a graph of its own.
    fn graph(&mut self) -> Result<crate::graph::Graph, String>;
}

/// A value that can stand as an attribute.
pub trait AttrValue: Sized {
    /// Appends the text form.
    fn print(&self, out: &mut String);
    /// Reads the text form.
    fn parse(src: &mut dyn AttrSource) -> Result<Self, String>;
}

impl AttrValue for i64 {
    fn print(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
    fn parse(src: &mut dyn AttrSource) -> Result<Self, String> {
        src.int()
    }
}

/// Prints a float so that parsing gives back the same bits (except NaN payloads).
pub fn print_f64(v: f64, out: &mut String) {
    if v.is_nan() {
        out.push_str("nan");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "inf" } else { "-inf" });
    } else {
        // `{:?}` is Rust's shortest round-trip form and always carries a `.` or exponent.
        let _ = write!(out, "{v:?}");
    }
}

impl AttrValue for f64 {
    fn print(&self, out: &mut String) {
        print_f64(*self, out);
    }
    fn parse(src: &mut dyn AttrSource) -> Result<Self, String> {
        src.float()
    }
}

impl AttrValue for bool {
    fn print(&self, out: &mut String) {
        out.push_str(if *self { "true" } else { "false" });
    }
    fn parse(src: &mut dyn AttrSource) -> Result<Self, String> {
        match src.ident()?.as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(format!("expected true or false, found `{other}`")),
        }
    }
}

impl AttrValue for String {
    fn print(&self, out: &mut String) {
        print_string(self, out);
    }
    fn parse(src: &mut dyn AttrSource) -> Result<Self, String> {
        src.string()
    }
}

/// Prints a string literal with `"` and `\` escaped, and control characters as `\u{..}`.
pub fn print_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

impl AttrValue for DType {
    fn print(&self, out: &mut String) {
        out.push_str(self.name());
    }
    fn parse(src: &mut dyn AttrSource) -> Result<Self, String> {
        let name = src.ident()?;
        DType::from_name(&name).ok_or_else(|| format!("unknown dtype `{name}`"))
    }
}

impl<T: AttrValue> AttrValue for Vec<T> {
    fn print(&self, out: &mut String) {
        out.push('[');
        for (i, v) in self.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            v.print(out);
        }
        out.push(']');
    }
    fn parse(src: &mut dyn AttrSource) -> Result<Self, String> {
        src.expect('[')?;
        let mut v = Vec::new();
        if src.eat(']') {
            return Ok(v);
        }
        loop {
            v.push(T::parse(src)?);
            if src.eat(']') {
                return Ok(v);
            }
            src.expect(',')?;
        }
    }
}

impl AttrValue for Dim {
    fn print(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
    fn parse(src: &mut dyn AttrSource) -> Result<Self, String> {
        src.dim()
    }
}

impl AttrValue for Shape {
    fn print(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
    fn parse(src: &mut dyn AttrSource) -> Result<Self, String> {
        Vec::<Dim>::parse(src).map(Shape)
    }
}

impl AttrValue for Tensor {
    /// `dtype[dims] [v, v, …]`, row-major, flat.
    fn print(&self, out: &mut String) {
        let _ = write!(out, "{} [", self.tensor_type());
        let dtype = self.dtype();
        for i in 0..self.len() {
            if i > 0 {
                out.push_str(", ");
            }
            match dtype {
                DType::Bool => out.push_str(if self.data().get_i64(i) != 0 { "true" } else { "false" }),
                // `get_i64` is u64's bit pattern.
                DType::U64 => {
                    let _ = write!(out, "{}", self.data().get_i64(i) as u64);
                }
                d if d.is_int() => {
                    let _ = write!(out, "{}", self.data().get_i64(i));
                }
                DType::F32 => print_f32(self.data().get_f64(i) as f32, out),
                _ => print_f64(self.data().get_f64(i), out),
            }
        }
        out.push(']');
    }
    fn parse(src: &mut dyn AttrSource) -> Result<Self, String> {
        let (dtype, shape) = src.tensor_type()?;
        let dims = shape.as_static().ok_or_else(|| format!("constant shape {shape} must be static"))?;
        if shape.num_elements().is_none_or(|n| usize::try_from(n).is_err()) {
            return Err(format!("constant shape {shape} has too many elements"));
        }
        src.expect('[')?;
        let mut floats = Vec::new();
        let mut ints = Vec::new();
        if !src.eat(']') {
            loop {
                if dtype == DType::Bool {
                    ints.push(i128::from(bool::parse(src)?));
                } else if dtype.is_int() {
                    ints.push(src.wide_int()?);
                } else {
                    floats.push(src.float()?);
                }
                if src.eat(']') {
                    break;
                }
                src.expect(',')?;
            }
        }
        let data = if dtype.is_float() {
            Data::from_f64_iter(dtype, floats.into_iter())
        } else {
            check_int_range(dtype, &ints)?;
            // In range, so the i64 bit pattern (wrapping for u64 above 2^63) is the value.
            Data::from_i64_iter(dtype, ints.into_iter().map(|v| v as i64))
        };
        Tensor::new(dims, data).map_err(|e| e.to_string())
    }
}

fn check_int_range(dtype: DType, v: &[i128]) -> Result<(), String> {
    let (lo, hi) = dtype.int_range().unwrap_or((i128::from(i64::MIN), i128::from(i64::MAX)));
    match v.iter().find(|&&x| x < lo || x > hi) {
        Some(x) => Err(format!("{x} does not fit in {dtype}")),
        None => Ok(()),
    }
}

/// Prints an f32 in its own shortest round-trip form (shorter than printing it widened to f64).
fn print_f32(v: f32, out: &mut String) {
    if v.is_finite() {
        let _ = write!(out, "{v:?}");
    } else {
        print_f64(v as f64, out);
    }
}

/// Declares an attribute struct and generates its `.kir` printer and parser from the field list. A field may
/// carry a default (`cubic_a: f64 = -0.75`): the parser then accepts it missing and the printer leaves it out
/// while it has that value, so an attribute added later keeps old text valid and unchanged (give it a
/// `#[serde(default…)]` too, for old JSON and artifacts).
#[macro_export]
macro_rules! attrs {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty $(= $default:expr)?),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        pub struct $name { $($(#[$fm])* #[doc = concat!("The `", stringify!($field), "` attribute; see the struct docs.")] pub $field: $ty),* }

        impl $crate::attr::AttrSet for $name {
            const FIELDS: &'static [&'static str] = &[$(stringify!($field)),*];
            fn print_attrs(&self, out: &mut String) {
                let mut _first = true;
                $(
                    // A field with a default is printed only when it differs from it.
                    if true $(&& self.$field != $default)? {
                        out.push_str(if _first { "{" } else { ", " });
                        _first = false;
                        out.push_str(stringify!($field));
                        out.push('=');
                        $crate::attr::AttrValue::print(&self.$field, out);
                    }
                )*
                if !_first { out.push('}'); }
            }
            fn parse_attrs(src: &mut dyn $crate::attr::AttrSource) -> Result<Self, String> {
                $(let mut $field: Option<$ty> = None;)*
                if src.eat('{') && !src.eat('}') {
                    loop {
                        let key = src.ident()?;
                        src.expect('=')?;
                        match key.as_str() {
                            $(stringify!($field) => {
                                if $field.is_some() {
                                    return Err(format!("attribute `{key}` is given twice"));
                                }
                                $field = Some(<$ty as $crate::attr::AttrValue>::parse(src)
                                    .map_err(|e| format!("attribute `{key}`: {e}"))?);
                            })*
                            _ => return Err(format!(
                                "unknown attribute `{key}` for {} (expected: {})",
                                stringify!($name), Self::FIELDS.join(", "))),
                        }
                        if src.eat('}') { break; }
                        src.expect(',')?;
                    }
                }
                $($(let $field = $field.or(Some($default));)?)*
                let missing: Vec<&str> = Self::FIELDS.iter().copied()
                    .zip([$($field.is_none()),*])
                    .filter_map(|(n, m)| m.then_some(n)).collect();
                if !missing.is_empty() {
                    return Err(format!("missing attribute(s): {}", missing.join(", ")));
                }
                Ok($name { $($field: $field.expect("checked above")),* })
            }
        }
    };
}

/// An attribute struct: a fixed list of named, typed fields with a text form.
pub trait AttrSet: Sized {
    /// Field names in declaration (and print) order.
    const FIELDS: &'static [&'static str];
    /// Appends `{a=…, b=…}`; nothing for a struct with no fields.
    fn print_attrs(&self, out: &mut String);
    /// Parses an optional `{…}` block.
    fn parse_attrs(src: &mut dyn AttrSource) -> Result<Self, String>;
}

/// Declares a closed enum of named variants (`sum`, `max`, …) usable as an attribute value or a mnemonic family.
#[macro_export]
macro_rules! named_enum {
    ($(#[$m:meta])* pub enum $name:ident { $($(#[$vm:meta])* $var:ident = $text:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $name { $($(#[$vm])* $var),* }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var),*];
            /// The text spelling.
            pub fn name(self) -> &'static str {
                match self { $($name::$var => $text),* }
            }
            /// Looks a variant up by its text spelling.
            pub fn from_name(s: &str) -> Option<$name> {
                match s { $($text => Some($name::$var),)* _ => None }
            }
        }

        impl $crate::attr::AttrValue for $name {
            fn print(&self, out: &mut String) {
                out.push_str(self.name());
            }
            fn parse(src: &mut dyn $crate::attr::AttrSource) -> Result<Self, String> {
                let s = src.ident()?;
                $name::from_name(&s).ok_or_else(|| format!(
                    "unknown {} `{s}` (expected one of: {})", stringify!($name),
                    $name::ALL.iter().map(|v| v.name()).collect::<Vec<_>>().join(", ")))
            }
        }
    };
}

/// Serde for `f64` attributes that may be non-finite (`clip=inf`, a `-inf` pad value): JSON has no such numbers
/// (serde_json would write `null` and then fail to read it back), so they travel as `"inf"`, `"-inf"` and `"nan"`,
/// as tensor elements do. Finite values stay plain numbers. Use with `#[serde(with = "crate::attr::non_finite")]`.
pub mod non_finite {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes a finite value as a number, others as a string.
    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        match *v {
            v if v.is_finite() => s.serialize_f64(v),
            v if v.is_nan() => s.serialize_str("nan"),
            v if v > 0.0 => s.serialize_str("inf"),
            _ => s.serialize_str("-inf"),
        }
    }

    /// Reads a number, or one of `"inf"`, `"-inf"`, `"nan"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Number(f64),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Number(v) => Ok(v),
            Repr::Text(s) => match s.as_str() {
                "nan" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                other => {
                    Err(D::Error::custom(format!("expected a number, \"inf\", \"-inf\" or \"nan\", got {other:?}")))
                }
            },
        }
    }
}
