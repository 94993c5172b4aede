//! `kiln opt`: print a model as `.kir`, or write it (and its weights) to a file.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

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
}

pub fn run(a: OptArgs) -> Result<()> {
    let model = a.model.load()?;
    let text = kiln_ir::print(model.graph());
    match a.output {
        None => print!("{text}"),
        Some(out) => {
            std::fs::write(&out, &text).with_context(|| format!("cannot write {}", out.display()))?;
            if !model.graph().weights.is_empty() {
                kiln::weights::save(&out.with_extension("safetensors"), &model.graph().weights)?;
            }
        }
    }
    Ok(())
}
