//! `widen-half`: the arithmetic of a half-precision model computes in f32.
//!
//! Every op that computes on floats — elementwise unary and binary ops (comparisons included), `select`,
//! reductions, softmax, layer/batch norm, gelu, and the library ops `matmul`, `conv` and `pool` — whose operands
//! or result are f16 or bf16 becomes the same op on f32: a half operand is cast to f32, a half result computed in
//! f32 and cast back. Where an operand is such a cast-back of another widened op's result, the op reads the f32
//! value itself, so a chain of half-precision arithmetic (a GELU, a normalization, a bias add after a GEMM)
//! computes in f32 throughout and rounds to the model's type only where a value leaves the arithmetic: a graph
//! result, an explicit `cast`, or an op that moves data (reshape, transpose, concat, gather, ...), which keeps the
//! model's storage type. This is what XLA and other compilers do with half-precision arithmetic: results are at
//! least as accurate as rounding after every op, and agree with it within the type's rounding; a single op gives
//! the interpreter's result exactly (the interpreter computes each half op in f32 and rounds once), up to the
//! order of a library op's additions. Storage stays in the model's type: weights are cast once, at load, by the
//! prepare step every weight-only node becomes; the casts are elementwise and fuse into neighbouring kernels.
//!
//! Max pools of 8- and 16-bit integers widen the same way (the library pools f32): their result is exact, since
//! every such value is an f32 and a maximum picks one of its operands.

use std::collections::HashMap;

use kiln_ir::op::{Cast, PoolKind};
use kiln_ir::{DType, Graph, Node, NodeId, Op, TensorType, Value};

use crate::declare_pass;
use crate::pass::{Pass, PassContext, PassError};

declare_pass! {
    /// Makes the arithmetic of f16/bf16 values (and max pools of 8/16-bit integers) compute in f32 between casts; storage keeps its type.
    #[derive(Clone, Debug, Default)]
    pub struct WidenHalf = "widen-half";
}

impl Pass for WidenHalf {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, _: &PassContext) -> Result<bool, PassError> {
        // Topological order, so a producer is widened before its consumers read it; a cyclic graph is the
        // verifier's to report.
        let Ok(order) = g.topo_order() else { return Ok(false) };
        let targets: Vec<NodeId> = order.into_iter().filter(|&id| widens(g, id)).collect();
        // The f32 twin of each half value a widened op reads: the cast of it this pass added, or — for the
        // casts back to half it adds — their f32 operand.
        let mut wide: HashMap<Value, Value> = HashMap::new();
        let mut backs: Vec<Value> = Vec::new();
        for &id in &targets {
            widen(g, id, &mut wide, &mut backs);
        }
        // Casts back that nothing reads any more.
        for back in backs {
            if g.uses(back).is_empty() && !g.outputs().iter().any(|(_, v)| *v == back) {
                g.remove_node(back.node);
            }
        }
        Ok(!targets.is_empty())
    }
}

fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// Whether `op` computes on values of `d` in f32 here: half-precision arithmetic ([`Op::widens_half`]), and max
/// pools of 8- and 16-bit integers (a QOperator model pools its u8 activations), which are the f32 max pools of the
/// same values exactly — every such value converts both ways unchanged and the padding never wins either way.
fn narrow(op: &Op, d: DType) -> bool {
    (op.widens_half() && is_half(d))
        || (matches!(op, Op::Pool(p) if p.kind == PoolKind::Max)
            && matches!(d, DType::U8 | DType::I8 | DType::U16 | DType::I16))
}

/// Whether node `id` computes in a narrow type that widens to f32 ([`narrow`]), in an operand or its result.
fn widens(g: &Graph, id: NodeId) -> bool {
    let n = g.node(id);
    n.outputs.iter().any(|t| narrow(&n.op, t.dtype))
        || n.inputs.iter().any(|&v| g.value_type(v).is_some_and(|t| narrow(&n.op, t.dtype)))
}

fn add(g: &mut Graph, op: Op, inputs: Vec<Value>, outputs: Vec<TensorType>, name: Option<String>) -> Value {
    Value::new(g.add_node(Node { op, inputs, outputs, name }), 0)
}

/// Rewrites node `id` to compute in f32 between casts: each half operand read through its f32 twin in `wide`
/// (made, and recorded, when it has none yet), each half result computed in f32 and cast back (the cast recorded
/// in `backs`, its twin the f32 result). A node whose operands do not all exist (an unverified graph) is left for
/// the verifier to report.
fn widen(g: &mut Graph, id: NodeId, wide: &mut HashMap<Value, Value>, backs: &mut Vec<Value>) {
    let node = g.node(id).clone();
    let Some(types) = node.inputs.iter().map(|&v| g.value_type(v).cloned()).collect::<Option<Vec<_>>>() else {
        return;
    };
    let mut inputs = Vec::with_capacity(node.inputs.len());
    for (&v, ty) in node.inputs.iter().zip(types) {
        inputs.push(if let Some(&twin) = wide.get(&v) {
            twin
        } else if narrow(&node.op, ty.dtype) {
            let f32_ty = TensorType::new(DType::F32, ty.shape.clone());
            let twin = add(g, Op::Cast(Cast { to: DType::F32 }), vec![v], vec![f32_ty], None);
            wide.insert(v, twin);
            twin
        } else {
            v
        });
    }
    let outputs: Vec<TensorType> = node
        .outputs
        .iter()
        .map(|t| if narrow(&node.op, t.dtype) { TensorType::new(DType::F32, t.shape.clone()) } else { t.clone() })
        .collect();
    let widened = g.add_node(Node { op: node.op.clone(), inputs, outputs, name: node.name.clone() });
    for (i, out_ty) in node.outputs.iter().enumerate() {
        let old = Value::new(id, i as u32);
        let new = Value::new(widened, i as u32);
        let result = if narrow(&node.op, out_ty.dtype) {
            let back = add(g, Op::Cast(Cast { to: out_ty.dtype }), vec![new], vec![out_ty.clone()], None);
            wide.insert(back, new);
            backs.push(back);
            back
        } else {
            new
        };
        g.replace_uses(old, result);
    }
    g.remove_node(id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_matmul_computes_in_f32_between_casts() {
        let text = "graph \"g\" {\n  %0 = input {name=\"a\"} : f16[2,3]\n  %1 = input {name=\"b\"} : f16[3,4]\n  \
                    %2 = matmul %0, %1 : f16[2,4]\n  output \"y\" = %2\n}\n";
        let mut g = kiln_ir::parse(text).expect("parses");
        assert!(WidenHalf.run(&mut g, &PassContext::default()).expect("runs"));
        kiln_ir::verify(&g).expect("still valid");
        let printed = kiln_ir::print(&g);
        assert!(printed.contains("matmul") && printed.contains(": f32[2,4]"), "{printed}");
        assert_eq!(g.value_type(g.outputs()[0].1).map(|t| t.dtype), Some(DType::F16));
        // Nothing left to widen: a second run changes nothing.
        assert!(!WidenHalf.run(&mut g, &PassContext::default()).expect("runs"));
    }

    /// A chain of half arithmetic computes in f32 throughout: one cast in per operand, one cast back per value
    /// that leaves the arithmetic (a result, a reshape's operand), none between the chain's ops.
    #[test]
    fn half_chains_round_only_where_values_leave_the_arithmetic() {
        let text = r#"graph "g" {
          %0 = input {name="x"} : f16[2,3]
          %1 = input {name="y"} : bf16[2,3]
          %2 = mul %0, %0 : f16[2,3]
          %3 = erf %2 : f16[2,3]
          %4 = add %3, %0 : f16[2,3]
          %5 = reshape %4 {shape=[6]} : f16[6]
          %6 = softmax %5 {axis=0} : f16[6]
          %7 = lt %1, %1 : bool[2,3]
          output "z" = %6
          output "w" = %4
          output "c" = %7
        }"#;
        let mut g = kiln_ir::parse(text).expect("parses");
        assert!(WidenHalf.run(&mut g, &PassContext::default()).expect("runs"));
        kiln_ir::verify(&g).expect("still valid");
        let count = |op: &str| g.node_ids().filter(|&id| g.node(id).op.mnemonic() == op).count();
        let casts_to = |d: DType| g.node_ids().filter(|&id| matches!(&g.node(id).op, Op::Cast(c) if c.to == d)).count();
        // In: x once (read by mul and add), y once, the reshaped value once; back: %4 (result and reshape
        // operand) and the softmax's result.
        assert_eq!(casts_to(DType::F32), 3, "{}", kiln_ir::print(&g));
        assert_eq!(casts_to(DType::F16), 2, "{}", kiln_ir::print(&g));
        assert_eq!(count("reshape"), 1);
        for id in g.node_ids() {
            let n = g.node(id);
            if matches!(n.op, Op::Unary(_) | Op::Binary(_) | Op::Softmax(_)) {
                let operands: Vec<DType> = n.inputs.iter().map(|&v| g.value_type(v).unwrap().dtype).collect();
                assert!(operands.iter().all(|&d| d == DType::F32), "{}", kiln_ir::print(&g));
            }
        }
        let dtypes: Vec<DType> = g.outputs().iter().map(|(_, v)| g.value_type(*v).unwrap().dtype).collect();
        assert_eq!(dtypes, [DType::F16, DType::F16, DType::Bool]);
        assert!(!WidenHalf.run(&mut g, &PassContext::default()).expect("runs"));
    }
}
