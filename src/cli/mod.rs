//! Command-line parsing (clap) and dispatch to one module per subcommand.

mod backends;
mod bench;
mod check;
mod compile;
mod conformance;
mod generate;
mod inspect;
mod opt;
mod run;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

/// kiln: a tensor-graph compiler toolchain.
#[derive(Parser, Debug)]
#[command(name = "kiln", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: kiln_runtime::log::LogArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a model on inputs (given as .npy files, or deterministic pseudo-random) and write its outputs.
    Run(run::RunArgs),
    /// Compile a model ahead of time into an artifact directory (manifest, weights, kernel library) that `run`
    /// and `bench` load without generating code.
    Compile(compile::CompileArgs),
    /// Print a model as .kir text, or write it to a file.
    Opt(opt::OptArgs),
    /// Summarize a model: inputs, outputs, op histogram, parameters.
    Inspect(inspect::InspectArgs),
    /// List every unsupported op, attribute value and dtype of an ONNX model (exit 1 if there is any).
    Check(check::CheckArgs),
    /// Compile a model and time runs of it (compile time, latency statistics, peak RSS; --json for scripts).
    Bench(bench::BenchArgs),
    /// Run ONNX backend node tests (case folders of model.onnx + test_data_set_*) and compare outputs.
    Conformance(conformance::ConformanceArgs),
    /// List the node backends (built-in and plugins from KILN_BACKEND_PLUGINS=name=path[:priority],...), best
    /// first: name, priority, tensor backend type, capabilities.
    Backends(backends::BackendsArgs),
    /// Greedy generation with a decoder step model (a key/value cache model such as gpt2_small_step): prints the
    /// generated ids and the prefix-cache counters; states can be saved and resumed across processes.
    Generate(generate::GenerateArgs),
}

/// Options shared by every command that loads a model.
#[derive(Args, Debug)]
pub struct ModelArgs {
    /// The model: a .kir file (weights from NAME.safetensors beside it, if present), a kiln graph .json or an
    /// .onnx file; `run` and `bench` also take an artifact directory written by `kiln compile`.
    pub model: PathBuf,
    /// A safetensors file holding the model's weights (for `run ARTIFACT_DIR`: replaces the artifact's weights).
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
    /// Static extents for an input with symbolic dims: NAME=DxDxD (repeatable; `scalar` for rank 0).
    #[arg(long = "shape", value_name = "NAME=DxD")]
    pub shapes: Vec<String>,
    /// Specialize an ONNX model on an input's value: NAME=FILE.npy (repeatable). The input becomes a constant of
    /// the model — shape arguments fed as inputs (axes, pads, sizes, a sample rate) resolve at compile time —
    /// and is no longer an input of it.
    #[arg(long = "fix-input", value_name = "NAME=FILE.npy")]
    pub fix_inputs: Vec<String>,
    /// Bind deterministic pseudo-random weights to every param that has none (the i-th param, in graph order,
    /// gets the values of seed SEED + i); its dims must be static.
    #[arg(long, value_name = "SEED")]
    pub random_weights: Option<u64>,
}

/// The input options of `run` and `bench` (shared with `kiln-serve`), completed by a model's own rule; also the
/// names that got pseudo-random values, for `InputArgs::note` once the model is compiled and about to run (so a
/// model that fails to compile gets its one error line, not a note first).
pub fn complete_inputs(
    args: &kiln_runtime::inputs::InputArgs,
    given: BTreeMap<String, kiln_ir::Tensor>,
    declared: &[(String, kiln_ir::TensorType)],
    complete: impl FnOnce(
        BTreeMap<String, kiln_ir::Tensor>,
        u64,
    ) -> std::result::Result<BTreeMap<String, kiln_ir::Tensor>, kiln::Error>,
) -> Result<(BTreeMap<String, kiln_ir::Tensor>, Vec<String>)> {
    let missing = args.missing(&given, declared)?;
    Ok((complete(given, args.seed)?, missing))
}

impl ModelArgs {
    fn load(&self) -> Result<kiln::Model> {
        self.load_with(BTreeMap::new())
    }

    /// Loads with `--shape` plus the extra shapes (from given input files), which win over nothing: a conflict
    /// between the two is an error.
    fn load_with(&self, mut shapes: BTreeMap<String, Vec<usize>>) -> Result<kiln::Model> {
        for (name, dims) in parse_shapes(&self.shapes)? {
            if let Some(given) = shapes.get(&name)
                && *given != dims
            {
                bail!("--shape {name} disagrees with the shape {given:?} of the given input");
            }
            shapes.insert(name, dims);
        }
        let known_inputs = read_fixed_inputs(&self.fix_inputs)?;
        if !known_inputs.is_empty() && self.model.extension().is_none_or(|e| e != "onnx") {
            bail!("--fix-input specializes ONNX models; {} is not one", self.model.display());
        }
        if let Some(name) = known_inputs.keys().find(|n| shapes.contains_key(*n)) {
            bail!("--fix-input `{name}` fixes that input: it cannot also be given (--input) or shaped (--shape)");
        }
        for (name, t) in &known_inputs {
            shapes.insert(name.clone(), t.shape().to_vec());
        }
        let model =
            kiln::Model::load(&self.model, &kiln::LoadOptions { weights: self.weights.clone(), shapes, known_inputs })?;
        match self.random_weights {
            Some(seed) => bind_random_weights(model, seed),
            None => Ok(model),
        }
    }

    /// Refuses `--random-weights` where the model is a compiled artifact (its weights are already bound).
    fn check_no_random_weights(&self) -> Result<()> {
        if self.random_weights.is_some() {
            bail!("--random-weights: a compiled artifact carries its weights ({})", self.model.display());
        }
        Ok(())
    }

    /// The `--shape` options.
    fn shapes(&self) -> Result<BTreeMap<String, Vec<usize>>> {
        parse_shapes(&self.shapes)
    }
}

/// Binds `Tensor::random(dtype, dims, seed + i)` to the `i`-th param (in graph order) wherever the model has no
/// weight of that name; `i` counts every param, so a param's values do not depend on which others are bound.
fn bind_random_weights(model: kiln::Model, seed: u64) -> Result<kiln::Model> {
    let mut graph = model.graph().clone();
    let mut bound = Vec::new();
    for (i, id) in graph.params().enumerate() {
        let node = graph.node(id);
        let kiln_ir::Op::Parameter(p) = &node.op else { unreachable!("params() yields param nodes") };
        if graph.weights.get(&p.name).is_some() {
            continue;
        }
        let ty = &node.outputs[0];
        let Some(dims) = ty.shape.as_static() else {
            bail!("--random-weights: param `{}` has symbolic dims ({ty}); random weights need static dims", p.name);
        };
        bound.push((p.name.clone(), kiln_ir::Tensor::random(ty.dtype, dims, seed.wrapping_add(i as u64))));
    }
    for (name, t) in bound {
        graph.weights.insert(name, t);
    }
    Ok(kiln::Model::from_graph(graph)?)
}

/// The backend registry of every command that compiles or runs models: the built-in backends plus the plugins
/// `KILN_BACKEND_PLUGINS` lists. A malformed list, or a plugin that does not load, is the command's error.
pub fn registry() -> Result<kiln::BackendRegistry> {
    kiln::BackendRegistry::from_env()
        .with_context(|| format!("loading the plugins in {}", kiln_runtime::registry::PLUGINS_ENV_VAR))
}

/// `--fallback`: what `run`, `bench` and `compile` do about nodes the compiled code cannot run.
#[derive(Args, Debug, Clone)]
pub struct FallbackArgs {
    /// Nodes the compiled backend cannot run yet run on the reference interpreter (correct, slow): `warn` runs
    /// them and prints one `fallback:` line per op kind, `allow` runs them without the lines, `deny` refuses the
    /// model (exit 1, naming them). Also applies to a compiled artifact.
    #[arg(long = "fallback", value_name = "POLICY", default_value = "warn")]
    pub policy: kiln::FallbackPolicy,
}

impl FallbackArgs {
    /// The policy the library gets: `warn`'s lines are printed by the CLI ([`placement_lines`]), not logged.
    pub fn library(&self) -> kiln::FallbackPolicy {
        self.policy.reported_by_caller()
    }

    /// `deny` on a program compiled before (an artifact): refused when it runs nodes on the interpreter.
    pub fn check(&self, report: &kiln::CompileReport) -> Result<()> {
        if self.policy == kiln::FallbackPolicy::Deny && !report.fallbacks.is_empty() {
            return Err(kiln::Error::Fallback(report.fallbacks.clone()).into());
        }
        Ok(())
    }

    /// [`placement_lines`] under this policy (`allow` leaves the fallback lines out).
    pub fn lines(&self, report: &kiln::CompileReport) -> Vec<String> {
        placement_lines(report, self.policy != kiln::FallbackPolicy::Allow)
    }
}

/// What a compiled model does not run as compiled code, for `run`, `bench` and `compile`: one line per registry
/// backend that takes nodes from the compiled code, and one per op kind that runs on the reference interpreter
/// (how many nodes, and why; left out without `fallbacks`, for `--fallback allow`) — nothing when everything is
/// compiled. Never a silent slow path.
pub fn placement_lines(report: &kiln::CompileReport, fallbacks: bool) -> Vec<String> {
    let fallback_lines = kiln_plan::exec::fallback_lines(&report.fallbacks).into_iter().filter(|_| fallbacks);
    report
        .placement
        .iter()
        .map(|p| {
            // Nodes are described as `<op> <name or id>`.
            let mut kinds: Vec<&str> = p.nodes.iter().filter_map(|n| n.split_whitespace().next()).collect();
            kinds.sort();
            kinds.dedup();
            format!(
                "placed: backend `{}` (priority {}) runs {} node(s): {}",
                p.backend,
                p.priority,
                p.nodes.len(),
                kinds.join(", ")
            )
        })
        .chain(fallback_lines)
        .collect()
}

/// A failure that chooses its exit code (`kiln check` finding unsupported features).
#[derive(Debug)]
pub struct Exit {
    /// The exit code.
    pub code: u8,
    /// The one-line message.
    pub message: String,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

/// Exit code 3: a file could not be read, or the model, weights or artifact is malformed.
pub const EXIT_UNREADABLE: u8 = 3;
/// Exit code 4: the model uses something kiln does not support (or fallbacks were denied).
pub const EXIT_UNSUPPORTED: u8 = 4;
/// Exit code 5: the inputs do not fit the model.
pub const EXIT_INVALID_INPUT: u8 = 5;

/// The exit code of a failed command: by the kind of the kiln error in its chain (1 when there is none).
pub fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(exit) = cause.downcast_ref::<Exit>() {
            return exit.code;
        }
        if let Some(e) = cause.downcast_ref::<kiln::Error>() {
            return match e.kind() {
                kiln::ErrorKind::Io | kiln::ErrorKind::InvalidModel => EXIT_UNREADABLE,
                kiln::ErrorKind::Unsupported => EXIT_UNSUPPORTED,
                kiln::ErrorKind::InvalidInput => EXIT_INVALID_INPUT,
                kiln::ErrorKind::Runtime => 1,
            };
        }
        if let Some(e) = cause.downcast_ref::<kiln_runtime::inputs::InputsError>() {
            return match e {
                kiln_runtime::inputs::InputsError::Npy(kiln::npy::NpyError::Io { .. }) => EXIT_UNREADABLE,
                _ => EXIT_INVALID_INPUT,
            };
        }
        if let Some(e) = cause.downcast_ref::<kiln::npy::NpyError>() {
            return match e {
                kiln::npy::NpyError::Io { .. } => EXIT_UNREADABLE,
                _ => EXIT_INVALID_INPUT,
            };
        }
    }
    1
}

/// Runs the parsed command.
pub fn dispatch(cli: Cli) -> Result<()> {
    cli.log.init().map_err(anyhow::Error::msg)?;
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Compile(a) => compile::run(a),
        Command::Opt(a) => opt::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Check(a) => check::run(a),
        Command::Conformance(a) => conformance::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Backends(a) => backends::run(a),
        Command::Generate(a) => generate::run(a),
    }
}

/// Splits `NAME=VALUE` at the last `=` (input names may contain `=`; file names and shapes rarely do).
/// The values `--fix-input NAME=FILE.npy` gives, by name (each name once).
fn read_fixed_inputs(specs: &[String]) -> Result<BTreeMap<String, kiln_ir::Tensor>> {
    let mut known = BTreeMap::new();
    for spec in specs {
        let (name, file) = split_assignment(spec, "--fix-input")?;
        let t = kiln::npy::read(std::path::Path::new(file))?;
        if known.insert(name.to_string(), t).is_some() {
            bail!("--fix-input `{name}` is given twice");
        }
    }
    Ok(known)
}

fn split_assignment<'a>(s: &'a str, what: &str) -> Result<(&'a str, &'a str)> {
    match s.rsplit_once('=') {
        Some((n, v)) if !n.is_empty() && !v.is_empty() => Ok((n, v)),
        _ => bail!("expected {what} as NAME=VALUE, got `{s}`"),
    }
}

/// Parses repeated `NAME=DxDxD` options.
fn parse_shapes(specs: &[String]) -> Result<BTreeMap<String, Vec<usize>>> {
    let mut out = BTreeMap::new();
    for s in specs {
        let (name, dims) = split_assignment(s, "--shape")?;
        let dims: Vec<usize> = if dims == "scalar" {
            vec![]
        } else {
            dims.split('x')
                .map(|d| d.trim().parse::<usize>().with_context(|| format!("bad dimension `{d}` in --shape {s}")))
                .collect::<Result<_>>()?
        };
        if out.insert(name.to_string(), dims).is_some() {
            bail!("--shape for `{name}` is given twice");
        }
    }
    Ok(out)
}
