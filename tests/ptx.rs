//! PTX for the reference models (`../shared/models`, or `KILN_MODELS_DIR`): every kernel of each model's
//! device plan (`cuda-default` pipeline, the target-independent lowering, then the builtin kernels of its
//! library steps) compiles to PTX that `ptxas`
//! assembles for `sm_80` and `sm_90` (`SKIPPED:` when no `ptxas` is found; `scripts/test.sh` fetches it), and
//! computes the kernel evaluator's results in host emulation (the same LLVM IR run on the CPU over an emulated
//! grid; rtol 1e-3, atol 1e-4, random inputs).

mod common;

use std::collections::BTreeMap;

use kiln_codegen::kernel::{self, ArgRole, Kernel};
use kiln_codegen::ptx::{self, PtxArch, PtxOptions, emulate};
use kiln_ir::{Dim, Tensor};

/// The model's symbols bound from its saved inputs' shapes.
fn bind_symbols(inputs: &[(String, kiln_ir::TensorType)], given: &[(String, Tensor)]) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for (name, ty) in inputs {
        let Some((_, t)) = given.iter().find(|(n, _)| n == name) else { continue };
        for (d, &n) in ty.shape.0.iter().zip(t.shape()) {
            if let Dim::Sym(s) = d {
                out.insert(s.clone(), n as i64);
            }
        }
    }
    out
}

/// Random inputs for `k` (outputs zeroed) that the evaluator accepts, with its results.
fn inputs_and_results(k: &Kernel, symbols: &[i64]) -> (Vec<Tensor>, Vec<Tensor>) {
    for seed in 0..8u64 {
        let args: Vec<Tensor> = k
            .launch_args()
            .enumerate()
            .map(|(i, (_, a))| {
                let shape = a.dims(symbols);
                match a.role {
                    ArgRole::Input => Tensor::random(a.dtype, shape, seed * 100 + i as u64),
                    _ => Tensor::zeros(a.dtype, shape),
                }
            })
            .collect();
        let mut want = args.clone();
        if kernel::eval(k, &mut want, symbols).is_ok() {
            return (args, want);
        }
    }
    panic!("{}: the evaluator refuses 8 random input sets", k.name)
}

/// Launch buffers: each argument's bytes in 8-byte-aligned storage.
fn buffers(args: &[Tensor]) -> Vec<Vec<u64>> {
    args.iter()
        .map(|t| {
            let bytes = t.data().to_le_bytes();
            let mut w = vec![0u64; bytes.len().div_ceil(8).max(1)];
            // SAFETY: `w` holds at least `bytes.len()` bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), w.as_mut_ptr() as *mut u8, bytes.len()) };
            w
        })
        .collect()
}

/// Checks one model's kernels; returns how many there are, and how many reduce cooperatively.
fn check_model(dir: &std::path::Path, ptxas: Option<&std::path::Path>) -> Result<(usize, usize), String> {
    let inputs = common::read_manifest(&dir.join("inputs"));
    let shapes = inputs.iter().map(|(n, t)| (n.clone(), t.shape().to_vec())).collect();
    let model = kiln::Model::load(&dir.join("model.onnx"), &kiln::LoadOptions { shapes, ..Default::default() })
        .map_err(|e| format!("load: {e}"))?;
    let options =
        kiln::CompileOptions { backend: kiln::Backend::Cuda, pipeline: "cuda-default".into(), ..Default::default() };
    let lowered = model.lower(&options).map_err(|e| format!("lower: {e}"))?;
    let bound = bind_symbols(&lowered.inputs, &inputs);
    // The device plan's kernels: the executable's, then the builtins its library steps need (im2col, bias, pool,
    // gather, direct conv).
    let plan = kiln_codegen::device::build_plan(&lowered.executable).map_err(|e| format!("plan: {e}"))?;
    let ks = &plan.kernels;
    for arch in PtxArch::ALL {
        let m = ptx::compile(ks, &PtxOptions { arch, ..PtxOptions::default() }).map_err(|e| e.to_string())?;
        if let Some(ptxas) = ptxas {
            let name = dir.file_name().unwrap().to_string_lossy();
            ptx::ptxas::assemble(ptxas, &m.ptx, arch, &name)?;
        }
    }
    emulate::with_emulated(ks, ptx::DEFAULT_BLOCK_SIZE, |m| {
        for (i, k) in ks.iter().enumerate() {
            let symbols: Vec<i64> = k
                .symbols
                .iter()
                .map(|s| *bound.get(s).unwrap_or_else(|| panic!("{}: symbol {s} is not bound", k.name)))
                .collect();
            let (args, want) = inputs_and_results(k, &symbols);
            let mut bufs = buffers(&args);
            let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|w| w.as_mut_ptr() as *mut u8).collect();
            let (blocks, threads) = m.info(i).launch_geometry(&symbols).unwrap();
            // SAFETY: one buffer per launch argument, each of its full size; one value per symbol.
            unsafe { m.launch(i, &ptrs, &symbols, emulate::Grid { blocks, threads }) };
            for (((_, a), w), (bytes, like)) in k.launch_args().zip(&want).zip(bufs.iter().zip(&args)) {
                if a.role != ArgRole::Output {
                    continue;
                }
                let n = like.data().to_le_bytes().len();
                // SAFETY: `bytes` holds at least `n` initialized bytes.
                let raw = unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const u8, n) };
                let got =
                    Tensor::new(w.shape().to_vec(), kiln_ir::tensor::Data::from_le_bytes(w.dtype(), raw).unwrap())
                        .unwrap();
                kiln::conformance::compare(&got, w, 1e-3, 1e-4)
                    .map_err(|e| format!("kernel {} output {}: {e}\n{}", k.name, a.name, kernel::print(k)))?;
            }
        }
        Ok((ks.len(), (0..ks.len()).filter(|&i| m.info(i).cooperative).count()))
    })
    .map_err(|e| e.to_string())?
}

#[test]
fn reference_model_kernels_assemble_and_match_the_evaluator_in_emulation() {
    let Some(dirs) = common::model_dirs() else { return };
    let ptxas = ptx::ptxas::find();
    if ptxas.is_none() {
        eprintln!(
            "SKIPPED: ptxas not found (run scripts/get-ptxas.sh or set KILN_PTXAS): PTX is emitted, not assembled"
        );
    }
    let mut failures = Vec::new();
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let t0 = std::time::Instant::now();
        match check_model(dir, ptxas.as_deref()) {
            Ok((n, c)) => eprintln!(
                "{name}: {n} kernels ({c} cooperative): PTX{} and emulation ok in {:.1} s",
                if ptxas.is_some() { " assembled for sm_80 and sm_90" } else { "" },
                t0.elapsed().as_secs_f64()
            ),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{} of {} models failed:\n{}", failures.len(), dirs.len(), failures.join("\n"));
}
