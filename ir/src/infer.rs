//! Type inference: the result types of an op from its operand types.
//!
//! Used by the builder as a graph is built, by the parser to check declared types, and by the verifier. Rules
//! work on symbolic dims where they can (broadcasting, elementwise, reductions, matmul batch dims); ops whose
//! output extents need arithmetic on a symbolic dim (conv, pool, slice, pad on that dim) require it to be static
//! and say so. Source ops (`input`, `param`) have no rule: their type is declared.

use crate::dim::DimExpr;
use crate::op::*;
use crate::types::{DType, Dim, Shape, TensorType, normalize_axis};

/// Result types of `op` applied to operands of `ins` types, or a message saying what is wrong.
pub fn infer(op: &Op, ins: &[TensorType]) -> Result<Vec<TensorType>, String> {
    if !op.arity().accepts(ins.len()) {
        return Err(format!("takes {} operand(s), got {}", op.arity(), ins.len()));
    }
    let one = |t: TensorType| Ok(vec![t]);
    match op {
        Op::Input(_) | Op::Parameter(_) => {
            Err("the type of a graph input or parameter is declared, not inferred".into())
        }
        Op::Constant(c) => one(c.value.tensor_type()),
        Op::Unary(k) => {
            let t = &ins[0];
            computable(t)?;
            match k {
                UnaryOp::Not => {
                    expect_dtype(t, |d| d == DType::Bool, "bool")?;
                    one(t.clone())
                }
                UnaryOp::BitNot => {
                    expect_dtype(t, DType::is_int, "an integer type")?;
                    one(t.clone())
                }
                UnaryOp::IsNan | UnaryOp::IsInf => {
                    expect_dtype(t, DType::is_float, "a float type")?;
                    one(TensorType::new(DType::Bool, t.shape.clone()))
                }
                k if k.is_float_only() => {
                    expect_dtype(t, DType::is_float, "a float type")?;
                    one(t.clone())
                }
                _ => {
                    expect_dtype(t, |d| d != DType::Bool, "a numeric type")?;
                    one(t.clone())
                }
            }
        }
        Op::Binary(k) => {
            let (a, b) = (&ins[0], &ins[1]);
            if a.dtype != b.dtype {
                return Err(format!("operand dtypes differ: {} and {}", a.dtype, b.dtype));
            }
            computable(a)?;
            if k.is_logical() {
                expect_dtype(a, |d| d == DType::Bool, "bool")?;
            } else if k.is_bitwise() {
                expect_dtype(a, DType::is_int, "an integer type")?;
            } else if *k != BinaryOp::Eq {
                expect_dtype(a, |d| d != DType::Bool, "a numeric type")?;
            }
            let shape = a.shape.broadcast(&b.shape)?;
            let dtype = if k.is_comparison() { DType::Bool } else { a.dtype };
            one(TensorType::new(dtype, shape))
        }
        Op::Cast(c) => one(TensorType::new(c.to, ins[0].shape.clone())),
        Op::Select => {
            expect_dtype(&ins[0], |d| d == DType::Bool, "bool (the condition)")?;
            if ins[1].dtype != ins[2].dtype {
                return Err(format!("branch dtypes differ: {} and {}", ins[1].dtype, ins[2].dtype));
            }
            let shape = ins[0].shape.broadcast(&ins[1].shape)?.broadcast(&ins[2].shape)?;
            one(TensorType::new(ins[1].dtype, shape))
        }
        Op::Reduce(r) => {
            let t = &ins[0];
            computable(t)?;
            if r.kind != ReduceKind::Max && r.kind != ReduceKind::Min {
                expect_dtype(t, |d| d != DType::Bool, "a numeric type")?;
            }
            let axes = normalize_axes(&r.axes, t.shape.rank())?;
            one(TensorType::new(t.dtype, reduced_shape(&t.shape, &axes, r.keep_dims)))
        }
        Op::ArgReduce(r) => {
            let t = &ins[0];
            computable(t)?;
            if t.shape.rank() == 0 {
                return Err("needs an operand of rank 1 or more".into());
            }
            let axis = normalize_axis(r.axis, t.shape.rank())?;
            one(TensorType::new(DType::I64, reduced_shape(&t.shape, &[axis], r.keep_dims)))
        }
        Op::TopK(t) => {
            let x = &ins[0];
            computable(x)?;
            expect_dtype(x, |d| d != DType::Bool, "a numeric type")?;
            if x.shape.rank() == 0 {
                return Err("needs an operand of rank 1 or more".into());
            }
            let axis = normalize_axis(t.axis, x.shape.rank())?;
            let k = match ins.get(1) {
                // A run-time `k`: the attribute names the data-dependent extent.
                Some(k) => {
                    if k.dtype != DType::I64 || k.shape.num_elements().is_none_or(|n| n != 1) {
                        return Err(format!("the run-time k must be one i64 element, got {k}"));
                    }
                    match &t.k {
                        Dim::Sym(name) => count_dim(name)?,
                        // Specialized (`infer-shapes` bound the symbol): the run-time k must be this value.
                        Dim::Static(k) => Dim::Static(*k),
                    }
                }
                None => t.k.clone(),
            };
            if let (Some(k), Some(n)) = (k.as_static(), x.shape.0[axis].as_static())
                && k > n
            {
                return Err(format!("k={k} is out of range for an axis of extent {n}"));
            }
            let mut shape = x.shape.clone();
            shape.0[axis] = k;
            Ok(vec![TensorType::new(x.dtype, shape.clone()), TensorType::new(DType::I64, shape)])
        }
        Op::NonZero(n) => {
            let x = &ins[0];
            computable(x)?;
            let count = count_dim(&n.count)?;
            one(TensorType::new(DType::I64, Shape(vec![Dim::Static(x.shape.rank() as u64), count])))
        }
        Op::Unique(u) => {
            let x = &ins[0];
            computable(x)?;
            let count = count_dim(&u.count)?;
            let (y, n) = if u.flatten {
                let n = x.shape.0.iter().try_fold(crate::dim::DimExpr::constant(1), |acc, d| {
                    crate::dim::DimExpr::of(d).map(|e| acc.mul(&e))
                });
                let n = n.and_then(|e| e.to_dim()).ok_or("cannot size the flattened operand")?;
                (Shape(vec![count.clone()]), n)
            } else {
                let axis = normalize_axis(u.axis, x.shape.rank())?;
                let mut y = x.shape.clone();
                let n = std::mem::replace(&mut y.0[axis], count.clone());
                (y, n)
            };
            let vec_of = |d: Dim| TensorType::new(DType::I64, Shape(vec![d]));
            Ok(vec![TensorType::new(x.dtype, y), vec_of(count.clone()), vec_of(n), vec_of(count)])
        }
        Op::NonMaxSuppression(n) => {
            let (boxes, scores) = (&ins[0], &ins[1]);
            for (t, what) in [(boxes, "boxes"), (scores, "scores")] {
                if t.dtype != DType::F32 || t.shape.rank() != 3 {
                    return Err(format!("{what} must be a rank-3 f32 tensor, got {t}"));
                }
            }
            let (b, s) = (&boxes.shape.0, &scores.shape.0);
            if b[2] != Dim::Static(4) || !same_extent(&b[0], &s[0]) || !same_extent(&b[1], &s[2]) {
                return Err(format!(
                    "boxes {} and scores {} must be [batches, boxes, 4] and [batches, classes, boxes]",
                    boxes.shape, scores.shape
                ));
            }
            for (t, what, dtype) in
                [(&ins[2], "max boxes per class", DType::I64), (&ins[3], "IoU threshold", DType::F32)]
                    .into_iter()
                    .chain(ins.get(4).map(|t| (t, "score threshold", DType::F32)))
            {
                if t.dtype != dtype || t.shape.num_elements().is_some_and(|n| n > 1) {
                    return Err(format!("the {what} must be one {dtype} element, got {t}"));
                }
            }
            one(TensorType::new(DType::I64, Shape(vec![count_dim(&n.count)?, Dim::Static(3)])))
        }
        Op::MatMul => matmul(&ins[0], &ins[1]).map(|t| vec![t]),
        Op::Conv(c) => conv(c, ins).map(|t| vec![t]),
        Op::MatMulInteger => matmul_integer(ins).map(|t| vec![t]),
        Op::ConvInteger(c) => conv_integer(c, ins).map(|t| vec![t]),
        Op::DynamicQuantize => {
            expect_dtype(&ins[0], |d| d == DType::F32, "f32")?;
            let scalar = |d| TensorType::new(d, Shape(vec![]));
            Ok(vec![TensorType::new(DType::U8, ins[0].shape.clone()), scalar(DType::F32), scalar(DType::U8)])
        }
        Op::ConvTranspose(c) => conv_transpose(c, ins).map(|t| vec![t]),
        Op::Pool(p) => pool(p, &ins[0]).map(|t| vec![t]),
        Op::Reshape(r) => {
            let t = &ins[0];
            if let (Some(a), Some(b)) = (t.shape.num_elements(), r.shape.num_elements())
                && a != b
            {
                return Err(format!("cannot reshape {} ({a} elements) to {} ({b} elements)", t.shape, r.shape));
            }
            if !t.shape.is_static() || !r.shape.is_static() {
                check_symbolic_reshape(&t.shape, &r.shape)?;
            }
            one(TensorType::new(t.dtype, r.shape.clone()))
        }
        Op::Transpose(p) => {
            let t = &ins[0];
            let perm = check_perm(&p.perm, t.shape.rank())?;
            one(TensorType::new(t.dtype, Shape(perm.iter().map(|&i| t.shape.0[i].clone()).collect())))
        }
        Op::Broadcast(b) => {
            let t = &ins[0];
            let out = t.shape.broadcast(&b.shape)?;
            if out != b.shape {
                return Err(format!("{} does not broadcast to {} (result would be {out})", t.shape, b.shape));
            }
            one(TensorType::new(t.dtype, out))
        }
        Op::Slice(s) => slice(s, &ins[0]).map(|t| vec![t]),
        Op::Concat(c) => {
            let rank = ins[0].shape.rank();
            if rank == 0 {
                return Err("cannot concatenate scalars".into());
            }
            let axis = normalize_axis(c.axis, rank)?;
            let mut total = 0u64;
            let mut sym: Option<DimExpr> = None;
            for (i, t) in ins.iter().enumerate() {
                if t.dtype != ins[0].dtype || t.shape.rank() != rank {
                    return Err(format!("operand {i} is {t}, but operand 0 is {}", ins[0]));
                }
                for d in 0..rank {
                    if d != axis && t.shape.0[d] != ins[0].shape.0[d] {
                        return Err(format!("operand {i} is {t}, but operand 0 is {} (dim {d} differs)", ins[0]));
                    }
                }
                match &t.shape.0[axis] {
                    Dim::Static(n) => total = total.checked_add(*n).ok_or("the concatenated extent overflows")?,
                    d @ Dim::Sym(_) => {
                        let e = dim_expr(d)?;
                        sym = Some(sym.map_or(e.clone(), |s| s.add(&e)));
                    }
                }
            }
            let mut shape = ins[0].shape.clone();
            shape.0[axis] = match sym {
                // The sum of the symbolic extents and the static ones: a derived dim.
                Some(s) => {
                    let total = i64::try_from(total).map_err(|_| "the concatenated extent overflows")?;
                    expr_dim(&s.add_constant(total))?
                }
                None => Dim::Static(total),
            };
            one(TensorType::new(ins[0].dtype, shape))
        }
        Op::Split(s) => {
            let t = &ins[0];
            let axis = normalize_axis(s.axis, t.shape.rank())?;
            let extent = static_dim(&t.shape, axis, "split")?;
            if s.sizes.iter().any(|&n| n < 0)
                || s.sizes.iter().try_fold(0u64, |a, &n| a.checked_add(n as u64)) != Some(extent)
            {
                return Err(format!("sizes {:?} do not add up to the axis extent {extent}", s.sizes));
            }
            Ok(s.sizes
                .iter()
                .map(|&n| {
                    let mut shape = t.shape.clone();
                    shape.0[axis] = Dim::Static(n as u64);
                    TensorType::new(t.dtype, shape)
                })
                .collect())
        }
        Op::Pad(p) => {
            let t = &ins[0];
            let r = t.shape.rank();
            if p.pads.len() != 2 * r {
                return Err(format!("pads has {} entries; rank {r} needs {}", p.pads.len(), 2 * r));
            }
            let mut shape = t.shape.clone();
            for d in 0..r {
                let (b, e) = (p.pads[d], p.pads[d + r]);
                if b == 0 && e == 0 {
                    continue;
                }
                if let Dim::Sym(_) = &t.shape.0[d] {
                    if p.mode != PadMode::Constant && (b > 0 || e > 0) {
                        return Err(format!(
                            "{} padding of symbolic dim `{}` needs a static extent",
                            p.mode.name(),
                            t.shape.0[d]
                        ));
                    }
                    let grow = b.checked_add(e).ok_or("the padding overflows")?;
                    shape.0[d] = expr_dim(&dim_expr(&t.shape.0[d])?.add_constant(grow))?;
                    continue;
                }
                let n = static_dim(&t.shape, d, "pad")? as i128 + b as i128 + e as i128;
                if n < 0 {
                    return Err(format!("padding dim {d} by ({b}, {e}) leaves a negative extent"));
                }
                if p.mode != PadMode::Constant && (b > 0 || e > 0) && static_dim(&t.shape, d, "pad")? == 0 {
                    return Err(format!("{} padding of the empty dim {d}", p.mode.name()));
                }
                if p.mode == PadMode::Reflect && (b.max(e) as u64) >= static_dim(&t.shape, d, "pad")? {
                    return Err(format!("reflect padding of {} on dim {d} needs an extent above it", b.max(e)));
                }
                shape.0[d] = extent(n)?;
            }
            one(TensorType::new(t.dtype, shape))
        }
        Op::Gather(g) => {
            let (data, idx) = (&ins[0], &ins[1]);
            expect_index(idx)?;
            if data.shape.rank() == 0 {
                return Err("cannot gather from a scalar".into());
            }
            let axis = normalize_axis(g.axis, data.shape.rank())?;
            let mut dims = data.shape.0[..axis].to_vec();
            dims.extend(idx.shape.0.iter().cloned());
            dims.extend(data.shape.0[axis + 1..].iter().cloned());
            one(TensorType::new(data.dtype, Shape(dims)))
        }
        Op::GatherElements(g) => {
            let (data, idx) = (&ins[0], &ins[1]);
            expect_index(idx)?;
            if data.shape.rank() != idx.shape.rank() || data.shape.rank() == 0 {
                return Err(format!("indices {} must have the data's rank ({})", idx.shape, data.shape));
            }
            normalize_axis(g.axis, data.shape.rank())?;
            one(TensorType::new(data.dtype, idx.shape.clone()))
        }
        Op::Scatter(s) => {
            let (data, idx, upd) = (&ins[0], &ins[1], &ins[2]);
            expect_index(idx)?;
            if idx.shape != upd.shape || idx.shape.rank() != data.shape.rank() || data.shape.rank() == 0 {
                return Err(format!(
                    "indices {} and updates {} must match, with the data's rank",
                    idx.shape, upd.shape
                ));
            }
            if upd.dtype != data.dtype {
                return Err(format!("updates are {}, data is {}", upd.dtype, data.dtype));
            }
            normalize_axis(s.axis, data.shape.rank())?;
            one(data.clone())
        }
        Op::Iota(i) => {
            normalize_axis(i.axis, i.shape.rank())?;
            if i.shape.rank() == 0 {
                return Err("needs a result of rank 1 or more".into());
            }
            one(TensorType::new(i.dtype, i.shape.clone()))
        }
        Op::ShapeOf => one(TensorType::of(DType::I64, &[ins[0].shape.rank() as u64])),
        Op::Softmax(s) | Op::LogSoftmax(s) => {
            expect_dtype(&ins[0], DType::is_float, "a float type")?;
            normalize_axis(s.axis, ins[0].shape.rank())?;
            one(ins[0].clone())
        }
        Op::LayerNorm(l) => {
            let x = &ins[0];
            expect_dtype(x, DType::is_float, "a float type")?;
            let axis = normalize_axis(l.axis, x.shape.rank())?;
            let norm = Shape(x.shape.0[axis..].to_vec());
            for (i, t) in ins.iter().enumerate().skip(1) {
                if t.dtype != x.dtype {
                    return Err(format!("operand {i} is {}, x is {}", t.dtype, x.dtype));
                }
                let b = norm.broadcast(&t.shape)?;
                if b != norm {
                    return Err(format!(
                        "operand {i} of shape {} does not broadcast to the normalized dims {norm}",
                        t.shape
                    ));
                }
            }
            one(x.clone())
        }
        Op::BatchNorm(_) => {
            let x = &ins[0];
            expect_dtype(x, DType::is_float, "a float type")?;
            if x.shape.rank() < 2 {
                return Err(format!("x must be [N,C,...], got {}", x.shape));
            }
            for (i, t) in ins.iter().enumerate().skip(1) {
                if t.dtype != x.dtype || t.shape.rank() != 1 || t.shape.0[0] != x.shape.0[1] {
                    return Err(format!("operand {i} must be {}[{}], got {t}", x.dtype, x.shape.0[1]));
                }
            }
            one(x.clone())
        }
        Op::Gelu(_) => {
            expect_dtype(&ins[0], DType::is_float, "a float type")?;
            one(ins[0].clone())
        }
        Op::Resize(r) => {
            let t = &ins[0];
            if r.shape.rank() != t.shape.rank() || r.scales.len() != t.shape.rank() {
                return Err(format!(
                    "shape {} and {} scales must match the input rank {}",
                    r.shape,
                    r.scales.len(),
                    t.shape.rank()
                ));
            }
            if matches!(r.mode, ResizeMode::Linear | ResizeMode::Cubic) {
                expect_dtype(t, DType::is_float, "a float type")?;
            }
            let crop = r.coord == crate::op::CoordMode::TfCropAndResize;
            if crop && r.roi.len() != 2 * t.shape.rank() {
                return Err(format!(
                    "tf_crop_and_resize needs a roi of {} values, got {}",
                    2 * t.shape.rank(),
                    r.roi.len()
                ));
            }
            if crop && matches!(t.dtype, DType::I64 | DType::U64) {
                return Err(format!("tf_crop_and_resize of {} is not supported", t.dtype));
            }
            one(TensorType::new(t.dtype, r.shape.clone()))
        }
        Op::GridSample(_) => {
            let (x, grid) = (&ins[0], &ins[1]);
            expect_dtype(x, DType::is_float, "float data")?;
            computable(x)?;
            expect_dtype(grid, DType::is_float, "a float grid")?;
            computable(grid)?;
            let rank = x.shape.rank();
            if rank < 3 || grid.shape.rank() != rank {
                return Err(format!(
                    "needs data [N, C, D…] and a grid [N, O…, r] of one rank ≥ 3, got {} and {}",
                    x.shape, grid.shape
                ));
            }
            if grid.shape.0[rank - 1].as_static() != Some(rank as u64 - 2) {
                return Err(format!(
                    "the grid's last dim holds the {} spatial coordinates, got {}",
                    rank - 2,
                    grid.shape.0[rank - 1]
                ));
            }
            if !same_extent(&x.shape.0[0], &grid.shape.0[0]) {
                return Err(format!("data batch {} and grid batch {} differ", x.shape.0[0], grid.shape.0[0]));
            }
            let mut dims = vec![x.shape.0[0].clone(), x.shape.0[1].clone()];
            dims.extend_from_slice(&grid.shape.0[1..rank - 1]);
            one(TensorType::new(x.dtype, Shape(dims)))
        }
        Op::RoiAlign(a) => {
            let (x, rois, idx) = (&ins[0], &ins[1], &ins[2]);
            expect_dtype(x, DType::is_float, "float data")?;
            computable(x)?;
            if rois.dtype != x.dtype {
                return Err(format!("rois {} must have the data's dtype {}", rois.dtype, x.dtype));
            }
            expect_index(idx)?;
            if x.shape.rank() != 4 || rois.shape.rank() != 2 || idx.shape.rank() != 1 {
                return Err(format!(
                    "needs x [N, C, H, W], rois [R, 4] and batch_indices [R], got {}, {} and {}",
                    x.shape, rois.shape, idx.shape
                ));
            }
            if rois.shape.0[1].as_static() != Some(4) || !same_extent(&rois.shape.0[0], &idx.shape.0[0]) {
                return Err(format!("rois {} and batch_indices {} must be [R, 4] and [R]", rois.shape, idx.shape));
            }
            if a.output_height < 1 || a.output_width < 1 || a.sampling_ratio < 0 || !a.spatial_scale.is_finite() {
                return Err(format!(
                    "output {}×{} must be positive, sampling_ratio {} non-negative, spatial_scale {} finite",
                    a.output_height, a.output_width, a.sampling_ratio, a.spatial_scale
                ));
            }
            let dims = vec![
                rois.shape.0[0].clone(),
                x.shape.0[1].clone(),
                Dim::Static(a.output_height as u64),
                Dim::Static(a.output_width as u64),
            ];
            one(TensorType::new(x.dtype, Shape(dims)))
        }
        Op::Lstm(l) => recurrent(ins, l.hidden_size, l.direction, 4, 8, true),
        Op::Gru(g) => recurrent(ins, g.hidden_size, g.direction, 3, 6, false),
        Op::Fusion(f) => f.body.infer(ins),
        Op::If(i) => if_types(i, ins),
        Op::Loop(l) => loop_types(l, ins),
    }
}

/// The symbols `types` mention (in derived dims too): those the operands of a region op bind.
fn symbols_of(types: &[TensorType]) -> std::collections::BTreeSet<String> {
    types.iter().flat_map(|t| &t.shape.0).filter_map(DimExpr::of).flat_map(|e| e.symbols()).collect()
}

/// Whether a region's extent `d` means the same outside it: static, or made of symbols the operands bind.
fn stable(d: &Dim, outer: &std::collections::BTreeSet<String>) -> bool {
    match d {
        Dim::Static(_) => true,
        Dim::Sym(_) => DimExpr::of(d).is_some_and(|e| e.symbols().iter().all(|s| outer.contains(s))),
    }
}

/// The data-dependent dim of a region op's result `result` along `axis`.
fn region_dim(count: &str, result: usize, axis: usize) -> Dim {
    Dim::sym(format!("{count}_{result}_{axis}"))
}

fn if_types(i: &If, ins: &[TensorType]) -> Result<Vec<TensorType>, String> {
    let cond = &ins[0];
    expect_dtype(cond, |d| d == DType::Bool, "a bool condition")?;
    if cond.shape.num_elements() != Some(1) {
        return Err(format!("the condition must be one element, got {cond}"));
    }
    count_dim(&i.count)?;
    let captures = &ins[1..];
    let then_types = i.then_branch.infer(captures).map_err(|e| format!("then_branch: {e}"))?;
    let else_types = i.else_branch.infer(captures).map_err(|e| format!("else_branch: {e}"))?;
    if then_types.len() != else_types.len() {
        return Err(format!("then_branch gives {} output(s), else_branch {}", then_types.len(), else_types.len()));
    }
    let outer = symbols_of(ins);
    then_types
        .iter()
        .zip(&else_types)
        .enumerate()
        .map(|(k, (a, b))| {
            if a.dtype != b.dtype || a.shape.rank() != b.shape.rank() {
                return Err(format!("output {k}: then_branch gives {a}, else_branch {b}"));
            }
            let dims = (a.shape.0.iter().zip(&b.shape.0).enumerate())
                .map(
                    |(axis, (x, y))| {
                        if x == y && stable(x, &outer) { x.clone() } else { region_dim(&i.count, k, axis) }
                    },
                )
                .collect();
            Ok(TensorType::new(a.dtype, Shape(dims)))
        })
        .collect()
}

fn loop_types(l: &Loop, ins: &[TensorType]) -> Result<Vec<TensorType>, String> {
    let count = count_dim(&l.count)?;
    let n = usize::try_from(l.carried)
        .ok()
        .filter(|&n| n <= ins.len() - 2)
        .ok_or_else(|| format!("carried={} does not fit {} operand(s)", l.carried, ins.len()))?;
    let (max_trip, cond) = (&ins[0], &ins[1]);
    if max_trip.dtype != DType::I64 || max_trip.shape.rank() != 0 {
        return Err(format!("max_trip must be an i64 scalar, got {max_trip}"));
    }
    if cond.dtype != DType::Bool || cond.shape.rank() != 0 {
        return Err(format!("cond must be a bool scalar, got {cond}"));
    }
    if let Some(p) = l.body.problems(ins.len()).into_iter().next() {
        return Err(p);
    }
    let body = &l.body.0;
    let declared = (body.inputs().iter())
        .map(|&id| body.node(id).outputs.first())
        .collect::<Option<Vec<&TensorType>>>()
        .ok_or("a body input declares no type")?;
    let outer = symbols_of(ins);
    for (k, (t, d)) in ins.iter().zip(&declared).enumerate() {
        // A carried value's body input may name its own symbols where the extent changes between iterations.
        let fits = if (2..2 + n).contains(&k) {
            t.dtype == d.dtype
                && t.shape.rank() == d.shape.rank()
                && t.shape.0.iter().zip(&d.shape.0).all(|(a, b)| a == b || !stable(b, &outer))
        } else {
            t == *d
        };
        if !fits {
            return Err(format!("operand {k} is {t}, but body input p{k} is {d}"));
        }
    }
    let outs = (body.outputs().iter())
        .map(|(name, v)| {
            body.value_type(*v)
                .cloned()
                .ok_or_else(|| format!("body output \"{}\" names no value", name.escape_debug()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if outs.len() < 1 + n {
        return Err(format!(
            "the body gives {} output(s), fewer than the condition and {n} carried value(s)",
            outs.len()
        ));
    }
    if outs[0].dtype != DType::Bool || outs[0].shape.num_elements() != Some(1) {
        return Err(format!("the body's first output (the condition) must be one bool, got {}", outs[0]));
    }
    let mut results = Vec::with_capacity(outs.len() - 1);
    for k in 0..n {
        let (init, input, output) = (&ins[2 + k], declared[2 + k], &outs[1 + k]);
        if input.dtype != output.dtype || input.shape.rank() != output.shape.rank() {
            return Err(format!("carried value {k}: the body takes {input} and gives {output}"));
        }
        // An extent the body leaves as it found it is the initial one after any number of iterations.
        let dims = (0..init.shape.rank())
            .map(|axis| {
                let d = &init.shape.0[axis];
                if input.shape.0[axis] == output.shape.0[axis] && stable(d, &outer) {
                    d.clone()
                } else {
                    region_dim(&l.count, k, axis)
                }
            })
            .collect();
        results.push(TensorType::new(init.dtype, Shape(dims)));
    }
    for (j, t) in outs[1 + n..].iter().enumerate() {
        let dims =
            std::iter::once(count.clone())
                .chain(
                    t.shape.0.iter().enumerate().map(|(axis, d)| {
                        if stable(d, &outer) { d.clone() } else { region_dim(&l.count, n + j, axis + 1) }
                    }),
                )
                .collect();
        results.push(TensorType::new(t.dtype, Shape(dims)));
    }
    Ok(results)
}

/// Arithmetic, comparisons and reductions are not defined on the narrow storage types (float8, float4, int4, int2):
/// they are cast and moved only.
/// The data-dependent dim an op's `count` attribute names.
fn count_dim(name: &str) -> Result<Dim, String> {
    if crate::dim::is_identifier(name) {
        Ok(Dim::sym(name))
    } else {
        Err(format!("count symbol `{name}` is not an identifier"))
    }
}

/// Whether two dims may be the same extent: equal, or either one symbolic and not provably different.
fn same_extent(a: &Dim, b: &Dim) -> bool {
    a == b || matches!((a, b), (Dim::Sym(_), _) | (_, Dim::Sym(_)))
}

fn computable(t: &TensorType) -> Result<(), String> {
    if t.dtype.is_narrow() {
        return Err(format!("{} values are only cast and moved; cast them to a wider type to compute", t.dtype));
    }
    Ok(())
}

fn expect_dtype(t: &TensorType, ok: impl Fn(DType) -> bool, what: &str) -> Result<(), String> {
    if ok(t.dtype) { Ok(()) } else { Err(format!("needs {what}, got {}", t.dtype)) }
}

fn expect_index(t: &TensorType) -> Result<(), String> {
    expect_dtype(t, |d| matches!(d, DType::I32 | DType::I64), "i32 or i64 indices")
}

fn static_dim(s: &Shape, d: usize, what: &str) -> Result<u64, String> {
    s.0[d].as_static().ok_or_else(|| format!("{what} on symbolic dim `{}` (dim {d}) needs a static extent", s.0[d]))
}

/// Normalized, sorted, de-duplicated axes.
pub fn normalize_axes(axes: &[i64], rank: usize) -> Result<Vec<usize>, String> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = if rank == 0 {
            return Err(format!("axis {a} is out of range for rank 0"));
        } else {
            normalize_axis(a, rank)?
        };
        if out.contains(&n) {
            return Err(format!("axis {a} is repeated"));
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}

fn reduced_shape(s: &Shape, axes: &[usize], keep: bool) -> Shape {
    Shape(
        s.0.iter()
            .enumerate()
            .filter_map(|(i, d)| match (axes.contains(&i), keep) {
                (false, _) => Some(d.clone()),
                (true, true) => Some(Dim::Static(1)),
                (true, false) => None,
            })
            .collect(),
    )
}

fn check_perm(perm: &[i64], rank: usize) -> Result<Vec<usize>, String> {
    let mut seen = vec![false; rank];
    if perm.len() != rank {
        return Err(format!("perm {perm:?} has {} entries for rank {rank}", perm.len()));
    }
    perm.iter()
        .map(|&p| {
            let i = usize::try_from(p)
                .ok()
                .filter(|&i| i < rank && !seen[i])
                .ok_or_else(|| format!("perm {perm:?} is not a permutation of 0..{rank}"))?;
            seen[i] = true;
            Ok(i)
        })
        .collect()
}

fn check_symbolic_reshape(from: &Shape, to: &Shape) -> Result<(), String> {
    // With symbols, the element counts must agree as products of symbols times a static factor.
    fn split(s: &Shape) -> (Vec<&str>, u64) {
        let mut syms: Vec<&str> = Vec::new();
        let mut n = 1u64;
        for d in &s.0 {
            match d {
                Dim::Static(k) => n = n.saturating_mul(*k),
                Dim::Sym(x) => syms.push(x),
            }
        }
        syms.sort_unstable();
        (syms, n)
    }
    let (a, b) = (split(from), split(to));
    if a == b || a.1 == 0 && b.1 == 0 {
        Ok(())
    } else {
        Err(format!("cannot reshape {from} to {to}: element counts differ"))
    }
}

/// numpy `matmul` typing.
pub fn matmul(a: &TensorType, b: &TensorType) -> Result<TensorType, String> {
    if a.dtype != b.dtype {
        return Err(format!("operand dtypes differ: {} and {}", a.dtype, b.dtype));
    }
    expect_dtype(a, |d| d != DType::Bool, "a numeric type")?;
    let (ra, rb) = (a.shape.rank(), b.shape.rank());
    if ra == 0 || rb == 0 {
        return Err("operands must have rank 1 or more".into());
    }
    let (am, ak) = if ra == 1 { (None, &a.shape.0[0]) } else { (Some(&a.shape.0[ra - 2]), &a.shape.0[ra - 1]) };
    let (bk, bn) = if rb == 1 { (&b.shape.0[0], None) } else { (&b.shape.0[rb - 2], Some(&b.shape.0[rb - 1])) };
    if ak != bk {
        return Err(format!("contraction dims differ: {} has {ak}, {} has {bk}", a.shape, b.shape));
    }
    let batch_a = Shape(a.shape.0[..ra.saturating_sub(2)].to_vec());
    let batch_b = Shape(b.shape.0[..rb.saturating_sub(2)].to_vec());
    let mut dims = batch_a.broadcast(&batch_b)?.0;
    dims.extend(am.cloned());
    dims.extend(bn.cloned());
    Ok(TensorType::new(a.dtype, Shape(dims)))
}

/// `t` with dtype i32 (integer ops type-check their shapes as the float ops do, accumulating in i32).
fn as_i32(t: &TensorType) -> TensorType {
    TensorType::new(DType::I32, t.shape.clone())
}

/// Checks an 8-bit integer operand of an integer op and its zero point: the zero point has the operand's dtype and
/// is a scalar (rank 0, or `[1]`) or, when `per` is given, `[per]` (one value per row, column or channel).
fn quantized_operand(what: &str, t: &TensorType, zero: &TensorType, per: Option<&Dim>) -> Result<(), String> {
    expect_dtype(t, |d| matches!(d, DType::I8 | DType::U8), "i8 or u8 operands").map_err(|e| format!("{what}: {e}"))?;
    if zero.dtype != t.dtype {
        return Err(format!("{what}'s zero point is {} but {what} is {}", zero.dtype, t.dtype));
    }
    let ok = match zero.shape.dims() {
        [] | [Dim::Static(1)] => true,
        [d] => per == Some(d),
        _ => false,
    };
    if !ok {
        let per = per.map_or(String::new(), |d| format!(" or [{d}]"));
        return Err(format!("{what}'s zero point has shape {}, expected a scalar{per}", zero.shape));
    }
    Ok(())
}

/// `matmul_integer(a, b, a_zero, b_zero)`: i8/u8 operands, i32 result.
fn matmul_integer(ins: &[TensorType]) -> Result<TensorType, String> {
    let (a, b) = (&ins[0], &ins[1]);
    let out = matmul(&as_i32(a), &as_i32(b))?;
    let rows = (a.shape.rank() >= 2).then(|| &a.shape.0[a.shape.rank() - 2]);
    let cols = (b.shape.rank() >= 2).then(|| &b.shape.0[b.shape.rank() - 1]);
    quantized_operand("a", a, &ins[2], rows)?;
    quantized_operand("b", b, &ins[3], cols)?;
    Ok(out)
}

/// `conv_integer(x, w, x_zero, w_zero)`: i8/u8 operands, i32 result.
fn conv_integer(c: &Conv, ins: &[TensorType]) -> Result<TensorType, String> {
    let (x, w) = (&ins[0], &ins[1]);
    let out = conv(c, &[as_i32(x), as_i32(w)])?;
    quantized_operand("x", x, &ins[2], None)?;
    quantized_operand("w", w, &ins[3], w.shape.0.first())?;
    Ok(out)
}

/// The expression of symbolic dim `d` ([`crate::dim`]).
fn dim_expr(d: &Dim) -> Result<DimExpr, String> {
    DimExpr::of(d).ok_or_else(|| format!("dim `{d}` is not a symbol or a dim expression"))
}

/// The dim of expression `e` (a derived dim when symbolic); `Err` when it is a negative constant.
fn expr_dim(e: &DimExpr) -> Result<Dim, String> {
    if !e.within_limits() {
        return Err("the symbolic extent grows too complex to track (too many terms)".into());
    }
    e.to_dim().ok_or_else(|| format!("computed extent {e} is negative"))
}

/// The output extent of a sliding window over symbolic input extent `x`: `floor((x + pads - eff) / stride) + 1`
/// (conv, and pooling without ceil mode). Whether the padded input covers the window is checked when the
/// symbols are bound (a negative extent is an error then).
fn window_dim(x: &Dim, pads: i128, eff: i128, stride: i64) -> Result<Dim, String> {
    let shift = i64::try_from(pads - eff).map_err(|_| "the window arithmetic overflows".to_string())?;
    expr_dim(&dim_expr(x)?.add_constant(shift).floor_div(stride).add_constant(1))
}

/// A computed extent as a static dim. Shape arithmetic runs in i128, wide enough for any i64 attributes and u64
/// dims, so absurd attribute values give an error instead of an overflow.
fn extent(n: i128) -> Result<Dim, String> {
    u64::try_from(n).map(Dim::Static).map_err(|_| format!("computed extent {n} is out of range"))
}

fn check_window(name: &str, v: &[i64], n: usize, positive: bool) -> Result<(), String> {
    if v.len() != n {
        return Err(format!("{name} has {} entries for {n} spatial dims", v.len()));
    }
    if positive && v.iter().any(|&s| s < 1) || v.iter().any(|&s| s < 0) {
        return Err(format!("{name} {v:?} must be {}", if positive { "positive" } else { "non-negative" }));
    }
    Ok(())
}

fn conv(c: &Conv, ins: &[TensorType]) -> Result<TensorType, String> {
    let (x, w) = (&ins[0], &ins[1]);
    expect_dtype(x, |d| d != DType::Bool, "a numeric type")?;
    if x.shape.rank() < 3 || w.shape.rank() != x.shape.rank() || x.dtype != w.dtype {
        return Err(format!("needs x[N,C,*] and w[M,C/groups,*] of one dtype and rank ≥ 3, got {x} and {w}"));
    }
    let n = x.shape.rank() - 2;
    check_window("strides", &c.strides, n, true)?;
    check_window("dilations", &c.dilations, n, true)?;
    check_window("pads", &c.pads, 2 * n, false)?;
    let wd = w.shape.as_static().ok_or("weights need a static shape")?;
    let ch = static_dim(&x.shape, 1, "conv")? as usize;
    if c.groups < 1
        || !ch.is_multiple_of(c.groups as usize)
        || wd[0] % c.groups as usize != 0
        || wd[1].checked_mul(c.groups as usize) != Some(ch)
    {
        return Err(format!("channels {ch}, weights {w} and groups {} disagree", c.groups));
    }
    check_bias(ins.get(2), wd[0], x.dtype)?;
    let mut dims = vec![x.shape.0[0].clone(), Dim::Static(wd[0] as u64)];
    for i in 0..n {
        let eff = (wd[2 + i] as i128 - 1) * c.dilations[i] as i128 + 1;
        let Some(sp) = x.shape.0[2 + i].as_static().map(i128::from) else {
            dims.push(window_dim(&x.shape.0[2 + i], c.pads[i] as i128 + c.pads[i + n] as i128, eff, c.strides[i])?);
            continue;
        };
        let span = sp + c.pads[i] as i128 + c.pads[i + n] as i128 - eff;
        if span < 0 {
            return Err(format!(
                "kernel extent {eff} exceeds padded input {} on spatial dim {i}",
                sp + c.pads[i] as i128 + c.pads[i + n] as i128
            ));
        }
        dims.push(extent(span / c.strides[i] as i128 + 1)?);
    }
    Ok(TensorType::new(x.dtype, Shape(dims)))
}

fn check_bias(bias: Option<&TensorType>, m: usize, dtype: DType) -> Result<(), String> {
    match bias {
        Some(b) if b.dtype != dtype || b.shape != Shape::of(&[m as u64]) => {
            Err(format!("bias must be {dtype}[{m}], got {b}"))
        }
        _ => Ok(()),
    }
}

fn conv_transpose(c: &ConvTranspose, ins: &[TensorType]) -> Result<TensorType, String> {
    let (x, w) = (&ins[0], &ins[1]);
    expect_dtype(x, DType::is_float, "a float type")?;
    if x.shape.rank() < 3 || w.shape.rank() != x.shape.rank() || x.dtype != w.dtype {
        return Err(format!("needs x[N,C,*] and w[C,M/groups,*] of one dtype and rank ≥ 3, got {x} and {w}"));
    }
    let n = x.shape.rank() - 2;
    check_window("strides", &c.strides, n, true)?;
    check_window("dilations", &c.dilations, n, true)?;
    check_window("pads", &c.pads, 2 * n, false)?;
    check_window("output_padding", &c.output_padding, n, false)?;
    let wd = w.shape.as_static().ok_or("weights need a static shape")?;
    let ch = static_dim(&x.shape, 1, "conv_transpose")? as usize;
    if c.groups < 1 || wd[0] != ch || !ch.is_multiple_of(c.groups as usize) {
        return Err(format!("channels {ch}, weights {w} and groups {} disagree", c.groups));
    }
    let m = wd[1].checked_mul(c.groups as usize).ok_or("the output channel count overflows")?;
    check_bias(ins.get(2), m, x.dtype)?;
    let mut dims = vec![x.shape.0[0].clone(), Dim::Static(m as u64)];
    for i in 0..n {
        let grow = c.output_padding[i] as i128 + (wd[2 + i] as i128 - 1) * c.dilations[i] as i128 + 1
            - c.pads[i] as i128
            - c.pads[i + n] as i128
            - c.strides[i] as i128;
        let Some(sp) = x.shape.0[2 + i].as_static().map(i128::from) else {
            // stride·(x − 1) + output_padding + eff − pads.
            let grow = i64::try_from(grow).map_err(|_| "the window arithmetic overflows".to_string())?;
            dims.push(expr_dim(&dim_expr(&x.shape.0[2 + i])?.scale(c.strides[i]).add_constant(grow))?);
            continue;
        };
        let out = c.strides[i] as i128 * (sp - 1)
            + c.output_padding[i] as i128
            + (wd[2 + i] as i128 - 1) * c.dilations[i] as i128
            + 1
            - c.pads[i] as i128
            - c.pads[i + n] as i128;
        if out < 0 {
            return Err(format!("spatial dim {i} would have negative extent {out}"));
        }
        dims.push(extent(out)?);
    }
    Ok(TensorType::new(x.dtype, Shape(dims)))
}

/// Output extent of one pooled dim (shared with the interpreter so the two cannot disagree).
pub fn pool_extent(
    input: i64,
    k: i64,
    stride: i64,
    dilation: i64,
    pad_begin: i64,
    pad_end: i64,
    ceil_mode: bool,
) -> i64 {
    // i128 so that no i64 arguments overflow; the result saturates into i64.
    let (input, k, stride, dilation) = (input as i128, k as i128, stride as i128, dilation as i128);
    let (pad_begin, pad_end) = (pad_begin as i128, pad_end as i128);
    let eff = (k - 1) * dilation + 1;
    let span = input + pad_begin + pad_end - eff;
    if span < 0 {
        return 0;
    }
    let mut out = if ceil_mode { (span + stride - 1) / stride + 1 } else { span / stride + 1 };
    // A ceil-mode window must start inside the input or the left padding.
    if ceil_mode && (out - 1) * stride >= input + pad_begin {
        out -= 1;
    }
    out.clamp(i64::MIN.into(), i64::MAX.into()) as i64
}

fn pool(p: &Pool, x: &TensorType) -> Result<TensorType, String> {
    expect_dtype(x, |d| d != DType::Bool, "a numeric type")?;
    if p.kind == PoolKind::Avg {
        expect_dtype(x, DType::is_float, "a float type (average pooling)")?;
    }
    if x.shape.rank() < 3 {
        return Err(format!("needs x[N,C,*] of rank ≥ 3, got {}", x.shape));
    }
    let n = x.shape.rank() - 2;
    check_window("kernel", &p.kernel, n, true)?;
    check_window("strides", &p.strides, n, true)?;
    check_window("dilations", &p.dilations, n, true)?;
    check_window("pads", &p.pads, 2 * n, false)?;
    let mut dims = x.shape.0[..2].to_vec();
    for i in 0..n {
        let eff = (p.kernel[i] as i128 - 1) * p.dilations[i] as i128 + 1;
        let Some(sp) = x.shape.0[2 + i].as_static().map(i128::from) else {
            if p.pads[i] as i128 >= eff || p.pads[i + n] as i128 >= eff {
                return Err(format!("pads {:?} must be smaller than the window extent {eff}", p.pads));
            }
            let pads = p.pads[i] as i128 + p.pads[i + n] as i128;
            if p.ceil_mode {
                // ceil((x + pads − eff) / stride) + 1, unless the last window would start in the end padding —
                // which never happens when pad_end + stride ≤ eff (the usual 3×3/2 window); otherwise the extent
                // needs a min and a static input.
                if p.pads[i + n] as i128 + p.strides[i] as i128 > eff {
                    return Err(format!(
                        "ceil_mode with this window on symbolic dim `{}` needs a static extent",
                        x.shape.0[2 + i]
                    ));
                }
                let shift = i64::try_from(pads - eff).map_err(|_| "the window arithmetic overflows".to_string())?;
                let e = dim_expr(&x.shape.0[2 + i])?.add_constant(shift).ceil_div(p.strides[i]).add_constant(1);
                dims.push(expr_dim(&e)?);
                continue;
            }
            dims.push(window_dim(&x.shape.0[2 + i], pads, eff, p.strides[i])?);
            continue;
        };
        if sp + p.pads[i] as i128 + (p.pads[i + n] as i128) < eff {
            return Err(format!("window extent {eff} exceeds padded input on spatial dim {i}"));
        }
        if p.pads[i] as i128 >= eff || p.pads[i + n] as i128 >= eff {
            return Err(format!("pads {:?} must be smaller than the window extent {eff}", p.pads));
        }
        let input = i64::try_from(sp).map_err(|_| format!("spatial extent {sp} is out of range"))?;
        dims.push(extent(i128::from(pool_extent(
            input,
            p.kernel[i],
            p.strides[i],
            p.dilations[i],
            p.pads[i],
            p.pads[i + n],
            p.ceil_mode,
        )))?);
    }
    Ok(TensorType::new(x.dtype, Shape(dims)))
}

/// The clamped (start, step, count) of an ONNX slice on an axis of extent `n`.
pub fn slice_range(start: i64, end: i64, step: i64, n: i64) -> (i64, i64, i64) {
    let clamp = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
    let norm = |v: i64| if v < 0 { v.saturating_add(n) } else { v };
    if step > 0 {
        let s = clamp(norm(start), 0, n);
        let e = clamp(norm(end), 0, n);
        // i128: `step` may be anywhere in i64, and the count is at most `n`.
        let count = if e > s { (e as i128 - s as i128 + step as i128 - 1) / step as i128 } else { 0 };
        (s, step, count as i64)
    } else {
        let s = clamp(norm(start), -1, n - 1);
        let e = clamp(norm(end), -1, n - 1);
        let count = if s > e { (s as i128 - e as i128 - step as i128 - 1) / -(step as i128) } else { 0 };
        (s, step, count as i64)
    }
}

fn slice(s: &Slice, x: &TensorType) -> Result<TensorType, String> {
    let k = s.axes.len();
    if s.starts.len() != k || s.ends.len() != k || s.steps.len() != k {
        return Err("starts, ends, axes and steps must have one entry per sliced axis".into());
    }
    let axes = normalize_axes(&s.axes, x.shape.rank())?;
    let mut shape = x.shape.clone();
    for (i, &a) in s.axes.iter().enumerate() {
        let axis = normalize_axis(a, x.shape.rank())?;
        debug_assert!(axes.contains(&axis));
        if s.steps[i] == 0 {
            return Err("slice steps must be nonzero".into());
        }
        if let Some(d) = symbolic_slice(&x.shape.0[axis], s.starts[i], s.ends[i], s.steps[i]) {
            shape.0[axis] = d?;
            continue;
        }
        let n = static_dim(&x.shape, axis, "slice")?;
        let n = i64::try_from(n).map_err(|_| format!("slice of an axis of extent {n} is out of range"))?;
        let (_, _, count) = slice_range(s.starts[i], s.ends[i], s.steps[i], n);
        shape.0[axis] = Dim::Static(count as u64);
    }
    Ok(TensorType::new(x.dtype, shape))
}

/// The end of a slice that means "to the end" (ONNX exporters write `INT_MAX` or `INT64_MAX`).
pub const SLICE_TO_END: i64 = i32::MAX as i64;

/// The extent of a slice of symbolic dim `d`, for the slices whose bounds need no clamping against it: a step
/// ≥ 1 from a start ≥ 0 to the end (`x[1:]`) or to an end counted from the back (`x[:-1]`). The extent is a
/// derived dim; a run whose extent makes it negative is an input error, so the start is always in bounds.
/// `None` for a static dim; an error for other slices of a symbolic one (their clamping depends on the extent).
pub fn symbolic_slice(d: &Dim, start: i64, end: i64, step: i64) -> Option<Result<Dim, String>> {
    if d.as_static().is_some() {
        return None;
    }
    let refuse = || Err(format!("slice [{start}:{end}:{step}] of symbolic dim `{d}` needs a static extent"));
    if step < 1 || start < 0 {
        return Some(refuse());
    }
    let x = match dim_expr(d) {
        Ok(x) => x,
        Err(e) => return Some(Err(e)),
    };
    let span = if end >= SLICE_TO_END {
        x.add_constant(-start)
    } else if end < 0 {
        x.add_constant(end.saturating_sub(start))
    } else {
        return Some(refuse());
    };
    Some(expr_dim(&span.ceil_div(step)))
}

fn recurrent(
    ins: &[TensorType],
    hidden: i64,
    dir: RnnDirection,
    gates: u64,
    bias: u64,
    has_cell: bool,
) -> Result<Vec<TensorType>, String> {
    let x = &ins[0];
    expect_dtype(x, DType::is_float, "a float type")?;
    if x.shape.rank() != 3 || hidden < 1 {
        return Err(format!("needs x[seq,batch,input] and hidden_size ≥ 1, got {} and {hidden}", x.shape));
    }
    let dirs = if dir == RnnDirection::Bidirectional { 2 } else { 1 };
    let h = hidden as u64;
    let too_big = || format!("hidden_size {hidden} is out of range");
    let (gh, bh) = (gates.checked_mul(h).ok_or_else(too_big)?, bias.checked_mul(h).ok_or_else(too_big)?);
    let input = x.shape.0[2].clone();
    let batch = x.shape.0[1].clone();
    let want = |dims: Vec<Dim>| TensorType::new(x.dtype, Shape(dims));
    let mut expected = vec![
        ("w", want(vec![Dim::Static(dirs), Dim::Static(gh), input])),
        ("r", want(vec![Dim::Static(dirs), Dim::Static(gh), Dim::Static(h)])),
        ("b", want(vec![Dim::Static(dirs), Dim::Static(bh)])),
        ("h0", want(vec![Dim::Static(dirs), batch.clone(), Dim::Static(h)])),
    ];
    if has_cell {
        expected.push(("c0", want(vec![Dim::Static(dirs), batch.clone(), Dim::Static(h)])));
    }
    for (i, (name, t)) in expected.iter().enumerate() {
        if &ins[i + 1] != t {
            return Err(format!("{name} must be {t}, got {}", ins[i + 1]));
        }
    }
    let state = want(vec![Dim::Static(dirs), batch.clone(), Dim::Static(h)]);
    let mut out = vec![want(vec![x.shape.0[0].clone(), Dim::Static(dirs), batch, Dim::Static(h)]), state.clone()];
    if has_cell {
        out.push(state);
    }
    Ok(out)
}
