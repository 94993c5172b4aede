//! `layer_norm` and inference `batch_norm`.

use super::{load, store, with_real};
use crate::interp::index::broadcast_offsets;
use crate::interp::num::Real;
use crate::op::{BatchNorm, LayerNorm};
use crate::tensor::Tensor;
use crate::types::normalize_axis;

/// ONNX LayerNormalization: each slice over dims `axis..rank` becomes
/// `(x - mean) / sqrt(var + epsilon) * scale + bias`, with the biased (population) variance, and `scale` and the
/// optional `bias` broadcast (numpy rules) against those trailing dims.
pub(super) fn layer_norm(l: &LayerNorm, inputs: &[&Tensor]) -> Result<Tensor, String> {
    let (x, scale, bias) = match inputs {
        [x, s] => (*x, *s, None),
        [x, s, b] => (*x, *s, Some(*b)),
        _ => return Err(format!("takes 2 or 3 operands, got {}", inputs.len())),
    };
    with_real!(x.dtype(), F => {
        let axis = normalize_axis(l.axis, x.shape().len())?;
        let norm_dims = &x.shape()[axis..];
        let inner: usize = norm_dims.iter().product();
        // Per position of the normalized dims, the broadcast scale and bias.
        let spread = |t: &Tensor| -> Result<Vec<F>, String> {
            let v = load::<F>(t);
            Ok(broadcast_offsets(t.shape(), norm_dims)?.into_iter().map(|i| v[i]).collect())
        };
        let scale = spread(scale)?;
        let bias = match bias {
            Some(b) => spread(b)?,
            None => vec![F::ZERO; inner],
        };
        let eps = F::of_f64(l.epsilon);
        let v = load::<F>(x);
        let mut y = vec![F::ZERO; v.len()];
        for (row, out) in v.chunks(inner.max(1)).zip(y.chunks_mut(inner.max(1))) {
            let n = F::of_f64(row.len() as f64);
            let mut sum = F::ZERO;
            for &e in row {
                sum += e;
            }
            let mean = sum / n;
            let mut sq = F::ZERO;
            for &e in row {
                sq += (e - mean) * (e - mean);
            }
            let inv_std = F::ONE / (sq / n + eps).sqrt();
            for j in 0..row.len() {
                out[j] = (row[j] - mean) * inv_std * scale[j] + bias[j];
            }
        }
        store(x.dtype(), x.shape(), y)
    })
}

/// Inference batch normalization over dim 1 of `x[N,C,*]`:
/// `(x - mean[c]) / sqrt(var[c] + epsilon) * scale[c] + bias[c]`.
pub(super) fn batch_norm(b: &BatchNorm, inputs: &[&Tensor]) -> Result<Tensor, String> {
    let [x, scale, bias, mean, var] = inputs else {
        return Err(format!("takes 5 operands, got {}", inputs.len()));
    };
    with_real!(x.dtype(), F => {
        let (scale, bias, mean, var) = (load::<F>(scale), load::<F>(bias), load::<F>(mean), load::<F>(var));
        let channels = x.shape()[1];
        let inner: usize = x.shape()[2..].iter().product();
        let eps = F::of_f64(b.epsilon);
        let mut y = load::<F>(x);
        for (i, e) in y.iter_mut().enumerate() {
            let c = (i / inner) % channels;
            *e = (*e - mean[c]) / (var[c] + eps).sqrt() * scale[c] + bias[c];
        }
        store(x.dtype(), x.shape(), y)
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use crate::op::{BatchNorm, LayerNorm, Op};
    use crate::types::DType;

    fn layer_norm(axis: i64, epsilon: f64) -> Op {
        Op::LayerNorm(LayerNorm { axis, epsilon })
    }

    fn batch_norm(epsilon: f64) -> Op {
        Op::BatchNorm(BatchNorm { epsilon })
    }

    /// `[1,2,3,4]` normalized: mean 2.5, variance 1.25, so `(x - 2.5) / √1.25`.
    const NORMED: [f64; 4] = [-1.3416407864998738, -0.4472135954999579, 0.4472135954999579, 1.3416407864998738];

    #[test]
    fn layer_norm_matches_hand_values() {
        check(
            &[
                Case {
                    name: "[1,2,3,4], unit scale",
                    op: layer_norm(-1, 0.0),
                    inputs: vec![f64s(&[4], &[1.0, 2.0, 3.0, 4.0]), f64s(&[4], &[1.0; 4])],
                    want: vec![(vec![4], NORMED.to_vec())],
                },
                Case {
                    name: "epsilon 0.75 makes the variance 2",
                    op: layer_norm(0, 0.75),
                    inputs: vec![f64s(&[4], &[1.0, 2.0, 3.0, 4.0]), f64s(&[4], &[1.0; 4])],
                    // (x - 2.5) / √2.
                    want: vec![(
                        vec![4],
                        vec![-1.0606601717798212, -0.35355339059327373, 0.35355339059327373, { 1.0606601717798212 }],
                    )],
                },
                Case {
                    name: "per-element scale and bias",
                    op: layer_norm(1, 0.0),
                    inputs: vec![
                        f64s(&[1, 4], &[1.0, 2.0, 3.0, 4.0]),
                        f64s(&[4], &[1.0, 0.0, -1.0, 2.0]),
                        f64s(&[4], &[0.0, 1.0, 0.0, 1.0]),
                    ],
                    want: vec![(vec![1, 4], vec![NORMED[0], 1.0, -NORMED[2], 2.0 * NORMED[3] + 1.0])],
                },
                Case {
                    name: "two rows, one-element scale and bias; a constant row without epsilon is NaN",
                    op: layer_norm(-1, 0.0),
                    inputs: vec![
                        f32s(&[2, 4], &[1.0, 2.0, 3.0, 4.0, 10.0, 10.0, 10.0, 10.0]),
                        f32s(&[1], &[2.0]),
                        f32s(&[1], &[0.5]),
                    ],
                    // The constant row is 0 · (1/√0) = 0 · ∞.
                    want: vec![(vec![2, 4], {
                        let mut v: Vec<f64> = NORMED.iter().map(|n| 2.0 * n + 0.5).collect();
                        v.extend([f64::NAN; 4]);
                        v
                    })],
                },
                Case {
                    name: "a constant row with epsilon is the bias",
                    op: layer_norm(-1, 1e-5),
                    inputs: vec![f32s(&[1, 3], &[7.0, 7.0, 7.0]), f32s(&[3], &[1.0; 3]), f32s(&[3], &[0.0, 1.0, 2.0])],
                    want: vec![(vec![1, 3], vec![0.0, 1.0, 2.0])],
                },
                Case {
                    name: "over the last two dims, scale broadcast along rows",
                    op: layer_norm(1, 0.0),
                    inputs: vec![f64s(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 4.0, 3.0, 2.0, 1.0]), f64s(&[2], &[1.0, 10.0])],
                    want: vec![(
                        vec![2, 2, 2],
                        vec![
                            NORMED[0],
                            10.0 * NORMED[1],
                            NORMED[2],
                            10.0 * NORMED[3],
                            NORMED[3],
                            10.0 * NORMED[2],
                            NORMED[1],
                            10.0 * NORMED[0],
                        ],
                    )],
                },
                Case {
                    name: "empty batch",
                    op: layer_norm(-1, 1e-5),
                    inputs: vec![f32s(&[0, 4], &[]), f32s(&[4], &[1.0; 4])],
                    want: vec![(vec![0, 4], vec![])],
                },
            ],
            1e-6,
        );
    }

    #[test]
    fn layer_norm_of_bf16_rounds_once() {
        let x = tensor(DType::BF16, &[4], &[1.0, 2.0, 3.0, 4.0]);
        let y = run("bf16", &layer_norm(0, 0.0), &[x, tensor(DType::BF16, &[4], &[1.0; 4])]);
        let want: Vec<f64> = NORMED.iter().map(|&v| half::bf16::from_f32(v as f32).to_f64()).collect();
        expect("bf16", &y[0], DType::BF16, &[4], &want, 0.0);
    }

    #[test]
    fn batch_norm_matches_hand_values() {
        check(
            &[
                Case {
                    name: "two channels, two positions",
                    op: batch_norm(0.0),
                    inputs: vec![
                        // c0 = [1,3], c1 = [2,4]
                        f32s(&[1, 2, 2], &[1.0, 3.0, 2.0, 4.0]),
                        f32s(&[2], &[1.0, 2.0]),
                        f32s(&[2], &[0.0, 1.0]),
                        f32s(&[2], &[2.0, 3.0]),
                        f32s(&[2], &[1.0, 4.0]),
                    ],
                    // c0: (x-2)/1·1+0; c1: (x-3)/2·2+1.
                    want: vec![(vec![1, 2, 2], vec![-1.0, 1.0, 0.0, 2.0])],
                },
                Case {
                    name: "rank 2 with epsilon",
                    op: batch_norm(0.5),
                    inputs: vec![
                        f64s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]),
                        f64s(&[2], &[1.0, 1.0]),
                        f64s(&[2], &[0.0, 0.0]),
                        f64s(&[2], &[0.0, 0.0]),
                        f64s(&[2], &[3.5, 1.5]),
                    ],
                    // Divisors √4 = 2 for channel 0 and √2 for channel 1.
                    want: vec![(vec![2, 2], vec![0.5, std::f64::consts::SQRT_2, 1.5, 2.0 * std::f64::consts::SQRT_2])],
                },
                Case {
                    name: "empty batch",
                    op: batch_norm(1e-5),
                    inputs: vec![
                        f32s(&[0, 2, 3], &[]),
                        f32s(&[2], &[1.0; 2]),
                        f32s(&[2], &[0.0; 2]),
                        f32s(&[2], &[0.0; 2]),
                        f32s(&[2], &[1.0; 2]),
                    ],
                    want: vec![(vec![0, 2, 3], vec![])],
                },
            ],
            1e-6,
        );
    }

    #[test]
    fn bad_norm_operands_are_errors() {
        let x = f32s(&[2, 4], &[0.0; 8]);
        expect_err("scale too long", &layer_norm(-1, 0.0), &[x.clone(), f32s(&[8], &[0.0; 8])], "broadcast");
        let scale = tensor(DType::F64, &[4], &[1.0; 4]);
        expect_err("scale dtype", &layer_norm(-1, 0.0), &[x, scale], "operand 1");
    }
}
