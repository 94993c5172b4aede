//! `pool`: max and average pooling over the spatial dims of `x[N,C,*]`.
//!
//! Output extents come from the type rule (`infer::pool_extent`, ceil mode included). For each output position
//! the window is listed once — the flat offsets of its taps inside the input, and how many taps the divisor
//! counts — and then reduced over every (n, c) plane. A tap at `o·stride + k·dilation - pad_begin` is real when
//! it lies in `[0, in)`, padding when it lies in the explicit pads `[-pad_begin, in + pad_end)`, and ceil-mode
//! overhang beyond that.

use super::{load, store, to_usize, with_real};
use crate::dispatch_data;
use crate::interp::index::for_each_index;
use crate::interp::num::{Real, is_nan};
use crate::op::{Pool, PoolKind};
use crate::tensor::{Data, Element, Tensor, strides_of};

/// Max pooling keeps the largest real element (padding never wins; a NaN wins over everything). Average pooling
/// sums the real elements and divides by the number of real ones, or with `count_include_pad` by the number of
/// taps inside the padded input. A window with no real element (possible only with dilation) gives the dtype's
/// lowest value (max) or NaN (average without `count_include_pad`).
pub(super) fn pool(p: &Pool, x: &Tensor, out_shape: &[usize]) -> Result<Tensor, String> {
    let geometry = Geometry::new(p, x.shape(), &out_shape[2..]);
    match p.kind {
        PoolKind::Max => {
            let data = dispatch_data!(x.data(), v => max_pool(v, &geometry));
            Tensor::new(out_shape.to_vec(), data).map_err(|e| e.to_string())
        }
        PoolKind::Avg => with_real!(x.dtype(), F => {
            let y = avg_pool::<F>(&load(x), &geometry, p.count_include_pad);
            store(x.dtype(), out_shape, y)
        }),
    }
}

/// Window arithmetic of one pool, attributes as `usize` (the type rule checked their signs).
struct Geometry<'a> {
    /// `N·C`: the planes every window is reduced over.
    planes: usize,
    input: &'a [usize],
    output: &'a [usize],
    in_strides: Vec<usize>,
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    pad_begin: Vec<usize>,
    pad_end: Vec<usize>,
}

/// One output position's window.
struct Window {
    /// Flat spatial offsets of the taps that are real input elements.
    real: Vec<usize>,
    /// Taps inside the input or the explicit pads (the ceil-mode overhang excluded).
    padded: usize,
}

impl<'a> Geometry<'a> {
    /// The geometry for `x` of shape `x_shape` pooled to spatial extents `output`.
    fn new(p: &Pool, x_shape: &'a [usize], output: &'a [usize]) -> Geometry<'a> {
        let input = &x_shape[2..];
        let rank = input.len();
        Geometry {
            planes: x_shape[0] * x_shape[1],
            input,
            output,
            in_strides: strides_of(input),
            kernel: to_usize(&p.kernel),
            strides: to_usize(&p.strides),
            dilations: to_usize(&p.dilations),
            pad_begin: to_usize(&p.pads[..rank]),
            pad_end: to_usize(&p.pads[rank..]),
        }
    }

    fn in_size(&self) -> usize {
        self.input.iter().product()
    }

    fn out_size(&self) -> usize {
        self.output.iter().product()
    }

    /// Calls `f(flat output position, window)` for every output position.
    fn for_each_window(&self, mut f: impl FnMut(usize, &Window)) {
        let mut w = Window { real: Vec::new(), padded: 0 };
        let mut p = 0;
        for_each_index(self.output, |o| {
            w.real.clear();
            w.padded = 0;
            for_each_index(&self.kernel, |k| {
                let mut off = 0;
                let mut real = true;
                let mut in_pads = true;
                for d in 0..o.len() {
                    // Measured from the start of the left padding, so it stays non-negative.
                    let shifted = o[d] * self.strides[d] + k[d] * self.dilations[d];
                    let (begin, end) = (self.pad_begin[d], self.pad_begin[d] + self.input[d]);
                    if shifted < begin || shifted >= end {
                        real = false;
                    } else {
                        off += (shifted - begin) * self.in_strides[d];
                    }
                    if shifted >= end + self.pad_end[d] {
                        in_pads = false;
                    }
                }
                if real {
                    w.real.push(off);
                }
                if in_pads {
                    w.padded += 1;
                }
            });
            f(p, &w);
            p += 1;
        });
    }
}

fn max_pool<T: Element>(v: &[T], g: &Geometry) -> Data {
    let (in_size, out_size) = (g.in_size(), g.out_size());
    let planes = g.planes;
    let mut y = vec![T::from_f64(f64::NEG_INFINITY); planes * out_size];
    g.for_each_window(|p, w| {
        for plane in 0..planes {
            let base = plane * in_size;
            let mut best = T::from_f64(f64::NEG_INFINITY);
            for &off in &w.real {
                let e = v[base + off];
                if is_nan(e) {
                    best = e;
                    break;
                }
                if e > best {
                    best = e;
                }
            }
            y[plane * out_size + p] = best;
        }
    });
    T::wrap(y)
}

fn avg_pool<F: Real>(v: &[F], g: &Geometry, count_include_pad: bool) -> Vec<F> {
    let (in_size, out_size) = (g.in_size(), g.out_size());
    let planes = g.planes;
    let mut y = vec![F::ZERO; planes * out_size];
    g.for_each_window(|p, w| {
        let count = F::of_f64(if count_include_pad { w.padded } else { w.real.len() } as f64);
        for plane in 0..planes {
            let base = plane * in_size;
            let mut sum = F::ZERO;
            for &off in &w.real {
                sum = sum + v[base + off];
            }
            y[plane * out_size + p] = sum / count;
        }
    });
    y
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use crate::op::{Op, Pool, PoolKind};
    use crate::types::DType;

    /// A pool op; `dilations` default to 1.
    fn pool(kind: PoolKind, kernel: &[i64], strides: &[i64], pads: &[i64], ceil: bool, include_pad: bool) -> Op {
        Op::Pool(Pool {
            kind,
            kernel: kernel.to_vec(),
            strides: strides.to_vec(),
            pads: pads.to_vec(),
            dilations: vec![1; kernel.len()],
            ceil_mode: ceil,
            count_include_pad: include_pad,
        })
    }

    fn dilated(op: Op, dilations: &[i64]) -> Op {
        match op {
            Op::Pool(p) => Op::Pool(Pool { dilations: dilations.to_vec(), ..p }),
            other => other,
        }
    }

    #[test]
    fn max_pool_matches_hand_values() {
        use PoolKind::Max;
        let nan = f64::NAN;
        check(
            &[
                Case {
                    name: "2x2 stride 2 on 4x4",
                    op: pool(Max, &[2, 2], &[2, 2], &[0; 4], false, false),
                    inputs: vec![f32s(&[1, 1, 4, 4], &ramp(16))],
                    want: vec![(vec![1, 1, 2, 2], vec![6.0, 8.0, 14.0, 16.0])],
                },
                Case {
                    name: "floor mode drops the partial window",
                    op: pool(Max, &[2], &[2], &[0, 0], false, false),
                    inputs: vec![f32s(&[1, 1, 5], &[1.0, 5.0, 2.0, 4.0, 3.0])],
                    want: vec![(vec![1, 1, 2], vec![5.0, 4.0])],
                },
                Case {
                    name: "ceil mode keeps the partial window",
                    op: pool(Max, &[2], &[2], &[0, 0], true, false),
                    inputs: vec![f32s(&[1, 1, 5], &[1.0, 5.0, 2.0, 4.0, 3.0])],
                    want: vec![(vec![1, 1, 3], vec![5.0, 4.0, 3.0])],
                },
                Case {
                    name: "dilation 2",
                    op: dilated(pool(Max, &[2], &[1], &[0, 0], false, false), &[2]),
                    inputs: vec![f32s(&[1, 1, 5], &[1.0, 5.0, 2.0, 4.0, 3.0])],
                    // Windows {0,2}, {1,3}, {2,4}.
                    want: vec![(vec![1, 1, 3], vec![2.0, 5.0, 3.0])],
                },
                Case {
                    name: "padding never wins over negatives",
                    op: pool(Max, &[2], &[1], &[1, 1], false, false),
                    inputs: vec![f32s(&[1, 1, 3], &[-5.0, -3.0, -4.0])],
                    want: vec![(vec![1, 1, 4], vec![-5.0, -3.0, -3.0, -4.0])],
                },
                Case {
                    name: "NaN propagates to its windows only",
                    op: pool(Max, &[2], &[2], &[0, 0], false, false),
                    inputs: vec![f32s(&[1, 2, 4], &[1.0, nan, 3.0, 4.0, nan, 9.0, 0.0, -1.0])],
                    want: vec![(vec![1, 2, 2], vec![nan, 4.0, nan, 0.0])],
                },
                Case {
                    name: "3-d",
                    op: pool(Max, &[2, 2, 2], &[1, 1, 1], &[0; 6], false, false),
                    inputs: vec![f32s(&[1, 1, 2, 2, 2], &[3.0, 1.0, 8.0, 2.0, 5.0, 7.0, 4.0, 6.0])],
                    want: vec![(vec![1, 1, 1, 1, 1], vec![8.0])],
                },
                Case {
                    name: "empty batch",
                    op: pool(Max, &[2, 2], &[2, 2], &[0; 4], false, false),
                    inputs: vec![f32s(&[0, 3, 4, 4], &[])],
                    want: vec![(vec![0, 3, 2, 2], vec![])],
                },
            ],
            0.0,
        );
    }

    #[test]
    fn max_pool_on_integers_is_exact() {
        let op = pool(PoolKind::Max, &[2, 2], &[2, 2], &[0; 4], false, false);
        let y = run("i32", &op, &[tensor(DType::I32, &[1, 1, 4, 4], &ramp(16))]);
        expect("i32", &y[0], DType::I32, &[1, 1, 2, 2], &[6.0, 8.0, 14.0, 16.0], 0.0);
        let op = pool(PoolKind::Max, &[2], &[1], &[1, 0], false, false);
        let y = run("i8 with pads", &op, &[tensor(DType::I8, &[1, 1, 3], &[-128.0, -3.0, -4.0])]);
        expect("i8 with pads", &y[0], DType::I8, &[1, 1, 3], &[-128.0, -3.0, -3.0], 0.0);
        let big = (1i64 << 60) + 1;
        let x = crate::tensor::Tensor::from_vec(vec![1, 1, 2], vec![big, big - 1]).unwrap();
        let op = pool(PoolKind::Max, &[2], &[1], &[0, 0], false, false);
        let y = run("i64 beyond 2^53", &op, &[x]);
        assert_eq!(y[0].as_slice::<i64>().unwrap(), &[big]);
    }

    #[test]
    fn avg_pool_matches_hand_values() {
        use PoolKind::Avg;
        let nan = f64::NAN;
        let x5 = || f32s(&[1, 1, 5], &ramp(5));
        check(
            &[
                Case {
                    name: "ceil mode, no pads: the overhang is never counted",
                    op: pool(Avg, &[2], &[2], &[0, 0], true, true),
                    inputs: vec![x5()],
                    want: vec![(vec![1, 1, 3], vec![1.5, 3.5, 5.0])],
                },
                Case {
                    name: "ceil mode, no pads, excluding pads",
                    op: pool(Avg, &[2], &[2], &[0, 0], true, false),
                    inputs: vec![x5()],
                    want: vec![(vec![1, 1, 3], vec![1.5, 3.5, 5.0])],
                },
                Case {
                    name: "pads 1, excluding pads",
                    op: pool(Avg, &[3], &[2], &[1, 1], false, false),
                    inputs: vec![x5()],
                    // Windows [pad,1,2], [2,3,4], [4,5,pad].
                    want: vec![(vec![1, 1, 3], vec![1.5, 3.0, 4.5])],
                },
                Case {
                    name: "pads 1, including pads",
                    op: pool(Avg, &[3], &[2], &[1, 1], false, true),
                    inputs: vec![x5()],
                    want: vec![(vec![1, 1, 3], vec![1.0, 3.0, 3.0])],
                },
                Case {
                    name: "ceil mode with pads, including pads",
                    op: pool(Avg, &[3], &[2], &[1, 1], true, true),
                    inputs: vec![f32s(&[1, 1, 4], &ramp(4))],
                    // Windows [pad,1,2], [2,3,4], [4,pad,overhang]: divisors 3, 3, 2.
                    want: vec![(vec![1, 1, 3], vec![1.0, 3.0, 2.0])],
                },
                Case {
                    name: "ceil mode with pads, excluding pads",
                    op: pool(Avg, &[3], &[2], &[1, 1], true, false),
                    inputs: vec![f32s(&[1, 1, 4], &ramp(4))],
                    want: vec![(vec![1, 1, 3], vec![1.5, 3.0, 4.0])],
                },
                Case {
                    name: "2-d with asymmetric pads, including pads",
                    op: pool(Avg, &[2, 2], &[1, 1], &[1, 0, 0, 0], false, true),
                    inputs: vec![f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0])],
                    // A pad row on top: windows [pad,pad,1,2], [1,2,3,4].
                    want: vec![(vec![1, 1, 2, 1], vec![0.75, 2.5])],
                },
                Case {
                    name: "3-d",
                    op: pool(Avg, &[2, 2, 2], &[1, 1, 1], &[0; 6], false, false),
                    inputs: vec![f64s(&[1, 1, 2, 2, 2], &ramp(8))],
                    want: vec![(vec![1, 1, 1, 1, 1], vec![4.5])],
                },
                Case {
                    name: "NaN propagates",
                    op: pool(Avg, &[2], &[2], &[0, 0], false, false),
                    inputs: vec![f32s(&[1, 1, 4], &[1.0, nan, 3.0, 5.0])],
                    want: vec![(vec![1, 1, 2], vec![nan, 4.0])],
                },
                Case {
                    name: "empty batch",
                    op: pool(Avg, &[2], &[2], &[0, 0], false, false),
                    inputs: vec![f32s(&[0, 1, 4], &[])],
                    want: vec![(vec![0, 1, 2], vec![])],
                },
            ],
            1e-6,
        );
    }

    #[test]
    fn windows_without_real_elements() {
        // An empty input with pads of 2 and a window of 3: two windows, both all padding.
        let cases =
            [(PoolKind::Max, false, f64::NEG_INFINITY), (PoolKind::Avg, true, 0.0), (PoolKind::Avg, false, f64::NAN)];
        for (kind, include_pad, want) in cases {
            let op = pool(kind, &[3], &[1], &[2, 2], false, include_pad);
            let name = format!("{kind:?}, count_include_pad {include_pad}");
            let y = run(&name, &op, &[f32s(&[1, 2, 0], &[])]);
            expect(&name, &y[0], DType::F32, &[1, 2, 2], &[want; 4], 0.0);
        }
    }

    #[test]
    fn avg_pool_rounds_half_types_once() {
        let op = pool(PoolKind::Avg, &[3], &[1], &[0, 0], false, false);
        let y = run("f16", &op, &[tensor(DType::F16, &[1, 1, 3], &[1.0, 2.0, 4.0])]);
        // 7/3 rounded to f16 once.
        expect("f16", &y[0], DType::F16, &[1, 1, 1], &[half::f16::from_f64(7.0 / 3.0).to_f64()], 0.0);
    }

    #[test]
    fn bad_pool_operands_are_errors() {
        let op = pool(PoolKind::Avg, &[2], &[1], &[0, 0], false, false);
        expect_err("avg on ints", &op, &[tensor(DType::I32, &[1, 1, 3], &[1.0; 3])], "float");
        expect_err("rank 2", &op, &[f32s(&[1, 3], &[1.0; 3])], "rank");
        let op = pool(PoolKind::Max, &[4], &[1], &[0, 0], false, false);
        expect_err("window too large", &op, &[f32s(&[1, 1, 3], &[1.0; 3])], "exceeds");
    }
}
