//! ONNX `RNN` (the simple recurrent layer) unrolled over its static sequence into IR matmuls:
//! `H_t = f(clip(X_t·Wᵀ + H_{t-1}·Rᵀ + (Wb + Rb)))` per direction, in ONNX's order of additions, with the
//! reverse direction walking the sequence backwards. Layout 1 (batch first) is transposed in and out.

use kiln_ir::op::{BinaryOp as B, Concat, RnnDirection, Slice, UnaryOp as U};
use kiln_ir::{Dim, Op, Tensor};

use super::{bin, reshape, scalar_like, static_shape, transpose, un};
use crate::import::{Ctx, Val};
use crate::node::OnnxNode;

/// `x[i]` along axis 0, with that axis dropped.
fn index0(cx: &mut Ctx<'_>, x: &Val, i: usize) -> Result<Val, String> {
    let s = Slice { starts: vec![i as i64], ends: vec![i as i64 + 1], axes: vec![0], steps: vec![1] };
    let v = cx.op(Op::Slice(s), &[x])?;
    reshape(cx, &v, x.ty.shape.0[1..].to_vec())
}

fn concat(cx: &mut Ctx<'_>, parts: &[Val], axis: i64) -> Result<Val, String> {
    let refs: Vec<&Val> = parts.iter().collect();
    cx.op(Op::Concat(Concat { axis }), &refs)
}

/// The activation `f`, by its ONNX name.
#[derive(Copy, Clone)]
enum Activation {
    Tanh,
    Relu,
    Sigmoid,
}

impl Activation {
    fn parse(name: &str) -> Result<Activation, String> {
        match name {
            "Tanh" => Ok(Activation::Tanh),
            "Relu" => Ok(Activation::Relu),
            "Sigmoid" => Ok(Activation::Sigmoid),
            other => Err(format!("activation `{other}` is not supported (Tanh, Relu, Sigmoid)")),
        }
    }

    fn apply(self, cx: &mut Ctx<'_>, x: &Val) -> Result<Val, String> {
        let kind = match self {
            Activation::Tanh => U::Tanh,
            Activation::Relu => U::Relu,
            Activation::Sigmoid => U::Sigmoid,
        };
        un(cx, kind, x)
    }
}

pub(crate) fn rnn(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, w, r) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let hidden = n.opt_int("hidden_size").ok_or("`hidden_size` is required")?;
    let direction = match n.string("direction").as_deref().unwrap_or("forward") {
        "forward" => RnnDirection::Forward,
        "reverse" => RnnDirection::Reverse,
        "bidirectional" => RnnDirection::Bidirectional,
        other => return Err(format!("direction `{other}` is not supported")),
    };
    let dirs = if direction == RnnDirection::Bidirectional { 2 } else { 1 };
    let batch_first = match n.int("layout", 0) {
        0 => false,
        1 => true,
        l => return Err(format!("layout={l} is not supported")),
    };
    let acts = match n.strings("activations") {
        Some(names) if names.len() == dirs => names.iter().map(|a| Activation::parse(a)).collect::<Result<_, _>>()?,
        Some(names) => return Err(format!("{} activations for {dirs} direction(s)", names.len())),
        None => vec![Activation::Tanh; dirs],
    };
    if n.floats("activation_alpha").is_some() || n.floats("activation_beta").is_some() {
        return Err("activation_alpha/activation_beta are not supported (no supported activation takes them)".into());
    }
    let clip = n.opt_float("clip").map(f64::from);

    let x = if batch_first { transpose(cx, x, vec![1, 0, 2])? } else { x.clone() };
    let xd = static_shape(&x, "RNN")?;
    let (seq, batch) = (xd[0], xd[1] as u64);
    if hidden < 1 || static_shape(w, "RNN")? != [dirs, hidden as usize, xd[2]] {
        return Err(format!("W must be [{dirs}, {hidden}, {}], got {}", xd[2], w.ty.shape));
    }
    if static_shape(r, "RNN")? != [dirs, hidden as usize, hidden as usize] {
        return Err(format!("R must be [{dirs}, {hidden}, {hidden}], got {}", r.ty.shape));
    }
    let h = hidden as u64;
    if let Some(lens) = n.opt_input(4) {
        let known = lens.ints().ok_or("sequence_lens must be known at import time")?;
        if known.iter().any(|&l| l != seq as i64) {
            return Err("sequence_lens shorter than the sequence is not supported".into());
        }
    }
    let zeros = |cx: &mut Ctx<'_>, dims: &[u64]| {
        cx.constant(Tensor::zeros(x.dtype(), dims.iter().map(|&d| d as usize).collect()))
    };
    let b = match n.opt_input(3) {
        Some(b) => b.clone(),
        None => zeros(cx, &[dirs as u64, 2 * h])?,
    };
    let h0 = match n.opt_input(5) {
        Some(v) if batch_first => transpose(cx, v, vec![1, 0, 2])?,
        Some(v) => v.clone(),
        None => zeros(cx, &[dirs as u64, batch, h])?,
    };

    if static_shape(&b, "RNN")? != [dirs, 2 * h as usize] {
        return Err(format!("B must be [{dirs}, {}], got {}", 2 * h, b.ty.shape));
    }
    if static_shape(&h0, "RNN")? != [dirs, batch as usize, h as usize] {
        return Err(format!("initial_h must hold [{dirs}, {batch}, {h}] states, got {}", h0.ty.shape));
    }
    if seq == 0 {
        return Err("an empty sequence is not supported".into());
    }
    let mut ys = Vec::with_capacity(dirs);
    let mut finals = Vec::with_capacity(dirs);
    for (d, act) in acts.into_iter().enumerate() {
        let wd = index0(cx, w, d)?;
        let wt = transpose(cx, &wd, vec![1, 0])?;
        let rd = index0(cx, r, d)?;
        let rt = transpose(cx, &rd, vec![1, 0])?;
        let bd = index0(cx, &b, d)?;
        let wb =
            cx.op(Op::Slice(Slice { starts: vec![0], ends: vec![h as i64], axes: vec![0], steps: vec![1] }), &[&bd])?;
        let rb = cx.op(
            Op::Slice(Slice { starts: vec![h as i64], ends: vec![2 * h as i64], axes: vec![0], steps: vec![1] }),
            &[&bd],
        )?;
        let bias = bin(cx, B::Add, &wb, &rb)?;
        // X·Wᵀ for every step at once: [seq, batch, hidden].
        let xw = cx.op(Op::MatMul, &[&x, &wt])?;
        let mut state = index0(cx, &h0, d)?;
        let backwards = direction == RnnDirection::Reverse || d == 1;
        let mut steps = vec![None; seq];
        for t in 0..seq {
            let t = if backwards { seq - 1 - t } else { t };
            let xt = index0(cx, &xw, t)?;
            let hr = cx.op(Op::MatMul, &[&state, &rt])?;
            let pre = bin(cx, B::Add, &xt, &hr)?;
            let mut pre = bin(cx, B::Add, &pre, &bias)?;
            if let Some(c) = clip {
                let hi = scalar_like(cx, &pre, c)?;
                let lo = scalar_like(cx, &pre, -c)?;
                pre = bin(cx, B::Min, &pre, &hi)?;
                pre = bin(cx, B::Max, &pre, &lo)?;
            }
            state = act.apply(cx, &pre)?;
            steps[t] =
                Some(reshape(cx, &state, vec![Dim::Static(1), Dim::Static(1), Dim::Static(batch), Dim::Static(h)])?);
        }
        let steps: Vec<Val> = steps.into_iter().collect::<Option<_>>().ok_or("internal: a step was not computed")?;
        ys.push(concat(cx, &steps, 0)?);
        finals.push(reshape(cx, &state, vec![Dim::Static(1), Dim::Static(batch), Dim::Static(h)])?);
    }
    let y = concat(cx, &ys, 1)?;
    let y_h = concat(cx, &finals, 0)?;
    if batch_first {
        Ok(vec![transpose(cx, &y, vec![2, 0, 1, 3])?, transpose(cx, &y_h, vec![1, 0, 2])?])
    } else {
        Ok(vec![y, y_h])
    }
}
