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
    /// Print one JSON object instead of text: `{"model", "supported", "unsupported": [{"op_type", "node",
    /// "message"}]}` (the exit code is the same: 4 when anything is unsupported).
    #[arg(long)]
    json: bool,
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
        e @ kiln_onnx::ImportError::Io { .. } => kiln::Error::Onnx(e),
        e => kiln::Error::OnnxAt(e, a.model.display().to_string()),
    })?;
    if a.json {
        let v = serde_json::json!({
            "model": a.model.display().to_string(),
            "supported": problems.is_empty(),
            "unsupported": problems
                .iter()
                .map(|p| serde_json::json!({"op_type": p.op_type, "node": p.node, "message": p.message}))
                .collect::<Vec<_>>(),
        });
        println!("{v}");
    } else if problems.is_empty() {
        println!("{}: supported (every op, attribute and dtype imports)", a.model.display());
    } else {
        for p in &problems {
            println!("unsupported: {p}");
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(super::Exit {
        code: super::EXIT_UNSUPPORTED,
        message: format!("{}: {} unsupported feature(s), listed above", a.model.display(), problems.len()),
    }
    .into())
}
