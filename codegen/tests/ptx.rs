//! The NVPTX emitter without a GPU, on every fixture kernel — each `.kir` fixture lowered whole (where it can
//! be) and the kernels of its executable (`exec::build`, every fixture):
//! - the PTX for `sm_80` and `sm_90` assembles with NVIDIA's `ptxas` (`scripts/get-ptxas.sh` fetches it;
//!   `KILN_PTXAS` or `.cache/ptxas/ptxas`; without it the assembly step prints `SKIPPED:`, the emission still
//!   runs);
//! - host emulation (the same LLVM IR JIT-compiled for the CPU, run over an emulated grid) computes the reference
//!   evaluator's results (rtol 1e-3, atol 1e-4; integers and bools exactly) on random inputs, under the launch
//!   rule's grid and under a small grid that makes every thread loop.

mod common;

use std::path::PathBuf;

use common::{Buffers, lower_whole};
use kiln_codegen::kernel::{self, ArgRole, Extent, Kernel};
use kiln_codegen::ptx::{self, PtxArch, PtxOptions, emulate};
use kiln_ir::Tensor;

/// Symbol values: the fixtures' named ones, 5 for any other.
const BINDINGS: &[(&str, i64)] = &[("batch", 3), ("seq", 2)];

fn symbol_value(name: &str) -> i64 {
    BINDINGS.iter().find(|(n, _)| *n == name).map_or(5, |(_, v)| *v)
}

/// Every fixture's kernels, by fixture: `(fixture, kernels)`.
fn fixture_kernels() -> Vec<(String, Vec<Kernel>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut paths: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.retain(|p| p.extension().is_some_and(|e| e == "kir"));
    paths.sort();
    assert!(paths.len() >= 12, "the fixture set");
    let mut out = Vec::new();
    for path in paths {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let g = kiln_ir::parse(&std::fs::read_to_string(&path).unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut kernels = Vec::new();
        if g.params().next().is_none()
            && let Ok(k) = lower_whole(&g, &format!("{name}_whole"))
        {
            kernels.push(k);
        }
        let exe = kiln_codegen::exec::build(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
        kernels.extend(exe.kernels);
        out.push((name, kernels));
    }
    out
}

/// `ptxas`, if available.
fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let cached = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/ptxas/ptxas");
    cached.is_file().then_some(cached)
}

#[test]
fn every_fixture_kernel_compiles_to_ptx_that_ptxas_assembles() {
    let ptxas = ptxas();
    if ptxas.is_none() {
        eprintln!(
            "SKIPPED: ptxas not found (run scripts/get-ptxas.sh or set KILN_PTXAS); PTX is emitted but not assembled"
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let (mut modules, mut kernels, mut assembled) = (0, 0, 0);
    for (name, ks) in fixture_kernels() {
        for arch in PtxArch::ALL {
            let m = ptx::compile(&ks, &PtxOptions { arch, ..PtxOptions::default() })
                .unwrap_or_else(|e| panic!("{name} ({}): {e}", arch.name()));
            assert!(m.ptx.contains(".version 7.8"), "{name}: PTX ISA 7.8\n{}", m.ptx);
            assert!(m.ptx.contains(&format!(".target {}", arch.name())), "{name}: target\n{}", m.ptx);
            assert_eq!(m.kernels.len(), ks.len());
            for info in &m.kernels {
                assert!(m.ptx.contains(&format!(".entry {}(", info.entry)), "{name}: entry {}\n{}", info.entry, m.ptx);
            }
            modules += 1;
            kernels += ks.len();
            if let Some(ptxas) = &ptxas {
                let file = tmp.path().join(format!("{name}.{}.ptx", arch.name()));
                std::fs::write(&file, &m.ptx).unwrap();
                let out = std::process::Command::new(ptxas)
                    .arg(format!("-arch={}", arch.name()))
                    .arg(&file)
                    .arg("-o")
                    .arg(tmp.path().join("out.cubin"))
                    .output()
                    .unwrap_or_else(|e| panic!("running {}: {e}", ptxas.display()));
                assert!(
                    out.status.success(),
                    "{name}: ptxas -arch={} refused the PTX:\n{}\n{}",
                    arch.name(),
                    String::from_utf8_lossy(&out.stderr),
                    m.ptx
                );
                assembled += 1;
            }
        }
    }
    eprintln!("{modules} PTX modules ({kernels} kernels) emitted, {assembled} assembled by ptxas");
    assert!(kernels > 40, "the fixtures' kernels");
}

/// Random launch arguments of `k` for `symbols` (outputs zeroed), the `seed`th set.
fn random_args(k: &Kernel, symbols: &[i64], seed: u64) -> Vec<Tensor> {
    k.launch_args()
        .enumerate()
        .map(|(i, (_, a))| {
            let shape: Vec<usize> = a
                .shape
                .iter()
                .map(|e| match e {
                    Extent::Const(c) => *c as usize,
                    Extent::Sym(s) => symbols[*s] as usize,
                })
                .collect();
            match a.role {
                ArgRole::Input => Tensor::random(a.dtype, shape, seed * 100 + i as u64),
                _ => Tensor::zeros(a.dtype, shape),
            }
        })
        .collect()
}

/// Whether `got` is within rtol 1e-3, atol 1e-4 of `want` (NaN equal to NaN; integers and bools exactly).
fn check_close(case: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape(), "{case}: shape");
    if !want.dtype().is_float() {
        assert_eq!(got.to_i64_vec(), want.to_i64_vec(), "{case}: values");
        return;
    }
    for (i, (g, w)) in got.to_f64_vec().into_iter().zip(want.to_f64_vec()).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-4 + 1e-3 * w.abs();
        assert!(ok, "{case}: element {i} is {g}, the evaluator gives {w}");
    }
}

/// Runs every kernel of `ks` in emulation on random inputs and compares with the evaluator; returns how many
/// launches were compared.
fn check_emulated(name: &str, ks: &[Kernel]) -> usize {
    let block = 64;
    emulate::with_emulated(ks, block, |m| {
        let mut launches = 0;
        for (i, k) in ks.iter().enumerate() {
            let symbols: Vec<i64> = k.symbols.iter().map(|s| symbol_value(s)).collect();
            let case = format!("{name}/{}", k.name);
            // Random integers may divide by zero, which the evaluator reports as an error: take the first seed
            // it accepts.
            let (args, want) = (0..8)
                .find_map(|seed| {
                    let args = random_args(k, &symbols, seed);
                    let mut want = args.clone();
                    kernel::eval(k, &mut want, &symbols).ok().map(|()| (args, want))
                })
                .unwrap_or_else(|| panic!("{case}: the evaluator refuses 8 random input sets\n{}", kernel::print(k)));
            let (blocks, threads) = m.info(i).launch_geometry(&symbols).unwrap();
            for grid in [emulate::Grid { blocks, threads }, emulate::Grid { blocks: 2, threads: 32 }] {
                let mut bufs = Buffers::new(k, &args);
                let ptrs = bufs.pointers();
                // SAFETY: one buffer per launch argument, each of its full size; one value per symbol.
                unsafe { m.launch(i, &ptrs, &symbols, grid) };
                let got = bufs.tensors(&args);
                for (((_, a), g), w) in k.launch_args().zip(&got).zip(&want) {
                    if a.role == ArgRole::Output {
                        check_close(&format!("{case} ({grid:?}, output {})\n{}", a.name, kernel::print(k)), g, w);
                    }
                }
                launches += 1;
            }
        }
        launches
    })
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn emulated_ptx_code_matches_the_evaluator_on_every_fixture_kernel() {
    let mut launches = 0;
    for (name, ks) in fixture_kernels() {
        launches += check_emulated(&name, &ks);
    }
    eprintln!("{launches} emulated launches match the evaluator");
    assert!(launches > 80);
}
