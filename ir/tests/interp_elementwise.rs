//! Reference semantics of the elementwise ops: unary, binary with broadcasting, cast and select. Expected
//! values are computed by hand.

mod interp_support;

use interp_support::*;
use kiln_ir::op::{BinaryOp as B, Cast, UnaryOp as U};
use kiln_ir::{DType, Op};

const NAN: f32 = f32::NAN;
const INF: f32 = f32::INFINITY;

fn un(k: U) -> Op {
    Op::Unary(k)
}

fn bin(k: B) -> Op {
    Op::Binary(k)
}

fn cast(to: DType) -> Op {
    Op::Cast(Cast { to })
}

#[test]
fn float_unary_exact() {
    let cases: Vec<(U, Vec<f32>, Vec<f32>)> = vec![
        (U::Neg, vec![1.5, -0.0, INF], vec![-1.5, 0.0, -INF]),
        (U::Abs, vec![-2.0, 3.0, -0.0], vec![2.0, 3.0, 0.0]),
        (U::Sqrt, vec![4.0, 0.0, -1.0], vec![2.0, 0.0, NAN]),
        (U::Rsqrt, vec![4.0, 0.0], vec![0.5, INF]),
        (U::Reciprocal, vec![2.0, -0.0], vec![0.5, -INF]),
        (U::Exp, vec![0.0, -INF], vec![1.0, 0.0]),
        (U::Log, vec![1.0, 0.0, -1.0], vec![0.0, -INF, NAN]),
        (U::Relu, vec![-1.0, 0.0, 2.0, NAN, -INF, INF], vec![0.0, 0.0, 2.0, NAN, 0.0, INF]),
        (U::Floor, vec![-1.5, 1.5, 2.0], vec![-2.0, 1.0, 2.0]),
        (U::Ceil, vec![-1.5, 1.5, 2.0], vec![-1.0, 2.0, 2.0]),
        (U::Round, vec![0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6], vec![0.0, 2.0, 2.0, -0.0, -2.0, 2.0, -3.0]),
        (U::Sign, vec![-3.0, 0.0, 2.0, NAN, -INF], vec![-1.0, 0.0, 1.0, NAN, -1.0]),
        (U::Sigmoid, vec![0.0, -200.0, 200.0], vec![0.5, 0.0, 1.0]),
        (U::Tanh, vec![0.0, INF, -INF], vec![0.0, 1.0, -1.0]),
        (U::Erf, vec![0.0, INF, -INF], vec![0.0, 1.0, -1.0]),
    ];
    for (k, x, want) in cases {
        let n = x.len();
        check(k.name(), &un(k), &[f32s(&[n], &x)], &[f32s(&[n], &want)]);
    }
}

#[test]
fn float_unary_transcendental() {
    use std::f64::consts::{E, FRAC_PI_2, FRAC_PI_4};
    let erf1 = 0.842_700_792_949_714_9;
    let cases: Vec<(U, f64, f64)> = vec![
        (U::Exp, 1.0, E),
        (U::Log, E, 1.0),
        (U::Tanh, 0.5, 0.462_117_157_260_009_8),
        (U::Sigmoid, 1.0, 0.731_058_578_630_004_9),
        (U::Erf, 1.0, erf1),
        (U::Erf, -1.0, -erf1),
        (U::Sin, FRAC_PI_2, 1.0),
        (U::Cos, 0.0, 1.0),
        (U::Tan, FRAC_PI_4, 1.0),
        (U::Asin, 1.0, FRAC_PI_2),
        (U::Acos, 1.0, 0.0),
        (U::Atan, 1.0, FRAC_PI_4),
        (U::Sinh, 1.0, 1.175_201_193_643_801_4),
        (U::Cosh, 1.0, 1.543_080_634_815_243_7),
        (U::Asinh, 1.0, 0.881_373_587_019_543),
        (U::Acosh, 1.0, 0.0),
        (U::Atanh, 0.5, 0.549_306_144_334_054_8),
    ];
    for (k, x, want) in cases {
        check_close(&format!("{} f64", k.name()), &un(k), &[f64s(&[1], &[x])], &f64s(&[1], &[want]), 1e-15);
        check_close(
            &format!("{} f32", k.name()),
            &un(k),
            &[f32s(&[1], &[x as f32])],
            &f32s(&[1], &[want as f32]),
            1e-6,
        );
    }
}

#[test]
fn half_types_round_once() {
    // f32 exp(1) = 2.7182817; the f16 neighbours are 2.716796875 and 2.71875.
    check("f16 exp", &un(U::Exp), &[f16s(&[1], &[1.0])], &[f16s(&[1], &[2.71875])]);
    // sqrt(2) = 1.41421356; the bf16 neighbours are 1.4140625 and 1.421875.
    check("bf16 sqrt", &un(U::Sqrt), &[bf16s(&[1], &[2.0])], &[bf16s(&[1], &[1.4140625])]);
    // 2048 + 1 and 2048 + 3 are ties in f16 (spacing 2): to even, 2048 and 2052.
    check(
        "f16 add ties",
        &bin(B::Add),
        &[f16s(&[2], &[2048.0, 2048.0]), f16s(&[2], &[1.0, 3.0])],
        &[f16s(&[2], &[2048.0, 2052.0])],
    );
    check("bf16 mul", &bin(B::Mul), &[bf16s(&[1], &[1.5]), bf16s(&[1], &[1.5])], &[bf16s(&[1], &[2.25])]);
    check("f16 relu nan", &un(U::Relu), &[f16s(&[2], &[NAN, -1.0])], &[f16s(&[2], &[NAN, 0.0])]);
}

#[test]
fn predicates_return_bool() {
    let x = f32s(&[4], &[NAN, INF, -INF, 1.0]);
    check("is_nan", &un(U::IsNan), std::slice::from_ref(&x), &[bools(&[4], &[true, false, false, false])]);
    check("is_inf", &un(U::IsInf), &[x], &[bools(&[4], &[false, true, true, false])]);
    check("not", &un(U::Not), &[bools(&[2], &[true, false])], &[bools(&[2], &[false, true])]);
}

#[test]
fn integer_unary() {
    check("neg i8 wraps", &un(U::Neg), &[i8s(&[3], &[-128, 5, 0])], &[i8s(&[3], &[-128, -5, 0])]);
    check("abs i8 wraps", &un(U::Abs), &[i8s(&[3], &[-128, -3, 4])], &[i8s(&[3], &[-128, 3, 4])]);
    check("neg u8 wraps", &un(U::Neg), &[u8s(&[2], &[1, 0])], &[u8s(&[2], &[255, 0])]);
    check("relu i32", &un(U::Relu), &[i32s(&[2], &[-5, 7])], &[i32s(&[2], &[0, 7])]);
    check("sign i64", &un(U::Sign), &[i64s(&[3], &[-9, 0, 4])], &[i64s(&[3], &[-1, 0, 1])]);
    check("sign u8", &un(U::Sign), &[u8s(&[2], &[0, 9])], &[u8s(&[2], &[0, 1])]);
    check("round i32 is identity", &un(U::Round), &[i32s(&[2], &[-3, 3])], &[i32s(&[2], &[-3, 3])]);
    check_err("exp i32", &un(U::Exp), &[i32s(&[1], &[1])], "float");
    check_err("not f32", &un(U::Not), &[f32s(&[1], &[1.0])], "bool");
}

#[test]
fn broadcasting() {
    let add = bin(B::Add);
    let row = f32s(&[3], &[10.0, 20.0, 30.0]);
    let m = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    check("row", &add, &[m.clone(), row.clone()], &[f32s(&[2, 3], &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0])]);
    check("row first", &add, &[row, m], &[f32s(&[2, 3], &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0])]);
    check(
        "column times row",
        &add,
        &[f32s(&[2, 1], &[1.0, 2.0]), f32s(&[1, 3], &[10.0, 20.0, 30.0])],
        &[f32s(&[2, 3], &[11.0, 21.0, 31.0, 12.0, 22.0, 32.0])],
    );
    check(
        "rank extending",
        &add,
        &[i32s(&[3], &[1, 2, 3]), i32s(&[2, 1, 1], &[10, 20])],
        &[i32s(&[2, 1, 3], &[11, 12, 13, 21, 22, 23])],
    );
    check("scalar", &bin(B::Mul), &[i64s(&[], &[3]), i64s(&[2], &[4, 5])], &[i64s(&[2], &[12, 15])]);
    check("scalar scalar", &bin(B::Sub), &[i64s(&[], &[3]), i64s(&[], &[5])], &[i64s(&[], &[-2])]);
    check("zero-size", &add, &[f32s(&[0, 3], &[]), f32s(&[3], &[1.0, 2.0, 3.0])], &[f32s(&[0, 3], &[])]);
    check("zero against one", &add, &[f32s(&[2, 0], &[]), f32s(&[2, 1], &[1.0, 2.0])], &[f32s(&[2, 0], &[])]);
    check_err("mismatch", &add, &[f32s(&[2], &[1.0, 2.0]), f32s(&[3], &[1.0, 2.0, 3.0])], "broadcast");
    check_err("dtypes differ", &add, &[f32s(&[1], &[1.0]), f64s(&[1], &[1.0])], "dtypes differ");
}

#[test]
fn integer_arithmetic_wraps() {
    check("i8 add", &bin(B::Add), &[i8s(&[1], &[100]), i8s(&[1], &[100])], &[i8s(&[1], &[-56])]);
    check("i8 sub", &bin(B::Sub), &[i8s(&[1], &[-128]), i8s(&[1], &[1])], &[i8s(&[1], &[127])]);
    check("i32 mul", &bin(B::Mul), &[i32s(&[1], &[i32::MAX]), i32s(&[1], &[2])], &[i32s(&[1], &[-2])]);
    check("u8 add", &bin(B::Add), &[u8s(&[1], &[250]), u8s(&[1], &[10])], &[u8s(&[1], &[4])]);
    check("u8 sub", &bin(B::Sub), &[u8s(&[1], &[3]), u8s(&[1], &[5])], &[u8s(&[1], &[254])]);
    check("i64 add", &bin(B::Add), &[i64s(&[1], &[i64::MAX]), i64s(&[1], &[1])], &[i64s(&[1], &[i64::MIN])]);
}

#[test]
fn bitwise_and_shifts() {
    let (a, b) = (u8s(&[2], &[0b1100, 0xF0]), u8s(&[2], &[0b1010, 0x0F]));
    check("and", &bin(B::BitAnd), &[a.clone(), b.clone()], &[u8s(&[2], &[0b1000, 0])]);
    check("or", &bin(B::BitOr), &[a.clone(), b.clone()], &[u8s(&[2], &[0b1110, 0xFF])]);
    check("xor", &bin(B::BitXor), &[a, b], &[u8s(&[2], &[0b0110, 0xFF])]);
    check("not i8", &un(U::BitNot), &[i8s(&[3], &[0, -1, 5])], &[i8s(&[3], &[-1, 0, -6])]);
    check("not u8", &un(U::BitNot), &[u8s(&[1], &[1])], &[u8s(&[1], &[254])]);
    // Left: bits shifted out are dropped; a shift past the width or below zero gives 0.
    let x = i8s(&[4], &[3, 64, -1, 5]);
    check("shl i8", &bin(B::Shl), &[x.clone(), i8s(&[4], &[2, 1, 7, 8])], &[i8s(&[4], &[12, -128, -128, 0])]);
    check("shl negative", &bin(B::Shl), &[x.clone(), i8s(&[1], &[-1])], &[i8s(&[4], &[0, 0, 0, 0])]);
    // Right: arithmetic for signed; past the width every bit is the sign.
    check("shr i8", &bin(B::Shr), &[x, i8s(&[4], &[1, 6, 3, 8])], &[i8s(&[4], &[1, 1, -1, 0])]);
    check("shr i8 past width", &bin(B::Shr), &[i8s(&[2], &[-7, 7]), i8s(&[1], &[-3])], &[i8s(&[2], &[-1, 0])]);
    check("shr u8 is logical", &bin(B::Shr), &[u8s(&[2], &[255, 255]), u8s(&[2], &[4, 8])], &[u8s(&[2], &[15, 0])]);
    check("shl i64", &bin(B::Shl), &[i64s(&[1], &[1]), i64s(&[1], &[63])], &[i64s(&[1], &[i64::MIN])]);
    check_err("and f32", &bin(B::BitAnd), &[f32s(&[1], &[1.0]), f32s(&[1], &[1.0])], "integer");
    check_err("and bool", &bin(B::BitAnd), &[bools(&[1], &[true]), bools(&[1], &[true])], "integer");
    check_err("not f32", &un(U::BitNot), &[f32s(&[1], &[1.0])], "integer");
}

#[test]
fn integer_division_family() {
    let a = i32s(&[4], &[7, -7, 7, -7]);
    let b = i32s(&[4], &[2, 2, -2, -2]);
    check("div truncates", &bin(B::Div), &[a, b], &[i32s(&[4], &[3, -3, -3, 3])]);
    let a = i64s(&[4], &[7, -7, 7, -7]);
    let b = i64s(&[4], &[3, 3, -3, -3]);
    check("mod has the divisor's sign", &bin(B::Mod), &[a.clone(), b.clone()], &[i64s(&[4], &[1, 2, -2, -1])]);
    check("rem has the dividend's sign", &bin(B::Rem), &[a, b], &[i64s(&[4], &[1, -1, 1, -1])]);
    check("u8 div", &bin(B::Div), &[u8s(&[1], &[255]), u8s(&[1], &[2])], &[u8s(&[1], &[127])]);
    check("MIN mod -1", &bin(B::Mod), &[i8s(&[1], &[-128]), i8s(&[1], &[-1])], &[i8s(&[1], &[0])]);
    check("MIN rem -1", &bin(B::Rem), &[i64s(&[1], &[i64::MIN]), i64s(&[1], &[-1])], &[i64s(&[1], &[0])]);
    for k in [B::Div, B::Mod, B::Rem] {
        check_err(k.name(), &bin(k), &[i32s(&[2], &[1, 2]), i32s(&[2], &[1, 0])], "by zero");
        check_err(k.name(), &bin(k), &[u8s(&[1], &[1]), u8s(&[1], &[0])], "by zero");
    }
    check_err("i64 MIN / -1", &bin(B::Div), &[i64s(&[1], &[i64::MIN]), i64s(&[1], &[-1])], "overflows");
    check_err("i8 MIN / -1", &bin(B::Div), &[i8s(&[1], &[-128]), i8s(&[1], &[-1])], "overflows");
}

#[test]
fn integer_pow() {
    let pow = bin(B::Pow);
    check("pow", &pow, &[i32s(&[4], &[2, 3, 0, -2]), i32s(&[4], &[10, 0, 0, 3])], &[i32s(&[4], &[1024, 1, 1, -8])]);
    check("i8 wraps", &pow, &[i8s(&[1], &[2]), i8s(&[1], &[7])], &[i8s(&[1], &[-128])]);
    check("i64 wraps", &pow, &[i64s(&[2], &[2, 2]), i64s(&[2], &[63, 64])], &[i64s(&[2], &[i64::MIN, 0])]);
    check("u8", &pow, &[u8s(&[1], &[3]), u8s(&[1], &[5])], &[u8s(&[1], &[243])]);
    check_err("negative exponent", &pow, &[i32s(&[1], &[1]), i32s(&[1], &[-1])], "negative integer exponent");
}

#[test]
fn float_division_family() {
    let a = f64s(&[6], &[7.5, -7.5, 7.5, -7.5, 6.0, 1.0]);
    let b = f64s(&[6], &[2.0, 2.0, -2.0, -2.0, -3.0, 0.0]);
    check("mod", &bin(B::Mod), &[a.clone(), b.clone()], &[f64s(&[6], &[1.5, 0.5, -0.5, -1.5, -0.0, f64::NAN])]);
    check("rem", &bin(B::Rem), &[a.clone(), b.clone()], &[f64s(&[6], &[1.5, -1.5, 1.5, -1.5, 0.0, f64::NAN])]);
    check("div", &bin(B::Div), &[a, b], &[f64s(&[6], &[3.75, -3.75, -3.75, 3.75, -2.0, f64::INFINITY])]);
    check(
        "pow",
        &bin(B::Pow),
        &[f32s(&[3], &[2.0, -8.0, 2.0]), f32s(&[3], &[-1.0, 0.5, 0.0])],
        &[f32s(&[3], &[0.5, NAN, 1.0])],
    );
}

#[test]
fn max_min_propagate_nan() {
    let a = f32s(&[4], &[1.0, NAN, 3.0, -0.0]);
    let b = f32s(&[4], &[2.0, 0.0, NAN, 0.0]);
    check("max", &bin(B::Max), &[a.clone(), b.clone()], &[f32s(&[4], &[2.0, NAN, NAN, 0.0])]);
    check("min", &bin(B::Min), &[a, b], &[f32s(&[4], &[1.0, NAN, NAN, -0.0])]);
    check("max i8", &bin(B::Max), &[i8s(&[2], &[-5, 5]), i8s(&[2], &[3, -3])], &[i8s(&[2], &[3, 5])]);
    check("min u8", &bin(B::Min), &[u8s(&[2], &[200, 5]), u8s(&[2], &[3, 9])], &[u8s(&[2], &[3, 5])]);
}

#[test]
fn comparisons_and_logic() {
    let a = f32s(&[3], &[1.0, NAN, 3.0]);
    let b = f32s(&[3], &[1.0, NAN, 2.0]);
    let cases = [
        (B::Eq, [true, false, false]),
        (B::Lt, [false, false, false]),
        (B::Le, [true, false, false]),
        (B::Gt, [false, false, true]),
        (B::Ge, [true, false, true]),
    ];
    for (k, want) in cases {
        check(k.name(), &bin(k), &[a.clone(), b.clone()], &[bools(&[3], &want)]);
    }
    check(
        "lt broadcast i64",
        &bin(B::Lt),
        &[i64s(&[2, 1], &[1, 5]), i64s(&[3], &[0, 1, 9])],
        &[bools(&[2, 3], &[false, false, true, false, false, true])],
    );
    check(
        "eq bool",
        &bin(B::Eq),
        &[bools(&[2], &[true, false]), bools(&[2], &[true, true])],
        &[bools(&[2], &[true, false])],
    );
    let p = bools(&[4], &[false, false, true, true]);
    let q = bools(&[4], &[false, true, false, true]);
    check("and", &bin(B::And), &[p.clone(), q.clone()], &[bools(&[4], &[false, false, false, true])]);
    check("or", &bin(B::Or), &[p.clone(), q.clone()], &[bools(&[4], &[false, true, true, true])]);
    check("xor", &bin(B::Xor), &[p, q], &[bools(&[4], &[false, true, true, false])]);
    check_err("and f32", &bin(B::And), &[f32s(&[1], &[1.0]), f32s(&[1], &[1.0])], "bool");
}

#[test]
fn cast_from_floats() {
    let x = f32s(&[6], &[1.9, -1.9, NAN, 1e10, -1e10, 0.0]);
    let cases = [
        (i32s(&[6], &[1, -1, 0, i32::MAX, i32::MIN, 0])),
        (i8s(&[6], &[1, -1, 0, 127, -128, 0])),
        (u8s(&[6], &[1, 0, 0, 255, 0, 0])),
        (i64s(&[6], &[1, -1, 0, 10_000_000_000, -10_000_000_000, 0])),
        (bools(&[6], &[true, true, true, true, true, false])),
    ];
    for want in cases {
        check(&format!("f32 -> {}", want.dtype()), &cast(want.dtype()), std::slice::from_ref(&x), &[want]);
    }
    check("f64 -> f32", &cast(DType::F32), &[f64s(&[2], &[0.1, 1e40])], &[f32s(&[2], &[0.1, INF])]);
    // f16's largest finite value is 65504; 65520 is the tie with 65536 and rounds to even (overflow).
    check(
        "f64 -> f16",
        &cast(DType::F16),
        &[f64s(&[3], &[65519.0, 65520.0, 0.5])],
        &[f16s(&[3], &[65504.0, INF, 0.5])],
    );
    // Just above the tie between 1 and 1 + 2^-7: must round up even though the excess is far below f32.
    let above_tie = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
    check("f64 -> bf16", &cast(DType::BF16), &[f64s(&[1], &[above_tie])], &[bf16s(&[1], &[1.0078125])]);
    check("f16 -> f64", &cast(DType::F64), &[f16s(&[2], &[0.5, -INF])], &[f64s(&[2], &[0.5, f64::NEG_INFINITY])]);
    check("bf16 -> f32", &cast(DType::F32), &[bf16s(&[1], &[1.0078125])], &[f32s(&[1], &[1.0078125])]);
    check("f16 -> i8", &cast(DType::I8), &[f16s(&[2], &[-300.0, 2.5])], &[i8s(&[2], &[-128, 2])]);
}

#[test]
fn cast_from_integers_and_bool() {
    let x = i32s(&[4], &[300, -1, 65, 0]);
    let cases = [
        i8s(&[4], &[44, -1, 65, 0]),
        u8s(&[4], &[44, 255, 65, 0]),
        i64s(&[4], &[300, -1, 65, 0]),
        bools(&[4], &[true, true, true, false]),
        f16s(&[4], &[300.0, -1.0, 65.0, 0.0]),
        bf16s(&[4], &[300.0, -1.0, 65.0, 0.0]),
        f64s(&[4], &[300.0, -1.0, 65.0, 0.0]),
    ];
    for want in cases {
        check(&format!("i32 -> {}", want.dtype()), &cast(want.dtype()), std::slice::from_ref(&x), &[want]);
    }
    check("u8 -> i8", &cast(DType::I8), &[u8s(&[1], &[200])], &[i8s(&[1], &[-56])]);
    check("i8 -> u8", &cast(DType::U8), &[i8s(&[1], &[-1])], &[u8s(&[1], &[255])]);
    check("i64 -> i32", &cast(DType::I32), &[i64s(&[2], &[(1 << 32) + 5, 1 << 31])], &[i32s(&[2], &[5, i32::MIN])]);
    // 2^24 + 1 is a tie in f32: to even.
    check("i64 -> f32", &cast(DType::F32), &[i64s(&[1], &[(1 << 24) + 1])], &[f32s(&[1], &[16_777_216.0])]);
    // 2^60 + 2^52 + 1 lies just above a bf16 tie; rounding through a plain f64 would lose the + 1.
    let big: i64 = (1 << 60) + (1 << 52) + 1;
    check(
        "i64 -> bf16",
        &cast(DType::BF16),
        &[i64s(&[1], &[big])],
        &[bf16s(&[1], &[((1u64 << 60) + (1u64 << 53)) as f32])],
    );
    let b = bools(&[2], &[true, false]);
    for want in [f32s(&[2], &[1.0, 0.0]), i64s(&[2], &[1, 0]), u8s(&[2], &[1, 0]), bf16s(&[2], &[1.0, 0.0])] {
        check(&format!("bool -> {}", want.dtype()), &cast(want.dtype()), std::slice::from_ref(&b), &[want]);
    }
    check("zero-size", &cast(DType::F64), &[i8s(&[0, 2], &[])], &[f64s(&[0, 2], &[])]);
}

#[test]
fn select_broadcasts_all_three() {
    check(
        "select",
        &Op::Select,
        &[bools(&[2, 1], &[true, false]), i32s(&[3], &[1, 2, 3]), i32s(&[], &[9])],
        &[i32s(&[2, 3], &[1, 2, 3, 9, 9, 9])],
    );
    check(
        "select nan",
        &Op::Select,
        &[bools(&[2], &[false, true]), f32s(&[2], &[1.0, NAN]), f32s(&[2], &[NAN, 2.0])],
        &[f32s(&[2], &[NAN, NAN])],
    );
    check_err("branch dtypes", &Op::Select, &[bools(&[1], &[true]), i32s(&[1], &[1]), i64s(&[1], &[1])], "differ");
    check_err("condition dtype", &Op::Select, &[i32s(&[1], &[1]), i32s(&[1], &[1]), i32s(&[1], &[1])], "bool");
}
