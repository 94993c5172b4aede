//! `kiln-runtime`: the backend contracts (submission, parameters, transfer, collectives, stateful execution),
//! the backend registry and C-ABI plugin loader, and the CPU and CUDA backends.
//!
//! It executes plans: a [`kiln_plan::exec::Executable`] bound to its kernels' code. It never runs the pass
//! pipeline or generates code, and it does not link the compiler (no Cranelift, no LLVM): the caller (the `kiln`
//! facade's JIT, or [`artifact`]'s loader reading what `kiln compile` wrote) hands it compiled kernels. The CPU
//! library ops the steps call (GEMM, convolution, pooling) are [`library`].

pub mod artifact;
pub mod bind;
pub mod checkpoint;
pub mod contract;
pub mod cpu;
pub mod cuda;
#[cfg(feature = "cli")]
pub mod inputs;
pub mod library;
pub mod log;
pub mod npy;
pub mod placement;
pub mod plugin;
pub mod prefix_cache;
pub mod recipe;
pub mod registry;
pub mod state;
pub mod weights;

use std::collections::BTreeMap;

pub use kiln_ir as ir;
use kiln_ir::{Tensor, TensorView};
pub use kiln_plan as plan;

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// A missing, unknown or mistyped input.
    #[error("bad input: {0}")]
    Input(String),
    /// A weight is missing or does not fit.
    #[error("weights: {0}")]
    Weights(String),
    /// An operation failed at run time (an integer division by zero in the interpreter fallback, say).
    #[error("{0}")]
    Op(String),
    /// Memory could not be allocated.
    #[error("memory: {0}")]
    Memory(String),
    /// A compiled artifact's code could not be loaded.
    #[error("{path}: {message}")]
    Load {
        /// The library file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The backend itself failed (a thread pool, an inconsistent executable).
    #[error("backend: {0}")]
    Backend(String),
    /// A backend cannot run this node.
    #[error("node `{node}`: {reason}")]
    Unsupported {
        /// The node's name.
        node: String,
        /// What is missing (the op, a capability, a dtype).
        reason: String,
    },
    /// No registered backend covers a node; `considered` says why each one did not.
    #[error("no backend can run node `{node}` ({kind}); considered: {}", if considered.is_empty() { "none registered".to_string() } else { considered.join("; ") })]
    NoBackend {
        /// The node's name.
        node: String,
        /// Its kind (op mnemonic or `token`).
        kind: String,
        /// One `name: reason` line per registered backend.
        considered: Vec<String>,
    },
    /// A registry operation failed (a duplicate name, a bad plugin spec).
    #[error("backend registry: {0}")]
    Registry(String),
    /// A plugin could not be loaded or failed.
    #[error("plugin `{name}`: {message}")]
    Plugin {
        /// The plugin's registered name (or its path, before it has one).
        name: String,
        /// What went wrong.
        message: String,
    },
    /// A node the placement put on another backend failed there.
    #[error("backend `{backend}` failed on {node}: {message}")]
    Placed {
        /// The registered backend.
        backend: String,
        /// The node, as the graph describes it.
        node: String,
        /// What the backend said.
        message: String,
    },
    /// A checkpoint could not be read or bound.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The checkpoint file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A state could not be exported or imported.
    #[error("state: {0}")]
    State(String),
    /// A collective operation failed.
    #[error("collective: {0}")]
    Collective(String),
    /// A device backend has no usable device here (no driver, no device, a failing driver).
    #[error("{backend}: {reason}")]
    NoDevice {
        /// The backend (`cuda`).
        backend: String,
        /// What is missing.
        reason: String,
    },
    /// Submitted work failed or could not be submitted.
    #[error("submission: {0}")]
    Submission(String),
}

impl RunError {
    /// The exit code a command-line tool gives this error (as `kiln` does, docs/cli.md): 3 a file or artifact
    /// could not be read or is malformed, 4 something is not supported here (a node, a device), 5 the inputs do
    /// not fit, 1 anything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Load { .. } | RunError::Checkpoint { .. } | RunError::Weights(_) => 3,
            RunError::Unsupported { .. } | RunError::NoBackend { .. } | RunError::NoDevice { .. } => 4,
            RunError::Input(_) => 5,
            _ => 1,
        }
    }
}

/// A profiled run: the outputs, and each step's wall time in step order.
pub type Profiled = (Vec<(String, Tensor)>, Vec<std::time::Duration>);

/// A loaded program on some backend — the one abstraction over everything that runs a compiled plan (the CPU
/// program, a device program): run it on named inputs, get its named outputs in order. Implementations are
/// `Send + Sync` and may be run from several threads at once.
pub trait Program: Send + Sync {
    /// The backend's name (`cpu`, `cuda`).
    fn backend(&self) -> &'static str;

    /// The executable it runs.
    fn executable(&self) -> &kiln_plan::exec::Executable;

    /// Runs the program.
    fn run(&self, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
        self.run_views(&bind::views(inputs))
    }

    /// Runs the program on borrowed inputs (by name, each once): a caller's memory is read where it is (on the
    /// CPU, bound without a copy).
    fn run_views(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<(String, Tensor)>, RunError>;

    /// Runs once, timing each step of the executable (in order); an error where the backend cannot time steps.
    fn run_profiled(&self, inputs: &BTreeMap<String, Tensor>) -> Result<Profiled, RunError> {
        let _ = inputs;
        Err(RunError::Backend(format!("the {} backend does not time single steps", self.backend())))
    }

    /// The device facts and timings of a program on an accelerator; `None` on the host.
    fn device(&self) -> Option<&dyn DeviceProgram> {
        None
    }

    /// The program as `Any`, to reach a backend's own API (weight swaps of a CPU program, say).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// What a program on an accelerator adds: its device and timings with the data resident there.
pub trait DeviceProgram {
    /// The device's name.
    fn device_name(&self) -> String;

    /// The steps' own time on the device, inputs resident and outputs left there: `runs` timings after `warmup`
    /// untimed runs.
    fn time_resident(
        &self,
        inputs: &BTreeMap<String, Tensor>,
        warmup: usize,
        runs: usize,
    ) -> Result<Vec<std::time::Duration>, RunError>;

    /// The device's copy bandwidth in GB/s (bytes read plus written per second, device to device, 256 MiB
    /// copies): what a memory-bound kernel is measured against.
    fn copy_bandwidth_gbps(&self) -> Result<f64, RunError>;
}

impl Program for cpu::CpuProgram {
    fn backend(&self) -> &'static str {
        "cpu"
    }

    fn executable(&self) -> &kiln_plan::exec::Executable {
        cpu::CpuProgram::executable(self)
    }

    fn run_views(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<(String, Tensor)>, RunError> {
        cpu::CpuProgram::run_views(self, inputs)
    }

    fn run_profiled(&self, inputs: &BTreeMap<String, Tensor>) -> Result<Profiled, RunError> {
        cpu::CpuProgram::run_profiled(self, inputs)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl<G: cuda::Gpu + 'static> Program for cuda::GpuProgram<G> {
    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn executable(&self) -> &kiln_plan::exec::Executable {
        cuda::GpuProgram::executable(self)
    }

    fn run_views(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<(String, Tensor)>, RunError> {
        cuda::GpuProgram::run_views(self, inputs)
    }

    fn device(&self) -> Option<&dyn DeviceProgram> {
        Some(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl<G: cuda::Gpu> DeviceProgram for cuda::GpuProgram<G> {
    fn device_name(&self) -> String {
        cuda::Gpu::name(self.gpu().as_ref())
    }

    fn time_resident(
        &self,
        inputs: &BTreeMap<String, Tensor>,
        warmup: usize,
        runs: usize,
    ) -> Result<Vec<std::time::Duration>, RunError> {
        cuda::GpuProgram::time_resident(self, inputs, warmup, runs)
    }

    fn copy_bandwidth_gbps(&self) -> Result<f64, RunError> {
        cuda::GpuProgram::copy_bandwidth_gbps(self, 256 << 20, 10)
    }
}

/// The process's peak resident set size in bytes (`getrusage`'s `ru_maxrss`), `None` where it is unavailable.
pub fn peak_rss_bytes() -> Option<u64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` fills the struct it is given; RUSAGE_SELF is always valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: initialized by the successful call above.
    let usage = unsafe { usage.assume_init() };
    // Linux reports kibibytes (macOS bytes; kiln's hosts are Linux).
    u64::try_from(usage.ru_maxrss).ok().map(|kib| kib * 1024)
}
