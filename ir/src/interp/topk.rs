//! `top_k`: the `k` best elements along an axis and their indices.
//!
//! Each lane along the axis is sorted by a stable sort on "better than": the value first, then the index, so
//! equal values keep index order, as ONNX specifies. NaN ranks above every number and NaNs tie with each other
//! (ONNX's reference sorts with numpy, which places NaN last in ascending order), so with `largest` NaNs come
//! first and otherwise last. `-0` and `+0` are equal. Values compare in their own type, so i64 stays exact.

use std::cmp::Ordering;

use crate::op::TopK;
use crate::tensor::{Element, Tensor};
use crate::types::{Dim, normalize_axis};

use super::index::split_at_axis;
use super::num::is_nan;

/// `top_k` of `x`: values (same dtype) and i64 indices, with the axis cut to `k` (the value of the operand `k`
/// when there is one, else the attribute, which must be bound by then).
pub fn top_k(t: &TopK, x: &Tensor, k: Option<&Tensor>) -> Result<Vec<Tensor>, String> {
    let shape = x.shape();
    if shape.is_empty() {
        return Err("top_k needs an operand of rank 1 or more".into());
    }
    let axis = normalize_axis(t.axis, shape.len())?;
    let k = match k {
        Some(k) => match (k.data(), &t.k) {
            (crate::tensor::Data::I64(v), Dim::Static(want)) if v.len() == 1 && u64::try_from(v[0]) != Ok(*want) => {
                return Err(format!("the run-time k is {}, but the graph was specialized for k={want}", v[0]));
            }
            (crate::tensor::Data::I64(v), _) if v.len() == 1 => v[0],
            _ => return Err(format!("the run-time k must be one i64 element, got {}", k.tensor_type())),
        },
        None => match &t.k {
            Dim::Static(k) => i64::try_from(*k).unwrap_or(i64::MAX),
            Dim::Sym(s) => return Err(format!("k is the unbound symbol `{s}`")),
        },
    };
    let k = usize::try_from(k)
        .ok()
        .filter(|&k| k <= shape[axis])
        .ok_or_else(|| format!("k={k} is out of range for axis {axis} of extent {}", shape[axis]))?;
    let (outer, n, inner) = split_at_axis(shape, axis);
    let mut out_shape = shape.to_vec();
    out_shape[axis] = k;
    // Positions, in the input, of each result element, in row-major result order.
    let picked = crate::dispatch_data!(x.data(), v => select(v, outer, n, inner, k, t.largest));
    let values = Tensor::new(out_shape.clone(), x.data().gather(picked.iter().map(|&(at, _)| at)))
        .expect("one value per result position");
    let indices = Tensor::from_vec(out_shape, picked.into_iter().map(|(_, j)| j as i64).collect())
        .expect("one index per result position");
    Ok(vec![values, indices])
}

/// For every result position: the input offset and the index along the axis it came from.
fn select<T: Element>(v: &[T], outer: usize, n: usize, inner: usize, k: usize, largest: bool) -> Vec<(usize, usize)> {
    let mut out = vec![(0, 0); outer * k * inner];
    let mut lane: Vec<usize> = Vec::with_capacity(n);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            lane.clear();
            lane.extend(0..n);
            // A stable sort keeps index order among equals.
            lane.sort_by(|&a, &b| {
                let ord = ascending(v[at(a)], v[at(b)]);
                if largest { ord.reverse() } else { ord }
            });
            for (r, &j) in lane[..k].iter().enumerate() {
                out[(o * k + r) * inner + i] = (at(j), j);
            }
        }
    }
    out
}

/// Ascending order with NaN above every number and NaNs equal to each other.
fn ascending<T: PartialOrd + Copy>(a: T, b: T) -> Ordering {
    match (is_nan(a), is_nan(b)) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

#[cfg(test)]
mod tests {
    use crate::op::{Op, TopK};
    use crate::tensor::{Data, Tensor};
    use crate::types::{DType, Dim};

    fn top_k(x: Tensor, axis: i64, k: u64, largest: bool) -> (Tensor, Vec<i64>) {
        let op = Op::TopK(TopK { axis, k: Dim::Static(k), largest, sorted: true });
        let mut out = crate::interp::eval_op(&op, &[&x]).expect("top_k runs");
        let idx = out.pop().expect("indices");
        assert_eq!(idx.dtype(), DType::I64);
        (out.pop().expect("values"), idx.to_i64_vec())
    }

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v.to_vec()).expect("test tensor")
    }

    #[test]
    fn largest_along_last_axis() {
        // Rows [3,1,4,1,5] and [9,2,6,5,3]: the top two are 5,4 (indices 4,2) and 9,6 (0,2).
        let x = f32s(&[2, 5], &[3., 1., 4., 1., 5., 9., 2., 6., 5., 3.]);
        let (v, i) = top_k(x, -1, 2, true);
        assert_eq!(v.shape(), &[2, 2]);
        assert_eq!(v.to_f64_vec(), vec![5., 4., 9., 6.]);
        assert_eq!(i, vec![4, 2, 0, 2]);
    }

    #[test]
    fn smallest_along_first_axis() {
        // Columns of [[3,1],[1,7],[2,0]]: smallest two are 1,2 (rows 1,2) and 0,1 (rows 2,0).
        let x = f32s(&[3, 2], &[3., 1., 1., 7., 2., 0.]);
        let (v, i) = top_k(x, 0, 2, false);
        assert_eq!(v.shape(), &[2, 2]);
        assert_eq!(v.to_f64_vec(), vec![1., 0., 2., 1.]);
        assert_eq!(i, vec![1, 2, 2, 0]);
    }

    #[test]
    fn ties_take_the_lower_index_first_both_ways() {
        let x = f32s(&[5], &[2., 1., 2., 1., 2.]);
        let (v, i) = top_k(x.clone(), 0, 4, true);
        assert_eq!(v.to_f64_vec(), vec![2., 2., 2., 1.]);
        assert_eq!(i, vec![0, 2, 4, 1]);
        let (v, i) = top_k(x, 0, 3, false);
        assert_eq!(v.to_f64_vec(), vec![1., 1., 2.]);
        assert_eq!(i, vec![1, 3, 0]);
    }

    #[test]
    fn nan_ranks_above_every_number() {
        let x = f32s(&[4], &[1., f32::NAN, f32::INFINITY, f32::NAN]);
        let (v, i) = top_k(x.clone(), 0, 3, true);
        assert!(v.to_f64_vec()[..2].iter().all(|f| f.is_nan()));
        assert_eq!(v.to_f64_vec()[2], f64::INFINITY);
        assert_eq!(i, vec![1, 3, 2]);
        let (v, i) = top_k(x, 0, 4, false);
        assert_eq!(&v.to_f64_vec()[..2], &[1., f64::INFINITY]);
        assert_eq!(i, vec![0, 2, 1, 3]);
    }

    #[test]
    fn signed_zeros_are_equal() {
        let x = f32s(&[2], &[-0.0, 0.0]);
        let (_, i) = top_k(x.clone(), 0, 2, true);
        assert_eq!(i, vec![0, 1]);
        let (_, i) = top_k(x, 0, 2, false);
        assert_eq!(i, vec![0, 1]);
    }

    #[test]
    fn i64_compares_exactly() {
        // 2^53 + 1 and 2^53 are equal as f64 but not as i64.
        let big = (1i64 << 53) + 1;
        let x = Tensor::new(vec![3], Data::I64(vec![1 << 53, big, -5])).expect("test tensor");
        let (v, i) = top_k(x, 0, 1, true);
        assert_eq!(v.to_i64_vec(), vec![big]);
        assert_eq!(i, vec![1]);
    }

    #[test]
    fn middle_axis_and_k_zero() {
        // x[1,3,2]: along axis 1, columns [5,1,3] and [0,4,2]; the largest is 5 (row 0) and 4 (row 1).
        let x = f32s(&[1, 3, 2], &[5., 0., 1., 4., 3., 2.]);
        let (v, i) = top_k(x.clone(), 1, 1, true);
        assert_eq!(v.shape(), &[1, 1, 2]);
        assert_eq!(v.to_f64_vec(), vec![5., 4.]);
        assert_eq!(i, vec![0, 1]);
        let (v, i) = top_k(x, 1, 0, true);
        assert_eq!(v.shape(), &[1, 0, 2]);
        assert!(i.is_empty());
    }

    #[test]
    fn bad_k_and_bool_are_errors() {
        let x = f32s(&[3], &[1., 2., 3.]);
        let op = Op::TopK(TopK { axis: 0, k: Dim::Static(4), largest: true, sorted: true });
        assert!(crate::interp::eval_op(&op, &[&x]).is_err(), "k=4");
        // A run-time k out of range, of the wrong type or unbound is an error too.
        let at_run_time = Op::TopK(TopK { axis: 0, k: Dim::sym("tk"), largest: true, sorted: true });
        for k in [Tensor::from_vec(vec![1], vec![-1i64]), Tensor::from_vec(vec![1], vec![4i64])] {
            let k = k.expect("test tensor");
            let err = crate::interp::eval_op(&at_run_time, &[&x, &k]).unwrap_err();
            assert!(err.contains("out of range"), "{err}");
        }
        let wrong = Tensor::from_vec(vec![2], vec![1i64, 2]).expect("test tensor");
        assert!(crate::interp::eval_op(&at_run_time, &[&x, &wrong]).is_err());
        assert!(crate::interp::eval_op(&at_run_time, &[&x]).unwrap_err().contains("unbound"));
        let b = Tensor::new(vec![2], Data::Bool(vec![true, false])).expect("test tensor");
        let op = Op::TopK(TopK { axis: 0, k: Dim::Static(1), largest: true, sorted: true });
        assert!(crate::interp::eval_op(&op, &[&b]).is_err());
    }

    #[test]
    fn a_run_time_k_sizes_the_results() {
        let x = f32s(&[2, 4], &[1., 7., 3., 5., 8., 2., 6., 4.]);
        let op = Op::TopK(TopK { axis: 1, k: Dim::sym("tk"), largest: false, sorted: true });
        let k = Tensor::from_vec(vec![1], vec![3i64]).expect("test tensor");
        let out = crate::interp::eval_op(&op, &[&x, &k]).expect("top_k runs");
        assert_eq!(out[0].shape(), &[2, 3]);
        assert_eq!(out[0].to_f64_vec(), vec![1., 3., 5., 2., 4., 6.]);
        assert_eq!(out[1].as_slice::<i64>().expect("i64"), &[0, 2, 3, 1, 3, 2]);
        // The data-dependent entry point (what the runtimes call) agrees.
        let views = [x.view(), k.view()];
        assert_eq!(crate::interp::data_dependent(&op, &views).expect("runs"), out);
    }
}
