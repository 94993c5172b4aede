//! The closed set of ops, defined once.
//!
//! [`define_ops!`] is the op table: each row names a variant, its `.kir` mnemonic (or a family of mnemonics for
//! the elementwise kinds), its operand arity, and its typed attribute struct. From that one table come the
//! [`Op`] enum, [`Op::mnemonic`], [`Op::arity`], attribute printing, and parsing by mnemonic. Adding an op is a row
//! here, an attribute struct below, a type rule in `infer.rs` and semantics in `interp/`; the compiler points at
//! every other `match` that needs an arm.
//!
//! Semantics (the interpreter is the reference) are stated on each attribute struct.

use serde::{Deserialize, Serialize};

use crate::attr::{AttrSet, AttrSource};
use crate::fusion::FusionBody;
use crate::tensor::Tensor;
use crate::types::{DType, Dim, Shape};
use crate::{attrs, named_enum};

/// How many operands an op takes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Arity {
    /// Exactly this many.
    Exact(usize),
    /// Between `min` and `max` inclusive.
    Range(usize, usize),
    /// This many or more.
    AtLeast(usize),
}

impl Arity {
    /// Whether `n` operands are acceptable.
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exact(k) => n == k,
            Arity::Range(lo, hi) => (lo..=hi).contains(&n),
            Arity::AtLeast(k) => n >= k,
        }
    }
}

impl std::fmt::Display for Arity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arity::Exact(k) => write!(f, "{k}"),
            Arity::Range(lo, hi) => write!(f, "{lo} to {hi}"),
            Arity::AtLeast(k) => write!(f, "at least {k}"),
        }
    }
}

macro_rules! define_ops {
    (
        $( $(#[$m:meta])* $var:ident $( ( $attrs:ty ) )? = $mn:tt, $arity:expr; )*
    ) => {
        /// A tensor operation. See the module docs: this enum is generated from the op table.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "op", content = "attrs", rename_all = "snake_case")]
        pub enum Op { $( $(#[$m])* $var $( ($attrs) )?, )* }

        impl Op {
            /// The `.kir` mnemonic.
            pub fn mnemonic(&self) -> &'static str {
                match self { $( define_ops!(@pat $var $( ($attrs) )?, _a) => define_ops!(@mn $mn, _a), )* }
            }

            /// How many operands the op takes.
            pub fn arity(&self) -> Arity {
                match self { $( define_ops!(@pat $var $( ($attrs) )?, _a) => $arity, )* }
            }

            /// Appends the attribute block (`{…}`), if the op has attributes.
            pub fn print_attrs(&self, out: &mut String) {
                match self { $( define_ops!(@pat $var $( ($attrs) )?, _a) => define_ops!(@print $mn $( ($attrs) )?, _a, out), )* }
            }

            /// Every mnemonic the parser accepts, in table order.
            pub fn mnemonics() -> Vec<&'static str> {
                let mut v = Vec::new();
                $( define_ops!(@list $mn, v); )*
                v
            }

            /// Builds the op named by `mnemonic`, reading its attribute block from `src`. `None` if no op has that
            /// mnemonic.
            pub fn parse(mnemonic: &str, src: &mut dyn AttrSource) -> Option<Result<Op, String>> {
                $( if let Some(r) = define_ops!(@parse $var $mn $( ($attrs) )?, mnemonic, src) { return Some(r); } )*
                None
            }
        }
    };
    (@pat $var:ident ($attrs:ty), $a:ident) => { Op::$var($a) };
    (@pat $var:ident, $a:ident) => { Op::$var };
    (@mn $mn:literal, $a:ident) => { $mn };
    (@mn [$fam:ty], $a:ident) => { $a.name() };
    (@print $mn:literal ($attrs:ty), $a:ident, $out:ident) => { AttrSet::print_attrs($a, $out) };
    (@print [$fam:ty] ($attrs:ty), $a:ident, $out:ident) => { { let _ = $a; } };
    (@print $mn:literal, $a:ident, $out:ident) => { () };
    (@list $mn:literal, $v:ident) => { $v.push($mn) };
    (@list [$fam:ty], $v:ident) => { $v.extend(<$fam>::ALL.iter().map(|k| k.name())) };
    (@parse $var:ident $mn:literal ($attrs:ty), $name:ident, $src:ident) => {
        ($name == $mn).then(|| <$attrs as AttrSet>::parse_attrs($src).map(Op::$var))
    };
    (@parse $var:ident [$fam:ty] ($attrs:ty), $name:ident, $src:ident) => {
        <$fam>::from_name($name).map(Op::$var).map(Ok)
    };
    (@parse $var:ident $mn:literal, $name:ident, $src:ident) => {
        ($name == $mn).then(|| Ok(Op::$var))
    };
}

define_ops! {
    /// A named graph input; the result type is the input's declared type.
    Input(Input) = "input", Arity::Exact(0);
    /// A named weight whose bytes live outside the graph text (the graph's weight store).
    Parameter(Parameter) = "param", Arity::Exact(0);
    /// A small inline constant.
    Constant(Constant) = "constant", Arity::Exact(0);
    /// Elementwise unary math; mnemonic is the kind (`exp`, `relu`, …).
    Unary(UnaryOp) = [UnaryOp], Arity::Exact(1);
    /// Elementwise binary math with numpy broadcasting; mnemonic is the kind (`add`, `lt`, …).
    Binary(BinaryOp) = [BinaryOp], Arity::Exact(2);
    /// Elementwise conversion to another dtype.
    Cast(Cast) = "cast", Arity::Exact(1);
    /// `select(cond, a, b)`: `a` where `cond` (bool) is true, else `b`; all three broadcast.
    Select = "select", Arity::Exact(3);
    /// Reduction over a set of axes.
    Reduce(Reduce) = "reduce", Arity::Exact(1);
    /// Index of the largest or smallest element along one axis (i64 result).
    ArgReduce(ArgReduce) = "arg_reduce", Arity::Exact(1);
    /// The `k` largest (or smallest) elements along one axis, sorted, and their i64 indices: two results. `k` is
    /// an attribute, or a run-time operand.
    TopK(TopK) = "top_k", Arity::Range(1, 2);
    /// The indices of the nonzero elements (i64 `[rank, count]`): an output extent known only from the data.
    NonZero(NonZero) = "non_zero", Arity::Exact(1);
    /// The distinct elements or slices, first-occurrence indices, inverse and counts: four results sized by the
    /// data.
    Unique(Unique) = "unique", Arity::Exact(1);
    /// ONNX NonMaxSuppression: boxes, scores, max boxes per class, IoU threshold and an optional score threshold;
    /// the kept `(batch, class, box)` rows, as many as the data keeps.
    NonMaxSuppression(NonMaxSuppression) = "non_max_suppression", Arity::Range(4, 5);
    /// Batched matrix product with numpy broadcasting of the batch dims; rank-1 operands are promoted as numpy does.
    MatMul = "matmul", Arity::Exact(2);
    /// N-d convolution `conv(x[N,C,*], w[M,C/groups,*])`, optional `bias[M]` as a third operand.
    Conv(Conv) = "conv", Arity::Range(2, 3);
    /// Integer matrix product `(a - a_zero) · (b - b_zero)` with i32 accumulation and result (ONNX MatMulInteger):
    /// `a` and `b` are i8 or u8 (matmul shapes), `a_zero` has `a`'s dtype and is a scalar or one value per row of
    /// `a` (`[M]`), `b_zero` has `b`'s dtype and is a scalar or one value per column of `b` (`[N]`).
    MatMulInteger = "matmul_integer", Arity::Exact(4);
    /// Integer convolution `conv(x - x_zero, w - w_zero)` with i32 accumulation and result (ONNX ConvInteger):
    /// `x` and `w` are i8 or u8 (conv shapes), `x_zero` a scalar of `x`'s dtype (padding is `x_zero`, i.e. adds 0),
    /// `w_zero` of `w`'s dtype a scalar or one value per output channel (`[M]`).
    ConvInteger(Conv) = "conv_integer", Arity::Exact(4);
    /// Dynamic u8 quantization of an f32 tensor over its whole range (ONNX DynamicQuantizeLinear): results `y` (u8,
    /// the operand's shape), its scale (f32 scalar) and zero point (u8 scalar); the arithmetic is `kiln_ir::quant`'s.
    DynamicQuantize = "dynamic_quantize", Arity::Exact(1);
    /// N-d transposed convolution `conv_transpose(x[N,C,*], w[C,M/groups,*])`, optional `bias[M]`.
    ConvTranspose(ConvTranspose) = "conv_transpose", Arity::Range(2, 3);
    /// Max or average pooling over the spatial dims of `x[N,C,*]`.
    Pool(Pool) = "pool", Arity::Exact(1);
    /// Same elements, new shape (row-major order).
    Reshape(Reshape) = "reshape", Arity::Exact(1);
    /// Permutes dims: `out.shape[i] = in.shape[perm[i]]`.
    Transpose(Transpose) = "transpose", Arity::Exact(1);
    /// Broadcasts (numpy rules) to a target shape.
    Broadcast(Broadcast) = "broadcast", Arity::Exact(1);
    /// Strided slice.
    Slice(Slice) = "slice", Arity::Exact(1);
    /// Joins operands along an axis.
    Concat(Concat) = "concat", Arity::AtLeast(1);
    /// Splits along an axis into `sizes.len()` results.
    Split(Split) = "split", Arity::Exact(1);
    /// Pads with a constant, by reflection, or by repeating the edge.
    Pad(Pad) = "pad", Arity::Exact(1);
    /// `gather(data, indices)` along an axis (numpy `take`).
    Gather(Gather) = "gather", Arity::Exact(2);
    /// `gather_elements(data, indices)`: `out[i][j][k] = data[i][indices[i][j][k]][k]` for axis 1.
    GatherElements(GatherElements) = "gather_elements", Arity::Exact(2);
    /// `scatter(data, indices, updates)`: ONNX ScatterElements with an optional reduction.
    Scatter(Scatter) = "scatter", Arity::Exact(3);
    /// Index values along one axis of a static result shape: `out[..., i, ...] = start + i * step`.
    Iota(Iota) = "iota", Arity::Exact(0);
    /// The shape of the operand as an i64 vector.
    ShapeOf = "shape_of", Arity::Exact(1);
    /// `exp(x - max) / sum(exp(x - max))` along an axis.
    Softmax(Softmax) = "softmax", Arity::Exact(1);
    /// `x - max - log(sum(exp(x - max)))` along an axis.
    LogSoftmax(Softmax) = "log_softmax", Arity::Exact(1);
    /// `layer_norm(x, scale[, bias])`: normalizes over the dims from `axis` to the end.
    LayerNorm(LayerNorm) = "layer_norm", Arity::Range(2, 3);
    /// Inference batch norm `batch_norm(x[N,C,*], scale[C], bias[C], mean[C], var[C])`.
    BatchNorm(BatchNorm) = "batch_norm", Arity::Exact(5);
    /// GELU, exact (erf) or tanh-approximated.
    Gelu(Gelu) = "gelu", Arity::Exact(1);
    /// Nearest or linear resize to a static output shape.
    Resize(Resize) = "resize", Arity::Exact(1);
    /// Samples `x[N, C, D…]` at the normalized coordinates of `grid[N, O…, r]` (ONNX GridSample): `[N, C, O…]`.
    GridSample(GridSample) = "grid_sample", Arity::Exact(2);
    /// Pools each region of interest `rois[r]` of image `x[batch_indices[r]]` to a fixed grid (ONNX RoiAlign):
    /// `[R, C, output_height, output_width]`.
    RoiAlign(RoiAlign) = "roi_align", Arity::Exact(3);
    /// ONNX LSTM (layout 0): `lstm(x, w, r, b, h0, c0)` → `y, y_h, y_c`.
    Lstm(Lstm) = "lstm", Arity::Exact(6);
    /// ONNX GRU (layout 0): `gru(x, w, r, b, h0)` → `y, y_h`.
    Gru(Gru) = "gru", Arity::Exact(5);
    /// Run-time choice between two regions: `if cond, captures…` runs `then_branch` or `else_branch` on the
    /// captures; the chosen branch's outputs are the results.
    If(If) = "if", Arity::AtLeast(1);
    /// A loop region: `loop max_trip, cond, carried…, captures…` runs `body` while the iteration is below
    /// `max_trip` and `cond` holds; results are the carried values, then the stacked scan outputs.
    Loop(Loop) = "loop", Arity::AtLeast(2);
    /// A fusion group: a nested body graph run on the operands (`p0`, `p1`, … by position), one kernel or
    /// library call once lowered.
    Fusion(Fusion) = "fusion", Arity::AtLeast(0);
}

named_enum! {
    /// Elementwise unary kinds. Float-only kinds reject integer operands at build time; `not` takes bool;
    /// `is_nan`/`is_inf` return bool.
    pub enum UnaryOp {
        /// `-x` (wrapping for integers).
        Neg = "neg",
        /// `|x|` (wrapping: `abs(i8::MIN) == i8::MIN`).
        Abs = "abs",
        /// `e^x`.
        Exp = "exp",
        /// Natural log; `log(0) = -inf`, negative → NaN.
        Log = "log",
        /// Square root.
        Sqrt = "sqrt",
        /// `1 / sqrt(x)`.
        Rsqrt = "rsqrt",
        /// `1 / x`.
        Reciprocal = "reciprocal",
        /// Hyperbolic tangent.
        Tanh = "tanh",
        /// `1 / (1 + e^-x)`.
        Sigmoid = "sigmoid",
        /// The error function.
        Erf = "erf",
        /// `max(x, 0)`; NaN stays NaN.
        Relu = "relu",
        /// Sine.
        Sin = "sin",
        /// Cosine.
        Cos = "cos",
        /// Tangent.
        Tan = "tan",
        /// Arc sine.
        Asin = "asin",
        /// Arc cosine.
        Acos = "acos",
        /// Arc tangent.
        Atan = "atan",
        /// Hyperbolic sine.
        Sinh = "sinh",
        /// Hyperbolic cosine.
        Cosh = "cosh",
        /// Inverse hyperbolic sine.
        Asinh = "asinh",
        /// Inverse hyperbolic cosine.
        Acosh = "acosh",
        /// Inverse hyperbolic tangent.
        Atanh = "atanh",
        /// Round toward -inf.
        Floor = "floor",
        /// Round toward +inf.
        Ceil = "ceil",
        /// Round half to even.
        Round = "round",
        /// -1, 0 or 1 (NaN stays NaN).
        Sign = "sign",
        /// Logical not (bool only).
        Not = "not",
        /// True where NaN.
        IsNan = "is_nan",
        /// True where ±inf.
        IsInf = "is_inf",
        /// Bitwise complement (integers only).
        BitNot = "bit_not",
    }
}

named_enum! {
    /// Elementwise binary kinds. Comparisons return bool; `and`/`or`/`xor` take bool; the bitwise kinds and shifts
    /// take integers.
    pub enum BinaryOp {
        /// `a + b` (wrapping for integers).
        Add = "add",
        /// `a - b` (wrapping).
        Sub = "sub",
        /// `a * b` (wrapping).
        Mul = "mul",
        /// `a / b`; integers truncate toward zero, and division by zero (or `MIN / -1`) is an error.
        Div = "div",
        /// `a ^ b`; integer exponents below zero are an error.
        Pow = "pow",
        /// Larger of the two; NaN if either is NaN.
        Max = "max",
        /// Smaller of the two; NaN if either is NaN.
        Min = "min",
        /// Remainder with the sign of the divisor (Python `%`); integer `mod 0` is an error.
        Mod = "mod",
        /// Remainder with the sign of the dividend (C `fmod`); integer `rem 0` is an error.
        Rem = "rem",
        /// `a == b`.
        Eq = "eq",
        /// `a < b`.
        Lt = "lt",
        /// `a <= b`.
        Le = "le",
        /// `a > b`.
        Gt = "gt",
        /// `a >= b`.
        Ge = "ge",
        /// Logical and.
        And = "and",
        /// Logical or.
        Or = "or",
        /// Logical exclusive or.
        Xor = "xor",
        /// Bitwise and.
        BitAnd = "bit_and",
        /// Bitwise or.
        BitOr = "bit_or",
        /// Bitwise exclusive or.
        BitXor = "bit_xor",
        /// `a << b`, dropping the bits shifted out; 0 when `b` is negative or at least the bit width.
        Shl = "shl",
        /// `a >> b`, arithmetic (sign-filling) for signed types; when `b` is negative or at least the bit width,
        /// every bit is the sign (-1 or 0).
        Shr = "shr",
    }
}

impl BinaryOp {
    /// True for kinds whose result is bool.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge)
    }

    /// True for the logical kinds, which take bool operands.
    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
    }

    /// True for the bitwise kinds and shifts, which take integer operands.
    pub fn is_bitwise(self) -> bool {
        matches!(self, BinaryOp::BitAnd | BinaryOp::BitOr | BinaryOp::BitXor | BinaryOp::Shl | BinaryOp::Shr)
    }
}

impl UnaryOp {
    /// True for kinds that only make sense on floats.
    pub fn is_float_only(self) -> bool {
        !matches!(
            self,
            UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Relu
                | UnaryOp::Sign
                | UnaryOp::Not
                | UnaryOp::IsNan
                | UnaryOp::IsInf
                | UnaryOp::BitNot
        ) && !self.is_rounding()
    }

    /// Floor, ceil and round: identity on integers.
    pub fn is_rounding(self) -> bool {
        matches!(self, UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round)
    }
}

attrs! {
    /// A graph input's name.
    pub struct Input { name: String }
}

attrs! {
    /// A weight's name (its key in the weight store and in checkpoints) and type.
    pub struct Parameter { name: String }
}

attrs! {
    /// An inline constant's value.
    pub struct Constant { value: Tensor }
}

attrs! {
    /// Target dtype. Float → int truncates toward zero and saturates (NaN → 0); int → int wraps; → bool is `!= 0`.
    pub struct Cast { to: DType }
}

named_enum! {
    /// Reduction kinds.
    pub enum ReduceKind {
        /// Sum (0 for an empty set).
        Sum = "sum",
        /// Mean (NaN for an empty set of floats).
        Mean = "mean",
        /// Maximum; NaN propagates; an empty set gives -inf (the type's minimum for integers).
        Max = "max",
        /// Minimum; NaN propagates; an empty set gives +inf (the type's maximum for integers).
        Min = "min",
        /// Product (1 for an empty set).
        Prod = "prod",
    }
}

attrs! {
    /// Reduces over `axes` (negative counts from the end; empty means no axes, i.e. identity); with `keep_dims`
    /// the reduced dims stay as 1.
    pub struct Reduce { kind: ReduceKind, axes: Vec<i64>, keep_dims: bool }
}

named_enum! {
    /// Arg-reduction kinds.
    pub enum ArgKind {
        /// Index of the maximum.
        Max = "max",
        /// Index of the minimum.
        Min = "min",
    }
}

attrs! {
    /// Index (i64) of the extreme value along `axis`; ties take the first index, or the last with
    /// `select_last_index`. A NaN counts as the extreme value.
    pub struct ArgReduce { kind: ArgKind, axis: i64, keep_dims: bool, select_last_index: bool }
}

attrs! {
    /// The `k` (at most the axis extent) largest elements along `axis` with `largest`, else the smallest, and
    /// their indices. Results are ordered best first; equal values keep index order (the lower index first), and
    /// NaN ranks above every number (first when largest, last otherwise), NaNs in index order. `sorted=false`
    /// allows any order of the `k` results; the interpreter sorts regardless, which is one such order.
    ///
    /// With one operand, `k` is the results' extent along `axis`: static, or a symbolic dim bound like any other.
    /// With a second operand (one i64 element), that operand's value is `k`, read when the op runs: then the
    /// attribute `k` names the symbol of the results' axis extent, a *data-dependent dim* as for [`NonZero`]
    /// (once a pass has bound that symbol, `k` is static and the operand must hold that value).
    pub struct TopK { axis: i64, k: Dim, largest: bool, sorted: bool }
}

attrs! {
    /// The indices of the operand's nonzero elements (false for bool, `±0` for floats; NaN is nonzero), as an
    /// i64 `[rank, count]` tensor whose column `j` is the `j`-th nonzero element's index, in row-major order (a
    /// scalar operand gives `[0, count]`). `count` names the symbol of the result's second extent: a
    /// *data-dependent dim*, bound when the op runs (a run's inputs cannot bind it), which later ops may use
    /// like any symbolic dim. Two nodes never share one.
    pub struct NonZero { count: String }
}

attrs! {
    /// The distinct slices of the operand along `axis` (its distinct elements, as a vector, when `flatten`),
    /// ascending (lexicographically for slices; NaN above every number) when `sorted`, else in the order they
    /// first occur; then the index of each one's first occurrence (i64 `[count]`), the group of every slice or
    /// element of the operand (i64 `[n]`: the inverse) and each group's size (i64 `[count]`). `count` names the
    /// data-dependent dim of the distinct values, as for [`NonZero`].
    pub struct Unique { axis: i64, flatten: bool, sorted: bool, count: String }
}

attrs! {
    /// Greedy non-maximum suppression, ONNX's `NonMaxSuppression`: operands boxes (f32 `[batches, boxes, 4]`,
    /// `[y1, x1, y2, x2]` corners or, with `center_point_box`, `[x_center, y_center, width, height]`), scores
    /// (f32 `[batches, classes, boxes]`), the most boxes kept per class (i64, one element), the IoU threshold
    /// (f32, one element) and, optionally, a score threshold (f32, one element: only boxes scoring above it are
    /// candidates). Per batch and class, candidates best first (the lower box index first on ties) are kept
    /// unless their IoU with a kept box exceeds the threshold. Result: i64 `[count, 3]` rows of
    /// `(batch, class, box)`, batch by batch, class by class, in keeping order; `count` is data-dependent.
    pub struct NonMaxSuppression { center_point_box: bool, count: String }
}

attrs! {
    /// Convolution: `strides`, `dilations` per spatial dim; `pads` is all begins then all ends; `groups` divides
    /// the channels.
    pub struct Conv { strides: Vec<i64>, pads: Vec<i64>, dilations: Vec<i64>, groups: i64 }
}

attrs! {
    /// Transposed convolution (the gradient of `conv`): output extent per spatial dim is
    /// `stride*(in-1) + output_padding + (k-1)*dilation + 1 - pad_begin - pad_end`.
    pub struct ConvTranspose {
        strides: Vec<i64>,
        pads: Vec<i64>,
        dilations: Vec<i64>,
        output_padding: Vec<i64>,
        groups: i64,
    }
}

named_enum! {
    /// Pooling kinds.
    pub enum PoolKind {
        /// Maximum (padding never wins).
        Max = "max",
        /// Average.
        Avg = "avg",
    }
}

attrs! {
    /// Pooling window `kernel` per spatial dim. Output extent is `floor((in + pads - ((k-1)*d+1)) / s) + 1`, or
    /// `ceil` with `ceil_mode` (a window must start inside the input or left padding). For `avg`,
    /// `count_include_pad` divides by the full window (pads counted, the ceil-mode overhang not); otherwise by the
    /// number of real elements.
    pub struct Pool {
        kind: PoolKind,
        kernel: Vec<i64>,
        strides: Vec<i64>,
        pads: Vec<i64>,
        dilations: Vec<i64>,
        ceil_mode: bool,
        count_include_pad: bool,
    }
}

attrs! {
    /// Target shape; the element count must match.
    pub struct Reshape { shape: Shape }
}

attrs! {
    /// Permutation of the dims.
    pub struct Transpose { perm: Vec<i64> }
}

attrs! {
    /// Target shape of the broadcast.
    pub struct Broadcast { shape: Shape }
}

attrs! {
    /// Slice along `axes` (ONNX semantics): negative starts/ends count from the end and are clamped into range;
    /// `steps` are nonzero, and negative steps walk backwards.
    pub struct Slice { starts: Vec<i64>, ends: Vec<i64>, axes: Vec<i64>, steps: Vec<i64> }
}

attrs! {
    /// Concatenation axis.
    pub struct Concat { axis: i64 }
}

attrs! {
    /// Split axis and the extent of each piece (they sum to the axis extent).
    pub struct Split { axis: i64, sizes: Vec<i64> }
}

named_enum! {
    /// Padding modes.
    pub enum PadMode {
        /// Fill with `value`.
        Constant = "constant",
        /// Mirror without repeating the edge (`[1,2,3]` padded by 2 → `[3,2,1,2,3,2,1]`).
        Reflect = "reflect",
        /// Repeat the edge element.
        Edge = "edge",
        /// Wrap around (`[1,2,3]` padded by 2 → `[2,3,1,2,3,1,2]`): the element at `(i - begin) mod n`.
        Wrap = "wrap",
    }
}

attrs! {
    /// Padding: `pads` is all begins then all ends (negative values crop); `value` fills in constant mode.
    pub struct Pad { mode: PadMode, pads: Vec<i64>, #[serde(with = "crate::attr::non_finite")] value: f64 }
}

attrs! {
    /// Gather axis. Indices (i32/i64) may be negative (counted from the end); out of range is an error.
    pub struct Gather { axis: i64 }
}

attrs! {
    /// Gather-elements axis; `indices` has the data's rank.
    pub struct GatherElements { axis: i64 }
}

named_enum! {
    /// How scattered updates combine with existing values.
    pub enum ScatterReduction {
        /// Overwrite (the last update wins).
        None = "none",
        /// Add.
        Add = "add",
        /// Multiply.
        Mul = "mul",
        /// Maximum.
        Max = "max",
        /// Minimum.
        Min = "min",
    }
}

attrs! {
    /// ONNX ScatterElements: `out = data; out[..indices[i]..] (op)= updates[i]` along `axis`.
    pub struct Scatter { axis: i64, reduction: ScatterReduction }
}

attrs! {
    /// Result type and axis; elements are `start + index * step` converted to the dtype.
    pub struct Iota {
        dtype: DType,
        shape: Shape,
        axis: i64,
        #[serde(with = "crate::attr::non_finite")]
        start: f64,
        #[serde(with = "crate::attr::non_finite")]
        step: f64,
    }
}

attrs! {
    /// Softmax axis.
    pub struct Softmax { axis: i64 }
}

attrs! {
    /// Normalizes over dims `axis..rank`: `(x - mean) / sqrt(var + epsilon) * scale + bias`, with `scale` and
    /// `bias` broadcast against those trailing dims.
    pub struct LayerNorm { axis: i64, #[serde(with = "crate::attr::non_finite")] epsilon: f64 }
}

attrs! {
    /// `(x - mean) / sqrt(var + epsilon) * scale + bias`, per channel (dim 1).
    pub struct BatchNorm { #[serde(with = "crate::attr::non_finite")] epsilon: f64 }
}

named_enum! {
    /// GELU variants.
    pub enum GeluApprox {
        /// `x/2 * (1 + erf(x/√2))`, with `x/√2` computed as `x * (1/√2)`.
        None = "none",
        /// `x/2 * (1 + tanh(√(2/π) * (x + 0.044715 x³)))`.
        Tanh = "tanh",
    }
}

attrs! {
    /// GELU variant.
    pub struct Gelu { approximate: GeluApprox }
}

named_enum! {
    /// Resize interpolation.
    pub enum ResizeMode {
        /// Nearest neighbour.
        Nearest = "nearest",
        /// (Multi-)linear.
        Linear = "linear",
        /// (Multi-)cubic: Keys' cubic convolution with coefficient `cubic_a` over four taps per dim.
        Cubic = "cubic",
    }
}

named_enum! {
    /// What a grid sample reads outside the input (ONNX GridSample `padding_mode`).
    pub enum GridPadding {
        /// 0.
        Zeros = "zeros",
        /// The nearest edge element: coordinates and taps clamped into the input.
        Border = "border",
        /// The input mirrored at its borders (at the edge pixels' centres with `align_corners`, else at their
        /// outer edges), as often as needed.
        Reflection = "reflection",
    }
}

attrs! {
    /// ONNX GridSample: output element `(n, c, o…)` samples `x[n, c]` at the grid's point `grid[n, o…]`, whose `r`
    /// values are normalized coordinates in `[-1, 1]` of the spatial dims in reverse order (`(x, y)` for an image:
    /// width first). A coordinate `v` over an extent `L` is `(v + 1)/2 · (L - 1)` with `align_corners`, else
    /// `((v + 1)·L - 1)/2`, in f32. `nearest` rounds it half to even; a coordinate outside the input's borders
    /// (`[0, L-1]` with `align_corners`, else `[-0.5, L-0.5]`) is clamped into `[0, L-1]` (`border`) or
    /// reflected (`reflection`). `linear` and `cubic` (Keys, a = -0.75) then interpolate dim by dim over 2 or 4
    /// taps per dim, innermost dims first, each tap outside the input read as `padding` says (the index
    /// clamped, reflected, or the value 0). Float data; the result has `x`'s dtype.
    pub struct GridSample { mode: ResizeMode, padding: GridPadding, align_corners: bool }
}

attrs! {
    /// ONNX RoiAlign: box `r` (`[x1, y1, x2, y2]` in image coordinates, times `spatial_scale`, less 0.5 with
    /// `half_pixel`; at least 1×1 without it) is split into `output_height × output_width` bins; each bin samples
    /// a `sampling_ratio²` grid (or `ceil(box / output)` per dim when `sampling_ratio` is 0) bilinearly — a
    /// sample more than one pixel outside the image is 0, one nearer is clamped in — and pools the samples by
    /// their mean (`avg`) or by the largest of each sample's four weighted corners (`max`, as ONNX's reference
    /// computes it). Arithmetic in the data's compute type; `batch_indices` must name an image.
    pub struct RoiAlign {
        mode: PoolKind,
        output_height: i64,
        output_width: i64,
        sampling_ratio: i64,
        #[serde(with = "crate::attr::non_finite")]
        spatial_scale: f64,
        half_pixel: bool,
    }
}

named_enum! {
    /// How an output coordinate maps to an input coordinate (ONNX `coordinate_transformation_mode`).
    pub enum CoordMode {
        /// `(o + 0.5) / scale - 0.5`.
        HalfPixel = "half_pixel",
        /// Like half_pixel, but 0 when the output extent is 1.
        PytorchHalfPixel = "pytorch_half_pixel",
        /// `o * (in - 1) / (out - 1)`.
        AlignCorners = "align_corners",
        /// `o / scale`.
        Asymmetric = "asymmetric",
        /// Like half_pixel, centred: plus `in/2 · (1 - out / (in · scale))`, which differs from half_pixel when
        /// the output extent is not exactly `in · scale`.
        HalfPixelSymmetric = "half_pixel_symmetric",
        /// A crop box `roi` (start and end per dim, as fractions of `in - 1`) resampled onto the output:
        /// `start·(in-1) + o·(end-start)·(in-1)/(in·scale - 1)` (the box's middle for an output of one element); an
        /// output element whose coordinate falls outside `[0, in - 1]` along any dim is `extrapolation`.
        TfCropAndResize = "tf_crop_and_resize",
    }
}

named_enum! {
    /// Rounding of a fractional coordinate in nearest mode.
    pub enum NearestMode {
        /// Round, ties down.
        RoundPreferFloor = "round_prefer_floor",
        /// Round, ties up.
        RoundPreferCeil = "round_prefer_ceil",
        /// Floor.
        Floor = "floor",
        /// Ceil.
        Ceil = "ceil",
    }
}

attrs! {
    /// Resize to `shape` (same rank as the input). `scales` per dim are used for the coordinate mapping (ONNX
    /// passes them explicitly; when derived from sizes they are `out/in`). For cubic resizing `cubic_a` is the
    /// kernel's coefficient (ONNX `cubic_coeff_a`) and `exclude_outside` drops the taps outside the input,
    /// renormalizing the rest; `antialias` widens the linear or cubic filter by the inverse scale when
    /// downsampling (ONNX `antialias`). `roi` (every dim's start, then every dim's end) and `extrapolation` serve
    /// the `tf_crop_and_resize` coordinates. These five are printed and serialized only when not at their
    /// defaults.
    pub struct Resize {
        mode: ResizeMode,
        coord: CoordMode,
        nearest: NearestMode,
        shape: Shape,
        scales: Vec<f64>,
        #[serde(
            default = "default_cubic_a",
            skip_serializing_if = "is_default_cubic_a",
            with = "crate::attr::non_finite"
        )]
        cubic_a: f64 = DEFAULT_CUBIC_A,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        exclude_outside: bool = false,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        antialias: bool = false,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        roi: Vec<f64> = Vec::<f64>::new(),
        #[serde(default, skip_serializing_if = "is_zero", with = "crate::attr::non_finite")]
        extrapolation: f64 = 0.0,
    }
}

impl Resize {
    /// Whether dim `d`'s coordinate mapping is the identity where the input and output extents agree: a scale of
    /// 1, and for `tf_crop_and_resize` the whole dim as the crop box.
    pub fn keeps_dim(&self, d: usize) -> bool {
        let whole = || self.roi.get(d) == Some(&0.0) && self.roi.get(self.roi.len() / 2 + d) == Some(&1.0);
        self.scales.get(d) == Some(&1.0) && (self.coord != CoordMode::TfCropAndResize || whole())
    }

    /// A resize with the filter attributes at their defaults (no antialiasing, ONNX's cubic coefficient).
    pub fn new(mode: ResizeMode, coord: CoordMode, nearest: NearestMode, shape: Shape, scales: Vec<f64>) -> Resize {
        Resize {
            mode,
            coord,
            nearest,
            shape,
            scales,
            cubic_a: DEFAULT_CUBIC_A,
            exclude_outside: false,
            antialias: false,
            roi: Vec::new(),
            extrapolation: 0.0,
        }
    }
}

/// ONNX's default `cubic_coeff_a`.
pub const DEFAULT_CUBIC_A: f64 = -0.75;

fn default_cubic_a() -> f64 {
    DEFAULT_CUBIC_A
}

// The filter fields serialize only when not at their defaults, so a program written before they existed reads
// back, and serializes again, exactly as it was (an artifact's digest covers its serialized program).
fn is_default_cubic_a(v: &f64) -> bool {
    *v == DEFAULT_CUBIC_A
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

named_enum! {
    /// Direction of a recurrent layer.
    pub enum RnnDirection {
        /// First to last.
        Forward = "forward",
        /// Last to first.
        Reverse = "reverse",
        /// Both; results stack forward then reverse on the direction dim.
        Bidirectional = "bidirectional",
    }
}

attrs! {
    /// LSTM with ONNX's default activations (sigmoid, tanh, tanh), gate order i, o, f, c, no peepholes.
    /// `x[seq,batch,in]`, `w[dirs,4h,in]`, `r[dirs,4h,h]`, `b[dirs,8h]`, `h0`/`c0[dirs,batch,h]`;
    /// results `y[seq,dirs,batch,h]`, `y_h`, `y_c[dirs,batch,h]`. `clip` bounds the cell input when finite.
    pub struct Lstm {
        hidden_size: i64,
        direction: RnnDirection,
        #[serde(with = "crate::attr::non_finite")]
        clip: f64,
        input_forget: bool,
    }
}

attrs! {
    /// GRU with ONNX's default activations (sigmoid, tanh), gate order z, r, h.
    /// `x[seq,batch,in]`, `w[dirs,3h,in]`, `r[dirs,3h,h]`, `b[dirs,6h]`, `h0[dirs,batch,h]`;
    /// results `y[seq,dirs,batch,h]`, `y_h[dirs,batch,h]`.
    pub struct Gru {
        hidden_size: i64,
        direction: RnnDirection,
        #[serde(with = "crate::attr::non_finite")]
        clip: f64,
        linear_before_reset: bool,
    }
}

attrs! {
    /// Control flow on a run-time condition (ONNX `If`). Operands: the condition (bool, one element), then the
    /// captures — the values of the enclosing graph the branches read — which bind both bodies' inputs `p0`,
    /// `p1`, … by position, with the operands' types. Both branches give the same number of outputs, pairwise of
    /// one dtype and rank; the results are the chosen branch's outputs. A result extent on which the branches
    /// agree (static, or symbols the operands bind) keeps it; any other is a data-dependent dim named
    /// `<count>_<result>_<axis>`, bound when the op runs. Two nodes never share a `count`.
    pub struct If { then_branch: FusionBody, else_branch: FusionBody, count: String }
}

attrs! {
    /// A loop (ONNX `Loop`; `Scan` imports as one). Operands: `max_trip` (i64, rank 0), `cond` (bool, rank 0), the
    /// `carried` loop-carried values, then the captures. The body's inputs bind, by position, the iteration
    /// number (i64 rank 0, from 0), the condition (bool rank 0), the carried values and the captures; its outputs
    /// are the next condition, the next carried values (each of its carried input's dtype and rank), then any
    /// number of *scan outputs*. While `iteration < max_trip` and the condition holds, the body runs on the
    /// current values. Results: the final carried values (the initial ones after zero iterations), then each scan
    /// output's per-iteration values stacked along a new leading axis of extent `count`, the data-dependent
    /// iteration count. A carried value's body input may declare symbols of its own where its extent changes
    /// from one iteration to the next; a result extent that is neither static nor made of symbols the operands
    /// bind is data-dependent, named `<count>_<result>_<axis>`. The interpreter stops a loop that runs past
    /// `KILN_MAX_LOOP_ITERATIONS` (default 2^24) iterations with an error.
    pub struct Loop { body: FusionBody, carried: i64, count: String }
}

named_enum! {
    /// What a fusion group becomes once lowered.
    pub enum FusionKind {
        /// Elementwise, broadcast, layout and reduction ops only: one generated kernel.
        Loop = "loop",
        /// One `matmul`/`conv` root with an elementwise epilogue: a library call with the epilogue applied on
        /// the output tile.
        Library = "library",
    }
}

attrs! {
    /// A fusion group: `body` is a graph whose `input` nodes `p0`, `p1`, … bind the operands by position (types
    /// equal to the operand types) and whose outputs, in order, are the node's results. The meaning is running
    /// `body` on the operands. Printed as a nested region (see `docs/kir.md`).
    pub struct Fusion { kind: FusionKind, body: FusionBody }
}

/// What fusion may do with an op: the one answer the passes (`fuse`, `layout`, `plan-memory`) and the backends'
/// lowering consult. Decided per op by an exhaustive match in [`Op::fusibility`], so a new op must take a side.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Fusibility {
    /// Element `i` of each result depends only on element `i` of each (broadcast) operand: a library epilogue
    /// may hold it, a transpose may move across it, and its result may overwrite a same-sized operand.
    Elementwise,
    /// Element `i` of the result depends only on element `i` of the first operand and on the channel (dim 1) of
    /// `i` in the others (`batch_norm`): a library epilogue may hold it when the first operand is the chain's
    /// value, and a loop group may; a transpose may not move across it (it would move the channel), nor may the
    /// result overwrite an operand.
    Channelwise,
    /// Not elementwise, but the loop-kernel lowering computes it from its operands by index arithmetic, so a
    /// loop group may hold it next to other members (movement ops, reductions and the normalizations).
    Loop,
    /// The root of a library group: a tuned library call whose elementwise consumers run as its epilogue.
    LibraryRoot,
    /// Runs as its own step: a single-op kernel, a library call, a routine, or a region.
    Alone,
}

impl Op {
    /// See [`Fusibility`].
    pub fn fusibility(&self) -> Fusibility {
        use Fusibility::*;
        match self {
            Op::Unary(_) | Op::Binary(_) | Op::Cast(_) | Op::Select | Op::Gelu(_) => Elementwise,
            Op::Broadcast(_)
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Reduce(_)
            | Op::Softmax(_)
            | Op::LogSoftmax(_)
            | Op::LayerNorm(_) => Loop,
            Op::BatchNorm(_) => Channelwise,
            Op::MatMul | Op::Conv(_) => LibraryRoot,
            Op::Input(_)
            | Op::Parameter(_)
            | Op::Constant(_)
            | Op::ArgReduce(_)
            | Op::TopK(_)
            | Op::NonZero(_)
            | Op::Unique(_)
            | Op::NonMaxSuppression(_)
            | Op::GridSample(_)
            | Op::RoiAlign(_)
            | Op::MatMulInteger
            | Op::ConvInteger(_)
            | Op::DynamicQuantize
            | Op::ConvTranspose(_)
            | Op::Pool(_)
            | Op::Slice(_)
            | Op::Concat(_)
            | Op::Split(_)
            | Op::Pad(_)
            | Op::Gather(_)
            | Op::GatherElements(_)
            | Op::Scatter(_)
            | Op::Iota(_)
            | Op::ShapeOf
            | Op::Resize(_)
            | Op::Lstm(_)
            | Op::Gru(_)
            | Op::If(_)
            | Op::Loop(_)
            | Op::Fusion(_) => Alone,
        }
    }

    /// Whether the op is [`Fusibility::Elementwise`].
    pub fn is_elementwise(&self) -> bool {
        self.fusibility() == Fusibility::Elementwise
    }

    /// Whether the op is float arithmetic that computes the same in f32 on half-precision (f16/bf16) values widened
    /// to f32, rounding its results once — as the interpreter computes every such op on half types: what the
    /// `widen-half` pass rewrites. Ops that move values (reshape, gather, concat, ...), casts, integer and
    /// data-dependent ops, regions and the ops the library only takes in f32 are not. Exhaustive, so a new op must
    /// take a side.
    pub fn widens_half(&self) -> bool {
        match self {
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Reduce(_)
            | Op::ArgReduce(_)
            | Op::Softmax(_)
            | Op::LogSoftmax(_)
            | Op::LayerNorm(_)
            | Op::BatchNorm(_)
            | Op::Gelu(_)
            | Op::MatMul
            | Op::Conv(_)
            | Op::Pool(_) => true,
            Op::Input(_)
            | Op::Parameter(_)
            | Op::Constant(_)
            | Op::Cast(_)
            | Op::TopK(_)
            | Op::NonZero(_)
            | Op::Unique(_)
            | Op::NonMaxSuppression(_)
            | Op::MatMulInteger
            | Op::ConvInteger(_)
            | Op::DynamicQuantize
            | Op::ConvTranspose(_)
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Broadcast(_)
            | Op::Slice(_)
            | Op::Concat(_)
            | Op::Split(_)
            | Op::Pad(_)
            | Op::Gather(_)
            | Op::GatherElements(_)
            | Op::Scatter(_)
            | Op::Iota(_)
            | Op::ShapeOf
            | Op::Resize(_)
            | Op::GridSample(_)
            | Op::RoiAlign(_)
            | Op::Lstm(_)
            | Op::Gru(_)
            | Op::If(_)
            | Op::Loop(_)
            | Op::Fusion(_) => false,
        }
    }

    /// The op's dim-valued attributes (the target shape of `reshape`, `broadcast`, `iota` and `resize`; the `k`
    /// of `top_k`): the symbols a run binds that reach an op through its attributes, not its operands.
    pub fn dim_attrs(&self) -> Vec<&Dim> {
        match self {
            Op::TopK(t) => vec![&t.k],
            op => op.shape_attr().map_or_else(Vec::new, |s| s.0.iter().collect()),
        }
    }

    /// The shape attribute of the ops that take their result shape as one (`reshape`, `broadcast`, `iota`,
    /// `resize`).
    pub fn shape_attr(&self) -> Option<&Shape> {
        match self {
            Op::Reshape(Reshape { shape })
            | Op::Broadcast(Broadcast { shape })
            | Op::Iota(Iota { shape, .. })
            | Op::Resize(Resize { shape, .. }) => Some(shape),
            _ => None,
        }
    }

    fn shape_attr_mut(&mut self) -> Option<&mut Shape> {
        match self {
            Op::Reshape(Reshape { shape })
            | Op::Broadcast(Broadcast { shape })
            | Op::Iota(Iota { shape, .. })
            | Op::Resize(Resize { shape, .. }) => Some(shape),
            _ => None,
        }
    }

    fn dim_attrs_mut(&mut self) -> Vec<&mut Dim> {
        match self {
            Op::TopK(t) => vec![&mut t.k],
            op => op.shape_attr_mut().map_or_else(Vec::new, |s| s.0.iter_mut().collect()),
        }
    }

    /// The op with the symbols `bindings` binds substituted into its [`Op::dim_attrs`] (derived dims evaluated
    /// once their symbols are bound), or `None` when that changes nothing. Regions are left alone: their bodies
    /// are graphs of their own.
    pub fn substitute_dims(&self, bindings: &std::collections::BTreeMap<String, u64>) -> Option<Op> {
        if self.dim_attrs().iter().all(|d| d.substitute(bindings) == **d) {
            return None;
        }
        let mut op = self.clone();
        for d in op.dim_attrs_mut() {
            *d = d.substitute(bindings);
        }
        Some(op)
    }

    /// The op with each unbound dim of its [`Op::dim_attrs`] replaced by the extent its results show (`dims` of
    /// its first result, as a run found them), or `None` when nothing is symbolic. Lets a step run an op typed on
    /// symbols once its results are sized.
    pub fn with_result_dims(&self, dims: &[u64]) -> Option<Op> {
        if self.dim_attrs().iter().all(|d| d.as_static().is_some()) {
            return None;
        }
        let mut op = self.clone();
        if let Op::TopK(t) = &mut op {
            let axis = crate::types::normalize_axis(t.axis, dims.len()).ok()?;
            t.k = Dim::Static(*dims.get(axis)?);
        } else {
            *op.shape_attr_mut()? = Shape::of(dims);
        }
        Some(op)
    }

    /// True for ops with no operands whose value is known without inputs (constants, iota).
    pub fn is_source(&self) -> bool {
        matches!(self, Op::Input(_) | Op::Parameter(_) | Op::Constant(_) | Op::Iota(_))
    }

    /// The nested regions the op carries (a fusion body, the branches of an `if`, a loop body), in attribute
    /// order.
    pub fn bodies(&self) -> Vec<&FusionBody> {
        match self {
            Op::Fusion(f) => vec![&f.body],
            Op::If(i) => vec![&i.then_branch, &i.else_branch],
            Op::Loop(l) => vec![&l.body],
            _ => Vec::new(),
        }
    }

    /// Mutable access to [`Op::bodies`].
    pub fn bodies_mut(&mut self) -> Vec<&mut FusionBody> {
        match self {
            Op::Fusion(f) => vec![&mut f.body],
            Op::If(i) => vec![&mut i.then_branch, &mut i.else_branch],
            Op::Loop(l) => vec![&mut l.body],
            _ => Vec::new(),
        }
    }

    /// The op's attributes as `.kir` text (empty when it has none).
    pub fn attrs_text(&self) -> String {
        let mut s = String::new();
        self.print_attrs(&mut s);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attributes added with defaults keep old text and JSON valid and unchanged: a resize without the filter
    /// fields reads back with the defaults, and writes back without them; a non-default value round-trips in
    /// both forms.
    #[test]
    fn defaulted_attributes_keep_old_forms_unchanged() {
        let old = Resize::new(ResizeMode::Linear, CoordMode::HalfPixel, NearestMode::Floor, Shape::of(&[4]), vec![2.0]);
        let json = serde_json::to_string(&old).unwrap();
        assert!(!json.contains("cubic_a") && !json.contains("roi") && !json.contains("antialias"), "{json}");
        // What kiln wrote before the fields existed is exactly this.
        let read: Resize = serde_json::from_str(&json).unwrap();
        assert_eq!(read, old);
        let text = Op::Resize(old.clone()).attrs_text();
        assert!(!text.contains("cubic_a") && !text.contains("extrapolation"), "{text}");
        let custom = Resize { cubic_a: -0.5, extrapolation: f64::NAN, roi: vec![0.1, 0.9], ..old };
        let back: Resize = serde_json::from_str(&serde_json::to_string(&custom).unwrap()).unwrap();
        assert_eq!((back.cubic_a, back.roi.clone()), (-0.5, vec![0.1, 0.9]));
        assert!(back.extrapolation.is_nan());
    }
}
