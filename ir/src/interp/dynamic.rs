//! Ops whose result extents depend on the operands' values: `non_zero`, `unique`, `non_max_suppression`, and
//! `top_k` with a run-time `k`. Each result type names its data-dependent dim (the op's `count` symbol, or
//! `top_k`'s `k`), bound when the op runs.
//!
//! The functions take borrowed views, so the compiled backends' library routines for these ops
//! ([`data_dependent`]) are this code, not a copy of it.

use std::cmp::Ordering;

use crate::op::{NonMaxSuppression, Op, Unique};
use crate::tensor::{Element, Tensor, TensorView};
use crate::types::{DType, normalize_axis};

use super::index::split_at_axis;

/// Runs a data-dependent op (one whose type rule gives a `count` symbol) on borrowed operands.
pub fn data_dependent(op: &Op, inputs: &[TensorView<'_>]) -> Result<Vec<Tensor>, String> {
    let operand = |i: usize| inputs.get(i).copied().ok_or_else(|| format!("{} needs operand {i}", op.mnemonic()));
    match op {
        Op::NonZero(_) => Ok(vec![non_zero(operand(0)?)]),
        Op::Unique(u) => unique(u, &operand(0)?.to_tensor()),
        Op::NonMaxSuppression(n) => Ok(vec![non_max_suppression(n, inputs)?]),
        Op::TopK(t) => {
            let k = inputs.get(1).map(TensorView::to_tensor);
            super::topk::top_k(t, &operand(0)?.to_tensor(), k.as_ref())
        }
        other => Err(format!("{} has no data-dependent extent", other.mnemonic())),
    }
}

/// `non_zero`: the row-major indices of the nonzero elements of `x` as an i64 `[rank, count]` tensor. An element
/// is zero when its bytes are (for floats: apart from the sign bit, so `-0` is zero and NaN is not).
pub fn non_zero(x: TensorView<'_>) -> Tensor {
    let (shape, bytes) = (x.shape(), x.as_bytes());
    let size = x.dtype().size_bytes();
    let float = x.dtype().is_float();
    let is_nonzero = |e: &[u8]| match e.split_last() {
        Some((&top, low)) => low.iter().any(|&b| b != 0) || (if float { top & 0x7F } else { top }) != 0,
        None => false,
    };
    let positions: Vec<usize> =
        bytes.chunks_exact(size.max(1)).enumerate().filter(|(_, e)| is_nonzero(e)).map(|(i, _)| i).collect();
    let rank = shape.len();
    let count = positions.len();
    let mut out = vec![0i64; rank * count];
    for (j, &p) in positions.iter().enumerate() {
        let mut rest = p;
        for d in (0..rank).rev() {
            out[d * count + j] = (rest % shape[d]) as i64;
            rest /= shape[d];
        }
    }
    Tensor::from_vec(vec![rank, count], out).expect("rank * count elements")
}

/// A total order for sorting values: `partial_cmp`, with NaN above every number and equal to NaN.
fn total<T: PartialOrd>(a: &T, b: &T) -> Ordering {
    #[allow(clippy::eq_op)]
    a.partial_cmp(b).unwrap_or_else(|| (a != a).cmp(&(b != b)))
}

/// `unique`: the distinct slices of `x` along `axis` (or its distinct elements when `flatten`), with the index of
/// each one's first occurrence, each position's group (the inverse) and each group's count. See the op's docs.
pub fn unique(u: &Unique, x: &Tensor) -> Result<Vec<Tensor>, String> {
    let shape = x.shape();
    let axis = if u.flatten { None } else { Some(normalize_axis(u.axis, shape.len())?) };
    let (outer, n, inner) = match axis {
        Some(a) => split_at_axis(shape, a),
        None => (1, x.len(), 1),
    };
    let order = crate::dispatch_data!(x.data(), v => group_order(v, outer, n, inner));
    // Groups of equal slices, each in index order (the sort is stable), listed in sorted order.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &i in &order {
        match groups.last_mut() {
            Some(g) if crate::dispatch_data!(x.data(), v => slices_equal(v, outer, n, inner, g[0], i)) => g.push(i),
            _ => groups.push(vec![i]),
        }
    }
    if !u.sorted {
        groups.sort_by_key(|g| g[0]);
    }
    let mut inverse = vec![0i64; n];
    for (k, g) in groups.iter().enumerate() {
        for &i in g {
            inverse[i] = k as i64;
        }
    }
    let firsts: Vec<usize> = groups.iter().map(|g| g[0]).collect();
    // Row-major order of the result: outer, then group, then inner.
    let mut elements = Vec::with_capacity(outer * firsts.len() * inner);
    for o in 0..outer {
        for &i in &firsts {
            elements.extend((0..inner).map(|k| (o * n + i) * inner + k));
        }
    }
    let y_shape = match axis {
        Some(a) => {
            let mut s = shape.to_vec();
            s[a] = firsts.len();
            s
        }
        None => vec![firsts.len()],
    };
    let y = Tensor::new(y_shape, x.data().gather(elements.into_iter())).map_err(|e| e.to_string())?;
    let indices = firsts.iter().map(|&i| i as i64).collect::<Vec<_>>();
    let counts = groups.iter().map(|g| g.len() as i64).collect::<Vec<_>>();
    let vec1 = |v: Vec<i64>| Tensor::from_vec(vec![v.len()], v).expect("a vector");
    Ok(vec![y, vec1(indices), vec1(inverse), vec1(counts)])
}

/// The slice indices `0..n` stably sorted by their slices' values (lexicographically, outer then inner).
fn group_order<T: Element>(v: &[T], outer: usize, n: usize, inner: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        for o in 0..outer {
            for k in 0..inner {
                let c = total(&v[(o * n + a) * inner + k], &v[(o * n + b) * inner + k]);
                if c != Ordering::Equal {
                    return c;
                }
            }
        }
        Ordering::Equal
    });
    order
}

fn slices_equal<T: Element>(v: &[T], outer: usize, n: usize, inner: usize, a: usize, b: usize) -> bool {
    (0..outer).all(|o| (0..inner).all(|k| total(&v[(o * n + a) * inner + k], &v[(o * n + b) * inner + k]).is_eq()))
}

/// `non_max_suppression` (ONNX semantics, as ONNX's reference and ONNX Runtime compute it, in f32): per batch
/// and class, the boxes whose score exceeds the threshold (all, without one), best score first (the lower box
/// index first on ties), each kept unless its IoU with a box already kept for the class exceeds the IoU
/// threshold, at most `max_output_boxes_per_class` of them. Result: i64 `[count, 3]` rows of
/// `(batch, class, box)`.
pub fn non_max_suppression(n: &NonMaxSuppression, inputs: &[TensorView<'_>]) -> Result<Tensor, String> {
    let f32s = |i: usize, what: &str| -> Result<Vec<f32>, String> {
        let t = inputs.get(i).ok_or_else(|| format!("`{what}` is missing"))?.to_tensor();
        t.as_slice::<f32>().map(<[f32]>::to_vec).ok_or_else(|| format!("`{what}` must be f32, got {}", t.dtype()))
    };
    let (boxes, scores) = (f32s(0, "boxes")?, f32s(1, "scores")?);
    let (bd, sd) = (inputs[0].shape(), inputs[1].shape());
    if bd.len() != 3 || bd[2] != 4 || sd.len() != 3 || bd[0] != sd[0] || bd[1] != sd[2] {
        return Err(format!(
            "boxes {bd:?} and scores {sd:?} must be [batches, boxes, 4] and [batches, classes, boxes]"
        ));
    }
    let scalar = |i: usize| inputs.get(i).filter(|t| t.shape().iter().product::<usize>() > 0).map(|t| t.to_tensor());
    let max_out = match scalar(2) {
        Some(t) if t.dtype() == DType::I64 => t.to_i64_vec()[0].max(0) as usize,
        Some(t) => return Err(format!("`max_output_boxes_per_class` must be i64, got {}", t.dtype())),
        None => 0,
    };
    let iou = scalar(3).map(|t| t.to_f64_vec()[0] as f32).unwrap_or(0.0);
    let score_threshold = scalar(4).map(|t| t.to_f64_vec()[0] as f32);
    let (batches, num_boxes, classes) = (bd[0], bd[1], sd[1]);
    let mut out: Vec<i64> = Vec::new();
    for b in 0..batches {
        let bx = &boxes[b * num_boxes * 4..(b + 1) * num_boxes * 4];
        let corners: Vec<[f32; 4]> =
            (0..num_boxes).map(|i| corners(&bx[i * 4..i * 4 + 4], n.center_point_box)).collect();
        for c in 0..classes {
            let sc = &scores[(b * classes + c) * num_boxes..(b * classes + c + 1) * num_boxes];
            let mut candidates: Vec<usize> =
                (0..num_boxes).filter(|&i| score_threshold.is_none_or(|t| sc[i] > t)).collect();
            candidates.sort_by(|&i, &j| total(&sc[j], &sc[i]).then(i.cmp(&j)));
            let mut kept: Vec<usize> = Vec::new();
            for i in candidates {
                if kept.len() >= max_out {
                    break;
                }
                if kept.iter().all(|&k| !suppresses(&corners[i], &corners[k], iou)) {
                    kept.push(i);
                    out.extend([b as i64, c as i64, i as i64]);
                }
            }
        }
    }
    Tensor::from_vec(vec![out.len() / 3, 3], out).map_err(|e| e.to_string())
}

/// A box as `[x_min, x_max, y_min, y_max]`: from `[y1, x1, y2, x2]` (any two opposite corners) or, with
/// `center`, `[x_center, y_center, width, height]`.
fn corners(b: &[f32], center: bool) -> [f32; 4] {
    if center {
        let (hw, hh) = (b[2] / 2.0, b[3] / 2.0);
        [b[0] - hw, b[0] + hw, b[1] - hh, b[1] + hh]
    } else {
        [b[1].min(b[3]), b[1].max(b[3]), b[0].min(b[2]), b[0].max(b[2])]
    }
}

/// Whether two boxes overlap by more than `threshold` (intersection over union), as ONNX's reference decides:
/// boxes that do not overlap, or have no area, never suppress.
fn suppresses(a: &[f32; 4], b: &[f32; 4], threshold: f32) -> bool {
    let (ix0, ix1) = (a[0].max(b[0]), a[1].min(b[1]));
    if ix1 <= ix0 {
        return false;
    }
    let (iy0, iy1) = (a[2].max(b[2]), a[3].min(b[3]));
    if iy1 <= iy0 {
        return false;
    }
    let inter = (ix1 - ix0) * (iy1 - iy0);
    let area_a = (a[1] - a[0]) * (a[3] - a[2]);
    let area_b = (b[1] - b[0]) * (b[3] - b[2]);
    let union = area_a + area_b - inter;
    if inter <= 0.0 || area_a <= 0.0 || area_b <= 0.0 || union <= 0.0 {
        return false;
    }
    inter / union > threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_groups_sorted_and_by_first_occurrence() {
        let x = Tensor::from_vec(vec![6], vec![2.0f32, 1.0, 1.0, 3.0, 4.0, 3.0]).unwrap();
        let u = |sorted| Unique { axis: 0, flatten: true, sorted, count: "u".into() };
        let r = unique(&u(true), &x).unwrap();
        assert_eq!(r[0].to_f64_vec(), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(r[1].to_i64_vec(), vec![1, 0, 3, 4]);
        assert_eq!(r[2].to_i64_vec(), vec![1, 0, 0, 2, 3, 2]);
        assert_eq!(r[3].to_i64_vec(), vec![2, 1, 2, 1]);
        let r = unique(&u(false), &x).unwrap();
        assert_eq!(r[0].to_f64_vec(), vec![2.0, 1.0, 3.0, 4.0]);
        assert_eq!(r[2].to_i64_vec(), vec![0, 1, 1, 2, 3, 2]);
    }

    #[test]
    fn unique_along_an_axis_compares_whole_slices() {
        let x = Tensor::from_vec(vec![3, 2], vec![1i64, 0, 1, 0, 0, 5]).unwrap();
        let r = unique(&Unique { axis: 0, flatten: false, sorted: true, count: "u".into() }, &x).unwrap();
        assert_eq!(r[0].shape(), &[2, 2]);
        assert_eq!(r[0].to_i64_vec(), vec![0, 5, 1, 0]);
        assert_eq!(r[2].to_i64_vec(), vec![1, 1, 0]);
    }

    #[test]
    fn non_zero_treats_negative_zero_as_zero_and_nan_as_nonzero() {
        let x = Tensor::from_vec(vec![2, 2], vec![-0.0f32, f32::NAN, 0.0, 2.0]).unwrap();
        assert_eq!(non_zero(x.view()).to_i64_vec(), vec![0, 1, 1, 1]);
    }

    #[test]
    fn nms_keeps_the_best_of_overlapping_boxes() {
        let boxes =
            Tensor::from_vec(vec![1, 3, 4], vec![0.0f32, 0.0, 1.0, 1.0, 0.0, 0.1, 1.0, 1.1, 0.0, 5.0, 1.0, 6.0])
                .unwrap();
        let scores = Tensor::from_vec(vec![1, 1, 3], vec![0.5f32, 0.9, 0.3]).unwrap();
        let max = Tensor::scalar(5i64);
        let iou = Tensor::scalar(0.5f32);
        let n = NonMaxSuppression { center_point_box: false, count: "n".into() };
        let r = non_max_suppression(&n, &[boxes.view(), scores.view(), max.view(), iou.view()]).unwrap();
        assert_eq!(r.shape(), &[2, 3]);
        assert_eq!(r.to_i64_vec(), vec![0, 0, 1, 0, 0, 2]);
    }
}
