//! ONNX `Attention` (opsets 23–25) composed from IR primitives, following ONNX's reference implementation step
//! by step: 3-d inputs split into heads, `√scale` applied to both Q and K, the KV cache (`past_*` concatenated
//! into `present_*`), grouped-query heads repeated, softcap before the additive bias, a softmax that maps
//! all-`-inf` rows to zeros, and the fully-masked-row guard decided on the bias (not on the logits). The bias
//! collects the attention mask (boolean or additive, padded with masked keys up to the KV length), the
//! bottom-right-aligned causal mask, the sliding window (opset 25) and the `nonpad_kv_seqlen` padding mask; the
//! causal and window offsets are the past length, or per batch `nonpad_kv_seqlen - q_len` for an external cache.

use kiln_ir::op::{BinaryOp as B, Broadcast, Concat, Iota, Pad, PadMode, Reduce, ReduceKind, UnaryOp as U};
use kiln_ir::{DType, Dim, Op, Shape};

use super::{bin, cast, onnx_dtype, reshape, scalar_like, static_shape, transpose, un};
use crate::import::{Ctx, Val};
use crate::node::OnnxNode;

/// What the optional `qk_matmul_output` result holds (`qk_matmul_output_mode`).
#[derive(Copy, Clone, PartialEq)]
enum QkOutput {
    /// 0: the scaled `Q·Kᵀ`.
    Raw,
    /// 1: after the softcap, before the bias.
    Softcapped,
    /// 2: after the softcap and the bias.
    WithBias,
    /// 3: the (guarded) softmax.
    Softmax,
}

/// The node's attributes, validated.
struct Config {
    causal: bool,
    q_heads: Option<u64>,
    kv_heads: Option<u64>,
    scale: Option<f64>,
    softcap: f64,
    qk_output: QkOutput,
    softmax_dtype: Option<DType>,
    /// `(left, right)` window sizes; -1 leaves a side unbounded.
    window: (i64, i64),
}

impl Config {
    fn read(n: &OnnxNode<'_>) -> Result<Config, String> {
        let qk_output = match n.int("qk_matmul_output_mode", 0) {
            0 => QkOutput::Raw,
            1 => QkOutput::Softcapped,
            2 => QkOutput::WithBias,
            3 => QkOutput::Softmax,
            m => return Err(format!("qk_matmul_output_mode {m} is not supported (0 to 3)")),
        };
        let softmax_dtype = match n.opt_int("softmax_precision") {
            Some(code) => {
                let d = onnx_dtype(code)?;
                if !d.is_float() {
                    return Err(format!("softmax_precision {d} is not a float type"));
                }
                Some(d)
            }
            None => None,
        };
        let window =
            if n.opset >= 25 { (n.int("left_window_size", -1), n.int("right_window_size", -1)) } else { (-1, -1) };
        if window.0 < -1 || window.1 < -1 {
            return Err(format!("window sizes {window:?} must be -1 or non-negative"));
        }
        let heads = |name: &str| -> Result<Option<u64>, String> {
            match n.opt_int(name) {
                Some(h) if h >= 1 => Ok(Some(h as u64)),
                Some(h) => Err(format!("{name}={h} must be positive")),
                None => Ok(None),
            }
        };
        Ok(Config {
            causal: n.int("is_causal", 0) != 0,
            q_heads: heads("q_num_heads")?,
            kv_heads: heads("kv_num_heads")?,
            scale: n.opt_float("scale").map(f64::from),
            softcap: n.float("softcap", 0.0) as f64,
            qk_output,
            softmax_dtype,
            window,
        })
    }
}

pub(crate) fn attention(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let cfg = Config::read(n)?;
    let (q_in, k_in, v_in) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let (mask, past_k, past_v, nonpad) = (n.opt_input(3), n.opt_input(4), n.opt_input(5), n.opt_input(6));
    let dtype = q_in.dtype();
    if !dtype.is_float() || k_in.dtype() != dtype || v_in.dtype() != dtype {
        return Err(format!(
            "Q, K and V must share a float type, got {}, {} and {}",
            dtype,
            k_in.dtype(),
            v_in.dtype()
        ));
    }
    if past_k.is_some() != past_v.is_some() {
        return Err("past_key and past_value must be given together".into());
    }
    if nonpad.is_some() && past_k.is_some() {
        return Err("nonpad_kv_seqlen with past_key/past_value is not defined".into());
    }
    let wants = |i: usize| n.proto.output.get(i).is_some_and(|o| !o.is_empty());
    if wants(3) && cfg.qk_output == QkOutput::Raw && cfg.softcap > 0.0 {
        // The spec says mode 0 is the raw product; ONNX's reference returns it softcapped. Refuse rather than pick.
        return Err(
            "qk_matmul_output mode 0 with softcap is not supported (the spec and the reference disagree)".into()
        );
    }

    // Q [b, hq, sq, d], K [b, hkv, skv, d], V [b, hkv, skv, dv].
    let rank = q_in.rank();
    if k_in.rank() != rank || v_in.rank() != rank || (rank != 3 && rank != 4) {
        return Err(format!(
            "Q, K and V must all be 3-d or all 4-d, got ranks {rank}, {} and {}",
            k_in.rank(),
            v_in.rank()
        ));
    }
    let (q, k, v) = if rank == 3 {
        let (Some(hq), Some(hkv)) = (cfg.q_heads, cfg.kv_heads) else {
            return Err("3-d inputs need q_num_heads and kv_num_heads".into());
        };
        (split_heads(cx, q_in, hq, "Q")?, split_heads(cx, k_in, hkv, "K")?, split_heads(cx, v_in, hkv, "V")?)
    } else {
        if n.opset >= 25 && (cfg.q_heads.is_some() || cfg.kv_heads.is_some()) {
            return Err("q_num_heads and kv_num_heads must not be given for 4-d inputs".into());
        }
        let dim1 = |x: &Val| x.ty.shape.0[1].as_static();
        if cfg.q_heads.is_some_and(|h| dim1(q_in) != Some(h)) || cfg.kv_heads.is_some_and(|h| dim1(k_in) != Some(h)) {
            return Err("q_num_heads/kv_num_heads disagree with the head dims of the 4-d inputs".into());
        }
        (q_in.clone(), k_in.clone(), v_in.clone())
    };
    let qd = static_shape(&q, "Attention")?;
    let (batch, q_heads, q_len, head) = (qd[0] as u64, qd[1] as u64, qd[2] as u64, qd[3]);

    // √scale on both operands of the product, rounded to the input type first (as the reference does).
    let scale = cfg.scale.unwrap_or(1.0 / (head as f64).sqrt()).sqrt();
    let s = scalar_like(cx, &q, scale)?;
    let qs = bin(cx, B::Mul, &q, &s)?;

    let cat = |cx: &mut Ctx<'_>, past: Option<&Val>, new: &Val| match past {
        Some(p) => cx.op(Op::Concat(Concat { axis: 2 }), &[p, new]),
        None => Ok(new.clone()),
    };
    let present_k = cat(cx, past_k, &k)?;
    let present_v = cat(cx, past_v, &v)?;
    let kd = static_shape(&present_k, "Attention")?;
    let (kv_heads, kv_len) = (kd[1] as u64, kd[2] as u64);
    let past_len = past_k.map(|p| static_shape(p, "Attention")).transpose()?.map_or(0, |d| d[2] as i64);
    if kv_len == 0 {
        return Err("an empty key sequence is not supported".into());
    }

    let bias = Bias { dtype, batch, q_len, kv_len };
    let offset = match nonpad {
        Some(lens) => Offset::PerBatch(bias.nonpad_offset(cx, lens)?),
        None => Offset::Fixed(past_len),
    };
    let mut attn_bias = match mask {
        Some(m) => Some(bias.mask(cx, m)?),
        None => None,
    };
    if cfg.causal {
        let causal = bias.frontier(cx, &offset, Some(0), None)?;
        attn_bias = Some(bias.add(cx, attn_bias, causal)?);
    }
    let (left, right) = cfg.window;
    if left >= 0 || right >= 0 {
        let window = bias.frontier(cx, &offset, (right >= 0).then_some(right), (left >= 0).then_some(left))?;
        attn_bias = Some(bias.add(cx, attn_bias, window)?);
    }
    if let Some(lens) = nonpad {
        let padding = bias.padding(cx, lens)?;
        attn_bias = Some(bias.add(cx, attn_bias, padding)?);
    }

    // Grouped-query attention: each KV head serves q_heads / kv_heads consecutive query heads.
    let (k_rep, v_rep) = if q_heads != kv_heads {
        if !q_heads.is_multiple_of(kv_heads) {
            return Err(format!("{q_heads} query heads do not divide into {kv_heads} key/value heads"));
        }
        (repeat_heads(cx, &present_k, q_heads / kv_heads)?, repeat_heads(cx, &present_v, q_heads / kv_heads)?)
    } else {
        (present_k.clone(), present_v.clone())
    };

    let ks = bin(cx, B::Mul, &k_rep, &s)?;
    let kt = transpose(cx, &ks, vec![0, 1, 3, 2])?;
    let qk = cx.op(Op::MatMul, &[&qs, &kt])?;
    let capped = if cfg.softcap > 0.0 {
        let c = scalar_like(cx, &qk, cfg.softcap)?;
        let t = bin(cx, B::Div, &qk, &c)?;
        let t = un(cx, U::Tanh, &t)?;
        bin(cx, B::Mul, &t, &c)?
    } else {
        qk.clone()
    };
    let logits = match &attn_bias {
        Some(b) => bin(cx, B::Add, &capped, b)?,
        None => capped.clone(),
    };
    let work = cfg.softmax_dtype.unwrap_or(dtype);
    let logits_work = cast(cx, &logits, work)?;
    let probs = masked_softmax(cx, &logits_work)?;
    // A row whose bias masks every key attends nothing: zero probabilities, whatever the logits hold.
    let probs = match &attn_bias {
        Some(b) => {
            let row_max = cx.op(Op::Reduce(Reduce { kind: ReduceKind::Max, axes: vec![-1], keep_dims: true }), &[b])?;
            let ninf = scalar_like(cx, b, f64::NEG_INFINITY)?;
            let all_masked = bin(cx, B::Eq, &row_max, &ninf)?;
            let zero = scalar_like(cx, &probs, 0.0)?;
            cx.op(Op::Select, &[&all_masked, &zero, &probs])?
        }
        None => probs,
    };
    let probs = cast(cx, &probs, dtype)?;
    let y = cx.op(Op::MatMul, &[&probs, &v_rep])?;
    let y = if rank == 3 {
        let yd = static_shape(&y, "Attention")?;
        let y = transpose(cx, &y, vec![0, 2, 1, 3])?;
        reshape(cx, &y, vec![Dim::Static(batch), Dim::Static(q_len), Dim::Static(q_heads * yd[3] as u64)])?
    } else {
        y
    };

    let mut outs = vec![y, present_k, present_v];
    if wants(3) {
        outs.push(match cfg.qk_output {
            QkOutput::Raw => qk,
            QkOutput::Softcapped => capped,
            QkOutput::WithBias => cast(cx, &logits, dtype)?,
            QkOutput::Softmax => probs,
        });
    }
    Ok(outs)
}

/// `[b, s, h·d]` → `[b, h, s, d]`.
fn split_heads(cx: &mut Ctx<'_>, x: &Val, heads: u64, what: &str) -> Result<Val, String> {
    let d = static_shape(x, "Attention")?;
    let hidden = d[2] as u64;
    if !hidden.is_multiple_of(heads) {
        return Err(format!("{what}'s hidden size {hidden} does not divide into {heads} heads"));
    }
    let dims = [d[0] as u64, d[1] as u64, heads, hidden / heads].map(Dim::Static).to_vec();
    let x = reshape(cx, x, dims)?;
    transpose(cx, &x, vec![0, 2, 1, 3])
}

/// `[b, h, s, d]` → `[b, h·reps, s, d]` with each head repeated `reps` times in place (`h0, h0, h1, h1, …`).
fn repeat_heads(cx: &mut Ctx<'_>, x: &Val, reps: u64) -> Result<Val, String> {
    let d: Vec<u64> = static_shape(x, "Attention")?.iter().map(|&v| v as u64).collect();
    let x = reshape(cx, x, [d[0], d[1], 1, d[2], d[3]].map(Dim::Static).to_vec())?;
    let x = cx.op(Op::Broadcast(Broadcast { shape: Shape::of(&[d[0], d[1], reps, d[2], d[3]]) }), &[&x])?;
    reshape(cx, &x, [d[0], d[1] * reps, d[2], d[3]].map(Dim::Static).to_vec())
}

/// Softmax over the last axis in which an all-`-inf` row gives zeros instead of NaN.
fn masked_softmax(cx: &mut Ctx<'_>, x: &Val) -> Result<Val, String> {
    let max = cx.op(Op::Reduce(Reduce { kind: ReduceKind::Max, axes: vec![-1], keep_dims: true }), &[x])?;
    let ninf = scalar_like(cx, x, f64::NEG_INFINITY)?;
    let zero = scalar_like(cx, x, 0.0)?;
    let one = scalar_like(cx, x, 1.0)?;
    let empty_row = bin(cx, B::Eq, &max, &ninf)?;
    let safe_max = cx.op(Op::Select, &[&empty_row, &zero, &max])?;
    let shifted = bin(cx, B::Sub, x, &safe_max)?;
    let e = un(cx, U::Exp, &shifted)?;
    let sum = cx.op(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: vec![-1], keep_dims: true }), &[&e])?;
    let no_mass = bin(cx, B::Eq, &sum, &zero)?;
    let sum = cx.op(Op::Select, &[&no_mass, &one, &sum])?;
    bin(cx, B::Div, &e, &sum)
}

/// Where the causal frontier and the window sit: query `i` is at absolute position `i + offset`.
enum Offset {
    /// The past length (0 without a cache).
    Fixed(i64),
    /// Per batch, `nonpad_kv_seqlen - q_len`, shaped `[b, 1, 1]`.
    PerBatch(Val),
}

/// Builds the additive attention bias: 0 where a key may be attended, `-inf` where not.
struct Bias {
    dtype: DType,
    batch: u64,
    q_len: u64,
    kv_len: u64,
}

impl Bias {
    /// The attention mask as an additive bias, its key axis padded with masked keys up to the KV length.
    fn mask(&self, cx: &mut Ctx<'_>, m: &Val) -> Result<Val, String> {
        if m.rank() == 0 {
            return Err("attn_mask must have rank 1 or more".into());
        }
        if m.dtype() != DType::Bool && m.dtype() != self.dtype {
            return Err(format!("an additive attn_mask of {} with {} inputs is not supported", m.dtype(), self.dtype));
        }
        let md = static_shape(m, "Attention")?;
        let last = md[md.len() - 1] as u64;
        let m = if last < self.kv_len {
            let r = m.rank();
            let mut pads = vec![0i64; 2 * r];
            pads[2 * r - 1] = (self.kv_len - last) as i64;
            // Bool pads with false (masked); an additive mask with -inf.
            let value = if m.dtype() == DType::Bool { 0.0 } else { f64::NEG_INFINITY };
            cx.op(Op::Pad(Pad { mode: PadMode::Constant, pads, value }), &[m])?
        } else {
            m.clone()
        };
        let m = if m.dtype() == DType::Bool { self.allowed_to_bias(cx, &m)? } else { m };
        // The reference starts from a zero [q, kv] bias, so the mask broadcasts against it.
        let zeros = self.zeros(cx)?;
        bin(cx, B::Add, &zeros, &m)
    }

    fn zeros(&self, cx: &mut Ctx<'_>) -> Result<Val, String> {
        let z = cx.scalar(self.dtype, 0.0)?;
        cx.op(Op::Broadcast(Broadcast { shape: Shape::of(&[self.q_len, self.kv_len]) }), &[&z])
    }

    /// 0 where `allowed`, `-inf` elsewhere.
    fn allowed_to_bias(&self, cx: &mut Ctx<'_>, allowed: &Val) -> Result<Val, String> {
        let zero = cx.scalar(self.dtype, 0.0)?;
        let ninf = cx.scalar(self.dtype, f64::NEG_INFINITY)?;
        cx.op(Op::Select, &[allowed, &zero, &ninf])
    }

    fn add(&self, cx: &mut Ctx<'_>, acc: Option<Val>, b: Val) -> Result<Val, String> {
        match acc {
            Some(a) => bin(cx, B::Add, &a, &b),
            None => {
                let zeros = self.zeros(cx)?;
                bin(cx, B::Add, &zeros, &b)
            }
        }
    }

    /// `nonpad_kv_seqlen - q_len` per batch, shaped `[b, 1, 1]` (i64).
    fn nonpad_offset(&self, cx: &mut Ctx<'_>, lens: &Val) -> Result<Val, String> {
        let lens = self.lens(cx, lens)?;
        let q = cx.scalar(DType::I64, self.q_len as f64)?;
        let off = bin(cx, B::Sub, &lens, &q)?;
        reshape(cx, &off, vec![Dim::Static(self.batch), Dim::Static(1), Dim::Static(1)])
    }

    fn lens(&self, cx: &mut Ctx<'_>, lens: &Val) -> Result<Val, String> {
        if !matches!(lens.dtype(), DType::I32 | DType::I64) || lens.ty.shape != Shape::of(&[self.batch]) {
            return Err(format!("nonpad_kv_seqlen must be an integer [{}] vector, got {}", self.batch, lens.ty));
        }
        cast(cx, lens, DType::I64)
    }

    /// The bias allowing key `j` for query `i` iff `-left ≤ j - (i + offset) ≤ right` (a `None` side is open):
    /// `right = 0, left = None` is the causal mask. `[q, kv]`, or `[b, 1, q, kv]` for per-batch offsets.
    fn frontier(
        &self,
        cx: &mut Ctx<'_>,
        offset: &Offset,
        right: Option<i64>,
        left: Option<i64>,
    ) -> Result<Val, String> {
        let grid = Shape::of(&[self.q_len, self.kv_len]);
        let iota =
            |axis: i64, start: f64| Op::Iota(Iota { dtype: DType::I64, shape: grid.clone(), axis, start, step: 1.0 });
        let j = cx.op(iota(1, 0.0), &[])?;
        // pos = i + offset: the query's absolute position.
        let pos = match offset {
            Offset::Fixed(o) => cx.op(iota(0, *o as f64), &[])?,
            Offset::PerBatch(o) => {
                let i = cx.op(iota(0, 0.0), &[])?;
                bin(cx, B::Add, &i, o)?
            }
        };
        let diff = bin(cx, B::Sub, &j, &pos)?;
        let mut allowed: Option<Val> = None;
        for (bound, upper) in [(right, true), (left, false)] {
            let Some(w) = bound else { continue };
            let limit = cx.scalar(DType::I64, if upper { w as f64 } else { -(w as f64) })?;
            let ok = bin(cx, if upper { B::Le } else { B::Ge }, &diff, &limit)?;
            allowed = Some(match allowed {
                Some(a) => bin(cx, B::And, &a, &ok)?,
                None => ok,
            });
        }
        let allowed = allowed.ok_or("internal: a frontier needs a bound")?;
        let b = self.allowed_to_bias(cx, &allowed)?;
        match offset {
            Offset::Fixed(_) => Ok(b),
            Offset::PerBatch(_) => reshape(cx, &b, [self.batch, 1, self.q_len, self.kv_len].map(Dim::Static).to_vec()),
        }
    }

    /// Keys at or past `nonpad_kv_seqlen[b]` masked, `[b, 1, 1, kv]`.
    fn padding(&self, cx: &mut Ctx<'_>, lens: &Val) -> Result<Val, String> {
        let lens = self.lens(cx, lens)?;
        let lens = reshape(cx, &lens, vec![Dim::Static(self.batch), Dim::Static(1)])?;
        let j = cx.op(
            Op::Iota(Iota { dtype: DType::I64, shape: Shape::of(&[1, self.kv_len]), axis: 1, start: 0.0, step: 1.0 }),
            &[],
        )?;
        let inside = bin(cx, B::Lt, &j, &lens)?;
        let b = self.allowed_to_bias(cx, &inside)?;
        reshape(cx, &b, [self.batch, 1, 1, self.kv_len].map(Dim::Static).to_vec())
    }
}
