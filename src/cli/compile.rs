//! `kiln compile`: compile a model ahead of time into an artifact directory (see `kiln::artifact`) for the CPU
//! (`--target cpu`, the default: a shared library) or an NVIDIA GPU (`--target cuda`: PTX), optionally with
//! listings of what was compiled (`--emit kir,asm,dot,ptx`).

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
    #[command(flatten)]
    fallback: super::FallbackArgs,
    /// The target: cpu (a shared library for this host) or cuda (PTX for `--arch`).
    #[arg(long, default_value = "cpu", value_parser = super::run::parse_backend)]
    target: Backend,
    /// The GPU architecture of `--target cuda` (and of `--emit ptx`): sm_80 or sm_90.
    #[arg(long, default_value = "sm_80")]
    arch: String,
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
pub enum Emit {
    /// `model.kir`: the optimized graph.
    Kir,
    /// `kernels.s`: each kernel's Cranelift IR and machine code.
    Asm,
    /// `graph.dot` (and `graph.svg` when graphviz is installed): the graph with its fusion groups.
    Dot,
    /// `kernels.ptx`: the kernels as PTX for the GPU architecture (sm_80 unless `compile` is given another).
    Ptx,
}

pub fn run(a: CompileArgs) -> Result<()> {
    let info = a.target.info();
    if !info.compile_target {
        let targets: Vec<&str> = kiln::BACKENDS.iter().filter(|i| i.compile_target).map(|i| i.name).collect();
        bail!("--target {}: {}; compile for one of: {}", info.name, info.not_compiled, targets.join(", "));
    }
    let t0 = Instant::now();
    let model = a.model.load()?;
    // Without -O or --pipeline, the target's own pipeline (`cpu-default` as `kiln run --backend cpu` uses, or
    // `cuda-default`).
    let default = info.pipeline.expect("compile targets have a pipeline");
    let pipeline = if a.passes.is_default() { default.to_string() } else { a.passes.pipeline_text()? };
    let options = CompileOptions {
        backend: a.target,
        pipeline,
        threads: 0,
        backends: super::registry()?,
        fallback: a.fallback.library(),
    };
    let lowered = model.lower_instrumented(&options, &mut a.passes.instrumentation())?;
    let dir = &a.output;
    let summary = if a.target == Backend::Cuda {
        cuda::write_artifact(&lowered, dir, &a.arch)?
    } else {
        let artifact = Artifact::write(&lowered, dir)?;
        match artifact.manifest() {
            kiln::artifact::ArtifactManifest::Cpu(m) => {
                format!("{} ({})", m.target.triple, m.target.cpu_features.join(","))
            }
            other => other.kind().to_string(),
        }
    };
    write_listings(&lowered, dir, &a.emit, &a.arch, a.target == Backend::Cuda)?;
    for line in a.fallback.lines(&lowered.report) {
        println!("{line}");
    }
    println!(
        "compiled {} for {summary} in {:.1} ms: {} kernels, {} weights -> {}",
        a.model.model.display(),
        t0.elapsed().as_secs_f64() * 1e3,
        lowered.executable.kernels.len(),
        lowered.executable.weights.len(),
        dir.display()
    );
    Ok(())
}

/// Writes the `--emit` listings of `lowered` into `dir` (`compile`, `run`, `bench`); `arch` is the PTX target, and a
/// CUDA artifact holds its PTX already.
pub fn write_listings(
    lowered: &kiln::Lowered,
    dir: &Path,
    emits: &[Emit],
    arch: &str,
    cuda_artifact: bool,
) -> Result<()> {
    if !emits.is_empty() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    for emit in emits {
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
            Emit::Ptx if cuda_artifact => {}
            Emit::Ptx => write(&dir.join(kiln::artifact::PTX_FILE), &cuda::ptx(lowered, arch)?)?,
            Emit::Dot => {
                let path = dir.join("graph.dot");
                write(&path, &kiln::dot::to_dot(&lowered.graph))?;
                render_svg(&path, &dir.join("graph.svg"))?;
            }
        }
    }
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

/// The CUDA target, with the NVPTX emitter (feature `ptx`).
#[cfg(feature = "ptx")]
mod cuda {
    use std::path::Path;

    use anyhow::{Result, anyhow};
    use kiln::{Artifact, Lowered};
    use kiln_codegen::ptx::PtxOptions;

    fn options(arch: &str) -> Result<PtxOptions> {
        Ok(PtxOptions { arch: arch.parse().map_err(|e: String| anyhow!("--arch: {e}"))?, ..PtxOptions::default() })
    }

    /// Writes the CUDA artifact; returns the target's description.
    pub fn write_artifact(lowered: &Lowered, dir: &Path, arch: &str) -> Result<String> {
        let m = Artifact::write_cuda(lowered, dir, &options(arch)?)?;
        Ok(format!("{} ({}, PTX ISA {})", m.target.triple, m.target.arch.name(), m.target.ptx_isa))
    }

    /// The device plan's kernels (the executable's and the builtins) as PTX for `arch`: what a CUDA artifact
    /// of the same model holds.
    pub fn ptx(lowered: &Lowered, arch: &str) -> Result<String> {
        Ok(kiln::cuda::compile_device(lowered, &options(arch)?)?.module.ptx)
    }
}

/// The CUDA target in a kiln built without the NVPTX emitter.
#[cfg(not(feature = "ptx"))]
mod cuda {
    use std::path::Path;

    use anyhow::{Result, bail};
    use kiln::Lowered;

    const MISSING: &str = "this kiln is built without the NVPTX emitter (cargo feature `ptx`, which needs LLVM 19)";

    pub fn write_artifact(_: &Lowered, _: &Path, _: &str) -> Result<String> {
        bail!("--target cuda: {MISSING}")
    }

    pub fn ptx(_: &Lowered, _: &str) -> Result<String> {
        bail!("--emit ptx: {MISSING}")
    }
}
