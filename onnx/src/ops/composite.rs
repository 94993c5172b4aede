//! ONNX ops kiln imports as compositions of IR primitives: losses, the less common normalizations and
//! activations, hardmax, eye-like, Lp pooling, SwiGLU, the signal windows (Hann, Hamming, Blackman), and the
//! affine sampling grid.

use kiln_ir::op::{
    ArgKind, ArgReduce, BinaryOp as B, GatherElements, Iota, Pool, PoolKind, Reduce, ReduceKind, Softmax, UnaryOp as U,
};
use kiln_ir::{DType, Dim, Op, Shape};

use super::{axis, bin, cast, dim_product, onnx_dtype, reshape, scalar_like, static_shape, transpose, un};
use crate::import::{Ctx, DimArg, Val};
use crate::node::OnnxNode;

fn reduce(cx: &mut Ctx<'_>, kind: ReduceKind, x: &Val, axes: Vec<i64>, keep: bool) -> Result<Val, String> {
    cx.op(Op::Reduce(Reduce { kind, axes, keep_dims: keep }), &[x])
}

/// Losses' `reduction` attribute.
#[derive(Copy, Clone, PartialEq)]
enum Reduction {
    None,
    Sum,
    Mean,
}

fn reduction(n: &OnnxNode<'_>) -> Result<Reduction, String> {
    match n.string("reduction").as_deref().unwrap_or("mean") {
        "none" => Ok(Reduction::None),
        "sum" => Ok(Reduction::Sum),
        "mean" => Ok(Reduction::Mean),
        other => Err(format!("reduction `{other}` is not supported")),
    }
}

/// Negative log-likelihood of `logp[N, C, d…]` at `target[N, d…]`, weighted, with ignored targets dropped.
fn nll(
    cx: &mut Ctx<'_>,
    logp: &Val,
    target: &Val,
    weight: Option<&Val>,
    ignore: Option<i64>,
    red: Reduction,
) -> Result<Val, String> {
    if target.rank() == 0 || logp.rank() < 2 {
        return Err(format!("needs scores of rank ≥ 2 and a target of rank ≥ 1, got {} and {}", logp.ty, target.ty));
    }
    let t = cast(cx, target, DType::I64)?;
    let keep = match ignore {
        Some(ii) => {
            let k = cx.scalar(DType::I64, ii as f64)?;
            let same = bin(cx, B::Eq, &t, &k)?;
            Some(un(cx, U::Not, &same)?)
        }
        None => None,
    };
    let zero_i = cx.scalar(DType::I64, 0.0)?;
    let safe = match &keep {
        Some(k) => cx.op(Op::Select, &[k, &t, &zero_i])?,
        None => t.clone(),
    };
    // picked[n, 1, d…] = logp[n, safe[n, d…], d…]
    let mut td = safe.ty.shape.0.clone();
    td.insert(1, Dim::Static(1));
    let idx = reshape(cx, &safe, td)?;
    let picked = cx.op(Op::GatherElements(GatherElements { axis: 1 }), &[logp, &idx])?;
    let picked = reshape(cx, &picked, safe.ty.shape.0.clone())?;
    let mut loss = un(cx, U::Neg, &picked)?;
    let zero = scalar_like(cx, logp, 0.0)?;
    let w = match weight {
        Some(w) => Some(cx.op(Op::Gather(kiln_ir::op::Gather { axis: 0 }), &[w, &safe])?),
        None => None,
    };
    let w = match (&keep, w) {
        (Some(k), Some(w)) => Some(cx.op(Op::Select, &[k, &w, &zero])?),
        (Some(k), None) => Some(cast(cx, k, logp.dtype())?),
        (None, w) => w,
    };
    if let Some(w) = &w {
        loss = bin(cx, B::Mul, &loss, w)?;
    }
    let all: Vec<i64> = (0..loss.rank() as i64).collect();
    match (red, &w) {
        (Reduction::None, _) => Ok(loss),
        (Reduction::Sum, _) => reduce(cx, ReduceKind::Sum, &loss, all, false),
        (Reduction::Mean, None) => reduce(cx, ReduceKind::Mean, &loss, all, false),
        (Reduction::Mean, Some(w)) => {
            let s = reduce(cx, ReduceKind::Sum, &loss, all.clone(), false)?;
            let ws = reduce(cx, ReduceKind::Sum, w, all, false)?;
            bin(cx, B::Div, &s, &ws)
        }
    }
}

pub(crate) fn nll_loss(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let red = reduction(n)?;
    let ignore = n.opt_int("ignore_index");
    Ok(vec![nll(cx, n.input(0)?, n.input(1)?, n.opt_input(2), ignore, red)?])
}

pub(crate) fn softmax_cross_entropy(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let red = reduction(n)?;
    let ignore = n.opt_int("ignore_index");
    let scores = n.input(0)?;
    let logp = cx.op(Op::LogSoftmax(Softmax { axis: 1 }), &[scores])?;
    let loss = nll(cx, &logp, n.input(1)?, n.opt_input(2), ignore, red)?;
    Ok(vec![loss, logp])
}

pub(crate) fn rms_norm(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, scale) = (n.input(0)?, n.input(1)?);
    let eps = n.float("epsilon", 1e-5) as f64;
    let stash = n.int("stash_type", 1);
    let rank = x.rank();
    let a = axis(n.int("axis", -1), rank)?;
    let work = if stash == 1 { DType::F32 } else { x.dtype() };
    let xw = cast(cx, x, work)?;
    let sq = bin(cx, B::Mul, &xw, &xw)?;
    let ms = reduce(cx, ReduceKind::Mean, &sq, (a as i64..rank as i64).collect(), true)?;
    let e = scalar_like(cx, &ms, eps)?;
    let d = bin(cx, B::Add, &ms, &e)?;
    let r = un(cx, U::Rsqrt, &d)?;
    let y = bin(cx, B::Mul, &xw, &r)?;
    let y = cast(cx, &y, x.dtype())?;
    Ok(vec![bin(cx, B::Mul, &y, scale)?])
}

/// LayerNormalization composed from primitives, for when its Mean and InvStdDev outputs are used.
pub(crate) fn layer_norm_with_stats(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let rank = x.rank();
    let a = axis(n.int("axis", -1), rank)?;
    let eps = n.float("epsilon", 1e-5) as f64;
    let work = if n.int("stash_type", 1) == 1 { DType::F32 } else { x.dtype() };
    let xw = cast(cx, x, work)?;
    let axes: Vec<i64> = (a as i64..rank as i64).collect();
    let mean = reduce(cx, ReduceKind::Mean, &xw, axes.clone(), true)?;
    let d = bin(cx, B::Sub, &xw, &mean)?;
    let sq = bin(cx, B::Mul, &d, &d)?;
    let var = reduce(cx, ReduceKind::Mean, &sq, axes, true)?;
    let e = scalar_like(cx, &var, eps)?;
    let ve = bin(cx, B::Add, &var, &e)?;
    let inv = un(cx, U::Rsqrt, &ve)?;
    let normed = bin(cx, B::Mul, &d, &inv)?;
    let normed = cast(cx, &normed, x.dtype())?;
    let mut y = bin(cx, B::Mul, &normed, n.input(1)?)?;
    if let Some(b) = n.opt_input(2) {
        y = bin(cx, B::Add, &y, b)?;
    }
    Ok(vec![y, mean, inv])
}

pub(crate) fn reduce_log_sum(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let axes = if n.opset >= 18 { super::const_ints(n, 1, "axes")? } else { n.ints("axes") };
    let keep = n.int("keepdims", 1) != 0;
    let axes = match axes {
        Some(a) if !a.is_empty() => a,
        _ if n.int("noop_with_empty_axes", 0) != 0 => return Ok(vec![x.clone()]),
        _ => (0..x.rank() as i64).collect(),
    };
    let s = reduce(cx, ReduceKind::Sum, x, axes, keep)?;
    Ok(vec![un(cx, U::Log, &s)?])
}

pub(crate) fn swish(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let alpha = n.float("alpha", 1.0) as f64;
    let a = scalar_like(cx, x, alpha)?;
    let ax = bin(cx, B::Mul, x, &a)?;
    let s = un(cx, U::Sigmoid, &ax)?;
    Ok(vec![bin(cx, B::Mul, x, &s)?])
}

pub(crate) fn shrink(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let (bias, lambd) = (n.float("bias", 0.0) as f64, n.float("lambd", 0.5) as f64);
    let l = scalar_like(cx, x, lambd)?;
    let nl = scalar_like(cx, x, -lambd)?;
    let b = scalar_like(cx, x, bias)?;
    let zero = scalar_like(cx, x, 0.0)?;
    let below = bin(cx, B::Lt, x, &nl)?;
    let above = bin(cx, B::Gt, x, &l)?;
    let plus = bin(cx, B::Add, x, &b)?;
    let minus = bin(cx, B::Sub, x, &b)?;
    let hi = cx.op(Op::Select, &[&above, &minus, &zero])?;
    Ok(vec![cx.op(Op::Select, &[&below, &plus, &hi])?])
}

pub(crate) fn lp_normalization(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let a = n.int("axis", -1);
    let norm = match n.int("p", 2) {
        1 => {
            let ab = un(cx, U::Abs, x)?;
            reduce(cx, ReduceKind::Sum, &ab, vec![a], true)?
        }
        2 => {
            let sq = bin(cx, B::Mul, x, x)?;
            let s = reduce(cx, ReduceKind::Sum, &sq, vec![a], true)?;
            un(cx, U::Sqrt, &s)?
        }
        p => return Err(format!("p={p} is not supported (1 or 2)")),
    };
    // A zero norm gives 0, not 0/0 (ONNX's definition).
    let q = bin(cx, B::Div, x, &norm)?;
    let zero = scalar_like(cx, x, 0.0)?;
    let is_zero = bin(cx, B::Eq, &norm, &zero)?;
    Ok(vec![cx.op(Op::Select, &[&is_zero, &zero, &q])?])
}

pub(crate) fn hardmax(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let d = static_shape(x, "Hardmax")?;
    let rank = d.len();
    // Before opset 13 the input is coerced to 2-d at `axis` (default 1).
    let (work, a) = if n.opset < 13 {
        let a = axis(n.int("axis", 1), rank.max(1))?;
        let (head, tail) = x.ty.shape.0.split_at(a);
        let both = dim_product(head).zip(dim_product(tail)).ok_or("needs static dims")?;
        (reshape(cx, x, vec![both.0, both.1])?, 1usize)
    } else {
        (x.clone(), axis(n.int("axis", -1), rank)?)
    };
    let wd = static_shape(&work, "Hardmax")?;
    let arg = cx.op(
        Op::ArgReduce(ArgReduce { kind: ArgKind::Max, axis: a as i64, keep_dims: true, select_last_index: false }),
        &[&work],
    )?;
    let iota = cx.op(
        Op::Iota(Iota {
            dtype: DType::I64,
            shape: Shape::of(&wd.iter().map(|&v| v as u64).collect::<Vec<_>>()),
            axis: a as i64,
            start: 0.0,
            step: 1.0,
        }),
        &[],
    )?;
    let hit = bin(cx, B::Eq, &iota, &arg)?;
    let y = cast(cx, &hit, x.dtype())?;
    Ok(vec![reshape(cx, &y, x.ty.shape.0.clone())?])
}

pub(crate) fn eye_like(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let d = static_shape(x, "EyeLike")?;
    let [r, c] = d[..] else { return Err("needs a rank-2 input".into()) };
    let dtype = match n.opt_int("dtype") {
        Some(code) => onnx_dtype(code)?,
        None => x.dtype(),
    };
    let k = n.int("k", 0);
    let shape = Shape::of(&[r as u64, c as u64]);
    let row =
        cx.op(Op::Iota(Iota { dtype: DType::I64, shape: shape.clone(), axis: 0, start: k as f64, step: 1.0 }), &[])?;
    let col = cx.op(Op::Iota(Iota { dtype: DType::I64, shape, axis: 1, start: 0.0, step: 1.0 }), &[])?;
    let hit = bin(cx, B::Eq, &row, &col)?;
    Ok(vec![cast(cx, &hit, dtype)?])
}

pub(crate) fn lp_pool(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let p = n.int("p", 2);
    if p < 1 {
        return Err(format!("p={p} is not supported"));
    }
    let d = static_shape(x, "LpPool")?;
    if d.len() < 3 {
        return Err(format!("needs an input of rank ≥ 3, got {}", x.ty.shape));
    }
    let k = d.len() - 2;
    let kernel = n.ints("kernel_shape").ok_or("`kernel_shape` is required")?;
    if kernel.len() != k {
        return Err(format!("kernel_shape {kernel:?} does not have {k} spatial dims"));
    }
    let strides = n.ints("strides").unwrap_or_else(|| vec![1; k]);
    let dilations = n.ints("dilations").unwrap_or_else(|| vec![1; k]);
    let sp: Vec<Option<usize>> = d[2..].iter().map(|&v| Some(v)).collect();
    let pads = super::nn::auto_pads(n, &sp, &kernel, &strides, &dilations)?;
    let ceil_mode = n.int("ceil_mode", 0) != 0;
    if ceil_mode {
        return Err("ceil_mode=1 is not supported".into());
    }
    // (Σ |x|^p)^(1/p), with the window sum as an average (padding counted) times the window size.
    let ab = un(cx, U::Abs, x)?;
    let pp = scalar_like(cx, x, p as f64)?;
    let powed = bin(cx, B::Pow, &ab, &pp)?;
    let pool = Pool {
        kind: PoolKind::Avg,
        kernel: kernel.clone(),
        strides,
        pads,
        dilations,
        ceil_mode,
        count_include_pad: true,
    };
    let avg = cx.op(Op::Pool(pool), &[&powed])?;
    let size = scalar_like(cx, x, kernel.iter().product::<i64>() as f64)?;
    let sum = bin(cx, B::Mul, &avg, &size)?;
    let inv = scalar_like(cx, x, 1.0 / p as f64)?;
    Ok(vec![bin(cx, B::Pow, &sum, &inv)?])
}

pub(crate) fn mean_variance_normalization(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    // ONNX's function body: (X - E[X]) / (sqrt(E[X²] - E[X]²) + 1e-9).
    let x = n.input(0)?;
    let axes = n.ints("axes").unwrap_or_else(|| vec![0, 2, 3]);
    let two = scalar_like(cx, x, 2.0)?;
    let mean = reduce(cx, ReduceKind::Mean, x, axes.clone(), true)?;
    let mean_sq = bin(cx, B::Pow, &mean, &two)?;
    let sq = bin(cx, B::Pow, x, &two)?;
    let sq_mean = reduce(cx, ReduceKind::Mean, &sq, axes, true)?;
    let var = bin(cx, B::Sub, &sq_mean, &mean_sq)?;
    let std = un(cx, U::Sqrt, &var)?;
    let eps = scalar_like(cx, x, 1e-9)?;
    let std = bin(cx, B::Add, &std, &eps)?;
    let centered = bin(cx, B::Sub, x, &mean)?;
    Ok(vec![bin(cx, B::Div, &centered, &std)?])
}

pub(crate) fn swiglu(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    // a · sigmoid(alpha · a) · b, with identical shapes (no broadcasting).
    let (a, b) = (n.input(0)?, n.input(1)?);
    if a.ty != b.ty {
        return Err(format!("A and B must have one type (no broadcasting), got {} and {}", a.ty, b.ty));
    }
    let alpha = scalar_like(cx, a, n.float("alpha", 1.0) as f64)?;
    let scaled = bin(cx, B::Mul, &alpha, a)?;
    let gate = un(cx, U::Sigmoid, &scaled)?;
    let swish = bin(cx, B::Mul, a, &gate)?;
    Ok(vec![bin(cx, B::Mul, &swish, b)?])
}

/// Hann, Hamming and Blackman windows of a known length: sums of `c_k · cos(2πk·n / N)` with `N` the length
/// (periodic) or the length - 1 (symmetric).
pub(crate) fn window(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let size = match super::const_ints(n, 0, "size")?.as_deref() {
        Some(&[s]) if s >= 0 => s as u64,
        _ => return Err("`size` must be one non-negative integer".into()),
    };
    let dtype = onnx_dtype(n.int("output_datatype", 1))?;
    if !dtype.is_float() {
        return Err(format!("output_datatype {dtype} is not supported (float types only)"));
    }
    let periodic = n.int("periodic", 1) != 0;
    let span = if periodic { size as f64 } else { size as f64 - 1.0 };
    let alpha = 25.0 / 46.0;
    // (constant term, [cos(2πn/N), cos(4πn/N)] coefficients)
    let (c0, c1, c2) = match n.proto.op_type.as_str() {
        // sin²(πn/N) = 1/2 - 1/2·cos(2πn/N)
        "HannWindow" => (0.5, -0.5, 0.0),
        "HammingWindow" => (alpha, -(1.0 - alpha), 0.0),
        "BlackmanWindow" => (0.42, -0.5, 0.08),
        other => return Err(format!("internal: `{other}` is not a window")),
    };
    let idx =
        cx.op(Op::Iota(Iota { dtype: DType::F64, shape: Shape::of(&[size]), axis: 0, start: 0.0, step: 1.0 }), &[])?;
    let mut y = cx.scalar(DType::F64, c0)?;
    for (k, c) in [(1.0, c1), (2.0, c2)] {
        if c == 0.0 {
            continue;
        }
        let w = cx.scalar(DType::F64, 2.0 * std::f64::consts::PI * k / span)?;
        let angle = bin(cx, B::Mul, &idx, &w)?;
        let cosine = un(cx, U::Cos, &angle)?;
        let coef = cx.scalar(DType::F64, c)?;
        let term = bin(cx, B::Mul, &cosine, &coef)?;
        y = bin(cx, B::Add, &y, &term)?;
    }
    Ok(vec![cast(cx, &y, dtype)?])
}

/// The most grid points an AffineGrid may ask for (its base grid is a constant of the model).
const MAX_AFFINE_GRID_POINTS: u64 = 1 << 26;

/// AffineGrid (opset 20): `grid[n, s…, :] = theta[n] · (x, y[, z], 1)`, the normalized coordinates of an output of
/// `size` (`[N, C, H, W]` or `[N, C, D, H, W]`, known at import) innermost dim first, as GridSample reads them:
/// `-1 + i·2/(L-1)` with `align_corners` (-1 for an extent of 1), else `-1 + (2i+1)/L`. The homogeneous base grid
/// is a constant `[points, r+1]`, multiplied by every `thetaᵀ` at once and reshaped to `[N, s…, r]`.
pub(crate) fn affine_grid(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let theta = n.input(0)?;
    // Exporters pass the image's own shape (`x.size()`): its batch may be symbolic (the grid's batch is theta's),
    // its spatial extents must be known.
    let size = n
        .input(1)?
        .dim_args()
        .ok_or("input `size` must be known at import time (a constant, or computed from the shapes of inputs)")?;
    let r = size.len().saturating_sub(2);
    if !matches!(r, 2 | 3) {
        return Err(format!("size must be [N, C, H, W] or [N, C, D, H, W], got {} values", size.len()));
    }
    let spatial = size[2..]
        .iter()
        .map(|a| match a {
            DimArg::Int(v) if *v >= 0 => Ok(*v as u64),
            DimArg::Int(v) => Err(format!("size has a negative extent {v}")),
            DimArg::Sym(s) => {
                Err(format!("a grid over the symbolic extent `{s}` is not supported (its points are constants)"))
            }
        })
        .collect::<Result<Vec<u64>, String>>()?;
    if !theta.dtype().is_float() {
        return Err(format!("theta must be a float tensor, got {}", theta.ty));
    }
    let d = &theta.ty.shape.0;
    if d.len() != 3 || d[1].as_static() != Some(r as u64) || d[2].as_static() != Some(r as u64 + 1) {
        return Err(format!("theta must be [N, {r}, {}] for a size of rank {}, got {}", r + 1, r + 2, theta.ty.shape));
    }
    let points = spatial.iter().try_fold(1u64, |p, &s| p.checked_mul(s)).filter(|&p| p <= MAX_AFFINE_GRID_POINTS);
    let points =
        points.ok_or_else(|| format!("spatial size {spatial:?} asks for more than 2^26 grid points"))? as usize;
    let align = n.int("align_corners", 0) != 0;
    let coord = |i: u64, len: u64| -> f64 {
        match (align, len) {
            (true, 1) => -1.0,
            (true, _) => -1.0 + i as f64 * (2.0 / (len - 1) as f64),
            (false, _) => -1.0 + (2 * i + 1) as f64 / len as f64,
        }
    };
    let mut base = Vec::with_capacity(points * (r + 1));
    for p in 0..points as u64 {
        // Point p's index per spatial dim, then its coordinates innermost dim first, then 1.
        let mut rest = p;
        let mut idx = vec![0u64; r];
        for k in (0..r).rev() {
            idx[k] = rest % spatial[k];
            rest /= spatial[k];
        }
        base.extend((0..r).rev().map(|k| coord(idx[k], spatial[k])));
        base.push(1.0);
    }
    let data = kiln_ir::Data::from_f64_iter(theta.dtype(), base.into_iter());
    let base = cx.constant(kiln_ir::Tensor::new(vec![points, r + 1], data).map_err(|e| e.to_string())?)?;
    let theta_t = transpose(cx, theta, vec![0, 2, 1])?;
    let grid = cx.op(Op::MatMul, &[&base, &theta_t])?;
    let mut dims = vec![d[0].clone()];
    dims.extend(spatial.iter().map(|&s| Dim::Static(s)));
    dims.push(Dim::Static(r as u64));
    Ok(vec![reshape(cx, &grid, dims)?])
}
