//! The built-in kernels (`kernel::builtin`) against the interpreter: each kernel runs in the reference evaluator
//! (`kernel::eval`) and must give what `kiln_ir::interp::eval_op` gives for the same op — bit-exact (NaN equal
//! to NaN) for conv_direct, pool and gather, which fold in the interpreter's order; within 1e-5 (relative, with
//! an absolute floor of 1e-5) for im2col followed by a reference matmul, compared with the conv.

mod common;

use common::edge_tensor;
use kiln_codegen::kernel::{self, Kernel, builtin};
use kiln_ir::op::{Conv, Gather, Op, Pool, PoolKind};
use kiln_ir::tensor::Data;
use kiln_ir::{DType, Dim, Shape, Tensor, TensorType};

/// The static type of `t`, with dim 0 renamed to symbol `batch` when `symbolic`.
fn ty(t: &Tensor, symbolic: bool) -> TensorType {
    let mut ty = t.tensor_type();
    if symbolic {
        ty.shape.0[0] = Dim::Sym("batch".into());
    }
    ty
}

/// The op's result type for operand types `ins`.
fn result_type(op: &Op, ins: &[TensorType]) -> TensorType {
    kiln_ir::infer::infer(op, ins).unwrap().remove(0)
}

/// Runs `k` on `inputs` with `symbols` and returns its one output (of type `out` with dim 0 = `batch`).
fn run(k: &Kernel, inputs: &[Tensor], out: &Tensor, symbols: &[i64]) -> Tensor {
    let mut args: Vec<Tensor> = inputs.to_vec();
    args.push(Tensor::zeros(out.dtype(), out.shape().to_vec()));
    kernel::eval(k, &mut args, symbols).unwrap_or_else(|e| panic!("{e}\n{}", kernel::print(k)));
    args.pop().unwrap()
}

/// The symbol values of `k`: `batch` for the batch symbol.
fn symbols(k: &Kernel, batch: usize) -> Vec<i64> {
    k.symbols.iter().map(|s| if s == "batch" { batch as i64 } else { panic!("unexpected symbol {s}") }).collect()
}

fn assert_bit_exact(case: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape(), "{case}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{case}: dtype");
    if !want.dtype().is_float() {
        assert_eq!(got.to_i64_vec(), want.to_i64_vec(), "{case}: values");
        return;
    }
    for (i, (g, w)) in got.to_f64_vec().into_iter().zip(want.to_f64_vec()).enumerate() {
        let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
        assert!(same, "{case}: element {i} is {g}, the interpreter gives {w}");
    }
}

fn assert_close(case: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape(), "{case}: shape");
    for (i, (g, w)) in got.to_f64_vec().into_iter().zip(want.to_f64_vec()).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{case}: element {i} is {g}, the conv gives {w}");
    }
}

// ---- conv -----------------------------------------------------------------------------------------------------

/// One conv case: shapes of x and w, attributes, and whether it has a bias.
struct ConvCase {
    name: &'static str,
    x: &'static [usize],
    w: &'static [usize],
    strides: &'static [i64],
    pads: &'static [i64],
    dilations: &'static [i64],
    groups: i64,
    bias: bool,
}

const CONV_CASES: &[ConvCase] = &[
    ConvCase {
        name: "1x1",
        x: &[2, 4, 5, 5],
        w: &[3, 4, 1, 1],
        strides: &[1, 1],
        pads: &[0; 4],
        dilations: &[1, 1],
        groups: 1,
        bias: false,
    },
    ConvCase {
        name: "3x3 pad 1 bias",
        x: &[1, 3, 6, 7],
        w: &[4, 3, 3, 3],
        strides: &[1, 1],
        pads: &[1; 4],
        dilations: &[1, 1],
        groups: 1,
        bias: true,
    },
    ConvCase {
        name: "7x7 s2 pad 3",
        x: &[1, 3, 16, 15],
        w: &[8, 3, 7, 7],
        strides: &[2, 2],
        pads: &[3; 4],
        dilations: &[1, 1],
        groups: 1,
        bias: true,
    },
    ConvCase {
        name: "3x3 s2 asymmetric pads",
        x: &[2, 2, 7, 6],
        w: &[3, 2, 3, 3],
        strides: &[2, 2],
        pads: &[0, 2, 1, 0],
        dilations: &[1, 1],
        groups: 1,
        bias: false,
    },
    ConvCase {
        name: "dilation 2",
        x: &[1, 2, 9, 9],
        w: &[3, 2, 3, 3],
        strides: &[1, 1],
        pads: &[2; 4],
        dilations: &[2, 2],
        groups: 1,
        bias: true,
    },
    ConvCase {
        name: "1-D s2",
        x: &[2, 3, 10],
        w: &[4, 3, 3],
        strides: &[2],
        pads: &[1, 2],
        dilations: &[1],
        groups: 1,
        bias: true,
    },
    ConvCase {
        name: "3-D",
        x: &[1, 2, 4, 5, 3],
        w: &[2, 2, 2, 3, 2],
        strides: &[1, 2, 1],
        pads: &[1, 0, 1, 0, 1, 1],
        dilations: &[1, 1, 1],
        groups: 1,
        bias: false,
    },
    ConvCase {
        name: "groups 2",
        x: &[1, 4, 6, 6],
        w: &[6, 2, 3, 3],
        strides: &[1, 1],
        pads: &[1; 4],
        dilations: &[1, 1],
        groups: 2,
        bias: true,
    },
    ConvCase {
        name: "depthwise s2",
        x: &[2, 3, 5, 5],
        w: &[3, 1, 3, 3],
        strides: &[2, 2],
        pads: &[1; 4],
        dilations: &[1, 1],
        groups: 3,
        bias: false,
    },
    ConvCase {
        name: "depthwise multiplier 2 dilated",
        x: &[1, 2, 8, 8],
        w: &[4, 1, 3, 3],
        strides: &[1, 1],
        pads: &[2, 1, 2, 1],
        dilations: &[2, 2],
        groups: 2,
        bias: true,
    },
];

fn conv_attr(c: &ConvCase) -> Conv {
    Conv { strides: c.strides.to_vec(), pads: c.pads.to_vec(), dilations: c.dilations.to_vec(), groups: c.groups }
}

/// Operands of a conv case: x, w and the bias if any.
fn conv_operands(c: &ConvCase, dtype: DType, seed: u64) -> Vec<Tensor> {
    let mut ops = vec![Tensor::random(dtype, c.x.to_vec(), seed), Tensor::random(dtype, c.w.to_vec(), seed + 1)];
    if c.bias {
        ops.push(Tensor::random(dtype, vec![c.w[0]], seed + 2));
    }
    ops
}

fn check_conv_direct(c: &ConvCase, dtype: DType, symbolic: bool, seed: u64) {
    let case = format!("conv_direct {} {dtype}{}", c.name, if symbolic { " symbolic batch" } else { "" });
    let attr = conv_attr(c);
    let ops = conv_operands(c, dtype, seed);
    let op = Op::Conv(attr.clone());
    let refs: Vec<&Tensor> = ops.iter().collect();
    let want = kiln_ir::interp::eval_op(&op, &refs).unwrap().remove(0);
    let types: Vec<TensorType> = ops.iter().enumerate().map(|(i, t)| ty(t, symbolic && i == 0)).collect();
    let out = result_type(&op, &types);
    let k = builtin::conv_direct("conv", &types[0], &types[1], types.get(2), &attr, &out).unwrap();
    let got = run(&k, &ops, &want, &symbols(&k, c.x[0]));
    assert_bit_exact(&case, &got, &want);
}

#[test]
fn conv_direct_matches_the_interpreter() {
    for (i, c) in CONV_CASES.iter().enumerate() {
        check_conv_direct(c, DType::F32, false, i as u64);
    }
}

#[test]
fn conv_direct_with_a_symbolic_batch_and_other_float_dtypes() {
    for c in [&CONV_CASES[1], &CONV_CASES[3], &CONV_CASES[8]] {
        check_conv_direct(c, DType::F32, true, 7);
        check_conv_direct(c, DType::F16, false, 8);
        check_conv_direct(c, DType::F64, false, 9);
    }
}

#[test]
fn conv_direct_on_edge_values() {
    // NaN, infinities, signed zeros and subnormals: a padded tap must contribute nothing, not 0·inf.
    let c = &CONV_CASES[1];
    let attr = conv_attr(c);
    let ops = vec![edge_tensor(DType::F32, c.x.to_vec(), 0), edge_tensor(DType::F32, c.w.to_vec(), 5)];
    let op = Op::Conv(attr.clone());
    let want = kiln_ir::interp::eval_op(&op, &[&ops[0], &ops[1]]).unwrap().remove(0);
    let k = builtin::conv_direct("conv", &ty(&ops[0], false), &ty(&ops[1], false), None, &attr, &want.tensor_type())
        .unwrap();
    assert_bit_exact("conv_direct edge values", &run(&k, &ops, &want, &[]), &want);
}

/// `y[n, m, p] = Σ_k w[m, k] · col[n, k, p] (+ bias[m])`, in f32 in k order.
fn matmul_conv(col: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Vec<f32> {
    let (n, kk, p) = (col.shape()[0], col.shape()[1], col.shape()[2]);
    let m = w.shape()[0];
    let (cv, wv) = (col.to_f64_vec(), w.to_f64_vec());
    let bv = bias.map(|b| b.to_f64_vec());
    let mut y = Vec::with_capacity(n * m * p);
    for b in 0..n {
        for mo in 0..m {
            for q in 0..p {
                let mut acc = 0f32;
                for k in 0..kk {
                    acc += wv[mo * kk + k] as f32 * cv[(b * kk + k) * p + q] as f32;
                }
                if let Some(bv) = &bv {
                    acc += bv[mo] as f32;
                }
                y.push(acc);
            }
        }
    }
    y
}

#[test]
fn im2col_and_bias_fill_then_a_matmul_give_the_conv() {
    for (i, c) in CONV_CASES.iter().enumerate().filter(|(_, c)| c.groups == 1) {
        for symbolic in [false, true] {
            let case = format!("im2col {}{}", c.name, if symbolic { " symbolic batch" } else { "" });
            let attr = conv_attr(c);
            let ops = conv_operands(c, DType::F32, 20 + i as u64);
            let op = Op::Conv(attr.clone());
            let refs: Vec<&Tensor> = ops.iter().collect();
            let want = kiln_ir::interp::eval_op(&op, &refs).unwrap().remove(0);
            let (xt, wt) = (ty(&ops[0], symbolic), ty(&ops[1], false));
            let spatial: usize = want.shape()[2..].iter().product();
            let rows: usize = c.w[1..].iter().product();
            let mut col_type = TensorType::of(DType::F32, &[c.x[0] as u64, rows as u64, spatial as u64]);
            if symbolic {
                col_type.shape.0[0] = Dim::Sym("batch".into());
            }
            let k = builtin::im2col("im2col", &xt, &wt, &attr, &col_type).unwrap();
            let col_shape = Tensor::zeros(DType::F32, vec![c.x[0], rows, spatial]);
            let col = run(&k, &ops[..1], &col_shape, &symbols(&k, c.x[0]));
            let y = Tensor::from_vec(want.shape().to_vec(), matmul_conv(&col, &ops[1], ops.get(2))).unwrap();
            assert_close(&case, &y, &want);

            if let Some(bias) = ops.get(2) {
                let out_type = ty(&want, symbolic);
                let k = builtin::bias_fill("bias", &bias.tensor_type(), &out_type).unwrap();
                let filled = run(&k, std::slice::from_ref(bias), &want, &symbols(&k, c.x[0]));
                let per_channel: usize = want.shape()[2..].iter().product();
                let expected: Vec<f64> =
                    (0..filled.len()).map(|j| bias.to_f64_vec()[(j / per_channel) % c.w[0]]).collect();
                assert_eq!(filled.to_f64_vec(), expected, "bias_fill {}", c.name);
            }
        }
    }
}

#[test]
fn bias_fill_copies_any_dtype() {
    let bias = Tensor::from_vec(vec![3], vec![i64::MIN, -1, 7]).unwrap();
    let out = TensorType::new(DType::I64, Shape(vec![Dim::Sym("batch".into()), Dim::Static(3), Dim::Static(2)]));
    let k = builtin::bias_fill("bias", &bias.tensor_type(), &out).unwrap();
    let got = run(&k, &[bias], &Tensor::zeros(DType::I64, vec![2, 3, 2]), &[2]);
    assert_eq!(got.to_i64_vec(), [i64::MIN, i64::MIN, -1, -1, 7, 7, i64::MIN, i64::MIN, -1, -1, 7, 7]);
}

// ---- pool -----------------------------------------------------------------------------------------------------

/// `(name, x shape, kind, kernel, strides, pads, dilations, ceil_mode, count_include_pad)`.
type PoolCase = (
    &'static str,
    &'static [usize],
    PoolKind,
    &'static [i64],
    &'static [i64],
    &'static [i64],
    &'static [i64],
    bool,
    bool,
);

const POOL_CASES: &[PoolCase] = &[
    ("max 3x3 s2 p1", &[2, 3, 9, 8], PoolKind::Max, &[3, 3], &[2, 2], &[1; 4], &[1, 1], false, false),
    ("max 2x2 s2", &[1, 2, 6, 6], PoolKind::Max, &[2, 2], &[2, 2], &[0; 4], &[1, 1], false, false),
    ("max ceil", &[1, 2, 7, 8], PoolKind::Max, &[3, 3], &[2, 2], &[0; 4], &[1, 1], true, false),
    ("max ceil padded", &[1, 1, 6, 6], PoolKind::Max, &[3, 2], &[2, 3], &[1, 0, 1, 1], &[1, 1], true, false),
    ("max dilation 2", &[1, 2, 9, 9], PoolKind::Max, &[3, 3], &[1, 1], &[2; 4], &[2, 2], false, false),
    ("max 1-D", &[2, 3, 11], PoolKind::Max, &[4], &[3], &[1, 2], &[1], true, false),
    ("max global", &[2, 3, 5, 4], PoolKind::Max, &[5, 4], &[1, 1], &[0; 4], &[1, 1], false, false),
    ("avg 2x2 s2", &[1, 2, 6, 6], PoolKind::Avg, &[2, 2], &[2, 2], &[0; 4], &[1, 1], false, false),
    ("avg 3x3 p1 exclude pad", &[2, 2, 5, 6], PoolKind::Avg, &[3, 3], &[1, 1], &[1; 4], &[1, 1], false, false),
    ("avg 3x3 p1 include pad", &[2, 2, 5, 6], PoolKind::Avg, &[3, 3], &[1, 1], &[1; 4], &[1, 1], false, true),
    ("avg ceil include pad", &[1, 2, 7, 7], PoolKind::Avg, &[3, 3], &[2, 2], &[1, 0, 1, 0], &[1, 1], true, true),
    ("avg ceil exclude pad", &[1, 2, 7, 7], PoolKind::Avg, &[3, 3], &[2, 2], &[1, 0, 1, 0], &[1, 1], true, false),
    ("avg asymmetric dilated", &[1, 1, 8, 7], PoolKind::Avg, &[2, 3], &[2, 1], &[0, 2, 1, 1], &[2, 2], false, true),
    ("avg 1-D ceil", &[2, 2, 10], PoolKind::Avg, &[3], &[2], &[1, 1], &[1], true, false),
    ("avg global", &[2, 3, 7, 7], PoolKind::Avg, &[7, 7], &[1, 1], &[0; 4], &[1, 1], false, false),
];

fn pool_attr(c: &PoolCase) -> Pool {
    Pool {
        kind: c.2,
        kernel: c.3.to_vec(),
        strides: c.4.to_vec(),
        pads: c.5.to_vec(),
        dilations: c.6.to_vec(),
        ceil_mode: c.7,
        count_include_pad: c.8,
    }
}

fn check_pool(c: &PoolCase, x: Tensor, symbolic: bool) {
    let case = format!("pool {} {}{}", c.0, x.dtype(), if symbolic { " symbolic batch" } else { "" });
    let attr = pool_attr(c);
    let want = kiln_ir::interp::eval_op(&Op::Pool(attr.clone()), &[&x]).unwrap().remove(0);
    let k = builtin::pool("pool", &ty(&x, symbolic), &attr, &ty(&want, symbolic)).unwrap();
    let got = run(&k, std::slice::from_ref(&x), &want, &symbols(&k, x.shape()[0]));
    assert_bit_exact(&case, &got, &want);
}

#[test]
fn pool_matches_the_interpreter() {
    for (i, c) in POOL_CASES.iter().enumerate() {
        check_pool(c, Tensor::random(DType::F32, c.1.to_vec(), i as u64), false);
        check_pool(c, edge_tensor(DType::F32, c.1.to_vec(), i), false);
    }
}

#[test]
fn pool_with_a_symbolic_batch_and_other_dtypes() {
    for (i, c) in POOL_CASES.iter().enumerate() {
        check_pool(c, Tensor::random(DType::F32, c.1.to_vec(), 40 + i as u64), true);
        check_pool(c, edge_tensor(DType::F16, c.1.to_vec(), i), false);
        check_pool(c, Tensor::random(DType::F64, c.1.to_vec(), 60 + i as u64), false);
        if c.2 == PoolKind::Max {
            check_pool(c, edge_tensor(DType::I32, c.1.to_vec(), i), false);
            check_pool(c, edge_tensor(DType::I8, c.1.to_vec(), i), true);
        }
    }
}

// ---- gather ---------------------------------------------------------------------------------------------------

/// Indices of `shape` in `[-n, n)`, of `dtype`.
fn indices(dtype: DType, shape: Vec<usize>, n: usize, seed: usize) -> Tensor {
    let count: usize = shape.iter().product();
    let n = n as i64;
    let values = (0..count).map(|i| ((i * 7 + seed * 3) as i64 % (2 * n)) - n);
    Tensor::new(shape, Data::from_i64_iter(dtype, values)).unwrap()
}

#[test]
fn gather_matches_the_interpreter() {
    // (data shape, axis, indices shape)
    let cases: &[(&[usize], i64, &[usize])] = &[
        (&[5, 3], 0, &[4]),
        (&[5, 3], 0, &[2, 3]),
        (&[4, 6, 2], 1, &[3]),
        (&[4, 6, 2], -1, &[2, 2]),
        (&[3, 4, 5], 2, &[]),
        (&[7], 0, &[3, 2]),
        (&[2, 1, 3], 1, &[4]),
    ];
    for (i, &(shape, axis, idx_shape)) in cases.iter().enumerate() {
        let g = Gather { axis };
        let n = shape[kiln_ir::types::normalize_axis(axis, shape.len()).unwrap()];
        for data_dtype in [DType::F32, DType::I64, DType::F16, DType::Bool] {
            for index_dtype in [DType::I32, DType::I64] {
                // The batch symbol goes on data dim 0 unless that is the gathered axis.
                for symbolic in [false, true] {
                    let data = edge_tensor(data_dtype, shape.to_vec(), i);
                    let idx = indices(index_dtype, idx_shape.to_vec(), n, i);
                    let case =
                        format!("gather {shape:?} axis {axis} {idx_shape:?} {data_dtype} by {index_dtype} {symbolic}");
                    let want = kiln_ir::interp::eval_op(&Op::Gather(g.clone()), &[&data, &idx]).unwrap().remove(0);
                    let dt = ty(&data, symbolic);
                    let out = result_type(&Op::Gather(g.clone()), &[dt.clone(), idx.tensor_type()]);
                    let k = builtin::gather("gather", &dt, &idx.tensor_type(), &g, &out).unwrap();
                    let got = run(&k, &[data, idx], &want, &symbols(&k, shape[0]));
                    assert_bit_exact(&case, &got, &want);
                }
            }
        }
    }
}

#[test]
fn gather_clamps_out_of_range_indices() {
    let data = Tensor::from_vec(vec![3], vec![10i64, 20, 30]).unwrap();
    let idx = Tensor::from_vec(vec![5], vec![-9i32, -1, 3, 100, i32::MIN]).unwrap();
    let out = TensorType::of(DType::I64, &[5]);
    let k = builtin::gather("gather", &data.tensor_type(), &idx.tensor_type(), &Gather { axis: 0 }, &out).unwrap();
    let got = run(&k, &[data, idx], &Tensor::zeros(DType::I64, vec![5]), &[]);
    assert_eq!(got.to_i64_vec(), [10, 30, 30, 30, 10]);
}

#[test]
fn gather_from_a_large_table_is_one_load_per_element() {
    // An embedding table: 50 000 rows of 8, gathered by i64[3, 5] with negative indices.
    let data = Tensor::random(DType::F32, vec![50_000, 8], 7);
    let values: Vec<i64> = (0..15).map(|i| if i % 2 == 0 { i * 3331 } else { -i * 2711 }).collect();
    let idx = Tensor::from_vec(vec![3, 5], values).unwrap();
    let g = Gather { axis: 0 };
    let want = kiln_ir::interp::eval_op(&Op::Gather(g.clone()), &[&data, &idx]).unwrap().remove(0);
    let k = builtin::gather("embed", &data.tensor_type(), &idx.tensor_type(), &g, &want.tensor_type()).unwrap();
    // O(1) per element: no reduction over the table, the row loop innermost (vectorizable), one indirect read.
    let text = kernel::print(&k);
    assert!(!text.contains("reduction") && !text.contains("acc "), "{text}");
    assert!(text.contains("vectorizable") && text.contains("arg1["), "{text}");
    let got = run(&k, &[data, idx], &want, &[]);
    assert_bit_exact("gather f32[50000, 8] by i64[3, 5]", &got, &want);
}

#[test]
fn gather_from_an_empty_axis_never_loads() {
    // No index is valid for an empty axis (the runtime rejects the launch); the kernel still touches no data.
    let data = Tensor::zeros(DType::F32, vec![0, 3]);
    let idx = Tensor::from_vec(vec![2], vec![0i64, -1]).unwrap();
    let out = TensorType::of(DType::F32, &[2, 3]);
    let k = builtin::gather("gather", &data.tensor_type(), &idx.tensor_type(), &Gather { axis: 0 }, &out).unwrap();
    assert!(!kernel::print(&k).contains("arg0["), "{}", kernel::print(&k));
    let got = run(&k, &[data, idx], &Tensor::zeros(DType::F32, vec![2, 3]), &[]);
    assert_eq!(got.to_f64_vec(), [0.0; 6]);
}

// ---- errors ---------------------------------------------------------------------------------------------------

#[test]
fn unsupported_cases_are_errors_naming_op_and_reason() {
    let conv = Conv { strides: vec![1, 1], pads: vec![0; 4], dilations: vec![1, 1], groups: 1 };
    let (x, w) = (TensorType::of(DType::I32, &[1, 2, 4, 4]), TensorType::of(DType::I32, &[3, 2, 3, 3]));
    let out = TensorType::of(DType::I32, &[1, 3, 2, 2]);
    let e = builtin::conv_direct("k", &x, &w, None, &conv, &out).unwrap_err().to_string();
    assert!(e.contains("conv") && e.contains("i32"), "{e}");

    let (x, w) = (TensorType::of(DType::F32, &[1, 4, 4, 4]), TensorType::of(DType::F32, &[4, 2, 3, 3]));
    let grouped = Conv { groups: 2, ..conv.clone() };
    let e = builtin::im2col("k", &x, &w, &grouped, &TensorType::of(DType::F32, &[1, 18, 4])).unwrap_err().to_string();
    assert!(e.contains("im2col") && e.contains("groups"), "{e}");

    let wrong = TensorType::of(DType::F32, &[1, 4, 3, 3]);
    let w1 = TensorType::of(DType::F32, &[4, 4, 3, 3]);
    let e = builtin::conv_direct("k", &x, &w1, None, &conv, &wrong).unwrap_err().to_string();
    assert!(e.contains("conv") && e.contains("result"), "{e}");

    let data = TensorType::of(DType::F32, &[4, 2]);
    let e = builtin::gather("k", &data, &TensorType::of(DType::F32, &[3]), &Gather { axis: 0 }, &data)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gather"), "{e}");

    let avg = Pool {
        kind: PoolKind::Avg,
        kernel: vec![2, 2],
        strides: vec![1, 1],
        pads: vec![0; 4],
        dilations: vec![1, 1],
        ceil_mode: false,
        count_include_pad: false,
    };
    let xi = TensorType::of(DType::I32, &[1, 1, 3, 3]);
    let e = builtin::pool("k", &xi, &avg, &TensorType::of(DType::I32, &[1, 1, 2, 2])).unwrap_err().to_string();
    assert!(e.contains("pool") && e.contains("float"), "{e}");
}
