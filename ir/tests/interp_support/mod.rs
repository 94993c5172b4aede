//! Helpers for the interpreter's data-driven tests: terse tensor constructors and `check` functions that run
//! one op through [`eval_op`] and compare with hand-computed results.

#![allow(dead_code)]

use half::{bf16, f16};
use kiln_ir::interp::eval_op;
use kiln_ir::{Element, Op, Tensor};

/// A tensor of shape `shape` from typed values.
pub fn t<T: Element>(shape: &[usize], v: &[T]) -> Tensor {
    Tensor::from_vec(shape.to_vec(), v.to_vec()).expect("test tensor shape matches its values")
}

/// An f32 tensor.
pub fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    t(shape, v)
}

/// An f64 tensor.
pub fn f64s(shape: &[usize], v: &[f64]) -> Tensor {
    t(shape, v)
}

/// An f16 tensor from f32 values (each must be exact in f16).
pub fn f16s(shape: &[usize], v: &[f32]) -> Tensor {
    t(shape, &v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>())
}

/// A bf16 tensor from f32 values (each must be exact in bf16).
pub fn bf16s(shape: &[usize], v: &[f32]) -> Tensor {
    t(shape, &v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>())
}

/// An i8 tensor.
pub fn i8s(shape: &[usize], v: &[i8]) -> Tensor {
    t(shape, v)
}

/// A u8 tensor.
pub fn u8s(shape: &[usize], v: &[u8]) -> Tensor {
    t(shape, v)
}

/// An i32 tensor.
pub fn i32s(shape: &[usize], v: &[i32]) -> Tensor {
    t(shape, v)
}

/// An i64 tensor.
pub fn i64s(shape: &[usize], v: &[i64]) -> Tensor {
    t(shape, v)
}

/// A bool tensor.
pub fn bools(shape: &[usize], v: &[bool]) -> Tensor {
    t(shape, v)
}

/// Runs `op` and returns its results, panicking with the case name on an error.
pub fn eval(case: &str, op: &Op, inputs: &[Tensor]) -> Vec<Tensor> {
    let refs: Vec<&Tensor> = inputs.iter().collect();
    eval_op(op, &refs).unwrap_or_else(|e| panic!("{case}: {} failed: {e}", op.mnemonic()))
}

/// Whether two tensors agree exactly: dtype, shape, and every element (floats bit for bit, except that any NaN
/// equals any NaN).
pub fn same(a: &Tensor, b: &Tensor) -> bool {
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return false;
    }
    if a.dtype().is_float() {
        let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
        x.iter().zip(&y).all(|(p, q)| (p.is_nan() && q.is_nan()) || p.to_bits() == q.to_bits())
    } else {
        a.to_i64_vec() == b.to_i64_vec()
    }
}

/// Checks that `op` on `inputs` gives exactly `expected` (one tensor per result).
pub fn check(case: &str, op: &Op, inputs: &[Tensor], expected: &[Tensor]) {
    let got = eval(case, op, inputs);
    assert_eq!(got.len(), expected.len(), "{case}: result count");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(same(g, e), "{case}: result {i}\n  got      {g:?}\n  expected {e:?}");
    }
}

/// Checks that `op` on `inputs` gives `expected` within `tol` (absolute plus relative), NaN matching NaN.
pub fn check_close(case: &str, op: &Op, inputs: &[Tensor], expected: &Tensor, tol: f64) {
    let got = eval(case, op, inputs);
    let g = &got[0];
    assert_eq!((g.dtype(), g.shape()), (expected.dtype(), expected.shape()), "{case}: type");
    for (i, (p, q)) in g.to_f64_vec().iter().zip(expected.to_f64_vec()).enumerate() {
        let ok = (p.is_nan() && q.is_nan()) || p == &q || (p - q).abs() <= tol * (1.0 + q.abs());
        assert!(ok, "{case}: element {i} is {p}, expected {q}");
    }
}

/// Checks that `op` on `inputs` fails with a message containing `needle`.
pub fn check_err(case: &str, op: &Op, inputs: &[Tensor], needle: &str) {
    let refs: Vec<&Tensor> = inputs.iter().collect();
    match eval_op(op, &refs) {
        Ok(v) => panic!("{case}: expected an error containing {needle:?}, got {v:?}"),
        Err(e) => assert!(e.contains(needle), "{case}: error {e:?} does not contain {needle:?}"),
    }
}
