//! The reference node backend: runs any single tensor-op [`Node`] through the interpreter
//! ([`kiln_ir::interp::eval_op`]), so the registry always has a backend that covers every op.
//!
//! It is the slow, obviously correct baseline every other node backend (plugins included) is compared with. It
//! keeps no state and runs no token nodes.

use kiln_ir::Tensor;

use crate::RunError;
use crate::contract::{Backend, Capabilities, Counters, Node, NodeKind, OpSupport, RunResult};

/// Runs single tensor-op nodes on the host with the reference interpreter.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReferenceBackend;

impl Backend for ReferenceBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities { tensor: true, ops: OpSupport::All, ..Capabilities::none() }
    }

    fn tensor_backend_type(&self) -> &str {
        "cpu"
    }

    fn run_with_cache(
        &self,
        node: &Node,
        inputs: &[Tensor],
        _prefix_state: Option<&crate::contract::BackendState>,
        _remaining_tokens: u32,
    ) -> Result<RunResult, RunError> {
        let op = match &node.kind {
            NodeKind::Op(op) => op,
            NodeKind::Token { model, .. } => {
                return Err(RunError::Unsupported {
                    node: node.name.clone(),
                    reason: format!("the reference backend runs tensor ops, not token nodes (model `{model}`)"),
                });
            }
        };
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let outputs = kiln_ir::interp::eval_op(op, &refs)
            .map_err(|e| RunError::Op(format!("node `{}` ({}): {e}", node.name, op.mnemonic())))?;
        Ok(RunResult { outputs, state: None, counters: Counters::default() })
    }
}

#[cfg(test)]
mod tests {
    use kiln_ir::op::BinaryOp;
    use kiln_ir::{DType, Op};

    use super::*;

    #[test]
    fn runs_an_op_like_the_interpreter() {
        let a = Tensor::from_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let b = Tensor::from_vec(vec![2], vec![10.0f32, 20.0]).unwrap();
        let r = ReferenceBackend.run_with_cache(&Node::op("n", Op::Binary(BinaryOp::Add)), &[a, b], None, 0).unwrap();
        assert_eq!(r.outputs, vec![Tensor::from_vec(vec![2, 2], vec![11.0f32, 22.0, 13.0, 24.0]).unwrap()]);
        assert_eq!(r.counters, Counters::default());
        assert!(r.state.is_none());
    }

    #[test]
    fn bad_operands_and_token_nodes_are_errors() {
        let a = Tensor::zeros(DType::F32, vec![2, 3]);
        let b = Tensor::zeros(DType::F32, vec![4]);
        let err = ReferenceBackend.run_with_cache(&Node::op("bad", Op::Binary(BinaryOp::Add)), &[a, b], None, 0);
        assert!(matches!(&err, Err(RunError::Op(m)) if m.contains("node `bad` (add)")), "{err:?}");
        let err = ReferenceBackend.run_with_cache(&Node::token("t", "m", false, 4), &[], None, 0);
        assert!(matches!(&err, Err(RunError::Unsupported { node, .. }) if node == "t"), "{err:?}");
    }
}
