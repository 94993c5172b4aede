//! Reference semantics of the data-movement ops: reshape, transpose, broadcast, slice, concat, split, pad,
//! gather, gather_elements, scatter, iota, shape_of and constant. Expected values are computed by hand.

mod interp_support;

use interp_support::*;
use kiln_ir::op::{
    Broadcast, Concat, Constant, Gather, GatherElements, Iota, Pad, PadMode, Reshape, Scatter, ScatterReduction as SR,
    Slice, Split, Transpose,
};
use kiln_ir::{DType, Dim, Op, Shape};

fn iota_i64(shape: &[usize]) -> kiln_ir::Tensor {
    let n: usize = shape.iter().product();
    i64s(shape, &(0..n as i64).collect::<Vec<_>>())
}

fn reshape(dims: &[u64]) -> Op {
    Op::Reshape(Reshape { shape: Shape::of(dims) })
}

fn slice(starts: &[i64], ends: &[i64], axes: &[i64], steps: &[i64]) -> Op {
    Op::Slice(Slice { starts: starts.to_vec(), ends: ends.to_vec(), axes: axes.to_vec(), steps: steps.to_vec() })
}

fn pad(mode: PadMode, pads: &[i64], value: f64) -> Op {
    Op::Pad(Pad { mode, pads: pads.to_vec(), value })
}

fn scatter(axis: i64, reduction: SR) -> Op {
    Op::Scatter(Scatter { axis, reduction })
}

#[test]
fn reshape_keeps_row_major_order() {
    let x = iota_i64(&[2, 3]);
    check("2x3 -> 3x2", &reshape(&[3, 2]), std::slice::from_ref(&x), &[i64s(&[3, 2], &[0, 1, 2, 3, 4, 5])]);
    check("flatten", &reshape(&[6]), std::slice::from_ref(&x), &[iota_i64(&[6])]);
    check("to scalar", &reshape(&[]), &[f32s(&[1, 1], &[7.0])], &[f32s(&[], &[7.0])]);
    check("zero-size", &reshape(&[3, 0]), &[f32s(&[0, 3], &[])], &[f32s(&[3, 0], &[])]);
    check_err("count mismatch", &reshape(&[4]), std::slice::from_ref(&x), "cannot reshape");
    let symbolic = Op::Reshape(Reshape { shape: Shape(vec![Dim::sym("n"), Dim::Static(3)]) });
    check_err("unbound symbol", &symbolic, &[x], "cannot reshape");
}

#[test]
fn transpose_permutes() {
    let t = |perm: &[i64]| Op::Transpose(Transpose { perm: perm.to_vec() });
    check("2d", &t(&[1, 0]), &[iota_i64(&[2, 3])], &[i64s(&[3, 2], &[0, 3, 1, 4, 2, 5])]);
    check("3d", &t(&[2, 0, 1]), &[iota_i64(&[2, 1, 3])], &[i64s(&[3, 2, 1], &[0, 3, 1, 4, 2, 5])]);
    check("identity", &t(&[0, 1]), &[iota_i64(&[2, 2])], &[iota_i64(&[2, 2])]);
    check("zero-size", &t(&[1, 0]), &[bools(&[0, 2], &[])], &[bools(&[2, 0], &[])]);
    check("scalar", &t(&[]), &[f32s(&[], &[1.0])], &[f32s(&[], &[1.0])]);
    check_err("not a permutation", &t(&[0, 0]), &[iota_i64(&[2, 2])], "permutation");
}

#[test]
fn broadcast_to_shape() {
    let b = |dims: &[u64]| Op::Broadcast(Broadcast { shape: Shape::of(dims) });
    check("row", &b(&[2, 3]), &[i32s(&[3], &[1, 2, 3])], &[i32s(&[2, 3], &[1, 2, 3, 1, 2, 3])]);
    check("column", &b(&[2, 3]), &[i32s(&[2, 1], &[1, 2])], &[i32s(&[2, 3], &[1, 1, 1, 2, 2, 2])]);
    check("scalar", &b(&[2]), &[u8s(&[], &[7])], &[u8s(&[2], &[7, 7])]);
    check("to empty", &b(&[0, 3]), &[i32s(&[1, 3], &[1, 2, 3])], &[i32s(&[0, 3], &[])]);
    check_err("incompatible", &b(&[2, 3]), &[i32s(&[2], &[1, 2])], "broadcast");
}

#[test]
fn slice_ranges() {
    let x = iota_i64(&[10]);
    let cases: Vec<(&str, Op, Vec<i64>)> = vec![
        ("step 3", slice(&[2], &[8], &[0], &[3]), vec![2, 5]),
        ("negative start, end clamped", slice(&[-3], &[100], &[0], &[1]), vec![7, 8, 9]),
        ("reverse all", slice(&[-1], &[-100], &[0], &[-2]), vec![9, 7, 5, 3, 1]),
        ("reverse part", slice(&[8], &[2], &[0], &[-3]), vec![8, 5]),
        ("empty", slice(&[5], &[2], &[0], &[1]), vec![]),
        ("extreme bounds", slice(&[i64::MIN], &[i64::MAX], &[-1], &[4]), vec![0, 4, 8]),
        ("extreme reverse", slice(&[i64::MAX], &[i64::MIN], &[0], &[-4]), vec![9, 5, 1]),
    ];
    for (case, op, want) in cases {
        check(case, &op, std::slice::from_ref(&x), &[i64s(&[want.len()], &want)]);
    }
    check(
        "2d, negative axis first",
        &slice(&[1, 0], &[3, 2], &[-1, 0], &[1, 1]),
        &[iota_i64(&[3, 4])],
        &[i64s(&[2, 2], &[1, 2, 5, 6])],
    );
    check_err("zero step", &slice(&[0], &[1], &[0], &[0]), &[x], "nonzero");
}

#[test]
fn concat_and_split() {
    let c = |axis| Op::Concat(Concat { axis });
    check(
        "axis 0",
        &c(0),
        &[i32s(&[1, 2], &[1, 2]), i32s(&[2, 2], &[3, 4, 5, 6])],
        &[i32s(&[3, 2], &[1, 2, 3, 4, 5, 6])],
    );
    check(
        "axis -1",
        &c(-1),
        &[i32s(&[2, 1], &[1, 2]), i32s(&[2, 2], &[3, 4, 5, 6]), i32s(&[2, 0], &[])],
        &[i32s(&[2, 3], &[1, 3, 4, 2, 5, 6])],
    );
    check("one operand", &c(0), &[f32s(&[2], &[1.0, 2.0])], &[f32s(&[2], &[1.0, 2.0])]);
    check("all empty", &c(1), &[f32s(&[0, 1], &[]), f32s(&[0, 2], &[])], &[f32s(&[0, 3], &[])]);
    check_err("dtypes", &c(0), &[f32s(&[1], &[1.0]), f64s(&[1], &[1.0])], "operand 1");

    let s = |axis, sizes: &[i64]| Op::Split(Split { axis, sizes: sizes.to_vec() });
    check(
        "split 1d",
        &s(0, &[2, 0, 3]),
        &[iota_i64(&[5])],
        &[i64s(&[2], &[0, 1]), i64s(&[0], &[]), i64s(&[3], &[2, 3, 4])],
    );
    check(
        "split last axis",
        &s(-1, &[1, 2]),
        &[iota_i64(&[2, 3])],
        &[i64s(&[2, 1], &[0, 3]), i64s(&[2, 2], &[1, 2, 4, 5])],
    );
    check_err("sizes", &s(0, &[2, 2]), &[iota_i64(&[5])], "add up");
}

#[test]
fn pad_modes() {
    let x = i32s(&[3], &[1, 2, 3]);
    let cases: Vec<(&str, Op, Vec<i32>)> = vec![
        ("constant", pad(PadMode::Constant, &[2, 1], 9.0), vec![9, 9, 1, 2, 3, 9]),
        ("constant truncates the fill", pad(PadMode::Constant, &[1, 0], -2.7), vec![-2, 1, 2, 3]),
        ("reflect", pad(PadMode::Reflect, &[2, 2], 0.0), vec![3, 2, 1, 2, 3, 2, 1]),
        ("edge", pad(PadMode::Edge, &[2, 1], 0.0), vec![1, 1, 1, 2, 3, 3]),
        ("crop", pad(PadMode::Constant, &[-1, 1], 0.0), vec![2, 3, 0]),
        ("crop all", pad(PadMode::Edge, &[-2, -1], 0.0), vec![]),
    ];
    for (case, op, want) in cases {
        check(case, &op, std::slice::from_ref(&x), &[i32s(&[want.len()], &want)]);
    }
    check(
        "reflect deeper",
        &pad(PadMode::Reflect, &[3, 0], 0.0),
        &[i32s(&[4], &[1, 2, 3, 4])],
        &[i32s(&[7], &[4, 3, 2, 1, 2, 3, 4])],
    );
    check(
        "2d",
        &pad(PadMode::Constant, &[1, 0, 0, 1], 0.5),
        &[f32s(&[1, 2], &[1.0, 2.0])],
        &[f32s(&[2, 3], &[0.5, 0.5, 0.5, 1.0, 2.0, 0.5])],
    );
    check("bool fill", &pad(PadMode::Constant, &[0, 1], 1.0), &[bools(&[1], &[false])], &[bools(&[2], &[false, true])]);
    check("empty dim, constant", &pad(PadMode::Constant, &[1, 1], 3.0), &[u8s(&[0], &[])], &[u8s(&[2], &[3, 3])]);
    check_err("reflect too far", &pad(PadMode::Reflect, &[3, 0], 0.0), std::slice::from_ref(&x), "reflect");
    check_err("edge of nothing", &pad(PadMode::Edge, &[1, 0], 0.0), &[u8s(&[0], &[])], "empty");
    check_err("pads count", &pad(PadMode::Constant, &[1], 0.0), &[x], "pads");
}

#[test]
fn gather_takes_along_axis() {
    let g = |axis| Op::Gather(Gather { axis });
    let data = i32s(&[3, 2], &[1, 2, 3, 4, 5, 6]);
    let cases: Vec<(&str, Op, kiln_ir::Tensor, kiln_ir::Tensor)> = vec![
        ("rows", g(0), i64s(&[2], &[2, 0]), i32s(&[2, 2], &[5, 6, 1, 2])),
        ("negative", g(0), i32s(&[1], &[-1]), i32s(&[1, 2], &[5, 6])),
        ("2d indices", g(0), i32s(&[2, 2], &[0, 1, 1, 2]), i32s(&[2, 2, 2], &[1, 2, 3, 4, 3, 4, 5, 6])),
        ("scalar index on axis -1", g(-1), i64s(&[], &[1]), i32s(&[3], &[2, 4, 6])),
        ("no indices", g(0), i64s(&[0], &[]), i32s(&[0, 2], &[])),
    ];
    for (case, op, idx, want) in cases {
        check(case, &op, &[data.clone(), idx], &[want]);
    }
    check_err("past the end", &g(0), &[data.clone(), i64s(&[2], &[0, 3])], "index 3 is out of range");
    check_err("before the start", &g(1), &[data.clone(), i64s(&[1], &[-3])], "out of range");
    check_err("float indices", &g(0), &[data, f32s(&[1], &[0.0])], "indices");
}

#[test]
fn gather_elements_by_position() {
    let g = |axis| Op::GatherElements(GatherElements { axis });
    let data = i32s(&[2, 2], &[1, 2, 3, 4]);
    check("axis 1", &g(1), &[data.clone(), i64s(&[2, 2], &[0, 0, 1, 0])], &[i32s(&[2, 2], &[1, 1, 4, 3])]);
    check("axis 0, fewer rows", &g(0), &[data.clone(), i32s(&[1, 2], &[1, 0])], &[i32s(&[1, 2], &[3, 2])]);
    check("negative", &g(-1), &[data.clone(), i64s(&[2, 1], &[-1, -2])], &[i32s(&[2, 1], &[2, 3])]);
    check_err("out of range", &g(1), &[data.clone(), i64s(&[2, 1], &[0, 2])], "out of range");
    check_err("too wide", &g(0), &[data, i64s(&[1, 3], &[0, 0, 0])], "exceed");
}

#[test]
fn scatter_writes_and_combines() {
    // ONNX's ScatterElements example.
    check(
        "onnx example",
        &scatter(0, SR::None),
        &[f32s(&[3, 3], &[0.0; 9]), i64s(&[2, 3], &[1, 0, 2, 0, 2, 1]), f32s(&[2, 3], &[1.0, 1.1, 1.2, 2.0, 2.1, 2.2])],
        &[f32s(&[3, 3], &[2.0, 1.1, 0.0, 1.0, 0.0, 2.2, 0.0, 2.1, 1.2])],
    );
    check(
        "axis 1, negative index",
        &scatter(1, SR::None),
        &[f32s(&[1, 5], &[1.0, 2.0, 3.0, 4.0, 5.0]), i32s(&[1, 2], &[1, -2]), f32s(&[1, 2], &[1.5, 2.5])],
        &[f32s(&[1, 5], &[1.0, 1.5, 3.0, 2.5, 5.0])],
    );
    let data = i32s(&[2], &[1, 2]);
    let idx = i64s(&[3], &[0, 0, 1]);
    let upd = i32s(&[3], &[10, 20, -30]);
    let cases =
        [(SR::None, [20, -30]), (SR::Add, [31, -28]), (SR::Mul, [200, -60]), (SR::Max, [20, 2]), (SR::Min, [1, -30])];
    for (r, want) in cases {
        check(r.name(), &scatter(0, r), &[data.clone(), idx.clone(), upd.clone()], &[i32s(&[2], &want)]);
    }
    check(
        "i8 add wraps",
        &scatter(0, SR::Add),
        &[i8s(&[1], &[100]), i64s(&[1], &[0]), i8s(&[1], &[100])],
        &[i8s(&[1], &[-56])],
    );
    check(
        "max propagates nan",
        &scatter(0, SR::Max),
        &[f32s(&[2], &[f32::NAN, 1.0]), i64s(&[2], &[0, 1]), f32s(&[2], &[5.0, f32::NAN])],
        &[f32s(&[2], &[f32::NAN, f32::NAN])],
    );
    check(
        "f16 add accumulates in f32",
        &scatter(0, SR::Add),
        &[f16s(&[1], &[2048.0]), i64s(&[2], &[0, 0]), f16s(&[2], &[1.0, 1.0])],
        &[f16s(&[1], &[2050.0])],
    );
    check(
        "bool add is or",
        &scatter(0, SR::Add),
        &[bools(&[2], &[false, true]), i64s(&[2], &[0, 1]), bools(&[2], &[true, false])],
        &[bools(&[2], &[true, true])],
    );
    check(
        "no updates",
        &scatter(0, SR::Add),
        &[data.clone(), i64s(&[0], &[]), i32s(&[0], &[])],
        std::slice::from_ref(&data),
    );
    check_err("out of range", &scatter(0, SR::None), &[data, i64s(&[1], &[2]), i32s(&[1], &[0])], "out of range");
}

#[test]
fn sources() {
    let iota =
        |dtype, dims: &[u64], axis, start, step| Op::Iota(Iota { dtype, shape: Shape::of(dims), axis, start, step });
    check("iota axis 1", &iota(DType::I64, &[2, 3], 1, 0.0, 1.0), &[], &[i64s(&[2, 3], &[0, 1, 2, 0, 1, 2])]);
    check(
        "iota axis 0",
        &iota(DType::F32, &[2, 3], -2, 1.5, -0.5),
        &[],
        &[f32s(&[2, 3], &[1.5, 1.5, 1.5, 1.0, 1.0, 1.0])],
    );
    check("iota saturates like cast", &iota(DType::I8, &[2], 0, 120.0, 10.0), &[], &[i8s(&[2], &[120, 127])]);
    check("iota empty", &iota(DType::Bool, &[0], 0, 0.0, 1.0), &[], &[bools(&[0], &[])]);
    let symbolic =
        Op::Iota(Iota { dtype: DType::I32, shape: Shape(vec![Dim::sym("n")]), axis: 0, start: 0.0, step: 1.0 });
    check_err("iota unbound", &symbolic, &[], "unbound");

    check("shape_of", &Op::ShapeOf, &[f32s(&[2, 0, 3], &[])], &[i64s(&[3], &[2, 0, 3])]);
    check("shape_of scalar", &Op::ShapeOf, &[bools(&[], &[true])], &[i64s(&[0], &[])]);
    let value = u8s(&[2], &[4, 5]);
    check("constant", &Op::Constant(Constant { value: value.clone() }), &[], &[value]);
}

#[test]
fn zero_size_with_huge_extents() {
    // No elements, but the dims after the zero multiply past u64: nothing may overflow.
    let big = 1usize << 40;
    let x = f32s(&[0, big, big], &[]);
    let sum =
        Op::Reduce(kiln_ir::op::Reduce { kind: kiln_ir::op::ReduceKind::Sum, axes: vec![1, 2], keep_dims: false });
    check("reduce", &sum, std::slice::from_ref(&x), &[f32s(&[0], &[])]);
    let t = Op::Transpose(Transpose { perm: vec![0, 2, 1] });
    check("transpose", &t, std::slice::from_ref(&x), &[f32s(&[0, big, big], &[])]);
    check("slice", &slice(&[1], &[3], &[1], &[1]), std::slice::from_ref(&x), &[f32s(&[0, 2, big], &[])]);
    check("shape_of", &Op::ShapeOf, std::slice::from_ref(&x), &[i64s(&[3], &[0, big as i64, big as i64])]);
    let iota = Op::Iota(Iota {
        dtype: DType::F32,
        shape: Shape::of(&[0, big as u64, big as u64]),
        axis: 1,
        start: 0.0,
        step: 1.0,
    });
    check("iota", &iota, &[], &[x]);
}

#[test]
fn extreme_pads_do_not_overflow() {
    // 3 + i64::MIN + i64::MAX = 2: every result position falls outside the input.
    check(
        "pad",
        &pad(PadMode::Constant, &[i64::MIN, i64::MAX], 9.0),
        &[i32s(&[3], &[1, 2, 3])],
        &[i32s(&[2], &[9, 9])],
    );
}
