//! Reference semantics of the neural-net ops: `conv`, `conv_transpose`, `pool`, `softmax`, `log_softmax`,
//! `layer_norm`, `batch_norm`, `gelu`, `resize`, `grid_sample`, `roi_align`, `lstm` and `gru`.
//!
//! Every op here follows its ONNX namesake (see the attribute docs in `op.rs`). The code is the oracle other
//! backends are tested against, so it is written as plain loops over the definitions, with only the hoisting
//! needed to keep real models (resnet18) to seconds.
//!
//! Invariants:
//! - [`eval`] first runs the op's type rule ([`crate::infer::infer`]) on the operands' concrete types, so every
//!   check the type rules make holds below, and result shapes come from the rules (the interpreter and the type
//!   rules cannot disagree on extents). What the rules cannot see (resize scales, the LSTM clip) is checked here;
//!   a bad operand is an `Err`, never a panic.
//! - Arithmetic runs in [`Real`]: `f64` for f64 operands, `f32` for f32, f16 and bf16, which are rounded to their
//!   own dtype once, at the end. Max pooling and nearest resize only select elements, so they work on every
//!   dtype the type rules admit, bit-exactly.

mod conv;
mod grid_sample;
mod norm;
mod pool;
mod resize;
mod roi_align;

pub use grid_sample::grid_sample_f32;
pub use roi_align::roi_align_f32;

pub use resize::{filter_taps, linear_taps, nearest_taps, outside_taps};
mod rnn;

use super::elementwise::real_max;
use super::num::Real;
use crate::infer::infer;
use crate::op::{Gelu, GeluApprox, Op, Softmax};
use crate::tensor::{Data, Tensor};
use crate::types::{DType, TensorType, normalize_axis};

/// Evaluates one neural-net op on concrete operands; results come in the op table's order.
pub(super) fn eval(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let types: Vec<TensorType> = inputs.iter().map(|t| t.tensor_type()).collect();
    let result_types = infer(op, &types)?;
    let shapes = result_types
        .iter()
        .map(|t| t.shape.as_static().ok_or_else(|| format!("result shape {} is not static", t.shape)))
        .collect::<Result<Vec<_>, _>>()?;
    let x = *inputs.first().ok_or_else(|| format!("`{}` is not a neural-net op", op.mnemonic()))?;
    let first = shapes.first().ok_or("the type rule gave no result")?;
    let one = |t: Result<Tensor, String>| t.map(|t| vec![t]);
    match op {
        Op::Conv(c) => one(conv::conv(c, inputs, first)),
        Op::ConvTranspose(c) => one(conv::conv_transpose(c, inputs, first)),
        Op::Pool(p) => one(pool::pool(p, x, first)),
        Op::Softmax(s) => one(softmax(s, x, SoftmaxKind::Plain)),
        Op::LogSoftmax(s) => one(softmax(s, x, SoftmaxKind::Log)),
        Op::LayerNorm(l) => one(norm::layer_norm(l, inputs)),
        Op::BatchNorm(b) => one(norm::batch_norm(b, inputs)),
        Op::Gelu(g) => one(gelu(g, x)),
        Op::Resize(r) => one(resize::resize(r, x, first)),
        Op::GridSample(g) => one(grid_sample::grid_sample(g, x, inputs[1], first)),
        Op::RoiAlign(a) => one(roi_align::roi_align(a, inputs, first)),
        Op::Lstm(l) => rnn::lstm(l, inputs),
        Op::Gru(g) => rnn::gru(g, inputs),
        other => Err(format!("`{}` is not a neural-net op", other.mnemonic())),
    }
}

/// Runs `$body` with the type alias `$r` bound to the [`Real`] that a float dtype computes in; any other dtype is
/// an error.
macro_rules! with_real {
    ($dtype:expr, $r:ident => $body:expr) => {
        match $dtype {
            $crate::types::DType::F64 => {
                type $r = f64;
                $body
            }
            $crate::types::DType::F32 | $crate::types::DType::F16 | $crate::types::DType::BF16 => {
                type $r = f32;
                $body
            }
            other => Err(format!("needs a float type, got {other}")),
        }
    };
}
use with_real;

/// The elements of a float tensor in the compute type (exact: f16, bf16 and f32 all widen into f32).
pub(super) fn load<F: Real>(t: &Tensor) -> Vec<F> {
    t.to_f64_vec().into_iter().map(F::of_f64).collect()
}

/// A tensor of `dtype` from computed values, each rounded once.
pub(super) fn store<F: Real + Into<f64>>(dtype: DType, shape: &[usize], v: Vec<F>) -> Result<Tensor, String> {
    let wide = v.into_iter().map(Into::<f64>::into);
    // f16 and bf16 compute in f32, so each value is exactly an f32: round from there, not through `half`'s f64
    // conversions (which are not correctly rounded for every f64).
    let data = match dtype {
        DType::F16 => Data::F16(wide.map(|x| half::f16::from_f32(x as f32)).collect()),
        DType::BF16 => Data::BF16(wide.map(|x| half::bf16::from_f32(x as f32)).collect()),
        _ => Data::from_f64_iter(dtype, wide),
    };
    Tensor::new(shape.to_vec(), data).map_err(|e| e.to_string())
}

/// An attribute list that the type rules have checked to be non-negative, as `usize`s.
pub(super) fn to_usize(v: &[i64]) -> Vec<usize> {
    v.iter().map(|&x| x.max(0) as usize).collect()
}

/// Which of the two softmax ops.
#[derive(Copy, Clone, PartialEq, Eq)]
enum SoftmaxKind {
    /// `exp(x - max) / sum`.
    Plain,
    /// `x - max - log(sum)`.
    Log,
}

/// Softmax or log-softmax along one axis, with the maximum subtracted first so large inputs do not overflow.
/// A NaN anywhere on a row makes the whole row NaN.
fn softmax(s: &Softmax, x: &Tensor, kind: SoftmaxKind) -> Result<Tensor, String> {
    with_real!(x.dtype(), F => {
        // A scalar is a row of one.
        let shape = if x.shape().is_empty() { vec![1] } else { x.shape().to_vec() };
        let axis = normalize_axis(s.axis, shape.len())?;
        let outer: usize = shape[..axis].iter().product();
        let len = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let v = load::<F>(x);
        let mut y = vec![F::ZERO; v.len()];
        for o in 0..outer {
            for i in 0..inner {
                let at = |k: usize| (o * len + k) * inner + i;
                let mut max = F::of_f64(f64::NEG_INFINITY);
                for k in 0..len {
                    max = real_max(max, v[at(k)]);
                }
                let mut sum = F::ZERO;
                for k in 0..len {
                    sum += (v[at(k)] - max).exp();
                }
                for k in 0..len {
                    let d = v[at(k)] - max;
                    y[at(k)] = match kind {
                        SoftmaxKind::Plain => d.exp() / sum,
                        SoftmaxKind::Log => d - sum.ln(),
                    };
                }
            }
        }
        store(x.dtype(), x.shape(), y)
    })
}

/// GELU: exact `x/2 * (1 + erf(x/√2))` — computed as `erf(x * (1/√2))`, as PyTorch and ONNX Runtime do (at most
/// one rounding apart in erf's argument, and no division) — or the tanh approximation.
fn gelu(g: &Gelu, x: &Tensor) -> Result<Tensor, String> {
    with_real!(x.dtype(), F => {
        let half = F::of_f64(0.5);
        let y = load::<F>(x)
            .into_iter()
            .map(|v| match g.approximate {
                GeluApprox::None => half * v * (F::ONE + Real::erf(v * F::of_f64(std::f64::consts::FRAC_1_SQRT_2))),
                GeluApprox::Tanh => {
                    let c = F::of_f64((2.0 / std::f64::consts::PI).sqrt());
                    let inner = c * (v + F::of_f64(0.044715) * v * v * v);
                    half * v * (F::ONE + inner.tanh())
                }
            })
            .collect();
        store(x.dtype(), x.shape(), y)
    })
}

/// Helpers for the data-driven tests of every op in this module.
#[cfg(test)]
pub(super) mod testing {
    use crate::op::Op;
    use crate::tensor::{Data, Tensor};
    use crate::types::DType;

    /// A tensor of `dtype` from f64 values.
    pub fn tensor(dtype: DType, shape: &[usize], v: &[f64]) -> Tensor {
        Tensor::new(shape.to_vec(), Data::from_f64_iter(dtype, v.iter().copied())).expect("test tensor")
    }

    /// An f32 tensor.
    pub fn f32s(shape: &[usize], v: &[f64]) -> Tensor {
        tensor(DType::F32, shape, v)
    }

    /// An f64 tensor.
    pub fn f64s(shape: &[usize], v: &[f64]) -> Tensor {
        tensor(DType::F64, shape, v)
    }

    /// `count` ramp values `1, 2, 3, …`.
    pub fn ramp(count: usize) -> Vec<f64> {
        (1..=count).map(|i| i as f64).collect()
    }

    /// Runs `op`, failing the test with the case name on an error.
    pub fn run(case: &str, op: &Op, inputs: &[Tensor]) -> Vec<Tensor> {
        let refs: Vec<&Tensor> = inputs.iter().collect();
        super::eval(op, &refs).unwrap_or_else(|e| panic!("{case}: {e}"))
    }

    /// Asserts dtype, shape and values within `tol` (absolute, or relative above 1); a NaN expects a NaN.
    pub fn expect(case: &str, got: &Tensor, dtype: DType, shape: &[usize], want: &[f64], tol: f64) {
        assert_eq!(got.dtype(), dtype, "{case}: dtype");
        assert_eq!(got.shape(), shape, "{case}: shape");
        let vals = got.to_f64_vec();
        assert_eq!(vals.len(), want.len(), "{case}: element count");
        for (i, (&g, &w)) in vals.iter().zip(want).enumerate() {
            let ok = if w.is_nan() { g.is_nan() } else { g == w || (g - w).abs() <= tol * w.abs().max(1.0) };
            assert!(ok, "{case}: element {i} is {g}, want {w} (all: {vals:?})");
        }
    }

    /// One case: an op on f-typed operands and its expected (shape, values) results.
    pub struct Case {
        /// Shown on failure.
        pub name: &'static str,
        /// The op.
        pub op: Op,
        /// Operands.
        pub inputs: Vec<Tensor>,
        /// Expected results, in order.
        pub want: Vec<(Vec<usize>, Vec<f64>)>,
    }

    /// Runs every case; results must keep the first operand's dtype and match within `tol`.
    pub fn check(cases: &[Case], tol: f64) {
        for c in cases {
            let got = run(c.name, &c.op, &c.inputs);
            assert_eq!(got.len(), c.want.len(), "{}: result count", c.name);
            for (i, (g, (shape, vals))) in got.iter().zip(&c.want).enumerate() {
                let name = format!("{} (result {i})", c.name);
                expect(&name, g, c.inputs[0].dtype(), shape, vals, tol);
            }
        }
    }

    /// Asserts that `op` on `inputs` is an error whose message contains `needle`.
    pub fn expect_err(case: &str, op: &Op, inputs: &[Tensor], needle: &str) {
        let refs: Vec<&Tensor> = inputs.iter().collect();
        match super::eval(op, &refs) {
            Ok(r) => panic!("{case}: expected an error, got {r:?}"),
            Err(e) => assert!(e.contains(needle), "{case}: error `{e}` does not mention `{needle}`"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use crate::op::{BatchNorm, Conv};

    fn softmax_op(axis: i64) -> Op {
        Op::Softmax(Softmax { axis })
    }

    fn log_softmax_op(axis: i64) -> Op {
        Op::LogSoftmax(Softmax { axis })
    }

    fn gelu_op(approximate: GeluApprox) -> Op {
        Op::Gelu(Gelu { approximate })
    }

    #[test]
    fn softmax_matches_hand_values() {
        let nan = f64::NAN;
        check(
            &[
                Case {
                    name: "softmax [1,2,3]",
                    op: softmax_op(-1),
                    inputs: vec![f32s(&[3], &[1.0, 2.0, 3.0])],
                    want: vec![(vec![3], vec![0.09003057317038046, 0.24472847105479767, 0.6652409557748219])],
                },
                Case {
                    name: "log_softmax [1,2,3]",
                    op: log_softmax_op(0),
                    inputs: vec![f32s(&[3], &[1.0, 2.0, 3.0])],
                    want: vec![(vec![3], vec![-2.4076059644443806, -1.4076059644443804, -0.4076059644443804])],
                },
                Case {
                    name: "softmax is stable for large inputs",
                    op: softmax_op(1),
                    inputs: vec![f32s(&[1, 2], &[1000.0, 1000.0])],
                    want: vec![(vec![1, 2], vec![0.5, 0.5])],
                },
                Case {
                    name: "log_softmax is stable for large inputs",
                    op: log_softmax_op(1),
                    inputs: vec![f64s(&[1, 2], &[-1000.0, -1000.0])],
                    want: vec![(vec![1, 2], vec![-std::f64::consts::LN_2, -std::f64::consts::LN_2])],
                },
                Case {
                    name: "softmax along axis 0 of a 2x2",
                    op: softmax_op(0),
                    inputs: vec![f64s(&[2, 2], &[1.0, 1.0, 2.0, 3.0])],
                    // Columns [1,2] and [1,3]: 1/(1+e), 1/(1+e²) and their complements.
                    want: vec![(
                        vec![2, 2],
                        vec![0.2689414213699951, 0.11920292202211757, 0.7310585786300049, 0.8807970779778824],
                    )],
                },
                Case {
                    name: "softmax of a scalar",
                    op: softmax_op(0),
                    inputs: vec![f32s(&[], &[7.0])],
                    want: vec![(vec![], vec![1.0])],
                },
                Case {
                    name: "a NaN poisons only its own row",
                    op: softmax_op(1),
                    inputs: vec![f32s(&[2, 3], &[1.0, nan, 2.0, 0.0, 0.0, 0.0])],
                    want: vec![(vec![2, 3], vec![nan, nan, nan, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0])],
                },
                Case {
                    name: "log_softmax propagates NaN",
                    op: log_softmax_op(0),
                    inputs: vec![f32s(&[2], &[nan, 1.0])],
                    want: vec![(vec![2], vec![nan, nan])],
                },
                Case {
                    name: "softmax of an empty batch",
                    op: softmax_op(1),
                    inputs: vec![f32s(&[0, 3], &[])],
                    want: vec![(vec![0, 3], vec![])],
                },
                Case {
                    name: "softmax over an empty axis",
                    op: softmax_op(1),
                    inputs: vec![f32s(&[2, 0], &[])],
                    want: vec![(vec![2, 0], vec![])],
                },
            ],
            1e-6,
        );
    }

    #[test]
    fn softmax_rows_sum_to_one() {
        for (dtype, shape, axis) in
            [(DType::F32, vec![3, 5], 1), (DType::F64, vec![4, 2, 3], -2), (DType::F16, vec![6, 7], 0)]
        {
            let x = Tensor::random(dtype, shape.clone(), 11).to_f64_vec();
            let x = tensor(dtype, &shape, &x.iter().map(|v| v * 8.0).collect::<Vec<_>>());
            let y = run("random softmax", &softmax_op(axis), std::slice::from_ref(&x));
            let axis = normalize_axis(axis, shape.len()).unwrap();
            let (len, inner) = (shape[axis], shape[axis + 1..].iter().product::<usize>());
            let outer: usize = shape[..axis].iter().product();
            let v = y[0].to_f64_vec();
            let tol = if dtype == DType::F16 { 1e-2 } else { 1e-6 };
            for o in 0..outer {
                for i in 0..inner {
                    let sum: f64 = (0..len).map(|k| v[(o * len + k) * inner + i]).sum();
                    assert!((sum - 1.0).abs() < tol, "{dtype} row ({o},{i}) sums to {sum}");
                }
            }
            assert_eq!(y[0].dtype(), dtype);
        }
    }

    #[test]
    fn gelu_matches_known_values() {
        let xs = [-3.0, -1.0, 0.0, 0.5, 1.0, 2.0];
        // x·Φ(x) and the tanh form, from the closed forms evaluated in double precision.
        let exact = [
            -0.00404969409489031,
            -0.15865525393145707,
            0.0,
            0.34573123063700656,
            0.8413447460685429,
            1.9544997361036416,
        ];
        let tanh = [
            -0.0036373920817729943,
            -0.15880800939172324,
            0.0,
            0.34571400982514394,
            0.8411919906082768,
            1.954597694087775,
        ];
        check(
            &[
                Case {
                    name: "gelu exact f64",
                    op: gelu_op(GeluApprox::None),
                    inputs: vec![f64s(&[6], &xs)],
                    want: vec![(vec![6], exact.to_vec())],
                },
                Case {
                    name: "gelu tanh f64",
                    op: gelu_op(GeluApprox::Tanh),
                    inputs: vec![f64s(&[6], &xs)],
                    want: vec![(vec![6], tanh.to_vec())],
                },
            ],
            1e-14,
        );
        check(
            &[Case {
                name: "gelu exact f32",
                op: gelu_op(GeluApprox::None),
                inputs: vec![f32s(&[2, 3], &xs)],
                want: vec![(vec![2, 3], exact.to_vec())],
            }],
            1e-6,
        );
        let y = run("gelu bf16", &gelu_op(GeluApprox::Tanh), &[tensor(DType::BF16, &[6], &xs)]);
        expect("gelu bf16", &y[0], DType::BF16, &[6], &tanh, 1e-2);
        let nan = run("gelu nan", &gelu_op(GeluApprox::None), &[f32s(&[1], &[f64::NAN])]);
        assert!(nan[0].to_f64_vec()[0].is_nan());
    }

    #[test]
    fn bad_operands_are_errors() {
        expect_err("softmax on ints", &softmax_op(0), &[tensor(DType::I32, &[2], &[1.0, 2.0])], "float");
        expect_err("softmax axis out of range", &softmax_op(2), &[f32s(&[2], &[1.0, 2.0])], "axis");
        expect_err("not an nn op", &Op::MatMul, &[f32s(&[1, 1], &[1.0]), f32s(&[1, 1], &[1.0])], "neural-net");
        expect_err(
            "batch_norm with a short mean",
            &Op::BatchNorm(BatchNorm { epsilon: 0.0 }),
            &[f32s(&[1, 2], &[1.0, 2.0]), f32s(&[2], &[1.0; 2]), f32s(&[2], &[0.0; 2]), f32s(&[1], &[0.0]), {
                f32s(&[2], &[1.0; 2])
            }],
            "operand 3",
        );
        expect_err(
            "conv on integers",
            &Op::Conv(Conv { strides: vec![1], pads: vec![0, 0], dilations: vec![1], groups: 1 }),
            &[tensor(DType::I32, &[1, 1, 2], &[1.0, 2.0]), tensor(DType::I32, &[1, 1, 1], &[1.0])],
            "float",
        );
    }
}
