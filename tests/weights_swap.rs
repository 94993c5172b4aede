//! Weight swaps on a compiled model: a good checkpoint gives exactly what a fresh compile with its weights gives
//! (f16 checkpoints widened exactly); a bad one (missing, mis-shaped or unconvertible tensor, a truncated file,
//! a changed value of a weight the compiler folded away) is an error naming the tensor and changes nothing — the
//! model keeps serving bit-identical outputs; a run racing a swap sees the old weights or the new, never a mix;
//! `kiln run ARTIFACT --weights FILE` swaps, and fails cleanly on a bad checkpoint; artifacts carry the
//! provenance that guards folded weights (and older ones without it require exactly the weights they read).
//!
//! Artifacts need the system `cc` to link; without one those tests print `SKIPPED: no cc`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use kiln::{CompileOptions, Compiled, Model};
use kiln_ir::{DType, Tensor, Weights};

/// `y = relu(x · w1 + b1) · transpose(w2t)`; `w2t` is transposed once at load (a prepare step), and `dead` is a
/// parameter no output uses (dead code elimination removes it).
const MLP: &str = r#"graph "mlp" {
  %0 = input {name="x"} : f32[4,8]
  %1 = param {name="w1"} : f32[8,16]
  %2 = param {name="b1"} : f32[16]
  %3 = param {name="w2t"} : f32[3,16]
  %4 = param {name="dead"} : f32[2]
  %5 = matmul %0, %1 : f32[4,16]
  %6 = broadcast %2 {shape=[4,16]} : f32[4,16]
  %7 = add %5, %6 : f32[4,16]
  %8 = relu %7 : f32[4,16]
  %9 = transpose %3 {perm=[1, 0]} : f32[16,3]
  %10 = matmul %8, %9 : f32[4,3]
  %11 = mul %4, %4 : f32[2]
  output "y" = %10
}
"#;

/// The live weights from `seed`; `dead` is the same in every set (the compiled program cannot change it).
fn weights(seed: u64) -> Weights {
    let mut w = Weights::default();
    w.insert("w1", Tensor::random(DType::F32, vec![8, 16], seed));
    w.insert("b1", Tensor::random(DType::F32, vec![16], seed + 1));
    w.insert("w2t", Tensor::random(DType::F32, vec![3, 16], seed + 2));
    w.insert("dead", Tensor::from_vec(vec![2], vec![0.5f32, -1.5]).unwrap());
    w
}

fn model(w: &Weights) -> Model {
    let mut g = kiln_ir::parse(MLP).expect("parses");
    for (name, t) in w.iter() {
        g.weights.insert(name, t.clone());
    }
    Model::from_graph(g).expect("verifies")
}

fn compile(w: &Weights) -> Compiled {
    model(w).compile(&CompileOptions { threads: 2, ..Default::default() }).expect("compiles")
}

fn inputs() -> BTreeMap<String, Tensor> {
    BTreeMap::from([("x".to_string(), Tensor::random(DType::F32, vec![4, 8], 7))])
}

/// The outputs' bytes: equal means bit-identical.
fn bits(outputs: &[(String, Tensor)]) -> Vec<(String, Vec<u8>)> {
    outputs.iter().map(|(n, t)| (n.clone(), t.as_bytes().to_vec())).collect()
}

fn run_bits(c: &Compiled) -> Vec<(String, Vec<u8>)> {
    bits(&c.run(&inputs()).expect("runs"))
}

fn save(dir: &Path, name: &str, w: &Weights) -> std::path::PathBuf {
    let path = dir.join(name);
    kiln::weights::save(&path, w).unwrap();
    path
}

#[test]
fn a_good_checkpoint_gives_what_a_fresh_compile_gives() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (weights(1), weights(100));
    let compiled = compile(&a);
    let before = run_bits(&compiled);
    let report = compiled.load_weights(&save(dir.path(), "b.safetensors", &b)).unwrap();
    assert_eq!(report.replaced, ["b1", "w1", "w2t"]);
    // `dead` is a model parameter the program does not read: accepted because it kept its compiled value.
    assert!(report.kept.is_empty() && report.unused.is_empty() && report.unchanged == ["dead"], "{report:?}");
    let after = run_bits(&compiled);
    assert_ne!(after, before, "new weights change the outputs");
    assert_eq!(after, run_bits(&compile(&b)));
    assert_eq!(compiled.weight("w1").unwrap().as_ref(), b.get("w1").unwrap().as_ref());
    // The same from weights in memory, and back.
    compiled.swap_weights(&a).unwrap();
    assert_eq!(run_bits(&compiled), before);
    let mut missing = b.clone();
    missing.remove("b1");
    let err = compiled.swap_weights(&missing).unwrap_err().to_string();
    assert!(err.contains("tensor `b1` is missing"), "{err}");
    assert_eq!(run_bits(&compiled), before);
}

#[test]
fn an_f16_checkpoint_is_widened_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let b = weights(200);
    // f16 values, and the f32 weights holding exactly those values.
    let mut half = Weights::default();
    let mut widened = Weights::default();
    for (name, t) in b.iter() {
        let h: Vec<half::f16> = t.as_slice::<f32>().unwrap().iter().map(|&x| half::f16::from_f32(x)).collect();
        let f: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
        half.insert(name, Tensor::from_vec(t.shape().to_vec(), h).unwrap());
        widened.insert(name, Tensor::from_vec(t.shape().to_vec(), f).unwrap());
    }
    let compiled = compile(&widened);
    let want = run_bits(&compiled);
    let compiled = compile(&weights(1));
    compiled.load_weights(&save(dir.path(), "h.safetensors", &half)).unwrap();
    assert_eq!(run_bits(&compiled), want);
}

#[test]
fn bad_checkpoints_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = weights(1);
    let compiled = compile(&a);
    let before = run_bits(&compiled);
    let w1_before = compiled.weight("w1").unwrap();
    let good = weights(100);
    let mut cases: Vec<(&str, Weights, &str)> = Vec::new();
    let mut missing = good.clone();
    missing.remove("w2t");
    cases.push(("missing", missing, "tensor `w2t` is missing"));
    let mut shape = good.clone();
    shape.insert("b1", Tensor::random(DType::F32, vec![15], 3));
    cases.push(("wrong shape", shape, "weight `b1` should be f32[16], got f32[15]"));
    let mut dtype = good.clone();
    dtype.insert("w2t", Tensor::random(DType::F64, vec![3, 16], 3));
    cases.push(("narrowing dtype", dtype, "tensor `w2t` is f64 but f32 is needed"));
    let mut ints = good.clone();
    ints.insert("b1", Tensor::random(DType::I32, vec![16], 3));
    cases.push(("integer dtype", ints, "tensor `b1` is i32 but f32 is needed"));
    let mut folded = good.clone();
    folded.insert("dead", Tensor::random(DType::F32, vec![2], 999));
    cases.push(("changed folded weight", folded, "tensor `dead` differs from the value the model was compiled with"));
    for (case, w, want) in cases {
        let path = save(dir.path(), &format!("{}.safetensors", case.replace(' ', "_")), &w);
        let err = compiled.load_weights(&path).expect_err(case).to_string();
        assert!(err.contains(want), "{case}: `{err}` lacks `{want}`");
        assert!(err.contains(&path.display().to_string()), "{case}: `{err}` names the file");
        assert!(err.contains("no weight was changed"), "{case}: {err}");
        assert_eq!(run_bits(&compiled), before, "{case}: outputs changed");
        assert!(std::sync::Arc::ptr_eq(&compiled.weight("w1").unwrap(), &w1_before), "{case}: w1 was replaced");
    }
    // Damaged files: truncated, and not a checkpoint at all.
    let path = save(dir.path(), "cut.safetensors", &good);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    let err = compiled.load_weights(&path).unwrap_err().to_string();
    assert!(err.contains("cut.safetensors") && err.contains("truncated or corrupt"), "{err}");
    std::fs::write(&path, b"not a checkpoint").unwrap();
    assert!(compiled.load_weights(&path).is_err());
    assert!(compiled.load_weights(&dir.path().join("absent.safetensors")).is_err());
    assert_eq!(run_bits(&compiled), before);
    // Every problem of one checkpoint is reported at once.
    let mut two = good.clone();
    two.remove("w1");
    two.insert("b1", Tensor::random(DType::F32, vec![2], 3));
    let err = compiled.load_weights(&save(dir.path(), "two.safetensors", &two)).unwrap_err().to_string();
    assert!(err.contains("`w1` is missing") && err.contains("weight `b1` should be"), "{err}");
}

#[test]
fn a_run_racing_a_swap_sees_old_or_new_weights_never_a_mix() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (weights(1), weights(100));
    let (old, new) = (run_bits(&compile(&a)), run_bits(&compile(&b)));
    let (path_a, path_b) = (save(dir.path(), "a.safetensors", &a), save(dir.path(), "b.safetensors", &b));
    let compiled = compile(&a);
    let stop = std::sync::atomic::AtomicBool::new(false);
    /// Stops the runner however the swapping side ends (a failed swap must fail the test, not hang it).
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let seen = std::thread::scope(|s| {
        let runner = s.spawn(|| {
            let (mut saw_old, mut saw_new) = (0, 0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let got = run_bits(&compiled);
                if got == old {
                    saw_old += 1;
                } else if got == new {
                    saw_new += 1;
                } else {
                    panic!("a run saw a mix of old and new weights");
                }
            }
            (saw_old, saw_new)
        });
        {
            let _stop = StopOnDrop(&stop);
            for i in 0..20 {
                compiled.load_weights(if i % 2 == 0 { &path_b } else { &path_a }).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        runner.join().unwrap()
    });
    assert!(seen.0 + seen.1 > 0, "the runner ran");
    eprintln!("runs: {} with old weights, {} with new", seen.0, seen.1);
    // The last swap loaded `a`.
    assert_eq!(run_bits(&compiled), old);
}

fn have_cc() -> bool {
    let ok = Command::new("cc").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIPPED: no cc (artifacts need it to link)");
    }
    ok
}

#[test]
fn kiln_run_swaps_an_artifacts_weights() {
    if !have_cc() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (weights(1), weights(100));
    let kir = dir.path().join("mlp.kir");
    std::fs::write(&kir, MLP).unwrap();
    save(dir.path(), "mlp.safetensors", &a);
    let art = dir.path().join("art");
    let kiln = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().unwrap();
    let o = kiln(&["compile", kir.to_str().unwrap(), "--target", "cpu", "-o", art.to_str().unwrap()]);
    assert!(o.status.success(), "compile: {}", String::from_utf8_lossy(&o.stderr));
    let x = dir.path().join("x.npy");
    kiln::npy::write(&x, &inputs()["x"]).unwrap();
    let input = format!("x={}", x.display());
    let out = dir.path().join("out");
    // A good checkpoint: the outputs are a fresh compile's with those weights.
    let good = save(dir.path(), "b.safetensors", &b);
    let o = kiln(&[
        "run",
        art.to_str().unwrap(),
        "--weights",
        good.to_str().unwrap(),
        "-i",
        &input,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "run: {}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("3 replaced"), "{}", String::from_utf8_lossy(&o.stdout));
    let y = kiln::npy::read(&out.join("y.npy")).unwrap();
    let want = compile(&b).run(&inputs()).unwrap();
    assert_eq!(y.as_bytes(), want[0].1.as_bytes());
    // A bad one: a clear message naming the tensor, a non-zero exit, no panic.
    let mut bad = b.clone();
    bad.insert("w1", Tensor::random(DType::F32, vec![8, 15], 5));
    let bad = save(dir.path(), "bad.safetensors", &bad);
    let o = kiln(&[
        "run",
        art.to_str().unwrap(),
        "--weights",
        bad.to_str().unwrap(),
        "-i",
        &input,
        "-o",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a bad checkpoint must fail");
    assert_ne!(o.status.code(), Some(101), "no panic: {err}");
    assert!(err.contains("bad.safetensors") && err.contains("weight `w1` should be f32[8,16], got f32[8,15]"), "{err}");
}

#[test]
fn artifacts_keep_the_provenance_that_guards_folded_weights() {
    if !have_cc() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (weights(1), weights(100));
    let lowered = model(&a).lower(&CompileOptions::default()).unwrap();
    assert!(lowered.provenance.folded.contains_key("dead"), "{:?}", lowered.provenance);
    let art = dir.path().join("art");
    kiln::Artifact::write(&lowered, &art).unwrap();
    let loaded = kiln::Artifact::load(&art, 1).unwrap();
    let mut changed = b.clone();
    changed.insert("dead", Tensor::random(DType::F32, vec![2], 9));
    let err = loaded.swap_weights(&changed).unwrap_err().to_string();
    assert!(err.contains("tensor `dead` differs"), "{err}");
    loaded.swap_weights(&b).unwrap();
    assert_eq!(run_bits(&loaded), run_bits(&compile(&b)));
    // A manifest without its provenance is refused (format 2 always records it), never loaded with looser checks.
    let manifest = art.join("manifest.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("provenance").expect("written with provenance");
    std::fs::write(&manifest, v.to_string()).unwrap();
    let err = kiln::Artifact::load(&art, 1).expect_err("refused").to_string();
    assert!(err.contains("corrupt manifest") && err.contains("provenance"), "{err}");
}
