//! Data movement: reshape, transpose, broadcast, slice, concat, split, pad, gather, gather_elements, scatter,
//! and the value-producing ops iota, shape_of and constant.
//!
//! Most ops here compute, for each result position, the offset of the source element it copies, then gather;
//! they work for every dtype. Indices (gather, gather_elements, scatter) may be i32 or i64, count from the end
//! when negative, and are an error when out of range. Attributes were validated by the op's type rule before
//! these run (see [`eval_op`](super::eval_op)); shapes in attributes must be static by then.

use crate::op::{Concat, Gather, GatherElements, Iota, Pad, PadMode, Scatter, ScatterReduction, Slice, Split};
use crate::tensor::{Data, Element, Tensor};
use crate::types::{DType, Shape, normalize_axis};

use super::elementwise::{int_binary, real_binary, same_dtype};
use super::index::{broadcast_offsets, element_count, for_each_index, offset, resolve_index, split_at_axis, strides};
use super::num::{FloatElem, IntElem, by_family, from_f64_rounded};
use crate::op::BinaryOp;

/// The static extents of an attribute shape, or an error naming the unbound symbol.
pub(super) fn static_shape(s: &Shape, what: &str) -> Result<Vec<usize>, String> {
    let dims = s.as_static().ok_or_else(|| format!("{what} {s} has an unbound symbolic dim"))?;
    element_count(&dims)?;
    Ok(dims)
}

/// A tensor of `x`'s dtype holding `x`'s elements at `offsets`, in that order.
fn gather_offsets(x: &Tensor, shape: Vec<usize>, offsets: impl Iterator<Item = usize>) -> Tensor {
    Tensor::new(shape, x.data().gather(offsets)).expect("one offset per result position")
}

/// Same elements in a new shape (row-major order).
pub(super) fn reshape(x: &Tensor, target: &Shape) -> Result<Tensor, String> {
    let dims = static_shape(target, "reshape target")?;
    x.clone().reshaped(dims).map_err(|e| e.to_string())
}

/// `out.shape[i] = in.shape[perm[i]]`.
pub(super) fn transpose(x: &Tensor, perm: &[i64]) -> Result<Tensor, String> {
    let rank = x.shape().len();
    let perm: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
    if perm.len() != rank || (0..rank).any(|d| !perm.contains(&d)) {
        return Err(format!("perm {perm:?} is not a permutation of 0..{rank}"));
    }
    let in_strides = strides(x.shape());
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let mut offsets = Vec::with_capacity(x.len());
    for_each_index(&shape, |i| offsets.push(offset(i, &strides)));
    Ok(gather_offsets(x, shape, offsets.into_iter()))
}

/// numpy broadcast to `target`.
pub(super) fn broadcast(x: &Tensor, target: &Shape) -> Result<Tensor, String> {
    let dims = static_shape(target, "broadcast target")?;
    let offsets = broadcast_offsets(x.shape(), &dims)?;
    Ok(gather_offsets(x, dims, offsets.into_iter()))
}

/// ONNX slice; ranges come from [`slice_range`](crate::infer::slice_range), so they match the type rule.
pub(super) fn slice(x: &Tensor, s: &Slice) -> Result<Tensor, String> {
    let rank = x.shape().len();
    let k = s.axes.len();
    if s.starts.len() != k || s.ends.len() != k || s.steps.len() != k {
        return Err("starts, ends, axes and steps must have one entry per sliced axis".into());
    }
    // Per dim: (first index, step, count).
    let mut ranges: Vec<(i64, i64, usize)> = x.shape().iter().map(|&n| (0, 1, n)).collect();
    for i in 0..k {
        let axis = normalize_axis(s.axes[i], rank)?;
        if s.steps[i] == 0 {
            return Err("slice steps must be nonzero".into());
        }
        let (start, step, count) =
            crate::infer::slice_range(s.starts[i], s.ends[i], s.steps[i], x.shape()[axis] as i64);
        ranges[axis] = (start, step, count as usize);
    }
    let shape: Vec<usize> = ranges.iter().map(|r| r.2).collect();
    let strides = strides(x.shape());
    let mut offsets = Vec::with_capacity(element_count(&shape)?);
    for_each_index(&shape, |idx| {
        let o = idx.iter().zip(&ranges).zip(&strides).map(|((&i, r), s)| (r.0 + i as i64 * r.1) as usize * s).sum();
        offsets.push(o);
    });
    Ok(gather_offsets(x, shape, offsets.into_iter()))
}

/// Joins operands along an axis.
pub(super) fn concat(inputs: &[&Tensor], c: &Concat) -> Result<Tensor, String> {
    let first = inputs.first().ok_or("concat needs at least one operand")?;
    let rank = first.shape().len();
    if rank == 0 {
        return Err("cannot concatenate scalars".into());
    }
    let axis = normalize_axis(c.axis, rank)?;
    for (i, t) in inputs.iter().enumerate() {
        let same_other_dims =
            t.shape().len() == rank && (0..rank).all(|d| d == axis || t.shape()[d] == first.shape()[d]);
        if t.dtype() != first.dtype() || !same_other_dims {
            return Err(format!("operand {i} is {}, but operand 0 is {}", t.tensor_type(), first.tensor_type()));
        }
    }
    let mut shape = first.shape().to_vec();
    shape[axis] = inputs.iter().map(|t| t.shape()[axis]).sum();
    let (outer, _, inner) = split_at_axis(first.shape(), axis);
    let data = crate::dispatch_data!(first.data(), v0 => {
        let parts = inputs.iter().map(|t| same_dtype(v0, t)).collect::<Result<Vec<_>, _>>()?;
        let mut out = Vec::with_capacity(element_count(&shape)?);
        for o in 0..outer {
            for (t, v) in inputs.iter().zip(&parts) {
                let block = t.shape()[axis] * inner;
                out.extend_from_slice(&v[o * block..(o + 1) * block]);
            }
        }
        Element::wrap(out)
    });
    Ok(Tensor::new(shape, data).expect("concat preserves the element count"))
}

/// Splits along an axis into pieces of `sizes`.
pub(super) fn split(x: &Tensor, s: &Split) -> Result<Vec<Tensor>, String> {
    let axis = normalize_axis(s.axis, x.shape().len())?;
    let (outer, n, inner) = split_at_axis(x.shape(), axis);
    if s.sizes.iter().any(|&k| k < 0) || s.sizes.iter().sum::<i64>() != n as i64 {
        return Err(format!("sizes {:?} do not add up to the axis extent {n}", s.sizes));
    }
    let mut start = 0;
    let mut out = Vec::with_capacity(s.sizes.len());
    for &size in &s.sizes {
        let size = size as usize;
        let mut shape = x.shape().to_vec();
        shape[axis] = size;
        let offsets = (0..outer).flat_map(|o| (0..size * inner).map(move |r| o * n * inner + start * inner + r));
        out.push(gather_offsets(x, shape, offsets));
        start += size;
    }
    Ok(out)
}

/// Constant, reflect or edge padding; negative pads crop.
pub(super) fn pad(x: &Tensor, p: &Pad) -> Result<Tensor, String> {
    let rank = x.shape().len();
    if p.pads.len() != 2 * rank {
        return Err(format!("pads has {} entries; rank {rank} needs {}", p.pads.len(), 2 * rank));
    }
    // i128 arithmetic: extents and pads anywhere in i64 range cannot overflow.
    let mut shape = Vec::with_capacity(rank);
    for d in 0..rank {
        let n = x.shape()[d] as i128 + p.pads[d] as i128 + p.pads[d + rank] as i128;
        let n = usize::try_from(n).map_err(|_| format!("padding dim {d} by {n} leaves no valid extent"))?;
        shape.push(n);
    }
    let strides = strides(x.shape());
    // Per result position, the source offset, or None where the constant fills in.
    let mut sources: Vec<Option<usize>> = Vec::with_capacity(element_count(&shape)?);
    let mut bad = None;
    for_each_index(&shape, |idx| {
        let mut off = Some(0);
        for d in 0..rank {
            let n = x.shape()[d] as i128;
            let i = idx[d] as i128 - p.pads[d] as i128;
            let src = match p.mode {
                PadMode::Constant => (0..n).contains(&i).then_some(i),
                PadMode::Edge if n > 0 => Some(i.clamp(0, n - 1)),
                PadMode::Wrap if n > 0 => Some(i.rem_euclid(n)),
                PadMode::Reflect if n > 1 => Some(reflect(i, n)),
                PadMode::Reflect if n == 1 && i == 0 => Some(0),
                _ => {
                    bad = Some(d);
                    Some(0)
                }
            };
            off = match (off, src) {
                (Some(o), Some(i)) => Some(o + i as usize * strides[d]),
                _ => None,
            };
        }
        sources.push(off);
    });
    if let Some(d) = bad {
        return Err(format!("{} padding of dim {d} (extent {}) has nothing to copy", p.mode.name(), x.shape()[d]));
    }
    let data = crate::dispatch_data!(x.data(), v => {
        let fill = value_as(v, p.value);
        Element::wrap(sources.iter().map(|s| s.map_or(fill, |o| v[o])).collect::<Vec<_>>())
    });
    Ok(Tensor::new(shape, data).expect("one result per padded position"))
}

/// Mirrors `i` into `0..n` without repeating the edges (period `2(n-1)`), for `n > 1`.
fn reflect(i: i128, n: i128) -> i128 {
    let period = 2 * (n - 1);
    let r = i.rem_euclid(period);
    if r < n { r } else { period - r }
}

/// `v` converted as `cast` converts an f64, typed like the elements of a slice.
fn value_as<T: Element>(_: &[T], v: f64) -> T {
    from_f64_rounded(v)
}

/// The indices of a gather or scatter as i64, which must be i32 or i64.
fn index_values(t: &Tensor) -> Result<Vec<i64>, String> {
    match t.dtype() {
        DType::I32 | DType::I64 => Ok(t.to_i64_vec()),
        d => Err(format!("indices must be i32 or i64, got {d}")),
    }
}

/// numpy `take` along an axis: the result is `data.shape[..axis] ++ indices.shape ++ data.shape[axis+1..]`.
pub(super) fn gather(data: &Tensor, indices: &Tensor, g: &Gather) -> Result<Tensor, String> {
    if data.shape().is_empty() {
        return Err("cannot gather from a scalar".into());
    }
    let axis = normalize_axis(g.axis, data.shape().len())?;
    let (outer, n, inner) = split_at_axis(data.shape(), axis);
    let idx = index_values(indices)?.into_iter().map(|i| resolve_index(i, n, axis)).collect::<Result<Vec<_>, _>>()?;
    let mut shape = data.shape()[..axis].to_vec();
    shape.extend_from_slice(indices.shape());
    shape.extend_from_slice(&data.shape()[axis + 1..]);
    let offsets =
        (0..outer).flat_map(|o| idx.iter().flat_map(move |&i| (0..inner).map(move |r| (o * n + i) * inner + r)));
    Ok(gather_offsets(data, shape, offsets))
}

/// For each position of `indices` (row-major), the data offset it addresses: the position itself with the
/// `axis` coordinate replaced by the index value. Shared by gather_elements and scatter.
fn element_targets(data: &Tensor, indices: &Tensor, axis_attr: i64) -> Result<Vec<usize>, String> {
    let rank = data.shape().len();
    if indices.shape().len() != rank || rank == 0 {
        return Err(format!("indices {:?} must have the data's rank ({:?})", indices.shape(), data.shape()));
    }
    let axis = normalize_axis(axis_attr, rank)?;
    for d in (0..rank).filter(|&d| d != axis) {
        if indices.shape()[d] > data.shape()[d] {
            return Err(format!(
                "indices {:?} exceed the data {:?} on dim {d}, which is not the axis",
                indices.shape(),
                data.shape()
            ));
        }
    }
    let values = index_values(indices)?;
    let strides = strides(data.shape());
    let mut out = Vec::with_capacity(values.len());
    let mut pos = 0;
    let mut err = None;
    for_each_index(indices.shape(), |idx| {
        if err.is_some() {
            return;
        }
        match resolve_index(values[pos], data.shape()[axis], axis) {
            Ok(i) => out.push(offset(idx, &strides) - idx[axis] * strides[axis] + i * strides[axis]),
            Err(e) => err = Some(e),
        }
        pos += 1;
    });
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// `out[p] = data[p with p[axis] = indices[p]]`.
pub(super) fn gather_elements(data: &Tensor, indices: &Tensor, g: &GatherElements) -> Result<Tensor, String> {
    let targets = element_targets(data, indices, g.axis)?;
    Ok(gather_offsets(data, indices.shape().to_vec(), targets.into_iter()))
}

/// ONNX ScatterElements: a copy of `data` with `updates` written (or combined) at the addressed positions, in
/// row-major order of the updates (so with `none`, the last write wins). Float combining runs in the compute
/// type and rounds once; integers wrap; bool `add`/`max` are `or`, `mul`/`min` are `and`.
pub(super) fn scatter(data: &Tensor, indices: &Tensor, updates: &Tensor, s: &Scatter) -> Result<Tensor, String> {
    if updates.shape() != indices.shape() {
        return Err(format!("updates {:?} must have the indices' shape {:?}", updates.shape(), indices.shape()));
    }
    let targets = element_targets(data, indices, s.axis)?;
    let out = by_family!(data.data(),
        float v => scatter_float(v, same_dtype(v, updates)?, &targets, s.reduction),
        int v => scatter_int(v, same_dtype(v, updates)?, &targets, s.reduction)?,
        bool v => {
            let u = same_dtype(v, updates)?;
            let f: fn(bool, bool) -> bool = match s.reduction {
                ScatterReduction::None => |_, b| b,
                ScatterReduction::Add | ScatterReduction::Max => |a, b| a | b,
                ScatterReduction::Mul | ScatterReduction::Min => |a, b| a & b,
            };
            Data::Bool(scatter_with(v.clone(), u, &targets, |a, b| Ok(f(a, b)))?)
        },
    );
    Ok(Tensor::new(data.shape().to_vec(), out).expect("scatter keeps the data's shape"))
}

fn scatter_with<T: Copy>(
    mut out: Vec<T>,
    updates: &[T],
    targets: &[usize],
    f: impl Fn(T, T) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    for (&t, &u) in targets.iter().zip(updates) {
        out[t] = f(out[t], u)?;
    }
    Ok(out)
}

fn binary_of(r: ScatterReduction) -> Option<BinaryOp> {
    match r {
        ScatterReduction::None => None,
        ScatterReduction::Add => Some(BinaryOp::Add),
        ScatterReduction::Mul => Some(BinaryOp::Mul),
        ScatterReduction::Max => Some(BinaryOp::Max),
        ScatterReduction::Min => Some(BinaryOp::Min),
    }
}

fn scatter_float<T: FloatElem>(v: &[T], u: &[T], targets: &[usize], r: ScatterReduction) -> Data {
    let acc: Vec<T::C> = v.iter().map(|&x| x.up()).collect();
    let upd: Vec<T::C> = u.iter().map(|&x| x.up()).collect();
    let f = binary_of(r).map(|k| real_binary::<T::C>(k).expect("scatter reductions are arithmetic kinds"));
    let out =
        scatter_with(acc, &upd, targets, |a, b| Ok(f.map_or(b, |f| f(a, b)))).expect("float combining cannot fail");
    T::wrap(out.into_iter().map(T::down).collect())
}

fn scatter_int<I: IntElem>(v: &[I], u: &[I], targets: &[usize], r: ScatterReduction) -> Result<Data, String> {
    let f = binary_of(r).map(|k| int_binary::<I>(k).expect("scatter reductions are arithmetic kinds"));
    Ok(I::wrap(scatter_with(v.to_vec(), u, targets, |a, b| f.map_or(Ok(b), |f| f(a, b)))?))
}

/// `start + i * step` along `axis`, converted to the dtype as `cast` converts an f64.
pub(super) fn iota(i: &Iota) -> Result<Tensor, String> {
    let shape = static_shape(&i.shape, "iota shape")?;
    if shape.is_empty() {
        return Err("iota needs a result of rank 1 or more".into());
    }
    let axis = normalize_axis(i.axis, shape.len())?;
    let stride = strides(&shape)[axis];
    let n = shape[axis];
    let values = (0..element_count(&shape)?).map(|o| i.start + ((o / stride) % n) as f64 * i.step);
    let data = crate::with_dtype!(i.dtype, T => T::wrap(values.map(from_f64_rounded::<T>).collect()));
    Ok(Tensor::new(shape, data).expect("one value per position"))
}

/// The operand's extents as an i64 vector.
pub(super) fn shape_of(x: &Tensor) -> Tensor {
    let dims: Vec<i64> = x.shape().iter().map(|&d| d as i64).collect();
    Tensor::from_vec(vec![dims.len()], dims).expect("one entry per dim")
}
