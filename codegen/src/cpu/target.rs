//! What machine object code is for: the target triple and the instruction-set extensions Cranelift enabled, as
//! recorded in an ahead-of-time artifact, and the check that the running host can execute such code.
//!
//! Feature names follow Rust's `target_feature` spelling (`sse4.1`, `avx2`, `fma`, `bmi2`, …) so that they read
//! the same in a manifest as in `rustc --print target-features`.

use kiln_plan::cpu::{CpuTarget, rust_feature_name};

use super::{CpuError, CpuOptions, make_isa};

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

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_plan::cpu::{host_supports, host_triple};

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
