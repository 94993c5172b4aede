//! The runtime contracts on a real CUDA device, end to end: a GEMM through the node backend, two executors
//! (streams) ordered by an event, a weight promoted to the device and demoted back through pinned memory, and
//! NCCL collectives in a group of one. Each check prints `PASS name` or `FAIL name: why`; the exit code is 1 if
//! any failed, and 2 (after one line saying why) on a machine without a usable device. `scripts/gpu-check.sh`
//! runs it; it needs no LLVM: `cargo build --release -p kiln-runtime --example cuda_contracts`.

use std::sync::Arc;

use kiln_ir::{DType, Op, Tensor};
use kiln_runtime::RunError;
use kiln_runtime::contract::{
    Backend, CollectiveBackend, Completion, Node, ReduceOp, SubmissionBackend, TransferBackend,
};
use kiln_runtime::cuda::{CudaDevice, CudaGpu, CudaNodeBackend, GpuBackend, GpuExecutor, GpuHostBuffer, NcclGroup};

type B = GpuBackend<CudaGpu>;

fn close(got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!("shape {:?}, expected {:?}", got.shape(), want.shape()));
    }
    for (i, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        if (g - w).abs() > 1e-4 * (1.0 + w.abs()) {
            return Err(format!("element {i}: {g}, expected {w}"));
        }
    }
    Ok(())
}

fn gemm(gpu: &CudaGpu) -> Result<(), String> {
    let node = CudaNodeBackend::new(Arc::new(gpu.clone()));
    let (a, b) = (Tensor::random(DType::F32, vec![3, 64, 32], 1), Tensor::random(DType::F32, vec![32, 48], 2));
    let got = node
        .run_with_cache(&Node::op("mm", Op::MatMul), &[a.clone(), b.clone()], None, 0)
        .map_err(|e| e.to_string())?;
    let want = kiln_ir::interp::eval_op(&Op::MatMul, &[&a, &b]).map_err(|e| e.to_string())?;
    close(&got.outputs[0], &want[0])
}

fn streams_and_transfers(gpu: &CudaGpu) -> Result<(), String> {
    let e = |r: RunError| r.to_string();
    let root = GpuExecutor::new("cuda0", gpu.clone());
    let lanes = B::fork_executors(&root, 2).map_err(e)?;
    let t = Tensor::random(DType::F32, vec![1 << 20], 3);
    let (w, promoted) = B::promote(&lanes[0], &GpuHostBuffer::from_tensor(&t)).map_err(e)?;
    // The second stream waits for the first one's copy on the device, then copies the weight back.
    B::order_after(&promoted, &lanes[1]).map_err(e)?;
    let (host, demoted) = B::demote(&lanes[1], &w).map_err(e)?;
    B::retain_until_complete(&lanes[1], &demoted, w.clone()).map_err(e)?;
    demoted.wait().map_err(e)?;
    let back = host.to_tensor().map_err(e)?;
    if back != t {
        return Err("the demoted bytes differ from the promoted ones".into());
    }
    Ok(())
}

fn collectives(gpu: &CudaGpu) -> Result<(), String> {
    let e = |r: RunError| r.to_string();
    let group = NcclGroup::single(gpu).map_err(e)?;
    let lane = GpuExecutor::new("nccl", gpu.clone());
    let t = Tensor::random(DType::F32, vec![4, 5], 4);
    let (w, copied) = B::promote(&lane, &GpuHostBuffer::from_tensor(&t)).map_err(e)?;
    copied.wait().map_err(e)?;
    for (name, result) in [
        ("all_reduce", B::all_reduce(w.clone(), ReduceOp::Sum, &group, &lane)),
        ("all_gather", B::all_gather(w.clone(), &group, &lane)),
        ("all_to_all", B::all_to_all(w.clone(), &group, &lane)),
    ] {
        let out = result.map_err(|err| format!("{name}: {err}"))?;
        let (host, done) = B::demote(&lane, &out).map_err(e)?;
        done.wait().map_err(e)?;
        close(&host.to_tensor().map_err(e)?, &t).map_err(|m| format!("{name}: {m}"))?;
    }
    Ok(())
}

fn main() {
    let device = match CudaDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("no usable CUDA device: {e}");
            std::process::exit(2);
        }
    };
    println!("device 0: {}", device.name());
    let gpu = match CudaGpu::new(device, "", &[]) {
        Ok(g) => g,
        Err(e) => {
            println!("no usable CUDA device: {e}");
            std::process::exit(2);
        }
    };
    let mut failed = 0;
    for (name, check) in [
        ("gemm (node backend, cuBLAS)", gemm as fn(&CudaGpu) -> Result<(), String>),
        ("streams, events, promote/demote", streams_and_transfers),
        ("nccl collectives (group of one)", collectives),
    ] {
        match check(&gpu) {
            Ok(()) => println!("PASS {name}"),
            Err(why) => {
                failed += 1;
                println!("FAIL {name}: {why}");
            }
        }
    }
    std::process::exit(if failed > 0 { 1 } else { 0 });
}
