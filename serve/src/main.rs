//! `kiln-serve`: the runtime alone. It loads what `kiln compile` wrote — CPU artifacts (a kernel library) and
//! CUDA artifacts (PTX the driver compiles) — and runs or benchmarks them, without Cranelift and without LLVM:
//! it links `kiln-runtime` and the contract crate `kiln-plan`, never the compiler. Plugins listed in
//! `KILN_BACKEND_PLUGINS` serve the nodes an artifact's placement gave them.
//!
//! Every user error is one line on stderr and exit code 1 (usage errors: 2, from clap).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use kiln_ir::Tensor;
use kiln_plan::artifact::ArtifactManifest;
use kiln_runtime::registry::{BackendRegistry, PLUGINS_ENV_VAR};
use kiln_runtime::{Program, RunError, npy};

/// As in `kiln`: large per-run buffers are reused instead of faulted in again every run.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs kiln's compiled artifacts with the runtime alone.
#[derive(Parser, Debug)]
#[command(name = "kiln-serve", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: kiln_runtime::log::LogArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Load an artifact, run it once, write `<output>.npy` files and `manifest.json`.
    Run(RunArgs),
    /// Load an artifact and time its runs.
    Bench(BenchArgs),
    /// What an artifact holds: kind, target, inputs, outputs, steps, placement.
    Inspect(InspectArgs),
}

/// What every command takes: the artifact and its inputs.
#[derive(Args, Debug)]
struct ArtifactArgs {
    /// The artifact directory `kiln compile` wrote.
    artifact: PathBuf,
    #[command(flatten)]
    inputs: kiln_runtime::inputs::InputArgs,
    /// Extents of a pseudo-random input with symbolic dims: NAME=DxD (repeatable).
    #[arg(long = "shape", value_name = "NAME=DxD")]
    shapes: Vec<String>,
    /// Worker threads of a CPU artifact (0: all cores; at most 4 per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Nodes the artifact runs on the reference interpreter (correct, slow): `warn` runs them and prints one
    /// `fallback:` line per op kind, `allow` runs them without the lines, `deny` refuses the artifact (exit 1,
    /// naming them) — as `kiln run` does.
    #[arg(long, value_name = "POLICY", default_value = "warn", value_parser = ["allow", "warn", "deny"])]
    fallback: String,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    artifact: ArtifactArgs,
    /// Where to write the outputs (`--output-dir` is an alias).
    #[arg(long = "output", short = 'o', alias = "output-dir", value_name = "DIR", default_value = "kiln-out")]
    output_dir: PathBuf,
}

#[derive(Args, Debug)]
struct BenchArgs {
    #[command(flatten)]
    artifact: ArtifactArgs,
    /// Untimed runs first.
    #[arg(long, default_value_t = 3)]
    warmup: u32,
    /// Timed runs (1 to 1,000,000).
    #[arg(long, default_value_t = 20)]
    runs: u32,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct InspectArgs {
    /// The artifact directory.
    artifact: PathBuf,
}

fn main() -> ExitCode {
    #[cfg(unix)]
    // SAFETY: restoring the default action of SIGPIPE before any thread starts or any I/O happens.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    if let Err(e) = cli.log.init() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Run(a) => run(a),
        Command::Bench(a) => bench(a),
        Command::Inspect(a) => inspect(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

/// An artifact refused under `--fallback deny` (exit code 4, as an unsupported model).
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// The exit code of a failed command, by the kind of error in its chain, as `kiln`'s (docs/cli.md): 3 could not
/// read, 4 unsupported (fallbacks refused included), 5 invalid input, 1 anything else.
fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if cause.downcast_ref::<Refused>().is_some() {
            return 4;
        }
        if let Some(e) = cause.downcast_ref::<RunError>() {
            return e.exit_code();
        }
        if let Some(e) = cause.downcast_ref::<kiln_runtime::inputs::InputsError>() {
            return match e {
                kiln_runtime::inputs::InputsError::Npy(npy::NpyError::Io { .. }) => 3,
                _ => 5,
            };
        }
        if let Some(e) = cause.downcast_ref::<npy::NpyError>() {
            return if matches!(e, npy::NpyError::Io { .. }) { 3 } else { 5 };
        }
    }
    1
}

/// A loaded artifact: its program on its target, and what loading took.
struct Loaded {
    program: Box<dyn Program>,
    inputs: Vec<(String, kiln_ir::TensorType)>,
    load: Duration,
    /// The `fallback:` lines to print (the policy applied): never a silent slow path.
    fallback_lines: Vec<String>,
}

/// Loads the artifact (manifest, digests, weights, code) with the plugins `KILN_BACKEND_PLUGINS` lists.
fn load(a: &ArtifactArgs) -> Result<Loaded> {
    let t0 = Instant::now();
    let registry = BackendRegistry::from_env().with_context(|| format!("loading the plugins in {PLUGINS_ENV_VAR}"))?;
    let manifest = kiln_runtime::artifact::open(&a.artifact)?;
    let threads = kiln_runtime::cpu::resolve_threads(a.threads)?;
    let program: Box<dyn Program> = match manifest {
        m @ ArtifactManifest::Cpu(_) => {
            Box::new(kiln_runtime::artifact::load_cpu(&a.artifact, m, threads, &registry)?.program)
        }
        m @ ArtifactManifest::Cuda(_) => {
            Box::new(kiln_runtime::artifact::load_cuda(&a.artifact, m, 0, &registry)?.program)
        }
    };
    let exe = program.executable();
    if a.fallback == "deny" && !exe.fallbacks.is_empty() {
        return Err(Refused(kiln_plan::exec::fallback_refusal(&exe.fallbacks)).into());
    }
    let fallback_lines =
        if a.fallback == "warn" { kiln_plan::exec::fallback_lines(&exe.fallbacks) } else { Vec::new() };
    let inputs = exe.inputs.iter().map(|(n, b)| (n.clone(), exe.buffers[b.0 as usize].ty.clone())).collect();
    Ok(Loaded { program, inputs, load: t0.elapsed(), fallback_lines })
}

/// The inputs given with `--input` and `--inputs`, completed with pseudo-random values (said on stderr).
fn inputs(a: &ArtifactArgs, declared: &[(String, kiln_ir::TensorType)]) -> Result<BTreeMap<String, Tensor>> {
    let given = a.inputs.given()?;
    let missing = a.inputs.missing(&given, declared)?;
    let mut shapes = BTreeMap::new();
    for spec in &a.shapes {
        let (name, dims) = spec.rsplit_once('=').with_context(|| format!("--shape `{spec}`: expected NAME=DxD"))?;
        let dims: Vec<usize> = if dims == "scalar" {
            Vec::new()
        } else {
            dims.split('x')
                .map(|d| d.parse::<usize>().with_context(|| format!("--shape `{spec}`: `{d}` is not an extent")))
                .collect::<Result<_>>()?
        };
        shapes.insert(name.to_string(), dims);
    }
    let all = kiln_runtime::bind::complete_inputs(declared, given, &shapes, a.inputs.seed)?;
    a.inputs.note(&missing);
    Ok(all)
}

fn run(a: RunArgs) -> Result<()> {
    let loaded = load(&a.artifact)?;
    let ins = inputs(&a.artifact, &loaded.inputs)?;
    let t = Instant::now();
    let outputs = loaded.program.run(&ins)?;
    let run_ms = t.elapsed().as_secs_f64() * 1e3;
    npy::write_output_dir(&a.output_dir, &outputs)?;
    println!(
        "artifact {} ({} backend): loaded in {:.1} ms (no compiler), ran in {run_ms:.1} ms",
        a.artifact.artifact.display(),
        loaded.program.backend(),
        loaded.load.as_secs_f64() * 1e3
    );
    for line in &loaded.fallback_lines {
        println!("{line}");
    }
    for (name, t) in &outputs {
        println!("  {name}: {} {}", t.tensor_type(), npy::summary(t));
    }
    println!("wrote {} output(s) and manifest.json to {}", outputs.len(), a.output_dir.display());
    Ok(())
}

fn bench(a: BenchArgs) -> Result<()> {
    if !(1..=1_000_000).contains(&a.runs) || a.warmup > 1_000_000 {
        bail!("--runs must be 1 to 1,000,000 and --warmup at most 1,000,000");
    }
    let loaded = load(&a.artifact)?;
    let ins = inputs(&a.artifact, &loaded.inputs)?;
    for _ in 0..a.warmup {
        loaded.program.run(&ins)?;
    }
    let mut times = Vec::with_capacity(a.runs as usize);
    for _ in 0..a.runs {
        let t = Instant::now();
        loaded.program.run(&ins)?;
        times.push(t.elapsed());
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let median = ms(times[times.len() / 2]);
    let mean = times.iter().map(|d| ms(*d)).sum::<f64>() / times.len() as f64;
    let peak_rss_kib = kiln_runtime::peak_rss_bytes().map(|b| b / 1024);
    if a.json {
        let v = serde_json::json!({
            "artifact": a.artifact.artifact.display().to_string(),
            "backend": loaded.program.backend(),
            "load_ms": ms(loaded.load),
            "warmup": a.warmup,
            "runs": a.runs,
            "median_ms": median,
            "min_ms": ms(times[0]),
            "mean_ms": mean,
            "peak_rss_kib": peak_rss_kib,
            "fallbacks": loaded.fallback_lines,
        });
        println!("{v}");
    } else {
        println!(
            "artifact {} ({} backend): loaded in {:.1} ms; {} runs: median {median:.3} ms, min {:.3} ms, mean {mean:.3} ms; peak RSS {} KiB",
            a.artifact.artifact.display(),
            loaded.program.backend(),
            ms(loaded.load),
            a.runs,
            ms(times[0]),
            peak_rss_kib.map_or("?".to_string(), |k| k.to_string())
        );
        for line in &loaded.fallback_lines {
            println!("{line}");
        }
    }
    Ok(())
}

fn inspect(a: InspectArgs) -> Result<()> {
    let m = kiln_plan::artifact::read_manifest(&a.artifact)?;
    print!("{}", m.summary(&a.artifact));
    Ok(())
}
