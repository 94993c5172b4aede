//! Reference semantics of reductions, arg-reductions and matmul. Expected values are computed by hand.

mod interp_support;

use interp_support::*;
use kiln_ir::Op;
use kiln_ir::op::{ArgKind, ArgReduce, Reduce, ReduceKind as R};

const NAN: f32 = f32::NAN;

fn reduce(kind: R, axes: &[i64], keep_dims: bool) -> Op {
    Op::Reduce(Reduce { kind, axes: axes.to_vec(), keep_dims })
}

fn arg(kind: ArgKind, axis: i64, keep_dims: bool, select_last_index: bool) -> Op {
    Op::ArgReduce(ArgReduce { kind, axis, keep_dims, select_last_index })
}

#[test]
fn reduce_axes_and_kinds() {
    let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let cases: Vec<(&str, Op, Vec<usize>, Vec<f32>)> = vec![
        ("no axes is identity", reduce(R::Sum, &[], false), vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        ("sum 0", reduce(R::Sum, &[0], false), vec![3], vec![5.0, 7.0, 9.0]),
        ("sum -1", reduce(R::Sum, &[-1], false), vec![2], vec![6.0, 15.0]),
        ("sum all", reduce(R::Sum, &[1, 0], false), vec![], vec![21.0]),
        ("sum keep", reduce(R::Sum, &[1], true), vec![2, 1], vec![6.0, 15.0]),
        ("sum all keep", reduce(R::Sum, &[-2, -1], true), vec![1, 1], vec![21.0]),
        ("mean", reduce(R::Mean, &[1], false), vec![2], vec![2.0, 5.0]),
        ("prod", reduce(R::Prod, &[0], false), vec![3], vec![4.0, 10.0, 18.0]),
        ("max", reduce(R::Max, &[1], false), vec![2], vec![3.0, 6.0]),
        ("min", reduce(R::Min, &[0], true), vec![1, 3], vec![1.0, 2.0, 3.0]),
    ];
    for (case, op, shape, want) in cases {
        check(case, &op, std::slice::from_ref(&x), &[f32s(&shape, &want)]);
    }
    check("scalar", &reduce(R::Max, &[], false), &[f64s(&[], &[2.5])], &[f64s(&[], &[2.5])]);
    check("f64 mean", &reduce(R::Mean, &[0], false), &[f64s(&[2], &[1.0, 2.0])], &[f64s(&[], &[1.5])]);
    check_err("axis out of range", &reduce(R::Sum, &[2], false), std::slice::from_ref(&x), "out of range");
    check_err("repeated axis", &reduce(R::Sum, &[1, -1], false), &[x], "repeated");
}

#[test]
fn reduce_propagates_nan() {
    let x = f32s(&[3], &[1.0, NAN, 3.0]);
    for k in [R::Sum, R::Mean, R::Max, R::Min, R::Prod] {
        check(k.name(), &reduce(k, &[0], false), std::slice::from_ref(&x), &[f32s(&[], &[NAN])]);
    }
    // The NaN is last: a comparison-based max would have kept 3.
    check("nan last", &reduce(R::Max, &[0], false), &[f32s(&[2], &[3.0, NAN])], &[f32s(&[], &[NAN])]);
}

#[test]
fn reduce_empty_sets() {
    let x = f32s(&[0, 3], &[]);
    check("sum", &reduce(R::Sum, &[0], false), std::slice::from_ref(&x), &[f32s(&[3], &[0.0; 3])]);
    check("prod", &reduce(R::Prod, &[0], false), std::slice::from_ref(&x), &[f32s(&[3], &[1.0; 3])]);
    check("mean", &reduce(R::Mean, &[0], false), std::slice::from_ref(&x), &[f32s(&[3], &[NAN; 3])]);
    // Max and min of nothing are their identities (ONNX: -inf / +inf; integer extremes; false / true).
    check("max", &reduce(R::Max, &[0], false), std::slice::from_ref(&x), &[f32s(&[3], &[f32::NEG_INFINITY; 3])]);
    check("min", &reduce(R::Min, &[-2], true), std::slice::from_ref(&x), &[f32s(&[1, 3], &[f32::INFINITY; 3])]);
    check("int max", &reduce(R::Max, &[0], false), &[i32s(&[0], &[])], &[i32s(&[], &[i32::MIN])]);
    check("int min", &reduce(R::Min, &[0], false), &[i32s(&[0], &[])], &[i32s(&[], &[i32::MAX])]);
    // Reducing the non-empty axis leaves an empty result: nothing to reduce, so no error.
    check("max of nothing", &reduce(R::Max, &[1], false), std::slice::from_ref(&x), &[f32s(&[0], &[])]);
    check("sum keep", &reduce(R::Sum, &[1], true), &[x], &[f32s(&[0, 1], &[])]);
    check("int sum", &reduce(R::Sum, &[0], false), &[i32s(&[0], &[])], &[i32s(&[], &[0])]);
    check("int prod", &reduce(R::Prod, &[0], false), &[i64s(&[0], &[])], &[i64s(&[], &[1])]);
    check_err("int mean", &reduce(R::Mean, &[0], false), &[i32s(&[0], &[])], "empty");
}

#[test]
fn reduce_integers() {
    check("sum wraps", &reduce(R::Sum, &[0], false), &[i8s(&[2], &[100, 100])], &[i8s(&[], &[-56])]);
    check("prod wraps", &reduce(R::Prod, &[0], false), &[i64s(&[2], &[1 << 32, 1 << 32])], &[i64s(&[], &[0])]);
    check(
        "mean truncates toward zero",
        &reduce(R::Mean, &[1], false),
        &[i32s(&[3, 2], &[-7, 2, 7, 8, -1, 0])],
        &[i32s(&[3], &[-2, 7, 0])],
    );
    // The exact sum (510) does not fit u8; the mean does.
    check("mean is exact", &reduce(R::Mean, &[0], false), &[u8s(&[2], &[255, 255])], &[u8s(&[], &[255])]);
    check("max", &reduce(R::Max, &[0], false), &[i64s(&[3], &[-5, i64::MAX, 0])], &[i64s(&[], &[i64::MAX])]);
    check("min u8", &reduce(R::Min, &[0], false), &[u8s(&[3], &[9, 200, 3])], &[u8s(&[], &[3])]);
    let b = bools(&[2, 2], &[true, false, false, false]);
    check("bool max is any", &reduce(R::Max, &[1], false), std::slice::from_ref(&b), &[bools(&[2], &[true, false])]);
    check("bool min is all", &reduce(R::Min, &[0], false), &[b], &[bools(&[2], &[false, false])]);
}

#[test]
fn reduce_half_accumulates_in_f32() {
    // In f16, 2048 + 1 rounds back to 2048 (twice); accumulated in f32 the sum is 2050, which f16 holds.
    check("f16 sum", &reduce(R::Sum, &[0], false), &[f16s(&[3], &[2048.0, 1.0, 1.0])], &[f16s(&[], &[2050.0])]);
    check("bf16 mean", &reduce(R::Mean, &[0], false), &[bf16s(&[2], &[1.0, 2.0])], &[bf16s(&[], &[1.5])]);
}

#[test]
fn arg_reduce_ties_and_axes() {
    let x = i32s(&[2, 3], &[1, 3, 3, 5, 2, 5]);
    let cases: Vec<(&str, Op, Vec<usize>, Vec<i64>)> = vec![
        ("argmax first tie", arg(ArgKind::Max, 1, false, false), vec![2], vec![1, 0]),
        ("argmax last tie", arg(ArgKind::Max, 1, false, true), vec![2], vec![2, 2]),
        ("argmin", arg(ArgKind::Min, 1, false, false), vec![2], vec![0, 1]),
        ("argmin axis 0", arg(ArgKind::Min, 0, false, false), vec![3], vec![0, 1, 0]),
        ("negative axis keep", arg(ArgKind::Max, -1, true, false), vec![2, 1], vec![1, 0]),
        ("axis 0 keep", arg(ArgKind::Max, -2, true, false), vec![1, 3], vec![1, 0, 1]),
    ];
    for (case, op, shape, want) in cases {
        check(case, &op, std::slice::from_ref(&x), &[i64s(&shape, &want)]);
    }
    check(
        "beyond f64 precision",
        &arg(ArgKind::Max, 0, false, false),
        &[i64s(&[2], &[i64::MAX - 1, i64::MAX])],
        &[i64s(&[], &[1])],
    );
    check("bool", &arg(ArgKind::Max, 0, false, false), &[bools(&[3], &[false, true, true])], &[i64s(&[], &[1])]);
}

#[test]
fn arg_reduce_nan_is_extreme() {
    let x = f32s(&[4], &[1.0, NAN, 5.0, NAN]);
    check("argmax", &arg(ArgKind::Max, 0, false, false), std::slice::from_ref(&x), &[i64s(&[], &[1])]);
    check("argmin", &arg(ArgKind::Min, 0, false, false), std::slice::from_ref(&x), &[i64s(&[], &[1])]);
    check("last nan", &arg(ArgKind::Max, 0, false, true), &[x], &[i64s(&[], &[3])]);
    check("nan after max", &arg(ArgKind::Max, 0, false, false), &[f64s(&[2], &[9.0, f64::NAN])], &[i64s(&[], &[1])]);
}

#[test]
fn arg_reduce_empty() {
    check_err("empty axis", &arg(ArgKind::Max, 1, false, false), &[f32s(&[2, 0], &[])], "no elements");
    check("empty result", &arg(ArgKind::Min, 1, false, false), &[f32s(&[0, 3], &[])], &[i64s(&[0], &[])]);
    check_err("scalar", &arg(ArgKind::Max, 0, false, false), &[f32s(&[], &[1.0])], "rank");
}

#[test]
fn matmul_shapes() {
    let mm = Op::MatMul;
    let a = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let cases: Vec<(&str, Vec<_>, _)> = vec![
        (
            "2d",
            vec![a.clone(), f32s(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0])],
            f32s(&[2, 2], &[58.0, 64.0, 139.0, 154.0]),
        ),
        ("vector dot", vec![f32s(&[3], &[1.0, 2.0, 3.0]), f32s(&[3], &[4.0, 5.0, 6.0])], f32s(&[], &[32.0])),
        ("vector @ matrix", vec![f32s(&[2], &[1.0, 2.0]), a.clone()], f32s(&[3], &[9.0, 12.0, 15.0])),
        ("matrix @ vector", vec![a.clone(), f32s(&[3], &[1.0, 1.0, 1.0])], f32s(&[2], &[6.0, 15.0])),
        (
            "batch @ matrix",
            vec![f32s(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]), f32s(&[2, 1], &[10.0, 100.0])],
            f32s(&[2, 1, 1], &[210.0, 430.0]),
        ),
        (
            "matrix @ batch",
            vec![f32s(&[1, 2], &[5.0, 6.0]), f32s(&[3, 2, 1], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0])],
            f32s(&[3, 1, 1], &[5.0, 6.0, 11.0]),
        ),
        (
            "broadcast batches",
            vec![f32s(&[2, 1, 1, 2], &[1.0, 2.0, 3.0, 4.0]), f32s(&[3, 2, 1], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0])],
            f32s(&[2, 3, 1, 1], &[1.0, 2.0, 3.0, 3.0, 4.0, 7.0]),
        ),
        (
            "vector @ batch",
            vec![f32s(&[2], &[1.0, 1.0]), f32s(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])],
            f32s(&[2, 2], &[4.0, 6.0, 12.0, 14.0]),
        ),
        ("empty k gives zeros", vec![f32s(&[2, 0], &[]), f32s(&[0, 3], &[])], f32s(&[2, 3], &[0.0; 6])),
        ("empty m", vec![f32s(&[0, 2], &[]), f32s(&[2, 3], &[0.0; 6])], f32s(&[0, 3], &[])),
    ];
    for (case, inputs, want) in cases {
        check(case, &mm, &inputs, &[want]);
    }
    check_err("contraction mismatch", &mm, &[a.clone(), a], "contraction");
    check_err("bool", &mm, &[bools(&[1, 1], &[true]), bools(&[1, 1], &[true])], "numeric");
}

#[test]
fn matmul_numerics() {
    let mm = Op::MatMul;
    check("i8 wraps", &mm, &[i8s(&[1, 2], &[100, 100]), i8s(&[2, 1], &[1, 1])], &[i8s(&[1, 1], &[-56])]);
    check("i64", &mm, &[i64s(&[1, 2], &[3, -4]), i64s(&[2, 2], &[1, 2, 3, 4])], &[i64s(&[1, 2], &[-9, -10])]);
    // Accumulated in f32: 2048 + 1 + 1 = 2050 (in f16 each step would round back to 2048).
    check(
        "f16 accumulates in f32",
        &mm,
        &[f16s(&[1, 3], &[2048.0, 1.0, 1.0]), f16s(&[3, 1], &[1.0, 1.0, 1.0])],
        &[f16s(&[1, 1], &[2050.0])],
    );
    check("nan", &mm, &[f64s(&[1, 2], &[f64::NAN, 1.0]), f64s(&[2, 1], &[0.0, 1.0])], &[f64s(&[1, 1], &[f64::NAN])]);
}
