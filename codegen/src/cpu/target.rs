//! What machine object code is for: the target triple and the instruction-set extensions Cranelift enabled, as
//! recorded in an ahead-of-time artifact, and the check that the running host can execute such code.
//!
//! Feature names follow Rust's `target_feature` spelling (`sse4.1`, `avx2`, `fma`, `bmi2`, …) so that they read
//! the same in a manifest as in `rustc --print target-features`.

use super::{CpuError, CpuOptions, make_isa};

/// The machine code is compiled for: the target triple and the extensions the code may use.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuTarget {
    /// The target triple (`x86_64-unknown-linux-gnu`, …).
    pub triple: String,
    /// The instruction-set extensions enabled for code generation, sorted.
    pub cpu_features: Vec<String>,
}

/// The target [`emit_object`](super::emit_object) compiles for with `options`: the triple and every extension
/// flag Cranelift's ISA has on.
pub fn cpu_target(options: &CpuOptions) -> Result<CpuTarget, CpuError> {
    let isa = make_isa(options, true)?;
    let mut cpu_features: Vec<String> = isa
        .isa_flags()
        .iter()
        .filter(|v| v.as_bool() == Some(true))
        .filter_map(|v| v.name.strip_prefix("has_"))
        .map(|name| rust_feature_name(name).to_string())
        .collect();
    cpu_features.sort();
    Ok(CpuTarget { triple: isa.triple().to_string(), cpu_features })
}

/// The triple of the running host.
pub fn host_triple() -> String {
    target_lexicon::HOST.to_string()
}

/// Cranelift's flag name (after `has_`) as Rust spells the feature.
fn rust_feature_name(cranelift: &str) -> &str {
    match cranelift {
        "sse41" => "sse4.1",
        "sse42" => "sse4.2",
        "avx_vnni" => "avxvnni",
        other => other,
    }
}

/// Whether the running host supports `feature` (Rust spelling); `false` for a name this build does not know, since
/// then nothing vouches for it.
pub fn host_supports(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! detect {
            ($($name:tt),*) => {
                match feature {
                    $($name => std::arch::is_x86_feature_detected!($name),)*
                    _ => false,
                }
            };
        }
        detect!(
            "sse3",
            "ssse3",
            "sse4.1",
            "sse4.2",
            "cmpxchg16b",
            "popcnt",
            "lzcnt",
            "bmi1",
            "bmi2",
            "avx",
            "avx2",
            "fma",
            "avxvnni",
            "avx512f",
            "avx512dq",
            "avx512vl",
            "avx512vbmi",
            "avx512bitalg",
            "avx512vnni"
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // Cranelift's other hosts (aarch64, riscv64, s390x) record features we do not check yet.
        let _ = feature;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_runs_code_compiled_for_it() {
        let t = cpu_target(&CpuOptions::default()).unwrap();
        assert_eq!(t.triple, host_triple());
        for f in &t.cpu_features {
            assert!(host_supports(f), "host lacks `{f}` it compiled for");
        }
        assert!(!host_supports("avx9000"));
    }
}
