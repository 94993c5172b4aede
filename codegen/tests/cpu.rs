//! The Cranelift emitter against the reference evaluator: every kernel runs through the JIT whole and in chunks
//! and must match `kernel::eval` (bitwise for integers and bools, within 1e-5 relative for floats, NaN equal to
//! NaN) on inputs full of edge values — NaN, ±inf, ±0, subnormals, integer extremes — at odd sizes. The lowering
//! tests (`lower.rs`, `fixtures.rs`) run every lowered kernel through the JIT too, via the shared harness.
//! Object code is linked with `cc -shared`, loaded with `libloading` and checked the same way.

mod common;

use common::{
    Buffers, Chunking, check_jit, check_jit_with, edge_args, edge_tensor, launch, lower_whole, one_loop_kernel,
};
use kiln_codegen::cpu::{self, CpuError, CpuFeatures, CpuOptions, JitModule, KernelFn, OptLevel, runtime};
use kiln_codegen::kernel::{self, ArgRole, Block, Expr, Extent, IExpr, Kernel, KernelArg, LoopKind, LoopVar, Stmt};
use kiln_ir::interp::scalar::Scalar;
use kiln_ir::op::UnaryOp;
use kiln_ir::{DType, Tensor, TensorType};

/// Lowers `text` and checks it through the JIT for each binding of its symbol `n`; inputs named `d*` get
/// [`safe_tensor`] values, others [`edge_tensor`] values.
fn check_graph(case: &str, text: &str, sizes: &[u64]) {
    check_graph_with(case, text, sizes, &CpuOptions::default());
}

/// [`check_graph`] with the emitter's options.
fn check_graph_with(case: &str, text: &str, sizes: &[u64], options: &CpuOptions) {
    let g = kiln_ir::parse(text).unwrap_or_else(|e| panic!("{case}: parse: {e}"));
    let k = lower_whole(&g, case).unwrap_or_else(|e| panic!("{case}: lower: {e}"));
    for &n in sizes {
        let symbols: Vec<i64> = k.symbols.iter().map(|_| n as i64).collect();
        for seed in [0, 5] {
            let args = edge_args(&k, &symbols, seed);
            check_jit_with(&format!("{case} [n={n}, seed {seed}]"), &k, &args, &symbols, options);
        }
    }
}

const ODD_SIZES: &[u64] = &[0, 1, 3, 5, 17, 67];

#[test]
fn f32_elementwise_kinds_on_edge_values() {
    let mut body = String::new();
    let mut outputs = String::new();
    let unary = [
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
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
        "floor",
        "ceil",
        "round",
        "sign",
    ];
    let mut id = 2;
    for u in unary {
        body.push_str(&format!("  %{id} = {u} %0 : f32[n]\n"));
        outputs.push_str(&format!("  output \"{u}\" = %{id}\n"));
        id += 1;
    }
    for b in ["add", "sub", "mul", "div", "max", "min", "pow", "mod", "rem"] {
        body.push_str(&format!("  %{id} = {b} %0, %1 : f32[n]\n"));
        outputs.push_str(&format!("  output \"{b}\" = %{id}\n"));
        id += 1;
    }
    let text = format!(
        "graph \"g\" {{\n  %0 = input {{name=\"x\"}} : f32[n]\n  %1 = input {{name=\"y\"}} : f32[n]\n{body}{outputs}}}"
    );
    check_graph("f32 elementwise", &text, ODD_SIZES);
}

#[test]
fn baseline_features_and_every_opt_level_match() {
    let text = r#"graph "g" {
      %0 = input {name="x"} : f32[n]
      %1 = input {name="y"} : f64[n]
      %2 = floor %0 : f32[n]
      %3 = round %0 : f32[n]
      %4 = ceil %1 : f64[n]
      %5 = round %1 : f64[n]
      %6 = exp %0 : f32[n]
      %7 = max %0, %2 : f32[n]
      %8 = cast %0 {to=i8} : i8[n]
      output "floor" = %2
      output "round" = %3
      output "ceil" = %4
      output "round64" = %5
      output "exp" = %6
      output "max" = %7
      output "i8" = %8
    }"#;
    for features in [CpuFeatures::Host, CpuFeatures::Baseline] {
        for opt_level in [OptLevel::None, OptLevel::Speed, OptLevel::SpeedAndSize] {
            let options = CpuOptions { opt_level, features };
            check_graph_with(&format!("rounding {options:?}"), text, &[1, 9, 17], &options);
        }
    }
}

#[test]
fn f32_chains_selects_and_comparisons() {
    check_graph(
        "f32 chain",
        r#"graph "g" {
          %0 = input {name="x"} : f32[n]
          %1 = input {name="y"} : f32[n]
          %2 = lt %0, %1 : bool[n]
          %3 = select %2, %0, %1 : f32[n]
          %4 = exp %3 : f32[n]
          %5 = mul %4, %0 : f32[n]
          %6 = max %5, %1 : f32[n]
          %7 = relu %6 : f32[n]
          %8 = ge %0, %1 : bool[n]
          %9 = is_nan %0 : bool[n]
          %10 = is_inf %1 : bool[n]
          %11 = or %9, %10 : bool[n]
          %12 = and %8, %11 : bool[n]
          %13 = gelu %0 {approximate=tanh} : f32[n]
          %14 = gelu %1 {approximate=none} : f32[n]
          output "chain" = %7
          output "mask" = %12
          output "gelu_tanh" = %13
          output "gelu" = %14
        }"#,
        ODD_SIZES,
    );
}

#[test]
fn f64_and_half_floats() {
    for dt in ["f64", "f16", "bf16"] {
        let text = format!(
            r#"graph "g" {{
              %0 = input {{name="x"}} : {dt}[n]
              %1 = input {{name="y"}} : {dt}[n]
              %2 = add %0, %1 : {dt}[n]
              %3 = mul %0, %1 : {dt}[n]
              %4 = div %0, %1 : {dt}[n]
              %5 = exp %0 : {dt}[n]
              %6 = tanh %1 : {dt}[n]
              %7 = max %0, %1 : {dt}[n]
              %8 = min %0, %1 : {dt}[n]
              %9 = sigmoid %0 : {dt}[n]
              %10 = round %0 : {dt}[n]
              %11 = mod %0, %1 : {dt}[n]
              %12 = erf %1 : {dt}[n]
              %13 = lt %0, %1 : bool[n]
              output "add" = %2
              output "mul" = %3
              output "div" = %4
              output "exp" = %5
              output "tanh" = %6
              output "max" = %7
              output "min" = %8
              output "sigmoid" = %9
              output "round" = %10
              output "mod" = %11
              output "erf" = %12
              output "lt" = %13
            }}"#
        );
        check_graph(&format!("{dt} elementwise"), &text, &[0, 1, 5, 17]);
    }
}

#[test]
fn casts_between_every_pair_of_dtypes() {
    for from in common::DTYPE_NAMES {
        check_graph(&format!("casts from {from}"), &common::casts_graph(from), &[1, 7, 19]);
    }
}

#[test]
fn integer_kinds_on_extremes() {
    for dt in ["i8", "u8", "i32", "i64"] {
        let mut body = String::new();
        let mut outputs = String::new();
        let mut id = 3;
        for b in [
            "add", "sub", "mul", "max", "min", "bit_and", "bit_or", "bit_xor", "shl", "shr", "lt", "le", "gt", "ge",
            "eq",
        ] {
            let out = if ["lt", "le", "gt", "ge", "eq"].contains(&b) { "bool" } else { dt };
            body.push_str(&format!("  %{id} = {b} %0, %1 : {out}[n]\n"));
            outputs.push_str(&format!("  output \"{b}\" = %{id}\n"));
            id += 1;
        }
        for b in ["div", "mod", "rem", "pow"] {
            body.push_str(&format!("  %{id} = {b} %0, %2 : {dt}[n]\n"));
            outputs.push_str(&format!("  output \"{b}\" = %{id}\n"));
            id += 1;
        }
        for u in ["neg", "abs", "sign", "relu", "bit_not", "floor"] {
            body.push_str(&format!("  %{id} = {u} %0 : {dt}[n]\n"));
            outputs.push_str(&format!("  output \"{u}\" = %{id}\n"));
            id += 1;
        }
        let text = format!(
            "graph \"g\" {{\n  %0 = input {{name=\"x\"}} : {dt}[n]\n  %1 = input {{name=\"y\"}} : {dt}[n]\n  %2 = input {{name=\"d\"}} : {dt}[n]\n{body}{outputs}}}"
        );
        check_graph(&format!("{dt} integer kinds"), &text, &[1, 6, 19, 40]);
    }
}

#[test]
fn reductions_with_nan_ties_and_odd_shapes() {
    check_graph(
        "reductions",
        r#"graph "g" {
          %0 = input {name="x"} : f32[n,5]
          %1 = reduce %0 {kind=sum, axes=[1], keep_dims=false} : f32[n]
          %2 = reduce %0 {kind=max, axes=[0], keep_dims=false} : f32[5]
          %3 = reduce %0 {kind=min, axes=[1], keep_dims=true} : f32[n,1]
          %4 = arg_reduce %0 {kind=max, axis=1, keep_dims=false, select_last_index=false} : i64[n]
          %5 = arg_reduce %0 {kind=min, axis=0, keep_dims=false, select_last_index=true} : i64[5]
          %6 = softmax %0 {axis=1} : f32[n,5]
          %7 = input {name="b"} : bool[n,3]
          %8 = reduce %7 {kind=max, axes=[1], keep_dims=false} : bool[n]
          %9 = input {name="i"} : i8[n,3]
          %10 = arg_reduce %9 {kind=max, axis=1, keep_dims=false, select_last_index=true} : i64[n]
          %11 = reduce %9 {kind=sum, axes=[0, 1], keep_dims=false} : i8[]
          output "sum" = %1
          output "max" = %2
          output "min" = %3
          output "argmax" = %4
          output "argmin" = %5
          output "softmax" = %6
          output "any" = %8
          output "iargmax" = %10
          output "isum" = %11
        }"#,
        &[0, 1, 3, 17],
    );
}

#[test]
fn layer_norm_transpose_and_broadcast_at_odd_sizes() {
    check_graph(
        "layer norm",
        r#"graph "g" {
          %0 = input {name="x"} : f32[n,7]
          %1 = input {name="s"} : f32[7]
          %2 = input {name="b"} : f32[7]
          %3 = layer_norm %0, %1, %2 {axis=-1, epsilon=1e-5} : f32[n,7]
          %4 = transpose %0 {perm=[1, 0]} : f32[7,n]
          %5 = input {name="c"} : f32[7,1]
          %6 = add %4, %5 : f32[7,n]
          output "ln" = %3
          output "t" = %6
        }"#,
        &[0, 1, 3, 5, 17],
    );
}

#[test]
fn large_elementwise_kernel_matches() {
    check_graph(
        "large",
        r#"graph "g" {
          %0 = input {name="x"} : f32[n]
          %1 = input {name="y"} : f32[n]
          %2 = mul %0, %1 : f32[n]
          %3 = add %2, %0 : f32[n]
          output "z" = %3
        }"#,
        &[100_003],
    );
}

#[test]
fn unsupported_and_malformed_kernels_are_errors() {
    let load = Expr::Load { arg: kernel::ArgId(0), index: IExpr::Var(LoopVar(0)) };
    let k = one_loop_kernel("int_exp", DType::I32, Expr::unary(UnaryOp::Exp, load.clone()));
    match JitModule::compile(&[k], &CpuOptions::default()) {
        Err(CpuError::Unsupported { kernel, what }) => {
            assert_eq!(kernel, "int_exp");
            assert!(what.contains("exp") && what.contains("i32"), "{what}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let k = one_loop_kernel("undefined", DType::F32, Expr::Var(kernel::Var(7)));
    let err = JitModule::compile(std::slice::from_ref(&k), &CpuOptions::default()).unwrap_err();
    assert!(matches!(&err, CpuError::Malformed { kernel, .. } if kernel == "undefined"), "{err}");
    assert!(cpu::emit_object(&[k], &CpuOptions::default()).is_err());
    let k = one_loop_kernel("mixed", DType::F32, Expr::Const(Scalar::I32(1)));
    assert!(matches!(JitModule::compile(&[k], &CpuOptions::default()), Err(CpuError::Malformed { .. })));
    // A store into an input, and a variable used outside the block that binds it.
    let mut k = one_loop_kernel("store_input", DType::F32, load.clone());
    k.body = Block(vec![Stmt::For {
        var: LoopVar(0),
        extent: IExpr::Sym(0),
        kind: LoopKind::Parallel,
        body: Block(vec![Stmt::Store { arg: kernel::ArgId(0), index: IExpr::Var(LoopVar(0)), value: load.clone() }]),
    }]);
    let store_err = JitModule::compile(&[k], &CpuOptions::default()).unwrap_err();
    assert!(store_err.to_string().contains("stores into `x`, which is not an output"), "{store_err}");
    let mut k = one_loop_kernel("scope", DType::F32, load.clone());
    let Stmt::For { body, .. } = &mut k.body.0[0] else { unreachable!() };
    body.0.insert(0, Stmt::Let { var: kernel::Var(0), dtype: DType::F32, value: load.clone() });
    k.body.0.push(Stmt::For {
        var: LoopVar(1),
        extent: IExpr::Sym(0),
        kind: LoopKind::Parallel,
        body: Block(vec![Stmt::Store {
            arg: kernel::ArgId(1),
            index: IExpr::Var(LoopVar(1)),
            value: Expr::Var(kernel::Var(0)),
        }]),
    });
    let scope_err = JitModule::compile(&[k], &CpuOptions::default()).unwrap_err();
    let is_scope_error =
        matches!(&scope_err, CpuError::Malformed { message, .. } if message.contains("v0 is not defined"));
    assert!(is_scope_error, "{scope_err}");
    // Through the crate's error type too.
    let e: kiln_codegen::Error = err.into();
    assert!(e.to_string().contains("undefined"), "{e}");
}

#[test]
fn parts_are_described_for_the_runtime() {
    let g = kiln_ir::parse(
        r#"graph "g" {
          %0 = input {name="x"} : f32[n,4]
          %1 = exp %0 : f32[n,4]
          %2 = reduce %0 {kind=sum, axes=[0, 1], keep_dims=false} : f32[]
          output "e" = %1
          output "s" = %2
        }"#,
    )
    .unwrap();
    let k = lower_whole(&g, "parts").unwrap();
    let jit = JitModule::compile(std::slice::from_ref(&k), &CpuOptions::default()).unwrap();
    let info = jit.info(0);
    assert_eq!(info.name, "parts");
    assert_eq!(jit.len(), 1);
    let parallel: Vec<bool> = info.parts.iter().map(|p| p.parallel).collect();
    assert!(parallel.contains(&true) && parallel.contains(&false), "{info:?}\n{}", kernel::print(&k));
    for p in &info.parts {
        assert!(p.cost_per_iteration >= 1);
        let n = p.trip_count(&[6]).unwrap();
        assert!(if p.parallel { n == 6 } else { n == 1 }, "{p:?}");
    }
    // KernelInfo round-trips through serde (the runtime stores it beside object code).
    let json = serde_json::to_string(info).unwrap();
    assert_eq!(&serde_json::from_str::<cpu::KernelInfo>(&json).unwrap(), info);
    // Out-of-range chunks and unknown parts do nothing harmful.
    let x = edge_tensor(DType::F32, vec![6, 4], 0);
    let args = vec![x, Tensor::zeros(DType::F32, vec![6, 4]), Tensor::zeros(DType::F32, vec![])];
    let mut bufs = Buffers::new(&k, &args);
    let ptrs = bufs.pointers();
    // SAFETY: the buffers match the kernel's launch arguments for n = 6.
    unsafe {
        (jit.entry(0))(ptrs.as_ptr(), [6i64].as_ptr(), 99, 0, 6);
        (jit.entry(0))(ptrs.as_ptr(), [6i64].as_ptr(), -1, 0, 6);
        (jit.entry(0))(ptrs.as_ptr(), [6i64].as_ptr(), 0, -5, 100);
    }
    check_jit("parts", &k, &args, &[6]);
}

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn jit_module_is_send_and_sync_and_disassembles() {
    assert_send_sync::<JitModule>();
    let g = kiln_ir::parse(
        r#"graph "g" {
          %0 = input {name="x"} : f32[n]
          %1 = input {name="y"} : f32[n]
          %2 = mul %0, %1 : f32[n]
          %3 = sqrt %2 : f32[n]
          output "z" = %3
        }"#,
    )
    .unwrap();
    let k = lower_whole(&g, "vec").unwrap();
    let text = cpu::disassemble(&k, &CpuOptions::default()).unwrap();
    assert!(text.contains("f32x4"), "{text}");
    assert!(text.contains("sqrt"), "{text}");
}

/// Links object code into a shared library with `cc`, loads it, and runs every kernel against the evaluator.
#[test]
fn object_code_links_loads_and_matches() {
    if std::process::Command::new("cc").arg("--version").output().is_err() {
        println!("SKIPPED: no cc");
        return;
    }
    let sources = [
        (
            "softmax",
            r#"graph "g" {
              %0 = input {name="x"} : f32[n,5]
              %1 = softmax %0 {axis=1} : f32[n,5]
              output "y" = %1
            }"#,
        ),
        (
            "consts and halves",
            r#"graph "g" {
              %0 = input {name="x"} : f16[n,3]
              %1 = constant {value=f16[3] [0.5, -1.0, 2.0]} : f16[3]
              %2 = mul %0, %1 : f16[n,3]
              %3 = tanh %2 : f16[n,3]
              %4 = cast %3 {to=f32} : f32[n,3]
              %5 = erf %4 : f32[n,3]
              output "y" = %5
            }"#,
        ),
    ];
    let kernels: Vec<Kernel> =
        sources.iter().map(|(name, text)| lower_whole(&kiln_ir::parse(text).unwrap(), name).unwrap()).collect();
    let (object, infos) = cpu::emit_object(&kernels, &CpuOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let obj = dir.path().join("k.o");
    let so = dir.path().join("k.so");
    std::fs::write(&obj, &object).unwrap();
    let out = std::process::Command::new("cc").arg("-shared").arg("-o").arg(&so).arg(&obj).output().unwrap();
    assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
    // SAFETY: the library is the object just emitted; it runs no initializers.
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    // SAFETY: the symbols are the table (an array of pointers) and its u64 length, as `emit_object` defines them.
    unsafe {
        let len = lib.get::<*const u64>(runtime::RUNTIME_TABLE_LEN_SYMBOL.as_bytes()).unwrap();
        assert_eq!(**len as usize, runtime::runtime_table().len());
        let table = lib.get::<*mut *const u8>(runtime::RUNTIME_TABLE_SYMBOL.as_bytes()).unwrap();
        runtime::install_runtime_table(*table);
    }
    for (k, info) in kernels.iter().zip(&infos) {
        // SAFETY: the symbol is a kernel entry with `KernelFn`'s signature.
        let f: KernelFn = unsafe { *lib.get::<KernelFn>(info.symbol.as_bytes()).unwrap() };
        for n in [0usize, 1, 5, 9] {
            let args: Vec<Tensor> = k
                .launch_args()
                .map(|(_, a)| {
                    let shape = vec![n, if a.dtype == DType::F16 || k.name == "consts and halves" { 3 } else { 5 }];
                    if a.role == ArgRole::Input {
                        edge_tensor(a.dtype, shape, n)
                    } else {
                        Tensor::zeros(a.dtype, shape)
                    }
                })
                .collect();
            let mut want = args.clone();
            kernel::eval(k, &mut want, &[n as i64]).unwrap();
            let mut bufs = Buffers::new(k, &args);
            launch(f, info, &mut bufs, &[n as i64], Chunking::Split);
            let got = bufs.tensors(&args);
            let (g, w) = (got.last().unwrap().to_f64_vec(), want.last().unwrap().to_f64_vec());
            for (i, (g, w)) in g.iter().zip(&w).enumerate() {
                let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-5 * g.abs().max(w.abs());
                assert!(ok, "{} [n={n}] element {i}: {g} vs {w}", k.name);
            }
        }
    }
}

/// The largest relative error of the JIT's `op` over `xs` against the evaluator (absolute error where the exact
/// value's magnitude is below `abs_floor`).
fn max_error(op: &str, xs: &[f32], abs_floor: f64) -> f64 {
    let text = format!(
        "graph \"g\" {{\n  %0 = input {{name=\"x\"}} : f32[n]\n  %1 = {op} %0 : f32[n]\n  output \"y\" = %1\n}}"
    );
    let k = lower_whole(&kiln_ir::parse(&text).unwrap(), op).unwrap();
    let n = xs.len();
    let args = vec![Tensor::from_vec(vec![n], xs.to_vec()).unwrap(), Tensor::zeros(DType::F32, vec![n])];
    let mut want = args.clone();
    kernel::eval(&k, &mut want, &[n as i64]).unwrap();
    let jit = JitModule::compile(std::slice::from_ref(&k), &CpuOptions::default()).unwrap();
    let mut bufs = Buffers::new(&k, &args);
    launch(jit.entry(0), jit.info(0), &mut bufs, &[n as i64], Chunking::Whole);
    let got = bufs.tensors(&args)[1].to_f64_vec();
    let mut worst: f64 = 0.0;
    for (g, w) in got.iter().zip(want[1].to_f64_vec()) {
        let err = if g.is_nan() && w.is_nan() || *g == w { 0.0 } else { (g - w).abs() / w.abs().max(abs_floor) };
        worst = worst.max(err);
    }
    worst
}

/// `n` points evenly spread over `[lo, hi]`.
fn sweep(lo: f32, hi: f32, n: usize) -> Vec<f32> {
    (0..n).map(|i| lo + (hi - lo) * i as f32 / (n - 1) as f32).collect()
}

#[test]
fn vector_approximations_stay_within_their_documented_bounds() {
    let n = 200_003;
    // erf's and tanh's rational functions are rounding-limited: one rounding per Horner step with FMA, two
    // without.
    let erf_bound = if kiln_codegen::cpu::host_supports("fma") { 3e-7 } else { 4e-7 };
    let tanh_bound = erf_bound;
    // exp and sigmoid: relative to the result, or to the smallest normal float where the result is subnormal (one
    // rounding to the subnormal grid).
    let tiny = f64::from(f32::MIN_POSITIVE);
    let specials = vec![f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0, -0.0, f32::MAX, f32::MIN];
    let cases: [(&str, Vec<f32>, f64, f64); 13] = [
        ("exp", sweep(-110.0, 95.0, n), 2e-7, tiny),
        ("exp", sweep(-1e30, 1e30, 2001), 0.0, tiny),
        ("exp", specials.clone(), 0.0, 0.0),
        ("sigmoid", sweep(-110.0, 110.0, n), 3e-7, tiny),
        ("sigmoid", sweep(-1e30, 1e30, 2001), 0.0, tiny),
        ("sigmoid", specials.clone(), 0.0, 0.0),
        ("tanh", sweep(-10.0, 10.0, n), tanh_bound, 0.0),
        ("tanh", sweep(-1e30, 1e30, 2001), 0.0, 0.0),
        ("tanh", specials, 0.0, 0.0),
        ("log", sweep(1e-30, 50.0, n), 2e-7, 0.0),
        ("log", sweep(0.5, 2.0, n), 2e-7, 0.5),
        ("erf", sweep(-5.0, 5.0, n), erf_bound, 0.0),
        ("erf", sweep(-1e30, 1e30, 2001), 0.0, 0.0),
    ];
    for (op, xs, bound, floor) in cases {
        let err = max_error(op, &xs, floor);
        assert!(err <= bound, "{op}: max error {err:e} above {bound:e}");
        println!("{op}: max error {err:e}");
    }
    // Tiny magnitudes, where the formulas change.
    let small: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 1.3e-3).collect();
    assert!(max_error("tanh", &small, 0.0) <= tanh_bound);
    assert!(max_error("erf", &small, 0.0) <= erf_bound);
}

#[test]
fn strided_stores_scatter_lane_by_lane() {
    // y[2i] = x[i] * 2, y[2i + 1] = -x[i]: stores with coefficient 2, one vectorizable loop.
    let i = || IExpr::Var(LoopVar(0));
    let x = Expr::Load { arg: kernel::ArgId(0), index: i() };
    let even = IExpr::times(IExpr::Const(2), i());
    let odd = IExpr::plus(IExpr::times(i(), IExpr::Const(2)), IExpr::Const(1));
    let k = Kernel {
        name: "scatter".into(),
        args: vec![
            KernelArg { name: "x".into(), dtype: DType::F32, shape: vec![Extent::Sym(0)], role: ArgRole::Input },
            KernelArg {
                name: "y".into(),
                dtype: DType::F32,
                shape: vec![Extent::Sym(0), Extent::Const(2)],
                role: ArgRole::Output,
            },
        ],
        symbols: vec!["n".into()],
        body: Block(vec![Stmt::For {
            var: LoopVar(0),
            extent: IExpr::Sym(0),
            kind: LoopKind::Vectorizable,
            body: Block(vec![
                Stmt::Store {
                    arg: kernel::ArgId(1),
                    index: even,
                    value: Expr::binary(kiln_ir::op::BinaryOp::Mul, x.clone(), Expr::Const(Scalar::F32(2.0))),
                },
                Stmt::Store { arg: kernel::ArgId(1), index: odd, value: Expr::unary(UnaryOp::Neg, x) },
            ]),
        }]),
    };
    let text = cpu::disassemble(&k, &CpuOptions::default()).unwrap();
    assert!(text.contains("f32x4"), "{text}");
    for n in [0usize, 1, 4, 7, 13] {
        let args = vec![edge_tensor(DType::F32, vec![n], n), Tensor::zeros(DType::F32, vec![n, 2])];
        check_jit(&format!("scatter [n={n}]"), &k, &args, &[n as i64]);
    }
}

/// Floor division and remainder of indices by constants — powers of two, the magic-multiply path, 1 — agree with
/// the reference evaluator on negative and positive numerators across the whole i64 range and around multiples.
#[test]
fn index_division_by_constants_floors_like_the_evaluator() {
    let divisors = [1i64, 2, 3, 4, 7, 56, 3136, 87808, 1_000_003, (1 << 40) + 3, i64::MAX];
    let i = || IExpr::Var(LoopVar(0));
    // Numerators i·step + offset (wrapping), so that n points sweep negative and positive values at every scale.
    let numerators = [(1i64, -40i64), (97, -3000), (1 << 40, -(1 << 45)), (0x7f4a_7c15_9e37_79b9, i64::MIN)];
    let mut stores = Vec::new();
    for (j, &(step, offset)) in numerators.iter().enumerate() {
        for (k, &c) in divisors.iter().enumerate() {
            let x = IExpr::Add(
                Box::new(IExpr::Mul(Box::new(i()), Box::new(IExpr::Const(step)))),
                Box::new(IExpr::Const(offset)),
            );
            let slot = (j * divisors.len() + k) as i64 * 2;
            let at = |o: i64| {
                IExpr::plus(
                    IExpr::times(i(), IExpr::Const(2 * (numerators.len() * divisors.len()) as i64)),
                    IExpr::Const(slot + o),
                )
            };
            let q = IExpr::FloorDiv(Box::new(x.clone()), Box::new(IExpr::Const(c)));
            let r = IExpr::Rem(Box::new(x), Box::new(IExpr::Const(c)));
            stores.push(Stmt::Store {
                arg: kernel::ArgId(0),
                index: at(0),
                value: Expr::Index { value: q, dtype: DType::I64 },
            });
            stores.push(Stmt::Store {
                arg: kernel::ArgId(0),
                index: at(1),
                value: Expr::Index { value: r, dtype: DType::I64 },
            });
        }
    }
    let per = 2 * (numerators.len() * divisors.len()) as u64;
    let k = Kernel {
        name: "divisions".into(),
        args: vec![KernelArg {
            name: "y".into(),
            dtype: DType::I64,
            shape: vec![Extent::Sym(0), Extent::Const(per)],
            role: ArgRole::Output,
        }],
        symbols: vec!["n".into()],
        body: Block(vec![Stmt::For {
            var: LoopVar(0),
            extent: IExpr::Sym(0),
            kind: LoopKind::Parallel,
            body: Block(stores),
        }]),
    };
    for n in [1usize, 100, 4099] {
        let args = vec![Tensor::zeros(DType::I64, vec![n, per as usize])];
        check_jit(&format!("divisions [n={n}]"), &k, &args, &[n as i64]);
    }
}

#[test]
fn chunks_of_a_parallel_part_run_concurrently() {
    let g = kiln_ir::parse(
        r#"graph "g" {
          %0 = input {name="x"} : f32[n,33]
          %1 = exp %0 : f32[n,33]
          %2 = reduce %1 {kind=sum, axes=[1], keep_dims=false} : f32[n]
          output "s" = %2
        }"#,
    )
    .unwrap();
    let k = lower_whole(&g, "threads").unwrap();
    let n = 101usize;
    let x = Tensor::from_vec(vec![n, 33], sweep(-20.0, 20.0, n * 33)).unwrap();
    let args = vec![x, Tensor::zeros(DType::F32, vec![n])];
    let mut want = args.clone();
    kernel::eval(&k, &mut want, &[n as i64]).unwrap();
    let jit = JitModule::compile(std::slice::from_ref(&k), &CpuOptions::default()).unwrap();
    assert_eq!(jit.info(0).parts.len(), 1);
    assert!(jit.info(0).parts[0].parallel);
    let mut bufs = Buffers::new(&k, &args);
    // Raw pointers are not Send; the addresses are, and every chunk writes its own rows.
    let ptrs: Vec<usize> = bufs.pointers().into_iter().map(|p| p as usize).collect();
    let (jit, syms) = (&jit, [n as i64]);
    std::thread::scope(|s| {
        for t in 0..4i64 {
            let ptrs = ptrs.clone();
            s.spawn(move || {
                let ptrs: Vec<*mut u8> = ptrs.into_iter().map(|p| p as *mut u8).collect();
                let (begin, end) = (t * n as i64 / 4, (t + 1) * n as i64 / 4);
                // SAFETY: the buffers outlive the scope; chunks write disjoint rows.
                unsafe { (jit.entry(0))(ptrs.as_ptr(), syms.as_ptr(), 0, begin, end) };
            });
        }
    });
    let got = bufs.tensors(&args);
    // The sums fold in the interpreter's order; only the vector `exp` may differ, in the last bits.
    for (g, w) in got[1].to_f64_vec().iter().zip(want[1].to_f64_vec()) {
        assert!((g - w).abs() <= 1e-6 * w.abs(), "{g} vs {w}");
    }
}

/// `n` rows of `w` values for reductions over the last axis: sweeps of mixed sign and magnitude, with a NaN,
/// a +inf, a -inf or nothing but -inf in some rows.
fn rows_with_specials(n: usize, w: usize) -> Tensor {
    let mut v: Vec<f32> = sweep(-30.0, 30.0, n * w).iter().enumerate().map(|(i, x)| x * (1 + i % 7) as f32).collect();
    for (r, row) in v.chunks_mut(w).enumerate() {
        match r % 5 {
            1 => row[r % w] = f32::NAN,
            2 => row[(7 * r) % w] = f32::INFINITY,
            3 => row[w - 1] = f32::NEG_INFINITY,
            4 => row.fill(f32::NEG_INFINITY),
            _ => {}
        }
    }
    Tensor::from_vec(vec![n, w], v).unwrap()
}

/// Runs `k` through the JIT and the evaluator on `args` and asserts equal bits (any NaN equal to any NaN) in every
/// output but those named in `rounded` (sums, whose order the vector form changes), which must agree within the
/// absolute bound given per element.
fn assert_bit_exact(case: &str, k: &Kernel, args: &[Tensor], symbols: &[i64], rounded: &[(&str, Vec<f64>)]) {
    let mut want = args.to_vec();
    kernel::eval(k, &mut want, symbols).unwrap();
    let jit = JitModule::compile(std::slice::from_ref(k), &CpuOptions::default()).unwrap();
    let mut bufs = Buffers::new(k, args);
    launch(jit.entry(0), jit.info(0), &mut bufs, symbols, Chunking::Whole);
    let got = bufs.tensors(args);
    for (((_, a), g), w) in k.launch_args().zip(&got).zip(&want) {
        if a.role == ArgRole::Output {
            let bound = rounded.iter().find(|(name, _)| *name == a.name).map(|(_, b)| b);
            for (i, (g, w)) in g.to_f64_vec().into_iter().zip(w.to_f64_vec()).enumerate() {
                let same = g.is_nan() && w.is_nan()
                    || g.to_bits() == w.to_bits()
                    || bound.is_some_and(|b| (g - w).abs() <= b[i]);
                assert!(same, "{case}: {} element {i} is {g}, the evaluator gives {w}\n{}", a.name, kernel::print(k));
            }
        }
    }
}

#[test]
fn vector_reductions_match_the_evaluator() {
    // Exact kinds only (no exp): max, min and products fold to the evaluator's bits; sums are reassociated into
    // four lanes and so agree within summation rounding (`check_jit`'s tolerance).
    let exact = r#"graph "g" {
      %0 = input {name="x"} : f32[n,W]
      %1 = input {name="s"} : f32[n,W]
      %2 = mul %0, %1 : f32[n,W]
      %3 = reduce %2 {kind=sum, axes=[1], keep_dims=false} : f32[n]
      %4 = reduce %0 {kind=max, axes=[1], keep_dims=false} : f32[n]
      %5 = reduce %0 {kind=min, axes=[1], keep_dims=false} : f32[n]
      %6 = reduce %1 {kind=prod, axes=[1], keep_dims=false} : f32[n]
      %7 = reduce %0 {kind=sum, axes=[0], keep_dims=false} : f32[W]
      %8 = reduce %0 {kind=max, axes=[0], keep_dims=false} : f32[W]
      output "sum" = %3
      output "max" = %4
      output "min" = %5
      output "prod" = %6
      output "colsum" = %7
      output "colmax" = %8
    }"#;
    // With exp: softmax and a sum of exps, within the approximation's bound of the evaluator.
    let approx = r#"graph "g" {
      %0 = input {name="x"} : f32[n,W]
      %1 = softmax %0 {axis=1} : f32[n,W]
      %2 = exp %0 : f32[n,W]
      %3 = reduce %2 {kind=sum, axes=[1], keep_dims=false} : f32[n]
      output "softmax" = %1
      output "sumexp" = %3
    }"#;
    let n = 11;
    for w in [1usize, 3, 4, 5, 128, 131] {
        let x = rows_with_specials(n, w);
        let s = Tensor::from_vec(vec![n, w], sweep(0.8, 1.25, n * w)).unwrap();
        for (case, text) in [("exact", exact), ("approx", approx)] {
            let g = kiln_ir::parse(&text.replace('W', &w.to_string())).unwrap();
            let k = lower_whole(&g, case).unwrap();
            let mut args = vec![x.clone()];
            if case == "exact" {
                args.push(s.clone());
            }
            args.extend(k.launch_args().filter(|(_, a)| a.role == ArgRole::Output).map(|(_, a)| {
                let shape = a.shape.iter().map(|e| if let Extent::Const(c) = e { *c as usize } else { n }).collect();
                Tensor::zeros(a.dtype, shape)
            }));
            let case = format!("{case} reductions [w={w}]");
            if case.starts_with("exact") {
                // A sum's bound: four-lane reassociation rounds within a few ulps of the magnitudes summed.
                let (xv, sv) = (x.to_f64_vec(), s.to_f64_vec());
                let ulp = f64::from(f32::EPSILON);
                let row_bound: Vec<f64> = (0..n)
                    .map(|r| 2.0 * w as f64 * ulp * (0..w).map(|j| (xv[r * w + j] * sv[r * w + j]).abs()).sum::<f64>())
                    .collect();
                let col_bound: Vec<f64> =
                    (0..w).map(|j| 2.0 * n as f64 * ulp * (0..n).map(|r| xv[r * w + j].abs()).sum::<f64>()).collect();
                assert_bit_exact(&case, &k, &args, &[n as i64], &[("sum", row_bound), ("colsum", col_bound)]);
            } else {
                check_jit(&case, &k, &args, &[n as i64]);
            }
        }
    }
}

/// The code for `reduce %0 {kind}` over the rows of an `n x 128` input of `dtype` (or `arg_reduce` when `arg`).
fn row_reduction_code(dtype: &str, kind: &str, arg: bool) -> (Kernel, String) {
    let op = if arg {
        format!("arg_reduce %0 {{kind={kind}, axis=1, keep_dims=false, select_last_index=false}} : i64[n]")
    } else {
        format!("reduce %0 {{kind={kind}, axes=[1], keep_dims=false}} : {dtype}[n]")
    };
    let text =
        format!("graph \"g\" {{\n  %0 = input {{name=\"x\"}} : {dtype}[n,128]\n  %1 = {op}\n  output \"r\" = %1\n}}");
    let k = lower_whole(&kiln_ir::parse(&text).unwrap(), kind).unwrap();
    let code = cpu::disassemble(&k, &CpuOptions::default()).unwrap();
    (k, code)
}

#[test]
fn only_f32_value_reductions_take_the_vector_form() {
    let (_, code) = row_reduction_code("f32", "sum", false);
    assert!(code.contains("f32x4") && code.contains("extractlane"), "{code}");
    for (dtype, kind, arg) in [("i32", "sum", false), ("f32", "max", true), ("f64", "sum", false)] {
        let (k, code) = row_reduction_code(dtype, kind, arg);
        assert!(!code.contains("f32x4") && !code.contains("extractlane"), "{dtype} {kind}: {code}");
        let x = edge_tensor(DType::from_name(dtype).unwrap(), vec![7, 128], 3);
        let out_dtype = if arg { DType::I64 } else { x.dtype() };
        check_jit(&format!("scalar {dtype} {kind}"), &k, &[x, Tensor::zeros(out_dtype, vec![7])], &[7]);
    }
}

// ---- indirect indexing ----------------------------------------------------------------------------------------

/// Indices of `shape` of `dtype` cycling through `[-n, n)`, negative ones included.
fn wrapping_indices(dtype: DType, shape: Vec<usize>, n: usize, seed: usize) -> Tensor {
    let count: usize = shape.iter().product();
    let values = (0..count).map(|i| ((i * 7919 + seed * 31) % (2 * n)) as i64 - n as i64);
    Tensor::new(shape, kiln_ir::tensor::Data::from_i64_iter(dtype, values)).unwrap()
}

#[test]
fn builtin_gather_jit_matches_the_evaluator() {
    use kiln_codegen::kernel::builtin;
    use kiln_ir::op::Gather;
    // (data dtype, data shape, axis, indices shape): an embedding table (rows of 8 and 37, so vector groups and
    // a scalar tail), a gather along an inner axis, rows of one element, and a scalar index.
    let cases: &[(DType, &[usize], i64, &[usize])] = &[
        (DType::F32, &[50_000, 8], 0, &[3, 5]),
        (DType::F32, &[1000, 37], 0, &[4]),
        (DType::F32, &[3, 9, 5], 1, &[2, 2]),
        (DType::F32, &[6, 7], 1, &[5]),
        (DType::I64, &[10, 3], -2, &[]),
        (DType::BF16, &[64, 12], 0, &[3]),
    ];
    for (c, &(dtype, shape, axis, idx_shape)) in cases.iter().enumerate() {
        let g = Gather { axis };
        let n = shape[kiln_ir::types::normalize_axis(axis, shape.len()).unwrap()];
        for index_dtype in [DType::I32, DType::I64] {
            let data = edge_tensor(dtype, shape.to_vec(), c);
            let idx = wrapping_indices(index_dtype, idx_shape.to_vec(), n, c);
            let out =
                kiln_ir::infer::infer(&kiln_ir::op::Op::Gather(g.clone()), &[data.tensor_type(), idx.tensor_type()])
                    .unwrap()
                    .remove(0);
            let k = builtin::gather("gather", &data.tensor_type(), &idx.tensor_type(), &g, &out).unwrap();
            let out_shape: Vec<usize> = out.shape.0.iter().map(|d| d.as_static().unwrap() as usize).collect();
            let args = vec![data, idx, Tensor::zeros(dtype, out_shape)];
            let case = format!("gather {dtype}{shape:?} axis {axis} by {index_dtype}{idx_shape:?}");
            check_jit(&case, &k, &args, &[]);
            assert_bit_exact(&case, &k, &args, &[], &[]);
        }
    }
    // The table's rows are contiguous and the index read is invariant in the row loop: vector loads and stores.
    let data = TensorType::of(DType::F32, &[50_000, 8]);
    let idx = TensorType::of(DType::I64, &[3, 5]);
    let k =
        builtin::gather("gather", &data, &idx, &Gather { axis: 0 }, &TensorType::of(DType::F32, &[3, 5, 8])).unwrap();
    let code = cpu::disassemble(&k, &CpuOptions::default()).unwrap();
    assert!(code.contains("f32x4") && !code.contains("insertlane"), "{code}");
}

/// `y[i] = x[clamp(idx[i])]` in one vectorizable loop: the read's index moves with the loop variable.
fn lane_gather_kernel(index_dtype: DType) -> Kernel {
    let i = || IExpr::Var(LoopVar(0));
    let read = IExpr::read(kernel::ArgId(1), i());
    let row = IExpr::max(IExpr::min(read, IExpr::minus(IExpr::Sym(1), IExpr::Const(1))), IExpr::Const(0));
    let arg =
        |name: &str, dtype, sym, role| KernelArg { name: name.into(), dtype, shape: vec![Extent::Sym(sym)], role };
    Kernel {
        name: "lane_gather".into(),
        args: vec![
            arg("x", DType::F32, 1, ArgRole::Input),
            arg("idx", index_dtype, 0, ArgRole::Input),
            arg("y", DType::F32, 0, ArgRole::Output),
        ],
        symbols: vec!["n".into(), "m".into()],
        body: Block(vec![Stmt::For {
            var: LoopVar(0),
            extent: IExpr::Sym(0),
            kind: LoopKind::Vectorizable,
            body: Block(vec![Stmt::Store {
                arg: kernel::ArgId(2),
                index: i(),
                value: Expr::binary(
                    kiln_ir::op::BinaryOp::Mul,
                    Expr::Load { arg: kernel::ArgId(0), index: row },
                    Expr::Const(Scalar::F32(3.0)),
                ),
            }]),
        }]),
    }
}

#[test]
fn reads_at_a_varying_index_go_lane_by_lane() {
    for index_dtype in [DType::I32, DType::I64] {
        let k = lane_gather_kernel(index_dtype);
        let code = cpu::disassemble(&k, &CpuOptions::default()).unwrap();
        // Still the vector form: arithmetic and store in f32x4, the loads gathered lane by lane.
        assert!(code.contains("f32x4") && code.contains("insertlane"), "{code}");
        let m = 23;
        for n in [0usize, 1, 4, 7, 13] {
            let idx = Tensor::new(
                vec![n],
                kiln_ir::tensor::Data::from_i64_iter(index_dtype, (0..n as i64).map(|i| (i * 5) % 30 - 3)),
            )
            .unwrap();
            let args = vec![edge_tensor(DType::F32, vec![m], n), idx, Tensor::zeros(DType::F32, vec![n])];
            check_jit(&format!("lane gather by {index_dtype} [n={n}]"), &k, &args, &[n as i64, m as i64]);
        }
    }
}

#[test]
fn reads_from_non_index_buffers_are_malformed() {
    for (dtype, role) in [(DType::F32, ArgRole::Input), (DType::I64, ArgRole::Output)] {
        let mut k = lane_gather_kernel(DType::I64);
        k.args[1].dtype = dtype;
        k.args[1].role = role.clone();
        let err = JitModule::compile(&[k], &CpuOptions::default()).unwrap_err();
        assert!(matches!(&err, CpuError::Malformed { kernel, .. } if kernel == "lane_gather"), "{err}");
    }
}

/// `max`/`min` against a constant take the short select form in vector loops, and still give the evaluator's
/// bits on every edge value: NaN, ±0 (max(-0, +0) is +0, min(+0, -0) is -0), infinities, the constant itself.
/// `g` lowered whole; its code must contain each of `expect` (the vector instructions the case is about).
fn lower_vectorized(g: &kiln_ir::Graph, case: &str, expect: &[&str]) -> Kernel {
    let k = lower_whole(g, case).unwrap();
    let code = cpu::disassemble(&k, &CpuOptions::default()).unwrap();
    for what in expect {
        assert!(code.contains(what), "{case}: no {what} in\n{code}");
    }
    k
}

#[test]
fn clamps_to_constants_are_exact() {
    let g = kiln_ir::parse(
        r#"graph "g" {
          %0 = input {name="x"} : f32[n]
          %1 = constant {value=f32[] [0.0]} : f32[]
          %2 = constant {value=f32[] [-0.0]} : f32[]
          %3 = constant {value=f32[] [255.0]} : f32[]
          %4 = constant {value=f32[] [-2.5]} : f32[]
          %5 = max %0, %1 : f32[n]
          %6 = max %2, %0 : f32[n]
          %7 = min %0, %3 : f32[n]
          %8 = min %1, %0 : f32[n]
          %9 = min %0, %2 : f32[n]
          %10 = max %4, %0 : f32[n]
          %11 = min %10, %3 : f32[n]
          output "max_pos_zero" = %5
          output "max_neg_zero" = %6
          output "min_255" = %7
          output "min_pos_zero" = %8
          output "min_neg_zero" = %9
          output "clip" = %11
        }"#,
    )
    .unwrap();
    let k = lower_vectorized(&g, "clamps", &["f32x4"]);
    for n in [1usize, 4, 37, 64] {
        let x = edge_tensor(DType::F32, vec![n], n);
        let mut args = vec![x];
        args.extend(
            k.launch_args().filter(|(_, a)| a.role == ArgRole::Output).map(|_| Tensor::zeros(DType::F32, vec![n])),
        );
        assert_bit_exact(&format!("clamps [n={n}]"), &k, &args, &[n as i64], &[]);
    }
}

#[test]
fn quantization_chains_run_in_integer_lanes() {
    // What QuantizeLinear → DequantizeLinear lower to (f32 → saturating u8 → i32 − zero point → f32), 8-bit
    // loads dequantized, saturating and wrapping casts, and i32 arithmetic: one vectorizable loop, bit-exact.
    let g = kiln_ir::parse(
        r#"graph "g" {
          %0 = input {name="x"} : f32[n]
          %1 = input {name="q"} : u8[n]
          %2 = input {name="s"} : i8[n]
          %3 = input {name="i"} : i32[n]
          %4 = constant {value=f32[] [0.0123]} : f32[]
          %5 = constant {value=f32[] [3.0]} : f32[]
          %6 = constant {value=f32[] [255.0]} : f32[]
          %7 = constant {value=f32[] [0.0]} : f32[]
          %8 = constant {value=i32[] [3]} : i32[]
          %9 = div %0, %4 : f32[n]
          %10 = round %9 : f32[n]
          %11 = add %10, %5 : f32[n]
          %12 = min %11, %6 : f32[n]
          %13 = max %12, %7 : f32[n]
          %14 = cast %13 {to=u8} : u8[n]
          %15 = cast %14 {to=i32} : i32[n]
          %16 = sub %15, %8 : i32[n]
          %17 = cast %16 {to=f32} : f32[n]
          %18 = mul %17, %4 : f32[n]
          %19 = cast %1 {to=i32} : i32[n]
          %20 = sub %19, %8 : i32[n]
          %21 = cast %20 {to=f32} : f32[n]
          %22 = cast %2 {to=f32} : f32[n]
          %23 = cast %0 {to=i8} : i8[n]
          %24 = cast %0 {to=i32} : i32[n]
          %25 = mul %3, %3 : i32[n]
          %26 = add %25, %8 : i32[n]
          %27 = max %26, %3 : i32[n]
          %28 = cast %27 {to=u8} : u8[n]
          %29 = cast %3 {to=i8} : i8[n]
          %30 = cast %2 {to=u8} : u8[n]
          output "fake_quant" = %18
          output "quantized" = %14
          output "dequant_u8" = %21
          output "dequant_i8" = %22
          output "to_i8" = %23
          output "to_i32" = %24
          output "wrap_u8" = %28
          output "wrap_i8" = %29
          output "i8_as_u8" = %30
        }"#,
    )
    .unwrap();
    let k = lower_vectorized(
        &g,
        "quant",
        &["fcvt_to_sint_sat.i32x4", "uwiden_low", "swiden_low", "fcvt_from_sint.f32x4", "sshr v"],
    );
    for n in [1usize, 4, 7, 37, 64] {
        for seed in [0, 3] {
            let args = edge_args(&k, &[n as i64], seed);
            assert_bit_exact(&format!("quant [n={n}, seed {seed}]"), &k, &args, &[n as i64], &[]);
        }
    }
}

#[test]
fn strided_byte_accesses_go_lane_by_lane() {
    // y[2i] = u8(x[2i + 1]), as a transposing dequantize-requantize step would: 8-bit loads and stores with
    // coefficient 2 inside one vectorizable loop.
    let i = || IExpr::Var(LoopVar(0));
    let odd = IExpr::plus(IExpr::times(i(), IExpr::Const(2)), IExpr::Const(1));
    let even = IExpr::times(IExpr::Const(2), i());
    let moved = |index: IExpr| {
        let wide = Expr::Cast(Box::new(Expr::Load { arg: kernel::ArgId(0), index }), DType::I32);
        let sum = Expr::binary(kiln_ir::op::BinaryOp::Add, wide, Expr::Const(Scalar::I32(200)));
        Expr::Cast(Box::new(sum), DType::U8)
    };
    let pair = |name: &str, role| KernelArg {
        name: name.into(),
        dtype: DType::U8,
        shape: vec![Extent::Sym(0), Extent::Const(2)],
        role,
    };
    let k = Kernel {
        name: "bytes".into(),
        args: vec![pair("x", ArgRole::Input), pair("y", ArgRole::Output)],
        symbols: vec!["n".into()],
        body: Block(vec![Stmt::For {
            var: LoopVar(0),
            extent: IExpr::Sym(0),
            kind: LoopKind::Vectorizable,
            body: Block(vec![
                Stmt::Store { arg: kernel::ArgId(1), index: even.clone(), value: moved(odd.clone()) },
                Stmt::Store { arg: kernel::ArgId(1), index: odd, value: moved(even) },
            ]),
        }]),
    };
    let text = cpu::disassemble(&k, &CpuOptions::default()).unwrap();
    assert!(text.contains("i32x4"), "{text}");
    for n in [0usize, 1, 4, 7, 13] {
        let args = vec![edge_tensor(DType::U8, vec![n, 2], n), Tensor::zeros(DType::U8, vec![n, 2])];
        check_jit(&format!("bytes [n={n}]"), &k, &args, &[n as i64]);
    }
}
