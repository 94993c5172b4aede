//! `kiln opt`: run a pass pipeline over a model and print or write the result as `.kir`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln_passes::{Instrumentation, PassContext, PassManager, PassSelection, Reproducer};

use super::ModelArgs;

/// Arguments of `kiln opt`.
#[derive(Args, Debug)]
pub struct OptArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Write the .kir text here (weights, if any, go to the same path with a .safetensors extension) instead of
    /// printing it.
    #[arg(long, short = 'o', value_name = "OUT.kir")]
    output: Option<PathBuf>,
    #[command(flatten)]
    passes: PipelineArgs,
}

/// The pass pipeline a command runs: `-O LEVEL` or `--pipeline TEXT` (shared by `opt`, `compile`, `run`, `bench`).
#[derive(Args, Debug)]
pub struct PipelineChoice {
    /// Optimization level: the named pipeline O0..O3. Default: the target's own pipeline (cpu-default,
    /// cuda-default) for run, bench and compile; O0 (the model as it is) for opt.
    #[arg(short = 'O', value_name = "LEVEL", conflicts_with = "pipeline")]
    level: Option<u8>,
    /// A pipeline in text form, e.g. `canonicalize,cse,fixpoint(fold-constants,dce)` (default as for -O).
    #[arg(long, value_name = "PIPELINE")]
    pipeline: Option<String>,
}

impl PipelineChoice {
    /// The pipeline text chosen, or `default` when neither option is given.
    pub fn text_or(&self, default: &str) -> Result<String> {
        match (&self.pipeline, self.level) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(l @ 0..=3)) => Ok(format!("O{l}")),
            (None, Some(l)) => bail!("-O{l}: optimization levels are 0 to 3"),
            (None, None) => Ok(default.into()),
        }
    }

    /// True when neither -O nor --pipeline is given.
    pub fn is_default(&self) -> bool {
        self.level.is_none() && self.pipeline.is_none()
    }
}

/// Pipeline selection and instrumentation, shared by every command that runs passes itself.
#[derive(Args, Debug)]
pub struct PipelineArgs {
    #[command(flatten)]
    choice: PipelineChoice,
    /// Print the IR (to stderr) before this pass (repeatable).
    #[arg(long, value_name = "PASS")]
    print_before: Vec<String>,
    /// Print the IR (to stderr) after this pass (repeatable).
    #[arg(long, value_name = "PASS")]
    print_after: Vec<String>,
    /// Print the IR after every pass.
    #[arg(long)]
    print_after_all: bool,
    /// Print the IR only after passes that changed it (alone: after every pass that changed it).
    #[arg(long)]
    print_after_change: bool,
    /// Print a table of wall time per pass (to stderr).
    #[arg(long)]
    time_passes: bool,
    /// Verify the graph after every pass; a failure names the pass.
    #[arg(long)]
    verify_each: bool,
    /// Stop after N pass executions (to find a miscompiling pass).
    #[arg(long, value_name = "N")]
    bisect: Option<usize>,
    /// Where a failing pass writes its reproducer (input IR and pipeline); default: the temp directory.
    #[arg(long, value_name = "DIR")]
    reproducer_dir: Option<PathBuf>,
}

impl PipelineArgs {
    /// The pipeline text these options select.
    pub fn pipeline_text(&self) -> Result<String> {
        self.choice.text_or("O0")
    }

    /// True when neither -O nor --pipeline is given (each command then picks its own default pipeline).
    pub fn is_default(&self) -> bool {
        self.choice.is_default()
    }

    /// Runs the selected pipeline over `g` with the requested instrumentation (dumps and timing to stderr).
    pub fn run(&self, g: &mut kiln_ir::Graph) -> Result<()> {
        let manager = PassManager::parse(&self.pipeline_text()?)?;
        manager.run(g, &PassContext::default(), &mut self.instrumentation())?;
        Ok(())
    }

    /// The instrumentation these options request (dumps and timing to stderr).
    pub fn instrumentation(&self) -> Instrumentation<'static> {
        let select = |names: &[String], all: bool| {
            if all {
                PassSelection::All
            } else if names.is_empty() {
                PassSelection::None
            } else {
                PassSelection::passes(names.iter().cloned())
            }
        };
        Instrumentation {
            print_before: select(&self.print_before, false),
            print_after: select(&self.print_after, self.print_after_all),
            print_after_change: self.print_after_change,
            time_passes: self.time_passes,
            verify_each: self.verify_each,
            bisect: self.bisect,
            reproducer: self.reproducer_dir.clone().map_or(Reproducer::TempDir, Reproducer::Dir),
            sink: None,
        }
    }
}

pub fn run(a: OptArgs) -> Result<()> {
    let model = a.model.load()?;
    let mut graph = model.graph().clone();
    a.passes.run(&mut graph)?;
    let text = kiln_ir::print(&graph);
    match a.output {
        None => print!("{text}"),
        Some(out) => {
            std::fs::write(&out, &text).with_context(|| format!("cannot write {}", out.display()))?;
            if !graph.weights.is_empty() {
                kiln::weights::save(&out.with_extension("safetensors"), &graph.weights)?;
            }
        }
    }
    Ok(())
}
