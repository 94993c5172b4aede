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

use common::{Buffers, edge_args, lower_whole, one_loop_kernel};
use kiln_codegen::kernel::{self, ArgId, ArgRole, Block, Expr, IExpr, Kernel, LoopKind, LoopVar, Stmt, Var};
use kiln_codegen::ptx::{self, PtxArch, PtxOptions, emulate};
use kiln_ir::Tensor;
use kiln_ir::interp::scalar::Scalar;
use kiln_ir::op::UnaryOp;

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

#[test]
fn every_fixture_kernel_compiles_to_ptx_that_ptxas_assembles() {
    let ptxas = ptx::ptxas::find();
    if ptxas.is_none() {
        eprintln!(
            "SKIPPED: ptxas not found (run scripts/get-ptxas.sh or set KILN_PTXAS); PTX is emitted but not assembled"
        );
    }
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
                ptx::ptxas::assemble(ptxas, &m.ptx, arch, &name).unwrap_or_else(|e| panic!("{name}: {e}\n{}", m.ptx));
                assembled += 1;
            }
        }
    }
    let (_, ks) = &fixture_kernels()[0];
    let ir = ptx::llvm_ir(ks, &PtxOptions::default()).unwrap();
    assert!(
        ir.contains("ptx_kernel") && ir.contains("!nvvm.annotations") && ir.contains("llvm.nvvm.read.ptx.sreg.tid.x"),
        "{ir}"
    );
    eprintln!("{modules} PTX modules ({kernels} kernels) emitted, {assembled} assembled by ptxas");
    assert!(kernels > 40, "the fixtures' kernels");
}

/// Random launch arguments of `k` for `symbols` (outputs zeroed), the `seed`th set.
fn random_args(k: &Kernel, symbols: &[i64], seed: u64) -> Vec<Tensor> {
    k.launch_args()
        .enumerate()
        .map(|(i, (_, a))| {
            let shape = a.dims(symbols);
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

/// Runs kernel `i` of `m` (which is `k`) on `args` under two grids — the launch rule's and a small one that makes
/// every thread loop — and compares its outputs with the evaluator's `want`.
fn compare_emulated(
    m: &emulate::EmulatedModule<'_>,
    i: usize,
    k: &Kernel,
    args: &[Tensor],
    want: &[Tensor],
    symbols: &[i64],
    case: &str,
) {
    let (blocks, threads) = m.info(i).launch_geometry(symbols).unwrap();
    for grid in [emulate::Grid { blocks, threads }, emulate::Grid { blocks: 2, threads: 32 }] {
        let mut bufs = Buffers::new(k, args);
        let ptrs = bufs.pointers();
        // SAFETY: one buffer per launch argument, each of its full size; one value per symbol.
        unsafe { m.launch(i, &ptrs, symbols, grid) };
        let got = bufs.tensors(args);
        for (((_, a), g), w) in k.launch_args().zip(&got).zip(want) {
            if a.role == ArgRole::Output {
                check_close(&format!("{case} ({grid:?}, output {})\n{}", a.name, kernel::print(k)), g, w);
            }
        }
    }
}

/// Runs every kernel of `ks` in emulation on random inputs and compares with the evaluator; returns how many
/// kernels were compared, and how many of them run cooperatively.
fn check_emulated(name: &str, ks: &[Kernel]) -> (usize, usize) {
    emulate::with_emulated(ks, 64, |m| {
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
            compare_emulated(m, i, k, &args, &want, &symbols, &case);
        }
        (ks.len(), (0..ks.len()).filter(|&i| m.info(i).cooperative).count())
    })
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Lowers `text` whole, assembles its PTX with `ptxas` (when found), and checks it in emulation against the
/// evaluator for each binding of its symbols, on edge values (NaN, infinities, signed zeros, subnormals, integer extremes; divisors from `d*` inputs).
fn check_graph(case: &str, text: &str, sizes: &[i64]) {
    let g = kiln_ir::parse(text).unwrap_or_else(|e| panic!("{case}: parse: {e}"));
    let k = lower_whole(&g, "edge").unwrap_or_else(|e| panic!("{case}: lower: {e}"));
    let ptxas = ptx::ptxas::find();
    for arch in PtxArch::ALL {
        let m = ptx::compile(std::slice::from_ref(&k), &PtxOptions { arch, ..PtxOptions::default() })
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        match &ptxas {
            Some(ptxas) => ptx::ptxas::assemble(ptxas, &m.ptx, arch, case).unwrap_or_else(|e| panic!("{case}: {e}")),
            None => eprintln!("SKIPPED: ptxas not found: {case} is not assembled"),
        }
    }
    emulate::with_emulated(std::slice::from_ref(&k), 64, |m| {
        for &n in sizes {
            let symbols: Vec<i64> = k.symbols.iter().map(|_| n).collect();
            for seed in [0, 5] {
                let args = edge_args(&k, &symbols, seed);
                let mut want = args.clone();
                kernel::eval(&k, &mut want, &symbols).unwrap_or_else(|e| panic!("{case}: evaluator: {e}"));
                compare_emulated(m, 0, &k, &args, &want, &symbols, &format!("{case} [n={n}, seed {seed}]"));
            }
        }
    })
    .unwrap_or_else(|e| panic!("{case}: {e}"));
}

#[test]
fn emulated_ptx_code_matches_the_evaluator_on_every_fixture_kernel() {
    let (mut kernels, mut cooperative) = (0, 0);
    for (name, ks) in fixture_kernels() {
        let (n, c) = check_emulated(&name, &ks);
        kernels += n;
        cooperative += c;
    }
    eprintln!("{kernels} emulated kernels match the evaluator (each under two grids), {cooperative} cooperative");
    assert!(kernels > 40);
    // The fixtures' long reductions (mlp_params' row sums) run cooperatively; their other reductions are short
    // and stay in one thread, and gathers no longer reduce (one indirect load per element). Cooperative rows and
    // blocks on edge values have tests of their own below.
    assert!(cooperative >= 1, "reductions run cooperatively");
}

/// A graph of `ops` (`name` or `name rhs`) on inputs `x`, `y` and divisor `d` of `dt`, one output each.
fn op_graph(dt: &str, ops: &[&str]) -> String {
    let mut body = String::new();
    for (i, op) in ops.iter().enumerate() {
        let id = i + 3;
        let mut words = op.split(' ');
        let name = words.next().unwrap();
        let operands = match words.next() {
            Some("y") => "%0, %1",
            Some("d") => "%0, %2",
            _ => "%0",
        };
        let out = if ["lt", "le", "gt", "ge", "eq", "is_nan", "is_inf"].contains(&name) { "bool" } else { dt };
        body.push_str(&format!("  %{id} = {name} {operands} : {out}[n]\n  output \"{name}{id}\" = %{id}\n"));
    }
    format!(
        "graph \"g\" {{\n  %0 = input {{name=\"x\"}} : {dt}[n]\n  %1 = input {{name=\"y\"}} : {dt}[n]\n  %2 = input {{name=\"d\"}} : {dt}[n]\n{body}}}"
    )
}

const ODD_SIZES: &[i64] = &[0, 1, 3, 17, 67, 200];

#[test]
fn f32_elementwise_kinds_and_math_on_edge_values() {
    let ops = [
        "neg",
        "abs",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "tanh",
        "sigmoid",
        "erf",
        "relu",
        "floor",
        "ceil",
        "round",
        "sign",
        "is_nan",
        "is_inf",
        "add y",
        "sub y",
        "mul y",
        "div y",
        "max y",
        "min y",
        "lt y",
        "le y",
        "gt y",
        "ge y",
        "eq y",
        "pow y",
        "pow d",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
        "mod y",
        "rem y",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
    ];
    check_graph("f32 elementwise", &op_graph("f32", &ops), ODD_SIZES);
}

#[test]
fn half_floats_and_f64_on_edge_values() {
    let ops = [
        "add y", "mul y", "div y", "exp", "tanh", "max y", "min y", "sigmoid", "round", "erf", "log", "lt y", "pow y",
        "mod y", "rem y",
    ];
    for dt in ["f16", "bf16"] {
        check_graph(&format!("{dt} elementwise"), &op_graph(dt, &ops), ODD_SIZES);
    }
    let ops = [
        "add y", "mul y", "div y", "max y", "min y", "round", "floor", "sqrt", "abs", "lt y", "relu", "sign", "exp",
        "log", "tanh", "sigmoid", "pow y", "erf", "sinh", "cosh", "asinh", "acosh", "atanh", "mod y", "rem y", "asin",
        "acos", "atan", "sin", "cos", "tan",
    ];
    check_graph("f64 elementwise", &op_graph("f64", &ops), ODD_SIZES);
}

#[test]
fn integer_kinds_on_extremes() {
    let ops = [
        "add y",
        "sub y",
        "mul y",
        "max y",
        "min y",
        "bit_and y",
        "bit_or y",
        "bit_xor y",
        "shl y",
        "shr y",
        "lt y",
        "le y",
        "gt y",
        "ge y",
        "eq y",
        "div d",
        "mod d",
        "rem d",
        "neg",
        "abs",
        "sign",
        "relu",
        "bit_not",
        "floor",
        "pow d",
    ];
    for dt in ["i8", "u8", "i32", "i64"] {
        check_graph(&format!("{dt} integer kinds"), &op_graph(dt, &ops), &[1, 6, 19, 40]);
    }
}

#[test]
fn casts_between_every_pair_of_dtypes() {
    for from in common::DTYPE_NAMES {
        check_graph(&format!("casts from {from}"), &common::casts_graph(from), &[1, 7, 19]);
    }
}

#[test]
fn reductions_on_edge_values() {
    check_graph(
        "reductions",
        r#"graph "g" {
          %0 = input {name="x"} : f32[n,7]
          %1 = reduce %0 {kind=prod, axes=[1], keep_dims=false} : f32[n]
          %2 = reduce %0 {kind=min, axes=[0], keep_dims=false} : f32[7]
          %3 = arg_reduce %0 {kind=min, axis=1, keep_dims=false, select_last_index=false} : i64[n]
          %4 = arg_reduce %0 {kind=max, axis=0, keep_dims=false, select_last_index=true} : i64[7]
          %5 = log_softmax %0 {axis=1} : f32[n,7]
          %6 = input {name="b"} : bool[n,2]
          %7 = reduce %6 {kind=min, axes=[1], keep_dims=false} : bool[n]
          %8 = input {name="i"} : i32[n,3]
          %9 = reduce %8 {kind=max, axes=[0, 1], keep_dims=false} : i32[]
          output "prod" = %1
          output "min" = %2
          output "argmin" = %3
          output "argmax" = %4
          output "log_softmax" = %5
          output "all" = %7
          output "imax" = %9
        }"#,
        &[0, 1, 4, 33],
    );
}

#[test]
fn unsupported_and_malformed_kernels_are_errors_naming_kernel_and_construct() {
    use kiln_codegen::ptx::PtxError;
    let compile = |k: &Kernel| ptx::compile(std::slice::from_ref(k), &PtxOptions::default());
    let load = Expr::Load { arg: ArgId(0), index: IExpr::Var(LoopVar(0)) };
    // Kinds the interpreter does not define for a dtype.
    for (dtype, k, what) in [
        (kiln_ir::DType::I32, UnaryOp::Exp, "`exp` on i32"),
        (kiln_ir::DType::F32, UnaryOp::BitNot, "`bit_not` on f32"),
        (kiln_ir::DType::Bool, UnaryOp::Neg, "`neg` on bool"),
    ] {
        let kernel = one_loop_kernel("undefined_kind", dtype, Expr::unary(k, load.clone()));
        match compile(&kernel) {
            Err(PtxError::Unsupported { kernel, what: w }) => {
                assert_eq!(kernel, "undefined_kind");
                assert!(w.contains(what), "{w}");
            }
            other => panic!("{what}: {other:?}"),
        }
        let e = emulate::with_emulated(std::slice::from_ref(&kernel), 64, |_| ()).unwrap_err().to_string();
        assert!(e.contains(what), "{what} (emulation): {e}");
    }
    // Broken invariants of the kernel IR.
    let malformed = |k: &Kernel, needle: &str| {
        let e = compile(k).unwrap_err();
        assert!(matches!(&e, PtxError::Malformed { kernel, .. } if *kernel == k.name), "{e}");
        assert!(e.to_string().contains(needle), "{e}");
    };
    malformed(&one_loop_kernel("undefined", kiln_ir::DType::F32, Expr::Var(Var(7))), "v7 is not defined");
    malformed(
        &one_loop_kernel("mixed", kiln_ir::DType::F32, Expr::Const(Scalar::I32(1))),
        "stores i32 into `y` of f32",
    );
    let mut k = one_loop_kernel("store_input", kiln_ir::DType::F32, load.clone());
    let Stmt::For { body, .. } = &mut k.body.0[0] else { unreachable!("one loop") };
    body.0[0] = Stmt::Store { arg: ArgId(0), index: IExpr::Var(LoopVar(0)), value: load.clone() };
    malformed(&k, "not an output");
    // A variable used outside the block that binds it.
    let mut k = one_loop_kernel("scope", kiln_ir::DType::F32, load.clone());
    let Stmt::For { body, .. } = &mut k.body.0[0] else { unreachable!("one loop") };
    body.0.insert(0, Stmt::Let { var: Var(0), dtype: kiln_ir::DType::F32, value: load.clone() });
    k.body.0.push(Stmt::For {
        var: LoopVar(1),
        extent: IExpr::Sym(0),
        kind: LoopKind::Parallel,
        body: Block(vec![Stmt::Store { arg: ArgId(1), index: IExpr::Var(LoopVar(1)), value: Expr::Var(Var(0)) }]),
    });
    malformed(&k, "v0 is not defined");
    let e = ptx::compile(&[], &PtxOptions { block_size: 100, ..PtxOptions::default() }).unwrap_err();
    assert!(e.to_string().contains("block size 100"), "{e}");
}

#[test]
fn cooperative_rows_match_on_edge_values() {
    let text = r#"graph "g" {
      %0 = input {name="x"} : f32[n,77]
      %1 = reduce %0 {kind=sum, axes=[1], keep_dims=false} : f32[n]
      %2 = reduce %0 {kind=max, axes=[1], keep_dims=false} : f32[n]
      %3 = softmax %0 {axis=1} : f32[n,77]
      %4 = input {name="h"} : f16[n,40]
      %5 = reduce %4 {kind=sum, axes=[1], keep_dims=false} : f16[n]
      %6 = input {name="w"} : f64[n,33]
      %7 = reduce %6 {kind=min, axes=[1], keep_dims=false} : f64[n]
      %8 = input {name="i"} : i64[n,50]
      %9 = reduce %8 {kind=sum, axes=[1], keep_dims=false} : i64[n]
      %10 = input {name="b"} : bool[n,45]
      %11 = reduce %10 {kind=max, axes=[1], keep_dims=false} : bool[n]
      %12 = input {name="c"} : i8[n,64]
      %13 = reduce %12 {kind=prod, axes=[1], keep_dims=false} : i8[n]
      output "sum" = %1
      output "max" = %2
      output "softmax" = %3
      output "hsum" = %5
      output "wmin" = %7
      output "isum" = %9
      output "any" = %11
      output "iprod" = %13
    }"#;
    let g = kiln_ir::parse(text).unwrap();
    let k = lower_whole(&g, "rows").unwrap();
    let info = &ptx::compile(std::slice::from_ref(&k), &PtxOptions::default()).unwrap().kernels[0];
    assert!(info.cooperative, "row reductions run a row per warp\n{}", kernel::print(&k));
    check_graph("warp rows", text, &[0, 1, 2, 5, 9]);
}

#[test]
fn whole_tensor_reductions_run_on_a_block_and_match_on_edge_values() {
    let text = r#"graph "g" {
      %0 = input {name="x"} : f32[n,37]
      %1 = reduce %0 {kind=sum, axes=[0, 1], keep_dims=false} : f32[]
      %2 = reduce %0 {kind=min, axes=[0, 1], keep_dims=true} : f32[1,1]
      %3 = input {name="i"} : i32[n,5]
      %4 = reduce %3 {kind=max, axes=[0, 1], keep_dims=false} : i32[]
      %5 = input {name="b"} : bool[n]
      %6 = reduce %5 {kind=min, axes=[0], keep_dims=false} : bool[]
      %7 = input {name="w"} : f64[n]
      %8 = reduce %7 {kind=sum, axes=[0], keep_dims=false} : f64[]
      output "sum" = %1
      output "min" = %2
      output "imax" = %4
      output "all" = %6
      output "wsum" = %8
    }"#;
    let g = kiln_ir::parse(text).unwrap();
    let k = lower_whole(&g, "whole").unwrap();
    let m = ptx::compile(std::slice::from_ref(&k), &PtxOptions::default()).unwrap();
    assert!(m.kernels[0].cooperative, "{}", kernel::print(&k));
    assert!(m.ptx.contains("bar.sync") && m.ptx.contains(".shared") && m.ptx.contains("shfl.sync.bfly"), "{}", m.ptx);
    check_graph("whole-tensor reductions", text, &[0, 1, 2, 9, 70, 200]);
}

#[test]
fn pow_follows_c_pow_on_its_special_cases() {
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    let bases = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, inf, -inf, nan, 3.0, -3.0, 1e-30, 10.0];
    let exponents = [0.0, -0.0, 1.0, -1.0, 2.0, 3.0, -3.0, 0.5, -0.5, inf, -inf, nan, 2.5, 7.0, 1e30, -1e30, 30.0];
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for &x in &bases {
        for &y in &exponents {
            xs.push(x);
            ys.push(y);
        }
    }
    let n = xs.len();
    for dt in [kiln_ir::DType::F32, kiln_ir::DType::F64] {
        let g = kiln_ir::parse(&op_graph(dt.name(), &["pow y"])).unwrap();
        let k = lower_whole(&g, "pow").unwrap();
        let t = |v: &[f64]| Tensor::new(vec![n], kiln_ir::tensor::Data::from_f64_iter(dt, v.iter().copied())).unwrap();
        let args = vec![t(&xs), t(&ys), Tensor::zeros(dt, vec![n])];
        let symbols = [n as i64];
        let mut want = args.clone();
        kernel::eval(&k, &mut want, &symbols).unwrap();
        emulate::with_emulated(std::slice::from_ref(&k), 64, |m| {
            compare_emulated(m, 0, &k, &args, &want, &symbols, &format!("{dt} pow specials"));
            let mut bufs = Buffers::new(&k, &args);
            let ptrs = bufs.pointers();
            // SAFETY: one buffer per launch argument, each of its full size; one value per symbol.
            unsafe { m.launch(0, &ptrs, &symbols, emulate::Grid { blocks: 1, threads: 64 }) };
            let got = bufs.tensors(&args)[2].to_f64_vec();
            for (i, (g, w)) in got.iter().zip(want[2].to_f64_vec()).enumerate() {
                if w == 0.0 || w.is_infinite() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{dt} pow({}, {}) is {g}, pow gives {w}", xs[i], ys[i]);
                }
            }
        })
        .unwrap();
    }
}

/// Runs `ops` on `dt` in emulation over a sweep of [-700, 700] (denser near 0) and special points, and checks
/// them against the exact-to-an-ulp f64 functions (Rust's and `libm`'s): NaN where they give NaN, zeros,
/// infinities and subnormals as they give them (up to a subnormal's worth), else within `bound` relative.
fn check_math_sweep(dt: kiln_ir::DType, ops: &[&str], bound: f64) {
    let g = kiln_ir::parse(&op_graph(dt.name(), ops)).unwrap();
    let k = lower_whole(&g, "math").unwrap();
    let xs: Vec<f64> = (0..4001)
        .map(|i| {
            let t = (i as f64 - 2000.0) / 2000.0;
            700.0 * t * t * t
        })
        .chain([1.0 + 1e-12, 1.0 - 1e-12, 1e-300, 4.9e-324, 0.09999, 0.10001, 0.4999, 0.5001, -0.999, 1e10, 3e300])
        .chain([1e20, -1e38, 3.4e38, 16_777_217.0, 1e6 + 0.5, 355.0, 103_993.0, -0.0])
        .chain([std::f64::consts::FRAC_PI_4, std::f64::consts::FRAC_PI_2, 1e100, -1e200, 1e300, 1.5 * 2f64.powi(1000)])
        .chain([f64::MAX, 6.28e307, 2f64.powi(990)])
        .chain((1..200).map(|i| i as f64 / 200.0))
        .collect();
    // The inputs as the dtype holds them.
    let input = Tensor::new(vec![xs.len()], kiln_ir::tensor::Data::from_f64_iter(dt, xs.iter().copied())).unwrap();
    let xs = input.to_f64_vec();
    let n = xs.len();
    let args: Vec<Tensor> = k
        .launch_args()
        .map(|(_, a)| match a.role {
            ArgRole::Input => input.clone(),
            _ => Tensor::zeros(a.dtype, vec![n]),
        })
        .collect();
    let smallest = if dt == kiln_ir::DType::F64 { f64::MIN_POSITIVE } else { f64::from(f32::MIN_POSITIVE) };
    let outputs = k.launch_args().filter(|(_, a)| a.role == ArgRole::Output).count();
    assert_eq!(outputs, ops.len());
    emulate::with_emulated(std::slice::from_ref(&k), 64, |m| {
        let mut bufs = Buffers::new(&k, &args);
        let ptrs = bufs.pointers();
        // SAFETY: one buffer per launch argument, each of its full size; one value per symbol.
        unsafe { m.launch(0, &ptrs, &[n as i64], emulate::Grid { blocks: 4, threads: 64 }) };
        let got = bufs.tensors(&args);
        for ((_, a), t) in k.launch_args().zip(&got) {
            if a.role != ArgRole::Output {
                continue;
            }
            let name = a.name.trim_end_matches(|c: char| c.is_ascii_digit());
            let op = ops.iter().find(|op| **op == name).unwrap();
            let mut worst = 0.0f64;
            for (&x, g) in xs.iter().zip(t.to_f64_vec()) {
                let want = match *op {
                    "exp" => x.exp(),
                    "log" => x.ln(),
                    "tanh" => x.tanh(),
                    "erf" => libm::erf(x),
                    "sinh" => libm::sinh(x),
                    "cosh" => libm::cosh(x),
                    "asinh" => libm::asinh(x),
                    "acosh" => libm::acosh(x),
                    "atanh" => libm::atanh(x),
                    "sin" => x.sin(),
                    "cos" => x.cos(),
                    "tan" => x.tan(),
                    "asin" => x.asin(),
                    "acos" => x.acos(),
                    "atan" => x.atan(),
                    _ => 1.0 / (1.0 + (-x).exp()),
                };
                // The exact value as the dtype rounds it (overflow to infinity, underflow to zero).
                let want = Tensor::new(vec![1], kiln_ir::tensor::Data::from_f64_iter(dt, std::iter::once(want)))
                    .unwrap()
                    .to_f64_vec()[0];
                if want.is_nan() {
                    assert!(g.is_nan(), "{dt} {op}({x}) is {g}, not NaN");
                    continue;
                }
                if want == 0.0 || want.is_infinite() || want.abs() < smallest {
                    assert!((g - want).abs() <= smallest || g == want, "{dt} {op}({x}) is {g}, want {want}");
                    continue;
                }
                worst = worst.max(((g - want) / want).abs());
            }
            eprintln!("{dt} {op}: largest relative error {worst:.2e}");
            assert!(worst < bound, "{dt} {op}: relative error {worst:e}");
        }
    })
    .unwrap();
}

#[test]
fn math_is_accurate_on_sweeps() {
    let ops =
        ["exp", "log", "tanh", "sigmoid", "erf", "sinh", "cosh", "asinh", "acosh", "atanh", "asin", "acos", "atan"];
    let all = [&ops[..], &["sin", "cos", "tan"][..]].concat();
    check_math_sweep(kiln_ir::DType::F64, &all, 1e-14);
    check_math_sweep(kiln_ir::DType::F32, &all, 5e-7);
}

#[test]
fn float_remainders_are_exact() {
    let values = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        3.0,
        -7.25,
        1e-40,
        -3e-39,
        1e-45,
        1e30,
        -3.4e38,
        1e-10,
        123456.789,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        2.5,
        1e15,
        7e-300,
        -1e300,
        0.1,
        6.0,
    ];
    for dt in [kiln_ir::DType::F32, kiln_ir::DType::F64] {
        let g = kiln_ir::parse(&op_graph(dt.name(), &["rem y", "mod y"])).unwrap();
        let k = lower_whole(&g, "remainders").unwrap();
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for &x in &values {
            for &y in &values {
                xs.push(x);
                ys.push(y);
            }
        }
        let n = xs.len();
        let t = |v: &[f64]| Tensor::new(vec![n], kiln_ir::tensor::Data::from_f64_iter(dt, v.iter().copied())).unwrap();
        let args: Vec<Tensor> = k
            .launch_args()
            .map(|(_, a)| match (a.role.clone(), a.name.as_str()) {
                (ArgRole::Input, "x") => t(&xs),
                (ArgRole::Input, _) => t(&ys),
                _ => Tensor::zeros(dt, vec![n]),
            })
            .collect();
        let symbols = [n as i64];
        let mut want = args.clone();
        kernel::eval(&k, &mut want, &symbols).unwrap();
        emulate::with_emulated(std::slice::from_ref(&k), 64, |m| {
            let mut bufs = Buffers::new(&k, &args);
            let ptrs = bufs.pointers();
            // SAFETY: one buffer per launch argument, each of its full size; one value per symbol.
            unsafe { m.launch(0, &ptrs, &symbols, emulate::Grid { blocks: 2, threads: 64 }) };
            let got = bufs.tensors(&args);
            for (((_, a), g), w) in k.launch_args().zip(&got).zip(&want) {
                if a.role != ArgRole::Output {
                    continue;
                }
                for (i, (g, w)) in g.to_f64_vec().into_iter().zip(w.to_f64_vec()).enumerate() {
                    let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
                    assert!(same, "{dt} {}({}, {}) is {g}, the evaluator gives {w}", a.name, xs[i], ys[i]);
                }
            }
        })
        .unwrap();
    }
}

/// The built-in kernels of the library ops (`kernel::builtin`: conv as im2col + bias fill or direct, pool,
/// gather), with a symbolic batch where they take one.
fn builtin_kernels() -> Vec<Kernel> {
    use kernel::builtin;
    use kiln_ir::op::{Conv, Gather, Pool, PoolKind};
    use kiln_ir::{DType, Dim, TensorType};
    let batched = |dims: &[u64]| {
        let mut t = TensorType::of(DType::F32, dims);
        t.shape.0[0] = Dim::Sym("batch".into());
        t
    };
    let f32s = |dims: &[u64]| TensorType::of(DType::F32, dims);
    let conv = |strides: &[i64], pads: &[i64], groups: i64| Conv {
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: vec![1; strides.len()],
        groups,
    };
    let pool = |kind, ceil_mode, count_include_pad| Pool {
        kind,
        kernel: vec![3, 3],
        strides: vec![2, 2],
        pads: vec![1, 0, 1, 1],
        dilations: vec![1, 1],
        ceil_mode,
        count_include_pad,
    };
    let gather_i64 = TensorType::new(DType::I64, kiln_ir::Shape(vec![Dim::Sym("batch".into()), Dim::Static(4)]));
    vec![
        builtin::conv_direct(
            "conv3x3_bias",
            &batched(&[1, 3, 6, 7]),
            &f32s(&[4, 3, 3, 3]),
            Some(&f32s(&[4])),
            &conv(&[1, 1], &[1, 1, 1, 1], 1),
            &batched(&[1, 4, 6, 7]),
        )
        .unwrap(),
        builtin::conv_direct(
            "conv_depthwise_s2",
            &f32s(&[2, 3, 5, 5]),
            &f32s(&[3, 1, 3, 3]),
            None,
            &conv(&[2, 2], &[1, 1, 1, 1], 3),
            &f32s(&[2, 3, 3, 3]),
        )
        .unwrap(),
        builtin::conv_direct(
            "conv1d_1x1",
            &f32s(&[2, 8, 5]),
            &f32s(&[6, 8, 1]),
            None,
            &conv(&[1], &[0, 0], 1),
            &f32s(&[2, 6, 5]),
        )
        .unwrap(),
        builtin::im2col(
            "im2col_7x7_s2",
            &batched(&[1, 3, 12, 12]),
            &f32s(&[8, 3, 7, 7]),
            &conv(&[2, 2], &[3, 3, 3, 3], 1),
            &batched(&[1, 147, 36]),
        )
        .unwrap(),
        builtin::bias_fill("bias_fill", &f32s(&[4]), &batched(&[1, 4, 3, 5])).unwrap(),
        builtin::pool(
            "max_pool_ceil",
            &batched(&[1, 2, 7, 8]),
            &pool(PoolKind::Max, true, false),
            &batched(&[1, 2, 4, 4]),
        )
        .unwrap(),
        builtin::pool("avg_pool_pads", &f32s(&[2, 2, 7, 8]), &pool(PoolKind::Avg, true, true), &f32s(&[2, 2, 4, 4]))
            .unwrap(),
        builtin::pool("avg_pool_real", &f32s(&[2, 2, 7, 8]), &pool(PoolKind::Avg, false, false), &f32s(&[2, 2, 4, 4]))
            .unwrap(),
        builtin::gather(
            "gather_rows",
            &f32s(&[10, 6]),
            &TensorType::of(DType::I64, &[2, 3]),
            &Gather { axis: 0 },
            &f32s(&[2, 3, 6]),
        )
        .unwrap(),
        builtin::gather(
            "gather_last_axis",
            &gather_i64,
            &TensorType::of(DType::I32, &[5]),
            &Gather { axis: -1 },
            &TensorType::new(DType::I64, kiln_ir::Shape(vec![Dim::Sym("batch".into()), Dim::Static(5)])),
        )
        .unwrap(),
        builtin::gather(
            "gather_embedding_bf16",
            &TensorType::of(DType::BF16, &[50_000, 8]),
            &TensorType::of(DType::I32, &[3, 5]),
            &Gather { axis: 0 },
            &TensorType::of(DType::BF16, &[3, 5, 8]),
        )
        .unwrap(),
    ]
}

#[test]
fn builtin_kernels_assemble_and_match_the_evaluator_in_emulation() {
    let ks = builtin_kernels();
    let ptxas = ptx::ptxas::find();
    for arch in PtxArch::ALL {
        let m = ptx::compile(&ks, &PtxOptions { arch, ..PtxOptions::default() }).unwrap_or_else(|e| panic!("{e}"));
        match &ptxas {
            Some(ptxas) => ptx::ptxas::assemble(ptxas, &m.ptx, arch, "builtin").unwrap_or_else(|e| panic!("{e}")),
            None => eprintln!("SKIPPED: ptxas not found: the built-in kernels are not assembled"),
        }
    }
    let (compared, _) = check_emulated("builtin", &ks);
    assert_eq!(compared, ks.len());
}

#[test]
fn gathers_wrap_and_clamp_their_indices_in_emulation() {
    use kernel::builtin;
    use kiln_ir::op::Gather;
    use kiln_ir::{DType, TensorType};
    // A table of 50 000 rows gathered by indices across [-n, n) and beyond, both index dtypes.
    let n = 50_000i64;
    let values: Vec<i64> =
        vec![0, -1, n - 1, -n, 7, -7, 123, -4567, n, -n - 1, i64::from(i32::MAX), i64::from(i32::MIN), 3, 2, 1];
    for index_dtype in [DType::I32, DType::I64] {
        let data = Tensor::random(DType::F32, vec![n as usize, 8], 3);
        let idx =
            Tensor::new(vec![3, 5], kiln_ir::tensor::Data::from_i64_iter(index_dtype, values.iter().copied())).unwrap();
        let out = TensorType::of(DType::F32, &[3, 5, 8]);
        let k = builtin::gather("gather", &data.tensor_type(), &idx.tensor_type(), &Gather { axis: 0 }, &out).unwrap();
        let args = vec![data, idx, Tensor::zeros(DType::F32, vec![3, 5, 8])];
        let mut want = args.clone();
        kernel::eval(&k, &mut want, &[]).unwrap();
        let ks = std::slice::from_ref(&k);
        if let Some(ptxas) = ptx::ptxas::find() {
            let m = ptx::compile(ks, &PtxOptions::default()).unwrap();
            ptx::ptxas::assemble(&ptxas, &m.ptx, PtxOptions::default().arch, "gather").unwrap();
            // The index is read with a global load and sign-extended (for i32) on the device too.
            assert!(m.ptx.contains("ld.global"), "{}", m.ptx);
        }
        emulate::with_emulated(ks, 64, |m| {
            compare_emulated(m, 0, &k, &args, &want, &[], &format!("gather by {index_dtype}"))
        })
        .unwrap();
    }
}

#[test]
fn contiguous_accesses_of_coarsened_parts_become_vector_loads_and_stores() {
    // A fused elementwise chain over rows of 8 (a multiple of four) with a per-column operand: four lanes per
    // thread, every access contiguous along the row, so LLVM merges them into `ld.global.v4`/`st.global.v4`.
    let text = r#"graph "ew" {
  %0 = input {name="x"} : f32[n,8]
  %1 = input {name="a"} : f32[8]
  %2 = input {name="r"} : f32[n,8]
  %3 = mul %0, %1 : f32[n,8]
  %4 = gelu %3 {approximate=none} : f32[n,8]
  %5 = add %4, %2 : f32[n,8]
  output "y" = %5
}
"#;
    let g = kiln_ir::parse(text).unwrap();
    let k = lower_whole(&g, "ew").unwrap();
    for arch in PtxArch::ALL {
        let m = ptx::compile(std::slice::from_ref(&k), &PtxOptions { arch, ..PtxOptions::default() }).unwrap();
        assert_eq!(m.ptx.matches("ld.global.v4.f32").count(), 3, "{}", m.ptx);
        assert_eq!(m.ptx.matches("st.global.v4.f32").count(), 1, "{}", m.ptx);
        // A quarter of the threads: four iterations each.
        assert_eq!(m.kernels[0].launch_geometry(&[64]).unwrap(), (1, ptx::DEFAULT_BLOCK_SIZE));
        assert_eq!(m.kernels[0].launch_geometry(&[1024]).unwrap(), (8, ptx::DEFAULT_BLOCK_SIZE));
    }
    // The same lanes in emulation: every row count, the grid rule's and a small one.
    check_graph("coarsened", text, &[0, 1, 3, 17]);
}
