//! ONNX op handlers: the table from op type to handler, and the small IR-building helpers they share.
//!
//! A handler reads its node's inputs and attributes through [`OnnxNode`] (every attribute it does not read is
//! reported as unsupported) and returns the node's results, in output order. It may return fewer results than
//! the node declares when only trailing optional outputs are unsupported and unused.

mod attention;
mod composite;
pub(crate) mod contrib;
mod control;
mod elementwise;
mod nn;
mod quant;
mod reduce;
mod rnn;
mod rotary;
pub(crate) mod sequence;
mod shape;
mod signal;

use kiln_ir::op::{BinaryOp, Reshape, Transpose, UnaryOp};
use kiln_ir::{DType, Data, Dim, Op, Shape, Tensor};

use crate::import::{Ctx, DimArg, Val};
use crate::node::OnnxNode;

/// A handler: maps one ONNX node onto IR ops.
pub(crate) type Handler = fn(&mut Ctx<'_>, &OnnxNode<'_>) -> Result<Vec<Val>, String>;

/// Every supported ONNX op type and its handler.
pub(crate) const TABLE: &[(&str, Handler)] = &[
    ("Abs", elementwise::unary),
    ("Acos", elementwise::unary),
    ("Acosh", elementwise::unary),
    ("Add", elementwise::binary),
    ("AffineGrid", composite::affine_grid),
    ("And", elementwise::binary),
    ("ArgMax", reduce::arg_reduce),
    ("ArgMin", reduce::arg_reduce),
    ("Asin", elementwise::unary),
    ("Asinh", elementwise::unary),
    ("Atan", elementwise::unary),
    ("Atanh", elementwise::unary),
    ("Attention", attention::attention),
    ("AveragePool", nn::pool),
    ("BatchNormalization", nn::batch_norm),
    ("BitShift", elementwise::binary),
    ("BitwiseAnd", elementwise::binary),
    ("BitwiseNot", elementwise::unary),
    ("BitwiseOr", elementwise::binary),
    ("BitwiseXor", elementwise::binary),
    ("BlackmanWindow", composite::window),
    ("Cast", elementwise::cast),
    ("CastLike", elementwise::cast_like),
    ("Ceil", elementwise::unary),
    ("Celu", elementwise::activation),
    ("CenterCropPad", shape::center_crop_pad),
    ("Clip", elementwise::clip),
    ("Col2Im", nn::col2im),
    ("Compress", shape::compress),
    ("NonZero", shape::non_zero),
    ("Unique", shape::unique),
    ("NonMaxSuppression", shape::non_max_suppression),
    ("Concat", shape::concat),
    ("Constant", shape::constant),
    ("ConstantOfShape", shape::constant_of_shape),
    ("Conv", nn::conv),
    ("ConvInteger", quant::conv_integer),
    ("ConvTranspose", nn::conv_transpose),
    ("Cos", elementwise::unary),
    ("Cosh", elementwise::unary),
    ("CumProd", reduce::cumprod),
    ("CumSum", reduce::cumsum),
    ("DepthToSpace", shape::depth_to_space),
    ("DequantizeLinear", quant::dequantize_linear),
    ("DFT", signal::dft),
    ("Div", elementwise::binary),
    ("Dropout", elementwise::dropout),
    ("DynamicQuantizeLinear", quant::dynamic_quantize_linear),
    ("Einsum", reduce::einsum),
    ("Elu", elementwise::activation),
    ("Equal", elementwise::binary),
    ("Erf", elementwise::unary),
    ("Exp", elementwise::unary),
    ("Expand", shape::expand),
    ("EyeLike", composite::eye_like),
    ("Flatten", shape::flatten),
    ("Floor", elementwise::unary),
    ("GRU", nn::gru),
    ("Gather", shape::gather),
    ("GatherElements", shape::gather_elements),
    ("GatherND", shape::gather_nd),
    ("Gelu", elementwise::activation),
    ("Gemm", reduce::gemm),
    ("GlobalAveragePool", nn::global_pool),
    ("GlobalMaxPool", nn::global_pool),
    ("Greater", elementwise::binary),
    ("GreaterOrEqual", elementwise::binary),
    ("GridSample", nn::grid_sample),
    ("GroupNormalization", nn::group_norm),
    ("HammingWindow", composite::window),
    ("HannWindow", composite::window),
    ("HardSigmoid", elementwise::activation),
    ("HardSwish", elementwise::activation),
    ("Hardmax", composite::hardmax),
    ("Identity", elementwise::identity),
    ("If", control::if_),
    ("InstanceNormalization", nn::instance_norm),
    ("IsInf", elementwise::is_inf),
    ("IsNaN", elementwise::unary),
    ("LRN", nn::lrn),
    ("LSTM", nn::lstm),
    ("LayerNormalization", nn::layer_norm),
    ("LeakyRelu", elementwise::activation),
    ("Less", elementwise::binary),
    ("LessOrEqual", elementwise::binary),
    ("Log", elementwise::unary),
    ("LogSoftmax", nn::softmax),
    ("Loop", control::loop_),
    ("LpNormalization", composite::lp_normalization),
    ("LpPool", composite::lp_pool),
    ("MatMul", reduce::matmul),
    ("MatMulInteger", quant::matmul_integer),
    ("Max", elementwise::variadic),
    ("MaxPool", nn::pool),
    ("Mean", elementwise::variadic),
    ("MeanVarianceNormalization", composite::mean_variance_normalization),
    ("MelWeightMatrix", signal::mel_weight_matrix),
    ("Min", elementwise::variadic),
    ("Mish", elementwise::activation),
    ("Mod", elementwise::modulo),
    ("Mul", elementwise::binary),
    ("Neg", elementwise::unary),
    ("NegativeLogLikelihoodLoss", composite::nll_loss),
    ("Not", elementwise::unary),
    ("OneHot", shape::one_hot),
    ("Or", elementwise::binary),
    ("PRelu", elementwise::prelu),
    ("Pad", shape::pad),
    ("Pow", elementwise::binary),
    ("QLinearConv", quant::qlinear_conv),
    ("QLinearMatMul", quant::qlinear_matmul),
    ("QuantizeLinear", quant::quantize_linear),
    ("RMSNormalization", composite::rms_norm),
    ("RNN", rnn::rnn),
    ("Range", shape::range),
    ("Reciprocal", elementwise::unary),
    ("ReduceL1", reduce::reduce),
    ("ReduceL2", reduce::reduce),
    ("ReduceLogSum", composite::reduce_log_sum),
    ("ReduceLogSumExp", reduce::reduce),
    ("ReduceMax", reduce::reduce),
    ("ReduceMean", reduce::reduce),
    ("ReduceMin", reduce::reduce),
    ("ReduceProd", reduce::reduce),
    ("ReduceSum", reduce::reduce),
    ("ReduceSumSquare", reduce::reduce),
    ("Relu", elementwise::unary),
    ("Reshape", shape::reshape),
    ("Resize", nn::resize),
    ("ReverseSequence", shape::reverse_sequence),
    ("RoiAlign", nn::roi_align),
    ("RotaryEmbedding", rotary::rotary_embedding),
    ("Round", elementwise::unary),
    ("Scan", control::scan),
    ("Scatter", shape::scatter_elements),
    ("ScatterElements", shape::scatter_elements),
    ("ScatterND", shape::scatter_nd),
    ("Selu", elementwise::activation),
    ("Shape", shape::shape),
    ("Shrink", composite::shrink),
    ("Sigmoid", elementwise::unary),
    ("Sign", elementwise::unary),
    ("Sin", elementwise::unary),
    ("Sinh", elementwise::unary),
    ("Size", shape::size),
    ("Slice", shape::slice),
    ("Softmax", nn::softmax),
    ("SoftmaxCrossEntropyLoss", composite::softmax_cross_entropy),
    ("Softplus", elementwise::activation),
    ("Softsign", elementwise::activation),
    ("SpaceToDepth", shape::space_to_depth),
    ("Split", shape::split),
    ("Sqrt", elementwise::unary),
    ("Squeeze", shape::squeeze),
    ("STFT", signal::stft),
    ("Sub", elementwise::binary),
    ("Sum", elementwise::variadic),
    ("SwiGLU", composite::swiglu),
    ("Swish", composite::swish),
    ("Tan", elementwise::unary),
    ("Tanh", elementwise::unary),
    ("ThresholdedRelu", elementwise::activation),
    ("Tile", shape::tile),
    ("TopK", reduce::top_k),
    ("Transpose", shape::transpose),
    ("Trilu", shape::trilu),
    ("Unsqueeze", shape::unsqueeze),
    ("Upsample", nn::upsample),
    ("Where", elementwise::where_),
    ("Xor", elementwise::binary),
];

/// The handler for a default-domain op type.
pub(crate) fn handler(op_type: &str) -> Option<Handler> {
    TABLE.iter().find(|(n, _)| *n == op_type).map(|(_, h)| *h)
}

/// `kind(x)`.
pub(crate) fn un(cx: &mut Ctx<'_>, kind: UnaryOp, x: &Val) -> Result<Val, String> {
    cx.op(Op::Unary(kind), &[x])
}

/// `kind(a, b)` with broadcasting.
pub(crate) fn bin(cx: &mut Ctx<'_>, kind: BinaryOp, a: &Val, b: &Val) -> Result<Val, String> {
    cx.op(Op::Binary(kind), &[a, b])
}

/// `x` converted to `to` (itself when it has that dtype).
pub(crate) fn cast(cx: &mut Ctx<'_>, x: &Val, to: DType) -> Result<Val, String> {
    if x.dtype() == to { Ok(x.clone()) } else { cx.op(Op::Cast(kiln_ir::op::Cast { to }), &[x]) }
}

/// A scalar constant with `like`'s dtype.
pub(crate) fn scalar_like(cx: &mut Ctx<'_>, like: &Val, v: f64) -> Result<Val, String> {
    cx.scalar(like.dtype(), v)
}

/// Reshape to `dims` (no-op when the type already has them).
pub(crate) fn reshape(cx: &mut Ctx<'_>, x: &Val, dims: Vec<Dim>) -> Result<Val, String> {
    if x.ty.shape.0 == dims {
        return Ok(x.clone());
    }
    cx.op(Op::Reshape(Reshape { shape: Shape(dims) }), &[x])
}

/// Transpose by `perm` (no-op for the identity permutation).
pub(crate) fn transpose(cx: &mut Ctx<'_>, x: &Val, perm: Vec<i64>) -> Result<Val, String> {
    if perm.iter().enumerate().all(|(i, &p)| p == i as i64) {
        return Ok(x.clone());
    }
    cx.op(Op::Transpose(Transpose { perm }), &[x])
}

/// Normalizes an axis against `rank`, as a message-friendly error. A scalar has no axis (the IR's
/// `normalize_axis` accepts 0 for rank 0, which would let a handler index an empty shape).
pub(crate) fn axis(a: i64, rank: usize) -> Result<usize, String> {
    if rank == 0 {
        return Err(format!("axis {a} is out of range for a scalar input"));
    }
    kiln_ir::types::normalize_axis(a, rank)
}

/// The static extents of `x`, or an error naming what needs them.
pub(crate) fn static_shape(x: &Val, what: &str) -> Result<Vec<usize>, String> {
    x.static_shape().ok_or_else(|| format!("{what} needs a static input shape, got {}", x.ty.shape))
}

/// A known integer input (`what` names it in errors), or `None` when the optional input is absent.
pub(crate) fn const_ints(n: &OnnxNode<'_>, i: usize, what: &str) -> Result<Option<Vec<i64>>, String> {
    match n.opt_input(i) {
        None => Ok(None),
        Some(v) => v.ints().map(Some).ok_or_else(|| {
            format!("input `{what}` must be known at import time (a constant or computed from constants)")
        }),
    }
}

/// Product of dims: static, or a single symbol times static 1s.
pub(crate) fn dim_product(dims: &[Dim]) -> Option<Dim> {
    let mut n = 1u64;
    let mut sym = None;
    for d in dims {
        match d {
            Dim::Static(k) => n *= k,
            Dim::Sym(s) if sym.is_none() => sym = Some(s.clone()),
            Dim::Sym(_) => return None,
        }
    }
    match sym {
        None => Some(Dim::Static(n)),
        Some(s) if n == 1 => Some(Dim::Sym(s)),
        Some(_) => None,
    }
}

/// A rank-1 i64 constant.
pub(crate) fn i64_tensor(v: Vec<i64>) -> Tensor {
    let n = v.len();
    Tensor::new(vec![n], Data::I64(v)).expect("length matches")
}

/// Extents (possibly symbolic) from a shape argument: `-1`/`0` are not allowed here.
pub(crate) fn dims_from_args(args: &[DimArg], what: &str) -> Result<Vec<Dim>, String> {
    args.iter()
        .map(|a| match a {
            DimArg::Int(n) if *n >= 0 => Ok(Dim::Static(*n as u64)),
            DimArg::Int(n) => Err(format!("{what} has negative extent {n}")),
            DimArg::Sym(s) => Ok(Dim::Sym(s.clone())),
        })
        .collect()
}

/// The dtype an ONNX `to` attribute names.
pub(crate) fn onnx_dtype(code: i64) -> Result<DType, String> {
    crate::tensor::dtype_from_onnx(code as i32)
}
