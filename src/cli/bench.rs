//! `kiln bench`: compile a model, then time runs of it — the numbers the CPU backend is judged by.
//!
//! Prints the compile time and its breakdown (for a compiled artifact directory, its load time instead), the step mix (library calls, kernels, interpreter fallbacks),
//! then latency statistics over `--runs` timed runs after `--warmup` untimed ones. With `--json`, the last line
//! of output is one JSON object (`compile_ms`, `load_ms`, `median_ms`, `min_ms`, `p90_ms`, `mean_ms`, `runs`, `threads`,
//! `peak_rss_bytes`, …) for scripts such as `scripts/bench_vs_ort.py`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln::{Backend, CompileOptions};
use kiln_ir::Tensor;
use serde::Serialize;

use super::ModelArgs;

/// Arguments of `kiln bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    fallback: super::FallbackArgs,
    #[command(flatten)]
    input: kiln_runtime::inputs::InputArgs,
    /// The backend to compile for (cpu; cuda on a GPU; interp times the reference interpreter). A compiled
    /// artifact runs on the backend it was compiled for.
    #[arg(long, default_value = "cpu", value_parser = super::run::parse_backend)]
    backend: Backend,
    #[command(flatten)]
    passes: super::opt::PipelineChoice,
    /// Worker threads (0: all cores, as for `run`).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Untimed runs before timing.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed runs.
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// End with one line of JSON holding the results.
    #[arg(long)]
    json: bool,
    /// After timing, profile one run (compiled cpu backend): the slowest steps, each with the model nodes it
    /// computes, and the time per kind of step (its ops, as `matmul+add`).
    #[arg(long)]
    profile: bool,
    /// Also write listings of what was compiled into `--emit-dir`, as `compile --emit` does (comma-separated:
    /// kir, asm, dot, ptx; PTX for sm_80).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "KIND")]
    emit: Vec<super::compile::Emit>,
    /// Where `--emit` writes its listings.
    #[arg(long, value_name = "DIR", default_value = "kiln-emit")]
    emit_dir: PathBuf,
    /// Write the profiled run as a Chrome trace (open it in chrome://tracing or Perfetto): one event per step,
    /// named by its nodes, with its kind and step description.
    #[arg(long, value_name = "FILE.json")]
    trace: Option<PathBuf>,
}

/// Runs once and returns each step's profile, in execution order.
type Profiler = dyn Fn() -> Result<Vec<kiln::StepProfile>>;

/// The JSON line.
#[derive(Serialize)]
struct Report<'a> {
    model: String,
    backend: &'a str,
    threads: usize,
    compile_ms: f64,
    load_ms: f64,
    weights_load_ms: f64,
    prepare_ms: f64,
    passes_ms: f64,
    lowering_ms: f64,
    codegen_ms: f64,
    kernels: usize,
    library_steps: usize,
    kernel_steps: usize,
    fallback_steps: usize,
    arena_bytes: u64,
    runs: usize,
    warmup: usize,
    min_ms: f64,
    median_ms: f64,
    mean_ms: f64,
    p90_ms: f64,
    max_ms: f64,
    peak_rss_bytes: u64,
    /// The GPU (cuda only).
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<String>,
    /// Bytes the inputs and outputs of one run hold (what a memory-bound model must move at least).
    io_bytes: u64,
    /// The device's copy bandwidth, device to device, in GB/s (read + write; cuda only).
    #[serde(skip_serializing_if = "Option::is_none")]
    device_copy_gbps: Option<f64>,
    /// Median time of the steps alone on the device, inputs resident and outputs left there (cuda only).
    #[serde(skip_serializing_if = "Option::is_none")]
    device_median_ms: Option<f64>,
}

pub fn run(a: BenchArgs) -> Result<()> {
    // Bounded so a typo cannot ask for an allocation of 2^64 timings or a run that never ends.
    const MAX_RUNS: usize = 1_000_000;
    if a.runs == 0 || a.runs > MAX_RUNS || a.warmup > MAX_RUNS {
        bail!("--runs must be 1 to {MAX_RUNS} and --warmup at most {MAX_RUNS}");
    }
    let given = a.input.given()?;
    let shapes = a.model.shapes()?;
    let threads = kiln::resolve_threads(a.threads)?;
    let backends = super::registry()?;
    let is_artifact = kiln::Artifact::is_artifact(&a.model.model);
    if is_artifact {
        a.model.check_no_random_weights()?;
        if !a.passes.is_default() {
            bail!("-O/--pipeline: a compiled artifact's passes ran when it was compiled");
        }
        if !a.emit.is_empty() {
            bail!("--emit: an artifact's listings are written when it is compiled (kiln compile --emit)");
        }
    }
    // A run, returning the bytes its inputs and outputs hold.
    type Runner = Box<dyn Fn() -> Result<u64>>;
    // An artifact reports its load time (manifest, weights, kernel library); a model its compile time, from after
    // loading it and making its inputs.
    let mut profile: Option<Box<Profiler>> = None;
    let mut profiled = |compiled: kiln::Compiled, ins: BTreeMap<String, Tensor>| -> Runner {
        let compiled = std::sync::Arc::new(compiled);
        let (c, i) = (std::sync::Arc::clone(&compiled), ins.clone());
        profile = Some(Box::new(move || c.profile_steps(&i).map_err(Into::into)));
        Box::new(move || compiled.run(&ins).map(|o| moved_bytes(&ins, &o)).map_err(Into::into))
    };
    let mut device: Option<(String, f64, f64)> = None;
    let (warmup, runs) = (a.warmup, a.runs);
    let mut cuda_runner = |compiled: kiln::Compiled, ins: BTreeMap<String, Tensor>| -> Result<Runner> {
        let Some(dev) = compiled.device() else { bail!("the {} backend has no device to time", compiled.backend()) };
        let copy_gbps = dev.copy_bandwidth_gbps()?;
        let mut resident = dev.time_resident(&ins, warmup, runs)?;
        resident.sort();
        let resident_ms = resident[resident.len() / 2].as_secs_f64() * 1e3;
        device = Some((dev.device_name(), copy_gbps, resident_ms));
        Ok(Box::new(move || compiled.run(&ins).map(|o| moved_bytes(&ins, &o)).map_err(Into::into)))
    };
    let is_cuda_artifact = is_artifact && kiln::Artifact::is_cuda(&a.model.model);
    // `filled`: the inputs given pseudo-random values, said once the model is ready to run.
    let filled: Vec<String>;
    let (runner, report, compile_ms): (Runner, Option<kiln::CompileReport>, f64) = if is_cuda_artifact {
        if a.model.weights.is_some() {
            bail!("--weights: a compiled artifact carries its weights ({})", a.model.model.display());
        }
        if a.backend != Backend::Cpu && a.backend != Backend::Cuda {
            bail!("--backend {}: a CUDA artifact runs on the cuda backend", a.backend.name());
        }
        let compiled = kiln::Artifact::load_cuda_with(&a.model.model, 0, &backends)?;
        let report = compiled.report().clone();
        let (ins, missing) = super::complete_inputs(&a.input, given, compiled.inputs(), |g, seed| {
            compiled.complete_inputs(g, &shapes, seed)
        })?;
        filled = missing;
        (cuda_runner(compiled, ins)?, Some(report), 0.0)
    } else if is_artifact {
        super::run::check_artifact_options(&a.model, Some(a.backend))?;
        let compiled = kiln::Artifact::load_with(&a.model.model, threads, &backends)?;
        let report = compiled.report().clone();
        let (ins, missing) = super::complete_inputs(&a.input, given, compiled.inputs(), |g, seed| {
            compiled.complete_inputs(g, &shapes, seed)
        })?;
        filled = missing;
        (profiled(compiled, ins), Some(report), 0.0)
    } else {
        let given_shapes = given.iter().map(|(n, t): (&String, &Tensor)| (n.clone(), t.shape().to_vec())).collect();
        let model = a.model.load_with(given_shapes)?;
        let (ins, missing) = super::complete_inputs(&a.input, given, &model.inputs(), |g, seed| {
            model.complete_inputs(g, &shapes, seed)
        })?;
        filled = missing;
        let t0 = Instant::now();
        match a.backend {
            Backend::Interp => {
                let opts = kiln::RunOptions { backend: Backend::Interp, threads, ..Default::default() };
                (Box::new(move || model.run(&ins, &opts).map(|o| moved_bytes(&ins, &o)).map_err(Into::into)), None, 0.0)
            }
            Backend::CudaEmulated => {
                bail!("--backend cuda-emulated tests the GPU path on the host; it is not timed (bench cpu or cuda)")
            }
            backend => {
                let options = CompileOptions {
                    backend,
                    pipeline: a.passes.text_or(backend.info().pipeline.unwrap_or("cpu-default"))?,
                    threads,
                    backends: backends.clone(),
                    fallback: a.fallback.library(),
                };
                let compiled = model.compile(&options)?;
                let report = compiled.report().clone();
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                if !a.emit.is_empty() {
                    // Lowered once more for the listings, after the compile time is taken.
                    let t = Instant::now();
                    super::compile::write_listings(&model.lower(&options)?, &a.emit_dir, &a.emit, "sm_80", false)?;
                    println!("wrote listings to {} in {:.1} ms", a.emit_dir.display(), t.elapsed().as_secs_f64() * 1e3);
                }
                let runner =
                    if compiled.device().is_some() { cuda_runner(compiled, ins)? } else { profiled(compiled, ins) };
                (runner, Some(report), ms)
            }
        }
    };
    let r = report.unwrap_or_default();
    a.fallback.check(&r)?;
    for line in a.fallback.lines(&r) {
        println!("{line}");
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let steps = format!(
        "{} kernels; {} library, {} kernel, {} fallback steps; arena {} KiB",
        r.kernels,
        r.steps[0],
        r.steps[1],
        r.steps[2],
        r.arena_bytes / 1024
    );
    if is_artifact {
        println!(
            "loaded artifact {} in {:.1} ms ({:.1} ms of it reading weights; no code generation): {steps}",
            a.model.model.display(),
            ms(r.load),
            ms(r.weights_load)
        );
    } else {
        println!(
            "compiled {} for {} in {compile_ms:.1} ms (passes {:.1} ms, lowering {:.1} ms, codegen {:.1} ms, \
             weights prepared {:.1} ms): {steps}",
            a.model.model.display(),
            a.backend.name(),
            ms(r.passes),
            ms(r.lowering),
            ms(r.codegen),
            ms(r.prepare),
        );
    }
    for f in &r.fallbacks {
        println!("  interpreter fallback: {f}");
    }
    a.input.note(&filled);
    // The first untimed run (one of the warmup runs, when there are any) measures the bytes a run moves.
    let io_bytes = runner()?;
    for _ in 1..a.warmup {
        runner()?;
    }
    let mut times = Vec::with_capacity(a.runs);
    for _ in 0..a.runs {
        let t = Instant::now();
        runner()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let pick = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    println!(
        "{} runs, {threads} thread(s): min {:.3} ms, median {:.3} ms, mean {mean:.3} ms, p90 {:.3} ms, max {:.3} ms",
        a.runs,
        times[0],
        pick(0.5),
        pick(0.9),
        times[times.len() - 1],
    );
    if a.profile || a.trace.is_some() {
        let Some(profile) = &profile else {
            bail!("--profile/--trace: the {} backend does not time single steps", a.backend.name());
        };
        let steps = profile()?;
        if a.profile {
            print_profile(&steps);
        }
        if let Some(path) = &a.trace {
            write_trace(path, &a.model.model.display().to_string(), &steps)?;
            println!("wrote a Chrome trace of one run ({} steps) to {}", steps.len(), path.display());
        }
    }
    let peak_rss_bytes = peak_rss_bytes();
    println!("peak RSS {:.1} MiB", peak_rss_bytes as f64 / (1 << 20) as f64);
    if let Some((name, copy_gbps, resident_ms)) = &device {
        let gbps = io_bytes as f64 / (resident_ms * 1e-3) / 1e9;
        println!(
            "device {name}: steps alone (data resident) median {resident_ms:.3} ms; inputs and outputs {:.1} MiB \
             moved at {gbps:.1} GB/s ({:.0}% of its copy bandwidth, {copy_gbps:.1} GB/s)",
            io_bytes as f64 / (1 << 20) as f64,
            100.0 * gbps / copy_gbps
        );
    }
    if a.json {
        let report = Report {
            model: a.model.model.display().to_string(),
            backend: if is_cuda_artifact {
                "cuda"
            } else if is_artifact {
                "cpu"
            } else {
                a.backend.name()
            },
            threads,
            compile_ms,
            load_ms: ms(r.load),
            weights_load_ms: ms(r.weights_load),
            prepare_ms: ms(r.prepare),
            passes_ms: ms(r.passes),
            lowering_ms: ms(r.lowering),
            codegen_ms: ms(r.codegen),
            kernels: r.kernels,
            library_steps: r.steps[0],
            kernel_steps: r.steps[1],
            fallback_steps: r.steps[2],
            arena_bytes: r.arena_bytes,
            runs: a.runs,
            warmup: a.warmup,
            min_ms: times[0],
            median_ms: pick(0.5),
            mean_ms: mean,
            p90_ms: pick(0.9),
            max_ms: times[times.len() - 1],
            peak_rss_bytes,
            device: device.as_ref().map(|(n, _, _)| n.clone()),
            io_bytes,
            device_copy_gbps: device.as_ref().map(|&(_, g, _)| g),
            device_median_ms: device.as_ref().map(|&(_, _, m)| m),
        };
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

/// The nodes of a step, for one line: the first three names and how many more.
fn nodes_line(source: &kiln_plan::exec::StepSource) -> String {
    let mut line = source.nodes.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    if source.nodes.len() > 3 {
        line.push_str(&format!(" (+{} more)", source.nodes.len() - 3));
    }
    line
}

/// `--profile`: the slowest steps with their nodes, then the time per kind of step.
fn print_profile(steps: &[kiln::StepProfile]) {
    let total: f64 = steps.iter().map(|p| p.time.as_secs_f64()).sum();
    let pct = |t: f64| 100.0 * t / total.max(1e-12);
    let mut slowest: Vec<&kiln::StepProfile> = steps.iter().collect();
    slowest.sort_by_key(|p| std::cmp::Reverse(p.time));
    println!("profile of one run ({:.3} ms in {} steps), slowest first:", total * 1e3, steps.len());
    for p in slowest.iter().take(25) {
        let t = p.time.as_secs_f64();
        let nodes = nodes_line(&p.source);
        let nodes = if nodes.is_empty() { String::new() } else { format!("  [{nodes}]") };
        println!("  {:>9.3} ms {:>5.1}%  {}{nodes}", t * 1e3, pct(t), p.what);
    }
    let mut kinds: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for p in steps {
        let e = kinds.entry(p.source.kind(&p.what)).or_default();
        e.0 += p.time.as_secs_f64();
        e.1 += 1;
    }
    let mut kinds: Vec<(String, (f64, usize))> = kinds.into_iter().collect();
    kinds.sort_by(|a, b| b.1.0.total_cmp(&a.1.0));
    println!("by kind of step (its ops):");
    for (kind, (t, n)) in kinds.iter().take(25) {
        println!("  {:>9.3} ms {:>5.1}%  {n:>4}x  {kind}", t * 1e3, pct(*t));
    }
}

/// `--trace FILE.json`: the profiled run in the Chrome trace event format (complete events, microseconds; steps
/// run one after another, so each starts where the one before ended).
fn write_trace(path: &std::path::Path, model: &str, steps: &[kiln::StepProfile]) -> Result<()> {
    let mut start = 0.0f64;
    let mut events = Vec::with_capacity(steps.len());
    for (i, p) in steps.iter().enumerate() {
        let dur = p.time.as_secs_f64() * 1e6;
        let name = p.source.nodes.first().cloned().unwrap_or_else(|| p.what.clone());
        events.push(serde_json::json!({
            "name": name,
            "cat": p.source.kind(&p.what),
            "ph": "X",
            "ts": start,
            "dur": dur,
            "pid": 1,
            "tid": 1,
            "args": {"step": i, "what": p.what, "nodes": p.source.nodes},
        }));
        start += dur;
    }
    let trace = serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"model": model}});
    std::fs::write(path, serde_json::to_string(&trace)?).with_context(|| format!("cannot write {}", path.display()))
}

/// The bytes a run's inputs and outputs hold: what a memory-bound model must move at least.
fn moved_bytes(inputs: &BTreeMap<String, Tensor>, outputs: &[(String, Tensor)]) -> u64 {
    inputs.values().chain(outputs.iter().map(|(_, t)| t)).map(|t| t.as_bytes().len() as u64).sum()
}

/// The process's peak resident set size (`getrusage`), 0 where the platform does not report it.
fn peak_rss_bytes() -> u64 {
    kiln_runtime::peak_rss_bytes().unwrap_or(0)
}
