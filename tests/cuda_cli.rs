//! `--backend cuda` where CUDA cannot run the model (no driver or device here; or, with one, programs cannot run
//! on it yet): one clear line on stderr, exit code 1, never a panic.

use std::process::Command;

#[test]
fn cuda_without_a_usable_device_is_one_clear_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "examples/models/tiny_cnn.kir", "--backend", "cuda", "--output-dir"])
        .arg(std::env::temp_dir().join("kiln-cuda-cli-test"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the kiln binary runs");
    let err = String::from_utf8_lossy(&out.stderr);
    // Exit 4: no device is "unsupported here", as docs/cli.md says.
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: backend `cuda`: "), "{err}");
    assert!(err.contains("no NVIDIA driver") || err.contains("no device") || err.contains("not built yet"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
