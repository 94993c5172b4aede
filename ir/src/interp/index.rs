//! Index arithmetic shared by the interpreter's kernels: row-major iteration over a shape, numpy broadcasting as
//! maps from result positions to operand offsets, and the outer × axis × inner split used by axis ops.
//!
//! Every helper takes static extents (`&[usize]`) and works for zero-size dims (nothing is visited) and for
//! scalars (one empty index is visited). Offsets are row-major element offsets, as [`Tensor`](crate::Tensor)
//! stores data. These are shared by every interpreter file, including the neural-net ops, and are kept stable.

use crate::types::broadcast_static;

/// Calls `f` with every multi-index of `shape` in row-major order (last dim fastest), stopping at the first
/// error. A shape with a zero dim has no indices; the scalar shape has one, `[]`.
pub(super) fn try_for_each_index<E>(shape: &[usize], mut f: impl FnMut(&[usize]) -> Result<(), E>) -> Result<(), E> {
    if shape.contains(&0) {
        return Ok(());
    }
    let mut idx = vec![0usize; shape.len()];
    loop {
        f(&idx)?;
        // Odometer increment from the last dim.
        let mut d = shape.len();
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Calls `f` with every multi-index of `shape` in row-major order; see [`try_for_each_index`].
pub(super) fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    let never: Result<(), std::convert::Infallible> = try_for_each_index(shape, |i| {
        f(i);
        Ok(())
    });
    let Ok(()) = never;
}

/// The product of extents, 0 when any is 0. Saturates instead of overflowing, so a zero-size tensor whose
/// other dims multiply past `usize` (`[0, 2^40, 2^40]`) is harmless; for a tensor that has elements the product
/// divides its element count and is exact.
pub(super) fn extent_product<'a>(dims: impl IntoIterator<Item = &'a usize>) -> usize {
    dims.into_iter().fold(1usize, |acc, &d| acc.saturating_mul(d))
}

/// Row-major strides of `shape`, computed with [`extent_product`] so zero-size shapes never overflow.
pub(super) fn strides(shape: &[usize]) -> Vec<usize> {
    (0..shape.len()).map(|d| extent_product(&shape[d + 1..])).collect()
}

/// The dot product of an index with strides: a row-major offset.
pub(super) fn offset(idx: &[usize], strides: &[usize]) -> usize {
    idx.iter().zip(strides).map(|(i, s)| i * s).sum()
}

/// The element count of `shape`, or an error if multiplying its extents in order overflows `usize` (as
/// [`Tensor::new`](crate::Tensor::new) does; such a shape cannot be built even when a later extent is 0).
pub(super) fn element_count(shape: &[usize]) -> Result<usize, String> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("a tensor of shape {shape:?} has too many elements"))
}

/// Strides of an operand of shape `from` read at the positions of the broadcast shape `to`: aligned on the
/// right, 0 for dims that `from` lacks or that are 1 there (so they repeat). Errors if `from` does not
/// broadcast to `to`.
pub(super) fn broadcast_strides(from: &[usize], to: &[usize]) -> Result<Vec<usize>, String> {
    if from.len() > to.len() {
        return Err(format!("shape {from:?} has more dims than the broadcast shape {to:?}"));
    }
    let lead = to.len() - from.len();
    let own = strides(from);
    let mut out = vec![0usize; to.len()];
    for (d, &n) in from.iter().enumerate() {
        if n == to[lead + d] {
            out[lead + d] = if n == 1 { 0 } else { own[d] };
        } else if n != 1 {
            return Err(format!("shape {from:?} does not broadcast to {to:?}"));
        }
    }
    Ok(out)
}

/// For every position of `to` in row-major order, the offset of the element of an operand of shape `from` that
/// numpy broadcasting reads there.
pub(super) fn broadcast_offsets(from: &[usize], to: &[usize]) -> Result<Vec<usize>, String> {
    let strides = broadcast_strides(from, to)?;
    let mut out = Vec::with_capacity(element_count(to)?);
    for_each_index(to, |i| out.push(offset(i, &strides)));
    Ok(out)
}

/// The numpy broadcast of several static shapes, or an error naming them.
pub(super) fn broadcast_shapes(shapes: &[&[usize]]) -> Result<Vec<usize>, String> {
    let mut out: Vec<usize> = Vec::new();
    for s in shapes {
        out = broadcast_static(&out, s).ok_or_else(|| {
            let all: Vec<String> = shapes.iter().map(|s| format!("{s:?}")).collect();
            format!("shapes {} do not broadcast", all.join(", "))
        })?;
    }
    Ok(out)
}

/// Splits `shape` around `axis` into (product of the dims before it, its extent, product of the dims after it).
/// The axis must be in range.
pub(super) fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (extent_product(&shape[..axis]), shape[axis], extent_product(&shape[axis + 1..]))
}

/// Resolves a possibly negative index against an axis of extent `n` (`-1` is the last element), or explains
/// why it is out of range.
pub fn resolve_index(i: i64, n: usize, axis: usize) -> Result<usize, String> {
    let n_i = n as i64;
    let r = if i < 0 { i + n_i } else { i };
    if (0..n_i).contains(&r) {
        Ok(r as usize)
    } else {
        Err(format!("index {i} is out of range for axis {axis} of extent {n}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iteration_order_and_edge_shapes() {
        let mut seen = Vec::new();
        for_each_index(&[2, 3], |i| seen.push(i.to_vec()));
        assert_eq!(seen, vec![vec![0, 0], vec![0, 1], vec![0, 2], vec![1, 0], vec![1, 1], vec![1, 2]]);
        let mut n = 0;
        for_each_index(&[], |i| {
            assert!(i.is_empty());
            n += 1;
        });
        assert_eq!(n, 1);
        for_each_index(&[3, 0, 2], |_| panic!("a zero-size shape has no indices"));
    }

    #[test]
    fn broadcasting_maps() {
        assert_eq!(broadcast_offsets(&[3], &[2, 3]).unwrap(), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_offsets(&[2, 1], &[2, 3]).unwrap(), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(broadcast_offsets(&[], &[2]).unwrap(), vec![0, 0]);
        assert!(broadcast_offsets(&[2], &[3]).is_err());
        assert!(broadcast_offsets(&[2, 2], &[2]).is_err());
        assert_eq!(broadcast_shapes(&[&[2, 1], &[3], &[]]).unwrap(), vec![2, 3]);
        assert!(broadcast_shapes(&[&[2], &[3]]).is_err());
    }

    #[test]
    fn axis_helpers() {
        assert_eq!(split_at_axis(&[2, 3, 4], 1), (2, 3, 4));
        assert_eq!(resolve_index(-1, 3, 0), Ok(2));
        assert!(resolve_index(3, 3, 0).is_err());
        assert!(resolve_index(-4, 3, 0).is_err());
        assert!(element_count(&[usize::MAX, 2]).is_err());
        assert_eq!(element_count(&[0, usize::MAX, 2]), Ok(0));
        assert_eq!(strides(&[0, usize::MAX, 2]), vec![usize::MAX, 2, 1]);
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(extent_product(&[usize::MAX, 2, 0]), 0);
    }
}
