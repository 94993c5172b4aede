//! The CUDA runtime without a GPU: every fixture and every reference model (`../shared/models`, or
//! `KILN_MODELS_DIR`) compiled for CUDA (`cuda-default` pipeline, device plan, builtin kernels) and run by the
//! CUDA backend's `GpuProgram` on the emulated device (`kiln::cuda::run_emulated`: the plan's kernels as the
//! PTX's LLVM IR on the host, host memory, the CPU library's GEMM). Results match the interpreter on fixtures
//! and ONNX Runtime's saved outputs on the models (rtol 1e-3, atol 1e-4); bad inputs are clear errors.

mod common;

use std::collections::BTreeMap;

use kiln::{Backend, CompileOptions, Model};
use kiln_codegen::ptx::DEFAULT_BLOCK_SIZE;
use kiln_ir::Tensor;

fn cuda_options() -> CompileOptions {
    CompileOptions { backend: Backend::Cuda, pipeline: "cuda-default".into(), ..Default::default() }
}

#[test]
fn fixtures_match_the_interpreter_through_the_cuda_runtime() {
    let mut failures = Vec::new();
    for (name, mut g) in common::fixtures() {
        common::bind_weights(&mut g);
        let t0 = std::time::Instant::now();
        let model = Model::from_graph(g).unwrap();
        let inputs = common::fixture_inputs(&model);
        let want = model
            .run(&inputs, &kiln::RunOptions { backend: Backend::Interp, threads: 1, ..Default::default() })
            .unwrap();
        let result = model
            .lower(&cuda_options())
            .and_then(|lowered| kiln::cuda::run_emulated(&lowered, &inputs, DEFAULT_BLOCK_SIZE))
            .map_err(|e| e.to_string())
            .and_then(|got| {
                std::panic::catch_unwind(|| common::assert_outputs(&name, &got, &want, 1e-3, 1e-4))
                    .map_err(|_| "outputs differ (see above)".to_string())
            });
        eprintln!("{name}: {} in {:.1} s", if result.is_ok() { "ok" } else { "FAILED" }, t0.elapsed().as_secs_f64());
        if let Err(e) = result {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{} fixtures failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn reference_models_match_onnx_runtime_through_the_cuda_runtime() {
    let Some(dirs) = common::model_dirs() else { return };
    let mut failures = Vec::new();
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let t0 = std::time::Instant::now();
        let result = common::reference_case(dir).and_then(|case| {
            let lowered = case.model.lower(&cuda_options()).map_err(|e| e.to_string())?;
            let got =
                kiln::cuda::run_emulated(&lowered, &case.inputs, DEFAULT_BLOCK_SIZE).map_err(|e| e.to_string())?;
            common::compare_outputs(got, &case.expected)
        });
        eprintln!("{name}: {} in {:.1} s", if result.is_ok() { "ok" } else { "FAILED" }, t0.elapsed().as_secs_f64());
        if let Err(e) = result {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} models failed:\n{}", failures.len(), dirs.len(), failures.join("\n"));
}

fn model(text: &str) -> Model {
    Model::from_graph(kiln_ir::parse(text).unwrap()).unwrap()
}

#[test]
fn bad_inputs_and_out_of_range_gather_indices_are_clear_errors() {
    let m = model(
        "graph \"g\" {\n  %0 = input {name=\"table\"} : f32[5,3]\n  %1 = input {name=\"ids\"} : i64[4]\n  %2 = gather %0, %1 {axis=0} : f32[4,3]\n  output \"y\" = %2\n}\n",
    );
    let lowered = m.lower(&cuda_options()).unwrap();
    let run = |ids: Vec<i64>| {
        let inputs = BTreeMap::from([
            ("table".to_string(), Tensor::random(kiln_ir::DType::F32, vec![5, 3], 1)),
            ("ids".to_string(), Tensor::from_vec(vec![4], ids).unwrap()),
        ]);
        kiln::cuda::run_emulated(&lowered, &inputs, DEFAULT_BLOCK_SIZE)
    };
    let ok = run(vec![0, 4, -1, -5]).unwrap();
    assert_eq!(ok[0].1.shape(), &[4, 3]);
    let err = run(vec![0, 5, 1, 2]).unwrap_err().to_string();
    assert!(err.contains("gather") && err.contains('5'), "{err}");
    let err = run(vec![0, -6, 1, 2]).unwrap_err().to_string();
    assert!(err.contains("gather"), "{err}");

    let wrong_name = BTreeMap::from([("nope".to_string(), Tensor::zeros(kiln_ir::DType::F32, vec![5, 3]))]);
    let err = kiln::cuda::run_emulated(&lowered, &wrong_name, DEFAULT_BLOCK_SIZE).unwrap_err();
    assert!(matches!(err, kiln::Error::Input(_)) && err.to_string().contains("nope"), "{err}");
    let wrong_dtype = BTreeMap::from([
        ("table".to_string(), Tensor::zeros(kiln_ir::DType::F64, vec![5, 3])),
        ("ids".to_string(), Tensor::from_vec(vec![4], vec![0i64; 4]).unwrap()),
    ]);
    let err = kiln::cuda::run_emulated(&lowered, &wrong_dtype, DEFAULT_BLOCK_SIZE).unwrap_err().to_string();
    assert!(err.contains("table") && err.contains("f32"), "{err}");
}

#[test]
fn matmuls_broadcast_fold_and_batch_as_the_cpu_does() {
    // Folded batches, a broadcast right operand batch, regular strides, and an irregular broadcast (one GEMM per
    // batch): each against the interpreter.
    let m = model(
        "graph \"g\" {\n  %0 = input {name=\"a\"} : f32[2,3,4,5]\n  %1 = input {name=\"b\"} : f32[5,6]\n  %2 = input {name=\"c\"} : f32[3,5,2]\n  %3 = input {name=\"d\"} : f32[2,1,5,3]\n  %4 = input {name=\"e\"} : f32[1,3,3,4]\n  %5 = matmul %0, %1 : f32[2,3,4,6]\n  %6 = matmul %0, %2 : f32[2,3,4,2]\n  %7 = matmul %3, %4 : f32[2,3,5,4]\n  output \"x\" = %5\n  output \"y\" = %6\n  output \"z\" = %7\n}\n",
    );
    let inputs = common::fixture_inputs(&m);
    let want =
        m.run(&inputs, &kiln::RunOptions { backend: Backend::Interp, threads: 1, ..Default::default() }).unwrap();
    let got = kiln::cuda::run_emulated(&m.lower(&cuda_options()).unwrap(), &inputs, DEFAULT_BLOCK_SIZE).unwrap();
    common::assert_outputs("matmuls", &got, &want, 1e-4, 1e-5);
}
