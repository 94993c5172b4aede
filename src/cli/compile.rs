//! `kiln compile`: compile a model ahead of time into an artifact directory (see `kiln::artifact`), optionally
//! with listings of what was compiled (`--emit kir,asm,dot`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use kiln::{Artifact, Backend, CompileOptions};

use super::ModelArgs;
use super::opt::PipelineArgs;

/// Arguments of `kiln compile`.
#[derive(Args, Debug)]
pub struct CompileArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The target backend (only cpu compiles ahead of time).
    #[arg(long, default_value = "cpu", value_parser = super::run::parse_backend)]
    target: Backend,
    /// The artifact directory to write (created if missing).
    #[arg(long, short = 'o', value_name = "DIR")]
    output: PathBuf,
    /// Extra listings to write into the artifact directory (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "KIND")]
    emit: Vec<Emit>,
    #[command(flatten)]
    passes: PipelineArgs,
}

/// A listing `--emit` can add.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Emit {
    /// `model.kir`: the optimized graph.
    Kir,
    /// `kernels.s`: each kernel's Cranelift IR and machine code.
    Asm,
    /// `graph.dot` (and `graph.svg` when graphviz is installed): the graph with its fusion groups.
    Dot,
}

pub fn run(a: CompileArgs) -> Result<()> {
    if a.target != Backend::Cpu {
        bail!("--target {}: only the cpu target compiles ahead of time", a.target.name());
    }
    let t0 = Instant::now();
    let model = a.model.load()?;
    // Without -O or --pipeline, the CPU backend's own pipeline (as `kiln run --backend cpu` uses).
    let pipeline = if a.passes.is_default() { "cpu-default".to_string() } else { a.passes.pipeline_text()? };
    let options = CompileOptions { backend: Backend::Cpu, pipeline, threads: 0 };
    let lowered = model.lower_instrumented(&options, &mut a.passes.instrumentation())?;
    let artifact = Artifact::write(&lowered, &a.output)?;
    let dir = &a.output;
    for emit in &a.emit {
        match emit {
            Emit::Kir => write(&dir.join("model.kir"), &kiln_ir::print(&lowered.graph))?,
            Emit::Asm => {
                let options = kiln_codegen::cpu::CpuOptions::default();
                let mut text = String::new();
                for k in &lowered.executable.kernels {
                    text.push_str(&format!("; kernel {}\n", k.name));
                    text.push_str(&kiln_codegen::cpu::disassemble(k, &options)?);
                    text.push('\n');
                }
                write(&dir.join("kernels.s"), &text)?;
            }
            Emit::Dot => {
                let path = dir.join("graph.dot");
                write(&path, &kiln::dot::to_dot(&lowered.graph))?;
                render_svg(&path, &dir.join("graph.svg"))?;
            }
        }
    }
    let m = artifact.manifest();
    println!(
        "compiled {} for {} ({}) in {:.1} ms: {} kernels, {} weights -> {}",
        a.model.model.display(),
        m.target.triple,
        m.target.cpu_features.join(","),
        t0.elapsed().as_secs_f64() * 1e3,
        m.kernels.len(),
        lowered.executable.weights.len(),
        dir.display()
    );
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Renders `dot` to `svg` with graphviz's `dot` when it is installed; says so when it is not.
fn render_svg(dot: &Path, svg: &Path) -> Result<()> {
    match std::process::Command::new("dot").arg("-Tsvg").arg("-o").arg(svg).arg(dot).output() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("graphviz `dot` is not on PATH: skipped rendering {}", svg.display());
            Ok(())
        }
        Err(e) => bail!("cannot run graphviz `dot`: {e}"),
        Ok(out) if !out.status.success() => {
            bail!("graphviz `dot` failed on {}: {}", dot.display(), String::from_utf8_lossy(&out.stderr).trim())
        }
        Ok(_) => Ok(()),
    }
}
