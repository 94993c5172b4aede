//! `conv` and `conv_transpose` as direct N-d loops over ONNX's definitions.
//!
//! Both walk one side's spatial positions and, for each, list the kernel taps that land inside the other side
//! (kernel index, flat spatial offset) once; the channel loops then run over that list. This hoists all bounds
//! checks out of the multiply-add loop without changing what is summed.

use super::{load, store, to_usize, with_real};
use crate::interp::index::for_each_index;
use crate::interp::num::Real;
use crate::op::{Conv, ConvTranspose};
use crate::tensor::{Tensor, strides_of};

/// The spatial geometry of one convolution, attributes converted to `usize` (the type rules checked their signs).
struct Window<'a> {
    /// Extents of the side the loop walks (conv: output; conv_transpose: input).
    walk: &'a [usize],
    /// Extents of the side the taps land in (conv: input; conv_transpose: output).
    land: &'a [usize],
    /// Kernel extents.
    kernel: &'a [usize],
    strides: Vec<usize>,
    dilations: Vec<usize>,
    pad_begin: Vec<usize>,
}

impl Window<'_> {
    /// Fills `taps` with `(kernel flat index, landing flat offset)` for every kernel tap of walk position `at`
    /// whose landing position `at*stride + k*dilation - pad_begin` lies inside `land`.
    fn taps(&self, at: &[usize], taps: &mut Vec<(usize, usize)>) {
        taps.clear();
        let land_strides = strides_of(self.land);
        let mut k_flat = 0;
        for_each_index(self.kernel, |k| {
            let mut off = 0;
            let mut inside = true;
            for d in 0..k.len() {
                let pos = (at[d] * self.strides[d] + k[d] * self.dilations[d]) as i64 - self.pad_begin[d] as i64;
                if pos < 0 || pos >= self.land[d] as i64 {
                    inside = false;
                    break;
                }
                off += pos as usize * land_strides[d];
            }
            if inside {
                taps.push((k_flat, off));
            }
            k_flat += 1;
        });
    }
}

/// `conv(x[N,C,*], w[M,C/groups,*][, bias[M]])`:
/// `y[n,m,o] = bias[m] + Σ_{c,k} x[n, g·C/groups + c, o·stride + k·dilation - pad_begin] · w[m,c,k]`,
/// `g = m / (M/groups)`, taps in the padding contributing nothing.
pub(super) fn conv(c: &Conv, inputs: &[&Tensor], out_shape: &[usize]) -> Result<Tensor, String> {
    let (x, w, bias) = operands(inputs)?;
    with_real!(x.dtype(), F => {
        let y = conv_typed::<F>(c, x, w, bias, out_shape);
        store(x.dtype(), out_shape, y)
    })
}

fn conv_typed<F: Real>(c: &Conv, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, out_shape: &[usize]) -> Vec<F> {
    let (xs, ws) = (x.shape(), w.shape());
    let (batch, channels, m, cg) = (xs[0], xs[1], ws[0], ws[1]);
    let mg = m / c.groups.max(1) as usize;
    let rank = xs.len() - 2;
    let window = Window {
        walk: &out_shape[2..],
        land: &xs[2..],
        kernel: &ws[2..],
        strides: to_usize(&c.strides),
        dilations: to_usize(&c.dilations),
        pad_begin: to_usize(&c.pads[..rank]),
    };
    let (in_size, k_size) = (window.land.iter().product::<usize>(), window.kernel.iter().product::<usize>());
    let out_size: usize = window.walk.iter().product();
    let (xv, wv, bv) = (load::<F>(x), load::<F>(w), bias.map(load::<F>));
    let mut y = vec![F::ZERO; batch * m * out_size];
    let mut taps = Vec::new();
    let mut p = 0;
    for_each_index(window.walk, |o| {
        window.taps(o, &mut taps);
        for n in 0..batch {
            for mo in 0..m {
                let g = mo / mg;
                let mut acc = F::ZERO;
                for ci in 0..cg {
                    let xb = (n * channels + g * cg + ci) * in_size;
                    let wb = (mo * cg + ci) * k_size;
                    for &(k, off) in &taps {
                        acc = acc + xv[xb + off] * wv[wb + k];
                    }
                }
                if let Some(b) = &bv {
                    acc = acc + b[mo];
                }
                y[(n * m + mo) * out_size + p] = acc;
            }
        }
        p += 1;
    });
    y
}

/// `conv_transpose(x[N,C,*], w[C,M/groups,*][, bias[M]])`, the adjoint of `conv`: every input element scatters
/// `x[n,c,i] · w[c,m,k]` to `y[n, g·M/groups + m, i·stride + k·dilation - pad_begin]` (`g = c / (C/groups)`),
/// dropping what lands outside the output; `output_padding` only extends the output at the end.
pub(super) fn conv_transpose(c: &ConvTranspose, inputs: &[&Tensor], out_shape: &[usize]) -> Result<Tensor, String> {
    let (x, w, bias) = operands(inputs)?;
    with_real!(x.dtype(), F => {
        let y = conv_transpose_typed::<F>(c, x, w, bias, out_shape);
        store(x.dtype(), out_shape, y)
    })
}

fn conv_transpose_typed<F: Real>(
    c: &ConvTranspose,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out_shape: &[usize],
) -> Vec<F> {
    let (xs, ws) = (x.shape(), w.shape());
    let (batch, channels, mg) = (xs[0], xs[1], ws[1]);
    let m = out_shape[1];
    let cg = channels / c.groups.max(1) as usize;
    let rank = xs.len() - 2;
    let window = Window {
        walk: &xs[2..],
        land: &out_shape[2..],
        kernel: &ws[2..],
        strides: to_usize(&c.strides),
        dilations: to_usize(&c.dilations),
        pad_begin: to_usize(&c.pads[..rank]),
    };
    let (in_size, k_size) = (window.walk.iter().product::<usize>(), window.kernel.iter().product::<usize>());
    let out_size: usize = window.land.iter().product();
    let (xv, wv, bv) = (load::<F>(x), load::<F>(w), bias.map(load::<F>));
    let mut y = vec![F::ZERO; batch * m * out_size];
    let mut taps = Vec::new();
    let mut p = 0;
    for_each_index(window.walk, |i| {
        window.taps(i, &mut taps);
        for n in 0..batch {
            for ci in 0..channels {
                let g = ci / cg;
                let xval = xv[(n * channels + ci) * in_size + p];
                for mo in 0..mg {
                    let wb = (ci * mg + mo) * k_size;
                    let yb = (n * m + g * mg + mo) * out_size;
                    for &(k, off) in &taps {
                        y[yb + off] = y[yb + off] + xval * wv[wb + k];
                    }
                }
            }
        }
        p += 1;
    });
    if let Some(b) = &bv {
        for (plane, chunk) in y.chunks_mut(out_size.max(1)).enumerate() {
            for v in chunk {
                *v = *v + b[plane % m];
            }
        }
    }
    y
}

/// `x`, `w` and the optional bias; the type rules checked the arity, so this only guards the driver's contract.
fn operands<'a>(inputs: &[&'a Tensor]) -> Result<(&'a Tensor, &'a Tensor, Option<&'a Tensor>), String> {
    match inputs {
        [x, w] => Ok((x, w, None)),
        [x, w, b] => Ok((x, w, Some(b))),
        _ => Err(format!("takes 2 or 3 operands, got {}", inputs.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use crate::op::{Conv, ConvTranspose, Op};
    use crate::types::DType;

    fn conv(strides: &[i64], pads: &[i64], dilations: &[i64], groups: i64) -> Op {
        Op::Conv(Conv { strides: strides.to_vec(), pads: pads.to_vec(), dilations: dilations.to_vec(), groups })
    }

    fn conv_t(strides: &[i64], pads: &[i64], dilations: &[i64], output_padding: &[i64], groups: i64) -> Op {
        Op::ConvTranspose(ConvTranspose {
            strides: strides.to_vec(),
            pads: pads.to_vec(),
            dilations: dilations.to_vec(),
            output_padding: output_padding.to_vec(),
            groups,
        })
    }

    #[test]
    fn conv_matches_hand_values() {
        let x3x3 = || f32s(&[1, 1, 3, 3], &ramp(9));
        check(
            &[
                Case {
                    name: "3x3 input, 2x2 kernel",
                    op: conv(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1),
                    inputs: vec![x3x3(), f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0])],
                    // [1·1+2·2+3·4+4·5, 2+6+15+24, 4+10+21+32, 5+12+24+36]
                    want: vec![(vec![1, 1, 2, 2], vec![37.0, 47.0, 67.0, 77.0])],
                },
                Case {
                    name: "two output channels with bias",
                    op: conv(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1),
                    inputs: vec![
                        x3x3(),
                        f32s(&[2, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 1.0]),
                        f32s(&[2], &[0.5, -1.0]),
                    ],
                    want: vec![(vec![1, 2, 2, 2], vec![37.5, 47.5, 67.5, 77.5, 4.0, 5.0, 7.0, 8.0])],
                },
                Case {
                    name: "3x3 box filter, stride 2, pad 1",
                    op: conv(&[2, 2], &[1, 1, 1, 1], &[1, 1], 1),
                    inputs: vec![x3x3(), f32s(&[1, 1, 3, 3], &[1.0; 9])],
                    // Windows centred on (0,0), (0,2), (2,0), (2,2): 1+2+4+5, 2+3+5+6, 4+5+7+8, 5+6+8+9.
                    want: vec![(vec![1, 1, 2, 2], vec![12.0, 16.0, 24.0, 28.0])],
                },
                Case {
                    name: "dilation 2",
                    op: conv(&[1, 1], &[0, 0, 0, 0], &[2, 2], 1),
                    inputs: vec![x3x3(), f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0])],
                    // Taps at the corners: 1·1 + 2·3 + 3·7 + 4·9.
                    want: vec![(vec![1, 1, 1, 1], vec![64.0])],
                },
                Case {
                    name: "1-d, asymmetric pads, bias",
                    op: conv(&[1], &[1, 0], &[1], 1),
                    inputs: vec![f32s(&[1, 1, 3], &[1.0, 2.0, 3.0]), f32s(&[1, 1, 2], &[1.0, 1.0]), {
                        f32s(&[1], &[10.0])
                    }],
                    // Windows [pad,1], [1,2], [2,3].
                    want: vec![(vec![1, 1, 3], vec![11.0, 13.0, 15.0])],
                },
                Case {
                    name: "1-d, end pads only, stride 2",
                    op: conv(&[2], &[0, 2], &[1], 1),
                    inputs: vec![f32s(&[1, 1, 3], &[1.0, 2.0, 3.0]), f32s(&[1, 1, 2], &[1.0, 10.0])],
                    // Windows [1,2], [3,pad]: floor((3+2-2)/2)+1 = 2 outputs.
                    want: vec![(vec![1, 1, 2], vec![21.0, 3.0])],
                },
                Case {
                    name: "two groups of two channels",
                    op: conv(&[1], &[0, 0], &[1], 2),
                    inputs: vec![
                        f32s(&[1, 4, 2], &ramp(8)),
                        // m0 = c0 + 10·c1; m1 = 2·c2 - c3.
                        f32s(&[2, 2, 1], &[1.0, 10.0, 2.0, -1.0]),
                    ],
                    want: vec![(vec![1, 2, 2], vec![31.0, 42.0, 3.0, 4.0])],
                },
                Case {
                    name: "depthwise with channel multiplier 2",
                    op: conv(&[1], &[0, 0], &[1], 2),
                    inputs: vec![
                        f32s(&[1, 2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
                        // c0 → [1,1] and [1,0]; c1 → [1,-1] and [0,2].
                        f32s(&[4, 1, 2], &[1.0, 1.0, 1.0, 0.0, 1.0, -1.0, 0.0, 2.0]),
                    ],
                    want: vec![(vec![1, 4, 2], vec![3.0, 5.0, 1.0, 2.0, -1.0, -1.0, 10.0, 12.0])],
                },
                Case {
                    name: "3-d box",
                    op: conv(&[1, 1, 1], &[0; 6], &[1, 1, 1], 1),
                    inputs: vec![f32s(&[1, 1, 2, 2, 2], &ramp(8)), f32s(&[1, 1, 2, 2, 2], &[1.0; 8])],
                    want: vec![(vec![1, 1, 1, 1, 1], vec![36.0])],
                },
                Case {
                    name: "batch of two, channel sum",
                    op: conv(&[1], &[0, 0], &[1], 1),
                    inputs: vec![f32s(&[2, 2, 1], &[1.0, 2.0, 3.0, 4.0]), f32s(&[1, 2, 1], &[1.0, 100.0])],
                    want: vec![(vec![2, 1, 1], vec![201.0, 403.0])],
                },
                Case {
                    name: "empty batch",
                    op: conv(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1),
                    inputs: vec![f32s(&[0, 1, 3, 3], &[]), f32s(&[1, 1, 2, 2], &[1.0; 4])],
                    want: vec![(vec![0, 1, 2, 2], vec![])],
                },
            ],
            1e-6,
        );
    }

    #[test]
    fn conv_keeps_half_and_double_dtypes() {
        let op = conv(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1);
        for dtype in [DType::F16, DType::BF16, DType::F64] {
            let x = tensor(dtype, &[1, 1, 3, 3], &ramp(9));
            let w = tensor(dtype, &[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
            let y = run("conv dtype", &op, &[x, w]);
            expect(&format!("conv {dtype}"), &y[0], dtype, &[1, 1, 2, 2], &[37.0, 47.0, 67.0, 77.0], 0.0);
        }
    }

    #[test]
    fn conv_transpose_matches_hand_values() {
        check(
            &[
                Case {
                    name: "1-d, stride 2, output_padding 1",
                    op: conv_t(&[2], &[0, 0], &[1], &[1], 1),
                    inputs: vec![f32s(&[1, 1, 3], &[1.0, 2.0, 3.0]), f32s(&[1, 1, 3], &[1.0, 1.0, 1.0])],
                    // Each x[i] adds itself at 2i, 2i+1, 2i+2; output_padding adds a zero at the end.
                    want: vec![(vec![1, 1, 8], vec![1.0, 1.0, 3.0, 2.0, 5.0, 3.0, 3.0, 0.0])],
                },
                Case {
                    name: "1-d, stride 2, output_padding 1, pads 1",
                    op: conv_t(&[2], &[1, 1], &[1], &[1], 1),
                    inputs: vec![f32s(&[1, 1, 3], &[1.0, 2.0, 3.0]), f32s(&[1, 1, 3], &[1.0, 1.0, 1.0])],
                    // The unpadded result cropped to positions 1..7.
                    want: vec![(vec![1, 1, 6], vec![1.0, 3.0, 2.0, 5.0, 3.0, 3.0])],
                },
                Case {
                    name: "1-d, dilation 2",
                    op: conv_t(&[1], &[0, 0], &[2], &[0], 1),
                    inputs: vec![f32s(&[1, 1, 2], &[1.0, 2.0]), f32s(&[1, 1, 2], &[1.0, 10.0])],
                    want: vec![(vec![1, 1, 4], vec![1.0, 2.0, 10.0, 20.0])],
                },
                Case {
                    name: "input channels sum into one output",
                    op: conv_t(&[1], &[0, 0], &[1], &[0], 1),
                    inputs: vec![f32s(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]), f32s(&[2, 1, 1], &[1.0, 2.0])],
                    want: vec![(vec![1, 1, 2], vec![7.0, 10.0])],
                },
                Case {
                    name: "2-d, two groups, bias",
                    op: conv_t(&[1, 1], &[0, 0, 0, 0], &[1, 1], &[0, 0], 2),
                    inputs: vec![
                        f32s(&[1, 2, 1, 1], &[1.0, 2.0]),
                        f32s(&[2, 1, 2, 2], &ramp(8)),
                        f32s(&[2], &[1.0, -1.0]),
                    ],
                    // Output channel 0 is 1·w[0] + 1, channel 1 is 2·w[1] - 1.
                    want: vec![(vec![1, 2, 2, 2], vec![2.0, 3.0, 4.0, 5.0, 9.0, 11.0, 13.0, 15.0])],
                },
                Case {
                    name: "2-d, stride 2 scatters without overlap",
                    op: conv_t(&[2, 2], &[0, 0, 0, 0], &[1, 1], &[0, 0], 1),
                    inputs: vec![f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]), f32s(&[1, 1, 2, 2], &[1.0; 4])],
                    want: vec![(
                        vec![1, 1, 4, 4],
                        vec![1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0, 3.0, 4.0, 4.0],
                    )],
                },
                Case {
                    name: "empty batch",
                    op: conv_t(&[2], &[0, 0], &[1], &[1], 1),
                    inputs: vec![f32s(&[0, 1, 3], &[]), f32s(&[1, 1, 3], &[1.0; 3])],
                    want: vec![(vec![0, 1, 8], vec![])],
                },
            ],
            1e-6,
        );
    }

    #[test]
    fn bad_conv_operands_are_errors() {
        let op = conv(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1);
        let x = f32s(&[1, 2, 3, 3], &[0.0; 18]);
        expect_err("channel mismatch", &op, &[x.clone(), f32s(&[1, 1, 2, 2], &[0.0; 4])], "disagree");
        let bias = f32s(&[2], &[0.0; 2]);
        expect_err("bias mismatch", &op, &[x.clone(), f32s(&[1, 2, 2, 2], &[0.0; 8]), bias], "bias");
        expect_err("kernel too large", &op, &[x, f32s(&[1, 2, 4, 4], &[0.0; 32])], "exceeds");
        let t = conv_t(&[1], &[0, 0], &[1], &[0], 1);
        expect_err("transpose weights", &t, &[f32s(&[1, 2, 2], &[0.0; 4]), f32s(&[1, 1, 1], &[0.0])], "disagree");
    }
}
