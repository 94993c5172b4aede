//! Backend plugins end to end: the Rust example plugin (`plugins/elementwise`, a cdylib) and a C plugin
//! (`tests/plugins/reduce_plugin.c`), loaded through the registry's `KILN_BACKEND_PLUGINS` spec format, checked
//! against the reference interpreter; broken plugins (no entry symbol, wrong ABI version or struct size, failing
//! runs, a panic) each give a clear error and leave the host working; `kiln backends` reads the real env var in a
//! child process (so no test here mutates this process's environment).
//!
//! Building the plugins:
//! - The Rust plugin is a workspace member, but `cargo test`/`cargo nextest` build test targets only, so this
//!   file runs `cargo build -p kiln-plugin-elementwise` for the profile it was built with (a no-op when the
//!   library is fresh). Within a process a `OnceLock` builds once; across processes (nextest runs each test in
//!   its own) cargo's lock on the build directory serializes the builds.
//! - The C plugins are compiled with the system C compiler (`$CC`, else `cc`) straight through
//!   `std::process::Command`: the `cc` crate is made for build scripts (it reads `TARGET`, `OPT_LEVEL`, … that
//!   cargo sets only there), and one compiler call needs no extra dependency. Each library is written under a
//!   temporary name and renamed into `target/<profile>/kiln-test-plugins/`, so concurrent test processes never
//!   load a half-written file. A machine without a C compiler fails these tests, saying so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use kiln_ir::op::{BinaryOp, Softmax, UnaryOp};
use kiln_ir::{DType, Op, Tensor};
use kiln_runtime::RunError;
use kiln_runtime::contract::{Backend, Node};
use kiln_runtime::registry::{BackendRegistry, COMPILED_CPU_BACKEND};

/// The node name that makes the Rust plugin panic on purpose (its documented containment test hook).
const PANIC_HOOK_NODE: &str = "__kiln_plugin_test_panic__";

/// `target/<profile>`, from this test binary's place (`target/<profile>/deps/plugins-…`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test binary>").to_path_buf()
}

/// The Rust example plugin, built for this test binary's profile if missing or stale.
fn elementwise_plugin() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let profile_dir = profile_dir();
        let target_dir = profile_dir.parent().expect("target dir");
        let profile = profile_dir.file_name().and_then(|n| n.to_str()).expect("profile dir name");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(&cargo);
        cmd.args(["build", "-p", "kiln-plugin-elementwise", "--target-dir"]).arg(target_dir);
        match profile {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            other => {
                cmd.args(["--profile", other]);
            }
        }
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
        eprintln!("building the Rust example plugin: {cmd:?}");
        let status = cmd.status().unwrap_or_else(|e| panic!("running {cargo}: {e}"));
        assert!(status.success(), "building kiln-plugin-elementwise failed ({status})");
        let lib = profile_dir.join(format!(
            "{}kiln_plugin_elementwise{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        ));
        assert!(lib.exists(), "{} was not built", lib.display());
        lib
    })
}

/// A C plugin from `tests/plugins/<source>` compiled with `defines`, as `<name>.so` (built once per process).
fn c_plugin(name: &str, source: &str, defines: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<BTreeMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(name) {
        return p.clone();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = profile_dir().join("kiln-test-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{name}{}", std::env::consts::DLL_SUFFIX));
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=c11", "-O1", "-Wall", "-Wextra", "-shared", "-fPIC", "-I"])
        .arg(root.join("runtime/include"))
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg(root.join("tests/plugins").join(source))
        .arg("-o")
        .arg(&tmp)
        .arg("-lm");
    let output = cmd.output().unwrap_or_else(|e| panic!("these tests need a C compiler (`{cc}`, or set CC): {e}"));
    assert!(output.status.success(), "{cmd:?} failed:\n{}", String::from_utf8_lossy(&output.stderr));
    std::fs::rename(&tmp, &out).unwrap();
    built.insert(name.to_string(), out.clone());
    out
}

fn reduce_plugin() -> PathBuf {
    c_plugin("reduce_plugin", "reduce_plugin.c", &[])
}

/// A spec entry for the registry, in the seed's grammar: `name@priority=path`.
fn spec(name: &str, path: &Path, priority: i32) -> String {
    format!("{name}@{priority}={}", path.display())
}

/// The registry with both example plugins: elementwise above the reference backend, the C one below.
fn registry_with_plugins() -> BackendRegistry {
    let mut r = BackendRegistry::with_defaults();
    let list = format!("{};{}", spec("ew", elementwise_plugin(), 5), spec("reduce", &reduce_plugin(), -1));
    assert_eq!(r.load_plugins_from_spec(&list).unwrap(), 2);
    r
}

/// Inputs with negative and positive values (the seed's floats are in [-1, 1); scale for exp/tanh/div).
fn random(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let t = Tensor::random(DType::F32, shape.to_vec(), seed);
    let v: Vec<f32> = t.as_slice::<f32>().unwrap().iter().map(|x| x * scale).collect();
    Tensor::from_vec(shape.to_vec(), v).unwrap()
}

/// Runs `op` on `backend` and on the interpreter and compares (same shapes and dtypes; values within
/// `rtol`·|want| + `atol`).
fn check_against_interpreter(backend: &dyn Backend, op: Op, inputs: &[Tensor], rtol: f32, atol: f32) {
    let what = format!("{} on {:?}", op.mnemonic(), inputs.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>());
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let want = kiln_ir::interp::eval_op(&op, &refs).unwrap();
    let got = backend.run_with_cache(&Node::op("n", op), inputs, None, 0).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(got.outputs.len(), want.len(), "{what}");
    for (g, w) in got.outputs.iter().zip(&want) {
        assert_eq!((g.dtype(), g.shape()), (w.dtype(), w.shape()), "{what}");
        for (i, (a, b)) in g.as_slice::<f32>().unwrap().iter().zip(w.as_slice::<f32>().unwrap()).enumerate() {
            let ok = (a.is_nan() && b.is_nan()) || (a - b).abs() <= rtol * b.abs() + atol;
            assert!(ok, "{what}: element {i}: plugin {a}, interpreter {b}");
        }
    }
}

#[test]
fn rust_plugin_matches_the_interpreter_on_every_op_it_declares() {
    let r = registry_with_plugins();
    let ew = r.get("ew").unwrap();
    let caps = ew.capabilities();
    assert_eq!(caps.ops.to_string(), "add,div,exp,mul,neg,relu,sigmoid,sub,tanh");
    assert_eq!(ew.tensor_backend_type(), "cpu");
    let shapes: [(&[usize], &[usize]); 5] =
        [(&[2, 3], &[2, 3]), (&[2, 3], &[3]), (&[4, 1, 3], &[2, 1]), (&[], &[5]), (&[0, 3], &[3])];
    for kind in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
        for (i, (a, b)) in shapes.iter().enumerate() {
            let inputs = [random(a, 10 + i as u64, 3.0), random(b, 20 + i as u64, 3.0)];
            check_against_interpreter(ew.as_ref(), Op::Binary(kind), &inputs, 1e-6, 0.0);
        }
    }
    for kind in [UnaryOp::Relu, UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid] {
        for (i, shape) in [&[2usize, 3, 4][..], &[7], &[]].into_iter().enumerate() {
            check_against_interpreter(ew.as_ref(), Op::Unary(kind), &[random(shape, 30 + i as u64, 4.0)], 1e-6, 1e-7);
        }
    }
    // The registry routes the plugin's ops to it (priority 5) and everything else elsewhere.
    assert_eq!(r.select(&Node::op("a", Op::Binary(BinaryOp::Add))).unwrap().name, "ew");
    // (`cpu`, the compiled code, ties with the reference backend at 0 and sorts first.)
    assert_eq!(r.select(&Node::op("s", Op::Unary(UnaryOp::Sin))).unwrap().name, COMPILED_CPU_BACKEND);
}

#[test]
fn c_plugin_matches_the_interpreter() {
    let r = registry_with_plugins();
    let c = r.get("reduce").unwrap();
    assert_eq!(c.capabilities().to_string(), "tensor(matmul,softmax) token cache state-export");
    for (m, k, n) in [(3, 4, 5), (1, 1, 1), (8, 16, 2)] {
        let inputs = [random(&[m, k], m as u64, 2.0), random(&[k, n], n as u64, 2.0)];
        check_against_interpreter(c.as_ref(), Op::MatMul, &inputs, 1e-5, 1e-6);
    }
    for (shape, axis) in [(&[2usize, 3, 5][..], -1i64), (&[4, 6], 1), (&[9], 0)] {
        check_against_interpreter(c.as_ref(), Op::Softmax(Softmax { axis }), &[random(shape, 7, 5.0)], 1e-5, 1e-7);
    }
    // Priority -1: the compiled code (0) wins matmul; raising the plugin above it changes the choice.
    assert_eq!(r.select(&Node::op("m", Op::MatMul)).unwrap().name, COMPILED_CPU_BACKEND);
    let mut r2 = BackendRegistry::with_defaults();
    r2.load_plugin("reduce", &reduce_plugin(), 1).unwrap();
    let s = r2.select(&Node::op("m", Op::MatMul)).unwrap();
    assert_eq!((s.name.as_str(), s.priority), ("reduce", 1));
}

/// How many token states the C plugin holds, from its own exported counter (same library, same globals).
fn live_states() -> std::ffi::c_long {
    // SAFETY: loading the test's own plugin, already loaded by the registry.
    let lib = unsafe { libloading::Library::new(reduce_plugin()) }.unwrap();
    // SAFETY: the C plugin defines `long reduce_plugin_live_states(void)`.
    unsafe { lib.get::<unsafe extern "C" fn() -> std::ffi::c_long>(b"reduce_plugin_live_states\0").unwrap()() }
}

#[test]
fn plugin_states_flow_through_prefix_counters_export_and_import() {
    let r = registry_with_plugins();
    let sel = r.select(&Node::token("req", "count", true, 2)).unwrap();
    assert_eq!(sel.name, "reduce");
    let backend = sel.backend;
    // Two tokens to generate (the node's); `remaining_tokens` counts the prompt tokens no state covers.
    let node = Node::token("req", "count", true, 2);
    let before = live_states();
    let prompt = Tensor::from_vec(vec![3], vec![5i64, 6, 7]).unwrap();
    let first = backend.run_with_cache(&node, &[prompt], None, 3).unwrap();
    assert_eq!(first.outputs, vec![Tensor::from_vec(vec![2], vec![8i64, 9]).unwrap()]);
    assert_eq!((first.counters.reused_prefix_len, first.counters.tokens_sent), (0, 5));
    assert!(!first.counters.used_cached_state);
    let state = first.state.expect("the plugin returns a state");
    assert_eq!((state.tokens(), state.bytes()), (5, 40));
    assert_eq!(live_states(), before + 1);

    // Resume: the prompt extends the state's tokens, so 5 are reused.
    let prompt = Tensor::from_vec(vec![6], vec![5i64, 6, 7, 8, 9, 42]).unwrap();
    let node = Node::token("req", "count", true, 1);
    let second = backend.run_with_cache(&node, std::slice::from_ref(&prompt), Some(&state), 1).unwrap();
    assert_eq!(second.outputs, vec![Tensor::from_vec(vec![1], vec![43i64]).unwrap()]);
    let c = second.counters;
    assert_eq!((c.reused_prefix_len, c.tokens_saved, c.tokens_sent, c.compute_steps), (5, 5, 2, 2));
    assert!(c.used_cached_state);

    // Export and import round-trip; the imported state resumes exactly like the original.
    let bytes = backend.export_state(&state).expect("the C plugin's states are portable");
    assert_eq!(bytes.len(), 40);
    let imported = backend.import_state(&bytes).unwrap();
    assert_eq!(imported.tokens(), 5);
    let third = backend.run_with_cache(&node, &[prompt], Some(&imported), 1).unwrap();
    assert_eq!((third.outputs, third.counters), (second.outputs, second.counters));
    let err = backend.import_state(&[1, 2, 3]).unwrap_err();
    assert!(err.to_string().contains("not a whole number of tokens"), "{err}");

    // A state from another backend instance is refused, not dereferenced.
    let other = kiln_runtime::plugin::load_plugin(&reduce_plugin()).unwrap();
    assert!(other.export_state(&state).is_none());
    let err = other.run_with_cache(&node, &[Tensor::from_vec(vec![1], vec![1i64]).unwrap()], Some(&state), 1);
    assert!(matches!(&err, Err(RunError::Plugin { message, .. }) if message.contains("another backend")), "{err:?}");

    // Every state is released exactly once when its last handle drops.
    drop((state, imported, second.state, third.state));
    assert_eq!(live_states(), before);
}

#[test]
fn broken_plugins_are_refused_with_clear_errors() {
    let cases = [
        ("BAD_NO_ENTRY", "does not export `kiln_backend_entry`"),
        ("BAD_NULL_ENTRY", "kiln_backend_entry returned null"),
        ("BAD_VERSION", "ABI version 99 is not supported (this kiln loads ABI versions 1 to 2)"),
        ("BAD_SIZE", "vtable struct_size is"),
        ("BAD_NO_RUN", "has no `run` function"),
        ("BAD_UNKNOWN_OP", "declares op `matmull`, which is not a kiln op mnemonic"),
    ];
    let mut r = BackendRegistry::with_defaults();
    for (define, needle) in cases {
        let lib = c_plugin(&define.to_lowercase(), "bad_plugin.c", &[define]);
        let err = r.load_plugin("broken", &lib, 3).unwrap_err();
        let RunError::Plugin { name, message } = &err else { panic!("{define}: {err:?}") };
        assert_eq!(name, "broken", "{define}");
        assert!(message.contains(needle), "{define}: `{message}` should contain `{needle}`");
        assert!(!r.has("broken"), "{define}: a refused plugin is not registered");
        // The host keeps working.
        let sel = r.select(&Node::op("after", Op::Binary(BinaryOp::Add))).unwrap();
        let one = Tensor::from_vec(vec![1], vec![1.0f32]).unwrap();
        let out =
            sel.backend.run_with_cache(&Node::op("after", Op::Binary(BinaryOp::Add)), &[one.clone(), one], None, 0);
        assert_eq!(out.unwrap().outputs, vec![Tensor::from_vec(vec![1], vec![2.0f32]).unwrap()]);
    }
    let err = r.load_plugins_from_spec("missing@2=/nonexistent/libmissing.so").unwrap_err();
    assert!(err.to_string().contains("plugin `missing`: /nonexistent/libmissing.so: no such file"), "{err}");
}

#[test]
fn a_version_1_plugin_still_loads_and_is_spoken_to_in_version_1() {
    use kiln_runtime::plugin::abi::{KILN_BACKEND_ABI_VERSION, KILN_RUN_ARGS_V1_SIZE, KilnRunArgs};
    assert_eq!(KILN_BACKEND_ABI_VERSION, 2);
    assert!(KILN_RUN_ARGS_V1_SIZE < std::mem::size_of::<KilnRunArgs>() as u32);
    let lib = c_plugin("old_v1", "bad_plugin.c", &["OLD_V1"]);
    let mut r = BackendRegistry::with_defaults();
    r.load_plugin("old", &lib, 1).unwrap();
    let old = r.get("old").unwrap();
    // A token node generating 7 tokens: a version-1 plugin reads the count in `remaining_tokens` (version 1's
    // meaning), from a run-args struct of version 1's size.
    let err = old.run_with_cache(&Node::token("t", "m", false, 7), &[], None, 3).unwrap_err().to_string();
    assert!(err.contains(&format!("v1 run: struct_size={KILN_RUN_ARGS_V1_SIZE} remaining_tokens=7")), "{err}");
}

#[test]
fn a_backend_registers_from_a_vtable_in_memory() {
    use kiln_runtime::plugin::PluginBackend;
    use kiln_runtime::plugin::abi::{KILN_BACKEND_ABI_VERSION, KilnBackendVtable, KilnEntryFn};
    // A vtable already in this process: the Rust example plugin's, fetched through its entry point.
    // SAFETY: the example plugin's entry symbol has the ABI's entry type; the library stays loaded for the test
    // (leaked), so the vtable stays valid.
    let table: *const KilnBackendVtable = unsafe {
        let lib = Box::leak(Box::new(libloading::Library::new(elementwise_plugin()).unwrap()));
        let entry = lib.get::<KilnEntryFn>(b"kiln_backend_entry\0").unwrap();
        entry(KILN_BACKEND_ABI_VERSION)
    };
    let mut r = BackendRegistry::with_defaults();
    // SAFETY: as above.
    unsafe { r.register_vtable("in-memory", table, 7) }.unwrap();
    let sel = r.select(&Node::op("a", Op::Binary(BinaryOp::Add))).unwrap();
    assert_eq!((sel.name.as_str(), sel.priority), ("in-memory", 7));
    check_against_interpreter(
        sel.backend.as_ref(),
        Op::Binary(BinaryOp::Mul),
        &[random(&[2, 3], 1, 2.0), random(&[3], 2, 2.0)],
        1e-6,
        1e-7,
    );
    // SAFETY: a null table is refused before it is read.
    let err = unsafe { PluginBackend::from_vtable(std::ptr::null(), "null") }.unwrap_err();
    assert!(err.to_string().contains("null"), "{err}");
    // SAFETY: as above; the duplicate is refused by name before the table is used.
    let err = unsafe { r.register_vtable("in-memory", table, 1) }.unwrap_err();
    assert!(err.to_string().contains("already registered"), "{err}");
}

#[test]
fn failing_runs_become_errors_and_the_host_keeps_running() {
    let mut r = registry_with_plugins();
    r.load_plugin("always-fails", &c_plugin("bad_always_fails", "bad_plugin.c", &["BAD_ALWAYS_FAILS"]), -10).unwrap();
    let x = random(&[2, 3], 1, 1.0);
    let good = || {
        let c = r.get("reduce").unwrap();
        check_against_interpreter(
            c.as_ref(),
            Op::MatMul,
            &[random(&[2, 3], 1, 1.0), random(&[3, 2], 2, 1.0)],
            1e-5,
            1e-6,
        );
        let ew = r.get("ew").unwrap();
        check_against_interpreter(
            ew.as_ref(),
            Op::Binary(BinaryOp::Add),
            &[random(&[2, 3], 3, 1.0), random(&[3], 4, 1.0)],
            1e-6,
            0.0,
        );
    };

    // A plugin's error status is RunError::Plugin with its message.
    let fails = r.get("always-fails").unwrap();
    let err =
        fails.run_with_cache(&Node::op("n7", Op::Unary(UnaryOp::Exp)), std::slice::from_ref(&x), None, 0).unwrap_err();
    assert_eq!(
        err,
        RunError::Plugin {
            name: "always-fails".into(),
            message: "node `n7` (exp): always-fails refuses node `n7` (exp) on purpose".into()
        }
    );
    good();

    // The C plugin's own checks: rank, inner dims.
    let c = r.get("reduce").unwrap();
    let err = c.run_with_cache(&Node::op("mm", Op::MatMul), &[random(&[2, 2, 2], 1, 1.0), x.clone()], None, 0);
    assert!(
        matches!(&err, Err(RunError::Plugin { message, .. }) if message.contains("rank-2 operands only")),
        "{err:?}"
    );
    let err = c.run_with_cache(&Node::op("mm", Op::MatMul), &[x.clone(), x.clone()], None, 0);
    assert!(matches!(&err, Err(RunError::Plugin { message, .. }) if message.contains("inner dims differ")), "{err:?}");
    // Unsupported status: an attribute value or dtype the plugin does not handle.
    let err = c.run_with_cache(&Node::op("sm", Op::Softmax(Softmax { axis: 0 })), std::slice::from_ref(&x), None, 0);
    assert!(
        matches!(&err, Err(RunError::Unsupported { node, reason }) if node == "sm" && reason.contains("only the last axis")),
        "{err:?}"
    );
    good();

    // The Rust plugin: other dtypes, undeclared ops, token nodes.
    let ew = r.get("ew").unwrap();
    let ints = Tensor::from_vec(vec![2], vec![1i32, 2]).unwrap();
    let err = ew.run_with_cache(&Node::op("i", Op::Binary(BinaryOp::Add)), &[ints.clone(), ints], None, 0).unwrap_err();
    assert!(matches!(&err, RunError::Unsupported { reason, .. } if reason.contains("not f32")), "{err:?}");
    let err =
        ew.run_with_cache(&Node::op("g", Op::Unary(UnaryOp::Sin)), std::slice::from_ref(&x), None, 0).unwrap_err();
    assert!(err.to_string().contains("op `sin` is not one of this plugin's"), "{err}");
    let err = ew.run_with_cache(&Node::token("t", "m", false, 3), &[], None, 0).unwrap_err();
    assert!(err.to_string().contains("token nodes are not supported"), "{err}");
    let bad = random(&[2, 2], 5, 1.0);
    let err = ew.run_with_cache(&Node::op("b", Op::Binary(BinaryOp::Mul)), &[x.clone(), bad], None, 0).unwrap_err();
    assert!(
        matches!(&err, RunError::Plugin { name, message } if name == "ew" && message.contains("do not broadcast")),
        "{err:?}"
    );
    good();
}

#[test]
fn a_panic_inside_the_rust_plugin_is_contained() {
    let r = registry_with_plugins();
    let ew: Arc<dyn Backend> = r.get("ew").unwrap();
    let x = random(&[4], 9, 1.0);
    for _ in 0..3 {
        let err =
            ew.run_with_cache(&Node::op(PANIC_HOOK_NODE, Op::Unary(UnaryOp::Relu)), std::slice::from_ref(&x), None, 0);
        let Err(RunError::Plugin { name, message }) = &err else { panic!("{err:?}") };
        assert_eq!(name, "ew");
        assert!(message.contains("panicked: deliberate panic"), "{message}");
        // Same plugin, next node: fine.
        check_against_interpreter(ew.as_ref(), Op::Unary(UnaryOp::Relu), std::slice::from_ref(&x), 0.0, 0.0);
    }
}

fn kiln_backends(plugins: Option<&str>) -> std::process::Output {
    kiln_backends_with(plugins, &[])
}

fn kiln_backends_with(plugins: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.arg("backends").args(args);
    match plugins {
        Some(v) => cmd.env("KILN_BACKEND_PLUGINS", v),
        None => cmd.env_remove("KILN_BACKEND_PLUGINS"),
    };
    cmd.output().expect("the kiln binary runs")
}

#[test]
fn both_plugins_loaded_from_the_env_var_run_nodes_that_match_the_interpreter() {
    let list = format!("{}; {}", spec("ew", elementwise_plugin(), 5), spec("reduce", &reduce_plugin(), -1));
    let out = kiln_backends_with(Some(&list), &["--check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("check ew: 9 sample ops match the interpreter (add,sub,mul,div,relu,neg,exp,tanh,sigmoid)"),
        "{stdout}"
    );
    assert!(stdout.contains("check reduce: 2 sample ops match the interpreter (matmul,softmax)"), "{stdout}");
    assert!(stdout.contains("check cpu-reference: 11 sample ops match the interpreter"), "{stdout}");
    // A plugin whose every run fails is reported, and the command fails.
    let failing = c_plugin("always_fails_check", "bad_plugin.c", &["BAD_ALWAYS_FAILS"]);
    let out = kiln_backends_with(Some(&spec("failing", &failing, 0)), &["--check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("check failing: FAILED"), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("sample node(s) failed"));
}

#[test]
fn kiln_backends_reads_the_plugin_env_var() {
    let out = kiln_backends(None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "cpu  priority 0  type cpu  tensor(all ops)\ncpu-reference  priority 0  type cpu  tensor(all ops)\n"
    );

    // The seed's grammar: `;` between entries, empty entries skipped, `@priority` before the `=`.
    let list = format!("{};; {}", spec("ew", elementwise_plugin(), 5), spec("reduce", &reduce_plugin(), -1));
    let out = kiln_backends(Some(&list));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ew  priority 5  type cpu  tensor(add,div,exp,mul,neg,relu,sigmoid,sub,tanh)\n\
         cpu  priority 0  type cpu  tensor(all ops)\n\
         cpu-reference  priority 0  type cpu  tensor(all ops)\n\
         reduce  priority -1  type cpu  tensor(matmul,softmax) token cache state-export\n"
    );
    // The issue's example: two backends, priorities 50 and the default.
    let two = format!("echo@50={};;other={}", elementwise_plugin().display(), reduce_plugin().display());
    let out = kiln_backends(Some(&two));
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.starts_with("echo  priority 50 ") && listing.contains("other  priority 0 "), "{listing}");

    let bad_version = c_plugin("bad_version", "bad_plugin.c", &["BAD_VERSION"]);
    let failures = [
        (format!("ew@high={}", elementwise_plugin().display()), "bad priority `high`".to_string()),
        ("ew@1.5=/x.so".to_string(), "bad priority `1.5`".to_string()),
        ("=x.so".to_string(), "empty name".to_string()),
        (format!("ew={}:3", elementwise_plugin().display()), "ambiguous `:3`".to_string()),
        (format!("{list},ew=/x.so"), "separated by `;`, not `,`".to_string()),
        ("cpu-reference=/x.so".to_string(), "kiln registers itself".to_string()),
        ("e w=/x.so".to_string(), "contains ' '".to_string()),
        (
            spec("old", &bad_version, 0),
            "plugin `old`".to_string() + ": " + &bad_version.display().to_string() + ": ABI version 99",
        ),
    ];
    for (value, needle) in failures {
        let out = kiln_backends(Some(&value));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{value}: {err}");
        assert!(err.starts_with("error: loading the plugins in KILN_BACKEND_PLUGINS: "), "{value}: {err}");
        assert!(err.contains(&needle), "{value}: `{err}` should contain `{needle}`");
        assert!(!err.contains("panicked") && !err.contains("internal error"), "{err}");
        assert!(out.stdout.is_empty(), "{value}: nothing listed on failure");
    }
}

#[test]
fn plugins_run_from_several_threads_at_once() {
    let r = registry_with_plugins();
    let (ew, c) = (r.get("ew").unwrap(), r.get("reduce").unwrap());
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (ew, c) = (Arc::clone(&ew), Arc::clone(&c));
            s.spawn(move || {
                for i in 0..25u64 {
                    let seed = t * 100 + i;
                    let (a, b) = (random(&[3, 4], seed, 2.0), random(&[4], seed + 1, 2.0));
                    check_against_interpreter(ew.as_ref(), Op::Binary(BinaryOp::Mul), &[a.clone(), b], 1e-6, 0.0);
                    let w = random(&[4, 2], seed + 2, 2.0);
                    check_against_interpreter(c.as_ref(), Op::MatMul, &[a, w], 1e-5, 1e-6);
                }
            });
        }
    });
}

/// Outputs collected by [`collect_output`] in the raw-ABI test.
#[derive(Default)]
struct RawOutputs(Vec<(Vec<usize>, Vec<f32>)>);

/// A minimal host allocator: f32 outputs only.
unsafe extern "C" fn collect_output(
    ctx: *mut std::ffi::c_void,
    _index: u32,
    dtype: u32,
    rank: u32,
    shape: *const i64,
) -> *mut std::ffi::c_void {
    // SAFETY: `ctx` is the test's `RawOutputs`; `shape` holds `rank` extents.
    let (outs, dims) = unsafe { (&mut *ctx.cast::<RawOutputs>(), std::slice::from_raw_parts(shape, rank as usize)) };
    if dtype != kiln_runtime::plugin::abi::KILN_DTYPE_F32 {
        return std::ptr::null_mut();
    }
    let dims: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
    let n = dims.iter().product();
    outs.0.push((dims, vec![0.0; n]));
    outs.0.last_mut().unwrap().1.as_mut_ptr().cast()
}

#[test]
fn c_plugin_honours_strides_and_checks_the_run_args_size() {
    use kiln_runtime::plugin::abi::*;
    // SAFETY: the test's own C plugin, whose entry point has the ABI's type.
    let lib = unsafe { libloading::Library::new(reduce_plugin()) }.unwrap();
    // SAFETY: as above.
    let entry = unsafe { *lib.get::<KilnEntryFn>(KILN_BACKEND_ENTRY_SYMBOL).unwrap() };
    // SAFETY: the plugin returns its static vtable, built against this ABI version.
    let vtable = unsafe { *entry(kiln_runtime::plugin::abi::KILN_BACKEND_ABI_VERSION) };
    let run = vtable.run.unwrap();

    // a = [[0,1,2],[3,4,5]] stored column-major (strides [1, 2]); b = [[1],[10],[100]] row-major.
    let a_col_major = [0.0f32, 3.0, 1.0, 4.0, 2.0, 5.0];
    let b = [1.0f32, 10.0, 100.0];
    let (a_shape, a_strides, b_shape, b_strides) = ([2i64, 3], [1i64, 2], [3i64, 1], [1i64, 1]);
    let descs = [
        KilnTensorDesc {
            dtype: KILN_DTYPE_F32,
            rank: 2,
            shape: a_shape.as_ptr(),
            strides: a_strides.as_ptr(),
            data: a_col_major.as_ptr().cast(),
            byte_len: 24,
        },
        KilnTensorDesc {
            dtype: KILN_DTYPE_F32,
            rank: 2,
            shape: b_shape.as_ptr(),
            strides: b_strides.as_ptr(),
            data: b.as_ptr().cast(),
            byte_len: 12,
        },
    ];
    let mut outs = RawOutputs::default();
    let sink = KilnOutputSink { ctx: (&raw mut outs).cast(), alloc: Some(collect_output) };
    let mut error = [0u8; 256];
    let mut args = KilnRunArgs {
        struct_size: std::mem::size_of::<KilnRunArgs>() as u32,
        input_count: 2,
        remaining_tokens: 0,
        counters: KilnCounters::default(),
        node_name: c"raw".as_ptr(),
        kind: c"matmul".as_ptr(),
        attrs_json: c"{\"op\":\"mat_mul\"}".as_ptr(),
        inputs: descs.as_ptr(),
        outputs: &sink,
        prefix_state: std::ptr::null_mut(),
        state_out: std::ptr::null_mut(),
        state_bytes: 0,
        state_tokens: 0,
        error: error.as_mut_ptr().cast(),
        error_cap: error.len() as u64,
        max_new_tokens: 0,
        reserved: 0,
    };
    // SAFETY: every pointer in `args` is alive for the call.
    let status = unsafe { run(vtable.instance, &mut args) };
    assert_eq!(status, KILN_STATUS_OK, "{}", String::from_utf8_lossy(&error));
    assert_eq!(outs.0, vec![(vec![2, 1], vec![210.0, 543.0])]);

    // A byte_len too short for the strides is caught by the plugin, not read past.
    let mut short = descs;
    short[0].byte_len = 20;
    args.inputs = short.as_ptr();
    // SAFETY: as above.
    let status = unsafe { run(vtable.instance, &mut args) };
    assert_eq!(status, KILN_STATUS_ERROR);
    assert!(String::from_utf8_lossy(&error).contains("out of bounds"));

    // A host with a different kiln_run_args layout is refused by the plugin.
    args.inputs = descs.as_ptr();
    args.struct_size += 8;
    // SAFETY: as above; the plugin reads only `struct_size` before refusing.
    let status = unsafe { run(vtable.instance, &mut args) };
    assert_eq!(status, KILN_STATUS_ERROR);
    let msg = String::from_utf8_lossy(&error);
    assert!(msg.contains("run args are") && msg.contains("built for"), "{msg}");
}

// --- Placement: the registry places the nodes of compiled models -----------------------------------------------

#[path = "common/mod.rs"]
mod common;

/// `y = relu(x·w + x) * x - x`: a library group's epilogue and loose elementwise ops for a plugin to take.
const PLACED: &str = r#"graph "placed" {
  %0 = input {name="x"} : f32[4,8]
  %1 = param {name="w"} : f32[8,8]
  %2 = matmul %0, %1 : f32[4,8]
  %3 = add %2, %0 : f32[4,8]
  %4 = relu %3 : f32[4,8]
  %5 = mul %4, %0 : f32[4,8]
  %6 = sub %5, %0 : f32[4,8]
  output "y" = %6
}
"#;

fn placed_model() -> kiln::Model {
    let mut g = kiln_ir::parse(PLACED).unwrap();
    common::bind_weights(&mut g);
    kiln::Model::from_graph(g).unwrap()
}

/// The built-in backends plus the Rust example plugin as `ew` at `priority`.
fn registry_with_ew(priority: i32) -> BackendRegistry {
    let mut r = BackendRegistry::with_defaults();
    r.load_plugins_from_spec(&spec("ew", elementwise_plugin(), priority)).unwrap();
    r
}

/// The example plugin's own count of `run` calls (the library is loaded once per process, so this is the same
/// instance the registry called).
fn ew_calls() -> u64 {
    // SAFETY: the example plugin, already loaded; the symbol is its `extern "C" fn() -> u64` counter.
    unsafe {
        let lib = libloading::Library::new(elementwise_plugin()).unwrap();
        let f = lib.get::<unsafe extern "C" fn() -> u64>(b"kiln_plugin_elementwise_calls\0").unwrap();
        f()
    }
}

/// Compiles `model` with `backends`, runs it, and returns the outputs, the report and how many times the
/// example plugin was called during the run.
fn run_placed(
    model: &kiln::Model,
    inputs: &BTreeMap<String, Tensor>,
    backends: &BackendRegistry,
) -> (Vec<(String, Tensor)>, kiln::CompileReport, u64) {
    let options = kiln::CompileOptions { threads: 2, backends: backends.clone(), ..Default::default() };
    let compiled = model.compile(&options).unwrap();
    let before = ew_calls();
    let outputs = compiled.run(inputs).unwrap();
    (outputs, compiled.report().clone(), ew_calls() - before)
}

#[test]
fn a_plugin_above_the_compiled_code_takes_its_ops_and_matches_the_interpreter() {
    let model = placed_model();
    let inputs = model.random_inputs(&BTreeMap::new(), 3).unwrap();
    let want = model.run(&inputs, &kiln::RunOptions { backend: kiln::Backend::Interp, ..Default::default() }).unwrap();
    let (got, report, calls) = run_placed(&model, &inputs, &registry_with_ew(50));
    common::compare_outputs(got, &want).unwrap();
    // add, relu, mul and sub are the plugin's; the matmul stays compiled.
    let [placed] = &report.placement[..] else { panic!("{:?}", report.placement) };
    assert_eq!((placed.backend.as_str(), placed.priority), ("ew", 50));
    let kinds: Vec<&str> = placed.nodes.iter().map(|n| n.split_whitespace().next().unwrap()).collect();
    assert_eq!(kinds, ["add", "relu", "mul", "sub"], "{:?}", placed.nodes);
    assert_eq!(report.steps[4], 4);
    assert_eq!(calls, 4, "the plugin's own counter: one call per placed node");

    // Below the compiled code (priority -1 < cpu's 0), the plugin takes nothing.
    let (got, report, calls) = run_placed(&model, &inputs, &registry_with_ew(-1));
    common::compare_outputs(got, &want).unwrap();
    assert!(report.placement.is_empty() && report.steps[4] == 0 && calls == 0, "{:?}", report.placement);
}

#[test]
fn bert_small_places_its_elementwise_nodes_on_the_plugin_and_matches_onnx_runtime() {
    let Some(dirs) = common::model_dirs() else { return };
    let dir = dirs.iter().find(|d| d.ends_with("bert_small")).expect("bert_small among the reference models");
    let case = common::reference_case(dir).unwrap();
    let (got, report, calls) = run_placed(&case.model, &case.inputs, &registry_with_ew(50));
    common::compare_outputs(got, &case.expected).unwrap();
    let [placed] = &report.placement[..] else { panic!("{:?}", report.placement) };
    assert_eq!(placed.backend, "ew");
    assert!(placed.nodes.len() >= 10, "{:?}", placed.nodes);
    assert_eq!(calls as usize, placed.nodes.len(), "one plugin call per placed node");
}

#[test]
fn a_plugin_failing_inside_a_model_names_itself_and_the_node_and_harms_nothing_else() {
    let model = placed_model();
    let inputs = model.random_inputs(&BTreeMap::new(), 4).unwrap();
    let mut r = BackendRegistry::with_defaults();
    r.load_plugin("always-fails", &c_plugin("bad_always_fails", "bad_plugin.c", &["BAD_ALWAYS_FAILS"]), 5).unwrap();
    let options = kiln::CompileOptions { threads: 2, backends: r, ..Default::default() };
    let compiled = model.compile(&options).unwrap();
    for _ in 0..2 {
        let err = compiled.run(&inputs).unwrap_err().to_string();
        assert!(err.contains("backend `always-fails` failed on node `"), "{err}");
        assert!(err.contains("refuses node") && !err.contains('\n'), "{err}");
    }
    // The process, and the same model compiled without the plugin, are unharmed.
    let want = model.run(&inputs, &kiln::RunOptions { backend: kiln::Backend::Interp, ..Default::default() }).unwrap();
    let plain = model.compile(&kiln::CompileOptions { threads: 2, ..Default::default() }).unwrap();
    common::compare_outputs(plain.run(&inputs).unwrap(), &want).unwrap();
}

#[test]
fn artifacts_record_their_placement_and_need_the_plugin_to_run() {
    let model = placed_model();
    let inputs = model.random_inputs(&BTreeMap::new(), 5).unwrap();
    let backends = registry_with_ew(50);
    let lowered = model.lower(&kiln::CompileOptions { backends: backends.clone(), ..Default::default() }).unwrap();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("art");
    kiln::Artifact::write(&lowered, &dir).unwrap();
    let manifest = kiln::Artifact::open(&dir).unwrap();
    assert_eq!(manifest.manifest().common().placement[0].backend, "ew");
    let err = kiln::Artifact::load(&dir, 1).expect_err("refused without the plugin").to_string();
    assert!(err.contains("backend `ew`, which is not registered") && err.contains("KILN_BACKEND_PLUGINS"), "{err}");
    let loaded = kiln::Artifact::load_with(&dir, 1, &backends).unwrap();
    let jit = model.compile(&kiln::CompileOptions { backends, ..Default::default() }).unwrap();
    assert_eq!(loaded.run(&inputs).unwrap(), jit.run(&inputs).unwrap());
}

fn kiln_cmd(plugins: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("KILN_BACKEND_PLUGINS", plugins)
        .output()
        .expect("the kiln binary runs")
}

#[test]
fn every_command_honours_the_plugin_list_and_refuses_a_bad_one_in_one_line() {
    let root = tempfile::tempdir().unwrap();
    let model = root.path().join("placed.kir");
    std::fs::write(&model, PLACED).unwrap();
    let m = model.to_str().unwrap();
    let out_dir = root.path().join("out");
    let good = spec("ew", elementwise_plugin(), 50);

    let o = kiln_cmd(&good, &["inspect", m, "--placement", "--json", "--random-weights", "0"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["per_backend"]["ew"], 4, "{v}");
    assert!(
        v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["backend"] == "ew" && s["what"].as_str().unwrap().contains("add"))
    );
    let o = kiln_cmd(&good, &["inspect", m, "--placement", "--random-weights", "0"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("`ew` declares `add` at priority 50") && text.contains("steps per backend: cpu: "), "{text}");

    let o = kiln_cmd(&good, &["run", m, "--random-weights", "0", "-o", out_dir.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains("placed: backend `ew` (priority 50) runs 4 node(s): add, mul, relu, sub"),
        "{text}"
    );

    let bad = format!("ew={}:50", elementwise_plugin().display());
    let art = root.path().join("art");
    let commands: [&[&str]; 6] = [
        &["generate", root.path().to_str().unwrap(), "--prompt-ids", "1", "--max-new-tokens", "1"],
        &["run", m, "--random-weights", "0"],
        &["bench", m, "--random-weights", "0", "--runs", "1"],
        &["compile", m, "--random-weights", "0", "-o", art.to_str().unwrap()],
        &["inspect", m, "--placement", "--random-weights", "0"],
        &["backends"],
    ];
    for args in commands {
        let o = kiln_cmd(&bad, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("KILN_BACKEND_PLUGINS") && err.contains("ambiguous `:50`"), "{args:?}: {err}");
    }
    assert!(!art.exists(), "nothing is compiled under a bad plugin list");
}
