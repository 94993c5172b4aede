//! Hand-built kernels for the library ops — conv (direct, or im2col plus a GEMM), pool and gather — for devices
//! without a native library for them: the CUDA backend compiles these to PTX, while the CPU backend calls
//! `codegen::library` instead (and matmul goes to cuBLAS, not here).
//!
//! Each builder takes the op's attributes and its operand and result types, checks them against the op's type
//! rule (`kiln_ir::infer`), and returns one [`Kernel`] whose launch arguments are the operands then the result.
//! Results are the interpreter's (`kiln_ir::interp::eval_op`): floats accumulate in the compute type (f32 for
//! f16/bf16) over the reduction in increasing index order — input channel outermost, then the window's offsets
//! row-major — so a run that folds each output sequentially (the evaluator, the CPU emitter) is bit-exact;
//! the PTX emitter's warp-cooperative reductions reorder the sums of conv and average pool.
//!
//! **Windows.** Output position `o` and window offset `k` read input position `o·stride + k·dilation -
//! pad_begin` per spatial dim. Where that can leave the input (the padding, or pool's ceil-mode overhang) the
//! position is clamped into the input for the load and a select on the in-bounds condition replaces the value
//! — by 0 for a sum (adding +0 to an accumulator that started at +0 changes nothing), by the accumulator's
//! identity for a max — so every load is in bounds, as the IR requires. Average pooling's divisor is a closed
//! form per output position (the count of real taps, or of taps inside the explicit pads).
//!
//! **Gather** addresses the data through the indices ([`IExpr::Read`]): each output element is one load,
//! `out[o…, i…, t…] = data[o…, clamp(wrap(indices[i…])), t…]`, O(1) work whatever the gathered axis' extent
//! (embedding tables included), a copy and so exact for every dtype. The index read is data, so it is wrapped
//! once (`i < 0 ? i + n : i`) and clamped into `[0, n)` before it addresses anything, keeping every load in
//! bounds as the IR requires. The innermost output loop runs over the gathered row (`t…`, when there is one),
//! where the index read is loop-invariant: the CPU emitter makes it one vector load per four elements.
//!
//! Dims may be symbolic: each distinct `Dim::Sym` becomes a kernel symbol named as in the graph. The type rules
//! require static channels, weights and spatial dims, so in practice only the batch dim is symbolic.

use std::collections::HashMap;

use kiln_ir::interp::scalar::Scalar;
use kiln_ir::op::{BinaryOp, Conv, ConvTranspose, Gather, Op, Pool, PoolKind};
use kiln_ir::{Dim, NodeId, Shape, TensorType, Value};

use super::ir::{AccOp, AccVar, ArgId, ArgRole, CmpOp, Expr, IExpr, Kernel, KernelArg, LoopKind, LoopVar, Stmt};
use super::lower::{LowerError, SpacePolicy, SymbolTable, compute_type};
use super::simplify::simplify;

/// `col[n, k, p]`: the im2col matrix of a conv with `groups == 1`. `k` runs over `(ci, k0, k1, …)` (channel
/// outermost, then the window's spatial offsets in order), `p` over the output's spatial positions (row-major).
/// Padded positions are 0. `out` is `[N, Cin·∏K, ∏O]`. Args `[x, out]`.
pub fn im2col(name: &str, x: &TensorType, w: &TensorType, conv: &Conv, out: &TensorType) -> Result<Kernel, LowerError> {
    let mut b = Builder::new(name, "im2col");
    if conv.groups != 1 {
        return Err(b.err(format!("needs groups == 1, got {}", conv.groups)));
    }
    let y = b.infer(&Op::Conv(conv.clone()), &[x.clone(), w.clone()])?;
    let window = b.conv_window(x, w, conv, &y)?;
    // The col matrix as the rank-(2 + 2r) tensor [N, Cin, K…, O…] it is, row-major.
    let mut expanded = vec![x.shape.0[0].clone(), x.shape.0[1].clone()];
    expanded.extend_from_slice(&w.shape.0[2..]);
    expanded.extend_from_slice(&y.shape.0[2..]);
    let product = |dims: &[Dim]| dim_product(dims).ok_or_else(|| b.err("its matrix extents do not fit"));
    let rows = product(&expanded[1..2 + window.len()])?;
    let cols = product(&expanded[2 + window.len()..])?;
    let want = TensorType::new(x.dtype, Shape(vec![expanded[0].clone(), rows, cols]));
    b.expect_out(out, &want)?;
    let xa = b.arg("x", x, ArgRole::Input);
    let oa = b.arg("out", out, ArgRole::Output);
    let xd = b.dims(&x.shape);
    let ed = b.dims(&Shape(expanded));
    let (loops, idx) = b.loops(&ed);
    let r = window.len();
    let (pos, inside) = window.taps(&idx[2 + r..], &idx[2..2 + r]);
    let mut at = vec![idx[0].clone(), idx[1].clone()];
    at.extend(pos);
    let load = Expr::Load { arg: xa, index: b.flat(&at, &xd) };
    let value = masked(inside, load, Expr::Const(Scalar::from_f64(x.dtype, 0.0)));
    let store = Stmt::Store { arg: oa, index: b.flat(&idx, &ed), value };
    Ok(b.finish(nest(loops, LoopKind::Parallel, vec![store])))
}

/// The product of `dims`: static, or a derived dim (`kiln_ir::dim`) when one is symbolic. `None` when it does
/// not fit (or a dim is not an expression).
pub fn dim_product(dims: &[Dim]) -> Option<Dim> {
    let mut acc = kiln_ir::dim::DimExpr::constant(1);
    for d in dims {
        acc = acc.mul(&kiln_ir::dim::DimExpr::of(d)?);
        if !acc.within_limits() {
            return None;
        }
    }
    acc.to_dim()
}

/// `out[n, c, …] = bias[c]`: the output of a conv pre-filled with its bias, before a GEMM accumulates into it.
/// Any dtype. Args `[bias, out]`.
pub fn bias_fill(name: &str, bias: &TensorType, out: &TensorType) -> Result<Kernel, LowerError> {
    let mut b = Builder::new(name, "bias_fill");
    if out.shape.rank() < 2 || bias.shape.0 != [out.shape.0[1].clone()] || bias.dtype != out.dtype {
        return Err(b.err(format!("needs bias[C] and out[N, C, …] of one dtype, got {bias} and {out}")));
    }
    let ba = b.arg("bias", bias, ArgRole::Input);
    let oa = b.arg("out", out, ArgRole::Output);
    let od = b.dims(&out.shape);
    let (loops, idx) = b.loops(&od);
    let value = Expr::Load { arg: ba, index: idx[1].clone() };
    let store = Stmt::Store { arg: oa, index: b.flat(&idx, &od), value };
    Ok(b.finish(nest(loops, LoopKind::Parallel, vec![store])))
}

/// Direct convolution, any groups, strides, pads, dilations and spatial rank, optional bias: one output element
/// per parallel iteration, a reduction over (input channel of the group, window). Float dtypes (f16/bf16
/// accumulate in f32). Args `[x, w, bias?, out]`.
pub fn conv_direct(
    name: &str,
    x: &TensorType,
    w: &TensorType,
    bias: Option<&TensorType>,
    conv: &Conv,
    out: &TensorType,
) -> Result<Kernel, LowerError> {
    conv_like(name, "conv", &Op::Conv(conv.clone()), x, w, Extra::Bias(bias), out, |b, d, y| {
        direct_taps(b, d, y, x, w, conv)
    })
}

/// Integer convolution (`conv_integer`): i8/u8 operands less their zero points (`x_zero` a scalar, `w_zero` a
/// scalar or one per output channel), summed exactly in i32; the padding adds 0. Any groups, strides, pads and
/// dilations. Args `[x, w, x_zero, w_zero, out]`.
pub fn conv_integer(
    name: &str,
    x: &TensorType,
    w: &TensorType,
    zeros: (&TensorType, &TensorType),
    conv: &Conv,
    out: &TensorType,
) -> Result<Kernel, LowerError> {
    conv_like(
        name,
        "conv_integer",
        &Op::ConvInteger(conv.clone()),
        x,
        w,
        Extra::Zeros(zeros.0, zeros.1),
        out,
        |b, d, y| direct_taps(b, d, y, x, w, conv),
    )
}

/// The taps of a direct convolution: output channel `m` belongs to group `m / (M / groups)`, which reads input
/// channels from `group · Cin/groups`; the window slides over the input.
fn direct_taps(
    b: &mut Builder,
    d: &ConvDims,
    y: &TensorType,
    x: &TensorType,
    w: &TensorType,
    conv: &Conv,
) -> Result<Taps, LowerError> {
    {
        let window = b.conv_window(x, w, conv, y)?;
        // Output channel m belongs to group m / (M / groups), which reads input channels from group · Cin/groups.
        let per_group = IExpr::floor_div(d.od[1].clone(), IExpr::Const(conv.groups));
        let first_channel = IExpr::times(IExpr::floor_div(d.idx[1].clone(), per_group), d.wd[1].clone());
        let (red_loops, red) = b.loops(&d.wd[1..]);
        let (pos, inside) = window.taps(&d.idx[2..], &red[1..]);
        let mut x_at = vec![d.idx[0].clone(), IExpr::plus(first_channel, red[0].clone())];
        x_at.extend(pos);
        let mut w_at = vec![d.idx[1].clone()];
        w_at.extend_from_slice(&red);
        Ok(Taps { red_loops, x_at, w_at, inside })
    }
}

/// The extents and output index of a convolution-like kernel, for its tap rule.
struct ConvDims {
    xd: Vec<IExpr>,
    wd: Vec<IExpr>,
    od: Vec<IExpr>,
    /// The output element's index.
    idx: Vec<IExpr>,
}

/// What a convolution-like kernel sums for one output element: over the reduction loops, `x[x_at] · w[w_at]`
/// where `inside` holds (the positions clamped into bounds either way).
struct Taps {
    red_loops: Vec<(LoopVar, IExpr)>,
    x_at: Vec<IExpr>,
    w_at: Vec<IExpr>,
    inside: Option<Expr>,
}

/// What a convolution-like kernel takes besides `x` and `w`.
enum Extra<'a> {
    /// A float convolution's optional bias (one per output channel).
    Bias(Option<&'a TensorType>),
    /// An integer convolution's zero points: `x`'s (a scalar) and `w`'s (a scalar or one per output channel).
    Zeros(&'a TensorType, &'a TensorType),
}

/// The index of a zero point's element: 0 when it holds one value, else `channel` (one per row, column or
/// output channel).
fn zero_point(t: &TensorType, channel: &IExpr) -> IExpr {
    if t.shape.num_elements() == Some(1) { IExpr::Const(0) } else { channel.clone() }
}

/// The kernel direct, transposed and integer convolutions share: checks (a float dtype, or i8/u8 with zero points;
/// the op's type rule giving `out`), the arguments `[x, w, bias?, out]` or `[x, w, x_zero, w_zero, out]`, a
/// parallel loop nest over the output whose body sums, in the compute type (i32 for integers), the products
/// `taps` describes, adds the bias of the output channel and stores the result.
#[allow(clippy::too_many_arguments)]
fn conv_like(
    name: &str,
    what: &'static str,
    op: &Op,
    x: &TensorType,
    w: &TensorType,
    extra: Extra<'_>,
    out: &TensorType,
    taps: impl FnOnce(&mut Builder, &ConvDims, &TensorType) -> Result<Taps, LowerError>,
) -> Result<Kernel, LowerError> {
    let mut b = Builder::new(name, what);
    let mut ins = vec![x.clone(), w.clone()];
    match extra {
        Extra::Bias(bias) => {
            if !x.dtype.is_float() {
                return Err(b.err(format!("needs a float dtype, got {}", x.dtype)));
            }
            ins.extend(bias.cloned());
        }
        Extra::Zeros(xz, wz) => ins.extend([xz.clone(), wz.clone()]),
    }
    let y = b.infer(op, &ins)?;
    b.expect_out(out, &y)?;
    if w.shape.as_static().is_none() {
        return Err(b.err("needs static weights"));
    }
    let c = if x.dtype.is_float() { compute_type(x.dtype) } else { kiln_ir::DType::I32 };
    let xa = b.arg("x", x, ArgRole::Input);
    let wa = b.arg("w", w, ArgRole::Input);
    let (ba, zeros) = match extra {
        Extra::Bias(bias) => (bias.map(|t| b.arg("bias", t, ArgRole::Input)), None),
        Extra::Zeros(xz, wz) => {
            (None, Some((b.arg("x_zero", xz, ArgRole::Input), b.arg("w_zero", wz, ArgRole::Input), wz)))
        }
    };
    let oa = b.arg("out", out, ArgRole::Output);
    let (xd, wd, od) = (b.dims(&x.shape), b.dims(&w.shape), b.dims(&out.shape));
    let (loops, idx) = b.loops(&od);
    let dims = ConvDims { xd, wd, od, idx };
    let acc = b.acc();
    let Taps { red_loops, x_at, w_at, inside } = taps(&mut b, &dims, &y)?;
    let mut xv = Expr::cast(Expr::Load { arg: xa, index: b.flat(&x_at, &dims.xd) }, x.dtype, c);
    let mut wv = Expr::cast(Expr::Load { arg: wa, index: b.flat(&w_at, &dims.wd) }, w.dtype, c);
    if let Some((xza, wza, wz)) = zeros {
        let xz = Expr::cast(Expr::Load { arg: xza, index: IExpr::Const(0) }, x.dtype, c);
        let wz = Expr::cast(Expr::Load { arg: wza, index: zero_point(wz, &dims.idx[1]) }, w.dtype, c);
        xv = Expr::binary(BinaryOp::Sub, xv, xz);
        wv = Expr::binary(BinaryOp::Sub, wv, wz);
    }
    let product = masked(inside, Expr::binary(BinaryOp::Mul, xv, wv), Expr::Const(Scalar::from_f64(c, 0.0)));
    let mut body = vec![Stmt::Acc { var: acc, dtype: c, op: AccOp::Sum }];
    body.extend(nest(red_loops, LoopKind::Reduction, vec![Stmt::Update { acc, value: product, position: None }]));
    let mut result = Expr::Acc(acc);
    if let Some(ba) = ba {
        let bv = Expr::cast(Expr::Load { arg: ba, index: dims.idx[1].clone() }, x.dtype, c);
        result = Expr::binary(BinaryOp::Add, result, bv);
    }
    body.push(Stmt::Store { arg: oa, index: b.flat(&dims.idx, &dims.od), value: Expr::cast(result, c, out.dtype) });
    Ok(b.finish(nest(loops, LoopKind::Parallel, body)))
}

/// Integer matrix product (`matmul_integer`): `out[…, m, n] = Σ_k (a[…, m, k] − a_zero) · (b[…, k, n] − b_zero)`
/// in i32, the zero points scalars or one per row of `a` / column of `b`, batch dims broadcast (numpy rules).
/// Operands of rank ≥ 2. One output element per parallel iteration. Args `[a, b, a_zero, b_zero, out]`.
pub fn matmul_integer(
    name: &str,
    a: &TensorType,
    bt: &TensorType,
    zeros: (&TensorType, &TensorType),
    out: &TensorType,
) -> Result<Kernel, LowerError> {
    let mut b = Builder::new(name, "matmul_integer");
    let y = b.infer(&Op::MatMulInteger, &[a.clone(), bt.clone(), zeros.0.clone(), zeros.1.clone()])?;
    b.expect_out(out, &y)?;
    let (ra, rb, ro) = (a.shape.rank(), bt.shape.rank(), out.shape.rank());
    if ra < 2 || rb < 2 {
        return Err(b.err(format!("needs operands of rank 2 or more, got {a} and {bt}")));
    }
    let i32 = kiln_ir::DType::I32;
    let aa = b.arg("a", a, ArgRole::Input);
    let ba = b.arg("b", bt, ArgRole::Input);
    let aza = b.arg("a_zero", zeros.0, ArgRole::Input);
    let bza = b.arg("b_zero", zeros.1, ArgRole::Input);
    let oa = b.arg("out", out, ArgRole::Output);
    let (ad, bd, od) = (b.dims(&a.shape), b.dims(&bt.shape), b.dims(&out.shape));
    let (loops, idx) = b.loops(&od);
    let (m, n) = (idx[ro - 2].clone(), idx[ro - 1].clone());
    let (red_loops, red) = b.loops(&ad[ra - 1..]);
    let k = red[0].clone();
    // An operand's batch index: the output's, right-aligned, 0 where the operand's extent is 1 (broadcast).
    let batch = |dims: &[Dim], rank: usize| -> Vec<IExpr> {
        (0..rank - 2)
            .map(|j| if dims[j] == Dim::Static(1) { IExpr::Const(0) } else { idx[ro - 2 - (rank - 2) + j].clone() })
            .collect()
    };
    let mut a_at = batch(&a.shape.0, ra);
    a_at.extend([m.clone(), k.clone()]);
    let mut b_at = batch(&bt.shape.0, rb);
    b_at.extend([k, n.clone()]);
    let load = |arg, at: &[IExpr], dims: &[IExpr], b: &Builder, dtype| {
        Expr::cast(Expr::Load { arg, index: b.flat(at, dims) }, dtype, i32)
    };
    let av = load(aa, &a_at, &ad, &b, a.dtype);
    let bv = load(ba, &b_at, &bd, &b, bt.dtype);
    let az = Expr::cast(Expr::Load { arg: aza, index: zero_point(zeros.0, &m) }, a.dtype, i32);
    let bz = Expr::cast(Expr::Load { arg: bza, index: zero_point(zeros.1, &n) }, bt.dtype, i32);
    let product = Expr::binary(BinaryOp::Mul, Expr::binary(BinaryOp::Sub, av, az), Expr::binary(BinaryOp::Sub, bv, bz));
    let acc = b.acc();
    let mut body = vec![Stmt::Acc { var: acc, dtype: i32, op: AccOp::Sum }];
    body.extend(nest(red_loops, LoopKind::Reduction, vec![Stmt::Update { acc, value: product, position: None }]));
    body.push(Stmt::Store { arg: oa, index: b.flat(&idx, &od), value: Expr::Acc(acc) });
    Ok(b.finish(nest(loops, LoopKind::Parallel, body)))
}

/// A transposed convolution in gather form: each output element sums, over its group's input channels and the
/// window, `x[n, ci, i…] · w[ci, co, k…]` for the taps with `o + pad − k·dilation = i·stride` inside the input —
/// the interpreter's scatter, read from the output side so every output element is written once. Float dtypes
/// (accumulating in f32 or wider); weights of static shape. Args `[x, w, bias?, out]`.
pub fn conv_transpose(
    name: &str,
    x: &TensorType,
    w: &TensorType,
    bias: Option<&TensorType>,
    ct: &ConvTranspose,
    out: &TensorType,
) -> Result<Kernel, LowerError> {
    let rank = x.shape.rank().saturating_sub(2);
    conv_like(name, "conv_transpose", &Op::ConvTranspose(ct.clone()), x, w, Extra::Bias(bias), out, |b, d, _| {
        // Output channel co is channel co mod (M/groups) of group co / (M/groups), which reads input channels
        // group · Cin/groups onwards.
        let per_group = d.wd[1].clone();
        let group = IExpr::floor_div(d.idx[1].clone(), per_group.clone());
        let co_local = IExpr::modulo(d.idx[1].clone(), per_group);
        let cin_per_group = IExpr::floor_div(d.xd[1].clone(), IExpr::Const(ct.groups));
        let mut red_extents = vec![cin_per_group.clone()];
        red_extents.extend_from_slice(&d.wd[2..]);
        let (red_loops, red) = b.loops(&red_extents);
        let ci = IExpr::plus(IExpr::times(group, cin_per_group), red[0].clone());
        let mut inside: Option<Expr> = None;
        let mut and = |c: Expr| {
            inside = Some(match inside.take() {
                None => c,
                Some(prev) => Expr::binary(BinaryOp::And, prev, c),
            })
        };
        let mut x_at = vec![d.idx[0].clone(), ci.clone()];
        for k in 0..rank {
            let t = IExpr::minus(
                IExpr::plus(d.idx[2 + k].clone(), IExpr::Const(ct.pads[k])),
                IExpr::times(red[1 + k].clone(), IExpr::Const(ct.dilations[k])),
            );
            let stride = IExpr::Const(ct.strides[k]);
            let i = IExpr::floor_div(t.clone(), stride.clone());
            and(Expr::cond(CmpOp::Le, IExpr::Const(0), t.clone()));
            if ct.strides[k] > 1 {
                and(Expr::cond(CmpOp::Eq, IExpr::modulo(t, stride), IExpr::Const(0)));
            }
            and(Expr::cond(CmpOp::Lt, i.clone(), d.xd[2 + k].clone()));
            // Clamped into the input, so the read is in bounds whether or not the tap is real.
            let last = IExpr::minus(d.xd[2 + k].clone(), IExpr::Const(1));
            x_at.push(IExpr::max(IExpr::min(i, last), IExpr::Const(0)));
        }
        let mut w_at = vec![ci, co_local];
        w_at.extend_from_slice(&red[1..]);
        Ok(Taps { red_loops, x_at, w_at, inside })
    })
}

/// Max or average pooling with the interpreter's semantics: pads, strides, dilations, `ceil_mode`,
/// `count_include_pad`; max ignores padding (a window with no real element gives the dtype's lowest value), and
/// average divides by the real taps (NaN for none) or, with `count_include_pad`, by the taps inside the explicit
/// pads. Args `[x, out]`.
pub fn pool(name: &str, x: &TensorType, pool: &Pool, out: &TensorType) -> Result<Kernel, LowerError> {
    let mut b = Builder::new(name, "pool");
    let y = b.infer(&Op::Pool(pool.clone()), std::slice::from_ref(x))?;
    b.expect_out(out, &y)?;
    let rank = x.shape.rank() - 2;
    let xd = b.dims(&x.shape);
    let window = Window(
        (0..rank)
            .map(|d| WindowDim {
                input: xd[2 + d].clone(),
                kernel: pool.kernel[d],
                stride: pool.strides[d],
                dilation: pool.dilations[d],
                pad_begin: pool.pads[d],
                output: out.shape.0[2 + d].as_static(),
            })
            .collect(),
    );
    let dtype = x.dtype;
    let xa = b.arg("x", x, ArgRole::Input);
    let oa = b.arg("out", out, ArgRole::Output);
    let od = b.dims(&out.shape);
    let (loops, idx) = b.loops(&od);
    let kernel: Vec<IExpr> = pool.kernel.iter().map(|&k| IExpr::Const(k)).collect();
    let acc = b.acc();
    let (red_loops, red) = b.loops(&kernel);
    let (pos, inside) = window.taps(&idx[2..], &red);
    let mut at = vec![idx[0].clone(), idx[1].clone()];
    at.extend(pos);
    let load = Expr::Load { arg: xa, index: b.flat(&at, &xd) };
    let (acc_dtype, op, value, result) = match pool.kind {
        PoolKind::Max => {
            let value = masked(inside, load, Expr::Const(AccOp::Max.identity(dtype)));
            (dtype, AccOp::Max, value, Expr::Acc(acc))
        }
        PoolKind::Avg => {
            let c = compute_type(dtype);
            let value = masked(inside, Expr::cast(load, dtype, c), Expr::Const(Scalar::from_f64(c, 0.0)));
            let count = b.simp(window.tap_count(&idx[2..], &pool.pads[rank..], pool.count_include_pad));
            let mean = Expr::binary(BinaryOp::Div, Expr::Acc(acc), Expr::index(count, c));
            (c, AccOp::Sum, value, Expr::cast(mean, c, dtype))
        }
    };
    let mut body = vec![Stmt::Acc { var: acc, dtype: acc_dtype, op }];
    body.extend(nest(red_loops, LoopKind::Reduction, vec![Stmt::Update { acc, value, position: None }]));
    body.push(Stmt::Store { arg: oa, index: b.flat(&idx, &od), value: result });
    Ok(b.finish(nest(loops, LoopKind::Parallel, body)))
}

/// Gather along `g.axis` (numpy `take`), any data dtype, i32 or i64 indices; a negative index wraps once
/// (`i + dim`). The wrapped index is clamped into range, so any index is memory-safe on a non-empty axis; the
/// caller validates indices before launching (an invalid one reads a clamped element here where the interpreter
/// fails, and an empty gathered axis admits no valid index at all). Args `[data, indices, out]`.
pub fn gather(
    name: &str,
    data: &TensorType,
    indices: &TensorType,
    g: &Gather,
    out: &TensorType,
) -> Result<Kernel, LowerError> {
    let mut b = Builder::new(name, "gather");
    let y = b.infer(&Op::Gather(g.clone()), &[data.clone(), indices.clone()])?;
    b.expect_out(out, &y)?;
    let axis = kiln_ir::types::normalize_axis(g.axis, data.shape.rank()).map_err(|m| b.err(m))?;
    let rank = indices.shape.rank();
    let da = b.arg("data", data, ArgRole::Input);
    let ia = b.arg("indices", indices, ArgRole::Input);
    let oa = b.arg("out", out, ArgRole::Output);
    let (dd, id, od) = (b.dims(&data.shape), b.dims(&indices.shape), b.dims(&out.shape));
    let (loops, idx) = b.loops(&od);
    let n = dd[axis].clone();
    if n == IExpr::Const(0) {
        // No index is valid, so the runtime never launches this with a non-empty output: fill, never load.
        let store =
            Stmt::Store { arg: oa, index: b.flat(&idx, &od), value: Expr::Const(Scalar::from_f64(data.dtype, 0.0)) };
        return Ok(b.finish(nest(loops, LoopKind::Parallel, vec![store])));
    }
    // The index, wrapped once and clamped into [0, n).
    let raw = IExpr::read(ia, b.flat(&idx[axis..axis + rank], &id));
    let wrapped = IExpr::select(CmpOp::Lt, raw.clone(), IExpr::Const(0), IExpr::plus(raw.clone(), n.clone()), raw);
    let clamped = IExpr::max(IExpr::min(wrapped, IExpr::minus(n, IExpr::Const(1))), IExpr::Const(0));
    let mut at = idx[..axis].to_vec();
    at.push(clamped);
    at.extend_from_slice(&idx[axis + rank..]);
    let load = Expr::Load { arg: da, index: b.flat(&at, &dd) };
    let store = Stmt::Store { arg: oa, index: b.flat(&idx, &od), value: load };
    Ok(b.finish(nest(loops, LoopKind::Parallel, vec![store])))
}

/// What a kernel argument of [`single_op`] or [`expanded_op`] binds: an operand or a result, by position.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The operand at this position.
    Operand(usize),
    /// The result at this position.
    Result(usize),
}

/// One op (a `softmax`, a `concat`, ...) on operands of types `ins`, lowered as a graph node of its own is
/// ([`super::lower`]), with the same symbols as the builtins: for the library calls a device has no native form
/// of. Returns the kernel and, per argument, what it binds: an operand the op never reads (an empty one) has no
/// argument.
pub fn single_op(
    name: &str,
    op: &Op,
    ins: &[TensorType],
    out: &TensorType,
) -> Result<(Kernel, Vec<Bound>), LowerError> {
    let expand = |g: &mut kiln_ir::Builder, operands: &[Value]| Ok(vec![g.op(op.clone(), operands)?]);
    lower_expansion(name, ins, std::slice::from_ref(out), SpacePolicy::Shared, expand)
}

/// An op written as IR primitives by `expand` (on the operands, of types `ins`, giving results of types `outs`),
/// lowered as one group ([`super::lower_mapped`]): for the routines a device has no native form of
/// (`dynamic_quantize`'s whole-tensor reductions and elementwise arithmetic become one kernel). Returns the
/// kernel and what each argument binds.
pub fn expanded_op(
    name: &str,
    ins: &[TensorType],
    outs: &[TensorType],
    expand: impl FnOnce(&mut kiln_ir::Builder, &[Value]) -> Result<Vec<Value>, kiln_ir::Error>,
) -> Result<(Kernel, Vec<Bound>), LowerError> {
    // The results may live in unrelated iteration spaces (a tensor beside scalars): a loop nest each.
    lower_expansion(name, ins, outs, SpacePolicy::Separate, expand)
}

/// [`expanded_op`] with the iteration-space policy `spaces`.
fn lower_expansion(
    name: &str,
    ins: &[TensorType],
    outs: &[TensorType],
    spaces: SpacePolicy,
    expand: impl FnOnce(&mut kiln_ir::Builder, &[Value]) -> Result<Vec<Value>, kiln_ir::Error>,
) -> Result<(Kernel, Vec<Bound>), LowerError> {
    let err = |reason: String| LowerError::NotLowerable { node: name.to_string(), reason };
    let mut g = kiln_ir::Builder::new(name);
    let mut operands = Vec::with_capacity(ins.len());
    for (i, t) in ins.iter().enumerate() {
        operands.push(g.input(&format!("x{i}"), t.dtype, t.shape.clone()).map_err(|e| err(e.to_string()))?);
    }
    let results = expand(&mut g, &operands).map_err(|e| err(e.to_string()))?;
    if results.len() != outs.len() {
        return Err(err(format!("{} results, not {}", results.len(), outs.len())));
    }
    for (i, (&y, out)) in results.iter().zip(outs).enumerate() {
        let got = g.type_of(y).map_err(|e| err(e.to_string()))?.clone();
        if &got != out {
            return Err(err(format!("result {i} is {got}, not {out}")));
        }
        g.output(&format!("y{i}"), y);
    }
    let graph = g.finish();
    // Every node the expansion added (the inputs are the graph's sources, not members).
    let group: Vec<NodeId> = graph.node_ids().filter(|&id| !matches!(graph.node(id).op, Op::Input(_))).collect();
    let (k, values) = super::lower_mapped(&graph, &group, name, &super::LowerOptions { spaces })?;
    let args = values
        .iter()
        .map(|v| match (operands.iter().position(|o| o == v), results.iter().position(|r| r == v)) {
            (Some(i), _) => Ok(Bound::Operand(i)),
            (None, Some(i)) => Ok(Bound::Result(i)),
            (None, None) => Err(err(format!("an argument for {v:?}, neither an operand nor a result"))),
        })
        .collect::<Result<_, _>>()?;
    Ok((k, args))
}

/// `cond ? value : fill`, or `value` when nothing needs masking.
fn masked(cond: Option<Expr>, value: Expr, fill: Expr) -> Expr {
    match cond {
        Some(c) => Expr::select(c, value, fill),
        None => value,
    }
}

/// Wraps `body` in `loops` (outermost first) of `kind`; a parallel nest's innermost loop is `Vectorizable` when
/// its body holds no loop. The loops are perfectly nested, so the emitters can flatten a parallel nest.
fn nest(loops: Vec<(LoopVar, IExpr)>, kind: LoopKind, body: Vec<Stmt>) -> Vec<Stmt> {
    let mut body = body;
    let mut innermost = true;
    for (var, extent) in loops.into_iter().rev() {
        let k = if kind == LoopKind::Parallel && innermost && !body.iter().any(|s| matches!(s, Stmt::For { .. })) {
            LoopKind::Vectorizable
        } else {
            kind
        };
        innermost = false;
        body = vec![Stmt::For { var, extent, kind: k, body: super::ir::Block(body) }];
    }
    body
}

/// One spatial dim of a sliding window.
struct WindowDim {
    /// The input extent.
    input: IExpr,
    /// The window extent.
    kernel: i64,
    stride: i64,
    dilation: i64,
    pad_begin: i64,
    /// The output extent, when static: with the input's, it bounds the positions read.
    output: Option<u64>,
}

/// A window over every spatial dim.
struct Window(Vec<WindowDim>);

impl Window {
    fn len(&self) -> usize {
        self.0.len()
    }

    /// For output position `out` and window offset `k`: the input position of each dim, clamped into the input
    /// where it may leave it, and the condition that the tap is a real element (`None`: always).
    fn taps(&self, out: &[IExpr], k: &[IExpr]) -> (Vec<IExpr>, Option<Expr>) {
        let mut inside: Option<Expr> = None;
        let mut and = |c: Expr| {
            inside = Some(match inside.take() {
                None => c,
                Some(prev) => Expr::binary(BinaryOp::And, prev, c),
            })
        };
        let mut pos = Vec::with_capacity(self.len());
        for (d, wd) in self.0.iter().enumerate() {
            let raw = IExpr::minus(
                IExpr::plus(
                    IExpr::times(out[d].clone(), IExpr::Const(wd.stride)),
                    IExpr::times(k[d].clone(), IExpr::Const(wd.dilation)),
                ),
                IExpr::Const(wd.pad_begin),
            );
            // The largest position read, when static, tells whether the end can overhang.
            let overhang = match (wd.output, wd.input.as_const()) {
                (Some(o), Some(n)) => (o as i64 - 1) * wd.stride + (wd.kernel - 1) * wd.dilation - wd.pad_begin > n - 1,
                _ => true,
            };
            let mut p = raw.clone();
            if overhang {
                and(Expr::cond(CmpOp::Lt, raw.clone(), wd.input.clone()));
                p = IExpr::min(p, IExpr::minus(wd.input.clone(), IExpr::Const(1)));
            }
            if wd.pad_begin > 0 {
                and(Expr::cond(CmpOp::Le, IExpr::Const(0), raw));
                p = IExpr::max(p, IExpr::Const(0));
            }
            pos.push(p);
        }
        (pos, inside)
    }

    /// The number of taps of output position `out` that are real elements, or with `include_pad` that lie
    /// inside the explicit pads (`pad_end` per dim): per dim, the count of offsets `k` in `[0, K)` whose
    /// position `o·s - pb + k·d` lies in `[0, in)` (or `[-pb, in + pe)`), multiplied over dims.
    fn tap_count(&self, out: &[IExpr], pad_end: &[i64], include_pad: bool) -> IExpr {
        let c = IExpr::Const;
        let mut count = c(1);
        for (d, wd) in self.0.iter().enumerate() {
            let start = IExpr::minus(IExpr::times(out[d].clone(), c(wd.stride)), c(wd.pad_begin));
            let (lo, hi) = if include_pad {
                (c(-wd.pad_begin), IExpr::plus(wd.input.clone(), c(pad_end[d])))
            } else {
                (c(0), wd.input.clone())
            };
            // k ≥ ceil((lo - start) / d) = -floor((start - lo) / d), and k ≤ floor((hi - 1 - start) / d).
            let first =
                IExpr::max(c(0), IExpr::minus(c(0), IExpr::floor_div(IExpr::minus(start.clone(), lo), c(wd.dilation))));
            let last = IExpr::min(
                c(wd.kernel - 1),
                IExpr::floor_div(IExpr::minus(IExpr::minus(hi, c(1)), start), c(wd.dilation)),
            );
            let n = IExpr::max(c(0), IExpr::plus(IExpr::minus(last, first), c(1)));
            count = IExpr::times(count, n);
        }
        count
    }
}

/// Kernel-building state: the buffers, symbols, and fresh loop and accumulator ids.
struct Builder {
    name: String,
    op: &'static str,
    args: Vec<KernelArg>,
    symbols: SymbolTable,
    loop_extent: HashMap<LoopVar, Option<u64>>,
    next_loop: u32,
    next_acc: u32,
}

impl Builder {
    fn new(name: &str, op: &'static str) -> Builder {
        Builder {
            name: name.to_string(),
            op,
            args: Vec::new(),
            symbols: SymbolTable::default(),
            loop_extent: HashMap::new(),
            next_loop: 0,
            next_acc: 0,
        }
    }

    /// An error naming the kernel and the op.
    fn err(&self, reason: impl std::fmt::Display) -> LowerError {
        LowerError::NotLowerable { node: self.name.clone(), reason: format!("{}: {reason}", self.op) }
    }

    /// The op's result type by its type rule, or the rule's complaint.
    fn infer(&self, op: &Op, ins: &[TensorType]) -> Result<TensorType, LowerError> {
        let mut outs = kiln_ir::infer::infer(op, ins).map_err(|m| self.err(m))?;
        Ok(outs.remove(0))
    }

    /// Checks the caller's result type against the one the op gives.
    fn expect_out(&self, out: &TensorType, want: &TensorType) -> Result<(), LowerError> {
        if out != want {
            return Err(self.err(format!("the result should be {want}, got {out}")));
        }
        Ok(())
    }

    /// The spatial window of a conv of `x` with `w` giving `y` (the type rule has checked the attributes).
    fn conv_window(
        &mut self,
        x: &TensorType,
        w: &TensorType,
        conv: &Conv,
        y: &TensorType,
    ) -> Result<Window, LowerError> {
        let rank = x.shape.rank() - 2;
        let mut dims = Vec::with_capacity(rank);
        for d in 0..rank {
            let kernel = w.shape.0[2 + d].as_static().ok_or_else(|| self.err("needs static weights"))?;
            dims.push(WindowDim {
                input: self.symbols.dim(&x.shape.0[2 + d]),
                kernel: kernel as i64,
                stride: conv.strides[d],
                dilation: conv.dilations[d],
                pad_begin: conv.pads[d],
                output: y.shape.0[2 + d].as_static(),
            });
        }
        Ok(Window(dims))
    }

    fn arg(&mut self, name: &str, ty: &TensorType, role: ArgRole) -> ArgId {
        let shape = ty.shape.0.iter().map(|d| self.symbols.extent(d)).collect();
        self.args.push(KernelArg { name: name.to_string(), dtype: ty.dtype, shape, role });
        ArgId(self.args.len() as u32 - 1)
    }

    fn dims(&mut self, shape: &Shape) -> Vec<IExpr> {
        shape.0.iter().map(|d| self.symbols.dim(d)).collect()
    }

    /// Fresh loops over `extents` and their index expressions; an extent of 1 opens no loop (its index is 0).
    fn loops(&mut self, extents: &[IExpr]) -> (Vec<(LoopVar, IExpr)>, Vec<IExpr>) {
        let mut loops = Vec::new();
        let mut idx = Vec::with_capacity(extents.len());
        for e in extents {
            let e = self.simp(e.clone());
            if e == IExpr::Const(1) {
                idx.push(IExpr::Const(0));
                continue;
            }
            let var = LoopVar(self.next_loop);
            self.next_loop += 1;
            self.loop_extent.insert(var, e.as_const().map(|c| c.max(0) as u64));
            loops.push((var, e));
            idx.push(IExpr::Var(var));
        }
        (loops, idx)
    }

    fn acc(&mut self) -> AccVar {
        self.next_acc += 1;
        AccVar(self.next_acc - 1)
    }

    fn simp(&self, e: IExpr) -> IExpr {
        simplify(&e, &|v| self.loop_extent.get(&v).copied().flatten())
    }

    /// The row-major element offset of `idx` in a buffer of extents `dims`.
    fn flat(&self, idx: &[IExpr], dims: &[IExpr]) -> IExpr {
        let mut acc = IExpr::Const(0);
        for (i, n) in idx.iter().zip(dims) {
            acc = IExpr::plus(IExpr::times(acc, n.clone()), i.clone());
        }
        self.simp(acc)
    }

    fn finish(self, body: Vec<Stmt>) -> Kernel {
        Kernel { name: self.name, args: self.args, symbols: self.symbols.0, body: super::ir::Block(body) }
    }
}
