//! Reductions: `reduce` (sum, mean, max, min, prod over a set of axes), `arg_reduce` and `matmul`.
//!
//! Every reduction visits its elements in row-major order and accumulates sequentially, so results are
//! deterministic. Floats accumulate in their [`Real`] type — f32 and f64 in themselves, f16 and bf16 in f32,
//! rounded once at the end — and integers wrap, except integer `mean`, which sums exactly (i128) and truncates
//! the quotient toward zero. Empty sets give the operation's identity, as ONNX defines it: `sum` 0, `prod` 1,
//! `max` -inf (the type's minimum for integers, false for bool), `min` +inf (maximum, true); float `mean` of an
//! empty set is NaN and integer `mean` an error. `max`/`min` propagate NaN; `arg_reduce` treats NaN as the
//! extreme value.

use crate::op::{ArgKind, ArgReduce, Reduce, ReduceKind};
use crate::tensor::{Data, Tensor};
use crate::types::normalize_axis;

use super::elementwise::{real_max, real_min, same_dtype};
use super::index::{broadcast_offsets, broadcast_shapes, extent_product, for_each_index, split_at_axis, strides};
use super::num::{FloatElem, IntElem, Real, by_family, is_nan};

/// A reduction over `axes` of a tensor: where each input element goes, and how many elements each output gets.
struct Plan<'a> {
    shape: &'a [usize],
    /// Per input dim, the stride of its output position (0 for reduced dims).
    out_strides: Vec<usize>,
    /// Output element count.
    out_len: usize,
    /// Input elements per output element.
    group: usize,
}

impl Plan<'_> {
    /// Folds every element into the accumulator of its output position, in row-major order.
    fn fold<T: Copy, A: Clone>(&self, v: &[T], init: A, mut f: impl FnMut(&mut A, T)) -> Vec<A> {
        let mut acc = vec![init; self.out_len];
        let mut i = 0;
        for_each_index(self.shape, |idx| {
            let o: usize = idx.iter().zip(&self.out_strides).map(|(a, s)| a * s).sum();
            f(&mut acc[o], v[i]);
            i += 1;
        });
        acc
    }

    /// Folds with the first element of each group as the start; `None` for empty groups.
    fn fold1<T: Copy>(&self, v: &[T], f: impl Fn(T, T) -> T) -> Vec<Option<T>> {
        self.fold(v, None, |a: &mut Option<T>, x| *a = Some(a.map_or(x, |m| f(m, x))))
    }
}

/// `reduce` over `r.axes` (possibly empty: then every element is its own group).
pub(super) fn reduce(r: &Reduce, x: &Tensor) -> Result<Tensor, String> {
    let shape = x.shape();
    let axes = crate::infer::normalize_axes(&r.axes, shape.len())?;
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).map(|d| shape[d]).collect();
    let kept_strides = strides(&kept);
    let mut out_strides = vec![0; shape.len()];
    for (k, d) in (0..shape.len()).filter(|d| !axes.contains(d)).enumerate() {
        out_strides[d] = kept_strides[k];
    }
    let plan = Plan {
        shape,
        out_strides,
        out_len: extent_product(&kept),
        group: extent_product(axes.iter().map(|&d| &shape[d])),
    };
    let out_shape: Vec<usize> = if r.keep_dims {
        (0..shape.len()).map(|d| if axes.contains(&d) { 1 } else { shape[d] }).collect()
    } else {
        kept
    };
    let empty_groups = plan.group == 0 && plan.out_len > 0;
    let data = by_family!(x.data(),
        float v => reduce_float(r.kind, v, &plan),
        int v => {
            if empty_groups && r.kind == ReduceKind::Mean {
                return Err(format!("integer mean over axes {:?} of shape {shape:?} reduces an empty set", r.axes));
            }
            reduce_int(r.kind, v, &plan)
        },
        bool v => match r.kind {
            ReduceKind::Max => Data::Bool(or_identity(plan.fold1(v, |a, b| a | b), false)),
            ReduceKind::Min => Data::Bool(or_identity(plan.fold1(v, |a, b| a & b), true)),
            k => return Err(format!("{} is not defined on bool", k.name())),
        },
    );
    Ok(Tensor::new(out_shape, data).expect("one result per output position"))
}

/// The accumulators of a `fold1`, with `identity` for empty groups.
fn or_identity<T: Copy>(acc: Vec<Option<T>>, identity: T) -> Vec<T> {
    acc.into_iter().map(|a| a.unwrap_or(identity)).collect()
}

/// The smallest and largest values of an integer type.
fn int_bounds<I: IntElem>() -> (I, I) {
    // The bounds as i64 bit patterns: `from_i64` wraps, so u64's maximum arrives from -1.
    let (lo, hi) = I::DTYPE.int_range().expect("an integer type");
    let (lo, hi) = (lo as i64, hi as i64);
    (I::from_i64(lo), I::from_i64(hi))
}

fn reduce_float<T: FloatElem>(kind: ReduceKind, v: &[T], plan: &Plan<'_>) -> Data {
    let c: Vec<T::C> = v.iter().map(|&x| x.up()).collect();
    let out: Vec<T::C> = match kind {
        ReduceKind::Sum => plan.fold(&c, T::C::ZERO, |a, x| *a = *a + x),
        ReduceKind::Prod => plan.fold(&c, T::C::ONE, |a, x| *a = *a * x),
        ReduceKind::Mean => {
            // An empty group gives 0 / 0 = NaN.
            let n = T::C::of_f64(plan.group as f64);
            plan.fold(&c, T::C::ZERO, |a, x| *a = *a + x).into_iter().map(|s| s / n).collect()
        }
        ReduceKind::Max => or_identity(plan.fold1(&c, real_max), T::C::of_f64(f64::NEG_INFINITY)),
        ReduceKind::Min => or_identity(plan.fold1(&c, real_min), T::C::of_f64(f64::INFINITY)),
    };
    T::wrap(out.into_iter().map(T::down).collect())
}

fn reduce_int<I: IntElem>(kind: ReduceKind, v: &[I], plan: &Plan<'_>) -> Data {
    let out: Vec<I> = match kind {
        ReduceKind::Sum => plan.fold(v, I::ZERO, |a, x| *a = a.wadd(x)),
        ReduceKind::Prod => plan.fold(v, I::ONE, |a, x| *a = a.wmul(x)),
        ReduceKind::Mean => {
            // The exact mean of values of one integer type fits that type; i128 cannot overflow here.
            let n = plan.group as i128;
            plan.fold(v, 0i128, |a, x| *a += x.to_i64() as i128)
                .into_iter()
                .map(|s| I::from_i64((s / n) as i64))
                .collect()
        }
        ReduceKind::Max => or_identity(plan.fold1(v, Ord::max), int_bounds::<I>().0),
        ReduceKind::Min => or_identity(plan.fold1(v, Ord::min), int_bounds::<I>().1),
    };
    I::wrap(out)
}

/// `arg_reduce` along one axis: i64 indices of the extreme values.
pub(super) fn arg_reduce(r: &ArgReduce, x: &Tensor) -> Result<Tensor, String> {
    let shape = x.shape();
    if shape.is_empty() {
        return Err("arg_reduce needs an operand of rank 1 or more".into());
    }
    let axis = normalize_axis(r.axis, shape.len())?;
    let (outer, n, inner) = split_at_axis(shape, axis);
    if n == 0 && outer.saturating_mul(inner) > 0 {
        return Err(format!("arg_{} along axis {} of shape {shape:?} has no elements", r.kind.name(), r.axis));
    }
    let idx = crate::dispatch_data!(x.data(), v => arg_extremes(v, outer, n, inner, r.kind, r.select_last_index));
    let mut out_shape = shape.to_vec();
    if r.keep_dims {
        out_shape[axis] = 1;
    } else {
        out_shape.remove(axis);
    }
    Ok(Tensor::from_vec(out_shape, idx).expect("one index per output position"))
}

fn arg_extremes<T: PartialOrd + Copy>(
    v: &[T],
    outer: usize,
    n: usize,
    inner: usize,
    kind: ArgKind,
    last: bool,
) -> Vec<i64> {
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| v[(o * n + j) * inner + i];
            let mut best = 0;
            for j in 1..n {
                if replaces(at(j), at(best), kind, last) {
                    best = j;
                }
            }
            out.push(best as i64);
        }
    }
    out
}

/// Whether candidate `c` displaces the current `best`: NaN beats every number, and NaNs tie with each other,
/// so ties (equal values or two NaNs) go to the first index, or the last with `select_last_index`.
pub(super) fn replaces<T: PartialOrd>(c: T, best: T, kind: ArgKind, last: bool) -> bool {
    match (is_nan(&c), is_nan(&best)) {
        (true, true) => last,
        (true, false) => true,
        (false, true) => false,
        (false, false) => {
            let beats = match kind {
                ArgKind::Max => c > best,
                ArgKind::Min => c < best,
            };
            beats || (last && c == best)
        }
    }
}

/// numpy `matmul`: rank-1 operands are promoted (a row for `a`, a column for `b`) and the promoted dim dropped
/// from the result; batch dims broadcast. The contraction runs over `k` in increasing order from a zero
/// accumulator, without fused multiply-add.
pub(super) fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let out_type = crate::infer::matmul(&a.tensor_type(), &b.tensor_type())?;
    let out_shape = out_type.shape.as_static().expect("the result of static operands is static");
    let a2: Vec<usize> = if a.shape().len() == 1 { vec![1, a.shape()[0]] } else { a.shape().to_vec() };
    let b2: Vec<usize> = if b.shape().len() == 1 { vec![b.shape()[0], 1] } else { b.shape().to_vec() };
    let (ra, rb) = (a2.len(), b2.len());
    let dims = Dims { m: a2[ra - 2], k: a2[ra - 1], n: b2[rb - 1] };
    let batch = broadcast_shapes(&[&a2[..ra - 2], &b2[..rb - 2]])?;
    let batches =
        Batches { a: broadcast_offsets(&a2[..ra - 2], &batch)?, b: broadcast_offsets(&b2[..rb - 2], &batch)? };
    let data = by_family!(a.data(),
        float va => matmul_float(va, same_dtype(va, b)?, &batches, dims),
        int va => matmul_int(va, same_dtype(va, b)?, &batches, dims),
        bool _v => return Err("matmul is not defined on bool".into()),
    );
    Ok(Tensor::new(out_shape, data).expect("batch × m × n results"))
}

/// Matrix extents: `[m,k] @ [k,n]`.
#[derive(Copy, Clone)]
struct Dims {
    m: usize,
    k: usize,
    n: usize,
}

/// For each result batch, the batch index of each operand (after broadcasting).
struct Batches {
    a: Vec<usize>,
    b: Vec<usize>,
}

/// Runs the product loops, calling `dot(a_offset, b_offset)` for every result element; `a` rows are
/// contiguous in `k`, `b` columns have stride `n`.
fn product<T>(batches: &Batches, d: Dims, mut dot: impl FnMut(usize, usize) -> T) -> Vec<T> {
    let mut out = Vec::with_capacity(batches.a.len() * d.m * d.n);
    for (&ba, &bb) in batches.a.iter().zip(&batches.b) {
        for i in 0..d.m {
            for j in 0..d.n {
                out.push(dot(ba * d.m * d.k + i * d.k, bb * d.k * d.n + j));
            }
        }
    }
    out
}

fn matmul_float<T: FloatElem>(a: &[T], b: &[T], batches: &Batches, d: Dims) -> Data {
    T::wrap(product(batches, d, |oa, ob| {
        let mut acc = T::C::ZERO;
        for p in 0..d.k {
            acc = acc + a[oa + p].up() * b[ob + p * d.n].up();
        }
        T::down(acc)
    }))
}

fn matmul_int<I: IntElem>(a: &[I], b: &[I], batches: &Batches, d: Dims) -> Data {
    I::wrap(product(batches, d, |oa, ob| {
        let mut acc = I::ZERO;
        for p in 0..d.k {
            acc = acc.wadd(a[oa + p].wmul(b[ob + p * d.n]));
        }
        acc
    }))
}
