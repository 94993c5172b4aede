//! What CPU kernels are to the runtime: the entry's calling convention ([`KernelFn`]), the launch facts of each
//! kernel ([`KernelInfo`]), the machine the code is for ([`CpuTarget`], [`host_supports`]) and the table of
//! runtime functions compiled code calls ([`runtime`]). `kiln_codegen::cpu` produces code to this contract
//! (its module docs describe the ABI in full); the runtime loads and launches it without Cranelift.

pub mod runtime;

/// Entry of a compiled kernel: runs iterations `[begin, end)` of the outermost loop of top-level part `part`.
///
/// `args`: one pointer per launch argument ([`crate::kernel::Kernel::launch_args`] order: inputs and outputs, constants
/// skipped); `syms`: the kernel's symbol values in order.
pub type KernelFn = unsafe extern "C" fn(args: *const *mut u8, syms: *const i64, part: i64, begin: i64, end: i64);

/// What the runtime needs to know to launch a kernel: its parts.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KernelInfo {
    /// The kernel's name.
    pub name: String,
    /// The exported function's name (in object code; the JIT's function is `JitModule::entry`).
    pub symbol: String,
    /// The kernel's symbols (symbolic dims), in the order their values are passed in `syms`.
    pub symbols: Vec<String>,
    /// The parts, in the order their indices are passed as `part`.
    pub parts: Vec<PartInfo>,
    /// The launch signature: the type and role of each buffer passed in `args`
    /// ([`crate::verify::LaunchArg`]; the program verifier checks every launch against it).
    pub args: Vec<crate::verify::LaunchArg>,
}

impl KernelInfo {
    /// The suffix of the data symbol a kernel library exports beside each kernel's function: `<symbol>` then
    /// this, holding [`KernelInfo::facts_digest`] of the facts the code was compiled with.
    pub const FACTS_SUFFIX: &'static str = "__kiln_facts";

    /// BLAKE3 of these launch facts (everything but the symbol itself: name, symbols, parts, launch signature),
    /// as the kernel library records them beside the code. A loader compares it with the manifest's, so launch
    /// facts edited in a manifest (a swapped symbol, a part's extent, a signature) are refused even when the
    /// manifest was re-sealed: the code carries what it was compiled for.
    pub fn facts_digest(&self) -> [u8; 32] {
        let blank = KernelInfo { symbol: String::new(), ..self.clone() };
        let text = serde_json::to_string(&blank).expect("kernel facts serialize");
        *blake3::hash(text.as_bytes()).as_bytes()
    }
}

/// One top-level part of a kernel.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PartInfo {
    /// Trip count of the part's outermost loop, an IExpr over symbols only (1 for a part that is not one loop).
    pub extent: crate::kernel::IExpr,
    /// Whether `[begin, end)` chunks of it may run concurrently (its outermost loop is Parallel/Vectorizable).
    pub parallel: bool,
    /// Rough work per outer iteration (innermost stores and updates, symbolic inner trip counts taken as 64),
    /// to size chunks; at least 1.
    pub cost_per_iteration: u64,
}

/// The machine code is compiled for: the target triple and the extensions the code may use.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuTarget {
    /// The target triple (`x86_64-unknown-linux-gnu`, …).
    pub triple: String,
    /// The instruction-set extensions enabled for code generation, sorted.
    pub cpu_features: Vec<String>,
}

/// The triple of the running host.
pub fn host_triple() -> String {
    target_lexicon::HOST.to_string()
}

/// Cranelift's flag name (after `has_`) as Rust spells the feature.
pub fn rust_feature_name(cranelift: &str) -> &str {
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

impl PartInfo {
    /// The part's trip count for these symbol values (`None` if the extent names a symbol not given).
    pub fn trip_count(&self, symbols: &[i64]) -> Option<i64> {
        self.extent.eval(&|_| None, symbols).ok()
    }
}
