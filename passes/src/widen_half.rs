//! `widen-half`: the library ops of a half-precision model compute in f32.
//!
//! Every `matmul`, `conv` and `pool` whose result is f16 or bf16 becomes the same op on its float operands cast
//! to f32, followed by a cast of the result back: storage stays in the model's type, the products accumulate in
//! f32 — and the CPU's GEMM, conv and pool library (f32) and cuBLAS plans run them. The interpreter computes these
//! ops on half types by widening to f32 and rounding once per result element, so the rewrite gives its results up
//! to the order of the additions. The casts are elementwise and fuse into the neighbouring kernels (the one
//! after the op becomes its library call's epilogue). Weights are cast once, at load, by the prepare step every
//! weight-only node becomes.

use kiln_ir::op::Cast;
use kiln_ir::{DType, Graph, Node, NodeId, Op, TensorType, Value};

use crate::declare_pass;
use crate::pass::{Pass, PassContext, PassError};

declare_pass! {
    /// Makes f16/bf16 matmul, conv and pool compute in f32 between casts (storage stays half precision).
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
        let targets: Vec<NodeId> = g
            .node_ids()
            .filter(|&id| {
                let n = g.node(id);
                matches!(n.op, Op::MatMul | Op::Conv(_) | Op::Pool(_))
                    && n.outputs.len() == 1
                    && matches!(n.outputs[0].dtype, DType::F16 | DType::BF16)
            })
            .collect();
        for &id in &targets {
            widen(g, id);
        }
        Ok(!targets.is_empty())
    }
}

fn add(g: &mut Graph, op: Op, inputs: Vec<Value>, outputs: Vec<TensorType>, name: Option<String>) -> Value {
    Value::new(g.add_node(Node { op, inputs, outputs, name }), 0)
}

/// Rewrites node `id` (a half-precision library op) to compute in f32 between casts; a node whose operands do not
/// all exist (an unverified graph) is left for the verifier to report.
fn widen(g: &mut Graph, id: NodeId) {
    let node = g.node(id).clone();
    let half = node.outputs[0].dtype;
    let Some(types) = node.inputs.iter().map(|&v| g.value_type(v).cloned()).collect::<Option<Vec<_>>>() else {
        return;
    };
    let mut inputs = Vec::with_capacity(node.inputs.len());
    for (&v, ty) in node.inputs.iter().zip(types) {
        inputs.push(if ty.dtype == half {
            let wide = TensorType::new(DType::F32, ty.shape.clone());
            add(g, Op::Cast(Cast { to: DType::F32 }), vec![v], vec![wide], None)
        } else {
            v
        });
    }
    let out_ty = node.outputs[0].clone();
    let wide =
        add(g, node.op.clone(), inputs, vec![TensorType::new(DType::F32, out_ty.shape.clone())], node.name.clone());
    let back = add(g, Op::Cast(Cast { to: half }), vec![wide], vec![out_ty], None);
    g.replace_uses(Value::new(id, 0), back);
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
}
