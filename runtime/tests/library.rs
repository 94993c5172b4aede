//! Differential tests of the CPU library calls: every case runs `matmul`, `conv` or `pool` on random tensors and
//! compares with `kiln_ir::interp::eval_op` (within 1e-4 relative to the result's scale, as summation orders
//! differ), serially and on rayon pools of two and three, without an epilogue and with one that counts its visits
//! (every element exactly once) and applies `relu(v) + 1`.

use std::sync::atomic::{AtomicU32, Ordering};

use kiln_ir::op::{Conv, ConvTranspose, Op, Pool, PoolKind};
use kiln_ir::{DType, Tensor};
use kiln_runtime::library::{self, Epilogue, LibraryError, Par};

const TOLERANCE: f64 = 1e-4;

fn interp(op: &Op, inputs: &[&Tensor]) -> Tensor {
    let mut out = kiln_ir::interp::eval_op(op, inputs).unwrap_or_else(|e| panic!("interpreter: {e}"));
    out.remove(0)
}

fn close(case: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{case}: length");
    let scale = want.iter().filter(|v| v.is_finite()).fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= TOLERANCE * scale
        };
        assert!(ok, "{case}: element {i}: got {g}, want {w}");
    }
}

/// Runs `f` serially (threads 1) and inside pools of two and three (uneven splits).
fn with_threads(mut f: impl FnMut(Par) + Send) {
    f(Par { threads: 1 });
    for threads in [2, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a rayon pool");
        pool.install(|| f(Par { threads }));
    }
}

/// One library call writing its result into the given buffer.
type LibraryCall<'a> = dyn FnMut(&mut [f32], Option<Epilogue>, Par) + Send + 'a;

/// Runs `call` without an epilogue and with a counting `relu(v) + 1` epilogue, checking both against `want`.
fn check_f32(case: &str, want: &Tensor, call: &mut LibraryCall) {
    let want: Vec<f64> = want.to_f64_vec();
    with_threads(|par| {
        let mut y = vec![f32::NAN; want.len()];
        call(&mut y, None, par);
        let got: Vec<f64> = y.iter().map(|&v| f64::from(v)).collect();
        close(&format!("{case} (threads {})", par.threads), &got, &want);

        let visits: Vec<AtomicU32> = (0..want.len()).map(|_| AtomicU32::new(0)).collect();
        let epilogue = |offset: usize, block: &mut [f32]| {
            for (i, v) in block.iter_mut().enumerate() {
                visits[offset + i].fetch_add(1, Ordering::Relaxed);
                *v = v.max(0.0) + 1.0;
            }
        };
        let mut y = vec![f32::NAN; want.len()];
        call(&mut y, Some(&epilogue), par);
        let name = format!("{case} with epilogue (threads {})", par.threads);
        for (i, v) in visits.iter().enumerate() {
            assert_eq!(v.load(Ordering::Relaxed), 1, "{name}: element {i} visited");
        }
        let got: Vec<f64> = y.iter().map(|&v| f64::from(v)).collect();
        let relu: Vec<f64> = want.iter().map(|&v| v.max(0.0) + 1.0).collect();
        close(&name, &got, &relu);
    });
}

fn f32s(t: &Tensor) -> &[f32] {
    t.as_slice::<f32>().expect("an f32 tensor")
}

const MATMULS: &[(&[usize], &[usize])] = &[
    (&[3, 4], &[4, 5]),
    (&[1, 1], &[1, 1]),
    (&[17, 65], &[65, 3]),
    (&[65, 17], &[17, 65]),
    (&[2, 3, 4], &[2, 4, 5]),
    (&[2, 3, 4], &[4, 5]),
    (&[3, 4], &[2, 4, 5]),
    (&[2, 1, 3, 4], &[1, 5, 4, 6]),
    (&[3, 1, 2, 3], &[4, 3, 5]),
    (&[4], &[4, 5]),
    (&[3, 4], &[4]),
    (&[4], &[4]),
    (&[2, 3, 4], &[4]),
    (&[5], &[2, 5, 3]),
    (&[0, 4], &[4, 5]),
    (&[3, 0], &[0, 5]),
    (&[3, 4], &[4, 0]),
    (&[0, 3, 4], &[4, 5]),
    (&[2, 0, 3, 4], &[2, 1, 4, 3]),
    (&[130, 200], &[200, 150]),
    (&[8, 64, 64], &[8, 64, 64]),
    (&[4, 128, 96], &[96, 80]),
    (&[3, 40, 96], &[1, 96, 300]),
    (&[6, 2, 512], &[512, 700]),
];

#[test]
fn matmul_f32_matches_the_interpreter() {
    for (i, &(sa, sb)) in MATMULS.iter().enumerate() {
        let a = Tensor::random(DType::F32, sa.to_vec(), 2 * i as u64);
        let b = Tensor::random(DType::F32, sb.to_vec(), 2 * i as u64 + 1);
        let want = interp(&Op::MatMul, &[&a, &b]);
        check_f32(&format!("matmul {sa:?}·{sb:?}"), &want, &mut |c, epilogue, par| {
            library::matmul_f32(f32s(&a), sa, f32s(&b), sb, c, epilogue, par).expect("matmul succeeds");
        });
    }
}

#[test]
fn matmul_f64_matches_the_interpreter() {
    for (i, &(sa, sb)) in MATMULS.iter().enumerate() {
        let a = Tensor::random(DType::F64, sa.to_vec(), 2 * i as u64);
        let b = Tensor::random(DType::F64, sb.to_vec(), 2 * i as u64 + 1);
        let want = interp(&Op::MatMul, &[&a, &b]).to_f64_vec();
        with_threads(|par| {
            let mut c = vec![f64::NAN; want.len()];
            let (av, bv) = (a.as_slice::<f64>().unwrap(), b.as_slice::<f64>().unwrap());
            library::matmul_f64(av, sa, bv, sb, &mut c, par).expect("matmul succeeds");
            close(&format!("f64 matmul {sa:?}·{sb:?} (threads {})", par.threads), &c, &want);
        });
    }
}

/// (x shape, w shape, strides, pads, dilations, groups, bias).
type ConvCase = (&'static [usize], &'static [usize], &'static [i64], &'static [i64], &'static [i64], i64, bool);

const CONVS: &[ConvCase] = &[
    // 1-D.
    (&[2, 3, 10], &[4, 3, 3], &[1], &[1, 1], &[1], 1, true),
    (&[1, 2, 11], &[3, 2, 3], &[2], &[0, 2], &[2], 1, false),
    (&[1, 1, 0], &[1, 1, 1], &[1], &[1, 1], &[1], 1, true),
    // 2-D general.
    (&[2, 3, 9, 8], &[5, 3, 3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], 1, true),
    (&[1, 4, 11, 10], &[6, 4, 3, 3], &[2, 2], &[1, 0, 2, 1], &[1, 1], 1, false),
    (&[1, 3, 12, 12], &[4, 3, 3, 3], &[1, 1], &[2, 2, 2, 2], &[2, 2], 1, true),
    (&[1, 3, 13, 11], &[2, 3, 7, 5], &[2, 3], &[3, 2, 3, 2], &[1, 1], 1, true),
    (&[1, 1, 2, 2], &[1, 1, 3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], 1, false),
    (&[2, 4, 7, 7], &[6, 2, 3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], 2, true),
    // Depthwise, with and without a channel multiplier.
    (&[2, 8, 10, 9], &[8, 1, 3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], 8, true),
    (&[1, 8, 11, 12], &[8, 1, 3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1], 8, false),
    (&[1, 4, 9, 9], &[4, 1, 5, 5], &[1, 2], &[2, 0, 1, 3], &[2, 1], 4, true),
    (&[1, 3, 6, 6], &[6, 1, 3, 3], &[1, 1], &[0, 0, 0, 0], &[1, 1], 3, false),
    // One input channel read by many output channels (a grayscale image into features), and per group.
    (&[2, 1, 16, 20], &[16, 1, 3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], 1, true),
    (&[1, 2, 9, 11], &[6, 1, 3, 3], &[1, 1], &[2, 1, 2, 1], &[2, 2], 2, false),
    // Depthwise rows of every block mix (32, 24, 16 and 8 columns, a ragged end, under 8), stride 1 (one flat
    // run per tap) and 2 (phase-split rows), dilated, asymmetric pads, kernel rows wholly in the padding, 1-D.
    (&[1, 2, 5, 61], &[2, 1, 3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], 2, true),
    (&[1, 2, 7, 57], &[4, 1, 3, 5], &[2, 2], &[1, 2, 1, 2], &[1, 1], 2, false),
    (&[1, 3, 9, 45], &[3, 1, 3, 3], &[1, 1], &[2, 2, 3, 1], &[2, 3], 3, true),
    (&[1, 2, 4, 5], &[2, 1, 3, 3], &[1, 3], &[3, 0, 3, 2], &[1, 1], 2, true),
    (&[2, 4, 40], &[4, 1, 5], &[1], &[2, 2], &[1], 4, true),
    (&[1, 2, 70], &[2, 1, 3], &[3], &[1, 4], &[2], 2, false),
    (&[1, 2, 6, 7], &[2, 1, 1, 7], &[1, 1], &[0, 0, 0, 0], &[1, 1], 2, true),
    // Pads far beyond the input: the general depthwise loop.
    (&[1, 2, 3, 3], &[2, 1, 3, 3], &[1, 1], &[200, 1, 200, 1], &[1, 1], 2, true),
    // Pointwise, and 1x1 kernels that are not.
    (&[2, 16, 5, 6], &[8, 16, 1, 1], &[1, 1], &[0, 0, 0, 0], &[1, 1], 1, true),
    (&[1, 8, 4, 4], &[4, 4, 1, 1], &[1, 1], &[0, 0, 0, 0], &[1, 1], 2, false),
    (&[1, 8, 7, 7], &[4, 8, 1, 1], &[2, 2], &[0, 0, 0, 0], &[1, 1], 1, true),
    (&[1, 8, 5, 5], &[4, 8, 1, 1], &[1, 1], &[1, 0, 0, 1], &[1, 1], 1, false),
    // 3-D.
    (&[1, 2, 5, 6, 4], &[3, 2, 3, 2, 2], &[1, 2, 1], &[1, 0, 1, 0, 1, 0], &[1, 1, 1], 1, true),
    (&[2, 3, 4, 5, 6], &[3, 1, 2, 3, 3], &[1, 1, 2], &[0, 1, 1, 1, 0, 1], &[2, 1, 1], 3, false),
    // Larger 3-D and 2-D windows: many output rows across the outer dims.
    (&[1, 4, 10, 12, 14], &[2, 4, 3, 3, 3], &[1, 1, 1], &[1, 1, 1, 1, 1, 1], &[1, 1, 1], 1, true),
    (&[1, 4, 30, 41], &[3, 4, 5, 5], &[2, 1], &[2, 1, 2, 3], &[1, 2], 1, false),
    // Column matrices past 2^18 elements: serially built in several bands of output rows (3-D: across outer dims).
    (&[1, 64, 30, 30], &[4, 64, 3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], 1, true),
    (&[1, 64, 61, 61], &[2, 64, 3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1], 1, false),
    (&[1, 32, 6, 10, 12], &[2, 32, 3, 3, 3], &[1, 1, 1], &[1, 1, 1, 1, 1, 1], &[1, 1, 1], 1, true),
    // Empty batch, no input channels.
    (&[0, 3, 5, 5], &[2, 3, 3, 3], &[1, 1], &[0, 0, 0, 0], &[1, 1], 1, true),
    (&[1, 0, 4, 4], &[2, 0, 3, 3], &[1, 1], &[0, 0, 0, 0], &[1, 1], 1, true),
    // Large enough for the parallel paths: one image, then a batch.
    (&[1, 16, 32, 32], &[32, 16, 3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], 1, true),
    (&[1, 64, 32, 32], &[64, 64, 1, 1], &[1, 1], &[0, 0, 0, 0], &[1, 1], 1, false),
    (&[1, 32, 40, 40], &[32, 1, 3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], 32, true),
    (&[4, 8, 16, 16], &[8, 8, 3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], 1, true),
];

fn conv_attrs(c: &ConvCase) -> Conv {
    Conv { strides: c.2.to_vec(), pads: c.3.to_vec(), dilations: c.4.to_vec(), groups: c.5 }
}

#[test]
fn conv_f32_matches_the_interpreter() {
    for (i, case) in CONVS.iter().enumerate() {
        let (xs, ws, with_bias) = (case.0, case.1, case.6);
        let attrs = conv_attrs(case);
        let x = Tensor::random(DType::F32, xs.to_vec(), 3 * i as u64);
        let w = Tensor::random(DType::F32, ws.to_vec(), 3 * i as u64 + 1);
        let b = Tensor::random(DType::F32, vec![ws[0]], 3 * i as u64 + 2);
        let inputs: Vec<&Tensor> = if with_bias { vec![&x, &w, &b] } else { vec![&x, &w] };
        let want = interp(&Op::Conv(attrs.clone()), &inputs);
        let ys = want.shape().to_vec();
        let bias = with_bias.then(|| f32s(&b));
        let name = format!("conv x{xs:?} w{ws:?} {attrs:?} bias {with_bias}");
        check_f32(&name, &want, &mut |y, epilogue, par| {
            library::conv_f32(f32s(&x), xs, f32s(&w), ws, bias, &attrs, y, &ys, epilogue, par).expect("conv succeeds");
        });
    }
}

/// (x shape, w shape, strides, pads, dilations, output_padding, groups, bias).
type ConvTransposeCase =
    (&'static [usize], &'static [usize], &'static [i64], &'static [i64], &'static [i64], &'static [i64], i64, bool);

const CONV_TRANSPOSES: &[ConvTransposeCase] = &[
    (&[1, 8, 5, 7], &[8, 4, 2, 2], &[2, 2], &[0, 0, 0, 0], &[1, 1], &[0, 0], 1, true),
    (&[2, 3, 4, 4], &[3, 2, 3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], &[0, 0], 1, false),
    (&[1, 4, 5, 6], &[4, 3, 3, 3], &[2, 3], &[1, 0, 2, 1], &[1, 2], &[1, 2], 2, true),
    (&[2, 6, 3, 5], &[6, 1, 4, 4], &[2, 2], &[1, 1, 1, 1], &[1, 1], &[0, 0], 6, true),
    (&[3, 2, 9], &[2, 3, 3], &[3], &[2, 1], &[2], &[1], 1, true),
    (&[1, 2, 3, 4, 2], &[2, 2, 2, 3, 2], &[1, 2, 2], &[0, 1, 0, 1, 0, 1], &[1, 1, 2], &[0, 1, 0], 1, false),
    (&[1, 3, 4, 4], &[3, 2, 5, 5], &[1, 1], &[4, 4, 4, 4], &[1, 1], &[0, 0], 1, true),
    // A column matrix larger than one band (rows 144 × 50 columns × 300 input rows).
    (&[1, 8, 300, 50], &[8, 16, 3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], &[0, 0], 1, true),
    (&[0, 3, 4, 4], &[3, 2, 2, 2], &[2, 2], &[0, 0, 0, 0], &[1, 1], &[0, 0], 1, true),
];

#[test]
fn conv_transpose_f32_matches_the_interpreter() {
    for (i, &(xs, ws, strides, pads, dilations, output_padding, groups, with_bias)) in
        CONV_TRANSPOSES.iter().enumerate()
    {
        let attrs = ConvTranspose {
            strides: strides.to_vec(),
            pads: pads.to_vec(),
            dilations: dilations.to_vec(),
            output_padding: output_padding.to_vec(),
            groups,
        };
        let seed = 3 * i as u64 + 500;
        let x = Tensor::random(DType::F32, xs.to_vec(), seed);
        let w = Tensor::random(DType::F32, ws.to_vec(), seed + 1);
        let b = Tensor::random(DType::F32, vec![ws[1] * groups as usize], seed + 2);
        let inputs: Vec<&Tensor> = if with_bias { vec![&x, &w, &b] } else { vec![&x, &w] };
        let want = interp(&Op::ConvTranspose(attrs.clone()), &inputs);
        let ys = want.shape().to_vec();
        let want = want.to_f64_vec();
        let bias = with_bias.then(|| f32s(&b));
        with_threads(|par| {
            let case = format!("conv_transpose x{xs:?} w{ws:?} {attrs:?} bias {with_bias} (threads {})", par.threads);
            let mut y = vec![f32::NAN; want.len()];
            library::conv_transpose_f32(f32s(&x), xs, f32s(&w), ws, bias, &attrs, &mut y, &ys, par)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            close(&case, &y.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(), &want);
        });
    }
}

#[test]
fn bad_conv_transpose_calls_are_errors() {
    let s = Par::SERIAL;
    let attrs = |strides: i64, pad: i64, groups: i64| ConvTranspose {
        strides: vec![strides],
        pads: vec![pad, pad],
        dilations: vec![1],
        output_padding: vec![0],
        groups,
    };
    let (x, w) = (vec![1.0f32; 10], vec![1.0f32; 6]);
    let mut y = [0.0f32; 32];
    let call = |a: &ConvTranspose, ys: &[usize], y: &mut [f32]| {
        library::conv_transpose_f32(&x, &[1, 2, 5], &w, &[2, 1, 3], None, a, y, ys, s)
    };
    expect_err("wrong result shape", call(&attrs(1, 0, 1), &[1, 1, 6], &mut y[..6]), "conv_transpose", "should be");
    expect_err("groups", call(&attrs(1, 0, 3), &[1, 3, 7], &mut y[..21]), "conv_transpose", "disagree");
    expect_err("zero groups", call(&attrs(1, 0, 0), &[1, 1, 7], &mut y[..7]), "conv_transpose", "disagree");
    expect_err("short y", call(&attrs(1, 0, 1), &[1, 1, 7], &mut y[..6]), "conv_transpose", "6");
    expect_err("pads eat the output", call(&attrs(1, 5, 1), &[1, 1, 0], &mut y[..0]), "conv_transpose", "no output");
    // A stride of 2^59 and pads of 2^60 cancel into an output of 3; every position stays checked arithmetic.
    let huge = attrs(1 << 59, 1 << 60, 1);
    let want = interp(
        &Op::ConvTranspose(huge.clone()),
        &[&Tensor::from_vec(vec![1, 2, 5], x.clone()).unwrap(), &Tensor::from_vec(vec![2, 1, 3], w.clone()).unwrap()],
    );
    let ys = want.shape().to_vec();
    let mut got = vec![f32::NAN; want.to_f64_vec().len()];
    library::conv_transpose_f32(&x, &[1, 2, 5], &w, &[2, 1, 3], None, &huge, &mut got, &ys, s)
        .expect("a huge stride cancelled by huge pads is a result");
    close("huge stride", &got.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(), &want.to_f64_vec());
}

/// (x shape, kind, kernel, strides, pads, dilations, ceil_mode, count_include_pad).
type PoolCase =
    (&'static [usize], PoolKind, &'static [i64], &'static [i64], &'static [i64], &'static [i64], bool, bool);

const POOLS: &[PoolCase] = &[
    (&[2, 3, 12, 12], PoolKind::Max, &[3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1], false, false),
    (&[1, 2, 7, 7], PoolKind::Avg, &[2, 2], &[2, 2], &[0, 0, 0, 0], &[1, 1], true, false),
    (&[1, 2, 7, 7], PoolKind::Avg, &[2, 2], &[2, 2], &[0, 0, 0, 0], &[1, 1], true, true),
    (&[1, 2, 7, 8], PoolKind::Avg, &[3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1], false, true),
    (&[1, 2, 7, 8], PoolKind::Avg, &[3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1], false, false),
    (&[1, 2, 8, 8], PoolKind::Avg, &[3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1], true, true),
    (&[1, 2, 9, 9], PoolKind::Max, &[2, 2], &[1, 1], &[0, 0, 0, 0], &[2, 2], false, false),
    (&[1, 2, 10, 9], PoolKind::Max, &[3, 2], &[2, 3], &[1, 0, 2, 1], &[2, 1], true, false),
    (&[1, 2, 4], PoolKind::Avg, &[3], &[2], &[1, 1], &[1], true, true),
    (&[1, 2, 4], PoolKind::Avg, &[3], &[2], &[1, 1], &[1], true, false),
    (&[1, 2, 4, 5, 6], PoolKind::Max, &[2, 2, 2], &[1, 2, 2], &[0, 0, 0, 0, 0, 0], &[1, 1, 1], false, false),
    (&[1, 2, 4, 5, 6], PoolKind::Avg, &[2, 3, 2], &[1, 2, 2], &[1, 0, 1, 0, 1, 1], &[1, 1, 1], true, true),
    (&[2, 5, 7, 7], PoolKind::Avg, &[7, 7], &[1, 1], &[0, 0, 0, 0], &[1, 1], false, false),
    (&[2, 5, 7, 7], PoolKind::Max, &[7, 7], &[1, 1], &[0, 0, 0, 0], &[1, 1], false, false),
    (&[2, 3, 37], PoolKind::Avg, &[37], &[1], &[0, 0], &[1], false, true),
    (&[1, 1, 5, 5], PoolKind::Avg, &[2, 2], &[1, 1], &[1, 0, 0, 1], &[1, 1], false, true),
    (&[0, 3, 4, 4], PoolKind::Max, &[2, 2], &[2, 2], &[0, 0, 0, 0], &[1, 1], false, false),
    (&[1, 2, 0], PoolKind::Max, &[3], &[1], &[2, 2], &[1], false, false),
    (&[1, 2, 0], PoolKind::Avg, &[3], &[1], &[2, 2], &[1], false, true),
    (&[1, 2, 0], PoolKind::Avg, &[3], &[1], &[2, 2], &[1], false, false),
    (&[2, 16, 32, 32], PoolKind::Max, &[3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1], false, false),
    // Stride 1 in 2-D (whole-plane passes): inception's 3×3 pools, dilated and asymmetric ones.
    (&[1, 3, 28, 28], PoolKind::Avg, &[3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], false, false),
    (&[1, 3, 28, 28], PoolKind::Avg, &[3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], false, true),
    (&[2, 3, 14, 13], PoolKind::Max, &[3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], false, false),
    (&[1, 2, 11, 9], PoolKind::Avg, &[3, 2], &[1, 1], &[2, 0, 1, 1], &[2, 3], true, false),
    (&[1, 2, 11, 9], PoolKind::Max, &[2, 3], &[1, 1], &[1, 2, 0, 1], &[3, 2], false, false),
    (&[2, 16, 32, 32], PoolKind::Avg, &[32, 32], &[1, 1], &[0, 0, 0, 0], &[1, 1], false, false),
];

fn pool_attrs(c: &PoolCase) -> Pool {
    Pool {
        kind: c.1,
        kernel: c.2.to_vec(),
        strides: c.3.to_vec(),
        pads: c.4.to_vec(),
        dilations: c.5.to_vec(),
        ceil_mode: c.6,
        count_include_pad: c.7,
    }
}

/// Pooling has no epilogue; `check_f32`'s epilogue pass applies it here after the call.
fn run_pool(x: &Tensor, attrs: &Pool, ys: &[usize], y: &mut [f32], epilogue: Option<Epilogue>, par: Par) {
    library::pool_f32(f32s(x), x.shape(), attrs, y, ys, par).expect("pool succeeds");
    if let Some(f) = epilogue {
        f(0, y);
    }
}

#[test]
fn pool_f32_matches_the_interpreter() {
    for (i, case) in POOLS.iter().enumerate() {
        let attrs = pool_attrs(case);
        let x = Tensor::random(DType::F32, case.0.to_vec(), i as u64);
        let want = interp(&Op::Pool(attrs.clone()), &[&x]);
        let ys = want.shape().to_vec();
        check_f32(&format!("pool x{:?} {attrs:?}", case.0), &want, &mut |y, epilogue, par| {
            run_pool(&x, &attrs, &ys, y, epilogue, par);
        });
    }
}

#[test]
fn max_pool_propagates_nan_like_the_interpreter() {
    let mut v = Tensor::random(DType::F32, vec![1, 2, 6, 6], 7).to_f64_vec();
    v[7] = f64::NAN;
    v[36 + 35] = f64::NAN;
    let x = Tensor::from_vec(vec![1, 2, 6, 6], v.iter().map(|&f| f as f32).collect()).unwrap();
    for kernel in [[2, 2], [6, 6]] {
        let attrs = Pool {
            kind: PoolKind::Max,
            kernel: kernel.to_vec(),
            strides: vec![2, 2],
            pads: vec![0; 4],
            dilations: vec![1, 1],
            ceil_mode: false,
            count_include_pad: false,
        };
        let want = interp(&Op::Pool(attrs.clone()), &[&x]);
        let ys = want.shape().to_vec();
        check_f32(&format!("max pool NaN {kernel:?}"), &want, &mut |y, epilogue, par| {
            run_pool(&x, &attrs, &ys, y, epilogue, par);
        });
    }
}

fn expect_err(case: &str, result: Result<(), LibraryError>, op: &str, needle: &str) {
    let err = result.expect_err(case).to_string();
    assert!(err.starts_with(op) && err.contains(needle), "{case}: error `{err}` should name {op} and say {needle}");
}

#[test]
fn bad_calls_are_errors_naming_the_op() {
    let s = Par::SERIAL;
    let (a, b, mut c) = (vec![0.0f32; 12], vec![0.0f32; 20], vec![0.0f32; 15]);
    expect_err("short a", library::matmul_f32(&a[..11], &[3, 4], &b, &[4, 5], &mut c, None, s), "matmul", "11");
    expect_err("k mismatch", library::matmul_f32(&a, &[3, 4], &b, &[5, 4], &mut c, None, s), "matmul", "contraction");
    expect_err("short c", library::matmul_f32(&a, &[3, 4], &b, &[4, 5], &mut c[..14], None, s), "matmul", "14");
    expect_err("rank 0", library::matmul_f32(&a[..1], &[], &b, &[4, 5], &mut c, None, s), "matmul", "rank");
    let (a, b, mut c) = (vec![0.0f32; 24], vec![0.0f32; 60], vec![0.0f32; 45]);
    expect_err(
        "batch mismatch",
        library::matmul_f32(&a, &[2, 3, 4], &b, &[3, 4, 5], &mut c, None, s),
        "matmul",
        "broadcast",
    );

    let conv = Conv { strides: vec![1, 1], pads: vec![0; 4], dilations: vec![1, 1], groups: 1 };
    let (x, w, mut y) = (vec![0.0f32; 2 * 5 * 5], vec![0.0f32; 3 * 2 * 3 * 3], vec![0.0f32; 3 * 3 * 3]);
    let (xs, ws, ys): (&[usize], &[usize], &[usize]) = (&[1, 2, 5, 5], &[3, 2, 3, 3], &[1, 3, 3, 3]);
    assert_eq!(library::conv_f32(&x, xs, &w, ws, None, &conv, &mut y, ys, None, s), Ok(()));
    expect_err("short x", library::conv_f32(&x[1..], xs, &w, ws, None, &conv, &mut y, ys, None, s), "conv", "x has");
    expect_err(
        "wrong y shape",
        library::conv_f32(&x, xs, &w, ws, None, &conv, &mut y, &[1, 3, 1, 9], None, s),
        "conv",
        "should be",
    );
    expect_err(
        "bias length",
        library::conv_f32(&x, xs, &w, ws, Some(&[1.0; 2]), &conv, &mut y, ys, None, s),
        "conv",
        "bias",
    );
    let grouped = Conv { groups: 2, ..conv.clone() };
    expect_err("groups", library::conv_f32(&x, xs, &w, ws, None, &grouped, &mut y, ys, None, s), "conv", "groups");
    let short_strides = Conv { strides: vec![1], ..conv.clone() };
    expect_err(
        "strides",
        library::conv_f32(&x, xs, &w, ws, None, &short_strides, &mut y, ys, None, s),
        "conv",
        "strides",
    );
    let too_big = [0.0f32; 3 * 2 * 7 * 7];
    expect_err(
        "kernel too large",
        library::conv_f32(&x, xs, &too_big, &[3, 2, 7, 7], None, &conv, &mut y, ys, None, s),
        "conv",
        "does not fit",
    );

    let pool = Pool {
        kind: PoolKind::Max,
        kernel: vec![2, 2],
        strides: vec![2, 2],
        pads: vec![0; 4],
        dilations: vec![1, 1],
        ceil_mode: false,
        count_include_pad: false,
    };
    let mut y = vec![0.0f32; 2 * 2 * 2];
    assert_eq!(library::pool_f32(&x, xs, &pool, &mut y, &[1, 2, 2, 2], s), Ok(()));
    expect_err("pool y shape", library::pool_f32(&x, xs, &pool, &mut y, &[1, 2, 4, 1], s), "pool", "should be");
    expect_err("pool x length", library::pool_f32(&x[1..], xs, &pool, &mut y, &[1, 2, 2, 2], s), "pool", "x has");
    let bad = Pool { kernel: vec![2], ..pool.clone() };
    expect_err("pool kernel", library::pool_f32(&x, xs, &bad, &mut y, &[1, 2, 2, 2], s), "pool", "kernel");
    let bad = Pool { strides: vec![0, 1], ..pool.clone() };
    expect_err("pool strides", library::pool_f32(&x, xs, &bad, &mut y, &[1, 2, 2, 2], s), "pool", "strides");
}

#[test]
fn unsupported_dtypes_are_named() {
    assert_eq!(library::supported(&Op::MatMul, DType::F32), Ok(()));
    assert_eq!(library::supported(&Op::MatMul, DType::F64), Ok(()));
    let err = library::supported(&Op::MatMul, DType::I32).unwrap_err();
    assert!(matches!(err, LibraryError::Unsupported { op: "matmul", .. }));
    assert!(err.to_string().contains("i32"), "{err}");
    let conv = Op::Conv(Conv { strides: vec![1], pads: vec![0, 0], dilations: vec![1], groups: 1 });
    assert_eq!(library::supported(&conv, DType::F32), Ok(()));
    let err = library::supported(&conv, DType::F16).unwrap_err().to_string();
    assert!(err.starts_with("conv") && err.contains("f16"), "{err}");
}

#[test]
fn extreme_attributes_are_results_or_errors() {
    let s = Par::SERIAL;
    let x = Tensor::random(DType::F32, vec![1, 1, 5], 1);
    let w = Tensor::random(DType::F32, vec![1, 1, 2], 2);
    let huge = Conv { strides: vec![i64::MAX], pads: vec![1, 0], dilations: vec![1], groups: 1 };
    let want = interp(&Op::Conv(huge.clone()), &[&x, &w]);
    check_f32("conv with stride i64::MAX", &want, &mut |y, epilogue, par| {
        library::conv_f32(f32s(&x), &[1, 1, 5], f32s(&w), &[1, 1, 2], None, &huge, y, &[1, 1, 1], epilogue, par)
            .expect("conv succeeds");
    });
    let wide = Conv { strides: vec![1], pads: vec![0, 0], dilations: vec![i64::MAX], groups: 1 };
    let mut y = [0.0f32; 1];
    expect_err(
        "dilation i64::MAX",
        library::conv_f32(f32s(&x), &[1, 1, 5], f32s(&w), &[1, 1, 2], None, &wide, &mut y, &[1, 1, 1], None, s),
        "conv",
        "does not fit",
    );
    let groups = Conv { strides: vec![1], pads: vec![0, 0], dilations: vec![1], groups: -1 };
    expect_err(
        "negative groups",
        library::conv_f32(
            f32s(&x),
            &[1, 1, 5],
            f32s(&w),
            &[1, 1, 2],
            None,
            &groups,
            &mut [0.0f32; 4],
            &[1, 1, 4],
            None,
            s,
        ),
        "conv",
        "groups",
    );
    let pool = Pool {
        kind: PoolKind::Avg,
        kernel: vec![2],
        strides: vec![i64::MAX],
        pads: vec![1, 1],
        dilations: vec![1],
        ceil_mode: true,
        count_include_pad: true,
    };
    let want = interp(&Op::Pool(pool.clone()), &[&x]);
    let ys = want.shape().to_vec();
    check_f32("pool with stride i64::MAX", &want, &mut |y, epilogue, par| run_pool(&x, &pool, &ys, y, epilogue, par));
    let pool = Pool { kernel: vec![i64::MAX], strides: vec![1], ..pool };
    expect_err(
        "pool kernel i64::MAX",
        library::pool_f32(f32s(&x), &[1, 1, 5], &pool, &mut y, &[1, 1, 1], s),
        "pool",
        "exceeds",
    );
}

/// (rows, k, n) for the packed product: every row count with several contraction lengths and widths, covering
/// row tails (rows not a multiple of the tile height), column tails (n not a multiple of the panel width) and
/// both parallel splits (by panels when rows are few, by rows when panels are).
const PACKED: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (3, 5, 15),
    (7, 5, 16),
    (32, 5, 17),
    (33, 1, 33),
    (128, 5, 768),
    (200, 1, 1000),
    (1, 256, 768),
    (3, 1000, 17),
    (7, 256, 1000),
    (32, 256, 16),
    (33, 1000, 33),
    (128, 256, 15),
    (200, 256, 33),
    (1, 1000, 1000),
    (33, 256, 768),
    (128, 1000, 17),
    (200, 5, 16),
    (3, 256, 1),
    (0, 5, 7),
    (4, 0, 7),
];

#[test]
fn matmul_packed_f32_matches_the_interpreter() {
    for (i, &(rows, k, n)) in PACKED.iter().enumerate() {
        let a = Tensor::random(DType::F32, vec![rows, k], 2 * i as u64);
        let b = Tensor::random(DType::F32, vec![k, n], 2 * i as u64 + 1);
        let want = interp(&Op::MatMul, &[&a, &b]);
        let packed = library::PackedB::pack(f32s(&b), k, n).expect("packing succeeds");
        assert_eq!((packed.k(), packed.n()), (k, n));
        assert_eq!(packed.bytes(), n.div_ceil(library::PANEL) * library::PANEL * k * 4, "padded to whole panels");
        check_f32(&format!("packed matmul [{rows}, {k}]·[{k}, {n}]"), &want, &mut |c, epilogue, par| {
            library::matmul_packed_f32(f32s(&a), rows, &packed, c, epilogue, par).expect("packed matmul succeeds");
        });
        // The same weight stored transposed (`[n, k]`, as ONNX's recurrent weights are) packs to the same panels.
        let bv = f32s(&b);
        let bt: Vec<f32> = (0..n * k).map(|i| bv[(i % k) * n + i / k]).collect();
        let from_t = library::PackedB::pack_transposed(&bt, k, n).expect("packing succeeds");
        assert_eq!(from_t.unpack(), packed.unpack(), "[{k}, {n}] packed from its transpose");
        assert!(n * k == 0 || library::PackedB::pack_transposed(&bt[1..], k, n).is_err());
    }
}

#[test]
fn packed_calls_with_wrong_lengths_are_errors() {
    let s = Par::SERIAL;
    let pack = |len: usize| library::PackedB::pack(&vec![0.0; len], 4, 5).map(|_| ());
    expect_err("short weight", pack(19), "matmul", "19");
    expect_err("long weight", pack(21), "matmul", "21");
    let b = library::PackedB::pack(&[0.0; 20], 4, 5).expect("packing succeeds");
    let (a, mut c) = (vec![0.0f32; 12], vec![0.0f32; 15]);
    expect_err("short a", library::matmul_packed_f32(&a[..11], 3, &b, &mut c, None, s), "matmul", "11");
    expect_err("rows mismatch", library::matmul_packed_f32(&a, 2, &b, &mut c, None, s), "matmul", "12");
    expect_err("short c", library::matmul_packed_f32(&a, 3, &b, &mut c[..14], None, s), "matmul", "14");
    expect_err("long c", library::matmul_packed_f32(&a, 3, &b, &mut [0.0; 16], None, s), "matmul", "16");
    expect_err("overflow", library::matmul_packed_f32(&a, usize::MAX, &b, &mut c, None, s), "matmul", "12");
}

/// An 8-bit tensor of `shape` whose bytes cover the whole range (a seeded xorshift), of dtype i8 or u8.
fn bytes8(dtype: DType, shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let bytes: Vec<u8> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect();
    Tensor::from_bytes(dtype, shape.to_vec(), &bytes).expect("sized")
}

fn int8(t: &Tensor) -> library::Int8<'_> {
    library::Int8 { bytes: t.as_bytes(), signed: t.dtype() == DType::I8 }
}

/// `matmul_integer` (plain and with the right operand packed) is the interpreter's, bit for bit: every 8-bit
/// type pairing, scalar and per-row/per-column zero points, batch broadcasting, odd contraction lengths, widths
/// that are not a multiple of the panel.
#[test]
fn matmul_integer_is_exact() {
    let shapes: &[(&[usize], &[usize])] = &[
        (&[1, 1], &[1, 1]),
        (&[3, 5], &[5, 7]),
        (&[6, 33], &[33, 17]),
        (&[2, 4, 9], &[9, 40]),
        (&[2, 1, 5, 8], &[3, 8, 18]),
        (&[0, 4], &[4, 3]),
        (&[9, 300], &[300, 31]),
        (&[5, 7], &[7, 48]),
        (&[3, 40000], &[40000, 2]),
        // Enough work for several workers: split over column blocks (many), over rows (one block, ragged rows).
        (&[17, 64], &[64, 300]),
        (&[70, 300], &[300, 20]),
    ];
    for (i, (sa, sb)) in shapes.iter().enumerate() {
        for (ta, tb) in [(DType::U8, DType::I8), (DType::I8, DType::I8), (DType::U8, DType::U8), (DType::I8, DType::U8)]
        {
            let (m, n) = (sa[sa.len() - 2], sb[sb.len() - 1]);
            for per in [false, true] {
                let seed = 16 * i as u64 + u64::from(per);
                let a = bytes8(ta, sa, seed);
                let b = bytes8(tb, sb, seed + 1);
                let (az_shape, bz_shape) =
                    (if per && m > 0 { vec![m] } else { vec![] }, if per { vec![n] } else { vec![] });
                let az = bytes8(ta, &az_shape, seed + 2);
                let bz = bytes8(tb, &bz_shape, seed + 3);
                let want = interp(&Op::MatMulInteger, &[&a, &b, &az, &bz]).to_i64_vec();
                let case = format!("{sa:?}·{sb:?} {ta}×{tb} per-row/column {per}");
                with_threads(|par| {
                    let mut out = vec![i32::MIN; want.len()];
                    library::matmul_integer(int8(&a), sa, int8(&b), sb, int8(&az), int8(&bz), &mut out, par)
                        .unwrap_or_else(|e| panic!("{case}: {e}"));
                    assert!(out.iter().map(|&v| i64::from(v)).eq(want.iter().copied()), "{case}");
                    if sb.len() == 2 {
                        // Packed for this CPU's best kernel (AVX-512 VNNI where present), and for the pair kernel.
                        for (how, packed) in [
                            ("packed", library::PackedInt8::pack(int8(&b), sb, int8(&bz))),
                            ("packed in pairs", library::PackedInt8::pack_pairs(int8(&b), sb, int8(&bz))),
                        ] {
                            let packed = packed.expect("packs");
                            let mut out = vec![i32::MIN; want.len()];
                            library::matmul_integer_packed(int8(&a), sa, int8(&az), &packed, &mut out, par)
                                .unwrap_or_else(|e| panic!("{case} ({how}): {e}"));
                            assert!(out.iter().map(|&v| i64::from(v)).eq(want.iter().copied()), "{case} ({how})");
                        }
                    }
                });
            }
        }
    }
}

/// `conv_integer` is the interpreter's, bit for bit: 1-D, 2-D and 3-D windows, strides, dilations, asymmetric
/// pads (which add the input's zero point), groups, per-channel weight zero points.
#[test]
fn conv_integer_is_exact() {
    let conv = |strides: &[i64], pads: &[i64], dilations: &[i64], groups: i64| Conv {
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: dilations.to_vec(),
        groups,
    };
    let cases: Vec<(Vec<usize>, Vec<usize>, Conv)> = vec![
        (vec![1, 3, 9], vec![4, 3, 3], conv(&[2], &[1, 2], &[1], 1)),
        (vec![2, 4, 7, 6], vec![6, 2, 3, 2], conv(&[1, 2], &[1, 0, 2, 1], &[2, 1], 2)),
        (vec![1, 3, 8, 8], vec![16, 3, 3, 3], conv(&[1, 1], &[1, 1, 1, 1], &[1, 1], 1)),
        (vec![1, 2, 4, 5, 3], vec![3, 2, 2, 2, 2], conv(&[1, 2, 1], &[0, 1, 1, 1, 0, 0], &[1, 1, 1], 1)),
        (vec![1, 8, 5, 5], vec![8, 1, 3, 3], conv(&[1, 1], &[1, 1, 1, 1], &[1, 1], 8)),
        // Eight or more output channels per group: the VNNI conv where the CPU has it. Groups with channel
        // slices, strides and dilations (a patch copied tap by tap), a 7×7 stride-2 stem (copied in runs), 1-D
        // and 3-D windows, outputs wholly in the padding, and one big enough to run on several workers.
        (vec![2, 8, 9, 7], vec![24, 4, 3, 3], conv(&[2, 1], &[1, 0, 0, 2], &[1, 2], 2)),
        (vec![1, 3, 23, 19], vec![16, 3, 7, 7], conv(&[2, 2], &[3, 3, 3, 3], &[1, 1], 1)),
        (vec![1, 5, 20], vec![9, 5, 4], conv(&[3], &[2, 0], &[1], 1)),
        (vec![1, 4, 5, 4, 6], vec![8, 4, 2, 3, 2], conv(&[1, 1, 2], &[1, 0, 1, 0, 2, 1], &[1, 1, 1], 1)),
        (vec![1, 2, 3, 3], vec![8, 2, 3, 3], conv(&[1, 1], &[4, 4, 4, 4], &[1, 1], 1)),
        (vec![1, 32, 20, 20], vec![40, 32, 3, 3], conv(&[1, 1], &[1, 1, 1, 1], &[1, 1], 1)),
        // Channels and positions not multiples of the 16×16 blocks the input is laid out channels-last in.
        (vec![2, 20, 9, 11], vec![16, 20, 3, 3], conv(&[1, 1], &[0, 1, 2, 1], &[1, 1], 1)),
        // One group with a dilation across rows and a stride along them (the 2-D fast path's row copies).
        (vec![1, 8, 9, 8], vec![16, 8, 3, 2], conv(&[1, 2], &[2, 0, 1, 1], &[2, 1], 1)),
    ];
    let mut packed_cases = 0;
    for (i, (xs, ws, attrs)) in cases.iter().enumerate() {
        for (tx, tw) in [(DType::U8, DType::I8), (DType::I8, DType::I8), (DType::U8, DType::U8)] {
            for per in [false, true] {
                let seed = 32 * i as u64 + u64::from(per);
                let x = bytes8(tx, xs, seed);
                let w = bytes8(tw, ws, seed + 1);
                let xz = bytes8(tx, &[], seed + 2);
                let wz = bytes8(tw, if per { &ws[..1] } else { &[] }, seed + 3);
                let want = interp(&Op::ConvInteger(attrs.clone()), &[&x, &w, &xz, &wz]);
                let case = format!("case {i} {tx}×{tw} per-channel {per}");
                let ys = want.shape().to_vec();
                let want = want.to_i64_vec();
                with_threads(|par| {
                    let mut out = vec![i32::MIN; want.len()];
                    library::conv_integer(int8(&x), xs, int8(&w), ws, int8(&xz), int8(&wz), attrs, &mut out, &ys, par)
                        .unwrap_or_else(|e| panic!("{case}: {e}"));
                    assert!(out.iter().map(|&v| i64::from(v)).eq(want.iter().copied()), "{case}");
                });
                let groups = attrs.groups as usize;
                let packed = library::PackedConvInt8::pack(int8(&w), ws, int8(&wz), groups).expect("packs");
                if let Some(packed) = packed {
                    packed_cases += 1;
                    with_threads(|par| {
                        let mut out = vec![i32::MIN; want.len()];
                        library::conv_integer_packed(int8(&x), xs, int8(&xz), &packed, attrs, &mut out, &ys, par)
                            .unwrap_or_else(|e| panic!("{case} (packed): {e}"));
                        assert!(out.iter().map(|&v| i64::from(v)).eq(want.iter().copied()), "{case} (packed)");
                    });
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512vnni") {
        let wide = cases.iter().filter(|(_, ws, a)| ws[0] / a.groups as usize >= 8).count();
        assert_eq!(packed_cases, wide * 3 * 2, "every case with eight or more channels per group runs the VNNI conv");
    } else {
        println!("conv_integer_is_exact: no AVX-512 VNNI here, the packed VNNI conv is not exercised");
    }
}

/// LSTM and GRU: every direction, clip, input-forget coupling and GRU reset variant, batches of several rows and
/// empty sequences, with weights packed beforehand (as the runtime does at load) and without, against the
/// interpreter (all three results).
#[test]
fn recurrent_routines_match_the_interpreter() {
    use kiln_ir::op::{Gru, Lstm, RnnDirection};
    let cases: &[(usize, usize, usize, i64)] = &[(5, 3, 4, 6), (1, 1, 7, 3), (0, 2, 3, 2), (9, 2, 16, 32)];
    let mut seed = 900;
    for &(seq, batch, input, hidden) in cases {
        for direction in [RnnDirection::Forward, RnnDirection::Reverse, RnnDirection::Bidirectional] {
            let dirs = if direction == RnnDirection::Bidirectional { 2 } else { 1 };
            let h = hidden as usize;
            let mut t = |shape: Vec<usize>| {
                seed += 1;
                Tensor::random(DType::F32, shape, seed)
            };
            let (x, h0, c0) = (t(vec![seq, batch, input]), t(vec![dirs, batch, h]), t(vec![dirs, batch, h]));
            let shape = library::RnnShape::new(&[seq, batch, input], hidden, direction).unwrap();
            for (clip, coupled) in [(f64::INFINITY, false), (0.5, true)] {
                let (w, r, b) = (t(vec![dirs, 4 * h, input]), t(vec![dirs, 4 * h, h]), t(vec![dirs, 8 * h]));
                let l = Lstm { hidden_size: hidden, direction, clip, input_forget: coupled };
                let want = kiln_ir::interp::eval_op(&Op::Lstm(l.clone()), &[&x, &w, &r, &b, &h0, &c0]).unwrap();
                let packed = library::RnnPacked::pack(f32s(&w), f32s(&r), 4, h, input, false).unwrap();
                with_threads_and_packing(&packed, |par, packed| {
                    let mut got: Vec<Vec<f32>> = want.iter().map(|t| vec![f32::NAN; t.len()]).collect();
                    let [y, yh, yc] = &mut got[..] else { unreachable!("three results") };
                    library::lstm_f32(
                        &l,
                        &shape,
                        packed,
                        f32s(&x),
                        f32s(&w),
                        f32s(&r),
                        f32s(&b),
                        f32s(&h0),
                        f32s(&c0),
                        y,
                        yh,
                        yc,
                        par,
                    )
                    .expect("lstm runs");
                    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                        let g: Vec<f64> = g.iter().map(|&v| v as f64).collect();
                        close(
                            &format!("lstm {seq}x{batch}x{input} h{hidden} {direction:?} clip {clip} result {k}"),
                            &g,
                            &w.to_f64_vec(),
                        );
                    }
                });
            }
            for (clip, linear_before_reset) in [(f64::INFINITY, false), (0.7, true)] {
                let (w, r, b) = (t(vec![dirs, 3 * h, input]), t(vec![dirs, 3 * h, h]), t(vec![dirs, 6 * h]));
                let g = Gru { hidden_size: hidden, direction, clip, linear_before_reset };
                let want = kiln_ir::interp::eval_op(&Op::Gru(g.clone()), &[&x, &w, &r, &b, &h0]).unwrap();
                let packed = library::RnnPacked::pack(f32s(&w), f32s(&r), 3, h, input, true).unwrap();
                with_threads_and_packing(&packed, |par, packed| {
                    let mut got: Vec<Vec<f32>> = want.iter().map(|t| vec![f32::NAN; t.len()]).collect();
                    let [y, yh] = &mut got[..] else { unreachable!("two results") };
                    let (x, w, r, b, h0) = (f32s(&x), f32s(&w), f32s(&r), f32s(&b), f32s(&h0));
                    library::gru_f32(&g, &shape, packed, x, w, r, b, h0, y, yh, par).expect("gru runs");
                    for (k, (got, w)) in got.iter().zip(&want).enumerate() {
                        let got: Vec<f64> = got.iter().map(|&v| v as f64).collect();
                        let case = format!(
                            "gru {seq}x{batch}x{input} h{hidden} {direction:?} lbr {linear_before_reset} result {k}"
                        );
                        close(&case, &got, &w.to_f64_vec());
                    }
                });
            }
        }
    }
    // Operands of the wrong length are an error, not a read out of bounds.
    let shape = library::RnnShape::new(&[2, 1, 3], 2, RnnDirection::Forward).unwrap();
    let l = Lstm { hidden_size: 2, direction: RnnDirection::Forward, clip: f64::INFINITY, input_forget: false };
    let run = |packed, x: &[f32], w: &[f32]| {
        let (mut y, mut yh, mut yc) = (vec![0.0; 4], vec![0.0; 2], vec![0.0; 2]);
        let (r, b, h0, c0) = (&[0.1; 16], &[0.0; 16], &[0.0; 2], &[0.0; 2]);
        library::lstm_f32(&l, &shape, packed, x, w, r, b, h0, c0, &mut y, &mut yh, &mut yc, Par::SERIAL)
            .map(|()| (y, yh, yc))
    };
    let err = run(None, &[0.0; 5], &[0.0; 24]);
    assert!(matches!(err, Err(LibraryError::Shape { .. })), "{err:?}");
    // Weights that do not fit the extents are refused when packed; packed weights for other extents are not used.
    let bad = library::RnnPacked::pack(&[0.0; 23], &[0.0; 16], 4, 2, 3, false);
    assert!(matches!(bad, Err(LibraryError::Shape { .. })), "{:?}", bad.err());
    let other = library::RnnPacked::pack(&[0.0; 32], &[0.0; 16], 4, 2, 4, false).unwrap();
    let (x, w): ([f32; 6], Vec<f32>) = ([0.5, -0.25, 1.0, 0.0, 0.75, -1.0], (0..24).map(|i| i as f32 * 0.01).collect());
    let ignored = run(Some(&other), &x, &w).expect("lstm runs");
    assert_eq!(ignored, run(None, &x, &w).expect("lstm runs"), "packed weights of another input width are ignored");
}

/// Runs `f` as [`with_threads`] does, once reading the weights in place and once through `packed`.
fn with_threads_and_packing(packed: &library::RnnPacked, f: impl Fn(Par, Option<&library::RnnPacked>) + Sync) {
    for p in [None, Some(packed)] {
        with_threads(|par| f(par, p));
    }
}

/// `top_k` on f32: every axis, k from 0 to the extent, both directions, NaN, ties and signed zeros — exactly the
/// interpreter's values and indices.
#[test]
fn top_k_matches_the_interpreter_exactly() {
    use kiln_ir::op::TopK;
    let mut v: Vec<f32> = (0..4 * 7 * 3).map(|i| ((i * 37 % 13) as f32 - 6.0) * 0.5).collect();
    v[5] = f32::NAN;
    v[20] = -0.0;
    v[21] = 0.0;
    v[40] = f32::NAN;
    v[41] = f32::INFINITY;
    let x = Tensor::from_vec(vec![4, 7, 3], v).unwrap();
    for axis in [0i64, 1, 2, -1] {
        let n = x.shape()[usize::try_from(axis.rem_euclid(3)).unwrap()];
        for k in 0..=n as u64 {
            for largest in [true, false] {
                let t = TopK { axis, k: kiln_ir::Dim::Static(k), largest, sorted: true };
                let want = kiln_ir::interp::eval_op(&Op::TopK(t.clone()), &[&x]).unwrap();
                let mut values = vec![0.0f32; want[0].len()];
                let mut indices = vec![0i64; want[1].len()];
                library::top_k_f32(&t, f32s(&x), x.shape(), &mut values, &mut indices).unwrap();
                let case = format!("axis {axis} k {k} largest {largest}");
                let bits =
                    |v: &[f32]| v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect::<Vec<_>>();
                assert_eq!(bits(&values), bits(want[0].as_slice::<f32>().unwrap()), "{case}");
                assert_eq!(indices, want[1].as_slice::<i64>().unwrap(), "{case}");
            }
        }
    }
    let t = TopK { axis: 0, k: kiln_ir::Dim::Static(9), largest: true, sorted: true };
    let err = library::top_k_f32(&t, &[1.0; 4], &[4], &mut [0.0; 9], &mut [0; 9]);
    assert!(matches!(err, Err(LibraryError::Shape { .. })), "{err:?}");
    // A symbolic k is read off the results' length, and still checked against the axis.
    let t = TopK { axis: 0, k: kiln_ir::Dim::sym("tk"), largest: true, sorted: true };
    let (mut values, mut indices) = ([0.0f32; 2], [0i64; 2]);
    library::top_k_f32(&t, &[1.0, 4.0, 2.0, 3.0], &[4], &mut values, &mut indices).unwrap();
    assert_eq!((values, indices), ([4.0, 3.0], [1, 3]));
    let err = library::top_k_f32(&t, &[1.0; 4], &[4], &mut [0.0; 8], &mut [0; 8]);
    assert!(matches!(err, Err(LibraryError::Shape { .. })), "{err:?}");
}
