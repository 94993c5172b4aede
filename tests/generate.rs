//! Generation with `gpt2_small_step`: cached and uncached decoding agree, a prefill reproduces `gpt2_small`,
//! prefix reuse saves what it says, and states survive a process through `kiln generate --state-out/--state-in`
//! (and bad state files start cold with a warning). Skipped, with a `SKIPPED:` line, without the reference models;
//! the decode logic itself is tested on a toy model in `kiln-runtime` (`state::tests`).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln::generate::{GenerateOptions, Generator, StepPrograms, StepShapes};
use kiln_ir::Tensor;
use kiln_runtime::state::{StepRunner, StepShape, format};

/// The step model's folder, or `None` after a `SKIPPED:` line. The tests also use `gpt2_small`'s saved prompt
/// and logits, so both must be there.
fn step_model() -> Option<PathBuf> {
    let root = common::models_dir();
    for needed in [root.join("gpt2_small_step/model.onnx"), root.join("gpt2_small/inputs/manifest.json")] {
        if !needed.is_file() {
            eprintln!("SKIPPED: {} not found (set KILN_MODELS_DIR)", needed.display());
            return None;
        }
    }
    Some(root.join("gpt2_small_step"))
}

fn options() -> GenerateOptions {
    GenerateOptions { compile: kiln::CompileOptions { threads: 1, ..Default::default() }, ..Default::default() }
}

/// `gpt2_small`'s saved 32-token prompt.
fn prompt32() -> Vec<u32> {
    let inputs = common::read_manifest(&common::models_dir().join("gpt2_small/inputs"));
    inputs[0].1.to_i64_vec().into_iter().map(|t| t as u32).collect()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.to_f64_vec().iter().zip(b.to_f64_vec()).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn cached_decoding_equals_uncached_decoding() {
    let Some(dir) = step_model() else { return };
    // Ids 1..=32: a prompt after which the random-weight model does not just repeat one token.
    let prompt: Vec<u32> = (1..=32).collect();
    let mut cold = Generator::open(&dir, &options()).unwrap();
    let reference = cold.generate(&prompt, 6).unwrap();
    assert_eq!(reference.counters.reused_prefix_len, 0);

    let mut warm = Generator::open(&dir, &options()).unwrap();
    warm.generate(&prompt[..20], 3).unwrap();
    let hot = warm.generate(&prompt, 6).unwrap();
    assert_eq!(hot.counters.reused_prefix_len, 20);
    assert_eq!(hot.ids, reference.ids, "tokens with and without the cache");
    assert!(hot.ids.windows(2).any(|w| w[0] != w[1]), "a prompt with varied output: {:?}", hot.ids);
    let diff = max_abs_diff(&hot.logits, &reference.logits);
    eprintln!("cached vs uncached: ids {:?}, logits max |diff| {diff:.2e}", hot.ids);
    assert!(diff <= 1e-5, "logits differ by {diff}");

    // Resuming from the generated continuation: the state then covers prompt + 5 generated tokens.
    let mut longer = prompt.clone();
    longer.extend_from_slice(&reference.ids);
    let cont = warm.generate(&longer, 3).unwrap();
    let fresh = cold_generator(&dir).generate(&longer, 3).unwrap();
    assert_eq!(cont.counters.reused_prefix_len, 37);
    assert_eq!(cont.ids, fresh.ids);
    assert!(max_abs_diff(&cont.logits, &fresh.logits) <= 1e-5);
}

#[test]
fn padded_past_lengths_decode_like_exact_ones() {
    let Some(dir) = step_model() else { return };
    let prompt = prompt32();
    let mut runs = Vec::new();
    for step_shapes in [StepShapes::Exact, StepShapes::PowerOfTwo] {
        let mut g = Generator::open(&dir, &GenerateOptions { step_shapes, ..options() }).unwrap();
        let out = g.generate(&prompt[..20], 24).unwrap(); // past lengths 20..43: buckets 32 and 64
        let stats = g.step_stats();
        eprintln!(
            "{step_shapes:?}: {} programs compiled in {:.0} ms, steps ran in {:.0} ms",
            stats.compiles,
            stats.compile_time.as_secs_f64() * 1e3,
            stats.run_time.as_secs_f64() * 1e3
        );
        runs.push((out, stats));
    }
    let ((exact, exact_stats), (padded, padded_stats)) = (&runs[0], &runs[1]);
    assert_eq!(padded.ids, exact.ids);
    let diff = max_abs_diff(&padded.logits, &exact.logits);
    eprintln!("padded vs exact past: logits max |diff| {diff:.2e}");
    assert!(diff <= 1e-5, "padded past changes the logits by {diff}");
    assert_eq!(padded.state.downcast::<kiln_runtime::state::KvState>().map(|s| s.tokens().len()), Some(43));
    assert!(padded_stats.compiles * 4 <= exact_stats.compiles, "{padded_stats:?} vs {exact_stats:?}");
}

fn cold_generator(dir: &Path) -> Generator {
    Generator::open(dir, &options()).unwrap()
}

#[test]
fn a_prefill_without_past_reproduces_gpt2_small() {
    let Some(dir) = step_model() else { return };
    let expected = common::read_manifest(&common::models_dir().join("gpt2_small/expected"));
    let want = &expected[0].1; // logits [1,32,4096]
    let prompt = prompt32();
    let programs = StepPrograms::open(&dir.join("model.onnx"), &options()).unwrap();
    let mut inputs = BTreeMap::new();
    let row = |v: Vec<i64>| Tensor::from_vec(vec![1, v.len()], v).unwrap();
    inputs.insert("input_ids".to_string(), row(prompt.iter().map(|&t| t as i64).collect()));
    inputs.insert("position_ids".to_string(), row((0..32).collect()));
    inputs.insert("attention_mask".to_string(), row(vec![1; 32]));
    for l in 0..4 {
        for kv in ["key", "value"] {
            inputs.insert(format!("past_key_values.{l}.{kv}"), Tensor::zeros(kiln_ir::DType::F32, vec![1, 4, 0, 64]));
        }
    }
    let out: BTreeMap<String, Tensor> =
        programs.run_step(StepShape { past: 0, new: 32 }, &inputs).unwrap().into_iter().collect();
    let diff = max_abs_diff(&out["logits"], want);
    eprintln!("prefill (P=0, S=32) vs gpt2_small: max |diff| {diff:.2e}");
    assert!(diff <= 1e-4, "prefill logits differ from gpt2_small's by {diff}");

    // The first 20 tokens alone (run padded to 32 new tokens): causal attention makes their logits the first 20
    // rows of gpt2_small's.
    assert_eq!(programs.compiled_shape(StepShape { past: 0, new: 20 }), StepShape { past: 0, new: 32 });
    let mut first20 = BTreeMap::new();
    for (name, t) in &inputs {
        let t = match name.as_str() {
            "input_ids" | "position_ids" | "attention_mask" => row(t.to_i64_vec()[..20].to_vec()),
            _ => t.clone(),
        };
        first20.insert(name.clone(), t);
    }
    let out: BTreeMap<String, Tensor> =
        programs.run_step(StepShape { past: 0, new: 20 }, &first20).unwrap().into_iter().collect();
    let want20 = Tensor::from_vec(vec![1, 20, 4096], want.as_slice::<f32>().unwrap()[..20 * 4096].to_vec()).unwrap();
    let diff = max_abs_diff(&out["logits"], &want20);
    eprintln!("padded prefill (P=0, S=20 as 32) vs gpt2_small: max |diff| {diff:.2e}");
    assert!(diff <= 1e-4, "padded prefill logits differ from gpt2_small's by {diff}");
    assert_eq!(out["present.3.value"].shape(), [1, 4, 20, 64]);

    // Through the decoder: the first generated token's logits are the prompt's last position.
    let g = cold_generator(&dir).generate(&prompt, 1).unwrap();
    let last = Tensor::from_vec(vec![1, 4096], want.as_slice::<f32>().unwrap()[31 * 4096..].to_vec()).unwrap();
    assert!(max_abs_diff(&g.logits, &last) <= 1e-4);
}

#[test]
fn a_shared_prefix_is_reused_and_saves_tokens() {
    let Some(dir) = step_model() else { return };
    let prompt = prompt32();
    let new_tokens = 4;
    let cold = cold_generator(&dir).generate(&prompt, new_tokens).unwrap();

    let mut g = cold_generator(&dir);
    let first = g.generate(&prompt[..24], 1).unwrap(); // its state covers exactly the 24 prompt tokens
    assert_eq!(first.state.tokens(), 24);
    let second = g.generate(&prompt, new_tokens).unwrap();
    let (c, w) = (cold.counters, second.counters);
    eprintln!("without cache: {c:?}\nwith cache:    {w:?}");
    assert_eq!((w.reused_prefix_len, w.tokens_saved, w.used_cached_state), (24, 24, true));
    assert_eq!((c.tokens_sent, w.tokens_sent), (32 + 3, 8 + 3));
    assert!(c.tokens_sent >= 3 * w.tokens_sent, "{} vs {}", c.tokens_sent, w.tokens_sent);
    assert_eq!(second.ids, cold.ids);
    let stats = g.step_stats();
    eprintln!(
        "step programs: {} compiled, {:.1} ms each; {} reused",
        stats.compiles,
        stats.compile_time.as_secs_f64() * 1e3 / stats.compiles as f64,
        stats.reuses
    );
}

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("the kiln binary runs")
}

/// `kiln generate` on the step model; panics with its stderr unless it succeeds.
fn generate(dir: &Path, prompt: &[u32], extra: &[&str]) -> (Vec<u32>, BTreeMap<String, String>, String) {
    let ids: Vec<String> = prompt.iter().map(|t| t.to_string()).collect();
    let ids = ids.join(",");
    let mut args = vec!["generate", dir.to_str().unwrap(), "--prompt-ids", &ids, "--max-new-tokens", "4"];
    args.extend_from_slice(extra);
    let out = kiln(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "kiln {args:?} failed:\n{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let fields: BTreeMap<String, String> =
        stdout.lines().filter_map(|l| l.split_once(": ")).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let generated = fields["ids"].split(',').map(|t| t.parse().unwrap()).collect();
    (generated, fields, stderr)
}

#[test]
fn a_state_exported_by_one_process_continues_in_another() {
    let Some(dir) = step_model() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("prefix.kilnstate");
    let prompt = prompt32();
    let (first_ids, _, _) = generate(&dir, &prompt[..24], &["--state-out", state.to_str().unwrap()]);
    let (cold_ids, cold, _) = generate(&dir, &prompt, &[]);
    let (hot_ids, hot, stderr) = generate(&dir, &prompt, &["--state-in", state.to_str().unwrap()]);
    assert!(stderr.contains("resuming from"), "{stderr}");
    assert_eq!(hot_ids, cold_ids, "tokens after importing the state");
    // The exported state covers the 24 prompt tokens and the first three generated ones.
    let mut covered = prompt[..24].to_vec();
    covered.extend_from_slice(&first_ids[..3]);
    let reused = lcp(&covered, &prompt);
    assert!(reused >= 24);
    assert_eq!(hot["reused_prefix_len"], reused.to_string());
    assert_eq!(hot["used_cached_state"], "true");
    assert_eq!(cold["reused_prefix_len"], "0");
    let (sent_cold, sent_hot): (u32, u32) = (cold["tokens_sent"].parse().unwrap(), hot["tokens_sent"].parse().unwrap());
    assert_eq!(sent_cold - sent_hot, reused as u32);

    // In one process: the second prompt reuses the first one's state.
    let second: Vec<String> = prompt.iter().map(|t| t.to_string()).collect();
    let (_, both, _) = generate(&dir, &prompt[..24], &["--then-prompt-ids", &second.join(",")]);
    assert_eq!(both["reused_prefix_len"], reused.to_string(), "the last block's counters win in the map");
}

#[test]
fn a_bad_state_file_warns_and_starts_cold() {
    let Some(dir) = step_model() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good.kilnstate");
    let prompt = prompt32();
    generate(&dir, &prompt[..24], &["--state-out", good.to_str().unwrap()]);
    let bytes = std::fs::read(&good).unwrap();
    let (cold_ids, _, _) = generate(&dir, &prompt, &[]);

    let mut flipped = bytes.clone();
    let at = bytes.len() - 100;
    flipped[at] ^= 0x01;
    // Same body, another model's fingerprint, checksum fixed up: caught by the fingerprint check.
    let mut foreign = bytes.clone();
    foreign[24] ^= 0xFF;
    let crc = format::crc32(&foreign[24..]);
    foreign[20..24].copy_from_slice(&crc.to_le_bytes());
    let mut version = bytes.clone();
    version[8] = 9;
    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("corrupt", flipped, "checksum mismatch"),
        ("truncated", bytes[..bytes.len() / 2].to_vec(), "truncated"),
        ("foreign", foreign, "different model"),
        ("version", version, "version 9 is not supported"),
        ("garbage", b"not a state at all, just some text".to_vec(), "bad magic"),
    ];
    for (name, content, why) in cases {
        let path = tmp.path().join(format!("{name}.kilnstate"));
        std::fs::write(&path, content).unwrap();
        let (ids, fields, stderr) = generate(&dir, &prompt, &["--state-in", path.to_str().unwrap()]);
        assert!(
            stderr.contains("warning") && stderr.contains(why) && stderr.contains("starting cold"),
            "{name}: {stderr}"
        );
        assert_eq!(fields["reused_prefix_len"], "0", "{name}");
        assert_eq!(fields["used_cached_state"], "false", "{name}");
        assert_eq!(ids, cold_ids, "{name}");
    }
    let missing = tmp.path().join("missing.kilnstate");
    let (_, fields, stderr) = generate(&dir, &prompt, &["--state-in", missing.to_str().unwrap()]);
    assert!(stderr.contains("warning") && stderr.contains("starting cold"), "{stderr}");
    assert_eq!(fields["reused_prefix_len"], "0");
}

#[test]
fn bad_requests_are_clear_errors() {
    let Some(dir) = step_model() else { return };
    let out = kiln(&["generate", dir.to_str().unwrap(), "--prompt-ids", "1,99999", "--max-new-tokens", "2"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("beyond the vocabulary of 4096") && !stderr.contains("internal error"), "{stderr}");
    let out = kiln(&["generate", dir.to_str().unwrap(), "--prompt-ids", "1,2", "--max-new-tokens", "300"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("the model has 256"), "{stderr}");
    let mlp = common::models_dir().join("mlp");
    if !mlp.join("model.onnx").is_file() {
        eprintln!("SKIPPED (the non-decoder case): {} not found", mlp.display());
        return;
    }
    let out = kiln(&["generate", mlp.to_str().unwrap(), "--prompt-ids", "1", "--max-new-tokens", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("not one a decoder step model takes"), "{stderr}");
}
