//! Command-line parsing (clap) and dispatch to one module per subcommand.

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
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a model on inputs (given as .npy files, or deterministic pseudo-random) and write its outputs.
    Run(run::RunArgs),
    /// Print a model as .kir text, or write it to a file.
    Opt(opt::OptArgs),
    /// Summarize a model: inputs, outputs, op histogram, parameters.
    Inspect(inspect::InspectArgs),
}

/// Options shared by every command that loads a model.
#[derive(Args, Debug)]
pub struct ModelArgs {
    /// The model: a .kir file (weights from NAME.safetensors beside it, if present) or a kiln graph .json.
    pub model: PathBuf,
    /// A safetensors file holding the model's weights.
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
}

impl ModelArgs {
    fn load(&self) -> Result<kiln::Model> {
        Ok(kiln::Model::load(&self.model, &kiln::LoadOptions { weights: self.weights.clone() })?)
    }
}

/// Runs the parsed command.
pub fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Opt(a) => opt::run(a),
        Command::Inspect(a) => inspect::run(a),
    }
}

/// Splits `NAME=VALUE` at the last `=` (input names may contain `=`; file names and shapes rarely do).
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
