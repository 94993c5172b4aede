//! Integer (quantized) ops: `matmul_integer`, `conv_integer` and `dynamic_quantize`.
//!
//! The operands are 8-bit, so `(q - zero)` fits 9 bits and every product 17: the sums are computed exactly in f64
//! (exact below 2^53 — far beyond any real contraction) by the float kernels, then wrapped to i32 as integer
//! accumulation in i32 would (ONNX's semantics; a wrap needs over 33,000 extreme products in one sum).

use crate::op::{BinaryOp, Conv, Op};
use crate::tensor::{Data, Tensor};
use crate::types::{DType, Shape};

use super::{elementwise, nn, reduce, shape};

/// `q - zero` as f64, the zero point reshaped to `zero_dims` first (to broadcast per row or per channel).
fn shifted(q: &Tensor, zero: &Tensor, zero_dims: Option<Vec<u64>>) -> Result<Tensor, String> {
    let q = elementwise::cast(q, DType::F64)?;
    let mut zero = elementwise::cast(zero, DType::F64)?;
    if let Some(dims) = zero_dims {
        zero = shape::reshape(&zero, &Shape::of(&dims))?;
    }
    elementwise::binary(BinaryOp::Sub, &q, &zero)
}

/// An exact integral f64 result as i32, wrapping modulo 2^32.
fn wrap_i32(t: &Tensor) -> Tensor {
    let data = Data::from_i64_iter(DType::I32, t.to_f64_vec().into_iter().map(|v| v as i64 as i32 as i64));
    Tensor::new(t.shape().to_vec(), data).expect("the same element count")
}

/// A per-row/per-channel zero point (`[n]`, n > 1) broadcast along dim `at` of a rank-`rank` operand: its shape
/// with every other dim 1. Scalars and `[1]` broadcast as they are.
fn per_dims(zero: &Tensor, rank: usize, at: usize) -> Option<Vec<u64>> {
    match zero.shape() {
        [n] if *n != 1 => {
            let mut dims = vec![1u64; rank - at];
            dims[0] = *n as u64;
            Some(dims)
        }
        _ => None,
    }
}

/// ONNX MatMulInteger.
pub(super) fn matmul_integer(inputs: &[&Tensor]) -> Result<Tensor, String> {
    let [a, b, az, bz] = inputs else { return Err(format!("takes 4 operands, got {}", inputs.len())) };
    // A per-row zero point of a (`[M]`) becomes `[M, 1]`; a per-column one of b (`[N]`) broadcasts as it is.
    let rank = a.shape().len();
    let a = shifted(a, az, if rank >= 2 { per_dims(az, rank, rank - 2) } else { None })?;
    let b = shifted(b, bz, None)?;
    Ok(wrap_i32(&reduce::matmul(&a, &b)?))
}

/// ONNX ConvInteger (padding adds `x_zero`, i.e. 0 once shifted).
pub(super) fn conv_integer(c: &Conv, inputs: &[&Tensor]) -> Result<Tensor, String> {
    let [x, w, xz, wz] = inputs else { return Err(format!("takes 4 operands, got {}", inputs.len())) };
    let x = shifted(x, xz, None)?;
    let w = shifted(w, wz, per_dims(wz, w.shape().len(), 0))?;
    let out = nn::eval(&Op::Conv(c.clone()), &[&x, &w])?;
    Ok(wrap_i32(&out[0]))
}

/// `dynamic_quantize`: `y`, its scale and its zero point, by [`crate::quant`]'s arithmetic.
pub(super) fn dynamic_quantize(x: &Tensor) -> Result<Vec<Tensor>, String> {
    let Data::F32(xs) = x.data() else { return Err(format!("quantizes f32 tensors, got {}", x.dtype())) };
    let (lo, hi) = xs.iter().fold(crate::quant::EMPTY_RANGE, |r, &v| crate::quant::merge_range(r, (v, v)));
    let (scale, zero) = crate::quant::dynamic_u8_params(lo, hi);
    let y = xs.iter().map(|&v| crate::quant::quantize_u8(v, scale, zero)).collect();
    let scalar = |d| Tensor::new(vec![], d).map_err(|e| e.to_string());
    Ok(vec![
        Tensor::new(x.shape().to_vec(), Data::U8(y)).map_err(|e| e.to_string())?,
        scalar(Data::F32(vec![scale]))?,
        scalar(Data::U8(vec![zero]))?,
    ])
}
