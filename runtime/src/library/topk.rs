//! `top_k` on f32 lanes: the `k` best elements along an axis, sorted, with their i64 indices — the reference
//! interpreter's order (`kiln_ir::interp`, `topk.rs`): value first (NaN above every number, NaNs equal, `-0 == +0`),
//! then the lower index first among equals. A selection puts the `k` best of each lane first, then only those
//! are sorted; with the index as the tie-break the order is total, so the result is the interpreter's exactly.

use std::cmp::Ordering;

use kiln_ir::op::TopK;

use super::LibraryError;

const OP: &str = "top_k";

/// Ascending order with NaN above every number and NaNs equal.
fn ascending(a: f32, b: f32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// `values` and `indices` (the axis cut to `k`) of `x` with `shape`. A symbolic `k` is read off the length of
/// `values`.
pub fn top_k_f32(
    t: &TopK,
    x: &[f32],
    shape: &[usize],
    values: &mut [f32],
    indices: &mut [i64],
) -> Result<(), LibraryError> {
    if shape.is_empty() {
        return Err(LibraryError::shape(OP, "needs an operand of rank 1 or more"));
    }
    let axis = kiln_ir::types::normalize_axis(t.axis, shape.len()).map_err(|e| LibraryError::shape(OP, e))?;
    let n = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    // A symbolic `k` is bound by the time the routine runs: the results' length says what it is.
    let k = match t.k.as_static() {
        Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        None => values.len().checked_div(outer * inner).unwrap_or(0),
    };
    if k > n {
        return Err(LibraryError::shape(OP, format!("k={k} is out of range for axis {axis} of extent {n}")));
    }
    if x.len() != outer * n * inner || values.len() != outer * k * inner || indices.len() != values.len() {
        return Err(LibraryError::shape(OP, "operand or result lengths do not fit the shape and k"));
    }
    if k == 0 {
        return Ok(());
    }
    let mut lane: Vec<usize> = Vec::with_capacity(n);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            let better = |&a: &usize, &b: &usize| {
                let ord = ascending(x[at(a)], x[at(b)]);
                (if t.largest { ord.reverse() } else { ord }).then(a.cmp(&b))
            };
            lane.clear();
            lane.extend(0..n);
            if k < n {
                lane.select_nth_unstable_by(k - 1, better);
            }
            lane[..k].sort_unstable_by(better);
            for (r, &j) in lane[..k].iter().enumerate() {
                let out = (o * k + r) * inner + i;
                values[out] = x[at(j)];
                indices[out] = j as i64;
            }
        }
    }
    Ok(())
}
