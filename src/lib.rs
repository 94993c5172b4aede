//! `kiln`: the library facade over the compiler crates, and the home of the `kiln` CLI.
//!
//! ```no_run
//! use std::collections::BTreeMap;
//! let model = kiln::Model::load("model.kir".as_ref(), &kiln::LoadOptions::default())?;
//! let inputs = model.random_inputs(&BTreeMap::new(), 0)?;
//! let outputs = model.run(&inputs, &kiln::RunOptions::default())?;
//! for (name, t) in &outputs {
//!     println!("{name}: {}", t.tensor_type());
//! }
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! Models come from `.kir` text (weights beside it in `NAME.safetensors`, or from a file you name), from the
//! graph's JSON form, or from a [`ir::Builder`] graph via [`Model::from_graph`]. They run on the reference
//! interpreter or, compiled ([`Model::compile`], JIT), on the CPU. [`Model::lower`] is the shared first half of
//! compiling; [`Artifact::write`] turns its result into an ahead-of-time artifact directory, and
//! [`Artifact::load`] loads one, without generating code, into the same [`Compiled`] the JIT gives.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use kiln_ir as ir;
use kiln_ir::{DType, Graph, Op, Tensor};

pub mod artifact;
pub mod conformance;
pub mod cuda;
pub mod difftest;
pub mod dot;
pub mod generate;
pub mod parameters;
pub mod session;

pub use artifact::Artifact;
pub use kiln_plan::exec::Fallback;
pub use kiln_runtime::cpu::CpuExecutor;
pub use kiln_runtime::cpu::WeightFingerprint;
pub use kiln_runtime::cpu::WeightLoadReport;
pub use kiln_runtime::registry::BackendRegistry;
pub use kiln_runtime::{npy, weights};
pub use parameters::WeightProvenance;
pub use session::{Session, SessionOptions};

/// Errors a kiln user can see.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading a file failed.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
    /// The model file's format is not one kiln reads (yet).
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// `.kir` text did not parse.
    #[error("{path}:{0}", path = .1)]
    Parse(kiln_ir::ParseError, String),
    /// The graph is malformed.
    #[error("{path}: {errors}")]
    Invalid {
        /// The model file.
        path: String,
        /// Every verifier error (shown in the message, not chained: it is the whole story).
        errors: kiln_ir::Error,
    },
    /// A weight file could not be used.
    #[error("weights {path}: {message}")]
    Weights {
        /// The weight file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Parameters without data.
    #[error("missing weights: {0} (give them with --weights FILE.safetensors)")]
    MissingWeights(String),
    /// Inputs given to `run` do not fit the model.
    #[error("{0}")]
    Input(String),
    /// The chosen backend cannot run this model (or is not built yet).
    #[error("backend `{backend}`: {message}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// Why it cannot run.
        message: String,
    },
    /// A device backend has no usable device on this machine (no driver, no GPU).
    #[error("backend `{backend}`: {reason}")]
    NoDevice {
        /// The backend's name.
        backend: &'static str,
        /// What is missing.
        reason: String,
    },
    /// Execution failed.
    #[error("execution failed at {0}")]
    Exec(#[from] kiln_ir::interp::InterpError),
    /// An ONNX model could not be imported.
    #[error("{path}: {0}", path = .1)]
    OnnxAt(kiln_onnx::ImportError, String),
    /// An ONNX model could not be imported (no path at hand).
    #[error(transparent)]
    Onnx(kiln_onnx::ImportError),
    /// A compiled artifact could not be written or loaded.
    #[error("artifact {path}: {message}")]
    Artifact {
        /// The artifact directory or the file in it.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// An `.npy` file could not be read or written.
    #[error(transparent)]
    Npy(#[from] npy::NpyError),
    /// A runtime operation failed: token decoding, a state that could not be imported.
    #[error(transparent)]
    Run(#[from] kiln_runtime::RunError),
    /// Nodes would run on the reference interpreter, and the policy is [`FallbackPolicy::Deny`].
    #[error("{}", kiln_plan::exec::fallback_refusal(.0))]
    Fallback(Vec<Fallback>),
}

/// What kind of failure an [`Error`] is: what a caller branches on (the Python package's exception classes, the C
/// API's status codes, the CLI's exit codes).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A file could not be read or written (missing, unreadable, a directory).
    Io,
    /// The model, weights or artifact is malformed.
    InvalidModel,
    /// The model is valid but uses something kiln does not support (an op, a dtype, a backend without a device,
    /// interpreter fallbacks refused).
    Unsupported,
    /// The inputs do not fit the model (names, dtypes, shapes, `.npy` files).
    InvalidInput,
    /// Running failed.
    Runtime,
}

impl Error {
    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        use kiln_onnx::ImportError;
        let import = match self {
            Error::Onnx(e) | Error::OnnxAt(e, _) => Some(e),
            _ => None,
        };
        if let Some(e) = import {
            return match e {
                ImportError::Io { .. } => ErrorKind::Io,
                ImportError::Decode(_) | ImportError::Invalid(_) => ErrorKind::InvalidModel,
                ImportError::Unsupported(_) => ErrorKind::Unsupported,
                ImportError::Input(_) => ErrorKind::InvalidInput,
            };
        }
        match self {
            Error::Io { .. } | Error::Npy(npy::NpyError::Io { .. }) => ErrorKind::Io,
            Error::Format { .. }
            | Error::Parse(..)
            | Error::Invalid { .. }
            | Error::Weights { .. }
            | Error::MissingWeights(_)
            | Error::Artifact { .. } => ErrorKind::InvalidModel,
            Error::Fallback(_) | Error::NoDevice { .. } | Error::Run(kiln_runtime::RunError::NoDevice { .. }) => {
                ErrorKind::Unsupported
            }
            Error::Input(_) | Error::Npy(_) | Error::Run(kiln_runtime::RunError::Input(_)) => ErrorKind::InvalidInput,
            Error::Onnx(_) | Error::OnnxAt(..) | Error::Backend { .. } | Error::Exec(_) | Error::Run(_) => {
                ErrorKind::Runtime
            }
        }
    }
}

impl From<kiln_runtime::weights::WeightsError> for Error {
    fn from(e: kiln_runtime::weights::WeightsError) -> Error {
        Error::Weights { path: e.path, message: e.message }
    }
}

/// Where a model runs.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The reference interpreter (`ir::interp`): slow, obviously correct, every op.
    Interp,
    /// Cranelift-compiled code on the host CPU (the default).
    #[default]
    Cpu,
    /// PTX kernels on an NVIDIA GPU.
    Cuda,
    /// The CUDA backend's runtime and kernels on an emulated device on the host (`cuda::run_emulated`): slow; for
    /// testing the GPU code path without a GPU. Needs the `ptx` feature.
    CudaEmulated,
}

/// What a backend is, as data: one row per [`Backend`], so its properties are columns of one table rather than
/// matches repeated through the facade and the CLI.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BackendInfo {
    /// The backend.
    pub backend: Backend,
    /// The name used on the command line.
    pub name: &'static str,
    /// The pass pipeline it compiles with (`None`: the model is not compiled — the interpreter).
    pub pipeline: Option<&'static str>,
    /// Whether `kiln compile` writes an artifact for it (`Model::compile` gives a program for it).
    pub compile_target: bool,
    /// Why it is not a compile target, when it is not.
    pub not_compiled: &'static str,
}

/// Every backend, in the order the CLI lists them.
pub const BACKENDS: [BackendInfo; 4] = [
    BackendInfo {
        backend: Backend::Interp,
        name: "interp",
        pipeline: None,
        compile_target: false,
        not_compiled: "the interpreter is not compiled",
    },
    BackendInfo {
        backend: Backend::Cpu,
        name: "cpu",
        pipeline: Some("cpu-default"),
        compile_target: true,
        not_compiled: "",
    },
    BackendInfo {
        backend: Backend::Cuda,
        name: "cuda",
        pipeline: Some("cuda-default"),
        compile_target: true,
        not_compiled: "",
    },
    BackendInfo {
        backend: Backend::CudaEmulated,
        name: "cuda-emulated",
        pipeline: Some("cuda-default"),
        compile_target: false,
        not_compiled: "the emulated device runs in-process (`kiln run --backend cuda-emulated`)",
    },
];

impl Backend {
    /// This backend's row of [`BACKENDS`].
    pub fn info(self) -> &'static BackendInfo {
        BACKENDS.iter().find(|i| i.backend == self).expect("every backend has a row in BACKENDS")
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        self.info().name
    }
}

impl FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Backend, String> {
        BACKENDS.iter().find(|i| i.name == s).map(|i| i.backend).ok_or_else(|| {
            let names: Vec<&str> = BACKENDS.iter().map(|i| i.name).collect();
            format!("unknown backend `{s}` (expected {})", names.join(", "))
        })
    }
}

/// How to load a model.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// A safetensors file with the weights; by default `NAME.safetensors` beside a `.kir` file, when present.
    pub weights: Option<PathBuf>,
    /// Static extents for inputs with symbolic dims (ONNX models are specialized to them at import).
    pub shapes: BTreeMap<String, Vec<usize>>,
    /// Input values an ONNX model is specialized on: each becomes a constant of the model and is no longer one
    /// of its inputs (see `kiln_onnx::ImportOptions::known_inputs`; the CLI's `--fix-input`).
    pub known_inputs: BTreeMap<String, Tensor>,
}

/// How to run a model.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The executor.
    pub backend: Backend,
    /// Worker threads (0: all cores). The interpreter is single-threaded.
    pub threads: usize,
    /// The backend registry that places the nodes of the compiled model (see [`CompileOptions::backends`]).
    pub backends: BackendRegistry,
    /// What to do about nodes the compiled backends run on the reference interpreter (see
    /// [`CompileOptions::fallback`]).
    pub fallback: FallbackPolicy,
}

/// What compiling does about nodes that are not compiled and run on the reference interpreter instead (a
/// feature not supported yet: they are correct, and slow). Compiler bugs are errors whatever the policy.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum FallbackPolicy {
    /// Fall back quietly (the report still lists them: [`Compiled::fallbacks`]).
    Allow,
    /// Fall back, and log each op kind at `warn` level (the CLI prints them as `fallback:` lines).
    #[default]
    Warn,
    /// Refuse to compile ([`Error::Fallback`]): every node must be compiled.
    Deny,
}

impl FallbackPolicy {
    /// The policy to compile with when the caller reports `warn`'s fallbacks itself (the CLI's `fallback:` lines,
    /// the Python package's warnings): `warn` becomes `allow`, the others stay.
    pub fn reported_by_caller(self) -> FallbackPolicy {
        match self {
            FallbackPolicy::Warn => FallbackPolicy::Allow,
            p => p,
        }
    }

    /// `allow`, `warn` or `deny`.
    pub fn name(self) -> &'static str {
        match self {
            FallbackPolicy::Allow => "allow",
            FallbackPolicy::Warn => "warn",
            FallbackPolicy::Deny => "deny",
        }
    }
}

impl FallbackPolicy {
    /// Applies the policy to a compiled program's `fallbacks`: an error when denied, a warning per op kind
    /// when warned, a log line otherwise.
    pub fn enforce(self, fallbacks: &[kiln_plan::exec::Fallback]) -> Result<(), Error> {
        if fallbacks.is_empty() {
            return Ok(());
        }
        match self {
            FallbackPolicy::Deny => return Err(Error::Fallback(fallbacks.to_vec())),
            FallbackPolicy::Warn => {
                for (op, n, why) in fallback_kinds(fallbacks) {
                    tracing::warn!(op, nodes = n, why, "interpreter fallback");
                }
            }
            FallbackPolicy::Allow => {
                tracing::info!(steps = fallbacks.len(), "interpreter fallbacks in the compiled model");
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for FallbackPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<FallbackPolicy, String> {
        match s {
            "allow" => Ok(FallbackPolicy::Allow),
            "warn" => Ok(FallbackPolicy::Warn),
            "deny" => Ok(FallbackPolicy::Deny),
            _ => Err(format!("`{s}` is not a fallback policy (allow, warn or deny)")),
        }
    }
}

pub use kiln_plan::exec::{fallback_kinds, fallback_lines};

/// How to compile a model ([`Model::compile`]).
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// The target: [`Backend::Cpu`], or [`Backend::Cuda`] for [`Model::lower`] and ahead-of-time PTX artifacts
    /// (the interpreter needs no compilation; [`Model::compile_cuda`] compiles for a device in memory).
    pub backend: Backend,
    /// The pass pipeline run before code generation (`cpu-default`, `O0`…`O3`, or any pipeline string).
    pub pipeline: String,
    /// Worker threads of the compiled program (0: all cores).
    pub threads: usize,
    /// The backend registry: each node goes to the highest-priority backend whose capabilities cover it
    /// (`kiln_runtime::placement`). Nodes won by a plugin run there; the rest are compiled for `backend`. The
    /// default registry is empty: everything is compiled. The CLI uses [`BackendRegistry::from_env`] (the
    /// built-in backends and `KILN_BACKEND_PLUGINS`).
    pub backends: BackendRegistry,
    /// What to do about nodes that would run on the reference interpreter ([`FallbackPolicy`]; default: warn).
    pub fallback: FallbackPolicy,
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions {
            backend: Backend::Cpu,
            pipeline: "cpu-default".into(),
            threads: 0,
            backends: BackendRegistry::new(),
            fallback: FallbackPolicy::default(),
        }
    }
}

/// What compiling produced, for reports (`kiln bench`, `--verbose`); for a loaded artifact, what it holds and
/// how long loading took.
#[derive(Clone, Debug, Default)]
pub struct CompileReport {
    /// Wall time of the pass pipeline.
    pub passes: std::time::Duration,
    /// Wall time of building the executable (lowering to kernel IR).
    pub lowering: std::time::Duration,
    /// Wall time of machine-code generation.
    pub codegen: std::time::Duration,
    /// Distinct kernels generated.
    pub kernels: usize,
    /// Steps by kind: library calls, kernel launches, interpreter fallbacks, copies, steps on other backends of
    /// the registry (plugins).
    pub steps: [usize; 5],
    /// Nodes run by the interpreter fallback, with why.
    pub fallbacks: Vec<Fallback>,
    /// Bytes of the per-run arena.
    pub arena_bytes: u64,
    /// Wall time of loading a compiled artifact ([`Artifact::load`]); zero when compiled in this process.
    pub load: std::time::Duration,
    /// The part of [`CompileReport::load`] spent reading the weights file.
    pub weights_load: std::time::Duration,
    /// Wall time of binding the weights when the program was built: its prepare steps (weight transposes,
    /// constant broadcasts: [`kiln_ir::memory::computed_at_load`]) and packing or transforming the weights its
    /// library calls read. Work per weight byte, not per node: it grows with the model's size, like reading
    /// its weights. Included in [`CompileReport::load`] for an artifact.
    pub prepare: std::time::Duration,
    /// The nodes the backend registry placed on backends other than the compiled code, by backend.
    pub placement: Vec<kiln_plan::artifact::PlacementRecord>,
}

/// A compiled model on any target — the one handle over every loaded program (`kiln_runtime::Program`: the CPU
/// program, a CUDA device's): run it as often as you like, from several threads at once.
pub struct Compiled {
    program: std::sync::Arc<dyn kiln_runtime::Program>,
    report: CompileReport,
    inputs: Vec<(String, kiln_ir::TensorType)>,
    /// Which weights are the model's and which the compiler's, for weight swaps; `None` when unknown (an
    /// artifact written before kiln recorded it): then every weight the program reads is required.
    provenance: Option<WeightProvenance>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("backend", &self.program.backend())
            .field("graph", &self.program.executable().name)
            .field("inputs", &self.inputs.len())
            .finish()
    }
}

impl Compiled {
    /// Binds an executable to its code on the CPU backend (running its prepare steps), with the backends its
    /// placed steps name from `backends`.
    fn new(
        exe: kiln_codegen::exec::Executable,
        code: kiln_runtime::cpu::KernelCode,
        threads: usize,
        report: CompileReport,
        inputs: Vec<(String, kiln_ir::TensorType)>,
        backends: &BackendRegistry,
    ) -> Result<Compiled, Error> {
        let t = std::time::Instant::now();
        let program = kiln_runtime::cpu::CpuProgram::with_backends(exe, code, resolve_threads(threads)?, backends)
            .map_err(run_error)?;
        let report = CompileReport { prepare: t.elapsed(), ..report };
        let mut compiled = Compiled::from_program(program, report);
        compiled.inputs = inputs;
        Ok(compiled)
    }

    /// Wraps a program the runtime bound (a loaded artifact's, a device's); the inputs are its executable's.
    pub(crate) fn from_program(program: impl kiln_runtime::Program + 'static, report: CompileReport) -> Compiled {
        let exe = program.executable();
        let inputs = exe.inputs.iter().map(|(n, b)| (n.clone(), exe.buffers[b.0 as usize].ty.clone())).collect();
        Compiled { program: std::sync::Arc::new(program), report, inputs, provenance: None }
    }

    /// The backend the program runs on (`cpu`, `cuda`).
    pub fn backend(&self) -> &'static str {
        self.program.backend()
    }

    /// The device facts and timings of a program on an accelerator (device name, data-resident step times, copy
    /// bandwidth); `None` on the CPU.
    pub fn device(&self) -> Option<&dyn kiln_runtime::DeviceProgram> {
        self.program.device()
    }

    /// The CPU program, for what only it does (weight swaps); an error naming the backend otherwise.
    pub(crate) fn cpu_program(&self) -> Result<&kiln_runtime::cpu::CpuProgram, Error> {
        self.program.as_any().downcast_ref::<kiln_runtime::cpu::CpuProgram>().ok_or_else(|| Error::Backend {
            backend: self.program.backend(),
            message: "weight swaps are the cpu backend's (recompile, or load the artifact, to change weights)".into(),
        })
    }

    /// Runs the compiled model on named inputs; outputs come in the model's order.
    pub fn run(&self, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, Error> {
        kiln_runtime::Program::run(self.program.as_ref(), inputs).map_err(run_error)
    }

    /// Runs the compiled model on borrowed inputs (by name, each once): on the CPU their memory is bound as it is,
    /// never copied (what the Python package and the C API hand over); outputs come in the model's order.
    pub fn run_views(&self, inputs: &[(&str, kiln_ir::TensorView<'_>)]) -> Result<Vec<(String, Tensor)>, Error> {
        self.program.run_views(inputs).map_err(run_error)
    }

    /// Output names and types, in order.
    pub fn outputs(&self) -> Vec<(String, kiln_ir::TensorType)> {
        let exe = self.program.executable();
        exe.outputs.iter().map(|(n, b)| (n.clone(), exe.buffers[b.0 as usize].ty.clone())).collect()
    }

    /// `count` independent executors (in-order lanes, each its own thread) for serving requests concurrently
    /// with [`Compiled::submit`]. Work on one lane runs in order; lanes run side by side and share the program's
    /// kernels, weights and thread pool.
    pub fn executors(&self, count: usize) -> Result<Vec<CpuExecutor>, Error> {
        (0..count).map(|i| CpuExecutor::new(format!("request-{i}")).map_err(run_error)).collect()
    }

    /// Submits a run on `executor` and returns at once; [`Request::wait`] gives the outputs. The inputs move into
    /// the request and are dropped when it completes.
    pub fn submit(&self, executor: &CpuExecutor, inputs: BTreeMap<String, Tensor>) -> Result<Request, Error> {
        let program = std::sync::Arc::clone(&self.program);
        let pending = executor
            .submit_with_result(move || kiln_runtime::Program::run(program.as_ref(), &inputs))
            .map_err(run_error)?;
        Ok(Request { pending })
    }

    /// Runs once and returns each step's description and wall time, in execution order.
    pub fn profile_in_order(
        &self,
        inputs: &BTreeMap<String, Tensor>,
    ) -> Result<Vec<(String, std::time::Duration)>, Error> {
        Ok(self.profile_steps(inputs)?.into_iter().map(|p| (p.what, p.time)).collect())
    }

    /// Runs once and returns every step in execution order: what it is, the model nodes it computes, and its
    /// wall time (`kiln bench --profile` and `--trace`).
    pub fn profile_steps(&self, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<StepProfile>, Error> {
        let (_, times) = self.program.run_profiled(inputs).map_err(run_error)?;
        let exe = self.program.executable();
        Ok(exe
            .steps
            .iter()
            .zip(times)
            .enumerate()
            .map(|(i, (s, time))| StepProfile { what: exe.describe(s), source: exe.source(i), time })
            .collect())
    }

    /// Runs once and returns each step's description and wall time, slowest first (`kiln bench --profile`).
    pub fn profile(&self, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<(String, std::time::Duration)>, Error> {
        let mut out = self.profile_in_order(inputs)?;
        out.sort_by_key(|(_, t)| std::cmp::Reverse(*t));
        Ok(out)
    }

    /// `given` plus deterministic pseudo-random values for the inputs it lacks (as [`Model::complete_inputs`]).
    pub fn complete_inputs(
        &self,
        given: BTreeMap<String, Tensor>,
        shapes: &BTreeMap<String, Vec<usize>>,
        seed: u64,
    ) -> Result<BTreeMap<String, Tensor>, Error> {
        complete_inputs(&self.inputs, given, shapes, seed)
    }

    /// What compiling did.
    pub fn report(&self) -> &CompileReport {
        &self.report
    }

    /// The nodes this program runs on the reference interpreter, with why each is not compiled (empty when
    /// everything is compiled). [`fallback_kinds`] groups them by op.
    pub fn fallbacks(&self) -> &[Fallback] {
        &self.report.fallbacks
    }

    /// Input names and declared types, in order.
    pub fn inputs(&self) -> &[(String, kiln_ir::TensorType)] {
        &self.inputs
    }
}

/// One step of a profiled run ([`Compiled::profile_steps`]).
#[derive(Clone, Debug)]
pub struct StepProfile {
    /// What the step is (`library matmul + epilogue -> f32[1,512]`, `kernel k3_loop -> …`).
    pub what: String,
    /// The model nodes it computes (empty for an artifact written before kiln recorded them).
    pub source: kiln_plan::exec::StepSource,
    /// Its wall time.
    pub time: std::time::Duration,
}

/// A run submitted with [`Compiled::submit`].
pub struct Request {
    pending: kiln_runtime::cpu::Pending<Vec<(String, Tensor)>>,
}

impl Request {
    /// The run's exact completion: poll it, or order another executor after it.
    pub fn completion(&self) -> &kiln_runtime::cpu::CpuCompletion {
        self.pending.completion()
    }

    /// Waits for the run; its outputs in the model's order.
    pub fn wait(self) -> Result<Vec<(String, Tensor)>, Error> {
        self.pending.wait().map_err(run_error)
    }
}

/// A runtime error as the facade reports it: bad inputs as [`Error::Input`], the rest as the backend's.
fn run_error(e: kiln_runtime::RunError) -> Error {
    match e {
        kiln_runtime::RunError::Input(m) => Error::Input(m),
        kiln_runtime::RunError::NoDevice { reason, .. } => Error::NoDevice { backend: "cuda", reason },
        kiln_runtime::RunError::Load { path, message } => Error::Artifact { path, message },
        // They name their backend (a plugin) and the node themselves.
        e @ (kiln_runtime::RunError::Placed { .. }
        | kiln_runtime::RunError::Plugin { .. }
        | kiln_runtime::RunError::Registry(_)) => Error::Run(e),
        e => Error::Backend { backend: "cpu", message: e.to_string() },
    }
}

/// A CUDA runtime error as the facade reports it: as [`run_error`], attributed to the cuda backend.
fn cuda_run_error(e: kiln_runtime::RunError) -> Error {
    match run_error(e) {
        Error::Backend { message, .. } => Error::Backend { backend: "cuda", message },
        e => e,
    }
}

/// Worker threads for a request of `n` (0: all cores); more than the cap (`kiln_runtime::cpu::resolve_threads`)
/// is an error.
pub fn resolve_threads(n: usize) -> Result<usize, Error> {
    kiln_runtime::cpu::resolve_threads(n).map_err(run_error)
}

/// A loaded model: a verified graph with its weights.
#[derive(Clone, Debug)]
pub struct Model {
    graph: Graph,
}

/// Reads a file into a string, naming it in the error.
fn read_text(path: &Path) -> Result<String, Error> {
    kiln_ir::io::read_text(path).map_err(|e| Error::Io { path: path.display().to_string(), message: e.to_string() })
}

impl Model {
    /// Loads a `.kir` or graph-JSON model; weights come from `options.weights` or a `.safetensors` sibling.
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Model, Error> {
        let shown = path.display().to_string();
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let mut graph = match ext {
            "kir" => kiln_ir::parse(&read_text(path)?).map_err(|e| Error::Parse(e, shown.clone()))?,
            "json" => Graph::from_json(&read_text(path)?).map_err(|e| Error::Format {
                path: shown.clone(),
                message: format!("not a kiln graph JSON document: {e}"),
            })?,
            "onnx" => kiln_onnx::import(
                path,
                &kiln_onnx::ImportOptions {
                    shapes: options.shapes.clone(),
                    known_inputs: options.known_inputs.clone(),
                },
            )
            .map_err(|e| match e {
                // These name the file already (an I/O error names the file it could not read, which may be
                // external data beside the model).
                e @ (kiln_onnx::ImportError::Unsupported(_) | kiln_onnx::ImportError::Io { .. }) => Error::Onnx(e),
                e => Error::OnnxAt(e, shown.clone()),
            })?,
            _ if path.is_dir() => {
                return Err(Error::Format {
                    path: shown,
                    message: if path.join(kiln_plan::artifact::MANIFEST_FILE).exists() {
                        "a directory whose manifest.json is not a file: not an artifact of `kiln compile`".into()
                    } else {
                        "a directory is not a model (nor an artifact: no manifest.json, which `kiln compile` writes)"
                            .into()
                    },
                });
            }
            _ => {
                return Err(Error::Format {
                    path: shown,
                    message: "unknown model format (expected an .onnx, .kir or kiln graph .json file, or an artifact \
                              directory of `kiln compile`)"
                        .into(),
                });
            }
        };
        let weights_path = options.weights.clone().or_else(|| {
            let sibling = path.with_extension("safetensors");
            sibling.is_file().then_some(sibling)
        });
        if let Some(w) = weights_path {
            for (name, t) in weights::load(&w)?.iter() {
                graph.weights.insert(name, t.clone());
            }
        }
        kiln_ir::verify(&graph).map_err(|errs| Error::Invalid { path: shown, errors: kiln_ir::Error::Verify(errs) })?;
        Ok(Model { graph })
    }

    /// Imports an ONNX model from its bytes (`shown` names it in messages); external data is refused, having no
    /// folder to resolve against.
    pub fn from_onnx_bytes(bytes: &[u8], shown: &str, options: &LoadOptions) -> Result<Model, Error> {
        let import =
            kiln_onnx::ImportOptions { shapes: options.shapes.clone(), known_inputs: options.known_inputs.clone() };
        let graph = kiln_onnx::import_bytes(bytes, None, &import).map_err(|e| match e {
            e @ kiln_onnx::ImportError::Unsupported(_) => Error::Onnx(e),
            e => Error::OnnxAt(e, shown.to_string()),
        })?;
        kiln_ir::verify(&graph)
            .map_err(|errs| Error::Invalid { path: shown.to_string(), errors: kiln_ir::Error::Verify(errs) })?;
        Ok(Model { graph })
    }

    /// Wraps a graph (from the builder, say), verifying it.
    pub fn from_graph(graph: Graph) -> Result<Model, Error> {
        kiln_ir::verify(&graph).map_err(|errs| Error::Invalid {
            path: format!("graph `{}`", graph.name()),
            errors: kiln_ir::Error::Verify(errs),
        })?;
        Ok(Model { graph })
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Input names and declared types, in order.
    pub fn inputs(&self) -> Vec<(String, kiln_ir::TensorType)> {
        self.graph
            .inputs()
            .iter()
            .filter_map(|&id| {
                let n = self.graph.node(id);
                match &n.op {
                    Op::Input(i) => Some((i.name.clone(), n.outputs[0].clone())),
                    _ => None,
                }
            })
            .collect()
    }

    /// Deterministic pseudo-random values for every input not in `given`, using `shapes` (name → extents) for
    /// inputs with symbolic dims; symbols already bound by `given` or earlier inputs are reused.
    pub fn random_inputs(
        &self,
        shapes: &BTreeMap<String, Vec<usize>>,
        seed: u64,
    ) -> Result<BTreeMap<String, Tensor>, Error> {
        self.complete_inputs(BTreeMap::new(), shapes, seed)
    }

    /// `given` plus random values for the inputs it lacks (see [`Model::random_inputs`]).
    pub fn complete_inputs(
        &self,
        given: BTreeMap<String, Tensor>,
        shapes: &BTreeMap<String, Vec<usize>>,
        seed: u64,
    ) -> Result<BTreeMap<String, Tensor>, Error> {
        complete_inputs(&self.inputs(), given, shapes, seed)
    }

    /// Runs the model. Every input must be given, with the declared dtype and a shape that fits.
    pub fn run(&self, inputs: &BTreeMap<String, Tensor>, options: &RunOptions) -> Result<Vec<(String, Tensor)>, Error> {
        let declared = self.inputs();
        for name in inputs.keys() {
            if !declared.iter().any(|(n, _)| n == name) {
                return Err(Error::Input(format!(
                    "the model has no input `{name}` (inputs: {})",
                    kiln_runtime::bind::names(&declared)
                )));
            }
        }
        if let Some((missing, _)) = declared.iter().find(|(n, _)| !inputs.contains_key(n)) {
            return Err(Error::Input(format!("input `{missing}` is missing")));
        }
        kiln_runtime::bind::bind_declared(&declared, inputs).map_err(run_error)?;
        kiln_ir::verify_weights_bound(&self.graph)
            .map_err(|errs| Error::MissingWeights(errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ")))?;
        match options.backend {
            Backend::Interp => Ok(kiln_ir::interp::run(&self.graph, inputs)?),
            Backend::CudaEmulated => self.run_cuda_emulated(inputs, options),
            backend @ (Backend::Cpu | Backend::Cuda) => self
                .compile(&CompileOptions {
                    backend,
                    threads: options.threads,
                    backends: options.backends.clone(),
                    fallback: options.fallback,
                    ..CompileOptions::default()
                })?
                .run(inputs),
        }
    }

    /// The part of compiling shared by the JIT ([`Model::compile`]) and ahead-of-time artifacts
    /// ([`Artifact::write`]): the pass pipeline, then lowering to an executable. No machine code yet.
    pub fn lower(&self, options: &CompileOptions) -> Result<Lowered, Error> {
        let mut inst = kiln_passes::Instrumentation { reproducer: kiln_passes::Reproducer::Off, ..Default::default() };
        self.lower_instrumented(options, &mut inst)
    }

    /// [`Model::lower`] with the pass manager's instrumentation (IR dumps, timing, verification) as given.
    pub fn lower_instrumented(
        &self,
        options: &CompileOptions,
        inst: &mut kiln_passes::Instrumentation<'_>,
    ) -> Result<Lowered, Error> {
        let backend = options.backend;
        let fail = |message: String| Error::Backend { backend: backend.name(), message };
        // Lowering is target-independent ("one lowering, two emitters"): the CUDA target starts from the same
        // executable; only code generation differs.
        if backend.info().pipeline.is_none() {
            return Err(fail(backend.info().not_compiled.into()));
        }
        kiln_ir::verify_weights_bound(&self.graph)
            .map_err(|errs| Error::MissingWeights(errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ")))?;
        let mut report = CompileReport::default();
        let t0 = std::time::Instant::now();
        let mut graph = self.graph.clone();
        let pm = kiln_passes::PassManager::parse(&options.pipeline)
            .map_err(|e| fail(format!("pipeline `{}`: {e}", options.pipeline)))?;
        let placement = kiln_runtime::placement::for_ops(&options.backends);
        let cx = kiln_passes::PassContext { placed_elsewhere: placement.op_kinds(), ..Default::default() };
        pm.run(&mut graph, &cx, inst).map_err(|e| fail(e.to_string()))?;
        report.passes = t0.elapsed();
        let t1 = std::time::Instant::now();
        let executable = kiln_codegen::exec::build_placed(&graph, &placement).map_err(|e| fail(e.to_string()))?;
        let placed: Vec<kiln_plan::artifact::PlacementRecord> = executable
            .placed_nodes()
            .into_iter()
            .map(|(backend, nodes)| {
                let priority = options.backends.priority(&backend).unwrap_or_default();
                kiln_plan::artifact::PlacementRecord { backend, priority, nodes }
            })
            .collect();
        report.lowering = t1.elapsed();
        report.kernels = executable.kernels.len();
        report.steps = executable.step_counts();
        report.fallbacks = executable.fallbacks.clone();
        report.arena_bytes = executable.arena_bytes;
        let program_weights = executable
            .buffers
            .iter()
            .filter_map(|b| match &b.home {
                kiln_codegen::exec::Home::Weight(name) => Some(name.clone()),
                _ => None,
            })
            .collect();
        let provenance = WeightProvenance::new(&self.graph, &program_weights);
        report.placement = placed.clone();
        for p in &placed {
            tracing::info!(backend = %p.backend, priority = p.priority, nodes = p.nodes.len(), "placement");
        }
        options.fallback.enforce(&executable.fallbacks)?;
        Ok(Lowered {
            graph,
            executable,
            report,
            inputs: self.inputs(),
            provenance,
            placement: placed,
            backends: options.backends.clone(),
            fallback: options.fallback,
        })
    }

    /// Compiles the model for `options.backend` into a [`Compiled`]: [`Model::lower`], then code in memory — the
    /// CPU's JIT, or PTX bound to CUDA device 0 ([`Model::compile_cuda`] picks the device). The interpreter and
    /// the emulated device are not compile targets.
    pub fn compile(&self, options: &CompileOptions) -> Result<Compiled, Error> {
        match options.backend {
            Backend::Cpu => self.compile_cpu(options),
            Backend::Cuda => {
                let pipeline =
                    (options.pipeline != CompileOptions::default().pipeline).then_some(options.pipeline.as_str());
                self.compile_cuda(0, pipeline, options)
            }
            b @ (Backend::Interp | Backend::CudaEmulated) => Err(Error::Backend {
                backend: b.name(),
                message: format!("not a compile target: {} (`Model::run` runs it)", b.info().not_compiled),
            }),
        }
    }

    /// The CPU target: machine code in memory through Cranelift's JIT.
    fn compile_cpu(&self, options: &CompileOptions) -> Result<Compiled, Error> {
        let Lowered { executable: exe, mut report, inputs, provenance, backends, .. } = self.lower(options)?;
        let fail = |message: String| Error::Backend { backend: options.backend.name(), message };
        let t2 = std::time::Instant::now();
        let jit = kiln_codegen::cpu::JitModule::compile(&exe.kernels, &kiln_codegen::cpu::CpuOptions::default())
            .map_err(|e| fail(e.to_string()))?;
        let entries = (0..jit.len()).map(|i| (jit.entry(i), jit.info(i).clone())).collect();
        report.codegen = t2.elapsed();
        let code = kiln_runtime::cpu::KernelCode::Native { entries, owner: Box::new(jit) };
        let mut compiled = Compiled::new(exe, code, options.threads, report, inputs, &backends)?;
        compiled.provenance = Some(provenance);
        Ok(compiled)
    }
}

/// A model after its pass pipeline and lowering ([`Model::lower`]): what both the JIT and an ahead-of-time
/// artifact start from.
#[derive(Clone, Debug)]
pub struct Lowered {
    /// The optimized graph.
    pub graph: Graph,
    /// Its executable (kernel IR included, no machine code).
    pub executable: kiln_codegen::exec::Executable,
    /// Pass and lowering times, step mix (machine-code time still zero).
    pub report: CompileReport,
    /// The model's inputs, names and declared types, in order.
    pub inputs: Vec<(String, kiln_ir::TensorType)>,
    /// Which of the executable's weights are the model's (for weight swaps).
    pub provenance: WeightProvenance,
    /// The nodes placed on registry backends other than the compiled code, by backend.
    pub placement: Vec<kiln_plan::artifact::PlacementRecord>,
    /// The registry that placed them (binding the program resolves the backends from it).
    pub backends: BackendRegistry,
    /// The fallback policy it was lowered under: a device plan made from it (which runs more on the host)
    /// answers to it too.
    pub fallback: FallbackPolicy,
}

/// `given` plus deterministic pseudo-random values for the `inputs` it lacks (see [`Model::random_inputs`]).
fn complete_inputs(
    inputs: &[(String, kiln_ir::TensorType)],
    given: BTreeMap<String, Tensor>,
    shapes: &BTreeMap<String, Vec<usize>>,
    seed: u64,
) -> Result<BTreeMap<String, Tensor>, Error> {
    kiln_runtime::bind::complete_inputs(inputs, given, shapes, seed).map_err(run_error)
}

/// The dtypes a CLI user can name, for messages.
pub fn dtype_names() -> String {
    DType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
}
