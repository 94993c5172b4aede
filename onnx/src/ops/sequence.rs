//! Sequences and optionals, resolved at import time.
//!
//! A compiled kiln model computes tensors. The sequence ops of real exports — `SplitToSequence` feeding
//! `SequenceAt`s, a list built with `SequenceConstruct`/`SequenceInsert` and joined by `ConcatFromSequence`,
//! `SequenceMap` over a list, `Optional` around a tensor — almost always have a structure fixed by the graph:
//! the length of every sequence and every position are known when the model is imported. Such a sequence is
//! a list of tensor values here (as compilers that take ONNX sequences do), and each op becomes what it selects
//! or builds: `SequenceAt` is the element, `ConcatFromSequence` one `concat`, `SplitToSequence` one `split`,
//! `SequenceMap` its body once per element, `SequenceLength` and `OptionalHasElement` constants. Nothing
//! sequence-shaped is left in the IR.
//!
//! What depends on run-time data is a clear error naming the node: a position computed from an input, a split
//! of a symbolic extent, a sequence or optional as a graph input or output, or carried through `If`/`Loop`.
//!
//! Elements are tensor values named in the importer's scopes (an element a node of the graph computed keeps
//! its ONNX name; one this module makes gets a name no ONNX value can have), so a sequence built outside a
//! loop body and read inside it captures its elements as any outer value.

use kiln_ir::op::{Concat, Split};
use kiln_ir::{DType, Dim, Op, Tensor};

use crate::import::{Composite, Ctx, Val};
use crate::node::OnnxNode;

/// The sequence and optional op types this module imports (the importer sends them here instead of to the op
/// table's tensor handlers).
pub(crate) const OPS: &[&str] = &[
    "ConcatFromSequence",
    "Optional",
    "OptionalGetElement",
    "OptionalHasElement",
    "SequenceAt",
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceErase",
    "SequenceInsert",
    "SequenceLength",
    "SequenceMap",
    "SplitToSequence",
];

/// Whether the default-domain op type is one of this module's.
pub(crate) fn is_sequence_op(op_type: &str) -> bool {
    OPS.contains(&op_type)
}

/// The most elements a sequence may hold, and the most body nodes a `SequenceMap` may inline in all: sequences
/// are unrolled at import, so a hostile model (a split of a million-long axis into one-element pieces) must not
/// turn into a million nodes.
const MAX_ELEMENTS: usize = 4096;
const MAX_INLINED_NODES: usize = 1 << 16;

/// An error unless a sequence of `len` elements stays within [`MAX_ELEMENTS`].
fn check_len(len: usize) -> Result<(), String> {
    if len > MAX_ELEMENTS {
        return Err(format!(
            "a sequence of {len} elements is not supported (kiln unrolls sequences at import, up to {MAX_ELEMENTS})"
        ));
    }
    Ok(())
}

/// One operand of a sequence op, resolved.
#[derive(Clone, Debug)]
pub(crate) enum Item {
    Tensor(Val),
    Seq(Vec<String>),
    Optional(Option<Box<Item>>),
}

/// A result of a sequence op: a tensor, or a sequence/optional to record under the output's name.
pub(crate) enum Produced {
    Tensor(Val),
    Composite(Composite),
}

/// The name an element this module makes gets: no ONNX value can have it (it starts with a NUL).
fn element_name(output: &str, i: usize) -> String {
    format!("\u{0}{output}[{i}]")
}

/// Imports sequence op `n` (its operands resolved into `items`, `None` for an empty name) and returns its
/// results.
pub(crate) fn import(cx: &mut Ctx<'_>, n: &OnnxNode<'_>, items: &[Option<Item>]) -> Result<Vec<Produced>, String> {
    let op = n.proto.op_type.as_str();
    let item = |i: usize| items.get(i).and_then(Option::as_ref);
    let seq = |i: usize| -> Result<&Vec<String>, String> {
        match item(i) {
            Some(Item::Seq(s)) => Ok(s),
            Some(_) => Err(format!("input {i} must be a sequence")),
            None => Err(format!("input {i} (a sequence) is required")),
        }
    };
    let tensor = |i: usize| -> Result<&Val, String> {
        match item(i) {
            Some(Item::Tensor(t)) => Ok(t),
            Some(_) => Err(format!("input {i} must be a tensor")),
            None => Err(format!("input {i} (a tensor) is required")),
        }
    };
    // A position operand: an integer scalar known at import time, in [-len, len) (or [-len, len] to insert).
    let position = |i: usize, len: usize, insert: bool| -> Result<Option<usize>, String> {
        let Some(Item::Tensor(p)) = item(i) else { return Ok(None) };
        let v = match p.ints() {
            Some(v) if v.len() == 1 && p.rank() == 0 => v[0],
            Some(_) => return Err(format!("the position (input {i}) must be a scalar")),
            None => return Err(format!("the position (input {i}) must be known at import time")),
        };
        let len = len as i64;
        let hi = if insert { len } else { len - 1 };
        if v < -len || v > hi {
            return Err(format!("position {v} is out of range for a sequence of {len}"));
        }
        Ok(Some(if v < 0 { v + len } else { v } as usize))
    };
    let seq_of = |elems: Vec<String>| Produced::Composite(Composite::Seq(elems));
    match op {
        "SequenceEmpty" => {
            n.int("dtype", 1);
            Ok(vec![seq_of(Vec::new())])
        }
        "SequenceConstruct" => {
            let mut elems = Vec::new();
            for (i, name) in n.proto.input.iter().enumerate() {
                tensor(i)?;
                elems.push(name.clone());
            }
            Ok(vec![seq_of(elems)])
        }
        "SequenceInsert" => {
            let mut elems = seq(0)?.clone();
            tensor(1)?;
            let at = position(2, elems.len(), true)?.unwrap_or(elems.len());
            check_len(elems.len() + 1)?;
            elems.insert(at, n.proto.input[1].clone());
            Ok(vec![seq_of(elems)])
        }
        "SequenceErase" => {
            let mut elems = seq(0)?.clone();
            if elems.is_empty() {
                return Err("erasing from an empty sequence".into());
            }
            let at = position(1, elems.len(), false)?.unwrap_or(elems.len() - 1);
            elems.remove(at);
            Ok(vec![seq_of(elems)])
        }
        "SequenceAt" => {
            let elems = seq(0)?;
            if elems.is_empty() {
                return Err("SequenceAt of an empty sequence".into());
            }
            let at = position(1, elems.len(), false)?.ok_or("input 1 (the position) is required")?;
            Ok(vec![Produced::Tensor(cx.element(&elems[at])?)])
        }
        "SequenceLength" => {
            let len = seq(0)?.len() as i64;
            Ok(vec![Produced::Tensor(cx.constant(Tensor::scalar(len))?)])
        }
        "SplitToSequence" => split_to_sequence(cx, n, tensor(0)?, item(1)),
        "ConcatFromSequence" => {
            let elems = seq(0)?;
            if elems.is_empty() {
                return Err("ConcatFromSequence of an empty sequence".into());
            }
            let axis = n.opt_int("axis").ok_or("the `axis` attribute is required")?;
            let new_axis = n.int("new_axis", 0) != 0;
            let vals: Vec<Val> = elems.iter().map(|e| cx.element(e)).collect::<Result<_, _>>()?;
            let rank = vals[0].rank();
            let out_rank = rank + usize::from(new_axis);
            let a = super::axis(axis, out_rank)?;
            let parts: Vec<Val> = if new_axis {
                vals.iter()
                    .map(|v| {
                        let mut dims = v.ty.shape.0.clone();
                        dims.insert(a.min(dims.len()), Dim::Static(1));
                        super::reshape(cx, v, dims)
                    })
                    .collect::<Result<_, _>>()?
            } else {
                vals
            };
            let refs: Vec<&Val> = parts.iter().collect();
            let out =
                if refs.len() == 1 { parts[0].clone() } else { cx.op(Op::Concat(Concat { axis: a as i64 }), &refs)? };
            Ok(vec![Produced::Tensor(out)])
        }
        "SequenceMap" => sequence_map(cx, n, items),
        "Optional" => {
            // The `type` attribute only types an empty optional.
            n.ignore(&["type"]);
            Ok(vec![Produced::Composite(Composite::Optional(n.proto.input.first().filter(|s| !s.is_empty()).cloned()))])
        }
        "OptionalHasElement" => {
            let has = match item(0) {
                None => false,
                Some(Item::Optional(o)) => o.is_some(),
                Some(_) => true,
            };
            Ok(vec![Produced::Tensor(cx.constant(Tensor::scalar(has))?)])
        }
        "OptionalGetElement" => match item(0) {
            Some(Item::Tensor(t)) => Ok(vec![Produced::Tensor(t.clone())]),
            Some(Item::Seq(s)) => Ok(vec![seq_of(s.clone())]),
            Some(Item::Optional(Some(inner))) => match inner.as_ref() {
                Item::Tensor(t) => Ok(vec![Produced::Tensor(t.clone())]),
                Item::Seq(s) => Ok(vec![seq_of(s.clone())]),
                Item::Optional(_) => Err("an optional of an optional is not supported".into()),
            },
            Some(Item::Optional(None)) => Err("the optional is empty (it holds no element to get)".into()),
            None => Err("input 0 is required".into()),
        },
        other => Err(format!("`{other}` is not a sequence op")),
    }
}

/// `SplitToSequence(x[, split])`: pieces of `x` along `axis` — of the sizes `split` lists, of `split` each
/// (the last smaller), or of 1 each, the axis then dropped unless `keepdims`.
fn split_to_sequence(
    cx: &mut Ctx<'_>,
    n: &OnnxNode<'_>,
    x: &Val,
    split: Option<&Item>,
) -> Result<Vec<Produced>, String> {
    let a = super::axis(n.int("axis", 0), x.rank())?;
    let extent = x.ty.shape.0.get(a).ok_or("splitting a scalar is not supported")?;
    let extent = extent.as_static().ok_or("splitting a symbolic extent into a sequence is not supported")? as i64;
    let keepdims = n.int("keepdims", 1) != 0;
    let (sizes, squeeze) = match split {
        None => {
            check_len(extent as usize)?;
            (vec![1; extent as usize], !keepdims)
        }
        Some(Item::Tensor(s)) => {
            let v = s.ints().ok_or("`split` must be known at import time")?;
            if s.dtype() != DType::I64 && s.dtype() != DType::I32 {
                return Err(format!("`split` must be an integer tensor, not {}", s.dtype()));
            }
            let sizes = if s.rank() == 0 {
                let piece = v[0];
                if piece < 1 {
                    return Err(format!("`split` {piece} must be positive"));
                }
                // `extent` is an extent (≥ 0) and `piece` ≥ 1: no overflow, however large `piece` is.
                let count = (extent as u64).div_ceil(piece as u64) as i64;
                check_len(count as usize)?;
                (0..count).map(|i| piece.min(extent - i * piece)).collect()
            } else {
                check_len(v.len())?;
                v
            };
            let total = sizes.iter().try_fold(0i64, |a, &s| if s < 0 { None } else { a.checked_add(s) });
            if total != Some(extent) {
                return Err(format!("`split` {sizes:?} does not add up to the extent {extent}"));
            }
            (sizes, false)
        }
        Some(_) => return Err("`split` must be a tensor".into()),
    };
    let pieces = if sizes.is_empty() {
        Vec::new()
    } else if sizes.len() == 1 {
        vec![x.clone()]
    } else {
        cx.op_multi(Op::Split(Split { axis: a as i64, sizes }), &[x])?
    };
    let out = n.output_name(0).to_string();
    let mut elems = Vec::with_capacity(pieces.len());
    for (i, p) in pieces.into_iter().enumerate() {
        let p = if squeeze {
            let mut dims = p.ty.shape.0.clone();
            dims.remove(a);
            super::reshape(cx, &p, dims)?
        } else {
            p
        };
        let name = element_name(&out, i);
        cx.define(&name, Some(p));
        elems.push(name);
    }
    Ok(vec![Produced::Composite(Composite::Seq(elems))])
}

/// `SequenceMap(seq, extra…)`: the body once per element of `seq`, given the element (and the same element of
/// every extra sequence, or the extra tensor itself); each body output collected into a sequence.
fn sequence_map(cx: &mut Ctx<'_>, n: &OnnxNode<'_>, items: &[Option<Item>]) -> Result<Vec<Produced>, String> {
    let body = n.graph("body").ok_or("the `body` attribute is required")?;
    let len = match items.first() {
        Some(Some(Item::Seq(s))) => s.len(),
        _ => return Err("input 0 must be a sequence".into()),
    };
    if body.input.len() != items.len() {
        return Err(format!("the body takes {} inputs, the node gives {}", body.input.len(), items.len()));
    }
    if len.saturating_mul(body.node.len().max(1)) > MAX_INLINED_NODES {
        return Err(format!(
            "mapping a body of {} nodes over {len} elements is not supported (kiln inlines it once per element, \
             up to {MAX_INLINED_NODES} nodes in all)",
            body.node.len()
        ));
    }
    let mut outputs: Vec<Vec<String>> = vec![Vec::with_capacity(len); body.output.len()];
    for i in 0..len {
        let mut args = Vec::with_capacity(items.len());
        for (k, it) in items.iter().enumerate() {
            let v = match it {
                Some(Item::Seq(s)) if s.len() == len => cx.element(&s[i])?,
                Some(Item::Seq(s)) => {
                    return Err(format!("input {k} is a sequence of {}, input 0 one of {len}", s.len()));
                }
                Some(Item::Tensor(t)) => t.clone(),
                _ => return Err(format!("input {k} must be a sequence or a tensor")),
            };
            args.push(v);
        }
        let results = cx.inline(body, args)?;
        for (j, v) in results.into_iter().enumerate() {
            let name = element_name(n.output_name(j), i);
            cx.define(&name, Some(v));
            outputs[j].push(name);
        }
    }
    Ok(outputs.into_iter().map(|elems| Produced::Composite(Composite::Seq(elems))).collect())
}
