//! Shape and data-movement ONNX ops, with import-time tracking of shape tensors.
//!
//! `Shape` of a value with symbolic dims yields a real `shape_of` node *and* a per-element record of its dims
//! (`Val::dims`), which `Gather`, `Slice`, `Concat`, `Unsqueeze`, `Squeeze` and `Cast` carry along, so that a
//! later `Reshape`, `Expand` or `ConstantOfShape` sees `[batch, 12, 64]` rather than an unknown tensor.

use kiln_ir::op::{
    BinaryOp as B, Broadcast, Concat, Gather, GatherElements, Iota, Pad, PadMode, ReduceKind, Scatter,
    ScatterReduction, Slice, Split,
};
use kiln_ir::{DType, Dim, Op, Shape, Tensor};

use super::{axis, bin, const_ints, dim_product, dims_from_args, i64_tensor, scalar_like, static_shape};
use crate::import::{Ctx, DimArg, Val};
use crate::node::OnnxNode;

pub(crate) fn constant(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let t = if let Some(t) = n.tensor("value")? {
        t
    } else if let Some(f) = n.proto.attribute.iter().find(|a| a.name == "value_float").map(|a| a.f) {
        n.ignore(&["value_float"]);
        Tensor::scalar(f)
    } else if let Some(v) = n.floats("value_floats") {
        Tensor::from_vec(vec![v.len()], v).expect("length matches")
    } else if let Some(i) = n.opt_int("value_int") {
        Tensor::scalar(i)
    } else if let Some(v) = n.ints("value_ints") {
        i64_tensor(v)
    } else {
        return Err("only tensor, float(s) and int(s) values are supported (not strings or sparse tensors)".into());
    };
    Ok(vec![cx.constant(t)?])
}

/// A shape argument (possibly with symbolic dims) of a node input.
fn shape_arg(n: &OnnxNode<'_>, i: usize, what: &str) -> Result<Vec<DimArg>, String> {
    n.input(i)?
        .dim_args()
        .ok_or_else(|| format!("the {what} must be known at import time (or computed from the shapes of inputs)"))
}

pub(crate) fn constant_of_shape(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let dims = dims_from_args(&shape_arg(n, 0, "shape")?, "the shape")?;
    let value = n.tensor("value")?.unwrap_or_else(|| Tensor::scalar(0.0f32));
    if value.len() != 1 {
        return Err("`value` must hold one element".into());
    }
    let scalar = cx.constant(value.reshaped(vec![]).map_err(|e| e.to_string())?)?;
    if dims.is_empty() {
        return Ok(vec![scalar]);
    }
    Ok(vec![cx.op(Op::Broadcast(Broadcast { shape: Shape(dims) }), &[&scalar])?])
}

pub(crate) fn shape(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let rank = x.rank() as i64;
    let clamp = |v: i64| if v < 0 { (v + rank).max(0) } else { v.min(rank) };
    let start = clamp(n.int("start", 0)) as usize;
    let end = clamp(n.int("end", rank)) as usize;
    let dims: Vec<Dim> = x.ty.shape.0[start..end.max(start)].to_vec();
    if let Some(stat) = Shape(dims.clone()).as_static() {
        return Ok(vec![cx.constant(i64_tensor(stat.into_iter().map(|d| d as i64).collect()))?]);
    }
    let full = cx.op(Op::ShapeOf, &[x])?;
    let mut out = if start == 0 && end == rank as usize {
        full
    } else {
        cx.op(
            Op::Slice(Slice { starts: vec![start as i64], ends: vec![end as i64], axes: vec![0], steps: vec![1] }),
            &[&full],
        )?
    };
    out.dims = Some(dims.into_iter().map(DimArg::from).collect());
    Ok(vec![out])
}

pub(crate) fn size(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let count = x.ty.shape.num_elements().ok_or("Size of a tensor with symbolic dims is not supported")?;
    Ok(vec![cx.constant(Tensor::scalar(count as i64))?])
}

/// Resolves ONNX reshape semantics (`0` copies, `-1` infers) against the input's dims.
fn reshape_target(input: &[Dim], args: &[DimArg], allowzero: bool) -> Result<Vec<Dim>, String> {
    let mut out: Vec<Option<Dim>> = Vec::with_capacity(args.len());
    let mut infer_at = None;
    for (i, a) in args.iter().enumerate() {
        out.push(match a {
            DimArg::Int(0) if !allowzero => {
                Some(input.get(i).cloned().ok_or(format!("0 at position {i} has no input dim to copy"))?)
            }
            DimArg::Int(-1) => {
                if infer_at.replace(i).is_some() {
                    return Err("more than one -1 in the target shape".into());
                }
                None
            }
            DimArg::Int(n) if *n < 0 => return Err(format!("invalid extent {n} in the target shape")),
            DimArg::Int(n) => Some(Dim::Static(*n as u64)),
            DimArg::Sym(s) => Some(Dim::Sym(s.clone())),
        });
    }
    if let Some(at) = infer_at {
        // Divide the input's element count by the known output extents, symbol by symbol.
        let mut syms: Vec<String> = Vec::new();
        let mut num = 1u64;
        for d in input {
            match d {
                Dim::Static(k) => num = num.checked_mul(*k).ok_or("the input's element count overflows")?,
                Dim::Sym(s) => syms.push(s.clone()),
            }
        }
        let mut den = 1u64;
        for d in out.iter().flatten() {
            match d {
                Dim::Static(k) => den = den.checked_mul(*k).ok_or("the target shape's element count overflows")?,
                Dim::Sym(s) => match syms.iter().position(|x| x == s) {
                    Some(p) => {
                        syms.remove(p);
                    }
                    None => return Err(format!("cannot infer -1: symbolic dim `{s}` does not divide the input")),
                },
            }
        }
        let inferred = match syms.as_slice() {
            [] if den != 0 && num.is_multiple_of(den) => Dim::Static(num / den),
            [] if den == 0 && num == 0 => Dim::Static(0),
            [s] if den == num => Dim::Sym(s.clone()),
            _ => return Err(format!("cannot infer -1 of the target shape from input dims {}", Shape(input.to_vec()))),
        };
        out[at] = Some(inferred);
    }
    Ok(out.into_iter().map(|d| d.expect("every position is resolved")).collect())
}

pub(crate) fn reshape(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let args = if n.opset < 5 {
        n.ints("shape").ok_or("the `shape` attribute is required")?.into_iter().map(DimArg::Int).collect()
    } else {
        shape_arg(n, 1, "target shape")?
    };
    let target = reshape_target(&x.ty.shape.0, &args, n.int("allowzero", 0) != 0)?;
    let mut out = super::reshape(cx, x, target)?;
    if x.dims.is_some() && out.rank() <= 1 {
        out.dims = x.dims.clone();
    }
    Ok(vec![out])
}

pub(crate) fn flatten(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let rank = x.rank();
    let a = n.int("axis", 1);
    let a = if a < 0 { a + rank as i64 } else { a };
    if a < 0 || a > rank as i64 {
        return Err(format!("axis {} is out of range for rank {rank}", n.int("axis", 1)));
    }
    let (head, tail) = x.ty.shape.0.split_at(a as usize);
    let both = dim_product(head)
        .zip(dim_product(tail))
        .ok_or_else(|| format!("flattening {} needs static dims", x.ty.shape))?;
    Ok(vec![super::reshape(cx, x, vec![both.0, both.1])?])
}

pub(crate) fn transpose(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let perm = n.ints("perm").unwrap_or_else(|| (0..x.rank() as i64).rev().collect());
    Ok(vec![super::transpose(cx, x, perm)?])
}

/// Axes from an attribute (older opsets) or an input (newer ones).
fn axes_arg(n: &OnnxNode<'_>, input: usize, since: i64) -> Result<Option<Vec<i64>>, String> {
    if n.opset < since { Ok(n.ints("axes")) } else { const_ints(n, input, "axes") }
}

pub(crate) fn squeeze(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let rank = x.rank();
    let axes = match axes_arg(n, 1, 13)? {
        Some(a) => a.iter().map(|&a| axis(a, rank)).collect::<Result<Vec<_>, _>>()?,
        None => (0..rank).filter(|&i| x.ty.shape.0[i] == Dim::Static(1)).collect(),
    };
    for &a in &axes {
        // `axis` accepts axis 0 of a scalar, which has no extent to squeeze.
        match x.ty.shape.0.get(a) {
            Some(Dim::Static(1)) => {}
            Some(d) => return Err(format!("cannot squeeze axis {a} of extent {d}")),
            None => return Err(format!("axis {a} is out of range for rank {rank}")),
        }
    }
    let dims: Vec<Dim> =
        x.ty.shape.0.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| d.clone()).collect();
    let mut out = super::reshape(cx, x, dims)?;
    out.dims = x.dims.clone();
    Ok(vec![out])
}

pub(crate) fn unsqueeze(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let axes = axes_arg(n, 1, 13)?.ok_or("axes are required")?;
    let out_rank = x.rank() + axes.len();
    let mut norm = axes.iter().map(|&a| axis(a, out_rank)).collect::<Result<Vec<_>, _>>()?;
    norm.sort_unstable();
    if norm.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("axes {axes:?} repeat"));
    }
    let mut src = x.ty.shape.0.iter();
    let dims: Vec<Dim> = (0..out_rank)
        .map(|i| if norm.contains(&i) { Dim::Static(1) } else { src.next().cloned().expect("rank adds up") })
        .collect();
    let mut out = super::reshape(cx, x, dims)?;
    out.dims = x.dims.clone();
    Ok(vec![out])
}

pub(crate) fn concat(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let ins = n.all_inputs()?;
    if ins.is_empty() {
        return Err("needs at least one input".into());
    }
    let ax = n.opt_int("axis").ok_or("the `axis` attribute is required")?;
    // Empty operands (ONNX allows [0]-shaped pieces) contribute nothing.
    let nonempty: Vec<&Val> = ins.iter().copied().filter(|v| v.ty.shape.num_elements() != Some(0)).collect();
    let parts = if nonempty.is_empty() { vec![ins[0]] } else { nonempty };
    let mut out = if parts.len() == 1 { parts[0].clone() } else { cx.op(Op::Concat(Concat { axis: ax }), &parts)? };
    if out.konst.is_none() && parts.iter().all(|v| v.rank() == 1) {
        let pieces: Option<Vec<Vec<DimArg>>> = parts.iter().map(|v| v.dim_args()).collect();
        out.dims = pieces.map(|p| p.into_iter().flatten().collect());
    }
    Ok(vec![out])
}

pub(crate) fn split(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let a = axis(n.int("axis", 0), x.rank())?;
    let extent = x.ty.shape.0.get(a).ok_or("splitting a scalar is not supported")?;
    let extent = extent.as_static().ok_or("splitting a symbolic dim is not supported")? as i64;
    let outputs = n.proto.output.len() as i64;
    let sizes = if n.opset < 13 { n.ints("split") } else { const_ints(n, 1, "split")? };
    let num_outputs = n.opt_int("num_outputs");
    let sizes = match sizes {
        Some(s) => s,
        None => {
            let k = num_outputs.unwrap_or(outputs);
            if k < 1 {
                return Err("needs at least one output".into());
            }
            if k != outputs {
                return Err(format!("num_outputs {k} disagrees with the node's {outputs} outputs"));
            }
            // Equal pieces; with num_outputs the last may be smaller (ceil division), as opset 18 says.
            let piece = (extent + k - 1) / k;
            if num_outputs.is_none() && extent % k != 0 {
                return Err(format!("extent {extent} does not split evenly into {k} outputs"));
            }
            (0..k).map(|i| piece.min(extent - piece * i).max(0)).collect()
        }
    };
    cx.op_multi(Op::Split(Split { axis: a as i64, sizes }), &[x])
}

pub(crate) fn slice(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let (starts, ends, axes, steps) = if n.opset < 10 {
        let starts = n.ints("starts").ok_or("`starts` is required")?;
        let ends = n.ints("ends").ok_or("`ends` is required")?;
        (starts, ends, n.ints("axes"), None)
    } else {
        (
            const_ints(n, 1, "starts")?.ok_or("`starts` is required")?,
            const_ints(n, 2, "ends")?.ok_or("`ends` is required")?,
            const_ints(n, 3, "axes")?,
            const_ints(n, 4, "steps")?,
        )
    };
    let k = starts.len();
    let axes = axes.unwrap_or_else(|| (0..k as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; k]);
    if ends.len() != k || axes.len() != k || steps.len() != k {
        return Err("starts, ends, axes and steps differ in length".into());
    }
    let attrs = Slice { starts, ends, axes, steps };
    let mut out = cx.op(Op::Slice(attrs.clone()), &[x])?;
    if let (Some(dims), None) = (&x.dims, &out.konst) {
        let (s, st, count) =
            kiln_ir::infer::slice_range(attrs.starts[0], attrs.ends[0], attrs.steps[0], dims.len() as i64);
        out.dims = Some((0..count).map(|i| dims[(s + i * st) as usize].clone()).collect());
    }
    Ok(vec![out])
}

pub(crate) fn gather(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (data, idx) = (n.input(0)?, n.input(1)?);
    let a = n.int("axis", 0);
    let mut out = cx.op(Op::Gather(Gather { axis: a }), &[data, idx])?;
    if let (Some(dims), Some(ix), None) = (&data.dims, idx.ints(), &out.konst) {
        let len = dims.len() as i64;
        let picked: Option<Vec<DimArg>> = ix
            .iter()
            .map(|&i| usize::try_from(if i < 0 { i + len } else { i }).ok().and_then(|i| dims.get(i).cloned()))
            .collect();
        out.dims = picked;
    }
    Ok(vec![out])
}

pub(crate) fn gather_elements(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (data, idx) = (n.input(0)?, n.input(1)?);
    Ok(vec![cx.op(Op::GatherElements(GatherElements { axis: n.int("axis", 0) }), &[data, idx])?])
}

/// Linear indices into the first `k` dims of `data_dims` from `indices[..., k]`, with negatives wrapped.
fn linear_indices(cx: &mut Ctx<'_>, idx: &Val, data_dims: &[usize], k: usize) -> Result<Val, String> {
    let idx = if idx.dtype() == DType::I64 {
        idx.clone()
    } else {
        cx.op(Op::Cast(kiln_ir::op::Cast { to: DType::I64 }), &[idx])?
    };
    let extents = cx.constant(i64_tensor(data_dims[..k].iter().map(|&d| d as i64).collect()))?;
    let zero = cx.scalar(DType::I64, 0.0)?;
    let neg = bin(cx, B::Lt, &idx, &zero)?;
    let wrapped = bin(cx, B::Add, &idx, &extents)?;
    let idx = cx.op(Op::Select, &[&neg, &wrapped, &idx])?;
    let mut strides = vec![1i64; k];
    for i in (0..k.saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * data_dims[i + 1] as i64;
    }
    let strides = cx.constant(i64_tensor(strides))?;
    let scaled = bin(cx, B::Mul, &idx, &strides)?;
    cx.op(Op::Reduce(kiln_ir::op::Reduce { kind: ReduceKind::Sum, axes: vec![-1], keep_dims: false }), &[&scaled])
}

/// GatherND as one gather along the flattened leading dims: each index tuple becomes a linear index into the
/// data's first `batch_dims + k` dims (its batch position's offset plus the tuple's), and the rest of the data
/// rows come along.
pub(crate) fn gather_nd(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (data, idx) = (n.input(0)?, n.input(1)?);
    let dd = static_shape(data, "GatherND")?;
    let id = static_shape(idx, "GatherND")?;
    let k = *id.last().ok_or("indices must have rank ≥ 1")?;
    let b = usize::try_from(n.int("batch_dims", 0))
        .ok()
        .filter(|&b| b < id.len() && b < dd.len())
        .ok_or_else(|| format!("batch_dims {} must be below the ranks of data and indices", n.int("batch_dims", 0)))?;
    if dd[..b] != id[..b] {
        return Err(format!("the batch dims of data {:?} and indices {:?} differ", &dd[..b], &id[..b]));
    }
    if b + k > dd.len() {
        return Err(format!("index depth {k} after {b} batch dim(s) exceeds the data rank {}", dd.len()));
    }
    let indexed: usize = dd[b..b + k].iter().product();
    let batch: usize = dd[..b].iter().product();
    let mut flat_dims: Vec<Dim> = vec![Dim::Static((batch * indexed) as u64)];
    flat_dims.extend(dd[b + k..].iter().map(|&d| Dim::Static(d as u64)));
    let flat = super::reshape(cx, data, flat_dims)?;
    let mut lin = linear_indices(cx, idx, &dd[b..], k)?;
    if b > 0 {
        // Each index tuple's batch position, times the rows one batch element spans.
        let offsets = cx.op(
            Op::Iota(Iota {
                dtype: DType::I64,
                shape: Shape::of(&[batch as u64]),
                axis: 0,
                start: 0.0,
                step: indexed as f64,
            }),
            &[],
        )?;
        let mut at: Vec<Dim> = dd[..b].iter().map(|&d| Dim::Static(d as u64)).collect();
        at.extend(std::iter::repeat_n(Dim::Static(1), id.len() - 1 - b));
        let offsets = super::reshape(cx, &offsets, at)?;
        lin = bin(cx, B::Add, &lin, &offsets)?;
    }
    Ok(vec![cx.op(Op::Gather(Gather { axis: 0 }), &[&flat, &lin])?])
}

fn scatter_reduction(n: &OnnxNode<'_>) -> Result<ScatterReduction, String> {
    match n.string("reduction").as_deref().unwrap_or("none") {
        "none" => Ok(ScatterReduction::None),
        "add" => Ok(ScatterReduction::Add),
        "mul" => Ok(ScatterReduction::Mul),
        "max" => Ok(ScatterReduction::Max),
        "min" => Ok(ScatterReduction::Min),
        other => Err(format!("reduction `{other}` is not supported")),
    }
}

pub(crate) fn scatter_elements(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let reduction = scatter_reduction(n)?;
    let (d, i, u) = (n.input(0)?, n.input(1)?, n.input(2)?);
    Ok(vec![cx.op(Op::Scatter(Scatter { axis: n.int("axis", 0), reduction }), &[d, i, u])?])
}

pub(crate) fn scatter_nd(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let reduction = scatter_reduction(n)?;
    let (data, idx, upd) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let dd = static_shape(data, "ScatterND")?;
    let id = static_shape(idx, "ScatterND")?;
    let k = *id.last().ok_or("indices must have rank ≥ 1")?;
    if k > dd.len() {
        return Err(format!("index depth {k} exceeds the data rank {}", dd.len()));
    }
    let lead: usize = dd[..k].iter().product();
    let rest: usize = dd[k..].iter().product();
    let count: usize = id[..id.len() - 1].iter().product();
    let flat = super::reshape(cx, data, vec![Dim::Static(lead as u64), Dim::Static(rest as u64)])?;
    let lin = linear_indices(cx, idx, &dd, k)?;
    let lin = super::reshape(cx, &lin, vec![Dim::Static(count as u64), Dim::Static(1)])?;
    let lin = cx.op(Op::Broadcast(Broadcast { shape: Shape::of(&[count as u64, rest as u64]) }), &[&lin])?;
    let upd = super::reshape(cx, upd, vec![Dim::Static(count as u64), Dim::Static(rest as u64)])?;
    let out = cx.op(Op::Scatter(Scatter { axis: 0, reduction }), &[&flat, &lin, &upd])?;
    Ok(vec![super::reshape(cx, &out, dd.iter().map(|&d| Dim::Static(d as u64)).collect())?])
}

pub(crate) fn expand(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let target = dims_from_args(&shape_arg(n, 1, "shape")?, "the shape")?;
    // Expand broadcasts both ways: the result is the broadcast of the two shapes.
    let shape = x.ty.shape.broadcast(&Shape(target))?;
    if shape == x.ty.shape {
        return Ok(vec![x.clone()]);
    }
    Ok(vec![cx.op(Op::Broadcast(Broadcast { shape }), &[x])?])
}

pub(crate) fn tile(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let reps = const_ints(n, 1, "repeats")?.ok_or("`repeats` is required")?;
    let d = static_shape(x, "Tile")?;
    if reps.len() != d.len() || reps.iter().any(|&r| r < 0) {
        return Err(format!("repeats {reps:?} must be non-negative, one per dim of {:?}", d));
    }
    // [d0, d1] → [1, d0, 1, d1] → broadcast [r0, d0, r1, d1] → [r0*d0, r1*d1]
    let inter: Vec<Dim> = d.iter().flat_map(|&e| [Dim::Static(1), Dim::Static(e as u64)]).collect();
    let wide: Vec<u64> = d.iter().zip(&reps).flat_map(|(&e, &r)| [r as u64, e as u64]).collect();
    let y = super::reshape(cx, x, inter)?;
    let y = cx.op(Op::Broadcast(Broadcast { shape: Shape::of(&wide) }), &[&y])?;
    Ok(vec![super::reshape(cx, &y, d.iter().zip(&reps).map(|(&e, &r)| Dim::Static(e as u64 * r as u64)).collect())?])
}

pub(crate) fn pad(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let rank = x.rank();
    let mode = match n.string("mode").as_deref().unwrap_or("constant") {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        other => return Err(format!("mode `{other}` is not supported")),
    };
    let (pads, value, axes) = if n.opset < 11 {
        (n.ints("pads").ok_or("`pads` is required")?, n.float("value", 0.0) as f64, None)
    } else {
        let pads = const_ints(n, 1, "pads")?.ok_or("`pads` is required")?;
        let value = match n.opt_input(2) {
            None => 0.0,
            Some(v) => *v.floats().ok_or("the constant value must be known at import time")?.first().unwrap_or(&0.0),
        };
        (pads, value, const_ints(n, 3, "axes")?)
    };
    let full = match axes {
        None => pads,
        Some(axes) => {
            let mut full = vec![0; 2 * rank];
            if pads.len() != 2 * axes.len() {
                return Err("pads must have two entries per axis".into());
            }
            for (i, &a) in axes.iter().enumerate() {
                let a = axis(a, rank)?;
                full[a] = pads[i];
                full[a + rank] = pads[i + axes.len()];
            }
            full
        }
    };
    Ok(vec![cx.op(Op::Pad(Pad { mode, pads: full, value }), &[x])?])
}

pub(crate) fn range(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let s = n.input(0)?;
    let known = |i: usize| n.input(i).ok().and_then(|v| v.floats()).and_then(|v| v.first().copied());
    let (Some(start), Some(limit), Some(delta)) = (known(0), known(1), known(2)) else {
        return symbolic_range(cx, n);
    };
    if delta == 0.0 {
        return Err("delta must be nonzero".into());
    }
    let count = ((limit - start) / delta).ceil().max(0.0) as u64;
    Ok(vec![cx.op(Op::Iota(Iota { dtype: s.dtype(), shape: Shape::of(&[count]), axis: 0, start, step: delta }), &[])?])
}

/// `Range` over tracked extents with a known integer step (positions `past .. past + new`): its length is a
/// derived dim, its values an iota plus the start, computed at run time.
fn symbolic_range(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    use kiln_ir::dim::DimExpr;
    let refuse = || "start, limit and delta must be known at import time, or be extents with a known step".to_string();
    let (start, limit, delta) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let one = |v: &Val| match v.dim_args()?.as_slice() {
        [DimArg::Int(i)] => Some(DimExpr::constant(*i)),
        [DimArg::Sym(s)] => DimExpr::parse(s),
        _ => None,
    };
    let (Some(a), Some(b), Some(step)) = (one(start), one(limit), delta.ints().and_then(|v| v.first().copied())) else {
        return Err(refuse());
    };
    if step == 0 {
        return Err("delta must be nonzero".into());
    }
    if step < 0 || !start.dtype().is_int() {
        return Err(refuse());
    }
    let count = b.add(&a.scale(-1)).ceil_div(step);
    let dim = count.to_dim().ok_or_else(|| format!("the range's length {count} is negative"))?;
    let iota = cx.op(
        Op::Iota(Iota { dtype: start.dtype(), shape: Shape(vec![dim]), axis: 0, start: 0.0, step: step as f64 }),
        &[],
    )?;
    let start0 = super::reshape(cx, start, vec![])?;
    let mut out = bin(cx, kiln_ir::op::BinaryOp::Add, &iota, &start0)?;
    out.dims = None;
    Ok(vec![out])
}

pub(crate) fn one_hot(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (idx, depth, values) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let depth = depth.floats().and_then(|v| v.first().copied()).ok_or("depth must be known at import time")? as i64;
    let id = static_shape(idx, "OneHot")?;
    let out_rank = id.len() + 1;
    let a = axis(n.int("axis", -1), out_rank)?;
    let mut out_dims: Vec<u64> = id.iter().map(|&d| d as u64).collect();
    out_dims.insert(a, depth as u64);
    let idx64 = cx.op(Op::Cast(kiln_ir::op::Cast { to: DType::I64 }), &[idx])?;
    let d = cx.scalar(DType::I64, depth as f64)?;
    let zero = cx.scalar(DType::I64, 0.0)?;
    let neg = bin(cx, B::Lt, &idx64, &zero)?;
    let wrapped = bin(cx, B::Add, &idx64, &d)?;
    let idx64 = cx.op(Op::Select, &[&neg, &wrapped, &idx64])?;
    let mut exp_dims: Vec<Dim> = id.iter().map(|&d| Dim::Static(d as u64)).collect();
    exp_dims.insert(a, Dim::Static(1));
    let idx64 = super::reshape(cx, &idx64, exp_dims)?;
    let iota = cx.op(
        Op::Iota(Iota { dtype: DType::I64, shape: Shape::of(&out_dims), axis: a as i64, start: 0.0, step: 1.0 }),
        &[],
    )?;
    let hit = bin(cx, B::Eq, &iota, &idx64)?;
    let off = cx.op(Op::Slice(Slice { starts: vec![0], ends: vec![1], axes: vec![0], steps: vec![1] }), &[values])?;
    let on = cx.op(Op::Slice(Slice { starts: vec![1], ends: vec![2], axes: vec![0], steps: vec![1] }), &[values])?;
    let off = super::reshape(cx, &off, vec![])?;
    let on = super::reshape(cx, &on, vec![])?;
    Ok(vec![cx.op(Op::Select, &[&hit, &on, &off])?])
}

pub(crate) fn trilu(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let k = const_ints(n, 1, "k")?.and_then(|v| v.first().copied()).unwrap_or(0);
    let upper = n.int("upper", 1) != 0;
    let d = static_shape(x, "Trilu")?;
    if d.len() < 2 {
        return Err("needs rank ≥ 2".into());
    }
    let mn = [d[d.len() - 2] as u64, d[d.len() - 1] as u64];
    let row =
        cx.op(Op::Iota(Iota { dtype: DType::I64, shape: Shape::of(&mn), axis: 0, start: 0.0, step: 1.0 }), &[])?;
    let col =
        cx.op(Op::Iota(Iota { dtype: DType::I64, shape: Shape::of(&mn), axis: 1, start: 0.0, step: 1.0 }), &[])?;
    let diff = bin(cx, B::Sub, &col, &row)?;
    let kk = cx.scalar(DType::I64, k as f64)?;
    let keep = bin(cx, if upper { B::Ge } else { B::Le }, &diff, &kk)?;
    let zero = scalar_like(cx, x, 0.0)?;
    Ok(vec![cx.op(Op::Select, &[&keep, x, &zero])?])
}

pub(crate) fn depth_to_space(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let b = n.opt_int("blocksize").ok_or("`blocksize` is required")? as u64;
    let d = static_shape(x, "DepthToSpace")?;
    let [nb, c, h, w] = d[..] else { return Err("needs a rank-4 input".into()) };
    let (nb, c, h, w) = (nb as u64, c as u64, h as u64, w as u64);
    if b == 0 || c % (b * b) != 0 {
        return Err(format!("channels {c} are not divisible by blocksize² ({})", b * b));
    }
    let cc = c / (b * b);
    let crd = match n.string("mode").as_deref().unwrap_or("DCR") {
        "DCR" => false,
        "CRD" => true,
        other => return Err(format!("mode `{other}` is not supported")),
    };
    let (inter, perm): (Vec<u64>, Vec<i64>) = if crd {
        (vec![nb, cc, b, b, h, w], vec![0, 1, 4, 2, 5, 3])
    } else {
        (vec![nb, b, b, cc, h, w], vec![0, 3, 4, 1, 5, 2])
    };
    let y = super::reshape(cx, x, inter.into_iter().map(Dim::Static).collect())?;
    let y = super::transpose(cx, &y, perm)?;
    Ok(vec![super::reshape(cx, &y, [nb, cc, h * b, w * b].into_iter().map(Dim::Static).collect())?])
}

pub(crate) fn reverse_sequence(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    // out[b, t] = x[b, len[b] - 1 - t] for t < len[b], else x[b, t]: one gather_elements along the time axis.
    let (x, lens) = (n.input(0)?, n.input(1)?);
    let (batch_axis, time_axis) = (n.int("batch_axis", 1), n.int("time_axis", 0));
    let d = static_shape(x, "ReverseSequence")?;
    let rank = d.len();
    if rank < 2 || ![(0, 1), (1, 0)].contains(&(batch_axis, time_axis)) {
        return Err(format!("batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1 of a rank ≥ 2 input"));
    }
    let ba = batch_axis as usize;
    if !matches!(lens.dtype(), DType::I32 | DType::I64) || lens.ty.shape != Shape::of(&[d[ba] as u64]) {
        return Err(format!("sequence_lens must be an integer [{}] vector, got {}", d[ba], lens.ty));
    }
    let lens = if lens.dtype() == DType::I64 {
        lens.clone()
    } else {
        cx.op(Op::Cast(kiln_ir::op::Cast { to: DType::I64 }), &[lens])?
    };
    let mut lens_dims = vec![Dim::Static(1); rank];
    lens_dims[ba] = Dim::Static(d[ba] as u64);
    let lens = super::reshape(cx, &lens, lens_dims)?;
    let full = Shape::of(&d.iter().map(|&v| v as u64).collect::<Vec<_>>());
    let t = cx.op(Op::Iota(Iota { dtype: DType::I64, shape: full, axis: time_axis, start: 0.0, step: 1.0 }), &[])?;
    let inside = bin(cx, B::Lt, &t, &lens)?;
    let one = cx.scalar(DType::I64, 1.0)?;
    let last = bin(cx, B::Sub, &lens, &one)?;
    let flipped = bin(cx, B::Sub, &last, &t)?;
    let idx = cx.op(Op::Select, &[&inside, &flipped, &t])?;
    Ok(vec![cx.op(Op::GatherElements(GatherElements { axis: time_axis }), &[x, &idx])?])
}

pub(crate) fn non_zero(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let count = cx.fresh_symbol(n.output_name(0));
    Ok(vec![cx.op(Op::NonZero(kiln_ir::op::NonZero { count }), &[n.input(0)?])?])
}

pub(crate) fn unique(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let count = cx.fresh_symbol(n.output_name(0));
    let axis = n.opt_int("axis");
    let attrs = kiln_ir::op::Unique {
        axis: axis.unwrap_or(0),
        flatten: axis.is_none(),
        sorted: n.int("sorted", 1) != 0,
        count,
    };
    cx.op_multi(Op::Unique(attrs), &[x])
}

pub(crate) fn non_max_suppression(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (boxes, scores) = (n.input(0)?, n.input(1)?);
    // Absent operands take ONNX's defaults: no box kept per class, IoU threshold 0, no score threshold.
    let max = match n.opt_input(2) {
        Some(v) => v.clone(),
        None => cx.constant(Tensor::scalar(0i64))?,
    };
    let iou = match n.opt_input(3) {
        Some(v) => v.clone(),
        None => cx.constant(Tensor::scalar(0f32))?,
    };
    let mut operands = vec![boxes, scores, &max, &iou];
    if let Some(s) = n.opt_input(4) {
        operands.push(s);
    }
    let count = cx.fresh_symbol(n.output_name(0));
    let attrs = kiln_ir::op::NonMaxSuppression { center_point_box: n.int("center_point_box", 0) != 0, count };
    Ok(vec![cx.op(Op::NonMaxSuppression(attrs), &operands)?])
}

pub(crate) fn compress(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    // A gather of the selected positions: constant indices when the condition is known, else the condition's
    // `non_zero` (a data-dependent extent), which the gather checks against the axis at run time.
    let x = n.input(0)?;
    let known = n.input(1)?.ints();
    let (data, a) = match n.opt_int("axis") {
        Some(a) => (x.clone(), axis(a, x.rank())?),
        None => {
            let len = static_shape(x, "Compress")?.iter().product::<usize>() as u64;
            (super::reshape(cx, x, vec![Dim::Static(len)])?, 0)
        }
    };
    let Some(cond) = known else {
        let c = n.input(1)?;
        if c.rank() != 1 {
            return Err(format!("`condition` must be 1-D, got rank {}", c.rank()));
        }
        let count = cx.fresh_symbol(n.output_name(0));
        let nz = cx.op(Op::NonZero(kiln_ir::op::NonZero { count: count.clone() }), &[c])?;
        let idx = super::reshape(cx, &nz, vec![Dim::sym(&count)])?;
        return Ok(vec![cx.op(Op::Gather(Gather { axis: a as i64 }), &[&data, &idx])?]);
    };
    let extent = static_shape(&data, "Compress")?[a];
    let picked: Vec<i64> = cond.iter().enumerate().filter(|(_, c)| **c != 0).map(|(i, _)| i as i64).collect();
    if picked.last().is_some_and(|&i| i as usize >= extent) {
        return Err(format!("condition selects past the axis extent {extent}"));
    }
    let idx = cx.constant(i64_tensor(picked))?;
    Ok(vec![cx.op(Op::Gather(Gather { axis: a as i64 }), &[&data, &idx])?])
}

pub(crate) fn center_crop_pad(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let target = const_ints(n, 1, "shape")?.ok_or("`shape` is required")?;
    let d = static_shape(x, "CenterCropPad")?;
    let rank = d.len();
    let axes: Vec<usize> = match n.ints("axes") {
        Some(a) => a.iter().map(|&a| axis(a, rank)).collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    if axes.len() != target.len() {
        return Err(format!("shape has {} entries for {} axes", target.len(), axes.len()));
    }
    // Crop (centred, the extra element off the end) where the target is smaller, pad with zeros where larger.
    let (mut starts, mut ends, mut sliced) = (vec![], vec![], vec![]);
    let mut pads = vec![0i64; 2 * rank];
    for (&a, &want) in axes.iter().zip(&target) {
        let have = d[a] as i64;
        if want < 0 {
            return Err(format!("negative target extent {want}"));
        }
        if want < have {
            let begin = (have - want) / 2;
            starts.push(begin);
            ends.push(begin + want);
            sliced.push(a as i64);
        } else if want > have {
            pads[a] = (want - have) / 2;
            pads[a + rank] = want - have - pads[a];
        }
    }
    let mut y = x.clone();
    if !sliced.is_empty() {
        let steps = vec![1; sliced.len()];
        y = cx.op(Op::Slice(Slice { starts, ends, axes: sliced, steps }), &[&y])?;
    }
    if pads.iter().any(|&p| p != 0) {
        y = cx.op(Op::Pad(Pad { mode: PadMode::Constant, pads, value: 0.0 }), &[&y])?;
    }
    Ok(vec![y])
}

pub(crate) fn space_to_depth(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let b = n.opt_int("blocksize").ok_or("`blocksize` is required")? as u64;
    let d = static_shape(x, "SpaceToDepth")?;
    let [nb, c, h, w] = d[..] else { return Err("needs a rank-4 input".into()) };
    let (nb, c, h, w) = (nb as u64, c as u64, h as u64, w as u64);
    if b == 0 || h % b != 0 || w % b != 0 {
        return Err(format!("spatial dims {h}x{w} are not divisible by blocksize {b}"));
    }
    let perm = match n.string("mode").as_deref().unwrap_or("DCR") {
        "DCR" => vec![0, 3, 5, 1, 2, 4],
        "CRD" => vec![0, 1, 3, 5, 2, 4],
        other => return Err(format!("mode `{other}` is not supported")),
    };
    let y = super::reshape(cx, x, [nb, c, h / b, b, w / b, b].into_iter().map(Dim::Static).collect())?;
    let y = super::transpose(cx, &y, perm)?;
    Ok(vec![super::reshape(cx, &y, [nb, c * b * b, h / b, w / b].into_iter().map(Dim::Static).collect())?])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[i64]) -> Vec<DimArg> {
        v.iter().map(|&i| DimArg::Int(i)).collect()
    }

    #[test]
    fn reshape_targets_resolve() {
        let input = vec![Dim::sym("batch"), Dim::Static(12), Dim::Static(64)];
        assert_eq!(
            reshape_target(&input, &[DimArg::Sym("batch".into()), DimArg::Int(-1)], false).unwrap(),
            vec![Dim::sym("batch"), Dim::Static(768)]
        );
        assert_eq!(
            reshape_target(&input, &args(&[0, 0, 4, 16]), false).unwrap(),
            vec![Dim::sym("batch"), Dim::Static(12), Dim::Static(4), Dim::Static(16)]
        );
        assert!(reshape_target(&input, &args(&[-1, 64]), false).unwrap_err().contains("cannot infer"));
        let st = vec![Dim::Static(2), Dim::Static(6)];
        assert_eq!(reshape_target(&st, &args(&[3, -1]), false).unwrap(), vec![Dim::Static(3), Dim::Static(4)]);
        assert!(reshape_target(&st, &args(&[-1, -1]), false).is_err());
        assert!(reshape_target(&st, &args(&[5, -1]), false).is_err());
    }
}
