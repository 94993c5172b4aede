//! Neural-network ONNX ops: convolutions, pooling, normalizations, softmax, resize, grid sampling, recurrent layers.

use kiln_ir::op::{
    BatchNorm, BinaryOp as B, Conv, ConvTranspose, CoordMode, GridPadding, GridSample, Gru, LayerNorm, Lstm,
    NearestMode, Pool, PoolKind, Reduce, ReduceKind, Resize, ResizeMode, RnnDirection, RoiAlign, Softmax, UnaryOp as U,
};
use kiln_ir::{Dim, Op, Shape, Tensor};

use super::{bin, const_ints, dim_product, reshape, scalar_like, static_shape, transpose, un};
use crate::import::{Ctx, Val};
use crate::node::OnnxNode;

/// The static extent of spatial dim `i` of `sp`, or an error saying that `what` needs one.
fn known(sp: &[Option<usize>], i: usize, what: &str) -> Result<i64, String> {
    sp[i].map(|v| v as i64).ok_or_else(|| format!("{what} on a symbolic spatial dim needs a static extent"))
}

/// Explicit begin/end pads for `auto_pad`, given input extents (`None`: symbolic), kernel, strides and
/// dilations.
pub(crate) fn auto_pads(
    n: &OnnxNode<'_>,
    input: &[Option<usize>],
    kernel: &[i64],
    strides: &[i64],
    dilations: &[i64],
) -> Result<Vec<i64>, String> {
    let k = input.len();
    check_window(k, &[("kernel_shape", kernel), ("strides", strides), ("dilations", dilations)])?;
    let explicit = n.ints("pads");
    match n.string("auto_pad").as_deref().unwrap_or("NOTSET") {
        "NOTSET" => {
            let p = explicit.unwrap_or_else(|| vec![0; 2 * k]);
            if p.len() != 2 * k {
                return Err(format!("pads has {} entries for {k} spatial dims", p.len()));
            }
            Ok(p)
        }
        "VALID" => Ok(vec![0; 2 * k]),
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            let mut p = vec![0; 2 * k];
            for i in 0..k {
                let eff = (kernel[i] - 1) * dilations[i] + 1;
                // With stride 1 the total padding is eff − 1 whatever the extent; otherwise it depends on it.
                let total = if strides[i] == 1 {
                    eff - 1
                } else {
                    let x = known(input, i, &format!("auto_pad {mode} with stride {}", strides[i]))?;
                    let out = (x + strides[i] - 1) / strides[i];
                    ((out - 1) * strides[i] + eff - x).max(0)
                };
                let (small, big) = (total / 2, total - total / 2);
                (p[i], p[i + k]) = if mode == "SAME_UPPER" { (small, big) } else { (big, small) };
            }
            Ok(p)
        }
        other => Err(format!("auto_pad `{other}` is not supported")),
    }
}

/// Checks that window attributes have one positive entry per spatial dim, before anything indexes them.
fn check_window(k: usize, lists: &[(&str, &[i64])]) -> Result<(), String> {
    for (name, v) in lists {
        if v.len() != k {
            return Err(format!("{name} {v:?} does not have {k} spatial dims"));
        }
        if v.iter().any(|&x| x <= 0) {
            return Err(format!("{name} {v:?} must be positive"));
        }
    }
    Ok(())
}

/// Weight extents for a convolution over `k` spatial dims: `[out, in, kernel…]`.
fn conv_weights(w: &Val, k: usize, what: &str) -> Result<Vec<usize>, String> {
    let wd = static_shape(w, what)?;
    if wd.len() != k + 2 {
        return Err(format!("{what} have shape {}, expected rank {}", w.ty.shape, k + 2));
    }
    Ok(wd)
}

/// The spatial extents of `x` (`[N, C, spatial…]`), `None` where symbolic: a window op's output extent on a
/// symbolic dim is a derived dim (`kiln_ir::dim`).
fn spatial(x: &Val, what: &str) -> Result<Vec<Option<usize>>, String> {
    let d = x.ty.shape.dims();
    if d.len() < 3 {
        return Err(format!("{what} needs an input of rank ≥ 3, got {}", x.ty.shape));
    }
    Ok(d[2..].iter().map(|d| d.as_static().map(|v| v as usize)).collect())
}

pub(crate) fn conv(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, w) = (n.input(0)?, n.input(1)?);
    let attrs = conv_attrs(n, x, w, "Conv")?;
    let mut ins = vec![x, w];
    ins.extend(n.opt_input(2));
    Ok(vec![cx.op(Op::Conv(attrs), &ins)?])
}

/// The attributes of a convolution node `what` (Conv, ConvInteger, QLinearConv) of input `x` and weights `w`:
/// kernel shape (checked against the weights), strides, dilations, pads (`auto_pad` resolved) and groups.
pub(crate) fn conv_attrs(n: &OnnxNode<'_>, x: &Val, w: &Val, what: &str) -> Result<Conv, String> {
    let sp = spatial(x, what)?;
    let k = sp.len();
    let wd = conv_weights(w, k, &format!("{what} weights"))?;
    let kernel = n.ints("kernel_shape").unwrap_or_else(|| wd[2..].iter().map(|&d| d as i64).collect());
    if kernel.len() != k || kernel.iter().zip(&wd[2..]).any(|(&a, &b)| a != b as i64) {
        return Err(format!("kernel_shape {kernel:?} disagrees with the weights {:?}", wd));
    }
    let strides = n.ints("strides").unwrap_or_else(|| vec![1; k]);
    let dilations = n.ints("dilations").unwrap_or_else(|| vec![1; k]);
    let pads = auto_pads(n, &sp, &kernel, &strides, &dilations)?;
    Ok(Conv { strides, pads, dilations, groups: n.int("group", 1) })
}

pub(crate) fn conv_transpose(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, w) = (n.input(0)?, n.input(1)?);
    let sp = spatial(x, "ConvTranspose")?;
    let k = sp.len();
    let wd = conv_weights(w, k, "ConvTranspose weights")?;
    let kernel: Vec<i64> = n.ints("kernel_shape").unwrap_or_else(|| wd[2..].iter().map(|&d| d as i64).collect());
    let strides = n.ints("strides").unwrap_or_else(|| vec![1; k]);
    let dilations = n.ints("dilations").unwrap_or_else(|| vec![1; k]);
    check_window(k, &[("kernel_shape", &kernel), ("strides", &strides), ("dilations", &dilations)])?;
    let mut output_padding = n.ints("output_padding").unwrap_or_else(|| vec![0; k]);
    if output_padding.len() != k {
        return Err(format!("output_padding {output_padding:?} does not have {k} spatial dims"));
    }
    let auto = n.string("auto_pad").unwrap_or_else(|| "NOTSET".into());
    let explicit = n.ints("pads");
    let pads = if let Some(out_shape) = n.ints("output_shape") {
        // Pads follow from the requested output size (ONNX: SAME_UPPER-style split unless SAME_LOWER).
        let out_shape = if out_shape.len() == k + 2 { out_shape[2..].to_vec() } else { out_shape };
        if out_shape.len() != k {
            return Err(format!("output_shape {out_shape:?} does not have {k} spatial dims"));
        }
        let mut p = vec![0; 2 * k];
        for i in 0..k {
            let x = known(&sp, i, "ConvTranspose output_shape")?;
            let full = strides[i] * (x - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1;
            let total = full - out_shape[i];
            if total < 0 {
                // A larger output than the full extent is reached with output padding.
                output_padding[i] -= total;
                continue;
            }
            let (small, big) = (total / 2, total - total / 2);
            (p[i], p[i + k]) = if auto == "SAME_LOWER" { (big, small) } else { (small, big) };
        }
        p
    } else {
        match auto.as_str() {
            "NOTSET" => explicit.unwrap_or_else(|| vec![0; 2 * k]),
            "VALID" => vec![0; 2 * k],
            "SAME_UPPER" | "SAME_LOWER" => {
                let mut p = vec![0; 2 * k];
                for i in 0..k {
                    // stride·(x − 1) + output_padding + eff − stride·x: independent of the extent x.
                    let total = (output_padding[i] + (kernel[i] - 1) * dilations[i] + 1 - strides[i]).max(0);
                    let (small, big) = (total / 2, total - total / 2);
                    (p[i], p[i + k]) = if auto == "SAME_UPPER" { (small, big) } else { (big, small) };
                }
                p
            }
            other => return Err(format!("auto_pad `{other}` is not supported")),
        }
    };
    let attrs = ConvTranspose { strides, pads, dilations, output_padding, groups: n.int("group", 1) };
    let mut ins = vec![x, w];
    ins.extend(n.opt_input(2));
    Ok(vec![cx.op(Op::ConvTranspose(attrs), &ins)?])
}

pub(crate) fn pool(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let kind = if n.proto.op_type == "MaxPool" { PoolKind::Max } else { PoolKind::Avg };
    let attrs = pool_attrs(n, x, kind)?;
    Ok(vec![cx.op(Op::Pool(attrs), &[x])?])
}

/// A pooling node's attributes (kernel, strides, pads — `auto_pad` resolved against `x` — dilations, ceil
/// mode, whether padding counts) as a `pool` of `kind`.
pub(crate) fn pool_attrs(n: &OnnxNode<'_>, x: &Val, kind: PoolKind) -> Result<Pool, String> {
    let sp = spatial(x, &n.proto.op_type)?;
    let k = sp.len();
    let kernel = n.ints("kernel_shape").ok_or("`kernel_shape` is required")?;
    if kernel.len() != k {
        return Err(format!("kernel_shape {kernel:?} does not have {k} spatial dims"));
    }
    let strides = n.ints("strides").unwrap_or_else(|| vec![1; k]);
    let dilations = n.ints("dilations").unwrap_or_else(|| vec![1; k]);
    let pads = auto_pads(n, &sp, &kernel, &strides, &dilations)?;
    if n.int("storage_order", 0) != 0 {
        return Err("storage_order=1 is not supported".into());
    }
    if n.proto.output.get(1).is_some_and(|o| !o.is_empty()) {
        return Err("the Indices output is not supported".into());
    }
    Ok(Pool {
        kind,
        kernel,
        strides,
        pads,
        dilations,
        ceil_mode: n.int("ceil_mode", 0) != 0,
        count_include_pad: n.int("count_include_pad", 0) != 0,
    })
}

pub(crate) fn global_pool(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let kind = if n.proto.op_type == "GlobalMaxPool" { ReduceKind::Max } else { ReduceKind::Mean };
    let axes: Vec<i64> = (2..x.rank() as i64).collect();
    Ok(vec![cx.op(Op::Reduce(Reduce { kind, axes, keep_dims: true }), &[x])?])
}

pub(crate) fn batch_norm(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    if n.int("training_mode", 0) != 0 || n.proto.output.iter().skip(1).any(|o| !o.is_empty()) {
        return Err("training mode (running statistics outputs) is not supported".into());
    }
    n.ignore(&["momentum", "spatial", "is_test", "consumed_inputs"]);
    let ins = n.all_inputs()?;
    if ins.len() != 5 {
        return Err(format!("needs 5 inputs, got {}", ins.len()));
    }
    let eps = n.float("epsilon", 1e-5) as f64;
    Ok(vec![cx.op(Op::BatchNorm(BatchNorm { epsilon: eps }), &ins)?])
}

/// `(x - mean) / sqrt(var + eps)` over `axes` (kept as size 1).
fn normalize(cx: &mut Ctx<'_>, x: &Val, axes: Vec<i64>, eps: f64) -> Result<Val, String> {
    let mean = cx.op(Op::Reduce(Reduce { kind: ReduceKind::Mean, axes: axes.clone(), keep_dims: true }), &[x])?;
    let c = bin(cx, B::Sub, x, &mean)?;
    let sq = bin(cx, B::Mul, &c, &c)?;
    let var = cx.op(Op::Reduce(Reduce { kind: ReduceKind::Mean, axes, keep_dims: true }), &[&sq])?;
    let e = scalar_like(cx, x, eps)?;
    let ve = bin(cx, B::Add, &var, &e)?;
    let r = un(cx, U::Rsqrt, &ve)?;
    bin(cx, B::Mul, &c, &r)
}

/// A per-channel vector `[C]` reshaped to `[C, 1, …]` for broadcasting against `[N, C, *]`.
fn per_channel(cx: &mut Ctx<'_>, v: &Val, rank: usize) -> Result<Val, String> {
    let mut dims = v.ty.shape.0.clone();
    dims.extend(std::iter::repeat_n(Dim::Static(1), rank - 2));
    reshape(cx, v, dims)
}

pub(crate) fn instance_norm(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, scale, bias) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let rank = x.rank();
    if rank < 3 {
        return Err("needs an input of rank ≥ 3".into());
    }
    let y = normalize(cx, x, (2..rank as i64).collect(), n.float("epsilon", 1e-5) as f64)?;
    let s = per_channel(cx, scale, rank)?;
    let b = per_channel(cx, bias, rank)?;
    let y = bin(cx, B::Mul, &y, &s)?;
    Ok(vec![bin(cx, B::Add, &y, &b)?])
}

pub(crate) fn group_norm(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, scale, bias) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let groups = n.opt_int("num_groups").ok_or("`num_groups` is required")?;
    n.ignore(&["stash_type"]);
    let d = static_shape(x, "GroupNormalization")?;
    if d.len() < 3 || groups < 1 || d[1] as i64 % groups != 0 {
        return Err(format!("channels of {:?} must divide into {groups} groups", d));
    }
    let (nb, c) = (d[0] as u64, d[1] as u64);
    let g = groups as u64;
    let rest: u64 = d[2..].iter().map(|&v| v as u64).product::<u64>() * (c / g);
    let grouped = reshape(cx, x, vec![Dim::Static(nb), Dim::Static(g), Dim::Static(rest)])?;
    let y = normalize(cx, &grouped, vec![2], n.float("epsilon", 1e-5) as f64)?;
    let y = reshape(cx, &y, d.iter().map(|&v| Dim::Static(v as u64)).collect())?;
    // Opset 18 scales per group, opset 21 per channel; the scale's length says which.
    let expand = |cx: &mut Ctx<'_>, v: &Val| -> Result<Val, String> {
        let len = v.static_shape().and_then(|s| s.first().copied()).ok_or("scale and bias must be rank-1")? as u64;
        let v = if len == g && g != c {
            let v = reshape(cx, v, vec![Dim::Static(g), Dim::Static(1)])?;
            let v = cx.op(Op::Broadcast(kiln_ir::op::Broadcast { shape: Shape::of(&[g, c / g]) }), &[&v])?;
            reshape(cx, &v, vec![Dim::Static(c)])?
        } else if len == c {
            v.clone()
        } else {
            return Err(format!("scale/bias of length {len} fit neither {g} groups nor {c} channels"));
        };
        per_channel(cx, &v, d.len())
    };
    let s = expand(cx, scale)?;
    let b = expand(cx, bias)?;
    let y = bin(cx, B::Mul, &y, &s)?;
    Ok(vec![bin(cx, B::Add, &y, &b)?])
}

pub(crate) fn layer_norm(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    if n.proto.output.iter().skip(1).any(|o| !o.is_empty()) {
        return super::composite::layer_norm_with_stats(cx, n);
    }
    n.ignore(&["stash_type"]);
    let attrs = LayerNorm { axis: n.int("axis", -1), epsilon: n.float("epsilon", 1e-5) as f64 };
    let mut ins = vec![n.input(0)?, n.input(1)?];
    ins.extend(n.opt_input(2));
    Ok(vec![cx.op(Op::LayerNorm(attrs), &ins)?])
}

pub(crate) fn lrn(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let size = n.opt_int("size").ok_or("`size` is required")?;
    let (alpha, beta, bias) =
        (n.float("alpha", 1e-4) as f64, n.float("beta", 0.75) as f64, n.float("bias", 1.0) as f64);
    let d = static_shape(x, "LRN")?;
    if d.len() < 3 {
        return Err("needs rank ≥ 3".into());
    }
    let (nb, c) = (d[0] as u64, d[1] as u64);
    let rest: u64 = d[2..].iter().map(|&v| v as u64).product();
    // Sum of squares over a channel window = average pool (pads counted) × size on [N, 1, C, rest].
    let sq = bin(cx, B::Mul, x, x)?;
    let sq = reshape(cx, &sq, vec![Dim::Static(nb), Dim::Static(1), Dim::Static(c), Dim::Static(rest)])?;
    let (lo, hi) = ((size - 1) / 2, size - 1 - (size - 1) / 2);
    let pool = Pool {
        kind: PoolKind::Avg,
        kernel: vec![size, 1],
        strides: vec![1, 1],
        pads: vec![lo, 0, hi, 0],
        dilations: vec![1, 1],
        ceil_mode: false,
        count_include_pad: true,
    };
    let avg = cx.op(Op::Pool(pool), &[&sq])?;
    let avg = reshape(cx, &avg, x.ty.shape.0.clone())?;
    let k = scalar_like(cx, x, alpha)?;
    let b = scalar_like(cx, x, bias)?;
    let p = scalar_like(cx, x, beta)?;
    // alpha/size * sum = alpha * avg
    let t = bin(cx, B::Mul, &avg, &k)?;
    let t = bin(cx, B::Add, &t, &b)?;
    let t = bin(cx, B::Pow, &t, &p)?;
    Ok(vec![bin(cx, B::Div, x, &t)?])
}

pub(crate) fn softmax(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let log = n.proto.op_type == "LogSoftmax";
    let rank = x.rank();
    let make = |axis: i64| if log { Op::LogSoftmax(Softmax { axis }) } else { Op::Softmax(Softmax { axis }) };
    if n.opset >= 13 {
        return Ok(vec![cx.op(make(n.int("axis", -1)), &[x])?]);
    }
    // Before opset 13: coerce to 2-d at `axis` (default 1), normalize rows, restore the shape.
    let a = super::axis(n.int("axis", 1), rank.max(1))?;
    if a == rank.saturating_sub(1) {
        return Ok(vec![cx.op(make(-1), &[x])?]);
    }
    let (head, tail) = x.ty.shape.0.split_at(a);
    let both = dim_product(head).zip(dim_product(tail)).ok_or("needs static dims")?;
    let flat = reshape(cx, x, vec![both.0, both.1])?;
    let y = cx.op(make(1), &[&flat])?;
    Ok(vec![reshape(cx, &y, x.ty.shape.0.clone())?])
}

/// `floor(extent · scale)` for a dim that may be symbolic: exact for a scale that is a fraction with a small
/// denominator (×2, ×0.5, ×1.5 — what upsampling layers use); any other scale needs a static extent.
fn scaled_dim(d: &Dim, scale: f64) -> Result<Dim, String> {
    use kiln_ir::dim::DimExpr;
    if let Some(v) = d.as_static() {
        return Ok(Dim::Static((v as f64 * scale).floor() as u64));
    }
    let q = (1..=16i64).find(|q| (scale * *q as f64 - (scale * *q as f64).round()).abs() < 1e-9 && scale > 0.0);
    let (Some(q), Some(e)) = (q, DimExpr::of(d)) else {
        return Err(format!("scale {scale} on symbolic dim `{d}` needs a static extent"));
    };
    let p = (scale * q as f64).round() as i64;
    e.scale(p).floor_div(q).to_dim().ok_or_else(|| format!("scale {scale} gives a negative extent"))
}

pub(crate) fn resize(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let d: Vec<Dim> = x.ty.shape.0.clone();
    let rank = d.len();
    let mode = match n.string("mode").as_deref().unwrap_or("nearest") {
        "nearest" => ResizeMode::Nearest,
        "linear" | "bilinear" | "trilinear" => ResizeMode::Linear,
        "cubic" | "bicubic" => ResizeMode::Cubic,
        other => return Err(format!("mode `{other}` is not supported")),
    };
    let coord = match n.string("coordinate_transformation_mode").as_deref().unwrap_or(if n.opset < 11 {
        "asymmetric"
    } else {
        "half_pixel"
    }) {
        "half_pixel" => CoordMode::HalfPixel,
        "pytorch_half_pixel" => CoordMode::PytorchHalfPixel,
        "align_corners" => CoordMode::AlignCorners,
        "asymmetric" => CoordMode::Asymmetric,
        "half_pixel_symmetric" => CoordMode::HalfPixelSymmetric,
        "tf_crop_and_resize" => CoordMode::TfCropAndResize,
        other => return Err(format!("coordinate_transformation_mode `{other}` is not supported")),
    };
    let nearest = match n.string("nearest_mode").as_deref().unwrap_or("round_prefer_floor") {
        "round_prefer_floor" => NearestMode::RoundPreferFloor,
        "round_prefer_ceil" => NearestMode::RoundPreferCeil,
        "floor" => NearestMode::Floor,
        "ceil" => NearestMode::Ceil,
        other => return Err(format!("nearest_mode `{other}` is not supported")),
    };
    let antialias = n.int("antialias", 0) != 0;
    let exclude_outside = n.int("exclude_outside", 0) != 0;
    let cubic_a = f64::from(n.float("cubic_coeff_a", kiln_ir::op::DEFAULT_CUBIC_A as f32));
    if !cubic_a.is_finite() {
        return Err(format!("cubic_coeff_a {cubic_a} must be finite"));
    }
    let keep_aspect = match n.string("keep_aspect_ratio_policy").as_deref().unwrap_or("stretch") {
        "stretch" => None,
        "not_larger" => Some(f64::min as fn(f64, f64) -> f64),
        "not_smaller" => Some(f64::max as fn(f64, f64) -> f64),
        other => {
            return Err(format!("keep_aspect_ratio_policy `{other}` is not one of stretch, not_larger, not_smaller"));
        }
    };
    let extrapolation = f64::from(n.float("extrapolation_value", 0.0));
    let axes: Vec<usize> = match n.ints("axes") {
        Some(a) => a.iter().map(|&a| super::axis(a, rank)).collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    let (scales_in, sizes_in) = if n.opset < 11 {
        (n.input(1)?.floats(), None)
    } else {
        let scales = match n.opt_input(2) {
            Some(s) if s.ty.shape.num_elements() != Some(0) => {
                Some(s.floats().ok_or("scales must be known at import time")?)
            }
            _ => None,
        };
        (scales, const_ints(n, 3, "sizes")?)
    };
    let mut scales = vec![1.0f64; rank];
    let mut out: Vec<Dim> = d.clone();
    match (scales_in, sizes_in) {
        (Some(s), None) if s.len() == axes.len() => {
            for (i, &a) in axes.iter().enumerate() {
                scales[a] = s[i];
                out[a] = scaled_dim(&d[a], s[i])?;
            }
        }
        (None, Some(z)) if z.len() == axes.len() => {
            for (i, &a) in axes.iter().enumerate() {
                let extent = d[a].as_static().ok_or_else(|| {
                    format!("`sizes` for symbolic dim `{}` needs a static extent (the scale would vary)", d[a])
                })?;
                out[a] = Dim::Static(z[i].max(0) as u64);
                scales[a] = z[i].max(0) as f64 / extent as f64;
            }
            // Keeping the aspect ratio: one scale for every resized axis (the least or the greatest), and each
            // extent that scale times the input's, rounded half up.
            if let Some(pick) = keep_aspect {
                let scale = axes.iter().map(|&a| scales[a]).reduce(pick).unwrap_or(1.0);
                for &a in &axes {
                    let extent = d[a].as_static().unwrap_or(0) as f64;
                    out[a] = Dim::Static((scale * extent + 0.5).floor() as u64);
                    scales[a] = scale;
                }
            }
        }
        _ => return Err("exactly one of scales and sizes must be given, one value per resized axis".into()),
    }
    // Antialiasing changes nothing where no resized axis shrinks (the filter is only stretched to downsample),
    // and nothing for nearest resizing.
    let antialias = antialias && mode != ResizeMode::Nearest && scales.iter().any(|&s| s < 1.0);
    // The crop box of tf_crop_and_resize: every dim's start, then every dim's end (the full extent of the dims
    // `axes` leaves out).
    let mut roi = Vec::new();
    if coord == CoordMode::TfCropAndResize {
        let given = match n.opt_input(1) {
            Some(v) if v.ty.shape.num_elements() != Some(0) => v.floats().ok_or("roi must be known at import time")?,
            _ => return Err("tf_crop_and_resize needs a roi".into()),
        };
        if given.len() != 2 * axes.len() || given.iter().any(|v| !v.is_finite()) {
            return Err(format!("roi {given:?} must hold a finite start and end per resized axis"));
        }
        roi = [vec![0.0; rank], vec![1.0; rank]].concat();
        for (i, &a) in axes.iter().enumerate() {
            roi[a] = given[i];
            roi[rank + a] = given[axes.len() + i];
        }
    }
    let attrs = Resize {
        mode,
        coord,
        nearest,
        shape: Shape(out),
        scales,
        cubic_a,
        exclude_outside,
        antialias,
        roi,
        extrapolation,
    };
    Ok(vec![cx.op(Op::Resize(attrs), &[x])?])
}

/// Col2Im (opset 18): `x[N, C·∏block, L]` holds, for every sliding block position `l` (row-major over the
/// blocks grid) and tap `k` of channel `c`, a value that lands at `l·stride + k·dilation - pad_begin` of image
/// `c`; overlapping values add. That is a transposed convolution of `x` seen as `[N, C·K, blocks…]`, `C` groups,
/// whose one-hot weights route tap `k` of a group's `K` input channels to its one output channel — and so runs as
/// one (the library's GEMM and col2im on the CPU). `image_shape` and `block_shape` must be known at import; float
/// data.
pub(crate) fn col2im(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let image = const_ints(n, 1, "image_shape")?.ok_or("needs `image_shape`")?;
    let block = const_ints(n, 2, "block_shape")?.ok_or("needs `block_shape`")?;
    let r = image.len();
    if r == 0 || block.len() != r || image.iter().chain(&block).any(|&v| v <= 0) {
        return Err(format!("image_shape {image:?} and block_shape {block:?} must be positive, one per spatial dim"));
    }
    let strides = n.ints("strides").unwrap_or_else(|| vec![1; r]);
    let dilations = n.ints("dilations").unwrap_or_else(|| vec![1; r]);
    let pads = n.ints("pads").unwrap_or_else(|| vec![0; 2 * r]);
    check_window(r, &[("kernel", &block), ("strides", &strides), ("dilations", &dilations)])?;
    if pads.len() != 2 * r || pads.iter().any(|&p| p < 0) {
        return Err(format!("pads {pads:?} must be {} non-negative values", 2 * r));
    }
    if !x.dtype().is_float() {
        return Err(format!("Col2Im of {} is not supported (float types only)", x.dtype()));
    }
    let d = &x.ty.shape.0;
    let taps = block.iter().try_fold(1u64, |p, &b| p.checked_mul(b as u64)).filter(|&t| t <= 1 << 20);
    let taps = taps.ok_or_else(|| format!("block_shape {block:?} is too large"))?;
    let ck = match d.get(1).and_then(Dim::as_static) {
        Some(ck) if d.len() == 3 && ck % taps == 0 => ck,
        _ => return Err(format!("input must be [N, C·{taps}, L] with a static channel dim, got {}", x.ty.shape)),
    };
    let channels = ck / taps;
    if ck.checked_mul(taps).is_none_or(|e| e > 1 << 26) {
        return Err(format!("{ck} channels of {taps}-tap blocks need too large a routing weight"));
    }
    // The sliding blocks per dim, and the output padding that reaches the whole image.
    let mut blocks = Vec::with_capacity(r);
    let mut output_padding = Vec::with_capacity(r);
    for i in 0..r {
        let span = image[i] as i128 + pads[i] as i128 + pads[r + i] as i128;
        let eff = (block[i] as i128 - 1) * dilations[i] as i128 + 1;
        if span < eff {
            return Err(format!("block {block:?} does not fit image {image:?} padded by {pads:?}"));
        }
        let b = (span - eff) / strides[i] as i128 + 1;
        blocks.push(b as u64);
        output_padding.push(((span - eff) % strides[i] as i128) as i64);
    }
    let positions = blocks.iter().try_fold(1u64, |p, &b| p.checked_mul(b)).filter(|&p| p <= 1 << 40);
    let positions = positions.ok_or_else(|| format!("{blocks:?} block positions are too many"))?;
    if let Some(l) = d[2].as_static()
        && l != positions
    {
        return Err(format!(
            "input has {l} block positions; image, block, pads and strides give {positions} ({blocks:?})"
        ));
    }
    let mut grid = vec![d[0].clone(), Dim::Static(ck)];
    grid.extend(blocks.iter().map(|&b| Dim::Static(b)));
    let x = reshape(cx, x, grid)?;
    // w[c·K + k, 0, t…] = 1 where tap t is k.
    let mut w = vec![0.0f64; (ck * taps) as usize];
    for c in 0..ck {
        w[(c * taps + c % taps) as usize] = 1.0;
    }
    let mut w_shape = vec![ck as usize, 1];
    w_shape.extend(block.iter().map(|&b| b as usize));
    let w = Tensor::new(w_shape, kiln_ir::Data::from_f64_iter(x.dtype(), w.into_iter())).map_err(|e| e.to_string())?;
    let w = cx.constant(w)?;
    let attrs = ConvTranspose { strides, pads, dilations, output_padding, groups: channels as i64 };
    Ok(vec![cx.op(Op::ConvTranspose(attrs), &[&x, &w])?])
}

/// RoiAlign (opsets 10 and 16; opset 10 has no `coordinate_transformation_mode` and behaves as
/// `output_half_pixel`).
pub(crate) fn roi_align(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, rois, idx) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let mode = match n.string("mode").as_deref().unwrap_or("avg") {
        "avg" => PoolKind::Avg,
        "max" => PoolKind::Max,
        other => return Err(format!("mode `{other}` is not one of avg, max")),
    };
    let half_pixel = match n.string("coordinate_transformation_mode").as_deref() {
        None => n.opset >= 16,
        Some("half_pixel") => true,
        Some("output_half_pixel") => false,
        Some(other) => return Err(format!("coordinate_transformation_mode `{other}` is not supported")),
    };
    let attrs = RoiAlign {
        mode,
        output_height: n.int("output_height", 1),
        output_width: n.int("output_width", 1),
        sampling_ratio: n.int("sampling_ratio", 0),
        spatial_scale: f64::from(n.float("spatial_scale", 1.0)),
        half_pixel,
    };
    Ok(vec![cx.op(Op::RoiAlign(attrs), &[x, rois, idx])?])
}

/// GridSample (opsets 16 and 20: `bilinear`/`bicubic` became `linear`/`cubic`, and any number of spatial dims).
pub(crate) fn grid_sample(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, grid) = (n.input(0)?, n.input(1)?);
    let mode = match n.string("mode").as_deref().unwrap_or(if n.opset < 20 { "bilinear" } else { "linear" }) {
        "nearest" => ResizeMode::Nearest,
        "linear" | "bilinear" => ResizeMode::Linear,
        "cubic" | "bicubic" => ResizeMode::Cubic,
        other => return Err(format!("mode `{other}` is not one of nearest, linear, cubic")),
    };
    let padding = match n.string("padding_mode").as_deref().unwrap_or("zeros") {
        "zeros" => GridPadding::Zeros,
        "border" => GridPadding::Border,
        "reflection" => GridPadding::Reflection,
        other => return Err(format!("padding_mode `{other}` is not one of zeros, border, reflection")),
    };
    let align_corners = n.int("align_corners", 0) != 0;
    Ok(vec![cx.op(Op::GridSample(GridSample { mode, padding, align_corners }), &[x, grid])?])
}

/// Upsample (opsets 7–9): nearest-neighbour scaling, `out[i] = in[floor(i / scale)]`.
pub(crate) fn upsample(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let d: Vec<Dim> = x.ty.shape.0.clone();
    let mode = n.string("mode").unwrap_or_else(|| "nearest".into());
    if mode != "nearest" {
        return Err(format!("mode `{mode}` is not supported (nearest only)"));
    }
    let scales: Vec<f64> = match n.floats("scales") {
        Some(s) => s.into_iter().map(f64::from).collect(),
        None => n.input(1)?.floats().ok_or("input `scales` must be known at import time")?,
    };
    if scales.len() != d.len() || scales.iter().any(|&s| s < 1.0) {
        return Err(format!("scales {scales:?} must give one value ≥ 1 per dim"));
    }
    let out: Vec<Dim> = d.iter().zip(&scales).map(|(v, &s)| scaled_dim(v, s)).collect::<Result<_, _>>()?;
    let attrs = Resize::new(ResizeMode::Nearest, CoordMode::Asymmetric, NearestMode::Floor, Shape(out), scales);
    Ok(vec![cx.op(Op::Resize(attrs), &[x])?])
}

/// Recurrent-layer operands in the IR's fixed order, with zeros for omitted optional inputs.
fn rnn_operands(
    cx: &mut Ctx<'_>,
    n: &OnnxNode<'_>,
    gates: u64,
    has_cell: bool,
) -> Result<(Vec<Val>, i64, RnnDirection, f64, bool), String> {
    let x = n.input(0)?;
    let hidden = n.opt_int("hidden_size").ok_or("`hidden_size` is required")?;
    let direction = match n.string("direction").as_deref().unwrap_or("forward") {
        "forward" => RnnDirection::Forward,
        "reverse" => RnnDirection::Reverse,
        "bidirectional" => RnnDirection::Bidirectional,
        other => return Err(format!("direction `{other}` is not supported")),
    };
    // Layout 1 (batch first) is transposed to layout 0 here and back in `batch_first_results`.
    let batch_first = match n.int("layout", 0) {
        0 => false,
        1 => true,
        l => return Err(format!("layout={l} is not supported")),
    };
    let x = &if batch_first { transpose(cx, x, vec![1, 0, 2])? } else { x.clone() };
    let state = |cx: &mut Ctx<'_>, v: &Val| if batch_first { transpose(cx, v, vec![1, 0, 2]) } else { Ok(v.clone()) };
    if let Some(acts) = n.strings("activations") {
        let default: &[&str] = if has_cell { &["Sigmoid", "Tanh", "Tanh"] } else { &["Sigmoid", "Tanh"] };
        let ok = acts.chunks(default.len()).all(|c| c.iter().map(String::as_str).eq(default.iter().copied()));
        if !ok {
            return Err(format!("activations {acts:?} are not supported (only the defaults)"));
        }
    }
    n.ignore(&["activation_alpha", "activation_beta"]);
    let clip = n.proto.attribute.iter().find(|a| a.name == "clip").map_or(f64::INFINITY, |a| a.f as f64);
    n.ignore(&["clip"]);
    let dirs = if direction == RnnDirection::Bidirectional { 2 } else { 1 };
    // The sequence length and the batch may be symbolic (a text line's width, frames of audio).
    let [seq, batch, _] = &x.ty.shape.0[..] else {
        return Err(format!("x must have rank 3, got {}", x.ty.shape));
    };
    if let Some(lens) = n.opt_input(4) {
        let known = lens.ints().ok_or("sequence_lens must be known at import time")?;
        let seq = seq.as_static().ok_or("sequence_lens with a symbolic sequence length is not supported")? as i64;
        if known.iter().any(|&l| l != seq) {
            return Err("sequence_lens shorter than the sequence is not supported".into());
        }
    }
    let h = hidden as u64;
    let zeros = |cx: &mut Ctx<'_>, dims: &[u64]| -> Result<Val, String> {
        let t = Tensor::zeros(x.dtype(), dims.iter().map(|&d| d as usize).collect());
        cx.constant(t)
    };
    // A zero state `[dirs, batch, h]`, the batch as x has it: a broadcast zero.
    let zero_state = |cx: &mut Ctx<'_>| -> Result<Val, String> {
        let zero = cx.constant(Tensor::zeros(x.dtype(), vec![]))?;
        let shape = Shape(vec![Dim::Static(dirs), batch.clone(), Dim::Static(h)]);
        cx.op(Op::Broadcast(kiln_ir::op::Broadcast { shape }), &[&zero])
    };
    let b = match n.opt_input(3) {
        Some(b) => b.clone(),
        None => zeros(cx, &[dirs, 2 * gates * h])?,
    };
    let h0 = match n.opt_input(5) {
        Some(v) => state(cx, v)?,
        None => zero_state(cx)?,
    };
    let mut ops = vec![x.clone(), n.input(1)?.clone(), n.input(2)?.clone(), b, h0];
    if has_cell {
        let c0 = match n.opt_input(6) {
            Some(v) => state(cx, v)?,
            None => zero_state(cx)?,
        };
        ops.push(c0);
        if let Some(p) = n.opt_input(7)
            && p.floats().is_none_or(|v| v.iter().any(|&f| f != 0.0))
        {
            return Err("peephole weights are not supported".into());
        }
    }
    Ok((ops, hidden, direction, clip, batch_first))
}

/// Recurrent results `y[seq,dirs,batch,h]` and states `[dirs,batch,h]` moved to layout 1 when asked.
fn batch_first_results(cx: &mut Ctx<'_>, outs: Vec<Val>, batch_first: bool) -> Result<Vec<Val>, String> {
    if !batch_first {
        return Ok(outs);
    }
    outs.iter()
        .enumerate()
        .map(|(i, v)| transpose(cx, v, if i == 0 { vec![2, 0, 1, 3] } else { vec![1, 0, 2] }))
        .collect()
}

pub(crate) fn lstm(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (ops, hidden_size, direction, clip, batch_first) = rnn_operands(cx, n, 4, true)?;
    let attrs = Lstm { hidden_size, direction, clip, input_forget: n.int("input_forget", 0) != 0 };
    let refs: Vec<&Val> = ops.iter().collect();
    let outs = cx.op_multi(Op::Lstm(attrs), &refs)?;
    batch_first_results(cx, outs, batch_first)
}

pub(crate) fn gru(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (ops, hidden_size, direction, clip, batch_first) = rnn_operands(cx, n, 3, false)?;
    let attrs = Gru { hidden_size, direction, clip, linear_before_reset: n.int("linear_before_reset", 0) != 0 };
    let refs: Vec<&Val> = ops.iter().collect();
    let outs = cx.op_multi(Op::Gru(attrs), &refs)?;
    batch_first_results(cx, outs, batch_first)
}
