//! The runtime functions compiled kernels call: transcendental math, float remainders, integer powers and the
//! f16/bf16 conversions, each an `extern "C"` shim over exactly the function the interpreter uses (Rust's `f32`
//! and `f64` methods, `libm` for `erf`, `half` for the 16-bit floats), so scalar results are bit-identical.
//!
//! Kernels never call these by name: they load the address from a table of pointers, [`RUNTIME_TABLE_SYMBOL`],
//! one entry per runtime function in a fixed order ([`runtime_table`]). The JIT fills that table itself; an object file only reserves it
//! (zeroed, writable, exported) and whoever loads the linked library must fill it with [`install_runtime_table`]
//! before the first launch. The object also exports [`RUNTIME_TABLE_LEN_SYMBOL`], a `u64` holding the number of
//! entries it expects, so a loader can refuse a library built against a different table.
//!
//! Load such a library with local symbol binding (`RTLD_LOCAL`, `libloading`'s default on Unix): its code
//! reaches the table through the global offset table, so a table of the same name made global by an earlier
//! library would otherwise stand in for it. Each loaded library has its own table to fill.

use half::{bf16, f16};

/// Name of the table of runtime function pointers a kernel module defines (an array of pointers).
pub const RUNTIME_TABLE_SYMBOL: &str = "kiln_rt_table";

/// Name of the `u64` an object file exports holding the number of entries its runtime table has.
pub const RUNTIME_TABLE_LEN_SYMBOL: &str = "kiln_rt_table_len";

/// How a runtime function is called, in Cranelift types.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum RtSig {
    /// `f32 -> f32`.
    F32ToF32,
    /// `f64 -> f64`.
    F64ToF64,
    /// `(f32, f32) -> f32`.
    F32F32ToF32,
    /// `(f64, f64) -> f64`.
    F64F64ToF64,
    /// `i32 -> f32` (16-bit float bits in the low half).
    I32ToF32,
    /// `f32 -> i32` (16-bit float bits in the low half).
    F32ToI32,
    /// `f64 -> f32`.
    F64ToF32,
    /// `i64 -> f32`.
    I64ToF32,
    /// `(i64, i64) -> i64`.
    I64I64ToI64,
}

macro_rules! runtime_fns {
    ($($variant:ident = $name:literal, $sig:ident, $shim:ident;)*) => {
        /// A runtime function, by its position in the runtime table.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        pub enum RtFn {
            $(#[allow(missing_docs)] $variant,)*
        }

        impl RtFn {
            /// Every runtime function, in table order.
            pub const ALL: &'static [RtFn] = &[$(RtFn::$variant,)*];

            /// The symbol the JIT resolves the shim by.
            pub fn name(self) -> &'static str {
                match self {
                    $(RtFn::$variant => $name,)*
                }
            }

            /// The calling signature.
            pub fn sig(self) -> RtSig {
                match self {
                    $(RtFn::$variant => RtSig::$sig,)*
                }
            }

            /// The shim's address.
            pub fn address(self) -> *const u8 {
                match self {
                    $(RtFn::$variant => $shim as *const u8,)*
                }
            }
        }
    };
}

runtime_fns! {
    ExpF32 = "kiln_rt_expf", F32ToF32, expf;
    LogF32 = "kiln_rt_logf", F32ToF32, logf;
    TanhF32 = "kiln_rt_tanhf", F32ToF32, tanhf;
    ErfF32 = "kiln_rt_erff", F32ToF32, erff;
    SinF32 = "kiln_rt_sinf", F32ToF32, sinf;
    CosF32 = "kiln_rt_cosf", F32ToF32, cosf;
    TanF32 = "kiln_rt_tanf", F32ToF32, tanf;
    AsinF32 = "kiln_rt_asinf", F32ToF32, asinf;
    AcosF32 = "kiln_rt_acosf", F32ToF32, acosf;
    AtanF32 = "kiln_rt_atanf", F32ToF32, atanf;
    SinhF32 = "kiln_rt_sinhf", F32ToF32, sinhf;
    CoshF32 = "kiln_rt_coshf", F32ToF32, coshf;
    AsinhF32 = "kiln_rt_asinhf", F32ToF32, asinhf;
    AcoshF32 = "kiln_rt_acoshf", F32ToF32, acoshf;
    AtanhF32 = "kiln_rt_atanhf", F32ToF32, atanhf;
    PowF32 = "kiln_rt_powf", F32F32ToF32, powf;
    FmodF32 = "kiln_rt_fmodf", F32F32ToF32, fmodf;
    ModF32 = "kiln_rt_modf", F32F32ToF32, modf;
    ExpF64 = "kiln_rt_exp", F64ToF64, exp;
    LogF64 = "kiln_rt_log", F64ToF64, log;
    TanhF64 = "kiln_rt_tanh", F64ToF64, tanh;
    ErfF64 = "kiln_rt_erf", F64ToF64, erf;
    SinF64 = "kiln_rt_sin", F64ToF64, sin;
    CosF64 = "kiln_rt_cos", F64ToF64, cos;
    TanF64 = "kiln_rt_tan", F64ToF64, tan;
    AsinF64 = "kiln_rt_asin", F64ToF64, asin;
    AcosF64 = "kiln_rt_acos", F64ToF64, acos;
    AtanF64 = "kiln_rt_atan", F64ToF64, atan;
    SinhF64 = "kiln_rt_sinh", F64ToF64, sinh;
    CoshF64 = "kiln_rt_cosh", F64ToF64, cosh;
    AsinhF64 = "kiln_rt_asinh", F64ToF64, asinh;
    AcoshF64 = "kiln_rt_acosh", F64ToF64, acosh;
    AtanhF64 = "kiln_rt_atanh", F64ToF64, atanh;
    PowF64 = "kiln_rt_pow", F64F64ToF64, pow;
    FmodF64 = "kiln_rt_fmod", F64F64ToF64, fmod;
    ModF64 = "kiln_rt_mod", F64F64ToF64, modulo;
    F16ToF32 = "kiln_rt_f16_to_f32", I32ToF32, f16_to_f32;
    F32ToF16 = "kiln_rt_f32_to_f16", F32ToI32, f32_to_f16;
    RoundF16 = "kiln_rt_round_f16", F32ToF32, round_f16;
    RoundBf16 = "kiln_rt_round_bf16", F32ToF32, round_bf16;
    F64ToF16 = "kiln_rt_f64_to_f16", F64ToF32, f64_to_f16;
    F64ToBf16 = "kiln_rt_f64_to_bf16", F64ToF32, f64_to_bf16;
    I64ToF16 = "kiln_rt_i64_to_f16", I64ToF32, i64_to_f16;
    I64ToBf16 = "kiln_rt_i64_to_bf16", I64ToF32, i64_to_bf16;
    IPow = "kiln_rt_ipow", I64I64ToI64, ipow;
    FloorF32 = "kiln_rt_floorf", F32ToF32, floorf;
    CeilF32 = "kiln_rt_ceilf", F32ToF32, ceilf;
    RoundF32 = "kiln_rt_roundevenf", F32ToF32, roundevenf;
    FloorF64 = "kiln_rt_floor", F64ToF64, floor;
    CeilF64 = "kiln_rt_ceil", F64ToF64, ceil;
    RoundF64 = "kiln_rt_roundeven", F64ToF64, roundeven;
}

/// The runtime table's contents for this process: one shim address per entry, in table order.
pub fn runtime_table() -> Vec<*const u8> {
    RtFn::ALL.iter().map(|f| f.address()).collect()
}

/// Fills a loaded kernel library's runtime table (the address of its [`RUNTIME_TABLE_SYMBOL`]).
///
/// # Safety
/// `table` must point to writable memory for `runtime_table().len()` pointers — the library's table, whose
/// [`RUNTIME_TABLE_LEN_SYMBOL`] the caller has checked equals that length — and no kernel of the library may be
/// running.
pub unsafe fn install_runtime_table(table: *mut *const u8) {
    for (i, p) in runtime_table().into_iter().enumerate() {
        // SAFETY: the caller guarantees `table` holds `runtime_table().len()` writable slots.
        unsafe { table.add(i).write(p) };
    }
}

macro_rules! unary_shims {
    ($($name:ident: $t:ty => $body:expr;)*) => {
        $(extern "C" fn $name(x: $t) -> $t {
            let f: fn($t) -> $t = $body;
            f(x)
        })*
    };
}

unary_shims! {
    expf: f32 => f32::exp;
    logf: f32 => f32::ln;
    tanhf: f32 => f32::tanh;
    erff: f32 => libm::erff;
    sinf: f32 => f32::sin;
    cosf: f32 => f32::cos;
    tanf: f32 => f32::tan;
    asinf: f32 => f32::asin;
    acosf: f32 => f32::acos;
    atanf: f32 => f32::atan;
    sinhf: f32 => f32::sinh;
    coshf: f32 => f32::cosh;
    asinhf: f32 => f32::asinh;
    acoshf: f32 => f32::acosh;
    atanhf: f32 => f32::atanh;
    exp: f64 => f64::exp;
    log: f64 => f64::ln;
    tanh: f64 => f64::tanh;
    erf: f64 => libm::erf;
    sin: f64 => f64::sin;
    cos: f64 => f64::cos;
    tan: f64 => f64::tan;
    asin: f64 => f64::asin;
    acos: f64 => f64::acos;
    atan: f64 => f64::atan;
    sinh: f64 => f64::sinh;
    cosh: f64 => f64::cosh;
    asinh: f64 => f64::asinh;
    acosh: f64 => f64::acosh;
    atanh: f64 => f64::atanh;
    floorf: f32 => f32::floor;
    ceilf: f32 => f32::ceil;
    roundevenf: f32 => f32::round_ties_even;
    floor: f64 => f64::floor;
    ceil: f64 => f64::ceil;
    roundeven: f64 => f64::round_ties_even;
}

extern "C" fn powf(x: f32, y: f32) -> f32 {
    x.powf(y)
}

extern "C" fn fmodf(x: f32, y: f32) -> f32 {
    x % y
}

extern "C" fn pow(x: f64, y: f64) -> f64 {
    x.powf(y)
}

extern "C" fn fmod(x: f64, y: f64) -> f64 {
    x % y
}

/// Python's `%` (the interpreter's float `mod`): `fmod` moved into the divisor's sign, a zero result taking
/// the divisor's sign.
macro_rules! python_mod {
    ($name:ident, $t:ty) => {
        extern "C" fn $name(x: $t, y: $t) -> $t {
            let r = x % y;
            if r == 0.0 {
                (0.0 as $t).copysign(y)
            } else if (r < 0.0) != (y < 0.0) {
                r + y
            } else {
                r
            }
        }
    };
}
python_mod!(modf, f32);
python_mod!(modulo, f64);

extern "C" fn f16_to_f32(bits: i32) -> f32 {
    f16::from_bits(bits as u16).to_f32()
}

extern "C" fn f32_to_f16(x: f32) -> i32 {
    i32::from(f16::from_f32(x).to_bits())
}

extern "C" fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

extern "C" fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// f64 → f32 rounded to odd: rounding the result again to a 16-bit float gives the correctly rounded value,
/// which rounding through a nearest-even f32 would not always do.
fn f64_to_f32_round_odd(v: f64) -> f32 {
    let f = v as f32;
    if !f.is_finite() || f as f64 == v || f.to_bits() & 1 == 1 {
        return f;
    }
    f32::from_bits(if v.abs() > (f as f64).abs() { f.to_bits() + 1 } else { f.to_bits() - 1 })
}

/// i64 → f64 rounded to odd (see [`f64_to_f32_round_odd`]).
fn i64_to_f64_round_odd(v: i64) -> f64 {
    let f = v as f64;
    let back = f as i128;
    if back == v as i128 || f.to_bits() & 1 == 1 {
        return f;
    }
    f64::from_bits(if (v as i128).abs() > back.abs() { f.to_bits() + 1 } else { f.to_bits() - 1 })
}

extern "C" fn f64_to_f16(x: f64) -> f32 {
    f16::from_f32(f64_to_f32_round_odd(x)).to_f32()
}

extern "C" fn f64_to_bf16(x: f64) -> f32 {
    bf16::from_f32(f64_to_f32_round_odd(x)).to_f32()
}

extern "C" fn i64_to_f16(x: i64) -> f32 {
    f64_to_f16(i64_to_f64_round_odd(x))
}

extern "C" fn i64_to_bf16(x: i64) -> f32 {
    f64_to_bf16(i64_to_f64_round_odd(x))
}

/// Wrapping integer power by repeated squaring; a negative exponent (an interpreter error) gives 0. Narrower
/// integer types call this on their widened values and truncate: wrapping arithmetic commutes with truncation.
extern "C" fn ipow(x: i64, e: i64) -> i64 {
    if e < 0 {
        return 0;
    }
    let (mut base, mut acc, mut e) = (x, 1i64, e as u64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    acc
}
