//! How the command-line tools (`kiln run`/`bench`, `kiln-serve run`/`bench`) get a model's input values:
//! `--input NAME=FILE.npy`, `--inputs DIR` (a folder with the `manifest.json` that `run` writes for outputs),
//! `--require-inputs`, `--seed`. Inputs not given get pseudo-random values, and the tools say which on stderr.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_ir::{Tensor, TensorType};

use crate::npy::{self, NpyError};

/// Why the inputs could not be made.
#[derive(Debug, thiserror::Error)]
pub enum InputsError {
    /// An `.npy` file or the manifest could not be read.
    #[error(transparent)]
    Npy(#[from] NpyError),
    /// The inputs do not fit the model, or are given twice, or not given under `--require-inputs`.
    #[error("{0}")]
    Input(String),
}

/// The input options of `run` and `bench`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct InputArgs {
    /// An input value: NAME=FILE.npy (repeatable).
    #[arg(long = "input", short = 'i', value_name = "NAME=FILE.npy")]
    pub inputs: Vec<String>,
    /// A folder of input values: its manifest.json lists each input's `name` and `.npy` `file` (the format `run`
    /// writes for outputs, so one run's outputs can feed the next).
    #[arg(long = "inputs", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Refuse to run when an input is not given (by default it gets pseudo-random values, said on stderr).
    #[arg(long)]
    pub require_inputs: bool,
    /// Seed for pseudo-random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl InputArgs {
    /// The values given with `--inputs DIR` and `--input`, by name (each name once).
    pub fn given(&self) -> Result<BTreeMap<String, Tensor>, InputsError> {
        let mut given = BTreeMap::new();
        if let Some(dir) = &self.dir {
            for (name, file) in npy::read_manifest(dir)? {
                if given.insert(name.clone(), npy::read(&file)?).is_some() {
                    return Err(InputsError::Input(format!(
                        "--inputs {}: input `{name}` is listed twice",
                        dir.display()
                    )));
                }
            }
        }
        for spec in &self.inputs {
            let (name, file) = match spec.rsplit_once('=') {
                Some((n, f)) if !n.is_empty() && !f.is_empty() => (n, f),
                _ => return Err(InputsError::Input(format!("expected --input as NAME=FILE.npy, got `{spec}`"))),
            };
            if given.insert(name.to_string(), npy::read(Path::new(file))?).is_some() {
                return Err(InputsError::Input(format!("--input `{name}` is given twice (or also in --inputs)")));
            }
        }
        Ok(given)
    }

    /// The declared inputs `given` lacks, which will get pseudo-random values: an error under
    /// `--require-inputs`. Say them with [`InputArgs::note`] once the values are made.
    pub fn missing(
        &self,
        given: &BTreeMap<String, Tensor>,
        declared: &[(String, TensorType)],
    ) -> Result<Vec<String>, InputsError> {
        let missing: Vec<String> = declared.iter().map(|(n, _)| n.clone()).filter(|n| !given.contains_key(n)).collect();
        if self.require_inputs && !missing.is_empty() {
            return Err(InputsError::Input(format!("inputs not given: {} (--require-inputs)", missing.join(", "))));
        }
        Ok(missing)
    }

    /// Tells stderr which inputs got pseudo-random values (nothing when none did).
    pub fn note(&self, missing: &[String]) {
        if !missing.is_empty() {
            eprintln!(
                "note: inputs not given, filled with pseudo-random values (seed {}): {}",
                self.seed,
                missing.join(", ")
            );
        }
    }
}
