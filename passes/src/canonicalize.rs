//! `canonicalize`: local algebraic identities that are exact for the dtype.
//!
//! Every rule either forwards a node's operand in place of its result (only when the operand's type equals the
//! result's type exactly, symbolic dims included, so a broadcasting identity operand never loses a shape) or
//! rewrites a node to a cheaper op on an earlier value (only when the type rule gives the node's declared types
//! back). Rules are exact, not approximately exact; the one caveat is that NaN payloads are not tracked (a NaN
//! stays a NaN). The rules:
//!
//! | rule | exact because |
//! | --- | --- |
//! | `x + c`, `c + x` → `x` where `c` is all `0` (integers) or all `-0.0` (floats) | `x + (-0.0) == x` for every float, `-0.0` included; `x + 0.0` is **not** an identity (`-0.0 + 0.0 == +0.0`), so it is left alone |
//! | `x - c` → `x` where `c` is all `0` (integers) or all `+0.0` (floats) | `x - 0.0 == x` for every float (`-0.0 - 0.0 == -0.0`); `x - (-0.0)` is `x + 0.0`, not an identity |
//! | `x * c`, `c * x` → `x` where `c` is all `1` | exact in every dtype (signed zeros, infinities and NaN pass through; integers do not wrap) |
//! | `x / c` → `x` where `c` is all `1` | exact in every dtype (integer division by 1 truncates nothing) |
//! | `transpose(x, identity)` → `x` | moves nothing |
//! | `transpose(transpose(x, p), q)` → `transpose(x, p∘q)` | composes the permutations (`r[i] = p[q[i]]`); becomes `x` when `r` is the identity |
//! | `reshape(x)` to `x`'s own shape → `x` | row-major order is unchanged |
//! | `reshape(reshape(x))` → `reshape(x)` | reshape keeps row-major order, so only the last shape matters |
//! | `cast(x)` to `x`'s dtype → `x` | converts nothing |
//! | `cast(cast(x: A, B), A)` → `x` when every `A` value is exactly a `B` value | i8/u8 → i32, i64, f16, bf16, f32, f64; i32 → i64, f64; f16, bf16 → f32, f64; f32 → f64; bool → anything (0/1 come back as `!= 0`) |
//! | `broadcast(x)` to `x`'s own shape → `x` | copies nothing |
//!
//! Constants are `constant` nodes only: a `param` may be swapped at run time, so `x * w` is kept even when the
//! weight happens to be all ones. Rules run to a local fixed point: each node is rewritten until no rule applies,
//! sweeping the graph in topological order until a sweep changes nothing. Nodes a rewrite leaves unused are
//! removed.

use kiln_ir::infer::infer;
use kiln_ir::op::{BinaryOp, Transpose};
use kiln_ir::types::normalize_axis;
use kiln_ir::{DType, Graph, NodeId, Op, Value};

use crate::declare_pass;
use crate::pass::{Pass, PassContext, PassError, sweep_until_stable};

declare_pass! {
    /// Applies algebraic identities that are exact for the dtype (x*1, x+(-0.0), double transpose, cast chains).
    #[derive(Clone, Debug, Default)]
    pub struct Canonicalize = "canonicalize";
}

/// Sweeps after which canonicalization stops even if rules still apply (each rule shrinks the graph or a chain,
/// so this is a guard, not a limit real graphs reach).
const MAX_SWEEPS: usize = 64;

impl Pass for Canonicalize {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, _: &PassContext) -> Result<bool, PassError> {
        // No rule adds nodes, so ids in a sweep's order are never reused; removed ones are skipped.
        sweep_until_stable(g, Self::NAME, MAX_SWEEPS, |g, id| {
            let mut any = false;
            while g.contains(id) {
                let Some(rewrite) = rewrite(g, id) else { break };
                apply(g, id, rewrite);
                any = true;
            }
            any
        })
    }
}

/// What a rule does to a node.
enum Rewrite {
    /// Uses of the node's result go to this value instead.
    Forward(Value),
    /// The node becomes `op` applied to `operand`.
    Replace { op: Op, operand: Value },
}

fn apply(g: &mut Graph, id: NodeId, rewrite: Rewrite) {
    match rewrite {
        Rewrite::Forward(v) => {
            g.replace_uses(Value::new(id, 0), v);
            remove_if_unused(g, id);
        }
        Rewrite::Replace { op, operand } => {
            let old = g.node(id).inputs[0];
            *g.node_mut(id).op = op;
            g.set_input(id, 0, operand);
            remove_if_unused(g, old.node);
        }
    }
}

/// Removes a computed node nobody uses, then its producers that this leaves unused, and so on up the chain.
/// Sources (`input`, `param`, `constant`, `iota`) are left for `dce`.
fn remove_if_unused(g: &mut Graph, id: NodeId) {
    let mut work = vec![id];
    while let Some(id) = work.pop() {
        let computed = g.get(id).is_some_and(|n| !n.op.is_source());
        if computed
            && g.users(id).is_empty()
            && !g.outputs().iter().any(|(_, v)| v.node == id)
            && let Some(node) = g.remove_node(id)
        {
            work.extend(node.inputs.iter().map(|v| v.node));
        }
    }
}

/// The first rule that applies to `id`, if any.
fn rewrite(g: &Graph, id: NodeId) -> Option<Rewrite> {
    let node = g.node(id);
    let [result] = node.outputs.as_slice() else { return None };
    // Forwarding is only sound when the forwarded value has exactly the result's type.
    let forward = |v: Value| (g.value_type(v) == Some(result)).then_some(Rewrite::Forward(v));
    let operand = |i: usize| node.inputs.get(i).copied();
    match &node.op {
        Op::Binary(kind) => {
            let (a, b) = (operand(0)?, operand(1)?);
            let dtype = result.dtype;
            let is = |v: Value, identity: Identity| constant_is(g, v, dtype, identity);
            match kind {
                BinaryOp::Add if is(b, Identity::AddZero) => forward(a),
                BinaryOp::Add if is(a, Identity::AddZero) => forward(b),
                BinaryOp::Sub if is(b, Identity::SubZero) => forward(a),
                BinaryOp::Mul if is(b, Identity::One) => forward(a),
                BinaryOp::Mul if is(a, Identity::One) => forward(b),
                BinaryOp::Div if is(b, Identity::One) => forward(a),
                _ => None,
            }
        }
        Op::Transpose(t) => {
            let x = operand(0)?;
            let rank = result.shape.rank();
            let perm = normalize_perm(&t.perm, rank)?;
            if perm.iter().enumerate().all(|(i, &p)| i == p) {
                return forward(x);
            }
            let inner = g.get(x.node)?;
            let Op::Transpose(t0) = &inner.op else { return None };
            let p0 = normalize_perm(&t0.perm, rank)?;
            let composed: Vec<i64> = perm.iter().map(|&q| p0.get(q).map(|&p| p as i64)).collect::<Option<_>>()?;
            replace(g, Op::Transpose(Transpose { perm: composed }), *inner.inputs.first()?, result)
        }
        Op::Reshape(r) => {
            let x = operand(0)?;
            if let Some(rw) = forward(x) {
                return Some(rw);
            }
            let inner = g.get(x.node)?;
            let Op::Reshape(_) = &inner.op else { return None };
            replace(g, Op::Reshape(r.clone()), *inner.inputs.first()?, result)
        }
        Op::Cast(c) => {
            let x = operand(0)?;
            if let Some(rw) = forward(x) {
                return Some(rw);
            }
            let inner = g.get(x.node)?;
            let (Op::Cast(mid), Some(&y)) = (&inner.op, inner.inputs.first()) else { return None };
            let from = g.value_type(y)?.dtype;
            if from == c.to && round_trips(from, mid.to) { forward(y) } else { None }
        }
        Op::Broadcast(_) => forward(operand(0)?),
        _ => None,
    }
}

/// `Replace` when `op` on `operand` types back to exactly `result`.
fn replace(g: &Graph, op: Op, operand: Value, result: &kiln_ir::TensorType) -> Option<Rewrite> {
    let ty = g.value_type(operand)?.clone();
    match infer(&op, &[ty]) {
        Ok(types) if types.as_slice() == std::slice::from_ref(result) => Some(Rewrite::Replace { op, operand }),
        _ => None,
    }
}

fn normalize_perm(perm: &[i64], rank: usize) -> Option<Vec<usize>> {
    if perm.len() != rank {
        return None;
    }
    perm.iter().map(|&p| normalize_axis(p, rank).ok()).collect()
}

/// The identity elements the binary rules look for.
#[derive(Clone, Copy)]
enum Identity {
    /// `0` for integers, `-0.0` for floats.
    AddZero,
    /// `0` for integers, `+0.0` for floats.
    SubZero,
    /// `1`.
    One,
}

/// Whether `v` is a `constant` of `dtype` whose every element is `identity`.
fn constant_is(g: &Graph, v: Value, dtype: DType, identity: Identity) -> bool {
    let Some(Op::Constant(c)) = g.get(v.node).map(|n| &n.op) else { return false };
    let t = &c.value;
    if t.dtype() != dtype || t.is_empty() {
        return false;
    }
    if dtype.is_float() {
        t.to_f64_vec().iter().all(|&x| match identity {
            Identity::AddZero => x == 0.0 && x.is_sign_negative(),
            Identity::SubZero => x == 0.0 && x.is_sign_positive(),
            Identity::One => x == 1.0,
        })
    } else if dtype.is_int() {
        let want = match identity {
            Identity::AddZero | Identity::SubZero => 0,
            Identity::One => 1,
        };
        t.to_i64_vec().iter().all(|&x| x == want)
    } else {
        false
    }
}

/// Whether casting every value of `from` to `to` and back gives it back exactly.
fn round_trips(from: DType, to: DType) -> bool {
    use DType::*;
    if let (Some((lo, hi)), Some((tlo, thi))) = (from.int_range(), to.int_range()) {
        return tlo <= lo && hi <= thi;
    }
    // Significant bits of each float type: an integer type fits when its magnitude does.
    let mantissa = |d: DType| match d {
        F16 => Some(11),
        BF16 => Some(8),
        F32 => Some(24),
        F64 => Some(53),
        _ => None,
    };
    if from.is_narrow() || to.is_narrow() {
        return false;
    }
    match from {
        Bool => true,
        F16 | BF16 => matches!(to, F32 | F64),
        F32 => to == F64,
        F64 => false,
        _ => {
            let bits = from.int_bits().expect("the other dtypes are integers") - u32::from(from.is_signed());
            mantissa(to).is_some_and(|m| bits <= m)
        }
    }
}
