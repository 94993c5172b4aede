//! `kiln run`: load, bind inputs, execute, write `.npy` outputs and a manifest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use kiln::{Backend, RunOptions, npy};
use kiln_ir::Tensor;

use super::ModelArgs;

/// Arguments of `kiln run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    fallback: super::FallbackArgs,
    #[command(flatten)]
    input: kiln_runtime::inputs::InputArgs,
    /// Where to write `<output>.npy` files and `manifest.json` (`--output-dir` is an alias).
    #[arg(long = "output", short = 'o', alias = "output-dir", value_name = "DIR", default_value = "kiln-out")]
    output_dir: PathBuf,
    /// The executor: cpu (compiled with Cranelift, the default), interp (reference interpreter) or cuda. A
    /// compiled artifact runs on the backend it was compiled for.
    #[arg(long, value_parser = parse_backend)]
    backend: Option<Backend>,
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[command(flatten)]
    passes: super::opt::PipelineChoice,
    /// Also write listings of what was compiled into the output directory, as `compile --emit` does
    /// (comma-separated: kir, asm, dot, ptx; PTX for sm_80).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "KIND")]
    emit: Vec<super::compile::Emit>,
}

pub fn parse_backend(s: &str) -> Result<Backend, String> {
    s.parse()
}

pub fn run(a: RunArgs) -> Result<()> {
    let given = a.input.given()?;
    let backends = super::registry()?;
    if kiln::Artifact::is_artifact(&a.model.model) {
        a.model.check_no_random_weights()?;
        if !a.passes.is_default() {
            bail!("-O/--pipeline: a compiled artifact's passes ran when it was compiled");
        }
        if !a.emit.is_empty() {
            bail!("--emit: an artifact's listings are written when it is compiled (kiln compile --emit)");
        }
        return run_artifact(&a, given, &backends);
    }
    let backend = a.backend.unwrap_or_default();
    if backend != Backend::Cpu && !a.passes.is_default() {
        bail!("-O/--pipeline choose the cpu backend's passes; --backend {} runs its own", backend.name());
    }
    let t0 = Instant::now();
    let given_shapes = given.iter().map(|(n, t): (&String, &Tensor)| (n.clone(), t.shape().to_vec())).collect();
    let model = a.model.load_with(given_shapes)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let shapes = a.model.shapes()?;
    let (inputs, filled) =
        super::complete_inputs(&a.input, given, &model.inputs(), |g, seed| model.complete_inputs(g, &shapes, seed))?;
    if !a.emit.is_empty() {
        let pipeline = a.passes.text_or(backend.info().pipeline.unwrap_or("cpu-default"))?;
        let target = if backend == Backend::Cuda { Backend::Cuda } else { Backend::Cpu };
        let options = kiln::CompileOptions { backend: target, pipeline, ..Default::default() };
        super::compile::write_listings(&model.lower(&options)?, &a.output_dir, &a.emit, "sm_80", false)?;
    }
    if backend == Backend::Cpu {
        // Compiled here (rather than inside `Model::run`) so the placement can be reported.
        let options = kiln::CompileOptions {
            pipeline: a.passes.text_or("cpu-default")?,
            threads: a.threads,
            backends,
            fallback: a.fallback.library(),
            ..Default::default()
        };
        let compiled = model.compile(&options)?;
        for line in a.fallback.lines(compiled.report()) {
            println!("{line}");
        }
        return run_and_report(
            &a.output_dir,
            || a.input.note(&filled),
            || Ok(compiled.run(&inputs)?),
            |run_ms| {
                format!(
                    "model {} (cpu backend): loaded in {load_ms:.1} ms, compiled and ran in {run_ms:.1} ms",
                    a.model.model.display(),
                )
            },
        );
    }
    run_and_report(
        &a.output_dir,
        || a.input.note(&filled),
        || {
            Ok(model
                .run(&inputs, &RunOptions { backend, threads: a.threads, backends, fallback: a.fallback.library() })?)
        },
        |run_ms| {
            format!(
                "model {} ({} backend): loaded in {load_ms:.1} ms, ran in {run_ms:.1} ms",
                a.model.model.display(),
                backend.name()
            )
        },
    )
}

/// Times `run`, writes its outputs into `dir` and prints `header(run time in ms)` and a line per output.
fn run_and_report(
    dir: &Path,
    note: impl FnOnce(),
    run: impl FnOnce() -> Result<Vec<(String, Tensor)>>,
    header: impl FnOnce(f64) -> String,
) -> Result<()> {
    let t = Instant::now();
    let outputs = run()?;
    let run_ms = t.elapsed().as_secs_f64() * 1e3;
    // Which inputs were made up, once the run succeeded (a failure is its one error line).
    note();
    write_outputs(dir, &outputs)?;
    println!("{}", header(run_ms));
    report_outputs(&outputs, dir);
    Ok(())
}

/// Checks that options meant for a model file are absent when running a compiled artifact.
pub fn check_artifact_options(model: &super::ModelArgs, backend: Option<Backend>) -> Result<()> {
    if model.weights.is_some() {
        bail!("--weights: a compiled artifact carries its weights ({})", model.model.display());
    }
    check_artifact_backend(backend)
}

/// Checks that no backend other than the artifact's own is asked for.
fn check_artifact_backend(backend: Option<Backend>) -> Result<()> {
    if let Some(b) = backend.filter(|b| *b != Backend::Cpu) {
        bail!("--backend {}: a compiled artifact runs on the cpu backend it was compiled for", b.name());
    }
    Ok(())
}

/// `kiln run ARTIFACT_DIR`: load the compiled artifact (no code generation) and run it. With `--weights FILE`,
/// the checkpoint's weights replace the artifact's, atomically, before the run (a checkpoint that does not fit
/// is an error and nothing runs).
fn run_artifact(a: &RunArgs, given: BTreeMap<String, Tensor>, backends: &kiln::BackendRegistry) -> Result<()> {
    if kiln::Artifact::is_cuda(&a.model.model) {
        return run_cuda_artifact(a, given, backends);
    }
    check_artifact_backend(a.backend)?;
    let t0 = Instant::now();
    let compiled = kiln::Artifact::load_with(&a.model.model, a.threads, backends)?;
    a.fallback.check(compiled.report())?;
    for line in a.fallback.lines(compiled.report()) {
        println!("{line}");
    }
    if let Some(weights) = &a.model.weights {
        let report = compiled.load_weights(weights)?;
        println!(
            "weights from {}: {} replaced, {} kept (made by the compiler), {} unchanged (folded at compile time), {} unused",
            weights.display(),
            report.replaced.len(),
            report.kept.len(),
            report.unchanged.len(),
            report.unused.len()
        );
    }
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let shapes = a.model.shapes()?;
    let (inputs, filled) = super::complete_inputs(&a.input, given, compiled.inputs(), |g, seed| {
        compiled.complete_inputs(g, &shapes, seed)
    })?;
    run_and_report(
        &a.output_dir,
        || a.input.note(&filled),
        || Ok(compiled.run(&inputs)?),
        |run_ms| {
            format!(
                "artifact {} (cpu backend): loaded in {load_ms:.1} ms (no code generation), ran in {run_ms:.1} ms",
                a.model.model.display()
            )
        },
    )
}

/// `kiln run CUDA_ARTIFACT_DIR`: load the PTX artifact onto GPU 0 and run it there.
fn run_cuda_artifact(a: &RunArgs, given: BTreeMap<String, Tensor>, backends: &kiln::BackendRegistry) -> Result<()> {
    if let Some(b) = a.backend.filter(|b| *b != Backend::Cuda) {
        bail!("--backend {}: a CUDA artifact runs on the cuda backend it was compiled for", b.name());
    }
    if a.model.weights.is_some() {
        bail!("--weights: a compiled artifact carries its weights ({})", a.model.model.display());
    }
    let t0 = Instant::now();
    let compiled = kiln::Artifact::load_cuda_with(&a.model.model, 0, backends)?;
    a.fallback.check(compiled.report())?;
    for line in a.fallback.lines(compiled.report()) {
        println!("{line}");
    }
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let shapes = a.model.shapes()?;
    let (inputs, filled) = super::complete_inputs(&a.input, given, compiled.inputs(), |g, seed| {
        compiled.complete_inputs(g, &shapes, seed)
    })?;
    run_and_report(
        &a.output_dir,
        || a.input.note(&filled),
        || Ok(compiled.run(&inputs)?),
        |run_ms| {
            format!(
                "artifact {} (cuda backend, {}): loaded in {load_ms:.1} ms (the driver compiled the PTX), ran in \
                 {run_ms:.1} ms",
                a.model.model.display(),
                compiled.device().map_or_else(|| "?".to_string(), |d| d.device_name())
            )
        },
    )
}

fn report_outputs(outputs: &[(String, Tensor)], dir: &Path) {
    for (name, t) in outputs {
        println!("  {name}: {} {}", t.tensor_type(), npy::summary(t));
    }
    println!("wrote {} output(s) and manifest.json to {}", outputs.len(), dir.display());
}

fn write_outputs(dir: &Path, outputs: &[(String, Tensor)]) -> Result<()> {
    Ok(npy::write_output_dir(dir, outputs)?)
}
