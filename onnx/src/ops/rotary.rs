//! ONNX `RotaryEmbedding` (opset 23) composed from IR primitives: the first `rotary_embedding_dim` features of
//! each head are rotated pairwise by the cached angles (`cos`, `sin` picked by `position_ids`, or given per
//! batch and position), as halves or as interleaved even/odd pairs; the remaining features pass through.

use kiln_ir::op::{BinaryOp as B, Concat, Gather, Slice};
use kiln_ir::{Dim, Op};

use super::{bin, reshape, static_shape, transpose};
use crate::import::{Ctx, Val};
use crate::node::OnnxNode;

/// `x[..., start::step]` limited to `end` on the last of 4 axes.
fn last_axis(cx: &mut Ctx<'_>, x: &Val, start: i64, end: i64, step: i64) -> Result<Val, String> {
    cx.op(Op::Slice(Slice { starts: vec![start], ends: vec![end], axes: vec![3], steps: vec![step] }), &[x])
}

fn concat_last(cx: &mut Ctx<'_>, a: &Val, b: &Val) -> Result<Val, String> {
    cx.op(Op::Concat(Concat { axis: -1 }), &[a, b])
}

pub(crate) fn rotary_embedding(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let (x, cos, sin) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let interleaved = n.int("interleaved", 0) != 0;
    let d = static_shape(x, "RotaryEmbedding")?;
    // Work in [batch, seq, heads, head_size].
    let xs = match d.len() {
        4 => {
            if n.opt_int("num_heads").is_some_and(|h| h as usize != d[1]) {
                return Err(format!("num_heads disagrees with the input's head dim {}", d[1]));
            }
            transpose(cx, x, vec![0, 2, 1, 3])?
        }
        3 => {
            let heads = n.opt_int("num_heads").ok_or("3-d input needs num_heads")?;
            if heads < 1 || d[2] % heads as usize != 0 {
                return Err(format!("hidden size {} does not divide into num_heads={heads}", d[2]));
            }
            let dims = [d[0], d[1], heads as usize, d[2] / heads as usize].map(|v| Dim::Static(v as u64)).to_vec();
            reshape(cx, x, dims)?
        }
        r => return Err(format!("needs a 3-d or 4-d input, got rank {r}")),
    };
    let wd = static_shape(&xs, "RotaryEmbedding")?;
    let head = wd[3] as i64;
    let rot = match n.int("rotary_embedding_dim", 0) {
        0 => head,
        r if r > 0 && r <= head && r % 2 == 0 => r,
        r => return Err(format!("rotary_embedding_dim={r} must be even and at most the head size {head}")),
    };
    let half = rot / 2;

    // cos/sin: [batch, seq, half] → [batch, seq, 1, half].
    let pick = |cx: &mut Ctx<'_>, cache: &Val| -> Result<Val, String> {
        let c = match n.opt_input(3) {
            Some(pos) => cx.op(Op::Gather(Gather { axis: 0 }), &[cache, pos])?,
            None => cache.clone(),
        };
        let cd = static_shape(&c, "RotaryEmbedding")?;
        if cd != [wd[0], wd[1], half as usize] {
            return Err(format!("the cos/sin caches give {cd:?}; [{}, {}, {half}] is needed", wd[0], wd[1]));
        }
        reshape(cx, &c, [wd[0], wd[1], 1, half as usize].map(|v| Dim::Static(v as u64)).to_vec())
    };
    let cos = pick(cx, cos)?;
    let sin = pick(cx, sin)?;

    let rotate = last_axis(cx, &xs, 0, rot, 1)?;
    let (x1, x2) = if interleaved {
        (last_axis(cx, &rotate, 0, rot, 2)?, last_axis(cx, &rotate, 1, rot, 2)?)
    } else {
        (last_axis(cx, &rotate, 0, half, 1)?, last_axis(cx, &rotate, half, rot, 1)?)
    };
    let (c1, s2) = (bin(cx, B::Mul, &cos, &x1)?, bin(cx, B::Mul, &sin, &x2)?);
    let real = bin(cx, B::Sub, &c1, &s2)?;
    let (s1, c2) = (bin(cx, B::Mul, &sin, &x1)?, bin(cx, B::Mul, &cos, &x2)?);
    let imag = bin(cx, B::Add, &s1, &c2)?;
    let rotated = if interleaved {
        // Pairs back in place: [..., half, 2] → [..., rot].
        let pair = |v: usize| [wd[0], wd[1], wd[2], half as usize, v].map(|v| Dim::Static(v as u64)).to_vec();
        let re = reshape(cx, &real, pair(1))?;
        let im = reshape(cx, &imag, pair(1))?;
        let both = concat_last(cx, &re, &im)?;
        reshape(cx, &both, [wd[0], wd[1], wd[2], rot as usize].map(|v| Dim::Static(v as u64)).to_vec())?
    } else {
        concat_last(cx, &real, &imag)?
    };
    let y = if rot < head {
        let rest = last_axis(cx, &xs, rot, head, 1)?;
        concat_last(cx, &rotated, &rest)?
    } else {
        rotated
    };
    let y = if d.len() == 4 { transpose(cx, &y, vec![0, 2, 1, 3])? } else { reshape(cx, &y, x.ty.shape.0.clone())? };
    Ok(vec![y])
}
