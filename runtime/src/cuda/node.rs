//! [`CudaNodeBackend`]: the CUDA device as a node backend of the registry (the `Backend` contract): single
//! `matmul` nodes on f32 run through the device's GEMM (cuBLAS on a real device), so a registry that has a device
//! sends them there ahead of the host. Other ops are not covered here (the registry falls back to the next
//! backend); whole graphs run on the device through [`super::GpuProgram`].

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_ir::{DType, Op, Tensor, TensorType};
use kiln_plan::device::{DevicePlan, DeviceStep};
use kiln_plan::exec::{BufferId, BufferInfo, Executable, Home};

use super::gpu::Gpu;
use super::program::GpuProgram;
use crate::RunError;
use crate::contract::{Backend, Capabilities, Counters, Node, NodeKind, OpSupport, RunResult};

/// The priority a device registers with: above the host's compiled code and reference backend (0).
pub const CUDA_PRIORITY: i32 = 10;

/// The name a CUDA device registers as.
pub const CUDA_BACKEND: &str = "cuda";

/// Runs single f32 `matmul` nodes on a device. See the module docs.
pub struct CudaNodeBackend<G: Gpu> {
    gpu: Arc<G>,
}

impl<G: Gpu> CudaNodeBackend<G> {
    /// A node backend on `gpu`.
    pub fn new(gpu: Arc<G>) -> CudaNodeBackend<G> {
        CudaNodeBackend { gpu }
    }
}

/// A one-step program computing `op` on operands of these types: its executable and device plan.
fn single_step(op: &Op, types: &[TensorType]) -> Result<(Executable, DevicePlan), String> {
    let out = kiln_ir::infer::infer(op, types)?;
    let [out] = <[TensorType; 1]>::try_from(out).map_err(|_| "one result expected".to_string())?;
    let mut buffers: Vec<BufferInfo> =
        types.iter().enumerate().map(|(i, ty)| BufferInfo { ty: ty.clone(), home: Home::Input(i) }).collect();
    buffers.push(BufferInfo { ty: out, home: Home::Dynamic });
    let id = |i: usize| BufferId(i as u32);
    let step = match op {
        Op::MatMul => DeviceStep::MatMul { a: id(0), b: id(1), out: id(2) },
        other => return Err(format!("`{}` is not run by the CUDA node backend", other.mnemonic())),
    };
    let exe = Executable {
        inputs: (0..types.len()).map(|i| (format!("operand{i}"), id(i))).collect(),
        outputs: vec![("result".into(), id(types.len()))],
        buffers,
        ..Executable::empty(op.mnemonic())
    };
    let plan = DevicePlan { prepare: Vec::new(), steps: vec![step], kernels: Vec::new(), fallbacks: Vec::new() };
    Ok((exe, plan))
}

impl<G: Gpu + 'static> Backend for CudaNodeBackend<G> {
    fn capabilities(&self) -> Capabilities {
        Capabilities { tensor: true, ops: OpSupport::only(["matmul"]), ..Capabilities::none() }
    }

    fn tensor_backend_type(&self) -> &str {
        "cuda"
    }

    fn run_with_cache(
        &self,
        node: &Node,
        inputs: &[Tensor],
        _prefix_state: Option<&crate::contract::BackendState>,
        _remaining_tokens: u32,
    ) -> Result<RunResult, RunError> {
        let unsupported = |reason: String| RunError::Unsupported { node: node.name.clone(), reason };
        let op = match &node.kind {
            NodeKind::Op(op @ Op::MatMul) => op,
            NodeKind::Op(op) => {
                return Err(unsupported(format!("the cuda backend runs matmul, not {}", op.mnemonic())));
            }
            NodeKind::Token { model, .. } => return Err(unsupported(format!("no token nodes (model `{model}`)"))),
        };
        if let Some(t) = inputs.iter().find(|t| t.dtype() != DType::F32) {
            return Err(unsupported(format!("the cuda backend's matmul is f32, not {}", t.dtype())));
        }
        let types: Vec<TensorType> = inputs.iter().map(Tensor::tensor_type).collect();
        let (exe, plan) =
            single_step(op, &types).map_err(|e| RunError::Op(format!("node `{}` (matmul): {e}", node.name)))?;
        let program = GpuProgram::new(Arc::clone(&self.gpu), exe, plan, Vec::new())?;
        let named: BTreeMap<String, Tensor> =
            inputs.iter().enumerate().map(|(i, t)| (format!("operand{i}"), t.clone())).collect();
        let outputs = program.run(&named)?.into_iter().map(|(_, t)| t).collect();
        Ok(RunResult { outputs, state: None, counters: Counters::default() })
    }
}

#[cfg(test)]
mod tests {
    use kiln_ir::op::BinaryOp;

    use super::*;
    use crate::cuda::{HostGpu, NoKernels};
    use crate::registry::BackendRegistry;

    fn host_backend() -> Arc<CudaNodeBackend<HostGpu<NoKernels>>> {
        Arc::new(CudaNodeBackend::new(Arc::new(HostGpu::new(NoKernels))))
    }

    #[test]
    fn matmul_nodes_run_through_the_device_gemm_as_the_interpreter_computes_them() {
        let b = host_backend();
        for (a_shape, b_shape) in [(vec![3, 4], vec![4, 5]), (vec![2, 3, 4], vec![4, 2]), (vec![4], vec![2, 4, 3])] {
            let x = Tensor::random(DType::F32, a_shape, 1);
            let y = Tensor::random(DType::F32, b_shape, 2);
            let got = b.run_with_cache(&Node::op("mm", Op::MatMul), &[x.clone(), y.clone()], None, 0).unwrap();
            let want = kiln_ir::interp::eval_op(&Op::MatMul, &[&x, &y]).unwrap();
            assert_eq!(got.outputs[0].shape(), want[0].shape());
            for (g, w) in got.outputs[0].to_f64_vec().iter().zip(want[0].to_f64_vec()) {
                assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} vs {w}");
            }
        }
    }

    #[test]
    fn other_ops_dtypes_and_bad_shapes_are_clear_errors() {
        let b = host_backend();
        let f = |s: Vec<usize>| Tensor::zeros(DType::F32, s);
        let err = b.run_with_cache(&Node::op("add", Op::Binary(BinaryOp::Add)), &[f(vec![2]), f(vec![2])], None, 0);
        assert!(matches!(&err, Err(RunError::Unsupported { node, .. }) if node == "add"), "{err:?}");
        let ints = [Tensor::zeros(DType::I32, vec![2, 2]), Tensor::zeros(DType::I32, vec![2, 2])];
        let err = b.run_with_cache(&Node::op("mm", Op::MatMul), &ints, None, 0);
        assert!(matches!(&err, Err(RunError::Unsupported { reason, .. }) if reason.contains("i32")), "{err:?}");
        let err = b.run_with_cache(&Node::op("mm", Op::MatMul), &[f(vec![2, 3]), f(vec![4, 2])], None, 0);
        assert!(matches!(&err, Err(RunError::Op(m)) if m.contains("node `mm`")), "{err:?}");
    }

    #[test]
    fn a_registered_device_wins_matmul_and_leaves_other_ops_to_the_host() {
        let mut r = BackendRegistry::with_defaults();
        r.register("cuda", host_backend(), CUDA_PRIORITY).unwrap();
        assert_eq!(r.select(&Node::op("mm", Op::MatMul)).unwrap().name, "cuda");
        assert_eq!(
            r.select(&Node::op("add", Op::Binary(BinaryOp::Add))).unwrap().name,
            crate::registry::COMPILED_CPU_BACKEND
        );
    }
}
