//! `kiln check`: every unsupported op, attribute value and dtype of an ONNX model, at once.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

/// Arguments of `kiln check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The ONNX model.
    model: PathBuf,
    /// Static extents for an input with symbolic dims: NAME=DxDxD (repeatable).
    #[arg(long = "shape", value_name = "NAME=DxD")]
    shapes: Vec<String>,
    /// Specialize on an input's value, as `run --fix-input` does: NAME=FILE.npy (repeatable).
    #[arg(long = "fix-input", value_name = "NAME=FILE.npy")]
    fix_inputs: Vec<String>,
}

pub fn run(a: CheckArgs) -> Result<()> {
    let mut options = kiln_onnx::ImportOptions { shapes: super::parse_shapes(&a.shapes)?, ..Default::default() };
    for (name, t) in super::read_fixed_inputs(&a.fix_inputs)? {
        if options.shapes.contains_key(&name) {
            bail!("--fix-input `{name}` fixes that input: it cannot also be shaped (--shape)");
        }
        options.shapes.insert(name.clone(), t.shape().to_vec());
        options.known_inputs.insert(name, t);
    }
    let problems = kiln_onnx::check(&a.model, &options).map_err(|e| match e {
        // An I/O error names the file it could not read already.
        e @ kiln_onnx::ImportError::Io { .. } => anyhow::anyhow!("{e}"),
        e => anyhow::anyhow!("{}: {e}", a.model.display()),
    })?;
    if problems.is_empty() {
        println!("{}: supported (every op, attribute and dtype imports)", a.model.display());
        return Ok(());
    }
    for p in &problems {
        println!("unsupported: {p}");
    }
    bail!("{}: {} unsupported feature(s), listed above", a.model.display(), problems.len())
}
