//! NVIDIA's PTX assembler as a checker: finding `ptxas` and assembling a PTX module with it, to prove the
//! emitted PTX valid without a GPU (`scripts/get-ptxas.sh` fetches CUDA 11.8's `ptxas` into `.cache/ptxas/`).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::PtxArch;

/// The `ptxas` to use: `$KILN_PTXAS`, else `.cache/ptxas/ptxas` in the current directory or one above it, else
/// `ptxas` on the `PATH`; `None` when there is none.
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let cwd = std::env::current_dir().ok()?;
    for dir in cwd.ancestors() {
        let p = dir.join(".cache/ptxas/ptxas");
        if p.is_file() {
            return Some(p);
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("ptxas")).find(|p| p.is_file())
}

/// Assembles `ptx` for `arch` with the `ptxas` at `ptxas` (the PTX goes through a temporary file named after
/// `name`); `Err` holds the assembler's messages.
pub fn assemble(ptxas: &Path, ptx: &str, arch: PtxArch, name: &str) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("kiln-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // A fresh name per call: concurrent calls (tests run in parallel) never share a file.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut stem: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    stem.push_str(&format!("_{call}"));
    let input = dir.join(format!("{stem}.{}.ptx", arch.name()));
    let output = dir.join(format!("{stem}.{}.cubin", arch.name()));
    std::fs::write(&input, ptx).map_err(|e| format!("{}: {e}", input.display()))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={}", arch.name()))
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptxas.display()));
    let _ = std::fs::remove_file(&input);
    let _ = std::fs::remove_file(&output);
    let out = out?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ptxas -arch={} failed ({}): {}",
            arch.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
